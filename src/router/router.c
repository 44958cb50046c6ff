/* router: configuration, nodes and their health, metrics, the simple routes
 * and the lifecycle (see router.h; the completion flow is router_flow.c). */
#include "router/router_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/dx_addr.h"
#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_keys.h"
#include "base/dx_log.h"
#include "oai/oai_resp.h"
#include "router/router_state.h"

double rt_now_s(void)
{
    return dx_now_s();
}

const char *router_mode_name(enum router_mode m)
{
    return m == ROUTER_UNIDIRECTIONAL ? "unidirectional" : "bidirectional";
}

int router_parse_mode(const char *s, enum router_mode *out)
{
    if (!strcmp(s, "bidirectional"))
        *out = ROUTER_BIDIRECTIONAL;
    else if (!strcmp(s, "unidirectional"))
        *out = ROUTER_UNIDIRECTIONAL;
    else
        return dx_errf(DX_EINVAL, "'%s' is not a mode (bidirectional|unidirectional)", s);
    return 0;
}

int router_parse_url(const char *url, char *out, size_t cap)
{
    return dx_addr_http_url(url, out, cap < RT_URL_MAX ? cap : RT_URL_MAX);
}

/* ---- metrics -------------------------------------------------------------- */

void rt_count_request(router *r, const char *path, int status)
{
    http_app_count(r->app, path, status);
}

void rt_count_fallback(router *r, const char *reason)
{
    char labels[96];
    snprintf(labels, sizeof labels, "reason=\"%s\"", reason);
    prom_family_add(&r->fallbacks, labels, 1);
}

enum node_series { NS_HEALTHY, NS_DRAINING, NS_OUTSTANDING, NS_PROMPT_TOKENS };

static double node_value(const rt_node *n, enum node_series w)
{
    switch (w) {
    case NS_HEALTHY:
        return n->healthy;
    case NS_DRAINING:
        return n->draining || n->reg_draining;
    case NS_OUTSTANDING:
        return n->outstanding;
    default:
        return (double)n->outstanding_tokens;
    }
}

/* Per node (a vanished discovered node is left out; prompt tokens: prefill
 * nodes only). */
static void write_node_gauges(router *r, dx_buf *b)
{
    static const struct {
        const char *name, *help;
    } k[] = {
        {"duplex_router_node_healthy", "1 while the node passes checks"},
        {"duplex_router_node_draining",
         "1 while the node drains (no new requests; its KV is still pulled)"},
        {"duplex_router_node_outstanding_requests",
         "Requests the router has in flight at the node"},
        {"duplex_router_node_outstanding_prompt_tokens",
         "Prompt tokens the router has in flight at the node (prefill nodes)"},
    };
    for (int w = NS_HEALTHY; w <= NS_PROMPT_TOKENS; w++) {
        prom_write_header(b, k[w].name, "gauge", k[w].help);
        for (size_t i = 0; i < r->n_nodes; i++)
            if (!r->nodes[i].gone && (w != NS_PROMPT_TOKENS || r->nodes[i].prefill))
                prom_write_value(b, k[w].name, r->nodes[i].labels,
                                 node_value(&r->nodes[i], (enum node_series)w));
    }
}

static void write_discovery(router *r, dx_buf *b)
{
    if (!r->disc) return;
    size_t live = 0;
    for (size_t i = 0; i < r->n_nodes; i++) live += r->nodes[i].discovered && !r->nodes[i].gone;
    prom_write_gauge(b, "duplex_router_discovered_nodes",
                     "Nodes taken from registration keys (--discover) and still registered",
                     (double)live);
    prom_write_gauge(b, "duplex_router_discovery_skipped_nodes",
                     "Registered nodes skipped in the last scan: their model fingerprint differs",
                     (double)r->n_skipped);
    prom_write_gauge(b, "duplex_router_discovery_bad_registrations",
                     "Registration values that did not parse in the last scan (skipped)",
                     (double)router_disc_bad(r->disc));
    prom_write_counter(b, "duplex_router_discovery_errors_total",
                       "Scans of the registration keys that failed (Redis unreachable)",
                       (double)router_disc_errors(r->disc));
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

static void render_metrics(router *r, dx_buf *b)
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
    write_node_gauges(r, b);
    write_discovery(r, b);
    prom_write_hist(b, "duplex_router_ttft_seconds",
                    "Request arrival to the first content byte written to the client", &r->ttft);
    write_added(r, b);
    http_srv_write_metrics(r->http, "duplex_router", b);
}

/* ---- simple routes ---------------------------------------------------------- */

void rt_respond_error(router *r, http_conn *c, const char *method, const char *path, int status,
                      const char *msg, const char *param, uint64_t t0)
{
    http_conn_set_abort(c, NULL, NULL);
    http_app_error(r->app, c, method, path, status, msg, param, NULL, t0);
}

/* Healthy when a decode node takes requests, and a prefill node too if
 * any are known. */
static int cluster_healthy(const router *r)
{
    int p = r->n_prefill == 0, d = 0;
    for (size_t i = 0; i < r->n_nodes; i++) {
        if (!rt_node_takes_new(&r->nodes[i])) continue;
        if (r->nodes[i].prefill)
            p = 1;
        else
            d = 1;
    }
    return p && d;
}

static void route_health(router *r, http_conn *c, const http_req *hr, uint64_t t0)
{
    int ok = cluster_healthy(r) && !r->draining;
    const char *st = r->draining ? "draining" : ok ? "ok" : "no healthy node";
    char body[64];
    int n = snprintf(body, sizeof body, "{\"status\":\"%s\"}", st);
    http_app_respond(r->app, c, hr->method, hr->path, ok ? 200 : 503, "application/json", NULL,
                     body, (size_t)n, t0);
}

static void route_metrics(router *r, http_conn *c, const http_req *hr, uint64_t t0)
{
    rt_count_request(r, hr->path, 200); /* this scrape counts itself */
    dx_buf b;
    dx_buf_init(&b, 0);
    render_metrics(r, &b);
    http_conn_respond(c, 200, "text/plain; version=0.0.4", NULL, b.data, b.len);
    dx_buf_free(&b);
    http_app_log(r->app, hr->method, hr->path, 200, t0);
}

/* The routes, as the skeleton (http_app.h) calls them: /health and
 * /metrics stay open; every other route wants a key when keys are set
 * (unknown routes too: they say nothing to strangers). */
static void on_health(void *u, http_conn *c, const http_req *hr, const http_app_call *k)
{
    route_health(u, c, hr, k->t0);
}

static void on_metrics(void *u, http_conn *c, const http_req *hr, const http_app_call *k)
{
    route_metrics(u, c, hr, k->t0);
}

static void on_api(void *u, http_conn *c, const http_req *hr, const http_app_call *k)
{
    router *r = u;
    if (r->draining)
        rt_respond_error(r, c, hr->method, hr->path, 503, "the router is shutting down", NULL,
                         k->t0);
    else if (k->arg < 0)
        rt_route_passthrough(r, c, hr, k->t0);
    else
        rt_route_completion(r, c, hr, (enum oai_kind)k->arg, k->who, k->t0);
}

static const http_app_route k_routes[] = {
    {"/health", HTTP_APP_GET, 1, on_health, 0, NULL},
    {"/metrics", HTTP_APP_GET, 1, on_metrics, 0, NULL},
    {"/v1/models", HTTP_APP_GET, 0, on_api, -1, NULL},
    {"/v1/chat/completions", HTTP_APP_POST, 0, on_api, OAI_CHAT, NULL},
    {"/v1/completions", HTTP_APP_POST, 0, on_api, OAI_COMPLETION, NULL},
};

/* ---- health ------------------------------------------------------------------- */

static void set_health(router *r, int i, int healthy, const char *why)
{
    rt_node *n = &r->nodes[i];
    if (n->healthy == healthy) return;
    n->healthy = healthy;
    if (healthy)
        DX_LOGI("router: %s node %s is healthy", n->prefill ? "prefill" : "decode", n->url);
    else
        DX_LOGW("router: %s node %s is unhealthy: %s", n->prefill ? "prefill" : "decode", n->url,
                why);
}

void rt_node_failed(router *r, int node, const char *why)
{
    r->nodes[node].draining = 0; /* unreachable: not even its KV port is there */
    set_health(r, node, 0, why);
}

int rt_node_is_decode(const router *r, int node)
{
    return node >= 0 && node < (int)r->n_nodes && !r->nodes[node].prefill;
}

int rt_node_takes_new(const rt_node *n)
{
    return n->healthy && !n->draining && !n->reg_draining && !n->gone;
}

int rt_node_holds(const rt_node *n)
{
    return !n->gone && (n->healthy || n->draining || n->reg_draining);
}

int rt_may_prefill(const router *r)
{
    return r->cfg.n_prefill > 0 || r->cfg.discover != NULL;
}

/* A draining node answers 503 {"status":"draining"}: unhealthy for new
 * requests, yet still the holder of its conversations' KV. */
static void on_check_done(void *user, int rc, long status)
{
    rt_node *n = user;
    n->check = NULL;
    char why[160];
    if (rc < 0)
        snprintf(why, sizeof why, "%s", dx_errmsg());
    else
        snprintf(why, sizeof why, "GET /health answered %ld", status);
    n->hbody[n->hlen] = 0;
    int draining = rc == 0 && status == 503 && strstr(n->hbody, "\"draining\"") != NULL;
    if (draining && !n->draining)
        DX_LOGI("router: %s node %s is draining: no new requests, its KV still used",
                n->prefill ? "prefill" : "decode", n->url);
    n->draining = draining;
    set_health(n->r, n->index, rc == 0 && status == 200, why);
}

static int on_check_data(void *user, const char *p, size_t len)
{
    rt_node *n = user;
    size_t room = sizeof n->hbody - 1 - n->hlen;
    if (len > room) len = room;
    memcpy(n->hbody + n->hlen, p, len);
    n->hlen += len;
    return 0;
}

static void start_check(router *r, int i)
{
    rt_node *n = &r->nodes[i];
    char url[RT_URL_MAX + 16];
    snprintf(url, sizeof url, "%s/health", n->url);
    long timeout = (long)(r->cfg.health_interval_ms * 2);
    if (timeout < 1000) timeout = 1000;
    if (timeout > 10000) timeout = 10000;
    router_up_request rq = {
        .method = "GET", .url = url, .timeout_ms = timeout, .connect_timeout_ms = timeout};
    n->hlen = 0;
    static const router_up_cb cb = {.on_data = on_check_data, .on_done = on_check_done};
    if (router_up_start(r->up, &rq, &cb, n, &n->check) < 0) n->check = NULL;
}

static void on_health_tick(uv_timer_t *t)
{
    router *r = t->data;
    for (size_t i = 0; i < r->n_nodes; i++)
        if (!r->nodes[i].check && !r->nodes[i].gone) start_check(r, (int)i);
    router_store_tick(r->store);
}

/* ---- lifecycle ------------------------------------------------------------------ */

static int find_node(const router *r, const char *url)
{
    for (size_t j = 0; j < r->n_nodes; j++)
        if (!strcmp(r->nodes[j].url, url)) return (int)j;
    return -1;
}

static void set_role(rt_node *nd, int prefill)
{
    nd->prefill = prefill;
    snprintf(nd->labels, sizeof nd->labels, "node=\"%s\",role=\"%s\"", nd->url,
             prefill ? "prefill" : "decode");
}

/* The next slot, for a normalised URL. */
static rt_node *push_node(router *r, const char *url, int prefill)
{
    DX_ASSERT(r->n_nodes < r->cap_nodes);
    rt_node *nd = &r->nodes[r->n_nodes];
    snprintf(nd->url, sizeof nd->url, "%s", url);
    nd->r = r;
    nd->index = (int)r->n_nodes++;
    set_role(nd, prefill);
    r->n_prefill += prefill;
    return nd;
}

static int add_nodes(router *r, const char *const *urls, size_t n, int prefill, const char *flag)
{
    for (size_t i = 0; i < n; i++) {
        char url[RT_URL_MAX];
        int rc = router_parse_url(urls[i], url, sizeof url);
        if (rc) return dx_err_wrap(rc, "%s", flag);
        int j = find_node(r, url);
        if (j >= 0)
            return dx_errf(DX_EINVAL, "%s: node %s is given twice%s", flag, url,
                           r->nodes[j].prefill != prefill ? " (as prefill and as decode)" : "");
        push_node(r, url, prefill);
    }
    return 0;
}

/* ---- discovery (router_disc.h) ------------------------------------------------------ */

/* The node's registration is in this scan: a new node gets a slot (healthy
 * once its first check passes), a vanished one comes back in its own. */
static void take_registration(router *r, const node_reg_info *v)
{
    int prefill = !strcmp(v->role, "prefill"); /* "both" prefills its own requests: decode */
    int i = find_node(r, v->url);
    rt_node *nd;
    if (i < 0) {
        if (r->n_nodes == r->cap_nodes) {
            if (!r->disc_dropped++)
                DX_LOGW("router: discovery: no slot for %s: %d discovered nodes at most", v->url,
                        RT_DISCOVER_MAX);
            return;
        }
        nd = push_node(r, v->url, prefill);
        nd->discovered = 1;
        DX_LOGI("router: discovered %s node %s (kv %s)", v->role, v->url, v->kv[0] ? v->kv : "-");
    } else {
        nd = &r->nodes[i];
        if (nd->discovered && nd->gone) {
            nd->gone = 0;
            r->n_prefill += nd->prefill;
            DX_LOGI("router: %s node %s is registered again", v->role, v->url);
        }
        if (nd->discovered && nd->prefill != prefill && !nd->outstanding) {
            r->n_prefill = r->n_prefill - (size_t)nd->prefill + (size_t)prefill;
            set_role(nd, prefill);
        }
    }
    nd->seen = 1;
    if (v->draining && !nd->reg_draining)
        DX_LOGI("router: node %s is draining (its registration says so)", nd->url);
    nd->reg_draining = v->draining;
    if (!nd->healthy && !nd->check) start_check(r, nd->index);
}

static void drop_vanished(router *r)
{
    for (size_t i = 0; i < r->n_nodes; i++) {
        rt_node *nd = &r->nodes[i];
        if (!nd->seen) nd->reg_draining = 0; /* a static node's key went: its /health rules */
        if (nd->seen || !nd->discovered || nd->gone) continue;
        DX_LOGW("router: %s node %s vanished from the registrations: its conversations "
                "recompute elsewhere",
                nd->prefill ? "prefill" : "decode", nd->url);
        nd->gone = 1;
        nd->healthy = nd->draining = nd->reg_draining = 0;
        router_up_cancel(nd->check);
        nd->check = NULL;
        r->n_prefill -= (size_t)nd->prefill;
    }
}

static void on_scan(void *user, const node_reg_info *v, size_t n, int ok)
{
    router *r = user;
    if (!ok) return; /* Redis unreadable: keep what is known; health checks still run */
    size_t skipped = 0;
    for (size_t i = 0; i < r->n_nodes; i++) r->nodes[i].seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (!r->model[0]) {
            memcpy(r->model, v[i].model, sizeof r->model);
            DX_LOGI("router: model fingerprint %s (the first registered node's, %s)", r->model,
                    v[i].url);
        }
        if (strcmp(v[i].model, r->model))
            skipped++;
        else
            take_registration(r, &v[i]);
    }
    if (skipped != r->n_skipped && skipped)
        DX_LOGW("router: discovery: skipping %zu registered nodes whose model fingerprint "
                "is not %s",
                skipped, r->model);
    r->n_skipped = skipped;
    drop_vanished(r);
}

static int setup_discovery(router *r)
{
    const char *prefix = r->cfg.state_prefix ? r->cfg.state_prefix : "duplex:";
    rds_url u;
    int rc = rds_url_parse(r->cfg.discover, &u);
    if (rc) return dx_err_wrap(rc, "--discover");
    if ((rc = node_reg_check_prefix(prefix, "--state-prefix"))) return rc;
    router_disc_config dc = {.redis = &u,
                             .prefix = prefix,
                             .interval_ms = r->cfg.health_interval_ms,
                             .on_scan = on_scan,
                             .user = r};
    return router_disc_create(r->loop, &dc, &r->disc);
}

static void fill_defaults(router_config *c)
{
    if (!c->host) c->host = "127.0.0.1";
    if (c->conversation_ttl_s <= 0) c->conversation_ttl_s = ROUTER_DEFAULT_CONVERSATION_TTL_S;
    if (!c->max_conversations) c->max_conversations = ROUTER_STATE_DEFAULT_MAX_ENTRIES;
    if (!c->max_state_bytes) c->max_state_bytes = (size_t)ROUTER_STATE_DEFAULT_MAX_MB << 20;
    if (!c->decode_max_outstanding)
        c->decode_max_outstanding = ROUTER_DEFAULT_DECODE_MAX_OUTSTANDING;
    if (!c->health_interval_ms) c->health_interval_ms = ROUTER_DEFAULT_HEALTH_INTERVAL_MS;
    if (c->prefill_timeout_s <= 0) c->prefill_timeout_s = ROUTER_DEFAULT_PREFILL_TIMEOUT_S;
    if (c->shutdown_grace_s <= 0) c->shutdown_grace_s = ROUTER_DEFAULT_SHUTDOWN_GRACE_S;
    if (c->state_timeout_ms <= 0) c->state_timeout_ms = ROUTER_DEFAULT_STATE_TIMEOUT_MS;
    /* a shared store: the seed comes from the routers' common secret (setup_auth) */
    while (!c->key_seed && !c->state_url)
        if (getrandom(&c->key_seed, sizeof c->key_seed, 0) != sizeof c->key_seed) c->key_seed = 1;
}

static int setup_nodes(router *r)
{
    const router_config *c = &r->cfg;
    if (c->n_decode == 0 && !c->discover)
        return dx_errf(DX_EINVAL, "--decode: at least one decode node is needed (or --discover)");
    r->cap_nodes = c->n_prefill + c->n_decode + (c->discover ? RT_DISCOVER_MAX : 0);
    r->nodes = dx_calloc(r->cap_nodes, sizeof *r->nodes);
    if (!r->nodes) return dx_errf(DX_ENOMEM, "out of memory");
    int rc = add_nodes(r, c->prefill, c->n_prefill, 1, "--prefill");
    if (rc == 0) rc = add_nodes(r, c->decode, c->n_decode, 0, "--decode");
    return rc;
}

/* The keys, the bind rule and the tenants' secret: derived from the
 * internal key when there is one, so every router of a cluster names a
 * tenant alike; else random, for this process only. */
static int setup_auth(router *r)
{
    int rc = http_auth_create(&r->cfg.auth, &r->auth);
    if (!rc) rc = http_auth_bind_check(r->auth, r->cfg.host, r->cfg.insecure_no_auth);
    if (rc) return rc;
    const char *ik = http_auth_internal_key(r->auth);
    static const char tag[] = "duplex router namespaces v1";
    if (ik)
        dx_keys_hash(tag, sizeof tag, ik, strlen(ik), NULL, 0, r->ns_secret, sizeof r->ns_secret);
    else if (r->cfg.state_url)
        rc = router_store_secret(r->cfg.state_url, r->cfg.state_prefix, 2000, r->ns_secret,
                                 sizeof r->ns_secret);
    else if (getrandom(r->ns_secret, sizeof r->ns_secret, 0) != sizeof r->ns_secret)
        return dx_errf(DX_EIO, "getrandom: no randomness for the tenants' secret");
    if (rc) return rc;
    /* replicas sharing a store must key alike: the seed follows the secret */
    static const char seed_tag[] = "duplex router key seed v1";
    if (!r->cfg.key_seed) {
        uint8_t h[16]; /* the hash's shortest output */
        dx_keys_hash(seed_tag, sizeof seed_tag, r->ns_secret, sizeof r->ns_secret, NULL, 0, h,
                     sizeof h);
        memcpy(&r->cfg.key_seed, h, sizeof r->cfg.key_seed);
    }
    if (!r->cfg.key_seed) r->cfg.key_seed = 1;
    return 0;
}

/* The store names decode nodes by URL. */
static const char *store_node_url(void *user, int node)
{
    router *r = user;
    return node >= 0 && (size_t)node < r->n_nodes ? r->nodes[node].url : NULL;
}

static int store_node_of(void *user, const char *url, size_t len)
{
    router *r = user;
    for (size_t i = 0; i < r->n_nodes; i++) /* decode nodes, static or discovered */
        if (!r->nodes[i].prefill && strlen(r->nodes[i].url) == len &&
            !memcmp(r->nodes[i].url, url, len))
            return (int)i;
    return -1;
}

void router_describe_auth(const router *r, char *out, size_t cap)
{
    http_auth_describe(r->auth, r->cfg.insecure_no_auth, out, cap);
    if (http_auth_internal_key(r->auth))
        snprintf(out + strlen(out), cap - strlen(out), " internal_key=on");
}

static int setup_parts(router *r)
{
    int rc = setup_auth(r);
    if (!rc) rc = setup_nodes(r);
    if (rc) return rc;
    if (r->cfg.tokenizer && (rc = model_load_tokenizer(r->cfg.tokenizer, &r->tok)))
        return dx_err_wrap(rc, "--tokenizer");
    router_store_config sc = {.loop = r->loop,
                              .url = r->cfg.state_url,
                              .prefix = r->cfg.state_prefix,
                              .timeout_ms = r->cfg.state_timeout_ms,
                              .max_entries = r->cfg.max_conversations,
                              .max_bytes = r->cfg.max_state_bytes,
                              .node_url = store_node_url,
                              .node_of = store_node_of,
                              .user = r};
    if ((rc = router_store_create(&sc, &r->store))) return rc;
    if ((rc = router_up_create(r->loop, &r->up))) return rc;
    if ((rc = work_pool_create(r->loop, 2, &r->prep))) return rc;
    if (r->cfg.discover && (rc = setup_discovery(r))) return rc;
    http_app_config ac = {
        .routes = k_routes, .n_routes = DX_ARRAY_LEN(k_routes), .auth = r->auth, .user = r};
    if ((rc = http_app_create(&ac, &r->app))) return rc;
    http_srv_config hc = {.host = r->cfg.host,
                          .port = r->cfg.port,
                          .lim = r->cfg.http,
                          .on_request = http_app_on_request,
                          .user = r->app};
    return http_srv_create(r->loop, &hc, &r->http);
}

static void init_metrics(router *r)
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
    dx_buf_init(&r->scratch, 0);
    dx_buf_init(&r->out, 0);
}

static void free_parts(router *r)
{
    router_store_destroy(r->store);
    r->store = NULL;
    model_free(r->tok);
    r->tok = NULL;
    http_auth_destroy(r->auth);
    r->auth = NULL;
    dx_free(r->nodes);
    r->nodes = NULL;
    prom_family_free(&r->routed);
    prom_family_free(&r->fallbacks);
    dx_buf_free(&r->scratch);
    dx_buf_free(&r->out);
}

void rt_maybe_free(router *r)
{
    if (!r->destroying || r->n_handles || r->n_work) return;
    http_app_destroy(r->app); /* last: a preparation ending late still counts its answer */
    dx_free(r);
}

static void on_handle_closed(uv_handle_t *h)
{
    router *r = h->data;
    r->n_handles--;
    rt_maybe_free(r);
}

int router_create(uv_loop_t *loop, const router_config *cfg, router **out)
{
    *out = NULL;
    router *r = dx_calloc(1, sizeof *r);
    if (!r) return dx_errf(DX_ENOMEM, "out of memory");
    r->loop = loop;
    r->cfg = *cfg;
    fill_defaults(&r->cfg);
    init_metrics(r);
    int rc = setup_parts(r);
    if (rc) {
        router_up_destroy(r->up); /* closes on the next loop run */
        router_disc_destroy(r->disc);
        work_pool_destroy(r->prep);
        free_parts(r);
        http_app_destroy(r->app);
        dx_free(r);
        return rc;
    }
    uv_timer_init(loop, &r->health);
    uv_timer_init(loop, &r->grace);
    r->health.data = r->grace.data = r;
    r->n_handles = 2;
    uv_timer_start(&r->health, on_health_tick, 0, r->cfg.health_interval_ms);
    *out = r;
    return 0;
}

int router_port(const router *r)
{
    return http_srv_port(r->http);
}

static void on_stopped_turn(uv_timer_t *t)
{
    router *r = t->data;
    if (r->cfg.on_stopped) r->cfg.on_stopped(r->cfg.user);
}

/* on_stopped runs on a later loop turn, from a clean stack: it may destroy
 * the router, and this is called from deep inside request handling. */
void rt_maybe_stopped(router *r)
{
    if (!r->draining || r->stopped || r->n_active > 0 || r->destroying) return;
    r->stopped = 1;
    http_srv_close_idle(r->http);
    DX_LOGI("router: shutdown: all requests finished");
    uv_timer_start(&r->grace, on_stopped_turn, 0, 0);
}

static void on_grace_over(uv_timer_t *t)
{
    router *r = t->data;
    DX_LOGW("router: shutdown: grace period over, ending %zu requests", r->n_active);
    rt_abort_all(r);
    rt_maybe_stopped(r);
}

void router_shutdown(router *r)
{
    if (r->draining) return;
    r->draining = 1;
    http_srv_stop_accepting(r->http);
    http_srv_close_idle(r->http);
    DX_LOGI("router: shutdown: no longer accepting; %zu requests running (grace %.0f s)",
            r->n_active, r->cfg.shutdown_grace_s);
    uv_timer_start(&r->grace, on_grace_over, (uint64_t)(r->cfg.shutdown_grace_s * 1e3), 0);
    rt_maybe_stopped(r);
}

void router_destroy(router *r)
{
    if (!r) return;
    r->destroying = 1;
    rt_abort_all(r);
    work_pool_destroy(r->prep); /* what is being prepared ends now (rt_forget) */
    r->prep = NULL;
    router_disc_destroy(r->disc); /* no scan result after this */
    r->disc = NULL;
    for (size_t i = 0; i < r->n_nodes; i++) {
        router_up_cancel(r->nodes[i].check);
        r->nodes[i].check = NULL;
    }
    http_srv_destroy(r->http);
    router_up_destroy(r->up);
    free_parts(r);
    uv_close((uv_handle_t *)&r->health, on_handle_closed);
    uv_close((uv_handle_t *)&r->grace, on_handle_closed);
}
