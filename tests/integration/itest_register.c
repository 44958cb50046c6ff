/* itest_register: nodes that register themselves in Redis and a router that
 * discovers them (docs/router.md, "Nodes that register themselves") — real
 * processes and a redis-server the test starts on a free loopback port.
 *
 *   register_drain: a node's key holds the documented JSON; the router finds
 *     it and routes to it; `duplex node drain` stops new conversations going
 *     there while a streamed request on it completes and its retained KV is
 *     still pulled for the next turn (by a prefill node whose --kv-peers
 *     allow it only because it is registered); then its key goes and it
 *     exits 0.
 *   kill9_and_model: a node killed with -9 leaves the routing set when its
 *     key expires and its conversation recomputes elsewhere, identically to
 *     one node; a node with another model fingerprint is skipped.
 *   redis_down: a node whose Redis is down serves anyway, logs the outage
 *     once and registers when Redis comes; drain needs its internal key;
 *     SIGUSR1 drains it.
 *   cli: bad values of every new flag and of `duplex node`. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <poll.h>

#include "base/dx_clock.h"
#include "pd_test.h"

static char g_other[160]; /* a model with another fingerprint */

/* ---- Redis -------------------------------------------------------------------- */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static redisContext *redis_conn(int port)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && !c->err) return c;
    if (c) redisFree(c);
    return NULL;
}

static void redis_start(tp_proc *p, int port)
{
    char ps[16], log[160];
    snprintf(ps, sizeof ps, "%d", port);
    snprintf(log, sizeof log, "%s/redis-%d.log", G.dir, G.n_logs++);
    char *argv[] = {"/usr/bin/redis-server", "--port", ps,  "--bind", "127.0.0.1", "--save", "",
                    "--appendonly",          "no",     NULL};
    memset(p, 0, sizeof *p);
    assert_int_equal(tp_spawn(p, log, argv), 0);
    redisContext *c = NULL;
    for (int i = 0; i < 1200 && !(c = redis_conn(port)); i++) tp_sleep_ms(50);
    if (!c) fail_msg("redis-server on %d did not start", port);
    redisFree(c);
}

/* The registration of the node at http_port (malloc'd JSON text), or NULL. */
static char *reg_get(int redis_port, int http_port, long long *pttl)
{
    redisContext *c = redis_conn(redis_port);
    assert_non_null(c);
    redisReply *r = redisCommand(c, "GET duplex:node:http://127.0.0.1:%d", http_port);
    char *v = r && r->type == REDIS_REPLY_STRING ? strdup(r->str) : NULL;
    if (r) freeReplyObject(r);
    if (pttl) {
        r = redisCommand(c, "PTTL duplex:node:http://127.0.0.1:%d", http_port);
        *pttl = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -3;
        if (r) freeReplyObject(r);
    }
    redisFree(c);
    return v;
}

/* Waits (up to 60 s) until the node's key is there (want) or gone, and,
 * when there and has is set, holds `has`. */
static void wait_reg(int redis_port, int http_port, int want, const char *has)
{
    for (int i = 0; i < 1200; i++) {
        char *v = reg_get(redis_port, http_port, NULL);
        int ok = want ? v && (!has || strstr(v, has)) : !v;
        free(v);
        if (ok) return;
        tp_sleep_ms(50);
    }
    fail_msg("node %d: registration %s%s not seen", http_port, want ? "with " : "gone",
             has ? has : "");
}

/* ---- processes ------------------------------------------------------------------- */

/* A node with --register (heartbeat 200 ms) and the role flags, then extra. */
static void reg_node_start(tp_proc *p, const char *tag, int redis_port, const char *const *role,
                           const char *const *extra)
{
    static char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", redis_port);
    const char *argv[40] = {"--register", url, "--heartbeat-ms", "200"};
    int n = 4;
    for (int i = 0; role && role[i]; i++) argv[n++] = role[i];
    for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    node_start(p, tag, argv);
}

/* A router over the registered nodes only, prefilling on a prefill node. */
static void disc_router_start(tp_proc *r, int redis_port)
{
    char url[64], log[160];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", redis_port);
    const char *argv[] = {"router", "--discover",
                          url,      "--port",
                          "0",      "--health-interval-ms",
                          "100",    "--tokenizer",
                          G.model,  "--local-prefill-max-tokens",
                          "0",      NULL};
    snprintf(log, sizeof log, "%s/router-%d.log", G.dir, G.n_logs++);
    tp_start(r, G.bin, log, argv, "duplex router:");
}

static void wait_metric(const tp_proc *p, const char *series, double want)
{
    for (int i = 0; i < 1200 && tc_metric_or(p->http, series, -1) != want; i++) tp_sleep_ms(50);
    if (tc_metric_or(p->http, series, -1) != want)
        fail_msg("%s: %s is %g, wanted %g", p->log, series, tc_metric_or(p->http, series, -1),
                 want);
}

static char *series_of(const char *metric, const tp_proc *n, const char *role)
{
    static char s[256];
    snprintf(s, sizeof s, "%s{node=\"http://127.0.0.1:%d\",role=\"%s\"}", metric, n->http, role);
    return s;
}

static int count_in_log(const tp_proc *p, const char *what)
{
    char *log = tp_slurp(p->log, NULL);
    assert_non_null(log);
    int k = 0;
    for (const char *s = log; (s = strstr(s, what)); s++) k++;
    free(log);
    return k;
}

/* How often the router's log names node n as the decode node, once it has
 * logged `total` completions (a request's line comes after its answer). */
static int decoded_on(const tp_proc *r, const tp_proc *n, int total)
{
    const char *done = "POST /v1/chat/completions 200 ";
    for (int i = 0; i < 1200 && count_in_log(r, done) < total; i++) tp_sleep_ms(50);
    assert_int_equal(count_in_log(r, done), total);
    char key[64];
    snprintf(key, sizeof key, "decode=http://127.0.0.1:%d ", n->http);
    return count_in_log(r, key);
}

/* Exit 0 within 120 s, without a signal (it stops by itself). */
static void exits_ok(tp_proc *p)
{
    int st = tp_stop(p, 0, 120);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        tp_log_tail(p, 30);
        fail_msg("%s: status %d, wanted exit 0", p->log, st);
    }
}

/* ---- tests ------------------------------------------------------------------------- */

static void check_registration(int redis_port, const tp_proc *D)
{
    long long pttl = 0;
    char *v = reg_get(redis_port, D->http, &pttl);
    assert_non_null(v);
    json_error_t je;
    json_t *o = json_loads(v, 0, &je);
    assert_non_null(o);
    char url[64], kv[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", D->http);
    snprintf(kv, sizeof kv, "127.0.0.1:%d", D->kv);
    assert_string_equal(json_string_value(json_object_get(o, "url")), url);
    assert_string_equal(json_string_value(json_object_get(o, "role")), "decode");
    assert_string_equal(json_string_value(json_object_get(o, "kv")), kv);
    assert_int_equal(strlen(json_string_value(json_object_get(o, "model"))), 32);
    assert_true(json_is_false(json_object_get(o, "draining")));
    assert_int_equal(json_integer_value(json_object_get(o, "heartbeat_ms")), 200);
    assert_true(json_integer_value(json_object_get(o, "free_kv_blocks")) > 0);
    assert_true(json_is_integer(json_object_get(o, "outstanding")));
    assert_true(json_integer_value(json_object_get(o, "started_ms")) > 0);
    assert_true(pttl > 0 && pttl <= 600); /* 3 x the heartbeat */
    json_decref(o);
    free(v);
}

/* Redis on a free port; registered P (extra flags px), D0 (d0x) and, unless
 * NULL, D1; the oracle S; a router over what is registered, healthy and
 * with every node found.  Returns the Redis port. */
static int cluster_up(tp_proc *Rd, tp_proc *P, const char *const *px, tp_proc *D0,
                      const char *const *d0x, tp_proc *D1, tp_proc *S, tp_proc *R)
{
    int rp = free_port();
    redis_start(Rd, rp);
    reg_node_start(P, "p", rp, k_pa, px);
    reg_node_start(D0, "d0", rp, k_da, d0x);
    if (D1) reg_node_start(D1, "d1", rp, k_da, NULL);
    node_start(S, "s", k_ref);
    disc_router_start(R, rp);
    wait_metric(R, "duplex_router_discovered_nodes", D1 ? 3 : 2);
    router_wait_healthy(R);
    return rp;
}

static void test_register_drain(void **state)
{
    (void)state;
    tp_proc Rd, P, D0, D1, S, R;
    /* D0 drains until its retained KV is gone (not the grace period) */
    const char *d0x[] = {"--decoder-kv-blocks-ttl", "30", "--shutdown-grace-s", "600", NULL};
    /* P may pull only from 10.255.255.1 by its list: D0's address comes from
     * its registration */
    const char *px[] = {"--kv-peers", "10.255.255.1", NULL};
    int rp = cluster_up(&Rd, &P, px, &D0, d0x, NULL, &S, &R);
    check_registration(rp, &D0);

    conv c, r;
    conv_init(&c, 1401, 60);
    conv_init(&r, 1401, 60);
    assert_same(turn_router(&c, &R, 24, NULL), turn_single(&r, &S, 24), 1);
    assert_int_equal(decoded_on(&R, &D0, 1), 1);

    reg_node_start(&D1, "d1", rp, k_da, NULL);
    wait_metric(&R, "duplex_router_discovered_nodes", 3);
    wait_metric(&R, series_of("duplex_router_node_healthy", &D1, "decode"), 1);

    /* a streamed request runs on D0 when the drain comes */
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"go on\"}],"
             "\"max_tokens\":3000,\"ignore_eos\":true,\"stream\":true}",
             G.model_name);
    int fd = tc_raw_stream_open(D0.http, "/v1/chat/completions", body, 64);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s node drain http://127.0.0.1:%d", G.bin, D0.http);
    dx_buf out;
    dx_buf_init(&out, 0);
    assert_int_equal(tc_run_cmd(cmd, &out), 0);
    tc_terminate(&out);
    if (!strstr(out.data, "\"running\":1")) fail_msg("drain answered %s", out.data);
    wait_metric(&R, series_of("duplex_router_node_draining", &D0, "decode"), 1);
    wait_reg(rp, D0.http, 1, "\"draining\":true");

    /* the conversation's next turn: decoded elsewhere, its history pulled
     * from the draining holder */
    char allowed[64];
    snprintf(allowed, sizeof allowed, "KV pulls from 127.0.0.1:%d ", D0.kv);
    for (int i = 0; i < 1200 && !count_in_log(&P, allowed); i++) tp_sleep_ms(50);
    assert_true(count_in_log(&P, allowed) > 0);
    long pulled = metric(&P, PULLED);
    user_turn(&c, &r, 1402, 12);
    assert_same(turn_router(&c, &R, 24, NULL), turn_single(&r, &S, 24), 2);
    assert_true(metric(&P, PULLED) > pulled);
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"peer_not_allowed\"}"), 0);
    /* new conversations never go to D0 */
    for (int k = 0; k < 3; k++) {
        conv n, m;
        conv_init(&n, 1410 + (unsigned)k, 30);
        conv_init(&m, 1410 + (unsigned)k, 30);
        assert_same(turn_router(&n, &R, 12, NULL), turn_single(&m, &S, 12), 1);
        conv_free(&n);
        conv_free(&m);
    }
    assert_int_equal(decoded_on(&R, &D0, 5), 1);

    /* the stream finishes whole: 3000 events, one a read when the machine
     * is loaded, so the bound is time (4 minutes), not a count of reads */
    dx_buf_reset(&out);
    ssize_t k = 1;
    uint64_t until = dx_now_ns() + 240ull * 1000000000ull;
    while (dx_now_ns() < until && k > 0 && !(out.data && strstr(out.data, "data: [DONE]"))) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 50) != 1) continue;
        char buf[8192];
        if ((k = read(fd, buf, sizeof buf)) > 0) dx_buf_append(&out, buf, (size_t)k);
        tc_terminate(&out);
    }
    if (!out.data || !strstr(out.data, "data: [DONE]"))
        fail_msg("the stream on the draining node did not finish (read %zd, errno %d, %zu bytes): "
                 "%.300s",
                 k, errno, out.len, out.data ? out.data : "");
    assert_non_null(strstr(out.data, "\"finish_reason\":\"length\""));
    close(fd);
    dx_buf_free(&out);

    /* its retained KV expires: the key goes, the process exits 0 */
    exits_ok(&D0);
    wait_reg(rp, D0.http, 0, NULL);
    wait_metric(&R, "duplex_router_discovered_nodes", 2);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&R);
    stop_ok(&P);
    stop_ok(&D1);
    stop_ok(&S);
    wait_reg(rp, D1.http, 0, NULL); /* a clean stop removes the key */
    (void)tp_stop_clean(&Rd);       /* the router */
}

static void test_kill9_and_model(void **state)
{
    (void)state;
    tp_proc Rd, P, D0, D1, X, S, R;
    int rp = cluster_up(&Rd, &P, NULL, &D0, NULL, &D1, &S, &R);

    /* another model registers: skipped (the first registered node's model rules) */
    const char *xm[] = {"--model", g_other, NULL};
    reg_node_start(&X, "x", rp, k_da, xm);
    wait_reg(rp, X.http, 1, NULL);
    wait_metric(&R, "duplex_router_discovery_skipped_nodes", 1);
    assert_int_equal(tc_metric(R.http, "duplex_router_discovered_nodes"), 3);
    assert_true(tc_metric_or(R.http, series_of("duplex_router_node_healthy", &X, "decode"), -1) ==
                -1);

    /* a value that is not a registration: skipped, counted */
    redisContext *rc = redis_conn(rp);
    assert_non_null(rc);
    freeReplyObject(redisCommand(rc, "SET duplex:node:junk {\"url\":7} PX 600000"));
    redisFree(rc);
    wait_metric(&R, "duplex_router_discovery_bad_registrations", 1);
    assert_int_equal(tc_metric(R.http, "duplex_router_discovered_nodes"), 3);

    conv c, r;
    conv_init(&c, 1501, 60);
    conv_init(&r, 1501, 60);
    assert_same(turn_router(&c, &R, 24, NULL), turn_single(&r, &S, 24), 1);
    tp_proc *holder = decoded_on(&R, &D0, 1) ? &D0 : &D1;
    tp_proc *other = holder == &D0 ? &D1 : &D0;
    tp_stop(holder, SIGKILL, 30);
    /* its key expires (3 heartbeats) and the next scan drops it */
    wait_reg(rp, holder->http, 0, NULL);
    wait_metric(&R, "duplex_router_discovered_nodes", 2);
    assert_true(
        tc_metric_or(R.http, series_of("duplex_router_node_healthy", holder, "decode"), -1) == -1);
    user_turn(&c, &r, 1502, 12);
    assert_int_equal(decoded_on(&R, other, 1), 0);
    assert_same(turn_router(&c, &R, 24, NULL), turn_single(&r, &S, 24), 2);
    assert_int_equal(decoded_on(&R, other, 2), 1);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&R);
    stop_ok(&P);
    stop_ok(other);
    stop_ok(&X);
    stop_ok(&S);
    (void)tp_stop_clean(&Rd); /* the router */
}

static void test_redis_down(void **state)
{
    (void)state;
    int rp = free_port();
    char key[200], cmd[600];
    snprintf(key, sizeof key, "%s/internal.key", G.dir);
    FILE *f = fopen(key, "w");
    assert_non_null(f);
    fputs("register-test-internal-key-0123456789\n", f);
    fclose(f);
    const char *ik[] = {"--internal-key-file", key, NULL};
    tp_proc N, Rd;
    reg_node_start(&N, "n", rp, NULL, ik); /* no Redis on rp yet */
    json_t *b = json_pack("{s:s, s:[{s:s,s:s}], s:i}", "model", G.model_name, "messages", "role",
                          "user", "content", "hello", "max_tokens", 4);
    json_decref(post(&N, b, 200)); /* it serves */
    for (int i = 0; i < 1200 && !count_in_log(&N, "serving anyway"); i++) tp_sleep_ms(50);
    redis_start(&Rd, rp);
    wait_reg(rp, N.http, 1, "\"draining\":false");
    assert_int_equal(count_in_log(&N, "serving anyway"), 1); /* once per outage */
    assert_int_equal(count_in_log(&N, "registration: back"), 1);
    /* drain needs the internal key */
    snprintf(cmd, sizeof cmd, "%s node drain http://127.0.0.1:%d 2>&1", G.bin, N.http);
    dx_buf out;
    dx_buf_init(&out, 0);
    assert_int_not_equal(tc_run_cmd(cmd, &out), 0);
    tc_terminate(&out);
    assert_non_null(strstr(out.data, "401"));
    dx_buf_free(&out);
    json_decref(post(&N, b, 200)); /* still serving */
    json_decref(b);
    kill(N.pid, SIGUSR1); /* the same as an authorised drain */
    exits_ok(&N);
    wait_reg(rp, N.http, 0, NULL);
    assert_int_equal(count_in_log(&N, "SIGUSR1 received"), 1);
    (void)tp_stop_clean(&Rd); /* the router */
}

static void test_cli(void **state)
{
    (void)state;
    char a[600];
    const char *b = G.bin;
    snprintf(a, sizeof a, "--model %s --register http://127.0.0.1:1", G.model);
    tp_expect(b, "serve", 2, "--register: 'http://127.0.0.1:1': a Redis URL starts with redis://",
              a);
    snprintf(a, sizeof a, "--model %s --register redis://127.0.0.1:99999", G.model);
    tp_expect(b, "serve", 2, "the port is not 1..65535", a);
    snprintf(a, sizeof a, "--model %s --register redis://127.0.0.1 --heartbeat-ms 0", G.model);
    tp_expect(b, "serve", 2, "--heartbeat-ms", a);
    snprintf(a, sizeof a, "--model %s --register redis://127.0.0.1 --register-prefix 'a*'",
             G.model);
    tp_expect(b, "serve", 2, "--register-prefix: 'a*'", a);
    snprintf(a, sizeof a, "--model %s --register redis://127.0.0.1 --advertise-url ftp://h:1",
             G.model);
    tp_expect(b, "serve", 2, "--advertise-url: 'ftp://h:1'", a);
    snprintf(a, sizeof a, "--model %s --advertise-url http://h:1", G.model);
    tp_expect(b, "serve", 2, "--advertise-url needs --register", a);
    snprintf(a, sizeof a, "--model %s --heartbeat-ms 500", G.model);
    tp_expect(b, "serve", 2, "--heartbeat-ms needs --register", a);
    snprintf(a, sizeof a, "--model %s --register redis://127.0.0.1 --host 0.0.0.0", G.model);
    tp_expect(b, "serve", 2, "needs --advertise-url", a);
    tp_expect(b, "router", 2, "--discover: 'redis://h:0'", "--discover redis://h:0");
    tp_expect(b, "router", 2, "--state-prefix: '' must be 1..64 bytes",
              "--discover redis://127.0.0.1 --state-prefix ''");
    tp_expect(b, "router", 2, "--decode URL[,URL...] is required (or --discover", "--port 0");
    tp_expect(b, "node", 2, "the node's URL (http://HOST:PORT) is required", "drain");
    tp_expect(b, "node", 2, "'ftp://h:1': wants http://HOST:PORT", "drain ftp://h:1");
    tp_expect(b, "node", 1, "http://127.0.0.1:1/admin/drain", "drain http://127.0.0.1:1");
    tp_expect(b, "node", 2, "--internal-key-file",
              "drain http://127.0.0.1:1 --internal-key-file /nonexistent");
    tp_expect(b, "node", 2, "unknown command 'frob'", "frob");
}

static int setup(void **state)
{
    (void)state;
    if (pdt_setup("register")) return -1;
    snprintf(g_other, sizeof g_other, "%s/other.gguf", G.dir);
    synth_config c = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 6};
    return synth_write(&c, g_other) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_redis_down),
        cmocka_unit_test(test_kill9_and_model),
        cmocka_unit_test(test_register_drain),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
