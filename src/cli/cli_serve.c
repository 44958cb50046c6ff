/* cli_serve: `duplex serve` — parses the flags of one node and runs it
 * (node/node_run.h owns everything else: loading, the KV port, P/D roles,
 * signals, teardown). */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_err.h"
#include "base/dx_log.h"
#include "engine/engine.h"
#include "base/dx_addr.h"
#include "http/node_reg.h"
#include "node/node_pd.h"
#include "node/node_run.h"
#include "xfer/xfer_client.h"

static int parse_role(const char *r, enum node_role *out)
{
    if (!strcmp(r, "both"))
        *out = NODE_ROLE_BOTH;
    else if (!strcmp(r, "prefill"))
        *out = NODE_ROLE_PREFILL;
    else if (!strcmp(r, "decode"))
        *out = NODE_ROLE_DECODE;
    else {
        fprintf(stderr, "duplex serve: --role wants prefill|decode|both, got '%s'\n", r);
        return 2;
    }
    return 0;
}

typedef struct {
    const char *path, *role, *host, *level, *kv_host, *kv_tls, *engine_id, *kv_dtype, *served;
    const char *tool_parser, *reasoning_parser, *chat_template, *kv_secret, *kv_peers;
    long port, threads, kv_mb, batch, seqs, waiting, ctx, kv_port, kv_blocks, threshold;
    cli_http_flags http;
    double grace, pin_ttl, lease_ttl, retain_ttl, kv_peer_timeout, kv_pull_timeout, rsp_ttl;
    long rsp_mb;
    int bidirectional, prefix_on, prefix_off, insecure;
    cli_list api_keys, api_key_files, trust_from;
    const char *internal_key_file;
    const char *reg, *reg_prefix, *advertise;
    long heartbeat;
} serve_flags;

/* --register and the flags that only make sense with it. */
static int register_config(const serve_flags *f, node_run_config *c)
{
    rds_url u;
    char url[NODE_REG_URL_MAX];
    if (!f->reg) {
        const char *lone = f->reg_prefix  ? "--register-prefix"
                           : f->advertise ? "--advertise-url"
                           : f->heartbeat ? "--heartbeat-ms"
                                          : NULL;
        if (lone) fprintf(stderr, "duplex serve: %s needs --register redis://...\n", lone);
        return lone ? 2 : 0;
    }
    if (rds_url_parse(f->reg, &u)) return cli_bad_value("serve", "--register");
    if (f->reg_prefix && node_reg_check_prefix(f->reg_prefix, "--register-prefix")) {
        fprintf(stderr, "duplex serve: %s\n", dx_errmsg());
        return 2;
    }
    if (f->advertise && dx_addr_http_url(f->advertise, url, sizeof url))
        return cli_bad_value("serve", "--advertise-url");
    if (!f->advertise &&
        (!strcmp(f->host, "0.0.0.0") || !strcmp(f->host, "::") || !strcmp(f->host, "[::]"))) {
        fprintf(stderr,
                "duplex serve: --register with --host %s needs --advertise-url "
                "http://HOST:PORT (the address routers reach this node at)\n",
                f->host);
        return 2;
    }
    c->register_url = f->reg;
    c->register_prefix = f->reg_prefix;
    c->advertise_url = f->advertise;
    c->heartbeat_ms = (uint32_t)f->heartbeat;
    return 0;
}

/* Cross-flag checks and the run configuration. */
static int to_config(serve_flags *f, node_run_config *c)
{
    enum dx_log_level lvl;
    int kvt;
    memset(c, 0, sizeof *c);
    if (!f->path) return cli_required("serve", "--model FILE");
    if (dx_log_parse_level(f->level, &lvl) < 0) return cli_bad_value("serve", "--log-level");
    if (parse_role(f->role, &c->role)) return 2;
    if (engine_parse_kv_dtype(f->kv_dtype, &kvt)) return cli_bad_value("serve", "--kv-dtype");
    if (f->prefix_on && f->prefix_off) {
        fprintf(stderr, "duplex serve: --enable-prefix-caching and --no-enable-prefix-caching "
                        "contradict each other\n");
        return 2;
    }
    if (f->served && (!*f->served || strlen(f->served) > 200)) {
        fprintf(stderr, "duplex serve: --served-model-name must be 1..200 bytes\n");
        return 2;
    }
    if (f->engine_id && (!*f->engine_id || strlen(f->engine_id) > 128)) {
        fprintf(stderr, "duplex serve: --engine-id must be 1..128 bytes\n");
        return 2;
    }
    dx_log_set_level(lvl);
    c->model_path = f->path;
    c->host = f->host;
    c->port = (int)f->port;
    c->engine = (engine_config){.n_threads = (int)f->threads,
                                .kv_cache_mb = (size_t)f->kv_mb,
                                .kv_dtype = f->kv_dtype,
                                .kv_blocks = (uint32_t)f->kv_blocks,
                                .max_batch_tokens = (uint32_t)f->batch,
                                .max_seqs = (uint32_t)f->seqs,
                                .max_waiting = (uint32_t)f->waiting,
                                .n_ctx = (uint32_t)f->ctx,
                                .no_prefix_cache = f->prefix_off};
    int rc = cli_http_limits("serve", &f->http, &c->http);
    if (rc) return rc;
    c->shutdown_grace_s = f->grace;
    c->kv_port = (int)f->kv_port;
    c->kv_host = f->kv_host;
    c->kv_tls = f->kv_tls;
    c->kv_secret_file = f->kv_secret;
    c->kv_peers = f->kv_peers;
    c->insecure_no_auth = f->insecure;
    c->kv_peer_timeout_s = f->kv_peer_timeout;
    c->kv_pull_timeout_s = f->kv_pull_timeout;
    c->engine_id = f->engine_id;
    c->served_model_name = f->served;
    c->tool_parser = f->tool_parser;
    c->chat_template = f->chat_template;
    c->reasoning_parser = f->reasoning_parser;
    int fmt, reasoning; /* the names, checked now: the model loads after the socket opens */
    if (node_run_parsers(c, CHAT_TMPL_CHATML, NULL, &fmt, &reasoning)) {
        fprintf(stderr, "duplex serve: %s\n", dx_errmsg());
        return 2;
    }
    if ((rc = register_config(f, c))) return rc;
    c->pin_ttl_s = f->pin_ttl;
    c->lease_ttl_s = f->lease_ttl;
    c->retain_ttl_s = f->retain_ttl;
    c->responses_ttl_s = f->rsp_ttl;
    c->responses_max_bytes = (size_t)f->rsp_mb << 20;
    c->bidirectional = f->bidirectional;
    c->recompute_threshold = (uint32_t)(f->threshold ? f->threshold : 1);
    c->auth = (http_auth_config){.api_keys = f->api_keys.v,
                                 .n_api_keys = f->api_keys.n,
                                 .api_key_files = f->api_key_files.v,
                                 .n_api_key_files = f->api_key_files.n,
                                 .internal_key_file = f->internal_key_file,
                                 .trust_kv_from = f->trust_from.v,
                                 .n_trust_kv_from = f->trust_from.n};
    return 0;
}

int cli_serve_main(int argc, char **argv)
{
    serve_flags f = {.role = "both",
                     .host = "127.0.0.1",
                     .level = "info",
                     .kv_dtype = ENGINE_DEFAULT_KV_DTYPE,
                     .port = CLI_DEFAULT_PORT,
                     .kv_mb = ENGINE_DEFAULT_KV_CACHE_MB,
                     .batch = ENGINE_DEFAULT_MAX_BATCH_TOKENS,
                     .seqs = ENGINE_DEFAULT_MAX_SEQS,
                     .waiting = ENGINE_DEFAULT_MAX_WAITING,
                     .http = CLI_HTTP_FLAGS_INIT,
                     .kv_port = -1,
                     .threshold = NODE_PD_DEFAULT_RECOMPUTE_THRESHOLD,
                     .grace = NODE_SERVER_DEFAULT_SHUTDOWN_GRACE_S,
                     .pin_ttl = XFER_LEASE_DEFAULT_PIN_TTL_S,
                     .lease_ttl = NODE_KV_DEFAULT_LEASE_TTL_S,
                     .retain_ttl = NODE_KV_DEFAULT_RETAIN_TTL_S,
                     .kv_peer_timeout = XFER_DEFAULT_PEER_TIMEOUT_S,
                     .kv_pull_timeout = XFER_DEFAULT_PULL_TIMEOUT_S};
    const cli_opt opts[] = {
        {"model", CLI_PATH, &f.path, 0, 0, "GGUF model file (required)"},
        {"role", CLI_STR, &f.role, 0, 0, "prefill|decode|both (default both)"},
        {"host", CLI_STR, &f.host, 0, 0, "address to bind (default 127.0.0.1)"},
        {"port", CLI_INT, &f.port, 0, 65535,
         "port (default " CLI_DEFAULT_INT(CLI_DEFAULT_PORT) "; 0 = any free port)"},
        {"threads", CLI_INT, &f.threads, 0, 1024, "engine threads (default: cores)"},
        {"kv-cache-mb", CLI_INT, &f.kv_mb, 1, 1 << 22,
         CLI_HELP_DEFAULT("KV pool size", ENGINE_DEFAULT_KV_CACHE_MB)},
        {"max-batch-tokens", CLI_INT, &f.batch, 1, 1 << 16,
         CLI_HELP_DEFAULT("tokens per step", ENGINE_DEFAULT_MAX_BATCH_TOKENS)},
        {"max-seqs", CLI_INT, &f.seqs, 1, 4096,
         CLI_HELP_DEFAULT("requests running at once", ENGINE_DEFAULT_MAX_SEQS)},
        {"max-waiting", CLI_INT, &f.waiting, 1, 1 << 20,
         CLI_HELP_DEFAULT("queued requests before 503", ENGINE_DEFAULT_MAX_WAITING)},
        {"ctx", CLI_INT, &f.ctx, 0, 1 << 24,
         "max tokens per sequence (default: the model's, "
         "at most " CLI_DEFAULT_INT(ENGINE_DEFAULT_MAX_CTX) "; at most the model's)"},
        CLI_HTTP_OPTS(f.http),
        {"shutdown-grace-s", CLI_DBL, &f.grace, 0.001, 86400,
         CLI_HELP_DEFAULT("drain time on SIGTERM, SIGUSR1 and `duplex node drain`",
                          NODE_SERVER_DEFAULT_SHUTDOWN_GRACE_S)},
        {"log-level", CLI_STR, &f.level, 0, 0, "error|warn|info|debug (default info)"},
        {"kv-blocks", CLI_INT, &f.kv_blocks, 0, 1 << 30,
         "KV pool size in blocks (overrides --kv-cache-mb)"},
        {"kv-dtype", CLI_STR, &f.kv_dtype, 0, 0, CLI_KV_DTYPE_HELP},
        {"enable-prefix-caching", CLI_FLAG, &f.prefix_on, 0, 0, "reuse cached prefixes (default)"},
        {"no-enable-prefix-caching", CLI_FLAG, &f.prefix_off, 0, 0,
         "never reuse KV this node computed for earlier requests"},
        {"kv-port", CLI_INT, &f.kv_port, 0, 65535,
         "KV port for peers' block reads (0 = any free; default off for role both, any free "
         "for prefill/decode)"},
        {"kv-host", CLI_STR, &f.kv_host, 0, 0,
         "address of the KV port (default: --host; without a secret, loopback only)"},
        {"kv-secret-file", CLI_PATH, &f.kv_secret, 0, 0,
         "cluster secret the KV port's peers must prove (every node the same)"},
        {"kv-peers", CLI_STR, &f.kv_peers, 0, 0,
         "HOST[:PORT],... KV ports this node may pull from (default: loopback only)"},
        {"kv-peer-timeout-s", CLI_DBL, &f.kv_peer_timeout, 0.1, 3600,
         CLI_HELP_DEFAULT("a holder silent this long is dead: the pull recomputes",
                          XFER_DEFAULT_PEER_TIMEOUT_S)},
        {"kv-pull-timeout-s", CLI_DBL, &f.kv_pull_timeout, 0.1, 86400,
         CLI_HELP_DEFAULT("longest one KV pull may take before the request recomputes",
                          XFER_DEFAULT_PULL_TIMEOUT_S)},
        {"kv-transport-tls", CLI_STR, &f.kv_tls, 0, 0,
         "UCX_TLS for KV reads (default: UCX's choice)"},
        {"kv-pin-ttl-s", CLI_DBL, &f.pin_ttl, 0.1, 3600,
         CLI_HELP_DEFAULT("seconds an unreleased pin lives", XFER_LEASE_DEFAULT_PIN_TTL_S)},
        {"engine-id", CLI_STR, &f.engine_id, 0, 0, "this node's engine id (default: host:port)"},
        {"chat-template", CLI_PATH, &f.chat_template, 0, 0,
         "a Jinja chat template file instead of the model's"},
        {"tool-call-parser", CLI_STR, &f.tool_parser, 0, 0,
         "auto|qwen|llama3|none: tool calls in answers (auto: the template's family)"},
        {"reasoning-parser", CLI_STR, &f.reasoning_parser, 0, 0,
         "auto|think|none: <think> as reasoning_content (auto: if the template has it)"},
        {"served-model-name", CLI_STR, &f.served, 0, 0,
         "the model's name in the API (default: the file's; both are accepted)"},
        {"bidirectional-kv-xfer", CLI_FLAG, &f.bidirectional, 0, 0,
         "decode: retain finished requests' KV; prefill: pull history from decode nodes"},
        {"responses-ttl", CLI_DBL, &f.rsp_ttl, 1, 86400 * 7,
         "seconds a stored response (previous_response_id) is kept from its last use "
         "(default: --decoder-kv-blocks-ttl)"},
        {"responses-max-mb", CLI_INT, &f.rsp_mb, 1, 1 << 20,
         "stored responses' memory, least recently used out first (default 256)"},
        {"decoder-kv-blocks-ttl", CLI_DBL, &f.retain_ttl, 1, 86400 * 7,
         CLI_HELP_DEFAULT("seconds a node retains a finished request's KV",
                          NODE_KV_DEFAULT_RETAIN_TTL_S)},
        {"kv-recompute-threshold", CLI_INT, &f.threshold, 0, 1 << 24,
         CLI_HELP_DEFAULT("fewer reusable remote tokens than this: recompute",
                          NODE_PD_DEFAULT_RECOMPUTE_THRESHOLD)},
        {"kv-lease-ttl", CLI_DBL, &f.lease_ttl, 0.1, 86400,
         CLI_HELP_DEFAULT("seconds a prefill node holds a prompt's KV for its decode node",
                          NODE_KV_DEFAULT_LEASE_TTL_S)},
        CLI_API_KEY_OPTS(&f.api_keys, &f.api_key_files),
        {"internal-key-file", CLI_PATH, &f.internal_key_file, 0, 0,
         "the cluster's internal key: callers presenting it may send kv_transfer_params"},
        {"trust-kv-params-from", CLI_LIST, &f.trust_from, 0, 0,
         "CIDR whose callers may send kv_transfer_params (repeatable)"},
        {"register", CLI_STR, &f.reg, 0, 0,
         "redis://HOST:PORT[/DB]: announce this node to routers (--discover) in Redis"},
        {"register-prefix", CLI_STR, &f.reg_prefix, 0, 0,
         "the registration key's prefix (default " NODE_REG_DEFAULT_PREFIX ")"},
        {"advertise-url", CLI_STR, &f.advertise, 0, 0,
         "http://HOST:PORT routers use for this node (default: from --host and --port)"},
        {"heartbeat-ms", CLI_INT, &f.heartbeat, 50, 600000,
         CLI_HELP_DEFAULT("registration refresh interval; the key lives 3 times this",
                          NODE_REG_DEFAULT_HEARTBEAT_MS)},
        {"insecure-no-auth", CLI_FLAG, &f.insecure, 0, 0,
         "allow a non-loopback --host without API keys, and a KV port off loopback without "
         "--kv-secret-file (anyone reaching them is trusted)"},
    };
    int rc = cli_parse("serve", "--model FILE [--role prefill|decode|both] [--port N] [...]", argc,
                       argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    node_run_config c;
    if (!(rc = to_config(&f, &c))) rc = node_run(&c);
    cli_http_flags_free(&f.http);
    return rc;
}
