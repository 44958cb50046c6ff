/* itest_xfer_throttle: KV transfers over a real link between two network
 * namespaces, joined by a veth pair throttled with tc tbf (8 Mbit/s each
 * way), UCX_TLS=tcp, every process with the cluster's KV secret (the KV
 * ports listen on the veth, off loopback).
 *
 *  - A pull whose one-sided reads last far longer than the holder's idle
 *    timeout and pin TTL: `duplex kv hold --idle-timeout-s 1 --pin-ttl 2`
 *    in one namespace, `duplex kv pull` of 5 MiB in the other, so the reads
 *    take about 5 s.  Renewing its pin, the pull succeeds and every byte
 *    verifies; with --no-renew the pin lapses mid-read and the pull must
 *    fail saying so — never report success.
 *  - The link dies mid-transfer (`ip link set down` once the holder has
 *    pinned): the pull, whose deadline is 120 s, fails within the peer
 *    timeout (5 s of silence) plus the reads' abort — the bound asserted is
 *    30 s, far under the deadline the old reader waited out; and the same
 *    with nodes: a decode node pulling a prompt's KV from a prefill node
 *    whose link dies mid-pull (the link slowed to 1 Mbit/s so the pull
 *    lasts) answers by recompute, byte-identical to a single node.
 *
 * Needs root, iproute2 (ip, tc) and the kernel's veth and sch_tbf: without
 * one of them the tests report themselves skipped, with the reason.  The
 * namespaces (and with them the veth pair) are removed in the group
 * teardown whatever happened, and ones a killed earlier run left behind are
 * removed at start. */
/* Not in the tsan variant (no tsan mark): itest_xfer runs the same transfers under it; its
 * dead links wait out real timeouts (45 s). */
/* duplex-test: alone */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>

#include "kv_proc.h"
#include "netns_test.h"

#define NS_PREFIX  "dxkv"
#define DEV        "dxkv0"      /* the veth end's name inside each namespace */
#define HOLD_ADDR  "10.251.0.1" /* private addresses, inside the namespaces only */
#define PULL_ADDR  "10.251.0.2"
#define RATE       "8mbit"
#define BLOCKS     "40"
#define ALL_BLOCKS "0-39"
#define BLOCK_SIZE "131072" /* 40 x 128 KiB = 5 MiB: ~5.3 s at 8 Mbit/s */
#define PIN_TTL_MS 2000

static char g_ns[2][32]; /* holder's, reader's */
static char g_veth[2][16];
static char g_ip[128]; /* the ip command's path (the nodes run under `ip netns exec`) */

static void link_remove(void)
{
    for (int i = 0; i < 2; i++) {
        if (g_ns[i][0]) nt_sh("ip netns del %s", g_ns[i]);    /* takes its veth end along */
        if (g_veth[i][0]) nt_sh("ip link del %s", g_veth[i]); /* one never moved */
    }
}

static int side_up(int i, const char *addr)
{
    const char *ns = g_ns[i];
    if (nt_step("cannot move a veth end into a namespace", "ip link set %s netns %s", g_veth[i],
                ns) ||
        nt_step("cannot configure the veth", "ip -n %s link set %s name " DEV, ns, g_veth[i]))
        return -1;
    g_veth[i][0] = 0; /* gone with the namespace from now on */
    return nt_step("cannot configure the veth", "ip -n %s addr add %s/24 dev " DEV, ns, addr) ||
           nt_step("cannot configure the veth", "ip -n %s link set " DEV " up", ns) ||
           nt_step("cannot configure the veth", "ip -n %s link set lo up", ns) ||
           nt_step("tc cannot throttle the link (sch_tbf)",
                   "ip netns exec %s tc qdisc add dev " DEV " root tbf rate " RATE
                   " burst 16kb latency 100ms",
                   ns);
}

/* Group setup: builds the throttled link, or records why it cannot (the
 * tests then skip).  Always 0, so that cmocka runs the tests and they can
 * say "skipped" with the reason. */
static int link_up(void **state)
{
    (void)state;
    if (nt_begin(NS_PREFIX, "command -v ip && command -v tc", "iproute2 (ip, tc) is not installed",
                 "xfer_throttle", g_ip, sizeof g_ip))
        return 0;
    snprintf(g_secret, sizeof g_secret, "%s", G.secret);
    int pid = (int)getpid();
    snprintf(g_ns[0], sizeof g_ns[0], NS_PREFIX "%d-h", pid);
    snprintf(g_ns[1], sizeof g_ns[1], NS_PREFIX "%d-r", pid);
    if (nt_step("cannot create network namespaces", "ip netns add %s", g_ns[0]) ||
        nt_step("cannot create network namespaces", "ip netns add %s", g_ns[1]))
        goto fail;
    snprintf(g_veth[0], sizeof g_veth[0], NS_PREFIX "%dh", pid);
    snprintf(g_veth[1], sizeof g_veth[1], NS_PREFIX "%dr", pid);
    if (nt_step("cannot create a veth pair", "ip link add %s type veth peer name %s", g_veth[0],
                g_veth[1]) ||
        side_up(0, HOLD_ADDR) || side_up(1, PULL_ADDR))
        goto fail;
    /* UCX's TCP transport uses only the veth, never the namespace's lo */
    setenv("UCX_NET_DEVICES", DEV, 1);
    return 0;
fail:
    link_remove();
    return 0;
}

static int link_down(void **state)
{
    kp_kill_holder(state);
    link_remove();
    if (G.dir[0]) pdt_teardown();
    return 0;
}

static void hold(kp_holder *h)
{
    kp_hold_start(h, g_ns[0], "--host", HOLD_ADDR, "--blocks", BLOCKS, "--block-bytes", BLOCK_SIZE,
                  "--lease-ttls", "600", "--pin-ttl", "2", "--idle-timeout-s", "1", "--tls", "tcp",
                  NULL);
}

/* Pulls every block from the other namespace; extra: NULL or one flag. */
static json_t *pull_all(const kp_holder *h, const char *extra, int *rc)
{
    return kp_pull(h, g_ns[1], rc, h->tok[0], ALL_BLOCKS, "--host", HOLD_ADDR, "--block-bytes",
                   BLOCK_SIZE, "--tls", "tcp", "--timeout", "120", extra, NULL);
}

/* Else the test would prove nothing: the reads must outlast the pin TTL
 * (and with it the 1 s idle timeout) by far. */
static void expect_slow_read(json_t *j)
{
    double ms = json_real_value(json_object_get(j, "read_ms"));
    if (ms < 2 * PIN_TTL_MS)
        fail_msg("the reads took %.0f ms, want > %d (pull: %s)", ms, 2 * PIN_TTL_MS,
                 kp_jstr(j, "reason"));
}

static void test_renewed_pin_outlives_its_ttl(void **state)
{
    nt_skip_unless_ready();
    kp_holder h;
    hold(&h);
    int rc;
    json_t *j = pull_all(&h, NULL, &rc);
    kp_expect_ok(j, 40); /* verified byte for byte */
    expect_slow_read(j);
    assert_int_equal(rc, 0);
    assert_true(kp_jint(j, "renewals") >= 2);
    json_decref(j);
    kp_hold_stop(&h);
}

static void test_lapsed_pin_fails_the_pull(void **state)
{
    nt_skip_unless_ready();
    kp_holder h;
    hold(&h);
    int rc;
    json_t *j = pull_all(&h, "--no-renew", &rc);
    expect_slow_read(j);
    assert_int_not_equal(rc, 0);
    assert_int_not_equal(kp_jint(j, "err"), 0);
    assert_int_equal(kp_jint(j, "pulled"), 0);
    assert_int_equal(kp_jint(j, "renewals"), 0);
    assert_int_equal(kp_jint(j, "leaked"), 0);
    if (!strstr(kp_jstr(j, "reason"), "pin may have lapsed"))
        fail_msg("reason does not name the lapsed pin: %s", kp_jstr(j, "reason"));
    json_decref(j);
    kp_hold_stop(&h);
}

/* The holder's end of the link goes down (both ends lose carrier), or
 * comes back at `rate`. */
static void holder_link(int up, const char *rate)
{
    if (up)
        assert_int_equal(nt_sh("ip -n %s link set " DEV " up && ip netns exec %s tc qdisc change "
                               "dev " DEV " root tbf rate %s burst 16kb latency 100ms",
                               g_ns[0], g_ns[0], rate),
                         0);
    else
        assert_int_equal(nt_sh("ip -n %s link set " DEV " down", g_ns[0]), 0);
}

static double secs_since(uint64_t t0)
{
    return (double)(dx_now_ns() - t0) * 1e-9;
}

/* A dead link mid-transfer is noticed in seconds, not at the deadline. */
static void test_dead_link_fails_fast(void **state)
{
    nt_skip_unless_ready();
    kp_holder h;
    kp_hold_start(&h, g_ns[0], "--host", HOLD_ADDR, "--blocks", BLOCKS, "--block-bytes", BLOCK_SIZE,
                  "--lease-ttls", "600", "--tls", "tcp", NULL);
    char port[16];
    snprintf(port, sizeof port, "%d", h.port);
    char *argv[] = {"duplex",   "kv",
                    "pull",     "--port",
                    port,       "--token",
                    h.tok[0],   "--remote",
                    ALL_BLOCKS, "--fill-seed",
                    "7",        "--host",
                    HOLD_ADDR,  "--block-bytes",
                    BLOCK_SIZE, "--tls",
                    "tcp",      "--timeout",
                    "120",      "--pause-after-pin-ms",
                    "1",        "--kv-secret-file",
                    g_secret,   NULL};
    kp_proc p;
    kp_spawn(&p, g_ns[1], argv);
    json_t *j = kp_next_json(&p, 60000);
    assert_non_null(j);
    assert_non_null(json_object_get(j, "pinned")); /* the reads start now, for ~5 s */
    json_decref(j);
    usleep(500000);
    uint64_t t0 = dx_now_ns();
    holder_link(0, NULL);
    j = kp_next_json(&p, 150000);
    double waited = secs_since(t0);
    holder_link(1, RATE);
    assert_non_null(j);
    print_message("pull failed %.1f s after the link went down (deadline 120 s): %s\n", waited,
                  kp_jstr(j, "reason"));
    if (!kp_jint(j, "err")) fail_msg("the pull finished before the link went down");
    assert_int_equal(kp_jint(j, "pulled"), 0);
    assert_int_equal(kp_jint(j, "leaked"), 0);
    if (waited >= 30) fail_msg("a dead link took %.1f s to notice", waited);
    json_decref(j);
    kp_reap(&p, 30);
    kp_kill_holder(state);
}

/* ---- the same with nodes ---- */

/* `duplex serve` inside namespace ns (under `ip netns exec`), ready. */
static void ns_node(tp_proc *n, const char *ns, const char *tag, const char *const *extra)
{
    char log[160];
    snprintf(log, sizeof log, "%s/%s.log", G.dir, tag);
    const char *argv[40] = {g_ip,
                            "netns",
                            "exec",
                            ns,
                            G.bin,
                            "serve",
                            "--model",
                            G.model,
                            "--port",
                            "0",
                            "--threads",
                            "1",
                            "--kv-cache-mb",
                            "64",
                            "--kv-port",
                            "0",
                            "--kv-secret-file",
                            G.secret,
                            "--kv-transport-tls",
                            "tcp"};
    int k = 20; /* tcp: else the namespaces share memory, and UCX uses that */
    for (int i = 0; extra[i]; i++) argv[k++] = extra[i];
    argv[k] = NULL;
    assert_int_equal(tp_spawn(n, log, (char *const *)argv), 0);
    n->http = (int)tp_wait_int(n, "address=http://127.0.0.1:", 60);
    if (n->http <= 0) {
        tp_log_tail(n, 20);
        fail_msg("%s did not start in namespace %s", tag, ns);
    }
}

/* Starts curl inside ns: a GET of path (body NULL) or a POST of body, to
 * 127.0.0.1:port; the reply goes to G.dir/<name>.out. */
static void ns_curl(tp_proc *c, const char *ns, int port, const char *path, json_t *body,
                    const char *name)
{
    char url[96], bodyf[160], data[170], out[160], log[160];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    snprintf(out, sizeof out, "%s/%s.out", G.dir, name);
    snprintf(log, sizeof log, "%s/%s.log", G.dir, name);
    const char *argv[20] = {g_ip, "netns", "exec", ns, "curl", "-s", "-m", "150", "-o", out};
    int k = 10;
    if (body) {
        snprintf(bodyf, sizeof bodyf, "%s/%s.body", G.dir, name);
        snprintf(data, sizeof data, "@%s", bodyf);
        assert_int_equal(json_dump_file(body, bodyf, JSON_COMPACT), 0);
        argv[k++] = "-H";
        argv[k++] = "Content-Type: application/json";
        argv[k++] = "--data-binary";
        argv[k++] = data;
    }
    argv[k++] = url;
    argv[k] = NULL;
    assert_int_equal(tp_spawn(c, log, (char *const *)argv), 0);
}

/* The reply of a finished ns_curl (malloc'd), failing the test unless curl
 * exited 0 within 160 s. */
static char *ns_reply(tp_proc *c, const char *name)
{
    int st = tp_stop(c, 0, 160);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) fail_msg("curl %s failed (status %d)", name, st);
    char out[160];
    snprintf(out, sizeof out, "%s/%s.out", G.dir, name);
    char *s = tp_slurp(out, NULL);
    assert_non_null(s);
    return s;
}

static json_t *ns_post(const char *ns, int port, json_t *body)
{
    tp_proc c;
    ns_curl(&c, ns, port, "/v1/chat/completions", body, "post");
    char *s = ns_reply(&c, "post");
    json_t *v = json_loads(s, 0, NULL);
    if (!v) fail_msg("not JSON: %s", s);
    free(s);
    return v;
}

static double ns_metric(const char *ns, int port, const char *series)
{
    tp_proc c;
    ns_curl(&c, ns, port, "/metrics", NULL, "metrics");
    char *s = ns_reply(&c, "metrics");
    char key[256];
    snprintf(key, sizeof key, "\n%s ", series);
    const char *p = strstr(s, key);
    double v = p ? strtod(p + strlen(key), NULL) : -1;
    free(s);
    return v;
}

static tp_proc g_procs[4]; /* the node test's P, D, S and its background request */

/* Whatever a failed node test left: its processes, and the slowed link. */
static int node_test_cleanup(void **state)
{
    for (int i = 0; i < 4; i++)
        if (g_procs[i].pid > 0 && !tp_gone(&g_procs[i])) tp_stop(&g_procs[i], SIGKILL, 10);
    if (!nt_skip[0]) holder_link(1, RATE);
    return 0;
}

static void test_dead_link_node_recomputes(void **state)
{
    nt_skip_unless_ready();
    holder_link(1, "1mbit"); /* ~10 s for the prompt's KV */
    tp_proc *P = &g_procs[0], *D = &g_procs[1], *S = &g_procs[2], *bg = &g_procs[3];
    const char *pa[] = {"--role", "prefill", "--kv-host", HOLD_ADDR, NULL};
    const char *da[] = {"--role", "decode", "--kv-peers", HOLD_ADDR, "--kv-pull-timeout-s",
                        "120",    NULL};
    ns_node(P, g_ns[0], "p", pa);
    ns_node(D, g_ns[1], "d", da);
    const char *sa[] = {
        "serve",     "--model", G.model,         "--port", "0",
        "--threads", "1",       "--kv-cache-mb", "64",     "--no-enable-prefix-caching",
        NULL};
    char slog[160];
    snprintf(slog, sizeof slog, "%s/s.log", G.dir);
    tp_start(S, G.bin, slog, sa, "duplex serve:");
    conv c;
    conv_init(&c, 77, 1800); /* ~2,500 tokens: over 1 MB of KV */
    json_t *pb = chat_body(c.msgs, 1);
    json_object_set_new(pb, "stream", json_false());
    json_object_set_new(pb, "kv_transfer_params", prefill_params(&c, 0));
    json_t *pr = ns_post(g_ns[0], P->http, pb);
    json_t *db = chat_body(c.msgs, 16);
    json_object_set(db, "kv_transfer_params", json_object_get(pr, "kv_transfer_params"));
    assert_true(json_is_object(json_object_get(db, "kv_transfer_params")));
    ns_curl(bg, g_ns[1], D->http, "/v1/chat/completions", db, "decode");
    /* the decode node has pinned the prompt's blocks on P: mid-pull */
    for (int i = 0; i < 600 && ns_metric(g_ns[0], P->http, "duplex_kv_pins") < 1; i++) {
        if (tp_gone(bg)) fail_msg("the decode request ended before it pinned anything");
        tp_sleep_ms(20);
    }
    if (tp_gone(bg)) fail_msg("the pull finished before the link went down");
    uint64_t t0 = dx_now_ns();
    holder_link(0, NULL);
    char *reply = ns_reply(bg, "decode");
    double waited = secs_since(t0);
    holder_link(1, RATE);
    json_t *dr = json_loads(reply, 0, NULL);
    if (!dr) fail_msg("the decode node's reply is not JSON: %s", reply);
    free(reply);
    print_message("decode node answered %.1f s after the link went down (pull deadline 120 s)\n",
                  waited);
    if (waited >= 30) fail_msg("a dead link took %.1f s to notice", waited);
    json_t *sb = chat_body(c.msgs, 16);
    json_t *ref = post(S, sb, 200);
    json_decref(sb);
    assert_same(answer_of(dr), answer_of(ref), 1);
    double t = ns_metric(g_ns[1], D->http, "duplex_kv_fallbacks_total{reason=\"timeout\"}") +
               ns_metric(g_ns[1], D->http, "duplex_kv_fallbacks_total{reason=\"transfer\"}");
    assert_true(t >= 1);
    assert_int_equal(ns_metric(g_ns[1], D->http, PULLED), 0);
    json_decref(dr);
    json_decref(ref);
    json_decref(pb);
    json_decref(pr);
    json_decref(db);
    conv_free(&c);
    stop_ok(P);
    stop_ok(D);
    stop_ok(S);
}

int main(void)
{
    g_bin = getenv("DUPLEX_BIN");
    if (!g_bin) g_bin = "build/release/duplex";
    signal(SIGPIPE, SIG_IGN);
    /* --no-renew and --pause-after-pin-ms are test hooks (docs/testing.md) */
    setenv("DUPLEX_TEST_HOOKS", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_renewed_pin_outlives_its_ttl, kp_kill_holder),
        cmocka_unit_test_teardown(test_lapsed_pin_fails_the_pull, kp_kill_holder),
        cmocka_unit_test_teardown(test_dead_link_fails_fast, kp_kill_holder),
        cmocka_unit_test_teardown(test_dead_link_node_recomputes, node_test_cleanup),
    };
    return cmocka_run_group_tests_name("xfer over a throttled veth link (UCX_TLS=tcp)", tests,
                                       link_up, link_down);
}
