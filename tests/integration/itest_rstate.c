/* itest_rstate: the router's conversation map shared in Redis (router_store,
 * `duplex router --state`), against a redis-server the test starts on a free
 * loopback port:
 *   - the Redis backend itself: the key and value on the server, the TTL,
 *     compare-and-set (an older turn finishing last never replaces a newer
 *     one; equal token counts take the newer write), the superseded key
 *     dropped, NOSCRIPT answered with EVAL, an unknown node URL, Redis
 *     killed (errors at once, reconnection with backoff) and stopped (the
 *     deadline);
 *   - 2 routers + 2 prefill + 2 decode nodes: conversations whose turns
 *     alternate between the routers keep their decode node and reuse its KV
 *     on every turn, outputs byte-identical to a single node; one router
 *     killed, the other serves every conversation with reuse;
 *   - Redis killed under a router: requests still succeed (recomputed), the
 *     errors are counted and logged once; Redis back on its port: reuse
 *     resumes. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pd_test.h"
#include "redis_proc.h"
#include "router/router_store.h"
#include "../store_test.h"

/* ---- the backend, driven directly ------------------------------------------------ */

/* The test's redis-server, its log in the test's folder. */
static void redis_up(rp_redis *rd, const char *tag)
{
    memset(rd, 0, sizeof *rd);
    char log[160];
    snprintf(log, sizeof log, "%s/redis-%s.log", G.dir, tag);
    rp_start(rd, log);
}

static const char *const k_urls[] = {"http://127.0.0.1:1001", "http://127.0.0.1:1002"};

static const char *node_url(void *user, int node)
{
    (void)user;
    return node >= 0 && node < 2 ? k_urls[node] : NULL;
}

static int node_of(void *user, const char *url, size_t len)
{
    (void)user;
    for (int i = 0; i < 2; i++)
        if (strlen(k_urls[i]) == len && !memcmp(k_urls[i], url, len)) return i;
    return -1;
}

/* A lookup, the loop run until it is answered. */
static st_got get_keys(uv_loop_t *loop, router_store *s, const router_key *k, size_t n)
{
    st_got g = {0};
    router_store_op *op;
    router_store_get(s, k, n, st_on_got, &g, &op);
    for (int i = 0; i < 100000 && !g.calls; i++) uv_run(loop, UV_RUN_ONCE);
    assert_true(g.calls);
    return g;
}

static st_got get1(uv_loop_t *loop, router_store *s, const router_key *k)
{
    return get_keys(loop, s, k, 1);
}

static void put(router_store *s, const router_key *k, int node, const char *params, uint32_t n)
{
    router_store_put(s, k, NULL, node, params, params ? strlen(params) : 0, n, 60);
}

static void on_pause(uv_timer_t *t)
{
    (void)t;
}

/* A lookup answered without error, retried (the loop turning) while the
 * store reconnects. */
static st_got get_when_back(uv_loop_t *loop, router_store *s, const router_key *k)
{
    st_got g = {0};
    for (int i = 0; i < 600; i++) {
        g = get1(loop, s, k);
        if (g.rc == 0) return g;
        uv_timer_t t;
        uv_timer_init(loop, &t);
        uv_timer_start(&t, on_pause, 50, 0);
        uv_run(loop, UV_RUN_ONCE);
        uv_close((uv_handle_t *)&t, NULL);
        uv_run(loop, UV_RUN_NOWAIT);
    }
    fail_msg("the store did not come back");
    return g;
}

static void test_backend(void **state)
{
    (void)state;
    rp_redis rd;
    redis_up(&rd, "backend");
    uv_loop_t loop;
    uv_loop_init(&loop);
    router_store_config cfg = {.loop = &loop,
                               .url = rd.url,
                               .prefix = "t1:",
                               .timeout_ms = 200,
                               .node_url = node_url,
                               .node_of = node_of};
    router_store *s;
    assert_int_equal(router_store_create(&cfg, &s), 0);
    assert_true(router_store_is_shared(s));
    router_key k = {.lo = 0x1122334455667788ull, .hi = 0x99aabbccddeeff00ull};
    router_key k2 = {.lo = 7, .hi = 8}, k3 = {.lo = 9, .hi = 10};

    st_got g = get1(&loop, s, &k);
    assert_int_equal(g.rc, 0);
    assert_false(g.found);
    /* turn 2 finishes first, turn 1 last: turn 2's params stay */
    put(s, &k, 1, "{\"t\":2}", 20);
    put(s, &k, 0, "{\"t\":1}", 10);
    g = get1(&loop, s, &k);
    assert_true(g.found);
    assert_int_equal(g.node, 1);
    assert_int_equal(g.tokens, 20);
    assert_string_equal(g.params, "{\"t\":2}");
    assert_int_equal(router_store_errors(s, "put"), 0);
    /* on the server: the documented key and value, with the TTL */
    redisReply *rep = rp_cmd(&rd, "GET t1:conv:99aabbccddeeff001122334455667788");
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_string_equal(rep->str, "20 http://127.0.0.1:1002\n{\"t\":2}");
    freeReplyObject(rep);
    rep = rp_cmd(&rd, "PTTL t1:conv:99aabbccddeeff001122334455667788");
    assert_true(rep->integer > 50000 && rep->integer <= 60000);
    freeReplyObject(rep);
    /* equal token counts: the newer write */
    put(s, &k, 0, "{\"t\":\"2b\"}", 20);
    g = get1(&loop, s, &k);
    assert_int_equal(g.node, 0);
    assert_string_equal(g.params, "{\"t\":\"2b\"}");
    /* an affinity-only write never replaces params */
    put(s, &k, 1, NULL, 0);
    g = get1(&loop, s, &k);
    assert_string_equal(g.params, "{\"t\":\"2b\"}");
    /* the server lost the script: EVALSHA's NOSCRIPT is answered with EVAL */
    freeReplyObject(rp_cmd(&rd, "SCRIPT FLUSH"));
    put(s, &k, 1, "{\"t\":3}", 30);
    get1(&loop, s, &k); /* sent before the EVAL that answered NOSCRIPT: may precede it */
    g = get1(&loop, s, &k);
    assert_string_equal(g.params, "{\"t\":3}");
    assert_int_equal(router_store_errors(s, "put"), 0);
    /* a superseding entry drops the one it replaces; content keys: the
     * longest found wins */
    router_store_put(s, &k2, &k, 0, "{\"t\":4}", 7, 40, 60);
    router_key ks[] = {k3, k, k2};
    g = get_keys(&loop, s, ks, 3);
    assert_true(g.found);
    assert_int_equal(g.which, 2);
    assert_false(get1(&loop, s, &k).found);
    /* a node this router does not know: no affinity */
    freeReplyObject(rp_cmd(&rd, "SET t1:conv:%016llx%016llx %s", (unsigned long long)k3.hi,
                           (unsigned long long)k3.lo, "5 http://127.0.0.1:9\n{}"));
    assert_false(get1(&loop, s, &k3).found);
    assert_int_equal(router_store_errors(s, "get"), 0);

    /* killed: lookups fail (counted), then the store reconnects by itself */
    rp_stop(&rd);
    g = get1(&loop, s, &k2);
    assert_true(g.rc < 0);
    assert_true(router_store_errors(s, "get") >= 1);
    rp_start(&rd, rd.log);
    g = get_when_back(&loop, s, &k2);
    assert_false(g.found); /* nothing was saved */
    put(s, &k2, 1, "{\"t\":5}", 50);
    assert_string_equal(get1(&loop, s, &k2).params, "{\"t\":5}");
    /* stopped: the deadline answers */
    uint64_t before = router_store_errors(s, "get");
    kill(rd.p.pid, SIGSTOP);
    g = get1(&loop, s, &k2);
    assert_int_equal(g.rc, DX_ETIMEDOUT);
    assert_int_equal(router_store_errors(s, "get"), before + 1);
    kill(rd.p.pid, SIGCONT);
    assert_string_equal(get_when_back(&loop, s, &k2).params, "{\"t\":5}");

    router_store_destroy(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    rp_stop(&rd);
}

/* The script itself on the server: a value it cannot read is replaced, and
 * ties are written. */
static void test_cas_script(void **state)
{
    (void)state;
    rp_redis rd;
    redis_up(&rd, "lua");
    redisReply *r = rp_cmd(&rd, "EVAL %s 1 k %s 10 60000", router_store_cas_lua, "10 u\np");
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
    r = rp_cmd(&rd, "EVAL %s 1 k %s 10 60000", router_store_cas_lua, "10 u\nq");
    assert_int_equal(r->integer, 1); /* a tie: written */
    freeReplyObject(r);
    r = rp_cmd(&rd, "EVAL %s 1 k %s 9 60000", router_store_cas_lua, "9 u\nr");
    assert_int_equal(r->integer, 0); /* older: kept */
    freeReplyObject(r);
    r = rp_cmd(&rd, "GET k");
    assert_string_equal(r->str, "10 u\nq");
    freeReplyObject(r);
    freeReplyObject(rp_cmd(&rd, "SET k garbage"));
    r = rp_cmd(&rd, "EVAL %s 2 k d %s 1 60000", router_store_cas_lua, "1 u\ns");
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
    rp_stop(&rd);
}

/* ---- routers sharing Redis --------------------------------------------------------- */

/* 2 prefill nodes, 2 decode nodes and the single-node oracle. */
typedef struct {
    tp_proc P0, P1, D0, D1, S;
} nodes4;

static void nodes_start(nodes4 *n)
{
    node_start(&n->P0, "p0", k_pa);
    node_start(&n->P1, "p1", k_pa);
    node_start(&n->D0, "d0", k_da);
    node_start(&n->D1, "d1", k_da);
    node_start(&n->S, "s", k_ref);
}

static void nodes_stop(nodes4 *n)
{
    stop_ok(&n->P0);
    stop_ok(&n->P1);
    stop_ok(&n->D0);
    stop_ok(&n->D1);
    stop_ok(&n->S);
}

/* A router over them (decode nodes in the order given) sharing Redis. */
static void router_state_start(tp_proc *R, nodes4 *n, int reversed, const char *url)
{
    /* a deadline no loaded machine misses: these tests are about shared
     * state, not slow Redis (test_backend and itest_fault_router time out
     * on purpose); a lookup past 50 ms on a busy 2-core machine routed a
     * turn without its params once, and its history was tokenised from
     * text */
    const char *ra[] = {
        "--local-prefill-max-tokens", "0",    "--state", url, "--state-prefix", "it:",
        "--state-timeout-ms",         "5000", NULL};
    tp_proc *pp[] = {&n->P0, &n->P1}, *dd[] = {&n->D0, &n->D1}, *dr[] = {&n->D1, &n->D0};
    router_start(R, pp, 2, reversed ? dr : dd, 2, ra);
}

static long pulled(const nodes4 *n)
{
    return metric(&n->P0, PULLED) + metric(&n->P1, PULLED);
}

/* One turn of a conversation through R, checked against the single node
 * (unless ref is NULL): the same answer, and (want_reuse) every token the
 * decode node held pulled instead of recomputed, or (else) nothing pulled. */
static void turn_reuse(conv *c, conv *ref, const tp_proc *R, const nodes4 *n, const char *const *h,
                       int t, int want_reuse)
{
    long held = c->prompt + c->gen > 0 ? (c->prompt + c->gen - 1) / BS * BS : 0;
    long before = pulled(n);
    json_t *a = turn_router(c, R, 24, h);
    if (ref)
        assert_same(a, turn_single(ref, &n->S, 24), t);
    else
        json_decref(a);
    assert_int_equal(pulled(n) - before, want_reuse ? held : 0);
    if (want_reuse) assert_true(c->p_prompt >= held); /* the client's usage: cached tokens */
}

/* Two conversations (one keyed by its content, one by an id) alternate
 * between two routers: every turn after the first reuses the decode node's
 * KV.  Then one router is killed and the other carries on with reuse. */
static void test_two_routers(void **state)
{
    (void)state;
    rp_redis rd;
    redis_up(&rd, "2r");
    nodes4 n;
    nodes_start(&n);
    tp_proc R0, R1;
    router_state_start(&R0, &n, 0, rd.url);
    router_state_start(&R1, &n, 1, rd.url); /* the nodes listed the other way round */
    const char *hid[] = {"X-Conversation-Id: alternating", NULL};
    conv c[2], r[2];
    for (int i = 0; i < 2; i++) {
        conv_init(&c[i], 900 + (unsigned)i, 60 + 20 * i);
        conv_init(&r[i], 900 + (unsigned)i, 60 + 20 * i);
    }
    enum { TURNS = 6, KILL_AFTER = 4 };
    for (int t = 1; t <= TURNS; t++) {
        for (int i = 0; i < 2; i++) {
            const tp_proc *R = t > KILL_AFTER || (t + i) % 2 ? &R1 : &R0;
            turn_reuse(&c[i], &r[i], R, &n, i ? hid : NULL, t, t > 1);
            user_turn(&c[i], &r[i], 950 + (unsigned)(t * 2 + i), 12);
        }
        if (t == KILL_AFTER) tp_stop(&R0, SIGKILL, 30);
    }
    long hits = metric(&R1, "duplex_router_affinity_hits_total");
    assert_true(hits >= 2 * (TURNS - KILL_AFTER) + 2); /* every turn R1 served after the first */
    assert_int_equal(metric(&R1, "duplex_router_state_errors_total{op=\"get\"}"), 0);
    assert_int_equal(metric(&R1, "duplex_router_state_errors_total{op=\"put\"}"), 0);
    redisReply *rep = rp_cmd(&rd, "KEYS it:conv:*");
    assert_true(rep->elements >= 2);
    freeReplyObject(rep);
    for (int i = 0; i < 2; i++) {
        conv_free(&c[i]);
        conv_free(&r[i]);
    }
    stop_ok(&R1);
    nodes_stop(&n);
    rp_stop(&rd);
}

/* Occurrences of s in p's log. */
static int log_count(const tp_proc *p, const char *s)
{
    size_t n;
    char *buf = tp_slurp(p->log, &n);
    int k = 0;
    for (const char *q = buf; q && (q = strstr(q, s)); q += strlen(s)) k++;
    free(buf);
    return k;
}

/* Redis killed under the router: every request still answered (recomputed),
 * errors counted, one warning; Redis back on its port: reuse resumes. */
static void test_redis_killed(void **state)
{
    (void)state;
    rp_redis rd;
    redis_up(&rd, "kill");
    nodes4 n;
    nodes_start(&n);
    tp_proc R;
    router_state_start(&R, &n, 0, rd.url);
    const char *h[] = {"X-Conversation-Id: outage", NULL};
    conv c, r;
    conv_init(&c, 1001, 70);
    conv_init(&r, 1001, 70);
    turn_reuse(&c, &r, &R, &n, h, 1, 0);
    user_turn(&c, &r, 1011, 12);
    turn_reuse(&c, &r, &R, &n, h, 2, 1);
    rp_stop(&rd);
    /* No state: every turn recomputed, none fails.  Without the stored
     * params the replies' tokens are lost too, and the history is tokenised
     * from its text (docs/pd.md, token-faithful history): with the test
     * model's arbitrary text that may differ from the generated tokens, so
     * the answers are no longer compared with the single node's. */
    for (int t = 3; t <= 5; t++) {
        user_turn(&c, &r, 1010 + (unsigned)t, 12);
        turn_reuse(&c, NULL, &R, &n, h, t, 0);
    }
    assert_true(metric(&R, "duplex_router_state_errors_total{op=\"get\"}") >= 3);
    assert_int_equal(metric(&R, "duplex_router_state_up"), 0);
    assert_int_equal(log_count(&R, "routing without affinity"), 1);
    rp_start(&rd, rd.log); /* the same port, empty */
    for (int i = 0; i < 600 && tc_metric_or(R.http, "duplex_router_state_up", 0) != 1; i++)
        tp_sleep_ms(50);
    assert_int_equal(metric(&R, "duplex_router_state_up"), 1);
    user_turn(&c, &r, 1016, 12);
    turn_reuse(&c, NULL, &R, &n, h, 6, 0); /* the entry was lost with Redis */
    user_turn(&c, &r, 1017, 12);
    turn_reuse(&c, NULL, &R, &n, h, 7, 1);
    assert_int_equal(log_count(&R, "affinity resumes"), 1);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&R);
    nodes_stop(&n);
    rp_stop(&rd);
}

/* A router whose Redis cannot be reached at start-up (it has no internal
 * key to derive the routers' common secret from) says so and exits 1. */
static void test_no_redis_at_start(void **state)
{
    (void)state;
    char args[256];
    snprintf(args, sizeof args, "--decode http://127.0.0.1:1 --port 0 --state redis://127.0.0.1:%d",
             rp_free_port());
    tp_expect(G.bin, "router", 1, "the routers' shared key secret", args);
}

static int setup(void **state)
{
    (void)state;
    return pdt_setup("rstate");
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend),           cmocka_unit_test(test_cas_script),
        cmocka_unit_test(test_two_routers),       cmocka_unit_test(test_redis_killed),
        cmocka_unit_test(test_no_redis_at_start),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
