/* xfer_lease_priv: registry internals for the xfer folder and its tests. */
#ifndef XFER_LEASE_PRIV_H
#define XFER_LEASE_PRIV_H

#include <stdint.h>

#include "xfer/xfer_lease.h"

/* 1 while pin_id is live (not released, not timed out).  The KV port uses it
 * to forget the ids of pins that timed out under a connection. */
int xfer_pin_live(xfer_leases *L, uint64_t pin_id);

/* Tests: xfer_lease_create with a chosen token; DX_EEXIST if a lease (live or
 * awaiting the sweep) already has it. */
int xfer_lease_create_as(xfer_leases *L, const xfer_token *tok, const int32_t *ids, size_t n,
                         double ttl_s, int policy);
/* Tests: index hash = low 64 bits of the token or pin id & mask, so tests can
 * force collisions (mask 0: every key in one probe run).  Only while empty. */
void xfer_leases_weak_hash(xfer_leases *L, uint64_t mask);
/* Tests: the clock that expiry and pin deadlines read (default dx_now_ns),
 * so that a test decides when a lease lapses, not the machine's speed. */
void xfer_leases_set_clock(xfer_leases *L, uint64_t (*now)(void));
/* Tests: the indexes, arrays and per-lease pin lists agree.  0 or
 * DX_EMISMATCH with a message. */
int xfer_leases_check(xfer_leases *L);

#endif
