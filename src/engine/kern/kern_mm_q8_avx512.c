/* kern_mm_q8_avx512: the Q8_0 matmul on AVX-512 VNNI, for the driver in
 * kern_mm.c, which hands it groups of 16 weight rows and any number of
 * tokens, one to a whole prompt (the AVX-512 Q8_0 tiles keep the rows past
 * the last group of 16).
 *
 * The arithmetic is Q8_0's of kern_mm_priv.h, the scalar twin's bit for
 * bit: per block an exact integer dot, then one fma per element.  The old
 * tiles kept a lane per group of 4 quants (16 f32 partials an element,
 * summed by a tree at the end) and paid a float multiply-add per 4
 * products; here one fma covers a block's 32.
 *
 * A panel of Q8_NB blocks of 16 rows is first transposed (kern_mm_t16.h) so
 * that lane o of a vector holds 4 consecutive quants of row o, made
 * unsigned (+128, vpdpbusd's unsigned operand); then for every token, one
 * vpdpbusd against the token's 4 quants at that place, broadcast, adds 64
 * products into the 16 rows' sums, no lane crossing.  A block's chain
 * starts from the token's -128 * (sum of its quants), the row tail's corr,
 * so it ends at the exact dot.  The panel (4.5 KiB) stays in L1 while every
 * token passes over it, Q8_MR at a time with two blocks' chains each (16
 * independent sums cover vpdpbusd's latency), so each weight vector loaded
 * serves Q8_MR tokens; a token reads only its quants' lines and the tail.
 *
 * Under Q8_PANEL_MIN_TOK tokens (decode) the transpose would cost more
 * than the products, so each token walks the group's rows as they lie (a
 * pair of blocks of each row a step, q8_dec_step): one vpdpbusd a row, then
 * a tree of shuffles and adds gives every row's block dots at once, the
 * same integers, so the same bits.  Software prefetch, as for the decode
 * tiles (kern_mm_x86.h), keeps the next group's rows coming: without it
 * decode ran at half the rate (qwen3-0.6b Q8_0 tg64 24-26 tok/s against
 * 43-46, Zen 4). */
#include <immintrin.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern_mm_priv.h"
#include "engine/kern/kern_mm_t16.h"
#include "engine/kern/kern_mm_x86.h"

#define Q8_INLINE static inline __attribute__((always_inline))
#define Q8_UNROLL _Pragma("GCC unroll 16")
#define Q8_MR     8 /* tokens a pass */
#define Q8_NB     8 /* blocks a panel */
#define Q8_BLK    sizeof(dx_block_q8_0)
/* Fewer tokens take the decode walk, token by token, each over the group's
 * rows while they are in L1/L2 (bench_mm 1024x3072, Zen 4, 2 threads: 4
 * tokens 168 GFLOP/s that way, 150 through the panel; 6 tokens 164 and
 * 190). */
#define Q8_PANEL_MIN_TOK 5

/* A panel of 16 rows: u[j][k] lane o holds quants 4k..4k+3 of row o's
 * block j, plus 128; d[j] the rows' scales of block j widened. */
typedef struct {
    __m512i u[Q8_NB][8];
    __m512 d[Q8_NB];
} q8_panel;

/* Blocks b0..b0+nb-1 of the 16 rows (row[o], roff their offsets from
 * row[0]) into P; the scales by a gather, which the panel's tokens share. */
Q8_INLINE void q8_prep(const uint8_t *const *row, __m512i roff, size_t b0, size_t nb, q8_panel *P)
{
    for (size_t j = 0; j < nb; j++) {
        size_t off = (b0 + j) * Q8_BLK;
        kern__t16_rows(row, off + 2, P->u[j]);
        Q8_UNROLL
        for (int k = 0; k < 8; k++)
            P->u[j][k] = _mm512_xor_si512(P->u[j][k], _mm512_set1_epi8((char)0x80));
        /* the dword at each row's block start: d in its low half */
        __m512i dd = _mm512_i32gather_epi32(roff, row[0] + off, 1);
        P->d[j] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
    }
}

/* H blocks from panel block j (block b of the row) for MR tokens: the
 * chains, then each token's fmas in block order. */
Q8_INLINE void q8_step(const q8_panel *P, size_t j, size_t b, const uint8_t *const *xq,
                       const uint8_t *const *tail, __m512 *f, const int H, const int MR)
{
    __m512i a[2][Q8_MR];
    Q8_UNROLL
    for (int h = 0; h < H; h++) Q8_UNROLL
    for (int t = 0; t < MR; t++) {
        int32_t corr;
        memcpy(&corr, tail[t] + 8 * (b + (size_t)h), 4);
        a[h][t] = _mm512_set1_epi32(corr);
    }
    Q8_UNROLL
    for (int k = 0; k < 8; k++) Q8_UNROLL
    for (int h = 0; h < H; h++) {
        __m512i wv = _mm512_load_si512(&P->u[j + (size_t)h][k]);
        size_t qo =
            ((b + (size_t)h) / 2) * KERN__Q8_PAIR_BYTES + ((b + (size_t)h) % 2) * 32 + 4 * k;
        Q8_UNROLL
        for (int t = 0; t < MR; t++) a[h][t] = kern__dpbusd_b(a[h][t], wv, xq[t] + qo);
    }
    Q8_UNROLL
    for (int h = 0; h < H; h++) Q8_UNROLL
    for (int t = 0; t < MR; t++) {
        float dx;
        memcpy(&dx, tail[t] + 8 * (b + (size_t)h) + 4, 4);
        f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[h][t]),
                               _mm512_mul_ps(P->d[j + (size_t)h], _mm512_set1_ps(dx)), f[t]);
    }
}

/* MR tokens (act, xrow apart) against the panel's nb blocks from block b0,
 * added to y[t] (16 rows, row o at y[t] + o; b0 == 0: y starts at +0). */
Q8_INLINE void q8_run(const q8_panel *P, size_t b0, size_t nb, const uint8_t *act, size_t xrow,
                      size_t tail_off, float *y, size_t ldy, const int MR)
{
    const uint8_t *xq[Q8_MR], *tail[Q8_MR];
    __m512 f[Q8_MR];
    Q8_UNROLL
    for (int t = 0; t < MR; t++) {
        xq[t] = act + (size_t)t * xrow;
        tail[t] = xq[t] + tail_off;
        f[t] = b0 ? _mm512_loadu_ps(y + (size_t)t * ldy) : _mm512_setzero_ps();
    }
    size_t j = 0;
#pragma GCC unroll 1
    for (; j + 2 <= nb; j += 2) q8_step(P, j, b0 + j, xq, tail, f, 2, MR);
    if (j < nb) q8_step(P, j, b0 + j, xq, tail, f, 1, MR);
    Q8_UNROLL
    for (int t = 0; t < MR; t++) _mm512_storeu_ps(y + (size_t)t * ldy, f[t]);
}

/* The decode walk: one token against 16 rows, a pair of blocks a step.
 * Each row's 64 quants meet the token's in one vpdpbusd (from the pair's
 * per-group corrections, so each lane holds an exact group dot); a tree of
 * shuffles and adds then gives each row's two block dots (lane o of s[0]
 * and s[1]; an integer sum has no order), 2.75 instructions a row, taken
 * as the rows come so that few vectors are live.  The rows' scales come as
 * dwords (d0 | d1 << 16) merged by the same kind of tree: a gather costs
 * ~30 cycles on Zen 4. */

/* Row o's pair p (`two` 0 for a lone last block) against the token's
 * quants xq (corrections nc): its 16 group dots, and its scales in dword 0
 * of *dl. */
Q8_INLINE __m512i q8_dec_row(const uint8_t *wb, __m512i xq, __m512i nc, int two, __m128i *dl)
{
    __m256i lo = _mm256_loadu_si256((const __m256i *)(wb + 2));
    __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(wb + 36)) : _mm256_setzero_si256();
    __m512i wu = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                                  _mm512_set1_epi8((char)0x80));
    int32_t h0, h1 = 0;
    memcpy(&h0, wb, 4);
    if (two) memcpy(&h1, wb + 34, 4);
    *dl = _mm_unpacklo_epi16(_mm_cvtsi32_si128(h0), _mm_cvtsi32_si128(h1));
    return _mm512_dpbusd_epi32(nc, wu, xq);
}

/* Rows 4q..4q+3: per 128 bits, each row's sum of a group quad (rows in
 * order), and their scales in dwords 0-3 of *d4. */
Q8_INLINE __m512i q8_dec_quad(const uint8_t *w0, size_t wrow, __m512i xq, __m512i nc, int two,
                              __m128i *d4)
{
    __m512i a[2];
    __m128i dl[4], dp[2];
    Q8_UNROLL
    for (int i = 0; i < 2; i++) { /* rows 2i, 2i+1: [r0 r1 r0 r1] per 128 bits */
        __m512i v0 = q8_dec_row(w0 + (size_t)(2 * i) * wrow, xq, nc, two, &dl[2 * i]);
        __m512i v1 = q8_dec_row(w0 + (size_t)(2 * i + 1) * wrow, xq, nc, two, &dl[2 * i + 1]);
        a[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
        dp[i] = _mm_unpacklo_epi32(dl[2 * i], dl[2 * i + 1]);
    }
    *d4 = _mm_unpacklo_epi64(dp[0], dp[1]);
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a[0], a[1]), _mm512_unpackhi_epi64(a[0], a[1]));
}

/* Pair p of the 16 rows from w0 (wrow apart; `two` 0 for a lone last
 * block) against the token's row x, into f. */
Q8_INLINE void q8_dec_step(const uint8_t *w0, size_t wrow, const uint8_t *x, size_t tail_off,
                           size_t p, int two, __m512 *f)
{
    const uint8_t *xp = x + p * KERN__Q8_PAIR_BYTES;
    const __m512i xq = _mm512_load_si512(xp), nc = _mm512_load_si512(xp + 64);
    const uint8_t *wb = w0 + p * 2 * Q8_BLK;
    __m512i c[2];
    __m128i d4[4];
    Q8_UNROLL
    for (int i = 0; i < 2; i++) { /* [blk0 rows 8i..8i+3, blk1 .., blk0 8i+4.., blk1 ..] */
        __m512i b0 = q8_dec_quad(wb + (size_t)(8 * i) * wrow, wrow, xq, nc, two, &d4[2 * i]);
        __m512i b1 =
            q8_dec_quad(wb + (size_t)(8 * i + 4) * wrow, wrow, xq, nc, two, &d4[2 * i + 1]);
        c[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(b0, b1, 0x88),
                                _mm512_shuffle_i32x4(b0, b1, 0xdd));
    }
    __m512i s0 = _mm512_shuffle_i32x4(c[0], c[1], 0x88),
            s1 = _mm512_shuffle_i32x4(c[0], c[1], 0xdd);
    __m512i d = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(d4[0]), d4[1], 1)),
        _mm256_inserti128_si256(_mm256_castsi128_si256(d4[2]), d4[3], 1), 1);
    float dx0, dx1;
    memcpy(&dx0, x + tail_off + 16 * p + 4, 4);
    memcpy(&dx1, x + tail_off + 16 * p + 12, 4);
    __m512 d0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
    *f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(d0, _mm512_set1_ps(dx0)), *f);
    if (two) {
        __m512 d1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d, 16)));
        *f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(d1, _mm512_set1_ps(dx1)), *f);
    }
}

/* One token against the 16 rows from w0, into y[0..15]. */
static void q8_dec16(const uint8_t *w0, size_t wrow, const uint8_t *x, size_t n_in, size_t tail_off,
                     float *y)
{
    const size_t np = n_in / 64;
    __m512 f = _mm512_setzero_ps();
    kern__pf pf = kern__pf_next_tile(w0, wrow, 16, np);
    for (size_t p = 0; p < np; p++) {
        kern__pf_step(&pf, 16);
        q8_dec_step(w0, wrow, x, tail_off, p, 1, &f);
    }
    if ((n_in / 32) & 1) q8_dec_step(w0, wrow, x, tail_off, np, 0, &f);
    _mm512_storeu_ps(y, f);
}

void kern__q8512_matmul(const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow, size_t n_in,
                        size_t n_rows, size_t n_tok, float *y, size_t ldy)
{
    DX_ASSERT(n_rows % 16 == 0 && n_in % 32 == 0 && 15 * wrow < (size_t)INT32_MAX);
    const size_t nb = n_in / 32, np = (nb + Q8_NB - 1) / Q8_NB, tail_off = kern__q8_tail_off(n_in);
    const __m512i roff =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32((int)wrow));
    _Alignas(64) q8_panel P;
    for (size_t o = 0; o < n_rows; o += 16) {
        const uint8_t *row[16];
        for (int r = 0; r < 16; r++) row[r] = w + (o + (size_t)r) * wrow;
        if (n_tok < Q8_PANEL_MIN_TOK) {
            for (size_t t = 0; t < n_tok; t++)
                q8_dec16(row[0], wrow, act + t * xrow, n_in, tail_off, y + t * ldy + o);
            continue;
        }
        /* a few tokens read the rows once and compute little: bring the
         * next group's rows in while this one's are used */
        kern__pf pf = kern__pf_next_tile(row[0], wrow, 16, np);
        for (size_t p = 0; p < np; p++) {
            size_t b0 = p * Q8_NB, n = nb - b0 < Q8_NB ? nb - b0 : Q8_NB;
            if (n_tok < Q8_MR) kern__pf_step(&pf, 16);
            q8_prep(row, roff, b0, n, &P);
            size_t t = 0;
            for (; t + Q8_MR <= n_tok; t += Q8_MR)
                q8_run(&P, b0, n, act + t * xrow, xrow, tail_off, y + t * ldy + o, ldy, Q8_MR);
            for (; t + 4 <= n_tok; t += 4)
                q8_run(&P, b0, n, act + t * xrow, xrow, tail_off, y + t * ldy + o, ldy, 4);
            for (; t < n_tok; t++)
                q8_run(&P, b0, n, act + t * xrow, xrow, tail_off, y + t * ldy + o, ldy, 1);
        }
    }
}
