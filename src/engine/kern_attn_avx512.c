/* kern_attn_avx512: AVX-512 per-block primitives for the attention driver
 * in kern_attn.c.
 *
 * qk computes 16 (row, key) dot products at a time, each vectorised along
 * head_dim into its own accumulator (FMAs over d in order), then reduces the
 * 16 accumulators into one vector with a transpose-and-add tree that applies
 * the same add tree to every accumulator — so a score's bits do not depend on
 * which other pairs shared the tile.  pv keeps up to 4 rows × 64 dims of
 * accumulators in registers and streams V rows, one FMA per key in order. */
#include <immintrin.h>
#include <math.h>

#include "base/dx_dtype.h"
#include "engine/kern_attn_internal.h"

#define AI static inline __attribute__((always_inline))

static void a512_cvt(int kv_type, const void *src, float *dst, size_t n)
{
    const uint16_t *s = src;
    if (kv_type == DX_F16) {
        for (size_t i = 0; i < n; i += 16)
            _mm512_storeu_ps(dst + i,
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    } else {
        for (size_t i = 0; i < n; i += 16) {
            __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i)));
            _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
        }
    }
}

/* Sum each of a[0..15] across its lanes; result lane 4c+i holds a[c+4i]. */
AI __m512 a512_reduce16(__m512 *a)
{
    __m512 x[8], y[4], z[2];
#pragma GCC unroll 16
    for (int k = 0; k < 8; k++)
        x[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xEE));
#pragma GCC unroll 16
    for (int k = 0; k < 4; k++)
        y[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0xDD));
#pragma GCC unroll 16
    for (int k = 0; k < 2; k++)
        z[k] = _mm512_add_ps(_mm512_unpacklo_ps(y[2 * k], y[2 * k + 1]),
                             _mm512_unpackhi_ps(y[2 * k], y[2 * k + 1]));
    return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x44), _mm512_shuffle_ps(z[0], z[1], 0xEE));
}

/* Accumulator for output lane L (see a512_reduce16). */
#define A512_ACC(L) (((L) >> 2) + 4 * ((L)&3))

/* NR rows × NK keys (NR*NK == 16); out lane r*NK + j = scale*dot(q[r], k[j]). */
AI void a512_qk_tile(const float *const *q, const float *const *k, int NR, int NK, int D,
                     float scale, float *out)
{
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
        __m512 qv[4];
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) qv[r] = _mm512_loadu_ps(q[r] + d);
#pragma GCC unroll 16
        for (int j = 0; j < NK; j++) {
            __m512 kv = _mm512_loadu_ps(k[j] + d);
#pragma GCC unroll 16
            for (int r = 0; r < NR; r++)
                acc[A512_ACC(r * NK + j)] = _mm512_fmadd_ps(qv[r], kv, acc[A512_ACC(r * NK + j)]);
        }
    }
    _mm512_storeu_ps(out, _mm512_mul_ps(a512_reduce16(acc), _mm512_set1_ps(scale)));
}

/* Pads short row/key groups by repeating the last row/key; their results
 * are dropped, and no pair's arithmetic depends on its neighbours. */
AI void a512_qk_shape(kern_attn_row *rows, int nr, const float *k, int nk, int D, float scale,
                      int NR, int NK)
{
    float out[16];
    const float *qp[4], *kp[16];
    for (int r0 = 0; r0 < nr; r0 += NR)
        for (int j0 = 0; j0 < nk; j0 += NK) {
#pragma GCC unroll 16
            for (int r = 0; r < NR; r++) qp[r] = rows[r0 + r < nr ? r0 + r : nr - 1].q;
#pragma GCC unroll 16
            for (int j = 0; j < NK; j++) kp[j] = k + (size_t)(j0 + j < nk ? j0 + j : nk - 1) * D;
            a512_qk_tile(qp, kp, NR, NK, D, scale, out);
            for (int r = 0; r < NR && r0 + r < nr; r++)
                for (int j = 0; j < NK && j0 + j < nk; j++)
                    rows[r0 + r].s[j0 + j] = out[r * NK + j];
        }
}

static void a512_qk(kern_attn_row *rows, int nr, const float *k, int nk, int D, float scale)
{
    if (nr >= 3)
        a512_qk_shape(rows, nr, k, nk, D, scale, 4, 4);
    else if (nr == 2)
        a512_qk_shape(rows, nr, k, nk, D, scale, 2, 8);
    else
        a512_qk_shape(rows, nr, k, nk, D, scale, 1, 16);
}

static __mmask16 a512_mask(int n)
{
    return n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
}

static void a512_softmax(kern_attn_row *row, int first_block)
{
    int nv = row->nv;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < nv; j += 16)
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, a512_mask(nv - j), row->s + j));
    float bm = _mm512_reduce_max_ps(mx);
    float mn = row->m > bm ? row->m : bm;
    float alpha = 0.0f;
    if (!first_block) alpha = _mm512_cvtss_f32(kern_exp16(_mm512_set1_ps(row->m - mn)));
    __m512 lv = _mm512_mul_ps(_mm512_loadu_ps(row->lvec), _mm512_set1_ps(alpha));
    __m512 vm = _mm512_set1_ps(mn);
    for (int j = 0; j < nv; j += 16) {
        __mmask16 mk = a512_mask(nv - j);
        __m512 p = kern_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, row->s + j), vm));
        p = _mm512_maskz_mov_ps(mk, p);
        _mm512_mask_storeu_ps(row->s + j, mk, p);
        lv = _mm512_add_ps(lv, p);
    }
    _mm512_storeu_ps(row->lvec, lv);
    row->m = mn;
    row->alpha = alpha;
}

/* NR rows × NW vectors of head_dim starting at d0. */
AI void a512_pv_tile(kern_attn_row *rows, int NR, int NW, int d0, int j0, int j1, const float *v,
                     int D, int rescale)
{
    __m512 acc[4][4];
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++) {
        __m512 a = _mm512_set1_ps(rows[r].alpha);
#pragma GCC unroll 16
        for (int w = 0; w < NW; w++) {
            acc[r][w] = _mm512_loadu_ps(rows[r].acc + d0 + 16 * w);
            if (rescale) acc[r][w] = _mm512_mul_ps(acc[r][w], a);
        }
    }
    for (int j = j0; j < j1; j++) {
        const float *vj = v + (size_t)j * D + d0;
        __m512 vv[4];
#pragma GCC unroll 16
        for (int w = 0; w < NW; w++) vv[w] = _mm512_loadu_ps(vj + 16 * w);
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) {
            __m512 p = _mm512_set1_ps(rows[r].s[j]);
#pragma GCC unroll 16
            for (int w = 0; w < NW; w++) acc[r][w] = _mm512_fmadd_ps(p, vv[w], acc[r][w]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++)
        for (int w = 0; w < NW; w++) _mm512_storeu_ps(rows[r].acc + d0 + 16 * w, acc[r][w]);
}

AI void a512_pv_rows(kern_attn_row *rows, int NR, int j0, int j1, const float *v, int D,
                     int rescale)
{
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) a512_pv_tile(rows, NR, 4, d0, j0, j1, v, D, rescale);
    for (; d0 < D; d0 += 16) a512_pv_tile(rows, NR, 1, d0, j0, j1, v, D, rescale);
}

static void a512_pv(kern_attn_row *rows, int nr, int j0, int j1, const float *v, int D, int rescale)
{
    switch (nr) {
    case 4:
        a512_pv_rows(rows, 4, j0, j1, v, D, rescale);
        break;
    case 3:
        a512_pv_rows(rows, 3, j0, j1, v, D, rescale);
        break;
    case 2:
        a512_pv_rows(rows, 2, j0, j1, v, D, rescale);
        break;
    default:
        a512_pv_rows(rows, 1, j0, j1, v, D, rescale);
        break;
    }
}

static void a512_finish(const kern_attn_row *row, int D, float *out)
{
    __m512 l = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_loadu_ps(row->lvec)));
    for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(out + d, _mm512_div_ps(_mm512_loadu_ps(row->acc + d), l));
}

const kern_attn_isa kern_attn_isa_avx512 = {
    .lanes = 16,
    .cvt = a512_cvt,
    .qk = a512_qk,
    .softmax = a512_softmax,
    .pv = a512_pv,
    .finish = a512_finish,
};
