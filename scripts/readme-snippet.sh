#!/usr/bin/env bash
# readme-snippet.sh runs the README's browser snippet (the plain WebSocket
# API) against a fresh gateway on loopback and checks that the published
# message comes back: under Node's WebSocket, which follows the browser's,
# then in a real headless Chromium (browser/snippet.mjs: Debian's
# chromium driven by playwright-core), where the page's Origin meets the
# gateway's Origin check. Installs chromium with apt-get and playwright-core
# with npm when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v node >/dev/null 2>&1; then
	echo "readme-snippet: installing nodejs" >&2
	apt-get update -qq && apt-get install -y -qq nodejs >/dev/null
fi
work=$(mktemp -d)
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
go build -o "$work/syncgate" ./cmd/syncgate
port=18097
"$work/syncgate" -addr "127.0.0.1:$port" -data-dir "$work/data" -log-level warn >"$work/gateway.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
	(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
	sleep 0.1
done
# The snippet as the README shows it, pointed at this gateway, closing
# after a second and a half.
awk '/^```js$/{f=1;next} /^```$/{f=0} f' README.md >"$work/readme.js"
sed "s#ws://127.0.0.1:8080#ws://127.0.0.1:$port#" "$work/readme.js" >"$work/snippet.mjs"
echo 'setTimeout(() => ws.close(), 1500);' >>"$work/snippet.mjs"
flags=""
node -e 'process.exit(typeof WebSocket === "undefined" ? 1 : 0)' 2>/dev/null || flags="--experimental-websocket"
out=$(timeout 20 node $flags "$work/snippet.mjs")
echo "$out"
if ! grep -q "{ text: 'hi' }" <<<"$out"; then
	echo "readme-snippet: the snippet did not receive its own message" >&2
	exit 1
fi
echo "readme-snippet: ok under Node"

chromium=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$chromium" ]; then
	echo "readme-snippet: installing chromium" >&2
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
if [ ! -d browser/node_modules/playwright-core ]; then
	(cd browser && npm ci --no-audit --no-fund)
fi
CHROMIUM=$chromium timeout 120 node browser/snippet.mjs "$work/syncgate" "$work/readme.js"
echo "readme-snippet: ok in Chromium"
