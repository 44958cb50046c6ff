/* Forward pass: agreement with a naive double-precision reference, and
 * bit-exact batch invariance (memcmp of logits and KV blocks) across
 * chunking, batching, prefix reuse and thread counts, for every weight dtype
 * and every kernel ISA this CPU has. */
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
    int E = hp->n_embd, D = hp->head_dim, H = hp->n_head, KV = hp->n_kv_head, F = hp->n_ff;
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
            matvec(&L->w_gate, xb, g);
            matvec(&L->w_up, xb, u);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            matvec(&L->w_down, g, o);
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
 * (malloc'd, [n][n_vocab]). */
static float *one_chunk_logits(model *m, int n)
{
    rig r;
    rig_init(&r, m, 2, DX_F32);
    int32_t blocks[8];
    fresh_blocks(&r, 0, 4, blocks);
    float *lg = malloc((size_t)n * model_hp(m)->n_vocab * sizeof(float));
    run_chunks(&r, blocks, g_toks, 0, n, n, lg);
    rig_free(&r);
    return lg;
}

static void check_reference(enum model_arch arch, enum kern_isa isa)
{
    model *m = etu_model(arch, DX_F32);
    assert_non_null(m);
    uint32_t V = model_hp(m)->n_vocab;
    int n = 64;
    etu_tokens(g_toks, n, V, 7);
    double *ref = malloc((size_t)n * V * sizeof(double));
    reference(m, g_toks, n, ref);
    float *lg = one_chunk_logits(m, n);
    /* tolerance: f32 arithmetic vs double over 2 layers; logits are O(1-10) */
    double maxdiff = 0, maxref = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        maxdiff = fmax(maxdiff, fabs(lg[i] - ref[i]));
        maxref = fmax(maxref, fabs(ref[i]));
    }
    if (maxdiff > 2e-3 * fmax(1.0, maxref))
        fail_msg("arch %d isa %s: max |logit diff| %g (max |logit| %g)", arch, kern_isa_name(isa),
                 maxdiff, maxref);
    free(lg);
    free(ref);
    model_free(m);
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
    float *lg = one_chunk_logits(m, n);
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

static void test_batch_invariance(void **state)
{
    kti_use(state);
    const int dtypes[] = {DX_F32, DX_F16, DX_BF16, DX_Q8_0, DX_Q4_0, DX_IQ4_NL, -1 /* mixture */};
    for (size_t d = 0; d < DX_ARRAY_LEN(dtypes); d++) {
        model *m = dtypes[d] < 0 ? etu_model_mix(MODEL_QWEN3) : etu_model(MODEL_QWEN3, dtypes[d]);
        assert_non_null(m);
        uint32_t V = model_hp(m)->n_vocab;
        etu_tokens(g_toks, NP, V, 11);
        etu_tokens(g_other1, 30, V, 12);
        etu_tokens(g_other2, 17, V, 13);
        for (int th = 1; th <= 2; th++) check_invariance(m, th, DX_F16);
        model_free(m);
    }
}

static void check_thread_counts(int dtype, int n_kv_types)
{
    model *m = etu_model(MODEL_LLAMA, dtype);
    assert_non_null(m);
    uint32_t V = model_hp(m)->n_vocab;
    etu_tokens(g_toks, NP, V, 21);
    const int kvs[] = {DX_F16, DX_BF16, DX_F32};
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

/* Same logits and KV with 1, 2 and 3 threads, with bf16/f32 KV too, for a
 * bf16, a q4_0 and an iq4_nl model. */
static void test_thread_count_invariance(void **state)
{
    (void)state;
    const int dtypes[] = {DX_BF16, DX_Q4_0, DX_IQ4_NL};
    for (size_t d = 0; d < DX_ARRAY_LEN(dtypes); d++)
        check_thread_counts(dtypes[d], d == 0 ? 3 : 1);
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

static void long_rig_init(long_rig *r, const model *m)
{
    const model_hparams *hp = model_hp(m);
    r->V = hp->n_vocab;
    r->nb = (LH + LT + BS - 1) / BS;
    kv_pool_config pc = {.n_layer = hp->n_layer,
                         .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim,
                         .block_size = BS,
                         .dtype = DX_F16,
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
static void test_long_depth_invariance(void **state)
{
    (void)state;
    model *m = etu_model(MODEL_QWEN3, DX_BF16);
    assert_non_null(m);
    long_rig r;
    long_rig_init(&r, m);
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
                fail_msg("%s: logits of chunks of %d differ", kern_isa_name(isas[ii]), chunks[c]);
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
        cmocka_unit_test(test_llama3_rope_scaling),
        KTI_ALL(test_batch_invariance),
        cmocka_unit_test(test_thread_count_invariance),
        cmocka_unit_test(test_long_depth_invariance),
        cmocka_unit_test(test_bad_batches),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
