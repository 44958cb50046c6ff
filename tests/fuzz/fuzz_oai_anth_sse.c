/* Fuzz target: the Anthropic Messages stream encoder (oai_anth_stream)
 * fed arbitrary sequences of the chat path's answer events.
 *
 * The input is readable on purpose, so that the corpus reads as answers:
 * byte 0 picks how the answer ends (% 3: stop, length, a stop sequence),
 * then records separated by NUL bytes, each a kind letter and its bytes:
 *   c TEXT      content          r TEXT   reasoning
 *   t NAME\1ARGS  a call and its arguments (any bytes: valid or not)
 *   a I TEXT    an ARGS event for call index I (a byte), wherever it falls
 *   e           an empty content event
 *   |           a boundary between two feeds
 * (other letters: their value % 6 picks one of these).  Text events never
 * end inside a UTF-8 character, as the tool-call parser guarantees, and
 * names hold no NUL.
 *
 * The stream must read back as a well-formed Anthropic event stream
 * (tests/anth_sse_test.h, as strictly as the SDK relies on it) whose
 * accumulated message equals oai_anth_message_json over the same events
 * collected as oai_tools collects them: each kind's text over its blocks,
 * the calls with their ids and inputs, the stop reason and the usage.  The
 * encoder is used twice over, for the reuse a node makes of it.  (Only an
 * answer with a number past a double, which jansson cannot read, is not
 * compared.) */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../anth_sse_test.h"
#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"
#include "oai/oai_anth.h"
#include "oai/oai_tools.h"

#define MAX_EV 4096

typedef struct {
    oai_tools_ev ev[MAX_EV];
    int cut[MAX_EV]; /* a feed ends after event i */
    char ids[MAX_EV][32];
    size_t n;
} events;

/* The events the records describe. */
static void read_records(const uint8_t *p, size_t n, events *E)
{
    static const char kinds[] = "crtae|";
    uint32_t calls = 0;
    size_t i = 0;
    while (i < n && E->n < MAX_EV) {
        const uint8_t *end = memchr(p + i, 0, n - i);
        size_t len = end ? (size_t)(end - (p + i)) : n - i, next = i + len + 1;
        if (!len) {
            i = next;
            continue;
        }
        char k = (char)p[i];
        if (!strchr(kinds, k)) k = kinds[p[i] % 6];
        const char *text = (const char *)p + i + 1;
        size_t tl = len - 1;
        oai_tools_ev *ev = &E->ev[E->n];
        memset(ev, 0, sizeof *ev);
        if (k == '|') {
            if (E->n) E->cut[E->n - 1] = 1;
        } else if (k == 'c' || k == 'r' || k == 'e') {
            if (k == 'e') tl = 0;
            /* what is left may end in a lead byte again ("\xc9\xc9") */
            for (size_t t; (t = dx_utf8_incomplete_tail((const uint8_t *)text, tl));) tl -= t;
            *ev = (oai_tools_ev){k == 'r' ? OAI_TOOLS_EV_REASONING : OAI_TOOLS_EV_CONTENT, 0, text,
                                 tl, NULL};
            E->n++;
        } else if (k == 'a') {
            *ev = (oai_tools_ev){OAI_TOOLS_EV_ARGS, tl ? (uint8_t)text[0] : 0, text + !!tl,
                                 tl ? tl - 1 : 0, NULL};
            E->n++;
        } else if (k == 't' && E->n + 1 < MAX_EV) {
            const char *sep = memchr(text, 1, tl);
            size_t nl = sep ? (size_t)(sep - text) : tl;
            snprintf(E->ids[E->n], sizeof E->ids[E->n], "call_%024x", calls * 2654435761u);
            *ev = (oai_tools_ev){OAI_TOOLS_EV_CALL, calls, text, nl, E->ids[E->n]};
            E->n++;
            if (sep)
                E->ev[E->n++] =
                    (oai_tools_ev){OAI_TOOLS_EV_ARGS, calls, sep + 1, tl - nl - 1, NULL};
            calls++;
        }
        i = next;
    }
}

/* What a whole answer has for the same events: the encoder's rules (an
 * ARGS counts when it directly follows its CALL, empty text aside), as
 * oai_tools' collector applies them to a parser's events. */
static void collect(const events *E, oai_tools_result *r, dx_buf *content, dx_buf *reasoning)
{
    int open_tool = 0, has_args = 0;
    uint32_t open_index = 0;
    memset(r, 0, sizeof *r);
    r->calls = dx_calloc(E->n ? E->n : 1, sizeof *r->calls);
    for (size_t i = 0; i < E->n; i++) {
        const oai_tools_ev *e = &E->ev[i];
        if (e->kind == OAI_TOOLS_EV_CONTENT || e->kind == OAI_TOOLS_EV_REASONING) {
            if (!e->len) continue;
            dx_buf_append(e->kind == OAI_TOOLS_EV_CONTENT ? content : reasoning, e->text, e->len);
            open_tool = 0;
        } else if (e->kind == OAI_TOOLS_EV_CALL) {
            oai_tool_call *c = &r->calls[r->n_calls++];
            snprintf(c->id, sizeof c->id, "%s", e->id);
            c->name = dx_strndup(e->text, e->len);
            open_tool = 1, has_args = 0, open_index = e->index;
        } else if (open_tool && !has_args && e->index == open_index) {
            oai_tool_call *c = &r->calls[r->n_calls - 1];
            c->arguments = dx_strndup(e->text, e->len);
            c->arguments_len = e->len;
            has_args = 1;
        }
    }
    r->content = content->data, r->content_len = content->len;
    r->reasoning = reasoning->data, r->reasoning_len = reasoning->len;
}

static void stream(oai_anth_stream *s, const events *E, const oai_anth_end *end, dx_buf *b)
{
    DX_ASSERT(oai_anth_stream_start(s, b, "msg_f", "claude-f", &end->usage) == 0);
    size_t from = 0;
    for (size_t i = 0; i < E->n; i++)
        if (E->cut[i] || i + 1 == E->n) {
            DX_ASSERT(oai_anth_stream_feed(s, b, E->ev + from, i + 1 - from) == 0);
            from = i + 1;
        }
    DX_ASSERT(oai_anth_stream_end(s, b, end) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static events E;
    if (size < 1) return 0;
    memset(&E, 0, sizeof E);
    read_records(data + 1, size - 1, &E);
    static const char *const finish[] = {"stop", "length", "stop"};
    oai_anth_end end = {.finish = finish[data[0] % 3],
                        .stop_sequence = data[0] % 3 == 2 ? "\n\nHuman:" : NULL,
                        .usage = {.prompt = (uint32_t)size * 7,
                                  .cached = (uint32_t)size * 3,
                                  .completion = (uint32_t)E.n}};
    oai_anth_stream *s = oai_anth_stream_create();
    DX_ASSERT(s);
    dx_buf b, whole, content, reasoning;
    dx_buf_init(&b, 0);
    dx_buf_init(&whole, 0);
    dx_buf_init(&content, 0);
    dx_buf_init(&reasoning, 0);
    oai_tools_result r;
    collect(&E, &r, &content, &reasoning);
    DX_ASSERT(oai_anth_message_json(&whole, "msg_f", "claude-f", &r, &end) == 0);
    json_error_t je;
    json_t *wj = json_loadb(whole.data, whole.len, ANTH_SSE_JSON, &je);
    /* a number past a double (1e400) is JSON too, but not one jansson reads */
    DX_ASSERT(wj || strstr(je.text, "overflow"));
    for (int round = 0; wj && round < 2; round++) {
        dx_buf_reset(&b);
        stream(s, &E, &end, &b);
        DX_ASSERT(oai_anth_stream_n_calls(s) == r.n_calls);
        char why[160];
        json_t *sj;
        if (anth_sse_read(b.data, b.len, &sj, why) || anth_sse_same(sj, wj, why)) {
            fprintf(stderr, "%s\n--- stream\n%s\n--- whole\n%s\n", why, b.data, whole.data);
            DX_ASSERT(!"oai_anth: the stream is not the whole message");
        }
        json_decref(sj);
    }
    json_decref(wj);
    for (size_t i = 0; i < r.n_calls; i++) {
        dx_free(r.calls[i].name);
        dx_free(r.calls[i].arguments);
    }
    dx_free(r.calls);
    dx_buf_free(&b);
    dx_buf_free(&whole);
    dx_buf_free(&content);
    dx_buf_free(&reasoning);
    oai_anth_stream_destroy(s);
    return 0;
}
