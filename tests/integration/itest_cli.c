/* itest_cli: the duplex binary's commands as a user runs them — synth →
 * info → tokenize → decode → generate on a real file, and every bad flag or
 * bad file rejected with exit status 2 (usage) or 1 (failure) and a message
 * that names what was wrong. */
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

static const char *g_bin;
static char g_dir[64], g_model[128];

/* Runs `duplex ARGS` through the shell, capturing stdout+stderr. */
static int run(char *out, size_t cap, const char *fmt, ...)
{
    char args[1024], cmd[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    /* stderr joins stdout unless the arguments redirect it themselves */
    snprintf(cmd, sizeof cmd, "%s %s%s", g_bin, args, strstr(args, "2>") ? "" : " 2>&1");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect(int want_rc, const char *phrase, const char *fmt, const char *arg)
{
    char out[65536];
    int rc = run(out, sizeof out, fmt, arg);
    if (rc != want_rc || !strstr(out, phrase))
        fail_msg("duplex %s: exit %d (want %d), output lacks '%s':\n%s", arg, rc, want_rc, phrase,
                 out);
}

static int setup(void **state)
{
    (void)state;
    g_bin = getenv("DUPLEX_BIN");
    if (!g_bin) g_bin = "build/release/duplex";
    strcpy(g_dir, "/tmp/dx_itest_cli_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_model, sizeof g_model, "%s/m.gguf", g_dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) ? -1 : 0;
}

static void test_user_path(void **state)
{
    (void)state;
    char out[65536], a[1024];
    assert_int_equal(run(out, sizeof out, "model synth --arch llama --preset tiny --dtype q8_0 "
                                          "--seed 9 -o %s", g_model), 0);
    assert_int_equal(run(out, sizeof out, "model info %s", g_model), 0);
    const char *want[] = {"architecture:    llama", "layers:          2", "q8_0",
                          "pre-tokenizer llama-bpe", "chat template:   llama3", "parameters:"};
    for (size_t i = 0; i < 6; i++)
        if (!strstr(out, want[i])) fail_msg("model info lacks '%s':\n%s", want[i], out);
    /* tokenize → ids → decode gives the text back */
    assert_int_equal(run(out, sizeof out, "tokenize --model %s --ids --text 'Hello, KV world! 12345'",
                         g_model), 0);
    out[strcspn(out, "\n")] = 0;
    assert_true(strlen(out) < 512);
    snprintf(a, sizeof a, "tokenize --model %s --decode --text '%.512s'", g_model, out);
    char dec[4096];
    assert_int_equal(run(dec, sizeof dec, "%s", a), 0);
    assert_string_equal(dec, "Hello, KV world! 12345\n");
    /* special tokens only when asked */
    assert_int_equal(run(out, sizeof out, "tokenize --model %s --special --text '<|eot_id|>'",
                         g_model), 0);
    assert_non_null(strstr(out, "1 tokens"));
    assert_int_equal(run(out, sizeof out, "tokenize --model %s --text '<|eot_id|>'", g_model), 0);
    assert_null(strstr(out, "1 tokens"));
    /* generate: 6 tokens, greedy, twice the same */
    char g1[4096], g2[4096];
    assert_int_equal(run(g1, sizeof g1, "generate --model %s --chat hi -n 6 2>/dev/null", g_model), 0);
    assert_int_equal(run(g2, sizeof g2, "generate --model %s --chat hi -n 6 2>/dev/null", g_model), 0);
    assert_string_equal(g1, g2);
    assert_int_equal(run(out, sizeof out, "generate --model %s --prompt hi -n 6 --temp 0.8 "
                                          "--seed 3 --top-k 20 --top-p 0.9 --min-p 0.05", g_model), 0);
    assert_non_null(strstr(out, "generated: 6 tokens"));
}

static void test_bad_flags(void **state)
{
    (void)state;
    char m[256];
    snprintf(m, sizeof m, "%s", g_model);
    expect(2, "unknown command 'frobnicate'", "%s", "frobnicate");
    expect(2, "unknown option '--bogus'", "model synth --bogus 1 -o /tmp/x%s", "");
    expect(2, "unknown --preset", "model synth --preset 7b -o /tmp/x%s", "");
    expect(2, "unknown architecture 'gpt2'", "model synth --arch gpt2 -o /tmp/x%s", "");
    expect(2, "unknown dtype 'q4_0'", "model synth --dtype q4_0 -o /tmp/x%s", "");
    expect(2, "-o FILE is required", "model synth%s", "");
    expect(2, "--seed wants a non-negative integer", "model synth --seed -4 -o /tmp/x%s", "");
    expect(2, "--model FILE is required", "tokenize --text hi%s", "");
    expect(2, "--temp wants a number, got 'hot'",
           "generate --model /tmp/x --prompt hi --temp hot%s", "");
    expect(2, "--n 0 is out of range", "generate --model /tmp/x --prompt hi -n 0%s", "");
    expect(2, "exactly one of --prompt / --chat", "generate --model /tmp/x%s", "");
    expect(2, "--port needs a value", "serve --model /tmp/x --port%s", "");
    expect(2, "--port 70000 is out of range", "serve --model /tmp/x --port 70000%s", "");
    expect(2, "KV cache dtype 'q8_0' is not supported", "serve --model /tmp/x --kv-dtype q8_0%s", "");
    expect(2, "--role wants prefill|decode|both, got 'leader'", "serve --model /tmp/x --role leader%s",
           "");
    expect(2, "contradict", "serve --model /tmp/x --enable-prefix-caching "
                            "--no-enable-prefix-caching%s", "");
    expect(2, "--bidirectional-kv-xfer takes no value",
           "serve --model /tmp/x --bidirectional-kv-xfer=yes%s", "");
    expect(2, "--decoder-kv-blocks-ttl 0 is out of range",
           "serve --model /tmp/x --decoder-kv-blocks-ttl 0%s", "");
    expect(2, "--kv-recompute-threshold wants an integer, got 'many'",
           "serve --model /tmp/x --kv-recompute-threshold many%s", "");
    expect(2, "--kv-lease-ttl -1 is out of range", "serve --model /tmp/x --kv-lease-ttl -1%s", "");
    expect(2, "--engine-id must be 1..128 bytes", "serve --model /tmp/x --engine-id ''%s", "");
    expect(2, "usage: duplex bench engine|xfer|chat", "bench%s", "");
    expect(2, "--url wants http://HOST:PORT", "bench chat --url ftp://x%s", "");
    expect(1, "duplex bench chat: http://127.0.0.1:1/v1/models", "bench chat --url "
                                                                "http://127.0.0.1:1%s", "");
    char a[400];
    snprintf(a, sizeof a, "tokenize --model %s --decode --text '1 2 x3'", m);
    expect(2, "bad token id at byte 4", "%s", a);
    snprintf(a, sizeof a, "tokenize --model %s --decode --text '99999999'", m);
    expect(1, "99999999", "%s", a);
}

static void test_bad_files(void **state)
{
    (void)state;
    char bad[160], a[400];
    expect(1, "/nonexistent.gguf", "model info /nonexistent.gguf%s", "");
    /* not a GGUF file */
    snprintf(bad, sizeof bad, "%s/text.gguf", g_dir);
    FILE *f = fopen(bad, "w");
    fputs("this is not a model, just some text in a file\n", f);
    fclose(f);
    snprintf(a, sizeof a, "model info %s", bad);
    expect(1, "offset 0", "%s", a);
    /* a real model cut in half: the error names the file and an offset */
    snprintf(a, sizeof a, "sh -c 'head -c 30000 %s > %s/half.gguf'", g_model, g_dir);
    assert_int_equal(system(a), 0);
    snprintf(a, sizeof a, "generate --model %s/half.gguf --prompt hi", g_dir);
    expect(1, "half.gguf", "%s", a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_user_path),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
