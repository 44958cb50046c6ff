/* router_pick: the node choice, pure (see router_pick.h for the rules).
 * Every function reads only its arguments and writes only the rotation
 * counters and its result, so the unit test drives it with plain arrays. */
#include "router/router_pick.h"

#include "base/dx_err.h"

int router_pick_takes_new(const router_pick_node *n)
{
    return n->healthy && !n->draining && !n->reg_draining && !n->gone;
}

int router_pick_holds(const router_pick_node *n)
{
    return !n->gone && (n->healthy || n->draining || n->reg_draining);
}

int router_pick_entry_usable(const router_pick_cluster *c, const router_pick_entry *e)
{
    return e && e->has_params && e->node >= 0 && router_pick_holds(&c->nodes[e->node]);
}

static uint64_t load_of(const router_pick_node *n, int by_tokens)
{
    return by_tokens ? n->outstanding_tokens : n->outstanding;
}

/* The node of the role that takes new requests with the least load
 * (requests, or prompt tokens for prefill nodes), never `exclude`; the scan
 * starts at the pool's rotation, so the first of equals wins in turn. */
static int pick_least(const router_pick_cluster *c, int prefill, int exclude)
{
    size_t n = c->n_nodes;
    unsigned start = c->rr[prefill]++;
    int best = -1;
    for (size_t k = 0; k < n; k++) {
        int i = (int)((start + k) % n);
        const router_pick_node *nd = &c->nodes[i];
        if (i == exclude || nd->prefill != prefill || !router_pick_takes_new(nd)) continue;
        if (best < 0 || load_of(nd, prefill) < load_of(&c->nodes[best], prefill)) best = i;
    }
    return best;
}

int router_pick_decode(const router_pick_cluster *c, int exclude)
{
    return pick_least(c, 0, exclude);
}

int router_pick_prefill(const router_pick_cluster *c, int exclude)
{
    return pick_least(c, 1, exclude);
}

/* The entry's node unless it is down, draining or overloaded (saying
 * which), else the least loaded decode node. */
static void pick_decode_for(const router_pick_cluster *c, const router_pick_req *q,
                            router_pick_choice *out)
{
    const router_pick_entry *e = q->entry;
    if (e && e->found && e->node >= 0) {
        const router_pick_node *n = &c->nodes[e->node];
        if (!router_pick_takes_new(n))
            out->affinity_fallback =
                router_pick_holds(n) ? "affinity_node_draining" : "affinity_node_down";
        else if (n->outstanding >= c->decode_max_outstanding)
            out->affinity_fallback = "overloaded";
        else {
            out->affinity = ROUTER_PICK_HIT;
            out->decode = e->node;
            return;
        }
    }
    out->affinity = q->keyed ? ROUTER_PICK_MISS : ROUTER_PICK_UNKEYED;
    out->decode = router_pick_decode(c, -1);
}

void router_pick_route(const router_pick_cluster *c, const router_pick_req *q,
                       router_pick_choice *out)
{
    *out = (router_pick_choice){.decode = -1, .prefill = -1};
    pick_decode_for(c, q, out);
    if (out->decode < 0) return;
    uint32_t cached = router_pick_entry_usable(c, q->entry) ? q->entry->tokens : 0;
    out->uncached = q->prompt_tokens > cached ? q->prompt_tokens - cached : 0;
    if (!q->prefill_ready || out->uncached < c->local_prefill_max_tokens) return;
    if ((out->prefill = router_pick_prefill(c, -1)) < 0)
        out->prefill_fallback = "no_prefill_healthy";
}

int router_pick_decode_again(const router_pick_cluster *c, int chosen)
{
    if (router_pick_takes_new(&c->nodes[chosen])) return chosen;
    int d = router_pick_decode(c, -1);
    return d >= 0 ? d : chosen;
}

int router_pick_retry(const router_pick_cluster *c, int prefill, int failed, int tries)
{
    if (tries >= 2) return DX_NONE;
    return prefill ? router_pick_prefill(c, failed) : router_pick_decode(c, failed);
}

int router_pick_any(const router_pick_cluster *c)
{
    int node = router_pick_decode(c, -1);
    return node >= 0 ? node : router_pick_prefill(c, -1);
}
