package auth

import (
	"fmt"
	"strings"
)

// Action is what a client asks to do with a topic.
type Action uint8

// Actions a token can grant.
const (
	Subscribe Action = iota // subscribe add of a topic target
	Publish                 // mutate "publish" to a topic
	Presence                // presence join/leave/update of a topic
	Manage                  // create, close (or set the TTL of) and delete the topic's stream over HTTP
	numActions
)

func (a Action) String() string {
	switch a {
	case Subscribe:
		return "subscribe"
	case Publish:
		return "publish"
	case Presence:
		return "presence"
	case Manage:
		return "manage"
	}
	return fmt.Sprintf("Action(%d)", a)
}

// maxTopicLen is the gateway's topic length limit (gateway/topic.go).
const maxTopicLen = 255

// Pattern is a parsed topic pattern (see the package doc for the syntax).
// The zero Pattern matches nothing.
type Pattern struct {
	s string
}

// ParsePattern parses a topic pattern. The error names the problem, not
// the pattern.
func ParsePattern(s string) (Pattern, error) {
	if s == "" {
		return Pattern{}, fmt.Errorf("%w: empty pattern", ErrBadClaims)
	}
	if len(s) > maxTopicLen {
		return Pattern{}, fmt.Errorf("%w: pattern of %d bytes, over the limit of %d", ErrBadClaims, len(s), maxTopicLen)
	}
	start := 0 // first byte of the current segment
	for i := 0; i <= len(s); i++ {
		if i < len(s) && !isSep(s[i]) {
			if s[i] != '*' && !isTopicByte(s[i]) {
				return Pattern{}, fmt.Errorf("%w: pattern has a byte outside A-Z a-z 0-9 _ . : @ / - * at %d", ErrBadClaims, i)
			}
			continue
		}
		seg := s[start:i]
		if strings.IndexByte(seg, '*') >= 0 {
			switch {
			case seg == "*":
			case seg == "**" && i == len(s):
			case seg == "**":
				return Pattern{}, fmt.Errorf("%w: \"**\" only as the last segment of a pattern (at %d)", ErrBadClaims, start)
			default:
				return Pattern{}, fmt.Errorf("%w: '*' must be a whole segment (at %d)", ErrBadClaims, start)
			}
		}
		start = i + 1
	}
	return Pattern{s: s}, nil
}

// String returns the pattern as written.
func (p Pattern) String() string { return p.s }

// Match reports whether topic matches p. A topic that is not a valid
// topic name (1-255 bytes of A-Z a-z 0-9 _ . : @ / -) matches nothing.
func (p Pattern) Match(topic string) bool {
	return p.s != "" && validTopic(topic) && match(p.s, topic)
}

// match matches a valid pattern p against a valid topic t, segment by
// segment, without backtracking: each wildcard consumes exactly one
// segment, or (a final "**") the rest.
func match(p, t string) bool {
	for {
		if p == "**" {
			return t != ""
		}
		i := indexSep(p)
		if p[:i] == "*" {
			j := indexSep(t)
			if j == 0 {
				return false // "*" needs a non-empty segment
			}
			if i == len(p) {
				return j == len(t)
			}
			if j == len(t) || t[j] != p[i] {
				return false
			}
			p, t = p[i+1:], t[j+1:]
			continue
		}
		if i == len(p) {
			return t == p
		}
		// A literal segment and its separator.
		if !strings.HasPrefix(t, p[:i+1]) {
			return false
		}
		p, t = p[i+1:], t[i+1:]
	}
}

// indexSep returns the index of the first separator in s, or len(s).
func indexSep(s string) int {
	for i := 0; i < len(s); i++ {
		if isSep(s[i]) {
			return i
		}
	}
	return len(s)
}

func isSep(c byte) bool { return c == ':' || c == '/' }

func isTopicByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '_', c == '.', c == ':', c == '@', c == '/', c == '-':
		return true
	}
	return false
}

// validTopic mirrors the gateway's topic rule, so that Allow is safe to
// call on unvalidated input.
func validTopic(t string) bool {
	if t == "" || len(t) > maxTopicLen {
		return false
	}
	for i := 0; i < len(t); i++ {
		if !isTopicByte(t[i]) {
			return false
		}
	}
	return true
}

// Grants are the topic patterns a session may use, per action. The zero
// Grants allow nothing. Grants are immutable and safe for concurrent use.
type Grants struct {
	patterns [numActions][]Pattern
	all      bool
}

// AllowAll returns Grants that allow every valid topic for every action:
// what an anonymous session gets when the gateway runs without keys.
func AllowAll() Grants { return Grants{all: true} }

// Grants parses the patterns of t. A bad pattern fails the whole set
// (ErrBadClaims, naming the action and index).
func (t TopicClaims) Grants() (Grants, error) {
	var g Grants
	for a, list := range [numActions][]string{Subscribe: t.Subscribe, Publish: t.Publish, Presence: t.Presence, Manage: t.Manage} {
		for i, s := range list {
			p, err := ParsePattern(s)
			if err != nil {
				return Grants{}, fmt.Errorf("topics.%s[%d]: %w", Action(a), i, err)
			}
			g.patterns[a] = append(g.patterns[a], p)
		}
	}
	return g, nil
}

// Allow reports whether the grants let a session do action on topic. An
// invalid topic name or an unknown action is never allowed.
func (g Grants) Allow(action Action, topic string) bool {
	if action >= numActions || !validTopic(topic) {
		return false
	}
	if g.all {
		return true
	}
	for _, p := range g.patterns[action] {
		if match(p.s, topic) {
			return true
		}
	}
	return false
}

// Patterns returns the patterns granted for action, for logs.
func (g Grants) Patterns(action Action) []string {
	if action >= numActions {
		return nil
	}
	if g.all {
		return []string{"**"}
	}
	out := make([]string, len(g.patterns[action]))
	for i, p := range g.patterns[action] {
		out[i] = p.s
	}
	return out
}
