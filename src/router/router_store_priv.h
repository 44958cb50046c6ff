/* router_store_priv: what router_store.c (interface, encoding, memory) and
 * router_store_redis.c (the Redis backend) share. */
#ifndef ROUTER_STORE_PRIV_H
#define ROUTER_STORE_PRIV_H

#include <hiredis.h>
#include <async.h>

#include "http/rds.h"
#include "router/router_state.h"
#include "router/router_store.h"

struct router_store {
    router_store_config cfg;
    char prefix[ROUTER_STORE_PREFIX_MAX + 1];
    router_state *mem; /* the memory backend; NULL: Redis */
    uint64_t err_get, err_put, stale;
    int healthy; /* no failure since the last answer: one warning per outage */
    dx_buf val;  /* scratch: an encoded entry */
    /* Redis */
    rds_url url;
    char where[RDS_HOST_MAX + 64]; /* the URL for messages, password hidden */
    redisAsyncContext *ac;         /* NULL while waiting to reconnect */
    int connected, destroying, n_handles;
    uint64_t backoff_ms;
    uv_timer_t deadline;                    /* the oldest pending call's deadline */
    uv_timer_t retry;                       /* reconnect backoff; also the connect's deadline */
    router_store_op *live_head, *live_tail; /* calls not yet answered or timed out, oldest first */
    size_t n_inflight;                      /* calls hiredis still holds */
    uint64_t last_answer_ns;
    char sha[48]; /* the CAS script's, once loaded */
};

int rstore_redis_init(router_store *s);
void rstore_redis_destroy(router_store *s);
void rstore_redis_get(router_store *s, const router_key *keys, size_t n, router_store_cb cb,
                      void *user, router_store_op **op);
void rstore_redis_put(router_store *s, const router_key *k, const router_key *drop, int node,
                      const char *params, size_t len, uint32_t num_tokens, double ttl_s);
void rstore_count_error(router_store *s, int get);
void rstore_free(router_store *s);

#endif
