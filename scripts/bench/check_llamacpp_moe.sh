#!/usr/bin/env bash
# check_llamacpp_moe: duplex's mixture-of-experts forward pass against
# llama.cpp's on the same duplex-written GGUF files.  For every model and
# prompt, both engines continue the same prompt tokens greedily for N_GEN
# tokens; the continuations must be equal token for token.  Where they part,
# the script says at which token, what each chose, and llama.cpp's margin
# between its top two logits there (a tie within the engines' rounding is a
# legitimate divergence, a wide margin a bug).  With NOISE, duplex also
# runs on other kernels, which shows how often rounding alone parts two
# continuations.  A check run by hand, outside the test suite; exits 1 on a
# divergence at a margin over MAX_MARGIN.
#
#   scripts/bench/check_llamacpp_moe.sh LLAMA_DIR
#
# LLAMA_DIR is a llama.cpp source tree built from its public source outside
# this repository (include/llama.h, ggml/include, build/bin/libllama.so):
#   cmake -B build -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF
#   cmake --build build --target llama
# A small program of this script's own, compiled against llama.h, runs
# llama.cpp's side (greedy, its logits' top two per token).
# Environment (defaults in brackets):
#   MODELS   ARCH:PRESET:DTYPE[:LAYERS] files written by `duplex model synth`
#            under models/ if missing, or paths of GGUF files (any word
#            ending in .gguf; scripts/bench/conformance.sh passes dense
#            files of every weight type this way) ["qwen3moe:tiny-moe:f32
#            qwen3moe:tiny-moe:bf16 qwen3moe:tiny-moe:q8_0 llama:tiny-moe:f32
#            llama:tiny-moe:bf16 qwen3moe:qwen3-30b-a3b:bf16:4"]
#   KV [f32]  the KV cache type of both.  f32 by default: with f16 K/V,
#            llama.cpp's attention matmuls round q and the softmax's
#            probabilities to f16 (it converts an activation to the other
#            operand's type), duplex's do not — a difference of the engines'
#            attention, not of the experts, that f32 K/V takes away
#   NOISE [avx2]  also run duplex with these kernels (DUPLEX_KERNELS) and
#            count where its continuation parts from duplex's default ones:
#            how often rounding alone (another summation order) flips a
#            greedy token, the floor to read llama.cpp's divergences against;
#            empty: not run
#   MAX_MARGIN [0.1]  the widest llama.cpp top-2 margin a divergence may
#            have (and duplex's token must be llama.cpp's second): on the
#            random-weight 4-layer qwen3-30b-a3b at Q8_0, duplex's own AVX2
#            and AVX-512 kernels give logits up to ~0.08 apart (a rounding
#            difference that flips one expert of one token moves the output
#            far more than rounding does in a dense model)
#   N_GEN [32]  THREADS [2]  SEED (synth) [1]
#   DUPLEX_BIN [build/release/duplex]
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//; /^set -e/d'; exit 2; }
LLAMA_DIR=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
BIN=${DUPLEX_BIN:-build/release/duplex}
MODELS=${MODELS:-"qwen3moe:tiny-moe:f32 qwen3moe:tiny-moe:bf16 qwen3moe:tiny-moe:q8_0 llama:tiny-moe:f32 llama:tiny-moe:bf16 qwen3moe:qwen3-30b-a3b:bf16:4"}
N_GEN=${N_GEN:-32}
THREADS=${THREADS:-2}
MAX_MARGIN=${MAX_MARGIN:-0.1}
SEED=${SEED:-1}
KV=${KV:-f32}
NOISE=${NOISE-avx2}
LIB=$LLAMA_DIR/build/bin
[ -f "$LLAMA_DIR/include/llama.h" ] && [ -f "$LIB/libllama.so" ] ||
    { echo "check_llamacpp_moe: no llama.h / build/bin/libllama.so under $LLAMA_DIR" >&2; exit 1; }
[ -x "$BIN" ] || make -s -j"$(nproc)"
dir=$(mktemp -d /tmp/duplex-moe-check.XXXXXX)
trap 'rm -rf "$dir"' EXIT

# llama.cpp's side: model, tokens, threads, KV type (f16|f32), prompt token
# ids in; per generated token "id logit second_id second_logit" out.  Greedy
# with ties to the lower id, no EOS stop (duplex runs with --ignore-eos).
cat >"$dir/greedy.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"
static void quiet(enum ggml_log_level l, const char *t, void *u) { (void)l; (void)t; (void)u; }
int main(int argc, char **argv)
{
    if (argc < 6) return 2;
    int n_gen = atoi(argv[2]), threads = atoi(argv[3]), n = argc - 5;
    llama_token *toks = malloc(sizeof *toks * (size_t)(n + n_gen));
    for (int i = 0; i < n; i++) toks[i] = atoi(argv[5 + i]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + n_gen + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)(n + 16);
    cp.n_threads = cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = argv[4][1] == '3' ? GGML_TYPE_F32 : GGML_TYPE_F16;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) return 1;
    int V = llama_vocab_n_tokens(llama_model_get_vocab(m));
    struct llama_batch b = llama_batch_get_one(toks, n);
    for (int g = 0; g < n_gen; g++) {
        if (llama_decode(c, b)) return 1;
        const float *lg = llama_get_logits_ith(c, -1);
        int a = 0, s = -1;
        for (int i = 1; i < V; i++)
            if (lg[i] > lg[a]) s = a, a = i;
            else if (s < 0 || lg[i] > lg[s]) s = i;
        printf("%d %.6f %d %.6f\n", a, lg[a], s, lg[s]);
        toks[n + g] = a;
        b = llama_batch_get_one(&toks[n + g], 1);
    }
    llama_free(c);
    llama_model_free(m);
    return 0;
}
EOF
cc -O2 -o "$dir/greedy" "$dir/greedy.c" -I"$LLAMA_DIR/include" -I"$LLAMA_DIR/ggml/include" \
    -L"$LIB" -lllama -Wl,-rpath,"$LIB"

PROMPTS=(
    "The prefill node"
    "Once upon a time, in a land far away,"
    "def fibonacci(n):"
    "KV cache blocks move both ways between the nodes, and"
    "1, 2, 3, 4, 5,"
    "The capital of France is"
    "In a mixture of experts, each token is routed to"
    "Hello, world! 12345"
)

echo "check_llamacpp_moe: $N_GEN greedy tokens per prompt, ${#PROMPTS[@]} prompts, $THREADS threads, KV $KV;" \
    "llama.cpp at $LLAMA_DIR; $(uname -n), load $(cut -d' ' -f1-3 /proc/loadavg)"
bad=0
for spec in $MODELS; do
    IFS=: read -r arch preset dtype layers <<<"$spec"
    f=models/moe-$arch-$preset${layers:+-${layers}l}-$dtype.gguf
    case $spec in *.gguf) f=$spec ;; esac
    if [ ! -f "$f" ]; then
        mkdir -p models
        "$BIN" model synth --arch "$arch" --preset "$preset" --dtype "$dtype" --seed "$SEED" \
            ${layers:+--layers "$layers"} -o "$f" >/dev/null 2>&1
    fi
    equal=0 total=0 self_equal=0
    for p in "${PROMPTS[@]}"; do
        total=$((total + 1))
        read -r -a ids <<<"$("$BIN" tokenize --model "$f" --ids --text "$p" 2>/dev/null)"
        read -r -a dup <<<"$("$BIN" generate --model "$f" --prompt "$p" -n "$N_GEN" --ignore-eos \
            --ids --threads "$THREADS" --kv-dtype "$KV" 2>/dev/null)"
        "$dir/greedy" "$f" "$N_GEN" "$THREADS" "$KV" "${ids[@]}" >"$dir/llama.out"
        if [ -n "$NOISE" ]; then
            other=$(DUPLEX_KERNELS=$NOISE "$BIN" generate --model "$f" --prompt "$p" -n "$N_GEN" \
                --ignore-eos --ids --threads "$THREADS" --kv-dtype "$KV" 2>/dev/null)
            if [ "$(echo $other)" = "${dup[*]}" ]; then self_equal=$((self_equal + 1)); else
                read -r -a o <<<"$other"
                for ((j = 0; j < N_GEN; j++)); do [ "${o[$j]:-}" = "${dup[$j]:-}" ] || break; done
                echo "  $f: '$p': duplex with $NOISE kernels parts from its default ones at token $j"
            fi
        fi
        i=0 parted=
        while read -r a la s ls; do
            if [ "${dup[$i]:-none}" != "$a" ]; then
                margin=$(awk -v a="$la" -v b="$ls" 'BEGIN { printf "%.6f", a - b }')
                rank=$([ "${dup[$i]:-none}" = "$s" ] && echo "its second choice" || echo "not its top 2")
                echo "  $f: '$p': token $i differs: duplex ${dup[$i]:-none}, llama.cpp $a" \
                    "(llama.cpp's top-2 margin $margin; duplex's token is $rank)"
                if awk -v m="$margin" -v x="$MAX_MARGIN" 'BEGIN { exit !(m > x) }' || [ "$rank" != "its second choice" ]; then
                    bad=1
                fi
                parted=1
                break
            fi
            i=$((i + 1))
        done <"$dir/llama.out"
        [ -n "$parted" ] || equal=$((equal + 1))
    done
    echo "$f: $equal of $total prompts equal to llama.cpp for all $N_GEN tokens${NOISE:+; duplex with $NOISE kernels equal to its default ones on $self_equal}"
done
[ "$bad" -eq 0 ] && echo "check_llamacpp_moe: no divergence beyond a near tie" ||
    { echo "check_llamacpp_moe: a divergence at a margin over $MAX_MARGIN, or to a token outside llama.cpp's top 2" >&2; exit 1; }
