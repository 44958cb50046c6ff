/* kern_ops_avx512: AVX-512 rmsnorm, swiglu and q8_0 quantisation (see
 * kern_ops.c).  The sum of squares runs four vector accumulators in an order
 * fixed by n. */
#include <immintrin.h>
#include <math.h>

#include "engine/kern/kern_attn_priv.h"

static __mmask16 o512_mask(size_t n)
{
    return n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
}

void kern_rmsnorm_avx512(const float *x, const float *w, float eps, size_t n, float *y)
{
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (size_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(o512_mask(n - i), x + i);
        acc[(i / 16) & 3] = _mm512_fmadd_ps(v, v, acc[(i / 16) & 3]);
    }
    __m512 t = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    float ss = _mm512_reduce_add_ps(t);
    __m512 scale = _mm512_set1_ps(1.0f / sqrtf(ss / (float)n + eps));
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = o512_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
    }
}

void kern_swiglu_avx512(float *g, const float *u, size_t n)
{
    __m512 one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = o512_mask(n - i);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = kern_exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

void kern_q8_quant_avx512(const float *x, size_t n, int8_t *qs, uint16_t *d)
{
    const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    for (size_t b = 0; b < n / 32; b++) {
        __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        __m512 id = _mm512_set1_ps(kern__q8_group_scale(amax, &d[b]));
        v0 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v0, id), lo), hi);
        v1 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v1, id), lo), hi);
        __m512i i0 = _mm512_cvt_roundps_epi32(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i i1 = _mm512_cvt_roundps_epi32(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(qs + 32 * b), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(qs + 32 * b + 16), _mm512_cvtepi32_epi8(i1));
    }
}
