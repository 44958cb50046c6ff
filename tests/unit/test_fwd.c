/* Forward pass: agreement with a naive double-precision reference, and
 * bit-exact batch invariance (memcmp of logits and KV blocks) across
 * chunking, batching, prefix reuse and thread counts, for every weight dtype
 * and every kernel ISA this CPU has — dense models and mixtures of experts
 * (whose reference routes on its own and must agree with the engine's
 * routing, and whose tokens are also checked in batches built to share
 * every expert, or none). */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_tpool.h"
#include "engine/fwd.h"
#include "engine/kern/kern.h"
#include "engine/kv_pool.h"
#include "engine_test_util.h"
#include "kern_test_isa.h"

#define NP 69 /* prompt length: not a multiple of the block size */
#define BS 16

/* ---------- naive reference (double, no paging) ---------- */

static void row_f64(const model_tensor *t, uint64_t r, double *out)
{
    size_t n = t->ne[0];
    float *tmp = malloc(n * sizeof(float));
    dx_dtype_to_f32_row(t->type, (const uint8_t *)t->data + r * dx_dtype_row_bytes(t->type, n), tmp,
                        n);
    for (size_t i = 0; i < n; i++) out[i] = tmp[i];
    free(tmp);
}

static void matvec(const model_tensor *w, const double *x, double *y)
{
    double *row = malloc(w->ne[0] * sizeof(double));
    for (uint64_t o = 0; o < w->ne[1]; o++) {
        row_f64(w, o, row);
        double s = 0;
        for (uint64_t k = 0; k < w->ne[0]; k++) s += row[k] * x[k];
        y[o] = s;
    }
    free(row);
}

static void rmsnorm(const double *x, const model_tensor *w, double eps, size_t n, double *y)
{
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    const float *wf = w->data;
    for (size_t i = 0; i < n; i++) y[i] = x[i] * r * wf[i];
}

/* The engine's routing of the tokens the reference computes,
 * [n_layer][n][n_expert_used], or NULL; and how many (token, layer) the
 * reference routed to other experts than the engine without a near tie. */
static const int32_t *g_route;
static int g_route_diff;

/* A view of expert e's matrix in a stacked tensor. */
static model_tensor expert(const model_tensor *t, uint32_t e)
{
    size_t mat = dx_dtype_row_bytes(t->type, t->ne[0]) * t->ne[1];
    return (model_tensor){(const uint8_t *)t->data + e * mat, t->type, {t->ne[0], t->ne[1], 1}};
}

/* The MoE FFN of token t of n at layer l, in double: softmax over the
 * router, the k most probable, normalised, their SwiGLU FFNs weighted.
 * Where the k-th and (k+1)-th probabilities are within 1e-6 (f32 may rank
 * them otherwise), the engine's experts are used. */
static void moe_ref(const model *m, uint32_t l, int t, int n, const double *xb, double *o)
{
    const model_hparams *hp = model_hp(m);
    const model_layer *L = model_layer_at(m, l);
    int X = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp, E = hp->n_embd;
    double lg[MODEL_MAX_EXPERTS], p[MODEL_MAX_EXPERTS], mx = -1e300, sum = 0;
    int ids[MODEL_MAX_EXPERTS_USED + 1], taken[MODEL_MAX_EXPERTS] = {0};
    matvec(&L->ffn_gate_inp, xb, lg);
    for (int i = 0; i < X; i++) mx = fmax(mx, lg[i]);
    for (int i = 0; i < X; i++) sum += p[i] = exp(lg[i] - mx);
    for (int j = 0; j < K + 1 && j < X; j++) {
        int best = -1;
        for (int i = 0; i < X; i++)
            if (!taken[i] && (best < 0 || p[i] > p[best])) best = i;
        taken[best] = 1;
        ids[j] = best;
    }
    if (g_route) {
        const int32_t *eng = g_route + ((size_t)l * n + t) * K;
        int same = 1;
        for (int j = 0; j < K; j++) {
            int found = 0;
            for (int i = 0; i < K; i++) found |= eng[i] == ids[j];
            same &= found;
        }
        double margin = K < X ? (p[ids[K - 1]] - p[ids[K]]) / sum : 1;
        if (!same && margin < 1e-6)
            for (int j = 0; j < K; j++) ids[j] = eng[j];
        else if (!same)
            g_route_diff++;
    }
    double wsum = 0;
    for (int j = 0; j < K; j++) wsum += p[ids[j]];
    double *g = calloc(F, 8), *u = calloc(F, 8), *y = calloc(E, 8);
    for (int i = 0; i < E; i++) o[i] = 0;
    for (int j = 0; j < K; j++) {
        model_tensor wg = expert(&L->ffn_gate_exps, ids[j]), wu = expert(&L->ffn_up_exps, ids[j]),
                     wd = expert(&L->ffn_down_exps, ids[j]);
        matvec(&wg, xb, g);
        matvec(&wu, xb, u);
        for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        matvec(&wd, g, y);
        double w = p[ids[j]] / (hp->expert_weights_norm ? wsum : sum);
        for (int i = 0; i < E; i++) o[i] += w * y[i];
    }
    free(g), free(u), free(y);
}

/* Llama 3 rope scaling for the reference, or NULL: set by the test. */
static const synth_rope_scaling *g_rs;

/* transformers' _compute_llama3_parameters, written from its definition
 * (not from the converter's divisors that synth and the engine use). */
static double inv_freq(int i, int D, double base)
{
    double f = pow(base, -2.0 * i / D);
    if (!g_rs) return f;
    double factor = g_rs->factor, lo = g_rs->low_freq_factor, hi = g_rs->high_freq_factor;
    double old = g_rs->original_context, wl = 2 * M_PI / f;
    if (wl > old / lo) return f / factor;
    if (wl < old / hi) return f;
    double smooth = (old / wl - lo) / (hi - lo);
    return (1 - smooth) * f / factor + smooth * f;
}

static void rope(double *x, int D, int pos, double base, int neox)
{
    for (int i = 0; i < D / 2; i++) {
        double th = pos * inv_freq(i, D, base), c = cos(th), s = sin(th);
        int a = neox ? i : 2 * i, b = neox ? i + D / 2 : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

/* logits [n][V] for every position */
static void reference(const model *m, const int32_t *toks, int n, double *logits)
{
    const model_hparams *hp = model_hp(m);
    int E = hp->n_embd, D = hp->head_dim, H = hp->n_head, KV = hp->n_kv_head;
    int F = hp->n_expert ? 1 : hp->n_ff;
    int V = hp->n_vocab;
    double *x = calloc((size_t)n * E, 8), *xb = calloc(E, 8), *q = calloc((size_t)n * H * D, 8);
    double *k = calloc((size_t)n * KV * D, 8), *v = calloc((size_t)n * KV * D, 8);
    double *att = calloc((size_t)H * D, 8), *o = calloc(E, 8), *g = calloc(F, 8), *u = calloc(F, 8);
    double *sc = calloc(n, 8);
    for (int t = 0; t < n; t++) row_f64(model_tok_embd(m), toks[t], x + (size_t)t * E);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const model_layer *L = model_layer_at(m, l);
        for (int t = 0; t < n; t++) {
            rmsnorm(x + (size_t)t * E, &L->attn_norm, hp->rms_eps, E, xb);
            double *qt = q + (size_t)t * H * D, *kt = k + (size_t)t * KV * D,
                   *vt = v + (size_t)t * KV * D;
            matvec(&L->wq, xb, qt);
            matvec(&L->wk, xb, kt);
            matvec(&L->wv, xb, vt);
            if (hp->qkv_bias)
                for (int i = 0; i < H * D || i < KV * D; i++) {
                    if (i < H * D) qt[i] += ((const float *)L->bq.data)[i];
                    if (i < KV * D) kt[i] += ((const float *)L->bk.data)[i];
                    if (i < KV * D) vt[i] += ((const float *)L->bv.data)[i];
                }
            for (int h = 0; h < H; h++) {
                if (hp->qk_norm) rmsnorm(qt + h * D, &L->q_norm, hp->rms_eps, D, qt + h * D);
                rope(qt + h * D, D, t, hp->rope_base, hp->rope_neox);
            }
            for (int h = 0; h < KV; h++) {
                if (hp->qk_norm) rmsnorm(kt + h * D, &L->k_norm, hp->rms_eps, D, kt + h * D);
                rope(kt + h * D, D, t, hp->rope_base, hp->rope_neox);
            }
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < H; h++) {
                int kh = h / (H / KV);
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < D; d++)
                        s += q[((size_t)t * H + h) * D + d] * k[((size_t)j * KV + kh) * D + d];
                    sc[j] = s / sqrt((double)D);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++) acc += sc[j] * v[((size_t)j * KV + kh) * D + d];
                    att[h * D + d] = acc / sum;
                }
            }
            matvec(&L->wo, att, o);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += o[i];
        }
        for (int t = 0; t < n; t++) {
            rmsnorm(x + (size_t)t * E, &L->ffn_norm, hp->rms_eps, E, xb);
            if (hp->n_expert) {
                moe_ref(m, l, t, n, xb, o);
            } else {
                matvec(&L->w_gate, xb, g);
                matvec(&L->w_up, xb, u);
                for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
                matvec(&L->w_down, g, o);
            }
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += o[i];
        }
    }
    for (int t = 0; t < n; t++) {
        rmsnorm(x + (size_t)t * E, model_output_norm(m), hp->rms_eps, E, xb);
        matvec(model_output(m), xb, logits + (size_t)t * V);
    }
    free(x), free(xb), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(sc);
}

/* ---------- harness ---------- */

typedef struct {
    const model *m;
    kv_pool *pool;
    dx_tpool *tp;
    fwd *f;
    uint32_t V;
} rig;

static void rig_init(rig *r, const model *m, int threads, int kv_dtype)
{
    const model_hparams *hp = model_hp(m);
    r->m = m;
    r->V = hp->n_vocab;
    kv_pool_config pc = {.n_layer = hp->n_layer,
                         .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim,
                         .block_size = BS,
                         .dtype = kv_dtype,
                         .n_blocks = 64};
    assert_int_equal(kv_pool_create(&pc, &r->pool), 0);
    assert_int_equal(dx_tpool_create(threads, &r->tp), 0);
    assert_int_equal(fwd_create(m, r->pool, r->tp, 256, 8, 1024, &r->f), 0);
}

static void rig_free(rig *r)
{
    fwd_destroy(r->f);
    dx_tpool_destroy(r->tp);
    kv_pool_destroy(r->pool);
}

/* Fresh, zeroed blocks ids[0..n) */
static void fresh_blocks(rig *r, int32_t first, int n, int32_t *ids)
{
    for (int i = 0; i < n; i++) {
        ids[i] = first + i;
        memset(kv_pool_block_ptr(r->pool, ids[i]), 0, kv_pool_block_bytes(r->pool));
    }
}

/* Prefill toks[0..n) into blocks in chunks of `chunk`, logits of every token. */
static void run_chunks(rig *r, const int32_t *blocks, const int32_t *toks, int from, int n,
                       int chunk, float *logits)
{
    for (int p = from; p < n; p += chunk) {
        int c = n - p < chunk ? n - p : chunk;
        fwd_seq s = {blocks, (uint32_t)p, (uint32_t)c, toks + p, 2};
        assert_int_equal(fwd_step(r->f, &s, 1, logits + (size_t)(p - from) * r->V), 0);
    }
}

static void assert_blocks_equal(rig *r, const int32_t *a, const int32_t *b, int n)
{
    for (int i = 0; i < n; i++)
        assert_memory_equal(kv_pool_block_ptr(r->pool, a[i]), kv_pool_block_ptr(r->pool, b[i]),
                            kv_pool_block_bytes(r->pool));
}

static int32_t g_toks[NP], g_other1[30], g_other2[17];

static int setup(void **state)
{
    (void)state;
    return etu_setup();
}

static int teardown(void **state)
{
    (void)state;
    etu_teardown();
    return 0;
}

/* ---------- tests ---------- */

/* The logits of g_toks[0..n) computed in one chunk on a fresh 2-thread rig
 * (malloc'd, [n][n_vocab]); route: NULL, or [n_layer][n][n_expert_used]
 * receiving an MoE model's routing. */
static float *one_chunk_logits(model *m, int n, int32_t *route)
{
    rig r;
    rig_init(&r, m, 2, DX_F32);
    int32_t blocks[8];
    fresh_blocks(&r, 0, 4, blocks);
    float *lg = malloc((size_t)n * model_hp(m)->n_vocab * sizeof(float));
    fwd_set_route_log(r.f, route);
    run_chunks(&r, blocks, g_toks, 0, n, n, lg);
    rig_free(&r);
    return lg;
}

static void check_reference_of(enum model_arch arch, const char *preset, enum kern_isa isa)
{
    model *m = etu_model_p(arch, preset, DX_F32);
    assert_non_null(m);
    const model_hparams *hp = model_hp(m);
    uint32_t V = hp->n_vocab;
    int n = 64;
    etu_tokens(g_toks, n, V, 7);
    int32_t *route =
        hp->n_expert ? malloc((size_t)hp->n_layer * 256 * hp->n_expert_used * 4) : NULL;
    float *lg = one_chunk_logits(m, n, route);
    double *ref = malloc((size_t)n * V * sizeof(double));
    g_route = route;
    g_route_diff = 0;
    reference(m, g_toks, n, ref);
    g_route = NULL;
    if (g_route_diff)
        fail_msg("%s: the reference routed %d (token, layer) pairs to other experts", preset,
                 g_route_diff);
    free(route);
    /* tolerance: f32 arithmetic vs double over 2 layers; logits are O(1-10) */
    double maxdiff = 0, maxref = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        maxdiff = fmax(maxdiff, fabs(lg[i] - ref[i]));
        maxref = fmax(maxref, fabs(ref[i]));
    }
    if (maxdiff > 2e-3 * fmax(1.0, maxref))
        fail_msg("arch %d %s isa %s: max |logit diff| %g (max |logit| %g)", arch, preset,
                 kern_isa_name(isa), maxdiff, maxref);
    free(lg);
    free(ref);
    model_free(m);
}

static void check_reference(enum model_arch arch, enum kern_isa isa)
{
    check_reference_of(arch, "tiny", isa);
}

static void test_reference_qwen3(void **s)
{
    check_reference(MODEL_QWEN3, kti_use(s));
}
static void test_reference_qwen2(void **s)
{
    check_reference(MODEL_QWEN2, kti_use(s));
}
static void test_reference_llama(void **s)
{
    check_reference(MODEL_LLAMA, kti_use(s));
}
static void test_reference_qwen3moe(void **s)
{
    check_reference_of(MODEL_QWEN3MOE, "tiny-moe", kti_use(s));
}
static void test_reference_llama_moe(void **s)
{
    check_reference_of(MODEL_LLAMA, "tiny-moe", kti_use(s));
}

/* Llama 3 rope scaling: the divisors synth writes (rope_freqs.weight, as
 * llama.cpp's converter computes them) give transformers' frequencies, and
 * the engine applies them.  A short original context makes the scaling
 * reach most of the tiny model's dimensions within 64 positions. */
static void test_llama3_rope_scaling(void **state)
{
    (void)state;
    const synth_rope_scaling rs = {8.0f, 1.0f, 4.0f, 64};
    float div[16];
    synth_llama3_rope_factors(&rs, 500000.0f, 32, div);
    g_rs = &rs;
    int scaled = 0, kept = 0;
    for (int i = 0; i < 16; i++) {
        double f = pow(500000.0, -2.0 * i / 32), want = inv_freq(i, 32, 500000.0);
        assert_true(fabs(f / div[i] - want) <= 1e-6 * want);
        scaled += div[i] == 8.0f;
        kept += div[i] == 1.0f;
    }
    assert_true(scaled >= 4 && kept >= 2 && scaled + kept < 16); /* all three bands */
    char path[256];
    snprintf(path, sizeof path, "%s/llama3-rope.gguf", etu_dir);
    synth_config c = {
        .arch = MODEL_LLAMA, .preset = "tiny", .dtype = DX_F32, .seed = 42, .rope_scaling = &rs};
    assert_int_equal(synth_write(&c, path), 0);
    model *m;
    assert_int_equal(model_load(path, &m), 0);
    assert_non_null(model_rope_freqs(m));
    assert_memory_equal(model_rope_freqs(m), div, sizeof div);
    uint32_t V = model_hp(m)->n_vocab;
    int n = 64;
    etu_tokens(g_toks, n, V, 7);
    double *ref = malloc((size_t)n * V * sizeof(double)), *plain = malloc((size_t)n * V * 8);
    reference(m, g_toks, n, ref);
    g_rs = NULL;
    reference(m, g_toks, n, plain);
    float *lg = one_chunk_logits(m, n, NULL);
    double d_scaled = 0, d_plain = 0, maxref = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        d_scaled = fmax(d_scaled, fabs(lg[i] - ref[i]));
        d_plain = fmax(d_plain, fabs(lg[i] - plain[i]));
        maxref = fmax(maxref, fabs(ref[i]));
    }
    if (d_scaled > 2e-3 * fmax(1.0, maxref) || d_plain < 50 * d_scaled)
        fail_msg("max |logit diff| %g from the scaled reference, %g from the unscaled one",
                 d_scaled, d_plain);
    free(lg);
    free(ref);
    free(plain);
    model_free(m);
}

/* One configuration: weight dtype, ISA, threads.  Baseline = one prefill. */
static void check_invariance(const model *m, int threads, int kv_dtype)
{
    rig r;
    rig_init(&r, m, threads, kv_dtype);
    uint32_t V = r.V;
    int nb = (NP + BS - 1) / BS;
    float *base = malloc((size_t)NP * V * 4), *lg = malloc((size_t)(NP + 64) * V * 4);
    int32_t b0[8], b1[8], bo1[8], bo2[8];
    fresh_blocks(&r, 0, nb, b0);
    run_chunks(&r, b0, g_toks, 0, NP, NP, base);
    /* (b) chunks of 1, 7 and 16 */
    const int chunks[] = {1, 7, 16};
    for (int c = 0; c < 3; c++) {
        fresh_blocks(&r, 8, nb, b1);
        run_chunks(&r, b1, g_toks, 0, NP, chunks[c], lg);
        assert_memory_equal(lg, base, (size_t)NP * V * 4);
        assert_blocks_equal(&r, b0, b1, nb);
    }
    /* (c) batched with two other sequences, in one step */
    fresh_blocks(&r, 8, nb, b1);
    fresh_blocks(&r, 16, 2, bo1);
    fresh_blocks(&r, 24, 2, bo2);
    fwd_seq batch[3] = {
        {bo1, 0, 30, g_other1, 2}, {b1, 0, NP, g_toks, 2}, {bo2, 0, 17, g_other2, 1}};
    assert_int_equal(fwd_step(r.f, batch, 3, lg), 0);
    assert_memory_equal(lg + (size_t)30 * V, base, (size_t)NP * V * 4);
    assert_blocks_equal(&r, b0, b1, nb);
    /* ... and decoding next to another sequence's prefill */
    fresh_blocks(&r, 8, nb, b1);
    run_chunks(&r, b1, g_toks, 0, NP - 1, NP - 1, lg);
    fresh_blocks(&r, 16, 2, bo1);
    fwd_seq mix[2] = {{bo1, 0, 30, g_other1, 1}, {b1, NP - 1, 1, g_toks + NP - 1, 1}};
    assert_int_equal(fwd_step(r.f, mix, 2, lg), 0);
    assert_memory_equal(lg + V, base + (size_t)(NP - 1) * V, (size_t)V * 4);
    assert_blocks_equal(&r, b0, b1, nb);
    /* (d) the first 3 blocks taken from another sequence (the prefix cache's
     * case): the new sequence's table starts with the baseline's blocks */
    int32_t shared[8] = {b0[0], b0[1], b0[2]};
    fresh_blocks(&r, 32, nb - 3, shared + 3);
    run_chunks(&r, shared, g_toks, 3 * BS, NP, NP, lg);
    assert_memory_equal(lg, base + (size_t)3 * BS * V, (size_t)(NP - 3 * BS) * V * 4);
    assert_blocks_equal(&r, b0 + 3, shared + 3, nb - 3);
    free(base);
    free(lg);
    rig_free(&r);
}

static void check_model_invariance(model *m, int q8_kv)
{
    assert_non_null(m);
    uint32_t V = model_hp(m)->n_vocab;
    etu_tokens(g_toks, NP, V, 11);
    etu_tokens(g_other1, 30, V, 12);
    etu_tokens(g_other2, 17, V, 13);
    for (int th = 1; th <= 2; th++) check_invariance(m, th, DX_F16);
    if (q8_kv) check_invariance(m, 2, DX_Q8_0); /* quantised once, when stored: the same bits */
    model_free(m);
}

static void test_batch_invariance(void **state)
{
    enum kern_isa isa = kti_use(state);
    const int dtypes[] = {DX_F32, DX_F16, DX_BF16, DX_Q8_0, DX_Q4_0, DX_IQ4_NL, -1 /* mixture */};
    for (size_t d = 0; d < DX_ARRAY_LEN(dtypes); d++)
        check_model_invariance(
            dtypes[d] < 0 ? etu_model_mix(MODEL_QWEN3) : etu_model(MODEL_QWEN3, dtypes[d]), 1);
    /* the super-block formats, on tiny-k (every row a multiple of 256):
     * Q4_K_M (q4_K with q6_K attn_v / ffn_down / output), Q3_K_M (q3_K,
     * q4_K, q5_K), Q2_K (q2_K, q3_K, q4_K) and IQ4_XS; the scalar kernels
     * (test_kern_mm holds them to the vector ones bit for bit) on Q4_K_M
     * alone, as they take seconds per model */
    const char *schemes[] = {"q4_k_m", "q3_k_m", "q2_k", "iq4_xs"};
    size_t n_schemes = isa == KERN_SCALAR ? 1 : DX_ARRAY_LEN(schemes);
    for (size_t d = 0; d < n_schemes; d++)
        check_model_invariance(etu_model_scheme(MODEL_QWEN3, "tiny-k", schemes[d]), d == 0);
}

/* KERN_AMX: its kernels take the super-block formats' groups of 16 tokens
 * x 16 rows (the prefill chunks here), the tiles the rest; the invariance
 * again on mixtures holding every one of them. */
static void test_batch_invariance_amx(void **state)
{
    kti_use(state);
    check_model_invariance(etu_model_scheme(MODEL_QWEN3, "tiny-k", "q4_k_m"), 1);
    check_model_invariance(etu_model_scheme(MODEL_QWEN3, "tiny-k", "q5_k_m"), 0);
    check_model_invariance(etu_model_scheme(MODEL_QWEN3, "tiny-k", "iq4_xs"), 0);
    check_model_invariance(etu_model_scheme(MODEL_QWEN3, "tiny-k", "q3_k_m"), 0);
    check_model_invariance(etu_model_scheme(MODEL_QWEN3, "tiny-k", "q2_k"), 0);
}

/* Same logits and KV with 1, 2 and 3 threads, for the KV dtypes of kvs[0 ..
 * n_kv_types). */
static void check_thread_counts(int dtype, int n_kv_types)
{
    model *m = etu_model(MODEL_LLAMA, dtype);
    assert_non_null(m);
    uint32_t V = model_hp(m)->n_vocab;
    etu_tokens(g_toks, NP, V, 21);
    const int kvs[] = {DX_F16, DX_BF16, DX_F32, DX_Q8_0};
    for (int k = 0; k < n_kv_types; k++) {
        float *out[3];
        uint8_t *kv[3];
        size_t kvb = 0;
        for (int th = 1; th <= 3; th++) {
            rig r;
            rig_init(&r, m, th, kvs[k]);
            int32_t b[8];
            fresh_blocks(&r, 0, 5, b);
            out[th - 1] = malloc((size_t)NP * V * 4);
            run_chunks(&r, b, g_toks, 0, NP, 32, out[th - 1]);
            kvb = kv_pool_block_bytes(r.pool) * 5;
            kv[th - 1] = malloc(kvb);
            memcpy(kv[th - 1], kv_pool_block_ptr(r.pool, 0), kvb);
            rig_free(&r);
        }
        for (int th = 1; th < 3; th++) {
            assert_memory_equal(out[th], out[0], (size_t)NP * V * 4);
            assert_memory_equal(kv[th], kv[0], kvb);
        }
        for (int th = 0; th < 3; th++) free(out[th]), free(kv[th]);
    }
    model_free(m);
}

/* Same logits and KV with 1, 2 and 3 threads, for every KV dtype with a
 * bf16 model, and f16 KV with a q4_0 and an iq4_nl model. */
static void test_thread_count_invariance(void **state)
{
    (void)state;
    const int dtypes[] = {DX_BF16, DX_Q4_0, DX_IQ4_NL};
    for (size_t d = 0; d < DX_ARRAY_LEN(dtypes); d++)
        check_thread_counts(dtypes[d], d == 0 ? 4 : 1);
}

/* ---------- mixtures of experts ---------- */

/* The invariance checks above (chunks, batches, decode beside a prefill,
 * prefix reuse; 1 and 2 threads) on the tiny MoE models: qwen3moe's in
 * F32, BF16, Q8_0 and Q4_1 (a block format's experts sliced from the
 * stacked tensor; the grouping is the same for every type; F16's kernels
 * are the dense test's), llama's in BF16; tiny-moe-k at Q4_K_M as both. */
static void test_moe_batch_invariance(void **state)
{
    kti_use(state);
    const int dtypes[] = {DX_F32, DX_BF16, DX_Q8_0, DX_Q4_1};
    const enum model_arch archs[] = {MODEL_QWEN3MOE, MODEL_LLAMA};
    for (size_t a = 0; a < 2; a++)
        for (size_t d = 0; d < DX_ARRAY_LEN(dtypes); d++) {
            if (a == 1 && dtypes[d] != DX_BF16) continue;
            model *m = etu_model_p(archs[a], "tiny-moe", dtypes[d]);
            assert_non_null(m);
            uint32_t V = model_hp(m)->n_vocab;
            etu_tokens(g_toks, NP, V, 11);
            etu_tokens(g_other1, 30, V, 12);
            etu_tokens(g_other2, 17, V, 13);
            for (int th = 1; th <= 2; th++) check_invariance(m, th, DX_F16);
            model_free(m);
        }
    /* K-quant experts: tiny-moe-k at Q4_K_M (q4_K experts, q6_K ffn_down_exps
     * in some layers, q8_0 attn_k / attn_v for 8 experts), as qwen3moe and
     * as Mixtral-style llama */
    for (size_t a = 0; a < 2; a++)
        check_model_invariance(etu_model_scheme(archs[a], "tiny-moe-k", "q4_k_m"), 0);
}

#define NCAND 160 /* candidate tokens, each a one-token sequence at position 0 */
#define MAXB  40  /* sequences in a constructed batch */

typedef struct {
    kv_pool *pool;
    dx_tpool *tp;
    fwd *f;
    int32_t *route; /* [n_layer][MAXB + NP][k] */
} moe_rig;

static void moe_rig_init(moe_rig *r, const model *m, int threads)
{
    const model_hparams *hp = model_hp(m);
    kv_pool_config pc = {.n_layer = hp->n_layer,
                         .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim,
                         .block_size = BS,
                         .dtype = DX_F16,
                         .n_blocks = MAXB + 8};
    assert_int_equal(kv_pool_create(&pc, &r->pool), 0);
    assert_int_equal(dx_tpool_create(threads, &r->tp), 0);
    assert_int_equal(fwd_create(m, r->pool, r->tp, MAXB + NP, MAXB + 1, 256, &r->f), 0);
    r->route = malloc((size_t)hp->n_layer * (MAXB + NP) * hp->n_expert_used * 4);
    fwd_set_route_log(r->f, r->route);
}

static void moe_rig_free(moe_rig *r)
{
    fwd_destroy(r->f);
    dx_tpool_destroy(r->tp);
    kv_pool_destroy(r->pool);
    free(r->route);
}

/* One step: the one-token sequences of toks[0..n), each in its own block,
 * then (with_prompt) g_toks[0..NP) as one more sequence (logits of its
 * last token); logits [n (+1)][V]. */
static void moe_batch(moe_rig *r, const int32_t *toks, int n, int with_prompt, float *lg)
{
    fwd_seq sq[MAXB + 1];
    int32_t blk[MAXB], pb[8];
    for (int i = 0; i < n; i++) {
        blk[i] = i;
        sq[i] = (fwd_seq){&blk[i], 0, 1, &toks[i], 1};
    }
    for (int i = 0; i < 5; i++) pb[i] = MAXB + i;
    sq[n] = (fwd_seq){pb, 0, NP, g_toks, 1};
    assert_int_equal(fwd_step(r->f, sq, (size_t)n + (with_prompt != 0), lg), 0);
}

/* Tokens that share experts and tokens that share none, batched: every
 * token's logits are bit-identical to its own step's.  Each candidate is a
 * one-token sequence at position 0, so its routing is its own and the alone
 * runs tell which experts each one uses.  Batch A: the candidates whose
 * first choice in layer 0 is the most common one (all in that expert's
 * group, with the others' groups around them); batch B: candidates whose
 * experts are pairwise disjoint in every layer (each expert runs one token);
 * batch C: A and B beside a 69-token prefill.  1 and 2 threads. */
static void test_moe_shared_experts(void **state)
{
    kti_use(state);
    model *m = etu_model_p(MODEL_QWEN3MOE, "tiny-moe", DX_BF16);
    assert_non_null(m);
    const model_hparams *hp = model_hp(m);
    uint32_t V = hp->n_vocab, K = hp->n_expert_used, X = hp->n_expert, NL = hp->n_layer;
    etu_tokens(g_toks, NP, V, 41);
    int32_t cand[NCAND];
    etu_tokens(cand, NCAND, V, 42);
    float *alone = malloc((size_t)(NCAND + 1) * V * 4), *lg = malloc((size_t)(MAXB + 1) * V * 4);
    int32_t *sets = malloc((size_t)NCAND * NL * K * 4);
    moe_rig r;
    moe_rig_init(&r, m, 1);
    for (int c = 0; c < NCAND; c++) {
        moe_batch(&r, &cand[c], 1, 0, alone + (size_t)c * V);
        for (uint32_t l = 0; l < NL; l++)
            memcpy(sets + ((size_t)c * NL + l) * K, r.route + l * K, K * 4);
    }
    moe_batch(&r, NULL, 0, 1, alone + (size_t)NCAND * V); /* the prompt alone */
    moe_rig_free(&r);
    /* A: the most common first choice of layer 0 */
    int hist[MODEL_MAX_EXPERTS] = {0}, top = 0;
    for (int c = 0; c < NCAND; c++) hist[sets[(size_t)c * NL * K]]++;
    for (uint32_t e = 1; e < X; e++) top = hist[e] > hist[top] ? (int)e : top;
    int32_t a_tok[MAXB], b_tok[MAXB], c_tok[MAXB];
    int a_idx[MAXB], b_idx[MAXB], na = 0, nb = 0;
    for (int c = 0; c < NCAND && na < 24; c++)
        if (sets[(size_t)c * NL * K] == top) a_idx[na] = c, a_tok[na++] = cand[c];
    assert_true(na >= 8);
    /* B: greedy, experts disjoint from every earlier pick's in each layer */
    uint8_t used[8][MODEL_MAX_EXPERTS] = {{0}};
    for (int c = 0; c < NCAND && nb < MAXB; c++) {
        int ok = 1;
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t j = 0; j < K; j++) ok &= !used[l][sets[((size_t)c * NL + l) * K + j]];
        if (!ok) continue;
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t j = 0; j < K; j++) used[l][sets[((size_t)c * NL + l) * K + j]] = 1;
        b_idx[nb] = c, b_tok[nb++] = cand[c];
    }
    assert_true(nb >= 3);
    for (int th = 1; th <= 2; th++) {
        moe_rig_init(&r, m, th);
        const struct {
            const int32_t *tok;
            const int *idx;
            int n, prompt;
        } batches[] = {{a_tok, a_idx, na, 0}, {b_tok, b_idx, nb, 0}, {c_tok, NULL, na + nb, 1}};
        int c_idx[MAXB];
        for (int i = 0; i < na; i++) c_tok[i] = a_tok[i], c_idx[i] = a_idx[i];
        for (int i = 0; i < nb; i++) c_tok[na + i] = b_tok[i], c_idx[na + i] = b_idx[i];
        for (size_t bi = 0; bi < 3; bi++) {
            const int *idx = batches[bi].idx ? batches[bi].idx : c_idx;
            int n = batches[bi].n;
            moe_batch(&r, batches[bi].tok, n, batches[bi].prompt, lg);
            for (int i = 0; i < n; i++)
                if (memcmp(lg + (size_t)i * V, alone + (size_t)idx[i] * V, (size_t)V * 4))
                    fail_msg("%d threads, batch %zu: token %d's logits differ from alone", th, bi,
                             i);
            if (batches[bi].prompt &&
                memcmp(lg + (size_t)n * V, alone + (size_t)NCAND * V, (size_t)V * 4))
                fail_msg("%d threads: the prompt's logits differ beside the batch", th);
            /* the batch was what it was built to be: tokens per expert */
            size_t T = (size_t)n + (batches[bi].prompt ? NP : 0);
            for (uint32_t l = 0; l < NL; l++) {
                int cnt[MODEL_MAX_EXPERTS] = {0}, most = 0;
                for (size_t t = 0; t < (size_t)n; t++)
                    for (uint32_t j = 0; j < K; j++) cnt[r.route[(l * T + t) * K + j]]++;
                for (uint32_t e = 0; e < X; e++) most = cnt[e] > most ? cnt[e] : most;
                if (bi == 0 && l == 0) assert_int_equal(cnt[top], n);
                if (bi == 1) assert_int_equal(most, 1);
            }
        }
        moe_rig_free(&r);
    }
    free(alone);
    free(lg);
    free(sets);
    model_free(m);
}

/* ---------- long histories ---------- */

#define LH 8168 /* history: the tail's tokens cross the split boundary at 8192 */
#define LT 48   /* tail tokens */

/* A pool, thread pools and forward passes sized for LH + LT tokens. */
typedef struct {
    kv_pool *pool;
    dx_tpool *tp[2];
    fwd *f[2]; /* 1 and 2 threads, same pool */
    int32_t *blocks, *toks;
    uint32_t V;
    size_t nb;
} long_rig;

static void long_rig_init(long_rig *r, const model *m, int kv_dtype)
{
    const model_hparams *hp = model_hp(m);
    r->V = hp->n_vocab;
    r->nb = (LH + LT + BS - 1) / BS;
    kv_pool_config pc = {.n_layer = hp->n_layer,
                         .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim,
                         .block_size = BS,
                         .dtype = kv_dtype,
                         .n_blocks = (uint32_t)r->nb + 8};
    assert_int_equal(kv_pool_create(&pc, &r->pool), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(dx_tpool_create(i + 1, &r->tp[i]), 0);
        assert_int_equal(fwd_create(m, r->pool, r->tp[i], 512, 4, LH + LT, &r->f[i]), 0);
    }
    r->blocks = malloc(r->nb * sizeof(int32_t));
    r->toks = malloc((LH + LT) * sizeof(int32_t));
    for (size_t i = 0; i < r->nb; i++) r->blocks[i] = (int32_t)i;
    etu_tokens(r->toks, LH + LT, r->V, 31);
}

static void long_rig_free(long_rig *r)
{
    for (int i = 0; i < 2; i++) {
        fwd_destroy(r->f[i]);
        dx_tpool_destroy(r->tp[i]);
    }
    kv_pool_destroy(r->pool);
    free(r->blocks);
    free(r->toks);
}

/* The tail [LH, LH + LT) in steps of `chunk` tokens on forward pass f, logits
 * of every token; with `other`, each step also prefills a short unrelated
 * sequence in the same batch. */
static void long_tail(long_rig *r, fwd *f, int chunk, int other, float *lg)
{
    int32_t ob[2] = {(int32_t)r->nb, (int32_t)r->nb + 1};
    float *olg = malloc((size_t)(LT + 20) * r->V * 4);
    for (int p = LH; p < LH + LT; p += chunk) {
        int c = LH + LT - p < chunk ? LH + LT - p : chunk;
        fwd_seq s[2] = {{r->blocks, (uint32_t)p, (uint32_t)c, r->toks + p, 2},
                        {ob, 0, 20, g_other1, 2}};
        if (other) {
            fwd_seq both[2] = {s[1], s[0]};
            assert_int_equal(fwd_step(f, both, 2, olg), 0);
            memcpy(lg + (size_t)(p - LH) * r->V, olg + (size_t)20 * r->V, (size_t)c * r->V * 4);
        } else {
            assert_int_equal(fwd_step(f, s, 1, lg + (size_t)(p - LH) * r->V), 0);
        }
    }
    free(olg);
}

/* Depth past 8192 on the tiny model: the history is prefilled once; then for
 * every ISA the tail (which crosses a split boundary) computed in one step
 * (the tiled path) is the reference, and chunks of 7 and 5 (split path),
 * one token at a time (decode), a batch with another sequence and one thread
 * must reproduce its logits and KV bit for bit. */
static void check_long_depth(int kv_dtype)
{
    model *m = etu_model(MODEL_QWEN3, DX_BF16);
    assert_non_null(m);
    long_rig r;
    long_rig_init(&r, m, kv_dtype);
    etu_tokens(g_other1, 30, r.V, 12);
    for (int p = 0; p < LH; p += 512) {
        uint32_t n = LH - p < 512 ? (uint32_t)(LH - p) : 512;
        fwd_seq s = {r.blocks, (uint32_t)p, n, r.toks + p, 0};
        assert_int_equal(fwd_step(r.f[1], &s, 1, NULL), 0);
    }
    size_t tb = LH / BS, ntb = r.nb - tb, bb = kv_pool_block_bytes(r.pool);
    float *base = malloc((size_t)LT * r.V * 4), *lg = malloc((size_t)LT * r.V * 4);
    uint8_t *kv = malloc(ntb * bb);
    const enum kern_isa isas[] = {KERN_SCALAR, KERN_AVX2, KERN_AVX512};
    for (size_t ii = 0; ii < 3; ii++) {
        if (kern_set_isa(isas[ii])) continue;
        long_tail(&r, r.f[1], LT, 0, base);
        memcpy(kv, kv_pool_block_ptr(r.pool, (int32_t)tb), ntb * bb);
        const int chunks[] = {7, 5, 1};
        for (int c = 0; c < 3; c++) {
            memset(lg, 0, (size_t)LT * r.V * 4);
            long_tail(&r, r.f[c == 2 ? 0 : 1], chunks[c], c == 1, lg);
            if (memcmp(lg, base, (size_t)LT * r.V * 4))
                fail_msg("%s %s KV: logits of chunks of %d differ", kern_isa_name(isas[ii]),
                         dx_dtype_name(kv_dtype), chunks[c]);
            assert_memory_equal(kv_pool_block_ptr(r.pool, (int32_t)tb), kv, ntb * bb);
        }
    }
    kern_set_isa(kern_isa_detect());
    free(base);
    free(lg);
    free(kv);
    long_rig_free(&r);
    model_free(m);
}

static void test_long_depth_invariance(void **state)
{
    (void)state;
    check_long_depth(DX_F16);
    check_long_depth(DX_Q8_0);
}

/* A q8_0 KV cache changes the logits only by its rounding: against f32 KV
 * on the tiny model (logits of magnitude ~1-10), per ISA.  A layout that
 * the store and the kernels misread alike would pass the invariance tests
 * but not this. */
static void test_q8_kv_close(void **state)
{
    enum kern_isa isa = kti_use(state);
    model *m = etu_model(MODEL_QWEN3, DX_F32);
    assert_non_null(m);
    uint32_t V = model_hp(m)->n_vocab;
    etu_tokens(g_toks, NP, V, 41);
    float *lg[2];
    const int kvs[2] = {DX_F32, DX_Q8_0};
    for (int k = 0; k < 2; k++) {
        rig r;
        rig_init(&r, m, 2, kvs[k]);
        int32_t b[8];
        fresh_blocks(&r, 0, 5, b);
        lg[k] = malloc((size_t)NP * V * 4);
        run_chunks(&r, b, g_toks, 0, NP, 16, lg[k]);
        rig_free(&r);
    }
    double worst = 0, mag = 0;
    for (size_t i = 0; i < (size_t)NP * V; i++) {
        worst = fmax(worst, fabs(lg[1][i] - lg[0][i]));
        mag = fmax(mag, fabs(lg[0][i]));
    }
    /* measured worst 0.024 of 4.4 on every ISA */
    if (worst > 0.02 * mag || worst == 0)
        fail_msg("%s: q8_0 KV moves logits by up to %g (largest %g)", kern_isa_name(isa), worst,
                 mag);
    print_message("%s: q8_0 vs f32 KV: worst |dlogit| %g of %g\n", kern_isa_name(isa), worst, mag);
    free(lg[0]);
    free(lg[1]);
    model_free(m);
}

static void test_bad_batches(void **state)
{
    (void)state;
    model *m = etu_model(MODEL_QWEN3, DX_F32);
    rig r;
    rig_init(&r, m, 1, DX_F16);
    int32_t b[64], toks[300] = {0};
    for (int i = 0; i < 64; i++) b[i] = i;
    float *lg = malloc((size_t)r.V * 4 * 9);
    fwd_seq big = {b, 0, 300, toks, 1};
    assert_int_equal(fwd_step(r.f, &big, 1, lg), DX_EINVAL);
    fwd_seq past = {b, 1020, 10, toks, 1};
    assert_int_equal(fwd_step(r.f, &past, 1, lg), DX_EINVAL);
    toks[0] = (int32_t)r.V;
    fwd_seq oov = {b, 0, 1, toks, 1};
    assert_int_equal(fwd_step(r.f, &oov, 1, lg), DX_ERANGE);
    free(lg);
    rig_free(&r);
    model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        KTI_ALL(test_reference_qwen3),
        KTI_ALL(test_reference_qwen2),
        KTI_ALL(test_reference_llama),
        KTI_ALL(test_reference_qwen3moe),
        KTI_ALL(test_reference_llama_moe),
        KTI_ALL(test_moe_batch_invariance),
        KTI_ALL(test_moe_shared_experts),
        cmocka_unit_test(test_llama3_rope_scaling),
        KTI_ALL(test_batch_invariance),
        KTI_AMX(test_batch_invariance_amx),
        cmocka_unit_test(test_thread_count_invariance),
        cmocka_unit_test(test_long_depth_invariance),
        KTI_ALL(test_q8_kv_close),
        cmocka_unit_test(test_bad_batches),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
