/* kern_ops: per-token elementwise kernels (rmsnorm, rope, swiglu, add) with
 * scalar references and dispatch to the AVX2/AVX-512 versions where they pay
 * (rmsnorm and swiglu over 1k–3k wide rows).  Each output depends only on its
 * own token's row, and rmsnorm's sum of squares has an order fixed by n, so
 * all of these are batch-invariant by construction. */
#include <math.h>

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
