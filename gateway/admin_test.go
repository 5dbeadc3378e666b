package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

const adminToken = "0123456789abcdef-test-token"

// httpDo sends a request (auth and contentType set when not empty, and
// any other headers given as name, value pairs) and returns status and
// body.
func httpDo(t *testing.T, method, url, auth, contentType, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestAdmin_OffWithoutToken(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	for _, p := range []string{"/v1/admin/drain", "/v1/admin/build"} {
		if code, _ := httpDo(t, "POST", srv.ts.URL+p, "Bearer "+adminToken, "", ""); code != http.StatusNotFound {
			t.Errorf("POST %s without an admin token configured: %d, want 404", p, code)
		}
	}
	if _, err := gateway.New(gateway.Config{AdminToken: "short"}); err == nil {
		t.Error("New accepted an admin token under 16 bytes")
	}
}

func TestAdmin_Auth(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{AdminToken: adminToken})
	url := srv.ts.URL + "/v1/admin/drain"
	for _, tc := range []struct{ name, auth, want string }{
		{"none", "", "missing Authorization"},
		{"basic", "Basic dXNlcjpwYXNz", "Bearer scheme"},
		{"wrong", "Bearer wrong-token-wrong-token", "wrong admin token"},
		{"prefix", "Bearer " + adminToken[:20], "wrong admin token"},
		{"longer", "Bearer " + adminToken + "x", "wrong admin token"},
	} {
		code, body := httpDo(t, "POST", url, tc.auth, "", "")
		if code != http.StatusUnauthorized || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want 401 with %q", tc.name, code, body, tc.want)
		}
	}
	select {
	case <-srv.gw.DrainRequested():
		t.Fatal("an unauthorised request started a drain")
	default:
	}
	if code := get(t, srv.ts.URL+"/readyz"); code != http.StatusOK {
		t.Fatalf("readyz after refused admin calls: %d", code)
	}
}

func TestAdmin_Drain(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{AdminToken: adminToken, DrainSpread: 100 * time.Millisecond, DrainGrace: 200 * time.Millisecond})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	if code, body := httpDo(t, "GET", srv.ts.URL+"/v1/admin/drain", "Bearer "+adminToken, "", ""); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET drain: %d %s", code, body)
	}
	if code, body := httpDo(t, "POST", srv.ts.URL+"/v1/admin/drain", "Bearer "+adminToken, "", "now"); code != http.StatusBadRequest {
		t.Fatalf("drain with a body: %d %s", code, body)
	}
	code, body := httpDo(t, "POST", srv.ts.URL+"/v1/admin/drain", "bearer "+adminToken, "", "")
	var ans struct {
		Draining bool  `json:"draining"`
		Sessions int   `json:"sessions"`
		SpreadMs int64 `json:"spreadMs"`
	}
	if code != http.StatusAccepted || json.Unmarshal([]byte(body), &ans) != nil || !ans.Draining || ans.Sessions != 1 || ans.SpreadMs != 100 {
		t.Fatalf("drain: %d %s", code, body)
	}
	select {
	case <-srv.gw.DrainRequested():
	case <-time.After(gwtest.Timeout):
		t.Fatal("DrainRequested not closed")
	}
	r := gwtest.Expect[*frames.Reconnect](c)
	if r.Reason != frames.ReasonDrain || r.AfterMs >= 100 || r.AfterMs < 0 {
		t.Fatalf("reconnect %+v", r)
	}
	c.ExpectClose(websocket.StatusServiceRestart)
	// Again: idempotent; and Drain joins the drain the API began.
	if code, body := httpDo(t, "POST", srv.ts.URL+"/v1/admin/drain", "Bearer "+adminToken, "", ""); code != http.StatusAccepted {
		t.Fatalf("second drain: %d %s", code, body)
	}
	if err := srv.gw.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestAdmin_Build(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{AdminToken: adminToken, BuildID: "b1"})
	url := srv.ts.URL + "/v1/admin/build"
	auth := "Bearer " + adminToken
	for _, tc := range []struct {
		name, ct, body string
		code           int
		want           string
	}{
		{"not json", "application/json", "b2", 400, "JSON object"},
		{"empty body", "", "", 400, "JSON object"},
		{"missing", "", `{}`, 400, "missing buildId"},
		{"null", "", `{"buildId":null}`, 400, "missing buildId"},
		{"number", "", `{"buildId":2}`, 400, "JSON object"},
		{"empty id", "", `{"buildId":""}`, 400, "must not be empty"},
		{"unknown field", "", `{"buildId":"b2","extra":1}`, 400, "unknown member"},
		{"two objects", "", `{"buildId":"b2"}{"buildId":"b3"}`, 400, "more after it"},
		{"a brace after it", "", `{"buildId":"b2"}}`, 400, "more after it"},
		{"a bracket after it", "", `{"buildId":"b2"}]`, 400, "more after it"},
		{"another case", "", `{"BUILDID":"b2"}`, 400, "unknown member"},
		{"null body", "", `null`, 400, "got null"},
		{"an array", "", `[{"buildId":"b2"}]`, 400, "JSON object"},
		{"too long id", "", `{"buildId":"` + strings.Repeat("x", 300) + `"}`, 400, "over the limit"},
		{"too large", "", `{"buildId":"` + strings.Repeat("x", 5000) + `"}`, 413, "body over"},
		{"wrong type", "text/plain", `{"buildId":"b2"}`, 415, "application/json"},
	} {
		code, body := httpDo(t, "POST", url, auth, tc.ct, tc.body)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d with %q", tc.name, code, body, tc.code, tc.want)
		}
	}
	if srv.gw.BuildID() != "b1" {
		t.Fatalf("a bad request changed the build id to %q", srv.gw.BuildID())
	}
	old := gwtest.Dial(t, srv.url, nil)
	old.Send(&frames.Hello{BuildID: "b1", Resume: []frames.Cursor{}})
	gwtest.Expect[*frames.Hello](old)
	code, body := httpDo(t, "POST", url, auth, "application/json; charset=utf-8", `{"buildId":"b2"}`)
	if code != http.StatusOK || !strings.Contains(body, `"notified":1`) {
		t.Fatalf("set build: %d %s", code, body)
	}
	if u := gwtest.Expect[*frames.UpdateAvailable](old); u.BuildID != "b2" {
		t.Fatalf("update-available %+v", u)
	}
	if srv.gw.BuildID() != "b2" {
		t.Fatalf("build id %q", srv.gw.BuildID())
	}
}

// TestAdmin_DrainRefusesAnyBody: POST /v1/admin/drain takes no body, also
// one of unknown length (chunked), which the check of Content-Length
// alone let through: such a request drained the node. A chunked request
// with an empty body is no body.
func TestAdmin_DrainRefusesAnyBody(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{AdminToken: adminToken})
	post := func(body string) (int, string) {
		t.Helper()
		pr, pw := io.Pipe()
		go func() {
			_, _ = io.WriteString(pw, body)
			_ = pw.Close()
		}()
		req, err := http.NewRequest("POST", srv.ts.URL+"/v1/admin/drain", pr) // no length: chunked
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post("now"); code != http.StatusBadRequest || !strings.Contains(body, "takes no body") {
		t.Errorf("drain with a chunked body: %d %s, want 400", code, body)
	}
	select {
	case <-srv.gw.DrainRequested():
		t.Fatal("a drain request with a body started a drain")
	default:
	}
	if code := get(t, srv.ts.URL+"/readyz"); code != http.StatusOK {
		t.Fatalf("readyz after a refused drain: %d", code)
	}
	if code, body := post(""); code != http.StatusAccepted {
		t.Fatalf("drain with an empty chunked body: %d %s, want 202", code, body)
	}
}

// TestAdmin_TokenWithSpaceRefusedAtNew: the token a client presents is
// trimmed, so an admin token that starts or ends with whitespace (a
// newline read from a file or a secret) could never match: New refuses
// it, as syncgate serve's flag does, instead of serving an admin API that
// answers every call 401.
func TestAdmin_TokenWithSpaceRefusedAtNew(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{adminToken + "\n", " " + adminToken, adminToken + "\t"} {
		gw, err := gateway.New(gateway.Config{AdminToken: tok})
		if err == nil {
			_ = gw.Shutdown(t.Context())
			t.Errorf("New accepted the admin token %q", tok)
		} else if !strings.Contains(err.Error(), "whitespace") {
			t.Errorf("admin token %q: %v; want an error that names the whitespace", tok, err)
		}
	}
}

// TestAdmin_BarePathAnswersJSON: /v1/admin itself is an unknown admin
// path like any other: 401 without the token, a JSON 404 naming the
// endpoints with it. net/http's mux answered it with a redirect to
// /v1/admin/ (no error, no auth check), against the API's rule that
// every bad request gets a JSON error with a 4xx.
func TestAdmin_BarePathAnswersJSON(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{AdminToken: adminToken})
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(auth string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequest("POST", srv.ts.URL+"/v1/admin", nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	if code, ct, body := do(""); code != http.StatusUnauthorized || ct != "application/json" {
		t.Errorf("POST /v1/admin without the token: %d %s %s, want a JSON 401", code, ct, body)
	}
	if code, ct, body := do("Bearer " + adminToken); code != http.StatusNotFound || ct != "application/json" ||
		!strings.Contains(body, "POST /v1/admin/drain") {
		t.Errorf("POST /v1/admin: %d %s %s, want a JSON 404 naming the endpoints", code, ct, body)
	}
}

// TestAdmin_BuildRefusesARepeatedMember: the body must hold exactly one
// member, buildId. encoding/json keeps the last of two members of one
// name, so {"buildId":"b2","buildId":"b3"} set b3 with 200, an input
// whose meaning is ambiguous (RFC 8259 §4) taken silently.
func TestAdmin_BuildRefusesARepeatedMember(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{AdminToken: adminToken, BuildID: "b1"})
	code, body := httpDo(t, "POST", srv.ts.URL+"/v1/admin/build", "Bearer "+adminToken, "application/json",
		`{"buildId":"b2","buildId":"b3"}`)
	if code != http.StatusBadRequest || !strings.Contains(body, "more than once") {
		t.Errorf("buildId given twice: %d %s, want 400 saying so", code, body)
	}
	if id := srv.gw.BuildID(); id != "b1" {
		t.Errorf("a refused request set the build id to %q", id)
	}
}
