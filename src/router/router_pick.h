/* router_pick: the router's node choice (docs/router.md, "A completion
 * request" steps 4-6 and "Failures, retries, fallbacks") as pure functions
 * over an explicit input: the nodes' states and loads, the conversation's
 * entry, the request's prompt tokens, the knobs and the rotation counters.
 * No libuv, no HTTP, no I/O, no clock: tests/unit/test_router_pick.c checks
 * every rule, and router_flow.c only applies the choice (counts it, sends).
 *
 * The rules:
 *  - a node takes new requests while healthy, not draining and not gone;
 *    it still holds the KV it retains while up or draining, and not gone
 *    (a draining holder is not a dead one: its KV port still serves);
 *  - least loaded: decode nodes by requests in flight, prefill nodes by
 *    prompt tokens in flight; ties rotate, one counter per pool, advanced
 *    by every pick from that pool;
 *  - affinity: the entry's decode node, unless it takes nothing new
 *    (affinity_node_draining / affinity_node_down) or already has
 *    decode_max_outstanding requests in flight (overloaded);
 *  - uncached = prompt tokens - the entry's tokens when its params are
 *    usable (there are some and their holder holds), else all of them;
 *    local prefill on the decode node when no prefill body is ready (no
 *    prefill node configured or discoverable), or when no prefill node
 *    takes new requests (no_prefill_healthy); otherwise
 *  - by the costs (local_prefill_auto, the default), when the decode node
 *    and the least loaded prefill node both publish theirs (node_load.h,
 *    read from their /health): the turn is prefilled where
 *
 *      local   = queue_D + prefill_D(new tokens at the history's depth)
 *                + the running streams' decode work in those steps
 *                + pull_D←holder(history), when D is not the holder
 *                + stall_weight × streams_D × prefill_D(...)
 *      prefill = queue_P + min(pull_P←holder(history), prefill_P(history))
 *                + prefill_P(new tokens at the history's depth)
 *                + pull_D←P(new tokens) + prefill_hop_s
 *
 *    is smaller (router_pick_estimate), the prefill path by a margin
 *    (prefill_margin_pct: the two nodes' models are fitted apart, each with
 *    its own error, and on equal machines the local path is the one without
 *    a transfer) — the stall term is what P/D disaggregation is for: each
 *    of D's running streams waits as long as a local prefill computes, so a
 *    decode node with streams gets the long prefills off it while an idle
 *    one takes the small ones;
 *  - by the count otherwise (local_prefill_auto 0, or a node without
 *    costs): local prefill when uncached is below local_prefill_max_tokens;
 *  - one retry, on another node of the role.
 *
 * The inputs are structs, not argument lists, so that a policy can add
 * what it weighs without changing the callers' shape. */
#ifndef ROUTER_PICK_H
#define ROUTER_PICK_H

#include <stddef.h>
#include <stdint.h>

#include "http/node_load.h"

/* One node as the policy sees it; the router keeps its node table's states
 * in an array of these (one per node index), so the policy reads them in
 * place. */
typedef struct {
    int prefill;                 /* role: 1 prefill, 0 decode */
    int healthy;                 /* the last check or connection succeeded */
    int draining;                /* its /health says it drains */
    int reg_draining;            /* its registration says it drains */
    int gone;                    /* its registration vanished: never picked */
    uint32_t outstanding;        /* requests in flight */
    uint64_t outstanding_tokens; /* prompt tokens in flight (prefill nodes) */
    node_load load;              /* what its last /health published (load.has 0: nothing) */
    /* Of that, what is not this router's: the requests it ran beyond this
     * router's in flight there at the check, and its queued prompt tokens
     * when this router had none there (the rest is this router's own, which
     * outstanding counts as it changes — a check a second old would still
     * show the turn that just ended). */
    uint32_t other_running;
    uint64_t other_pending;
} router_pick_node;

/* The cluster and the knobs (router_config's). */
typedef struct {
    const router_pick_node *nodes; /* by the router's node index */
    size_t n_nodes;
    /* The rotations that break ties, [0] decode, [1] prefill: the one state
     * the policy keeps, advanced by every pick from that pool (one per
     * pool, or picks made in step skew each other). */
    unsigned *rr;
    uint32_t decode_max_outstanding;   /* affinity yields to load from this many */
    uint32_t local_prefill_max_tokens; /* the count rule: fewer uncached tokens, local prefill */
    int local_prefill_auto;            /* decide by the nodes' costs (the rule above) */
    double stall_weight;               /* a running stream's delay against this turn's (0:
                                          ROUTER_PICK_STALL_WEIGHT) */
    double prefill_hop_s; /* the prefill path's own overhead (0: ROUTER_PICK_PREFILL_HOP_MS) */
    /* How much cheaper the prefill path must be estimated, in percent (0:
     * ROUTER_PICK_PREFILL_MARGIN_PCT; < 0: none). */
    int prefill_margin_pct;
} router_pick_cluster;

/* The cost rule's defaults: a stream's wait weighs as much as this turn's;
 * going through a prefill node costs an HTTP round trip more and the
 * decode node's admission (~2 ms measured on loopback, README
 * "Performance"), and is taken only when estimated 25% cheaper. */
#define ROUTER_PICK_STALL_WEIGHT       1
#define ROUTER_PICK_PREFILL_HOP_MS     2
#define ROUTER_PICK_PREFILL_MARGIN_PCT 25

/* The conversation's entry, as far as the choice needs it. */
typedef struct {
    int found;       /* the lookup found one */
    int node;        /* its decode node; -1: a URL this router does not route to */
    int has_params;  /* it carries the node's kv_transfer_params */
    uint32_t tokens; /* their remote_num_tokens */
} router_pick_entry;

typedef struct {
    int keyed;                      /* it has a conversation key: its affinity counts */
    const router_pick_entry *entry; /* NULL: none looked up or found */
    uint32_t prompt_tokens;
    int prefill_ready; /* a prefill body was made: prefill nodes may exist */
} router_pick_req;

enum router_pick_affinity {
    ROUTER_PICK_UNKEYED = -1, /* no key: neither hit nor miss */
    ROUTER_PICK_MISS = 0,
    ROUTER_PICK_HIT = 1,
};

/* The two paths' estimates (seconds; router_pick_estimate). */
typedef struct {
    double local_s;   /* this turn's time to first token prefilled on the decode node */
    double stall_s;   /* what that prefill delays the decode node's running streams, in all */
    double prefill_s; /* ... and through the prefill node */
    uint32_t streams; /* the decode node's running streams counted */
} router_pick_est;

typedef struct {
    int decode; /* -1: no decode node takes new requests (the rest unset) */
    enum router_pick_affinity affinity;
    const char *affinity_fallback; /* why the entry's node was passed over, or NULL */
    int prefill;                   /* the prefill node first; -1: local prefill */
    const char *prefill_fallback;  /* "no_prefill_healthy", or NULL */
    uint32_t uncached;             /* prompt tokens the entry's holder does not have */
    /* How local prefill or a prefill node was chosen: "cost" (the
     * estimates, in est), "count" (local_prefill_max_tokens), "no_costs"
     * (auto, but a node published none: the count), "no_prefill" (none
     * configured or healthy). */
    const char *rule;
    router_pick_est est;
} router_pick_choice;

/* The node may get new requests: healthy, not draining, not gone. */
int router_pick_takes_new(const router_pick_node *n);
/* The node still serves the KV it holds: up or draining, not gone. */
int router_pick_holds(const router_pick_node *n);
/* The entry's params are worth sending: there are some and their holder
 * holds (NULL entry: no). */
int router_pick_entry_usable(const router_pick_cluster *c, const router_pick_entry *e);

/* The least loaded node that takes new requests, never `exclude` (-1:
 * none excluded); -1 if there is none. */
int router_pick_decode(const router_pick_cluster *c, int exclude);
int router_pick_prefill(const router_pick_cluster *c, int exclude);

/* The estimates of prefilling `uncached` tokens after `cached` ones on
 * decode node d (local) or prefill node p (then pulled back by d), the
 * history held by node `holder` (-1: none); both must publish costs. */
void router_pick_estimate(const router_pick_cluster *c, int d, int p, int holder, uint32_t cached,
                          uint32_t uncached, router_pick_est *out);

/* A completion's route: the decode node (with its affinity), then local
 * prefill or the prefill node first.  The prefill pool is not rotated
 * when there is no decode node or the prefill is local. */
void router_pick_route(const router_pick_cluster *c, const router_pick_req *q,
                       router_pick_choice *out);

/* The node the decode request goes to: `chosen` while it takes new
 * requests, else (it went down while the prefill node worked) the least
 * loaded decode node, else `chosen` still (its failure is then answered). */
int router_pick_decode_again(const router_pick_cluster *c, int chosen);

/* Another node of the role for a request whose attempt on `failed` was
 * attempt number `tries`: one retry at most; -1 (DX_NONE) for none. */
int router_pick_retry(const router_pick_cluster *c, int prefill, int failed, int tries);

/* A GET passed through (/v1/models): a decode node, else a prefill node;
 * -1 if no node takes new requests. */
int router_pick_any(const router_pick_cluster *c);

#endif
