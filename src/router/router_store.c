/* router_store: the conversation map's two backends behind one interface
 * (see .h).  The encoding and the memory backend are here; the Redis
 * backend is in router_store_redis.c. */
#include "router/router_store.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "http/prom.h"
#include "http/rds.h"
#include "router/router_store_priv.h"

/* Replaces an entry only with one of at least as many tokens: a later turn
 * has more, and a tie is the newer write of the same turn. */
const char router_store_cas_lua[] = "local cur = redis.call('GET', KEYS[1])\n"
                                    "if cur then\n"
                                    "  local t = tonumber(string.match(cur, '^(%d+) '))\n"
                                    "  if t and t > tonumber(ARGV[2]) then return 0 end\n"
                                    "end\n"
                                    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])\n"
                                    "if KEYS[2] then redis.call('DEL', KEYS[2]) end\n"
                                    "return 1\n";

/* ---- encoding ---------------------------------------------------------------- */

void router_store_key(const char *prefix, const router_key *k, char *out, size_t cap)
{
    snprintf(out, cap, "%sconv:%016" PRIx64 "%016" PRIx64, prefix, k->hi, k->lo);
}

int router_store_encode(const char *url, uint32_t num_tokens, const char *params, size_t len,
                        dx_buf *out)
{
    int rc = dx_buf_printf(out, "%" PRIu32 " %s\n", params ? num_tokens : 0, url);
    if (!rc && params) rc = dx_buf_append(out, params, len);
    return rc;
}

int router_store_decode(const char *v, size_t n, router_store_val *out)
{
    memset(out, 0, sizeof *out);
    size_t i = 0;
    uint64_t t = 0;
    for (; i < n && v[i] >= '0' && v[i] <= '9'; i++) {
        t = t * 10 + (uint64_t)(v[i] - '0');
        if (t > UINT32_MAX) return dx_errf(DX_EFORMAT, "state entry: token count out of range");
    }
    if (i == 0 || i >= n || v[i] != ' ')
        return dx_errf(DX_EFORMAT, "state entry: no token count before the node URL");
    const char *url = v + i + 1, *nl = memchr(url, '\n', n - i - 1);
    if (!nl || nl == url) return dx_errf(DX_EFORMAT, "state entry: no node URL line");
    out->num_tokens = (uint32_t)t;
    out->url = url;
    out->url_len = (size_t)(nl - url);
    size_t rest = n - (size_t)(nl + 1 - v);
    if (rest) {
        out->params = nl + 1;
        out->params_len = rest;
    }
    return 0;
}

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

int router_store_create(const router_store_config *cfg, router_store **out)
{
    *out = NULL;
    const char *prefix = cfg->prefix ? cfg->prefix : "duplex:";
    int rc = router_store_check_prefix(prefix);
    if (rc) return rc;
    int timeout = cfg->timeout_ms ? cfg->timeout_ms : 50;
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
    if (cfg->url) {
        rc = rstore_redis_init(s);
    } else {
        router_state_config sc = {.max_entries = cfg->max_entries, .max_bytes = cfg->max_bytes};
        rc = router_state_create(&sc, &s->mem);
    }
    if (rc) {
        dx_buf_free(&s->val);
        router_state_destroy(s->mem);
        dx_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void rstore_free(router_store *s)
{
    dx_buf_free(&s->val);
    router_state_destroy(s->mem);
    dx_free(s);
}

void router_store_destroy(router_store *s)
{
    if (!s) return;
    if (s->mem)
        rstore_free(s);
    else
        rstore_redis_destroy(s);
}

void rstore_count_error(router_store *s, int get)
{
    if (get)
        s->err_get++;
    else
        s->err_put++;
}

void router_store_get(router_store *s, const router_key *keys, size_t n, router_store_cb cb,
                      void *user, router_store_op **op)
{
    *op = NULL;
    if (!s->mem) {
        rstore_redis_get(s, keys, n, cb, user, op);
        return;
    }
    double now = dx_now_s();
    router_entry e;
    for (size_t i = n; i-- > 0;) {
        if (!router_state_get(s->mem, &keys[i], now, &e)) continue;
        router_store_hit h = {.which = i,
                              .node = e.node,
                              .params = e.params,
                              .params_len = e.params_len,
                              .num_tokens = e.num_tokens};
        cb(user, 0, &h);
        return;
    }
    cb(user, 0, NULL);
}

void router_store_put(router_store *s, const router_key *k, const router_key *drop, int node,
                      const char *params, size_t len, uint32_t num_tokens, double ttl_s)
{
    if (!params) num_tokens = 0;
    if (!s->mem) {
        rstore_redis_put(s, k, drop, node, params, len, num_tokens, ttl_s);
        return;
    }
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

void router_store_tick(router_store *s)
{
    if (s->mem) router_state_expire(s->mem, dx_now_s(), 4096); /* keep the map's memory honest */
}

uint64_t router_store_errors(const router_store *s, const char *op)
{
    return !strcmp(op, "get") ? s->err_get : s->err_put;
}

int router_store_is_shared(const router_store *s)
{
    return s->mem == NULL;
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
    if (rc || !s->mem)
        return rc ? rc
                  : prom_write_gauge(b, "duplex_router_state_up",
                                     "1 while the shared state store answers", s->healthy && s->ac);
    router_state_expire(s->mem, dx_now_s(), SIZE_MAX);
    rc = prom_write_gauge(b, "duplex_router_conversations", "Conversations tracked",
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
