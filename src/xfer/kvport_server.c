/* kvport_server: KV-port connections on a libuv loop.  Each connection
 * parses frames out of one bounded input buffer, answers each frame in
 * order, and remembers the pins it made so that closing releases them.
 * Connections sit in a list, newest first, walked only on accept (for the
 * caps); a connection's pins are a hash set (a RELEASE names any id it
 * likes), and ids of pins that timed out in the registry are forgotten as
 * the set grows, so it tracks live pins rather than every pin ever made on
 * a long-lived connection.  One timer per connection: the handshake
 * deadline until the peer authenticated, then the idle timeout, restarted by
 * each complete frame.  The idle timer closes only connections whose pins
 * are all gone: a reader's one-sided reads are invisible here, so "no
 * frames lately" is not "idle" while it holds a pin. */
#include "xfer/kvport_server.h"

#include <string.h>
#include <xxhash.h>

#include "base/dx_addr.h"
#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_hidx.h"
#include "base/dx_list.h"
#include "base/dx_log.h"
#include "xfer/xfer_lease_priv.h"

#define CONN_READ_CHUNK 65536
#define CONN_PRUNE_MIN  64 /* pins remembered before the first check for timed-out ones */
/* TCP keepalive on accepted connections: a reader whose host died is
 * dropped (and its pins released) about 16 s after it went silent. */
#define CONN_KEEPALIVE_IDLE_S  10
#define CONN_KEEPALIVE_INTVL_S 2
#define CONN_KEEPALIVE_CNT     3
#define AUTH_LOG_EVERY_NS      10000000000ull /* at most one failed-handshake line per 10 s */

typedef struct conn conn;

struct kvport_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t sweep;
    int open_handles;
    int destroyed;
    xfer_leases *leases;
    kvport_hello hello; /* fixed fields only; byte strings live in hello_frame */
    dx_buf hello_frame;
    const kvport_secret *secret;
    uint64_t handshake_ms, idle_ms, sweep_ms;
    unsigned max_conns, max_per_peer, max_handshakes, max_handshakes_per_peer, n_conns;
    size_t max_queued;
    dx_list conns; /* newest first; a connection leaves once its handles closed */
    uint64_t auth_logged_ns, auth_unlogged;
    uint64_t pin_seed; /* keys connections' pin sets */
    int port;
    kvport_server_stats st;
};

enum conn_phase { PH_INIT, PH_PROOF, PH_AUTHED }; /* waiting for AUTH_INIT, AUTH_PROOF; done */

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* the handshake deadline, then the idle timeout */
    kvport_server *s;
    dx_list link; /* s->conns */
    int open_handles;
    int closing;
    int paused;  /* reading stopped: too many reply bytes queued */
    int failing; /* conn_fail: flushing its last reply, reading no more */
    enum conn_phase phase;
    kvport_auth auth;
    dx_ipport peer, local; /* the peer's address; the holder's end of the connection */
    size_t queued;         /* reply bytes queued, with their write requests */
    dx_buf in;
    dx_hidx *pins;   /* ids of the pins this connection made */
    size_t prune_at; /* set size that triggers forgetting timed-out pins */
    char rd[CONN_READ_CHUNK];
};

typedef struct {
    uv_write_t req;
    size_t cost; /* what it adds to its connection's queued bytes */
    char data[];
} wreq;

static void server_maybe_free(kvport_server *s)
{
    if (s->destroyed && s->open_handles == 0 && s->n_conns == 0) {
        dx_buf_free(&s->hello_frame);
        dx_free(s);
    }
}

static void conn_on_closed(uv_handle_t *h)
{
    conn *c = h->data;
    if (--c->open_handles > 0) return;
    kvport_server *s = c->s;
    dx_list_remove(&c->link);
    s->n_conns--;
    dx_buf_free(&c->in);
    dx_hidx_destroy(c->pins);
    dx_free(c);
    server_maybe_free(s);
}

static void conn_close(conn *c)
{
    if (c->closing) return;
    c->closing = 1;
    size_t cur = 0;
    uint64_t id;
    /* Pins that already timed out answer ENOENT, which is fine here. */
    while (c->pins && dx_hidx_each(c->pins, &cur, &id)) xfer_unpin(c->s->leases, id, 0);
    uv_close((uv_handle_t *)&c->tcp, conn_on_closed);
    uv_close((uv_handle_t *)&c->timer, conn_on_closed);
}

static void conn_on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf);
static void conn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);
static void conn_process(conn *c);

static void on_written(uv_write_t *req, int status)
{
    wreq *w = (wreq *)req;
    conn *c = req->data;
    c->queued -= w->cost;
    dx_free(w);
    if (status < 0 && status != UV_ECANCELED) conn_close(c);
    if (c->closing || c->failing || !c->paused || c->queued > c->s->max_queued / 2) return;
    /* The peer reads again: take up its frames where we left off. */
    c->paused = 0;
    uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
    conn_process(c);
}

/* Queues b's bytes (the caller keeps b).  Past the connection's budget the
 * reply still goes out, but nothing more is read from this peer until the
 * queue drains: its replies then cost at most one budget. */
static void conn_send(conn *c, const dx_buf *b)
{
    if (c->closing || b->len == 0) return;
    wreq *w = dx_malloc(sizeof *w + b->len);
    if (!w) {
        conn_close(c);
        return;
    }
    memcpy(w->data, b->data, b->len);
    w->req.data = c;
    w->cost = sizeof *w + b->len;
    uv_buf_t ub = uv_buf_init(w->data, (unsigned)b->len);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &ub, 1, on_written) < 0) {
        dx_free(w);
        conn_close(c);
        return;
    }
    c->queued += w->cost;
    if (c->queued > c->s->max_queued && !c->paused) {
        c->paused = 1;
        c->s->st.paused++;
        uv_read_stop((uv_stream_t *)&c->tcp);
    }
}

static void send_error(conn *c, uint16_t type, int code, const char *msg)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    if (kvport_encode_error(&b, type, code, msg) == 0) conn_send(c, &b);
    dx_buf_free(&b);
    if (type == KVPORT_ERROR) c->s->st.errors++;
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    conn *c = req->data;
    dx_free(req);
    conn_close(c);
}

/* The stream cannot be trusted any more: flush what is queued, then close. */
static void conn_fail(conn *c, int code, const char *msg)
{
    send_error(c, KVPORT_ERROR, code, msg);
    if (c->closing || c->failing) return;
    c->failing = 1;
    uv_shutdown_t *req = dx_malloc(sizeof *req);
    if (req) req->data = c;
    if (!req || uv_shutdown(req, (uv_stream_t *)&c->tcp, on_shutdown) < 0) {
        dx_free(req);
        conn_close(c);
        return;
    }
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->in.len = 0;
}

static void handle_hello(conn *c, const kvport_hello *peer)
{
    int rc = kvport_hello_compatible(&c->s->hello, peer);
    if (rc) {
        c->s->st.hellos_refused++;
        send_error(c, KVPORT_ERROR, rc, dx_errmsg());
        return;
    }
    conn_send(c, &c->s->hello_frame);
}

static uint64_t pin_key(const kvport_server *s, uint64_t id)
{
    return XXH3_64bits_withSeed(&id, sizeof id, s->pin_seed);
}

/* Forgets the pins the registry timed out.  Runs when the set has doubled
 * since the last pass, so each remembered pin costs O(1) amortised. */
static void forget_dead_pins(conn *c)
{
    size_t n = dx_hidx_count(c->pins), n_dead = 0, cur = 0;
    uint64_t *dead = dx_malloc(n * sizeof *dead), id;
    if (dead) {
        while (dx_hidx_each(c->pins, &cur, &id))
            if (!xfer_pin_live(c->s->leases, id)) dead[n_dead++] = id;
        for (size_t i = 0; i < n_dead; i++)
            dx_hidx_remove(c->pins, pin_key(c->s, dead[i]), dead[i]);
        dx_free(dead);
    }
    n = dx_hidx_count(c->pins);
    c->prune_at = n * 2 > CONN_PRUNE_MIN ? n * 2 : CONN_PRUNE_MIN;
}

static int remember_pin(conn *c, uint64_t id)
{
    if (dx_hidx_count(c->pins) >= c->prune_at) forget_dead_pins(c);
    return dx_hidx_insert(c->pins, pin_key(c->s, id), id);
}

/* PIN_OK and RENEW_OK carry the pin TTL in whole milliseconds, at least 1. */
static uint32_t ttl_ms(double ttl_s)
{
    double ms = ttl_s * 1000;
    return ms >= (double)UINT32_MAX ? UINT32_MAX : ms < 1 ? 1 : (uint32_t)ms;
}

static void reply_pin(conn *c, int rc, uint64_t pin_id, uint32_t k)
{
    if (rc == DX_EGONE || rc == DX_EMISMATCH) {
        send_error(c, rc == DX_EGONE ? KVPORT_GONE : KVPORT_MISMATCH, rc, dx_errmsg());
        return;
    }
    if (rc) {
        send_error(c, KVPORT_ERROR, rc, dx_errmsg());
        return;
    }
    if (remember_pin(c, pin_id)) {
        xfer_unpin(c->s->leases, pin_id, 0);
        send_error(c, KVPORT_ERROR, DX_ENOMEM, "holder out of memory");
        return;
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_pin_ok ok = {pin_id, k, c->s->hello.instance, ttl_ms(xfer_leases_pin_ttl(c->s->leases))};
    if (kvport_encode_pin_ok(&b, &ok) == 0) conn_send(c, &b);
    dx_buf_free(&b);
}

static void handle_pin(conn *c, const kvport_pin *m)
{
    if (m->n == 0) {
        send_error(c, KVPORT_ERROR, DX_EINVAL, "PIN names no blocks");
        return;
    }
    int32_t *ids = dx_malloc((size_t)m->n * sizeof *ids);
    kv_hash *chain = dx_malloc((size_t)m->n * sizeof *chain);
    uint64_t pin_id = 0;
    uint32_t k = 0;
    int rc = ids && chain ? 0 : dx_errf(DX_ENOMEM, "holder out of memory");
    for (uint32_t i = 0; !rc && i < m->n; i++) {
        ids[i] = kvport_pin_id(m, i);
        kvport_pin_hash(m, i, &chain[i].lo, &chain[i].hi);
    }
    xfer_token tok;
    memcpy(tok.b, m->token, 16);
    if (!rc) rc = xfer_pin(c->s->leases, &tok, ids, chain, m->n, &pin_id, &k);
    dx_free(ids);
    dx_free(chain);
    reply_pin(c, rc, pin_id, k);
}

static void handle_release(conn *c, const kvport_release *m)
{
    if (dx_hidx_remove(c->pins, pin_key(c->s, m->pin_id), m->pin_id)) {
        /* Only the connection that pinned may release: pin ids are not secret. */
        send_error(c, KVPORT_ERROR, DX_ENOENT, "RELEASE: no such pin on this connection");
        return;
    }
    /* A pin that timed out gets the same answer whether or not the set has
     * forgotten it yet: its blocks were not held to the end of the read. */
    if (xfer_unpin(c->s->leases, m->pin_id, m->consumed)) {
        send_error(c, KVPORT_ERROR, DX_ENOENT, "RELEASE: the pin timed out before it");
        return;
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    if (kvport_encode_release_ok(&b) == 0) conn_send(c, &b);
    dx_buf_free(&b);
}

static int conn_has_pin(const conn *c, uint64_t id)
{
    dx_hidx_iter it;
    uint64_t v;
    for (dx_hidx_find(c->pins, pin_key(c->s, id), &it); dx_hidx_next(c->pins, &it, &v);)
        if (v == id) return 1;
    return 0;
}

static void handle_renew(conn *c, const kvport_renew *m)
{
    /* Only the connection that pinned may renew, as for RELEASE.  A pin the
     * set already forgot (timed out) lands here too: either way the reader
     * cannot count on the blocks. */
    if (!conn_has_pin(c, m->pin_id)) {
        send_error(c, KVPORT_ERROR, DX_ENOENT, "RENEW: no such pin on this connection");
        return;
    }
    double ttl;
    if (xfer_pin_renew(c->s->leases, m->pin_id, &ttl)) {
        send_error(c, KVPORT_GONE, DX_EGONE, dx_errmsg());
        return;
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_renew_ok ok = {ttl_ms(ttl)};
    if (kvport_encode_renew_ok(&b, &ok) == 0) conn_send(c, &b);
    dx_buf_free(&b);
}

/* An unauthenticated peer learns that it failed, nothing more; the holder's
 * log says who and why (rate-limited: failures are the attacker's to make). */
static void auth_fail(conn *c, const char *why)
{
    kvport_server *s = c->s;
    s->st.auth_failed++;
    uint64_t now = dx_now_ns();
    if (s->auth_logged_ns && now - s->auth_logged_ns < AUTH_LOG_EVERY_NS) {
        s->auth_unlogged++;
    } else {
        char peer[64];
        dx_addr_format(&c->peer, peer, sizeof peer);
        DX_LOGW("kvport: %s failed to authenticate (%s; a wrong or missing --kv-secret-file?)"
                " [%llu more failures not logged]",
                peer, why, (unsigned long long)s->auth_unlogged);
        s->auth_logged_ns = now;
        s->auth_unlogged = 0;
    }
    conn_fail(c, DX_EAUTH, "authentication failed");
}

static void send_auth(conn *c, uint16_t type, const kvport_auth_msg *m)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    if (kvport_encode_auth(&b, type, m) == 0) conn_send(c, &b);
    dx_buf_free(&b);
}

static void on_idle(uv_timer_t *t);

/* Frames before authentication: AUTH_INIT, then AUTH_PROOF, nothing else. */
static void handle_unauthed(conn *c, const kvport_hdr *h, const uint8_t *payload)
{
    kvport_msg m;
    kvport_server *s = c->s;
    int want = c->phase == PH_INIT ? KVPORT_AUTH_INIT : KVPORT_AUTH_PROOF;
    if (h->type != want || kvport_decode(h, payload, &m)) {
        char why[96];
        if (h->type == want)
            snprintf(why, sizeof why, "malformed %s", kvport_type_name(h->type));
        else
            snprintf(why, sizeof why, "sent %s where %s was due", kvport_type_name(h->type),
                     kvport_type_name((uint16_t)want));
        auth_fail(c, why);
        return;
    }
    if (c->phase == PH_INIT) {
        kvport_auth_msg ch;
        if (kvport_auth_holder_challenge(&c->auth, s->secret, &c->local, &m.u.auth, &ch)) {
            conn_fail(c, DX_EIO, "holder cannot make a challenge");
            return;
        }
        c->phase = PH_PROOF;
        send_auth(c, KVPORT_AUTH_CHALLENGE, &ch);
        return;
    }
    if (kvport_auth_holder_verify(&c->auth, &m.u.auth)) {
        auth_fail(c, "wrong proof");
        return;
    }
    c->phase = PH_AUTHED;
    s->st.auth_ok++;
    send_auth(c, KVPORT_AUTH_OK, NULL);
    /* from now on only silence counts, not the time since the accept */
    uv_timer_start(&c->timer, on_idle, s->idle_ms, s->idle_ms);
}

static void handle_frame(conn *c, const kvport_hdr *h, const uint8_t *payload)
{
    kvport_msg m;
    c->s->st.frames++;
    if (c->phase != PH_AUTHED) {
        handle_unauthed(c, h, payload);
        return;
    }
    int rc = kvport_decode(h, payload, &m);
    if (rc) {
        send_error(c, KVPORT_ERROR, rc, dx_errmsg());
        return;
    }
    switch (m.type) {
    case KVPORT_HELLO:
        handle_hello(c, &m.u.hello);
        break;
    case KVPORT_PIN:
        handle_pin(c, &m.u.pin);
        break;
    case KVPORT_RELEASE:
        handle_release(c, &m.u.release);
        break;
    case KVPORT_RENEW:
        handle_renew(c, &m.u.renew);
        break;
    default: {
        char msg[96];
        snprintf(msg, sizeof msg, "a holder does not accept %s frames", kvport_type_name(m.type));
        send_error(c, KVPORT_ERROR, DX_EPROTO, msg);
    }
    }
}

static void conn_process(conn *c)
{
    while (!c->closing && !c->paused && !c->failing) {
        kvport_hdr h;
        int rc = kvport_hdr_read((const uint8_t *)c->in.data, c->in.len, &h);
        if (rc == DX_EAGAIN) return;
        if (rc) {
            conn_fail(c, rc, dx_errmsg());
            return;
        }
        if (c->phase != PH_AUTHED && h.length > KVPORT_MAX_AUTH_PAYLOAD) {
            auth_fail(c, "oversized frame before authentication");
            return;
        }
        size_t need = KVPORT_HDR_BYTES + (size_t)h.length;
        if (c->in.len < need) return;
        int authed = c->phase == PH_AUTHED;
        handle_frame(c, &h, (const uint8_t *)c->in.data + KVPORT_HDR_BYTES);
        dx_buf_consume(&c->in, need);
        if (authed && !c->closing) uv_timer_again(&c->timer); /* a complete frame: not idle */
    }
}

static void conn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    conn *c = h->data;
    *buf = uv_buf_init(c->rd, sizeof c->rd);
}

static void conn_on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    conn *c = st->data;
    if (n < 0) {
        conn_close(c);
        return;
    }
    if (n == 0 || c->closing) return;
    if (dx_buf_append(&c->in, buf->base, (size_t)n)) {
        conn_fail(c, DX_ETOOBIG, "kvport: input over the connection's buffer limit");
        return;
    }
    conn_process(c);
}

static void on_idle(uv_timer_t *t)
{
    conn *c = t->data;
    /* Reads are one-sided: a reader busy copying pinned blocks sends nothing
     * here, so a connection that holds live pins is never idle.  Its pins end
     * at RELEASE, at their own deadline (the sweep), or when the peer goes. */
    if (dx_hidx_count(c->pins)) forget_dead_pins(c);
    if (dx_hidx_count(c->pins)) return;
    DX_LOGD("kvport: closing an idle connection");
    c->s->st.idle_closed++;
    conn_close(c);
}

static void on_handshake_deadline(uv_timer_t *t)
{
    conn *c = t->data;
    c->s->st.handshake_timeouts++;
    DX_LOGD("kvport: closing a connection that did not authenticate in time");
    conn_close(c);
}

/* Which of the connection caps (if any) keeps c (just accepted, already in
 * the list) out; evicts the oldest unauthenticated connection when that
 * makes room. */
static int over_caps(kvport_server *s, conn *c)
{
    unsigned same = 0, same_unauthed = 0, unauthed = 0;
    conn *oldest = NULL;
    DX_LIST_FOR_EACH(it, &s->conns)
    {
        conn *o = DX_LIST_ENTRY(it, conn, link);
        if (o == c || o->closing) continue;
        int mine = memcmp(o->peer.ip, c->peer.ip, sizeof o->peer.ip) == 0;
        same += mine;
        if (o->phase != PH_AUTHED) {
            unauthed++;
            same_unauthed += mine;
            oldest = o; /* the list is newest first */
        }
    }
    if (s->n_conns > s->max_conns || same >= s->max_per_peer ||
        same_unauthed >= s->max_handshakes_per_peer)
        return 1;
    if (unauthed >= s->max_handshakes && oldest) {
        s->st.evicted++;
        conn_close(oldest);
    }
    return 0;
}

/* The connection's two ends: 0, DX_EIO when the socket cannot say, or
 * dx_addr_norm's DX_EINVAL. */
static int conn_addresses(conn *c)
{
    struct sockaddr_storage a, b;
    int la = sizeof a, lb = sizeof b;
    int rc = uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&a, &la);
    if (!rc) rc = uv_tcp_getsockname(&c->tcp, (struct sockaddr *)&b, &lb);
    if (rc) return dx_errf(DX_EIO, "kv port: a connection's addresses: %s", uv_strerror(rc));
    rc = dx_addr_norm((struct sockaddr *)&a, &c->peer);
    return rc ? rc : dx_addr_norm((struct sockaddr *)&b, &c->local);
}

static void on_connection(uv_stream_t *l, int status)
{
    kvport_server *s = l->data;
    if (status < 0) return;
    conn *c = dx_calloc(1, sizeof *c);
    if (!c) return;
    c->s = s;
    c->prune_at = CONN_PRUNE_MIN;
    c->phase = PH_INIT;
    dx_buf_init(&c->in, KVPORT_HDR_BYTES + KVPORT_MAX_PAYLOAD + CONN_READ_CHUNK);
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->open_handles = 2;
    dx_list_push_front(&s->conns, &c->link);
    s->n_conns++;
    s->st.conns++;
    if (dx_hidx_create(0, &c->pins) || uv_accept(l, (uv_stream_t *)&c->tcp) < 0 ||
        conn_addresses(c) || over_caps(s, c)) {
        s->st.refused++;
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        dx_addr_keepalive(fd, CONN_KEEPALIVE_IDLE_S, CONN_KEEPALIVE_INTVL_S, CONN_KEEPALIVE_CNT);
    /* absolute: nothing the peer sends before it authenticates moves it */
    uv_timer_start(&c->timer, on_handshake_deadline, s->handshake_ms, 0);
    uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
}

static void on_sweep(uv_timer_t *t)
{
    kvport_server *s = t->data;
    xfer_leases_sweep(s->leases, dx_now_ns());
}

static void server_on_closed(uv_handle_t *h)
{
    kvport_server *s = h->data;
    s->open_handles--;
    server_maybe_free(s);
}

static int server_listen(kvport_server *s, const char *host, int port)
{
    struct sockaddr_storage ss;
    socklen_t alen;
    int rc = dx_addr_resolve(host, port, &ss, &alen);
    if (rc) return dx_err_wrap(rc, "kvport");
    rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&ss, 0);
    if (!rc) rc = uv_listen((uv_stream_t *)&s->listener, 128, on_connection);
    if (rc) return dx_errf(DX_EIO, "kvport: listen on %s:%d: %s", host, port, uv_strerror(rc));
    int len = sizeof ss;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len);
    s->port = dx_addr_port(&ss);
    return 0;
}

static uint64_t ms_or(double s, double dflt)
{
    return (uint64_t)((s > 0 ? s : dflt) * 1000);
}

int kvport_server_create(uv_loop_t *loop, const kvport_server_config *cfg, kvport_server **out)
{
    if (!cfg->leases || !cfg->hello) return dx_errf(DX_EINVAL, "kvport: config lacks leases/hello");
    kvport_server *s = dx_calloc(1, sizeof *s);
    if (!s) return dx_errf(DX_ENOMEM, "kvport: server");
    s->loop = loop;
    dx_list_init(&s->conns);
    s->leases = cfg->leases;
    s->hello = *cfg->hello;
    s->hello.engine_id = s->hello.transports = s->hello.worker_addr = s->hello.rkey =
        (kvport_bytes){NULL, 0};
    s->secret = cfg->secret;
    s->handshake_ms = ms_or(cfg->handshake_timeout_s, KVPORT_DEFAULT_HANDSHAKE_TIMEOUT_S);
    s->idle_ms = ms_or(cfg->idle_timeout_s, 60);
    s->sweep_ms = ms_or(cfg->sweep_interval_s, 1);
    s->max_conns = cfg->max_conns ? cfg->max_conns : 256;
    s->max_per_peer = cfg->max_conns_per_peer ? cfg->max_conns_per_peer : 128;
    s->max_handshakes = cfg->max_handshakes ? cfg->max_handshakes : 64;
    s->max_handshakes_per_peer = cfg->max_handshakes_per_peer ? cfg->max_handshakes_per_peer : 8;
    s->max_queued = cfg->max_queued ? cfg->max_queued : (size_t)1 << 20;
    dx_buf_init(&s->hello_frame, 0);
    xfer_token seed;
    int rc = xfer_token_random(&seed);
    memcpy(&s->pin_seed, seed.b, sizeof s->pin_seed);
    if (!rc) rc = kvport_encode_hello(&s->hello_frame, cfg->hello);
    uv_tcp_init(loop, &s->listener);
    uv_timer_init(loop, &s->sweep);
    s->listener.data = s->sweep.data = s;
    s->open_handles = 2;
    if (!rc) rc = server_listen(s, cfg->host ? cfg->host : "127.0.0.1", cfg->port);
    if (rc) {
        kvport_server_destroy(s);
        return rc;
    }
    uv_timer_start(&s->sweep, on_sweep, s->sweep_ms, s->sweep_ms);
    *out = s;
    return 0;
}

int kvport_server_port(const kvport_server *s)
{
    return s->port;
}

void kvport_server_get_stats(const kvport_server *s, kvport_server_stats *out)
{
    *out = s->st;
}

void kvport_server_destroy(kvport_server *s)
{
    if (!s) return;
    s->destroyed = 1;
    DX_LIST_FOR_EACH(it, &s->conns) conn_close(DX_LIST_ENTRY(it, conn, link));
    uv_close((uv_handle_t *)&s->listener, server_on_closed);
    uv_close((uv_handle_t *)&s->sweep, server_on_closed);
}
