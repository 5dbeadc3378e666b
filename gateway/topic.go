package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/syncgate/syncgate/frames"
)

// maxTopicLen bounds a topic name in bytes.
const maxTopicLen = 255

const topicFix = "use 1-255 bytes of letters, digits and _ . : @ / -"

// validTopic reports why name is not a valid topic, or nil.
func validTopic(name string) error {
	if name == "" {
		return errors.New("empty topic name")
	}
	if len(name) > maxTopicLen {
		return errors.New("topic name longer than 255 bytes")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '_', c == '.', c == ':', c == '@', c == '/', c == '-':
		default:
			// Named as sent: a character of several bytes in UTF-8 is
			// decoded whole, not read from its first byte; a byte that
			// starts none is quoted as a byte.
			r, size := utf8.DecodeRuneInString(name[i:])
			what := strconv.QuoteRune(r)
			if r == utf8.RuneError && size <= 1 {
				what = strconv.Quote(name[i : i+1])
			}
			return errors.New("topic name has character " + what + " at byte " + strconv.Itoa(i))
		}
	}
	return nil
}

// sequencer assigns ephemeral-topic offsets and orders each topic's
// publishes against its subscribes. Offsets come from one node-wide counter,
// so they increase per topic; the high part is the node's start time in
// milliseconds, so they keep increasing across restarts.
type sequencer struct {
	seed    maphash.Seed
	hi      uint64
	lo      atomic.Uint64
	stripes [256]sync.Mutex
}

func (q *sequencer) stripe(topic string) *sync.Mutex {
	return &q.stripes[maphash.String(q.seed, topic)%uint64(len(q.stripes))]
}

// tail is the newest offset assigned on this node.
func (q *sequencer) tail() string { return frames.FormatOffset(q.hi, q.lo.Load()) }

// subscribe adds sub to the transport and calls queued with the topic's
// tail, both under the topic's stripe lock.
func (srv *Server) subscribe(ctx context.Context, sub *subscription, queued func(tail string)) error {
	mu := srv.seq.stripe(sub.topic)
	mu.Lock()
	defer mu.Unlock()
	if err := srv.transport.Subscribe(ctx, sub.topic, sub); err != nil {
		return err
	}
	queued(srv.seq.tail())
	return nil
}

// publish assigns the next offset to data on topic, encodes the patch body
// once and hands it to the transport. It returns the offset.
func (srv *Server) publish(ctx context.Context, topic string, actorID *string, data json.RawMessage) (string, error) {
	mu := srv.seq.stripe(topic)
	mu.Lock()
	defer mu.Unlock()
	lsn := frames.FormatOffset(srv.seq.hi, srv.seq.lo.Add(1))
	at := srv.cfg.Now().UnixMilli()
	// data is a decoded frame's RawMessage (valid, compact JSON), so the
	// row needs no second validation.
	body := frames.AppendInsertBody(make([]byte, 0, len(data)+4*len(lsn)+128), lsn, func(dst []byte) []byte {
		return appendRow(dst, lsn, data, actorID, at)
	})
	if err := srv.transport.Publish(ctx, topic, body); err != nil {
		return "", err
	}
	srv.metrics.publishes.Inc()
	return lsn, nil
}

// appendRow appends a topic message row {id, data, actorId, at}.
func appendRow(dst []byte, id string, data json.RawMessage, actorID *string, at int64) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendQuote(dst, id) // offsets are ASCII digits and '_'
	dst = append(dst, `,"data":`...)
	dst = append(dst, data...)
	dst = appendActorAt(dst, actorID, at)
	return append(dst, '}')
}

// appendActorAt appends the ,"actorId":…,"at":… members of a row or record.
func appendActorAt(dst []byte, actorID *string, at int64) []byte {
	dst = append(dst, `,"actorId":`...)
	if actorID == nil {
		dst = append(dst, "null"...)
	} else {
		b, _ := json.Marshal(*actorID)
		dst = append(dst, b...)
	}
	dst = append(dst, `,"at":`...)
	return strconv.AppendInt(dst, at, 10)
}
