#!/usr/bin/env bash
# `make demo`: build duplex, synthesise the default model (small preset,
# qwen3, bf16) and run the main job on it: a prefill node, a decode node and
# the router (`duplex up`, bidirectional), an OpenAI chat through the router,
# and a multi-turn conversation that shows, per turn, how much of the prompt
# was reused rather than recomputed and where the KV came from; then the
# benchmark comparing the serving modes (`duplex bench compare`), whose
# reports land in demo-out/.  Every process it starts stops with it, also on
# Ctrl-C.  DEMO_BENCH_ARGS replaces the comparison's workload flags (the
# tests run a smaller one), DEMO_OUT its directory.
set -euo pipefail
cd "$(dirname "$0")/.."
# DUPLEX_BIN: run the demo with an already built binary (the test suite runs
# it with each variant); otherwise build the release binary first.
. scripts/lib.sh
if [ -z "${DUPLEX_BIN:-}" ]; then
    start=$SECONDS
    scripts/deps.sh
    stage_done deps "$start"
    build release all
fi
BIN=${DUPLEX_BIN:-build/release/duplex}
MODEL=${DUPLEX_MODEL:-models/qwen3-small-bf16.gguf}
mkdir -p "$(dirname "$MODEL")"
if [ ! -f "$MODEL" ]; then
    echo "== synthesising $MODEL …"
    start=$SECONDS
    "$BIN" model synth --arch qwen3 --preset small --dtype bf16 --seed 1 -o "$MODEL"
    stage_done "synthesising $MODEL" "$start"
fi
echo "== duplex model info $MODEL"
"$BIN" model info "$MODEL"
echo
echo "== duplex generate (one engine, greedy, 48 tokens)"
"$BIN" generate --model "$MODEL" --chat "Write a haiku about moving KV caches between nodes." -n 48

echo
echo "== duplex up: a prefill node, a decode node and the router, bidirectional KV transfer"
LOG=$(mktemp)
# --local-prefill-max-tokens 0: every turn goes through the prefill node (the
# router's default sends small new parts straight to the decode node);
# --prefill-no-prefix-caching: the prefill node keeps nothing itself, as in
# the P/D benchmark, so every turn's history visibly comes from the decode node
"$BIN" up --mode bidirectional --model "$MODEL" --port 0 --local-prefill-max-tokens 0 \
    --prefill-no-prefix-caching --kv-cache-mb 256 --log-level warn >"$LOG" 2>&1 &
UP=$!
trap 'kill $UP 2>/dev/null || true; rm -f "$LOG"' EXIT
URL=""
for _ in $(seq 1 600); do
    URL=$(grep -o -m1 -E 'ready: http://127.0.0.1:[0-9]+' "$LOG" | cut -d' ' -f2 || true)
    [ -n "$URL" ] && break
    kill -0 $UP 2>/dev/null || { cat "$LOG"; echo "duplex up failed"; exit 1; }
    sleep 0.1
done
[ -n "$URL" ] || { cat "$LOG"; echo "duplex up did not get ready"; exit 1; }
grep '^duplex up:' "$LOG"
P=$(sed -n 's|^duplex up: prefill0 .*\(http://127.0.0.1:[0-9]*\).*|\1|p' "$LOG")
D=$(sed -n 's|^duplex up: decode0 .*\(http://127.0.0.1:[0-9]*\).*|\1|p' "$LOG")
ID=$(curl -s "$URL/v1/models" | sed -n 's|.*"id":"\([^"]*\)".*|\1|p')
echo
echo "-- POST $URL/v1/chat/completions (streaming, Server-Sent Events, with usage)"
SSE=$(mktemp)
curl -sN "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d '{"model":"'"$ID"'",
  "max_tokens":24,"temperature":0,"stream":true,"stream_options":{"include_usage":true},
  "messages":[{"role":"system","content":"You are terse."},
              {"role":"user","content":"What does duplex move between nodes?"}]}' >"$SSE"
head -n 4 "$SSE"
echo "   ... ($(grep -c '^data:' "$SSE") events in all) ..."
tail -n 4 "$SSE"
rm -f "$SSE"

echo
echo "-- a 6-turn conversation through the router (duplex bench chat): from turn 2 the"
echo "   prefill node pulls the history the decode node kept and computes only the new part"
"$BIN" bench chat --url "$URL" --turns 6 --prefix-tokens 450 --input-tokens 60 --output-tokens 48 --show

metric() { curl -s "$1/metrics" | sed -n "s|^$2 \([0-9.e+]*\)$|\1|p" | head -n1; }
echo
echo "-- where the KV came from (node metrics)"
echo "   prefill node: computed $(metric "$P" 'duplex_kv_prompt_tokens_total{source="computed"}') prompt tokens," \
    "pulled $(metric "$P" 'duplex_kv_prompt_tokens_total{source="pulled"}') from the decode node" \
    "($(metric "$P" 'duplex_kv_pull_bytes_total{direction="d2p"}') bytes in" \
    "$(metric "$P" 'duplex_kv_pulls_total{direction="d2p"}') pulls)"
echo "   decode node:  reused $(metric "$D" 'duplex_kv_prompt_tokens_total{source="local"}') from its own" \
    "retained KV, pulled $(metric "$D" 'duplex_kv_prompt_tokens_total{source="pulled"}') from the prefill node," \
    "computed $(metric "$D" 'duplex_kv_prompt_tokens_total{source="computed"}');" \
    "$(metric "$D" duplex_kv_leases) retention lease live," \
    "$(metric "$D" 'duplex_kv_lease_events_total{event="superseded"}') superseded by the next turn"
kill -TERM $UP
wait $UP
echo "duplex up: stopped"

# The comparison (docs/bench.md): the same multi-turn workload through
# `duplex up` in four modes, one after the other — P/D one-way with the
# prefill node recomputing the history (the baseline of vLLM's and AWS's
# measurements), P/D bidirectional with every turn through the prefill
# node, P/D bidirectional with the defaults (every decision by the nodes'
# measured costs), and one colocated node.
OUT=${DEMO_OUT:-demo-out}
echo
echo "== duplex bench compare ${DEMO_BENCH_ARGS:---preset quick}: TTFT by turn, four modes"
# shellcheck disable=SC2086 # DEMO_BENCH_ARGS is a list of flags
"$BIN" bench compare ${DEMO_BENCH_ARGS:---preset quick} --modes uni-nocache,bidi,bidi-auto,colocated \
    --model "$MODEL" --out "$OUT"
echo "open $OUT/ttft.svg in a browser for the plot; $OUT/summary.md has every table"
