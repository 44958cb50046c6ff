/* dx_tpool: fixed worker pool for data-parallel kernels.
 *
 * One 64-bit word `work` holds the current run's task count (high 32 bits)
 * and the next unclaimed index (low 32 bits).  A claim is one fetch_add: the
 * returned word says by itself whether the index is a real task (idx < n) of
 * the run in progress, so a worker that arrives late, even after the caller
 * has started the next run, can never run a task twice or read a stale
 * descriptor: a run cannot finish while one of its claimed tasks is still
 * running, and the descriptor (fn, arg) is published before the word.
 *
 * Waking: `seq` counts runs and is the futex word.  Workers spin on it for
 * ~80 us after a run (a decode step issues hundreds of short runs; a futex
 * wake-up costs tens of microseconds), then sleep.  The caller issues the
 * FUTEX_WAKE syscall only when some worker announced that it sleeps. */
#include "base/dx_tpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"

#define TPOOL_SPIN_NS 80000u
/* Tasks per published word: the low half must not overflow even when every
 * worker overshoots once. */
#define TPOOL_MAX_BATCH 0x7fffffffu

struct dx_tpool {
    int n_threads;
    pthread_t *threads;                      /* [n_threads - 1] */
    _Alignas(64) atomic_uint_least64_t work; /* n << 32 | next index */
    _Alignas(64) atomic_size_t done;         /* tasks finished in this run */
    _Alignas(64) atomic_uint seq;            /* run counter; futex word */
    atomic_int sleepers;
    atomic_int stop;
    /* Descriptor of the current run; written before `work` is published. */
    dx_tpool_fn fn;
    void *arg;
    size_t base; /* first task index of the current batch */
};

typedef struct {
    dx_tpool *pool;
    int tid;
} tpool_worker_arg;

static void tpool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long tpool_futex(atomic_uint *addr, int op, unsigned val)
{
    return syscall(SYS_futex, (unsigned *)addr, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

/* Claims and runs tasks until the published word is exhausted. */
static void tpool_drain(dx_tpool *p, int tid)
{
    for (;;) {
        uint64_t w = atomic_fetch_add_explicit(&p->work, 1, memory_order_acq_rel);
        uint32_t n = (uint32_t)(w >> 32), i = (uint32_t)w;
        if (i >= n) return;
        p->fn(p->arg, p->base + i, tid);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

/* Returns the new value of seq once it differs from `seen`: spins first,
 * then sleeps on the futex. */
static unsigned tpool_wait_seq(dx_tpool *p, unsigned seen)
{
    uint64_t t0 = dx_now_ns();
    for (unsigned spin = 0;; spin++) {
        unsigned s = atomic_load_explicit(&p->seq, memory_order_acquire);
        if (s != seen) return s;
        tpool_pause();
        if ((spin & 63) == 63 && dx_now_ns() - t0 > TPOOL_SPIN_NS) break;
    }
    for (;;) {
        atomic_fetch_add(&p->sleepers, 1); /* seq_cst: pairs with dx_tpool_run */
        unsigned s = atomic_load(&p->seq);
        if (s == seen) tpool_futex(&p->seq, FUTEX_WAIT, seen);
        atomic_fetch_sub(&p->sleepers, 1);
        s = atomic_load_explicit(&p->seq, memory_order_acquire);
        if (s != seen) return s;
    }
}

static void *tpool_worker(void *argp)
{
    tpool_worker_arg *wa = argp;
    dx_tpool *p = wa->pool;
    int tid = wa->tid;
    dx_free(wa);
    unsigned seen = 0; /* seq's value at create: a run or stop before we start is not missed */
    for (;;) {
        seen = tpool_wait_seq(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        tpool_drain(p, tid);
    }
}

static void tpool_stop_workers(dx_tpool *p, int n_started)
{
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->seq, 1);
    tpool_futex(&p->seq, FUTEX_WAKE, INT_MAX);
    for (int i = 0; i < n_started; i++) pthread_join(p->threads[i], NULL);
}

int dx_tpool_create(int n_threads, dx_tpool **out)
{
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return dx_errf(DX_EINVAL, "thread pool: %d threads (want 1..1024)", n_threads);
    dx_tpool *p = dx_aligned_alloc(64, sizeof(*p));
    if (!p) return dx_errf(DX_ENOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    atomic_init(&p->work, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->seq, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    if (n_threads > 1) {
        p->threads = dx_calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) {
            dx_aligned_free(p);
            return dx_errf(DX_ENOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        tpool_worker_arg *wa = dx_malloc(sizeof(*wa));
        if (wa) *wa = (tpool_worker_arg){.pool = p, .tid = i + 1};
        int rc = wa ? pthread_create(&p->threads[i], NULL, tpool_worker, wa) : -1;
        if (rc != 0) {
            dx_free(wa);
            tpool_stop_workers(p, i);
            dx_free(p->threads);
            dx_aligned_free(p);
            return dx_errf(wa ? DX_EIO : DX_ENOMEM, "thread pool: cannot start worker %d of %d",
                           i + 1, n_threads - 1);
        }
    }
    *out = p;
    return 0;
}

void dx_tpool_destroy(dx_tpool *p)
{
    if (!p) return;
    tpool_stop_workers(p, p->n_threads - 1);
    dx_free(p->threads);
    dx_aligned_free(p);
}

int dx_tpool_size(const dx_tpool *p)
{
    return p ? p->n_threads : 1;
}

/* One published batch of at most TPOOL_MAX_BATCH tasks. */
static void tpool_run_batch(dx_tpool *p, size_t base, uint32_t n, dx_tpool_fn fn, void *arg)
{
    p->fn = fn;
    p->arg = arg;
    p->base = base;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->work, (uint64_t)n << 32, memory_order_release);
    atomic_fetch_add(&p->seq, 1); /* seq_cst: orders against the sleepers read */
    if (atomic_load(&p->sleepers) > 0) tpool_futex(&p->seq, FUTEX_WAKE, INT_MAX);
    tpool_drain(p, 0);
    for (unsigned spin = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n; spin++) {
        tpool_pause();
        if ((spin & 1023) == 1023) sched_yield(); /* a worker may be descheduled */
    }
}

void dx_tpool_run(dx_tpool *p, size_t n_tasks, dx_tpool_fn fn, void *arg)
{
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (size_t i = 0; i < n_tasks; i++) fn(arg, i, 0);
        return;
    }
    for (size_t base = 0; base < n_tasks; base += TPOOL_MAX_BATCH) {
        size_t n = n_tasks - base < TPOOL_MAX_BATCH ? n_tasks - base : TPOOL_MAX_BATCH;
        tpool_run_batch(p, base, (uint32_t)n, fn, arg);
    }
}
