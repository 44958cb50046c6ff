/* Unit tests for src/oai/oai_ans: a chat answer read back into its pieces.
 *
 * Round trips through the writers the node uses: a model's answer parsed by
 * oai_tools (reasoning, content, tool calls) and written as a chat answer
 * (oai_resp_full) or a stream of chunks (oai_sse_chunk of each event) must
 * read back to the same pieces — result for result, event for event — with
 * the finish, the stop string and the usage. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "oai/oai_ans.h"
#include "oai/oai_resp.h"
#include "oai/oai_tools.h"

static const char k_answer[] =
    "<think>\nlet me see\n</think>\n\nThe weather:\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": 1.50}}\n"
    "</tool_call>\n<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>";

static const oai_tools_opts k_opts = {.tools = OAI_TOOLS_QWEN, .reasoning = 1, .id_seed = 9};

static const oai_meta k_meta = {.kind = OAI_CHAT, .id = "chatcmpl-1", .model = "m", .created = 1};

static void test_full_round_trip(void **state)
{
    (void)state;
    oai_tools_result want, got;
    assert_int_equal(oai_tools_parse(&k_opts, k_answer, strlen(k_answer), &want), 0);
    assert_int_equal(want.n_calls, 2);
    dx_buf raw, b;
    dx_buf_init(&raw, 0);
    dx_buf_init(&b, 0);
    assert_int_equal(oai_tools_message_json(&raw, &want), 0);
    assert_int_equal(dx_buf_putc(&raw, 0), 0);
    oai_choice c = {.raw = raw.data, .finish = "tool_calls"};
    oai_usage u = {.prompt = 100, .cached = 64, .completion = 30};
    assert_int_equal(oai_resp_full(&b, &k_meta, &c, &u, NULL), 0);
    oai_ans_info info;
    oai_ans_info_init(&info);
    assert_int_equal(oai_ans_full(b.data, b.len, &got, &info), 0);
    assert_string_equal(info.finish, "tool_calls");
    assert_int_equal(info.stop_reason.len, 0);
    assert_true(info.has_usage);
    assert_int_equal(info.usage.prompt, 100);
    assert_int_equal(info.usage.cached, 64);
    assert_int_equal(info.usage.completion, 30);
    assert_false(info.error);
    assert_int_equal(got.content_len, want.content_len);
    assert_memory_equal(got.content, want.content, want.content_len);
    assert_int_equal(got.reasoning_len, want.reasoning_len);
    assert_memory_equal(got.reasoning, want.reasoning, want.reasoning_len);
    assert_int_equal(got.n_calls, want.n_calls);
    for (size_t i = 0; i < want.n_calls; i++) {
        assert_string_equal(got.calls[i].id, want.calls[i].id);
        assert_string_equal(got.calls[i].name, want.calls[i].name);
        assert_int_equal(got.calls[i].arguments_len, want.calls[i].arguments_len);
        assert_string_equal(got.calls[i].arguments, want.calls[i].arguments);
    }
    oai_tools_result_free(&got);
    oai_tools_result_free(&want);
    /* plain text, ended by a stop string */
    b.len = 0;
    oai_choice t = {
        .text = "hi \xff there", .len = 10, .finish = "stop", .stop_reason = "\n\nUser:"};
    assert_int_equal(oai_resp_full(&b, &k_meta, &t, &u, NULL), 0);
    assert_int_equal(oai_ans_full(b.data, b.len, &got, &info), 0);
    assert_string_equal(info.finish, "stop");
    assert_string_equal(info.stop_reason.data, "\n\nUser:");
    assert_string_equal(got.content, "hi \xef\xbf\xbd there"); /* the writer's U+FFFD */
    assert_null(got.reasoning);
    assert_int_equal(got.n_calls, 0);
    oai_tools_result_free(&got);
    /* a NUL the model wrote (\u0000 in the answer) is kept, by length */
    b.len = 0;
    oai_choice z = {.text = "a\0b", .len = 3, .finish = "length"};
    assert_int_equal(oai_resp_full(&b, &k_meta, &z, &u, NULL), 0);
    assert_non_null(memmem(b.data, b.len, "\\u0000", 6));
    assert_int_equal(oai_ans_full(b.data, b.len, &got, &info), 0);
    assert_int_equal(got.content_len, 3);
    assert_memory_equal(got.content, "a\0b", 3);
    oai_tools_result_free(&got);
    oai_ans_info_free(&info);
    dx_buf_free(&raw);
    dx_buf_free(&b);
}

static void test_errors(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(oai_error_json(&b, "messages: too long", "invalid_request_error", "messages",
                                    "context_length_exceeded"),
                     0);
    oai_tools_result r;
    oai_ans_info info;
    oai_ans_info_init(&info);
    assert_int_equal(oai_ans_full(b.data, b.len, &r, &info), 0);
    assert_true(info.error);
    assert_string_equal(info.error_message, "messages: too long");
    assert_string_equal(info.error_type, "invalid_request_error");
    assert_string_equal(info.error_param, "messages");
    assert_string_equal(info.error_code, "context_length_exceeded");
    oai_tools_result_free(&r);
    /* not an answer at all */
    oai_ans_info_free(&info);
    oai_ans_info_init(&info);
    assert_int_equal(oai_ans_full("[1,2]", 5, &r, &info), DX_EFORMAT);
    assert_int_equal(oai_ans_full("{\"choices\":[]}", 14, &r, &info), DX_EFORMAT);
    oai_ans_stream *s = oai_ans_stream_create();
    const oai_tools_ev *ev;
    size_t n;
    assert_int_equal(oai_ans_chunk(s, "nope", 4, &ev, &n, &info), DX_EFORMAT);
    /* an error inside a stream */
    b.len = 0;
    assert_int_equal(oai_sse_error(&b, "the decode node failed", "server_error"), 0);
    const char *d = strstr(b.data, "data: ") + 6;
    const char *e = strstr(d, "\n\n");
    oai_ans_info_free(&info);
    oai_ans_info_init(&info);
    assert_int_equal(oai_ans_chunk(s, d, (size_t)(e - d), &ev, &n, &info), 0);
    assert_true(info.error);
    assert_string_equal(info.error_message, "the decode node failed");
    assert_int_equal(n, 0);
    oai_ans_stream_destroy(s);
    oai_ans_info_free(&info);
    dx_buf_free(&b);
}

/* The data of the one "data: …\n\n" event in b. */
static void event_data(const dx_buf *b, const char **d, size_t *len)
{
    assert_true(b->len > 8 && !memcmp(b->data, "data: ", 6));
    *d = b->data + 6;
    *len = b->len - 8;
    assert_memory_equal(*d + *len, "\n\n", 2);
}

static void test_stream_round_trip(void **state)
{
    (void)state;
    /* the events of the answer fed in small pieces, each written as the
     * node writes it, and read back */
    oai_tools *t = oai_tools_create(&k_opts);
    oai_ans_stream *s = oai_ans_stream_create();
    oai_ans_info info;
    oai_ans_info_init(&info);
    dx_buf delta, chunk, sent, back;
    dx_buf_init(&delta, 0);
    dx_buf_init(&chunk, 0);
    dx_buf_init(&sent, 0);
    dx_buf_init(&back, 0);
    size_t len = strlen(k_answer), n_events = 0;
    for (size_t at = 0; at <= len; at += 3) {
        const oai_tools_ev *ev;
        size_t n;
        if (at < len)
            assert_int_equal(oai_tools_feed(t, k_answer + at, len - at < 3 ? len - at : 3, &ev, &n),
                             0);
        else
            assert_int_equal(oai_tools_finish(t, &ev, &n), 0);
        for (size_t i = 0; i < n; i++) {
            dx_buf_printf(&sent, "%d:%u:%s:%.*s|", ev[i].kind, ev[i].index,
                          ev[i].kind == OAI_TOOLS_EV_CALL ? ev[i].id : "", (int)ev[i].len,
                          ev[i].text);
            delta.len = chunk.len = 0;
            assert_int_equal(oai_tools_ev_json(&delta, &ev[i]), 0);
            assert_int_equal(dx_buf_putc(&delta, 0), 0);
            oai_choice c = {.raw = delta.data};
            assert_int_equal(oai_sse_chunk(&chunk, &k_meta, &c, n_events++ == 0, 1, NULL), 0);
            const char *d;
            size_t dl;
            event_data(&chunk, &d, &dl);
            const oai_tools_ev *got;
            size_t n_got;
            assert_int_equal(oai_ans_chunk(s, d, dl, &got, &n_got, &info), 0);
            for (size_t k = 0; k < n_got; k++)
                dx_buf_printf(&back, "%d:%u:%s:%.*s|", got[k].kind, got[k].index,
                              got[k].kind == OAI_TOOLS_EV_CALL ? got[k].id : "", (int)got[k].len,
                              got[k].text);
        }
    }
    assert_true(n_events > 5);
    assert_int_equal(back.len, sent.len);
    assert_memory_equal(back.data, sent.data, sent.len);
    assert_false(info.has_usage);
    /* the finish chunk, the usage chunk, [DONE] */
    chunk.len = 0;
    oai_choice fin = {.finish = "tool_calls"};
    assert_int_equal(oai_sse_chunk(&chunk, &k_meta, &fin, 0, 1, NULL), 0);
    const char *d;
    size_t dl, n;
    const oai_tools_ev *ev;
    event_data(&chunk, &d, &dl);
    assert_int_equal(oai_ans_chunk(s, d, dl, &ev, &n, &info), 0);
    assert_int_equal(n, 0);
    assert_string_equal(info.finish, "tool_calls");
    chunk.len = 0;
    oai_usage u = {.prompt = 7, .cached = 3, .completion = 2};
    assert_int_equal(oai_sse_usage(&chunk, &k_meta, &u), 0);
    event_data(&chunk, &d, &dl);
    assert_int_equal(oai_ans_chunk(s, d, dl, &ev, &n, &info), 0);
    assert_true(info.has_usage);
    assert_int_equal(info.usage.cached, 3);
    assert_string_equal(info.finish, "tool_calls"); /* kept from the earlier chunk */
    assert_int_equal(oai_ans_chunk(s, "[DONE]", 6, &ev, &n, &info), 0);
    assert_true(info.done);
    /* a delta from elsewhere with a call's head and arguments together */
    static const char both[] = "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,"
                               "\"id\":\"call_x\",\"type\":\"function\",\"function\":{\"name\":"
                               "\"f\",\"arguments\":\"{}\"}}]}}]}";
    assert_int_equal(oai_ans_chunk(s, both, strlen(both), &ev, &n, &info), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ev[0].kind, OAI_TOOLS_EV_CALL);
    assert_int_equal(ev[0].index, 1);
    assert_string_equal(ev[0].id, "call_x");
    assert_int_equal(ev[1].kind, OAI_TOOLS_EV_ARGS);
    assert_memory_equal(ev[1].text, "{}", 2);
    oai_tools_destroy(t);
    oai_ans_stream_destroy(s);
    oai_ans_info_free(&info);
    dx_buf_free(&delta);
    dx_buf_free(&chunk);
    dx_buf_free(&sent);
    dx_buf_free(&back);
}

int main(void)
{
    oai_json_use_dx_alloc();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_round_trip),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_stream_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
