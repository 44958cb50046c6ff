#!/usr/bin/env bash
# `make bench-fronts`: the same multi-turn workload through each front door
# — Chat Completions, the Anthropic Messages API, the Responses API (turns
# chained with previous_response_id) — against `duplex up` (P/D,
# bidirectional), a fresh cluster for every run so no door finds another's
# KV cached; rounds interleave the doors.  Prints the TTFT p50 per turn for
# each (medians over the rounds) and the router's added latency per stage
# (its duplex_router_added_seconds histogram, p50 bucket bounds).  A
# benchmark: prints figures, asserts nothing.
#   scripts/bench_fronts.sh [path/to/duplex] [rounds]   (build/release/duplex, 3)
# Environment: MODEL (default models/qwen3-small-bf16.gguf, synthesised if
# missing), PRESET (quick), SCALE (1), THREADS (1 per node).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
BIN=${1:-build/release/duplex}
ROUNDS=${2:-3}
MODEL=${MODEL:-models/qwen3-small-bf16.gguf}
PRESET=${PRESET:-quick}
SCALE=${SCALE:-1}
THREADS=${THREADS:-1}
[ -f "$MODEL" ] || { mkdir -p "$(dirname "$MODEL")"; "$BIN" model synth --preset small --dtype bf16 -o "$MODEL" >/dev/null; }
dir=$(mktemp -d /tmp/duplex-bench-fronts.XXXXXX)
up_pid=
cleanup() { [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; model $MODEL; preset $PRESET x $SCALE; $ROUNDS rounds"
for round in $(seq 1 "$ROUNDS"); do
    apis="chat messages responses"
    [ $((round % 2)) -eq 0 ] && apis="responses messages chat" # alternate the order
    for api in $apis; do
        out="$dir/$api-$round"
        mkdir -p "$out"
        "$BIN" up --model "$MODEL" --port 0 --threads-per-node "$THREADS" >"$out/up.log" 2>&1 &
        up_pid=$!
        port=
        for _ in $(seq 1 600); do
            port=$(grep -o 'ready: http://127.0.0.1:[0-9]*' "$out/up.log" | grep -o '[0-9]*$' || true)
            [ -n "$port" ] && break
            sleep 0.1
        done
        [ -n "$port" ] || { echo "duplex up did not start:"; cat "$out/up.log"; exit 1; }
        "$BIN" bench run --url "http://127.0.0.1:$port" --api "$api" --preset "$PRESET" \
            --scale "$SCALE" --no-progress --out "$out" >"$out/bench.log" 2>&1 ||
            { echo "bench run --api $api failed:"; tail -20 "$out/bench.log"; exit 1; }
        curl -s "http://127.0.0.1:$port/metrics" >"$out/router.metrics"
        kill "$up_pid"
        wait "$up_pid" 2>/dev/null || true
        up_pid=
    done
done
node scripts/bench_fronts.mjs "$dir" "$ROUNDS"
