/* dx_half: the 16-bit float formats (IEEE f16, bfloat16) and their scalar
 * conversions to and from f32.
 *
 * The conversions are the references: round-to-nearest-even, NaN kept
 * quiet, exactly what F16C/AVX512-BF16 instructions compute, so fast paths
 * give identical bits.  Everything that stores a scale or an element in 16
 * bits (dx_quant's blocks, the KV cache, the kernels' twins) goes through
 * them. */
#ifndef DX_HALF_H
#define DX_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

#endif
