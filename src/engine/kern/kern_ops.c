/* kern_ops: per-token elementwise kernels (rmsnorm, rope, swiglu, add, the
 * q8_0 quantisation of a KV or query row) with scalar references and
 * dispatch to the AVX2/AVX-512 versions where they pay (rmsnorm and swiglu
 * over 1k–3k wide rows; q8_0 quantisation runs for every stored K/V row and
 * every query row that scores a q8_0 K).  Each output depends only on its
 * own token's row, and rmsnorm's sum of squares has an order fixed by n, so
 * all of these are batch-invariant by construction. */
#include <math.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern.h"
#include "engine/kern/kern_attn_priv.h"

static void ops_rmsnorm_scalar(const float *x, const float *w, float eps, size_t n, float *y)
{
    float ss = 0.0f;
    for (size_t i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (size_t i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
}

void kern_rmsnorm(const float *x, const float *w, float eps, size_t n, float *y)
{
    switch (kern_get_isa()) {
    case KERN_AMX:
    case KERN_AVX512:
        kern_rmsnorm_avx512(x, w, eps, n, y);
        return;
    case KERN_AVX2:
        kern_rmsnorm_avx2(x, w, eps, n, y);
        return;
    case KERN_SCALAR:
        break;
    }
    ops_rmsnorm_scalar(x, w, eps, n, y);
}

/* A head vector is 64–256 floats: the compiler's code for this loop is
 * already fine, and rotation is exact per element whatever the ISA. */
void kern_rope(float *x, int head_dim, const float *cs, int neox)
{
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1];
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

static void ops_swiglu_scalar(float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void kern_swiglu(float *g, const float *u, size_t n)
{
    switch (kern_get_isa()) {
    case KERN_AMX:
    case KERN_AVX512:
        kern_swiglu_avx512(g, u, n);
        return;
    case KERN_AVX2:
        kern_swiglu_avx2(g, u, n);
        return;
    case KERN_SCALAR:
        break;
    }
    ops_swiglu_scalar(g, u, n);
}

void kern_add(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* The scale of a group is computed in scalar by every ISA (max is exact in
 * any order, the rest is one division and a conversion), so only the
 * per-element multiply, clamp and round are vectorised — the same IEEE
 * operations — and the bytes agree. */
void kern_q8_quant_scalar(const float *x, size_t n, int8_t *qs, uint16_t *d)
{
    for (size_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float id = kern__q8_group_scale(amax, &d[b]);
        for (int j = 0; j < 32; j++) {
            /* a subnormal f16 scale can round below max/127: clamp */
            float v = xb[j] * id;
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            qs[32 * b + (size_t)j] = (int8_t)lrintf(v);
        }
    }
}

void kern_q8_quant(const float *x, size_t n, int8_t *qs, uint16_t *d)
{
    switch (kern_get_isa()) {
    case KERN_AMX:
    case KERN_AVX512:
        kern_q8_quant_avx512(x, n, qs, d);
        return;
    case KERN_AVX2:
        kern_q8_quant_avx2(x, n, qs, d);
        return;
    case KERN_SCALAR:
        break;
    }
    kern_q8_quant_scalar(x, n, qs, d);
}

void kern_attn_store_q8(const kern_attn_layout *L, uint8_t *k_region, uint8_t *v_region, int h,
                        int j, const float *k, const float *v)
{
    int8_t q[512]; /* head_dim <= 512 (model.c) */
    uint16_t d[512 / 32];
    int D = L->head_dim;
    DX_ASSERT(D <= 512 && D % 32 == 0);
    kern_q8_quant(k, (size_t)D, q, d);
    for (int c = 0; c < D / 4; c++) memcpy(k_region + kern_attn_q8_k(L, h, j, 4 * c), q + 4 * c, 4);
    for (int g = 0; g < D / 32; g++) memcpy(k_region + kern_attn_q8_ks(L, h, j, g), &d[g], 2);
    kern_q8_quant(v, (size_t)D, q, d);
    memcpy(v_region + kern_attn_q8_v(L, h, j, 0), q, (size_t)D);
    memcpy(v_region + kern_attn_q8_vs(L, h, j, 0), d, (size_t)(D / 32) * 2);
}
