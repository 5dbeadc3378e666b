//go:build !unix

package gateway

import "time"

// processCPU is unknown here: pacing then follows the write rate alone.
func processCPU() time.Duration { return 0 }
