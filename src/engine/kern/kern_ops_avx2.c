/* kern_ops_avx2: AVX2 rmsnorm, swiglu and q8_0 quantisation (see kern_ops.c).  The sum of
 * squares runs four vector accumulators in an order fixed by n; the tail
 * past the last full vector is summed in scalar, in order. */
#include <immintrin.h>
#include <math.h>

#include "engine/kern/kern_attn_priv.h"

void kern_rmsnorm_avx2(const float *x, const float *w, float eps, size_t n, float *y)
{
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    size_t nv = n & ~(size_t)7, i;
    for (i = 0; i < nv; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        acc[(i / 8) & 3] = _mm256_fmadd_ps(v, v, acc[(i / 8) & 3]);
    }
    __m256 t = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    float ss = _mm_cvtss_f32(s);
    for (; i < n; i++) ss += x[i] * x[i];
    float sc = 1.0f / sqrtf(ss / (float)n + eps);
    __m256 scale = _mm256_set1_ps(sc);
    for (i = 0; i < nv; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), scale),
                                              _mm256_loadu_ps(w + i)));
    for (; i < n; i++) y[i] = x[i] * sc * w[i];
}

void kern_swiglu_avx2(float *g, const float *u, size_t n)
{
    __m256 one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = kern_exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    /* The tail goes through the same vector exp so every element of a row
     * shares one implementation. */
    if (i < n) {
        float gt[8] = {0}, ut[8] = {0};
        for (size_t k = i; k < n; k++) gt[k - i] = g[k], ut[k - i] = u[k];
        kern_swiglu_avx2(gt, ut, 8);
        for (size_t k = i; k < n; k++) g[k] = gt[k - i];
    }
}

void kern_q8_quant_avx2(const float *x, size_t n, int8_t *qs, uint16_t *d)
{
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t b = 0; b < n / 32; b++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 32 * b + 8 * (size_t)i);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        __m256 id = _mm256_set1_ps(kern__q8_group_scale(_mm_cvtss_f32(h), &d[b]));
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            __m256 s = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[i], id), lo), hi);
            q[i] = _mm256_cvtps_epi32(
                _mm256_round_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        /* pack to 16 then 8 bits (in range, so no saturation), undoing the
         * packs' lane interleave */
        __m256i w = _mm256_packs_epi32(q[0], q[1]), z = _mm256_packs_epi32(q[2], q[3]);
        __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w, z),
                                                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qs + 32 * b), p);
    }
}
