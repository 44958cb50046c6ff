/* kern_mm_avx512: AVX-512 matmul tiles (BF16 split into f32 halves + FMA, F16 via
 * vcvtph2ps + FMA, F32 FMA, the 32-block formats via vpdpbusd) and the
 * activation preps that feed them, for the driver in kern_mm.c
 * (kern_mm_isa_avx512).  The super-block formats run the AVX2 tiles for
 * 2-7 tokens, kern_mm_kqd_avx512.c's for decode and kern_mm_kq_avx512.c's
 * kernels for prefill; Q8_0 runs kern_mm_q8_avx512.c's for every token
 * count, and its tiles here only the rows past that kernel's groups of 16.
 *
 * Batch invariance by construction: every output element (token t, row o)
 * owns one zmm accumulator that walks K in the same fixed steps (a full
 * vector at a time, then one masked step for the remainder), and ends with
 * the same horizontal reduction tree (lane i + lane i+8, then +4, +2, +1).
 * Tiles of different shapes (MR tokens x NR rows, MR*NR <= 16) only decide
 * how many such accumulators run side by side, so a token's result is the
 * same alone, batched, in a tail tile, or in any [o0, o1) split.
 *
 * The driver sweeps each L2 block of weight rows with tiles of (up to) 4
 * tokens; decode (1-3 tokens) gets wide row tiles (up to 16 rows) so that
 * many weight streams are in flight. */
#include <immintrin.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "engine/kern/kern_mm_priv.h"
#include "engine/kern/kern_mm_x86.h"

#define MM_INLINE static inline __attribute__((always_inline))
/* Tile loops must unroll fully so that accumulators live in registers. */
#define MM_UNROLL _Pragma("GCC unroll 16")

/* Sums of 16 vectors: lane 4L+m of the result is the sum of a[4m+L].  Each
 * sum follows the same tree whatever slot its vector occupies. */
MM_INLINE __m512 mm_reduce16(const __m512 *a)
{
    __m512 b[8], c[4], d[2];
    MM_UNROLL
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee));
    MM_UNROLL
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd));
    MM_UNROLL
    for (int i = 0; i < 2; i++)
        d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xdd));
}

/* acc[t*NR + o] holds y[t][o] in 16 lanes. */
MM_INLINE void mm_store_tile(const __m512 *acc, const int MR, const int NR, float *y, size_t ldy)
{
    if (MR * NR == 1) { /* mm_reduce16's tree for one vector, without the 15 zero ones */
        __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc[0]), _mm512_extractf32x8_ps(acc[0], 1));
        y[0] = kern__hsum4(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
        return;
    }
    __m512 v[16];
    MM_UNROLL
    for (int i = 0; i < 16; i++) v[i] = i < MR * NR ? acc[i] : _mm512_setzero_ps();
    float r[16];
    _mm512_storeu_ps(r, mm_reduce16(v));
    MM_UNROLL
    for (int i = 0; i < MR * NR; i++)
        y[(size_t)(i / NR) * ldy + (size_t)(i % NR)] = r[4 * (i % 4) + i / 4];
}

/* BF16, two ways (kern_get_bf16_dot).  KERN_BF16_FMA: bf16 to f32 is
 * exact and costs one op a vector: a dword's high half is its odd element
 * as an f32 already (masked), its low half the even one (shifted up).
 * Each element's lane then takes two FMAs a step, even then odd.  This is
 * faster than vdpbf16ps on Intel's Golden Cove cores, where one vdpbf16ps
 * (32 products) issues every ~2 cycles and an FMA (16) twice a cycle
 * (bench_mm bf16 512 tokens, one thread: 66-71 -> 83-108 GFLOP/s).
 * KERN_BF16_DPBF16 (below, AVX512-BF16 only): one vdpbf16ps a step, which
 * adds the odd product first.  AMD's Zen 4 issues it as often as an FMA,
 * for twice the products. */
MM_INLINE void mm_bf16_split(__m512i v, __m512 *even, __m512 *odd)
{
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

MM_INLINE void mm_bf16_step(__m512 *acc, const uint8_t *w, size_t wrow, const uint8_t *x,
                            size_t xrow, size_t k, __mmask32 m, const int MR, const int NR)
{
    __m512 xe[4], xo[4];
    MM_UNROLL
    for (int t = 0; t < MR; t++)
        mm_bf16_split(_mm512_load_si512(x + t * xrow + 2 * k), &xe[t], &xo[t]);
    MM_UNROLL
    for (int o = 0; o < NR; o++) {
        __m512 we, wo;
        mm_bf16_split(_mm512_maskz_loadu_epi16(m, w + o * wrow + 2 * k), &we, &wo);
        MM_UNROLL
        for (int t = 0; t < MR; t++) {
            acc[t * NR + o] = _mm512_fmadd_ps(we, xe[t], acc[t * NR + o]);
            acc[t * NR + o] = _mm512_fmadd_ps(wo, xo[t], acc[t * NR + o]);
        }
    }
}

/* A BF16 tile's walk over K with STEP (either way): 32 elements a step,
 * then one masked step. */
#define MM_BF16_TILE(STEP)                                                                         \
    do {                                                                                           \
        __m512 acc[16];                                                                            \
        MM_UNROLL                                                                                  \
        for (int i = 0; i < MR * NR; i++) acc[i] = _mm512_setzero_ps();                            \
        size_t kf = n_in & ~(size_t)31;                                                            \
        for (size_t k = 0; k < kf; k += 32) STEP(acc, w, wrow, x, xrow, k, ~(__mmask32)0, MR, NR); \
        if (kf < n_in)                                                                             \
            STEP(acc, w, wrow, x, xrow, kf, (__mmask32)((1u << (n_in - kf)) - 1), MR, NR);         \
        mm_store_tile(acc, MR, NR, y, ldy);                                                        \
    } while (0)

MM_INLINE void mm_bf16_tile(KERN_MM_TILE_ARGS, const int MR, const int NR)
{
    MM_BF16_TILE(mm_bf16_step);
}

MM_INLINE void mm_f16_step(__m512 *acc, const uint8_t *w, size_t wrow, const uint8_t *x,
                           size_t xrow, size_t k, __mmask16 m, const int MR, const int NR)
{
    __m512 xv[4];
    MM_UNROLL
    for (int t = 0; t < MR; t++) xv[t] = _mm512_load_ps((const float *)(x + t * xrow) + k);
    MM_UNROLL
    for (int o = 0; o < NR; o++) {
        __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + o * wrow + 2 * k));
        MM_UNROLL
        for (int t = 0; t < MR; t++) acc[t * NR + o] = _mm512_fmadd_ps(wv, xv[t], acc[t * NR + o]);
    }
}

MM_INLINE void mm_f16_tile(KERN_MM_TILE_ARGS, const int MR, const int NR)
{
    __m512 acc[16];
    MM_UNROLL
    for (int i = 0; i < MR * NR; i++) acc[i] = _mm512_setzero_ps();
    size_t kf = n_in & ~(size_t)15;
    for (size_t k = 0; k < kf; k += 16) mm_f16_step(acc, w, wrow, x, xrow, k, 0xffff, MR, NR);
    if (kf < n_in)
        mm_f16_step(acc, w, wrow, x, xrow, kf, (__mmask16)((1u << (n_in - kf)) - 1), MR, NR);
    mm_store_tile(acc, MR, NR, y, ldy);
}

MM_INLINE void mm_f32_step(__m512 *acc, const uint8_t *w, size_t wrow, const uint8_t *x,
                           size_t xrow, size_t k, __mmask16 m, const int MR, const int NR)
{
    __m512 xv[4];
    MM_UNROLL
    for (int t = 0; t < MR; t++) xv[t] = _mm512_load_ps((const float *)(x + t * xrow) + k);
    MM_UNROLL
    for (int o = 0; o < NR; o++) {
        __m512 wv = _mm512_maskz_loadu_ps(m, (const float *)(w + o * wrow) + k);
        MM_UNROLL
        for (int t = 0; t < MR; t++) acc[t * NR + o] = _mm512_fmadd_ps(wv, xv[t], acc[t * NR + o]);
    }
}

MM_INLINE void mm_f32_tile(KERN_MM_TILE_ARGS, const int MR, const int NR)
{
    __m512 acc[16];
    MM_UNROLL
    for (int i = 0; i < MR * NR; i++) acc[i] = _mm512_setzero_ps();
    size_t kf = n_in & ~(size_t)15;
    for (size_t k = 0; k < kf; k += 16) mm_f32_step(acc, w, wrow, x, xrow, k, 0xffff, MR, NR);
    if (kf < n_in)
        mm_f32_step(acc, w, wrow, x, xrow, kf, (__mmask16)((1u << (n_in - kf)) - 1), MR, NR);
    mm_store_tile(acc, MR, NR, y, ldy);
}

MM_INLINE uint16_t mm_load_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Q8_0's tiles, for the rows past kern__q8512_matmul's groups of 16: one
 * row against MR tokens with Q8_0's arithmetic (kern_mm_priv.h), a block's
 * exact dot (vpdpbusd, summed across lanes, plus the tail's corr) and one
 * fma, so a row gets the bits it would get in a group. */
MM_INLINE void mm_q8_row(KERN_MM_TILE_ARGS, const int MR)
{
    const size_t tail = kern__q8_tail_off(n_in);
    __m128 acc[KERN_MM_MR_MAX];
    MM_UNROLL
    for (int t = 0; t < MR; t++) acc[t] = _mm_setzero_ps();
    for (size_t b = 0; b < n_in / 32; b++) {
        const uint8_t *wb = w + b * sizeof(dx_block_q8_0);
        __m256i wu = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wb + 2)),
                                      _mm256_set1_epi8((char)0x80));
        float dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(mm_load_u16(wb))));
        MM_UNROLL
        for (int t = 0; t < MR; t++) {
            const uint8_t *xr = x + t * xrow;
            int32_t corr;
            float dx;
            memcpy(&corr, xr + tail + 8 * b, 4);
            memcpy(&dx, xr + tail + 8 * b + 4, 4);
            __m256i is = _mm256_dpbusd_epi32(
                _mm256_setzero_si256(), wu, _mm256_load_si256((const __m256i *)kern__q8_qs(xr, b)));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(is), _mm256_extracti128_si256(is, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            int32_t dot = _mm_cvtsi128_si32(s4) + corr;
            acc[t] = _mm_fmadd_ss(_mm_set_ss((float)dot), _mm_set_ss(dw * dx), acc[t]);
        }
    }
    MM_UNROLL
    for (int t = 0; t < MR; t++) y[t * ldy] = _mm_cvtss_f32(acc[t]);
}

#define MM_DEF_Q8_ROW(MR)                                                                          \
    static void mm_q8_row##MR(KERN_MM_TILE_ARGS)                                                   \
    {                                                                                              \
        mm_q8_row(w, wrow, x, xrow, n_in, y, ldy, MR);                                             \
    }
MM_DEF_Q8_ROW(1)
MM_DEF_Q8_ROW(2)
MM_DEF_Q8_ROW(3)
MM_DEF_Q8_ROW(4)
static const kern_mm_tiles mm_q8_tiles = {
    .by = {[1] = {{mm_q8_row1, 1}},
           [2] = {{mm_q8_row2, 1}},
           [3] = {{mm_q8_row3, 1}},
           [4] = {{mm_q8_row4, 1}}},
};

/* The shapes, by token count MR (1..4): a wide main tile, a 4-row tile and
 * a 1-row tile for the row remainder (at MR 3 and 4 the main tile is 4 rows). */
#define MM_DEF_TILE(KIND, MR, NR)                                                                  \
    static void mm_##KIND##_##MR##x##NR(KERN_MM_TILE_ARGS)                                         \
    {                                                                                              \
        mm_##KIND##_tile(w, wrow, x, xrow, n_in, y, ldy, MR, NR);                                  \
    }
#define MM_DEF_KIND(KIND)                                                                          \
    MM_DEF_TILE(KIND, 1, 16)                                                                       \
    MM_DEF_TILE(KIND, 1, 4)                                                                        \
    MM_DEF_TILE(KIND, 1, 1)                                                                        \
    MM_DEF_TILE(KIND, 2, 8)                                                                        \
    MM_DEF_TILE(KIND, 2, 4)                                                                        \
    MM_DEF_TILE(KIND, 2, 1)                                                                        \
    MM_DEF_TILE(KIND, 3, 4)                                                                        \
    MM_DEF_TILE(KIND, 3, 1)                                                                        \
    MM_DEF_TILE(KIND, 4, 4)                                                                        \
    MM_DEF_TILE(KIND, 4, 1)                                                                        \
    static const kern_mm_tiles mm_##KIND##_tiles = {                                               \
        .by = {[1] = {{mm_##KIND##_1x16, 16}, {mm_##KIND##_1x4, 4}, {mm_##KIND##_1x1, 1}},         \
               [2] = {{mm_##KIND##_2x8, 8}, {mm_##KIND##_2x4, 4}, {mm_##KIND##_2x1, 1}},           \
               [3] = {{mm_##KIND##_3x4, 4}, {mm_##KIND##_3x1, 1}},                                 \
               [4] = {{mm_##KIND##_4x4, 4}, {mm_##KIND##_4x1, 1}}},                                \
    };

MM_DEF_KIND(bf16)
MM_DEF_KIND(f16)
MM_DEF_KIND(f32)

/* KERN_BF16_DPBF16: the same tiles on vdpbf16ps, compiled for AVX512-BF16
 * alone (the rest of the file runs on CPUs without it). */
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512bf16")
#endif
MM_INLINE void mm_bf16dp_step(__m512 *acc, const uint8_t *w, size_t wrow, const uint8_t *x,
                              size_t xrow, size_t k, __mmask32 m, const int MR, const int NR)
{
    __m512bh xv[4];
    MM_UNROLL
    for (int t = 0; t < MR; t++) xv[t] = (__m512bh)_mm512_load_si512(x + t * xrow + 2 * k);
    MM_UNROLL
    for (int o = 0; o < NR; o++) {
        __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + o * wrow + 2 * k);
        MM_UNROLL
        for (int t = 0; t < MR; t++) acc[t * NR + o] = _mm512_dpbf16_ps(acc[t * NR + o], wv, xv[t]);
    }
}

MM_INLINE void mm_bf16dp_tile(KERN_MM_TILE_ARGS, const int MR, const int NR)
{
    MM_BF16_TILE(mm_bf16dp_step);
}

MM_DEF_KIND(bf16dp)
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const kern_mm_tiles *const kern__avx512_bf16dp_tiles = &mm_bf16dp_tiles;

/* ---- the other 32-block formats (the arithmetic of kern_mm_priv.h) ----
 * One zmm holds four output elements of one token: 128-bit chunk r holds
 * the partials p[0..3] of weight row r of a quad (a tile's last rows run as
 * quads of one row repeated, keeping chunk 0).  The rows' 16-byte qs make
 * one vector; its low nibbles are elements 0-15 of each row, its high ones
 * elements 16-31, and two chained vpdpbusd against the token's quants 0-15
 * and 16-31 (broadcast to every chunk) leave in lane g of each chunk the
 * integer sum of group g.  The sums start from the group corrections: -8
 * / -16 times the activations' group sum for Q4_0 / Q5_0 (negcorr
 * shifted), negcorr itself for IQ4_NL, whose codebook is looked up as
 * value + 128 (unsigned), nothing for the _1 formats.  The float steps are
 * then the scalar twin's, lane by lane. */

MM_INLINE uint32_t mm_load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The four rows' 32-bit words at offset off of their blocks. */
MM_INLINE __m128i mm_quad_u32(const uint8_t *const *r, size_t off)
{
    return _mm_setr_epi32((int)mm_load_u32(r[0] + off), (int)mm_load_u32(r[1] + off),
                          (int)mm_load_u32(r[2] + off), (int)mm_load_u32(r[3] + off));
}

/* One block of MR tokens against NR weight rows in quads (NR = 1: one row
 * repeated).  qb[q] points at the block in quad q's first row (its rows
 * wrow apart, w3 = 3 * wrow); xb at the block in token 0's activations
 * (tokens xrow apart), so every address is a register plus a scaled one. */
MM_INLINE void mm_blk_step(__m512 *acc, const uint8_t *const *qb, size_t wrow, size_t w3,
                           const uint8_t *xb, size_t xrow, const int T, const int MR, const int NR)
{
    const int NQ = NR == 1 ? 1 : NR / 4;
    __m512i xlo[4], xhi[4], corr[4];
    __m512 dx[4], sd[4];
    MM_UNROLL
    for (int t = 0; t < MR; t++) {
        const uint8_t *xr = xb + t * xrow; /* quants, then negcorr at +64, scales at +128 */
        xlo[t] = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)xr));
        xhi[t] = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)(xr + 16)));
        dx[t] = _mm512_set1_ps(*(const float *)(xr + 128));
        __m512i ng =
            _mm512_broadcast_i32x4(_mm_add_epi32(_mm_load_si128((const __m128i *)(xr + 64)),
                                                 _mm_load_si128((const __m128i *)(xr + 80))));
        corr[t] = T == DX_Q4_0     ? _mm512_srai_epi32(ng, 4)
                  : T == DX_Q5_0   ? _mm512_srai_epi32(ng, 3)
                  : T == DX_IQ4_NL ? ng
                                   : _mm512_setzero_si512();
        if (kern__blk_has_m(T))
            sd[t] = _mm512_mul_ps(dx[t], _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                             _mm512_setzero_si512(), _mm512_srai_epi32(ng, 7))));
    }
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i idx_d = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    const __m512i idx_m = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
    static const uint8_t nl_u8[16] = {1,   24,  45,  63,  79,  93,  106, 118,
                                      129, 141, 153, 166, 181, 197, 217, 241}; /* values + 128 */
    const __m512i nl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)nl_u8));
    MM_UNROLL
    for (int q = 0; q < NQ; q++) {
        const uint8_t *r[4] = {qb[q], qb[q], qb[q], qb[q]};
        if (NR != 1) r[1] = qb[q] + wrow, r[2] = qb[q] + 2 * wrow, r[3] = qb[q] + w3;
        const size_t qs = kern__blk_qs(T);
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(r[0] + qs)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(r[1] + qs)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(r[2] + qs)), 2);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(r[3] + qs)), 3);
        __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if (kern__blk_5bit(T)) {
            /* qh's low halves are bit 4 of each row's elements 0-15 (lo's
             * bytes), the high halves of elements 16-31 (hi's) */
            __m128i h =
                _mm_shuffle_epi8(mm_quad_u32(r, qs - 4), _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2,
                                                                       3, 6, 7, 10, 11, 14, 15));
            const __m512i sixteen = _mm512_set1_epi8(16);
            lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(h)), lo,
                                      sixteen);
            hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64((uint64_t)_mm_extract_epi64(h, 1)), hi,
                                      sixteen);
        }
        if (T == DX_IQ4_NL) {
            lo = _mm512_shuffle_epi8(nl, lo);
            hi = _mm512_shuffle_epi8(nl, hi);
        }
        /* each block starts with d (and m for the _1 formats): [d0 m0 d1 m1 ...] */
        __m512 dm = _mm512_castps256_ps512(_mm256_cvtph_ps(mm_quad_u32(r, 0)));
        __m512 dw = _mm512_permutexvar_ps(idx_d, dm), mw = _mm512_setzero_ps();
        if (kern__blk_has_m(T)) mw = _mm512_permutexvar_ps(idx_m, dm);
        MM_UNROLL
        for (int t = 0; t < MR; t++) {
            __m512i is = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr[t], lo, xlo[t]), hi, xhi[t]);
            __m512 *a = &acc[t * NQ + q];
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, dx[t]), *a);
            if (kern__blk_has_m(T)) *a = _mm512_fmadd_ps(sd[t], mw, *a);
        }
    }
}

/* Each 128-bit chunk of 4 vectors summed by the twin's tree ((p0 + p2) +
 * (p1 + p3)): lane 4k + m of the result is chunk k of a[m]. */
MM_INLINE __m512 mm_reduce_chunks4(const __m512 *a)
{
    __m512 c0 =
        _mm512_add_ps(_mm512_shuffle_ps(a[0], a[1], 0x44), _mm512_shuffle_ps(a[0], a[1], 0xee));
    __m512 c1 =
        _mm512_add_ps(_mm512_shuffle_ps(a[2], a[3], 0x44), _mm512_shuffle_ps(a[2], a[3], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(c0, c1, 0x88), _mm512_shuffle_ps(c0, c1, 0xdd));
}

/* acc[t*NQ + q] holds y[t][4q + k] in chunk k. */
MM_INLINE void mm_blk_store(const __m512 *acc, const int MR, const int NR, float *y, size_t ldy)
{
    const int NQ = NR == 1 ? 1 : NR / 4, NK = NR == 1 ? 1 : 4;
    MM_UNROLL
    for (int base = 0; base < MR * NQ; base += 4) {
        __m512 v[4];
        MM_UNROLL
        for (int i = 0; i < 4; i++) v[i] = base + i < MR * NQ ? acc[base + i] : _mm512_setzero_ps();
        float r[16];
        _mm512_storeu_ps(r, mm_reduce_chunks4(v));
        MM_UNROLL
        for (int i = 0; i < 4; i++) {
            if (base + i >= MR * NQ) break;
            int t = (base + i) / NQ, q = (base + i) % NQ;
            MM_UNROLL
            for (int k = 0; k < NK; k++) y[(size_t)t * ldy + (size_t)(4 * q + k)] = r[4 * k + i];
        }
    }
}

MM_INLINE void mm_blk_tile(KERN_MM_TILE_ARGS, const int T, const int MR, const int NR)
{
    const int NQ = NR == 1 ? 1 : NR / 4;
    const size_t bb = kern__blk_bytes(T), w3 = 3 * wrow, nb = n_in / 32;
    __m512 acc[16];
    MM_UNROLL
    for (int i = 0; i < MR * NQ; i++) acc[i] = _mm512_setzero_ps();
    const uint8_t *qb[4];
    MM_UNROLL
    for (int q = 0; q < NQ; q++) qb[q] = w + (size_t)(4 * q) * wrow;
    /* decode: the whole next tile, a slice a step (kern_mm_x86.h) */
    kern__pf pf = kern__pf_next_tile(w, wrow, NR, nb / 2);
    /* blocks in pairs, as the activations hold them (the second at +32) */
    for (size_t p = 0; p < nb / 2; p++, x += KERN__Q8_PAIR_BYTES) {
        if (MR == 1) kern__pf_step(&pf, NR);
        for (int h = 0; h < 2; h++) {
            mm_blk_step(acc, qb, wrow, w3, x + 32 * h, xrow, T, MR, NR);
            MM_UNROLL
            for (int q = 0; q < NQ; q++) qb[q] += bb;
        }
    }
    if (nb & 1) mm_blk_step(acc, qb, wrow, w3, x, xrow, T, MR, NR);
    mm_blk_store(acc, MR, NR, y, ldy);
}

/* Shapes by token count: a wide tile (16 rows for decode), a quad of rows
 * and a single row for the remainder. */
#define MM_DEF_BLK_TILE(KIND, T, MR, NR)                                                           \
    static void mm_##KIND##_##MR##x##NR(KERN_MM_TILE_ARGS)                                         \
    {                                                                                              \
        mm_blk_tile(w, wrow, x, xrow, n_in, y, ldy, T, MR, NR);                                    \
    }
#define MM_DEF_BLK(KIND, T)                                                                        \
    MM_DEF_BLK_TILE(KIND, T, 1, 16)                                                                \
    MM_DEF_BLK_TILE(KIND, T, 1, 4)                                                                 \
    MM_DEF_BLK_TILE(KIND, T, 1, 1)                                                                 \
    MM_DEF_BLK_TILE(KIND, T, 2, 16)                                                                \
    MM_DEF_BLK_TILE(KIND, T, 2, 4)                                                                 \
    MM_DEF_BLK_TILE(KIND, T, 2, 1)                                                                 \
    MM_DEF_BLK_TILE(KIND, T, 3, 16)                                                                \
    MM_DEF_BLK_TILE(KIND, T, 3, 4)                                                                 \
    MM_DEF_BLK_TILE(KIND, T, 3, 1)                                                                 \
    MM_DEF_BLK_TILE(KIND, T, 4, 16)                                                                \
    MM_DEF_BLK_TILE(KIND, T, 4, 4)                                                                 \
    MM_DEF_BLK_TILE(KIND, T, 4, 1)                                                                 \
    static const kern_mm_tiles mm_##KIND##_tiles = {                                               \
        .by = {[1] = {{mm_##KIND##_1x16, 16}, {mm_##KIND##_1x4, 4}, {mm_##KIND##_1x1, 1}},         \
               [2] = {{mm_##KIND##_2x16, 16}, {mm_##KIND##_2x4, 4}, {mm_##KIND##_2x1, 1}},         \
               [3] = {{mm_##KIND##_3x16, 16}, {mm_##KIND##_3x4, 4}, {mm_##KIND##_3x1, 1}},         \
               [4] = {{mm_##KIND##_4x16, 16}, {mm_##KIND##_4x4, 4}, {mm_##KIND##_4x1, 1}}},        \
    };

MM_DEF_BLK(q4_0, DX_Q4_0)
MM_DEF_BLK(q4_1, DX_Q4_1)
MM_DEF_BLK(q5_0, DX_Q5_0)
MM_DEF_BLK(q5_1, DX_Q5_1)
MM_DEF_BLK(iq4_nl, DX_IQ4_NL)

/* ---- activation preps: bit-identical to the scalar conversions ---- */

/* f32 -> bf16 with dx_f32_to_bf16's integer RNE, so denormals round exactly
 * as the scalar twin does (vcvtneps2bf16 would flush them). */
static __m256i mm_f32_to_bf16_16(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

static void mm_bf16_prep_row(const float *x, size_t n_in, void *out)
{
    uint16_t *row = out;
    size_t k = 0, kp = kern__act_k(n_in);
    for (; k + 16 <= n_in; k += 16)
        _mm256_store_si256((__m256i *)(row + k), mm_f32_to_bf16_16(_mm512_loadu_ps(x + k)));
    for (; k < kp; k += 16) {
        size_t left = n_in > k ? n_in - k : 0;
        __mmask16 m = (__mmask16)((1u << left) - 1);
        _mm256_store_si256((__m256i *)(row + k),
                           mm_f32_to_bf16_16(_mm512_maskz_loadu_ps(m, x + k)));
    }
}

/* One 32-block: quantise as dx_f32_to_q8_0_row does (d = amax/127, q =
 * round-to-nearest-even of x * (1/d) under the default rounding mode). */
static void mm_q8_block(const float *x, int8_t *q, int32_t *negcorr, float *dout)
{
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    __m512 m = _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b));
    float amax = _mm512_reduce_max_ps(m);
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512 vid = _mm512_set1_ps(id);
    __m128i qa = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, vid)));
    __m128i qb = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(b, vid)));
    __m256i qv = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), qb, 1);
    _mm256_storeu_si256((__m256i *)q, qv);
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), qv);
    _mm256_storeu_si256((__m256i *)negcorr,
                        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s, 7)));
    _mm256_storeu_ps(dout, _mm256_set1_ps(dx_f16_to_f32(dx_f32_to_f16(d))));
}

static void mm_q8_prep_row(const float *x, size_t n_in, void *out)
{
    uint8_t *row = out;
    for (size_t b = 0; b < n_in / DX_QK8_0; b++) {
        uint8_t *pair = row + (b / 2) * KERN__Q8_PAIR_BYTES;
        size_t h = b % 2;
        mm_q8_block(x + b * DX_QK8_0, (int8_t *)pair + 32 * h, (int32_t *)(pair + 64) + 8 * h,
                    (float *)(pair + 128) + 8 * h);
    }
    kern__q8_clear_odd(row, n_in);
}

const kern_mm_isa kern_mm_isa_avx512 = {
    .mr = 4,
    .block_rows = 16,
    .tiles = {[DX_F32] = &mm_f32_tiles,
              [DX_F16] = &mm_f16_tiles,
              [DX_BF16] = &mm_bf16_tiles,
              [DX_Q8_0] = &mm_q8_tiles,
              [DX_Q4_0] = &mm_q4_0_tiles,
              [DX_Q4_1] = &mm_q4_1_tiles,
              [DX_Q5_0] = &mm_q5_0_tiles,
              [DX_Q5_1] = &mm_q5_1_tiles,
              [DX_IQ4_NL] = &mm_iq4_nl_tiles,
              KERN__AVX2_KQ_TILES},
    .decode = {[DX_Q2_K] = &kern__avx512_q2_k_decode,
               [DX_Q3_K] = &kern__avx512_q3_k_decode,
               [DX_Q4_K] = &kern__avx512_q4_k_decode,
               [DX_Q5_K] = &kern__avx512_q5_k_decode,
               [DX_Q6_K] = &kern__avx512_q6_k_decode,
               [DX_IQ4_XS] = &kern__avx512_iq4_xs_decode},
    .prep = {[KERN_ACT_BF16] = mm_bf16_prep_row,
             [KERN_ACT_Q8] = mm_q8_prep_row,
             [KERN_ACT_Q8K] = kern__avx2_q8k_prep},
};
