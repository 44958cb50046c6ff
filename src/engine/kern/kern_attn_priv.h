/* kern_attn_priv: what kern_attn.c (scalar reference, tiling driver,
 * dispatch) shares with the per-ISA attention and elementwise files.
 *
 * The driver owns the loop structure (kv head → query tile → history split →
 * span of key steps) and the scratch layout; an ISA supplies the arithmetic
 * through kern_attn_isa.  Every primitive computes each row's values with the
 * same instruction sequence whatever the other rows in the call are, and
 * whether K/V come straight from the pool or from the driver's f32 copy (the
 * conversions are exact), which is what makes the result independent of
 * tiling, splitting and threads (see kern.h).
 *
 * Keys are visited in steps of KERN_ATTN_STEP positions (multiples of it by
 * absolute position), each step two halves of 16 keys; a half lies inside one
 * pool block, since block sizes are multiples of 16 on the fast paths. */
#ifndef KERN_ATTN_PRIV_H
#define KERN_ATTN_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_dtype.h"

#define KERN_ATTN_STEP 32 /* keys per online-softmax step */
#define KERN_ATTN_HALF 16 /* keys per half: one K vector of 16 lanes */
#define KERN_ATTN_SPAN 4  /* most steps per span (few-row calls read 4 at once) */

/* One query row (token, query head) with its online-softmax state for the
 * current split. */
typedef struct {
    const float *q; /* [head_dim] */
    /* q8_0 K: the row quantised (kern_q8_quant): its f16 group scales as
     * f32 [head_dim/32] and 128 * the sum of each group's quants (what the
     * AVX-512 path's unsigned operand adds); the quads are the tile's qt8 */
    const float *qd;
    const int32_t *qc;
    float *acc;                  /* [head_dim] unnormalised output of the split; m, l follow it */
    float *s;                    /* [KERN_ATTN_STEP * KERN_ATTN_SPAN] scores, then probabilities */
    float *lvec;                 /* [16] per-lane partial sums of the softmax denominator */
    float m;                     /* running max score (-inf before the split's first step) */
    float alpha[KERN_ATTN_SPAN]; /* exp(m_old - m_new) of each step of the span */
    int nv[KERN_ATTN_SPAN];      /* keys of each step this row sees (0..32) */
} kern_attn_row;

/* Where a span's keys are.  Half i (keys 16i..16i+15 of the span) has K at
 * k[i]: element (key j, dim d) at k[i] + (d*kstride + j)*esize, and V at v[i]:
 * (key j, dim d) at v[i] + (j*head_dim + d)*esize.  A q8_0 K (type
 * DX_Q8_0) has quant (j, d) at k[i] + ((d/4)*kstride + j)*4 + d%4 and the
 * f16 scale (j, g) at ks[i] + (g*kstride + j)*2; a q8_0 V (vtype DX_Q8_0)
 * quant (j, d) at v[i] + j*head_dim + d, its scales as f32 at vsf[i] +
 * j*(head_dim/32) + g (converted by the driver).  Halves past the sequence's
 * last key repeat the last real half (read, never used), so a kernel can
 * always read nh halves. */
typedef struct {
    const uint8_t *k[2 * KERN_ATTN_SPAN], *v[2 * KERN_ATTN_SPAN];
    const uint8_t *ks[2 * KERN_ATTN_SPAN]; /* q8_0 K scales */
    const float *vsf[2 * KERN_ATTN_SPAN];  /* q8_0 V scales, f32 */
    /* K's type: DX_F32 (the driver's copy) | the pool's; a q8_0 K is never
     * copied.  V's: DX_F32 (the driver's copy, q8_0 dequantised) | the pool's */
    int type, vtype;
    size_t kstride; /* elements (q8_0: keys) between one key's consecutive dims (quads) */
    int nh;         /* halves to score: 2 (one step, converted copy) or 8 */
} kern_attn_span;

typedef struct {
    int lanes;   /* floats per vector: head_dim must be a multiple */
    int pv_rows; /* rows per pv call that keep its accumulators in registers */
    /* Scores of rows[0..nr) for the span's nh halves: rows[r].s[16i + j] =
     * scale * (sum over d, in order, of q[d]*K[j][d] by FMA from 0).  The
     * queries come transposed: row r's q[d] at qt[d*qstride + r]. */
    void (*qk)(kern_attn_row *rows, int nr, const float *qt, size_t qstride,
               const kern_attn_span *sp, int D, float scale);
    /* The same for a q8_0 K: rows[r].s[16i + j] = scale * (sum over groups
     * g, in order, by FMA from 0, of (float)idot * (qd[g] * kscale(j, g)))
     * with idot the exact integer dot of group g.  Row r's quants come in
     * quads: dims 4c..4c+3 as one int32 at qt8[c*qstride + r]. */
    void (*qk_q8)(kern_attn_row *rows, int nr, const int32_t *qt8, size_t qstride,
                  const kern_attn_span *sp, int D, float scale);
    /* Online-softmax update for step i over nv[i] > 0 keys: m, alpha[i],
     * lvec; s[32i..) becomes exp(s - m) (0 past nv[i]). */
    void (*softmax)(kern_attn_row *row, int i);
    /* acc = acc*alpha[i] (if rescale), then acc += p[j]*V[j] for keys
     * [j0, j1) of step i, in key order, by FMA (a q8_0 V element is
     * scale*quant, exact).  All rows see those keys. */
    void (*pv)(kern_attn_row *rows, int nr, const kern_attn_span *sp, int i, int j0, int j1, int D,
               int rescale);
    /* Ends a split: acc[D] = m, acc[D+1] = sum of lvec (fixed order). */
    void (*close)(kern_attn_row *row, int D);
    /* Folds the next split's part (acc[D], m, l) into the running (acc, *m, *l). */
    void (*merge)(float *acc, float *m, float *l, const float *part, int D);
    /* out = acc / l; out may be acc. */
    void (*finish)(const float *acc, float l, int D, float *out);
    /* dst[r][c] = f32 of src[r*stride + c] (elements of type F16 or BF16)
     * for r < rows, c < cols; cols % 16 == 0. */
    void (*cvt)(int type, const void *src, size_t stride, float *dst, size_t rows, size_t cols);
    /* dst[j][d] = scale(j, d/32) * quant(j, d) for 16 keys of a q8_0 V: quants
     * [16][D] at q, scales as f32 [16][D/32] at sf. */
    void (*cvt_q8v)(const uint8_t *q, const float *sf, int D, float *dst);
} kern_attn_isa;

/* Scalar twins of the ISA primitives that must give their bits exactly:
 * qk_q8 (rows, halves and keys as the ISA's), and pv for every V type. */
void kern__attn_qk_q8_scalar(kern_attn_row *rows, int nr, const int32_t *qt8, size_t qstride,
                             const kern_attn_span *sp, int D, float scale);
void kern__attn_pv_scalar(kern_attn_row *rows, int nr, const kern_attn_span *sp, int i, int j0,
                          int j1, int D, int rescale);

extern const kern_attn_isa kern_attn_isa_avx2;
extern const kern_attn_isa kern_attn_isa_avx512;

void kern_rmsnorm_avx2(const float *x, const float *w, float eps, size_t n, float *y);
void kern_rmsnorm_avx512(const float *x, const float *w, float eps, size_t n, float *y);
void kern_swiglu_avx2(float *g, const float *u, size_t n);
void kern_swiglu_avx512(float *g, const float *u, size_t n);
void kern_q8_quant_avx2(const float *x, size_t n, int8_t *qs, uint16_t *d);
void kern_q8_quant_avx512(const float *x, size_t n, int8_t *qs, uint16_t *d);
/* A q8_0 group's f16 scale from its max |x| (into *d), and the factor that
 * maps x to its quant (0 for an all-zero group): every ISA's.  Inline here,
 * not in kern_ops.c, so the ISA files never call back into the file that
 * dispatches to them (scripts/check_layers.sh). */
static inline float kern__q8_group_scale(float amax, uint16_t *d)
{
    *d = dx_f32_to_f16(amax / 127.0f);
    float df = dx_f16_to_f32(*d);
    return df != 0.0f ? 1.0f / df : 0.0f;
}

/* Vector exp (Cephes-style range reduction + degree-6 polynomial, ~1 ulp for
 * normal results), one per ISA so the ISA alone decides the bits.  Inputs
 * below -87.3 give ~1e-38 rather than 0; callers mask lanes that must be 0. */
#define KERN_EXP_LO -87.33654f
#define KERN_EXP_HI 88.0f
#define KERN_LOG2E  1.44269504088896341f
#define KERN_LN2_HI 0.693359375f
#define KERN_LN2_LO -2.12194440e-4f
#define KERN_EXP_P0 1.9875691500e-4f
#define KERN_EXP_P1 1.3981999507e-3f
#define KERN_EXP_P2 8.3334519073e-3f
#define KERN_EXP_P3 4.1665795894e-2f
#define KERN_EXP_P4 1.6666665459e-1f
#define KERN_EXP_P5 5.0000001201e-1f

#if defined(__AVX512F__)
#include <immintrin.h>
static inline __m512 kern_exp16(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(KERN_EXP_LO)), _mm512_set1_ps(KERN_EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(KERN_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(KERN_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(KERN_LN2_LO), r);
    __m512 p = _mm512_set1_ps(KERN_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERN_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERN_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERN_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERN_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERN_EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline __m256 kern_exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(KERN_EXP_LO)), _mm256_set1_ps(KERN_EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(KERN_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(KERN_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(KERN_LN2_LO), r);
    __m256 p = _mm256_set1_ps(KERN_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERN_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERN_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERN_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERN_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERN_EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n by building the exponent: n is in [-126, 128) after the clamp. */
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

#endif
