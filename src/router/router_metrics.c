/* router_metrics: the router's own series — answers by route and status
 * (counted by the http_app skeleton), affinity, routes taken, fallbacks,
 * the TTFT and the router's added time — and the GET /metrics text, which
 * also carries the store's, the nodes' and the HTTP server's series
 * (docs/router.md, "Metrics").  Counting is a few additions on the loop:
 * the families and histograms are made once at create. */
#include <stdio.h>

#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "router/router_priv.h"

void rt_metrics_init(router *r)
{
    /* the router's own share is microseconds: finer buckets than latency's */
    static const double fine[] = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                                  0.0025,  0.005,    0.01,    0.025,  0.05,    0.1,    0.25};
    prom_family_init(&r->routed);
    prom_family_init(&r->fallbacks);
    prom_hist_init_latency(&r->ttft);
    prom_hist_init(&r->added_before, fine, DX_ARRAY_LEN(fine));
    prom_hist_init(&r->added_between, fine, DX_ARRAY_LEN(fine));
    prom_hist_init(&r->added_stream, fine, DX_ARRAY_LEN(fine));
}

void rt_metrics_free(router *r)
{
    prom_family_free(&r->routed);
    prom_family_free(&r->fallbacks);
}

void rt_metrics_request(router *r, const char *path, int status)
{
    http_app_count(r->app, path, status);
}

void rt_metrics_fallback(router *r, const char *reason)
{
    char labels[96];
    snprintf(labels, sizeof labels, "reason=\"%s\"", reason);
    prom_family_add(&r->fallbacks, labels, 1);
}

void rt_metrics_observe(prom_hist *h, uint64_t since_ns)
{
    prom_hist_observe(h, (double)(dx_now_ns() - since_ns) * 1e-9);
}

static void write_added(router *r, dx_buf *b)
{
    const char *name = "duplex_router_added_seconds";
    prom_write_header(b, name, "histogram",
                      "Time spent in the router itself: before the upstream request is sent, "
                      "between the prefill answer and the decode request, and from upstream "
                      "bytes to their write to the client");
    prom_write_hist_series(b, name, "stage=\"before_upstream\"", &r->added_before);
    prom_write_hist_series(b, name, "stage=\"prefill_to_decode\"", &r->added_between);
    prom_write_hist_series(b, name, "stage=\"upstream_to_client\"", &r->added_stream);
}

void rt_metrics_render(router *r, dx_buf *b)
{
    http_app_write_metrics(r->app, "duplex_router_http_requests_total", b);
    router_store_metrics(r->store, b);
    prom_write_counter(b, "duplex_router_affinity_hits_total",
                       "Keyed requests sent to the decode node that holds the conversation",
                       (double)r->affinity_hits);
    prom_write_counter(b, "duplex_router_affinity_misses_total",
                       "Keyed requests with no usable entry, or whose node could not take them",
                       (double)r->affinity_misses);
    prom_write_family(
        b, "duplex_router_routed_total",
        "Completions by path: local prefill on the decode node, or via a prefill node", &r->routed);
    prom_write_family(b, "duplex_router_fallbacks_total", "Fallbacks and retries by reason",
                      &r->fallbacks);
    rt_nodes_write_metrics(r, b);
    prom_write_hist(b, "duplex_router_ttft_seconds",
                    "Request arrival to the first content byte written to the client", &r->ttft);
    write_added(r, b);
    http_srv_write_metrics(r->http, "duplex_router", b);
}
