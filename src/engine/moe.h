/* moe: the mixture-of-experts FFN of one layer, over a step's tokens.
 *
 * Per token: router logits (a matmul with ffn_gate_inp), then the routing of
 * moe_route (llama.cpp's build_moe_ffn for qwen3moe and Mixtral: softmax over
 * all experts, the n_expert_used most probable, their probabilities
 * normalised to sum 1), then each chosen expert's SwiGLU FFN, and the sum of
 * their outputs weighted by those probabilities.
 *
 * For speed the step's tokens are grouped by expert: every expert that any
 * token chose runs its gate/up/down matmuls once over all the tokens that
 * chose it (its weights stream from memory once per step, not once per
 * token), and the outputs are scattered back.  The result is bit-identical
 * to computing each token alone, because
 *  - the matmul kernels are batch-invariant per row (kern.h): a token's
 *    row of an expert's output depends on its own input row only, never on
 *    the other tokens in that expert's group or where it falls in a tile;
 *  - the routing is per token, with ties broken by the lower expert index;
 *  - a token's weighted sum over its experts is accumulated in its own
 *    slot order (most probable expert first, as llama.cpp adds them), which
 *    no other token can change.
 * Work is split over the thread pool as the dense matmuls are: tasks are
 * (expert, output-column range), sized so each carries about the same
 * rows x tokens; any split gives the same bits.  Everything is sized at
 * create for max_tokens * n_expert_used grouped rows; a step allocates
 * nothing. */
#ifndef MOE_H
#define MOE_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_tpool.h"
#include "model/model.h"

typedef struct moe moe;

/* For model m's MoE layers (model_hp(m)->n_expert > 0), up to max_tokens
 * tokens per step, work split for n_threads. */
int moe_create(const model *m, int n_threads, uint32_t max_tokens, moe **out);
void moe_destroy(moe *mo);

/* out[t] = layer L's expert mixture of x[t], for t < n_tok <= max_tokens;
 * x and out: [n_tok][n_embd].  route: NULL, or [n_tok][n_expert_used]
 * receiving each token's chosen experts in slot order. */
void moe_ffn(moe *mo, dx_tpool *tp, const model_layer *L, const float *x, size_t n_tok, float *out,
             int32_t *route);

/* One token's routing from its n_expert router logits: ids[0..k) the k most
 * probable experts, most probable first, equal probabilities in ascending
 * index order; w[0..k) their softmax probabilities (softmax over all
 * n_expert logits, f32 exponentials summed in double as ggml does), divided
 * by their sum (clamped to >= 2^-14 as llama.cpp does) when norm.
 * 1 <= k <= n_expert <= MODEL_MAX_EXPERTS.  Any input, NaN included, gives k
 * distinct ids in range. */
void moe_route(const float *logits, uint32_t n_expert, uint32_t k, int norm, int32_t *ids,
               float *w);

#endif
