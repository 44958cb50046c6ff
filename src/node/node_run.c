/* node_run: a node process — loop, loading, signals, teardown (see .h). */
#include "node/node_run.h"

#include "model/model_chat.h"

#include "oai/oai_tools.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "base/dx_addr.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "node/node_engine.h"
#include "node/node_kv.h"
#include "http/node_reg.h"
#include "oai/oai_req.h"

typedef struct {
    node_run_config cfg;
    uv_loop_t loop;
    uv_work_t load;
    uv_signal_t sig_int, sig_term, sig_usr1;
    uv_timer_t beat, drain_tick; /* registration heartbeat; the drain's end check */
    node_server *srv;
    node_reg *reg;
    char adv_url[NODE_REG_URL_MAX]; /* the URL routers use */
    uint64_t started_ms, drain_deadline_ns;
    int draining;
    http_auth *auth;
    engine_config ec;
    model *m;
    engine *e;
    node_kv *kv;
    kvport_secret *kv_secret;
    xfer_peers *kv_peers;
    const char *kv_host; /* where the KV port listens (kv_security) */
    const char *kv_auth; /* what the start-up line says about it */
    char engine_id[129];
    int load_rc, loading, stopping, exit_code;
    char load_err[512];
    double t_model_ms, t_engine_ms; /* loading, for the progress lines */
} run_ctx;

static int kv_wanted(const run_ctx *r)
{
    return r->cfg.kv_port >= 0 || r->cfg.role != NODE_ROLE_BOTH;
}

/* Loader thread: the model, the transfer agent the pool comes from, the
 * engine, then the KV side's leases and client. */
static void load_work(uv_work_t *w)
{
    run_ctx *r = w->data;
    uint64_t t0 = dx_now_ns();
    int rc = model_load(r->cfg.model_path, &r->m);
    if (!rc && r->cfg.chat_template) rc = model_load_chat_template(r->m, r->cfg.chat_template);
    if (!rc && model_chat_error(r->m)) rc = dx_errf(DX_EINVAL, "%s", model_chat_error(r->m));
    r->t_model_ms = (double)(dx_now_ns() - t0) * 1e-6;
    t0 = dx_now_ns();
    uint32_t train = rc ? 0 : model_hp(r->m)->n_ctx_train;
    if (!rc && r->ec.n_ctx > train)
        rc = dx_errf(DX_EINVAL, "--ctx %u is over the model's context length of %u", r->ec.n_ctx,
                     train);
    if (!rc && kv_wanted(r)) {
        node_kv_config kc = {.host = r->kv_host,
                             .port = r->cfg.kv_port > 0 ? r->cfg.kv_port : 0,
                             .tls = r->cfg.kv_tls,
                             .engine_id = r->engine_id,
                             .pin_ttl_s = r->cfg.pin_ttl_s,
                             .lease_ttl_s = r->cfg.lease_ttl_s,
                             .retain_ttl_s = r->cfg.retain_ttl_s,
                             .peer_timeout_s = r->cfg.kv_peer_timeout_s,
                             .pull_timeout_s = r->cfg.kv_pull_timeout_s,
                             .secret = r->kv_secret,
                             .peers = r->kv_peers};
        rc = node_kv_create(&kc, &r->kv);
        if (!rc) node_kv_engine_hooks(r->kv, &r->ec);
    }
    if (!rc) rc = engine_create(&r->ec, r->m, &r->e);
    r->t_engine_ms = (double)(dx_now_ns() - t0) * 1e-6;
    r->load_rc = rc;
    if (rc < 0) snprintf(r->load_err, sizeof r->load_err, "%s", dx_errmsg());
}

/* Dependency order (node_kv.h): no more pins, no more engine events, no
 * more leases, then the pool, then the agent that allocated it. */
/* Once every request, pin and lease has ended, nothing may still hold a
 * block: a leak here would be a lease or handed-in prefix never released,
 * which in a long-running node slowly eats the pool.  Every graceful stop
 * checks it (so every test that stops a node checks it too) and a leak
 * turns exit 0 into exit 3. */
static void audit_pool(run_ctx *r)
{
    kv_pool *p = engine_kv_pool(r->e);
    kv_pool_stats st;
    kv_pool_get_stats(p, &st);
    int rc = kv_pool_check(p);
    if (rc < 0)
        DX_LOGE("duplex serve: shutdown audit: the KV pool is inconsistent: %s", dx_errmsg());
    else if (st.n_used)
        DX_LOGE("duplex serve: shutdown audit: %u KV blocks still referenced after every "
                "request, pin and lease ended (a leak)",
                st.n_used);
    else
        return;
    if (!r->exit_code) r->exit_code = 3;
}

static void teardown_engine(run_ctx *r)
{
    node_kv_close_port(r->kv);
    engine_stop(r->e);
    node_kv_drop_leases(r->kv);
    if (r->e) audit_pool(r);
    engine_destroy(r->e);
    r->e = NULL;
    node_kv_destroy(r->kv);
    r->kv = NULL;
}

static void close_signals(run_ctx *r)
{
    uv_close((uv_handle_t *)&r->sig_int, NULL);
    uv_close((uv_handle_t *)&r->sig_term, NULL);
    uv_close((uv_handle_t *)&r->sig_usr1, NULL);
    uv_close((uv_handle_t *)&r->beat, NULL);
    uv_close((uv_handle_t *)&r->drain_tick, NULL);
}

/* The server has drained (or never started serving): the engine goes first,
 * so its last events land in the server's queue. */
static void on_stopped(void *user)
{
    run_ctx *r = user;
    r->stopping = 1;
    if (r->loading) return; /* load_done finishes the teardown */
    uv_timer_stop(&r->beat);
    node_reg_destroy(r->reg); /* DEL: routers drop the node at their next scan */
    r->reg = NULL;
    teardown_engine(r);
    node_server_destroy(r->srv);
    r->srv = NULL;
    model_free(r->m);
    r->m = NULL;
    close_signals(r);
}

static void log_startup(run_ctx *r)
{
    kv_pool *kv = engine_kv_pool(r->e);
    double mib = (double)kv_pool_arena_bytes(kv) / (1024.0 * 1024.0);
    char kvport[600] = "off";
    if (r->kv)
        snprintf(kvport, sizeof kvport, "%s:%d (engine id %s; auth: %s; pulls from: %s)",
                 node_kv_host(r->kv), node_kv_port(r->kv), node_kv_engine_id(r->kv), r->kv_auth,
                 xfer_peers_describe(r->kv_peers));
    char host[300], auth[64], trust[1024];
    dx_addr_url_host(r->cfg.host, host, sizeof host);
    http_auth_describe(r->auth, r->cfg.insecure_no_auth, auth, sizeof auth);
    http_auth_describe_trust(r->auth, trust, sizeof trust);
    DX_LOGI("duplex serve: model=%s role=%s address=http://%s:%d kv_pool=%.0fMiB "
            "(%u blocks x %u tokens, %s) n_ctx=%u prefix_caching=%s bidirectional=%s kv_port=%s "
            "auth=%s kv_params_from=%s",
            model_name(r->m), node_role_name(r->cfg.role), host, node_server_port(r->srv), mib,
            kv_pool_n_blocks(kv), kv_pool_block_size(kv), dx_dtype_name(kv_pool_dtype(kv)),
            engine_n_ctx(r->e), r->ec.no_prefix_cache ? "off" : "on",
            r->cfg.bidirectional ? "on" : "off", kvport, auth, trust);
}

static void fail_start(run_ctx *r, const char *what, const char *msg)
{
    if (what)
        DX_LOGE("duplex serve: %s: %s", what, msg);
    else
        DX_LOGE("duplex serve: %s", msg);
    r->exit_code = 1;
    node_server_shutdown(r->srv); /* nothing running: stops at once */
}

/* ---- registration (node_reg.h) ---- */

/* The KV address peers reach: the KV port's host, or the advertised URL's
 * when the port listens on every address. */
static void kv_addr(const run_ctx *r, char *out, size_t cap)
{
    const char *h = node_kv_host(r->kv);
    char host[200];
    if (!strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !strcmp(h, "[::]")) {
        const char *p = r->adv_url + 7, *colon = strrchr(p, ':'); /* "http://" checked */
        snprintf(host, sizeof host, "%.*s", (int)(colon - p) & 0xff, p);
    } else
        dx_addr_url_host(h, host, sizeof host);
    snprintf(out, cap, "%.199s:%d", host, node_kv_port(r->kv) & 0xffff);
}

static void on_beat(uv_timer_t *t)
{
    run_ctx *r = t->data;
    if (!r->reg || !r->e) return;
    node_reg_info ni = {.draining = r->draining,
                        .outstanding = (uint32_t)node_server_n_active(r->srv),
                        .heartbeat_ms = r->cfg.heartbeat_ms,
                        .started_ms = r->started_ms};
    snprintf(ni.url, sizeof ni.url, "%s", r->adv_url);
    snprintf(ni.role, sizeof ni.role, "%s", node_role_name(r->cfg.role));
    if (r->kv) kv_addr(r, ni.kv, sizeof ni.kv);
    uint64_t fp[2];
    xfer_token tok;
    model_fingerprint(r->m, fp);
    memcpy(tok.b, fp, sizeof tok.b);
    xfer_token_hex(&tok, ni.model);
    engine_stats es;
    engine_get_stats(r->e, &es);
    ni.free_kv_blocks = es.kv.n_free + es.kv.n_cached;
    node_reg_publish(r->reg, &ni);
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* After the bind (the default URL has the port): the key's writer. */
static int setup_register(run_ctx *r)
{
    const node_run_config *c = &r->cfg;
    rds_url u;
    int rc = rds_url_parse(c->register_url, &u);
    if (rc) return dx_err_wrap(rc, "--register");
    if (c->advertise_url) {
        if ((rc = dx_addr_http_url(c->advertise_url, r->adv_url, sizeof r->adv_url)))
            return dx_err_wrap(rc, "--advertise-url");
    } else {
        char host[300];
        dx_addr_url_host(c->host, host, sizeof host);
        snprintf(r->adv_url, sizeof r->adv_url, "http://%.200s:%d", host,
                 node_server_port(r->srv) & 0xffff);
    }
    r->started_ms = wall_ms();
    node_reg_config rc_ = {.redis = &u,
                           .prefix = c->register_prefix,
                           .url = r->adv_url,
                           .heartbeat_ms = c->heartbeat_ms,
                           .peers = kv_wanted(r) ? r->kv_peers : NULL};
    return node_reg_create(&rc_, &r->reg);
}

static void load_done(uv_work_t *w, int status)
{
    run_ctx *r = w->data;
    r->loading = 0;
    if (status < 0 || r->load_rc < 0) {
        char what[600];
        snprintf(what, sizeof what, "loading %s", r->cfg.model_path);
        int flag = r->load_rc == DX_EINVAL && !strncmp(r->load_err, "--", 2); /* names a flag */
        fail_start(r, flag ? NULL : what, status < 0 ? uv_strerror(status) : r->load_err);
        if (r->srv && r->stopping) on_stopped(r);
        return;
    }
    if (r->stopping) { /* a signal came while loading */
        on_stopped(r);
        return;
    }
    uint64_t fp[2];
    model_fingerprint(r->m, fp);
    DX_LOGI("duplex serve: model loaded in %.0f ms; engine and KV pool ready in %.0f ms "
            "(its pages fault in in the background)",
            r->t_model_ms, r->t_engine_ms);
    if (r->kv && node_kv_start(r->kv, &r->loop, fp, engine_kv_pool(r->e)) < 0) {
        fail_start(r, "KV port", dx_errmsg());
        return;
    }
    node_backend be;
    node_engine_backend(r->e, r->m, &be);
    be.kv = r->kv;
    node_run_parsers(&r->cfg, model_chat_kind(r->m), model_chat_template(r->m), &be.tool_fmt,
                     &be.reasoning); /* the names were checked before the load */
    node_server_set_backend(r->srv, &be);
    log_startup(r);
    if (r->reg) uv_timer_start(&r->beat, on_beat, 0, r->cfg.heartbeat_ms);
}

static void on_signal(uv_signal_t *h, int signum)
{
    run_ctx *r = h->data;
    DX_LOGI("duplex serve: %s received", signum == SIGINT ? "SIGINT" : "SIGTERM");
    r->draining = 1; /* the heartbeats until the stop say so */
    if (r->srv) node_server_shutdown(r->srv);
}

/* The drain is over when nothing runs and no lease (retained KV, a prefill
 * node's hand-off) is left, or at its deadline. */
static void on_drain_tick(uv_timer_t *t)
{
    run_ctx *r = t->data;
    node_kv_stats ks = {0};
    if (r->kv && !r->loading) node_kv_get_stats(r->kv, &ks);
    int idle = node_server_n_active(r->srv) == 0 && ks.leases.leases == 0;
    int late = dx_now_ns() >= r->drain_deadline_ns;
    if (!idle && !late) return;
    if (idle)
        DX_LOGI("duplex serve: drained: no request running, no KV lease left");
    else
        DX_LOGW("duplex serve: drain: --shutdown-grace-s over with %zu requests and %u leases",
                node_server_n_active(r->srv), ks.leases.leases);
    uv_timer_stop(t);
    node_server_shutdown(r->srv);
}

static void start_drain(run_ctx *r)
{
    if (r->draining || r->stopping || !r->srv) return;
    r->draining = 1;
    node_server_drain(r->srv);
    r->drain_deadline_ns = dx_now_ns() + (uint64_t)(r->cfg.shutdown_grace_s * 1e9);
    uv_timer_start(&r->drain_tick, on_drain_tick, 50, 50);
    if (r->reg && !r->loading) on_beat(&r->beat); /* routers learn it at their next scan */
}

static void on_drain_request(void *user)
{
    DX_LOGI("duplex serve: drain requested (POST /admin/drain)");
    start_drain(user);
}

static void on_usr1(uv_signal_t *h, int signum)
{
    (void)signum;
    DX_LOGI("duplex serve: SIGUSR1 received: draining");
    start_drain(h->data);
}

static int start_server(run_ctx *r)
{
    node_server_config sc = {
        .host = r->cfg.host,
        .port = r->cfg.port,
        .role = r->cfg.role,
        .http = r->cfg.http,
        .shutdown_grace_s = r->cfg.shutdown_grace_s,
        .on_stopped = on_stopped,
        .user = r,
        .bidirectional = r->cfg.bidirectional,
        .recompute_threshold = r->cfg.recompute_threshold,
        .no_prefix_cache = r->cfg.engine.no_prefix_cache,
        .history_ttl_s = r->cfg.retain_ttl_s,
        .responses_ttl_s = r->cfg.responses_ttl_s,
        .responses_max_bytes = r->cfg.responses_max_bytes,
        .served_model_name = r->cfg.served_model_name,
        .auth = r->auth,
        .on_drain = on_drain_request,
    };
    int rc = node_server_create(&r->loop, &sc, &r->srv);
    if (rc < 0) return rc;
    if (r->cfg.engine_id && *r->cfg.engine_id)
        snprintf(r->engine_id, sizeof r->engine_id, "%s", r->cfg.engine_id);
    else /* default: the HTTP address, known once bound */
        snprintf(r->engine_id, sizeof r->engine_id, "%s:%d", r->cfg.host, node_server_port(r->srv));
    return 0;
}

/* The KV port's trust settings, before anything loads: the secret, the
 * peers pulls may reach, and where the port may listen.  A KV port hands
 * out the whole pool to whoever authenticates, and without a secret anyone
 * does: then it listens on loopback only, unless --insecure-no-auth. */
static int kv_security(run_ctx *r)
{
    const node_run_config *c = &r->cfg;
    int rc = c->kv_secret_file ? kvport_secret_load(c->kv_secret_file, &r->kv_secret) : 0;
    if (!rc) rc = xfer_peers_create(c->kv_peers, &r->kv_peers);
    if (rc || !kv_wanted(r)) return rc;
    r->kv_host = c->kv_host ? c->kv_host : c->host;
    rc = kvport_listen_allowed(r->kv_host, r->kv_secret, c->insecure_no_auth,
                               c->kv_host ? "--kv-host" : "--host", &r->kv_auth);
    if (rc != DX_EDENIED || c->kv_host) return rc;
    /* not asked for: the KV port just follows --host, and stays on loopback */
    DX_LOGW("duplex serve: the KV port listens on 127.0.0.1 only, not on --host %s: no "
            "--kv-secret-file (peers on other hosts cannot pull from this node)",
            c->host);
    r->kv_host = "127.0.0.1";
    return kvport_listen_allowed(r->kv_host, NULL, 0, "--kv-host", &r->kv_auth);
}

static void free_security(run_ctx *r)
{
    kvport_secret_destroy(r->kv_secret);
    xfer_peers_destroy(r->kv_peers);
    r->kv_secret = NULL;
    r->kv_peers = NULL;
}

int node_run(const node_run_config *cfg)
{
    static run_ctx r; /* one node per process; signal handlers reach it through handles */
    memset(&r, 0, sizeof r);
    r.cfg = *cfg;
    if (!r.cfg.host) r.cfg.host = "127.0.0.1";
    if (r.cfg.shutdown_grace_s <= 0) r.cfg.shutdown_grace_s = NODE_SERVER_DEFAULT_SHUTDOWN_GRACE_S;
    if (!r.cfg.heartbeat_ms) r.cfg.heartbeat_ms = NODE_REG_DEFAULT_HEARTBEAT_MS;
    r.ec = cfg->engine;
    r.ec.log_populate = 1;
    int rc = http_auth_create(&cfg->auth, &r.auth);
    if (!rc) rc = http_auth_bind_check(r.auth, r.cfg.host, cfg->insecure_no_auth);
    if (rc) {
        fprintf(stderr, "duplex serve: %s\n", dx_errmsg());
        http_auth_destroy(r.auth);
        return rc == DX_EINVAL ? 2 : 1;
    }
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error code, not a death */
    if (kv_security(&r) < 0) {
        fprintf(stderr, "duplex serve: %s\n", dx_errmsg());
        free_security(&r);
        http_auth_destroy(r.auth);
        return 2;
    }
    oai_json_use_dx_alloc();
    uv_loop_init(&r.loop);
    if (start_server(&r) < 0) {
        fprintf(stderr, "duplex serve: %s\n", dx_errmsg());
        uv_run(&r.loop, UV_RUN_DEFAULT);
        uv_loop_close(&r.loop);
        http_auth_destroy(r.auth);
        free_security(&r);
        return 1;
    }
    char host[300];
    dx_addr_url_host(r.cfg.host, host, sizeof host);
    DX_LOGI("duplex serve: listening on http://%s:%d, loading %s", host, node_server_port(r.srv),
            r.cfg.model_path);
    uv_signal_init(&r.loop, &r.sig_int);
    uv_signal_init(&r.loop, &r.sig_term);
    r.sig_int.data = r.sig_term.data = &r;
    uv_signal_start(&r.sig_int, on_signal, SIGINT);
    uv_signal_start(&r.sig_term, on_signal, SIGTERM);
    uv_signal_init(&r.loop, &r.sig_usr1);
    uv_timer_init(&r.loop, &r.beat);
    uv_timer_init(&r.loop, &r.drain_tick);
    r.sig_usr1.data = r.beat.data = r.drain_tick.data = &r;
    uv_signal_start(&r.sig_usr1, on_usr1, SIGUSR1);
    if (r.cfg.register_url && setup_register(&r) < 0) {
        DX_LOGE("duplex serve: %s", dx_errmsg());
        r.exit_code = 2;
        node_server_shutdown(r.srv); /* nothing running: on_stopped closes the handles */
    } else {
        r.load.data = &r;
        r.loading = 1;
        uv_queue_work(&r.loop, &r.load, load_work, load_done);
    }
    uv_run(&r.loop, UV_RUN_DEFAULT);
    uv_loop_close(&r.loop);
    http_auth_destroy(r.auth);
    free_security(&r); /* the KV side that used them is gone */
    return r.exit_code;
}

int node_run_parsers(const node_run_config *c, enum chat_tmpl_kind kind, const char *tmpl,
                     int *tool_fmt, int *reasoning)
{
    const char *t = c->tool_parser ? c->tool_parser : "auto";
    const char *r = c->reasoning_parser ? c->reasoning_parser : "auto";
    enum oai_tools_fmt f;
    if (!strcmp(t, "auto"))
        f = kind == CHAT_TMPL_LLAMA3 ? OAI_TOOLS_LLAMA3 : OAI_TOOLS_QWEN;
    else if (oai_tools_fmt_parse(t, &f))
        return dx_errf(DX_EINVAL, "--tool-call-parser: '%s' is not auto, qwen, llama3 or none", t);
    *tool_fmt = (int)f;
    if (!strcmp(r, "auto"))
        *reasoning = tmpl && strstr(tmpl, "<think>") != NULL;
    else if (!strcmp(r, "think") || !strcmp(r, "none"))
        *reasoning = !strcmp(r, "think");
    else
        return dx_errf(DX_EINVAL, "--reasoning-parser: '%s' is not auto, think or none", r);
    return 0;
}
