/* The llama-quantize presets of `duplex model synth --dtype` (q2_k ...
 * q6_k, iq4_xs): every matrix role's type, layer by layer, for the real
 * shapes and the tiny test presets, against tables derived by hand from
 * llama.cpp's rules (llama_tensor_get_type_impl and tensor_type_fallback in
 * src/llama-quant.cpp), not from duplex's code; the 70B bump; the fallback
 * for rows that are not a multiple of 256; the dry run's listing.
 * scripts/bench/check_llamacpp_mix.sh checks the same rules against
 * llama-quantize itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "model/model.h"
#include "model/synth.h"

/* The tables' one-letter types (below). */
static int code_type(char c)
{
    static const char codes[] = "23456xn8abch";
    static const int types[] = {DX_Q2_K,   DX_Q3_K, DX_Q4_K, DX_Q5_K, DX_Q6_K, DX_IQ4_XS,
                                DX_IQ4_NL, DX_Q8_0, DX_Q4_0, DX_Q5_0, DX_Q5_1, DX_F16};
    const char *p = c ? strchr(codes, c) : NULL;
    if (!p) fail_msg("bad type code '%c'", c);
    return types[p - codes];
}

/* What a preset gives each role: one letter for a role whose type is the
 * same in every layer, one per layer for attn_v and ffn_down.  Letters:
 * 2 3 4 5 6 = q2_K..q6_K, x iq4_xs; the fallbacks n iq4_nl, 8 q8_0, a q4_0,
 * b q5_0, c q5_1, h f16.  `out` NULL: no output.weight (tied). */
typedef struct {
    const char *dtype;
    const char *embd, *out, *q, *k, *o, *gate, *up, *v, *down;
} want_row;

/* How the tables were derived (llama-quant.cpp, no importance matrix), with
 * D the preset's own type (q2_K for q2_k and q2_k_s, q3_K for q3_k_*, q4_K,
 * q5_K for q4_k_*, q5_k_*, q6_K, iq4_xs), gqa = n_head / n_kv_head, X the
 * expert count, i the layer of n, and more(i) = i < n/8 || i >= 7n/8 ||
 * (i - n/8) % 3 == 2 (llama.cpp's use_more_bits; its running attn_v and
 * ffn_down counts are the layer, as it visits tensors by layer):
 *   output, and token_embd when tied: q6_K (q8_0 if the rows do not fit D);
 *     untied token_embd: D.  attn_q, ffn_gate, ffn_up (and _exps): D.
 *   attn_k: q8_0 if X == 8, else D.
 *   attn_v: q2_k: gqa >= 4 ? q4_K : q3_K; q2_k_s: q4_K if gqa >= 4;
 *     q3_k_m: i < 2 ? q5_K : q4_K; q3_k_l: q5_K; iq4_xs: q5_K if gqa >= 4;
 *     q4_k_m, q5_k_m: q6_K if more(i); q4_k_s: q5_K if i < 4; else D; then
 *     q3_K/q4_K -> q5_K in a 70B model; then q8_0 if X == 8.
 *   attn_output: X == 8: q5_K for q2_k, q3_k_s, q3_k_m, q4_k_s, q4_k_m,
 *     iq4_xs, else D; otherwise q2_k: q3_K, q3_k_m: q4_K, q3_k_l: q5_K, D.
 *   ffn_down (and _exps): q2_k: q3_K; q2_k_s: q4_K if i < n/8; q3_k_m:
 *     i < n/16 ? q5_K : q4_K; q3_k_l: q5_K; q4_k_m, q5_k_m: q6_K if
 *     more(i); q4_k_s, iq4_xs: q5_K if i < n/8; else D.
 *   Then rows that are not a multiple of 256: iq4_xs -> iq4_nl, q2_K and
 *   q3_K -> q4_0, q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0.
 * more() is set for layers 0-2, 5, 8, ..., 23, 24-27 of 28; 0, 1, 4, 7, 10,
 * 13, 14, 15 of 16; 0-5, 8, 11, ..., 41, 42-47 of 48; 1 of 2. */

/* qwen3-0.6b: 28 layers, 16/8 heads (gqa 2), tied; rows 1024, 2048, 3072 */
static const want_row k_qwen3_06b[] = {
    {"q2_k", "6", NULL, "2", "2", "3", "2", "2", "3333333333333333333333333333",
     "3333333333333333333333333333"},
    {"q2_k_s", "6", NULL, "2", "2", "2", "2", "2", "2222222222222222222222222222",
     "4442222222222222222222222222"},
    {"q3_k_s", "6", NULL, "3", "3", "3", "3", "3", "3333333333333333333333333333",
     "3333333333333333333333333333"},
    {"q3_k_m", "6", NULL, "3", "3", "4", "3", "3", "5544444444444444444444444444",
     "5444444444444444444444444444"},
    {"q3_k_l", "6", NULL, "3", "3", "5", "3", "3", "5555555555555555555555555555",
     "5555555555555555555555555555"},
    {"q4_k_s", "6", NULL, "4", "4", "4", "4", "4", "5555444444444444444444444444",
     "5554444444444444444444444444"},
    {"q4_k_m", "6", NULL, "4", "4", "4", "4", "4", "6664464464464464464464466666",
     "6664464464464464464464466666"},
    {"q5_k_s", "6", NULL, "5", "5", "5", "5", "5", "5555555555555555555555555555",
     "5555555555555555555555555555"},
    {"q5_k_m", "6", NULL, "5", "5", "5", "5", "5", "6665565565565565565565566666",
     "6665565565565565565565566666"},
    {"q6_k", "6", NULL, "6", "6", "6", "6", "6", "6666666666666666666666666666",
     "6666666666666666666666666666"},
    {"iq4_xs", "6", NULL, "x", "x", "x", "x", "x", "xxxxxxxxxxxxxxxxxxxxxxxxxxxx",
     "555xxxxxxxxxxxxxxxxxxxxxxxxx"},
};

/* llama3.2-1b: 16 layers, 32/8 heads (gqa 4), tied; rows 2048, 2048, 8192 */
static const want_row k_llama32_1b[] = {
    {"q2_k", "6", NULL, "2", "2", "3", "2", "2", "4444444444444444", "3333333333333333"},
    {"q2_k_s", "6", NULL, "2", "2", "2", "2", "2", "4444444444444444", "4422222222222222"},
    {"q3_k_s", "6", NULL, "3", "3", "3", "3", "3", "3333333333333333", "3333333333333333"},
    {"q3_k_m", "6", NULL, "3", "3", "4", "3", "3", "5544444444444444", "5444444444444444"},
    {"q3_k_l", "6", NULL, "3", "3", "5", "3", "3", "5555555555555555", "5555555555555555"},
    {"q4_k_s", "6", NULL, "4", "4", "4", "4", "4", "5555444444444444", "5544444444444444"},
    {"q4_k_m", "6", NULL, "4", "4", "4", "4", "4", "6644644644644666", "6644644644644666"},
    {"q5_k_s", "6", NULL, "5", "5", "5", "5", "5", "5555555555555555", "5555555555555555"},
    {"q5_k_m", "6", NULL, "5", "5", "5", "5", "5", "6655655655655666", "6655655655655666"},
    {"q6_k", "6", NULL, "6", "6", "6", "6", "6", "6666666666666666", "6666666666666666"},
    {"iq4_xs", "6", NULL, "x", "x", "x", "x", "x", "5555555555555555", "55xxxxxxxxxxxxxx"},
};

/* tiny: 2 layers, 4/2 heads, untied; rows 128 (so every matrix falls back)
 * but ffn_down's 256 */
static const want_row k_tiny[] = {
    {"q2_k", "a", "8", "a", "a", "a", "a", "a", "aa", "33"},
    {"q2_k_s", "a", "8", "a", "a", "a", "a", "a", "aa", "22"},
    {"q3_k_s", "a", "8", "a", "a", "a", "a", "a", "aa", "33"},
    {"q3_k_m", "a", "8", "a", "a", "b", "a", "a", "cc", "44"},
    {"q3_k_l", "a", "8", "a", "a", "c", "a", "a", "cc", "55"},
    {"q4_k_s", "b", "8", "b", "b", "b", "b", "b", "cc", "44"},
    {"q4_k_m", "b", "8", "b", "b", "b", "b", "b", "b8", "46"},
    {"q5_k_s", "c", "8", "c", "c", "c", "c", "c", "cc", "55"},
    {"q5_k_m", "c", "8", "c", "c", "c", "c", "c", "c8", "56"},
    {"q6_k", "8", "8", "8", "8", "8", "8", "8", "88", "66"},
    {"iq4_xs", "n", "8", "n", "n", "n", "n", "n", "nn", "xx"},
};

/* tiny-k: tiny with rows of 256, 256, 512: nothing falls back */
static const want_row k_tiny_k[] = {
    {"q2_k", "2", "6", "2", "2", "3", "2", "2", "33", "33"},
    {"q2_k_s", "2", "6", "2", "2", "2", "2", "2", "22", "22"},
    {"q3_k_s", "3", "6", "3", "3", "3", "3", "3", "33", "33"},
    {"q3_k_m", "3", "6", "3", "3", "4", "3", "3", "55", "44"},
    {"q3_k_l", "3", "6", "3", "3", "5", "3", "3", "55", "55"},
    {"q4_k_s", "4", "6", "4", "4", "4", "4", "4", "55", "44"},
    {"q4_k_m", "4", "6", "4", "4", "4", "4", "4", "46", "46"},
    {"q5_k_s", "5", "6", "5", "5", "5", "5", "5", "55", "55"},
    {"q5_k_m", "5", "6", "5", "5", "5", "5", "5", "56", "56"},
    {"q6_k", "6", "6", "6", "6", "6", "6", "6", "66", "66"},
    {"iq4_xs", "x", "6", "x", "x", "x", "x", "x", "xx", "xx"},
};

/* tiny-moe: 2 layers, 4/2 heads, untied, 8 experts (Mixtral's count: attn_k
 * and attn_v q8_0, attn_output q5_K for some); rows 128, experts' down 96:
 * everything falls back.  gate/up/down are the _exps tensors. */
static const want_row k_tiny_moe[] = {
    {"q2_k", "a", "8", "a", "8", "c", "a", "a", "88", "aa"},
    {"q2_k_s", "a", "8", "a", "8", "a", "a", "a", "88", "aa"},
    {"q3_k_s", "a", "8", "a", "8", "c", "a", "a", "88", "aa"},
    {"q3_k_m", "a", "8", "a", "8", "c", "a", "a", "88", "bb"},
    {"q3_k_l", "a", "8", "a", "8", "a", "a", "a", "88", "cc"},
    {"q4_k_s", "b", "8", "b", "8", "c", "b", "b", "88", "bb"},
    {"q4_k_m", "b", "8", "b", "8", "c", "b", "b", "88", "b8"},
    {"q5_k_s", "c", "8", "c", "8", "c", "c", "c", "88", "cc"},
    {"q5_k_m", "c", "8", "c", "8", "c", "c", "c", "88", "c8"},
    {"q6_k", "8", "8", "8", "8", "8", "8", "8", "88", "88"},
    {"iq4_xs", "n", "8", "n", "8", "c", "n", "n", "88", "nn"},
};

#define L48(s) s s s s s s /* 6 x 8 layers */
/* qwen3-30b-a3b: 48 layers, 32/4 heads (gqa 8), untied, 128 experts (not
 * 8: no Mixtral rule); rows 2048, 4096, experts' down 768 */
static const want_row k_qwen3_30b[] = {
    {"q2_k", "2", "6", "2", "2", "3", "2", "2", L48("44444444"), L48("33333333")},
    {"q2_k_s", "2", "6", "2", "2", "2", "2", "2", L48("44444444"),
     "444444222222222222222222222222222222222222222222"},
    {"q3_k_s", "3", "6", "3", "3", "3", "3", "3", L48("33333333"), L48("33333333")},
    {"q3_k_m", "3", "6", "3", "3", "4", "3", "3",
     "554444444444444444444444444444444444444444444444",
     "555444444444444444444444444444444444444444444444"},
    {"q3_k_l", "3", "6", "3", "3", "5", "3", "3", L48("55555555"), L48("55555555")},
    {"q4_k_s", "4", "6", "4", "4", "4", "4", "4",
     "555544444444444444444444444444444444444444444444",
     "555555444444444444444444444444444444444444444444"},
    {"q4_k_m", "4", "6", "4", "4", "4", "4", "4",
     "666666446446446446446446446446446446446446666666",
     "666666446446446446446446446446446446446446666666"},
    {"q5_k_s", "5", "6", "5", "5", "5", "5", "5", L48("55555555"), L48("55555555")},
    {"q5_k_m", "5", "6", "5", "5", "5", "5", "5",
     "666666556556556556556556556556556556556556666666",
     "666666556556556556556556556556556556556556666666"},
    {"q6_k", "6", "6", "6", "6", "6", "6", "6", L48("66666666"), L48("66666666")},
    {"iq4_xs", "x", "6", "x", "x", "x", "x", "x", L48("55555555"),
     "555555xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"},
};
#undef L48

/* The presets' llama_ftype numbers (llama.h) and usual types. */
static const struct {
    const char *name;
    uint32_t ftype;
    int type;
} k_presets[] = {
    {"q2_k", 10, DX_Q2_K},   {"q3_k_s", 11, DX_Q3_K},   {"q3_k_m", 12, DX_Q3_K},
    {"q3_k_l", 13, DX_Q3_K}, {"q4_k_s", 14, DX_Q4_K},   {"q4_k_m", 15, DX_Q4_K},
    {"q5_k_s", 16, DX_Q5_K}, {"q5_k_m", 17, DX_Q5_K},   {"q6_k", 18, DX_Q6_K},
    {"q2_k_s", 21, DX_Q2_K}, {"iq4_xs", 30, DX_IQ4_XS},
};

static void expect_type(const synth_wtypes *w, const synth_shape *s, enum synth_role r, uint32_t il,
                        uint64_t n_in, char code, const char *what)
{
    int got = synth_wtypes_type(w, s, r, il, n_in), want = code_type(code);
    if (got != want)
        fail_msg("%s: %s layer %u: got %s, want %s", w->name, what, il, dx_dtype_name(got),
                 dx_dtype_name(want));
}

/* A role the same in every layer (one letter), or one letter per layer. */
static void expect_layers(const synth_wtypes *w, const synth_shape *s, enum synth_role r,
                          uint64_t n_in, const char *codes, const char *what)
{
    size_t n = strlen(codes);
    if (n != 1 && n != s->n_layer)
        fail_msg("%s: %s: %zu codes for %u layers", w->name, what, n, s->n_layer);
    for (uint32_t il = 0; il < s->n_layer; il++)
        expect_type(w, s, r, il, n_in, codes[n == 1 ? 0 : il], what);
}

static void check_table(const char *preset, enum model_arch arch, const want_row *rows,
                        size_t n_rows)
{
    const synth_preset *p = synth_find_preset(preset);
    assert_non_null(p);
    synth_shape s = synth_shape_of(p, arch, 0);
    uint64_t e = p->n_embd, q = (uint64_t)p->n_head * p->head_dim,
             ff = p->n_expert ? p->n_ff_exp : p->n_ff;
    int moe = p->n_expert > 0;
    assert_int_equal(n_rows, DX_ARRAY_LEN(k_presets));
    for (size_t i = 0; i < n_rows; i++) {
        const want_row *r = &rows[i];
        const synth_wtypes *w = synth_find_wtypes(r->dtype);
        assert_non_null(w);
        expect_type(w, &s, SYNTH_TOKEN_EMBD, 0, e, r->embd[0], "token_embd");
        assert_int_equal(s.tied, r->out == NULL);
        if (r->out) expect_type(w, &s, SYNTH_OUTPUT, 0, e, r->out[0], "output");
        expect_layers(w, &s, SYNTH_ATTN_Q, e, r->q, "attn_q");
        expect_layers(w, &s, SYNTH_ATTN_K, e, r->k, "attn_k");
        expect_layers(w, &s, SYNTH_ATTN_V, e, r->v, "attn_v");
        expect_layers(w, &s, SYNTH_ATTN_OUTPUT, q, r->o, "attn_output");
        expect_layers(w, &s, moe ? SYNTH_FFN_GATE_EXPS : SYNTH_FFN_GATE, e, r->gate, "ffn_gate");
        expect_layers(w, &s, moe ? SYNTH_FFN_UP_EXPS : SYNTH_FFN_UP, e, r->up, "ffn_up");
        expect_layers(w, &s, moe ? SYNTH_FFN_DOWN_EXPS : SYNTH_FFN_DOWN, ff, r->down, "ffn_down");
        for (uint32_t il = 0; il < s.n_layer; il++)
            assert_int_equal(synth_wtypes_type(w, &s, SYNTH_FFN_GATE_INP, il, e), DX_F32);
    }
}

static void test_presets_named(void **state)
{
    (void)state;
    for (size_t i = 0; i < DX_ARRAY_LEN(k_presets); i++) {
        const synth_wtypes *w = synth_find_wtypes(k_presets[i].name);
        assert_non_null(w);
        assert_non_null(w->rule);
        assert_int_equal(w->ftype, k_presets[i].ftype);
        assert_int_equal(w->type, k_presets[i].type);
        assert_int_equal(synth_check_wtypes(k_presets[i].name), 0);
        char bar[16];
        snprintf(bar, sizeof bar, "|%s|", k_presets[i].name);
        char names[256];
        snprintf(names, sizeof names, "|%s|", synth_wtypes_names());
        if (!strstr(names, bar)) fail_msg("'%s' not in %s", k_presets[i].name, names);
    }
    assert_null(synth_find_wtypes("Q4_K_M")); /* lowercase, as --dtype takes them */
    assert_int_equal(synth_check_wtypes("q4_k"), DX_EINVAL);
}

/* The shapes the presets say they have, as a rule sees them. */
static void test_shapes(void **state)
{
    (void)state;
    synth_shape s = synth_shape_of(synth_find_preset("qwen3-0.6b"), MODEL_QWEN3, 0);
    assert_int_equal(s.n_layer, 28);
    assert_int_equal(s.n_head, 16);
    assert_int_equal(s.n_kv_head, 8);
    assert_int_equal(s.n_expert, 0);
    assert_true(s.tied);
    s = synth_shape_of(synth_find_preset("llama3.2-1b"), MODEL_LLAMA, 0);
    assert_int_equal(s.n_layer, 16);
    assert_int_equal(s.n_head / s.n_kv_head, 4);
    s = synth_shape_of(synth_find_preset("qwen3-30b-a3b"), MODEL_QWEN3MOE, 2);
    assert_int_equal(s.n_layer, 2);
    assert_int_equal(s.n_expert, 128);
    assert_false(s.tied);
    const synth_preset *k = synth_find_preset("tiny-k");
    assert_non_null(k);
    assert_int_equal(k->n_embd % 256, 0);
    assert_int_equal((k->n_head * k->head_dim) % 256, 0);
    assert_int_equal(k->n_ff % 256, 0);
}

static void test_qwen3_06b(void **state)
{
    (void)state;
    check_table("qwen3-0.6b", MODEL_QWEN3, k_qwen3_06b, DX_ARRAY_LEN(k_qwen3_06b));
}

static void test_llama32_1b(void **state)
{
    (void)state;
    check_table("llama3.2-1b", MODEL_LLAMA, k_llama32_1b, DX_ARRAY_LEN(k_llama32_1b));
}

static void test_tiny(void **state)
{
    (void)state;
    check_table("tiny", MODEL_QWEN3, k_tiny, DX_ARRAY_LEN(k_tiny));
    check_table("tiny", MODEL_LLAMA, k_tiny, DX_ARRAY_LEN(k_tiny));
    check_table("tiny-k", MODEL_QWEN3, k_tiny_k, DX_ARRAY_LEN(k_tiny_k));
    check_table("tiny-k", MODEL_QWEN2, k_tiny_k, DX_ARRAY_LEN(k_tiny_k));
}

static void test_moe(void **state)
{
    (void)state;
    check_table("tiny-moe", MODEL_QWEN3MOE, k_tiny_moe, DX_ARRAY_LEN(k_tiny_moe));
    check_table("tiny-moe", MODEL_LLAMA, k_tiny_moe, DX_ARRAY_LEN(k_tiny_moe)); /* Mixtral */
    check_table("qwen3-30b-a3b", MODEL_QWEN3MOE, k_qwen3_30b, DX_ARRAY_LEN(k_qwen3_30b));
}

/* llama.cpp's 70B (llama with 80 layers and GQA; qwen2 with 80 layers):
 * attn_v's q3_K and q4_K become q5_K; nothing else changes. */
static void test_70b(void **state)
{
    (void)state;
    const synth_wtypes *q3s = synth_find_wtypes("q3_k_s"), *q4s = synth_find_wtypes("q4_k_s"),
                       *q4m = synth_find_wtypes("q4_k_m"), *q2 = synth_find_wtypes("q2_k"),
                       *q6 = synth_find_wtypes("q6_k");
    synth_shape l70 = {.arch = MODEL_LLAMA, .n_layer = 80, .n_head = 64, .n_kv_head = 8};
    expect_type(q3s, &l70, SYNTH_ATTN_V, 0, 8192, '5', "attn_v");
    expect_type(q3s, &l70, SYNTH_ATTN_V, 79, 8192, '5', "attn_v");
    expect_type(q3s, &l70, SYNTH_ATTN_Q, 0, 8192, '3', "attn_q");
    expect_type(q3s, &l70, SYNTH_FFN_DOWN, 5, 28672, '3', "ffn_down");
    expect_type(q4s, &l70, SYNTH_ATTN_V, 10, 8192, '5', "attn_v");
    /* more(i) of 80: i < 10, i >= 70, (i - 10) % 3 == 2 */
    expect_type(q4m, &l70, SYNTH_ATTN_V, 3, 8192, '6', "attn_v");
    expect_type(q4m, &l70, SYNTH_ATTN_V, 11, 8192, '5', "attn_v");
    expect_type(q4m, &l70, SYNTH_ATTN_V, 12, 8192, '6', "attn_v");
    expect_type(q2, &l70, SYNTH_ATTN_V, 40, 8192, '5', "attn_v"); /* gqa 8: q4_K, bumped */
    expect_type(q6, &l70, SYNTH_ATTN_V, 40, 8192, '6', "attn_v");
    synth_shape q70 = {.arch = MODEL_QWEN2, .n_layer = 80, .n_head = 4, .n_kv_head = 2};
    expect_type(q2, &q70, SYNTH_ATTN_V, 7, 256, '5', "attn_v (qwen2 70B)");
    /* not 70B: qwen3, or llama without GQA (65B), or with 8 experts */
    synth_shape q3 = q70;
    q3.arch = MODEL_QWEN3;
    expect_type(q2, &q3, SYNTH_ATTN_V, 7, 256, '3', "attn_v (qwen3, 80 layers)");
    synth_shape l65 = {.arch = MODEL_LLAMA, .n_layer = 80, .n_head = 64, .n_kv_head = 64};
    expect_type(q2, &l65, SYNTH_ATTN_V, 7, 8192, '3', "attn_v (65B)");
    synth_shape mx = l70;
    mx.n_expert = 8;
    expect_type(q2, &mx, SYNTH_ATTN_V, 7, 8192, '8', "attn_v (8 experts)");
    mx.n_expert = 16;
    expect_type(q3s, &mx, SYNTH_ATTN_V, 7, 8192, '5', "attn_v (16 experts, 70B)");
}

/* llama-quantize's tensor_type_fallback table, and f16 past it. */
static void test_fallback(void **state)
{
    (void)state;
    static const struct {
        int type;
        uint64_t n;
        int want;
    } cases[] = {
        {DX_Q4_K, 256, DX_Q4_K}, {DX_Q4_K, 4096, DX_Q4_K},   {DX_Q4_K, 128, DX_Q5_0},
        {DX_Q5_K, 96, DX_Q5_1},  {DX_Q6_K, 384, DX_Q8_0},    {DX_Q2_K, 128, DX_Q4_0},
        {DX_Q3_K, 160, DX_Q4_0}, {DX_IQ4_XS, 64, DX_IQ4_NL}, {DX_Q6_K, 48, DX_F16},
        {DX_Q8_0, 64, DX_Q8_0},  {DX_Q8_0, 48, DX_F16},      {DX_F32, 7, DX_F32},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(cases); i++)
        if (synth_fallback_type(cases[i].type, cases[i].n) != cases[i].want)
            fail_msg("%s, rows of %llu: got %s, want %s", dx_dtype_name(cases[i].type),
                     (unsigned long long)cases[i].n,
                     dx_dtype_name(synth_fallback_type(cases[i].type, cases[i].n)),
                     dx_dtype_name(cases[i].want));
    /* the plain schemes are what they say, whatever the shape; the router f32 */
    const synth_wtypes *q4 = synth_find_wtypes("q4_0");
    synth_shape s = synth_shape_of(synth_find_preset("tiny-moe"), MODEL_QWEN3MOE, 0);
    assert_int_equal(synth_wtypes_type(q4, &s, SYNTH_OUTPUT, 0, 128), DX_Q4_0);
    assert_int_equal(synth_wtypes_type(q4, &s, SYNTH_ATTN_V, 1, 128), DX_Q4_0);
    assert_int_equal(synth_wtypes_type(q4, &s, SYNTH_FFN_GATE_INP, 1, 128), DX_F32);
}

/* The dry run lists every tensor with its type, says what fell back, and
 * writes nothing. */
static void test_dry_run(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    dx_buf b;
    dx_buf_init(&b, 0);
    synth_config c = {.arch = MODEL_QWEN3,
                      .preset = "tiny",
                      .wtypes = synth_find_wtypes("q4_k_m"),
                      .seed = 1,
                      .list = &b};
    assert_int_equal(synth_write(&c, NULL), 0);
    const char *want[] = {
        "token_embd.weight                q5_0    [128, ",
        "blk.0.attn_norm.weight           f32     [128]\n",
        "blk.1.attn_v.weight              q8_0    [128, 64] (q6_K wanted: rows of 128 are not a "
        "multiple of 256)\n",
        "blk.1.ffn_down.weight            q6_K    [256, 128]\n",
        "\n25 tensors, 13 of them fell back to another type; general.file_type 15\n",
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(want); i++)
        if (!strstr(b.data, want[i])) fail_msg("dry run lacks '%s':\n%s", want[i], b.data);
    dx_buf_reset(&b);
    c.preset = "tiny-k";
    c.wtypes = synth_find_wtypes("q3_k_m");
    assert_int_equal(synth_write(&c, NULL), 0);
    if (!strstr(b.data, "blk.0.ffn_down.weight            q4_K    [512, 256]\n") ||
        !strstr(b.data,
                "\n25 tensors, 0 of them fell back to another type; general.file_type 12\n"))
        fail_msg("tiny-k q3_k_m:\n%s", b.data);
    /* experts: the router f32, the experts' own rows */
    dx_buf_reset(&b);
    c.preset = "tiny-moe";
    c.arch = MODEL_LLAMA;
    c.wtypes = synth_find_wtypes("q4_k_m");
    assert_int_equal(synth_write(&c, NULL), 0);
    if (!strstr(b.data, "blk.1.ffn_gate_inp.weight        f32     [128, 8]\n") ||
        !strstr(b.data, "blk.1.ffn_down_exps.weight       q8_0    [96, 128, 8] (q6_K wanted: "
                        "rows of 96 are not a multiple of 256)\n"))
        fail_msg("tiny-moe q4_k_m:\n%s", b.data);
    dx_buf_free(&b);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* tiny-k is a model the engine loads (here with a plain type). */
static void test_tiny_k_loads(void **state)
{
    (void)state;
    char dir[] = "/tmp/dx_test_synth_mix_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/k.gguf", dir);
    synth_config c = {.arch = MODEL_LLAMA, .preset = "tiny-k", .dtype = DX_Q8_0, .seed = 1};
    assert_int_equal(synth_write(&c, path), 0);
    model *m;
    assert_int_equal(model_load(path, &m), 0);
    assert_int_equal(model_hp(m)->n_embd, 256);
    assert_int_equal(model_hp(m)->head_dim, 64);
    assert_int_equal(model_hp(m)->n_ff, 512);
    assert_int_equal(model_layer_at(m, 1)->w_down.type, DX_Q8_0);
    model_free(m);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_named), cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_qwen3_06b),     cmocka_unit_test(test_llama32_1b),
        cmocka_unit_test(test_tiny),          cmocka_unit_test(test_moe),
        cmocka_unit_test(test_70b),           cmocka_unit_test(test_fallback),
        cmocka_unit_test(test_dry_run),       cmocka_unit_test(test_tiny_k_loads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
