#!/usr/bin/env bash
# `make demo`: build duplex, synthesise the default model (small preset,
# qwen3, bf16) and run the main job on it.
set -euo pipefail
cd "$(dirname "$0")/.."
# DUPLEX_BIN: run the demo with an already built binary (the test suite runs
# it with each variant); otherwise build the release binary first.
if [ -z "${DUPLEX_BIN:-}" ]; then
    scripts/deps.sh
    make -s -j"$(nproc)"
fi
BIN=${DUPLEX_BIN:-build/release/duplex}
MODEL=${DUPLEX_MODEL:-models/qwen3-small-bf16.gguf}
mkdir -p "$(dirname "$MODEL")"
if [ ! -f "$MODEL" ]; then
    echo "== synthesising $MODEL"
    "$BIN" model synth --arch qwen3 --preset small --dtype bf16 --seed 1 -o "$MODEL"
fi
echo "== duplex model info $MODEL"
"$BIN" model info "$MODEL"
echo
echo "== duplex tokenize"
"$BIN" tokenize --model "$MODEL" --text 'Hello, duplex! {"turn": 2, "reuse": true}'
echo
echo "== duplex generate (greedy, 48 tokens)"
"$BIN" generate --model "$MODEL" --chat "Write a haiku about moving KV caches between nodes." -n 48

echo
echo "== duplex serve (single node, role both) + a chat over the OpenAI API"
LOG=$(mktemp)
"$BIN" serve --model "$MODEL" --port 0 >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; rm -f "$LOG"' EXIT
PORT=""
for _ in $(seq 1 100); do
    PORT=$(sed -n 's|.*address=http://127.0.0.1:\([0-9]*\).*|\1|p' "$LOG" | head -n1)
    [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    sleep 0.1
done
[ -n "$PORT" ] || { cat "$LOG"; echo "server did not start"; exit 1; }
grep 'duplex serve:' "$LOG" | head -n1
URL=http://127.0.0.1:$PORT/v1/chat/completions
ID=$(curl -s "http://127.0.0.1:$PORT/v1/models" | sed -n 's|.*"id":"\([^"]*\)".*|\1|p')
echo "-- GET /v1/models: $ID"
MSG='{"model":"'"$ID"'","max_tokens":24,"temperature":0,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"What does duplex move between nodes?"}]}'
echo "-- POST /v1/chat/completions (non-streaming)"
curl -s "$URL" -H 'Content-Type: application/json' -d "$MSG"
echo
echo "-- the same, streaming (Server-Sent Events), with usage"
SSE=$(mktemp)
curl -sN "$URL" -H 'Content-Type: application/json' \
    -d "${MSG%\}},\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$SSE"
head -n 4 "$SSE"
echo "   ... ($(grep -c '^data:' "$SSE") events in all) ..."
tail -n 6 "$SSE"
rm -f "$SSE"
echo "-- second turn: the history's KV comes from the prefix cache"
MSG2='{"model":"'"$ID"'","max_tokens":8,"temperature":0,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"What does duplex move between nodes?"},{"role":"assistant","content":"KV blocks."},{"role":"user","content":"Both ways?"}]}'
curl -s "$URL" -H 'Content-Type: application/json' -d "$MSG2"
echo
kill -TERM $SERVER
wait $SERVER 2>/dev/null || true
tail -n 4 "$LOG"
