/* kern_attn_avx512: AVX-512 primitives for the attention driver in
 * kern_attn.c.
 *
 * Scores: K is stored transposed (kern.h), so one vector holds one dim of 16
 * consecutive keys and a row's 16 scores grow by one FMA per dim, with the
 * query element broadcast — no horizontal sums, and a score's bits depend
 * only on its own q and k.  12 rows × 2 halves (32 keys) of accumulators
 * cover one step when the driver has converted it to f32; 2 rows × 8 halves
 * (four steps) read straight from the pool keep a decode row's FMA chains
 * busy.  pv keeps up to 3 rows × 128 dims of accumulators in registers and
 * streams V rows, one FMA per key in order.
 *
 * A q8_0 K is scored with VNNI: a 64-byte vector holds 4 dims of 16 keys
 * (kern.h), the query's 4 quants of those dims are broadcast, and vpdpbusd
 * adds each key's 4 products to its lane.  vpdpbusd takes one unsigned
 * operand, so K's quants are flipped to k+128 and 128 * the group's sum of
 * query quants is subtracted afterwards: the integer dot is exact, so the
 * bits are the scalar twin's.  (Measured against dequantising K to f32 in
 * registers and using FMAs, see docs/architecture.md: the integer path
 * needs a quarter of the instructions per key.) */
#include <immintrin.h>
#include <math.h>

#include "base/dx_dtype.h"
#include "engine/kern/kern_attn_priv.h"

#define AI static inline __attribute__((always_inline))

/* 16 elements of type T from element i of p, as f32 (exact). */
AI __m512 a512_ld(int T, const uint8_t *p, size_t i)
{
    if (T == DX_F32) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (T == DX_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 dims from d of a q8_0 V row (quants vr, f32 group scales sf), exactly. */
AI __m512 a512_q8v(const uint8_t *vr, const float *sf, int d)
{
    __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(vr + d))));
    return _mm512_mul_ps(q, _mm512_set1_ps(sf[d / 32]));
}

static void a512_cvt_q8v(const uint8_t *q, const float *sf, int D, float *dst)
{
    for (int j = 0; j < KERN_ATTN_HALF; j++)
        for (int d = 0; d < D; d += 16)
            _mm512_storeu_ps(dst + j * D + d,
                             a512_q8v(q + (size_t)j * (size_t)D, sf + j * (D / 32), d));
}

static void a512_cvt(int type, const void *src, size_t stride, float *dst, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c += 16)
            _mm512_storeu_ps(dst + r * cols + c, a512_ld(type, src, r * stride + c));
}

/* NR rows × NH halves of scores. */
AI void a512_qk_tile(kern_attn_row *rows, int NR, const float *qt, size_t qstride,
                     const kern_attn_span *sp, int NH, int T, int D, float scale)
{
    __m512 acc[24];
    const uint8_t *k[8];
    size_t ks = sp->kstride;
#pragma GCC unroll 8
    for (int i = 0; i < NH; i++) k[i] = sp->k[i];
#pragma GCC unroll 24
    for (int i = 0; i < NR * NH; i++) acc[i] = _mm512_setzero_ps();
    for (int d = 0; d < D; d++, qt += qstride) {
        __m512 kv[8];
#pragma GCC unroll 8
        for (int i = 0; i < NH; i++) kv[i] = a512_ld(T, k[i], (size_t)d * ks);
#pragma GCC unroll 12
        for (int r = 0; r < NR; r++) {
            __m512 qb = _mm512_set1_ps(qt[r]);
#pragma GCC unroll 8
            for (int i = 0; i < NH; i++)
                acc[r * NH + i] = _mm512_fmadd_ps(qb, kv[i], acc[r * NH + i]);
        }
    }
    __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 12
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int i = 0; i < NH; i++)
            _mm512_storeu_ps(rows[r].s + 16 * i, _mm512_mul_ps(acc[r * NH + i], sc));
}

/* Converted steps (f32, 2 halves): groups of 12 rows and the remainder. */
static void a512_qk_step(kern_attn_row *rows, int nr, const float *qt, size_t qs,
                         const kern_attn_span *sp, int D, float scale)
{
    int r = 0;
    for (; r + 12 <= nr; r += 12) a512_qk_tile(rows + r, 12, qt + r, qs, sp, 2, DX_F32, D, scale);
    switch (nr - r) {
#define A512_QK_REM(n)                                                                             \
    case n:                                                                                        \
        a512_qk_tile(rows + r, n, qt + r, qs, sp, 2, DX_F32, D, scale);                            \
        break;
        A512_QK_REM(1)
        A512_QK_REM(2)
        A512_QK_REM(3)
        A512_QK_REM(4)
        A512_QK_REM(5)
        A512_QK_REM(6)
        A512_QK_REM(7)
        A512_QK_REM(8)
        A512_QK_REM(9)
        A512_QK_REM(10)
        A512_QK_REM(11)
#undef A512_QK_REM
    default:
        break;
    }
}

/* Straight from the pool (8 halves): pairs of rows, then one. */
AI void a512_qk_span_t(kern_attn_row *rows, int nr, const float *qt, size_t qs,
                       const kern_attn_span *sp, int T, int D, float scale)
{
    int r = 0;
    for (; r + 2 <= nr; r += 2) a512_qk_tile(rows + r, 2, qt + r, qs, sp, 8, T, D, scale);
    if (r < nr) a512_qk_tile(rows + r, 1, qt + r, qs, sp, 8, T, D, scale);
}

static void a512_qk(kern_attn_row *rows, int nr, const float *qt, size_t qs,
                    const kern_attn_span *sp, int D, float scale)
{
    if (sp->nh == 2) { /* one step, f32 (converted, or an f32 pool) */
        a512_qk_step(rows, nr, qt, qs, sp, D, scale);
        return;
    }
    switch (sp->type) {
    case DX_F16:
        a512_qk_span_t(rows, nr, qt, qs, sp, DX_F16, D, scale);
        break;
    case DX_BF16:
        a512_qk_span_t(rows, nr, qt, qs, sp, DX_BF16, D, scale);
        break;
    default:
        a512_qk_span_t(rows, nr, qt, qs, sp, DX_F32, D, scale);
        break;
    }
}

/* NR rows × NH halves (from half h0) of q8_0 scores: per group of 32 dims,
 * 8 quads of integer dots, then one FMA folds the group into the scores. */
AI void a512_q8_tile(kern_attn_row *rows, int NR, const int32_t *qt8, size_t qstride,
                     const kern_attn_span *sp, int h0, int NH, int D, float scale)
{
    __m512 facc[12];
    __m512i iacc[12];
    const uint8_t *k[4];
    size_t qb_stride = sp->kstride * 4; /* bytes from one quad of 16 keys to the next */
    const __m512i flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
    for (int i = 0; i < NH; i++) k[i] = sp->k[h0 + i];
#pragma GCC unroll 12
    for (int i = 0; i < NR * NH; i++) facc[i] = _mm512_setzero_ps();
    for (int g = 0; g < D / 32; g++) {
#pragma GCC unroll 12
        for (int i = 0; i < NR * NH; i++) iacc[i] = _mm512_setzero_si512();
        for (int c = 8 * g; c < 8 * g + 8; c++) {
            __m512i kv[4];
#pragma GCC unroll 4
            for (int i = 0; i < NH; i++)
                kv[i] = _mm512_xor_si512(
                    _mm512_loadu_si512((const void *)(k[i] + (size_t)c * qb_stride)), flip);
            const int32_t *q = qt8 + (size_t)c * qstride;
#pragma GCC unroll 6
            for (int r = 0; r < NR; r++) {
                __m512i qb = _mm512_set1_epi32(q[r]);
#pragma GCC unroll 4
                for (int i = 0; i < NH; i++)
                    iacc[r * NH + i] = _mm512_dpbusd_epi32(iacc[r * NH + i], kv[i], qb);
            }
        }
        __m512 dk[4];
#pragma GCC unroll 4
        for (int i = 0; i < NH; i++)
            dk[i] = _mm512_cvtph_ps(_mm256_loadu_si256(
                (const __m256i *)(sp->ks[h0 + i] + (size_t)g * sp->kstride * 2)));
#pragma GCC unroll 6
        for (int r = 0; r < NR; r++) {
            __m512 dq = _mm512_set1_ps(rows[r].qd[g]);
            __m512i corr = _mm512_set1_epi32(rows[r].qc[g]);
#pragma GCC unroll 4
            for (int i = 0; i < NH; i++) {
                __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(iacc[r * NH + i], corr));
                facc[r * NH + i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dq, dk[i]), facc[r * NH + i]);
            }
        }
    }
    __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NH; i++)
            _mm512_storeu_ps(rows[r].s + 16 * (h0 + i), _mm512_mul_ps(facc[r * NH + i], sc));
}

/* One step (2 halves) for many rows: tiles of 6 rows; four steps (8
 * halves) for few: pairs of rows over 4 halves at a time, then one row
 * over all 8. */
static void a512_qk_q8(kern_attn_row *rows, int nr, const int32_t *qt8, size_t qs,
                       const kern_attn_span *sp, int D, float scale)
{
    int r = 0;
    if (sp->nh == 2) {
        for (; r + 6 <= nr; r += 6) a512_q8_tile(rows + r, 6, qt8 + r, qs, sp, 0, 2, D, scale);
        switch (nr - r) {
#define A512_Q8_REM(n)                                                                             \
    case n:                                                                                        \
        a512_q8_tile(rows + r, n, qt8 + r, qs, sp, 0, 2, D, scale);                                \
        break;
            A512_Q8_REM(1)
            A512_Q8_REM(2)
            A512_Q8_REM(3)
            A512_Q8_REM(4)
            A512_Q8_REM(5)
#undef A512_Q8_REM
        default:
            break;
        }
        return;
    }
    for (; r + 2 <= nr; r += 2) {
        a512_q8_tile(rows + r, 2, qt8 + r, qs, sp, 0, 4, D, scale);
        a512_q8_tile(rows + r, 2, qt8 + r, qs, sp, 4, 4, D, scale);
    }
    if (r < nr) {
        a512_q8_tile(rows + r, 1, qt8 + r, qs, sp, 0, 4, D, scale);
        a512_q8_tile(rows + r, 1, qt8 + r, qs, sp, 4, 4, D, scale);
    }
}

static __mmask16 a512_mask(int n)
{
    return n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

static void a512_softmax(kern_attn_row *row, int i)
{
    int nv = row->nv[i];
    float *s = row->s + KERN_ATTN_STEP * i;
    __mmask16 k0 = a512_mask(nv), k1 = a512_mask(nv - 16);
    __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 s0 = _mm512_mask_loadu_ps(ninf, k0, s), s1 = _mm512_mask_loadu_ps(ninf, k1, s + 16);
    float bm = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
    float mo = row->m, mn = mo > bm ? mo : bm;
    /* alpha is exactly 1 when the max stands (exp(0) == 1), so skipping the
     * multiply then changes no bit; 0 before the split's first step. */
    float alpha = mo == -INFINITY ? 0.0f : _mm512_cvtss_f32(kern_exp16(_mm512_set1_ps(mo - mn)));
    __m512 lv = _mm512_loadu_ps(row->lvec), vm = _mm512_set1_ps(mn);
    if (alpha != 1.0f) lv = _mm512_mul_ps(lv, _mm512_set1_ps(alpha));
    __m512 p0 = _mm512_maskz_mov_ps(k0, kern_exp16(_mm512_sub_ps(s0, vm)));
    _mm512_storeu_ps(s, p0);
    lv = _mm512_add_ps(lv, p0);
    if (nv > 16) {
        __m512 p1 = _mm512_maskz_mov_ps(k1, kern_exp16(_mm512_sub_ps(s1, vm)));
        _mm512_storeu_ps(s + 16, p1);
        lv = _mm512_add_ps(lv, p1);
    }
    _mm512_storeu_ps(row->lvec, lv);
    row->m = mn;
    row->alpha[i] = alpha;
}

/* NR rows × NW vectors of head_dim from d0, keys [j0, j1) of step i.  The
 * probabilities are broadcast once per key and V loaded per vector, so 3
 * rows × 8 vectors of accumulators fit the 32 registers. */
AI void a512_pv_tile(kern_attn_row *rows, int NR, const kern_attn_span *sp, int i, int j0, int j1,
                     int T, int d0, int NW, int D, int rescale)
{
    __m512 acc[3][8];
    const float *p[3];
    size_t es = T == DX_F32 ? 4 : T == DX_Q8_0 ? 1 : 2;
#pragma GCC unroll 3
    for (int r = 0; r < NR; r++) {
        __m512 a = _mm512_set1_ps(rows[r].alpha[i]);
        p[r] = rows[r].s + KERN_ATTN_STEP * i;
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            acc[r][w] = _mm512_loadu_ps(rows[r].acc + d0 + 16 * w);
            if (rescale) acc[r][w] = _mm512_mul_ps(acc[r][w], a);
        }
    }
    for (int j = j0; j < j1; j++) {
        const uint8_t *vr = sp->v[2 * i + (j >> 4)] + (size_t)(j & 15) * (size_t)D * es;
        const float *sf = T == DX_Q8_0 ? sp->vsf[2 * i + (j >> 4)] + (j & 15) * (D / 32) : NULL;
        __m512 pb[3];
#pragma GCC unroll 3
        for (int r = 0; r < NR; r++) pb[r] = _mm512_set1_ps(p[r][j]);
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            __m512 vv = T == DX_Q8_0 ? a512_q8v(vr, sf, d0 + 16 * w)
                                     : a512_ld(T, vr, (size_t)(d0 + 16 * w));
#pragma GCC unroll 3
            for (int r = 0; r < NR; r++) acc[r][w] = _mm512_fmadd_ps(pb[r], vv, acc[r][w]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) _mm512_storeu_ps(rows[r].acc + d0 + 16 * w, acc[r][w]);
}

AI void a512_pv_rows(kern_attn_row *rows, int NR, const kern_attn_span *sp, int i, int j0, int j1,
                     int T, int D, int rescale)
{
    int d0 = 0;
    for (; d0 + 128 <= D; d0 += 128) a512_pv_tile(rows, NR, sp, i, j0, j1, T, d0, 8, D, rescale);
    for (; d0 + 64 <= D; d0 += 64) a512_pv_tile(rows, NR, sp, i, j0, j1, T, d0, 4, D, rescale);
    for (; d0 < D; d0 += 16) a512_pv_tile(rows, NR, sp, i, j0, j1, T, d0, 1, D, rescale);
}

AI void a512_pv_t(kern_attn_row *rows, int nr, const kern_attn_span *sp, int i, int j0, int j1,
                  int T, int D, int rescale)
{
    switch (nr) {
    case 3:
        a512_pv_rows(rows, 3, sp, i, j0, j1, T, D, rescale);
        break;
    case 2:
        a512_pv_rows(rows, 2, sp, i, j0, j1, T, D, rescale);
        break;
    default:
        a512_pv_rows(rows, 1, sp, i, j0, j1, T, D, rescale);
        break;
    }
}

static void a512_pv(kern_attn_row *rows, int nr, const kern_attn_span *sp, int i, int j0, int j1,
                    int D, int rescale)
{
    switch (sp->vtype) {
    case DX_Q8_0:
        a512_pv_t(rows, nr, sp, i, j0, j1, DX_Q8_0, D, rescale);
        break;
    case DX_F16:
        a512_pv_t(rows, nr, sp, i, j0, j1, DX_F16, D, rescale);
        break;
    case DX_BF16:
        a512_pv_t(rows, nr, sp, i, j0, j1, DX_BF16, D, rescale);
        break;
    default:
        a512_pv_t(rows, nr, sp, i, j0, j1, DX_F32, D, rescale);
        break;
    }
}

static void a512_close(kern_attn_row *row, int D)
{
    row->acc[D] = row->m;
    row->acc[D + 1] = _mm512_reduce_add_ps(_mm512_loadu_ps(row->lvec));
}

static void a512_merge(float *acc, float *m, float *l, const float *part, int D)
{
    float mo = *m, mp = part[D], mn = mo > mp ? mo : mp;
    __m512 a = kern_exp16(_mm512_set1_ps(mo - mn)), b = kern_exp16(_mm512_set1_ps(mp - mn));
    for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(_mm512_loadu_ps(part + d), b,
                                                  _mm512_mul_ps(_mm512_loadu_ps(acc + d), a)));
    __m512 lv =
        _mm512_fmadd_ps(_mm512_set1_ps(part[D + 1]), b, _mm512_mul_ps(_mm512_set1_ps(*l), a));
    *l = _mm512_cvtss_f32(lv);
    *m = mn;
}

static void a512_finish(const float *acc, float l, int D, float *out)
{
    __m512 lv = _mm512_set1_ps(l);
    for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(out + d, _mm512_div_ps(_mm512_loadu_ps(acc + d), lv));
}

const kern_attn_isa kern_attn_isa_avx512 = {
    .lanes = 16,
    .pv_rows = 3,
    .qk = a512_qk,
    .softmax = a512_softmax,
    .pv = a512_pv,
    .close = a512_close,
    .merge = a512_merge,
    .finish = a512_finish,
    .cvt = a512_cvt,
    .qk_q8 = a512_qk_q8,
    .cvt_q8v = a512_cvt_q8v,
};
