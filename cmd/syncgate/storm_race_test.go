//go:build race

package main

// stormTestN is the sessions of the drain end-to-end test. The race
// detector makes 2,000 sessions too slow for a 2-vCPU runner: at 2,000
// A's drain missed its deadline and B peaked at 844/s (limit 750); at 500,
// in the whole package's run, connects to B bunched past the limit. A
// plain `go test` run (test.sh) uses 2,000.
const stormTestN = 200

// stormPeakSlack widens the per-second accept bound under -race from
// 1.5·n/spread to 2.5·n/spread: on 2 vCPUs shared with the rest of the
// suite the race detector's slowdown delays dials by hundreds of
// milliseconds and bunches them (89/s against 75 was seen once). The full
// 1.5· bound is checked by the 2,000-session run without -race in test.sh.
const stormPeakSlack = 2.5 / 1.5
