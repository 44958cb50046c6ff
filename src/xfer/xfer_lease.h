/* xfer_lease: leases and pins on KV blocks (DESIGN.md §5–6).
 *
 * A lease is a capability: a set of block ids whose pool references it holds
 * while it lives, a 128-bit token from the kernel CSPRNG (getrandom), an
 * expiry and a use policy.  Knowing the token is the only way to pin; block
 * ids alone give nothing, and a token names exactly the blocks it was made
 * for.
 *
 * A pin is what a reader holds while it copies: PIN checks the token, checks
 * that every requested id belongs to the lease, and compares the reader's
 * hash chain with the held blocks' hashes, pinning the leading blocks that
 * match.  A pin takes its own pool references, so revoking or expiring the
 * lease while a read is in flight cannot free the blocks under the reader;
 * they go back on RELEASE or when the pin times out.  A reader whose read
 * outlasts the pin TTL renews the pin (xfer_pin_renew) before it lapses.
 *
 * Thread-safe (one mutex); the registry never touches block contents. */
#ifndef XFER_LEASE_H
#define XFER_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kv_pool.h"

typedef struct {
    uint8_t b[16];
} xfer_token;

enum xfer_lease_policy {
    XFER_LEASE_MULTI = 0,         /* any number of pins until expiry */
    XFER_LEASE_SINGLE_USE = 1,    /* revoked by the first RELEASE with consumed=1 */
    XFER_LEASE_RENEW_ON_READ = 2, /* each successful PIN pushes the expiry out by its TTL */
};

typedef struct {
    uint32_t n_blocks;
    int policy;
    double ttl_s;
    uint64_t expires_ns; /* dx_now_ns() clock */
    uint32_t n_pins;     /* live pins made through this lease */
} xfer_lease_info;

typedef struct {
    uint32_t leases, pins;
    uint64_t blocks; /* block references the live leases hold (a block in two counts twice) */
    uint64_t created, expired, revoked, pins_made, pins_timed_out, gone, mismatches;
    uint64_t revoked_lru; /* xfer_leases_revoke_lru: memory pressure */
    uint64_t superseded;  /* xfer_leases_supersede: a newer lease contains them */
    /* Live XFER_LEASE_RENEW_ON_READ leases (a decode node's retention: one
     * per conversation, each turn superseding the last) and the block
     * references they hold. */
    uint32_t retained;
    uint64_t retained_blocks;
} xfer_leases_stats;

typedef struct xfer_leases xfer_leases;

/* How long an unreleased pin holds its blocks unless the caller says
 * (xfer_leases_create's pin_ttl_s <= 0); a plain literal, for help text. */
#define XFER_LEASE_DEFAULT_PIN_TTL_S 30

/* pin_ttl_s: how long an unreleased pin holds its blocks (<= 0: the
 * default). */
int xfer_leases_create(kv_pool *pool, double pin_ttl_s, xfer_leases **out);
/* Drops every lease and pin and their references. */
void xfer_leases_destroy(xfer_leases *L);

/* Takes a reference on each of ids[0..n) (which must be valid, referenced
 * or not) and returns a fresh token.  DX_EINVAL for a bad id or ttl. */
int xfer_lease_create(xfer_leases *L, const int32_t *ids, size_t n, double ttl_s, int policy,
                      xfer_token *tok);
/* Same, with a non-zero tag (e.g. the hash of the lease's last block) by
 * which xfer_leases_supersede finds it. */
int xfer_lease_create_tagged(xfer_leases *L, const int32_t *ids, size_t n, double ttl_s,
                             int policy, uint64_t tag, xfer_token *tok);
/* New expiry = now + ttl_s.  DX_EGONE if unknown or expired. */
int xfer_lease_renew(xfer_leases *L, const xfer_token *tok, double ttl_s);
/* Drops the lease's references now (pins keep theirs).  DX_EGONE if unknown. */
int xfer_lease_revoke(xfer_leases *L, const xfer_token *tok);
/* Revokes the least recently used lease (created, renewed or pinned longest
 * ago): what memory pressure gives up first.  1 and *n_blocks (may be NULL)
 * = its block count, or 0 when there is none. */
int xfer_leases_revoke_lru(xfer_leases *L, uint32_t *n_blocks);
/* Revokes every lease tagged with one of tags[0..n) (zeros skipped): a newer
 * lease holds their blocks too.  Returns how many went. */
uint32_t xfer_leases_supersede(xfer_leases *L, const uint64_t *tags, size_t n);
int xfer_lease_lookup(xfer_leases *L, const xfer_token *tok, xfer_lease_info *out);

/* PIN: 0 with *pin_id and *n_matched >= 1; DX_EGONE (unknown or expired
 * token, an id not in this lease, or the first block no longer holds KV);
 * DX_EMISMATCH (the first block's hash differs).  The message says why. */
int xfer_pin(xfer_leases *L, const xfer_token *tok, const int32_t *ids, const kv_hash *chain,
             size_t n, uint64_t *pin_id, uint32_t *n_matched);
/* RELEASE: drops the pin's references.  DX_ENOENT for an unknown pin. */
int xfer_unpin(xfer_leases *L, uint64_t pin_id, int consumed);
/* RENEW: a reader whose one-sided reads are still running pushes the pin's
 * deadline to now + the pin TTL, which goes to *ttl_s.  O(1).  DX_EGONE for
 * a pin that was released, timed out (its deadline passed, swept or not) or
 * never existed: its blocks may already be back in the pool. */
int xfer_pin_renew(xfer_leases *L, uint64_t pin_id, double *ttl_s);
/* The pin TTL the registry was created with (what PIN_OK tells the reader). */
double xfer_leases_pin_ttl(const xfer_leases *L);

/* Drops expired leases and timed-out pins; returns how many went. */
uint32_t xfer_leases_sweep(xfer_leases *L, uint64_t now_ns);
void xfer_leases_get_stats(xfer_leases *L, xfer_leases_stats *out);

int xfer_token_random(xfer_token *tok);
/* 32 lowercase hex digits + NUL; parse accepts exactly 32 hex digits. */
void xfer_token_hex(const xfer_token *tok, char out[33]);
int xfer_token_parse(const char *hex, xfer_token *tok);

#endif
