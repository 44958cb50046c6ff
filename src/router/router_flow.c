/* router_flow: a completion request's way through the router (router.h,
 * docs/router.md), and the GETs passed through.
 *
 *   parse (oai_req: the same validation a node does) → strip client
 *   kv_transfer_params and conversation_id → key (these on the work pool,
 *   off the loop: router_prep.c) → look up the entry → choose the decode
 *   node → local prefill, or prefill node first (router_pick.c decides;
 *   router_prefill.c) → decode node → proxy the answer, remove and keep its
 *   kv_transfer_params → store the entry (router_decode.c,
 *   router_entry.c).
 *
 * This file holds the steps between the legs: the hand-back from the work
 * pool, the lookup and the route.  A request's life and its answers are
 * router_req.c's (the rules: router_flow_priv.h). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "router/router_flow_priv.h"

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

/* Counts the choice: the affinity, and each fallback taken. */
static void count_choice(rt_req *q, const router_pick_choice *ch)
{
    router *r = q->r;
    if (ch->affinity_fallback) rt_metrics_fallback(r, ch->affinity_fallback);
    q->affinity = ch->affinity;
    if (ch->affinity == ROUTER_PICK_HIT) r->affinity_hits++;
    if (ch->affinity == ROUTER_PICK_MISS) r->affinity_misses++;
    if (ch->prefill_fallback) rt_metrics_fallback(r, ch->prefill_fallback);
}

/* Local prefill or a prefill node first; starts the first upstream request
 * or answers why not. */
static int dispatch(rt_req *q)
{
    router *r = q->r;
    router_pick_cluster c = rt_nodes_cluster(r);
    router_pick_req in = {.keyed = q->key_kind != KEY_NONE,
                          .entry = &q->entry,
                          .prompt_tokens = q->prompt_tokens,
                          .prefill_ready = q->pbase.len > 0};
    router_pick_choice ch;
    router_pick_route(&c, &in, &ch);
    count_choice(q, &ch);
    q->decode = ch.decode;
    if (q->decode < 0) {
        rt_req_reply_error(q, 503, "no healthy decode node", NULL);
        return dx_errf(DX_EBUSY, "no healthy decode node");
    }
    q->prefill = ch.prefill;
    int rc;
    if (q->prefill < 0) {
        q->dparams = rt_entry_local_params(q);
        rc = rt_decode_start(q);
    } else {
        q->via = "prefill";
        rc = rt_prefill_start(q);
    }
    char labels[32];
    snprintf(labels, sizeof labels, "via=\"%s\"", q->via);
    prom_family_add(&r->routed, labels, 1);
    if (rc < 0) {
        rt_req_reply_error(q, 500, dx_errmsg(), NULL);
        return rc;
    }
    return 0;
}

/* The answer's transcoder, for a request of another front door. */
static int make_front(rt_req *q)
{
    oai_front_config c = {
        .api = q->front, .model = q->client_model, .prompt_hint = q->prompt_tokens};
    if (q->front == OAI_FRONT_RESPONSES) {
        oai_rsp_make_id(q->rsp_id, sizeof q->rsp_id);
        c.rsp =
            (oai_rsp_meta){.id = q->rsp_id, .created_at = (int64_t)time(NULL), .echo = q->rsp.echo};
    }
    if (!(q->fr = oai_front_create(&c))) return dx_errf(DX_ENOMEM, "out of memory");
    q->defer_end = q->front == OAI_FRONT_RESPONSES && q->rsp.store;
    return 0;
}

/* Anthropic's count_tokens: a decode node's /tokenize of the chat request,
 * answered as the prompt's size. */
static void count_on_done(void *user, int rc, long status)
{
    rt_req *q = user;
    if (rt_req_up_finished(q)) return;
    json_error_t je;
    json_t *a = rc < 0 || status != 200 ? NULL : json_loadb(q->acc.data, q->acc.len, 0, &je);
    json_t *n = json_object_get(a, "count");
    if (rc < 0) {
        rt_req_reply_error(q, rc == DX_ETIMEDOUT ? 504 : 502, dx_errmsg(), NULL);
    } else if (status != 200 || !json_is_integer(n)) {
        rt_req_reply_full(q, status == 200 ? 502 : (int)status, q->acc.data, q->acc.len);
    } else {
        oai_front_destroy(q->fr); /* the answer is not a chat answer: written here */
        q->fr = NULL;
        dx_buf b;
        dx_buf_init(&b, 0);
        oai_anth_count_json(&b, (uint32_t)json_integer_value(n));
        rt_req_reply_full(q, 200, b.data, b.len);
        dx_buf_free(&b);
    }
    json_decref(a);
    rt_req_end(q);
}

static const router_up_cb k_count_cb = {.on_data = rt_req_acc_on_data, .on_done = count_on_done};

static void count_tokens(rt_req *q)
{
    router_pick_cluster cl = rt_nodes_cluster(q->r);
    int node = router_pick_any(&cl);
    q->up_path = "/tokenize";
    if (node < 0) {
        rt_req_reply_error(q, 503, "no healthy node", NULL);
        rt_req_end(q);
    } else if (rt_req_up_send(q, node, q->body.data, q->body.len, 10000, &k_count_cb) < 0) {
        rt_req_reply_error(q, 500, dx_errmsg(), NULL);
        rt_req_end(q);
    }
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
    if (r->destroying || j->canceled) {
        /* prepared after the router was destroyed: it was answered then
         * (rt_req_abort_all); only its memory is left, and the router waits
         * for it */
        rt_req_forget(q);
        return;
    }
    if (!q->conn) {
        rt_req_end(q);
        return;
    }
    if (q->prep_status) {
        const char *msg = q->prep_status == 500 ? "out of memory" : q->prep_msg;
        rt_req_reply_error_code(q, q->prep_status, msg, q->prep_param[0] ? q->prep_param : NULL,
                                q->prep_code);
        rt_req_end(q);
        return;
    }
    if (q->front != OAI_FRONT_CHAT && make_front(q) < 0) {
        rt_req_reply_error(q, 500, "out of memory", NULL);
        rt_req_end(q);
        return;
    }
    if (q->count_only) {
        count_tokens(q);
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
        rt_req_end(q);
        return;
    }
    if (rc == 0 && e) rt_entry_take(q, e);
    if (dispatch(q) == 0) {
        rt_metrics_observe(&r->added_before, q->t0);
        oai_req_free(&q->o); /* the bodies are built */
        dx_buf_free(&q->pbase);
        return;
    }
    rt_req_end(q);
}

/* Control characters in a header value passed upstream would split it. */
static int header_ok(const char *v)
{
    for (; *v; v++)
        if ((unsigned char)*v < 0x20 && *v != '\t') return 0;
    return 1;
}

void rt_flow_completion(router *r, http_conn *c, const http_req *hr, enum oai_kind kind, int front,
                        int count, const http_auth_result *who, uint64_t t0)
{
    const char *auth = http_req_header(hr, "Authorization", NULL),
               *conv = http_req_header(hr, "X-Conversation-Id", NULL);
    if (auth && !header_ok(auth)) {
        rt_req_refuse(r, c, hr->method, hr->path, 400,
                      "Authorization: control characters in the header", NULL, t0);
        return;
    }
    rt_req *q = rt_req_new(r, c, hr, t0);
    if (!q || (auth && !(q->auth = dx_strdup(auth))) ||
        (conv && !(q->conv_hdr = dx_strdup(conv)))) {
        if (q) rt_req_forget(q);
        rt_req_refuse(r, c, hr->method, hr->path, 500, "out of memory", NULL, t0);
        return;
    }
    q->kind = kind;
    q->front = (enum oai_front_api)front;
    q->count_only = count;
    if (q->front != OAI_FRONT_CHAT) q->up_path = count ? "/tokenize" : "/v1/chat/completions";
    q->who = *who;
    q->who.message = NULL;
    if (who->key >= 0) { /* stored responses are the key's own */
        memcpy(q->tenant, http_auth_key_digest(r->auth, who->key), sizeof q->tenant);
        q->has_tenant = 1;
    }
    q->phase = PH_DECODE;
    q->in_body = hr->body;
    q->in_len = hr->body_len;
    q->held = c;
    http_conn_hold(c);
    q->in_work = q->busy = 1; /* prep_done ends q if the client leaves */
    r->n_work++;
    q->job = (work_job){.run = rt_prep_run, .done = prep_done};
    work_pool_submit(r->prep, &q->job);
}

/* ---- GET and DELETE /v1/responses/{id} -------------------------------------------------- */

/* Pool thread: the store's answer into q->acc, its status into prep_status. */
static void response_run(work_job *j)
{
    rt_req *q = (rt_req *)((char *)j - offsetof(rt_req, job));
    router *r = q->r;
    const uint8_t *tenant = q->has_tenant ? q->tenant : NULL;
    const char *id = q->conv_hdr; /* the id, copied from the path */
    int found;
    if (!strcmp(q->method, "DELETE")) {
        found = router_rsp_delete(r->responses, tenant, id);
        if (found > 0) oai_rsp_deleted_json(&q->acc, id);
    } else {
        char *obj;
        size_t len;
        found = router_rsp_response(r->responses, tenant, id, &obj, &len);
        if (found > 0 && dx_buf_append(&q->acc, obj, len))
            found = dx_errf(DX_ENOMEM, "router: out of memory for a stored response");
        if (found > 0 || obj) dx_free(obj);
    }
    q->prep_status = found > 0 ? 200 : found < 0 ? 503 : 404;
    if (found <= 0) {
        q->acc.len = 0;
        char msg[200];
        snprintf(msg, sizeof msg, "Response with id '%.128s' not found.", id);
        oai_error_json(&q->acc, found < 0 ? "the responses store did not answer; try again" : msg,
                       found < 0 ? "server_error" : "invalid_request_error", NULL,
                       found < 0 ? NULL : "response_not_found");
    }
}

static void response_done(work_job *j)
{
    rt_req *q = (rt_req *)((char *)j - offsetof(rt_req, job));
    router *r = q->r;
    q->in_work = 0;
    q->busy = 0;
    r->n_work--;
    if (r->destroying || j->canceled) {
        rt_req_forget(q);
        return;
    }
    if (q->conn) rt_req_reply_full(q, q->prep_status, q->acc.data, q->acc.len);
    rt_req_end(q);
}

void rt_flow_response(router *r, http_conn *c, const http_req *hr, const http_auth_result *who,
                      uint64_t t0)
{
    rt_req *q = rt_req_new(r, c, hr, t0);
    if (!q || !(q->conv_hdr = dx_strdup(hr->path + strlen("/v1/responses/")))) {
        if (q) rt_req_forget(q);
        rt_req_refuse(r, c, hr->method, hr->path, 500, "out of memory", NULL, t0);
        return;
    }
    q->method = !strcmp(hr->method, "DELETE") ? "DELETE" : "GET";
    q->phase = PH_PASS;
    if (who->key >= 0) {
        memcpy(q->tenant, http_auth_key_digest(r->auth, who->key), sizeof q->tenant);
        q->has_tenant = 1;
    }
    q->in_work = q->busy = 1;
    r->n_work++;
    q->job = (work_job){.run = response_run, .done = response_done};
    work_pool_submit(r->prep, &q->job);
}

/* ---- GET passed through ------------------------------------------------------------- */

static void pass_on_done(void *user, int rc, long status)
{
    rt_req *q = user;
    if (rt_req_up_finished(q)) return;
    if (rc < 0)
        rt_req_reply_error(q, rc == DX_ETIMEDOUT ? 504 : 502, dx_errmsg(), NULL);
    else
        rt_req_reply_full(q, (int)status, q->acc.data, q->acc.len);
    rt_req_end(q);
}

static const router_up_cb k_pass_cb = {.on_data = rt_req_acc_on_data, .on_done = pass_on_done};

void rt_flow_passthrough(router *r, http_conn *c, const http_req *hr, uint64_t t0)
{
    router_pick_cluster cl = rt_nodes_cluster(r);
    int node = router_pick_any(&cl);
    if (node < 0) {
        rt_req_refuse(r, c, hr->method, hr->path, 503, "no healthy node", NULL, t0);
        return;
    }
    rt_req *q = rt_req_new(r, c, hr, t0);
    if (!q) {
        rt_req_refuse(r, c, hr->method, hr->path, 500, "out of memory", NULL, t0);
        return;
    }
    q->phase = PH_PASS;
    if (rt_req_up_send(q, node, NULL, 0, 10000, &k_pass_cb) < 0) {
        rt_req_reply_error(q, 500, dx_errmsg(), NULL);
        rt_req_end(q);
    }
}
