/* dx_lru: a bounded, expiring map from byte-string keys to byte-string
 * values — what a server remembers for a while on a client's behalf (the
 * Responses API's stored responses).
 *
 * Every entry lives for the same TTL from its last use (a put, or a get
 * that asks to refresh it), so the use-ordered list's head is also the next
 * to expire: expiry is a walk from the head, and the bounds (entries, bytes)
 * evict from there too, least recently used first.  Keys are hashed with a
 * random seed (they come from clients) into a dx_hidx; values are copied in
 * and owned by the map.
 *
 * Not thread-safe: a caller that shares one map across threads holds its
 * own lock around every call (the pointers a get returns are valid until
 * the map next changes). */
#ifndef DX_LRU_H
#define DX_LRU_H

#include <stddef.h>
#include <stdint.h>

typedef struct dx_lru dx_lru;

typedef struct {
    double ttl_s;       /* > 0 */
    size_t max_entries; /* 0: no bound */
    size_t max_bytes;   /* keys + values + overhead; 0: no bound */
} dx_lru_config;

typedef struct {
    size_t entries, bytes;
    uint64_t puts, hits, misses, evicted, expired;
} dx_lru_stats;

/* DX_EINVAL for a TTL that is not positive, DX_ENOMEM. */
int dx_lru_create(const dx_lru_config *cfg, dx_lru **out);
void dx_lru_destroy(dx_lru *l); /* NULL: no-op */

/* Stores a copy of val under key (replacing what was there), at time now
 * (seconds, any monotonic origin), then evicts the least recently used
 * entries past the bounds.  DX_ETOOBIG when this one entry alone is over
 * max_bytes (nothing is stored, and what was under key is gone), DX_ENOMEM. */
int dx_lru_put(dx_lru *l, const void *key, size_t klen, const void *val, size_t vlen, double now);
/* 1 with *val / *vlen (valid until the map next changes) when key is there
 * and unexpired at now — refresh: its TTL restarts and it becomes the most
 * recently used — else 0 (an expired entry is dropped). */
int dx_lru_get(dx_lru *l, const void *key, size_t klen, double now, int refresh, const void **val,
               size_t *vlen);
/* 1 when key was there (now gone), else 0. */
int dx_lru_remove(dx_lru *l, const void *key, size_t klen);
/* Drops every entry expired at now; returns how many. */
size_t dx_lru_expire(dx_lru *l, double now);
void dx_lru_get_stats(const dx_lru *l, dx_lru_stats *out);

#endif
