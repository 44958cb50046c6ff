/* xfer_client: the reader's side of a KV pull (DESIGN.md §4–5).
 *
 * xfer_pull() is synchronous and thread-safe: call it from a worker thread
 * (never from the event loop: it blocks for up to timeout_s).  One pull:
 *
 *   TCP connect (only to an address the allow-list admits) → mutual
 *   authentication (kvport_auth.h; every connection) → HELLO (once per
 *   peer; the peer's identity, layout and transfer description are cached
 *   with a connected endpoint) → PIN → one READ per run of adjacent blocks
 *   (remote and local ids both adjacent), all in flight, with a RENEW of the
 *   pin every min(ttl, peer timeout)/3 while they run → RELEASE → close.
 *   The reader's AUTH_PROOF travels with the request after it (HELLO or
 *   PIN), which saves a round trip.
 *
 * Every step shares the pull's deadline, and no reply may take longer than
 * the peer timeout (a few seconds): the RENEWs double as a heartbeat, so a
 * holder that died or whose link went down is noticed within a few seconds
 * even when the pull's deadline is minutes away (TCP keepalive and
 * TCP_USER_TIMEOUT on the socket as well).  Any failure (peer unreachable
 * or not allowed, authentication failed, timeout, GONE, MISMATCH, refused
 * HELLO, UCX error, peer died mid-transfer, a RENEW not answered RENEW_OK)
 * comes back as res->err plus res->reason — never a crash or hang.  On failure after the PIN the
 * connection is just closed: the holder releases pins of a closed connection.  The local blocks
 * belong to the caller throughout; after a failed pull their contents are undefined (n_pulled is
 * 0).
 *
 * The reads are one-sided, so only the holder's RELEASE_OK proves that the
 * pin — and with it the blocks — held until they completed.  A RELEASE
 * answered otherwise (an error, the connection closed, a timeout) fails the
 * pull: err is set, n_pulled is 0 and reason says the pin may have lapsed,
 * because the blocks may have been freed and reused under the read.
 *
 * A short pull is not an error: if the holder's hashes match only the first
 * k blocks, k blocks are pulled, err is 0 and reason says where the chain
 * diverged. */
#ifndef XFER_CLIENT_H
#define XFER_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kv_pool.h"
#include "xfer/kvport_auth.h"
#include "xfer/kvport_proto.h"
#include "xfer/xfer_lease.h"
#include "xfer/xfer_peers.h"
#include "xfer/xfer_ucx.h"

typedef struct xfer_client xfer_client;

/* The timeouts a pull has when its caller leaves them 0 (plain literals,
 * for help text): one reply from the holder, and the whole pull. */
#define XFER_DEFAULT_PEER_TIMEOUT_S 5
#define XFER_DEFAULT_PULL_TIMEOUT_S 10

typedef struct {
    xfer_agent *agent;
    kv_pool *pool;             /* local pool, allocated through agent */
    const kvport_hello *hello; /* this node's HELLO (see xfer_hello_init); copied */
    const kvport_secret *secret; /* NULL: no secret; the caller's, kept until destroy */
    xfer_peers *peers;           /* addresses it may connect to; NULL: any (the caller's) */
    double peer_timeout_s;       /* longest wait for one reply (0: the default) */
} xfer_client_config;

typedef struct {
    const char *host;
    int port;
    xfer_token token;
    const kv_hash *chain;      /* [n] the reader's hashes of the wanted blocks */
    const int32_t *remote_ids; /* [n] holder's block ids, in token order */
    const int32_t *local_ids;  /* [n] destination blocks, held by the caller */
    size_t n;
    double timeout_s; /* whole pull; 0: XFER_DEFAULT_PULL_TIMEOUT_S */
    /* Called after PIN_OK, before the reads (metrics; tests use it to kill
     * the holder mid-transfer). */
    void (*on_pinned)(void *user, uint32_t n_matched);
    void *user;
    int no_renew; /* tests only: never RENEW, to prove a lapsed pin fails the pull */
} xfer_pull_req;

typedef struct {
    int err;             /* 0 or DX_E* (same as the return value) */
    uint32_t n_matched;  /* blocks the holder pinned */
    uint32_t n_pulled;   /* local_ids[0..n_pulled) now hold the remote KV */
    uint32_t n_reads;    /* READ requests after coalescing */
    uint32_t n_renewals; /* RENEW_OKs received while the reads ran */
    uint64_t bytes;
    int hello_cached;
    double t_connect_ms, t_auth_ms, t_hello_ms, t_pin_ms, t_read_ms, t_release_ms;
    char reason[256];
} xfer_pull_result;

/* Fills h with this node's identity: engine id (pointer kept), fingerprint,
 * the pool's geometry, a random per-process instance and the agent's
 * transfer description. */
void xfer_hello_init(kvport_hello *h, const char *engine_id, const uint8_t fingerprint[16],
                     const kv_pool *pool, xfer_agent *agent);

int xfer_client_create(const xfer_client_config *cfg, xfer_client **out);
void xfer_client_destroy(xfer_client *c);
/* Forgets a peer's cached HELLO and endpoint (e.g. after it restarted). */
void xfer_client_forget(xfer_client *c, const char *host, int port);

int xfer_pull(xfer_client *c, const xfer_pull_req *r, xfer_pull_result *res);

#endif
