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
    return t == DX_F32 ? 4 : 2;
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

static void case_init(attn_case *c, int kv_type, int G, int bs, int D, size_t pos0, size_t n_q)
{
    memset(c, 0, sizeof(*c));
    size_t es = esize(kv_type), region = (size_t)N_KV * bs * D * es;
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

/* Naive attention in double over the same stored K/V. */
static void attn_naive(const attn_case *c, double *out)
{
    const kern_attn_layout *L = &c->L;
    int G = L->n_head / L->n_kv_head, D = L->head_dim, bs = L->block_size;
    size_t es = esize(L->kv_type);
    double *s = dx_calloc(c->pos0 + c->n_q, sizeof(double));
    for (size_t t = 0; t < c->n_q; t++)
        for (int hq = 0; hq < L->n_head; hq++) {
            size_t pos = c->pos0 + t, h = (size_t)(hq / G);
            const float *q = c->q + (t * L->n_head + hq) * D;
            double mx = -INFINITY, l = 0;
            for (size_t j = 0; j <= pos; j++) {
                const uint8_t *k = L->base + c->blocks[j / bs] * L->block_bytes + L->k_off;
                double dot = 0;
                for (int d = 0; d < D; d++)
                    dot += (double)q[d] *
                           load_elem(L->kv_type, k + kern_attn_k_index(L, (int)h, (int)(j % bs), d) * es);
                s[j] = dot * L->scale;
                mx = s[j] > mx ? s[j] : mx;
            }
            double *o = out + (t * L->n_head + hq) * D;
            for (int d = 0; d < D; d++) o[d] = 0;
            for (size_t j = 0; j <= pos; j++) {
                const uint8_t *v = L->base + c->blocks[j / bs] * L->block_bytes + L->v_off +
                                   kern_attn_v_index(L, (int)h, (int)(j % bs), 0) * es;
                double p = exp(s[j] - mx);
                l += p;
                for (int d = 0; d < D; d++) o[d] += p * load_elem(L->kv_type, v + d * es);
            }
            for (int d = 0; d < D; d++) o[d] /= l;
        }
    dx_free(s);
}

static const int kv_types[3] = {DX_F16, DX_BF16, DX_F32};

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

static int isa_list(enum kern_isa *isas)
{
    int n = 0;
    for (int i = KERN_SCALAR; i <= (int)kern_isa_detect(); i++) isas[n++] = (enum kern_isa)i;
    return n;
}

/* ------------------------------------------------------------ accuracy */

static void test_scalar_vs_naive(void **state)
{
    (void)state;
    for (int ti = 0; ti < 3; ti++) {
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
        for (int ti = 0; ti < 3; ti++) {
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
        for (int ti = 0; ti < 3; ti++) {
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
        for (int ti = 0; ti < 3; ti++) {
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
    for (int ti = 0; ti < 3; ti++) {
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
                fail_msg("%s %s: worst %g vs double, %g vs scalar",
                         kern_isa_name(isas[ii]), dx_dtype_name(kv_types[ti]), worst,
                         worst_vs_scalar);
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
        cmocka_unit_test(test_isas_checked),
        cmocka_unit_test(test_isa_select),     cmocka_unit_test(test_scalar_vs_naive),
        cmocka_unit_test(test_fast_vs_scalar), cmocka_unit_test(test_invariance),
        cmocka_unit_test(test_split_invariance), cmocka_unit_test(test_long_depth),
        cmocka_unit_test(test_rmsnorm),        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu_add),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
