/* node_events: engine events, from the engine's thread to the loop
 * (node_server_priv.h).
 *
 * Engine events reach the loop without an allocation per token: the engine
 * thread appends a TOKENS event's text to the request's own pending buffer
 * (which keeps its memory) and stores the DONE figures inline, all under the
 * server's mutex, links the request into the ready list unless it is there
 * already, and wakes the loop.  The loop takes the ready list and, for each
 * request, copies the pending text out under the mutex into its own reused
 * buffer; the SSE chunks are built and written outside the mutex
 * (node_answer.c).  Each event's text keeps its own chunk (one token per
 * chunk, as OpenAI and vLLM send them; the engine holds back only an
 * incomplete UTF-8 sequence or a possible stop-string prefix), so several
 * tokens that arrive between two wake-ups are several events in one socket
 * write.
 *
 * Lifetime: every accepted request gets exactly one DONE, its final event
 * (engine.h; sched.c emits it last, and engine_destroy delivers it for what
 * it drops), after which the engine never calls back with that request's
 * user pointer.  So once the loop has seen `done` under the mutex it owns the
 * request alone, and the server's `done` answers and frees it.
 * node_events_on_engine reads q->srv before it locks and touches only the
 * server after it unlocks, as the loop may free q the moment a DONE is
 * unlocked (the server outlives the engine: node_server_destroy comes after
 * engine_destroy). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "node/node_server_priv.h"

static void done_store(node_done *d, const engine_event *ev)
{
    d->finish = ev->finish;
    d->error = ev->error;
    d->n_prompt = ev->n_prompt;
    d->n_cached = ev->n_cached;
    d->n_gen = ev->n_gen;
    d->n_preempted = ev->n_preempted;
    d->stop_index = ev->stop_index;
    d->ttft_s = ev->ttft_s;
    d->has_msg = ev->error_msg != NULL;
    snprintf(d->msg, sizeof d->msg, "%s", ev->error_msg ? ev->error_msg : "");
}

/* Engine thread: hand the event to the request under the mutex and wake the
 * loop.  Nothing else, and no allocation beyond the pending buffer's
 * amortised growth (a KV event, once per request, copies what P/D keeps). */
void node_events_on_engine(void *user, const engine_event *ev)
{
    node_req *q = user;
    node_server *s = q->srv; /* read now: q is the loop's once a DONE is unlocked */
    if (ev->type == ENGINE_EV_KV) {
        node_pd_view v;
        node_hooks_view(q, &v);
        node_pd_on_kv(&s->pd, &q->pd, &v,
                      ev); /* q's P/D fields are the engine thread's until DONE */
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

void node_events_drain(node_server *s, void (*done)(node_server *s, node_req *q))
{
    node_req *q = ready_take(s), *next;
    for (; q; q = next) {
        node_take t;
        next = take_pending(s, q, &t);
        if (t.lost && !q->lost) { /* a gap in the text: the answer cannot be completed */
            q->lost = 1;
            if (!t.done) s->be.cancel(s->be.self, q->engine_id);
        }
        node_answer_tokens(q, s->take.data, s->take.len, t.n_tokens,
                           (const node_cut *)s->take_cuts.data, s->take_cuts.len / sizeof(node_cut),
                           (const node_lp *)s->take_lp.data, s->take_lp.len / sizeof(node_lp));
        if (t.done) done(s, q); /* q may be freed */
    }
}
