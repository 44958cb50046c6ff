/* Integration test: structured outputs through `duplex serve` with a
 * random-weight model (docs/api.md, "Structured outputs").
 *
 *  - conformance and forced tool calls with the official openai client,
 *    every answer validated by ajv (tests/integration/node/structured.mjs);
 *  - a 400 naming the field for every bad input: response_format shapes, an
 *    unsupported keyword under strict, a hostile schema, a grammar syntax
 *    error (line and column), grammar with response_format, a forced call
 *    without tools; strict false answers with an X-Duplex-Warning header;
 *  - a grammar field (chat and completions), stop strings still cutting a
 *    constrained answer, max_tokens cutting a structure → "length";
 *  - the grammar cache and mask figures in /metrics. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test_client.h"
#include "../test_proc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "model/synth.h"

static struct {
    const char *bin;
    char dir[64], model[128], name[128];
    tp_proc node;
    int port; /* where the requests go: the node, or a router in front of it */
} G;

#define PORT G.port

/* POST path body: the status, the body in *out, and the value of
 * X-Duplex-Warning (or "") in warn. */
static size_t on_header(char *p, size_t sz, size_t n, void *user)
{
    static const char k[] = "x-duplex-warning:";
    size_t len = sz * n;
    if (len > sizeof k - 1 && !strncasecmp(p, k, sizeof k - 1)) {
        char *w = user;
        size_t v = len - (sizeof k - 1);
        if (v > 1023) v = 1023;
        memcpy(w, p + sizeof k - 1, v);
        w[v] = 0;
    }
    return len;
}

static long post_w(const char *path, const char *body, dx_buf *out, char warn[1024])
{
    struct curl_slist *h;
    dx_buf_reset(out);
    warn[0] = 0;
    CURL *c = tc_curl(PORT, "POST", path, body, out, &h, 120);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, warn);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    if (rc != CURLE_OK) fail_msg("POST %s: %s", path, curl_easy_strerror(rc));
    tc_terminate(out);
    return status;
}

/* A chat body: the user message, then `extra` members (raw JSON). */
static char *chat(const char *extra)
{
    char *b = NULL;
    if (asprintf(
            &b,
            "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Give JSON.\"}]%s%s}",
            G.name, extra[0] ? "," : "", extra) < 0)
        fail();
    return b;
}

static json_t *choice0(json_t *v)
{
    return json_array_get(json_object_get(v, "choices"), 0);
}

static void test_openai_ajv(void **state)
{
    (void)state;
    if (access("tests/integration/node/node_modules/ajv", F_OK) != 0 ||
        access("tests/integration/node/node_modules/openai", F_OK) != 0)
        fail_msg("ajv / openai npm packages not installed (scripts/test.sh runs npm ci)");
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "node tests/integration/node/structured.mjs http://127.0.0.1:%d/v1 12 2>&1", PORT);
    dx_buf out;
    dx_buf_init(&out, 0);
    if (tc_run_cmd(cmd, &out) != 0)
        fail_msg("structured.mjs failed:\n%s", out.data ? out.data : "");
    dx_buf_free(&out);
}

#define RF_SCHEMA(strict, schema)                                                                  \
    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\","               \
    "\"strict\":" strict ",\"schema\":" schema "}}"

/* Every bad input is a 400 whose param names the field and whose message
 * says what was wrong. */
static void test_bad_inputs(void **state)
{
    (void)state;
    static const struct {
        const char *extra, *param, *msg_has;
    } cases[] = {
        {"\"response_format\":\"json\"", "response_format", "expected"},
        {"\"response_format\":{\"type\":\"xml\"}", "response_format.type", "'xml'"},
        {"\"response_format\":{\"type\":\"json_schema\"}", "response_format.json_schema",
         "required"},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}",
         "response_format.json_schema.name", "required"},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\",\"schema\":"
         "7}}",
         "response_format.json_schema.schema", "JSON Schema object"},
        {RF_SCHEMA("true", "{\"type\":\"array\",\"uniqueItems\":true}"),
         "response_format.json_schema.schema", "uniqueItems"},
        {RF_SCHEMA("true", "{\"type\":\"widget\"}"), "response_format.json_schema.schema",
         "widget"},
        /* a recursion without a base case derives nothing: refused, not looped on */
        {RF_SCHEMA(
             "true",
             "{\"$defs\":{\"a\":{\"type\":\"object\",\"required\":[\"n\"],"
             "\"additionalProperties\":false,\"properties\":{\"n\":{\"$ref\":\"#/$defs/a\"}}}},"
             "\"$ref\":\"#/$defs/a\"}"),
         "response_format.json_schema.schema", ""},
        {RF_SCHEMA("true", "{\"$ref\":\"#/$defs/nowhere\"}"), "response_format.json_schema.schema",
         "nowhere"},
        {"\"grammar\":\"root ::= \\\"a\\\" (\"", "grammar", "line 1"},
        {"\"grammar\":\"root ::= \\\"a\\\"\\nx ::= [\"", "grammar", "line 2"},
        {"\"grammar\":\"start ::= \\\"a\\\"\"", "grammar", "root"},
        {"\"grammar\":\"root ::= \\\"a\\\"\",\"response_format\":{\"type\":\"json_object\"}",
         "grammar", "cannot be combined"},
        {"\"tool_choice\":\"required\"", "tool_choice", "no tools"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":"
         "\"required\","
         "\"response_format\":{\"type\":\"json_object\"}",
         "tool_choice", "cannot be combined"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
         "\"object\",\"not\":{}}}}],\"tool_choice\":\"required\"",
         "tools[0].function.parameters", "not"},
    };
    dx_buf out;
    dx_buf_init(&out, 0);
    char warn[1024];
    for (size_t i = 0; i < DX_ARRAY_LEN(cases); i++) {
        char *body = chat(cases[i].extra);
        long st = post_w("/v1/chat/completions", body, &out, warn);
        json_t *v = tc_json(&out), *e = json_object_get(v, "error");
        const char *param = json_string_value(json_object_get(e, "param"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        if (st != 400 || !param || strcmp(param, cases[i].param) || !msg ||
            !strstr(msg, cases[i].msg_has))
            fail_msg("case %zu (%s): %ld %s", i, body, st, out.data);
        json_decref(v);
        free(body);
    }
    /* completions take response_format and grammar too */
    char body[512];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"a\",\"grammar\":\"root ::= (\"}",
             G.name);
    assert_int_equal(post_w("/v1/completions", body, &out, warn), 400);
    assert_non_null(strstr(out.data, "\"param\":\"grammar\""));
    dx_buf_free(&out);
}

/* strict false: the unsupported keyword is ignored, and named in a header. */
static void non_strict_warning(void)
{
    dx_buf out;
    dx_buf_init(&out, 0);
    char warn[1024];
    char *body = chat("\"max_tokens\":60,\"temperature\":0," RF_SCHEMA(
        "false", "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"a\"],"
                 "\"properties\":{\"a\":{\"type\":\"array\",\"uniqueItems\":true,\"maxItems\":2,"
                 "\"items\":{\"type\":\"boolean\"}}}}"));
    assert_int_equal(post_w("/v1/chat/completions", body, &out, warn), 200);
    if (!strstr(warn, "uniqueItems") || !strstr(warn, "response_format.json_schema.schema"))
        fail_msg("warning header: '%s'", warn);
    json_t *v = tc_json(&out);
    const char *text =
        json_string_value(json_object_get(json_object_get(choice0(v), "message"), "content"));
    json_error_t je;
    json_t *ans = json_loads(text, 0, &je);
    if (!json_is_array(json_object_get(ans, "a"))) fail_msg("not the schema's shape: %s", text);
    json_decref(ans);
    json_decref(v);
    free(body);
    /* streamed: the header comes with the stream's head */
    body = chat("\"stream\":true,\"max_tokens\":60,\"temperature\":0," RF_SCHEMA(
        "false", "{\"type\":\"boolean\",\"uniqueItems\":true}"));
    assert_int_equal(post_w("/v1/chat/completions", body, &out, warn), 200);
    assert_non_null(strstr(warn, "uniqueItems"));
    free(body);
    dx_buf_free(&out);
}

/* The node's warning reaches the client directly and through a router. */
static void test_non_strict_warning(void **state)
{
    (void)state;
    non_strict_warning();
    char url[64], log[160];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", G.node.http);
    snprintf(log, sizeof log, "%s/router.log", G.dir);
    const char *argv[] = {"router", "--decode", url, "--port", "0", "--health-interval-ms",
                          "100",    NULL};
    tp_proc R;
    tp_start(&R, G.bin, log, argv, "duplex router:");
    dx_buf h;
    dx_buf_init(&h, 0);
    for (int i = 0; i < 600 && tc_http(R.http, "GET", "/health", NULL, &h, 5) != 200; i++)
        tp_sleep_ms(50);
    dx_buf_free(&h);
    G.port = R.http;
    non_strict_warning();
    G.port = G.node.http;
    assert_int_equal(tp_stop_clean(&R), 0);
}

/* A grammar: the answer is a sentence of it (chat and completions, greedy
 * and sampled); a stop string still cuts it; max_tokens cuts a structure
 * with finish_reason "length". */
static void test_grammar_stop_length(void **state)
{
    (void)state;
    dx_buf out;
    dx_buf_init(&out, 0);
    char warn[1024], body[1024];
    for (int seed = 0; seed < 6; seed++) {
        snprintf(
            body, sizeof body,
            "{\"model\":\"%s\",\"prompt\":\"Answer:\",\"temperature\":1,\"seed\":%d,"
            "\"max_tokens\":40,\"grammar\":\"root ::= (\\\"yes\\\" | \\\"no\\\") \\\"!\\\"{1,3}\"}",
            G.name, seed);
        assert_int_equal(post_w("/v1/completions", body, &out, warn), 200);
        json_t *v = tc_json(&out);
        const char *t = json_string_value(json_object_get(choice0(v), "text"));
        size_t bang = t ? strspn(t + (t[0] == 'y' ? 3 : 2), "!") : 0;
        if (!t || (strncmp(t, "yes", 3) && strncmp(t, "no", 2)) || bang < 1 || bang > 3 ||
            strlen(t) != (t[0] == 'y' ? 3u : 2u) + bang ||
            strcmp(json_string_value(json_object_get(choice0(v), "finish_reason")), "stop"))
            fail_msg("seed %d: %s", seed, out.data);
        json_decref(v);
    }
    /* the stop string "s" ends "yes" at "ye" */
    char *b = chat("\"max_tokens\":20,\"temperature\":0,\"stop\":[\"s\"],"
                   "\"grammar\":\"root ::= \\\"yes, \\\" [a-z]{2,4}\"");
    assert_int_equal(post_w("/v1/chat/completions", b, &out, warn), 200);
    json_t *v = tc_json(&out);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(choice0(v), "message"), "content")),
        "ye");
    assert_string_equal(json_string_value(json_object_get(choice0(v), "finish_reason")), "stop");
    json_decref(v);
    free(b);
    /* 3 tokens cannot hold the object: "length", and a prefix of it */
    b = chat("\"max_tokens\":3,\"temperature\":1,\"seed\":3," RF_SCHEMA(
        "true",
        "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"long_key_name\"],"
        "\"properties\":{\"long_key_name\":{\"enum\":[\"a long enough value\"]}}}"));
    assert_int_equal(post_w("/v1/chat/completions", b, &out, warn), 200);
    v = tc_json(&out);
    const char *t =
        json_string_value(json_object_get(json_object_get(choice0(v), "message"), "content"));
    assert_string_equal(json_string_value(json_object_get(choice0(v), "finish_reason")), "length");
    const char *whole = "{\"long_key_name\":";
    if (!t || strncmp(t, whole, strlen(t) < strlen(whole) ? strlen(t) : strlen(whole)) || !t[0])
        fail_msg("not a prefix of the structure: %s", out.data);
    json_decref(v);
    free(b);
    /* a forced call cut short: no call, "length" */
    b = chat(
        "\"max_tokens\":4,\"temperature\":0,\"tool_choice\":\"required\",\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"lookup\",\"parameters\":{\"type\":\"object\"}}}]");
    assert_int_equal(post_w("/v1/chat/completions", b, &out, warn), 200);
    v = tc_json(&out);
    assert_string_equal(json_string_value(json_object_get(choice0(v), "finish_reason")), "length");
    assert_null(json_object_get(json_object_get(choice0(v), "message"), "tool_calls"));
    json_decref(v);
    free(b);
    dx_buf_free(&out);
}

/* Agents resend the same schema: compiled once, then found in the cache;
 * masks were computed and timed. */
static void test_cache_metrics(void **state)
{
    (void)state;
    dx_buf out;
    dx_buf_init(&out, 0);
    char warn[1024];
    char *b = chat("\"max_tokens\":30,\"temperature\":0," RF_SCHEMA(
        "true", "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"cached\"],"
                "\"properties\":{\"cached\":{\"type\":\"boolean\"}}}"));
    long hits0 = tc_metric(PORT, "duplex_grammar_cache_hits_total");
    long miss0 = tc_metric(PORT, "duplex_grammar_cache_misses_total");
    for (int i = 0; i < 3; i++) {
        assert_int_equal(post_w("/v1/chat/completions", b, &out, warn), 200);
        assert_non_null(strstr(out.data, "{\\\"cached\\\":"));
    }
    assert_int_equal(tc_metric(PORT, "duplex_grammar_cache_misses_total"), miss0 + 1);
    assert_int_equal(tc_metric(PORT, "duplex_grammar_cache_hits_total"), hits0 + 2);
    assert_true(tc_metric(PORT, "duplex_grammar_masks_total") > 0);
    free(b);
    dx_buf_free(&out);
}

static int setup(void **state)
{
    (void)state;
    G.bin = getenv("DUPLEX_BIN");
    if (!G.bin) G.bin = "build/release/duplex";
    snprintf(G.dir, sizeof G.dir, "/tmp/dx_itest_struct_XXXXXX");
    if (!mkdtemp(G.dir)) return -1;
    snprintf(G.model, sizeof G.model, "%s/tiny.gguf", G.dir);
    synth_config c = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 11};
    if (synth_write(&c, G.model)) return -1;
    snprintf(G.name, sizeof G.name, "duplex-synth-qwen3-tiny-f32");
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const char *argv[] = {"serve", "--model",       G.model, "--port", "0",    "--threads",
                          "2",     "--kv-cache-mb", "32",    "--ctx",  "2048", NULL};
    char log[160];
    snprintf(log, sizeof log, "%s/serve.log", G.dir);
    tp_start(&G.node, G.bin, log, argv, "duplex serve:");
    G.port = G.node.http;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = tp_stop_clean(&G.node);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", G.dir);
    if (!getenv("DX_KEEP_LOGS") && system(cmd)) rc = -1;
    curl_global_cleanup();
    return rc;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_inputs),          cmocka_unit_test(test_non_strict_warning),
        cmocka_unit_test(test_grammar_stop_length), cmocka_unit_test(test_cache_metrics),
        cmocka_unit_test(test_openai_ajv),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
