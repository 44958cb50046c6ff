/* dx_tpool: a fixed pool of worker threads for the engine's data-parallel
 * kernels.  dx_tpool_run(p, n, fn, arg) calls fn(arg, i, tid) for every task
 * i in [0, n) across the workers and the calling thread, and returns when all
 * are done.  Tasks are handed out by an atomic counter.  Workers spin briefly
 * between runs, then sleep on a futex, so a decode step's hundreds of short
 * runs do not pay a wake-up each.
 *
 * Determinism: the pool only decides *which thread* computes a task; kernels
 * make each task's result independent of that, so thread count never
 * changes a bit of output. */
#ifndef DX_TPOOL_H
#define DX_TPOOL_H

#include <stddef.h>

typedef struct dx_tpool dx_tpool;
typedef void (*dx_tpool_fn)(void *arg, size_t task, int tid);

/* n_threads total including the caller (>= 1). */
int dx_tpool_create(int n_threads, dx_tpool **out);
void dx_tpool_destroy(dx_tpool *p);
int dx_tpool_size(const dx_tpool *p);
/* Not reentrant; one caller thread at a time.  p may be NULL (runs inline). */
void dx_tpool_run(dx_tpool *p, size_t n_tasks, dx_tpool_fn fn, void *arg);

#endif
