/* oai_req: OpenAI request bodies → oai_req (see .h).
 *
 * `null` for an optional field means "use the default", as in the OpenAI
 * API.  Integers may be written as integral reals (1e3); anything else is a
 * 400 naming the field. */
#include "oai/oai_jv.h"
#include "oai/oai_req.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

void oai_json_use_dx_alloc(void)
{
    json_set_alloc_funcs(dx_malloc, dx_free);
}

static const char *norm_role(const char *role)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    if (strcmp(role, "developer") == 0) return "system";
    for (size_t i = 0; i < DX_ARRAY_LEN(roles); i++)
        if (strcmp(role, roles[i]) == 0) return roles[i];
    return NULL;
}

/* Content as an array of parts: only text parts, joined by newlines. */
static int parse_parts(json_t *arr, size_t mi, oai_msg *m, oai_err *err)
{
    char name[64];
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(arr, i, part)
    {
        snprintf(name, sizeof name, "messages[%zu].content[%zu]", mi, i);
        json_t *type = json_object_get(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part)) return oai_jv_fail(err, name, "%s: expected an object", name);
        if (!oai_jv_is_cstr(type) || strcmp(json_string_value(type), "text") != 0)
            return oai_jv_fail(err, name, "%s.type: only \"text\" parts are supported", name);
        if (!json_is_string(text))
            return oai_jv_fail(err, name, "%s.text: expected a string", name);
        total += json_string_length(text) + 1;
    }
    m->owned = dx_malloc(total + 1);
    if (!m->owned) return oai_jv_fail(err, "messages", "messages: out of memory");
    size_t off = 0;
    json_array_foreach(arr, i, part)
    {
        json_t *text = json_object_get(part, "text");
        if (i > 0) m->owned[off++] = '\n';
        memcpy(m->owned + off, json_string_value(text), json_string_length(text));
        off += json_string_length(text);
    }
    m->owned[off] = 0;
    m->content = m->owned;
    m->content_len = off;
    return 0;
}

/* messages[i].tool_calls: [{id, type "function", function {name, arguments}}];
 * arguments as a JSON text (OpenAI) or an object (what some clients send). */
static int parse_tool_calls(json_t *tc, size_t i, oai_msg *m, oai_err *err)
{
    char name[96];
    snprintf(name, sizeof name, "messages[%zu].tool_calls", i);
    if (!json_is_array(tc)) return oai_jv_fail(err, name, "%s: expected an array", name);
    size_t k;
    json_t *c;
    json_array_foreach(tc, k, c)
    {
        snprintf(name, sizeof name, "messages[%zu].tool_calls[%zu]", i, k);
        if (!json_is_object(c)) return oai_jv_fail(err, name, "%s: expected an object", name);
        json_t *id = json_object_get(c, "id"), *type = oai_jv_field(c, "type");
        json_t *fn = json_object_get(c, "function");
        if (!oai_jv_is_cstr(id)) return oai_jv_fail(err, name, "%s.id: required, a string", name);
        if (type && (!oai_jv_is_cstr(type) || strcmp(json_string_value(type), "function")))
            return oai_jv_fail(err, name, "%s.type: only \"function\"", name);
        if (!json_is_object(fn))
            return oai_jv_fail(err, name, "%s.function: required, an object", name);
        json_t *fname = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        snprintf(name, sizeof name, "messages[%zu].tool_calls[%zu].function.name", i, k);
        if (!oai_jv_is_cstr(fname) || !json_string_length(fname))
            return oai_jv_fail(err, name, "%s: required, a non-empty string", name);
        snprintf(name, sizeof name, "messages[%zu].tool_calls[%zu].function.arguments", i, k);
        if (!json_is_string(args) && !json_is_object(args))
            return oai_jv_fail(err, name, "%s: expected a JSON string (or an object)", name);
    }
    m->n_tool_calls = json_array_size(tc);
    return 0;
}

/* What an assistant or tool message carries besides its content. */
static int parse_msg_extras(json_t *jm, size_t i, oai_msg *m, oai_err *err)
{
    char name[64];
    json_t *v;
    int assistant = !strcmp(m->role, "assistant");
    if ((v = oai_jv_field(jm, "tool_calls"))) {
        snprintf(name, sizeof name, "messages[%zu].tool_calls", i);
        if (!assistant) return oai_jv_fail(err, name, "%s: only on assistant messages", name);
        if (parse_tool_calls(v, i, m, err)) return oai_jv_failed(err);
    }
    if ((v = oai_jv_field(jm, "reasoning_content"))) {
        snprintf(name, sizeof name, "messages[%zu].reasoning_content", i);
        if (!assistant) return oai_jv_fail(err, name, "%s: only on assistant messages", name);
        if (!json_is_string(v)) return oai_jv_fail(err, name, "%s: expected a string", name);
        m->reasoning = json_string_value(v);
        m->reasoning_len = json_string_length(v);
    }
    if (!strcmp(m->role, "tool")) {
        snprintf(name, sizeof name, "messages[%zu].tool_call_id", i);
        v = json_object_get(jm, "tool_call_id");
        if (!oai_jv_is_cstr(v))
            return oai_jv_fail(err, name, "%s: required for a tool message, a string", name);
        m->tool_call_id = json_string_value(v);
    }
    if ((v = oai_jv_field(jm, "name")) && !oai_jv_is_cstr(v)) {
        snprintf(name, sizeof name, "messages[%zu].name", i);
        return oai_jv_fail(err, name, "%s: expected a string", name);
    }
    return 0;
}

static int parse_msg_content(json_t *jm, size_t i, oai_msg *m, oai_err *err);

static int parse_msg(json_t *jm, size_t i, oai_msg *m, oai_err *err)
{
    char name[48];
    snprintf(name, sizeof name, "messages[%zu]", i);
    if (!json_is_object(jm)) return oai_jv_fail(err, name, "%s: expected an object", name);
    json_t *role = json_object_get(jm, "role");
    if (!oai_jv_is_cstr(role)) return oai_jv_fail(err, name, "%s.role: required, a string", name);
    m->role = norm_role(json_string_value(role));
    if (!m->role)
        return oai_jv_fail(err, name, "%s.role: unknown role '%.32s'", name,
                           json_string_value(role));
    if (parse_msg_extras(jm, i, m, err)) return oai_jv_failed(err);
    return parse_msg_content(jm, i, m, err);
}

static int parse_msg_content(json_t *jm, size_t i, oai_msg *m, oai_err *err)
{
    char name[48];
    snprintf(name, sizeof name, "messages[%zu]", i);
    json_t *c = json_object_get(jm, "content");
    if (json_is_string(c)) {
        m->content = json_string_value(c);
        m->content_len = json_string_length(c);
        return 0;
    }
    if (json_is_array(c)) return parse_parts(c, i, m, err);
    if ((!c || json_is_null(c)) && strcmp(m->role, "assistant") == 0) {
        m->content = ""; /* an assistant turn that only called tools */
        return 0;
    }
    return oai_jv_fail(err, name, "%s.content: expected a string or an array of text parts", name);
}

static int parse_messages(json_t *root, oai_req *r, oai_err *err)
{
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs) return oai_jv_fail(err, "messages", "messages: required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return oai_jv_fail(err, "messages", "messages: expected a non-empty array");
    if (json_array_size(msgs) > OAI_MAX_MESSAGES)
        return oai_jv_fail(err, "messages", "messages: %zu messages, at most %d are accepted",
                           json_array_size(msgs), OAI_MAX_MESSAGES);
    r->msgs = dx_calloc(json_array_size(msgs), sizeof *r->msgs);
    if (!r->msgs) return oai_jv_fail(err, "messages", "messages: out of memory");
    size_t i;
    json_t *jm;
    json_array_foreach(msgs, i, jm)
    {
        r->n_msgs = i + 1;
        int rc = parse_msg(jm, i, &r->msgs[i], err);
        if (rc < 0) return rc;
    }
    return 0;
}

static int parse_ids(json_t *arr, const oai_parse_opts *opts, oai_req *r, oai_err *err)
{
    size_t n = json_array_size(arr), i;
    r->prompt_ids = dx_malloc((n ? n : 1) * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return oai_jv_fail(err, "prompt", "prompt: out of memory");
    double hi = opts && opts->n_vocab ? (double)opts->n_vocab - 1 : (double)INT32_MAX;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        char name[40];
        int64_t id;
        snprintf(name, sizeof name, "prompt[%zu]", i);
        if (!json_is_integer(v)) return oai_jv_fail(err, "prompt", "%s: expected a token id", name);
        if (oai_jv_int(v, name, 0, hi, &id, err) < 0) {
            snprintf(err->param, sizeof err->param, "prompt");
            return oai_jv_failed(err);
        }
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = n;
    return 0;
}

/* prompt: "text" | [ids] | ["text"] | [[ids]] — one prompt only (n = 1). */
static int parse_prompt(json_t *root, const oai_parse_opts *opts, oai_req *r, oai_err *err)
{
    json_t *p = json_object_get(root, "prompt");
    if (!p) return oai_jv_fail(err, "prompt", "prompt: required");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        r->prompt = json_string_value(p);
        r->prompt_len = json_string_length(p);
        return 0;
    }
    if (!json_is_array(p))
        return oai_jv_fail(err, "prompt", "prompt: expected a string or an array of token ids");
    if (json_array_size(p) == 0) return oai_jv_fail(err, "prompt", "prompt: empty");
    if (!json_is_integer(json_array_get(p, 0)) && !json_is_real(json_array_get(p, 0)))
        return oai_jv_fail(err, "prompt", "prompt: only one prompt per request is supported");
    return parse_ids(p, opts, r, err);
}

/* Stop strings are matched against every generated byte: their count and
 * total size are bounded (OAI_MAX_STOP, OAI_MAX_STOP_BYTES). */
static int parse_stop(json_t *root, oai_req *r, oai_err *err)
{
    json_t *s = oai_jv_field(root, "stop");
    if (!s) return 0;
    if (json_is_string(s)) {
        if (!oai_jv_is_cstr(s)) return oai_jv_fail(err, "stop", "stop: must not contain NUL");
        if (json_string_length(s) > OAI_MAX_STOP_BYTES)
            return oai_jv_fail(err, "stop", "stop: %zu bytes, at most %u are accepted",
                               json_string_length(s), OAI_MAX_STOP_BYTES);
        if (json_string_length(s) == 0) return 0;
        r->stop[r->n_stop++] = json_string_value(s);
        return 0;
    }
    if (!json_is_array(s))
        return oai_jv_fail(err, "stop", "stop: expected a string or a list of strings");
    if (json_array_size(s) > OAI_MAX_STOP)
        return oai_jv_fail(err, "stop", "stop: %zu strings, at most %d are accepted",
                           json_array_size(s), OAI_MAX_STOP);
    size_t i, bytes = 0;
    json_t *v;
    json_array_foreach(s, i, v)
    {
        if (!oai_jv_is_cstr(v))
            return oai_jv_fail(err, "stop", "stop[%zu]: expected a string without NUL", i);
        bytes += json_string_length(v);
        if (json_string_length(v) > 0) r->stop[r->n_stop++] = json_string_value(v);
    }
    if (bytes > OAI_MAX_STOP_BYTES)
        return oai_jv_fail(err, "stop", "stop: %zu bytes in all, at most %u are accepted", bytes,
                           OAI_MAX_STOP_BYTES);
    return 0;
}

static int parse_max_tokens(json_t *root, oai_req *r, oai_err *err)
{
    const char *names[] = {"max_completion_tokens", "max_tokens"};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = oai_jv_field(root, names[i]);
        int64_t n;
        if (!v) continue;
        if (oai_jv_int(v, names[i], 1, UINT32_MAX, &n, err) < 0) return oai_jv_failed(err);
        r->has_max_tokens = 1;
        r->max_tokens = (uint32_t)n;
        return 0;
    }
    return 0;
}

static int parse_sampling(json_t *root, oai_req *r, oai_err *err)
{
    json_t *v;
    int64_t i;
    if ((v = oai_jv_field(root, "temperature")) &&
        oai_jv_num(v, "temperature", 0, 2, &r->temperature, err))
        return oai_jv_failed(err);
    if ((v = oai_jv_field(root, "top_p")) && oai_jv_num(v, "top_p", 0, 1, &r->top_p, err))
        return oai_jv_failed(err);
    if (v && r->top_p == 0) return oai_jv_fail(err, "top_p", "top_p: must be greater than 0");
    if ((v = oai_jv_field(root, "min_p")) && oai_jv_num(v, "min_p", 0, 1, &r->min_p, err))
        return oai_jv_failed(err);
    if ((v = oai_jv_field(root, "top_k"))) {
        if (oai_jv_int(v, "top_k", -1, INT32_MAX, &i, err) < 0) return oai_jv_failed(err);
        r->top_k = i < 0 ? 0 : (int)i; /* -1 = off, as in vLLM */
    }
    if ((v = oai_jv_field(root, "seed"))) {
        if (oai_jv_int(v, "seed", (double)INT64_MIN, (double)INT64_MAX, &i, err) < 0)
            return oai_jv_failed(err);
        r->has_seed = 1;
        r->seed = (uint64_t)i;
    }
    return 0;
}

static int cmp_bias(const void *a, const void *b)
{
    const oai_bias *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* logit_bias: {"<token id>": bias, ...} as OpenAI takes it. */
static int parse_logit_bias(json_t *v, const oai_parse_opts *opts, oai_req *r, oai_err *err)
{
    if (!json_is_object(v)) return oai_jv_fail(err, "logit_bias", "logit_bias: expected an object");
    size_t n = json_object_size(v);
    if (n > OAI_MAX_LOGIT_BIAS)
        return oai_jv_fail(err, "logit_bias", "logit_bias: %zu entries, at most %d", n,
                           OAI_MAX_LOGIT_BIAS);
    if (!n) return 0;
    r->logit_bias = dx_malloc(n * sizeof *r->logit_bias);
    if (!r->logit_bias) return oai_jv_fail(err, "logit_bias", "out of memory");
    const char *key;
    json_t *b;
    json_object_foreach(v, key, b)
    {
        char *end;
        long long id = strtoll(key, &end, 10);
        char param[64];
        snprintf(param, sizeof param, "logit_bias.%.40s", key);
        if (!*key || *end || id < 0 || id > INT32_MAX ||
            (opts && opts->n_vocab && (uint64_t)id >= opts->n_vocab))
            return oai_jv_fail(err, param, "logit_bias: key '%.40s' is not a token id%s", key,
                               opts && opts->n_vocab ? " of this model's vocabulary" : "");
        double d;
        if (oai_jv_num(b, param, -100, 100, &d, err)) return oai_jv_failed(err);
        r->logit_bias[r->n_logit_bias++] = (oai_bias){(int32_t)id, (float)d};
    }
    qsort(r->logit_bias, r->n_logit_bias, sizeof *r->logit_bias, cmp_bias);
    return 0;
}

/* Penalties, logit_bias and logprobs. */
static int parse_shaping(json_t *root, const oai_parse_opts *opts, oai_req *r, oai_err *err)
{
    json_t *v;
    int64_t n;
    if ((v = oai_jv_field(root, "presence_penalty")) &&
        oai_jv_num(v, "presence_penalty", -2, 2, &r->presence_penalty, err))
        return oai_jv_failed(err);
    if ((v = oai_jv_field(root, "frequency_penalty")) &&
        oai_jv_num(v, "frequency_penalty", -2, 2, &r->frequency_penalty, err))
        return oai_jv_failed(err);
    if ((v = oai_jv_field(root, "repetition_penalty"))) {
        if (oai_jv_num(v, "repetition_penalty", 0, 2, &r->repetition_penalty, err))
            return oai_jv_failed(err);
        if (r->repetition_penalty == 0)
            return oai_jv_fail(err, "repetition_penalty",
                               "repetition_penalty: must be greater than 0");
    }
    if ((v = oai_jv_field(root, "logit_bias")) && parse_logit_bias(v, opts, r, err))
        return oai_jv_failed(err);
    if (r->kind == OAI_COMPLETION) { /* the legacy form: logprobs is how many alternatives */
        if ((v = oai_jv_field(root, "logprobs"))) {
            if (oai_jv_int(v, "logprobs", 0, 5, &n, err) < 0) return oai_jv_failed(err);
            r->logprobs = 1;
            r->top_logprobs = (uint32_t)n;
        }
        return 0;
    }
    if ((v = oai_jv_field(root, "logprobs")) && oai_jv_bool(v, "logprobs", &r->logprobs, err))
        return oai_jv_failed(err);
    if ((v = oai_jv_field(root, "top_logprobs"))) {
        if (oai_jv_int(v, "top_logprobs", 0, OAI_MAX_TOP_LOGPROBS, &n, err) < 0)
            return oai_jv_failed(err);
        if (!r->logprobs)
            return oai_jv_fail(err, "top_logprobs", "top_logprobs: requires \"logprobs\": true");
        r->top_logprobs = (uint32_t)n;
    }
    return 0;
}

/* tools: [{type "function", function {name, description?, parameters?}}] */
static int parse_tools(json_t *root, oai_req *r, oai_err *err)
{
    json_t *tools = oai_jv_field(root, "tools"), *t;
    char name[64];
    size_t i;
    if (tools) {
        if (!json_is_array(tools)) return oai_jv_fail(err, "tools", "tools: expected an array");
        if (json_array_size(tools) > OAI_MAX_TOOLS)
            return oai_jv_fail(err, "tools", "tools: %zu tools, at most %d are accepted",
                               json_array_size(tools), OAI_MAX_TOOLS);
        json_array_foreach(tools, i, t)
        {
            snprintf(name, sizeof name, "tools[%zu]", i);
            json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
            if (!json_is_object(t)) return oai_jv_fail(err, name, "%s: expected an object", name);
            if (!oai_jv_is_cstr(type) || strcmp(json_string_value(type), "function"))
                return oai_jv_fail(err, name, "%s.type: required, \"function\"", name);
            if (!json_is_object(fn))
                return oai_jv_fail(err, name, "%s.function: required, an object", name);
            json_t *fname = json_object_get(fn, "name"), *params = oai_jv_field(fn, "parameters");
            json_t *desc = oai_jv_field(fn, "description");
            snprintf(name, sizeof name, "tools[%zu].function.name", i);
            if (!oai_jv_is_cstr(fname) || !json_string_length(fname))
                return oai_jv_fail(err, name, "%s: required, a non-empty string", name);
            snprintf(name, sizeof name, "tools[%zu].function.parameters", i);
            if (params && !json_is_object(params))
                return oai_jv_fail(err, name, "%s: expected a JSON Schema object", name);
            snprintf(name, sizeof name, "tools[%zu].function.description", i);
            if (desc && !json_is_string(desc))
                return oai_jv_fail(err, name, "%s: expected a string", name);
        }
        r->tools = tools;
        r->n_tools = json_array_size(tools);
    }
    r->parallel_tool_calls = 1;
    json_t *v;
    if ((v = oai_jv_field(root, "chat_template_kwargs"))) {
        if (!json_is_object(v))
            return oai_jv_fail(err, "chat_template_kwargs",
                               "chat_template_kwargs: expected an object");
        r->template_kwargs = v;
    }
    if ((v = oai_jv_field(root, "parallel_tool_calls")) &&
        oai_jv_bool(v, "parallel_tool_calls", &r->parallel_tool_calls, err))
        return oai_jv_failed(err);
    if (!(v = oai_jv_field(root, "tool_choice"))) return 0;
    if (json_is_string(v)) {
        const char *c = json_string_value(v);
        if (!strcmp(c, "auto"))
            r->tool_choice = OAI_CHOICE_AUTO;
        else if (!strcmp(c, "none"))
            r->tool_choice = OAI_CHOICE_NONE;
        else if (!strcmp(c, "required"))
            r->tool_choice = OAI_CHOICE_REQUIRED;
        else
            return oai_jv_fail(err, "tool_choice",
                               "tool_choice: '%.32s' is not auto, none, required or a function", c);
    } else {
        json_t *fn = json_object_get(v, "function");
        json_t *fname = json_object_get(fn, "name");
        if (!json_is_object(v) || !oai_jv_is_cstr(fname))
            return oai_jv_fail(err, "tool_choice",
                               "tool_choice: expected \"auto\", \"none\", \"required\" or "
                               "{\"type\":\"function\",\"function\":{\"name\":...}}");
        r->tool_choice = OAI_CHOICE_NAMED;
        r->tool_choice_name = json_string_value(fname);
        int found = 0;
        json_array_foreach(r->tools, i, t) found |=
            !strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                    r->tool_choice_name);
        if (!found)
            return oai_jv_fail(err, "tool_choice", "tool_choice: no tool named '%.64s' in tools",
                               r->tool_choice_name);
    }
    if (r->tool_choice >= OAI_CHOICE_REQUIRED && !r->n_tools)
        return oai_jv_fail(err, "tool_choice",
                           "tool_choice: a tool call is required but no tools are given");
    return 0;
}

/* response_format: {"type": "text" | "json_object" | "json_schema",
 * "json_schema": {"name", "schema"?, "strict"?, "description"?}}. */
static int parse_json_schema(json_t *rf, oai_req *r, oai_err *err)
{
    json_t *js = json_object_get(rf, "json_schema"), *v;
    if (!json_is_object(js))
        return oai_jv_fail(
            err, "response_format.json_schema",
            "response_format.json_schema: required for type \"json_schema\", an object");
    v = json_object_get(js, "name");
    size_t n = json_string_length(v);
    if (!oai_jv_is_cstr(v) || n == 0 || n > 64 ||
        strspn(json_string_value(v), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789_-") != n)
        return oai_jv_fail(
            err, "response_format.json_schema.name",
            "response_format.json_schema.name: required, 1..64 of a-z, A-Z, 0-9, _ and -");
    if ((v = oai_jv_field(js, "description")) && !json_is_string(v))
        return oai_jv_fail(err, "response_format.json_schema.description",
                           "response_format.json_schema.description: expected a string");
    if ((v = oai_jv_field(js, "schema")) && !json_is_object(v))
        return oai_jv_fail(err, "response_format.json_schema.schema",
                           "response_format.json_schema.schema: expected a JSON Schema object");
    r->schema = v;
    if ((v = oai_jv_field(js, "strict")) &&
        oai_jv_bool(v, "response_format.json_schema.strict", &r->schema_strict, err))
        return oai_jv_failed(err);
    return 0;
}

static int parse_format(json_t *root, oai_req *r, oai_err *err)
{
    json_t *rf = oai_jv_field(root, "response_format"), *v;
    r->schema_strict = 1;
    if (rf) {
        json_t *type = json_object_get(rf, "type");
        if (!json_is_object(rf) || !oai_jv_is_cstr(type))
            return oai_jv_fail(err, "response_format",
                               "response_format: expected {\"type\": \"text\" | \"json_object\" | "
                               "\"json_schema\"}");
        const char *t = json_string_value(type);
        if (!strcmp(t, "json_object"))
            r->format = OAI_FORMAT_JSON_OBJECT;
        else if (!strcmp(t, "json_schema"))
            r->format = OAI_FORMAT_JSON_SCHEMA;
        else if (strcmp(t, "text"))
            return oai_jv_fail(
                err, "response_format.type",
                "response_format.type: '%.32s' is not text, json_object or json_schema", t);
        if (r->format == OAI_FORMAT_JSON_SCHEMA && parse_json_schema(rf, r, err))
            return oai_jv_failed(err);
    }
    if ((v = oai_jv_field(root, "grammar"))) {
        size_t n = json_string_length(v);
        if (!oai_jv_is_cstr(v) || n == 0 || n > OAI_MAX_GRAMMAR)
            return oai_jv_fail(err, "grammar",
                               "grammar: expected a non-empty string of at most %u bytes",
                               OAI_MAX_GRAMMAR);
        if (r->format != OAI_FORMAT_TEXT)
            return oai_jv_fail(err, "grammar",
                               "grammar: cannot be combined with response_format \"%s\"",
                               r->format == OAI_FORMAT_JSON_OBJECT ? "json_object" : "json_schema");
        r->grammar = json_string_value(v);
        r->grammar_len = n;
    }
    if (r->tool_choice >= OAI_CHOICE_REQUIRED && (r->grammar || r->format != OAI_FORMAT_TEXT))
        return oai_jv_fail(err, "tool_choice",
                           "tool_choice: a forced tool call cannot be combined with %s",
                           r->grammar ? "grammar" : "response_format");
    return 0;
}

static int parse_stream(json_t *root, oai_req *r, oai_err *err)
{
    json_t *v;
    if ((v = oai_jv_field(root, "stream")) && oai_jv_bool(v, "stream", &r->stream, err))
        return oai_jv_failed(err);
    if ((v = oai_jv_field(root, "stream_options"))) {
        if (!json_is_object(v))
            return oai_jv_fail(err, "stream_options", "stream_options: expected an object");
        json_t *u = oai_jv_field(v, "include_usage");
        if (u && oai_jv_bool(u, "stream_options.include_usage", &r->include_usage, err))
            return oai_jv_failed(err);
    }
    return 0;
}

static int parse_misc(json_t *root, oai_req *r, oai_err *err)
{
    json_t *v;
    int64_t n;
    if ((v = oai_jv_field(root, "n"))) {
        if (oai_jv_int(v, "n", (double)INT64_MIN, (double)INT64_MAX, &n, err) < 0)
            return oai_jv_failed(err);
        if (n != 1) return oai_jv_fail(err, "n", "n: only n = 1 is supported");
    }
    if ((v = oai_jv_field(root, "user"))) {
        if (!oai_jv_is_cstr(v)) return oai_jv_fail(err, "user", "user: expected a string");
        r->user = json_string_value(v);
    }
    if ((v = oai_jv_field(root, "ignore_eos")) && oai_jv_bool(v, "ignore_eos", &r->ignore_eos, err))
        return oai_jv_failed(err);
    if ((v = oai_jv_field(root, "cache_salt"))) { /* vLLM's: a prefix-cache namespace */
        size_t n = json_string_length(v);
        if (!json_is_string(v) || n == 0 || n > OAI_MAX_CACHE_SALT)
            return oai_jv_fail(err, "cache_salt", "cache_salt: expected a string of 1..%d bytes",
                               OAI_MAX_CACHE_SALT);
        r->cache_salt = json_string_value(v);
        r->cache_salt_len = n;
    }
    if ((v = oai_jv_field(root, "kv_transfer_params"))) {
        if (!json_is_object(v))
            return oai_jv_fail(err, "kv_transfer_params", "kv_transfer_params: expected an object");
        r->kv_transfer_params = v;
    }
    return 0;
}

static int parse_root(enum oai_kind kind, json_t *root, const oai_parse_opts *opts, oai_req *r,
                      oai_err *err)
{
    if (!json_is_object(root)) return oai_jv_fail(err, NULL, "request body must be a JSON object");
    json_t *model = json_object_get(root, "model");
    if (!model) return oai_jv_fail(err, "model", "model: required");
    if (!oai_jv_is_cstr(model)) return oai_jv_fail(err, "model", "model: expected a string");
    r->model = json_string_value(model);
    int rc = kind == OAI_CHAT ? parse_messages(root, r, err) : parse_prompt(root, opts, r, err);
    if (rc == 0) rc = parse_max_tokens(root, r, err);
    if (rc == 0) rc = parse_sampling(root, r, err);
    if (rc == 0) rc = parse_shaping(root, opts, r, err);
    if (rc == 0) rc = parse_stop(root, r, err);
    if (rc == 0) rc = parse_stream(root, r, err);
    if (rc == 0) rc = parse_misc(root, r, err);
    if (rc == 0 && kind == OAI_CHAT) rc = parse_tools(root, r, err);
    if (rc == 0) rc = parse_format(root, r, err);
    return rc;
}

int oai_req_parse(enum oai_kind kind, const char *body, size_t len, const oai_parse_opts *opts,
                  oai_req *out, oai_err *err)
{
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    out->temperature = 1.0;
    out->top_p = 1.0;
    out->repetition_penalty = 1.0;
    json_error_t jerr;
    /* a model can emit any byte, NUL included, and the client sends it back */
    size_t failed = dx_alloc_failed_count();
    long long mem0 = dx_alloc_thread_bytes();
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, &jerr);
    if (dx_alloc_failed_count() != failed) {
        /* jansson's lexer drops a byte it has no memory for and goes on: a
         * parse that saw an allocation fail is not trusted, even if it
         * "succeeded" (seen: a model name one letter short) */
        json_decref(root);
        return oai_jv_oom(err, "reading the request");
    }
    if (!root)
        return oai_jv_fail(err, NULL, "invalid JSON at line %d, column %d: %s", jerr.line,
                           jerr.column, jerr.text);
    out->root = root;
    int rc = parse_root(kind, root, opts, out, err);
    if (rc < 0 && dx_alloc_failed_count() != failed)
        rc = oai_jv_oom(err, "reading the request"); /* not the request's fault */
    if (rc < 0) oai_req_free(out);
    long long mem = dx_alloc_thread_bytes() - mem0;
    if (rc >= 0) out->mem_bytes = mem > 0 ? (size_t)mem : 0;
    return rc;
}

void oai_req_free(oai_req *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n_msgs; i++) dx_free(r->msgs[i].owned);
    dx_free(r->msgs);
    dx_free(r->prompt_ids);
    dx_free(r->logit_bias);
    if (r->root) json_decref(r->root);
    enum oai_kind kind = r->kind;
    memset(r, 0, sizeof *r);
    r->kind = kind;
}
