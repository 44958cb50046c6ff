/* bench_chat: a timed multi-turn chat (see .h).  The SSE stream is parsed
 * event by event as it arrives, so the first content token is timed when
 * its event is complete, not when the answer is. */
#include "bench/bench_chat.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"

/* Words with ordinary lengths, so token counts behave like text. */
static const char *const k_words[] = {
    "the",     "model",  "reads",   "every",   "token",   "of",      "history", "again",
    "when",    "a",      "client",  "sends",   "its",     "whole",   "chat",    "with",
    "tool",    "output", "and",     "long",    "documents", "so",    "prefill", "costs",
    "grow",    "each",   "turn",    "while",   "decode",  "nodes",   "already", "hold",
    "that",    "cache",  "which",   "moves",   "back",    "over",    "shared",  "memory",
    "instead", "being",  "computed", "from",   "scratch", "agents",  "call",    "functions",
    "search",  "files",  "write",   "patches", "run",     "tests",   "report",  "results"};

static void add_words(dx_buf *b, unsigned *seed, int n)
{
    for (int i = 0; i < n; i++) {
        *seed = *seed * 1103515245u + 12345u;
        dx_buf_printf(b, "%s%s", i ? " " : "",
                      k_words[(*seed >> 16) % (sizeof k_words / sizeof k_words[0])]);
    }
}

static json_t *user_msg(unsigned *seed, const char *lead, int n_words)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_puts(&b, lead);
    add_words(&b, seed, n_words);
    json_t *m = json_pack("{s:s,s:s%}", "role", "user", "content", b.data ? b.data : "", b.len);
    dx_buf_free(&b);
    return m;
}

/* ---- one streamed turn ------------------------------------------------------- */

typedef struct {
    uint64_t t0, t_first;
    dx_buf in;   /* bytes not yet split into events */
    dx_buf text; /* the answer */
    long prompt, cached, completion;
    int bad;
} turn_state;

static void on_event(turn_state *t, const char *ev, size_t n)
{
    if (n < 6 || memcmp(ev, "data: ", 6)) return;
    if (n == 12 && !memcmp(ev + 6, "[DONE]", 6)) return;
    json_error_t je;
    json_t *v = json_loadb(ev + 6, n - 6, JSON_ALLOW_NUL, &je);
    if (!v) {
        t->bad = 1;
        return;
    }
    json_t *delta = json_object_get(json_array_get(json_object_get(v, "choices"), 0), "delta");
    json_t *c = json_object_get(delta, "content");
    if (json_is_string(c) && json_string_length(c)) {
        if (!t->t_first) t->t_first = dx_now_ns();
        dx_buf_append(&t->text, json_string_value(c), json_string_length(c));
    }
    json_t *u = json_object_get(v, "usage");
    if (json_is_object(u)) {
        t->prompt = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
        t->completion = (long)json_integer_value(json_object_get(u, "completion_tokens"));
        t->cached = (long)json_integer_value(
            json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    }
    json_decref(v);
}

static size_t on_data(char *p, size_t sz, size_t n, void *user)
{
    turn_state *t = user;
    if (dx_buf_append(&t->in, p, sz * n)) return 0;
    for (;;) {
        char *end = t->in.len ? memmem(t->in.data, t->in.len, "\n\n", 2) : NULL;
        if (!end) break;
        on_event(t, t->in.data, (size_t)(end - t->in.data));
        dx_buf_consume(&t->in, (size_t)(end - t->in.data) + 2);
    }
    return sz * n;
}

static int post_turn(const bench_chat_config *c, const char *body, turn_state *t)
{
    char url[512];
    snprintf(url, sizeof url, "%s/v1/chat/completions", c->url);
    CURL *h = curl_easy_init();
    if (!h) return dx_errf(DX_ENOMEM, "curl_easy_init failed");
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    char cid[300];
    if (c->conversation_id) {
        snprintf(cid, sizeof cid, "X-Conversation-Id: %s", c->conversation_id);
        hdrs = curl_slist_append(hdrs, cid);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)((c->timeout_s > 0 ? c->timeout_s : 600) * 1e3));
    t->t0 = dx_now_ns();
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK) return dx_errf(DX_EIO, "%s: %s", url, curl_easy_strerror(rc));
    if (status != 200)
        return dx_errf(DX_EPROTO, "%s: HTTP %ld: %.*s", url, status, (int)(t->in.len < 300 ? t->in.len : 300),
                       t->in.data ? t->in.data : "");
    if (t->bad || !t->t_first)
        return dx_errf(DX_EPROTO, "%s: the stream had no content or a malformed event", url);
    return 0;
}

static int first_model(const bench_chat_config *c, char *out, size_t cap)
{
    char url[512];
    snprintf(url, sizeof url, "%s/v1/models", c->url);
    turn_state t = {0};
    dx_buf_init(&t.in, 0);
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    json_error_t je;
    json_t *v = rc == CURLE_OK ? json_loadb(t.in.data, t.in.len, 0, &je) : NULL;
    json_t *id = json_object_get(json_array_get(json_object_get(v, "data"), 0), "id");
    int ok = json_is_string(id);
    if (ok) snprintf(out, cap, "%s", json_string_value(id));
    json_decref(v);
    dx_buf_free(&t.in);
    return ok ? 0 : dx_errf(DX_EIO, "%s: no model listed", url);
}

/* ---- the conversation ---------------------------------------------------------- */

static char *turn_body(const bench_chat_config *c, const char *model, json_t *msgs)
{
    json_t *b = json_pack("{s:s,s:O,s:i,s:f,s:b,s:b,s:{s:b}}", "model", model, "messages", msgs,
                          "max_tokens", c->output_tokens, "temperature", 0.0, "ignore_eos", 1,
                          "stream", 1, "stream_options", "include_usage", 1);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static int run_turn(const bench_chat_config *c, const char *model, json_t *msgs,
                    bench_chat_turn *out)
{
    char *body = turn_body(c, model, msgs);
    turn_state t = {0};
    dx_buf_init(&t.in, 0);
    dx_buf_init(&t.text, 0);
    int rc = body ? post_turn(c, body, &t) : dx_errf(DX_ENOMEM, "out of memory");
    uint64_t t_end = dx_now_ns();
    if (!rc) {
        *out = (bench_chat_turn){.ttft_s = (double)(t.t_first - t.t0) * 1e-9,
                                 .total_s = (double)(t_end - t.t0) * 1e-9,
                                 .prompt_tokens = t.prompt,
                                 .cached_tokens = t.cached,
                                 .completion_tokens = t.completion,
                                 .answer_bytes = t.text.len};
        json_t *m = json_pack("{s:s,s:s%}", "role", "assistant", "content",
                              t.text.data ? t.text.data : "", t.text.len);
        json_array_append_new(msgs, m);
        out->answer = json_string_value(json_object_get(m, "content"));
    }
    free(body);
    dx_buf_free(&t.in);
    dx_buf_free(&t.text);
    return rc;
}

int bench_chat_run(const bench_chat_config *c, bench_chat_turn *out)
{
    char model[256];
    if (c->model)
        snprintf(model, sizeof model, "%s", c->model);
    else if (first_model(c, model, sizeof model))
        return DX_EIO;
    unsigned seed = c->seed;
    json_t *msgs = json_array();
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content",
                                          "You are an agent working through a long task."));
    json_array_append_new(msgs, user_msg(&seed, "Here is the document: ", c->prefix_words));
    int rc = 0;
    for (int i = 0; !rc && i < c->turns; i++) {
        if (i) json_array_append_new(msgs, user_msg(&seed, "Next: ", c->input_words));
        rc = run_turn(c, model, msgs, &out[i]);
        if (!rc && c->on_turn) c->on_turn(c->user, i + 1, &out[i]);
        out[i].answer = NULL; /* it lives in msgs, which goes below */
    }
    json_decref(msgs);
    return rc;
}
