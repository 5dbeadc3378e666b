package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
	"github.com/syncgate/syncgate/storage"
)

// TestStorm_Drain is the drain end-to-end test (issue 4): stormTestN
// reconnecting sessions on node A, each subscribed to a persisted topic
// while a publisher publishes to it; A drains over a 4s spread; every
// session must get its reconnect frame, move to node B within spread + 2s,
// B must never accept more than 1.5 × n / spread sessions in any second,
// A's drain must end in time, and no subscriber may miss or repeat an
// acknowledged message. A and B run in process on one stream log, as two
// nodes on shared storage would.
func TestStorm_Drain(t *testing.T) {
	if testing.Short() {
		t.Skip("drain end-to-end: skipped with -short")
	}
	const spread, grace = 4 * time.Second, 5 * time.Second
	if err := raiseFDLimit(uint64(4*stormTestN) + fdSlack); err != nil {
		t.Skip(err)
	}
	db, err := storage.Open(filepath.Join(t.TempDir(), "streams.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	node := func() (*gateway.Server, *httptest.Server) {
		return serveGateway(t, gateway.Config{Log: db, Persist: []string{"storm:*"},
			DrainSpread: spread, DrainGrace: grace, AcceptRate: -1})
	}
	gwA, tsA := node()
	_, tsB := node()

	drained := make(chan error, 1)
	var drainStart time.Time
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	r, err := runStorm(ctx, stormConfig{
		n: stormTestN, mode: stormPlan, spread: spread, rate: 10, topic: "storm:e2e",
		urlA: gwtest.WSURL(tsA.URL), urlB: gwtest.WSURL(tsB.URL), metricsB: tsB.URL + "/metrics",
		dialConc: 100, dialHTTP: nil, scrape: &http.Client{Timeout: 5 * time.Second},
		stopA: func(context.Context) error {
			drainStart = time.Now()
			go func() { drained <- gwA.Drain(ctx) }()
			return nil
		},
		aDone: func(context.Context) (time.Duration, error) {
			err := <-drained
			return time.Since(drainStart), err
		},
		settle: spread + grace,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("connected %d, reconnect frames %d, reconnected %d (by spread+2s %d, last %.3fs), peak accepts/s %.0f (server %v, limit %.0f), resubscribe %s, acked %d, missing %d, duplicates %d, A %s after %v s",
		r.Connected, r.ReconnectFrames, r.Reconnected, r.ByDeadline, r.LastS, r.PeakAcceptsS, deref(r.PeakAcceptsSrv), r.PlanLimit,
		r.Resubscribe, r.Acked, r.Missing, r.Duplicates, r.AExit, deref(r.AExitS))
	n := stormTestN
	if r.ReconnectFrames != n {
		t.Errorf("%d sessions got a reconnect frame, want %d", r.ReconnectFrames, n)
	}
	if r.Reconnected != n || r.ByDeadline != n {
		t.Errorf("reconnected to B: %d, by spread+2s: %d; want %d (last at %.3fs)", r.Reconnected, r.ByDeadline, n, r.LastS)
	}
	limit := r.PlanLimit * stormPeakSlack
	if r.PeakAcceptsS > limit {
		t.Errorf("B accepted %.0f sessions in one second (client-side log), want at most %.0f (1.5·n/spread = %.0f, slack %.2f)", r.PeakAcceptsS, limit, r.PlanLimit, stormPeakSlack)
	}
	if r.PeakAcceptsSrv != nil && *r.PeakAcceptsSrv > limit {
		t.Errorf("B's accept counter rose %.0f in one second, want at most %.0f", *r.PeakAcceptsSrv, limit)
	}
	if r.AExit != "ok" || r.AExitS == nil || *r.AExitS > (spread+grace).Seconds() {
		t.Errorf("A's drain: %q after %v s, want nil within %v", r.AExit, r.AExitS, spread+grace)
	}
	if r.Acked == 0 || r.PublishErrors != 0 {
		t.Errorf("publisher: %d acked, %d errors (%s)", r.Acked, r.PublishErrors, r.FirstError)
	}
	if r.Missing != 0 || r.Duplicates != 0 {
		t.Errorf("subscribers missed %d acknowledged messages and got %d twice; want 0, 0", r.Missing, r.Duplicates)
	}
	if r.Expired != 0 {
		t.Errorf("%d cursors expired on a persisted topic", r.Expired)
	}
}

// Test_runStorm_SubscribeFailureIsAnError: a session that connected to A
// but whose subscribe was refused would measure nothing (it receives no
// message, so every acked one counts as missing), yet it was counted as
// connected and the wave went on. The run fails before A is stopped,
// with the subscribe's error.
func Test_runStorm_SubscribeFailureIsAnError(t *testing.T) {
	t.Parallel()
	_, ts := serveGateway(t, gateway.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := runStorm(ctx, stormConfig{
		n: 2, mode: stormPlan, spread: time.Second, rate: 10, topic: "bad topic", lead: 50 * time.Millisecond,
		urlA: gwtest.WSURL(ts.URL), urlB: gwtest.WSURL(ts.URL), dialConc: 2,
		scrape: &http.Client{Timeout: 5 * time.Second},
		stopA: func(context.Context) error {
			t.Error("A stopped: the run went on with sessions whose subscribe failed")
			return errors.New("not reached")
		},
		settle: time.Second,
	})
	if err == nil || !strings.Contains(err.Error(), "X_BAD_TOPIC") {
		t.Fatalf("err = %v, want the subscribe's refusal (X_BAD_TOPIC)", err)
	}
}
