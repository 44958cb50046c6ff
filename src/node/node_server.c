/* node_server: routes, the completion path and the engine-event hand-off
 * (see .h).
 *
 * A completion request becomes a node_req when it arrives; it is prepared
 * (parsed, its P/D params read, its prompt tokenised) on the work pool while
 * the loop serves the rest, holding the connection so that its body stays;
 * then it goes to the P/D plan and the backend.  Once the backend has
 * accepted it, it lives until its final (DONE) event has been handled on
 * the loop — even if the client left earlier, because the engine still
 * holds the pointer as its callback's user data.  The client leaving only
 * clears req->conn and cancels the engine request (or, during preparation or
 * a pull, lets their end free it).
 *
 * Engine events reach the loop without an allocation per token: the engine
 * thread appends a TOKENS event's text to the request's own pending buffer
 * (which keeps its memory) and stores the DONE figures inline, all under the
 * server's mutex, links the request into the ready list unless it is there
 * already, and wakes the loop.  The loop takes the ready list and, for each
 * request, copies the pending text out under the mutex into its own reused
 * buffer; the SSE chunks are built and written outside the mutex.  Each
 * event's text keeps its own chunk (one token per chunk, as OpenAI and vLLM
 * send them; the engine holds back only an incomplete UTF-8 sequence or a
 * possible stop-string prefix), so several tokens that arrive between two
 * wake-ups are several events in one socket write.
 *
 * Lifetime: every accepted request gets exactly one DONE, its final event
 * (engine.h; sched.c emits it last, and engine_destroy delivers it for what
 * it drops), after which the engine never calls back with that request's
 * user pointer.  So once the loop has seen `done` under the mutex it owns the
 * request alone and frees it after answering.  on_engine_event reads q->srv
 * before it locks and touches only the server after it unlocks, as the loop
 * may free q the moment a DONE is unlocked (the server outlives the engine:
 * node_server_destroy comes after engine_destroy).  A canceled or
 * disconnected request is still freed only there: the client leaving clears
 * q->conn and cancels; the engine then sends DONE (CANCELED), answered 499. */
#include "node/node_server.h"

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "http/http_conn.h"
#include "node/node_server_priv.h"
#include "oai/oai_req.h"
#include "oai/oai_resp.h"
#include "http/prom.h"

const char *node_role_name(enum node_role r)
{
    return r == NODE_ROLE_PREFILL ? "prefill" : r == NODE_ROLE_DECODE ? "decode" : "both";
}

/* ---- answers ----------------------------------------------------------- */

static const char *served_name(const node_server *s)
{
    return s->cfg.served_model_name ? s->cfg.served_model_name : s->be.model_name;
}

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

/* ---- simple routes ------------------------------------------------------ */

static void route_health(node_server *s, http_conn *c, const http_req *r, uint64_t t0)
{
    const char *st = s->draining ? "draining" : s->ready ? "ok" : "loading";
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_printf(&b, "{\"status\":\"%s\"}", st);
    respond_json(s, c, r->method, r->path, s->ready && !s->draining ? 200 : 503, NULL, &b, t0);
    dx_buf_free(&b);
}

static void route_models(node_server *s, http_conn *c, const http_req *r, uint64_t t0)
{
    if (!s->ready) {
        respond_error(s, c, r, 503, "the model is still loading", NULL, NULL, t0);
        return;
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_models_json(&b, served_name(s), s->started);
    respond_json(s, c, r->method, r->path, 200, NULL, &b, t0);
    dx_buf_free(&b);
}

static void write_engine_metrics(node_server *s, dx_buf *b)
{
    engine_stats st;
    memset(&st, 0, sizeof st);
    if (s->ready) s->be.stats(s->be.self, &st);
    prom_write_gauge(b, "duplex_requests_running", "Requests the engine is running", st.running);
    prom_write_gauge(b, "duplex_requests_waiting", "Requests queued in the engine", st.waiting);
    prom_write_counter(b, "duplex_prompt_tokens_computed_total",
                       "Prompt tokens the engine computed", (double)st.prompt_tokens_computed);
    prom_write_counter(b, "duplex_prompt_tokens_cached_total",
                       "Prompt tokens taken from the prefix cache",
                       (double)st.prompt_tokens_cached);
    prom_write_counter(b, "duplex_generation_tokens_total", "Tokens generated",
                       (double)st.gen_tokens);
    prom_write_counter(b, "duplex_preemptions_total", "Requests preempted", (double)st.preemptions);
    prom_write_gauge(b, "duplex_kv_blocks_total", "KV blocks in the pool", st.kv.n_blocks);
    prom_write_gauge(b, "duplex_kv_blocks_used", "KV blocks referenced by requests", st.kv.n_used);
    prom_write_gauge(b, "duplex_kv_blocks_cached", "KV blocks unreferenced, kept in the cache",
                     st.kv.n_cached);
    prom_write_gauge(b, "duplex_kv_blocks_free", "KV blocks free", st.kv.n_free);
    prom_write_counter(b, "duplex_kv_evictions_total", "Cached KV blocks evicted",
                       (double)st.kv.evictions);
    prom_write_counter(b, "duplex_kv_reclaims_total",
                       "Times the engine made room by revoking retained KV", (double)st.reclaims);
    prom_write_counter(b, "duplex_grammar_masks_total",
                       "Token masks computed for constrained (structured-output) decoding",
                       (double)st.gram_masks);
    prom_write_counter(b, "duplex_grammar_mask_seconds_total",
                       "Time spent computing token masks (overlapped with the forward pass)",
                       (double)st.gram_mask_ns * 1e-9);
    prom_write_counter(b, "duplex_grammar_mask_wait_seconds_total",
                       "Time the engine waited for token masks after the forward pass",
                       (double)st.gram_wait_ns * 1e-9);
    node_gram_stats gs;
    node_gram_get_stats(s->grams, &gs);
    prom_write_counter(b, "duplex_grammar_cache_hits_total",
                       "Structured-output grammars found compiled in the cache", (double)gs.hits);
    prom_write_counter(b, "duplex_grammar_cache_misses_total",
                       "Structured-output grammars compiled", (double)gs.misses);
    node_pd_write_metrics(s, b);
}

static void route_metrics(node_server *s, http_conn *c, const http_req *r, uint64_t t0)
{
    http_app_count(s->app, r->path, 200); /* this scrape counts itself */
    dx_buf b;
    dx_buf_init(&b, 0);
    http_app_write_metrics(s->app, "duplex_http_requests_total", &b);
    prom_write_hist(&b, "duplex_ttft_seconds", "Time from request to first token", &s->ttft);
    /* the difference to duplex_ttft_seconds is what HTTP, JSON and
     * tokenisation add */
    prom_write_hist(&b, "duplex_engine_ttft_seconds", "Engine-side time from submit to first token",
                    &s->engine_ttft);
    prom_write_hist(&b, "duplex_time_per_output_token_seconds",
                    "Time per output token after the first", &s->tpot);
    prom_write_hist(&b, "duplex_request_duration_seconds", "Completion request duration", &s->e2e);
    prom_write_counter(&b, "duplex_request_prompt_tokens_total",
                       "Prompt tokens of finished requests", (double)s->prompt_tokens);
    prom_write_counter(&b, "duplex_request_cached_tokens_total",
                       "Prompt tokens of finished requests served from the cache",
                       (double)s->cached_tokens);
    prom_write_counter(&b, "duplex_request_generation_tokens_total",
                       "Tokens generated for finished requests", (double)s->gen_tokens);
    http_srv_write_metrics(s->http, "duplex", &b);
    prom_write_gauge(&b, "duplex_node_ready", "1 once the model is loaded", s->ready);
    write_engine_metrics(s, &b);
    http_conn_respond(c, 200, "text/plain; version=0.0.4", NULL, b.data, b.len);
    http_app_log(s->app, r->method, r->path, 200, t0);
    dx_buf_free(&b);
}

/* ---- completions: submit ----------------------------------------------- */

static void req_free(node_req *q)
{
    node_pd_req_free(q->srv, q);
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
    dx_free(q);
}

static void req_link(node_req *q)
{
    node_server *s = q->srv;
    if (q->linked) return;
    q->linked = 1;
    q->prev = NULL;
    q->next = s->active;
    if (s->active) s->active->prev = q;
    s->active = q;
    s->n_active++;
}

static void req_unlink(node_req *q)
{
    node_server *s = q->srv;
    if (!q->linked) return;
    q->linked = 0;
    if (q->prev)
        q->prev->next = q->next;
    else
        s->active = q->next;
    if (q->next) q->next->prev = q->prev;
    s->n_active--;
}

static void done_store(node_done *d, const engine_event *ev)
{
    d->finish = ev->finish;
    d->error = ev->error;
    d->n_prompt = ev->n_prompt;
    d->n_cached = ev->n_cached;
    d->n_gen = ev->n_gen;
    d->n_preempted = ev->n_preempted;
    d->ttft_s = ev->ttft_s;
    d->has_msg = ev->error_msg != NULL;
    snprintf(d->msg, sizeof d->msg, "%s", ev->error_msg ? ev->error_msg : "");
}

/* Engine thread: hand the event to the request under the mutex and wake the
 * loop.  Nothing else, and no allocation beyond the pending buffer's
 * amortised growth (a KV event, once per request, copies what P/D keeps). */
static void on_engine_event(void *user, const engine_event *ev)
{
    node_req *q = user;
    node_server *s = q->srv; /* read now: q is the loop's once a DONE is unlocked */
    if (ev->type == ENGINE_EV_KV) {
        node_pd_on_kv(s, q, ev); /* q's P/D fields are the engine thread's until DONE */
        return;
    }
    pthread_mutex_lock(&s->mu);
    DX_ASSERT(!q->done); /* the engine delivers nothing after DONE */
    if (ev->type == ENGINE_EV_TOKENS) {
        q->pend_tokens += ev->n_tokens;
        int lp = ev->has_logprob && q->logprobs;
        if (ev->text_len || lp) { /* one event = one token's text: it keeps its own SSE chunk */
            node_cut cut = {(uint32_t)(q->pend.len + ev->text_len),
                            lp ? (int32_t)(q->pend_lp.len / sizeof(node_lp)) : -1};
            if (dx_buf_append(&q->pend, ev->text, ev->text_len) < 0 ||
                dx_buf_append(&q->pend_cuts, &cut, sizeof cut) < 0)
                q->pend_lost = 1;
            if (lp) {
                node_lp r = {.id = ev->tokens[0], .lp = ev->logprob, .n_top = ev->n_top};
                memcpy(r.top_ids, ev->top_ids, ev->n_top * sizeof *r.top_ids);
                memcpy(r.top_lps, ev->top_logprobs, ev->n_top * sizeof *r.top_lps);
                if (dx_buf_append(&q->pend_lp, &r, sizeof r) < 0) q->pend_lost = 1;
            }
        }
    } else {
        done_store(&q->fin, ev);
        q->done = 1;
    }
    if (!q->queued) {
        q->queued = 1;
        q->ready_next = NULL;
        if (s->ready_tail)
            s->ready_tail->ready_next = q;
        else
            s->ready_head = q;
        s->ready_tail = q;
    }
    pthread_mutex_unlock(&s->mu);
    uv_async_send(&s->wake);
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

static int prompt_error(const oai_req *o, const char *msg, oai_err *err)
{
    err->status = 400;
    snprintf(err->message, sizeof err->message, "%s", msg);
    snprintf(err->param, sizeof err->param, o->kind == OAI_CHAT ? "messages" : "prompt");
    return dx_errf(DX_EINVAL, "%s", msg);
}

/* Tokenises the request's prompt into q->prompt (token-faithfully for chat:
 * replies through the P/D params' sequence and the node's memory).  A 4xx
 * is reported through *err. */
static int encode_prompt(node_server *s, node_req *q, oai_err *err)
{
    const oai_req *o = &q->o;
    int rc;
    size_t failed = dx_alloc_failed_count();
    if (o->kind == OAI_COMPLETION && o->prompt_ids) {
        q->prompt = dx_memdup(o->prompt_ids, o->n_prompt_ids * sizeof *q->prompt);
        q->n_prompt = o->n_prompt_ids;
        rc = q->prompt ? 0 : dx_errf(DX_ENOMEM, "prompt of %zu tokens", o->n_prompt_ids);
    } else if (o->kind == OAI_COMPLETION) {
        rc = s->be.encode_text(s->be.self, o->prompt, o->prompt_len, &q->prompt, &q->n_prompt);
    } else {
        chat_msg *msgs = dx_malloc(o->n_msgs * sizeof *msgs);
        if (!msgs) return dx_errf(DX_ENOMEM, "chat: %zu messages", o->n_msgs);
        for (size_t i = 0; i < o->n_msgs; i++)
            msgs[i] = (chat_msg){o->msgs[i].role, o->msgs[i].content, o->msgs[i].content_len};
        /* what the template sees besides roles and texts; vLLM leaves the
         * tools out of the prompt when tool_choice is "none" */
        model_chat_extra x = {json_object_get(o->root, "messages"),
                              o->tool_choice == OAI_CHOICE_NONE ? NULL : o->tools,
                              o->template_kwargs};
        hist_src src;
        node_pd_hist_src(s, q, &src);
        rc = s->be.encode_chat(s->be.self, msgs, o->n_msgs, &x, hist_reply, &src, &q->prompt,
                               &q->n_prompt);
        node_pd_hist_done(s, q, &src);
        hist_src_free(&src);
        dx_free(msgs);
    }
    /* the tokenizer and the template report a failed allocation as they
     * can: one seen during the work makes it the server's fault, a 503 */
    if (rc < 0 && (rc == DX_ENOMEM || dx_alloc_failed_count() != failed)) {
        err->status = 503;
        snprintf(err->message, sizeof err->message, "out of memory; try again");
        err->param[0] = 0;
        rc = dx_errf(DX_ENOMEM, "out of memory preparing the prompt");
    }
    if (rc == DX_EINVAL) rc = prompt_error(o, dx_errmsg(), err);
    if (rc == 0 && q->n_prompt == 0) rc = prompt_error(o, "the prompt is empty", err);
    if (rc < 0) {
        dx_free(q->prompt);
        q->prompt = NULL;
        q->n_prompt = 0;
    }
    return rc;
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
    er->prefix_blocks = q->pd.blocks;
    er->n_prefix_blocks = q->pd.n_local + q->pd.n_pulled;
    er->want_kv = node_pd_want_kv(q);
    er->n_pregen = node_pd_pregen(q, er->pregen);
    _Static_assert(sizeof er->cache_salt == sizeof q->salt, "one namespace size");
    memcpy(er->cache_salt, q->salt, sizeof q->salt);
    er->grammar = q->gram ? node_gram_grammar(q->gram) : NULL;
    er->on_event = on_engine_event;
    er->user = q;
}

/* A request before it is parsed: its route, id and the answer's meta.
 * who: the caller's credentials (whether its kv_transfer_params count, its
 * namespace), kept for the preparation. */
static node_req *req_new(node_server *s, http_conn *c, enum oai_kind kind,
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
    q->path = kind == OAI_CHAT ? "/v1/chat/completions" : "/v1/completions";
    oai_make_id(q->id, sizeof q->id, kind == OAI_CHAT ? "chatcmpl" : "cmpl");
    q->meta = (oai_meta){kind, q->id, served_name(s), (int64_t)time(NULL)};
    dx_buf_init(&q->text, 0);
    dx_buf_init(&q->pend, 0);
    dx_buf_init(&q->pend_cuts, 0);
    dx_buf_init(&q->pend_lp, 0);
    dx_buf_init(&q->lp_all, 0);
    return q;
}

/* What the answer needs from the parsed request. */
static void req_take_parsed(node_req *q)
{
    q->stream = q->o.stream;
    q->include_usage = q->o.stream && q->o.include_usage;
    q->logprobs = q->o.logprobs;
    q->top_logprobs = q->o.top_logprobs;
}

static void start_stream(node_req *q)
{
    q->head_sent = 1;
    dx_buf b;
    dx_buf_init(&b, 0);
    char hdr[64 + NODE_WARN_MAX];
    snprintf(hdr, sizeof hdr, "Cache-Control: no-cache\r\n%s", q->warn_hdr ? q->warn_hdr : "");
    int rc = http_conn_stream_begin(q->conn, 200, "text/event-stream", hdr);
    if (rc == 0 && q->meta.kind == OAI_CHAT) {
        size_t failed = dx_alloc_failed_count();
        if (oai_sse_chunk(&b, &q->meta, &(oai_choice){.text = ""}, 1, q->include_usage, NULL) ||
            dx_alloc_failed_count() != failed) { /* out of memory: end with an error, not a gap */
            q->lost = 1;
            q->srv->be.cancel(q->srv->be.self, q->engine_id);
        } else {
            rc = http_conn_stream_write(q->conn, b.data, b.len);
        }
    }
    dx_buf_free(&b); /* a failed write has run on_client_gone already */
}

static void maybe_stopped(node_server *s);

/* node_server_fail_early with the error's OpenAI code (or NULL). */
/* The parsed request is about to be freed or answered: its bytes leave the
 * connection's buffer budget. */
static void req_uncharge(node_req *q)
{
    if (q->charged && q->conn) http_conn_uncharge(q->conn, q->charged);
    q->charged = 0;
}

static void fail_early_code(node_server *s, node_req *q, int status, const char *msg,
                            const char *param, const char *code)
{
    req_uncharge(q);
    if (q->conn) {
        http_conn_set_abort(q->conn, NULL, NULL);
        http_app_error(s->app, q->conn, "POST", q->path, status, msg, param, code, q->t_start_ns);
    } else {
        http_app_count(s->app, q->path, 499);
        http_app_log(s->app, "POST", q->path, 499, q->t_start_ns);
    }
    req_unlink(q);
    req_free(q);
    if (s->draining) maybe_stopped(s);
}

void node_server_fail_early(node_server *s, node_req *q, int status, const char *msg,
                            const char *param)
{
    fail_early_code(s, q, status, msg, param, NULL);
}

/* Chat answers go through the tool-call/reasoning parser when the request
 * has tools (and tool_choice is not "none") or reasoning is split off; the
 * prompt's end tells whether the answer starts inside <think>. */
static void prep_parse_opts(node_server *s, node_req *q)
{
    const oai_req *o = &q->o;
    if (o->kind != OAI_CHAT) return;
    q->topts = (oai_tools_opts){
        .tools = o->n_tools && o->tool_choice != OAI_CHOICE_NONE ? s->be.tool_fmt : OAI_TOOLS_NONE,
        .reasoning = s->be.reasoning};
    q->parse = q->topts.tools != OAI_TOOLS_NONE || q->topts.reasoning;
    if (!q->parse || !q->topts.reasoning || !s->be.tk) return;
    size_t n = q->n_prompt < 16 ? q->n_prompt : 16;
    dx_buf tail;
    dx_buf_init(&tail, 0);
    if (tok_decode(s->be.tk, q->prompt + q->n_prompt - n, n, &tail) == 0)
        q->topts.think_open = oai_tools_think_open(tail.data ? tail.data : "", tail.len);
    dx_buf_free(&tail);
}

/* The streaming parser (the options were set while preparing). */
static int setup_parse(node_server *s, node_req *q)
{
    (void)s;
    if (q->parse && q->stream && !(q->tp = oai_tools_create(&q->topts)))
        return dx_errf(DX_ENOMEM, "tool-call parser");
    return 0;
}

int node_server_submit(node_server *s, node_req *q)
{
    if (!q->conn) { /* the client left while the request was being prepared */
        node_server_fail_early(s, q, 499, "client gone", NULL);
        return 499;
    }
    if (s->draining) {
        node_server_fail_early(s, q, 503, "the server is shutting down", NULL);
        return 503;
    }
    if (setup_parse(s, q) < 0) {
        node_server_fail_early(s, q, 500, "out of memory", NULL);
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
        node_server_fail_early(s, q, st, msg, param);
        return st;
    }
    node_pd_submitted(q); /* the engine owns the handed blocks now */
    req_uncharge(q);
    oai_req_free(&q->o); /* everything the engine needs was copied */
    req_link(q);
    http_conn_set_abort(q->conn, on_client_gone, q);
    /* a stream's head goes out with its first text: until then a failure
     * can still be a plain HTTP error */
    return 0;
}

/* ---- preparation, off the loop -------------------------------------------- */

/* POST /tokenize takes a completion's "prompt" or a chat's "messages". */
static enum oai_kind tokenize_kind(const node_req *q)
{
    json_error_t je;
    json_t *root = json_loadb(q->prep.body, q->prep.len, JSON_ALLOW_NUL, &je);
    enum oai_kind kind = json_object_get(root, "messages") ? OAI_CHAT : OAI_COMPLETION;
    json_decref(root);
    return kind;
}

/* The warning header for keywords a non-strict schema ignored: one line,
 * printable ASCII only (the lines name the client's own property names),
 * bounded. */
static char *warn_header(const char *w)
{
    char v[NODE_WARN_MAX];
    size_t n = 0, len = strlen(w);
    for (size_t i = 0; i < len && n + 4 < sizeof v; i++) {
        unsigned char c = (unsigned char)w[i];
        if (c == '\n') {
            if (i + 1 < len) v[n++] = ';', v[n++] = ' ';
        } else {
            v[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
        }
    }
    v[n] = 0;
    dx_buf b;
    dx_buf_init(&b, 0);
    if (dx_buf_printf(&b, "X-Duplex-Warning: %s\r\n", v)) {
        dx_buf_free(&b);
        return NULL; /* a warning lost to memory pressure is not worth failing for */
    }
    return dx_buf_take(&b);
}

/* Pool thread: the request's structured-output constraint (response_format,
 * a forced tool call, grammar) compiled — or found in the cache — and the
 * vocabulary prepared for it, so nothing of it runs on the loop. */
static int prep_grammar(node_server *s, node_req *q, oai_err *err)
{
    int rc = node_gram_request(s->grams, &q->o, s->be.tool_fmt, q->topts.think_open, &q->gram, err);
    if (rc < 0 || !q->gram) return rc;
    if (s->be.gram_prepare && (rc = s->be.gram_prepare(s->be.self)) < 0) {
        err->status = 500;
        snprintf(err->message, sizeof err->message, "%s", dx_errmsg());
        return rc;
    }
    if (node_gram_warnings(q->gram)[0]) q->warn_hdr = warn_header(node_gram_warnings(q->gram));
    return 0;
}

/* Pool thread: parse, check, P/D params, the prompt's tokens.  Touches only
 * q (never q->conn) and what the server does not change while serving. */
static void prep_run(work_job *j)
{
    node_req *q = (node_req *)((char *)j - offsetof(node_req, prep.job));
    node_server *s = q->srv;
    oai_err *err = &q->prep_err;
    oai_parse_opts opts = {.n_vocab = s->be.n_vocab};
    if (q->tokenize) q->kind = tokenize_kind(q);
    q->prep_rc = oai_req_parse(q->kind, q->prep.body, q->prep.len, &opts, &q->o, err);
    if (q->prep_rc < 0) return;
    if (!q->tokenize && strcmp(q->o.model, served_name(s)) &&
        strcmp(q->o.model, s->be.model_name)) {
        err->status = 404;
        snprintf(err->message, sizeof err->message, "The model '%.160s' does not exist",
                 q->o.model);
        snprintf(err->param, sizeof err->param, "model");
        q->prep_code = "model_not_found";
        q->prep_rc = DX_ENOENT;
        return;
    }
    req_take_parsed(q);
    http_auth_cache_salt(s->cfg.auth, &q->who, q->o.cache_salt, q->o.cache_salt_len, q->salt);
    q->prep_rc = node_pd_parse(s, q, err);
    if (!q->prep_rc) q->prep_rc = encode_prompt(s, q, err);
    if (!q->prep_rc && !q->tokenize) prep_parse_opts(s, q);
    if (!q->prep_rc && !q->tokenize) q->prep_rc = prep_grammar(s, q, err);
    if (q->prep_rc < 0 && !err->status) { /* the message is this thread's: keep it */
        err->status = 500;
        snprintf(err->message, sizeof err->message, "%s", dx_errmsg());
    }
}

/* POST /tokenize (vLLM's) answers the prompt tokens a completion or chat
 * request with the same "prompt" or "messages" (tools, chat_template_kwargs)
 * would run on: it is prepared on the same path, token-faithful history
 * included.  (POST /detokenize, {"tokens": [...]} back to text, is cheap
 * and answered on the loop.) */
static void answer_tokens(node_server *s, node_req *q)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    int rc = dx_buf_printf(&b, "{\"count\":%zu,\"max_model_len\":%u,\"tokens\":[", q->n_prompt,
                           s->be.n_ctx);
    for (size_t i = 0; !rc && i < q->n_prompt; i++)
        rc = dx_buf_printf(&b, i ? ",%d" : "%d", q->prompt[i]);
    if (!rc) rc = dx_buf_puts(&b, "]}");
    http_conn_set_abort(q->conn, NULL, NULL);
    if (rc)
        fail_early_code(s, q, 500, "out of memory", NULL, NULL);
    else {
        respond_json(s, q->conn, "POST", q->path, 200, NULL, &b, q->t_start_ns);
        req_unlink(q);
        req_free(q);
        if (s->draining) maybe_stopped(s);
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
    node_pd_prepared(s, q);
    if (j->canceled) { /* the server is being destroyed */
        if (q->conn) http_conn_set_abort(q->conn, NULL, NULL);
        req_unlink(q);
        req_free(q);
        return;
    }
    if (!q->conn) { /* the client left while its request was being prepared */
        node_server_fail_early(s, q, 499, "client gone", NULL);
        return;
    }
    if (q->prep_rc < 0) {
        const oai_err *e = &q->prep_err;
        fail_early_code(s, q, e->status, e->message, e->param[0] ? e->param : NULL, q->prep_code);
        return;
    }
    if (q->tokenize) {
        answer_tokens(s, q);
        return;
    }
    /* the parsed request (several times its body for many small messages)
     * counts in the buffer budget until the engine has copied what it needs */
    q->charged = q->o.mem_bytes;
    if (http_conn_charge(q->conn, q->charged)) {
        fail_early_code(s, q, 503, HTTP_BUSY_BUFFERS, NULL, NULL);
        return;
    }
    q->keep_text = !q->stream || node_pd_wants_text(s, q);
    if (node_pd_plan(s, q) == 1) return; /* pulling on a worker thread; submitted when done */
    node_server_submit(s, q);
}

/* A completion or /tokenize request is prepared on the pool, holding the
 * connection (its body) until then; the loop goes on serving meanwhile. */
static void route_prepare(node_server *s, http_conn *c, const http_req *r, enum oai_kind kind,
                          int tokenize, const http_auth_result *who, uint64_t t0)
{
    if (!s->ready || (s->draining && !tokenize)) {
        respond_error(s, c, r, 503,
                      s->ready ? "the server is shutting down" : "the model is still loading", NULL,
                      NULL, t0);
        return;
    }
    node_req *q = req_new(s, c, kind, who, t0);
    if (!q) {
        respond_error(s, c, r, 500, "out of memory", NULL, NULL, t0);
        return;
    }
    if (tokenize) q->path = "/tokenize";
    q->tokenize = tokenize;
    q->preparing = 1;
    req_link(q); /* a shutdown waits for it */
    http_conn_set_abort(c, on_client_gone, q);
    http_app_prep_start(&q->prep, s->prep, c, r, prep_run, prep_done);
}

static void route_detokenize(node_server *s, http_conn *c, const http_req *r, uint64_t t0)
{
    if (!s->ready) {
        respond_error(s, c, r, 503, "the model is still loading", NULL, NULL, t0);
        return;
    }
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
    route_metrics(u, c, r, k->t0);
}

enum { PREP_CHAT, PREP_COMPLETION, PREP_TOKENIZE };

static void on_prepare(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    route_prepare(u, c, r, k->arg == PREP_CHAT ? OAI_CHAT : OAI_COMPLETION,
                  k->arg == PREP_TOKENIZE, k->who, k->t0);
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
    {"/health", HTTP_APP_GET, 1, on_health, 0, NULL},
    {"/metrics", HTTP_APP_GET, 1, on_metrics, 0, NULL},
    {"/v1/models", HTTP_APP_GET, 0, on_models, 0, NULL},
    {"/v1/chat/completions", HTTP_APP_POST, 0, on_prepare, PREP_CHAT, NULL},
    {"/v1/completions", HTTP_APP_POST, 0, on_prepare, PREP_COMPLETION, NULL},
    {"/tokenize", HTTP_APP_POST, 0, on_prepare, PREP_TOKENIZE, NULL},
    {"/detokenize", HTTP_APP_POST, 0, on_detokenize, 0, NULL},
    {"/admin/drain", HTTP_APP_POST, 0, on_drain, 0, NULL},
};

/* ---- completions: events ------------------------------------------------ */

static const char *finish_name(enum engine_finish f)
{
    return f == ENGINE_FINISH_LENGTH ? "length" : "stop";
}

/* The value of a choice's "logprobs" for records r[0..n) into out: each
 * token's and its alternatives' bytes from the tokenizer. */
static int lp_json(node_server *s, node_req *q, const node_lp *r, size_t n, dx_buf *out)
{
    dx_buf_reset(out);
    size_t per = ENGINE_MAX_TOP_LOGPROBS + 1, total = n * per;
    oai_lp_entry *e = dx_malloc((n ? n : 1) * sizeof *e);
    oai_lp_tok *t =
        dx_malloc((total ? total : 1) * sizeof *t); /* [i*per]: the token, then its top */
    size_t *off = dx_malloc((total ? total : 1) * sizeof *off);
    dx_buf bytes; /* every piece's bytes; offsets first, as the buffer may move */
    dx_buf_init(&bytes, 0);
    int rc = e && t && off ? 0 : dx_errf(DX_ENOMEM, "logprobs of %zu tokens", n);
    for (size_t i = 0; !rc && i < n; i++)
        for (uint32_t j = 0; !rc && j < per; j++) {
            char piece[256];
            int len = j > r[i].n_top ? 0
                                     : tok_token_bytes(s->be.tk, j ? r[i].top_ids[j - 1] : r[i].id,
                                                       piece, sizeof piece);
            off[i * per + j] = bytes.len;
            rc = dx_buf_append(&bytes, piece, len > 0 ? (size_t)len : 0);
        }
    for (size_t i = 0; !rc && i < n; i++) {
        for (uint32_t j = 0; j < per; j++) {
            size_t k = i * per + j, end = k + 1 < total ? off[k + 1] : bytes.len;
            t[k] = (oai_lp_tok){bytes.data + off[k], end - off[k],
                                j ? (j <= r[i].n_top ? r[i].top_lps[j - 1] : 0) : r[i].lp};
        }
        uint32_t n_top = q->top_logprobs < r[i].n_top ? q->top_logprobs : r[i].n_top;
        e[i] = (oai_lp_entry){t[i * per], &t[i * per + 1], n_top};
    }
    if (!rc) rc = oai_logprobs_json(out, q->meta.kind, e, n, &q->lp_offset);
    dx_free(e);
    dx_free(t);
    dx_free(off);
    dx_buf_free(&bytes);
    return rc;
}

/* A stream's chunks for the parser's events: one each, the logprobs (if
 * any) on the first, or on an empty content chunk when there is none. */
static int parsed_chunks(node_req *q, dx_buf *b, const oai_tools_ev *ev, size_t n_ev,
                         const char *logprobs, const char *finish)
{
    dx_buf raw;
    dx_buf_init(&raw, 0);
    int rc = 0;
    for (size_t i = 0; !rc && i < n_ev; i++) {
        dx_buf_reset(&raw);
        rc = oai_tools_ev_json(&raw, &ev[i]);
        oai_choice c = {.raw = raw.data ? raw.data : "", .logprobs = i ? NULL : logprobs};
        if (!rc) rc = oai_sse_chunk(b, &q->meta, &c, 0, q->include_usage, NULL);
    }
    if (!rc && ((!n_ev && logprobs) || finish)) {
        oai_choice c = {.text = "", .logprobs = n_ev ? NULL : logprobs, .finish = finish};
        rc = oai_sse_chunk(b, &q->meta, &c, 0, q->include_usage, finish ? q->extra : NULL);
    }
    dx_buf_free(&raw);
    return rc;
}

/* Text the loop took from q in one go (several events' worth): streamed as
 * one SSE chunk per event (a token's text, and its logprobs when asked), as
 * OpenAI and vLLM send them; cuts[0..n_cuts) are the pieces. */
static void handle_tokens(node_req *q, const char *text, size_t len, size_t n_tokens,
                          const node_cut *cuts, size_t n_cuts, const node_lp *lps, size_t n_lps)
{
    if (!q->t_first_ns && n_tokens) q->t_first_ns = dx_now_ns();
    if (!q->conn || (!len && !n_cuts) || q->lost) return;
    if (q->keep_text && dx_buf_append(&q->text, text, len) < 0) {
        if (!q->stream) { /* out of memory: the answer cannot be completed */
            q->lost = 1;
            q->srv->be.cancel(q->srv->be.self, q->engine_id);
            return;
        }
        q->keep_text = 0; /* a stream goes on; only the reply memory misses it */
        dx_buf_reset(&q->text);
    }
    if (!q->stream) {
        if (n_lps && dx_buf_append(&q->lp_all, lps, n_lps * sizeof *lps) < 0) {
            q->lost = 1;
            q->srv->be.cancel(q->srv->be.self, q->engine_id);
        }
        return;
    }
    if (!q->head_sent) {
        start_stream(q);
        if (!q->conn) return; /* the write failed: the client is gone */
    }
    node_server *s = q->srv;
    dx_buf *b = &s->scratch; /* reused: no allocation per token */
    dx_buf_reset(b);
    int rc = 0;
    size_t failed = dx_alloc_failed_count();
    for (size_t i = 0, from = 0; !rc && i < n_cuts; from = cuts[i++].end) {
        oai_choice c = {.text = text + from, .len = cuts[i].end - from};
        if (cuts[i].lp >= 0 && (size_t)cuts[i].lp < n_lps) {
            rc = lp_json(s, q, &lps[cuts[i].lp], 1, &s->scratch_lp);
            c.logprobs = s->scratch_lp.data;
        }
        if (!rc && q->tp) {
            const oai_tools_ev *ev;
            size_t n_ev;
            rc = oai_tools_feed(q->tp, c.text, c.len, &ev, &n_ev);
            if (!rc) rc = parsed_chunks(q, b, ev, n_ev, c.logprobs, NULL);
            continue;
        }
        if (!rc) rc = oai_sse_chunk(b, &q->meta, &c, 0, q->include_usage, NULL);
    }
    if (rc || dx_alloc_failed_count() != failed) {
        /* out of memory building these chunks: a stream that skipped them
         * would be a wrong answer, so it ends with an error instead */
        q->lost = 1;
        s->be.cancel(s->be.self, q->engine_id);
        return;
    }
    /* A failed write has already closed the connection and run on_client_gone. */
    http_conn_stream_write(q->conn, b->data, b->len);
}

/* Why the answer failed, or NULL when it finished normally.  A cancel that
 * reaches a client still connected came from the shutdown's grace timer (or
 * from lost text). */
static const char *failure_msg(const node_req *q)
{
    const node_done *d = &q->fin;
    if (q->lost) return "out of memory: the answer could not be kept";
    if (d->finish == ENGINE_FINISH_ERROR) return d->has_msg ? d->msg : "engine error";
    if (d->finish == ENGINE_FINISH_CANCELED) return "request canceled: the server is shutting down";
    return NULL;
}

static int finish_stream(node_req *q, const oai_usage *u)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    size_t failed = dx_alloc_failed_count();
    const char *fail = failure_msg(q);
    if (fail) {
        oai_sse_error(&b, fail, "server_error");
    } else if (q->tp) { /* what the parser held, then the finish */
        const oai_tools_ev *ev;
        size_t n_ev;
        if (oai_tools_finish(q->tp, &ev, &n_ev) == 0)
            parsed_chunks(q, &b, ev, n_ev, NULL,
                          oai_tools_finish_reason(q->tp, finish_name(q->fin.finish)));
    } else {
        oai_sse_chunk(&b, &q->meta, &(oai_choice){.text = "", .finish = finish_name(q->fin.finish)},
                      0, q->include_usage, q->extra);
    }
    if (q->include_usage) oai_sse_usage(&b, &q->meta, u);
    oai_sse_done(&b);
    if (dx_alloc_failed_count() != failed) { /* the end is incomplete: say so */
        static const char oom[] = "data: {\"error\":{\"message\":\"out of memory; the answer is "
                                  "incomplete\",\"type\":\"server_error\"}}\n\ndata: [DONE]\n\n";
        dx_buf_free(&b);
        if (http_conn_stream_write(q->conn, oom, sizeof oom - 1) == 0)
            http_conn_stream_end(q->conn);
        return 200;
    }
    if (http_conn_stream_write(q->conn, b.data, b.len) == 0) http_conn_stream_end(q->conn);
    dx_buf_free(&b);
    return 200; /* the status went out with the stream's head */
}

static int finish_full(node_req *q, const oai_usage *u)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    size_t failed = dx_alloc_failed_count();
    const char *fail = failure_msg(q);
    int busy = q->fin.finish == ENGINE_FINISH_ERROR && q->fin.error == DX_EBUSY;
    int server_fault = !busy && (q->lost || q->fin.finish == ENGINE_FINISH_ERROR);
    int status = !fail ? 200 : server_fault ? 500 : 503;
    if (fail)
        oai_error_json(&b, fail, oai_error_type(status), NULL, NULL);
    else {
        oai_choice c = {.text = q->text.data ? q->text.data : "",
                        .len = q->text.len,
                        .finish = finish_name(q->fin.finish)};
        dx_buf lp, msg;
        dx_buf_init(&lp, 0);
        dx_buf_init(&msg, 0);
        if (q->logprobs && lp_json(q->srv, q, (const node_lp *)q->lp_all.data,
                                   q->lp_all.len / sizeof(node_lp), &lp) == 0)
            c.logprobs = lp.data ? lp.data : "{\"content\":[]}";
        oai_tools_result r = {0};
        if (q->parse && oai_tools_parse(&q->topts, c.text, c.len, &r) == 0 &&
            oai_tools_message_json(&msg, &r) == 0) { /* content, reasoning, tool calls */
            c.raw = msg.data ? msg.data : "";
            if (r.n_calls) c.finish = "tool_calls";
        }
        oai_resp_full(&b, &q->meta, &c, u, q->extra);
        oai_tools_result_free(&r);
        dx_buf_free(&lp);
        dx_buf_free(&msg);
    }
    if (dx_alloc_failed_count() != failed) { /* a part of the answer may be missing */
        static const char oom[] = "{\"error\":{\"message\":\"out of memory; try again\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":null}}";
        dx_buf_free(&b);
        status = 503;
        http_conn_respond(q->conn, status, "application/json", HTTP_RETRY_AFTER, oom,
                          sizeof oom - 1);
        return status;
    }
    http_conn_respond(q->conn, status, "application/json",
                      status == 503   ? HTTP_RETRY_AFTER
                      : status == 200 ? q->warn_hdr
                                      : NULL,
                      b.data, b.len);
    dx_buf_free(&b);
    return status;
}

static void record_done(node_server *s, node_req *q, int status)
{
    const node_done *e = &q->fin;
    uint64_t now = dx_now_ns();
    double total = (double)(now - q->t_start_ns) * 1e-9;
    double ttft = q->t_first_ns ? (double)(q->t_first_ns - q->t_start_ns) * 1e-9 : -1;
    if (ttft >= 0) prom_hist_observe(&s->ttft, ttft);
    if (e->n_gen > 0) prom_hist_observe(&s->engine_ttft, e->ttft_s);
    if (q->t_first_ns && e->n_gen > 1)
        prom_hist_observe(&s->tpot, (double)(now - q->t_first_ns) * 1e-9 / (e->n_gen - 1));
    prom_hist_observe(&s->e2e, total);
    s->prompt_tokens += e->n_prompt;
    s->cached_tokens += e->n_cached;
    s->gen_tokens += e->n_gen;
    http_app_count(s->app, q->path, status);
    char ttft_s[32] = "-";
    if (ttft >= 0) snprintf(ttft_s, sizeof ttft_s, "%.1f", ttft * 1e3);
    /* where the prompt's KV came from: this node's cache, another node, computed */
    uint32_t pulled = node_pd_pulled_tokens(q), local = e->n_cached - pulled;
    char preempted[32] = "";
    if (e->n_preempted) snprintf(preempted, sizeof preempted, " preempted=%u", e->n_preempted);
    DX_LOGI("POST %s %d id=%s prompt=%u local=%u pulled=%u computed=%u gen=%u finish=%s "
            "ttft_ms=%s total_ms=%.1f%s%s",
            q->path, status, q->id, e->n_prompt, local, pulled, e->n_prompt - e->n_cached, e->n_gen,
            e->finish == ENGINE_FINISH_CANCELED ? "canceled"
            : e->finish == ENGINE_FINISH_ERROR  ? (e->error == DX_EBUSY ? "busy" : "error")
                                                : finish_name(e->finish),
            ttft_s, total * 1e3, preempted, node_pd_log_suffix(q));
}

/* q's DONE has been taken: the engine is finished with it, so it is freed. */
static void handle_done(node_server *s, node_req *q)
{
    node_pd_finish(s, q); /* the answer's kv_transfer_params, the reply memory */
    oai_usage u = {q->fin.n_prompt, q->fin.n_cached, q->fin.n_gen};
    int status = 499; /* the client closed the connection first (nginx's convention) */
    /* a stream whose head has not gone out (nothing was generated) can still
     * get a real status: 503 for a full queue, 500 for an engine error */
    if (q->conn && q->stream && !q->head_sent && failure_msg(q)) q->stream = 0;
    if (q->conn && q->stream && !q->head_sent) start_stream(q);
    if (q->conn) status = q->stream ? finish_stream(q, &u) : finish_full(q, &u);
    record_done(s, q, status);
    req_unlink(q);
    req_free(q);
    if (s->draining) maybe_stopped(s);
}

/* What the loop took from one request under the mutex. */
typedef struct {
    size_t n_tokens;
    int lost, done;
} node_take;

/* Detaches the ready list.  Its requests stay `queued`, so the engine keeps
 * appending to them without relinking them: the batch's links are the
 * loop's alone.  Events that arrive for a request after the loop has taken
 * it relink it into the (new) ready list and wake the loop again, so a busy
 * engine cannot keep one wake-up going forever. */
static node_req *ready_take(node_server *s)
{
    pthread_mutex_lock(&s->mu);
    node_req *q = s->ready_head;
    s->ready_head = s->ready_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return q;
}

/* Copies q's pending text into s->take and its figures into *t, under the
 * mutex; returns the next request of the batch (read before q can be
 * freed). */
static node_req *take_pending(node_server *s, node_req *q, node_take *t)
{
    dx_buf_reset(&s->take);
    pthread_mutex_lock(&s->mu);
    node_req *next = q->ready_next;
    q->ready_next = NULL;
    q->queued = 0;
    dx_buf_reset(&s->take_cuts);
    dx_buf_reset(&s->take_lp);
    if ((q->pend.len || q->pend_cuts.len) &&
        (dx_buf_append(&s->take, q->pend.data, q->pend.len) < 0 ||
         dx_buf_append(&s->take_cuts, q->pend_cuts.data, q->pend_cuts.len) < 0 ||
         dx_buf_append(&s->take_lp, q->pend_lp.data, q->pend_lp.len) < 0))
        q->pend_lost = 1;
    dx_buf_reset(&q->pend);
    dx_buf_reset(&q->pend_cuts);
    dx_buf_reset(&q->pend_lp);
    t->n_tokens = q->pend_tokens;
    q->pend_tokens = 0;
    t->lost = q->pend_lost;
    t->done = q->done;
    pthread_mutex_unlock(&s->mu);
    return next;
}

static void drain_events(node_server *s)
{
    node_req *q = ready_take(s), *next;
    for (; q; q = next) {
        node_take t;
        next = take_pending(s, q, &t);
        if (t.lost && !q->lost) { /* a gap in the text: the answer cannot be completed */
            q->lost = 1;
            if (!t.done) s->be.cancel(s->be.self, q->engine_id);
        }
        handle_tokens(q, s->take.data, s->take.len, t.n_tokens, (const node_cut *)s->take_cuts.data,
                      s->take_cuts.len / sizeof(node_cut), (const node_lp *)s->take_lp.data,
                      s->take_lp.len / sizeof(node_lp));
        if (t.done) handle_done(s, q);
    }
}

static void on_wake(uv_async_t *a)
{
    drain_events(a->data);
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
    for (node_req *q = s->active; q; q = q->next)
        if (!q->preparing && !q->pd.pulling) s->be.cancel(s->be.self, q->engine_id);
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
    if (s->cfg.shutdown_grace_s <= 0) s->cfg.shutdown_grace_s = 10;
    s->started = (int64_t)time(NULL);
    dx_buf_init(&s->scratch, 0);
    dx_buf_init(&s->take, 0);
    dx_buf_init(&s->take_cuts, 0);
    dx_buf_init(&s->take_lp, 0);
    dx_buf_init(&s->scratch_lp, 0);
    prom_hist_init_latency(&s->ttft);
    prom_hist_init_latency(&s->engine_ttft);
    prom_hist_init_latency(&s->tpot);
    prom_hist_init_latency(&s->e2e);
    node_pd_stats_init(&s->pd);
    hist_mem_config hc_mem = {.ttl_s = cfg->history_ttl_s};
    http_app_config ac = {
        .routes = k_routes, .n_routes = DX_ARRAY_LEN(k_routes), .auth = cfg->auth, .user = s};
    if (http_app_create(&ac, &s->app) < 0 || hist_mem_create(&hc_mem, &s->mem) < 0) {
        http_app_destroy(s->app);
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
    work_pool_destroy(s->prep); /* preparations in flight end here (their done frees them) */
    drain_events(s);            /* final events the backend delivered while stopping */
    while (s->active) {         /* only if the backend never finished them */
        node_req *q = s->active;
        if (q->conn) http_conn_set_abort(q->conn, NULL, NULL);
        req_unlink(q);
        req_free(q);
    }
    node_gram_cache_destroy(s->grams); /* after the requests, which held its grammars */
    http_srv_destroy(s->http);
    http_app_destroy(s->app);
    node_pd_stats_free(&s->pd);
    hist_mem_destroy(s->mem);
    dx_buf_free(&s->scratch);
    dx_buf_free(&s->take);
    dx_buf_free(&s->take_cuts);
    dx_buf_free(&s->take_lp);
    dx_buf_free(&s->scratch_lp);
    uv_close((uv_handle_t *)&s->wake, on_handle_closed);
}
