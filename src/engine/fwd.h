/* fwd: the transformer forward pass over a batch of sequences whose KV lives
 * in the paged pool (paged attention over block tables).
 *
 * A step takes, for each sequence, a run of consecutive tokens starting at
 * position pos0 (a prefill chunk of any size, or one decode token), writes
 * their K/V into the sequence's blocks and returns logits for the tokens that
 * ask for them.  Everything is sized at create for max_tokens tokens per
 * step: the step itself allocates nothing.  Kernels are batch-invariant, so a
 * token's K/V and logits do not depend on the batch around it, the chunking,
 * or the thread count — for a mixture of experts too, whichever other
 * tokens share its experts (engine/moe.h). */
#ifndef FWD_H
#define FWD_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_tpool.h"
#include "engine/kv_pool.h"
#include "model/model.h"

typedef struct {
    const int32_t *blocks; /* block table: covers positions [0, pos0 + n_tokens) */
    uint32_t pos0;         /* position of tokens[0] */
    uint32_t n_tokens;
    const int32_t *tokens;
    /* 0: no logits; 1: logits of the last token; 2: logits of every token */
    int logits;
} fwd_seq;

typedef struct fwd fwd;

/* Where a forward pass's time goes, accumulated over steps (benchmarks). */
typedef struct {
    uint64_t steps, tokens;
    uint64_t step_ns, attn_ns; /* in fwd_step; in its attention */
    uint64_t moe_ns;           /* in a mixture of experts' FFNs (router to weighted sums) */
    /* attention FLOPs (4*head_dim per query head per visible key: QK and PV)
     * and KV bytes (every visible key's K and V once per step and layer) */
    double attn_flop, attn_bytes;
} fwd_stats;

/* max_tokens: tokens per step; max_seqs: sequences per step; n_ctx: the
 * longest sequence (RoPE table size). */
int fwd_create(const model *m, kv_pool *pool, dx_tpool *tp, uint32_t max_tokens, uint32_t max_seqs,
               uint32_t n_ctx, fwd **out);
void fwd_destroy(fwd *f);
/* logits: [rows][n_vocab] in sequence order, one row per requested token.
 * DX_EINVAL when the batch exceeds the sizes given at create. */
int fwd_step(fwd *f, const fwd_seq *seqs, size_t n_seqs, float *logits);
uint32_t fwd_n_vocab(const fwd *f);
/* Tests and diagnostics: while set, each step of an MoE model writes the
 * experts its tokens were routed to, route[(layer * n_tok + t) * k + slot]
 * for the step's n_tok tokens in batch order (k = n_expert_used; slot 0 the
 * most probable).  route holds n_layer * max_tokens * k; NULL stops it. */
void fwd_set_route_log(fwd *f, int32_t *route);
void fwd_get_stats(const fwd *f, fwd_stats *out);
void fwd_reset_stats(fwd *f);

#endif
