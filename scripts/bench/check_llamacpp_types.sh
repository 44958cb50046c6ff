#!/usr/bin/env bash
# check_llamacpp_types: duplex's weight types against llama.cpp's, from a
# llama.cpp build made from its public source outside this repository.  Not
# part of the test suite (which must not need llama.cpp); prints what it
# checked and exits non-zero on any mismatch.
#
#   scripts/bench/check_llamacpp_types.sh LLAMA_BUILD_DIR
#
# LLAMA_BUILD_DIR holds bin/llama-simple, bin/llama-quantize and
# bin/libggml-base.so; the headers are taken from LLAMA_SRC (default: the
# build directory's parent).  It checks, for Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q8_0:
#  1. files written by `duplex model synth --dtype T` (qwen3 and llama
#     shapes): ggml's own GGUF reader finds every tensor, and ggml's type
#     traits dequantise each to exactly duplex's values (check_llamacpp_types.c);
#     llama-simple loads each file and generates 8 greedy tokens from it,
#     printed next to `duplex generate`'s (informative: the two engines'
#     float sums differ, so long outputs need not agree);
#  2. duplex's quantisers against ggml_quantize_chunk (llama-quantize's
#     path) on random rows: bytes compared, each side's dequantisation of
#     the other's bytes;
#  3. duplex's f32 model quantised by llama-quantize --pure to each type:
#     duplex loads it (`model info`, `generate`) and dequantises every
#     tensor as ggml does; so too a Q4_K_M file (Q4_K with Q6_K, and the
#     other K-quants with --pure where the shapes allow), with llama-simple's
#     greedy tokens next to duplex's.
# Environment: DUPLEX_BIN [build/release/duplex], KEEP=1 keeps the files.
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//; /^set -e/d'; exit 2; }
LB=$(cd "$1" && pwd)
SRC=${LLAMA_SRC:-$LB/..}
cd "$(dirname "$0")/../.."
BIN=${DUPLEX_BIN:-build/release/duplex}
[ -x "$BIN" ] || make -s -j"$(nproc)"
for f in bin/llama-simple bin/llama-quantize bin/libggml-base.so; do
    [ -e "$LB/$f" ] || { echo "check_llamacpp_types: no $LB/$f" >&2; exit 1; }
done
dir=$(mktemp -d /tmp/duplex-llamacpp-types.XXXXXX)
trap '[ -n "${KEEP:-}" ] && echo "files in $dir" || rm -rf "$dir"' EXIT
export LD_LIBRARY_PATH=$LB/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

cc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -I"$SRC/ggml/include" -Isrc \
    scripts/bench/check_llamacpp_types.c src/base/dx_dtype.c src/base/dx_quant.c src/base/dx_kquant.c \
    src/base/dx_half.c src/base/dx_err.c -L"$LB/bin" -lggml-base -lm -o "$dir/check"
fail=0
types="q4_0 q4_1 q5_0 q5_1 iq4_nl q8_0"

echo "== 1. files duplex writes, read by ggml and run by llama-simple"
for arch in qwen3 llama; do
    for t in $types; do
        f=$dir/duplex-$arch-$t.gguf
        "$BIN" model synth --arch "$arch" --preset tiny --dtype "$t" -o "$f" 2>/dev/null
        "$dir/check" "$f" || fail=1
        if out=$("$LB/bin/llama-simple" -m "$f" -n 8 "Hello" 2>"$dir/simple.err"); then
            echo "  llama-simple:    $(echo "$out" | tr '\n' ' ' | cut -c1-100)"
            echo "  duplex generate: $("$BIN" generate --model "$f" --prompt Hello -n 8 2>/dev/null |
                tr '\n' ' ' | cut -c1-100)"
        else
            echo "  llama-simple FAILED on $f:"; tail -5 "$dir/simple.err"; fail=1
        fi
    done
done

echo "== 2. quantisers: duplex against ggml_quantize_chunk"
"$dir/check" --quant || fail=1

echo "== 3. files llama-quantize writes, read by duplex"
"$BIN" model synth --preset tiny --dtype f32 -o "$dir/f32.gguf" 2>/dev/null
for t in $types; do
    T=$(echo "$t" | tr a-z A-Z)
    f=$dir/llama-quantize-$t.gguf
    "$LB/bin/llama-quantize" --pure "$dir/f32.gguf" "$f" "$T" >"$dir/quantize.log" 2>&1 ||
        { echo "llama-quantize $T failed:"; tail -5 "$dir/quantize.log"; fail=1; continue; }
    "$dir/check" "$f" || fail=1
    if info=$("$BIN" model info "$f" 2>&1); then
        echo "  duplex model info: $(echo "$info" | grep '^weights:' | sed 's/  */ /g')"
    else
        echo "  duplex model info FAILED: $info"; fail=1
    fi
    "$BIN" generate --model "$f" --prompt Hello -n 8 >/dev/null 2>"$dir/gen.err" ||
        { echo "  duplex generate FAILED:"; cat "$dir/gen.err"; fail=1; }
done
# the super-block formats need rows of 256: the small preset's shapes (two
# layers) are multiples of it
"$BIN" model synth --preset small --layers 2 --dtype f32 -o "$dir/f32-small.gguf" 2>/dev/null
for T in Q4_K_M Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS; do
    f=$dir/llama-quantize-$T.gguf
    pure=--pure
    [ "$T" = Q4_K_M ] && pure=
    "$LB/bin/llama-quantize" $pure "$dir/f32-small.gguf" "$f" "$T" >"$dir/quantize.log" 2>&1 ||
        { echo "llama-quantize $T failed:"; tail -5 "$dir/quantize.log"; fail=1; continue; }
    "$dir/check" "$f" || fail=1
    if info=$("$BIN" model info "$f" 2>&1); then
        echo "  $T: duplex model info: $(echo "$info" | grep '^weights:' | sed 's/  */ /g')"
    else
        echo "  $T: duplex model info FAILED: $info"; fail=1; continue
    fi
    if out=$("$LB/bin/llama-simple" -m "$f" -n 8 "Hello" 2>"$dir/simple.err"); then
        echo "  llama-simple:    $(echo "$out" | tr '\n' ' ' | cut -c1-100)"
    fi
    if out=$("$BIN" generate --model "$f" --prompt Hello -n 8 2>"$dir/gen.err"); then
        echo "  duplex generate: $(echo "$out" | tr '\n' ' ' | cut -c1-100)"
    else
        echo "  duplex generate FAILED:"; cat "$dir/gen.err"; fail=1
    fi
done
[ $fail -eq 0 ] && echo "all checks passed" || echo "SOME CHECKS FAILED"
exit $fail
