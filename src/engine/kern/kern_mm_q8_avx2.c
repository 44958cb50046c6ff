/* kern_mm_q8_avx2: the Q8_0 matmul on AVX2, for the driver in kern_mm.c,
 * which hands it groups of 8 weight rows and any number of tokens (the
 * AVX2 Q8_0 tiles keep the rows past the last group of 8).
 *
 * The arithmetic is Q8_0's of kern_mm_priv.h, the scalar twin's and the
 * AVX-512 path's bit for bit: per block an exact integer dot, then one fma
 * per element.  AVX2 has no vpdpbusd: a dot of 4 quants is vpmaddubsw of
 * |w| against x with w's sign (vpsignb; no saturation, 2 * 128 * 127 <
 * 2^15) and vpmaddwd against ones, exact in int32.  The old tiles kept a
 * lane per group of 4 quants (8 f32 partials an element, summed by a tree
 * at the end) and paid a conversion, a multiply and an FMA for every 32
 * products of a row and token; here one FMA covers 256 (8 rows of a block).
 *
 * From Q8A_PANEL_MIN_TOK tokens a panel of Q8A_NB blocks of 8 rows is
 * transposed once (lane o of a vector holds 4 consecutive quants of row
 * o; |w| and w both kept) and every token passes over it, Q8A_MR at a
 * time: per 4 quants a broadcast of the token's, vpsignb, vpmaddubsw,
 * vpmaddwd and an add give 32 products into the 8 rows' sums.  Fewer
 * tokens walk the group's rows as they lie, a block of each row a step:
 * the 8 rows' group dots, then a tree of unpacks and adds gives each row's
 * block dot at once (integer sums have no order, so the same bits). */
#include <immintrin.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern_mm_priv.h"
#include "engine/kern/kern_mm_x86.h"

#define Q8A_INLINE static inline __attribute__((always_inline))
#define Q8A_UNROLL _Pragma("GCC unroll 16")
#define Q8A_MR     4 /* tokens a pass: 8 accumulators and 4 weight vectors in 16 ymm */
#define Q8A_NB     8 /* blocks a panel */
#define Q8A_BLK    sizeof(dx_block_q8_0)
/* Fewer tokens walk the rows, token by token (see kern_mm_q8_avx512.c). */
#define Q8A_PANEL_MIN_TOK 5

/* The quants of block b of a prepared token row, and its scale (the tail). */
Q8A_INLINE const uint8_t *q8a_xq(const uint8_t *x, size_t b)
{
    return (const uint8_t *)kern__q8_qs(x, b);
}

/* ---- the panel ---- */

/* 8 rows' block, transposed: a[k] lane o holds |quants 4k..4k+3| of row o,
 * s[k] the quants themselves (their signs for vpsignb). */
typedef struct {
    __m256i a[Q8A_NB][8], s[Q8A_NB][8];
    __m256 d[Q8A_NB];
} q8a_panel;

/* Rows in[o] (8 dwords each) into out[k], lane o = row o's dword k. */
Q8A_INLINE void q8a_transpose(const __m256i *in, __m256i *out)
{
    __m256i t[8], u[8];
    Q8A_UNROLL
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    Q8A_UNROLL
    for (int h = 0; h < 2; h++) { /* rows 0-3, then 4-7 */
        const __m256i *a = t + 4 * h;
        __m256i *b = u + 4 * h;
        b[0] = _mm256_unpacklo_epi64(a[0], a[2]);
        b[1] = _mm256_unpackhi_epi64(a[0], a[2]);
        b[2] = _mm256_unpacklo_epi64(a[1], a[3]);
        b[3] = _mm256_unpackhi_epi64(a[1], a[3]);
    }
    /* u[d] holds rows 0-3's dwords d and d + 4 (one a 128-bit half), u[d + 4] rows 4-7's */
    Q8A_UNROLL
    for (int d = 0; d < 4; d++) {
        out[d] = _mm256_permute2x128_si256(u[d], u[d + 4], 0x20);
        out[d + 4] = _mm256_permute2x128_si256(u[d], u[d + 4], 0x31);
    }
}

Q8A_INLINE void q8a_prep(const uint8_t *w0, size_t wrow, size_t b0, size_t nb, q8a_panel *P)
{
    for (size_t j = 0; j < nb; j++) {
        const uint8_t *wb = w0 + (b0 + j) * Q8A_BLK;
        __m256i r[8];
        uint16_t dh[8];
        Q8A_UNROLL
        for (int o = 0; o < 8; o++) {
            r[o] = _mm256_loadu_si256((const __m256i *)(wb + (size_t)o * wrow + 2));
            memcpy(&dh[o], wb + (size_t)o * wrow, 2);
        }
        q8a_transpose(r, P->s[j]);
        Q8A_UNROLL
        for (int k = 0; k < 8; k++) P->a[j][k] = _mm256_sign_epi8(P->s[j][k], P->s[j][k]);
        P->d[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
    }
}

/* MR tokens against the panel's nb blocks from block b0, added to y[t]
 * (8 rows; b0 == 0: y starts at +0). */
Q8A_INLINE void q8a_run(const q8a_panel *P, size_t b0, size_t nb, const uint8_t *act, size_t xrow,
                        size_t tail_off, float *y, size_t ldy, const int MR)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f[Q8A_MR];
    Q8A_UNROLL
    for (int t = 0; t < MR; t++)
        f[t] = b0 ? _mm256_loadu_ps(y + (size_t)t * ldy) : _mm256_setzero_ps();
#pragma GCC unroll 1
    for (size_t j = 0; j < nb; j++) {
        const size_t b = b0 + j;
        __m256i acc[Q8A_MR];
        Q8A_UNROLL
        for (int t = 0; t < MR; t++) acc[t] = _mm256_setzero_si256();
        Q8A_UNROLL
        for (int k = 0; k < 8; k++) {
            __m256i wa = _mm256_load_si256(&P->a[j][k]), ws = _mm256_load_si256(&P->s[j][k]);
            Q8A_UNROLL
            for (int t = 0; t < MR; t++) {
                int32_t q;
                memcpy(&q, q8a_xq(act + (size_t)t * xrow, b) + 4 * k, 4);
                __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(q), ws);
                acc[t] =
                    _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, sx), ones));
            }
        }
        Q8A_UNROLL
        for (int t = 0; t < MR; t++) {
            float dx;
            memcpy(&dx, act + (size_t)t * xrow + tail_off + 8 * b + 4, 4);
            f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t]),
                                   _mm256_mul_ps(P->d[j], _mm256_set1_ps(dx)), f[t]);
        }
    }
    Q8A_UNROLL
    for (int t = 0; t < MR; t++) _mm256_storeu_ps(y + (size_t)t * ldy, f[t]);
}

/* ---- the decode walk ---- */

/* Block b of the 8 rows from w0 against the token's row x, into f. */
Q8A_INLINE void q8a_dec_step(const uint8_t *w0, size_t wrow, const uint8_t *x, size_t tail_off,
                             size_t b, __m256 *f)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i xq = _mm256_load_si256((const __m256i *)q8a_xq(x, b));
    const uint8_t *wb = w0 + b * Q8A_BLK;
    __m256i a[4], c[2];
    __m128i dl[8], dp[4];
    Q8A_UNROLL
    for (int i = 0; i < 4; i++) { /* rows 2i, 2i+1: [r0 r1 r0 r1] per 128 bits */
        __m256i v[2];
        Q8A_UNROLL
        for (int h = 0; h < 2; h++) {
            const uint8_t *r = wb + (size_t)(2 * i + h) * wrow;
            __m256i wq = _mm256_loadu_si256((const __m256i *)(r + 2));
            v[h] = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq)), ones);
            int32_t h0;
            memcpy(&h0, r, 4);
            dl[2 * i + h] = _mm_cvtsi32_si128(h0);
        }
        a[i] =
            _mm256_add_epi32(_mm256_unpacklo_epi32(v[0], v[1]), _mm256_unpackhi_epi32(v[0], v[1]));
        dp[i] = _mm_unpacklo_epi16(dl[2 * i], dl[2 * i + 1]);
    }
    Q8A_UNROLL
    for (int i = 0; i < 2; i++) /* rows 4i..4i+3, per 128 bits a half's sums */
        c[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(a[2 * i], a[2 * i + 1]),
                                _mm256_unpackhi_epi64(a[2 * i], a[2 * i + 1]));
    __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(c[0], c[1], 0x20),
                                 _mm256_permute2x128_si256(c[0], c[1], 0x31));
    __m128i d8 =
        _mm_unpacklo_epi64(_mm_unpacklo_epi32(dp[0], dp[1]), _mm_unpacklo_epi32(dp[2], dp[3]));
    float dx;
    memcpy(&dx, x + tail_off + 8 * b + 4, 4);
    *f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s),
                         _mm256_mul_ps(_mm256_cvtph_ps(d8), _mm256_set1_ps(dx)), *f);
}

static void q8a_dec8(const uint8_t *w0, size_t wrow, const uint8_t *x, size_t n_in, size_t tail_off,
                     float *y)
{
    const size_t nb = n_in / 32;
    __m256 f = _mm256_setzero_ps();
    kern__pf pf = kern__pf_next_tile(w0, wrow, 8, nb);
    for (size_t b = 0; b < nb; b++) {
        kern__pf_step(&pf, 8);
        q8a_dec_step(w0, wrow, x, tail_off, b, &f);
    }
    _mm256_storeu_ps(y, f);
}

void kern__q8avx2_matmul(const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow,
                         size_t n_in, size_t n_rows, size_t n_tok, float *y, size_t ldy)
{
    DX_ASSERT(n_rows % 8 == 0 && n_in % 32 == 0);
    const size_t nb = n_in / 32, np = (nb + Q8A_NB - 1) / Q8A_NB,
                 tail_off = kern__q8_tail_off(n_in);
    _Alignas(32) q8a_panel P;
    for (size_t o = 0; o < n_rows; o += 8) {
        const uint8_t *w0 = w + o * wrow;
        if (n_tok < Q8A_PANEL_MIN_TOK) {
            for (size_t t = 0; t < n_tok; t++)
                q8a_dec8(w0, wrow, act + t * xrow, n_in, tail_off, y + t * ldy + o);
            continue;
        }
        kern__pf pf = kern__pf_next_tile(w0, wrow, 8, np);
        for (size_t p = 0; p < np; p++) {
            size_t b0 = p * Q8A_NB, n = nb - b0 < Q8A_NB ? nb - b0 : Q8A_NB;
            if (n_tok < 2 * Q8A_MR) kern__pf_step(&pf, 8);
            q8a_prep(w0, wrow, b0, n, &P);
            size_t t = 0;
            for (; t + Q8A_MR <= n_tok; t += Q8A_MR)
                q8a_run(&P, b0, n, act + t * xrow, xrow, tail_off, y + t * ldy + o, ldy, Q8A_MR);
            for (; t < n_tok; t++)
                q8a_run(&P, b0, n, act + t * xrow, xrow, tail_off, y + t * ldy + o, ldy, 1);
        }
    }
}
