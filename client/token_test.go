package client_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
)

// A token refresh (the server's X_TOKEN_EXPIRED notice) runs TokenFunc on
// a goroutine of its own. Close must end it with the connection (its ctx
// is cancelled) and wait for it: Close returns once the Client's
// goroutines have exited, so no TokenFunc runs after Close returned,
// with or without Reconnect.
func TestClient_Close_EndsTokenRefresh(t *testing.T) {
	for _, reconnect := range []bool{false, true} {
		name := "single"
		if reconnect {
			name = "reconnect"
		}
		t.Run(name, func(t *testing.T) {
			s := newScripted(t)
			ctx := testCtx(t)
			var calls atomic.Int32
			var returned atomic.Bool
			refreshing := make(chan struct{})
			release := make(chan struct{})
			defer close(release)
			c, err := client.Dial(ctx, s.url(), &client.Options{
				Reconnect:    reconnect,
				WriteTimeout: time.Minute, // bounds TokenFunc's ctx
				TokenFunc: func(ctx context.Context) (string, error) {
					if calls.Add(1) == 1 {
						return "t1", nil // the hello's
					}
					close(refreshing)
					select {
					case <-release:
					case <-ctx.Done():
					}
					returned.Store(true)
					return "t2", nil
				},
			})
			noErr(t, err)
			sc := s.next(t)
			sc.send(t, &frames.Ack{Ref: "", Error: &frames.ErrorBody{Code: frames.CodeTokenExpired, Cause: "token: expired", Fix: "send a new hello"}})
			recv(t, ctx, refreshing)

			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			select {
			case <-closed:
				if !returned.Load() {
					t.Fatal("Close returned while the refresh's TokenFunc still ran")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close still waiting for the refresh's TokenFunc after 5s: its ctx was not cancelled")
			}
		})
	}
}
