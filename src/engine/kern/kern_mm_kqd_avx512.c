/* kern_mm_kqd_avx512: the decode tiles (one token) of the super-block
 * formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) on AVX-512 VNNI, for the
 * driver in kern_mm.c (kern_mm_isa.decode): the matmul a generated token
 * spends its time in.
 *
 * The arithmetic is the super-block formats' of kern_mm_priv.h, bit for
 * bit: per super-block and row the integer sums A = sum sc * v * x and
 * B = sum m * bs are exact in any order, and the two float steps are the
 * scalar twin's, the same instructions as the AVX2 tiles' (which keep 2-7
 * tokens: their activations would outnumber the registers here).
 *
 * Why not the AVX2 tiles: they pay a vpmaddubsw, a vpmaddwd, an add and a
 * scale shuffle for 32 products, and from cache they run at about the
 * rate memory delivers, so the core has no time left to keep more of
 * memory's bandwidth busy.  Here a 512-bit vector of 64 weights takes one
 * vpmaddubsw against the token's quants in the same arrangement and one
 * vpdpwssd against its sub-blocks' scales (a vector's 128-bit lanes span
 * whole sub-blocks, so its scale vector is one in-lane shuffle of the
 * row's scales).  A weight vector is what one load gives (a nibble or a
 * crumb of 64 bytes), and the token's side is arranged to match, once a
 * super-block for all the tile's rows (kd_token).
 *
 * The tile's rows' sums meet in one reduction a super-block (unpack tree,
 * lane o = row o), where their f16 factors are gathered too, and the float
 * steps run for 8 rows in one vector.  Q4_K / Q5_K decode the scales of 4
 * rows at once (one 128-bit lane a row). */
#include <immintrin.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "engine/kern/kern_mm_priv.h"
#include "engine/kern/kern_mm_x86.h"

#define KD_INLINE static inline __attribute__((always_inline))
#define KD_UNROLL _Pragma("GCC unroll 16")
#define KD_NR_MAX 8

KD_INLINE int kd_k45(const int T)
{
    return T == DX_Q4_K || T == DX_Q5_K;
}

/* The token's quants in the arrangement of the format's weight vectors
 * (the file's comment): Q6_K 64 consecutive elements; Q4_K / Q5_K
 * [lo..lo+31 | lo+64..] with lo = 128(c/2) + 32(c%2); Q2_K / Q3_K (crumb c
 * of both halves) [32c.. | 128+32c..]; IQ4_XS 16 elements of each of 4
 * sub-blocks, [32(4h+L) + 16n ..] in lane L of vector c = 2h + n. */
KD_INLINE void kd_token(const uint8_t *x, __m512i *X, const int T)
{
    const int8_t *q = kern__q8k_qs(x, 0);
    KD_UNROLL
    for (int c = 0; c < 4; c++) {
        if (T == DX_Q6_K) {
            X[c] = _mm512_load_si512((const void *)(q + 64 * c));
        } else if (T == DX_IQ4_XS) {
            const int8_t *p = q + 128 * (c / 2);
            __m512i a = _mm512_load_si512((const void *)p),
                    b = _mm512_load_si512((const void *)(p + 64));
            X[c] = c % 2 ? _mm512_shuffle_i64x2(a, b, 0xdd) : _mm512_shuffle_i64x2(a, b, 0x88);
        } else {
            const int k45 = kd_k45(T);
            const int8_t *p = k45 ? q + 128 * (c / 2) + 32 * (c % 2) : q + 32 * c;
            X[c] =
                _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256((const __m256i *)p)),
                                   _mm256_load_si256((const __m256i *)(p + (k45 ? 64 : 128))), 1);
        }
    }
}

/* 128-bit lane L of the result: row L's 16 bytes at off (rows < n only;
 * the other lanes 0). */
KD_INLINE __m512i kd_rows16(const uint8_t *w, size_t wrow, size_t off, const int n)
{
    __m512i v = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(w + off)));
    if (n > 1) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(w + wrow + off)), 1);
    if (n > 2) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(w + 2 * wrow + off)), 2);
    if (n > 3) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(w + 3 * wrow + off)), 3);
    return v;
}

/* Q4_K / Q5_K: kern__k4_scales_v on four rows at once (raw: kd_rows16 at
 * 0); lane L: row L's 8 scales, then its 8 minimums. */
KD_INLINE __m512i kd_k4_scales(__m512i x)
{
    __m512i a = _mm512_shuffle_epi32(x, 0xed);
    __m512i c = _mm512_shuffle_epi32(x, 0xa5);
    __m512i lo =
        _mm512_and_si512(_mm512_srlv_epi32(a, _mm512_set4_epi32(4, 0, 0, 0)),
                         _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
    __m512i hi =
        _mm512_and_si512(_mm512_srli_epi32(c, 2), _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0));
    return _mm512_or_si512(lo, hi);
}

/* 128-bit lane L of v in all four (an immediate each, which clang wants
 * written out). */
KD_INLINE __m512i kd_lane(__m512i v, const int L)
{
    return L == 0   ? _mm512_shuffle_i32x4(v, v, 0x00)
           : L == 1 ? _mm512_shuffle_i32x4(v, v, 0x55)
           : L == 2 ? _mm512_shuffle_i32x4(v, v, 0xaa)
                    : _mm512_shuffle_i32x4(v, v, 0xff);
}

/* Lane o of the result: the sum of a[o]'s lanes, o < NR (exact). */
KD_INLINE __m256i kd_hsum(const __m512i *a, const int NR)
{
    if (NR == 1) return _mm256_castsi128_si256(_mm_cvtsi32_si128(_mm512_reduce_add_epi32(a[0])));
    __m512i u[2];
    KD_UNROLL
    for (int g = 0; g < NR / 4; g++) {
        const __m512i *r = a + 4 * g;
        __m512i t0 =
            _mm512_add_epi32(_mm512_unpacklo_epi32(r[0], r[1]), _mm512_unpackhi_epi32(r[0], r[1]));
        __m512i t1 =
            _mm512_add_epi32(_mm512_unpacklo_epi32(r[2], r[3]), _mm512_unpackhi_epi32(r[2], r[3]));
        /* 128-bit lane L: rows 4g..4g+3, lane L's share */
        u[g] = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
    }
    if (NR == 4) {
        __m256i h =
            _mm256_add_epi32(_mm512_castsi512_si256(u[0]), _mm512_extracti64x4_epi64(u[0], 1));
        return _mm256_castsi128_si256(
            _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    }
    __m512i v = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88),
                                 _mm512_shuffle_i32x4(u[0], u[1], 0xdd));
    v = _mm512_shuffle_i32x4(v, v, 0xd8); /* [u0 01, u1 01, u0 23, u1 23] */
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* Lane o: the sum of the 4 int32 of 128-bit lane o % 4 of b[o / 4]. */
KD_INLINE __m256i kd_hsum_lanes(const __m512i *b, const int NR)
{
    __m512i p = b[0], q = NR > 4 ? b[1] : _mm512_setzero_si512();
    __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi32(p, q), _mm512_unpackhi_epi32(p, q));
    t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, 0x4e)); /* lane L: [p_L, q_L, p_L, q_L] */
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), t));
}

/* A ternary-logic immediate: a | (b & c). */
#define KD_OR_AND 0xf8

/* A zmm of 32-bit rotate counts: lo in the low half, hi in the high. */
KD_INLINE __m512i kd_rot2(int lo, int hi)
{
    return _mm512_inserti64x4(_mm512_set1_epi32(lo), _mm256_set1_epi32(hi), 1);
}

/* 16-bit lane i of the result: word j(i / 8) of s (16 words), j(L) =
 * a + b * (L & 1) + c * (L >> 1): a scale vector, one sub-block a 128-bit
 * lane, from a row's 16-bit scales. */
KD_INLINE __m512i kd_pick16(__m512i s, int a, int b, int c)
{
    return _mm512_permutexvar_epi16(
        _mm512_setr_epi32(0x10001 * a, 0x10001 * a, 0x10001 * a, 0x10001 * a, 0x10001 * (a + b),
                          0x10001 * (a + b), 0x10001 * (a + b), 0x10001 * (a + b),
                          0x10001 * (a + c), 0x10001 * (a + c), 0x10001 * (a + c),
                          0x10001 * (a + c), 0x10001 * (a + b + c), 0x10001 * (a + b + c),
                          0x10001 * (a + b + c), 0x10001 * (a + b + c)),
        s);
}

/* acc minus (1 << sh) * sum sc * bs (a weight stored with that offset:
 * Q6_K 32, Q3_K 4), s16 the row's 16 scales, exact. */
KD_INLINE __m512i kd_minus_offset(__m512i acc, __m256i s16, const int sh, __m512i bs16)
{
    __m256i fo = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, sh));
    return _mm512_dpwssd_epi32(acc, _mm512_zextsi256_si512(fo), bs16);
}

/* Q4_K / Q5_K: vector c = 2h + n is nibble n of qs[64h..64h+63], sub-blocks
 * (4h + n | 4h + 2 + n), whose scales are bytes of rb, the row's lane of
 * the group's decoded scales; Q5_K's bit 4 is bit 4h + n of qh[i] in the
 * low half, 4h + 2 + n in the high, rotated onto bit 4. */
KD_INLINE __m512i kd_row_k45(const uint8_t *b, const __m512i *X, __m512i rb, const int T)
{
    static const int rot[4][2] = {{4, 2}, {3, 1}, {0, 30}, {31, 29}};
    const size_t qs = T == DX_Q4_K ? offsetof(dx_block_q4_k, qs) : offsetof(dx_block_q5_k, qs);
    __m512i acc = _mm512_setzero_si512(), hb = _mm512_setzero_si512();
    if (T == DX_Q5_K)
        hb = _mm512_broadcast_i64x4(
            _mm256_loadu_si256((const __m256i *)(b + offsetof(dx_block_q5_k, qh))));
    KD_UNROLL
    for (int h = 0; h < 2; h++) {
        __m512i q = _mm512_loadu_si512((const void *)(b + qs + 64 * h));
        KD_UNROLL
        for (int n = 0; n < 2; n++) {
            const int c = 2 * h + n, s0 = 4 * h + n, s1 = s0 + 2;
            __m512i v = _mm512_and_si512(n ? _mm512_srli_epi16(q, 4) : q, _mm512_set1_epi8(15));
            if (T == DX_Q5_K)
                v = _mm512_ternarylogic_epi32(v,
                                              _mm512_rolv_epi32(hb, kd_rot2(rot[c][0], rot[c][1])),
                                              _mm512_set1_epi8(0x10), KD_OR_AND);
            /* byte s of the lane, zero-extended, in each 16-bit lane */
            __m512i sc = _mm512_shuffle_epi8(
                rb, _mm512_inserti64x4(_mm512_set1_epi16((short)(0x8000 | s0)),
                                       _mm256_set1_epi16((short)(0x8000 | s1)), 1));
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(v, X[c]), sc);
        }
    }
    return acc;
}

/* Q6_K: half n's ql (64 bytes) gives elements 128n + 0..63 (low nibbles)
 * and 128n + 64..127 (high), under qh[32n..]'s bits 0-1 | 2-3 and 4-5 |
 * 6-7 rotated onto bits 4-5; vector c's lane L is sub-block 4c + L.  v = q
 * - 32: minus 32 * sum sc * bs, exact. */
KD_INLINE __m512i kd_row_q6k(const uint8_t *b, const __m512i *X, __m512i bs16)
{
    __m256i s16 = _mm256_cvtepi8_epi16(
        _mm_loadu_si128((const __m128i *)(b + offsetof(dx_block_q6_k, scales))));
    __m512i sz = _mm512_zextsi256_si512(s16), acc = _mm512_setzero_si512();
    KD_UNROLL
    for (int n = 0; n < 2; n++) {
        __m512i l = _mm512_loadu_si512((const void *)(b + 64 * n));
        __m512i h = _mm512_broadcast_i64x4(
            _mm256_loadu_si256((const __m256i *)(b + offsetof(dx_block_q6_k, qh) + 32 * n)));
        KD_UNROLL
        for (int k = 0; k < 2; k++) {
            const int c = 2 * n + k;
            __m512i v = _mm512_and_si512(k ? _mm512_srli_epi16(l, 4) : l, _mm512_set1_epi8(15));
            v = _mm512_ternarylogic_epi32(v,
                                          _mm512_rolv_epi32(h, k ? kd_rot2(0, 30) : kd_rot2(4, 2)),
                                          _mm512_set1_epi8(0x30), KD_OR_AND);
            acc =
                _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(v, X[c]), kd_pick16(sz, 4 * c, 1, 2));
        }
    }
    return kd_minus_offset(acc, s16, 5, bs16);
}

/* Q2_K / Q3_K: crumb k of qs[0..63] is element 32k + i of half 0 (low
 * 256 bits) and of half 1 (high); Q3_K adds 4 where bit k | 4 + k of
 * hmask[i] is set (rotated onto bit 2), v = that - 4: minus 4 * sum sc *
 * bs.  Lane L of vector k: sub-block 2k + (L & 1) + 8(L >> 1).  Q2_K's
 * minimums: *mb, the partial sums of B. */
KD_INLINE __m512i kd_row_q23(const uint8_t *b, const __m512i *X, __m512i bs16, __m512i *mb,
                             const int T)
{
    const size_t qs = T == DX_Q2_K ? offsetof(dx_block_q2_k, qs) : offsetof(dx_block_q3_k, qs);
    __m128i s8 = T == DX_Q2_K
                     ? _mm_loadu_si128((const __m128i *)(b + offsetof(dx_block_q2_k, scales)))
                     : _mm_sub_epi8(kern__q3k_scales_v(b), _mm_set1_epi8(32));
    __m256i s16 = T == DX_Q2_K ? _mm256_cvtepu8_epi16(_mm_and_si128(s8, _mm_set1_epi8(15)))
                               : _mm256_cvtepi8_epi16(s8);
    __m512i sz = _mm512_zextsi256_si512(s16), acc = _mm512_setzero_si512();
    __m512i q = _mm512_loadu_si512((const void *)(b + qs)), hb = _mm512_setzero_si512();
    if (T == DX_Q3_K)
        hb = _mm512_broadcast_i64x4(
            _mm256_loadu_si256((const __m256i *)(b + offsetof(dx_block_q3_k, hmask))));
    KD_UNROLL
    for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_and_si512(_mm512_srli_epi16(q, 2 * k), _mm512_set1_epi8(3));
        if (T == DX_Q3_K)
            v = _mm512_ternarylogic_epi32(v, _mm512_rolv_epi32(hb, kd_rot2((34 - k) % 32, 30 - k)),
                                          _mm512_set1_epi8(4), KD_OR_AND);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(v, X[k]), kd_pick16(sz, 2 * k, 1, 8));
    }
    if (T == DX_Q2_K) {
        __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(15)));
        *mb = _mm512_zextsi256_si512(_mm256_madd_epi16(m16, _mm512_castsi512_si256(bs16)));
        return acc;
    }
    return kd_minus_offset(acc, s16, 2, bs16);
}

/* IQ4_XS: lane L of qs[64h..64h+63] is sub-block 4h + L, its low nibbles
 * (n = 0) then its high ones; the codebook's signed values go into
 * vpmaddubsw as |v| against x negated where v < 0 (AVX-512 has no
 * vpsignb; |v| <= 127, so a pair's sum fits 16 bits). */
KD_INLINE __m512i kd_row_iq4xs(const uint8_t *b, const __m512i *X)
{
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)dx_iq4nl_values));
    __m512i sz = _mm512_zextsi256_si512(kern__iq4xs_scales_v(b)), acc = _mm512_setzero_si512();
    KD_UNROLL
    for (int h = 0; h < 2; h++) {
        __m512i q = _mm512_loadu_si512((const void *)(b + offsetof(dx_block_iq4_xs, qs) + 64 * h));
        __m512i sc = kd_pick16(sz, 8 * h, 2, 4); /* int32 scales: word 2s */
        KD_UNROLL
        for (int n = 0; n < 2; n++) {
            const int c = 2 * h + n;
            __m512i v = _mm512_shuffle_epi8(
                tbl, _mm512_and_si512(n ? _mm512_srli_epi16(q, 4) : q, _mm512_set1_epi8(15)));
            __m512i xs =
                _mm512_mask_sub_epi8(X[c], _mm512_movepi8_mask(v), _mm512_setzero_si512(), X[c]);
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(_mm512_abs_epi8(v), xs), sc);
        }
    }
    return acc;
}

KD_INLINE void kd_tile(KERN_MM_TILE_ARGS, const int T, const int NR)
{
    (void)xrow, (void)ldy;
    const size_t bb = kern__kq_bytes(T), nsb = n_in / DX_QK_K;
    const size_t doff = kern__kq_d_offset(T);
    const int has_m = kern__kq_has_min(T);
    __m256 sum = _mm256_setzero_ps(); /* lane o: row o */
    kern__pf pf = kern__pf_next_tile(w, wrow, NR, nsb);
    for (size_t s = 0; s < nsb; s++, w += bb, x += KERN__Q8K_BYTES) {
        kern__pf_step(&pf, NR);
        __m512i X[4];
        kd_token(x, X, T);
        __m512i bs16 =
            _mm512_zextsi256_si512(_mm256_load_si256((const __m256i *)kern__q8k_bs(x, 0)));
        __m512i acc[KD_NR_MAX], raw[2] = {0}, sc[2] = {0};
        if (kd_k45(T)) {
            KD_UNROLL
            for (int g = 0; g < (NR + 3) / 4; g++) {
                raw[g] = kd_rows16(w + (size_t)(4 * g) * wrow, wrow, 0, NR - 4 * g);
                sc[g] = kd_k4_scales(raw[g]);
            }
        }
        __m512i mb[KD_NR_MAX];
        KD_UNROLL
        for (int o = 0; o < NR; o++) {
            const uint8_t *b = w + (size_t)o * wrow;
            if (kd_k45(T))
                acc[o] = kd_row_k45(b, X, kd_lane(sc[o / 4], o % 4), T);
            else if (T == DX_Q6_K)
                acc[o] = kd_row_q6k(b, X, bs16);
            else if (T == DX_IQ4_XS)
                acc[o] = kd_row_iq4xs(b, X);
            else
                acc[o] = kd_row_q23(b, X, bs16, &mb[o], T);
        }
        __m256 dx = _mm256_set1_ps(kern__q8k_d(x, 0));
        __m256 d, dmin = _mm256_setzero_ps();
        __m256i mins = _mm256_setzero_si256();
        if (kd_k45(T)) {
            /* B: each sub-block's minimum (its lane's bytes 8-15) times the
             * sum of its two bsums */
            __m256i p32 = _mm256_madd_epi16(_mm512_castsi512_si256(bs16), _mm256_set1_epi16(1));
            __m512i bsp = _mm512_broadcast_i32x4(_mm256_cvtepi32_epi16(p32));
            const __m512i mpick = _mm512_set4_epi32((int)0x800f800e, (int)0x800d800c,
                                                    (int)0x800b800a, (int)0x80098008);
            __m512i bm[2];
            KD_UNROLL
            for (int g = 0; g < (NR + 3) / 4; g++)
                bm[g] = _mm512_madd_epi16(_mm512_shuffle_epi8(sc[g], mpick), bsp);
            mins = kd_hsum_lanes(bm, NR);
            /* d, dmin: dword 0 of each row's lane of raw */
            __m256i dd = _mm512_castsi512_si256(_mm512_permutex2var_epi32(
                raw[0], _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0),
                raw[1]));
            d = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dd));
            dmin = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(dd, 16)));
        } else {
            d = kern__kq_rows_f16(w, wrow, doff, 1, NR);
            if (T == DX_Q2_K) {
                dmin = kern__kq_rows_f16(w, wrow, doff + 2, 1, NR);
                mins = kd_hsum(mb, NR);
            }
        }
        sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(kd_hsum(acc, NR)), _mm256_mul_ps(d, dx), sum);
        if (has_m) sum = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, dx), sum);
    }
    float r[8];
    _mm256_storeu_ps(r, sum);
    KD_UNROLL
    for (int o = 0; o < NR; o++) y[o] = r[o];
}

#define KD_DEF(KIND, T)                                                                            \
    static void kd_##KIND##_8(KERN_MM_TILE_ARGS)                                                   \
    {                                                                                              \
        kd_tile(w, wrow, x, xrow, n_in, y, ldy, T, 8);                                             \
    }                                                                                              \
    static void kd_##KIND##_4(KERN_MM_TILE_ARGS)                                                   \
    {                                                                                              \
        kd_tile(w, wrow, x, xrow, n_in, y, ldy, T, 4);                                             \
    }                                                                                              \
    static void kd_##KIND##_1(KERN_MM_TILE_ARGS)                                                   \
    {                                                                                              \
        kd_tile(w, wrow, x, xrow, n_in, y, ldy, T, 1);                                             \
    }                                                                                              \
    const kern_mm_tiles kern__avx512_##KIND##_decode = {                                           \
        .by = {[1] = {{kd_##KIND##_8, 8}, {kd_##KIND##_4, 4}, {kd_##KIND##_1, 1}}},                \
        .mr = 1,                                                                                   \
    };

KD_DEF(q2_k, DX_Q2_K)
KD_DEF(q3_k, DX_Q3_K)
KD_DEF(q4_k, DX_Q4_K)
KD_DEF(q5_k, DX_Q5_K)
KD_DEF(q6_k, DX_Q6_K)
KD_DEF(iq4_xs, DX_IQ4_XS)
