/* Fuzz target: tool-call and reasoning parsing (oai_tools) and the JSON
 * scanner under it (oai_jscan).  Byte 0 picks the options (bits 0-1: none,
 * qwen, llama3, qwen; bit 2: reasoning; bit 3: the prompt opened <think>;
 * bit 4: a tiny hold limit; bit 5: also stream byte by byte), byte 1 seeds
 * the random pieces; the rest is the model's answer.  Invariants: streaming
 * in any pieces releases events that add up to the one-shot result (same
 * content, reasoning, calls, ids, arguments), each call as a head then its
 * arguments; every call's arguments are one JSON object; the JSON written
 * for messages and deltas parses; the scanner agrees with jansson on the
 * answer read as a JSON object, and its unquoting on the answer read as a
 * JSON string; and the answer read as a prompt leaves <think> open exactly
 * when its last <think> has no </think> after it. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"
#include "base/dx_utf8.h"
#include "oai/oai_jscan.h"
#include "oai/oai_tools.h"

static void check_members(const dx_buf *b)
{
    dx_buf w;
    dx_buf_init(&w, 0);
    DX_ASSERT(dx_buf_printf(&w, "{%.*s}", (int)b->len, b->data) == 0);
    json_error_t je;
    json_t *v = json_loadb(w.data, w.len, JSON_ALLOW_NUL, &je); /* text may hold \u0000 */
    DX_ASSERT(json_is_object(v));
    json_decref(v);
    dx_buf_free(&w);
}

/* What jansson may refuse in text the scanner accepts: values it cannot
 * hold (huge numbers, lone surrogate escapes). */
static int jansson_limit(const json_error_t *je)
{
    return strstr(je->text, "overflow") || strstr(je->text, "Unicode") ||
           strstr(je->text, "too big");
}

/* The arguments are the compact form of one JSON object. */
static void check_args(const char *a, size_t n)
{
    DX_ASSERT(oai_jscan_is_object(a, n));
    for (size_t i = 0, in_str = 0, esc = 0; i < n; i++) {
        if (in_str) {
            if (esc)
                esc = 0;
            else if (a[i] == '\\')
                esc = 1;
            else if (a[i] == '"')
                in_str = 0;
        } else {
            DX_ASSERT(a[i] != ' ' && a[i] != '\n' && a[i] != '\t' && a[i] != '\r');
            in_str = a[i] == '"';
        }
    }
    json_error_t je;
    json_t *v = json_loadb(a, n, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    DX_ASSERT(json_is_object(v) || (!v && jansson_limit(&je)));
    json_decref(v);
}

typedef struct {
    dx_buf content, reasoning, scratch;
    size_t n_calls;
    int in_call;
    const oai_tools_result *want;
} acc;

static void take(acc *a, const oai_tools_ev *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const oai_tools_ev *e = &ev[i];
        dx_buf_reset(&a->scratch);
        DX_ASSERT(oai_tools_ev_json(&a->scratch, e) == 0);
        check_members(&a->scratch);
        if (e->kind == OAI_TOOLS_EV_CONTENT || e->kind == OAI_TOOLS_EV_REASONING) {
            DX_ASSERT(!a->in_call && e->len > 0);
            dx_buf_append(e->kind == OAI_TOOLS_EV_CONTENT ? &a->content : &a->reasoning, e->text,
                          e->len);
        } else if (e->kind == OAI_TOOLS_EV_CALL) {
            DX_ASSERT(!a->in_call && e->index == a->n_calls && a->n_calls < a->want->n_calls);
            const oai_tool_call *c = &a->want->calls[e->index];
            DX_ASSERT(!strcmp(e->id, c->id) && e->len == strlen(c->name));
            DX_ASSERT(!memcmp(e->text, c->name, e->len));
            a->in_call = 1;
        } else {
            DX_ASSERT(e->kind == OAI_TOOLS_EV_ARGS && a->in_call && e->index == a->n_calls);
            const oai_tool_call *c = &a->want->calls[e->index];
            DX_ASSERT(e->len == c->arguments_len && !memcmp(e->text, c->arguments, e->len));
            a->in_call = 0;
            a->n_calls++;
        }
    }
}

static int same(const dx_buf *b, const char *p, size_t n)
{
    return b->len == n && (!n || !memcmp(b->data, p, n));
}

/* Streams p[0..n) in pieces of 1..max_piece bytes and checks the events
 * against the one-shot result r. */
static void check_stream(const oai_tools_opts *o, const char *p, size_t n, dx_rng *rng,
                         size_t max_piece, const oai_tools_result *r)
{
    acc a = {.want = r};
    dx_buf_init(&a.content, 0);
    dx_buf_init(&a.reasoning, 0);
    dx_buf_init(&a.scratch, 0);
    oai_tools *t = oai_tools_create(o);
    DX_ASSERT(t);
    const oai_tools_ev *ev;
    size_t n_ev;
    for (size_t off = 0; off < n;) {
        size_t k = 1 + dx_rng_next(rng) % max_piece;
        if (k > n - off) k = n - off;
        DX_ASSERT(oai_tools_feed(t, p + off, k, &ev, &n_ev) == 0);
        take(&a, ev, n_ev);
        off += k;
    }
    DX_ASSERT(oai_tools_finish(t, &ev, &n_ev) == 0);
    take(&a, ev, n_ev);
    DX_ASSERT(!a.in_call && a.n_calls == r->n_calls && oai_tools_n_calls(t) == r->n_calls);
    DX_ASSERT(same(&a.content, r->content, r->content_len));
    DX_ASSERT(same(&a.reasoning, r->reasoning, r->reasoning_len));
    DX_ASSERT(!strcmp(oai_tools_finish_reason(t, "stop"), r->n_calls ? "tool_calls" : "stop"));
    oai_tools_destroy(t);
    dx_buf_free(&a.content);
    dx_buf_free(&a.reasoning);
    dx_buf_free(&a.scratch);
}

/* The scanner and jansson on the answer itself as a JSON object. */
static void check_scanner(const char *p, size_t n)
{
    size_t opens = 0;
    for (size_t i = 0; i < n; i++) opens += p[i] == '{' || p[i] == '[';
    int ours = oai_jscan_is_object(p, n);
    json_error_t je;
    json_t *v = json_loadb(p, n, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    /* jansson 2.14 swallows a NUL byte right after a number or literal
     * ({"a": 1\0} loads): such input is not JSON, and the scanner says so */
    if (json_is_object(v) && opens <= OAI_JSCAN_MAX_DEPTH && !memchr(p, 0, n)) DX_ASSERT(ours);
    if (ours && dx_utf8_valid_prefix((const uint8_t *)p, n) == n)
        DX_ASSERT(json_is_object(v) || (!v && jansson_limit(&je)));
    if (ours) { /* compacting keeps the value */
        dx_buf c;
        dx_buf_init(&c, 0);
        DX_ASSERT(oai_jscan_compact(p, n, &c) == 0);
        DX_ASSERT(oai_jscan_is_object(c.data, c.len));
        json_t *w = json_loadb(c.data, c.len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
        DX_ASSERT(!v || json_equal(v, w));
        json_decref(w);
        dx_buf_free(&c);
    }
    json_decref(v);
}

/* The unquoting the parser uses for names and string arguments, against
 * jansson, on the answer when it is one JSON string literal. */
static void check_unquote(const char *p, size_t n)
{
    if (n < 2 || p[0] != '"' || p[n - 1] != '"') return;
    json_error_t je;
    json_t *v = json_loadb(p, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (json_is_string(v)) {
        dx_buf b;
        dx_buf_init(&b, 0);
        DX_ASSERT(oai_jscan_unquote(p, n, &b) == 0);
        DX_ASSERT(b.len == json_string_length(v) &&
                  (!b.len || !memcmp(b.data, json_string_value(v), b.len)));
        dx_buf_free(&b);
    }
    json_decref(v);
}

/* oai_tools_think_open against a plain search from the end. */
static void check_think_open(const char *p, size_t n)
{
    static const char open[] = "<think>", close[] = "</think>";
    size_t last_open = SIZE_MAX, last_close = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (n - i >= 7 && !memcmp(p + i, open, 7)) last_open = i;
        if (n - i >= 8 && !memcmp(p + i, close, 8)) last_close = i;
    }
    int want = last_open != SIZE_MAX && (last_close == SIZE_MAX || last_close < last_open);
    DX_ASSERT(oai_tools_think_open(p, n) == want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    static const enum oai_tools_fmt k_fmt[4] = {OAI_TOOLS_NONE, OAI_TOOLS_QWEN, OAI_TOOLS_LLAMA3,
                                                OAI_TOOLS_QWEN};
    uint8_t ob = data[0];
    oai_tools_opts o = {.tools = k_fmt[ob & 3],
                        .reasoning = (ob >> 2) & 1,
                        .think_open = (ob >> 3) & 1,
                        .id_seed = 1 + data[1],
                        .max_held = ob & 0x10 ? 48 : 0};
    const char *p = (const char *)data + 2;
    size_t n = size - 2;
    oai_tools_result r;
    DX_ASSERT(oai_tools_parse(&o, p, n, &r) == 0);
    for (size_t i = 0; i < r.n_calls; i++) {
        DX_ASSERT(r.calls[i].name[0] && !memcmp(r.calls[i].id, "call_", 5));
        check_args(r.calls[i].arguments, r.calls[i].arguments_len);
    }
    DX_ASSERT(!r.content == !r.content_len && !r.reasoning == !r.reasoning_len);
    dx_buf b;
    dx_buf_init(&b, 0);
    DX_ASSERT(oai_tools_message_json(&b, &r) == 0);
    check_members(&b);
    dx_buf_free(&b);

    dx_rng rng;
    dx_rng_seed(&rng, data[1]);
    check_stream(&o, p, n, &rng, data[1] & 0x80 ? 4 : 32, &r);
    if (ob & 0x20) check_stream(&o, p, n, &rng, 1, &r);
    oai_tools_result_free(&r);
    check_scanner(p, n);
    check_unquote(p, n);
    check_think_open(p, n);
    return 0;
}
