package storage

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// randMeta returns a meta with each field zero or random.
func randMeta(rng *rand.Rand) meta {
	str := func() string {
		if rng.IntN(3) == 0 {
			return ""
		}
		r := make([]rune, rng.IntN(20)) // valid UTF-8, as JSON needs
		for i := range r {
			r[i] = rune(rng.IntN(0xD000))
		}
		return string(r)
	}
	u := func() uint64 {
		if rng.IntN(3) == 0 {
			return 0
		}
		return rng.Uint64() >> rng.IntN(64)
	}
	i := func() int64 {
		v := int64(u())
		if rng.IntN(2) == 0 {
			return -v
		}
		return v
	}
	tm := func() time.Time {
		if rng.IntN(3) == 0 {
			return time.Time{}
		}
		return time.Unix(rng.Int64N(200e9)-60e9, rng.Int64N(1e9)).UTC() // years 69 to 6307: JSON can encode them
	}
	m := meta{
		ID: u(), Name: str(), ContentType: str(), TTL: time.Duration(i()),
		ExpiresAt: tm(), ExpiresAtRaw: str(), Inherit: rng.IntN(2) == 0,
		Created: tm(), Access: i(), Closed: rng.IntN(2) == 0, StreamSeq: str(),
		Tail: u(), Base: u(), Pruned: u(), Bytes: i(), Count: i(),
		SrcID: u(), ForkFrom: str(), ForkSub: i(), ForkDefault: rng.IntN(2) == 0,
		Forks: int(i()), Deleted: rng.IntN(2) == 0,
	}
	if rng.IntN(2) == 0 {
		m.CloseProd = &closeProd{str(), i(), i()}
	}
	if rng.IntN(2) == 0 {
		m.Retention = &Retention{time.Duration(i()), i(), i()}
	}
	return m
}

// sameMeta compares metas, times by instant.
func sameMeta(a, b meta) bool {
	if !a.ExpiresAt.Equal(b.ExpiresAt) || !a.Created.Equal(b.Created) {
		return false
	}
	a.ExpiresAt, b.ExpiresAt, a.Created, b.Created = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

func Test_metaCodec(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for n := range 2000 {
		m := randMeta(rng)
		b := encodeMeta(nil, &m)
		var got meta
		if err := decodeMeta(b, &got); err != nil || !sameMeta(m, got) {
			t.Fatalf("case %d: binary round trip: %v\n%+v\n%+v", n, err, m, got)
		}
		for cut := range len(b) { // every truncation is refused
			var bad meta
			if err := decodeMeta(b[:cut], &bad); !errors.Is(err, errCorruptMeta) {
				t.Fatalf("case %d: %d of %d bytes decoded: %v", n, cut, len(b), err)
			}
		}
		if err := decodeMeta(append(b, 0), &got); !errors.Is(err, errCorruptMeta) {
			t.Fatalf("case %d: trailing byte accepted: %v", n, err)
		}
		// Metas written as JSON, before the binary form, still decode.
		if !m.Created.IsZero() {
			m.Created = m.Created.Local()
		}
		j, err := json.Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		got = meta{}
		if err := decodeMeta(j, &got); err != nil || !sameMeta(m, got) {
			t.Fatalf("case %d: JSON: %v\n%+v\n%+v", n, err, m, got)
		}
	}
}

// Test_prodCodec: producer states round-trip; a truncated one, or one
// whose ring length is over ringSize however large (a length that
// overflowed int used to pass as an empty ring), does not decode, and
// prodDecodes, which the maintenance pass and eviction use to keep such
// states, agrees with decodeProd.
func Test_prodCodec(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for n := range 500 {
		var p prodState
		p.epoch, p.lastSeq, p.used = rng.Int64N(1<<40), rng.Int64N(1<<40)+ringSize, rng.Int64()-rng.Int64()
		pos := rng.Uint64N(1 << 40)
		for i := range rng.IntN(ringSize + 1) {
			p.ring = append(p.ring, ringEnt{seq: p.lastSeq - int64(i), pos: pos - uint64(i)})
		}
		b := p.encode(nil)
		var got prodState
		if err := decodeProd(b, &got); err != nil || !prodDecodes(b) || got.epoch != p.epoch || got.lastSeq != p.lastSeq || got.used != p.used || len(got.ring) != len(p.ring) || (len(p.ring) > 0 && !reflect.DeepEqual(got.ring, p.ring)) {
			t.Fatalf("case %d: round trip: %v\n%+v\n%+v", n, err, p, got)
		}
		for cut := range len(b) {
			if err := decodeProd(b[:cut], &got); !errors.Is(err, errCorruptProducer) || prodDecodes(b[:cut]) {
				t.Fatalf("case %d: %d of %d bytes decoded: %v", n, cut, len(b), err)
			}
		}
	}
	for _, ringLen := range []uint64{ringSize + 1, 1 << 62, 1 << 63, 1<<64 - 1} {
		b := binary.AppendUvarint([]byte{0, 0, 0}, ringLen)
		var got prodState
		if err := decodeProd(b, &got); !errors.Is(err, errCorruptProducer) || prodDecodes(b) {
			t.Fatalf("ring length %d: %v; want errCorruptProducer", ringLen, err)
		}
	}
}
