/* node_metrics: the node's GET /metrics (Prometheus text), and what a
 * finished request adds to it (node_server_priv.h).
 *
 * Two kinds of figures: the loop's own histograms and counters, which only
 * node_metrics_done changes (once per request, at its end, with the
 * request's log line: the same figures for people), and the parts' (the
 * engine's stats, the grammar cache's, P/D's), read only when a scrape
 * comes, so that serving pays nothing for them. */
#include <stdio.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "http/prom.h"
#include "node/node_server_priv.h"

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
    node_pd_write_metrics(&s->pd, b);
}

/* GET /metrics. */
void node_metrics_respond(node_server *s, http_conn *c, const http_req *r, uint64_t t0)
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

void node_metrics_done(node_server *s, node_req *q, int status)
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
    uint32_t pulled = node_pd_pulled_tokens(&s->pd, &q->pd), local = e->n_cached - pulled;
    char preempted[32] = "";
    if (e->n_preempted) snprintf(preempted, sizeof preempted, " preempted=%u", e->n_preempted);
    DX_LOGI("POST %s %d id=%s prompt=%u local=%u pulled=%u computed=%u gen=%u finish=%s "
            "ttft_ms=%s total_ms=%.1f%s%s",
            q->path, status, q->id, e->n_prompt, local, pulled, e->n_prompt - e->n_cached, e->n_gen,
            e->finish == ENGINE_FINISH_CANCELED ? "canceled"
            : e->finish == ENGINE_FINISH_ERROR  ? (e->error == DX_EBUSY ? "busy" : "error")
                                                : node_answer_finish_name(e->finish),
            ttft_s, total * 1e3, preempted, node_pd_log_suffix(&q->pd));
}
