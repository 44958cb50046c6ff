/* router_gaps: the time between a conversation's turns as this router sees
 * it, and whether the decode node's retention had run out by then — the
 * figures that say what --decoder-kv-blocks-ttl should be
 * (docs/router.md, "Retention TTL").
 *
 * When a turn ends the router notes its conversation key, the time and
 * how long the decode node said it retains the KV (remote_blocks_ttl_s);
 * when the next turn arrives its gap is the time since, and it came after
 * the retention expired when the gap is longer than that (such a turn
 * recomputes its history).  The note outlives the conversation's entry in
 * the state store — which is gone by then — because it is kept apart: a
 * fixed table of slots indexed by the key's hash, a newer note taking an
 * older one's slot (lossy, bounded, no allocation after create).  Notes
 * older than ROUTER_GAPS_MAX_AGE_S are forgotten.  With several routers
 * each sees the turns that reach it.
 *
 * Pure logic, clock injected (seconds, any monotonic origin); the loop
 * thread owns it. */
#ifndef ROUTER_GAPS_H
#define ROUTER_GAPS_H

#include <stddef.h>

#include "router/router_key.h"

#define ROUTER_GAPS_SLOTS     65536 /* conversations remembered at most (a slot is 40 bytes) */
#define ROUTER_GAPS_MAX_AGE_S 86400 /* a note a day old is no conversation's any more */

typedef struct router_gaps router_gaps;

enum router_gap_kind {
    ROUTER_GAP_LIVE,    /* within the retention: its KV was there */
    ROUTER_GAP_EXPIRED, /* past it: recomputed */
    ROUTER_GAP_NONE,    /* the node retained nothing for it */
};

int router_gaps_create(size_t slots, router_gaps **out);
void router_gaps_destroy(router_gaps *g); /* NULL: no-op */

/* A turn of conversation k ended at now; its KV is retained ttl_s (0:
 * not retained). */
void router_gaps_end(router_gaps *g, const router_key *k, double now, double ttl_s);
/* A turn arrives whose conversation may be any of keys[0..n) (the last
 * one known wins: callers list content keys shortest first).  1 and the
 * gap and its kind when one is known; 0 when none is (a new conversation,
 * or one forgotten). */
int router_gaps_begin(router_gaps *g, const router_key *keys, size_t n, double now, double *gap_s,
                      enum router_gap_kind *kind);

#endif
