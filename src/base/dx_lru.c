/* dx_lru: a bounded, expiring map of byte strings (see .h).
 *
 * An entry is one allocation: the struct, then the key, then the value.
 * The list runs from the least recently used (head) to the most (tail). */
#include "base/dx_lru.h"

#include <string.h>
#include <sys/random.h>
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_hidx.h"
#include "base/dx_list.h"

typedef struct {
    dx_list link; /* use order */
    uint64_t h;
    double expires;
    size_t klen, vlen;
    /* key, then value, follow */
} entry;

struct dx_lru {
    dx_lru_config cfg;
    uint64_t seed;
    dx_hidx *idx;
    dx_list order;
    dx_lru_stats st;
};

static const uint8_t *key_of(const entry *e)
{
    return (const uint8_t *)(e + 1);
}

static size_t entry_bytes(size_t klen, size_t vlen)
{
    return sizeof(entry) + klen + vlen;
}

int dx_lru_create(const dx_lru_config *cfg, dx_lru **out)
{
    *out = NULL;
    if (!(cfg->ttl_s > 0)) return dx_errf(DX_EINVAL, "lru: the TTL must be positive");
    dx_lru *l = dx_calloc(1, sizeof *l);
    if (!l || dx_hidx_create(0, &l->idx) < 0) {
        dx_free(l);
        return dx_errf(DX_ENOMEM, "lru: out of memory");
    }
    l->cfg = *cfg;
    dx_list_init(&l->order);
    if (getrandom(&l->seed, sizeof l->seed, 0) != sizeof l->seed) l->seed = (uintptr_t)l;
    *out = l;
    return 0;
}

static void drop(dx_lru *l, entry *e)
{
    DX_ASSERT(dx_hidx_remove(l->idx, e->h, (uintptr_t)e) == 0);
    dx_list_remove(&e->link);
    l->st.entries--;
    l->st.bytes -= entry_bytes(e->klen, e->vlen);
    dx_free(e);
}

void dx_lru_destroy(dx_lru *l)
{
    if (!l) return;
    DX_LIST_FOR_EACH_SAFE(it, tmp, &l->order)
    {
        drop(l, DX_LIST_ENTRY(it, entry, link));
    }
    dx_hidx_destroy(l->idx);
    dx_free(l);
}

static entry *find(const dx_lru *l, const void *key, size_t klen, uint64_t h)
{
    dx_hidx_iter it;
    uint64_t v;
    for (dx_hidx_find(l->idx, h, &it); dx_hidx_next(l->idx, &it, &v);) {
        entry *e = (entry *)(uintptr_t)v;
        if (e->klen == klen && !memcmp(key_of(e), key, klen)) return e;
    }
    return NULL;
}

size_t dx_lru_expire(dx_lru *l, double now)
{
    size_t n = 0;
    dx_list *it;
    while ((it = dx_list_first(&l->order))) {
        entry *e = DX_LIST_ENTRY(it, entry, link);
        if (e->expires > now) break; /* the head expires first */
        drop(l, e);
        l->st.expired++;
        n++;
    }
    return n;
}

/* Least recently used first, until the bounds hold. */
static void evict(dx_lru *l)
{
    dx_list *it;
    while ((it = dx_list_first(&l->order)) &&
           ((l->cfg.max_entries && l->st.entries > l->cfg.max_entries) ||
            (l->cfg.max_bytes && l->st.bytes > l->cfg.max_bytes))) {
        drop(l, DX_LIST_ENTRY(it, entry, link));
        l->st.evicted++;
    }
}

int dx_lru_put(dx_lru *l, const void *key, size_t klen, const void *val, size_t vlen, double now)
{
    uint64_t h = XXH3_64bits_withSeed(key, klen, l->seed);
    entry *old = find(l, key, klen, h);
    if (old) drop(l, old);
    size_t bytes = entry_bytes(klen, vlen);
    if (l->cfg.max_bytes && bytes > l->cfg.max_bytes)
        return dx_errf(DX_ETOOBIG, "lru: an entry of %zu bytes is over the bound of %zu", bytes,
                       l->cfg.max_bytes);
    entry *e = dx_malloc(bytes);
    if (!e) return dx_errf(DX_ENOMEM, "lru: out of memory for an entry of %zu bytes", bytes);
    *e = (entry){.h = h, .expires = now + l->cfg.ttl_s, .klen = klen, .vlen = vlen};
    memcpy(e + 1, key, klen);
    memcpy((uint8_t *)(e + 1) + klen, val, vlen);
    if (dx_hidx_insert(l->idx, h, (uintptr_t)e) < 0) {
        dx_free(e);
        return dx_errf(DX_ENOMEM, "lru: out of memory for the index");
    }
    dx_list_push_back(&l->order, &e->link);
    l->st.entries++;
    l->st.bytes += bytes;
    l->st.puts++;
    dx_lru_expire(l, now);
    evict(l);
    return 0;
}

int dx_lru_get(dx_lru *l, const void *key, size_t klen, double now, int refresh, const void **val,
               size_t *vlen)
{
    entry *e = find(l, key, klen, XXH3_64bits_withSeed(key, klen, l->seed));
    if (e && e->expires <= now) {
        drop(l, e);
        l->st.expired++;
        e = NULL;
    }
    if (!e) {
        l->st.misses++;
        return 0;
    }
    if (refresh) {
        e->expires = now + l->cfg.ttl_s;
        dx_list_move_back(&l->order, &e->link);
    }
    l->st.hits++;
    *val = key_of(e) + e->klen;
    *vlen = e->vlen;
    return 1;
}

int dx_lru_remove(dx_lru *l, const void *key, size_t klen)
{
    entry *e = find(l, key, klen, XXH3_64bits_withSeed(key, klen, l->seed));
    if (!e) return 0;
    drop(l, e);
    return 1;
}

void dx_lru_get_stats(const dx_lru *l, dx_lru_stats *out)
{
    *out = l->st;
}
