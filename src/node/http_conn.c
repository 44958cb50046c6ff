/* http_conn: HTTP/1.1 server connections on libuv + http-parser (see .h).
 *
 * A connection is a small state machine:
 *   READING  parsing a request (timer: idle, then request timeout)
 *   BUSY     a complete request is with the application; input is buffered
 *   STREAM   BUSY, and a chunked answer has begun
 *   CLOSING  uv_close issued; freed when both handles report closed
 * All unparsed input lives in c->in (bounded); parsing resumes from it after
 * each answer, which is how pipelined requests keep their order.
 *
 * Output allocates nothing per write once its buffers have grown: a write
 * goes straight to the socket (uv_try_write) when nothing is queued; what
 * the socket does not take is copied into c->wnext and handed to the one
 * uv_write in flight, from c->wfly; what the application writes meanwhile
 * is appended to c->wnext, which becomes the next write when it completes. */
#include "node/http_conn.h"

#include <http_parser.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/dx_addr.h"
#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_log.h"

enum conn_state { ST_READING, ST_BUSY, ST_STREAM, ST_CLOSING };

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    http_srv *srv;
    http_conn *prev, *next;
    http_parser parser;
    enum conn_state state;
    int n_open_handles;
    int keep_alive; /* this request's answer keeps the connection */
    int chunked;    /* the current stream uses chunked encoding */
    int in_process; /* inside conn_process: no re-entry */
    int close_after_write;
    int reject_status;   /* set by a parser callback to refuse the request */
    int in_message;      /* a request has begun (bytes seen) */
    int header_is_value; /* last header callback was a value */
    dx_buf in;           /* unparsed input */
    dx_buf head;         /* url, then header names/values, NUL-separated */
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
    char rbuf[16384];
};

struct http_srv {
    uv_loop_t *loop;
    uv_tcp_t listener;
    http_srv_config cfg;
    char host[64];
    int port;
    int listening;
    int destroying;
    int n_open; /* listener + connections not yet freed */
    size_t n_conns;
    http_conn *conns;
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

/* ---- output ---------------------------------------------------------- */

/* Bytes handed over and not yet written. */
static size_t conn_queued(const http_conn *c)
{
    return c->wfly.len + c->wnext.len;
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
 * reading. */
static int conn_writev(http_conn *c, const uv_buf_t *parts, int n_parts)
{
    if (c->state == ST_CLOSING) return dx_errf(DX_ECLOSED, "http: connection closed");
    size_t len = 0;
    for (int i = 0; i < n_parts; i++) len += parts[i].len;
    if (conn_queued(c) + len > c->srv->cfg.max_write_queue_bytes) {
        size_t queued = conn_queued(c);
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
    return conn_write(c, head, (size_t)n, body, blen);
}

static void on_resume(uv_timer_t *t)
{
    conn_process(t->data);
}

/* The answer is complete: next request, or close once written. */
static void conn_finish(http_conn *c)
{
    if (c->state == ST_CLOSING) return;
    c->abort_fn = NULL;
    c->abort_user = NULL;
    if (!c->keep_alive) {
        c->state = ST_BUSY; /* read nothing more */
        c->close_after_write = 1;
        if (conn_queued(c) == 0) conn_close(c);
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
    if (len == 0) return 0; /* an empty chunk would end the stream */
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
    if (c->chunked) {
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

/* An answer the connection gives itself (limits, bad HTTP), then close. */
static void conn_reject(http_conn *c, int status, const char *msg)
{
    char body[512];
    int n = snprintf(body, sizeof body,
                     "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\","
                     "\"param\":null,\"code\":null}}",
                     msg);
    c->keep_alive = 0;
    c->state = ST_BUSY;
    c->abort_fn = NULL;
    uv_timer_stop(&c->timer);
    uv_read_stop((uv_stream_t *)&c->tcp);
    http_conn_respond(c, status, "application/json", NULL, body, (size_t)n);
}

/* ---- closing --------------------------------------------------------- */

static void srv_maybe_free(http_srv *s)
{
    if (s->destroying && s->n_open == 0) dx_free(s);
}

static void on_conn_handle_closed(uv_handle_t *h)
{
    http_conn *c = h->data;
    if (--c->n_open_handles > 0) return;
    http_srv *s = c->srv;
    dx_buf_free(&c->in);
    dx_buf_free(&c->head);
    dx_buf_free(&c->body);
    dx_buf_free(&c->wfly);
    dx_buf_free(&c->wnext);
    dx_free(c->hdr_off);
    dx_free(c->hdrs);
    dx_free(c);
    s->n_open--;
    srv_maybe_free(s);
}

static void conn_close(http_conn *c)
{
    if (c->state == ST_CLOSING) return;
    c->state = ST_CLOSING;
    http_srv *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_conns--;
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
    /* The application learns last, so it sees a consistent (closing) conn. */
    http_abort_fn fn = c->abort_fn;
    c->abort_fn = NULL;
    if (fn) fn(c->abort_user);
}

/* ---- parsing --------------------------------------------------------- */

static http_conn *pconn(http_parser *p)
{
    return p->data;
}

static int head_add(http_conn *c, const char *at, size_t len)
{
    c->head_bytes += len;
    if (c->head_bytes > c->srv->cfg.max_header_bytes) {
        c->reject_status = 431;
        return -1;
    }
    if (dx_buf_append(&c->head, at, len) < 0) {
        c->reject_status = 431;
        return -1;
    }
    return 0;
}

static int on_message_begin(http_parser *p)
{
    http_conn *c = pconn(p);
    c->in_message = 1;
    c->head_bytes = 0;
    c->n_hdr = 0;
    c->header_is_value = 0;
    c->url_end = 0;
    dx_buf_reset(&c->head);
    dx_buf_reset(&c->body);
    uv_timer_stop(&c->timer);
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
        if (dx_buf_putc(&c->head, 0) < 0) return -1;
        c->url_end = c->head.len;
    }
    if (c->header_is_value || c->n_hdr == 0) {
        /* a new header: terminate the previous value, record the name */
        if (c->n_hdr >= c->srv->cfg.max_headers) {
            c->reject_status = 431;
            return -1;
        }
        if (c->n_hdr > 0 && dx_buf_putc(&c->head, 0) < 0) return -1;
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
        if (dx_buf_putc(&c->head, 0) < 0) return -1;
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
    if (c->url_end == 0) {
        if (dx_buf_putc(&c->head, 0) < 0) return -1;
        c->url_end = c->head.len;
    } else if (dx_buf_putc(&c->head, 0) < 0) {
        return -1;
    }
    /* A header with no value callback at all ("X:") gets the empty value. */
    for (uint32_t i = 0; i < c->n_hdr; i++)
        if (c->hdr_off[2 * i + 1] == SIZE_MAX) c->hdr_off[2 * i + 1] = c->head.len - 1;
    uint64_t cl = p->content_length;
    if ((p->flags & F_CONTENTLENGTH) && cl > c->srv->cfg.max_body_bytes) {
        c->reject_status = 413;
        return -1;
    }
    const char *expect = conn_header(c, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0)
        conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, NULL, 0);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    http_conn *c = pconn(p);
    if (c->body.len + len > c->srv->cfg.max_body_bytes || dx_buf_append(&c->body, at, len) < 0) {
        c->reject_status = 413;
        return -1;
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
    if (dx_buf_reserve(&c->body, 1) < 0) {
        conn_reject(c, 413, "request body too large");
        return;
    }
    c->body.data[c->body.len] = 0;
    http_req req = {
        .method = http_method_str(c->parser.method),
        .path = url,
        .query = q ? q : "",
        .headers = hdrs,
        .n_headers = c->n_hdr,
        .body = c->body.data,
        .body_len = c->body.len,
    };
    c->state = ST_BUSY;
    c->srv->cfg.on_request(c->srv->cfg.user, c, &req);
}

static void on_timer(uv_timer_t *t)
{
    http_conn *c = t->data;
    if (c->state != ST_READING) return;
    if (c->in_message || c->in.len > 0)
        conn_reject(c, 408, "request not completed in time");
    else
        conn_close(c); /* idle keep-alive */
}

static void conn_arm_timer(http_conn *c)
{
    const http_srv_config *cfg = &c->srv->cfg;
    int partial = c->in_message || c->in.len > 0;
    uv_timer_start(&c->timer, on_timer, partial ? cfg->request_timeout_ms : cfg->idle_timeout_ms,
                   0);
}

static int reject_status_for(http_conn *c, enum http_errno err, const char **msg)
{
    if (c->reject_status == 413)
        *msg = "request body too large";
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

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    http_conn *c = st->data;
    if (nread == 0 || c->state == ST_CLOSING) return;
    if (nread < 0) { /* EOF or error: whatever was in progress is abandoned */
        conn_close(c);
        return;
    }
    if (dx_buf_append(&c->in, buf->base, (size_t)nread) < 0) {
        /* Only a client pipelining far ahead of its answers gets here. */
        if (c->state == ST_READING)
            conn_reject(c, 413, "request too large");
        else
            conn_close(c);
        return;
    }
    if (c->state == ST_READING) conn_process(c);
}

/* ---- accepting ------------------------------------------------------- */

static int conn_init(http_srv *s, http_conn *c)
{
    c->srv = s;
    dx_buf_init(&c->in, s->cfg.max_header_bytes + s->cfg.max_body_bytes + 65536);
    dx_buf_init(&c->head, s->cfg.max_header_bytes + 2 * s->cfg.max_headers + 8);
    dx_buf_init(&c->body, s->cfg.max_body_bytes + 1);
    dx_buf_init(&c->wfly, 0); /* bounded by max_write_queue_bytes */
    dx_buf_init(&c->wnext, 0);
    c->wreq.data = c;
    c->hdr_off = dx_calloc(2 * (size_t)s->cfg.max_headers, sizeof *c->hdr_off);
    c->hdrs = dx_calloc(s->cfg.max_headers, sizeof *c->hdrs);
    if (!c->hdr_off || !c->hdrs) return DX_ENOMEM;
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    c->tcp.data = c;
    c->timer.data = c;
    return 0;
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
        DX_LOGW("http: out of memory accepting a connection");
        return; /* the pending connection stays in the backlog */
    }
    uv_timer_init(s->loop, &c->timer);
    c->n_open_handles = 2;
    s->n_open++;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    c->state = ST_READING;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0 || s->n_conns > s->cfg.max_conns) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1); /* tokens go out as they come */
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    conn_arm_timer(c);
}

static void fill_defaults(http_srv_config *c)
{
    if (!c->host) c->host = "127.0.0.1";
    if (!c->max_header_bytes) c->max_header_bytes = 16 << 10;
    if (!c->max_body_bytes) c->max_body_bytes = 4 << 20;
    if (!c->max_write_queue_bytes) c->max_write_queue_bytes = 16 << 20;
    if (!c->max_headers) c->max_headers = 64;
    if (!c->max_conns) c->max_conns = 4096;
    if (!c->request_timeout_ms) c->request_timeout_ms = 30000;
    if (!c->idle_timeout_ms) c->idle_timeout_ms = 120000;
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

int http_srv_create(uv_loop_t *loop, const http_srv_config *cfg, http_srv **out)
{
    *out = NULL;
    if (!cfg->on_request) return dx_errf(DX_EINVAL, "http: no request handler");
    http_srv *s = dx_calloc(1, sizeof *s);
    if (!s) return DX_ENOMEM;
    s->loop = loop;
    s->cfg = *cfg;
    fill_defaults(&s->cfg);
    snprintf(s->host, sizeof s->host, "%s", s->cfg.host);
    s->cfg.host = s->host;
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->n_open = 1;
    s->listening = 1;
    int rc = srv_bind(s);
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

void http_srv_stop_accepting(http_srv *s)
{
    if (!s->listening) return;
    s->listening = 0;
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
}

void http_srv_close_idle(http_srv *s)
{
    http_conn *c = s->conns, *next;
    for (; c; c = next) {
        next = c->next;
        if (c->state == ST_READING && !c->in_message) conn_close(c);
    }
}

void http_srv_destroy(http_srv *s)
{
    if (!s) return;
    http_srv_stop_accepting(s);
    while (s->conns) conn_close(s->conns);
    s->destroying = 1;
    srv_maybe_free(s);
}
