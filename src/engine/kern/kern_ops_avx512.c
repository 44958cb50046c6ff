/* kern_ops_avx512: AVX-512 rmsnorm and swiglu (see kern_ops.c).  The sum of
 * squares runs four vector accumulators in an order fixed by n. */
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
