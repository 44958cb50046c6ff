/* Unit tests for node_gram: the EBNF a request's constraint compiles from
 * (forced tool calls in the qwen and llama3 formats, named choices, odd tool
 * names, an open <think>, json_object, strict and non-strict schemas, a
 * node without a tool format), checked by matching real token sequences of
 * the test model's tokenizer; and the grammar cache (hits, LRU eviction, an
 * evicted grammar living on while a request holds it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "engine_test_util.h"
#include "gram/gram.h"
#include "tok/tok.h"
#include "node/node_gram.h"
#include "oai/oai_req.h"
#include "oai/oai_tools.h"

static model *g_m;
static gram_vocab *g_v;

static int setup(void **state)
{
    (void)state;
    if (etu_setup() || !(g_m = etu_model(MODEL_QWEN3, DX_F32))) return -1;
    return gram_vocab_create(model_tokenizer(g_m), &g_v);
}

static int teardown(void **state)
{
    (void)state;
    gram_vocab_destroy(g_v);
    model_free(g_m);
    etu_teardown();
    return 0;
}

#define TOOLS                                                                                      \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"     \
    "\"object\",\"additionalProperties\":false,\"required\":[\"a\"],\"properties\":{\"a\":{"       \
    "\"type\":\"integer\"}}}}},{\"type\":\"function\",\"function\":{\"name\":"                     \
    "\"we\\\"ird\\\\\\u00e9\"}}]"

/* The EBNF for a chat body's constraint (fmt, think_open), or NULL with *err. */
static char *source(const char *extra, int fmt, int think_open, dx_buf *warn, oai_err *err)
{
    char body[2048];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],%s}", extra);
    oai_req r;
    oai_err e;
    if (oai_req_parse(OAI_CHAT, body, strlen(body), NULL, &r, &e)) fail_msg("%s", e.message);
    dx_buf src;
    dx_buf_init(&src, 0);
    int rc = node_gram_source(&r, fmt, think_open, &src, warn, err);
    oai_req_free(&r);
    if (rc) {
        dx_buf_free(&src);
        return NULL;
    }
    return dx_buf_take(&src);
}

/* 2: the grammar takes the text's tokens and nothing may follow; 1: it
 * takes them and is complete; 0: it takes them; -1: it refuses one. */
static int accepts(const char *src, const char *text)
{
    gram *g;
    if (gram_compile_ebnf(src, strlen(src), &g)) fail_msg("%s\n%s", dx_errmsg(), src);
    tok_ids ids;
    tok_ids_init(&ids);
    assert_int_equal(tok_encode(model_tokenizer(g_m), text, strlen(text), 0, &ids), 0);
    gram_match *m;
    assert_int_equal(gram_match_create(g, g_v, &m), 0);
    int r = 0;
    for (size_t i = 0; i < ids.n && r == 0; i++)
        if (gram_match_accept(m, ids.ids[i])) r = -1;
    if (r == 0) r = gram_match_done(m) ? 2 : gram_match_complete(m);
    gram_match_destroy(m);
    tok_ids_free(&ids);
    gram_destroy(g);
    return r;
}

static void test_forced_tool_calls(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_err e;
    /* parallel_tool_calls false: exactly one call, then nothing */
    char *q = source(TOOLS ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false",
                     OAI_TOOLS_QWEN, 0, NULL, &e);
    assert_non_null(q);
    assert_int_equal(
        accepts(q, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 12}}\n</tool_call>"), 2);
    assert_int_equal(accepts(q, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
                                "</tool_call>\n<tool_call>"),
                     -1);
    dx_free(q);
    /* parallel (the default): one call is complete, more may follow, each
     * as the family writes several */
    q = source(TOOLS ",\"tool_choice\":\"required\"", OAI_TOOLS_QWEN, 0, NULL, &e);
    assert_int_equal(
        accepts(q, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 12}}\n</tool_call>"), 1);
    assert_int_equal(accepts(q, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
                                "</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
                                "{\"a\": 2}}\n</tool_call>"),
                     1);
    assert_int_equal(accepts(q, "<tool_call>\n{\"name\": \"we\\\"ird\\\\\xc3\xa9\", \"arguments\": "
                                "{}}\n</tool_call>"),
                     1);
    assert_int_equal(accepts(q, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"b\": 1}}"), -1);
    assert_int_equal(accepts(q, "<tool_call>\n{\"name\": \"g\""), -1);
    assert_int_equal(accepts(q, "{\"name\": \"f\""), -1);
    dx_free(q);
    /* named: that tool only */
    q = source(TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}",
               OAI_TOOLS_QWEN, 0, NULL, &e);
    assert_int_equal(
        accepts(q, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": -3}}\n</tool_call>"), 1);
    assert_int_equal(accepts(q, "<tool_call>\n{\"name\": \"we"), -1);
    dx_free(q);
    /* llama3's JSON call */
    q = source(TOOLS ",\"tool_choice\":\"required\"", OAI_TOOLS_LLAMA3, 0, NULL, &e);
    assert_int_equal(accepts(q, "{\"name\": \"f\", \"parameters\": {\"a\": 7}}"), 1);
    assert_int_equal(accepts(q, "{\"name\": \"f\", \"parameters\": {\"a\": 7}}; {\"name\": "
                                "\"f\", \"parameters\": {\"a\": 8}}"),
                     1);
    assert_int_equal(accepts(q, "{\"name\": \"f\", \"arguments\""), -1);
    dx_free(q);
    /* the parser agrees: what the grammar allows is a call */
    oai_tools_opts o = {.tools = OAI_TOOLS_QWEN};
    oai_tools_result r;
    const char *call =
        "<tool_call>\n{\"name\": \"we\\\"ird\\\\\xc3\xa9\", \"arguments\": {}}\n</tool_call>";
    assert_int_equal(oai_tools_parse(&o, call, strlen(call), &r), 0);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.calls[0].name, "we\"ird\\\xc3\xa9");
    oai_tools_result_free(&r);
    /* and it keeps only the first with parallel_tool_calls false */
    const char *two = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 2}}\n</tool_call>";
    assert_int_equal(oai_tools_parse(&o, two, strlen(two), &r), 0);
    assert_int_equal(r.n_calls, 2);
    oai_tools_result_free(&r);
    o.max_calls = 1;
    assert_int_equal(oai_tools_parse(&o, two, strlen(two), &r), 0);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.calls[0].arguments, "{\"a\":1}");
    assert_null(r.content); /* the dropped call is not content either */
    oai_tools_result_free(&r);
    /* a node without a tool-call format cannot force one */
    assert_null(source(TOOLS ",\"tool_choice\":\"required\"", OAI_TOOLS_NONE, 0, NULL, &e));
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "tool_choice");
    assert_non_null(strstr(e.message, "no tool-call format"));
    /* tool_choice auto, none: unconstrained */
    q = source(TOOLS ",\"tool_choice\":\"auto\"", OAI_TOOLS_QWEN, 0, NULL, &e);
    assert_string_equal(q, "");
    dx_free(q);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_formats_and_strictness(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_err e;
    dx_buf w;
    dx_buf_init(&w, 0);
    /* an open <think> is closed first, so the parsers see content */
    char *q = source("\"response_format\":{\"type\":\"json_object\"}", OAI_TOOLS_QWEN, 1, NULL, &e);
    assert_int_equal(accepts(q, "</think>\n\n{\"k\": [1, true]}"), 2);
    assert_int_equal(accepts(q, "{"), -1);
    dx_free(q);
    assert_null(source("\"grammar\":\"root ::= \\\"a\\\"\"", OAI_TOOLS_QWEN, 1, NULL, &e));
    assert_string_equal(e.param, "grammar");
    /* a grammar is the user's own text */
    q = source("\"grammar\":\"root ::= \\\"a\\\"\"", OAI_TOOLS_QWEN, 0, NULL, &e);
    assert_string_equal(q, "root ::= \"a\"");
    dx_free(q);
    /* strict: an unsupported keyword is a 400 naming the field and it */
    const char *s =
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",%s"
        "\"schema\":{\"type\":\"array\",\"uniqueItems\":true,\"maxItems\":1,\"items\":{\"const\":1}"
        "}}}";
    char extra[512];
    snprintf(extra, sizeof extra, s, "");
    assert_null(source(extra, OAI_TOOLS_QWEN, 0, &w, &e));
    assert_string_equal(e.param, "response_format.json_schema.schema");
    assert_non_null(strstr(e.message, "uniqueItems"));
    /* not strict: ignored, and said */
    snprintf(extra, sizeof extra, s, "\"strict\":false,");
    q = source(extra, OAI_TOOLS_QWEN, 0, &w, &e);
    assert_int_equal(accepts(q, "[1]"), 2);
    if (!strstr(w.data, "response_format.json_schema.schema: ") || !strstr(w.data, "uniqueItems"))
        fail_msg("warnings: %s", w.data);
    dx_free(q);
    /* a tool's own strict */
    dx_buf_reset(&w);
    q = source("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":false,"
               "\"parameters\":{\"type\":\"object\",\"not\":{}}}}],\"tool_choice\":\"required\"",
               OAI_TOOLS_QWEN, 0, &w, &e);
    assert_non_null(q);
    assert_non_null(strstr(w.data, "tools[0].function.parameters: "));
    dx_free(q);
    dx_buf_free(&w);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_cache(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    node_gram_cache *c;
    assert_int_equal(node_gram_cache_create(2, &c), 0);
    node_gram *a, *a2, *b, *d;
    oai_err e;
    const char *sa = "root ::= \"a\"", *sb = "root ::= \"b\"", *sd = "root ::= \"d\"";
    assert_int_equal(node_gram_get(c, sa, strlen(sa), "grammar", &a, &e), 0);
    assert_int_equal(node_gram_get(c, sa, strlen(sa), "grammar", &a2, &e), 0);
    assert_ptr_equal(a, a2);
    assert_int_equal(node_gram_get(c, sb, strlen(sb), "grammar", &b, &e), 0);
    assert_int_equal(node_gram_get(c, sd, strlen(sd), "grammar", &d, &e), 0); /* evicts a */
    node_gram_stats st;
    node_gram_get_stats(c, &st);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 3);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.entries, 2);
    /* evicted but held: still usable until its last release */
    gram_match *m;
    assert_int_equal(gram_match_create(node_gram_grammar(a), g_v, &m), 0);
    gram_match_destroy(m);
    assert_string_equal(node_gram_warnings(d), ""); /* a grammar of its own: no warnings */
    node_gram_release(c, a);
    node_gram_release(c, a2);
    node_gram_release(c, b);
    node_gram_release(c, d);
    node_gram_release(c, NULL);
    /* a request's constraint is keyed by what it depends on: the same
     * schema again is a hit, with its warnings; another choice is not */
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
        "\"strict\":false,\"schema\":{\"type\":\"array\",\"uniqueItems\":true}}}}";
    oai_req r;
    assert_int_equal(oai_req_parse(OAI_CHAT, body, strlen(body), NULL, &r, &e), 0);
    node_gram *r1, *r2, *r3;
    assert_int_equal(node_gram_request(c, &r, OAI_TOOLS_QWEN, 0, &r1, &e), 0);
    assert_int_equal(node_gram_request(c, &r, OAI_TOOLS_QWEN, 0, &r2, &e), 0);
    assert_int_equal(node_gram_request(c, &r, OAI_TOOLS_QWEN, 1, &r3, &e), 0); /* think_open */
    assert_ptr_equal(r1, r2);
    assert_ptr_not_equal(r1, r3);
    assert_non_null(strstr(node_gram_warnings(r2), "uniqueItems"));
    node_gram_get_stats(c, &st);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.misses, 5);
    node_gram_release(c, r1);
    node_gram_release(c, r2);
    node_gram_release(c, r3);
    oai_req_free(&r);
    /* a syntax error names the field and where */
    assert_int_equal(node_gram_get(c, "root ::= (", 10, "grammar", &a, &e), DX_EINVAL);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "grammar");
    if (strncmp(e.message, "grammar: line 1", 15)) fail_msg("%s", e.message);
    node_gram_cache_destroy(c);
    node_gram_cache_destroy(NULL);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

int main(void)
{
    oai_json_use_dx_alloc();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forced_tool_calls),
        cmocka_unit_test(test_formats_and_strictness),
        cmocka_unit_test(test_cache),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
