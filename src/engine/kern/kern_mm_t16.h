/* kern_mm_t16: the super-block formats' weights of 16 rows transposed into
 * 4-byte lanes (lane o of a vector holds 4 consecutive elements of row o),
 * the layout both the AMX tiles' B operand and the AVX-512 VNNI prefill
 * kernel (kern_mm_kq_avx512.c) multiply against a token's quants, and the
 * transpose Q8_0's AVX-512 kernel (kern_mm_q8_avx512.c) uses too, for the
 * files built with AVX-512 (F, BW, VNNI) only.  The weights come out as the
 * formats' integer values v (kern_mm_priv.h): unsigned for Q2_K, Q4_K and
 * Q5_K, signed for Q3_K, Q6_K and IQ4_XS. */
#ifndef KERN_MM_T16_H
#define KERN_MM_T16_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/dx_kquant.h"
#include "engine/kern/kern_mm_priv.h"
#include "engine/kern/kern_mm_x86.h"

#define T16_INLINE static inline __attribute__((always_inline))

/* acc + vpdpbusd(w, the dword at p broadcast), or vpdpwssd, with the
 * broadcast folded into the instruction's memory operand ({1to16}).  GCC 12
 * emits a separate vpbroadcastd instead, which takes port 5 from the second
 * vpdpbusd pipe: 1.4x the rate of the super-block kernel's chains. */
T16_INLINE __m512i kern__dpbusd_b(__m512i acc, __m512i w, const uint8_t *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)p));
    return acc;
}
T16_INLINE __m512i kern__dpwssd_b(__m512i acc, __m512i w, const uint8_t *p)
{
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)p));
    return acc;
}

/* in[p] holds rows p and p + 8 (their 8 dwords each, one per 256-bit
 * half); out[k] gets dword k of every row, row o in lane o. */
T16_INLINE void kern__t16_transpose(const __m512i *in, __m512i *out)
{
    __m512i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) { /* rows 0-3 (and 8-11), then 4-7 (and 12-15) */
        __m512i *a = t + 4 * h, *b = u + 4 * h;
        b[0] = _mm512_unpacklo_epi64(a[0], a[2]);
        b[1] = _mm512_unpackhi_epi64(a[0], a[2]);
        b[2] = _mm512_unpacklo_epi64(a[1], a[3]);
        b[3] = _mm512_unpackhi_epi64(a[1], a[3]);
    }
    /* u[d] lane L holds rows 0-3's dword d + 4L' (L = 2 half + L'), u[d + 4] rows 4-7's */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int d = 0; d < 4; d++) {
        out[d] = _mm512_permutex2var_epi64(u[d], lo, u[d + 4]);
        out[d + 4] = _mm512_permutex2var_epi64(u[d], hi, u[d + 4]);
    }
}

/* v's bytes shifted right by n within each byte. */
T16_INLINE __m512i kern__t16_srl8(__m512i v, int n, int mask)
{
    return _mm512_and_si512(_mm512_srli_epi16(v, n), _mm512_set1_epi8((char)mask));
}

/* The 32 bytes at off of the 16 rows b[] transposed: lane o of out[k] is
 * row o's dword k. */
T16_INLINE void kern__t16_rows(const uint8_t *const *b, size_t off, __m512i *out)
{
    __m512i raw[8];
    for (int p = 0; p < 8; p++)
        raw[p] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b[p] + off))),
            _mm256_loadu_si256((const __m256i *)(b[p + 8] + off)), 1);
    kern__t16_transpose(raw, out);
}

/* Chunk c (elements 64c..64c+63) of the 16 rows' weights in the tile
 * layout: v[k] holds elements 4k..4k+3 of row o in lane o; hb: Q5_K's qh
 * or Q3_K's hmask transposed.  The element orders are dx_kquant.h's (the AVX2 tiles' chunk
 * j is elements 32j..32j+31, so this chunk is their 2c and 2c+1). */
T16_INLINE void kern__t16_weights(const uint8_t *const *b, int c, const __m512i *hb, __m512i *v,
                                  const int T)
{
    __m512i r[8], h[8];
    if (T == DX_Q2_K || T == DX_Q3_K) {
        /* element e: bits 4(c%2) + 2(e/32) of qs[32(c/2) + e%32]; Q3_K
         * takes 4 off where bit 4(c/2) + 2(c%2) + e/32 of hmask[e%32] is clear */
        const size_t qs = T == DX_Q2_K ? offsetof(dx_block_q2_k, qs) : offsetof(dx_block_q3_k, qs);
        const int n = c / 2, ks = 2 * (c % 2);
        kern__t16_rows(b, qs + 32 * (size_t)n, r);
        for (int k = 0; k < 16; k++) {
            __m512i q = kern__t16_srl8(r[k % 8], 2 * (ks + k / 8), 3);
            if (T == DX_Q3_K)
                q = _mm512_sub_epi8(
                    _mm512_add_epi8(
                        q, _mm512_slli_epi16(kern__t16_srl8(hb[k % 8], 4 * n + ks + k / 8, 1), 2)),
                    _mm512_set1_epi8(4));
            v[k] = q;
        }
        return;
    }
    if (T == DX_IQ4_XS) {
        /* sub-block 2c + e/32 is qs[32c + 16(e/32)..]: its bytes' low
         * nibbles are elements 0-15, the high ones 16-31, codebook indices */
        const __m512i book =
            _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)dx_iq4nl_values));
        kern__t16_rows(b, offsetof(dx_block_iq4_xs, qs) + 32 * (size_t)c, r);
        for (int k = 0; k < 16; k++) {
            int half = k / 8, q = k % 8;
            v[k] = _mm512_shuffle_epi8(book, kern__t16_srl8(r[4 * half + q % 4], 4 * (q / 4), 15));
        }
        return;
    }
    if (T == DX_Q6_K) {
        /* elements e: ql[64(c/2) + e]'s low (c even) or high nibble, under
         * bits 4(c%2) + 2(e/32) of qh[32(c/2) + e%32] */
        const int n = c / 2, ns = 4 * (c % 2);
        kern__t16_rows(b, offsetof(dx_block_q6_k, qh) + 32 * (size_t)n, h);
        for (int half = 0; half < 2; half++) {
            kern__t16_rows(b, offsetof(dx_block_q6_k, ql) + 64 * (size_t)n + 32 * (size_t)half, r);
            for (int k = 0; k < 8; k++) {
                __m512i q =
                    _mm512_or_si512(kern__t16_srl8(r[k], ns, 15),
                                    _mm512_slli_epi16(kern__t16_srl8(h[k], ns + 2 * half, 3), 4));
                v[8 * half + k] = _mm512_sub_epi8(q, _mm512_set1_epi8(32));
            }
        }
        return;
    }
    /* Q4_K / Q5_K: qs[32c + e%32]'s low (e < 32) or high nibble; Q5_K's
     * bit 4 is bit 2c + e/32 of qh[e%32] */
    const size_t qs = T == DX_Q4_K ? offsetof(dx_block_q4_k, qs) : offsetof(dx_block_q5_k, qs);
    kern__t16_rows(b, qs + 32 * (size_t)c, r);
    for (int half = 0; half < 2; half++)
        for (int k = 0; k < 8; k++) {
            __m512i q = kern__t16_srl8(r[k], 4 * half, 15);
            if (T == DX_Q5_K)
                q = _mm512_or_si512(q,
                                    _mm512_slli_epi16(kern__t16_srl8(hb[k], 2 * c + half, 1), 4));
            v[8 * half + k] = q;
        }
}

/* The 16 rows' sub-block scales as bytes, row o's 16 at out + o * pitch
 * (Q2_K its scales, sc | m << 4; Q3_K sc + 32; Q6_K its int8 scales;
 * IQ4_XS ls 0-7; Q4_K / Q5_K sc 0-7, then m 0-7), and the rows' d and dmin
 * widened (dmin 0 where the format has none). */
T16_INLINE void kern__t16_scales(const uint8_t *const *b, uint8_t *out, size_t pitch, __m512 *d,
                                 __m512 *dmin, const int T)
{
    const size_t doff = kern__kq_d_offset(T);
    uint16_t dh[16], mh[16] = {0};
    for (int o = 0; o < 16; o++) {
        __m128i sc =
            T == DX_IQ4_XS ? _mm256_cvtepi32_epi8(_mm256_add_epi32(kern__iq4xs_scales_v(b[o]),
                                                                   _mm256_set1_epi32(32)))
            : T == DX_Q2_K ? _mm_loadu_si128((const __m128i *)b[o])
            : T == DX_Q3_K ? kern__q3k_scales_v(b[o])
            : T == DX_Q6_K
                ? _mm_loadu_si128((const __m128i *)(b[o] + offsetof(dx_block_q6_k, scales)))
                : kern__k4_scales_v(b[o]);
        _mm_storeu_si128((__m128i *)(out + (size_t)o * pitch), sc);
        memcpy(&dh[o], b[o] + doff, 2);
        if (kern__kq_has_min(T)) memcpy(&mh[o], b[o] + doff + 2, 2);
    }
    *d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
    *dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh));
}

#endif
