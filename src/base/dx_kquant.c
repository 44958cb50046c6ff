/* dx_kquant: the super-block formats' scalar dequantisation (the definition
 * every kernel is checked against) and their deterministic quantisers; the
 * layouts and rules are in dx_kquant.h. */
#include "dx_kquant.h"

#include <math.h>
#include <string.h>

#include "dx_half.h"
#include "dx_quant.h"

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
