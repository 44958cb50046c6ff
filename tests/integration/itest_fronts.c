/* itest_fronts: the Messages and Responses front doors at their edges, on a
 * node and through the router alike (they share the validation):
 *  - bad bodies: each a 4xx in that API's own error shape naming the field,
 *    and the server keeps serving;
 *  - stored responses in the routers' shared Redis: a previous_response_id
 *    chain begun on one router continues on another; GET reads it there;
 *    another tenant's (API key's) id is a 404, never its history; an
 *    expired one too; store:false is never kept;
 *  - x-api-key, Anthropic's key header, opens the Messages route. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "pd_test.h"
#include "redis_proc.h"

/* A POST with extra headers: the status, the body parsed. */
static long req(int port, const char *path, const char *body, const char *h1, const char *h2,
                json_t **out)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    struct curl_slist *hdrs = NULL;
    CURL *c = tc_curl(port, body ? "POST" : "GET", path, body, &b, &hdrs, 60);
    if (h1) hdrs = curl_slist_append(hdrs, h1);
    if (h2) hdrs = curl_slist_append(hdrs, h2);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    long st = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    tc_terminate(&b);
    if (out) *out = b.len ? tc_json(&b) : NULL;
    dx_buf_free(&b);
    return st;
}

typedef struct {
    const char *body;
    long status;
    const char *phrase; /* in the message */
} bad_case;

#define M "\"model\":\"duplex-synth-qwen3-tiny-f32\""

static const bad_case k_bad_messages[] = {
    {"{" M ",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "max_tokens"},
    {"{" M ",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
     "\"source\":{}}]}]}",
     400, "messages[0].content[0].type"},
    {"{" M ",\"max_tokens\":4,\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400,
     "messages[0].role"},
    {"{" M ",\"max_tokens\":4,\"messages\":[]}", 400, "messages"},
    {"{" M ",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{"
     "\"type\":\"web_search_20250305\",\"name\":\"w\"}]}",
     400, "tools[0]"},
    {"{" M ",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":"
     "{\"type\":\"tool\"}}",
     400, "tool_choice"},
    {"{\"model\":\"claude-9\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
     "\"x\"}]}",
     404, "claude-9"},
    {"not json", 400, ""},
};

static const bad_case k_bad_responses[] = {
    {"{" M "}", 400, "input"},
    {"{" M ",\"input\":[{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":"
     "\"input_image\",\"image_url\":\"x\"}]}]}",
     400, "input[0].content[0]"},
    {"{" M ",\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", 400, "tools[0]"},
    {"{" M ",\"input\":\"x\",\"max_output_tokens\":-1}", 400, "max_output_tokens"},
    {"{" M ",\"input\":\"x\",\"previous_response_id\":\"resp_none\"}", 404, "resp_none"},
    {"{" M ",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}", 400,
     "text.format"},
    {"not json", 400, ""},
};

/* Every bad body: its status, the door's shape, a message naming it. */
static void check_bad(int port)
{
    for (size_t i = 0; i < DX_ARRAY_LEN(k_bad_messages); i++) {
        const bad_case *c = &k_bad_messages[i];
        json_t *e;
        long st = req(port, "/v1/messages", c->body, NULL, NULL, &e);
        const char *msg =
            json_string_value(json_object_get(json_object_get(e, "error"), "message"));
        if (st != c->status || !json_is_string(json_object_get(e, "type")) ||
            strcmp(json_string_value(json_object_get(e, "type")), "error") || !msg ||
            !strstr(msg, c->phrase))
            fail_msg("messages case %zu: %ld %s", i, st, e ? json_dumps(e, 0) : "(no body)");
        json_decref(e);
    }
    for (size_t i = 0; i < DX_ARRAY_LEN(k_bad_responses); i++) {
        const bad_case *c = &k_bad_responses[i];
        json_t *e;
        long st = req(port, "/v1/responses", c->body, NULL, NULL, &e);
        json_t *err = json_object_get(e, "error");
        const char *msg = json_string_value(json_object_get(err, "message"));
        if (st != c->status || !msg || !strstr(msg, c->phrase) ||
            !json_is_string(json_object_get(err, "type")))
            fail_msg("responses case %zu: %ld %s", i, st, e ? json_dumps(e, 0) : "(no body)");
        json_decref(e);
    }
    /* and it serves on */
    json_t *ok;
    assert_int_equal(req(port, "/v1/messages",
                         "{" M ",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":"
                         "\"hi\"}]}",
                         NULL, NULL, &ok),
                     200);
    assert_string_equal(json_string_value(json_object_get(ok, "type")), "message");
    json_decref(ok);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    tp_proc D, R;
    node_start(&D, "d", NULL);
    check_bad(D.http);
    tp_proc *dd[] = {&D};
    router_start(&R, NULL, 0, dd, 1, NULL);
    check_bad(R.http);
    stop_ok(&R);
    stop_ok(&D);
}

/* A response's id, created through port with key (a header line or NULL). */
static char *create(int port, const char *key, const char *input, const char *prev, int store)
{
    char body[1024];
    snprintf(body, sizeof body,
             "{" M ",\"input\":\"%s\",\"max_output_tokens\":4,\"temperature\":0%s%s%s%s}", input,
             prev ? ",\"previous_response_id\":\"" : "", prev ? prev : "", prev ? "\"" : "",
             store ? "" : ",\"store\":false");
    json_t *r;
    long st = req(port, "/v1/responses", body, key, NULL, &r);
    if (st != 200) fail_msg("create: %ld %s", st, r ? json_dumps(r, 0) : "");
    char *id = strdup(json_string_value(json_object_get(r, "id")));
    json_decref(r);
    return id;
}

/* The status of continuing prev through port with key. */
static long continue_status(int port, const char *key, const char *prev)
{
    char body[512];
    snprintf(body, sizeof body,
             "{" M ",\"input\":\"more\",\"max_output_tokens\":2,\"previous_response_id\":\"%s\"}",
             prev);
    json_t *r;
    long st = req(port, "/v1/responses", body, key, NULL, &r);
    if (st == 404)
        assert_string_equal(json_string_value(json_object_get(json_object_get(r, "error"), "code")),
                            "previous_response_not_found");
    json_decref(r);
    return st;
}

static long get_status(int port, const char *key, const char *id)
{
    char path[512]; /* an id up to the 400 bytes test_shared_store sends */
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    return req(port, path, NULL, key, NULL, NULL);
}

static void test_shared_store(void **state)
{
    (void)state;
    rp_redis rd = {0};
    char log[160];
    snprintf(log, sizeof log, "%s/redis.log", G.dir);
    rp_start(&rd, log);
    tp_proc D, A, B, X;
    node_start(&D, "d", NULL);
    tp_proc *dd[] = {&D};
    const char *shared[] = {"--state", rd.url, "--api-key", "sk-one", "--api-key", "sk-two", NULL};
    router_start(&A, NULL, 0, dd, 1, shared);
    router_start(&B, NULL, 0, dd, 1, shared);
    const char *k1 = "Authorization: Bearer sk-one", *k2 = "Authorization: Bearer sk-two";
    /* a chain begun on A continues on B, and B reads it back */
    char *r1 = create(A.http, k1, "hello there", NULL, 1);
    char *r2 = create(B.http, k1, "and again", r1, 1);
    assert_int_equal(get_status(B.http, k1, r2), 200);
    assert_int_equal(get_status(A.http, k1, r1), 200);
    /* an id that begins with a stored one but runs past the longest id
     * names nothing (through Redis, and a node's own store below) */
    char longer[400];
    snprintf(longer, sizeof longer, "%s%0*d", r1, 200, 7);
    assert_int_equal(get_status(B.http, k1, longer), 404);
    /* another tenant: as if it were not there */
    assert_int_equal(continue_status(B.http, k2, r2), 404);
    assert_int_equal(get_status(A.http, k2, r1), 404);
    /* store: false is never kept */
    char *r3 = create(A.http, k1, "forget me", NULL, 0);
    assert_int_equal(continue_status(B.http, k1, r3), 404);
    assert_int_equal(get_status(A.http, k1, r3), 404);
    /* x-api-key opens the Messages route too */
    json_t *m;
    assert_int_equal(req(A.http, "/v1/messages",
                         "{" M ",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":"
                         "\"hi\"}]}",
                         "x-api-key: sk-two", "anthropic-version: 2023-06-01", &m),
                     200);
    json_decref(m);
    assert_int_equal(req(A.http, "/v1/messages", "{}", NULL, NULL, &m), 401);
    assert_string_equal(json_string_value(json_object_get(m, "type")), "error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(m, "error"), "type")),
                        "authentication_error");
    json_decref(m);
    /* expiry: a router keeping responses for 1 s; the id is gone once it passes */
    const char *brief[] = {"--responses-ttl", "1", NULL};
    router_start(&X, NULL, 0, dd, 1, brief);
    char *r4 = create(X.http, NULL, "short lived", NULL, 1);
    assert_int_equal(get_status(X.http, NULL, r4), 200); /* a GET uses it: its TTL restarts */
    snprintf(longer, sizeof longer, "%s%0*d", r4, 200, 7);
    assert_int_equal(get_status(X.http, NULL, longer), 404); /* a router's memory store */
    char *r5 = create(D.http, NULL, "on the node", NULL, 1);
    snprintf(longer, sizeof longer, "%s%0*d", r5, 200, 7);
    assert_int_equal(get_status(D.http, NULL, r5), 200);
    assert_int_equal(get_status(D.http, NULL, longer), 404); /* the node's own */
    free(r5);
    /* every use restarts the TTL, so there is nothing to poll: once more
     * than the TTL has passed since the GET, the id is expired whatever
     * the machine's speed (the wait is for time to pass, not a timing) */
    tp_sleep_ms(1300);
    assert_int_equal(continue_status(X.http, NULL, r4), 404);
    free(r1);
    free(r2);
    free(r3);
    free(r4);
    stop_ok(&X);
    stop_ok(&A);
    stop_ok(&B);
    stop_ok(&D);
    rp_stop(&rd);
}

static int setup(void **state)
{
    (void)state;
    return pdt_setup("fronts");
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_shared_store),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
