/* cli_serve: `duplex serve` — one node's OpenAI-compatible HTTP server.
 *
 * The socket is bound first, so /health answers 503 while the model loads
 * (on libuv's thread pool); once the engine runs, the one startup line is
 * logged and completions are served.  SIGINT/SIGTERM start a graceful
 * shutdown: stop accepting, let running requests finish for the grace
 * period, cancel the rest, exit 0. */
#include "cli.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "engine/engine.h"
#include "node/node_engine.h"
#include "node/node_server.h"
#include "node/oai_req.h"
#include "xfer/kvport_server.h"
#include "xfer/xfer_client.h"
#include "xfer/xfer_lease.h"
#include "xfer/xfer_ucx.h"

typedef struct {
    uv_loop_t loop;
    uv_work_t load;
    uv_signal_t sig_int, sig_term;
    node_server *srv;
    const char *model_path, *host;
    enum node_role role;
    engine_config ec;
    model *m;
    engine *e;
    /* KV port (--kv-port): the pool is allocated by UCX so peers can read it */
    int kv_port;             /* -1: no KV port */
    const char *kv_host, *kv_tls, *engine_id;
    double pin_ttl_s;
    xfer_agent *agent;
    xfer_leases *leases;
    kvport_server *kvsrv;
    kvport_hello hello;
    char engine_id_buf[64];
    int load_rc, loading, stopping, exit_code;
    char load_err[512];
} serve_ctx;

/* With a KV port the pool comes from UCX (registered, shareable) and leases
 * guard every read of it. */
static int kv_port_prepare(serve_ctx *s)
{
    xfer_agent_config ac = {.tls = s->kv_tls};
    int rc = xfer_agent_create(&ac, &s->agent);
    if (rc) return dx_err_wrap(rc, "KV transfer agent");
    s->ec.kv_alloc = xfer_agent_alloc;
    s->ec.kv_release = xfer_agent_release;
    s->ec.kv_alloc_user = s->agent;
    return 0;
}

static int kv_port_leases(serve_ctx *s)
{
    kv_pool *kv = engine_kv_pool(s->e);
    if (!s->engine_id[0]) /* default: the HTTP address, known once bound */
        snprintf(s->engine_id_buf, sizeof s->engine_id_buf, "%s:%d", s->host,
                 node_server_port(s->srv));
    uint64_t fp64[2];
    uint8_t fp[16];
    model_fingerprint(s->m, fp64);
    memcpy(fp, fp64, sizeof fp);
    xfer_hello_init(&s->hello, s->engine_id, fp, kv, s->agent);
    return xfer_leases_create(kv, s->pin_ttl_s, &s->leases);
}

static void load_work(uv_work_t *w)
{
    serve_ctx *s = w->data;
    s->load_rc = model_load(s->model_path, &s->m);
    if (s->load_rc == 0 && s->kv_port >= 0) s->load_rc = kv_port_prepare(s);
    if (s->load_rc == 0) s->load_rc = engine_create(&s->ec, s->m, &s->e);
    if (s->load_rc == 0 && s->kv_port >= 0) s->load_rc = kv_port_leases(s);
    if (s->load_rc < 0) snprintf(s->load_err, sizeof s->load_err, "%s", dx_errmsg());
}

/* Order matters: the port (and its pins) before the leases, the leases
 * (their block references) before the pool, the pool before the agent that
 * allocated it. */
static void teardown_engine(serve_ctx *s)
{
    kvport_server_destroy(s->kvsrv);
    s->kvsrv = NULL;
    xfer_leases_destroy(s->leases);
    s->leases = NULL;
    engine_destroy(s->e);
    s->e = NULL;
    xfer_agent_destroy(s->agent);
    s->agent = NULL;
}

static void close_signals(serve_ctx *s)
{
    uv_close((uv_handle_t *)&s->sig_int, NULL);
    uv_close((uv_handle_t *)&s->sig_term, NULL);
}

/* The server has drained (or never started serving): tear down in order —
 * the engine first, so its last events land in the server's queue. */
static void on_stopped(void *user)
{
    serve_ctx *s = user;
    s->stopping = 1;
    if (s->loading) return; /* load_done finishes the teardown */
    teardown_engine(s);
    node_server_destroy(s->srv);
    s->srv = NULL;
    model_free(s->m);
    s->m = NULL;
    close_signals(s);
}

static void log_startup(serve_ctx *s)
{
    kv_pool *kv = engine_kv_pool(s->e);
    double mib = (double)kv_pool_arena_bytes(kv) / (1024.0 * 1024.0);
    char kvport[96] = "off";
    if (s->kvsrv)
        snprintf(kvport, sizeof kvport, "%s:%d (engine id %s)", s->kv_host,
                 kvport_server_port(s->kvsrv), s->engine_id);
    DX_LOGI("duplex serve: model=%s role=%s address=http://%s:%d kv_pool=%.0fMiB "
            "(%u blocks x %u tokens) n_ctx=%u kv_port=%s",
            model_name(s->m), node_role_name(s->role), s->host, node_server_port(s->srv), mib,
            kv_pool_n_blocks(kv), kv_pool_block_size(kv), engine_n_ctx(s->e), kvport);
}

static void load_done(uv_work_t *w, int status)
{
    serve_ctx *s = w->data;
    s->loading = 0;
    if (status < 0 || s->load_rc < 0) {
        DX_LOGE("duplex serve: loading %s: %s", s->model_path,
                status < 0 ? uv_strerror(status) : s->load_err);
        s->exit_code = 1;
        teardown_engine(s);
        node_server_shutdown(s->srv); /* nothing running: stops at once */
        if (s->srv) on_stopped(s);
        return;
    }
    if (s->stopping) { /* a signal came while loading */
        on_stopped(s);
        return;
    }
    if (s->kv_port >= 0) {
        kvport_server_config kc = {.host = s->kv_host, .port = s->kv_port, .leases = s->leases,
                                   .hello = &s->hello};
        if (kvport_server_create(&s->loop, &kc, &s->kvsrv) < 0) {
            DX_LOGE("duplex serve: KV port %s:%d: %s", s->kv_host, s->kv_port, dx_errmsg());
            s->exit_code = 1;
            node_server_shutdown(s->srv);
            return;
        }
    }
    node_backend be;
    node_engine_backend(s->e, s->m, &be);
    node_server_set_backend(s->srv, &be);
    log_startup(s);
}

static void on_signal(uv_signal_t *h, int signum)
{
    serve_ctx *s = h->data;
    DX_LOGI("duplex serve: %s received", signum == SIGINT ? "SIGINT" : "SIGTERM");
    if (s->srv) node_server_shutdown(s->srv);
}

static int parse_role(const char *r, enum node_role *out)
{
    if (!strcmp(r, "both"))
        *out = NODE_ROLE_BOTH;
    else if (!strcmp(r, "prefill") || !strcmp(r, "decode")) {
        fprintf(stderr, "duplex serve: --role %s is not available yet (use both)\n", r);
        return 2;
    } else {
        fprintf(stderr, "duplex serve: --role wants prefill|decode|both, got '%s'\n", r);
        return 2;
    }
    return 0;
}

static int serve_run(serve_ctx *s, const node_server_config *cfg)
{
    uv_loop_init(&s->loop);
    int rc = node_server_create(&s->loop, cfg, &s->srv);
    if (rc < 0) {
        fprintf(stderr, "duplex serve: %s\n", dx_errmsg());
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
        return 1;
    }
    DX_LOGD("duplex serve: listening on %s:%d, loading %s", s->host, node_server_port(s->srv),
            s->model_path);
    uv_signal_init(&s->loop, &s->sig_int);
    uv_signal_init(&s->loop, &s->sig_term);
    s->sig_int.data = s->sig_term.data = s;
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    s->load.data = s;
    s->loading = 1;
    uv_queue_work(&s->loop, &s->load, load_work, load_done);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    return s->exit_code;
}

int cli_serve_main(int argc, char **argv)
{
    const char *path = NULL, *role = "both", *host = "127.0.0.1", *level = "info";
    long port = 8000, threads = 0, kv_mb = 1024, batch = 512, waiting = 256, ctx = 0;
    long req_timeout_ms = 30000, max_body_mb = 4;
    double grace = 10, pin_ttl = 30;
    long kv_port = -1, kv_blocks = 0;
    const char *kv_host = NULL, *kv_tls = NULL, *engine_id = NULL, *kv_dtype = "f16";
    const cli_opt opts[] = {
        {"model", CLI_STR, &path, 0, 0, "GGUF model file (required)"},
        {"role", CLI_STR, &role, 0, 0, "both (prefill|decode: later)"},
        {"host", CLI_STR, &host, 0, 0, "address to bind (default 127.0.0.1)"},
        {"port", CLI_INT, &port, 0, 65535, "port (default 8000; 0 = any free port)"},
        {"threads", CLI_INT, &threads, 0, 1024, "engine threads (default: cores)"},
        {"kv-cache-mb", CLI_INT, &kv_mb, 1, 1 << 22, "KV pool size (default 1024)"},
        {"max-batch-tokens", CLI_INT, &batch, 1, 1 << 16, "tokens per step (default 512)"},
        {"max-waiting", CLI_INT, &waiting, 1, 1 << 20, "queued requests before 503 (default 256)"},
        {"ctx", CLI_INT, &ctx, 0, 1 << 24, "max tokens per sequence (default: model's, <= 32768)"},
        {"request-timeout-ms", CLI_INT, &req_timeout_ms, 1, 3600000,
         "time a client has to send its request (default 30000)"},
        {"max-body-mb", CLI_INT, &max_body_mb, 1, 1024, "request body limit (default 4)"},
        {"shutdown-grace-s", CLI_DBL, &grace, 0.001, 86400, "drain time on SIGTERM (default 10)"},
        {"log-level", CLI_STR, &level, 0, 0, "error|warn|info|debug (default info)"},
        {"kv-blocks", CLI_INT, &kv_blocks, 0, 1 << 30, "KV pool size in blocks (overrides --kv-cache-mb)"},
        {"kv-dtype", CLI_STR, &kv_dtype, 0, 0, "KV cache dtype f16|bf16|f32 (default f16)"},
        {"kv-port", CLI_INT, &kv_port, 0, 65535, "KV port for peers' block reads (0 = any free; default off)"},
        {"kv-host", CLI_STR, &kv_host, 0, 0, "address of the KV port (default: --host)"},
        {"kv-transport-tls", CLI_STR, &kv_tls, 0, 0, "UCX_TLS for KV reads (default: UCX's choice)"},
        {"kv-pin-ttl-s", CLI_DBL, &pin_ttl, 0.1, 3600, "seconds an unreleased pin lives (default 30)"},
        {"engine-id", CLI_STR, &engine_id, 0, 0, "this node's engine id (default: host:port)"},
    };
    int rc = cli_parse("serve", "--model FILE [--role both] [--host H] [--port N] [...]", argc,
                       argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    enum dx_log_level lvl;
    enum node_role r;
    if (!path) {
        fprintf(stderr, "duplex serve: --model is required\n");
        return 2;
    }
    if (dx_log_parse_level(level, &lvl) < 0) {
        fprintf(stderr, "duplex serve: --log-level wants error|warn|info|debug\n");
        return 2;
    }
    if ((rc = parse_role(role, &r))) return rc;
    int kvt;
    if (engine_parse_kv_dtype(kv_dtype, &kvt)) {
        fprintf(stderr, "duplex serve: --kv-dtype: %s\n", dx_errmsg());
        return 2;
    }
    dx_log_set_level(lvl);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error code, not a death */
    oai_json_use_dx_alloc();
    serve_ctx s = {.model_path = path, .host = host, .role = r, .kv_port = (int)kv_port,
                   .kv_host = kv_host ? kv_host : host, .kv_tls = kv_tls, .pin_ttl_s = pin_ttl};
    if (engine_id && (!*engine_id || strlen(engine_id) >= sizeof s.engine_id_buf)) {
        fprintf(stderr, "duplex serve: --engine-id must be 1..%zu bytes\n",
                sizeof s.engine_id_buf - 1);
        return 2;
    }
    snprintf(s.engine_id_buf, sizeof s.engine_id_buf, "%s", engine_id ? engine_id : "");
    s.engine_id = s.engine_id_buf;
    s.ec = (engine_config){.n_threads = (int)threads,
                           .kv_cache_mb = (size_t)kv_mb,
                           .kv_dtype = kv_dtype,
                           .kv_blocks = (uint32_t)kv_blocks,
                           .max_batch_tokens = (uint32_t)batch,
                           .max_waiting = (uint32_t)waiting,
                           .n_ctx = (uint32_t)ctx};
    node_server_config cfg = {
        .host = host,
        .port = (int)port,
        .role = r,
        .max_body_bytes = (size_t)max_body_mb << 20,
        .request_timeout_ms = (uint64_t)req_timeout_ms,
        .shutdown_grace_s = grace,
        .on_stopped = on_stopped,
        .user = &s,
    };
    return serve_run(&s, &cfg);
}
