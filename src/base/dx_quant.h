/* dx_quant: GGML's block-quantised weight formats, byte for byte as GGUF
 * files hold them, with the scalar dequantisation that defines each value
 * and a deterministic quantiser (llama.cpp's reference rules, written
 * afresh).
 *
 * Every format here has blocks of 32 elements.  In a 4-bit format byte j of
 * qs holds element j in its low nibble and element j + 16 in its high one;
 * the 5-bit formats add bit 4 of element i as bit i of the little-endian
 * 32-bit qh.  Scales are IEEE f16.
 *
 *   Q8_0   (34 bytes)  d, int8 q[32]            x = d * q
 *   Q4_0   (18 bytes)  d, qs[16]                x = d * (q - 8),   q in 0..15
 *   Q4_1   (20 bytes)  d, m, qs[16]             x = d * q + m,     q in 0..15
 *   Q5_0   (22 bytes)  d, qh[4], qs[16]         x = d * (q - 16),  q in 0..31
 *   Q5_1   (24 bytes)  d, m, qh[4], qs[16]      x = d * q + m,     q in 0..31
 *   IQ4_NL (18 bytes)  d, qs[16]                x = d * dx_iq4nl_values[q]
 *
 * A dequantised value is computed in f32 exactly as written (d * q, then
 * + m for the _1 formats, two roundings), which is what ggml computes.
 *
 * Quantisers (n a multiple of 32; inputs finite):
 *   Q8_0: d = max|x| / 127, q = round-half-even(x / d).
 *   Q4_0 / Q5_0: d = -M / 8 (-M / 16), M the element of largest magnitude
 *     (the first such), q = min(15, trunc(x / d + 8.5)) (31, + 16.5).
 *   Q4_1 / Q5_1: d = (max - min) / 15 (31), m = min,
 *     q = min(15, trunc((x - min) / d + 0.5)) (31).
 *   IQ4_NL: llama-quantize's search without an importance matrix: weights
 *     x^2, the scale of least weighted error among -M/127 refined by least
 *     squares and 15 trial grids (M / (t - 127), t = -7..7), then each
 *     element the nearest codebook entry for the chosen f16 scale.
 * Each divides by d as a multiplication by 1/d, as llama.cpp does, and all
 * arithmetic is plain f32 (no contraction), so a row always gives the same
 * bytes. */
#ifndef DX_QUANT_H
#define DX_QUANT_H

#include <stddef.h>
#include <stdint.h>

#define DX_QK    32 /* elements per block of every format here */
#define DX_QK8_0 DX_QK

typedef struct {
    uint16_t d; /* f16 scale */
    int8_t qs[DX_QK];
} dx_block_q8_0;

typedef struct {
    uint16_t d;
    uint8_t qs[DX_QK / 2];
} dx_block_q4_0;

typedef struct {
    uint16_t d, m; /* f16 scale and minimum */
    uint8_t qs[DX_QK / 2];
} dx_block_q4_1;

typedef struct {
    uint16_t d;
    uint8_t qh[4]; /* bit i: bit 4 of element i */
    uint8_t qs[DX_QK / 2];
} dx_block_q5_0;

typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[DX_QK / 2];
} dx_block_q5_1;

typedef struct {
    uint16_t d;
    uint8_t qs[DX_QK / 2]; /* indexes into dx_iq4nl_values */
} dx_block_iq4_nl;

_Static_assert(sizeof(dx_block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(dx_block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(dx_block_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(dx_block_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(dx_block_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(dx_block_iq4_nl) == 18, "iq4_nl block");

/* IQ4_NL's non-linear codebook (ascending). */
extern const int8_t dx_iq4nl_values[16];

/* Rows of n elements (n % 32 == 0): src blocks -> f32, and f32 -> blocks. */
void dx_q8_0_to_f32_row(const dx_block_q8_0 *src, float *dst, size_t n);
void dx_f32_to_q8_0_row(const float *src, dx_block_q8_0 *dst, size_t n);
void dx_q4_0_to_f32_row(const dx_block_q4_0 *src, float *dst, size_t n);
void dx_f32_to_q4_0_row(const float *src, dx_block_q4_0 *dst, size_t n);
void dx_q4_1_to_f32_row(const dx_block_q4_1 *src, float *dst, size_t n);
void dx_f32_to_q4_1_row(const float *src, dx_block_q4_1 *dst, size_t n);
void dx_q5_0_to_f32_row(const dx_block_q5_0 *src, float *dst, size_t n);
void dx_f32_to_q5_0_row(const float *src, dx_block_q5_0 *dst, size_t n);
void dx_q5_1_to_f32_row(const dx_block_q5_1 *src, float *dst, size_t n);
void dx_f32_to_q5_1_row(const float *src, dx_block_q5_1 *dst, size_t n);
void dx_iq4_nl_to_f32_row(const dx_block_iq4_nl *src, float *dst, size_t n);
void dx_f32_to_iq4_nl_row(const float *src, dx_block_iq4_nl *dst, size_t n);

#endif
