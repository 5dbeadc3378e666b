package frames

import "encoding/json"

// Fields walks the members of obj in order, calling fn with each key
// (unescaped) and raw value, until fn returns false. obj must come from a
// decoded frame (Mutate.Input, Target.Input, Member.Meta): Decode has
// already checked that it is valid JSON. Fields reports false when obj is
// not a JSON object. A key that needs no unescaping is passed without
// copying; fn must not keep key or val past its return.
//
// It lets a mutation read its input without a second reflective decode.
func Fields(obj json.RawMessage, fn func(key []byte, val json.RawMessage) bool) bool {
	i := skipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	m := newMembers(obj[i:])
	for {
		key, val, ok := m.next()
		if !ok {
			return true
		}
		k := key[1 : len(key)-1]
		if hasEscape(k) {
			k = appendUnquote(nil, k)
		}
		if !fn(k, val) {
			return true
		}
	}
}

// Unquote returns the string a JSON string token (with its quotes) holds,
// such as a val passed by Fields; ok is false when tok is not exactly one
// valid JSON string token (another value, a truncated string, a bad
// escape, bytes after the closing quote). Like Decode, it turns a \u
// escape naming a lone surrogate into U+FFFD.
func Unquote(tok json.RawMessage) (s string, ok bool) {
	if len(tok) < 2 || tok[0] != '"' {
		return "", false
	}
	// unquote assumes a valid token: it reads past a trailing backslash.
	if v := (validator{b: tok}); !v.str() || v.i != len(tok) {
		return "", false
	}
	return unquote(tok), true
}

// MaxDepth is how deep a frame's arrays and objects may nest, the frame's
// own object included (docs/protocol.md §2): [Decode] refuses a deeper
// frame and [Encode] will not write one.
const MaxDepth = maxDepth

// Depth returns how deep the JSON value v nests: 0 for a scalar, 1 for
// [], {} or [1,2], 2 for [[1]] or {"a":{}}, and so on. v must be valid
// JSON (a decoded frame's RawMessage fields are). It lets a server check
// that a value it moves into a frame of its own still fits within
// [MaxDepth]: a topic row's data sits 4 levels deep in its patch
// ({"patches":[{"row":{"data":), two more than a publish's input.data in
// its mutate, so data nested more than MaxDepth-4 deep cannot be sent.
func Depth(v json.RawMessage) int {
	depth, deepest := 0, 0
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '"':
			i = skipString(v, i) - 1
		case '[', '{':
			if depth++; depth > deepest {
				deepest = depth
			}
		case ']', '}':
			depth--
		}
	}
	return deepest
}
