/* test_bench: the benchmark's parts that need no model — statistics,
 * length distributions and presets, conversation plans, results.json read
 * and written back, summary.md against a golden file made from a real run
 * (tests/data/bench/), ttft.svg parsed as XML (well-formed, one path per
 * mode), and the client against an endpoint that answers 500, never
 * answers, or cuts its stream: each error recorded by kind, the run going on.
 *
 * DUPLEX_REGEN_GOLDEN=1 rewrites the golden summary (review the diff). */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <expat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "bench/bench_fake.h"
#include "bench/bench_report.h"
#include "bench/bench_run.h"
#include "bench/bench_work.h"

#include "../test_proc.h"

#define DATA "tests/data/bench"

static void test_stats(void **state)
{
    (void)state;
    double v[100];
    for (int i = 0; i < 100; i++) v[i] = (double)((i * 37) % 100 + 1); /* 1..100, shuffled */
    bench_stat st;
    bench_stat_of(v, 100, &st);
    assert_int_equal(st.n, 100);
    assert_true(st.mean == 50.5 && st.p50 == 50 && st.p90 == 90 && st.p99 == 99);
    double one = 7;
    bench_stat_of(&one, 1, &st);
    assert_true(st.p50 == 7 && st.p99 == 7);
    bench_stat_of(NULL, 0, &st);
    assert_true(st.n == 0 && st.p50 == 0);
}

static void test_dists_and_presets(void **state)
{
    (void)state;
    bench_dist d;
    assert_int_equal(bench_dist_parse("150", &d), 0);
    assert_true(d.kind == BENCH_CONST && d.a == 150);
    assert_int_equal(bench_dist_parse("uniform:10:20", &d), 0);
    dx_rng r;
    dx_rng_seed(&r, 3);
    int seen_lo = 0, seen_hi = 0;
    for (int i = 0; i < 2000; i++) {
        uint32_t x = bench_dist_draw(&d, &r);
        assert_true(x >= 10 && x <= 20);
        seen_lo |= x == 10, seen_hi |= x == 20;
    }
    assert_true(seen_lo && seen_hi);
    assert_int_equal(bench_dist_parse("lognormal:100:0.5", &d), 0);
    double sum = 0;
    for (int i = 0; i < 4000; i++) sum += bench_dist_draw(&d, &r);
    assert_true(sum / 4000 > 100 && sum / 4000 < 125); /* the mean is 100 * e^(0.125) = 113 */
    char buf[64];
    bench_dist_format(&d, buf, sizeof buf);
    assert_string_equal(buf, "lognormal:100:0.5");
    static const char *const bad[] = {"",         "0",          "-5",           "10x",
                                      "1.5",      "uniform:5",  "uniform:20:10", "uniform:0:3",
                                      "lognormal:0:1", "lognormal:x:1", "normal:1:2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bench_dist_parse(bad[i], &d) != DX_EINVAL) fail_msg("'%s' was accepted", bad[i]);
        assert_non_null(strstr(dx_errmsg(), bad[i]));
    }
    bench_workload w = {0};
    assert_int_equal(bench_workload_preset("paper", 0.25, &w), 0);
    assert_true(w.conversations == 10 && w.turns == 10 && w.clients == 10);
    assert_true(w.input.a == 38 && w.output.a == 75 && w.prefix.a == 512 && w.scale == 0.25);
    assert_string_equal(w.preset, "paper");
    assert_int_equal(bench_workload_preset("quick", 1, &w), 0);
    assert_int_equal(bench_workload_check(&w), 0);
    assert_int_equal(bench_workload_preset("quick", 0, &w), DX_EINVAL);
    assert_int_equal(bench_workload_preset("quick", 1.5, &w), DX_EINVAL);
    assert_int_equal(bench_workload_preset("fast", 1, &w), DX_EINVAL);
    w.turns = 0;
    assert_int_equal(bench_workload_check(&w), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "--turns"));
}

/* Plans are fixed by the seed and the index, whatever else runs. */
static void test_conversation_plans(void **state)
{
    (void)state;
    bench_workload w = {.conversations = 3, .turns = 4, .clients = 1, .shared_prefix = 50,
                        .prefix = {BENCH_CONST, 300, 0}, .input = {BENCH_UNIFORM, 20, 40},
                        .output = {BENCH_CONST, 16, 0}, .seed = 9, .scale = 1};
    bench_text *t;
    assert_int_equal(bench_text_create(NULL, &t), 0);
    assert_false(bench_text_exact(t));
    bench_conv a, b, c;
    assert_int_equal(bench_conv_make(&w, t, 0, &a), 0);
    assert_int_equal(bench_conv_make(&w, t, 0, &b), 0);
    assert_int_equal(bench_conv_make(&w, t, 1, &c), 0);
    assert_string_equal(a.document, b.document);
    assert_string_equal(a.inputs[3], b.inputs[3]);
    assert_string_equal(a.system, c.system); /* the shared prefix */
    assert_string_not_equal(a.document, c.document);
    assert_string_equal(a.id, "conv-9-0");
    assert_int_equal(a.outputs[2], 16);
    assert_non_null(strstr(a.inputs[2], "Tool output: ")); /* every third turn */
    /* estimated lengths: about BENCH_TOKENS_PER_WORD tokens per word */
    size_t words = 0;
    for (const char *p = a.document; *p; p++) words += *p == ' ';
    assert_true(words > 300 / BENCH_TOKENS_PER_WORD * 0.8 && words < 300 / BENCH_TOKENS_PER_WORD * 1.3);
    bench_conv_free(&a);
    bench_conv_free(&b);
    bench_conv_free(&c);
    bench_text_destroy(t);
}

/* ---- reports ------------------------------------------------------------------ */

static const char *const k_modes[] = {"uni-nocache", "bidi", "colocated"};

typedef struct {
    bench_workload w;
    bench_meta m;
    bench_results r[3];
    bench_series s[3];
} fixture;

static void fixture_load(fixture *x)
{
    for (int i = 0; i < 3; i++) {
        char path[128];
        snprintf(path, sizeof path, DATA "/%s.json", k_modes[i]);
        if (bench_read_json(path, &x->w, &x->m, &x->r[i])) fail_msg("%s", dx_errmsg());
        x->s[i] = (bench_series){.name = k_modes[i], .res = &x->r[i]};
        /* the nodes' counters of that run (compare scrapes them; fixed here) */
        x->s[i].kv = (bench_kv){.has = 1, .bytes_p2d = 35.7e6 * (i != 2), .bytes_d2p = 280.1e6 * (i == 1),
                                .tok_local = 20000 + 1000 * i, .tok_pulled = 3000 * (i != 2),
                                .tok_computed = 9000 - 2000 * i};
    }
    x->m.overhead_ms = 0.1;
}

static void fixture_free(fixture *x)
{
    for (int i = 0; i < 3; i++) bench_results_free(&x->r[i]);
}

static void test_json_round_trip(void **state)
{
    (void)state;
    fixture x;
    fixture_load(&x);
    assert_int_equal(x.r[1].n, x.w.conversations * x.w.turns);
    assert_string_equal(x.w.preset, "quick");
    char path[] = "/tmp/dx_test_bench_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(bench_write_json(path, &x.w, &x.m, &x.r[1]), 0);
    bench_workload w2;
    bench_meta m2;
    bench_results r2;
    assert_int_equal(bench_read_json(path, &w2, &m2, &r2), 0);
    assert_int_equal(r2.n, x.r[1].n);
    for (size_t i = 0; i < r2.n; i++) {
        const bench_record *a = &x.r[1].rec[i], *b = &r2.rec[i];
        assert_true(a->conversation == b->conversation && a->turn == b->turn);
        assert_true(a->ttft_s == b->ttft_s && a->e2e_s == b->e2e_s && a->tpot_s == b->tpot_s);
        assert_true(a->prompt_tokens == b->prompt_tokens && a->cached_tokens == b->cached_tokens);
        assert_true(a->err == b->err && a->status == b->status);
    }
    assert_true(w2.turns == x.w.turns && w2.input.kind == x.w.input.kind && w2.input.b == x.w.input.b);
    bench_results_free(&r2);
    /* damaged files: an error naming the file, nothing half-read */
    FILE *f = fopen(path, "w");
    fputs("{\"meta\":{}, \"records\":[{\"turn\":\"x\"}]}", f);
    fclose(f);
    assert_true(bench_read_json(path, &w2, &m2, &r2) < 0);
    assert_non_null(strstr(dx_errmsg(), path));
    assert_int_equal(r2.n, 0);
    f = fopen(path, "w");
    fputs("[1,2", f);
    fclose(f);
    assert_true(bench_read_json(path, &w2, &m2, &r2) < 0);
    assert_non_null(strstr(dx_errmsg(), path));
    unlink(path);
    fixture_free(&x);
}

static void test_summary_golden(void **state)
{
    (void)state;
    fixture x;
    fixture_load(&x);
    x.m.url = "duplex up on 127.0.0.1, one mode after the other";
    char *got = NULL;
    size_t got_len = 0;
    FILE *f = open_memstream(&got, &got_len);
    assert_int_equal(bench_write_summary(f, &x.w, &x.m, x.s, 3), 0);
    fclose(f);
    const char *golden = DATA "/summary.md";
    if (getenv("DUPLEX_REGEN_GOLDEN")) {
        FILE *g = fopen(golden, "w");
        fwrite(got, 1, got_len, g);
        fclose(g);
    }
    size_t want_len = 0;
    char *want = tp_slurp(golden, &want_len);
    assert_non_null(want);
    if (want_len != got_len || memcmp(want, got, got_len))
        fail_msg("summary.md differs from %s:\n%s", golden, got);
    /* what a reader looks for */
    assert_non_null(strstr(got, "| turn | uni-nocache | bidi | colocated | uni-nocache / bidi | bidi / colocated |"));
    assert_non_null(strstr(got, "scale 1"));
    free(want);
    free(got);
    fixture_free(&x);
}

typedef struct {
    int paths, texts, depth, root_svg;
    char text[4096];
    size_t n_text;
    int in_text;
} svg_scan;

static void XMLCALL on_start(void *u, const XML_Char *name, const XML_Char **attr)
{
    svg_scan *s = u;
    (void)attr;
    if (s->depth++ == 0) s->root_svg = !strcmp(name, "svg");
    s->paths += !strcmp(name, "path");
    s->in_text = !strcmp(name, "text");
    s->texts += s->in_text;
}

static void XMLCALL on_end(void *u, const XML_Char *name)
{
    svg_scan *s = u;
    (void)name;
    s->depth--;
    if (s->in_text && s->n_text < sizeof s->text - 1) s->text[s->n_text++] = '|';
    s->in_text = 0;
}

static void XMLCALL on_chars(void *u, const XML_Char *t, int len)
{
    svg_scan *s = u;
    if (!s->in_text) return;
    for (int i = 0; i < len && s->n_text < sizeof s->text - 1; i++) s->text[s->n_text++] = t[i];
    s->text[s->n_text] = 0;
}

static void parse_svg(const char *doc, size_t len, svg_scan *s)
{
    memset(s, 0, sizeof *s);
    XML_Parser p = XML_ParserCreate(NULL);
    XML_SetUserData(p, s);
    XML_SetElementHandler(p, on_start, on_end);
    XML_SetCharacterDataHandler(p, on_chars);
    if (XML_Parse(p, doc, (int)len, 1) != XML_STATUS_OK)
        fail_msg("ttft.svg is not well-formed XML: %s at line %lu\n%s",
                 XML_ErrorString(XML_GetErrorCode(p)), (unsigned long)XML_GetCurrentLineNumber(p),
                 doc);
    XML_ParserFree(p);
}

static void test_svg(void **state)
{
    (void)state;
    fixture x;
    fixture_load(&x);
    snprintf(x.r[0].model, sizeof x.r[0].model, "a<b>&c"); /* names come from the endpoint */
    for (size_t n = 1; n <= 3; n++) {
        char *doc = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&doc, &len);
        assert_int_equal(bench_write_svg(f, &x.w, x.s, n), 0);
        fclose(f);
        svg_scan s;
        parse_svg(doc, len, &s);
        assert_true(s.root_svg);
        assert_int_equal(s.paths, (int)n); /* one line per mode */
        assert_non_null(strstr(s.text, "|turn|"));
        assert_non_null(strstr(s.text, "TTFT (ms"));
        /* uni-nocache's 500 ms next to bidi's 46: a log axis; one line: linear */
        assert_true((strstr(s.text, "log scale") != NULL) == (n >= 2));
        assert_non_null(strstr(s.text, "a<b>&c"));
        assert_non_null(strstr(s.text, "scale 1"));
        for (size_t i = 0; i < n; i++) assert_non_null(strstr(s.text, k_modes[i]));
        free(doc);
    }
    fixture_free(&x);
}

/* ---- the client against faults ---------------------------------------------------- */

static void test_client_faults(void **state)
{
    (void)state;
    bench_fake *fk;
    bench_fake_config fc = {.fail_every = 4, .stall_every = 7, .cut_every = 5};
    assert_int_equal(bench_fake_start(&fc, &fk), 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", bench_fake_port(fk));
    bench_workload w = {.conversations = 8, .turns = 3, .clients = 4, .shared_prefix = 10,
                        .prefix = {BENCH_CONST, 40, 0}, .input = {BENCH_CONST, 10, 0},
                        .output = {BENCH_CONST, 8, 0}, .seed = 1, .scale = 1};
    bench_text *t;
    assert_int_equal(bench_text_create(NULL, &t), 0);
    bench_results r;
    bench_run_config c = {.url = url, .w = &w, .text = t, .timeout_s = 1.0};
    assert_int_equal(bench_run(&c, &r), 0);
    assert_string_equal(r.model, "fake");
    int kinds[BENCH_N_ERR] = {0};
    for (uint32_t conv = 0; conv < w.conversations; conv++) {
        uint32_t next = 1;
        int ended = 0;
        for (size_t i = 0; i < r.n; i++) {
            const bench_record *x = &r.rec[i];
            if (x->conversation != conv) continue;
            assert_false(ended); /* nothing after a conversation's failed request */
            assert_int_equal(x->turn, next++);
            kinds[x->err]++;
            if (x->err) {
                ended = 1;
                assert_true(x->detail[0] != 0);
                continue;
            }
            assert_true(x->ttft_s > 0 && x->e2e_s >= x->ttft_s);
            assert_int_equal(x->completion_tokens, 8);
            assert_int_equal(x->status, 200);
        }
        assert_true(ended || next == w.turns + 1); /* every conversation ran to its end */
    }
    assert_true(kinds[BENCH_OK] > 0);
    assert_true(kinds[BENCH_ERR_HTTP] > 0);      /* 500 */
    assert_true(kinds[BENCH_ERR_TIMEOUT] > 0);   /* never answered */
    assert_true(kinds[BENCH_ERR_TRANSPORT] > 0); /* cut mid-stream */
    for (size_t i = 0; i < r.n; i++)
        if (r.rec[i].err == BENCH_ERR_HTTP) assert_int_equal(r.rec[i].status, 500);
    bench_results_free(&r);
    /* nobody listening: the run cannot start, and says where */
    bench_fake_stop(fk);
    c.url = url;
    assert_true(bench_run(&c, &r) < 0);
    assert_non_null(strstr(dx_errmsg(), url));
    bench_text_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_dists_and_presets),
        cmocka_unit_test(test_conversation_plans),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_summary_golden),
        cmocka_unit_test(test_svg),
        cmocka_unit_test(test_client_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
