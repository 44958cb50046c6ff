/* itest_agents: agent loops through the three front doors, with the
 * official clients (tests/integration/node/agents.mjs): the openai SDK's
 * chat tool loop (its own assistant message appended, content null beside
 * the call), its Responses loop (previous_response_id chains, GET, DELETE,
 * store:false), the Anthropic SDK's Messages loop (tool_use / tool_result
 * blocks, countTokens) — each whole and streamed, forced tool choice so
 * calls happen, on tiny models with the real Qwen3 and Llama 3 vocabularies
 * and templates.
 *
 * For each family: every loop's answers through `duplex up` (prefill and
 * decode nodes, bidirectional KV, the prefill node without a prefix cache
 * of its own, every turn through it) equal, byte for byte, one node that
 * computes everything (prefix caching off); the prefill node pulled history
 * from the decode node; and the three doors, carrying the same
 * conversation, rendered the same prompts and gave the same answers. */
/* Not in the tsan variant (no duplex-test mark): itest_fronts and itest_pd run the same doors and
 * P/D paths under it; the npm clients under TSan took 2 minutes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../test_client.h"
#include "../test_proc.h"

static struct {
    const char *bin;
    char dir[64];
    char model[2][160];
} G;

static const char *const k_fam[] = {"qwen3", "llama3"};
static const char *const k_modes[] = {"chat", "responses", "messages"};

static char *sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    dx_buf b;
    dx_buf_init(&b, 0);
    int st = tc_run_cmd(cmd, &b);
    tc_terminate(&b);
    if (st != 0) fail_msg("%s: status %d\n%s", cmd, st, b.data ? b.data : "");
    char *r = strdup(b.data ? b.data : "");
    dx_buf_free(&b);
    return r;
}

/* One loop against the server at port: its record (what each turn said). */
static json_t *run_loop(const char *mode, int port)
{
    char *out = sh("cd tests/integration/node && node agents.mjs %s http://127.0.0.1:%d 3 2>&1",
                   mode, port);
    const char *rec = strstr(out, "RECORD ");
    if (!rec) fail_msg("%s: no record:\n%s", mode, out);
    json_error_t je;
    json_t *v = json_loads(rec + 7, 0, &je);
    if (!json_is_array(v)) fail_msg("%s: a broken record: %s", mode, je.text);
    free(out);
    return v;
}

/* `duplex up` with one prefill and one decode node, every turn through the
 * prefill node, which keeps no prefix cache: its history can only come from
 * the decode node.  The router's port, and the prefill node's. */
static void up_start(tp_proc *p, int w, int *prefill_port)
{
    char log[160];
    snprintf(log, sizeof log, "%s/up-%s.log", G.dir, k_fam[w]);
    char *argv[] = {
        (char *)G.bin,
        "up",
        "--model",
        G.model[w],
        "--port",
        "0",
        "--threads-per-node",
        "1",
        "--kv-cache-mb",
        "64",
        "--local-prefill-max-tokens",
        "0",
        "--kv-recompute-threshold", /* every reusable block pulled, whatever the speed */
        "1",
        "--prefill-no-prefix-caching",
        NULL};
    assert_int_equal(tp_spawn(p, log, argv), 0);
    p->http = (int)tp_wait_int(p, "ready: http://127.0.0.1:", 120);
    if (p->http <= 0) {
        tp_log_tail(p, 40);
        fail_msg("duplex up did not get ready");
    }
    char buf[1 << 16];
    tp_read_log(p, buf, sizeof buf);
    const char *l = strstr(buf, "duplex up: prefill0 ");
    assert_non_null(l);
    int pid;
    assert_int_equal(sscanf(strstr(l, " pid "), " pid %d http://127.0.0.1:%d", &pid, prefill_port),
                     2);
}

/* The turns' calls, prompt sizes and texts are the same whichever door
 * carried the conversation (a null text is the chat API's "no content"). */
static void same_conversation(json_t *const rec[3])
{
    for (size_t i = 0; i < json_array_size(rec[0]); i++) {
        json_t *a = json_array_get(rec[0], i);
        for (int m = 1; m < 3; m++) {
            json_t *b = json_array_get(rec[m], i);
            assert_non_null(b);
            if (json_object_get(a, "stream")) continue;
            const char *ta = json_string_value(json_object_get(a, "text"));
            const char *tb = json_string_value(json_object_get(b, "text"));
            if (!json_equal(json_object_get(a, "calls"), json_object_get(b, "calls")) ||
                !json_equal(json_object_get(a, "prompt"), json_object_get(b, "prompt")) ||
                strcmp(ta ? ta : "", tb ? tb : ""))
                fail_msg("turn %zu: %s and %s differ:\n%s\n%s", i, k_modes[0], k_modes[m],
                         json_dumps(a, 0), json_dumps(b, 0));
        }
    }
}

static void check_family(int w)
{
    json_t *single[3], *cluster[3];
    const char *argv[] = {
        "serve",     "--model", G.model[w],      "--port", "0",
        "--threads", "1",       "--kv-cache-mb", "64",     "--no-enable-prefix-caching",
        NULL};
    char log[160];
    snprintf(log, sizeof log, "%s/serve-%s.log", G.dir, k_fam[w]);
    tp_proc S;
    tp_start(&S, G.bin, log, argv, "duplex serve:");
    for (int m = 0; m < 3; m++) single[m] = run_loop(k_modes[m], S.http);
    assert_int_equal(tp_stop_clean(&S), 0);
    same_conversation(single);

    tp_proc U;
    int pport;
    up_start(&U, w, &pport);
    for (int m = 0; m < 3; m++) {
        cluster[m] = run_loop(k_modes[m], U.http);
        if (!json_equal(single[m], cluster[m]))
            fail_msg("%s %s: the cluster's answers differ from one node's:\n%s\n%s", k_fam[w],
                     k_modes[m], json_dumps(single[m], 0), json_dumps(cluster[m], 0));
    }
    /* from the second turn on, the prefill node pulled the history */
    double pulled = tc_metric_or(pport, "duplex_kv_prompt_tokens_total{source=\"pulled\"}", -1);
    if (!(pulled > 0)) {
        tp_log_tail(&U, 60);
        fail_msg("%s: the prefill node pulled %.0f tokens", k_fam[w], pulled);
    }
    assert_int_equal(tp_stop_clean(&U), 0);
    for (int m = 0; m < 3; m++) {
        json_decref(single[m]);
        json_decref(cluster[m]);
    }
}

static void test_qwen3(void **state)
{
    (void)state;
    check_family(0);
}

static void test_llama3(void **state)
{
    (void)state;
    check_family(1);
}

static int setup(void **state)
{
    (void)state;
    G.bin = getenv("DUPLEX_BIN");
    if (!G.bin) G.bin = "build/release/duplex";
    snprintf(G.dir, sizeof G.dir, "/tmp/dx_itest_agents_XXXXXX");
    if (!mkdtemp(G.dir)) return -1;
    for (int w = 0; w < 2; w++) {
        char *p = sh("cd tests/integration/node && node tok_ref.mjs %s path", k_fam[w]);
        p[strcspn(p, "\n")] = 0;
        snprintf(G.model[w], sizeof G.model[w], "%s/%s.gguf", G.dir, k_fam[w]);
        free(sh("%s model synth --arch %s --preset tiny --dtype bf16 --tokenizer %s/tokenizer.json "
                "-o %s 2>&1",
                G.bin, w ? "llama" : "qwen3", p, G.model[w]));
        free(p);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (!getenv("DX_KEEP_LOGS")) tp_rm_rf(G.dir);
    return 0;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama3),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    curl_global_cleanup();
    return rc;
}
