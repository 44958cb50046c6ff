/* router_state: the router's conversation map — key → {decode node, that
 * node's last kv_transfer_params, expiry, last use}.
 *
 * Pure logic, no clock of its own: every call that needs the time takes
 * `now` (seconds on any monotonic clock), so tests drive it with a fake one.
 * Bounded twice — by the number of entries and by the bytes of stored params
 * (a decode node's params carry the conversation's token ids, which grow
 * with it) — and the least recently used entries go first when either bound
 * is passed.  An expired entry is never returned: a lookup that meets one
 * removes it, and router_state_expire() sweeps them from the LRU end.
 *
 * Params are opaque JSON text here; the router copies them in and out.
 * Not thread-safe: the router's loop thread owns it. */
#ifndef ROUTER_STATE_H
#define ROUTER_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "router/router_key.h"

typedef struct router_state router_state;

/* The map's bounds unless the config says (plain literals, for help text). */
#define ROUTER_STATE_DEFAULT_MAX_ENTRIES 100000
#define ROUTER_STATE_DEFAULT_MAX_MB      1024

typedef struct {
    size_t max_entries; /* 0: ROUTER_STATE_DEFAULT_MAX_ENTRIES */
    size_t max_bytes;   /* params bytes held; 0: ROUTER_STATE_DEFAULT_MAX_MB */
} router_state_config;

/* A view of one entry.  `params` points into the map: valid until the next
 * call that changes it (put, del, expire, or a get that meets an expired
 * entry). */
typedef struct {
    int node;           /* decode node index */
    const char *params; /* NUL-terminated JSON object text, or NULL */
    size_t params_len;
    uint32_t num_tokens; /* remote_num_tokens of the params (0 without) */
    double expiry;
    double last_use;
} router_entry;

int router_state_create(const router_state_config *cfg, router_state **out);
void router_state_destroy(router_state *st); /* NULL: no-op */

/* 1 and *out when a live entry exists (it becomes the most recently used),
 * 0 when none does. */
int router_state_get(router_state *st, const router_key *k, double now, router_entry *out);
/* Stores (or replaces) k's entry; params (len bytes, may be NULL) are
 * copied.  Evicts least recently used entries to stay within the bounds
 * (an entry alone over max_bytes is stored without its params).  DX_ENOMEM
 * leaves the map as it was, less any evictions. */
int router_state_put(router_state *st, const router_key *k, int node, const char *params,
                     size_t len, uint32_t num_tokens, double expiry, double now);
/* 0, or DX_ENOENT when k has no entry. */
int router_state_del(router_state *st, const router_key *k);
/* Removes expired entries from the least recently used end, stopping at
 * the first live one or after max_visit entries; returns how many went.
 * Entries with a shorter life than their neighbours may outlive their
 * expiry until a lookup meets them or the LRU order reaches them; none is
 * ever returned once expired. */
size_t router_state_expire(router_state *st, double now, size_t max_visit);
size_t router_state_count(const router_state *st);
size_t router_state_bytes(const router_state *st);
uint64_t router_state_evictions(const router_state *st); /* by the bounds, not by expiry */
/* Structural self-check for tests: 0 or DX_EMISMATCH with a message. */
int router_state_check(const router_state *st);

#endif
