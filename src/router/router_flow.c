/* router_flow: a completion request's way through the router (router.h,
 * docs/router.md).
 *
 *   parse (oai_req: the same validation a node does) → strip client
 *   kv_transfer_params and conversation_id → key (these on the work pool,
 *   off the loop) → look up the entry →
 *   choose the decode node → local prefill, or prefill node first → decode
 *   node → proxy the answer, remove and keep its kv_transfer_params → store
 *   the entry.
 *
 * Lifetime: an rt_req lives from the parsed request until req_end, which
 * answers nothing itself — every path answers the client first.  At most
 * one upstream request is in flight per rt_req (q->up).  The client leaving
 * runs on_client_gone: outside an upstream callback it stops the upstream
 * request and ends q at once; inside one (q->busy: a write to the client
 * failed under us) it only clears q->conn, and the callback, seeing that,
 * stops the transfer and ends q itself.  Node load counters are taken when
 * an upstream request starts and given back exactly once (release_node).
 *
 * Retries: a prefill failure (refused, reset, 5xx, timeout, or a 200 without
 * params) is retried once on another prefill node, then the request falls
 * back to local prefill on the decode node; a 4xx is the client's and goes
 * back as it is.  A decode failure before any byte reached the client is
 * retried once on another decode node with the same params; after the first
 * byte the stream ends with an OpenAI-style error event. */
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_keys.h"
#include "base/dx_log.h"
#include "model/model_chat.h"
#include "oai/oai_resp.h"
#include "router/router_priv.h"

#define ANSWER_MAX ((size_t)64 << 20) /* a node's whole (non-streamed) answer */
#define EVENT_MAX  ((size_t)16 << 20) /* one SSE event (the final one carries token ids) */
#define REPLY_MAX  ((size_t)16 << 20) /* reply text kept for a content key */

enum rt_phase { PH_PASS, PH_PREFILL, PH_DECODE };
enum rt_keykind { KEY_NONE, KEY_ID, KEY_CHAT };

struct rt_req {
    router *r;
    rt_req *prev, *next; /* r->active */
    http_conn *conn;     /* NULL once answered or gone */
    const char *method, *path;
    enum oai_kind kind;
    enum rt_phase phase;
    int stream; /* the client asked for a stream */
    int busy;   /* an upstream callback (or the shutdown) owns q and will end it */
    uint64_t t0, t_first;
    /* conversation */
    enum rt_keykind key_kind;
    router_key key;                  /* ID: the key; CHAT: the prefix an entry was found under */
    router_key chain;                /* CHAT: the key of all the request's messages */
    int found, entry_node, affinity; /* affinity: -1 unkeyed, 0 miss, 1 hit */
    router_store_op *lookup_op;      /* the conversation's lookup, while it waits for Redis */
    char *entry_params;
    char *hist_params; /* entry_params without the pull: their holder is down */
    uint32_t entry_tokens, prompt_tokens;
    char *auth;
    /* bodies */
    dx_buf body;         /* the client's body, stripped: what a decode node gets */
    dx_buf pbody;        /* what a prefill node gets */
    dx_buf dbody;        /* body with the decode params spliced in */
    char *pparams;       /* the prefill node's params (JSON text) */
    const char *dparams; /* what the decode request carries: pparams, entry_params or NULL */
    const char *via;     /* "local" | "prefill" */
    /* upstream */
    router_up_req *up;
    int up_node; /* the node whose load counters hold q, or -1 */
    int decode, prefill, decode_tries, prefill_tries;
    int relay_events; /* the decode node streams: events go straight on */
    int stream_begun, sent_any, status_out;
    int client_left; /* before its answer was complete: counted as 499 */
    router_sse sse;
    dx_buf acc;   /* a whole answer (prefill, non-streamed, errors) */
    dx_buf reply; /* the reply text (content keys; and until the first text, for TTFT) */
    int reply_lost;
    json_t *new_params; /* what the decode node returned */
    long p_cached;      /* prompt tokens the prefill node did not compute (its usage) */
    oai_req o;          /* the parsed request, until the first upstream request starts */
    /* Preparation on the work pool (prep_run); until its done the loop
     * touches only conn. */
    work_job job;
    int in_work;
    http_conn *held;     /* held while its body is read off the loop */
    const char *in_body; /* the client's body (held's) */
    size_t in_len;
    char *conv_hdr;   /* X-Conversation-Id, copied */
    router_key *keys; /* CHAT: the key of each prefix of the messages */
    size_t n_keys;
    dx_buf pbase;    /* the prefill body without its params */
    int prep_status; /* 0, or the HTTP status of what was wrong */
    char prep_msg[256], prep_param[64];
    http_auth_result who; /* the caller's credentials: its tenant */
};

static const router_up_cb k_pass_cb, k_prefill_cb, k_decode_cb;

/* ---- request life ------------------------------------------------------------- */

static void req_free(rt_req *q)
{
    dx_buf_free(&q->body);
    dx_buf_free(&q->pbody);
    dx_buf_free(&q->dbody);
    dx_buf_free(&q->acc);
    dx_buf_free(&q->reply);
    router_sse_free(&q->sse);
    json_decref(q->new_params);
    dx_free(q->pparams);
    dx_free(q->entry_params);
    dx_free(q->hist_params);
    dx_free(q->auth);
    dx_free(q->conv_hdr);
    dx_free(q->keys);
    dx_buf_free(&q->pbase);
    oai_req_free(&q->o);
    dx_free(q);
}

static void on_client_gone(void *user);

static rt_req *req_new(router *r, http_conn *c, const http_req *hr, uint64_t t0)
{
    rt_req *q = dx_calloc(1, sizeof *q);
    if (!q) return NULL;
    q->r = r;
    q->conn = c;
    q->path = !strcmp(hr->path, "/v1/chat/completions") ? "/v1/chat/completions"
              : !strcmp(hr->path, "/v1/completions")    ? "/v1/completions"
                                                        : "/v1/models";
    q->method = !strcmp(hr->method, "POST") ? "POST" : "GET";
    q->t0 = t0;
    q->entry_node = q->decode = q->prefill = q->up_node = -1;
    q->affinity = -1;
    q->via = "local";
    dx_buf_init(&q->body, 0);
    dx_buf_init(&q->pbody, 0);
    dx_buf_init(&q->dbody, 0);
    dx_buf_init(&q->pbase, 0);
    dx_buf_init(&q->acc, ANSWER_MAX);
    dx_buf_init(&q->reply, REPLY_MAX);
    router_sse_init(&q->sse, EVENT_MAX);
    q->next = r->active;
    if (r->active) r->active->prev = q;
    r->active = q;
    r->n_active++;
    http_conn_set_abort(c, on_client_gone, q);
    return q;
}

static const char *node_url(const rt_req *q, int node)
{
    return node >= 0 ? q->r->nodes[node].url : "-";
}

static void log_end(rt_req *q)
{
    static const char *const keys[] = {"none", "id", "content"};
    char ttft[32] = "-";
    if (q->t_first) snprintf(ttft, sizeof ttft, "%.2f", (double)(q->t_first - q->t0) * 1e-6);
    DX_LOGI("%s %s %d via=%s decode=%s prefill=%s key=%s affinity=%s prompt_tokens~%u "
            "tries=%d/%d ttft_ms=%s total_ms=%.2f",
            q->method, q->path, q->status_out, q->via, node_url(q, q->decode),
            node_url(q, q->prefill), keys[q->key_kind],
            q->affinity < 0 ? "-"
            : q->affinity   ? "hit"
                            : "miss",
            q->prompt_tokens, q->prefill_tries, q->decode_tries, ttft,
            (double)(dx_now_ns() - q->t0) * 1e-6);
}

static void req_unlink_free(rt_req *q)
{
    router *r = q->r;
    if (q->prev)
        q->prev->next = q->next;
    else
        r->active = q->next;
    if (q->next) q->next->prev = q->prev;
    r->n_active--;
    req_free(q);
}

/* q is over: the client has its answer (or is gone). */
static void req_end(rt_req *q)
{
    router *r = q->r;
    DX_ASSERT(!q->up && q->up_node < 0);
    if (q->conn) { /* every path answers first; this is a bug guard, not a path */
        http_conn_set_abort(q->conn, NULL, NULL);
        q->conn = NULL;
    }
    if (q->client_left || !q->status_out) q->status_out = 499; /* nginx's "client closed" */
    rt_count_request(r, q->path, q->status_out);
    if (q->phase != PH_PASS) log_end(q);
    req_unlink_free(q);
    rt_maybe_stopped(r);
}

/* Gives the node's load counters back (once). */
static void release_node(rt_req *q)
{
    if (q->up_node < 0) return;
    rt_node *n = &q->r->nodes[q->up_node];
    n->outstanding--;
    if (n->prefill) n->outstanding_tokens -= q->prompt_tokens;
    q->up_node = -1;
}

static void up_stop(rt_req *q)
{
    router_up_cancel(q->up);
    q->up = NULL;
    release_node(q);
}

static void on_client_gone(void *user)
{
    rt_req *q = user;
    q->conn = NULL;
    q->client_left = 1;
    if (q->busy) return; /* the callback stops the transfer and ends q */
    up_stop(q);
    req_end(q);
}

/* ---- answers to the client ------------------------------------------------------ */

static void reply_full(rt_req *q, int status, const char *body, size_t len)
{
    q->status_out = status;
    if (!q->conn) return;
    http_conn *c = q->conn;
    q->conn = NULL;
    http_conn_set_abort(c, NULL, NULL);
    /* a 503 (a node's full queue passed on, no healthy node) invites a retry,
     * as the nodes' own 503s do */
    http_conn_respond(c, status, "application/json", status == 503 ? HTTP_RETRY_AFTER : NULL,
                      body ? body : "", len);
}

static void reply_error(rt_req *q, int status, const char *msg, const char *param)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_error_json(&b, msg, oai_error_type(status), param, NULL);
    reply_full(q, status, b.data, b.len);
    dx_buf_free(&b);
}

/* The client's stream begins with the first event, not with the upstream
 * head, so a decode failure before any event can still be retried.
 * Non-zero: the client is gone. */
static int stream_begin(rt_req *q)
{
    if (!q->conn) return -1;
    if (q->stream_begun) return 0;
    q->stream_begun = 1;
    q->status_out = 200;
    if (http_conn_stream_begin(q->conn, 200, "text/event-stream", "Cache-Control: no-cache\r\n") <
        0)
        return -1;
    return q->conn ? 0 : -1;
}

static int stream_write(rt_req *q, const char *p, size_t n)
{
    if (stream_begin(q) != 0) return -1;
    q->sent_any = 1;
    if (http_conn_stream_write(q->conn, p, n) < 0) return -1;
    return q->conn ? 0 : -1;
}

/* Ends the client's stream, after an error event when msg is set. */
static void stream_finish(rt_req *q, const char *msg)
{
    if (msg && q->conn) {
        dx_buf b;
        dx_buf_init(&b, 0);
        oai_sse_error(&b, msg, "server_error");
        oai_sse_done(&b);
        stream_write(q, b.data, b.len);
        dx_buf_free(&b);
    }
    if (stream_begin(q) != 0) return;
    http_conn *c = q->conn;
    q->conn = NULL;
    http_conn_set_abort(c, NULL, NULL);
    http_conn_stream_end(c);
}

/* ---- node choice ------------------------------------------------------------------ */

/* The node of the role (prefill or decode) that takes new requests with the
 * least load (requests, or prompt tokens for prefill nodes), never
 * `exclude`; ties rotate.  -1 if none. */
static int pick_least(router *r, int prefill, int exclude, int by_tokens)
{
    size_t n = r->n_nodes;
    unsigned start = r->rr[by_tokens]++; /* one rotation per pool, or picks in step skew it */
    int best = -1;
    for (size_t k = 0; k < n; k++) {
        int i = (int)((start + k) % n);
        const rt_node *nd = &r->nodes[i];
        if (i == exclude || nd->prefill != prefill || !rt_node_takes_new(nd)) continue;
        uint64_t load = by_tokens ? nd->outstanding_tokens : nd->outstanding;
        const rt_node *b = best >= 0 ? &r->nodes[best] : NULL;
        if (!b || load < (by_tokens ? b->outstanding_tokens : b->outstanding)) best = i;
    }
    return best;
}

static int pick_decode(router *r, int exclude)
{
    return pick_least(r, 0, exclude, 0);
}

static int pick_prefill(router *r, int exclude)
{
    return pick_least(r, 1, exclude, 1);
}

/* The conversation's node unless it is down or overloaded, else the least
 * loaded; counts the affinity hit or miss and why it was missed. */
static int pick_decode_for(rt_req *q)
{
    router *r = q->r;
    if (q->found && q->entry_node >= 0) {
        const rt_node *e = &r->nodes[q->entry_node];
        if (!rt_node_takes_new(e))
            rt_count_fallback(r,
                              rt_node_holds(e) ? "affinity_node_draining" : "affinity_node_down");
        else if (e->outstanding >= r->cfg.decode_max_outstanding)
            rt_count_fallback(r, "overloaded");
        else {
            q->affinity = 1;
            r->affinity_hits++;
            return q->entry_node;
        }
    }
    if (q->key_kind != KEY_NONE) {
        q->affinity = 0;
        r->affinity_misses++;
    }
    return pick_decode(r, -1);
}

/* The entry's params are worth sending: there are some and their holder is up. */
static int entry_usable(const rt_req *q)
{
    return q->entry_params && q->entry_node >= 0 && rt_node_holds(&q->r->nodes[q->entry_node]);
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
static const char *history_params(rt_req *q)
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

/* What a decode node gets when it prefills locally: the stored params in
 * bidirectional mode (the holder uses its own cache, another node pulls);
 * only their history when the holder is down. */
static const char *local_params(rt_req *q)
{
    if (q->r->cfg.mode != ROUTER_BIDIRECTIONAL || !q->entry_params) return NULL;
    return entry_usable(q) ? q->entry_params : history_params(q);
}

/* ---- upstream requests ------------------------------------------------------------- */

static int up_send(rt_req *q, int node, const char *body, size_t len, long timeout_ms,
                   const router_up_cb *cb)
{
    router *r = q->r;
    rt_node *n = &r->nodes[node];
    char url[RT_URL_MAX + 32];
    snprintf(url, sizeof url, "%s%s", n->url, q->path);
    router_up_request rq = {.method = q->method,
                            .url = url,
                            .auth = q->auth,
                            .internal_key = http_auth_internal_key(r->auth),
                            .body = body,
                            .body_len = len,
                            .timeout_ms = timeout_ms};
    int rc = router_up_start(r->up, &rq, cb, q, &q->up);
    if (rc) return rc;
    q->up_node = node;
    n->outstanding++;
    if (n->prefill) n->outstanding_tokens += q->prompt_tokens;
    return 0;
}

/* The base body with "kv_transfer_params":params as its first member: the
 * params go in as the node gave them, and the (maybe long) history is copied,
 * not re-serialised. */
static int splice_params(const dx_buf *base, const char *params, dx_buf *out)
{
    DX_ASSERT(base->len > 2 && base->data[0] == '{');
    dx_buf_reset(out);
    int rc = dx_buf_puts(out, "{\"kv_transfer_params\":");
    if (!rc) rc = dx_buf_puts(out, params);
    if (!rc) rc = dx_buf_putc(out, ',');
    if (!rc) rc = dx_buf_append(out, base->data + 1, base->len - 1);
    return rc;
}

static int start_decode(rt_req *q)
{
    router *r = q->r;
    if (!rt_node_takes_new(&r->nodes[q->decode])) { /* went down while the prefill node worked */
        int d = pick_decode(r, -1);
        if (d >= 0) q->decode = d;
    }
    q->phase = PH_DECODE;
    q->decode_tries++;
    q->relay_events = q->stream_begun = 0;
    json_decref(q->new_params);
    q->new_params = NULL;
    router_sse_reset(&q->sse);
    dx_buf_reset(&q->acc);
    dx_buf_reset(&q->reply);
    q->reply_lost = 0;
    if (!q->dparams) return up_send(q, q->decode, q->body.data, q->body.len, 0, &k_decode_cb);
    int rc = splice_params(&q->body, q->dparams, &q->dbody);
    if (rc) return dx_errf(rc, "out of memory");
    return up_send(q, q->decode, q->dbody.data, q->dbody.len, 0, &k_decode_cb);
}

static int start_prefill(rt_req *q)
{
    q->phase = PH_PREFILL;
    q->prefill_tries++;
    dx_buf_reset(&q->acc);
    return up_send(q, q->prefill, q->pbody.data, q->pbody.len,
                   (long)(q->r->cfg.prefill_timeout_s * 1e3), &k_prefill_cb);
}

/* Starts the decode request, or answers why it cannot start. */
static int go_decode(rt_req *q)
{
    if (start_decode(q) == 0) return 0;
    reply_error(q, 500, dx_errmsg(), NULL);
    return -1;
}

/* ---- the conversation entry ------------------------------------------------------------ */

static void observe(prom_hist *h, uint64_t since_ns)
{
    prom_hist_observe(h, (double)(dx_now_ns() - since_ns) * 1e-9);
}

/* How long stored params stay usable: the router's TTL, or less when the
 * holder promises less (expire a margin before the holder drops them). */
static double params_ttl(const router *r, const json_t *params)
{
    return router_params_ttl(params, r->cfg.conversation_ttl_s);
}

/* The turn finished normally: remember which node holds it, with its
 * params.  A content key is the messages plus the reply as the client got
 * it; the prefix entry it supersedes goes. */
static void store_entry(rt_req *q)
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
    const router_key *drop = q->key_kind == KEY_CHAT && q->found ? &q->key : NULL;
    router_store_put(r->store, &k, drop, q->decode, txt.data, txt.len, ntok, ttl);
    dx_buf_free(&txt);
}

/* ---- shared callbacks ------------------------------------------------------------------ */

static int acc_on_data(void *user, const char *p, size_t n)
{
    rt_req *q = user;
    return !q->conn || dx_buf_append(&q->acc, p, n) < 0;
}

/* An upstream request is over: q is the callback's to end.  1 when the
 * client has left (q is then ended already). */
static int up_finished(rt_req *q)
{
    q->up = NULL;
    release_node(q);
    q->busy = 1;
    if (q->conn) return 0;
    req_end(q);
    return 1;
}

static void pass_on_done(void *user, int rc, long status)
{
    rt_req *q = user;
    if (up_finished(q)) return;
    if (rc < 0)
        reply_error(q, rc == DX_ETIMEDOUT ? 504 : 502, dx_errmsg(), NULL);
    else
        reply_full(q, (int)status, q->acc.data, q->acc.len);
    req_end(q);
}

/* ---- prefill ------------------------------------------------------------------------------ */

/* The prefill node's answer carries params: keep them as text. */
static int take_prefill_params(rt_req *q)
{
    char *p;
    int ok = router_answer_params(q->acc.data, q->acc.len, &p, &q->p_cached) == 1;
    if (ok) {
        dx_free(q->pparams);
        q->pparams = p;
    }
    return ok;
}

/* Why the prefill answer is no good (NULL: it is). */
static const char *prefill_problem(rt_req *q, int rc, long status, char *why, size_t cap)
{
    if (rc < 0) {
        snprintf(why, cap, "%s", dx_errmsg());
        if (status == 0 && rc == DX_ETRANSPORT) rt_node_failed(q->r, q->prefill, why);
        return why;
    }
    if (status < 200 || status >= 300) {
        snprintf(why, cap, "answered %ld", status);
        return why;
    }
    if (!take_prefill_params(q)) {
        rt_count_fallback(q->r, "prefill_no_params");
        return "answered without kv_transfer_params";
    }
    return NULL;
}

static void pre_on_done(void *user, int rc, long status)
{
    rt_req *q = user;
    router *r = q->r;
    uint64_t t = dx_now_ns();
    if (up_finished(q)) return;
    if (rc == 0 && status >= 400 && status < 500) { /* the client's mistake: its answer */
        reply_full(q, (int)status, q->acc.data, q->acc.len);
        req_end(q);
        return;
    }
    char buf[256];
    const char *why = prefill_problem(q, rc, status, buf, sizeof buf);
    if (why) {
        int p2 = q->prefill_tries < 2 ? pick_prefill(r, q->prefill) : -1;
        /* a node without the P/D side answers without params every time:
         * counted, not shouted */
        dx_log(rc == 0 && status == 200 ? DX_LOG_DEBUG : DX_LOG_WARN,
               "router: prefill node %s: %s; %s", r->nodes[q->prefill].url, why,
               p2 >= 0 ? "retrying on another" : "prefilling on the decode node");
        if (p2 >= 0) {
            rt_count_fallback(r, "prefill_retry");
            q->prefill = p2;
            if (start_prefill(q) == 0) {
                q->busy = 0;
                return;
            }
        }
        rt_count_fallback(r, "prefill_failed");
        q->dparams = local_params(q);
    } else {
        q->dparams = q->pparams;
    }
    if (go_decode(q) < 0) {
        req_end(q);
        return;
    }
    q->busy = 0;
    observe(&r->added_between, t);
}

/* ---- decode -------------------------------------------------------------------------------- */

static void dec_on_head(void *user, long status)
{
    rt_req *q = user;
    q->relay_events = status == 200 && q->stream;
}

/* The most the client's usage may count as cached: what the prefill node
 * did not compute (only when this request went through one). */
static int has_cap(const rt_req *q)
{
    return q->dparams && q->dparams == q->pparams && q->p_cached >= 0;
}

/* One complete event from the decode node: straight on, unless it carries
 * params (then without them) or usage (then the cluster's). */
static int on_event(void *user, const char *ev, size_t len)
{
    rt_req *q = user;
    router *r = q->r;
    int want_text = q->key_kind == KEY_CHAT || !q->t_first;
    router_sse_info info = {
        .text = want_text ? &q->reply : NULL, .has_cap = has_cap(q), .cached_cap = q->p_cached};
    int rc = router_sse_event(ev, len, q->kind == OAI_CHAT, &r->scratch, &r->out, &info);
    if (rc < 0) return rc; /* never pass on an event that may hold params */
    q->reply_lost |= info.text_lost;
    if (info.params) {
        json_decref(q->new_params);
        q->new_params = info.params;
    }
    if (rc == 1) {
        ev = r->out.data;
        len = r->out.len;
    }
    if (stream_write(q, ev, len) != 0) return 1;
    if (!q->t_first && info.text_added) {
        q->t_first = dx_now_ns();
        observe(&r->ttft, q->t0);
    }
    return 0;
}

static int dec_on_data(void *user, const char *p, size_t n)
{
    rt_req *q = user;
    if (!q->conn) return 1;
    if (!q->relay_events) return dx_buf_append(&q->acc, p, n) < 0;
    uint64_t t = dx_now_ns();
    q->busy = 1;
    int rc = router_sse_feed(&q->sse, p, n, on_event, q);
    q->busy = 0;
    observe(&q->r->added_stream, t);
    return rc != 0 || !q->conn;
}

/* Another decode node for a request nothing of which reached the client. */
static int retry_decode(rt_req *q, const char *why)
{
    router *r = q->r;
    int d = q->decode_tries < 2 ? pick_decode(r, q->decode) : -1;
    DX_LOGW("router: decode node %s: %s%s", r->nodes[q->decode].url, why,
            d >= 0 ? "; retrying on another" : "");
    if (d < 0) return 0;
    rt_count_fallback(r, "decode_retry");
    q->decode = d;
    if (q->dparams == q->entry_params && !entry_usable(q))
        q->dparams = history_params(q); /* they name the node that just failed: nothing to pull */
    return start_decode(q) == 0;
}

/* The decode node's stream ended (rc 0) or broke. */
static void dec_finish_stream(rt_req *q, int rc)
{
    if (rc == 0) {
        if (router_sse_pending(&q->sse)) { /* a last event without its blank line */
            size_t n = q->sse.pend.len;
            on_event(q, q->sse.pend.data, n);
        }
        stream_finish(q, NULL);
        store_entry(q);
        return;
    }
    char msg[300];
    snprintf(msg, sizeof msg, "the decode node failed mid-answer: %s", dx_errmsg());
    stream_finish(q, msg);
}

/* A whole answer (non-streamed, or an error) from the decode node. */
static void dec_finish_full(rt_req *q, long status)
{
    router *r = q->r;
    if (status != 200) {
        reply_full(q, (int)status, q->acc.data, q->acc.len);
        return;
    }
    router_sse_info info = {.text = q->key_kind == KEY_CHAT ? &q->reply : NULL,
                            .has_cap = has_cap(q),
                            .cached_cap = q->p_cached};
    int rc = router_sse_answer(q->acc.data ? q->acc.data : "", q->acc.len, q->kind == OAI_CHAT,
                               &r->out, &info);
    if (rc < 0) {
        reply_error(q, 500, "out of memory", NULL);
        return;
    }
    q->reply_lost |= info.text_lost;
    if (info.params) q->new_params = info.params;
    const dx_buf *b = rc == 1 ? &r->out : &q->acc;
    reply_full(q, 200, b->data, b->len);
    q->t_first = dx_now_ns();
    observe(&r->ttft, q->t0);
    store_entry(q);
}

static void dec_on_done(void *user, int rc, long status)
{
    rt_req *q = user;
    router *r = q->r;
    uint64_t t = dx_now_ns();
    if (up_finished(q)) return;
    if (status == 0 && rc == DX_ETRANSPORT) rt_node_failed(r, q->decode, dx_errmsg());
    int failed = rc < 0 || status >= 500;
    if (failed && !q->sent_any) {
        char why[300];
        snprintf(why, sizeof why, "%s", rc < 0 ? dx_errmsg() : "answered a server error");
        if (retry_decode(q, why)) {
            q->busy = 0;
            return;
        }
        if (rc < 0) dx_errf(rc, "%s", why); /* the retry's attempt may have set another */
    }
    if (q->relay_events && q->sent_any)
        dec_finish_stream(q, rc);
    else if (rc < 0)
        reply_error(q, rc == DX_ETIMEDOUT ? 504 : 502, dx_errmsg(), NULL);
    else if (q->relay_events) /* a stream that ended before its first event */
        dec_finish_stream(q, rc);
    else
        dec_finish_full(q, status);
    observe(&r->added_stream, t);
    req_end(q);
}

static const router_up_cb k_pass_cb = {.on_data = acc_on_data, .on_done = pass_on_done};
static const router_up_cb k_prefill_cb = {.on_data = acc_on_data, .on_done = pre_on_done};
static const router_up_cb k_decode_cb = {
    .on_head = dec_on_head, .on_data = dec_on_data, .on_done = dec_on_done};

/* ---- parse, key, count ------------------------------------------------------------------------
 */

/* Prompt tokens: exact with the tokenizer, else ~4 bytes a token. */
static uint32_t count_tokens(const router *r, const oai_req *o)
{
    if (o->prompt_ids) return (uint32_t)o->n_prompt_ids;
    if (r->tok) {
        tok_ids v;
        tok_ids_init(&v);
        int rc;
        if (o->kind == OAI_COMPLETION) {
            rc = tok_encode(model_tokenizer(r->tok), o->prompt, o->prompt_len, TOK_ADD_SPECIAL, &v);
        } else {
            chat_msg *m = dx_calloc(o->n_msgs, sizeof *m);
            rc = m ? 0 : dx_errf(DX_ENOMEM, "router: %zu messages", o->n_msgs);
            for (size_t i = 0; m && i < o->n_msgs; i++)
                m[i] = (chat_msg){o->msgs[i].role, o->msgs[i].content, o->msgs[i].content_len};
            /* the node's own way: the model's template with the request's extras */
            model_chat_extra x = {json_object_get(o->root, "messages"),
                                  o->tool_choice == OAI_CHOICE_NONE ? NULL : o->tools,
                                  o->template_kwargs};
            if (m) rc = model_chat_encode(r->tok, m, o->n_msgs, &x, 1, NULL, NULL, &v);
            dx_free(m);
        }
        size_t n = v.n;
        tok_ids_free(&v);
        if (rc == 0) return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    }
    size_t bytes = o->prompt_len;
    for (size_t i = 0; i < o->n_msgs; i++) bytes += o->msgs[i].content_len + 8; /* + markup */
    return (uint32_t)((bytes + 3) / 4);
}

/* ---- preparation, off the loop ---------------------------------------------------------------
 *
 * Parsing, the conversation's keys, the bodies sent upstream and the token
 * count take milliseconds per megabyte: they run on the router's work pool
 * (node/work_pool.h) while the loop serves other streams.  The loop keeps
 * what is its own: the conversation map, the nodes, the answer. */

/* The conversation id: the header (copied on the loop), else the body's. */
static int conversation_id(rt_req *q, json_t *root, const char **id, size_t *len)
{
    json_t *b = json_object_get(root, "conversation_id");
    *id = NULL;
    if (b && !json_is_null(b) && !json_is_string(b)) {
        snprintf(q->prep_msg, sizeof q->prep_msg, "conversation_id: expected a string");
        snprintf(q->prep_param, sizeof q->prep_param, "conversation_id");
        return 400;
    }
    if (q->conv_hdr && *q->conv_hdr) {
        *id = q->conv_hdr;
        *len = strlen(q->conv_hdr);
    } else if (json_is_string(b) && json_string_length(b) > 0) {
        *id = json_string_value(b);
        *len = json_string_length(b);
    }
    return 0;
}

/* The caller's tenant: the API key it presented when keys are set, else
 * its whole Authorization value (clients may keep apart by sending
 * different ones), else none. */
static void tenant_ns(rt_req *q, router_key *ns)
{
    router *r = q->r;
    const http_auth_result *who = &q->who;
    if (who->internal)
        router_key_ns(r->ns_secret, ROUTER_TENANT_INTERNAL, NULL, 0, ns);
    else if (who->key >= 0)
        router_key_ns(r->ns_secret, ROUTER_TENANT_KEY, http_auth_key_digest(r->auth, who->key),
                      DX_KEY_DIGEST, ns);
    else if (q->auth)
        router_key_ns(r->ns_secret, ROUTER_TENANT_HEADER, q->auth, strlen(q->auth), ns);
    else
        router_key_ns(r->ns_secret, ROUTER_TENANT_NONE, NULL, 0, ns);
}

/* The nodes' prefix-cache namespace for the tenant (and the client's own
 * cache_salt): a tenant's requests never reuse KV computed for another's.
 * A caller with no tenant and no salt shares the default namespace. */
static int set_cache_salt(rt_req *q, const router_key *ns, oai_req *o)
{
    const http_auth_result *who = &q->who;
    int tenant = who->internal || who->key >= 0 || q->auth;
    if (!tenant && !o->cache_salt) return 0;
    char salt[33];
    router_key_salt(q->r->ns_secret, ns, o->cache_salt ? o->cache_salt : "", o->cache_salt_len,
                    salt);
    o->cache_salt = NULL; /* it pointed into the member replaced now */
    o->cache_salt_len = 0;
    return json_object_set_new(o->root, "cache_salt", json_string(salt)) < 0 ? 500 : 0;
}

/* The request's keys: its id's, or one per prefix of its messages (looked
 * up longest first on the loop), in the caller's tenant; and the tenant's
 * cache_salt set in the body. */
static int make_keys(rt_req *q, oai_req *o)
{
    router *r = q->r;
    uint64_t seed = r->cfg.key_seed;
    const char *id;
    size_t id_len;
    int st = conversation_id(q, o->root, &id, &id_len);
    if (st) return st;
    router_key ns;
    tenant_ns(q, &ns);
    if ((st = set_cache_salt(q, &ns, o))) return st;
    if (id) {
        q->key_kind = KEY_ID;
        router_key_id(seed, &ns, id, id_len, &q->key);
        return 0;
    }
    if (o->kind != OAI_CHAT) return 0;
    q->key_kind = KEY_CHAT;
    if (!(q->keys = dx_malloc(o->n_msgs * sizeof *q->keys))) return 500;
    router_key_chat_begin(seed, &ns, o->model, strlen(o->model), &q->chain);
    for (size_t i = 0; i < o->n_msgs; i++) {
        router_key_chat_add(seed, &q->chain, o->msgs[i].role, o->msgs[i].content,
                            o->msgs[i].content_len);
        q->keys[i] = q->chain;
    }
    q->n_keys = o->n_msgs;
    return 0;
}

/* The prefill node's body, but for its kv_transfer_params (spliced in on
 * the loop, once the conversation's entry is known): one token, no stream. */
static int build_prefill_base(rt_req *q, json_t *root)
{
    json_object_set_new(root, "max_tokens", json_integer(1));
    json_object_del(root, "max_completion_tokens");
    json_object_set_new(root, "stream", json_false());
    json_object_del(root, "stream_options");
    return router_json_append(&q->pbase, root);
}

/* The node's validation, except that a client's kv_transfer_params are
 * dropped whatever they hold (only the router issues them): a body whose
 * only fault is a malformed one is parsed again without it. */
static int parse_body(enum oai_kind kind, const char *body, size_t len, oai_req *o, oai_err *err)
{
    oai_parse_opts opts = {.n_vocab = 0};
    int rc = oai_req_parse(kind, body, len, &opts, o, err);
    if (rc == 0 || strcmp(err->param, "kv_transfer_params") != 0) return rc;
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    dx_buf b;
    dx_buf_init(&b, 0);
    json_object_del(root, "kv_transfer_params");
    if (router_json_append(&b, root) == 0) rc = oai_req_parse(kind, b.data, b.len, &opts, o, err);
    json_decref(root);
    dx_buf_free(&b);
    return rc;
}

/* Pool thread: everything before a node is chosen that is not the
 * conversation map's; q->prep_status 0, or the HTTP status with prep_msg. */
static void prep_run(work_job *j)
{
    rt_req *q = (rt_req *)((char *)j - offsetof(rt_req, job));
    oai_err err;
    if (parse_body(q->kind, q->in_body, q->in_len, &q->o, &err) < 0) {
        q->prep_status = err.status;
        snprintf(q->prep_msg, sizeof q->prep_msg, "%s", err.message);
        snprintf(q->prep_param, sizeof q->prep_param, "%s", err.param);
        return;
    }
    q->stream = q->o.stream;
    int st = make_keys(q, &q->o);
    if (st) {
        q->prep_status = st;
        return;
    }
    /* only the router issues kv_transfer_params; conversation_id is the router's */
    json_t *root = q->o.root;
    json_object_del(root, "kv_transfer_params");
    json_object_del(root, "conversation_id");
    q->o.kv_transfer_params = NULL;
    q->prompt_tokens = count_tokens(q->r, &q->o); /* the tokenizer is immutable */
    if (router_json_append(&q->body, root) < 0 ||
        (rt_may_prefill(q->r) && build_prefill_base(q, root) < 0))
        q->prep_status = 500;
}

static void lookup_done(void *user, int rc, const router_store_hit *e);

/* Looks the conversation's entry up, from the keys made off the loop, and
 * goes on in lookup_done (at once with the memory store; when Redis answers
 * or its deadline passes with a shared one). */
static void lookup(rt_req *q)
{
    if (q->key_kind == KEY_NONE) {
        lookup_done(q, 0, NULL);
        return;
    }
    q->busy = 1; /* the client leaving only clears q->conn: lookup_done ends q */
    if (q->key_kind == KEY_ID)
        router_store_get(q->r->store, &q->key, 1, lookup_done, q, &q->lookup_op);
    else /* content keys, shortest first: the longest found wins */
        router_store_get(q->r->store, q->keys, q->n_keys, lookup_done, q, &q->lookup_op);
}

/* The prefill node's body: the base made off the loop, and params that ask
 * it to hold the KV (and, with stored params, to pull the history). */
static int build_prefill_body(rt_req *q)
{
    json_t *kv = NULL;
    if (q->r->cfg.mode == ROUTER_BIDIRECTIONAL) /* pull, or (holder down) the history only */
        kv = entry_json(q, 1, entry_usable(q));
    if (!kv) kv = json_pack("{s:b, s:b}", "do_remote_decode", 1, "do_remote_prefill", 0);
    dx_buf p;
    dx_buf_init(&p, 0);
    int rc = kv ? router_json_append(&p, kv) : DX_ENOMEM;
    if (!rc) rc = splice_params(&q->pbase, p.data, &q->pbody);
    json_decref(kv);
    dx_buf_free(&p);
    return rc;
}

/* Local prefill or a prefill node first; starts the first upstream request
 * or answers why not. */
static int dispatch(rt_req *q)
{
    router *r = q->r;
    q->decode = pick_decode_for(q);
    if (q->decode < 0) {
        reply_error(q, 503, "no healthy decode node", NULL);
        return -1;
    }
    uint32_t cached = entry_usable(q) ? q->entry_tokens : 0;
    uint32_t uncached = q->prompt_tokens > cached ? q->prompt_tokens - cached : 0;
    int local = !q->pbase.len || uncached < r->cfg.local_prefill_max_tokens;
    if (!local && (q->prefill = pick_prefill(r, -1)) < 0) {
        rt_count_fallback(r, "no_prefill_healthy");
        local = 1;
    }
    int rc;
    if (local) {
        q->dparams = local_params(q);
        rc = start_decode(q);
    } else {
        q->via = "prefill";
        rc = build_prefill_body(q);
        if (rc == 0) rc = start_prefill(q);
    }
    char labels[32];
    snprintf(labels, sizeof labels, "via=\"%s\"", q->via);
    prom_family_add(&r->routed, labels, 1);
    if (rc < 0) {
        reply_error(q, 500, dx_errmsg(), NULL);
        return -1;
    }
    return 0;
}

/* Loop: the preparation is over — answer its failure, or look the
 * conversation up and go on to the nodes. */
static void prep_done(work_job *j)
{
    rt_req *q = (rt_req *)((char *)j - offsetof(rt_req, job));
    router *r = q->r;
    http_conn_release(q->held); /* the body has been read */
    q->held = NULL;
    q->in_work = 0;
    q->busy = 0;
    r->n_work--;
    if (r->destroying || j->canceled) { /* answered by rt_abort_all; the router waits for us */
        rt_forget(r, q);
        return;
    }
    if (!q->conn) {
        req_end(q);
        return;
    }
    if (q->prep_status) {
        const char *msg = q->prep_status == 500 ? "out of memory" : q->prep_msg;
        reply_error(q, q->prep_status, msg, q->prep_param[0] ? q->prep_param : NULL);
        req_end(q);
        return;
    }
    lookup(q);
}

/* The entry is known (or the store failed: no affinity, the router
 * recomputes); route the request. */
static void lookup_done(void *user, int rc, const router_store_hit *e)
{
    rt_req *q = user;
    router *r = q->r;
    q->lookup_op = NULL;
    q->busy = 0;
    if (!q->conn) {
        req_end(q);
        return;
    }
    if (rc == 0 && e) {
        q->found = 1;
        if (q->key_kind == KEY_CHAT) q->key = q->keys[e->which];
        q->entry_node = e->node;
        q->entry_tokens = e->num_tokens;
        if (e->params && !(q->entry_params = dx_strndup(e->params, e->params_len))) q->found = 0;
    }
    if (dispatch(q) == 0) {
        observe(&r->added_before, q->t0);
        oai_req_free(&q->o); /* the bodies are built */
        dx_buf_free(&q->pbase);
        return;
    }
    req_end(q);
}

/* Control characters in a header value passed upstream would split it. */
static int header_ok(const char *v)
{
    for (; *v; v++)
        if ((unsigned char)*v < 0x20 && *v != '\t') return 0;
    return 1;
}

void rt_route_completion(router *r, http_conn *c, const http_req *hr, enum oai_kind kind,
                         const http_auth_result *who, uint64_t t0)
{
    const char *auth = http_req_header(hr, "Authorization", NULL),
               *conv = http_req_header(hr, "X-Conversation-Id", NULL);
    if (auth && !header_ok(auth)) {
        rt_respond_error(r, c, hr->method, hr->path, 400,
                         "Authorization: control characters in the header", NULL, t0);
        return;
    }
    rt_req *q = req_new(r, c, hr, t0);
    if (!q || (auth && !(q->auth = dx_strdup(auth))) ||
        (conv && !(q->conv_hdr = dx_strdup(conv)))) {
        if (q) req_unlink_free(q);
        rt_respond_error(r, c, hr->method, hr->path, 500, "out of memory", NULL, t0);
        return;
    }
    q->kind = kind;
    q->who = *who;
    q->who.message = NULL;
    q->phase = PH_DECODE;
    q->in_body = hr->body;
    q->in_len = hr->body_len;
    q->held = c;
    http_conn_hold(c);
    q->in_work = q->busy = 1; /* prep_done ends q if the client leaves */
    r->n_work++;
    q->job = (work_job){.run = prep_run, .done = prep_done};
    work_pool_submit(r->prep, &q->job);
}

void rt_route_passthrough(router *r, http_conn *c, const http_req *hr, uint64_t t0)
{
    int node = pick_decode(r, -1);
    if (node < 0) node = pick_prefill(r, -1);
    if (node < 0) {
        rt_respond_error(r, c, hr->method, hr->path, 503, "no healthy node", NULL, t0);
        return;
    }
    rt_req *q = req_new(r, c, hr, t0);
    if (!q) {
        rt_respond_error(r, c, hr->method, hr->path, 500, "out of memory", NULL, t0);
        return;
    }
    q->phase = PH_PASS;
    if (up_send(q, node, NULL, 0, 10000, &k_pass_cb) < 0) {
        reply_error(q, 500, dx_errmsg(), NULL);
        req_end(q);
    }
}

void rt_abort_all(router *r)
{
    rt_req *q = r->active, *next;
    for (; q; q = next) {
        next = q->next;
        q->busy = 1;
        up_stop(q);
        router_store_cancel(q->lookup_op); /* its answer will not come: q ends here */
        q->lookup_op = NULL;
        if (q->stream_begun)
            stream_finish(q, "the router is shutting down");
        else
            reply_error(q, 503, "the router is shutting down", NULL);
        if (!q->in_work) req_end(q); /* else prep_done ends it */
    }
}

/* A request whose tokens were counted after the router was destroyed: it
 * was answered then; only its memory is left. */
void rt_forget(router *r, rt_req *q)
{
    req_unlink_free(q);
    rt_maybe_free(r);
}
