/* itest_up: `duplex up` as a user runs it — colocated mode with two decode
 * nodes on free ports: the summary lines name every process, a chat through
 * the printed URL gives what a node gives directly, SIGTERM stops everything
 * with exit 0 and leaves no child behind; a node that dies takes `up` down
 * with a non-zero exit that names it; bad flags exit 2.
 *
 * (The prefill/decode modes run in itest_bench and `make demo`'s test,
 * itest_demo; their command lines are unit-tested in test_router_launch.) */
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

#include "../test_client.h"
#include "../test_proc.h"
#include "base/dx_dtype.h"
#include "model/synth.h"

static struct {
    const char *bin;
    char dir[64], model[128];
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

static void start_up(up_run *u, const char *name)
{
    char log[160];
    snprintf(log, sizeof log, "%s/up-%s.log", G.dir, name);
    char *argv[] = {(char *)G.bin,
                    "up",
                    "--mode",
                    "colocated",
                    "--decode",
                    "2",
                    "--port",
                    "0",
                    "--model",
                    G.model,
                    "--kv-cache-mb",
                    "32",
                    "--threads-per-node",
                    "1",
                    NULL};
    assert_int_equal(tp_spawn(&u->p, log, argv), 0);
    u->port = (int)tp_wait_int(&u->p, "ready: http://127.0.0.1:", 120);
    if (u->port <= 0) {
        tp_log_tail(&u->p, 40);
        fail_msg("duplex up did not get ready");
    }
    const char *names[] = {"decode0", "decode1", "router"};
    for (int i = 0; i < 3; i++) summary(&u->p, names[i], &u->pid[i], &u->url_port[i]);
    assert_int_equal(u->url_port[2], u->port);
}

static void assert_gone(const up_run *u)
{
    for (int i = 0; i < 3; i++)
        if (kill(u->pid[i], 0) == 0 || errno != ESRCH)
            fail_msg("child pid %d is still there", u->pid[i]);
}

static char *chat_text(int port)
{
    dx_buf b, t;
    dx_buf_init(&b, 0);
    dx_buf_init(&t, 0);
    assert_int_equal(tc_http(port, "GET", "/v1/models", NULL, &b, 30), 200);
    json_t *v = tc_json(&b);
    char body[512];
    snprintf(
        body, sizeof body,
        "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello from up\"}],"
        "\"max_tokens\":12,\"temperature\":0}",
        json_string_value(json_object_get(json_array_get(json_object_get(v, "data"), 0), "id")));
    json_decref(v);
    assert_int_equal(tc_http(port, "POST", "/v1/chat/completions", body, &b, 120), 200);
    tc_answer_text(&b, 1, &t);
    char *s = strdup(t.data);
    dx_buf_free(&b);
    dx_buf_free(&t);
    return s;
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
    int st = tp_stop(&u.p, SIGTERM, 60);
    if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        tp_log_tail(&u.p, 30);
        fail_msg("duplex up: SIGTERM gave status %d, want exit 0", st);
    }
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
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
