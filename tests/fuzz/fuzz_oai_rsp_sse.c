/* Fuzz target: the Responses API stream encoder (oai_rsp_stream) fed any
 * sequence of oai_tools events, in any batches, ended any way.  The bytes:
 * the first picks the end (stop, length, tool_calls, an error, an error
 * before any event); then records [op][len][len bytes], op % 6 one of
 * reasoning, content, a call's head (the bytes its name), its arguments
 * (for the open call, or with op's high bit for another index), the end of
 * a batch, or the encoder's result taken mid-stream.
 *
 * Checked: every feed succeeds or refuses an out-of-order event (DX_EINVAL)
 * and goes on; the stream is well-formed typed events with increasing
 * sequence numbers, as the SDK accumulates them (rsp_sse_check.h), whose
 * deltas concatenate to each item's text in its done events and in the
 * final response object; the items are the ones the events make (a new
 * item when the kind changes, each call its own), their texts the bytes
 * fed as a client reads them (U+FFFD for bad UTF-8); the final object is
 * the one oai_rsp_stream_response returns; the encoder's result holds the
 * bytes fed, which the store's history takes. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"
#include "oai/oai_resp.h"
#include "oai/oai_rsp.h"
#include "oai/oai_tools.h"
#include "rsp_sse_check.h"

enum { X_REASONING, X_CONTENT, X_CALL };

typedef struct {
    int kind;
    dx_buf text, name; /* a call's arguments in text */
    char id[16];
} x_item;

#define MAX_ITEMS  256
#define MAX_EVENTS 64

typedef struct {
    x_item it[MAX_ITEMS];
    size_t n;
    int open; /* the last item takes more text (a call: its arguments) */
    dx_buf content, reasoning;
} expect;

static x_item *x_new(expect *x, int kind)
{
    DX_ASSERT(x->n < MAX_ITEMS);
    x_item *it = &x->it[x->n++];
    it->kind = kind;
    dx_buf_init(&it->text, 0);
    dx_buf_init(&it->name, 0);
    x->open = 1;
    return it;
}

/* What the encoder makes of one event it accepted. */
static void x_event(expect *x, const oai_tools_ev *e)
{
    x_item *last = x->n ? &x->it[x->n - 1] : NULL;
    if (e->kind == OAI_TOOLS_EV_REASONING || e->kind == OAI_TOOLS_EV_CONTENT) {
        int kind = e->kind == OAI_TOOLS_EV_CONTENT ? X_CONTENT : X_REASONING;
        if (!e->len) return;
        if (!x->open || last->kind != kind) last = x_new(x, kind);
        dx_buf_append(&last->text, e->text, e->len);
        dx_buf_append(kind == X_CONTENT ? &x->content : &x->reasoning, e->text, e->len);
    } else if (e->kind == OAI_TOOLS_EV_CALL) {
        last = x_new(x, X_CALL);
        dx_buf_append(&last->name, e->text, e->len);
        snprintf(last->id, sizeof last->id, "%s", e->id);
    } else {
        dx_buf_append(&last->text, e->text, e->len);
        x->open = 0;
    }
}

/* 1 when the encoder takes e: ARGS only for the open call (oai_tools' order). */
static int x_accepts(const expect *x, const oai_tools_ev *e, uint32_t open_call)
{
    if (e->kind != OAI_TOOLS_EV_ARGS) return 1;
    return x->open && x->n && x->it[x->n - 1].kind == X_CALL && e->index == open_call;
}

static int same_sent(const json_t *s, const dx_buf *raw)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_utf8_sanitize((const uint8_t *)(raw->data ? raw->data : ""), raw->len, &b);
    int same = json_is_string(s) && json_string_length(s) == b.len &&
               !memcmp(json_string_value(s), b.data ? b.data : "", b.len);
    dx_buf_free(&b);
    return same;
}

static void check_items(const json_t *final, const expect *x, int finished)
{
    json_t *out = json_object_get(final, "output");
    size_t n = x->n || !finished ? x->n : 1; /* an empty answer is an empty message */
    DX_ASSERT(json_array_size(out) == n);
    for (size_t i = 0; i < x->n; i++) {
        const x_item *it = &x->it[i];
        json_t *o = json_array_get(out, i);
        const char *type = json_string_value(json_object_get(o, "type"));
        if (it->kind == X_CALL) {
            DX_ASSERT(!strcmp(type, "function_call"));
            DX_ASSERT(same_sent(json_object_get(o, "name"), &it->name));
            DX_ASSERT(same_sent(json_object_get(o, "arguments"), &it->text));
            DX_ASSERT(!strcmp(json_string_value(json_object_get(o, "call_id")), it->id));
            continue;
        }
        DX_ASSERT(!strcmp(type, it->kind == X_CONTENT ? "message" : "reasoning"));
        json_t *part = json_array_get(json_object_get(o, "content"), 0);
        DX_ASSERT(same_sent(json_object_get(part, "text"), &it->text));
    }
}

static void check_result(const oai_rsp_stream *s, const expect *x)
{
    oai_tools_result r;
    DX_ASSERT(oai_rsp_stream_result(s, &r) == 0);
    DX_ASSERT(r.content_len == x->content.len && r.reasoning_len == x->reasoning.len);
    DX_ASSERT(!r.content_len || !memcmp(r.content, x->content.data, r.content_len));
    DX_ASSERT(!r.reasoning_len || !memcmp(r.reasoning, x->reasoning.data, r.reasoning_len));
    size_t k = 0;
    for (size_t i = 0; i < x->n; i++) {
        if (x->it[i].kind != X_CALL) continue;
        DX_ASSERT(k < r.n_calls && !strcmp(r.calls[k].id, x->it[i].id));
        DX_ASSERT(r.calls[k].arguments_len == x->it[i].text.len);
        k++;
    }
    DX_ASSERT(k == r.n_calls);
    oai_tools_result_free(&r);
}

typedef struct {
    oai_rsp_stream *s;
    dx_buf out;
    oai_tools_ev ev[MAX_EVENTS];
    char ids[MAX_EVENTS][16];
    size_t n_ev;
    uint32_t n_calls, open_call;
} feeder;

/* Feeds the batch; the encoder stops at the first event it refuses. */
static void feed_batch(feeder *f, expect *x)
{
    size_t k = 0;
    while (k < f->n_ev && x_accepts(x, &f->ev[k], f->open_call)) {
        if (f->ev[k].kind == OAI_TOOLS_EV_CALL) f->open_call = f->ev[k].index;
        x_event(x, &f->ev[k++]);
    }
    int rc = oai_rsp_stream_feed(f->s, f->ev, f->n_ev, &f->out);
    DX_ASSERT(k == f->n_ev ? rc == 0 : rc == DX_EINVAL);
    f->n_ev = 0;
}

/* One record; 0 when it ends a batch. */
static int record(feeder *f, uint8_t op, const char *p, uint8_t len)
{
    oai_tools_ev e = {.text = p, .len = len};
    switch (op % 6) {
    case 0:
        e.kind = OAI_TOOLS_EV_REASONING;
        break;
    case 1:
        e.kind = OAI_TOOLS_EV_CONTENT;
        break;
    case 2:
        e.kind = OAI_TOOLS_EV_CALL, e.index = f->n_calls;
        snprintf(f->ids[f->n_ev], sizeof f->ids[0], "call_%u", f->n_calls++);
        e.id = f->ids[f->n_ev];
        break;
    case 3:
        e.kind = OAI_TOOLS_EV_ARGS;
        e.index = op & 0x80 ? op : f->n_calls ? f->n_calls - 1 : 0;
        break;
    case 4:
        return 0;
    default: { /* the encoder's result mid-stream: it changes nothing */
        oai_tools_result r;
        DX_ASSERT(oai_rsp_stream_result(f->s, &r) == 0);
        oai_tools_result_free(&r);
        return 1;
    }
    }
    f->ev[f->n_ev++] = e;
    return f->n_ev < MAX_EVENTS;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const finish[] = {"stop", "length", "tool_calls"};
    static expect x; /* large: not on the stack */
    static feeder f;
    if (size < 1) return 0;
    int end = data[0] % 5; /* 0..2: a finish; 3: an error; 4: an error at once */
    oai_rsp_meta m = {"resp_0123456789abcdef", "m\"odel", 1700000000, NULL};
    memset(&x, 0, sizeof x);
    memset(&f, 0, sizeof f);
    f.s = oai_rsp_stream_create(&m);
    dx_buf_init(&f.out, 0);
    DX_ASSERT(oai_rsp_stream_begin(f.s, &f.out) == 0);
    for (size_t i = 1; end != 4 && i + 2 <= size && x.n < MAX_ITEMS - MAX_EVENTS;) {
        uint8_t op = data[i], len = data[i + 1];
        if (i + 2 + len > size) len = (uint8_t)(size - i - 2);
        if (!record(&f, op, (const char *)data + i + 2, len)) feed_batch(&f, &x);
        i += 2 + (size_t)len;
    }
    feed_batch(&f, &x);
    oai_rsp_usage u = {7, 3, 5, 1};
    if (end < 3)
        DX_ASSERT(oai_rsp_stream_finish(f.s, finish[end], &u, &f.out) == 0);
    else
        DX_ASSERT(oai_rsp_stream_fail(f.s, 500, "engine \"error\"", NULL, &f.out) == 0);
    rsp_chk c;
    if (rsp_chk_run(&c, f.out.data, f.out.len, 1)) {
        fprintf(stderr, "%s\n%s\n", c.why, f.out.data);
        DX_ASSERT(!"a malformed stream");
    }
    size_t n;
    const char *fin = oai_rsp_stream_response(f.s, &n);
    json_error_t je;
    json_t *obj = json_loadb(fin, n, JSON_ALLOW_NUL, &je);
    DX_ASSERT(obj && json_equal(obj, c.final));
    check_items(obj, &x, end < 3);
    check_result(f.s, &x);
    json_decref(obj);
    rsp_chk_free(&c);
    for (size_t k = 0; k < x.n; k++) dx_buf_free(&x.it[k].text), dx_buf_free(&x.it[k].name);
    dx_buf_free(&x.content);
    dx_buf_free(&x.reasoning);
    dx_buf_free(&f.out);
    oai_rsp_stream_destroy(f.s);
    return 0;
}
