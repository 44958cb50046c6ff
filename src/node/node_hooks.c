/* node_hooks: the P/D hooks — the node server's side of node_pd.
 *
 * node_pd knows no node_req: it gets its configuration from the server
 * (node_hooks_config), a view of the request at each step
 * (node_hooks_view) and, at the end, how the answer went
 * (node_hooks_finish).  Building them here, in one place, keeps the
 * contract in one place too: the view holds only what is fixed once the
 * request is prepared, which is what lets the engine thread build it for
 * node_pd_on_kv while the loop goes on with the rest of the request. */
#include "node/node_server_priv.h"

void node_hooks_view(const node_req *q, node_pd_view *v)
{
    *v = (node_pd_view){
        .id = q->id,
        .chat = q->kind == OAI_CHAT,
        .trusted = q->trusted,
        .salt = q->salt,
        .prompt = q->prompt,
        .n_prompt = q->n_prompt,
        .has_max_tokens = q->has_max_tokens,
        .max_tokens = q->max_tokens,
        .logprobs = q->logprobs,
    };
}

void node_hooks_config(const node_server *s, void (*on_pulled)(void *user), node_pd_config *c)
{
    const node_backend *be = &s->be;
    *c = (node_pd_config){
        .loop = s->loop,
        .kv = be->kv,
        .tk = be->tk,
        .end_ids = be->end_ids,
        .n_end = be->n_end,
        .n_vocab = be->n_vocab,
        .n_ctx = be->n_ctx,
        .mem = s->mem,
        .prefill = s->cfg.role == NODE_ROLE_PREFILL,
        .bidirectional = s->cfg.bidirectional,
        .no_prefix_cache = s->cfg.no_prefix_cache,
        .recompute_threshold = s->cfg.recompute_threshold,
        .on_pulled = on_pulled,
    };
}

void node_hooks_finish(node_server *s, node_req *q)
{
    node_pd_view v;
    node_hooks_view(q, &v);
    node_pd_end e = {
        .finish = q->fin.finish,
        .n_prompt = q->fin.n_prompt,
        .n_cached = q->fin.n_cached,
        .lost = q->lost,
        .kept = q->keep_text,
        .text = q->text.data,
        .text_len = q->text.len,
    };
    node_pd_finish(&s->pd, &q->pd, &v, &e, &q->extra);
}
