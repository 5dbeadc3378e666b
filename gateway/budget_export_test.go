package gateway

import "time"

// SetAdmitHookForTest makes f see every rate decision of s's accept budget,
// with the time the token bucket was given and, for a refusal, the delay
// the client is told. f runs under the budget's lock: it must not call
// into s. Call it before s serves anything.
func SetAdmitHookForTest(s *Server, f func(now time.Time, ok bool, after time.Duration)) {
	s.budget.hookForTest = f
}

// MaxRefusing is how many refusals may be under way at once.
const MaxRefusing = maxRefusing

// AddRefusingForTest counts n more refusals as under way on s (negative n
// ends them), as if that many refused clients were in their close
// handshakes.
func AddRefusingForTest(s *Server, n int32) { s.refusing.Add(n) }

// SetRefusalWaitForTest sets how long s's refusals wait for a client's
// close frame (a second otherwise). Call it before s serves anything.
func SetRefusalWaitForTest(s *Server, d time.Duration) { s.refusalWait = d }
