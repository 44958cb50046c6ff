/* test_router_pick: the router's node choice (router_pick.h), rule by rule,
 * on plain arrays of node states — least loaded (requests for decode
 * nodes, prompt tokens for prefill nodes), ties rotating per pool, who
 * takes new requests and who still holds KV (healthy, draining by /health
 * or by registration, down, gone), affinity and why it is passed over,
 * local prefill below the threshold or without a prefill node, the retry
 * and re-check rules, the pass-through.  No router, no loop, no I/O. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/dx_err.h"
#include "router/router_pick.h"

enum { P, D }; /* roles, for the tables below */

typedef struct {
    router_pick_node n[8];
    unsigned rr[2];
    router_pick_cluster c;
} fixture;

/* A cluster of the given roles, every node healthy and idle; threshold
 * 256 tokens, affinity up to 4 requests. */
static void make(fixture *f, const int *roles, size_t n)
{
    memset(f, 0, sizeof *f);
    DX_ASSERT(n <= DX_ARRAY_LEN(f->n));
    for (size_t i = 0; i < n; i++)
        f->n[i] = (router_pick_node){.prefill = roles[i] == P, .healthy = 1};
    f->c = (router_pick_cluster){.nodes = f->n,
                                 .n_nodes = n,
                                 .rr = f->rr,
                                 .decode_max_outstanding = 4,
                                 .local_prefill_max_tokens = 256};
}

static void route(fixture *f, int keyed, const router_pick_entry *e, uint32_t prompt, int ready,
                  router_pick_choice *ch)
{
    router_pick_req q = {
        .keyed = keyed, .entry = e, .prompt_tokens = prompt, .prefill_ready = ready};
    router_pick_route(&f->c, &q, ch);
}

static void test_takes_new_and_holds(void **state)
{
    (void)state;
    static const struct {
        router_pick_node n;
        int takes, holds;
    } k[] = {
        {{.healthy = 1}, 1, 1},
        {{.healthy = 0}, 0, 0},                    /* down: neither */
        {{.healthy = 0, .draining = 1}, 0, 1},     /* /health says draining: holds */
        {{.healthy = 1, .draining = 1}, 0, 1},     /* (a 503 leaves it unhealthy anyway) */
        {{.healthy = 1, .reg_draining = 1}, 0, 1}, /* its registration says so */
        {{.healthy = 0, .reg_draining = 1}, 0, 1},
        {{.healthy = 1, .gone = 1}, 0, 0}, /* gone: never */
        {{.healthy = 0, .draining = 1, .gone = 1}, 0, 0},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(k); i++) {
        if (router_pick_takes_new(&k[i].n) != k[i].takes) fail_msg("row %zu: takes_new", i);
        if (router_pick_holds(&k[i].n) != k[i].holds) fail_msg("row %zu: holds", i);
    }
}

static void test_least_outstanding(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){P, D, D, D}, 4);
    f.n[1].outstanding = 3;
    f.n[2].outstanding = 1;
    f.n[3].outstanding = 2;
    f.n[0].outstanding = 0; /* a prefill node: never a decode pick, however idle */
    for (int i = 0; i < 6; i++) assert_int_equal(router_pick_decode(&f.c, -1), 2);
    /* decode nodes weigh requests, not tokens */
    f.n[2].outstanding_tokens = 1000000;
    assert_int_equal(router_pick_decode(&f.c, -1), 2);
    assert_int_equal(router_pick_decode(&f.c, 2), 3); /* never the excluded one */
}

static void test_prefill_by_tokens(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){P, P, D}, 3);
    f.n[0].outstanding = 0;
    f.n[0].outstanding_tokens = 900;
    f.n[1].outstanding = 5;
    f.n[1].outstanding_tokens = 100;
    f.n[2].outstanding_tokens = 0; /* a decode node: never a prefill pick */
    for (int i = 0; i < 4; i++) assert_int_equal(router_pick_prefill(&f.c, -1), 1);
    assert_int_equal(router_pick_prefill(&f.c, 1), 0);
    assert_int_equal(router_pick_prefill(&f.c, 0), 1);
}

static void test_ties_rotate_per_pool(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){D, D, D}, 3);
    /* equal nodes are taken in turn: each pick advances the pool's rotation */
    for (int i = 0; i < 9; i++) assert_int_equal(router_pick_decode(&f.c, -1), i % 3);
    assert_int_equal(f.rr[0], 9);
    assert_int_equal(f.rr[1], 0); /* the prefill pool's rotation is its own */
    /* the rotation counts over the whole table, the scan starting at it:
     * the first node of the pool at or after the start wins a tie, so with
     * the roles interleaved a node after one of the other role wins twice */
    fixture g;
    make(&g, (const int[]){D, P, D, P, D}, 5);
    static const int want[] = {0, 2, 2, 4, 4, 0, 2, 2, 4, 4};
    for (size_t i = 0; i < DX_ARRAY_LEN(want); i++)
        assert_int_equal(router_pick_decode(&g.c, -1), want[i]);
    assert_int_equal(router_pick_prefill(&g.c, -1), 1); /* start 0 */
    assert_int_equal(router_pick_prefill(&g.c, -1), 1); /* start 1 */
    assert_int_equal(router_pick_prefill(&g.c, -1), 3); /* start 2 */
    assert_int_equal(g.rr[1], 3);
    assert_int_equal(g.rr[0], 10);
    /* the counter is unsigned: it wraps, and the start stays in the table */
    g.rr[0] = 0u - 1u; /* UINT_MAX % 5 = 0 */
    assert_int_equal(router_pick_decode(&g.c, -1), 0);
    assert_int_equal(g.rr[0], 0);
    /* a lighter node wins over the rotation */
    g.n[4].outstanding = 0;
    g.n[0].outstanding = g.n[2].outstanding = 1;
    for (int i = 0; i < 5; i++) assert_int_equal(router_pick_decode(&g.c, -1), 4);
}

static void test_who_takes_nothing_new(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){D, D, D, D, D}, 5);
    f.n[0].healthy = 0;        /* down */
    f.n[1].draining = 1;       /* draining (/health) */
    f.n[2].reg_draining = 1;   /* draining (registration) */
    f.n[3].gone = 1;           /* vanished */
    f.n[4].outstanding = 1000; /* busy, but the only one that takes requests */
    for (int i = 0; i < 10; i++) assert_int_equal(router_pick_decode(&f.c, -1), 4);
    assert_int_equal(router_pick_decode(&f.c, 4), -1);
    f.n[4].healthy = 0;
    assert_int_equal(router_pick_decode(&f.c, -1), -1);
    assert_int_equal(router_pick_prefill(&f.c, -1), -1); /* no prefill node at all */
    fixture empty;
    make(&empty, NULL, 0); /* --discover before any registration */
    assert_int_equal(router_pick_decode(&empty.c, -1), -1);
    assert_int_equal(router_pick_any(&empty.c), -1);
}

static void test_affinity_hit(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){D, D}, 2);
    f.n[1].outstanding = 3; /* busier than node 0, below the bound of 4 */
    router_pick_entry e = {.found = 1, .node = 1, .has_params = 1, .tokens = 100};
    router_pick_choice ch;
    route(&f, 1, &e, 120, 0, &ch);
    assert_int_equal(ch.decode, 1);
    assert_int_equal(ch.affinity, ROUTER_PICK_HIT);
    assert_null(ch.affinity_fallback);
    assert_int_equal(ch.prefill, -1);
    assert_int_equal(ch.uncached, 20);
    assert_int_equal(f.rr[0], 0); /* no pool was scanned */
    /* an entry without params still gives affinity (the node's prefix cache) */
    e.has_params = 0;
    route(&f, 1, &e, 120, 0, &ch);
    assert_int_equal(ch.decode, 1);
    assert_int_equal(ch.affinity, ROUTER_PICK_HIT);
    assert_int_equal(ch.uncached, 120); /* but nothing counts as cached */
}

static void test_affinity_overloaded(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){D, D, D}, 3);
    f.n[0].outstanding = 4; /* = decode_max_outstanding */
    f.n[1].outstanding = 6;
    f.n[2].outstanding = 5;
    router_pick_entry e = {.found = 1, .node = 0, .has_params = 1, .tokens = 50};
    router_pick_choice ch;
    route(&f, 1, &e, 60, 0, &ch);
    assert_string_equal(ch.affinity_fallback, "overloaded");
    assert_int_equal(ch.affinity, ROUTER_PICK_MISS);
    /* the least loaded node, which may be the overloaded entry's own */
    assert_int_equal(ch.decode, 0);
    assert_int_equal(ch.uncached, 10); /* the holder still holds: its tokens count */
    f.n[0].outstanding = 7;
    route(&f, 1, &e, 60, 0, &ch);
    assert_string_equal(ch.affinity_fallback, "overloaded");
    assert_int_equal(ch.decode, 2);
    f.n[0].outstanding = 3; /* below the bound again */
    route(&f, 1, &e, 60, 0, &ch);
    assert_null(ch.affinity_fallback);
    assert_int_equal(ch.decode, 0);
    assert_int_equal(ch.affinity, ROUTER_PICK_HIT);
}

static void test_affinity_draining_down_gone(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){P, D, D}, 3);
    router_pick_entry e = {.found = 1, .node = 1, .has_params = 1, .tokens = 1000};
    router_pick_choice ch;
    /* draining: another node decodes, but the holder's tokens still count
     * (the prefill node pulls the history from it) */
    f.n[1].draining = 1;
    route(&f, 1, &e, 1100, 1, &ch);
    assert_string_equal(ch.affinity_fallback, "affinity_node_draining");
    assert_int_equal(ch.affinity, ROUTER_PICK_MISS);
    assert_int_equal(ch.decode, 2);
    assert_int_equal(ch.uncached, 100);
    assert_int_equal(ch.prefill, -1); /* 100 < 256: local on node 2, which pulls */
    assert_true(router_pick_entry_usable(&f.c, &e));
    f.n[1].draining = 0;
    f.n[1].reg_draining = 1;
    route(&f, 1, &e, 1100, 1, &ch);
    assert_string_equal(ch.affinity_fallback, "affinity_node_draining");
    assert_int_equal(ch.uncached, 100);
    /* down: nothing to pull, every token is uncached */
    f.n[1].reg_draining = 0;
    f.n[1].healthy = 0;
    route(&f, 1, &e, 1100, 1, &ch);
    assert_string_equal(ch.affinity_fallback, "affinity_node_down");
    assert_int_equal(ch.decode, 2);
    assert_int_equal(ch.uncached, 1100);
    assert_int_equal(ch.prefill, 0);
    assert_false(router_pick_entry_usable(&f.c, &e));
    /* gone, even if its last check passed: down */
    f.n[1].healthy = 1;
    f.n[1].gone = 1;
    route(&f, 1, &e, 1100, 1, &ch);
    assert_string_equal(ch.affinity_fallback, "affinity_node_down");
    assert_int_equal(ch.uncached, 1100);
    assert_false(router_pick_entry_usable(&f.c, &e));
}

static void test_affinity_miss_and_unkeyed(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){D, D}, 2);
    router_pick_choice ch;
    route(&f, 1, NULL, 10, 0, &ch); /* keyed, nothing found */
    assert_int_equal(ch.affinity, ROUTER_PICK_MISS);
    assert_null(ch.affinity_fallback);
    assert_true(ch.decode >= 0);
    route(&f, 0, NULL, 10, 0, &ch); /* no key: neither */
    assert_int_equal(ch.affinity, ROUTER_PICK_UNKEYED);
    router_pick_entry e = {.found = 0, .node = 1};
    route(&f, 1, &e, 10, 0, &ch);
    assert_int_equal(ch.affinity, ROUTER_PICK_MISS);
    /* found, but under a URL this router does not route to */
    router_pick_entry alien = {.found = 1, .node = -1, .has_params = 1, .tokens = 8};
    route(&f, 1, &alien, 10, 0, &ch);
    assert_int_equal(ch.affinity, ROUTER_PICK_MISS);
    assert_null(ch.affinity_fallback);
    assert_int_equal(ch.uncached, 10);
    assert_false(router_pick_entry_usable(&f.c, &alien));
    assert_false(router_pick_entry_usable(&f.c, NULL));
}

static void test_no_decode_node(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){P, D}, 2);
    f.n[1].healthy = 0;
    router_pick_entry e = {.found = 1, .node = 1, .has_params = 1, .tokens = 10};
    router_pick_choice ch;
    route(&f, 1, &e, 5000, 1, &ch);
    assert_int_equal(ch.decode, -1);
    assert_string_equal(ch.affinity_fallback, "affinity_node_down");
    assert_int_equal(ch.affinity, ROUTER_PICK_MISS);
    assert_int_equal(ch.prefill, -1);
    assert_null(ch.prefill_fallback);
    assert_int_equal(f.rr[1], 0); /* the prefill pool was not consulted */
}

static void test_local_or_prefill(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){P, P, D}, 3);
    f.n[0].outstanding_tokens = 10;
    router_pick_choice ch;
    /* no entry: every prompt token is uncached */
    route(&f, 0, NULL, 255, 1, &ch);
    assert_int_equal(ch.prefill, -1); /* below the threshold: local */
    assert_null(ch.prefill_fallback);
    assert_int_equal(f.rr[1], 0);
    route(&f, 0, NULL, 256, 1, &ch);
    assert_int_equal(ch.prefill, 1); /* at it: the prefill node with the fewest tokens */
    assert_int_equal(f.rr[1], 1);
    /* no prefill body (no prefill node configured or discoverable): local */
    route(&f, 0, NULL, 100000, 0, &ch);
    assert_int_equal(ch.prefill, -1);
    assert_null(ch.prefill_fallback);
    /* an entry's held tokens are cached: few uncached ones prefill locally */
    router_pick_entry e = {.found = 1, .node = 2, .has_params = 1, .tokens = 4000};
    route(&f, 1, &e, 4100, 1, &ch);
    assert_int_equal(ch.decode, 2);
    assert_int_equal(ch.uncached, 100);
    assert_int_equal(ch.prefill, -1);
    route(&f, 1, &e, 4300, 1, &ch);
    assert_int_equal(ch.uncached, 300);
    assert_int_equal(ch.prefill, 1);
    /* a prompt shorter than the held history (a rewound conversation) */
    route(&f, 1, &e, 3000, 1, &ch);
    assert_int_equal(ch.uncached, 0);
    assert_int_equal(ch.prefill, -1);
    /* a threshold of 0 always goes to a prefill node, even for 0 tokens */
    f.c.local_prefill_max_tokens = 0;
    route(&f, 1, &e, 3000, 1, &ch);
    assert_true(ch.prefill >= 0);
}

static void test_no_prefill_healthy(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){P, P, D}, 3);
    f.n[0].healthy = 0;
    f.n[1].draining = 1;
    router_pick_choice ch;
    route(&f, 0, NULL, 1000, 1, &ch);
    assert_int_equal(ch.decode, 2);
    assert_int_equal(ch.prefill, -1);
    assert_string_equal(ch.prefill_fallback, "no_prefill_healthy");
    /* colocated (no prefill node in the table) with a prefill body made
     * because nodes may be discovered: the same fallback */
    fixture g;
    make(&g, (const int[]){D}, 1);
    route(&g, 0, NULL, 1000, 1, &ch);
    assert_int_equal(ch.prefill, -1);
    assert_string_equal(ch.prefill_fallback, "no_prefill_healthy");
}

static void test_decode_again(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){D, D, D}, 3);
    f.n[1].outstanding = 1;
    assert_int_equal(router_pick_decode_again(&f.c, 1), 1); /* still takes requests */
    assert_int_equal(f.rr[0], 0);
    f.n[1].healthy = 0; /* went down while the prefill node worked */
    f.n[0].outstanding = 2;
    assert_int_equal(router_pick_decode_again(&f.c, 1), 2);
    f.n[1].healthy = 1;
    f.n[1].reg_draining = 1;
    assert_int_equal(router_pick_decode_again(&f.c, 1), 2);
    f.n[0].healthy = f.n[2].healthy = 0;
    assert_int_equal(router_pick_decode_again(&f.c, 1), 1); /* none: its failure answers */
}

static void test_retry(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){P, P, D, D}, 4);
    assert_int_equal(router_pick_retry(&f.c, 1, 0, 1), 1);
    assert_int_equal(router_pick_retry(&f.c, 1, 1, 1), 0);
    assert_int_equal(router_pick_retry(&f.c, 0, 2, 1), 3);
    assert_int_equal(router_pick_retry(&f.c, 0, 3, 1), 2);
    unsigned rr0 = f.rr[0], rr1 = f.rr[1];
    assert_int_equal(router_pick_retry(&f.c, 1, 0, 2), -1); /* one retry only */
    assert_int_equal(router_pick_retry(&f.c, 0, 2, 2), -1);
    assert_int_equal(f.rr[0], rr0); /* and no pool scanned for it */
    assert_int_equal(f.rr[1], rr1);
    f.n[1].healthy = 0;
    assert_int_equal(router_pick_retry(&f.c, 1, 0, 1), -1); /* no other one */
}

static void test_any(void **state)
{
    (void)state;
    fixture f;
    make(&f, (const int[]){P, D}, 2);
    assert_int_equal(router_pick_any(&f.c), 1); /* a decode node first */
    f.n[1].draining = 1;
    assert_int_equal(router_pick_any(&f.c), 0); /* else a prefill node */
    f.n[0].gone = 1;
    assert_int_equal(router_pick_any(&f.c), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_takes_new_and_holds),
        cmocka_unit_test(test_least_outstanding),
        cmocka_unit_test(test_prefill_by_tokens),
        cmocka_unit_test(test_ties_rotate_per_pool),
        cmocka_unit_test(test_who_takes_nothing_new),
        cmocka_unit_test(test_affinity_hit),
        cmocka_unit_test(test_affinity_overloaded),
        cmocka_unit_test(test_affinity_draining_down_gone),
        cmocka_unit_test(test_affinity_miss_and_unkeyed),
        cmocka_unit_test(test_no_decode_node),
        cmocka_unit_test(test_local_or_prefill),
        cmocka_unit_test(test_no_prefill_healthy),
        cmocka_unit_test(test_decode_again),
        cmocka_unit_test(test_retry),
        cmocka_unit_test(test_any),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
