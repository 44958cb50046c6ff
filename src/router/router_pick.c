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

/* The prefill node pick_least would choose now, without advancing the
 * rotation (the cost rule looks before it decides to go there). */
static int peek_prefill(const router_pick_cluster *c)
{
    unsigned rr[2] = {c->rr[0], c->rr[1]};
    router_pick_cluster k = *c;
    k.rr = rr;
    return pick_least(&k, 1, -1);
}

/* ---- the cost rule ---------------------------------------------------------------------- */

/* Seconds to compute n prompt tokens at positions [pos, pos + n) on a
 * node that publishes l (engine/step_cost.h's law, in steps of its batch). */
static double prefill_s(const node_load *l, uint64_t n, uint64_t pos)
{
    if (!n) return 0;
    uint64_t b = l->batch_tokens ? l->batch_tokens : n;
    double keys = (double)n * (double)pos + (double)n * (double)(n + 1) / 2;
    return l->step_s * (double)((n + b - 1) / b) + l->prefill_tok_s * (double)n +
           l->prefill_key_s * keys;
}

/* Seconds for `reader` to pull n tokens' KV from `from`: what the reader
 * measured of that peer, else what it assumes of a new one. */
static double pull_s(const node_load *reader, const node_load *from, uint64_t n)
{
    const node_load_peer *p = node_load_peer_of(reader, from->kv);
    double setup = p ? p->setup_s : reader->pull_setup_s, per = p ? p->byte_s : reader->pull_byte_s;
    uint64_t tb = reader->kv_token_bytes ? reader->kv_token_bytes : from->kv_token_bytes;
    return n ? setup + per * (double)(n * tb) : 0;
}

/* The prompt work queued at a node, in seconds: other routers' (as last
 * published) and this router's in flight there. */
static double queue_s(const router_pick_node *n, uint64_t router_tokens)
{
    return (double)(n->other_pending + router_tokens) * n->load.prefill_tok_s;
}

void router_pick_estimate(const router_pick_cluster *c, int d, int p, int holder, uint32_t cached,
                          uint32_t uncached, router_pick_est *out)
{
    const router_pick_node *D = &c->nodes[d], *P = &c->nodes[p];
    const router_pick_node *Hn = holder >= 0 ? &c->nodes[holder] : NULL;
    double w = c->stall_weight > 0 ? c->stall_weight : ROUTER_PICK_STALL_WEIGHT;
    double hop = c->prefill_hop_s > 0 ? c->prefill_hop_s : ROUTER_PICK_PREFILL_HOP_MS * 1e-3;
    /* the streams D runs: this router's now, and others' as last published */
    uint32_t streams = D->outstanding + D->other_running;
    uint64_t b = D->load.batch_tokens ? D->load.batch_tokens : (uint64_t)uncached + 1;
    double steps = (double)(((uint64_t)uncached + b - 1) / b);
    double compute_d = prefill_s(&D->load, uncached, cached);
    /* a step that prefills also decodes the streams: their share beyond
     * the step's overhead, which prefill_s counted */
    double decode_part = D->load.itl_s > D->load.step_s ? D->load.itl_s - D->load.step_s : 0;
    *out = (router_pick_est){.streams = streams};
    out->local_s = queue_s(D, 0) + compute_d + (streams ? steps * decode_part : 0);
    if (Hn && holder != d && cached) out->local_s += pull_s(&D->load, &Hn->load, cached);
    out->stall_s = (double)streams * compute_d;
    double hist = 0;
    if (cached) {
        hist = prefill_s(&P->load, cached, 0);
        double pulled = Hn ? pull_s(&P->load, &Hn->load, cached) : hist;
        if (pulled < hist) hist = pulled;
    }
    out->prefill_s = queue_s(P, P->outstanding_tokens) + hist +
                     prefill_s(&P->load, uncached, cached) + pull_s(&D->load, &P->load, uncached) +
                     hop;
    out->stall_s *= w;
}

/* Local prefill or prefill node p, by the estimates: 1 for local. */
static int cost_says_local(const router_pick_cluster *c, const router_pick_req *q,
                           router_pick_choice *out, int p)
{
    const router_pick_entry *e = q->entry;
    int holder = router_pick_entry_usable(c, e) ? e->node : -1;
    uint32_t cached = q->prompt_tokens - out->uncached;
    router_pick_estimate(c, out->decode, p, holder, cached, out->uncached, &out->est);
    int pct = c->prefill_margin_pct ? c->prefill_margin_pct : ROUTER_PICK_PREFILL_MARGIN_PCT;
    double margin = pct > 0 ? 1 + pct / 100.0 : 1;
    return out->est.local_s + out->est.stall_s <= out->est.prefill_s * margin;
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
    if (cached > q->prompt_tokens) cached = q->prompt_tokens;
    out->uncached = q->prompt_tokens - cached;
    out->rule = "no_prefill";
    if (!q->prefill_ready) return;
    int p = c->local_prefill_auto ? peek_prefill(c) : -1;
    if (p >= 0 && c->nodes[out->decode].load.has && c->nodes[p].load.has) {
        out->rule = "cost";
        if (cost_says_local(c, q, out, p)) return;
    } else {
        out->rule = c->local_prefill_auto && p >= 0 ? "no_costs" : "count";
        if (out->uncached < c->local_prefill_max_tokens) return;
    }
    if ((out->prefill = router_pick_prefill(c, -1)) < 0) {
        out->prefill_fallback = "no_prefill_healthy";
        out->rule = "no_prefill";
    }
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
