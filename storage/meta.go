package storage

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// meta is a stream's persisted state, JSON-encoded under its id in the
// "meta" bucket. It is small and rewritten at most once per transaction.
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

func decodeMeta(b []byte, m *meta) error {
	if err := json.Unmarshal(b, m); err != nil {
		return fmt.Errorf("storage: corrupt stream meta: %w", err)
	}
	return nil
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

// encode appends p's binary form to b: uvarint epoch, lastSeq, used, ring
// length, then the ring newest first as deltas (seq, pos) from the
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

var errCorruptProducer = errors.New("storage: corrupt producer state")

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
	p.epoch, p.lastSeq, p.used = int64(vals[0]), int64(vals[1]), int64(vals[2])
	cnt := int(vals[3])
	if cnt > ringSize {
		return errCorruptProducer
	}
	p.ring = make([]ringEnt, 0, ringSize)
	prevSeq, prevPos := p.lastSeq, uint64(0)
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
		p.ring = append(p.ring, e)
		prevSeq, prevPos = e.seq, e.pos
	}
	return nil
}

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

func encodeMeta(m *meta) ([]byte, error) { return json.Marshal(m) }
