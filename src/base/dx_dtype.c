/* dx_dtype: type table and scalar conversions (the reference for the fast
 * kernels, which must produce the same bits). */
#include "dx_dtype.h"
#include "dx_err.h"

#include <math.h>

const char *dx_dtype_name(int type)
{
    switch (type) {
    case DX_F32: return "f32";
    case DX_F16: return "f16";
    case DX_BF16: return "bf16";
    case DX_Q8_0: return "q8_0";
    default: return NULL;
    }
}

int dx_dtype_parse(const char *s, enum dx_dtype *out)
{
    static const enum dx_dtype all[] = {DX_F32, DX_F16, DX_BF16, DX_Q8_0};
    for (size_t i = 0; i < DX_ARRAY_LEN(all); i++)
        if (s && strcmp(s, dx_dtype_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    return dx_errf(DX_EINVAL, "unknown dtype '%s' (want f32|f16|bf16|q8_0)", s ? s : "");
}

size_t dx_dtype_block_elems(int type)
{
    switch (type) {
    case DX_F32:
    case DX_F16:
    case DX_BF16: return 1;
    case DX_Q8_0: return DX_QK8_0;
    default: return 0;
    }
}

size_t dx_dtype_block_bytes(int type)
{
    switch (type) {
    case DX_F32: return 4;
    case DX_F16:
    case DX_BF16: return 2;
    case DX_Q8_0: return sizeof(dx_block_q8_0);
    default: return 0;
    }
}

size_t dx_dtype_row_bytes(int type, size_t n)
{
    size_t be = dx_dtype_block_elems(type);
    if (!be || n % be) return 0;
    return (n / be) * dx_dtype_block_bytes(type);
}

float dx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
    } else if (exp == 0) {
        if (!man) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    return dx_u32_as_f32(u);
}

uint16_t dx_f32_to_f16(float f)
{
    uint32_t u = dx_f32_as_u32(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu); /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                       /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u) return sign;        /* < 2^-25 rounds to 0 */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* RNE at bit 13 */
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

void dx_f16_to_f32_row(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = dx_f16_to_f32(src[i]);
}

void dx_bf16_to_f32_row(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = dx_bf16_to_f32(src[i]);
}

void dx_f32_to_f16_row(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = dx_f32_to_f16(src[i]);
}

void dx_f32_to_bf16_row(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = dx_f32_to_bf16(src[i]);
}

void dx_q8_0_to_f32_row(const dx_block_q8_0 *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK8_0; b++) {
        float d = dx_f16_to_f32(src[b].d);
        for (int j = 0; j < DX_QK8_0; j++) dst[b * DX_QK8_0 + j] = d * (float)src[b].qs[j];
    }
}

void dx_f32_to_q8_0_row(const float *src, dx_block_q8_0 *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK8_0; b++) {
        const float *x = src + b * DX_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < DX_QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        dst[b].d = dx_f32_to_f16(d);
        for (int j = 0; j < DX_QK8_0; j++) dst[b].qs[j] = (int8_t)lrintf(x[j] * id);
    }
}

int dx_dtype_to_f32_row(int type, const void *src, float *dst, size_t n)
{
    switch (type) {
    case DX_F32: memcpy(dst, src, n * sizeof(float)); return 0;
    case DX_F16: dx_f16_to_f32_row(src, dst, n); return 0;
    case DX_BF16: dx_bf16_to_f32_row(src, dst, n); return 0;
    case DX_Q8_0:
        if (n % DX_QK8_0) return dx_errf(DX_EINVAL, "q8_0 row of %zu elements (not a multiple of 32)", n);
        dx_q8_0_to_f32_row(src, dst, n);
        return 0;
    default: return dx_errf(DX_EUNSUPPORTED, "unsupported tensor type %d", type);
    }
}
