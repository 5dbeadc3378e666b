package gateway

import "time"

// SetAdmitHookForTest makes f see every rate decision of s's accept budget,
// with the time the token bucket was given. Call it before s serves
// anything.
func SetAdmitHookForTest(s *Server, f func(now time.Time, ok bool)) { s.budget.hookForTest = f }
