/* node_run: one node as a process — what `duplex serve` runs.
 *
 * The HTTP socket is bound first, so /health answers 503 while the model
 * loads (on libuv's thread pool); then the KV transfer side (node_kv) and
 * the engine start, one start-up line is logged, and completions are served.
 * SIGINT/SIGTERM start a graceful shutdown: stop accepting, let running
 * requests finish for the grace period, cancel the rest, tear down in
 * dependency order (node_kv.h), exit 0.
 *
 * Drain (SIGUSR1 or POST /admin/drain): no new requests, /health 503
 * {"status":"draining"}, but the HTTP port stays open and the KV port keeps
 * serving what the node retains; once nothing runs and no lease is left (or
 * --shutdown-grace-s after the drain began) the same shutdown follows.
 * With --register the node's key says "draining":true meanwhile and is
 * removed at the end. */
#ifndef NODE_RUN_H
#define NODE_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "http/http_auth.h"
#include "node/node_server.h"

typedef struct {
    const char *model_path;
    const char *host; /* default 127.0.0.1 */
    int port;
    enum node_role role;
    engine_config engine; /* threads, pool, dtype, batch, queue, context, prefix caching */
    http_limits http;     /* what clients may use (http_conn.h; 0 = defaults) */
    double shutdown_grace_s;
    /* KV port: -1 = off (the default for role both), 0 = any free port.
     * Roles prefill and decode always run one. */
    int kv_port;
    /* default: host, or 127.0.0.1 when host is not loopback and there is no
     * secret (a KV port hands out the whole pool: without a secret it stays
     * on loopback unless insecure_no_auth) */
    const char *kv_host;
    const char *kv_tls;
    const char *kv_secret_file; /* the cluster secret (kvport_auth.h); NULL: none */
    const char *kv_peers;       /* addresses pulls may go to (xfer_peers.h); NULL: loopback */
    /* --insecure-no-auth: listen beyond loopback without API keys (HTTP) or
     * without a secret (KV port) */
    int insecure_no_auth;
    double kv_peer_timeout_s;      /* longest wait for one reply from a holder (node_kv.h) */
    double kv_pull_timeout_s;      /* one whole pull (node_kv.h) */
    const char *engine_id;         /* default: host:port of the HTTP server */
    const char *served_model_name; /* NULL: the model file's name */
    /* --tool-call-parser auto|qwen|llama3|none, --reasoning-parser
     * auto|think|none (NULL: auto; checked by node_run_parse_parsers) */
    const char *tool_parser, *reasoning_parser;
    const char *chat_template; /* --chat-template FILE, or NULL: the model's */
    double pin_ttl_s, lease_ttl_s, retain_ttl_s;
    /* the Responses API's stored responses (node_server.h; 0: the defaults) */
    double responses_ttl_s;
    size_t responses_max_bytes;
    int bidirectional;
    uint32_t recompute_threshold;
    /* --api-key, --api-key-file, --internal-key-file, --trust-kv-params-from
     * (node/http_auth.h) */
    http_auth_config auth;
    /* --register redis://...: announce this node in Redis (node_reg.h);
     * NULL: off.  advertise_url: what routers use (NULL: from host and the
     * bound port); heartbeat_ms: 0 = NODE_REG_DEFAULT_HEARTBEAT_MS. */
    const char *register_url, *register_prefix, *advertise_url;
    uint32_t heartbeat_ms;
} node_run_config;

/* Runs until shutdown; returns the process exit code (0; 1 when the model,
 * the KV port or a key file could not be set up; 2 for a bad key or range,
 * or a non-loopback --host without API keys or --insecure-no-auth). */
int node_run(const node_run_config *cfg);

/* The parsers named by the flags, for a model whose chat template family
 * and text are given (auto: the family's tool-call format; reasoning when
 * the template mentions <think>).  DX_EINVAL naming the flag otherwise. */
int node_run_parsers(const node_run_config *c, enum chat_tmpl_kind kind, const char *tmpl,
                     int *tool_fmt, int *reasoning);

#endif
