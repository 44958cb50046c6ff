/* xfer_client: blocking KV pulls.  Socket steps use poll() against the
 * earlier of the pull's deadline and the peer timeout; the data path goes
 * through xfer_ucx.  Peers are cached by host:port with a reference count,
 * so a pull that finds a peer broken can drop it while another thread still
 * finishes with it. */
#include "xfer/xfer_client.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/dx_addr.h"
#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"

typedef struct peer_entry {
    struct peer_entry *next;
    char key[300];
    int refs;
    int dead;
    uint64_t instance;
    uint64_t block_bytes, base;
    uint32_t n_blocks;
    xfer_peer *ep;
} peer_entry;

struct xfer_client {
    xfer_agent *agent;
    kv_pool *pool;
    kvport_hello hello;
    dx_buf hello_frame;
    const kvport_secret *secret;
    xfer_peers *allow;
    uint64_t peer_ns; /* longest wait for one reply */
    pthread_mutex_t mu;
    peer_entry *peers;
};

/* One pull's connection to the holder. */
typedef struct {
    int fd;
    dx_buf in;
    uint64_t deadline; /* the pull's */
    uint64_t peer_ns;
    dx_buf proof; /* the reader's AUTH_PROOF, sent with the next request */
} kvlink;

void xfer_hello_init(kvport_hello *h, const char *engine_id, const uint8_t fingerprint[16],
                     const kv_pool *pool, xfer_agent *agent)
{
    kv_pool_config g;
    kv_pool_geometry(pool, &g);
    static uint64_t instance;
    if (!instance) {
        xfer_token t;
        if (xfer_token_random(&t) == 0) memcpy(&instance, t.b, sizeof instance);
        instance |= 1;
    }
    xfer_desc d;
    xfer_agent_describe(agent, &d);
    memset(h, 0, sizeof *h);
    h->engine_id = (kvport_bytes){(const uint8_t *)engine_id, engine_id ? strlen(engine_id) : 0};
    memcpy(h->fingerprint, fingerprint, 16);
    h->instance = instance;
    h->n_layer = g.n_layer;
    h->n_kv_head = g.n_kv_head;
    h->head_dim = g.head_dim;
    h->dtype = (uint32_t)g.dtype;
    h->block_size = g.block_size;
    h->n_blocks = g.n_blocks;
    h->block_bytes = kv_pool_block_bytes(pool);
    h->transports = (kvport_bytes){(const uint8_t *)"ucx", 3};
    h->worker_addr = (kvport_bytes){d.worker_addr, d.worker_addr_len};
    h->rkey = (kvport_bytes){d.rkey, d.rkey_len};
    h->base_addr = d.base;
}

int xfer_client_create(const xfer_client_config *cfg, xfer_client **out)
{
    if (!cfg->agent || !cfg->pool || !cfg->hello)
        return dx_errf(DX_EINVAL, "xfer_client: config lacks agent, pool or hello");
    xfer_client *c = dx_calloc(1, sizeof *c);
    if (!c) return dx_errf(DX_ENOMEM, "xfer_client");
    c->agent = cfg->agent;
    c->pool = cfg->pool;
    c->hello = *cfg->hello;
    c->secret = cfg->secret;
    c->allow = cfg->peers;
    double peer_s = cfg->peer_timeout_s > 0 ? cfg->peer_timeout_s : XFER_DEFAULT_PEER_TIMEOUT_S;
    c->peer_ns = (uint64_t)(peer_s * 1e9);
    dx_buf_init(&c->hello_frame, 0);
    int rc = kvport_encode_hello(&c->hello_frame, cfg->hello);
    if (rc) {
        dx_buf_free(&c->hello_frame);
        dx_free(c);
        return rc;
    }
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return 0;
}

static void entry_put(xfer_client *c, peer_entry *e)
{
    pthread_mutex_lock(&c->mu);
    int last = --e->refs == 0 && e->dead;
    pthread_mutex_unlock(&c->mu);
    if (last) {
        xfer_peer_destroy(e->ep);
        dx_free(e);
    }
}

/* Unlinks e from the cache (callers still holding it keep it alive). */
static void entry_kill(xfer_client *c, peer_entry *e)
{
    pthread_mutex_lock(&c->mu);
    if (!e->dead) {
        e->dead = 1;
        e->refs--; /* the cache's own reference */
        for (peer_entry **pp = &c->peers; *pp; pp = &(*pp)->next)
            if (*pp == e) {
                *pp = e->next;
                break;
            }
    }
    pthread_mutex_unlock(&c->mu);
}

void xfer_client_destroy(xfer_client *c)
{
    if (!c) return;
    while (c->peers) {
        peer_entry *e = c->peers;
        e->refs++;
        entry_kill(c, e);
        entry_put(c, e);
    }
    dx_buf_free(&c->hello_frame);
    pthread_mutex_destroy(&c->mu);
    dx_free(c);
}

static peer_entry *entry_get(xfer_client *c, const char *key)
{
    pthread_mutex_lock(&c->mu);
    peer_entry *e = c->peers;
    while (e && strcmp(e->key, key)) e = e->next;
    if (e) e->refs++;
    pthread_mutex_unlock(&c->mu);
    return e;
}

void xfer_client_forget(xfer_client *c, const char *host, int port)
{
    char key[300];
    snprintf(key, sizeof key, "%s:%d", host, port);
    peer_entry *e = entry_get(c, key);
    if (!e) return;
    entry_kill(c, e);
    entry_put(c, e);
}

/* ---- sockets against a deadline ---- */

static int ms_left(uint64_t deadline)
{
    uint64_t now = dx_now_ns();
    return now >= deadline ? 0 : (int)((deadline - now) / 1000000 + 1);
}

static int wait_fd(int fd, short ev, uint64_t deadline, const char *what)
{
    for (;;) {
        int ms = ms_left(deadline);
        if (ms == 0) return dx_errf(DX_ETIMEDOUT, "timed out %s", what);
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, ms);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return dx_errf(DX_EIO, "poll %s: %s", what, strerror(errno));
    }
}

static int try_connect(const struct addrinfo *ai, uint64_t deadline, int *fd_out)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return dx_errf(DX_EIO, "socket: %s", strerror(errno));
    int rc = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) rc = dx_errf(DX_EIO, "connect: %s", strerror(errno));
        if (!rc) rc = wait_fd(fd, POLLOUT, deadline, "connecting");
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (!rc && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr))
            rc = dx_errf(DX_EIO, "connect: %s", strerror(soerr ? soerr : errno));
    }
    if (rc) {
        close(fd);
        return rc;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* a dead link drops the connection within seconds even between frames */
    dx_addr_keepalive(fd, 2, 1, 3);
    *fd_out = fd;
    return 0;
}

/* Connects to the first address of host that the allow-list admits (every
 * address is checked after resolution: a name cannot resolve around it). */
static int sock_connect(xfer_client *c, const char *host, int port, uint64_t deadline, int *fd)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g) return dx_errf(DX_EIO, "resolving %s: %s", host, gai_strerror(g));
    int rc = dx_errf(DX_EIO, "connecting to %s:%d: no address", host, port), denied = 0,
        tried = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (c->allow && !xfer_peers_allowed(c->allow, ai->ai_addr)) {
            denied++;
            continue;
        }
        tried++;
        if ((rc = try_connect(ai, deadline, fd)) == 0 || rc == DX_ETIMEDOUT) break;
    }
    freeaddrinfo(res);
    if (!tried && denied)
        return dx_errf(DX_EDENIED, "%s:%d is not a known KV peer (--kv-peers: %s); not connecting",
                       host, port, xfer_peers_describe(c->allow));
    return rc;
}

static int sock_send(int fd, const dx_buf *b, uint64_t deadline)
{
    size_t off = 0;
    while (off < b->len) {
        ssize_t w = send(fd, b->data + off, b->len - off, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return dx_errf(DX_ECLOSED, "sending to the holder: %s", strerror(errno));
        int rc = wait_fd(fd, POLLOUT, deadline, "sending to the holder");
        if (rc) return rc;
    }
    return 0;
}

/* Receives one whole frame into in (reset first) and decodes it. */
static int sock_recv(int fd, dx_buf *in, uint64_t deadline, kvport_msg *m)
{
    dx_buf_reset(in);
    kvport_hdr h;
    size_t need = KVPORT_HDR_BYTES;
    for (;;) {
        if (in->len >= KVPORT_HDR_BYTES) {
            int rc = kvport_hdr_read((const uint8_t *)in->data, in->len, &h);
            if (rc) return dx_err_wrap(rc, "reply from the holder");
            need = KVPORT_HDR_BYTES + h.length;
            if (in->len >= need) break;
        }
        int rc = dx_buf_reserve(in, need - in->len);
        if (rc) return rc;
        ssize_t r = recv(fd, in->data + in->len, need - in->len, 0);
        if (r > 0) {
            in->len += (size_t)r;
            continue;
        }
        if (r == 0) return dx_errf(DX_ECLOSED, "the holder closed the connection");
        if (errno != EAGAIN && errno != EINTR)
            return dx_errf(DX_ECLOSED, "receiving from the holder: %s", strerror(errno));
        rc = wait_fd(fd, POLLIN, deadline, "waiting for the holder's reply");
        if (rc) return rc;
    }
    int rc = kvport_decode(&h, (const uint8_t *)in->data + KVPORT_HDR_BYTES, m);
    return rc ? dx_err_wrap(rc, "reply from the holder") : 0;
}

/* An ERROR/GONE/MISMATCH reply becomes the matching error code. */
static int reply_error(const kvport_msg *m, const char *step)
{
    const kvport_error *e = &m->u.error;
    int code = m->type == KVPORT_GONE       ? DX_EGONE
               : m->type == KVPORT_MISMATCH ? DX_EMISMATCH
               : dx_err_known(e->code)      ? e->code
                                            : DX_EPROTO;
    return dx_errf(code, "%s: holder answered %s: %.*s", step, kvport_type_name(m->type),
                   (int)e->message.n, (const char *)e->message.p);
}

static int expect(const kvport_msg *m, uint16_t type, const char *step)
{
    if (m->type == type) return 0;
    if (m->type == KVPORT_ERROR || m->type == KVPORT_GONE || m->type == KVPORT_MISMATCH)
        return reply_error(m, step);
    return dx_errf(DX_EPROTO, "%s: unexpected %s reply", step, kvport_type_name(m->type));
}

/* The earlier of the pull's deadline and one peer timeout from now. */
static uint64_t step_deadline(const kvlink *k, int *by_peer)
{
    uint64_t t = dx_now_ns() + k->peer_ns;
    *by_peer = t < k->deadline;
    return *by_peer ? t : k->deadline;
}

/* Sends one request frame and receives its reply, which must be `type`; a
 * pending AUTH_PROOF goes first, and its AUTH_OK is read first. */
static int exchange(kvlink *k, const dx_buf *out, uint16_t type, const char *step, kvport_msg *m)
{
    int by_peer, rc = 0;
    uint64_t dl = step_deadline(k, &by_peer);
    if (k->proof.len) {
        rc = dx_buf_append(&k->proof, out->data, out->len);
        if (!rc) rc = sock_send(k->fd, &k->proof, dl);
        if (!rc) rc = sock_recv(k->fd, &k->in, dl, m);
        if (!rc && (rc = expect(m, KVPORT_AUTH_OK, "AUTH")))
            dx_err_wrap(rc, "the holder did not accept this node's proof");
        k->proof.len = 0;
    } else {
        rc = sock_send(k->fd, out, dl);
    }
    if (!rc) rc = sock_recv(k->fd, &k->in, dl, m);
    if (!rc) rc = expect(m, type, step);
    if (rc == DX_ETIMEDOUT && by_peer)
        dx_err_wrap(rc,
                    "%s: no reply within the %.1f s peer timeout (the holder or the link to it "
                    "may be down)",
                    step, (double)k->peer_ns * 1e-9);
    return rc;
}

/* Mutual authentication (kvport_auth.h): checks the holder's proof now and
 * leaves ours in k->proof, for exchange() to send with the next request. */
static int do_auth(xfer_client *c, kvlink *k)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    dx_ipport holder;
    if (getpeername(k->fd, (struct sockaddr *)&ss, &sl) < 0 ||
        dx_addr_norm((struct sockaddr *)&ss, &holder))
        return dx_errf(DX_EIO, "AUTH: the connection has no peer address: %s", strerror(errno));
    kvport_auth a;
    kvport_auth_msg init, proof;
    kvport_msg m = {0};
    dx_buf out;
    dx_buf_init(&out, 0);
    int rc = kvport_auth_reader_start(&a, c->secret, &holder, &init);
    if (!rc) rc = kvport_encode_auth(&out, KVPORT_AUTH_INIT, &init);
    if (!rc) rc = exchange(k, &out, KVPORT_AUTH_CHALLENGE, "AUTH", &m);
    if (!rc) rc = kvport_auth_reader_prove(&a, &m.u.auth, &proof);
    if (!rc) rc = kvport_encode_auth(&k->proof, KVPORT_AUTH_PROOF, &proof);
    dx_buf_free(&out);
    return rc;
}

static double ms_since(uint64_t t0)
{
    return (double)(dx_now_ns() - t0) * 1e-6;
}

/* HELLO on fd, check compatibility, connect the data path; new cache entry. */
static int do_hello(xfer_client *c, kvlink *k, const char *key, peer_entry **out)
{
    kvport_msg m = {0};
    int rc = exchange(k, &c->hello_frame, KVPORT_HELLO, "HELLO", &m);
    if (!rc) rc = kvport_hello_compatible(&c->hello, &m.u.hello);
    if (rc) return dx_err_wrap(rc, "HELLO");
    const kvport_hello *h = &m.u.hello;
    peer_entry *e = dx_calloc(1, sizeof *e);
    if (!e) return dx_errf(DX_ENOMEM, "xfer_client: peer %s", key);
    snprintf(e->key, sizeof e->key, "%s", key);
    e->instance = h->instance;
    e->block_bytes = h->block_bytes;
    e->n_blocks = h->n_blocks;
    e->base = h->base_addr;
    size_t region;
    if (dx_mul_overflow(h->block_bytes, h->n_blocks, &region))
        rc = dx_errf(DX_EFORMAT, "HELLO: holder's pool size overflows");
    if (!rc)
        rc = xfer_peer_connect(c->agent, h->worker_addr.p, h->worker_addr.n, h->rkey.p, h->rkey.n,
                               h->base_addr, region, &e->ep);
    if (rc) {
        dx_free(e);
        return rc;
    }
    e->refs = 2; /* the cache and the caller */
    pthread_mutex_lock(&c->mu);
    e->next = c->peers;
    c->peers = e;
    pthread_mutex_unlock(&c->mu);
    *out = e;
    return 0;
}

static int do_pin(kvlink *k, const xfer_pull_req *r, kvport_pin_ok *ok)
{
    uint64_t *hs = dx_malloc(r->n * 2 * sizeof *hs);
    if (!hs) return dx_errf(DX_ENOMEM, "PIN: hash chain of %zu blocks", r->n);
    for (size_t i = 0; i < r->n; i++) {
        hs[2 * i] = r->chain[i].lo;
        hs[2 * i + 1] = r->chain[i].hi;
    }
    dx_buf out;
    dx_buf_init(&out, 0);
    int rc = kvport_encode_pin(&out, r->token.b, r->remote_ids, hs, (uint32_t)r->n);
    dx_free(hs);
    kvport_msg m = {0};
    if (!rc) rc = exchange(k, &out, KVPORT_PIN_OK, "PIN", &m);
    dx_buf_free(&out);
    if (rc) return rc;
    *ok = m.u.pin_ok;
    if (ok->n_matched == 0 || ok->n_matched > r->n)
        return dx_errf(DX_EPROTO, "PIN: holder claims %u matching blocks of %zu", ok->n_matched,
                       r->n);
    if (ok->ttl_ms == 0) return dx_errf(DX_EPROTO, "PIN: holder gave the pin a TTL of 0 ms");
    return 0;
}

/* Keeps the pin alive while the one-sided reads run: the holder cannot see
 * them, so without RENEW the pin lapses at its TTL and the blocks may be
 * freed and reused under the read.  A RENEW every ttl/3 leaves room for two
 * slow round trips before the deadline.  The RENEWs are also the heartbeat:
 * sent at least every peer timeout/3, each answered within a peer timeout,
 * they notice a holder or link that died long before the pull's deadline. */
typedef struct {
    kvlink *k;
    uint64_t pin_id;
    uint32_t n_renewed;
    xfer_read_tick tick;
} pin_keeper;

static uint64_t renew_period_ns(const kvlink *k, uint32_t ttl_ms)
{
    uint64_t ttl = (uint64_t)ttl_ms * 1000000;
    return (ttl < k->peer_ns ? ttl : k->peer_ns) / 3;
}

static int renew_tick(void *user)
{
    pin_keeper *k = user;
    dx_buf out;
    dx_buf_init(&out, 0);
    kvport_renew rn = {k->pin_id};
    kvport_msg m = {0};
    int rc = kvport_encode_renew(&out, &rn);
    if (!rc) rc = exchange(k->k, &out, KVPORT_RENEW_OK, "RENEW", &m);
    dx_buf_free(&out);
    if (!rc && m.u.renew_ok.ttl_ms == 0)
        rc = dx_errf(DX_EPROTO, "RENEW: holder renewed the pin for 0 ms");
    if (rc)
        return dx_err_wrap(rc, "pin %llu may lapse before the reads complete",
                           (unsigned long long)k->pin_id);
    k->tick.period_ns = renew_period_ns(k->k, m.u.renew_ok.ttl_ms);
    k->n_renewed++;
    return 0;
}

/* One read per run of blocks adjacent on both sides. */
static int do_read(xfer_client *c, peer_entry *e, const xfer_pull_req *r, uint32_t k,
                   uint64_t deadline, xfer_read_tick *tick, xfer_pull_result *res)
{
    size_t bb = kv_pool_block_bytes(c->pool);
    for (uint32_t i = 0; i < k; i++) {
        if (!kv_pool_valid_id(c->pool, r->local_ids[i]))
            return dx_errf(DX_EINVAL, "local block id %d (index %u) not in the pool",
                           r->local_ids[i], i);
        if (r->remote_ids[i] < 0 || (uint32_t)r->remote_ids[i] >= e->n_blocks)
            return dx_errf(DX_EINVAL, "remote block id %d (index %u) outside the holder's pool",
                           r->remote_ids[i], i);
    }
    xfer_read_op *ops = dx_malloc(k * sizeof *ops);
    if (!ops) return dx_errf(DX_ENOMEM, "pull: %u read ops", k);
    size_t n = 0;
    uint64_t rbase = e->base;
    for (uint32_t i = 0; i < k; i++) {
        if (n && r->remote_ids[i] == r->remote_ids[i - 1] + 1 &&
            r->local_ids[i] == r->local_ids[i - 1] + 1) {
            ops[n - 1].len += bb;
            continue;
        }
        ops[n++] = (xfer_read_op){rbase + (uint64_t)r->remote_ids[i] * bb,
                                  kv_pool_block_ptr(c->pool, r->local_ids[i]), bb};
    }
    res->n_reads = (uint32_t)n;
    int rc = xfer_read(e->ep, ops, n, deadline, tick);
    dx_free(ops);
    return rc;
}

static void fail(xfer_pull_result *res, int rc)
{
    res->err = rc;
    res->n_pulled = 0;
    res->bytes = 0;
    snprintf(res->reason, sizeof res->reason, "%s", dx_errmsg());
}

static int do_release(kvlink *k, uint64_t pin_id, int consumed)
{
    dx_buf out;
    dx_buf_init(&out, 0);
    kvport_release rel = {pin_id, (uint8_t)consumed};
    kvport_msg m = {0};
    int rc = kvport_encode_release(&out, &rel);
    if (!rc) rc = exchange(k, &out, KVPORT_RELEASE_OK, "RELEASE", &m);
    dx_buf_free(&out);
    return rc;
}

/* HELLO unless cached; returns a referenced entry. */
static int get_peer(xfer_client *c, kvlink *k, const char *key, xfer_pull_result *res,
                    peer_entry **e)
{
    *e = entry_get(c, key);
    if (*e && ((*e)->dead || xfer_peer_failed((*e)->ep))) {
        entry_kill(c, *e);
        entry_put(c, *e);
        *e = NULL;
    }
    res->hello_cached = *e != NULL;
    if (*e) return 0;
    uint64_t t = dx_now_ns();
    int rc = do_hello(c, k, key, e);
    res->t_hello_ms = ms_since(t);
    return rc;
}

static int pull_steps(xfer_client *c, kvlink *k, const xfer_pull_req *r, const char *key,
                      xfer_pull_result *res)
{
    peer_entry *e = NULL;
    uint64_t t = dx_now_ns();
    int rc = do_auth(c, k);
    res->t_auth_ms = ms_since(t);
    if (!rc) rc = get_peer(c, k, key, res, &e);
    if (rc) return rc;
    t = dx_now_ns();
    kvport_pin_ok ok = {0};
    rc = do_pin(k, r, &ok);
    res->t_pin_ms = ms_since(t);
    if (!rc && ok.instance != e->instance) {
        /* The holder restarted since we cached it: describe it afresh. */
        entry_kill(c, e);
        entry_put(c, e);
        e = NULL;
        rc = do_hello(c, k, key, &e);
    }
    if (rc) goto out;
    res->n_matched = ok.n_matched;
    if (r->on_pinned) r->on_pinned(r->user, ok.n_matched);
    pin_keeper keep = {k, ok.pin_id, 0, {0, renew_tick, NULL}};
    keep.tick.user = &keep;
    keep.tick.period_ns = r->no_renew ? 0 : renew_period_ns(k, ok.ttl_ms);
    t = dx_now_ns();
    rc = do_read(c, e, r, ok.n_matched, k->deadline, &keep.tick, res);
    res->t_read_ms = ms_since(t);
    res->n_renewals = keep.n_renewed;
    if (rc) {
        if (xfer_peer_failed(e->ep)) entry_kill(c, e);
        goto out;
    }
    t = dx_now_ns();
    rc = do_release(k, ok.pin_id, ok.n_matched == r->n);
    res->t_release_ms = ms_since(t);
    if (rc) {
        /* Only RELEASE_OK says the pin held to the end of the reads.  Without
         * it the blocks may have been freed and reused while we copied them,
         * so what arrived cannot be trusted to be this prefix's KV. */
        dx_err_wrap(rc, "RELEASE not confirmed, so the pin may have lapsed before the reads "
                        "completed; the pulled blocks are discarded");
        goto out;
    }
    res->n_pulled = ok.n_matched;
    res->bytes = (uint64_t)ok.n_matched * kv_pool_block_bytes(c->pool);
out:
    if (e) entry_put(c, e);
    return rc;
}

int xfer_pull(xfer_client *c, const xfer_pull_req *r, xfer_pull_result *res)
{
    memset(res, 0, sizeof *res);
    if (!r->host || r->n == 0 || r->n > KVPORT_MAX_PIN_BLOCKS || !r->chain || !r->remote_ids ||
        !r->local_ids) {
        fail(res, dx_errf(DX_EINVAL, "xfer_pull: bad request (%zu blocks)", r->n));
        return res->err;
    }
    double pull_s = r->timeout_s > 0 ? r->timeout_s : XFER_DEFAULT_PULL_TIMEOUT_S;
    uint64_t deadline = dx_now_ns() + (uint64_t)(pull_s * 1e9);
    char key[300];
    snprintf(key, sizeof key, "%s:%d", r->host, r->port);
    uint64_t t = dx_now_ns();
    kvlink k = {.fd = -1, .deadline = deadline, .peer_ns = c->peer_ns};
    uint64_t connect_by = t + c->peer_ns < deadline ? t + c->peer_ns : deadline;
    int rc = sock_connect(c, r->host, r->port, connect_by, &k.fd);
    res->t_connect_ms = ms_since(t);
    if (rc) {
        dx_err_wrap(rc, "KV port %s", key);
        fail(res, rc);
        return rc;
    }
    dx_buf_init(&k.in, KVPORT_HDR_BYTES + KVPORT_MAX_PAYLOAD);
    dx_buf_init(&k.proof, 0);
    rc = pull_steps(c, &k, r, key, res);
    dx_buf_free(&k.in);
    dx_buf_free(&k.proof);
    close(k.fd);
    if (rc) {
        dx_err_wrap(rc, "pull from %s", key);
        fail(res, rc);
        return rc;
    }
    if (res->n_pulled < r->n && !res->reason[0])
        snprintf(res->reason, sizeof res->reason,
                 "holder's hashes match the first %u of %zu blocks (chain diverges at block %u)",
                 res->n_pulled, r->n, res->n_pulled);
    return 0;
}
