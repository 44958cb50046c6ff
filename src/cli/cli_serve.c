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
    int load_rc, loading, stopping, exit_code;
    char load_err[512];
} serve_ctx;

static void load_work(uv_work_t *w)
{
    serve_ctx *s = w->data;
    s->load_rc = model_load(s->model_path, &s->m);
    if (s->load_rc == 0) s->load_rc = engine_create(&s->ec, s->m, &s->e);
    if (s->load_rc < 0) snprintf(s->load_err, sizeof s->load_err, "%s", dx_errmsg());
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
    engine_destroy(s->e);
    s->e = NULL;
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
    DX_LOGI("duplex serve: model=%s role=%s address=http://%s:%d kv_pool=%.0fMiB "
            "(%u blocks x %u tokens) n_ctx=%u",
            model_name(s->m), node_role_name(s->role), s->host, node_server_port(s->srv), mib,
            kv_pool_n_blocks(kv), kv_pool_block_size(kv), engine_n_ctx(s->e));
}

static void load_done(uv_work_t *w, int status)
{
    serve_ctx *s = w->data;
    s->loading = 0;
    if (status < 0 || s->load_rc < 0) {
        DX_LOGE("duplex serve: loading %s: %s", s->model_path,
                status < 0 ? uv_strerror(status) : s->load_err);
        s->exit_code = 1;
        engine_destroy(s->e);
        s->e = NULL;
        node_server_shutdown(s->srv); /* nothing running: stops at once */
        if (s->srv) on_stopped(s);
        return;
    }
    if (s->stopping) { /* a signal came while loading */
        on_stopped(s);
        return;
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
    double grace = 10;
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
    dx_log_set_level(lvl);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error code, not a death */
    oai_json_use_dx_alloc();
    serve_ctx s = {.model_path = path, .host = host, .role = r};
    s.ec = (engine_config){.n_threads = (int)threads,
                           .kv_cache_mb = (size_t)kv_mb,
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
