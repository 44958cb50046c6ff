#!/usr/bin/env bash
# check_llamacpp_types: duplex's weight types against llama.cpp's, from a
# llama.cpp build made from its public source outside this repository.  Not
# part of the test suite (which must not need llama.cpp); prints what it
# checked and exits non-zero on any mismatch.
#
#   scripts/bench/check_llamacpp_types.sh LLAMA_BUILD_DIR
#   PARTS=2 scripts/bench/check_llamacpp_types.sh LLAMA_BUILD_DIR
#
# LLAMA_BUILD_DIR holds bin/llama-simple, bin/llama-quantize and
# bin/libggml-base.so; the headers are taken from LLAMA_SRC (default: the
# build directory's parent).  It checks, for Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q8_0
# and the super-block types Q6_K Q5_K Q4_K Q3_K Q2_K IQ4_XS:
#  1. files written by `duplex model synth --dtype T` (qwen3 and llama
#     shapes): ggml's own GGUF reader finds every tensor, and ggml's type
#     traits dequantise each to exactly duplex's values (check_llamacpp_types.c);
#     llama-simple loads each file and generates 8 greedy tokens from it,
#     printed next to `duplex generate`'s (informative: the two engines'
#     float sums differ, so long outputs need not agree); the K-quant
#     presets on tiny-k, whose rows are multiples of 256;
#  2. duplex's quantisers against ggml_quantize_chunk (llama-quantize's
#     path) on random rows of three kinds: bytes compared (blocks and rows
#     byte-identical, the largest difference of the values where not), each
#     side's dequantisation of the other's bytes (must be bit-identical);
#  3. duplex's f32 model quantised by llama-quantize --pure to each type:
#     ggml and duplex dequantise every tensor to the same values, and duplex
#     loads and runs it (`model info`, `generate`), and a Q4_K_M mixture
#     likewise.
# Environment: DUPLEX_BIN [build/release/duplex], KEEP=1 keeps the files,
# PARTS [1 2 3] the parts to run (PARTS=2 needs only libggml-base.so).
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//; /^set -e/d'; exit 2; }
LB=$(cd "$1" && pwd)
SRC=${LLAMA_SRC:-$LB/..}
cd "$(dirname "$0")/../.."
BIN=${DUPLEX_BIN:-build/release/duplex}
PARTS=${PARTS:-1 2 3}
part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
need="bin/libggml-base.so"
if part 1 || part 3; then
    need="$need bin/llama-simple bin/llama-quantize"
    [ -x "$BIN" ] || make -s -j"$(nproc)"
fi
for f in $need; do
    [ -e "$LB/$f" ] || { echo "check_llamacpp_types: no $LB/$f" >&2; exit 1; }
done
dir=$(mktemp -d /tmp/duplex-llamacpp-types.XXXXXX)
trap '[ -n "${KEEP:-}" ] && echo "files in $dir" || rm -rf "$dir"' EXIT
export LD_LIBRARY_PATH=$LB/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# -ffp-contract=off as the Makefile has it: duplex's quantisers are plain
# f32 arithmetic, like ggml-base's (built without FMA)
cc -std=c11 -D_GNU_SOURCE -O2 -ffp-contract=off -Wall -Wextra -Werror -I"$SRC/ggml/include" \
    -Isrc scripts/bench/check_llamacpp_types.c src/base/dx_dtype.c src/base/dx_quant.c \
    src/base/dx_kquant.c src/base/dx_half.c src/base/dx_err.c -L"$LB/bin" -lggml-base -lm \
    -o "$dir/check"
fail=0
types="q4_0 q4_1 q5_0 q5_1 iq4_nl q8_0"
ktypes="q6_K q5_K q4_K q3_K q2_K iq4_xs"
# the llama-quantize presets duplex writes, on tiny-k (rows of 256)
kpresets="q6_k q5_k_m q4_k_m q3_k_m q2_k iq4_xs"

part 1 && echo "== 1. files duplex writes, read by ggml and run by llama-simple"
for arch in qwen3 llama; do
    part 1 || break
    for t in $types $kpresets; do
        f=$dir/duplex-$arch-$t.gguf preset=tiny
        case " $kpresets " in *" $t "*) preset=tiny-k ;; esac
        if ! "$BIN" model synth --arch "$arch" --preset $preset --dtype "$t" -o "$f" 2>"$dir/synth.err"; then
            echo "  duplex model synth --dtype $t FAILED:"; cat "$dir/synth.err"; fail=1; continue
        fi
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

if part 2; then
    echo "== 2. quantisers: duplex against ggml_quantize_chunk"
    "$dir/check" --quant || fail=1
fi

# A file llama-quantize wrote ($1, type $2): dequantised alike by both, then
# loaded and run by duplex.
run_quantized() {
    local f=$1
    "$dir/check" "$f" || fail=1
    if info=$("$BIN" model info "$f" 2>&1); then
        echo "  duplex model info: $(echo "$info" | grep '^weights:' | sed 's/  */ /g')"
    else
        echo "  duplex model info FAILED: $(echo "$info" | tail -1)"; fail=1
    fi
    if ! "$BIN" generate --model "$f" --prompt Hello -n 8 >/dev/null 2>"$dir/gen.err"; then
        echo "  duplex generate FAILED:"; tail -2 "$dir/gen.err"; fail=1
    fi
}

if part 3; then
    echo "== 3. files llama-quantize writes, read by duplex"
    # the super-block types need rows of a multiple of 256 (--pure does not
    # fall back): the small preset's widths are 512 and 1536
    "$BIN" model synth --preset tiny --dtype f32 -o "$dir/f32.gguf" 2>/dev/null
    "$BIN" model synth --preset small --dtype f32 -o "$dir/f32-small.gguf" 2>/dev/null
    for t in $types $ktypes q4_k_m; do
        T=$(echo "$t" | tr a-z A-Z)
        f=$dir/llama-quantize-$t.gguf
        src=$dir/f32-small.gguf pure=--pure
        case " $types " in *" $t "*) src=$dir/f32.gguf ;; esac
        [ "$t" = q4_k_m ] && pure=
        "$LB/bin/llama-quantize" $pure "$src" "$f" "$T" >"$dir/quantize.log" 2>&1 ||
            { echo "llama-quantize $T failed:"; tail -5 "$dir/quantize.log"; fail=1; continue; }
        run_quantized "$f" "$t"
    done
fi
[ $fail -eq 0 ] && echo "all checks passed" || echo "SOME CHECKS FAILED"
exit $fail
