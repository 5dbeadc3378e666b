package storage_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		// The crash test's child: run without the leak check (it is killed).
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}
