/* http_conn: an HTTP/1.1 server on a libuv loop (parsing by http-parser).
 *
 * Everything here runs on the loop's thread.  A connection reads one request
 * at a time: when a request is complete the parser is paused and the request
 * handed to the application, which answers now or later (streaming answers
 * come from engine events).  Bytes a client pipelines meanwhile are buffered
 * (bounded) and parsed after the answer, so answers keep their order.
 *
 * Limits (http_limits; docs/api.md "Limits"), each with its status, and the
 * connection closed after the answer:
 *  - request line + headers over max_header_bytes or max_headers → 431; a
 *    body over max_body_bytes → 413, decided from Content-Length or from
 *    the chunk sizes as they are declared, before the body arrives; bad HTTP
 *    → 400; a version other than HTTP/1.0 and 1.1 → 505;
 *  - deadlines, absolute from the request's first byte (a client sending a
 *    byte now and then does not extend them): the headers within
 *    request_timeout_ms, the whole request within that plus body_ms_per_mib
 *    per MiB of its declared body (the body limit when chunked) → 408;
 *  - all connections' buffers together (input, bodies, answers queued) over
 *    max_buffered_bytes → 503 with Retry-After to the connection whose bytes
 *    crossed it (one that is answered already is closed);
 *  - connections: at most max_conns, of which max_conns_per_peer from one
 *    address; the last `reserve` (http_srv_reserve) are kept for the peers
 *    named in `trusted` (a router) and for GET /health.  A connection past
 *    its share may ask GET /health only, once (anything else is 503 with
 *    Retry-After); when none is left an idle keep-alive connection is
 *    closed to make room, else the newcomer gets 503 and is closed.
 * An idle keep-alive connection is closed after idle_timeout_ms; a client
 * that stops reading while more than max_write_queue_bytes are queued is
 * disconnected.  HEAD is answered like GET without the body.
 *
 * Lifetime: an application that answers asynchronously registers an abort
 * callback with http_conn_set_abort; if the connection dies before the answer
 * is finished the callback runs once and the http_conn pointer becomes
 * invalid (unless held, see http_conn_hold).  Once the answer is finished
 * (http_conn_respond or http_conn_stream_end) the application must drop the
 * pointer. */
#ifndef HTTP_CONN_H
#define HTTP_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "base/dx_buf.h"

typedef struct http_srv http_srv;
typedef struct http_conn http_conn;

typedef struct {
    const char *name, *value; /* NUL-terminated; name as sent */
} http_header;

typedef struct {
    const char *method; /* "GET", "POST", ... */
    const char *path;   /* URL path without the query */
    const char *query;  /* after '?', "" if none */
    const http_header *headers;
    size_t n_headers;
    /* NUL-terminated for convenience; body_len excludes it.  Valid until the
     * answer is finished or the connection closes (or, held, until the
     * release). */
    const char *body;
    size_t body_len;
    const struct sockaddr *peer; /* the client's address (AF_INET/AF_INET6), or NULL */
} http_req;

/* The first value of header `name` (any case), or NULL; *count (when not
 * NULL) says how often the header came. */
const char *http_req_header(const http_req *r, const char *name, int *count);

typedef void (*http_req_fn)(void *user, http_conn *c, const http_req *req);
typedef void (*http_abort_fn)(void *req_user);

/* The defaults http_limits_defaults fills in (for a field of http_limits
 * left 0: MAX_BODY_MB for max_body_bytes, ...).  Plain literals: help text
 * spells them (cli.h, CLI_DEFAULT_INT). */
#define HTTP_DEFAULT_MAX_HEADER_KB      16
#define HTTP_DEFAULT_MAX_BODY_MB        4
#define HTTP_DEFAULT_MAX_WRITE_QUEUE_MB 16
#define HTTP_DEFAULT_MAX_BUFFER_MB      256 /* or 8 x max_body_bytes, if more */
#define HTTP_DEFAULT_MAX_HEADERS        64
#define HTTP_DEFAULT_MAX_CONNS          4096
#define HTTP_DEFAULT_REQUEST_TIMEOUT_MS 30000
#define HTTP_DEFAULT_BODY_MS_PER_MIB    1000
#define HTTP_DEFAULT_IDLE_TIMEOUT_MS    120000

/* What a client may use (0 = the default); node and router take the same
 * flags (cli.h, CLI_HTTP_OPTS). */
typedef struct {
    size_t max_header_bytes;
    size_t max_body_bytes;
    size_t max_write_queue_bytes; /* per connection */
    size_t max_buffered_bytes;    /* all connections */
    uint32_t max_headers;
    uint32_t max_conns;
    uint32_t max_conns_per_peer; /* default max_conns / 4 */
    uint64_t request_timeout_ms; /* headers, from the first byte */
    uint64_t body_ms_per_mib;    /* more time per MiB of body */
    uint64_t idle_timeout_ms;
    /* IP literals of peers that are not held to max_conns_per_peer and may
     * use the reserve (a router in front of a node) */
    const char *const *trusted;
    size_t n_trusted;
} http_limits;

typedef struct {
    const char *host; /* default "127.0.0.1" */
    int port;         /* 0 = ephemeral (see http_srv_port) */
    http_limits lim;
    http_req_fn on_request;
    void *user;
} http_srv_config;

typedef struct {
    size_t conns, health_only; /* open connections; of them, limited to GET /health */
    size_t buffered;           /* bytes in all connections' buffers */
    uint64_t refused_conns;    /* connections answered 503 and closed at once */
    uint64_t refused_budget;   /* requests answered 503 (or closed) past max_buffered_bytes */
    uint64_t evicted_idle;     /* idle keep-alive connections closed to make room */
    uint64_t timeouts;         /* requests answered 408 */
} http_srv_stats;

/* The limits with every default filled in. */
void http_limits_defaults(http_limits *l);
/* Connections kept for trusted peers and /health: max_conns / 16, 2..256. */
uint32_t http_srv_reserve(const http_limits *l);

/* Binds and listens.  DX_EIO (message says which address) on failure;
 * DX_EINVAL for a trusted peer that is not an IP address. */
int http_srv_create(uv_loop_t *loop, const http_srv_config *cfg, http_srv **out);
int http_srv_port(const http_srv *s); /* the bound port */
/* Closes the listener; existing connections carry on. */
void http_srv_stop_accepting(http_srv *s);
/* Closes connections with no request in progress (used at shutdown). */
void http_srv_close_idle(http_srv *s);
/* Answer bytes handed over and not yet written, all connections together
 * (a stop waits for them: closing a connection drops what it still queues). */
size_t http_srv_unwritten(const http_srv *s);
size_t http_srv_n_conns(const http_srv *s);
void http_srv_get_stats(const http_srv *s, http_srv_stats *out);
/* The connection gauges and counters in Prometheus text, names prefixed
 * (e.g. "duplex" gives duplex_http_connections). */
int http_srv_write_metrics(const http_srv *s, const char *prefix, dx_buf *b);
/* Closes everything (aborting requests in progress) and frees the server once
 * libuv has closed its handles: run the loop afterwards.  NULL is a no-op. */
void http_srv_destroy(http_srv *s);

void http_conn_set_abort(http_conn *c, http_abort_fn fn, void *req_user);
/* Keeps c's memory, the request's body included, valid after the connection
 * closes, until the matching http_conn_release (loop thread): for work that
 * reads the body off the loop.  A closed connection cannot be answered; the
 * abort callback still says when it is gone.  An answer given while held
 * closes the connection after it (no next request may reuse the body's
 * buffer).  The server is freed only when every hold is released. */
void http_conn_hold(http_conn *c);
void http_conn_release(http_conn *c);
/* Closes the connection now, mid-answer if need be (no abort callback runs);
 * the pointer is invalid afterwards.  For tests and fault injection. */
void http_conn_abort(http_conn *c);
/* Bytes the application holds on behalf of c's request besides the body
 * (its parsed tree): counted in max_buffered_bytes like the buffers until
 * uncharged or the connection closes.  Returns 1 when the server is over the
 * budget with them (counted as refused): the caller answers 503 with
 * HTTP_BUSY_BUFFERS after uncharging them; else 0. */
int http_conn_charge(http_conn *c, size_t bytes);
void http_conn_uncharge(http_conn *c, size_t bytes);
#define HTTP_BUSY_BUFFERS "server busy: too much request data in progress; try again later"
/* A finished answer with Content-Length.  extra_headers: "Name: v\r\n"... or
 * NULL.  Returns 0 or a negative code: the connection is then closing and the
 * abort callback, if one is set, has already run (inside this call). */
int http_conn_respond(http_conn *c, int status, const char *content_type, const char *extra_headers,
                      const char *body, size_t len);
/* A streamed answer (chunked; for HTTP/1.0 clients, closed at the end). */
int http_conn_stream_begin(http_conn *c, int status, const char *content_type,
                           const char *extra_headers);
int http_conn_stream_write(http_conn *c, const char *data, size_t len);
int http_conn_stream_end(http_conn *c);
const char *http_status_text(int status);
/* What every 503 carries: the server is busy, loading or stopping. */
#define HTTP_RETRY_AFTER "Retry-After: 1\r\n"

#endif
