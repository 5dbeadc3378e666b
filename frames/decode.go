package frames

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Decode parses one frame: one line of a WebSocket text message, without
// its '\n' (see [Split]). Leading and trailing JSON whitespace is allowed.
// The returned Frame is a pointer to one of the ten frame structs; it does
// not retain line.
//
// Decode is strict. Field names match exactly (case-sensitive); fields it
// does not know are ignored; a repeated field counts once, with its last
// value. Checks run in this order, and the first failure is returned:
//
//  1. line is UTF-8, one JSON object, nothing else, nested at most
//     10,000 deep ([CodeBadFrame]);
//  2. "v" is the integer 1 ([CodeProtocolVersion]);
//  3. "type" is a string naming one of the ten frames ([CodeUnknownType]);
//  4. the frame's fields in struct order: present ([CodeMissingField]),
//     of the right JSON type and within their set or range
//     ([CodeBadField]).
//
// So a frame with both a bad "v" and an unknown "type" reports
// [CodeProtocolVersion]. An integer field accepts any JSON number whose
// value is a whole number in int64 range (3, 3.0 and 3e0 all mean 3).
// json.RawMessage fields are stored compacted, so Encode(Decode(x)) is
// stable.
//
// Every error is an [*Error] with Code, Cause (naming the field, e.g.
// "subscribe.target.cursor.lsn: want string, got number") and Fix set. Its
// Ref is the frame's ack ref when the frame's type and ref field could be
// read: the subscribe's sid, the mutate's key, "presence:"+topic for
// presence; "" otherwise.
func Decode(line []byte) (Frame, error) {
	f, err := decode(line)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Split calls fn for each frame line of a WebSocket message, in order.
// Frames are separated by '\n'; one trailing '\r' per line is dropped and
// blank lines (only spaces, tabs or '\r') are skipped. It stops early when
// fn returns false. The line passed to fn aliases msg.
func Split(msg []byte, fn func(line []byte) bool) {
	for len(msg) > 0 {
		line := msg
		if i := bytes.IndexByte(msg, '\n'); i >= 0 {
			line, msg = msg[:i], msg[i+1:]
		} else {
			msg = nil
		}
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		if isBlank(line) {
			continue
		}
		if !fn(line) {
			return
		}
	}
}

func isBlank(line []byte) bool {
	for _, c := range line {
		if c != ' ' && c != '\t' && c != '\r' {
			return false
		}
	}
	return true
}

// Enum sets, in the order the spec lists them.
var (
	subscribeOps  = newEnum(OpAdd, OpDrop)
	targetKinds   = newEnum(TargetTopic, TargetQuery)
	patchOps      = newEnum(PatchInsert, PatchUpdate, PatchDelete)
	strategies    = newEnum(StrategyServerWins, StrategyLastWriteWins, StrategyCustom)
	presenceOps   = newEnum(PresenceJoin, PresenceLeave, PresenceUpdate, PresenceSync)
	reconnectWhys = newEnum(ReasonDrain, ReasonOverload, ReasonRebalance)

	allFrameTypes = []Type{TypeHello, TypeSubscribe, TypeSnapshot, TypePatch, TypeMutate,
		TypeAck, TypeRebase, TypePresence, TypeReconnect, TypeUpdateAvailable}
	fixTypeOneOf = "Set \"type\" to one of " + joinTypes() + "."
)

// Texts for errors: what a field should be ("want ...") and fixes.
const (
	wantRow        = `object with a string "id"`
	wantRowOrNull  = wantRow + " or null"
	wantOffsetLSN  = `"" or an offset (16 digits, "_", 16 digits)`
	wantNonEmpty   = "non-empty string"
	wantUint       = "integer >= 0"
	wantObjOrNull  = "object or null"
	wantStrOrNull  = "string or null"
	wantAnyJSON    = "any JSON value"
	wantStringList = "array of strings"

	fixUTF8      = "Send frames as UTF-8 text in WebSocket text messages."
	fixOneObject = "Send one JSON object per line; separate frames with '\\n'."
	fixDepth     = "Nest arrays and objects at most 10000 deep, the frame's own object included."
	fixVersion   = "Send \"v\": 1 in every frame; this server speaks protocol version 1."
)

// enum is the set of values a string field may take.
type enum struct {
	vals []string
	want string // "one of a, b"
}

func newEnum(vals ...string) enum {
	return enum{vals: vals, want: "one of " + strings.Join(vals, ", ")}
}

func joinTypes() string {
	s := make([]string, len(allFrameTypes))
	for i, t := range allFrameTypes {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}

func decode(line []byte) (Frame, *Error) {
	if !utf8.Valid(line) {
		return nil, &Error{Code: CodeBadFrame, Cause: "frame: not valid UTF-8 at byte " + strconv.Itoa(firstInvalidUTF8(line)), Fix: fixUTF8}
	}
	start := skipWS(line, 0)
	if start == len(line) {
		return nil, &Error{Code: CodeBadFrame, Cause: "frame: empty", Fix: fixOneObject}
	}
	v := validator{b: line, collect: true}
	if !v.run() {
		se := v.err()
		if se.deep {
			return nil, &Error{Code: CodeBadFrame, Cause: "frame: " + se.String(), Fix: fixDepth}
		}
		return nil, &Error{Code: CodeBadFrame, Cause: "frame: not JSON: " + se.String(), Fix: fixOneObject}
	}
	if line[start] != '{' {
		return nil, &Error{Code: CodeBadFrame, Cause: "frame: want object, got " + jsonKind(line[start:]), Fix: fixOneObject}
	}
	var buf [len(v.top)]field
	top := object{fs: buf[:0]}
	if v.ntop <= len(v.top) {
		for _, m := range v.top[:v.ntop] {
			top.fs = append(top.fs, field{name: fieldName(line[m.k0:m.k1]), val: line[m.v0:m.v1]})
		}
	} else {
		top.fs = collect(line[start:], top.fs)
	}

	typ, typOK := frameType(top.get("type"))
	d := decoder{ref: refOf(typ, &top), compact: v.ws}
	if err := d.version(top.get("v")); err != nil {
		return nil, err
	}
	if !typOK {
		return nil, d.typeError(top.get("type"))
	}
	top.at = loc{prefix: string(typ), index: -1}
	var f Frame
	switch typ {
	case TypeHello:
		f = d.hello(&top)
	case TypeSubscribe:
		f = d.subscribe(&top)
	case TypeSnapshot:
		f = d.snapshot(&top)
	case TypePatch:
		f = d.patch(&top)
	case TypeMutate:
		f = d.mutate(&top)
	case TypeAck:
		f = d.ack(&top)
	case TypeRebase:
		f = d.rebase(&top)
	case TypePresence:
		f = d.presence(&top)
	case TypeReconnect:
		f = d.reconnect(&top)
	case TypeUpdateAvailable:
		f = &UpdateAvailable{BuildID: d.str(&top, "buildId", false)}
	}
	if d.err != nil {
		return nil, d.err
	}
	return f, nil
}

// firstInvalidUTF8 returns the offset of the first byte of b that does
// not start a valid UTF-8 encoding, or len(b).
func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// frameType returns the frame type named by the "type" value v, if v is a
// string naming one.
func frameType(v []byte) (Type, bool) {
	if len(v) == 0 || v[0] != '"' {
		return "", false
	}
	for _, t := range allFrameTypes {
		if tokenIs(v, string(t)) {
			return t, true
		}
	}
	return "", false
}

// refOf reads the ack ref of a frame of type t without reporting errors:
// "" unless the ref field is a non-empty string.
func refOf(t Type, top *object) string {
	var name string
	switch t {
	case TypeSubscribe:
		name = "sid"
	case TypeMutate:
		name = "key"
	case TypePresence:
		name = "topic"
	default:
		return ""
	}
	v := top.get(name)
	if len(v) < 3 || v[0] != '"' {
		return ""
	}
	s := unquote(v)
	if t == TypePresence {
		return "presence:" + s
	}
	return s
}

// field is one member of a JSON object: its name (unescaped) and value.
type field struct {
	name []byte
	val  []byte
}

// collect appends the members of the valid JSON object obj to fs.
func collect(obj []byte, fs []field) []field {
	m := newMembers(obj)
	for {
		key, val, ok := m.next()
		if !ok {
			return fs
		}
		fs = append(fs, field{name: fieldName(key), val: val})
	}
}

// fieldName returns the name in the valid key token key (with quotes).
func fieldName(key []byte) []byte {
	name := key[1 : len(key)-1]
	if hasEscape(name) {
		name = appendUnquote(nil, name)
	}
	return name
}

// object is a collected JSON object and where it sits in the frame.
type object struct {
	fs []field
	at loc
}

// get returns the value of the last member called name, or nil.
func (o *object) get(name string) []byte {
	for i := len(o.fs) - 1; i >= 0; i-- {
		if string(o.fs[i].name) == name {
			return o.fs[i].val
		}
	}
	return nil
}

// tokenIs reports whether the valid string token tok (with quotes) is s.
func tokenIs(tok []byte, s string) bool {
	in := tok[1 : len(tok)-1]
	if !hasEscape(in) {
		return string(in) == s
	}
	return unquote(tok) == s
}

// loc is the path of a JSON object inside a frame, for error causes:
// prefix, then "[index]" when index >= 0, then suffix. It is only turned
// into a string on failure, so decoding a valid frame builds no paths.
type loc struct {
	prefix string
	index  int
	suffix string
}

func (l loc) String() string {
	if l.index < 0 {
		return l.prefix + l.suffix
	}
	return l.prefix + "[" + strconv.Itoa(l.index) + "]" + l.suffix
}

// field returns the path of member name of l; name "" means l itself.
func (l loc) field(name string) string {
	if name == "" {
		return l.String()
	}
	return l.String() + "." + name
}

// decoder checks fields and keeps the first failure. Once err is set,
// every check returns a zero value without looking.
type decoder struct {
	err     *Error
	ref     string
	compact bool // the line has whitespace between tokens
}

func (d *decoder) fail(code Code, cause, fix string) {
	if d.err == nil {
		d.err = &Error{Code: code, Cause: cause, Fix: fix, Ref: d.ref}
	}
}

func (d *decoder) missing(at loc, name, want string) {
	where := at.String()
	if !strings.ContainsAny(where, ".[") {
		where = "the " + where + " frame"
	}
	d.fail(CodeMissingField, at.field(name)+": missing",
		"Add "+strconv.Quote(name)+" to "+where+": "+want+".")
}

// bad reports that member name of at (at itself if name is "") is not
// what it should be.
func (d *decoder) bad(at loc, name, want, got string) {
	path := at.field(name)
	d.fail(CodeBadField, path+": want "+want+", got "+got, "Send "+path+" as "+want+".")
}

func (d *decoder) version(v []byte) *Error {
	if v == nil {
		return &Error{Code: CodeProtocolVersion, Cause: "v: missing", Fix: fixVersion, Ref: d.ref}
	}
	if n, ok := parseNumber(v); ok && n == ProtocolVersion {
		return nil
	}
	return &Error{Code: CodeProtocolVersion, Cause: "v: want 1, got " + describe(v), Fix: fixVersion, Ref: d.ref}
}

func (d *decoder) typeError(v []byte) *Error {
	e := &Error{Code: CodeUnknownType, Fix: fixTypeOneOf, Ref: d.ref}
	switch {
	case v == nil:
		e.Cause = "type: missing"
	case v[0] != '"':
		e.Cause = "type: want string, got " + jsonKind(v)
	default:
		e.Cause = "type: unknown " + describe(v)
	}
	return e
}

// parseNumber is parseInt for any valid JSON value: ok is false unless v
// is a number with a whole value.
func parseNumber(v []byte) (int64, bool) {
	if v[0] != '-' && !isDigit(v[0]) {
		return 0, false
	}
	return parseInt(v)
}

// describe shows a valid JSON value in an error cause: strings quoted and
// numbers as written, both cut to a few dozen bytes; other values by kind.
func describe(v []byte) string {
	const max = 40
	switch c := v[0]; {
	case c == '"':
		s := unquote(v)
		if len(s) <= max {
			return strconv.Quote(s)
		}
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "..."
	case c == '-' || isDigit(c):
		if len(v) > max {
			return string(v[:max]) + "..."
		}
		return string(v)
	}
	return jsonKind(v)
}

// value returns member name of o, reporting it missing when absent.
func (d *decoder) value(o *object, name, want string) []byte {
	if d.err != nil {
		return nil
	}
	v := o.get(name)
	if v == nil {
		d.missing(o.at, name, want)
	}
	return v
}

// str reads a required string member.
func (d *decoder) str(o *object, name string, nonEmpty bool) string {
	want := "string"
	if nonEmpty {
		want = wantNonEmpty
	}
	v := d.value(o, name, want)
	if v == nil {
		return ""
	}
	return d.strValue(o.at, name, v, nonEmpty)
}

func (d *decoder) strValue(at loc, name string, v []byte, nonEmpty bool) string {
	if v[0] != '"' {
		want := "string"
		if nonEmpty {
			want = wantNonEmpty
		}
		d.bad(at, name, want, jsonKind(v))
		return ""
	}
	if nonEmpty && len(v) == 2 {
		d.bad(at, name, wantNonEmpty, `""`)
		return ""
	}
	return unquote(v)
}

// optStr reads an optional string member; absent means "".
func (d *decoder) optStr(o *object, name string) string {
	if d.err != nil {
		return ""
	}
	v := o.get(name)
	if v == nil {
		return ""
	}
	return d.strValue(o.at, name, v, false)
}

// strOrNull reads a required member that is a string or null.
func (d *decoder) strOrNull(o *object, name string) *string {
	v := d.value(o, name, wantStrOrNull)
	switch {
	case v == nil || v[0] == 'n':
		return nil
	case v[0] != '"':
		d.bad(o.at, name, wantStrOrNull, jsonKind(v))
		return nil
	}
	s := unquote(v)
	return &s
}

// enum reads a required string member that must be one of set. It returns
// the element of set, so no string is allocated.
func (d *decoder) enum(o *object, name string, set enum) string {
	v := d.value(o, name, set.want)
	if v == nil {
		return ""
	}
	if v[0] != '"' {
		d.bad(o.at, name, set.want, jsonKind(v))
		return ""
	}
	for _, s := range set.vals {
		if tokenIs(v, s) {
			return s
		}
	}
	d.bad(o.at, name, set.want, describe(v))
	return ""
}

// integer reads a required integer member; nonNeg also rejects values < 0.
func (d *decoder) integer(o *object, name string, nonNeg bool) int64 {
	want := "integer"
	if nonNeg {
		want = wantUint
	}
	v := d.value(o, name, want)
	if v == nil {
		return 0
	}
	return d.intValue(o.at, name, v, nonNeg)
}

func (d *decoder) intValue(at loc, name string, v []byte, nonNeg bool) int64 {
	want := "integer"
	if nonNeg {
		want = wantUint
	}
	if v[0] != '-' && !isDigit(v[0]) {
		d.bad(at, name, want, jsonKind(v))
		return 0
	}
	n, ok := parseInt(v)
	if !ok || nonNeg && n < 0 {
		d.bad(at, name, want, describe(v))
		return 0
	}
	return n
}

// raw reads a required member holding any JSON value, compacted.
func (d *decoder) raw(o *object, name string) json.RawMessage {
	v := d.value(o, name, wantAnyJSON)
	if v == nil {
		return nil
	}
	return d.copyRaw(v)
}

// copyRaw returns a compact copy of the valid JSON value v.
func (d *decoder) copyRaw(v []byte) json.RawMessage {
	if d.compact && needsCompact(v) {
		return appendCompact(make([]byte, 0, len(v)), v)
	}
	return append(json.RawMessage(nil), v...)
}

// nested reads a required member that must be an object, collecting its
// members into buf.
func (d *decoder) nested(o *object, name string, at loc, buf []field, orNull bool) (object, bool) {
	want := "object"
	if orNull {
		want = wantObjOrNull
	}
	v := d.value(o, name, want)
	switch {
	case v == nil || orNull && v[0] == 'n':
		return object{}, false
	case v[0] != '{':
		d.bad(o.at, name, want, jsonKind(v))
		return object{}, false
	}
	return object{fs: collect(v, buf), at: at}, true
}

// array reads a required member that must be an array.
func (d *decoder) array(o *object, name, want string) (elems, bool) {
	v := d.value(o, name, want)
	if v == nil {
		return elems{}, false
	}
	if v[0] != '[' {
		d.bad(o.at, name, want, jsonKind(v))
		return elems{}, false
	}
	return newElems(v), true
}

// row checks that v is a row, an object with a string "id", and returns a
// compact copy. at is the row's path.
func (d *decoder) row(at loc, v []byte) json.RawMessage {
	if d.err != nil {
		return nil
	}
	if v[0] != '{' {
		d.bad(at, "", wantRow, jsonKind(v))
		return nil
	}
	var id []byte
	m := newMembers(v)
	for {
		key, val, ok := m.next()
		if !ok {
			break
		}
		if tokenIs(key, "id") {
			id = val
		}
	}
	switch {
	case id == nil:
		d.bad(at, "", wantRow, `object without "id"`)
		return nil
	case id[0] != '"':
		d.bad(at, "id", "string", jsonKind(id))
		return nil
	}
	return d.copyRaw(v)
}

// rowOrNull reads a required member that is a row or null.
func (d *decoder) rowOrNull(o *object, name string, at loc) json.RawMessage {
	v := d.value(o, name, wantRowOrNull)
	if v == nil || v[0] == 'n' {
		return nil
	}
	if v[0] != '{' {
		d.bad(o.at, name, wantRowOrNull, jsonKind(v))
		return nil
	}
	return d.row(at, v)
}

// cursor reads the cursor object o.
func (d *decoder) cursor(o *object) Cursor {
	var c Cursor
	c.QID = d.str(o, "qid", true)
	if v := d.value(o, "lsn", wantOffsetLSN); v != nil {
		switch {
		case v[0] != '"':
			d.bad(o.at, "lsn", "string", jsonKind(v))
		case len(v) == 2:
		default:
			if lsn := unquote(v); validOffset(lsn) {
				c.LSN = lsn
			} else {
				d.bad(o.at, "lsn", wantOffsetLSN, describe(v))
			}
		}
	}
	c.Digest = d.str(o, "digest", false)
	if ids, ok := d.array(o, "ids", wantStringList); ok {
		c.IDs = []string{}
		for i := 0; ; i++ {
			v, ok := ids.next()
			if !ok || d.err != nil {
				break
			}
			if v[0] != '"' {
				d.bad(o.at, "ids["+strconv.Itoa(i)+"]", "string", jsonKind(v))
				break
			}
			c.IDs = append(c.IDs, unquote(v))
		}
	}
	c.Count = d.integer(o, "count", true)
	c.At = d.integer(o, "at", false)
	return c
}

func (d *decoder) hello(o *object) *Hello {
	h := &Hello{}
	h.BuildID = d.str(o, "buildId", false)
	h.SessionID = d.strOrNull(o, "sessionId")
	h.ActorID = d.strOrNull(o, "actorId")
	if rs, ok := d.array(o, "resume", "array of cursors"); ok {
		h.Resume = []Cursor{}
		for i := 0; ; i++ {
			v, ok := rs.next()
			if !ok || d.err != nil {
				break
			}
			at := loc{prefix: "hello.resume", index: i}
			if v[0] != '{' {
				d.bad(at, "", "object", jsonKind(v))
				break
			}
			var buf [6]field
			c := object{fs: collect(v, buf[:0]), at: at}
			h.Resume = append(h.Resume, d.cursor(&c))
		}
	}
	h.Token = d.optStr(o, "token")
	h.ClientID = d.optStr(o, "clientId")
	if v := o.get("epoch"); v != nil && d.err == nil {
		h.Epoch = d.intValue(o.at, "epoch", v, true)
	}
	if v := o.get("seq"); v != nil && d.err == nil {
		n := d.intValue(o.at, "seq", v, true)
		h.Seq = &n
	}
	if v := o.get("maxMessage"); v != nil && d.err == nil {
		h.MaxMessage = d.intValue(o.at, "maxMessage", v, true)
	}
	if v := o.get("frameRate"); v != nil && d.err == nil {
		h.FrameRate = d.rateValue(o.at, "frameRate", v)
	}
	if v := o.get("frameBurst"); v != nil && d.err == nil {
		h.FrameBurst = d.intValue(o.at, "frameBurst", v, true)
	}
	return h
}

// rateValue reads a finite number >= 0 (a JSON number; the decoder has
// checked its syntax).
func (d *decoder) rateValue(at loc, name string, v []byte) float64 {
	if v[0] != '-' && !isDigit(v[0]) {
		d.bad(at, name, "number >= 0", jsonKind(v))
		return 0
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || f < 0 || math.IsInf(f, 0) {
		d.bad(at, name, "number >= 0", describe(v))
		return 0
	}
	return f
}

func (d *decoder) subscribe(o *object) *Subscribe {
	s := &Subscribe{}
	s.Op = d.enum(o, "op", subscribeOps)
	if d.ref != "" {
		s.SID = d.ref // the sid, already read by refOf
	} else {
		s.SID = d.str(o, "sid", true)
	}
	var buf [6]field
	t, ok := d.nested(o, "target", loc{prefix: "subscribe.target", index: -1}, buf[:0], false)
	if !ok {
		return s
	}
	s.Target.Kind = d.enum(&t, "kind", targetKinds)
	switch s.Target.Kind {
	case TargetTopic:
		s.Target.Topic = d.str(&t, "topic", true)
	case TargetQuery:
		s.Target.QID = d.str(&t, "qid", true)
		s.Target.Input = d.raw(&t, "input")
	}
	var cbuf [6]field
	if c, ok := d.nested(&t, "cursor", loc{prefix: "subscribe.target.cursor", index: -1}, cbuf[:0], true); ok {
		cur := d.cursor(&c)
		s.Target.Cursor = &cur
	}
	return s
}

func (d *decoder) snapshot(o *object) *Snapshot {
	s := &Snapshot{}
	s.SID = d.str(o, "sid", true)
	if rows, ok := d.array(o, "rows", "array of rows"); ok {
		s.Rows = []json.RawMessage{}
		for i := 0; ; i++ {
			v, ok := rows.next()
			if !ok || d.err != nil {
				break
			}
			s.Rows = append(s.Rows, d.row(loc{prefix: "snapshot.rows", index: i}, v))
		}
	}
	var buf [6]field
	if c, ok := d.nested(o, "cursor", loc{prefix: "snapshot.cursor", index: -1}, buf[:0], false); ok {
		s.Cursor = d.cursor(&c)
	}
	return s
}

func (d *decoder) patch(o *object) *Patch {
	p := &Patch{}
	p.SID = d.str(o, "sid", true)
	if ops, ok := d.array(o, "patches", "array of patch ops"); ok {
		p.Patches = []PatchOp{}
		for i := 0; ; i++ {
			v, ok := ops.next()
			if !ok || d.err != nil {
				break
			}
			at := loc{prefix: "patch.patches", index: i}
			if v[0] != '{' {
				d.bad(at, "", "object", jsonKind(v))
				break
			}
			var buf [6]field
			po := object{fs: collect(v, buf[:0]), at: at}
			var op PatchOp
			op.Op = d.enum(&po, "op", patchOps)
			op.ID = d.str(&po, "id", false)
			op.Row = d.rowOrNull(&po, "row", loc{prefix: "patch.patches", index: i, suffix: ".row"})
			op.LSN = d.str(&po, "lsn", false)
			if v := po.get("index"); v != nil && d.err == nil {
				n := d.intValue(at, "index", v, true)
				op.Index = &n
			}
			p.Patches = append(p.Patches, op)
		}
	}
	p.LSN = d.str(o, "lsn", false)
	return p
}

func (d *decoder) mutate(o *object) *Mutate {
	m := &Mutate{}
	if d.ref != "" {
		m.Key = d.ref // the key, already read by refOf
	} else {
		m.Key = d.str(o, "key", true)
	}
	m.Seq = d.integer(o, "seq", true)
	m.Name = d.str(o, "name", true)
	m.Input = d.raw(o, "input")
	return m
}

func (d *decoder) ack(o *object) *Ack {
	a := &Ack{}
	a.Ref = d.str(o, "ref", false)
	a.LSN = d.strOrNull(o, "lsn")
	var buf [6]field
	if e, ok := d.nested(o, "error", loc{prefix: "ack.error", index: -1}, buf[:0], true); ok {
		a.Error = &ErrorBody{
			Code: Code(d.str(&e, "code", false)),
		}
		a.Error.Cause = d.str(&e, "cause", false)
		a.Error.Fix = d.str(&e, "fix", false)
		a.Error.Docs = d.optStr(&e, "docs")
	}
	return a
}

func (d *decoder) rebase(o *object) *Rebase {
	r := &Rebase{}
	r.Key = d.str(o, "key", true)
	r.Entity = d.str(o, "entity", false)
	r.Strategy = d.enum(o, "strategy", strategies)
	r.Row = d.rowOrNull(o, "row", loc{prefix: "rebase.row", index: -1})
	return r
}

func (d *decoder) presence(o *object) *Presence {
	p := &Presence{}
	p.Topic = d.str(o, "topic", true)
	p.Op = d.enum(o, "op", presenceOps)
	if ms, ok := d.array(o, "members", "array of members"); ok {
		p.Members = []Member{}
		for i := 0; ; i++ {
			v, ok := ms.next()
			if !ok || d.err != nil {
				break
			}
			at := loc{prefix: "presence.members", index: i}
			if v[0] != '{' {
				d.bad(at, "", "object", jsonKind(v))
				break
			}
			var buf [6]field
			mo := object{fs: collect(v, buf[:0]), at: at}
			var m Member
			m.ID = d.str(&mo, "id", false)
			m.ActorID = d.strOrNull(&mo, "actorId")
			m.Meta = d.raw(&mo, "meta")
			m.UpdatedAt = d.integer(&mo, "updatedAt", false)
			p.Members = append(p.Members, m)
		}
	}
	if v := o.get("count"); v != nil && d.err == nil {
		p.Count = d.intValue(o.at, "count", v, true)
	}
	return p
}

func (d *decoder) reconnect(o *object) *Reconnect {
	r := &Reconnect{}
	r.AfterMs = d.integer(o, "afterMs", true)
	r.Reason = d.enum(o, "reason", reconnectWhys)
	return r
}

// The rest of this file is a small JSON reader shared by Decode and the
// hand-written encoders. Decoding is two passes over one line: validate checks the whole
// text (RFC 8259 grammar, same acceptance as encoding/json's json.Valid),
// then objects and arrays are walked with the skip functions, which assume
// valid input. Walking spans instead of unmarshalling lets the decoder
// match field names exactly (encoding/json folds case) and report the
// JSON type it found, without reflection or a map per frame.

// maxDepth is the deepest nesting validate accepts; it matches
// encoding/json so both agree on what is valid JSON.
const maxDepth = 10000

// syntaxError describes where a text stopped being JSON.
type syntaxError struct {
	off  int  // byte offset of the offending byte, or len(text) at the end
	eof  bool // the text ended early
	deep bool // the '[' or '{' at off opens one level more than maxDepth
	r    rune // the offending character (when !eof)
}

func (e *syntaxError) String() string {
	switch {
	case e.deep:
		return fmt.Sprintf("nested more than %d deep at byte %d", maxDepth, e.off)
	case e.eof:
		return fmt.Sprintf("unexpected end at byte %d", e.off)
	}
	return fmt.Sprintf("unexpected %q at byte %d", e.r, e.off)
}

// validator checks one JSON text.
type validator struct {
	b     []byte
	i     int
	depth int
	ws    bool // whitespace was skipped somewhere
	deep  bool // stopped at a '[' or '{' nested more than maxDepth

	// collect makes object record where the members of the outermost
	// object are: the first len(top) in top, all of them counted in ntop.
	// (Offsets, not slices: storing slices of a caller's buffer through
	// *validator would move the buffer to the heap.)
	collect bool
	top     [12]memberSpan
	ntop    int
}

// memberSpan locates a member: key token b[k0:k1], value b[v0:v1].
type memberSpan struct{ k0, k1, v0, v1 int }

// validate reports whether b is exactly one JSON value, optionally
// surrounded by whitespace. It does not check UTF-8.
func validate(b []byte) (bool, syntaxError) {
	v := validator{b: b}
	if v.run() {
		return true, syntaxError{}
	}
	return false, v.err()
}

// run validates v.b; on failure v.err describes where it stopped.
func (v *validator) run() bool {
	v.skipWS()
	if v.value() {
		v.skipWS()
		return v.i == len(v.b)
	}
	return false
}

func (v *validator) skipWS() {
	if i := skipWS(v.b, v.i); i != v.i {
		v.i = i
		v.ws = true
	}
}

func (v *validator) err() syntaxError {
	if v.i >= len(v.b) {
		return syntaxError{off: len(v.b), eof: true}
	}
	r, _ := utf8.DecodeRune(v.b[v.i:])
	return syntaxError{off: v.i, r: r, deep: v.deep}
}

// value validates the value at v.i, leaving v.i just past it, or at the
// offending byte when it returns false.
func (v *validator) value() bool {
	if v.i >= len(v.b) {
		return false
	}
	switch c := v.b[v.i]; {
	case c == '{':
		return v.object()
	case c == '[':
		return v.array()
	case c == '"':
		return v.str()
	case c == 't':
		return v.literal("true")
	case c == 'f':
		return v.literal("false")
	case c == 'n':
		return v.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return v.number()
	}
	return false
}

func (v *validator) object() bool {
	if v.depth++; v.depth > maxDepth {
		v.deep = true
		return false
	}
	v.i++
	v.skipWS()
	if v.i < len(v.b) && v.b[v.i] == '}' {
		v.i++
		v.depth--
		return true
	}
	for {
		k := v.i
		if v.i >= len(v.b) || v.b[v.i] != '"' || !v.str() {
			return false
		}
		k1 := v.i
		v.skipWS()
		if v.i >= len(v.b) || v.b[v.i] != ':' {
			return false
		}
		v.i++
		v.skipWS()
		start := v.i
		if !v.value() {
			return false
		}
		if v.collect && v.depth == 1 {
			if v.ntop < len(v.top) {
				v.top[v.ntop] = memberSpan{k, k1, start, v.i}
			}
			v.ntop++
		}
		v.skipWS()
		if v.i >= len(v.b) {
			return false
		}
		switch v.b[v.i] {
		case ',':
			v.i++
			v.skipWS()
		case '}':
			v.i++
			v.depth--
			return true
		default:
			return false
		}
	}
}

func (v *validator) array() bool {
	if v.depth++; v.depth > maxDepth {
		v.deep = true
		return false
	}
	v.i++
	v.skipWS()
	if v.i < len(v.b) && v.b[v.i] == ']' {
		v.i++
		v.depth--
		return true
	}
	for {
		if !v.value() {
			return false
		}
		v.skipWS()
		if v.i >= len(v.b) {
			return false
		}
		switch v.b[v.i] {
		case ',':
			v.i++
			v.skipWS()
		case ']':
			v.i++
			v.depth--
			return true
		default:
			return false
		}
	}
}

func (v *validator) str() bool {
	b := v.b
	i := v.i + 1
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			v.i = i + 1
			return true
		case c == '\\':
			i++
			if i >= len(b) {
				v.i = i
				return false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				for k := 1; k <= 4; k++ {
					if i+k >= len(b) || unhex(b[i+k]) < 0 {
						v.i = i + k
						return false
					}
				}
				i += 5
			default:
				v.i = i
				return false
			}
		case c < 0x20:
			v.i = i
			return false
		default:
			i++
		}
	}
	v.i = i
	return false
}

func (v *validator) literal(lit string) bool {
	for k := 0; k < len(lit); k++ {
		if v.i >= len(v.b) || v.b[v.i] != lit[k] {
			return false
		}
		v.i++
	}
	return true
}

func (v *validator) number() bool {
	b := v.b
	i := v.i
	if b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		v.i = i
		return false
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		v.i = i
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			v.i = i
			return false
		}
		i = skipDigits(b, i)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			v.i = i
			return false
		}
		i = skipDigits(b, i)
	}
	v.i = i
	return true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func skipDigits(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}

func unhex(c byte) rune {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0')
	case c >= 'a' && c <= 'f':
		return rune(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// The functions below walk text that validate accepted.

// skipValue returns the index just past the value that starts at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return i
	default: // number or literal
		for i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
			i++
		}
		return i
	}
}

// skipString returns the index just past the string that starts at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// members walks the fields of a valid JSON object.
type members struct {
	b []byte
	i int
}

// newMembers starts a walk over obj, a valid JSON object.
func newMembers(obj []byte) members { return members{b: obj, i: 1} }

// next returns the next field's key token (with quotes) and value.
func (m *members) next() (key, val []byte, ok bool) {
	b := m.b
	i := skipWS(b, m.i)
	if i >= len(b) || b[i] == '}' {
		return nil, nil, false
	}
	if b[i] == ',' {
		i = skipWS(b, i+1)
	}
	k := i
	i = skipString(b, i)
	key = b[k:i]
	i = skipWS(b, i)
	i = skipWS(b, i+1) // ':'
	v := i
	i = skipValue(b, i)
	m.i = i
	return key, b[v:i], true
}

// elems walks the elements of a valid JSON array.
type elems struct {
	b []byte
	i int
}

func newElems(arr []byte) elems { return elems{b: arr, i: 1} }

func (e *elems) next() (val []byte, ok bool) {
	b := e.b
	i := skipWS(b, e.i)
	if i >= len(b) || b[i] == ']' {
		return nil, false
	}
	if b[i] == ',' {
		i = skipWS(b, i+1)
	}
	v := i
	i = skipValue(b, i)
	e.i = i
	return b[v:i], true
}

// hasEscape reports whether the string token tok (with quotes) contains a
// backslash escape.
func hasEscape(tok []byte) bool {
	for _, c := range tok {
		if c == '\\' {
			return true
		}
	}
	return false
}

// unquote returns the value of a valid string token tok (with quotes), with
// the same result as encoding/json: a \u escape naming a lone surrogate
// becomes U+FFFD.
func unquote(tok []byte) string {
	s := tok[1 : len(tok)-1]
	if !hasEscape(s) {
		return string(s)
	}
	return string(appendUnquote(make([]byte, 0, len(s)), s))
}

func appendUnquote(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch s[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(s[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					if dec := utf16.DecodeRune(r, hex4(s[i+2:])); dec != unicode.ReplacementChar {
						i += 6
						dst = utf8.AppendRune(dst, dec)
						continue
					}
				}
				r = unicode.ReplacementChar
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, s[i+1])
		}
		i += 2
	}
	return dst
}

func hex4(b []byte) rune {
	return unhex(b[0])<<12 | unhex(b[1])<<8 | unhex(b[2])<<4 | unhex(b[3])
}

// needsCompact reports whether valid JSON text b may hold insignificant
// whitespace. In valid JSON every byte <= ' ' is either whitespace between
// tokens or a space inside a string, so false means b is already compact.
func needsCompact(b []byte) bool {
	for _, c := range b {
		if c <= ' ' {
			return true
		}
	}
	return false
}

// appendCompact appends valid JSON text src without insignificant
// whitespace. Strings and numbers are copied byte for byte, so the result
// equals json.Compact's.
func appendCompact(dst, src []byte) []byte {
	for i := 0; i < len(src); i++ {
		switch c := src[i]; c {
		case ' ', '\t', '\n', '\r':
		case '"':
			j := skipString(src, i)
			dst = append(dst, src[i:j]...)
			i = j - 1
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// jsonKind names the JSON type of the valid value v, for error causes.
func jsonKind(v []byte) string {
	switch v[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// parseInt returns the value of a valid JSON number token when that value
// is a whole number in int64 range: 42, -7, 1e3, 2.50e1 and 4.0 qualify;
// 1.5, 1e-1 and 1e19 do not.
func parseInt(tok []byte) (int64, bool) {
	i := 0
	neg := tok[0] == '-'
	if neg {
		i++
	}
	intStart := i
	i = skipDigits(tok, i)
	intEnd := i
	fracStart, fracEnd := i, i
	if i < len(tok) && tok[i] == '.' {
		fracStart = i + 1
		i = skipDigits(tok, fracStart)
		fracEnd = i
	}
	exp := 0
	if i < len(tok) && (tok[i] == 'e' || tok[i] == 'E') {
		i++
		eneg := tok[i] == '-'
		if tok[i] == '+' || tok[i] == '-' {
			i++
		}
		for ; i < len(tok); i++ {
			if exp < 1e8 { // saturate; the magnitude only has to exceed any digit count
				exp = exp*10 + int(tok[i]-'0')
			}
		}
		if eneg {
			exp = -exp
		}
	}
	nInt, nFrac := intEnd-intStart, fracEnd-fracStart
	digit := func(k int) byte { // k-th mantissa digit, integer then fraction part
		if k < nInt {
			return tok[intStart+k]
		}
		return tok[fracStart+k-nInt]
	}
	hi := nInt + nFrac
	scale := exp - nFrac
	for hi > 0 && digit(hi-1) == '0' {
		hi--
		scale++
	}
	lo := 0
	for lo < hi && digit(lo) == '0' {
		lo++
	}
	if lo == hi {
		return 0, true
	}
	if scale < 0 || hi-lo+scale > 19 {
		return 0, false
	}
	var u uint64 // at most 19 digits: below 1e19 < 2^64
	for k := lo; k < hi; k++ {
		u = u*10 + uint64(digit(k)-'0')
	}
	for ; scale > 0; scale-- {
		u *= 10
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return int64(-u), true
	}
	if u > 1<<63-1 {
		return 0, false
	}
	return int64(u), true
}
