/* http_app: the route table, the checks before a handler, answers that
 * count and log themselves, the hand-off to a work pool (see .h). */
#include "http/http_app.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "http/prom.h"
#include "oai/oai_resp.h"

struct http_app {
    http_app_config cfg;
    prom_family requests; /* route, status */
};

int http_app_create(const http_app_config *cfg, http_app **out)
{
    http_app *a = dx_calloc(1, sizeof *a);
    if (!a) return dx_errf(DX_ENOMEM, "http app: out of memory");
    a->cfg = *cfg;
    prom_family_init(&a->requests);
    *out = a;
    return 0;
}

void http_app_destroy(http_app *a)
{
    if (!a) return;
    prom_family_free(&a->requests);
    dx_free(a);
}

const http_app_route *http_app_route_of(const http_app *a, const char *path)
{
    for (size_t i = 0; i < a->cfg.n_routes; i++) {
        const http_app_route *rt = &a->cfg.routes[i];
        size_t n = strlen(rt->path);
        if (rt->prefix ? !strncmp(path, rt->path, n) && path[n] : !strcmp(path, rt->path))
            return rt;
    }
    return NULL;
}

/* The route's path (a string of the table, never the client's) or "other". */
static const char *route_label(const http_app *a, const char *path)
{
    const http_app_route *rt = http_app_route_of(a, path);
    return rt ? rt->path : "other";
}

void http_app_count(http_app *a, const char *path, int status)
{
    char labels[160];
    snprintf(labels, sizeof labels, "route=\"%s\",status=\"%d\"", route_label(a, path), status);
    prom_family_add(&a->requests, labels, 1);
}

uint64_t http_app_count_of(const http_app *a, const char *path, int status)
{
    char labels[160];
    snprintf(labels, sizeof labels, "route=\"%s\",status=\"%d\"", route_label(a, path), status);
    return prom_family_get(&a->requests, labels);
}

int http_app_write_metrics(const http_app *a, const char *name, dx_buf *b)
{
    return prom_write_family(b, name, "HTTP requests by route and status", &a->requests);
}

void http_app_log(const http_app *a, const char *method, const char *path, int status, uint64_t t0)
{
    const http_app_route *rt = http_app_route_of(a, path);
    int quiet = rt && rt->open && status < 400; /* probes and scrapers, every second */
    dx_log(quiet ? DX_LOG_DEBUG : DX_LOG_INFO, "%s %.200s %d total_ms=%.2f", method, path, status,
           (double)(dx_now_ns() - t0) * 1e-6);
}

void http_app_respond(http_app *a, http_conn *c, const char *method, const char *path, int status,
                      const char *content_type, const char *extra_headers, const char *body,
                      size_t len, uint64_t t0)
{
    http_conn_respond(c, status, content_type, extra_headers, body, len);
    http_app_count(a, path, status);
    http_app_log(a, method, path, status, t0);
}

void http_app_respond_json(http_app *a, http_conn *c, const char *method, const char *path,
                           int status, const char *extra_headers, const dx_buf *body, uint64_t t0)
{
    http_app_respond(a, c, method, path, status, "application/json", extra_headers, body->data,
                     body->len, t0);
}

/* OpenAI's: a 401 as OpenAI answers a bad key (http_auth.h), the rest with
 * the type that fits the status. */
static int openai_error(dx_buf *b, int status, const char *message, const char *param,
                        const char *code)
{
    if (status == 401) return http_auth_error_json(b, message);
    return oai_error_json(b, message, oai_error_type(status), param, code);
}

int http_app_error_body(const http_app *a, const char *path, dx_buf *b, int status,
                        const char *message, const char *param, const char *code)
{
    const http_app_route *rt = http_app_route_of(a, path);
    http_app_error_fn fn = rt && rt->error ? rt->error : openai_error;
    return fn(b, status, message, param && *param ? param : NULL, code);
}

/* "Allow: …\r\n" for a route's methods. */
static const char *allow_header(const http_app_route *rt)
{
    static const char *const k[8] = {
        NULL,
        "Allow: GET, HEAD\r\n",
        "Allow: POST\r\n",
        "Allow: GET, HEAD, POST\r\n",
        "Allow: DELETE\r\n",
        "Allow: GET, HEAD, DELETE\r\n",
        "Allow: POST, DELETE\r\n",
        "Allow: GET, HEAD, POST, DELETE\r\n",
    };
    return k[rt->methods & 7];
}

void http_app_error(http_app *a, http_conn *c, const char *method, const char *path, int status,
                    const char *message, const char *param, const char *code, uint64_t t0)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    http_app_error_body(a, path, &b, status, message, param, code);
    const http_app_route *rt = http_app_route_of(a, path);
    const char *hdr = status == 503                 ? HTTP_RETRY_AFTER
                      : status == 401               ? HTTP_AUTH_401_HEADERS
                      : status == 405 && rt != NULL ? allow_header(rt)
                                                    : NULL;
    http_app_respond_json(a, c, method, path, status, hdr, &b, t0);
    dx_buf_free(&b);
}

void http_app_on_request(void *app, http_conn *c, const http_req *r)
{
    http_app *a = app;
    uint64_t t0 = dx_now_ns();
    const http_app_route *rt = http_app_route_of(a, r->path);
    http_auth_result who = {.key = DX_NONE};
    if (!rt || !rt->open) http_auth_check(a->cfg.auth, r, &who);
    /* HEAD is GET without the body (http_conn leaves it out) */
    unsigned m = !strcmp(r->method, "GET") || !strcmp(r->method, "HEAD") ? HTTP_APP_GET
                 : !strcmp(r->method, "POST")                            ? HTTP_APP_POST
                 : !strcmp(r->method, "DELETE")                          ? HTTP_APP_DELETE
                                                                         : 0;
    if (who.status)
        http_app_error(a, c, r->method, r->path, 401, who.message, NULL, NULL, t0);
    else if (!rt)
        http_app_error(a, c, r->method, r->path, 404, "unknown route", NULL, NULL, t0);
    else if (rt->methods && !(rt->methods & m))
        http_app_error(a, c, r->method, r->path, 405, "method not allowed", NULL, NULL, t0);
    else
        rt->fn(a->cfg.user, c, r, &(http_app_call){.t0 = t0, .who = &who, .arg = rt->arg});
}

void http_app_prep_start(http_app_prep *p, work_pool *pool, http_conn *c, const http_req *r,
                         work_fn run, work_fn done)
{
    p->held = c;
    p->body = r->body;
    p->len = r->body_len;
    http_conn_hold(c);
    p->job = (work_job){.run = run, .done = done};
    work_pool_submit(pool, &p->job);
}

void http_app_prep_end(http_app_prep *p)
{
    http_conn_release(p->held); /* the body has been read */
    p->held = NULL;
    p->body = NULL;
    p->len = 0;
}
