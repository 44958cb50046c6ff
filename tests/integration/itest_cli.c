/* itest_cli: the duplex binary's commands as a user runs them — synth →
 * info → tokenize → decode → generate on a real file, and every bad flag or
 * bad file rejected with exit status 2 (usage) or 1 (failure) and a message
 * that names what was wrong, the flag spelled as the user typed it; help of
 * commands and command groups. */
/* duplex-test: tsan */
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

#include "../test_proc.h"

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
    return tp_capture(cmd, out, cap);
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
    return tp_rm_rf(g_dir);
}

static void test_user_path(void **state)
{
    (void)state;
    char out[65536], a[1024];
    assert_int_equal(run(out, sizeof out,
                         "model synth --arch llama --preset tiny --dtype q8_0 "
                         "--seed 9 -o %s",
                         g_model),
                     0);
    assert_int_equal(run(out, sizeof out, "model info %s", g_model), 0);
    const char *want[] = {"architecture:    llama",  "layers:          2",      "q8_0",
                          "pre-tokenizer llama-bpe", "chat template:   llama3", "parameters:"};
    for (size_t i = 0; i < 6; i++)
        if (!strstr(out, want[i])) fail_msg("model info lacks '%s':\n%s", want[i], out);
    /* qwen3's rope base, 1e6, is a whole number and shows as one */
    assert_int_equal(run(out, sizeof out,
                         "model synth --preset tiny -o %s/q.gguf && %s model info "
                         "%s/q.gguf",
                         g_dir, g_bin, g_dir),
                     0);
    if (!strstr(out, "rope:            base 1000000, neox\n")) fail_msg("rope base:\n%s", out);
    /* a llama file asks for BOS (tokenizer.ggml.add_bos_token): a raw prompt gets it */
    assert_int_equal(run(out, sizeof out, "tokenize --model %s --text 'Hello'", g_model), 0);
    if (strncmp(out + strspn(out, " 0123456789"), "'<|begin_of_text|>'", 19))
        fail_msg("no BOS first:\n%s", out);
    /* tokenize → ids → decode gives the text back */
    assert_int_equal(run(out, sizeof out,
                         "tokenize --model %s --ids --no-bos --text 'Hello, KV "
                         "world! 12345'",
                         g_model),
                     0);
    out[strcspn(out, "\n")] = 0;
    assert_true(strlen(out) < 512);
    snprintf(a, sizeof a, "tokenize --model %s --decode --text '%.512s'", g_model, out);
    char dec[4096];
    assert_int_equal(run(dec, sizeof dec, "%s", a), 0);
    assert_string_equal(dec, "Hello, KV world! 12345\n");
    /* special tokens only when asked */
    assert_int_equal(run(out, sizeof out,
                         "tokenize --model %s --special --no-bos --text "
                         "'<|eot_id|>'",
                         g_model),
                     0);
    assert_non_null(strstr(out, "1 tokens"));
    assert_int_equal(
        run(out, sizeof out, "tokenize --model %s --no-bos --text '<|eot_id|>'", g_model), 0);
    assert_null(strstr(out, "1 tokens"));
    /* generate: 6 tokens, greedy, twice the same */
    char g1[4096], g2[4096];
    assert_int_equal(run(g1, sizeof g1, "generate --model %s --chat hi -n 6 2>/dev/null", g_model),
                     0);
    assert_int_equal(run(g2, sizeof g2, "generate --model %s --chat hi -n 6 2>/dev/null", g_model),
                     0);
    assert_string_equal(g1, g2);
    assert_int_equal(run(out, sizeof out,
                         "generate --model %s --prompt hi -n 6 --temp 0.8 "
                         "--seed 3 --top-k 20 --top-p 0.9 --min-p 0.05",
                         g_model),
                     0);
    assert_non_null(strstr(out, "generated: 6 tokens"));
    /* a q4_0 model end to end: its types shown by role, and pinned greedy
     * text, the same on every kernel ISA (the block-format kernels are
     * bit-identical to their scalar twins) */
    char q4[300];
    snprintf(q4, sizeof q4, "%s/q4.gguf", g_dir);
    assert_int_equal(run(out, sizeof out,
                         "model synth --preset tiny --dtype q4_0 --seed 9 -o %s "
                         "&& %s model info %s",
                         q4, g_bin, q4),
                     0);
    if (!strstr(out,
                "weights:         attn_*: q4_0; ffn_*: q4_0; token_embd: q4_0; output: q4_0\n"))
        fail_msg("model info of a q4_0 model:\n%s", out);
    static const char *const isas[] = {"scalar", "avx2", "avx512"};
    for (size_t i = 0; i < 3; i++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "DUPLEX_KERNELS=%s %s generate --model %s --prompt 'Hello, world' -n 12 "
                 "2>/dev/null",
                 isas[i], g_bin, q4);
        assert_int_equal(tp_capture(cmd, out, sizeof out), 0);
        assert_string_equal(out, " res builab wh pair builab wh pair\tze that\n");
    }
}

/* The tiny mixture of experts as a user runs it: synth (qwen3moe by
 * default, llama on request), info shows the experts, and `duplex
 * generate`'s greedy text with the scalar kernels is pinned (the same bytes
 * on any x86 CPU); a dense preset is refused as qwen3moe, --layers gives
 * the layers asked for. */
static void test_moe_user_path(void **state)
{
    (void)state;
    char out[65536];
    assert_int_equal(run(out, sizeof out,
                         "model synth --preset tiny-moe --seed 42 -o %s/moe.gguf && "
                         "%s model info %s/moe.gguf",
                         g_dir, g_bin, g_dir),
                     0);
    const char *want[] = {"architecture:    qwen3moe", "active per token",
                          "experts:         8, 2 used per token, expert feed-forward 96",
                          "weights normalised to sum 1", "q/k norm"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i])) fail_msg("model info lacks '%s':\n%s", want[i], out);
    assert_int_equal(run(out, sizeof out,
                         "generate --model %s/moe.gguf --prompt 'The prefill node' -n 12 "
                         "2>/dev/null",
                         g_dir),
                     0);
    char pinned[4096];
    assert_int_equal(run(pinned, sizeof pinned,
                         "generate --model %s/moe.gguf --prompt 'The prefill node' -n 12 "
                         "2>/dev/null",
                         g_dir),
                     0);
    assert_string_equal(out, pinned); /* the same twice, whatever the ISA */
    setenv("DUPLEX_KERNELS", "scalar", 1);
    int rc =
        run(out, sizeof out,
            "generate --model %s/moe.gguf --prompt 'The prefill node' -n 12 2>/dev/null", g_dir);
    char ids[4096];
    int rc_ids = run(ids, sizeof ids,
                     "generate --model %s/moe.gguf --prompt 'The prefill node' -n 12 --ids "
                     "2>/dev/null",
                     g_dir);
    unsetenv("DUPLEX_KERNELS");
    assert_int_equal(rc, 0);
    assert_int_equal(rc_ids, 0); /* the same tokens, as ids */
    assert_string_equal(ids, "849 488 155 136 548 827 325 589 573 207 759 317 \n");
    assert_string_equal(out,
                        "odelsistant\xef\xbf\xbd\xef\xbf\xbd <appendcksonak\xef\xbf\xbd Th--\n");
    assert_int_equal(run(out, sizeof out,
                         "model synth --arch llama --preset tiny-moe --layers 3 --dtype q8_0 -o "
                         "%s/lmoe.gguf && %s model info %s/lmoe.gguf",
                         g_dir, g_bin, g_dir),
                     0);
    if (!strstr(out, "architecture:    llama") || !strstr(out, "layers:          3") ||
        !strstr(out, "experts:         8, 2 used"))
        fail_msg("model info of the llama MoE:\n%s", out);
    assert_int_equal(run(out, sizeof out, "generate --model %s/lmoe.gguf --chat hi -n 4", g_dir),
                     0);
    assert_non_null(strstr(out, "generated: 4 tokens"));
    expect(1, "qwen3moe needs a mixture-of-experts preset (tiny-moe|tiny-moe-k|qwen3-30b-a3b), not tiny",
           "model synth --arch qwen3moe --preset tiny -o /tmp/x%s", "");
    expect(1,
           "preset tiny-moe is a mixture of experts: its architecture is qwen3moe or llama, "
           "not qwen2",
           "model synth --arch qwen2 --preset tiny-moe -o /tmp/x%s", "");
    /* a llama-quantize preset's types, listed without writing (no -o) */
    expect(0, "blk.1.ffn_down.weight            q6_K    [256, 128]\n",
           "model synth --preset tiny --dtype q4_k_m --dry-run%s", "");
    expect(0, "\n25 tensors, 13 of them fell back to another type; general.file_type 15\n",
           "model synth --preset tiny --dtype q4_k_m --dry-run%s", "");
}

static void test_bad_flags(void **state)
{
    (void)state;
    char m[256];
    snprintf(m, sizeof m, "%s", g_model);
    expect(2, "unknown command 'frobnicate'", "%s", "frobnicate");
    expect(2, "unknown option '--bogus'", "model synth --bogus 1 -o /tmp/x%s", "");
    expect(2,
           "--preset: unknown preset '7b' (want "
           "tiny|tiny-k|small|0.6b|qwen3-0.6b|llama3.2-1b|tiny-moe|tiny-moe-k|qwen3-30b-a3b)",
           "model synth --preset 7b -o /tmp/x%s", "");
    expect(2, "unknown architecture 'gpt2'", "model synth --arch gpt2 -o /tmp/x%s", "");
    expect(2, "unknown dtype 'int4'", "model synth --dtype int4 -o /tmp/x%s", "");
    expect(2, "-o FILE is required", "model synth%s", "");
    expect(2, "--seed wants a non-negative integer", "model synth --seed -4 -o /tmp/x%s", "");
    expect(2, "--model FILE is required", "tokenize --text hi%s", "");
    expect(2, "--temp wants a number, got 'hot'",
           "generate --model /tmp/x --prompt hi --temp hot%s", "");
    expect(2, "give the text: --prompt S (raw) or --chat S", "generate --model /tmp/x%s", "");
    expect(2, "--prompt and --chat exclude each other",
           "generate --model /tmp/x --prompt a --chat b%s", "");
    expect(2, "duplex generate: --model FILE is required", "generate --prompt hi%s", "");
    expect(2, "--port needs a value", "serve --model /tmp/x --port%s", "");
    expect(2, "--port 70000 is out of range", "serve --model /tmp/x --port 70000%s", "");
    expect(2, "KV cache dtype 'q4_0' is not supported", "serve --model /tmp/x --kv-dtype q4_0%s", "");
    expect(2, "KV cache dtype 'f8' is not supported", "up --kv-dtype f8%s", "");
    expect(2, "--role wants prefill|decode|both, got 'leader'", "serve --model /tmp/x --role leader%s",
           "");
    expect(2, "contradict", "serve --model /tmp/x --enable-prefix-caching "
                            "--no-enable-prefix-caching%s", "");
    expect(2, "--bidirectional-kv-xfer takes no value",
           "serve --model /tmp/x --bidirectional-kv-xfer=yes%s", "");
    expect(2, "--decoder-kv-blocks-ttl 0 is out of range",
           "serve --model /tmp/x --decoder-kv-blocks-ttl 0%s", "");
    expect(2, "--kv-recompute-threshold wants auto or an integer 0..16777216, got 'many'",
           "serve --model /tmp/x --kv-recompute-threshold many%s", "");
    expect(2, "--kv-lease-ttl -1 is out of range", "serve --model /tmp/x --kv-lease-ttl -1%s", "");
    expect(2, "--engine-id must be 1..128 bytes", "serve --model /tmp/x --engine-id ''%s", "");
    expect(2, "--served-model-name must be 1..200 bytes",
           "serve --model /tmp/x --served-model-name ''%s", "");
    expect(2, "--tool-call-parser: 'xml' is not auto, qwen, llama3 or none",
           "serve --model /tmp/x --tool-call-parser xml%s", "");
    expect(2, "--reasoning-parser: 'r1' is not auto, think or none",
           "serve --model /tmp/x --reasoning-parser r1%s", "");
    expect(2, "--url wants http://HOST:PORT", "bench chat --url ftp://x%s", "");
    expect(1, "duplex bench chat: http://127.0.0.1:1/v1/models",
           "bench chat --url "
           "http://127.0.0.1:1%s",
           "");
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

/* Output of `duplex ARGS` must contain every phrase in want[] (NULL-ended)
 * and none in refuse[] (NULL-ended or NULL). */
static void expect_all(int want_rc, const char *const *want, const char *const *refuse,
                       const char *args)
{
    char out[65536];
    int rc = run(out, sizeof out, "%s", args);
    if (rc != want_rc) fail_msg("duplex %s: exit %d (want %d):\n%s", args, rc, want_rc, out);
    for (; want && *want; want++)
        if (!strstr(out, *want)) fail_msg("duplex %s: output lacks '%s':\n%s", args, *want, out);
    for (; refuse && *refuse; refuse++)
        if (strstr(out, *refuse)) fail_msg("duplex %s: output has '%s':\n%s", args, *refuse, out);
}

typedef struct {
    const char *args, *line;
} msg_case;

/* Each command must exit 2 printing exactly its one line: no usage text. */
static void expect_lines(const msg_case *c, size_t n)
{
    char out[65536], want[512];
    for (size_t i = 0; i < n; i++) {
        int rc = run(out, sizeof out, "%s", c[i].args);
        snprintf(want, sizeof want, "%s\n", c[i].line);
        if (rc != 2 || strcmp(out, want))
            fail_msg("duplex %s: exit %d (want 2), output\n%s(want)\n%s", c[i].args, rc, out, want);
    }
}

/* Flags are named as typed (-n, not --n), bounds print as integers (not
 * 1.04858e+06), and a wrong number of dashes suggests the right spelling. */
static void test_flag_spelling(void **state)
{
    (void)state;
    static const msg_case cases[] = {
        {"generate --model /tmp/x --prompt hi -n 0",
         "duplex generate: -n 0 is out of range [1, 1048576]"},
        {"generate --model /tmp/x --prompt hi --kv-cache-mb=0",
         "duplex generate: --kv-cache-mb 0 is out of range [1, 1048576]"},
        {"serve --model /tmp/x --shutdown-grace-s 0",
         "duplex serve: --shutdown-grace-s 0 is out of range [0.001, 86400]"},
        {"router --decode http://127.0.0.1:1 --conversation-ttl 0",
         "duplex router: --conversation-ttl 0 is out of range [1, 10000000]"},
        {"generate --model /tmp/x --prompt hi -n many",
         "duplex generate: -n wants an integer, got 'many'"},
        {"model synth -o", "duplex model synth: -o needs a value"},
        {"generate --model /tmp/x --prompt hi --n 4",
         "duplex generate: unknown option '--n' (did you mean -n?)"},
        {"generate -model /tmp/x",
         "duplex generate: unknown option '-model' (did you mean --model?)"},
        {"generate -x 1", "duplex generate: unknown option '-x' (see duplex generate --help)"},
    };
    expect_lines(cases, sizeof cases / sizeof cases[0]);
    /* help shows the real spellings, on stdout, exit 0 */
    static const char *const gen_help[] = {"\n  -n N ", "\n  --model FILE ", "\n  --kv-cache-mb N ",
                                           NULL};
    static const char *const synth_help[] = {"\n  -o FILE ", "\n  --output FILE ", "same as -o",
                                             NULL};
    static const char *const long_one_letter[] = {"--n ", "--o ", NULL};
    expect_all(0, gen_help, long_one_letter, "generate --help 2>/dev/null");
    expect_all(0, synth_help, long_one_letter, "model synth -h 2>/dev/null");
}

/* A bad value gets its own message (the value echoed, the accepted ones
 * listed), never a generic usage line. */
static void test_specific_messages(void **state)
{
    (void)state;
    static const msg_case cases[] = {
        {"generate --model /tmp/x --prompt hi --kv-dtype q4_0",
         "duplex generate: --kv-dtype: KV cache dtype 'q4_0' is not supported (f16|bf16|f32|q8_0)"},
        {"bench engine --model /tmp/x --kv-dtype q4",
         "duplex bench engine: --kv-dtype: KV cache dtype 'q4' is not supported (f16|bf16|f32|q8_0)"},
        {"bench engine", "duplex bench engine: --model FILE is required"},
        {"bench gram", "duplex bench gram: give one of --model FILE and --tokenizer FILE"},
        {"bench gram --model /tmp/x --tokenizer /tmp/y",
         "duplex bench gram: give one of --model FILE and --tokenizer FILE"},
        {"model synth --preset huge -o /tmp/x",
         "duplex model synth: --preset: unknown preset 'huge' (want "
         "tiny|tiny-k|small|0.6b|qwen3-0.6b|llama3.2-1b|tiny-moe|tiny-moe-k|qwen3-30b-a3b)"},
        {"model synth --arch gpt2 -o /tmp/x",
         "duplex model synth: --arch: unknown architecture 'gpt2' (want "
         "qwen3|qwen2|llama|qwen3moe)"},
        {"model synth --dtype int4 -o /tmp/x",
         "duplex model synth: --dtype: unknown dtype 'int4' (want "
         "f32|f16|bf16|q8_0|q5_1|q5_0|q4_1|q4_0|iq4_nl|q6_k|q5_k_m|q5_k_s|q4_k_m|q4_k_s|iq4_xs|"
         "q3_k_l|q3_k_m|q3_k_s|q2_k|q2_k_s)"},
        {"model info", "duplex model info: a GGUF file (duplex model info FILE) is required"},
        {"serve --model /tmp/x --log-level loud",
         "duplex serve: --log-level: unknown log level 'loud' (want error|warn|info|debug)"},
        {"serve --port 1", "duplex serve: --model FILE is required"},
        {"router --decode http://127.0.0.1:1 --log-level loud",
         "duplex router: --log-level: unknown log level 'loud' (want error|warn|info|debug)"},
        {"router --decode http://127.0.0.1:1 --state http://127.0.0.1:6379",
         "duplex router: --state: 'http://127.0.0.1:6379': a Redis URL starts with redis://"},
        {"router --decode http://127.0.0.1:1 --state redis://127.0.0.1:99999",
         "duplex router: --state: 'redis://127.0.0.1:99999': the port is not 1..65535"},
        {"router --decode http://127.0.0.1:1 --state redis://h/16",
         "duplex router: --state: 'redis://h/16': the database is not 0..15"},
        {"router --decode http://127.0.0.1:1 --state-timeout-ms 0",
         "duplex router: --state-timeout-ms 0 is out of range [1, 60000]"},
        {"router --decode http://127.0.0.1:1 --state-timeout-ms 60001",
         "duplex router: --state-timeout-ms 60001 is out of range [1, 60000]"},
        {"router --decode http://127.0.0.1:1 --state-prefix 'a b'",
         "duplex router: --state-prefix: spaces or control characters in 'a b'"},
        {"router --decode http://127.0.0.1:1 --mode sideways",
         "duplex router: --mode: 'sideways' is not a mode (bidirectional|unidirectional)"},
        {"up --mode sideways",
         "duplex up: --mode: 'sideways' is not a mode (bidirectional|unidirectional|colocated)"},
        {"up --log-level loud",
         "duplex up: --log-level: unknown log level 'loud' (want error|warn|info|debug)"},
        {"kv hold --policy often",
         "duplex kv hold: --policy wants multi|single|renew, got 'often'"},
        {"kv hold --lease-ttls 60,soon",
         "duplex kv hold: --lease-ttls: 'soon' in '60,soon' is not a positive number of seconds "
         "(want e.g. 60,5)"},
        {"kv hold --lease-ttls 60,",
         "duplex kv hold: --lease-ttls: '' in '60,' is not a positive number of seconds "
         "(want e.g. 60,5)"},
        {"kv pull --token 00", "duplex kv pull: --port P is required"},
        {"kv pull --port 9", "duplex kv pull: --token T is required"},
        {"tokenize --model /tmp/x --decode --ids",
         "duplex tokenize: --ids applies to encoding, not to --decode"},
    };
    expect_lines(cases, sizeof cases / sizeof cases[0]);
}

/* model, bench and kv are groups: help lists their commands on stdout (exit
 * 0); no command prints the same on stderr (exit 2); an unknown command is
 * named with the accepted ones (exit 2). */
static void test_groups(void **state)
{
    (void)state;
    static const struct {
        const char *group, *cmds[8], *accepted;
    } groups[] = {
        {"model", {"synth", "info"}, "synth|info"},
        {"bench",
         {"engine", "xfer", "run", "compare", "chat", "report"},
         "engine|kld|tok|gram|xfer|run|compare|chat|report"},
        {"kv", {"hold", "pull", "bench"}, "hold|pull|bench"},
    };
    /* every way to ask, and the bare group (stderr only) */
    static const char *const asks[] = {"%s -h 2>/dev/null", "%s help 2>/dev/null",
                                       "%s --bogus --help 2>/dev/null", "%s 2>&1 >/dev/null"};
    char help[4096], out[4096], args[128], want[160];
    for (size_t g = 0; g < 3; g++) {
        const char *name = groups[g].group;
        assert_int_equal(run(help, sizeof help, "%s --help 2>/dev/null", name), 0);
        snprintf(want, sizeof want, "usage: duplex %s <command>", name);
        assert_non_null(strstr(help, want));
        for (size_t c = 0; groups[g].cmds[c]; c++) {
            snprintf(want, sizeof want, "\n  %-10s ", groups[g].cmds[c]);
            if (!strstr(help, want)) fail_msg("duplex %s --help lacks '%s':\n%s", name, want, help);
        }
        for (size_t k = 0; k < 4; k++) {
            snprintf(args, sizeof args, asks[k], name);
            int rc = run(out, sizeof out, "%s", args);
            if (rc != (k == 3 ? 2 : 0) || strcmp(out, help))
                fail_msg("duplex %s: exit %d, output\n%s(want --help's)", args, rc, out);
        }
        snprintf(want, sizeof want, "duplex %s: unknown command 'frob' (want %s; duplex %s --help)",
                 name, groups[g].accepted, name);
        snprintf(args, sizeof args, "%s frob", name);
        msg_case unknown = {args, want};
        expect_lines(&unknown, 1);
    }
    /* a command's own help, by either road */
    expect(0, "usage: duplex model info FILE", "model help info%s", "");
    expect(0, "usage: duplex bench engine --model FILE", "bench engine --help%s", "");
    expect(0, "usage: duplex kv pull --port P", "kv pull -h%s", "");
    expect(2, "duplex kv: unknown command 'frob'", "kv help frob%s", "");
}

/* Appends the bytes one `tokenize` line shows: 'escaped text' or <0xHH>...
 * Returns 0, or -1 for a line in neither form. */
static int piece_bytes(const char *p, char *out, size_t *n)
{
    if (*p == '\'') {
        for (p++; *p && *p != '\''; p++) {
            if (*p != '\\') {
                out[(*n)++] = *p;
                continue;
            }
            p++;
            if (*p == 'x') {
                out[(*n)++] = (char)strtol((char[]){p[1], p[2], 0}, NULL, 16);
                p += 2;
            } else {
                out[(*n)++] = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : *p;
            }
        }
        return *p == '\'' && p[1] == 0 ? 0 : -1;
    }
    unsigned v;
    int used;
    for (; *p; p += used) {
        if (sscanf(p, "<0x%2X>%n", &v, &used) != 1 || used != 6) return -1;
        out[(*n)++] = (char)v;
    }
    return 0;
}

/* A byte token holding part of a multi-byte character shows as <0xE6>, not
 * as a replacement character; the pieces shown still add up to the text. */
static void test_tokenize_bytes(void **state)
{
    (void)state;
    const char *text = "Hello 日本語 café — ok";
    char out[65536], bytes[1024];
    size_t n = 0;
    int hex_lines = 0;
    assert_int_equal(
        run(out, sizeof out, "tokenize --model %s --no-bos --text '%s' 2>/dev/null", g_model, text),
        0);
    if (strstr(out, "\xEF\xBF\xBD")) fail_msg("U+FFFD in the output:\n%s", out);
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char *p = line + strspn(line, " 0123456789");
        hex_lines += *p == '<';
        if (p - line != 10 || piece_bytes(p, bytes, &n))
            fail_msg("line '%s' is not '%%8d  PIECE'", line);
    }
    assert_true(hex_lines >= 3); /* 日本語: nine bytes, no merges in a tiny vocabulary */
    assert_int_equal(n, strlen(text));
    assert_memory_equal(bytes, text, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_user_path),      cmocka_unit_test(test_moe_user_path),
        cmocka_unit_test(test_tokenize_bytes), cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_flag_spelling),  cmocka_unit_test(test_specific_messages),
        cmocka_unit_test(test_groups),         cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
