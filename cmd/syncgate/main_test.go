package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// init makes the test binary a bench child (a storm node, a floor sender)
// when a bench starts one (os.Executable is the test binary under go
// test): it runs the command line as main would, before TestMain.
func init() {
	if os.Getenv(benchChildEnv) == "" {
		return
	}
	ctx, stop := signalContext()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		os.Stderr.WriteString("syncgate: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
