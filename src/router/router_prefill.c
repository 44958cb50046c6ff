/* router_prefill: the prefill leg (docs/router.md step 6) — the prefill
 * node's body (one token, no stream, params asking it to hold the KV and
 * maybe to pull the history), its answer's params kept as text, then the
 * decode leg with them.  A failure (refused, reset, 5xx, timeout, or a 200
 * without params) is retried once on another prefill node, then the
 * request falls back to local prefill on the decode node; a 4xx is the
 * client's and goes back as it is. */
#include <stdio.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "router/router_flow_priv.h"

static const router_up_cb k_prefill_cb;

/* The base made off the loop, and the params spliced in. */
static int build_body(rt_req *q)
{
    json_t *kv = rt_entry_prefill_params(q);
    dx_buf p;
    dx_buf_init(&p, 0);
    int rc = kv ? router_json_append(&p, kv) : DX_ENOMEM;
    if (!rc) rc = rt_entry_splice(&q->pbase, p.data, &q->pbody);
    json_decref(kv);
    dx_buf_free(&p);
    return rc;
}

static int start(rt_req *q)
{
    q->phase = PH_PREFILL;
    q->prefill_tries++;
    dx_buf_reset(&q->acc);
    return rt_req_up_send(q, q->prefill, q->pbody.data, q->pbody.len,
                          (long)(q->r->cfg.prefill_timeout_s * 1e3), &k_prefill_cb);
}

int rt_prefill_start(rt_req *q)
{
    int rc = build_body(q);
    return rc ? rc : start(q);
}

/* The prefill node's answer carries params: keep them as text. */
static int take_params(rt_req *q)
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
static const char *problem(rt_req *q, int rc, long status, char *why, size_t cap)
{
    if (rc < 0) {
        snprintf(why, cap, "%s", dx_errmsg());
        if (status == 0 && rc == DX_ETRANSPORT) rt_nodes_failed(q->r, q->prefill, why);
        return why;
    }
    if (status < 200 || status >= 300) {
        snprintf(why, cap, "answered %ld", status);
        return why;
    }
    if (!take_params(q)) {
        rt_metrics_fallback(q->r, "prefill_no_params");
        return "answered without kv_transfer_params";
    }
    return NULL;
}

/* Starts the decode request, or answers why it cannot start (and returns
 * rt_decode_start's code). */
static int go_decode(rt_req *q)
{
    int rc = rt_decode_start(q);
    if (rc == 0) return 0;
    rt_req_reply_error(q, 500, dx_errmsg(), NULL);
    return rc;
}

static void pre_on_done(void *user, int rc, long status)
{
    rt_req *q = user;
    router *r = q->r;
    uint64_t t = dx_now_ns();
    if (rt_req_up_finished(q)) return;
    if (rc == 0 && status >= 400 && status < 500) { /* the client's mistake: its answer */
        rt_req_reply_full(q, (int)status, q->acc.data, q->acc.len);
        rt_req_end(q);
        return;
    }
    char buf[256];
    const char *why = problem(q, rc, status, buf, sizeof buf);
    if (why) {
        router_pick_cluster c = rt_nodes_cluster(r);
        int p2 = router_pick_retry(&c, 1, q->prefill, q->prefill_tries);
        /* a node without the P/D side answers without params every time:
         * counted, not shouted */
        dx_log(rc == 0 && status == 200 ? DX_LOG_DEBUG : DX_LOG_WARN,
               "router: prefill node %s: %s; %s", r->nodes[q->prefill].url, why,
               p2 >= 0 ? "retrying on another" : "prefilling on the decode node");
        if (p2 >= 0) {
            rt_metrics_fallback(r, "prefill_retry");
            q->prefill = p2;
            if (start(q) == 0) {
                q->busy = 0;
                return;
            }
        }
        rt_metrics_fallback(r, "prefill_failed");
        q->dparams = rt_entry_local_params(q);
    } else {
        q->dparams = q->pparams;
    }
    if (go_decode(q) < 0) {
        rt_req_end(q);
        return;
    }
    q->busy = 0;
    rt_metrics_observe(&r->added_between, t);
}

static const router_up_cb k_prefill_cb = {.on_data = rt_req_acc_on_data, .on_done = pre_on_done};
