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
