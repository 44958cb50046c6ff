/* test_node_tools: the node's agentic answers end to end over loopback —
 * tool calls and reasoning parsed out of what the model generated, into
 * message.tool_calls / reasoning_content and their streaming deltas, with
 * finish_reason "tool_calls".  The model here is a scripted backend (the
 * node's engine interface, node_backend): it "generates" a fixed answer in
 * pieces on a thread of its own, as the engine delivers tokens, so the texts
 * a real model would need luck to write are exact. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "../test_client.h"
#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "node/node_server.h"
#include "oai/oai_req.h"
#include "oai/oai_tools.h"

/* ---- the scripted model --------------------------------------------------- */

static const char *const *g_script; /* the answer's pieces, NULL-terminated */

typedef struct {
    engine_event_fn fn;
    void *user;
    const char *const *pieces;
} run_ctx;

static void *run_script(void *arg)
{
    run_ctx *r = arg;
    uint32_t n = 0;
    int32_t id = 5;
    usleep(2000);
    for (; r->pieces[n]; n++) {
        engine_event ev = {.type = ENGINE_EV_TOKENS, .tokens = &id, .n_tokens = 1,
                           .text = r->pieces[n], .text_len = strlen(r->pieces[n])};
        r->fn(r->user, &ev);
    }
    engine_event done = {.type = ENGINE_EV_DONE, .finish = ENGINE_FINISH_STOP, .n_prompt = 3,
                         .n_gen = n};
    r->fn(r->user, &done);
    free(r);
    return NULL;
}

static int fake_submit(void *self, const engine_request *req, uint64_t *id)
{
    (void)self;
    run_ctx *r = malloc(sizeof *r);
    *r = (run_ctx){req->on_event, req->user, g_script};
    pthread_t th;
    pthread_create(&th, NULL, run_script, r);
    pthread_detach(th);
    *id = 1;
    return 0;
}

static int fake_cancel(void *self, uint64_t id)
{
    (void)self, (void)id;
    return 0;
}

static void fake_stats(void *self, engine_stats *out)
{
    (void)self;
    memset(out, 0, sizeof *out);
}

static int fake_encode_chat(void *self, const chat_msg *msgs, size_t n, const model_chat_extra *x,
                            chat_reply_fn reply, void *reply_user, int32_t **ids, size_t *n_ids)
{
    (void)self, (void)msgs, (void)n, (void)x, (void)reply, (void)reply_user;
    *ids = dx_malloc(3 * sizeof **ids);
    (*ids)[0] = 1, (*ids)[1] = 2, (*ids)[2] = 3;
    *n_ids = 3;
    return 0;
}

static int fake_encode_text(void *self, const char *text, size_t len, int32_t **ids,
                            size_t *n_ids)
{
    (void)text, (void)len;
    return fake_encode_chat(self, NULL, 0, NULL, NULL, NULL, ids, n_ids);
}

/* ---- the server on a loop thread ------------------------------------------ */

static struct {
    uv_loop_t loop;
    uv_async_t stop;
    node_server *srv;
    pthread_t th;
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int reasoning;
} S;

static void on_stop(uv_async_t *a)
{
    (void)a;
    node_server_shutdown(S.srv);
}

static void on_stopped(void *user)
{
    (void)user;
    node_server_destroy(S.srv);
    uv_close((uv_handle_t *)&S.stop, NULL);
}

static void *loop_main(void *arg)
{
    (void)arg;
    uv_loop_init(&S.loop);
    uv_async_init(&S.loop, &S.stop, on_stop);
    node_server_config cfg = {.port = 0, .on_stopped = on_stopped, .shutdown_grace_s = 1};
    DX_ASSERT(node_server_create(&S.loop, &cfg, &S.srv) == 0);
    node_backend be = {.submit = fake_submit, .cancel = fake_cancel, .stats = fake_stats,
                       .encode_chat = fake_encode_chat, .encode_text = fake_encode_text,
                       .model_name = "scripted", .n_vocab = 100, .n_ctx = 4096,
                       .tool_fmt = OAI_TOOLS_QWEN, .reasoning = S.reasoning};
    node_server_set_backend(S.srv, &be);
    pthread_mutex_lock(&S.mu);
    S.port = node_server_port(S.srv);
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    uv_run(&S.loop, UV_RUN_DEFAULT);
    uv_loop_close(&S.loop);
    return NULL;
}

static void start(int reasoning)
{
    memset(&S, 0, sizeof S);
    S.reasoning = reasoning;
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    pthread_create(&S.th, NULL, loop_main, NULL);
    pthread_mutex_lock(&S.mu);
    while (!S.port) pthread_cond_wait(&S.cv, &S.mu);
    pthread_mutex_unlock(&S.mu);
}

static void stop(void)
{
    uv_async_send(&S.stop);
    pthread_join(S.th, NULL);
    pthread_mutex_destroy(&S.mu);
    pthread_cond_destroy(&S.cv);
}

/* ---- requests ------------------------------------------------------------- */

#define TOOLS                                                                                      \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"    \
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]"

static json_t *post(const char *extra, int stream, dx_buf *raw)
{
    char body[1024];
    snprintf(body, sizeof body,
             "{\"model\":\"scripted\",\"stream\":%s%s%s,\"messages\":[{\"role\":\"user\","
             "\"content\":\"weather in Paris?\"}]}",
             stream ? "true" : "false", *extra ? "," : "", extra);
    dx_buf_reset(raw);
    assert_int_equal(tc_http(S.port, "POST", "/v1/chat/completions", body, raw, 20), 200);
    return stream ? NULL : tc_json(raw);
}

/* A stream's deltas folded together: content, reasoning, tool calls. */
typedef struct {
    dx_buf content, reasoning, args;
    char name[64], id[64], finish[32];
    int n_calls, role_chunks;
} folded;

static void fold(dx_buf *raw, folded *f)
{
    memset(f, 0, sizeof *f);
    dx_buf_init(&f->content, 0);
    dx_buf_init(&f->reasoning, 0);
    dx_buf_init(&f->args, 0);
    tc_terminate(raw);
    for (char *l = strstr(raw->data, "data: {"); l; l = strstr(l + 1, "data: {")) {
        json_error_t je;
        json_t *v = json_loadb(l + 6, strcspn(l + 6, "\n"), 0, &je);
        assert_non_null(v);
        json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
        json_t *d = json_object_get(ch, "delta"), *x;
        if ((x = json_object_get(d, "content")) && json_is_string(x))
            dx_buf_append(&f->content, json_string_value(x), json_string_length(x));
        if ((x = json_object_get(d, "reasoning_content")))
            dx_buf_append(&f->reasoning, json_string_value(x), json_string_length(x));
        if (json_object_get(d, "role")) f->role_chunks++;
        json_t *calls = json_object_get(d, "tool_calls"), *c;
        size_t i;
        json_array_foreach(calls, i, c)
        {
            json_t *fn = json_object_get(c, "function");
            if (json_object_get(c, "id")) { /* a call's head */
                f->n_calls++;
                assert_int_equal(json_integer_value(json_object_get(c, "index")), f->n_calls - 1);
                assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
                snprintf(f->id, sizeof f->id, "%s", json_string_value(json_object_get(c, "id")));
                snprintf(f->name, sizeof f->name, "%s",
                         json_string_value(json_object_get(fn, "name")));
            }
            x = json_object_get(fn, "arguments");
            if (x) dx_buf_append(&f->args, json_string_value(x), json_string_length(x));
        }
        x = json_object_get(ch, "finish_reason");
        if (json_is_string(x)) snprintf(f->finish, sizeof f->finish, "%s", json_string_value(x));
        json_decref(v);
    }
    tc_terminate(&f->content);
    tc_terminate(&f->reasoning);
    tc_terminate(&f->args);
    assert_non_null(strstr(raw->data, "data: [DONE]"));
}

static void fold_free(folded *f)
{
    dx_buf_free(&f->content);
    dx_buf_free(&f->reasoning);
    dx_buf_free(&f->args);
}

static const char *const k_call[] = {"Let me check.", "\n<tool", "_call>\n{\"name\": \"get_w",
                                     "eather\", \"arguments\": {\"city\": \"Par", "is\"}}\n</tool_",
                                     "call>", NULL};

static void test_tool_calls(void **state)
{
    (void)state;
    start(0);
    g_script = k_call;
    dx_buf raw;
    dx_buf_init(&raw, 0);
    /* not streamed: content, tool_calls, finish_reason tool_calls */
    json_t *v = post(TOOLS, 0, &raw);
    json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "Let me check.");
    json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 1);
    assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
    assert_true(!strncmp(json_string_value(json_object_get(call, "id")), "call_", 5));
    json_t *fn = json_object_get(call, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"city\":\"Paris\"}");
    json_decref(v);
    /* streamed: the same, as deltas */
    post(TOOLS, 1, &raw);
    folded f;
    fold(&raw, &f);
    assert_string_equal(f.content.data, "Let me check.");
    assert_int_equal(f.n_calls, 1);
    assert_string_equal(f.name, "get_weather");
    assert_string_equal(f.args.data, "{\"city\":\"Paris\"}");
    assert_string_equal(f.finish, "tool_calls");
    assert_int_equal(f.role_chunks, 1);
    fold_free(&f);
    /* no tools, or tool_choice none: the text as the model wrote it */
    const char *plain[] = {"", TOOLS ",\"tool_choice\":\"none\""};
    for (int i = 0; i < 2; i++) {
        v = post(plain[i], 0, &raw);
        ch = json_array_get(json_object_get(v, "choices"), 0);
        assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
        assert_non_null(strstr(json_string_value(json_object_get(json_object_get(ch, "message"),
                                                                 "content")),
                               "<tool_call>"));
        assert_null(json_object_get(json_object_get(ch, "message"), "tool_calls"));
        json_decref(v);
    }
    /* a call cut off is content, never dropped */
    static const char *const cut[] = {"<tool_call>\n{\"name\": \"get_weather\", \"argu", NULL};
    g_script = cut;
    v = post(TOOLS, 0, &raw);
    ch = json_array_get(json_object_get(v, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(ch, "message"), "content")),
                        cut[0]);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    json_decref(v);
    post(TOOLS, 1, &raw);
    fold(&raw, &f);
    assert_string_equal(f.content.data, cut[0]);
    assert_int_equal(f.n_calls, 0);
    fold_free(&f);
    dx_buf_free(&raw);
    stop();
}

static void test_reasoning(void **state)
{
    (void)state;
    start(1);
    static const char *const think[] = {"<thi", "nk>\nThe user wants", " weather.\n</th",
                                        "ink>\n\nIt is sunny.", NULL};
    g_script = think;
    dx_buf raw;
    dx_buf_init(&raw, 0);
    json_t *v = post("", 0, &raw);
    json_t *msg = json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")),
                        "The user wants weather.");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "It is sunny.");
    json_decref(v);
    post("", 1, &raw);
    folded f;
    fold(&raw, &f);
    assert_string_equal(f.reasoning.data, "The user wants weather.");
    assert_string_equal(f.content.data, "It is sunny.");
    assert_string_equal(f.finish, "stop");
    fold_free(&f);
    /* reasoning and a call in one answer */
    static const char *const both[] = {"<think>\nuse the tool\n</think>\n\n", "<tool_call>\n",
                                       "{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
                                       NULL};
    g_script = both;
    v = post(TOOLS, 0, &raw);
    json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
    msg = json_object_get(ch, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")), "use the tool");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls");
    json_decref(v);
    dx_buf_free(&raw);
    stop();
}

int main(void)
{
    oai_json_use_dx_alloc();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tool_calls),
        cmocka_unit_test(test_reasoning),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
