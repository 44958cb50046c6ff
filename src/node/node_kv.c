/* node_kv: the node's KV transfer resources and its pulls (see .h). */
#include "node/node_kv.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "xfer/xfer_client.h"
#include "xfer/xfer_ucx.h"

struct node_kv {
    node_kv_config cfg;
    char engine_id[129];
    char host[256];
    xfer_agent *agent;
    kv_pool *pool;
    xfer_leases *leases; /* read by the engine thread's reclaim: atomic */
    xfer_client *client;
    kvport_server *port;
    kvport_hello hello;
    xfer_token model; /* the model's fingerprint, as params carry it */
};

static double or_default(double v, double d)
{
    return v > 0 ? v : d;
}

int node_kv_create(const node_kv_config *cfg, node_kv **out)
{
    *out = NULL;
    node_kv *k = dx_calloc(1, sizeof *k);
    if (!k) return dx_errf(DX_ENOMEM, "out of memory");
    k->cfg = *cfg;
    k->cfg.pin_ttl_s = or_default(cfg->pin_ttl_s, XFER_LEASE_DEFAULT_PIN_TTL_S);
    k->cfg.idle_timeout_s = or_default(cfg->idle_timeout_s, NODE_KV_DEFAULT_IDLE_TIMEOUT_S);
    k->cfg.lease_ttl_s = or_default(cfg->lease_ttl_s, NODE_KV_DEFAULT_LEASE_TTL_S);
    k->cfg.retain_ttl_s = or_default(cfg->retain_ttl_s, NODE_KV_DEFAULT_RETAIN_TTL_S);
    k->cfg.pull_timeout_s = or_default(cfg->pull_timeout_s, XFER_DEFAULT_PULL_TIMEOUT_S);
    k->cfg.peer_timeout_s = or_default(cfg->peer_timeout_s, XFER_DEFAULT_PEER_TIMEOUT_S);
    snprintf(k->host, sizeof k->host, "%s", cfg->host ? cfg->host : "127.0.0.1");
    snprintf(k->engine_id, sizeof k->engine_id, "%s", cfg->engine_id ? cfg->engine_id : "");
    k->cfg.host = k->host;
    k->cfg.engine_id = k->engine_id;
    xfer_agent_config ac = {.tls = cfg->tls};
    int rc = xfer_agent_create(&ac, &k->agent);
    if (rc) {
        dx_free(k);
        return dx_err_wrap(rc, "KV transfer agent");
    }
    *out = k;
    return 0;
}

/* The engine thread, when the pool is dry: retained KV gives way first. */
static int reclaim(void *user)
{
    node_kv *k = user;
    xfer_leases *L = __atomic_load_n(&k->leases, __ATOMIC_ACQUIRE);
    return L && xfer_leases_revoke_lru(L, NULL);
}

void node_kv_engine_hooks(node_kv *k, engine_config *ec)
{
    ec->kv_alloc = xfer_agent_alloc;
    ec->kv_release = xfer_agent_release;
    ec->kv_alloc_user = k->agent;
    ec->kv_reclaim = reclaim;
    ec->kv_reclaim_user = k;
}

/* XXH3-128 of "duplex-kv-model", the fingerprint and the KV dtype (u32 LE). */
static void model_token(const uint8_t fp[16], int dtype, xfer_token *out)
{
    uint8_t buf[16 + 16 + 4] = "duplex-kv-model";
    memcpy(buf + 16, fp, 16);
    for (int i = 0; i < 4; i++) buf[32 + i] = (uint8_t)((uint32_t)dtype >> (8 * i));
    XXH128_hash_t h = XXH3_128bits(buf, sizeof buf);
    for (int i = 0; i < 8; i++) {
        out->b[i] = (uint8_t)(h.low64 >> (8 * i));
        out->b[8 + i] = (uint8_t)(h.high64 >> (8 * i));
    }
}

int node_kv_start(node_kv *k, uv_loop_t *loop, const uint64_t fingerprint[2], kv_pool *pool)
{
    uint8_t fp[16];
    memcpy(fp, fingerprint, sizeof fp);
    model_token(fp, kv_pool_dtype(pool), &k->model);
    k->pool = pool;
    xfer_hello_init(&k->hello, k->engine_id, fp, pool, k->agent);
    xfer_leases *L;
    int rc = xfer_leases_create(pool, k->cfg.pin_ttl_s, &L);
    if (rc) return rc;
    __atomic_store_n(&k->leases, L, __ATOMIC_RELEASE);
    xfer_client_config cc = {.agent = k->agent,
                             .pool = pool,
                             .hello = &k->hello,
                             .secret = k->cfg.secret,
                             .peers = k->cfg.peers,
                             .peer_timeout_s = k->cfg.peer_timeout_s};
    rc = xfer_client_create(&cc, &k->client);
    if (rc) return rc;
    kvport_server_config kc = {.host = k->host,
                               .port = k->cfg.port,
                               .leases = L,
                               .hello = &k->hello,
                               .secret = k->cfg.secret,
                               .idle_timeout_s = k->cfg.idle_timeout_s};
    rc = kvport_server_create(loop, &kc, &k->port);
    return rc ? dx_err_wrap(rc, "KV port %s:%d", k->host, k->cfg.port) : 0;
}

void node_kv_close_port(node_kv *k)
{
    if (!k) return;
    kvport_server_destroy(k->port);
    k->port = NULL;
}

void node_kv_drop_leases(node_kv *k)
{
    if (!k) return;
    xfer_client_destroy(k->client);
    k->client = NULL;
    xfer_leases *L = __atomic_exchange_n(&k->leases, NULL, __ATOMIC_ACQ_REL);
    xfer_leases_destroy(L);
}

void node_kv_destroy(node_kv *k)
{
    if (!k) return;
    node_kv_close_port(k);
    node_kv_drop_leases(k);
    xfer_agent_destroy(k->agent);
    dx_free(k);
}

const char *node_kv_engine_id(const node_kv *k)
{
    return k->engine_id;
}

const char *node_kv_host(const node_kv *k)
{
    return k->host;
}

int node_kv_port(const node_kv *k)
{
    return k->port ? kvport_server_port(k->port) : 0;
}

const xfer_token *node_kv_model(const node_kv *k)
{
    return &k->model;
}

kv_pool *node_kv_pool(const node_kv *k)
{
    return k->pool;
}

double node_kv_lease_ttl(const node_kv *k, int retain)
{
    return retain ? k->cfg.retain_ttl_s : k->cfg.lease_ttl_s;
}

const char *node_kv_transport(const node_kv *k)
{
    return xfer_agent_tls(k->agent);
}

/* A lease's tag: its last block's hash, folded to non-zero 64 bits. */
static uint64_t block_tag(kv_pool *pool, int32_t id)
{
    kv_hash h;
    if (!kv_pool_block_hash(pool, id, &h)) return 0;
    return (h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)) | 1;
}

int node_kv_hold(node_kv *k, const int32_t *ids, size_t n, int retain, xfer_token *tok)
{
    xfer_leases *L = __atomic_load_n(&k->leases, __ATOMIC_ACQUIRE);
    if (!L) return dx_errf(DX_ECLOSED, "the KV port is shut down");
    if (!retain)
        return xfer_lease_create(L, ids, n, k->cfg.lease_ttl_s, XFER_LEASE_SINGLE_USE, tok);
    /* Every older retention whose last block is one of ours is contained in
     * this one (same hash, same tokens before it): this conversation's
     * previous turn.  Its blocks stay held by the new lease. */
    uint64_t *tags = dx_malloc(n * sizeof *tags);
    if (!tags) return dx_errf(DX_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) tags[i] = block_tag(k->pool, ids[i]);
    xfer_leases_supersede(L, tags, n);
    int rc = xfer_lease_create_tagged(L, ids, n, k->cfg.retain_ttl_s, XFER_LEASE_RENEW_ON_READ,
                                      tags[n - 1], tok);
    dx_free(tags);
    return rc;
}

const char *node_kv_fallback_name(enum node_kv_fallback f)
{
    static const char *const names[NODE_KV_N_FALLBACKS] = {
        "none",     "partial", "no_space", "unreachable", "refused",          "gone",
        "mismatch", "timeout", "transfer", "auth",        "peer_not_allowed", "layout_mismatch",
        "error"};
    return f < NODE_KV_N_FALLBACKS ? names[f] : "error";
}

static enum node_kv_fallback classify(const xfer_pull_result *r)
{
    switch (r->err) {
    case DX_EGONE:
        return NODE_KV_GONE;
    case DX_EMISMATCH: /* at HELLO (another model) or at PIN (first hash) */
        return strstr(r->reason, "HELLO") ? NODE_KV_REFUSED : NODE_KV_MISMATCH;
    case DX_EUNSUPPORTED: /* the holder speaks another protocol version */
        return NODE_KV_REFUSED;
    case DX_ETIMEDOUT:
        return NODE_KV_TIMEOUT;
    case DX_EAUTH:
        return NODE_KV_AUTH;
    case DX_EDENIED:
        return NODE_KV_NOT_ALLOWED;
    case DX_ELAYOUT: /* at HELLO, before any read: the KV dtypes or block sizes differ */
        return NODE_KV_LAYOUT;
    case DX_EIO:
        return r->t_hello_ms == 0 && r->t_pin_ms == 0 ? NODE_KV_UNREACHABLE : NODE_KV_TRANSFER;
    case DX_ETRANSPORT:
    case DX_ECLOSED:
        return NODE_KV_TRANSFER;
    default:
        return NODE_KV_ERROR;
    }
}

/* Local blocks to pull into; under pressure retained KV makes room first
 * (a pull serves a request, and requests win over retention). */
static int alloc_dest(node_kv *k, size_t n, int32_t *ids)
{
    for (;;) {
        if (kv_pool_alloc_n(k->pool, n, ids) == 0) return 0;
        xfer_leases *L = __atomic_load_n(&k->leases, __ATOMIC_ACQUIRE);
        if (!L || !xfer_leases_revoke_lru(L, NULL))
            return dx_errf(DX_EFULL, "KV pool: no room for %zu pulled blocks", n);
    }
}

void node_kv_pull_run(node_kv *k, node_kv_pull *p)
{
    uint64_t t0 = dx_now_ns();
    p->n_pulled = 0;
    p->bytes = 0;
    p->reason[0] = 0;
    if (alloc_dest(k, p->n, p->local_ids)) {
        p->why = NODE_KV_NO_SPACE;
        snprintf(p->reason, sizeof p->reason, "no free KV blocks for %zu pulled blocks", p->n);
        p->seconds = (double)(dx_now_ns() - t0) * 1e-9;
        return;
    }
    xfer_pull_req rq = {.host = p->host,
                        .port = p->port,
                        .token = p->lease,
                        .chain = p->chain,
                        .remote_ids = p->remote_ids,
                        .local_ids = p->local_ids,
                        .n = p->n,
                        .timeout_s = k->cfg.pull_timeout_s};
    xfer_pull_result res;
    int rc = xfer_pull(k->client, &rq, &res);
    uint32_t got = rc ? 0 : res.n_pulled;
    for (size_t i = got; i < p->n; i++) kv_pool_unref(k->pool, p->local_ids[i]);
    for (uint32_t i = 0; i < got; i++) kv_pool_publish(k->pool, &p->local_ids[i], p->chain[i]);
    p->n_pulled = got;
    p->bytes = got ? res.bytes : 0;
    p->why = rc ? classify(&res) : got < p->n ? NODE_KV_PARTIAL : NODE_KV_OK;
    snprintf(p->reason, sizeof p->reason, "%s", res.reason);
    p->seconds = (double)(dx_now_ns() - t0) * 1e-9;
    p->read_s = res.t_read_ms * 1e-3;
    p->rtt_s = res.t_pin_ms * 1e-3;
    if (rc) DX_LOGD("kv pull from %s:%d failed: %s", p->host, p->port, res.reason);
    DX_LOGD("kv pull from %s:%d: %u of %zu blocks in %u reads, %.2f MB; connect %.2f ms, hello "
            "%.2f%s, pin %.2f, read %.2f, release %.2f",
            p->host, p->port, got, p->n, res.n_reads, (double)res.bytes / 1e6, res.t_connect_ms,
            res.t_hello_ms, res.hello_cached ? " (cached)" : "", res.t_pin_ms, res.t_read_ms,
            res.t_release_ms);
}

void node_kv_get_stats(node_kv *k, node_kv_stats *out)
{
    memset(out, 0, sizeof *out);
    xfer_leases *L = __atomic_load_n(&k->leases, __ATOMIC_ACQUIRE);
    if (L) xfer_leases_get_stats(L, &out->leases);
    if (k->port) kvport_server_get_stats(k->port, &out->port);
}
