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
#include "base/dx_log.h"
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

/* ---- the Responses API's stored responses ------------------------------------------- */

/* What a store job carries: its own copies (q may end first, when its
 * answer did not wait), and q when its end waits for the store. */
typedef struct {
    work_job job;
    router *r;
    rt_req *q; /* its end held (busy and in_work set), or NULL */
    uint8_t tenant[OAI_RSP_STORE_TENANT];
    int has_tenant;
    char id[48];
    json_t *history;
    char *response;
    size_t len;
} store_job;

static void store_run(work_job *j)
{
    store_job *s = (store_job *)((char *)j - offsetof(store_job, job));
    if (router_rsp_put(s->r->responses, s->has_tenant ? s->tenant : NULL, s->id, s->history,
                       s->response, s->len) < 0)
        DX_LOGW("router: response %s not stored: %s", s->id, dx_errmsg());
}

static void store_done(work_job *j)
{
    store_job *s = (store_job *)((char *)j - offsetof(store_job, job));
    router *r = s->r;
    rt_req *q = s->q;
    int canceled = j->canceled; /* j lives inside s, which goes next */
    json_decref(s->history);
    dx_free(s->response);
    dx_free(s);
    r->n_work--;
    if (q) {
        q->storing = q->in_work = q->busy = 0;
        if (r->destroying || canceled) {
            rt_req_forget(q); /* answered by rt_req_abort_all */
        } else {
            rt_req_release_end(q); /* stored: the answer's end may go */
            rt_req_end(q);
        }
    }
    r->on_req_gone(r); /* a destroyed router waits for its jobs */
}

void rt_entry_store_response(rt_req *q)
{
    router *r = q->r;
    if (q->front != OAI_FRONT_RESPONSES || !q->rsp.store || !q->fr || !oai_front_completed(q->fr)) {
        rt_req_release_end(q);
        return;
    }
    size_t len;
    const char *obj = oai_front_response(q->fr, &len);
    oai_tools_result res;
    store_job *s = obj ? dx_calloc(1, sizeof *s) : NULL;
    int rc = s ? oai_front_result(q->fr, &res) : DX_ENOMEM;
    if (!rc) {
        rc = oai_rsp_history(&q->rsp, q->chat_doc, &res, &s->history);
        oai_tools_result_free(&res);
    }
    if (!rc && !(s->response = dx_strndup(obj, len)))
        rc = dx_errf(DX_ENOMEM, "router: out of memory for a stored response");
    if (rc) {
        DX_LOGW("router: response %s not stored: out of memory", q->rsp_id);
        if (s) json_decref(s->history);
        if (s) dx_free(s->response);
        dx_free(s);
        rt_req_release_end(q);
        return;
    }
    s->r = r;
    s->len = len;
    memcpy(s->id, q->rsp_id, sizeof s->id);
    memcpy(s->tenant, q->tenant, sizeof s->tenant);
    s->has_tenant = q->has_tenant;
    if (q->end_held) { /* q waits for the store; the job ends it */
        s->q = q;
        q->storing = q->in_work = q->busy = 1;
    }
    s->job = (work_job){.run = store_run, .done = store_done};
    r->n_work++;
    work_pool_submit(r->prep, &s->job);
}
