/* kern_mm_kq: scalar twins of the super-block matmuls (Q2_K, Q3_K, Q4_K,
 * Q5_K, Q6_K, IQ4_XS against q8_K activations) — the definition of their
 * arithmetic (kern_mm_priv.h), which every ISA's tiles reproduce bit for
 * bit — the KERN_ACT_Q8K prep, and the KERN_SCALAR engine path.
 *
 * A super-block is decoded here into its 256 integer weights and its
 * sub-blocks' integer scales and minimums, walking the bytes the way GGML's
 * kernels do (a byte at a time into the elements it feeds, the packed
 * scales through 32-bit words) rather than dx_kquant's element-by-element
 * formulas, so that the tests comparing the two catch a layout slip in
 * either. */
#include <math.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern_mm_priv.h"

/* A super-block as integers: element i is d * sc[i / sub] * v[i]
 * (- dmin * mn[i / sub]). */
typedef struct {
    int v[DX_QK_K];
    int sc[16], mn[16];
    float d, dmin;
    int sub; /* elements per sub-block: 16 or 32 */
} kq_ints;

static float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return dx_f16_to_f32(h);
}

/* Q2_K / Q3_K's low 2 bits: element 32k + j of half n is bits 2k..2k+1 of
 * qs[32n + j]. */
static void crumbs(const uint8_t *qs, int *v)
{
    for (int n = 0; n < 2; n++)
        for (int j = 0; j < 32; j++)
            for (int k = 0; k < 4; k++) v[128 * n + 32 * k + j] = (qs[32 * n + j] >> (2 * k)) & 3;
}

static void dec_q2_k(const uint8_t *b, kq_ints *o)
{
    const dx_block_q2_k *x = (const dx_block_q2_k *)b;
    o->d = f16_at(b + offsetof(dx_block_q2_k, d));
    o->dmin = f16_at(b + offsetof(dx_block_q2_k, dmin));
    crumbs(x->qs, o->v);
    for (int s = 0; s < 16; s++) {
        o->sc[s] = x->scales[s] & 15;
        o->mn[s] = x->scales[s] >> 4;
    }
    o->sub = 16;
}

/* Q3_K's scales as GGML unpacks them: four words whose bytes are the
 * scales in order, the low nibbles from words 0-1 and the top bits from
 * word 2 two at a time. */
static void q3k_scales(const uint8_t *q, int *sc)
{
    uint32_t a[4], t;
    memcpy(a, q, 12);
    t = a[2];
    a[2] = ((a[0] >> 4) & 0x0f0f0f0fu) | (((t >> 4) & 0x03030303u) << 4);
    a[3] = ((a[1] >> 4) & 0x0f0f0f0fu) | (((t >> 6) & 0x03030303u) << 4);
    a[0] = (a[0] & 0x0f0f0f0fu) | ((t & 0x03030303u) << 4);
    a[1] = (a[1] & 0x0f0f0f0fu) | (((t >> 2) & 0x03030303u) << 4);
    for (int s = 0; s < 16; s++) sc[s] = (int)((a[s / 4] >> (8 * (s % 4))) & 0xff);
}

static void dec_q3_k(const uint8_t *b, kq_ints *o)
{
    const dx_block_q3_k *x = (const dx_block_q3_k *)b;
    o->d = f16_at(b + offsetof(dx_block_q3_k, d));
    crumbs(x->qs, o->v);
    for (int n = 0; n < 2; n++) /* the high bit: bit 4n + k of hmask[j] */
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 32; j++)
                o->v[128 * n + 32 * k + j] -= (x->hmask[j] >> (4 * n + k)) & 1 ? 0 : 4;
    q3k_scales(x->scales, o->sc);
    for (int s = 0; s < 16; s++) o->sc[s] -= 32;
    o->sub = 16;
}

/* Q4_K / Q5_K: d, dmin, then the 6-bit scales and minimums of the 8
 * sub-blocks as GGML's kernels unpack scales[12] through 32-bit words. */
static void k4_scales(const uint8_t *b, kq_ints *o)
{
    uint32_t u[4];
    memcpy(u, b + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    uint32_t mins_lo = u[1] & 0x3f3f3f3fu;
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = mins_lo;
    u[0] &= 0x3f3f3f3fu;
    uint8_t sm[16];
    memcpy(sm, u, 16);
    o->d = f16_at(b);
    o->dmin = f16_at(b + 2);
    for (int i = 0; i < 8; i++) {
        o->sc[i] = sm[i];
        o->mn[i] = sm[8 + i];
    }
}

/* Chunk c of 64: the low nibbles of qs[32c..32c+31], then their high ones;
 * bit 4 (Q5_K) from bits 2c and 2c + 1 of qh. */
static void dec_k45(const uint8_t *b, const uint8_t *qs, const uint8_t *qh, kq_ints *o)
{
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < 32; j++) {
            int lo = qs[32 * c + j] & 15, hi = qs[32 * c + j] >> 4;
            if (qh) {
                lo |= ((qh[j] >> (2 * c)) & 1) << 4;
                hi |= ((qh[j] >> (2 * c + 1)) & 1) << 4;
            }
            o->v[64 * c + j] = lo;
            o->v[64 * c + 32 + j] = hi;
        }
    k4_scales(b, o);
    o->sub = 32;
}

static void dec_q4_k(const uint8_t *b, kq_ints *o)
{
    dec_k45(b, ((const dx_block_q4_k *)b)->qs, NULL, o);
}

static void dec_q5_k(const uint8_t *b, kq_ints *o)
{
    const dx_block_q5_k *x = (const dx_block_q5_k *)b;
    dec_k45(b, x->qs, x->qh, o);
}

/* Q6_K: each ql byte of a half feeds two elements 64 apart (low and high
 * nibble), each qh byte four elements 32 apart (2 bits each). */
static void dec_q6_k(const uint8_t *b, kq_ints *o)
{
    const dx_block_q6_k *x = (const dx_block_q6_k *)b;
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = x->ql + 64 * n, *qh = x->qh + 32 * n;
        int *v = o->v + 128 * n;
        for (int l = 0; l < 32; l++) {
            v[l] = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
            v[l + 32] = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
            v[l + 64] = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            v[l + 96] = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
        }
    }
    o->d = f16_at(b + offsetof(dx_block_q6_k, d));
    for (int s = 0; s < 16; s++) o->sc[s] = x->scales[s];
    o->sub = 16;
}

static void dec_iq4_xs(const uint8_t *b, kq_ints *o)
{
    const dx_block_iq4_xs *x = (const dx_block_iq4_xs *)b;
    o->d = f16_at(b);
    for (int s = 0; s < 8; s++) {
        int ls = ((x->scales_l[s / 2] >> (4 * (s % 2))) & 15) | ((x->scales_h >> (2 * s)) & 3) << 4;
        o->sc[s] = ls - 32;
        for (int j = 0; j < 16; j++) {
            o->v[32 * s + j] = dx_iq4nl_values[x->qs[16 * s + j] & 15];
            o->v[32 * s + 16 + j] = dx_iq4nl_values[x->qs[16 * s + j] >> 4];
        }
    }
    o->sub = 32;
}

static void decode(int type, const uint8_t *b, kq_ints *o)
{
    switch (type) {
    case DX_Q2_K:
        dec_q2_k(b, o);
        break;
    case DX_Q3_K:
        dec_q3_k(b, o);
        break;
    case DX_Q4_K:
        dec_q4_k(b, o);
        break;
    case DX_Q5_K:
        dec_q5_k(b, o);
        break;
    case DX_Q6_K:
        dec_q6_k(b, o);
        break;
    case DX_IQ4_XS:
        dec_iq4_xs(b, o);
        break;
    default:
        DX_ASSERT(!"kern_mm_kq: not a super-block format");
    }
}

static float dot_kq(int type, const uint8_t *w, const uint8_t *x, size_t n_in)
{
    size_t bb = kern__kq_bytes(type);
    int has_m = kern__kq_has_min(type);
    float y = 0.0f;
    for (size_t sb = 0; sb < n_in / DX_QK_K; sb++) {
        kq_ints k = {.dmin = 0.0f};
        decode(type, w + sb * bb, &k);
        const int8_t *q = kern__q8k_qs(x, sb);
        const int16_t *bs = kern__q8k_bs(x, sb);
        float dx = kern__q8k_d(x, sb);
        int32_t a = 0, m = 0;
        for (int i = 0; i < DX_QK_K; i++) a += k.sc[i / k.sub] * k.v[i] * q[i];
        for (int j = 0; j < 16; j++) m += k.mn[16 * j / k.sub] * bs[j];
        y = fmaf((float)a, k.d * dx, y);
        if (has_m) y = fmaf((float)m, -(k.dmin * dx), y);
    }
    return y;
}

/* KERN_ACT_Q8K: the super-blocks of one activation row (kern_mm_priv.h). */
void kern__q8k_prep_scalar(const float *x, size_t n_in, void *row)
{
    for (size_t sb = 0; sb < n_in / DX_QK_K; sb++) {
        const float *xs = x + sb * DX_QK_K;
        uint8_t *o = (uint8_t *)row + sb * KERN__Q8K_BYTES;
        float amax = 0.0f;
        for (int i = 0; i < DX_QK_K; i++) amax = fmaxf(amax, fabsf(xs[i]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int8_t *q = (int8_t *)o;
        for (int i = 0; i < DX_QK_K; i++) q[i] = (int8_t)lrintf(xs[i] * id);
        for (int j = 0; j < 16; j++) {
            int16_t s = 0;
            for (int i = 0; i < 16; i++) s = (int16_t)(s + q[16 * j + i]);
            memcpy(o + 256 + 2 * j, &s, 2);
        }
        memcpy(o + 288, &d, 4);
        memset(o + 292, 0, KERN__Q8K_BYTES - 292);
    }
}

float kern__dot_q2_k(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_kq(DX_Q2_K, w, x, n_in);
}
float kern__dot_q3_k(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_kq(DX_Q3_K, w, x, n_in);
}
float kern__dot_q4_k(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_kq(DX_Q4_K, w, x, n_in);
}
float kern__dot_q5_k(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_kq(DX_Q5_K, w, x, n_in);
}
float kern__dot_q6_k(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_kq(DX_Q6_K, w, x, n_in);
}
float kern__dot_iq4_xs(const uint8_t *w, const uint8_t *x, size_t n_in)
{
    return dot_kq(DX_IQ4_XS, w, x, n_in);
}
