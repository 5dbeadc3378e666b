package auth

import "testing"

// TestOriginPolicy_Allow is the origin table (same host,
// allowlisted, evil.example, null, lookalike suffix, missing Origin) and
// the pattern edges around it.
func TestOriginPolicy_Allow(t *testing.T) {
	t.Parallel()
	p, err := NewOriginPolicy([]string{"app.example.com", "*.partner.example", "https://secure.example", "localhost:5173"})
	if err != nil {
		t.Fatal(err)
	}
	const host = "rt.example.com"
	for _, tc := range []struct {
		name, origin string
		want         bool
	}{
		{"missing Origin", "", true},
		{"same host", "https://rt.example.com", true},
		{"same host, other case", "https://RT.Example.com", true},
		{"same host name, other port", "https://rt.example.com:8443", false},
		{"allowlisted", "https://app.example.com", true},
		{"allowlisted over http", "http://app.example.com", true},
		{"allowlisted, upper case", "https://APP.EXAMPLE.COM", true},
		{"allowlisted with a port the pattern lacks", "https://app.example.com:444", false},
		{"allowlisted host:port", "http://localhost:5173", true},
		{"host:port pattern, no port", "http://localhost", false},
		{"wildcard subdomain", "https://a.partner.example", true},
		{"wildcard deeper subdomain", "https://a.b.partner.example", true},
		{"wildcard does not cover the domain itself", "https://partner.example", false},
		{"scheme-pinned, right scheme", "https://secure.example", true},
		{"scheme-pinned, wrong scheme", "http://secure.example", false},
		{"evil.example", "https://evil.example", false},
		{"null", "null", false},
		{"lookalike suffix", "https://app.example.com.evil.example", false},
		{"lookalike prefix", "https://evilapp.example.com", false},
		{"lookalike wildcard suffix", "https://evilpartner.example", false},
		{"lookalike wildcard, extra label after", "https://a.partner.example.evil", false},
		{"subdomain of an exact host", "https://x.app.example.com", false},
		{"request host as a substring", "https://rt.example.com.evil.example", false},
		{"path", "https://app.example.com/", false},
		{"userinfo", "https://app.example.com@evil.example", false},
		{"userinfo lookalike", "https://evil.example@app.example.com", false},
		{"other scheme", "file://app.example.com", false},
		{"chrome extension", "chrome-extension://abcdef", false},
		{"not a URL", "app.example.com", false},
		{"query", "https://app.example.com?x", false},
		{"trailing dot", "https://app.example.com.", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := p.Allow(tc.origin, host); got != tc.want {
				t.Fatalf("Allow(%q, %q) = %v, want %v", tc.origin, host, got, tc.want)
			}
		})
	}
	if p.Allow("null", "") {
		t.Error("null allowed when the request has no Host")
	}
	empty, err := NewOriginPolicy(nil)
	if err != nil {
		t.Fatal(err)
	}
	if empty.Allow("https://app.example.com", host) || !empty.Allow("https://rt.example.com", host) || !empty.Allow("", host) {
		t.Error("the empty policy must admit same host and non-browsers only")
	}
}

func TestNewOriginPolicy_invalid(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "*", "*.com", "*example.com", "app.*.com", "app.example.com/", "a?.example.com",
		"[a-z].example.com", "ftp://app.example.com", "app.example.com:port", "app.example.com:", "app..example.com",
		"https://", "*.", "app example.com", "null"} {
		if _, err := NewOriginPolicy([]string{s}); err == nil {
			t.Errorf("NewOriginPolicy(%q) accepted it", s)
		}
	}
	for _, s := range []string{"localhost", "[::1]:8080", "HTTPS://App.Example.com", "*.example.co.uk:8443", "127.0.0.1:3000"} {
		if _, err := NewOriginPolicy([]string{s}); err != nil {
			t.Errorf("NewOriginPolicy(%q): %v", s, err)
		}
	}
}
