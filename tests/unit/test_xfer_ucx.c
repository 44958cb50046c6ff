/* test_xfer_ucx: the holder's side of a READ over TCP, where UCX emulates
 * the READ by a request that the holder's progress thread answers with a
 * copy from its region.  A READ that arrives after the region is released
 * must not reach it (it would copy from unmapped memory and kill the
 * holder: a prefill node at shutdown, with a reader's request late off a
 * link that had been down): xfer_agent_release closes the worker first, and
 * the reader's next READ fails instead.  Two agents in one process, over
 * loopback TCP. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "xfer/xfer_ucx.h"

#define REGION (1u << 20)

typedef struct {
    xfer_agent *holder, *reader;
    uint8_t *region;
    xfer_peer *peer;
    uint8_t *buf;
    xfer_desc d;
} pair;

/* The holder's region (its bytes i & 0xff) and a reader connected to it. */
static void pair_open(pair *t)
{
    xfer_agent_config hc = {.tls = "tcp"}, rc = {.tls = "tcp", .no_progress_thread = 1};
    assert_int_equal(xfer_agent_create(&hc, &t->holder), 0);
    assert_int_equal(xfer_agent_create(&rc, &t->reader), 0);
    t->region = xfer_agent_alloc(t->holder, REGION);
    assert_non_null(t->region);
    for (size_t i = 0; i < REGION; i++) t->region[i] = (uint8_t)i;
    xfer_agent_describe(t->holder, &t->d);
    assert_int_equal(xfer_peer_connect(t->reader, t->d.worker_addr, t->d.worker_addr_len, t->d.rkey,
                                       t->d.rkey_len, t->d.base, t->d.length, &t->peer),
                     0);
    t->buf = malloc(REGION);
    assert_non_null(t->buf);
}

static int read_all(pair *t, double secs)
{
    memset(t->buf, 0, REGION);
    xfer_read_op op = {t->d.base, t->buf, REGION};
    return xfer_read(t->peer, &op, 1, dx_now_ns() + (uint64_t)(secs * 1e9), NULL);
}

static void pair_close(pair *t)
{
    xfer_peer_destroy(t->peer);
    xfer_agent_destroy(t->reader);
    xfer_agent_destroy(t->holder);
    free(t->buf);
}

static void test_read_after_release_fails(void **state)
{
    (void)state;
    pair t;
    pair_open(&t);
    assert_int_equal(read_all(&t, 10), 0);
    for (size_t i = 0; i < REGION; i++)
        if (t.buf[i] != (uint8_t)i) fail_msg("byte %zu: %u, want %u", i, t.buf[i], (uint8_t)i);
    xfer_agent_release(t.holder, t.region, REGION); /* what kv_pool_destroy does */
    uint64_t t0 = dx_now_ns();
    int rc = read_all(&t, 10);
    double waited = (double)(dx_now_ns() - t0) * 1e-9;
    if (rc != DX_ETRANSPORT && rc != DX_ETIMEDOUT)
        fail_msg("a READ after the holder released its region: rc %d (%s)", rc,
                 rc ? dx_errmsg() : "succeeded");
    print_message("the READ failed in %.2f s: %s\n", waited, dx_errmsg());
    assert_true(xfer_peer_failed(t.peer) || rc == DX_ETIMEDOUT);
    pair_close(&t);
}

/* An agent whose region is released serves and connects nothing. */
static void test_released_agent_refuses_peers(void **state)
{
    (void)state;
    pair t;
    pair_open(&t);
    xfer_peer_destroy(t.peer);
    t.peer = NULL;
    uint8_t *mine = xfer_agent_alloc(t.reader, 4096);
    assert_non_null(mine);
    xfer_agent_release(t.reader, mine, 4096);
    xfer_peer *p = NULL;
    int rc = xfer_peer_connect(t.reader, t.d.worker_addr, t.d.worker_addr_len, t.d.rkey,
                               t.d.rkey_len, t.d.base, t.d.length, &p);
    assert_int_equal(rc, DX_ETRANSPORT);
    assert_null(p);
    assert_non_null(strstr(dx_errmsg(), "connecting to the peer's worker"));
    xfer_desc d;
    xfer_agent_describe(t.reader, &d);
    assert_null(d.worker_addr);
    assert_int_equal(d.worker_addr_len, 0);
    pair_close(&t); /* destroy after release: the rest goes */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_after_release_fails),
        cmocka_unit_test(test_released_agent_refuses_peers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
