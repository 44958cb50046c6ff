/* router: the top of the router (router.h) — configuration, the routes,
 * and the lifecycle: create wires the parts (auth, node table, tokenizer,
 * store, upstream client, work pool, discovery, HTTP), shutdown drains,
 * destroy frees.  Every other file of the router sits below this one
 * (router_priv.h lists them); the flow tells it that a request has gone
 * through on_req_gone, never by calling up. */
#include "router/router_priv.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "base/dx_addr.h"
#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_keys.h"
#include "base/dx_log.h"
#include "router/router_state.h"

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

/* ---- simple routes ---------------------------------------------------------- */

static void route_health(router *r, http_conn *c, const http_req *hr, uint64_t t0)
{
    int ok = rt_nodes_healthy(r) && !r->draining;
    const char *st = r->draining ? "draining" : ok ? "ok" : "no healthy node";
    char body[64];
    int n = snprintf(body, sizeof body, "{\"status\":\"%s\"}", st);
    http_app_respond(r->app, c, hr->method, hr->path, ok ? 200 : 503, "application/json", NULL,
                     body, (size_t)n, t0);
}

static void route_metrics(router *r, http_conn *c, const http_req *hr, uint64_t t0)
{
    rt_metrics_request(r, hr->path, 200); /* this scrape counts itself */
    dx_buf b;
    dx_buf_init(&b, 0);
    rt_metrics_render(r, &b);
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

enum {
    API_MODELS,
    API_CHAT,
    API_COMPLETIONS,
    API_MESSAGES,
    API_COUNT,
    API_RESPONSES,
    API_RESPONSE
};

static void on_api(void *u, http_conn *c, const http_req *hr, const http_app_call *k)
{
    router *r = u;
    if (r->draining)
        rt_req_refuse(r, c, hr->method, hr->path, 503, "the router is shutting down", NULL, k->t0);
    else if (k->arg == API_MODELS)
        rt_flow_passthrough(r, c, hr, k->t0);
    else if (k->arg == API_RESPONSE)
        rt_flow_response(r, c, hr, k->who, k->t0);
    else
        rt_flow_completion(r, c, hr, k->arg == API_COMPLETIONS ? OAI_COMPLETION : OAI_CHAT,
                           k->arg == API_MESSAGES || k->arg == API_COUNT ? OAI_FRONT_MESSAGES
                           : k->arg == API_RESPONSES                     ? OAI_FRONT_RESPONSES
                                                                         : OAI_FRONT_CHAT,
                           k->arg == API_COUNT, k->who, k->t0);
}

static const http_app_route k_routes[] = {
    {.path = "/health", .methods = HTTP_APP_GET, .open = 1, .fn = on_health},
    {.path = "/metrics", .methods = HTTP_APP_GET, .open = 1, .fn = on_metrics},
    {.path = "/v1/models", .methods = HTTP_APP_GET, .fn = on_api, .arg = API_MODELS},
    {.path = "/v1/chat/completions", .methods = HTTP_APP_POST, .fn = on_api, .arg = API_CHAT},
    {.path = "/v1/completions", .methods = HTTP_APP_POST, .fn = on_api, .arg = API_COMPLETIONS},
    /* the other front doors (docs/api.md): translated here, chat to the nodes */
    {.path = "/v1/messages",
     .methods = HTTP_APP_POST,
     .fn = on_api,
     .arg = API_MESSAGES,
     .error = oai_anth_http_error},
    {.path = "/v1/messages/count_tokens",
     .methods = HTTP_APP_POST,
     .fn = on_api,
     .arg = API_COUNT,
     .error = oai_anth_http_error},
    {.path = "/v1/responses", .methods = HTTP_APP_POST, .fn = on_api, .arg = API_RESPONSES},
    {.path = "/v1/responses/",
     .methods = HTTP_APP_GET | HTTP_APP_DELETE,
     .fn = on_api,
     .arg = API_RESPONSE,
     .prefix = 1},
};

/* ---- lifecycle ------------------------------------------------------------------ */

static void on_health_tick(uv_timer_t *t)
{
    router *r = t->data;
    rt_nodes_check(r);
    router_store_tick(r->store);
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
    if (c->state_timeout_ms <= 0) c->state_timeout_ms = ROUTER_STORE_DEFAULT_TIMEOUT_MS;
    /* a shared store: the seed comes from the routers' common secret (setup_auth) */
    while (!c->key_seed && !c->state_url)
        if (getrandom(&c->key_seed, sizeof c->key_seed, 0) != sizeof c->key_seed) c->key_seed = 1;
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

void router_describe_auth(const router *r, char *out, size_t cap)
{
    http_auth_describe(r->auth, r->cfg.insecure_no_auth, out, cap);
    if (http_auth_internal_key(r->auth))
        snprintf(out + strlen(out), cap - strlen(out), " internal_key=on");
}

static int setup_parts(router *r)
{
    int rc = setup_auth(r);
    if (!rc) rc = rt_nodes_setup(r);
    if (rc) return rc;
    if (r->cfg.tokenizer && (rc = model_load_tokenizer(r->cfg.tokenizer, &r->tok)))
        return dx_err_wrap(rc, "--tokenizer");
    router_store_config sc = {.loop = r->loop,
                              .url = r->cfg.state_url,
                              .prefix = r->cfg.state_prefix,
                              .timeout_ms = r->cfg.state_timeout_ms,
                              .max_entries = r->cfg.max_conversations,
                              .max_bytes = r->cfg.max_state_bytes,
                              .node_url = rt_nodes_url_of,
                              .node_of = rt_nodes_decode_of,
                              .user = r};
    if ((rc = router_store_create(&sc, &r->store))) return rc;
    router_rsp_config rc_rsp = {
        .ttl_s =
            r->cfg.responses_ttl_s > 0 ? r->cfg.responses_ttl_s : ROUTER_DEFAULT_RESPONSES_TTL_S,
        .max_bytes = r->cfg.responses_max_bytes ? r->cfg.responses_max_bytes
                                                : (size_t)ROUTER_DEFAULT_RESPONSES_MAX_MB << 20,
        .redis = r->cfg.state_url,
        .prefix = r->cfg.state_prefix,
        .timeout_ms = r->cfg.state_timeout_ms};
    if ((rc = router_rsp_create(&rc_rsp, &r->responses))) return rc;
    if ((rc = router_up_create(r->loop, &r->up))) return rc;
    if ((rc = work_pool_create(r->loop, 2, &r->prep))) return rc;
    if (r->cfg.discover && (rc = rt_nodes_discover(r))) return rc;
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

static void free_parts(router *r)
{
    router_store_destroy(r->store);
    r->store = NULL;
    router_rsp_destroy(r->responses);
    r->responses = NULL;
    model_free(r->tok);
    r->tok = NULL;
    http_auth_destroy(r->auth);
    r->auth = NULL;
    rt_nodes_free(r);
    rt_metrics_free(r);
    dx_buf_free(&r->scratch);
    dx_buf_free(&r->front_out);
    dx_buf_free(&r->out);
}

/* Frees a destroyed router once its handles and thread-pool work are done. */
static void maybe_free(router *r)
{
    if (!r->destroying || r->n_handles || r->n_work) return;
    http_app_destroy(r->app); /* last: a preparation ending late still counts its answer */
    dx_free(r);
}

static void on_handle_closed(uv_handle_t *h)
{
    router *r = h->data;
    r->n_handles--;
    maybe_free(r);
}

static void on_stopped_turn(uv_timer_t *t)
{
    router *r = t->data;
    if (r->cfg.on_stopped) r->cfg.on_stopped(r->cfg.user);
}

/* on_stopped runs on a later loop turn, from a clean stack: it may destroy
 * the router, and this is called from deep inside request handling. */
static void maybe_stopped(router *r)
{
    if (!r->draining || r->stopped || r->n_active > 0 || r->destroying) return;
    r->stopped = 1;
    http_srv_close_idle(r->http);
    DX_LOGI("router: shutdown: all requests finished");
    uv_timer_start(&r->grace, on_stopped_turn, 0, 0);
}

/* The flow's word that a request has gone (router_priv.h): while shutting
 * down, the last one ends the shutdown; once destroyed, the last one lets
 * the router be freed.  Each check knows which applies. */
static void on_req_gone(router *r)
{
    maybe_stopped(r);
    maybe_free(r);
}

int router_create(uv_loop_t *loop, const router_config *cfg, router **out)
{
    *out = NULL;
    router *r = dx_calloc(1, sizeof *r);
    if (!r) return dx_errf(DX_ENOMEM, "out of memory");
    r->loop = loop;
    r->cfg = *cfg;
    fill_defaults(&r->cfg);
    dx_list_init(&r->active);
    r->on_req_gone = on_req_gone;
    rt_metrics_init(r);
    dx_buf_init(&r->scratch, 0);
    dx_buf_init(&r->front_out, 0);
    dx_buf_init(&r->out, 0);
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

static void on_grace_over(uv_timer_t *t)
{
    router *r = t->data;
    DX_LOGW("router: shutdown: grace period over, ending %zu requests", r->n_active);
    rt_req_abort_all(r);
    maybe_stopped(r);
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
    maybe_stopped(r);
}

void router_destroy(router *r)
{
    if (!r) return;
    r->destroying = 1;
    rt_req_abort_all(r);
    work_pool_destroy(r->prep); /* what is being prepared ends now (rt_req_forget) */
    r->prep = NULL;
    router_disc_destroy(r->disc); /* no scan result after this */
    r->disc = NULL;
    rt_nodes_stop(r);
    http_srv_destroy(r->http);
    router_up_destroy(r->up);
    free_parts(r);
    uv_close((uv_handle_t *)&r->health, on_handle_closed);
    uv_close((uv_handle_t *)&r->grace, on_handle_closed);
}
