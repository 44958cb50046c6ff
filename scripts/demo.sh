#!/usr/bin/env bash
# `make demo`: build duplex, synthesise the default model (small preset,
# qwen3, bf16) and run the main job on it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
make -s -j"$(nproc)"
BIN=build/release/duplex
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
