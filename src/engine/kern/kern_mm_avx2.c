/* kern_mm_avx2: AVX2+FMA matmul tiles for CPUs without AVX-512 (BF16 widened
 * by shifting into f32, F16 via vcvtph2ps, F32, the 32-block formats and
 * the super-block formats via vpmaddubsw/vpmaddwd) and the Q8_0
 * activation prep, for the driver in kern_mm.c (kern_mm_isa_avx2).  Q8_0
 * runs kern_mm_q8_avx2.c's kernel, its tiles here only the rows past that
 * kernel's groups of 8.
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
#include "engine/kern/kern_mm_x86.h"

#define MM2_INLINE static inline __attribute__((always_inline))
#define MM2_UNROLL _Pragma("GCC unroll 16")
/* v as it stands, in a register: keeps GCC from re-associating a chain of
 * integer adds into a tree whose temporaries spill (the unrolled
 * super-block loops had a store and a reload per product). */
#define MM2_KEEP(v) __asm__("" : "+x"(v))

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
    if (MR * NR == 1) { /* mm2_reduce8's tree for one vector, without the 7 zero ones */
        y[0] = kern__hsum4(
            _mm_add_ps(_mm256_castps256_ps128(acc[0]), _mm256_extractf128_ps(acc[0], 1)));
        return;
    }
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

/* Q8_0's tiles, for the rows past kern__q8avx2_matmul's groups of 8: one
 * row against MR tokens with Q8_0's arithmetic (kern_mm_priv.h), a block's
 * exact dot (|w| times sign(w)*x with vpmaddubsw, no saturation: 2*128*127
 * < 32768; widened by vpmaddwd, summed across lanes) and one fma, so a row
 * gets the bits it would get in a group. */
MM2_INLINE void mm2_q8_row(KERN_MM_TILE_ARGS, const int MR)
{
    const size_t tail = kern__q8_tail_off(n_in);
    const __m256i ones = _mm256_set1_epi16(1);
    __m128 acc[2];
    MM2_UNROLL
    for (int t = 0; t < MR; t++) acc[t] = _mm_setzero_ps();
    for (size_t b = 0; b < n_in / DX_QK8_0; b++) {
        const uint8_t *wb = w + b * sizeof(dx_block_q8_0);
        __m256i wq = _mm256_loadu_si256((const __m256i *)(wb + 2)), aw = _mm256_sign_epi8(wq, wq);
        uint16_t dh;
        memcpy(&dh, wb, 2);
        float dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(dh)));
        MM2_UNROLL
        for (int t = 0; t < MR; t++) {
            const uint8_t *xr = x + t * xrow;
            __m256i xq = _mm256_load_si256((const __m256i *)kern__q8_qs(xr, b));
            __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq, wq)), ones);
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            float dx;
            memcpy(&dx, xr + tail + 8 * b + 4, 4);
            acc[t] =
                _mm_fmadd_ss(_mm_set_ss((float)_mm_cvtsi128_si32(s4)), _mm_set_ss(dw * dx), acc[t]);
        }
    }
    MM2_UNROLL
    for (int t = 0; t < MR; t++) y[t * ldy] = _mm_cvtss_f32(acc[t]);
}
static void mm2_q8_row1(KERN_MM_TILE_ARGS)
{
    mm2_q8_row(w, wrow, x, xrow, n_in, y, ldy, 1);
}
static void mm2_q8_row2(KERN_MM_TILE_ARGS)
{
    mm2_q8_row(w, wrow, x, xrow, n_in, y, ldy, 2);
}
static const kern_mm_tiles mm2_q8_tiles = {
    .by = {[1] = {{mm2_q8_row1, 1}}, [2] = {{mm2_q8_row2, 1}}},
    .mr = 2,
};

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
    __m256i xlo[KERN_MM_MR_MAX], xhi[KERN_MM_MR_MAX], corr[KERN_MM_MR_MAX];
    __m256 dx[KERN_MM_MR_MAX], sd[KERN_MM_MR_MAX];
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
    kern__pf pf = kern__pf_next_tile(w, wrow, NR, nb / 2);
    /* blocks in pairs, as the activations hold them (the second at +32) */
    for (size_t q = 0; q < nb / 2; q++, x += KERN__Q8_PAIR_BYTES) {
        if (MR == 1) kern__pf_step(&pf, NR);
        for (int h = 0; h < 2; h++) {
            mm2_blk_step(acc, pb, wrow, x + 32 * h, xrow, T, MR, NR);
            MM2_UNROLL
            for (int p = 0; p < NP; p++) pb[p] += bb;
        }
    }
    if (nb & 1) mm2_blk_step(acc, pb, wrow, x, xrow, T, MR, NR);
    mm2_blk_store(acc, MR, NR, y, ldy);
}

/* Shapes by token count: a wide tile, a row pair and a single row.  The
 * 5-bit formats tile up to 4 tokens (their qh unpack is paid once per
 * row for more tokens); the 4-bit ones 2, whose 2x8 tile already keeps
 * 8 accumulators busy (bench_mm, 64 tokens: 2x8 1.1-1.4x the 2x4 tile;
 * 4x4 no better for them, 1.1-1.2x for Q5_0 / Q5_1). */
#define MM2_DEF_BLK_TILE(KIND, T, MR, NR)                                                          \
    static void mm2_##KIND##_##MR##x##NR(KERN_MM_TILE_ARGS)                                        \
    {                                                                                              \
        mm2_blk_tile(w, wrow, x, xrow, n_in, y, ldy, T, MR, NR);                                   \
    }
#define MM2_DEF_BLK_1_2(KIND, T)                                                                   \
    MM2_DEF_BLK_TILE(KIND, T, 1, 8)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 1, 2)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 1, 1)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 2, 8)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 2, 2)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 2, 1)
#define MM2_BLK_BY_1_2(KIND)                                                                       \
    [1] = {{mm2_##KIND##_1x8, 8}, {mm2_##KIND##_1x2, 2}, {mm2_##KIND##_1x1, 1}},                   \
    [2] = {{mm2_##KIND##_2x8, 8}, {mm2_##KIND##_2x2, 2}, {mm2_##KIND##_2x1, 1}}
#define MM2_DEF_BLK(KIND, T)                                                                       \
    MM2_DEF_BLK_1_2(KIND, T)                                                                       \
    static const kern_mm_tiles mm2_##KIND##_tiles = {.by = {MM2_BLK_BY_1_2(KIND)}, .mr = 2};
#define MM2_DEF_BLK4(KIND, T)                                                                      \
    MM2_DEF_BLK_1_2(KIND, T)                                                                       \
    MM2_DEF_BLK_TILE(KIND, T, 3, 4)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 3, 2)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 3, 1)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 4, 4)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 4, 2)                                                                \
    MM2_DEF_BLK_TILE(KIND, T, 4, 1)                                                                \
    static const kern_mm_tiles mm2_##KIND##_tiles = {                                              \
        .by = {MM2_BLK_BY_1_2(KIND),                                                               \
               [3] = {{mm2_##KIND##_3x4, 4}, {mm2_##KIND##_3x2, 2}, {mm2_##KIND##_3x1, 1}},        \
               [4] = {{mm2_##KIND##_4x4, 4}, {mm2_##KIND##_4x2, 2}, {mm2_##KIND##_4x1, 1}}},       \
        .mr = 4,                                                                                   \
    };

MM2_DEF_BLK(q4_0, DX_Q4_0)
MM2_DEF_BLK(q4_1, DX_Q4_1)
MM2_DEF_BLK4(q5_0, DX_Q5_0)
MM2_DEF_BLK4(q5_1, DX_Q5_1)
MM2_DEF_BLK(iq4_nl, DX_IQ4_NL)

/* ---- the super-block formats (kern_mm_priv.h: integer sums a super-block) ----
 * A tile of MR tokens x NR rows (MR * NR <= 8) keeps one int32 ymm per
 * element.  For each 32-element chunk j of a super-block, a row's 32
 * weights unpacked into element order (unsigned; IQ4_XS's signed codebook
 * values take the sign trick, |v| <= 127) times a token's quants give 16
 * int16 pair sums (vpmaddubsw: 2 * 63 * 127 and 2 * 127 * 127 < 32768, no
 * saturation), which vpmaddwd multiplies by the chunk's sub-block scales
 * (lanes 0-7 of a chunk are its elements 0-15, lanes 8-15 elements 16-31:
 * one scale a 128-bit half, so one vpshufb picks a chunk's scales for any
 * format) and adds into the element's accumulator.  After the eighth chunk
 * the weights' offset (Q3_K, Q6_K) and the minimums come from the tokens'
 * bsums by one vpmaddwd each, the tile's accumulators are summed across
 * their lanes all at once (vphaddd: exact), and the float steps run for
 * the whole tile in one vector, lane t * NR + o. */

/* Vector decoders of the packed sub-block scales (the twins decode them
 * their own way, so the tests compare the two).  b points at the super-block. */

/* Q3_K's and Q6_K's 16 signed scales, in order. */
MM2_INLINE __m128i mm2_kq_s8(const uint8_t *b, const int T)
{
    return T == DX_Q3_K ? _mm_sub_epi8(kern__q3k_scales_v(b), _mm_set1_epi8(32))
                        : _mm_loadu_si128((const __m128i *)(b + offsetof(dx_block_q6_k, scales)));
}

/* A row's scales for one super-block in vpshufb-pick order: 16-element
 * sub-blocks, the even ones' in the low lane and the odd ones' in the
 * high; 32-element, all 8 in both. */
MM2_INLINE __m256i mm2_kq_scales(const uint8_t *b, const int T)
{
    static const int8_t eo[16] = {0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15};
    const __m128i even_odd = _mm_loadu_si128((const __m128i *)eo);
    if (T == DX_Q2_K)
        return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
            _mm_and_si128(_mm_loadu_si128((const __m128i *)b), _mm_set1_epi8(15)), even_odd));
    if (T == DX_Q3_K || T == DX_Q6_K)
        return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(mm2_kq_s8(b, T), even_odd));
    if (T == DX_Q4_K || T == DX_Q5_K)
        return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(kern__k4_scales_v(b)));
    __m256i v = kern__iq4xs_scales_v(b); /* IQ4_XS: 8 int32 to int16, both lanes */
    return _mm256_permute4x64_epi64(_mm256_packs_epi32(v, v), 0xd8);
}

/* What the bsums multiply, by 16-element group in order: Q3_K / Q6_K the
 * scales (the offset's sum of sc * bs), Q2_K the minimums, Q4_K / Q5_K
 * each sub-block's minimum twice. */
MM2_INLINE __m256i mm2_kq_bs_factors(const uint8_t *b, const int T)
{
    if (T == DX_Q2_K)
        return _mm256_cvtepu8_epi16(_mm_and_si128(
            _mm_srli_epi16(_mm_loadu_si128((const __m128i *)b), 4), _mm_set1_epi8(15)));
    if (T == DX_Q3_K || T == DX_Q6_K) return _mm256_cvtepi8_epi16(mm2_kq_s8(b, T));
    __m128i c = kern__k4_scales_v(b);
    return _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(c, c));
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

/* Lane i of the result: the sum of a[i]'s lanes (exact). */
MM2_INLINE __m256i mm2_hsum8i(const __m256i *a)
{
    __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
    __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(a[4], a[5]), _mm256_hadd_epi32(a[6], a[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20),
                            _mm256_permute2x128_si256(q0, q1, 0x31));
}

MM2_INLINE void mm2_kq_tile(KERN_MM_TILE_ARGS, const int T, const int MR, const int NR)
{
    const size_t bb = kern__kq_bytes(T), nsb = n_in / DX_QK_K;
    const size_t doff = kern__kq_d_offset(T);
    const int off = kern__kq_offset(T), has_m = kern__kq_has_min(T);
    __m256 sum = _mm256_setzero_ps(); /* lane t * NR + o */
    kern__pf pf = kern__pf_next_tile(w, wrow, NR, nsb);
    for (size_t s = 0; s < nsb; s++, w += bb, x += KERN__Q8K_BYTES) {
        if (MR == 1) kern__pf_step(&pf, NR);
        __m256i sc[4];
        MM2_UNROLL
        for (int o = 0; o < NR; o++) sc[o] = mm2_kq_scales(w + o * wrow, T);
        __m256i acc[8];
        MM2_UNROLL
        for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_si256();
        MM2_UNROLL
        for (int j = 0; j < 8; j++) {
            const __m256i pick = _mm256_set1_epi16((short)((2 * j + 1) << 8 | 2 * j));
            MM2_UNROLL
            for (int o = 0; o < NR; o++) {
                const uint8_t *b = w + o * wrow;
                __m256i hb =
                    T == DX_Q3_K
                        ? _mm256_loadu_si256((const __m256i *)(b + offsetof(dx_block_q3_k, hmask)))
                    : T == DX_Q5_K
                        ? _mm256_loadu_si256((const __m256i *)(b + offsetof(dx_block_q5_k, qh)))
                        : _mm256_setzero_si256();
                __m256i wv = mm2_kq_weights(b, j, hb, T);
                __m256i aw = T == DX_IQ4_XS ? _mm256_sign_epi8(wv, wv) : wv;
                __m256i scj = _mm256_shuffle_epi8(sc[o], pick);
                MM2_UNROLL
                for (int t = 0; t < MR; t++) {
                    __m256i xq = _mm256_load_si256((const __m256i *)(x + t * xrow + 32 * j));
                    if (T == DX_IQ4_XS) xq = _mm256_sign_epi8(xq, wv);
                    acc[t * NR + o] = _mm256_add_epi32(
                        acc[t * NR + o], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xq), scj));
                    MM2_KEEP(acc[t * NR + o]);
                }
            }
        }
        /* the offsets and minimums, from the rows' bytes again (in L1) */
        __m256i mins[8] = {0};
        MM2_UNROLL
        for (int o = 0; o < NR; o++) {
            if (!off && !has_m) break;
            __m256i fo = mm2_kq_bs_factors(w + o * wrow, T);
            MM2_UNROLL
            for (int t = 0; t < MR; t++) {
                const int i = t * NR + o;
                __m256i m =
                    _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(x + t * xrow + 256)), fo);
                if (off) /* v = u - off: minus off * sum of sc * bs */
                    acc[i] = _mm256_sub_epi32(acc[i], _mm256_slli_epi32(m, off == 32 ? 5 : 2));
                else
                    mins[i] = m;
            }
        }
        float dx[4];
        MM2_UNROLL
        for (int t = 0; t < MR; t++) dx[t] = kern__q8k_d(x + t * xrow, 0);
        __m256 dxv = MR == 1
                         ? _mm256_set1_ps(dx[0])
                         : _mm256_setr_ps(dx[0], dx[(1 / NR) % MR], dx[(2 / NR) % MR],
                                          dx[(3 / NR) % MR], dx[(4 / NR) % MR], dx[(5 / NR) % MR],
                                          dx[(6 / NR) % MR], dx[(7 / NR) % MR]);
        __m256 dd = _mm256_mul_ps(kern__kq_rows_f16(w, wrow, doff, MR, NR), dxv);
        sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mm2_hsum8i(acc)), dd, sum);
        if (has_m) {
            __m256 dm = _mm256_mul_ps(kern__kq_rows_f16(w, wrow, doff + 2, MR, NR), dxv);
            sum = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mm2_hsum8i(mins)), dm, sum);
        }
    }
    float r[8];
    _mm256_storeu_ps(r, sum);
    MM2_UNROLL
    for (int i = 0; i < MR * NR; i++) y[(size_t)(i / NR) * ldy + (size_t)(i % NR)] = r[i];
}

/* Shapes by token count: 8 elements a tile where the rows allow, then
 * fewer rows, down to one. */
#define MM2_DEF_KQ_TILE(KIND, T, MR, NR)                                                           \
    static void mm2_##KIND##_##MR##x##NR(KERN_MM_TILE_ARGS)                                        \
    {                                                                                              \
        mm2_kq_tile(w, wrow, x, xrow, n_in, y, ldy, T, MR, NR);                                    \
    }
#define MM2_DEF_KQ(KIND, T)                                                                        \
    MM2_DEF_KQ_TILE(KIND, T, 1, 4)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 1, 2)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 1, 1)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 2, 4)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 2, 2)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 2, 1)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 3, 2)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 3, 1)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 4, 2)                                                                 \
    MM2_DEF_KQ_TILE(KIND, T, 4, 1)                                                                 \
    const kern_mm_tiles kern__avx2_##KIND##_tiles = {                                              \
        .by = {[1] = {{mm2_##KIND##_1x4, 4}, {mm2_##KIND##_1x2, 2}, {mm2_##KIND##_1x1, 1}},        \
               [2] = {{mm2_##KIND##_2x4, 4}, {mm2_##KIND##_2x2, 2}, {mm2_##KIND##_2x1, 1}},        \
               [3] = {{mm2_##KIND##_3x2, 2}, {mm2_##KIND##_3x1, 1}},                               \
               [4] = {{mm2_##KIND##_4x2, 2}, {mm2_##KIND##_4x1, 1}}},                              \
        .mr = 4,                                                                                   \
    };

MM2_DEF_KQ(q2_k, DX_Q2_K)
MM2_DEF_KQ(q3_k, DX_Q3_K)
MM2_DEF_KQ(q4_k, DX_Q4_K)
MM2_DEF_KQ(q5_k, DX_Q5_K)
MM2_DEF_KQ(q6_k, DX_Q6_K)
MM2_DEF_KQ(iq4_xs, DX_IQ4_XS)

/* The shapes, by token count: a wide tile, and a 1-row tile for the rest.
 * F16 tiles up to 4 tokens, so a converted weight vector (vcvtph2ps, two
 * uops here) serves 4 (bench_mm, 64 tokens: 1.25x); for BF16 and F32
 * a 4x2 tile was no faster (BF16's widened activations spill). */
#define MM2_DEF_TILE(KIND, MR, NR)                                                                 \
    static void mm2_##KIND##_##MR##x##NR(KERN_MM_TILE_ARGS)                                        \
    {                                                                                              \
        mm2_##KIND##_tile(w, wrow, x, xrow, n_in, y, ldy, MR, NR);                                 \
    }
#define MM2_DEF_KIND_1_2(KIND)                                                                     \
    MM2_DEF_TILE(KIND, 1, 8)                                                                       \
    MM2_DEF_TILE(KIND, 1, 1)                                                                       \
    MM2_DEF_TILE(KIND, 2, 4)                                                                       \
    MM2_DEF_TILE(KIND, 2, 1)
#define MM2_KIND_BY_1_2(KIND)                                                                      \
    [1] = {{mm2_##KIND##_1x8, 8}, {mm2_##KIND##_1x1, 1}}, [2] = {{mm2_##KIND##_2x4, 4},            \
                                                                 {mm2_##KIND##_2x1, 1}}
#define MM2_DEF_KIND(KIND)                                                                         \
    MM2_DEF_KIND_1_2(KIND)                                                                         \
    static const kern_mm_tiles mm2_##KIND##_tiles = {.by = {MM2_KIND_BY_1_2(KIND)}, .mr = 2};
#define MM2_DEF_KIND4(KIND)                                                                        \
    MM2_DEF_KIND_1_2(KIND)                                                                         \
    MM2_DEF_TILE(KIND, 3, 2)                                                                       \
    MM2_DEF_TILE(KIND, 3, 1)                                                                       \
    MM2_DEF_TILE(KIND, 4, 2)                                                                       \
    MM2_DEF_TILE(KIND, 4, 1)                                                                       \
    static const kern_mm_tiles mm2_##KIND##_tiles = {                                              \
        .by = {MM2_KIND_BY_1_2(KIND), [3] = {{mm2_##KIND##_3x2, 2}, {mm2_##KIND##_3x1, 1}},        \
               [4] = {{mm2_##KIND##_4x2, 2}, {mm2_##KIND##_4x1, 1}}},                              \
        .mr = 4,                                                                                   \
    };

MM2_DEF_KIND(bf16)
MM2_DEF_KIND4(f16)
MM2_DEF_KIND(f32)

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

/* ---- q8_K activation prep, bit-identical to kern__q8k_prep_scalar ---- */

void kern__avx2_q8k_prep(const float *x, size_t n_in, void *out)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (size_t sb = 0; sb < n_in / DX_QK_K; sb++, x += DX_QK_K) {
        uint8_t *o = (uint8_t *)out + sb * KERN__Q8K_BYTES;
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 32; i++)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + 8 * i), absmask));
        float l[8], amax = 0.0f;
        _mm256_storeu_ps(l, m);
        for (int i = 0; i < 8; i++) amax = l[i] > amax ? l[i] : amax;
        float d = amax / 127.0f;
        __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        __m256i s4[8]; /* chunk j's sums of 4 */
        for (int j = 0; j < 8; j++) {
            __m256i qi[4];
            for (int i = 0; i < 4; i++)
                qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * j + 8 * i), id));
            /* packs interleave 128-bit lanes; the permute puts the 4-byte groups back in order */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]),
                                           _mm256_packs_epi32(qi[2], qi[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_store_si256((__m256i *)(o + 32 * j), p);
            s4[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p),
                                      _mm256_set1_epi16(1));
        }
        /* [bs0 bs2 bs4 bs6 | bs1 bs3 bs5 bs7] and [bs8 .. | bs9 ..], to int16 in order */
        __m256i q0 =
            _mm256_hadd_epi32(_mm256_hadd_epi32(s4[0], s4[1]), _mm256_hadd_epi32(s4[2], s4[3]));
        __m256i q1 =
            _mm256_hadd_epi32(_mm256_hadd_epi32(s4[4], s4[5]), _mm256_hadd_epi32(s4[6], s4[7]));
        __m256i bs = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xd8);
        bs = _mm256_shuffle_epi8(bs, _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7,
                                                      14, 15, 0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12,
                                                      13, 6, 7, 14, 15));
        _mm256_store_si256((__m256i *)(o + 256), bs);
        memset(o + 288, 0, KERN__Q8K_BYTES - 288);
        memcpy(o + 288, &d, 4);
    }
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
              KERN__AVX2_KQ_TILES},
    .prep = {[KERN_ACT_Q8] = mm2_q8_prep_row, [KERN_ACT_Q8K] = kern__avx2_q8k_prep},
};
