/* kern_mm_priv: what kern_mm.c (entry points, the blocking driver, the
 * scalar reference) shares with the per-ISA matmul files and the scalar
 * twins of the block formats (kern_mm_blk.c) and of the super-block formats
 * (kern_mm_kq.c).
 *
 * The driver owns the loops (a block of weight rows sized for L2, swept by
 * every tile of up to `mr` tokens, whose activations stay in L1 while the
 * block's rows pass over them); an ISA supplies only its tile kernels and
 * activation preps through kern_mm_isa, and calls nothing in kern_mm.c.  A
 * tile computes each of its elements with one fixed instruction sequence
 * whatever the tile's shape (see the ISA files), so which tiles the driver
 * picks never changes a bit of the result (batch invariance, kern.h).
 *
 * Adding a weight type: its activation kind (one of the layouts below, or a
 * new one with its preps) in kern_mm.c's table with its scalar twin, and a
 * kern_mm_tiles for it in each ISA's table.  test_kern_mm checks that every
 * type dx_dtype_supported() lists has all of them.
 *
 * Prepared activations (the `act` buffer), one row per token, each row a
 * multiple of 64 bytes and zero-padded so kernels may load whole vectors,
 * by activation kind:
 *   KERN_ACT_F32 (F32/F16 weights):  f32[kern__act_k(n_in)]   (n_in rounded up to 32)
 *   KERN_ACT_BF16 (BF16 weights):    bf16[kern__act_k(n_in)]
 *   KERN_ACT_Q8 (every 32-block format: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL):
 *                    per pair of 32-blocks p (n_in/64 rounded up), 192 bytes:
 *                    int8 q[64], int32 negcorr[16], f32 d[16]
 *     q: the two blocks' quants as dx_f32_to_q8_0_row computes them;
 *     negcorr[j] = -128 * (q[4j] + .. + q[4j+3]), the correction that lets
 *       vpdpbusd multiply (w ^ 0x80) as unsigned by q as signed; the 4-bit
 *       formats shift it (-8 or -16 times the group's sum) and the _1 ones
 *       recover the group sums from it;
 *     d[0..7] = scale of block 2p, d[8..15] = scale of block 2p+1 (f16 value
 *       widened); a missing odd block has zero quants, corrections, scales;
 *   then, after the pairs, 8 bytes for each block b (zero-padded to a
 *   multiple of 64): int32 corr = -128 * (q[0] + .. + q[31]) and its f32
 *   scale d again, the whole-block terms the Q8_0 kernels read
 *   (kern_mm_q8_avx512.c, kern_mm_q8_avx2.c) without touching the pair's
 *   other two lines.
 *
 * Q8_0's arithmetic (its scalar twin in kern_mm.c, and every ISA's kernels
 * bit for bit): one f32 y starts at +0; for each block b in order, with i
 * the exact integer dot of the weight quants with the activation's and d_w
 * the weight block's f16 scale widened,
 *     y = fma((float)i, d_w * d_x, y).
 *
 * The block formats other than Q8_0 share one arithmetic, defined by their
 * scalar twins (kern_mm_blk.c) and reproduced bit for bit by every ISA's
 * tiles.  For an output element, four f32 partials p[0..3] start at +0; for
 * each block b in order, with w the weight block's integer values (q - 8,
 * q - 16, the codebook entry, or q for the _1 formats), x the activation's
 * quants, and group g = 0..3 the elements whose 4-bit fields lie in bytes
 * 4g..4g+3 of qs (elements 4g..4g+3 and 16+4g..16+4g+3):
 *     i_g  = sum over the group of w * x                 (int32, exact)
 *     p[g] = fma((float)i_g, d_w * d_x, p[g])
 *   and for Q4_1 / Q5_1 also, s_g the group's sum of x:
 *     p[g] = fma(d_x * (float)s_g, m_w, p[g])
 * and the element is (p0 + p2) + (p1 + p3).  Integer sums have no order;
 * the float steps are the same operations in the same order on every path,
 * so scalar, AVX2 and AVX-512 give identical bits (a vector lane holds one
 * p[g]).  The groups follow the packing: a 16-byte load of qs splits into
 * its low and high nibbles, and the integer sums of both halves meet in
 * one lane.
 *
 * The super-block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS; dx_kquant.h;
 * n_in % 256 == 0) consume KERN_ACT_Q8K rows, one 320-byte piece per
 * 256-element super-block (as GGML's q8_K, so one integer sum covers a
 * whole weight super-block):
 *   int8 q[256], int16 bsums[16], f32 d, 28 zero bytes
 *     d = amax / 127 over the super-block's 256 values (f32, not rounded to
 *     f16), q = lrint(x / d) as dx_f32_to_q8_0_row computes it (x * (1/d));
 *     bsums[j] = q[16j] + .. + q[16j + 15].
 * Their arithmetic is defined by their scalar twins (kern_mm_kq.c) and
 * reproduced bit for bit by every ISA's tiles.  For an output element, one
 * f32 y starts at +0; for each super-block in order, with v the weights'
 * integer values (Q2_K q 0..3; Q3_K q2 - (hbit ? 0 : 4); Q4_K q 0..15;
 * Q5_K q 0..31; Q6_K q - 32; IQ4_XS dx_iq4nl_values[q]), sc and m the
 * integer scale and minimum of each sub-block (Q2_K sc & 15, sc >> 4; Q3_K
 * sc - 32; Q4_K / Q5_K the 6-bit sc and m; Q6_K the int8 scale; IQ4_XS
 * ls - 32), x the activation quants, bs the sums of x over each sub-block
 * (bsums, two of them for a 32-element sub-block), and d, dmin the
 * super-block's f16 factors widened:
 *     A = sum over elements of sc * v * x                 (int32, exact)
 *     y = fma((float)A, d * d_x, y)
 *   and for the formats with a minimum (Q2_K, Q4_K, Q5_K):
 *     B = sum over sub-blocks of m * bs                    (int32, exact)
 *     y = fma((float)B, -(dmin * d_x), y)
 * (each product rounded to f32 before it enters the fma).  Integer sums
 * have no order, so a vector path may sum in any lanes it likes (an
 * offset stored in the weights, Q3_K's 4 and Q6_K's 32, comes back as the
 * exact integer offset * sum of sc * bs); only these float steps are
 * fixed, and they are the same on every path.  |A| < 2^28 for every
 * format (Q6_K: 16 sub-blocks * 128 * 32 * 127 * 16), so int32 holds it. */
#ifndef KERN_MM_PRIV_H
#define KERN_MM_PRIV_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/dx_dtype.h"

#define KERN__Q8_PAIR_BYTES 192
#define KERN__Q8K_BYTES     320 /* one super-block of a KERN_ACT_Q8K row */

/* Activation layouts (above). */
enum { KERN_ACT_F32, KERN_ACT_BF16, KERN_ACT_Q8, KERN_ACT_Q8K, KERN_ACT_KINDS };

static inline size_t kern__act_k(size_t n_in)
{
    return (n_in + 31) & ~(size_t)31;
}
static inline size_t kern__q8_pairs(size_t n_in)
{
    return (n_in + 63) / 64;
}
/* Block b of a KERN_ACT_Q8 row: its 32 quants, 8 negcorr values, 8 copies
 * of its scale (all 32-byte aligned when the row is 64-byte aligned). */
static inline const int8_t *kern__q8_qs(const uint8_t *row, size_t b)
{
    return (const int8_t *)(row + (b / 2) * KERN__Q8_PAIR_BYTES + (b % 2) * 32);
}
static inline const float *kern__q8_d(const uint8_t *row, size_t b)
{
    return (const float *)(row + (b / 2) * KERN__Q8_PAIR_BYTES + 128 + (b % 2) * 32);
}
/* Super-block sb of a KERN_ACT_Q8K row: its quants, bsums, scale. */
static inline const int8_t *kern__q8k_qs(const uint8_t *row, size_t sb)
{
    return (const int8_t *)(row + sb * KERN__Q8K_BYTES);
}
static inline const int16_t *kern__q8k_bs(const uint8_t *row, size_t sb)
{
    return (const int16_t *)(row + sb * KERN__Q8K_BYTES + 256);
}
static inline float kern__q8k_d(const uint8_t *row, size_t sb)
{
    float d;
    memcpy(&d, row + sb * KERN__Q8K_BYTES + 288, 4);
    return d;
}
/* A KERN_ACT_Q8 row's per-block tail (above): where it starts, and the
 * whole row's bytes. */
static inline size_t kern__q8_tail_off(size_t n_in)
{
    return kern__q8_pairs(n_in) * KERN__Q8_PAIR_BYTES;
}
static inline size_t kern__q8_row_bytes(size_t n_in)
{
    return kern__q8_tail_off(n_in) + ((n_in / 32 * 8 + 63) & ~(size_t)63);
}
/* Zeroes the missing second block of the last pair when n_in/32 is odd. */
static inline void kern__q8_clear_odd(uint8_t *row, size_t n_in)
{
    size_t nb = n_in / 32;
    if (!(nb & 1)) return;
    uint8_t *pair = row + (nb / 2) * KERN__Q8_PAIR_BYTES;
    for (int part = 0; part < 3; part++)
        for (int i = 32; i < 64; i++) pair[part * 64 + i] = 0;
}
/* Every tile kernel: MR tokens from x (rows xrow bytes apart) times NR weight
 * rows from w (wrow bytes apart) into y[t*ldy + o]; n_in elements each. */
#define KERN_MM_TILE_ARGS                                                                          \
    const uint8_t *w, size_t wrow, const uint8_t *x, size_t xrow, size_t n_in, float *y, size_t ldy
typedef void (*kern_mm_tile_fn)(KERN_MM_TILE_ARGS);

#define KERN_MM_MR_MAX 4 /* most tokens per tile, any ISA */
#define KERN_MM_SHAPES 3 /* most row-tile shapes per token count */

typedef struct {
    kern_mm_tile_fn fn; /* NULL: the end of the list */
    int nr;             /* weight rows per call */
} kern_mm_tile;

/* One weight type's tiles: by[m] for a tile of m tokens (1..mr, or 1..the
 * ISA's mr where mr is 0), the shapes the driver runs along a block's rows,
 * widest first, the last one a single row (so every row is covered). */
typedef struct {
    kern_mm_tile by[KERN_MM_MR_MAX + 1][KERN_MM_SHAPES];
    int mr;
} kern_mm_tiles;

/* One token row of activations into its kind's layout, bit-identical to the
 * scalar conversion; n_in as kern_act_bytes() accepts it. */
typedef void (*kern_mm_prep_fn)(const float *x, size_t n_in, void *row);

typedef struct {
    int mr;         /* tokens per tile, at most KERN_MM_MR_MAX */
    int block_rows; /* a block of weight rows is a multiple of this (a power of two) */
    const kern_mm_tiles *tiles[DX_DTYPE_ID_MAX]; /* by weight type */
    /* a lone token's tiles (decode: their by[1]) where they are not tiles[]'s */
    const kern_mm_tiles *decode[DX_DTYPE_ID_MAX];
    kern_mm_prep_fn prep[KERN_ACT_KINDS]; /* by activation kind; NULL: the scalar one */
} kern_mm_isa;

extern const kern_mm_isa kern_mm_isa_avx2;
extern const kern_mm_isa kern_mm_isa_avx512;
/* The AVX-512 BF16 tiles on vdpbf16ps (KERN_BF16_DPBF16: the table's own
 * are KERN_BF16_FMA's). */
extern const kern_mm_tiles *const kern__avx512_bf16dp_tiles;

/* The super-block formats' tiles and KERN_ACT_Q8K prep (kern_mm_avx2.c),
 * which the AVX-512 table uses too, for 2-7 tokens (one token has the
 * decode tiles below, 8 and more kern__kq512_matmul). */
extern const kern_mm_tiles kern__avx2_q2_k_tiles, kern__avx2_q3_k_tiles, kern__avx2_q4_k_tiles,
    kern__avx2_q5_k_tiles, kern__avx2_q6_k_tiles, kern__avx2_iq4_xs_tiles;
void kern__avx2_q8k_prep(const float *x, size_t n_in, void *row);

/* The AVX-512 decode tiles of the super-block formats
 * (kern_mm_kqd_avx512.c): one token, 8, 4 or 1 rows. */
extern const kern_mm_tiles kern__avx512_q2_k_decode, kern__avx512_q3_k_decode,
    kern__avx512_q4_k_decode, kern__avx512_q5_k_decode, kern__avx512_q6_k_decode,
    kern__avx512_iq4_xs_decode;
#define KERN__AVX2_KQ_TILES                                                                        \
    [DX_Q2_K] = &kern__avx2_q2_k_tiles, [DX_Q3_K] = &kern__avx2_q3_k_tiles,                        \
    [DX_Q4_K] = &kern__avx2_q4_k_tiles, [DX_Q5_K] = &kern__avx2_q5_k_tiles,                        \
    [DX_Q6_K] = &kern__avx2_q6_k_tiles, [DX_IQ4_XS] = &kern__avx2_iq4_xs_tiles

/* The AMX kernels (kern_mm_amx.c), for KERN_AMX: whether wtype has one,
 * and the matmul of whole groups, n_rows (a multiple of 16) weight rows
 * from w against n_tok (a multiple of 16) prepared token rows from act,
 * into y[t*ldy + o] for o < n_rows: the bits the tiles give. */
static inline int kern__amx_has(int wtype)
{
    return dx_dtype_block_elems(wtype) == DX_QK_K; /* every super-block format */
}
void kern__amx_matmul(int wtype, const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow,
                      size_t n_in, size_t n_rows, size_t n_tok, float *y, size_t ldy);

/* FN(..., T) with T the super-block format wtype is as a constant, so that
 * a kernel written for all six is compiled once per format with its layout
 * known (the AMX and AVX-512 prefill kernels). */
#define KERN__KQ_DISPATCH(wtype, FN, ...)                                                          \
    do {                                                                                           \
        switch (wtype) {                                                                           \
        case DX_Q2_K:                                                                              \
            FN(__VA_ARGS__, DX_Q2_K);                                                              \
            break;                                                                                 \
        case DX_Q3_K:                                                                              \
            FN(__VA_ARGS__, DX_Q3_K);                                                              \
            break;                                                                                 \
        case DX_Q4_K:                                                                              \
            FN(__VA_ARGS__, DX_Q4_K);                                                              \
            break;                                                                                 \
        case DX_Q5_K:                                                                              \
            FN(__VA_ARGS__, DX_Q5_K);                                                              \
            break;                                                                                 \
        case DX_Q6_K:                                                                              \
            FN(__VA_ARGS__, DX_Q6_K);                                                              \
            break;                                                                                 \
        default:                                                                                   \
            FN(__VA_ARGS__, DX_IQ4_XS);                                                            \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* The AVX-512 VNNI prefill kernels of the super-block formats
 * (kern_mm_kq_avx512.c), for KERN_AVX512 and KERN_AMX: n_rows (a multiple
 * of 16) weight rows from w against any n_tok prepared token rows from act,
 * into y[t*ldy + o] for o < n_rows: the bits the tiles give.  Worth it from
 * KERN__KQ512_MIN_TOK tokens (a super-block of 16 rows is transposed once
 * for all of them); below that, the tiles. */
#define KERN__KQ512_MIN_TOK 8
void kern__kq512_matmul(int wtype, const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow,
                        size_t n_in, size_t n_rows, size_t n_tok, float *y, size_t ldy);

/* The AVX-512 VNNI matmul of Q8_0 (kern_mm_q8_avx512.c), for KERN_AVX512
 * and KERN_AMX, every token count (a lone token too): n_rows (a multiple of
 * 16) weight rows from w against n_tok prepared token rows from act, into
 * y[t*ldy + o] for o < n_rows, with Q8_0's arithmetic above; the Q8_0
 * tiles take the rows past the last group, with the same bits. */
void kern__q8512_matmul(const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow, size_t n_in,
                        size_t n_rows, size_t n_tok, float *y, size_t ldy);
/* The same on AVX2 (kern_mm_q8_avx2.c), for KERN_AVX2: n_rows a multiple
 * of 8, the same bits. */
void kern__q8avx2_matmul(const uint8_t *w, size_t wrow, const uint8_t *act, size_t xrow,
                         size_t n_in, size_t n_rows, size_t n_tok, float *y, size_t ldy);

/* Where a block format's parts lie (GGML's layouts, dx_quant.h): block
 * bytes, the offset of qs, whether it has m (the _1 formats) and qh (the
 * 5-bit ones, 4 bytes before qs).  Constants once inlined with T known. */
static inline size_t kern__blk_bytes(int T)
{
    return T == DX_Q4_1 ? 20 : T == DX_Q5_0 ? 22 : T == DX_Q5_1 ? 24 : 18;
}
static inline size_t kern__blk_qs(int T)
{
    return T == DX_Q4_1 ? 4 : T == DX_Q5_0 ? 6 : T == DX_Q5_1 ? 8 : 2;
}
static inline int kern__blk_has_m(int T)
{
    return T == DX_Q4_1 || T == DX_Q5_1;
}
static inline int kern__blk_5bit(int T)
{
    return T == DX_Q5_0 || T == DX_Q5_1;
}

/* ---- the super-block formats (dx_kquant.h) ----
 * Which they are and where their parts lie, for the twins and the tiles:
 * the block bytes, whether the format has a minimum, and the offset of a weight the
 * tiles read unsigned (vpmaddubsw's unsigned operand): Q6_K q (0..63,
 * v = q - 32), Q3_K q2 + 4 hbit (0..7, v = that - 4); 0: none (the
 * weights are their own unsigned values, or IQ4_XS's signed ones). */
static inline size_t kern__kq_bytes(int T)
{
    return T == DX_Q2_K   ? sizeof(dx_block_q2_k)
           : T == DX_Q3_K ? sizeof(dx_block_q3_k)
           : T == DX_Q4_K ? sizeof(dx_block_q4_k)
           : T == DX_Q5_K ? sizeof(dx_block_q5_k)
           : T == DX_Q6_K ? sizeof(dx_block_q6_k)
                          : sizeof(dx_block_iq4_xs);
}
static inline int kern__kq_has_min(int T)
{
    return T == DX_Q2_K || T == DX_Q4_K || T == DX_Q5_K;
}
static inline int kern__kq_offset(int T)
{
    return T == DX_Q6_K ? 32 : T == DX_Q3_K ? 4 : 0;
}
/* Where a super-block's f16 d lies (dmin, where there is one, follows it). */
static inline size_t kern__kq_d_offset(int T)
{
    return T == DX_Q2_K   ? offsetof(dx_block_q2_k, d)
           : T == DX_Q3_K ? offsetof(dx_block_q3_k, d)
           : T == DX_Q6_K ? offsetof(dx_block_q6_k, d)
                          : 0; /* Q4_K, Q5_K, IQ4_XS */
}

/* Scalar twins of the block and super-block formats (the arithmetic
 * above): one output element, weight row w (n_in elements) against a
 * KERN_ACT_Q8 (KERN_ACT_Q8K) row x. */
float kern__dot_q4_0(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q4_1(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q5_0(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q5_1(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_iq4_nl(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q2_k(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q3_k(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q4_k(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q5_k(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q6_k(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_iq4_xs(const uint8_t *w, const uint8_t *x, size_t n_in);
/* The scalar KERN_ACT_Q8K prep: n_in % 256 == 0. */
void kern__q8k_prep_scalar(const float *x, size_t n_in, void *row);

#endif
