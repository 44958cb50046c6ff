/* router_req: a completion's (or a pass-through's) life in the router — made,
 * linked on r->active, ended once, freed in one place — its answers to the
 * client (whole, or a stream begun with its first event), and its one
 * upstream request with the node load it holds (router_flow_priv.h has the
 * lifetime rules).  The steps that decide what is sent live above this
 * file; this one only keeps the request's bookkeeping right, so that every
 * path ends a request the same way. */
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "oai/oai_resp.h"
#include "router/router_flow_priv.h"

/* ---- life ----------------------------------------------------------------------- */

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
    oai_front_destroy(q->fr);
    dx_free(q->client_model);
    dx_free(q->warn_hdr);
    dx_buf_free(&q->tail);
    oai_rsp_req_free(&q->rsp);
    json_decref(q->chat_doc);
    dx_free(q);
}

static void on_client_gone(void *user);

rt_req *rt_req_new(router *r, http_conn *c, const http_req *hr, uint64_t t0)
{
    rt_req *q = dx_calloc(1, sizeof *q);
    if (!q) return NULL;
    q->r = r;
    q->conn = c;
    /* the route's own string (the request's goes with its connection) */
    static const char *const routes[] = {"/v1/chat/completions", "/v1/completions",
                                         "/v1/messages/count_tokens", "/v1/messages",
                                         "/v1/responses"};
    q->path = "/v1/models";
    for (size_t i = 0; i < DX_ARRAY_LEN(routes); i++)
        if (!strcmp(hr->path, routes[i])) q->path = routes[i];
    if (!strncmp(hr->path, "/v1/responses/", 14)) q->path = "/v1/responses/";
    q->up_path = q->path;
    q->method = !strcmp(hr->method, "POST") ? "POST" : "GET";
    q->t0 = t0;
    q->entry.node = q->decode = q->prefill = q->up_node = -1;
    q->affinity = ROUTER_PICK_UNKEYED;
    q->via = "local";
    dx_buf_init(&q->body, 0);
    dx_buf_init(&q->pbody, 0);
    dx_buf_init(&q->dbody, 0);
    dx_buf_init(&q->pbase, 0);
    dx_buf_init(&q->acc, RT_ANSWER_MAX);
    dx_buf_init(&q->reply, RT_REPLY_MAX);
    dx_buf_init(&q->tail, 0);
    router_sse_init(&q->sse, RT_EVENT_MAX);
    dx_list_push_front(&r->active, &q->link);
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
    dx_list_remove(&q->link);
    r->n_active--;
    req_free(q);
}

void rt_req_end(rt_req *q)
{
    router *r = q->r;
    DX_ASSERT(!q->up && q->up_node < 0);
    if (q->conn) { /* every path answers first; this is a bug guard, not a path */
        http_conn_set_abort(q->conn, NULL, NULL);
        q->conn = NULL;
    }
    if (q->client_left || !q->status_out) q->status_out = 499; /* nginx's "client closed" */
    rt_metrics_request(r, q->path, q->status_out);
    if (q->phase != PH_PASS) log_end(q);
    req_unlink_free(q);
    r->on_req_gone(r);
}

void rt_req_forget(rt_req *q)
{
    router *r = q->r;
    req_unlink_free(q);
    r->on_req_gone(r);
}

/* ---- the upstream request ---------------------------------------------------------- */

int rt_req_up_send(rt_req *q, int node, const char *body, size_t len, long timeout_ms,
                   const router_up_cb *cb)
{
    router *r = q->r;
    router_pick_node *n = &r->live[node];
    char url[RT_URL_MAX + 32];
    snprintf(url, sizeof url, "%s%s", r->nodes[node].url, q->up_path);
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

/* Gives the node's load counters back (once). */
static void release_node(rt_req *q)
{
    if (q->up_node < 0) return;
    router_pick_node *n = &q->r->live[q->up_node];
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

int rt_req_up_finished(rt_req *q)
{
    q->up = NULL;
    release_node(q);
    q->busy = 1;
    if (q->conn) return 0;
    rt_req_end(q);
    return 1;
}

int rt_req_acc_on_data(void *user, const char *p, size_t n)
{
    rt_req *q = user;
    return !q->conn || dx_buf_append(&q->acc, p, n) < 0;
}

static void on_client_gone(void *user)
{
    rt_req *q = user;
    q->conn = NULL;
    q->client_left = 1;
    if (q->busy) return; /* the callback stops the transfer and ends q */
    up_stop(q);
    rt_req_end(q);
}

/* ---- answers to the client ------------------------------------------------------ */

void rt_req_refuse(router *r, http_conn *c, const char *method, const char *path, int status,
                   const char *msg, const char *param, uint64_t t0)
{
    http_conn_set_abort(c, NULL, NULL);
    http_app_error(r->app, c, method, path, status, msg, param, NULL, t0);
}

void rt_req_reply_full(rt_req *q, int status, const char *body, size_t len)
{
    q->status_out = status;
    if (!q->conn) return;
    http_conn *c = q->conn;
    q->conn = NULL;
    http_conn_set_abort(c, NULL, NULL);
    dx_buf b;
    dx_buf_init(&b, 0);
    if (q->fr && oai_front_full(q->fr, status, body ? body : "", len, &b) == 0) {
        body = b.data; /* the door's shape */
        len = b.len;
        if (q->defer_end && status == 200 && oai_front_completed(q->fr)) {
            /* kept until the response is stored */
            q->conn = c;
            http_conn_set_abort(c, NULL, NULL);
            q->end_held = q->tail_whole = 1;
            q->tail.len = 0;
            if (dx_buf_append(&q->tail, body, len) == 0) {
                dx_buf_free(&b);
                http_conn_set_abort(c, on_client_gone, q);
                return;
            }
            q->end_held = q->tail_whole = 0; /* out of memory: no waiting, then */
            q->conn = NULL;
        }
    } else if (q->fr) { /* out of memory: an error, in the route's shape */
        b.len = 0;
        http_app_error_body(q->r->app, q->path, &b, status = 503, "out of memory; try again", NULL,
                            NULL);
        body = b.data;
        len = b.len;
    }
    /* a 503 (a node's full queue passed on, no healthy node) invites a retry,
     * as the nodes' own 503s do; a 200 carries the node's warning */
    http_conn_respond(c, status, "application/json",
                      status == 503   ? HTTP_RETRY_AFTER
                      : status == 200 ? q->warn_hdr
                                      : NULL,
                      body ? body : "", len);
    dx_buf_free(&b);
}

void rt_req_reply_error(rt_req *q, int status, const char *msg, const char *param)
{
    rt_req_reply_error_code(q, status, msg, param, NULL);
}

void rt_req_reply_error_code(rt_req *q, int status, const char *msg, const char *param,
                             const char *code)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    if (q->fr) /* a chat error, which the door writes in its shape */
        oai_error_json(&b, msg, oai_error_type(status), param, code);
    else /* not prepared yet: the route's own shape */
        http_app_error_body(q->r->app, q->path, &b, status, msg, param, code);
    rt_req_reply_full(q, status, b.data, b.len);
    dx_buf_free(&b);
}

static int client_gone(void)
{
    return dx_errf(DX_ECLOSED, "router: the client closed its connection");
}

/* The client's stream begins with the first event, not with the upstream
 * head, so a decode failure before any event can still be retried.
 * Non-zero (DX_ECLOSED, or the write's code): the client is gone. */
static int stream_begin(rt_req *q)
{
    if (!q->conn) return client_gone();
    if (q->stream_begun) return 0;
    q->stream_begun = 1;
    q->status_out = 200;
    char hdr[64 + 1100];
    snprintf(hdr, sizeof hdr, "Cache-Control: no-cache\r\n%s", q->warn_hdr ? q->warn_hdr : "");
    int rc = http_conn_stream_begin(q->conn, 200, "text/event-stream", hdr);
    if (rc < 0) return rc;
    return q->conn ? 0 : client_gone();
}

int rt_req_stream_write(rt_req *q, const char *p, size_t n)
{
    int rc = stream_begin(q);
    if (rc) return rc;
    q->sent_any = 1;
    if (q->fr) {                      /* the chat events in the door's shape */
        dx_buf *b = &q->r->front_out; /* reused: the loop's */
        b->len = 0;
        if (oai_front_sse(q->fr, p, n, b) < 0) {
            b->len = 0;
            oai_front_sse_fail(q->fr, 502, "the node's answer could not be read", b);
        }
        p = b->data;
        n = b->len;
        if (q->defer_end && oai_front_completed(q->fr)) { /* the end waits for the store */
            q->end_held = 1;
            return dx_buf_append(&q->tail, p, n);
        }
        if (!n) return 0;
    }
    if ((rc = http_conn_stream_write(q->conn, p, n)) < 0) return rc;
    return q->conn ? 0 : client_gone();
}

void rt_req_release_end(rt_req *q)
{
    if (!q->end_held) return;
    q->end_held = 0;
    if (!q->conn) return;
    http_conn *c = q->conn;
    if (q->tail_whole) {
        q->conn = NULL;
        http_conn_set_abort(c, NULL, NULL);
        http_conn_respond(c, 200, "application/json", q->warn_hdr, q->tail.data, q->tail.len);
        return;
    }
    if (http_conn_stream_write(c, q->tail.data, q->tail.len) < 0 || !q->conn) return;
    q->conn = NULL;
    http_conn_set_abort(c, NULL, NULL);
    http_conn_stream_end(c);
}

void rt_req_stream_finish(rt_req *q, const char *msg)
{
    if (!msg && q->end_held) return; /* after the store: rt_req_release_end */
    if (msg && q->conn) {
        dx_buf b;
        dx_buf_init(&b, 0);
        oai_sse_error(&b, msg, "server_error");
        oai_sse_done(&b);
        rt_req_stream_write(q, b.data, b.len);
        dx_buf_free(&b);
    }
    if (stream_begin(q) != 0) return;
    http_conn *c = q->conn;
    q->conn = NULL;
    http_conn_set_abort(c, NULL, NULL);
    http_conn_stream_end(c);
}

/* ---- the end of everything ---------------------------------------------------------- */

void rt_req_abort_all(router *r)
{
    DX_LIST_FOR_EACH_SAFE(it, tmp, &r->active)
    {
        rt_req *q = DX_LIST_ENTRY(it, rt_req, link);
        q->busy = 1;
        up_stop(q);
        router_store_cancel(q->lookup_op); /* its answer will not come: q ends here */
        q->lookup_op = NULL;
        if (q->stream_begun)
            rt_req_stream_finish(q, "the router is shutting down");
        else
            rt_req_reply_error(q, 503, "the router is shutting down", NULL);
        if (!q->in_work) rt_req_end(q); /* else prep_done ends it */
    }
}
