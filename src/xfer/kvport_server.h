/* kvport_server: the KV port — a TCP listener on the node's libuv loop that
 * answers AUTH, HELLO, PIN, RENEW and RELEASE frames (kvport_proto.h)
 * against a lease registry (xfer_lease.h).  The data itself never crosses
 * this socket: after PIN_OK the reader copies blocks one-sidedly through the
 * transfer agent.
 *
 * Authentication first (kvport_auth.h): until a connection's peer has proved
 * it knows the cluster secret it may send only AUTH_INIT then AUTH_PROOF,
 * each at most KVPORT_MAX_AUTH_PAYLOAD bytes; anything else, or a wrong
 * proof, is answered ERROR (DX_EAUTH, "authentication failed", nothing more)
 * and the connection closes.  So HELLO's remote key, worker address, pool
 * base and layout reach authenticated peers only.
 *
 * Robustness: the handshake must finish within a deadline counted from the
 * accept, whatever the peer sends meanwhile; after it, the idle timeout
 * counts from the last *complete* frame, so dripping bytes keeps nothing
 * open.  The idle timeout never closes a connection that holds live pins:
 * its reader may be copying for longer than any timeout, with nothing to
 * say on this socket but RENEW.  Such pins end at RELEASE, at their deadline
 * (renewed by RENEW) or when the peer really goes (TCP keepalive notices a
 * dead one).  Connections are capped in total and per peer address, and
 * unauthenticated ones more tightly: past the per-address cap a new one is
 * closed at once, past the total the oldest unauthenticated one gives way.
 * Every reply byte queued for a peer counts, with its write request, against
 * a per-connection budget: past it the server stops reading from that peer
 * until the queue drains to half, so a peer that sends and never reads costs
 * one budget.  Every connection has a bounded input buffer (one maximal
 * frame); a malformed frame is answered with an ERROR frame; a bad header
 * closes only that connection.  Pins made on a connection are released when
 * it closes, so a reader that dies frees the holder's blocks at once rather
 * than at the pin timeout.  Expired leases and pins are swept on a timer.
 *
 * All functions run on the loop's thread. */
#ifndef KVPORT_SERVER_H
#define KVPORT_SERVER_H

#include <uv.h>

#include "xfer/kvport_auth.h"
#include "xfer/kvport_proto.h"
#include "xfer/xfer_lease.h"

/* From accept to authenticated, unless the config says (a plain literal,
 * for help text). */
#define KVPORT_DEFAULT_HANDSHAKE_TIMEOUT_S 10

typedef struct {
    const char *host; /* default "127.0.0.1" */
    int port;         /* 0 = any free port (see kvport_server_port) */
    xfer_leases *leases;
    /* This node's HELLO (engine id, fingerprint, layout, transfer
     * description); copied. */
    const kvport_hello *hello;
    const kvport_secret *secret;      /* NULL: no secret (see kvport_auth.h); the caller's */
    double handshake_timeout_s;       /* 0: KVPORT_DEFAULT_HANDSHAKE_TIMEOUT_S */
    double idle_timeout_s;            /* default 60: since the last complete frame; no live pins */
    double sweep_interval_s;          /* default 1 */
    unsigned max_conns;               /* default 256 */
    unsigned max_conns_per_peer;      /* default 128: from one address */
    unsigned max_handshakes;          /* default 64: unauthenticated; the oldest gives way */
    unsigned max_handshakes_per_peer; /* default 8: unauthenticated from one address */
    size_t max_queued;                /* default 1 MiB: reply bytes (with bookkeeping) per peer */
} kvport_server_config;

typedef struct {
    uint64_t conns, frames, errors, hellos_refused;
    uint64_t auth_ok, auth_failed, handshake_timeouts, idle_closed;
    uint64_t refused, evicted, paused;
} kvport_server_stats;

typedef struct kvport_server kvport_server;

int kvport_server_create(uv_loop_t *loop, const kvport_server_config *cfg, kvport_server **out);
int kvport_server_port(const kvport_server *s);
void kvport_server_get_stats(const kvport_server *s, kvport_server_stats *out);
/* Closes the listener and every connection (releasing their pins); memory
 * goes once the loop has run the close callbacks (run the loop afterwards). */
void kvport_server_destroy(kvport_server *s);

#endif
