/* node_kv: a node's side of KV transfer — the UCX agent that allocates and
 * registers the KV pool, the lease registry, the KV port peers read from,
 * and the client that pulls from other nodes' KV ports (docs/pd.md,
 * docs/kvport.md).
 *
 * Lifecycle, in the order the resources depend on each other:
 *
 *   node_kv_create        the agent (before the engine: the pool comes from it)
 *   node_kv_engine_hooks  pool allocation through the agent; under memory
 *                         pressure the engine revokes leases, LRU first
 *   engine_create
 *   node_kv_start         leases, this node's HELLO, the client, the KV port
 *   ...
 *   node_kv_close_port    no more pins (its connections' pins are released)
 *   engine_stop           no more events (the engine leases nothing after it)
 *   node_kv_drop_leases   every lease's block references
 *   engine_destroy        the pool
 *   node_kv_destroy       the agent that allocated the pool
 *
 * node_kv_hold may be called from any thread (the engine's event callback
 * does); node_kv_pull_run blocks and runs on a worker thread; the rest runs
 * on the node's loop. */
#ifndef NODE_KV_H
#define NODE_KV_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "engine/engine.h"
#include "node/hist.h"
#include "xfer/kvport_auth.h"
#include "xfer/kvport_server.h"
#include "xfer/xfer_lease.h"
#include "xfer/xfer_peers.h"

typedef struct node_kv node_kv;

/* node_kv_create's defaults for the config's times left 0 (plain
 * literals, for help text; the pin's, the pulls' and the history's are
 * their modules'). */
#define NODE_KV_DEFAULT_IDLE_TIMEOUT_S 60
#define NODE_KV_DEFAULT_LEASE_TTL_S    30
#define NODE_KV_DEFAULT_RETAIN_TTL_S   HIST_DEFAULT_TTL_S

typedef struct {
    const char *host;      /* KV port address (default 127.0.0.1) */
    int port;              /* 0 = any free port */
    const char *tls;       /* UCX_TLS, NULL = UCX's choice */
    const char *engine_id; /* this node's engine id (copied) */
    double pin_ttl_s;      /* how long an unreleased pin lives (XFER_LEASE_DEFAULT_PIN_TTL_S) */
    double idle_timeout_s; /* KV-port connection idle timeout */
    double lease_ttl_s;    /* a prefill node's hold for its decode node */
    double retain_ttl_s;   /* a decode node's retention */
    double pull_timeout_s; /* one whole pull (XFER_DEFAULT_PULL_TIMEOUT_S) */
    double peer_timeout_s; /* longest wait for one reply (XFER_DEFAULT_PEER_TIMEOUT_S) */
    /* The cluster secret both sides of the KV port prove (NULL: none) and
     * the addresses pulls may connect to (NULL: any); the caller's, kept
     * until node_kv_destroy. */
    const kvport_secret *secret;
    xfer_peers *peers;
} node_kv_config;

int node_kv_create(const node_kv_config *cfg, node_kv **out);
void node_kv_engine_hooks(node_kv *k, engine_config *ec);
/* fingerprint: the model's (model_fingerprint). */
int node_kv_start(node_kv *k, uv_loop_t *loop, const uint64_t fingerprint[2], kv_pool *pool);
void node_kv_close_port(node_kv *k);
void node_kv_drop_leases(node_kv *k);
void node_kv_destroy(node_kv *k);

const char *node_kv_engine_id(const node_kv *k);
const char *node_kv_host(const node_kv *k);
int node_kv_port(const node_kv *k); /* the bound port, once started */
kv_pool *node_kv_pool(const node_kv *k);
/* What makes this node's outputs (set by node_kv_start), as 16 bytes: the
 * model's fingerprint mixed with the KV cache's dtype (a q8_0 cache rounds
 * differently from an f16 one, so a first token computed with one is not
 * the other's).  What first_token_model carries. */
const xfer_token *node_kv_model(const node_kv *k);
double node_kv_lease_ttl(const node_kv *k, int retain);
/* The UCX transport list pulls use ("default": UCX's choice). */
const char *node_kv_transport(const node_kv *k);

/* Holds ids[0..n) (hashed full blocks) for readers: a prefill node's
 * single-use lease for its decode node (retain = 0), or a decode node's
 * retention (retain = 1: renewed when read, tagged by its last block's hash,
 * and superseding the older retentions it contains). */
int node_kv_hold(node_kv *k, const int32_t *ids, size_t n, int retain, xfer_token *tok);

/* Why a pull did not bring everything it asked for (metric labels). */
enum node_kv_fallback {
    NODE_KV_OK = 0,
    NODE_KV_PARTIAL,     /* the holder's hashes matched only a prefix */
    NODE_KV_NO_SPACE,    /* no local blocks to pull into */
    NODE_KV_UNREACHABLE, /* connect or name lookup failed */
    NODE_KV_REFUSED,     /* HELLO refused (another model) */
    NODE_KV_GONE,        /* lease unknown, expired or revoked */
    NODE_KV_MISMATCH,    /* the first block's hash differs */
    NODE_KV_TIMEOUT,
    NODE_KV_TRANSFER,    /* the read failed, or the pin lapsed */
    NODE_KV_AUTH,        /* the holder and this node do not share the KV secret */
    NODE_KV_NOT_ALLOWED, /* the holder's address is not a known peer (--kv-peers) */
    NODE_KV_LAYOUT,      /* HELLO refused: the same model with another KV dtype or block size */
    NODE_KV_ERROR,       /* anything else */
    NODE_KV_N_FALLBACKS
};
const char *node_kv_fallback_name(enum node_kv_fallback f);

typedef struct {
    /* in */
    const char *host;
    int port;
    xfer_token lease;
    const kv_hash *chain;      /* [n] our hashes of the wanted blocks */
    const int32_t *remote_ids; /* [n] */
    size_t n;
    /* out: local_ids[0..n_pulled) hold the KV, hashed and referenced (the
     * caller owns those references); nothing else is held. */
    int32_t *local_ids; /* [n], the caller's array */
    uint32_t n_pulled;
    enum node_kv_fallback why;
    uint64_t bytes;
    double seconds;
    double read_s, rtt_s; /* of which the reads, and the pin's round trip (the link's cost) */
    char reason[256];
} node_kv_pull;

void node_kv_pull_run(node_kv *k, node_kv_pull *p);

typedef struct {
    xfer_leases_stats leases;
    kvport_server_stats port;
} node_kv_stats;
void node_kv_get_stats(node_kv *k, node_kv_stats *out);

#endif
