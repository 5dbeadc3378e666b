package storage

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"
)

// meta is a stream's persisted state, encoded under its id in the "meta"
// bucket (encodeMeta). It is small and rewritten at most once per
// transaction. The json tags decode metas written before the binary form.
type meta struct {
	ID           uint64        `json:"id"`
	Name         string        `json:"n"`
	ContentType  string        `json:"ct"`
	TTL          time.Duration `json:"ttl,omitzero"`
	ExpiresAt    time.Time     `json:"exp,omitzero"`
	ExpiresAtRaw string        `json:"expRaw,omitzero"`
	Inherit      bool          `json:"inh,omitzero"` // TTL/ExpiresAt came from the fork source
	Created      time.Time     `json:"cre"`
	Access       int64         `json:"acc,omitzero"` // last append/read, Unix ns, persisted lazily

	Closed    bool       `json:"closed,omitzero"`
	CloseProd *closeProd `json:"cp,omitzero"` // producer tuple of the closing append
	StreamSeq string     `json:"sseq,omitzero"`

	Tail   uint64 `json:"tail,omitzero"`   // position of the last record
	Base   uint64 `json:"base,omitzero"`   // fork offset; own records start at Base+1
	Pruned uint64 `json:"pruned,omitzero"` // own records at positions <= Pruned are gone
	Bytes  int64  `json:"bytes,omitzero"`  // retained own record bytes
	Count  int64  `json:"count,omitzero"`  // retained own records

	SrcID       uint64 `json:"src,omitzero"` // fork source's id
	ForkFrom    string `json:"ff,omitzero"`
	ForkSub     int64  `json:"fsub,omitzero"`
	ForkDefault bool   `json:"fdef,omitzero"`  // created without an explicit fork offset
	Forks       int    `json:"forks,omitzero"` // live forks referencing this stream
	Deleted     bool   `json:"del,omitzero"`   // soft-deleted: kept for its forks

	Retention *Retention `json:"ret,omitzero"`
}

// closeProd is the producer tuple whose append closed a stream.
type closeProd struct {
	ID    string `json:"id"`
	Epoch int64  `json:"e"`
	Seq   int64  `json:"s"`
}

// Meta encodings: metaBinary is the first byte of the binary form
// (encodeMeta); a meta starting with '{' is JSON, as written before.
const metaBinary byte = 1

// Meta flag bits of the binary form.
const (
	mfInherit = 1 << iota
	mfClosed
	mfCloseProd
	mfForkDefault
	mfDeleted
	mfRetention
	mfExpiresAt
)

// encodeMeta appends m's binary form to b: metaBinary, then uvarint
// flags, then the fields in declaration order as uvarints (ids,
// positions), varints (durations, counts, Unix seconds) and
// length-prefixed strings; a time is Unix seconds and nanoseconds;
// CloseProd, Retention and ExpiresAt only when their flag is set.
func encodeMeta(b []byte, m *meta) []byte {
	var f uint64
	for bit, on := range [...]bool{m.Inherit, m.Closed, m.CloseProd != nil, m.ForkDefault, m.Deleted, m.Retention != nil, !m.ExpiresAt.IsZero()} {
		if on {
			f |= 1 << bit
		}
	}
	b = append(b, metaBinary)
	b = binary.AppendUvarint(b, f)
	b = binary.AppendUvarint(b, m.ID)
	b = appendString(b, m.Name)
	b = appendString(b, m.ContentType)
	b = binary.AppendVarint(b, int64(m.TTL))
	if f&mfExpiresAt != 0 {
		b = appendTime(b, m.ExpiresAt)
	}
	b = appendString(b, m.ExpiresAtRaw)
	b = appendTime(b, m.Created)
	b = binary.AppendVarint(b, m.Access)
	if p := m.CloseProd; p != nil {
		b = appendString(b, p.ID)
		b = binary.AppendVarint(b, p.Epoch)
		b = binary.AppendVarint(b, p.Seq)
	}
	b = appendString(b, m.StreamSeq)
	for _, v := range [...]uint64{m.Tail, m.Base, m.Pruned} {
		b = binary.AppendUvarint(b, v)
	}
	b = binary.AppendVarint(b, m.Bytes)
	b = binary.AppendVarint(b, m.Count)
	b = binary.AppendUvarint(b, m.SrcID)
	b = appendString(b, m.ForkFrom)
	b = binary.AppendVarint(b, m.ForkSub)
	b = binary.AppendVarint(b, int64(m.Forks))
	if r := m.Retention; r != nil {
		b = binary.AppendVarint(b, int64(r.MaxAge))
		b = binary.AppendVarint(b, r.MaxBytes)
		b = binary.AppendVarint(b, r.MaxRecords)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendTime(b []byte, t time.Time) []byte {
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

var errCorruptMeta = fmt.Errorf("%w: a stream meta", ErrCorrupt)

// decodeMeta decodes a meta in either form into m, which must be zero.
func decodeMeta(b []byte, m *meta) error {
	if len(b) > 0 && b[0] == '{' {
		if err := json.Unmarshal(b, m); err != nil {
			return fmt.Errorf("%w: %w", errCorruptMeta, err)
		}
		return nil
	}
	if len(b) == 0 || b[0] != metaBinary {
		return errCorruptMeta
	}
	d := metaDecoder{b: b[1:]}
	f := d.uvarint()
	m.ID = d.uvarint()
	m.Name = d.string()
	m.ContentType = d.string()
	m.TTL = time.Duration(d.varint())
	if f&mfExpiresAt != 0 {
		m.ExpiresAt = d.time().UTC()
	}
	m.ExpiresAtRaw = d.string()
	m.Created = d.time()
	m.Access = d.varint()
	if f&mfCloseProd != 0 {
		m.CloseProd = &closeProd{ID: d.string(), Epoch: d.varint(), Seq: d.varint()}
	}
	m.StreamSeq = d.string()
	m.Tail, m.Base, m.Pruned = d.uvarint(), d.uvarint(), d.uvarint()
	m.Bytes, m.Count = d.varint(), d.varint()
	m.SrcID = d.uvarint()
	m.ForkFrom = d.string()
	m.ForkSub = d.varint()
	m.Forks = int(d.varint())
	if f&mfRetention != 0 {
		m.Retention = &Retention{MaxAge: time.Duration(d.varint()), MaxBytes: d.varint(), MaxRecords: d.varint()}
	}
	m.Inherit = f&mfInherit != 0
	m.Closed = f&mfClosed != 0
	m.ForkDefault = f&mfForkDefault != 0
	m.Deleted = f&mfDeleted != 0
	if d.bad || len(d.b) != 0 {
		return errCorruptMeta
	}
	return nil
}

// metaDecoder reads the binary meta form; bad is set by the first
// malformed field, after which every read returns zero.
type metaDecoder struct {
	b   []byte
	bad bool
}

func (d *metaDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *metaDecoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *metaDecoder) string() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.bad, d.b = true, nil
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *metaDecoder) time() time.Time {
	sec, ns := d.varint(), d.uvarint()
	if ns >= 1e9 {
		d.bad, d.b = true, nil
		return time.Time{}
	}
	return time.Unix(sec, int64(ns))
}

// info builds the public description of m.
func (m *meta) info() Info {
	in := Info{
		Name:         m.Name,
		ContentType:  m.ContentType,
		TTL:          m.TTL,
		ExpiresAt:    m.ExpiresAt,
		ExpiresAtRaw: m.ExpiresAtRaw,
		Closed:       m.Closed,
		Tail:         FormatOffset(m.Tail),
		CreatedAt:    m.Created,
		ID:           m.ID,
		Pruned:       FormatOffset(prunedOf([]segment{{m.ID, m.Base, m.Tail, m.Pruned}})), // a fork's sources: see Head
	}
	if m.SrcID != 0 {
		in.ForkFrom = m.ForkFrom
		in.ForkOffset = FormatOffset(m.Base)
		in.ForkSubOffset = m.ForkSub
	}
	return in
}

// ringSize is how many recent admitted appends a producer remembers, so a
// duplicate can be answered with its original offset.
const ringSize = 64

// prodState is one producer's persisted state on one stream.
type prodState struct {
	epoch   int64
	lastSeq int64
	used    int64     // last admitted append, Unix ns
	ring    []ringEnt // admitted appends of the current epoch, newest first
}

// ringEnt is one admitted append: its seq and the offset it returned.
type ringEnt struct {
	seq int64
	pos uint64
}

// admit records an admitted append (epoch, seq) ending at pos.
func (p *prodState) admit(epoch, seq int64, pos uint64, now int64) {
	if epoch != p.epoch {
		p.ring = p.ring[:0]
	}
	p.epoch, p.lastSeq, p.used = epoch, seq, now
	if len(p.ring) < ringSize {
		p.ring = append(p.ring, ringEnt{})
	}
	copy(p.ring[1:], p.ring[:len(p.ring)-1])
	p.ring[0] = ringEnt{seq, pos}
}

// lookup returns the offset the admitted append seq returned, if the ring
// still has it.
func (p *prodState) lookup(seq int64) (uint64, bool) {
	for _, e := range p.ring {
		if e.seq == seq {
			return e.pos, true
		}
		if e.seq < seq {
			break
		}
	}
	return 0, false
}

// encode appends p's binary form to b: uvarint epoch and lastSeq, varint
// used, uvarint ring length, then the ring newest first as deltas (seq, pos) from the
// previous entry (the first from lastSeq and 0).
func (p *prodState) encode(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(p.epoch))
	b = binary.AppendUvarint(b, uint64(p.lastSeq))
	b = binary.AppendVarint(b, p.used)
	b = binary.AppendUvarint(b, uint64(len(p.ring)))
	prevSeq, prevPos := p.lastSeq, uint64(0)
	for i, e := range p.ring {
		b = binary.AppendUvarint(b, uint64(prevSeq-e.seq))
		if i == 0 {
			b = binary.AppendUvarint(b, e.pos)
		} else {
			b = binary.AppendUvarint(b, prevPos-e.pos)
		}
		prevSeq, prevPos = e.seq, e.pos
	}
	return b
}

var errCorruptProducer = fmt.Errorf("%w: a producer state", ErrCorrupt)

// decodeProd decodes producer state b into p; with p nil it only checks
// that b decodes (prodDecodes).
func decodeProd(b []byte, p *prodState) error {
	var vals [4]uint64
	for i := range vals {
		if i == 2 {
			v, n := binary.Varint(b)
			if n <= 0 {
				return errCorruptProducer
			}
			vals[i] = uint64(v)
			b = b[n:]
			continue
		}
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return errCorruptProducer
		}
		vals[i] = v
		b = b[n:]
	}
	cnt := int(vals[3])
	if vals[3] > ringSize {
		return errCorruptProducer
	}
	if p != nil {
		p.epoch, p.lastSeq, p.used = int64(vals[0]), int64(vals[1]), int64(vals[2])
		p.ring = make([]ringEnt, 0, ringSize)
	}
	prevSeq, prevPos := int64(vals[1]), uint64(0)
	for i := 0; i < cnt; i++ {
		ds, n := binary.Uvarint(b)
		if n <= 0 {
			return errCorruptProducer
		}
		b = b[n:]
		dp, n := binary.Uvarint(b)
		if n <= 0 {
			return errCorruptProducer
		}
		b = b[n:]
		e := ringEnt{seq: prevSeq - int64(ds)}
		if i == 0 {
			e.pos = dp
		} else {
			e.pos = prevPos - dp
		}
		if p != nil {
			p.ring = append(p.ring, e)
		}
		prevSeq, prevPos = e.seq, e.pos
	}
	return nil
}

// prodDecodes reports whether b is a producer state that decodes, without
// keeping it (no allocation).
func prodDecodes(b []byte) bool { return decodeProd(b, nil) == nil }

// Record values: one flag byte, then for the first record of an append
// the append's time (8 bytes, big-endian Unix ns, used by MaxAge
// retention), then the data.
const (
	flagStart byte = 1 << 0
)

// recordData splits a stored record value.
func recordData(v []byte) (data []byte, start bool, at int64) {
	if len(v) == 0 {
		return nil, false, 0
	}
	if v[0]&flagStart != 0 {
		if len(v) < 9 {
			return nil, true, 0
		}
		return v[9:], true, int64(binary.BigEndian.Uint64(v[1:9]))
	}
	return v[1:], false, 0
}

// key8 returns the 8-byte big-endian key of n.
func key8(n uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], n)
	return k[:]
}
