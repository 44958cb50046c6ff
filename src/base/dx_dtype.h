/* dx_dtype: tensor element types and scalar conversions.
 *
 * Values are GGML's type ids, so a GGUF tensor's type field maps directly.
 * Q8_0 is GGML's layout: blocks of 32 elements, each an f16 scale d followed
 * by 32 int8 quants q, value = d * q.
 *
 * The conversions are the scalar references: round-to-nearest-even, NaN kept
 * quiet, exactly what F16C/AVX512-BF16 instructions compute, so fast paths
 * give identical bits. */
#ifndef DX_DTYPE_H
#define DX_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum dx_dtype {
    DX_F32 = 0,
    DX_F16 = 1,
    DX_Q8_0 = 8,
    DX_BF16 = 30,
};

#define DX_QK8_0 32
typedef struct {
    uint16_t d; /* f16 scale */
    int8_t qs[DX_QK8_0];
} dx_block_q8_0;

/* Name ("f32", "f16", "bf16", "q8_0") or NULL for an unknown id. */
const char *dx_dtype_name(int type);
/* Parse a name; returns 0 or DX_EINVAL. */
int dx_dtype_parse(const char *s, enum dx_dtype *out);
/* Elements per block (1 for plain types, 32 for Q8_0), 0 if unknown. */
size_t dx_dtype_block_elems(int type);
/* Bytes per block, 0 if unknown. */
size_t dx_dtype_block_bytes(int type);
/* Bytes for a row of n elements; n must be a multiple of the block size
 * (returns 0 otherwise or for an unknown type). */
size_t dx_dtype_row_bytes(int type, size_t n);

static inline float dx_u32_as_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t dx_f32_as_u32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float dx_bf16_to_f32(uint16_t h)
{
    return dx_u32_as_f32((uint32_t)h << 16);
}

static inline uint16_t dx_f32_to_bf16(float f)
{
    uint32_t u = dx_f32_as_u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* RNE */
    return (uint16_t)(u >> 16);
}

float dx_f16_to_f32(uint16_t h);
uint16_t dx_f32_to_f16(float f);

/* Row conversions (scalar). */
void dx_f16_to_f32_row(const uint16_t *src, float *dst, size_t n);
void dx_bf16_to_f32_row(const uint16_t *src, float *dst, size_t n);
void dx_f32_to_f16_row(const float *src, uint16_t *dst, size_t n);
void dx_f32_to_bf16_row(const float *src, uint16_t *dst, size_t n);
/* Q8_0: n multiple of 32. Quantisation: d = max|x|/127, q = round(x/d). */
void dx_q8_0_to_f32_row(const dx_block_q8_0 *src, float *dst, size_t n);
void dx_f32_to_q8_0_row(const float *src, dx_block_q8_0 *dst, size_t n);
/* Dequantise a row of any supported type; n per the type's block size. */
int dx_dtype_to_f32_row(int type, const void *src, float *dst, size_t n);

#endif
