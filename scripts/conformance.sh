#!/usr/bin/env bash
# Runs the Durable Streams server conformance suite
# (@durable-streams/server-conformance-tests, pinned in conformance/) against
# a fresh syncgate: built from ./cmd/syncgate, on a free loopback port, with
# an empty data dir and a 500ms long-poll timeout. Exits with vitest's
# status. Extra arguments go to vitest (e.g. -t 'SSE').
#
# Environment:
#   SYNCGATE_BIN                     use this binary instead of building one
#   CONFORMANCE_LONG_POLL_TIMEOUT_MS the server's long-poll timeout (500)
#
# Needs go, node (20.19+, 22.12+ or 23+) and npm; runs `npm ci` when conformance/node_modules
# is missing.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
pid=
cleanup() {
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

long_poll_ms=${CONFORMANCE_LONG_POLL_TIMEOUT_MS:-500}
bin=${SYNCGATE_BIN:-}
if [ -z "$bin" ]; then
	bin=$tmp/syncgate
	(cd "$root" && go build -o "$bin" ./cmd/syncgate)
fi
if [ ! -d "$root/conformance/node_modules" ]; then
	(cd "$root/conformance" && npm ci --no-audit --no-fund)
fi

# A free port: bind :0, read it, release it.
port=$(node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close() })')
addr=127.0.0.1:$port
# The suite checks CORS preflights from https://example.com; without token
# keys the stream API serves only allowlisted origins (docs/security.md).
"$bin" -addr "$addr" -data-dir "$tmp/data" -long-poll-timeout "${long_poll_ms}ms" -log-level warn \
	-allowed-origins https://example.com >"$tmp/server.log" 2>&1 &
pid=$!

healthy() {
	node -e 'fetch(process.argv[1]).then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "http://$addr/healthz"
}
for _ in $(seq 100); do
	if healthy; then
		break
	fi
	if ! kill -0 "$pid" 2>/dev/null; then
		echo "conformance: syncgate exited before serving:" >&2
		cat "$tmp/server.log" >&2
		exit 1
	fi
	sleep 0.1
done
healthy || { echo "conformance: syncgate is not healthy on $addr after 10s" >&2; exit 1; }

status=0
(cd "$root/conformance" &&
	CONFORMANCE_BASE_URL="http://$addr" CONFORMANCE_LONG_POLL_TIMEOUT_MS="$long_poll_ms" npx vitest run "$@") || status=$?
if [ "$status" -ne 0 ] && [ -s "$tmp/server.log" ]; then
	echo "conformance: server log (last 50 lines):" >&2
	tail -n 50 "$tmp/server.log" >&2
fi
exit "$status"
