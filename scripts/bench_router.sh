#!/usr/bin/env bash
# `make bench-router`: what the router adds to latency on loopback — a fake
# decode node's content event to the client, through `duplex router` and
# directly; a real node (tiny model) behind a colocated router; the router's
# own duplex_router_added_seconds histogram; conversation state in memory
# against state in Redis (a redis-server it starts, when installed).  Drives
# everything from scripts/bench_router.mjs (node).  A benchmark: prints
# figures, asserts nothing.
#   scripts/bench_router.sh [path/to/duplex] [N]   (default build/release/duplex, 200)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/release/duplex}
N=${2:-200}
dir=$(mktemp -d /tmp/duplex-bench-router.XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$BIN" model synth --arch qwen3 --preset tiny --dtype f32 -o "$dir/tiny.gguf" >/dev/null
node scripts/bench_router.mjs "$BIN" "$dir/tiny.gguf" "$N"
