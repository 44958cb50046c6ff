/* Unit tests for src/http/http_app: the skeleton the node and the router
 * share, over a real http_srv on loopback with its loop on a thread.
 *
 * A table of three routes (an open GET, a keyed POST, a POST with its own
 * error shape) behind one API key: the checks run in order (401 before
 * anything else but on open routes, 404, 405 with the route's Allow), the
 * handlers get their argument and the caller's credentials, errors come in
 * the route's shape with Retry-After on 503, and every answer is counted
 * under its route (the raw path never becomes a label). */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "http/http_app.h"
#include "http/http_auth.h"
#include "http/http_conn.h"

#include "../test_client.h"

typedef struct {
    uv_loop_t loop;
    uv_async_t stop;
    http_srv *srv;
    http_app *app;
    http_auth *auth;
    pthread_t th;
    int port;
} harness;

static harness H;

static void on_echo(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    harness *h = u;
    char body[64];
    int n = snprintf(body, sizeof body, "{\"arg\":%d,\"key\":%d}", (int)k->arg, k->who->key);
    http_app_respond(h->app, c, r->method, r->path, 200, "application/json", NULL, body, (size_t)n,
                     k->t0);
}

static void on_busy(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    harness *h = u;
    http_app_error(h->app, c, r->method, r->path, 503, "busy now", NULL, NULL, k->t0);
}

/* The counts, read on the loop's thread (where they are written). */
static void on_metrics(void *u, http_conn *c, const http_req *r, const http_app_call *k)
{
    harness *h = u;
    dx_buf b;
    dx_buf_init(&b, 0);
    http_app_write_metrics(h->app, "t_requests_total", &b);
    http_app_respond(h->app, c, r->method, r->path, 200, "text/plain", NULL, b.data, b.len, k->t0);
    dx_buf_free(&b);
}

/* Another API's shape, as a front door other than OpenAI's would write it. */
static int other_shape(dx_buf *b, int status, const char *message, const char *param,
                       const char *code)
{
    (void)param;
    (void)code;
    return dx_buf_printf(b, "{\"type\":\"error\",\"status\":%d,\"message\":\"%s\"}", status,
                         message);
}

static const http_app_route k_routes[] = {
    {.path = "/health", .methods = HTTP_APP_GET, .open = 1, .fn = on_echo, .arg = 7},
    {.path = "/v1/thing", .methods = HTTP_APP_POST, .fn = on_echo, .arg = 42},
    {.path = "/v1/other", .methods = HTTP_APP_POST, .fn = on_busy, .error = other_shape},
    {.path = "/both", .methods = HTTP_APP_GET | HTTP_APP_POST, .fn = on_echo, .arg = 3},
    {.path = "/metrics", .methods = HTTP_APP_GET, .open = 1, .fn = on_metrics},
    {.path = "/items/",
     .methods = HTTP_APP_GET | HTTP_APP_DELETE,
     .fn = on_echo,
     .arg = 9,
     .prefix = 1},
};

static void on_stop(uv_async_t *a)
{
    harness *h = a->data;
    http_srv_destroy(h->srv);
    uv_close((uv_handle_t *)&h->stop, NULL);
}

static void *loop_thread(void *arg)
{
    uv_run(&((harness *)arg)->loop, UV_RUN_DEFAULT);
    return NULL;
}

static int setup(void **state)
{
    (void)state;
    memset(&H, 0, sizeof H);
    static const char *const keys[] = {"sk-test-key"};
    http_auth_config ac = {.api_keys = keys, .n_api_keys = 1};
    assert_int_equal(http_auth_create(&ac, &H.auth), 0);
    http_app_config cfg = {
        .routes = k_routes, .n_routes = DX_ARRAY_LEN(k_routes), .auth = H.auth, .user = &H};
    assert_int_equal(http_app_create(&cfg, &H.app), 0);
    uv_loop_init(&H.loop);
    http_srv_config sc = {.host = "127.0.0.1", .on_request = http_app_on_request, .user = H.app};
    assert_int_equal(http_srv_create(&H.loop, &sc, &H.srv), 0);
    H.port = http_srv_port(H.srv);
    uv_async_init(&H.loop, &H.stop, on_stop);
    H.stop.data = &H;
    pthread_create(&H.th, NULL, loop_thread, &H);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    uv_async_send(&H.stop);
    pthread_join(H.th, NULL);
    uv_loop_close(&H.loop);
    http_app_destroy(H.app);
    http_auth_destroy(H.auth);
    return 0;
}

/* One request; the status, with the body (and the raw head when asked). */
static long req(const char *method, const char *path, const char *key, dx_buf *body, dx_buf *head)
{
    struct curl_slist *hdrs = NULL;
    CURL *c = tc_curl(H.port, method, path, !strcmp(method, "POST") ? "{}" : NULL, body, &hdrs, 10);
    if (key) {
        char h[128];
        snprintf(h, sizeof h, "Authorization: Bearer %s", key);
        hdrs = curl_slist_append(hdrs, h);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    }
    if (!strcmp(method, "HEAD")) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    if (head) {
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, tc_on_data);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, head);
    }
    long status = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    tc_terminate(body);
    if (head) tc_terminate(head);
    return status;
}

static void test_checks_in_order(void **state)
{
    (void)state;
    dx_buf b, h;
    dx_buf_init(&b, 0);
    dx_buf_init(&h, 0);
    /* an open route needs no key; its handler gets the route's argument */
    assert_int_equal(req("GET", "/health", NULL, &b, NULL), 200);
    assert_string_equal(b.data, "{\"arg\":7,\"key\":-1}");
    /* a keyed route: 401 in OpenAI's shape, with WWW-Authenticate */
    b.len = 0;
    assert_int_equal(req("POST", "/v1/thing", NULL, &b, &h), 401);
    assert_non_null(strstr(b.data, "\"code\":\"invalid_api_key\""));
    assert_non_null(strstr(h.data, "WWW-Authenticate: Bearer"));
    /* unknown routes want the key too: they say nothing to strangers */
    b.len = 0;
    assert_int_equal(req("GET", "/nope", NULL, &b, NULL), 401);
    b.len = 0;
    assert_int_equal(req("GET", "/nope", "sk-test-key", &b, NULL), 404);
    assert_non_null(strstr(b.data, "unknown route"));
    /* the method: 405 with the route's Allow */
    b.len = h.len = 0;
    assert_int_equal(req("GET", "/v1/thing", "sk-test-key", &b, &h), 405);
    assert_non_null(strstr(h.data, "\r\nAllow: POST\r\n"));
    b.len = h.len = 0;
    assert_int_equal(req("POST", "/health", NULL, &b, &h), 405);
    assert_non_null(strstr(h.data, "\r\nAllow: GET, HEAD\r\n"));
    b.len = h.len = 0;
    assert_int_equal(req("DELETE", "/both", "sk-test-key", &b, &h), 405);
    assert_non_null(strstr(h.data, "\r\nAllow: GET, HEAD, POST\r\n"));
    /* through: the handler sees the key that was presented */
    b.len = 0;
    assert_int_equal(req("POST", "/v1/thing", "sk-test-key", &b, NULL), 200);
    assert_string_equal(b.data, "{\"arg\":42,\"key\":0}");
    b.len = 0;
    assert_int_equal(req("GET", "/both", "sk-test-key", &b, NULL), 200);
    assert_int_equal(req("HEAD", "/health", NULL, &b, NULL), 200); /* HEAD is GET */
    /* a prefix route takes every path below it, not itself */
    b.len = 0;
    assert_int_equal(req("GET", "/items/abc", "sk-test-key", &b, NULL), 200);
    assert_string_equal(b.data, "{\"arg\":9,\"key\":0}");
    b.len = 0;
    assert_int_equal(req("DELETE", "/items/abc", "sk-test-key", &b, NULL), 200);
    b.len = 0;
    assert_int_equal(req("GET", "/items/", "sk-test-key", &b, NULL), 404);
    b.len = h.len = 0;
    assert_int_equal(req("POST", "/items/x", "sk-test-key", &b, &h), 405);
    assert_non_null(strstr(h.data, "\r\nAllow: GET, HEAD, DELETE\r\n"));
    dx_buf_free(&b);
    dx_buf_free(&h);
}

static void test_error_shapes(void **state)
{
    (void)state;
    dx_buf b, h;
    dx_buf_init(&b, 0);
    dx_buf_init(&h, 0);
    /* the route's own shape, and 503's Retry-After */
    assert_int_equal(req("POST", "/v1/other", "sk-test-key", &b, &h), 503);
    assert_string_equal(b.data, "{\"type\":\"error\",\"status\":503,\"message\":\"busy now\"}");
    assert_non_null(strstr(h.data, "\r\nRetry-After: 1\r\n"));
    /* its 405 in its shape too */
    b.len = 0;
    assert_int_equal(req("GET", "/v1/other", "sk-test-key", &b, NULL), 405);
    assert_non_null(strstr(b.data, "\"type\":\"error\",\"status\":405"));
    /* the default shape, as a body for an answer sent another way */
    dx_buf e;
    dx_buf_init(&e, 0);
    assert_int_equal(http_app_error_body(H.app, "/v1/thing", &e, 400, "bad", "messages", NULL), 0);
    tc_terminate(&e);
    assert_non_null(strstr(e.data, "\"param\":\"messages\""));
    assert_non_null(strstr(e.data, "\"type\":\"invalid_request_error\""));
    dx_buf_free(&e);
    dx_buf_free(&b);
    dx_buf_free(&h);
}

/* A series of the requests family, as /metrics shows it (0 when absent). */
static long count_of(const char *labels)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(req("GET", "/metrics", NULL, &b, NULL), 200);
    char series[160];
    snprintf(series, sizeof series, "t_requests_total{%s} ", labels);
    const char *p = strstr(b.data, series);
    long n = p ? atol(p + strlen(series)) : 0;
    assert_null(strstr(b.data, "scanner")); /* the raw path never becomes a label */
    dx_buf_free(&b);
    return n;
}

static void test_counted_by_route(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    long n404 = count_of("route=\"other\",status=\"404\"");
    assert_int_equal(req("GET", "/scanner/probe/1", "sk-test-key", &b, NULL), 404);
    b.len = 0;
    assert_int_equal(req("GET", "/scanner/probe/2", "sk-test-key", &b, NULL), 404);
    assert_int_equal(count_of("route=\"other\",status=\"404\""), n404 + 2);
    long ok = count_of("route=\"/v1/thing\",status=\"200\"");
    b.len = 0;
    assert_int_equal(req("POST", "/v1/thing", "sk-test-key", &b, NULL), 200);
    assert_int_equal(count_of("route=\"/v1/thing\",status=\"200\""), ok + 1);
    /* a prefix route's requests are counted under it */
    long items = count_of("route=\"/items/\",status=\"200\"");
    b.len = 0;
    assert_int_equal(req("GET", "/items/scanner-secret", "sk-test-key", &b, NULL), 200);
    assert_int_equal(count_of("route=\"/items/\",status=\"200\""), items + 1);
    /* a scrape counts once it has been answered */
    long m = count_of("route=\"/metrics\",status=\"200\"");
    assert_int_equal(count_of("route=\"/metrics\",status=\"200\""), m + 1);
    dx_buf_free(&b);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checks_in_order),
        cmocka_unit_test(test_error_shapes),
        cmocka_unit_test(test_counted_by_route),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    curl_global_cleanup();
    return rc;
}
