/* itest_fault_kv: the KV port's link between two nodes, broken on purpose,
 * and nodes of another protocol version or KV layout.  Four network
 * namespaces:
 *
 *   D (decode node, the test, the oracle) --- X | fault proxy | Y --- P (prefill node)
 *        10.254.0.2                    10.254.0.1     10.254.1.2   10.254.1.1 (P's KV port)
 *   D ------------------------------------------------------------------- P
 *        10.254.5.2              data link: UCX over TCP, HTTP           10.254.5.1
 *
 * P's KV port listens on 10.254.1.1; D reaches "10.254.1.1" through X,
 * where the proxy (fault_proxy.h) listens on that very address and port
 * and forwards from Y: transparent, as the KV port's handshake requires
 * (it binds the holder's address as each side sees it).  The one-sided
 * reads go over the data link (UCX_NET_DEVICES, as on a host with a KV
 * network), so the proxy holds the control connection — AUTH, HELLO, PIN,
 * RENEW, RELEASE — in its hands.  The test drives P and D as a router
 * would (P holds the prompt's KV, D pulls it) and breaks the control
 * connection:
 *
 *   - a peer that accepts and never answers,
 *   - an RST in the middle of a transfer (after PIN_OK, while the reads run),
 *   - a half-open connection mid-transfer (nothing more either way),
 *   - a stall longer than --kv-peer-timeout-s (after AUTH_OK),
 *   - a byte-by-byte drip,
 *   - two pulls whose connection attempts arrive the other way round,
 *   - a peer of another KV-port protocol version (every frame rewritten),
 *   - and, without the proxy, a prefill node with another KV layout
 *     (--kv-dtype f32 against f16).
 *
 * Each time D's answer equals a single node's byte for byte (it recomputes
 * what it could not pull, or pulls it), D counts the reason
 * (duplex_kv_fallbacks_total{reason}), the holder counts refusals
 * (duplex_kv_port_connections_total{event="version_refused"|
 * "hello_refused"}) and both log them, and both nodes are at rest when
 * they stop (stop_ok: no pin left, no block but live leases'; a pin the
 * frozen connection left lapses at --kv-pin-ttl-s).
 *
 * Needs root and iproute2 (veth): without them the tests report themselves
 * skipped, saying why.  The namespaces are removed in the group teardown
 * whatever happened; ones a killed earlier run left are removed at start. */
/* duplex-test: tsan */
/* duplex-test: alone */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "netns_test.h"
#include "fault_proxy.h"
#include "xfer/kvport_proto.h"

#define NS_PREFIX "dxfk"
#define D_CTL     "10.254.0.2" /* D's end towards the proxy */
#define X_CTL     "10.254.0.1" /* the proxy's front: P's KV address, as D sees it */
#define Y_CTL     "10.254.1.2" /* the proxy's back */
#define P_KV      "10.254.1.1" /* P's KV port */
#define D_DATA    "10.254.5.2"
#define P_DATA    "10.254.5.1" /* P's HTTP, and the UCX reads */
#define DATA_DEV  "dxdat0"

enum { NS_D, NS_X, NS_Y, NS_P, N_NS };
static const char k_side[N_NS] = {'d', 'x', 'y', 'p'};

static char g_ns[N_NS][32];
static char g_ip[128];
static int g_home = -1;
static struct {
    tp_proc P, D, S, P32;
    fp_proxy fx;
    unsigned seed;
} C;

/* ---- the hosts -------------------------------------------------------------- */

static void hosts_remove(void)
{
    if (g_home >= 0) {
        if (setns(g_home, CLONE_NEWNET)) perror("itest_fault_kv: setns back");
        close(g_home);
        g_home = -1;
    }
    for (int i = 0; i < N_NS; i++)
        if (g_ns[i][0]) nt_sh("ip netns del %s", g_ns[i]);
}

static int link_up(int a, const char *dev_a, const char *addr_a, int b, const char *dev_b,
                   const char *addr_b, int bits)
{
    const char *why = "cannot create a veth pair between namespaces";
    return nt_step(why, "ip link add %s netns %s type veth peer name %s netns %s", dev_a, g_ns[a],
                   dev_b, g_ns[b]) ||
           nt_step(why, "ip -n %s addr add %s/%d dev %s", g_ns[a], addr_a, bits, dev_a) ||
           nt_step(why, "ip -n %s addr add %s/%d dev %s", g_ns[b], addr_b, bits, dev_b) ||
           nt_step(why, "ip -n %s link set %s up", g_ns[a], dev_a) ||
           nt_step(why, "ip -n %s link set %s up", g_ns[b], dev_b);
}

/* The veth's carrier comes up asynchronously; UCX skips a device that is
 * not running yet. */
static int link_running(int ns, const char *dev)
{
    char cmd[200], out[256];
    snprintf(cmd, sizeof cmd, "%s -n %s -o link show %s", g_ip, g_ns[ns], dev);
    for (int i = 0; i < 600; i++) {
        if (tp_capture(cmd, out, sizeof out) == 0 && strstr(out, "LOWER_UP") &&
            strstr(out, "state UP"))
            return 0;
        tp_sleep_ms(50);
    }
    snprintf(nt_skip, sizeof nt_skip, "the veth %s in %s did not come up: %s", dev, g_ns[ns], out);
    return -1;
}

static int hosts_up(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (nt_begin(NS_PREFIX, "command -v ip && ip netns list",
                 "`ip netns` (iproute2) is not available", "fault_kv", g_ip, sizeof g_ip))
        return 0;
    for (int i = 0; i < N_NS; i++) {
        snprintf(g_ns[i], sizeof g_ns[i], NS_PREFIX "%d-%c", (int)getpid(), k_side[i]);
        if (nt_step("cannot create network namespaces", "ip netns add %s", g_ns[i]) ||
            nt_step("cannot bring up lo in a namespace", "ip -n %s link set lo up", g_ns[i]))
            goto fail;
    }
    if (link_up(NS_D, "dxctl0", D_CTL, NS_X, "dxctl0", X_CTL, 24) ||
        link_up(NS_Y, "dxctl1", Y_CTL, NS_P, "dxctl1", P_KV, 24) ||
        link_up(NS_D, DATA_DEV, D_DATA, NS_P, DATA_DEV, P_DATA, 24) ||
        link_running(NS_D, DATA_DEV) || link_running(NS_P, DATA_DEV) ||
        link_running(NS_D, "dxctl0") || link_running(NS_P, "dxctl1"))
        goto fail;
    setenv("UCX_NET_DEVICES", DATA_DEV, 1); /* the reads use the data link only */
    g_home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (g_home < 0 || fp_enter(g_ns[NS_D])) {
        snprintf(nt_skip, sizeof nt_skip, "cannot enter namespace %s: %s", g_ns[NS_D],
                 strerror(errno));
        goto fail;
    }
    return 0;
fail:
    hosts_remove();
    return 0;
}

static int hosts_down(void **state)
{
    (void)state;
    fp_stop(&C.fx);
    tp_proc *all[] = {&C.P, &C.D, &C.S, &C.P32};
    for (size_t i = 0; i < DX_ARRAY_LEN(all); i++)
        if (all[i]->pid > 0 && !tp_gone(all[i])) tp_stop(all[i], SIGKILL, 10);
    hosts_remove();
    if (G.dir[0]) pdt_teardown();
    return 0;
}

/* `duplex serve` in namespace ns with the cluster's secret, its HTTP port
 * on http_host and its KV port on kv_host; ready. */
static void ns_node(tp_proc *n, int ns, const char *tag, const char *http_host, const char *kv_host,
                    const char *const *extra)
{
    char log[160];
    snprintf(log, sizeof log, "%s/%s.log", G.dir, tag);
    const char *argv[48] = {g_ip, "netns", "exec", g_ns[ns], G.bin, "serve", "--model", G.model,
                            "--port", "0", "--threads", "1", "--kv-cache-mb", "32", "--kv-port",
                            "0", "--kv-secret-file", G.secret, "--kv-transport-tls", "tcp",
                            /* always pull (pd_test.h): a fault must be met,
                             * not avoided by a peer's estimate */
                            "--fixed-costs", PD_TEST_COSTS};
    int k = 22;
    for (int i = 0; extra[i]; i++) argv[k++] = extra[i];
    argv[k] = NULL;
    assert_int_equal(tp_spawn(n, log, (char *const *)argv), 0);
    char key[64];
    snprintf(key, sizeof key, "address=http://%s:", http_host);
    n->http = (int)tp_wait_int(n, key, 60);
    snprintf(key, sizeof key, "kv_port=%s:", kv_host);
    n->kv = (int)tp_wait_int(n, key, 10);
    if (n->http <= 0 || n->kv <= 0) {
        tp_log_tail(n, 20);
        fail_msg("%s did not start in namespace %s", tag, g_ns[ns]);
    }
}

static const char *const k_p_args[] = {"--role",
                                       "prefill",
                                       "--no-enable-prefix-caching",
                                       "--host",
                                       P_DATA,
                                       "--insecure-no-auth",
                                       "--trust-kv-params-from",
                                       "10.254.5.0/24",
                                       "--kv-host",
                                       P_KV,
                                       "--kv-pin-ttl-s",
                                       "3",
                                       NULL};

/* ---- one pull through the proxy ----------------------------------------------- */

static double dmetric(const char *series)
{
    return tc_metric_or(C.D.http, series, 0);
}

static double fallback(const char *reason)
{
    char s[96];
    snprintf(s, sizeof s, "duplex_kv_fallbacks_total{reason=\"%s\"}", reason);
    return dmetric(s);
}

/* A POST to a prefill node, on its data-link address. */
static json_t *post_p(const tp_proc *p, json_t *body)
{
    char *s = json_dumps(body, JSON_COMPACT);
    dx_buf out;
    dx_buf_init(&out, 0);
    long st = tc_http_at(P_DATA, p->http, "POST", "/v1/chat/completions", s, NULL, &out, 120);
    if (st != 200) fail_msg("prefill node: status %ld: %s", st, out.data);
    json_t *v = tc_json(&out);
    free(s);
    dx_buf_free(&out);
    return v;
}

/* A fresh prompt whose KV the holder keeps for D: the decode request's
 * body, with the params as the holder gave them (their remote_host is P's
 * KV address, which the proxy holds for D).  strip: D gets no first token
 * from the holder (one of another KV layout computes it its own way). */
static json_t *held_prompt(tp_proc *holder, int strip, conv *c)
{
    C.seed += 13;
    conv_init(c, C.seed, 120);
    json_t *pb = chat_body(c->msgs, 1);
    json_object_set_new(pb, "stream", json_false());
    json_object_set_new(pb, "kv_transfer_params", prefill_params(c, 0));
    json_t *pr = post_p(holder, pb);
    json_t *pp = json_object_get(pr, "kv_transfer_params");
    assert_true(json_is_object(pp));
    if (strip) {
        json_object_del(pp, "first_token_ids");
        json_object_del(pp, "first_token_model");
    }
    json_t *db = chat_body(c->msgs, 16);
    json_object_set(db, "kv_transfer_params", pp);
    json_decref(pb);
    json_decref(pr);
    return db;
}

/* D's answer (the body of a 200) is the oracle's. */
static void check_answer(const dx_buf *d, conv *c, const char *what)
{
    json_t *dr = tc_json(d);
    json_t *sb = chat_body(c->msgs, 16);
    json_t *ref = post(&C.S, sb, 200);
    json_t *a = answer_of(dr), *b = answer_of(ref);
    if (!json_equal(a, b))
        fail_msg("%s: the answer differs:\n  D:      %s\n  single: %s", what, json_string_value(a),
                 json_string_value(b));
    json_decref(a);
    json_decref(b);
    json_decref(dr);
    json_decref(sb);
    json_decref(ref);
}

/* One prompt held by `holder` and answered by D pulling it; the answer
 * must be the oracle's.  Returns the tokens D pulled. */
static long pull_turn(tp_proc *holder, int strip, const char *what)
{
    conv c;
    json_t *db = held_prompt(holder, strip, &c);
    long pulled = (long)dmetric(PULLED);
    char *s = json_dumps(db, JSON_COMPACT);
    dx_buf out;
    dx_buf_init(&out, 0);
    long st = tc_http(C.D.http, "POST", "/v1/chat/completions", s, &out, 120);
    if (st != 200) fail_msg("%s: status %ld: %s", what, st, out.data);
    check_answer(&out, &c, what);
    long got = (long)dmetric(PULLED) - pulled;
    free(s);
    dx_buf_free(&out);
    json_decref(db);
    conv_free(&c);
    return got;
}

/* One fault on the KV link: the answer is right, nothing was pulled, D
 * counts `reason`. */
static void kv_case(fp_rule rule, const char *reason, const char *what)
{
    double before = fallback(reason);
    long fired = fp_get(&C.fx, &C.fx.st->fired);
    fp_arm(&C.fx, rule);
    long got = pull_turn(&C.P, 0, what);
    fp_pass(&C.fx);
    assert_true(fp_get(&C.fx, &C.fx.st->fired) > fired); /* the fault happened */
    print_message("KV link, %s: the right answer, %ld tokens pulled, fallback %s +%.0f\n", what,
                  got, reason, fallback(reason) - before);
    assert_int_equal(got, 0);
    assert_true(fallback(reason) > before);
}

/* The cluster, once the hosts are up: P, D, the oracle, the proxy. */
static void test_cluster_up(void **state)
{
    (void)state;
    nt_skip_unless_ready();
    ns_node(&C.P, NS_P, "p", P_DATA, P_KV, k_p_args);
    /* D pulls from the holder's address (what its params say), through X */
    const char *da[] = {"--role",
                        "decode",
                        "--kv-peers",
                        "10.254.0.0/16",
                        "--kv-peer-timeout-s",
                        "2",
                        "--kv-pull-timeout-s",
                        "20",
                        NULL};
    ns_node(&C.D, NS_D, "d", "127.0.0.1", "127.0.0.1", da);
    const char *sa[] = {
        "serve",     "--model", G.model,         "--port", "0",
        "--threads", "1",       "--kv-cache-mb", "32",     "--no-enable-prefix-caching",
        NULL};
    char slog[160];
    snprintf(slog, sizeof slog, "%s/s.log", G.dir);
    tp_start(&C.S, G.bin, slog, sa, "duplex serve:"); /* in D's namespace, as the test is */
    /* D reaches P's KV address, 10.254.1.1, in X (a route), where the
     * proxy takes that address and P's port; it connects to P from Y */
    assert_int_equal(nt_sh("ip -n %s addr add %s/32 dev dxctl0", g_ns[NS_X], P_KV), 0);
    assert_int_equal(nt_sh("ip -n %s route add %s/32 via %s", g_ns[NS_D], P_KV, X_CTL), 0);
    fp_start_ns(&C.fx, g_ns[NS_X], g_ns[NS_Y], P_KV, C.P.kv, P_KV, C.P.kv);
    C.seed = 500;
}

/* Healthy first: the pull goes through the proxy and takes the KV. */
static void test_pass_through(void **state)
{
    (void)state;
    nt_skip_unless_ready();
    long got = pull_turn(&C.P, 0, "through the proxy");
    print_message("KV link through the proxy: %ld tokens pulled\n", got);
    assert_true(got > 0);
    assert_true(fp_get(&C.fx, &C.fx.st->connected) > 0);
}

static void test_link_faults(void **state)
{
    (void)state;
    nt_skip_unless_ready();
    kv_case((fp_rule){.fault = FP_BLACKHOLE}, "timeout", "a peer that accepts and never answers");
    kv_case((fp_rule){.fault = FP_RESET, .kv_type = KVPORT_PIN_OK}, "transfer",
            "an RST mid-transfer (after PIN_OK)");
    kv_case((fp_rule){.fault = FP_FREEZE, .kv_type = KVPORT_PIN_OK}, "timeout",
            "a half-open connection mid-transfer");
    kv_case((fp_rule){.fault = FP_STALL, .kv_type = KVPORT_AUTH_OK, .ms = 6000}, "timeout",
            "a stall past --kv-peer-timeout-s (after AUTH_OK)");
}

/* A drip and reordered connection attempts only slow the pulls: each
 * either completes (and the KV is used) or gives up in time; the answer is
 * right either way. */
static void test_slow_links(void **state)
{
    (void)state;
    nt_skip_unless_ready();
    fp_arm(&C.fx, (fp_rule){.fault = FP_DRIP, .after = -1, .ms = 2});
    long got = pull_turn(&C.P, 0, "a byte-by-byte drip");
    fp_pass(&C.fx);
    print_message("KV link, a byte-by-byte drip: the right answer, %ld tokens pulled\n", got);
    /* two decode requests at once: their pulls' connections reach P the
     * other way round */
    conv c[2];
    char *body[2];
    dx_buf out[2];
    CURL *e[2];
    struct curl_slist *h[2];
    for (int i = 0; i < 2; i++) {
        json_t *db = held_prompt(&C.P, 0, &c[i]);
        body[i] = json_dumps(db, JSON_COMPACT);
        json_decref(db);
    }
    fp_arm(&C.fx, (fp_rule){.fault = FP_REORDER, .n = 2, .ms = 3000});
    long connected = fp_get(&C.fx, &C.fx.st->connected), pulled = (long)dmetric(PULLED);
    CURLM *m = curl_multi_init();
    for (int i = 0; i < 2; i++) {
        dx_buf_init(&out[i], 0);
        e[i] = tc_curl(C.D.http, "POST", "/v1/chat/completions", body[i], &out[i], &h[i], 120);
        curl_multi_add_handle(m, e[i]);
    }
    tc_multi_run(m);
    fp_pass(&C.fx);
    for (int i = 0; i < 2; i++) {
        long st = 0;
        curl_easy_getinfo(e[i], CURLINFO_RESPONSE_CODE, &st);
        tc_terminate(&out[i]);
        if (st != 200) fail_msg("reordered: status %ld: %s", st, out[i].data);
        check_answer(&out[i], &c[i], "reordered connection attempts");
        curl_multi_remove_handle(m, e[i]);
        curl_easy_cleanup(e[i]);
        curl_slist_free_all(h[i]);
        dx_buf_free(&out[i]);
        free(body[i]);
        conv_free(&c[i]);
    }
    curl_multi_cleanup(m);
    print_message("KV link, reordered connection attempts: both right, %ld tokens pulled, %ld "
                  "connections made\n",
                  (long)dmetric(PULLED) - pulled, fp_get(&C.fx, &C.fx.st->connected) - connected);
}

/* A peer that speaks another protocol version: every frame on the link
 * says version KVPORT_VERSION - 1.  Refused at the handshake, counted on
 * both sides, logged on both sides; the answer is recomputed. */
static void test_other_version(void **state)
{
    (void)state;
    nt_skip_unless_ready();
    const char *s = "duplex_kv_port_connections_total{event=\"version_refused\"}";
    double before = tc_metric_at(P_DATA, C.P.http, s, 0);
    kv_case((fp_rule){.fault = FP_VERSION, .version = KVPORT_VERSION - 1}, "refused",
            "a peer of another protocol version");
    assert_true(tc_metric_at(P_DATA, C.P.http, s, 0) > before);
    char *pl = tp_slurp(C.P.log, NULL), *dl = tp_slurp(C.D.log, NULL);
    assert_non_null(strstr(pl, "another KV-port protocol version"));
    assert_non_null(strstr(dl, "protocol version"));
    free(pl);
    free(dl);
}

/* A prefill node with another KV layout (its cache in f32, D's in f16),
 * reached directly: refused at HELLO, counted on both, logged on both; the
 * answer is recomputed. */
static void test_other_layout(void **state)
{
    (void)state;
    nt_skip_unless_ready();
    const char *pa[] = {"--role",
                        "prefill",
                        "--no-enable-prefix-caching",
                        "--host",
                        P_DATA,
                        "--insecure-no-auth",
                        "--trust-kv-params-from",
                        "10.254.5.0/24",
                        "--kv-host",
                        P_DATA,
                        "--kv-dtype",
                        "f32",
                        NULL};
    ns_node(&C.P32, NS_P, "p32", P_DATA, P_DATA, pa);
    double refused = fallback("layout_mismatch");
    const char *s = "duplex_kv_port_connections_total{event=\"hello_refused\"}";
    double before = tc_metric_at(P_DATA, C.P32.http, s, 0);
    assert_int_equal(pull_turn(&C.P32, 1, "a holder of another KV layout"), 0);
    assert_true(fallback("layout_mismatch") > refused);
    assert_true(tc_metric_at(P_DATA, C.P32.http, s, 0) > before);
    char *pl = tp_slurp(C.P32.log, NULL), *dl = tp_slurp(C.D.log, NULL);
    assert_non_null(strstr(pl, "does not match this node's model or KV layout"));
    assert_non_null(strstr(dl, "dtype"));
    print_message("KV port, a holder of another KV layout: refused at HELLO, recomputed\n");
    free(pl);
    free(dl);
    stop_ok(&C.P32);
}

/* Last: every node at rest, then a clean stop. */
static void test_at_rest(void **state)
{
    (void)state;
    nt_skip_unless_ready();
    stop_ok(&C.D);
    stop_ok(&C.P);
    stop_ok(&C.S);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_up),    cmocka_unit_test(test_pass_through),
        cmocka_unit_test(test_link_faults),   cmocka_unit_test(test_slow_links),
        cmocka_unit_test(test_other_version), cmocka_unit_test(test_other_layout),
        cmocka_unit_test(test_at_rest),
    };
    return cmocka_run_group_tests_name("KV port through a fault proxy (namespaces, UCX over TCP)",
                                       tests, hosts_up, hosts_down);
}
