/* http_conn: HTTP/1.1 server connections on libuv + http-parser (see .h).
 *
 * A connection is a small state machine:
 *   READING  parsing a request (timer: idle, then the request's deadline)
 *   BUSY     a complete request is with the application; input is buffered
 *   STREAM   BUSY, and a chunked answer has begun
 *   CLOSING  uv_close issued; freed when both handles report closed and no
 *            hold is left
 * All unparsed input lives in c->in (bounded); parsing resumes from it after
 * each answer, which is how pipelined requests keep their order.
 *
 * Output allocates nothing per write once its buffers have grown: a write
 * goes straight to the socket (uv_try_write) when nothing is queued; what
 * the socket does not take is copied into c->wnext and handed to the one
 * uv_write in flight, from c->wfly; what the application writes meanwhile
 * is appended to c->wnext, which becomes the next write when it completes.
 *
 * Memory: every connection's buffers are charged to the server (their
 * capacities, re-counted after each read, write and answer), so the total a
 * crowd of clients can make the server hold is bounded, not only each one's
 * share; buffers grown past WBUF_KEEP by one request are released when its
 * answer is finished.  Connections are counted per peer address in a hash
 * index keyed with a per-server random seed. */
#include "http/http_conn.h"

#include <arpa/inet.h>
#include <http_parser.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <xxhash.h>

#include "base/dx_addr.h"
#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_hidx.h"
#include "base/dx_list.h"
#include "base/dx_log.h"
#include "http/prom.h"

enum conn_state { ST_READING, ST_BUSY, ST_STREAM, ST_CLOSING };

/* One peer address and its open connections. */
typedef struct {
    uint8_t addr[16]; /* IPv6, or IPv4-mapped */
    uint64_t hash;
    uint32_t n;
} http_peer;

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    http_srv *srv;
    dx_list link; /* srv->conns */
    http_parser parser;
    enum conn_state state;
    int n_open_handles;
    int holds;          /* http_conn_hold minus http_conn_release */
    int handles_closed; /* both handles closed: freed when the holds are gone */
    int keep_alive;     /* this request's answer keeps the connection */
    int chunked;        /* the current stream uses chunked encoding */
    int in_process;     /* inside conn_process: no re-entry */
    int close_after_write;
    int reject_status;   /* set by a parser callback to refuse the request */
    int in_message;      /* a request has begun (bytes seen) */
    int header_is_value; /* last header callback was a value */
    int head_done;       /* the request's headers are complete */
    int is_head;         /* answering a HEAD request: no body goes out */
    int trusted;         /* the peer is one of the limits' trusted addresses */
    int health_only;     /* past its share of connections: GET /health, once */
    int served;          /* has had an answer: idle now means between requests */
    http_peer *peer;
    uint64_t req_start;     /* loop time (ms) of the request's first byte; 0: none */
    uint64_t body_expect;   /* declared body bytes (the limit when chunked) */
    uint64_t chunked_total; /* chunk sizes declared so far */
    uint64_t idle_since;    /* loop time the connection last became idle */
    size_t charged;         /* bytes of buffers counted in srv->buffered */
    size_t app_bytes;       /* held by the application for the request (http_conn_charge) */
    dx_buf in;              /* unparsed input */
    dx_buf head;            /* url, then header names/values, NUL-separated */
    dx_buf body;
    size_t head_bytes; /* url + header bytes seen (limit check) */
    size_t *hdr_off;   /* per header: offset of name, of value in head */
    http_header *hdrs; /* [max_headers]: the headers as the application gets them */
    uint32_t n_hdr;
    size_t url_end;
    uv_write_t wreq; /* the one write in flight (data: this connection) */
    int writing;     /* wreq is in flight */
    dx_buf wfly;     /* its bytes (uv_write needs them until it completes) */
    dx_buf wnext;    /* bytes queued behind it; empty while !writing */
    http_abort_fn abort_fn;
    void *abort_user;
    struct sockaddr_storage peer_ss; /* the client's address (servers may trust some) */
    int has_peer;
    char rbuf[16384];
};

struct http_srv {
    uv_loop_t *loop;
    uv_tcp_t listener;
    http_srv_config cfg;
    http_limits *lim; /* &cfg.lim, defaults filled in */
    char host[64];
    int port;
    int listening;
    int destroying;
    int n_open; /* listener + connections not yet freed */
    size_t n_conns, n_health_only;
    dx_list conns; /* open connections (not CLOSING), newest first */
    /* A connection there was no memory for is taken from libuv with this
     * handle (embedded: needs no allocation) and closed at once; libuv
     * accepts nothing more until a pending connection is taken. */
    uv_tcp_t reject;
    int reject_busy, reject_pending;
    dx_hidx *peers; /* peer hash -> http_peer * */
    uint64_t peer_seed;
    uint8_t (*trusted)[16];
    size_t n_trusted;
    size_t buffered;
    http_srv_stats st; /* counters (the gauges are read live) */
};

/* A write buffer over this is released once written rather than kept for
 * the connection's life (a large non-streamed answer). */
#define WBUF_KEEP (64u << 10)

static void conn_close(http_conn *c);
static void on_write_done(uv_write_t *w, int status);
static void conn_process(http_conn *c);

const char *http_status_text(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 413:
        return "Payload Too Large";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 505:
        return "HTTP Version Not Supported";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return "Unknown";
    }
}

const char *http_req_header(const http_req *r, const char *name, int *count)
{
    const char *v = NULL;
    int n = 0;
    for (size_t i = 0; i < r->n_headers; i++)
        if (!strcasecmp(r->headers[i].name, name) && n++ == 0) v = r->headers[i].value;
    if (count) *count = n;
    return v;
}

/* ---- accounting ------------------------------------------------------ */

/* Re-counts c's buffers in the server's total. */
static void conn_charge(http_conn *c)
{
    size_t now = c->in.cap + c->head.cap + c->body.cap + c->wfly.cap + c->wnext.cap + c->app_bytes;
    c->srv->buffered = c->srv->buffered - c->charged + now;
    c->charged = now;
}

static int over_budget(const http_srv *s)
{
    return s->buffered > s->lim->max_buffered_bytes;
}

int http_conn_charge(http_conn *c, size_t bytes)
{
    c->app_bytes += bytes;
    conn_charge(c);
    if (!bytes || !over_budget(c->srv)) return 0;
    c->srv->st.refused_budget++;
    DX_LOGD("http: %zu bytes held, over the budget of %zu: refusing", c->srv->buffered,
            c->srv->lim->max_buffered_bytes);
    return 1;
}

void http_conn_uncharge(http_conn *c, size_t bytes)
{
    c->app_bytes -= bytes < c->app_bytes ? bytes : c->app_bytes;
    conn_charge(c);
}

/* ---- output ---------------------------------------------------------- */

/* Bytes handed over and not yet written. */
static size_t conn_queued(const http_conn *c)
{
    return c->wfly.len + c->wnext.len;
}

size_t http_srv_unwritten(const http_srv *s)
{
    size_t n = 0;
    DX_LIST_FOR_EACH(it, &s->conns) n += conn_queued(DX_LIST_ENTRY(it, http_conn, link));
    return n;
}

/* Starts writing c->wnext (not empty, nothing in flight). */
static int conn_flush(http_conn *c)
{
    DX_ASSERT(!c->writing && c->wfly.len == 0);
    dx_buf t = c->wfly; /* empty: its last write has completed */
    c->wfly = c->wnext;
    c->wnext = t;
    uv_buf_t buf = uv_buf_init(c->wfly.data, (unsigned)c->wfly.len);
    int rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &buf, 1, on_write_done);
    if (rc < 0) {
        dx_buf_reset(&c->wfly);
        conn_close(c);
        return dx_errf(DX_ECLOSED, "http: write: %s", uv_strerror(rc));
    }
    c->writing = 1;
    return 0;
}

static void on_write_done(uv_write_t *w, int status)
{
    http_conn *c = w->data;
    c->writing = 0;
    dx_buf_reset(&c->wfly);
    if (c->wfly.cap > WBUF_KEEP) dx_buf_free(&c->wfly);
    conn_charge(c);
    if (c->state == ST_CLOSING) return; /* canceled by the close: what is queued is dropped */
    if (status < 0) {
        DX_LOGD("http: write failed: %s", uv_strerror(status));
        conn_close(c);
        return;
    }
    if (c->wnext.len)
        conn_flush(c); /* a failure closes */
    else if (c->close_after_write)
        conn_close(c);
}

/* Writes up to three pieces now, or queues them behind the write in flight.
 * Fails (and closes) when the client has let too much pile up: it is not
 * reading — past its own limit, or past a share of the server's budget
 * while the server is over it. */
static int conn_writev(http_conn *c, const uv_buf_t *parts, int n_parts)
{
    if (c->state == ST_CLOSING) return dx_errf(DX_ECLOSED, "http: connection closed");
    size_t len = 0;
    for (int i = 0; i < n_parts; i++) len += parts[i].len;
    if (conn_queued(c) + len > c->srv->lim->max_write_queue_bytes ||
        (conn_queued(c) > WBUF_KEEP && over_budget(c->srv))) {
        size_t queued = conn_queued(c);
        if (conn_queued(c) + len <= c->srv->lim->max_write_queue_bytes) c->srv->st.refused_budget++;
        conn_close(c);
        return dx_errf(DX_ECLOSED, "http: client not reading (%zu bytes queued)", queued);
    }
    size_t done = 0;
    if (!c->writing) {
        /* Nothing queued: straight to the socket, as far as it takes it.  An
         * error is left to uv_write below, which reports it in its callback. */
        int n = uv_try_write((uv_stream_t *)&c->tcp, parts, (unsigned)n_parts);
        if (n > 0) done = (size_t)n;
        if (done == len) return 0;
    }
    if (dx_buf_reserve(&c->wnext, len - done) < 0) {
        conn_close(c);
        return dx_errf(DX_ENOMEM, "http: no memory for a %zu-byte write", len - done);
    }
    for (int i = 0; i < n_parts; i++) {
        size_t skip = done < parts[i].len ? done : parts[i].len;
        dx_buf_append(&c->wnext, parts[i].base + skip, parts[i].len - skip);
        done -= skip;
    }
    conn_charge(c);
    return c->writing ? 0 : conn_flush(c);
}

static int conn_write(http_conn *c, const char *a, size_t alen, const char *b, size_t blen)
{
    uv_buf_t parts[2] = {uv_buf_init((char *)a, (unsigned)alen),
                         uv_buf_init((char *)b, (unsigned)blen)};
    return conn_writev(c, parts, 2);
}

static int write_head(http_conn *c, int status, const char *ctype, const char *extra,
                      const char *framing, const char *body, size_t blen)
{
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s%sConnection: %s\r\n\r\n", status,
                     http_status_text(status), ctype ? ctype : "text/plain", framing,
                     extra ? extra : "", c->keep_alive ? "keep-alive" : "close");
    if (n < 0 || (size_t)n >= sizeof head)
        return dx_errf(DX_ETOOBIG, "http: response head over %zu bytes", sizeof head);
    /* HEAD: the head GET would get, without its body */
    return conn_write(c, head, (size_t)n, body, c->is_head ? 0 : blen);
}

static void on_resume(uv_timer_t *t)
{
    conn_process(t->data);
}

static void on_timer(uv_timer_t *t);

/* Buffers one request grew past WBUF_KEEP go with its answer: an idle
 * connection holds little. */
static void conn_shrink(http_conn *c)
{
    if (c->holds) return; /* the body is still being read */
    if (c->body.cap > WBUF_KEEP) dx_buf_free(&c->body);
    if (c->head.cap > WBUF_KEEP) dx_buf_free(&c->head);
    if (c->in.len == 0 && c->in.cap > WBUF_KEEP) dx_buf_free(&c->in);
    conn_charge(c);
}

/* The answer is complete: next request, or close once written. */
static void conn_finish(http_conn *c)
{
    if (c->state == ST_CLOSING) return;
    c->abort_fn = NULL;
    c->abort_user = NULL;
    /* answered while its body is still read off the loop (a shutdown): no
     * next request may reuse the buffers, so the connection ends here */
    if (c->holds) c->keep_alive = 0;
    conn_shrink(c);
    c->served = 1;
    c->idle_since = uv_now(c->srv->loop);
    if (!c->keep_alive) {
        c->state = ST_BUSY; /* read nothing more */
        c->close_after_write = 1;
        if (conn_queued(c) == 0) {
            conn_close(c);
            return;
        }
        /* a client that never reads its last answer does not keep it open */
        uv_timer_start(&c->timer, on_timer, c->srv->lim->idle_timeout_ms, 0);
        return;
    }
    c->state = ST_READING;
    /* Pipelined input is parsed from the loop, not from inside the
     * application's call that finished this answer. */
    uv_timer_start(&c->timer, on_resume, 0, 0);
}

int http_conn_respond(http_conn *c, int status, const char *content_type, const char *extra_headers,
                      const char *body, size_t len)
{
    DX_ASSERT(c->state == ST_BUSY);
    char framing[64];
    snprintf(framing, sizeof framing, "Content-Length: %zu\r\n", len);
    int rc = write_head(c, status, content_type, extra_headers, framing, body, len);
    if (rc < 0) return rc;
    conn_finish(c);
    return 0;
}

int http_conn_stream_begin(http_conn *c, int status, const char *content_type,
                           const char *extra_headers)
{
    DX_ASSERT(c->state == ST_BUSY);
    /* HTTP/1.0 has no chunked encoding: the end of the stream is the close. */
    c->chunked = c->parser.http_major > 1 || c->parser.http_minor >= 1;
    if (!c->chunked) c->keep_alive = 0;
    int rc = write_head(c, status, content_type, extra_headers,
                        c->chunked ? "Transfer-Encoding: chunked\r\n" : "", NULL, 0);
    if (rc < 0) return rc;
    c->state = ST_STREAM;
    return 0;
}

int http_conn_stream_write(http_conn *c, const char *data, size_t len)
{
    DX_ASSERT(c->state == ST_STREAM || c->state == ST_CLOSING);
    if (len == 0 || c->is_head) return 0; /* an empty chunk would end the stream */
    if (!c->chunked) return conn_write(c, data, len, NULL, 0);
    char size[24];
    int n = snprintf(size, sizeof size, "%zx\r\n", len);
    uv_buf_t parts[3] = {uv_buf_init(size, (unsigned)n), uv_buf_init((char *)data, (unsigned)len),
                         uv_buf_init("\r\n", 2)};
    return conn_writev(c, parts, 3);
}

int http_conn_stream_end(http_conn *c)
{
    DX_ASSERT(c->state == ST_STREAM || c->state == ST_CLOSING);
    if (c->chunked && !c->is_head) {
        int rc = conn_write(c, "0\r\n\r\n", 5, NULL, 0);
        if (rc < 0) return rc;
    }
    conn_finish(c);
    return 0;
}

void http_conn_abort(http_conn *c)
{
    c->abort_fn = NULL; /* the caller is the application: it knows */
    conn_close(c);
}

void http_conn_set_abort(http_conn *c, http_abort_fn fn, void *req_user)
{
    c->abort_fn = fn;
    c->abort_user = req_user;
}

void http_conn_hold(http_conn *c)
{
    c->holds++;
}

static void conn_free(http_conn *c);

void http_conn_release(http_conn *c)
{
    DX_ASSERT(c->holds > 0);
    if (--c->holds == 0 && c->handles_closed) conn_free(c);
}

/* An answer the connection gives itself (limits, bad HTTP), then close. */
static void conn_reject(http_conn *c, int status, const char *msg)
{
    char body[512];
    int n =
        snprintf(body, sizeof body,
                 "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":null}}",
                 msg, status >= 500 ? "server_error" : "invalid_request_error");
    c->keep_alive = 0;
    c->state = ST_BUSY;
    c->abort_fn = NULL;
    uv_timer_stop(&c->timer);
    uv_read_stop((uv_stream_t *)&c->tcp);
    http_conn_respond(c, status, "application/json", status == 503 ? HTTP_RETRY_AFTER : NULL, body,
                      (size_t)n);
}

/* ---- peers ----------------------------------------------------------- */

/* An address as 16 bytes: dx_addr_norm's form (IPv4 mapped), so a v4
 * client of a dual-stack listener counts once whichever way it came.  0, or
 * dx_addr_norm's DX_EINVAL. */
static int peer_addr(const struct sockaddr_storage *ss, uint8_t out[16])
{
    dx_ipport a;
    int rc = dx_addr_norm((const struct sockaddr *)ss, &a);
    if (rc < 0) return rc;
    memcpy(out, a.ip, 16);
    return 0;
}

/* An IP literal ("10.0.0.1", "::1", "[::1]") as 16 bytes; DX_EINVAL for
 * another string. */
static int parse_ip(const char *s, uint8_t out[16])
{
    char buf[64];
    size_t n = strlen(s);
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        s++;
        n -= 2;
    }
    if (n >= sizeof buf) return dx_errf(DX_EINVAL, "'%.64s...': too long for an IP address", s);
    memcpy(buf, s, n);
    buf[n] = 0;
    struct sockaddr_storage ss = {0};
    if (inet_pton(AF_INET, buf, &((struct sockaddr_in *)&ss)->sin_addr) == 1)
        ss.ss_family = AF_INET;
    else if (inet_pton(AF_INET6, buf, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1)
        ss.ss_family = AF_INET6;
    else
        return dx_errf(DX_EINVAL, "'%s' is not an IP address", buf);
    return peer_addr(&ss, out);
}

/* The entry for addr, created with no connections; NULL without memory. */
static http_peer *peer_get(http_srv *s, const uint8_t addr[16])
{
    uint64_t h = XXH3_64bits_withSeed(addr, 16, s->peer_seed), v;
    dx_hidx_iter it;
    for (dx_hidx_find(s->peers, h, &it); dx_hidx_next(s->peers, &it, &v);) {
        http_peer *p = (http_peer *)(uintptr_t)v;
        if (!memcmp(p->addr, addr, 16)) return p;
    }
    http_peer *p = dx_calloc(1, sizeof *p);
    if (!p) return NULL;
    memcpy(p->addr, addr, 16);
    p->hash = h;
    if (dx_hidx_insert(s->peers, h, (uint64_t)(uintptr_t)p) < 0) {
        dx_free(p);
        return NULL;
    }
    return p;
}

static void peer_put(http_srv *s, http_peer *p)
{
    if (!p || --p->n > 0) return;
    dx_hidx_remove(s->peers, p->hash, (uint64_t)(uintptr_t)p);
    dx_free(p);
}

static int is_trusted(const http_srv *s, const uint8_t addr[16])
{
    for (size_t i = 0; i < s->n_trusted; i++)
        if (!memcmp(s->trusted[i], addr, 16)) return 1;
    return 0;
}

/* ---- closing --------------------------------------------------------- */

static void srv_maybe_free(http_srv *s)
{
    if (s->destroying && s->n_open == 0) {
        dx_hidx_destroy(s->peers);
        dx_free(s->trusted);
        dx_free(s);
    }
}

static void conn_free(http_conn *c)
{
    http_srv *s = c->srv;
    dx_buf_free(&c->in);
    dx_buf_free(&c->head);
    dx_buf_free(&c->body);
    dx_buf_free(&c->wfly);
    dx_buf_free(&c->wnext);
    s->buffered -= c->charged;
    dx_free(c->hdr_off);
    dx_free(c->hdrs);
    dx_free(c);
    s->n_open--;
    srv_maybe_free(s);
}

static void on_conn_handle_closed(uv_handle_t *h)
{
    http_conn *c = h->data;
    if (--c->n_open_handles > 0) return;
    c->handles_closed = 1;
    if (c->holds == 0) conn_free(c);
}

static void conn_close(http_conn *c)
{
    if (c->state == ST_CLOSING) return;
    c->state = ST_CLOSING;
    http_srv *s = c->srv;
    dx_list_remove(&c->link);
    s->n_conns--;
    if (c->health_only) s->n_health_only--;
    peer_put(s, c->peer);
    c->peer = NULL;
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
    /* The application learns last, so it sees a consistent (closing) conn. */
    http_abort_fn fn = c->abort_fn;
    c->abort_fn = NULL;
    if (fn) fn(c->abort_user);
}

/* ---- parsing --------------------------------------------------------- */

/* What an http-parser callback returns to stop the parse: http-parser
 * stops on any non-zero value and reports HPE_CB_<callback>.  The callback
 * has set c->reject_status, which is what the client is answered. */
#define HTTP_PARSE_STOP (-1)

static http_conn *pconn(http_parser *p)
{
    return p->data;
}

/* Like the callbacks: 0, or HTTP_PARSE_STOP with c->reject_status set. */
static int head_add(http_conn *c, const char *at, size_t len)
{
    c->head_bytes += len;
    if (c->head_bytes > c->srv->lim->max_header_bytes) {
        c->reject_status = 431;
        return HTTP_PARSE_STOP;
    }
    int rc = dx_buf_append(&c->head, at, len);
    if (rc < 0) c->reject_status = rc == DX_ENOMEM ? 503 : 431;
    return rc < 0 ? HTTP_PARSE_STOP : 0;
}

/* Ends the URL, a name or a value in the head buffer; like head_add. */
static int head_end(http_conn *c)
{
    int rc = dx_buf_putc(&c->head, 0);
    if (rc < 0) c->reject_status = rc == DX_ENOMEM ? 503 : 431;
    return rc < 0 ? HTTP_PARSE_STOP : 0;
}

static int on_message_begin(http_parser *p)
{
    http_conn *c = pconn(p);
    c->in_message = 1;
    c->head_bytes = 0;
    c->n_hdr = 0;
    c->header_is_value = 0;
    c->url_end = 0;
    c->head_done = 0;
    c->body_expect = 0;
    c->chunked_total = 0;
    dx_buf_reset(&c->head);
    dx_buf_reset(&c->body);
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    return head_add(pconn(p), at, len);
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    http_conn *c = pconn(p);
    if (c->n_hdr == 0 && c->url_end == 0) {
        if (head_end(c)) return HTTP_PARSE_STOP;
        c->url_end = c->head.len;
    }
    if (c->header_is_value || c->n_hdr == 0) {
        /* a new header: terminate the previous value, record the name */
        if (c->n_hdr >= c->srv->lim->max_headers) {
            c->reject_status = 431;
            return HTTP_PARSE_STOP;
        }
        if (c->n_hdr > 0 && head_end(c)) return HTTP_PARSE_STOP;
        c->hdr_off[2 * c->n_hdr] = c->head.len;
        c->hdr_off[2 * c->n_hdr + 1] = SIZE_MAX;
        c->n_hdr++;
        c->header_is_value = 0;
    }
    return head_add(c, at, len);
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    http_conn *c = pconn(p);
    if (!c->header_is_value) {
        if (head_end(c)) return HTTP_PARSE_STOP;
        c->hdr_off[2 * (c->n_hdr - 1) + 1] = c->head.len;
        c->header_is_value = 1;
    }
    return head_add(c, at, len);
}

static const char *conn_header(http_conn *c, const char *name)
{
    for (uint32_t i = 0; i < c->n_hdr; i++) {
        size_t v = c->hdr_off[2 * i + 1];
        if (v != SIZE_MAX && strcasecmp(c->head.data + c->hdr_off[2 * i], name) == 0)
            return c->head.data + v;
    }
    return NULL;
}

static int on_headers_complete(http_parser *p)
{
    http_conn *c = pconn(p);
    const http_limits *l = c->srv->lim;
    if (p->http_major != 1 || p->http_minor > 1) { /* HTTP/1.0 and 1.1 only */
        c->reject_status = 505;
        return HTTP_PARSE_STOP;
    }
    if (c->url_end == 0) {
        if (head_end(c)) return HTTP_PARSE_STOP;
        c->url_end = c->head.len;
    } else if (head_end(c)) {
        return HTTP_PARSE_STOP;
    }
    /* A header with no value callback at all ("X:") gets the empty value. */
    for (uint32_t i = 0; i < c->n_hdr; i++)
        if (c->hdr_off[2 * i + 1] == SIZE_MAX) c->hdr_off[2 * i + 1] = c->head.len - 1;
    uint64_t cl = p->content_length;
    if ((p->flags & F_CONTENTLENGTH) && cl > l->max_body_bytes) {
        c->reject_status = 413;
        return HTTP_PARSE_STOP;
    }
    c->head_done = 1;
    c->body_expect = (p->flags & F_CONTENTLENGTH) ? cl
                     : (p->flags & F_CHUNKED)     ? l->max_body_bytes
                                                  : 0;
    const char *expect = conn_header(c, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0)
        conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, NULL, 0);
    return 0;
}

/* A chunked body is refused as soon as its declared chunk sizes pass the
 * limit, before their bytes arrive. */
static int on_chunk_header(http_parser *p)
{
    http_conn *c = pconn(p);
    uint64_t n = p->content_length, max = c->srv->lim->max_body_bytes;
    if (n > max || c->chunked_total + n > max) {
        c->reject_status = 413;
        return HTTP_PARSE_STOP;
    }
    c->chunked_total += n;
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    http_conn *c = pconn(p);
    if (c->body.len + len > c->srv->lim->max_body_bytes) {
        c->reject_status = 413;
        return HTTP_PARSE_STOP;
    }
    if (dx_buf_append(&c->body, at, len) < 0) {
        c->reject_status = 503; /* out of memory: not the client's fault */
        return HTTP_PARSE_STOP;
    }
    return 0;
}

static int on_message_complete(http_parser *p)
{
    http_conn *c = pconn(p);
    c->in_message = 0;
    c->keep_alive = http_should_keep_alive(p);
    http_parser_pause(p, 1); /* one request at a time; the rest stays in c->in */
    return 0;
}

static const http_parser_settings k_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_chunk_header = on_chunk_header,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static void conn_dispatch(http_conn *c)
{
    http_header *hdrs = c->hdrs;
    for (uint32_t i = 0; i < c->n_hdr; i++) {
        hdrs[i].name = c->head.data + c->hdr_off[2 * i];
        hdrs[i].value = c->head.data + c->hdr_off[2 * i + 1];
    }
    char *url = c->head.data;
    char *q = strchr(url, '?');
    if (q) *q++ = 0;
    char *frag = strchr(q ? q : url, '#');
    if (frag) *frag = 0;
    c->req_start = 0;
    c->is_head = c->parser.method == HTTP_HEAD;
    if (dx_buf_reserve(&c->body, 1) < 0) { /* the body is within its limit: memory */
        conn_reject(c, 503, "out of memory; try again");
        return;
    }
    c->body.data[c->body.len] = 0;
    if (c->health_only) { /* past its share of connections: /health, then close */
        c->keep_alive = 0;
        int get = c->parser.method == HTTP_GET || c->is_head;
        if (!get || strcmp(url, "/health") != 0) {
            conn_reject(c, 503, "server busy: too many connections; try again later");
            return;
        }
    }
    http_req req = {
        .method = http_method_str(c->parser.method),
        .path = url,
        .query = q ? q : "",
        .headers = hdrs,
        .n_headers = c->n_hdr,
        .body = c->body.data,
        .body_len = c->body.len,
        .peer = c->has_peer ? (const struct sockaddr *)&c->peer_ss : NULL,
    };
    c->state = ST_BUSY;
    c->srv->cfg.on_request(c->srv->cfg.user, c, &req);
}

static int conn_partial(const http_conn *c)
{
    return c->in_message || c->in.len > 0;
}

static void on_timer(uv_timer_t *t)
{
    http_conn *c = t->data;
    if (c->state == ST_BUSY && c->close_after_write) { /* its last answer was never read */
        conn_close(c);
        return;
    }
    if (c->state != ST_READING) return;
    if (conn_partial(c)) {
        c->srv->st.timeouts++;
        conn_reject(c, 408, "request not completed in time");
    } else {
        conn_close(c); /* idle keep-alive */
    }
}

/* Milliseconds a body of n bytes is given on top of the headers' time. */
static uint64_t body_ms(const http_limits *l, uint64_t n)
{
    return (n * l->body_ms_per_mib + (1u << 20) - 1) >> 20;
}

/* Deadlines are absolute: from the request's first byte for a request in
 * progress, from the last answer (or the accept) for an idle connection.
 * Bytes that arrive — a byte of a request, a stray newline between
 * requests — never move them. */
static void conn_arm_timer(http_conn *c)
{
    const http_limits *l = c->srv->lim;
    uint64_t now = uv_now(c->srv->loop), deadline;
    if (!conn_partial(c)) {
        c->req_start = 0;
        deadline = c->idle_since + l->idle_timeout_ms;
    } else {
        if (!c->req_start) c->req_start = now;
        deadline = c->req_start + l->request_timeout_ms;
        if (c->head_done) deadline += body_ms(l, c->body_expect);
    }
    uv_timer_start(&c->timer, on_timer, deadline > now ? deadline - now : 0, 0);
}

static int reject_status_for(http_conn *c, enum http_errno err, const char **msg)
{
    if (c->reject_status == 413)
        *msg = "request body too large";
    else if (c->reject_status == 503)
        *msg = "out of memory; try again";
    else if (c->reject_status == 505)
        *msg = "HTTP version not supported (HTTP/1.0 and HTTP/1.1 are)";
    else if (c->reject_status == 431 || err == HPE_HEADER_OVERFLOW)
        *msg = "request line or headers too large";
    else
        *msg = "malformed HTTP request";
    if (err == HPE_HEADER_OVERFLOW) return 431;
    return c->reject_status ? c->reject_status : 400;
}

/* Parses buffered input while the connection is READING.  Never re-entered:
 * an application answering synchronously lands back here through the loop. */
static void conn_process(http_conn *c)
{
    if (c->in_process) return;
    c->in_process = 1;
    while (c->state == ST_READING && c->in.len > 0) {
        size_t n = http_parser_execute(&c->parser, &k_settings, c->in.data, c->in.len);
        enum http_errno err = HTTP_PARSER_ERRNO(&c->parser);
        if (err == HPE_PAUSED) {
            http_parser_pause(&c->parser, 0);
            dx_buf_consume(&c->in, n);
            conn_dispatch(c);
            continue;
        }
        if (err != HPE_OK) {
            const char *msg;
            int st = reject_status_for(c, err, &msg);
            DX_LOGD("http: rejecting request (%d): %s", st, http_errno_description(err));
            conn_reject(c, st, msg);
            break;
        }
        dx_buf_consume(&c->in, n);
    }
    if (c->state == ST_READING) conn_arm_timer(c);
    c->in_process = 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    http_conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

/* The server holds more than its budget and c's bytes crossed it: a request
 * being read gets 503, anything else is closed. */
static void conn_over_budget(http_conn *c)
{
    c->srv->st.refused_budget++;
    DX_LOGD("http: %zu bytes buffered, over the budget of %zu: refusing", c->srv->buffered,
            c->srv->lim->max_buffered_bytes);
    if (c->state == ST_READING)
        conn_reject(c, 503, HTTP_BUSY_BUFFERS);
    else
        conn_close(c);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    http_conn *c = st->data;
    if (nread == 0 || c->state == ST_CLOSING) return;
    if (nread < 0) { /* EOF or error: whatever was in progress is abandoned */
        conn_close(c);
        return;
    }
    int rc = dx_buf_append(&c->in, buf->base, (size_t)nread);
    if (rc < 0) {
        /* Only a client pipelining far ahead of its answers, or no memory. */
        if (c->state == ST_READING && rc == DX_ENOMEM)
            conn_reject(c, 503, "out of memory; try again");
        else if (c->state == ST_READING)
            conn_reject(c, 413, "request too large");
        else
            conn_close(c);
        return;
    }
    conn_charge(c);
    if (over_budget(c->srv)) {
        conn_over_budget(c);
        return;
    }
    if (c->state != ST_READING) return;
    conn_process(c);
    conn_charge(c); /* the body grew as the input was parsed */
    if (c->state == ST_READING && conn_partial(c) && over_budget(c->srv)) conn_over_budget(c);
}

/* ---- accepting ------------------------------------------------------- */

static int conn_init(http_srv *s, http_conn *c)
{
    const http_limits *l = s->lim;
    c->srv = s;
    dx_buf_init(&c->in, l->max_header_bytes + l->max_body_bytes + 65536);
    dx_buf_init(&c->head, l->max_header_bytes + 2 * l->max_headers + 8);
    dx_buf_init(&c->body, l->max_body_bytes + 1);
    dx_buf_init(&c->wfly, 0); /* bounded by max_write_queue_bytes */
    dx_buf_init(&c->wnext, 0);
    c->wreq.data = c;
    c->hdr_off = dx_calloc(2 * (size_t)l->max_headers, sizeof *c->hdr_off);
    c->hdrs = dx_calloc(l->max_headers, sizeof *c->hdrs);
    if (!c->hdr_off || !c->hdrs)
        return dx_errf(DX_ENOMEM, "http: header tables (%u headers)", l->max_headers);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    c->tcp.data = c;
    c->timer.data = c;
    return 0;
}

static void reject_one(http_srv *s);

static void on_reject_closed(uv_handle_t *h)
{
    http_srv *s = h->data;
    s->reject_busy = 0;
    s->n_open--;
    if (s->reject_pending && s->listening) {
        s->reject_pending = 0;
        reject_one(s);
    }
    srv_maybe_free(s);
}

/* Accepts the pending connection into the spare handle and closes it: the
 * client sees the connection closed, and the listener goes on accepting. */
static void reject_one(http_srv *s)
{
    if (s->reject_busy) {
        s->reject_pending = 1; /* taken when the spare handle's close is done */
        return;
    }
    uv_tcp_init(s->loop, &s->reject);
    s->reject.data = s;
    s->reject_busy = 1;
    s->n_open++;
    uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)&s->reject);
    uv_close((uv_handle_t *)&s->reject, on_reject_closed);
}

/* A new connection that has not sent its first request yet is left alone
 * this long: its client is about to, and would not retry a connection that
 * never served it.  One idle between requests may go at once. */
#define EVICT_FRESH_MS 1000

/* Closes the connection idle the longest (nothing being read, nothing left
 * to write, and between requests or quiet since it was accepted for a
 * while); 0 if there is none. */
static int evict_idle(http_srv *s)
{
    http_conn *v = NULL; /* the list is newest first: on a tie the later one is older */
    uint64_t now = uv_now(s->loop);
    DX_LIST_FOR_EACH(it, &s->conns)
    {
        http_conn *c = DX_LIST_ENTRY(it, http_conn, link);
        if (c->state == ST_READING && !conn_partial(c) && !conn_queued(c) &&
            (c->served || now - c->idle_since >= EVICT_FRESH_MS) &&
            (!v || c->idle_since <= v->idle_since))
            v = c;
    }
    if (!v) return 0;
    s->st.evicted_idle++;
    DX_LOGD("http: closing an idle connection to make room");
    conn_close(v);
    return 1;
}

enum { ADMIT_NO, ADMIT_FULL, ADMIT_HEALTH };

/* What a new connection from peer p may do.  The last `reserve` slots are
 * for trusted peers and (half of them) for GET /health; an idle
 * connection makes way for a new one. */
static int admit(http_srv *s, const http_peer *p, int trusted)
{
    const http_limits *l = s->lim;
    uint32_t reserve = http_srv_reserve(l), shared = l->max_conns - reserve;
    if (trusted) return s->n_conns < l->max_conns || evict_idle(s) ? ADMIT_FULL : ADMIT_NO;
    int peer_ok = p->n < l->max_conns_per_peer;
    if (peer_ok && s->n_conns >= shared) evict_idle(s);
    if (peer_ok && s->n_conns < shared) return ADMIT_FULL;
    if (s->n_health_only < reserve / 2 && s->n_conns < l->max_conns) return ADMIT_HEALTH;
    return ADMIT_NO;
}

static void conn_refuse(http_conn *c)
{
    static const char body[] = "{\"error\":{\"message\":\"server busy: too many connections; "
                               "try again later\",\"type\":\"server_error\",\"param\":null,"
                               "\"code\":null}}";
    char rsp[512];
    int n = snprintf(
        rsp, sizeof rsp,
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n" HTTP_RETRY_AFTER
        "Connection: close\r\nContent-Length: %zu\r\n\r\n%s",
        sizeof body - 1, body);
    c->srv->st.refused_conns++;
    uv_buf_t b = uv_buf_init(rsp, (unsigned)n);
    uv_try_write((uv_stream_t *)&c->tcp, &b, 1); /* best effort: the socket is new and empty */
    conn_close(c);
}

/* The peer's address, its entry and whether it is trusted: 0, or (the
 * peer unknown) DX_EIO without its address, DX_ENOMEM without an entry. */
static int conn_peer(http_srv *s, http_conn *c, int *trusted)
{
    struct sockaddr_storage ss;
    int len = sizeof ss, rc;
    uint8_t addr[16];
    if ((rc = uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len)) < 0)
        return dx_errf(DX_EIO, "http: the peer's address: %s", uv_strerror(rc));
    if ((rc = peer_addr(&ss, addr)) < 0) return rc;
    *trusted = is_trusted(s, addr);
    c->peer = peer_get(s, addr);
    return c->peer ? 0 : dx_errf(DX_ENOMEM, "http: out of memory for a peer's entry");
}

static void on_connection(uv_stream_t *server, int status)
{
    http_srv *s = server->data;
    if (status < 0) {
        DX_LOGW("http: accept: %s", uv_strerror(status));
        return;
    }
    http_conn *c = dx_calloc(1, sizeof *c);
    if (!c || conn_init(s, c) < 0 || uv_tcp_init(s->loop, &c->tcp) < 0) {
        if (c) {
            dx_free(c->hdr_off);
            dx_free(c->hdrs);
        }
        dx_free(c);
        DX_LOGW("http: out of memory accepting a connection; closing it");
        reject_one(s);
        return;
    }
    uv_timer_init(s->loop, &c->timer);
    c->n_open_handles = 2;
    s->n_open++;
    int accepted = uv_accept(server, (uv_stream_t *)&c->tcp) == 0, trusted = 0;
    int how = accepted && conn_peer(s, c, &trusted) == 0 ? admit(s, c->peer, trusted) : ADMIT_NO;
    dx_list_push_front(&s->conns, &c->link);
    s->n_conns++;
    if (c->peer) c->peer->n++;
    c->trusted = trusted;
    c->health_only = how == ADMIT_HEALTH;
    s->n_health_only += (size_t)c->health_only;
    c->state = ST_READING;
    c->idle_since = uv_now(s->loop);
    if (how == ADMIT_NO) {
        if (accepted)
            conn_refuse(c);
        else
            conn_close(c);
        return;
    }
    int plen = sizeof c->peer_ss;
    c->has_peer = uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->peer_ss, &plen) == 0;
    uv_tcp_nodelay(&c->tcp, 1); /* tokens go out as they come */
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    conn_arm_timer(c);
}

void http_limits_defaults(http_limits *l)
{
    if (!l->max_header_bytes) l->max_header_bytes = (size_t)HTTP_DEFAULT_MAX_HEADER_KB << 10;
    if (!l->max_body_bytes) l->max_body_bytes = (size_t)HTTP_DEFAULT_MAX_BODY_MB << 20;
    if (!l->max_write_queue_bytes)
        l->max_write_queue_bytes = (size_t)HTTP_DEFAULT_MAX_WRITE_QUEUE_MB << 20;
    if (!l->max_buffered_bytes) {
        size_t eight = 8 * l->max_body_bytes, dflt = (size_t)HTTP_DEFAULT_MAX_BUFFER_MB << 20;
        l->max_buffered_bytes = eight > dflt ? eight : dflt;
    }
    if (!l->max_headers) l->max_headers = HTTP_DEFAULT_MAX_HEADERS;
    if (!l->max_conns) l->max_conns = HTTP_DEFAULT_MAX_CONNS;
    if (!l->max_conns_per_peer) l->max_conns_per_peer = l->max_conns / 4 ? l->max_conns / 4 : 1;
    if (!l->request_timeout_ms) l->request_timeout_ms = HTTP_DEFAULT_REQUEST_TIMEOUT_MS;
    if (!l->body_ms_per_mib) l->body_ms_per_mib = HTTP_DEFAULT_BODY_MS_PER_MIB;
    if (!l->idle_timeout_ms) l->idle_timeout_ms = HTTP_DEFAULT_IDLE_TIMEOUT_MS;
}

uint32_t http_srv_reserve(const http_limits *l)
{
    uint32_t r = l->max_conns / 16;
    if (r < 2) r = 2;
    if (r > 256) r = 256;
    return r <= l->max_conns / 2 ? r : l->max_conns / 2;
}

static int srv_bind(http_srv *s)
{
    struct sockaddr_storage addr;
    socklen_t alen;
    int rc = dx_addr_resolve(s->cfg.host, s->cfg.port, &addr, &alen);
    if (rc < 0) return dx_err_wrap(rc, "http");
    rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
    if (rc < 0)
        return dx_errf(DX_EIO, "http: listen on %s:%d: %s", s->cfg.host, s->cfg.port,
                       uv_strerror(rc));
    struct sockaddr_storage bound;
    int len = sizeof bound;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &len);
    s->port = dx_addr_port(&bound);
    return 0;
}

static void on_listener_closed(uv_handle_t *h)
{
    http_srv *s = h->data;
    s->n_open--;
    srv_maybe_free(s);
}

/* The trusted peers as 16-byte addresses; DX_EINVAL naming a bad one. */
static int srv_trust(http_srv *s)
{
    const http_limits *l = s->lim;
    s->trusted = dx_calloc(l->n_trusted ? l->n_trusted : 1, sizeof *s->trusted);
    if (!s->trusted) return dx_errf(DX_ENOMEM, "out of memory");
    for (size_t i = 0; i < l->n_trusted; i++)
        if (parse_ip(l->trusted[i], s->trusted[i]) < 0)
            return dx_errf(DX_EINVAL, "trusted peer '%.64s' is not an IP address", l->trusted[i]);
    s->n_trusted = l->n_trusted;
    s->lim->trusted = NULL; /* parsed: the strings need not outlive the call */
    s->lim->n_trusted = 0;
    return 0;
}

int http_srv_create(uv_loop_t *loop, const http_srv_config *cfg, http_srv **out)
{
    *out = NULL;
    if (!cfg->on_request) return dx_errf(DX_EINVAL, "http: no request handler");
    http_srv *s = dx_calloc(1, sizeof *s);
    if (!s) return dx_errf(DX_ENOMEM, "http: server");
    s->loop = loop;
    dx_list_init(&s->conns);
    s->cfg = *cfg;
    s->lim = &s->cfg.lim;
    http_limits_defaults(s->lim);
    snprintf(s->host, sizeof s->host, "%s", s->cfg.host ? s->cfg.host : "127.0.0.1");
    s->cfg.host = s->host;
    if (getrandom(&s->peer_seed, sizeof s->peer_seed, GRND_NONBLOCK) != sizeof s->peer_seed)
        s->peer_seed = (uint64_t)(uintptr_t)s ^ uv_hrtime();
    int rc = dx_hidx_create(64, &s->peers);
    if (!rc) rc = srv_trust(s);
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->n_open = 1;
    s->listening = 1;
    if (!rc) rc = srv_bind(s);
    if (rc < 0) {
        s->destroying = 1;
        s->listening = 0;
        uv_close((uv_handle_t *)&s->listener, on_listener_closed);
        return rc; /* freed when the loop runs the close */
    }
    *out = s;
    return 0;
}

int http_srv_port(const http_srv *s)
{
    return s->port;
}

size_t http_srv_n_conns(const http_srv *s)
{
    return s->n_conns;
}

void http_srv_get_stats(const http_srv *s, http_srv_stats *out)
{
    *out = s->st;
    out->conns = s->n_conns;
    out->health_only = s->n_health_only;
    out->buffered = s->buffered;
}

int http_srv_write_metrics(const http_srv *s, const char *prefix, dx_buf *b)
{
    http_srv_stats st;
    http_srv_get_stats(s, &st);
    static const struct {
        const char *name, *help;
        int counter;
        size_t off;
    } k[] = {
        {"http_connections", "Open HTTP connections", 0, offsetof(http_srv_stats, conns)},
        {"http_connections_health_only", "Connections past their share, limited to GET /health", 0,
         offsetof(http_srv_stats, health_only)},
        {"http_buffered_bytes", "Bytes in all HTTP connections' buffers", 0,
         offsetof(http_srv_stats, buffered)},
        {"http_refused_connections_total",
         "Connections answered 503 at once: no connection left for them", 1,
         offsetof(http_srv_stats, refused_conns)},
        {"http_refused_buffer_total",
         "Requests refused (503) or connections closed past the buffer budget", 1,
         offsetof(http_srv_stats, refused_budget)},
        {"http_evicted_idle_total", "Idle keep-alive connections closed to make room", 1,
         offsetof(http_srv_stats, evicted_idle)},
        {"http_request_timeouts_total", "Requests not received by their deadline (408)", 1,
         offsetof(http_srv_stats, timeouts)},
    };
    int rc = 0;
    for (size_t i = 0; !rc && i < DX_ARRAY_LEN(k); i++) {
        char name[128];
        snprintf(name, sizeof name, "%s_%s", prefix, k[i].name);
        const char *f = (const char *)&st + k[i].off;
        double v = k[i].counter ? (double)*(const uint64_t *)f : (double)*(const size_t *)f;
        rc = k[i].counter ? prom_write_counter(b, name, k[i].help, v)
                          : prom_write_gauge(b, name, k[i].help, v);
    }
    return rc;
}

void http_srv_stop_accepting(http_srv *s)
{
    if (!s->listening) return;
    s->listening = 0;
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
}

void http_srv_close_idle(http_srv *s)
{
    /* _SAFE suffices: closing a connection between requests calls no
     * application code (its abort_fn was cleared when its answer finished),
     * so nothing else leaves the list meanwhile */
    DX_LIST_FOR_EACH_SAFE(it, tmp, &s->conns)
    {
        http_conn *c = DX_LIST_ENTRY(it, http_conn, link);
        if (c->state == ST_READING && !c->in_message) conn_close(c);
    }
}

void http_srv_destroy(http_srv *s)
{
    if (!s) return;
    http_srv_stop_accepting(s);
    while (!dx_list_empty(&s->conns))
        conn_close(DX_LIST_ENTRY(dx_list_first(&s->conns), http_conn, link));
    s->destroying = 1;
    srv_maybe_free(s);
}
