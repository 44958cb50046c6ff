/* Unit tests for src/oai/oai_front: chat answers written again for the
 * Anthropic Messages and Responses front doors.
 *
 * The chat stream is made as the node makes it (a role chunk, one chunk per
 * event of the tool-call parser, the finish, the usage, [DONE]) and fed in
 * pieces cut anywhere; what comes out must be a well-formed stream of the
 * door (read back as its SDK reads it: tests/anth_sse_test.h,
 * tests/fuzz/rsp_sse_check.h) that adds up to the door's whole answer for
 * the same chat answer, with the finish, the stop string and the usage
 * carried over.  Errors, whole and inside a stream, come out in the door's
 * shape. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "oai/oai_front.h"
#include "oai/oai_req.h"
#include "oai/oai_resp.h"
#include "oai/oai_tools.h"

#include "../anth_sse_test.h"
#include "../fuzz/rsp_sse_check.h"

static const char k_answer[] =
    "<think>\nweather first\n</think>\n\nLet me look.\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

static const oai_tools_opts k_opts = {.tools = OAI_TOOLS_QWEN, .reasoning = 1, .id_seed = 3};
static const oai_meta k_meta = {.kind = OAI_CHAT, .id = "chatcmpl-1", .model = "m", .created = 1};
static const oai_usage k_usage = {.prompt = 40, .cached = 32, .completion = 20};

/* The chat stream the node would send for k_answer. */
static void chat_stream(dx_buf *b, const char *finish_override)
{
    oai_tools *t = oai_tools_create(&k_opts);
    dx_buf raw;
    dx_buf_init(&raw, 0);
    assert_int_equal(oai_sse_chunk(b, &k_meta, &(oai_choice){.text = ""}, 1, 1, NULL), 0);
    size_t len = strlen(k_answer);
    for (size_t at = 0; at <= len; at += 5) {
        const oai_tools_ev *ev;
        size_t n;
        if (at < len)
            assert_int_equal(oai_tools_feed(t, k_answer + at, len - at < 5 ? len - at : 5, &ev, &n),
                             0);
        else
            assert_int_equal(oai_tools_finish(t, &ev, &n), 0);
        for (size_t i = 0; i < n; i++) {
            raw.len = 0;
            assert_int_equal(oai_tools_ev_json(&raw, &ev[i]), 0);
            assert_int_equal(dx_buf_putc(&raw, 0), 0);
            assert_int_equal(oai_sse_chunk(b, &k_meta, &(oai_choice){.raw = raw.data}, 0, 1, NULL),
                             0);
        }
    }
    const char *fin = finish_override ? finish_override : oai_tools_finish_reason(t, "stop");
    assert_int_equal(
        oai_sse_chunk(b, &k_meta, &(oai_choice){.text = "", .finish = fin}, 0, 1, NULL), 0);
    assert_int_equal(oai_sse_usage(b, &k_meta, &k_usage), 0);
    assert_int_equal(oai_sse_done(b), 0);
    oai_tools_destroy(t);
    dx_buf_free(&raw);
}

/* The whole chat answer for k_answer. */
static void chat_full(dx_buf *b, const char *stop_reason)
{
    oai_tools_result r;
    assert_int_equal(oai_tools_parse(&k_opts, k_answer, strlen(k_answer), &r), 0);
    dx_buf raw;
    dx_buf_init(&raw, 0);
    assert_int_equal(oai_tools_message_json(&raw, &r), 0);
    assert_int_equal(dx_buf_putc(&raw, 0), 0);
    oai_choice c = {.raw = raw.data,
                    .finish = stop_reason ? "stop"
                              : r.n_calls ? "tool_calls"
                                          : "stop",
                    .stop_reason = stop_reason};
    assert_int_equal(oai_resp_full(b, &k_meta, &c, &k_usage, NULL), 0);
    oai_tools_result_free(&r);
    dx_buf_free(&raw);
}

/* The stream fed to f in pieces of `piece` bytes. */
static void transcode(oai_front *f, const dx_buf *in, size_t piece, dx_buf *out)
{
    for (size_t at = 0; at < in->len; at += piece)
        assert_int_equal(
            oai_front_sse(f, in->data + at, in->len - at < piece ? in->len - at : piece, out), 0);
}

static json_t *parse(const dx_buf *b)
{
    json_error_t je;
    json_t *v = json_loadb(b->data, b->len, 0, &je);
    if (!v) fail_msg("not JSON: %s\n%.*s", je.text, (int)b->len, b->data);
    return v;
}

static void test_messages_stream_equals_whole(void **state)
{
    (void)state;
    dx_buf chat, whole_chat;
    dx_buf_init(&chat, 0);
    dx_buf_init(&whole_chat, 0);
    chat_stream(&chat, NULL);
    chat_full(&whole_chat, NULL);
    static const size_t pieces[] = {1, 7, 64, 100000};
    for (size_t p = 0; p < DX_ARRAY_LEN(pieces); p++) {
        oai_front_config c = {.api = OAI_FRONT_MESSAGES, .model = "qwen", .prompt_hint = 40};
        oai_front *fs = oai_front_create(&c), *fw = oai_front_create(&c);
        dx_buf s, w;
        dx_buf_init(&s, 0);
        dx_buf_init(&w, 0);
        transcode(fs, &chat, pieces[p], &s);
        assert_true(oai_front_completed(fs));
        assert_int_equal(oai_front_full(fw, 200, whole_chat.data, whole_chat.len, &w), 0);
        assert_true(oai_front_completed(fw));
        json_t *streamed, *whole = parse(&w);
        char why[256];
        if (anth_sse_read(s.data, s.len, &streamed, why)) fail_msg("stream: %s", why);
        /* two answers, two ids: the rest must agree (read as the stream is) */
        json_error_t je;
        json_t *as_read = json_loadb(w.data, w.len, ANTH_SSE_JSON, &je);
        json_object_set(as_read, "id", json_object_get(streamed, "id"));
        if (anth_sse_same(streamed, as_read, why)) fail_msg("piece %zu: %s", pieces[p], why);
        json_decref(as_read);
        assert_string_equal(json_string_value(json_object_get(whole, "stop_reason")), "tool_use");
        json_t *u = json_object_get(whole, "usage");
        assert_int_equal(json_integer_value(json_object_get(u, "input_tokens")), 8);
        assert_int_equal(json_integer_value(json_object_get(u, "cache_read_input_tokens")), 32);
        assert_int_equal(json_integer_value(json_object_get(u, "output_tokens")), 20);
        json_decref(streamed);
        json_decref(whole);
        oai_front_destroy(fs);
        oai_front_destroy(fw);
        dx_buf_free(&s);
        dx_buf_free(&w);
    }
    dx_buf_free(&chat);
    dx_buf_free(&whole_chat);
}

static void test_messages_stop_sequence(void **state)
{
    (void)state;
    dx_buf chat, out;
    dx_buf_init(&chat, 0);
    dx_buf_init(&out, 0);
    oai_choice t = {.text = "Sure.", .len = 5, .finish = "stop", .stop_reason = "\n\nHuman:"};
    assert_int_equal(oai_resp_full(&chat, &k_meta, &t, &k_usage, NULL), 0);
    oai_front_config c = {.api = OAI_FRONT_MESSAGES, .model = "qwen"};
    oai_front *f = oai_front_create(&c);
    assert_int_equal(oai_front_full(f, 200, chat.data, chat.len, &out), 0);
    json_t *m = parse(&out);
    assert_string_equal(json_string_value(json_object_get(m, "stop_reason")), "stop_sequence");
    assert_string_equal(json_string_value(json_object_get(m, "stop_sequence")), "\n\nHuman:");
    json_decref(m);
    oai_front_destroy(f);
    dx_buf_free(&chat);
    dx_buf_free(&out);
}

static oai_front *rsp_front(void)
{
    oai_front_config c = {.api = OAI_FRONT_RESPONSES,
                          .model = "qwen",
                          .rsp = {.id = "resp_0123456789abcdef0123456789abcdef", .created_at = 7}};
    oai_front *f = oai_front_create(&c);
    assert_non_null(f);
    return f;
}

static void test_responses_stream_equals_whole(void **state)
{
    (void)state;
    dx_buf chat, whole_chat;
    dx_buf_init(&chat, 0);
    dx_buf_init(&whole_chat, 0);
    chat_stream(&chat, NULL);
    chat_full(&whole_chat, NULL);
    static const size_t pieces[] = {1, 13, 100000};
    for (size_t p = 0; p < DX_ARRAY_LEN(pieces); p++) {
        oai_front *fs = rsp_front(), *fw = rsp_front();
        dx_buf s, w;
        dx_buf_init(&s, 0);
        dx_buf_init(&w, 0);
        transcode(fs, &chat, pieces[p], &s);
        assert_true(oai_front_completed(fs));
        assert_int_equal(oai_front_full(fw, 200, whole_chat.data, whole_chat.len, &w), 0);
        rsp_chk ck;
        if (rsp_chk_run(&ck, s.data, s.len, 1)) fail_msg("stream: %s", ck.why);
        json_t *whole = parse(&w);
        /* the final object's output is the whole answer's */
        assert_true(
            json_equal(json_object_get(ck.final, "output"), json_object_get(whole, "output")));
        assert_string_equal(json_string_value(json_object_get(whole, "status")), "completed");
        json_t *u = json_object_get(whole, "usage");
        assert_int_equal(json_integer_value(json_object_get(u, "input_tokens")), 40);
        assert_int_equal(json_integer_value(json_object_get(
                             json_object_get(u, "input_tokens_details"), "cached_tokens")),
                         32);
        /* the stored object is the one the stream ended with */
        size_t len;
        const char *obj = oai_front_response(fs, &len);
        assert_non_null(obj);
        json_error_t je;
        json_t *o = json_loadb(obj, len, 0, &je);
        assert_true(json_equal(o, ck.final));
        json_decref(o);
        obj = oai_front_response(fw, &len);
        assert_int_equal(len, w.len);
        /* and the answer as one result, for the history */
        oai_tools_result rs, rw;
        assert_int_equal(oai_front_result(fs, &rs), 0);
        assert_int_equal(oai_front_result(fw, &rw), 0);
        assert_int_equal(rs.n_calls, 1);
        assert_int_equal(rw.n_calls, 1);
        assert_string_equal(rs.calls[0].arguments, rw.calls[0].arguments);
        assert_string_equal(rs.reasoning, rw.reasoning);
        oai_tools_result_free(&rs);
        oai_tools_result_free(&rw);
        json_decref(whole);
        rsp_chk_free(&ck);
        oai_front_destroy(fs);
        oai_front_destroy(fw);
        dx_buf_free(&s);
        dx_buf_free(&w);
    }
    /* length: incomplete */
    chat.len = 0;
    chat_stream(&chat, "length");
    oai_front *f = rsp_front();
    dx_buf s;
    dx_buf_init(&s, 0);
    transcode(f, &chat, 100000, &s);
    rsp_chk ck;
    if (rsp_chk_run(&ck, s.data, s.len, 1)) fail_msg("stream: %s", ck.why);
    assert_string_equal(json_string_value(json_object_get(ck.final, "status")), "incomplete");
    rsp_chk_free(&ck);
    oai_front_destroy(f);
    dx_buf_free(&s);
    dx_buf_free(&chat);
    dx_buf_free(&whole_chat);
}

static void test_errors(void **state)
{
    (void)state;
    dx_buf err, out;
    dx_buf_init(&err, 0);
    dx_buf_init(&out, 0);
    assert_int_equal(oai_error_json(&err, "messages: the prompt is longer than the context",
                                    "invalid_request_error", "messages", NULL),
                     0);
    /* Anthropic's shape */
    oai_front_config c = {.api = OAI_FRONT_MESSAGES, .model = "qwen"};
    oai_front *f = oai_front_create(&c);
    assert_int_equal(oai_front_full(f, 400, err.data, err.len, &out), 0);
    assert_false(oai_front_completed(f));
    json_t *e = parse(&out);
    assert_string_equal(json_string_value(json_object_get(e, "type")), "error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(e, "error"), "type")),
                        "invalid_request_error");
    json_decref(e);
    oai_front_destroy(f);
    /* the Responses API's: OpenAI's shape, the field renamed */
    out.len = 0;
    f = rsp_front();
    assert_int_equal(oai_front_full(f, 400, err.data, err.len, &out), 0);
    e = parse(&out);
    assert_string_equal(json_string_value(json_object_get(json_object_get(e, "error"), "param")),
                        "input");
    json_decref(e);
    oai_front_destroy(f);
    /* inside a stream: the door's error event, nothing after it */
    dx_buf chat;
    dx_buf_init(&chat, 0);
    assert_int_equal(oai_sse_chunk(&chat, &k_meta, &(oai_choice){.text = "Hi"}, 1, 1, NULL), 0);
    assert_int_equal(oai_sse_error(&chat, "the decode node failed mid-answer", "server_error"), 0);
    assert_int_equal(oai_sse_done(&chat), 0);
    out.len = 0;
    f = oai_front_create(&c);
    transcode(f, &chat, 9, &out);
    assert_false(oai_front_completed(f));
    assert_non_null(memmem(out.data, out.len, "event: error\n", 13));
    assert_non_null(memmem(out.data, out.len, "overloaded_error", 16) ||
                            memmem(out.data, out.len, "api_error", 9)
                        ? "ok"
                        : NULL);
    assert_null(memmem(out.data, out.len, "message_stop", 12));
    oai_front_destroy(f);
    out.len = 0;
    f = rsp_front();
    transcode(f, &chat, 9, &out);
    rsp_chk ck;
    if (rsp_chk_run(&ck, out.data, out.len, 1)) fail_msg("stream: %s", ck.why);
    assert_true(ck.error);
    rsp_chk_free(&ck);
    oai_front_destroy(f);
    /* a stream that breaks before its end */
    out.len = 0;
    f = oai_front_create(&c);
    assert_int_equal(oai_front_sse(f, chat.data, 40, &out), 0);
    assert_int_equal(oai_front_sse_fail(f, 502, "upstream gone", &out), 0);
    assert_non_null(memmem(out.data, out.len, "upstream gone", 13));
    oai_front_destroy(f);
    /* not a chat stream */
    out.len = 0;
    f = oai_front_create(&c);
    assert_int_equal(oai_front_sse(f, "data: nope\n\n", 12, &out), DX_EFORMAT);
    oai_front_destroy(f);
    dx_buf_free(&chat);
    dx_buf_free(&err);
    dx_buf_free(&out);
}

int main(void)
{
    oai_json_use_dx_alloc();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_messages_stream_equals_whole),
        cmocka_unit_test(test_messages_stop_sequence),
        cmocka_unit_test(test_responses_stream_equals_whole),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
