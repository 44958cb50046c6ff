/* dx_kquant: the super-block formats' scalar dequantisation (the definition
 * every kernel is checked against) and their deterministic quantisers; the
 * layouts and rules are in dx_kquant.h. */
#include "dx_kquant.h"

#include <math.h>
#include <string.h>

#include "dx_half.h"
#include "dx_quant.h"
#include "dx_quant_priv.h"

void dx_k4_scale_min(const uint8_t q[12], int s, int *sc, int *m)
{
    if (s < 4) {
        *sc = q[s] & 63;
        *m = q[s + 4] & 63;
    } else {
        *sc = (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4);
        *m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

void dx_q3k_scales(const uint8_t q[12], int out[16])
{
    for (int s = 0; s < 16; s++) {
        int lo = s < 8 ? q[s] & 15 : q[s - 8] >> 4;
        out[s] = lo | ((q[8 + s % 4] >> (2 * (s / 4))) & 3) << 4;
    }
}

int dx_iq4xs_scale(const dx_block_iq4_xs *b, int s)
{
    return ((b->scales_l[s / 2] >> (4 * (s % 2))) & 15) | ((b->scales_h >> (2 * s)) & 3) << 4;
}

/* ---- dequantisation ---- */

void dx_q2_k_to_f32_row(const dx_block_q2_k *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK_K; b++, dst += DX_QK_K) {
        const dx_block_q2_k *x = &src[b];
        float d = dx_f16_to_f32(x->d), dmin = dx_f16_to_f32(x->dmin);
        for (int i = 0; i < DX_QK_K; i++) {
            int n2 = i / 128, k = (i % 128) / 32, j = i % 32, s = i / 16;
            int q = (x->qs[32 * n2 + j] >> (2 * k)) & 3;
            float dl = d * (float)(x->scales[s] & 15), ml = dmin * (float)(x->scales[s] >> 4);
            dst[i] = dl * (float)q - ml;
        }
    }
}

void dx_q3_k_to_f32_row(const dx_block_q3_k *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK_K; b++, dst += DX_QK_K) {
        const dx_block_q3_k *x = &src[b];
        float d = dx_f16_to_f32(x->d);
        int sc[16];
        dx_q3k_scales(x->scales, sc);
        for (int i = 0; i < DX_QK_K; i++) {
            int n2 = i / 128, k = (i % 128) / 32, j = i % 32;
            int q = (x->qs[32 * n2 + j] >> (2 * k)) & 3;
            int hi = (x->hmask[j] >> (4 * n2 + k)) & 1;
            dst[i] = (d * (float)(sc[i / 16] - 32)) * (float)(q - (hi ? 0 : 4));
        }
    }
}

/* Q4_K and Q5_K: element i's quant (bit 4 from qh when given). */
static int k45_quant(const uint8_t *qs, const uint8_t *qh, int i)
{
    int c = i / 64, j = i % 64, byte = qs[32 * c + j % 32];
    int q = j < 32 ? byte & 15 : byte >> 4;
    if (qh) q |= ((qh[j % 32] >> (2 * c + j / 32)) & 1) << 4;
    return q;
}

static void k45_row(const uint16_t *d16, const uint8_t *scales, const uint8_t *qs,
                    const uint8_t *qh, float *dst)
{
    float d = dx_f16_to_f32(d16[0]), dmin = dx_f16_to_f32(d16[1]);
    for (int i = 0; i < DX_QK_K; i++) {
        int sc, m;
        dx_k4_scale_min(scales, i / 32, &sc, &m);
        dst[i] = (d * (float)sc) * (float)k45_quant(qs, qh, i) - dmin * (float)m;
    }
}

void dx_q4_k_to_f32_row(const dx_block_q4_k *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK_K; b++, dst += DX_QK_K) {
        uint16_t d16[2] = {src[b].d, src[b].dmin};
        k45_row(d16, src[b].scales, src[b].qs, NULL, dst);
    }
}

void dx_q5_k_to_f32_row(const dx_block_q5_k *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK_K; b++, dst += DX_QK_K) {
        uint16_t d16[2] = {src[b].d, src[b].dmin};
        k45_row(d16, src[b].scales, src[b].qs, src[b].qh, dst);
    }
}

void dx_q6_k_to_f32_row(const dx_block_q6_k *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK_K; b++, dst += DX_QK_K) {
        const dx_block_q6_k *x = &src[b];
        float d = dx_f16_to_f32(x->d);
        for (int i = 0; i < DX_QK_K; i++) {
            int n2 = i / 128, r = i % 128, l = r % 32, k = r / 32; /* k: which quarter */
            int byte = x->ql[64 * n2 + l + 32 * (k & 1)];
            int q = (k < 2 ? byte & 15 : byte >> 4) | ((x->qh[32 * n2 + l] >> (2 * k)) & 3) << 4;
            dst[i] = (d * (float)x->scales[i / 16]) * (float)(q - 32);
        }
    }
}

void dx_iq4_xs_to_f32_row(const dx_block_iq4_xs *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK_K; b++, dst += DX_QK_K) {
        const dx_block_iq4_xs *x = &src[b];
        float d = dx_f16_to_f32(x->d);
        for (int i = 0; i < DX_QK_K; i++) {
            int s = i / 32, j = i % 32, byte = x->qs[16 * s + j % 16];
            float dl = d * (float)(dx_iq4xs_scale(x, s) - 32);
            dst[i] = dl * (float)dx_iq4nl_values[j < 16 ? byte & 15 : byte >> 4];
        }
    }
}

/* ---- quantisation: shared pieces ---- */

/* llama.cpp's nearest_int: adding 1.5 * 2^23 leaves round-half-even(v) in
 * the low mantissa bits.  The same integer as rintf for |v| < 2^22; kept as
 * this bit trick so that a wild v (a near-zero divisor) gives the same
 * garbage, hence the same bytes, as llama.cpp. */
static inline int nearest_int(float v)
{
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int clamp_int(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The element of largest magnitude (the first on ties) and that magnitude. */
static float signed_amax(const float *x, int n, float *amax)
{
    float a = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > a) {
            a = fabsf(x[i]);
            max = x[i];
        }
    *amax = a;
    return max;
}

/* The value of largest magnitude among n (the first on ties). */
static float signed_max_of(const float *v, int n)
{
    float amax;
    return signed_amax(v, n, &amax);
}

/* ---- make_qkx2_quants: scale and minimum for the _K formats with one ---- */

/* The trial grids of the search: iscale = (rmin + rdelta * is + nmax) /
 * (max - min) for is = 0..nstep; error |diff| (mad) or diff^2. */
typedef struct {
    float rmin, rdelta;
    int nstep, mad;
} qkx_search;

/* L = clamp(round(iscale * (x - min)), 0, nmax). */
static void qkx_grid(const float *x, int n, int nmax, float iscale, float min, uint8_t *L)
{
    for (int i = 0; i < n; i++)
        L[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
}

/* sum w * err(scale * L + min - x). */
static float qkx_error(const float *x, const float *w, const uint8_t *L, int n, float scale,
                       float min, int mad)
{
    float err = 0.0f;
    for (int i = 0; i < n; i++) {
        float diff = scale * (float)L[i] + min - x[i];
        diff = mad ? fabsf(diff) : diff * diff;
        err += w[i] * diff;
    }
    return err;
}

/* Weighted least squares x ~ scale * L + min with min <= 0 (else min = 0
 * and scale fitted alone); 0 if the system is singular. */
static int qkx_fit(const float *x, const float *w, const uint8_t *L, int n, float sum_w,
                   float sum_x, float *scale, float *min)
{
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; i++) {
        float l = (float)L[i];
        sum_l += w[i] * l;
        sum_l2 += w[i] * l * l;
        sum_xl += w[i] * l * x[i];
    }
    float D = sum_w * sum_l2 - sum_l * sum_l;
    if (!(D > 0.0f)) return 0;
    *scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    *min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (*min > 0.0f) {
        *min = 0.0f;
        *scale = sum_xl / sum_l2;
    }
    return 1;
}

/* The scale of n elements on 0..nmax with the minimum subtracted (returned
 * as *the_min = -min >= 0 for a block that reaches below 0): the min-max
 * grid, then each trial grid refitted by least squares, kept when its
 * weighted error is lower.  L gets the chosen grid's quants. */
static float qkx_quants(const float *x, const float *w, int n, int nmax, const qkx_search *p,
                        uint8_t *L, float *the_min)
{
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0.0f) min = 0.0f;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1.0f / iscale;
    qkx_grid(x, n, nmax, iscale, min, L);
    float best = qkx_error(x, w, L, n, scale, min, p->mad);
    for (int is = 0; is <= p->nstep; is++) {
        uint8_t aux[32]; /* n is 16 or 32 */
        float s, m;
        iscale = (p->rmin + p->rdelta * (float)is + (float)nmax) / (max - min);
        qkx_grid(x, n, nmax, iscale, min, aux);
        if (!qkx_fit(x, w, aux, n, sum_w, sum_x, &s, &m)) continue;
        float err = qkx_error(x, w, aux, n, s, m, p->mad);
        if (err < best) {
            memcpy(L, aux, (size_t)n);
            best = err;
            scale = s;
            min = m;
        }
    }
    *the_min = -min;
    return scale;
}

/* Elements requantised on the stored grid x = d * l - dm, d = d16 * sc,
 * dm = dmin16 * m; a sub-block whose d is 0 keeps the quants the search
 * gave it. */
static void requant_affine(const float *x, int n, float d, float dm, int nmax, uint8_t *L)
{
    if (d == 0.0f) return;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)clamp_int(nearest_int((x[i] + dm) / d), 0, nmax);
}

/* ---- Q2_K ---- */

/* Sub-block scales and minimums as 4-bit multiples of d = max_scale / 15
 * and dmin = max_min / 15 (low and high nibble of scales[j]). */
static void q2k_scales(const float *scales, const float *mins, dx_block_q2_k *y)
{
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 16; j++) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    memset(y->scales, 0, 16);
    y->d = y->dmin = dx_f32_to_f16(0.0f);
    if (max_scale > 0.0f) {
        float iscale = 15.0f / max_scale;
        for (int j = 0; j < 16; j++) y->scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
        y->d = dx_f32_to_f16(max_scale / 15.0f);
    }
    if (max_min > 0.0f) {
        float iscale = 15.0f / max_min;
        for (int j = 0; j < 16; j++)
            y->scales[j] = (uint8_t)(y->scales[j] | (unsigned)nearest_int(iscale * mins[j]) << 4);
        y->dmin = dx_f32_to_f16(max_min / 15.0f);
    }
}

/* Quants 0..3 of 256 elements, four to a byte (dx_kquant.h's layout). */
static void pack_2bit(const uint8_t *L, uint8_t *qs)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)(q[0] | q[32] << 2 | q[64] << 4 | q[96] << 6);
        }
}

static void q2k_block(const float *x, dx_block_q2_k *y)
{
    static const qkx_search search = {-0.5f, 0.1f, 15, 1};
    uint8_t L[DX_QK_K];
    float scales[16], mins[16];
    for (int j = 0; j < 16; j++) {
        float w[16];
        for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
        scales[j] = qkx_quants(x + 16 * j, w, 16, 3, &search, L + 16 * j, &mins[j]);
    }
    q2k_scales(scales, mins, y);
    float d = dx_f16_to_f32(y->d), dmin = dx_f16_to_f32(y->dmin);
    for (int j = 0; j < 16; j++)
        requant_affine(x + 16 * j, 16, d * (float)(y->scales[j] & 15),
                       dmin * (float)(y->scales[j] >> 4), 3, L + 16 * j);
    pack_2bit(L, y->qs);
}

void dx_f32_to_q2_k_row(const float *src, dx_block_q2_k *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK_K; b++) q2k_block(src + b * DX_QK_K, &dst[b]);
}

/* ---- Q3_K: make_q3_quants ---- */

/* One pass of coordinate descent: each element moved to the quant that the
 * others' least-squares scale suggests, kept when the fit (sumlx^2 /
 * suml2, weights x^2) improves; how many moved. */
static int q3_refine(const float *x, int8_t *L, float *sumlx, float *suml2)
{
    int changed = 0;
    for (int i = 0; i < 16; i++) {
        float w = x[i] * x[i];
        float slx = *sumlx - w * x[i] * (float)L[i];
        if (!(slx > 0.0f)) continue;
        float sl2 = *suml2 - w * (float)L[i] * (float)L[i];
        int l = clamp_int(nearest_int(x[i] * sl2 / slx), -4, 3);
        if (l == L[i]) continue;
        slx += w * x[i] * (float)l;
        sl2 += w * (float)l * (float)l;
        if (sl2 > 0.0f && slx * slx * *suml2 > *sumlx * *sumlx * sl2) {
            L[i] = (int8_t)l;
            *sumlx = slx;
            *suml2 = sl2;
            changed++;
        }
    }
    return changed;
}

/* The signed scale of 16 elements on -4..3 (L gets the quants + 4; 0 for
 * an all-zero sub-block): the grid -M/4, then up to 5 refinement passes. */
static float q3_quants(const float *x, int8_t *L)
{
    float amax, max = signed_amax(x, 16, &amax);
    if (amax < 1e-15f) {
        memset(L, 0, 16);
        return 0.0f;
    }
    float iscale = -4.0f / max, sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < 16; i++) {
        int l = clamp_int(nearest_int(iscale * x[i]), -4, 3);
        float w = x[i] * x[i];
        L[i] = (int8_t)l;
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int t = 0; t < 5 && q3_refine(x, L, &sumlx, &suml2); t++) {
    }
    for (int i = 0; i < 16; i++) L[i] = (int8_t)(L[i] + 4);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Sub-block scales as 6-bit multiples (-32..31) of d = -max_scale / 32,
 * max_scale the one of largest magnitude. */
static void q3k_scales(const float *scales, dx_block_q3_k *y)
{
    float max_scale = signed_max_of(scales, 16);
    memset(y->scales, 0, 12);
    y->d = dx_f32_to_f16(0.0f);
    if (max_scale == 0.0f) return;
    float iscale = -32.0f / max_scale;
    for (int j = 0; j < 16; j++) {
        int8_t l8 = (int8_t)nearest_int(iscale * scales[j]);
        int l = clamp_int(l8, -32, 31) + 32;
        if (j < 8)
            y->scales[j] = (uint8_t)(l & 15);
        else
            y->scales[j - 8] = (uint8_t)(y->scales[j - 8] | (l & 15) << 4);
        y->scales[8 + j % 4] = (uint8_t)(y->scales[8 + j % 4] | (l >> 4) << (2 * (j / 4)));
    }
    y->d = dx_f32_to_f16(1.0f / iscale);
}

static void q3k_block(const float *x, dx_block_q3_k *y)
{
    int8_t L[DX_QK_K];
    float scales[16];
    for (int j = 0; j < 16; j++) scales[j] = q3_quants(x + 16 * j, L + 16 * j);
    q3k_scales(scales, y);
    int sc[16];
    dx_q3k_scales(y->scales, sc);
    for (int j = 0; j < 16; j++) {
        float d = dx_f16_to_f32(y->d) * (float)(sc[j] - 32);
        if (d == 0.0f) continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(clamp_int(nearest_int(x[16 * j + i] / d), -4, 3) + 4);
    }
    /* bit 2 of element i goes to bit i / 32 of hmask[i % 32] */
    uint8_t lo[DX_QK_K];
    memset(y->hmask, 0, 32);
    for (int i = 0; i < DX_QK_K; i++) {
        if (L[i] > 3) y->hmask[i % 32] = (uint8_t)(y->hmask[i % 32] | 1u << (i / 32));
        lo[i] = (uint8_t)(L[i] & 3);
    }
    pack_2bit(lo, y->qs);
}

void dx_f32_to_q3_k_row(const float *src, dx_block_q3_k *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK_K; b++) q3k_block(src + b * DX_QK_K, &dst[b]);
}

/* ---- Q4_K / Q5_K ---- */

/* Sub-block scales and minimums as 6-bit multiples of d = max_scale / 63
 * and dmin = max_min / 63, packed as dx_k4_scale_min reads them. */
static void k45_scales(const float *scales, const float *mins, uint16_t *d, uint16_t *dmin,
                       uint8_t *q)
{
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; j++) {
        /* llama.cpp narrows to 8 bits before clamping to 63 */
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            q[j] = ls;
            q[j + 4] = lm;
        } else {
            q[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
            q[j - 4] = (uint8_t)(q[j - 4] | (ls >> 4) << 6);
            q[j] = (uint8_t)(q[j] | (lm >> 4) << 6);
        }
    }
    *d = dx_f32_to_f16(max_scale / 63.0f);
    *dmin = dx_f32_to_f16(max_min / 63.0f);
}

/* The quants 0..nmax of a Q4_K / Q5_K super-block and its d, dmin and
 * scales: per 32 elements the qkx search with weights rms(x) + |x|, then
 * every element requantised on the stored grid. */
static void k45_block(const float *x, int nmax, const qkx_search *search, uint16_t *d16, uint8_t *q,
                      uint8_t *L)
{
    float scales[8], mins[8];
    for (int j = 0; j < 8; j++) {
        const float *xb = x + 32 * j;
        float sum_x2 = 0.0f, w[32];
        for (int l = 0; l < 32; l++) sum_x2 += xb[l] * xb[l];
        float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xb[l]);
        scales[j] = qkx_quants(xb, w, 32, nmax, search, L + 32 * j, &mins[j]);
    }
    k45_scales(scales, mins, &d16[0], &d16[1], q);
    float d = dx_f16_to_f32(d16[0]), dmin = dx_f16_to_f32(d16[1]);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        dx_k4_scale_min(q, j, &sc, &m);
        requant_affine(x + 32 * j, 32, d * (float)sc, dmin * (float)m, nmax, L + 32 * j);
    }
}

/* Low nibbles of 256 quants: per 64, element j < 32 low, 32 + j high. */
static void pack_k4_nibbles(const uint8_t *L, uint8_t *qs)
{
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            qs[32 * c + l] = (uint8_t)((L[64 * c + l] & 15) | (L[64 * c + l + 32] & 15) << 4);
}

void dx_f32_to_q4_k_row(const float *src, dx_block_q4_k *dst, size_t n)
{
    static const qkx_search search = {-1.0f, 0.1f, 20, 0};
    for (size_t b = 0; b < n / DX_QK_K; b++) {
        uint8_t L[DX_QK_K];
        uint16_t d16[2];
        k45_block(src + b * DX_QK_K, 15, &search, d16, dst[b].scales, L);
        dst[b].d = d16[0];
        dst[b].dmin = d16[1];
        pack_k4_nibbles(L, dst[b].qs);
    }
}

void dx_f32_to_q5_k_row(const float *src, dx_block_q5_k *dst, size_t n)
{
    static const qkx_search search = {-0.5f, 0.1f, 15, 0};
    for (size_t b = 0; b < n / DX_QK_K; b++) {
        uint8_t L[DX_QK_K];
        uint16_t d16[2];
        k45_block(src + b * DX_QK_K, 31, &search, d16, dst[b].scales, L);
        dst[b].d = d16[0];
        dst[b].dmin = d16[1];
        pack_k4_nibbles(L, dst[b].qs);
        memset(dst[b].qh, 0, 32);
        for (int i = 0; i < DX_QK_K; i++) {
            int c = i / 64, j = i % 64;
            if (L[i] > 15)
                dst[b].qh[j % 32] = (uint8_t)(dst[b].qh[j % 32] | 1u << (2 * c + j / 32));
        }
    }
}

/* ---- Q6_K: make_qx_quants ---- */

/* sum w*x*l and sum w*l*l (w = x^2) for l = clamp(round(iscale * x),
 * -32, 31); L (if given) gets l + 32. */
static void qx_sums(const float *x, float iscale, int8_t *L, float *sumlx, float *suml2)
{
    float a = 0.0f, b = 0.0f;
    for (int i = 0; i < 16; i++) {
        int l = clamp_int(nearest_int(iscale * x[i]), -32, 31);
        float w = x[i] * x[i];
        if (L) L[i] = (int8_t)(l + 32);
        a += w * x[i] * (float)l;
        b += w * (float)l * (float)l;
    }
    *sumlx = a;
    *suml2 = b;
}

/* The signed scale of 16 elements on -32..31 (L the quants + 32; 0 for an
 * all-zero sub-block): least squares on the grid -M/32, then on the 18
 * grids -(32 + 0.1 is)/M, is = -9..9 but 0, kept when the fit improves. */
static float qx_quants(const float *x, int8_t *L)
{
    float amax, max = signed_amax(x, 16, &amax);
    if (amax < 1e-15f) {
        memset(L, 0, 16);
        return 0.0f;
    }
    float sumlx, suml2;
    qx_sums(x, -32.0f / max, L, &sumlx, &suml2);
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        float iscale = -(32.0f + 0.1f * (float)is) / max;
        qx_sums(x, iscale, NULL, &sumlx, &suml2);
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            qx_sums(x, iscale, L, &sumlx, &suml2);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Quants 0..63 of 256 elements: low nibbles in ql, bits 4-5 in qh
 * (dx_kquant.h's layout). */
static void pack_q6(const int8_t *L, uint8_t *ql, uint8_t *qh)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int8_t *q = L + 128 * h + l;
            ql[64 * h + l] = (uint8_t)((q[0] & 15) | (q[64] & 15) << 4);
            ql[64 * h + l + 32] = (uint8_t)((q[32] & 15) | (q[96] & 15) << 4);
            qh[32 * h + l] =
                (uint8_t)(q[0] >> 4 | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 | (q[96] >> 4) << 6);
        }
}

static void q6k_block(const float *x, dx_block_q6_k *y)
{
    int8_t L[DX_QK_K];
    float scales[16];
    for (int j = 0; j < 16; j++) scales[j] = qx_quants(x + 16 * j, L + 16 * j);
    float max_scale = signed_max_of(scales, 16);
    if (fabsf(max_scale) < 1e-15f) {
        memset(y, 0, sizeof *y);
        return;
    }
    float iscale = -128.0f / max_scale;
    y->d = dx_f32_to_f16(1.0f / iscale);
    for (int j = 0; j < 16; j++) {
        int l = nearest_int(iscale * scales[j]);
        y->scales[j] = (int8_t)(l < 127 ? l : 127);
    }
    for (int j = 0; j < 16; j++) {
        float d = dx_f16_to_f32(y->d) * (float)y->scales[j];
        if (d == 0.0f) continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(clamp_int(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
    }
    pack_q6(L, y->ql, y->qh);
}

void dx_f32_to_q6_k_row(const float *src, dx_block_q6_k *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK_K; b++) q6k_block(src + b * DX_QK_K, &dst[b]);
}

/* ---- IQ4_XS ---- */

/* Sub-block s's scale as a 6-bit multiple (-32..31) of d = -max_scale / 32,
 * then its elements the nearest codebook entries for that scale. */
static void iq4xs_block(const float *x, dx_block_iq4_xs *y)
{
    float scales[8];
    for (int s = 0; s < 8; s++) scales[s] = dx_iq4nl_block_scale(x + 32 * s);
    /* an all-zero super-block gives d = -0 (0x8000), as in llama.cpp */
    float d = -signed_max_of(scales, 8) / 32.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = dx_f32_to_f16(d);
    y->scales_h = 0;
    for (int s = 0; s < 8; s++) {
        int l = clamp_int(nearest_int(id * scales[s]), -32, 31);
        float dl = d * (float)l, idl = dl != 0.0f ? 1.0f / dl : 0.0f;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)dx_iq4nl_nearest(idl * x[32 * s + j]);
        for (int j = 0; j < 16; j++) y->qs[16 * s + j] = (uint8_t)(q[j] | q[j + 16] << 4);
        l += 32;
        if (s % 2 == 0)
            y->scales_l[s / 2] = (uint8_t)(l & 15);
        else
            y->scales_l[s / 2] = (uint8_t)(y->scales_l[s / 2] | (l & 15) << 4);
        y->scales_h = (uint16_t)(y->scales_h | (l >> 4) << (2 * s));
    }
}

void dx_f32_to_iq4_xs_row(const float *src, dx_block_iq4_xs *dst, size_t n)
{
    for (size_t b = 0; b < n / DX_QK_K; b++) iq4xs_block(src + b * DX_QK_K, &dst[b]);
}
