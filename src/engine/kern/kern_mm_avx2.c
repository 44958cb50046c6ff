/* kern_mm_avx2: AVX2+FMA matmul tiles for CPUs without AVX-512 (BF16 widened
 * by shifting into f32, F16 via vcvtph2ps, F32, Q8_0, the other 32-block
 * formats and the super-block formats via vpmaddubsw/vpmaddwd) and the
 * Q8_0 activation prep, for the driver in kern_mm.c (kern_mm_isa_avx2).
 *
 * Same batch-invariance construction as the AVX-512 path: one ymm
 * accumulator per output element, a fixed K order (full vectors, then the
 * K remainder copied into a zero-padded buffer and run through the same
 * step), and one fixed reduction tree (lane i + lane i+4, then +2, +1).
 * Tiles (MR tokens x NR rows, MR*NR <= 8) only choose how many elements run
 * side by side. */
#include <immintrin.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "engine/kern/kern_mm_priv.h"

#define MM2_INLINE static inline __attribute__((always_inline))
#define MM2_UNROLL _Pragma("GCC unroll 16")

/* Sums of 8 vectors: lane 4L+m of the result is the sum of a[2m+L]. */
MM2_INLINE __m256 mm2_reduce8(const __m256 *a)
{
    __m256 b[4], c[2];
    MM2_UNROLL
    for (int i = 0; i < 4; i++)
        b[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    MM2_UNROLL
    for (int i = 0; i < 2; i++)
        c[i] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0xee));
    return _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xdd));
}

MM2_INLINE void mm2_store_tile(const __m256 *acc, const int MR, const int NR, float *y, size_t ldy)
{
    __m256 v[8];
    MM2_UNROLL
    for (int i = 0; i < 8; i++) v[i] = i < MR * NR ? acc[i] : _mm256_setzero_ps();
    float r[8];
    _mm256_storeu_ps(r, mm2_reduce8(v));
    MM2_UNROLL
    for (int i = 0; i < MR * NR; i++)
        y[(size_t)(i / NR) * ldy + (size_t)(i % NR)] = r[4 * (i % 2) + i / 2];
}

/* Weight rows of the K remainder, zero-padded: w + o*wrow + wk, `bytes` each. */
MM2_INLINE void mm2_tail_copy(uint8_t *buf, const uint8_t *w, size_t wrow, size_t wk, size_t bytes,
                              const int NR)
{
    memset(buf, 0, (size_t)NR * 64);
    for (int o = 0; o < NR; o++) memcpy(buf + o * 64, w + o * wrow + wk, bytes);
}

/* bf16 widened to f32 by interleaving with zeros: lo holds elements 0-3 and
 * 8-11, hi 4-7 and 12-15; weights and activations are permuted alike. */
MM2_INLINE void mm2_bf16_step(__m256 *acc, const uint8_t *w, size_t wrow, const uint8_t *x,
                              size_t xrow, const int MR, const int NR)
{
    __m256 xl[4], xh[4];
    const __m256i z = _mm256_setzero_si256();
    MM2_UNROLL
    for (int t = 0; t < MR; t++) {
        __m256i v = _mm256_load_si256((const __m256i *)(x + t * xrow));
        xl[t] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
        xh[t] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
    }
    MM2_UNROLL
    for (int o = 0; o < NR; o++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + o * wrow));
        __m256 wl = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
        __m256 wh = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
        MM2_UNROLL
        for (int t = 0; t < MR; t++) {
            acc[t * NR + o] = _mm256_fmadd_ps(wl, xl[t], acc[t * NR + o]);
            acc[t * NR + o] = _mm256_fmadd_ps(wh, xh[t], acc[t * NR + o]);
        }
    }
}

MM2_INLINE void mm2_bf16_tile(KERN_MM_TILE_ARGS, const int MR, const int NR)
{
    __m256 acc[8];
    MM2_UNROLL
    for (int i = 0; i < MR * NR; i++) acc[i] = _mm256_setzero_ps();
    size_t kf = n_in & ~(size_t)15;
    for (size_t k = 0; k < kf; k += 16)
        mm2_bf16_step(acc, w + 2 * k, wrow, x + 2 * k, xrow, MR, NR);
    if (kf < n_in) {
        _Alignas(32) uint8_t buf[8 * 64];
        mm2_tail_copy(buf, w, wrow, 2 * kf, 2 * (n_in - kf), NR);
        mm2_bf16_step(acc, buf, 64, x + 2 * kf, xrow, MR, NR);
    }
    mm2_store_tile(acc, MR, NR, y, ldy);
}

/* F16 and F32 weights against f32 activations, 8 elements per step. */
MM2_INLINE void mm2_f16_step(__m256 *acc, const uint8_t *w, size_t wrow, const uint8_t *x,
                             size_t xrow, const int is_f32, const int MR, const int NR)
{
    __m256 xv[4];
    MM2_UNROLL
    for (int t = 0; t < MR; t++) xv[t] = _mm256_loadu_ps((const float *)(x + t * xrow));
    MM2_UNROLL
    for (int o = 0; o < NR; o++) {
        __m256 wv = is_f32 ? _mm256_loadu_ps((const float *)(w + o * wrow))
                           : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + o * wrow)));
        MM2_UNROLL
        for (int t = 0; t < MR; t++) acc[t * NR + o] = _mm256_fmadd_ps(wv, xv[t], acc[t * NR + o]);
    }
}

MM2_INLINE void mm2_fx_tile(KERN_MM_TILE_ARGS, const int is_f32, const int MR, const int NR)
{
    __m256 acc[8];
    MM2_UNROLL
    for (int i = 0; i < MR * NR; i++) acc[i] = _mm256_setzero_ps();
    size_t es = is_f32 ? 4 : 2, kf = n_in & ~(size_t)7;
    for (size_t k = 0; k < kf; k += 8)
        mm2_f16_step(acc, w + es * k, wrow, x + 4 * k, xrow, is_f32, MR, NR);
    if (kf < n_in) {
        _Alignas(32) uint8_t buf[8 * 64];
        mm2_tail_copy(buf, w, wrow, es * kf, es * (n_in - kf), NR);
        mm2_f16_step(acc, buf, 64, x + 4 * kf, xrow, is_f32, MR, NR);
    }
    mm2_store_tile(acc, MR, NR, y, ldy);
}

MM2_INLINE void mm2_f16_tile(KERN_MM_TILE_ARGS, const int MR, const int NR)
{
    mm2_fx_tile(w, wrow, x, xrow, n_in, y, ldy, 0, MR, NR);
}
MM2_INLINE void mm2_f32_tile(KERN_MM_TILE_ARGS, const int MR, const int NR)
{
    mm2_fx_tile(w, wrow, x, xrow, n_in, y, ldy, 1, MR, NR);
}

/* One Q8_0 block b: |w| times sign(w)*x with vpmaddubsw (no saturation:
 * 2*128*127 < 32768), widened with vpmaddwd, scaled by d_w*d_x. */
MM2_INLINE void mm2_q8_step(__m256 *acc, const uint8_t *w, size_t wrow, const uint8_t *x,
                            size_t xrow, size_t b, const int MR, const int NR)
{
    __m256i xq[4];
    __m256 dx[4];
    size_t xo = (b / 2) * KERN__Q8_PAIR_BYTES + (b % 2) * 32;
    MM2_UNROLL
    for (int t = 0; t < MR; t++) {
        xq[t] = _mm256_load_si256((const __m256i *)(x + t * xrow + xo));
        dx[t] = _mm256_load_ps((const float *)(x + t * xrow + xo + 128));
    }
    const __m256i ones = _mm256_set1_epi16(1);
    MM2_UNROLL
    for (int o = 0; o < NR; o++) {
        const uint8_t *wb = w + o * wrow + b * sizeof(dx_block_q8_0);
        __m256i wq = _mm256_loadu_si256((const __m256i *)(wb + 2));
        __m256i aw = _mm256_sign_epi8(wq, wq);
        uint16_t dh;
        memcpy(&dh, wb, 2);
        __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16((short)dh));
        MM2_UNROLL
        for (int t = 0; t < MR; t++) {
            __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq[t], wq));
            __m256i p32 = _mm256_madd_epi16(p16, ones);
            acc[t * NR + o] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_mul_ps(dw, dx[t]), acc[t * NR + o]);
        }
    }
}

MM2_INLINE void mm2_q8_tile(KERN_MM_TILE_ARGS, const int MR, const int NR)
{
    __m256 acc[8];
    MM2_UNROLL
    for (int i = 0; i < MR * NR; i++) acc[i] = _mm256_setzero_ps();
    for (size_t b = 0; b < n_in / DX_QK8_0; b++) mm2_q8_step(acc, w, wrow, x, xrow, b, MR, NR);
    mm2_store_tile(acc, MR, NR, y, ldy);
}

/* ---- the other 32-block formats (the arithmetic of kern_mm_priv.h) ----
 * One ymm holds two output elements of one token: lanes 0-3 the partials
 * p[0..3] of weight row A, lanes 4-7 those of row B (a tile's last odd row
 * runs as A = B and keeps half 0).  The 16-byte qs of A and B make one
 * vector [A | B]; its low nibbles are elements 0-15 of each row, its high
 * ones elements 16-31, multiplied (vpmaddubsw, unsigned fields times signed
 * activations) by the token's quants 0-15 and 16-31 broadcast to both
 * halves; the two products added (no overflow: 2 * 2 * 31 * 127 < 32768)
 * and widened by vpmaddwd give lane g the integer sum of group g.  The
 * offset of Q4_0 / Q5_0 is added back from the activations' group sums
 * (negcorr, shifted); IQ4_NL's signed codebook values take the sign trick
 * and are widened before they are added (|w| <= 127).  The float steps are
 * then the scalar twin's, lane by lane. */

MM2_INLINE uint32_t mm2_load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Byte i = 16 where bit i of h is set, else 0. */
MM2_INLINE __m256i mm2_bits_to_16(uint32_t h)
{
    const __m256i spread =
        _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(16));
}

/* [v_A x 4 | v_B x 4] from two f16 values in memory. */
MM2_INLINE __m256 mm2_f16_pair(const uint8_t *a, const uint8_t *b)
{
    uint16_t ha, hb;
    memcpy(&ha, a, 2);
    memcpy(&hb, b, 2);
    return _mm256_cvtph_ps(
        _mm_unpacklo_epi64(_mm_set1_epi16((short)ha), _mm_set1_epi16((short)hb)));
}

/* One block of MR tokens against NR weight rows in pairs (NR = 1: one row
 * as both halves).  pb[p] points at the block in pair p's first row (the
 * second wrow further); xb at the block in token 0's activations (tokens
 * xrow apart). */
MM2_INLINE void mm2_blk_step(__m256 *acc, const uint8_t *const *pb, size_t wrow, const uint8_t *xb,
                             size_t xrow, const int T, const int MR, const int NR)
{
    const int NP = NR == 1 ? 1 : NR / 2;
    __m256i xlo[2], xhi[2], corr[2];
    __m256 dx[2], sd[2];
    MM2_UNROLL
    for (int t = 0; t < MR; t++) {
        const uint8_t *xr = xb + t * xrow; /* quants, then negcorr at +64, scales at +128 */
        const int8_t *xq = (const int8_t *)xr;
        const int32_t *nc = (const int32_t *)(xr + 64);
        xlo[t] = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)xq));
        xhi[t] = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(xq + 16)));
        dx[t] = _mm256_broadcast_ss((const float *)(xr + 128));
        /* -128 times each group's sum; -8 and -16 times it are exact shifts */
        __m256i ng = _mm256_broadcastsi128_si256(_mm_add_epi32(
            _mm_load_si128((const __m128i *)nc), _mm_load_si128((const __m128i *)(nc + 4))));
        corr[t] = T == DX_Q4_0 ? _mm256_srai_epi32(ng, 4) : _mm256_srai_epi32(ng, 3);
        if (kern__blk_has_m(T))
            sd[t] = _mm256_mul_ps(dx[t], _mm256_cvtepi32_ps(_mm256_sub_epi32(
                                             _mm256_setzero_si256(), _mm256_srai_epi32(ng, 7))));
    }
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
    const __m256i nl =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)dx_iq4nl_values));
    MM2_UNROLL
    for (int p = 0; p < NP; p++) {
        const uint8_t *ba = pb[p], *bb = NR == 1 ? ba : ba + wrow;
        __m256i v = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(ba + kern__blk_qs(T)))),
            _mm_loadu_si128((const __m128i *)(bb + kern__blk_qs(T))), 1);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (kern__blk_5bit(T)) {
            uint32_t ha = mm2_load_u32(ba + kern__blk_qs(T) - 4),
                     hb = mm2_load_u32(bb + kern__blk_qs(T) - 4);
            lo = _mm256_or_si256(lo, mm2_bits_to_16((ha & 0xffffu) | hb << 16));
            hi = _mm256_or_si256(hi, mm2_bits_to_16(ha >> 16 | (hb & 0xffff0000u)));
        }
        __m256i alo = lo, ahi = hi;
        if (T == DX_IQ4_NL) {
            lo = _mm256_shuffle_epi8(nl, lo);
            hi = _mm256_shuffle_epi8(nl, hi);
            alo = _mm256_sign_epi8(lo, lo);
            ahi = _mm256_sign_epi8(hi, hi);
        }
        __m256 dw = mm2_f16_pair(ba, bb), mw = _mm256_setzero_ps();
        if (kern__blk_has_m(T)) mw = mm2_f16_pair(ba + 2, bb + 2);
        MM2_UNROLL
        for (int t = 0; t < MR; t++) {
            __m256i is;
            if (T == DX_IQ4_NL) {
                is = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_maddubs_epi16(alo, _mm256_sign_epi8(xlo[t], lo)),
                                      ones),
                    _mm256_madd_epi16(_mm256_maddubs_epi16(ahi, _mm256_sign_epi8(xhi[t], hi)),
                                      ones));
            } else {
                is = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo[t]),
                                                        _mm256_maddubs_epi16(hi, xhi[t])),
                                       ones);
                if (T == DX_Q4_0 || T == DX_Q5_0) is = _mm256_add_epi32(is, corr[t]);
            }
            __m256 *a = &acc[t * NP + p];
            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, dx[t]), *a);
            if (kern__blk_has_m(T)) *a = _mm256_fmadd_ps(sd[t], mw, *a);
        }
    }
}

/* Each 128-bit half of 4 vectors summed by the twin's tree ((p0 + p2) +
 * (p1 + p3)): lane 4k + m of the result is half k of a[m]. */
MM2_INLINE __m256 mm2_reduce_halves4(const __m256 *a)
{
    __m256 c0 =
        _mm256_add_ps(_mm256_shuffle_ps(a[0], a[1], 0x44), _mm256_shuffle_ps(a[0], a[1], 0xee));
    __m256 c1 =
        _mm256_add_ps(_mm256_shuffle_ps(a[2], a[3], 0x44), _mm256_shuffle_ps(a[2], a[3], 0xee));
    return _mm256_add_ps(_mm256_shuffle_ps(c0, c1, 0x88), _mm256_shuffle_ps(c0, c1, 0xdd));
}

/* acc[t*NP + p] holds y[t][2p] (half 0) and y[t][2p+1] (half 1). */
MM2_INLINE void mm2_blk_store(const __m256 *acc, const int MR, const int NR, float *y, size_t ldy)
{
    const int NP = NR == 1 ? 1 : NR / 2, NH = NR == 1 ? 1 : 2;
    MM2_UNROLL
    for (int base = 0; base < MR * NP; base += 4) {
        __m256 v[4];
        MM2_UNROLL
        for (int i = 0; i < 4; i++) v[i] = base + i < MR * NP ? acc[base + i] : _mm256_setzero_ps();
        float r[8];
        _mm256_storeu_ps(r, mm2_reduce_halves4(v));
        MM2_UNROLL
        for (int i = 0; i < 4; i++) {
            if (base + i >= MR * NP) break;
            int t = (base + i) / NP, p = (base + i) % NP;
            MM2_UNROLL
            for (int h = 0; h < NH; h++) y[(size_t)t * ldy + (size_t)(2 * p + h)] = r[4 * h + i];
        }
    }
}

MM2_INLINE void mm2_blk_tile(KERN_MM_TILE_ARGS, const int T, const int MR, const int NR)
{
    const int NP = NR == 1 ? 1 : NR / 2;
    const size_t bb = kern__blk_bytes(T), nb = n_in / 32;
    __m256 acc[8];
    MM2_UNROLL
    for (int i = 0; i < MR * NP; i++) acc[i] = _mm256_setzero_ps();
    const uint8_t *pb[4];
    MM2_UNROLL
    for (int p = 0; p < NP; p++) pb[p] = w + (size_t)(2 * p) * wrow;
    /* decode reads each row once, in short streams: fetch the next tile's
     * first lines now and each row 256 bytes ahead (as the AVX-512 tiles) */
    const int pf = MR == 1 && NR == 8;
    if (pf)
        for (int r = NR; r < 2 * NR; r++)
            for (int l = 0; l < 2; l++)
                _mm_prefetch((const char *)w + (size_t)r * wrow + 64 * l, _MM_HINT_T0);
    /* blocks in pairs, as the activations hold them (the second at +32) */
    for (size_t q = 0; q < nb / 2; q++, x += KERN__Q8_PAIR_BYTES) {
        if (pf) {
            MM2_UNROLL
            for (int p = 0; p < NP; p++) {
                _mm_prefetch((const char *)pb[p] + 256, _MM_HINT_T0);
                _mm_prefetch((const char *)pb[p] + wrow + 256, _MM_HINT_T0);
            }
        }
        for (int h = 0; h < 2; h++) {
            mm2_blk_step(acc, pb, wrow, x + 32 * h, xrow, T, MR, NR);
            MM2_UNROLL
            for (int p = 0; p < NP; p++) pb[p] += bb;
        }
    }
    if (nb & 1) mm2_blk_step(acc, pb, wrow, x, xrow, T, MR, NR);
    mm2_blk_store(acc, MR, NR, y, ldy);
}

/* Shapes by token count: a wide tile, a row pair and a single row. */
#define MM2_DEF_BLK_TILE(KIND, T, MR, NR)                                                          \
    static void mm2_##KIND##_##MR##x##NR(KERN_MM_TILE_ARGS)                                        \
    {                                                                                              \
        mm2_blk_tile(w, wrow, x, xrow, n_in, y, ldy, T, MR, NR);                                   \
    }
#define MM2_DEF_BLK(KIND, T)                                                                       \
    MM2_DEF_BLK_TILE(KIND, T, 1, 8)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 1, 2)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 1, 1)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 2, 4)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 2, 2)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 2, 1)                                                                \
    static const kern_mm_tiles mm2_##KIND##_tiles = {                                              \
        .by = {[1] = {{mm2_##KIND##_1x8, 8}, {mm2_##KIND##_1x2, 2}, {mm2_##KIND##_1x1, 1}},        \
               [2] = {{mm2_##KIND##_2x4, 4}, {mm2_##KIND##_2x2, 2}, {mm2_##KIND##_2x1, 1}}},       \
    };

MM2_DEF_BLK(q4_0, DX_Q4_0)
MM2_DEF_BLK(q4_1, DX_Q4_1)
MM2_DEF_BLK(q5_0, DX_Q5_0)
MM2_DEF_BLK(q5_1, DX_Q5_1)
MM2_DEF_BLK(iq4_nl, DX_IQ4_NL)

/* ---- the super-block formats (the second arithmetic of kern_mm_priv.h) ----
 * Two ymm per output element: lane g of the first holds p[g] (the even
 * blocks' group g), of the second p[8 + g] (the odd blocks'); the tile adds
 * them (p[i] + p[i+8], the tree's first step) and mm2_reduce8 does the
 * rest (+4, +2, +1).  A block's 32 weights unpacked into element order
 * times its quants (vpmaddubsw: unsigned weights of at most 63 times
 * signed quants, 2 * 63 * 127 < 32768, no saturation), widened by
 * vpmaddwd, leave group g's integer sum in lane g; the offset of a weight
 * stored unsigned (Q3_K, Q6_K) is added back from negcorr, and IQ4_XS's
 * signed codebook values take the sign trick (|w| <= 127).  As on
 * AVX-512, the tokens' corrections and d_x * s are made once per
 * super-block for all the tile's rows, and each row's scales decoded once
 * per super-block into its factors S * d_x (and M) by sub-block, stored
 * for the blocks to broadcast (32-element sub-blocks: vbroadcastss is a
 * load) or permute (16: two values a block); the rows are then walked
 * block by block across the tile, so that consecutive FMAs feed different
 * accumulators (measured ~25% faster than row by row, whose one chain of
 * FMAs an element bounds it). */

/* The tokens' side of one super-block, block j, token t. */
typedef struct {
    __m256i corr[8][2]; /* Q3_K, Q6_K: -4 s, -32 s */
    __m256 dxs[8][2];   /* the formats with a minimum: d_x * s */
    __m256 dx[2][2];    /* d_x by sub-block: of blocks 0-7, or of sub-blocks 0-7, 8-15 (16) */
} mm2_kq_act;

/* Block j of a super-block's activations, token 0: quants, negcorr at +64,
 * scales at +128. */
MM2_INLINE const uint8_t *mm2_kq_xb(const uint8_t *xs, const int j)
{
    return xs + (j / 2) * KERN__Q8_PAIR_BYTES + (j % 2) * 32;
}

MM2_INLINE float mm2_kq_dx(const uint8_t *xs, const int j)
{
    return *(const float *)(mm2_kq_xb(xs, j) + 128);
}

MM2_INLINE void mm2_kq_prep(mm2_kq_act *a, const uint8_t *xs, size_t xrow, const int T,
                            const int MR)
{
    const int sh = kern__kq_corr_shift(T);
    MM2_UNROLL
    for (int t = 0; t < MR; t++) {
        const uint8_t *xt = xs + t * xrow;
        __m256 d8 =
            _mm256_setr_ps(mm2_kq_dx(xt, 0), mm2_kq_dx(xt, 1), mm2_kq_dx(xt, 2), mm2_kq_dx(xt, 3),
                           mm2_kq_dx(xt, 4), mm2_kq_dx(xt, 5), mm2_kq_dx(xt, 6), mm2_kq_dx(xt, 7));
        if (kern__kq_sub16(T)) { /* sub-block s lies in block s / 2 */
            a->dx[t][0] = _mm256_permutevar8x32_ps(d8, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
            a->dx[t][1] = _mm256_permutevar8x32_ps(d8, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
        } else {
            a->dx[t][0] = d8;
        }
        MM2_UNROLL
        for (int j = 0; j < 8; j++) {
            const uint8_t *xb = mm2_kq_xb(xt, j);
            __m256i nc = _mm256_load_si256((const __m256i *)(xb + 64));
            a->corr[j][t] = sh > 0 ? _mm256_srai_epi32(nc, sh) : _mm256_setzero_si256();
            if (kern__kq_has_min(T)) {
                __m256i sum = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_srai_epi32(nc, 7));
                a->dxs[j][t] = _mm256_mul_ps(_mm256_load_ps((const float *)(xb + 128)),
                                             _mm256_cvtepi32_ps(sum));
            }
        }
    }
}

MM2_INLINE __m256 mm2_f16_bcast(const uint8_t *b)
{
    uint16_t h;
    memcpy(&h, b, 2);
    return _mm256_cvtph_ps(_mm_set1_epi16((short)h));
}

/* Bytes 0-7 (high: 8-15) of c as f32, unsigned or signed. */
MM2_INLINE __m256 mm2_u8_ps(__m128i c, const int high, const int sign)
{
    if (high) c = _mm_srli_si128(c, 8);
    return _mm256_cvtepi32_ps(sign ? _mm256_cvtepi8_epi32(c) : _mm256_cvtepu8_epi32(c));
}

/* A row's scales for one super-block, by sub-block: sv[0] lanes the S of
 * sub-blocks 0-7, sv[1] of 8-15 (the 16-element formats), mv likewise the
 * M (Q2_K; Q4_K / Q5_K: mv[0]). */
MM2_INLINE void mm2_kq_scales(const uint8_t *b, const int T, __m256 *sv, __m256 *mv)
{
    if (T == DX_Q2_K) {
        __m128i c = _mm_loadu_si128((const __m128i *)b), m4 = _mm_set1_epi8(15);
        __m128i sc = _mm_and_si128(c, m4), mn = _mm_and_si128(_mm_srli_epi16(c, 4), m4);
        __m256 d = mm2_f16_bcast(b + offsetof(dx_block_q2_k, d));
        __m256 dm = mm2_f16_bcast(b + offsetof(dx_block_q2_k, dmin));
        for (int i = 0; i < 2; i++) {
            sv[i] = _mm256_mul_ps(mm2_u8_ps(sc, i, 0), d);
            mv[i] = _mm256_mul_ps(mm2_u8_ps(mn, i, 0), dm);
        }
    } else if (T == DX_Q3_K) {
        __m128i c = _mm_sub_epi8(kern__q3k_scales_v(b), _mm_set1_epi8(32));
        __m256 d = mm2_f16_bcast(b + offsetof(dx_block_q3_k, d));
        for (int i = 0; i < 2; i++) sv[i] = _mm256_mul_ps(mm2_u8_ps(c, i, 1), d);
    } else if (T == DX_Q4_K || T == DX_Q5_K) {
        __m128i c = kern__k4_scales_v(b);
        sv[0] = _mm256_mul_ps(mm2_u8_ps(c, 0, 0), mm2_f16_bcast(b));
        mv[0] = _mm256_mul_ps(mm2_u8_ps(c, 1, 0), mm2_f16_bcast(b + 2));
    } else if (T == DX_Q6_K) {
        __m128i c = _mm_loadu_si128((const __m128i *)(b + offsetof(dx_block_q6_k, scales)));
        __m256 d = mm2_f16_bcast(b + offsetof(dx_block_q6_k, d));
        for (int i = 0; i < 2; i++) sv[i] = _mm256_mul_ps(mm2_u8_ps(c, i, 1), d);
    } else {
        sv[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(kern__iq4xs_scales_v(b)), mm2_f16_bcast(b));
    }
}

/* v's bytes shifted so that bit `from` of each lands on bit `to`. */
MM2_INLINE __m256i mm2_bit_to(__m256i v, const int from, const int to)
{
    return from >= to ? _mm256_srli_epi16(v, from - to) : _mm256_slli_epi16(v, to - from);
}

/* Block j's 32 weights of a row in element order (the layouts of
 * dx_kquant.h): unsigned, but IQ4_XS's signed codebook values; hb: the
 * row's high bits (Q3_K hmask, Q5_K qh). */
MM2_INLINE __m256i mm2_kq_weights(const uint8_t *b, const int j, __m256i hb, const int T)
{
    const int n = j / 4, k = j % 4; /* half of the super-block, quarter of the half */
    const __m256i m4 = _mm256_set1_epi8(15);
    if (T == DX_Q2_K || T == DX_Q3_K) {
        /* element 32k + i of half n: bits 2k of qs[32n + i]; Q3_K adds 4
         * where bit 4n + k of hmask[i] is set */
        const size_t qs = T == DX_Q2_K ? offsetof(dx_block_q2_k, qs) : offsetof(dx_block_q3_k, qs);
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + qs + 32 * n));
        __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), _mm256_set1_epi8(3));
        if (T == DX_Q3_K)
            v = _mm256_or_si256(
                v, _mm256_and_si256(mm2_bit_to(hb, 4 * n + k, 2), _mm256_set1_epi8(4)));
        return v;
    }
    if (T == DX_Q4_K || T == DX_Q5_K) {
        /* chunk j / 2: the low (even j) or high nibbles of qs[32(j/2)..];
         * Q5_K's bit 4 is bit j of qh[i] */
        const size_t qs = T == DX_Q4_K ? offsetof(dx_block_q4_k, qs) : offsetof(dx_block_q5_k, qs);
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + qs + 32 * (j / 2)));
        __m256i v = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, m4);
        if (T == DX_Q5_K)
            v = _mm256_or_si256(v, _mm256_and_si256(mm2_bit_to(hb, j, 4), _mm256_set1_epi8(16)));
        return v;
    }
    if (T == DX_Q6_K) {
        /* quarter k of half n: ql[64n + 32(k % 2)..]'s low (k < 2) or high
         * nibbles, under bits 2k, 2k + 1 of qh[32n + i] as bits 4-5 */
        __m256i l = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32 * (k % 2)));
        __m256i h = _mm256_loadu_si256((const __m256i *)(b + offsetof(dx_block_q6_k, qh) + 32 * n));
        l = _mm256_and_si256(k < 2 ? l : _mm256_srli_epi16(l, 4), m4);
        return _mm256_or_si256(l,
                               _mm256_and_si256(mm2_bit_to(h, 2 * k, 4), _mm256_set1_epi8(0x30)));
    }
    /* IQ4_XS: sub-block j is qs[16j..16j+15], low nibbles then high ones */
    __m256i v = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(b + offsetof(dx_block_iq4_xs, qs) + 16 * j)));
    v = _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), m4);
    return _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)dx_iq4nl_values)), v);
}

/* A row's factors of one super-block by sub-block, in memory, where the
 * blocks broadcast (32-element sub-blocks: one value a block) or permute
 * (16: two) them: S * d_x for each token, and M. */
typedef struct {
    _Alignas(32) float sd[2][16];
    _Alignas(32) float mn[16];
} mm2_kq_fac;

MM2_INLINE void mm2_kq_factors(mm2_kq_fac *f, const uint8_t *b, const mm2_kq_act *a, const int T,
                               const int MR)
{
    __m256 sv[2], mv[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    mm2_kq_scales(b, T, sv, mv);
    const int nv = kern__kq_sub16(T) ? 2 : 1;
    MM2_UNROLL
    for (int i = 0; i < nv; i++) {
        MM2_UNROLL
        for (int t = 0; t < MR; t++)
            _mm256_store_ps(f->sd[t] + 8 * i, _mm256_mul_ps(sv[i], a->dx[t][i]));
        if (kern__kq_has_min(T)) _mm256_store_ps(f->mn + 8 * i, mv[i]);
    }
}

/* Block j's lanes of a by-sub-block array: sub-block j (32 elements), or
 * 2j (lanes 0-3) and 2j + 1 (4-7). */
MM2_INLINE __m256 mm2_kq_lanes(const float *v, const int j, const int T)
{
    if (!kern__kq_sub16(T)) return _mm256_broadcast_ss(v + j);
    const int a = 2 * (j % 4);
    return _mm256_permutevar8x32_ps(_mm256_load_ps(v + 8 * (j / 4)),
                                    _mm256_setr_epi32(a, a, a, a, a + 1, a + 1, a + 1, a + 1));
}

/* Block j of one row (b: its super-block) into acc[2 * t * NR + j % 2]. */
MM2_INLINE void mm2_kq_block(__m256 *acc, const uint8_t *b, const int j, const uint8_t *xs,
                             size_t xrow, const mm2_kq_act *a, const mm2_kq_fac *f, const int T,
                             const int MR, const int NR)
{
    __m256i hb =
        T == DX_Q3_K   ? _mm256_loadu_si256((const __m256i *)(b + offsetof(dx_block_q3_k, hmask)))
        : T == DX_Q5_K ? _mm256_loadu_si256((const __m256i *)(b + offsetof(dx_block_q5_k, qh)))
                       : _mm256_setzero_si256();
    __m256i wv = mm2_kq_weights(b, j, hb, T);
    __m256i aw = T == DX_IQ4_XS ? _mm256_sign_epi8(wv, wv) : wv;
    __m256 m = kern__kq_has_min(T) ? mm2_kq_lanes(f->mn, j, T) : _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    MM2_UNROLL
    for (int t = 0; t < MR; t++) {
        __m256i xq = _mm256_load_si256((const __m256i *)mm2_kq_xb(xs + t * xrow, j));
        if (T == DX_IQ4_XS) xq = _mm256_sign_epi8(xq, wv);
        __m256i is = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xq), ones);
        if (kern__kq_corr_shift(T) > 0) is = _mm256_add_epi32(is, a->corr[j][t]);
        __m256 *y = &acc[2 * t * NR + j % 2];
        *y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), mm2_kq_lanes(f->sd[t], j, T), *y);
        if (kern__kq_has_min(T)) *y = _mm256_fnmadd_ps(a->dxs[j][t], m, *y);
    }
}

MM2_INLINE void mm2_kq_tile(KERN_MM_TILE_ARGS, const int T, const int MR, const int NR)
{
    const size_t bb = kern__kq_bytes(T), nsb = n_in / DX_QK_K;
    __m256 acc[8];
    MM2_UNROLL
    for (int i = 0; i < 2 * MR * NR; i++) acc[i] = _mm256_setzero_ps();
    /* decode: each step first touches the lines it will read in every row
     * (as the AVX-512 tiles) */
    const int pf = MR == 1 && NR == 4, lines = (int)((bb + 63) / 64);
    for (size_t s = 0; s < nsb; s++, w += bb, x += 4 * KERN__Q8_PAIR_BYTES) {
        if (pf) {
            MM2_UNROLL
            for (int o = 0; o < NR; o++)
                for (int l = 0; l < lines; l++)
                    _mm_prefetch((const char *)w + o * wrow + 64 * l, _MM_HINT_T0);
        }
        mm2_kq_act a;
        mm2_kq_prep(&a, x, xrow, T, MR);
        /* all rows' factors, then block by block across the rows, so that
         * one element's chain of FMAs overlaps the others' */
        mm2_kq_fac f[4];
        MM2_UNROLL
        for (int o = 0; o < NR; o++) mm2_kq_factors(&f[o], w + o * wrow, &a, T, MR);
        __asm__ volatile("" : : "r"(f) : "memory"); /* keep them in memory */
        MM2_UNROLL
        for (int j = 0; j < 8; j++) {
            MM2_UNROLL
            for (int o = 0; o < NR; o++)
                mm2_kq_block(acc + 2 * o, w + o * wrow, j, x, xrow, &a, &f[o], T, MR, NR);
        }
    }
    __m256 r[4]; /* p[i] + p[i+8], output t * NR + o */
    MM2_UNROLL
    for (int i = 0; i < MR * NR; i++) r[i] = _mm256_add_ps(acc[2 * i], acc[2 * i + 1]);
    mm2_store_tile(r, MR, NR, y, ldy);
}

/* Shapes by token count: 4 rows (8 accumulators), a row pair, one row. */
#define MM2_DEF_KQ_TILE(KIND, T, MR, NR)                                                           \
    static void mm2_##KIND##_##MR##x##NR(KERN_MM_TILE_ARGS)                                        \
    {                                                                                              \
        mm2_kq_tile(w, wrow, x, xrow, n_in, y, ldy, T, MR, NR);                                    \
    }
#define MM2_DEF_KQ(KIND, T)                                                                        \
    MM2_DEF_KQ_TILE(KIND, T, 1, 4)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 1, 2)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 1, 1)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 2, 2)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 2, 1)                                                                 \
    static const kern_mm_tiles mm2_##KIND##_tiles = {                                              \
        .by = {[1] = {{mm2_##KIND##_1x4, 4}, {mm2_##KIND##_1x2, 2}, {mm2_##KIND##_1x1, 1}},        \
               [2] = {{mm2_##KIND##_2x2, 2}, {mm2_##KIND##_2x1, 1}}},                              \
    };

MM2_DEF_KQ(q2_k, DX_Q2_K)
MM2_DEF_KQ(q3_k, DX_Q3_K)
MM2_DEF_KQ(q4_k, DX_Q4_K)
MM2_DEF_KQ(q5_k, DX_Q5_K)
MM2_DEF_KQ(q6_k, DX_Q6_K)
MM2_DEF_KQ(iq4_xs, DX_IQ4_XS)

/* The shapes, by token count MR (1..2): a wide tile, and a 1-row tile for the
 * rest. */
#define MM2_DEF_TILE(KIND, MR, NR)                                                                 \
    static void mm2_##KIND##_##MR##x##NR(KERN_MM_TILE_ARGS)                                        \
    {                                                                                              \
        mm2_##KIND##_tile(w, wrow, x, xrow, n_in, y, ldy, MR, NR);                                 \
    }
#define MM2_DEF_KIND(KIND)                                                                         \
    MM2_DEF_TILE(KIND, 1, 8)                                                                       \
    MM2_DEF_TILE(KIND, 1, 1)                                                                       \
    MM2_DEF_TILE(KIND, 2, 4)                                                                       \
    MM2_DEF_TILE(KIND, 2, 1)                                                                       \
    static const kern_mm_tiles mm2_##KIND##_tiles = {                                              \
        .by = {[1] = {{mm2_##KIND##_1x8, 8}, {mm2_##KIND##_1x1, 1}},                               \
               [2] = {{mm2_##KIND##_2x4, 4}, {mm2_##KIND##_2x1, 1}}},                              \
    };

MM2_DEF_KIND(bf16)
MM2_DEF_KIND(f16)
MM2_DEF_KIND(f32)
MM2_DEF_KIND(q8)

/* ---- Q8_0 activation prep, bit-identical to dx_f32_to_q8_0_row ---- */

static void mm2_q8_block(const float *x, int8_t *q, int32_t *negcorr, float *dout)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, _mm256_and_ps(v[i], absmask));
    }
    float l[8], amax = 0.0f;
    _mm256_storeu_ps(l, m);
    for (int i = 0; i < 8; i++) amax = l[i] > amax ? l[i] : amax;
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256i qi[4];
    for (int i = 0; i < 4; i++) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
    /* packs interleave 128-bit lanes; the permute puts the 4-byte groups back in order. */
    __m256i p =
        _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    __m256i s =
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
    _mm256_storeu_si256((__m256i *)negcorr,
                        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s, 7)));
    _mm256_storeu_ps(dout, _mm256_set1_ps(dx_f16_to_f32(dx_f32_to_f16(d))));
}

static void mm2_q8_prep_row(const float *x, size_t n_in, void *out)
{
    uint8_t *row = out;
    for (size_t b = 0; b < n_in / DX_QK8_0; b++) {
        uint8_t *pair = row + (b / 2) * KERN__Q8_PAIR_BYTES;
        size_t h = b % 2;
        mm2_q8_block(x + b * DX_QK8_0, (int8_t *)pair + 32 * h, (int32_t *)(pair + 64) + 8 * h,
                     (float *)(pair + 128) + 8 * h);
    }
    kern__q8_clear_odd(row, n_in);
}

/* No BF16 prep: BF16 activations take the scalar conversion on this path. */
const kern_mm_isa kern_mm_isa_avx2 = {
    .mr = 2,
    .block_rows = 8,
    .tiles = {[DX_F32] = &mm2_f32_tiles,
              [DX_F16] = &mm2_f16_tiles,
              [DX_BF16] = &mm2_bf16_tiles,
              [DX_Q8_0] = &mm2_q8_tiles,
              [DX_Q4_0] = &mm2_q4_0_tiles,
              [DX_Q4_1] = &mm2_q4_1_tiles,
              [DX_Q5_0] = &mm2_q5_0_tiles,
              [DX_Q5_1] = &mm2_q5_1_tiles,
              [DX_IQ4_NL] = &mm2_iq4_nl_tiles,
              [DX_Q2_K] = &mm2_q2_k_tiles,
              [DX_Q3_K] = &mm2_q3_k_tiles,
              [DX_Q4_K] = &mm2_q4_k_tiles,
              [DX_Q5_K] = &mm2_q5_k_tiles,
              [DX_Q6_K] = &mm2_q6_k_tiles,
              [DX_IQ4_XS] = &mm2_iq4_xs_tiles},
    .prep = {[KERN_ACT_Q8] = mm2_q8_prep_row},
};
