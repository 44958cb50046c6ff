/* kern_mm_x86: vector helpers the x86 matmul files share (AVX2 and up),
 * for the files built with those instruction sets only: kern_mm_avx2.c and
 * kern_mm_amx.c include it, the scalar twins never do. */
#ifndef KERN_MM_X86_H
#define KERN_MM_X86_H

#include <immintrin.h>
#include <stdint.h>

/* Q4_K / Q5_K: bytes 0-7 the 6-bit scales of sub-blocks 0-7, bytes 8-15
 * their minimums.  scales[12] is three words u0 u1 u2 (after d, dmin):
 * scales 0-3 are u0's low 6 bits a byte, 4-7 u2's low nibbles under u0's
 * top 2 bits; minimums 0-3 u1's low 6 bits, 4-7 u2's high nibbles under
 * u1's top 2 bits. */
static inline __m128i kern__k4_scales_v(const uint8_t *b)
{
    __m128i x = _mm_loadu_si128((const __m128i *)b); /* [d dmin | u0 | u1 | u2] */
    __m128i a = _mm_shuffle_epi32(x, 0xed);          /* [u0 u2 u1 u2] */
    __m128i c = _mm_shuffle_epi32(x, 0xa5);          /* [u0 u0 u1 u1] */
    __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                               _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    __m128i hi = _mm_and_si128(_mm_srli_epi32(c, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

#endif
