/* kern_mm_kq_avx512: the prefill matmuls of the super-block formats (Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) on AVX-512 VNNI, for the driver in
 * kern_mm.c, which hands it groups of 16 weight rows and any number of
 * tokens (decode has tiles of its own, kern_mm_kqd_avx512.c, and the AVX2
 * tiles keep 2-7 tokens and the last rows; with AMX, this file takes the
 * tokens past its groups of 16).
 *
 * The arithmetic is the super-block formats' of kern_mm_priv.h, bit for
 * bit: per super-block the integer sums A = sum sc * v * x and B = sum m * bs
 * are exact whatever order adds them, and the two float steps per element
 * are the scalar twin's, lane by lane.
 *
 * Why not the AVX2 tiles on wider vectors: they keep one accumulator an
 * element, whose lanes must be summed across every super-block, and pay a
 * vpmaddubsw, a vpmaddwd and an add for 32 products.  Here a super-block of
 * 16 rows is first transposed (kern_mm_t16.h) so that lane o of a vector
 * holds 4 consecutive weights of row o, unsigned (Q3_K, Q6_K and IQ4_XS
 * shifted up by 4, 32 and 128); then for every token, one vpdpbusd against
 * the token's 4 quants at that place, broadcast, adds 64 products into the
 * 16 rows' sums, no lane crossing.  A chain's sum is multiplied by its
 * sub-block's scale into A (vpdpwssd where it fits 16 bits, else vpmulld:
 * kq_short); the minimums, and the offsets of the shifted formats (-4,
 * -32, -128 times sum sc * bs), come from the token's bsums, one vpdpwssd
 * per pair of them.  The transposed super-block (5.5 KiB) stays in L1
 * while every token passes over it, eight at a time with two chains each
 * (16 independent sums cover vpdpbusd's latency), so each weight vector
 * loaded serves eight tokens.  Under KERN__KQ512_MIN_TOK tokens the tiles
 * run instead: transposing costs more than a few tokens' products. */
#include <immintrin.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern_mm_priv.h"
#include "engine/kern/kern_mm_t16.h"
#include "engine/kern/kern_mm_x86.h"

#define KQ_INLINE static inline __attribute__((always_inline))
#define KQ_UNROLL _Pragma("GCC unroll 16")
#define KQ_MR     8 /* tokens a pass */

/* One super-block of 16 weight rows, transposed: u[c][k] lane o holds
 * elements 64c + 4k .. 64c + 4k + 3 of row o (unsigned); sc[s] sub-block
 * s's scale (int32) and f[i] the factors of bsums 2i and 2i + 1 (int16
 * pair), lane o row o's; d, dmin the rows' factors widened. */
typedef struct {
    __m512i u[4][16];
    __m512i sc[16];
    __m512i f[8];
    __m512 d, dmin;
} kq_sb;

KQ_INLINE int kq_sub16(const int T)
{
    return T == DX_Q2_K || T == DX_Q3_K || T == DX_Q6_K;
}

/* Products summed in a chain before its scale multiplies them: 16
 * elements (4 vpdpbusd) where the chain's sum fits 16 bits signed (16 *
 * u_max * 127 < 2^15: Q2_K, Q3_K, Q4_K), so that one vpdpwssd against the
 * scale (its low 16 bits, the high ones 0) adds it into A; else a whole
 * sub-block and vpmulld. */
KQ_INLINE int kq_short(const int T)
{
    return T == DX_Q2_K || T == DX_Q3_K || T == DX_Q4_K;
}

/* Bytes j of the 16 rows' scale bytes (st: kern__t16_rows of them), as
 * int32: unsigned, or sign-extended. */
KQ_INLINE __m512i kq_byte_u(const __m512i *st, int j)
{
    return _mm512_and_si512(_mm512_srli_epi32(st[j / 4], 8 * (j % 4)), _mm512_set1_epi32(0xff));
}
KQ_INLINE __m512i kq_byte_s(const __m512i *st, int j)
{
    return _mm512_srai_epi32(_mm512_slli_epi32(st[j / 4], 24 - 8 * (j % 4)), 24);
}
/* Two int32 vectors as int16 pairs (lo in the low half of each lane). */
KQ_INLINE __m512i kq_pair(__m512i lo, __m512i hi)
{
    return _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xffff)),
                           _mm512_slli_epi32(hi, 16));
}

/* Super-block s of the 16 rows at w (wrow apart) into P. */
KQ_INLINE void kq_prep(const uint8_t *w, size_t wrow, size_t s, kq_sb *P, const int T)
{
    const size_t bb = kern__kq_bytes(T);
    const uint8_t *b[16], *sp[16];
    _Alignas(64) uint8_t st8[16][32]; /* row o's scale bytes, 32 apart for kern__t16_rows */
    for (int o = 0; o < 16; o++) b[o] = w + (size_t)o * wrow + s * bb, sp[o] = st8[o];
    kern__t16_scales(b, &st8[0][0], 32, &P->d, &P->dmin, T);
    __m512i st[8];
    kern__t16_rows(sp, 0, st); /* st[k] lane o: row o's scale bytes 4k..4k+3 */
    const int nsub = kq_sub16(T) ? 16 : 8;
    __m512i mn[16];
    for (int j = 0; j < nsub; j++) {
        __m512i v = T == DX_Q6_K ? kq_byte_s(st, j) : kq_byte_u(st, j);
        if (T == DX_Q2_K) {
            mn[j] = _mm512_srli_epi32(v, 4);
            v = _mm512_and_si512(v, _mm512_set1_epi32(15));
        } else if (T == DX_Q4_K || T == DX_Q5_K) {
            mn[j] = kq_byte_u(st, 8 + j);
        } else if (T == DX_Q3_K || T == DX_IQ4_XS) {
            v = _mm512_sub_epi32(v, _mm512_set1_epi32(32));
        }
        P->sc[j] = v;
    }
    /* the bsums' factors: the minimums, or minus the shift times the scale */
    const int sh = T == DX_IQ4_XS ? 7 : T == DX_Q6_K ? 5 : 2;
    __m512i ns[16]; /* -(sc << sh) */
    for (int j = 0; j < nsub && !kern__kq_has_min(T); j++)
        ns[j] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(P->sc[j], sh));
    for (int i = 0; i < 8; i++)
        P->f[i] = T == DX_Q2_K                   ? kq_pair(mn[2 * i], mn[2 * i + 1])
                  : T == DX_Q4_K || T == DX_Q5_K ? kq_pair(mn[i], mn[i])
                  : T == DX_IQ4_XS               ? kq_pair(ns[i], ns[i])
                                                 : kq_pair(ns[2 * i], ns[2 * i + 1]);
    if (kq_short(T)) /* vpdpwssd's int16 pair: the scale, then 0 */
        for (int j = 0; j < nsub; j++)
            P->sc[j] = _mm512_and_si512(P->sc[j], _mm512_set1_epi32(0xffff));
    __m512i hb[8];
    if (T == DX_Q5_K) kern__t16_rows(b, offsetof(dx_block_q5_k, qh), hb);
    if (T == DX_Q3_K) kern__t16_rows(b, offsetof(dx_block_q3_k, hmask), hb);
    const __m512i up = _mm512_set1_epi8(T == DX_Q3_K ? 4 : T == DX_Q6_K ? 32 : 0);
    for (int c = 0; c < 4; c++) {
        __m512i v[16];
        kern__t16_weights(b, c, hb, v, T);
        for (int k = 0; k < 16; k++)
            P->u[c][k] = T == DX_IQ4_XS ? _mm512_xor_si512(v[k], _mm512_set1_epi8((char)0x80))
                         : T == DX_Q3_K || T == DX_Q6_K ? _mm512_add_epi8(v[k], up)
                                                        : v[k];
    }
}

/* MR tokens (act, xrow apart; super-block s) against P, added to y[t]
 * (16 rows, row o at y[t] + o).  Two chains run side by side for each
 * token, 2 * MR independent sums, so that vpdpbusd's latency is covered. */
KQ_INLINE void kq_run(const kq_sb *P, size_t s, const uint8_t *act, size_t xrow, float *y,
                      size_t ldy, const int T, const int MR)
{
    const int sub = kq_sub16(T) ? 4 : 8;   /* k steps a sub-block */
    const int kpc = kq_short(T) ? 4 : sub; /* k steps a chain */
    const int nch = 64 / kpc;              /* chains a super-block */
    const uint8_t *xq[KQ_MR];
    KQ_UNROLL
    for (int t = 0; t < MR; t++) xq[t] = (const uint8_t *)kern__q8k_qs(act + (size_t)t * xrow, s);
    __m512i a[KQ_MR], m[KQ_MR];
    KQ_UNROLL
    for (int t = 0; t < MR; t++) a[t] = m[t] = _mm512_setzero_si512();
    /* a loop, not unrolled: GCC would hoist every chain's start and spill */
    const __m512i *u = &P->u[0][0];
    const __m512i *scp = P->sc;
#pragma GCC unroll 1
    for (int ch = 0; ch < nch; ch += 2, u += 2 * kpc) {
        __m512i p[2][KQ_MR];
        KQ_UNROLL
        for (int k = 0; k < kpc; k++) {
            KQ_UNROLL
            for (int h = 0; h < 2; h++) {
                __m512i wv = _mm512_load_si512(u + h * kpc + k);
                KQ_UNROLL
                for (int t = 0; t < MR; t++) {
                    const uint8_t *xp = xq[t] + 4 * (size_t)(ch * kpc + h * kpc + k);
                    p[h][t] = kern__dpbusd_b(k ? p[h][t] : _mm512_setzero_si512(), wv, xp);
                }
            }
        }
        KQ_UNROLL
        for (int h = 0; h < 2; h++) {
            __m512i sc = _mm512_load_si512(scp + (ch + h) * kpc / sub);
            KQ_UNROLL
            for (int t = 0; t < MR; t++)
                a[t] = kq_short(T) ? _mm512_dpwssd_epi32(a[t], p[h][t], sc)
                                   : _mm512_add_epi32(a[t], _mm512_mullo_epi32(p[h][t], sc));
        }
    }
    KQ_UNROLL
    for (int i = 0; i < 8; i++) {
        __m512i f = _mm512_load_si512(&P->f[i]);
        KQ_UNROLL
        for (int t = 0; t < MR; t++) m[t] = kern__dpwssd_b(m[t], f, xq[t] + 256 + 4 * i);
    }
    KQ_UNROLL
    for (int t = 0; t < MR; t++) {
        const uint8_t *xr = act + (size_t)t * xrow;
        __m512 dx = _mm512_set1_ps(kern__q8k_d(xr, s));
        float *yt = y + (size_t)t * ldy;
        __m512 acc = s ? _mm512_loadu_ps(yt) : _mm512_setzero_ps();
        if (!kern__kq_has_min(T)) a[t] = _mm512_add_epi32(a[t], m[t]);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[t]), _mm512_mul_ps(P->d, dx), acc);
        if (kern__kq_has_min(T))
            acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m[t]), _mm512_mul_ps(P->dmin, dx), acc);
        _mm512_storeu_ps(yt, acc);
    }
}

KQ_INLINE void kq_matmul(const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow,
                         size_t n_in, size_t n_rows, size_t n_tok, float *y, size_t ldy,
                         const int T)
{
    const size_t nsb = n_in / DX_QK_K;
    _Alignas(64) kq_sb P;
    for (size_t o = 0; o < n_rows; o += 16) {
        const uint8_t *wo = w + o * wrow;
        for (size_t s = 0; s < nsb; s++) {
            kq_prep(wo, wrow, s, &P, T);
            size_t t = 0;
            for (; t + KQ_MR <= n_tok; t += KQ_MR)
                kq_run(&P, s, act + t * xrow, xrow, y + t * ldy + o, ldy, T, KQ_MR);
            for (; t + 4 <= n_tok; t += 4)
                kq_run(&P, s, act + t * xrow, xrow, y + t * ldy + o, ldy, T, 4);
            for (; t < n_tok; t++) kq_run(&P, s, act + t * xrow, xrow, y + t * ldy + o, ldy, T, 1);
        }
    }
}

void kern__kq512_matmul(int wtype, const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow,
                        size_t n_in, size_t n_rows, size_t n_tok, float *y, size_t ldy)
{
    DX_ASSERT(dx_dtype_block_elems(wtype) == DX_QK_K && n_rows % 16 == 0);
    KERN__KQ_DISPATCH(wtype, kq_matmul, w, wrow, act, xrow, n_in, n_rows, n_tok, y, ldy);
}
