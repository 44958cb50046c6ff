/* kern_mm_priv: what kern_mm.c (entry points, the blocking driver, the
 * scalar reference) shares with the per-ISA matmul files and the scalar
 * twins of the block formats (kern_mm_blk.c).
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
 *       widened); a missing odd block has zero quants, corrections, scales.
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
 * one lane. */
#ifndef KERN_MM_PRIV_H
#define KERN_MM_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_dtype.h"

#define KERN__Q8_PAIR_BYTES 192

/* Activation layouts (above). */
enum { KERN_ACT_F32, KERN_ACT_BF16, KERN_ACT_Q8, KERN_ACT_KINDS };

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
static inline const int32_t *kern__q8_nc(const uint8_t *row, size_t b)
{
    return (const int32_t *)(row + (b / 2) * KERN__Q8_PAIR_BYTES + 64 + (b % 2) * 32);
}
static inline const float *kern__q8_d(const uint8_t *row, size_t b)
{
    return (const float *)(row + (b / 2) * KERN__Q8_PAIR_BYTES + 128 + (b % 2) * 32);
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

/* One weight type's tiles: by[mr] for a tile of mr tokens (1..isa mr), the
 * shapes the driver runs along a block's rows, widest first, the last one a
 * single row (so every row is covered). */
typedef struct {
    kern_mm_tile by[KERN_MM_MR_MAX + 1][KERN_MM_SHAPES];
} kern_mm_tiles;

/* One token row of activations into its kind's layout, bit-identical to the
 * scalar conversion; n_in as kern_act_bytes() accepts it. */
typedef void (*kern_mm_prep_fn)(const float *x, size_t n_in, void *row);

typedef struct {
    int mr;         /* tokens per tile, at most KERN_MM_MR_MAX */
    int block_rows; /* a block of weight rows is a multiple of this (a power of two) */
    const kern_mm_tiles *tiles[DX_DTYPE_ID_MAX]; /* by weight type */
    kern_mm_prep_fn prep[KERN_ACT_KINDS];        /* by activation kind; NULL: the scalar one */
} kern_mm_isa;

extern const kern_mm_isa kern_mm_isa_avx2;
extern const kern_mm_isa kern_mm_isa_avx512;

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

/* Scalar twins of the block formats (the arithmetic above): one output
 * element, weight row w (n_in elements) against a KERN_ACT_Q8 row x. */
float kern__dot_q4_0(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q4_1(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q5_0(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_q5_1(const uint8_t *w, const uint8_t *x, size_t n_in);
float kern__dot_iq4_nl(const uint8_t *w, const uint8_t *x, size_t n_in);

#endif
