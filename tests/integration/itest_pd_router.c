/* itest_pd_router: the whole system — `duplex router` in front of prefill and
 * decode nodes, all real processes on loopback — against one `--role both`
 * node without prefix caching that sees the same conversations: the
 * bidirectional flow (content-derived keys) with the cluster's usage, local
 * prefill on the decode node (by count, and by the nodes' costs: a decode
 * node busy with streams gets no local prefills until it is idle), the
 * one-way flow, conversation ids and tenants,
 * forged params, 2 prefill + 2 decode nodes with 8 concurrent conversations,
 * a decode node killed between turns and a prefill node killed mid-request.
 * Outputs must be byte-identical every time. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pd_test.h"

/* ---- tests ---------------------------------------------------------------------- */

/* 8 turns, no conversation id (keys derived from the messages): from turn 2
 * the prefill node pulls everything the decode node held; the client's
 * cached_tokens is exactly what neither node computed. */
static void test_bidirectional_through_router(void **state)
{
    (void)state;
    tp_proc P, D, S, R;
    cluster_start(&P, &D, NULL, &S, &R);
    conv c, r;
    conv_init(&c, 201, 90);
    conv_init(&r, 201, 90);
    for (int t = 1; t <= 8; t++) {
        long held = c.prompt + c.gen > 0 ? (c.prompt + c.gen - 1) / BS * BS : 0;
        long pulled = metric(&P, PULLED), pc = metric(&P, COMPUTED), dc = metric(&D, COMPUTED);
        json_t *a = turn_router(&c, &R, 32 + (t * 11) % 33, NULL);
        assert_same(a, turn_single(&r, &S, 32 + (t * 11) % 33), t);
        /* the cluster's cached tokens: those neither node computed */
        long cp = metric(&P, COMPUTED) - pc, cd = metric(&D, COMPUTED) - dc;
        assert_int_equal(c.p_prompt, c.prompt - (cp > cd ? cp : cd));
        if (t >= 2) assert_int_equal(metric(&P, PULLED) - pulled, held);
        user_turn(&c, &r, 210 + (unsigned)t, 20 + 5 * t);
    }
    assert_int_equal(metric(&R, "duplex_router_affinity_hits_total"), 7);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&R);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* The count rule (--local-prefill-max-tokens 256): small new parts go
 * straight to the decode node that holds the history, the prefill node
 * sees turn 1 only, and the decode node computes just the new tokens. */
static void test_local_prefill(void **state)
{
    (void)state;
    tp_proc P, D, S, R;
    node_start(&P, "p", k_pa);
    node_start(&D, "d", k_da);
    node_start(&S, "s", k_ref);
    tp_proc *pp[] = {&P}, *dd[] = {&D};
    const char *ra[] = {"--local-prefill-max-tokens", "256", NULL};
    router_start(&R, pp, 1, dd, 1, ra);
    conv c, r;
    conv_init(&c, 301, 200); /* turn 1: over 256 tokens, via the prefill node */
    conv_init(&r, 301, 200);
    for (int t = 1; t <= 4; t++) {
        long prev = c.prompt + c.gen, dc = metric(&D, COMPUTED);
        json_t *a = turn_router(&c, &R, 40, NULL);
        assert_same(a, turn_single(&r, &S, 40), t);
        if (t >= 2) assert_true(metric(&D, COMPUTED) - dc <= c.prompt - prev + BS);
        user_turn(&c, &r, 310 + (unsigned)t, 15);
    }
    assert_int_equal(metric(&R, "duplex_router_routed_total{via=\"prefill\"}"), 1);
    assert_int_equal(metric(&R, "duplex_router_routed_total{via=\"local\"}"), 3);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&R);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* --mode unidirectional with nodes that keep nothing: the prefill node
 * recomputes every history; outputs do not change. */
static void test_unidirectional_through_router(void **state)
{
    (void)state;
    const char *pa[] = {"--role", "prefill", "--no-enable-prefix-caching", NULL};
    const char *da[] = {"--role", "decode", NULL};
    const char *ra[] = {"--mode", "unidirectional", "--local-prefill-max-tokens", "0", NULL};
    tp_proc P, D, S, R;
    node_start(&P, "p", pa);
    node_start(&D, "d", da);
    node_start(&S, "s", k_ref);
    tp_proc *pp[] = {&P}, *dd[] = {&D};
    router_start(&R, pp, 1, dd, 1, ra);
    conv c, r;
    conv_init(&c, 401, 80);
    conv_init(&r, 401, 80);
    for (int t = 1; t <= 4; t++) {
        json_t *a = turn_router(&c, &R, 40, NULL);
        assert_same(a, turn_single(&r, &S, 40), t);
        user_turn(&c, &r, 410 + (unsigned)t, 25);
    }
    assert_int_equal(metric(&P, PULLED), 0);
    assert_int_equal(metric(&P, LOCAL), 0);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&R);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* Two tenants with one conversation id each get their own history; a
 * guessed id finds nothing; params a client forges never reach a node. */
static void test_ids_tenants_forgery(void **state)
{
    (void)state;
    tp_proc P, D, S, R;
    cluster_start(&P, &D, NULL, &S, &R);
    const char *ha[] = {"Authorization: Bearer tenant-a", "X-Conversation-Id: shared", NULL};
    const char *hb[] = {"Authorization: Bearer tenant-b", "X-Conversation-Id: shared", NULL};
    const char *hg[] = {"Authorization: Bearer tenant-b", "X-Conversation-Id: guessed", NULL};
    conv a, ra, b, rb;
    conv_init(&a, 501, 80);
    conv_init(&ra, 501, 80);
    conv_init(&b, 502, 80);
    conv_init(&rb, 502, 80);
    for (int t = 1; t <= 3; t++) {
        long held_a = a.prompt + a.gen > 0 ? (a.prompt + a.gen - 1) / BS * BS : 0;
        long held_b = b.prompt + b.gen > 0 ? (b.prompt + b.gen - 1) / BS * BS : 0;
        long pulled = metric(&P, PULLED);
        assert_same(turn_router(&a, &R, 30, ha), turn_single(&ra, &S, 30), t);
        assert_int_equal(metric(&P, PULLED) - pulled, t > 1 ? held_a : 0);
        pulled = metric(&P, PULLED);
        assert_same(turn_router(&b, &R, 30, hb), turn_single(&rb, &S, 30), t);
        assert_int_equal(metric(&P, PULLED) - pulled, t > 1 ? held_b : 0);
        user_turn(&a, &ra, 510 + (unsigned)t, 20);
        user_turn(&b, &rb, 520 + (unsigned)t, 20);
    }
    /* a guessed id: no entry, nothing pulled */
    long pulled = metric(&P, PULLED);
    assert_same(turn_router(&b, &R, 30, hg), turn_single(&rb, &S, 30), 4);
    assert_int_equal(metric(&P, PULLED), pulled);
    /* forged params naming the decode node's KV: stripped by the router */
    user_turn(&b, &rb, 530, 20);
    json_t *body = chat_body(b.msgs, 30);
    char kv[16];
    snprintf(kv, sizeof kv, "%d", D.kv);
    json_object_set_new(body, "kv_transfer_params",
                        json_pack("{s:b,s:s,s:i,s:[i,i,i],s:i,s:s}", "do_remote_prefill", 1,
                                  "remote_host", "127.0.0.1", "remote_port", D.kv,
                                  "remote_block_ids", 0, 1, 2, "remote_num_tokens", 48,
                                  "remote_lease", "00112233445566778899aabbccddeeff"));
    long gone = metric(&P, "duplex_kv_fallbacks_total{reason=\"gone\"}");
    json_t *resp = post_h(R.http, body, hg, 200);
    assert_same(answer_of(resp), turn_single(&rb, &S, 30), 5);
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"gone\"}"), gone);
    assert_int_equal(metric(&D, "duplex_kv_fallbacks_total{reason=\"gone\"}"), 0);
    json_decref(resp);
    json_decref(body);
    conv_free(&a);
    conv_free(&ra);
    conv_free(&b);
    conv_free(&rb);
    stop_ok(&R);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* 2 prefill + 2 decode nodes, 8 conversations with ids, 6 turns, each
 * turn's 8 requests at once: every conversation keeps its decode node and
 * every answer equals the single node's. */
static void test_xpyd_concurrent(void **state)
{
    (void)state;
    enum { N = 8, TURNS = 6 };
    tp_proc P0, P1, D0, D1, S, R;
    node_start(&P0, "p0", k_pa);
    node_start(&P1, "p1", k_pa);
    node_start(&D0, "d0", k_da);
    node_start(&D1, "d1", k_da);
    node_start(&S, "s", k_ref);
    tp_proc *pp[] = {&P0, &P1}, *dd[] = {&D0, &D1};
    router_start(&R, pp, 2, dd, 2, k_via_p);
    conv c[N], r[N];
    char hdr[N][64];
    for (int i = 0; i < N; i++) {
        conv_init(&c[i], 600 + (unsigned)i, 50 + 10 * i);
        conv_init(&r[i], 600 + (unsigned)i, 50 + 10 * i);
        snprintf(hdr[i], sizeof hdr[i], "X-Conversation-Id: conv-%d", i);
    }
    for (int t = 1; t <= TURNS; t++) {
        CURLM *m = curl_multi_init();
        CURL *h[N];
        struct curl_slist *sl[N];
        dx_buf out[N];
        char *bodies[N];
        for (int i = 0; i < N; i++) {
            json_t *b = chat_body(c[i].msgs, 24);
            bodies[i] = json_dumps(b, JSON_COMPACT);
            json_decref(b);
            dx_buf_init(&out[i], 0);
            h[i] = tc_curl(R.http, "POST", "/v1/chat/completions", bodies[i], &out[i], &sl[i], 120);
            sl[i] = curl_slist_append(sl[i], hdr[i]);
            curl_easy_setopt(h[i], CURLOPT_HTTPHEADER, sl[i]);
            curl_multi_add_handle(m, h[i]);
        }
        tc_multi_run(m);
        for (int i = 0; i < N; i++) {
            long st = 0;
            curl_easy_getinfo(h[i], CURLINFO_RESPONSE_CODE, &st);
            tc_terminate(&out[i]);
            if (st != 200) fail_msg("conversation %d turn %d: %ld %s", i, t, st, out[i].data);
            json_t *resp = tc_json(&out[i]);
            json_t *ans = answer_of(resp);
            conv_add_answer(&c[i], ans);
            assert_same(ans, turn_single(&r[i], &S, 24), t);
            json_decref(resp);
            curl_multi_remove_handle(m, h[i]);
            curl_easy_cleanup(h[i]);
            curl_slist_free_all(sl[i]);
            dx_buf_free(&out[i]);
            free(bodies[i]);
            user_turn(&c[i], &r[i], 700 + (unsigned)(t * N + i), 12);
        }
        curl_multi_cleanup(m);
    }
    assert_int_equal(metric(&R, "duplex_router_affinity_hits_total"), N * (TURNS - 1));
    assert_int_equal(metric(&R, "duplex_router_affinity_misses_total"), N);
    assert_true(metric(&P0, PULLED) + metric(&P1, PULLED) > 0);
    assert_true(metric(&D0, "duplex_kv_holds_total") > 0 &&
                metric(&D1, "duplex_kv_holds_total") > 0);
    for (int i = 0; i < N; i++) {
        conv_free(&c[i]);
        conv_free(&r[i]);
    }
    stop_ok(&R);
    stop_ok(&P0);
    stop_ok(&P1);
    stop_ok(&D0);
    stop_ok(&D1);
    stop_ok(&S);
}

/* The decode node that holds a conversation is killed between turns: the
 * next turn recomputes and the other decode node serves it.  A prefill node
 * killed while it has the request: the router prefills on a decode node. */
static void test_nodes_killed(void **state)
{
    (void)state;
    tp_proc P, D0, D1, S, R;
    cluster_start(&P, &D0, &D1, &S, &R);
    const char *h[] = {"X-Conversation-Id: kill", NULL};
    conv c, r;
    conv_init(&c, 801, 80);
    conv_init(&r, 801, 80);
    assert_same(turn_router(&c, &R, 30, h), turn_single(&r, &S, 30), 1);
    tp_proc *holder = metric(&D0, "duplex_kv_holds_total") ? &D0 : &D1;
    tp_proc *other = holder == &D0 ? &D1 : &D0;
    tp_stop(holder, SIGKILL, 30);
    char series[200];
    snprintf(series, sizeof series,
             "duplex_router_node_healthy{node=\"http://127.0.0.1:%d\",role=\"decode\"}",
             holder->http);
    for (int i = 0; i < 600 && tc_metric_or(R.http, series, 1) != 0; i++) tp_sleep_ms(20);
    assert_true(tc_metric_or(R.http, series, 1) == 0); /* the router knows */
    user_turn(&c, &r, 811, 20);
    long from_params = metric(&P, "duplex_history_replies_total{source=\"params\"}");
    assert_same(turn_router(&c, &R, 30, h), turn_single(&r, &S, 30), 2);
    /* nothing to pull, but the reply's tokens still came with the params */
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"unreachable\"}"), 0);
    assert_int_equal(metric(&P, "duplex_history_replies_total{source=\"params\"}"),
                     from_params + 1);
    assert_true(metric(other, "duplex_kv_holds_total") == 1);
    /* the prefill node freezes with the next request, then dies */
    user_turn(&c, &r, 812, 20);
    kill(P.pid, SIGSTOP);
    json_t *body = chat_body(c.msgs, 30);
    char *s = json_dumps(body, JSON_COMPACT);
    dx_buf out;
    dx_buf_init(&out, 0);
    struct curl_slist *sl;
    CURL *e = tc_curl(R.http, "POST", "/v1/chat/completions", s, &out, &sl, 120);
    sl = curl_slist_append(sl, h[0]);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, sl);
    CURLM *m = curl_multi_init();
    curl_multi_add_handle(m, e);
    snprintf(
        series, sizeof series,
        "duplex_router_node_outstanding_requests{node=\"http://127.0.0.1:%d\",role=\"prefill\"}",
        P.http);
    int running = 1;
    for (int i = 0; i < 600 && tc_metric_or(R.http, series, 0) < 1; i++) {
        curl_multi_perform(m, &running);
        tp_sleep_ms(20);
    }
    assert_true(tc_metric_or(R.http, series, 0) >= 1); /* the request is at P */
    tp_stop(&P, SIGKILL, 30);
    tc_multi_run(m);
    long st = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
    tc_terminate(&out);
    assert_int_equal(st, 200);
    json_t *resp = tc_json(&out);
    assert_same(answer_of(resp), turn_single(&r, &S, 30), 3);
    assert_true(metric(&R, "duplex_router_fallbacks_total{reason=\"prefill_failed\"}") >= 1);
    json_decref(resp);
    json_decref(body);
    free(s);
    dx_buf_free(&out);
    curl_multi_remove_handle(m, e);
    curl_easy_cleanup(e);
    curl_slist_free_all(sl);
    curl_multi_cleanup(m);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&R);
    stop_ok(other);
    stop_ok(&S);
}

/* ---- where a turn is prefilled, by the nodes' costs ------------------------------- */

#define ROUTED_BY(path) "duplex_router_prefill_decisions_total{path=\"" path "\",rule=\"cost\"}"

/* Costs both nodes publish instead of measuring them: a prompt token 1 ms
 * to compute, a decode step 2 ms, pulls cheap — so the router's choice
 * depends on the decode node's streams alone, not on this machine. */
#define FIXED_COSTS                                                                                \
    "{\"prefill_tok_s\":0.001,\"itl_s\":0.002,\"pull\":{\"setup_s\":0.0005,\"byte_s\":1e-10}}"

/* The router's gauge for a node, waited on until it reads `want` (30 s). */
static void wait_gauge(const tp_proc *R, const char *name, const tp_proc *node, const char *role,
                       double want)
{
    char series[256];
    snprintf(series, sizeof series, "%s{node=\"http://127.0.0.1:%d\",role=\"%s\"}", name,
             node->http, role);
    for (int i = 0; i < 1500 && tc_metric_or(R->http, series, -1) != want; i++) tp_sleep_ms(20);
    if (tc_metric_or(R->http, series, -1) != want)
        fail_msg("%s is %.0f, waited for %.0f", series, tc_metric_or(R->http, series, -1), want);
}

/* A turn through the router: where its prefill went (1: the prefill node)
 * by the cost rule's counters, its answer checked against the single node. */
static int routed_turn(conv *c, conv *r, tp_proc *R, tp_proc *S, const char *const *h, int t)
{
    /* (a family's series appears with its first count) */
    double local = tc_metric_or(R->http, ROUTED_BY("local"), 0);
    double via_p = tc_metric_or(R->http, ROUTED_BY("prefill"), 0);
    assert_same(turn_router(c, R, 24, h), turn_single(r, S, 24), t);
    long dl = (long)(tc_metric_or(R->http, ROUTED_BY("local"), 0) - local);
    long dp = (long)(tc_metric_or(R->http, ROUTED_BY("prefill"), 0) - via_p);
    if (dl + dp != 1) fail_msg("turn %d: %ld local and %ld prefill decisions by cost", t, dl, dp);
    return (int)dp;
}

/* No --local-prefill-max-tokens: the router decides by the costs the
 * nodes publish.  An idle decode node prefills a conversation's turns
 * itself (no hop, no transfer); while it decodes four long streams — each
 * of which would wait as long as the prefill computes — the turn goes
 * through the prefill node; idle again, it is the decode node's once more.
 * The router's request line carries both estimates.  Every answer equals
 * the single node's. */
static void test_cost_routing_busy_decode(void **state)
{
    (void)state;
    const char *pa[] = {"--role",        "prefill",   "--bidirectional-kv-xfer",
                        "--fixed-costs", FIXED_COSTS, NULL};
    const char *da[] = {"--role",        "decode",    "--bidirectional-kv-xfer",
                        "--fixed-costs", FIXED_COSTS, NULL};
    tp_proc P, D, S, R;
    node_start(&P, "p", pa);
    node_start(&D, "d", da);
    node_start(&S, "s", k_ref);
    tp_proc *pp[] = {&P}, *dd[] = {&D};
    router_start(&R, pp, 1, dd, 1, NULL);
    /* the router has read both nodes' costs */
    wait_gauge(&R, "duplex_router_node_prefill_token_seconds", &D, "decode", 0.001);
    wait_gauge(&R, "duplex_router_node_prefill_token_seconds", &P, "prefill", 0.001);
    const char *h[] = {"X-Conversation-Id: busy", NULL};
    conv c, r;
    conv_init(&c, 901, 40);
    conv_init(&r, 901, 40);
    for (int t = 1; t <= 2; t++) { /* idle (as last published, too): local */
        wait_gauge(&R, "duplex_router_node_running", &D, "decode", 0);
        if (routed_turn(&c, &r, &R, &S, h, t) != 0)
            fail_msg("turn %d: not local on an idle node", t);
        user_turn(&c, &r, 910 + (unsigned)t, 20);
    }
    char line[1024];
    last_post(&R, line, sizeof line);
    assert_non_null(strstr(line, " rule=cost est_local_ms="));
    assert_non_null(strstr(line, " est_prefill_ms="));
    /* four long streams through the router (other conversations) */
    enum { N = 4 };
    CURLM *m = curl_multi_init();
    CURL *e[N];
    struct curl_slist *sl[N];
    dx_buf out[N];
    char *bodies[N];
    for (int i = 0; i < N; i++) {
        char *u = words(950 + (unsigned)i, 10);
        json_t *b =
            json_pack("{s:s,s:[{s:s,s:s}],s:i,s:b,s:b}", "model", G.model_name, "messages", "role",
                      "user", "content", u, "max_tokens", 3000, "ignore_eos", 1, "stream", 1);
        bodies[i] = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        free(u);
        dx_buf_init(&out[i], 0);
        e[i] = tc_curl(R.http, "POST", "/v1/chat/completions", bodies[i], &out[i], &sl[i], 120);
        curl_multi_add_handle(m, e[i]);
    }
    char series[256];
    snprintf(
        series, sizeof series,
        "duplex_router_node_outstanding_requests{node=\"http://127.0.0.1:%d\",role=\"decode\"}",
        D.http);
    int running = 1;
    for (int i = 0; i < 3000 && tc_metric_or(R.http, series, 0) < N; i++) {
        curl_multi_perform(m, &running);
        tp_sleep_ms(5);
    }
    assert_int_equal(tc_metric_or(R.http, series, 0), N); /* all four decoding at D */
    curl_multi_perform(m, &running);
    assert_int_equal(running, N); /* and none has ended */
    if (routed_turn(&c, &r, &R, &S, h, 3) != 1) {
        last_post(&R, line, sizeof line);
        fail_msg("turn 3: prefilled locally while the decode node ran %d streams: %s", N, line);
    }
    last_post(&R, line, sizeof line);
    assert_non_null(strstr(line, " via=prefill"));
    assert_non_null(strstr(line, " streams=4"));
    user_turn(&c, &r, 913, 20);
    tc_multi_run(m);
    for (int i = 0; i < N; i++) {
        long st = 0;
        curl_easy_getinfo(e[i], CURLINFO_RESPONSE_CODE, &st);
        assert_int_equal(st, 200);
        curl_multi_remove_handle(m, e[i]);
        curl_easy_cleanup(e[i]);
        curl_slist_free_all(sl[i]);
        dx_buf_free(&out[i]);
        free(bodies[i]);
    }
    curl_multi_cleanup(m);
    /* idle again, as the router sees it: the turn is the decode node's */
    wait_gauge(&R, "duplex_router_node_outstanding_requests", &D, "decode", 0);
    wait_gauge(&R, "duplex_router_node_running", &D, "decode", 0);
    if (routed_turn(&c, &r, &R, &S, h, 4) != 0) fail_msg("turn 4: not local on an idle node");
    /* the streams' pace was measured, steps that also prefilled apart */
    assert_true(metric(&D, "duplex_decode_step_seconds_count{prefill=\"no\"}") > 0);
    assert_true(metric(&D, "duplex_decode_step_seconds_count{prefill=\"yes\"}") >= 0);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&R);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* The router's retention guide: a turn that comes while the decode node
 * still retains the conversation's KV counts as live, one that comes after
 * its retention (--decoder-kv-blocks-ttl 1) ran out as expired — and
 * recomputes, still equal to the single node, whose reply memory forgets
 * as soon — and the gaps go to a histogram. */
static void test_turn_gaps(void **state)
{
    (void)state;
    const char *da[] = {"--role", "decode", "--bidirectional-kv-xfer", "--decoder-kv-blocks-ttl",
                        "1",      NULL};
    const char *sa[] = {"--no-enable-prefix-caching", "--decoder-kv-blocks-ttl", "1", NULL};
    tp_proc P, D, S, R;
    node_start(&P, "p", k_pa);
    node_start(&D, "d", da);
    node_start(&S, "s", sa);
    tp_proc *pp[] = {&P}, *dd[] = {&D};
    router_start(&R, pp, 1, dd, 1, k_via_p);
    const char *h[] = {"X-Conversation-Id: gaps", NULL};
    conv c, r;
    conv_init(&c, 971, 40);
    conv_init(&r, 971, 40);
    for (int t = 1; t <= 3; t++) {
        if (t == 3) tp_sleep_ms(1500); /* past the decode node's retention */
        assert_same(turn_router(&c, &R, 16, h), turn_single(&r, &S, 16), t);
        user_turn(&c, &r, 980 + (unsigned)t, 10);
    }
    assert_int_equal(metric(&R, "duplex_router_turns_after_gap_total{retention=\"live\"}"), 1);
    assert_int_equal(metric(&R, "duplex_router_turns_after_gap_total{retention=\"expired\"}"), 1);
    assert_int_equal(metric(&R, "duplex_router_turn_gap_seconds_count"), 2);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&R);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

static int setup(void **state)
{
    (void)state;
    return pdt_setup("pd_router");
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bidirectional_through_router),
        cmocka_unit_test(test_local_prefill),
        cmocka_unit_test(test_cost_routing_busy_decode),
        cmocka_unit_test(test_turn_gaps),
        cmocka_unit_test(test_unidirectional_through_router),
        cmocka_unit_test(test_ids_tenants_forgery),
        cmocka_unit_test(test_xpyd_concurrent),
        cmocka_unit_test(test_nodes_killed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
