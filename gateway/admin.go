package gateway

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
)

// maxAdminBody bounds an admin request body.
const maxAdminBody = 4096

// addAdminRoutes serves the admin API. It exists only when
// Config.AdminToken is set; otherwise its paths are 404 like any unknown
// path. Every route requires `Authorization: Bearer <AdminToken>`.
//
//	POST /v1/admin/drain   begin a drain (Server.Drain); 202
//	POST /v1/admin/build   body {"buildId": "…"}: Server.SetBuildID; 200
//
// Answers are JSON: the result, or {"error": "…"} with a 4xx status.
func (s *Server) addAdminRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/admin/drain", s.adminOnly(s.serveAdminDrain))
	mux.HandleFunc("POST /v1/admin/build", s.adminOnly(s.serveAdminBuild))
	other := s.adminOnly(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/admin/drain" || r.URL.Path == "/v1/admin/build" {
			w.Header().Set("Allow", http.MethodPost)
			adminError(w, http.StatusMethodNotAllowed, r.URL.Path+" takes POST, not "+r.Method)
			return
		}
		adminError(w, http.StatusNotFound, "no admin endpoint "+r.URL.Path+"; there are POST /v1/admin/drain and POST /v1/admin/build")
	})
	mux.HandleFunc("/v1/admin/", other)
	// Without it the mux redirects /v1/admin to /v1/admin/: no JSON, no
	// auth check.
	mux.HandleFunc("/v1/admin", other)
}

// adminOnly wraps h with the bearer-token check.
func (s *Server) adminOnly(h http.HandlerFunc) http.HandlerFunc {
	// Compare fixed-size digests in constant time: neither the token nor
	// its length leaks through timing.
	want := sha256.Sum256([]byte(s.cfg.AdminToken))
	return func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		const scheme = "Bearer "
		if auth == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="syncgate admin"`)
			adminError(w, http.StatusUnauthorized, "missing Authorization header; send Authorization: Bearer <admin token>")
			return
		}
		if len(auth) < len(scheme) || !strings.EqualFold(auth[:len(scheme)], scheme) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="syncgate admin"`)
			adminError(w, http.StatusUnauthorized, "Authorization must use the Bearer scheme: Authorization: Bearer <admin token>")
			return
		}
		got := sha256.Sum256([]byte(strings.TrimSpace(auth[len(scheme):])))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="syncgate admin", error="invalid_token"`)
			adminError(w, http.StatusUnauthorized, "wrong admin token")
			return
		}
		h(w, r)
	}
}

// drainAnswer is the body of a successful POST /v1/admin/drain.
type drainAnswer struct {
	Draining bool  `json:"draining"`
	Sessions int   `json:"sessions"` // connected when the drain began
	SpreadMs int64 `json:"spreadMs"`
	GraceMs  int64 `json:"graceMs"`
}

func (s *Server) serveAdminDrain(w http.ResponseWriter, r *http.Request) {
	// Content-Length alone does not tell: a chunked body has none (-1).
	// Look for a first byte (boundBody bounds the wait for it).
	if r.ContentLength != 0 {
		n, err := io.ReadFull(r.Body, make([]byte, 1))
		if n > 0 {
			adminError(w, http.StatusBadRequest, "POST /v1/admin/drain takes no body")
			return
		}
		if err != nil && !errors.Is(err, io.EOF) {
			adminError(w, http.StatusBadRequest, "reading the body: "+err.Error())
			return
		}
	}
	d := s.startDrain()
	s.reqOnce.Do(func() { close(s.drainReq) })
	s.log.Info("drain requested over the admin API", logKeyRemote, r.RemoteAddr)
	adminJSON(w, http.StatusAccepted, drainAnswer{
		Draining: true,
		Sessions: d.n,
		SpreadMs: max(s.cfg.DrainSpread, 0).Milliseconds(),
		GraceMs:  s.cfg.DrainGrace.Milliseconds(),
	})
}

// buildRequest is the body of POST /v1/admin/build.
type buildRequest struct {
	BuildID *string `json:"buildId"`
}

// decodeBuildRequest reads body as exactly one JSON object whose only
// member is "buildId" (spelled so: encoding/json alone would take any
// case) holding a string, with nothing after it.
func decodeBuildRequest(body []byte) (buildRequest, error) {
	const want = `body must be one JSON object {"buildId": "<non-empty string>"}`
	var members map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&members); err != nil {
		return buildRequest{}, fmt.Errorf("%s: %w", want, err)
	}
	if members == nil {
		return buildRequest{}, errors.New(want + ", got null")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return buildRequest{}, errors.New(want + ", found more after it")
	}
	if k, ok := repeatedMember(body); ok {
		return buildRequest{}, fmt.Errorf("%s: member %s given more than once", want, quote(k))
	}
	var req buildRequest
	for k, v := range members {
		if k != "buildId" {
			return buildRequest{}, fmt.Errorf("%s: unknown member %s", want, quote(k))
		}
		if err := json.Unmarshal(v, &req.BuildID); err != nil { // null leaves it nil
			return buildRequest{}, fmt.Errorf("%s: buildId: %w", want, err)
		}
	}
	if req.BuildID == nil {
		return buildRequest{}, errors.New(`missing buildId: send {"buildId": "<non-empty string>"}`)
	}
	return req, nil
}

// repeatedMember reports a member name that body, one JSON object that
// decoded without error, holds more than once: encoding/json would keep
// the last silently.
func repeatedMember(body []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil { // the object's '{'
		return "", false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		k, _ := tok.(string)
		if seen[k] {
			return k, true
		}
		seen[k] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return "", false
		}
	}
	return "", false
}

// buildAnswer is the body of a successful POST /v1/admin/build.
type buildAnswer struct {
	BuildID  string `json:"buildId"`
	Notified int    `json:"notified"` // sessions sent update-available
}

func (s *Server) serveAdminBuild(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			adminError(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json, got "+quote(ct))
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			adminError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", maxAdminBody))
			return
		}
		adminError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	req, err := decodeBuildRequest(body)
	if err != nil {
		adminError(w, http.StatusBadRequest, err.Error())
		return
	}
	switch {
	case *req.BuildID == "":
		adminError(w, http.StatusBadRequest, "buildId must not be empty")
		return
	case len(*req.BuildID) > maxBuildIDLen:
		adminError(w, http.StatusBadRequest, fmt.Sprintf("buildId: %d bytes, over the limit of %d", len(*req.BuildID), maxBuildIDLen))
		return
	}
	n := s.setBuildID(*req.BuildID)
	adminJSON(w, http.StatusOK, buildAnswer{BuildID: *req.BuildID, Notified: n})
}

func adminJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func adminError(w http.ResponseWriter, code int, msg string) {
	adminJSON(w, code, struct {
		Error string `json:"error"`
	}{msg})
}
