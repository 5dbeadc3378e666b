package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/frames"
)

const testJWTSecret = "0123456789abcdef0123456789abcdef-cmd-test"

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key,
// and returns their paths and a pool trusting it.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "syncgate test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestRun_TLSAndTokens serves wss with a self-signed certificate and an
// HS256 secret: a session with a valid token gets its actorId, one without
// gets X_TOKEN_REQUIRED; the secret and the token never reach the log.
func TestRun_TLSAndTokens(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lineWriter{lines: make(chan string, 16)}
	logs := &lineWriter{lines: make(chan string, 1024)}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-data-dir", t.TempDir(), "-tls-cert", certFile, "-tls-key", keyFile,
			"-drain-spread", "0s", "-log-level", "debug", "-jwt-leeway", "0s", "-max-token", "512"},
			env(map[string]string{"SYNCGATE_JWT_SECRET": testJWTSecret}), out, logs)
	}()
	addr := awaitListening(t, out, done)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := hc.Get("https://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest { // Go's TLS server refuses plain HTTP with 400
			t.Errorf("plain http on the TLS listener: %d", resp.StatusCode)
		}
	}
	sign := func(c auth.Claims) string {
		t.Helper()
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(testJWTSecret))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	token := sign(auth.Claims{RegisteredClaims: jwt.RegisteredClaims{
		Subject: "u1", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	hello := func(tok string) frames.Frame {
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		c, _, err := websocket.Dial(dctx, "wss://"+addr+"/v1/ws", &websocket.DialOptions{HTTPClient: hc})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		b, _ := frames.Encode(&frames.Hello{Resume: []frames.Cursor{}, Token: tok})
		if err := c.Write(dctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
		_, msg, err := c.Read(dctx)
		if err != nil {
			t.Fatal(err)
		}
		f, err := frames.Decode(bytes.TrimSpace(msg))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if h, ok := hello(token).(*frames.Hello); !ok || h.ActorID == nil || *h.ActorID != "u1" {
		t.Fatalf("valid token: %+v", h)
	}
	if a, ok := hello("").(*frames.Ack); !ok || a.Error == nil || a.Error.Code != frames.CodeTokenRequired {
		t.Fatalf("no token: %+v", a)
	}
	if a, ok := hello(token + "x").(*frames.Ack); !ok || a.Error == nil || a.Error.Code != frames.CodeTokenRejected && a.Error.Code != frames.CodeBadToken {
		t.Fatalf("bad token: %+v", a)
	}
	// -max-token 512: a well-signed token over it is refused unparsed.
	big := sign(auth.Claims{RegisteredClaims: jwt.RegisteredClaims{Subject: strings.Repeat("u", 400),
		ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if a, ok := hello(big).(*frames.Ack); !ok || a.Error == nil || a.Error.Code != frames.CodeBadToken {
		t.Fatalf("%d-byte token: %+v", len(big), a)
	}
	// -jwt-leeway 0s: expired 3 s ago is expired (the default 10 s
	// leeway would take it).
	stale := sign(auth.Claims{RegisteredClaims: jwt.RegisteredClaims{Subject: "u1",
		ExpiresAt: jwt.NewNumericDate(time.Now().Add(-3 * time.Second))}})
	if a, ok := hello(stale).(*frames.Ack); !ok || a.Error == nil || a.Error.Code != frames.CodeTokenExpired {
		t.Fatalf("token expired 3s ago: %+v", a)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	logs.mu.Lock()
	text, dropped := logs.buf.String(), logs.dropped
	logs.mu.Unlock()
	if dropped > 0 {
		t.Fatalf("%d log lines were dropped: the secret check below would not see them", dropped)
	}
	for len(logs.lines) > 0 {
		text += <-logs.lines
	}
	if !strings.Contains(text, "tokens required") {
		t.Errorf("no start line about tokens in:\n%s", text)
	}
	if strings.Contains(text, testJWTSecret) || strings.Contains(text, token[strings.LastIndexByte(token, '.')+1:]) {
		t.Errorf("secret or token in the log:\n%s", text)
	}
}

func TestParseConfig_AnonymousNeedsLoopbackOrInsecure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		ok   bool
	}{
		{[]string{"-addr", "127.0.0.1:8080"}, nil, true},
		{[]string{"-addr", "localhost:8080"}, nil, true},
		{[]string{"-addr", "[::1]:8080"}, nil, true},
		{[]string{"-addr", "0.0.0.0:8080"}, nil, false},
		{[]string{"-addr", ":8080"}, nil, false},
		{[]string{"-addr", "0.0.0.0:8080", "-insecure"}, nil, true},
		{[]string{"-addr", "0.0.0.0:8080"}, map[string]string{"SYNCGATE_INSECURE": "true"}, true},
		{[]string{"-addr", "0.0.0.0:8080"}, map[string]string{"SYNCGATE_JWT_SECRET": testJWTSecret}, true},
		{[]string{"-addr", "0.0.0.0:8080"}, map[string]string{"SYNCGATE_JWT_KEYS": "/etc/keys.pem"}, true},
		{[]string{"-tls-cert", "c.pem"}, nil, false},
		{[]string{"-allowed-origins", "*"}, nil, false},
		{[]string{"-allowed-origins", "null"}, nil, false},
		{[]string{"-allowed-origins", "app.example.com,*.example.org"}, nil, true},
		{nil, map[string]string{"SYNCGATE_JWT_SECRET": "short"}, false},
	} {
		_, err := parseConfig(tc.args, env(tc.env), io.Discard)
		if (err == nil) != tc.ok {
			t.Errorf("%v %v: err %v, want ok=%v", tc.args, tc.env, err, tc.ok)
		}
	}
}

func TestConfig_SecretRedacted(t *testing.T) {
	t.Parallel()
	c, err := parseConfig(nil, env(map[string]string{"SYNCGATE_JWT_SECRET": testJWTSecret}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "cfg", c, "secret", c.JWTSecret)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("config", "cfg", *c, "secret", c.JWTSecret)
	for _, s := range []string{fmt.Sprintf("%v %+v %#v %s %q", c, *c, *c, c.JWTSecret, c.JWTSecret), buf.String()} {
		if strings.Contains(s, testJWTSecret) {
			t.Fatalf("secret printed: %s", s)
		}
	}
}

// TestRun_BadTLSFileIsAStartError: a certificate that cannot be loaded
// stops the start with an error naming the settings, before anything
// listens (it used to fail after "listening" was printed).
func TestRun_BadTLSFileIsAStartError(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	missing := filepath.Join(t.TempDir(), "nope.pem")
	err := run(t.Context(), []string{"-addr", "127.0.0.1:0", "-data-dir", t.TempDir(), "-tls-cert", missing, "-tls-key", missing},
		env(nil), &out, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "tls-cert (SYNCGATE_TLS_CERT)") {
		t.Fatalf("run = %v, want an error naming tls-cert", err)
	}
	if strings.Contains(out.String(), "listening") {
		t.Fatalf("printed %q before failing", out.String())
	}
}

// TestRun_EmptyJWTKeysFileIsAStartError: a jwt-keys file that is empty
// (a secret mounted before it was written) stops the start with an error
// naming jwt-keys: alone it was reported as "no secret and no keys
// configured", and beside a jwt-secret it was ignored, the node starting
// with HS256 only and refusing every RS256/ES256 token.
func TestRun_EmptyJWTKeysFileIsAStartError(t *testing.T) {
	t.Parallel()
	keys := filepath.Join(t.TempDir(), "keys.pem")
	if err := os.WriteFile(keys, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, e := range []map[string]string{
		{"SYNCGATE_JWT_KEYS": keys},
		{"SYNCGATE_JWT_KEYS": keys, "SYNCGATE_JWT_SECRET": testJWTSecret},
	} {
		ctx, cancel := context.WithCancel(t.Context())
		out := &lineWriter{lines: make(chan string, 16)}
		done := make(chan error, 1)
		go func() {
			done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-data-dir", t.TempDir(), "-drain-spread", "0s"}, env(e), out, io.Discard)
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "jwt-keys (SYNCGATE_JWT_KEYS)") || !strings.Contains(err.Error(), "empty") {
				t.Errorf("%v: run = %v, want an error naming jwt-keys and saying the file is empty", e, err)
			}
		case line := <-out.lines:
			cancel()
			<-done
			t.Errorf("%v: started (%q), want a start error", e, strings.TrimSpace(line))
		case <-time.After(10 * time.Second):
			t.Fatalf("%v: neither an error nor a start within 10s", e)
		}
		cancel()
	}
}
