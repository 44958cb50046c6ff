/* fault_proxy: a TCP proxy that the fault tests put on one link of a
 * cluster — router → node (HTTP), node → node (the KV port's control
 * connection), router → Redis — and tell to misbehave on it:
 *
 *   FP_BLACKHOLE  a peer that accepts and never answers: the connection is
 *                 accepted, what the client sends is read and dropped,
 *                 nothing is ever sent back and nothing is closed
 *   FP_FREEZE     one side silently gone (a half-open connection): from the
 *                 trigger on nothing more is forwarded either way and
 *                 nothing is closed
 *   FP_RESET      an RST in the middle: at the trigger both sides are reset
 *                 (`ms` > 0: nothing more goes either way, and the RST
 *                 follows `ms` later, once the bytes before it were read —
 *                 a receiver's kernel drops what it had not read when the
 *                 RST arrives)
 *   FP_STALL      at the trigger nothing is forwarded for `ms`, then it goes on
 *   FP_DRIP       from the trigger on one byte every `ms`, both ways
 *   FP_DELAY      from the trigger on every chunk the server sends is held
 *                 `ms` before it is forwarded (a slow server)
 *   FP_REORDER    new connections are held until `n` wait (or `ms` passed),
 *                 then connected upstream last first
 *   FP_VERSION    the KV port's frames are rewritten to carry protocol
 *                 version `version`, both ways (a peer of another version)
 *
 * A rule (fp_rule) says which connections it catches and when its fault
 * begins: with `match`, the first `n` connections — new or kept alive —
 * whose client sends those bytes (a request line); with `kv_type`, the
 * first `n` new connections, once the server has sent a KV-port frame of
 * that type (its payload forwarded: "after PIN_OK" is mid-transfer);
 * with neither, the next `n` new connections from their first byte.
 * `after` >= 0: the client's bytes go on and the fault begins once the
 * server has sent `after` more bytes (0: before its first byte); -1: at
 * the match itself, the matching bytes never reach the server.  n = 0
 * catches every connection until the next rule.
 *
 * The proxy runs in a child of the test process (forked, never exec'd:
 * the child uses only system calls and its own mmap'd memory, so the fork
 * of a threaded test is safe), optionally across network namespaces
 * (setns: it needs nothing from /sys): it may listen in one and connect
 * from another, and so take a node's own address and port in front of it
 * — transparent, as the KV port needs (its handshake binds the holder's
 * address as each side sees it: a proxy at another address would be a
 * relay, and refused).  Rules go to it through a pipe and
 * are acknowledged; what it did is counted in memory shared with the test
 * (fp_stats), so tests wait for events ("the fault fired") instead of
 * sleeping.  Static functions: include after cmocka.h. */
#ifndef FAULT_PROXY_H
#define FAULT_PROXY_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum fp_fault {
    FP_PASS,
    FP_BLACKHOLE,
    FP_FREEZE,
    FP_RESET,
    FP_STALL,
    FP_DRIP,
    FP_DELAY,
    FP_REORDER,
    FP_VERSION,
};

typedef struct {
    int fault;
    char match[40]; /* bytes from the client that make a connection caught ("": none) */
    long after;     /* server bytes after the match before the fault (-1: at the match) */
    int kv_type;    /* the fault begins after the server's KV frame of this type (0: none) */
    int ms;         /* stall length, drip interval, delay; FP_REORDER: longest hold */
    int n;          /* connections to catch (0: all); FP_REORDER: connections to hold */
    int version;    /* FP_VERSION: the protocol version written into every frame */
    int release;    /* not a rule: close (FIN) what earlier rules froze or hold */
} fp_rule;

/* What the proxy did, in memory shared with the test (read with fp_get). */
typedef struct {
    long port;                /* where it listens, once it does */
    long rules;               /* rules applied (acknowledges fp_arm) */
    long accepted, connected; /* client connections; upstream connections made */
    long caught, fired;       /* connections a rule caught; faults that began */
    long resets, closed;      /* RSTs sent; connections ended */
    long c2s, s2c;            /* bytes forwarded each way */
    long refused;             /* upstream connects that failed */
} fp_stats;

enum { FP_MAX_CONNS = 96, FP_BUF = 65536 };

typedef struct {
    int cfd, sfd;      /* client's and server's sockets (-1: none) */
    int eof[2];        /* the source of direction 0 (client→server) / 1 (back) ended */
    int broken;        /* a write failed: the reader is gone */
    int connecting;    /* sfd's connect in progress */
    int caught, fired; /* a rule caught it; its fault began */
    int fault;         /* the caught rule's */
    long after_left;   /* server bytes still to forward before the fault */
    int held;          /* FP_REORDER: waiting to be connected upstream */
    int64_t held_at;   /* when it was accepted (ns) */
    int64_t until;     /* FP_STALL: its end; FP_DRIP: the next byte */
    /* FP_DELAY: the server's chunks waiting in buf[1], each held `ms` from
     * its own arrival (a reply that follows a held one is not released
     * with it: a slow server is slow on every reply) */
    int64_t dl_at[16]; /* when chunk i may go */
    size_t dl_end[16]; /* where chunk i ends in buf[1] */
    int dl_n;
    char tail[40]; /* the client's last bytes, for a match across reads */
    size_t tail_len;
    /* KV-port frames followed per direction */
    uint8_t hdr[2][12];
    size_t hdr_got[2];
    uint32_t payload_left[2];
    int frame_type[2];
    char buf[2][FP_BUF]; /* bytes waiting, per direction */
    size_t len[2];
} fp_conn;

typedef struct {
    pid_t pid;
    int ctl;      /* the pipe to the child */
    fp_stats *st; /* shared */
} fp_proxy;

/* ---- the child ------------------------------------------------------------ */

typedef struct {
    int lfd, ctl;
    struct sockaddr_in target;
    fp_stats *st;
    fp_rule rule;
    int left;   /* connections the rule may still catch (-1: any number) */
    fp_conn *c; /* [FP_MAX_CONNS], mmap'd */
} fp_child;

static inline int64_t fp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void fp_add(long *v, long d)
{
    __atomic_add_fetch(v, d, __ATOMIC_SEQ_CST);
}

static inline int fp_in_use(const fp_conn *c)
{
    return c->cfd >= 0 || c->sfd >= 0;
}

/* A fault that keeps the connection open whatever the ends do: a frozen or
 * silent peer never says goodbye. */
static inline int fp_holds(const fp_conn *c)
{
    return c->fired && (c->fault == FP_FREEZE || c->fault == FP_BLACKHOLE);
}

static inline void fp_close_conn(fp_child *x, fp_conn *c, int rst)
{
    struct linger lg = {1, 0}; /* close now, with an RST */
    if (rst) {
        if (c->cfd >= 0) setsockopt(c->cfd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        if (c->sfd >= 0) setsockopt(c->sfd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        fp_add(&x->st->resets, 1);
    }
    if (c->cfd >= 0) close(c->cfd);
    if (c->sfd >= 0) close(c->sfd);
    c->cfd = c->sfd = -1;
    fp_add(&x->st->closed, 1);
}

static inline void fp_connect_up(fp_child *x, fp_conn *c)
{
    c->held = 0;
    c->sfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(c->sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = connect(c->sfd, (struct sockaddr *)&x->target, sizeof x->target);
    if (rc < 0 && errno != EINPROGRESS) {
        fp_add(&x->st->refused, 1);
        fp_close_conn(x, c, 1); /* as the server's refusal would reach the client */
        return;
    }
    c->connecting = rc < 0;
    if (!c->connecting) fp_add(&x->st->connected, 1);
}

/* FP_DELAY: the server's bytes up to buf[1] + end arrived now. */
static inline void fp_delay_mark(const fp_child *x, fp_conn *c, size_t end)
{
    int64_t at = fp_now() + (int64_t)x->rule.ms * 1000000;
    if (c->dl_n == 16) { /* full: the newest joins the last, which waits for it */
        c->dl_end[15] = end;
        c->dl_at[15] = at;
        return;
    }
    c->dl_at[c->dl_n] = at;
    c->dl_end[c->dl_n++] = end;
}

/* The fault of c's rule begins. */
static inline void fp_fire(fp_child *x, fp_conn *c)
{
    c->fired = 1;
    fp_add(&x->st->fired, 1);
    int64_t now = fp_now();
    if (c->fault == FP_RESET && x->rule.ms <= 0) fp_close_conn(x, c, 1);
    if (c->fault == FP_STALL || c->fault == FP_RESET)
        c->until = now + (int64_t)x->rule.ms * 1000000; /* what waits now waits that long */
    if (c->fault == FP_DELAY && c->len[1]) fp_delay_mark(x, c, c->len[1]);
    if (c->fault == FP_DRIP) c->until = now;
}

static inline void fp_catch(fp_child *x, fp_conn *c)
{
    c->caught = 1;
    c->fault = x->rule.fault;
    c->after_left = x->rule.after;
    if (x->left > 0) x->left--;
    fp_add(&x->st->caught, 1);
}

static inline void fp_accept(fp_child *x)
{
    int fd = accept4(x->lfd, NULL, NULL, SOCK_NONBLOCK);
    if (fd < 0) return;
    fp_conn *c = NULL;
    for (int i = 0; i < FP_MAX_CONNS && !c; i++)
        if (!fp_in_use(&x->c[i])) c = &x->c[i];
    if (!c) {
        close(fd);
        return;
    }
    memset(c, 0, sizeof *c);
    c->cfd = fd;
    c->sfd = -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fp_add(&x->st->accepted, 1);
    const fp_rule *r = &x->rule;
    if (r->fault != FP_PASS && !r->match[0] && x->left != 0) {
        fp_catch(x, c);
        /* from the first byte: a rule that waits for nothing, a silent peer,
         * another protocol version */
        if (!r->kv_type && (r->after < 0 || r->fault == FP_BLACKHOLE || r->fault == FP_VERSION))
            fp_fire(x, c);
    }
    if (c->fired && c->fault == FP_BLACKHOLE) return; /* never connected upstream */
    if (c->caught && c->fault == FP_REORDER) {
        c->held = 1;
        c->held_at = fp_now();
        return;
    }
    fp_connect_up(x, c);
}

/* FP_REORDER: once `n` wait (or the oldest waited `ms`), newest first. */
static inline void fp_release_held(fp_child *x)
{
    int n = 0;
    int64_t oldest = 0;
    for (int i = 0; i < FP_MAX_CONNS; i++)
        if (x->c[i].cfd >= 0 && x->c[i].held) {
            n++;
            if (!oldest || x->c[i].held_at < oldest) oldest = x->c[i].held_at;
        }
    int want = x->rule.n > 0 ? x->rule.n : 2;
    if (!n || (n < want && fp_now() - oldest < (int64_t)x->rule.ms * 1000000)) return;
    while (n--) {
        fp_conn *last = NULL;
        for (int i = 0; i < FP_MAX_CONNS; i++)
            if (x->c[i].cfd >= 0 && x->c[i].held && (!last || x->c[i].held_at > last->held_at))
                last = &x->c[i];
        fp_connect_up(x, last);
    }
}

/* Follows the KV-port frames in d[0..n), going direction dir: under
 * FP_VERSION rewrites their version; returns the offset just past the end
 * of a server frame of the rule's kv_type that ends here, or 0. */
static inline size_t fp_kv_scan(fp_child *x, fp_conn *c, int dir, char *d, size_t n)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t *got = &c->hdr_got[dir];
        if (*got < 12) {
            if (c->caught && c->fault == FP_VERSION && (*got == 4 || *got == 5))
                d[i] = (char)((x->rule.version >> (*got == 4 ? 0 : 8)) & 0xff);
            c->hdr[dir][(*got)++] = (uint8_t)d[i];
            if (*got == 12) {
                const uint8_t *h = c->hdr[dir];
                c->frame_type[dir] = h[6] | h[7] << 8;
                c->payload_left[dir] = (uint32_t)h[8] | (uint32_t)h[9] << 8 |
                                       (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
            }
        } else if (c->payload_left[dir]) {
            c->payload_left[dir]--;
        }
        if (*got == 12 && !c->payload_left[dir]) { /* a frame ends at i */
            *got = 0;
            if (dir == 1 && !at && c->caught && !c->fired && x->rule.kv_type &&
                c->frame_type[1] == x->rule.kv_type)
                at = i + 1;
        }
    }
    return at;
}

/* How many of direction dir's waiting bytes may be written now. */
static inline size_t fp_may_send(const fp_child *x, const fp_conn *c, int dir, int64_t now)
{
    size_t n = c->len[dir];
    if (!c->fired) {
        if (dir == 1 && c->caught && c->after_left >= 0 && !x->rule.kv_type &&
            n > (size_t)c->after_left)
            return (size_t)c->after_left;
        return n;
    }
    switch (c->fault) {
    case FP_FREEZE:
    case FP_BLACKHOLE:
    case FP_RESET: /* its RST is due (fp_serve_conn) */
        return 0;
    case FP_STALL:
        return now >= c->until ? n : 0;
    case FP_DRIP:
        return now >= c->until && n ? 1 : 0;
    case FP_DELAY: {
        if (dir == 0) return n;
        size_t k = 0;
        for (int i = 0; i < c->dl_n && c->dl_at[i] <= now; i++) k = c->dl_end[i];
        return k;
    }
    default:
        return n;
    }
}

/* Writes what may go of direction dir; -1 when the connection is over. */
static inline int fp_flush(fp_child *x, fp_conn *c, int dir)
{
    int to = dir ? c->cfd : c->sfd;
    if (to < 0 || c->connecting || c->held) return 0;
    int64_t now = fp_now();
    size_t k = fp_may_send(x, c, dir, now);
    if (!k) {
        if (dir == 1 && c->caught && !c->fired && c->after_left == 0 && c->len[1] &&
            !x->rule.kv_type)
            fp_fire(x, c); /* the server's next byte is where the fault begins */
        return c->cfd < 0 && c->sfd < 0 ? -1 : 0;
    }
    ssize_t w = send(to, c->buf[dir], k, MSG_NOSIGNAL);
    if (w < 0 && errno == EAGAIN) return 0;
    if (w < 0) {
        c->broken = 1;
        return -1;
    }
    memmove(c->buf[dir], c->buf[dir] + w, c->len[dir] - (size_t)w);
    c->len[dir] -= (size_t)w;
    fp_add(dir ? &x->st->s2c : &x->st->c2s, w);
    if (dir == 1 && c->dl_n) { /* the sent chunks leave the delay marks */
        int keep = 0;
        for (int i = 0; i < c->dl_n; i++)
            if (c->dl_end[i] > (size_t)w) {
                c->dl_at[keep] = c->dl_at[i];
                c->dl_end[keep++] = c->dl_end[i] - (size_t)w;
            }
        c->dl_n = keep;
    }
    if (dir == 1 && c->caught && !c->fired && c->after_left > 0 && !x->rule.kv_type) {
        c->after_left -= w;
        if (c->after_left == 0) fp_fire(x, c);
    }
    if (c->fired && c->fault == FP_DRIP) c->until = now + (int64_t)x->rule.ms * 1000000;
    return 0;
}

/* The client's bytes d[0..r): does the rule's match catch the connection?
 * 1 when the fault begins here and the bytes must not go on. */
static inline int fp_match(fp_child *x, fp_conn *c, const char *d, size_t r)
{
    if (!x->rule.match[0] || c->caught || x->left == 0) return 0;
    char look[sizeof c->tail + 4096];
    size_t t = c->tail_len, m = r < 4096 ? r : 4096;
    memcpy(look, c->tail, t);
    memcpy(look + t, d, m);
    int hit = memmem(look, t + m, x->rule.match, strlen(x->rule.match)) != NULL;
    size_t keep = t + m < sizeof c->tail ? t + m : sizeof c->tail;
    memcpy(c->tail, look + t + m - keep, keep);
    c->tail_len = keep;
    if (!hit) return 0;
    fp_catch(x, c);
    if (c->after_left >= 0) return 0;
    fp_fire(x, c);
    return 1;
}

/* Reads direction dir's source; -1 when it ended or failed. */
static inline int fp_fill(fp_child *x, fp_conn *c, int dir)
{
    int from = dir ? c->sfd : c->cfd;
    size_t room = FP_BUF - c->len[dir];
    if (from < 0 || !room || c->eof[dir]) return 0;
    char *d = c->buf[dir] + c->len[dir];
    ssize_t r = read(from, d, room);
    if (r < 0 && errno == EAGAIN) return 0;
    if (r <= 0) {
        c->eof[dir] = 1;
        return -1;
    }
    if (fp_holds(c) && c->fault == FP_BLACKHOLE) return 0; /* read and dropped */
    if (dir == 0 && fp_match(x, c, d, (size_t)r)) return 0;
    size_t at = fp_kv_scan(x, c, dir, d, (size_t)r);
    c->len[dir] += (size_t)r;
    if (dir == 1 && c->fired && c->fault == FP_DELAY) fp_delay_mark(x, c, c->len[1]);
    if (!at) return 0;
    /* the frame that triggers the fault ends inside this read: it reaches
     * the client whole (waiting for the socket if need be), and what came
     * after it is the first the fault decides about */
    size_t extra = (size_t)r - at;
    char rest[FP_BUF];
    memcpy(rest, d + at, extra);
    c->len[1] -= extra;
    for (int i = 0; i < 100 && c->len[1] && c->cfd >= 0; i++) {
        struct pollfd p = {.fd = c->cfd, .events = POLLOUT};
        poll(&p, 1, 100);
        if (fp_flush(x, c, 1) < 0) return -1;
    }
    memcpy(c->buf[1] + c->len[1], rest, extra);
    c->len[1] += extra;
    fp_fire(x, c);
    return c->cfd < 0 ? -1 : 0;
}

static inline void fp_apply(fp_child *x, const fp_rule *r)
{
    if (r->release) {
        for (int i = 0; i < FP_MAX_CONNS; i++) {
            fp_conn *c = &x->c[i];
            if (fp_in_use(c) && (c->caught || c->held)) fp_close_conn(x, c, 0);
        }
        x->rule = (fp_rule){.fault = FP_PASS};
        x->left = 0;
    } else {
        x->rule = *r;
        x->left = r->n > 0 ? r->n : -1;
    }
    fp_add(&x->st->rules, 1);
}

static inline int64_t fp_wake(const fp_child *x, const fp_conn *c, int64_t wake)
{
    int64_t t = 0;
    if (c->held)
        t = c->held_at + (int64_t)x->rule.ms * 1000000;
    else if (c->fired && c->fault == FP_RESET)
        t = c->until;
    else if (c->fired && (c->fault == FP_STALL || c->fault == FP_DRIP) && (c->len[0] || c->len[1]))
        t = c->until;
    else if (c->fired && c->fault == FP_DELAY && c->dl_n)
        t = c->dl_at[0];
    return t && (!wake || t < wake) ? t : wake;
}

/* One connection's events: connect done, reads, writes, ends. */
static inline void fp_serve_conn(fp_child *x, fp_conn *c, const struct pollfd *pc,
                                 const struct pollfd *ps)
{
    if (c->connecting && ps && ps->revents) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(c->sfd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err) {
            fp_add(&x->st->refused, 1);
            fp_close_conn(x, c, 1);
            return;
        }
        c->connecting = 0;
        fp_add(&x->st->connected, 1);
    }
    if (c->fired && c->fault == FP_RESET && fp_now() >= c->until) {
        fp_close_conn(x, c, 1);
        return;
    }
    int gone = 0;
    if (pc && (pc->revents & (POLLIN | POLLHUP | POLLERR))) gone |= fp_fill(x, c, 0) < 0;
    if (fp_in_use(c) && ps && !c->connecting && (ps->revents & (POLLIN | POLLHUP | POLLERR)))
        gone |= fp_fill(x, c, 1) < 0;
    if (fp_in_use(c)) gone |= fp_flush(x, c, 0) < 0;
    if (fp_in_use(c)) gone |= fp_flush(x, c, 1) < 0;
    if (!fp_in_use(c)) return;
    if (fp_holds(c)) {
        /* an end that gives up leaves on its own; the other never learns */
        for (int dir = 0; dir < 2; dir++) {
            int *fd = dir ? &c->sfd : &c->cfd;
            if (c->eof[dir] && *fd >= 0) {
                close(*fd);
                *fd = -1;
            }
        }
        return;
    }
    if (c->broken) { /* the reader of one side is gone: so is the other's */
        fp_close_conn(x, c, 1);
        return;
    }
    /* an end goes on once the bytes before it have */
    int ended = (c->eof[0] && !c->len[0]) || (c->eof[1] && !c->len[1]);
    if (gone && ended) fp_close_conn(x, c, 0);
}

static inline void fp_child_run(fp_child *x)
{
    struct pollfd pfd[2 + 2 * FP_MAX_CONNS];
    int idx[FP_MAX_CONNS][2];
    for (;;) {
        int n = 0;
        pfd[n++] = (struct pollfd){.fd = x->ctl, .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = x->lfd, .events = POLLIN};
        int64_t wake = 0, now = fp_now();
        for (int i = 0; i < FP_MAX_CONNS; i++) {
            fp_conn *c = &x->c[i];
            idx[i][0] = idx[i][1] = -1;
            if (!fp_in_use(c)) continue;
            wake = fp_wake(x, c, wake);
            if (c->held) continue;
            int drop = fp_holds(c) && c->fault == FP_BLACKHOLE;
            if (c->cfd >= 0) {
                short ev = (!c->eof[0] && (c->len[0] < FP_BUF || drop) && (!fp_holds(c) || drop))
                               ? POLLIN
                               : 0;
                if (fp_may_send(x, c, 1, now)) ev |= POLLOUT;
                idx[i][0] = n;
                pfd[n++] = (struct pollfd){.fd = c->cfd, .events = ev};
            }
            if (c->sfd >= 0) {
                short ev = POLLOUT;
                if (!c->connecting) {
                    ev = (!c->eof[1] && c->len[1] < FP_BUF && !fp_holds(c)) ? POLLIN : 0;
                    if (fp_may_send(x, c, 0, now)) ev |= POLLOUT;
                }
                idx[i][1] = n;
                pfd[n++] = (struct pollfd){.fd = c->sfd, .events = ev};
            }
        }
        int ms = 200;
        if (wake) {
            int64_t d = (wake - now) / 1000000;
            ms = d < 1 ? 1 : d < 200 ? (int)d : 200;
        }
        if (poll(pfd, (nfds_t)n, ms) < 0 && errno != EINTR) _exit(1);
        if (pfd[0].revents) {
            fp_rule r;
            if (read(x->ctl, &r, sizeof r) != (ssize_t)sizeof r) _exit(0); /* the test is gone */
            fp_apply(x, &r);
        }
        if (pfd[1].revents & POLLIN) fp_accept(x);
        fp_release_held(x);
        for (int i = 0; i < FP_MAX_CONNS; i++) {
            fp_conn *c = &x->c[i];
            if (!fp_in_use(c) || c->held) continue;
            fp_serve_conn(x, c, idx[i][0] >= 0 ? &pfd[idx[i][0]] : NULL,
                          idx[i][1] >= 0 ? &pfd[idx[i][1]] : NULL);
        }
    }
}

/* ---- the test's side ------------------------------------------------------ */

/* Enters the network namespace `ip netns add` named ns (NULL: stays). */
static inline int fp_enter(const char *ns)
{
    if (!ns) return 0;
    char path[128];
    snprintf(path, sizeof path, "/run/netns/%s", ns);
    int fd = open(path, O_RDONLY);
    int rc = fd < 0 || setns(fd, CLONE_NEWNET) ? -1 : 0;
    if (fd >= 0) close(fd);
    return rc;
}

/* Starts a proxy listening on listen_ip:listen_port (0: a free one) that
 * forwards to target_ip:target_port; it listens inside network namespace
 * listen_ns and connects from inside connect_ns (NULL: the test's).  The
 * port it listens on is in p->st->port once this returns. */
static inline void fp_start_ns(fp_proxy *p, const char *listen_ns, const char *connect_ns,
                               const char *listen_ip, int listen_port, const char *target_ip,
                               int target_port)
{
    p->st = mmap(NULL, sizeof *p->st, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p->st != MAP_FAILED);
    memset(p->st, 0, sizeof *p->st);
    int pp[2];
    assert_int_equal(pipe(pp), 0);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(pp[1]);
        if (fp_enter(listen_ns)) _exit(2);
        fp_child x = {.ctl = pp[0], .st = p->st, .rule = {.fault = FP_PASS}};
        x.c = mmap(NULL, FP_MAX_CONNS * sizeof *x.c, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (x.c == MAP_FAILED) _exit(3);
        for (int i = 0; i < FP_MAX_CONNS; i++) x.c[i].cfd = x.c[i].sfd = -1;
        x.target =
            (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)target_port)};
        inet_pton(AF_INET, target_ip, &x.target.sin_addr);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)listen_port)};
        inet_pton(AF_INET, listen_ip, &a.sin_addr);
        socklen_t len = sizeof a;
        x.lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        int one = 1;
        setsockopt(x.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(x.lfd, (struct sockaddr *)&a, sizeof a) || listen(x.lfd, 128) ||
            getsockname(x.lfd, (struct sockaddr *)&a, &len))
            _exit(4);
        /* sockets keep the namespace they were made in: the listener stays */
        if (fp_enter(connect_ns)) _exit(5);
        __atomic_store_n(&x.st->port, (long)ntohs(a.sin_port), __ATOMIC_SEQ_CST);
        fp_child_run(&x);
        _exit(0);
    }
    close(pp[0]);
    p->ctl = pp[1];
    for (int i = 0; i < 600 && !__atomic_load_n(&p->st->port, __ATOMIC_SEQ_CST); i++) {
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) fail_msg("the fault proxy exited (%d)", st);
        usleep(10000);
    }
    assert_true(p->st->port > 0);
}

/* The same in the test's own namespace. */
static inline void fp_start(fp_proxy *p, const char *listen_ip, const char *target_ip,
                            int target_port)
{
    fp_start_ns(p, NULL, NULL, listen_ip, 0, target_ip, target_port);
}

static inline long fp_get(const fp_proxy *p, const long *field)
{
    (void)p;
    return __atomic_load_n(field, __ATOMIC_SEQ_CST);
}

/* Sends a rule and waits until the proxy applied it. */
static inline void fp_arm(fp_proxy *p, fp_rule r)
{
    long before = fp_get(p, &p->st->rules);
    assert_int_equal(write(p->ctl, &r, sizeof r), (ssize_t)sizeof r);
    for (int i = 0; i < 3000 && fp_get(p, &p->st->rules) == before; i++) usleep(1000);
    assert_true(fp_get(p, &p->st->rules) > before);
}

/* Back to passing everything; what the earlier rules froze or hold is
 * closed (FIN). */
static inline void fp_pass(fp_proxy *p)
{
    fp_arm(p, (fp_rule){.fault = FP_PASS, .release = 1});
}

/* Waits (up to timeout_s) until *field reaches want; 0, or -1. */
static inline int fp_wait(const fp_proxy *p, const long *field, long want, int timeout_s)
{
    for (int i = 0; i < timeout_s * 100; i++) {
        if (fp_get(p, field) >= want) return 0;
        usleep(10000);
    }
    return -1;
}

static inline void fp_stop(fp_proxy *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        close(p->ctl);
    }
    p->pid = 0;
    if (p->st) munmap(p->st, sizeof *p->st);
    p->st = NULL;
}

#endif
