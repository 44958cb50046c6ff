/* test_oai_tools: tool calls and reasoning parsed out of model answers.
 * Realistic Qwen3 and Llama 3 answers (reasoning, several calls, content
 * around them, arguments whose strings hold `</tool_call>`, braces, escapes
 * and non-ASCII) give the exact content, reasoning and compact arguments;
 * every malformed variant comes back as content byte for byte, and so does
 * every truncation of a call.  The streaming parser, fed each text split at
 * every byte, byte by byte and in random pieces, releases events that add up
 * to the one-shot result, holds back no more than a possible tag, and sends
 * whole UTF-8 characters.  Also: ids, finish reason, the JSON written for
 * messages and deltas, the prompt check for an open <think>, limits, out of
 * memory, and the JSON scanner underneath. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"
#include "base/dx_utf8.h"
#include "oai/oai_jscan.h"
#include "oai/oai_tools.h"

#define QWEN                                                                                       \
    {                                                                                              \
        .tools = OAI_TOOLS_QWEN, .id_seed = 7                                                      \
    }
#define QWEN_R                                                                                     \
    {                                                                                              \
        .tools = OAI_TOOLS_QWEN, .reasoning = 1, .id_seed = 7                                      \
    }
#define QWEN_RO                                                                                    \
    {                                                                                              \
        .tools = OAI_TOOLS_QWEN, .reasoning = 1, .think_open = 1, .id_seed = 7                     \
    }
#define LLAMA                                                                                      \
    {                                                                                              \
        .tools = OAI_TOOLS_LLAMA3, .id_seed = 7                                                    \
    }

typedef struct {
    const char *name;
    oai_tools_opts o;
    const char *text;
    const char *content, *reasoning; /* NULL: none */
    size_t n_calls;
    const char *calls[3][2]; /* name, arguments */
} tcase;

static const tcase k_cases[] = {
    {"qwen3 reasoning then two calls",
     QWEN_R,
     "<think>\nThe user wants the weather in Paris and in Tokyo. I should call get_weather once "
     "per city — two calls.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
     "{\"location\": \"Paris, France\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n"
     "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"東京\", \"unit\": \"celsius\"}}\n"
     "</tool_call>",
     NULL,
     "The user wants the weather in Paris and in Tokyo. I should call get_weather once per city "
     "— two calls.",
     2,
     {{"get_weather", "{\"location\":\"Paris, France\",\"unit\":\"celsius\"}"},
      {"get_weather", "{\"location\":\"東京\",\"unit\":\"celsius\"}"}}},
    {"content, then a call whose strings hold </tool_call>, braces and escapes",
     QWEN_R,
     "I'll save the notes now.\n\n<tool_call>\n{\"name\": \"write_file\", \"arguments\": "
     "{\"path\": \"notes/tags.md\", \"content\": \"Close a call with </tool_call>.\\n"
     "{\\\"nested\\\": [1, {\\\"k\\\": \\\"}\\\"}]}\\n\", \"options\": {\"append\": false, "
     "\"mode\": [420, 4.2e1, -0.5, null]}, \"title\": \"caf\\u00e9 \\ud83d\\ude00 ☕\"}}\n"
     "</tool_call>",
     "I'll save the notes now.",
     NULL,
     1,
     {{"write_file",
       "{\"path\":\"notes/tags.md\",\"content\":\"Close a call with </tool_call>.\\n"
       "{\\\"nested\\\": [1, {\\\"k\\\": \\\"}\\\"}]}\\n\",\"options\":{\"append\":false,"
       "\"mode\":[420,4.2e1,-0.5,null]},\"title\":\"caf\\u00e9 \\ud83d\\ude00 ☕\"}"}}},
    {"qwen3-thinking: the prompt opened <think>",
     QWEN_RO,
     "Okay, the user asks for the capital of France. That is Paris.\n</think>\n\nThe capital of "
     "France is **Paris**.",
     "The capital of France is **Paris**.",
     "Okay, the user asks for the capital of France. That is Paris.",
     0,
     {{NULL}}},
    {"prompt opened <think> and the model writes it again",
     QWEN_RO,
     "<think>\nShort.\n</think>\n\nHi!",
     "Hi!",
     "Short.",
     0,
     {{NULL}}},
    {"reasoning cut off by max_tokens",
     QWEN_R,
     "<think>\nI need to compare the two options carefully. First",
     NULL,
     "I need to compare the two options carefully. First",
     0,
     {{NULL}}},
    {"empty reasoning block", QWEN_R, "<think>\n\n</think>\n\nHello", "Hello", NULL, 0, {{NULL}}},
    {"tags that are not tags",
     QWEN_R,
     "Use a <b>bold</b> tag; 3 < 4, and write <tool_call> only inside code: `<think>`. See "
     "</think>.",
     "Use a <b>bold</b> tag; 3 < 4, and write <tool_call> only inside code: `<think>`. See "
     "</think>.",
     NULL,
     0,
     {{NULL}}},
    {"</think> without <think> and the prompt did not open one",
     QWEN_R,
     "Thinking done.</think>Answer",
     "Thinking done.</think>Answer",
     NULL,
     0,
     {{NULL}}},
    {"content between and after calls",
     QWEN,
     "Checking both.\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"dir\": \"/tmp\"}}\n"
     "</tool_call>\nThen:\n<tool_call>\n{\"name\": \"cat\", \"arguments\": {\"file\": "
     "\"/tmp/a b.txt\"}}\n</tool_call>\n",
     "Checking both.\n\nThen:",
     NULL,
     2,
     {{"ls", "{\"dir\":\"/tmp\"}"}, {"cat", "{\"file\":\"/tmp/a b.txt\"}"}}},
    {"arguments written as a string",
     QWEN,
     "<tool_call>\n{\"name\": \"run\", \"arguments\": \"{\\\"cmd\\\": \\\"make -j2\\\"}\"}\n"
     "</tool_call>",
     NULL,
     NULL,
     1,
     {{"run", "{\"cmd\":\"make -j2\"}"}}},
    {"no arguments, null arguments, extra keys",
     QWEN,
     "<tool_call>{\"name\": \"get_time\"}</tool_call><tool_call>{\"type\": \"function\", "
     "\"name\": \"now\", \"arguments\": null}</tool_call>",
     NULL,
     NULL,
     2,
     {{"get_time", "{}"}, {"now", "{}"}}},
    {"a malformed call, then a good one",
     QWEN,
     "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"a\": 1,}}\n</tool_call>\n<tool_call>\n"
     "{\"name\": \"y\", \"arguments\": {\"b\": [true]}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"a\": 1,}}\n</tool_call>",
     NULL,
     1,
     {{"y", "{\"b\":[true]}"}}},
    {"an unterminated string swallows no later call",
     QWEN,
     "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"s\": \"oops}}</tool_call>\n<tool_call>"
     "{\"name\": \"y\"}</tool_call>",
     "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"s\": \"oops}}</tool_call>",
     NULL,
     1,
     {{"y", "{}"}}},
    {"llama3 with <|python_tag|>",
     LLAMA,
     "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"location\": \"San Francisco, "
     "CA\", \"unit\": \"fahrenheit\"}}",
     NULL,
     NULL,
     1,
     {{"get_weather", "{\"location\":\"San Francisco, CA\",\"unit\":\"fahrenheit\"}"}}},
    {"llama3 calls separated by ;",
     LLAMA,
     "{\"name\": \"search\", \"parameters\": {\"query\": \"duplex kv\"}}; {\"name\": \"fetch\", "
     "\"arguments\": {\"url\": \"https://example.com/?q={x}\"}}",
     NULL,
     NULL,
     2,
     {{"search", "{\"query\":\"duplex kv\"}"},
      {"fetch", "{\"url\":\"https://example.com/?q={x}\"}"}}},
    {"llama3 text that mentions JSON",
     LLAMA,
     "The weather in Paris is sunny; {\"name\": \"x\"} is JSON.",
     "The weather in Paris is sunny; {\"name\": \"x\"} is JSON.",
     NULL,
     0,
     {{NULL}}},
    {"llama3 JSON that is not a call",
     LLAMA,
     "{\"answer\": 42}",
     "{\"answer\": 42}",
     NULL,
     0,
     {{NULL}}},
    {"llama3 call, then text",
     LLAMA,
     "\n\n{\"name\": \"f\", \"parameters\": {}}\nDone.",
     "Done.",
     NULL,
     1,
     {{"f", "{}"}}},
    {"llama3 second call cut off",
     LLAMA,
     "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {",
     "; {\"name\": \"g\", \"parameters\": {",
     NULL,
     1,
     {{"f", "{}"}}},
    {"llama3 built-in tool call (python, not JSON)",
     LLAMA,
     "<|python_tag|>brave_search.call(query=\"duplex\")",
     "<|python_tag|>brave_search.call(query=\"duplex\")",
     NULL,
     0,
     {{NULL}}},
    {"no parsers: every byte is content",
     {.id_seed = 7},
     "<think>x</think>y<tool_call>{\"name\": \"a\"}</tool_call>",
     "<think>x</think>y<tool_call>{\"name\": \"a\"}</tool_call>",
     NULL,
     0,
     {{NULL}}},
    {"reasoning only",
     {.reasoning = 1},
     "<think>\nHmm.\n</think>\n\n<tool_call>\n{\"name\": \"a\"}\n</tool_call>",
     "<tool_call>\n{\"name\": \"a\"}\n</tool_call>",
     "Hmm.",
     0,
     {{NULL}}},
    {"empty answer", QWEN_R, "", NULL, NULL, 0, {{NULL}}},
};

/* Each is content, byte for byte, with the Qwen parser. */
static const char *const k_malformed[] = {
    "Sure.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"duplex\"}}",
    "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"duplex\"",
    "<tool_call>\n{'name': 'search'}\n</tool_call>",
    "<tool_call>\n{\"arguments\": {\"q\": 1}}\n</tool_call>",
    "<tool_call>\n{\"name\": 7, \"arguments\": {}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\", \"name\": \"b\", \"arguments\": {}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\", \"arguments\": {}, \"arguments\": {}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\", \"arguments\": {}, \"parameters\": {}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\", \"arguments\": [1, 2]}\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\", \"arguments\": \"Paris\"}\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\", \"arguments\": 3}\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\", \"arguments\": {}} extra\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\"}\n{\"name\": \"b\"}\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"s\": \"line\nbreak\"}}\n</tool_call>",
    "<tool_call>{\"name\": \"a\\x\"}</tool_call>",
    "<tool_call>{\"name\": \"\\ud800\"}</tool_call>",
    "<tool_call>{\"name\": \"a\\u0000b\"}</tool_call>",
    "<tool_call>{\"name\": \"a\", \"arguments\": {\"s\": \"\xff\"}}</tool_call>",
    "<tool_call>{\"name\": \"a\", \"arguments\": {\"n\": 01}}</tool_call>",
    "<tool_call>{\"name\": \"a\", \"arguments\": {\"n\": 1.}}</tool_call>",
    "<tool_call>{\"name\": \"a\", \"arguments\": {\"b\": tru}}</tool_call>",
    "<tool_call>\n[{\"name\": \"a\"}]\n</tool_call>",
    "<tool_call>{\"name\": \"a\"}</tool_cal>",
    "<tool_call>{\"name\": \"a\"}</toolcall>",
    "<tool_call>{\"name\": \"a\"}<tool_call>",
    "<tool_call>",
    "text <tool_call",
    "text <tool_",
    "trailing space \n\t ",
};

/* ---- helpers ------------------------------------------------------------- */

static const char *g_ctx = ""; /* the text under test, named in failure messages */

static void parse(const oai_tools_opts *o, const char *text, size_t len, oai_tools_result *r)
{
    assert_int_equal(oai_tools_parse(o, text, len, r), 0);
}

static void assert_text(const char *got, size_t got_len, const char *want, const char *what)
{
    if (!want) {
        if (got) fail_msg("%s: %s: expected none, got \"%.*s\"", g_ctx, what, (int)got_len, got);
        return;
    }
    if (!got || got_len != strlen(want) || memcmp(got, want, got_len))
        fail_msg("%s: %s: expected \"%s\", got \"%.*s\"", g_ctx, what, want, (int)got_len,
                 got ? got : "(none)");
}

static void check_case(const tcase *c, const oai_tools_result *r)
{
    g_ctx = c->name;
    assert_text(r->content, r->content_len, c->content, "content");
    assert_text(r->reasoning, r->reasoning_len, c->reasoning, "reasoning");
    assert_int_equal(r->n_calls, c->n_calls);
    for (size_t i = 0; i < r->n_calls; i++) {
        assert_string_equal(r->calls[i].name, c->calls[i][0]);
        assert_text(r->calls[i].arguments, r->calls[i].arguments_len, c->calls[i][1], "arguments");
        assert_int_equal(strlen(r->calls[i].id), 29);
        assert_memory_equal(r->calls[i].id, "call_", 5);
    }
}

typedef struct {
    dx_buf content, reasoning;
    size_t n_calls;
    int in_call; /* a CALL came, its ARGS not yet */
    const oai_tools_result *want;
} acc;

/* Checks one feed's events against the one-shot result as they come. */
static void take(acc *a, const oai_tools_ev *ev, size_t n, int utf8_input)
{
    for (size_t i = 0; i < n; i++) {
        const oai_tools_ev *e = &ev[i];
        if (i) assert_true(e->kind != ev[i - 1].kind || e->kind >= OAI_TOOLS_EV_CALL);
        switch (e->kind) {
        case OAI_TOOLS_EV_CONTENT:
        case OAI_TOOLS_EV_REASONING:
            assert_false(a->in_call);
            assert_true(e->len > 0);
            if (utf8_input)
                assert_int_equal(dx_utf8_valid_prefix((const uint8_t *)e->text, e->len), e->len);
            dx_buf_append(e->kind == OAI_TOOLS_EV_CONTENT ? &a->content : &a->reasoning, e->text,
                          e->len);
            break;
        case OAI_TOOLS_EV_CALL:
            assert_false(a->in_call);
            assert_int_equal(e->index, a->n_calls);
            assert_true(a->n_calls < a->want->n_calls);
            assert_string_equal(e->id, a->want->calls[e->index].id);
            assert_int_equal(e->len, strlen(a->want->calls[e->index].name));
            assert_memory_equal(e->text, a->want->calls[e->index].name, e->len);
            a->in_call = 1;
            break;
        case OAI_TOOLS_EV_ARGS:
            assert_true(a->in_call);
            assert_int_equal(e->index, a->n_calls);
            assert_int_equal(e->len, a->want->calls[e->index].arguments_len);
            assert_memory_equal(e->text, a->want->calls[e->index].arguments, e->len);
            a->in_call = 0;
            a->n_calls++;
            break;
        }
    }
}

/* Feeds text cut at cuts[0..n_cuts) (ascending) and checks that the events
 * add up to r. */
static void check_stream_cuts(const oai_tools_opts *o, const char *text, size_t len,
                              const size_t *cuts, size_t n_cuts, const oai_tools_result *r)
{
    acc a = {.want = r};
    dx_buf_init(&a.content, 0);
    dx_buf_init(&a.reasoning, 0);
    int utf8 = dx_utf8_valid_prefix((const uint8_t *)text, len) == len;
    oai_tools *t = oai_tools_create(o);
    assert_non_null(t);
    const oai_tools_ev *ev;
    size_t n, from = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        assert_int_equal(oai_tools_feed(t, text + from, to - from, &ev, &n), 0);
        take(&a, ev, n, utf8);
        from = to;
    }
    assert_int_equal(oai_tools_finish(t, &ev, &n), 0);
    take(&a, ev, n, utf8);
    assert_false(a.in_call);
    if (a.n_calls != r->n_calls)
        fail_msg("%s: %zu calls streamed, %zu one-shot", g_ctx, a.n_calls, r->n_calls);
    assert_int_equal(oai_tools_n_calls(t), r->n_calls);
    assert_text(a.content.len ? a.content.data : NULL, a.content.len, r->content,
                "streamed content");
    assert_text(a.reasoning.len ? a.reasoning.data : NULL, a.reasoning.len, r->reasoning,
                "streamed reasoning");
    oai_tools_destroy(t);
    dx_buf_free(&a.content);
    dx_buf_free(&a.reasoning);
}

/* Every single split point, byte by byte, and random pieces. */
static void check_chunkings(const oai_tools_opts *o, const char *text, const oai_tools_result *r)
{
    size_t len = strlen(text);
    for (size_t cut = 0; cut <= len; cut++) check_stream_cuts(o, text, len, &cut, 1, r);
    size_t *cuts = dx_malloc((len + 1) * sizeof *cuts);
    for (size_t i = 0; i < len; i++) cuts[i] = i;
    check_stream_cuts(o, text, len, cuts, len, r);
    dx_rng rng;
    dx_rng_seed(&rng, len);
    for (int round = 0; round < 20; round++) {
        size_t n = 0;
        for (size_t at = 0; at < len; at += 1 + dx_rng_next(&rng) % 9) cuts[n++] = at;
        check_stream_cuts(o, text, len, cuts, n, r);
    }
    dx_free(cuts);
}

/* ---- one-shot and streaming on the realistic answers ---------------------- */

static void test_cases(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    for (size_t i = 0; i < DX_ARRAY_LEN(k_cases); i++) {
        const tcase *c = &k_cases[i];
        oai_tools_result r;
        parse(&c->o, c->text, strlen(c->text), &r);
        check_case(c, &r);
        check_chunkings(&c->o, c->text, &r);
        oai_tools_result_free(&r);
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_malformed_is_content(void **state)
{
    (void)state;
    oai_tools_opts o = QWEN_R;
    for (size_t i = 0; i < DX_ARRAY_LEN(k_malformed); i++) {
        const char *text = k_malformed[i];
        oai_tools_result r;
        parse(&o, text, strlen(text), &r);
        g_ctx = text;
        assert_int_equal(r.n_calls, 0);
        assert_null(r.reasoning);
        assert_text(r.content, r.content_len, text, "content");
        check_chunkings(&o, text, &r);
        oai_tools_result_free(&r);
    }
}

/* Arguments nested deeper than the scanner's limit: content, not a crash. */
static void test_deep_nesting(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_puts(&b, "<tool_call>{\"name\": \"deep\", \"arguments\": ");
    for (int i = 0; i < 200; i++) dx_buf_puts(&b, "{\"a\":[");
    for (int i = 0; i < 200; i++) dx_buf_puts(&b, "]}");
    dx_buf_puts(&b, "}</tool_call>");
    oai_tools_opts o = QWEN;
    oai_tools_result r;
    parse(&o, b.data, b.len, &r);
    assert_int_equal(r.n_calls, 0);
    assert_text(r.content, r.content_len, b.data, "content");
    oai_tools_result_free(&r);
    /* 60 levels (120 containers, under the limit of 128) are a call */
    dx_buf_reset(&b);
    dx_buf_puts(&b, "<tool_call>{\"name\": \"deep\", \"arguments\": ");
    for (int i = 0; i < 63; i++) dx_buf_puts(&b, "{\"a\":[");
    for (int i = 0; i < 63; i++) dx_buf_puts(&b, "]}");
    dx_buf_puts(&b, "}</tool_call>");
    parse(&o, b.data, b.len, &r);
    assert_int_equal(r.n_calls, 1);
    oai_tools_result_free(&r);
    dx_buf_free(&b);
}

/* A call cut off at any byte (max_tokens) is content, exactly as written. */
static void test_truncated_every_byte(void **state)
{
    (void)state;
    const tcase *c = &k_cases[1];
    size_t len = strlen(c->text);
    for (size_t n = 0; n < len; n++) {
        oai_tools_result r;
        parse(&c->o, c->text, n, &r);
        assert_int_equal(r.n_calls, 0);
        assert_int_equal(r.content_len, n);
        if (n) assert_memory_equal(r.content, c->text, n);
        oai_tools_result_free(&r);
    }
    const tcase *l = &k_cases[14]; /* two llama3 calls: the first is whole after its '}' */
    const char *second = strchr(l->text, ';');
    for (size_t n = 0; n < strlen(l->text); n++) {
        oai_tools_result r;
        parse(&l->o, l->text, n, &r);
        size_t first_end = (size_t)(second - l->text);
        assert_int_equal(r.n_calls, n >= first_end ? 1 : 0);
        if (n < first_end) assert_int_equal(r.content_len, n);
        oai_tools_result_free(&r);
    }
}

/* Streaming releases text at once unless it may still start a tag. */
static void test_holdback(void **state)
{
    (void)state;
    static const struct {
        const char *piece, *released; /* content released by this feed */
    } k_steps[] = {
        {"Let", "Let"},         {" me", " me"},       {" check", " check"},
        {".\n", "."},           {"\n", ""},           {"<", ""},
        {"tool", ""},           {"s", "\n\n<tools"},  {" <", ""},
        {"b>", " <b>"},         {" 3 <", " 3"},       {" 4", " < 4"},
        {"\n<tool_call", ""},   {">\n{\"name\"", ""}, {": \"x\"}", ""},
        {"\n</tool_call>", ""}, {"\n", ""},           {"Done", "\n\nDone"},
    };
    oai_tools_opts o = QWEN_R;
    oai_tools *t = oai_tools_create(&o);
    const oai_tools_ev *ev;
    size_t n;
    for (size_t i = 0; i < DX_ARRAY_LEN(k_steps); i++) {
        assert_int_equal(oai_tools_feed(t, k_steps[i].piece, strlen(k_steps[i].piece), &ev, &n), 0);
        dx_buf got;
        dx_buf_init(&got, 0);
        int call = 0;
        for (size_t k = 0; k < n; k++)
            if (ev[k].kind == OAI_TOOLS_EV_CONTENT)
                dx_buf_append(&got, ev[k].text, ev[k].len);
            else
                call += ev[k].kind == OAI_TOOLS_EV_CALL;
        g_ctx = k_steps[i].piece;
        assert_text(got.len ? got.data : "", got.len, k_steps[i].released, "released");
        assert_int_equal(call, i == 15);
        dx_buf_free(&got);
    }
    assert_int_equal(oai_tools_finish(t, &ev, &n), 0);
    assert_int_equal(n, 0);
    assert_string_equal(oai_tools_finish_reason(t, "stop"), "tool_calls");
    oai_tools_destroy(t);
}

/* Reasoning streams as it comes; a reply that begins plainly is content at
 * its first letter even with the reasoning parser on. */
static void test_reasoning_stream(void **state)
{
    (void)state;
    oai_tools_opts o = QWEN_R;
    oai_tools *t = oai_tools_create(&o);
    const oai_tools_ev *ev;
    size_t n;
    assert_int_equal(oai_tools_feed(t, "<think>", 7, &ev, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(oai_tools_feed(t, "\nSo", 3, &ev, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0].kind, OAI_TOOLS_EV_REASONING);
    assert_text(ev[0].text, ev[0].len, "So", "reasoning");
    const char *rest = " yes.\n</think>\n\nYes";
    assert_int_equal(oai_tools_feed(t, rest, strlen(rest), &ev, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ev[0].kind, OAI_TOOLS_EV_REASONING);
    assert_text(ev[0].text, ev[0].len, " yes.", "reasoning");
    assert_int_equal(ev[1].kind, OAI_TOOLS_EV_CONTENT);
    assert_text(ev[1].text, ev[1].len, "Yes", "content");
    assert_int_equal(oai_tools_finish(t, &ev, &n), 0);
    assert_string_equal(oai_tools_finish_reason(t, "length"), "length");
    oai_tools_destroy(t);

    t = oai_tools_create(&o);
    assert_int_equal(oai_tools_feed(t, "H", 1, &ev, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0].kind, OAI_TOOLS_EV_CONTENT);
    oai_tools_destroy(t);
}

/* A UTF-8 character split across feeds comes out whole. */
static void test_utf8_split(void **state)
{
    (void)state;
    const char *text = "<think>é☕</think>😀 ok";
    oai_tools_opts o = QWEN_R;
    oai_tools_result r;
    parse(&o, text, strlen(text), &r);
    assert_text(r.reasoning, r.reasoning_len, "é☕", "reasoning");
    assert_text(r.content, r.content_len, "😀 ok", "content");
    check_chunkings(&o, text, &r); /* checks every event is valid UTF-8 */
    oai_tools_result_free(&r);
}

/* ---- ids, limits, errors ----------------------------------------------------- */

static void test_ids(void **state)
{
    (void)state;
    const char *text = "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}"
                       "</tool_call><tool_call>{\"name\": \"c\"}</tool_call>";
    enum { N = 100 };
    static char ids[3 * N][32];
    oai_tools_opts o = {.tools = OAI_TOOLS_QWEN}; /* random ids */
    for (int i = 0; i < N; i++) {
        oai_tools_result r;
        parse(&o, text, strlen(text), &r);
        assert_int_equal(r.n_calls, 3);
        for (int k = 0; k < 3; k++) {
            const char *id = r.calls[k].id;
            assert_int_equal(strlen(id), 29);
            assert_memory_equal(id, "call_", 5);
            assert_int_equal(strspn(id + 5, "0123456789abcdef"), 24);
            memcpy(ids[3 * i + k], id, 30);
        }
        oai_tools_result_free(&r);
    }
    for (int i = 0; i < 3 * N; i++)
        for (int k = i + 1; k < 3 * N; k++) assert_string_not_equal(ids[i], ids[k]);
    /* a seed gives the same ids again */
    oai_tools_opts s = {.tools = OAI_TOOLS_QWEN, .id_seed = 42};
    oai_tools_result a, b;
    parse(&s, text, strlen(text), &a);
    parse(&s, text, strlen(text), &b);
    for (int k = 0; k < 3; k++) assert_string_equal(a.calls[k].id, b.calls[k].id);
    assert_string_not_equal(a.calls[0].id, a.calls[1].id);
    oai_tools_result_free(&a);
    oai_tools_result_free(&b);
}

/* A call longer than max_held is given up as content at that byte. */
static void test_max_held(void **state)
{
    (void)state;
    const char *text = "<tool_call>{\"name\": \"w\", \"arguments\": {\"s\": \"0123456789012345678"
                       "9\"}}</tool_call>";
    oai_tools_opts o = {.tools = OAI_TOOLS_QWEN, .id_seed = 1, .max_held = 40};
    oai_tools_result r;
    parse(&o, text, strlen(text), &r);
    assert_int_equal(r.n_calls, 0);
    assert_text(r.content, r.content_len, text, "content");
    check_chunkings(&o, text, &r);
    oai_tools_result_free(&r);
    o.max_held = 200;
    parse(&o, text, strlen(text), &r);
    assert_int_equal(r.n_calls, 1);
    oai_tools_result_free(&r);
}

/* Out of memory at any allocation is DX_ENOMEM, never a crash or a leak. */
static void test_oom(void **state)
{
    (void)state;
    const tcase *c = &k_cases[0];
    size_t live = dx_alloc_live_bytes();
    int failed = 0;
    for (long n = 1; n < 200; n++) {
        oai_tools_result r;
        dx_alloc_fail_after(n, 0);
        int rc = oai_tools_parse(&c->o, c->text, strlen(c->text), &r);
        dx_alloc_fail_after(0, 0);
        if (rc == 0) {
            check_case(c, &r);
        } else {
            assert_int_equal(rc, DX_ENOMEM);
            failed++;
        }
        oai_tools_result_free(&r);
        assert_int_equal(dx_alloc_live_bytes(), live);
    }
    assert_true(failed > 5);
    /* a streaming parser stays failed once it ran out */
    oai_tools_opts o = QWEN;
    oai_tools *t = oai_tools_create(&o);
    const oai_tools_ev *ev;
    size_t n;
    dx_alloc_fail_after(1, 1);
    assert_int_equal(oai_tools_feed(t, "hello", 5, &ev, &n), DX_ENOMEM);
    dx_alloc_fail_after(0, 0);
    assert_int_equal(oai_tools_feed(t, "hello", 5, &ev, &n), DX_ENOMEM);
    assert_int_equal(oai_tools_finish(t, &ev, &n), DX_ENOMEM);
    oai_tools_destroy(t);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_feed_after_finish(void **state)
{
    (void)state;
    oai_tools_opts o = QWEN;
    oai_tools *t = oai_tools_create(&o);
    const oai_tools_ev *ev;
    size_t n;
    assert_int_equal(oai_tools_finish(t, &ev, &n), 0);
    assert_int_equal(oai_tools_feed(t, "x", 1, &ev, &n), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "after the answer finished"));
    assert_int_equal(oai_tools_finish(t, &ev, &n), 0);
    assert_int_equal(n, 0);
    oai_tools_destroy(t);
    oai_tools_destroy(NULL);
}

/* ---- JSON out ------------------------------------------------------------------ */

static json_t *load_members(const dx_buf *b)
{
    dx_buf w;
    dx_buf_init(&w, 0);
    dx_buf_printf(&w, "{%.*s}", (int)b->len, b->data);
    json_error_t je;
    json_t *v = json_loads(w.data, 0, &je);
    if (!v) fail_msg("not JSON (%s): %s", je.text, w.data);
    dx_buf_free(&w);
    return v;
}

static void test_message_json(void **state)
{
    (void)state;
    const tcase *c = &k_cases[1];
    oai_tools_result r;
    parse(&c->o, c->text, strlen(c->text), &r);
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(oai_tools_message_json(&b, &r), 0);
    json_t *m = load_members(&b);
    assert_string_equal(json_string_value(json_object_get(m, "content")), c->content);
    assert_null(json_object_get(m, "reasoning_content"));
    json_t *call = json_array_get(json_object_get(m, "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(call, "id")), r.calls[0].id);
    assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
    json_t *fn = json_object_get(call, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "write_file");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    assert_string_equal(args, c->calls[0][1]);
    /* the arguments string is itself JSON with the model's values */
    json_t *a = json_loads(args, 0, NULL);
    assert_non_null(a);
    assert_string_equal(json_string_value(json_object_get(a, "title")), "café 😀 ☕");
    assert_string_equal(json_string_value(json_object_get(a, "content")),
                        "Close a call with </tool_call>.\n{\"nested\": [1, {\"k\": \"}\"}]}\n");
    json_decref(a);
    json_decref(m);
    oai_tools_result_free(&r);

    /* only calls: content null; reasoning present */
    c = &k_cases[0];
    parse(&c->o, c->text, strlen(c->text), &r);
    dx_buf_reset(&b);
    assert_int_equal(oai_tools_message_json(&b, &r), 0);
    m = load_members(&b);
    assert_true(json_is_null(json_object_get(m, "content")));
    assert_string_equal(json_string_value(json_object_get(m, "reasoning_content")), c->reasoning);
    assert_int_equal(json_array_size(json_object_get(m, "tool_calls")), 2);
    json_decref(m);
    oai_tools_result_free(&r);

    /* nothing at all: content "" as without the parser */
    oai_tools_opts o = QWEN;
    parse(&o, "", 0, &r);
    dx_buf_reset(&b);
    assert_int_equal(oai_tools_message_json(&b, &r), 0);
    assert_string_equal(b.data, "\"content\":\"\"");
    oai_tools_result_free(&r);
    dx_buf_free(&b);
}

/* The delta members of each event, and a client-side merge of them by index
 * (as the openai SDKs do) gives the one-shot calls. */
static void test_delta_json(void **state)
{
    (void)state;
    const tcase *c = &k_cases[0];
    oai_tools_result r;
    parse(&c->o, c->text, strlen(c->text), &r);
    oai_tools *t = oai_tools_create(&c->o);
    json_t *calls = json_array();
    dx_buf reasoning, b;
    dx_buf_init(&reasoning, 0);
    dx_buf_init(&b, 0);
    size_t len = strlen(c->text);
    for (size_t at = 0; at <= len; at += 5) {
        const oai_tools_ev *ev;
        size_t n;
        size_t k = len - at < 5 ? len - at : 5;
        assert_int_equal(
            k ? oai_tools_feed(t, c->text + at, k, &ev, &n) : oai_tools_finish(t, &ev, &n), 0);
        for (size_t i = 0; i < n; i++) {
            dx_buf_reset(&b);
            assert_int_equal(oai_tools_ev_json(&b, &ev[i]), 0);
            json_t *d = load_members(&b);
            json_t *rc = json_object_get(d, "reasoning_content");
            if (rc) dx_buf_puts(&reasoning, json_string_value(rc));
            assert_null(json_object_get(d, "content"));
            json_t *tc = json_array_get(json_object_get(d, "tool_calls"), 0);
            if (tc) {
                size_t idx = (size_t)json_integer_value(json_object_get(tc, "index"));
                json_t *fn = json_object_get(tc, "function");
                if (json_object_get(tc, "id")) {
                    assert_int_equal(idx, json_array_size(calls));
                    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "");
                    json_array_append_new(
                        calls,
                        json_pack("{s:s, s:s, s:s}", "id",
                                  json_string_value(json_object_get(tc, "id")), "name",
                                  json_string_value(json_object_get(fn, "name")), "arguments", ""));
                } else {
                    json_t *have = json_array_get(calls, idx);
                    char *cat = NULL;
                    assert_true(asprintf(&cat, "%s%s",
                                         json_string_value(json_object_get(have, "arguments")),
                                         json_string_value(json_object_get(fn, "arguments"))) > 0);
                    json_object_set_new(have, "arguments", json_string(cat));
                    free(cat);
                }
            }
            json_decref(d);
        }
    }
    assert_string_equal(reasoning.data, c->reasoning);
    assert_int_equal(json_array_size(calls), r.n_calls);
    for (size_t i = 0; i < r.n_calls; i++) {
        json_t *have = json_array_get(calls, i);
        assert_string_equal(json_string_value(json_object_get(have, "id")), r.calls[i].id);
        assert_string_equal(json_string_value(json_object_get(have, "name")), r.calls[i].name);
        assert_string_equal(json_string_value(json_object_get(have, "arguments")),
                            r.calls[i].arguments);
    }
    assert_string_equal(oai_tools_finish_reason(t, "stop"), "tool_calls");
    json_decref(calls);
    dx_buf_free(&reasoning);
    dx_buf_free(&b);
    oai_tools_destroy(t);
    oai_tools_result_free(&r);

    /* content escapes; an invalid byte becomes U+FFFD in the JSON */
    oai_tools_ev e = {.kind = OAI_TOOLS_EV_CONTENT, .text = "a\"\n\xff", .len = 4};
    dx_buf_init(&b, 0);
    assert_int_equal(oai_tools_ev_json(&b, &e), 0);
    assert_string_equal(b.data, "\"content\":\"a\\\"\\n\\ufffd\"");
    dx_buf_free(&b);
}

/* docs/api.md's example, answer and message, exactly. */
static void test_doc_example(void **state)
{
    (void)state;
    const char *text =
        "<think>\nThe user wants the weather in Paris and in Tokyo: two calls.\n</think>\n\nI'll "
        "check both cities.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"location\": "
        "\"Paris, France\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
        "\"get_weather\", \"arguments\": {\"location\": \"東京\", \"unit\": \"celsius\"}}\n"
        "</tool_call>";
    oai_tools_opts o = {.tools = OAI_TOOLS_QWEN, .reasoning = 1, .id_seed = 1};
    oai_tools_result r;
    parse(&o, text, strlen(text), &r);
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(oai_tools_message_json(&b, &r), 0);
    assert_string_equal(
        b.data, "\"content\":\"I'll check both cities.\",\"reasoning_content\":\"The user wants "
                "the weather "
                "in Paris and in Tokyo: two "
                "calls.\",\"tool_calls\":[{\"id\":\"call_910a2dec89025cc1beeb8da1"
                "\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{"
                "\\\"location"
                "\\\":\\\"Paris, "
                "France\\\",\\\"unit\\\":\\\"celsius\\\"}\"}},{\"id\":\"call_f893a2eefb32555e71"
                "c18690\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                "\"arguments\":\"{\\\""
                "location\\\":\\\"東京\\\",\\\"unit\\\":\\\"celsius\\\"}\"}}]");
    dx_buf_free(&b);
    oai_tools_result_free(&r);
}

/* Feeds allocate nothing once the buffers have grown: the same stretch of
 * answer (content, two calls) fed again costs no allocation. */
static void test_no_alloc_when_warm(void **state)
{
    (void)state;
    const char *text = k_cases[8].text;
    oai_tools_opts o = QWEN;
    oai_tools *t = oai_tools_create(&o);
    const oai_tools_ev *ev;
    size_t n, len = strlen(text), calls = 0;
    for (int pass = 0; pass < 4; pass++) {
        size_t before = dx_alloc_total_count();
        for (size_t at = 0; at < len; at += 3) {
            assert_int_equal(oai_tools_feed(t, text + at, len - at < 3 ? len - at : 3, &ev, &n), 0);
            for (size_t i = 0; i < n; i++) calls += ev[i].kind == OAI_TOOLS_EV_CALL;
        }
        if (pass > 0) assert_int_equal(dx_alloc_total_count(), before);
    }
    assert_int_equal(calls, 8);
    oai_tools_destroy(t);
}

/* ---- options ------------------------------------------------------------------- */

static void test_think_open(void **state)
{
    (void)state;
    static const struct {
        const char *prompt;
        int open;
    } k[] = {
        {"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", 0},
        {"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n", 1},
        {"<|im_start|>assistant\n<think>\n\n</think>\n\n", 0}, /* enable_thinking=false */
        {"<|im_start|>assistant\n<think>\nold\n</think>\n\nA<|im_end|>\n<|im_start|>user\nQ"
         "<|im_end|>\n<|im_start|>assistant\n<think>\n",
         1},
        {"<think", 0},
        {"", 0},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(k); i++)
        assert_int_equal(oai_tools_think_open(k[i].prompt, strlen(k[i].prompt)), k[i].open);
}

static void test_fmt_parse(void **state)
{
    (void)state;
    enum oai_tools_fmt f;
    assert_int_equal(oai_tools_fmt_parse("qwen", &f), 0);
    assert_int_equal(f, OAI_TOOLS_QWEN);
    assert_int_equal(oai_tools_fmt_parse("hermes", &f), 0);
    assert_int_equal(f, OAI_TOOLS_QWEN);
    assert_int_equal(oai_tools_fmt_parse("llama3_json", &f), 0);
    assert_int_equal(f, OAI_TOOLS_LLAMA3);
    assert_int_equal(oai_tools_fmt_parse("none", &f), 0);
    assert_int_equal(f, OAI_TOOLS_NONE);
    assert_int_equal(oai_tools_fmt_parse("mistral", &f), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "'mistral'"));
    assert_non_null(strstr(dx_errmsg(), "llama3"));
}

/* ---- the JSON scanner --------------------------------------------------------- */

static void test_jscan(void **state)
{
    (void)state;
    static const char *const k_good[] = {
        "{}",
        " {\"a\":1} ",
        "{\"a\":[1,-0,0.5,1e5,1E+5,-2.5e-3,true,false,null,\"s\"]}",
        "{\"a\":{\"b\":{\"c\":[[],{}]}}}",
        "{\"\\u00e9\\n\\\"\\\\\\/\\b\\f\\r\\t\":\"\\uD83D\\uDE00\"}",
        "\n\t{ \"a\" : [ 1 , 2 ] }\r\n",
    };
    static const char *const k_bad[] = {
        "",
        "[]",
        "\"s\"",
        "1",
        "{",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "{,}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":.5}",
        "{\"a\":-}",
        "{\"a\":1e}",
        "{\"a\":+1}",
        "{\"a\":tru}",
        "{\"a\":nul}",
        "{\"a\":True}",
        "{'a':1}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\u12g4\"}",
        "{\"a\":\"\t\"}",
        "{\"a\":[1,]}",
        "{\"a\":[1}",
        "{\"a\":1]}",
        "{} {}",
        "{\"a\" 1}",
        "{\"a\":1 \"b\":2}",
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(k_good); i++) {
        assert_true(oai_jscan_is_object(k_good[i], strlen(k_good[i])));
        json_t *v = json_loads(k_good[i], 0, NULL);
        assert_non_null(v); /* jansson agrees */
        json_decref(v);
    }
    for (size_t i = 0; i < DX_ARRAY_LEN(k_bad); i++) {
        assert_false(oai_jscan_is_object(k_bad[i], strlen(k_bad[i])));
    }
    /* tracked members, as offsets of their values */
    const char *obj =
        "{ \"x\": {\"name\": 1}, \"name\" : \"f\\n\", \"parameters\": [1, {\"a\": 2}] ,"
        "\"arguments\":-12.5e3}";
    oai_jscan s;
    oai_jscan_init(&s);
    size_t n = strlen(obj);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(oai_jscan_byte(&s, (unsigned char)obj[i]),
                         i + 1 == n ? OAI_JSCAN_DONE : OAI_JSCAN_MORE);
    const oai_jscan_val *v = s.val;
    assert_false(s.dup);
    assert_true(v[OAI_JSCAN_NAME].seen && v[OAI_JSCAN_ARGUMENTS].seen &&
                v[OAI_JSCAN_PARAMETERS].seen);
    assert_text(obj + v[0].start, v[0].end - v[0].start, "\"f\\n\"", "name");
    assert_text(obj + v[1].start, v[1].end - v[1].start, "-12.5e3", "arguments");
    assert_text(obj + v[2].start, v[2].end - v[2].start, "[1, {\"a\": 2}]", "parameters");
    /* compact keeps strings as written */
    dx_buf b;
    dx_buf_init(&b, 0);
    const char *sp = " { \"a b\" : [ 1 , \"x \\\" y\" ] }\n";
    assert_int_equal(oai_jscan_compact(sp, strlen(sp), &b), 0);
    assert_string_equal(b.data, "{\"a b\":[1,\"x \\\" y\"]}");
    /* unquote: escapes, surrogate pairs, lone surrogates */
    dx_buf_reset(&b);
    const char *q = "\"a\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00z\"";
    assert_int_equal(oai_jscan_unquote(q, strlen(q), &b), 0);
    assert_string_equal(b.data, "a\"\\/\b\f\n\r\té😀z");
    dx_buf_reset(&b);
    assert_int_equal(oai_jscan_unquote("\"\\udc00\"", 8, &b), DX_EFORMAT);
    assert_int_equal(oai_jscan_unquote("\"\\ud800x\"", 9, &b), DX_EFORMAT);
    dx_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_malformed_is_content),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_truncated_every_byte),
        cmocka_unit_test(test_holdback),
        cmocka_unit_test(test_reasoning_stream),
        cmocka_unit_test(test_utf8_split),
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_max_held),
        cmocka_unit_test(test_oom),
        cmocka_unit_test(test_feed_after_finish),
        cmocka_unit_test(test_message_json),
        cmocka_unit_test(test_delta_json),
        cmocka_unit_test(test_doc_example),
        cmocka_unit_test(test_no_alloc_when_warm),
        cmocka_unit_test(test_think_open),
        cmocka_unit_test(test_fmt_parse),
        cmocka_unit_test(test_jscan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
