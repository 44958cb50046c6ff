/* router: the KV-aware router (`duplex router`) — an OpenAI-compatible HTTP
 * front for prefill and decode nodes that implements the router's side of
 * docs/pd.md and is described in docs/router.md.
 *
 * One libuv loop carries everything: the listening side (node/http_conn),
 * the upstream requests (router_up: curl multi), the health checks and the
 * conversation map (router_state).  A completion request is parsed,
 * stripped of client kv_transfer_params and conversation_id, keyed
 * (router_key), and sent either straight to a decode node ("local
 * prefill") or first to a prefill node with max_tokens 1 and then to a
 * decode node with the prefill node's params.  The decode node's answer is
 * proxied event by event; the params it returns are removed from what the
 * client sees and kept as the conversation's entry.
 *
 * The router owns its wiring: the HTTP server, the upstream client, the
 * tokenizer (--tokenizer: loaded without the weights) and the health timer;
 * the CLI parses flags and runs the loop. */
#ifndef ROUTER_H
#define ROUTER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "http/http_auth.h"
#include "http/http_conn.h"

enum router_mode { ROUTER_BIDIRECTIONAL, ROUTER_UNIDIRECTIONAL };

typedef struct router router;

/* What router_create puts in a field of router_config left 0 (plain
 * literals, for help text; the conversation map's bounds are
 * router_state.h's, the Redis calls' deadline router_store.h's). */
#define ROUTER_DEFAULT_CONVERSATION_TTL_S     450
#define ROUTER_DEFAULT_DECODE_MAX_OUTSTANDING 64
#define ROUTER_DEFAULT_HEALTH_INTERVAL_MS     1000
#define ROUTER_DEFAULT_PREFILL_TIMEOUT_S      300
#define ROUTER_DEFAULT_SHUTDOWN_GRACE_S       30
#define ROUTER_DEFAULT_RESPONSES_TTL_S        480 /* as the decode nodes' retention */
#define ROUTER_DEFAULT_RESPONSES_MAX_MB       256

typedef struct {
    const char *host;           /* default 127.0.0.1 */
    int port;                   /* 0 = ephemeral */
    const char *const *prefill; /* node base URLs ("http://host:port"), may be none */
    size_t n_prefill;
    const char *const *decode; /* at least one, unless discover is set */
    size_t n_decode;
    /* --discover redis://...: also take nodes from their registration keys
     * (http/node_reg.h) under state_prefix (below; NULL: NODE_REG_DEFAULT_PREFIX), read
     * every health_interval_ms; NULL: the static lists only. */
    const char *discover;
    enum router_mode mode;
    const char *tokenizer;     /* GGUF whose tokenizer counts prompt tokens, or NULL */
    double conversation_ttl_s; /* 0: ROUTER_DEFAULT_CONVERSATION_TTL_S */
    size_t max_conversations;  /* 0: ROUTER_STATE_DEFAULT_MAX_ENTRIES */
    size_t max_state_bytes;    /* stored params; 0: ROUTER_STATE_DEFAULT_MAX_MB */
    /* The conversation map: NULL in this process, else redis://HOST:PORT[/DB]
     * shared by every router replica (router_store.h); its keys' prefix
     * (NULL: NODE_REG_DEFAULT_PREFIX) and each Redis call's deadline. */
    const char *state_url;
    const char *state_prefix;
    int state_timeout_ms;
    /* The Responses API's stored responses (router_rsp.h): in state_url's
     * Redis when it is set, else here; kept this long from their last use
     * (default 480 s, the decode retention's) and, here, at most this many
     * bytes (default 256 MiB). */
    double responses_ttl_s;
    size_t responses_max_bytes;
    uint32_t local_prefill_max_tokens; /* uncached tokens below this skip the prefill node */
    uint32_t decode_max_outstanding;   /* affinity yields to load beyond it */
    uint64_t health_interval_ms;       /* node health checks */
    double prefill_timeout_s;          /* one prefill request's limit */
    http_limits http;                  /* what clients may use (node/http_conn.h; 0 = defaults) */
    double shutdown_grace_s;           /* drain time on a graceful stop */
    uint64_t key_seed;                 /* 0: random (tests fix it) */
    /* --api-key, --api-key-file, --internal-key-file (node/http_auth.h; the
     * router sends the internal key to its nodes), and --insecure-no-auth:
     * listen beyond loopback without API keys. */
    http_auth_config auth;
    int insecure_no_auth;
    /* Called on the loop thread when a shutdown has drained. */
    void (*on_stopped)(void *user);
    void *user;
} router_config;

/* Validates the config (every URL, no node twice, at least one decode
 * node, the keys, loopback unless API keys or insecure_no_auth), loads the
 * tokenizer, binds and starts the health checks.
 * DX_EINVAL / DX_EIO / ... with a message naming what was wrong. */
int router_create(uv_loop_t *loop, const router_config *cfg, router **out);
int router_port(const router *r);
/* For the start-up line: see http_auth_describe. */
void router_describe_auth(const router *r, char *out, size_t cap);
/* Stop accepting, let running requests finish for the grace period, then
 * end the rest and call on_stopped.  Idempotent. */
void router_shutdown(router *r);
/* Frees everything; run the loop afterwards so libuv can close the
 * handles.  NULL: no-op. */
void router_destroy(router *r);

/* "http://HOST:PORT" with an optional trailing "/": 0 and the normalised
 * URL (no trailing slash) in out, or DX_EINVAL saying what is wrong. */
int router_parse_url(const char *url, char *out, size_t cap);
const char *router_mode_name(enum router_mode m);
int router_parse_mode(const char *s, enum router_mode *out);

#endif
