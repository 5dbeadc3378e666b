package gateway_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testServer is a gateway on a loopback httptest server.
type testServer struct {
	gw  *gateway.Server
	ts  *httptest.Server
	url string // ws://…/v1/ws

	once sync.Once
}

func newTestServer(t testing.TB, cfg gateway.Config) *testServer {
	t.Helper()
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return newTestServerFor(t, gw)
}

// newTestServerFor serves gw until the test ends or close is called.
func newTestServerFor(t testing.TB, gw *gateway.Server) *testServer {
	ts := httptest.NewServer(gw.Handler())
	srv := &testServer{gw: gw, ts: ts, url: gwtest.WSURL(ts.URL)}
	t.Cleanup(func() { srv.close(t) })
	return srv
}

// close shuts the gateway down, then the HTTP server. Idempotent.
func (srv *testServer) close(t testing.TB) {
	srv.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := srv.gw.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		srv.ts.Close()
	})
}
