/* router_nodes: the router's node table — the static lists (--prefill,
 * --decode) and the nodes their registrations add and drop (--discover,
 * router_disc.h), each node's health check and drain, the gauges about
 * them, and the URL mapping the conversation store uses.
 *
 * A node is two records at one index that never moves: rt_node (its URL
 * and health check, this file's) and r->live (its role, health, drain and
 * load: what router_pick reads, in place, and what the requests' upstream
 * calls count).  The table calls nothing above it; the flow reads it. */
#include <stdio.h>
#include <string.h>

#include "base/dx_addr.h"
#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "router/router_priv.h"

static router_pick_node *live_of(const rt_node *n)
{
    return &n->r->live[n->index];
}

static const char *role_name(const router_pick_node *s)
{
    return s->prefill ? "prefill" : "decode";
}

router_pick_cluster rt_nodes_cluster(router *r)
{
    return (router_pick_cluster){.nodes = r->live,
                                 .n_nodes = r->n_nodes,
                                 .rr = r->rr,
                                 .decode_max_outstanding = r->cfg.decode_max_outstanding,
                                 .local_prefill_max_tokens = r->cfg.local_prefill_max_tokens};
}

int rt_nodes_healthy(const router *r)
{
    int p = r->n_prefill == 0, d = 0;
    for (size_t i = 0; i < r->n_nodes; i++) {
        if (!router_pick_takes_new(&r->live[i])) continue;
        if (r->live[i].prefill)
            p = 1;
        else
            d = 1;
    }
    return p && d;
}

/* ---- health ------------------------------------------------------------------- */

static void set_health(router *r, int i, int healthy, const char *why)
{
    router_pick_node *s = &r->live[i];
    if (s->healthy == healthy) return;
    s->healthy = healthy;
    if (healthy)
        DX_LOGI("router: %s node %s is healthy", role_name(s), r->nodes[i].url);
    else
        DX_LOGW("router: %s node %s is unhealthy: %s", role_name(s), r->nodes[i].url, why);
}

void rt_nodes_failed(router *r, int node, const char *why)
{
    r->live[node].draining = 0; /* unreachable: not even its KV port is there */
    set_health(r, node, 0, why);
}

/* A draining node answers 503 {"status":"draining"}: unhealthy for new
 * requests, yet still the holder of its conversations' KV. */
static void on_check_done(void *user, int rc, long status)
{
    rt_node *n = user;
    router_pick_node *s = live_of(n);
    n->check = NULL;
    char why[160];
    if (rc < 0)
        snprintf(why, sizeof why, "%s", dx_errmsg());
    else
        snprintf(why, sizeof why, "GET /health answered %ld", status);
    n->hbody[n->hlen] = 0;
    int draining = rc == 0 && status == 503 && strstr(n->hbody, "\"draining\"") != NULL;
    if (draining && !s->draining)
        DX_LOGI("router: %s node %s is draining: no new requests, its KV still used", role_name(s),
                n->url);
    s->draining = draining;
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

void rt_nodes_check(router *r)
{
    for (size_t i = 0; i < r->n_nodes; i++)
        if (!r->nodes[i].check && !r->live[i].gone) start_check(r, (int)i);
}

void rt_nodes_stop(router *r)
{
    for (size_t i = 0; i < r->n_nodes; i++) {
        router_up_cancel(r->nodes[i].check);
        r->nodes[i].check = NULL;
    }
}

/* ---- the table ------------------------------------------------------------------ */

/* The index of the node at url; DX_NONE when there is none. */
static int find_node(const router *r, const char *url)
{
    for (size_t j = 0; j < r->n_nodes; j++)
        if (!strcmp(r->nodes[j].url, url)) return (int)j;
    return DX_NONE;
}

static void set_role(rt_node *nd, int prefill)
{
    live_of(nd)->prefill = prefill;
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
        int rc = dx_addr_http_url(urls[i], url, sizeof url); /* router_parse_url's rule */
        if (rc) return dx_err_wrap(rc, "%s", flag);
        int j = find_node(r, url);
        if (j >= 0)
            return dx_errf(DX_EINVAL, "%s: node %s is given twice%s", flag, url,
                           r->live[j].prefill != prefill ? " (as prefill and as decode)" : "");
        push_node(r, url, prefill);
    }
    return 0;
}

int rt_nodes_setup(router *r)
{
    const router_config *c = &r->cfg;
    if (c->n_decode == 0 && !c->discover)
        return dx_errf(DX_EINVAL, "--decode: at least one decode node is needed (or --discover)");
    r->cap_nodes = c->n_prefill + c->n_decode + (c->discover ? RT_DISCOVER_MAX : 0);
    r->nodes = dx_calloc(r->cap_nodes, sizeof *r->nodes);
    r->live = dx_calloc(r->cap_nodes, sizeof *r->live);
    if (!r->nodes || !r->live) return dx_errf(DX_ENOMEM, "out of memory");
    int rc = add_nodes(r, c->prefill, c->n_prefill, 1, "--prefill");
    if (rc == 0) rc = add_nodes(r, c->decode, c->n_decode, 0, "--decode");
    return rc;
}

void rt_nodes_free(router *r)
{
    dx_free(r->nodes);
    r->nodes = NULL;
    dx_free(r->live);
    r->live = NULL;
}

const char *rt_nodes_url_of(void *user, int node)
{
    router *r = user;
    return node >= 0 && (size_t)node < r->n_nodes ? r->nodes[node].url : NULL;
}

int rt_nodes_decode_of(void *user, const char *url, size_t len)
{
    router *r = user;
    for (size_t i = 0; i < r->n_nodes; i++) /* decode nodes, static or discovered */
        if (!r->live[i].prefill && strlen(r->nodes[i].url) == len &&
            !memcmp(r->nodes[i].url, url, len))
            return (int)i;
    return DX_NONE;
}

/* ---- discovery (router_disc.h) ------------------------------------------------------ */

/* A registered node's slot: a new one (NULL when none is left), or its
 * own, which a vanished node takes back. */
static rt_node *registered_slot(router *r, const node_reg_info *v, int prefill)
{
    int i = find_node(r, v->url);
    if (i < 0) {
        if (r->n_nodes == r->cap_nodes) {
            if (!r->disc_dropped++)
                DX_LOGW("router: discovery: no slot for %s: %d discovered nodes at most", v->url,
                        RT_DISCOVER_MAX);
            return NULL;
        }
        rt_node *nd = push_node(r, v->url, prefill);
        nd->discovered = 1;
        DX_LOGI("router: discovered %s node %s (kv %s)", v->role, v->url, v->kv[0] ? v->kv : "-");
        return nd;
    }
    rt_node *nd = &r->nodes[i];
    router_pick_node *s = &r->live[i];
    if (nd->discovered && s->gone) {
        s->gone = 0;
        r->n_prefill += s->prefill;
        DX_LOGI("router: %s node %s is registered again", v->role, v->url);
    }
    if (nd->discovered && s->prefill != prefill && !s->outstanding) {
        r->n_prefill = r->n_prefill - (size_t)s->prefill + (size_t)prefill;
        set_role(nd, prefill);
    }
    return nd;
}

/* The node's registration is in this scan: a new node gets a slot (healthy
 * once its first check passes), a vanished one comes back in its own. */
static void take_registration(router *r, const node_reg_info *v)
{
    int prefill = !strcmp(v->role, "prefill"); /* "both" prefills its own requests: decode */
    rt_node *nd = registered_slot(r, v, prefill);
    if (!nd) return;
    router_pick_node *s = live_of(nd);
    nd->seen = 1;
    if (v->draining && !s->reg_draining)
        DX_LOGI("router: node %s is draining (its registration says so)", nd->url);
    s->reg_draining = v->draining;
    if (!s->healthy && !nd->check) start_check(r, nd->index);
}

static void drop_vanished(router *r)
{
    for (size_t i = 0; i < r->n_nodes; i++) {
        rt_node *nd = &r->nodes[i];
        router_pick_node *s = &r->live[i];
        if (!nd->seen) s->reg_draining = 0; /* a static node's key went: its /health rules */
        if (nd->seen || !nd->discovered || s->gone) continue;
        DX_LOGW("router: %s node %s vanished from the registrations: its conversations "
                "recompute elsewhere",
                role_name(s), nd->url);
        s->gone = 1;
        s->healthy = s->draining = s->reg_draining = 0;
        router_up_cancel(nd->check);
        nd->check = NULL;
        r->n_prefill -= (size_t)s->prefill;
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

int rt_nodes_discover(router *r)
{
    const char *prefix = r->cfg.state_prefix ? r->cfg.state_prefix : NODE_REG_DEFAULT_PREFIX;
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

/* ---- gauges ------------------------------------------------------------------------ */

enum node_series { NS_HEALTHY, NS_DRAINING, NS_OUTSTANDING, NS_PROMPT_TOKENS };

static double node_value(const router_pick_node *s, enum node_series w)
{
    switch (w) {
    case NS_HEALTHY:
        return s->healthy;
    case NS_DRAINING:
        return s->draining || s->reg_draining;
    case NS_OUTSTANDING:
        return s->outstanding;
    default:
        return (double)s->outstanding_tokens;
    }
}

/* Per node (a vanished discovered node is left out; prompt tokens: prefill
 * nodes only). */
static void write_node_gauges(const router *r, dx_buf *b)
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
            if (!r->live[i].gone && (w != NS_PROMPT_TOKENS || r->live[i].prefill))
                prom_write_value(b, k[w].name, r->nodes[i].labels,
                                 node_value(&r->live[i], (enum node_series)w));
    }
}

static void write_discovery(const router *r, dx_buf *b)
{
    if (!r->disc) return;
    size_t live = 0;
    for (size_t i = 0; i < r->n_nodes; i++) live += r->nodes[i].discovered && !r->live[i].gone;
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

void rt_nodes_write_metrics(const router *r, dx_buf *b)
{
    write_node_gauges(r, b);
    write_discovery(r, b);
}
