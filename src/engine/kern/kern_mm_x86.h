/* kern_mm_x86: vector helpers the x86 matmul files share (AVX2 and up),
 * for the files built with those instruction sets only (kern_mm_avx2.c,
 * kern_mm_avx512.c, kern_mm_amx.c); the scalar twins never include it. */
#ifndef KERN_MM_X86_H
#define KERN_MM_X86_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/dx_kquant.h"

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

/* Q3_K: the 16 6-bit scales (0..63, before the -32).  The 16 bytes end at
 * d (the block's last bytes), so q[i] = scales[i] is byte 2 + i; low
 * nibbles: q[0..7] low then high nibbles; high 2 bits: bits 2(s/4) of
 * q[8 + s%4]. */
static inline __m128i kern__q3k_scales_v(const uint8_t *b)
{
    __m128i x = _mm_loadu_si128((const __m128i *)(b + offsetof(dx_block_q3_k, scales) - 2));
    __m128i v = _mm_shuffle_epi8(x, _mm_setr_epi8(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9));
    __m128i lo = _mm_and_si128(_mm_srlv_epi64(v, _mm_set_epi64x(4, 0)), _mm_set1_epi8(15));
    __m128i h = _mm_shuffle_epi8(
        x, _mm_setr_epi8(10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13));
    h = _mm_and_si128(_mm_srlv_epi32(h, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_or_si128(lo, _mm_slli_epi32(h, 4));
}

/* IQ4_XS: the 8 scales ls - 32 as int32 (ls: a nibble of scales_l under 2
 * bits of scales_h). */
static inline __m256i kern__iq4xs_scales_v(const uint8_t *b)
{
    uint16_t sh;
    uint32_t sl;
    memcpy(&sh, b + 2, 2);
    memcpy(&sl, b + 4, 4);
    __m256i l = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl),
                                                   _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                 _mm256_set1_epi32(15));
    __m256i h = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
        _mm256_set1_epi32(3));
    return _mm256_sub_epi32(_mm256_or_si256(l, _mm256_slli_epi32(h, 4)), _mm256_set1_epi32(32));
}

/* Lane t * NR + o (t < MR, o < NR; MR * NR <= 8): row o's f16 at offset
 * off, widened; the super-block tiles' d and dmin. */
static inline __attribute__((always_inline)) __m256
kern__kq_rows_f16(const uint8_t *w, size_t wrow, size_t off, const int MR, const int NR)
{
    uint16_t h[8] = {0};
#pragma GCC unroll 8
    for (int i = 0; i < MR * NR; i++) memcpy(&h[i], w + (size_t)(i % NR) * wrow + off, 2);
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3],
                                          (short)h[4], (short)h[5], (short)h[6], (short)h[7]));
}

/* (q0 + q2) + (q1 + q3): the last two levels of both ISAs' tile
 * reductions (mm_reduce16, mm2_reduce8) for one vector's four partial sums,
 * so a single-row tile stores the bits the wide tiles do. */
static inline float kern__hsum4(__m128 q)
{
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}

/* Decode reads a tile's NR rows once: NR streams, each a row.  The next
 * tile's rows are the NR * wrow bytes after this tile's, and each of a
 * tile's `steps` steps prefetches a slice of them, so that by the last
 * step the whole next tile is on its way.  A row shorter than 2 KiB (a
 * 1024-element Q8_0 row is 17 lines, a Q4_K one 9) ends before the
 * hardware prefetchers have learnt its stream: there the slices go in
 * address order, row after row (bench_mm: 1.4-1.9x the rate on
 * 1024-element Q8_0, Q4_0 and Q6_K rows).  Longer rows take a slice of
 * each row at the step's own offset, one tile ahead of what the step
 * reads, and leave the rest to the hardware.
 *
 * The slices go to L2 (T1), not L1: a T0 prefetch that misses holds one of
 * the core's few L1 fill buffers for the whole trip to memory, so the
 * tile's own loads queue behind them; from L2 the tile's loads still hit
 * within a dozen cycles (Intel Xeon with AMX, qwen3-0.6b tg64: Q4_K_M
 * 49.6 -> 52.7 tok/s, Q8_0 33.8 -> 35.3, no type slower; two more tiles of
 * lead were slower). */
#define KERN_PF_HINT _MM_HINT_T1
typedef struct {
    const char *p;   /* where the next slice starts (of row 0, for a slice of each row) */
    const char *end; /* the end of the next tile: address order stops there */
    const char *q;   /* a slice of each row: row 0's first byte not yet asked for */
    size_t per;      /* bytes a step: whole lines in address order, else of each row */
    size_t wrow;     /* 0: address order; else the row pitch of a slice of each row */
} kern__pf;

static inline __attribute__((always_inline)) kern__pf
kern__pf_next_tile(const uint8_t *w, size_t wrow, int NR, size_t steps)
{
    size_t span = (size_t)NR * wrow;
    steps = steps ? steps : 1;
    kern__pf f = {(const char *)w + span, (const char *)w + 2 * span, (const char *)w + span, 0,
                  wrow < 2048 ? 0 : wrow};
    f.per = f.wrow ? (wrow + steps - 1) / steps : ((span + steps - 1) / steps + 63) & ~(size_t)63;
    return f;
}

/* One step's slice (MR = 1 tiles only: a prefill tile reuses its rows). */
static inline __attribute__((always_inline)) void kern__pf_step(kern__pf *f, const int NR)
{
    if (!f->wrow) {
        for (size_t i = 0; i < f->per && f->p < f->end; i += 64, f->p += 64)
            _mm_prefetch(f->p, KERN_PF_HINT);
        return;
    }
    /* each line once: a row's addresses 64 apart from where the last step
     * stopped, up to the slice's end (a line or two a row) */
    f->p += f->per;
    for (; f->q < f->p; f->q += 64)
        for (int o = 0; o < NR; o++) _mm_prefetch(f->q + (size_t)o * f->wrow, KERN_PF_HINT);
}

#endif
