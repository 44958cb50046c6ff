/* rsp_sse_check: checks a Responses API event stream the way the official
 * SDK reads it (openai 6.49.0, lib/responses/ResponseAccumulator.js) and
 * more strictly: every event is "event: T\ndata: {JSON}\n\n" whose type is
 * T and whose sequence_number counts from 0; items are added at the next
 * output index, one at a time, get their parts and deltas, and are done
 * with exactly the text their deltas add up to; the stream ends with one
 * terminal event whose response object's output is the items as done.
 * Shared by tests/unit/test_oai_rsp.c and tests/fuzz/fuzz_oai_rsp_sse.c. */
#ifndef RSP_SSE_CHECK_H
#define RSP_SSE_CHECK_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    json_t *output; /* the items so far, as the deltas built them */
    long seq;
    long open;     /* the index of the open item, or -1 */
    int ended;     /* a terminal event was seen */
    int error;     /* an error event was seen */
    json_t *final; /* the terminal event's response object */
    char why[256];
} rsp_chk;

static int rsp_chk_fail(rsp_chk *c, const char *fmt, const char *a)
{
    snprintf(c->why, sizeof c->why, fmt, a);
    return -1;
}

static const char *rsp_chk_s(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static int rsp_chk_is(const json_t *o, const char *k, const char *v)
{
    return json_is_string(json_object_get(o, k)) && !strcmp(rsp_chk_s(o, k), v);
}

/* json_string_value with the length, for texts that may hold NUL */
static int rsp_chk_same_str(const json_t *a, const json_t *b)
{
    return json_is_string(a) && json_is_string(b) &&
           json_string_length(a) == json_string_length(b) &&
           !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
}

static int rsp_chk_append(json_t *o, const char *k, const json_t *delta)
{
    json_t *cur = json_object_get(o, k);
    if (!json_is_string(cur) || !json_is_string(delta)) return -1;
    size_t n = json_string_length(cur), d = json_string_length(delta);
    char *buf = malloc(n + d + 1);
    memcpy(buf, json_string_value(cur), n);
    memcpy(buf + n, json_string_value(delta), d);
    json_object_set_new(o, k, json_stringn(buf, n + d));
    free(buf);
    return 0;
}

/* The open item an event names (item_id, output_index, content_index). */
static json_t *rsp_chk_open(rsp_chk *c, const json_t *ev, const char *type, int with_content)
{
    json_t *it = json_array_get(c->output, (size_t)c->open);
    if (c->open < 0 || json_integer_value(json_object_get(ev, "output_index")) != c->open ||
        !rsp_chk_is(it, "type", type) || strcmp(rsp_chk_s(ev, "item_id"), rsp_chk_s(it, "id")))
        return NULL;
    if (!with_content) return it;
    if (json_integer_value(json_object_get(ev, "content_index")) != 0 ||
        !json_is_integer(json_object_get(ev, "content_index")))
        return NULL;
    return json_array_get(json_object_get(it, "content"), 0);
}

static int rsp_chk_added(rsp_chk *c, const json_t *ev)
{
    json_t *it = json_object_get(ev, "item");
    if (c->open >= 0) return rsp_chk_fail(c, "%s while an item is open", "output_item.added");
    if (json_integer_value(json_object_get(ev, "output_index")) != (long)json_array_size(c->output))
        return rsp_chk_fail(c, "%s: not the next output index", "output_item.added");
    if (!rsp_chk_is(it, "status", "in_progress") || !json_is_string(json_object_get(it, "id")))
        return rsp_chk_fail(c, "%s: no id, or not in_progress", "output_item.added");
    if (rsp_chk_is(it, "type", "function_call")) {
        if (!rsp_chk_is(it, "arguments", "") || !json_is_string(json_object_get(it, "call_id")) ||
            !json_is_string(json_object_get(it, "name")))
            return rsp_chk_fail(c, "%s: a malformed function_call", "output_item.added");
    } else if (rsp_chk_is(it, "type", "message") || rsp_chk_is(it, "type", "reasoning")) {
        json_t *content = json_object_get(it, "content");
        if (!json_is_array(content) || json_array_size(content))
            return rsp_chk_fail(c, "%s: content is not []", "output_item.added");
        if (rsp_chk_is(it, "type", "message") && !rsp_chk_is(it, "role", "assistant"))
            return rsp_chk_fail(c, "%s: a message's role is not assistant", "output_item.added");
    } else {
        return rsp_chk_fail(c, "%s: an unknown item type", "output_item.added");
    }
    c->open = (long)json_array_size(c->output);
    json_array_append_new(c->output, json_deep_copy(it));
    return 0;
}

static int rsp_chk_part(rsp_chk *c, const json_t *ev, int done)
{
    json_t *it = json_array_get(c->output, (size_t)c->open), *part = json_object_get(ev, "part");
    int msg = rsp_chk_is(it, "type", "message");
    if (c->open < 0 || !(msg || rsp_chk_is(it, "type", "reasoning")) ||
        json_integer_value(json_object_get(ev, "output_index")) != c->open ||
        strcmp(rsp_chk_s(ev, "item_id"), rsp_chk_s(it, "id")) ||
        !json_is_integer(json_object_get(ev, "content_index")) ||
        json_integer_value(json_object_get(ev, "content_index")) != 0)
        return rsp_chk_fail(c, "%s: not the open text item's part 0", "content_part");
    if (!rsp_chk_is(part, "type", msg ? "output_text" : "reasoning_text"))
        return rsp_chk_fail(c, "%s: the wrong part type", "content_part");
    json_t *content = json_object_get(it, "content");
    if (!done) {
        if (json_array_size(content) || !rsp_chk_is(part, "text", ""))
            return rsp_chk_fail(c, "%s: a second part, or one with text", "content_part.added");
        if (msg && (!json_is_array(json_object_get(part, "annotations")) ||
                    json_array_size(json_object_get(part, "annotations"))))
            return rsp_chk_fail(c, "%s: annotations are not []", "content_part.added");
        json_array_append_new(content, json_deep_copy(part));
        return 0;
    }
    if (!json_equal(part, json_array_get(content, 0)))
        return rsp_chk_fail(c, "%s: not the part its deltas built", "content_part.done");
    return 0;
}

static int rsp_chk_delta(rsp_chk *c, const json_t *ev, const char *type)
{
    json_t *delta = json_object_get(ev, "delta");
    if (!strcmp(type, "response.function_call_arguments.delta")) {
        json_t *it = rsp_chk_open(c, ev, "function_call", 0);
        if (!it || rsp_chk_append(it, "arguments", delta))
            return rsp_chk_fail(c, "%s: not the open call's", type);
        return 0;
    }
    int msg = !strcmp(type, "response.output_text.delta");
    json_t *part = rsp_chk_open(c, ev, msg ? "message" : "reasoning", 1);
    if (!part || rsp_chk_append(part, "text", delta))
        return rsp_chk_fail(c, "%s: not the open item's part", type);
    if (msg && !json_is_array(json_object_get(ev, "logprobs")))
        return rsp_chk_fail(c, "%s: no logprobs array", type);
    return 0;
}

static int rsp_chk_text_done(rsp_chk *c, const json_t *ev, const char *type)
{
    if (!strcmp(type, "response.function_call_arguments.done")) {
        json_t *it = rsp_chk_open(c, ev, "function_call", 0);
        if (!it ||
            !rsp_chk_same_str(json_object_get(it, "arguments"), json_object_get(ev, "arguments")) ||
            !rsp_chk_same_str(json_object_get(it, "name"), json_object_get(ev, "name")))
            return rsp_chk_fail(c, "%s: not the arguments the deltas built", type);
        return 0;
    }
    json_t *part = rsp_chk_open(c, ev, strstr(type, "output_text") ? "message" : "reasoning", 1);
    if (!part || !rsp_chk_same_str(json_object_get(part, "text"), json_object_get(ev, "text")))
        return rsp_chk_fail(c, "%s: not the text the deltas built", type);
    return 0;
}

static int rsp_chk_item_done(rsp_chk *c, const json_t *ev)
{
    json_t *it = json_array_get(c->output, (size_t)c->open), *done = json_object_get(ev, "item");
    if (c->open < 0 || json_integer_value(json_object_get(ev, "output_index")) != c->open)
        return rsp_chk_fail(c, "%s: not the open item", "output_item.done");
    if (!rsp_chk_is(done, "status", "completed") && !rsp_chk_is(done, "status", "incomplete"))
        return rsp_chk_fail(c, "%s: neither completed nor incomplete", "output_item.done");
    /* the whole item is the one its events built, but for its status */
    json_t *a = json_deep_copy(it), *b = json_deep_copy(done);
    json_object_del(a, "status");
    json_object_del(b, "status");
    int same = json_equal(a, b);
    json_decref(a);
    json_decref(b);
    if (!same) return rsp_chk_fail(c, "%s: not the item its events built", "output_item.done");
    json_array_set(c->output, (size_t)c->open, done);
    c->open = -1;
    return 0;
}

static int rsp_chk_terminal(rsp_chk *c, const json_t *ev, const char *type)
{
    json_t *r = json_object_get(ev, "response"), *out = json_object_get(r, "output");
    const char *status = type + strlen("response.");
    if (!rsp_chk_is(r, "status", status)) return rsp_chk_fail(c, "%s: the wrong status", type);
    if (!json_is_array(out) || json_array_size(out) != json_array_size(c->output))
        return rsp_chk_fail(c, "%s: not the items the stream added", type);
    size_t i;
    json_t *it;
    json_array_foreach(out, i, it)
    {
        json_t *mine = json_array_get(c->output, i);
        if ((long)i == c->open) { /* failed while an item was open: as written so far */
            json_t *a = json_deep_copy(mine), *b = json_deep_copy(it);
            json_object_del(a, "status");
            json_object_del(b, "status");
            int same = json_equal(a, b) && strcmp(rsp_chk_s(it, "status"), "completed");
            json_decref(a);
            json_decref(b);
            if (!same) return rsp_chk_fail(c, "%s: the open item differs", type);
        } else if (!json_equal(it, mine)) {
            return rsp_chk_fail(c, "%s: an item differs from its output_item.done", type);
        }
    }
    if (c->open >= 0 && strcmp(type, "response.failed"))
        return rsp_chk_fail(c, "%s: an item is still open", type);
    c->ended = 1;
    c->final = json_incref(r);
    return 0;
}

static int rsp_chk_event(rsp_chk *c, const char *type, const json_t *ev)
{
    if (c->ended) return rsp_chk_fail(c, "%s after the stream's end", type);
    if (!rsp_chk_is(ev, "type", type)) return rsp_chk_fail(c, "%s: the data's type differs", type);
    json_t *seq = json_object_get(ev, "sequence_number");
    if (!json_is_integer(seq) || json_integer_value(seq) != c->seq++)
        return rsp_chk_fail(c, "%s: sequence_number out of order", type);
    if (c->seq <= 2) { /* response.created, then response.in_progress */
        json_t *r = json_object_get(ev, "response");
        if (strcmp(type, c->seq == 1 ? "response.created" : "response.in_progress") ||
            !rsp_chk_is(r, "status", "in_progress") ||
            json_array_size(json_object_get(r, "output")) || !rsp_chk_is(r, "object", "response"))
            return rsp_chk_fail(c, "%s: the stream must open with created, in_progress", type);
        return 0;
    }
    if (c->error && strcmp(type, "response.failed"))
        return rsp_chk_fail(c, "%s after an error event", type);
    if (!strcmp(type, "response.output_item.added")) return rsp_chk_added(c, ev);
    if (!strcmp(type, "response.content_part.added")) return rsp_chk_part(c, ev, 0);
    if (!strcmp(type, "response.content_part.done")) return rsp_chk_part(c, ev, 1);
    if (strstr(type, ".delta")) return rsp_chk_delta(c, ev, type);
    if (!strcmp(type, "response.output_item.done")) return rsp_chk_item_done(c, ev);
    if (strstr(type, "text.done") || strstr(type, "arguments.done"))
        return rsp_chk_text_done(c, ev, type);
    if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete") ||
        !strcmp(type, "response.failed"))
        return rsp_chk_terminal(c, ev, type);
    if (!strcmp(type, "error")) {
        json_t *p = json_object_get(ev, "param");
        if (!json_is_string(json_object_get(ev, "code")) ||
            !json_is_string(json_object_get(ev, "message")) ||
            !(json_is_string(p) || json_is_null(p)))
            return rsp_chk_fail(c, "%s: code, message and param", type);
        c->error = 1;
        return 0;
    }
    return rsp_chk_fail(c, "%s: an unknown event", type);
}

/* Checks a whole stream (`ended`: it must end with a terminal event).  0,
 * or -1 with c->why saying what is wrong; c->final is the last response
 * object (json_decref it, and c->output, with rsp_chk_free). */
static int rsp_chk_run(rsp_chk *c, const char *p, size_t n, int ended)
{
    memset(c, 0, sizeof *c);
    c->output = json_array();
    c->open = -1;
    const char *end = p + n;
    while (p < end) {
        char type[128];
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (strncmp(p, "event: ", 7) || !nl || (size_t)(nl - p - 7) >= sizeof type)
            return rsp_chk_fail(c, "%s", "an event does not start with \"event: \"");
        memcpy(type, p + 7, (size_t)(nl - p - 7));
        type[nl - p - 7] = 0;
        p = nl + 1;
        const char *dend = (size_t)(end - p) >= 2 ? strstr(p, "\n\n") : NULL;
        if (strncmp(p, "data: ", 6) || !dend) return rsp_chk_fail(c, "%s: no data line", type);
        json_error_t je;
        json_t *ev = json_loadb(p + 6, (size_t)(dend - p - 6), JSON_ALLOW_NUL, &je);
        if (!ev) return rsp_chk_fail(c, "%s: its data is not JSON", type);
        int rc = rsp_chk_event(c, type, ev);
        json_decref(ev);
        if (rc) return rc;
        p = dend + 2;
    }
    if (ended && !c->ended) return rsp_chk_fail(c, "%s", "the stream has no terminal event");
    return 0;
}

static void rsp_chk_free(rsp_chk *c)
{
    json_decref(c->output);
    json_decref(c->final);
    c->output = c->final = NULL;
}

#endif
