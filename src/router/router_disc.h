/* router_disc: the router's view of the nodes that register themselves in
 * Redis (`duplex router --discover`, node/node_reg.h, docs/router.md).
 *
 * Every interval a scan (SCAN <prefix>node:* + MGET, node_reg_scan) runs
 * on libuv's thread pool with a blocking connection of its own, so Redis
 * being slow or down never stalls the loop; at most one scan is in flight.
 * Its result comes back on the loop thread: every valid registration, or
 * ok = 0 when Redis could not be read (the router then keeps what it knew;
 * the health checks still notice dead nodes).  An outage is logged once. */
#ifndef ROUTER_DISC_H
#define ROUTER_DISC_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "http/node_reg.h"

typedef struct router_disc router_disc;

/* Loop thread.  ok = 0: the scan failed, v and n say nothing. */
typedef void (*router_disc_fn)(void *user, const node_reg_info *v, size_t n, int ok);

typedef struct {
    const rds_url *redis; /* copied */
    const char *prefix;   /* checked by the caller (node_reg_check_prefix) */
    uint64_t interval_ms;
    router_disc_fn on_scan;
    void *user;
} router_disc_config;

/* Starts the timer; the first scan runs at once.  DX_ENOMEM. */
int router_disc_create(uv_loop_t *loop, const router_disc_config *c, router_disc **out);
/* No callback after this; the memory goes when the timer has closed and a
 * scan in flight has ended (run the loop).  NULL: no-op. */
void router_disc_destroy(router_disc *d);
/* Scans that failed (Redis unreachable or erroring). */
uint64_t router_disc_errors(const router_disc *d);
/* Registrations that did not parse in the last scan (skipped). */
size_t router_disc_bad(const router_disc *d);

#endif
