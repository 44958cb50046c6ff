/* kern: the engine's numeric kernels, each with a plain scalar reference and
 * AVX2+FMA / AVX-512 fast paths chosen at run time from the CPU's features.
 *
 * Batch invariance (a hard requirement): every output element is computed by
 * exactly one call with a reduction order that depends only on the element's
 * own inputs (the K dimension, the key positions) — never on how many tokens
 * are in the batch, where a token falls in a tile, how work is split across
 * threads, or which task computes it.  Tail tiles use the same per-element
 * arithmetic as full tiles.  So a token's K/V and logits are bit-identical
 * alone, batched, chunked, or after a reused prefix.  Different ISAs may
 * differ in the last bits (not the 4- and 5-bit block formats and the
 * super-block formats, whose every ISA computes the scalar twin's bits:
 * kern_mm_priv.h); one process uses one ISA throughout.
 *
 * Layouts: a weight matrix W is GGUF's [n_out][n_in] (row o holds n_in
 * elements of its dtype, rows contiguous); activations are row-major
 * [n_tok][n_in] f32. */
#ifndef KERN_H
#define KERN_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_dtype.h"

/* KERN_AMX is the AVX-512 path whose prefill matmuls of the super-block
 * formats (Q2_K..Q6_K, IQ4_XS) run on the AMX tile unit (kern_mm_amx.c);
 * everything
 * else, and every batch under 16 tokens, is the AVX-512 path's, so its bits
 * are the AVX-512 path's too. */
enum kern_isa { KERN_SCALAR = 0, KERN_AVX2 = 1, KERN_AVX512 = 2, KERN_AMX = 3 };

/* Best ISA this CPU (and, for AMX, the kernel: the tile state needs its
 * permission) supports. */
enum kern_isa kern_isa_detect(void);
/* The active ISA: default kern_isa_detect(), or DUPLEX_KERNELS=scalar|avx2|avx512|amx
 * (the first call reads it).  kern_set_isa fails with DX_EUNSUPPORTED if the
 * CPU lacks it. */
enum kern_isa kern_get_isa(void);
int kern_set_isa(enum kern_isa isa);
const char *kern_isa_name(enum kern_isa isa);

/* How the AVX-512 path multiplies BF16 weights.  KERN_BF16_FMA splits each
 * pair of bf16 into exact f32 halves for two FMAs (every AVX-512 CPU; the
 * faster way on Intel's cores, where vdpbf16ps issues every ~2 cycles);
 * KERN_BF16_DPBF16 issues vdpbf16ps (AVX512-BF16; AMD's Zen 4 runs it as
 * fast as an FMA, for twice the products).  Default: DPBF16 on an AMD CPU
 * with AVX512-BF16, FMA elsewhere, or DUPLEX_BF16_DOT=fma|dpbf16 (read by
 * the first call).  Both are batch invariant; they round differently (the
 * instruction adds the odd product first), so, as with the ISA, one
 * process keeps one.  kern_set_bf16_dot fails with DX_EUNSUPPORTED if the
 * CPU lacks AVX512-BF16. */
enum kern_bf16_dot { KERN_BF16_FMA = 0, KERN_BF16_DPBF16 = 1 };
enum kern_bf16_dot kern_bf16_dot_detect(void);
enum kern_bf16_dot kern_get_bf16_dot(void);
int kern_set_bf16_dot(enum kern_bf16_dot d);
const char *kern_bf16_dot_name(enum kern_bf16_dot d);

/* How a lone token (decode) walks the rows of the streamed weight types
 * (the unquantised ones: F16, BF16 and F32), whose
 * matmuls read every byte from memory once.  KERN_DECODE_TILES runs the
 * widest tile, 8 or 16 rows side by side; KERN_DECODE_ROWS one row at a
 * time, a single sequential stream per thread.  AMD's cores fetch one
 * stream well and many side by side badly (Zen 4, 2 threads streaming
 * 512 MB: 26-33 GB/s as one stream, 16-20 GB/s as 2 to 16 rows at a time;
 * BF16 decode 20 -> 25 tok/s), Intel's follow the 16 (BF16 decode at 90%
 * of the memory limit).  Default: ROWS on an AMD CPU with AVX-512 (Zen 4
 * on; Zen 2/3's AVX2 rows are unmeasured), TILES elsewhere, or
 * DUPLEX_DECODE=tiles|rows (read by the first call).  A row's element gets
 * the same instructions either way, so the two give the same bits. */
enum kern_decode { KERN_DECODE_TILES = 0, KERN_DECODE_ROWS = 1 };
enum kern_decode kern_decode_detect(void);
enum kern_decode kern_get_decode(void);
int kern_set_decode(enum kern_decode d);
const char *kern_decode_name(enum kern_decode d);

/* ---- matmul: y[t*ldy + o] = sum_k W[o][k] * x[t][k] ----
 * Weight types: every one dx_dtype_supported() lists (F32, F16, BF16, Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS).
 * Step 1, once per matmul: convert the activations into what the weight
 * type's kernel consumes (F32/F16 weights: f32 as is; BF16: bf16 rows; the
 * 32-block formats: q8_0 blocks with their sums, n_in % 32 == 0; the
 * super-block formats: q8_K super-blocks with their sums, n_in % 256 ==
 * 0).  act must
 * hold kern_act_bytes() bytes, 64-byte aligned.  Weight types of the same
 * kern_act_kind() consume the same prepared activations, so one prep serves
 * them all. */
size_t kern_act_bytes(int wtype, size_t n_tok, size_t n_in);
/* The most kern_act_bytes() can be for any weight type. */
size_t kern_act_bytes_max(size_t n_tok, size_t n_in);
void kern_act_prep(int wtype, const float *x, size_t n_tok, size_t n_in, void *act);
/* Which prepared layout a weight type consumes (a small integer), or
 * DX_NONE (base/dx_err.h) for a type without kernels. */
int kern_act_kind(int wtype);
/* Step 2, per thread task: output columns [o0, o1) for all n_tok tokens.
 * Any split of [0, n_out) into tasks gives identical bits. */
void kern_matmul(int wtype, const void *w, size_t n_in, size_t o0, size_t o1, const void *act,
                 size_t n_tok, float *y, size_t ldy);
/* Preferred granularity of [o0, o1) splits (a multiple of the kernel's tile). */
size_t kern_matmul_tile(int wtype);

/* ---- paged attention over the KV pool ----
 * A KV block holds block_size tokens of all layers.  Within a block, this
 * layer's K is stored transposed: for kv head h, dim d, token j at
 *   base + block*block_bytes + k_off + ((h*head_dim + d)*block_size + j)*esize
 * so one dim of consecutive keys is contiguous and a vector of 16 keys'
 * scores grows by one FMA per dim; V is row-major, at
 *   base + block*block_bytes + v_off + ((h*block_size + j)*head_dim + d)*esize.
 * The vector paths need block_size and head_dim multiples of 16; other
 * layouts run the scalar path (a choice fixed by the layout, so the same for
 * every call).
 *
 * q8_0 (DX_Q8_0, head_dim a multiple of 32): each element is an int8 and
 * each group of 32 consecutive dims of one token's row has an f16 scale
 * (value = scale * quant, which is exact in f32).  A kv head's region is
 * block_size*head_dim quant bytes followed by the block_size*head_dim/32
 * scales (17/16 bytes an element):
 *   K quant (j, d) at byte ((d/4)*block_size + j)*4 + d%4: transposed in
 *     quads of dims, so one 64-byte vector holds 4 dims of 16 keys and an
 *     integer dot-product instruction (VNNI vpdpbusd, AVX2 vpmaddubsw) adds
 *     each key's 4 products in its own lane — still no horizontal sums;
 *   K scale (j, g) at quants + ((g*block_size + j)*2): 16 keys' scales of a
 *     group are one vector;
 *   V quant (j, d) at j*head_dim + d, V scale (j, g) at quants +
 *     (j*(head_dim/32) + g)*2: row-major, as for the other dtypes.
 * Why groups along a token's row and not along tokens: a token's K/V is
 * quantised once, when it is written, from its own values alone — a scale
 * shared with later tokens would have to change as they arrive (re-
 * quantising what was stored) or wait for them in a second format.  So the
 * stored bytes depend on nothing but the token, and reuse, pulls and
 * recompute stay byte-identical.  For K the groups lie along the reduction
 * dimension, which is what lets the score be a sum over groups of
 * scale x exact integer dot.
 * Scores with a q8_0 K are integer dots: the query row is quantised the same
 * way (kern_q8_quant: int8, one f16 scale per 32 dims) and
 *   s_j = scale * sum over g in order of fma(idot_g, qscale_g*kscale_jg, .)
 * where idot_g is the exact int32 dot of group g (qscale*kscale, two f16s,
 * is exact too), so every ISA gives the scalar twin's bits.  V is
 * dequantised exactly in registers and summed like the other dtypes. */
typedef struct {
    const uint8_t *base;
    size_t block_bytes;
    size_t k_off, v_off; /* this layer's K / V region within a block */
    int kv_type;         /* DX_F16 | DX_BF16 | DX_F32 | DX_Q8_0 */
    int block_size, head_dim, n_head, n_kv_head;
    float scale; /* usually 1/sqrt(head_dim) */
} kern_attn_layout;

/* Bytes of one kv head's K (or V) region in a block: block_size*head_dim
 * elements, or for q8_0 their quants and scales. */
static inline size_t kern_attn_head_bytes(int kv_type, size_t block_size, size_t head_dim)
{
    size_t n = block_size * head_dim;
    return kv_type == DX_F32 ? 4 * n : kv_type == DX_Q8_0 ? n + n / 16 : 2 * n;
}

/* Every query's history is cut into splits of KERN_ATTN_SPLIT key positions,
 * fixed by absolute position ([0, 1024), [1024, 2048), ...).  Each split has
 * its own online softmax (keys in position order, in steps fixed by
 * position) giving a partial (acc, m, l); the partials are merged in split
 * order.  So the bits of a query's output depend only on its position and
 * data — never on n_q, pos0, [h0, h1), the tiling, or whether the splits
 * were computed by one call (kern_attn) or by parallel kern_attn_part calls
 * and a kern_attn_merge. */
#define KERN_ATTN_SPLIT 1024

/* Causal attention for n_q query tokens of one sequence at positions
 * pos0 .. pos0+n_q-1, for kv heads [h0, h1) (and the query heads they
 * serve: n_head/n_kv_head per kv head).  Query token i sees keys 0..pos0+i,
 * read from blocks[j / block_size].  q and out: [n_q][n_head][head_dim] f32.
 * scratch: kern_attn_scratch_bytes() bytes, 64-byte aligned, per thread. */
size_t kern_attn_scratch_bytes(const kern_attn_layout *L, size_t max_q);
void kern_attn(const kern_attn_layout *L, const int32_t *blocks, size_t pos0, size_t n_q,
               const float *q, float *out, int h0, int h1, void *scratch);

/* The same result in two stages, so one query's history can be spread over
 * threads.  Rows are (token t, query head g of kv head h): row t*G + g, G =
 * n_head/n_kv_head; a row's part is kern_attn_part_floats() floats.
 * kern_attn_part writes the partial of split `split` for the rows whose
 * position reaches it (pos0 + t >= split*KERN_ATTN_SPLIT) and leaves the
 * others alone; scratch as for kern_attn (n_q queries).
 * kern_attn_merge writes out (laid out as kern_attn's) for kv head h from
 * the parts of splits 0 .. pos/KERN_ATTN_SPLIT of each row, split s at
 * part + s*split_stride. */
size_t kern_attn_part_floats(const kern_attn_layout *L);
void kern_attn_part(const kern_attn_layout *L, const int32_t *blocks, size_t pos0, size_t n_q,
                    const float *q, int h, size_t split, float *part, void *scratch);
void kern_attn_merge(const kern_attn_layout *L, size_t pos0, size_t n_q, int h, const float *part,
                     size_t split_stride, float *out);

/* ---- per-token elementwise ops (f32) ---- */
/* y = x / sqrt(mean(x^2) + eps) * w, n elements; y may alias x. */
void kern_rmsnorm(const float *x, const float *w, float eps, size_t n, float *y);
/* Rotary embedding on one head vector of head_dim (even) at position pos.
 * cs: precomputed [pos][head_dim/2] pairs (cos, sin) for that position.
 * neox: pairs (i, i+head_dim/2) (Qwen); else adjacent pairs (2i, 2i+1) (Llama). */
void kern_rope(float *x, int head_dim, const float *cs, int neox);
/* g = silu(g) * u, n elements. */
void kern_swiglu(float *g, const float *u, size_t n);
/* y += x */
void kern_add(float *y, const float *x, size_t n);

/* Scalar references, always available (tests compare fast paths to them). */
void kern_matmul_scalar(int wtype, const void *w, size_t n_in, size_t o0, size_t o1,
                        const void *act, size_t n_tok, float *y, size_t ldy);
void kern_attn_scalar(const kern_attn_layout *L, const int32_t *blocks, size_t pos0, size_t n_q,
                      const float *q, float *out, int h0, int h1, void *scratch);
/* Quantises x[0..n) (n a multiple of 32, finite values) to q8_0: per group
 * of 32, scale = f16(max|x|/127), quant = round-to-nearest-even(x/scale)
 * clamped to [-127, 127] (0 for an all-zero group).  qs[n], d[n/32].  Used
 * for K/V when they are stored and for the query rows that score a q8_0 K;
 * the fast paths give the scalar twin's bytes. */
void kern_q8_quant(const float *x, size_t n, int8_t *qs, uint16_t *d);
void kern_q8_quant_scalar(const float *x, size_t n, int8_t *qs, uint16_t *d);
/* One token's K and V rows of kv head h (head_dim floats each) quantised
 * into this layer's regions of a q8_0 block: k_region = block + L->k_off,
 * v_region = block + L->v_off; j is the token's index in the block. */
void kern_attn_store_q8(const kern_attn_layout *L, uint8_t *k_region, uint8_t *v_region, int h,
                        int j, const float *k, const float *v);
/* Byte offsets within a layer's K / V region of a q8_0 block (see above):
 * the quant of (kv head h, token j, dim d) and the scale of (h, j, group g). */
static inline size_t kern_attn_q8_head(const kern_attn_layout *L, int h)
{
    return (size_t)h * kern_attn_head_bytes(DX_Q8_0, (size_t)L->block_size, (size_t)L->head_dim);
}
static inline size_t kern_attn_q8_k(const kern_attn_layout *L, int h, int j, int d)
{
    return kern_attn_q8_head(L, h) + ((size_t)(d / 4) * (size_t)L->block_size + (size_t)j) * 4 +
           (size_t)(d % 4);
}
static inline size_t kern_attn_q8_ks(const kern_attn_layout *L, int h, int j, int g)
{
    return kern_attn_q8_head(L, h) + (size_t)L->block_size * (size_t)L->head_dim +
           ((size_t)g * (size_t)L->block_size + (size_t)j) * 2;
}
static inline size_t kern_attn_q8_v(const kern_attn_layout *L, int h, int j, int d)
{
    return kern_attn_q8_head(L, h) + (size_t)j * (size_t)L->head_dim + (size_t)d;
}
static inline size_t kern_attn_q8_vs(const kern_attn_layout *L, int h, int j, int g)
{
    return kern_attn_q8_head(L, h) + (size_t)L->block_size * (size_t)L->head_dim +
           ((size_t)j * (size_t)(L->head_dim / 32) + (size_t)g) * 2;
}

/* The KV layout's element offset of (kv head h, token j in block, dim d)
 * within a layer's K / V region (tests and the forward pass's stores;
 * f16, bf16, f32). */
static inline size_t kern_attn_k_index(const kern_attn_layout *L, int h, int j, int d)
{
    return ((size_t)h * (size_t)L->head_dim + (size_t)d) * (size_t)L->block_size + (size_t)j;
}
static inline size_t kern_attn_v_index(const kern_attn_layout *L, int h, int j, int d)
{
    return ((size_t)h * (size_t)L->block_size + (size_t)j) * (size_t)L->head_dim + (size_t)d;
}

#endif
