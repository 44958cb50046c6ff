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
port=$(serve_port "$dir/serve.log" 200)
if [ -z "$port" ]; then
    echo "bench-server: could not find the port in the log" >&2
    cat "$dir/serve.log" >&2
    exit 1
fi
model=$(curl -s "http://127.0.0.1:$port/v1/models" | sed 's/.*"id":"\([^"]*\)".*/\1/')
echo "bench-server: $BIN, tiny qwen3 f32, threads=$THREADS, port $port"
node scripts/bench_server.mjs "$port" "$model"
