/* kern_mm_amx: the prefill matmuls of the super-block formats (Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K, IQ4_XS) on the AMX tile unit (TDPBSUD / TDPBSSD: 16x16
 * int32 sums of 64 int8 products a row), for the driver in kern_mm.c,
 * which hands it whole groups of 16 tokens x 16 weight rows and runs the
 * rest through the AVX-512 tiles.
 *
 * The arithmetic is the super-block formats' of kern_mm_priv.h, bit for bit:
 * per super-block the integer sums A = sum sc * v * x and B = sum m * bs are
 * exact whatever unit adds them, and the two float steps per element are
 * the scalar twin's.  A tile multiplies bytes, and sc * v does not fit one
 * but for Q2_K, so the scale goes in as digits, each digit's products a
 * tile product of their own, and A = sum_i base^i C_i:
 *   Q2_K: sc (0..15) times v (0..3) fits as it is, unsigned (TDPBSUD);
 *   Q3_K: sc (-32..31) = 2 sh + sl, sh in -16..15 and sl in 0..1, times v
 *     (-4..3): within -64..64, signed (TDPBSSD);
 *   Q4_K, Q5_K: sc (0..63) = 8 sh + sl, digits 0..7, times v (0..15, 0..31):
 *     at most 217, unsigned;
 *   Q6_K: sc (-128..127) = 64 s3 + 16 s2 + 4 s1 + s0, s0..s2 in 0..3 and s3
 *     in -2..1, times v = q - 32 (-32..31): within -96..96, signed (TDPBSSD);
 *   IQ4_XS: sc = ls - 32 with ls (0..63) in binary digits, times the
 *     codebook values (-127..113), signed, and the -32 a seventh product
 *     against v itself.
 * B is one more tile product: weights that are the sub-block's minimum
 * itself, m at every element, give sum m * x = sum m * bs.
 *
 * The tiles: A operands are 16 tokens' activation quants, 64 a row, loaded
 * straight from the KERN_ACT_Q8K rows (the row pitch is the tile's stride);
 * B operands are 16 weight rows' 64 elements in the tile unit's layout (row
 * k of the tile holds elements 4k..4k+3 of every weight row, 4 bytes a
 * row).  Those are prepared once per 16 weight rows and 1-2 super-blocks
 * and then serve every group of 16 tokens: the packed fields are transposed
 * 4 bytes at a time, unpacked into the weights in the transposed layout, and
 * multiplied by each digit, byte by byte.
 *
 * Tile state is per thread: each thread loads the configuration the first
 * time it runs here and keeps it (nothing else in the process uses the
 * tiles). */
#include <immintrin.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern_mm_priv.h"
#include "engine/kern/kern_mm_t16.h"
#include "engine/kern/kern_mm_x86.h"

#define AMX_INLINE static inline __attribute__((always_inline))
#define AMX_SETS   7 /* most tile products a super-block (IQ4_XS's) */

/* One super-block of 16 weight rows, ready for the tiles: for each tile
 * product i and 64-element chunk c, its B operand; the rows' d and dmin
 * widened. */
typedef struct {
    uint8_t b[AMX_SETS][4][1024];
    float d[16], dmin[16];
} amx_sb;

/* Digits of the scale (products 0..n-1), then the minimum's product or
 * IQ4_XS's offset's. */
AMX_INLINE int amx_digits(const int T)
{
    return T == DX_Q2_K ? 1 : T == DX_Q6_K ? 4 : T == DX_IQ4_XS ? 6 : 2;
}
/* Whether the weights' products are unsigned (TDPBSUD), else signed. */
AMX_INLINE int amx_unsigned(const int T)
{
    return T == DX_Q2_K || T == DX_Q4_K || T == DX_Q5_K;
}
AMX_INLINE int amx_sets(const int T)
{
    return amx_digits(T) + (kern__kq_has_min(T) || T == DX_IQ4_XS);
}
/* Super-blocks a prepared slice: 24-28 KiB, within L1 with the tokens'. */
AMX_INLINE size_t amx_slice(const int T)
{
    return amx_sets(T) > 4 ? 1 : 2;
}

/* Palette 1, all eight tiles 16 rows of 64 bytes (amx_run says which
 * holds what). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

static __thread int amx_configured;

static void amx_configure(void)
{
    amx_cfg c;
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.colsb[i] = 64, c.rows[i] = 16;
    _tile_loadconfig(&c);
    amx_configured = 1;
}

/* Byte 4o + i of the result: byte j of row o's 16 (st, 16 rows of 16). */
AMX_INLINE __m512i amx_spread(const __m512i *st, int j)
{
    const __m512i base =
        _mm512_setr_epi32(0x00000000, 0x10101010, 0x20202020, 0x30303030, 0x40404040, 0x50505050,
                          0x60606060, 0x70707070, 0x00000000, 0x10101010, 0x20202020, 0x30303030,
                          0x40404040, 0x50505050, 0x60606060, 0x70707070);
    __m512i idx = _mm512_add_epi8(base, _mm512_set1_epi8((char)j));
    __m512i a = _mm512_permutex2var_epi8(st[0], idx, st[1]); /* rows 0-7 */
    __m512i b = _mm512_permutex2var_epi8(st[2], idx, st[3]); /* rows 8-15 */
    return _mm512_mask_blend_epi8(0xffffffff00000000ull, a, b);
}

/* Byte by byte a * b, the product's low 8 bits (the product itself where it
 * fits a byte, signed or unsigned). */
AMX_INLINE __m512i amx_mul8(__m512i a, __m512i b)
{
    const __m512i lo8 = _mm512_set1_epi16(0x00ff);
    __m512i even = _mm512_and_si512(_mm512_mullo_epi16(a, b), lo8);
    __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_andnot_si512(lo8, b));
    return _mm512_or_si512(even, odd);
}

/* Super-block s of the 16 rows at w (wrow apart) into P. */
AMX_INLINE void amx_prep(const uint8_t *w, size_t wrow, size_t s, amx_sb *P, const int T)
{
    const size_t bb = kern__kq_bytes(T);
    const uint8_t *b[16];
    for (int o = 0; o < 16; o++) b[o] = w + (size_t)o * wrow + s * bb;
    _Alignas(64) uint8_t st8[256]; /* row o's 16 scale bytes at 16o (kern__t16_scales) */
    __m512 d, dmin;
    kern__t16_scales(b, st8, 16, &d, &dmin, T);
    _mm512_storeu_ps(P->d, d);
    _mm512_storeu_ps(P->dmin, dmin);
    __m512i st[4], hb[8];
    for (int i = 0; i < 4; i++) st[i] = _mm512_load_si512(st8 + 64 * i);
    if (T == DX_Q5_K) kern__t16_rows(b, offsetof(dx_block_q5_k, qh), hb);
    if (T == DX_Q3_K) kern__t16_rows(b, offsetof(dx_block_q3_k, hmask), hb);
    /* rows k of a sub-block: 4 where it is 16 elements, else 8 */
    const int nd = amx_digits(T), sub = T == DX_Q2_K || T == DX_Q3_K || T == DX_Q6_K ? 4 : 8;
    for (int c = 0; c < 4; c++) {
        __m512i v[16], dg[AMX_SETS];
        for (int i = 0; i < AMX_SETS; i++) dg[i] = _mm512_setzero_si512(); /* set at k = 0 */
        kern__t16_weights(b, c, hb, v, T);
        for (int k = 0; k < 16; k++) {
            if (k % sub == 0) { /* a new sub-block: its digits of every row */
                int j = sub == 4 ? 4 * c + k / 4 : 2 * c + k / 8;
                __m512i sc = amx_spread(st, j);
                if (T == DX_Q2_K) {
                    dg[0] = kern__t16_srl8(sc, 0, 15);
                    dg[1] = kern__t16_srl8(sc, 4, 15); /* the minimum */
                } else if (T == DX_Q3_K) {             /* sc + 32 = 2 (sh + 16) + sl */
                    dg[0] = kern__t16_srl8(sc, 0, 1);
                    dg[1] = _mm512_sub_epi8(kern__t16_srl8(sc, 1, 31), _mm512_set1_epi8(16));
                } else if (T == DX_IQ4_XS) {
                    for (int i = 0; i < 6; i++) /* v where bit i of ls is set */
                        dg[i] = _mm512_movm_epi8(
                            _mm512_test_epi8_mask(sc, _mm512_set1_epi8((char)(1 << i))));
                } else if (T == DX_Q6_K) {
                    for (int i = 0; i < 3; i++) dg[i] = kern__t16_srl8(sc, 2 * i, 3);
                    dg[3] = _mm512_sub_epi8(
                        _mm512_xor_si512(kern__t16_srl8(sc, 6, 3), _mm512_set1_epi8(2)),
                        _mm512_set1_epi8(2)); /* the top digit signed */
                } else {
                    dg[0] = kern__t16_srl8(sc, 0, 7);
                    dg[1] = kern__t16_srl8(sc, 3, 7);
                    dg[2] = amx_spread(st, 8 + j); /* the minimum */
                }
            }
            for (int i = 0; i < nd; i++)
                _mm512_store_si512(P->b[i][c] + 64 * k, T == DX_IQ4_XS
                                                            ? _mm512_and_si512(v[k], dg[i])
                                                            : amx_mul8(v[k], dg[i]));
            if (kern__kq_has_min(T)) _mm512_store_si512(P->b[nd][c] + 64 * k, dg[nd]);
            if (T == DX_IQ4_XS) _mm512_store_si512(P->b[nd][c] + 64 * k, v[k]);
        }
    }
}

/* One tile product into sums tile C: B operand tile B loaded from p. */
#define AMX_DP(C, B, p, T)                                                                         \
    do {                                                                                           \
        _tile_loadd(B, p, 64);                                                                     \
        if (amx_unsigned(T))                                                                       \
            _tile_dpbsud(C, 4, B);                                                                 \
        else                                                                                       \
            _tile_dpbssd(C, 4, B);                                                                 \
    } while (0)

/* Tile products first..first+n-1 (n <= 4) of one super-block, their sums
 * into cs[first..]: tiles 0-3 the sums, 4 the tokens' quants (xq, rows
 * xrow apart), 5-7 the weights. */
AMX_INLINE void amx_pass(const amx_sb *P, const int first, const int n, const uint8_t *xq,
                         size_t xrow, int32_t (*cs)[256], const int T)
{
    _tile_zero(0);
    if (n > 1) _tile_zero(1);
    if (n > 2) _tile_zero(2);
    if (n > 3) _tile_zero(3);
    for (int c = 0; c < 4; c++) {
        _tile_loadd(4, xq + 64 * c, xrow);
        AMX_DP(0, 5, P->b[first][c], T);
        if (n > 1) AMX_DP(1, 6, P->b[first + 1][c], T);
        if (n > 2) AMX_DP(2, 7, P->b[first + 2][c], T);
        if (n > 3) AMX_DP(3, 5, P->b[first + 3][c], T);
    }
    _tile_stored(0, cs[first], 64);
    if (n > 1) _tile_stored(1, cs[first + 1], 64);
    if (n > 2) _tile_stored(2, cs[first + 2], 64);
    if (n > 3) _tile_stored(3, cs[first + 3], 64);
}

/* Token t's A (row o in lane o) from the sums: the digits' place values,
 * and IQ4_XS's -32 times sum v * x. */
AMX_INLINE __m512i amx_a(int32_t (*cs)[256], int t, const int T)
{
#define AMX_C(i) _mm512_load_si512(cs[i] + 16 * t)
    if (T == DX_Q2_K) return AMX_C(0);
    if (T == DX_Q3_K) return _mm512_add_epi32(AMX_C(0), _mm512_slli_epi32(AMX_C(1), 1));
    if (T == DX_Q4_K || T == DX_Q5_K)
        return _mm512_add_epi32(AMX_C(0), _mm512_slli_epi32(AMX_C(1), 3));
    if (T == DX_Q6_K)
        return _mm512_add_epi32(
            _mm512_add_epi32(AMX_C(0), _mm512_slli_epi32(AMX_C(1), 2)),
            _mm512_add_epi32(_mm512_slli_epi32(AMX_C(2), 4), _mm512_slli_epi32(AMX_C(3), 6)));
    __m512i a = _mm512_sub_epi32(AMX_C(0), _mm512_slli_epi32(AMX_C(6), 5));
    for (int i = 1; i < 6; i++) a = _mm512_add_epi32(a, _mm512_slli_epi32(AMX_C(i), i));
    return a;
#undef AMX_C
}

/* 16 tokens (act, xrow apart) against the prepared super-blocks P[0..ns)
 * (super-blocks s0.. of the rows), added to acc[t] (row o in lane o). */
AMX_INLINE void amx_run(const amx_sb *P, size_t ns, size_t s0, const uint8_t *act, size_t xrow,
                        __m512 *acc, const int T)
{
    _Alignas(64) int32_t cs[AMX_SETS][256];
    const int nset = amx_sets(T), nd = amx_digits(T);
    for (size_t i = 0; i < ns; i++) {
        size_t s = s0 + i;
        const uint8_t *xq = (const uint8_t *)kern__q8k_qs(act, s);
        amx_pass(&P[i], 0, nset < 4 ? nset : 4, xq, xrow, cs, T);
        if (nset > 4) amx_pass(&P[i], 4, nset - 4, xq, xrow, cs, T);
        const __m512 d = _mm512_loadu_ps(P[i].d), dm = _mm512_loadu_ps(P[i].dmin);
        for (int t = 0; t < 16; t++) {
            __m512 dx = _mm512_set1_ps(kern__q8k_d(act + (size_t)t * xrow, s));
            acc[t] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(amx_a(cs, t, T)), _mm512_mul_ps(d, dx), acc[t]);
            if (kern__kq_has_min(T))
                acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cs[nd] + 16 * t)),
                                          _mm512_mul_ps(dm, dx), acc[t]);
        }
    }
}

AMX_INLINE void amx_matmul(const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow,
                           size_t n_in, size_t n_rows, size_t n_tok, float *y, size_t ldy,
                           const int T)
{
    if (!amx_configured) amx_configure();
    const size_t nsb = n_in / DX_QK_K, sl = amx_slice(T);
    _Alignas(64) amx_sb P[2];
    for (size_t o = 0; o < n_rows; o += 16) {
        const uint8_t *wo = w + o * wrow;
        for (size_t s0 = 0; s0 < nsb; s0 += sl) {
            size_t ns = nsb - s0 < sl ? nsb - s0 : sl;
            for (size_t i = 0; i < ns; i++) amx_prep(wo, wrow, s0 + i, &P[i], T);
            for (size_t t0 = 0; t0 < n_tok; t0 += 16) {
                float *yt = y + t0 * ldy + o;
                __m512 acc[16];
                for (int t = 0; t < 16; t++)
                    acc[t] = s0 ? _mm512_loadu_ps(yt + t * ldy) : _mm512_setzero_ps();
                amx_run(P, ns, s0, act + t0 * xrow, xrow, acc, T);
                for (int t = 0; t < 16; t++) _mm512_storeu_ps(yt + t * ldy, acc[t]);
            }
        }
    }
}

void kern__amx_matmul(int wtype, const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow,
                      size_t n_in, size_t n_rows, size_t n_tok, float *y, size_t ldy)
{
    DX_ASSERT(kern__amx_has(wtype) && n_rows % 16 == 0 && n_tok % 16 == 0);
    KERN__KQ_DISPATCH(wtype, amx_matmul, w, wrow, act, xrow, n_in, n_rows, n_tok, y, ldy);
}
