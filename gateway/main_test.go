package gateway_test

import (
	"context"
	"net/http/httptest"
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
}

func newTestServer(t testing.TB, cfg gateway.Config) *testServer {
	t.Helper()
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		ts.Close()
	})
	return &testServer{gw: gw, ts: ts, url: gwtest.WSURL(ts.URL)}
}
