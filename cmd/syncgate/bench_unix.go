//go:build unix

package main

import (
	"fmt"
	"syscall"
	"time"
)

// raiseFDLimit raises the soft RLIMIT_NOFILE to the hard limit and fails if
// the result is still below need.
func raiseFDLimit(need uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("reading the file-descriptor limit: %w", err)
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = raised.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			lim = raised
		}
	}
	if uint64(lim.Cur) < need {
		return fmt.Errorf("need %d file descriptors (one per session + %d), but the limit is %d (hard %d): "+
			"raise it (ulimit -Hn, systemd LimitNOFILE, docker --ulimit nofile) or use fewer sessions",
			need, fdSlack, uint64(lim.Cur), uint64(lim.Max))
	}
	return nil
}

// processCPU returns the CPU time (user + system) this process has used.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
