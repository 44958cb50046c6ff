/* oai_rsp_req: Responses API requests → Chat Completions request documents,
 * and the history the store keeps (see oai_rsp.h; docs/api.md, "The
 * Responses API", has the mapping field by field).
 *
 * Validation comes first and names the Responses fields.  Every check the
 * chat parser makes on a field we produce is made here too, on the field it
 * came from (the chat parser's helpers are its own, so the few lines of
 * number and string checks are repeated): an accepted request gives a
 * document oai_req_parse accepts, which the fuzz target checks.
 *
 * Input items become chat messages.  The assistant's side of a turn — the
 * reasoning, message and function_call items that follow one another —
 * becomes one assistant message, as a chat client would have it:
 * reasoning_content, content and tool_calls.  The pieces of one turn are
 * concatenated as they are (duplex's stream splits an answer's text around
 * its calls, and sending those items back must give the answer's content
 * again); the text parts inside one item are joined by newlines, as the
 * chat API joins text parts. */
#include "oai/oai_rsp.h"
#include "oai/oai_jv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"
#include "oai/oai_resp.h"

/* ---- checks (as oai_req.c makes them) ------------------------------------ */

static int is_name(const json_t *v)
{
    return oai_jv_is_cstr(v) && json_string_length(v) > 0;
}

/* Characters (code points) of valid UTF-8. */
static size_t n_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

/* 1 when a container at v nests more than `left` levels. */
static int too_deep(const json_t *v, int left)
{
    const char *key;
    json_t *c;
    size_t i;
    if (!json_is_object(v) && !json_is_array(v)) return 0;
    if (left == 0) return 1;
    if (json_is_array(v)) {
        json_array_foreach(v, i, c) if (too_deep(c, left - 1)) return 1;
        return 0;
    }
    json_object_foreach((json_t *)v, key, c) if (too_deep(c, left - 1)) return 1;
    return 0;
}

/* ---- input items → chat messages ------------------------------------------ */

typedef struct {
    json_t *msgs; /* the chat messages so far */
    oai_err *err;
    size_t n_parts;
    dx_buf text; /* one item's text */
    /* the assistant turn being gathered: its reasoning, content and calls */
    dx_buf reasoning, content;
    int has_reasoning, has_content;
    json_t *calls;
} xlat;

/* Appends m (a new reference) to the messages; jansson calls take NULL, and
 * a failed allocation is seen by the caller's count of failures. */
static void push(xlat *x, json_t *m)
{
    json_array_append_new(x->msgs, m);
}

static json_t *str(const dx_buf *b)
{
    return json_stringn_nocheck(b->data ? b->data : "", b->len);
}

/* The assistant turn gathered so far becomes one chat message (none when it
 * holds nothing: a reasoning item with only a summary or encrypted content
 * adds no turn). */
static void flush_turn(xlat *x)
{
    if (!x->has_reasoning && !x->has_content && !x->calls) return;
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "content", x->has_content ? str(&x->content) : json_null());
    if (x->has_reasoning) json_object_set_new(m, "reasoning_content", str(&x->reasoning));
    if (x->calls) json_object_set_new(m, "tool_calls", x->calls);
    push(x, m);
    dx_buf_reset(&x->reasoning);
    dx_buf_reset(&x->content);
    x->has_reasoning = x->has_content = 0;
    x->calls = NULL;
}

/* A string, or text parts joined by newlines, appended to b.  `reasoning`:
 * the parts of a reasoning item (reasoning_text) instead of a message's
 * (input_text, output_text). */
static int get_text(xlat *x, const json_t *c, const char *name, int reasoning, dx_buf *b)
{
    char pname[64];
    size_t i;
    json_t *part;
    if (json_is_string(c))
        return dx_buf_append(b, json_string_value(c), json_string_length(c))
                   ? oai_jv_oom(x->err, "reading a text")
                   : 0;
    if (!json_is_array(c))
        return oai_jv_fail(x->err, name, "%s: expected a string or an array of text parts", name);
    json_array_foreach(c, i, part)
    {
        snprintf(pname, sizeof pname, "%s[%zu]", name, i);
        if (++x->n_parts > OAI_RSP_MAX_PARTS)
            return oai_jv_fail(x->err, "input", "input: more than %d content parts in all",
                               OAI_RSP_MAX_PARTS);
        if (!json_is_object(part))
            return oai_jv_fail(x->err, pname, "%s: expected an object", pname);
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        int ok = reasoning ? oai_jv_is(type, "reasoning_text")
                           : oai_jv_is(type, "input_text") || oai_jv_is(type, "output_text");
        snprintf(pname, sizeof pname, "%s[%zu].type", name, i);
        if (!oai_jv_is_cstr(type))
            return oai_jv_fail(x->err, pname, "%s: required, a string", pname);
        if (!ok)
            return oai_jv_fail(x->err, pname, "%s: '%.32s' parts are not supported (only %s)",
                               pname, json_string_value(type),
                               reasoning ? "reasoning_text" : "input_text and output_text: text");
        snprintf(pname, sizeof pname, "%s[%zu].text", name, i);
        if (!json_is_string(text))
            return oai_jv_fail(x->err, pname, "%s: expected a string", pname);
        int rc = i ? dx_buf_putc(b, '\n') : 0;
        if (!rc) rc = dx_buf_append(b, json_string_value(text), json_string_length(text));
        if (rc) return oai_jv_oom(x->err, "joining text parts");
    }
    return 0;
}

/* {type?: "message", role, content}: user, system and developer messages
 * stand alone; an assistant's text joins its turn. */
static int item_message(xlat *x, const json_t *it, size_t i)
{
    char name[48];
    json_t *role = json_object_get(it, "role"), *c = oai_jv_field(it, "content");
    const char *r = oai_jv_is_cstr(role) ? json_string_value(role) : "";
    snprintf(name, sizeof name, "input[%zu].role", i);
    if (!strcmp(r, "assistant")) {
        snprintf(name, sizeof name, "input[%zu].content", i);
        if (!c) return 0; /* as a chat client may send it: no text */
        x->has_content = 1;
        return get_text(x, c, name, 0, &x->content);
    }
    if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer"))
        return oai_jv_fail(x->err, name, "%s: expected user, assistant, system or developer", name);
    flush_turn(x);
    snprintf(name, sizeof name, "input[%zu].content", i);
    dx_buf_reset(&x->text);
    if (!c)
        return oai_jv_fail(x->err, name, "%s: required, a string or an array of text parts", name);
    if (get_text(x, c, name, 0, &x->text)) return oai_jv_failed(x->err);
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string(r));
    json_object_set_new(m, "content", str(&x->text));
    push(x, m);
    return 0;
}

/* A string member that must be a non-empty name. */
static int get_name(const json_t *it, const char *key, size_t i, json_t **out, oai_err *err)
{
    char name[48];
    snprintf(name, sizeof name, "input[%zu].%s", i, key);
    *out = json_object_get(it, key);
    if (!is_name(*out)) return oai_jv_fail(err, name, "%s: required, a non-empty string", name);
    return 0;
}

/* {type: "function_call", call_id, name, arguments}: a call of the turn. */
static int item_call(xlat *x, const json_t *it, size_t i)
{
    char name[48];
    json_t *id, *fname, *args = json_object_get(it, "arguments");
    if (get_name(it, "call_id", i, &id, x->err) || get_name(it, "name", i, &fname, x->err))
        return oai_jv_failed(x->err);
    snprintf(name, sizeof name, "input[%zu].arguments", i);
    if (!json_is_string(args))
        return oai_jv_fail(x->err, name, "%s: required, a JSON string", name);
    json_t *fn = json_object(), *call = json_object();
    json_object_set(fn, "name", fname);
    json_object_set(fn, "arguments", args);
    json_object_set(call, "id", id);
    json_object_set_new(call, "type", json_string("function"));
    json_object_set_new(call, "function", fn);
    if (!x->calls) x->calls = json_array();
    json_array_append_new(x->calls, call);
    return 0;
}

/* {type: "function_call_output", call_id, output}: a tool message. */
static int item_output(xlat *x, const json_t *it, size_t i)
{
    char name[48];
    json_t *id, *out = json_object_get(it, "output");
    if (get_name(it, "call_id", i, &id, x->err)) return oai_jv_failed(x->err);
    flush_turn(x);
    snprintf(name, sizeof name, "input[%zu].output", i);
    dx_buf_reset(&x->text);
    if (!out)
        return oai_jv_fail(x->err, name, "%s: required, a string or an array of text parts", name);
    if (get_text(x, out, name, 0, &x->text)) return oai_jv_failed(x->err);
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("tool"));
    json_object_set(m, "tool_call_id", id);
    json_object_set_new(m, "content", str(&x->text));
    push(x, m);
    return 0;
}

/* {type: "reasoning", content: [{type: "reasoning_text", text}], summary,
 * encrypted_content}: the turn's reasoning_content.  Only the content is
 * what the model wrote; a summary is not, and encrypted content (another
 * server's) cannot be read: both are ignored. */
static int item_reasoning(xlat *x, const json_t *it, size_t i)
{
    char name[48];
    json_t *c = oai_jv_field(it, "content");
    snprintf(name, sizeof name, "input[%zu].content", i);
    if (!c) return 0;
    if (!json_is_array(c))
        return oai_jv_fail(x->err, name, "%s: expected an array of reasoning_text parts", name);
    if (!json_array_size(c)) return 0;
    x->has_reasoning = 1;
    return get_text(x, c, name, 1, &x->reasoning);
}

static int item(xlat *x, const json_t *it, size_t i)
{
    char name[48];
    snprintf(name, sizeof name, "input[%zu]", i);
    if (!json_is_object(it))
        return oai_jv_fail(x->err, name, "%s: expected an object (an input item)", name);
    json_t *type = oai_jv_field(it, "type");
    const char *t = NULL;
    if (!type) /* the short forms: {role, content}; {id} (an item reference) */
        t = json_object_get(it, "role") ? "message"
            : json_object_get(it, "id") ? "item_reference"
                                        : NULL;
    else if (oai_jv_is_cstr(type))
        t = json_string_value(type);
    else {
        snprintf(name, sizeof name, "input[%zu].type", i);
        return oai_jv_fail(x->err, name, "%s: expected a string", name);
    }
    if (!t)
        return oai_jv_fail(x->err, name,
                           "%s: expected an item: {\"role\", \"content\"} or one with a \"type\"",
                           name);
    if (!strcmp(t, "message")) return item_message(x, it, i);
    if (!strcmp(t, "function_call")) return item_call(x, it, i);
    if (!strcmp(t, "reasoning")) return item_reasoning(x, it, i);
    if (!strcmp(t, "function_call_output")) return item_output(x, it, i);
    if (!strcmp(t, "item_reference"))
        return oai_jv_fail(
            x->err, name,
            "%s: item_reference is not supported: responses are stored as chat messages, "
            "not items; send the item itself, or continue with previous_response_id",
            name);
    snprintf(name, sizeof name, "input[%zu].type", i);
    return oai_jv_fail(x->err, name,
                       "%s: '%.40s' items are not supported (only message, function_call, "
                       "function_call_output and reasoning)",
                       name, t);
}

static int parse_input(const json_t *root, oai_rsp_req *r, oai_err *err)
{
    json_t *in = oai_jv_field(root, "input"), *it;
    r->input = json_array();
    if (json_is_string(in)) { /* one user message */
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("user"));
        json_object_set(m, "content", in);
        json_array_append_new(r->input, m);
        r->n_items = 1;
        return 0;
    }
    if (!json_is_array(in) || !json_array_size(in))
        return oai_jv_fail(err, "input", "input: required, a string or a non-empty array of items");
    if (json_array_size(in) > OAI_RSP_MAX_ITEMS)
        return oai_jv_fail(err, "input", "input: %zu items, at most %d are accepted",
                           json_array_size(in), OAI_RSP_MAX_ITEMS);
    xlat x = {.msgs = r->input, .err = err};
    dx_buf_init(&x.text, 0);
    dx_buf_init(&x.reasoning, 0);
    dx_buf_init(&x.content, 0);
    size_t i;
    int rc = 0;
    json_array_foreach(in, i, it) if ((rc = item(&x, it, i))) break;
    if (!rc) flush_turn(&x);
    json_decref(x.calls);
    dx_buf_free(&x.text);
    dx_buf_free(&x.reasoning);
    dx_buf_free(&x.content);
    r->n_items = json_array_size(in);
    /* items that say nothing (an assistant message without content, a
     * reasoning item with only a summary) leave nothing to answer */
    if (!rc && !json_array_size(r->input))
        return oai_jv_fail(err, "input", "input: the items hold no message");
    return rc;
}

/* ---- tools, tool_choice, text.format ---------------------------------------- */

static int check_tool(const json_t *t, size_t i, oai_err *err)
{
    char name[48];
    json_t *type = json_object_get(t, "type"), *v;
    snprintf(name, sizeof name, "tools[%zu]", i);
    if (!json_is_object(t)) return oai_jv_fail(err, name, "%s: expected an object", name);
    snprintf(name, sizeof name, "tools[%zu].type", i);
    if (!oai_jv_is_cstr(type)) return oai_jv_fail(err, name, "%s: required, \"function\"", name);
    if (strcmp(json_string_value(type), "function"))
        return oai_jv_fail(err, name,
                           "%s: '%.40s' tools are not supported (only \"function\": duplex runs no "
                           "built-in tools)",
                           name, json_string_value(type));
    snprintf(name, sizeof name, "tools[%zu].name", i);
    if (!is_name(json_object_get(t, "name")))
        return oai_jv_fail(err, name, "%s: required, a non-empty string", name);
    snprintf(name, sizeof name, "tools[%zu].description", i);
    if ((v = oai_jv_field(t, "description")) && !json_is_string(v))
        return oai_jv_fail(err, name, "%s: expected a string", name);
    snprintf(name, sizeof name, "tools[%zu].parameters", i);
    if ((v = oai_jv_field(t, "parameters")) && !json_is_object(v))
        return oai_jv_fail(err, name, "%s: expected a JSON Schema object", name);
    snprintf(name, sizeof name, "tools[%zu].strict", i);
    if ((v = oai_jv_field(t, "strict")) && !json_is_boolean(v))
        return oai_jv_fail(err, name, "%s: expected true or false", name);
    return 0;
}

/* The members of src that are given, shared into dst (a container is
 * filled before it is attached: attaching to a NULL parent frees it). */
static void copy_given(json_t *dst, const json_t *src, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        json_t *v = oai_jv_field(src, keys[i]);
        if (v) json_object_set(dst, keys[i], v);
    }
}

/* [{type: "function", name, description?, parameters?, strict?}] →
 * [{type: "function", function: {name, description?, parameters?, strict?}}].
 * duplex runs no built-in tool, so every other type is refused. */
static int parse_tools(const json_t *root, json_t *chat, oai_err *err)
{
    static const char *const keys[] = {"name", "description", "parameters", "strict"};
    json_t *tools = oai_jv_field(root, "tools"), *t;
    size_t i;
    if (!tools) return 0;
    if (!json_is_array(tools)) return oai_jv_fail(err, "tools", "tools: expected an array");
    if (json_array_size(tools) > OAI_MAX_TOOLS)
        return oai_jv_fail(err, "tools", "tools: %zu tools, at most %d are accepted",
                           json_array_size(tools), OAI_MAX_TOOLS);
    json_array_foreach(tools, i, t) if (check_tool(t, i, err)) return oai_jv_failed(err);
    json_t *out = json_array();
    json_array_foreach(tools, i, t)
    {
        json_t *fn = json_object(), *ct = json_object();
        copy_given(fn, t, keys, DX_ARRAY_LEN(keys));
        json_object_set_new(ct, "type", json_string("function"));
        json_object_set_new(ct, "function", fn);
        json_array_append_new(out, ct);
    }
    json_object_set_new(chat, "tools", out);
    return 0;
}

static int has_tool(const json_t *chat, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(chat, "tools"), i, t)
    {
        json_t *n = json_object_get(json_object_get(t, "function"), "name");
        if (!strcmp(json_string_value(n), name)) return 1;
    }
    return 0;
}

/* "auto" | "none" | "required" | {type: "function", name}.  *forced: a call
 * is required (so no JSON text.format may go with it). */
static int parse_tool_choice(const json_t *root, json_t *chat, int *forced, oai_err *err)
{
    json_t *v = oai_jv_field(root, "tool_choice");
    *forced = 0;
    if (!v) return 0;
    if (oai_jv_is(v, "auto") || oai_jv_is(v, "none") || oai_jv_is(v, "required")) {
        *forced = oai_jv_is(v, "required");
        json_object_set(chat, "tool_choice", v);
    } else if (json_is_object(v) && oai_jv_is(json_object_get(v, "type"), "function")) {
        json_t *name = json_object_get(v, "name");
        if (!is_name(name))
            return oai_jv_fail(err, "tool_choice.name",
                               "tool_choice.name: required, a non-empty string");
        if (!has_tool(chat, json_string_value(name)))
            return oai_jv_fail(err, "tool_choice", "tool_choice: no tool named '%.64s' in tools",
                               json_string_value(name));
        json_t *fn = json_object(), *c = json_object();
        json_object_set(fn, "name", name);
        json_object_set_new(c, "type", json_string("function"));
        json_object_set_new(c, "function", fn);
        json_object_set_new(chat, "tool_choice", c);
        *forced = 1;
    } else {
        const char *t = json_is_string(v) ? json_string_value(v)
                        : json_is_string(json_object_get(v, "type"))
                            ? json_string_value(json_object_get(v, "type"))
                            : "";
        return oai_jv_fail(err, "tool_choice",
                           "tool_choice: '%.40s' is not supported: expected \"auto\", \"none\", "
                           "\"required\" or {\"type\": \"function\", \"name\": …}",
                           t);
    }
    if (*forced && !json_array_size(json_object_get(chat, "tools")))
        return oai_jv_fail(err, "tool_choice",
                           "tool_choice: a tool call is required but no tools are given");
    return 0;
}

/* text.format {type: "json_schema", name, schema, description?, strict?} →
 * response_format {type: "json_schema", json_schema: {…}}. */
static int check_json_schema(const json_t *f, oai_err *err)
{
    json_t *v = json_object_get(f, "name");
    size_t n = json_string_length(v);
    if (!oai_jv_is_cstr(v) || n == 0 || n > 64 ||
        strspn(json_string_value(v), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789_-") != n)
        return oai_jv_fail(err, "text.format.name",
                           "text.format.name: required, 1..64 of a-z, A-Z, 0-9, _ and -");
    if ((v = oai_jv_field(f, "description")) && !json_is_string(v))
        return oai_jv_fail(err, "text.format.description",
                           "text.format.description: expected a string");
    if ((v = oai_jv_field(f, "schema")) && !json_is_object(v))
        return oai_jv_fail(err, "text.format.schema",
                           "text.format.schema: expected a JSON Schema object");
    if ((v = oai_jv_field(f, "strict")) && !json_is_boolean(v))
        return oai_jv_fail(err, "text.format.strict", "text.format.strict: expected true or false");
    return 0;
}

static int parse_text(const json_t *root, json_t *chat, int forced, oai_err *err)
{
    static const char *const keys[] = {"name", "description", "schema", "strict"};
    json_t *text = oai_jv_field(root, "text"), *f, *v;
    if (!text) return 0;
    if (!json_is_object(text)) return oai_jv_fail(err, "text", "text: expected an object");
    if ((v = oai_jv_field(text, "verbosity")) && !oai_jv_is(v, "low") && !oai_jv_is(v, "medium") &&
        !oai_jv_is(v, "high"))
        return oai_jv_fail(err, "text.verbosity", "text.verbosity: expected low, medium or high");
    if (!(f = oai_jv_field(text, "format"))) return 0;
    json_t *type = json_object_get(f, "type");
    if (!json_is_object(f) || !oai_jv_is_cstr(type))
        return oai_jv_fail(
            err, "text.format",
            "text.format: expected {\"type\": \"text\" | \"json_object\" | \"json_schema\", …}");
    if (oai_jv_is(type, "text")) return 0; /* the default */
    if (!oai_jv_is(type, "json_object") && !oai_jv_is(type, "json_schema"))
        return oai_jv_fail(err, "text.format.type",
                           "text.format.type: '%.32s' is not text, json_object or json_schema",
                           json_string_value(type));
    if (forced)
        return oai_jv_fail(
            err, "tool_choice",
            "tool_choice: a forced tool call cannot be combined with text.format \"%s\"",
            json_string_value(type));
    int schema = oai_jv_is(type, "json_schema");
    if (schema && check_json_schema(f, err)) return oai_jv_failed(err);
    json_t *rf = json_object();
    json_object_set(rf, "type", type);
    if (schema) {
        json_t *js = json_object();
        copy_given(js, f, keys, DX_ARRAY_LEN(keys));
        json_object_set_new(rf, "json_schema", js);
    }
    json_object_set_new(chat, "response_format", rf);
    return 0;
}

/* ---- the other fields ------------------------------------------------------- */

/* model, max_output_tokens, temperature, top_p, stream, user. */
static int parse_sampling(const json_t *root, oai_rsp_req *r, oai_err *err)
{
    json_t *chat = r->chat, *v;
    int64_t n = 0;
    v = json_object_get(root, "model");
    if (!v) return oai_jv_fail(err, "model", "model: required");
    if (!oai_jv_is_cstr(v)) return oai_jv_fail(err, "model", "model: expected a string");
    r->model = json_string_value(v);
    json_object_set(chat, "model", v);
    if ((v = oai_jv_field(root, "max_output_tokens"))) {
        if (oai_jv_int(v, "max_output_tokens", 1, UINT32_MAX, &n, err)) return oai_jv_failed(err);
        json_object_set_new(chat, "max_tokens", json_integer(n));
    }
    if ((v = oai_jv_field(root, "temperature"))) {
        if (oai_jv_num(v, "temperature", 0, 2, NULL, err)) return oai_jv_failed(err);
        json_object_set(chat, "temperature", v);
    }
    if ((v = oai_jv_field(root, "top_p"))) {
        if (oai_jv_num(v, "top_p", 0, 1, NULL, err)) return oai_jv_failed(err);
        if (json_number_value(v) == 0)
            return oai_jv_fail(err, "top_p", "top_p: must be greater than 0");
        json_object_set(chat, "top_p", v);
    }
    if ((v = oai_jv_field(root, "stream"))) {
        if (oai_jv_bool(v, "stream", &r->stream, err)) return oai_jv_failed(err);
        json_object_set(chat, "stream", v);
        /* the usage arrives before [DONE], for response.completed's */
        json_t *so = r->stream ? json_pack("{s:b}", "include_usage", 1) : NULL;
        if (r->stream && (!so || json_object_set_new(chat, "stream_options", so)))
            return oai_jv_oom(err, "the stream options");
    }
    if ((v = oai_jv_field(root, "user"))) {
        if (!oai_jv_is_cstr(v)) return oai_jv_fail(err, "user", "user: expected a string");
        json_object_set(chat, "user", v);
    }
    return 0;
}

/* reasoning {effort, summary}: effort "none" asks for no reasoning, which a
 * template that knows enable_thinking (Qwen3's) honours exactly: its
 * generation prompt then closes an empty think block.  Other efforts have
 * no counterpart in a chat template and are accepted as they are.  Explicit
 * chat_template_kwargs (vLLM's, passed through) win. */
static int parse_reasoning(const json_t *root, json_t *chat, oai_err *err)
{
    static const char *const efforts[] = {"none", "minimal", "low", "medium",
                                          "high", "xhigh",   "max"};
    json_t *v = oai_jv_field(root, "reasoning"), *e,
           *kw = oai_jv_field(root, "chat_template_kwargs");
    int off = 0;
    if (v && !json_is_object(v))
        return oai_jv_fail(err, "reasoning", "reasoning: expected an object");
    if (v && (e = oai_jv_field(v, "effort"))) {
        int ok = 0;
        for (size_t i = 0; i < DX_ARRAY_LEN(efforts); i++) ok |= oai_jv_is(e, efforts[i]);
        if (!ok)
            return oai_jv_fail(
                err, "reasoning.effort",
                "reasoning.effort: expected none, minimal, low, medium, high, xhigh or max");
        off = oai_jv_is(e, "none");
    }
    if (kw && !json_is_object(kw))
        return oai_jv_fail(err, "chat_template_kwargs", "chat_template_kwargs: expected an object");
    if (!kw && !off) return 0;
    json_t *k = kw ? json_copy(kw) : json_object();
    if (off && !json_object_get(k, "enable_thinking"))
        json_object_set_new(k, "enable_thinking", json_false());
    json_object_set_new(chat, "chat_template_kwargs", k);
    return 0;
}

/* metadata: at most 16 keys of up to 64 characters, string values of up to
 * 512 (OpenAI's limits), kept for the response object. */
static int parse_metadata(const json_t *root, oai_rsp_req *r, oai_err *err)
{
    json_t *m = oai_jv_field(root, "metadata"), *v;
    const char *key;
    if (!m) return 0;
    if (!json_is_object(m))
        return oai_jv_fail(err, "metadata", "metadata: expected an object of strings");
    if (json_object_size(m) > OAI_RSP_MAX_METADATA)
        return oai_jv_fail(err, "metadata", "metadata: %zu keys, at most %d are accepted",
                           json_object_size(m), OAI_RSP_MAX_METADATA);
    json_object_foreach(m, key, v)
    {
        if (n_chars(key, strlen(key)) > 64)
            return oai_jv_fail(err, "metadata", "metadata: key '%.64s…' is over 64 characters",
                               key);
        if (!json_is_string(v) || n_chars(json_string_value(v), json_string_length(v)) > 512)
            return oai_jv_fail(err, "metadata",
                               "metadata.%.64s: expected a string of at most 512 characters", key);
    }
    r->metadata = m;
    return 0;
}

/* store, previous_response_id, truncation, include; what duplex cannot do
 * (background, conversation, prompt) is refused rather than ignored, since
 * the answer would silently be another one. */
static int parse_state(const json_t *root, oai_rsp_req *r, oai_err *err)
{
    json_t *v;
    size_t i;
    if ((v = oai_jv_field(root, "store")) && oai_jv_bool(v, "store", &r->store, err))
        return oai_jv_failed(err);
    if ((v = oai_jv_field(root, "previous_response_id"))) {
        size_t n = json_string_length(v);
        if (!oai_jv_is_cstr(v) || n == 0 || n > OAI_RSP_MAX_ID ||
            strspn(json_string_value(v), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789_-") != n)
            return oai_jv_fail(
                err, "previous_response_id",
                "previous_response_id: expected a response id (1..%d of a-z, A-Z, 0-9, _ "
                "and -)",
                OAI_RSP_MAX_ID);
        r->previous_response_id = json_string_value(v);
    }
    /* "auto" would drop the conversation's start to fit the context: a
     * conversation that fits is unaffected, one that does not is a 400
     * naming the input, never an answer to a cut conversation */
    if ((v = oai_jv_field(root, "truncation")) && !oai_jv_is(v, "auto") &&
        !oai_jv_is(v, "disabled"))
        return oai_jv_fail(err, "truncation", "truncation: expected \"auto\" or \"disabled\"");
    if ((v = oai_jv_field(root, "include"))) {
        json_t *s;
        if (!json_is_array(v))
            return oai_jv_fail(err, "include", "include: expected an array of strings");
        json_array_foreach(v, i, s) if (!json_is_string(s)) return oai_jv_fail(
            err, "include", "include[%zu]: expected a string", i);
    }
    int bg = 0;
    if ((v = oai_jv_field(root, "background")) && oai_jv_bool(v, "background", &bg, err))
        return oai_jv_failed(err);
    if (bg)
        return oai_jv_fail(err, "background", "background: background responses are not supported");
    if (oai_jv_field(root, "conversation"))
        return oai_jv_fail(
            err, "conversation",
            "conversation: conversations are not supported; continue with previous_response_id");
    if (oai_jv_field(root, "prompt"))
        return oai_jv_fail(
            err, "prompt",
            "prompt: prompt templates are not supported; send instructions and input");
    return 0;
}

/* duplex's and vLLM's own fields, passed to the chat request as they are. */
static int parse_passthrough(const json_t *root, json_t *chat, oai_err *err)
{
    json_t *v;
    if ((v = oai_jv_field(root, "kv_transfer_params"))) {
        if (!json_is_object(v))
            return oai_jv_fail(err, "kv_transfer_params", "kv_transfer_params: expected an object");
        json_object_set(chat, "kv_transfer_params", v);
    }
    if ((v = oai_jv_field(root, "conversation_id"))) {
        if (!json_is_string(v))
            return oai_jv_fail(err, "conversation_id", "conversation_id: expected a string");
        json_object_set(chat, "conversation_id", v);
    }
    if ((v = oai_jv_field(root, "cache_salt"))) {
        size_t n = json_string_length(v);
        if (!json_is_string(v) || n == 0 || n > OAI_MAX_CACHE_SALT)
            return oai_jv_fail(err, "cache_salt", "cache_salt: expected a string of 1..%d bytes",
                               OAI_MAX_CACHE_SALT);
        json_object_set(chat, "cache_salt", v);
    }
    if ((v = oai_jv_field(root, "ignore_eos"))) { /* vLLM's, for benchmarks of fixed lengths */
        if (!json_is_boolean(v))
            return oai_jv_fail(err, "ignore_eos", "ignore_eos: expected a boolean");
        json_object_set(chat, "ignore_eos", v);
    }
    if ((v = oai_jv_field(root, "parallel_tool_calls"))) {
        if (!json_is_boolean(v))
            return oai_jv_fail(err, "parallel_tool_calls",
                               "parallel_tool_calls: expected true or false");
        json_object_set(chat, "parallel_tool_calls", v);
    }
    return 0;
}

/* ---- the echo: what the response object repeats ----------------------------- */

static json_t *given(const json_t *root, const char *name, json_t *dflt)
{
    json_t *v = oai_jv_field(root, name);
    if (!v) return dflt;
    json_decref(dflt);
    return json_incref(v);
}

static int build_echo(const json_t *root, oai_rsp_req *r, oai_err *err)
{
    json_t *e = json_object(), *v, *t = oai_jv_field(root, "text"),
           *rs = oai_jv_field(root, "reasoning");
    json_object_set_new(e, "instructions", given(root, "instructions", json_null()));
    v = oai_jv_field(root, "max_output_tokens");
    json_object_set_new(e, "max_output_tokens",
                        v ? json_integer((json_int_t)json_number_value(v)) : json_null());
    json_object_set_new(e, "metadata", given(root, "metadata", json_object()));
    json_object_set_new(e, "parallel_tool_calls", given(root, "parallel_tool_calls", json_true()));
    json_object_set_new(e, "previous_response_id",
                        given(root, "previous_response_id", json_null()));
    json_t *re = json_object();
    json_object_set_new(re, "effort", given(rs, "effort", json_null()));
    json_object_set_new(re, "summary", given(rs, "summary", json_null()));
    json_object_set_new(e, "reasoning", re);
    json_object_set_new(e, "store", json_boolean(r->store));
    json_object_set_new(e, "temperature", given(root, "temperature", json_real(1)));
    json_t *te = json_object();
    v = oai_jv_field(t, "format");
    json_object_set_new(te, "format", v ? json_incref(v) : json_pack("{ss}", "type", "text"));
    if ((v = oai_jv_field(t, "verbosity"))) json_object_set(te, "verbosity", v);
    json_object_set_new(e, "text", te);
    json_object_set_new(e, "tool_choice", given(root, "tool_choice", json_string("auto")));
    json_object_set_new(e, "tools", given(root, "tools", json_array()));
    json_object_set_new(e, "top_p", given(root, "top_p", json_real(1)));
    json_object_set_new(e, "truncation", given(root, "truncation", json_string("disabled")));
    if ((v = oai_jv_field(root, "user"))) json_object_set(e, "user", v);
    dx_buf b;
    dx_buf_init(&b, 0);
    /* 15 digits: a temperature of 0.7 reads back as 0.7 */
    int rc = oai_jv_dump(&b, e, JSON_COMPACT | JSON_REAL_PRECISION(15));
    json_decref(e);
    if (rc || b.len < 2) {
        dx_buf_free(&b);
        return oai_jv_oom(err, "writing the response's fields");
    }
    b.data[b.len - 1] = 0; /* the members, without the braces */
    memmove(b.data, b.data + 1, b.len - 1);
    r->echo = dx_buf_take(&b);
    return 0;
}

/* ---- the request -------------------------------------------------------------- */

static int parse_root(json_t *root, oai_rsp_req *r, oai_err *err)
{
    const char *key;
    json_t *v;
    int forced;
    if (!json_is_object(root)) return oai_jv_fail(err, NULL, "request body must be a JSON object");
    json_object_foreach(root, key, v)
    {
        char name[48];
        snprintf(name, sizeof name, "%.40s", key);
        if (too_deep(v, OAI_RSP_MAX_DEPTH - 1))
            return oai_jv_fail(err, name, "%s: nested more than %d levels deep", name,
                               OAI_RSP_MAX_DEPTH);
    }
    r->chat = json_object();
    if (parse_sampling(root, r, err) || parse_input(root, r, err)) return oai_jv_failed(err);
    if ((v = oai_jv_field(root, "instructions"))) {
        if (!json_is_string(v))
            return oai_jv_fail(err, "instructions", "instructions: expected a string");
        r->instructions = json_string_value(v);
        r->instructions_len = json_string_length(v);
    }
    if (parse_tools(root, r->chat, err) || parse_tool_choice(root, r->chat, &forced, err) ||
        parse_text(root, r->chat, forced, err) || parse_reasoning(root, r->chat, err) ||
        parse_metadata(root, r, err) || parse_state(root, r, err) ||
        parse_passthrough(root, r->chat, err))
        return oai_jv_failed(err);
    return build_echo(root, r, err);
}

int oai_rsp_parse(const char *body, size_t len, oai_rsp_req *out, oai_err *err)
{
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->store = 1;
    json_error_t jerr;
    size_t n_failed = dx_alloc_failed_count();
    long long mem0 = dx_alloc_thread_bytes();
    /* a model can emit any byte, NUL included, and the client sends it back */
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, &jerr);
    if (dx_alloc_failed_count() != n_failed) { /* jansson drops what it had no memory for */
        json_decref(root);
        return oai_jv_oom(err, "reading the request");
    }
    if (!root)
        return oai_jv_fail(err, NULL, "invalid JSON at line %d, column %d: %s", jerr.line,
                           jerr.column, jerr.text);
    out->root = root;
    int rc = parse_root(root, out, err);
    /* the jansson calls that built the documents take and give NULL: one
     * allocation that failed anywhere shows in the count */
    if (dx_alloc_failed_count() != n_failed) rc = oai_jv_oom(err, "reading the request");
    if (rc < 0) {
        oai_rsp_req_free(out);
        return rc;
    }
    long long mem = dx_alloc_thread_bytes() - mem0;
    out->mem_bytes = mem > 0 ? (size_t)mem : 0;
    return 0;
}

void oai_rsp_req_free(oai_rsp_req *r)
{
    if (!r) return;
    json_decref(r->root);
    json_decref(r->input);
    json_decref(r->chat);
    dx_free(r->echo);
    memset(r, 0, sizeof *r);
}

/* ---- the chat request ----------------------------------------------------------- */

int oai_rsp_to_chat(const oai_rsp_req *r, const json_t *previous, json_t **chat, oai_err *err)
{
    size_t i, n_prev = json_array_size(previous);
    json_t *m;
    memset(err, 0, sizeof *err);
    *chat = NULL;
    if (previous && !json_is_array(previous)) n_prev = SIZE_MAX;
    json_array_foreach(previous, i, m) if (!json_is_object(m)) n_prev = SIZE_MAX;
    if (n_prev == SIZE_MAX) {
        oai_jv_fail(err, NULL, "previous_response_id: the stored conversation is malformed");
        err->status = 500;
        return dx_errf(DX_EFORMAT, "%s", err->message);
    }
    size_t n = (r->instructions ? 1 : 0) + n_prev + json_array_size(r->input);
    if (n > OAI_MAX_MESSAGES)
        return oai_jv_fail(
            err, "input",
            "input: the conversation has %zu messages (%zu from previous_response_id), at "
            "most %d are accepted",
            n, n_prev, OAI_MAX_MESSAGES);
    size_t n_failed = dx_alloc_failed_count();
    json_t *msgs = json_array();
    if (r->instructions) {
        json_t *s = json_object();
        json_object_set_new(s, "role", json_string("system"));
        json_object_set(s, "content", json_object_get(r->root, "instructions"));
        json_array_append_new(msgs, s);
    }
    /* the store's tree may be shared: this request gets its own */
    json_array_foreach(previous, i, m) json_array_append_new(msgs, json_deep_copy(m));
    json_array_extend(msgs, r->input);
    json_t *c = json_copy(r->chat); /* the members are shared, the object is this request's */
    json_object_set_new(c, "messages", msgs);
    if (!c || dx_alloc_failed_count() != n_failed) {
        json_decref(c);
        return oai_jv_oom(err, "building the chat request");
    }
    *chat = c;
    return 0;
}

int oai_rsp_chat_parse(const json_t *chat, const oai_parse_opts *opts, oai_req *out, oai_err *err)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    /* jansson's default precision (17 digits) reads back every double exactly */
    if (oai_jv_dump(&b, chat, JSON_COMPACT)) {
        dx_buf_free(&b);
        memset(out, 0, sizeof *out);
        return oai_jv_oom(err, "writing the chat request");
    }
    int rc = oai_req_parse(OAI_CHAT, b.data, b.len, opts, out, err);
    dx_buf_free(&b);
    if (rc == DX_EINVAL) {
        oai_rsp_err_from_chat(err);
        return oai_jv_failed(err);
    }
    return rc;
}

/* The Responses name of a chat field: *out, from `p` on. */
static void map_param(const char *p, char *out, size_t cap)
{
    static const struct {
        const char *chat, *rsp;
    } k_map[] = {
        {"messages", "input"},
        {"max_completion_tokens", "max_output_tokens"},
        {"max_tokens", "max_output_tokens"},
        {"response_format.json_schema.", "text.format."},
        {"response_format.json_schema", "text.format"},
        {"response_format.", "text.format."},
        {"response_format", "text.format"},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(k_map); i++) {
        size_t n = strlen(k_map[i].chat);
        if (strncmp(p, k_map[i].chat, n)) continue;
        /* "messages[3].content": the message has no item of its own to name */
        snprintf(out, cap, "%s%s", k_map[i].rsp, i == 0 ? "" : p + n);
        return;
    }
    unsigned t;
    int used = 0;
    if (sscanf(p, "tools[%u]%n", &t, &used) == 1 && used > 0 &&
        !strncmp(p + used, ".function", 9)) {
        snprintf(out, cap, "tools[%u]%s", t, p + used + 9);
        return;
    }
    snprintf(out, cap, "%s", p);
}

void oai_rsp_err_from_chat(oai_err *err)
{
    char param[sizeof err->param], msg[sizeof err->message];
    if (!err->param[0]) return;
    map_param(err->param, param, sizeof param);
    size_t n = strlen(err->param);
    /* a message that starts with the field's name names it the same way */
    if (!strncmp(err->message, err->param, n)) {
        const char *rest = err->message + n;
        if (!strncmp(err->param, "messages", 8)) rest = strchr(rest, ':') ? strchr(rest, ':') : "";
        snprintf(msg, sizeof msg, "%s%s", param, rest);
        memcpy(err->message, msg, sizeof msg);
    }
    memcpy(err->param, param, sizeof param);
}

int oai_rsp_err_previous(oai_err *err, const char *id)
{
    oai_jv_fail(
        err, "previous_response_id",
        "previous_response_id: no stored response has id '%.128s' (expired, deleted, or created "
        "with store false)",
        id);
    return dx_errf(DX_ENOENT, "%s", err->message);
}

/* ---- the history the store keeps ---------------------------------------------------- */

/* A text as a client reads it: invalid UTF-8 as U+FFFD, as oai_json_str
 * writes it into every answer. */
static json_t *as_sent(const char *p, size_t n, dx_buf *tmp)
{
    dx_buf_reset(tmp);
    if (dx_utf8_sanitize((const uint8_t *)(p ? p : ""), n, tmp)) return NULL;
    return json_stringn_nocheck(tmp->data ? tmp->data : "", tmp->len);
}

/* The answer as oai_tools_message_json writes it for a chat client (which
 * sends it back as it came): content null when it is empty and there are
 * calls or reasoning. */
static json_t *assistant(const oai_tools_result *a, dx_buf *tmp)
{
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "content",
                        a->content || !(a->n_calls || a->reasoning)
                            ? as_sent(a->content, a->content_len, tmp)
                            : json_null());
    if (a->reasoning)
        json_object_set_new(m, "reasoning_content", as_sent(a->reasoning, a->reasoning_len, tmp));
    if (!a->n_calls) return m;
    json_t *calls = json_array();
    for (size_t i = 0; i < a->n_calls; i++) {
        const oai_tool_call *c = &a->calls[i];
        json_t *fn = json_object(), *call = json_object();
        json_object_set_new(fn, "name", as_sent(c->name, strlen(c->name), tmp));
        json_object_set_new(fn, "arguments", as_sent(c->arguments, c->arguments_len, tmp));
        json_object_set_new(call, "id", as_sent(c->id, strlen(c->id), tmp));
        json_object_set_new(call, "type", json_string("function"));
        json_object_set_new(call, "function", fn);
        json_array_append_new(calls, call);
    }
    json_object_set_new(m, "tool_calls", calls);
    return m;
}

int oai_rsp_history(const oai_rsp_req *r, const json_t *chat, const oai_tools_result *answer,
                    json_t **messages)
{
    json_t *msgs = json_object_get(chat, "messages"), *m;
    *messages = NULL;
    if (!json_is_array(msgs)) return dx_errf(DX_EINVAL, "responses history: no chat messages");
    size_t n_failed = dx_alloc_failed_count(), i;
    json_t *out = json_array();
    json_array_foreach(msgs, i, m) if (i >= (r->instructions ? 1u : 0u))
        json_array_append_new(out, json_deep_copy(m));
    dx_buf tmp;
    dx_buf_init(&tmp, 0);
    json_array_append_new(out, assistant(answer, &tmp));
    dx_buf_free(&tmp);
    if (!out || dx_alloc_failed_count() != n_failed) {
        json_decref(out);
        return dx_errf(DX_ENOMEM, "responses history: out of memory");
    }
    *messages = out;
    return 0;
}
