/* test_work_pool: jobs run on the pool's threads and come back to the loop's
 * thread, every one exactly once; destroying the pool lets running jobs
 * finish and hands back the ones that never ran, marked canceled. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "http/work_pool.h"

typedef struct {
    work_job job;
    pthread_t ran_on, done_on;
    int runs, dones, canceled;
} job;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_block;   /* jobs wait in run while set */
static int g_entered; /* jobs that have begun run (only grows) */
static int g_done;

static void run(work_job *j)
{
    job *x = (job *)j;
    x->ran_on = pthread_self();
    x->runs++;
    pthread_mutex_lock(&g_mu);
    g_entered++;
    pthread_cond_broadcast(&g_cv);
    while (g_block) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

static void done(work_job *j)
{
    job *x = (job *)j;
    x->done_on = pthread_self();
    x->dones++;
    x->canceled = j->canceled;
    g_done++;
}

static void submit_all(work_pool *p, job *jobs, int n)
{
    for (int i = 0; i < n; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].job = (work_job){.run = run, .done = done};
        work_pool_submit(p, &jobs[i].job);
    }
}

static void test_round_trip(void **state)
{
    (void)state;
    enum { N = 200 };
    uv_loop_t loop;
    uv_loop_init(&loop);
    work_pool *p;
    assert_int_equal(work_pool_create(&loop, 2, &p), 0);
    static job jobs[N];
    g_done = 0;
    submit_all(p, jobs, N);
    while (g_done < N) uv_run(&loop, UV_RUN_ONCE);
    for (int i = 0; i < N; i++) {
        assert_int_equal(jobs[i].runs, 1);
        assert_int_equal(jobs[i].dones, 1);
        assert_int_equal(jobs[i].canceled, 0);
        assert_false(pthread_equal(jobs[i].ran_on, pthread_self()));
        assert_true(pthread_equal(jobs[i].done_on, pthread_self()));
    }
    work_pool_destroy(p);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* Two jobs held in run while eight more wait: destroy lets the two finish
 * (released from another thread) and cancels the eight. */
static void *release_later(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_mu);
    while (g_entered < 2) pthread_cond_wait(&g_cv, &g_mu);
    g_block = 0;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

static void test_destroy_cancels_queued(void **state)
{
    (void)state;
    enum { N = 10 };
    uv_loop_t loop;
    uv_loop_init(&loop);
    work_pool *p;
    assert_int_equal(work_pool_create(&loop, 2, &p), 0);
    static job jobs[N];
    g_done = 0;
    g_entered = 0;
    g_block = 1;
    submit_all(p, jobs, N);
    pthread_t th;
    pthread_create(&th, NULL, release_later, NULL);
    pthread_mutex_lock(&g_mu);
    while (g_entered < 2) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    work_pool_destroy(p); /* returns once the two have run */
    pthread_join(th, NULL);
    int ran = 0, canceled = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(jobs[i].dones, 1);
        ran += jobs[i].runs;
        canceled += jobs[i].canceled;
        assert_int_equal(jobs[i].canceled, !jobs[i].runs);
    }
    assert_int_equal(ran + canceled, N);
    assert_true(ran >= 2);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    work_pool_destroy(NULL);
}

int main(void)
{
    size_t live = dx_alloc_live_bytes();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_destroy_cancels_queued),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (dx_alloc_live_bytes() != live) rc = 1;
    return rc;
}
