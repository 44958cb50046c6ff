#!/usr/bin/env bash
# check_llamacpp_mix: the per-tensor types of `duplex model synth --dtype
# q4_k_m` and the other llama-quantize presets against llama-quantize's own
# choice, from a llama.cpp build outside this repository.  Not part of the
# test suite (which must not need llama.cpp); prints every mismatch and exits
# non-zero on any.
#
#   scripts/bench/check_llamacpp_mix.sh LLAMA_BUILD_DIR
#
# LLAMA_BUILD_DIR holds bin/llama-quantize.  For each shape (the tiny
# presets at several layer counts and architectures, llama with 80 layers as
# llama.cpp's 70B, 0.6b, qwen3-0.6b, llama3.2-1b, tiny-moe as qwen3moe and
# Mixtral, qwen3-30b-a3b with 2 layers) duplex writes the model unquantised
# (f32, bf16 for the large ones), and for each preset
#  1. `llama-quantize --dry-run IN PRESET` lists the type it gives each
#     tensor; `duplex model synth ... --dtype preset --dry-run` lists
#     duplex's; the two lists must be equal, tensor for tensor;
#  2. on the smaller shapes llama-quantize also writes the file, and the
#     types in it (scripts/bench/gguf_types.py) must be its dry run's, with
#     general.file_type duplex's number for the preset (Q2_K_S is left out:
#     llama-quantize writes it only with an importance matrix);
#  3. where duplex can quantise to every type of the preset (the
#     super-block quantisers), it writes the file too, and its types and
#     file type must be those of its dry run; otherwise this says it skipped.
# Environment: DUPLEX_BIN [build/release/duplex], KEEP=1 keeps the files,
# QUICK=1 only the tiny shapes.
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//; /^set -e/d'; exit 2; }
LB=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
BIN=${DUPLEX_BIN:-build/release/duplex}
[ -x "$BIN" ] || make -s -j2
Q=$LB/bin/llama-quantize
[ -x "$Q" ] || { echo "check_llamacpp_mix: no $Q" >&2; exit 1; }
dir=$(mktemp -d /tmp/duplex-llamacpp-mix.XXXXXX)
trap '[ -n "${KEEP:-}" ] && echo "files in $dir" || rm -rf "$dir"' EXIT
export LD_LIBRARY_PATH=$LB/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
presets="q2_k q2_k_s q3_k_s q3_k_m q3_k_l q4_k_s q4_k_m q5_k_s q5_k_m q6_k iq4_xs"

# "preset arch layers input-dtype real" (layers 0: the preset's; real 1: also
# have llama-quantize write the files)
shapes=(
    "tiny qwen3 0 f32 1"
    "tiny-k qwen3 0 f32 1"
    "tiny-k qwen3 8 f32 0"
    "tiny-k llama 16 f32 0"
    "tiny-k qwen2 28 f32 0"
    "tiny-k qwen3 48 f32 0"
    "tiny-k llama 80 f32 0"
    "tiny-k qwen2 80 f32 0"
    "tiny-k qwen3 80 f32 0"
    "tiny-moe qwen3moe 0 f32 1"
    "tiny-moe llama 0 f32 1"
    "tiny-moe qwen3moe 48 f32 0"
    "tiny-moe llama 32 f32 0"
)
[ -n "${QUICK:-}" ] || shapes+=(
    "0.6b qwen3 0 bf16 0"
    "qwen3-0.6b qwen3 2 bf16 0"
    "llama3.2-1b llama 0 bf16 0"
    "qwen3-30b-a3b qwen3moe 2 bf16 0"
)

fail=0
n_cmp=0
# llama-quantize's dry run as "name type" lines (a tensor it keeps: its own type)
lq_types() {
    sed -nE 's/^\[ *[0-9]+\/ *[0-9]+\] +([^ ]+) +- \[.*, type = +[^ ,]+, .*\(([^)]+)\)$/\1 \2/p; t
        s/^\[ *[0-9]+\/ *[0-9]+\] +([^ ]+) +- \[.*, type = +([^ ,]+), .*/\1 \2/p' "$1"
}
dx_types() { awk 'NF >= 3 && $2 != "tensors," {print $1, $2}' "$1"; }

for s in "${shapes[@]}"; do
    read -r preset arch layers idt real <<<"$s"
    lay=(); [ "$layers" = 0 ] || lay=(--layers "$layers")
    tag=$preset-$arch${lay:+-${layers}l}
    in=$dir/$tag-$idt.gguf
    "$BIN" model synth --preset "$preset" --arch "$arch" "${lay[@]}" --dtype "$idt" -o "$in" 2>/dev/null
    line="$tag:"
    unwritable=""
    for p in $presets; do
        P=$(echo "$p" | tr a-z A-Z)
        "$Q" --dry-run "$in" "$P" >"$dir/lq.log" 2>&1 ||
            { echo "  $tag $P: llama-quantize --dry-run failed:"; tail -3 "$dir/lq.log"; fail=1; continue; }
        lq_types "$dir/lq.log" | sort >"$dir/lq.types"
        "$BIN" model synth --preset "$preset" --arch "$arch" "${lay[@]}" --dtype "$p" --dry-run \
            >"$dir/dx.list"
        dx_types "$dir/dx.list" | sort >"$dir/dx.types"
        n_cmp=$((n_cmp + $(wc -l <"$dir/dx.types")))
        if ! diff -q "$dir/lq.types" "$dir/dx.types" >/dev/null; then
            echo "  MISMATCH $tag $p (llama-quantize < > duplex):"
            diff "$dir/lq.types" "$dir/dx.types" | grep '^[<>]' | head -20
            fail=1
        fi
        ft=$(sed -n 's/.*general.file_type \([0-9]*\)$/\1/p' "$dir/dx.list")
        # 2. the file llama-quantize writes has the dry run's types
        if [ "$real" = 1 ] && [ "$p" != q2_k_s ]; then
            "$Q" "$in" "$dir/lq.gguf" "$P" >"$dir/lqw.log" 2>&1 ||
                { echo "  $tag $P: llama-quantize failed:"; tail -3 "$dir/lqw.log"; fail=1; continue; }
            python3 scripts/bench/gguf_types.py "$dir/lq.gguf" >"$dir/lqw.types"
            if ! grep -v '^general' "$dir/lqw.types" | sort | diff -q - "$dir/lq.types" >/dev/null ||
                ! grep -qx "general.file_type $ft" "$dir/lqw.types"; then
                echo "  MISMATCH $tag $p: llama-quantize's file differs from its dry run or" \
                    "file type $ft: $(grep '^general' "$dir/lqw.types")"
                fail=1
            fi
            rm -f "$dir/lq.gguf"
        fi
        # 3. the file duplex writes has its dry run's types
        if [ "$real" = 1 ]; then
            if "$BIN" model synth --preset "$preset" --arch "$arch" "${lay[@]}" --dtype "$p" \
                -o "$dir/dx.gguf" 2>"$dir/dx.err"; then
                python3 scripts/bench/gguf_types.py "$dir/dx.gguf" >"$dir/dxw.types"
                if ! grep -v '^general' "$dir/dxw.types" | sort | diff -q - "$dir/dx.types" \
                    >/dev/null || ! grep -qx "general.file_type $ft" "$dir/dxw.types"; then
                    echo "  MISMATCH $tag $p: duplex's file differs from its dry run"
                    fail=1
                fi
                rm -f "$dir/dx.gguf"
            elif grep -q "cannot write type" "$dir/dx.err"; then
                unwritable="$unwritable $p"
            else
                echo "  $tag $p: duplex model synth failed: $(cat "$dir/dx.err")"
                fail=1
            fi
        fi
    done
    echo "$line $(echo $presets | wc -w) presets compared${unwritable:+; not written by duplex (a type it cannot quantise yet):$unwritable}"
    rm -f "$in"
done
echo "$n_cmp tensor types compared"
[ $fail -eq 0 ] && echo "all checks passed: duplex's types are llama-quantize's" || echo "SOME CHECKS FAILED"
exit $fail
