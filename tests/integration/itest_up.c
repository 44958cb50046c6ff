/* itest_up: `duplex up` as a user runs it — colocated mode with two decode
 * nodes on free ports: the summary lines name every process, a chat through
 * the printed URL gives what a node gives directly, SIGTERM stops everything
 * with exit 0 and leaves no child behind; a node that dies takes `up` down
 * with a non-zero exit that names it; bad flags exit 2.  In a P/D mode the
 * nodes' KV ports are authenticated with a fresh secret, mode 0600 in a run
 * folder of up's own that goes when up does, and a two-turn conversation
 * (whose KV moves through them) answers as a node does directly; in
 * bidirectional mode an agent's loop of constrained turns (forced tool
 * calls, tool results, a JSON-schema answer) answers exactly as one node.
 *
 * (The prefill/decode modes run in itest_bench and `make demo`'s test,
 * itest_demo; their command lines are unit-tested in test_router_launch.) */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../test_client.h"
#include "../test_proc.h"
#include "base/dx_dtype.h"
#include "model/synth.h"

static struct {
    const char *bin;
    char dir[64], model[128], name[128];
} G;

typedef struct {
    tp_proc p;
    int port;                /* the router's */
    int pid[3], url_port[3]; /* decode0, decode1, router */
} up_run;

/* The pid and port on the summary line of `name`. */
static void summary(const tp_proc *p, const char *name, int *pid, int *port)
{
    char buf[65536], key[64];
    tp_read_log(p, buf, sizeof buf);
    snprintf(key, sizeof key, "duplex up: %s ", name);
    const char *l = strstr(buf, key);
    if (!l) fail_msg("no summary line for %s:\n%s", name, buf);
    assert_int_equal(sscanf(strstr(l, " pid "), " pid %d http://127.0.0.1:%d", pid, port), 2);
}

/* mode "colocated": decode0, decode1 and the router; else prefill0,
 * decode0 and the router. */
static void start_up_mode(up_run *u, const char *name, const char *mode)
{
    char log[160];
    int colo = !strcmp(mode, "colocated");
    snprintf(log, sizeof log, "%s/up-%s.log", G.dir, name);
    char *argv[] = {(char *)G.bin, "up", "--mode", (char *)mode, "--decode", colo ? "2" : "1",
                    "--port", "0", "--model", G.model, "--kv-cache-mb", "32", "--threads-per-node",
                    "1", colo ? NULL : "--local-prefill-max-tokens", /* P/D: every turn via P */
                    "0",
                    /* ... and every reusable block pulled, whatever this
                     * machine's speed (the rule by costs has its own tests) */
                    "--kv-recompute-threshold", "1", NULL};
    assert_int_equal(tp_spawn(&u->p, log, argv), 0);
    u->port = (int)tp_wait_int(&u->p, "ready: http://127.0.0.1:", 120);
    if (u->port <= 0) {
        tp_log_tail(&u->p, 40);
        fail_msg("duplex up did not get ready");
    }
    const char *names[] = {colo ? "decode0" : "prefill0", colo ? "decode1" : "decode0", "router"};
    for (int i = 0; i < 3; i++) summary(&u->p, names[i], &u->pid[i], &u->url_port[i]);
    assert_int_equal(u->url_port[2], u->port);
}

static void start_up(up_run *u, const char *name)
{
    start_up_mode(u, name, "colocated");
}

static void assert_gone(const up_run *u)
{
    for (int i = 0; i < 3; i++)
        if (kill(u->pid[i], 0) == 0 || errno != ESRCH)
            fail_msg("child pid %d is still there", u->pid[i]);
}

/* The answer to one user message (text) at port. */
static char *chat_text_of(int port, const char *text)
{
    dx_buf b, t;
    dx_buf_init(&b, 0);
    dx_buf_init(&t, 0);
    assert_int_equal(tc_http(port, "GET", "/v1/models", NULL, &b, 30), 200);
    json_t *v = tc_json(&b);
    char body[1024];
    snprintf(
        body, sizeof body,
        "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],"
        "\"max_tokens\":12,\"temperature\":0}",
        json_string_value(json_object_get(json_array_get(json_object_get(v, "data"), 0), "id")),
        text);
    json_decref(v);
    assert_int_equal(tc_http(port, "POST", "/v1/chat/completions", body, &b, 120), 200);
    tc_answer_text(&b, 1, &t);
    char *s = strdup(t.data);
    dx_buf_free(&b);
    dx_buf_free(&t);
    return s;
}

static char *chat_text(int port)
{
    return chat_text_of(port, "Hello from up");
}

static void test_colocated_run_and_stop(void **state)
{
    (void)state;
    up_run u;
    start_up(&u, "stop");
    char *via = chat_text(u.port), *direct = chat_text(u.url_port[0]);
    assert_string_equal(via, direct);
    free(via);
    free(direct);
    if (tp_up_stop(&u.p, 60)) fail_msg("duplex up: SIGTERM did not end in exit 0");
    assert_gone(&u);
}

static void test_child_dies(void **state)
{
    (void)state;
    up_run u;
    start_up(&u, "dies");
    kill(u.pid[1], SIGKILL);
    int st = tp_stop(&u.p, 0, 60);
    assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) != 0);
    char want[96];
    snprintf(want, sizeof want, "decode1 (pid %d) was killed by signal 9", u.pid[1]);
    char buf[65536];
    tp_read_log(&u.p, buf, sizeof buf);
    if (!strstr(buf, want)) fail_msg("the log does not say '%s':\n%s", want, buf);
    assert_gone(&u);
}

static void test_pd_secret(void **state)
{
    (void)state;
    up_run u;
    start_up_mode(&u, "pd", "unidirectional");
    char buf[65536], secret[256] = "", dir[256];
    tp_read_log(&u.p, buf, sizeof buf);
    const char *k = strstr(buf, "fresh secret, ");
    if (k) sscanf(k + strlen("fresh secret, "), "%255s", secret);
    struct stat st;
    if (!secret[0] || stat(secret, &st)) fail_msg("no secret file named in:\n%s", buf);
    assert_int_equal(st.st_mode & 0777, 0600);
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(secret, '/') - secret), secret);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    /* both nodes authenticate their KV ports with it */
    const char *a = strstr(buf, "auth: secret"), *b = a ? strstr(a + 1, "auth: secret") : NULL;
    if (!b) fail_msg("the nodes' start-up lines do not both say 'auth: secret':\n%s", buf);
    for (int turn = 0; turn < 2; turn++) {
        /* long enough for whole KV blocks to move */
        const char *text = "the cache moves between nodes and every turn keeps its history while "
                           "agents call tools with long outputs that grow quickly so prefill work "
                           "matters more than decode for them";
        char *via = chat_text_of(u.port, text), *direct = chat_text_of(u.url_port[1], text);
        assert_string_equal(via, direct);
        free(via);
        free(direct);
    }
    /* the prompt's KV went from the prefill node to the decode node */
    assert_true(tc_metric(u.url_port[1], "duplex_kv_prompt_tokens_total{source=\"pulled\"}") > 0);
    assert_int_equal(tp_up_stop(&u.p, 60), 0);
    assert_gone(&u);
    if (stat(dir, &st) == 0) fail_msg("%s is still there after up exited", dir);
}

/* One agent step at port: the request (messages, tools and the step's
 * constraint) and the answer's message; fails unless it is 200. */
static json_t *agent_step(int port, json_t *msgs, json_t *tools, const char *constraint)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    char *m = json_dumps(msgs, JSON_COMPACT), *t = json_dumps(tools, JSON_COMPACT), *body = NULL;
    assert_true(asprintf(&body,
                         "{\"model\":\"%s\",\"messages\":%s,\"tools\":%s,%s,\"max_tokens\":120,"
                         "\"temperature\":1,\"seed\":9}",
                         G.name, m, t, constraint) > 0);
    long st = tc_http(port, "POST", "/v1/chat/completions", body, &b, 120);
    if (st != 200) fail_msg("status %ld: %s", st, b.data);
    json_t *v = tc_json(&b), *c = json_array_get(json_object_get(v, "choices"), 0);
    json_t *msg = json_deep_copy(json_object_get(c, "message"));
    json_object_set(msg, "finish_reason", json_object_get(c, "finish_reason"));
    json_decref(v);
    free(m);
    free(t);
    free(body);
    dx_buf_free(&b);
    return msg;
}

/* The call in an answer without its id (random per answer). */
static json_t *call_of(json_t *msg)
{
    json_t *c = json_deep_copy(json_array_get(json_object_get(msg, "tool_calls"), 0));
    json_object_del(c, "id");
    return c;
}

/* An agent's loop — forced call, tool result, named call, tool result, a
 * schema-constrained final answer — through `duplex up` in bidirectional
 * P/D mode (every turn prefilled on the prefill node, whose first token,
 * sampled under the same mask, the decode node feeds to its matcher)
 * answers exactly as the decode node alone. */
static void test_pd_agentic_loop(void **state)
{
    (void)state;
    up_run u;
    start_up_mode(&u, "agent", "bidirectional");
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(tc_http(u.port, "GET", "/v1/models", NULL, &b, 30), 200);
    json_t *mv = tc_json(&b);
    snprintf(
        G.name, sizeof G.name, "%s",
        json_string_value(json_object_get(json_array_get(json_object_get(mv, "data"), 0), "id")));
    json_decref(mv);
    json_error_t je;
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
        "\"object\",\"additionalProperties\":false,\"required\":[\"city\"],\"properties\":{"
        "\"city\":"
        "{\"type\":\"string\",\"maxLength\":8}}}}},{\"type\":\"function\",\"function\":{\"name\":"
        "\"add\",\"parameters\":{\"type\":\"object\",\"additionalProperties\":false,\"required\":"
        "[\"a\",\"b\"],\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}}}}"
        "}]",
        0, &je);
    json_t *msgs = json_pack(
        "[{s:s,s:s},{s:s,s:s}]", "role", "system", "content",
        "You are an agent. The cache moves between nodes and every turn keeps its history while "
        "agents call tools with long outputs that grow quickly so prefill work matters more than "
        "decode for them, which is why this system prompt is long enough to fill whole blocks.",
        "role", "user", "content", "What is the weather in Oslo, and what is 2 + 3?");
    const char *steps[] = {
        "\"tool_choice\":\"required\"",
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"add\"}}",
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"final\","
        "\"schema\":{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"done\"],"
        "\"properties\":{\"done\":{\"type\":\"boolean\"}}}}}"};
    for (int i = 0; i < 3; i++) {
        json_t *via = agent_step(u.port, msgs, tools, steps[i]);
        json_t *direct = agent_step(u.url_port[1], msgs, tools, steps[i]);
        const char *fin = json_string_value(json_object_get(via, "finish_reason"));
        if (i < 2) {
            json_t *cv = call_of(via), *cd = call_of(direct);
            if (!json_is_object(cv) || !json_equal(cv, cd) || strcmp(fin, "tool_calls"))
                fail_msg("step %d: P/D %s vs one node %s", i, json_dumps(via, 0),
                         json_dumps(direct, 0));
            json_decref(cv);
            json_decref(cd);
            json_t *call = json_array_get(json_object_get(via, "tool_calls"), 0);
            json_object_del(via, "finish_reason");
            json_array_append(msgs, via);
            json_array_append_new(msgs, json_pack("{s:s,s:O,s:s}", "role", "tool", "tool_call_id",
                                                  json_object_get(call, "id"), "content",
                                                  i ? "5" : "{\"temp\": 21}"));
        } else {
            const char *tv = json_string_value(json_object_get(via, "content"));
            json_t *ans = json_loads(tv ? tv : "", 0, &je);
            if (!json_equal(json_object_get(via, "content"), json_object_get(direct, "content")) ||
                !json_is_boolean(json_object_get(ans, "done")) || strcmp(fin, "stop"))
                fail_msg("final: P/D %s vs one node %s", json_dumps(via, 0), json_dumps(direct, 0));
            json_decref(ans);
        }
        json_decref(via);
        json_decref(direct);
    }
    /* the prompts' KV and the first tokens came from the prefill node */
    assert_true(tc_metric(u.url_port[1], "duplex_kv_prompt_tokens_total{source=\"pulled\"}") > 0);
    assert_true(tc_metric(u.url_port[1], "duplex_pd_first_token_from_prefill_total") > 0);
    assert_true(tc_metric(u.url_port[0], "duplex_grammar_masks_total") > 0);
    json_decref(msgs);
    json_decref(tools);
    dx_buf_free(&b);
    assert_int_equal(tp_up_stop(&u.p, 60), 0);
    assert_gone(&u);
}

static void expect(int want_rc, const char *phrase, const char *args)
{
    tp_expect(G.bin, "up", want_rc, phrase, args);
}

static void test_bad_flags(void **state)
{
    (void)state;
    expect(2, "--mode: 'sideways' is not a mode", "--mode sideways");
    expect(2, "colocated mode has no prefill nodes", "--mode colocated --prefill 1");
    expect(2, "--prefill 0: mode bidirectional needs prefill nodes", "--prefill 0");
    expect(2, "--decode 0 is out of range", "--decode 0");
    expect(2, "unknown option '--bogus'", "--bogus");
    expect(1, "/nonexistent.gguf", "--model /nonexistent.gguf");
}

static int setup(void **state)
{
    (void)state;
    G.bin = getenv("DUPLEX_BIN");
    if (!G.bin) G.bin = "build/release/duplex";
    snprintf(G.dir, sizeof G.dir, "/tmp/dx_itest_up_XXXXXX");
    if (!mkdtemp(G.dir)) return -1;
    snprintf(G.model, sizeof G.model, "%s/tiny.gguf", G.dir);
    synth_config c = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 2};
    return synth_write(&c, G.model) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", G.dir);
    return system(cmd) ? -1 : 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_colocated_run_and_stop),
        cmocka_unit_test(test_child_dies),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_pd_secret),
        cmocka_unit_test(test_pd_agentic_loop),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
