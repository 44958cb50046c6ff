/* node_answer: a completion's answer, on the loop (node_server_priv.h).
 *
 * A stream's head goes out with its first text (start_stream), so a request
 * that fails before it has any still gets a real HTTP status; then each
 * engine event's text is one SSE chunk, as OpenAI and vLLM send them, built
 * in the server's reused scratch buffer, so a plain stream's text reaches
 * its chunk without an allocation (logprobs and the tool-call parser build
 * theirs in buffers of their own).  A non-streamed answer keeps the text
 * (and the logprobs) and is written whole at the DONE.  Tool calls and
 * reasoning are parsed out of the text when the request asks (the options
 * decided while preparing): piece by piece through a streaming parser, or
 * over the whole text at the end.
 *
 * Out of memory never leaves a gap: text that could not be kept, or chunks
 * that could not be built, cancel the request (q->lost), and its answer
 * ends with an error instead.  The bottom of the server's files: it calls
 * none of them. */
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "http/http_conn.h"
#include "node/node_server_priv.h"
#include "oai/oai_resp.h"
#include "oai/oai_tools.h"

const char *node_answer_finish_name(enum engine_finish f)
{
    return f == ENGINE_FINISH_LENGTH ? "length" : "stop";
}

/* Chat answers go through the tool-call/reasoning parser when the request
 * has tools (and tool_choice is not "none") or reasoning is split off; the
 * prompt's end tells whether the answer starts inside <think>. */
void node_answer_parse_opts(const node_server *s, node_req *q)
{
    const oai_req *o = &q->o;
    if (o->kind != OAI_CHAT) return;
    q->topts = (oai_tools_opts){
        .tools = o->n_tools && o->tool_choice != OAI_CHOICE_NONE ? s->be.tool_fmt : OAI_TOOLS_NONE,
        .reasoning = s->be.reasoning,
        .max_calls = o->parallel_tool_calls ? 0 : 1};
    q->parse = q->topts.tools != OAI_TOOLS_NONE || q->topts.reasoning;
    if (!q->parse || !q->topts.reasoning || !s->be.tk) return;
    size_t n = q->n_prompt < 16 ? q->n_prompt : 16;
    dx_buf tail;
    dx_buf_init(&tail, 0);
    if (tok_decode(s->be.tk, q->prompt + q->n_prompt - n, n, &tail) == 0)
        q->topts.think_open = oai_tools_think_open(tail.data ? tail.data : "", tail.len);
    dx_buf_free(&tail);
}

int node_answer_setup(node_req *q)
{
    if (q->parse && q->stream && !(q->tp = oai_tools_create(&q->topts)))
        return dx_errf(DX_ENOMEM, "tool-call parser");
    if (q->front == OAI_FRONT_CHAT) return 0;
    oai_front_config c = {.api = q->front, .model = q->client_model, .prompt_hint = q->n_prompt};
    if (q->front == OAI_FRONT_RESPONSES)
        c.rsp = (oai_rsp_meta){.id = q->rsp_id, .created_at = q->meta.created, .echo = q->rsp.echo};
    if (!(q->fr = oai_front_create(&c))) return dx_errf(DX_ENOMEM, "the answer's front door");
    return 0;
}

/* ---- the client's end: chat bytes as they are, or through the door ------------- */

/* A stream's bytes (whole chat SSE events) to the client.  A front door's
 * answer is written again in its shape first (oai_front.h).  0, or the
 * write's failure (the connection is then closing: on_client_gone ran). */
static int out_write(node_req *q, const char *p, size_t n)
{
    if (!q->fr) return http_conn_stream_write(q->conn, p, n);
    dx_buf *b = &q->srv->scratch_front; /* reused: no allocation per token once grown */
    dx_buf_reset(b);
    if (oai_front_sse(q->fr, p, n, b) < 0) {
        b->len = 0; /* cannot be: our own chat bytes; the stream ends short, and says so */
        oai_front_sse_fail(q->fr, 500, "the answer could not be written", b);
    }
    return b->len ? http_conn_stream_write(q->conn, b->data, b->len) : 0;
}

/* A whole answer (or an error) to the client, in the door's shape. */
static void out_full(node_req *q, int status, const char *hdr, const char *body, size_t len)
{
    if (!q->fr) {
        http_conn_respond(q->conn, status, "application/json", hdr, body, len);
        return;
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    if (oai_front_full(q->fr, status, body, len, &b) < 0) { /* out of memory */
        static const char oom[] = "{\"error\":{\"message\":\"out of memory; try again\"}}";
        http_conn_respond(q->conn, 503, "application/json", HTTP_RETRY_AFTER, oom, sizeof oom - 1);
    } else {
        http_conn_respond(q->conn, status, "application/json", hdr, b.data, b.len);
    }
    dx_buf_free(&b);
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
            rc = out_write(q, b.data, b.len);
        }
    }
    dx_buf_free(&b); /* a failed write has run on_client_gone already */
}

/* The stop string that ended the answer, or NULL (vLLM's stop_reason). */
static const char *stop_reason(const node_req *q)
{
    int k = q->fin.finish == ENGINE_FINISH_STOP ? q->fin.stop_index : -1;
    if (k < 0 || (uint32_t)k >= q->n_stops) return NULL;
    const char *p = q->stops.data;
    for (int i = 0; i < k; i++) p += strlen(p) + 1;
    return p;
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
        oai_choice c = {.text = "",
                        .logprobs = n_ev ? NULL : logprobs,
                        .finish = finish,
                        .stop_reason = finish ? stop_reason(q) : NULL};
        rc = oai_sse_chunk(b, &q->meta, &c, 0, q->include_usage, finish ? q->extra : NULL);
    }
    dx_buf_free(&raw);
    return rc;
}

/* Text the loop took from q in one go (several events' worth): streamed as
 * one SSE chunk per event (a token's text, and its logprobs when asked), as
 * OpenAI and vLLM send them; cuts[0..n_cuts) are the pieces. */
void node_answer_tokens(node_req *q, const char *text, size_t len, size_t n_tokens,
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
    out_write(q, b->data, b->len);
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
                          oai_tools_finish_reason(q->tp, node_answer_finish_name(q->fin.finish)));
    } else {
        oai_sse_chunk(&b, &q->meta,
                      &(oai_choice){.text = "",
                                    .finish = node_answer_finish_name(q->fin.finish),
                                    .stop_reason = stop_reason(q)},
                      0, q->include_usage, q->extra);
    }
    if (q->include_usage) oai_sse_usage(&b, &q->meta, u);
    oai_sse_done(&b);
    if (dx_alloc_failed_count() != failed) { /* the end is incomplete: say so */
        static const char oom[] = "data: {\"error\":{\"message\":\"out of memory; the answer is "
                                  "incomplete\",\"type\":\"server_error\"}}\n\ndata: [DONE]\n\n";
        dx_buf_free(&b);
        if (out_write(q, oom, sizeof oom - 1) == 0) http_conn_stream_end(q->conn);
        return 200;
    }
    if (out_write(q, b.data, b.len) == 0) http_conn_stream_end(q->conn);
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
                        .finish = node_answer_finish_name(q->fin.finish),
                        .stop_reason = stop_reason(q)};
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
        out_full(q, status, HTTP_RETRY_AFTER, oom, sizeof oom - 1);
        return status;
    }
    out_full(q, status,
             status == 503   ? HTTP_RETRY_AFTER
             : status == 200 ? q->warn_hdr
                             : NULL,
             b.data, b.len);
    dx_buf_free(&b);
    return status;
}

int node_answer_done(node_req *q)
{
    oai_usage u = {q->fin.n_prompt, q->fin.n_cached, q->fin.n_gen};
    int status = 499; /* the client closed the connection first (nginx's convention) */
    /* a stream whose head has not gone out (nothing was generated) can still
     * get a real status: 503 for a full queue, 500 for an engine error */
    if (q->conn && q->stream && !q->head_sent && failure_msg(q)) q->stream = 0;
    if (q->conn && q->stream && !q->head_sent) start_stream(q);
    if (q->conn) status = q->stream ? finish_stream(q, &u) : finish_full(q, &u);
    return status;
}
