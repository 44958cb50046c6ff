/* xfer_ucx: the data path — one-sided reads of KV blocks, behind a small
 * transport-neutral interface (register, describe, read, progress) so that a
 * libfabric backend can join later.  This file's backend is UCX.
 *
 *  - register: the KV pool arena is allocated *by* the agent (pass
 *    xfer_agent_alloc / xfer_agent_release as kv_pool_config.alloc/release
 *    with the agent as user data): ucp_mem_map(UCP_MEM_MAP_ALLOCATE), so UCX
 *    can place it where its shared-memory transports read it directly (its
 *    pages are faulted in by the pool's owner: kv_pool_populate).
 *  - describe: worker address + packed rkey + base address, the bytes a peer
 *    needs (sent in the KV port's HELLO).
 *  - read: xfer_read copies runs of remote bytes into local memory with
 *    ucp_get_nbx, all runs in flight at once; the caller coalesces blocks
 *    into runs.  Bounded by a deadline: on timeout, peer failure or an abort
 *    from the caller's tick the outstanding requests are cancelled and the
 *    endpoint force-closed before returning, so nothing writes into the
 *    caller's memory afterwards.  The tick is how a reader keeps the
 *    holder's pin alive during a long read (xfer_client renews it).
 *  - progress: a thread sleeps on the worker's event fd (ucp_worker_arm) and
 *    progresses the worker, because over TCP UCX emulates READ in software on
 *    the holder.  On one host the pool (allocated by UCX's sysv/posix
 *    allocator) is attached by the reader and a READ is a plain copy by the
 *    reader: the holder's CPU only answers PIN and RELEASE (`duplex bench
 *    xfer` measures it from /proc: ~0.3 ms over 176 MB of pulls).
 *
 * One worker per agent, used from any thread under the agent's mutex
 * (UCS_THREAD_MODE_SERIALIZED underneath). */
#ifndef XFER_UCX_H
#define XFER_UCX_H

#include <stddef.h>
#include <stdint.h>

typedef struct xfer_agent xfer_agent;
typedef struct xfer_peer xfer_peer;

typedef struct {
    const char *tls;        /* UCX_TLS value (--kv-transport-tls); NULL/"" = UCX's choice */
    int no_progress_thread; /* 1: the caller never serves reads (tests, pure readers) */
} xfer_agent_config;

typedef struct {
    const uint8_t *worker_addr;
    size_t worker_addr_len;
    const uint8_t *rkey; /* NULL until a region was allocated */
    size_t rkey_len;
    uint64_t base;
    size_t length;
} xfer_desc;

typedef struct {
    uint64_t remote; /* remote virtual address */
    void *local;
    size_t len;
} xfer_read_op;

int xfer_agent_create(const xfer_agent_config *cfg, xfer_agent **out);
/* Stops the progress thread, closes the worker, releases the region if it
 * is still held (kv_pool_destroy releases it), frees the context. */
void xfer_agent_destroy(xfer_agent *a);

/* kv_pool_config.alloc / .release hooks; user = the agent.  One region per
 * agent (the KV pool); a second alloc fails.  Release stops serving peers
 * first (the progress thread stops, the worker closes), so no peer's READ
 * reaches the region once it is unmapped: their reads fail instead.  The
 * agent's own peers must be destroyed before; after it the agent has no
 * worker (xfer_agent_describe gives no address, xfer_peer_connect fails). */
void *xfer_agent_alloc(void *user, size_t bytes);
void xfer_agent_release(void *user, void *p, size_t bytes);

/* Pointers stay valid until the region is released (or the agent destroyed). */
void xfer_agent_describe(xfer_agent *a, xfer_desc *out);
/* The transport list the agent was configured with ("default" when UCX
 * chooses); UCX_LOG_LEVEL=info shows what each endpoint actually uses. */
const char *xfer_agent_tls(const xfer_agent *a);

/* A connected peer: endpoint + unpacked rkey for one remote region. */
int xfer_peer_connect(xfer_agent *a, const uint8_t *worker_addr, size_t addr_len,
                      const uint8_t *rkey, size_t rkey_len, uint64_t base, size_t length,
                      xfer_peer **out);
/* 1 once the endpoint reported an error or a read failed: drop and reconnect. */
int xfer_peer_failed(const xfer_peer *p);
void xfer_peer_destroy(xfer_peer *p);

/* Work to do at intervals while reads are outstanding: xfer_read calls
 * fn(user) every period_ns (the first call one period after the reads were
 * posted; fn may change period_ns).  A non-zero return from fn — a DX_E*
 * code with its message set — aborts the read with that code.  Between
 * calls xfer_read only compares the clock, so a short read costs nothing
 * more. */
typedef struct {
    uint64_t period_ns; /* 0: never */
    int (*fn)(void *user);
    void *user;
} xfer_read_tick;

/* Reads ops[0..n) (remote ranges must lie in the peer's region).  0, or
 * DX_ETIMEDOUT at deadline_ns (dx_now_ns clock), DX_ETRANSPORT on a UCX
 * error (peer died, connection reset), or the tick's code; the message says
 * which op and why.  tick may be NULL. */
int xfer_read(xfer_peer *p, const xfer_read_op *ops, size_t n, uint64_t deadline_ns,
              xfer_read_tick *tick);

#endif
