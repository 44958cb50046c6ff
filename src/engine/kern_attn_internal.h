/* kern_attn_internal: what kern_attn.c (scalar reference, tiling driver,
 * dispatch) shares with the per-ISA attention and elementwise files.
 *
 * The driver owns the loop structure (kv head → query tile → KV block) and
 * the scratch layout; an ISA supplies the per-block arithmetic through
 * kern_attn_isa.  Every primitive computes each row's values with the same
 * instruction sequence whatever the other rows in the call are, which is what
 * makes the result independent of tiling (see kern.h). */
#ifndef KERN_ATTN_INTERNAL_H
#define KERN_ATTN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* One query row (token, query head) of a tile, with its online-softmax state. */
typedef struct {
    const float *q; /* [head_dim] */
    float *acc;     /* [head_dim] unnormalised output */
    float *s;       /* [round_up(block_size, 16)] scores, then probabilities */
    float *lvec;    /* [lanes] per-lane partial sums of the softmax denominator */
    float m;        /* running max score (-inf before the first block) */
    float alpha;    /* exp(m_old - m_new) for the current block */
    int nv;         /* keys of the current block this row sees */
} kern_attn_row;

typedef struct {
    int lanes; /* floats per vector; head_dim must be a multiple */
    /* dst[0..n) = f32 of src's n elements of kv_type (F16 or BF16); n % lanes == 0 */
    void (*cvt)(int kv_type, const void *src, float *dst, size_t n);
    /* rows[r].s[j] = scale * dot(rows[r].q, k[j]) for r < nr, j < nk; k: [nk][D] */
    void (*qk)(kern_attn_row *rows, int nr, const float *k, int nk, int D, float scale);
    /* Online-softmax step over s[0..nv): updates m, alpha, lvec; s -> exp(s - m). */
    void (*softmax)(kern_attn_row *row, int first_block);
    /* acc = acc*alpha (if rescale) then acc += p[j]*v[j] for j in [j0, j1), in order. */
    void (*pv)(kern_attn_row *rows, int nr, int j0, int j1, const float *v, int D, int rescale);
    /* out = acc / sum(lvec) */
    void (*finish)(const kern_attn_row *row, int D, float *out);
} kern_attn_isa;

extern const kern_attn_isa kern_attn_isa_avx2;
extern const kern_attn_isa kern_attn_isa_avx512;

void kern_rmsnorm_avx2(const float *x, const float *w, float eps, size_t n, float *y);
void kern_rmsnorm_avx512(const float *x, const float *w, float eps, size_t n, float *y);
void kern_swiglu_avx2(float *g, const float *u, size_t n);
void kern_swiglu_avx512(float *g, const float *u, size_t n);

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
