/* kern_attn_avx2: AVX2+FMA per-block primitives for the attention driver in
 * kern_attn.c.  Same structure as kern_attn_avx512.c with 8-float vectors:
 * qk reduces 8 (row, key) accumulators with one shared add tree, pv keeps
 * 2 rows × 32 dims of accumulators in registers. */
#include <immintrin.h>
#include <math.h>

#include "base/dx_dtype.h"
#include "engine/kern_attn_internal.h"

#define AI static inline __attribute__((always_inline))

static void a256_cvt(int kv_type, const void *src, float *dst, size_t n)
{
    const uint16_t *s = src;
    if (kv_type == DX_F16) {
        for (size_t i = 0; i < n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    } else {
        for (size_t i = 0; i < n; i += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
    }
}

/* Sum each of a[0..7] across its lanes; result lane 4c+i holds a[c+2i]. */
AI __m256 a256_reduce8(__m256 *a)
{
    __m256 x[4], y[2];
#pragma GCC unroll 16
    for (int k = 0; k < 4; k++)
        x[k] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * k], a[2 * k + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * k], a[2 * k + 1], 0x31));
#pragma GCC unroll 16
    for (int k = 0; k < 2; k++)
        y[k] = _mm256_add_ps(_mm256_unpacklo_ps(x[2 * k], x[2 * k + 1]),
                             _mm256_unpackhi_ps(x[2 * k], x[2 * k + 1]));
    return _mm256_add_ps(_mm256_shuffle_ps(y[0], y[1], 0x44), _mm256_shuffle_ps(y[0], y[1], 0xEE));
}

#define A256_ACC(L) (((L) >> 2) + 2 * ((L)&3))

/* NR rows × NK keys (NR*NK == 8); out lane r*NK + j = scale*dot(q[r], k[j]). */
AI void a256_qk_tile(const float *const *q, const float *const *k, int NR, int NK, int D,
                     float scale, float *out)
{
    __m256 acc[8];
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
        __m256 qv[2];
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) qv[r] = _mm256_loadu_ps(q[r] + d);
#pragma GCC unroll 16
        for (int j = 0; j < NK; j++) {
            __m256 kv = _mm256_loadu_ps(k[j] + d);
#pragma GCC unroll 16
            for (int r = 0; r < NR; r++)
                acc[A256_ACC(r * NK + j)] = _mm256_fmadd_ps(qv[r], kv, acc[A256_ACC(r * NK + j)]);
        }
    }
    _mm256_storeu_ps(out, _mm256_mul_ps(a256_reduce8(acc), _mm256_set1_ps(scale)));
}

/* Short groups repeat the last row/key; those results are dropped. */
AI void a256_qk_shape(kern_attn_row *rows, int nr, const float *k, int nk, int D, float scale,
                      int NR, int NK)
{
    float out[8];
    const float *qp[2], *kp[8];
    for (int r0 = 0; r0 < nr; r0 += NR)
        for (int j0 = 0; j0 < nk; j0 += NK) {
#pragma GCC unroll 16
            for (int r = 0; r < NR; r++) qp[r] = rows[r0 + r < nr ? r0 + r : nr - 1].q;
#pragma GCC unroll 16
            for (int j = 0; j < NK; j++) kp[j] = k + (size_t)(j0 + j < nk ? j0 + j : nk - 1) * D;
            a256_qk_tile(qp, kp, NR, NK, D, scale, out);
            for (int r = 0; r < NR && r0 + r < nr; r++)
                for (int j = 0; j < NK && j0 + j < nk; j++)
                    rows[r0 + r].s[j0 + j] = out[r * NK + j];
        }
}

static void a256_qk(kern_attn_row *rows, int nr, const float *k, int nk, int D, float scale)
{
    if (nr >= 2)
        a256_qk_shape(rows, nr, k, nk, D, scale, 2, 4);
    else
        a256_qk_shape(rows, nr, k, nk, D, scale, 1, 8);
}

static __m256i a256_mask(int n)
{
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

static float a256_hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static void a256_softmax(kern_attn_row *row, int first_block)
{
    int nv = row->nv;
    __m256 ninf = _mm256_set1_ps(-INFINITY), mx = ninf;
    for (int j = 0; j < nv; j += 8) {
        __m256 mk = _mm256_castsi256_ps(a256_mask(nv - j));
        __m256 s = _mm256_maskload_ps(row->s + j, _mm256_castps_si256(mk));
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, s, mk));
    }
    float bm = a256_hmax(mx);
    float mn = row->m > bm ? row->m : bm;
    float alpha = 0.0f;
    if (!first_block) alpha = _mm256_cvtss_f32(kern_exp8(_mm256_set1_ps(row->m - mn)));
    __m256 lv = _mm256_mul_ps(_mm256_loadu_ps(row->lvec), _mm256_set1_ps(alpha));
    __m256 vm = _mm256_set1_ps(mn);
    for (int j = 0; j < nv; j += 8) {
        __m256i mi = a256_mask(nv - j);
        __m256 p = kern_exp8(_mm256_sub_ps(_mm256_maskload_ps(row->s + j, mi), vm));
        p = _mm256_and_ps(p, _mm256_castsi256_ps(mi));
        _mm256_maskstore_ps(row->s + j, mi, p);
        lv = _mm256_add_ps(lv, p);
    }
    _mm256_storeu_ps(row->lvec, lv);
    row->m = mn;
    row->alpha = alpha;
}

/* NR rows × NW vectors of head_dim starting at d0. */
AI void a256_pv_tile(kern_attn_row *rows, int NR, int NW, int d0, int j0, int j1, const float *v,
                     int D, int rescale)
{
    __m256 acc[2][4];
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++) {
        __m256 a = _mm256_set1_ps(rows[r].alpha);
#pragma GCC unroll 16
        for (int w = 0; w < NW; w++) {
            acc[r][w] = _mm256_loadu_ps(rows[r].acc + d0 + 8 * w);
            if (rescale) acc[r][w] = _mm256_mul_ps(acc[r][w], a);
        }
    }
    for (int j = j0; j < j1; j++) {
        const float *vj = v + (size_t)j * D + d0;
        __m256 vv[4];
#pragma GCC unroll 16
        for (int w = 0; w < NW; w++) vv[w] = _mm256_loadu_ps(vj + 8 * w);
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) {
            __m256 p = _mm256_broadcast_ss(rows[r].s + j);
#pragma GCC unroll 16
            for (int w = 0; w < NW; w++) acc[r][w] = _mm256_fmadd_ps(p, vv[w], acc[r][w]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++)
        for (int w = 0; w < NW; w++) _mm256_storeu_ps(rows[r].acc + d0 + 8 * w, acc[r][w]);
}

AI void a256_pv_rows(kern_attn_row *rows, int NR, int j0, int j1, const float *v, int D,
                     int rescale)
{
    int d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) a256_pv_tile(rows, NR, 4, d0, j0, j1, v, D, rescale);
    for (; d0 < D; d0 += 8) a256_pv_tile(rows, NR, 1, d0, j0, j1, v, D, rescale);
}

static void a256_pv(kern_attn_row *rows, int nr, int j0, int j1, const float *v, int D, int rescale)
{
    int r = 0;
    for (; r + 2 <= nr; r += 2) a256_pv_rows(rows + r, 2, j0, j1, v, D, rescale);
    if (r < nr) a256_pv_rows(rows + r, 1, j0, j1, v, D, rescale);
}

static void a256_finish(const kern_attn_row *row, int D, float *out)
{
    __m256 v = _mm256_loadu_ps(row->lvec);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    __m256 l = _mm256_set1_ps(_mm_cvtss_f32(s));
    for (int d = 0; d < D; d += 8)
        _mm256_storeu_ps(out + d, _mm256_div_ps(_mm256_loadu_ps(row->acc + d), l));
}

const kern_attn_isa kern_attn_isa_avx2 = {
    .lanes = 8,
    .cvt = a256_cvt,
    .qk = a256_qk,
    .softmax = a256_softmax,
    .pv = a256_pv,
    .finish = a256_finish,
};
