/* itest_kv_dtype: P/D nodes whose KV cache is q8_0 (`--kv-dtype q8_0`), as
 * real processes on loopback, driven as a router drives them (pd_test.h):
 *  - a q8_0 prefill node and a q8_0 decode node give, turn after turn, the
 *    answers of one q8_0 node byte for byte, with the history pulled both
 *    ways, each block moving as stored (17/32 of an f16 block's bytes);
 *  - an f16 prefill node and a q8_0 decode node refuse each other's KV at
 *    HELLO, before any read: every pull recomputes, counted as
 *    layout_mismatch, the prefill node's first token is not taken (it was
 *    computed with other numerics), and the answers still equal one q8_0
 *    node's;
 *  - a decode pool of a given size retains about twice the conversations in
 *    q8_0 as in f16 before it revokes the first (counted by revocations,
 *    never by time). */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>

#include "pd_test.h"

#define LAYOUT  "duplex_kv_fallbacks_total{reason=\"layout_mismatch\"}"
#define FIRST   "duplex_pd_first_token_from_prefill_total"
#define REVOKED "duplex_kv_lease_events_total{event=\"revoked_lru\"}"

static const char *const k_pq[] = {
    "--role", "prefill", "--bidirectional-kv-xfer", "--no-enable-prefix-caching", "--kv-dtype",
    "q8_0",   NULL};
static const char *const k_dq[] = {"--role",     "decode", "--bidirectional-kv-xfer",
                                   "--kv-dtype", "q8_0",   NULL};
static const char *const k_sq[] = {"--no-enable-prefix-caching", "--kv-dtype", "q8_0", NULL};

/* Six turns on a q8_0 cluster against one q8_0 node: the same answers, the
 * history pulled from D from turn 2 on, and every pulled byte a whole q8_0
 * block. */
static void test_q8_cluster_exact(void **state)
{
    (void)state;
    tp_proc P, D, S;
    node_start(&P, "p", k_pq);
    node_start(&D, "d", k_dq);
    node_start(&S, "s", k_sq);
    long bb = metric(&D, "duplex_kv_block_bytes");
    assert_int_equal(metric(&P, "duplex_kv_block_bytes"), bb);
    assert_int_equal(metric(&D, "duplex_kv_cache_info{dtype=\"q8_0\",block_size=\"16\"}"), 1);
    conv c, r;
    conv_init(&c, 3, 80);
    conv_init(&r, 3, 80);
    for (int t = 1; t <= 6; t++) {
        long pulled = metric(&P, PULLED);
        assert_same(turn_pd(&c, &P, &D, 24 + 5 * t, 1, t == 3), turn_single(&r, &S, 24 + 5 * t), t);
        if (t >= 2 && metric(&P, PULLED) <= pulled) fail_msg("turn %d: P pulled nothing", t);
        user_turn(&c, &r, 30 + (unsigned)t, 25);
    }
    /* D sent P's first token every turn: both compute with q8_0 KV */
    assert_int_equal(metric(&D, FIRST), 6);
    assert_int_equal(metric(&P, LAYOUT) + metric(&D, LAYOUT), 0);
    /* blocks move as they are stored */
    long d2p_blocks = metric(&P, "duplex_kv_pull_blocks_total{direction=\"d2p\"}");
    long p2d_blocks = metric(&D, "duplex_kv_pull_blocks_total{direction=\"p2d\"}");
    assert_true(d2p_blocks > 0 && p2d_blocks > 0);
    assert_int_equal(metric(&P, "duplex_kv_pull_bytes_total{direction=\"d2p\"}"), d2p_blocks * bb);
    assert_int_equal(metric(&D, "duplex_kv_pull_bytes_total{direction=\"p2d\"}"), p2d_blocks * bb);
    /* one retained conversation, its tokens and bytes */
    long held = (c.prompt + c.gen - 1) / BS * BS;
    assert_int_equal(metric(&D, "duplex_kv_retained_conversations"), 1);
    assert_int_equal(metric(&D, "duplex_kv_retained_tokens"), held);
    assert_int_equal(metric(&D, "duplex_kv_retained_bytes"), held / BS * bb);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* f16 P, q8_0 D: each pull is refused at HELLO (layout_mismatch on the
 * puller, nothing pulled, nothing read), D computes everything and does
 * not send P's first token, and every answer is the q8_0 node's. */
static void test_layout_mismatch_recomputes(void **state)
{
    (void)state;
    tp_proc P, D, S;
    node_start(&P, "p", k_pa); /* f16, the default */
    node_start(&D, "d", k_dq);
    node_start(&S, "s", k_sq);
    /* a q8_0 block is 17/32 of an f16 one */
    long bp = metric(&P, "duplex_kv_block_bytes"), bd = metric(&D, "duplex_kv_block_bytes");
    assert_int_equal(bd * 32, bp * 17);
    assert_int_equal(metric(&P, "duplex_kv_cache_info{dtype=\"f16\",block_size=\"16\"}"), 1);
    conv c, r;
    conv_init(&c, 5, 80);
    conv_init(&r, 5, 80);
    for (int t = 1; t <= 3; t++) {
        long computed_d = metric(&D, COMPUTED), local_d = metric(&D, LOCAL);
        assert_same(turn_pd(&c, &P, &D, 24, 1, 0), turn_single(&r, &S, 24), t);
        /* all of it on D: computed, or its own from the turn before */
        assert_int_equal(metric(&D, COMPUTED) - computed_d + metric(&D, LOCAL) - local_d, c.prompt);
        assert_int_equal(metric(&D, LAYOUT), t);     /* P's prompt, p2d */
        assert_int_equal(metric(&P, LAYOUT), t - 1); /* D's history, d2p */
        /* new messages past the recompute threshold: D pulls every turn */
        user_turn(&c, &r, 50 + (unsigned)t, 90);
    }
    assert_int_equal(metric(&P, PULLED) + metric(&D, PULLED), 0);
    assert_int_equal(metric(&P, "duplex_kv_pull_bytes_total{direction=\"d2p\"}"), 0);
    assert_int_equal(metric(&D, "duplex_kv_pull_bytes_total{direction=\"p2d\"}"), 0);
    assert_int_equal(metric(&D, FIRST), 0);
    /* the reason is the layout, not the model */
    assert_int_equal(metric(&D, "duplex_kv_fallbacks_total{reason=\"refused\"}"), 0);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* Conversations, one turn each, into a decode node with a 1 MiB pool: how
 * many it retains when it first revokes one to make room. */
static long retained_before_revoking(const char *dtype)
{
    const char *pa[] = {"--role", "prefill", "--bidirectional-kv-xfer", "--kv-dtype", dtype, NULL};
    const char *da[] = {"--role",     "decode", "--bidirectional-kv-xfer",
                        "--kv-dtype", dtype,    "--kv-cache-mb",
                        "1",          NULL};
    tp_proc P, D;
    node_start(&P, "p", pa);
    node_start(&D, "d", da);
    long held = -1;
    for (int i = 0; i < 40 && held < 0; i++) {
        long retained = metric(&D, "duplex_kv_retained_conversations");
        conv c;
        conv_init(&c, 200 + (unsigned)i, 160); /* ~200 tokens: 13 blocks retained */
        json_decref(turn_pd(&c, &P, &D, 8, 1, 0));
        if (metric(&D, REVOKED) > 0) held = retained;
        conv_free(&c);
    }
    if (held < 0) fail_msg("%s: 40 conversations and no revocation", dtype);
    assert_at_rest(D.http, "d");
    stop_ok(&P);
    stop_ok(&D);
    return held;
}

/* The same pool retains ~1.88x the conversations in q8_0 (32/17): at
 * least 1.7x here, where a conversation is a whole number of blocks and
 * the running request needs room too. */
static void test_retention_capacity(void **state)
{
    (void)state;
    long f16 = retained_before_revoking("f16"), q8 = retained_before_revoking("q8_0");
    print_message("a 1 MiB decode pool retained %ld conversations in f16, %ld in q8_0\n", f16, q8);
    if (f16 < 2 || q8 * 10 < f16 * 17)
        fail_msg("retained %ld conversations in f16, %ld in q8_0: want q8_0 >= 1.7x", f16, q8);
}

static int setup(void **state)
{
    (void)state;
    return pdt_setup("kv_dtype");
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_cluster_exact),
        cmocka_unit_test(test_layout_mismatch_recomputes),
        cmocka_unit_test(test_retention_capacity),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
