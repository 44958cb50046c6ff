/* Fuzz target: Anthropic Messages requests → chat requests (oai_anth).
 * The first byte's bit 0 picks count_tokens; the rest is the body.
 *
 * Every accepted request's chat document must be one the chat parser
 * accepts (oai_req_parse(OAI_CHAT) on its text), agreeing with the info the
 * translation returned (stream, max_tokens, the stop strings and where they
 * came from), and every tool_use's input must read back, from its call's
 * arguments text, as the same value (numbers by value, keys in order; read
 * as reals, since JSON.stringify writes 1e20 as an integer past 64 bits).
 * Every rejection is a 400 whose message starts with the field it names —
 * or, naming none, says the body is not JSON or not an object — and goes
 * out as valid JSON in Anthropic's error shape. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "oai/oai_anth.h"
#include "oai/oai_req.h"

/* a and b hold the same JSON value: JSON.stringify writes 1.0 as 1. */
static int same_value(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b))
            return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    if (json_typeof(a) != json_typeof(b)) return 0;
    if (json_is_string(a))
        return json_string_length(a) == json_string_length(b) &&
               !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!same_value(json_array_get(a, i), json_array_get(b, i))) return 0;
        return 1;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b)) return 0;
        void *x = json_object_iter((json_t *)a), *y = json_object_iter((json_t *)b);
        for (; x && y;
             x = json_object_iter_next((json_t *)a, x), y = json_object_iter_next((json_t *)b, y)) {
            size_t n = json_object_iter_key_len(x);
            if (n != json_object_iter_key_len(y) ||
                memcmp(json_object_iter_key(x), json_object_iter_key(y), n) ||
                !same_value(json_object_iter_value(x), json_object_iter_value(y)))
                return 0;
        }
        return !x && !y;
    }
    return 1; /* true, false, null */
}

static void check_rejection(const oai_err *e)
{
    DX_ASSERT(e->status == 400 && e->message[0]);
    size_t n = strlen(e->param);
    DX_ASSERT(n ? !strncmp(e->message, e->param, n)
                : !strncmp(e->message, "invalid JSON", 12) ||
                      !strcmp(e->message, "request body must be a JSON object"));
    dx_buf b;
    dx_buf_init(&b, 0);
    DX_ASSERT(oai_anth_http_error(&b, e->status, e->message, e->param, NULL) == 0);
    json_t *j = json_loadb(b.data, b.len, 0, NULL);
    DX_ASSERT(j && !strcmp(json_string_value(json_object_get(j, "type")), "error"));
    json_decref(j);
    dx_buf_free(&b);
}

static const char *type_of(const json_t *blk)
{
    const char *t = json_string_value(json_object_get(blk, "type"));
    return t ? t : "";
}

/* The inputs of the body's tool_use blocks, in order, against the
 * arguments of the document's tool calls, in order. */
static void check_arguments(const uint8_t *body, size_t len, json_t *doc)
{
    json_t *root = json_loadb((const char *)body, len, JSON_ALLOW_NUL, NULL);
    json_t *inputs = json_array(), *m, *blk, *call;
    size_t i, j, k = 0;
    json_array_foreach(json_object_get(root, "messages"), i, m) json_array_foreach(
        json_object_get(m, "content"), j, blk) if (!strcmp(type_of(blk), "tool_use"))
        json_array_append(inputs, json_object_get(blk, "input"));
    json_array_foreach(json_object_get(doc, "messages"), i, m)
        json_array_foreach(json_object_get(m, "tool_calls"), j, call)
    {
        json_t *args = json_object_get(json_object_get(call, "function"), "arguments");
        json_t *v = json_loadb(json_string_value(args), json_string_length(args),
                               JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL);
        DX_ASSERT(json_is_object(v) && same_value(v, json_array_get(inputs, k)));
        json_decref(v);
        k++;
    }
    DX_ASSERT(k == json_array_size(inputs));
    json_decref(inputs);
    json_decref(root);
}

static int dump_cb(const char *p, size_t n, void *b)
{
    return dx_buf_append(b, p, n) ? -1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    oai_anth_opts o = {.count_tokens = data[0] & 1};
    const char *body = (const char *)data + 1;
    json_t *doc;
    oai_anth_info info;
    oai_err e;
    if (oai_anth_to_chat(body, size - 1, &o, &doc, &info, &e) != 0) {
        check_rejection(&e);
        return 0;
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    DX_ASSERT(json_dump_callback(doc, dump_cb, &b, JSON_COMPACT) == 0);
    oai_req r;
    if (oai_req_parse(OAI_CHAT, b.data, b.len, NULL, &r, &e) != 0) {
        fprintf(stderr, "accepted, but the chat parser says %s (%s)\n%s\n", e.message, e.param,
                b.data);
        DX_ASSERT(!"oai_anth: a translation the chat parser refuses");
    }
    DX_ASSERT(r.n_msgs > 0 && !strcmp(r.model, info.model));
    DX_ASSERT(r.stream == info.stream && r.include_usage == info.stream);
    DX_ASSERT(r.has_max_tokens == !o.count_tokens && (!o.count_tokens || !info.stream));
    DX_ASSERT(r.n_stop == info.n_stop);
    json_t *root = json_loadb(body, size - 1, JSON_ALLOW_NUL, NULL);
    for (size_t k = 0; k < r.n_stop; k++)
        DX_ASSERT(!strcmp(r.stop[k],
                          json_string_value(json_array_get(json_object_get(root, "stop_sequences"),
                                                           info.stop_index[k]))));
    json_decref(root);
    check_arguments(data + 1, size - 1, doc);
    oai_req_free(&r);
    dx_buf_free(&b);
    json_decref(doc);
    return 0;
}
