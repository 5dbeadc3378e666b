package auth

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

func TestPattern_Match(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern string
		yes     []string
		no      []string
	}{
		{"room:42", []string{"room:42"}, []string{"room:4", "room:420", "Room:42", "room/42", "xroom:42", "room:42:1", "room:42/", "room:42-"}},
		{"room:*", []string{"room:1", "room:42", "room:a.b-c@d_e"}, []string{"room", "room:", "room:1:2", "room:1/2", "room/1", "rooms:1", "xroom:1", "room::"}},
		{"room:*:chat", []string{"room:1:chat"}, []string{"room::chat", "room:1:2:chat", "room:1:chats", "room:1/chat"}},
		{"*:public", []string{"a:public", "room-7:public"}, []string{":public", "a:b:public", "public"}},
		{"*", []string{"a", "room.1"}, []string{"a:b", "a/b", ":"}},
		{"room:**", []string{"room:1", "room:1:2", "room:1/chat", "room::"}, []string{"room", "room:", "room/1", "roomx:1"}},
		{"user/u1/**", []string{"user/u1/inbox", "user/u1/a:b"}, []string{"user/u1", "user/u1/", "user/u10/inbox", "user/u1:inbox"}},
		{"**", []string{"a", "room:1:2", "/"}, []string{""}},
		{"a::b", []string{"a::b"}, []string{"a:x:b", "a:b"}},
		{"a:", []string{"a:"}, []string{"a", "a:b"}},
	} {
		p, err := ParsePattern(tc.pattern)
		if err != nil {
			t.Fatalf("ParsePattern(%q): %v", tc.pattern, err)
		}
		for _, s := range tc.yes {
			if !p.Match(s) {
				t.Errorf("%q does not match %q", tc.pattern, s)
			}
		}
		for _, s := range tc.no {
			if p.Match(s) {
				t.Errorf("%q matches %q", tc.pattern, s)
			}
		}
	}
	if (Pattern{}).Match("a") {
		t.Error("the zero Pattern matches")
	}
	p, _ := ParsePattern("**")
	for _, bad := range []string{"", "a b", "a\x00", strings.Repeat("a", 256), "é"} {
		if p.Match(bad) {
			t.Errorf("** matches the invalid topic %q", bad)
		}
	}
}

func TestParsePattern_invalid(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "room-*", "*x", "a*b", "***", "**:x", "a:**:b", "**/", "room:4*", "a b", "room:é",
		"a\x00", strings.Repeat("a", 256), "[a]", "a?", "room.*"} {
		if _, err := ParsePattern(s); err == nil {
			t.Errorf("ParsePattern(%q) accepted it", s)
		}
	}
}

func TestGrants_Allow(t *testing.T) {
	t.Parallel()
	g, err := TopicClaims{Subscribe: []string{"room:*"}, Publish: []string{"room:42"}}.Grants()
	if err != nil {
		t.Fatal(err)
	}
	var zero Grants
	all := AllowAll()
	for _, a := range []Action{Subscribe, Publish, Presence, Manage} {
		if zero.Allow(a, "room:1") {
			t.Errorf("zero Grants allow %v", a)
		}
		if !all.Allow(a, "any/thing:at-all") {
			t.Errorf("AllowAll denies %v", a)
		}
		if all.Allow(a, "bad topic") {
			t.Errorf("AllowAll allows an invalid topic for %v", a)
		}
	}
	if g.Allow(numActions, "room:42") || all.Allow(Action(200), "room:42") {
		t.Error("an unknown action is allowed")
	}
	if _, err := (TopicClaims{Presence: []string{"ok", "bad*"}}).Grants(); err == nil || !strings.Contains(err.Error(), "topics.presence[1]") {
		t.Errorf("bad pattern error %v; want it to name topics.presence[1]", err)
	}
	if g.Allow(Manage, "room:42") {
		t.Error("publish implies manage")
	}
	if m, err := (TopicClaims{Manage: []string{"room:*"}}).Grants(); err != nil || !m.Allow(Manage, "room:1") || m.Allow(Publish, "room:1") {
		t.Errorf("manage grant: err %v, manage %v, publish %v", err, m.Allow(Manage, "room:1"), m.Allow(Publish, "room:1"))
	}
	if got := g.Patterns(Subscribe); len(got) != 1 || got[0] != "room:*" {
		t.Errorf("Patterns(Subscribe) = %q", got)
	}
}

// randomTopic returns a valid topic of 1-40 bytes, biased towards
// separators and the granted prefix so that lookalikes are common.
func randomTopic(r *rand.Rand) string {
	const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:@/-"
	var b strings.Builder
	if r.IntN(2) == 0 {
		b.WriteString([]string{"room", "room:", "room:4", "room:42", "Room:", "room/", "rooms:"}[r.IntN(7)])
	}
	for n := r.IntN(40) + 1; b.Len() < n || b.Len() == 0; {
		if r.IntN(4) == 0 {
			b.WriteByte(":/"[r.IntN(2)])
		} else {
			b.WriteByte(chars[r.IntN(len(chars))])
		}
	}
	return b.String()
}

// TestGrants_Allow_outside makes 1,000 subscribe and 1,000 publish
// attempts on random topics outside the granted patterns (as judged by an
// independent regexp oracle): every one is denied, and presence is never
// granted.
func TestGrants_Allow_outside(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	g, err := TopicClaims{Subscribe: []string{"room:*"}, Publish: []string{"room:42"}}.Grants()
	if err != nil {
		t.Fatal(err)
	}
	subRE, pubRE := oracle("room:*"), oracle("room:42")
	for _, c := range []struct {
		a  Action
		re *regexp.Regexp
	}{{Subscribe, subRE}, {Publish, pubRE}} {
		denied := 0
		for tries := 0; denied < 1000; tries++ {
			if tries > 100000 {
				t.Fatal("cannot generate enough topics outside the grants")
			}
			topic := randomTopic(r)
			if c.re.MatchString(topic) {
				continue
			}
			if g.Allow(c.a, topic) {
				t.Fatalf("%v %q allowed outside the grants", c.a, topic)
			}
			if g.Allow(Presence, topic) {
				t.Fatalf("presence %q allowed without a presence grant", topic)
			}
			denied++
		}
	}
}

// oracle compiles a valid pattern into an anchored regexp, the package
// doc's rules spelled another way. Test-only: production code never builds
// a regexp from token input.
func oracle(pattern string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	start := 0
	for i := 0; i <= len(pattern); i++ {
		if i < len(pattern) && !isSep(pattern[i]) {
			continue
		}
		switch seg := pattern[start:i]; seg {
		case "*":
			b.WriteString("[^:/]+")
		case "**":
			b.WriteString(".+")
		default:
			b.WriteString(regexp.QuoteMeta(seg))
		}
		if i < len(pattern) {
			b.WriteString(regexp.QuoteMeta(pattern[i : i+1]))
		}
		start = i + 1
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

func FuzzMatch(f *testing.F) {
	for _, s := range [][2]string{{"room:*", "room:1"}, {"room:**", "room:1/2"}, {"a:*:b", "a:x:b"}, {"**", "x"},
		{"room:42", "room:42"}, {"*", ":"}, {"a::b", "a::b"}, {"x*", "xy"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, topic string) {
		p, err := ParsePattern(pattern)
		if err != nil {
			if p.Match(topic) {
				t.Fatal("a refused pattern matches")
			}
			return
		}
		got := p.Match(topic)
		if got && !validTopic(topic) {
			t.Fatalf("%q matches the invalid topic %q", pattern, topic)
		}
		if !strings.Contains(pattern, "*") {
			// A literal pattern matches only itself.
			if got != (topic == pattern) {
				t.Fatalf("literal %q vs %q: %v", pattern, topic, got)
			}
			if !p.Match(pattern) {
				t.Fatalf("literal %q does not match itself", pattern)
			}
		}
		if want := validTopic(topic) && oracle(pattern).MatchString(topic); got != want {
			t.Fatalf("Match(%q, %q) = %v; oracle says %v", pattern, topic, got, want)
		}
	})
}
