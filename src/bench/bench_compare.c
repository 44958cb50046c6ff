/* bench_compare: the serving modes side by side (see .h). */
#include "bench/bench_compare.h"

#include <curl/curl.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "bench/bench_fake.h"
#include "bench/bench_report.h"
#include "engine/engine.h"

static const struct {
    const char *name;
    const char *args[8]; /* duplex up's flags for the mode */
} k_modes[] = {
    {"uni-nocache",
     {"--mode", "unidirectional", "--prefill-no-prefix-caching", "--local-prefill-max-tokens",
      "0"}},
    {"uni", {"--mode", "unidirectional", "--local-prefill-max-tokens", "0"}},
    {"bidi",
     {"--mode", "bidirectional", "--prefill-no-prefix-caching", "--local-prefill-max-tokens", "0"}},
    /* the rules before measured costs: the router's 256-token cut-off,
     * vLLM's 64-token threshold */
    {"bidi-rt",
     {"--mode", "bidirectional", "--local-prefill-max-tokens", "256", "--kv-recompute-threshold",
      "64"}},
    /* the defaults: every decision by the nodes' measured costs */
    {"bidi-auto", {"--mode", "bidirectional"}},
    /* every turn through the prefill node (its prefix cache on), which
     * pulls the decode node's blocks or recomputes them: by its costs, by
     * vLLM's threshold, never */
    {"bidi-p-auto", {"--mode", "bidirectional", "--local-prefill-max-tokens", "0"}},
    {"bidi-64",
     {"--mode", "bidirectional", "--local-prefill-max-tokens", "0", "--kv-recompute-threshold",
      "64"}},
    {"bidi-recompute",
     {"--mode", "bidirectional", "--local-prefill-max-tokens", "0",
      "--prefill-kv-recompute-threshold", "16777216"}},
    {"colocated", {"--mode", "colocated", "--decode", "1"}},
};

static int mode_index(const char *name, size_t len)
{
    for (size_t i = 0; i < DX_ARRAY_LEN(k_modes); i++)
        if (strlen(k_modes[i].name) == len && !strncmp(k_modes[i].name, name, len)) return (int)i;
    return DX_NONE;
}

/* One entry of the list: a mode, and the KV dtype its nodes get when the
 * entry says MODE@DTYPE (else NULL: the config's). */
typedef struct {
    int mode;
    char name[48]; /* the entry as written: the series' name and directory */
    char kv[16];
} mode_entry;

static int parse_entry(const char *p, size_t len, mode_entry *e)
{
    const char *at = memchr(p, '@', len);
    size_t ml = at ? (size_t)(at - p) : len;
    e->mode = mode_index(p, ml);
    if (e->mode < 0) {
        char names[256] = "";
        for (size_t i = 0; i < DX_ARRAY_LEN(k_modes); i++) /* the table is the one list */
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? "|" : "",
                     k_modes[i].name);
        return dx_errf(DX_EINVAL, "unknown mode '%.*s' (%s, each optionally @" ENGINE_KV_DTYPES ")",
                       (int)ml, p, names);
    }
    if (len >= sizeof e->name) return dx_errf(DX_EINVAL, "mode '%.*s' is too long", (int)len, p);
    snprintf(e->name, sizeof e->name, "%.*s", (int)len, p);
    e->kv[0] = 0;
    if (!at) return 0;
    size_t kl = len - ml - 1;
    int t;
    snprintf(e->kv, sizeof e->kv, "%.*s", (int)(kl < sizeof e->kv ? kl : sizeof e->kv - 1), at + 1);
    if (kl >= sizeof e->kv || engine_parse_kv_dtype(e->kv, &t))
        return dx_errf(DX_EINVAL, "mode '%.*s': the KV dtype is not one of " ENGINE_KV_DTYPES,
                       (int)len, p);
    return 0;
}

/* Calls fn for each entry of the list; DX_EINVAL for an unknown one. */
static int each_mode(const char *modes, int (*fn)(void *u, const mode_entry *e), void *u)
{
    for (const char *p = modes; *p;) {
        size_t len = strcspn(p, ",");
        mode_entry e;
        int rc = parse_entry(p, len, &e);
        if (!rc && fn) rc = fn(u, &e);
        if (rc) return rc;
        p += len + (p[len] == ',');
    }
    return 0;
}

int bench_compare_check_modes(const char *modes)
{
    return *modes ? each_mode(modes, NULL, NULL) : dx_errf(DX_EINVAL, "no mode given");
}

/* ---- duplex up as a child ------------------------------------------------------ */

typedef struct {
    pid_t pid;
    FILE *out; /* its stdout: the summary lines */
    char url[128];
    char nodes[16][128]; /* node URLs */
    int n_nodes;
} up_child;

static int up_start(const bench_compare_config *c, const mode_entry *e, const char *log,
                    up_child *u)
{
    memset(u, 0, sizeof *u);
    char threads[16], kv[24];
    const char *argv[32] = {c->exe, "up", "--port", "0"};
    int n = 4, mode = e->mode;
    for (int i = 0; k_modes[mode].args[i]; i++) argv[n++] = k_modes[mode].args[i];
    const char *dtype = e->kv[0] ? e->kv : c->kv_dtype;
    if (dtype) argv[n++] = "--kv-dtype", argv[n++] = dtype;
    if (c->model) argv[n++] = "--model", argv[n++] = c->model;
    if (c->threads_per_node > 0) {
        snprintf(threads, sizeof threads, "%d", c->threads_per_node);
        argv[n++] = "--threads-per-node", argv[n++] = threads;
    }
    if (c->kv_cache_mb > 0) {
        snprintf(kv, sizeof kv, "%ld", c->kv_cache_mb);
        argv[n++] = "--kv-cache-mb", argv[n++] = kv;
    }
    argv[n] = NULL;
    int pfd[2];
    if (pipe(pfd)) return dx_errf(DX_EIO, "pipe: %s", strerror(errno));
    u->pid = fork();
    if (u->pid < 0) return dx_errf(DX_EIO, "fork: %s", strerror(errno));
    if (u->pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        execv(c->exe, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    u->out = fdopen(pfd[0], "r");
    char line[512];
    while (fgets(line, sizeof line, u->out)) { /* until "ready:" or its exit */
        const char *h = strstr(line, "http://");
        if (!strncmp(line, "duplex up: ready: ", 18) && h) {
            snprintf(u->url, sizeof u->url, "%.*s", (int)strcspn(h, " \n"), h);
            return 0;
        }
        if (h && u->n_nodes < 16 && (strstr(line, "prefill") || strstr(line, "decode")))
            snprintf(u->nodes[u->n_nodes++], sizeof u->nodes[0], "%.*s", (int)strcspn(h, " \n"), h);
    }
    return dx_errf(DX_EIO, "duplex up (%s) did not start; its log: %s", e->name, log);
}

/* Waits (at most 60 s) until every node says its KV pool's pages are in:
 * measuring while a gigabyte faults in on another core would charge that
 * to the first turns of whichever mode runs. */
static void wait_populated(const char *log, int n_nodes, const volatile int *stop)
{
    for (int tries = 0; tries < 600 && !(stop && *stop); tries++) {
        FILE *f = fopen(log, "r");
        int n = 0;
        char line[512];
        while (f && fgets(line, sizeof line, f)) n += strstr(line, "faulted in") != NULL;
        if (f) fclose(f);
        if (n >= n_nodes) return;
        usleep(100000);
    }
}

static void up_stop(up_child *u)
{
    if (u->pid <= 0) return;
    kill(u->pid, SIGTERM);
    int st;
    for (int i = 0; i < 600 && waitpid(u->pid, &st, WNOHANG) == 0; i++) usleep(100000);
    if (waitpid(u->pid, &st, WNOHANG) == 0) { /* 60 s: it is not stopping */
        kill(u->pid, SIGKILL);
        waitpid(u->pid, &st, 0);
    }
    if (u->out) fclose(u->out);
    u->pid = 0;
}

/* ---- the nodes' counters ------------------------------------------------------------ */

static size_t on_body(char *p, size_t sz, size_t n, void *user)
{
    return dx_buf_append(user, p, sz * n) == 0 ? sz * n : 0;
}

static double series(const char *text, const char *name)
{
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = text ? strstr(text, key) : NULL;
    return p ? strtod(p + strlen(key), NULL) : 0;
}

/* Sums the KV counters over the nodes (into k, negated when sign < 0). */
static void scrape(const up_child *u, double sign, bench_kv *k)
{
    for (int i = 0; i < u->n_nodes; i++) {
        char url[200];
        snprintf(url, sizeof url, "%s/metrics", u->nodes[i]);
        dx_buf b;
        dx_buf_init(&b, 0);
        CURL *h = curl_easy_init();
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h, CURLOPT_TIMEOUT, 20L);
        if (curl_easy_perform(h) == CURLE_OK && dx_buf_putc(&b, 0) == 0) {
            k->has = 1;
            k->bytes_p2d += sign * series(b.data, "duplex_kv_pull_bytes_total{direction=\"p2d\"}");
            k->bytes_d2p += sign * series(b.data, "duplex_kv_pull_bytes_total{direction=\"d2p\"}");
            k->tok_local +=
                sign * series(b.data, "duplex_kv_prompt_tokens_total{source=\"local\"}");
            k->tok_pulled +=
                sign * series(b.data, "duplex_kv_prompt_tokens_total{source=\"pulled\"}");
            k->tok_computed +=
                sign * series(b.data, "duplex_kv_prompt_tokens_total{source=\"computed\"}");
            k->pulls_p2d += sign * series(b.data, "duplex_kv_pulls_total{direction=\"p2d\"}");
            k->pulls_d2p += sign * series(b.data, "duplex_kv_pulls_total{direction=\"d2p\"}");
            k->blocks_p2d +=
                sign * series(b.data, "duplex_kv_pull_blocks_total{direction=\"p2d\"}");
            k->blocks_d2p +=
                sign * series(b.data, "duplex_kv_pull_blocks_total{direction=\"d2p\"}");
            k->revoked_lru +=
                sign * series(b.data, "duplex_kv_lease_events_total{event=\"revoked_lru\"}");
            static const char *const w[2] = {"no", "yes"};
            for (int i = 0; i < 2; i++) {
                char name[96];
                snprintf(name, sizeof name, "duplex_decode_step_seconds_sum{prefill=\"%s\"}", w[i]);
                k->itl_sum[i] += sign * series(b.data, name);
                snprintf(name, sizeof name, "duplex_decode_step_seconds_count{prefill=\"%s\"}",
                         w[i]);
                k->itl_n[i] += sign * series(b.data, name);
            }
        }
        curl_easy_cleanup(h);
        dx_buf_free(&b);
    }
}

/* ---- the comparison ---------------------------------------------------------------- */

/* Entries of one --modes list at most (a mode may come with several KV dtypes). */
#define COMPARE_MAX_SERIES 16

typedef struct {
    const bench_compare_config *c;
    bench_results res[COMPARE_MAX_SERIES];
    bench_series s[COMPARE_MAX_SERIES];
    char names[COMPARE_MAX_SERIES][48];
    size_t n;
    bench_meta meta;
    int round;
} compare;

/* The entry's series (made at its first round); NULL past COMPARE_MAX_SERIES. */
static bench_series *series_of(compare *C, const mode_entry *e)
{
    for (size_t i = 0; i < C->n; i++)
        if (!strcmp(C->s[i].name, e->name)) return &C->s[i];
    if (C->n == COMPARE_MAX_SERIES) return NULL;
    bench_series *s = &C->s[C->n];
    snprintf(C->names[C->n], sizeof C->names[0], "%s", e->name);
    s->name = C->names[C->n];
    s->res = &C->res[C->n++];
    return s;
}

/* One round of one mode: duplex up afresh, the workload, duplex up stopped;
 * its records join the mode's (conversations numbered on across rounds). */
static int run_mode(void *user, const mode_entry *e)
{
    compare *C = user;
    const bench_compare_config *c = C->c;
    char dir[600], path[700];
    bench_series *s = series_of(C, e);
    if (!s) return dx_errf(DX_EINVAL, "--modes: more than %d entries", COMPARE_MAX_SERIES);
    snprintf(dir, sizeof dir, "%s/%s", c->out_dir, e->name);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/up%s%.0d.log", dir, C->round ? "-" : "", C->round);
    if (c->progress != BENCH_PROGRESS_NONE)
        fprintf(stderr, "bench compare: %s%s%.0d — starting duplex up\n", e->name,
                C->round ? ", round " : "", C->round ? C->round + 1 : 0);
    up_child u;
    int rc = up_start(c, e, path, &u);
    bench_results r = {0};
    if (!rc) {
        wait_populated(path, u.n_nodes, c->stop);
        scrape(&u, -1, &s->kv);
        bench_run_config rc_ = {
            .url = u.url, .w = c->w, .text = c->text, .progress = c->progress, .stop = c->stop};
        rc = bench_run(&rc_, &r);
        scrape(&u, +1, &s->kv);
    }
    up_stop(&u);
    bench_results *all = (bench_results *)s->res;
    for (size_t i = 0; !rc && i < r.n; i++) {
        bench_record x = r.rec[i];
        x.conversation += (uint32_t)C->round * c->w->conversations;
        rc = bench_results_add(all, &x);
    }
    all->wall_s += r.wall_s;
    snprintf(all->model, sizeof all->model, "%s", r.model);
    bench_results_free(&r);
    return rc ? dx_err_wrap(rc, "mode %s", e->name) : 0;
}

/* DIR/<mode>/results.json of every mode, all rounds in one. */
static int write_results(compare *C)
{
    int rc = 0;
    for (size_t i = 0; !rc && i < C->n; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s/results.json", C->c->out_dir, C->s[i].name);
        C->meta.url = "duplex up on 127.0.0.1";
        C->meta.kv = C->s[i].kv;
        rc = bench_write_json(path, C->c->w, &C->meta, C->s[i].res);
    }
    return rc;
}

static int write_reports(compare *C)
{
    const bench_compare_config *c = C->c;
    char path[600];
    snprintf(path, sizeof path, "%s/summary.md", c->out_dir);
    FILE *f = fopen(path, "w");
    if (!f) return dx_errf(DX_EIO, "%s: %s", path, strerror(errno));
    C->meta.url = "duplex up on 127.0.0.1, one mode after the other";
    C->meta.kv = (bench_kv){0};
    int rc = bench_write_summary(f, c->w, &C->meta, C->s, C->n);
    fclose(f);
    snprintf(path, sizeof path, "%s/ttft.svg", c->out_dir);
    if (!rc && !(f = fopen(path, "w"))) rc = dx_errf(DX_EIO, "%s: %s", path, strerror(errno));
    if (!rc) {
        rc = bench_write_svg(f, c->w, C->s, C->n);
        fclose(f);
    }
    if (!rc && c->out) bench_print_turns(c->out, c->w, C->s, C->n);
    if (!rc && c->sweep) { /* one row of the prefix sweep: the last turn's TTFT by mode */
        fprintf(c->sweep, "| %u |", c->sweep_prefix);
        double a = -1, b = -1;
        for (size_t i = 0; i < C->n; i++) {
            double p = bench_turn_p50(C->s[i].res, c->w->turns);
            fprintf(c->sweep, p < 0 ? " - |" : " %.1f |", p * 1e3);
            if (!strcmp(C->s[i].name, "uni-nocache")) a = p;
            if (!strcmp(C->s[i].name, "bidi")) b = p;
        }
        fprintf(c->sweep, a > 0 && b > 0 ? " %.2f |\n" : " - |\n", a > 0 && b > 0 ? a / b : 0);
        fflush(c->sweep);
    }
    return rc;
}

int bench_compare_run(const bench_compare_config *c)
{
    int rc = bench_compare_check_modes(c->modes);
    if (rc) return rc;
    if (mkdir(c->out_dir, 0755) && errno != EEXIST)
        return dx_errf(DX_EIO, "--out %s: %s", c->out_dir, strerror(errno));
    compare *C = dx_calloc(1, sizeof *C);
    if (!C) return dx_errf(DX_ENOMEM, "out of memory");
    C->c = c;
    C->meta.tokens_exact = bench_text_exact(c->text);
    C->meta.overhead_ms = bench_fake_overhead_ms(c->w, c->text, c->stop);
    int rounds = c->w->rounds > 1 ? (int)c->w->rounds : 1;
    for (C->round = 0; !rc && C->round < rounds; C->round++) rc = each_mode(c->modes, run_mode, C);
    if (!rc) rc = write_results(C);
    if (!rc) rc = write_reports(C);
    for (size_t i = 0; i < C->n; i++) bench_results_free(&C->res[i]);
    dx_free(C);
    return rc;
}
