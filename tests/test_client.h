/* test_client: what the server tests need as clients of a duplex node on
 * loopback — libcurl requests, raw sockets for bytes curl would not send,
 * OpenAI answer and SSE parsing, /metrics reading, running a command.  One
 * header shared by the unit and integration tests (static functions: each
 * test binary is one translation unit).  Include after cmocka.h. */
#ifndef TEST_CLIENT_H
#define TEST_CLIENT_H

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/dx_buf.h"
#include "base/dx_clock.h"

/* NUL-terminates without counting the NUL (string asserts on bodies). */
static inline void tc_terminate(dx_buf *b)
{
    dx_buf_putc(b, 0);
    b->len--;
}

static inline size_t tc_on_data(char *p, size_t sz, size_t n, void *user)
{
    return dx_buf_append(user, p, sz * n) == 0 ? sz * n : 0;
}

/* An easy handle for one request to host:port (an IPv4 literal or a
 * name), body into *out; the caller performs it (alone or in a multi
 * handle) and frees *hdrs. */
static inline CURL *tc_curl_at(const char *host, int port, const char *method, const char *path,
                               const char *body, dx_buf *out, struct curl_slist **hdrs,
                               long timeout_s)
{
    CURL *c = curl_easy_init();
    char url[256];
    *hdrs = NULL;
    snprintf(url, sizeof url, "http://%s:%d%s", host, port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, tc_on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
    if (body) {
        *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hdrs);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    return c;
}

/* The same to 127.0.0.1:port. */
static inline CURL *tc_curl(int port, const char *method, const char *path, const char *body,
                            dx_buf *out, struct curl_slist **hdrs, long timeout_s)
{
    return tc_curl_at("127.0.0.1", port, method, path, body, out, hdrs, timeout_s);
}

/* One request with extra headers ("Name: value", NULL-terminated list or
 * NULL); returns the status, the body in *out (reset first).  A transport
 * failure (or no answer within timeout_s) fails the test. */
static inline long tc_http_at(const char *host, int port, const char *method, const char *path,
                              const char *body, const char *const *headers, dx_buf *out,
                              long timeout_s)
{
    struct curl_slist *hdrs;
    dx_buf_reset(out);
    CURL *c = tc_curl_at(host, port, method, path, body, out, &hdrs, timeout_s);
    for (size_t i = 0; headers && headers[i]; i++) hdrs = curl_slist_append(hdrs, headers[i]);
    if (headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    if (rc != CURLE_OK) fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
    tc_terminate(out);
    return status;
}

/* tc_http_at to 127.0.0.1. */
static inline long tc_http_h(int port, const char *method, const char *path, const char *body,
                             const char *const *headers, dx_buf *out, long timeout_s)
{
    return tc_http_at("127.0.0.1", port, method, path, body, headers, out, timeout_s);
}

static inline long tc_http(int port, const char *method, const char *path, const char *body,
                           dx_buf *out, long timeout_s)
{
    return tc_http_h(port, method, path, body, NULL, out, timeout_s);
}

static inline int tc_raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Appends what arrives until the peer closes or timeout_ms passes. */
static inline void tc_raw_read_all(int fd, dx_buf *out, int timeout_ms)
{
    char buf[4096];
    uint64_t end = dx_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (dx_now_ns() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        dx_buf_append(out, buf, (size_t)n);
    }
    tc_terminate(out);
}

/* Sends the bytes on a new connection (the server may close early, e.g. 413)
 * and reads the answer into *out (reset first). */
static inline void tc_raw_exchange(int port, const char *req, size_t len, dx_buf *out,
                                   int timeout_ms)
{
    int fd = tc_raw_connect(port);
    for (size_t off = 0; off < len;) {
        ssize_t n = write(fd, req + off, len - off);
        if (n <= 0) break;
        off += (size_t)n;
    }
    dx_buf_reset(out);
    tc_raw_read_all(fd, out, timeout_ms);
    close(fd);
}

/* A model can emit any byte, NUL included (sent as \u0000): parse with
 * JSON_ALLOW_NUL and compare answers as bytes. */
static inline json_t *tc_json(const dx_buf *b)
{
    json_error_t je;
    json_t *v = json_loadb(b->data, b->len, JSON_ALLOW_NUL, &je);
    if (!v) fail_msg("not JSON: %.*s", (int)(b->len < 300 ? b->len : 300), b->data);
    return v;
}

/* The first choice's text of a non-streamed answer, into *out. */
static inline void tc_answer_text(const dx_buf *b, int chat, dx_buf *out)
{
    json_t *v = tc_json(b);
    json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
    json_t *t = chat ? json_object_get(json_object_get(ch, "message"), "content")
                     : json_object_get(ch, "text");
    assert_true(json_is_string(t));
    dx_buf_reset(out);
    dx_buf_append(out, json_string_value(t), json_string_length(t));
    tc_terminate(out);
    json_decref(v);
}

/* Parses an SSE body: checks the framing and that [DONE] ends it; returns the
 * concatenated text, the finish reason and the usage chunk's
 * completion_tokens (-1: none). */
static inline void tc_parse_sse(const dx_buf *b, int chat, dx_buf *text, char *finish,
                                int *usage_tokens)
{
    const char *p = b->data ? b->data : "";
    int done = 0;
    *usage_tokens = -1;
    finish[0] = 0;
    dx_buf_reset(text);
    while (*p) {
        assert_false(done);
        if (strncmp(p, "data: ", 6) != 0) fail_msg("bad SSE framing at: %.60s", p);
        const char *end = strstr(p, "\n\n");
        assert_non_null(end);
        p += 6;
        if (end - p == 6 && !memcmp(p, "[DONE]", 6)) {
            done = 1;
        } else {
            json_error_t je;
            json_t *v = json_loadb(p, (size_t)(end - p), JSON_ALLOW_NUL, &je);
            if (!v) fail_msg("bad SSE event: %.*s", (int)(end - p), p);
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
    tc_terminate(text);
}

/* A series from host:port's /metrics — a name with its labels, as printed
 * ("x_total{route=\"/a\"}") — or dflt when there is no such series. */
static inline double tc_metric_at(const char *host, int port, const char *series, double dflt)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(tc_http_at(host, port, "GET", "/metrics", NULL, NULL, &b, 20), 200);
    char key[256];
    snprintf(key, sizeof key, "\n%s ", series);
    const char *p = strstr(b.data, key);
    double v = p ? strtod(p + strlen(key), NULL) : dflt;
    dx_buf_free(&b);
    return v;
}

static inline double tc_metric_or(int port, const char *series, double dflt)
{
    return tc_metric_at("127.0.0.1", port, series, dflt);
}

/* A counter or gauge from /metrics (fails the test if absent). */
static inline long tc_metric(int port, const char *name)
{
    double v = tc_metric_or(port, name, -1e300);
    if (v == -1e300) fail_msg("metric %s missing", name);
    return (long)v;
}

/* The first model GET /v1/models lists (its id into out); 0, or -1 when
 * the server does not answer 200. */
static inline int tc_model_id(int port, char *out, size_t cap)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    int ok = tc_http(port, "GET", "/v1/models", NULL, &b, 30) == 200;
    if (ok) {
        json_t *v = tc_json(&b);
        json_t *id = json_object_get(json_array_get(json_object_get(v, "data"), 0), "id");
        snprintf(out, cap, "%s", json_is_string(id) ? json_string_value(id) : "");
        json_decref(v);
    }
    dx_buf_free(&b);
    return ok ? 0 : -1;
}

/* Runs every transfer of a multi handle to its end. */
static inline void tc_multi_run(CURLM *m)
{
    for (int running = 1; running;) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 100, NULL);
    }
}

/* Sends a streaming POST on a raw connection and reads until at least
 * min_bytes of the answer have come (the stream is running); the caller
 * closes the socket, e.g. to walk away mid-stream. */
static inline int tc_raw_stream_open(int port, const char *path, const char *body, size_t min_bytes)
{
    char rq[1024];
    int n = snprintf(rq, sizeof rq, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     path, strlen(body), body);
    assert_true(n > 0 && (size_t)n < sizeof rq);
    int fd = tc_raw_connect(port);
    assert_int_equal(write(fd, rq, (size_t)n), n);
    char buf[4096];
    for (size_t got = 0; got < min_bytes;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_int_equal(poll(&p, 1, 30000), 1);
        ssize_t k = read(fd, buf, sizeof buf);
        assert_true(k > 0);
        got += (size_t)k;
    }
    return fd;
}

/* Runs a shell command; its stdout is appended to *out (may be NULL).
 * Returns pclose's status. */
static inline int tc_run_cmd(const char *cmd, dx_buf *out)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0)
        if (out) dx_buf_append(out, buf, n);
    if (out) tc_terminate(out);
    return pclose(p);
}

#endif
