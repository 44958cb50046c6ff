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
 * differ in the last bits; one process uses one ISA throughout.
 *
 * Layouts: a weight matrix W is GGUF's [n_out][n_in] (row o holds n_in
 * elements of its dtype, rows contiguous); activations are row-major
 * [n_tok][n_in] f32. */
#ifndef KERN_H
#define KERN_H

#include <stddef.h>
#include <stdint.h>

enum kern_isa { KERN_SCALAR = 0, KERN_AVX2 = 1, KERN_AVX512 = 2 };

/* Best ISA this CPU supports. */
enum kern_isa kern_isa_detect(void);
/* The active ISA: default kern_isa_detect(), or DUPLEX_KERNELS=scalar|avx2|avx512
 * (the first call reads it).  kern_set_isa fails with DX_EUNSUPPORTED if the
 * CPU lacks it. */
enum kern_isa kern_get_isa(void);
int kern_set_isa(enum kern_isa isa);
const char *kern_isa_name(enum kern_isa isa);

/* ---- matmul: y[t*ldy + o] = sum_k W[o][k] * x[t][k] ----
 * Step 1, once per matmul: convert the activations into what the weight
 * type's kernel consumes (F32/F16 weights: f32 as is; BF16: bf16 rows; Q8_0:
 * q8_0 blocks, n_in % 32 == 0).  act must hold kern_act_bytes() bytes,
 * 64-byte aligned. */
size_t kern_act_bytes(int wtype, size_t n_tok, size_t n_in);
void kern_act_prep(int wtype, const float *x, size_t n_tok, size_t n_in, void *act);
/* Step 2, per thread task: output columns [o0, o1) for all n_tok tokens.
 * Any split of [0, n_out) into tasks gives identical bits. */
void kern_matmul(int wtype, const void *w, size_t n_in, size_t o0, size_t o1, const void *act,
                 size_t n_tok, float *y, size_t ldy);
/* Preferred granularity of [o0, o1) splits (a multiple of the kernel's tile). */
size_t kern_matmul_tile(int wtype);

/* ---- paged attention over the KV pool ----
 * A KV block holds block_size tokens of all layers; within a block, this
 * layer's K for kv head h, token j, dim d is at
 *   base + block*block_bytes + k_off + (h*block_size + j)*head_dim*esize + d*esize
 * and V likewise at v_off. */
typedef struct {
    const uint8_t *base;
    size_t block_bytes;
    size_t k_off, v_off; /* this layer's K / V region within a block */
    int kv_type;         /* DX_F16 | DX_BF16 | DX_F32 */
    int block_size, head_dim, n_head, n_kv_head;
    float scale; /* usually 1/sqrt(head_dim) */
} kern_attn_layout;

/* Causal attention for n_q query tokens of one sequence at positions
 * pos0 .. pos0+n_q-1, for kv heads [h0, h1) (and the query heads they
 * serve: n_head/n_kv_head per kv head).  Query token i sees keys 0..pos0+i,
 * read from blocks[j / block_size].  q and out: [n_q][n_head][head_dim] f32.
 * Keys are visited in position order, one block at a time, with an online
 * softmax whose blocking is fixed by position, so the result for a query does
 * not depend on n_q or on how the caller tiles queries.
 * scratch: kern_attn_scratch_bytes() bytes, 64-byte aligned, per thread. */
size_t kern_attn_scratch_bytes(const kern_attn_layout *L, size_t max_q);
void kern_attn(const kern_attn_layout *L, const int32_t *blocks, size_t pos0, size_t n_q,
               const float *q, float *out, int h0, int h1, void *scratch);

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

#endif
