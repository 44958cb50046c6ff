/* router_store: the conversation map's interface (see .h), which calls one
 * of two backends through its table (router_store_priv.h), and the memory
 * backend.  The Redis backend, with the entries' encoding in Redis, is in
 * router_store_redis.c. */
#include "router/router_store.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "http/node_reg.h"
#include "http/prom.h"
#include "router/router_store_priv.h"

/* ---- shared -------------------------------------------------------------------- */

int router_store_check_prefix(const char *prefix)
{
    if (strlen(prefix) > ROUTER_STORE_PREFIX_MAX)
        return dx_errf(DX_EINVAL, "--state-prefix: longer than %d bytes", ROUTER_STORE_PREFIX_MAX);
    for (const char *p = prefix; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f)
            return dx_errf(DX_EINVAL, "--state-prefix: spaces or control characters in '%.100s'",
                           prefix);
    return 0;
}

/* ---- the memory backend --------------------------------------------------------- */

static int mem_init(router_store *s)
{
    router_state_config sc = {.max_entries = s->cfg.max_entries, .max_bytes = s->cfg.max_bytes};
    return router_state_create(&sc, &s->mem);
}

static void mem_destroy(router_store *s)
{
    router_state_destroy(s->mem);
    rstore_free(s);
}

static void mem_get(router_store *s, const router_key *keys, size_t n, router_store_cb cb,
                    void *user, router_store_op **op)
{
    (void)op; /* answered before returning: no op */
    double now = dx_now_s();
    router_entry e;
    for (size_t i = n; i-- > 0;) {
        if (!router_state_get(s->mem, &keys[i], now, &e)) continue;
        rstore_hit(cb, user, i, e.node, e.params, e.params_len, e.num_tokens);
        return;
    }
    cb(user, 0, NULL);
}

static void mem_put(router_store *s, const router_key *k, const router_key *drop, int node,
                    const char *params, size_t len, uint32_t num_tokens, double ttl_s)
{
    double now = dx_now_s();
    router_entry e;
    if (router_state_get(s->mem, k, now, &e) && e.num_tokens > num_tokens) {
        s->stale++; /* an older turn finished after a newer one */
        return;
    }
    if (router_state_put(s->mem, k, node, params, len, num_tokens, now + ttl_s, now) < 0) {
        rstore_count_error(s, 0);
        return;
    }
    if (drop && !router_key_eq(drop, k)) router_state_del(s->mem, drop);
}

static void mem_tick(router_store *s)
{
    router_state_expire(s->mem, dx_now_s(), 4096); /* keep the map's memory honest */
}

static int mem_metrics(router_store *s, dx_buf *b)
{
    router_state_expire(s->mem, dx_now_s(), SIZE_MAX);
    int rc = prom_write_gauge(b, "duplex_router_conversations", "Conversations tracked",
                              (double)router_state_count(s->mem));
    if (!rc)
        rc = prom_write_gauge(b, "duplex_router_conversation_params_bytes",
                              "Bytes of kv_transfer_params held for conversations",
                              (double)router_state_bytes(s->mem));
    if (!rc)
        rc = prom_write_counter(
            b, "duplex_router_conversation_evictions_total",
            "Conversations dropped to stay within --max-conversations / the bytes bound",
            (double)router_state_evictions(s->mem));
    return rc;
}

static const rstore_backend rstore_mem = {
    .init = mem_init,
    .destroy = mem_destroy,
    .get = mem_get,
    .put = mem_put,
    .tick = mem_tick,
    .metrics = mem_metrics,
    .shared = 0,
};

/* ---- the interface ---------------------------------------------------------------- */

int router_store_create(const router_store_config *cfg, router_store **out)
{
    *out = NULL;
    const char *prefix = cfg->prefix ? cfg->prefix : NODE_REG_DEFAULT_PREFIX;
    int rc = router_store_check_prefix(prefix);
    if (rc) return rc;
    int timeout = cfg->timeout_ms ? cfg->timeout_ms : ROUTER_STORE_DEFAULT_TIMEOUT_MS;
    if (timeout < 1 || timeout > ROUTER_STORE_TIMEOUT_MAX)
        return dx_errf(DX_EINVAL, "--state-timeout-ms: %d is not 1..%d", timeout,
                       ROUTER_STORE_TIMEOUT_MAX);
    router_store *s = dx_calloc(1, sizeof *s);
    if (!s) return dx_errf(DX_ENOMEM, "router state: out of memory");
    s->cfg = *cfg;
    s->cfg.timeout_ms = timeout;
    snprintf(s->prefix, sizeof s->prefix, "%s", prefix);
    s->cfg.prefix = s->prefix;
    s->healthy = 1;
    dx_buf_init(&s->val, 0);
    s->be = cfg->url ? &rstore_redis : &rstore_mem;
    rc = s->be->init(s);
    if (rc) {
        router_state_destroy(s->mem);
        rstore_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void router_store_destroy(router_store *s)
{
    if (s) s->be->destroy(s);
}

void router_store_get(router_store *s, const router_key *keys, size_t n, router_store_cb cb,
                      void *user, router_store_op **op)
{
    *op = NULL;
    s->be->get(s, keys, n, cb, user, op);
}

void router_store_put(router_store *s, const router_key *k, const router_key *drop, int node,
                      const char *params, size_t len, uint32_t num_tokens, double ttl_s)
{
    if (!params) num_tokens = 0;
    s->be->put(s, k, drop, node, params, len, num_tokens, ttl_s);
}

void router_store_tick(router_store *s)
{
    if (s->be->tick) s->be->tick(s);
}

uint64_t router_store_errors(const router_store *s, const char *op)
{
    return !strcmp(op, "get") ? s->err_get : s->err_put;
}

int router_store_is_shared(const router_store *s)
{
    return s->be->shared;
}

int router_store_metrics(router_store *s, dx_buf *b)
{
    int rc = prom_write_header(b, "duplex_router_state_errors_total", "counter",
                               "State store calls that failed or timed out (routed without "
                               "affinity, or the entry not stored), by operation");
    if (!rc)
        rc = prom_write_value(b, "duplex_router_state_errors_total", "op=\"get\"",
                              (double)s->err_get);
    if (!rc)
        rc = prom_write_value(b, "duplex_router_state_errors_total", "op=\"put\"",
                              (double)s->err_put);
    if (!rc)
        rc = prom_write_counter(b, "duplex_router_state_stale_writes_total",
                                "Entries not replaced: the stored turn had more tokens",
                                (double)s->stale);
    return rc ? rc : s->be->metrics(s, b);
}
