package gateway_test

import (
	"strings"
	"testing"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// helloAs sends a hello naming build and returns the answer.
func helloAs(c *gwtest.Conn, build string) *frames.Hello {
	c.Send(&frames.Hello{BuildID: build, Resume: []frames.Cursor{}})
	return gwtest.Expect[*frames.Hello](c)
}

// expectNoUpdate checks that the next frame is the answer to a probe
// subscribe, not an update-available.
func expectNoUpdate(t *testing.T, c *gwtest.Conn, sid string) {
	t.Helper()
	c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: sid, Target: frames.Target{Kind: frames.TargetTopic, Topic: "probe"}})
	if f := c.Next(); f.FrameType() != frames.TypeAck {
		t.Fatalf("want the probe's ack, got %T %+v", f, f)
	}
	gwtest.Expect[*frames.Snapshot](c)
}

// TestUpdateAvailable_OnHello: a client on another build is told right
// after the hello answer; one on the same build, or naming none, is not.
func TestUpdateAvailable_OnHello(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{BuildID: "web-2"})
	old := gwtest.Dial(t, srv.url, nil)
	if h := helloAs(old, "web-1"); h.BuildID != "web-2" {
		t.Fatalf("hello %+v", h)
	}
	if u := gwtest.Expect[*frames.UpdateAvailable](old); u.BuildID != "web-2" {
		t.Fatalf("update-available %+v", u)
	}
	same := gwtest.Dial(t, srv.url, nil)
	helloAs(same, "web-2")
	expectNoUpdate(t, same, "p")
	none := gwtest.Dial(t, srv.url, nil)
	helloAs(none, "")
	expectNoUpdate(t, none, "p")

	// A server without a build id tells nobody.
	bare := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, bare.url, nil)
	helloAs(c, "web-1")
	expectNoUpdate(t, c, "p")
}

// TestUpdateAvailable_OnSetBuildID: a new build id set at runtime is pushed
// to every session on another build, not to those already on it, nor to
// those that named none; later hellos carry it.
func TestUpdateAvailable_OnSetBuildID(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{BuildID: "web-1"})
	olds := make([]*gwtest.Conn, 5)
	for i := range olds {
		olds[i] = gwtest.Dial(t, srv.url, nil)
		helloAs(olds[i], "web-1")
	}
	ahead := gwtest.Dial(t, srv.url, nil)
	helloAs(ahead, "web-2")
	gwtest.Expect[*frames.UpdateAvailable](ahead) // web-2 ≠ web-1: told web-1 is current
	none := gwtest.Dial(t, srv.url, nil)
	helloAs(none, "")

	if err := srv.gw.SetBuildID("web-2"); err != nil {
		t.Fatal(err)
	}
	for i, c := range olds {
		if u := gwtest.Expect[*frames.UpdateAvailable](c); u.BuildID != "web-2" {
			t.Fatalf("session %d: %+v", i, u)
		}
	}
	expectNoUpdate(t, ahead, "p")
	expectNoUpdate(t, none, "p")
	if err := srv.gw.SetBuildID("web-2"); err != nil { // the same id again: nothing sent
		t.Fatalf("SetBuildID of the current id: %v", err)
	}
	expectNoUpdate(t, olds[0], "p")
	// One longer than a hello may carry is refused, and nothing is sent.
	if err := srv.gw.SetBuildID(strings.Repeat("x", 257)); err == nil {
		t.Fatal("SetBuildID of 257 bytes accepted")
	}
	expectNoUpdate(t, olds[0], "p2")
	if got := srv.gw.BuildID(); got != "web-2" {
		t.Fatalf("BuildID after a refused SetBuildID: %q", got)
	}

	fresh := gwtest.Dial(t, srv.url, nil)
	if h := helloAs(fresh, "web-2"); h.BuildID != "web-2" {
		t.Fatalf("hello after SetBuildID: %+v", h)
	}
	expectNoUpdate(t, fresh, "p")
}
