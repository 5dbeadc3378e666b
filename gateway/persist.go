package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/storage"
)

// Persisted topics.
//
// A topic whose name matches a Config.Persist pattern is the stream of the
// same name in Config.Log (JSON mode). The stream is made by those who may
// write it: the first publish or HTTP POST (its append creates it) or a
// PUT over HTTP (the manage grant); a subscribe never makes it, so a
// session that may only read cannot fill the log with empty streams.
// Publishing appends a record {key, data, actorId, at}; the record reaches
// subscribers through the topic's tailer, never straight from the publish,
// so records appended over HTTP and over WebSocket reach them alike and in
// log order.
//
// A subscribe to a topic with no stream yet is answered as one to an empty
// stream (a snapshot at the zero offset, with no log digest), and its
// tailer waits for a stream to appear: woken by this node's publishes,
// POSTs and PUTs (streamMade), and looking every second for one made
// elsewhere. It then adopts the stream from its start, without a reset:
// its subscribers had nothing after the zero offset, and the new log's
// offsets all come after it. They get a snapshot with no rows at the zero
// offset carrying the log's digest (a log mark of kind markCreated), then
// its records. A stream of another content type than JSON is taken for
// none: its records are not rows (a subscribe that finds one is refused,
// X_BAD_TOPIC). So is a soft-deleted stream (deleted while forks keep it).
//
// One tailer runs per persisted topic with local subscribers. It waits on
// the log, reads what is new and hands each record to the transport as an
// insert patch whose lsn is the record's offset, under the topic's stripe
// lock; tailer.published is the offset of the last record handed over.
// A subscribe takes the same lock, so it sees a published offset P such
// that every record after P will be delivered to it live. Without a cursor
// it gets a snapshot at P. With a cursor it is marked replaying: live
// deliveries are held in a bounded buffer while a replayer reads the
// records in (cursor, P] from the log and queues them, then the held ones
// are queued and the subscription turns live. If the buffer overflows it is
// discarded and the replayer reads on from P to the tailer's new position:
// the log, not the buffer, is the source of truth, so nothing is lost or
// sent twice at the seam. A session's replayers share its send queue: they
// queue in turn (replayRoom), one frame at a time, each only while the
// queue is below half full, so replays of any number of its subscriptions
// leave live traffic at least a quarter of it.

// replayHold bounds the live patches a replaying subscription holds, in
// number, and so does a quarter of the send queue's frame bound
// (replay.maxHeldN: SendQueueMessages may be under 4096); in bytes they
// are bounded by a quarter of the send queue (replay.maxHeld). They are
// queued at once when the replay ends, in the session's replay turn,
// onto a queue below half full (replayRoom), so they always fit.
const replayHold = 4096

// replayPage bounds one log read during replay and tailing. A replay
// reads at most a quarter of the send queue at once (in records' bytes;
// its frames, each record wrapped in a row and an insert, may be several
// times that for small records), and queues it frame by frame.
const replayPage = 256 << 10

// replayFrameOps and replayFrameBytes bound one patch frame of a replay;
// on a send queue under 256 KiB a frame's rows take at most an eighth of
// it, so that a frame queued below half the queue leaves a quarter free.
const (
	replayFrameOps   = 64
	replayFrameBytes = 32 << 10
)

// tailRetry is how long a tailer waits after a failed log call, and how
// often a tailer with no stream looks for one made elsewhere (one made
// through this node wakes it at once: streamMade).
const tailRetry = time.Second

// persisted reports whether topic is a persisted topic.
func (srv *Server) persisted(topic string) bool {
	for _, p := range srv.persist {
		if p.Match(topic) {
			return true
		}
	}
	return false
}

// persistPatterns parses Config.Persist (checked by withDefaults).
func persistPatterns(ss []string) []auth.Pattern {
	ps := make([]auth.Pattern, 0, len(ss))
	for _, s := range ss {
		if p, err := auth.ParsePattern(s); err == nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// persistError returns the first bad pattern of Config.Persist.
func persistError(ss []string) error {
	for i, s := range ss {
		if _, err := auth.ParsePattern(s); err != nil {
			return fmt.Errorf("pattern %q (Persist[%d]): %w", s, i, err)
		}
	}
	return nil
}

var errNotJSONStream = errors.New("the topic's stream exists with a content type other than application/json")

// publishPersisted appends mutate f's message to topic's stream. The
// outcome, the record's offset, arrives on the returned channel once the
// append is durable; a client-named producer makes the append idempotent
// across reconnects and restarts. Appends are submitted in the order the
// session's reader calls this, so one producer's seqs reach the log in
// order.
func (s *session) publishPersisted(f *frames.Mutate, topic string, data json.RawMessage) (outcome, <-chan outcome) {
	srv := s.srv
	var prod *storage.Producer
	if s.clientID != "" {
		// One client's seqs span every topic: in one topic's log they
		// only increase (AllowGap).
		prod = &storage.Producer{ID: s.prodName, Epoch: s.epoch, Seq: f.Seq, AllowGap: true}
	}
	rec := appendRecord(make([]byte, 0, len(data)+len(f.Key)+64), f.Key, data, s.actorID(), srv.cfg.Now().UnixMilli())
	// A missing stream (first use, or deleted over HTTP) is made by the
	// append itself, in the log's writer, so the session's appends stay in
	// submission order: a retry run after later seqs had landed would be
	// taken for a duplicate (AllowGap) and acked without being written.
	// One of another content type refuses it (ErrContentType).
	req := storage.AppendRequest{Records: [][]byte{rec}, Producer: prod, ContentType: "application/json", CreateMissing: true}
	later := make(chan outcome, 1)
	srv.cfg.Log.AppendAsync(topic, req, func(res storage.AppendResult, err error) {
		if err != nil {
			later <- outcome{key: f.Key, err: s.logError(f.Key, "publish", topic, err)}
			return
		}
		srv.streamMade(topic) // the first append made the stream
		if res.Duplicate && prod != nil {
			// A retry the log answers (its producer unknown here: a
			// restart, or a record forgotten) wrote nothing. The log
			// knows seqs, not keys: whether it is a retry is read from
			// its record, off the log's goroutine.
			go func() { later <- s.duplicateOutcome(f, topic, res) }()
			return
		}
		if !res.Duplicate {
			srv.metrics.publishes.Inc()
		}
		later <- outcome{key: f.Key, lsn: res.Offset}
	})
	return outcome{}, later
}

// logSeqHistory is how many of a producer's last appends to a stream the
// log remembers the offsets of (storage: a producer's ring); a duplicate
// of an older seq is answered with the stream's tail.
const logSeqHistory = 64

// duplicateOutcome answers mutate f, which the log took for a duplicate
// (res): its seq is at or below the last one the log admitted from the
// producer in topic. That is a retry only if the record at the offset the
// log names carries f's key. When the seq is among the producer's last
// logSeqHistory appends there, the log names the seq's own record (or,
// for a seq that went to another topic, the tail): a record of another
// key means the seq was answered for another mutate, and f, a client out
// of step (its seq lost across a restart of this node or its record
// forgotten), gets X_SEQ_REUSED as the outcome window would have given
// it, rather than an ack for a message the log does not hold. An older
// seq is answered with the offset, as the log does (docs/protocol.md
// §6.4), and so is one whose record cannot be read.
func (s *session) duplicateOutcome(f *frames.Mutate, topic string, res storage.AppendResult) outcome {
	ok := outcome{key: f.Key, lsn: res.Offset}
	pos, err := storage.ParseOffset(res.Offset)
	if err != nil || pos == 0 || res.Epoch != s.epoch || res.Seq-f.Seq >= logSeqHistory {
		return ok
	}
	rr, err := s.srv.cfg.Log.Read(s.ctx, topic, storage.FormatOffset(pos-1), 1)
	if err != nil || len(rr.Records) == 0 || rr.Records[0].Offset != res.Offset {
		return ok
	}
	var key string
	var haveKey bool
	frames.Fields(rr.Records[0].Data, func(k []byte, v json.RawMessage) bool {
		if string(k) == "key" {
			key, haveKey = frames.Unquote(v)
		}
		return true
	})
	if haveKey && key == f.Key {
		return ok
	}
	return outcome{key: f.Key, err: frames.NewError(frames.CodeSeqReused, f.Key,
		fmt.Sprintf("mutate.seq %d was already answered for another mutate (topic %s's log holds it); this mutate was not applied", f.Seq, quote(topic)),
		"send it under the next seq; a client that keeps its clientId across restarts keeps its seq too (hello.seq), or raises its epoch")}
}

// appendRecord appends the stored form of a WebSocket publish.
func appendRecord(dst []byte, key string, data json.RawMessage, actorID *string, at int64) []byte {
	dst = append(dst, `{"key":`...)
	kb, _ := json.Marshal(key)
	dst = append(dst, kb...)
	dst = append(dst, `,"data":`...)
	dst = append(dst, data...)
	dst = appendActorAt(dst, actorID, at)
	return append(dst, '}')
}

// recordRow turns a stored record into a topic row {id, data, actorId,
// at} whose id is the record's offset. A record written by a WebSocket
// publish carries data, actorId and at; any other JSON value (appended by
// a backend over HTTP) becomes the row's data, with actorId null and at
// the time the gateway reads it (now). It also returns the record's own
// at (its publish time, Unix ms), or 0 if it has none and the row took now.
func recordRow(dst []byte, offset string, rec []byte, now int64) (row []byte, at int64) {
	data, actorID, recAt, ok := publishRecord(rec)
	switch {
	case !ok:
		return appendRow(dst, offset, rec, nil, now), 0
	case recAt == nil:
		return appendRow(dst, offset, data, actorID, now), 0
	}
	return appendRow(dst, offset, data, actorID, *recAt), *recAt
}

// publishRecord reads rec as a WebSocket publish's record: a JSON object
// with a data member, and an actorId (if a string) and an at (if an
// integer). ok is false for any other value, which recordRow takes whole
// as a backend's message.
func publishRecord(rec []byte) (data json.RawMessage, actorID *string, at *int64, ok bool) {
	isObj := frames.Fields(rec, func(k []byte, v json.RawMessage) bool {
		switch string(k) {
		case "data":
			data = v
		case "actorId":
			if s, ok := frames.Unquote(v); ok {
				actorID = &s
			}
		case "at":
			if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
				at = &n
			}
		}
		return true
	})
	return data, actorID, at, isObj && data != nil
}

// validRecord reports whether rec is JSON that recordRow can embed.
//
// The record must also be one a frame can carry as it is: UTF-8 (which
// json.Valid does not check, and a browser fails the connection on) and
// without a raw newline between its tokens (which would split the batch
// its patch goes out in). The HTTP API stores messages compact and
// checked; a record from elsewhere (a damaged or foreign file) may not be.
func validRecord(rec []byte) bool {
	return json.Valid(rec) && bytes.IndexByte(rec, '\n') < 0 && utf8.Valid(rec) && fitsRow(rec)
}

// maxRowDepth is how deep data a topic row carries may nest: the row's
// data sits 4 levels deep in its patch ({"patches":[{"row":{"data":), and
// a patch nested over frames.MaxDepth is one no client can decode.
const maxRowDepth = frames.MaxDepth - 4

// fitsRow reports whether data (a publish's data, or a log record) nests
// at most maxRowDepth deep. A value that deep takes two bytes a level, so
// only one over 2·maxRowDepth bytes is scanned: nothing per publish of
// the usual size.
func fitsRow(data []byte) bool {
	return len(data) <= 2*maxRowDepth || frames.Depth(data) <= maxRowDepth
}

// maxRow is the largest record a persisted topic's subscribers are sent:
// a quarter of a session's send queue (Config.SendQueueBytes). Each
// record reaches a live subscriber as one patch, which its queue must
// take whole, and a replay queues its frames (up to an eighth of the
// queue, and one message more) onto a queue below half full. A larger
// one would close every live subscriber as a slow consumer (4001), and
// every resume from a cursor before it again: nobody could get past it.
// The HTTP API refuses such a message at a persisted topic's name (413,
// checkPersistedSizes); one that reaches the log another way (a fork of
// another stream, another node's or an earlier run's larger queue) is
// skipped, as a record that is not JSON is.
func (srv *Server) maxRow() int { return srv.cfg.SendQueueBytes / 4 }

// tailer feeds one persisted topic's records to the transport.
type tailer struct {
	topic     string
	refs      int      // guarded by Server.tailMu
	published string   // guarded by the topic's stripe lock
	log       logIdent // guarded by the topic's stripe lock: the stream published from
	cancel    context.CancelFunc

	// moved, guarded by the topic's stripe lock, is closed (and cleared)
	// whenever published or log changes, and after each look of a tailer
	// with no stream that took none: a resume waiting for the tailer
	// (catchUp, awaitLog) takes it (movedLocked) under the lock it reads
	// them under, so no move is missed. Made by the first waiter after a
	// move. It also tells each replay.reset, which the tailer's marks set
	// within the transport's Publish, under the same lock, before the
	// move is told: the in-process hub delivers synchronously (a transport
	// that did not would need a signal of its own here, and joinLive's
	// window would need one too).
	moved chan struct{}

	// made (capacity 1) cuts short the tailer's wait before it looks at
	// the stream again (no stream; a closed one; a read of a log made
	// anew): wake fills it without blocking. A token left from a wake
	// the tailer did not need costs it one look more, and a wake during
	// a look is not lost.
	made chan struct{}

	// failing is set while the tailer retries a failed wait or read of
	// its log (retry), and cleared by its next good read or when it moves
	// to another log (or none): a resume whose wait for it runs out then
	// answers X_INTERNAL (catchUp), not a lost cursor.
	failing atomic.Bool

	// refused is set while the stream there, at the tailer's last look,
	// is one a subscribe is refused for (subscribableHead): of another
	// content type than JSON (made over HTTP on a node that does not
	// persist the name, or before it did), or soft-deleted (deleted over
	// HTTP while forks keep it). The tailer takes it for no stream;
	// acquireTailer looks again before it refuses a subscribe, the last
	// look being up to a second old.
	refused atomic.Bool
}

// movedLocked returns a channel closed at t's next move (markMovedLocked).
// The caller holds the topic's stripe lock.
func (t *tailer) movedLocked() <-chan struct{} {
	if t.moved == nil {
		t.moved = make(chan struct{})
	}
	return t.moved
}

// markMovedLocked wakes those waiting for t to move: published or log
// has changed, or t, with no stream, has looked for one and not taken
// one. The caller holds the topic's stripe lock.
func (t *tailer) markMovedLocked() {
	if t.moved != nil {
		close(t.moved)
		t.moved = nil
	}
}

// acquireTailer returns topic's tailer, starting it if needed. The caller
// must releaseTailer it. A topic with no stream (never made, or deleted)
// gets a tailer with none, published at the zero offset: a subscribe does
// not make the stream (see the top of this file). One that exists must be
// one a subscribe may take (subscribableHead).
func (srv *Server) acquireTailer(ctx context.Context, topic string) (*tailer, error) {
	srv.tailMu.Lock()
	if t := srv.tailers[topic]; t != nil {
		t.refs++
		srv.tailMu.Unlock()
		if t.refused.Load() {
			// The tailer's last look found a stream a subscribe is
			// refused for, but it may have been replaced since by a
			// JSON one made elsewhere (or deleted), which the tailer
			// would only see at its next look: look now, and wake it
			// to take what is there.
			if _, err := srv.subscribableHead(ctx, topic); err != nil {
				srv.releaseTailer(t)
				return nil, err
			}
			t.wake()
		}
		return t, nil
	}
	defer srv.tailMu.Unlock()
	info, err := srv.subscribableHead(ctx, topic)
	if err != nil {
		return nil, err
	}
	tctx, cancel := context.WithCancel(srv.baseCtx)
	t := &tailer{topic: topic, refs: 1, published: info.Tail, log: identOf(info), cancel: cancel, made: make(chan struct{}, 1)}
	srv.tailers[topic] = t
	srv.tailIndex.Store(topic, t)
	srv.metrics.tailers.Inc()
	srv.wg.Go(func() { srv.tail(tctx, t, info.Tail) })
	return t, nil
}

// headOf looks at topic's stream as a persisted topic takes it. One that
// does not exist (never made, or deleted) is an Info with only its Tail
// set, the zero offset: the topic's log is then empty. One a subscribe is
// refused for sets refused: errNotJSONStream (another content type than
// JSON: info is that stream) or storage.ErrGone (soft-deleted: its forks
// keep it; info is as for none). err is any other failure. The tailer
// (replaced), a subscribe (subscribableHead) and a resume (awaitLog,
// catchUp) all look through it.
func (srv *Server) headOf(ctx context.Context, topic string) (info storage.Info, refused, err error) {
	info, err = srv.cfg.Log.Head(ctx, topic)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return storage.Info{Tail: storage.ZeroOffset}, nil, nil
	case errors.Is(err, storage.ErrGone):
		return storage.Info{Tail: storage.ZeroOffset}, err, nil
	case err != nil:
		return storage.Info{}, nil, err
	case storage.NormalizeContentType(info.ContentType) != "application/json":
		return info, errNotJSONStream, nil
	}
	return info, nil, nil
}

// subscribableHead looks at topic's stream for a subscribe (headOf): one
// it is refused for is an error.
func (srv *Server) subscribableHead(ctx context.Context, topic string) (storage.Info, error) {
	info, refused, err := srv.headOf(ctx, topic)
	if err == nil {
		err = refused
	}
	if err != nil {
		return storage.Info{}, err
	}
	return info, nil
}

// releaseTailer drops a reference; the last one stops the tailer.
func (srv *Server) releaseTailer(t *tailer) {
	srv.tailMu.Lock()
	defer srv.tailMu.Unlock()
	if t.refs--; t.refs == 0 {
		t.cancel()
		delete(srv.tailers, t.topic)
		srv.tailIndex.CompareAndDelete(t.topic, t)
		srv.metrics.tailers.Dec()
	}
}

// streamMade wakes topic's tailer (wake): this node may have just made
// its stream (a publish's append, a POST or PUT), and a tailer waiting
// for one then gives its subscribers the first records at once rather
// than at its next look. It never blocks and takes no lock: it runs in
// the log's append callbacks.
func (srv *Server) streamMade(topic string) {
	v, ok := srv.tailIndex.Load(topic)
	if !ok {
		return
	}
	v.(*tailer).wake()
}

// wake makes t look at its stream at once if it waits to look (see
// made), or when it next does. It never blocks and takes no lock.
func (t *tailer) wake() {
	select {
	case t.made <- struct{}{}:
	default:
	}
}

// logIdent names one incarnation of a persisted topic's stream: a stream
// deleted (over HTTP, or by its TTL) and made anew is a different log
// whose offsets start again. The zero value means no stream.
type logIdent struct {
	id      uint64 // storage.Info.ID
	created int64  // storage.Info.CreatedAt, Unix nanoseconds
}

func identOf(in storage.Info) logIdent {
	if in.ID == 0 && in.CreatedAt.IsZero() {
		return logIdent{}
	}
	return logIdent{id: in.ID, created: in.CreatedAt.UnixNano()}
}

// digest is the cursor digest of snapshots on this log ("" for none): a
// resume whose cursor names another log is not read in this one (runReplay).
func (l logIdent) digest() string {
	if l == (logIdent{}) {
		return ""
	}
	return "log:" + strconv.FormatUint(l.id, 36) + "." + strconv.FormatInt(l.created, 36)
}

// tail hands every record after `after` to the transport, in order, until
// ctx ends. When the stream tailed (t.log) is replaced, it resets (see
// resetTail) rather than wait at offsets of the old log or read the new
// one from the middle.
func (srv *Server) tail(ctx context.Context, t *tailer, after string) {
	log := srv.log.With("topic", t.topic)
	mu := srv.seq.stripe(t.topic)
	mu.Lock()
	cur := t.log // only this goroutine changes t.log
	mu.Unlock()
	// wait waits a second (tailRetry) before the tailer looks at the
	// stream again, or less if woken (wake: a stream this node made, a
	// resume whose cursor names a log made since, awaitLog, or a
	// subscribe that found the stream a refused one replaced). With
	// wakeable false (a retry after an error) only the second ends it.
	wait := func(wakeable bool) bool {
		tm := time.NewTimer(tailRetry)
		defer tm.Stop()
		made := t.made
		if !wakeable {
			made = nil
		}
		select {
		case <-ctx.Done():
			return false
		case <-made:
			return true
		case <-tm.C:
			return true
		}
	}
	pause := func() bool { return wait(true) }
	retry := func(what string, err error) bool {
		if ctx.Err() != nil {
			return false
		}
		log.Warn("persisted topic: "+what+" failed; retrying", "err", err)
		t.failing.Store(true)
		return wait(false)
	}
	// replaced reports whether the stream is not the one tailed any more
	// (deleted, expired, or made anew; or made where there was none), and
	// then moves to the start of what is there now (Head): from a stream,
	// a reset (resetTail); from none, the new one's adoption (adoptTail),
	// which loses nothing, since the subscribers were at the zero offset
	// with nothing after it. The subscribers' snapshots then carry this
	// log's digest. A stream made, written and deleted again between two
	// looks is not seen at all: its records are never delivered, and
	// nothing reports them lost (only a delete leads there; docs/protocol.md
	// §6.6). A stream this node makes wakes the tailer at once
	// (streamMade), which narrows that window to the look itself. A
	// stream of another content type than JSON is taken for none (its
	// records are not rows): the subscribers wait for a JSON one, and are
	// told once (warnedType) in the log, not at each look. So is a
	// soft-deleted one (its forks keep it; it cannot be read). New
	// subscribes are refused while either is there (t.refused).
	var warnedType logIdent
	replaced := func(err error) bool {
		if err != nil && !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, storage.ErrGone) &&
			!errors.Is(err, storage.ErrBadRequest) {
			return false
		}
		info, refused, herr := srv.headOf(ctx, t.topic)
		if herr != nil {
			return false
		}
		if refused == errNotJSONStream {
			if id := identOf(info); id != warnedType {
				warnedType = id
				log.Warn("persisted topic: its stream is not application/json; subscribers wait for a JSON stream (delete it; a publish, or a POST or PUT as application/json, makes one)",
					"contentType", info.ContentType)
			}
		}
		if refused != nil {
			info = storage.Info{}
		}
		t.refused.Store(refused != nil)
		now := identOf(info)
		if now == cur {
			return false
		}
		if cur == (logIdent{}) {
			// Made while there was none: its subscribers are at the zero
			// offset with nothing after it, so they take it from its
			// start, without a reset.
			srv.adoptTail(ctx, t, now)
		} else {
			log.Warn("persisted topic: its stream was deleted or made anew; subscribers start again from a snapshot",
				"exists", now != logIdent{})
			srv.resetTail(ctx, t, now)
		}
		after, cur = storage.ZeroOffset, now
		t.failing.Store(false) // the old log's failures say nothing of this one
		return true
	}
	// skipPruned handles a read of the stream tailed that found what
	// comes after `after` removed by retention (the tailer fell behind, or
	// reset onto a log whose start was pruned): it moves past the removed
	// records, to where the read said the stream can be read (in the
	// read's own transaction), and tells the subscribers (skipTail).
	skipPruned := func(err error) bool {
		var pe *storage.PrunedError
		if !errors.As(err, &pe) || pe.ID != cur.id || pe.Pruned <= after {
			return false
		}
		log.Warn("persisted topic: retention removed records before they were delivered; subscribers skip them",
			"after", after, "to", pe.Pruned)
		srv.skipTail(ctx, t, pe.Pruned, cur)
		after = pe.Pruned
		return true
	}
	var body []byte
	var warnedRecord logIdent // the stream whose first record that is not JSON was logged
	for {
		if cur == (logIdent{}) {
			// No stream yet, or since the last reset: look when this node
			// makes one, and every second for one made elsewhere (a
			// stream made empty has nothing to wait on yet). A look that
			// takes none (none there, a refused one, or a failed Head) is
			// told as a move (tailer.moved), so that a resume waiting for
			// a log the tailer has not found (awaitLog) looks whether it
			// is gone.
			if replaced(nil) {
				continue
			}
			mu.Lock()
			t.markMovedLocked()
			mu.Unlock()
			if pause() {
				continue
			}
			return
		}
		// On the stream tailed only: another of the name answers not
		// found, and replaced resets.
		err := srv.cfg.Log.WaitID(ctx, t.topic, after, cur.id)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if replaced(err) {
				continue
			}
			if retry("wait", err) {
				continue
			}
			return
		}
		res, err := srv.cfg.Log.Read(ctx, t.topic, after, replayPage)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if skipPruned(err) || replaced(err) {
				continue
			}
			if retry("read", err) {
				continue
			}
			return
		}
		t.failing.Store(false)
		if res.ID != cur.id {
			// Made anew since the wait: the page is another log's. Head
			// may lag the read by a commit: then look again in a while.
			if !replaced(storage.ErrNotFound) && !pause() {
				return
			}
			continue
		}
		if len(res.Records) == 0 {
			// Closed over HTTP: nothing more will come unless the
			// stream is deleted (and made anew), which WaitID, returning
			// at once on a closed stream, cannot wait for: look again
			// in a while.
			if res.Closed && !pause() {
				return
			}
			continue
		}
		now := srv.cfg.Now().UnixMilli()
		mu.Lock()
		if ctx.Err() != nil {
			// Stopped since the read (its last subscriber left): a new
			// tailer may serve the topic already, and nothing of this
			// one's may reach its subscribers. (The Hub's Publish checks
			// ctx too; a transport need not.)
			mu.Unlock()
			return
		}
		for _, r := range res.Records {
			if len(r.Data) > srv.maxRow() {
				log.Warn("persisted topic: record is larger than a quarter of a session's send queue (-send-queue-bytes); skipped",
					"offset", r.Offset, "bytes", len(r.Data), "limit", srv.maxRow())
			} else if !validRecord(r.Data) {
				if warnedRecord != cur {
					warnedRecord = cur
					log.Warn("persisted topic: record is not JSON a frame can carry (compact, UTF-8); skipped (and any other such record of this stream, without a warning)", "offset", r.Offset)
				}
			} else {
				// Each body is handed to the transport, which keeps it
				// in session queues: a fresh slice per record.
				var at int64
				body = frames.AppendInsertBody(make([]byte, 0, len(r.Data)+160), r.Offset, func(dst []byte) []byte {
					var row []byte
					row, at = recordRow(dst, r.Offset, r.Data, now)
					return row
				})
				if err := srv.publishRecordBody(ctx, t.topic, body, at, now); err != nil {
					if ctx.Err() != nil {
						// Stopped during the hand-over (its last
						// subscriber left; releaseTailer does not
						// take the stripe lock): the rest of the
						// page goes to nobody, and that is no
						// failure to warn of once per record.
						mu.Unlock()
						return
					}
					log.Warn("persisted topic: fanout failed", "offset", r.Offset, "err", err)
				}
			}
			t.published = r.Offset
		}
		t.markMovedLocked()
		mu.Unlock()
		after = res.Next
	}
}

// publishRecordBody hands a persisted topic's record, encoded as an
// insert patch's body, to the transport. Its delivery latency
// (syncgate_delivery_latency_seconds, observed when a session writes it)
// counts from at, the record's publish time (Unix ms): the time a
// WebSocket publish was accepted, so that the log write and the tailer's
// wait to read it back are in it, as they are in its subscribers' wait.
// A record without one (at 0: a message appended over HTTP without an
// at), or with one after now (the tailer's read, Unix ms: another clock,
// or a backend's value), counts from its hand-over, as does any record
// when the transport cannot take a publish time.
func (srv *Server) publishRecordBody(ctx context.Context, topic string, body []byte, at, now int64) error {
	if at <= 0 || at > now || srv.publishAt == nil {
		return srv.transport.Publish(ctx, topic, body)
	}
	return srv.publishAt.PublishAt(ctx, topic, body, time.UnixMilli(at))
}

// A log mark is a message the tailer hands to the transport instead of a
// record, to move every subscription: logMarkStart (JSON never starts with
// it, so a subscription tells a mark from a patch body without decoding),
// the kind, the offset the subscription continues after, and the log's
// digest.
const (
	logMarkStart = 0
	markReplaced = 'r' // the stream was deleted or made anew
	markPruned   = 'p' // retention removed records not yet delivered
	markCreated  = 'c' // a stream was made where there was none
)

func logMark(kind byte, at string, l logIdent) []byte {
	return append(append([]byte{logMarkStart, kind}, at...), l.digest()...)
}

// parseLogMark splits a log mark; ok is false if b is not one.
func parseLogMark(b []byte) (kind byte, at, digest string, ok bool) {
	n := len(storage.ZeroOffset)
	if len(b) < 2+n || b[0] != logMarkStart {
		return 0, "", "", false
	}
	return b[1], string(b[2 : 2+n]), string(b[2+n:]), true
}

// resetTail moves t to the start of the topic's stream now (to, zero if
// there is none), and tells every subscription: each answers with
// X_CURSOR_EXPIRED and a snapshot at the start (logReset), and then gets
// the new stream's records live.
func (srv *Server) resetTail(ctx context.Context, t *tailer, to logIdent) {
	srv.moveTail(ctx, t, markReplaced, storage.ZeroOffset, to)
}

// adoptTail moves t, which had no stream, onto the stream made since (to),
// from its start, and tells every subscription: each answers with a
// snapshot at the start carrying the new log's digest (logCreated), with
// no error, and then gets its records live.
func (srv *Server) adoptTail(ctx context.Context, t *tailer, to logIdent) {
	srv.moveTail(ctx, t, markCreated, storage.ZeroOffset, to)
}

// skipTail moves t past records retention removed before it read them, to
// offset to of log l, and tells every subscription: each answers with
// X_CURSOR_EXPIRED and a snapshot at to (logGap), and the records after it
// follow live.
func (srv *Server) skipTail(ctx context.Context, t *tailer, to string, l logIdent) {
	srv.moveTail(ctx, t, markPruned, to, l)
}

// moveTail puts t at offset at of log l and hands the transport a log mark
// of kind saying so, under the topic's stripe lock (so no publish comes
// between), then wakes those waiting for t to move.
func (srv *Server) moveTail(ctx context.Context, t *tailer, kind byte, at string, l logIdent) {
	mu := srv.seq.stripe(t.topic)
	mu.Lock()
	defer mu.Unlock()
	if ctx.Err() != nil {
		return // stopped: as in tail's hand-over
	}
	t.published, t.log = at, l
	if err := srv.transport.Publish(ctx, t.topic, logMark(kind, at, l)); err != nil && ctx.Err() == nil {
		// (Stopped meanwhile is no failure: as in tail's hand-over.)
		srv.log.Warn("persisted topic: fanout failed", "topic", t.topic, "err", err)
	}
	t.markMovedLocked()
}

// logGap answers a skip of the subscription's topic log (skipTail); a
// replaying subscription reads on from the log instead (holdGap).
func (sub *subscription) logGap(at, digest string) {
	s := sub.s
	s.srv.metrics.resumes[resumeExpired].Inc()
	s.sendError(frames.NewError(frames.CodeCursorExpired, sub.sid,
		"topic "+quote(sub.topic)+"'s records up to "+quote(at)+" were removed by retention before they could be delivered",
		"treat messages after your cursor as lost; the snapshot that follows continues the subscription"))
	s.sendSnapshot(sub.sid, sub.topic, at, digest)
}

// logReset answers a reset of the subscription's topic log to the log
// with the given digest (resetTail); a replaying subscription answers it
// when its replayer gets to it (holdReset, runReplay), unless the client
// has not been answered yet and its cursor names that very log: it is
// then resumed there, with no reset to report.
func (sub *subscription) logReset(digest string) {
	s := sub.s
	s.srv.metrics.resumes[resumeExpired].Inc()
	s.sendError(frames.NewError(frames.CodeCursorExpired, sub.sid,
		"topic "+quote(sub.topic)+"'s log was deleted or made anew; what was published to it since your last patch may be lost",
		"treat messages after your cursor as lost; the snapshot that follows starts the subscription afresh"))
	s.sendSnapshot(sub.sid, sub.topic, storage.ZeroOffset, digest)
}

// logCreated answers the making of the subscription's topic log where
// there was none (adoptTail): the subscription was at the zero offset with
// nothing after it, which is the new log's start, so nothing is lost; the
// snapshot gives the client the log's digest for its cursor. A replaying
// subscription answers it when its replayer gets to it (holdReset), if
// its client was already answered (runReplay's onReset).
func (sub *subscription) logCreated(digest string) {
	sub.s.sendSnapshot(sub.sid, sub.topic, storage.ZeroOffset, digest)
}

// replay is a replaying subscription's state.
type replay struct {
	mu       sync.Mutex
	active   bool               // guarded by mu: live patches are held, not queued
	held     []outItem          // guarded by mu
	heldLen  int                // guarded by mu: bytes in held
	maxHeld  int                // static: the bound on heldLen
	maxHeldN int                // static: the bound on len(held)
	lost     bool               // guarded by mu: held overflowed and was discarded
	reset    bool               // guarded by mu: the topic's log was replaced (resetTail) or made (adoptTail) and the replayer has not yet taken the move (onReset)
	made     bool               // guarded by mu: with reset, only made where there was none: no loss to report
	gap      *heldGap           // guarded by mu: the tailer skipped pruned records (skipTail) before held[gap.at]
	cancel   context.CancelFunc // set before the replayer starts
	done     chan struct{}      // closed when the replayer returns
	cursor   frames.Cursor      // static: the cursor the subscription resumes from
	// answered is set by the replayer as it returns (read after done):
	// the client has had the subscribe's answer (an ack, with or without
	// an error).
	answered bool
	tailer   *tailer
	through  string   // the tailer's offset at the join (joinLive), where the replayer's reading starts to end; set under the stripe lock
	log      logIdent // the log through is in; as through
}

// heldGap is a skip of the topic's log (skipTail) met while replaying: it
// is answered (logGap) when the held patches are queued, in its place.
type heldGap struct {
	at         int // index in held of the first patch after the skip
	to, digest string
}

// dropHeldLocked empties the hold buffer; lost says the replayer must read
// on from the log instead.
func (r *replay) dropHeldLocked(lost bool) {
	r.held, r.heldLen, r.gap, r.lost = nil, 0, nil, lost
}

// hold keeps a live patch while the subscription replays. It reports
// false once the subscription is live.
func (r *replay) hold(it outItem) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.active {
		return false
	}
	switch {
	case r.lost:
	case len(r.held) >= r.maxHeldN || r.heldLen+it.size() > r.maxHeld:
		r.dropHeldLocked(true)
	default:
		r.held = append(r.held, it)
		r.heldLen += it.size()
	}
	return true
}

// holdReset records a reset of the topic's log (resetTail), or its making
// where there was none (adoptTail, made), while the subscription replays:
// what was held came from the old log and is dropped, and the replayer
// starts again in the new log: from its start, or, for a client not
// answered yet whose cursor names that log, from the cursor (runReplay).
// A replacement pending is not turned into a making by a later one. It
// reports false once the subscription is live.
func (r *replay) holdReset(made bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.active {
		return false
	}
	r.dropHeldLocked(false)
	r.made = made && (!r.reset || r.made)
	r.reset = true
	return true
}

// holdGap records a skip of the topic's log to offset to (skipTail) while
// the subscription replays: it is answered in its place among the held
// patches. A second one, or one after the buffer overflowed, drops what
// was held, and the replayer reads on from the log and meets the pruned
// records itself. It reports false once live.
func (r *replay) holdGap(to, digest string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.active {
		return false
	}
	switch {
	case r.lost:
	case r.gap != nil:
		r.dropHeldLocked(true)
	default:
		r.gap = &heldGap{at: len(r.held), to: to, digest: digest}
	}
	return true
}

// resetPending reports a reset recorded by holdReset that the replayer has
// not started over for.
func (r *replay) resetPending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reset
}

// stop ends the replayer and waits for it.
func (r *replay) stop() {
	r.cancel()
	<-r.done
}

// subscribePersisted subscribes sub to a persisted topic; see the comment
// at the top of this file.
func (s *session) subscribePersisted(ctx context.Context, f *frames.Subscribe, sub *subscription) error {
	srv := s.srv
	t, err := srv.acquireTailer(ctx, sub.topic)
	if err != nil {
		return err
	}
	sub.tailer = t
	cursor := f.Target.Cursor
	if cursor != nil {
		sub.replay = &replay{active: true, done: make(chan struct{}), tailer: t, cursor: *cursor, maxHeld: srv.cfg.SendQueueBytes / 4,
			maxHeldN: max(1, min(replayHold, srv.cfg.SendQueueMessages/4))}
	}
	if err := s.joinLive(ctx, sub, cursor == nil); err != nil {
		srv.releaseTailer(t)
		return err
	}
	if r := sub.replay; r != nil {
		if s.replayTurn == nil {
			s.replayTurn = make(chan struct{}, 1)
		}
		rctx, cancel := context.WithCancel(s.ctx)
		r.cancel = cancel
		go func() {
			defer close(r.done)
			s.runReplay(rctx, sub, *cursor)
		}()
	}
	return nil
}

// joinLive registers sub with the transport under the topic's stripe
// lock, so that every record after the tailer's published offset reaches
// it. A fresh subscription is answered there (ack, snapshot at that
// offset); a resuming one records the offset its replay reads up to.
func (s *session) joinLive(ctx context.Context, sub *subscription, fresh bool) error {
	mu := s.srv.seq.stripe(sub.topic)
	mu.Lock()
	defer mu.Unlock()
	if err := s.srv.transport.Subscribe(ctx, sub.topic, sub); err != nil {
		return err
	}
	if fresh {
		s.sendAck(sub.sid, nil)
		s.sendSnapshot(sub.sid, sub.topic, sub.tailer.published, sub.tailer.log.digest())
	} else {
		sub.replay.through, sub.replay.log = sub.tailer.published, sub.tailer.log
	}
	return nil
}

// sendSnapshot sends a topic's snapshot (no rows) at offset lsn of the
// log with the given digest ("" on an ephemeral topic).
func (s *session) sendSnapshot(sid, topic, lsn, digest string) {
	s.send(&frames.Snapshot{SID: sid, Rows: []json.RawMessage{}, Cursor: frames.Cursor{
		QID: "topic:" + topic, LSN: lsn, Digest: digest, IDs: []string{}, At: s.srv.cfg.Now().UnixMilli(),
	}})
}

// runReplay queues the records after the cursor and then the held live
// patches, and turns the subscription live.
func (s *session) runReplay(ctx context.Context, sub *subscription, c frames.Cursor) {
	srv, r, cursor, after := s.srv, sub.replay, c.LSN, c.LSN
	mu := srv.seq.stripe(sub.topic)
	mu.Lock()
	through, cur := r.through, r.log
	mu.Unlock()
	first := true // the client has not been answered yet
	defer func() { r.answered = !first }()
	expired := func(cause, at string) {
		srv.metrics.resumes[resumeExpired].Inc()
		s.sendError(frames.NewError(frames.CodeCursorExpired, sub.sid, "subscribe.target.cursor: "+cause,
			"treat messages after your cursor as lost; the snapshot that follows starts the subscription afresh"))
		s.sendSnapshot(sub.sid, sub.topic, at, cur.digest())
	}
	// The log replaced while replaying (resetTail): the client is told as a
	// live subscriber was, and the replay starts over in the log the
	// tailer is on now, from its start up to where the tailer is; what was
	// held is dropped, the log being the source of truth. A log made where
	// there was none (adoptTail) is no loss: a client already answered at
	// the zero offset gets the new log's digest (logCreated), and one whose
	// cursor is the zero offset and names no log is answered as resumed
	// there. A subscription not yet answered whose cursor names the very
	// log the tailer moved to, made or reset onto, is not answered yet:
	// the replay goes on from its cursor, as if the tailer had had the log
	// when it subscribed (the client got the digest from another node
	// sharing the log, before this node's tailer saw the log: awaitLog).
	// A cursor naming another log (awaitLog saw it, but it was deleted and
	// another made before the tailer looked) resumes in no other: it
	// expires, as one of a deleted log.
	onReset := func() {
		mu.Lock()
		r.mu.Lock()
		made := r.made
		r.reset, r.made = false, false
		r.dropHeldLocked(false)
		through, cur = r.tailer.published, r.tailer.log
		r.mu.Unlock()
		mu.Unlock()
		switch {
		case first && c.Digest != "" && c.Digest == cur.digest():
			return
		case made && !first:
			sub.logCreated(cur.digest())
		case made && cursor == storage.ZeroOffset && c.Digest == "":
			s.sendResumed(sub, cursor, cur.digest())
		default:
			sub.logReset(cur.digest())
		}
		first, after = false, storage.ZeroOffset
	}
	// logFailed answers a log call that failed (not a missing stream,
	// which is an answer): X_INTERNAL and close 1011, so that the client
	// resumes again from its cursor, rather than an expiry telling it its
	// messages were lost.
	logFailed := func(err error) {
		s.log().Warn("replay failed", "topic", sub.topic, "err", err)
		s.sendError(frames.NewError(frames.CodeInternal, sub.sid, "the server could not read the topic's log", "reconnect and resume from your cursor"))
		s.closeWith(reasonLogError)
		first = false
	}
	if c.Digest != "" && c.Digest != cur.digest() {
		// The cursor may name the log there is now, which this node's
		// tailer has not moved to yet (made elsewhere while it waited for
		// a stream, or made in place of the log it tailed).
		if err := s.awaitLog(ctx, sub, c.Digest); err != nil {
			if ctx.Err() == nil {
				logFailed(err)
			}
			return
		}
	}
	if r.resetPending() {
		// The tailer moved since the join (awaitLog waited for it, or it
		// moved by itself): the cursor is judged in the log it is on now,
		// and an expiry names that log, not the one it left.
		onReset()
	}
	switch {
	case !first:
		// Answered by onReset: the tailer found another log.
	case c.Digest != "" && c.Digest != cur.digest():
		// A cursor of a log since deleted (and perhaps made anew, with
		// offsets that start again), or of one this server's log never
		// had (another node's, on a log of its own): answered as a live
		// subscriber of the old log was, and replayed from the current
		// log's start.
		where := "the log there is now"
		if cur == (logIdent{}) {
			where = "any log: the topic has no stream now"
		}
		expired("digest "+quote(c.Digest)+" names a log of topic "+quote(sub.topic)+
			" that is not the one this server has (it was deleted, or never made in this server's log); its offsets are not positions in "+where, storage.ZeroOffset)
		first, after = false, storage.ZeroOffset
	case after > through:
		// The cursor may be ahead of this node's tailer but still in the
		// log (another node, or this one's other sessions, delivered it
		// first): wait for the tailer to pass it, then replay up to the
		// tailer's position instead, dropping what was held meanwhile.
		t, ok, err := s.catchUp(ctx, sub, after, cur)
		if err != nil {
			if ctx.Err() == nil {
				logFailed(err)
			}
			return
		}
		if ok {
			through = t
		}
	}
	if r.resetPending() {
		onReset() // replaced meanwhile: the cursor's log is gone
	} else if hi, _, err := frames.ParseOffset(after); first && (err != nil || hi != 0 || after > through) {
		// Not an offset of this log: from an ephemeral topic, another
		// node's counter, or a stream that was deleted and made anew.
		expired("offset "+quote(after)+" is not a position in topic "+quote(sub.topic)+"'s log", through)
		first, after = false, through
	}
	ops := make([]frames.PatchOp, 0, replayFrameOps)
	frameBytes := min(replayFrameBytes, srv.cfg.SendQueueBytes/8)
	for {
		for after < through {
			if r.resetPending() {
				onReset()
				continue
			}
			res, err := srv.cfg.Log.Read(ctx, sub.topic, after, min(replayPage, r.maxHeld))
			if ctx.Err() != nil {
				return
			}
			if pe := (*storage.PrunedError)(nil); errors.As(err, &pe) && pe.ID == cur.id {
				// Pruned by retention: the client is told, and the replay
				// goes on with the records kept (within its window).
				to := min(pe.Pruned, through)
				expired("offset "+quote(after)+" is older than what topic "+quote(sub.topic)+" keeps (retention)", to)
				first, after = false, to
				continue
			}
			switch {
			case errors.Is(err, storage.ErrNotFound) || errors.Is(err, storage.ErrGone) || errors.Is(err, storage.ErrBadRequest),
				err == nil && res.ID != cur.id:
				// Deleted, or made anew, since the replay began: not a
				// page of the log replayed. The tailer's reset follows,
				// held or live.
				after = through
				continue
			case err != nil:
				logFailed(err)
				return
			}
			if first {
				s.sendResumed(sub, cursor, cur.digest())
				first = false
			}
			now := srv.cfg.Now().UnixMilli()
			ops, size := ops[:0], 0
			// flush queues the frame in the session's replay turn; it
			// fails only when the replay is stopped.
			flush := func() bool {
				if len(ops) > 0 {
					if s.replayRoom(ctx) != nil {
						return false
					}
					srv.metrics.replayed.Add(float64(len(ops)))
					s.send(&frames.Patch{SID: sub.sid, Patches: ops, LSN: ops[len(ops)-1].LSN})
					s.endReplayTurn()
				}
				ops, size = ops[:0], 0
				return true
			}
			for _, rec := range res.Records {
				if rec.Offset > through {
					break
				}
				if len(rec.Data) <= srv.maxRow() && validRecord(rec.Data) { // as the tailer skips
					// Not observed as delivery latency (the item has no
					// publish time): a replay is old by design.
					row, _ := recordRow(nil, rec.Offset, rec.Data, now)
					ops = append(ops, frames.PatchOp{Op: frames.PatchInsert, ID: rec.Offset, LSN: rec.Offset, Row: row})
					if size += len(row); (len(ops) == replayFrameOps || size >= frameBytes) && !flush() {
						return
					}
				}
				after = rec.Offset
			}
			if !flush() {
				return
			}
			if len(res.Records) == 0 {
				break // nothing more in the log (deleted or pruned meanwhile)
			}
		}
		if first {
			s.sendResumed(sub, cursor, cur.digest())
			first = false
		}
		// What is held (at most a quarter of the queue) is queued at
		// once, in the session's replay turn.
		if s.replayRoom(ctx) != nil {
			return
		}
		mu.Lock()
		r.mu.Lock()
		if r.reset {
			r.mu.Unlock()
			mu.Unlock()
			s.endReplayTurn()
			onReset()
			continue
		}
		if r.lost {
			r.dropHeldLocked(false)
			through = r.tailer.published
			r.mu.Unlock()
			mu.Unlock()
			s.endReplayTurn()
			continue
		}
		for i, it := range r.held {
			if r.gap != nil && r.gap.at == i {
				sub.logGap(r.gap.to, r.gap.digest)
			}
			s.enqueue(it)
		}
		if r.gap != nil && r.gap.at == len(r.held) {
			sub.logGap(r.gap.to, r.gap.digest)
		}
		r.dropHeldLocked(false)
		r.active = false
		r.mu.Unlock()
		mu.Unlock()
		s.endReplayTurn()
		return
	}
}

// replayRoom takes the session's replay turn and, holding it, waits until
// the send queue is below half full, in bytes and in frames; the caller then queues one replay
// frame, or the patches it held, and ends the turn (endReplayTurn). So the
// session's replayers queue one at a time, each onto a queue below half:
// checking the queue on its own, each of k replayers found it below half
// and queued k pages onto it at once, closing the session as a slow
// consumer (4001) though its client was only a moment behind. It fails
// only when ctx ends (a session closing has room: its queue takes nothing
// more).
func (s *session) replayRoom(ctx context.Context) error {
	select {
	case s.replayTurn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	// Half in frames too: small frames reach SendQueueMessages first.
	if err := s.q.waitRoom(ctx, max(1, s.srv.cfg.SendQueueMessages/2), s.srv.cfg.SendQueueBytes/2); err != nil {
		s.endReplayTurn()
		return err
	}
	return nil
}

// endReplayTurn ends the turn replayRoom took.
func (s *session) endReplayTurn() { <-s.replayTurn }

// catchUpWait bounds how long a resume waits for the topic's tailer to
// reach a cursor that is ahead of it, or to move to the cursor's log.
const catchUpWait = 5 * time.Second

// catchUp handles a cursor past the tailer's published offset in log cur.
// If the log holds the cursor's record, it waits until the tailer has
// published past it, then restarts the replay window at the tailer's
// position: what was held is dropped, since the replay now reads it from
// the log. It returns the new end of the window, or false if the cursor is
// not in the log (or the wait ran out), and an error if the log could not
// be looked at (at the start, or when the wait ran out), or the wait ran
// out while the tailer was failing to read it (tailer.failing): a log
// that cannot be read is no reason to expire the cursor. It looks again
// only when the tailer moves (tailer.moved).
func (s *session) catchUp(ctx context.Context, sub *subscription, cursor string, cur logIdent) (string, bool, error) {
	srv, r := s.srv, sub.replay
	info, refused, err := srv.headOf(ctx, sub.topic)
	switch {
	case err != nil:
		return "", false, err
	case refused != nil || cursor > info.Tail:
		return "", false, nil // not in the log
	}
	mu := srv.seq.stripe(sub.topic)
	deadline := time.NewTimer(catchUpWait)
	defer deadline.Stop()
	// late: the wait ran out; the tailer's state is read once more (it
	// may have moved as the deadline fired) before the cursor is judged.
	for late := false; ; {
		mu.Lock()
		r.mu.Lock()
		if r.reset || r.tailer.log != cur {
			// Replaced meanwhile: published is another log's offset.
			r.mu.Unlock()
			mu.Unlock()
			return "", false, nil
		}
		if r.tailer.published >= cursor {
			r.dropHeldLocked(false)
			through := r.tailer.published
			r.mu.Unlock()
			mu.Unlock()
			return through, true, nil
		}
		moved := r.tailer.movedLocked()
		r.mu.Unlock()
		mu.Unlock()
		if late {
			if _, _, err := srv.headOf(ctx, sub.topic); err != nil {
				return "", false, err
			}
			if r.tailer.failing.Load() {
				// The cursor is in the log; the tailer cannot read it.
				return "", false, errors.New("the topic's tailer cannot read its log")
			}
			return "", false, nil
		}
		select {
		case <-ctx.Done():
			return "", false, ctx.Err()
		case <-deadline.C:
			late = true
		case <-moved:
		}
	}
}

// awaitLog handles a cursor whose digest names a log other than the one
// the topic's tailer was on when the subscription joined: the tailer had
// none (it waits for a stream, looking every second for one made
// elsewhere: another node sharing the log made it, and the client got
// the digest there), or had the log before it (deleted and made anew,
// and the tailer has not reset yet: the delete wakes its WaitID, but
// Head may show the new log first). While the stream there is the
// cursor's log, it waits, on tailer.moved, up to catchUpWait, until the
// tailer has moved to a log (holdReset, and tailer.log not the zero
// one), so that the cursor is resumed in it rather than taken for one of
// a deleted log (runReplay then finds the reset pending). It wakes the
// tailer once, after its first look (a tailer waiting for a stream, or
// pausing, looks at once; one on the deleted log is woken by the
// delete), and looks again at each move while the tailer has no stream
// (reset to none, or a look that found none): if the cursor's log is
// gone too, it stops waiting at once. The log moved to may still be
// another (the cursor's deleted and another made before the tailer
// looked): onReset then expires the cursor. A failed first look is
// returned (the replay answers X_INTERNAL); a failed look after it is
// taken for no answer: it waits on, and if the wait runs out with the last
// look failed, that failure is returned.
func (s *session) awaitLog(ctx context.Context, sub *subscription, digest string) error {
	srv, r := s.srv, sub.replay
	mu := srv.seq.stripe(sub.topic)
	deadline := time.NewTimer(catchUpWait)
	defer deadline.Stop()
	var lookErr error // the last look's failure
	// late: the wait ran out; the tailer's state is read once more (it
	// may have moved as the deadline fired).
	for woken, late := false, false; ; {
		mu.Lock()
		r.mu.Lock()
		reset, onLog := r.reset, r.tailer.log != (logIdent{})
		moved := r.tailer.movedLocked()
		r.mu.Unlock()
		mu.Unlock()
		if reset && onLog {
			return nil
		}
		if late {
			return lookErr
		}
		if !woken || !onLog {
			info, refused, err := srv.headOf(ctx, sub.topic)
			lookErr = err
			switch {
			case err != nil && woken:
				// A failed look says nothing of the cursor's log: wait
				// on (the tailer's next look comes within a second).
			case err != nil:
				return err
			case refused != nil || identOf(info).digest() != digest:
				return nil
			case !woken:
				r.tailer.wake()
				woken = true
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			late = true
		case <-moved:
		}
	}
}

// sendResumed answers a subscribe whose cursor resumes: the ack, then a
// snapshot with no rows at the cursor's offset, which the replayed patches
// continue.
func (s *session) sendResumed(sub *subscription, cursor, digest string) {
	s.srv.metrics.resumes[resumeReplayed].Inc()
	s.sendAck(sub.sid, nil)
	s.sendSnapshot(sub.sid, sub.topic, cursor, digest)
}

// answerDropped answers, before the drop's ack, the subscribe of a
// resuming subscription dropped before its replayer answered it (it was
// still waiting for or reading the log): an ack and a snapshot with no
// rows at its cursor, as a resume that has sent nothing yet. Every
// subscribe is thus answered, in order: a client matching answers to its
// frames by sid would otherwise take the drop's ack for the add's, and
// wait for the drop's for good. Call it after endPersisted.
func (sub *subscription) answerDropped() {
	r := sub.replay
	if r == nil || r.answered {
		return
	}
	digest := r.cursor.Digest
	if digest == "" {
		digest = r.log.digest() // the log at the join, as a resume names it
	}
	sub.s.sendAck(sub.sid, nil)
	sub.s.sendSnapshot(sub.sid, sub.topic, r.cursor.LSN, digest)
}

// endPersisted releases what a persisted subscription holds.
func (sub *subscription) endPersisted() {
	if sub.replay != nil {
		sub.replay.stop()
	}
	if sub.tailer != nil {
		sub.s.srv.releaseTailer(sub.tailer)
	}
}
