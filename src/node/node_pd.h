/* node_pd: the prefill/decode steps of one completion request
 * (docs/pd.md), for the node server (node_server_priv.h).
 *
 *   node_pd_parse       the request's kv_transfer_params; what the node will
 *                       hold when the request ends
 *   (tokenise)          a chat prompt goes through hist with the params'
 *                       sequence and the node's reply memory
 *                       (node_pd_hist_src), so prefill and decode nodes
 *                       agree on the tokens wherever they can
 *                       (these two run on a preparation thread: they read
 *                       the server's configuration only and leave their
 *                       counts in the request)
 *   node_pd_prepared    (loop) those counts into the metrics
 *   node_pd_plan        this node's cached prefix, and — when the params name
 *                       a holder that can supply at least the threshold more
 *                       tokens — a pull on a worker thread; the request is
 *                       submitted when it ends, whatever its outcome
 *   node_pd_on_kv       (engine thread) the finished request's blocks go
 *                       under a lease
 *   node_pd_finish      the answer's kv_transfer_params, the reply memory,
 *                       the metrics
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
#include "node/node_server.h"
#include "http/prom.h"

typedef struct node_req node_req;

enum node_pd_hold {
    NODE_PD_HOLD_NONE = 0,
    NODE_PD_HOLD_FOR_DECODE, /* do_remote_decode: a single-use lease for the decode node */
    NODE_PD_HOLD_RETAIN,     /* --bidirectional-kv-xfer decode side: prompt and answer */
};

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

typedef struct {
    uint64_t tokens_local, tokens_pulled, tokens_computed;
    uint64_t pulls[2], pull_blocks[2], pull_bytes[2]; /* [0] prefill→decode, [1] decode→prefill */
    uint64_t fallbacks[NODE_KV_N_FALLBACKS];
    uint64_t below_threshold, params_ignored, params_untrusted, holds, hold_failed;
    uint64_t first_from_prefill; /* requests whose first token came with the params */
    uint64_t replies_from_seq, replies_from_mem, replies_retokenised;
    prom_hist pull_seconds;
} node_pd_stats;

void node_pd_stats_init(node_pd_stats *st);
void node_pd_stats_free(node_pd_stats *st);

/* 0, or DX_EINVAL with *err filled (a bad field). */
int node_pd_parse(node_server *s, node_req *q, oai_err *err);
void node_pd_hist_src(node_server *s, node_req *q, hist_src *src);
void node_pd_hist_done(node_server *s, node_req *q, const hist_src *src);
void node_pd_prepared(node_server *s, node_req *q);
/* The client's text must be kept even when streamed (the reply memory). */
int node_pd_wants_text(node_server *s, const node_req *q);
/* 1: a pull is under way (node_server_submit follows it); 0: submit now. */
int node_pd_plan(node_server *s, node_req *q);
int node_pd_want_kv(const node_req *q);
/* The prefill node's first token(s) for this prompt, to send without
 * computing (engine_request.pregen); returns how many. */
uint32_t node_pd_pregen(const node_req *q, int32_t *out);
void node_pd_submitted(node_req *q);
void node_pd_on_kv(node_server *s, node_req *q, const engine_event *ev);
void node_pd_finish(node_server *s, node_req *q);
void node_pd_req_free(node_server *s, node_req *q);
uint32_t node_pd_pulled_tokens(const node_req *q);
/* " kv=..." for the request's log line ("" when nothing happened). */
const char *node_pd_log_suffix(node_req *q);
void node_pd_write_metrics(node_server *s, dx_buf *b);

#endif
