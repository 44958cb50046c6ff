/* kern_mm_blk: scalar twins of the block-format matmuls (Q4_0, Q4_1, Q5_0,
 * Q5_1, IQ4_NL against q8 activations) — the definition of their
 * arithmetic (kern_mm_priv.h), which every ISA's tiles reproduce bit for
 * bit, and the KERN_SCALAR engine path.
 *
 * Weights are decoded to their integer values from the block bytes here,
 * independently of dx_quant's f32 dequantisation, so the tests comparing
 * the two catch a layout slip in either. */
#include <math.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern_mm_priv.h"

/* A weight block as integers: value of element i = v[i] (times d, plus m). */
typedef struct {
    int v[32];
    float d, m;
} blk_ints;

static uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* The 32 4-bit fields of qs (element i < 16: low nibble of byte i, else the
 * high nibble of byte i - 16), plus bit 4 of each from qh when given. */
static void fields(const uint8_t *qs, const uint8_t *qh, int *v)
{
    uint32_t h = 0;
    if (qh) memcpy(&h, qh, 4);
    for (int i = 0; i < 32; i++) {
        int q = i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
        v[i] = q | (int)((h >> i) & 1u) << 4;
    }
}

static void decode(int type, const uint8_t *b, blk_ints *o)
{
    o->d = dx_f16_to_f32(rd16(b));
    o->m = 0.0f;
    switch (type) {
    case DX_Q4_0:
        fields(b + 2, NULL, o->v);
        for (int i = 0; i < 32; i++) o->v[i] -= 8;
        break;
    case DX_Q4_1:
        o->m = dx_f16_to_f32(rd16(b + 2));
        fields(b + 4, NULL, o->v);
        break;
    case DX_Q5_0:
        fields(b + 6, b + 2, o->v);
        for (int i = 0; i < 32; i++) o->v[i] -= 16;
        break;
    case DX_Q5_1:
        o->m = dx_f16_to_f32(rd16(b + 2));
        fields(b + 8, b + 4, o->v);
        break;
    case DX_IQ4_NL:
        fields(b + 2, NULL, o->v);
        for (int i = 0; i < 32; i++) o->v[i] = dx_iq4nl_values[o->v[i]];
        break;
    default:
        DX_ASSERT(!"kern_mm_blk: not a block format");
    }
}

static float dot_blk(int type, const uint8_t *w, const uint8_t *x, size_t n_in)
{
    size_t bb = dx_dtype_block_bytes(type);
    int has_m = type == DX_Q4_1 || type == DX_Q5_1;
    float p[4] = {0};
    for (size_t b = 0; b < n_in / 32; b++) {
        blk_ints wb;
        decode(type, w + b * bb, &wb);
        const int8_t *xq = kern__q8_qs(x, b);
        float dx = *kern__q8_d(x, b), s = wb.d * dx;
        for (int g = 0; g < 4; g++) {
            int32_t ig = 0, sg = 0;
            for (int k = 4 * g; k < 4 * g + 4; k++) { /* bytes 4g..4g+3 of qs, both nibbles */
                ig += wb.v[k] * xq[k] + wb.v[k + 16] * xq[k + 16];
                sg += xq[k] + xq[k + 16];
            }
            p[g] = fmaf((float)ig, s, p[g]);
            if (has_m) p[g] = fmaf(dx * (float)sg, wb.m, p[g]);
        }
    }
    return (p[0] + p[2]) + (p[1] + p[3]);
}

float kern__dot_q4_0(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_blk(DX_Q4_0, w, x, n_in);
}
float kern__dot_q4_1(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_blk(DX_Q4_1, w, x, n_in);
}
float kern__dot_q5_0(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_blk(DX_Q5_0, w, x, n_in);
}
float kern__dot_q5_1(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_blk(DX_Q5_1, w, x, n_in);
}
float kern__dot_iq4_nl(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_blk(DX_IQ4_NL, w, x, n_in);
}
