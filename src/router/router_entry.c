/* router_entry: a conversation's entry on the request's side — taken from
 * the lookup, turned into the kv_transfer_params each node gets (pulled
 * from the holder, or only the history when the holder is down:
 * docs/router.md steps 5-7), and stored when the turn ends (step 9).  The
 * map itself is router_store's; whether the entry's node is used is
 * router_pick's.  Params travel as JSON text and are spliced into bodies,
 * never re-serialised with them. */
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "router/router_flow_priv.h"

void rt_entry_take(rt_req *q, const router_store_hit *e)
{
    q->entry.found = 1;
    if (q->key_kind == KEY_CHAT) q->key = q->keys[e->which];
    q->entry.node = e->node;
    q->entry.tokens = e->num_tokens;
    if (e->params && !(q->entry_params = dx_strndup(e->params, e->params_len))) q->entry.found = 0;
    q->entry.has_params = q->entry_params != NULL;
}

int rt_entry_usable(rt_req *q)
{
    router_pick_cluster c = rt_nodes_cluster(q->r);
    return router_pick_entry_usable(&c, &q->entry);
}

/* The entry's params as a JSON object with the two flags set (NULL when
 * there are none or they do not parse). */
static json_t *entry_json(const rt_req *q, int decode, int prefill)
{
    return router_params_flagged(q->entry_params, decode, prefill);
}

/* The stored params when their holder is down: nothing to pull, but their
 * remote_token_ids still say which tokens the conversation's replies were,
 * so the next node tokenises the history exactly as generated
 * (docs/pd.md, token-faithful history). */
const char *rt_entry_history_params(rt_req *q)
{
    if (q->hist_params) return q->hist_params;
    json_t *kv = entry_json(q, 0, 0);
    dx_buf b;
    dx_buf_init(&b, 0);
    if (kv && router_json_append(&b, kv) == 0) q->hist_params = dx_buf_take(&b);
    dx_buf_free(&b);
    json_decref(kv);
    return q->hist_params;
}

/* In bidirectional mode the stored params (the holder uses its own cache,
 * another node pulls); only their history when the holder is down. */
const char *rt_entry_local_params(rt_req *q)
{
    if (q->r->cfg.mode != ROUTER_BIDIRECTIONAL || !q->entry_params) return NULL;
    return rt_entry_usable(q) ? q->entry_params : rt_entry_history_params(q);
}

/* Params that ask the prefill node to hold the KV and, in bidirectional
 * mode with stored params, to pull the history (or, holder down, to take
 * only its token ids). */
json_t *rt_entry_prefill_params(rt_req *q)
{
    json_t *kv = NULL;
    if (q->r->cfg.mode == ROUTER_BIDIRECTIONAL) kv = entry_json(q, 1, rt_entry_usable(q));
    if (!kv) kv = json_pack("{s:b, s:b}", "do_remote_decode", 1, "do_remote_prefill", 0);
    return kv;
}

/* The params go in as the node gave them, and the (maybe long) history is
 * copied, not re-serialised. */
int rt_entry_splice(const dx_buf *base, const char *params, dx_buf *out)
{
    DX_ASSERT(base->len > 2 && base->data[0] == '{');
    dx_buf_reset(out);
    int rc = dx_buf_puts(out, "{\"kv_transfer_params\":");
    if (!rc) rc = dx_buf_puts(out, params);
    if (!rc) rc = dx_buf_putc(out, ',');
    if (!rc) rc = dx_buf_append(out, base->data + 1, base->len - 1);
    return rc;
}

/* How long stored params stay usable: the router's TTL, or less when the
 * holder promises less (expire a margin before the holder drops them). */
static double params_ttl(const router *r, const json_t *params)
{
    return router_params_ttl(params, r->cfg.conversation_ttl_s);
}

/* A content key is the messages plus the reply as the client got it; the
 * prefix entry it supersedes goes. */
void rt_entry_store(rt_req *q)
{
    router *r = q->r;
    if (q->key_kind == KEY_NONE || (q->key_kind == KEY_CHAT && q->reply_lost)) return;
    double ttl = r->cfg.conversation_ttl_s;
    dx_buf txt;
    dx_buf_init(&txt, 0);
    uint32_t ntok = 0;
    json_t *p = q->new_params;
    if (json_is_object(p) && params_ttl(r, p) > 0 && router_json_append(&txt, p) == 0) {
        ttl = params_ttl(r, p);
        ntok = router_params_tokens(p);
    } else {
        dx_buf_free(&txt); /* affinity only */
    }
    router_key k = q->key;
    if (q->key_kind == KEY_CHAT) {
        k = q->chain;
        router_key_chat_add(r->cfg.key_seed, &k, "assistant", q->reply.data ? q->reply.data : "",
                            q->reply.len);
    }
    /* the prefix entry it supersedes goes with it */
    const router_key *drop = q->key_kind == KEY_CHAT && q->entry.found ? &q->key : NULL;
    router_store_put(r->store, &k, drop, q->decode, txt.data, txt.len, ntok, ttl);
    dx_buf_free(&txt);
}
