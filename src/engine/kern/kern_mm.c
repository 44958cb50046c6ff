/* kern_mm: matmul entry points — activation prep, ISA dispatch — and the
 * scalar reference kernels.
 *
 * The scalar reference is the plain definition: for each output element, a
 * sequential f32 sum over k of w*x in the consumed precision (bf16 x bf16
 * products are exact in f32; Q8_0 sums each block's integer dot exactly and
 * adds d_w*d_x*dot block by block).  It is also the KERN_SCALAR engine path,
 * so it too is batch invariant: each element's arithmetic depends on nothing
 * but its own row and token. */
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern.h"
#include "engine/kern/kern_mm_priv.h"

size_t kern__act_row_bytes(int wtype, size_t n_in)
{
    switch (wtype) {
    case DX_F32:
    case DX_F16:
        return kern__act_k(n_in) * sizeof(float);
    case DX_BF16:
        return kern__act_k(n_in) * sizeof(uint16_t);
    case DX_Q8_0:
        return n_in % DX_QK8_0 ? 0 : kern__q8_pairs(n_in) * KERN__Q8_PAIR_BYTES;
    default:
        return 0;
    }
}

size_t kern_act_bytes(int wtype, size_t n_tok, size_t n_in)
{
    size_t row = kern__act_row_bytes(wtype, n_in), total;
    if (dx_mul_overflow(row, n_tok, &total)) return 0;
    return total;
}

void kern__q8_prep_row_scalar(const float *x, size_t n_in, uint8_t *row)
{
    memset(row, 0, kern__q8_pairs(n_in) * KERN__Q8_PAIR_BYTES);
    for (size_t b = 0; b < n_in / DX_QK8_0; b++) {
        dx_block_q8_0 blk;
        dx_f32_to_q8_0_row(x + b * DX_QK8_0, &blk, DX_QK8_0);
        uint8_t *pair = row + (b / 2) * KERN__Q8_PAIR_BYTES;
        size_t half = b % 2;
        memcpy(pair + half * 32, blk.qs, 32);
        for (int j = 0; j < 8; j++) {
            int32_t s = 0;
            for (int i = 0; i < 4; i++) s += blk.qs[4 * j + i];
            int32_t nc = -128 * s;
            float d = dx_f16_to_f32(blk.d);
            memcpy(pair + 64 + (half * 8 + j) * 4, &nc, 4);
            memcpy(pair + 128 + (half * 8 + j) * 4, &d, 4);
        }
    }
}

static void act_prep_row(int wtype, enum kern_isa isa, const float *x, size_t n_in, void *row)
{
    size_t k = kern__act_k(n_in);
    switch (wtype) {
    case DX_F32:
    case DX_F16:
        memcpy(row, x, n_in * sizeof(float));
        memset((float *)row + n_in, 0, (k - n_in) * sizeof(float));
        break;
    case DX_BF16:
        if (isa == KERN_AVX512) {
            kern__bf16_prep_row_avx512(x, n_in, row);
        } else {
            dx_f32_to_bf16_row(x, row, n_in);
            memset((uint16_t *)row + n_in, 0, (k - n_in) * sizeof(uint16_t));
        }
        break;
    case DX_Q8_0:
        if (isa == KERN_AVX512)
            kern__q8_prep_row_avx512(x, n_in, row);
        else if (isa == KERN_AVX2)
            kern__q8_prep_row_avx2(x, n_in, row);
        else
            kern__q8_prep_row_scalar(x, n_in, row);
        break;
    default:
        DX_ASSERT(!"kern_act_prep: unsupported weight type");
    }
}

void kern_act_prep(int wtype, const float *x, size_t n_tok, size_t n_in, void *act)
{
    size_t rb = kern__act_row_bytes(wtype, n_in);
    DX_ASSERT(rb != 0); /* type and n_in were validated when the model loaded */
    enum kern_isa isa = kern_get_isa();
    for (size_t t = 0; t < n_tok; t++)
        act_prep_row(wtype, isa, x + t * n_in, n_in, (uint8_t *)act + t * rb);
}

size_t kern_matmul_tile(int wtype)
{
    (void)wtype;
    return 16;
}

void kern_matmul(int wtype, const void *w, size_t n_in, size_t o0, size_t o1, const void *act,
                 size_t n_tok, float *y, size_t ldy)
{
    switch (kern_get_isa()) {
    case KERN_AVX512:
        kern__matmul_avx512(wtype, w, n_in, o0, o1, act, n_tok, y, ldy);
        return;
    case KERN_AVX2:
        kern__matmul_avx2(wtype, w, n_in, o0, o1, act, n_tok, y, ldy);
        return;
    case KERN_SCALAR:
        break;
    }
    kern_matmul_scalar(wtype, w, n_in, o0, o1, act, n_tok, y, ldy);
}

/* ---- scalar reference ---- */

static float dot_f32(const float *w, const float *x, size_t n)
{
    float s = 0.0f;
    for (size_t k = 0; k < n; k++) s += w[k] * x[k];
    return s;
}

static float dot_f16(const uint16_t *w, const float *x, size_t n)
{
    float s = 0.0f;
    for (size_t k = 0; k < n; k++) s += dx_f16_to_f32(w[k]) * x[k];
    return s;
}

static float dot_bf16(const uint16_t *w, const uint16_t *x, size_t n)
{
    float s = 0.0f;
    for (size_t k = 0; k < n; k++) s += dx_bf16_to_f32(w[k]) * dx_bf16_to_f32(x[k]);
    return s;
}

static float dot_q8_0(const dx_block_q8_0 *w, const uint8_t *xrow, size_t n)
{
    float s = 0.0f;
    for (size_t b = 0; b < n / DX_QK8_0; b++) {
        const uint8_t *pair = xrow + (b / 2) * KERN__Q8_PAIR_BYTES;
        const int8_t *xq = (const int8_t *)pair + (b % 2) * 32;
        float dx;
        memcpy(&dx, pair + 128 + (b % 2) * 32, 4);
        int32_t isum = 0;
        for (int j = 0; j < DX_QK8_0; j++) isum += (int32_t)w[b].qs[j] * xq[j];
        s += (dx_f16_to_f32(w[b].d) * dx) * (float)isum;
    }
    return s;
}

void kern_matmul_scalar(int wtype, const void *w, size_t n_in, size_t o0, size_t o1,
                        const void *act, size_t n_tok, float *y, size_t ldy)
{
    size_t rb = kern__act_row_bytes(wtype, n_in), wrow = dx_dtype_row_bytes(wtype, n_in);
    DX_ASSERT(rb != 0 && wrow != 0);
    for (size_t t = 0; t < n_tok; t++) {
        const uint8_t *x = (const uint8_t *)act + t * rb;
        for (size_t o = o0; o < o1; o++) {
            const void *wr = (const uint8_t *)w + o * wrow;
            float v = 0.0f;
            switch (wtype) {
            case DX_F32:
                v = dot_f32(wr, (const float *)x, n_in);
                break;
            case DX_F16:
                v = dot_f16(wr, (const float *)x, n_in);
                break;
            case DX_BF16:
                v = dot_bf16(wr, (const uint16_t *)x, n_in);
                break;
            case DX_Q8_0:
                v = dot_q8_0(wr, x, n_in);
                break;
            }
            y[t * ldy + o] = v;
        }
    }
}
