/* itest_bench: `duplex bench` as a user runs it, each subcommand once on a
 * tiny configuration.  `bench run` against a real `duplex up`
 * (bidirectional, tiny model, 2 conversations x 3 turns): results.json
 * holds one record per request, none failed, every TTFT is positive, and
 * from turn 2 the prompt's history came from the decode node (the usage's
 * cached tokens and the prefill node's pulled-token counter).  `bench
 * compare`, `chat`, `xfer`, `engine` and `report` run, their output
 * parses and their figures are positive; Ctrl-C stops a comparison and
 * everything it started.  Bad flags and files exit 2 with a message naming
 * what is wrong; an endpoint nobody serves exits 1 naming it. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pd_test.h"

static char g_out[512 * 1024];

/* Runs a shell command (stderr joined); fails unless it exits want_rc. */
static const char *run(int want_rc, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[2200];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    int rc = tp_capture(full, g_out, sizeof g_out);
    if (rc != want_rc) fail_msg("%s: exit %d (want %d):\n%s", cmd, rc, want_rc, g_out);
    return g_out;
}

/* `duplex up --mode bidirectional` on free ports; returns the router's port. */
static int up_start(tp_proc *p, int *prefill_port)
{
    char log[96];
    snprintf(log, sizeof log, "%.60s/up.log", G.dir);
    char *argv[] = {(char *)G.bin, "up", "--mode", "bidirectional", "--port", "0", "--model",
                    G.model, "--kv-cache-mb", "16", "--threads-per-node", "1",
                    "--local-prefill-max-tokens", "0", "--prefill-no-prefix-caching",
                    "--kv-recompute-threshold", "1", NULL};
    assert_int_equal(tp_spawn(p, log, argv), 0);
    int port = (int)tp_wait_int(p, "ready: http://127.0.0.1:", 120);
    if (port <= 0) {
        tp_log_tail(p, 40);
        fail_msg("duplex up did not get ready");
    }
    char buf[65536];
    tp_read_log(p, buf, sizeof buf);
    const char *l = strstr(buf, "duplex up: prefill0");
    assert_non_null(l);
    l = strstr(l, "http://127.0.0.1:");
    assert_non_null(l);
    *prefill_port = atoi(l + strlen("http://127.0.0.1:"));
    return port;
}

static json_t *load(const char *path)
{
    json_error_t je;
    json_t *v = json_load_file(path, 0, &je);
    if (!v) fail_msg("%s: %s", path, je.text);
    return v;
}

static void test_run_against_up(void **state)
{
    (void)state;
    tp_proc up;
    int pport;
    int port = up_start(&up, &pport);
    tp_proc P = {.http = pport};
    long pulled0 = metric(&P, PULLED);
    char out[300];
    snprintf(out, sizeof out, "%s/run", G.dir);
    run(0,
        "%s bench run --url http://127.0.0.1:%d --conversations 2 --turns 3 --clients 2 "
        "--prefix-tokens 200 --shared-prefix-tokens 20 --input-tokens 40 --output-tokens 8 "
        "--tokenizer %s --out %s --no-progress",
        G.bin, port, G.model, out);
    assert_non_null(strstr(g_out, "## TTFT by turn"));
    char path[400];
    snprintf(path, sizeof path, "%s/results.json", out);
    json_t *v = load(path), *recs = json_object_get(v, "records"), *x;
    assert_int_equal(json_array_size(recs), 6);
    assert_true(json_is_true(json_object_get(json_object_get(v, "meta"), "tokens_exact")));
    size_t i;
    json_array_foreach(recs, i, x)
    {
        const char *err = json_string_value(json_object_get(x, "error"));
        if (strcmp(err, "ok")) fail_msg("record %zu failed: %s", i, json_dumps(x, 0));
        assert_true(json_number_value(json_object_get(x, "ttft_s")) > 0);
        assert_true(json_number_value(json_object_get(x, "e2e_s")) >=
                    json_number_value(json_object_get(x, "ttft_s")));
        assert_int_equal(json_integer_value(json_object_get(x, "completion_tokens")), 8);
        long turn = (long)json_integer_value(json_object_get(x, "turn"));
        long cached = (long)json_integer_value(json_object_get(x, "cached_tokens"));
        /* the prefill node keeps nothing itself: what it had, it pulled from D */
        if (turn >= 2 && cached <= 0) fail_msg("turn %ld reused nothing: %s", turn, json_dumps(x, 0));
        if (turn == 1) assert_int_equal(cached, 0);
    }
    json_decref(v);
    assert_true(metric(&P, PULLED) > pulled0);
    snprintf(path, sizeof path, "%s/summary.md", out);
    assert_int_equal(access(path, R_OK), 0);
    snprintf(path, sizeof path, "%s/ttft.svg", out);
    assert_int_equal(access(path, R_OK), 0);

    /* bench chat: one conversation, turn by turn, as JSON lines */
    run(0, "%s bench chat --url http://127.0.0.1:%d --turns 3 --prefix-tokens 120 --json", G.bin,
        port);
    int lines = 0;
    for (char *l = strtok(g_out, "\n"); l; l = strtok(NULL, "\n")) {
        json_error_t je;
        json_t *t = json_loads(l, 0, &je);
        if (!t) fail_msg("not a JSON line: %s", l);
        assert_string_equal(json_string_value(json_object_get(t, "error")), "ok");
        assert_true(json_number_value(json_object_get(t, "ttft_ms")) > 0);
        assert_int_equal(json_integer_value(json_object_get(t, "turn")), ++lines);
        json_decref(t);
    }
    assert_int_equal(lines, 3);
    if (tp_up_stop(&up, 60)) fail_msg("duplex up did not stop cleanly");
}

/* The positive number after `key` in text (fails if none). */
static double number_after(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    if (!p) fail_msg("no '%s' in:\n%s", key, text);
    double v = strtod(p + strlen(key), NULL);
    if (!(v > 0)) fail_msg("'%s' is not positive in:\n%s", key, text);
    return v;
}

static void test_compare_smoke(void **state)
{
    (void)state;
    char out[300];
    snprintf(out, sizeof out, "%s/cmp", G.dir);
    run(0,
        "%s bench compare --model %s --modes uni-nocache,bidi,colocated --conversations 2 "
        "--turns 2 --prefix-tokens 100 --input-tokens 20 --output-tokens 4 --kv-cache-mb 16 "
        "--threads-per-node 1 --out %s --no-progress",
        G.bin, G.model, out);
    /* the terminal table: every figure of turn 2 positive, and both ratios */
    const char *row = strstr(g_out, "| 2 | ");
    assert_non_null(row);
    double v[5];
    assert_int_equal(sscanf(row, "| 2 | %lf | %lf | %lf | %lf | %lf |", &v[0], &v[1], &v[2], &v[3],
                            &v[4]),
                     5);
    for (int i = 0; i < 5; i++) assert_true(v[i] > 0);
    number_after(g_out, "uni-nocache takes ");
    const char *modes[] = {"uni-nocache", "bidi", "colocated"};
    for (int i = 0; i < 3; i++) {
        char path[400];
        snprintf(path, sizeof path, "%s/%s/results.json", out, modes[i]);
        json_t *r = load(path);
        assert_int_equal(json_array_size(json_object_get(r, "records")), 4);
        json_decref(r);
    }
    char path[400];
    snprintf(path, sizeof path, "%s/summary.md", out);
    char *sum = tp_slurp(path, NULL);
    assert_non_null(sum);
    assert_non_null(strstr(sum, "## Where the prompts' KV came from"));
    number_after(sum, "\n| bidi | "); /* its share reused locally */
    /* bench report: the same summary again from the results files */
    run(0, "%s bench report --out %s/again %s/uni-nocache/results.json %s/bidi/results.json "
           "%s/colocated/results.json",
        G.bin, out, out, out, out);
    assert_non_null(strstr(g_out, "At the last turn, bidi takes"));
    snprintf(path, sizeof path, "%s/again/summary.md", out);
    char *again = tp_slurp(path, NULL);
    assert_non_null(again);
    /* the figures and where the KV came from are all kept in results.json */
    const char *a = strstr(again, "## TTFT by turn"), *b = strstr(sum, "## TTFT by turn");
    assert_true(a && b);
    assert_string_equal(a, b);
    free(again);
    free(sum);
    tp_expect(G.bin, "bench report", 2, "name one or more results.json files", "");
    tp_expect(G.bin, "bench report", 1, "/nonexistent/results.json", "/nonexistent/results.json");
}

/* Processes whose command line mentions needle (this test's directory). */
static int procs_with(const char *needle)
{
    int n = 0;
    DIR *d = opendir("/proc");
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || atoi(e->d_name) == getpid()) continue;
        char path[300], buf[4096];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        for (size_t i = 0; i < len; i++)
            if (!buf[i]) buf[i] = ' ';
        buf[len] = 0;
        n += strstr(buf, needle) != NULL;
    }
    if (d) closedir(d);
    return n;
}

/* Ctrl-C in the middle of a comparison: exit 130, and no `duplex up`, node
 * or router left behind. */
static void test_compare_interrupted(void **state)
{
    (void)state;
    char log[96], out[96];
    snprintf(log, sizeof log, "%.60s/int.log", G.dir);
    snprintf(out, sizeof out, "%.60s/int", G.dir);
    char *argv[] = {(char *)G.bin, "bench", "compare", "--model", G.model, "--modes",
                    "uni-nocache,bidi", "--conversations", "200", "--turns", "8",
                    "--prefix-tokens", "300", "--output-tokens", "32", "--kv-cache-mb", "16",
                    "--threads-per-node", "1", "--out", out, NULL};
    tp_proc p;
    assert_int_equal(tp_spawn(&p, log, argv), 0);
    char path[160];
    snprintf(path, sizeof path, "%s/uni-nocache/up.log", out);
    for (int i = 0; i < 600; i++) { /* until the first mode's router is up */
        char *l = tp_slurp(path, NULL);
        int ready = l && strstr(l, "[router]") && strstr(l, "POST /v1/chat/completions");
        free(l);
        if (ready) break;
        if (tp_gone(&p)) fail_msg("bench compare ended early");
        tp_sleep_ms(50);
    }
    assert_true(procs_with(G.dir) >= 4); /* compare, up, two nodes, the router */
    int st = tp_stop(&p, SIGINT, 60);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 130) {
        tp_log_tail(&p, 20);
        fail_msg("bench compare after SIGINT: status %d, want exit 130", st);
    }
    int left = 0;
    for (int i = 0; i < 100 && (left = procs_with(G.dir)) > 0; i++) tp_sleep_ms(50);
    if (left) fail_msg("%d processes of the comparison outlived it", left);
}

static void test_xfer_and_engine_smoke(void **state)
{
    (void)state;
    run(0, "%s bench xfer --blocks 2 --reps 2 --lat-reps 3 --transports default", G.bin);
    assert_non_null(strstr(g_out, "data checked"));
    number_after(g_out, "default ");
    number_after(g_out, "holder CPU over 2 timed pulls of ");
    run(0, "%s bench engine --model %s --prompt-tokens 32 --gen-tokens 8 --threads 1 --reps 1",
        G.bin, G.model);
    /* the kernels and the decode walk the figures were taken with */
    assert_true(strstr(g_out, "(decode by rows)") || strstr(g_out, "(decode by tiles)"));
    number_after(g_out, "pp32 @ d0:"); /* prefill tokens/s */
    number_after(g_out, "tg8 @ d0:");  /* decode tokens/s */
    run(0, "%s bench tok --model %s --jsonl tests/data/tok/corpus.jsonl --mb 0.05 --reps 2", G.bin,
        G.model);
    number_after(g_out, "loaded in "); /* ms */
    number_after(g_out, "-> ");        /* tokens, decoded back to the text (checked) */
    number_after(g_out, "): ");        /* MB/s */
    tp_expect(G.bin, "bench tok", 1, "no/such.jsonl: cannot open",
              "--model /dev/null --jsonl no/such.jsonl");
}

static void test_bad_input(void **state)
{
    (void)state;
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/bad.json", G.dir);
    FILE *f = fopen(cfg, "w");
    fputs("{\"turns\": 3,\n \"prefix-tokens\": [1]}", f);
    fclose(f);
    tp_expect(G.bin, "bench run", 2, "--config /tmp/nonexistent-dir/x.json",
              "--config /tmp/nonexistent-dir/x.json --url http://127.0.0.1:1");
    char args[400];
    snprintf(args, sizeof args, "--config %s", cfg);
    tp_expect(G.bin, "bench run", 2, "\"prefix-tokens\"", args);
    tp_expect(G.bin, "bench run", 2, "uniform:MIN:MAX", "--prefix-tokens uniform:5");
    tp_expect(G.bin, "bench run", 2, "unknown preset 'fast'", "--preset fast");
    tp_expect(G.bin, "bench run", 2, "--scale", "--preset quick --scale 2");
    tp_expect(G.bin, "bench compare", 2, "unknown mode 'fast'", "--modes bidi,fast");
    tp_expect(G.bin, "bench chat", 2, "--url wants http://", "--url localhost:8000");
    tp_expect(G.bin, "bench run", 1, "127.0.0.1:1", "--url http://127.0.0.1:1 --turns 1");
}

static int setup(void **state)
{
    (void)state;
    return pdt_setup("bench");
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_against_up),
        cmocka_unit_test(test_compare_smoke),
        cmocka_unit_test(test_compare_interrupted),
        cmocka_unit_test(test_xfer_and_engine_smoke),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
