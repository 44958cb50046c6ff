#!/usr/bin/env bash
# `make bench-server`: the HTTP layer's cost on the tiny model — requests/s
# and added latency with max_tokens=1, and streaming throughput.  Starts
# `duplex serve` on an ephemeral port, drives it with scripts/bench_server.mjs
# (node, keep-alive), stops it with SIGTERM.  A benchmark: prints figures,
# asserts nothing about them.
#   scripts/bench_server.sh [path/to/duplex]   (default build/release/duplex)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
BIN=${1:-build/release/duplex}
THREADS=${THREADS:-2}
dir=$(mktemp -d /tmp/duplex-bench-server.XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

"$BIN" model synth --arch qwen3 --preset tiny --dtype f32 -o "$dir/tiny.gguf" >/dev/null
"$BIN" serve --model "$dir/tiny.gguf" --port 0 --threads "$THREADS" --kv-cache-mb 64 \
    --max-waiting 1024 --log-level info 2>"$dir/serve.log" &
pid=$!
port=$(serve_port "$dir/serve.log" 200 bench-server) || exit 1
model=$(served_model "$port")
echo "bench-server: $BIN, tiny qwen3 f32, threads=$THREADS, port $port"
node scripts/bench_server.mjs "$port" "$model"
