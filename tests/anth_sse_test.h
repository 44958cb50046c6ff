/* anth_sse_test.h: reads an Anthropic Messages event stream back, for
 * tests/unit/test_oai_anth.c and tests/fuzz/fuzz_oai_anth_sse.c.
 *
 * anth_sse_read checks the stream's form as strictly as the official SDK
 * relies on it — every event "event: NAME\ndata: {JSON}\n\n" with the data's
 * type NAME, message_start first (then pings anywhere), blocks opened at the
 * next index while none is open, deltas of the open block's kind, each block
 * stopped, message_delta after the last, message_stop at the very end — and
 * accumulates the message as the SDK's MessageStream does (text and thinking
 * appended, partial_json concatenated and parsed at the block's stop).
 * anth_sse_same compares that with the whole message for the same answer:
 * each kind's text concatenated over its blocks, the tool_use blocks in
 * order, and the stop and usage fields.  Both return 0, or -1 with why[]
 * saying what was wrong (the tests print it).
 *
 * JSON is read with ANTH_SSE_JSON: a tool's input is the model's JSON as it
 * wrote it, whose integers may be past 64 bits (valid JSON, which clients
 * in JavaScript or Python read as numbers, and jansson only as reals), and
 * a text may hold the NUL a model wrote (\u0000). */
#ifndef ANTH_SSE_TEST_H
#define ANTH_SSE_TEST_H

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_buf.h"

#define ANTH_SSE_JSON (JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL)

static int anth_sse_why(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int anth_sse_why(char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, 160, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *anth_sse_type(const json_t *o)
{
    const char *t = json_string_value(json_object_get(o, "type"));
    return t ? t : "";
}

/* Appends a string member's text to another's (text and thinking deltas). */
static void anth_sse_append(json_t *blk, const char *key, const json_t *add)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    json_t *cur = json_object_get(blk, key);
    dx_buf_append(&b, json_string_value(cur), json_string_length(cur));
    dx_buf_append(&b, json_string_value(add), json_string_length(add));
    json_object_set_new(blk, key, json_stringn(b.data ? b.data : "", b.len));
    dx_buf_free(&b);
}

/* One event's data: checks it against the state and folds it in. */
static int anth_sse_event(const char *name, json_t *d, json_t **msg, int *open, dx_buf *pj,
                          int *done, char *why)
{
    const char *ty = anth_sse_type(d);
    if (strcmp(ty, name)) return anth_sse_why(why, "event %s carries data of type '%s'", name, ty);
    if (*done) return anth_sse_why(why, "%s after message_stop", name);
    if (!*msg && strcmp(name, "message_start"))
        return anth_sse_why(why, "%s before message_start", name);
    if (!strcmp(name, "message_start")) {
        json_t *m = json_object_get(d, "message");
        if (*msg || !json_is_object(m)) return anth_sse_why(why, "a second or empty message_start");
        if (!json_is_array(json_object_get(m, "content")) ||
            json_array_size(json_object_get(m, "content")))
            return anth_sse_why(why, "message_start's content is not []");
        *msg = json_deep_copy(m);
        return 0;
    }
    if (!strcmp(name, "ping")) return 0;
    json_t *content = json_object_get(*msg, "content");
    json_t *jidx = json_object_get(d, "index");
    /* numbers read as reals (ANTH_SSE_JSON); -1 when absent */
    long long idx = json_is_number(jidx) ? (long long)json_number_value(jidx) : -1;
    if (idx >= 0 && json_number_value(jidx) != (double)idx) idx = -1;
    size_t n = json_array_size(content);
    if (!strcmp(name, "content_block_start")) {
        json_t *blk = json_object_get(d, "content_block");
        if (*open >= 0) return anth_sse_why(why, "block %zu starts while %d is open", n, *open);
        if (idx != (long long)n)
            return anth_sse_why(why, "block starts at index %lld, expected %zu", idx, n);
        const char *bt = anth_sse_type(blk);
        if (strcmp(bt, "text") && strcmp(bt, "thinking") && strcmp(bt, "tool_use"))
            return anth_sse_why(why, "block of type '%s'", bt);
        if (!strcmp(bt, "tool_use") && (!json_is_string(json_object_get(blk, "id")) ||
                                        !json_is_string(json_object_get(blk, "name")) ||
                                        !json_is_object(json_object_get(blk, "input"))))
            return anth_sse_why(why, "tool_use block %zu without id, name or input", n);
        json_array_append_new(content, json_deep_copy(blk));
        *open = (int)n;
        dx_buf_reset(pj);
        return 0;
    }
    if (!strcmp(name, "content_block_delta") || !strcmp(name, "content_block_stop")) {
        if (*open < 0 || idx != *open)
            return anth_sse_why(why, "%s for index %lld, open: %d", name, idx, *open);
        json_t *blk = json_array_get(content, (size_t)*open);
        const char *bt = anth_sse_type(blk);
        if (!strcmp(name, "content_block_stop")) {
            if (!strcmp(bt, "tool_use") && pj->len) {
                json_error_t je;
                json_t *in = json_loadb(pj->data, pj->len, ANTH_SSE_JSON, &je);
                if (!json_is_object(in)) {
                    json_decref(in);
                    return anth_sse_why(why, "tool_use %d: partial_json is not an object", *open);
                }
                json_object_set_new(blk, "input", in);
            }
            *open = -1;
            return 0;
        }
        json_t *dl = json_object_get(d, "delta");
        const char *dt = anth_sse_type(dl);
        if (!strcmp(bt, "text") && !strcmp(dt, "text_delta") &&
            json_is_string(json_object_get(dl, "text"))) {
            anth_sse_append(blk, "text", json_object_get(dl, "text"));
        } else if (!strcmp(bt, "thinking") && !strcmp(dt, "thinking_delta") &&
                   json_is_string(json_object_get(dl, "thinking"))) {
            anth_sse_append(blk, "thinking", json_object_get(dl, "thinking"));
        } else if (!strcmp(bt, "tool_use") && !strcmp(dt, "input_json_delta") &&
                   json_is_string(json_object_get(dl, "partial_json"))) {
            json_t *p = json_object_get(dl, "partial_json");
            dx_buf_append(pj, json_string_value(p), json_string_length(p));
        } else {
            return anth_sse_why(why, "a %s delta in a %s block", dt, bt);
        }
        return 0;
    }
    if (!strcmp(name, "message_delta")) {
        json_t *dl = json_object_get(d, "delta"), *u = json_object_get(d, "usage");
        if (*open >= 0) return anth_sse_why(why, "message_delta while block %d is open", *open);
        if (!json_is_string(json_object_get(dl, "stop_reason")) || !json_is_object(u))
            return anth_sse_why(why, "message_delta without stop_reason or usage");
        json_object_set(*msg, "stop_reason", json_object_get(dl, "stop_reason"));
        json_object_set(*msg, "stop_sequence", json_object_get(dl, "stop_sequence"));
        json_object_update(json_object_get(*msg, "usage"), u);
        return 0;
    }
    if (!strcmp(name, "message_stop")) {
        if (!json_is_string(json_object_get(*msg, "stop_reason")))
            return anth_sse_why(why, "message_stop before message_delta");
        *done = 1;
        return 0;
    }
    return anth_sse_why(why, "unknown event '%s'", name);
}

/* The stream s[0..n) → *out, the message a client accumulates. */
static int anth_sse_read(const char *s, size_t n, json_t **out, char *why)
{
    json_t *msg = NULL;
    int open = -1, done = 0, rc = 0;
    dx_buf pj;
    dx_buf_init(&pj, 0);
    *out = NULL;
    size_t i = 0;
    while (!rc && i < n) {
        const char *end = memmem(s + i, n - i, "\n\n", 2);
        if (!end) {
            rc = anth_sse_why(why, "an event at byte %zu does not end with a blank line", i);
            break;
        }
        const char *ev = s + i, *nl = memchr(ev, '\n', (size_t)(end - ev));
        i = (size_t)(end - s) + 2;
        if (!nl || strncmp(ev, "event: ", 7) || strncmp(nl + 1, "data: ", 6)) {
            rc = anth_sse_why(why, "an event is not 'event: NAME\\ndata: JSON'");
            break;
        }
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)(nl - ev - 7), ev + 7);
        json_error_t je;
        json_t *d = json_loadb(nl + 7, (size_t)(end - nl - 7), ANTH_SSE_JSON, &je);
        if (!json_is_object(d))
            rc = anth_sse_why(why, "event %s: data is not a JSON object: %s", name, je.text);
        else if (!strcmp(name, "error"))
            rc = anth_sse_why(why, "error event");
        else
            rc = anth_sse_event(name, d, &msg, &open, &pj, &done, why);
        json_decref(d);
    }
    if (!rc && !done) rc = anth_sse_why(why, "the stream does not end with message_stop");
    dx_buf_free(&pj);
    if (rc) {
        json_decref(msg);
        return rc;
    }
    *out = msg;
    return 0;
}

/* Each kind's text over the blocks of `content`, and its blocks counted. */
static void anth_sse_concat(const json_t *content, const char *type, const char *key, dx_buf *b,
                            size_t *n)
{
    size_t i;
    json_t *blk;
    *n = 0;
    json_array_foreach(content, i, blk) if (!strcmp(anth_sse_type(blk), type))
    {
        json_t *t = json_object_get(blk, key);
        dx_buf_append(b, json_string_value(t), json_string_length(t));
        (*n)++;
    }
}

static inline int anth_sse_same(const json_t *streamed, const json_t *whole, char *why)
{
    static const char *const fields[] = {"id",          "type",          "role", "model",
                                         "stop_reason", "stop_sequence", "usage"};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if (!json_equal(json_object_get(streamed, fields[i]), json_object_get(whole, fields[i])))
            return anth_sse_why(why, "'%s' differs", fields[i]);
    const json_t *sc = json_object_get(streamed, "content"),
                 *wc = json_object_get(whole, "content");
    static const char *const kinds[][2] = {{"thinking", "thinking"}, {"text", "text"}};
    for (int k = 0; k < 2; k++) {
        dx_buf a, b;
        size_t na, nb;
        dx_buf_init(&a, 0);
        dx_buf_init(&b, 0);
        anth_sse_concat(sc, kinds[k][0], kinds[k][1], &a, &na);
        anth_sse_concat(wc, kinds[k][0], kinds[k][1], &b, &nb);
        int same = a.len == b.len && (!a.len || !memcmp(a.data, b.data, a.len)) &&
                   (na > 0) == (nb > 0) && nb <= 1;
        dx_buf_free(&a);
        dx_buf_free(&b);
        if (!same) return anth_sse_why(why, "the %s blocks differ", kinds[k][0]);
    }
    /* the whole message: thinking, text, then the calls */
    size_t i, w = 0;
    json_t *blk;
    int rank = 0;
    json_array_foreach(wc, i, blk)
    {
        const char *t = anth_sse_type(blk);
        int r = !strcmp(t, "thinking") ? 0 : !strcmp(t, "text") ? 1 : 2;
        if (r < rank) return anth_sse_why(why, "whole: block %zu out of order", i);
        rank = r < 2 ? r + 1 : 2; /* one thinking and one text block at most */
    }
    json_array_foreach(sc, i, blk)
    {
        if (strcmp(anth_sse_type(blk), "tool_use")) continue;
        while (w < json_array_size(wc) && strcmp(anth_sse_type(json_array_get(wc, w)), "tool_use"))
            w++;
        if (!json_equal(blk, json_array_get(wc, w)))
            return anth_sse_why(why, "tool_use block %zu differs", i);
        w++;
    }
    while (w < json_array_size(wc) && strcmp(anth_sse_type(json_array_get(wc, w)), "tool_use")) w++;
    if (w != json_array_size(wc)) return anth_sse_why(why, "the whole message has more calls");
    return 0;
}

#endif
