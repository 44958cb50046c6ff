/* router_store_priv: what the front (router_store.c: the interface and the
 * memory backend) shares with the Redis backend (router_store_redis.c).
 *
 * Calls go one way: the front reaches a backend only through its
 * rstore_backend table, and a backend calls nothing in router_store.c —
 * the little both need is inline below. */
#ifndef ROUTER_STORE_PRIV_H
#define ROUTER_STORE_PRIV_H

#include <hiredis.h>
#include <async.h>

#include "base/dx_alloc.h"
#include "base/dx_list.h"
#include "http/rds.h"
#include "router/router_state.h"
#include "router/router_store.h"

typedef struct rstore_backend rstore_backend;

struct router_store {
    router_store_config cfg;
    char prefix[ROUTER_STORE_PREFIX_MAX + 1];
    const rstore_backend *be;
    router_state *mem; /* the memory backend's map; NULL: Redis */
    uint64_t err_get, err_put, stale;
    int healthy; /* no failure since the last answer: one warning per outage */
    dx_buf val;  /* scratch: an encoded entry */
    /* Redis */
    rds_url url;
    char where[RDS_HOST_MAX + 64]; /* the URL for messages, password hidden */
    redisAsyncContext *ac;         /* NULL while waiting to reconnect */
    int connected, destroying, n_handles;
    uint64_t backoff_ms;
    uv_timer_t deadline; /* the oldest pending call's deadline */
    uv_timer_t retry;    /* reconnect backoff; also the connect's deadline */
    dx_list live;      /* router_store_op.link: calls not yet answered or timed out, oldest first */
    size_t n_inflight; /* calls hiredis still holds */
    uint64_t last_answer_ns;
    char sha[48]; /* the CAS script's, once loaded */
};

/* A backend, as the front calls it (router_store.h says what each does). */
struct rstore_backend {
    /* Fills in the backend's part of s (the front has set the rest);
     * on failure the front frees s. */
    int (*init)(router_store *s);
    /* Frees s with rstore_free, at once or once its handles have closed. */
    void (*destroy)(router_store *s);
    void (*get)(router_store *s, const router_key *keys, size_t n, router_store_cb cb, void *user,
                router_store_op **op);
    void (*put)(router_store *s, const router_key *k, const router_key *drop, int node,
                const char *params, size_t len, uint32_t num_tokens, double ttl_s);
    void (*tick)(router_store *s); /* NULL: nothing to do */
    /* The backend's own lines, after the front's error counters. */
    int (*metrics)(router_store *s, dx_buf *b);
    int shared; /* every router replica sees the same entries */
};

extern const rstore_backend rstore_redis;

static inline void rstore_count_error(router_store *s, int get)
{
    if (get)
        s->err_get++;
    else
        s->err_put++;
}

/* Answers a lookup with the entry found under keys[which]. */
static inline void rstore_hit(router_store_cb cb, void *user, size_t which, int node,
                              const char *params, size_t params_len, uint32_t num_tokens)
{
    router_store_hit h = {.which = which,
                          .node = node,
                          .params = params,
                          .params_len = params_len,
                          .num_tokens = num_tokens};
    cb(user, 0, &h);
}

/* What the front allocated; a backend frees its own parts first. */
static inline void rstore_free(router_store *s)
{
    dx_buf_free(&s->val);
    dx_free(s);
}

#endif
