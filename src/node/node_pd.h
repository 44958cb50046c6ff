/* node_pd: the prefill/decode steps of one completion request
 * (docs/pd.md), for the node server.
 *
 *   node_pd_parse       the request's kv_transfer_params; what the node will
 *                       hold when the request ends
 *   (tokenise)          a chat prompt goes through hist with the params'
 *                       sequence and the node's reply memory
 *                       (node_pd_hist_src), so prefill and decode nodes
 *                       agree on the tokens wherever they can
 *                       (these two run on a preparation thread: they read
 *                       the configuration only and leave their counts in
 *                       the request's node_pd_req)
 *   node_pd_prepared    (loop) those counts into the metrics
 *   node_pd_plan        this node's cached prefix, and — when the params name
 *                       a holder that can supply at least the threshold more
 *                       tokens — a pull on a worker thread; when it ends,
 *                       whatever its outcome, cfg.on_pulled hands the request
 *                       back to the server, which submits it
 *   node_pd_on_kv       (engine thread) the finished request's blocks go
 *                       under a lease
 *   node_pd_finish      the answer's kv_transfer_params, the reply memory,
 *                       the metrics
 *
 * P/D knows nothing of the server's request: it works on its own state
 * (node_pd_req, one per request) and on a view of the request the server
 * fills (node_pd_view), and it reaches the server only through the
 * on_pulled callback, so the server can call it and never the reverse.
 *
 * Anything wrong on the reuse path means computing the tokens instead, and a
 * counter says why; a cache problem never fails the request. */
#ifndef NODE_PD_H
#define NODE_PD_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "base/dx_buf.h"
#include "engine/engine.h"
#include "node/hist.h"
#include "node/kvtp.h"
#include "node/node_kv.h"
#include "http/prom.h"
#include "oai/oai_req.h"

enum node_pd_hold {
    NODE_PD_HOLD_NONE = 0,
    NODE_PD_HOLD_FOR_DECODE, /* do_remote_decode: a single-use lease for the decode node */
    NODE_PD_HOLD_RETAIN,     /* --bidirectional-kv-xfer decode side: prompt and answer */
};

/* Fewer reusable remote tokens than this and the request recomputes
 * instead of pulling, unless the config says (a plain literal, for help
 * text). */
#define NODE_PD_DEFAULT_RECOMPUTE_THRESHOLD 64

/* What P/D needs of the node, given once the model is loaded
 * (node_pd_configure): before that no request reaches P/D. */
typedef struct {
    uv_loop_t *loop; /* pulls run on its worker threads */
    node_kv *kv;     /* the KV port and leases; NULL: kv_transfer_params are ignored */
    const tok *tk;
    const int32_t *end_ids; /* tokens that end a reply */
    size_t n_end;
    uint32_t n_vocab, n_ctx;
    hist_mem *mem; /* the node's reply memory, or NULL */
    int prefill;   /* the node's role is prefill: it never retains */
    int bidirectional, no_prefix_cache;
    uint32_t recompute_threshold; /* 0: NODE_PD_DEFAULT_RECOMPUTE_THRESHOLD */
    /* Loop: the pull node_pd_plan started is over, whatever its outcome;
     * user is the one node_pd_plan was given, and the request goes to the
     * engine now. */
    void (*on_pulled)(void *user);
} node_pd_config;

typedef struct {
    uint64_t tokens_local, tokens_pulled, tokens_computed;
    uint64_t pulls[2], pull_blocks[2], pull_bytes[2]; /* [0] prefill→decode, [1] decode→prefill */
    uint64_t fallbacks[NODE_KV_N_FALLBACKS];
    uint64_t below_threshold, params_ignored, params_untrusted, holds, hold_failed;
    uint64_t first_from_prefill; /* requests whose first token came with the params */
    uint64_t replies_from_seq, replies_from_mem, replies_retokenised;
    prom_hist pull_seconds;
} node_pd_stats;

/* The node's P/D: its configuration and its counters. */
typedef struct {
    node_pd_config cfg;
    node_pd_stats st; /* loop thread only */
} node_pd;

/* What P/D reads of a request, filled by the server for each call.  Every
 * field is fixed once the request is prepared (the prompt once tokenised),
 * so the engine thread may read them too. */
typedef struct {
    const char *id;      /* logs and the answer's params; lives as long as the request */
    int chat;            /* a chat completion (the reply memory is for chats) */
    int trusted;         /* the caller may give kv_transfer_params (http_auth.h) */
    const uint8_t *salt; /* HTTP_AUTH_SALT bytes: the prefix-cache and reply-memory namespace */
    const int32_t *prompt;
    size_t n_prompt;
    int has_max_tokens;
    uint32_t max_tokens;
    int logprobs; /* logprobs asked for */
} node_pd_view;

/* How a request ended (node_pd_finish). */
typedef struct {
    enum engine_finish finish;
    uint32_t n_prompt, n_cached; /* the engine's figures */
    int lost;                    /* text was lost: the answer is incomplete */
    int kept;                    /* text holds all the client got (node_pd_wants_text) */
    const char *text;
    size_t text_len;
} node_pd_end;

/* One request's P/D state. */
typedef struct {
    int has_params; /* kv_transfer_params given, and the node has a KV port */
    kvtp in;
    int self; /* the params name this very node */
    int hold; /* enum node_pd_hold */
    int memo; /* remember the reply in the node's memory */
    int d2p;  /* a pull here brings a decode node's history to a prefill node */
    /* The prompt's leading blocks handed to the engine: [0, n_local) from
     * this node's cache, then n_pulled pulled.  Referenced by us while
     * owns_blocks, by the engine once it has the request. */
    int32_t *blocks;
    size_t n_local, n_pulled;
    int owns_blocks;
    kv_hash *chain;
    node_kv_pull pull;
    uv_work_t work;
    int pulling;
    int below_threshold;
    /* The pull's, from node_pd_plan: its node, the view's id (its log
     * line) and the user handed back to cfg.on_pulled. */
    node_pd *owner;
    const char *id;
    void *user;
    /* Preparation → loop (node_pd_prepared). */
    int params_ignored;   /* params given to a node without a KV port */
    int params_untrusted; /* params from a caller without the internal key */
    uint32_t from_seq, from_mem, retokenised;
    /* Engine thread → loop (written before the DONE event hands q over). */
    int held, hold_failed;
    xfer_token lease;
    int32_t *held_ids;
    size_t n_held;
    int32_t *seq; /* the sequence's tokens at the end (prompt and reply) */
    size_t n_seq;
    /* A prefill node's: the tokens it generated (first_token_ids).  A decode
     * node's: n_first of the params' first_token_ids apply to our prompt. */
    int32_t first[KVTP_MAX_FIRST];
    size_t n_first;
    char log[192]; /* node_pd_log_suffix */
} node_pd_req;

void node_pd_init(node_pd *p); /* the counters; no configuration yet */
void node_pd_configure(node_pd *p, const node_pd_config *cfg);
void node_pd_free(node_pd *p);

/* params: the request's kv_transfer_params (oai_req's), or NULL.  0, or
 * DX_EINVAL with *err filled (a bad field). */
int node_pd_parse(const node_pd *p, node_pd_req *pd, const node_pd_view *v, const void *params,
                  oai_err *err);
void node_pd_hist_src(const node_pd *p, const node_pd_req *pd, const node_pd_view *v,
                      hist_src *src);
void node_pd_hist_done(node_pd_req *pd, const hist_src *src);
void node_pd_prepared(node_pd *p, const node_pd_req *pd);
/* The client's text must be kept even when streamed (the reply memory). */
int node_pd_wants_text(const node_pd_req *pd);
/* 1: a pull is under way (cfg.on_pulled(user) follows it); 0: submit now. */
int node_pd_plan(node_pd *p, node_pd_req *pd, const node_pd_view *v, void *user);
/* What the engine gets from P/D: the prompt's leading blocks, whether it
 * reports the finished request's blocks (want_kv), and the prefill node's
 * first token(s) for this prompt, sent without computing (pregen). */
void node_pd_engine_request(const node_pd_req *pd, engine_request *er);
void node_pd_submitted(node_pd_req *pd);
void node_pd_on_kv(const node_pd *p, node_pd_req *pd, const node_pd_view *v,
                   const engine_event *ev);
/* *params: the answer's kv_transfer_params members (dx_malloc'd), when the
 * node holds something for a next reader; left alone otherwise. */
void node_pd_finish(node_pd *p, node_pd_req *pd, const node_pd_view *v, const node_pd_end *e,
                    char **params);
void node_pd_req_free(const node_pd *p, node_pd_req *pd);
uint32_t node_pd_pulled_tokens(const node_pd *p, const node_pd_req *pd);
/* " kv=..." for the request's log line ("" when nothing happened). */
const char *node_pd_log_suffix(node_pd_req *pd);
void node_pd_write_metrics(const node_pd *p, dx_buf *b);

#endif
