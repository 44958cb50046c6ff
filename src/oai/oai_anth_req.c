/* oai_anth_req: Anthropic Messages request bodies → chat request documents
 * (see oai_anth.h; the mapping and its reasons are in docs/api.md).
 *
 * The body is checked and translated in one walk: each Anthropic message
 * joins the turn being gathered (consecutive messages of one role are one
 * turn), and a turn is written out as chat messages when the role changes.
 * Every check the chat parser would make of the result is made here first,
 * with Anthropic's field names, so that a request accepted here is one the
 * chat parser accepts; `null` for an optional field means "not given", as
 * there.  Subtrees that pass unchanged (schemas, kv_transfer_params) are
 * shared with the new document, not copied. */
#include "oai/oai_anth.h"
#include "oai/oai_jv.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

enum { TURN_NONE, TURN_USER, TURN_ASSISTANT };

typedef struct {
    oai_err *err;
    int oom;      /* a jansson or buffer allocation failed: a 503 at the end */
    json_t *msgs; /* the chat messages written so far */
    size_t n_blocks;
    /* the turn being gathered */
    int turn;
    dx_buf text, reasoning;
    int has_text, has_reasoning, had_results;
    json_t *calls;  /* the assistant turn's tool_calls, or NULL */
    dx_buf scratch; /* a tool result's text, a call's arguments */
} tx;

/* A field's path, "messages[3].content[1].content[0].type", built through
 * vsnprintf so that the compiler does not count every path's worst case;
 * a path longer than an error's param keeps its start there, and whole in
 * the message. */
#define PATH 128

static const char *pathf(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static const char *pathf(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, PATH, fmt, ap);
    va_end(ap);
    return out;
}

/* ---- small checks: the chat parser's own (private to oai_req.c), under
 * Anthropic's names ------------------------------------------------------- */

/* 1 when v nests containers more than `left` levels deep.  The recursion is
 * bounded by left, whatever the document. */
static int too_deep(const json_t *v, unsigned left)
{
    if (!json_is_object(v) && !json_is_array(v)) return 0;
    if (left == 0) return 1;
    if (json_is_array(v)) {
        size_t i;
        json_t *c;
        json_array_foreach(v, i, c) if (too_deep(c, left - 1)) return 1;
        return 0;
    }
    const char *k;
    json_t *c;
    json_object_foreach((json_t *)v, k, c) if (too_deep(c, left - 1)) return 1;
    return 0;
}

/* ---- building the document: an allocation that fails marks tx->oom ------- */

static void put(tx *t, json_t *obj, const char *key, json_t *v)
{
    if (json_object_set_new(obj, key, v) < 0) t->oom = 1;
}

static void put_str(tx *t, json_t *obj, const char *key, const dx_buf *b)
{
    put(t, obj, key, json_stringn(b->data ? b->data : "", b->len));
}

static void push(tx *t, json_t *arr, json_t *v)
{
    if (json_array_append_new(arr, v) < 0) t->oom = 1;
}

/* Appends s[0..n) to a turn's text, after sep when it already has some. */
static void add_text(tx *t, dx_buf *dst, int *has, const char *sep, const char *s, size_t n)
{
    if (!n) return; /* an empty block adds nothing, not even a separator */
    if (*has && dx_buf_puts(dst, sep)) t->oom = 1;
    if (dx_buf_append(dst, s, n)) t->oom = 1;
    *has = 1;
}

/* One chat message more, within the chat parser's count. */
static int emit(tx *t, json_t *m)
{
    if (json_array_size(t->msgs) >= OAI_MAX_MESSAGES) {
        json_decref(m);
        return oai_jv_fail(t->err, "messages",
                           "messages: the conversation makes more than %d chat messages (each "
                           "tool_result is one), at most %d are accepted",
                           OAI_MAX_MESSAGES, OAI_MAX_MESSAGES);
    }
    push(t, t->msgs, m);
    return 0;
}

static json_t *chat_msg(tx *t, const char *role)
{
    json_t *m = json_object();
    put(t, m, "role", json_string(role));
    return m;
}

/* ---- tool_use input → arguments, as JSON.stringify writes it ---------------
 *
 * A client that sends back the input object it received sends it as its
 * JSON library wrote it; the arguments text must not depend on that, and for
 * a JavaScript client it is exactly what the client would have written:
 * no whitespace, keys in their order, strings with only the escapes
 * JSON.stringify makes, numbers in their shortest round-trip form. */

static int js_str(dx_buf *b, const char *s, size_t n)
{
    int rc = dx_buf_putc(b, '"');
    size_t i = 0;
    while (!rc && i < n) {
        size_t run = i;
        while (run < n && (unsigned char)s[run] >= 0x20 && s[run] != '"' && s[run] != '\\') run++;
        if (run > i) {
            rc = dx_buf_append(b, s + i, run - i);
            i = run;
            continue;
        }
        unsigned char c = (unsigned char)s[i++];
        const char *e = c == '"'    ? "\\\""
                        : c == '\\' ? "\\\\"
                        : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f"
                        : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t"
                                    : NULL;
        rc = e ? dx_buf_puts(b, e) : dx_buf_printf(b, "\\u%04x", c);
    }
    return rc ? rc : dx_buf_putc(b, '"');
}

static int put_zeros(dx_buf *b, int n)
{
    int rc = 0;
    while (!rc && n-- > 0) rc = dx_buf_putc(b, '0');
    return rc;
}

/* Number.prototype.toString: the fewest significant digits that read back
 * as d (the correctly rounded ones, as printf gives them), in plain
 * notation for decimal exponents in [-7, 21), scientific beyond. */
static int js_num(dx_buf *b, double d)
{
    if (d == 0) return dx_buf_putc(b, '0'); /* -0 too */
    char e[40], digits[24];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, d);
        if (strtod(e, NULL) == d) break;
    }
    const char *p = e + (e[0] == '-');
    int k = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[k++] = *p;
    digits[k] = 0;
    int n = atoi(p + 1) + 1; /* d = ±0.digits × 10^n */
    int rc = d < 0 ? dx_buf_putc(b, '-') : 0;
    if (!rc && k <= n && n <= 21) { /* 1e20 → 100000000000000000000 */
        rc = dx_buf_puts(b, digits);
        return rc ? rc : put_zeros(b, n - k);
    }
    if (!rc && 0 < n && n <= 21) /* 12.5 */
        return dx_buf_printf(b, "%.*s.%s", n, digits, digits + n);
    if (!rc && -6 < n && n <= 0) { /* 0.000125 */
        rc = dx_buf_puts(b, "0.");
        if (!rc) rc = put_zeros(b, -n);
        return rc ? rc : dx_buf_puts(b, digits);
    }
    if (!rc) /* 1.25e-7, 1e+21 */
        rc = dx_buf_printf(b, "%c%s%s", digits[0], k > 1 ? "." : "", digits + 1);
    return rc ? rc : dx_buf_printf(b, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
}

/* v, already checked to nest at most OAI_ANTH_MAX_DEPTH levels. */
static int js_val(dx_buf *b, const json_t *v)
{
    int rc = 0;
    size_t i, klen;
    const char *key;
    json_t *c;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        rc = dx_buf_putc(b, '{');
        i = 0;
        json_object_keylen_foreach((json_t *)v, key, klen, c)
        {
            if (!rc && i++) rc = dx_buf_putc(b, ',');
            if (!rc) rc = js_str(b, key, klen);
            if (!rc) rc = dx_buf_putc(b, ':');
            if (!rc) rc = js_val(b, c);
        }
        return rc ? rc : dx_buf_putc(b, '}');
    case JSON_ARRAY:
        rc = dx_buf_putc(b, '[');
        json_array_foreach(v, i, c)
        {
            if (!rc && i) rc = dx_buf_putc(b, ',');
            if (!rc) rc = js_val(b, c);
        }
        return rc ? rc : dx_buf_putc(b, ']');
    case JSON_STRING:
        return js_str(b, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        return dx_buf_printf(b, "%lld", (long long)json_integer_value(v));
    case JSON_REAL:
        return js_num(b, json_real_value(v));
    case JSON_TRUE:
        return dx_buf_puts(b, "true");
    case JSON_FALSE:
        return dx_buf_puts(b, "false");
    case JSON_NULL:
        return dx_buf_puts(b, "null");
    }
    DX_ASSERT(!"oai_anth: unknown JSON type");
    return dx_errf(DX_EINVAL, "oai_anth: JSON type %d", (int)json_typeof(v));
}

/* ---- content blocks ---------------------------------------------------- */

static int count_block(tx *t)
{
    if (++t->n_blocks <= OAI_ANTH_MAX_BLOCKS) return 0;
    return oai_jv_fail(t->err, "messages",
                       "messages: more than %d content blocks, at most %d are accepted",
                       OAI_ANTH_MAX_BLOCKS, OAI_ANTH_MAX_BLOCKS);
}

/* A block that is not text-only: named, with its type. */
static int unsupported(tx *t, const char *name, const char *type)
{
    char param[PATH];
    pathf(param, "%s.type", name);
    if (!strcmp(type, "image") || !strcmp(type, "document"))
        return oai_jv_fail(t->err, param, "%s: %s blocks are not supported (text-only model)",
                           param, type);
    return oai_jv_fail(t->err, param, "%s: '%.40s' blocks are not supported", param, type);
}

/* {type, …}: the block's type, or a 400. */
static int block_type(tx *t, json_t *blk, const char *name, const char **type)
{
    if (!json_is_object(blk))
        return oai_jv_fail(t->err, name, "%s: expected a content block", name);
    json_t *v = json_object_get(blk, "type");
    if (!oai_jv_is_cstr(v)) {
        char param[PATH];
        pathf(param, "%s.type", name);
        return oai_jv_fail(t->err, param, "%s: required, a string", param);
    }
    *type = json_string_value(v);
    return count_block(t);
}

/* A text block's text (may hold NUL: it is text the model reads). */
static int text_of(tx *t, json_t *blk, const char *name, json_t **text)
{
    *text = json_object_get(blk, "text");
    if (json_is_string(*text)) return 0;
    char param[PATH];
    pathf(param, "%s.text", name);
    return oai_jv_fail(t->err, param, "%s: required, a string", param);
}

/* content: a string (one text block) or text blocks, joined with sep into
 * dst; system prompts, system messages and tool results. */
static int text_blocks(tx *t, json_t *c, const char *name, const char *sep, dx_buf *dst, int *has)
{
    char bname[PATH];
    if (json_is_string(c)) {
        add_text(t, dst, has, sep, json_string_value(c), json_string_length(c));
        return count_block(t);
    }
    if (!json_is_array(c))
        return oai_jv_fail(t->err, name, "%s: expected a string or an array of text blocks", name);
    size_t k;
    json_t *blk, *text;
    const char *type;
    json_array_foreach(c, k, blk)
    {
        pathf(bname, "%s[%zu]", name, k);
        if (block_type(t, blk, bname, &type)) return oai_jv_failed(t->err);
        if (strcmp(type, "text")) return unsupported(t, bname, type);
        if (text_of(t, blk, bname, &text)) return oai_jv_failed(t->err);
        add_text(t, dst, has, sep, json_string_value(text), json_string_length(text));
    }
    return 0;
}

/* A required string without NUL, non-empty: ids and names. */
static int name_of(tx *t, json_t *blk, const char *key, const char *name, json_t **v)
{
    *v = json_object_get(blk, key);
    if (oai_jv_is_cstr(*v) && json_string_length(*v)) return 0;
    char param[PATH];
    pathf(param, "%s.%s", name, key);
    return oai_jv_fail(t->err, param, "%s: required, a non-empty string", param);
}

/* tool_result {tool_use_id, content?, is_error?} → a tool message; an
 * error's text says so first ("Error: …", or "Error" when it has none). */
static int tool_result(tx *t, json_t *blk, const char *name)
{
    char param[PATH];
    json_t *id, *v;
    if (t->has_text)
        return oai_jv_fail(t->err, name,
                           "%s: tool_result blocks must come before any text in a user turn", name);
    if (name_of(t, blk, "tool_use_id", name, &id)) return oai_jv_failed(t->err);
    int is_error = 0, has = 0;
    pathf(param, "%s.is_error", name);
    if ((v = oai_jv_field(blk, "is_error")) && oai_jv_bool(v, param, &is_error, t->err))
        return oai_jv_failed(t->err);
    dx_buf_reset(&t->scratch);
    if (is_error && dx_buf_puts(&t->scratch, "Error: ")) t->oom = 1;
    pathf(param, "%s.content", name);
    if ((v = oai_jv_field(blk, "content")) && text_blocks(t, v, param, "\n", &t->scratch, &has))
        return oai_jv_failed(t->err);
    if (is_error && !has && t->scratch.len) { /* "Error" */
        t->scratch.len = 5;
        t->scratch.data[5] = 0;
    }
    json_t *m = chat_msg(t, "tool");
    put(t, m, "tool_call_id", json_incref(id));
    put_str(t, m, "content", &t->scratch);
    t->had_results = 1;
    return emit(t, m);
}

static int user_block(tx *t, json_t *blk, const char *name, const char *type)
{
    json_t *text;
    if (!strcmp(type, "text")) {
        if (text_of(t, blk, name, &text)) return oai_jv_failed(t->err);
        add_text(t, &t->text, &t->has_text, "\n", json_string_value(text),
                 json_string_length(text));
        return 0;
    }
    if (!strcmp(type, "tool_result")) return tool_result(t, blk, name);
    if (!strcmp(type, "tool_use") || !strcmp(type, "thinking") ||
        !strcmp(type, "redacted_thinking")) {
        char param[PATH];
        pathf(param, "%s.type", name);
        return oai_jv_fail(t->err, param, "%s: %s blocks are only accepted in assistant messages",
                           param, type);
    }
    return unsupported(t, name, type);
}

/* tool_use {id, name, input} → one of the turn's tool_calls. */
static int tool_use(tx *t, json_t *blk, const char *name)
{
    char param[PATH];
    json_t *id, *fname;
    if (name_of(t, blk, "id", name, &id) || name_of(t, blk, "name", name, &fname))
        return oai_jv_failed(t->err);
    json_t *input = json_object_get(blk, "input");
    pathf(param, "%s.input", name);
    if (!json_is_object(input)) return oai_jv_fail(t->err, param, "%s: required, an object", param);
    if (too_deep(input, OAI_ANTH_MAX_DEPTH))
        return oai_jv_fail(t->err, param, "%s: nested deeper than %d levels", param,
                           OAI_ANTH_MAX_DEPTH);
    dx_buf_reset(&t->scratch);
    if (js_val(&t->scratch, input)) t->oom = 1;
    json_t *fn = json_object(), *call = json_object();
    put(t, fn, "name", json_incref(fname));
    put_str(t, fn, "arguments", &t->scratch);
    put(t, call, "id", json_incref(id));
    put(t, call, "type", json_string("function"));
    put(t, call, "function", fn);
    if (!t->calls && !(t->calls = json_array())) t->oom = 1;
    push(t, t->calls, call);
    return 0;
}

static int assistant_block(tx *t, json_t *blk, const char *name, const char *type)
{
    char param[PATH];
    json_t *v;
    if (!strcmp(type, "text")) {
        if (text_of(t, blk, name, &v)) return oai_jv_failed(t->err);
        add_text(t, &t->text, &t->has_text, "", json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!strcmp(type, "tool_use")) return tool_use(t, blk, name);
    if (!strcmp(type, "thinking")) {
        v = json_object_get(blk, "thinking");
        pathf(param, "%s.thinking", name);
        if (!json_is_string(v)) return oai_jv_fail(t->err, param, "%s: required, a string", param);
        add_text(t, &t->reasoning, &t->has_reasoning, "", json_string_value(v),
                 json_string_length(v));
        return 0;
    }
    if (!strcmp(type, "redacted_thinking")) {
        /* Anthropic's ciphertext: nothing another model can read */
        pathf(param, "%s.data", name);
        if (!json_is_string(json_object_get(blk, "data")))
            return oai_jv_fail(t->err, param, "%s: required, a string", param);
        return 0;
    }
    if (!strcmp(type, "tool_result")) {
        pathf(param, "%s.type", name);
        return oai_jv_fail(t->err, param,
                           "%s: tool_result blocks are only accepted in user messages", param);
    }
    return unsupported(t, name, type);
}

/* ---- turns ---------------------------------------------------------------- */

static void reset_turn(tx *t)
{
    dx_buf_reset(&t->text);
    dx_buf_reset(&t->reasoning);
    t->has_text = t->has_reasoning = t->had_results = 0;
    json_decref(t->calls);
    t->calls = NULL;
    t->turn = TURN_NONE;
}

/* The gathered turn as chat messages: a user turn's text after its tool
 * results (or alone, even empty, when it had none); an assistant turn as
 * one message whose content is null when it only called tools or thought. */
static int flush_turn(tx *t)
{
    int rc = 0;
    if (t->turn == TURN_USER && (t->has_text || !t->had_results)) {
        json_t *m = chat_msg(t, "user");
        put_str(t, m, "content", &t->text);
        rc = emit(t, m);
    } else if (t->turn == TURN_ASSISTANT) {
        json_t *m = chat_msg(t, "assistant");
        if (t->has_text || !(t->calls || t->has_reasoning))
            put_str(t, m, "content", &t->text);
        else
            put(t, m, "content", json_null());
        if (t->has_reasoning) put_str(t, m, "reasoning_content", &t->reasoning);
        if (t->calls) put(t, m, "tool_calls", json_incref(t->calls));
        rc = emit(t, m);
    }
    reset_turn(t);
    return rc;
}

static int system_msg(tx *t, json_t *c, const char *name)
{
    int has = 0;
    dx_buf_reset(&t->scratch);
    if (text_blocks(t, c, name, "\n", &t->scratch, &has)) return oai_jv_failed(t->err);
    json_t *m = chat_msg(t, "system");
    put_str(t, m, "content", &t->scratch);
    return emit(t, m);
}

static int one_message(tx *t, json_t *jm, size_t i)
{
    char name[PATH], bname[PATH];
    pathf(name, "messages[%zu]", i);
    if (!json_is_object(jm)) return oai_jv_fail(t->err, name, "%s: expected an object", name);
    json_t *role = json_object_get(jm, "role"), *c = json_object_get(jm, "content");
    pathf(bname, "%s.role", name);
    int turn = oai_jv_is(role, "user")        ? TURN_USER
               : oai_jv_is(role, "assistant") ? TURN_ASSISTANT
                                              : 0;
    if (!turn && !oai_jv_is(role, "system"))
        return oai_jv_fail(t->err, bname, "%s: expected \"user\" or \"assistant\"", bname);
    pathf(bname, "%s.content", name);
    if (!c) return oai_jv_fail(t->err, bname, "%s: required", bname);
    if (t->turn != turn && flush_turn(t)) return oai_jv_failed(t->err);
    if (!turn) return system_msg(t, c, bname);
    t->turn = turn;
    if (json_is_string(c)) {
        if (count_block(t)) return oai_jv_failed(t->err);
        add_text(t, &t->text, &t->has_text, turn == TURN_USER ? "\n" : "", json_string_value(c),
                 json_string_length(c));
        return 0;
    }
    if (!json_is_array(c))
        return oai_jv_fail(t->err, bname, "%s: expected a string or an array of content blocks",
                           bname);
    size_t j;
    json_t *blk;
    const char *type;
    json_array_foreach(c, j, blk)
    {
        pathf(bname, "%s.content[%zu]", name, j);
        if (block_type(t, blk, bname, &type)) return oai_jv_failed(t->err);
        int rc = turn == TURN_USER ? user_block(t, blk, bname, type)
                                   : assistant_block(t, blk, bname, type);
        if (rc) return rc;
    }
    return 0;
}

/* system, then messages → the document's messages. */
static int conversation(tx *t, json_t *root, json_t *doc)
{
    json_t *sys = oai_jv_field(root, "system"), *msgs = json_object_get(root, "messages");
    if (!msgs) return oai_jv_fail(t->err, "messages", "messages: required");
    if (!json_is_array(msgs) || !json_array_size(msgs))
        return oai_jv_fail(t->err, "messages", "messages: expected a non-empty array");
    if (json_array_size(msgs) > OAI_MAX_MESSAGES)
        return oai_jv_fail(t->err, "messages", "messages: %zu messages, at most %d are accepted",
                           json_array_size(msgs), OAI_MAX_MESSAGES);
    if (!(t->msgs = json_array())) t->oom = 1;
    put(t, doc, "messages", json_incref(t->msgs));
    if (sys) {
        int has = 0;
        dx_buf_reset(&t->scratch);
        if (text_blocks(t, sys, "system", "\n", &t->scratch, &has)) return oai_jv_failed(t->err);
        if (has) { /* an empty system prompt is none */
            json_t *m = chat_msg(t, "system");
            put_str(t, m, "content", &t->scratch);
            if (emit(t, m)) return oai_jv_failed(t->err);
        }
    }
    size_t i;
    json_t *jm;
    json_array_foreach(msgs, i, jm)
    {
        if (one_message(t, jm, i)) return oai_jv_failed(t->err);
    }
    return flush_turn(t);
}

/* ---- tools ------------------------------------------------------------- */

/* {name, description?, input_schema, strict?, type? "custom"} → a function
 * tool; cache_control and the rest are Anthropic's own and ignored. */
static int one_tool(tx *t, json_t *tool, size_t i, json_t *out)
{
    char name[PATH], param[PATH];
    pathf(name, "tools[%zu]", i);
    if (!json_is_object(tool)) return oai_jv_fail(t->err, name, "%s: expected an object", name);
    json_t *type = oai_jv_field(tool, "type"), *fname, *desc = oai_jv_field(tool, "description");
    json_t *schema = json_object_get(tool, "input_schema"), *st = oai_jv_field(tool, "strict");
    pathf(param, "%s.type", name);
    if (type && !oai_jv_is_cstr(type))
        return oai_jv_fail(t->err, param, "%s: expected a string", param);
    if (type && strcmp(json_string_value(type), "custom"))
        return oai_jv_fail(t->err, param,
                           "%s: '%.40s' tools are not supported (only tools with an input_schema)",
                           param, json_string_value(type));
    if (name_of(t, tool, "name", name, &fname)) return oai_jv_failed(t->err);
    pathf(param, "%s.description", name);
    if (desc && !json_is_string(desc))
        return oai_jv_fail(t->err, param, "%s: expected a string", param);
    pathf(param, "%s.input_schema", name);
    if (!json_is_object(schema))
        return oai_jv_fail(t->err, param, "%s: required, a JSON Schema object", param);
    if (too_deep(schema, OAI_ANTH_MAX_DEPTH))
        return oai_jv_fail(t->err, param, "%s: nested deeper than %d levels", param,
                           OAI_ANTH_MAX_DEPTH);
    pathf(param, "%s.strict", name);
    int strict = 1;
    if (st && oai_jv_bool(st, param, &strict, t->err)) return oai_jv_failed(t->err);
    json_t *fn = json_object(), *ft = json_object();
    put(t, fn, "name", json_incref(fname));
    if (desc) put(t, fn, "description", json_incref(desc));
    put(t, fn, "parameters", json_incref(schema));
    if (st) put(t, fn, "strict", json_boolean(strict));
    put(t, ft, "type", json_string("function"));
    put(t, ft, "function", fn);
    push(t, out, ft);
    return 0;
}

static int tools(tx *t, json_t *root, json_t *doc)
{
    json_t *tl = oai_jv_field(root, "tools"), *tool;
    if (!tl) return 0;
    if (!json_is_array(tl)) return oai_jv_fail(t->err, "tools", "tools: expected an array");
    if (json_array_size(tl) > OAI_MAX_TOOLS)
        return oai_jv_fail(t->err, "tools", "tools: %zu tools, at most %d are accepted",
                           json_array_size(tl), OAI_MAX_TOOLS);
    /* our reference keeps the array while it is filled, even if the put failed */
    json_t *out = json_array();
    put(t, doc, "tools", json_incref(out));
    size_t i;
    int rc = 0;
    json_array_foreach(tl, i, tool) if ((rc = one_tool(t, tool, i, out))) break;
    json_decref(out);
    return rc;
}

static int has_tool(json_t *tl, const char *name)
{
    size_t i;
    json_t *tool;
    json_array_foreach(tl, i, tool)
    {
        if (!strcmp(json_string_value(json_object_get(tool, "name")), name)) return 1;
    }
    return 0;
}

/* tool_choice {type auto|any|tool|none, name, disable_parallel_tool_use}. */
static int tool_choice(tx *t, json_t *root, json_t *doc, int *forced)
{
    json_t *tc = oai_jv_field(root, "tool_choice"), *tl = oai_jv_field(root, "tools"), *v;
    *forced = 0;
    if (!tc) return 0;
    json_t *type = json_object_get(tc, "type");
    if (!json_is_object(tc) || !oai_jv_is_cstr(type))
        return oai_jv_fail(
            t->err, "tool_choice",
            "tool_choice: expected {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    const char *ty = json_string_value(type);
    if (!strcmp(ty, "auto") || !strcmp(ty, "none")) {
        put(t, doc, "tool_choice", json_string(ty));
    } else if (!strcmp(ty, "any")) {
        put(t, doc, "tool_choice", json_string("required"));
        *forced = 1;
    } else if (!strcmp(ty, "tool")) {
        v = json_object_get(tc, "name");
        if (!oai_jv_is_cstr(v))
            return oai_jv_fail(t->err, "tool_choice.name", "tool_choice.name: required, a string");
        if (tl && !has_tool(tl, json_string_value(v)))
            return oai_jv_fail(t->err, "tool_choice.name",
                               "tool_choice.name: no tool named '%.64s' in tools",
                               json_string_value(v));
        json_t *fn = json_object(), *named = json_object();
        put(t, fn, "name", json_incref(v));
        put(t, named, "type", json_string("function"));
        put(t, named, "function", fn);
        put(t, doc, "tool_choice", named);
        *forced = 1;
    } else {
        return oai_jv_fail(t->err, "tool_choice.type",
                           "tool_choice.type: '%.32s' is not auto, any, tool or none", ty);
    }
    if (*forced && !json_array_size(tl))
        return oai_jv_fail(
            t->err, "tool_choice",
            "tool_choice: a tool use is required (type \"%s\") but no tools are given", ty);
    int disable = 0;
    if ((v = oai_jv_field(tc, "disable_parallel_tool_use"))) {
        if (oai_jv_bool(v, "tool_choice.disable_parallel_tool_use", &disable, t->err))
            return oai_jv_failed(t->err);
        put(t, doc, "parallel_tool_calls", json_boolean(!disable));
    }
    return 0;
}

/* ---- the other fields --------------------------------------------------------- */

static int max_tokens(tx *t, json_t *root, json_t *doc)
{
    json_t *v = json_object_get(root, "max_tokens");
    int64_t n;
    if (!v) return oai_jv_fail(t->err, "max_tokens", "max_tokens: required");
    if (json_is_integer(v) && json_integer_value(v) == 0)
        return oai_jv_fail(
            t->err, "max_tokens",
            "max_tokens: must be at least 1 (0, pre-warming the cache, is not supported)");
    if (oai_jv_int(v, "max_tokens", 1, UINT32_MAX, &n, t->err)) return oai_jv_failed(t->err);
    put(t, doc, "max_tokens", json_integer(n));
    return 0;
}

/* stop_sequences → stop, within the chat parser's count and bytes. */
static int stop_sequences(tx *t, json_t *root, json_t *doc, oai_anth_info *info)
{
    json_t *s = oai_jv_field(root, "stop_sequences"), *v;
    if (!s) return 0;
    if (!json_is_array(s))
        return oai_jv_fail(t->err, "stop_sequences",
                           "stop_sequences: expected an array of strings");
    if (json_array_size(s) > OAI_MAX_STOP)
        return oai_jv_fail(t->err, "stop_sequences",
                           "stop_sequences: %zu strings, at most %d are accepted",
                           json_array_size(s), OAI_MAX_STOP);
    json_t *out = json_array();
    put(t, doc, "stop", json_incref(out));
    size_t i, bytes = 0;
    int rc = 0;
    json_array_foreach(s, i, v)
    {
        char param[PATH];
        pathf(param, "stop_sequences[%zu]", i);
        if (!oai_jv_is_cstr(v)) {
            rc = oai_jv_fail(t->err, param, "%s: expected a string without NUL", param);
            break;
        }
        bytes += json_string_length(v);
        if (!json_string_length(v)) continue;
        info->stop_index[info->n_stop++] = (uint16_t)i;
        push(t, out, json_incref(v));
    }
    json_decref(out);
    if (!rc && bytes > OAI_MAX_STOP_BYTES)
        rc = oai_jv_fail(t->err, "stop_sequences",
                         "stop_sequences: %zu bytes in all, at most %u are accepted", bytes,
                         OAI_MAX_STOP_BYTES);
    return rc;
}

/* temperature (Anthropic: [0, 1]; the chat range [0, 2] is taken, same
 * meaning), top_p, top_k: the values, written in the chat parser's types. */
static int sampling(tx *t, json_t *root, json_t *doc)
{
    json_t *v;
    double d;
    int64_t n;
    if ((v = oai_jv_field(root, "temperature"))) {
        if (oai_jv_num(v, "temperature", 0, 2, &d, t->err)) return oai_jv_failed(t->err);
        put(t, doc, "temperature", json_real(d));
    }
    if ((v = oai_jv_field(root, "top_p"))) {
        if (oai_jv_num(v, "top_p", 0, 1, &d, t->err)) return oai_jv_failed(t->err);
        if (d == 0) return oai_jv_fail(t->err, "top_p", "top_p: must be greater than 0");
        put(t, doc, "top_p", json_real(d));
    }
    if ((v = oai_jv_field(root, "top_k"))) {
        if (oai_jv_int(v, "top_k", -1, INT32_MAX, &n, t->err)) return oai_jv_failed(t->err);
        put(t, doc, "top_k", json_integer(n));
    }
    return 0;
}

/* thinking → chat_template_kwargs.enable_thinking (Qwen3's switch, the one
 * chat templates read); the budget is the caller's. */
static int thinking(tx *t, json_t *root, json_t *doc, oai_anth_info *info)
{
    json_t *th = oai_jv_field(root, "thinking"), *v;
    if (!th) return 0;
    json_t *type = json_object_get(th, "type");
    if (!json_is_object(th) || !oai_jv_is_cstr(type))
        return oai_jv_fail(
            t->err, "thinking",
            "thinking: expected {\"type\": \"enabled\" | \"disabled\" | \"adaptive\"}");
    const char *ty = json_string_value(type);
    if (!strcmp(ty, "enabled")) {
        int64_t n;
        if (!(v = json_object_get(th, "budget_tokens")))
            return oai_jv_fail(t->err, "thinking.budget_tokens",
                               "thinking.budget_tokens: required");
        if (oai_jv_int(v, "thinking.budget_tokens", 1, UINT32_MAX, &n, t->err))
            return oai_jv_failed(t->err);
        info->thinking_budget = (uint32_t)n;
        info->thinking = OAI_ANTH_THINK_ON;
    } else if (!strcmp(ty, "adaptive") || !strcmp(ty, "between_tools")) {
        info->thinking = OAI_ANTH_THINK_ON;
    } else if (!strcmp(ty, "disabled")) {
        info->thinking = OAI_ANTH_THINK_OFF;
    } else {
        return oai_jv_fail(t->err, "thinking.type",
                           "thinking.type: '%.32s' is not enabled, disabled or adaptive", ty);
    }
    json_t *kw = json_object();
    put(t, kw, "enable_thinking", json_boolean(info->thinking == OAI_ANTH_THINK_ON));
    put(t, doc, "chat_template_kwargs", kw);
    return 0;
}

/* output_config.format {type json_schema, schema} → response_format. */
static int output_config(tx *t, json_t *root, json_t *doc, int *has_format)
{
    json_t *oc = oai_jv_field(root, "output_config"), *f, *schema;
    *has_format = 0;
    if (!oc) return 0;
    if (!json_is_object(oc))
        return oai_jv_fail(t->err, "output_config", "output_config: expected an object");
    if (!(f = oai_jv_field(oc, "format"))) return 0; /* effort: the model's own business */
    if (!json_is_object(f) || !oai_jv_is(json_object_get(f, "type"), "json_schema"))
        return oai_jv_fail(
            t->err, "output_config.format",
            "output_config.format: expected {\"type\": \"json_schema\", \"schema\": {…}}");
    schema = json_object_get(f, "schema");
    if (!json_is_object(schema))
        return oai_jv_fail(t->err, "output_config.format.schema",
                           "output_config.format.schema: required, a JSON Schema object");
    if (too_deep(schema, OAI_ANTH_MAX_DEPTH))
        return oai_jv_fail(t->err, "output_config.format.schema",
                           "output_config.format.schema: nested deeper than %d levels",
                           OAI_ANTH_MAX_DEPTH);
    json_t *js = json_object(), *rf = json_object();
    put(t, js, "name", json_string("output"));
    put(t, js, "schema", json_incref(schema));
    put(t, rf, "type", json_string("json_schema"));
    put(t, rf, "json_schema", js);
    put(t, doc, "response_format", rf);
    *has_format = 1;
    return 0;
}

/* model, stream, metadata.user_id, and duplex's own fields, which the
 * router and the nodes exchange under the same names on every route. */
static int misc(tx *t, json_t *root, json_t *doc, const oai_anth_opts *o, oai_anth_info *info)
{
    json_t *v = json_object_get(root, "model"), *u;
    if (!v) return oai_jv_fail(t->err, "model", "model: required");
    if (!oai_jv_is_cstr(v)) return oai_jv_fail(t->err, "model", "model: expected a string");
    put(t, doc, "model", json_incref(v));
    if (!o->count_tokens && (v = oai_jv_field(root, "stream"))) {
        if (oai_jv_bool(v, "stream", &info->stream, t->err)) return oai_jv_failed(t->err);
        if (info->stream) { /* the caller needs the usage for message_delta */
            json_t *so = json_object();
            put(t, so, "include_usage", json_true());
            put(t, doc, "stream", json_true());
            put(t, doc, "stream_options", so);
        }
    }
    if ((v = oai_jv_field(root, "metadata"))) {
        if (!json_is_object(v))
            return oai_jv_fail(t->err, "metadata", "metadata: expected an object");
        if ((u = oai_jv_field(v, "user_id")) && !oai_jv_is_cstr(u))
            return oai_jv_fail(t->err, "metadata.user_id", "metadata.user_id: expected a string");
        if (u) put(t, doc, "user", json_incref(u));
    }
    if ((v = oai_jv_field(root, "kv_transfer_params"))) {
        if (!json_is_object(v))
            return oai_jv_fail(t->err, "kv_transfer_params",
                               "kv_transfer_params: expected an object");
        put(t, doc, "kv_transfer_params", json_incref(v));
    }
    if ((v = oai_jv_field(root, "conversation_id"))) {
        if (!json_is_string(v))
            return oai_jv_fail(t->err, "conversation_id", "conversation_id: expected a string");
        put(t, doc, "conversation_id", json_incref(v));
    }
    if ((v = oai_jv_field(root, "cache_salt"))) {
        size_t n = json_string_length(v);
        if (!json_is_string(v) || n == 0 || n > OAI_MAX_CACHE_SALT)
            return oai_jv_fail(t->err, "cache_salt", "cache_salt: expected a string of 1..%d bytes",
                               OAI_MAX_CACHE_SALT);
        put(t, doc, "cache_salt", json_incref(v));
    }
    if ((v = oai_jv_field(root, "ignore_eos"))) { /* vLLM's, for benchmarks of fixed lengths */
        if (!json_is_boolean(v))
            return oai_jv_fail(t->err, "ignore_eos", "ignore_eos: expected a boolean");
        put(t, doc, "ignore_eos", json_incref(v));
    }
    return 0;
}

static int translate(tx *t, json_t *root, json_t *doc, const oai_anth_opts *o, oai_anth_info *info)
{
    int forced, format;
    if (!json_is_object(root))
        return oai_jv_fail(t->err, NULL, "request body must be a JSON object");
    if (misc(t, root, doc, o, info)) return oai_jv_failed(t->err);
    if (!o->count_tokens && max_tokens(t, root, doc)) return oai_jv_failed(t->err);
    if (conversation(t, root, doc) || tools(t, root, doc) || tool_choice(t, root, doc, &forced) ||
        stop_sequences(t, root, doc, info) || sampling(t, root, doc) ||
        thinking(t, root, doc, info) || output_config(t, root, doc, &format))
        return oai_jv_failed(t->err);
    if (forced && format)
        return oai_jv_fail(t->err, "tool_choice",
                           "tool_choice: a forced tool use (type \"any\" or \"tool\") cannot be "
                           "combined with output_config.format");
    return 0;
}

int oai_anth_to_chat(const char *body, size_t len, const oai_anth_opts *o, struct json_t **chat,
                     oai_anth_info *info, oai_err *err)
{
    static const oai_anth_opts defaults = {0};
    if (!o) o = &defaults;
    memset(info, 0, sizeof *info);
    memset(err, 0, sizeof *err);
    *chat = NULL;
    info->count_tokens = o->count_tokens;
    size_t failed0 = dx_alloc_failed_count();
    json_error_t jerr;
    /* a model can emit any byte, NUL included, and the client sends it back */
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, &jerr);
    if (dx_alloc_failed_count() != failed0) { /* jansson's lexer drops bytes it has no room for */
        json_decref(root);
        return oai_jv_oom(err, "reading the request");
    }
    if (!root)
        return oai_jv_fail(err, NULL, "invalid JSON at line %d, column %d: %s", jerr.line,
                           jerr.column, jerr.text);
    tx t = {.err = err};
    dx_buf_init(&t.text, 0);
    dx_buf_init(&t.reasoning, 0);
    dx_buf_init(&t.scratch, 0);
    json_t *doc = json_object();
    if (!doc) t.oom = 1;
    int rc = t.oom ? 0 : translate(&t, root, doc, o, info);
    if (t.oom || dx_alloc_failed_count() != failed0)
        rc = oai_jv_oom(err, "reading the request"); /* not the request's fault */
    reset_turn(&t);
    json_decref(t.msgs);
    dx_buf_free(&t.text);
    dx_buf_free(&t.reasoning);
    dx_buf_free(&t.scratch);
    json_decref(root);
    if (rc < 0) {
        json_decref(doc);
        memset(info, 0, sizeof *info);
        return rc;
    }
    info->model = json_string_value(json_object_get(doc, "model"));
    *chat = doc;
    return 0;
}

/* ---- the chat path's field names in Anthropic's terms ---------------------------- */

void oai_anth_param_name(const char *p, char *out, size_t cap)
{
    static const struct {
        const char *chat, *anth;
    } k_map[] = {
        {"max_completion_tokens", "max_tokens"},
        {"stop", "stop_sequences"},
        {"user", "metadata.user_id"},
        {"chat_template_kwargs", "thinking"},
        {"parallel_tool_calls", "tool_choice.disable_parallel_tool_use"},
        {"response_format.json_schema.schema", "output_config.format.schema"},
        {"response_format", "output_config.format"},
    };
    size_t n;
    for (size_t i = 0; i < DX_ARRAY_LEN(k_map); i++) {
        n = strlen(k_map[i].chat);
        if (!strncmp(p, k_map[i].chat, n) && (p[n] == 0 || p[n] == '.' || p[n] == '[')) {
            snprintf(out, cap, "%s%s", k_map[i].anth, p + n);
            return;
        }
    }
    if (!strncmp(p, "messages[", 9)) { /* positions move in translation */
        snprintf(out, cap, "messages");
        return;
    }
    unsigned long k;
    int used = 0;
    if (sscanf(p, "tools[%lu].function%n", &k, &used) == 1 && used) {
        const char *rest = p + used;
        if (!strncmp(rest, ".parameters", 11))
            snprintf(out, cap, "tools[%lu].input_schema%s", k, rest + 11);
        else
            snprintf(out, cap, "tools[%lu]%s", k, rest);
        return;
    }
    snprintf(out, cap, "%s", p);
}

void oai_anth_err_from_chat(oai_err *err)
{
    char name[sizeof err->param], msg[sizeof err->message];
    size_t n = strlen(err->param);
    if (!n) return;
    oai_anth_param_name(err->param, name, sizeof name);
    if (!strncmp(err->message, err->param, n) && err->message[n] == ':') {
        snprintf(msg, sizeof msg, "%s%s", name, err->message + n);
        memcpy(err->message, msg, sizeof msg);
    }
    memcpy(err->param, name, sizeof name);
}

int oai_anth_req_parse(const char *body, size_t len, const oai_anth_opts *o,
                       const oai_parse_opts *po, oai_req *out, oai_anth_info *info, oai_err *err)
{
    json_t *doc;
    memset(out, 0, sizeof *out);
    out->kind = OAI_CHAT;
    int rc = oai_anth_to_chat(body, len, o, &doc, info, err);
    if (rc < 0) return rc;
    dx_buf b;
    dx_buf_init(&b, 0);
    rc = oai_jv_dump(&b, doc, JSON_COMPACT);
    json_decref(doc);
    info->model = NULL;
    if (rc < 0) {
        dx_buf_free(&b);
        return oai_jv_oom(err, "reading the request");
    }
    rc = oai_req_parse(OAI_CHAT, b.data, b.len, po, out, err);
    dx_buf_free(&b);
    if (rc < 0) {
        oai_anth_err_from_chat(err);
        return rc;
    }
    info->model = out->model;
    return 0;
}
