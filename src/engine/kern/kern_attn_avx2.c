/* kern_attn_avx2: AVX2+FMA primitives for the attention driver in
 * kern_attn.c.  Same arithmetic shape as kern_attn_avx512.c with 8-float
 * vectors and 16 registers: a half (16 keys) is two vectors, scores come in
 * tiles of 2 rows × 2 halves, pv keeps 2 rows × 32 dims in registers.
 *
 * A q8_0 K is scored with integer dots as on AVX-512, without VNNI: per
 * quad of dims, vpmaddubsw multiplies |k| (unsigned) by the query's quants
 * with k's sign moved onto them (pairs stay below 2*127*127, so it never
 * saturates) and vpmaddwd adds the pairs: each key's 4 products in its lane,
 * exact, the scalar twin's bits. */
#include <immintrin.h>
#include <math.h>

#include "base/dx_dtype.h"
#include "engine/kern/kern_attn_priv.h"

#define AI static inline __attribute__((always_inline))

/* 8 elements of type T from element i of p, as f32 (exact). */
AI __m256 a256_ld(int T, const uint8_t *p, size_t i)
{
    if (T == DX_F32) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (T == DX_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 dims from d of a q8_0 V row (quants vr, f32 group scales sf), exactly. */
AI __m256 a256_q8v(const uint8_t *vr, const float *sf, int d)
{
    __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(vr + d))));
    return _mm256_mul_ps(q, _mm256_set1_ps(sf[d / 32]));
}

static void a256_cvt_q8v(const uint8_t *q, const float *sf, int D, float *dst)
{
    for (int j = 0; j < KERN_ATTN_HALF; j++)
        for (int d = 0; d < D; d += 8)
            _mm256_storeu_ps(dst + j * D + d,
                             a256_q8v(q + (size_t)j * (size_t)D, sf + j * (D / 32), d));
}

static void a256_cvt(int type, const void *src, size_t stride, float *dst, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c += 8)
            _mm256_storeu_ps(dst + r * cols + c, a256_ld(type, src, r * stride + c));
}

/* NR rows × halves h0, h0+1 (4 vectors of 8 keys) of scores. */
AI void a256_qk_tile(kern_attn_row *rows, int NR, const float *qt, size_t qstride,
                     const kern_attn_span *sp, int h0, int T, int D, float scale)
{
    __m256 acc[2][4];
    const uint8_t *k0 = sp->k[h0], *k1 = sp->k[h0 + 1];
    size_t ks = sp->kstride;
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) acc[r][i] = _mm256_setzero_ps();
    for (int d = 0; d < D; d++, qt += qstride) {
        size_t e = (size_t)d * ks;
        __m256 kv[4] = {a256_ld(T, k0, e), a256_ld(T, k0, e + 8), a256_ld(T, k1, e),
                        a256_ld(T, k1, e + 8)};
#pragma GCC unroll 2
        for (int r = 0; r < NR; r++) {
            __m256 qb = _mm256_broadcast_ss(qt + r);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) acc[r][i] = _mm256_fmadd_ps(qb, kv[i], acc[r][i]);
        }
    }
    __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(rows[r].s + 16 * h0 + 8 * i, _mm256_mul_ps(acc[r][i], sc));
}

AI void a256_qk_t(kern_attn_row *rows, int nr, const float *qt, size_t qs, const kern_attn_span *sp,
                  int T, int D, float scale)
{
    for (int h0 = 0; h0 < sp->nh; h0 += 2) {
        int r = 0;
        for (; r + 2 <= nr; r += 2) a256_qk_tile(rows + r, 2, qt + r, qs, sp, h0, T, D, scale);
        if (r < nr) a256_qk_tile(rows + r, 1, qt + r, qs, sp, h0, T, D, scale);
    }
}

static void a256_qk(kern_attn_row *rows, int nr, const float *qt, size_t qs,
                    const kern_attn_span *sp, int D, float scale)
{
    switch (sp->type) {
    case DX_F16:
        a256_qk_t(rows, nr, qt, qs, sp, DX_F16, D, scale);
        break;
    case DX_BF16:
        a256_qk_t(rows, nr, qt, qs, sp, DX_BF16, D, scale);
        break;
    default:
        a256_qk_t(rows, nr, qt, qs, sp, DX_F32, D, scale);
        break;
    }
}

/* NR rows × half h of q8_0 scores (2 vectors of 8 keys). */
AI void a256_q8_tile(kern_attn_row *rows, int NR, const int32_t *qt8, size_t qstride,
                     const kern_attn_span *sp, int h, int D, float scale)
{
    __m256 facc[2][2];
    const uint8_t *k = sp->k[h];
    size_t qb_stride = sp->kstride * 4;
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++) facc[r][0] = facc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < D / 32; g++) {
        __m256i iacc[2][2];
#pragma GCC unroll 2
        for (int r = 0; r < NR; r++) iacc[r][0] = iacc[r][1] = _mm256_setzero_si256();
        for (int c = 8 * g; c < 8 * g + 8; c++) {
            const uint8_t *kc = k + (size_t)c * qb_stride;
            __m256i k0 = _mm256_loadu_si256((const __m256i *)kc);
            __m256i k1 = _mm256_loadu_si256((const __m256i *)(kc + 32));
            __m256i a0 = _mm256_abs_epi8(k0), a1 = _mm256_abs_epi8(k1);
#pragma GCC unroll 2
            for (int r = 0; r < NR; r++) {
                __m256i qb = _mm256_set1_epi32(qt8[(size_t)c * qstride + (size_t)r]);
                __m256i p0 = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(qb, k0));
                __m256i p1 = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(qb, k1));
                iacc[r][0] = _mm256_add_epi32(iacc[r][0], _mm256_madd_epi16(p0, ones));
                iacc[r][1] = _mm256_add_epi32(iacc[r][1], _mm256_madd_epi16(p1, ones));
            }
        }
        const uint8_t *ks = sp->ks[h] + (size_t)g * sp->kstride * 2;
        __m256 dk0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)ks));
        __m256 dk1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ks + 16)));
#pragma GCC unroll 2
        for (int r = 0; r < NR; r++) {
            __m256 dq = _mm256_set1_ps(rows[r].qd[g]);
            facc[r][0] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r][0]), _mm256_mul_ps(dq, dk0), facc[r][0]);
            facc[r][1] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r][1]), _mm256_mul_ps(dq, dk1), facc[r][1]);
        }
    }
    __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++) {
        _mm256_storeu_ps(rows[r].s + 16 * h, _mm256_mul_ps(facc[r][0], sc));
        _mm256_storeu_ps(rows[r].s + 16 * h + 8, _mm256_mul_ps(facc[r][1], sc));
    }
}

static void a256_qk_q8(kern_attn_row *rows, int nr, const int32_t *qt8, size_t qs,
                       const kern_attn_span *sp, int D, float scale)
{
    for (int h = 0; h < sp->nh; h++) {
        int r = 0;
        for (; r + 2 <= nr; r += 2) a256_q8_tile(rows + r, 2, qt8 + r, qs, sp, h, D, scale);
        if (r < nr) a256_q8_tile(rows + r, 1, qt8 + r, qs, sp, h, D, scale);
    }
}

static __m256 a256_mask(int n)
{
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
}

static float a256_hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static void a256_softmax(kern_attn_row *row, int i)
{
    int nv = row->nv[i];
    float *s = row->s + KERN_ATTN_STEP * i;
    __m256 ninf = _mm256_set1_ps(-INFINITY), sv[4], mk[4], mx = ninf;
    for (int c = 0; c < 4; c++) {
        mk[c] = a256_mask(nv - 8 * c);
        sv[c] = _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8 * c), mk[c]);
        mx = _mm256_max_ps(mx, sv[c]);
    }
    float bm = a256_hmax(mx);
    float mo = row->m, mn = mo > bm ? mo : bm;
    /* alpha is exactly 1 when the max stands, so skipping the multiply
     * changes no bit; 0 before the split's first step. */
    float alpha = mo == -INFINITY ? 0.0f : _mm256_cvtss_f32(kern_exp8(_mm256_set1_ps(mo - mn)));
    __m256 lv = _mm256_loadu_ps(row->lvec), vm = _mm256_set1_ps(mn);
    if (alpha != 1.0f) lv = _mm256_mul_ps(lv, _mm256_set1_ps(alpha));
    for (int c = 0; c < 4 && 8 * c < nv; c++) {
        __m256 p = _mm256_and_ps(kern_exp8(_mm256_sub_ps(sv[c], vm)), mk[c]);
        _mm256_storeu_ps(s + 8 * c, p);
        lv = _mm256_add_ps(lv, p);
    }
    _mm256_storeu_ps(row->lvec, lv);
    row->m = mn;
    row->alpha[i] = alpha;
}

/* NR rows × NW vectors of head_dim from d0, keys [j0, j1) of step i. */
AI void a256_pv_tile(kern_attn_row *rows, int NR, const kern_attn_span *sp, int i, int j0, int j1,
                     int T, int d0, int NW, int D, int rescale)
{
    __m256 acc[2][4];
    const float *p[2];
    size_t es = T == DX_F32 ? 4 : T == DX_Q8_0 ? 1 : 2;
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++) {
        __m256 a = _mm256_set1_ps(rows[r].alpha[i]);
        p[r] = rows[r].s + KERN_ATTN_STEP * i;
#pragma GCC unroll 4
        for (int w = 0; w < NW; w++) {
            acc[r][w] = _mm256_loadu_ps(rows[r].acc + d0 + 8 * w);
            if (rescale) acc[r][w] = _mm256_mul_ps(acc[r][w], a);
        }
    }
    for (int j = j0; j < j1; j++) {
        const uint8_t *vr = sp->v[2 * i + (j >> 4)] + (size_t)(j & 15) * (size_t)D * es;
        const float *sf = T == DX_Q8_0 ? sp->vsf[2 * i + (j >> 4)] + (j & 15) * (D / 32) : NULL;
        __m256 vv[4];
#pragma GCC unroll 4
        for (int w = 0; w < NW; w++)
            vv[w] =
                T == DX_Q8_0 ? a256_q8v(vr, sf, d0 + 8 * w) : a256_ld(T, vr, (size_t)(d0 + 8 * w));
#pragma GCC unroll 2
        for (int r = 0; r < NR; r++) {
            __m256 pb = _mm256_broadcast_ss(p[r] + j);
#pragma GCC unroll 4
            for (int w = 0; w < NW; w++) acc[r][w] = _mm256_fmadd_ps(pb, vv[w], acc[r][w]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int w = 0; w < NW; w++) _mm256_storeu_ps(rows[r].acc + d0 + 8 * w, acc[r][w]);
}

AI void a256_pv_rows(kern_attn_row *rows, int NR, const kern_attn_span *sp, int i, int j0, int j1,
                     int T, int D, int rescale)
{
    int d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) a256_pv_tile(rows, NR, sp, i, j0, j1, T, d0, 4, D, rescale);
    for (; d0 < D; d0 += 8) a256_pv_tile(rows, NR, sp, i, j0, j1, T, d0, 1, D, rescale);
}

AI void a256_pv_t(kern_attn_row *rows, int nr, const kern_attn_span *sp, int i, int j0, int j1,
                  int T, int D, int rescale)
{
    if (nr >= 2)
        a256_pv_rows(rows, 2, sp, i, j0, j1, T, D, rescale);
    else
        a256_pv_rows(rows, 1, sp, i, j0, j1, T, D, rescale);
}

static void a256_pv(kern_attn_row *rows, int nr, const kern_attn_span *sp, int i, int j0, int j1,
                    int D, int rescale)
{
    switch (sp->vtype) {
    case DX_Q8_0:
        a256_pv_t(rows, nr, sp, i, j0, j1, DX_Q8_0, D, rescale);
        break;
    case DX_F16:
        a256_pv_t(rows, nr, sp, i, j0, j1, DX_F16, D, rescale);
        break;
    case DX_BF16:
        a256_pv_t(rows, nr, sp, i, j0, j1, DX_BF16, D, rescale);
        break;
    default:
        a256_pv_t(rows, nr, sp, i, j0, j1, DX_F32, D, rescale);
        break;
    }
}

static void a256_close(kern_attn_row *row, int D)
{
    __m256 v = _mm256_loadu_ps(row->lvec);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    row->acc[D] = row->m;
    row->acc[D + 1] = _mm_cvtss_f32(s);
}

static void a256_merge(float *acc, float *m, float *l, const float *part, int D)
{
    float mo = *m, mp = part[D], mn = mo > mp ? mo : mp;
    __m256 a = kern_exp8(_mm256_set1_ps(mo - mn)), b = kern_exp8(_mm256_set1_ps(mp - mn));
    for (int d = 0; d < D; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(_mm256_loadu_ps(part + d), b,
                                                  _mm256_mul_ps(_mm256_loadu_ps(acc + d), a)));
    __m256 lv =
        _mm256_fmadd_ps(_mm256_set1_ps(part[D + 1]), b, _mm256_mul_ps(_mm256_set1_ps(*l), a));
    *l = _mm256_cvtss_f32(lv);
    *m = mn;
}

static void a256_finish(const float *acc, float l, int D, float *out)
{
    __m256 lv = _mm256_set1_ps(l);
    for (int d = 0; d < D; d += 8)
        _mm256_storeu_ps(out + d, _mm256_div_ps(_mm256_loadu_ps(acc + d), lv));
}

const kern_attn_isa kern_attn_isa_avx2 = {
    .lanes = 8,
    .pv_rows = 2,
    .qk = a256_qk,
    .softmax = a256_softmax,
    .pv = a256_pv,
    .close = a256_close,
    .merge = a256_merge,
    .finish = a256_finish,
    .cvt = a256_cvt,
    .qk_q8 = a256_qk_q8,
    .cvt_q8v = a256_cvt_q8v,
};
