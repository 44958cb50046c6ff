/* dx_quant: the block formats' scalar dequantisation (the definition every
 * kernel is checked against) and their deterministic quantisers; the rules
 * are in dx_quant.h. */
#include "dx_quant.h"

#include <math.h>
#include <string.h>

#include "dx_half.h"
#include "dx_quant_priv.h"

const int8_t dx_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

/* Element i (0..31) of a block's 4-bit field. */
static inline int nibble(const uint8_t *qs, int i)
{
    return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
}

/* Bit 4 of element i from a 5-bit block's qh. */
static inline int high_bit(const uint8_t qh[4], int i)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    return (int)((h >> i) & 1u) << 4;
}

/* Packs 32 values 0..15 (elements j and j + 16 share byte j). */
static void pack_nibbles(const uint8_t *q, uint8_t *qs)
{
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

/* Packs 32 values 0..31: low nibbles into qs, bit 4 into qh. */
static void pack_5bit(const uint8_t *q, uint8_t *qs, uint8_t qh[4])
{
    uint8_t lo[32];
    uint32_t h = 0;
    for (int i = 0; i < 32; i++) {
        lo[i] = q[i] & 15;
        h |= (uint32_t)(q[i] >> 4) << i;
    }
    pack_nibbles(lo, qs);
    memcpy(qh, &h, 4);
}

/* The element of largest magnitude, the first one on ties (its sign sets
 * the sign of the scale, so that it lands exactly on the end of the grid). */
static float signed_max(const float *x)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < DX_QK; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void min_max(const float *x, float *mn, float *mx)
{
    *mn = x[0];
    *mx = x[0];
    for (int j = 1; j < DX_QK; j++) {
        if (x[j] < *mn) *mn = x[j];
        if (x[j] > *mx) *mx = x[j];
    }
}

/* trunc(v) clamped to 0..hi (v is >= 0 for finite inputs; NaN gives 0). */
static inline uint8_t trunc_clamp(float v, int hi)
{
    if (!(v >= 0.0f)) return 0;
    if (v >= (float)hi) return (uint8_t)hi;
    return (uint8_t)v;
}

/* ---- Q8_0 ---- */

void dx_q8_0_to_f32_row(const dx_block_q8_0 *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        float d = dx_f16_to_f32(src[b].d);
        for (int j = 0; j < DX_QK; j++) dst[b * DX_QK + j] = d * (float)src[b].qs[j];
    }
}

void dx_f32_to_q8_0_row(const float *src, dx_block_q8_0 *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        const float *x = src + b * DX_QK;
        float amax = 0.0f;
        for (int j = 0; j < DX_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        dst[b].d = dx_f32_to_f16(d);
        for (int j = 0; j < DX_QK; j++) dst[b].qs[j] = (int8_t)lrintf(x[j] * id);
    }
}

/* ---- Q4_0 / Q5_0: symmetric, offset 8 / 16 ---- */

void dx_q4_0_to_f32_row(const dx_block_q4_0 *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        float d = dx_f16_to_f32(src[b].d);
        for (int i = 0; i < DX_QK; i++) dst[b * DX_QK + i] = (float)(nibble(src[b].qs, i) - 8) * d;
    }
}

/* Quants 0..2*half-1 for x / d + half with d = -M / half. */
static float quant_symmetric(const float *x, int half, uint8_t *q)
{
    float d = signed_max(x) / (float)-half;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < DX_QK; j++)
        q[j] = trunc_clamp(x[j] * id + ((float)half + 0.5f), 2 * half - 1);
    return d;
}

void dx_f32_to_q4_0_row(const float *src, dx_block_q4_0 *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        uint8_t q[DX_QK];
        dst[b].d = dx_f32_to_f16(quant_symmetric(src + b * DX_QK, 8, q));
        pack_nibbles(q, dst[b].qs);
    }
}

void dx_q5_0_to_f32_row(const dx_block_q5_0 *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        float d = dx_f16_to_f32(src[b].d);
        for (int i = 0; i < DX_QK; i++) {
            int q = nibble(src[b].qs, i) | high_bit(src[b].qh, i);
            dst[b * DX_QK + i] = (float)(q - 16) * d;
        }
    }
}

void dx_f32_to_q5_0_row(const float *src, dx_block_q5_0 *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        uint8_t q[DX_QK];
        dst[b].d = dx_f32_to_f16(quant_symmetric(src + b * DX_QK, 16, q));
        pack_5bit(q, dst[b].qs, dst[b].qh);
    }
}

/* ---- Q4_1 / Q5_1: scale and minimum ---- */

/* Quants 0..levels-1 of (x - min) / d with d = (max - min) / (levels - 1). */
static void quant_affine(const float *x, int levels, uint8_t *q, float *d_out, float *m_out)
{
    float mn, mx;
    min_max(x, &mn, &mx);
    float d = (mx - mn) / (float)(levels - 1);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < DX_QK; j++) q[j] = trunc_clamp((x[j] - mn) * id + 0.5f, levels - 1);
    *d_out = d;
    *m_out = mn;
}

void dx_q4_1_to_f32_row(const dx_block_q4_1 *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        float d = dx_f16_to_f32(src[b].d), m = dx_f16_to_f32(src[b].m);
        for (int i = 0; i < DX_QK; i++) dst[b * DX_QK + i] = (float)nibble(src[b].qs, i) * d + m;
    }
}

void dx_f32_to_q4_1_row(const float *src, dx_block_q4_1 *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        uint8_t q[DX_QK];
        float d, m;
        quant_affine(src + b * DX_QK, 16, q, &d, &m);
        dst[b].d = dx_f32_to_f16(d);
        dst[b].m = dx_f32_to_f16(m);
        pack_nibbles(q, dst[b].qs);
    }
}

void dx_q5_1_to_f32_row(const dx_block_q5_1 *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        float d = dx_f16_to_f32(src[b].d), m = dx_f16_to_f32(src[b].m);
        for (int i = 0; i < DX_QK; i++) {
            int q = nibble(src[b].qs, i) | high_bit(src[b].qh, i);
            dst[b * DX_QK + i] = (float)q * d + m;
        }
    }
}

void dx_f32_to_q5_1_row(const float *src, dx_block_q5_1 *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        uint8_t q[DX_QK];
        float d, m;
        quant_affine(src + b * DX_QK, 32, q, &d, &m);
        dst[b].d = dx_f32_to_f16(d);
        dst[b].m = dx_f32_to_f16(m);
        pack_5bit(q, dst[b].qs, dst[b].qh);
    }
}

/* ---- IQ4_NL ---- */

void dx_iq4_nl_to_f32_row(const dx_block_iq4_nl *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        float d = dx_f16_to_f32(src[b].d);
        for (int i = 0; i < DX_QK; i++)
            dst[b * DX_QK + i] = d * (float)dx_iq4nl_values[nibble(src[b].qs, i)];
    }
}

int dx_iq4nl_nearest(float v)
{
    const int8_t *val = dx_iq4nl_values;
    if (v <= (float)val[0]) return 0;
    if (v >= (float)val[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < (float)val[mid])
            hi = mid;
        else
            lo = mid;
    }
    return v - (float)val[hi - 1] < (float)val[hi] - v ? hi - 1 : hi;
}

/* sum w*q*x and sum w*q*q (w = x^2) for the grid of inverse scale id. */
static void iq4nl_sums(const float *x, float id, float *sqx, float *sq2)
{
    float a = 0.0f, b = 0.0f;
    for (int j = 0; j < DX_QK; j++) {
        float q = (float)dx_iq4nl_values[dx_iq4nl_nearest(id * x[j])], w = x[j] * x[j];
        a += w * q * x[j];
        b += w * q * q;
    }
    *sqx = a;
    *sq2 = b;
}

/* Least squares on the grid -M/127, then on each trial grid, kept when its
 * weighted error is lower. */
float dx_iq4nl_block_scale(const float *x)
{
    float max = signed_max(x);
    if (fabsf(max) < 1e-15f) return 0.0f;
    float sqx, sq2;
    iq4nl_sums(x, 1.0f / (-max / (float)dx_iq4nl_values[0]), &sqx, &sq2);
    float d = sq2 > 0.0f ? sqx / sq2 : 0.0f, best = d * sqx;
    for (int t = -7; t <= 7; t++) {
        iq4nl_sums(x, (float)(t + dx_iq4nl_values[0]) / max, &sqx, &sq2);
        if (sq2 > 0.0f && sqx * sqx > best * sq2) {
            d = sqx / sq2;
            best = d * sqx;
        }
    }
    return d;
}

void dx_f32_to_iq4_nl_row(const float *src, dx_block_iq4_nl *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK; b++) {
        const float *x = src + b * DX_QK;
        float d = dx_iq4nl_block_scale(x), id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[DX_QK];
        for (int j = 0; j < DX_QK; j++) q[j] = (uint8_t)dx_iq4nl_nearest(id * x[j]);
        dst[b].d = dx_f32_to_f16(d);
        pack_nibbles(q, dst[b].qs);
    }
}
