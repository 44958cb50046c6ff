/* kern_mm_priv: what kern_mm.c and its per-ISA files share: the layout of
 * prepared activations and the per-ISA entry points.
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
/* Bytes per token row of prepared activations; 0 for an unknown type. */
size_t kern__act_row_bytes(int wtype, size_t n_in);

/* Q8_0 prep of one token row (n_in % 32 == 0) into the layout above. */
void kern__q8_prep_row_scalar(const float *x, size_t n_in, uint8_t *row);
void kern__q8_prep_row_avx2(const float *x, size_t n_in, uint8_t *row);
void kern__q8_prep_row_avx512(const float *x, size_t n_in, uint8_t *row);
void kern__bf16_prep_row_avx512(const float *x, size_t n_in, uint16_t *row);

void kern__matmul_avx2(int wtype, const void *w, size_t n_in, size_t o0, size_t o1, const void *act,
                       size_t n_tok, float *y, size_t ldy);
void kern__matmul_avx512(int wtype, const void *w, size_t n_in, size_t o0, size_t o1,
                         const void *act, size_t n_tok, float *y, size_t ldy);

#endif
