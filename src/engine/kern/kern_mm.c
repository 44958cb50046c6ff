/* kern_mm: matmul entry points — activation prep, ISA dispatch — the
 * blocking driver every vector ISA runs its tiles under (kern_mm_priv.h),
 * and the scalar reference kernels.
 *
 * The scalar reference is the plain definition: for each output element, a
 * sequential f32 sum over k of w*x in the consumed precision (bf16 x bf16
 * products are exact in f32; Q8_0 sums each block's integer dot exactly
 * and fmas it times d_w*d_x into the sum block by block; the other block
 * formats follow the arithmetic of kern_mm_priv.h, in kern_mm_blk.c, and
 * the super-block formats theirs, in kern_mm_kq.c).  It is also the
 * KERN_SCALAR engine path, so it too is batch invariant: each element's
 * arithmetic depends on nothing but its own row and token. */
#include <math.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern.h"
#include "engine/kern/kern_mm_priv.h"

/* Weight rows per block: as many as fit this in L2 (rounded down to the
 * ISA's block_rows), swept by every token tile before the next block. */
#define L2_BLOCK_BYTES (256u * 1024u)

static float dot_f32(const uint8_t *w, const uint8_t *x, size_t n);
static float dot_f16(const uint8_t *w, const uint8_t *x, size_t n);
static float dot_bf16(const uint8_t *w, const uint8_t *x, size_t n);
static float dot_q8_0(const uint8_t *w, const uint8_t *x, size_t n);

/* What each weight type's kernels consume, and its scalar reference (one
 * output element: a weight row against a prepared activation row). */
typedef struct {
    int act; /* KERN_ACT_* + 1; 0: no kernels for this type */
    float (*dot)(const uint8_t *w, const uint8_t *x, size_t n_in);
} wtype_kern;

static const wtype_kern k_wtypes[DX_DTYPE_ID_MAX] = {
    [DX_F32] = {KERN_ACT_F32 + 1, dot_f32},
    [DX_F16] = {KERN_ACT_F32 + 1, dot_f16},
    [DX_BF16] = {KERN_ACT_BF16 + 1, dot_bf16},
    [DX_Q8_0] = {KERN_ACT_Q8 + 1, dot_q8_0},
    [DX_Q4_0] = {KERN_ACT_Q8 + 1, kern__dot_q4_0},
    [DX_Q4_1] = {KERN_ACT_Q8 + 1, kern__dot_q4_1},
    [DX_Q5_0] = {KERN_ACT_Q8 + 1, kern__dot_q5_0},
    [DX_Q5_1] = {KERN_ACT_Q8 + 1, kern__dot_q5_1},
    [DX_IQ4_NL] = {KERN_ACT_Q8 + 1, kern__dot_iq4_nl},
    [DX_Q2_K] = {KERN_ACT_Q8K + 1, kern__dot_q2_k},
    [DX_Q3_K] = {KERN_ACT_Q8K + 1, kern__dot_q3_k},
    [DX_Q4_K] = {KERN_ACT_Q8K + 1, kern__dot_q4_k},
    [DX_Q5_K] = {KERN_ACT_Q8K + 1, kern__dot_q5_k},
    [DX_Q6_K] = {KERN_ACT_Q8K + 1, kern__dot_q6_k},
    [DX_IQ4_XS] = {KERN_ACT_Q8K + 1, kern__dot_iq4_xs},
};

int kern_act_kind(int wtype)
{
    if (wtype < 0 || wtype >= DX_DTYPE_ID_MAX || !k_wtypes[wtype].act) return DX_NONE;
    return k_wtypes[wtype].act - 1;
}

/* Bytes per token row of prepared activations of a kind; 0 if n_in does
 * not fit it. */
static size_t kind_row_bytes(int kind, size_t n_in)
{
    switch (kind) {
    case KERN_ACT_F32:
        return kern__act_k(n_in) * sizeof(float);
    case KERN_ACT_BF16:
        return kern__act_k(n_in) * sizeof(uint16_t);
    case KERN_ACT_Q8:
        return n_in % 32 ? 0 : kern__q8_row_bytes(n_in);
    case KERN_ACT_Q8K:
        return n_in % DX_QK_K ? 0 : n_in / DX_QK_K * KERN__Q8K_BYTES;
    }
    return 0;
}

/* A super-block format (256 elements a block) takes whole super-blocks. */
static size_t act_row_bytes(int wtype, size_t n_in)
{
    size_t be = dx_dtype_block_elems(wtype);
    if (be > 1 && n_in % be) return 0;
    return kind_row_bytes(kern_act_kind(wtype), n_in);
}

size_t kern_act_bytes(int wtype, size_t n_tok, size_t n_in)
{
    size_t row = act_row_bytes(wtype, n_in), total;
    if (dx_mul_overflow(row, n_tok, &total)) return 0;
    return total;
}

size_t kern_act_bytes_max(size_t n_tok, size_t n_in)
{
    size_t best = 0;
    for (int k = 0; k < KERN_ACT_KINDS; k++) {
        size_t row = kind_row_bytes(k, n_in), total;
        if (!dx_mul_overflow(row, n_tok, &total) && total > best) best = total;
    }
    return best;
}

/* The vector ISA's table, or NULL for the scalar path. */
static const kern_mm_isa *mm_isa(void)
{
    switch (kern_get_isa()) {
    case KERN_AMX: /* the AVX-512 tiles, and the AMX kernels by mm_drive */
    case KERN_AVX512:
        return &kern_mm_isa_avx512;
    case KERN_AVX2:
        return &kern_mm_isa_avx2;
    case KERN_SCALAR:
        break;
    }
    return NULL;
}

static void f32_prep_row(const float *x, size_t n_in, void *row)
{
    memcpy(row, x, n_in * sizeof(float));
    memset((float *)row + n_in, 0, (kern__act_k(n_in) - n_in) * sizeof(float));
}

static void bf16_prep_row_scalar(const float *x, size_t n_in, void *row)
{
    dx_f32_to_bf16_row(x, row, n_in);
    memset((uint16_t *)row + n_in, 0, (kern__act_k(n_in) - n_in) * sizeof(uint16_t));
}

static void q8_prep_row_scalar(const float *x, size_t n_in, void *out)
{
    uint8_t *row = out;
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

/* A KERN_ACT_Q8 row's tail from its pairs (kern_mm_priv.h): one pass for
 * every ISA's prep, whose pairs are the scalar prep's bits. */
static void q8_fill_tail(uint8_t *row, size_t n_in)
{
    uint8_t *tail = row + kern__q8_tail_off(n_in);
    memset(tail, 0, kern__q8_row_bytes(n_in) - kern__q8_tail_off(n_in));
    for (size_t b = 0; b < n_in / DX_QK8_0; b++) {
        const uint8_t *pair = row + (b / 2) * KERN__Q8_PAIR_BYTES;
        int32_t corr = 0, nc;
        for (int j = 0; j < 8; j++) {
            memcpy(&nc, pair + 64 + ((b % 2) * 8 + (size_t)j) * 4, 4);
            corr += nc;
        }
        memcpy(tail + 8 * b, &corr, 4);
        memcpy(tail + 8 * b + 4, kern__q8_d(row, b), 4);
    }
}

static const kern_mm_prep_fn k_scalar_prep[KERN_ACT_KINDS] = {
    [KERN_ACT_F32] = f32_prep_row,
    [KERN_ACT_BF16] = bf16_prep_row_scalar,
    [KERN_ACT_Q8] = q8_prep_row_scalar,
    [KERN_ACT_Q8K] = kern__q8k_prep_scalar,
};

void kern_act_prep(int wtype, const float *x, size_t n_tok, size_t n_in, void *act)
{
    int kind = kern_act_kind(wtype);
    size_t rb = kind_row_bytes(kind, n_in);
    DX_ASSERT(rb != 0); /* type and n_in were validated when the model loaded */
    const kern_mm_isa *isa = mm_isa();
    kern_mm_prep_fn prep = isa && isa->prep[kind] ? isa->prep[kind] : k_scalar_prep[kind];
    for (size_t t = 0; t < n_tok; t++) {
        uint8_t *row = (uint8_t *)act + t * rb;
        prep(x + t * n_in, n_in, row);
        if (kind == KERN_ACT_Q8) q8_fill_tail(row, n_in);
    }
}

size_t kern_matmul_tile(int wtype)
{
    (void)wtype;
    return 16;
}

/* ---- the blocking driver ---- */

/* Rows [o0, o1) for one tile of tokens: each shape in turn, widest first,
 * for as long as it fits. */
static void mm_rows(const kern_mm_tile *sh, const uint8_t *w, size_t wrow, const uint8_t *x,
                    size_t xrow, size_t n_in, size_t o0, size_t o1, float *y, size_t ldy)
{
    size_t o = o0;
    for (int i = 0; i < KERN_MM_SHAPES && sh[i].fn; i++)
        for (size_t nr = (size_t)sh[i].nr; o + nr <= o1; o += nr)
            sh[i].fn(w + o * wrow, wrow, x, xrow, n_in, y + o, ldy);
}

/* T's tiles, with `one` the shapes of a lone token. */
static void mm_tiles(const kern_mm_isa *isa, const kern_mm_tiles *T, const kern_mm_tile *one,
                     const uint8_t *w, size_t wrow, size_t n_in, size_t o0, size_t o1,
                     const uint8_t *act, size_t xrow, size_t n_tok, float *y, size_t ldy)
{
    size_t br = (size_t)isa->block_rows, mr = (size_t)(T->mr ? T->mr : isa->mr);
    size_t rb = (L2_BLOCK_BYTES / wrow) & ~(br - 1);
    if (rb < br) rb = br;
    for (size_t ob = o0; ob < o1; ob += rb) {
        size_t oe = o1 - ob < rb ? o1 : ob + rb;
        for (size_t t = 0; t < n_tok; t += mr) {
            size_t m = n_tok - t < mr ? n_tok - t : mr;
            mm_rows(m == 1 ? one : T->by[m], w, wrow, act + t * xrow, xrow, n_in, ob, oe,
                    y + t * ldy, ldy);
        }
    }
}

static void mm_drive(const kern_mm_isa *isa, int wtype, const void *w, size_t n_in, size_t o0,
                     size_t o1, const void *act, size_t n_tok, float *y, size_t ldy)
{
    const kern_mm_tiles *T = wtype >= 0 && wtype < DX_DTYPE_ID_MAX ? isa->tiles[wtype] : NULL;
    const kern_mm_tiles *D = T ? isa->decode[wtype] : NULL; /* one token's, if its own */
    if (wtype == DX_BF16 && isa == &kern_mm_isa_avx512 && kern_get_bf16_dot() == KERN_BF16_DPBF16)
        T = kern__avx512_bf16dp_tiles;
    size_t wrow = dx_dtype_row_bytes(wtype, n_in), xrow = act_row_bytes(wtype, n_in);
    DX_ASSERT(T && wrow && xrow);
    /* a lone token: its own tiles, or for the streamed types (unquantised
     * weights, F32/F16/BF16) under KERN_DECODE_ROWS the last shape (the
     * single row, which check_tile_shapes in the tests guarantees) alone */
    const kern_mm_tile *one = D ? D->by[1] : T->by[1];
    kern_mm_tile row1[2] = {{0}};
    int kind = kern_act_kind(wtype), streamed = kind == KERN_ACT_F32 || kind == KERN_ACT_BF16;
    if (streamed && kern_get_decode() == KERN_DECODE_ROWS) {
        int last = 0;
        while (last + 1 < KERN_MM_SHAPES && one[last + 1].fn) last++;
        row1[0] = one[last];
        one = row1;
    }
    const uint8_t *a = act;
    /* The super-block formats' prefill takes whole groups of 16 rows: AMX
     * groups of 16 tokens, then AVX-512 VNNI the tokens left (from
     * KERN__KQ512_MIN_TOK); the tiles the rest (the rows past the last
     * group for those tokens, then the last tokens) */
    enum kern_isa k = kern_get_isa();
    size_t og = o0 + ((o1 - o0) & ~(size_t)15), nt = 0;
    int kq = dx_dtype_block_elems(wtype) == DX_QK_K && og > o0;
    if (kq && k == KERN_AMX && kern__amx_has(wtype)) nt = n_tok & ~(size_t)15;
    if (nt)
        kern__amx_matmul(wtype, (const uint8_t *)w + o0 * wrow, wrow, a, xrow, n_in, og - o0, nt,
                         y + o0, ldy);
    if (kq && (k == KERN_AMX || k == KERN_AVX512) && n_tok - nt >= KERN__KQ512_MIN_TOK) {
        kern__kq512_matmul(wtype, (const uint8_t *)w + o0 * wrow, wrow, a + nt * xrow, xrow, n_in,
                           og - o0, n_tok - nt, y + nt * ldy + o0, ldy);
        nt = n_tok;
    }
    /* Q8_0: every token count in groups of rows, 16 on AVX-512, 8 on AVX2;
     * the tiles the rows past the last group */
    if (wtype == DX_Q8_0) {
        size_t g = k == KERN_AVX2 ? 8 : 16, oq = o0 + ((o1 - o0) & ~(g - 1));
        const uint8_t *wq = (const uint8_t *)w + o0 * wrow;
        if (oq > o0 && k == KERN_AVX2)
            kern__q8avx2_matmul(wq, wrow, a, xrow, n_in, oq - o0, n_tok, y + o0, ldy);
        else if (oq > o0)
            kern__q8512_matmul(wq, wrow, a, xrow, n_in, oq - o0, n_tok, y + o0, ldy);
        mm_tiles(isa, T, one, w, wrow, n_in, oq, o1, a, xrow, n_tok, y, ldy);
        return;
    }
    if (nt) {
        mm_tiles(isa, T, one, w, wrow, n_in, og, o1, a, xrow, nt, y, ldy);
        mm_tiles(isa, T, one, w, wrow, n_in, o0, o1, a + nt * xrow, xrow, n_tok - nt, y + nt * ldy,
                 ldy);
        return;
    }
    mm_tiles(isa, T, one, w, wrow, n_in, o0, o1, a, xrow, n_tok, y, ldy);
}

void kern_matmul(int wtype, const void *w, size_t n_in, size_t o0, size_t o1, const void *act,
                 size_t n_tok, float *y, size_t ldy)
{
    const kern_mm_isa *isa = mm_isa();
    if (isa)
        mm_drive(isa, wtype, w, n_in, o0, o1, act, n_tok, y, ldy);
    else
        kern_matmul_scalar(wtype, w, n_in, o0, o1, act, n_tok, y, ldy);
}

/* ---- scalar reference ---- */

static float dot_f32(const uint8_t *w8, const uint8_t *x8, size_t n)
{
    const float *w = (const float *)w8, *x = (const float *)x8;
    float s = 0.0f;
    for (size_t k = 0; k < n; k++) s += w[k] * x[k];
    return s;
}

static float dot_f16(const uint8_t *w8, const uint8_t *x8, size_t n)
{
    const float *x = (const float *)x8;
    float s = 0.0f;
    for (size_t k = 0; k < n; k++) {
        uint16_t h;
        memcpy(&h, w8 + 2 * k, 2);
        s += dx_f16_to_f32(h) * x[k];
    }
    return s;
}

static float dot_bf16(const uint8_t *w8, const uint8_t *x8, size_t n)
{
    const uint16_t *x = (const uint16_t *)x8;
    float s = 0.0f;
    for (size_t k = 0; k < n; k++) {
        uint16_t h;
        memcpy(&h, w8 + 2 * k, 2);
        s += dx_bf16_to_f32(h) * dx_bf16_to_f32(x[k]);
    }
    return s;
}

static float dot_q8_0(const uint8_t *w8, const uint8_t *xrow, size_t n)
{
    const dx_block_q8_0 *w = (const dx_block_q8_0 *)w8;
    float s = 0.0f;
    for (size_t b = 0; b < n / DX_QK8_0; b++) {
        const int8_t *xq = kern__q8_qs(xrow, b);
        float dx = *kern__q8_d(xrow, b);
        int32_t isum = 0;
        for (int j = 0; j < DX_QK8_0; j++) isum += (int32_t)w[b].qs[j] * xq[j];
        s = fmaf((float)isum, dx_f16_to_f32(w[b].d) * dx, s);
    }
    return s;
}

void kern_matmul_scalar(int wtype, const void *w, size_t n_in, size_t o0, size_t o1,
                        const void *act, size_t n_tok, float *y, size_t ldy)
{
    int kind = kern_act_kind(wtype);
    size_t rb = kind_row_bytes(kind, n_in), wrow = dx_dtype_row_bytes(wtype, n_in);
    DX_ASSERT(kind >= 0 && rb != 0 && wrow != 0);
    float (*dot)(const uint8_t *, const uint8_t *, size_t) = k_wtypes[wtype].dot;
    for (size_t t = 0; t < n_tok; t++) {
        const uint8_t *x = (const uint8_t *)act + t * rb;
        for (size_t o = o0; o < o1; o++)
            y[t * ldy + o] = dot((const uint8_t *)w + o * wrow, x, n_in);
    }
}
