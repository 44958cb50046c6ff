/* router_decode: the decode leg (docs/router.md steps 7-9) — the client's
 * body with the decode params spliced in, sent to the decode node; its
 * answer proxied event by event (router_sse: params removed, usage made the
 * cluster's) or, non-streamed, parsed whole; the entry stored when the turn
 * ends normally.  A failure before any byte reached the client is retried
 * once on another decode node with the same params; after the first byte
 * the stream ends with an OpenAI-style error event. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "router/router_flow_priv.h"

static const router_up_cb k_decode_cb;

int rt_decode_start(rt_req *q)
{
    router *r = q->r;
    router_pick_cluster c = rt_nodes_cluster(r);
    q->decode = router_pick_decode_again(&c, q->decode); /* it may have gone down meanwhile */
    q->phase = PH_DECODE;
    q->decode_tries++;
    q->relay_events = q->stream_begun = 0;
    json_decref(q->new_params);
    q->new_params = NULL;
    router_sse_reset(&q->sse);
    dx_buf_reset(&q->acc);
    dx_buf_reset(&q->reply);
    q->reply_lost = 0;
    if (!q->dparams)
        return rt_req_up_send(q, q->decode, q->body.data, q->body.len, 0, &k_decode_cb);
    int rc = rt_entry_splice(&q->body, q->dparams, &q->dbody);
    if (rc) return dx_errf(rc, "out of memory");
    return rt_req_up_send(q, q->decode, q->dbody.data, q->dbody.len, 0, &k_decode_cb);
}

static void dec_on_head(void *user, long status)
{
    rt_req *q = user;
    q->relay_events = status == 200 && q->stream;
}

/* The node's X-Duplex-Warning (keywords a non-strict schema ignored) goes
 * on to the client with the answer. */
static void dec_on_header(void *user, const char *line, size_t len)
{
    rt_req *q = user;
    static const char name[] = "X-Duplex-Warning:";
    if (len <= sizeof name - 1 || strncasecmp(line, name, sizeof name - 1)) return;
    dx_free(q->warn_hdr);
    q->warn_hdr = NULL;
    dx_buf b;
    dx_buf_init(&b, 0);
    /* one line, printable, bounded: it came from the network */
    size_t n = len < 1024 ? len : 1024;
    int rc = dx_buf_puts(&b, "X-Duplex-Warning:");
    for (size_t i = sizeof name - 1; !rc && i < n; i++)
        rc = dx_buf_putc(&b, (unsigned char)line[i] >= 0x20 && line[i] != 0x7f ? line[i] : '?');
    if (!rc) rc = dx_buf_puts(&b, "\r\n");
    if (!rc) q->warn_hdr = dx_buf_take(&b);
    dx_buf_free(&b);
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
    if (rt_req_stream_write(q, ev, len) != 0) return 1;
    if (!q->t_first && info.text_added) {
        q->t_first = dx_now_ns();
        rt_metrics_observe(&r->ttft, q->t0);
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
    rt_metrics_observe(&q->r->added_stream, t);
    return rc != 0 || !q->conn;
}

/* Another decode node for a request nothing of which reached the client. */
static int retry_decode(rt_req *q, const char *why)
{
    router *r = q->r;
    router_pick_cluster c = rt_nodes_cluster(r);
    int d = router_pick_retry(&c, 0, q->decode, q->decode_tries);
    DX_LOGW("router: decode node %s: %s%s", r->nodes[q->decode].url, why,
            d >= 0 ? "; retrying on another" : "");
    if (d < 0) return 0;
    rt_metrics_fallback(r, "decode_retry");
    q->decode = d;
    if (q->dparams == q->entry_params && !rt_entry_usable(q))
        q->dparams = rt_entry_history_params(q); /* they name the failed node: nothing to pull */
    return rt_decode_start(q) == 0;
}

/* The decode node's stream ended (rc 0) or broke. */
static void dec_finish_stream(rt_req *q, int rc)
{
    if (rc == 0) {
        if (router_sse_pending(&q->sse)) { /* a last event without its blank line */
            size_t n = q->sse.pend.len;
            on_event(q, q->sse.pend.data, n);
        }
        rt_req_stream_finish(q, NULL);
        rt_entry_store(q);
        rt_entry_store_response(q);
        return;
    }
    char msg[300];
    snprintf(msg, sizeof msg, "the decode node failed mid-answer: %s", dx_errmsg());
    rt_req_stream_finish(q, msg);
}

/* A whole answer (non-streamed, or an error) from the decode node. */
static void dec_finish_full(rt_req *q, long status)
{
    router *r = q->r;
    if (status != 200) {
        rt_req_reply_full(q, (int)status, q->acc.data, q->acc.len);
        return;
    }
    router_sse_info info = {.text = q->key_kind == KEY_CHAT ? &q->reply : NULL,
                            .has_cap = has_cap(q),
                            .cached_cap = q->p_cached};
    int rc = router_sse_answer(q->acc.data ? q->acc.data : "", q->acc.len, q->kind == OAI_CHAT,
                               &r->out, &info);
    if (rc < 0) {
        rt_req_reply_error(q, 500, "out of memory", NULL);
        return;
    }
    q->reply_lost |= info.text_lost;
    if (info.params) q->new_params = info.params;
    const dx_buf *b = rc == 1 ? &r->out : &q->acc;
    rt_req_reply_full(q, 200, b->data, b->len);
    q->t_first = dx_now_ns();
    rt_metrics_observe(&r->ttft, q->t0);
    rt_entry_store(q);
    rt_entry_store_response(q);
}

static void dec_on_done(void *user, int rc, long status)
{
    rt_req *q = user;
    router *r = q->r;
    uint64_t t = dx_now_ns();
    if (rt_req_up_finished(q)) return;
    if (status == 0 && rc == DX_ETRANSPORT) rt_nodes_failed(r, q->decode, dx_errmsg());
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
        rt_req_reply_error(q, rc == DX_ETIMEDOUT ? 504 : 502, dx_errmsg(), NULL);
    else if (q->relay_events) /* a stream that ended before its first event */
        dec_finish_stream(q, rc);
    else
        dec_finish_full(q, status);
    rt_metrics_observe(&r->added_stream, t);
    if (q->storing) return; /* the store's job ends q once its answer's end is out */
    rt_req_end(q);
}

static const router_up_cb k_decode_cb = {.on_head = dec_on_head,
                                         .on_header = dec_on_header,
                                         .on_data = dec_on_data,
                                         .on_done = dec_on_done};
