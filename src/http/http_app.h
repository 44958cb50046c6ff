/* http_app: the skeleton the node and the router share as HTTP applications
 * (each was carrying its own copy, and the copies had begun to drift).
 *
 *   routes     a table: path, methods, whether the route is open (no API
 *              key: /health and /metrics, for probes and scrapers), the
 *              handler and an argument for it
 *   checks     every request, before its handler: the caller's API key
 *              (401, unknown routes too: they say nothing to strangers),
 *              the method (405 with the route's own Allow), the path (404)
 *   answers    that count themselves in the requests-by-route-and-status
 *              family (labelled by route, never by the raw path, so a
 *              scanner cannot grow it) and log one line each
 *   errors     in the route's API shape: OpenAI's unless the route names
 *              another writer; 503 always carries Retry-After
 *   prep       a request's body handed to a work pool (parsing, templates,
 *              tokenising off the loop), the connection held until the
 *              loop has the result
 *
 * Everything runs on the loop's thread but http_app_prep's `run`. */
#ifndef HTTP_APP_H
#define HTTP_APP_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "http/http_auth.h"
#include "http/http_conn.h"
#include "http/work_pool.h"

enum {
    HTTP_APP_GET = 1u << 0, /* and HEAD, which http_conn answers without the body */
    HTTP_APP_POST = 1u << 1,
    HTTP_APP_DELETE = 1u << 2,
};

typedef struct http_app http_app;

/* What the skeleton knows of a request when it calls the handler. */
typedef struct {
    uint64_t t0;                 /* arrival (dx_now_ns) */
    const http_auth_result *who; /* the caller's credentials (open routes: none checked) */
    intptr_t arg;                /* the route's */
} http_app_call;

typedef void (*http_app_fn)(void *user, http_conn *c, const http_req *r, const http_app_call *k);

/* An error body in an API's shape: status, the message, the field it is
 * about (or NULL) and a machine-readable code (or NULL). */
typedef int (*http_app_error_fn)(dx_buf *b, int status, const char *message, const char *param,
                                 const char *code);

typedef struct {
    /* the path; one ending in '/' with `prefix` set takes every path below
     * it (/v1/responses/{id}), and is counted under it */
    const char *path;
    unsigned
        methods; /* HTTP_APP_GET | HTTP_APP_POST | HTTP_APP_DELETE; 0: any (the handler checks) */
    int open;    /* no API key wanted */
    http_app_fn fn;
    intptr_t arg;
    http_app_error_fn error; /* NULL: OpenAI's shape */
    int prefix;              /* see path */
} http_app_route;

typedef struct {
    const http_app_route *routes; /* kept, not copied: static tables */
    size_t n_routes;
    const http_auth *auth; /* NULL: nothing configured */
    void *user;            /* the handlers' */
} http_app_config;

/* DX_ENOMEM. */
int http_app_create(const http_app_config *cfg, http_app **out);
void http_app_destroy(http_app *a); /* NULL: no-op */

/* http_srv_config.on_request, with the app as user. */
void http_app_on_request(void *app, http_conn *c, const http_req *r);

/* The route a path names, or NULL. */
const http_app_route *http_app_route_of(const http_app *a, const char *path);

/* A finished answer: written, counted under path's route and logged
 * (quietly for open routes that succeed). */
void http_app_respond(http_app *a, http_conn *c, const char *method, const char *path, int status,
                      const char *content_type, const char *extra_headers, const char *body,
                      size_t len, uint64_t t0);
void http_app_respond_json(http_app *a, http_conn *c, const char *method, const char *path,
                           int status, const char *extra_headers, const dx_buf *body, uint64_t t0);
/* An error answer in path's route's shape (405: its Allow; 503:
 * Retry-After); param and code may be NULL. */
void http_app_error(http_app *a, http_conn *c, const char *method, const char *path, int status,
                    const char *message, const char *param, const char *code, uint64_t t0);
/* An error body as path's route writes it (for an answer sent another way,
 * e.g. inside a stream that has begun). */
int http_app_error_body(const http_app *a, const char *path, dx_buf *b, int status,
                        const char *message, const char *param, const char *code);
/* For an answer that ended another way (a stream): the count, the log line. */
void http_app_count(http_app *a, const char *path, int status);
void http_app_log(const http_app *a, const char *method, const char *path, int status, uint64_t t0);
/* The requests family, as NAME{route,status}. */
int http_app_write_metrics(const http_app *a, const char *name, dx_buf *b);
/* Requests answered so far on path's route with status (tests, metrics). */
uint64_t http_app_count_of(const http_app *a, const char *path, int status);

/* A request's preparation off the loop: its body stays valid (the
 * connection is held) until http_app_prep_end, which the job's `done` calls
 * first thing. */
typedef struct {
    work_job job;
    http_conn *held;
    const char *body;
    size_t len;
} http_app_prep;

void http_app_prep_start(http_app_prep *p, work_pool *pool, http_conn *c, const http_req *r,
                         work_fn run, work_fn done);
void http_app_prep_end(http_app_prep *p);

#endif
