/* Integration test: the attacks of issue 13's hostile testing, replayed
 * against real `duplex serve` and `duplex router` processes on loopback
 * (a synthesised tiny model), each answered as docs/api.md "Limits" says:
 *
 *  - a chat request with 560,000 messages (it once overflowed the loop
 *    thread's stack) and one over the message limit: 400 naming it;
 *  - a client dripping a byte now and then: 408 at the request's deadline,
 *    headers and body alike (the timeout used to restart on every byte);
 *  - partial 15 MiB bodies: the bytes all connections hold stay within the
 *    buffer budget, the connection that crosses it gets 503 + Retry-After,
 *    and the memory is released when they go;
 *  - connections: per-peer and total caps, idle keep-alive connections
 *    making way, the reserve for a trusted peer and for /health, 503 when
 *    nothing is left (different peers are different loopback addresses,
 *    127.0.0.2 and up);
 *  - many concurrent requests against --max-seqs 2 --max-waiting 2: every
 *    answer is a complete 200 or a 503 with Retry-After, never a 500 and
 *    never a 200 that ends in an error event, on the node and through the
 *    router;
 *  - stop strings: 16 of 250 kB are a 400; the largest accepted set, built so
 *    that a per-token rescan would be slow, gives the exact answer;
 *  - HTTP/9.9 → 505, HEAD like GET without the body, a chunked body that
 *    declares more than the limit → 413 before any of it arrives.
 *
 * Nothing here asserts a duration: each attack is answered while the client
 * is still attacking (it stops at a generous bound, and failing that fails). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../test_client.h"
#include "../test_proc.h"
#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "model/synth.h"

static struct {
    const char *bin;
    char dir[64], model_path[128], model[128];
    tp_proc big, caps, busy, router; /* nodes: 16 MiB bodies; small caps; --max-seqs 2 */
    int big_port, caps_port, busy_port, router_port;
} G;

/* ---- processes ------------------------------------------------------------- */

/* Starts `duplex serve` (or, with router_of, `duplex router` in front of
 * that port) with the extra flags (NULL-terminated) and waits for /health. */
static int start(tp_proc *p, const char *name, int router_of, ...)
{
    char log[160], up[64];
    snprintf(log, sizeof log, "%s/%s.log", G.dir, name);
    snprintf(up, sizeof up, "http://127.0.0.1:%d", router_of);
    char *argv[48] = {(char *)G.bin};
    int n = 1;
    if (router_of) {
        char *r[] = {"router", "--decode", up, "--port", "0", "--health-interval-ms", "100"};
        for (size_t i = 0; i < DX_ARRAY_LEN(r); i++) argv[n++] = r[i];
    } else {
        char *s[] = {"serve", "--model",       G.model_path, "--port", "0",   "--threads",
                     "1",     "--kv-cache-mb", "32",         "--ctx",  "1024"};
        for (size_t i = 0; i < DX_ARRAY_LEN(s); i++) argv[n++] = s[i];
    }
    va_list ap;
    va_start(ap, router_of);
    for (char *a; (a = va_arg(ap, char *)) && n < 46;) argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    if (tp_spawn(p, log, argv)) return 0;
    int port = (int)tp_wait_int(p, "address=http://127.0.0.1:", 60);
    dx_buf b;
    dx_buf_init(&b, 0);
    int ok = 0;
    for (int i = 0; port > 0 && !ok && i < 1200; i++) {
        ok = tc_http(port, "GET", "/health", NULL, &b, 10) == 200;
        if (!ok) tp_sleep_ms(50);
    }
    dx_buf_free(&b);
    if (!ok) tp_log_tail(p, 20);
    return ok ? port : 0;
}

static int group_setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    G.bin = getenv("DUPLEX_BIN");
    if (!G.bin) G.bin = "build/release/duplex";
    snprintf(G.dir, sizeof G.dir, "/tmp/dx_itest_hostile_XXXXXX");
    if (!mkdtemp(G.dir)) return -1;
    snprintf(G.model_path, sizeof G.model_path, "%s/tiny.gguf", G.dir);
    synth_config c = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 3};
    if (synth_write(&c, G.model_path)) return -1;
    G.big_port = start(&G.big, "big", 0, "--max-body-mb", "16", "--max-buffer-mb", "40",
                       "--request-timeout-ms", "1000", NULL);
    G.caps_port = start(&G.caps, "caps", 0, "--max-conns", "64", "--max-conns-per-peer", "16",
                        "--trusted-peer", "127.0.0.3", "--request-timeout-ms", "60000", NULL);
    G.busy_port =
        start(&G.busy, "busy", 0, "--max-seqs", "2", "--max-waiting", "2", "--ctx", "4096", NULL);
    G.router_port = start(&G.router, "router", G.busy_port, "--max-body-mb", "16",
                          "--request-timeout-ms", "1000", NULL);
    int ok = G.big_port && G.caps_port && G.busy_port && G.router_port;
    return ok ? tc_model_id(G.big_port, G.model, sizeof G.model) : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    int bad = 0;
    tp_proc *ps[] = {&G.router, &G.big, &G.caps, &G.busy};
    for (size_t i = 0; i < DX_ARRAY_LEN(ps); i++) bad |= tp_stop_clean(ps[i]) != 0;
    tp_rm_rf(G.dir);
    return bad ? -1 : 0;
}

/* ---- raw clients ------------------------------------------------------------- */

/* A connection to 127.0.0.1:port from the loopback address `from`
 * (127.0.0.2 and up are other peers to the server). */
static int connect_from(int port, const char *from)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in src = {.sin_family = AF_INET};
    inet_pton(AF_INET, from, &src.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof src), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return; /* the server answered and closed: read its answer */
        p += w;
        n -= (size_t)w;
    }
}

static void send_str(int fd, const char *s)
{
    send_all(fd, s, strlen(s));
}

/* Whether the server has said something (or closed) on fd. */
static int readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1;
}

/* The answer on fd (until the server closes it, at most 30 s), reset first. */
static void read_answer(int fd, dx_buf *out)
{
    dx_buf_reset(out);
    tc_raw_read_all(fd, out, 30000);
}

static void assert_status(const dx_buf *b, int status)
{
    char want[32];
    snprintf(want, sizeof want, "HTTP/1.1 %d ", status);
    if (!b->data || strncmp(b->data, want, strlen(want)) != 0)
        fail_msg("want %s, got: %.200s", want, b->data ? b->data : "(nothing)");
}

/* A request on a fresh connection from `from`, its whole answer. */
static void exchange_from(int port, const char *from, const char *req, dx_buf *out)
{
    int fd = connect_from(port, from);
    send_str(fd, req);
    read_answer(fd, out);
    close(fd);
}

static void exchange(int port, const char *req, dx_buf *out)
{
    exchange_from(port, "127.0.0.1", req, out);
}

static double metric(int port, const char *series)
{
    return tc_metric_or(port, series, -1);
}

/* ---- tests ------------------------------------------------------------------ */

/* n chat messages with empty contents, as a request body. */
static char *many_messages(size_t n)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_printf(&b, "{\"model\":\"%s\",\"max_tokens\":1,\"messages\":[", G.model);
    for (size_t i = 0; i < n; i++)
        dx_buf_puts(&b, i ? ",{\"role\":\"user\",\"content\":\"\"}"
                          : "{\"role\":\"user\",\"content\":\"\"}");
    dx_buf_puts(&b, "]}");
    return dx_buf_take(&b);
}

static void expect_400(int port, const char *path, const char *body, const char *param,
                       const char *says)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    long st = tc_http(port, "POST", path, body, &b, 120);
    if (st != 400) fail_msg("status %ld, want 400: %.300s", st, b.data);
    json_t *v = tc_json(&b), *e = json_object_get(v, "error");
    assert_string_equal(json_string_value(json_object_get(e, "param")), param);
    const char *msg = json_string_value(json_object_get(e, "message"));
    if (!msg || !strstr(msg, says)) fail_msg("message '%s' lacks '%s'", msg, says);
    json_decref(v);
    dx_buf_free(&b);
}

/* 560,000 messages fit in 16 MiB, and parse into a ~170 MB tree: the
 * router (a 256 MiB budget) builds it and answers 400 naming the limit;
 * the node, whose --max-buffer-mb 40 the tree would pass, refuses it while
 * it is parsed: 503 with Retry-After, never the whole tree.  16,385
 * messages are a 400 from both (the same parser), and both keep serving. */
static void test_many_messages(void **state)
{
    (void)state;
    char *huge = many_messages(560000), *over = many_messages(16385);
    int ports[] = {G.big_port, G.router_port};
    for (int i = 0; i < 2; i++) {
        dx_buf b;
        dx_buf_init(&b, 0);
        if (ports[i] == G.router_port) {
            expect_400(ports[i], "/v1/chat/completions", huge, "messages", "at most 16384");
        } else {
            long st = tc_http(ports[i], "POST", "/v1/chat/completions", huge, &b, 120);
            if (st != 503 || !strstr(b.data, "too much request data"))
                fail_msg("560,000 messages at the node: %ld %.300s", st, b.data);
        }
        expect_400(ports[i], "/v1/chat/completions", over, "messages", "at most 16384");
        assert_int_equal(tc_http(ports[i], "GET", "/health", NULL, &b, 30), 200);
        dx_buf_free(&b);
    }
    dx_free(huge);
    dx_free(over);
}

/* Sends `head`, then `drip` one byte at a time (50 ms apart) until the
 * server answers; that answer must be a 408 before the drip runs out. */
static void drip_until_408(int port, const char *head, char drip, int max_drips)
{
    int fd = connect_from(port, "127.0.0.1");
    send_str(fd, head);
    int i = 0;
    for (; i < max_drips && !readable(fd, 50); i++) send_all(fd, &drip, 1);
    if (i == max_drips) fail_msg("no answer after %d bytes dripped: the deadline moved", i);
    dx_buf b;
    dx_buf_init(&b, 0);
    read_answer(fd, &b);
    assert_status(&b, 408);
    close(fd);
    dx_buf_free(&b);
}

/* --request-timeout-ms 1000 is a deadline from the first byte: a byte every
 * 50 ms (400 of them: 20 s) does not hold a request open, in the headers or
 * the body, on the node and on the router. */
static void test_drip(void **state)
{
    (void)state;
    int ports[] = {G.big_port, G.router_port};
    double before = metric(G.big_port, "duplex_http_request_timeouts_total");
    for (int i = 0; i < 2; i++) {
        drip_until_408(ports[i], "GET /health HTTP/1.1\r\nX-Long: ", 'a', 400);
        /* 100000 bytes get 1000 ms + ~95 ms for the body */
        drip_until_408(ports[i], "POST /v1/completions HTTP/1.1\r\nContent-Length: 100000\r\n\r\n",
                       ' ', 400);
    }
    assert_true(metric(G.big_port, "duplex_http_request_timeouts_total") >= before + 2);
}

/* Sends a 16 MiB body's first 15 MiB on a new connection from `from`. */
static int partial_body(int port, const char *from)
{
    int fd = connect_from(port, from);
    send_str(fd, "POST /v1/completions HTTP/1.1\r\nContent-Length: 16777216\r\n\r\n");
    size_t n = 15u << 20;
    char *junk = malloc(n);
    memset(junk, ' ', n);
    send_all(fd, junk, n);
    free(junk);
    return fd;
}

/* --max-buffer-mb 40 with --max-body-mb 16: two 15 MiB partial bodies are
 * held (their deadline is 17 s away), the third crosses the budget and gets
 * 503 with Retry-After, /health still answers, and the memory goes back
 * when the clients go. */
static void test_buffer_budget(void **state)
{
    (void)state;
    int port = G.big_port;
    int a = partial_body(port, "127.0.0.2"), b = partial_body(port, "127.0.0.3");
    double held = 0;
    for (int i = 0; i < 600 && held < 30.0 * (1 << 20); i++) {
        held = metric(port, "duplex_http_buffered_bytes");
        if (held < 30.0 * (1 << 20)) tp_sleep_ms(50);
    }
    assert_true(held >= 30.0 * (1 << 20) && held <= 40.0 * (1 << 20));
    int c = partial_body(port, "127.0.0.4");
    dx_buf out;
    dx_buf_init(&out, 0);
    read_answer(c, &out);
    assert_status(&out, 503);
    assert_non_null(strstr(out.data, "\r\nRetry-After: 1\r\n"));
    close(c);
    assert_true(metric(port, "duplex_http_buffered_bytes") <= 40.0 * (1 << 20));
    assert_true(metric(port, "duplex_http_refused_buffer_total") >= 1);
    assert_int_equal(tc_http(port, "GET", "/health", NULL, &out, 30), 200);
    close(a);
    close(b);
    for (int i = 0; i < 600 && held > (1 << 20); i++) {
        held = metric(port, "duplex_http_buffered_bytes");
        if (held > (1 << 20)) tp_sleep_ms(50);
    }
    assert_true(held <= (1 << 20));
    dx_buf_free(&out);
}

/* A body of many tiny values parses into a tree ~16 times its size: that
 * tree counts in --max-buffer-mb (40) as it is built, so 4 MiB of zeros
 * (a ~64 MiB tree: more than the whole budget) is refused with 503 while
 * it is parsed, before the tree exists (and leaves nothing counted), while
 * 1 MiB (a ~16 MiB tree) is served. */
static void test_parsed_tree_budget(void **state)
{
    (void)state;
    int port = G.big_port;
    dx_buf body, out;
    dx_buf_init(&body, 0);
    dx_buf_init(&out, 0);
    double refused = metric(port, "duplex_http_refused_buffer_total");
    static const size_t mib[] = {4, 1};
    for (size_t k = 0; k < DX_ARRAY_LEN(mib); k++) {
        body.len = 0;
        dx_buf_printf(&body, "{\"model\":\"%s\",\"prompt\":\"hi\",\"max_tokens\":1,\"x\":[0",
                      G.model);
        while (body.len < (mib[k] << 20)) dx_buf_puts(&body, ",0,0,0,0,0,0,0,0");
        dx_buf_puts(&body, "]}");
        long st = tc_http(port, "POST", "/v1/completions", body.data, &out, 120);
        if (mib[k] == 4) {
            if (st != 503 || !strstr(out.data, "too much request data"))
                fail_msg("4 MiB of zeros: %ld %s", st, out.data);
            assert_true(metric(port, "duplex_http_refused_buffer_total") >= refused + 1);
        } else if (st != 200) {
            fail_msg("1 MiB of zeros: %ld %s", st, out.data);
        }
    }
    double held = 1e30;
    for (int i = 0; i < 600 && held > (1 << 20); i++) {
        held = metric(port, "duplex_http_buffered_bytes");
        if (held > (1 << 20)) tp_sleep_ms(50);
    }
    assert_true(held <= (1 << 20));
    dx_buf_free(&body);
    dx_buf_free(&out);
}

static const char k_health[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

/* A completion request's bytes (Connection: close). */
static void completion_req(char *out, size_t cap)
{
    char body[256];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"hi\",\"max_tokens\":2}", G.model);
    snprintf(out, cap,
             "POST /v1/completions HTTP/1.1\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(body), body);
}

/* Opens n connections from `from`.  kind 0: idle, never used; 1: idle
 * between requests (one answered, kept alive); 2: a request begun and never
 * finished (not idle: it cannot be closed to make room). */
static void open_n(int *fds, int n, const char *from, int kind)
{
    for (int i = 0; i < n; i++) {
        fds[i] = connect_from(G.caps_port, from);
        if (kind == 2) send_str(fds[i], "GET /hea");
        if (kind != 1) continue;
        send_str(fds[i], "GET /health HTTP/1.1\r\n\r\n");
        char buf[512] = "";
        ssize_t got = 0;
        while (!strstr(buf, "{\"status\":\"ok\"}")) { /* the whole answer */
            assert_true(readable(fds[i], 30000));
            ssize_t k = read(fds[i], buf + got, sizeof buf - 1 - (size_t)got);
            assert_true(k > 0);
            got += k;
            buf[got] = 0;
        }
    }
}

/* A series from /metrics, asked from the trusted peer 127.0.0.3 (a server
 * out of connections still has room for it); -1 if absent. */
static double caps_metric(const char *series)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    exchange_from(G.caps_port, "127.0.0.3", "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
                  &b);
    assert_status(&b, 200);
    char key[160];
    snprintf(key, sizeof key, "\n%s ", series);
    const char *p = strstr(b.data, key);
    double v = p ? strtod(p + strlen(key), NULL) : -1;
    dx_buf_free(&b);
    return v;
}

/* The server holds n connections besides the one asking (cmp > 0: at
 * least n, < 0: at most n). */
static void wait_conns(double n, int cmp)
{
    for (int i = 0; i < 600; i++) {
        double c = caps_metric("duplex_http_connections") - 1;
        if (cmp > 0 ? c >= n : c <= n) return;
        tp_sleep_ms(20);
    }
    fail_msg(
        "the server never held %s %g connections (%g, %g of them for /health only, %g refused)",
        cmp > 0 ? "at least" : "at most", n, caps_metric("duplex_http_connections") - 1,
        caps_metric("duplex_http_connections_health_only"),
        caps_metric("duplex_http_refused_connections_total"));
}

/* --max-conns 64 (the last 4 in reserve: 2 for GET /health, the rest for
 * --trusted-peer 127.0.0.3), --max-conns-per-peer 16. */
static void test_connection_caps(void **state)
{
    (void)state;
    int port = G.caps_port, idle[60], part[60], extra[4];
    char req[512];
    completion_req(req, sizeof req);
    dx_buf b;
    dx_buf_init(&b, 0);
    /* per peer: a 17th connection from one address may ask for /health only */
    open_n(idle, 16, "127.0.0.2", 0);
    wait_conns(16, 1);
    exchange(port, req, &b); /* from 127.0.0.1: its own share */
    assert_status(&b, 200);
    int fd = connect_from(port, "127.0.0.2");
    send_str(fd, req);
    read_answer(fd, &b);
    close(fd);
    assert_status(&b, 503);
    assert_non_null(strstr(b.data, "\r\nRetry-After: 1\r\n"));
    fd = connect_from(port, "127.0.0.2");
    send_str(fd, k_health);
    read_answer(fd, &b); /* answered, then closed */
    close(fd);
    assert_status(&b, 200);
    /* 60 connections idle between requests fill the shared slots; a
     * newcomer makes the longest idle one go */
    for (int i = 0; i < 16; i++) close(idle[i]);
    wait_conns(0, -1);
    open_n(idle, 15, "127.0.0.2", 1);
    open_n(idle + 15, 15, "127.0.0.4", 1);
    open_n(idle + 30, 15, "127.0.0.5", 1);
    open_n(idle + 45, 15, "127.0.0.6", 1);
    wait_conns(60, 1);
    double evicted = caps_metric("duplex_http_evicted_idle_total");
    exchange(port, req, &b);
    assert_status(&b, 200);
    assert_true(caps_metric("duplex_http_evicted_idle_total") >= evicted + 1);
    assert_true(readable(idle[0], 10000)); /* the oldest: closed by the server */
    assert_int_equal(read(idle[0], req + 500, 1), 0);
    for (int i = 0; i < 60; i++) close(idle[i]);
    wait_conns(0, -1);
    /* 60 requests in progress cannot make way: /health and the trusted peer
     * still get in, others get 503 */
    completion_req(req, sizeof req);
    open_n(part, 15, "127.0.0.2", 2);
    open_n(part + 15, 15, "127.0.0.4", 2);
    open_n(part + 30, 15, "127.0.0.5", 2);
    open_n(part + 45, 15, "127.0.0.6", 2);
    wait_conns(60, 1);
    fd = connect_from(port, "127.0.0.7");
    send_str(fd, k_health);
    read_answer(fd, &b);
    close(fd);
    assert_status(&b, 200);
    fd = connect_from(port, "127.0.0.7");
    send_str(fd, req);
    read_answer(fd, &b);
    close(fd);
    assert_status(&b, 503);
    fd = connect_from(port, "127.0.0.3"); /* trusted: the reserve */
    send_str(fd, req);
    read_answer(fd, &b);
    close(fd);
    assert_status(&b, 200);
    /* the /health slots taken too: a newcomer is told 503 at once, the
     * trusted peer still gets in */
    for (int i = 0; i < 2; i++) {
        extra[i] = connect_from(port, "127.0.0.8");
        send_str(extra[i], "GET /hea");
    }
    wait_conns(62, 1);
    double refused = caps_metric("duplex_http_refused_connections_total");
    fd = connect_from(port, "127.0.0.9");
    read_answer(fd, &b);
    close(fd);
    assert_status(&b, 503);
    assert_true(caps_metric("duplex_http_refused_connections_total") >= refused + 1);
    fd = connect_from(port, "127.0.0.3");
    send_str(fd, req);
    read_answer(fd, &b);
    close(fd);
    assert_status(&b, 200);
    for (int i = 0; i < 60; i++) close(part[i]);
    for (int i = 0; i < 2; i++) close(extra[i]);
    wait_conns(0, -1);
    assert_int_equal(tc_http(port, "GET", "/health", NULL, &b, 30), 200);
    dx_buf_free(&b);
}

/* ---- capacity -------------------------------------------------------------------- */

typedef struct {
    dx_buf body, head;
    struct curl_slist *hdrs;
    char req[512];
    int stream;
} call;

static size_t on_header(char *p, size_t sz, size_t n, void *user)
{
    return dx_buf_append(user, p, sz * n) == 0 ? sz * n : 0;
}

/* An answer is a complete 200 (the whole answer; a stream ends with its
 * finish and [DONE], without an error event) or a 503 with Retry-After. */
static int check_answer(call *k, long status, int chat)
{
    tc_terminate(&k->body);
    tc_terminate(&k->head);
    if (status == 503) {
        if (!strstr(k->head.data, "Retry-After: 1")) fail_msg("503 without Retry-After");
        return 503;
    }
    if (status != 200) fail_msg("status %ld: %.300s", status, k->body.data);
    if (k->stream) {
        if (strstr(k->body.data, "\"error\"")) fail_msg("200 then an error: %s", k->body.data);
        dx_buf t;
        dx_buf_init(&t, 0);
        char finish[32];
        int u;
        tc_parse_sse(&k->body, chat, &t, finish, &u); /* [DONE] checked */
        assert_string_equal(finish, "length");
        dx_buf_free(&t);
    } else {
        json_t *v = tc_json(&k->body), *ch = json_array_get(json_object_get(v, "choices"), 0);
        assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
        json_decref(v);
    }
    return 200;
}

/* n requests at once to port (half streamed, chat and completions mixed);
 * counts the 200s and 503s (anything else fails). */
static void storm(int port, int n, int max_tokens, int *ok, int *busy)
{
    CURLM *m = curl_multi_init();
    call *k = calloc((size_t)n, sizeof *k);
    CURL **c = calloc((size_t)n, sizeof *c);
    for (int i = 0; i < n; i++) {
        int chat = i % 4 < 2;
        k[i].stream = i % 2;
        dx_buf_init(&k[i].body, 0);
        dx_buf_init(&k[i].head, 0);
        if (chat)
            snprintf(k[i].req, sizeof k[i].req,
                     "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"s%d\"}],"
                     "\"max_tokens\":%d,\"ignore_eos\":true,\"stream\":%s}",
                     G.model, i, max_tokens, k[i].stream ? "true" : "false");
        else
            snprintf(k[i].req, sizeof k[i].req,
                     "{\"model\":\"%s\",\"prompt\":\"s%d\",\"max_tokens\":%d,\"ignore_eos\":true,"
                     "\"stream\":%s}",
                     G.model, i, max_tokens, k[i].stream ? "true" : "false");
        c[i] = tc_curl(port, "POST", chat ? "/v1/chat/completions" : "/v1/completions", k[i].req,
                       &k[i].body, &k[i].hdrs, 120);
        curl_easy_setopt(c[i], CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c[i], CURLOPT_HEADERDATA, &k[i].head);
        curl_multi_add_handle(m, c[i]);
    }
    tc_multi_run(m);
    *ok = *busy = 0;
    for (int i = 0; i < n; i++) {
        long st = 0;
        curl_easy_getinfo(c[i], CURLINFO_RESPONSE_CODE, &st);
        if (check_answer(&k[i], st, i % 4 < 2) == 200)
            ++*ok;
        else
            ++*busy;
        curl_multi_remove_handle(m, c[i]);
        curl_easy_cleanup(c[i]);
        curl_slist_free_all(k[i].hdrs);
        dx_buf_free(&k[i].body);
        dx_buf_free(&k[i].head);
    }
    curl_multi_cleanup(m);
    free(k);
    free(c);
}

/* A stream that runs long (4000 tokens), read until it has begun when
 * `running`; the caller closes it. */
static int long_stream(int port, int running)
{
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"long\",\"max_tokens\":4000,\"ignore_eos\":true,"
             "\"stream\":true}",
             G.model);
    if (running) return tc_raw_stream_open(port, "/v1/completions", body, 200);
    char rq[512];
    snprintf(rq, sizeof rq, "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    int fd = connect_from(port, "127.0.0.1");
    send_str(fd, rq);
    return fd;
}

static void wait_engine(int port, double running, double waiting)
{
    for (int i = 0; i < 1200; i++) {
        if (metric(port, "duplex_requests_running") == running &&
            metric(port, "duplex_requests_waiting") == waiting)
            return;
        tp_sleep_ms(25);
    }
    fail_msg("the engine never had %g running and %g waiting", running, waiting);
}

/* --max-seqs 2 --max-waiting 2: admission is decided once, before anything
 * is sent.  A storm of 64 gets complete 200s and 503s with Retry-After only;
 * with the four places taken, every other request is a 503 — on the node
 * and through the router (which passes the 503 and its Retry-After on). */
static void test_capacity(void **state)
{
    (void)state;
    int ok, busy;
    for (int round = 0; round < 3; round++) {
        storm(G.busy_port, 64, 60, &ok, &busy);
        fprintf(stderr, "storm %d on the node: %d answered, %d busy\n", round, ok, busy);
        assert_true(ok >= 4);
    }
    storm(G.router_port, 32, 60, &ok, &busy);
    fprintf(stderr, "storm through the router: %d answered, %d busy\n", ok, busy);
    assert_true(ok >= 4);
    /* The four places taken by long streams: every other request is a 503.
     * That is asserted when the four are still there after the storms —
     * they only end, so they were there throughout; a machine that
     * generated 4000 tokens while the storms were answered tries again. */
    int checked = 0;
    for (int attempt = 0; attempt < 5 && !checked; attempt++) {
        int fds[4], rok, rbusy;
        for (int i = 0; i < 4; i++) fds[i] = long_stream(G.busy_port, i < 2);
        wait_engine(G.busy_port, 2, 2);
        storm(G.busy_port, 16, 4, &ok, &busy);
        storm(G.router_port, 8, 4, &rok, &rbusy);
        checked = metric(G.busy_port, "duplex_requests_running") == 2 &&
                  metric(G.busy_port, "duplex_requests_waiting") == 2;
        if (checked) {
            assert_int_equal(ok, 0);
            assert_int_equal(busy, 16);
            assert_int_equal(rok, 0);
            assert_int_equal(rbusy, 8);
        }
        for (int i = 0; i < 4; i++) close(fds[i]);
        wait_engine(G.busy_port, 0, 0);
    }
    assert_true(checked);
    assert_int_equal(metric(G.busy_port, "duplex_kv_blocks_used"), 0);
}

/* ---- stop strings ----------------------------------------------------------------- */

/* The id of the token whose text is "x" (the tokenizer's own answer). */
static int token_x(void)
{
    char body[256];
    dx_buf b;
    dx_buf_init(&b, 0);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"x\"}", G.model);
    assert_int_equal(tc_http(G.big_port, "POST", "/tokenize", body, &b, 30), 200);
    json_t *v = tc_json(&b), *t = json_object_get(v, "tokens");
    int id = (int)json_integer_value(json_array_get(t, json_array_size(t) - 1));
    json_decref(v);
    snprintf(body, sizeof body, "{\"tokens\":[%d]}", id);
    assert_int_equal(tc_http(G.big_port, "POST", "/detokenize", body, &b, 30), 200);
    assert_string_equal(b.data, "{\"prompt\":\"x\"}");
    dx_buf_free(&b);
    return id;
}

/* n stop strings of len bytes: "x" * (len/2 - 1), "y", then "x"s. */
static void stops_json(dx_buf *b, int n, size_t len)
{
    dx_buf_puts(b, "\"stop\":[");
    for (int i = 0; i < n; i++) {
        dx_buf_puts(b, i ? ",\"" : "\"");
        for (size_t k = 0; k < len; k++) dx_buf_putc(b, k == len / 2 - 1 ? 'y' : 'x');
        dx_buf_putc(b, '"');
    }
    dx_buf_putc(b, ']');
}

/* 16 stop strings of 250 kB: 400 naming the limit.  The largest set that is
 * accepted (16 of 4 KiB, each an "x" run broken by one "y"), against a
 * reply of 1,000 "x" tokens (forced with logit_bias): every suffix of the
 * reply matches each string up to its "y", the worst case for a rescan; the
 * answer is exactly the 1,000 "x" (no stop string occurs).  A run of 700
 * "x" as a stop string stops the reply at its 700th token. */
static void test_stop_strings(void **state)
{
    (void)state;
    int x = token_x();
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_printf(&b, "{\"model\":\"%s\",\"prompt\":\"go\",\"max_tokens\":8,", G.model);
    stops_json(&b, 16, 250000);
    dx_buf_putc(&b, '}');
    expect_400(G.big_port, "/v1/completions", b.data, "stop", "at most 65536");
    int ports[] = {G.big_port, G.router_port};
    for (int p = 0; p < 2; p++) {
        dx_buf_reset(&b);
        dx_buf_printf(&b,
                      "{\"model\":\"%s\",\"prompt\":\"go\",\"max_tokens\":1000,\"ignore_eos\":true,"
                      "\"temperature\":0,\"logit_bias\":{\"%d\":100},",
                      G.model, x);
        stops_json(&b, 16, 4096);
        dx_buf_putc(&b, '}');
        dx_buf out, text;
        dx_buf_init(&out, 0);
        dx_buf_init(&text, 0);
        assert_int_equal(tc_http(ports[p], "POST", "/v1/completions", b.data, &out, 300), 200);
        tc_answer_text(&out, 0, &text);
        assert_int_equal(text.len, 1000);
        for (size_t i = 0; i < text.len; i++) assert_int_equal(text.data[i], 'x');
        dx_buf_reset(&b);
        dx_buf_printf(&b,
                      "{\"model\":\"%s\",\"prompt\":\"go\",\"max_tokens\":1000,\"ignore_eos\":true,"
                      "\"logit_bias\":{\"%d\":100},\"stop\":[\"y\",\"",
                      G.model, x);
        for (int i = 0; i < 700; i++) dx_buf_putc(&b, 'x');
        dx_buf_puts(&b, "\"]}");
        assert_int_equal(tc_http(ports[p], "POST", "/v1/completions", b.data, &out, 300), 200);
        json_t *v = tc_json(&out), *ch = json_array_get(json_object_get(v, "choices"), 0);
        assert_string_equal(json_string_value(json_object_get(ch, "text")), "");
        assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
        assert_int_equal(
            json_integer_value(json_object_get(json_object_get(v, "usage"), "completion_tokens")),
            700);
        json_decref(v);
        dx_buf_free(&out);
        dx_buf_free(&text);
    }
    dx_buf_free(&b);
}

/* ---- HTTP ------------------------------------------------------------------------ */

/* HTTP/9.9 and HTTP/2.0 are 505; HEAD is GET without the body; 405 says
 * what is allowed; a chunk declaring more than the body limit is a 413
 * before its bytes are sent — on the node and on the router. */
static void test_http_edges(void **state)
{
    (void)state;
    int ports[] = {G.big_port, G.router_port};
    dx_buf b;
    dx_buf_init(&b, 0);
    for (int p = 0; p < 2; p++) {
        int port = ports[p];
        exchange(port, "GET /health HTTP/9.9\r\n\r\n", &b);
        assert_status(&b, 505);
        exchange(port, "GET /health HTTP/2.0\r\nHost: x\r\n\r\n", &b);
        assert_status(&b, 505);
        exchange(port, "GET /health HTTP/1.0\r\n\r\n", &b);
        assert_status(&b, 200);
        exchange(port, "HEAD /health HTTP/1.1\r\nConnection: close\r\n\r\n", &b);
        assert_status(&b, 200);
        assert_non_null(strstr(b.data, "\r\nContent-Length: 15\r\n")); /* {"status":"ok"} */
        const char *end = strstr(b.data, "\r\n\r\n");
        assert_non_null(end);
        assert_int_equal(end + 4 - b.data, (long)b.len); /* no body */
        exchange(port, "HEAD /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n", &b);
        assert_status(&b, 200);
        assert_int_equal(strstr(b.data, "\r\n\r\n") + 4 - b.data, (long)b.len);
        exchange(port, "HEAD /v1/completions HTTP/1.1\r\nConnection: close\r\n\r\n", &b);
        assert_status(&b, 405);
        assert_non_null(strstr(b.data, "\r\nAllow: POST\r\n"));
        exchange(port, "POST /health HTTP/1.1\r\nContent-Length: 0\r\n\r\n", &b);
        assert_status(&b, 405);
        assert_non_null(strstr(b.data, "\r\nAllow: GET, HEAD\r\n"));
        /* 0x1000001 = 16 MiB + 1: refused on the chunk header alone */
        int fd = connect_from(port, "127.0.0.1");
        send_str(fd, "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "1000001\r\n");
        read_answer(fd, &b);
        close(fd);
        assert_status(&b, 413);
        /* two chunks that pass it together: refused at the second header */
        fd = connect_from(port, "127.0.0.1");
        send_str(fd, "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "800000\r\n");
        char *half = malloc(8u << 20);
        memset(half, ' ', 8u << 20);
        send_all(fd, half, 8u << 20);
        free(half);
        send_str(fd, "\r\n800001\r\n");
        read_answer(fd, &b);
        close(fd);
        assert_status(&b, 413);
    }
    dx_buf_free(&b);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_messages),   cmocka_unit_test(test_drip),
        cmocka_unit_test(test_buffer_budget),   cmocka_unit_test(test_parsed_tree_budget),
        cmocka_unit_test(test_connection_caps), cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_stop_strings),    cmocka_unit_test(test_http_edges),
    };
    int rc = cmocka_run_group_tests(tests, group_setup, group_teardown);
    curl_global_cleanup();
    return rc;
}
