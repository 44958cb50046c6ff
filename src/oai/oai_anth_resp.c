/* oai_anth_resp: Anthropic Messages answers — the whole message, the event
 * stream and errors (see oai_anth.h).
 *
 * Written by hand into the caller's dx_buf, as oai_resp writes the chat
 * answers: a stream sends an event or two per token, and every string goes
 * through oai_json_str (invalid UTF-8 becomes U+FFFD), so the output is
 * always valid JSON whatever the model wrote.  A call's arguments are
 * copied into "input" as they are — the tool-call parser has checked them
 * as one JSON object in valid UTF-8 — after a check of the same, so that
 * even text that was not checked never breaks the message. */
#include "oai/oai_anth.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"
#include "oai/oai_jscan.h"

void oai_anth_make_id(char *out, size_t cap)
{
    oai_make_id(out, cap, "msg");
    if (cap > 4 && out[3] == '-') out[3] = '_';
}

const char *oai_anth_stop_reason(const oai_anth_end *e, size_t n_calls)
{
    const char *f = e->finish ? e->finish : "stop";
    if (n_calls || !strcmp(f, "tool_calls")) return "tool_use";
    if (!strcmp(f, "length")) return "max_tokens";
    return e->stop_sequence ? "stop_sequence" : "end_turn";
}

/* The cluster's reuse is what a client sees as its cache reads: the
 * prompt's tokens the node did not compute, whether it had them or pulled
 * them from another node. */
static int put_usage(dx_buf *b, const oai_usage *u, uint32_t output)
{
    uint32_t cached = u->cached < u->prompt ? u->cached : u->prompt;
    return dx_buf_printf(b,
                         "\"usage\":{\"input_tokens\":%u,\"cache_creation_input_tokens\":0,"
                         "\"cache_read_input_tokens\":%u,\"output_tokens\":%u}",
                         u->prompt - cached, cached, output);
}

static int put_str(dx_buf *b, const char *s)
{
    return s ? oai_json_str(b, s, strlen(s)) : dx_buf_puts(b, "null");
}

static int put_extra(dx_buf *b, const char *extra)
{
    return extra && *extra ? dx_buf_printf(b, ",%s", extra) : 0;
}

/* "toolu_" and the call id's digits (the chat path's ids are "call_…"). */
static int put_tool_id(dx_buf *b, const char *id)
{
    char t[80];
    snprintf(t, sizeof t, "toolu_%s", strncmp(id, "call_", 5) ? id : id + 5);
    return oai_json_str(b, t, strlen(t));
}

/* Arguments that can be copied into the JSON as its "input". */
static int args_ok(const char *p, size_t n)
{
    return p && n && dx_utf8_valid_prefix((const uint8_t *)p, n) == n && oai_jscan_is_object(p, n);
}

/* The fields after "stop_reason" common to the message and message_delta. */
static int put_stop(dx_buf *b, const oai_anth_end *e, size_t n_calls)
{
    const char *reason = oai_anth_stop_reason(e, n_calls);
    int rc = dx_buf_printf(b, "\"stop_reason\":\"%s\",\"stop_sequence\":", reason);
    return rc ? rc : put_str(b, strcmp(reason, "stop_sequence") ? NULL : e->stop_sequence);
}

static int put_tool_block(dx_buf *b, const char *id, const char *name, size_t name_len)
{
    int rc = dx_buf_puts(b, "{\"type\":\"tool_use\",\"id\":");
    if (!rc) rc = put_tool_id(b, id);
    if (!rc) rc = dx_buf_puts(b, ",\"name\":");
    if (!rc) rc = oai_json_str(b, name, name_len);
    return rc ? rc : dx_buf_puts(b, ",\"input\":");
}

static int put_blocks(dx_buf *b, const oai_tools_result *r)
{
    int rc = dx_buf_putc(b, '['), first = 1;
    if (!rc && r->reasoning_len) {
        rc = dx_buf_puts(b, "{\"type\":\"thinking\",\"thinking\":");
        if (!rc) rc = oai_json_str(b, r->reasoning, r->reasoning_len);
        if (!rc) rc = dx_buf_puts(b, ",\"signature\":\"\"}");
        first = 0;
    }
    if (!rc && r->content_len) {
        rc = dx_buf_puts(b,
                         first ? "{\"type\":\"text\",\"text\":" : ",{\"type\":\"text\",\"text\":");
        if (!rc) rc = oai_json_str(b, r->content, r->content_len);
        if (!rc) rc = dx_buf_putc(b, '}');
        first = 0;
    }
    for (size_t i = 0; !rc && i < r->n_calls; i++) {
        const oai_tool_call *c = &r->calls[i];
        if (!first) rc = dx_buf_putc(b, ',');
        first = 0;
        if (!rc) rc = put_tool_block(b, c->id, c->name, strlen(c->name));
        if (!rc)
            rc = args_ok(c->arguments, c->arguments_len)
                     ? dx_buf_append(b, c->arguments, c->arguments_len)
                     : dx_buf_puts(b, "{}");
        if (!rc) rc = dx_buf_putc(b, '}');
    }
    return rc ? rc : dx_buf_putc(b, ']');
}

int oai_anth_message_json(dx_buf *b, const char *id, const char *model, const oai_tools_result *r,
                          const oai_anth_end *e)
{
    int rc = dx_buf_puts(b, "{\"id\":");
    if (!rc) rc = put_str(b, id);
    if (!rc) rc = dx_buf_puts(b, ",\"type\":\"message\",\"role\":\"assistant\",\"content\":");
    if (!rc) rc = put_blocks(b, r);
    if (!rc) rc = dx_buf_puts(b, ",\"model\":");
    if (!rc) rc = put_str(b, model);
    if (!rc) rc = dx_buf_putc(b, ',');
    if (!rc) rc = put_stop(b, e, r->n_calls);
    if (!rc) rc = dx_buf_putc(b, ',');
    if (!rc) rc = put_usage(b, &e->usage, e->usage.completion);
    if (!rc) rc = put_extra(b, e->extra);
    return rc ? rc : dx_buf_putc(b, '}');
}

int oai_anth_count_json(dx_buf *b, uint32_t input_tokens)
{
    return dx_buf_printf(b, "{\"input_tokens\":%u}", input_tokens);
}

/* ---- the stream ------------------------------------------------------------ */

enum { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING, BLOCK_TOOL };

struct oai_anth_stream {
    int started, ended;
    int block;     /* the kind of the open block */
    uint32_t next; /* the index the next block gets */
    uint32_t call; /* BLOCK_TOOL: the call's index in the parser's events */
    int has_args;  /* BLOCK_TOOL: its ARGS event came */
    size_t n_calls;
};

oai_anth_stream *oai_anth_stream_create(void)
{
    return dx_calloc(1, sizeof(oai_anth_stream));
}

void oai_anth_stream_destroy(oai_anth_stream *s)
{
    dx_free(s);
}

size_t oai_anth_stream_n_calls(const oai_anth_stream *s)
{
    return s->n_calls;
}

/* "event: NAME\ndata: {"type":"NAME"" — the caller writes the rest and
 * closes it with end_event. */
static int begin_event(dx_buf *b, const char *name)
{
    return dx_buf_printf(b, "event: %s\ndata: {\"type\":\"%s\"", name, name);
}

static int end_event(dx_buf *b)
{
    return dx_buf_puts(b, "}\n\n");
}

int oai_anth_stream_start(oai_anth_stream *s, dx_buf *b, const char *id, const char *model,
                          const oai_usage *u)
{
    memset(s, 0, sizeof *s);
    s->started = 1;
    int rc = begin_event(b, "message_start");
    if (!rc) rc = dx_buf_puts(b, ",\"message\":{\"id\":");
    if (!rc) rc = put_str(b, id);
    if (!rc)
        rc = dx_buf_puts(b,
                         ",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":");
    if (!rc) rc = put_str(b, model);
    if (!rc) rc = dx_buf_puts(b, ",\"stop_reason\":null,\"stop_sequence\":null,");
    if (!rc) rc = put_usage(b, u, 0);
    if (!rc) rc = dx_buf_putc(b, '}');
    if (!rc) rc = end_event(b);
    /* Anthropic sends one at once: clients wait for it before the first block */
    if (!rc) rc = begin_event(b, "ping");
    return rc ? rc : end_event(b);
}

static int close_block(oai_anth_stream *s, dx_buf *b)
{
    if (s->block == BLOCK_NONE) return 0;
    s->block = BLOCK_NONE;
    int rc = begin_event(b, "content_block_stop");
    if (!rc) rc = dx_buf_printf(b, ",\"index\":%u", s->next - 1);
    return rc ? rc : end_event(b);
}

/* Closes the open block and opens one of `kind` (a CALL's for a tool). */
static int open_block(oai_anth_stream *s, dx_buf *b, int kind, const oai_tools_ev *call)
{
    static const char *const k_start[] = {
        [BLOCK_TEXT] = "{\"type\":\"text\",\"text\":\"\"}",
        [BLOCK_THINKING] = "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}",
    };
    int rc = close_block(s, b);
    if (!rc) rc = begin_event(b, "content_block_start");
    if (!rc) rc = dx_buf_printf(b, ",\"index\":%u,\"content_block\":", s->next);
    if (!rc && kind == BLOCK_TOOL) {
        rc = put_tool_block(b, call->id ? call->id : "", call->text, call->len);
        if (!rc) rc = dx_buf_puts(b, "{}}");
        s->call = call->index;
        s->has_args = 0;
        s->n_calls++;
    } else if (!rc) {
        rc = dx_buf_puts(b, k_start[kind]);
    }
    s->block = kind;
    s->next++;
    return rc ? rc : end_event(b);
}

/* content_block_delta of the open block: {"type":TYPE,"KEY":text}. */
static int delta(oai_anth_stream *s, dx_buf *b, const char *type, const char *key, const char *text,
                 size_t len)
{
    int rc = begin_event(b, "content_block_delta");
    if (!rc)
        rc = dx_buf_printf(b, ",\"index\":%u,\"delta\":{\"type\":\"%s\",\"%s\":", s->next - 1, type,
                           key);
    if (!rc) rc = oai_json_str(b, text, len);
    if (!rc) rc = dx_buf_putc(b, '}');
    return rc ? rc : end_event(b);
}

static int feed_one(oai_anth_stream *s, dx_buf *b, const oai_tools_ev *ev)
{
    int rc = 0;
    switch (ev->kind) {
    case OAI_TOOLS_EV_REASONING:
    case OAI_TOOLS_EV_CONTENT: {
        int thinking = ev->kind == OAI_TOOLS_EV_REASONING;
        int kind = thinking ? BLOCK_THINKING : BLOCK_TEXT;
        if (!ev->len) return 0; /* no block for nothing: the message has none either */
        if (s->block != kind) rc = open_block(s, b, kind, NULL);
        if (rc) return rc;
        return thinking ? delta(s, b, "thinking_delta", "thinking", ev->text, ev->len)
                        : delta(s, b, "text_delta", "text", ev->text, ev->len);
    }
    case OAI_TOOLS_EV_CALL:
        return open_block(s, b, BLOCK_TOOL, ev);
    case OAI_TOOLS_EV_ARGS:
        if (s->block != BLOCK_TOOL || s->call != ev->index || s->has_args) return 0;
        s->has_args = 1;
        if (!args_ok(ev->text, ev->len)) return 0; /* input stays {} */
        return delta(s, b, "input_json_delta", "partial_json", ev->text, ev->len);
    }
    DX_ASSERT(!"oai_anth: unknown event kind");
    return dx_errf(DX_EINVAL, "oai_anth: event kind %d", (int)ev->kind);
}

int oai_anth_stream_feed(oai_anth_stream *s, dx_buf *b, const oai_tools_ev *ev, size_t n)
{
    DX_ASSERT(s->started && !s->ended);
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) rc = feed_one(s, b, &ev[i]);
    return rc;
}

int oai_anth_stream_text(oai_anth_stream *s, dx_buf *b, const char *text, size_t len)
{
    oai_tools_ev ev = {.kind = OAI_TOOLS_EV_CONTENT, .text = text, .len = len};
    return oai_anth_stream_feed(s, b, &ev, 1);
}

int oai_anth_stream_end(oai_anth_stream *s, dx_buf *b, const oai_anth_end *e)
{
    DX_ASSERT(s->started && !s->ended);
    s->ended = 1;
    int rc = close_block(s, b);
    if (!rc) rc = begin_event(b, "message_delta");
    if (!rc) rc = dx_buf_puts(b, ",\"delta\":{");
    if (!rc) rc = put_stop(b, e, s->n_calls);
    if (!rc) rc = dx_buf_puts(b, "},");
    if (!rc) rc = put_usage(b, &e->usage, e->usage.completion);
    if (!rc) rc = put_extra(b, e->extra);
    if (!rc) rc = end_event(b);
    if (!rc) rc = begin_event(b, "message_stop");
    return rc ? rc : end_event(b);
}

/* ---- errors --------------------------------------------------------------- */

const char *oai_anth_error_type(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 402:
        return "billing_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
    case 431:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 408:
    case 504:
        return "timeout_error";
    case 503:
    case 529:
        return "overloaded_error";
    }
    return status >= 500 ? "api_error" : "invalid_request_error";
}

int oai_anth_error_json(dx_buf *b, int status, const char *message)
{
    int rc = dx_buf_printf(b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":",
                           oai_anth_error_type(status));
    if (!rc) rc = put_str(b, message ? message : "");
    return rc ? rc : dx_buf_puts(b, "}}");
}

int oai_anth_sse_error(dx_buf *b, int status, const char *message)
{
    int rc = dx_buf_puts(b, "event: error\ndata: ");
    if (!rc) rc = oai_anth_error_json(b, status, message);
    return rc ? rc : dx_buf_puts(b, "\n\n");
}

int oai_anth_http_error(dx_buf *b, int status, const char *message, const char *param,
                        const char *code)
{
    /* Anthropic's errors carry only a type and a message.  The message is
     * already in the API's terms: the translation names Anthropic's fields
     * and renames what the chat parser says (err_to_anth), and what the
     * node checks later ("messages" for a prompt over the context,
     * "max_tokens") has the same name in both APIs. */
    (void)param;
    (void)code;
    return oai_anth_error_json(b, status, message ? message : "");
}
