#!/usr/bin/env bash
# conformance: what duplex computes from quantised files against what
# llama.cpp computes from the same files.  For each model shape an F32
# source is written by `duplex model synth`; for each weight type two files
# are made from it, one by duplex (`model synth --dtype T`, same seed, so
# the same F32 values quantised by duplex's own quantisers) and one by
# llama-quantize.  On every file:
#  - KL divergence and top-1 agreement of the next-token distributions
#    against the F32 source over one window of text (its second half, the
#    positions llama.cpp scores): duplex's (`duplex bench kld --base`) and
#    llama.cpp's (`llama-perplexity --kl-divergence`) on the same tokens,
#    same KV type, so the two engines' losses can be read side by side;
#  - greedy continuations of both engines compared token by token
#    (scripts/bench/check_llamacpp_moe.sh on the files: where they part, the
#    margin between llama.cpp's top two logits there).
# A check run by hand, outside the test suite: it prints a markdown table
# (and the divergences above it) and exits 1 when check_llamacpp_moe.sh
# finds a divergence beyond a near tie.
#
#   scripts/bench/conformance.sh LLAMA_DIR
#
# LLAMA_DIR: a llama.cpp source tree built from its public source outside
# this repository (build/bin/llama-quantize, llama-perplexity, libllama.so).
# Environment (defaults in brackets):
#   SHAPES  ARCH:PRESET:LAYERS ["qwen3:qwen3-0.6b:4 llama:llama3.2-1b:2"]
#           (the presets' real vocabulary sizes and layer shapes)
#   TYPES   --dtype names ["q8_0 q6_k q5_k_m q4_k_m q4_k_s q4_0 iq4_xs
#           q3_k_m q2_k"]; llama-quantize gets the same name in capitals
#   CTX [4096]  the KLD window (llama-perplexity -c CTX --chunks 1 scores
#           its second half; the text must hold 2 * CTX tokens)
#   TEXT    the text [README.md and docs/*.md concatenated]
#   KV [f16]  the KV type of the KLD runs (-ctk/-ctv and --kv-dtype)
#   N_GEN [32]  THREADS [2]  SEED [1]  MAX_MARGIN (check_llamacpp_moe.sh)
#   DUPLEX_BIN [build/release/duplex]  KEEP=1 keeps the files
#   LLAMA_REV  the llama.cpp revision to print (default: git rev-parse)
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//; /^set -e/d'; exit 2; }
LLAMA_DIR=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
BIN=${DUPLEX_BIN:-build/release/duplex}
SHAPES=${SHAPES:-"qwen3:qwen3-0.6b:4 llama:llama3.2-1b:2"}
TYPES=${TYPES:-"q8_0 q6_k q5_k_m q4_k_m q4_k_s q4_0 iq4_xs q3_k_m q2_k"}
CTX=${CTX:-4096}
KV=${KV:-f16}
THREADS=${THREADS:-2}
SEED=${SEED:-1}
LIB=$LLAMA_DIR/build/bin
for f in llama-quantize llama-perplexity libllama.so; do
    [ -e "$LIB/$f" ] || { echo "conformance: no $LIB/$f" >&2; exit 1; }
done
[ -x "$BIN" ] || make -s -j"$(nproc)"
export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
dir=$(mktemp -d /tmp/duplex-conformance.XXXXXX)
trap '[ -n "${KEEP:-}" ] && echo "files in $dir" || rm -rf "$dir"' EXIT
text=${TEXT:-$dir/text.txt}
[ -n "${TEXT:-}" ] || cat README.md docs/*.md >"$text"

# "mean top1" of duplex bench kld's second-half line
duplex_kld() {
    "$BIN" bench kld --model "$1" --base "$2" --file "$text" --ctx "$CTX" --kv-dtype "$KV" \
        --threads "$THREADS" 2>/dev/null | awk '/ half /{ gsub("%", "", $(NF-1)); print $(NF-5), $(NF-1) }'
}
# the same from llama-perplexity's report
llama_kld() {
    "$LIB/llama-perplexity" -m "$1" -f "$text" -c "$CTX" --chunks 1 -fa on -ctk "$KV" -ctv "$KV" \
        -t "$THREADS" --kl-divergence-base "$2" --kl-divergence 2>&1 |
        awk '/^Mean +KLD:/{ k = $3 } /^Same top p:/{ p = $4 } END { print k, p }'
}

echo "conformance: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')," \
    "$(grep -o 'avx512[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ')| $(nproc) cores;" \
    "window $CTX, KV $KV; llama.cpp at $LLAMA_DIR (${LLAMA_REV:-$(git -C "$LLAMA_DIR" rev-parse --short HEAD 2>/dev/null || echo "revision unknown: set LLAMA_REV")})"
rows=() files=()
for shape in $SHAPES; do
    IFS=: read -r arch preset layers <<<"$shape"
    tag=$preset-${layers}l
    src=$dir/$tag-f32.gguf
    "$BIN" model synth --arch "$arch" --preset "$preset" --layers "$layers" --dtype f32 \
        --seed "$SEED" -o "$src" >/dev/null
    "$LIB/llama-perplexity" -m "$src" -f "$text" -c "$CTX" --chunks 1 -fa on -ctk "$KV" \
        -ctv "$KV" -t "$THREADS" --kl-divergence-base "$dir/$tag.kld" >/dev/null 2>&1
    for t in $TYPES; do
        dup=$dir/$tag-$t-duplex.gguf lla=$dir/$tag-$t-llama.gguf
        "$BIN" model synth --arch "$arch" --preset "$preset" --layers "$layers" --dtype "$t" \
            --seed "$SEED" -o "$dup" >/dev/null
        "$LIB/llama-quantize" "$src" "$lla" "${t^^}" >/dev/null 2>&1 ||
            { echo "conformance: llama-quantize $t failed" >&2; lla=; }
        for f in $dup $lla; do
            by=duplex; [ "$f" = "$lla" ] && by=llama-quantize
            read -r dk dt <<<"$(duplex_kld "$f" "$src")"
            read -r lk lt <<<"$(llama_kld "$f" "$dir/$tag.kld")"
            rows+=("| $tag | $t | $by | $dk | $lk | $dt% | $lt% |")
            files+=("$f")
        done
    done
done
echo "== greedy continuations (check_llamacpp_moe.sh on every file)"
rc=0
MODELS="${files[*]}" KV=f32 THREADS=$THREADS scripts/bench/check_llamacpp_moe.sh "$LLAMA_DIR" || rc=$?
echo
echo "== KL divergence against the F32 source, positions [$((CTX / 2)), $((CTX - 1))) (KV $KV)"
echo "| shape | type | file by | duplex KLD | llama.cpp KLD | duplex same top | llama.cpp same top |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
exit $rc
