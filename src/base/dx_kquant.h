/* dx_kquant: GGML's super-block formats ("K-quants" and IQ4_XS), byte for
 * byte as GGUF files hold them, with the scalar dequantisation that defines
 * each value and a deterministic quantiser (llama-quantize's reference
 * rules without an importance matrix, written afresh).
 *
 * Every format here has super-blocks of 256 elements split into sub-blocks
 * of 16 or 32 that each carry a small integer scale (and for the _K formats
 * with a minimum, an integer minimum) relative to the super-block's f16 d
 * (and dmin):
 *
 *   Q2_K   (84 bytes)  scales[16], qs[64], d, dmin     16 x 16, 2-bit q
 *       x = (d * (sc & 15)) * q - (dmin * (sc >> 4))
 *   Q3_K  (110 bytes)  hmask[32], qs[64], scales[12], d   16 x 16, 3-bit q
 *       x = (d * (sc - 32)) * (q2 - (hbit ? 0 : 4)), sc 6-bit
 *   Q4_K  (144 bytes)  d, dmin, scales[12], qs[128]    8 x 32, 4-bit q
 *       x = (d * sc) * q - (dmin * m), sc and m 6-bit
 *   Q5_K  (176 bytes)  d, dmin, scales[12], qh[32], qs[128]   8 x 32, 5-bit
 *   Q6_K  (210 bytes)  ql[128], qh[64], scales[16] (int8), d   16 x 16, 6-bit
 *       x = (d * sc) * (q - 32)
 *   IQ4_XS (136 bytes) d, scales_h, scales_l[4], qs[128]   8 x 32
 *       x = (d * (ls - 32)) * dx_iq4nl_values[q], ls 6-bit
 *
 * Where each element's bits lie (sub-block s, element i of the super-block;
 * dx_kquant.c decodes them one way, the kernels' scalar twins another, and
 * the tests hold the two together):
 *   Q2_K / Q3_K: 128-element halves n; within a half, element j of the 32
 *     elements 32k..32k+31 is bits 2k..2k+1 of qs[32n + j]; Q3_K's high bit
 *     is bit (4n + k) of hmask[j].  Sub-block s = i / 16.
 *   Q4_K / Q5_K: 64-element chunks c; element j < 32 of a chunk is the low
 *     nibble of qs[32c + j], element 32 + j its high nibble; Q5_K's bit 4
 *     of element i is bit (2c + (j >= 32)) of qh[j % 32].  The 6-bit scale
 *     and minimum of sub-block s (0..7) are packed in scales[12] as GGML's
 *     get_scale_min_k4 reads them (dx_k4_scale_min).
 *   Q3_K's 16 6-bit scales: the low 4 bits of scale s are the low nibble
 *     of scales[s] for s < 8, the high nibble of scales[s - 8] after; the
 *     high 2 bits are bits 2 * (s / 4) .. +1 of scales[8 + s % 4].
 *   Q6_K: 128-element halves n; for l < 32 elements l, l+32, l+64, l+96 of
 *     the half take ql[64n + l] low, ql[64n + l + 32] low, ql[64n + l] high,
 *     ql[64n + l + 32] high nibbles and bits 0-1, 2-3, 4-5, 6-7 of
 *     qh[32n + l] as bits 4-5; scale of sub-block s is scales[s].
 *   IQ4_XS: sub-block s of 32 is qs[16s .. 16s+15], element j < 16 the low
 *     nibble of byte j, 16 + j its high one (IQ4_NL's packing); ls of s is
 *     nibble s % 2 of scales_l[s / 2] | bits 2s..2s+1 of scales_h << 4.
 *
 * A dequantised value is computed in f32 as written: the sub-block's scale
 * (and minimum) products first, each rounded, then times q (minus the
 * minimum, rounded again), which is what ggml's dequantize_row_* compute.
 *
 * Quantisers (n a multiple of 256; inputs finite), llama.cpp's _ref rules,
 * which `llama-quantize` without an importance matrix runs.  Each finds a
 * float scale (and minimum) per sub-block, stores those as integer
 * multiples of the super-block's f16 d (and dmin), then requantises every
 * element on the grid actually stored (a sub-block whose stored scale is 0
 * keeps its first quants):
 *   Q2_K / Q4_K / Q5_K: per sub-block x ~ scale * q - min, q in 0..nmax (3,
 *     15, 31), min >= 0: the min-max grid, then trial grids (nmax + rmin +
 *     0.1 k) / (max - min), k = 0..15 (Q4_K: 0..20), each refitted by
 *     weighted least squares, kept when the weighted error (Q2_K: |e| with
 *     weights |x|; Q4_K, Q5_K: e^2 with weights rms + |x|) drops; rmin
 *     -0.5 (Q4_K -1).  d = S / 15 (Q4_K, Q5_K: / 63) for S the largest
 *     scale, dmin likewise from the largest minimum; each sub-block's
 *     scale round(15 * scale / S) in 4 bits (63 *, 6 bits), minimum alike.
 *   Q3_K: per 16, q in -4..3 on the grid -M/4 (M the element of largest
 *     magnitude), then up to 5 passes moving single elements while the fit
 *     sumlx^2 / suml2 (weights x^2) improves; d = -S/32 (S the sub-block
 *     scale of largest magnitude), scales in -32..31.
 *   Q6_K: per 16, q in -32..31: least squares (weights x^2) on the grid
 *     -M/32, then on -(32 + 0.1 k)/M, k = -9..9 but 0, kept when better;
 *     d = -S/128, int8 scales round(scale / d) capped at 127.
 *   IQ4_XS: per 32, IQ4_NL's search (dx_quant.h); d = -S/32, 6-bit scales
 *     -32..31, then each element the nearest codebook entry for its
 *     scale; an all-zero super-block gets d = -0 as in llama.cpp.
 * Rounding is llama.cpp's nearest_int (half to even), its divisions stay
 * divisions, and all arithmetic is plain f32 in llama.cpp's order with no
 * contraction, so the bytes are ggml_quantize_chunk's as an x86-64
 * ggml-base (no FMA) writes them.  A ggml built to contract a * b + c into
 * FMA (gcc's default in GNU C where the target has FMA: -march=native,
 * arm64) differs in a few to a third of the super-blocks. */
#ifndef DX_KQUANT_H
#define DX_KQUANT_H

#include <stddef.h>
#include <stdint.h>

#define DX_QK_K 256 /* elements per super-block */

typedef struct {
    uint8_t scales[16]; /* low nibble: scale, high nibble: minimum */
    uint8_t qs[64];
    uint16_t d, dmin;
} dx_block_q2_k;

typedef struct {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    uint16_t d;
} dx_block_q3_k;

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
} dx_block_q4_k;

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} dx_block_q5_k;

typedef struct {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
} dx_block_q6_k;

typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[4];
    uint8_t qs[128];
} dx_block_iq4_xs;

_Static_assert(sizeof(dx_block_q2_k) == 84, "q2_K block");
_Static_assert(sizeof(dx_block_q3_k) == 110, "q3_K block");
_Static_assert(sizeof(dx_block_q4_k) == 144, "q4_K block");
_Static_assert(sizeof(dx_block_q5_k) == 176, "q5_K block");
_Static_assert(sizeof(dx_block_q6_k) == 210, "q6_K block");
_Static_assert(sizeof(dx_block_iq4_xs) == 136, "iq4_xs block");

/* Q4_K / Q5_K: the 6-bit scale and minimum of sub-block s (0..7). */
void dx_k4_scale_min(const uint8_t scales[12], int s, int *sc, int *m);
/* Q3_K: its 16 6-bit scales (0..63, before the -32). */
void dx_q3k_scales(const uint8_t scales[12], int out[16]);
/* IQ4_XS: the 6-bit scale ls (0..63, before the -32) of sub-block s. */
int dx_iq4xs_scale(const dx_block_iq4_xs *b, int s);

/* Rows of n elements (n % 256 == 0): super-blocks -> f32. */
void dx_q2_k_to_f32_row(const dx_block_q2_k *src, float *dst, size_t n);
void dx_q3_k_to_f32_row(const dx_block_q3_k *src, float *dst, size_t n);
void dx_q4_k_to_f32_row(const dx_block_q4_k *src, float *dst, size_t n);
void dx_q5_k_to_f32_row(const dx_block_q5_k *src, float *dst, size_t n);
void dx_q6_k_to_f32_row(const dx_block_q6_k *src, float *dst, size_t n);
void dx_iq4_xs_to_f32_row(const dx_block_iq4_xs *src, float *dst, size_t n);

/* f32 -> super-blocks (n % 256 == 0; inputs finite), deterministic. */
void dx_f32_to_q2_k_row(const float *src, dx_block_q2_k *dst, size_t n);
void dx_f32_to_q3_k_row(const float *src, dx_block_q3_k *dst, size_t n);
void dx_f32_to_q4_k_row(const float *src, dx_block_q4_k *dst, size_t n);
void dx_f32_to_q5_k_row(const float *src, dx_block_q5_k *dst, size_t n);
void dx_f32_to_q6_k_row(const float *src, dx_block_q6_k *dst, size_t n);
void dx_f32_to_iq4_xs_row(const float *src, dx_block_iq4_xs *dst, size_t n);

#endif
