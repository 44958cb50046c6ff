/* oai_ans: a chat answer read back into its pieces (see .h). */
#include "oai/oai_ans.h"

#include <jansson.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

void oai_ans_info_init(oai_ans_info *i)
{
    memset(i, 0, sizeof *i);
    dx_buf_init(&i->stop_reason, 0);
}

void oai_ans_info_free(oai_ans_info *i)
{
    dx_buf_free(&i->stop_reason);
}

static void copy_str(char *dst, size_t cap, const json_t *v)
{
    const char *s = json_string_value(v);
    size_t n = s ? json_string_length(v) : 0;
    if (n >= cap) n = cap - 1;
    memcpy(dst, s ? s : "", n);
    dst[n] = 0;
}

static long get_int(const json_t *o, const char *name)
{
    json_t *v = json_object_get(o, name);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (long)json_integer_value(v) : 0;
}

/* usage, error, finish_reason, stop_reason: what a chunk or an answer may
 * say besides its text. */
static int read_info(const json_t *root, const json_t *choice, oai_ans_info *info)
{
    const json_t *err = json_object_get(root, "error");
    if (json_is_object(err)) {
        info->error = 1;
        copy_str(info->error_message, sizeof info->error_message, json_object_get(err, "message"));
        copy_str(info->error_type, sizeof info->error_type, json_object_get(err, "type"));
        copy_str(info->error_param, sizeof info->error_param, json_object_get(err, "param"));
        copy_str(info->error_code, sizeof info->error_code, json_object_get(err, "code"));
    }
    const json_t *u = json_object_get(root, "usage");
    if (json_is_object(u)) {
        info->has_usage = 1;
        info->usage.prompt = (uint32_t)get_int(u, "prompt_tokens");
        info->usage.completion = (uint32_t)get_int(u, "completion_tokens");
        info->usage.cached =
            (uint32_t)get_int(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
    }
    const json_t *f = json_object_get(choice, "finish_reason");
    if (json_is_string(f)) copy_str(info->finish, sizeof info->finish, f);
    const json_t *sr = json_object_get(choice, "stop_reason");
    if (json_is_string(sr)) {
        info->stop_reason.len = 0;
        if (dx_buf_append(&info->stop_reason, json_string_value(sr), json_string_length(sr)) ||
            dx_buf_putc(&info->stop_reason, 0))
            return dx_errf(DX_ENOMEM, "chat answer: out of memory for its stop_reason");
        info->stop_reason.len--;
    }
    return 0;
}

/* A model can emit NUL, which the chat door writes as \u0000: an answer
 * holding one is still an answer (lengths are kept, never strlen). */
static json_t *load(const char *p, size_t len)
{
    json_error_t je;
    return json_loadb(p, len, JSON_ALLOW_NUL, &je);
}

/* ---- a whole answer ----------------------------------------------------------- */

static int dup_str(const json_t *v, char **out, size_t *len)
{
    *out = NULL;
    if (len) *len = 0;
    if (!json_is_string(v)) return 0;
    size_t n = json_string_length(v);
    if (!(*out = dx_strndup(json_string_value(v), n)))
        return dx_errf(DX_ENOMEM, "chat answer: out of memory");
    if (len) *len = n;
    return 0;
}

static int read_calls(const json_t *calls, oai_tools_result *r)
{
    size_t n = json_array_size(calls);
    if (!n) return 0;
    if (!(r->calls = dx_calloc(n, sizeof *r->calls)))
        return dx_errf(DX_ENOMEM, "chat answer: out of memory for its tool calls");
    for (size_t i = 0; i < n; i++) {
        const json_t *c = json_array_get(calls, i), *fn = json_object_get(c, "function");
        oai_tool_call *t = &r->calls[r->n_calls++];
        copy_str(t->id, sizeof t->id, json_object_get(c, "id"));
        int rc = dup_str(json_object_get(fn, "name"), &t->name, NULL);
        if (!rc) rc = dup_str(json_object_get(fn, "arguments"), &t->arguments, &t->arguments_len);
        if (rc) return rc;
        if (!t->name && !(t->name = dx_strdup("")))
            return dx_errf(DX_ENOMEM, "chat answer: out of memory");
        if (!t->arguments && !(t->arguments = dx_strdup("{}")))
            return dx_errf(DX_ENOMEM, "chat answer: out of memory");
        if (!json_is_string(json_object_get(fn, "arguments"))) t->arguments_len = 2;
    }
    return 0;
}

int oai_ans_full(const char *body, size_t len, oai_tools_result *r, oai_ans_info *info)
{
    memset(r, 0, sizeof *r);
    /* jansson under memory pressure drops what it has no room for: an
     * allocation that failed while reading voids the answer, and says so
     * (out of memory, not a malformed answer) */
    size_t failed = dx_alloc_failed_count();
    json_t *root = load(body, len);
    if (dx_alloc_failed_count() != failed) {
        json_decref(root);
        return dx_errf(DX_ENOMEM, "chat answer: out of memory reading it");
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return dx_errf(DX_EFORMAT, "chat answer: not a JSON object");
    }
    const json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    int rc = read_info(root, choice, info);
    const json_t *msg = json_object_get(choice, "message");
    if (!rc && !info->error && !json_is_object(msg))
        rc = dx_errf(DX_EFORMAT, "chat answer: no choices[0].message");
    if (!rc && msg) rc = dup_str(json_object_get(msg, "content"), &r->content, &r->content_len);
    if (!rc && msg)
        rc = dup_str(json_object_get(msg, "reasoning_content"), &r->reasoning, &r->reasoning_len);
    if (!rc && msg) rc = read_calls(json_object_get(msg, "tool_calls"), r);
    json_decref(root);
    if (rc) oai_tools_result_free(r);
    return rc;
}

/* ---- a stream ------------------------------------------------------------------ */

struct oai_ans_stream {
    json_t *doc; /* the last chunk: the events point into it */
    dx_buf ev;   /* oai_tools_ev[] */
};

oai_ans_stream *oai_ans_stream_create(void)
{
    oai_ans_stream *s = dx_calloc(1, sizeof *s);
    if (s) dx_buf_init(&s->ev, 0);
    return s;
}

void oai_ans_stream_destroy(oai_ans_stream *s)
{
    if (!s) return;
    json_decref(s->doc);
    dx_buf_free(&s->ev);
    dx_free(s);
}

static int push(oai_ans_stream *s, enum oai_tools_ev_kind kind, uint32_t index, const json_t *text,
                const char *id)
{
    oai_tools_ev e = {.kind = kind,
                      .index = index,
                      .text = json_string_value(text),
                      .len = json_string_length(text),
                      .id = id};
    if (!e.text) e.text = "";
    if (dx_buf_append(&s->ev, &e, sizeof e))
        return dx_errf(DX_ENOMEM, "chat stream: out of memory for its events");
    return 0;
}

/* delta.tool_calls[i]: a head (id and name) and/or an arguments fragment. */
static int push_call(oai_ans_stream *s, const json_t *c)
{
    const json_t *fn = json_object_get(c, "function"), *name = json_object_get(fn, "name"),
                 *args = json_object_get(fn, "arguments");
    const char *id = json_string_value(json_object_get(c, "id"));
    uint32_t index = (uint32_t)get_int(c, "index");
    int rc = 0;
    if (json_is_string(name)) rc = push(s, OAI_TOOLS_EV_CALL, index, name, id ? id : "");
    if (!rc && json_is_string(args) && json_string_length(args))
        rc = push(s, OAI_TOOLS_EV_ARGS, index, args, NULL);
    return rc;
}

/* The delta's pieces in the order a chat chunk writes them: reasoning,
 * content, calls (oai_tools_ev_json puts one kind in a chunk; a chunk from
 * elsewhere with several gets them in this order). */
static int read_delta(oai_ans_stream *s, const json_t *delta)
{
    const json_t *rs = json_object_get(delta, "reasoning_content"),
                 *ct = json_object_get(delta, "content"),
                 *calls = json_object_get(delta, "tool_calls");
    int rc = 0;
    if (json_is_string(rs) && json_string_length(rs))
        rc = push(s, OAI_TOOLS_EV_REASONING, 0, rs, NULL);
    if (!rc && json_is_string(ct) && json_string_length(ct))
        rc = push(s, OAI_TOOLS_EV_CONTENT, 0, ct, NULL);
    for (size_t i = 0; !rc && i < json_array_size(calls); i++)
        rc = push_call(s, json_array_get(calls, i));
    return rc;
}

int oai_ans_chunk(oai_ans_stream *s, const char *data, size_t len, const oai_tools_ev **ev,
                  size_t *n, oai_ans_info *info)
{
    *ev = NULL;
    *n = 0;
    s->ev.len = 0;
    json_decref(s->doc);
    s->doc = NULL;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        info->done = 1;
        return 0;
    }
    s->doc = load(data, len); /* (json_is_object evaluates its argument twice) */
    if (!json_is_object(s->doc))
        return dx_errf(DX_EFORMAT, "chat stream: an event that is not a JSON object");
    const json_t *choice = json_array_get(json_object_get(s->doc, "choices"), 0);
    int rc = read_info(s->doc, choice, info);
    if (!rc) rc = read_delta(s, json_object_get(choice, "delta"));
    if (rc) return rc;
    *ev = (const oai_tools_ev *)s->ev.data;
    *n = s->ev.len / sizeof(oai_tools_ev);
    return 0;
}
