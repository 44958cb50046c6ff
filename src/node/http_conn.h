/* http_conn: an HTTP/1.1 server on a libuv loop (parsing by http-parser).
 *
 * Everything here runs on the loop's thread.  A connection reads one request
 * at a time: when a request is complete the parser is paused and the request
 * handed to the application, which answers now or later (streaming answers
 * come from engine events).  Bytes a client pipelines meanwhile are buffered
 * (bounded) and parsed after the answer, so answers keep their order.
 *
 * Limits, each with its status: request line + headers over max_header_bytes
 * → 431; a body over max_body_bytes → 413 (decided from Content-Length before
 * the body is read); malformed HTTP → 400; a request not complete within
 * request_timeout_ms of its first byte → 408.  Each of those closes the
 * connection after the answer.  An idle keep-alive connection is closed after
 * idle_timeout_ms.  A client that stops reading while more than
 * max_write_queue_bytes are queued is disconnected.
 *
 * Lifetime: an application that answers asynchronously registers an abort
 * callback with http_conn_set_abort; if the connection dies before the answer
 * is finished the callback runs once and the http_conn pointer becomes
 * invalid.  Once the answer is finished (http_conn_respond or
 * http_conn_stream_end) the application must drop the pointer. */
#ifndef HTTP_CONN_H
#define HTTP_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

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
    const char *body; /* NUL-terminated for convenience; body_len excludes it */
    size_t body_len;
    const struct sockaddr *peer; /* the client's address (AF_INET/AF_INET6), or NULL */
} http_req;

/* The first value of header `name` (any case), or NULL; *count (when not
 * NULL) says how often the header came. */
const char *http_req_header(const http_req *r, const char *name, int *count);

typedef void (*http_req_fn)(void *user, http_conn *c, const http_req *req);
typedef void (*http_abort_fn)(void *req_user);

typedef struct {
    const char *host;             /* default "127.0.0.1" */
    int port;                     /* 0 = ephemeral (see http_srv_port) */
    size_t max_header_bytes;      /* default 16 KiB */
    size_t max_body_bytes;        /* default 4 MiB */
    size_t max_write_queue_bytes; /* default 16 MiB */
    uint32_t max_headers;         /* default 64 */
    uint32_t max_conns;           /* default 4096 */
    uint64_t request_timeout_ms;  /* default 30000 */
    uint64_t idle_timeout_ms;     /* default 120000 */
    http_req_fn on_request;
    void *user;
} http_srv_config;

/* Binds and listens.  DX_EIO (message says which address) on failure. */
int http_srv_create(uv_loop_t *loop, const http_srv_config *cfg, http_srv **out);
int http_srv_port(const http_srv *s); /* the bound port */
/* Closes the listener; existing connections carry on. */
void http_srv_stop_accepting(http_srv *s);
/* Closes connections with no request in progress (used at shutdown). */
void http_srv_close_idle(http_srv *s);
size_t http_srv_n_conns(const http_srv *s);
/* Closes everything (aborting requests in progress) and frees the server once
 * libuv has closed its handles: run the loop afterwards.  NULL is a no-op. */
void http_srv_destroy(http_srv *s);

void http_conn_set_abort(http_conn *c, http_abort_fn fn, void *req_user);
/* Closes the connection now, mid-answer if need be (no abort callback runs);
 * the pointer is invalid afterwards.  For tests and fault injection. */
void http_conn_abort(http_conn *c);
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

#endif
