/* itest_demo: the README's main command works — scripts/demo.sh (what
 * `make demo` runs) with the binary under test and the model in a temporary
 * directory must exit 0 and show each step's result: model info, generated
 * text, `duplex up` with its nodes, a streamed chat through the router, a
 * multi-turn conversation whose later turns reuse the history, the node
 * metrics showing that history pulled from the decode node, and the mode
 * comparison's table, headline ratios, summary.md and ttft.svg. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test_client.h"
#include "base/dx_buf.h"

static void test_demo(void **state)
{
    (void)state;
    const char *bin = getenv("DUPLEX_BIN");
    if (!bin) bin = "build/release/duplex";
    char dir[] = "/tmp/dx_itest_demo_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[512];
    /* the comparison on a smaller workload (the test runs every variant) */
    snprintf(cmd, sizeof cmd,
             "DUPLEX_BIN=%s DUPLEX_MODEL=%s/m.gguf DEMO_OUT=%s/out DEMO_BENCH_ARGS='--conversations 2 "
             "--turns 3 --prefix-tokens 300 --input-tokens 50 --output-tokens 16 --kv-cache-mb 256' "
             "bash scripts/demo.sh 2>&1",
             bin, dir, dir);
    dx_buf out;
    dx_buf_init(&out, 0);
    int st = tc_run_cmd(cmd, &out);
    char path[160];
    snprintf(path, sizeof path, "%s/out/summary.md", dir);
    int have_summary = access(path, R_OK) == 0;
    snprintf(path, sizeof path, "%s/out/ttft.svg", dir);
    int have_plot = access(path, R_OK) == 0;
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "cleanup of %s failed\n", dir);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("demo failed:\n%s", out.data);
    static const char *const want[] = {"architecture:    qwen3",
                                       "generated: 48 tokens",
                                       "duplex up: prefill0",
                                       "duplex up: decode0",
                                       "duplex up: ready: http://127.0.0.1:",
                                       "\"object\":\"chat.completion.chunk\"",
                                       "data: [DONE]",
                                       "turn  6  prompt",
                                       "from the decode node (",
                                       "superseded by the next turn",
                                       "duplex up: stopped",
                                       "== duplex bench compare",
                                       "| turn | uni-nocache | bidi | bidi-auto | colocated | "
                                       "uni-nocache / bidi |",
                                       "At the last turn, uni-nocache takes",
                                       "At the last turn, bidi takes",
                                       "At the last turn, bidi-auto takes"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out.data, want[i])) fail_msg("demo output lacks '%s':\n%s", want[i], out.data);
    /* the history really came from the decode node, and turns 2+ reused it */
    if (strstr(out.data, "pulled 0 from the decode node")) fail_msg("no D->P pull:\n%s", out.data);
    const char *t2 = strstr(out.data, "turn  2  prompt");
    long cached = t2 && strstr(t2, "cached") ? strtol(strstr(t2, "cached") + 6, NULL, 10) : 0;
    if (cached <= 0) fail_msg("turn 2 reused nothing:\n%s", out.data);
    if (!have_summary || !have_plot) fail_msg("no summary.md or ttft.svg left behind:\n%s", out.data);
    dx_buf_free(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_demo)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
