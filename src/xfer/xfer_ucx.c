/* xfer_ucx: the UCX backend of the transfer interface (see xfer_ucx.h).
 *
 * Locking: every ucp_* call on the worker, its endpoints and requests is
 * made with a->mu held; completion callbacks therefore run under it too.
 * Readers and the progress thread take turns progressing the same worker;
 * a reader waits on the event fd in short slices so that it never depends on
 * the progress thread to notice its own completions. */
#include "xfer/xfer_ucx.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_log.h"

struct xfer_agent {
    pthread_mutex_t mu;
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;
    ucp_address_t *addr;
    size_t addr_len;
    /* the one registered region (the KV pool) */
    ucp_mem_h memh;
    void *base;
    size_t length;
    void *rkey_buf;
    size_t rkey_len;
    pthread_t thread;
    int has_thread;
    atomic_int stop;
    char tls[64];
};

struct xfer_peer {
    xfer_agent *a;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint64_t base;
    size_t length;
    atomic_int failed;
    ucs_status_t ep_status;
};

typedef struct {
    size_t done;
    ucs_status_t status; /* first error */
} batch;

static void *progress_main(void *arg)
{
    xfer_agent *a = arg;
    while (!atomic_load(&a->stop)) {
        pthread_mutex_lock(&a->mu);
        while (ucp_worker_progress(a->worker)) {
        }
        ucs_status_t st = ucp_worker_arm(a->worker);
        pthread_mutex_unlock(&a->mu);
        if (st == UCS_ERR_BUSY) continue; /* events arrived meanwhile */
        struct pollfd pfd = {.fd = a->efd, .events = POLLIN};
        poll(&pfd, 1, 200); /* the timeout bounds how long stop takes */
    }
    return NULL;
}

static int ucs_err(ucs_status_t st, const char *what)
{
    return dx_errf(DX_ETRANSPORT, "ucx: %s: %s", what, ucs_status_string(st));
}

/* UCX prints its log lines (warnings such as "unused env variable" or
 * "not returned to mpool" among them) on stdout by default, where tools
 * parse JSON (`duplex kv pull`, `bench ... --json`).  This handler, first
 * in UCX's chain, sends each line the configuration enables to duplex's log
 * (stderr) instead, and stops the default handler.  UCX_LOG_LEVEL still
 * says what UCX emits; lines below WARN that the user asked UCX for are
 * logged at INFO so that they show at duplex's default level. */
static ucs_log_func_rc_t ucx_log(const char *file, unsigned line, const char *function,
                                 ucs_log_level_t level, const ucs_log_component_config_t *comp,
                                 const char *fmt, va_list ap)
{
    if (level != UCS_LOG_LEVEL_PRINT && !ucs_log_component_is_enabled(level, comp))
        return UCS_LOG_FUNC_RC_STOP;
    char msg[768];
    vsnprintf(msg, sizeof msg, fmt, ap);
    const char *base = strrchr(file, '/');
    enum dx_log_level l = level <= UCS_LOG_LEVEL_ERROR  ? DX_LOG_ERROR
                          : level == UCS_LOG_LEVEL_WARN ? DX_LOG_WARN
                                                        : DX_LOG_INFO;
    dx_log(l, "ucx: %s (%s:%u)", msg, base ? base + 1 : file, line);
    return UCS_LOG_FUNC_RC_STOP;
}

static void install_log_handler(void)
{
    ucs_log_push_handler(ucx_log);
}

/* UCX 1.13 flags transport-level options given through ucp_config_modify
 * as unused, so defaults for them go through the environment (before the
 * configuration is read), never overriding what the user set. */
static void set_default_env(const char *name, const char *val)
{
    setenv(name, val, 0);
}

/* Why UCX_MM_ERROR_HANDLING=y: endpoints use UCP_ERR_HANDLING_MODE_PEER so a
 * reader learns that a holder died (TCP reports it; a timeout alone would
 * be slow).  UCX 1.13 only picks transports that advertise peer-failure
 * handling for such endpoints, and its shared-memory transports (posix,
 * sysv) advertise it only when this option is on; it is off by default.
 * Without it a same-host peer is "unreachable" under UCX_TLS=sm and the
 * default silently falls back to TCP loopback (~3-7 GB/s, holder CPU).
 * With it, UCX attaches the holder's pool (allocated by the sysv/posix md
 * through UCP_MEM_MAP_ALLOCATE) into the reader and a get is one memcpy by
 * the reader: memcpy speed and no holder CPU.  Peer death over shared
 * memory is then found by UCX's keepalive (process liveness check); reads
 * themselves cannot fault, since the reader keeps the segment attached, and
 * a restarted holder is caught by the instance check in PIN (xfer_client).
 * The event-fd progress thread stays: TCP still needs the holder to
 * progress, and the posix/sysv interfaces support wakeup (UCP_FEATURE_WAKEUP
 * does not exclude them).  A peer on another host, or one without this
 * option, still negotiates TCP. */
/* Whether a transport list can use shared memory (UCX warns about an
 * unused UCX_MM_* variable when it cannot: so we set none then). */
static int tls_may_use_mm(const char *tls)
{
    if (!tls || !*tls || tls[0] == '^') return 1;
    static const char *const mm[] = {"sm", "shm", "mm", "posix", "sysv", "all"};
    char buf[128];
    snprintf(buf, sizeof buf, "%s", tls);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++)
            if (!strcmp(t, mm[i])) return 1;
    return 0;
}

static int agent_init_ucp(xfer_agent *a, const xfer_agent_config *cfg)
{
    static pthread_once_t log_once = PTHREAD_ONCE_INIT;
    pthread_once(&log_once, install_log_handler);
    set_default_env("UCX_TCP_TX_SEG_SIZE", "256k");
    set_default_env("UCX_TCP_RX_SEG_SIZE", "256k");
    if (tls_may_use_mm(cfg->tls && cfg->tls[0] ? cfg->tls : getenv("UCX_TLS")))
        set_default_env("UCX_MM_ERROR_HANDLING", "y");
    ucp_config_t *uc;
    ucs_status_t st = ucp_config_read(NULL, NULL, &uc);
    if (st != UCS_OK) return ucs_err(st, "reading configuration");
    int rc = 0;
    if (!rc && cfg->tls && cfg->tls[0]) {
        st = ucp_config_modify(uc, "TLS", cfg->tls);
        if (st != UCS_OK)
            rc =
                dx_errf(DX_EINVAL, "ucx: transport list '%s': %s", cfg->tls, ucs_status_string(st));
    }
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP};
    if (!rc) {
        st = ucp_init(&p, uc, &a->ctx);
        if (st != UCS_OK) rc = ucs_err(st, "ucp_init");
    }
    ucp_config_release(uc);
    return rc;
}

static int agent_init_worker(xfer_agent *a)
{
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SERIALIZED};
    ucs_status_t st = ucp_worker_create(a->ctx, &wp, &a->worker);
    if (st != UCS_OK) return ucs_err(st, "ucp_worker_create");
    st = ucp_worker_get_efd(a->worker, &a->efd);
    if (st != UCS_OK) return ucs_err(st, "ucp_worker_get_efd");
    st = ucp_worker_get_address(a->worker, &a->addr, &a->addr_len);
    if (st != UCS_OK) return ucs_err(st, "ucp_worker_get_address");
    return 0;
}

int xfer_agent_create(const xfer_agent_config *cfg, xfer_agent **out)
{
    static const xfer_agent_config dflt = {0};
    if (!cfg) cfg = &dflt;
    xfer_agent *a = dx_calloc(1, sizeof *a);
    if (!a) return dx_errf(DX_ENOMEM, "xfer: agent");
    pthread_mutex_init(&a->mu, NULL);
    const char *env_tls = getenv("UCX_TLS");
    snprintf(a->tls, sizeof a->tls, "%s",
             cfg->tls && cfg->tls[0] ? cfg->tls
             : env_tls && env_tls[0] ? env_tls
                                     : "default");
    int rc = agent_init_ucp(a, cfg);
    if (!rc) rc = agent_init_worker(a);
    if (!rc && !cfg->no_progress_thread) {
        if (pthread_create(&a->thread, NULL, progress_main, a))
            rc = dx_errf(DX_ENOMEM, "xfer: cannot start the progress thread");
        else
            a->has_thread = 1;
    }
    if (rc) {
        xfer_agent_destroy(a);
        return rc;
    }
    *out = a;
    return 0;
}

/* Stops serving peers: the progress thread stops and the worker closes
 * (idempotent).  Called without mu. */
static void agent_quiesce(xfer_agent *a)
{
    if (a->has_thread) {
        atomic_store(&a->stop, 1);
        pthread_mutex_lock(&a->mu);
        ucp_worker_signal(a->worker);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->thread, NULL);
        a->has_thread = 0;
    }
    pthread_mutex_lock(&a->mu);
    if (a->addr) ucp_worker_release_address(a->worker, a->addr);
    if (a->worker) ucp_worker_destroy(a->worker);
    a->addr = NULL;
    a->addr_len = 0;
    a->worker = NULL;
    pthread_mutex_unlock(&a->mu);
}

void xfer_agent_destroy(xfer_agent *a)
{
    if (!a) return;
    agent_quiesce(a);
    if (a->memh) xfer_agent_release(a, a->base, a->length);
    if (a->ctx) ucp_cleanup(a->ctx);
    pthread_mutex_destroy(&a->mu);
    dx_free(a);
}

static int region_map(xfer_agent *a, size_t bytes)
{
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                             UCP_MEM_MAP_PARAM_FIELD_FLAGS,
                               .address = NULL,
                               .length = bytes,
                               .flags = UCP_MEM_MAP_ALLOCATE};
    ucs_status_t st = ucp_mem_map(a->ctx, &mp, &a->memh);
    if (st != UCS_OK) return ucs_err(st, "ucp_mem_map (allocating the KV pool)");
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    st = ucp_mem_query(a->memh, &attr);
    if (st == UCS_OK) st = ucp_rkey_pack(a->ctx, a->memh, &a->rkey_buf, &a->rkey_len);
    if (st != UCS_OK) {
        ucp_mem_unmap(a->ctx, a->memh);
        a->memh = NULL;
        return ucs_err(st, "querying/packing the KV pool region");
    }
    a->base = attr.address;
    a->length = bytes;
    return 0;
}

void *xfer_agent_alloc(void *user, size_t bytes)
{
    xfer_agent *a = user;
    long page = sysconf(_SC_PAGESIZE);
    pthread_mutex_lock(&a->mu);
    int rc = a->memh ? dx_errf(DX_EBUSY, "xfer: the agent already holds a region") : 0;
    if (!rc) rc = region_map(a, bytes);
    if (!rc && ((uintptr_t)a->base % (uintptr_t)page)) {
        rc = dx_errf(DX_EINVAL, "ucx: KV pool region %p is not page-aligned", a->base);
        ucp_rkey_buffer_release(a->rkey_buf);
        ucp_mem_unmap(a->ctx, a->memh);
        a->memh = NULL;
    }
    pthread_mutex_unlock(&a->mu);
    if (rc) return NULL;
    /* its pages are faulted in by the pool's owner (kv_pool_populate) */
    DX_LOGD("xfer: KV pool of %zu bytes at %p registered with UCX", bytes, a->base);
    return a->base;
}

/* Over TCP a peer's READ is a request that this worker answers by copying
 * from the region: one that arrived after the region is unmapped (a
 * reader's request that sat in a dead link's retransmit queue, say) would
 * fault.  So the worker goes first, and the region (the context's) after. */
void xfer_agent_release(void *user, void *p, size_t bytes)
{
    xfer_agent *a = user;
    if (a->memh && p == a->base) agent_quiesce(a);
    pthread_mutex_lock(&a->mu);
    if (a->memh && p == a->base) {
        ucp_rkey_buffer_release(a->rkey_buf);
        ucp_mem_unmap(a->ctx, a->memh);
        a->memh = NULL;
        a->rkey_buf = NULL;
        a->rkey_len = 0;
        a->base = NULL;
        a->length = 0;
    }
    pthread_mutex_unlock(&a->mu);
}

void xfer_agent_describe(xfer_agent *a, xfer_desc *out)
{
    *out = (xfer_desc){(const uint8_t *)a->addr,     a->addr_len, a->rkey_buf, a->rkey_len,
                       (uint64_t)(uintptr_t)a->base, a->length};
}

const char *xfer_agent_tls(const xfer_agent *a)
{
    return a->tls;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    xfer_peer *p = arg;
    p->ep_status = status;
    atomic_store(&p->failed, 1);
}

int xfer_peer_connect(xfer_agent *a, const uint8_t *worker_addr, size_t addr_len,
                      const uint8_t *rkey, size_t rkey_len, uint64_t base, size_t length,
                      xfer_peer **out)
{
    if (!worker_addr || !addr_len || !rkey || !rkey_len)
        return dx_errf(DX_EINVAL, "xfer: peer description lacks a worker address or rkey");
    xfer_peer *p = dx_calloc(1, sizeof *p);
    if (!p) return dx_errf(DX_ENOMEM, "xfer: peer");
    *p = (xfer_peer){.a = a, .base = base, .length = length};
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .address = (const ucp_address_t *)worker_addr,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = on_ep_error, .arg = p}};
    pthread_mutex_lock(&a->mu);
    ucs_status_t st = a->worker ? ucp_ep_create(a->worker, &ep, &p->ep) : UCS_ERR_NOT_CONNECTED;
    if (st == UCS_OK) st = ucp_ep_rkey_unpack(p->ep, rkey, &p->rkey);
    pthread_mutex_unlock(&a->mu);
    if (st != UCS_OK) {
        int rc = ucs_err(st, "connecting to the peer's worker");
        xfer_peer_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

int xfer_peer_failed(const xfer_peer *p)
{
    return atomic_load(&p->failed);
}

/* Progresses until *req completes or the deadline; called without mu. */
static void wait_request(xfer_agent *a, void *req, uint64_t deadline)
{
    for (;;) {
        pthread_mutex_lock(&a->mu);
        ucp_worker_progress(a->worker);
        ucs_status_t st = ucp_request_check_status(req);
        pthread_mutex_unlock(&a->mu);
        if (st != UCS_INPROGRESS || dx_now_ns() > deadline) return;
        usleep(100);
    }
}

/* Closes the endpoint (forcibly if it failed or force is set), bounded. */
static void peer_close_ep(xfer_peer *p, int force)
{
    xfer_agent *a = p->a;
    if (!p->ep) return;
    pthread_mutex_lock(&a->mu);
    if (p->rkey) ucp_rkey_destroy(p->rkey);
    p->rkey = NULL;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *req = ucp_ep_close_nbx(p->ep, &prm);
    p->ep = NULL;
    pthread_mutex_unlock(&a->mu);
    if (!UCS_PTR_IS_PTR(req)) return;
    wait_request(a, req, dx_now_ns() + 1000000000ull);
    pthread_mutex_lock(&a->mu);
    if (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_request_cancel(a->worker, req);
    ucp_request_free(req);
    pthread_mutex_unlock(&a->mu);
}

void xfer_peer_destroy(xfer_peer *p)
{
    if (!p) return;
    if (p->ep)
        peer_close_ep(p, atomic_load(&p->failed));
    else if (p->rkey)
        ucp_rkey_destroy(p->rkey);
    dx_free(p);
}

static void on_get_done(void *request, ucs_status_t status, void *user_data)
{
    batch *b = user_data;
    if (status != UCS_OK && b->status == UCS_OK) b->status = status;
    b->done++;
}

/* Posts every op; returns how many went out (requests in reqs[]). */
static size_t post_reads(xfer_peer *p, const xfer_read_op *ops, size_t n, batch *b, void **reqs,
                         size_t *posted)
{
    xfer_agent *a = p->a;
    uintptr_t lo = (uintptr_t)a->base, hi = lo + a->length;
    size_t nreq = 0;
    for (size_t i = 0; i < n && b->status == UCS_OK; i++) {
        ucp_request_param_t prm = {.op_attr_mask =
                                       UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                                   .cb.send = on_get_done,
                                   .user_data = b};
        uintptr_t l = (uintptr_t)ops[i].local;
        if (a->memh && l >= lo && l + ops[i].len <= hi) {
            prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            prm.memh = a->memh;
        }
        void *r = ucp_get_nbx(p->ep, ops[i].local, ops[i].len, ops[i].remote, p->rkey, &prm);
        (*posted)++;
        if (UCS_PTR_IS_ERR(r)) {
            b->status = UCS_PTR_STATUS(r);
            b->done++;
        } else if (r == NULL) {
            b->done++;
        } else {
            reqs[nreq++] = r;
        }
    }
    return nreq;
}

static int check_ops(const xfer_peer *p, const xfer_read_op *ops, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t end;
        if (__builtin_add_overflow(ops[i].remote, (uint64_t)ops[i].len, &end) ||
            ops[i].remote < p->base || end > p->base + p->length)
            return dx_errf(DX_ERANGE, "xfer: read %zu [0x%llx, +%zu) outside the peer's region", i,
                           (unsigned long long)ops[i].remote, ops[i].len);
    }
    return 0;
}

/* Waits for every posted request, calling the tick (if any) on its period:
 * 0 when all completed, 1 at the deadline or on peer failure, or the tick's
 * negative code when it asked to stop. */
static int wait_batch(xfer_peer *p, batch *b, size_t posted, uint64_t deadline,
                      xfer_read_tick *tick)
{
    xfer_agent *a = p->a;
    int ticking = tick && tick->fn && tick->period_ns;
    uint64_t next_tick = ticking ? dx_now_ns() + tick->period_ns : UINT64_MAX;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        unsigned n = ucp_worker_progress(a->worker);
        size_t done = b->done;
        ucs_status_t st = n || done == posted ? UCS_ERR_BUSY : ucp_worker_arm(a->worker);
        pthread_mutex_unlock(&a->mu);
        if (done == posted) return 0;
        uint64_t now = dx_now_ns();
        if (atomic_load(&p->failed) || now >= deadline) return 1;
        if (now >= next_tick) {
            int rc = tick->fn(tick->user);
            if (rc) return rc;
            next_tick = tick->period_ns ? dx_now_ns() + tick->period_ns : UINT64_MAX;
            continue; /* the tick took time: progress before sleeping */
        }
        if (st == UCS_OK) {
            struct pollfd pfd = {.fd = a->efd, .events = POLLIN};
            poll(&pfd, 1, 1);
        }
    }
}

int xfer_read(xfer_peer *p, const xfer_read_op *ops, size_t n, uint64_t deadline_ns,
              xfer_read_tick *tick)
{
    xfer_agent *a = p->a;
    if (!p->ep || atomic_load(&p->failed))
        return dx_errf(DX_ETRANSPORT, "xfer: peer endpoint already failed (%s)",
                       ucs_status_string(p->ep_status));
    int rc = check_ops(p, ops, n);
    if (rc || n == 0) return rc;
    void **reqs = dx_malloc(n * sizeof *reqs);
    batch *b = dx_calloc(1, sizeof *b);
    if (!reqs || !b) {
        dx_free(reqs);
        dx_free(b);
        return dx_errf(DX_ENOMEM, "xfer: batch of %zu reads", n);
    }
    size_t posted = 0;
    pthread_mutex_lock(&a->mu);
    size_t nreq = post_reads(p, ops, n, b, reqs, &posted);
    pthread_mutex_unlock(&a->mu);
    int stopped = wait_batch(p, b, posted, deadline_ns, tick);
    int peer_died = atomic_load(&p->failed);
    ucs_status_t first = b->status;
    if (b->done != posted) {
        /* Timeout or peer failure: cancel and force-close so that no request
         * can still write into the caller's memory once we return. */
        pthread_mutex_lock(&a->mu);
        for (size_t i = 0; i < nreq; i++)
            if (ucp_request_check_status(reqs[i]) == UCS_INPROGRESS)
                ucp_request_cancel(a->worker, reqs[i]);
        pthread_mutex_unlock(&a->mu);
        atomic_store(&p->failed, 1);
        peer_close_ep(p, 1);
        wait_batch(p, b, posted, dx_now_ns() + 2000000000ull, NULL);
    }
    int all_done = b->done == posted;
    ucs_status_t st = b->status;
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < nreq && all_done; i++) ucp_request_free(reqs[i]);
    pthread_mutex_unlock(&a->mu);
    dx_free(reqs);
    if (all_done)
        dx_free(b);
    else
        DX_LOGE("xfer: %zu reads never completed after a forced close; leaking their state",
                posted - b->done);
    if (stopped < 0) /* the tick's message still stands: nothing above sets one */
        return dx_err_wrap(stopped, "xfer: %zu reads aborted", posted);
    if (stopped && !peer_died)
        return dx_errf(DX_ETIMEDOUT, "xfer: %zu reads did not finish in time", posted);
    if (peer_died || first != UCS_OK || st != UCS_OK) {
        atomic_store(&p->failed, 1);
        return dx_errf(DX_ETRANSPORT, "xfer: read from peer failed: %s",
                       ucs_status_string(first != UCS_OK ? first
                                         : st != UCS_OK  ? st
                                                         : p->ep_status));
    }
    return 0;
}
