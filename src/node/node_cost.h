/* node_cost: what a node knows of costs, and the reuse decision it makes
 * from them (docs/pd.md, "Measured costs").
 *
 *  - Its own steps: the engine's fitted step model (engine/step_cost.h),
 *    or the one `--fixed-costs` gives.
 *  - Each peer's pulls: a pull from a peer takes setup + rtt + byte_s ×
 *    bytes, each part measured on its own from the last NODE_COST_PULL_RING
 *    successful pulls from that peer: setup is the pull's time outside its
 *    reads (connect, authenticate, pin, release), rtt the pin's round trip
 *    (the reads wait one too), byte_s the reads' time beyond that round
 *    trip per byte — medians (byte_s weighted by each pull's bytes), so one
 *    stalled pull moves nothing and a pull's size never has to be guessed
 *    from pulls of another size.  One estimate per KV address (UCX keeps
 *    one endpoint, hence one transport, per peer; the transport the agent
 *    was configured with is its label).  A peer not pulled from yet costs
 *    the prior: NODE_COST_PRIOR_SETUP_MS + 1 GB/s — pessimistic for shared
 *    memory (20 GB/s here), optimistic for a 1 Gbit/s link, and in either
 *    case replaced by the first measurement.
 *  - The decision (node_cost_decide): pull the k reusable tokens at
 *    positions [pos, pos + k) when the estimated pull is cheaper than
 *    recomputing them there — their per-token and per-key terms, plus the
 *    step overheads they would add to the prefill that computes the rest
 *    anyway — with hysteresis: once a peer's last decision went one way,
 *    the other way must win by NODE_COST_HYSTERESIS_PCT percent, so costs
 *    that hover at the break-even do not flap.  A peer judged too slow for
 *    NODE_COST_PROBE_AFTER decisions in a row, when pulling looked at most
 *    4× dearer, is pulled from once anyway (a probe: its link may be
 *    better now, and only a pull measures it).  A fixed threshold
 *    (`--kv-recompute-threshold N`, vLLM's rule) decides by count instead,
 *    and the estimates are still logged.
 *  - Whether the estimates are right: every pull's measured time against
 *    its estimate, and every prefill computed on an idle engine against
 *    the step model, as histograms of actual / estimated (/metrics).
 *
 * Loop thread only (the engine's fit is read through a thread-safe call). */
#ifndef NODE_COST_H
#define NODE_COST_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "engine/engine.h"
#include "engine/step_cost.h"
#include "http/node_load.h"

#define NODE_COST_MAX_PEERS      32 /* peers remembered, least recently pulled out first */
#define NODE_COST_PULL_RING      16 /* pulls each peer's fit keeps */
#define NODE_COST_PRIOR_SETUP_MS 1  /* a fresh peer: 1 ms to set a pull up ... */
#define NODE_COST_PRIOR_GBPS     1  /* ... and 1 GB/s */
#define NODE_COST_HYSTERESIS_PCT 20
#define NODE_COST_PROBE_AFTER    64

typedef struct node_cost node_cost;

typedef struct {
    const char *transport; /* the agent's UCX_TLS ("default": UCX's choice); copied */
    uint32_t kv_token_bytes, block_size, batch_tokens;
    const node_load *fixed; /* --fixed-costs (copied), or NULL: measured */
    /* The engine's fitted step model (engine_get_cost); NULL: the fixed
     * one alone (tests). */
    void (*get_model)(void *user, step_cost_model *out);
    void *user;
} node_cost_config;

enum node_cost_dir { NODE_COST_P2D = 0, NODE_COST_D2P = 1 };

typedef struct {
    /* in */
    const char *host;
    int port;
    enum node_cost_dir dir;
    uint64_t n_tokens; /* reusable from the holder, at positions [pos, pos + n_tokens) */
    uint64_t pos;
    uint64_t rest;      /* tokens this node computes after them anyway (≥ 1) */
    uint32_t threshold; /* 0: by the estimates; else pull when n_tokens ≥ threshold */
    /* out */
    double pull_s, recompute_s;
    int pull;
    int probe; /* a pull the estimates did not choose (see above) */
} node_cost_ask;

int node_cost_create(const node_cost_config *cfg, node_cost **out);
void node_cost_destroy(node_cost *c); /* NULL: no-op */

/* The step model decisions use: --fixed-costs' or the engine's fit. */
void node_cost_model(node_cost *c, step_cost_model *out);
/* Estimated seconds of a pull of `bytes` from host:port. */
double node_cost_pull_s(node_cost *c, const char *host, int port, uint64_t bytes);
/* Fills a's estimates and decision, and counts it. */
void node_cost_decide(node_cost *c, node_cost_ask *a);
/* What a pull that moved bytes took: in all, in its reads, the pin's round
 * trip; and what it was expected to take (the error histogram). */
typedef struct {
    uint64_t bytes;
    double seconds, read_s, rtt_s, est_s;
} node_cost_pull;
void node_cost_pulled(node_cost *c, const char *host, int port, const node_cost_pull *pl);
/* A prefill on an idle engine took `seconds` where est_s was expected. */
void node_cost_prefilled(node_cost *c, double est_s, double seconds);
/* What this node publishes (node_load.h): its model, the engine's queue,
 * its KV address (kv: "host:port" or NULL), its most recently used
 * peers. */
void node_cost_publish(node_cost *c, const engine_stats *es, const char *kv, node_load *out);
void node_cost_write_metrics(node_cost *c, dx_buf *b);

#endif
