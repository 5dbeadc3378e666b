#!/usr/bin/env bash
# test.sh runs every check syncgate has: formatting, vet, staticcheck, the
# race-enabled test suite, the README snippet, the Durable Streams
# conformance suite and a short run of each fuzz target. It works on a
# fresh machine with Go 1.26, the Go module proxy and the npm registry,
# installing a C compiler and Node.js when they are missing (apt-get, as
# root; see scripts/ensure-node.sh); `.ci/run` calls it.
set -euo pipefail
cd "$(dirname "$0")"

FUZZTIME="${FUZZTIME:-15s}"

step() { printf '\n== %s\n' "$*"; }

# A fresh machine has Go in /usr/local/go without it on PATH in every shell.
command -v go >/dev/null 2>&1 || export PATH="$PATH:/usr/local/go/bin"
if ! command -v go >/dev/null 2>&1; then
	echo "test.sh: Go 1.26 is required (https://go.dev/dl); /usr/local/go/bin is not on PATH" >&2
	exit 1
fi

step "go mod download"
go mod download

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt needed on:" >&2
	echo "$unformatted" >&2
	exit 1
fi

step "go vet"
go vet ./...

step "staticcheck"
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

step "C compiler (go test -race needs cgo)"
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
	echo "installing gcc with apt-get" >&2
	apt-get update -qq && apt-get install -y -qq gcc libc6-dev >/dev/null
fi
cc --version 2>/dev/null | head -1 || gcc --version | head -1

step "go test -race"
go test -race -count=1 -timeout 12m ./...

step "allocation tests (without -race, under which sync.Pool drops items)"
go test -count=1 -run 'NoAllocs$' ./gateway

step "drain end-to-end at full size (2,000 sessions; -race runs 200)"
go test -count=1 -run '^TestStorm_Drain$' ./cmd/syncgate

step "node and npm"
# The README snippet runs under Node; the Durable Streams conformance suite
# is an npm package. A fresh machine may lack either, or have a Node too
# old for them.
# shellcheck source=scripts/ensure-node.sh
. ./scripts/ensure-node.sh
node --version && npm --version

step "README browser snippet (Node, then headless Chromium)"
./scripts/readme-snippet.sh

step "Durable Streams conformance (@durable-streams/server-conformance-tests)"
./scripts/conformance.sh

step "fuzz (${FUZZTIME} each)"
# go test -fuzz takes one target in one package at a time. Each new
# interesting input is minimized for at most a second: by default that may
# take a minute, and it counts against -fuzztime (FuzzHelloToken, which
# dials the gateway per input, spent most of 20-60 s runs minimizing and
# found 0-2 new inputs in each; bounded at 1 s, a 30 s run found 29).
#
# Go 1.26's fuzz coordinator can fail a clean run with a bare "context
# deadline exceeded" when -fuzztime ends while a worker is mid-call
# (go.dev/issue/75804, fixed in Go 1.27). Such a run wrote no failing
# input; it is run again, up to twice. A run that wrote a failing input, or
# failed any other way, fails the script at once.
fuzz_one() {
	local pkg=$1 target=$2 log attempt
	log=$(mktemp)
	for attempt in 1 2 3; do
		if go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" -fuzzminimizetime=1s "$pkg" 2>&1 | tee "$log"; [ "${PIPESTATUS[0]}" -eq 0 ]; then
			rm -f "$log"
			return 0
		fi
		if grep -q 'Failing input written to' "$log" ||
			! tail -n 4 "$log" | grep -qE '^[[:space:]]+context deadline exceeded$' ||
			[ "$(grep -c -- '--- FAIL' "$log")" -ne 1 ]; then
			rm -f "$log"
			return 1
		fi
		[ "$attempt" -lt 3 ] || break
		echo "-- $target: the coordinator's deadline race (go.dev/issue/75804), no input written; run $((attempt + 1)) of 3"
	done
	echo "-- $target: three runs in a row failed with the coordinator's deadline race; giving up" >&2
	rm -f "$log"
	return 1
}
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		echo "-- $pkg $target"
		fuzz_one "$pkg" "$target"
	done
done

step "all checks passed"
