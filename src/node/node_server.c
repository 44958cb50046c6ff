/* node_server: the node's routes and lifecycle, and a completion request's
 * (see .h; the files that share the work are listed in node_server_priv.h).
 *
 * A completion request becomes a node_req when it arrives and is linked
 * into the active list, which a shutdown waits on; it is prepared (parsed,
 * its P/D params read, its prompt tokenised: node_prep.c) on the work pool
 * while the loop serves the rest, holding the connection so that its body
 * stays; then it goes to the P/D plan (node_pd.c, which may pull blocks
 * first and hands it back through on_pulled) and the backend.  Once the
 * backend has accepted it, it lives until its final (DONE) event has been
 * handled on the loop (node_events.c, node_answer.c) — even if the client
 * left earlier, because the engine still holds the pointer as its
 * callback's user data.  The client leaving only clears q->conn and cancels
 * the engine request (or, during preparation or a pull, lets their end free
 * it); the engine then sends DONE (CANCELED), answered 499.  Every end of a
 * request goes through req_end, which frees it and lets a shutdown that
 * waits for the last one go on. */
#include "node/node_server.h"

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_list.h"
#include "base/dx_log.h"
#include "http/http_conn.h"
#include "node/node_server_priv.h"
#include "base/dx_clock.h"
#include "oai/oai_anth.h"
#include "oai/oai_req.h"
#include "oai/oai_resp.h"
#include "oai/oai_rsp.h"
#include "http/prom.h"

const char *node_role_name(enum node_role r)
{
    return r == NODE_ROLE_PREFILL ? "prefill" : r == NODE_ROLE_DECODE ? "decode" : "both";
}

/* ---- the skeleton's answers ---------------------------------------------- */

/* The skeleton's answers (http_app.h): counted under their route, logged. */
static void respond_json(node_server *s, http_conn *c, const char *method, const char *path,
                         int status, const char *extra_hdr, const dx_buf *body, uint64_t t0)
{
    http_app_respond_json(s->app, c, method, path, status, extra_hdr, body, t0);
}

static void respond_error(node_server *s, http_conn *c, const http_req *r, int status,
                          const char *msg, const char *param, const char *code, uint64_t t0)
{
    http_app_error(s->app, c, r->method, r->path, status, msg, param, code, t0);
}

/* ---- a request's lifecycle ------------------------------------------------ */

static void req_free(node_req *q)
{
    node_pd_req_free(&q->srv->pd, &q->pd);
    oai_req_free(&q->o);
    dx_free(q->prompt);
    dx_buf_free(&q->text);
    dx_buf_free(&q->pend);
    dx_buf_free(&q->pend_cuts);
    dx_buf_free(&q->pend_lp);
    dx_buf_free(&q->lp_all);
    oai_tools_destroy(q->tp);
    dx_free(q->extra);
    node_gram_release(q->srv->grams, q->gram);
    dx_free(q->warn_hdr);
    oai_front_destroy(q->fr);
    oai_rsp_req_free(&q->rsp);
    json_decref(q->chat_doc);
    dx_free(q->client_model);
    dx_buf_free(&q->stops);
    dx_free(q);
}

/* On the active list from its arrival (a shutdown waits for it) until it
 * is freed; linking twice is a no-op. */
static void req_link(node_req *q)
{
    node_server *s = q->srv;
    if (dx_list_linked(&q->link)) return;
    dx_list_push_front(&s->active, &q->link);
    s->n_active++;
}

static void req_unlink(node_req *q)
{
    if (!dx_list_linked(&q->link)) return;
    dx_list_remove(&q->link);
    q->srv->n_active--;
}

static void maybe_stopped(node_server *s);

/* q is over (answered, or its client gone): freed, and a shutdown waiting
 * for the last request may go on. */
static void req_end(node_server *s, node_req *q)
{
    req_unlink(q);
    req_free(q);
    if (s->draining) maybe_stopped(s);
}

static void on_client_gone(void *user)
{
    node_req *q = user;
    q->conn = NULL;
    /* not with the engine yet: the preparation's or the pull's end frees it */
    if (q->preparing || q->pd.pulling) return;
    q->srv->be.cancel(q->srv->be.self, q->engine_id);
    DX_LOGD("%s: client disconnected, canceled", q->id);
}

_Static_assert(sizeof(oai_bias) == sizeof(engine_bias) &&
                   offsetof(oai_bias, bias) == offsetof(engine_bias, bias),
               "oai_bias and engine_bias differ");

static void fill_engine_request(node_req *q, engine_request *er)
{
    const oai_req *o = &q->o;
    memset(er, 0, sizeof *er);
    er->prompt = q->prompt;
    er->n_prompt = q->n_prompt;
    er->max_tokens = o->has_max_tokens ? o->max_tokens : 0;
    er->sampling = (engine_sampling){
        .temperature = (float)o->temperature,
        .top_k = o->top_k,
        .top_p = (float)o->top_p,
        .min_p = (float)o->min_p,
        .seed = o->seed,
        .has_seed = o->has_seed,
        .presence_penalty = (float)o->presence_penalty,
        .frequency_penalty = (float)o->frequency_penalty,
        .repetition_penalty = (float)o->repetition_penalty,
        /* oai_bias and engine_bias are the same pair (checked below) */
        .bias = (const engine_bias *)o->logit_bias,
        .n_bias = o->n_logit_bias,
    };
    er->logprobs = o->logprobs;
    er->top_logprobs = o->top_logprobs;
    er->stop = o->stop;
    er->n_stop = o->n_stop;
    er->ignore_eos = o->ignore_eos;
    node_pd_engine_request(&q->pd, er);
    _Static_assert(sizeof er->cache_salt == sizeof q->salt, "one namespace size");
    memcpy(er->cache_salt, q->salt, sizeof q->salt);
    er->grammar = q->gram ? node_gram_grammar(q->gram) : NULL;
    er->on_event = node_events_on_engine;
    er->user = q;
}

/* A request before it is parsed: its route, id and the answer's meta.
 * who: the caller's credentials (whether its kv_transfer_params count, its
 * namespace), kept for the preparation. */
static node_req *req_new(node_server *s, http_conn *c, enum oai_kind kind, enum oai_front_api front,
                         const http_auth_result *who, uint64_t t0)
{
    node_req *q = dx_calloc(1, sizeof *q);
    if (!q) return NULL;
    q->srv = s;
    q->conn = c;
    q->kind = kind;
    q->who = *who;
    q->who.message = NULL;
    q->trusted = who->trusted;
    q->t_start_ns = t0;
    q->front = front;
    q->path = front == OAI_FRONT_MESSAGES    ? "/v1/messages"
              : front == OAI_FRONT_RESPONSES ? "/v1/responses"
              : kind == OAI_CHAT             ? "/v1/chat/completions"
                                             : "/v1/completions";
    oai_make_id(q->id, sizeof q->id, kind == OAI_CHAT ? "chatcmpl" : "cmpl");
    if (front == OAI_FRONT_RESPONSES) oai_rsp_make_id(q->rsp_id, sizeof q->rsp_id);
    int key = who->key;
    if (key >= 0 && s->cfg.auth) { /* stored responses are the key's own */
        memcpy(q->tenant, http_auth_key_digest(s->cfg.auth, key), sizeof q->tenant);
        q->has_tenant = 1;
    }
    dx_buf_init(&q->stops, 0);
    q->meta = (oai_meta){kind, q->id, node_served_name(s), (int64_t)time(NULL)};
    dx_buf_init(&q->text, 0);
    dx_buf_init(&q->pend, 0);
    dx_buf_init(&q->pend_cuts, 0);
    dx_buf_init(&q->pend_lp, 0);
    dx_buf_init(&q->lp_all, 0);
    return q;
}

/* The parsed request is about to be freed or answered: its bytes leave the
 * connection's buffer budget. */
static void req_uncharge(node_req *q)
{
    if (q->charged && q->conn) http_conn_uncharge(q->conn, q->charged);
    q->charged = 0;
}

/* Answers an error (param and code may be NULL) for a request the engine
 * never saw, and ends it. */
static void fail_early(node_server *s, node_req *q, int status, const char *msg, const char *param,
                       const char *code)
{
    req_uncharge(q);
    oai_err e = {.status = status};
    if (q->front == OAI_FRONT_RESPONSES) { /* the chat path's field names in the API's */
        snprintf(e.message, sizeof e.message, "%s", msg);
        snprintf(e.param, sizeof e.param, "%s", param ? param : "");
        oai_rsp_err_from_chat(&e);
        msg = e.message;
        param = e.param[0] ? e.param : NULL;
    }
    if (q->conn) {
        http_conn_set_abort(q->conn, NULL, NULL);
        http_app_error(s->app, q->conn, "POST", q->path, status, msg, param, code, q->t_start_ns);
    } else {
        http_app_count(s->app, q->path, 499);
        http_app_log(s->app, "POST", q->path, 499, q->t_start_ns);
    }
    req_end(s, q);
}

/* Hands q (tokens in q->prompt, P/D blocks in q->pd) to the engine and
 * links it into the active list; on failure answers the client and ends q.
 * Returns 0 or the HTTP status sent. */
static int submit(node_server *s, node_req *q)
{
    if (!q->conn) { /* the client left while the request was being prepared */
        fail_early(s, q, 499, "client gone", NULL, NULL);
        return 499;
    }
    if (s->draining) {
        fail_early(s, q, 503, "the server is shutting down", NULL, NULL);
        return 503;
    }
    if (node_answer_setup(q) < 0) {
        fail_early(s, q, 500, "out of memory", NULL, NULL);
        return 500;
    }
    engine_request er;
    fill_engine_request(q, &er);
    int rc = s->be.submit(s->be.self, &er, &q->engine_id);
    if (rc < 0) {
        int st = rc == DX_EBUSY ? 503 : rc == DX_EINVAL ? 400 : 500;
        const char *msg = rc == DX_EBUSY ? "server busy: the waiting queue is full" : dx_errmsg();
        /* the field to blame: the prompt when it alone fills the context */
        const char *param = st != 400 ? NULL
                            : q->n_prompt >= s->be.n_ctx
                                ? (q->meta.kind == OAI_CHAT ? "messages" : "prompt")
                                : "max_tokens";
        /* also drops the P/D blocks, which are still ours */
        fail_early(s, q, st, msg, param, NULL);
        return st;
    }
    node_pd_submitted(&q->pd); /* the engine owns the handed blocks now */
    req_uncharge(q);
    oai_req_free(&q->o); /* everything the engine needs was copied */
    req_link(q);
    http_conn_set_abort(q->conn, on_client_gone, q);
    /* a stream's head goes out with its first text: until then a failure
     * can still be a plain HTTP error */
    return 0;
}

/* node_pd's on_pulled: the pull planned for q is over, whatever came of it. */
static void on_pulled(void *user)
{
    node_req *q = user;
    submit(q->srv, q);
}

/* ---- preparation: the loop's side ------------------------------------------ */

/* POST /tokenize (vLLM's) answers the prompt tokens a completion or chat
 * request with the same "prompt" or "messages" (tools, chat_template_kwargs)
 * would run on: it is prepared on the same path, token-faithful history
 * included.  (POST /detokenize, {"tokens": [...]} back to text, is cheap
 * and answered on the loop.) */
static void answer_tokens(node_server *s, node_req *q)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    int rc;
    if (q->count_only) { /* Anthropic's count_tokens: the size only */
        rc = oai_anth_count_json(&b, (uint32_t)q->n_prompt);
    } else {
        rc = dx_buf_printf(&b, "{\"count\":%zu,\"max_model_len\":%u,\"tokens\":[", q->n_prompt,
                           s->be.n_ctx);
        for (size_t i = 0; !rc && i < q->n_prompt; i++)
            rc = dx_buf_printf(&b, i ? ",%d" : "%d", q->prompt[i]);
        if (!rc) rc = dx_buf_puts(&b, "]}");
    }
    http_conn_set_abort(q->conn, NULL, NULL);
    if (rc)
        fail_early(s, q, 500, "out of memory", NULL, NULL);
    else {
        respond_json(s, q->conn, "POST", q->path, 200, NULL, &b, q->t_start_ns);
        req_end(s, q);
    }
    dx_buf_free(&b);
}

/* Loop: the preparation is over (or was dropped, at destroy): answer a
 * failure, /tokenize, or go on to the P/D plan and the engine. */
static void prep_done(work_job *j)
{
    node_req *q = (node_req *)((char *)j - offsetof(node_req, prep.job));
    node_server *s = q->srv;
    q->preparing = 0;
    http_app_prep_end(&q->prep);
    node_pd_prepared(&s->pd, &q->pd);
    if (j->canceled) { /* the server is being destroyed */
        if (q->conn) http_conn_set_abort(q->conn, NULL, NULL);
        req_unlink(q);
        req_free(q);
        return;
    }
    if (!q->conn) { /* the client left while its request was being prepared */
        fail_early(s, q, 499, "client gone", NULL, NULL);
        return;
    }
    if (q->prep_rc < 0) {
        const oai_err *e = &q->prep_err;
        fail_early(s, q, e->status, e->message, e->param[0] ? e->param : NULL, q->prep_code);
        return;
    }
    if (q->tokenize) {
        answer_tokens(s, q);
        return;
    }
    /* the parsed request (several times its body for many small messages)
     * counts in the buffer budget until the engine has copied what it needs */
    q->charged = q->o.mem_bytes + q->rsp.mem_bytes;
    if (http_conn_charge(q->conn, q->charged)) {
        fail_early(s, q, 503, HTTP_BUSY_BUFFERS, NULL, NULL);
        return;
    }
    q->keep_text = !q->stream || node_pd_wants_text(&q->pd);
    node_pd_view v;
    node_hooks_view(q, &v);
    if (node_pd_plan(&s->pd, &q->pd, &v, q) == 1) return; /* pulling; on_pulled submits q */
    submit(s, q);
}

/* A completion or /tokenize request is prepared on the pool, holding the
 * connection (its body) until then; the loop goes on serving meanwhile. */
static void route_prepare(node_server *s, http_conn *c, const http_req *r, enum oai_kind kind,
                          enum oai_front_api front, int tokenize, const http_auth_result *who,
                          uint64_t t0)
{
    if (!s->ready || (s->draining && !tokenize)) {
        respond_error(s, c, r, 503,
                      s->ready ? "the server is shutting down" : "the model is still loading", NULL,
                      NULL, t0);
        return;
    }
    node_req *q = req_new(s, c, kind, front, who, t0);
    if (!q) {
        respond_error(s, c, r, 500, "out of memory", NULL, NULL, t0);
        return;
    }
    q->count_only = tokenize && front == OAI_FRONT_MESSAGES;
    if (tokenize) q->path = q->count_only ? "/v1/messages/count_tokens" : "/tokenize";
    q->tokenize = tokenize;
    q->preparing = 1;
    req_link(q); /* a shutdown waits for it */
    http_conn_set_abort(c, on_client_gone, q);
    http_app_prep_start(&q->prep, s->prep, c, r, node_prep_run, prep_done);
}

/* ---- routes ---------------------------------------------------------------- */

static void route_health(node_server *s, http_conn *c, const http_req *r, uint64_t t0)
{
    const char *st = s->draining ? "draining" : s->ready ? "ok" : "loading";
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_printf(&b, "{\"status\":\"%s\"}", st);
    respond_json(s, c, r->method, r->path, s->ready && !s->draining ? 200 : 503, NULL, &b, t0);
    dx_buf_free(&b);
}

/* Routes that need the model answer 503 until it is loaded; 1: answered. */
static int still_loading(node_server *s, http_conn *c, const http_req *r, uint64_t t0)
{
    if (s->ready) return 0;
    respond_error(s, c, r, 503, "the model is still loading", NULL, NULL, t0);
    return 1;
}

static void route_models(node_server *s, http_conn *c, const http_req *r, uint64_t t0)
{
    if (still_loading(s, c, r, t0)) return;
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_models_json(&b, node_served_name(s), s->started);
    respond_json(s, c, r->method, r->path, 200, NULL, &b, t0);
    dx_buf_free(&b);
}

static void route_detokenize(node_server *s, http_conn *c, const http_req *r, uint64_t t0)
{
    if (still_loading(s, c, r, t0)) return;
    json_error_t je;
    json_t *root = json_loadb(r->body, r->body_len, 0, &je),
           *toks = json_object_get(root, "tokens");
    if (!json_is_array(toks)) {
        json_decref(root);
        respond_error(s, c, r, 400, "tokens: required, an array of token ids", "tokens", NULL, t0);
        return;
    }
    size_t n = json_array_size(toks), i;
    int32_t *ids = dx_malloc((n ? n : 1) * sizeof *ids);
    json_t *v;
    int bad = !ids;
    json_array_foreach(toks, i, v)
    {
        if (bad) break;
        json_int_t id = json_integer_value(v);
        bad = !json_is_integer(v) || id < 0 || id >= (json_int_t)s->be.n_vocab;
        if (!bad) ids[i] = (int32_t)id;
    }
    json_decref(root);
    if (bad) {
        dx_free(ids);
        respond_error(s, c, r, 400, "tokens: token ids of this model's vocabulary", "tokens", NULL,
                      t0);
        return;
    }
    dx_buf text, b;
    dx_buf_init(&text, 0);
    dx_buf_init(&b, 0);
    int rc = tok_decode(s->be.tk, ids, n, &text);
    if (!rc) rc = dx_buf_puts(&b, "{\"prompt\":");
    if (!rc) rc = oai_json_str(&b, text.data ? text.data : "", text.len);
    if (!rc) rc = dx_buf_putc(&b, '}');
    if (rc)
        respond_error(s, c, r, 500, "out of memory", NULL, NULL, t0);
    else
        respond_json(s, c, "POST", r->path, 200, NULL, &b, t0);
    dx_free(ids);
    dx_buf_free(&text);
    dx_buf_free(&b);
}

/* POST /admin/drain: with an internal key only its holders may drain the
 * node (an API key is a client's, not an operator's); without one, the
 * node's API keys, or (none) whoever reaches its loopback port. */
static void route_drain(node_server *s, http_conn *c, const http_req *r,
                        const http_auth_result *who, uint64_t t0)
{
    if (http_auth_internal_key(s->cfg.auth) && !who->internal) {
        respond_error(s, c, r, 401, "draining a node takes the cluster's internal key", NULL, NULL,
                      t0);
        return;
    }
    if (s->cfg.on_drain)
        s->cfg.on_drain(s->cfg.user);
    else
        node_server_drain(s);
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_printf(&b, "{\"status\":\"draining\",\"running\":%zu}", s->n_active);
    respond_json(s, c, r->method, r->path, 200, NULL, &b, t0);
    dx_buf_free(&b);
}

/* The routes, as the skeleton (http_app.h) calls them. */
static void on_health(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    route_health(u, c, r, k->t0);
}

static void on_models(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    route_models(u, c, r, k->t0);
}

static void on_metrics(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    node_metrics_respond(u, c, r, k->t0);
}

enum { PREP_CHAT, PREP_COMPLETION, PREP_TOKENIZE, PREP_MESSAGES, PREP_COUNT, PREP_RESPONSES };

static void on_prepare(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    enum oai_front_api front = k->arg == PREP_MESSAGES || k->arg == PREP_COUNT ? OAI_FRONT_MESSAGES
                               : k->arg == PREP_RESPONSES                      ? OAI_FRONT_RESPONSES
                                                                               : OAI_FRONT_CHAT;
    route_prepare(u, c, r, k->arg == PREP_COMPLETION ? OAI_COMPLETION : OAI_CHAT, front,
                  k->arg == PREP_TOKENIZE || k->arg == PREP_COUNT, k->who, k->t0);
}

/* GET and DELETE /v1/responses/{id}: the caller's own stored responses. */
static void on_response(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    node_server *s = u;
    const char *id = r->path + strlen("/v1/responses/");
    const uint8_t *tenant =
        k->who->key >= 0 && s->cfg.auth ? http_auth_key_digest(s->cfg.auth, k->who->key) : NULL;
    dx_buf b;
    dx_buf_init(&b, 0);
    int found;
    if (!strcmp(r->method, "DELETE")) {
        found = oai_rsp_store_delete(s->responses, tenant, id);
        if (found) oai_rsp_deleted_json(&b, id);
    } else {
        char *obj;
        size_t len;
        found = oai_rsp_store_response(s->responses, tenant, id, dx_now_s(), &obj, &len);
        if (found > 0) dx_buf_append(&b, obj, len);
        if (found > 0) dx_free(obj);
    }
    if (found > 0) {
        respond_json(s, c, r->method, r->path, 200, NULL, &b, k->t0);
    } else {
        char msg[200];
        snprintf(msg, sizeof msg, "Response with id '%.128s' not found.", id);
        respond_error(s, c, r, found < 0 ? 500 : 404, found < 0 ? dx_errmsg() : msg, NULL,
                      found < 0 ? NULL : "response_not_found", k->t0);
    }
    dx_buf_free(&b);
}

static void on_detokenize(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    route_detokenize(u, c, r, k->t0);
}

static void on_drain(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    route_drain(u, c, r, k->who, k->t0);
}

/* /health and /metrics stay open (probes, scrapers); everything else,
 * unknown routes too, wants the caller's key when keys are set. */
static const http_app_route k_routes[] = {
    {.path = "/health", .methods = HTTP_APP_GET, .open = 1, .fn = on_health},
    {.path = "/metrics", .methods = HTTP_APP_GET, .open = 1, .fn = on_metrics},
    {.path = "/v1/models", .methods = HTTP_APP_GET, .fn = on_models},
    {.path = "/v1/chat/completions", .methods = HTTP_APP_POST, .fn = on_prepare, .arg = PREP_CHAT},
    {.path = "/v1/completions", .methods = HTTP_APP_POST, .fn = on_prepare, .arg = PREP_COMPLETION},
    {.path = "/tokenize", .methods = HTTP_APP_POST, .fn = on_prepare, .arg = PREP_TOKENIZE},
    {.path = "/detokenize", .methods = HTTP_APP_POST, .fn = on_detokenize},
    {.path = "/admin/drain", .methods = HTTP_APP_POST, .fn = on_drain},
    /* the other front doors (docs/api.md) */
    {.path = "/v1/messages",
     .methods = HTTP_APP_POST,
     .fn = on_prepare,
     .arg = PREP_MESSAGES,
     .error = oai_anth_http_error},
    {.path = "/v1/messages/count_tokens",
     .methods = HTTP_APP_POST,
     .fn = on_prepare,
     .arg = PREP_COUNT,
     .error = oai_anth_http_error},
    {.path = "/v1/responses", .methods = HTTP_APP_POST, .fn = on_prepare, .arg = PREP_RESPONSES},
    {.path = "/v1/responses/",
     .methods = HTTP_APP_GET | HTTP_APP_DELETE,
     .fn = on_response,
     .prefix = 1},
};

/* ---- completions: the end -------------------------------------------------- */

/* node_events_drain's done: q's DONE has been taken, the engine is finished
 * with it, so it is answered and ended. */
/* A Responses answer that completed, kept (unless store: false) for
 * previous_response_id and GET: the conversation as chat messages and the
 * response object.  A store that cannot keep it only loses the
 * continuation, never the answer. */
static void store_response(node_server *s, node_req *q)
{
    if (q->front != OAI_FRONT_RESPONSES || !q->rsp.store || !q->fr || !oai_front_completed(q->fr))
        return;
    oai_tools_result r;
    json_t *hist = NULL;
    size_t len;
    const char *obj = oai_front_response(q->fr, &len);
    int rc = obj ? oai_front_result(q->fr, &r) : DX_EINVAL;
    if (!rc) {
        rc = oai_rsp_history(&q->rsp, q->chat_doc, &r, &hist);
        oai_tools_result_free(&r);
    }
    if (!rc)
        rc = oai_rsp_store_put(s->responses, q->has_tenant ? q->tenant : NULL, q->rsp_id, hist, obj,
                               len, dx_now_s());
    if (rc) DX_LOGW("%s: response %s not stored: %s", q->id, q->rsp_id, dx_errmsg());
    json_decref(hist);
}

static void req_done(node_server *s, node_req *q)
{
    node_hooks_finish(s, q); /* the answer's kv_transfer_params, the reply memory */
    int status = node_answer_done(q);
    store_response(s, q);
    node_metrics_done(s, q, status);
    req_end(s, q);
}

static void on_wake(uv_async_t *a)
{
    node_events_drain(a->data, req_done);
}

/* ---- lifecycle ---------------------------------------------------------- */

static void on_flush_wait(uv_timer_t *t)
{
    maybe_stopped(t->data);
}

static void maybe_stopped(node_server *s)
{
    if (!s->shutting || s->stopped || s->n_active > 0) return;
    /* The last answers' final bytes (a stream's [DONE]) may still be queued:
     * tearing the server down now would cut them.  Wait for the kernel to
     * take them, at most 2 s (a client that stopped reading). */
    if (http_srv_unwritten(s->http) && s->flush_waits < 200) {
        s->flush_waits++;
        uv_timer_start(&s->grace, on_flush_wait, 10, 0);
        return;
    }
    s->stopped = 1;
    uv_timer_stop(&s->grace);
    http_srv_close_idle(s->http);
    if (!s->quiet) DX_LOGI("shutdown: all requests finished");
    if (s->cfg.on_stopped) s->cfg.on_stopped(s->cfg.user);
}

static void on_grace_over(uv_timer_t *t)
{
    node_server *s = t->data;
    DX_LOGW("shutdown: grace period over, canceling %zu requests", s->n_active);
    DX_LIST_FOR_EACH(it, &s->active)
    {
        node_req *q = DX_LIST_ENTRY(it, node_req, link);
        if (!q->preparing && !q->pd.pulling) s->be.cancel(s->be.self, q->engine_id);
    }
}

void node_server_drain(node_server *s)
{
    if (s->draining) return;
    s->draining = 1;
    DX_LOGI("drain: no new requests; %zu running, the KV port keeps serving", s->n_active);
}

void node_server_shutdown(node_server *s)
{
    if (s->shutting) return;
    s->shutting = s->draining = 1;
    http_srv_stop_accepting(s->http);
    http_srv_close_idle(s->http);
    /* a node that never served (its model failed to load) has nothing to say */
    s->quiet = !s->ready;
    if (!s->quiet)
        DX_LOGI("shutdown: no longer accepting; %zu requests running (grace %.0f s)", s->n_active,
                s->cfg.shutdown_grace_s);
    uv_timer_start(&s->grace, on_grace_over, (uint64_t)(s->cfg.shutdown_grace_s * 1e3), 0);
    maybe_stopped(s);
}

int node_server_create(uv_loop_t *loop, const node_server_config *cfg, node_server **out)
{
    *out = NULL;
    node_server *s = dx_calloc(1, sizeof *s);
    if (!s) return dx_errf(DX_ENOMEM, "node server");
    s->loop = loop;
    s->cfg = *cfg;
    if (s->cfg.shutdown_grace_s <= 0)
        s->cfg.shutdown_grace_s = NODE_SERVER_DEFAULT_SHUTDOWN_GRACE_S;
    s->started = (int64_t)time(NULL);
    dx_buf_init(&s->scratch, 0);
    dx_buf_init(&s->take, 0);
    dx_buf_init(&s->take_cuts, 0);
    dx_buf_init(&s->take_lp, 0);
    dx_buf_init(&s->scratch_lp, 0);
    dx_buf_init(&s->scratch_front, 0);
    prom_hist_init_latency(&s->ttft);
    prom_hist_init_latency(&s->engine_ttft);
    prom_hist_init_latency(&s->tpot);
    prom_hist_init_latency(&s->e2e);
    node_pd_init(&s->pd);
    dx_list_init(&s->active);
    hist_mem_config hc_mem = {.ttl_s = cfg->history_ttl_s};
    http_app_config ac = {
        .routes = k_routes, .n_routes = DX_ARRAY_LEN(k_routes), .auth = cfg->auth, .user = s};
    oai_rsp_store_config rc_store = {
        .ttl_s = cfg->responses_ttl_s > 0 ? cfg->responses_ttl_s
                 : cfg->history_ttl_s > 0 ? cfg->history_ttl_s
                                          : NODE_DEFAULT_RESPONSES_TTL_S,
        .max_bytes =
            cfg->responses_max_bytes ? cfg->responses_max_bytes : NODE_DEFAULT_RESPONSES_MAX_BYTES};
    if (http_app_create(&ac, &s->app) < 0 || hist_mem_create(&hc_mem, &s->mem) < 0 ||
        oai_rsp_store_create(&rc_store, &s->responses) < 0) {
        http_app_destroy(s->app);
        hist_mem_destroy(s->mem);
        dx_free(s);
        return dx_errf(DX_ENOMEM, "node server: reply history");
    }
    http_srv_config hc = {
        .host = cfg->host,
        .port = cfg->port,
        .lim = cfg->http,
        .on_request = http_app_on_request,
        .user = s->app,
    };
    int rc = http_srv_create(loop, &hc, &s->http);
    if (rc < 0) {
        http_app_destroy(s->app);
        hist_mem_destroy(s->mem);
        oai_rsp_store_destroy(s->responses);
        dx_free(s);
        return rc;
    }
    rc = work_pool_create(loop, cfg->prep_threads > 0 ? cfg->prep_threads : 2, &s->prep);
    if (rc == 0 && (rc = node_gram_cache_create(cfg->grammar_cache, &s->grams)) < 0)
        work_pool_destroy(s->prep); /* its threads have no jobs; the loop frees it */
    if (rc < 0) {
        http_srv_destroy(s->http);
        http_app_destroy(s->app);
        hist_mem_destroy(s->mem);
        oai_rsp_store_destroy(s->responses);
        dx_free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    uv_async_init(loop, &s->wake, on_wake);
    s->wake.data = s;
    uv_timer_init(loop, &s->grace);
    s->grace.data = s;
    *out = s;
    return 0;
}

int node_server_port(const node_server *s)
{
    return http_srv_port(s->http);
}

size_t node_server_n_active(const node_server *s)
{
    return s->n_active;
}

void node_server_set_backend(node_server *s, const node_backend *b)
{
    s->be = *b;
    node_pd_config pc;
    node_hooks_config(s, on_pulled, &pc);
    node_pd_configure(&s->pd, &pc); /* before it, no request reaches P/D */
    s->ready = 1;
}

static void on_handle_closed(uv_handle_t *h)
{
    node_server *s = h->data;
    if (h == (uv_handle_t *)&s->wake) {
        uv_close((uv_handle_t *)&s->grace, on_handle_closed);
        return;
    }
    pthread_mutex_destroy(&s->mu);
    dx_free(s);
}

void node_server_destroy(node_server *s)
{
    if (!s) return;
    work_pool_destroy(s->prep);     /* preparations in flight end here (their done frees them) */
    node_events_drain(s, req_done); /* final events the backend delivered while stopping */
    dx_list *it;
    while ((it = dx_list_first(&s->active))) { /* only if the backend never finished them */
        node_req *q = DX_LIST_ENTRY(it, node_req, link);
        if (q->conn) http_conn_set_abort(q->conn, NULL, NULL);
        req_unlink(q);
        req_free(q);
    }
    node_gram_cache_destroy(s->grams); /* after the requests, which held its grammars */
    http_srv_destroy(s->http);
    http_app_destroy(s->app);
    node_pd_free(&s->pd);
    hist_mem_destroy(s->mem);
    oai_rsp_store_destroy(s->responses);
    dx_buf_free(&s->scratch);
    dx_buf_free(&s->take);
    dx_buf_free(&s->take_cuts);
    dx_buf_free(&s->take_lp);
    dx_buf_free(&s->scratch_lp);
    dx_buf_free(&s->scratch_front);
    uv_close((uv_handle_t *)&s->wake, on_handle_closed);
}
