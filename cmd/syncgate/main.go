// Command syncgate runs the syncgate realtime sync gateway.
//
//	syncgate [serve] [flags]   run the gateway (the default)
//	syncgate version           print the version
//	syncgate bench ...         load-test a running gateway
//
// Every setting is a flag, an environment variable and a key of the optional
// YAML config file; see `syncgate -h` and the README's Configuration section.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func main() {
	ctx, stop := signalContext()
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "syncgate:", err)
		}
		os.Exit(1)
	}
}

// signalContext returns a context cancelled by the first SIGINT or
// SIGTERM, on which the node drains. From then on the two signals have
// their default action again, so a second one ends the process at once,
// as an operator who does not want to wait out the drain expects. The
// default is restored before the context is cancelled: a second signal
// sent once the drain has begun is never swallowed.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-ch:
		case <-ctx.Done():
		}
		signal.Stop(ch) // no channel left: the default action is back
		cancel()
	}()
	return ctx, cancel
}

// errUsage means the usage text was already printed.
var errUsage = errors.New("usage")

// flagOutput holds what a flag set writes while it parses until the
// outcome says where it belongs (flush).
type flagOutput struct{ buf bytes.Buffer }

func (o *flagOutput) Write(p []byte) (int, error) { return o.buf.Write(p) }

// flush writes what the flag set wrote: the usage asked for with -h,
// -help or --help (err is flag.ErrHelp) to stdout, anything else (a bad
// flag's complaint and the usage after it) to stderr.
func (o *flagOutput) flush(err error, stdout, stderr io.Writer) {
	w := stderr
	if errors.Is(err, flag.ErrHelp) {
		w = stdout
	}
	_, _ = o.buf.WriteTo(w)
}

// parseFlags parses args into fs and refuses positional arguments. The
// usage asked for (-h, -help, --help) goes to stdout with flag.ErrHelp,
// which run takes for success; a bad flag's complaint goes to stderr with
// errUsage.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	var out flagOutput
	fs.SetOutput(&out)
	err := fs.Parse(args)
	out.flush(err, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err != nil {
		return errUsage // the flag package has printed why
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", strings.TrimPrefix(fs.Name(), "syncgate "), fs.Arg(0))
	}
	return nil
}

// run runs the command line args. A usage asked for (-h, -help, --help)
// is printed to stdout and is no error, as with the flag package's own
// ExitOnError: exit 0.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	err := runCommand(ctx, args, getenv, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

func runCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, getenv, stdout, stderr)
	case "version":
		fs := flag.NewFlagSet("syncgate version", flag.ContinueOnError)
		fs.Usage = func() { fmt.Fprintln(fs.Output(), "usage: syncgate version   print the version (no arguments)") }
		if err := parseFlags(fs, args, stdout, stderr); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "syncgate", versionString())
		return nil
	case "bench":
		return bench(ctx, args, stdout, stderr)
	case "help":
		// As -h: the usage, on stdout, and exit 0.
		return serve(ctx, []string{"-h"}, getenv, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "syncgate: unknown command %q; commands: serve (default), version, bench, help\n", cmd)
		return errUsage
	}
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
