package gateway_test

import (
	"strings"
	"testing"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// A topic name outside the allowed bytes is refused naming the character
// the client sent, also when it takes several bytes in UTF-8: "café" is
// refused for 'é' at byte 3, not for 'Ã' (its first byte read as a rune).
func TestGateway_BadTopicNamesTheCharacter(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	for _, tc := range []struct{ topic, want string }{
		{"room 1", `' ' at byte 4`},
		{"café", `'é' at byte 3`},
		{"a→b", `'→' at byte 1`},
	} {
		c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: tc.topic}})
		ack := gwtest.Expect[*frames.Ack](c)
		if ack.Error == nil || ack.Error.Code != frames.CodeBadTopic || !strings.Contains(ack.Error.Cause, tc.want) {
			t.Errorf("subscribe to %q: %+v, want X_BAD_TOPIC naming %s", tc.topic, ack.Error, tc.want)
		}
	}
}
