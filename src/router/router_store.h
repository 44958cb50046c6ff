/* router_store: where the router keeps its conversation map — one interface,
 * two backends, so router_flow does not care which one runs.
 *
 *   memory  router_state in this process (the default: one router,
 *           nothing to install);
 *   redis   a Redis server every router replica shares (`--state
 *           redis://...`), spoken to with hiredis' async API on the
 *           router's libuv loop: the loop never blocks on it.
 *
 * An entry is {decode node, its kv_transfer_params, remote_num_tokens}.
 * In Redis it is one string under `<prefix>conv:<32 hex digits of the
 * router_key>` (router_store_key), valued "<tokens> <node URL>\n<params>"
 * (router_store_encode), with PX set from the entry's TTL.  The node is
 * named by its URL, not an index: replicas may list nodes differently, and
 * a URL this router does not know is no affinity.
 *
 * Writes are compare-and-set on the turn measure (remote_num_tokens: a later
 * turn of a conversation has more): an entry is replaced only by one with
 * at least as many tokens, so two turns finished out of order never leave
 * the older one's params (ties keep the newer write).  In Redis that is a
 * short Lua script (EVALSHA, EVAL when the server answers NOSCRIPT).
 *
 * A lookup is one round trip (MGET of every candidate key) and has a
 * deadline (timeout_ms); a write is sent and not waited for.  Redis down,
 * slow or answering errors: lookups fail (no affinity — the router
 * recomputes), writes are dropped, both are counted by operation, one
 * warning is logged per outage, and the connection comes back by itself
 * with backoff.  Loop thread only. */
#ifndef ROUTER_STORE_H
#define ROUTER_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "base/dx_buf.h"
#include "router/router_key.h"

typedef struct router_store router_store;
typedef struct router_store_op router_store_op;

#define ROUTER_STORE_PREFIX_MAX  64
#define ROUTER_STORE_TIMEOUT_MAX 60000 /* ms */
/* Each Redis call's deadline unless the config says (a plain literal, for
 * help text); the keys' prefix is the nodes' registrations'
 * (NODE_REG_DEFAULT_PREFIX, http/node_reg.h). */
#define ROUTER_STORE_DEFAULT_TIMEOUT_MS 50

typedef struct {
    uv_loop_t *loop;
    const char *url;               /* redis://...; NULL: in-process memory */
    const char *prefix;            /* keys' prefix (NULL: NODE_REG_DEFAULT_PREFIX) */
    int timeout_ms;                /* each Redis call's deadline (0: the default) */
    size_t max_entries, max_bytes; /* memory backend's bounds (router_state.h) */
    /* Decode nodes by URL: node_url(user, i) names node i; node_of finds
     * the node of a URL (DX_NONE: none this router knows). */
    const char *(*node_url)(void *user, int node);
    int (*node_of)(void *user, const char *url, size_t len);
    void *user;
} router_store_config;

/* What a lookup found: which of the keys asked for (the last one that has
 * an entry), its node and params (valid during the callback only). */
typedef struct {
    size_t which;
    int node;
    const char *params; /* NULL: affinity only */
    size_t params_len;
    uint32_t num_tokens;
} router_store_hit;

/* rc 0 and hit (NULL: no entry), or rc < 0: the store failed (counted). */
typedef void (*router_store_cb)(void *user, int rc, const router_store_hit *hit);

/* Checks the config (the URL, the prefix's length, timeout 1..60000) and
 * starts connecting; DX_EINVAL with a message naming the flag. */
int router_store_create(const router_store_config *cfg, router_store **out);
/* Frees it; pending lookups' callbacks are not called.  The loop must run
 * afterwards to close its handles.  NULL: no-op. */
void router_store_destroy(router_store *s);

/* 0, or DX_EINVAL when the prefix is too long or holds spaces or control
 * characters. */
int router_store_check_prefix(const char *prefix);

/* Looks keys[0..n) up (the last found wins: callers list content keys
 * shortest first) and calls cb, possibly before returning (memory, or Redis
 * unreachable).  When it is called later, *op names the lookup until then
 * (for router_store_cancel); else *op is NULL. */
void router_store_get(router_store *s, const router_key *keys, size_t n, router_store_cb cb,
                      void *user, router_store_op **op);
/* The lookup's callback will not be called. */
void router_store_cancel(router_store_op *op);
/* Stores k's entry unless it holds more tokens (compare-and-set), for
 * ttl_s seconds, and deletes `drop` (an entry this one supersedes; NULL:
 * none).  params (len bytes) may be NULL.  Not waited for. */
void router_store_put(router_store *s, const router_key *k, const router_key *drop, int node,
                      const char *params, size_t len, uint32_t num_tokens, double ttl_s);
/* Periodic housekeeping (the memory backend's expiry sweep). */
void router_store_tick(router_store *s);
/* Prometheus lines: errors by op, and the backend's own gauges. */
int router_store_metrics(router_store *s, dx_buf *b);
uint64_t router_store_errors(const router_store *s, const char *op); /* "get" | "put" */
int router_store_is_shared(const router_store *s);

/* The secret every router sharing this Redis keys conversations with: the
 * one under <prefix>secret, set by the first router (SET NX) — so replicas
 * without a common --internal-key-file still name a conversation alike.
 * Blocking, at start-up only; len bytes into out.  DX_EIO when Redis cannot
 * be reached. */
int router_store_secret(const char *url, const char *prefix, int timeout_ms, uint8_t *out,
                        size_t len);

/* ---- encoding (also for tests) ---- */

/* "<prefix>conv:<hi><lo>" as 32 lowercase hex digits into out. */
void router_store_key(const char *prefix, const router_key *k, char *out, size_t cap);
/* "<num_tokens> <url>\n<params>" appended to out. */
int router_store_encode(const char *url, uint32_t num_tokens, const char *params, size_t len,
                        dx_buf *out);
typedef struct {
    const char *url;
    size_t url_len;
    uint32_t num_tokens;
    const char *params; /* NULL when none */
    size_t params_len;
} router_store_val;
/* 0 and *out pointing into v, or DX_EFORMAT. */
int router_store_decode(const char *v, size_t n, router_store_val *out);
/* The compare-and-set script (KEYS: key [, drop]; ARGV: value, tokens, ttl ms). */
extern const char router_store_cas_lua[];

#endif
