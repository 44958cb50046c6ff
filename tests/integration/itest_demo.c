/* itest_demo: the README's main command works — scripts/demo.sh (what
 * `make demo` runs) with the binary under test and the model in a temporary
 * directory must exit 0 and show each step's result: model info, tokens,
 * generated text, a served chat (plain and streamed) and a second turn with
 * cached prompt tokens. */
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
    snprintf(cmd, sizeof cmd, "DUPLEX_BIN=%s DUPLEX_MODEL=%s/m.gguf bash scripts/demo.sh 2>&1", bin,
             dir);
    dx_buf out;
    dx_buf_init(&out, 0);
    int st = tc_run_cmd(cmd, &out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "cleanup of %s failed\n", dir);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("demo failed:\n%s", out.data);
    static const char *const want[] = {
        "architecture:    qwen3", "tokens, ", "generated: 48 tokens", "duplex serve: model=",
        "\"object\":\"chat.completion\"", "data: [DONE]", "\"cached_tokens\":16",
        "shutdown: all requests finished"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out.data, want[i])) fail_msg("demo output lacks '%s':\n%s", want[i], out.data);
    dx_buf_free(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_demo)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
