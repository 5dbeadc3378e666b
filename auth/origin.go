package auth

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// OriginPolicy decides which browser origins may open a session: the
// check a WebSocket server must make because browsers let any page open a
// socket to any host (RFC 6455 §10.2). Syncgate authenticates with a token
// in hello, never with cookies, so a foreign page gains no ambient
// credentials; the policy still keeps foreign pages off a deployment, and
// off an anonymous (dev mode) gateway.
//
// Allow admits an Origin when any of these holds, and refuses it
// otherwise:
//
//   - The Origin header is absent (empty): not a browser.
//   - Its host (with port) equals the request's Host, case-insensitively.
//   - It matches a pattern.
//
// A pattern is one of:
//
//   - "host" or "host:port": that exact host (case-insensitive). Without a
//     port it matches only an Origin without one (the scheme's default).
//   - "*.domain" or "*.domain:port": any host that ends in ".domain" with
//     at least one more label in front (a.domain, a.b.domain), never domain
//     itself nor anything that merely ends in the same letters
//     (evildomain). domain must contain a dot ("*.com" is refused).
//   - Either of the above prefixed with "https://" or "http://" to admit
//     that scheme only; otherwise http and https both match.
//
// Nothing else is special: no "?", no character classes, no "*" elsewhere,
// no bare "*" (an open policy is not a pattern; the gateway would need an
// explicit insecure switch). "null" (sandboxed frames, file: pages) and
// any Origin that is not scheme://host[:port] with scheme http or https
// are refused.
type OriginPolicy struct {
	rules []originRule
}

type originRule struct {
	scheme string // "" for http or https
	host   string // lower-case; for a wildcard, the suffix after "*." with a leading '.'
	port   string // "" for the default port
	suffix bool
}

// NewOriginPolicy parses patterns (see [OriginPolicy]). No patterns means
// only same-host and non-browser clients are admitted.
func NewOriginPolicy(patterns []string) (*OriginPolicy, error) {
	p := &OriginPolicy{}
	for _, s := range patterns {
		r, err := parseOriginPattern(s)
		if err != nil {
			return nil, fmt.Errorf("auth: origin pattern %q: %w", s, err)
		}
		p.rules = append(p.rules, r)
	}
	return p, nil
}

func parseOriginPattern(s string) (originRule, error) {
	var r originRule
	rest := strings.ToLower(s)
	if rest == "null" {
		return r, fmt.Errorf("the null origin cannot be allowed")
	}
	if scheme, after, ok := strings.Cut(rest, "://"); ok {
		if scheme != "http" && scheme != "https" {
			return r, fmt.Errorf("scheme must be http or https")
		}
		r.scheme, rest = scheme, after
	}
	if after, ok := strings.CutPrefix(rest, "*."); ok {
		r.suffix, rest = true, after
	}
	host, port, err := splitHostPort(rest)
	if err != nil {
		return r, err
	}
	if !validHostname(host) {
		return r, fmt.Errorf("want a host name, host:port, or *.domain, without paths or other wildcards")
	}
	if r.suffix {
		if !strings.Contains(host, ".") {
			return r, fmt.Errorf("a wildcard needs a domain with a dot, e.g. *.example.com")
		}
		host = "." + host
	}
	r.host, r.port = host, port
	return r, nil
}

// Allow reports whether a request with the given Origin header and Host
// may open a session.
func (p *OriginPolicy) Allow(origin, requestHost string) bool {
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.Opaque != "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return false
	}
	if requestHost != "" && strings.EqualFold(u.Host, requestHost) {
		return true
	}
	host, port, err := splitHostPort(strings.ToLower(u.Host))
	if err != nil {
		return false
	}
	for _, r := range p.rules {
		if r.scheme != "" && r.scheme != u.Scheme || r.port != port {
			continue
		}
		if r.suffix {
			if len(host) > len(r.host) && strings.HasSuffix(host, r.host) {
				return true
			}
		} else if host == r.host {
			return true
		}
	}
	return false
}

// splitHostPort splits "host" or "host:port" (IPv6 in brackets); port is
// "" when absent and otherwise all digits.
func splitHostPort(s string) (host, port string, err error) {
	if !strings.Contains(s, ":") || strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		return s, "", nil
	}
	host, port, err = net.SplitHostPort(s)
	if err != nil {
		return "", "", err
	}
	if port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
		return "", "", fmt.Errorf("bad port")
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host, port, nil
}

// validHostname reports whether h is a DNS name (letters, digits, '-' and
// '.', no empty label) or an IPv6 literal in brackets.
func validHostname(h string) bool {
	if strings.HasPrefix(h, "[") {
		return strings.HasSuffix(h, "]") && net.ParseIP(h[1:len(h)-1]) != nil
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}
