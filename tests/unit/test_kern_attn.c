/* Unit tests for the attention and elementwise kernels (kern_attn*.c,
 * kern_ops*.c): scalar attention against a double-precision reference, each
 * fast path against scalar, bit-exact batch invariance (chunking, kv-head
 * split, GQA ratios, block sizes, unaligned start, and the split form
 * kern_attn_part + kern_attn_merge) per ISA and KV type — also at depths past
 * 8192 with query chunks that cross history splits — and the elementwise ops
 * against direct formulas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern.h"
#include "engine/kern/kern_attn_priv.h"
#include "kern_test_isa.h"

/* ------------------------------------------------------------ fixtures */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rnd(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

enum { N_LAYER = 2, LAYER = 1, N_KV = 4 };

/* A KV arena of n_blocks blocks, all layers, random K/V, and a block table
 * that visits blocks in a shuffled, non-contiguous order. */
typedef struct {
    kern_attn_layout L;
    uint8_t *arena;
    int32_t *blocks;
    float *q; /* [n_q][n_head][head_dim] */
    size_t n_q, pos0;
} attn_case;

static size_t esize(int t)
{
    return t == DX_F32 ? 4 : t == DX_Q8_0 ? 1 : 2;
}

static void store_elem(int t, uint8_t *p, float f)
{
    if (t == DX_F32) {
        memcpy(p, &f, 4);
    } else {
        uint16_t h = t == DX_F16 ? dx_f32_to_f16(f) : dx_f32_to_bf16(f);
        memcpy(p, &h, 2);
    }
}

static float load_elem(int t, const uint8_t *p)
{
    uint16_t h;
    float f;
    if (t == DX_F32) {
        memcpy(&f, p, 4);
        return f;
    }
    memcpy(&h, p, 2);
    return t == DX_F16 ? dx_f16_to_f32(h) : dx_bf16_to_f32(h);
}

/* Every token row of every layer's K and V of a q8_0 arena: random values
 * in [-2, 2) quantised as the forward pass stores them. */
static void fill_q8(const kern_attn_layout *L, uint8_t *arena, size_t n_blocks)
{
    float k[512], v[512];
    for (size_t b = 0; b < n_blocks; b++)
        for (int l = 0; l < N_LAYER; l++) {
            uint8_t *blk = arena + b * L->block_bytes + (size_t)l * (L->v_off - L->k_off) * 2;
            for (int h = 0; h < N_KV; h++)
                for (int j = 0; j < L->block_size; j++) {
                    for (int d = 0; d < L->head_dim; d++) k[d] = 2.0f * rnd(), v[d] = 2.0f * rnd();
                    kern_attn_store_q8(L, blk, blk + (L->v_off - L->k_off), h, j, k, v);
                }
        }
}

static void case_init(attn_case *c, int kv_type, int G, int bs, int D, size_t pos0, size_t n_q)
{
    memset(c, 0, sizeof(*c));
    size_t es = esize(kv_type), region = (size_t)N_KV * kern_attn_head_bytes(kv_type, bs, D);
    size_t need = (pos0 + n_q + bs - 1) / bs, n_blocks = need * 2 + 3;
    c->L = (kern_attn_layout){.block_bytes = N_LAYER * 2 * region,
                              .k_off = LAYER * 2 * region,
                              .v_off = LAYER * 2 * region + region,
                              .kv_type = kv_type,
                              .block_size = bs,
                              .head_dim = D,
                              .n_head = N_KV * G,
                              .n_kv_head = N_KV,
                              .scale = 1.0f / sqrtf((float)D)};
    c->arena = dx_aligned_alloc(64, n_blocks * c->L.block_bytes);
    assert_non_null(c->arena);
    if (kv_type == DX_Q8_0)
        fill_q8(&c->L, c->arena, n_blocks);
    else
        for (size_t i = 0; i < n_blocks * c->L.block_bytes / es; i++)
            store_elem(kv_type, c->arena + i * es, 2.0f * rnd());
    c->L.base = c->arena;
    /* Shuffle all block ids and use the first `need`. */
    int32_t *perm = dx_calloc(n_blocks, sizeof(int32_t));
    for (size_t i = 0; i < n_blocks; i++) perm[i] = (int32_t)i;
    for (size_t i = n_blocks - 1; i > 0; i--) {
        size_t j = (size_t)((rnd() + 1.0f) * 0.5f * (float)(i + 1)) % (i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    c->blocks = perm;
    c->n_q = n_q;
    c->pos0 = pos0;
    size_t nq = n_q * (size_t)c->L.n_head * D;
    c->q = dx_calloc(nq, sizeof(float));
    for (size_t i = 0; i < nq; i++) c->q[i] = 2.0f * rnd();
}

static void case_free(attn_case *c)
{
    dx_aligned_free(c->arena);
    dx_free(c->blocks);
    dx_free(c->q);
}

static float *out_alloc(const attn_case *c)
{
    return dx_calloc(c->n_q * (size_t)c->L.n_head * c->L.head_dim, sizeof(float));
}

typedef void (*attn_fn)(const kern_attn_layout *, const int32_t *, size_t, size_t, const float *,
                        float *, int, int, void *);

/* Query tokens [t0, t0+n) of the case, heads [h0, h1), with scratch sized
 * exactly for n queries so overruns show under ASan. */
static void run_attn(attn_fn fn, const attn_case *c, size_t t0, size_t n, int h0, int h1,
                     float *out)
{
    size_t bytes = kern_attn_scratch_bytes(&c->L, n);
    void *scratch = dx_aligned_alloc(64, bytes);
    assert_non_null(scratch);
    size_t row = (size_t)c->L.n_head * c->L.head_dim;
    fn(&c->L, c->blocks, c->pos0 + t0, n, c->q + t0 * row, out + t0 * row, h0, h1, scratch);
    dx_aligned_free(scratch);
}

/* K (v = 0) or V (v = 1) of (kv head h, key j, dim d) as stored, exactly
 * (q8_0: scale * quant, from kern.h's layout formulas). */
static double kv_value(const attn_case *c, int v, int h, size_t j, int d)
{
    const kern_attn_layout *L = &c->L;
    size_t bs = (size_t)L->block_size, jb = j % bs;
    const uint8_t *r = L->base + c->blocks[j / bs] * L->block_bytes + (v ? L->v_off : L->k_off);
    if (L->kv_type == DX_Q8_0) {
        uint16_t sc;
        int g = d / 32;
        size_t qo = v ? kern_attn_q8_v(L, h, (int)jb, d) : kern_attn_q8_k(L, h, (int)jb, d);
        memcpy(&sc, r + (v ? kern_attn_q8_vs(L, h, (int)jb, g) : kern_attn_q8_ks(L, h, (int)jb, g)),
               2);
        return (double)dx_f16_to_f32(sc) * (int8_t)r[qo];
    }
    size_t i = v ? kern_attn_v_index(L, h, (int)jb, d) : kern_attn_k_index(L, h, (int)jb, d);
    return load_elem(L->kv_type, r + i * esize(L->kv_type));
}

/* A query row as the kernels see it: for a q8_0 K quantised (the scores
 * are exact integer dots of those quants), else as is. */
static void query_seen(const kern_attn_layout *L, const float *q, double *out)
{
    int D = L->head_dim;
    if (L->kv_type != DX_Q8_0) {
        for (int d = 0; d < D; d++) out[d] = q[d];
        return;
    }
    int8_t qs[512];
    uint16_t sc[16];
    kern_q8_quant_scalar(q, (size_t)D, qs, sc);
    for (int d = 0; d < D; d++) out[d] = (double)dx_f16_to_f32(sc[d / 32]) * qs[d];
}

/* Naive attention in double over the same stored K/V. */
static void attn_naive(const attn_case *c, double *out)
{
    const kern_attn_layout *L = &c->L;
    int G = L->n_head / L->n_kv_head, D = L->head_dim;
    double *s = dx_calloc(c->pos0 + c->n_q, sizeof(double)), q[512];
    for (size_t t = 0; t < c->n_q; t++)
        for (int hq = 0; hq < L->n_head; hq++) {
            size_t pos = c->pos0 + t;
            int h = hq / G;
            query_seen(L, c->q + (t * L->n_head + hq) * D, q);
            double mx = -INFINITY, l = 0;
            for (size_t j = 0; j <= pos; j++) {
                double dot = 0;
                for (int d = 0; d < D; d++) dot += q[d] * kv_value(c, 0, h, j, d);
                s[j] = dot * L->scale;
                mx = s[j] > mx ? s[j] : mx;
            }
            double *o = out + (t * L->n_head + hq) * D;
            for (int d = 0; d < D; d++) o[d] = 0;
            for (size_t j = 0; j <= pos; j++) {
                double p = exp(s[j] - mx);
                l += p;
                for (int d = 0; d < D; d++) o[d] += p * kv_value(c, 1, h, j, d);
            }
            for (int d = 0; d < D; d++) o[d] /= l;
        }
    dx_free(s);
}

static const int kv_types[4] = {DX_F16, DX_BF16, DX_F32, DX_Q8_0};

/* ISAs this CPU supports, scalar first. */
/* The tests below check every ISA this CPU has; this one reports, as a
 * skipped test, the fast ISAs it lacks (they are not checked here). */
static void test_isas_checked(void **state)
{
    (void)state;
    if (kern_isa_detect() < KERN_AVX512) {
        print_message("this CPU lacks %s: its attention kernels are not checked here\n",
                      kern_isa_name(kern_isa_detect() < KERN_AVX2 ? KERN_AVX2 : KERN_AVX512));
        skip();
    }
}

/* Up to AVX-512: KERN_AMX's attention is the AVX-512 path's. */
static int isa_list(enum kern_isa *isas)
{
    int n = 0, top = kern_isa_detect() < KERN_AVX512 ? (int)kern_isa_detect() : KERN_AVX512;
    for (int i = KERN_SCALAR; i <= top; i++) isas[n++] = (enum kern_isa)i;
    return n;
}

/* ------------------------------------------------------------ accuracy */

static void test_scalar_vs_naive(void **state)
{
    (void)state;
    for (int ti = 0; ti < 4; ti++) {
        attn_case c;
        case_init(&c, kv_types[ti], 2, 16, 64, 3, 60);
        float *out = out_alloc(&c);
        size_t n = c.n_q * c.L.n_head * c.L.head_dim;
        double *ref = dx_calloc(n, sizeof(double));
        run_attn(kern_attn_scalar, &c, 0, c.n_q, 0, N_KV, out);
        attn_naive(&c, ref);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double e = fabs(out[i] - ref[i]);
            worst = e > worst ? e : worst;
        }
        /* Outputs are convex mixes of V in [-2, 2]; float rounding over a
         * 64-term dot and ~60 keys (measured worst 1e-6) stays below 1e-5. */
        assert_true(worst < 1e-5);
        dx_free(ref);
        dx_free(out);
        case_free(&c);
    }
}

static void test_fast_vs_scalar(void **state)
{
    (void)state;
    enum kern_isa isas[3];
    int n_isa = isa_list(isas);
    static const int shapes[][4] = {/* G, bs, D, pos0 */ {2, 16, 64, 0},
                                    {4, 32, 128, 5},
                                    {1, 48, 64, 37},
                                    /* 72: AVX-512 falls back to AVX2; 36 and block
                                     * size 4: to scalar */
                                    {2, 16, 72, 3},
                                    {2, 16, 36, 1},
                                    {2, 4, 64, 1}};
    for (size_t si = 0; si < DX_ARRAY_LEN(shapes); si++)
        for (int ti = 0; ti < 4; ti++) {
            if (kv_types[ti] == DX_Q8_0 && shapes[si][2] % 32) continue; /* no such q8_0 pool */
            attn_case c;
            case_init(&c, kv_types[ti], shapes[si][0], shapes[si][1], shapes[si][2],
                      (size_t)shapes[si][3], 41);
            size_t n = c.n_q * c.L.n_head * c.L.head_dim;
            float *ref = out_alloc(&c), *out = out_alloc(&c);
            run_attn(kern_attn_scalar, &c, 0, c.n_q, 0, N_KV, ref);
            for (int ii = 1; ii < n_isa; ii++) {
                assert_int_equal(kern_set_isa(isas[ii]), 0);
                memset(out, 0xff, n * sizeof(float));
                run_attn(kern_attn, &c, 0, c.n_q, 0, N_KV, out);
                /* Only the exp polynomial and the summation orders differ (measured
                 * worst 1.8e-6 on outputs of magnitude up to 2). */
                for (size_t i = 0; i < n; i++) assert_true(fabsf(out[i] - ref[i]) < 1e-5f);
            }
            assert_int_equal(kern_set_isa(kern_isa_detect()), 0);
            dx_free(ref);
            dx_free(out);
            case_free(&c);
        }
}

/* ------------------------------------------------------------ invariance */

/* The split form: kern_attn_part for every split, then kern_attn_merge, must
 * give kern_attn's bits; rows whose position precedes a split must be left
 * alone by it (their part slots keep a poison that would show). */
static void check_split_form(const attn_case *c, const float *ref)
{
    const kern_attn_layout *L = &c->L;
    int G = L->n_head / L->n_kv_head, D = L->head_dim;
    size_t PF = kern_attn_part_floats(L), rows = c->n_q * (size_t)G;
    size_t n_split = (c->pos0 + c->n_q - 1) / KERN_ATTN_SPLIT + 1, row = (size_t)L->n_head * D;
    float *part = dx_calloc(n_split * rows * PF, sizeof(float)), *out = out_alloc(c);
    void *scratch = dx_aligned_alloc(64, kern_attn_scratch_bytes(L, c->n_q));
    for (int h = 0; h < N_KV; h++) {
        for (size_t i = 0; i < n_split * rows * PF; i++) part[i] = NAN;
        /* splits in reverse order: no part may depend on another */
        for (size_t sp = n_split; sp-- > 0;)
            kern_attn_part(L, c->blocks, c->pos0, c->n_q, c->q, h, sp, part + sp * rows * PF,
                           scratch);
        kern_attn_merge(L, c->pos0, c->n_q, h, part, rows * PF, out);
    }
    assert_memory_equal(out, ref, c->n_q * row * sizeof(float));
    dx_aligned_free(scratch);
    dx_free(part);
    dx_free(out);
}

/* Query tokens [pos0, pos0 + n_q): all in one call is the reference; chunks
 * of 1, 7, 16 and 33 (with a long history, boundaries inside a split), one kv
 * head at a time, and the split form must reproduce it bit for bit. */
static void check_invariance(int kv_type, int G, int bs, int D, size_t pos0, size_t n_q)
{
    attn_case c;
    case_init(&c, kv_type, G, bs, D, pos0, n_q);
    size_t bytes = c.n_q * c.L.n_head * c.L.head_dim * sizeof(float);
    float *ref = out_alloc(&c), *out = out_alloc(&c);
    run_attn(kern_attn, &c, 0, c.n_q, 0, N_KV, ref);
    static const size_t chunks[] = {1, 7, 16, 33};
    for (size_t ci = 0; ci < DX_ARRAY_LEN(chunks); ci++) {
        memset(out, 0, bytes);
        for (size_t t0 = 0; t0 < c.n_q; t0 += chunks[ci]) {
            size_t n = c.n_q - t0 < chunks[ci] ? c.n_q - t0 : chunks[ci];
            run_attn(kern_attn, &c, t0, n, 0, N_KV, out);
        }
        assert_memory_equal(out, ref, bytes);
    }
    memset(out, 0, bytes);
    for (int h = N_KV - 1; h >= 0; h--) run_attn(kern_attn, &c, 0, c.n_q, h, h + 1, out);
    assert_memory_equal(out, ref, bytes);
    check_split_form(&c, ref);
    dx_free(ref);
    dx_free(out);
    case_free(&c);
}

static void test_invariance(void **state)
{
    (void)state;
    enum kern_isa isas[3];
    int n_isa = isa_list(isas);
    /* 48: a 32-key step spans two blocks; 4: the scalar path */
    static const int gs[] = {1, 2, 4}, bss[] = {16, 32, 48};
    for (int ii = 0; ii < n_isa; ii++) {
        assert_int_equal(kern_set_isa(isas[ii]), 0);
        for (int ti = 0; ti < 4; ti++) {
            /* The scalar path is per row by construction: one layout is enough. */
            int n_cfg = isas[ii] == KERN_SCALAR ? 1 : 9;
            for (int k = 0; k < n_cfg; k++)
                check_invariance(kv_types[ti], gs[k % 3], bss[k / 3], 64, (size_t)(5 + k), 100);
            if (isas[ii] != KERN_SCALAR) {
                check_invariance(kv_types[ti], 2, 16, 128, 16, 100);
                check_invariance(kv_types[ti], 2, 4, 64, 3, 100);
            }
        }
    }
    assert_int_equal(kern_set_isa(kern_isa_detect()), 0);
}

static void test_split_invariance(void **state)
{
    (void)state;
    enum kern_isa isas[3];
    int n_isa = isa_list(isas);
    for (int ii = 0; ii < n_isa; ii++) {
        assert_int_equal(kern_set_isa(isas[ii]), 0);
        for (int ti = 0; ti < 4; ti++) {
            /* two split boundaries inside the queries; a step spanning blocks */
            check_invariance(kv_types[ti], 2, 16, 64, 2 * KERN_ATTN_SPLIT - 30, 60);
            if (isas[ii] == KERN_SCALAR) continue;
            check_invariance(kv_types[ti], 4, 48, 32, KERN_ATTN_SPLIT - 5, 40);
            check_invariance(kv_types[ti], 1, 32, 128, 3 * KERN_ATTN_SPLIT + 1, 3);
        }
    }
    assert_int_equal(kern_set_isa(kern_isa_detect()), 0);
}

/* Past 8192 keys: every ISA against the double-precision reference and the
 * fast paths against scalar, then the invariance checks at that depth. */
static void test_long_depth(void **state)
{
    (void)state;
    enum kern_isa isas[3];
    int n_isa = isa_list(isas);
    for (int ti = 0; ti < 4; ti++) {
        attn_case c;
        case_init(&c, kv_types[ti], 2, 16, 32, 8 * KERN_ATTN_SPLIT - 13, 29);
        size_t n = c.n_q * c.L.n_head * c.L.head_dim;
        double *exact = dx_calloc(n, sizeof(double));
        float *ref = out_alloc(&c), *out = out_alloc(&c);
        attn_naive(&c, exact);
        for (int ii = 0; ii < n_isa; ii++) {
            assert_int_equal(kern_set_isa(isas[ii]), 0);
            run_attn(kern_attn, &c, 0, c.n_q, 0, N_KV, ii ? out : ref);
            double worst = 0, worst_vs_scalar = 0;
            for (size_t i = 0; i < n; i++) {
                float o = ii ? out[i] : ref[i];
                worst = fmax(worst, fabs(o - exact[i]));
                worst_vs_scalar = fmax(worst_vs_scalar, fabsf(o - ref[i]));
            }
            /* Outputs are mixes of ~8k values in [-2, 2]; with f32 sums
             * within 1024-key splits the measured worst is 1.8e-7. */
            if (worst > 1e-6 || worst_vs_scalar > 1e-6)
                fail_msg("%s %s: worst %g vs double, %g vs scalar", kern_isa_name(isas[ii]),
                         dx_dtype_name(kv_types[ti]), worst, worst_vs_scalar);
        }
        dx_free(exact);
        dx_free(ref);
        dx_free(out);
        case_free(&c);
        for (int ii = 1; ii < n_isa; ii++) {
            assert_int_equal(kern_set_isa(isas[ii]), 0);
            check_invariance(kv_types[ti], 2, 16, 32, 8 * KERN_ATTN_SPLIT - 13, 29);
        }
    }
    assert_int_equal(kern_set_isa(kern_isa_detect()), 0);
}

static void test_isa_select(void **state)
{
    (void)state;
    enum kern_isa best = kern_isa_detect();
    assert_int_equal(kern_set_isa(KERN_SCALAR), 0);
    assert_int_equal(kern_get_isa(), KERN_SCALAR);
    if (best < KERN_AVX512) assert_int_equal(kern_set_isa(KERN_AVX512), DX_EUNSUPPORTED);
    assert_int_equal(kern_set_isa((enum kern_isa)7), DX_EINVAL);
    assert_int_equal(kern_set_isa(best), 0);
    assert_string_equal(kern_isa_name(KERN_AVX2), "avx2");
}

/* ------------------------------------------------------------ q8_0 twins */

/* Rows of every kind a K/V or query row can have: ordinary values, an
 * all-zero group, tiny values (the f16 scale is subnormal, or rounds to 0),
 * one huge outlier, exact ties (x/scale = k + 0.5). */
static void q8_rows(float *x, size_t n, int kind)
{
    for (size_t i = 0; i < n; i++) x[i] = 3.0f * rnd();
    if (kind == 1)
        for (size_t i = 32; i < 64; i++) x[i] = 0.0f;
    if (kind == 2)
        for (size_t i = 0; i < n; i++) x[i] *= i < n / 2 ? 1e-6f : 1e-9f;
    if (kind == 3) x[5] = 1e4f;
    if (kind == 4)
        for (size_t i = 0; i < n; i++)
            x[i] = (float)((int)(i % 64) - 32) + 0.5f; /* scale 1/127*... */
}

static void test_q8_quant_twins(void **state)
{
    enum kern_isa isa = kti_use(state);
    enum { N = 512 };
    float x[N];
    int8_t qs[N], ref_q[N];
    uint16_t d[N / 32], ref_d[N / 32];
    for (int kind = 0; kind < 5; kind++) {
        q8_rows(x, N, kind);
        kern_q8_quant_scalar(x, N, ref_q, ref_d);
        memset(qs, 0x55, sizeof qs);
        kern_q8_quant(x, N, qs, d);
        if (memcmp(qs, ref_q, N) || memcmp(d, ref_d, sizeof d))
            fail_msg("%s: kind %d: quants differ from the scalar twin", kern_isa_name(isa), kind);
        /* what the format promises: |q| <= 127, and each value within half a
         * step of its dequantised one (plus the f16 rounding of the scale) */
        for (int i = 0; i < N; i++) {
            float sc = dx_f16_to_f32(ref_d[i / 32]);
            assert_true(ref_q[i] >= -127 && ref_q[i] <= 127);
            float amax = 0;
            for (int j = i / 32 * 32; j < i / 32 * 32 + 32; j++) amax = fmaxf(amax, fabsf(x[j]));
            if (amax / 127.0f >= 6.2e-5f) /* normal f16 scales */
                assert_true(fabsf(sc * ref_q[i] - x[i]) <= 0.5f * sc + 1e-3f * amax / 127.0f);
            if (amax == 0.0f) assert_true(sc == 0.0f && ref_q[i] == 0);
        }
    }
}

/* A q8_0 span of 8 halves (four steps) over case c's blocks from key p, as
 * the driver builds it, V scales converted into vsf[8][16][D/32]. */
static void q8_span(const attn_case *c, int h, size_t p, int nh, float *vsf, kern_attn_span *sp)
{
    const kern_attn_layout *L = &c->L;
    size_t bs = (size_t)L->block_size, D = (size_t)L->head_dim, ng = D / 32;
    memset(sp, 0, sizeof *sp);
    sp->nh = nh;
    sp->type = sp->vtype = DX_Q8_0;
    sp->kstride = bs;
    for (int i = 0; i < nh; i++) {
        size_t k = p + 16 * (size_t)i, o = k % bs;
        const uint8_t *base = L->base + c->blocks[k / bs] * L->block_bytes;
        const uint8_t *kr = base + L->k_off + kern_attn_q8_head(L, h);
        const uint8_t *vr = base + L->v_off + kern_attn_q8_head(L, h);
        sp->k[i] = kr + o * 4;
        sp->ks[i] = kr + bs * D + o * 2;
        sp->v[i] = vr + o * D;
        for (size_t j = 0; j < 16 * ng; j++) {
            uint16_t sc;
            memcpy(&sc, vr + bs * D + (o * ng + j) * 2, 2);
            vsf[(size_t)i * 16 * ng + j] = dx_f16_to_f32(sc);
        }
        sp->vsf[i] = vsf + (size_t)i * 16 * ng;
    }
}

static const kern_attn_isa *isa_table(enum kern_isa isa)
{
    return isa == KERN_AVX512 ? &kern_attn_isa_avx512 : &kern_attn_isa_avx2;
}

/* qk_q8 of an ISA against its scalar twin, bit for bit, for every row
 * count its tiles split into (1..13, both the 2-half and 8-half forms). */
static void test_q8_scores_twin(void **state)
{
    enum kern_isa isa = kti_use(state);
    const kern_attn_isa *T = isa_table(isa);
    static const int dims[] = {32, 64, 128};
    enum { MAXR = 13 };
    for (size_t di = 0; di < DX_ARRAY_LEN(dims); di++) {
        int D = dims[di], ng = D / 32;
        attn_case c;
        case_init(&c, DX_Q8_0, 2, 32, D, 200, 1);
        float vsf[8 * 16 * 16];
        kern_attn_row rows[MAXR], ref[MAXR];
        float s[MAXR][128], s_ref[MAXR][128], qd[MAXR][16], q[512];
        int32_t qc[MAXR][16], qt8[MAXR * 128];
        for (int r = 0; r < MAXR; r++) {
            int8_t qs[512];
            uint16_t sc[16];
            q8_rows(q, (size_t)D, r % 5);
            kern_q8_quant_scalar(q, (size_t)D, qs, sc);
            for (int g = 0; g < ng; g++) {
                int32_t sum = 0;
                for (int i = 0; i < 32; i++) sum += qs[32 * g + i];
                qd[r][g] = dx_f16_to_f32(sc[g]);
                qc[r][g] = 128 * sum;
            }
            for (int cq = 0; cq < D / 4; cq++) memcpy(&qt8[cq * MAXR + r], qs + 4 * cq, 4);
            rows[r] = (kern_attn_row){.qd = qd[r], .qc = qc[r], .s = s[r]};
            ref[r] = (kern_attn_row){.qd = qd[r], .qc = qc[r], .s = s_ref[r]};
        }
        for (int nh = 2; nh <= 8; nh += 6) {
            kern_attn_span sp;
            q8_span(&c, 1, 32, nh, vsf, &sp);
            for (int nr = 1; nr <= MAXR; nr++) {
                memset(s, 0, sizeof s);
                memset(s_ref, 0, sizeof s_ref);
                T->qk_q8(rows, nr, qt8, MAXR, &sp, D, c.L.scale);
                kern__attn_qk_q8_scalar(ref, nr, qt8, MAXR, &sp, D, c.L.scale);
                if (memcmp(s, s_ref, sizeof s))
                    fail_msg("%s: D %d, %d halves, %d rows: scores differ from the scalar twin",
                             kern_isa_name(isa), D, nh, nr);
            }
        }
        case_free(&c);
    }
}

/* pv of an ISA against its scalar twin, bit for bit, for every V type,
 * row count, key range and with and without the rescale. */
static void test_pv_twin(void **state)
{
    enum kern_isa isa = kti_use(state);
    const kern_attn_isa *T = isa_table(isa);
    enum { D = 128, MAXR = 3 };
    for (int ti = 0; ti < 4; ti++) {
        attn_case c;
        case_init(&c, kv_types[ti], 2, 16, D, 200, 1);
        float vsf[8 * 16 * 4];
        kern_attn_span sp;
        if (kv_types[ti] == DX_Q8_0) {
            q8_span(&c, 2, 64, 8, vsf, &sp);
        } else {
            memset(&sp, 0, sizeof sp);
            sp.nh = 8, sp.type = sp.vtype = kv_types[ti], sp.kstride = 16;
            for (int i = 0; i < 8; i++) {
                size_t k = 64 + 16 * (size_t)i;
                sp.v[i] = c.L.base + c.blocks[k / 16] * c.L.block_bytes + c.L.v_off +
                          kern_attn_v_index(&c.L, 2, 0, 0) * esize(kv_types[ti]);
            }
        }
        float acc[MAXR][D], acc_ref[MAXR][D], p[MAXR][128];
        kern_attn_row rows[MAXR], ref[MAXR];
        for (int r = 0; r < MAXR; r++) {
            for (int j = 0; j < 128; j++) p[r][j] = (rnd() + 1.0f) * 0.5f;
            rows[r] = (kern_attn_row){.acc = acc[r], .s = p[r]};
            for (int i = 0; i < KERN_ATTN_SPAN; i++) rows[r].alpha[i] = (rnd() + 1.0f) * 0.5f;
            ref[r] = rows[r];
            ref[r].acc = acc_ref[r];
        }
        static const int ranges[][2] = {{0, 32}, {0, 1}, {5, 17}, {16, 32}, {31, 32}};
        for (int nr = 1; nr <= T->pv_rows; nr++) /* the driver's calls have at most pv_rows */
            for (int i = 0; i < KERN_ATTN_SPAN; i++)
                for (size_t k = 0; k < DX_ARRAY_LEN(ranges); k++)
                    for (int rescale = 0; rescale < 2; rescale++) {
                        for (int r = 0; r < MAXR; r++)
                            for (int d = 0; d < D; d++) acc[r][d] = acc_ref[r][d] = rnd();
                        T->pv(rows, nr, &sp, i, ranges[k][0], ranges[k][1], D, rescale);
                        kern__attn_pv_scalar(ref, nr, &sp, i, ranges[k][0], ranges[k][1], D,
                                             rescale);
                        if (memcmp(acc, acc_ref, sizeof acc))
                            fail_msg("%s %s: pv of %d rows, step %d, keys [%d, %d) differs",
                                     kern_isa_name(isa), dx_dtype_name(kv_types[ti]), nr, i,
                                     ranges[k][0], ranges[k][1]);
                    }
        case_free(&c);
    }
}

/* ------------------------------------------------------------ elementwise */

static void test_rmsnorm(void **state)
{
    (void)state;
    enum kern_isa isas[3];
    int n_isa = isa_list(isas);
    enum { N = 3072 + 5 };
    float *x = dx_calloc(N, 4), *w = dx_calloc(N, 4), *y = dx_calloc(N, 4);
    for (int i = 0; i < N; i++) x[i] = 3.0f * rnd(), w[i] = 1.0f + rnd();
    double ss = 0;
    for (int i = 0; i < N; i++) ss += (double)x[i] * x[i];
    double sc = 1.0 / sqrt(ss / N + 1e-6);
    for (int ii = 0; ii < n_isa; ii++) {
        assert_int_equal(kern_set_isa(isas[ii]), 0);
        kern_rmsnorm(x, w, 1e-6f, N, y);
        for (int i = 0; i < N; i++) {
            double r = x[i] * sc * w[i];
            assert_true(fabs(y[i] - r) <= 1e-5 * fabs(r) + 1e-7);
        }
        /* In place gives the same bits. */
        float *z = dx_memdup(x, N * 4);
        kern_rmsnorm(z, w, 1e-6f, N, z);
        assert_memory_equal(z, y, N * 4);
        dx_free(z);
        /* eps dominates a zero / tiny row: no NaN, y = x / sqrt(eps) * w. */
        float xz[19] = {0}, wz[19], yz[19];
        for (int i = 0; i < 19; i++) wz[i] = 1.0f, xz[i] = i == 3 ? 1e-6f : 0.0f;
        kern_rmsnorm(xz, wz, 1e-2f, 19, yz);
        for (int i = 0; i < 19; i++) assert_true(fabsf(yz[i] - (i == 3 ? 1e-5f : 0.0f)) < 1e-10f);
    }
    assert_int_equal(kern_set_isa(kern_isa_detect()), 0);
    dx_free(x);
    dx_free(w);
    dx_free(y);
}

static void test_rope(void **state)
{
    (void)state;
    enum { D = 128 };
    float cs[D], x[D], y[D];
    double th[D / 2];
    int pos = 37;
    for (int i = 0; i < D / 2; i++) {
        th[i] = pos * pow(1e6, -2.0 * i / D);
        cs[2 * i] = (float)cos(th[i]);
        cs[2 * i + 1] = (float)sin(th[i]);
    }
    for (int neox = 0; neox <= 1; neox++) {
        for (int i = 0; i < D; i++) x[i] = y[i] = rnd();
        kern_rope(y, D, cs, neox);
        for (int i = 0; i < D / 2; i++) {
            int a = neox ? i : 2 * i, b = neox ? i + D / 2 : 2 * i + 1;
            double ra = x[a] * cos(th[i]) - x[b] * sin(th[i]);
            double rb = x[a] * sin(th[i]) + x[b] * cos(th[i]);
            assert_true(fabs(y[a] - ra) < 1e-6 && fabs(y[b] - rb) < 1e-6);
        }
    }
    /* Pair layouts really differ: element 1 pairs with 65 (neox) or 0. */
    float e[D] = {0};
    e[1] = 1.0f;
    kern_rope(e, D, cs, 1);
    assert_true(e[65] != 0.0f && e[0] == 0.0f);
}

static void test_swiglu_add(void **state)
{
    (void)state;
    enum kern_isa isas[3];
    int n_isa = isa_list(isas);
    enum { N = 3072 + 3 };
    float *g = dx_calloc(N, 4), *u = dx_calloc(N, 4), *gw = dx_calloc(N, 4);
    for (int i = 0; i < N; i++) g[i] = 12.0f * rnd(), u[i] = rnd();
    g[0] = -100.0f, g[1] = 100.0f, g[2] = 0.0f;
    for (int ii = 0; ii < n_isa; ii++) {
        assert_int_equal(kern_set_isa(isas[ii]), 0);
        memcpy(gw, g, N * 4);
        kern_swiglu(gw, u, N);
        for (int i = 0; i < N; i++) {
            double r = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
            assert_true(fabs(gw[i] - r) <= 2e-6 * fabs(r) + 1e-30);
        }
    }
    assert_int_equal(kern_set_isa(kern_isa_detect()), 0);
    float y[5] = {1, 2, 3, 4, 5}, x[5] = {0.5f, -2, 1e-8f, 4, -5};
    kern_add(y, x, 5);
    assert_true(y[0] == 1.5f && y[1] == 0.0f && y[2] == 3.0f && y[3] == 8.0f && y[4] == 0.0f);
    dx_free(g);
    dx_free(u);
    dx_free(gw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isas_checked),    cmocka_unit_test(test_isa_select),
        cmocka_unit_test(test_scalar_vs_naive), cmocka_unit_test(test_fast_vs_scalar),
        cmocka_unit_test(test_invariance),      cmocka_unit_test(test_split_invariance),
        cmocka_unit_test(test_long_depth),      KTI_ALL(test_q8_quant_twins),
        KTI_FAST(test_q8_scores_twin),          KTI_FAST(test_pv_twin),
        cmocka_unit_test(test_rmsnorm),         cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu_add),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
