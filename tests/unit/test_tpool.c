/* Unit tests for dx_tpool: every task runs exactly once, on a valid thread
 * id, across task counts, consecutive runs, pool sizes and sleeping workers. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_tpool.h"

typedef struct {
    atomic_int *hits; /* [n] */
    int n_threads;
    atomic_int bad_tid;
} count_ctx;

static void count_task(void *arg, size_t task, int tid)
{
    count_ctx *c = arg;
    atomic_fetch_add(&c->hits[task], 1);
    if (tid < 0 || tid >= c->n_threads) atomic_fetch_add(&c->bad_tid, 1);
}

/* Runs n tasks and checks each ran exactly once. */
static void run_and_check(dx_tpool *p, size_t n)
{
    count_ctx c = {.n_threads = dx_tpool_size(p)};
    c.hits = dx_calloc(n ? n : 1, sizeof(atomic_int));
    assert_non_null(c.hits);
    atomic_init(&c.bad_tid, 0);
    dx_tpool_run(p, n, count_task, &c);
    for (size_t i = 0; i < n; i++) assert_int_equal(atomic_load(&c.hits[i]), 1);
    assert_int_equal(atomic_load(&c.bad_tid), 0);
    dx_free(c.hits);
}

static void check_pool(int n_threads)
{
    size_t live = dx_alloc_live_bytes();
    dx_tpool *p = NULL;
    assert_int_equal(dx_tpool_create(n_threads, &p), 0);
    assert_non_null(p);
    assert_int_equal(dx_tpool_size(p), n_threads);
    static const size_t sizes[] = {0, 1, 2, 3, 7, 64, 1000, 10007};
    for (size_t i = 0; i < DX_ARRAY_LEN(sizes); i++) run_and_check(p, sizes[i]);
    /* Many short consecutive runs: the decode-step pattern. */
    for (int r = 0; r < 3000; r++) run_and_check(p, (size_t)(r % 9));
    /* Let the workers fall asleep on the futex, then wake them. */
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    run_and_check(p, 257);
    nanosleep(&ts, NULL);
    run_and_check(p, 1);
    run_and_check(p, 5);
    dx_tpool_destroy(p);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_tpool_1(void **state)
{
    (void)state;
    check_pool(1);
}
static void test_tpool_2(void **state)
{
    (void)state;
    check_pool(2);
}
static void test_tpool_4(void **state)
{
    (void)state;
    check_pool(4);
}

static void test_tpool_null_inline(void **state)
{
    (void)state;
    assert_int_equal(dx_tpool_size(NULL), 1);
    run_and_check(NULL, 0);
    run_and_check(NULL, 33);
    dx_tpool_destroy(NULL);
}

typedef struct {
    long *sums; /* [n_threads][8]: padded per-thread partial sums */
} sum_ctx;

static void sum_task(void *arg, size_t task, int tid)
{
    sum_ctx *c = arg;
    c->sums[tid * 8] += (long)task;
}

/* Per-thread results written without atomics are all visible to the caller
 * after run returns. */
static void test_tpool_results_visible(void **state)
{
    (void)state;
    dx_tpool *p = NULL;
    assert_int_equal(dx_tpool_create(3, &p), 0);
    long sums[3 * 8];
    for (int r = 0; r < 200; r++) {
        memset(sums, 0, sizeof(sums));
        sum_ctx c = {sums};
        size_t n = 100 + (size_t)r;
        dx_tpool_run(p, n, sum_task, &c);
        assert_int_equal(sums[0] + sums[8] + sums[16], (long)(n * (n - 1) / 2));
    }
    dx_tpool_destroy(p);
}

static void count_noop(void *arg, size_t task, int tid)
{
    (void)arg, (void)task, (void)tid;
}

static void test_tpool_bad_args(void **state)
{
    (void)state;
    dx_tpool *p = (dx_tpool *)1;
    assert_int_equal(dx_tpool_create(0, &p), DX_EINVAL);
    assert_null(p);
    assert_int_equal(dx_tpool_create(-3, &p), DX_EINVAL);
    /* Out of memory while starting workers: clean failure, no leak. */
    size_t live = dx_alloc_live_bytes();
    for (long n = 1; n <= 4; n++) {
        dx_alloc_fail_after(n, 0);
        int rc = dx_tpool_create(3, &p);
        dx_alloc_fail_after(0, 0);
        if (rc == 0) {
            dx_tpool_run(p, 10, count_noop, NULL);
            dx_tpool_destroy(p);
        } else {
            assert_int_equal(rc, DX_ENOMEM);
            assert_null(p);
        }
        assert_int_equal(dx_alloc_live_bytes(), live);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tpool_1),
        cmocka_unit_test(test_tpool_2),
        cmocka_unit_test(test_tpool_4),
        cmocka_unit_test(test_tpool_null_inline),
        cmocka_unit_test(test_tpool_results_visible),
        cmocka_unit_test(test_tpool_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
