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
 *    prefill node configured or discoverable), when uncached is below
 *    local_prefill_max_tokens, or when no prefill node takes new requests
 *    (no_prefill_healthy);
 *  - one retry, on another node of the role.
 *
 * The inputs are structs, not argument lists, so that a cost-based policy
 * can add what it weighs (a node's free KV blocks, a transfer's size, ...)
 * without changing the callers' shape. */
#ifndef ROUTER_PICK_H
#define ROUTER_PICK_H

#include <stddef.h>
#include <stdint.h>

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
    uint32_t local_prefill_max_tokens; /* fewer uncached tokens: local prefill */
} router_pick_cluster;

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

typedef struct {
    int decode; /* -1: no decode node takes new requests (the rest unset) */
    enum router_pick_affinity affinity;
    const char *affinity_fallback; /* why the entry's node was passed over, or NULL */
    int prefill;                   /* the prefill node first; -1: local prefill */
    const char *prefill_fallback;  /* "no_prefill_healthy", or NULL */
    uint32_t uncached;             /* prompt tokens the entry's holder does not have */
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

/* A completion's route: the decode node (with its affinity), then local
 * prefill or the prefill node first.  The prefill pool is not consulted
 * (nor rotated) when there is no decode node or the prefill is local. */
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
