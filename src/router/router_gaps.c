/* router_gaps: when each conversation's last turn ended (see .h). */
#include "router/router_gaps.h"

#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

typedef struct {
    router_key k;
    double end; /* when its last turn ended; 0: an empty slot */
    double ttl; /* what the decode node retains it for (0: nothing) */
} slot;

struct router_gaps {
    slot *s;
    size_t n; /* a power of two */
};

int router_gaps_create(size_t slots, router_gaps **out)
{
    *out = NULL;
    size_t n = 1;
    while (n < slots && n < ((size_t)1 << 30)) n <<= 1;
    router_gaps *g = dx_calloc(1, sizeof *g);
    if (g) g->s = dx_calloc(n, sizeof *g->s);
    if (!g || !g->s) {
        dx_free(g);
        return dx_errf(DX_ENOMEM, "out of memory for %zu conversations' turn times", n);
    }
    g->n = n;
    *out = g;
    return 0;
}

void router_gaps_destroy(router_gaps *g)
{
    if (!g) return;
    dx_free(g->s);
    dx_free(g);
}

/* A key is already a keyed hash: its low bits pick the slot. */
static slot *slot_of(const router_gaps *g, const router_key *k)
{
    return &g->s[(k->lo ^ k->hi) & (g->n - 1)];
}

void router_gaps_end(router_gaps *g, const router_key *k, double now, double ttl_s)
{
    slot *s = slot_of(g, k);
    s->k = *k;
    s->end = now > 0 ? now : 1e-9; /* 0 marks an empty slot */
    s->ttl = ttl_s > 0 ? ttl_s : 0;
}

int router_gaps_begin(router_gaps *g, const router_key *keys, size_t n, double now, double *gap_s,
                      enum router_gap_kind *kind)
{
    for (size_t i = n; i-- > 0;) {
        const slot *s = slot_of(g, &keys[i]);
        if (!s->end || !router_key_eq(&s->k, &keys[i]) || now - s->end > ROUTER_GAPS_MAX_AGE_S)
            continue;
        *gap_s = now > s->end ? now - s->end : 0;
        *kind = !s->ttl ? ROUTER_GAP_NONE : *gap_s > s->ttl ? ROUTER_GAP_EXPIRED : ROUTER_GAP_LIVE;
        return 1;
    }
    return 0;
}
