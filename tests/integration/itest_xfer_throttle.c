/* itest_xfer_throttle: a pull whose one-sided reads last far longer than the
 * holder's idle timeout and pin TTL.  Two network namespaces are joined by
 * a veth pair throttled with tc tbf (8 Mbit/s each way); `duplex kv hold
 * --idle-timeout-s 1 --pin-ttl 2` runs in one and `duplex kv pull` of 5 MiB
 * over UCX_TLS=tcp in the other, so the reads take about 5 s.  Renewing its
 * pin, the pull succeeds and every byte verifies; with --no-renew the pin
 * lapses mid-read and the pull must fail saying so — never report success.
 *
 * Needs root, iproute2 (ip, tc) and the kernel's veth and sch_tbf: without
 * one of them the tests report themselves skipped, with the reason.  The
 * namespaces (and with them the veth pair) are removed in the group
 * teardown whatever happened, and ones a killed earlier run left behind are
 * removed at start. */
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
static char g_skip[800]; /* why the link could not be built; empty when it was */

/* Runs a shell command quietly; 0 when it exited 0. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[600];
    snprintf(full, sizeof full, "{ %s; } >/dev/null 2>&1", cmd);
    return system(full) == 0 ? 0 : -1;
}

static void link_remove(void)
{
    for (int i = 0; i < 2; i++) {
        if (g_ns[i][0]) sh("ip netns del %s", g_ns[i]);    /* takes its veth end along */
        if (g_veth[i][0]) sh("ip link del %s", g_veth[i]); /* one never moved */
    }
}

/* Namespaces and veths named after a pid that no longer runs are a killed
 * earlier run's: remove them (never another live run's). */
static void remove_stale(void)
{
    DIR *d = opendir("/run/netns");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid;
        char side;
        if (sscanf(e->d_name, NS_PREFIX "%d-%c", &pid, &side) == 2 && pid > 0 && kill(pid, 0) < 0 &&
            errno == ESRCH) {
            sh("ip netns del %s", e->d_name);
            sh("ip link del " NS_PREFIX "%d%c", pid, side);
        }
    }
    if (d) closedir(d);
}

/* Runs one setup step; on failure records why and returns -1. */
static int step(const char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int step(const char *why, const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (sh("%s", cmd) == 0) return 0;
    snprintf(g_skip, sizeof g_skip, "%s (`%s` failed)", why, cmd);
    return -1;
}

static int side_up(int i, const char *addr)
{
    const char *ns = g_ns[i];
    if (step("cannot move a veth end into a namespace", "ip link set %s netns %s", g_veth[i], ns) ||
        step("cannot configure the veth", "ip -n %s link set %s name " DEV, ns, g_veth[i]))
        return -1;
    g_veth[i][0] = 0; /* gone with the namespace from now on */
    return step("cannot configure the veth", "ip -n %s addr add %s/24 dev " DEV, ns, addr) ||
           step("cannot configure the veth", "ip -n %s link set " DEV " up", ns) ||
           step("cannot configure the veth", "ip -n %s link set lo up", ns) ||
           step("tc cannot throttle the link (sch_tbf)",
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
    g_skip[0] = 0;
    if (geteuid() != 0) {
        snprintf(g_skip, sizeof g_skip, "needs root to create network namespaces");
        return 0;
    }
    if (sh("command -v ip && command -v tc")) {
        snprintf(g_skip, sizeof g_skip, "iproute2 (ip, tc) is not installed");
        return 0;
    }
    remove_stale();
    int pid = (int)getpid();
    snprintf(g_ns[0], sizeof g_ns[0], NS_PREFIX "%d-h", pid);
    snprintf(g_ns[1], sizeof g_ns[1], NS_PREFIX "%d-r", pid);
    if (step("cannot create network namespaces", "ip netns add %s", g_ns[0]) ||
        step("cannot create network namespaces", "ip netns add %s", g_ns[1]))
        goto fail;
    snprintf(g_veth[0], sizeof g_veth[0], NS_PREFIX "%dh", pid);
    snprintf(g_veth[1], sizeof g_veth[1], NS_PREFIX "%dr", pid);
    if (step("cannot create a veth pair", "ip link add %s type veth peer name %s", g_veth[0],
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
    return 0;
}

static void skip_unless_link(void)
{
    if (!g_skip[0]) return;
    print_message("skipped: %s\n", g_skip);
    skip();
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
    skip_unless_link();
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
    skip_unless_link();
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

int main(void)
{
    g_bin = getenv("DUPLEX_BIN");
    if (!g_bin) g_bin = "build/release/duplex";
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_renewed_pin_outlives_its_ttl, kp_kill_holder),
        cmocka_unit_test_teardown(test_lapsed_pin_fails_the_pull, kp_kill_holder),
    };
    return cmocka_run_group_tests_name("xfer over a throttled veth link (UCX_TLS=tcp)", tests,
                                       link_up, link_down);
}
