/* itest_errors: errors a user can cause print a message of their own that
 * names what was wrong — the field, the value, the file, the address —
 * over HTTP from a node, through a router, and from the CLI.  The HTTP
 * cases run back to back on one server, each failing somewhere else
 * (request parsing, kv_transfer_params, the chat template, the context),
 * so a message left over from the previous failure would show: every
 * answer must name its own problem and not the one before.  (Each error
 * path in src/ sets its message when it returns: scripts/check_errs.sh.) */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pd_test.h"

/* A template that refuses some conversations, as real ones do
 * (raise_exception), with two different reasons. */
static const char k_tmpl[] =
    "{%- if messages[0].role == 'system' %}"
    "{{ raise_exception('this template takes no system message') }}{% endif %}"
    "{%- if messages | length > 3 %}{{ raise_exception('at most 3 messages') }}{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

typedef struct {
    const char *path, *body; /* %s in body: the model's name */
    long status;
    const char *say, *param; /* the message must contain `say`; param: NULL = any */
} http_case;

static void check_answer(int port, const http_case *c, const char *prev_say)
{
    char body[1024];
    snprintf(body, sizeof body, c->body, G.model_name);
    dx_buf b;
    dx_buf_init(&b, 0);
    long st = tc_http(port, "POST", c->path, body, &b, 60);
    json_t *v = tc_json(&b);
    const char *msg = json_string_value(json_object_get(json_object_get(v, "error"), "message"));
    const char *param = json_string_value(json_object_get(json_object_get(v, "error"), "param"));
    if (st != c->status || !msg || !strstr(msg, c->say) || (prev_say && strstr(msg, prev_say)) ||
        (c->param && (!param || strcmp(param, c->param))))
        fail_msg("POST %s %s: %ld %s\nwant %ld, a message with '%s'%s%s%s", c->path, body, st,
                 b.data, c->status, c->say, prev_say ? " and without '" : "",
                 prev_say ? prev_say : "", prev_say ? "'" : "");
    json_decref(v);
    dx_buf_free(&b);
}

static void run_cases(int port, const http_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) check_answer(port, &cases[i], i ? cases[i - 1].say : NULL);
}

#define CHAT      "/v1/chat/completions"
#define CMPL      "/v1/completions"
#define MSG(r, c) "{\"role\":\"" r "\",\"content\":\"" c "\"}"

static const http_case k_node_cases[] = {
    {CHAT, "{\"model\":", 400, "invalid JSON at line 1, column 9", NULL},
    {CHAT, "{\"model\":\"%s\",\"messages\":[" MSG("wizard", "x") "]}", 400,
     "messages[0].role: unknown role 'wizard'", "messages[0]"},
    {CHAT, "{\"model\":\"%s\",\"messages\":[" MSG("system", "s") "," MSG("user", "u") "]}", 400,
     "this template takes no system message", "messages"},
    {CMPL, "{\"model\":\"%s\",\"prompt\":\"x\",\"max_tokens\":-4}", 400,
     "max_tokens: -4 is out of range", "max_tokens"},
    {CHAT,
     "{\"model\":\"%s\",\"messages\":[" MSG("user", "a") "," MSG("assistant", "b") "," MSG(
         "user", "c") "," MSG("assistant", "d") "]}",
     400, "at most 3 messages", "messages"},
    {CMPL, "{\"model\":\"%s\",\"prompt\":\"x\",\"kv_transfer_params\":{\"remote_port\":70000}}",
     400, "kv_transfer_params.remote_port: 70000 is out of range",
     "kv_transfer_params.remote_port"},
    {CMPL, "{\"model\":\"%s\",\"prompt\":[1,2,99999999]}", 400, "prompt[2]: 99999999", "prompt"},
    {CMPL, "{\"model\":\"%s\",\"prompt\":\"x\",\"max_tokens\":50000}", 400,
     "exceeds the context length", "max_tokens"},
    {CMPL,
     "{\"model\":\"%s\",\"prompt\":\"x\",\"kv_transfer_params\":{\"remote_lease\":\"not hex\"}}",
     400, "kv_transfer_params.remote_lease", "kv_transfer_params.remote_lease"},
    {CHAT, "{\"model\":\"nope\",\"messages\":[" MSG("user", "x") "]}", 404,
     "The model 'nope' does not exist", "model"},
    {CMPL, "{\"model\":\"%s\",\"prompt\":\"x\",\"logit_bias\":{\"abc\":1}}", 400,
     "logit_bias: key 'abc'", "logit_bias.abc"},
};

/* A node with a KV port (so kv_transfer_params are read) and the template. */
static void test_node_http(void **state)
{
    (void)state;
    char tmpl[160];
    snprintf(tmpl, sizeof tmpl, "%s/refusing.jinja", G.dir);
    FILE *f = fopen(tmpl, "w");
    assert_non_null(f);
    fputs(k_tmpl, f);
    fclose(f);
    const char *extra[] = {"--kv-port", "0", "--ctx", "256", "--chat-template", tmpl, NULL};
    tp_proc n;
    node_start(&n, "node", extra);
    run_cases(n.http, k_node_cases, DX_ARRAY_LEN(k_node_cases));
    /* the node still serves */
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "hi");
    json_t *body = chat_body(msgs, 2);
    json_decref(post(&n, body, 200));
    json_decref(body);
    json_decref(msgs);
    stop_ok(&n);
}

/* A router passes a node's refusal on as it is, and names its own. */
static void test_router_http(void **state)
{
    (void)state;
    tp_proc n, r;
    node_start(&n, "rnode", NULL);
    char url[64], log[160];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", n.http);
    snprintf(log, sizeof log, "%s/router.log", G.dir);
    const char *argv[] = {"router", "--decode", url, "--port", "0", NULL};
    tp_start(&r, G.bin, log, argv, "duplex router:");
    dx_buf b;
    dx_buf_init(&b, 0);
    for (int i = 0; i < 1200 && tc_http(r.http, "GET", "/health", NULL, &b, 10) != 200; i++)
        tp_sleep_ms(50);
    dx_buf_free(&b);
    static const http_case cases[] = {
        {CHAT, "{\"model\":\"%s\",\"messages\":[" MSG("wizard", "x") "]}", 400,
         "messages[0].role: unknown role 'wizard'", "messages[0]"},
        {CMPL, "{\"model\":\"%s\",\"prompt\":\"x\",\"temperature\":\"hot\"}", 400,
         "temperature: expected a number", "temperature"},
        {CMPL, "{\"model\":\"%s\",\"prompt\":\"x\",\"max_tokens\":50000}", 400,
         "exceeds the context length", "max_tokens"},
        {CHAT, "[1,2]", 400, "request body must be a JSON object", NULL},
    };
    run_cases(r.http, cases, DX_ARRAY_LEN(cases));
    stop_ok(&r);
    stop_ok(&n);
}

/* The CLI: a failure deep in the library reaches the user with its detail. */
static void test_cli(void **state)
{
    (void)state;
    char a[512], tmpl[160];
    tp_expect(G.bin, "kv pull", 1, "KV port 127.0.0.1:1: connect",
              "--port 1 --token 00112233445566778899aabbccddeeff --remote 0-3");
    tp_expect(G.bin, "kv pull", 2, "bad block list 'x-' (want e.g. 0-3,7)",
              "--port 1 --token 00112233445566778899aabbccddeeff --remote x-");
    snprintf(a, sizeof a, "--model %s --chat hi --chat-template %s/none.jinja", G.model, G.dir);
    tp_expect(G.bin, "generate", 1, "none.jinja: No such file or directory", a);
    snprintf(tmpl, sizeof tmpl, "%s/broken.jinja", G.dir);
    FILE *f = fopen(tmpl, "w");
    assert_non_null(f);
    fputs("{% for m in messages %}\n{{ m.content }\n", f);
    fclose(f);
    snprintf(a, sizeof a, "--model %s --chat hi --chat-template %s", G.model, tmpl);
    tp_expect(G.bin, "generate", 1, "broken.jinja) cannot be run", a);
    tp_expect(G.bin, "generate", 1, "line 2, column", a);
    snprintf(tmpl, sizeof tmpl, "%s/refusing.jinja", G.dir);
    f = fopen(tmpl, "w");
    assert_non_null(f);
    fputs("{{ raise_exception('no chat with this model') }}", f);
    fclose(f);
    snprintf(a, sizeof a, "--model %s --chat hi --chat-template %s -n 1", G.model, tmpl);
    tp_expect(G.bin, "generate", 1, "no chat with this model", a);
    tp_expect(G.bin, "generate", 1, "/nonexistent.gguf: cannot open",
              "--model /nonexistent.gguf --prompt hi");
    snprintf(a, sizeof a, "--model %s --prompt hi --ctx 100000000", G.model);
    tp_expect(G.bin, "generate", 2, "--ctx", a);
}

static int setup(void **state)
{
    (void)state;
    return pdt_setup("errors");
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_http),
        cmocka_unit_test(test_router_http),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
