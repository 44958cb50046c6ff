/* kvport_server: the KV port — a TCP listener on the node's libuv loop that
 * answers HELLO, PIN, RENEW and RELEASE frames (kvport_proto.h) against a lease
 * registry (xfer_lease.h).  The data itself never crosses this socket: after
 * PIN_OK the reader copies blocks one-sidedly through the transfer agent.
 *
 * Robustness: every connection has a bounded input buffer (one maximal
 * frame), a bounded output queue and an idle timeout; a malformed frame is
 * answered with an ERROR frame; a bad header closes only that connection.
 * Pins made on a connection are released when it closes, so a reader that
 * dies frees the holder's blocks at once rather than at the pin timeout.
 * The idle timeout never closes a connection that holds live pins: its
 * reader may be copying for longer than any timeout, with nothing to say on
 * this socket but RENEW.  Such pins end at RELEASE, at their deadline
 * (renewed by RENEW) or when the peer really goes.  Expired leases and pins
 * are swept on a timer.
 *
 * All functions run on the loop's thread. */
#ifndef KVPORT_SERVER_H
#define KVPORT_SERVER_H

#include <uv.h>

#include "xfer/kvport_proto.h"
#include "xfer/xfer_lease.h"

typedef struct {
    const char *host; /* default "127.0.0.1" */
    int port;         /* 0 = any free port (see kvport_server_port) */
    xfer_leases *leases;
    /* This node's HELLO (engine id, fingerprint, layout, transfer
     * description); copied. */
    const kvport_hello *hello;
    double idle_timeout_s;   /* default 60; connections without live pins only */
    double sweep_interval_s; /* default 1 */
    unsigned max_conns;      /* default 256 */
} kvport_server_config;

typedef struct {
    uint64_t conns, frames, errors, hellos_refused;
} kvport_server_stats;

typedef struct kvport_server kvport_server;

int kvport_server_create(uv_loop_t *loop, const kvport_server_config *cfg, kvport_server **out);
int kvport_server_port(const kvport_server *s);
void kvport_server_get_stats(const kvport_server *s, kvport_server_stats *out);
/* Closes the listener and every connection (releasing their pins); memory
 * goes once the loop has run the close callbacks (run the loop afterwards). */
void kvport_server_destroy(kvport_server *s);

#endif
