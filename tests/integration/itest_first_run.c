/* itest_first_run: `duplex serve` as a new user first meets it — ready at
 * once with progress lines while it loads, host names and IPv6 literals for
 * --host, clear errors (and nothing else) for a context over the model's and
 * a model that does not load; one SSE chunk per token whatever the load;
 * 400s that blame the right field; and a waiting queue that turns the newest
 * requests away with 503 + Retry-After instead of preempting in circles. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>

#include "pd_test.h"

static const char *const k_small[] = {"--kv-cache-mb", "16", NULL};

/* ---- start-up ------------------------------------------------------------------ */

/* Ready well before its 1 GiB pool is faulted in; the log says what it is
 * doing, in order. */
static void test_start_progress(void **state)
{
    (void)state;
    char log[160];
    snprintf(log, sizeof log, "%s/start.log", G.dir);
    const char *argv[] = {"serve", "--model", G.model, "--port", "0", NULL}; /* default pool */
    uint64_t t0 = dx_now_ns();
    tp_proc p;
    tp_start(&p, G.bin, log, argv, "duplex serve: model=");
    dx_buf b;
    dx_buf_init(&b, 0);
    while (tc_http(p.http, "GET", "/health", NULL, &b, 10) != 200) tp_sleep_ms(5);
    printf("# ready (health 200) %.0f ms after exec, default 1 GiB pool\n",
           (double)(dx_now_ns() - t0) * 1e-6);
    char text[8192];
    for (int i = 0; i < 3000; i++) { /* the background population reports when done */
        tp_read_log(&p, text, sizeof text);
        if (strstr(text, "faulted in, in the background")) break;
        tp_sleep_ms(20);
    }
    const char *a = strstr(text, "duplex serve: listening on http://127.0.0.1:");
    const char *m = strstr(text, "duplex serve: model loaded in");
    const char *s = strstr(text, "duplex serve: model=");
    const char *f = strstr(text, "KV pool: 1024 MiB faulted in, in the background");
    if (!a || !m || !s || !f || !(a < m && m < s && s < f)) fail_msg("progress lines:\n%s", text);
    dx_buf_free(&b);
    stop_ok(&p);
}

/* A node started with --host H, ready: its port from the start-up line. */
static int start_host(tp_proc *p, const char *host, const char *url_host)
{
    char log[160], key[96];
    snprintf(log, sizeof log, "%s/host-%d.log", G.dir, G.n_logs++);
    char *const argv[] = {(char *)G.bin, "serve", "--model", G.model, "--port", "0", "--host",
                          (char *)host, "--kv-cache-mb", "16", NULL};
    memset(p, 0, sizeof *p);
    assert_int_equal(tp_spawn(p, log, argv), 0);
    snprintf(key, sizeof key, "address=http://%s:", url_host);
    return (int)tp_wait_int(p, key, 60);
}

static long get_health(const char *url)
{
    dx_buf out;
    dx_buf_init(&out, 0);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, tc_on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
    long st = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
    curl_easy_cleanup(c);
    dx_buf_free(&out);
    return st;
}

static void test_hosts(void **state)
{
    (void)state;
    tp_proc p;
    char url[128];
    int port = start_host(&p, "localhost", "localhost");
    assert_true(port > 0);
    snprintf(url, sizeof url, "http://localhost:%d/health", port);
    for (int i = 0; i < 200 && get_health(url) != 200; i++) tp_sleep_ms(10);
    assert_int_equal(get_health(url), 200);
    stop_ok(&p);
    /* IPv6 loopback, with and without brackets, where the machine has it */
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int have6 = fd >= 0 && bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0;
    if (fd >= 0) close(fd);
    if (have6) {
        const char *forms[] = {"::1", "[::1]"};
        for (int k = 0; k < 2; k++) {
            port = start_host(&p, forms[k], "[::1]");
            assert_true(port > 0);
            snprintf(url, sizeof url, "http://[::1]:%d/health", port);
            for (int i = 0; i < 200 && get_health(url) != 200; i++) tp_sleep_ms(10);
            assert_int_equal(get_health(url), 200);
            stop_ok(&p);
        }
    } else {
        printf("# no IPv6 loopback here: --host ::1 not tried\n");
    }
    char args[300];
    snprintf(args, sizeof args, "--model %s --port 0 --host nosuchhost.invalid", G.model);
    tp_expect(G.bin, "serve", 1, "host 'nosuchhost.invalid' does not resolve", args);
}

/* A context over the model's, and a model that does not load: the error,
 * exit 1, and no shutdown chatter. */
static void test_clean_failures(void **state)
{
    (void)state;
    char args[300], cmd[600], out[4096];
    snprintf(args, sizeof args, "--model %s --port 0 --ctx 100000", G.model);
    tp_expect(G.bin, "serve", 1, "--ctx 100000 is over the model's context length of", args);
    tp_expect(G.bin, "serve", 1, "/nonexistent.gguf: cannot open",
              "--model /nonexistent.gguf --port 0");
    const char *cases[] = {args, "--model /nonexistent.gguf --port 0"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s serve %s 2>&1", G.bin, cases[i]);
        FILE *f = popen(cmd, "r");
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = 0;
        pclose(f);
        if (strstr(out, "shutdown")) fail_msg("chatter after a failed start:\n%s", out);
    }
}

/* ---- serving ----------------------------------------------------------------------- */

/* The text of each content event of an SSE body, in order. */
static json_t *chunks_of(const dx_buf *b)
{
    json_t *list = json_array();
    const char *p = b->data;
    while ((p = strstr(p, "data: {"))) {
        const char *end = strstr(p, "\n\n");
        json_error_t je;
        json_t *v = json_loadb(p + 6, (size_t)(end - p - 6), JSON_ALLOW_NUL, &je);
        assert_non_null(v);
        json_t *t = json_object_get(json_array_get(json_object_get(v, "choices"), 0), "text");
        if (json_is_string(t) && json_string_length(t)) json_array_append(list, t);
        json_decref(v);
        p = end;
    }
    return list;
}

/* The same greedy stream alone and among 6 others: the same chunks, one
 * token's text each. */
static void test_one_token_per_chunk(void **state)
{
    (void)state;
    tp_proc p;
    node_start(&p, "chunks", k_small);
    const char *body = "{\"model\":\"duplex-synth-qwen3-tiny-f32\",\"prompt\":\"the cache\","
                       "\"max_tokens\":64,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}";
    dx_buf alone;
    dx_buf_init(&alone, 0);
    assert_int_equal(tc_http(p.http, "POST", "/v1/completions", body, &alone, 60), 200);
    json_t *a = chunks_of(&alone);
    assert_true(json_array_size(a) >= 48); /* most of the 64 tokens have text of their own */
    CURLM *m = curl_multi_init();
    CURL *h[7];
    dx_buf out[7];
    struct curl_slist *sl[7];
    for (int i = 0; i < 7; i++) {
        dx_buf_init(&out[i], 0);
        h[i] = tc_curl(p.http, "POST", "/v1/completions", body, &out[i], &sl[i], 60);
        curl_multi_add_handle(m, h[i]);
    }
    tc_multi_run(m);
    for (int i = 0; i < 7; i++) {
        json_t *b = chunks_of(&out[i]);
        if (!json_equal(a, b)) fail_msg("stream %d under load is chunked differently", i);
        json_decref(b);
        curl_multi_remove_handle(m, h[i]);
        curl_easy_cleanup(h[i]);
        curl_slist_free_all(sl[i]);
        dx_buf_free(&out[i]);
    }
    curl_multi_cleanup(m);
    json_decref(a);
    dx_buf_free(&alone);
    stop_ok(&p);
}

static void expect_400(const tp_proc *p, const char *path, const char *body, const char *param)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    long st = tc_http(p->http, "POST", path, body, &b, 60);
    if (st != 400) fail_msg("%s: %ld %s", body, st, b.data);
    json_t *v = tc_json(&b);
    json_t *pm = json_object_get(json_object_get(v, "error"), "param");
    if (!json_is_string(pm) || strcmp(json_string_value(pm), param))
        fail_msg("%s: param is not %s: %s", body, param, b.data);
    json_decref(v);
    dx_buf_free(&b);
}

/* An over-long prompt blames the prompt (messages for chat), a prompt that
 * fits with too many max_tokens blames max_tokens; 16 stop strings are the
 * documented limit. */
static void test_param_names(void **state)
{
    (void)state;
    const char *args[] = {"--kv-cache-mb", "16", "--ctx", "64", NULL};
    tp_proc p;
    node_start(&p, "params", args);
    dx_buf ids, words_b, body;
    dx_buf_init(&ids, 0);
    dx_buf_init(&words_b, 0);
    dx_buf_init(&body, 0);
    for (int i = 0; i < 70; i++) dx_buf_printf(&ids, "%s%d", i ? "," : "", 100 + i);
    dx_buf_printf(&body, "{\"model\":\"duplex-synth-qwen3-tiny-f32\",\"prompt\":[%s]}", ids.data);
    expect_400(&p, "/v1/completions", body.data, "prompt");
    for (int i = 0; i < 80; i++) dx_buf_puts(&words_b, "word ");
    dx_buf_reset(&body);
    dx_buf_printf(&body, "{\"model\":\"duplex-synth-qwen3-tiny-f32\",\"messages\":[{\"role\":"
                         "\"user\",\"content\":\"%s\"}]}", words_b.data);
    expect_400(&p, "/v1/chat/completions", body.data, "messages");
    expect_400(&p, "/v1/completions",
               "{\"model\":\"duplex-synth-qwen3-tiny-f32\",\"prompt\":[1,2,3],\"max_tokens\":62}",
               "max_tokens");
    dx_buf_reset(&body);
    dx_buf_puts(&body, "{\"model\":\"duplex-synth-qwen3-tiny-f32\",\"prompt\":\"x\",\"max_tokens\":2,"
                       "\"stop\":[");
    for (int i = 0; i < 17; i++) dx_buf_printf(&body, "%s\"s%d\"", i ? "," : "", i);
    dx_buf_puts(&body, "]}");
    expect_400(&p, "/v1/completions", body.data, "stop");
    char *sixteen = strstr(body.data, ",\"s16\"");
    memmove(sixteen, sixteen + 6, strlen(sixteen + 6) + 1);
    dx_buf out;
    dx_buf_init(&out, 0);
    assert_int_equal(tc_http(p.http, "POST", "/v1/completions", body.data, &out, 60), 200);
    dx_buf_free(&out);
    dx_buf_free(&ids);
    dx_buf_free(&words_b);
    dx_buf_free(&body);
    stop_ok(&p);
}

static size_t on_header(char *p, size_t sz, size_t n, void *user)
{
    if (sz * n >= 12 && !strncasecmp(p, "Retry-After:", 12)) *(int *)user = 1;
    return sz * n;
}

/* --max-waiting 1 and 12 concurrent requests that a 40-block pool cannot
 * hold at once: the newest are turned away with 503 + Retry-After (a stream
 * too, before its head), the rest finish, and no request is preempted over
 * and over. */
static void test_waiting_queue_sheds(void **state)
{
    (void)state;
    const char *args[] = {"--kv-blocks", "40", "--max-waiting", "1", NULL};
    tp_proc p;
    node_start(&p, "queue", args);
    enum { N = 12 };
    CURLM *m = curl_multi_init();
    CURL *h[N];
    dx_buf out[N];
    struct curl_slist *sl[N];
    int retry[N];
    char body[N][256];
    for (int i = 0; i < N; i++) {
        snprintf(body[i], sizeof body[i],
                 "{\"model\":\"duplex-synth-qwen3-tiny-f32\",\"prompt\":\"request %d of the burst\","
                 "\"max_tokens\":100,\"ignore_eos\":true,\"stream\":%s}",
                 i, i % 2 ? "true" : "false");
        dx_buf_init(&out[i], 0);
        retry[i] = 0;
        h[i] = tc_curl(p.http, "POST", "/v1/completions", body[i], &out[i], &sl[i], 120);
        curl_easy_setopt(h[i], CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h[i], CURLOPT_HEADERDATA, &retry[i]);
        curl_multi_add_handle(m, h[i]);
    }
    tc_multi_run(m);
    int ok = 0, busy = 0;
    for (int i = 0; i < N; i++) {
        long st = 0;
        curl_easy_getinfo(h[i], CURLINFO_RESPONSE_CODE, &st);
        tc_terminate(&out[i]);
        if (st == 200) {
            ok++;
            assert_null(strstr(out[i].data, "\"error\""));
        } else if (st == 503) {
            busy++;
            assert_true(retry[i]);
            assert_non_null(strstr(out[i].data, "server busy"));
        } else {
            fail_msg("request %d: %ld %s", i, st, out[i].data);
        }
        curl_multi_remove_handle(m, h[i]);
        curl_easy_cleanup(h[i]);
        curl_slist_free_all(sl[i]);
        dx_buf_free(&out[i]);
    }
    curl_multi_cleanup(m);
    printf("# %d answered, %d turned away, %ld preemptions\n", ok, busy,
           metric(&p, "duplex_preemptions_total"));
    assert_true(busy > 0 && ok > 0);
    assert_true(metric(&p, "duplex_preemptions_total") <= N);
    stop_ok(&p);
}

static int setup(void **state)
{
    (void)state;
    return pdt_setup("first_run");
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_progress),   cmocka_unit_test(test_hosts),
        cmocka_unit_test(test_clean_failures),   cmocka_unit_test(test_one_token_per_chunk),
        cmocka_unit_test(test_param_names),      cmocka_unit_test(test_waiting_queue_sheds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
