/* router_state: the conversation map (see .h).
 *
 * Entries live in one growable array and are named by index; free slots
 * form a list through `next`.  A dx_hidx maps the key's low 64 bits to the
 * index (keys are seeded hashes, so those bits are uniform), and an
 * intrusive doubly linked list through prev/next keeps LRU order, most
 * recent at the head.  The links are indexes, not base/dx_list pointers,
 * because the array grows (realloc moves it) and the free list shares `next`.
 * Every operation is O(1) apart from the evictions it triggers. */
#include "router/router_state.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_hidx.h"

#define NIL UINT32_MAX

typedef struct {
    router_key key;
    uint32_t prev, next; /* LRU links; `next` also links free slots */
    int node;
    int used;
    uint32_t num_tokens;
    char *params;
    size_t params_len;
    double expiry, last_use;
} st_entry;

struct router_state {
    router_state_config cfg;
    st_entry *e;
    uint32_t cap, free_head;
    uint32_t head, tail; /* LRU: head = most recently used */
    size_t count, bytes;
    uint64_t evictions;
    dx_hidx *ix;
};

int router_state_create(const router_state_config *cfg, router_state **out)
{
    *out = NULL;
    router_state *st = dx_calloc(1, sizeof *st);
    if (!st) return dx_errf(DX_ENOMEM, "router state: out of memory");
    st->cfg = *cfg;
    if (!st->cfg.max_entries) st->cfg.max_entries = ROUTER_STATE_DEFAULT_MAX_ENTRIES;
    if (!st->cfg.max_bytes) st->cfg.max_bytes = (size_t)ROUTER_STATE_DEFAULT_MAX_MB << 20;
    if (st->cfg.max_entries >= NIL) st->cfg.max_entries = NIL - 1;
    st->free_head = st->head = st->tail = NIL;
    int rc = dx_hidx_create(0, &st->ix);
    if (rc) {
        dx_free(st);
        return dx_errf(rc, "router state: out of memory");
    }
    *out = st;
    return 0;
}

void router_state_destroy(router_state *st)
{
    if (!st) return;
    for (uint32_t i = 0; i < st->cap; i++)
        if (st->e[i].used) dx_free(st->e[i].params);
    dx_free(st->e);
    dx_hidx_destroy(st->ix);
    dx_free(st);
}

/* ---- LRU list ---------------------------------------------------------- */

static void lru_unlink(router_state *st, uint32_t i)
{
    st_entry *x = &st->e[i];
    if (x->prev != NIL)
        st->e[x->prev].next = x->next;
    else
        st->head = x->next;
    if (x->next != NIL)
        st->e[x->next].prev = x->prev;
    else
        st->tail = x->prev;
    x->prev = x->next = NIL;
}

static void lru_push_head(router_state *st, uint32_t i)
{
    st_entry *x = &st->e[i];
    x->prev = NIL;
    x->next = st->head;
    if (st->head != NIL) st->e[st->head].prev = i;
    st->head = i;
    if (st->tail == NIL) st->tail = i;
}

/* ---- slots ------------------------------------------------------------- */

static uint32_t find(const router_state *st, const router_key *k)
{
    dx_hidx_iter it;
    uint64_t v;
    for (dx_hidx_find(st->ix, k->lo, &it); dx_hidx_next(st->ix, &it, &v);)
        if (router_key_eq(&st->e[v].key, k)) return (uint32_t)v;
    return NIL;
}

static void set_params(router_state *st, st_entry *x, char *params, size_t len)
{
    st->bytes -= x->params_len;
    dx_free(x->params);
    x->params = params;
    x->params_len = params ? len : 0;
    st->bytes += x->params_len;
}

static void remove_at(router_state *st, uint32_t i)
{
    st_entry *x = &st->e[i];
    DX_ASSERT(x->used);
    int rc = dx_hidx_remove(st->ix, x->key.lo, i);
    DX_ASSERT(rc == 0);
    lru_unlink(st, i);
    set_params(st, x, NULL, 0);
    x->used = 0;
    x->next = st->free_head;
    st->free_head = i;
    st->count--;
}

/* A free slot, growing the array when none is left; NIL when out of memory. */
static uint32_t take_slot(router_state *st)
{
    if (st->free_head == NIL) {
        uint64_t want = st->cap ? (uint64_t)st->cap * 2 : 64;
        if (want > st->cfg.max_entries) want = st->cfg.max_entries;
        uint32_t cap = (uint32_t)want;
        if (cap <= st->cap) return NIL;
        st_entry *e = dx_realloc(st->e, (size_t)cap * sizeof *e);
        if (!e) return NIL;
        memset(e + st->cap, 0, (size_t)(cap - st->cap) * sizeof *e);
        for (uint32_t i = cap; i-- > st->cap;) {
            e[i].next = st->free_head;
            st->free_head = i;
        }
        st->e = e;
        st->cap = cap;
    }
    uint32_t i = st->free_head;
    st->free_head = st->e[i].next;
    return i;
}

/* Evicts from the LRU end, never `keep`, until `need_entries` more entries
 * and `need_bytes` more bytes fit. */
static void evict_for(router_state *st, size_t need_entries, size_t need_bytes, uint32_t keep)
{
    while (st->tail != NIL) {
        int over_n = st->count + need_entries > st->cfg.max_entries;
        int over_b = st->bytes + need_bytes > st->cfg.max_bytes;
        if (!over_n && !over_b) return;
        uint32_t victim = st->tail;
        if (victim == keep) victim = st->e[victim].prev;
        if (victim == NIL) return;
        remove_at(st, victim);
        st->evictions++;
    }
}

/* ---- API ----------------------------------------------------------------- */

int router_state_get(router_state *st, const router_key *k, double now, router_entry *out)
{
    uint32_t i = find(st, k);
    if (i == NIL) return 0;
    st_entry *x = &st->e[i];
    if (x->expiry <= now) {
        remove_at(st, i);
        return 0;
    }
    x->last_use = now;
    lru_unlink(st, i);
    lru_push_head(st, i);
    *out = (router_entry){.node = x->node,
                          .params = x->params,
                          .params_len = x->params_len,
                          .num_tokens = x->num_tokens,
                          .expiry = x->expiry,
                          .last_use = x->last_use};
    return 1;
}

/* A new entry for k (no old one): a slot, indexed and at the LRU head. */
static int insert_new(router_state *st, const router_key *k, uint32_t *out)
{
    evict_for(st, 1, 0, NIL);
    uint32_t i = take_slot(st);
    if (i == NIL) return dx_errf(DX_ENOMEM, "router state: out of memory");
    if (dx_hidx_insert(st->ix, k->lo, i) < 0) {
        st->e[i].next = st->free_head;
        st->free_head = i;
        return dx_errf(DX_ENOMEM, "router state: out of memory");
    }
    st_entry *x = &st->e[i];
    memset(x, 0, sizeof *x);
    x->key = *k;
    x->used = 1;
    x->prev = x->next = NIL;
    lru_push_head(st, i);
    st->count++;
    *out = i;
    return 0;
}

int router_state_put(router_state *st, const router_key *k, int node, const char *params,
                     size_t len, uint32_t num_tokens, double expiry, double now)
{
    char *copy = NULL;
    if (params && len <= st->cfg.max_bytes) {
        copy = dx_strndup(params, len);
        if (!copy) return dx_errf(DX_ENOMEM, "router state: out of memory");
    }
    uint32_t i = find(st, k);
    if (i == NIL) {
        int rc = insert_new(st, k, &i);
        if (rc) {
            dx_free(copy);
            return rc;
        }
    } else {
        lru_unlink(st, i);
        lru_push_head(st, i);
    }
    st_entry *x = &st->e[i];
    set_params(st, x, NULL, 0);
    evict_for(st, 0, copy ? len : 0, i);
    set_params(st, x, copy, len);
    x->node = node;
    x->num_tokens = copy ? num_tokens : 0;
    x->expiry = expiry;
    x->last_use = now;
    return 0;
}

int router_state_del(router_state *st, const router_key *k)
{
    uint32_t i = find(st, k);
    if (i == NIL) return dx_errf(DX_ENOENT, "router state: no such conversation");
    remove_at(st, i);
    return 0;
}

size_t router_state_expire(router_state *st, double now, size_t max_visit)
{
    size_t gone = 0;
    while (st->tail != NIL && max_visit-- > 0 && st->e[st->tail].expiry <= now) {
        remove_at(st, st->tail);
        gone++;
    }
    return gone;
}

size_t router_state_count(const router_state *st)
{
    return st->count;
}

size_t router_state_bytes(const router_state *st)
{
    return st->bytes;
}

uint64_t router_state_evictions(const router_state *st)
{
    return st->evictions;
}

int router_state_check(const router_state *st)
{
    size_t n = 0, bytes = 0;
    uint32_t prev = NIL;
    for (uint32_t i = st->head; i != NIL; prev = i, i = st->e[i].next) {
        const st_entry *x = &st->e[i];
        if (!x->used || x->prev != prev || n > st->count)
            return dx_errf(DX_EMISMATCH, "router state: LRU list broken at slot %u", i);
        if (find(st, &x->key) != i)
            return dx_errf(DX_EMISMATCH, "router state: slot %u not found by its key", i);
        bytes += x->params_len;
        n++;
    }
    if (prev != st->tail || n != st->count || bytes != st->bytes ||
        dx_hidx_count(st->ix) != st->count)
        return dx_errf(DX_EMISMATCH, "router state: %zu listed, %zu counted, %zu indexed", n,
                       st->count, dx_hidx_count(st->ix));
    if (st->count > st->cfg.max_entries || st->bytes > st->cfg.max_bytes)
        return dx_errf(DX_EMISMATCH, "router state: over its bounds (%zu entries, %zu bytes)",
                       st->count, st->bytes);
    return dx_hidx_check(st->ix);
}
