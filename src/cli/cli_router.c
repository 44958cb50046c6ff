/* cli_router: `duplex router` — the KV-aware router in front of prefill and
 * decode nodes (src/router/router.h, docs/router.md).
 *
 * Parses and checks the flags (a bad URL, an empty list, a node named twice
 * or a bad mode exit 2 with a message naming the flag), prints the one
 * start-up line, and runs the router's loop until SIGINT/SIGTERM, which
 * drain it: stop accepting, let running requests finish, exit 0. */
#include "cli.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "http/node_reg.h"
#include "oai/oai_req.h"
#include "http/rds.h"
#include "router/router.h"
#include "router/router_state.h"
#include "router/router_store.h"

#define MAX_NODES 256

typedef struct {
    uv_loop_t loop;
    uv_signal_t sig_int, sig_term;
    router *r;
} router_ctx;

/* Splits "a,b,c" into urls[] (pointers into the copy *buf); exit code 2
 * with a message for an empty list or an empty or bad element. */
static int split_urls(const char *flag, const char *list, char **buf, const char **urls, size_t *n)
{
    *n = 0;
    if (!list) return 0;
    if (!*list) {
        fprintf(stderr, "duplex router: --%s: empty list (want URL[,URL...])\n", flag);
        return 2;
    }
    *buf = dx_strdup(list);
    if (!*buf) return 1;
    char *p = *buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        char norm[256];
        if (!*p) {
            fprintf(stderr, "duplex router: --%s: an empty entry in '%s'\n", flag, list);
            return 2;
        }
        if (*n == MAX_NODES) {
            fprintf(stderr, "duplex router: --%s: more than %d nodes\n", flag, MAX_NODES);
            return 2;
        }
        if (router_parse_url(p, norm, sizeof norm) < 0) {
            fprintf(stderr, "duplex router: --%s: %s\n", flag, dx_errmsg());
            return 2;
        }
        urls[(*n)++] = p;
        if (!comma) return 0;
        p = comma + 1;
    }
}

/* --state and --state-prefix: a typo here silently splits a cluster's
 * state, so they are checked before anything starts. */
static int check_state(const char *url, const char *prefix)
{
    rds_url u;
    if (url && rds_url_parse(url, &u) < 0) {
        fprintf(stderr, "duplex router: --state: %s\n", dx_errmsg());
        return 2;
    }
    if (router_store_check_prefix(prefix) < 0) {
        fprintf(stderr, "duplex router: %s\n", dx_errmsg());
        return 2;
    }
    return 0;
}

static void on_signal(uv_signal_t *h, int signum)
{
    router_ctx *x = h->data;
    DX_LOGI("duplex router: %s received", signum == SIGINT ? "SIGINT" : "SIGTERM");
    if (x->r) router_shutdown(x->r);
}

static void on_stopped(void *user)
{
    router_ctx *x = user;
    router_destroy(x->r);
    x->r = NULL;
    uv_close((uv_handle_t *)&x->sig_int, NULL);
    uv_close((uv_handle_t *)&x->sig_term, NULL);
}

static void list_str(const char *const *urls, size_t n, dx_buf *b)
{
    dx_buf_putc(b, '[');
    for (size_t i = 0; i < n; i++) dx_buf_printf(b, "%s%s", i ? "," : "", urls[i]);
    dx_buf_putc(b, ']');
}

static void log_startup(const router_config *c, const router *r)
{
    dx_buf p, d;
    dx_buf_init(&p, 0);
    dx_buf_init(&d, 0);
    list_str(c->prefill, c->n_prefill, &p);
    list_str(c->decode, c->n_decode, &d);
    char auth[96], state[RDS_HOST_MAX + 64] = "memory";
    router_describe_auth(r, auth, sizeof auth);
    char disc[RDS_HOST_MAX + NODE_REG_PREFIX_MAX + 64] = "off";
    rds_url u;
    if (c->state_url && rds_url_parse(c->state_url, &u) == 0)
        rds_url_format(&u, state, sizeof state);
    if (c->discover && rds_url_parse(c->discover, &u) == 0) {
        rds_url_format(&u, disc, sizeof disc);
        snprintf(disc + strlen(disc), sizeof disc - strlen(disc), " (%snode:*)",
                 c->state_prefix ? c->state_prefix : NODE_REG_DEFAULT_PREFIX);
    }
    DX_LOGI("duplex router: address=http://%s:%d mode=%s prefill=%s decode=%s discover=%s "
            "tokenizer=%s local_prefill_max_tokens=%u auth=%s state=%s",
            c->host, router_port(r),
            c->n_prefill || c->discover ? router_mode_name(c->mode) : "colocated", p.data, d.data,
            disc, c->tokenizer ? c->tokenizer : "none (~4 bytes per token)",
            c->local_prefill_max_tokens, auth, state);
    dx_buf_free(&p);
    dx_buf_free(&d);
}

static int run(router_config *cfg)
{
    router_ctx x = {0};
    uv_loop_init(&x.loop);
    cfg->on_stopped = on_stopped;
    cfg->user = &x;
    int rc = router_create(&x.loop, cfg, &x.r);
    if (rc < 0) {
        fprintf(stderr, "duplex router: %s\n", dx_errmsg());
        uv_run(&x.loop, UV_RUN_DEFAULT);
        uv_loop_close(&x.loop);
        return rc == DX_EINVAL ? 2 : 1;
    }
    log_startup(cfg, x.r);
    uv_signal_init(&x.loop, &x.sig_int);
    uv_signal_init(&x.loop, &x.sig_term);
    x.sig_int.data = x.sig_term.data = &x;
    uv_signal_start(&x.sig_int, on_signal, SIGINT);
    uv_signal_start(&x.sig_term, on_signal, SIGTERM);
    uv_run(&x.loop, UV_RUN_DEFAULT);
    uv_loop_close(&x.loop);
    return 0;
}

int cli_router_main(int argc, char **argv)
{
    const char *prefill = NULL, *decode = NULL, *host = "127.0.0.1", *tokenizer = NULL;
    const char *mode = "bidirectional", *level = "info";
    long port = CLI_DEFAULT_PORT, max_conv = ROUTER_STATE_DEFAULT_MAX_ENTRIES;
    long local_max = CLI_LOCAL_PREFILL_MAX_TOKENS, health_ms = ROUTER_DEFAULT_HEALTH_INTERVAL_MS;
    long max_out = ROUTER_DEFAULT_DECODE_MAX_OUTSTANDING, state_mb = ROUTER_STATE_DEFAULT_MAX_MB;
    cli_http_flags http = CLI_HTTP_FLAGS_INIT;
    double ttl = ROUTER_DEFAULT_CONVERSATION_TTL_S,
           prefill_timeout = ROUTER_DEFAULT_PREFILL_TIMEOUT_S;
    double grace = ROUTER_DEFAULT_SHUTDOWN_GRACE_S;
    cli_list api_keys = {.n = 0}, api_key_files = {.n = 0};
    const char *internal_key_file = NULL, *discover = NULL;
    const char *state = NULL, *state_prefix = NODE_REG_DEFAULT_PREFIX;
    long state_timeout = ROUTER_STORE_DEFAULT_TIMEOUT_MS;
    double rsp_ttl = ROUTER_DEFAULT_RESPONSES_TTL_S;
    long rsp_mb = ROUTER_DEFAULT_RESPONSES_MAX_MB;
    int insecure = 0;
    const cli_opt opts[] = {
        {"prefill", CLI_STR, &prefill, 0, 0,
         "prefill node URLs, comma-separated (none: colocated)"},
        {"decode", CLI_STR, &decode, 0, 0,
         "decode node URLs, comma-separated (required unless --discover)"},
        {"discover", CLI_STR, &discover, 0, 0,
         "redis://HOST:PORT[/DB]: also take the nodes registered there (serve --register)"},
        {"host", CLI_STR, &host, 0, 0, "address to bind (default 127.0.0.1)"},
        {"port", CLI_INT, &port, 0, 65535,
         "port (default " CLI_DEFAULT_INT(CLI_DEFAULT_PORT) "; 0 = any free port)"},
        {"tokenizer", CLI_PATH, &tokenizer, 0, 0, "GGUF whose tokenizer counts prompt tokens"},
        {"mode", CLI_STR, &mode, 0, 0, "bidirectional|unidirectional (default bidirectional)"},
        {"conversation-ttl", CLI_DBL, &ttl, 1, 1e7,
         "seconds a conversation is remembered "
         "(" CLI_DEFAULT_INT(ROUTER_DEFAULT_CONVERSATION_TTL_S) ")"},
        {"max-conversations", CLI_INT, &max_conv, 1, 1e9,
         "conversations kept (" CLI_DEFAULT_INT(ROUTER_STATE_DEFAULT_MAX_ENTRIES) ")"},
        {"max-state-mb", CLI_INT, &state_mb, 1, 1 << 20,
         "kv_transfer_params bytes kept (" CLI_DEFAULT_INT(ROUTER_STATE_DEFAULT_MAX_MB) ")"},
        {"state", CLI_STR, &state, 0, 0,
         "redis://HOST:PORT[/DB]: the conversation map in Redis, shared by every router "
         "(default: in this process)"},
        {"state-prefix", CLI_STR, &state_prefix, 0, 0,
         "Redis key prefix (default " NODE_REG_DEFAULT_PREFIX
         "): --state's keys, and the nodes' --register-prefix "
         "that --discover reads"},
        {"state-timeout-ms", CLI_INT, &state_timeout, 1, ROUTER_STORE_TIMEOUT_MAX,
         "deadline of each Redis call; past it the request routes without affinity "
         "(" CLI_DEFAULT_INT(ROUTER_STORE_DEFAULT_TIMEOUT_MS) ")"},
        {"responses-ttl", CLI_DBL, &rsp_ttl, 1, 86400 * 7,
         "seconds a stored response (previous_response_id) is kept from its last use "
         "(" CLI_DEFAULT_INT(ROUTER_DEFAULT_RESPONSES_TTL_S) ")"},
        {"responses-max-mb", CLI_INT, &rsp_mb, 1, 1 << 20,
         "stored responses' memory without --state (" CLI_DEFAULT_INT(
             ROUTER_DEFAULT_RESPONSES_MAX_MB) ")"},
        {"local-prefill-max-tokens", CLI_INT, &local_max, 0, 1 << 30,
         "uncached prompt tokens below this skip the prefill node "
         "(" CLI_DEFAULT_INT(CLI_LOCAL_PREFILL_MAX_TOKENS) ")"},
        {"decode-max-outstanding", CLI_INT, &max_out, 1, 1 << 20,
         "requests at a decode node beyond which affinity yields "
         "(" CLI_DEFAULT_INT(ROUTER_DEFAULT_DECODE_MAX_OUTSTANDING) ")"},
        {"health-interval-ms", CLI_INT, &health_ms, 10, 3600000,
         "node health checks (" CLI_DEFAULT_INT(ROUTER_DEFAULT_HEALTH_INTERVAL_MS) ")"},
        {"prefill-timeout-s", CLI_DBL, &prefill_timeout, 0.1, 86400,
         "prefill request limit (" CLI_DEFAULT_INT(ROUTER_DEFAULT_PREFILL_TIMEOUT_S) ")"},
        CLI_HTTP_OPTS(http),
        {"shutdown-grace-s", CLI_DBL, &grace, 0.001, 86400,
         "drain time on SIGTERM (" CLI_DEFAULT_INT(ROUTER_DEFAULT_SHUTDOWN_GRACE_S) ")"},
        {"log-level", CLI_STR, &level, 0, 0, "error|warn|info|debug (default info)"},
        CLI_API_KEY_OPTS(&api_keys, &api_key_files),
        {"internal-key-file", CLI_PATH, &internal_key_file, 0, 0,
         "the cluster's internal key, sent to the nodes"},
        {"insecure-no-auth", CLI_FLAG, &insecure, 0, 0,
         "allow a non-loopback --host without API keys"},
    };
    int rc = cli_parse("router", "--decode URL[,URL...] [--prefill URL[,URL...]] [--port N] [...]",
                       argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    enum dx_log_level lvl;
    router_config cfg = {0};
    if (!decode && !discover) {
        fprintf(stderr, "duplex router: --decode URL[,URL...] is required (or --discover "
                        "redis://... for registered nodes)\n");
        return 2;
    }
    rds_url ru;
    if (discover && rds_url_parse(discover, &ru) < 0) return cli_bad_value("router", "--discover");
    if (discover && node_reg_check_prefix(state_prefix, "--state-prefix") < 0) {
        fprintf(stderr, "duplex router: %s\n", dx_errmsg());
        return 2;
    }
    if (dx_log_parse_level(level, &lvl) < 0) return cli_bad_value("router", "--log-level");
    if (router_parse_mode(mode, &cfg.mode) < 0) return cli_bad_value("router", "--mode");
    if (check_state(state, state_prefix)) return 2;
    char *pbuf = NULL, *dbuf = NULL;
    const char *purls[MAX_NODES], *durls[MAX_NODES];
    size_t np = 0, nd = 0;
    rc = cli_http_limits("router", &http, &cfg.http);
    if (!rc) rc = split_urls("prefill", prefill, &pbuf, purls, &np);
    if (!rc) rc = split_urls("decode", decode, &dbuf, durls, &nd);
    if (!rc) {
        dx_log_set_level(lvl);
        signal(SIGPIPE, SIG_IGN); /* a peer gone mid-write is an error code, not a death */
        oai_json_use_dx_alloc();
        cfg.host = host;
        cfg.port = (int)port;
        cfg.prefill = purls;
        cfg.n_prefill = np;
        cfg.decode = durls;
        cfg.n_decode = nd;
        cfg.tokenizer = tokenizer;
        cfg.discover = discover;
        cfg.conversation_ttl_s = ttl;
        cfg.max_conversations = (size_t)max_conv;
        cfg.max_state_bytes = (size_t)state_mb << 20;
        cfg.state_url = state;
        cfg.state_prefix = state_prefix;
        cfg.state_timeout_ms = (int)state_timeout;
        cfg.responses_ttl_s = rsp_ttl;
        cfg.responses_max_bytes = (size_t)rsp_mb << 20;
        cfg.local_prefill_max_tokens = (uint32_t)local_max;
        cfg.decode_max_outstanding = (uint32_t)max_out;
        cfg.health_interval_ms = (uint64_t)health_ms;
        cfg.prefill_timeout_s = prefill_timeout;
        cfg.shutdown_grace_s = grace;
        cfg.auth = (http_auth_config){.api_keys = api_keys.v,
                                      .n_api_keys = api_keys.n,
                                      .api_key_files = api_key_files.v,
                                      .n_api_key_files = api_key_files.n,
                                      .internal_key_file = internal_key_file};
        cfg.insecure_no_auth = insecure;
        rc = run(&cfg);
    }
    dx_free(pbuf);
    dx_free(dbuf);
    cli_http_flags_free(&http);
    return rc;
}
