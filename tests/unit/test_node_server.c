/* Unit tests for src/node/http_conn + node_server over real loopback sockets,
 * with a fake engine behind node_backend (no model needed).
 *
 * The fake engine runs on its own thread like the real one and answers a
 * prompt of byte tokens by echoing the prompt cyclically, one byte per token,
 * so every output is known in advance.  The server's loop runs on a second
 * thread; the tests are clients (libcurl, or raw sockets where the bytes on
 * the wire matter). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "node/node_server.h"
#include "node/oai_req.h"

/* ---- fake engine ------------------------------------------------------- */

#define FAKE_N_CTX 4096

typedef struct fjob {
    struct fjob *next;
    uint64_t id;
    int32_t *prompt;
    size_t n;
    uint32_t max, done;
    int canceled;
    engine_event_fn fn;
    void *user;
} fjob;

typedef struct {
    pthread_mutex_t mu;
    pthread_t th;
    fjob *jobs;
    uint64_t next_id;
    int quit, busy, n_jobs;
    int delay_us;
    uint64_t n_canceled, n_finished;
} fake_engine;

static void fake_emit_done(fjob *j, enum engine_finish f)
{
    engine_event ev = {.type = ENGINE_EV_DONE,
                       .req_id = j->id,
                       .finish = f,
                       .n_prompt = (uint32_t)j->n,
                       .n_cached = 0,
                       .n_gen = j->done};
    j->fn(j->user, &ev);
}

static void fake_step(fake_engine *fe)
{
    fjob **pp = &fe->jobs;
    while (*pp) {
        fjob *j = *pp;
        if (!j->canceled && j->prompt[0] == '!' && j->done == 2) {
            /* a prompt starting with '!' fails after two tokens */
            engine_event ev = {.type = ENGINE_EV_DONE,
                               .req_id = j->id,
                               .finish = ENGINE_FINISH_ERROR,
                               .error = DX_EIO,
                               .error_msg = "fake failure",
                               .n_prompt = (uint32_t)j->n,
                               .n_gen = j->done};
            j->fn(j->user, &ev);
            fe->n_finished++;
            *pp = j->next;
            fe->n_jobs--;
            dx_free(j->prompt);
            dx_free(j);
            continue;
        }
        if (!j->canceled) {
            char c = (char)j->prompt[j->done % j->n];
            int32_t tok = j->prompt[j->done % j->n];
            j->done++;
            engine_event ev = {.type = ENGINE_EV_TOKENS,
                               .req_id = j->id,
                               .tokens = &tok,
                               .n_tokens = 1,
                               .text = &c,
                               .text_len = 1};
            j->fn(j->user, &ev);
        }
        if (j->canceled || j->done == j->max) {
            fake_emit_done(j, j->canceled ? ENGINE_FINISH_CANCELED : ENGINE_FINISH_LENGTH);
            if (j->canceled)
                fe->n_canceled++;
            else
                fe->n_finished++;
            *pp = j->next;
            fe->n_jobs--;
            dx_free(j->prompt);
            dx_free(j);
            continue;
        }
        pp = &j->next;
    }
}

static void *fake_thread(void *arg)
{
    fake_engine *fe = arg;
    for (;;) {
        pthread_mutex_lock(&fe->mu);
        if (fe->quit) {
            /* like engine_destroy: cancel everything, deliver final events */
            for (fjob *j = fe->jobs; j; j = j->next) j->canceled = 1;
            fake_step(fe);
            pthread_mutex_unlock(&fe->mu);
            return NULL;
        }
        fake_step(fe);
        pthread_mutex_unlock(&fe->mu);
        usleep((useconds_t)fe->delay_us);
    }
}

static int fake_submit(void *self, const engine_request *r, uint64_t *id)
{
    fake_engine *fe = self;
    uint32_t max = r->max_tokens ? r->max_tokens : 8;
    if (r->n_prompt == 0) return dx_errf(DX_EINVAL, "empty prompt");
    if (r->n_prompt + max > FAKE_N_CTX)
        return dx_errf(DX_EINVAL, "prompt (%zu tokens) + max_tokens (%u) exceeds the context (%d)",
                       r->n_prompt, max, FAKE_N_CTX);
    pthread_mutex_lock(&fe->mu);
    if (fe->busy) {
        pthread_mutex_unlock(&fe->mu);
        return dx_errf(DX_EBUSY, "queue full");
    }
    fjob *j = dx_calloc(1, sizeof *j);
    j->prompt = dx_memdup(r->prompt, r->n_prompt * sizeof *r->prompt);
    j->n = r->n_prompt;
    j->max = max;
    j->fn = r->on_event;
    j->user = r->user;
    j->id = *id = ++fe->next_id;
    fjob **pp = &fe->jobs; /* append: jobs run in submission order */
    while (*pp) pp = &(*pp)->next;
    *pp = j;
    fe->n_jobs++;
    pthread_mutex_unlock(&fe->mu);
    return 0;
}

static int fake_cancel(void *self, uint64_t id)
{
    fake_engine *fe = self;
    pthread_mutex_lock(&fe->mu);
    for (fjob *j = fe->jobs; j; j = j->next)
        if (j->id == id) j->canceled = 1;
    pthread_mutex_unlock(&fe->mu);
    return 0;
}

static void fake_stats(void *self, engine_stats *out)
{
    fake_engine *fe = self;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&fe->mu);
    out->running = (uint32_t)fe->n_jobs;
    out->kv.n_blocks = 100;
    out->kv.n_used = (uint32_t)fe->n_jobs; /* one block per live job */
    out->kv.n_free = 100 - out->kv.n_used;
    pthread_mutex_unlock(&fe->mu);
}

static int bytes_to_ids(const char *s, size_t n, int32_t **ids, size_t *n_ids)
{
    *ids = dx_malloc((n ? n : 1) * sizeof **ids);
    if (!*ids) return DX_ENOMEM;
    for (size_t i = 0; i < n; i++) (*ids)[i] = (unsigned char)s[i];
    *n_ids = n;
    return 0;
}

static int fake_encode_text(void *self, const char *t, size_t n, int32_t **ids, size_t *n_ids)
{
    (void)self;
    return bytes_to_ids(t, n, ids, n_ids);
}

/* "chat template": the contents of the messages, concatenated. */
static int fake_encode_chat(void *self, const chat_msg *m, size_t n, int32_t **ids, size_t *n_ids)
{
    (void)self;
    dx_buf b;
    dx_buf_init(&b, 0);
    for (size_t i = 0; i < n; i++) dx_buf_append(&b, m[i].content, m[i].content_len);
    int rc = bytes_to_ids(b.data ? b.data : "", b.len, ids, n_ids);
    dx_buf_free(&b);
    return rc;
}

/* ---- harness: server loop on a thread ---------------------------------- */

typedef struct {
    fake_engine fe;
    uv_loop_t loop;
    uv_async_t cmd;
    node_server *srv;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int port, stopped, cmd_shutdown;
} harness;

static harness H;
static double g_grace_s = 5;
static int g_loading; /* leave the server without a backend */

static void on_stopped(void *user)
{
    harness *h = user;
    pthread_mutex_lock(&h->fe.mu);
    h->fe.quit = 1;
    pthread_mutex_unlock(&h->fe.mu);
    pthread_join(h->fe.th, NULL); /* like engine_destroy */
    node_server_destroy(h->srv);
    uv_close((uv_handle_t *)&h->cmd, NULL);
    pthread_mutex_lock(&h->mu);
    h->stopped = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static void on_cmd(uv_async_t *a)
{
    harness *h = a->data;
    if (h->cmd_shutdown) node_server_shutdown(h->srv);
}

static void *loop_thread(void *arg)
{
    harness *h = arg;
    uv_loop_init(&h->loop);
    uv_async_init(&h->loop, &h->cmd, on_cmd);
    h->cmd.data = h;
    node_server_config cfg = {.port = 0,
                              .max_body_bytes = 65536,
                              .request_timeout_ms = 300,
                              .idle_timeout_ms = 5000,
                              .shutdown_grace_s = g_grace_s,
                              .on_stopped = on_stopped,
                              .user = h};
    DX_ASSERT(node_server_create(&h->loop, &cfg, &h->srv) == 0);
    node_backend be = {.self = &h->fe,
                       .submit = fake_submit,
                       .cancel = fake_cancel,
                       .stats = fake_stats,
                       .encode_chat = fake_encode_chat,
                       .encode_text = fake_encode_text,
                       .model_name = "fake",
                       .n_vocab = 256,
                       .n_ctx = FAKE_N_CTX};
    if (!g_loading) node_server_set_backend(h->srv, &be);
    pthread_mutex_lock(&h->mu);
    h->port = node_server_port(h->srv);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    uv_loop_close(&h->loop);
    return NULL;
}

static int setup(void **state)
{
    (void)state;
    memset(&H, 0, sizeof H);
    pthread_mutex_init(&H.mu, NULL);
    pthread_cond_init(&H.cv, NULL);
    pthread_mutex_init(&H.fe.mu, NULL);
    H.fe.delay_us = 500;
    pthread_create(&H.fe.th, NULL, fake_thread, &H.fe);
    pthread_create(&H.th, NULL, loop_thread, &H);
    pthread_mutex_lock(&H.mu);
    while (!H.port) pthread_cond_wait(&H.cv, &H.mu);
    pthread_mutex_unlock(&H.mu);
    return 0;
}

static void shutdown_server(void)
{
    H.cmd_shutdown = 1;
    uv_async_send(&H.cmd);
    pthread_join(H.th, NULL);
}

static int teardown(void **state)
{
    (void)state;
    if (!H.stopped) shutdown_server();
    return 0;
}

/* ---- clients ------------------------------------------------------------ */

static size_t on_curl_data(char *p, size_t sz, size_t n, void *user)
{
    return dx_buf_append(user, p, sz * n) == 0 ? sz * n : 0;
}

static CURL *curl_for(const char *method, const char *path, const char *body, dx_buf *out,
                      struct curl_slist **hdrs)
{
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", H.port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_curl_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
    if (body) {
        *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hdrs);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    }
    return c;
}

/* One request; returns the status, body in *out (reset first). */
static long http(const char *method, const char *path, const char *body, dx_buf *out)
{
    struct curl_slist *hdrs = NULL;
    dx_buf_reset(out);
    CURL *c = curl_for(method, path, body, out, &hdrs);
    long status = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc != CURLE_OK) fail_msg("curl %s %s: %s", method, path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    return status;
}

static json_t *body_json(const dx_buf *b)
{
    json_error_t je;
    json_t *v = json_loadb(b->data, b->len, 0, &je);
    if (!v) fail_msg("not JSON: %.*s", (int)b->len, b->data);
    return v;
}

static const char *err_param(json_t *v)
{
    return json_string_value(json_object_get(json_object_get(v, "error"), "param"));
}

/* Raw TCP exchange: sends, then reads until the server closes (or 5 s). */
static int raw_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)H.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void raw_read_all(int fd, dx_buf *out, int timeout_ms)
{
    char buf[4096];
    uint64_t end = dx_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (dx_now_ns() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) return;
        dx_buf_append(out, buf, (size_t)n);
    }
}

static void raw_exchange(const char *req, size_t len, dx_buf *out)
{
    int fd = raw_connect();
    assert_int_equal(write(fd, req, len), (ssize_t)len);
    dx_buf_reset(out);
    raw_read_all(fd, out, 5000);
    close(fd);
}

static int count_str(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static uint32_t metric(const char *name)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http("GET", "/metrics", NULL, &b), 200);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(b.data, key);
    if (!p) fail_msg("metric %s missing", name);
    uint32_t v = (uint32_t)strtoul(p + strlen(key), NULL, 10);
    dx_buf_free(&b);
    return v;
}

/* Waits until the fake engine holds no jobs (cancellations reach it async). */
static void wait_idle(void)
{
    for (int i = 0; i < 400 && metric("duplex_kv_blocks_used") != 0; i++) usleep(10000);
    assert_int_equal(metric("duplex_kv_blocks_used"), 0);
}

/* ---- tests -------------------------------------------------------------- */

static void test_simple_routes(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http("GET", "/health", NULL, &b), 200);
    assert_string_equal(b.data, "{\"status\":\"ok\"}");
    assert_int_equal(http("GET", "/v1/models", NULL, &b), 200);
    json_t *v = body_json(&b);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(v, "data"), 0), "id")),
        "fake");
    json_decref(v);
    assert_int_equal(http("GET", "/nope", NULL, &b), 404);
    v = body_json(&b);
    assert_non_null(json_object_get(json_object_get(v, "error"), "message"));
    json_decref(v);
    assert_int_equal(http("DELETE", "/health", NULL, &b), 405);
    assert_int_equal(http("GET", "/v1/chat/completions", NULL, &b), 405);
    assert_int_equal(http("GET", "/metrics", NULL, &b), 200);
    assert_non_null(strstr(b.data, "duplex_http_requests_total{route=\"other\",status=\"404\"} 1"));
    assert_non_null(strstr(b.data, "duplex_kv_blocks_free 100"));
    dx_buf_free(&b);
}

static void test_completion_full(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http("POST", "/v1/completions",
                          "{\"model\":\"fake\",\"prompt\":\"abc\",\"max_tokens\":5}", &b),
                     200);
    json_t *v = body_json(&b);
    json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "abcab");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    json_t *u = json_object_get(v, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 3);
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 8);
    assert_memory_equal(json_string_value(json_object_get(v, "id")), "cmpl-", 5);
    json_decref(v);
    /* chat, token-id prompts */
    assert_int_equal(http("POST", "/v1/chat/completions",
                          "{\"model\":\"fake\",\"messages\":[{\"role\":\"user\",\"content\":"
                          "\"xy\"}],\"max_completion_tokens\":3}",
                          &b),
                     200);
    v = body_json(&b);
    ch = json_array_get(json_object_get(v, "choices"), 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(ch, "message"), "content")), "xyx");
    assert_string_equal(json_string_value(json_object_get(v, "object")), "chat.completion");
    json_decref(v);
    assert_int_equal(http("POST", "/v1/completions",
                          "{\"model\":\"fake\",\"prompt\":[65,66],\"max_tokens\":3}", &b),
                     200);
    v = body_json(&b);
    ch = json_array_get(json_object_get(v, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "ABA");
    json_decref(v);
    dx_buf_free(&b);
}

/* Parses an SSE body: checks framing, returns the concatenated text, the
 * finish reason, whether a usage chunk came and that [DONE] ends it. */
static void parse_sse(const dx_buf *b, int chat, dx_buf *text, char *finish, int *usage_tokens)
{
    const char *p = b->data;
    int done = 0;
    *usage_tokens = -1;
    finish[0] = 0;
    while (*p) {
        assert_false(done);
        assert_memory_equal(p, "data: ", 6);
        const char *end = strstr(p, "\n\n");
        assert_non_null(end);
        p += 6;
        if (end - p == 6 && !memcmp(p, "[DONE]", 6)) {
            done = 1;
        } else {
            json_error_t je;
            json_t *v = json_loadb(p, (size_t)(end - p), 0, &je);
            assert_non_null(v);
            json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
            json_t *u = json_object_get(v, "usage");
            if (json_is_object(u))
                *usage_tokens = (int)json_integer_value(json_object_get(u, "completion_tokens"));
            if (ch) {
                json_t *t = chat ? json_object_get(json_object_get(ch, "delta"), "content")
                                 : json_object_get(ch, "text");
                if (json_is_string(t))
                    dx_buf_append(text, json_string_value(t), json_string_length(t));
                json_t *f = json_object_get(ch, "finish_reason");
                if (json_is_string(f)) strcpy(finish, json_string_value(f));
            }
            json_decref(v);
        }
        p = end + 2;
    }
    assert_true(done);
}

static void test_streaming(void **state)
{
    (void)state;
    dx_buf b, text;
    dx_buf_init(&b, 0);
    dx_buf_init(&text, 0);
    char finish[16];
    int usage;
    assert_int_equal(http("POST", "/v1/chat/completions",
                          "{\"model\":\"fake\",\"messages\":[{\"role\":\"user\",\"content\":"
                          "\"hello\"}],\"max_tokens\":7,\"stream\":true,\"stream_options\":{"
                          "\"include_usage\":true}}",
                          &b),
                     200);
    parse_sse(&b, 1, &text, finish, &usage);
    assert_string_equal(text.data, "hellohe");
    assert_string_equal(finish, "length");
    assert_int_equal(usage, 7);
    assert_non_null(strstr(b.data, "\"delta\":{\"role\":\"assistant\""));
    dx_buf_reset(&text);
    assert_int_equal(http("POST", "/v1/completions",
                          "{\"model\":\"fake\",\"prompt\":\"q\",\"max_tokens\":2,\"stream\":true}",
                          &b),
                     200);
    parse_sse(&b, 0, &text, finish, &usage);
    assert_string_equal(text.data, "qq");
    assert_int_equal(usage, -1);
    dx_buf_free(&b);
    dx_buf_free(&text);
}

static void test_request_errors(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    json_t *v;
    assert_int_equal(http("POST", "/v1/completions", "{not json", &b), 400);
    assert_int_equal(http("POST", "/v1/completions",
                          "{\"model\":\"fake\",\"prompt\":\"x\","
                          "\"max_tokens\":-1}",
                          &b),
                     400);
    v = body_json(&b);
    assert_string_equal(err_param(v), "max_tokens");
    json_decref(v);
    assert_int_equal(http("POST", "/v1/completions", "{\"model\":\"other\",\"prompt\":\"x\"}", &b),
                     404);
    v = body_json(&b);
    assert_string_equal(json_string_value(json_object_get(json_object_get(v, "error"), "code")),
                        "model_not_found");
    json_decref(v);
    assert_int_equal(http("POST", "/v1/completions",
                          "{\"model\":\"fake\",\"prompt\":\"x\","
                          "\"max_tokens\":5000}",
                          &b),
                     400);
    assert_non_null(strstr(b.data, "exceeds the context"));
    assert_int_equal(http("POST", "/v1/completions", "{\"model\":\"fake\",\"prompt\":\"\"}", &b),
                     400);
    assert_int_equal(http("POST", "/v1/completions", "{\"model\":\"fake\",\"prompt\":[300]}", &b),
                     400);
    pthread_mutex_lock(&H.fe.mu);
    H.fe.busy = 1;
    pthread_mutex_unlock(&H.fe.mu);
    assert_int_equal(http("POST", "/v1/completions", "{\"model\":\"fake\",\"prompt\":\"x\"}", &b),
                     503);
    pthread_mutex_lock(&H.fe.mu);
    H.fe.busy = 0;
    pthread_mutex_unlock(&H.fe.mu);
    assert_int_equal(http("GET", "/health", NULL, &b), 200);
    wait_idle();
    dx_buf_free(&b);
}

static void test_keepalive_pipelining(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    const char *body = "{\"model\":\"fake\",\"prompt\":\"z\",\"max_tokens\":2}";
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s"
                     "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                     strlen(body), body);
    raw_exchange(req, (size_t)n, &b);
    assert_int_equal(count_str(b.data, "HTTP/1.1 200 OK"), 3);
    /* answers in request order */
    const char *a = strstr(b.data, "\"zz\""), *h = strstr(b.data, "\"status\":\"ok\"");
    const char *m = strstr(b.data, "\"object\":\"list\"");
    assert_true(a && h && m && a < h && h < m);
    assert_non_null(strstr(b.data, "Connection: close"));
    /* curl reuses one connection for consecutive requests */
    struct curl_slist *hdrs = NULL;
    CURL *c = curl_for("GET", "/health", NULL, &b, &hdrs);
    assert_int_equal(curl_easy_perform(c), CURLE_OK);
    assert_int_equal(curl_easy_perform(c), CURLE_OK);
    long conns = -1;
    curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &conns);
    assert_int_equal(conns, 0);
    curl_easy_cleanup(c);
    dx_buf_free(&b);
}

static void test_http_limits(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    /* body over the limit, declared: refused before reading it */
    const char *big = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
    raw_exchange(big, strlen(big), &b);
    assert_memory_equal(b.data, "HTTP/1.1 413 ", 13);
    /* chunked body over the limit */
    dx_buf r;
    dx_buf_init(&r, 0);
    dx_buf_puts(&r, "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 20; i++) {
        dx_buf_puts(&r, "1000\r\n");
        for (int k = 0; k < 4096; k++) dx_buf_putc(&r, 'a');
        dx_buf_puts(&r, "\r\n");
    }
    raw_exchange(r.data, r.len, &b);
    assert_memory_equal(b.data, "HTTP/1.1 413 ", 13);
    /* headers over the limit */
    dx_buf_reset(&r);
    dx_buf_puts(&r, "GET /health HTTP/1.1\r\n");
    for (int i = 0; i < 40; i++) {
        dx_buf_printf(&r, "X-Pad-%d: ", i);
        for (int k = 0; k < 1000; k++) dx_buf_putc(&r, 'p');
        dx_buf_puts(&r, "\r\n");
    }
    dx_buf_puts(&r, "\r\n");
    raw_exchange(r.data, r.len, &b);
    assert_memory_equal(b.data, "HTTP/1.1 431 ", 13);
    /* too many headers */
    dx_buf_reset(&r);
    dx_buf_puts(&r, "GET /health HTTP/1.1\r\n");
    for (int i = 0; i < 100; i++) dx_buf_printf(&r, "X-%d: 1\r\n", i);
    dx_buf_puts(&r, "\r\n");
    raw_exchange(r.data, r.len, &b);
    assert_memory_equal(b.data, "HTTP/1.1 431 ", 13);
    /* garbage */
    const char *junk = "\x01\x02 NOT HTTP\r\n\r\n";
    raw_exchange(junk, strlen(junk), &b);
    assert_memory_equal(b.data, "HTTP/1.1 400 ", 13);
    /* a request that never completes: 408 after request_timeout_ms */
    const char *slow = "POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"mod";
    raw_exchange(slow, strlen(slow), &b);
    assert_memory_equal(b.data, "HTTP/1.1 408 ", 13);
    /* Expect: 100-continue gets its interim answer */
    const char *body = "{\"model\":\"fake\",\"prompt\":\"e\",\"max_tokens\":1}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nExpect: 100-continue\r\nConnection: "
                     "close\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    raw_exchange(req, (size_t)n, &b);
    assert_memory_equal(b.data, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK", 40);
    /* HTTP/1.0 stream: no chunked framing, ends with the close */
    body = "{\"model\":\"fake\",\"prompt\":\"s\",\"max_tokens\":2,\"stream\":true}";
    n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.0\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(body), body);
    raw_exchange(req, (size_t)n, &b);
    assert_null(strstr(b.data, "chunked"));
    assert_non_null(strstr(b.data, "data: [DONE]\n\n"));
    dx_buf_free(&r);
    dx_buf reply;
    dx_buf_init(&reply, 0);
    assert_int_equal(http("GET", "/health", NULL, &reply), 200);
    dx_buf_free(&reply);
    dx_buf_free(&b);
}

static void test_disconnect_cancels(void **state)
{
    (void)state;
    uint64_t canceled0 = H.fe.n_canceled;
    const char *body = "{\"model\":\"fake\",\"prompt\":\"d\",\"max_tokens\":4000,\"stream\":true}";
    char req[512];
    int n =
        snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(body), body);
    int fd = raw_connect();
    assert_int_equal(write(fd, req, (size_t)n), n);
    char buf[512];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1);
    assert_true(read(fd, buf, sizeof buf) > 0); /* the stream has begun */
    close(fd);
    wait_idle();
    pthread_mutex_lock(&H.fe.mu);
    assert_int_equal(H.fe.n_canceled, canceled0 + 1);
    pthread_mutex_unlock(&H.fe.mu);
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http("GET", "/metrics", NULL, &b), 200);
    assert_non_null(strstr(b.data, "route=\"/v1/completions\",status=\"499\"} 1"));
    dx_buf_free(&b);
}

static void test_engine_error(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http("POST", "/v1/completions", "{\"model\":\"fake\",\"prompt\":\"!x\"}", &b),
                     500);
    json_t *v = body_json(&b);
    assert_string_equal(json_string_value(json_object_get(json_object_get(v, "error"), "message")),
                        "fake failure");
    json_decref(v);
    assert_int_equal(http("POST", "/v1/completions",
                          "{\"model\":\"fake\",\"prompt\":\"!y\",\"stream\":true}", &b),
                     200);
    /* the text so far, then an error event, then [DONE] */
    assert_non_null(strstr(b.data, "\"text\":\"!\""));
    assert_non_null(strstr(b.data, "data: {\"error\":{\"message\":\"fake failure\""));
    assert_non_null(strstr(b.data, "data: [DONE]\n\n"));
    dx_buf_free(&b);
    wait_idle();
}

/* A request cut at every byte, and one sent a byte at a time. */
static void test_truncation_and_trickle(void **state)
{
    (void)state;
    const char *body = "{\"model\":\"fake\",\"prompt\":\"tr\",\"max_tokens\":3}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    for (int k = 0; k < n; k++) {
        int fd = raw_connect();
        assert_int_equal(write(fd, req, (size_t)k), k);
        close(fd);
    }
    int fd = raw_connect();
    for (int k = 0; k < n; k++) {
        assert_int_equal(write(fd, req + k, 1), 1);
        if (k % 16 == 0) usleep(1000);
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    raw_read_all(fd, &b, 5000);
    close(fd);
    assert_memory_equal(b.data, "HTTP/1.1 200 OK", 15);
    assert_non_null(strstr(b.data, "\"text\":\"trt\""));
    assert_int_equal(http("GET", "/health", NULL, &b), 200);
    dx_buf_free(&b);
    wait_idle();
}

/* Many clients at once, each keeping its connection for two requests. */
static void test_many_connections(void **state)
{
    (void)state;
    enum { N = 200 };
    int fds[N];
    const char *req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int i = 0; i < N; i++) {
        fds[i] = raw_connect();
        assert_int_equal(write(fds[i], req, strlen(req)), (ssize_t)strlen(req));
    }
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            char buf[512];
            struct pollfd p = {.fd = fds[i], .events = POLLIN};
            assert_int_equal(poll(&p, 1, 5000), 1);
            ssize_t k = read(fds[i], buf, sizeof buf - 1);
            assert_true(k > 0);
            buf[k] = 0;
            assert_non_null(strstr(buf, "{\"status\":\"ok\"}"));
            if (round == 0) assert_int_equal(write(fds[i], req, strlen(req)), (ssize_t)strlen(req));
        }
        if (round == 0) assert_true(metric("duplex_http_connections") >= N);
    }
    for (int i = 0; i < N; i++) close(fds[i]);
}

#define N_CONC 16

static void test_concurrent_streams(void **state)
{
    (void)state;
    CURLM *m = curl_multi_init();
    CURL *c[N_CONC];
    dx_buf out[N_CONC];
    struct curl_slist *hdrs[N_CONC];
    char body[N_CONC][256], prompt[N_CONC][16];
    for (int i = 0; i < N_CONC; i++) {
        snprintf(prompt[i], sizeof prompt[i], "p%02d-%c", i, 'a' + i);
        snprintf(body[i], sizeof body[i],
                 "{\"model\":\"fake\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],"
                 "\"max_tokens\":%d,\"stream\":true}",
                 prompt[i], 10 + i);
        dx_buf_init(&out[i], 0);
        c[i] = curl_for("POST", "/v1/chat/completions", body[i], &out[i], &hdrs[i]);
        curl_multi_add_handle(m, c[i]);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    for (int i = 0; i < N_CONC; i++) {
        long st = 0;
        curl_easy_getinfo(c[i], CURLINFO_RESPONSE_CODE, &st);
        assert_int_equal(st, 200);
        dx_buf text;
        dx_buf_init(&text, 0);
        char finish[16];
        int usage;
        parse_sse(&out[i], 1, &text, finish, &usage);
        char want[64];
        int len = 10 + i, plen = (int)strlen(prompt[i]);
        for (int k = 0; k < len; k++) want[k] = prompt[i][k % plen];
        want[len] = 0;
        assert_string_equal(text.data, want);
        dx_buf_free(&text);
        curl_multi_remove_handle(m, c[i]);
        curl_easy_cleanup(c[i]);
        curl_slist_free_all(hdrs[i]);
        dx_buf_free(&out[i]);
    }
    curl_multi_cleanup(m);
    wait_idle();
}

typedef struct {
    dx_buf out;
    long status;
    const char *body;
} bg_call;

static void *bg_stream(void *arg)
{
    bg_call *b = arg;
    b->status = http("POST", "/v1/completions", b->body, &b->out);
    return NULL;
}

/* Shutdown lets the running request finish, refuses new connections. */
static void test_graceful_shutdown(void **state)
{
    (void)state;
    bg_call bc = {.status = 0};
    dx_buf_init(&bc.out, 0);
    pthread_t t;
    bc.body = "{\"model\":\"fake\",\"prompt\":\"g\",\"max_tokens\":200,\"stream\":true}";
    pthread_create(&t, NULL, bg_stream, &bc);
    for (int i = 0; i < 500; i++) { /* until the request runs */
        pthread_mutex_lock(&H.fe.mu);
        int n = H.fe.n_jobs;
        pthread_mutex_unlock(&H.fe.mu);
        if (n) break;
        usleep(2000);
    }
    H.cmd_shutdown = 1;
    uv_async_send(&H.cmd);
    pthread_join(t, NULL);
    pthread_join(H.th, NULL);
    assert_int_equal(bc.status, 200);
    dx_buf text;
    dx_buf_init(&text, 0);
    char finish[16];
    int usage;
    parse_sse(&bc.out, 0, &text, finish, &usage);
    assert_int_equal(text.len, 200);
    assert_string_equal(finish, "length");
    dx_buf_free(&text);
    dx_buf_free(&bc.out);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)H.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_not_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    close(fd);
}

/* Shutdown with a request that outlives the grace period: it is canceled and
 * its stream ends with an error event and [DONE]. */
static void test_grace_expiry(void **state)
{
    (void)state;
    bg_call bc = {.status = 0};
    dx_buf_init(&bc.out, 0);
    pthread_t t;
    bc.body = "{\"model\":\"fake\",\"prompt\":\"g\",\"max_tokens\":4000,\"stream\":true}";
    pthread_create(&t, NULL, bg_stream, &bc);
    for (int i = 0; i < 500; i++) {
        pthread_mutex_lock(&H.fe.mu);
        int n = H.fe.n_jobs;
        pthread_mutex_unlock(&H.fe.mu);
        if (n) break;
        usleep(2000);
    }
    shutdown_server();
    pthread_join(t, NULL);
    assert_int_equal(bc.status, 200);
    assert_non_null(strstr(bc.out.data, "data: {\"error\":{\"message\":\"request canceled"));
    assert_non_null(strstr(bc.out.data, "data: [DONE]\n\n"));
    pthread_mutex_lock(&H.fe.mu);
    assert_int_equal(H.fe.n_canceled, 1);
    pthread_mutex_unlock(&H.fe.mu);
    dx_buf_free(&bc.out);
}

/* Before the model is loaded: /health and the API say 503, /metrics works. */
static void test_loading(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http("GET", "/health", NULL, &b), 503);
    assert_string_equal(b.data, "{\"status\":\"loading\"}");
    assert_int_equal(http("GET", "/v1/models", NULL, &b), 503);
    assert_int_equal(http("POST", "/v1/completions", "{\"model\":\"fake\",\"prompt\":\"x\"}", &b),
                     503);
    json_t *v = body_json(&b);
    assert_string_equal(json_string_value(json_object_get(json_object_get(v, "error"), "type")),
                        "server_error");
    json_decref(v);
    assert_int_equal(http("GET", "/metrics", NULL, &b), 200);
    assert_non_null(strstr(b.data, "\nduplex_node_ready 0\n"));
    dx_buf_free(&b);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* as the server process does */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    oai_json_use_dx_alloc();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simple_routes),
        cmocka_unit_test(test_completion_full),
        cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_request_errors),
        cmocka_unit_test(test_keepalive_pipelining),
        cmocka_unit_test(test_http_limits),
        cmocka_unit_test(test_disconnect_cancels),
        cmocka_unit_test(test_engine_error),
        cmocka_unit_test(test_truncation_and_trickle),
        cmocka_unit_test(test_many_connections),
        cmocka_unit_test(test_concurrent_streams),
        cmocka_unit_test(test_graceful_shutdown),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    const struct CMUnitTest grace_tests[] = {cmocka_unit_test(test_grace_expiry)};
    g_grace_s = 0.2;
    rc |= cmocka_run_group_tests(grace_tests, setup, teardown);
    const struct CMUnitTest loading_tests[] = {cmocka_unit_test(test_loading)};
    g_loading = 1;
    rc |= cmocka_run_group_tests(loading_tests, setup, teardown);
    curl_global_cleanup();
    return rc;
}
