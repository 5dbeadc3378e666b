#!/usr/bin/env bash
# bench-matrix.sh runs the end-to-end load scenarios of docs/benchmarks.md
# RUNS times each against a fresh gateway on loopback and appends every
# result's JSON line to OUT. Usage: scripts/bench-matrix.sh [OUT] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/bench-matrix.jsonl}
RUNS=${2:-3}
PORT=${PORT:-18090}
BIN=$(mktemp -d)/syncgate
go build -o "$BIN" ./cmd/syncgate
URL="ws://127.0.0.1:$PORT/v1/ws"

scenarios=(
	"connect -n 10000 -hold 5s"
	"fanout -subs 1000 -rate 100 -dur 10s"
	"fanout -subs 5000 -rate 10 -dur 10s"
	"fanout -subs 1000 -rate 1000 -dur 10s"
	"fanout -subs 5000 -rate 100 -dur 10s"
	"topics -n 1000 -rate 50000 -dur 10s"
)
for run in $(seq 1 "$RUNS"); do
	for sc in "${scenarios[@]}"; do
		"$BIN" -addr "127.0.0.1:$PORT" -data-dir "$(mktemp -d)" -frame-rate off -accept-rate off -log-level warn &
		pid=$!
		for _ in $(seq 1 50); do
			curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
			sleep 0.1
		done
		# shellcheck disable=SC2086
		line=$("$BIN" bench $sc -url "$URL" | grep '^{"bench"' || true)
		echo "{\"run\":$run,\"scenario\":\"$sc\",\"result\":${line:-null}}" >>"$OUT"
		kill -TERM "$pid"
		wait "$pid" || true
	done
done
echo "results in $OUT"
