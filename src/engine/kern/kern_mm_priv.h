/* kern_mm_priv: what kern_mm.c (entry points, the blocking driver, the
 * scalar reference) shares with the per-ISA matmul files.
 *
 * The driver owns the loops (a block of weight rows sized for L2, swept by
 * every tile of up to `mr` tokens, whose activations stay in L1 while the
 * block's rows pass over them); an ISA supplies only its tile kernels and
 * activation preps through kern_mm_isa, and calls nothing in kern_mm.c.  A
 * tile computes each of its elements with one fixed instruction sequence
 * whatever the tile's shape (see the ISA files), so which tiles the driver
 * picks never changes a bit of the result (batch invariance, kern.h).
 *
 * Prepared activations (the `act` buffer), one row per token, each row a
 * multiple of 64 bytes and zero-padded so kernels may load whole vectors:
 *   F32/F16 weights: f32[kern__act_k(n_in)]              (n_in rounded up to 32)
 *   BF16 weights:    bf16[kern__act_k(n_in)]
 *   Q8_0 weights:    per pair of 32-blocks p (n_in/64 rounded up), 192 bytes:
 *                    int8 q[64], int32 negcorr[16], f32 d[16]
 *     q: the two blocks' quants as dx_f32_to_q8_0_row computes them;
 *     negcorr[j] = -128 * (q[4j] + .. + q[4j+3]), the correction that lets
 *       vpdpbusd multiply (w ^ 0x80) as unsigned by q as signed;
 *     d[0..7] = scale of block 2p, d[8..15] = scale of block 2p+1 (f16 value
 *       widened); a missing odd block has zero quants, corrections, scales. */
#ifndef KERN_MM_PRIV_H
#define KERN_MM_PRIV_H

#include <stddef.h>
#include <stdint.h>

#define KERN__Q8_PAIR_BYTES 192

static inline size_t kern__act_k(size_t n_in)
{
    return (n_in + 31) & ~(size_t)31;
}
static inline size_t kern__q8_pairs(size_t n_in)
{
    return (n_in + 63) / 64;
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

typedef struct {
    int mr;         /* tokens per tile, at most KERN_MM_MR_MAX */
    int block_rows; /* a block of weight rows is a multiple of this (a power of two) */
    const kern_mm_tiles *f32, *f16, *bf16, *q8;
    /* One token row of activations into the layout above, bit-identical to
     * the scalar conversions; NULL: the scalar one. */
    void (*bf16_prep)(const float *x, size_t n_in, uint16_t *row);
    void (*q8_prep)(const float *x, size_t n_in, uint8_t *row); /* n_in % 32 == 0 */
} kern_mm_isa;

extern const kern_mm_isa kern_mm_isa_avx2;
extern const kern_mm_isa kern_mm_isa_avx512;

#endif
