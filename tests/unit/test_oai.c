/* Unit tests for src/node: OpenAI request parsing (with a bad-input corpus),
 * response/chunk/error JSON, UTF-8 sanitising and the Prometheus writers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "node/kvtp.h"
#include "oai/oai_req.h"
#include "oai/oai_resp.h"
#include "http/prom.h"

static int parse(enum oai_kind k, const char *body, oai_req *r, oai_err *e)
{
    oai_parse_opts o = {.n_vocab = 1000};
    return oai_req_parse(k, body, strlen(body), &o, r, e);
}

static void test_chat_full(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_req r;
    oai_err e;
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"sys\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
        "\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null}],"
        "\"max_completion_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"top_k\":-1,\"min_p\":0.1,"
        "\"seed\":42,\"stop\":[\"x\",\"\",\"yy\"],\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"user\":\"u\",\"n\":1,\"logprobs\":false,"
        "\"unknown\":{\"deep\":[1,2]},\"kv_transfer_params\":{\"do_remote_decode\":true}}";
    assert_int_equal(parse(OAI_CHAT, body, &r, &e), 0);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_msgs, 3);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[1].content, "a\nb");
    assert_int_equal(r.msgs[1].content_len, 3);
    assert_string_equal(r.msgs[2].role, "assistant");
    assert_int_equal(r.msgs[2].content_len, 0);
    assert_true(r.has_max_tokens);
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.temperature == 0.0);
    assert_true(r.top_p == 0.5);
    assert_int_equal(r.top_k, 0);
    assert_true(r.has_seed);
    assert_int_equal(r.seed, 42);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "yy");
    assert_true(r.stream && r.include_usage);
    assert_string_equal(r.user, "u");
    assert_non_null(r.kv_transfer_params);
    assert_null(r.cache_salt);
    oai_req_free(&r);
    /* cache_salt: up to 1024 bytes, kept by length; one more is a 400 */
    char salted[1200];
    snprintf(salted, sizeof salted,
             "{\"model\":\"m\",\"cache_salt\":\"%01024d\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"a\"}]}",
             7);
    assert_int_equal(parse(OAI_CHAT, salted, &r, &e), 0);
    assert_int_equal(r.cache_salt_len, 1024);
    oai_req_free(&r);
    snprintf(salted, sizeof salted,
             "{\"model\":\"m\",\"cache_salt\":\"%01025d\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"a\"}]}",
             7);
    assert_int_equal(parse(OAI_CHAT, salted, &r, &e), DX_EINVAL);
    assert_string_equal(e.param, "cache_salt");
    /* a NUL the model emitted comes back in a content: kept, by length */
    const char *nul = "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":"
                      "\"a\\u0000b\"}]}";
    assert_int_equal(parse(OAI_CHAT, nul, &r, &e), 0);
    assert_int_equal(r.msgs[0].content_len, 3);
    assert_memory_equal(r.msgs[0].content, "a\0b", 3);
    oai_req_free(&r);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* An agentic history: tools, an assistant turn of tool calls (arguments as
 * text and as an object), tool results, reasoning. */
static void test_tools_accepted(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_req r;
    oai_err e;
    const char *body =
        "{\"model\":\"m\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"d\",\"parameters\":{\"type\":\"object\"}}},{\"type\":\"function\","
        "\"function\":{\"name\":\"now\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":"
        "{\"name\":\"now\"}},\"parallel_tool_calls\":false,\"messages\":["
        "{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"think\",\"tool_calls\":["
        "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},"
        "{\"id\":\"call_2\",\"function\":{\"name\":\"now\",\"arguments\":{}}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":\"noon\"}]}";
    if (parse(OAI_CHAT, body, &r, &e)) fail_msg("%s: %s", e.param, e.message);
    assert_int_equal(r.n_tools, 2);
    assert_int_equal(r.tool_choice, OAI_CHOICE_NAMED);
    assert_string_equal(r.tool_choice_name, "now");
    assert_int_equal(r.parallel_tool_calls, 0);
    assert_int_equal(r.msgs[1].n_tool_calls, 2);
    assert_string_equal(r.msgs[1].content, "");
    assert_memory_equal(r.msgs[1].reasoning, "think", 5);
    assert_string_equal(r.msgs[2].tool_call_id, "call_1");
    oai_req_free(&r);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* Structured outputs: response_format's shapes and the grammar field. */
static void test_structured_accepted(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_req r;
    oai_err e;
    assert_int_equal(
        parse(OAI_CHAT,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
              "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
              "\"Out_1-x\",\"description\":\"d\",\"strict\":false,\"schema\":{\"type\":"
              "\"object\"}}}}",
              &r, &e),
        0);
    assert_int_equal(r.format, OAI_FORMAT_JSON_SCHEMA);
    assert_non_null(r.schema);
    assert_false(r.schema_strict);
    assert_null(r.grammar);
    oai_req_free(&r);
    assert_int_equal(parse(OAI_COMPLETION,
                           "{\"model\":\"m\",\"prompt\":\"a\",\"response_format\":{\"type\":"
                           "\"json_schema\",\"json_schema\":{\"name\":\"o\"}}}",
                           &r, &e),
                     0);
    assert_int_equal(r.format, OAI_FORMAT_JSON_SCHEMA);
    assert_null(r.schema); /* any JSON object */
    assert_true(r.schema_strict);
    oai_req_free(&r);
    /* text is no constraint, so it combines with a grammar and a forced call */
    assert_int_equal(parse(OAI_COMPLETION,
                           "{\"model\":\"m\",\"prompt\":\"a\",\"response_format\":{\"type\":"
                           "\"text\"},\"grammar\":\"root ::= [a-z]+\"}",
                           &r, &e),
                     0);
    assert_int_equal(r.format, OAI_FORMAT_TEXT);
    assert_string_equal(r.grammar, "root ::= [a-z]+");
    assert_int_equal(r.grammar_len, 15);
    oai_req_free(&r);
    assert_int_equal(parse(OAI_CHAT,
                           "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                           "\"response_format\":{\"type\":\"json_object\"},\"grammar\":null}",
                           &r, &e),
                     0);
    assert_int_equal(r.format, OAI_FORMAT_JSON_OBJECT);
    oai_req_free(&r);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_defaults_and_prompts(void **state)
{
    (void)state;
    oai_req r;
    oai_err e;
    assert_int_equal(parse(OAI_COMPLETION,
                           "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":null,"
                           "\"temperature\":null,\"stop\":\"s\"}",
                           &r, &e),
                     0);
    assert_false(r.has_max_tokens);
    assert_true(r.temperature == 1.0 && r.top_p == 1.0);
    assert_false(r.stream);
    assert_string_equal(r.prompt, "hi");
    assert_int_equal(r.n_stop, 1);
    oai_req_free(&r);
    assert_int_equal(parse(OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,2,999]}", &r, &e), 0);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 999);
    oai_req_free(&r);
    assert_int_equal(parse(OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[[5,6]]}", &r, &e), 0);
    assert_int_equal(r.n_prompt_ids, 2);
    oai_req_free(&r);
    assert_int_equal(parse(OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"one\"]}", &r, &e), 0);
    assert_string_equal(r.prompt, "one");
    oai_req_free(&r);
    /* integral reals are integers; max_tokens wins when it is the only one */
    assert_int_equal(
        parse(OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":1e2}", &r, &e), 0);
    assert_int_equal(r.max_tokens, 100);
    oai_req_free(&r);
}

/* Each bad body gets a 400 whose param (and message) name the field. */
static void test_bad_corpus(void **state)
{
    (void)state;
    static const struct {
        enum oai_kind kind;
        const char *body, *param, *msg_has;
    } cases[] = {
        {OAI_CHAT, "", "", "invalid JSON"},
        {OAI_CHAT, "{\"model\":\"m\",", "", "invalid JSON"},
        {OAI_CHAT, "[1,2]", "", "JSON object"},
        {OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", "",
         "invalid JSON"},
        {OAI_CHAT, "{\"model\":\"m\\u0000x\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
         "model", "model"},
        {OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\\u0000\",\"content\":\"a\"}]}",
         "messages[0]", "role"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"stop\":\"a\\u0000\",\"messages\":[{\"role\":\"user\",\"content\":"
         "\"a\"}]}",
         "stop", "NUL"},
        {OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", "model", "model"},
        {OAI_CHAT, "{\"model\":5,\"messages\":[]}", "model", "model"},
        {OAI_CHAT, "{\"model\":\"m\"}", "messages", "messages: required"},
        {OAI_CHAT, "{\"model\":\"m\",\"messages\":[]}", "messages", "non-empty"},
        {OAI_CHAT, "{\"model\":\"m\",\"messages\":\"hi\"}", "messages", "messages"},
        {OAI_CHAT, "{\"model\":\"m\",\"messages\":[1]}", "messages[0]", "messages[0]"},
        {OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"content\":\"a\"}]}", "messages[0]",
         "messages[0].role"},
        {OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"a\"}]}",
         "messages[0]", "unknown role"},
        {OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":3}]}",
         "messages[0]", "messages[0].content"},
        {OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":null}]}",
         "messages[0]", "messages[0].content"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}"
         "]"
         "}",
         "messages[0].content[0]", "only \"text\""},
        {OAI_CHAT,
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
         "messages[0].content[0]", ".text"},
        {OAI_COMPLETION, "{\"model\":\"m\"}", "prompt", "prompt: required"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":7}", "prompt", "prompt"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[]}", "prompt", "empty"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", "prompt", "one prompt"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,\"a\"]}", "prompt", "prompt[1]"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,1000]}", "prompt", "prompt[1]"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[-1]}", "prompt", "prompt[0]"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":-5}", "max_tokens",
         "max_tokens"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens",
         "out of range"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":\"10\"}", "max_tokens",
         "integer"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":1.5}", "max_tokens",
         "integer"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":99999999999}",
         "max_tokens", "out of range"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":1e300}", "max_tokens",
         "out of range"},
        {OAI_COMPLETION,
         "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":99999999999999999999999}", "",
         "invalid JSON"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"max_completion_tokens\":true}",
         "max_completion_tokens", "max_completion_tokens"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":3}", "temperature",
         "temperature"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":\"hot\"}",
         "temperature", "number"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":0}", "top_p", "top_p"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":1.5}", "top_p", "top_p"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"top_k\":-2}", "top_k", "top_k"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"top_k\":0.5}", "top_k", "top_k"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"min_p\":-0.1}", "min_p", "min_p"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"seed\":\"1\"}", "seed", "seed"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"seed\":1e30}", "seed", "seed"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"stop\":5}", "stop", "stop"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"stop\":[\"a\",1]}", "stop",
         "stop[1]"},
        {OAI_COMPLETION,
         "{\"model\":\"m\",\"prompt\":\"x\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\","
         "\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
         "stop", "at most"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":\"yes\"}", "stream",
         "stream"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"stream_options\":1}",
         "stream_options", "stream_options"},
        {OAI_COMPLETION,
         "{\"model\":\"m\",\"prompt\":\"x\",\"stream_options\":{\"include_usage\":1}}",
         "stream_options.include_usage", "include_usage"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"n\":2}", "n", "n = 1"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"n\":0}", "n", "n = 1"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"user\":[]}", "user", "user"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"kv_transfer_params\":[]}",
         "kv_transfer_params", "kv_transfer_params"},
#define M(x) "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}," x "]}"
#define T    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\"}}]"
        {OAI_CHAT, M("{\"role\":\"assistant\",\"content\":null,\"tool_calls\":{}}"),
         "messages[1].tool_calls", "expected an array"},
        {OAI_CHAT,
         M("{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":"
           "\"f\",\"arguments\":\"{}\"}}]}"),
         "messages[1].tool_calls[0]", "id: required"},
        {OAI_CHAT,
         M("{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"function\":{\"name\":\"f\","
           "\"arguments\":3}}]}"),
         "messages[1].tool_calls[0].function.arguments", "JSON string"},
        {OAI_CHAT,
         M("{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"function\":{\"name\":\"\"}}]}"),
         "messages[1].tool_calls[0].function.name", "non-empty"},
        {OAI_CHAT, M("{\"role\":\"user\",\"content\":\"a\",\"tool_calls\":[]}"),
         "messages[1].tool_calls", "only on assistant"},
        {OAI_CHAT, M("{\"role\":\"tool\",\"content\":\"42\"}"), "messages[1].tool_call_id",
         "required for a tool message"},
        {OAI_CHAT, M("{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":7}"),
         "messages[1].reasoning_content", "string"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"tools\":{},\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
         "tools", "array"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"g\","
         "\"parameters\":[]}}],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
         "tools[0].function.parameters", "JSON Schema"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"tools\":[{\"type\":\"code\"}],\"messages\":[{\"role\":\"user\","
         "\"content\":\"a\"}]}",
         "tools[0]", "function"},
        {OAI_CHAT,
         "{\"model\":\"m\"," T
         ",\"tool_choice\":\"always\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
         "tool_choice", "always"},
        {OAI_CHAT,
         "{\"model\":\"m\"," T
         ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"put\"}},"
         "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
         "tool_choice", "no tool named 'put'"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"tool_choice\":\"required\",\"messages\":[{\"role\":\"user\","
         "\"content\":\"a\"}]}",
         "tool_choice", "no tools"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"parallel_tool_calls\":1,\"messages\":[{\"role\":\"user\",\"content\":"
         "\"a\"}]}",
         "parallel_tool_calls", "true or false"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"cache_salt\":7,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
         "cache_salt", "a string of 1..1024 bytes"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"cache_salt\":\"\",\"prompt\":\"a\"}", "cache_salt",
         "a string of 1..1024 bytes"},
    /* structured outputs */
#define U "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]"
        {OAI_CHAT, "{\"model\":\"m\",\"response_format\":\"json\"," U "}", "response_format",
         "expected {\"type\""},
        {OAI_CHAT, "{\"model\":\"m\",\"response_format\":{}," U "}", "response_format", "type"},
        {OAI_CHAT, "{\"model\":\"m\",\"response_format\":{\"type\":\"yaml\"}," U "}",
         "response_format.type", "'yaml' is not text, json_object or json_schema"},
        {OAI_CHAT, "{\"model\":\"m\",\"response_format\":{\"type\":\"json_schema\"}," U "}",
         "response_format.json_schema", "required"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
         "{\"schema\":{}}}," U "}",
         "response_format.json_schema.name", "required"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
         "{\"name\":\"a b\"}}," U "}",
         "response_format.json_schema.name", "a-z"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
         "{\"name\":\"x\",\"schema\":[]}}," U "}",
         "response_format.json_schema.schema", "JSON Schema object"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
         "{\"name\":\"x\",\"strict\":\"no\"}}," U "}",
         "response_format.json_schema.strict", "true or false"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
         "{\"name\":\"x\",\"description\":1}}," U "}",
         "response_format.json_schema.description", "string"},
        {OAI_CHAT, "{\"model\":\"m\",\"grammar\":\"\"," U "}", "grammar", "non-empty string"},
        {OAI_CHAT, "{\"model\":\"m\",\"grammar\":[\"root ::= \\\"a\\\"\"]," U "}", "grammar",
         "non-empty string"},
        {OAI_CHAT,
         "{\"model\":\"m\",\"grammar\":\"root ::= \\\"a\\\"\",\"response_format\":"
         "{\"type\":\"json_object\"}," U "}",
         "grammar", "cannot be combined with response_format \"json_object\""},
        {OAI_CHAT,
         "{\"model\":\"m\"," T ",\"tool_choice\":\"required\",\"response_format\":"
         "{\"type\":\"json_object\"}," U "}",
         "tool_choice", "cannot be combined with response_format"},
        {OAI_CHAT,
         "{\"model\":\"m\"," T ",\"tool_choice\":\"required\",\"grammar\":\"root ::= \\\"a\\\"\"," U
         "}",
         "tool_choice", "cannot be combined with grammar"},
        {OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"a\",\"response_format\":{\"type\":7}}",
         "response_format", "type"},
#undef U
#undef M
#undef T
    };
    size_t live = dx_alloc_live_bytes();
    for (size_t i = 0; i < DX_ARRAY_LEN(cases); i++) {
        oai_req r;
        oai_err e;
        int rc = parse(cases[i].kind, cases[i].body, &r, &e);
        if (rc != DX_EINVAL || e.status != 400 || strcmp(e.param, cases[i].param) != 0 ||
            !strstr(e.message, cases[i].msg_has))
            fail_msg("case %zu (%s): rc=%d status=%d param='%s' message='%s'", i, cases[i].body, rc,
                     e.status, e.param, e.message);
        assert_null(r.root);
        assert_null(r.msgs);
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* A JSON array of n copies of item, as a request's field. */
static void rep_array(dx_buf *b, const char *item, size_t n)
{
    dx_buf_putc(b, '[');
    for (size_t i = 0; i < n; i++) dx_buf_printf(b, "%s%s", i ? "," : "", item);
    dx_buf_putc(b, ']');
}

/* The request limits (OAI_MAX_*): the limit itself is accepted, one more is a
 * 400 that names the field and the limit.  A chat request with ~790,000
 * messages once overflowed the loop thread's stack. */
static void test_request_limits(void **state)
{
    (void)state;
    static const struct {
        enum oai_kind kind;
        const char *field, *item; /* item repeated; "S" = one stop string of n bytes */
        size_t limit;
        const char *want;
    } cases[] = {
        {OAI_CHAT, "messages", "{\"role\":\"user\",\"content\":\"a\"}", OAI_MAX_MESSAGES,
         "at most 16384"},
        {OAI_CHAT, "tools", "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}", OAI_MAX_TOOLS,
         "at most 1024"},
        {OAI_COMPLETION, "stop", "\"s\"", OAI_MAX_STOP, "at most 16"},
        {OAI_COMPLETION, "stop", "S", OAI_MAX_STOP_BYTES, "at most 65536"},
    };
    size_t live = dx_alloc_live_bytes();
    for (size_t i = 0; i < DX_ARRAY_LEN(cases); i++)
        for (size_t n = cases[i].limit; n <= cases[i].limit + 1; n++) {
            dx_buf b;
            dx_buf_init(&b, 0);
            dx_buf_puts(&b, "{\"model\":\"m\",");
            if (cases[i].kind == OAI_COMPLETION) dx_buf_puts(&b, "\"prompt\":\"p\",");
            if (strcmp(cases[i].field, "messages"))
                dx_buf_puts(&b, cases[i].kind == OAI_CHAT
                                    ? "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                                    : "");
            dx_buf_printf(&b, "\"%s\":", cases[i].field);
            if (!strcmp(cases[i].item, "S")) { /* two strings of n bytes in all */
                dx_buf_puts(&b, "[\"");
                for (size_t k = 0; k < n / 2; k++) dx_buf_putc(&b, 'x');
                dx_buf_puts(&b, "\",\"");
                for (size_t k = 0; k < n - n / 2; k++) dx_buf_putc(&b, 'y');
                dx_buf_puts(&b, "\"]");
            } else {
                rep_array(&b, cases[i].item, n);
            }
            dx_buf_putc(&b, '}');
            oai_req r;
            oai_err e;
            int rc = oai_req_parse(cases[i].kind, b.data, b.len, NULL, &r, &e);
            if (n == cases[i].limit) {
                if (rc) fail_msg("%s at the limit %zu: %s", cases[i].field, n, e.message);
                oai_req_free(&r);
            } else {
                assert_int_equal(rc, DX_EINVAL);
                assert_int_equal(e.status, 400);
                assert_string_equal(e.param, cases[i].field);
                if (!strstr(e.message, cases[i].want))
                    fail_msg("%s: message '%s' lacks '%s'", cases[i].field, e.message,
                             cases[i].want);
            }
            dx_buf_free(&b);
        }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* Running out of memory anywhere in parsing is an error, never a crash/leak. */
static void test_parse_oom(void **state)
{
    (void)state;
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                       "\"text\",\"text\":\"a\"}]},{\"role\":\"user\",\"content\":\"b\"}],"
                       "\"stop\":[\"q\"]}";
    size_t live = dx_alloc_live_bytes();
    for (long n = 1; n < 60; n++) {
        oai_req r;
        oai_err e;
        dx_alloc_fail_after(n, 0);
        int rc = parse(OAI_CHAT, body, &r, &e);
        dx_alloc_fail_after(0, 0);
        if (rc == 0) oai_req_free(&r);
        assert_int_equal(dx_alloc_live_bytes(), live);
    }
}

static void test_json_str_utf8(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    const char in[] = "a\"\\\n\t\x01 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xff \xc0\xaf "
                      "\xed\xa0\x80 \xf4\x90\x80\x80 \xe2\x82";
    assert_int_equal(oai_json_str(&b, in, sizeof in - 1), 0);
    assert_string_equal(b.data, "\"a\\\"\\\\\\n\\t\\u0001 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 "
                                "\\ufffd \\ufffd\\ufffd \\ufffd\\ufffd\\ufffd "
                                "\\ufffd\\ufffd\\ufffd\\ufffd \\ufffd\\ufffd\"");
    /* the result must be valid JSON that decodes back */
    json_error_t je;
    json_t *v = json_loadb(b.data, b.len, JSON_DECODE_ANY, &je);
    assert_non_null(v);
    assert_true(json_is_string(v));
    json_decref(v);
    dx_buf_free(&b);
}

static json_t *load(const char *s, size_t n)
{
    json_error_t je;
    json_t *v = json_loadb(s, n, 0, &je);
    if (!v) fail_msg("not JSON (%s): %.*s", je.text, (int)n, s);
    return v;
}

static void test_resp_full(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_meta m = {OAI_CHAT, "chatcmpl-1", "tiny", 1700000000};
    oai_usage u = {10, 4, 3};
    assert_int_equal(oai_resp_full(&b, &m,
                                   &(oai_choice){.text = "hi \xff", .len = 4, .finish = "length"},
                                   &u, "\"x\":1"),
                     0);
    json_t *v = load(b.data, b.len);
    assert_string_equal(json_string_value(json_object_get(v, "object")), "chat.completion");
    assert_int_equal(json_integer_value(json_object_get(v, "created")), 1700000000);
    json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "hi \xef\xbf\xbd");
    json_t *us = json_object_get(v, "usage");
    assert_int_equal(json_integer_value(json_object_get(us, "total_tokens")), 13);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(us, "prompt_tokens_details"), "cached_tokens")),
                     4);
    assert_int_equal(json_integer_value(json_object_get(v, "x")), 1);
    json_decref(v);
    dx_buf_reset(&b);
    m.kind = OAI_COMPLETION;
    assert_int_equal(
        oai_resp_full(&b, &m, &(oai_choice){.text = "t", .len = 1, .finish = "stop"}, &u, NULL), 0);
    v = load(b.data, b.len);
    assert_string_equal(json_string_value(json_object_get(v, "object")), "text_completion");
    ch = json_array_get(json_object_get(v, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "t");
    json_decref(v);
    dx_buf_free(&b);
}

/* Strips "data: " and "\n\n" and parses the JSON in between. */
static json_t *sse_json(const dx_buf *b)
{
    assert_true(b->len > 8);
    assert_memory_equal(b->data, "data: ", 6);
    assert_memory_equal(b->data + b->len - 2, "\n\n", 2);
    return load(b->data + 6, b->len - 8);
}

static void test_sse_chunks(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_meta m = {OAI_CHAT, "chatcmpl-2", "tiny", 1};
    oai_sse_chunk(&b, &m, &(oai_choice){.text = ""}, 1, 1, NULL);
    json_t *v = sse_json(&b);
    json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(v, "object")), "chat.completion.chunk");
    assert_string_equal(json_string_value(json_object_get(json_object_get(ch, "delta"), "role")),
                        "assistant");
    assert_true(json_is_null(json_object_get(ch, "finish_reason")));
    assert_true(json_is_null(json_object_get(v, "usage")));
    json_decref(v);
    dx_buf_reset(&b);
    oai_sse_chunk(&b, &m, &(oai_choice){.text = "tok", .len = 3}, 0, 0, NULL);
    v = sse_json(&b);
    ch = json_array_get(json_object_get(v, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(ch, "delta"), "content")),
                        "tok");
    assert_null(json_object_get(v, "usage"));
    json_decref(v);
    dx_buf_reset(&b);
    oai_sse_chunk(&b, &m, &(oai_choice){.text = "", .finish = "stop"}, 0, 0,
                  "\"kv_transfer_params\":{\"a\":1}");
    v = sse_json(&b);
    ch = json_array_get(json_object_get(v, "choices"), 0);
    assert_int_equal(json_object_size(json_object_get(ch, "delta")), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    assert_non_null(json_object_get(v, "kv_transfer_params"));
    json_decref(v);
    dx_buf_reset(&b);
    oai_usage u = {5, 0, 2};
    oai_sse_usage(&b, &m, &u);
    v = sse_json(&b);
    assert_int_equal(json_array_size(json_object_get(v, "choices")), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(v, "usage"), "completion_tokens")), 2);
    json_decref(v);
    dx_buf_reset(&b);
    oai_sse_done(&b);
    assert_string_equal(b.data, "data: [DONE]\n\n");
    dx_buf_reset(&b);
    m.kind = OAI_COMPLETION;
    oai_sse_chunk(&b, &m, &(oai_choice){.text = "z", .len = 1}, 0, 0, NULL);
    v = sse_json(&b);
    assert_string_equal(json_string_value(json_object_get(v, "object")), "text_completion");
    ch = json_array_get(json_object_get(v, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "z");
    json_decref(v);
    dx_buf_free(&b);
}

static void test_errors_models_ids(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_error_json(&b, "bad \"x\"", oai_error_type(400), "max_tokens", NULL);
    json_t *v = load(b.data, b.len);
    json_t *e = json_object_get(v, "error");
    assert_string_equal(json_string_value(json_object_get(e, "message")), "bad \"x\"");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "max_tokens");
    assert_true(json_is_null(json_object_get(e, "code")));
    json_decref(v);
    assert_string_equal(oai_error_type(503), "server_error");
    dx_buf_reset(&b);
    oai_models_json(&b, "tiny", 5);
    v = load(b.data, b.len);
    assert_string_equal(json_string_value(json_object_get(v, "object")), "list");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(v, "data"), 0), "id")),
        "tiny");
    json_decref(v);
    dx_buf_free(&b);
    char a[64], c[64];
    oai_make_id(a, sizeof a, "chatcmpl");
    oai_make_id(c, sizeof c, "chatcmpl");
    assert_int_equal(strlen(a), strlen("chatcmpl-") + 32);
    assert_memory_equal(a, "chatcmpl-", 9);
    assert_string_not_equal(a, c);
}

static void test_prom(void **state)
{
    (void)state;
    prom_hist h;
    prom_hist_init_latency(&h);
    prom_hist_observe(&h, 0.0005);
    prom_hist_observe(&h, 0.003);
    prom_hist_observe(&h, 100);
    prom_family f;
    prom_family_init(&f);
    prom_family_add(&f, "route=\"/a\",status=\"200\"", 1);
    prom_family_add(&f, "route=\"/a\",status=\"200\"", 2);
    prom_family_add(&f, "route=\"/a\",status=\"404\"", 1);
    assert_int_equal(prom_family_get(&f, "route=\"/a\",status=\"200\""), 3);
    dx_buf b;
    dx_buf_init(&b, 0);
    prom_write_family(&b, "req_total", "reqs", &f);
    prom_write_hist(&b, "lat_seconds", "lat", &h);
    assert_non_null(strstr(b.data, "# TYPE req_total counter\n"));
    assert_non_null(strstr(b.data, "req_total{route=\"/a\",status=\"200\"} 3\n"));
    assert_non_null(strstr(b.data, "lat_seconds_bucket{le=\"0.001\"} 1\n"));
    assert_non_null(strstr(b.data, "lat_seconds_bucket{le=\"0.005\"} 2\n"));
    assert_non_null(strstr(b.data, "lat_seconds_bucket{le=\"60\"} 2\n"));
    assert_non_null(strstr(b.data, "lat_seconds_bucket{le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(b.data, "lat_seconds_count 3\n"));
    /* a labelled series (the router's per-stage histograms) */
    dx_buf_reset(&b);
    prom_write_hist_series(&b, "lat_seconds", "stage=\"x\"", &h);
    assert_non_null(strstr(b.data, "lat_seconds_bucket{stage=\"x\",le=\"0.001\"} 1\n"));
    assert_non_null(strstr(b.data, "lat_seconds_bucket{stage=\"x\",le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(b.data, "lat_seconds_sum{stage=\"x\"} "));
    assert_non_null(strstr(b.data, "lat_seconds_count{stage=\"x\"} 3\n"));
    assert_null(strstr(b.data, "# TYPE"));
    dx_buf_free(&b);
    prom_family_free(&f);
}

/* kv_transfer_params: vLLM's all-null shape, a full duplex set written back
 * and parsed again, and each bad field named. */
static kvtp_limits g_lim = {1000, 16, 4096};

static int parse_kv(const char *params, kvtp *p, oai_err *e)
{
    json_error_t je;
    json_t *v = json_loads(params, 0, &je);
    assert_non_null(v);
    int rc = kvtp_parse(v, &g_lim, p, e);
    json_decref(v);
    return rc;
}

static void test_kvtp(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    kvtp p, p2;
    oai_err e;
    assert_int_equal(parse_kv("{\"do_remote_decode\":true,\"do_remote_prefill\":false,"
                              "\"remote_engine_id\":null,\"remote_request_id\":null,"
                              "\"remote_host\":null,\"remote_port\":null,"
                              "\"remote_block_ids\":null,\"remote_num_tokens\":null}",
                              &p, &e),
                     0);
    assert_true(p.do_remote_decode && !p.do_remote_prefill && !kvtp_has_holder(&p));
    assert_true(p.num_tokens == -1 && p.port == 0 && !p.block_ids && !p.engine_id[0]);
    kvtp_free(&p);
    const char *full = "{\"do_remote_prefill\":true,\"remote_engine_id\":\"e1\","
                       "\"remote_request_id\":\"r\",\"remote_host\":\"127.0.0.1\","
                       "\"remote_port\":4000,\"remote_block_ids\":[3,4],\"remote_num_tokens\":32,"
                       "\"remote_lease\":\"00112233445566778899aabbccddeeff\","
                       "\"remote_blocks_ttl_s\":480,\"remote_token_ids\":["
                       "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,"
                       "28,29,30,31,32,999],\"first_token_ids\":[42],"
                       "\"first_token_model\":\"ffeeddccbbaa99887766554433221100\"}";
    assert_int_equal(parse_kv(full, &p, &e), 0);
    assert_true(kvtp_has_holder(&p));
    assert_int_equal(p.n_tokens, 33);
    assert_int_equal(p.token_ids[32], 999);
    assert_int_equal(p.lease.b[15], 0xff);
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_putc(&b, '{');
    assert_int_equal(kvtp_write(&b, &p), 0);
    dx_buf_putc(&b, '}');
    json_error_t je;
    json_t *v = json_loadb(b.data, b.len, 0, &je);
    assert_non_null(v);
    assert_int_equal(kvtp_parse(json_object_get(v, "kv_transfer_params"), &g_lim, &p2, &e), 0);
    assert_true(p2.ttl_s == 480 && p2.port == 4000 && p2.n_blocks == 2 && p2.block_ids[1] == 4);
    assert_memory_equal(p2.lease.b, p.lease.b, 16);
    assert_string_equal(p2.engine_id, "e1");
    assert_true(p2.n_first == 1 && p2.first_ids[0] == 42 && p2.first_model.b[0] == 0xff);
    json_decref(v);
    kvtp_free(&p);
    kvtp_free(&p2);
    dx_buf_free(&b);
    static const struct {
        const char *params, *param;
    } bad[] = {
        {"{\"do_remote_decode\":1}", "kv_transfer_params.do_remote_decode"},
        {"{\"remote_host\":\"\"}", "kv_transfer_params.remote_host"},
        {"{\"remote_host\":7}", "kv_transfer_params.remote_host"},
        {"{\"remote_port\":0}", "kv_transfer_params.remote_port"},
        {"{\"remote_port\":65536}", "kv_transfer_params.remote_port"},
        {"{\"remote_port\":\"80\"}", "kv_transfer_params.remote_port"},
        {"{\"remote_block_ids\":[1,-2]}", "kv_transfer_params.remote_block_ids"},
        {"{\"remote_block_ids\":{}}", "kv_transfer_params.remote_block_ids"},
        {"{\"remote_lease\":\"abc\"}", "kv_transfer_params.remote_lease"},
        {"{\"remote_lease\":\"zz112233445566778899aabbccddeeff\"}",
         "kv_transfer_params.remote_lease"},
        {"{\"remote_blocks_ttl_s\":-1}", "kv_transfer_params.remote_blocks_ttl_s"},
        {"{\"remote_token_ids\":[1000]}", "kv_transfer_params.remote_token_ids"},
        {"{\"remote_block_ids\":[1],\"remote_num_tokens\":15}",
         "kv_transfer_params.remote_num_tokens"},
        {"{\"remote_num_tokens\":16,\"remote_token_ids\":[1]}",
         "kv_transfer_params.remote_num_tokens"},
        {"{\"remote_token_ids\":[1],\"first_token_ids\":[1000],"
         "\"first_token_model\":\"00112233445566778899aabbccddeeff\"}",
         "kv_transfer_params.first_token_ids"},
        {"{\"remote_token_ids\":[1],\"first_token_ids\":[1]}",
         "kv_transfer_params.first_token_ids"},
        {"{\"first_token_ids\":[1],\"first_token_model\":\"00112233445566778899aabbccddeeff\"}",
         "kv_transfer_params.first_token_ids"},
        {"{\"remote_token_ids\":[1],\"first_token_ids\":[1],\"first_token_model\":\"0011\"}",
         "kv_transfer_params.first_token_model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (parse_kv(bad[i].params, &p, &e) != DX_EINVAL) fail_msg("accepted %s", bad[i].params);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, bad[i].param);
        assert_non_null(strstr(e.message, bad[i].param));
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

int main(void)
{
    oai_json_use_dx_alloc();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_full),
        cmocka_unit_test(test_defaults_and_prompts),
        cmocka_unit_test(test_bad_corpus),
        cmocka_unit_test(test_parse_oom),
        cmocka_unit_test(test_json_str_utf8),
        cmocka_unit_test(test_resp_full),
        cmocka_unit_test(test_sse_chunks),
        cmocka_unit_test(test_errors_models_ids),
        cmocka_unit_test(test_prom),
        cmocka_unit_test(test_kvtp),
        cmocka_unit_test(test_tools_accepted),
        cmocka_unit_test(test_request_limits),
        cmocka_unit_test(test_structured_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
