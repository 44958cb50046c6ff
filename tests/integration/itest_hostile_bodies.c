/* itest_hostile_bodies: request bodies built to hurt, against a node and a
 * router in front of it (both --max-body-mb 4 --max-buffer-mb 64):
 *
 *  - the Messages and Responses doors' limits: more messages or input
 *    items than are accepted, more content blocks or parts, JSON nested
 *    past 128 levels in a tool's schema, a forced tool whose schema is too
 *    long to compile (its grammar past 4 MiB) — each a 400 in the door's
 *    own shape whose message names the limit, on the node and through the
 *    router alike;
 *  - parsed bodies inside the memory budget: a body's JSON tree is counted
 *    in --max-buffer-mb as the parser builds it (http_conn_meter), so a
 *    4 MiB body of empty objects (a tree of ~280 MB) is refused with 503
 *    and Retry-After before the tree exists — sent to the node and the
 *    router at once, and
 *    the peak memory of both stays within a few budgets (checked where no
 *    sanitizer changes what memory costs); with the budget mostly held by
 *    other requests' bodies, a body whose tree would not fit gets 503 with
 *    Retry-After on both, and once they are gone the same body is served;
 *    every refusal is counted (http_refused_buffer_total).
 *
 * The node is at rest at the end (tp_stop_clean). */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test_proc.h"
#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_dtype.h"
#include "model/synth.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#define BUDGET_MB 64

static struct {
    const char *bin;
    char dir[64], model[128];
    tp_proc node, router;
} G;

static const char *const k_name = "duplex-synth-qwen3-tiny-f32";

static int group_setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    G.bin = getenv("DUPLEX_BIN");
    if (!G.bin) G.bin = "build/release/duplex";
    snprintf(G.dir, sizeof G.dir, "/tmp/dx_itest_hbodies_XXXXXX");
    if (!mkdtemp(G.dir)) return -1;
    snprintf(G.model, sizeof G.model, "%s/tiny.gguf", G.dir);
    synth_config c = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 5};
    return synth_write(&c, G.model) ? -1 : 0;
}

static int group_teardown(void **state)
{
    (void)state;
    tp_proc *all[] = {&G.router, &G.node};
    for (int i = 0; i < 2; i++)
        if (all[i]->pid > 0 && !tp_gone(all[i])) tp_stop(all[i], SIGKILL, 10);
    if (!getenv("DX_KEEP_LOGS")) tp_rm_rf(G.dir);
    curl_global_cleanup();
    return 0;
}

static void test_start(void **state)
{
    (void)state;
    char log[160], up[64];
    snprintf(log, sizeof log, "%s/node.log", G.dir);
    const char *na[] = {"serve", "--model",         G.model, "--port", "0",    "--threads",
                        "1",     "--kv-cache-mb",   "16",    "--ctx",  "1024", "--max-body-mb",
                        "4",     "--max-buffer-mb", "64",    NULL};
    tp_start(&G.node, G.bin, log, na, "duplex serve:");
    snprintf(up, sizeof up, "http://127.0.0.1:%d", G.node.http);
    snprintf(log, sizeof log, "%s/router.log", G.dir);
    const char *ra[] = {
        "router", "--decode",      up,  "--port",          "0",  "--health-interval-ms",
        "100",    "--max-body-mb", "4", "--max-buffer-mb", "64", NULL};
    tp_start(&G.router, G.bin, log, ra, "duplex router:");
    dx_buf b;
    dx_buf_init(&b, 0);
    for (int i = 0; i < 600 && tc_http(G.router.http, "GET", "/health", NULL, &b, 10) != 200; i++)
        tp_sleep_ms(50);
    assert_int_equal(tc_http(G.router.http, "GET", "/health", NULL, &b, 10), 200);
    dx_buf_free(&b);
}

/* ---- the doors' limits -------------------------------------------------------- */

/* n copies of unit, comma-separated, between pre and post. */
static char *repeat(const char *pre, const char *unit, size_t n, const char *post)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_puts(&b, pre);
    for (size_t i = 0; i < n; i++) {
        if (i) dx_buf_putc(&b, ',');
        dx_buf_puts(&b, unit);
    }
    dx_buf_puts(&b, post);
    return dx_buf_take(&b);
}

/* A JSON Schema nested `depth` objects deep. */
static char *deep_schema(int depth)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    for (int i = 0; i < depth; i++) dx_buf_puts(&b, "{\"type\":\"object\",\"properties\":{\"a\":");
    dx_buf_puts(&b, "{\"type\":\"string\"}");
    for (int i = 0; i < depth; i++) dx_buf_puts(&b, "}}");
    return dx_buf_take(&b);
}

/* A JSON Schema with n properties: a tool too long to compile. */
static char *long_schema(size_t n)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_puts(&b, "{\"type\":\"object\",\"properties\":{");
    for (size_t i = 0; i < n; i++)
        dx_buf_printf(&b, "%s\"field_%zu\":{\"type\":\"string\",\"description\":\"a field\"}",
                      i ? "," : "", i);
    dx_buf_puts(&b, "}}");
    return dx_buf_take(&b);
}

typedef struct {
    const char *path;
    char *body;
    const char *phrase; /* in the error's message */
    const char *what;
} door_case;

/* Every case's answer: 400, the door's own error shape, the limit named. */
static void check_door(int port, const door_case *c)
{
    dx_buf out;
    dx_buf_init(&out, 0);
    long st = tc_http(port, "POST", c->path, c->body, &out, 120);
    json_t *v = tc_json(&out);
    json_t *e = json_object_get(v, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    int anth = !strcmp(c->path, "/v1/messages");
    int shape = anth ? json_is_string(json_object_get(v, "type")) &&
                           !strcmp(json_string_value(json_object_get(v, "type")), "error") &&
                           json_is_string(json_object_get(e, "type"))
                     : json_is_string(json_object_get(e, "type")) && json_object_get(e, "param");
    if (st != 400 || !shape || !msg || !strstr(msg, c->phrase))
        fail_msg("%s on port %d: %ld %.400s (want 400 naming '%s')", c->what, port, st, out.data,
                 c->phrase);
    printf("%s (%s): 400 %s\n", c->what, port == G.node.http ? "node" : "router", msg);
    json_decref(v);
    dx_buf_free(&out);
}

static void test_door_limits(void **state)
{
    (void)state;
    char head[256], *deep = deep_schema(200), *longs = long_schema(30000);
    door_case cases[8];
    int n = 0;
    snprintf(head, sizeof head, "{\"model\":\"%s\",\"max_tokens\":4,\"messages\":[", k_name);
    cases[n++] = (door_case){"/v1/messages",
                             repeat(head, "{\"role\":\"user\",\"content\":\"x\"}", 16385, "]}"),
                             "at most 16384", "Messages: 16385 messages"};
    snprintf(head, sizeof head,
             "{\"model\":\"%s\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[",
             k_name);
    cases[n++] = (door_case){"/v1/messages",
                             repeat(head, "{\"type\":\"text\",\"text\":\"x\"}", 65537, "]}]}"),
                             "content blocks, at most", "Messages: 65537 content blocks"};
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_printf(&b,
                  "{\"model\":\"%s\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
                  "\"x\"}],\"tools\":[{\"name\":\"t\",\"input_schema\":%s}]}",
                  k_name, deep);
    cases[n++] = (door_case){"/v1/messages", dx_buf_take(&b), "128", "Messages: a schema 200 deep"};
    dx_buf_init(&b, 0);
    dx_buf_printf(&b,
                  "{\"model\":\"%s\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
                  "\"x\"}],\"tools\":[{\"name\":\"t\",\"input_schema\":%s}],\"tool_choice\":"
                  "{\"type\":\"tool\",\"name\":\"t\"}}",
                  k_name, longs);
    cases[n++] = (door_case){"/v1/messages", dx_buf_take(&b), "grammar for it is over",
                             "Messages: a forced tool with a 2 MB schema"};
    snprintf(head, sizeof head, "{\"model\":\"%s\",\"input\":[", k_name);
    cases[n++] = (door_case){"/v1/responses",
                             repeat(head, "{\"role\":\"user\",\"content\":\"x\"}", 16385, "]}"),
                             "at most 16384", "Responses: 16385 input items"};
    snprintf(head, sizeof head,
             "{\"model\":\"%s\",\"input\":[{\"type\":\"message\",\"role\":\"user\",\"content\":[",
             k_name);
    cases[n++] = (door_case){
        "/v1/responses", repeat(head, "{\"type\":\"input_text\",\"text\":\"x\"}", 65537, "]}]}"),
        "more than 65536 content parts", "Responses: 65537 content parts"};
    dx_buf_init(&b, 0);
    dx_buf_printf(&b,
                  "{\"model\":\"%s\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":"
                  "\"t\",\"parameters\":%s}]}",
                  k_name, deep);
    cases[n++] =
        (door_case){"/v1/responses", dx_buf_take(&b), "128", "Responses: a schema 200 deep"};
    dx_buf_init(&b, 0);
    dx_buf_printf(&b,
                  "{\"model\":\"%s\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":"
                  "\"t\",\"parameters\":%s}],\"tool_choice\":\"required\"}",
                  k_name, longs);
    cases[n++] = (door_case){"/v1/responses", dx_buf_take(&b), "grammar for it is over",
                             "Responses: a required tool with a 2 MB schema"};
    for (int i = 0; i < n; i++) {
        check_door(G.node.http, &cases[i]);
        check_door(G.router.http, &cases[i]);
        dx_free(cases[i].body);
    }
    dx_free(deep);
    dx_free(longs);
}

/* ---- parsed bodies inside the budget ------------------------------------------ */

/* A completion whose ignored member "x" holds `bytes` of empty objects:
 * ~70 counted bytes of tree per body byte. */
static char *tree_body(size_t bytes)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_printf(&b, "{\"model\":\"%s\",\"prompt\":\"hi\",\"max_tokens\":1,\"x\":[{}", k_name);
    while (b.len < bytes) dx_buf_puts(&b, ",{},{},{},{},{},{},{},{}");
    dx_buf_puts(&b, "]}");
    return dx_buf_take(&b);
}

static long status_kb(int pid, const char *key)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *k = strstr(buf, key);
    return k ? strtol(k + strlen(key), NULL, 10) : -1;
}

/* The peak RSS starts again from the current one (Linux: clear_refs 5). */
static void reset_peak(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/clear_refs", pid);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

/* The same body to the node and the router at once; their statuses and
 * whether each 503 came with Retry-After. */
static void both_at_once(const char *body, long st[2], int retry_after[2], dx_buf out[2])
{
    CURLM *m = curl_multi_init();
    CURL *e[2];
    struct curl_slist *h[2];
    int ports[2] = {G.node.http, G.router.http};
    for (int i = 0; i < 2; i++) {
        dx_buf_init(&out[i], 0);
        e[i] = tc_curl(ports[i], "POST", "/v1/completions", body, &out[i], &h[i], 120);
        curl_easy_setopt(e[i], CURLOPT_HEADER, 1L); /* the head too: Retry-After */
        curl_multi_add_handle(m, e[i]);
    }
    tc_multi_run(m);
    for (int i = 0; i < 2; i++) {
        curl_easy_getinfo(e[i], CURLINFO_RESPONSE_CODE, &st[i]);
        tc_terminate(&out[i]);
        retry_after[i] = strstr(out[i].data, "Retry-After: 1\r\n") != NULL;
        curl_multi_remove_handle(m, e[i]);
        curl_easy_cleanup(e[i]);
        curl_slist_free_all(h[i]);
    }
    curl_multi_cleanup(m);
}

static double refused(int port, const char *prefix)
{
    char s[96];
    snprintf(s, sizeof s, "%s_http_refused_buffer_total", prefix);
    return tc_metric_or(port, s, 0);
}

/* 4 MiB of empty objects: more tree than the whole budget, refused while
 * it is parsed, on both at once; their peak memory stays bounded. */
static void test_tree_past_the_budget(void **state)
{
    (void)state;
    char *body = tree_body((4u << 20) - 64);
    double r0 = refused(G.node.http, "duplex"), r1 = refused(G.router.http, "duplex_router");
    reset_peak(G.node.pid);
    reset_peak(G.router.pid);
    long base[2] = {status_kb(G.node.pid, "VmRSS:"), status_kb(G.router.pid, "VmRSS:")};
    long st[2];
    int ra[2];
    dx_buf out[2];
    both_at_once(body, st, ra, out);
    for (int i = 0; i < 2; i++) {
        if (st[i] != 503 || !ra[i] || !strstr(out[i].data, "too much request data"))
            fail_msg("%s: %ld %.300s", i ? "router" : "node", st[i], out[i].data);
        dx_buf_free(&out[i]);
    }
    long peak[2] = {status_kb(G.node.pid, "VmHWM:") - base[0],
                    status_kb(G.router.pid, "VmHWM:") - base[1]};
    printf("a 4 MiB body of empty objects (a ~280 MB tree): 503 from both; peak memory +%ld kB "
           "(node), +%ld kB (router), budget %d MiB\n",
           peak[0], peak[1], BUDGET_MB);
    if (!SANITIZED)
        for (int i = 0; i < 2; i++)
            if (peak[i] > 4L * BUDGET_MB * 1024)
                fail_msg("%s: the peak grew by %ld kB", i ? "router" : "node", peak[i]);
    assert_true(refused(G.node.http, "duplex") > r0);
    assert_true(refused(G.router.http, "duplex_router") > r1);
    dx_free(body);
    assert_int_equal(tc_http(G.node.http, "GET", "/health", NULL, &out[0], 10), 200);
    dx_buf_free(&out[0]);
}

/* A request begun and never finished, holding `mib` of body. */
static int partial(int port, size_t mib)
{
    int fd = tc_raw_connect(port);
    char head[128];
    int n =
        snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n",
                 (size_t)4 << 20);
    assert_int_equal(write(fd, head, (size_t)n), n);
    size_t len = (mib << 20) - 4096;
    char *junk = malloc(len);
    memset(junk, ' ', len);
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fd, junk + off, len - off);
        assert_true(w > 0);
        off += (size_t)w;
    }
    free(junk);
    return fd;
}

/* Waits until a server's buffers hold at least `bytes`. */
static void wait_held(int port, const char *series, double bytes)
{
    for (int i = 0; i < 600 && tc_metric_or(port, series, 0) < bytes; i++) tp_sleep_ms(50);
    assert_true(tc_metric_or(port, series, 0) >= bytes);
}

/* The budget mostly held by eleven unfinished 4 MiB bodies on each: a body
 * whose tree (~35 MB) would not fit gets 503 with Retry-After from both;
 * once they are gone, the same body is served by both. */
static void test_tree_in_a_full_budget(void **state)
{
    (void)state;
    enum { K = 11 };
    int fds[2][K];
    int ports[2] = {G.node.http, G.router.http};
    const char *held[2] = {"duplex_http_buffered_bytes", "duplex_router_http_buffered_bytes"};
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < K; i++) fds[s][i] = partial(ports[s], 4);
        wait_held(ports[s], held[s], (double)K * (4 << 20) - K * 8192.0);
    }
    char *body = tree_body(500u << 10);
    long st[2];
    int ra[2];
    dx_buf out[2];
    both_at_once(body, st, ra, out);
    for (int i = 0; i < 2; i++) {
        if (st[i] != 503 || !ra[i])
            fail_msg("%s, budget held: %ld %.300s", i ? "router" : "node", st[i], out[i].data);
        dx_buf_free(&out[i]);
    }
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < K; i++) close(fds[s][i]);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 600 && tc_metric_or(ports[s], held[s], 0) > (4 << 20); i++)
            tp_sleep_ms(50);
    both_at_once(body, st, ra, out);
    for (int i = 0; i < 2; i++) {
        if (st[i] != 200)
            fail_msg("%s, budget free: %ld %.300s", i ? "router" : "node", st[i], out[i].data);
        dx_buf_free(&out[i]);
    }
    printf("a ~35 MB tree with the budget held by others: 503 + Retry-After from both; once "
           "they left: 200 from both\n");
    dx_free(body);
}

static void test_stop(void **state)
{
    (void)state;
    assert_int_equal(tp_stop_clean(&G.router), 0);
    assert_int_equal(tp_stop_clean(&G.node), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start),
        cmocka_unit_test(test_door_limits),
        cmocka_unit_test(test_tree_past_the_budget),
        cmocka_unit_test(test_tree_in_a_full_budget),
        cmocka_unit_test(test_stop),
    };
    return cmocka_run_group_tests_name("hostile bodies on a node and a router", tests, group_setup,
                                       group_teardown);
}
