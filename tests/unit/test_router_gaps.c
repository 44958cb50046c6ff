/* test_router_gaps: the time between a conversation's turns (router_gaps.h)
 * — a gap within the decode node's retention, past it, with nothing
 * retained; content keys' longest known prefix; a slot taken by a newer
 * conversation; notes forgotten after a day.  Clock injected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "router/router_gaps.h"

static void test_gaps(void **state)
{
    (void)state;
    router_gaps *g;
    assert_int_equal(router_gaps_create(64, &g), 0);
    router_key a = {.lo = 1, .hi = 100}, b = {.lo = 2, .hi = 200};
    double gap;
    enum router_gap_kind kind;
    assert_int_equal(router_gaps_begin(g, &a, 1, 10, &gap, &kind), 0); /* a new conversation */
    router_gaps_end(g, &a, 10, 480);
    assert_int_equal(router_gaps_begin(g, &a, 1, 15.5, &gap, &kind), 1);
    assert_true(gap == 5.5 && kind == ROUTER_GAP_LIVE);
    assert_int_equal(router_gaps_begin(g, &a, 1, 600, &gap, &kind), 1); /* past the retention */
    assert_true(gap == 590 && kind == ROUTER_GAP_EXPIRED);
    router_gaps_end(g, &b, 20, 0); /* its node kept nothing */
    assert_int_equal(router_gaps_begin(g, &b, 1, 21, &gap, &kind), 1);
    assert_true(kind == ROUTER_GAP_NONE);
    /* content keys, shortest first: the longest known one wins */
    router_key keys[3] = {{.lo = 7, .hi = 7}, b, a};
    assert_int_equal(router_gaps_begin(g, keys, 3, 30, &gap, &kind), 1);
    assert_true(gap == 20 && kind == ROUTER_GAP_LIVE);
    assert_int_equal(router_gaps_begin(g, keys, 1, 30, &gap, &kind), 0);
    /* another conversation in a's slot replaces it */
    router_key c = {.lo = a.lo + 64, .hi = a.hi};
    router_gaps_end(g, &c, 40, 480);
    assert_int_equal(router_gaps_begin(g, &a, 1, 41, &gap, &kind), 0);
    assert_int_equal(router_gaps_begin(g, &c, 1, 41, &gap, &kind), 1);
    /* a day later it is forgotten */
    assert_int_equal(router_gaps_begin(g, &c, 1, 40 + ROUTER_GAPS_MAX_AGE_S + 1, &gap, &kind), 0);
    router_gaps_destroy(g);
    router_gaps_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gaps)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
