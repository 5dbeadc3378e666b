//go:build !unix

package main

import "time"

// raiseFDLimit does nothing where there is no RLIMIT_NOFILE.
func raiseFDLimit(uint64) error { return nil }

// processCPU is not available here.
func processCPU() (time.Duration, bool) { return 0, false }
