/* kern_mm_amx: Q4_K prefill matmuls on the AMX tile unit (TDPBSUD: 16x16
 * int32 sums of 64 int8 x uint8 products a row), for the driver in
 * kern_mm.c, which hands it whole groups of 16 tokens x 16 weight rows and
 * runs the rest through the AVX-512 tiles.
 *
 * The arithmetic is the super-block formats' of kern_mm_priv.h, bit for bit:
 * per super-block the integer sums A = sum sc * v * x and B = sum m * bs are
 * exact whatever unit adds them, and the two float steps per element are
 * the scalar twin's.  A tile multiplies bytes, and sc * v (a 6-bit scale
 * times a 4-bit weight) does not fit one, so the scale goes in as two
 * digits: sc = 8 sh + sl with sh, sl in 0..7, and A = C_lo + 8 C_hi where
 * C_lo sums (sl * v) * x and C_hi (sh * v) * x (each product at most 105).
 * B is a third tile product: weights that are the sub-block's minimum
 * itself, m at every element, give sum m * x = sum m * bs.
 *
 * The tiles: A operands are 16 tokens' activation quants, 64 a row, loaded
 * straight from the KERN_ACT_Q8K rows (the row pitch is the tile's stride);
 * B operands are 16 weight rows' 64 elements in the tile unit's layout (row
 * k of the tile holds elements 4k..4k+3 of every weight row, 4 bytes a
 * row).  Those are prepared once per 16 weight rows and AMX_SB super-blocks
 * and then serve every group of 16 tokens: the raw 4-bit fields are
 * transposed 4 bytes at a time, the nibbles split, and each digit's
 * product looked up (vpermi2b over a 128-byte table of s * v).
 *
 * Tile state is per thread: each thread loads the configuration the first
 * time it runs here and keeps it (nothing else in the process uses the
 * tiles). */
#include <immintrin.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern_mm_priv.h"
#include "engine/kern/kern_mm_x86.h"

#define AMX_INLINE static inline __attribute__((always_inline))
#define AMX_SB     2 /* super-blocks a prepared slice: 24 KiB, within L1 with the tokens' */

/* One super-block of 16 weight rows, ready for the tiles: for each 64-element
 * chunk c, the B operands of the low digit, the high digit and the
 * minimum; the rows' d and dmin widened. */
typedef struct {
    uint8_t lo[4][1024], hi[4][1024], mn[4][1024];
    float d[16], dmin[16];
} amx_sb;

/* Palette 1: tiles 0-2 the sums (16 tokens x 16 rows of int32), 3 the
 * tokens' quants, 4-6 the weights; all 16 rows of 64 bytes. */
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
    for (int i = 0; i < 7; i++) c.colsb[i] = 64, c.rows[i] = 16;
    _tile_loadconfig(&c);
    amx_configured = 1;
}

/* in[p] holds rows p and p + 8 (their 8 dwords each, one per 256-bit
 * half); out[k] gets dword k of every row, row o in lane o. */
AMX_INLINE void amx_transpose16x8(const __m512i *in, __m512i *out)
{
    __m512i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) { /* rows 0-3 (and 8-11), then 4-7 (and 12-15) */
        __m512i *a = t + 4 * h, *b = u + 4 * h;
        b[0] = _mm512_unpacklo_epi64(a[0], a[2]);
        b[1] = _mm512_unpackhi_epi64(a[0], a[2]);
        b[2] = _mm512_unpacklo_epi64(a[1], a[3]);
        b[3] = _mm512_unpackhi_epi64(a[1], a[3]);
    }
    /* u[d] lane L holds rows 0-3's dword d + 4L' (L = 2 half + L'), u[d + 4] rows 4-7's */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int d = 0; d < 4; d++) {
        out[d] = _mm512_permutex2var_epi64(u[d], lo, u[d + 4]);
        out[d + 4] = _mm512_permutex2var_epi64(u[d], hi, u[d + 4]);
    }
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

/* Super-block s of the 16 rows at w (wrow apart) into P. */
static void amx_prep_q4k(const uint8_t *w, size_t wrow, size_t s, amx_sb *P)
{
    const uint8_t *b[16];
    for (int o = 0; o < 16; o++) b[o] = w + (size_t)o * wrow + s * sizeof(dx_block_q4_k);
    /* scales and minimums, row o in bytes 16o..16o+15 (sc 0-7, m 0-7) */
    _Alignas(64) uint8_t st8[256];
    uint16_t dh[16], mh[16];
    for (int o = 0; o < 16; o++) {
        _mm_store_si128((__m128i *)(st8 + 16 * o), kern__k4_scales_v(b[o]));
        memcpy(&dh[o], b[o] + offsetof(dx_block_q4_k, d), 2);
        memcpy(&mh[o], b[o] + offsetof(dx_block_q4_k, dmin), 2);
    }
    _mm512_storeu_ps(P->d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh)));
    _mm512_storeu_ps(P->dmin, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh)));
    __m512i st[4];
    for (int i = 0; i < 4; i++) st[i] = _mm512_load_si512(st8 + 64 * i);
    /* prod[16 s + v] = s * v for the digits s 0..7 and the weights v 0..15 */
    _Alignas(64) uint8_t prod[128];
    for (int i = 0; i < 128; i++) prod[i] = (uint8_t)((i >> 4) * (i & 15));
    const __m512i p0 = _mm512_load_si512(prod), p1 = _mm512_load_si512(prod + 64);
    const __m512i m4 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(7);
    const __m512i hi4 = _mm512_set1_epi8((char)0xf0);
    for (int c = 0; c < 4; c++) {
        __m512i raw[8], r[8];
        for (int p = 0; p < 8; p++)
            raw[p] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(
                    (const __m256i *)(b[p] + offsetof(dx_block_q4_k, qs) + 32 * c))),
                _mm256_loadu_si256(
                    (const __m256i *)(b[p + 8] + offsetof(dx_block_q4_k, qs) + 32 * c)),
                1);
        amx_transpose16x8(raw, r);
        for (int h = 0; h < 2; h++) { /* sub-block 2c + h: the low nibbles, then the high */
            __m512i sc = amx_spread(st, 2 * c + h), mn = amx_spread(st, 8 + 2 * c + h);
            __m512i sl = _mm512_and_si512(_mm512_slli_epi16(sc, 4), hi4);
            __m512i sh = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(sc, 3), m3), 4);
            for (int k = 0; k < 8; k++) {
                __m512i v = _mm512_and_si512(h ? _mm512_srli_epi16(r[k], 4) : r[k], m4);
                size_t row = 64 * (size_t)(8 * h + k);
                _mm512_store_si512(P->lo[c] + row,
                                   _mm512_permutex2var_epi8(p0, _mm512_or_si512(v, sl), p1));
                _mm512_store_si512(P->hi[c] + row,
                                   _mm512_permutex2var_epi8(p0, _mm512_or_si512(v, sh), p1));
                _mm512_store_si512(P->mn[c] + row, mn);
            }
        }
    }
}

/* 16 tokens (act, xrow apart) against the prepared super-blocks P[0..ns)
 * (super-blocks s0.. of the rows), added to acc[t] (row o in lane o). */
static void amx_run(const amx_sb *P, size_t ns, size_t s0, const uint8_t *act, size_t xrow,
                    __m512 *acc)
{
    _Alignas(64) int32_t c0[256], c1[256], c2[256];
    for (size_t i = 0; i < ns; i++) {
        size_t s = s0 + i;
        const uint8_t *xq = (const uint8_t *)kern__q8k_qs(act, s);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        for (int c = 0; c < 4; c++) {
            _tile_loadd(3, xq + 64 * c, xrow);
            _tile_loadd(4, P[i].lo[c], 64);
            _tile_dpbsud(0, 3, 4);
            _tile_loadd(5, P[i].hi[c], 64);
            _tile_dpbsud(1, 3, 5);
            _tile_loadd(6, P[i].mn[c], 64);
            _tile_dpbsud(2, 3, 6);
        }
        _tile_stored(0, c0, 64);
        _tile_stored(1, c1, 64);
        _tile_stored(2, c2, 64);
        const __m512 d = _mm512_loadu_ps(P[i].d), dm = _mm512_loadu_ps(P[i].dmin);
        for (int t = 0; t < 16; t++) {
            __m512 dx = _mm512_set1_ps(kern__q8k_d(act + (size_t)t * xrow, s));
            __m512i a = _mm512_add_epi32(_mm512_load_si512(c0 + 16 * t),
                                         _mm512_slli_epi32(_mm512_load_si512(c1 + 16 * t), 3));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(d, dx), acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c2 + 16 * t)),
                                      _mm512_mul_ps(dm, dx), acc[t]);
        }
    }
}

void kern__amx_matmul(int wtype, const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow,
                      size_t n_in, size_t n_rows, size_t n_tok, float *y, size_t ldy)
{
    DX_ASSERT(wtype == DX_Q4_K && n_rows % 16 == 0 && n_tok % 16 == 0);
    if (!amx_configured) amx_configure();
    const size_t nsb = n_in / DX_QK_K;
    _Alignas(64) amx_sb P[AMX_SB];
    for (size_t o = 0; o < n_rows; o += 16) {
        const uint8_t *wo = w + o * wrow;
        for (size_t s0 = 0; s0 < nsb; s0 += AMX_SB) {
            size_t ns = nsb - s0 < AMX_SB ? nsb - s0 : AMX_SB;
            for (size_t i = 0; i < ns; i++) amx_prep_q4k(wo, wrow, s0 + i, &P[i]);
            for (size_t t0 = 0; t0 < n_tok; t0 += 16) {
                float *yt = y + t0 * ldy + o;
                __m512 acc[16];
                for (int t = 0; t < 16; t++)
                    acc[t] = s0 ? _mm512_loadu_ps(yt + t * ldy) : _mm512_setzero_ps();
                amx_run(P, ns, s0, act + t0 * xrow, xrow, acc);
                for (int t = 0; t < 16; t++) _mm512_storeu_ps(yt + t * ldy, acc[t]);
            }
        }
    }
}
