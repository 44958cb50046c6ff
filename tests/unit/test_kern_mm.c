/* Unit tests for the matmul kernels (kern_act_prep / kern_matmul):
 *  - every ISA this CPU supports against kern_matmul_scalar and against an
 *    exact (double) sum, on odd shapes;
 *  - the block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) and the
 *    super-block formats (Q2_K..Q6_K, IQ4_XS): every ISA's
 *    kernels bit-equal (memcmp) to the scalar twin for every n_tok 1..40,
 *    odd numbers of blocks and splits of [0, n_out);
 *  - the super-block twins' decoding against dx_kquant's dequantisation,
 *    element by element (one-hot activations);
 *  - bit-exact batch invariance with memcmp, per ISA and weight type: tokens
 *    all at once vs one at a time vs in chunks of 7; any split of [0, n_out)
 *    into task ranges; a token alone vs batched among random tokens;
 *  - activation preps bit-identical to the scalar conversions;
 *  - the per-ISA tables hold what the driver in kern_mm.c relies on.
 *
 * Tolerance: |fast - scalar| <= 2e-5 * sum_k |w_k x_k| (+1e-30), with w and x
 * as the kernel consumes them (bf16-rounded / q8_0-quantised activations).
 * Both are f32 sums of the same exact products in different orders; their
 * rounding errors grow like sqrt(n) * 6e-8 (about 3e-6 at n = 2080), so 2e-5
 * leaves margin while a dropped or doubled term of average size (>= 1/n =
 * 5e-4 of the sum) fails.  Each is also checked against the double sum. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_tpool.h"
#include "engine/kern/kern.h"
#include "engine/kern/kern_mm_priv.h"
#include "kern_test_isa.h"

#define REL_TOL 2e-5

static const int wtypes[] = {DX_F32,  DX_F16,  DX_BF16, DX_Q8_0,   DX_Q4_0,
                             DX_Q4_1, DX_Q5_0, DX_Q5_1, DX_IQ4_NL, DX_Q2_K,
                             DX_Q3_K, DX_Q4_K, DX_Q5_K, DX_Q6_K,   DX_IQ4_XS};
/* The formats whose kernels reproduce the scalar twin bit for bit. */
static const int blk_types[] = {DX_Q8_0, DX_Q4_0, DX_Q4_1, DX_Q5_0, DX_Q5_1, DX_IQ4_NL,
                                DX_Q2_K, DX_Q3_K, DX_Q4_K, DX_Q5_K, DX_Q6_K, DX_IQ4_XS};
/* The super-block formats (n_in % 256 == 0). */
static const int kq_types[] = {DX_Q2_K, DX_Q3_K, DX_Q4_K, DX_Q5_K, DX_Q6_K, DX_IQ4_XS};

static int is_kq(int wtype)
{
    return dx_dtype_block_elems(wtype) == DX_QK_K;
}

static int is_q8_act(int wtype)
{
    return dx_dtype_block_elems(wtype) == 32 || is_kq(wtype);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rng_f(void)
{
    return (float)((double)rng_u32() / 4294967296.0 * 2.0 - 1.0);
}

static void fill_random(float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        v[i] = rng_f();
        if (rng_u32() % 97 == 0) v[i] *= 20.0f; /* occasional outlier */
    }
}

/* An f16 of random sign and magnitude 2^-12 .. 2^-6, at p. */
static void put_rand_f16(uint8_t *p)
{
    float v = ldexpf(1.0f + (float)(rng_u32() % 1024) / 1024.0f, -12 + (int)(rng_u32() % 6));
    uint16_t h = dx_f32_to_f16(rng_u32() & 1 ? -v : v);
    memcpy(p, &h, 2);
}

/* Random valid super-blocks: every bit pattern of the quants and packed
 * scales is a valid block, so random bytes with sane f16 d (and dmin)
 * (until the quantisers come, this is how the super-block weights are
 * made). */
static void random_kq_row(int wtype, uint8_t *row, size_t n_in)
{
    size_t bb = dx_dtype_block_bytes(wtype);
    for (size_t i = 0; i < bb * (n_in / DX_QK_K); i++) row[i] = (uint8_t)rng_u32();
    size_t d = wtype == DX_Q2_K   ? offsetof(dx_block_q2_k, d)
               : wtype == DX_Q3_K ? offsetof(dx_block_q3_k, d)
               : wtype == DX_Q6_K ? offsetof(dx_block_q6_k, d)
                                  : 0; /* Q4_K, Q5_K, IQ4_XS */
    int has_dmin = wtype == DX_Q2_K || wtype == DX_Q4_K || wtype == DX_Q5_K;
    for (size_t b = 0; b < n_in / DX_QK_K; b++) {
        put_rand_f16(row + b * bb + d);
        if (has_dmin) put_rand_f16(row + b * bb + d + 2);
    }
}

/* Random weight matrix of type wtype, [n_out][n_in]. */
static void *make_weights(int wtype, size_t n_out, size_t n_in)
{
    size_t rb = dx_dtype_row_bytes(wtype, n_in);
    uint8_t *w = dx_malloc(rb * n_out + 1);
    float *row = dx_malloc(n_in * sizeof(float));
    assert_non_null(w);
    for (size_t o = 0; o < n_out; o++) {
        if (is_kq(wtype)) {
            random_kq_row(wtype, w + o * rb, n_in);
            continue;
        }
        fill_random(row, n_in);
        assert_int_equal(dx_dtype_from_f32_row(wtype, row, w + o * rb, n_in), 0);
    }
    dx_free(row);
    return w;
}

static void *prep(int wtype, const float *x, size_t n_tok, size_t n_in)
{
    size_t bytes = kern_act_bytes(wtype, n_tok, n_in);
    assert_true(bytes > 0 || n_tok == 0);
    void *act = dx_aligned_alloc(64, bytes ? bytes : 64);
    assert_non_null(act);
    kern_act_prep(wtype, x, n_tok, n_in, act);
    return act;
}

/* y[n_tok][n_out] = W x with the active ISA, all tokens, one range. */
static void matmul_all(int wtype, const void *w, const float *x, size_t n_tok, size_t n_in,
                       size_t n_out, float *y)
{
    void *act = prep(wtype, x, n_tok, n_in);
    kern_matmul(wtype, w, n_in, 0, n_out, act, n_tok, y, n_out);
    dx_aligned_free(act);
}

/* The values the kernel consumes: x rounded as the prep rounds it. */
static void consumed_x(int wtype, const float *x, size_t n_in, float *out)
{
    if (wtype == DX_BF16) {
        for (size_t k = 0; k < n_in; k++) out[k] = dx_bf16_to_f32(dx_f32_to_bf16(x[k]));
    } else if (is_kq(wtype)) { /* q8_K: one f32 scale a super-block */
        for (size_t sb = 0; sb < n_in / DX_QK_K; sb++) {
            const float *xs = x + sb * DX_QK_K;
            float amax = 0.0f;
            for (int i = 0; i < DX_QK_K; i++) amax = fmaxf(amax, fabsf(xs[i]));
            float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            for (int i = 0; i < DX_QK_K; i++) out[sb * DX_QK_K + i] = d * (float)lrintf(xs[i] * id);
        }
    } else if (is_q8_act(wtype)) {
        dx_block_q8_0 *q = dx_malloc(n_in / 32 * sizeof(*q));
        dx_f32_to_q8_0_row(x, q, n_in);
        dx_q8_0_to_f32_row(q, out, n_in);
        dx_free(q);
    } else {
        memcpy(out, x, n_in * sizeof(float));
    }
}

/* One shape: a fast ISA vs scalar vs the double sum. */
static void check_shape(enum kern_isa isa, int wtype, size_t n_tok, size_t n_in, size_t n_out)
{
    void *w = make_weights(wtype, n_out, n_in);
    float *x = dx_malloc(n_tok * n_in * sizeof(float));
    float *wf = dx_malloc(n_in * sizeof(float)), *xf = dx_malloc(n_in * sizeof(float));
    float *ref = dx_malloc(n_tok * n_out * sizeof(float)),
          *y = dx_malloc(n_tok * n_out * sizeof(float));
    fill_random(x, n_tok * n_in);
    assert_int_equal(kern_set_isa(KERN_SCALAR), 0);
    matmul_all(wtype, w, x, n_tok, n_in, n_out, ref);
    size_t wrb = dx_dtype_row_bytes(wtype, n_in);
    assert_int_equal(kern_set_isa(isa), 0);
    matmul_all(wtype, w, x, n_tok, n_in, n_out, y);
    for (size_t t = 0; t < n_tok; t++) {
        consumed_x(wtype, x + t * n_in, n_in, xf);
        for (size_t o = 0; o < n_out; o++) {
            assert_int_equal(dx_dtype_to_f32_row(wtype, (uint8_t *)w + o * wrb, wf, n_in), 0);
            double exact = 0, mag = 0;
            for (size_t k = 0; k < n_in; k++) {
                exact += (double)wf[k] * xf[k];
                mag += fabs((double)wf[k] * xf[k]);
            }
            double tol = REL_TOL * mag + 1e-30, f = y[t * n_out + o], r = ref[t * n_out + o];
            if (fabs(f - r) > tol || fabs(r - exact) > tol || fabs(f - exact) > tol) {
                fprintf(stderr,
                        "%s %s tok=%zu in=%zu out=%zu: t=%zu o=%zu fast=%.9g ref=%.9g exact=%.9g\n",
                        kern_isa_name(isa), dx_dtype_name(wtype), n_tok, n_in, n_out, t, o, f, r,
                        exact);
                fail();
            }
        }
    }
    dx_free(w);
    dx_free(x);
    dx_free(wf);
    dx_free(xf);
    dx_free(ref);
    dx_free(y);
}

/* wtype's shapes (n_in by kind x n_tok), the row counts cycling with c
 * across calls; the next c. */
static size_t check_shapes(enum kern_isa isa, int wtype, size_t c)
{
    static const size_t n_ins[] = {32, 64, 96, 1024, 2080, 1, 3, 17, 33, 100};
    static const size_t n_toks[] = {1, 2, 3, 5, 7, 16, 33};
    static const size_t kq_n_ins[] = {256, 512, 1024, 2816};
    static const size_t n_outs[] = {1, 3, 5, 17, 64};
    int kq = is_kq(wtype);
    size_t n_n = kq ? DX_ARRAY_LEN(kq_n_ins) : DX_ARRAY_LEN(n_ins);
    for (size_t i = 0; i < n_n; i++) {
        size_t n_in = kq ? kq_n_ins[i] : n_ins[i];
        if (is_q8_act(wtype) && n_in % 32) continue;
        for (size_t t = 0; t < DX_ARRAY_LEN(n_toks); t++, c++)
            check_shape(isa, wtype, n_toks[t], n_in, n_outs[c % DX_ARRAY_LEN(n_outs)]);
    }
    return c;
}

static void test_mm_matches_scalar(void **state)
{
    enum kern_isa isa = kti_use(state);
    size_t c = 0;
    for (size_t d = 0; d < DX_ARRAY_LEN(wtypes); d++) c = check_shapes(isa, wtypes[d], c);
}

/* ---- bit-exact invariance ---- */

typedef struct {
    int wtype;
    size_t n_in, n_out, n_tok;
    void *w;
    float *x;   /* [n_tok][n_in] */
    float *ref; /* all tokens at once, one range */
} inv_case;

static void inv_setup(inv_case *c, int wtype, size_t n_in, size_t n_out, size_t n_tok)
{
    c->wtype = wtype;
    c->n_in = n_in;
    c->n_out = n_out;
    c->n_tok = n_tok;
    c->w = make_weights(wtype, n_out, n_in);
    c->x = dx_malloc(n_tok * n_in * sizeof(float));
    fill_random(c->x, n_tok * n_in);
    c->ref = dx_malloc(n_tok * n_out * sizeof(float));
    matmul_all(wtype, c->w, c->x, n_tok, n_in, n_out, c->ref);
}

static void inv_free(inv_case *c)
{
    dx_free(c->w);
    dx_free(c->x);
    dx_free(c->ref);
}

/* Tokens in chunks of `chunk`, each chunk prepared and multiplied alone. */
static void inv_chunks(const inv_case *c, size_t chunk)
{
    float *y = dx_calloc(c->n_tok * c->n_out, sizeof(float));
    for (size_t t = 0; t < c->n_tok; t += chunk) {
        size_t n = c->n_tok - t < chunk ? c->n_tok - t : chunk;
        matmul_all(c->wtype, c->w, c->x + t * c->n_in, n, c->n_in, c->n_out, y + t * c->n_out);
    }
    assert_memory_equal(y, c->ref, c->n_tok * c->n_out * sizeof(float));
    dx_free(y);
}

/* [0, n_out) split into ranges whose sizes cycle through `sizes`. */
static void inv_splits(const inv_case *c, const size_t *sizes, size_t n_sizes)
{
    void *act = prep(c->wtype, c->x, c->n_tok, c->n_in);
    float *y = dx_calloc(c->n_tok * c->n_out, sizeof(float));
    for (size_t o = 0, i = 0; o < c->n_out; i++) {
        size_t o1 = o + sizes[i % n_sizes] < c->n_out ? o + sizes[i % n_sizes] : c->n_out;
        kern_matmul(c->wtype, c->w, c->n_in, o, o1, act, c->n_tok, y, c->n_out);
        o = o1;
    }
    assert_memory_equal(y, c->ref, c->n_tok * c->n_out * sizeof(float));
    dx_free(y);
    dx_aligned_free(act);
}

/* Token `t` of the case placed at position `pos` among random others. */
static void inv_batched(const inv_case *c, size_t t, size_t n_batch, size_t pos)
{
    float *x = dx_malloc(n_batch * c->n_in * sizeof(float));
    float *y = dx_malloc(n_batch * c->n_out * sizeof(float));
    fill_random(x, n_batch * c->n_in);
    memcpy(x + pos * c->n_in, c->x + t * c->n_in, c->n_in * sizeof(float));
    matmul_all(c->wtype, c->w, x, n_batch, c->n_in, c->n_out, y);
    assert_memory_equal(y + pos * c->n_out, c->ref + t * c->n_out, c->n_out * sizeof(float));
    dx_free(x);
    dx_free(y);
}

typedef struct {
    const float *x;
    const void *w, *act;
    float *y;
    int wtype;
    size_t n_in, n_out, n_tok, tile;
} pool_mm;

static void pool_mm_task(void *arg, size_t task, int tid)
{
    (void)tid;
    pool_mm *m = arg;
    size_t o0 = task * m->tile, o1 = o0 + m->tile < m->n_out ? o0 + m->tile : m->n_out;
    kern_matmul(m->wtype, m->w, m->n_in, o0, o1, m->act, m->n_tok, m->y, m->n_out);
}

/* Split across a 2-thread pool in kern_matmul_tile() ranges. */
static void inv_pool(const inv_case *c)
{
    dx_tpool *p = NULL;
    assert_int_equal(dx_tpool_create(2, &p), 0);
    pool_mm m = {.w = c->w,
                 .wtype = c->wtype,
                 .n_in = c->n_in,
                 .n_out = c->n_out,
                 .n_tok = c->n_tok,
                 .tile = kern_matmul_tile(c->wtype)};
    m.act = prep(c->wtype, c->x, c->n_tok, c->n_in);
    m.y = dx_calloc(c->n_tok * c->n_out, sizeof(float));
    dx_tpool_run(p, (c->n_out + m.tile - 1) / m.tile, pool_mm_task, &m);
    assert_memory_equal(m.y, c->ref, c->n_tok * c->n_out * sizeof(float));
    dx_free(m.y);
    dx_aligned_free((void *)m.act);
    dx_tpool_destroy(p);
}

static void check_invariance(enum kern_isa isa, int wtype, size_t n_in, size_t n_out)
{
    assert_int_equal(kern_set_isa(isa), 0);
    inv_case c;
    inv_setup(&c, wtype, n_in, n_out, 33);
    inv_chunks(&c, 1);
    inv_chunks(&c, 7);
    inv_chunks(&c, 4);
    static const size_t one[] = {SIZE_MAX / 2}, ones[] = {1}, odd[] = {3, 5, 7, 1, 13};
    static const size_t tiles[] = {16, 32, 4};
    inv_splits(&c, one, 1);
    inv_splits(&c, ones, 1);
    inv_splits(&c, odd, DX_ARRAY_LEN(odd));
    inv_splits(&c, tiles, DX_ARRAY_LEN(tiles));
    inv_batched(&c, 0, 9, 5);
    inv_batched(&c, 17, 40, 39);
    inv_batched(&c, 32, 2, 0);
    inv_pool(&c);
    inv_free(&c);
}

static void test_mm_invariance(void **state)
{
    enum kern_isa isa = kti_use(state);
    for (size_t d = 0; d < DX_ARRAY_LEN(wtypes); d++) {
        int q8 = is_q8_act(wtypes[d]), kq = is_kq(wtypes[d]);
        check_invariance(isa, wtypes[d], kq ? 256 : q8 ? 96 : 100, 37);
        check_invariance(isa, wtypes[d], kq ? 2816 : q8 ? 1024 : 33, 21);
    }
}

/* ---- activation preps ---- */

/* The ISA's prep of x gives the scalar prep's bytes. */
static void check_prep_same(enum kern_isa isa, int wt, const float *x, size_t n_tok, size_t n_in)
{
    assert_int_equal(kern_set_isa(KERN_SCALAR), 0);
    void *ref = prep(wt, x, n_tok, n_in);
    assert_int_equal(kern_set_isa(isa), 0);
    void *a = prep(wt, x, n_tok, n_in);
    assert_memory_equal(a, ref, kern_act_bytes(wt, n_tok, n_in));
    dx_aligned_free(a);
    dx_aligned_free(ref);
}

static void test_prep_bits(void **state)
{
    enum kern_isa isa = kti_use(state);
    const size_t n_in = 160, n_tok = 3;
    float x[3 * 160];
    fill_random(x, n_tok * n_in);
    for (size_t k = 32; k < 64; k++) x[k] = 0.0f;                /* all-zero block: d = 0 */
    x[70] = 1e-40f, x[71] = -3e-39f, x[72] = NAN, x[73] = -0.0f; /* denormals, NaN */
    x[74] = 0x1.01p-120f, x[75] = dx_u32_as_f32(0x3f808000u);    /* bf16 tie */
    for (size_t k = 96; k < 128; k++) x[k] = (float)((int)k - 112) * 0.5f; /* q8 ties */
    for (size_t d = 0; d < DX_ARRAY_LEN(wtypes); d++) {
        int wt = wtypes[d];
        if (is_kq(wt)) continue;          /* Q8_0's kind; 160 is not a whole super-block */
        if (is_q8_act(wt)) x[72] = 0.25f; /* NaN is not quantised meaningfully */
        check_prep_same(isa, wt, x, n_tok, n_in);
        x[72] = NAN;
    }
}

/* The q8_K prep (the super-block formats' kind) on whole super-blocks: an
 * all-zero one (d = 0), denormals, quant ties, an outlier. */
static void test_prep_bits_q8k(void **state)
{
    enum kern_isa isa = kti_use(state);
    const size_t n_in = 768, n_tok = 3;
    float *x = dx_malloc(n_tok * n_in * sizeof(float));
    fill_random(x, n_tok * n_in);
    for (size_t k = 256; k < 512; k++) x[k] = 0.0f;
    x[770] = 1e-40f, x[771] = -3e-39f, x[773] = -0.0f, x[900] = 300.0f;
    for (size_t k = 1024; k < 1280; k++) x[k] = (float)((int)k - 1152) * 0.5f;
    check_prep_same(isa, DX_Q4_K, x, n_tok, n_in);
    dx_free(x);
}

/* Scalar prep of bf16 follows dx_f32_to_bf16 and q8_0 dx_f32_to_q8_0_row. */
static void test_prep_layout(void **state)
{
    (void)state;
    float x[96];
    fill_random(x, 96);
    assert_int_equal(kern_set_isa(KERN_SCALAR), 0);
    uint16_t *b = prep(DX_BF16, x, 1, 33);
    for (size_t k = 0; k < 33; k++) assert_int_equal(b[k], dx_f32_to_bf16(x[k]));
    for (size_t k = 33; k < 64; k++) assert_int_equal(b[k], 0);
    dx_aligned_free(b);
    uint8_t *q = prep(DX_Q8_0, x, 1, 96);
    dx_block_q8_0 blk[3];
    dx_f32_to_q8_0_row(x, blk, 96);
    for (int i = 0; i < 3; i++) {
        const uint8_t *pair = q + (i / 2) * 192;
        assert_memory_equal(pair + (i % 2) * 32, blk[i].qs, 32);
        float d;
        memcpy(&d, pair + 128 + (i % 2) * 32, 4);
        assert_true(d == dx_f16_to_f32(blk[i].d));
    }
    /* the tail: each block's -128 * (sum of its quants) and its scale */
    const uint8_t *tail = q + 2 * 192;
    for (int i = 0; i < 3; i++) {
        int32_t corr, sum = 0;
        float d;
        for (int j = 0; j < 32; j++) sum += blk[i].qs[j];
        memcpy(&corr, tail + 8 * i, 4);
        memcpy(&d, tail + 8 * i + 4, 4);
        assert_int_equal(corr, -128 * sum);
        assert_true(d == dx_f16_to_f32(blk[i].d));
    }
    for (int i = 24; i < 64; i++) assert_int_equal(tail[i], 0);
    assert_int_equal(kern_act_bytes(DX_Q8_0, 2, 96), 2 * (2 * 192 + 64));
    assert_int_equal(kern_act_bytes(DX_Q8_0, 1, 544), 9 * 192 + 192); /* 17 blocks: 136 bytes */
    assert_int_equal(kern_act_bytes(DX_Q8_0, 1, 100), 0);
    assert_int_equal(kern_act_bytes(DX_BF16, 3, 33), 3 * 64 * 2);
    assert_int_equal(kern_act_bytes(DX_F32, 3, 33), 3 * 64 * 4);
    assert_int_equal(kern_act_bytes(77, 3, 33), 0);
    dx_aligned_free(q);
    /* q8_K: quants as dx_f32_to_q8_0_row computes them with the super-block's
     * scale, their sums by 16, the scale in f32 */
    float xk[512];
    fill_random(xk, 512);
    const uint8_t *k = prep(DX_Q6_K, xk, 1, 512);
    for (int sb = 0; sb < 2; sb++) {
        const uint8_t *p = k + sb * 320;
        float amax = 0.0f, d;
        for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(xk[256 * sb + i]));
        memcpy(&d, p + 288, 4);
        assert_true(d == amax / 127.0f);
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) {
                int qv = (int8_t)p[16 * j + i];
                assert_int_equal(qv, (int)lrintf(xk[256 * sb + 16 * j + i] * (1.0f / d)));
                sum += qv;
            }
            int16_t bs;
            memcpy(&bs, p + 256 + 2 * j, 2);
            assert_int_equal(bs, sum);
        }
        for (int i = 292; i < 320; i++) assert_int_equal(p[i], 0);
    }
    dx_aligned_free((void *)k);
}

static size_t count_diff(const float *a, const float *b, size_t n)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

static void test_isa_select(void **state)
{
    (void)state;
    assert_string_equal(kern_isa_name(KERN_SCALAR), "scalar");
    assert_string_equal(kern_isa_name(KERN_AVX2), "avx2");
    assert_string_equal(kern_isa_name(KERN_AVX512), "avx512");
    assert_string_equal(kern_isa_name(KERN_AMX), "amx");
    assert_int_equal(kern_set_isa((enum kern_isa)7), DX_EINVAL);
    enum kern_isa best = kern_isa_detect();
    assert_int_equal(kern_set_isa(best), 0);
    assert_int_equal(kern_get_isa(), best);
    if (best < KERN_AVX512) assert_int_equal(kern_set_isa(KERN_AVX512), DX_EUNSUPPORTED);
    if (best < KERN_AMX) assert_int_equal(kern_set_isa(KERN_AMX), DX_EUNSUPPORTED);
    assert_int_equal(kern_set_isa(KERN_SCALAR), 0);
    assert_int_equal(kern_get_isa(), KERN_SCALAR);
    assert_int_equal(kern_set_isa(best), 0);
}

/* The two ways of multiplying BF16 on AVX-512: the choice, its errors, and
 * the vdpbf16ps tiles checked as test_mm_matches_scalar and
 * test_mm_invariance check the FMA ones (a CPU without AVX512-BF16
 * reports that case skipped). */
static void test_bf16_dot_select(void **state)
{
    (void)state;
    assert_string_equal(kern_bf16_dot_name(KERN_BF16_FMA), "fma");
    assert_string_equal(kern_bf16_dot_name(KERN_BF16_DPBF16), "dpbf16");
    assert_int_equal(kern_set_bf16_dot((enum kern_bf16_dot)5), DX_EINVAL);
    enum kern_bf16_dot best = kern_bf16_dot_detect();
    assert_int_equal(kern_set_bf16_dot(KERN_BF16_FMA), 0);
    assert_int_equal(kern_get_bf16_dot(), KERN_BF16_FMA);
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) {
        assert_int_equal(best, KERN_BF16_FMA);
        assert_int_equal(kern_set_bf16_dot(KERN_BF16_DPBF16), DX_EUNSUPPORTED);
    }
    assert_int_equal(kern_set_bf16_dot(best), 0);
}

static void test_bf16_dpbf16(void **state)
{
    (void)state;
    __builtin_cpu_init();
    if (kern_isa_detect() < KERN_AVX512 || !__builtin_cpu_supports("avx512bf16")) {
        print_message("this CPU lacks AVX512-BF16: the vdpbf16ps tiles are not checked here\n");
        skip();
    }
    enum kern_bf16_dot was = kern_get_bf16_dot();
    assert_int_equal(kern_set_bf16_dot(KERN_BF16_DPBF16), 0);
    check_shapes(KERN_AVX512, DX_BF16, 0);
    check_invariance(KERN_AVX512, DX_BF16, 100, 37);
    check_invariance(KERN_AVX512, DX_BF16, 33, 21);
    check_invariance(KERN_AVX512, DX_BF16, 1024, 19);
    /* the two ways do round differently: the choice is one process's */
    inv_case a;
    assert_int_equal(kern_set_bf16_dot(KERN_BF16_FMA), 0);
    inv_setup(&a, DX_BF16, 1024, 64, 33);
    assert_int_equal(kern_set_bf16_dot(KERN_BF16_DPBF16), 0);
    float *y = dx_malloc(33 * 64 * sizeof(float));
    matmul_all(DX_BF16, a.w, a.x, 33, 1024, 64, y);
    print_message("fma and dpbf16 equal on %d of %d outputs\n",
                  (int)(33 * 64) - (int)count_diff(y, a.ref, 33 * 64), 33 * 64);
    dx_free(y);
    inv_free(&a);
    assert_int_equal(kern_set_bf16_dot(was), 0);
}

/* The two ways a lone token walks the streamed types' rows: the choice,
 * its errors, and on every ISA the one-row walk (KERN_DECODE_ROWS) giving
 * the bits of the wide tiles (KERN_DECODE_TILES), token by token against
 * the whole batch, in odd row ranges and on a 2-thread pool, for every
 * streamed type (with both BF16 dots on AVX-512). */
static void test_decode_select(void **state)
{
    (void)state;
    assert_string_equal(kern_decode_name(KERN_DECODE_TILES), "tiles");
    assert_string_equal(kern_decode_name(KERN_DECODE_ROWS), "rows");
    assert_string_equal(kern_decode_name((enum kern_decode)9), "unknown");
    assert_int_equal(kern_set_decode((enum kern_decode)9), DX_EINVAL);
    enum kern_decode best = kern_decode_detect();
    __builtin_cpu_init();
    if (!__builtin_cpu_is("amd") || kern_isa_detect() < KERN_AVX512)
        assert_int_equal(best, KERN_DECODE_TILES);
    else
        assert_int_equal(best, KERN_DECODE_ROWS);
    assert_int_equal(kern_set_decode(KERN_DECODE_ROWS), 0);
    assert_int_equal(kern_get_decode(), KERN_DECODE_ROWS);
    assert_int_equal(kern_set_decode(KERN_DECODE_TILES), 0);
    assert_int_equal(kern_get_decode(), KERN_DECODE_TILES);
    assert_int_equal(kern_set_decode(best), 0);
}

/* wtype's reference batch with tiles, then every lone-token path by rows. */
static void check_decode_rows(enum kern_isa isa, int wtype, size_t n_in, size_t n_out)
{
    assert_int_equal(kern_set_isa(isa), 0);
    assert_int_equal(kern_set_decode(KERN_DECODE_TILES), 0);
    inv_case c;
    inv_setup(&c, wtype, n_in, n_out, 33);
    inv_chunks(&c, 1); /* tiles, as test_mm_invariance */
    assert_int_equal(kern_set_decode(KERN_DECODE_ROWS), 0);
    inv_chunks(&c, 1);
    inv_chunks(&c, 5);
    static const size_t odd[] = {3, 5, 7, 1, 13}, wide[] = {16, 32, 4};
    inv_splits(&c, odd, DX_ARRAY_LEN(odd));
    inv_splits(&c, wide, DX_ARRAY_LEN(wide));
    inv_batched(&c, 17, 1, 0);
    inv_pool(&c);
    inv_free(&c);
}

static void test_decode_rows(void **state)
{
    enum kern_isa isa = kti_use(state);
    enum kern_decode was = kern_get_decode();
    enum kern_bf16_dot dot = kern_get_bf16_dot();
    static const int streamed[] = {DX_F32, DX_F16, DX_BF16};
    for (size_t d = 0; d < DX_ARRAY_LEN(streamed); d++) {
        int t = streamed[d];
        for (int way = 0; way < 2; way++) {
            if (way == 1) { /* the other BF16 dot, where the CPU has it */
                if (t != DX_BF16 || isa == KERN_AVX2 || !__builtin_cpu_supports("avx512bf16"))
                    continue;
                assert_int_equal(
                    kern_set_bf16_dot(dot == KERN_BF16_FMA ? KERN_BF16_DPBF16 : KERN_BF16_FMA), 0);
            }
            check_decode_rows(isa, t, 1024, 37); /* 16 + 16 + 4 + 1 rows as tiles */
            check_decode_rows(isa, t, 100, 21);  /* a K remainder */
            check_decode_rows(isa, t, 33, 3);
            assert_int_equal(kern_set_bf16_dot(dot), 0);
        }
    }
    assert_int_equal(kern_set_decode(was), 0);
}

/* What the driver relies on: every token count up to mr has shapes, widest
 * first, the last one row (so no row is left out); a block of rows is masked
 * to a multiple of block_rows, which must be a power of two.  Data only, so
 * it is checked whatever the CPU runs. */
/* A list of row-tile shapes: widest first, the last a single row. */
static void check_tile_shapes(const kern_mm_tile *sh)
{
    int i = 0;
    for (; i < KERN_MM_SHAPES && sh[i].fn; i++)
        if (i > 0) assert_true(sh[i].nr < sh[i - 1].nr);
    assert_true(i > 0);
    assert_int_equal(sh[i - 1].nr, 1);
}

static void check_isa_table(const kern_mm_isa *isa)
{
    assert_true(isa->mr >= 1 && isa->mr <= KERN_MM_MR_MAX);
    assert_true(isa->block_rows >= 1 && (isa->block_rows & (isa->block_rows - 1)) == 0);
    assert_non_null(isa->prep[KERN_ACT_Q8]);
    assert_non_null(isa->prep[KERN_ACT_Q8K]);
    size_t n_supported = 0;
    for (int t = 0; t < DX_DTYPE_ID_MAX; t++) {
        if (!dx_dtype_supported(t)) {
            assert_null(isa->tiles[t]);
            continue;
        }
        n_supported++;
        assert_true(kern_act_kind(t) >= 0 && kern_act_kind(t) < KERN_ACT_KINDS);
        const kern_mm_tiles *T = isa->tiles[t];
        if (!T) fail_msg("no tiles for %s", dx_dtype_name(t));
        assert_true(T->mr >= 0 && T->mr <= KERN_MM_MR_MAX);
        for (int m = 1; m <= (T->mr ? T->mr : isa->mr); m++) check_tile_shapes(T->by[m]);
    }
    /* a lone token's own tiles, only for a type that has tiles */
    for (int t = 0; t < DX_DTYPE_ID_MAX; t++) {
        if (!isa->decode[t]) continue;
        assert_non_null(isa->tiles[t]);
        check_tile_shapes(isa->decode[t]->by[1]);
    }
    /* the streamed types walk by rows with tiles[]'s shapes: no decode tiles */
    assert_null(isa->decode[DX_F32]);
    assert_null(isa->decode[DX_F16]);
    assert_null(isa->decode[DX_BF16]);
    assert_int_equal(n_supported, DX_ARRAY_LEN(wtypes)); /* every supported type is tested */
}

static void test_isa_tables(void **state)
{
    (void)state;
    check_isa_table(&kern_mm_isa_avx2);
    check_isa_table(&kern_mm_isa_avx512);
    /* BF16 takes the scalar conversion on AVX2 */
    assert_null(kern_mm_isa_avx2.prep[KERN_ACT_BF16]);
    assert_non_null(kern_mm_isa_avx512.prep[KERN_ACT_BF16]);
    assert_int_equal(kern_act_kind(DX_Q4_0), kern_act_kind(DX_Q8_0));
    assert_int_equal(kern_act_kind(DX_IQ4_NL), kern_act_kind(DX_Q5_1));
    assert_int_equal(kern_act_kind(DX_Q4_K), kern_act_kind(DX_IQ4_XS));
    assert_int_not_equal(kern_act_kind(DX_Q4_K), kern_act_kind(DX_Q8_0));
    assert_int_equal(kern_act_kind(15), DX_NONE); /* q8_K weights: no kernels */
    assert_int_equal(kern_act_bytes(15, 1, 256), 0);
    /* the super-block formats take whole super-blocks, 320 bytes each */
    assert_int_equal(kern_act_bytes(DX_Q6_K, 2, 512), 2 * 2 * 320);
    assert_int_equal(kern_act_bytes(DX_Q4_K, 1, 96), 0);
    assert_int_equal(kern_act_bytes(DX_IQ4_XS, 1, 288), 0);
    assert_int_equal(kern_act_bytes_max(3, 96), 3 * (2 * 192 + 64)); /* Q8 with its tail */
}

/* ---- block formats: every ISA bit-equal to the scalar twin ---- */

/* All tokens at once with the active ISA in ranges cycling through sizes,
 * against one scalar run. */
static void check_blk_bits(enum kern_isa isa, int wtype, size_t n_tok, size_t n_in, size_t n_out,
                           const size_t *sizes, size_t n_sizes)
{
    void *w = make_weights(wtype, n_out, n_in);
    float *x = dx_malloc(n_tok * n_in * sizeof(float));
    float *ref = dx_malloc(n_tok * n_out * sizeof(float)), *y = dx_calloc(n_tok * n_out, 4);
    fill_random(x, n_tok * n_in);
    assert_int_equal(kern_set_isa(KERN_SCALAR), 0);
    matmul_all(wtype, w, x, n_tok, n_in, n_out, ref);
    assert_int_equal(kern_set_isa(isa), 0);
    void *act = prep(wtype, x, n_tok, n_in);
    for (size_t o = 0, i = 0; o < n_out; i++) {
        size_t o1 = o + sizes[i % n_sizes] < n_out ? o + sizes[i % n_sizes] : n_out;
        kern_matmul(wtype, w, n_in, o, o1, act, n_tok, y, n_out);
        o = o1;
    }
    if (memcmp(y, ref, n_tok * n_out * sizeof(float)) != 0) {
        for (size_t i = 0; i < n_tok * n_out; i++)
            if (memcmp(&y[i], &ref[i], 4) != 0)
                fail_msg("%s %s tok=%zu in=%zu out=%zu: t=%zu o=%zu %.9g != scalar %.9g",
                         kern_isa_name(isa), dx_dtype_name(wtype), n_tok, n_in, n_out, i / n_out,
                         i % n_out, y[i], ref[i]);
    }
    dx_aligned_free(act);
    dx_free(w);
    dx_free(x);
    dx_free(ref);
    dx_free(y);
}

static void test_blk_bit_exact(void **state)
{
    enum kern_isa isa = kti_use(state);
    static const size_t blk_n_ins[] = {32, 96, 160, 352, 1056};
    static const size_t kq_n_ins[] = {256, 512, 768, 1024, 2816};
    static const size_t one[] = {SIZE_MAX / 2}, odd[] = {3, 5, 7, 1, 13}, tiles[] = {16, 32, 4};
    for (size_t d = 0; d < DX_ARRAY_LEN(blk_types); d++) {
        int kq = is_kq(blk_types[d]);
        const size_t *n_ins = kq ? kq_n_ins : blk_n_ins;
        for (size_t n_tok = 1; n_tok <= 40; n_tok++)
            check_blk_bits(isa, blk_types[d], n_tok, n_ins[n_tok % 5], 37, one, 1);
        check_blk_bits(isa, blk_types[d], 13, n_ins[2], 53, odd, DX_ARRAY_LEN(odd));
        check_blk_bits(isa, blk_types[d], 6, n_ins[1], 70, tiles, DX_ARRAY_LEN(tiles));
        check_blk_bits(isa, blk_types[d], 1, n_ins[4], 70, odd, DX_ARRAY_LEN(odd));
        check_blk_bits(isa, blk_types[d], 2, n_ins[3], 45, odd, DX_ARRAY_LEN(odd));
    }
}

/* ---- the super-block twins' own decoding against dx_kquant's ----
 * With the weights' d (and dmin) set to 1, every dequantised value is a
 * small integer, sc * v (- m), and so is the kernel's output for an
 * activation row with one quant 1 at element e (its bsum 1) and scale 1:
 * both exact, so they must be equal wherever the decoding of either puts
 * each weight, scale and minimum. */

static void one_hot_act(uint8_t *act, size_t n_in, size_t e)
{
    memset(act, 0, kern_act_bytes(DX_Q4_K, 1, n_in));
    for (size_t sb = 0; sb < n_in / DX_QK_K; sb++) {
        float one = 1.0f;
        memcpy(act + sb * KERN__Q8K_BYTES + 288, &one, 4);
    }
    uint8_t *p = act + (e / DX_QK_K) * KERN__Q8K_BYTES;
    p[e % DX_QK_K] = 1;
    int16_t bs = 1;
    memcpy(p + 256 + 2 * ((e % DX_QK_K) / 16), &bs, 2);
}

/* d (and dmin) of every super-block of a row set to 1. */
static void unit_factors(int wt, uint8_t *row, size_t n_in)
{
    size_t bb = dx_dtype_block_bytes(wt);
    size_t d = wt == DX_Q2_K   ? offsetof(dx_block_q2_k, d)
               : wt == DX_Q3_K ? offsetof(dx_block_q3_k, d)
               : wt == DX_Q6_K ? offsetof(dx_block_q6_k, d)
                               : 0;
    uint16_t one = dx_f32_to_f16(1.0f);
    for (size_t b = 0; b < n_in / DX_QK_K; b++) {
        memcpy(row + b * bb + d, &one, 2);
        if (wt == DX_Q2_K || wt == DX_Q4_K || wt == DX_Q5_K) memcpy(row + b * bb + d + 2, &one, 2);
    }
}

static void test_kq_twin_layout(void **state)
{
    enum kern_isa isa = kti_use(state);
    /* two super-blocks a row; 13 rows: every decode tile shape (8, 4, 1) */
    const size_t n_in = 512, n_out = 13;
    uint8_t *act = dx_aligned_alloc(64, kern_act_bytes(DX_Q4_K, 1, n_in));
    float *deq = dx_malloc(n_out * n_in * sizeof(float));
    for (size_t d = 0; d < DX_ARRAY_LEN(kq_types); d++) {
        int wt = kq_types[d];
        uint8_t *w = make_weights(wt, n_out, n_in);
        size_t rb = dx_dtype_row_bytes(wt, n_in);
        for (size_t o = 0; o < n_out; o++) {
            unit_factors(wt, w + o * rb, n_in);
            assert_int_equal(dx_dtype_to_f32_row(wt, w + o * rb, deq + o * n_in, n_in), 0);
        }
        for (size_t e = 0; e < n_in; e++) {
            one_hot_act(act, n_in, e);
            float y[13];
            kern_matmul(wt, w, n_in, 0, n_out, act, 1, y, n_out);
            for (size_t o = 0; o < n_out; o++)
                if (!(y[o] == deq[o * n_in + e]))
                    fail_msg("%s %s row %zu element %zu: kernel %.9g, dequantised %.9g",
                             kern_isa_name(isa), dx_dtype_name(wt), o, e, y[o], deq[o * n_in + e]);
        }
        dx_free(w);
    }
    dx_free(deq);
    dx_aligned_free(act);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isa_select),  cmocka_unit_test(test_prep_layout),
        cmocka_unit_test(test_isa_tables),  cmocka_unit_test(test_bf16_dot_select),
        cmocka_unit_test(test_bf16_dpbf16), cmocka_unit_test(test_decode_select),
        KTI_FAST(test_decode_rows),         KTI_FAST(test_prep_bits),
        KTI_FAST(test_prep_bits_q8k),       KTI_ALL(test_mm_invariance),
        KTI_AMX(test_mm_invariance),        KTI_FAST(test_mm_matches_scalar),
        KTI_AMX(test_mm_matches_scalar),    KTI_FAST(test_blk_bit_exact),
        KTI_AMX(test_blk_bit_exact),        KTI_ALL(test_kq_twin_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
