/* node_server: the node's OpenAI-compatible HTTP API on a libuv loop.
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions (JSON or SSE),
 * POST /tokenize, POST /detokenize, GET /v1/models, GET /health, GET
 * /metrics (HEAD like GET).  The server reaches the engine through
 * node_backend, a table of functions over engine_* and the model's
 * tokenizer (node_engine.h), which keeps the tokenizer and chat template out
 * of this file; a request's parsing and tokenising run on a small work pool
 * (work_pool.h), so encode_chat and encode_text are called off the loop, on
 * several threads at once.  Engine events
 * arrive on the engine's thread, are copied under a mutex into the
 * request's own reused buffers (no allocation per token), the request is
 * put on a ready list and the loop is woken with uv_async_send; only the
 * loop thread touches sockets.
 *
 * Prefill/decode (docs/pd.md, node_pd.c): with a node_kv the server reads
 * each request's kv_transfer_params, reuses its own prefix cache, pulls
 * blocks from the node the params name (on a worker thread, before the
 * request reaches the engine), holds the finished request's blocks under a
 * lease and answers with its own params.  Without one, params are ignored. */
#ifndef NODE_SERVER_H
#define NODE_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "engine/engine.h"
#include "model/chat_tmpl.h"
#include "model/model_chat.h"
#include "http/http_auth.h"
#include "http/http_conn.h"
#include "node/node_kv.h"

enum node_role { NODE_ROLE_BOTH, NODE_ROLE_PREFILL, NODE_ROLE_DECODE };

#define NODE_MAX_END_IDS 40

typedef struct {
    void *self;
    /* engine_submit / engine_cancel / engine_get_stats semantics. */
    int (*submit)(void *self, const engine_request *req, uint64_t *id);
    int (*cancel)(void *self, uint64_t id);
    void (*stats)(void *self, engine_stats *out);
    /* Tokenise chat messages with the model's template (generation prompt
     * appended; the request's tools and template arguments in x; replies
     * through `reply`, see model_chat_encode) or plain text; *ids is
     * dx_malloc'd. */
    int (*encode_chat)(void *self, const chat_msg *msgs, size_t n, const model_chat_extra *x,
                       chat_reply_fn reply, void *reply_user, int32_t **ids, size_t *n_ids);
    int (*encode_text)(void *self, const char *text, size_t len, int32_t **ids, size_t *n_ids);
    const char *model_name;
    uint32_t n_vocab, n_ctx;
    const tok *tk;
    /* Tokens that end a reply: the vocabulary's end-of-generation set
     * (tok_is_eog: EOS, EOT and every end-of-turn token) and the chat
     * template's end of turn. */
    int32_t end_ids[NODE_MAX_END_IDS];
    size_t n_end;
    node_kv *kv; /* the node's KV port and leases; NULL: kv_transfer_params are ignored */
    /* Agentic answers (docs/api.md): the tool-call format the model writes
     * (enum oai_tools_fmt; parsed when a request has tools), and whether
     * <think>…</think> is returned as reasoning_content. */
    int tool_fmt;
    int reasoning;
    /* Prepares what constrained decoding needs once per model (the
     * vocabulary for grammars; engine_gram_vocab), called off the loop
     * before a request with a grammar is submitted.  NULL: nothing to do. */
    int (*gram_prepare)(void *self);
} node_backend;

typedef struct node_server node_server;

/* Drain time on a graceful stop unless the config says (a plain literal,
 * for help text). */
#define NODE_SERVER_DEFAULT_SHUTDOWN_GRACE_S 10
/* The Responses API's stored responses: kept as long as the reply memory
 * (its TTL unless configured) and in at most this much memory. */
#define NODE_DEFAULT_RESPONSES_TTL_S     480
#define NODE_DEFAULT_RESPONSES_MAX_BYTES ((size_t)256 << 20)

typedef struct {
    const char *host; /* default 127.0.0.1 */
    int port;         /* 0 = ephemeral */
    enum node_role role;
    http_limits http;        /* what clients may use (http_conn.h; 0 = defaults) */
    double shutdown_grace_s; /* 0: NODE_SERVER_DEFAULT_SHUTDOWN_GRACE_S */
    /* The name /v1/models lists and answers carry (--served-model-name);
     * requests may name it or the model file's name.  NULL: the file's. */
    const char *served_model_name;
    /* Callers' credentials (API keys, the internal key, trusted ranges);
     * NULL: no keys, kv_transfer_params from loopback callers only.
     * Borrowed: it must outlive the server. */
    const http_auth *auth;
    /* P/D (docs/pd.md) */
    int bidirectional;            /* --bidirectional-kv-xfer */
    uint32_t recompute_threshold; /* 0: node_pd's default; 1 pulls anything */
    int no_prefix_cache;          /* --no-enable-prefix-caching */
    double history_ttl_s;         /* memory of generated replies; 0: HIST_DEFAULT_TTL_S */
    int prep_threads;             /* threads preparing requests off the loop; default 2 */
    uint32_t grammar_cache;       /* compiled structured-output grammars kept; default 64 */
    /* The Responses API's stored responses (previous_response_id, GET
     * /v1/responses/{id}): kept this long from their last use (default: the
     * reply memory's TTL) and at most this many bytes (default 256 MiB). */
    double responses_ttl_s;
    size_t responses_max_bytes;
    /* Called on the loop thread when a shutdown has drained. */
    void (*on_stopped)(void *user);
    /* POST /admin/drain (authorised): the owner drains (node_server_drain)
     * and decides when to stop; NULL: node_server_drain alone. */
    void (*on_drain)(void *user);
    void *user;
} node_server_config;

int node_server_create(uv_loop_t *loop, const node_server_config *cfg, node_server **out);
int node_server_port(const node_server *s);
/* The model is loaded: start serving completions (until now /health is 503).
 * The table is copied. */
void node_server_set_backend(node_server *s, const node_backend *b);
/* Stop accepting, let running requests finish for the grace period, cancel
 * what remains, then call on_stopped.  Idempotent. */
void node_server_shutdown(node_server *s);
/* Stop taking requests (503, /health 503 {"status":"draining"}) but keep
 * listening and serving the running ones; no stop by itself (the owner
 * calls node_server_shutdown when it is done).  Idempotent. */
void node_server_drain(node_server *s);
/* Requests whose final event has not been handled yet. */
size_t node_server_n_active(const node_server *s);
/* Call after the backend can deliver no more events (engine destroyed);
 * run the loop afterwards so libuv can close the handles.  NULL: no-op. */
void node_server_destroy(node_server *s);
const char *node_role_name(enum node_role r);

#endif
