/* Integration test: `duplex serve` as a real process on an ephemeral loopback
 * port, with a synthesised tiny model, driven over real sockets (libcurl, raw
 * TCP where the bytes matter, and the official openai npm client).
 *
 * Needs DUPLEX_BIN (scripts/test.sh sets it).  Greedy decoding is
 * deterministic and the engine is batch-invariant, so outputs can be
 * compared exactly: HTTP vs `duplex generate`, streaming vs not, alone vs 16
 * at once. */
/* duplex-test: tsan */
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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/dx_buf.h"
#include "base/dx_utf8.h"
#include "../test_client.h"
#include "../test_proc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "oai/oai_resp.h"

static struct {
    const char *bin;
    char dir[64], model_path[128], log_path[128];
    pid_t pid;
    int port;
    char model[128];
} G;

/* ---- process management ------------------------------------------------- */

/* ---- clients (tests/test_client.h, bound to this file's server) -------- */

#define run_cmd tc_run_cmd
#define http(method, path, body, out) tc_http(G.port, method, path, body, out, 120)
#define curl_req(method, path, body, out, hdrs) tc_curl(G.port, method, path, body, out, hdrs, 120)
#define raw_connect() tc_raw_connect(G.port)
#define raw_exchange(req, len, out, ms) tc_raw_exchange(G.port, req, len, out, ms)
#define as_json tc_json
#define metric(name) tc_metric(G.port, name)

/* The answer text (strdup'd) and, if asked, its usage object. */
static char *answer_text(const dx_buf *b, int chat, json_t **usage_out)
{
    dx_buf t;
    dx_buf_init(&t, 0);
    tc_answer_text(b, chat, &t);
    if (usage_out) {
        json_t *v = tc_json(b);
        *usage_out = json_incref(json_object_get(v, "usage"));
        json_decref(v);
    }
    char *s = strdup(t.data);
    dx_buf_free(&t);
    return s;
}

/* SSE body → concatenated text (strdup'd); framing and [DONE] checked. */
static char *sse_text(const dx_buf *b, int chat, char *finish, long *usage_completion)
{
    dx_buf t;
    dx_buf_init(&t, 0);
    int u;
    tc_parse_sse(b, chat, &t, finish, &u);
    *usage_completion = u;
    char *s = strdup(t.data);
    dx_buf_free(&t);
    return s;
}

/* What JSON makes of raw bytes: invalid UTF-8 becomes U+FFFD (strdup'd). */
static char *sanitize(const char *s, size_t n)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_utf8_sanitize((const uint8_t *)s, n, &b);
    tc_terminate(&b);
    char *r = strdup(b.data ? b.data : "");
    dx_buf_free(&b);
    return r;
}

static int read_port_from_log(void)
{
    FILE *f = fopen(G.log_path, "r");
    if (!f) return 0;
    char line[1024];
    int port = 0;
    while (!port && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "address=http://127.0.0.1:");
        if (p) port = atoi(p + strlen("address=http://127.0.0.1:"));
    }
    fclose(f);
    return port;
}

static void start_server(void)
{
    G.pid = fork();
    DX_ASSERT(G.pid >= 0);
    if (G.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test leaves no server behind */
        FILE *log = freopen(G.log_path, "w", stderr);
        (void)log;
        execl(G.bin, G.bin, "serve", "--model", G.model_path, "--role", "both", "--port", "0",
              "--threads", "2", "--kv-cache-mb", "32", "--ctx", "1024", "--max-waiting", "64",
              "--request-timeout-ms", "700", "--max-body-mb", "1", "--shutdown-grace-s", "5",
              "--served-model-name", "tiny-alias", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1200 && !G.port; i++) {
        usleep(50000);
        G.port = read_port_from_log();
        int st;
        if (!G.port && waitpid(G.pid, &st, WNOHANG) == G.pid) break;
    }
    DX_ASSERT(G.port > 0);
}

static int group_setup(void **state)
{
    (void)state;
    G.bin = getenv("DUPLEX_BIN");
    if (!G.bin) G.bin = "build/release/duplex";
    snprintf(G.dir, sizeof G.dir, "/tmp/duplex-itest-XXXXXX");
    if (!mkdtemp(G.dir)) return -1;
    snprintf(G.model_path, sizeof G.model_path, "%s/tiny.gguf", G.dir);
    snprintf(G.log_path, sizeof G.log_path, "%s/serve.log", G.dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s model synth --arch qwen3 --preset tiny --dtype f32 -o %s >/dev/null 2>&1", G.bin,
             G.model_path);
    if (run_cmd(cmd, NULL) != 0) {
        fprintf(stderr, "itest: %s failed\n", cmd);
        return -1;
    }
    start_server();
    return G.port > 0 ? 0 : -1;
}

static void print_log_tail(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "tail -n 30 %s >&2", G.log_path);
    (void)!system(cmd);
}

static int group_teardown(void **state)
{
    (void)state;
    int st = -1;
    if (G.pid > 0) {
        kill(G.pid, SIGTERM); /* at-rest: test_at_rest, the last test, checked it */
        for (int i = 0; i < 200 && waitpid(G.pid, &st, WNOHANG) != G.pid; i++) usleep(50000);
    }
    print_log_tail();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", G.dir);
    (void)!system(cmd);
    /* SIGTERM must end in a clean exit 0 */
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        fprintf(stderr, "itest: server did not exit 0 on SIGTERM (status %d)\n", st);
        return -1;
    }
    return 0;
}

/* ---- HTTP helpers -------------------------------------------------------- */

static json_t *jpath(json_t *v, const char *a, const char *b)
{
    json_t *x = json_object_get(v, a);
    return b ? json_object_get(x, b) : x;
}

/* The server is healthy and holds no KV blocks once idle (cancellation is
 * asynchronous, so allow it a moment). */
static void assert_healthy_no_leak(void)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http("GET", "/health", NULL, &b), 200);
    dx_buf_free(&b);
    long used = -1;
    for (int i = 0; i < 3000; i++) { /* up to 60 s: cancels reach the engine asynchronously */
        used = metric("duplex_kv_blocks_used");
        if (used == 0 && metric("duplex_requests_running") == 0) break;
        usleep(20000);
    }
    assert_int_equal(used, 0);
}

static char *chat_body(const char *content, int max_tokens, int stream)
{
    json_t *v = json_pack("{s:s, s:[{s:s, s:s}], s:i, s:f, s:b}", "model", G.model, "messages",
                          "role", "user", "content", content, "max_tokens", max_tokens,
                          "temperature", 0.0, "stream", stream);
    char *s = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    return s;
}

static char *chat_once(const char *content, int max_tokens)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    char *body = chat_body(content, max_tokens, 0);
    assert_int_equal(http("POST", "/v1/chat/completions", body, &b), 200);
    char *t = answer_text(&b, 1, NULL);
    free(body);
    dx_buf_free(&b);
    return t;
}

/* ---- tests ---------------------------------------------------------------- */

static void test_health_models(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http("GET", "/health", NULL, &b), 200);
    assert_int_equal(http("GET", "/v1/models", NULL, &b), 200);
    json_t *v = as_json(&b);
    json_t *id = json_object_get(json_array_get(json_object_get(v, "data"), 0), "id");
    assert_true(json_is_string(id));
    snprintf(G.model, sizeof G.model, "%s", json_string_value(id));
    json_decref(v);
    assert_int_equal(http("GET", "/metrics", NULL, &b), 200);
    assert_non_null(strstr(b.data, "duplex_kv_blocks_total"));
    assert_true(metric("duplex_kv_blocks_total") > 0);
    dx_buf_free(&b);
}

static void test_chat_and_completions(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    char finish[16] = "";
    long uc;
    /* chat: stream and not give the same text and usage */
    char *body = chat_body("Hello, who are you?", 16, 0);
    assert_int_equal(http("POST", "/v1/chat/completions", body, &b), 200);
    json_t *usage;
    char *full = answer_text(&b, 1, &usage);
    json_t *v = as_json(&b);
    assert_string_equal(json_string_value(json_object_get(v, "object")), "chat.completion");
    assert_memory_equal(json_string_value(json_object_get(v, "id")), "chatcmpl-", 9);
    json_decref(v);
    long n_gen = (long)json_integer_value(json_object_get(usage, "completion_tokens"));
    assert_true(n_gen >= 1 && n_gen <= 16);
    assert_true(json_integer_value(json_object_get(usage, "prompt_tokens")) > 0);
    json_decref(usage);
    free(body);
    body = chat_body("Hello, who are you?", 16, 1);
    json_t *bj = json_loads(body, 0, NULL);
    json_object_set_new(bj, "stream_options", json_pack("{s:b}", "include_usage", 1));
    free(body);
    body = json_dumps(bj, JSON_COMPACT);
    json_decref(bj);
    assert_int_equal(http("POST", "/v1/chat/completions", body, &b), 200);
    char *streamed = sse_text(&b, 1, finish, &uc);
    assert_string_equal(streamed, full);
    assert_int_equal(uc, n_gen);
    assert_true(!strcmp(finish, "stop") || !strcmp(finish, "length"));
    free(body);
    free(full);
    free(streamed);
    /* completions */
    const char *cb = "{\"model\":\"%s\",\"prompt\":\"The quick brown fox\",\"max_tokens\":12,"
                     "\"temperature\":0,\"stream\":%s}";
    char buf[512];
    snprintf(buf, sizeof buf, cb, G.model, "false");
    assert_int_equal(http("POST", "/v1/completions", buf, &b), 200);
    full = answer_text(&b, 0, NULL);
    snprintf(buf, sizeof buf, cb, G.model, "true");
    assert_int_equal(http("POST", "/v1/completions", buf, &b), 200);
    streamed = sse_text(&b, 0, finish, &uc);
    assert_string_equal(streamed, full);
    free(full);
    free(streamed);
    dx_buf_free(&b);
    assert_healthy_no_leak();
}

/* Greedy output over HTTP equals `duplex generate` for the same prompt. */
static void test_equals_generate(void **state)
{
    (void)state;
    char cmd[1024];
    dx_buf out;
    dx_buf_init(&out, 0);
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --chat 'Write a haiku about rivers.' -n 20 --threads 2 "
             "--kv-cache-mb 16 2>/dev/null",
             G.bin, G.model_path);
    assert_int_equal(run_cmd(cmd, &out), 0);
    assert_true(out.len >= 1 && out.data[out.len - 1] == '\n'); /* generate adds one */
    char *want = sanitize(out.data, out.len - 1);
    char *got = chat_once("Write a haiku about rivers.", 20);
    assert_string_equal(got, want);
    free(want);
    free(got);
    /* and the completions route against --prompt */
    dx_buf_reset(&out);
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --prompt 'In the beginning' -n 20 --threads 2 "
             "--kv-cache-mb 16 2>/dev/null",
             G.bin, G.model_path);
    assert_int_equal(run_cmd(cmd, &out), 0);
    want = sanitize(out.data, out.len - 1);
    dx_buf b;
    dx_buf_init(&b, 0);
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"In the beginning\",\"max_tokens\":20,"
             "\"temperature\":0}",
             G.model);
    assert_int_equal(http("POST", "/v1/completions", body, &b), 200);
    got = answer_text(&b, 0, NULL);
    assert_string_equal(got, want);
    free(want);
    free(got);
    dx_buf_free(&b);
    dx_buf_free(&out);
}

#define N_CONC 16

static void test_concurrent_streams(void **state)
{
    (void)state;
    char prompts[N_CONC][64];
    char *alone[N_CONC];
    for (int i = 0; i < N_CONC; i++) {
        snprintf(prompts[i], sizeof prompts[i], "Request number %d: tell me a story about %c.", i,
                 'A' + i);
        alone[i] = chat_once(prompts[i], 24);
    }
    CURLM *m = curl_multi_init();
    CURL *c[N_CONC];
    dx_buf out[N_CONC];
    struct curl_slist *h[N_CONC];
    char *bodies[N_CONC];
    for (int i = 0; i < N_CONC; i++) {
        dx_buf_init(&out[i], 0);
        bodies[i] = chat_body(prompts[i], 24, 1);
        c[i] =
            curl_req("POST", "/v1/chat/completions", bodies[i], &out[i], &h[i]);
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
        char finish[16];
        long uc;
        char *t = sse_text(&out[i], 1, finish, &uc);
        if (strcmp(t, alone[i]) != 0)
            fail_msg("request %d: concurrent '%s' != alone '%s'", i, t, alone[i]);
        free(t);
        free(alone[i]);
        free(bodies[i]);
        curl_multi_remove_handle(m, c[i]);
        curl_easy_cleanup(c[i]);
        curl_slist_free_all(h[i]);
        dx_buf_free(&out[i]);
    }
    curl_multi_cleanup(m);
    assert_healthy_no_leak();
}

/* The second turn of a conversation reuses the first turn's KV. */
static void test_multi_turn_cached(void **state)
{
    (void)state;
    const char *sys = "You are a helpful assistant who answers questions about geography, "
                      "history and science with short, precise and friendly sentences.";
    json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "system", "content", sys, "role",
                             "user", "content", "What is the longest river in the world?");
    json_t *req = json_pack("{s:s,s:O,s:i,s:f}", "model", G.model, "messages", msgs, "max_tokens",
                            16, "temperature", 0.0);
    char *body = json_dumps(req, JSON_COMPACT);
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http("POST", "/v1/chat/completions", body, &b), 200);
    json_t *u1;
    char *answer = answer_text(&b, 1, &u1);
    free(body);
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", answer));
    json_array_append_new(
        msgs, json_pack("{s:s,s:s}", "role", "user", "content", "And the second longest?"));
    json_object_set(req, "messages", msgs);
    body = json_dumps(req, JSON_COMPACT);
    assert_int_equal(http("POST", "/v1/chat/completions", body, &b), 200);
    json_t *u2;
    free(answer_text(&b, 1, &u2));
    long p1 = (long)json_integer_value(json_object_get(u1, "prompt_tokens"));
    long cached = (long)json_integer_value(jpath(u2, "prompt_tokens_details", "cached_tokens"));
    if (!(cached > 0 && cached >= p1 - 16))
        fail_msg("turn 2 cached %ld tokens; turn 1 prompt had %ld", cached, p1);
    free(answer);
    free(body);
    json_decref(u1);
    json_decref(u2);
    json_decref(req);
    json_decref(msgs);
    dx_buf_free(&b);
    assert_healthy_no_leak();
}

static void expect_status(const char *method, const char *path, const char *body, long want,
                          const char *param)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    long st = http(method, path, body, &b);
    if (st != want)
        fail_msg("%s %s %.80s: status %ld, want %ld: %s", method, path, body ? body : "", st, want,
                 b.data);
    json_t *v = as_json(&b);
    json_t *e = json_object_get(v, "error");
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(json_is_string(json_object_get(e, "type")));
    assert_non_null(json_object_get(e, "param"));
    assert_non_null(json_object_get(e, "code"));
    if (param) assert_string_equal(json_string_value(json_object_get(e, "param")), param);
    json_decref(v);
    dx_buf_free(&b);
    assert_healthy_no_leak();
}

static void test_bad_input_corpus(void **state)
{
    (void)state;
    char b[1024];
    const char *chat = "/v1/chat/completions", *cmpl = "/v1/completions";
    expect_status("POST", chat, "{\"model\":", 400, NULL);
    expect_status("POST", chat, "not json at all", 400, NULL);
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"messages\":\"hi\"}", G.model);
    expect_status("POST", chat, b, 400, "messages");
    snprintf(b, sizeof b, "{\"model\":\"%s\"}", G.model);
    expect_status("POST", chat, b, 400, "messages");
    expect_status("POST", chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
                  "model");
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"prompt\":\"x\",\"max_tokens\":-4}", G.model);
    expect_status("POST", cmpl, b, 400, "max_tokens");
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"prompt\":\"x\",\"max_tokens\":1e999}", G.model);
    expect_status("POST", cmpl, b, 400, NULL);
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"prompt\":\"x\",\"max_tokens\":99999999999999}",
             G.model);
    expect_status("POST", cmpl, b, 400, "max_tokens");
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"prompt\":\"x\",\"temperature\":\"hot\"}", G.model);
    expect_status("POST", cmpl, b, 400, "temperature");
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"prompt\":\"x\",\"n\":2}", G.model);
    expect_status("POST", cmpl, b, 400, "n");
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"prompt\":[1,2,99999999]}", G.model);
    expect_status("POST", cmpl, b, 400, "prompt");
    snprintf(b, sizeof b,
             "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"\xff\xfe bad\"}]}",
             G.model);
    expect_status("POST", chat, b, 400, NULL);
    /* prompt + max_tokens over the context (--ctx 1024) */
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"prompt\":\"x\",\"max_tokens\":5000}", G.model);
    expect_status("POST", cmpl, b, 400, NULL);
    expect_status("POST", chat,
                  "{\"model\":\"nope\",\"messages\":[{\"role\":\"user\","
                  "\"content\":\"x\"}]}",
                  404, "model");
    expect_status("GET", "/v1/unknown", NULL, 404, NULL);
    expect_status("PUT", "/health", NULL, 405, NULL);
    expect_status("GET", chat, NULL, 405, NULL);
}

/* The token bytes of a logprobs entry, appended to out. */
static void lp_bytes(json_t *entry, dx_buf *out)
{
    json_t *b = json_object_get(entry, "bytes"), *x;
    size_t i;
    assert_true(json_is_array(b));
    json_array_foreach(b, i, x)
    {
        char c = (char)json_integer_value(x);
        dx_buf_append(out, &c, 1);
    }
}

/* logprobs (chat and the legacy completions form, streamed or not),
 * logit_bias, penalties, and --served-model-name: the alias is listed and
 * echoed, and requests may name it or the file's model; bad values are 400s
 * naming the field. */
static void test_sampling_params(void **state)
{
    (void)state;
    char b[1024];
    dx_buf out, bytes;
    dx_buf_init(&out, 0);
    dx_buf_init(&bytes, 0);
    assert_int_equal(http("GET", "/v1/models", NULL, &out), 200);
    assert_non_null(strstr(out.data, "\"id\":\"tiny-alias\""));
    const char *names[] = {"tiny-alias", G.model};
    for (int k = 0; k < 2; k++) {
        snprintf(b, sizeof b,
                 "{\"model\":\"%s\",\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,"
                 "\"logprobs\":true,\"top_logprobs\":3,"
                 "\"messages\":[{\"role\":\"user\",\"content\":\"logprobs please\"}]}",
                 names[k]);
        assert_int_equal(http("POST", "/v1/chat/completions", b, &out), 200);
        json_t *v = as_json(&out), *ch = json_array_get(json_object_get(v, "choices"), 0);
        assert_string_equal(json_string_value(json_object_get(v, "model")), "tiny-alias");
        json_t *content = jpath(ch, "logprobs", "content"), *e;
        assert_int_equal(json_array_size(content), 6);
        size_t i;
        dx_buf_reset(&bytes);
        json_array_foreach(content, i, e)
        {
            json_t *top = json_object_get(e, "top_logprobs");
            assert_int_equal(json_array_size(top), 3);
            /* greedy: the token is the most likely one, with the same logprob */
            assert_true(json_equal(json_object_get(e, "token"),
                                   json_object_get(json_array_get(top, 0), "token")));
            double lp = json_number_value(json_object_get(e, "logprob"));
            assert_true(lp <= 0 && lp == json_number_value(json_object_get(json_array_get(top, 0), "logprob")));
            assert_true(json_number_value(json_object_get(json_array_get(top, 1), "logprob")) <= lp);
            lp_bytes(e, &bytes);
        }
        tc_terminate(&bytes);
        const char *text = json_string_value(jpath(ch, "message", "content"));
        char *want = sanitize(bytes.data, bytes.len);
        assert_string_equal(text, want); /* the tokens' bytes are the answer */
        free(want);
        json_decref(v);
    }
    /* streamed: one entry per token, whose bytes add up to the text */
    snprintf(b, sizeof b,
             "{\"model\":\"%s\",\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,"
             "\"stream\":true,\"logprobs\":true,"
             "\"messages\":[{\"role\":\"user\",\"content\":\"logprobs please\"}]}",
             G.model);
    assert_int_equal(http("POST", "/v1/chat/completions", b, &out), 200);
    tc_terminate(&out);
    int entries = 0;
    for (char *l = strstr(out.data, "data: {"); l; l = strstr(l + 1, "data: {")) {
        json_error_t je;
        json_t *v = json_loadb(l + 6, strcspn(l + 6, "\n"), 0, &je), *e;
        json_t *c = jpath(json_array_get(json_object_get(v, "choices"), 0), "logprobs", "content");
        size_t i;
        json_array_foreach(c, i, e)
        {
            entries++;
            assert_int_equal(json_array_size(json_object_get(e, "top_logprobs")), 0);
        }
        json_decref(v);
    }
    assert_int_equal(entries, 6);
    /* completions: tokens, token_logprobs, top_logprobs, text_offset */
    snprintf(b, sizeof b,
             "{\"model\":\"%s\",\"max_tokens\":5,\"temperature\":0,\"ignore_eos\":true,"
             "\"logprobs\":2,\"prompt\":\"the cache\"}",
             G.model);
    assert_int_equal(http("POST", "/v1/completions", b, &out), 200);
    json_t *v = as_json(&out), *lp = jpath(json_array_get(json_object_get(v, "choices"), 0), "logprobs", NULL);
    assert_int_equal(json_array_size(json_object_get(lp, "tokens")), 5);
    assert_int_equal(json_array_size(json_object_get(lp, "token_logprobs")), 5);
    assert_int_equal(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)) <= 2, 1);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 0)), 0);
    json_decref(v);
    /* logit_bias +100 on one token: every generated token is that one */
    snprintf(b, sizeof b,
             "{\"model\":\"%s\",\"max_tokens\":4,\"ignore_eos\":true,\"logprobs\":0,"
             "\"logit_bias\":{\"77\":100},\"presence_penalty\":0.5,\"frequency_penalty\":0.5,"
             "\"repetition_penalty\":1.1,\"prompt\":\"x\"}",
             G.model);
    assert_int_equal(http("POST", "/v1/completions", b, &out), 200);
    v = as_json(&out);
    lp = jpath(json_array_get(json_object_get(v, "choices"), 0), "logprobs", "tokens");
    for (size_t i = 1; i < 4; i++) assert_true(json_equal(json_array_get(lp, 0), json_array_get(lp, i)));
    json_decref(v);
    static const struct {
        const char *field, *value, *param;
    } bad[] = {
        {"presence_penalty", "2.5", "presence_penalty"},
        {"frequency_penalty", "\"x\"", "frequency_penalty"},
        {"repetition_penalty", "0", "repetition_penalty"},
        {"logit_bias", "{\"77\":101}", "logit_bias.77"},
        {"logit_bias", "{\"99999999\":1}", "logit_bias.99999999"},
        {"logit_bias", "[1]", "logit_bias"},
        {"top_logprobs", "3", "top_logprobs"}, /* without logprobs */
        {"logprobs", "\"yes\"", "logprobs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(b, sizeof b,
                 "{\"model\":\"%s\",\"max_tokens\":2,\"%s\":%s,"
                 "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                 G.model, bad[i].field, bad[i].value);
        expect_status("POST", "/v1/chat/completions", b, 400, bad[i].param);
    }
    snprintf(b, sizeof b,
             "{\"model\":\"%s\",\"max_tokens\":2,\"logprobs\":true,\"top_logprobs\":21,"
             "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
             G.model);
    expect_status("POST", "/v1/chat/completions", b, 400, "top_logprobs");
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"prompt\":\"x\",\"logprobs\":6}", G.model);
    expect_status("POST", "/v1/completions", b, 400, "logprobs");
    dx_buf_free(&out);
    dx_buf_free(&bytes);
}

static void test_wire_abuse(void **state)
{
    (void)state;
    dx_buf out;
    dx_buf_init(&out, 0);
    /* oversized body (limit 1 MiB) */
    size_t big = 2u << 20;
    char *req = malloc(big + 256);
    int h = snprintf(req, 256, "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", big);
    memset(req + h, 'a', big);
    raw_exchange(req, (size_t)h + big, &out, 5000);
    free(req);
    assert_memory_equal(out.data, "HTTP/1.1 413 ", 13);
    assert_healthy_no_leak();
    /* a request that never completes gets 408 after --request-timeout-ms */
    const char *slow = "POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"mo";
    raw_exchange(slow, strlen(slow), &out, 5000);
    assert_memory_equal(out.data, "HTTP/1.1 408 ", 13);
    /* headers only, never finished */
    slow = "GET /health HTTP/1.1\r\nHost: x\r\n";
    raw_exchange(slow, strlen(slow), &out, 5000);
    assert_memory_equal(out.data, "HTTP/1.1 408 ", 13);
    /* not HTTP */
    raw_exchange("\x16\x03\x01\x00\xa5\x01\x00\x00", 8, &out, 5000);
    assert_memory_equal(out.data, "HTTP/1.1 400 ", 13);
    assert_healthy_no_leak();
    dx_buf_free(&out);
}

static void test_disconnect_mid_stream(void **state)
{
    (void)state;
    char body[256], req[512];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"Tell me everything\",\"max_tokens\":900,"
             "\"ignore_eos\":true,\"stream\":true}",
             G.model);
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    int fd = raw_connect();
    assert_int_equal(write(fd, req, (size_t)n), n);
    char buf[4096];
    size_t got = 0;
    while (got < 600) { /* a few chunks in: the request is running */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_int_equal(poll(&p, 1, 30000), 1);
        ssize_t k = read(fd, buf, sizeof buf);
        assert_true(k > 0);
        got += (size_t)k;
    }
    assert_true(metric("duplex_kv_blocks_used") > 0);
    close(fd);
    assert_healthy_no_leak(); /* canceled at once, its blocks released */
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http("GET", "/metrics", NULL, &b), 200);
    assert_non_null(strstr(b.data, "route=\"/v1/completions\",status=\"499\"}"));
    dx_buf_free(&b);
}

static void test_openai_client(void **state)
{
    (void)state;
    if (access("tests/integration/node/node_modules/openai", F_OK) != 0) {
        fprintf(stderr, "openai npm package not installed (scripts/test.sh runs npm ci)\n");
        fail();
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "node tests/integration/node/openai_client.mjs http://127.0.0.1:%d/v1 2>&1", G.port);
    dx_buf out;
    dx_buf_init(&out, 0);
    int rc = run_cmd(cmd, &out);
    if (rc != 0) fail_msg("openai client failed:\n%s", out.data ? out.data : "");
    dx_buf_free(&out);
    assert_healthy_no_leak();
}

/* Last: after every test above, the node is at rest (tests/test_proc.h):
 * nothing running, no block referenced; then the teardown's SIGTERM. */
static void test_at_rest(void **state)
{
    (void)state;
    tp_node n = {.on = 1, .host = "127.0.0.1"};
    tp_rest_check(&n, G.port, "the node");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_models),     cmocka_unit_test(test_chat_and_completions),
        cmocka_unit_test(test_equals_generate),   cmocka_unit_test(test_concurrent_streams),
        cmocka_unit_test(test_multi_turn_cached), cmocka_unit_test(test_bad_input_corpus),
        cmocka_unit_test(test_wire_abuse),        cmocka_unit_test(test_disconnect_mid_stream),
        cmocka_unit_test(test_openai_client),     cmocka_unit_test(test_sampling_params),
        cmocka_unit_test(test_at_rest), /* last */
    };
    int rc = cmocka_run_group_tests(tests, group_setup, group_teardown);
    curl_global_cleanup();
    return rc;
}
