/* itest_soak: two `duplex up` clusters at once, each 2 prefill + 2 decode
 * nodes on the tiny model, one with the f16 KV cache and one with
 * `--kv-dtype q8_0`, each under 64 concurrent multi-turn conversations
 * (half streamed) for SOAK_SECONDS (default 60 here; `make soak` runs
 * 600).  A third of the conversations speak each front door (load_test.h):
 * Chat Completions, Anthropic Messages (the history resent each turn) and
 * Responses (only the new input, chained with previous_response_id in the
 * router's store).  Passes when no request failed, every greedy reply
 * equals a single node's of the same KV dtype (the oracle: one `duplex
 * serve` without prefix caching, the same request through the same door;
 * q8_0 numerics differ from f16's, so each cluster has its own) and every
 * door of every cluster had more turns checked than conversations, every
 * process's RSS at the end is within 10% of its RSS after warm-up (500 s,
 * past the 480 s the nodes remember replies and stored responses and the
 * 450 s the router remembers conversations: all grow by design until
 * then; so checked only in runs of 560 s or more, and not under ASan,
 * whose quarantine grows by design), every node ends with no request
 * running, no pin and no block held except by a live lease, and each `up`
 * stops with exit 0.  The clusters run side by side, not one after the
 * other, so the q8_0 one costs `make test` only its start-up. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pd_test.h"
#include "load_test.h"

#if defined(__SANITIZE_ADDRESS__)
#define SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOAK_ASAN 1
#endif
#endif
#ifndef SOAK_ASAN
#define SOAK_ASAN 0
#endif

enum {
    N_CONV = 64,
    N_PROC = 6,
    N_CLUSTER = 2
}; /* per cluster: prefill0..1, decode0..1, router, up */
#define WARM_S 500.0

static const char *const k_names[N_PROC] = {"prefill0", "prefill1", "decode0",
                                            "decode1",  "router",   "up"};
static const char *const k_doors[] = {"chat", "messages", "responses"};

typedef struct {
    const char *dtype; /* --kv-dtype of its nodes and its oracle */
    tp_proc up, oracle;
    int pid[N_PROC], port[N_PROC];
    long rss_warm[N_PROC];
} cluster;

typedef struct {
    cluster c[N_CLUSTER];
    uint64_t warm_at;
    int warmed;
} soak;

static long rss_kb(int pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *k = strstr(buf, "VmRSS:");
    return k ? strtol(k + 6, NULL, 10) : -1;
}

static void summary(cluster *C)
{
    char buf[65536], key[64];
    tp_read_log(&C->up, buf, sizeof buf);
    for (int i = 0; i < N_PROC - 1; i++) {
        snprintf(key, sizeof key, "duplex up: %s ", k_names[i]);
        const char *l = strstr(buf, key);
        if (!l) fail_msg("no summary line for %s:\n%s", k_names[i], buf);
        assert_int_equal(
            sscanf(strstr(l, " pid "), " pid %d http://127.0.0.1:%d", &C->pid[i], &C->port[i]), 2);
    }
    C->pid[N_PROC - 1] = C->up.pid;
    C->port[N_PROC - 1] = 0;
}

/* The cluster and its oracle, both with C->dtype's KV cache. */
static void start_up(cluster *C)
{
    char log[160];
    snprintf(log, sizeof log, "%s/up-%s.log", G.dir, C->dtype);
    char *argv[] = {(char *)G.bin,
                    "up",
                    "--prefill",
                    "2",
                    "--decode",
                    "2",
                    "--port",
                    "0",
                    "--model",
                    G.model,
                    "--kv-cache-mb",
                    "64",
                    "--threads-per-node",
                    "1",
                    "--kv-dtype",
                    (char *)C->dtype,
                    NULL};
    assert_int_equal(tp_spawn(&C->up, log, argv), 0);
    int port = (int)tp_wait_int(&C->up, "ready: http://127.0.0.1:", 300);
    if (port <= 0) {
        tp_log_tail(&C->up, 40);
        fail_msg("duplex up (%s) did not get ready", C->dtype);
    }
    summary(C);
    assert_int_equal(C->port[4], port);
    const char *const ref[] = {
        "--no-enable-prefix-caching", "--kv-cache-mb", "64", "--kv-dtype", C->dtype, NULL};
    node_start(&C->oracle, C->dtype, ref);
}

static void tick(void *arg)
{
    soak *S = arg;
    if (S->warmed || dx_now_ns() < S->warm_at) return;
    for (int k = 0; k < N_CLUSTER; k++)
        for (int i = 0; i < N_PROC; i++) S->c[k].rss_warm[i] = rss_kb(S->c[k].pid[i]);
    S->warmed = 1;
}

/* The node's KV figures (tp_up_stop checks it at rest). */
static void node_figures(const cluster *C, int i)
{
    int p = C->port[i];
    printf("soak: %-4s %-8s blocks used %ld, leased %ld, leases %ld, pins %ld, revoked_lru %ld\n",
           C->dtype, k_names[i], tc_metric(p, "duplex_kv_blocks_used"),
           tc_metric(p, "duplex_kv_leased_blocks"), tc_metric(p, "duplex_kv_leases"),
           tc_metric(p, "duplex_kv_pins"),
           tc_metric(p, "duplex_kv_lease_events_total{event=\"revoked_lru\"}"));
}

/* Slot k * N_CONV + i: cluster k, door i % 3 (and lt_init's i & 1 streams:
 * every door both ways). */
static void aim(lt_load *L, const soak *S)
{
    for (int k = 0; k < N_CLUSTER; k++)
        for (int i = 0; i < N_CONV; i++)
            lt_aim(L, k * N_CONV + i, i % 3, S->c[k].port[4], S->c[k].oracle.http);
}

/* Each door of each cluster checked more turns than it has conversations
 * (so its conversations went past their first turn); "" or why not. */
static void per_door(const lt_load *L, const soak *S, char *why, size_t cap)
{
    for (int k = 0; k < N_CLUSTER; k++)
        for (int d = 0; d < 3; d++) {
            long ok = 0, n = 0;
            for (int i = k * N_CONV; i < (k + 1) * N_CONV; i++)
                if (L->s[i].door == d) ok += L->s[i].n_ok, n++;
            printf("soak: %-4s %-9s %ld turns checked in %ld conversations\n", S->c[k].dtype,
                   k_doors[d], ok, n);
            if (ok <= n && !why[0])
                snprintf(why, cap, "%s %s: only %ld turns checked", S->c[k].dtype, k_doors[d], ok);
        }
}

/* RSS after warm-up and at the end; why[] says the first that grew past
 * 10% when check. */
static void rss_report(const soak *S, int check, char *why, size_t cap)
{
    for (int k = 0; k < N_CLUSTER; k++)
        for (int i = 0; i < N_PROC; i++) {
            const cluster *C = &S->c[k];
            long now = rss_kb(C->pid[i]);
            printf("soak: %-4s %-8s RSS after warm-up %ld kB, at the end %ld kB (%+.1f%%)\n",
                   C->dtype, k_names[i], C->rss_warm[i], now,
                   100.0 * (double)(now - C->rss_warm[i]) / (double)C->rss_warm[i]);
            if (check && (double)now > 1.10 * (double)C->rss_warm[i] && !why[0])
                snprintf(why, cap, "%s %s grew from %ld kB to %ld kB", C->dtype, k_names[i],
                         C->rss_warm[i], now);
        }
}

static void test_soak(void **state)
{
    (void)state;
    const char *e = getenv("SOAK_SECONDS");
    double secs = e ? atof(e) : 60;
    if (secs < 4) secs = 4;
    soak S = {.c = {{.dtype = "f16"}, {.dtype = "q8_0"}}};
    for (int k = 0; k < N_CLUSTER; k++) start_up(&S.c[k]);
    lt_load L;
    lt_init(&L, N_CLUSTER * N_CONV, 0, 0, 9001);
    aim(&L, &S);
    uint64_t t0 = dx_now_ns();
    /* warm-up ends once every bounded cache is full: the nodes remember
     * replies for 480 s (hist_mem), the router conversations for 450 s and
     * responses for 480 s, so the RSS bound holds only for runs past WARM_S
     * (make soak's 600 s) */
    double warm = secs >= WARM_S + 60 ? WARM_S : secs / 4;
    int check_rss = !SOAK_ASAN && secs >= WARM_S + 60;
    S.warm_at = t0 + (uint64_t)(warm * 1e9);
    lt_run(&L, t0 + (uint64_t)(secs * 1e9), tick, &S, 1.0);
    double took = (double)(dx_now_ns() - t0) / 1e9;
    printf("soak: %.0f s, %d conversations: %ld turns checked, %ld wrong, %ld errors, %ld 503, "
           "%ld conversations restarted; first byte p50 %.3f s, p99 %.3f s\n",
           took, N_CLUSTER * N_CONV, L.ok, L.wrong, L.errors, L.rejected_503, L.turns_reset,
           lt_ttft_q(&L, 0.5), lt_ttft_q(&L, 0.99));
    /* every check, then everything stops, then the first failure is reported */
    char why[768] = "";
    if (L.wrong || L.errors || L.rejected_503)
        snprintf(why, sizeof why,
                 "%ld wrong, %ld errors, %ld 503; first (conversations %d.. are q8_0's): %s",
                 L.wrong, L.errors, L.rejected_503, N_CONV, L.first_error);
    per_door(&L, &S, why, sizeof why);
    if (!S.warmed && !why[0]) snprintf(why, sizeof why, "the run ended before its warm-up did");
    rss_report(&S, check_rss, why, sizeof why);
    if (!check_rss)
        printf("soak: RSS bound not checked (%s)\n",
               SOAK_ASAN ? "ASan's quarantine grows by design" : "needs SOAK_SECONDS >= 560");
    for (int k = 0; k < N_CLUSTER; k++)
        for (int i = 0; i < 4; i++) node_figures(&S.c[k], i);
    lt_free(&L);
    if (why[0]) {
        for (int k = 0; k < N_CLUSTER; k++) tp_stop(&S.c[k].up, SIGKILL, 30);
        fail_msg("soak: %s", why);
    }
    /* every node at rest, then a clean stop */
    for (int k = 0; k < N_CLUSTER; k++) {
        if (tp_up_stop(&S.c[k].up, 120))
            fail_msg("duplex up (%s) did not stop cleanly", S.c[k].dtype);
        stop_ok(&S.c[k].oracle);
    }
}

static int setup(void **state)
{
    (void)state;
    return pdt_setup("soak");
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_soak),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
