/* work_pool: a few threads that run jobs for an event loop and hand each
 * back to it when done — libuv's uv_queue_work, with threads of its own.
 *
 * A request's preparation (JSON parsing, the chat template, tokenising)
 * takes milliseconds per megabyte; on the loop it would stall every stream
 * the loop serves.  libuv's own pool is shared by the whole process, and the
 * P/D pulls wait on the network there for as long as their deadline, so a
 * preparation queued behind them could wait as long; here it queues only
 * behind other preparations.
 *
 * Threads: `run` on a pool thread, `done` on the loop's thread, in the order
 * the jobs finish.  The loop must not touch what a job's `run` works on
 * until its `done`. */
#ifndef WORK_POOL_H
#define WORK_POOL_H

#include <stddef.h>
#include <uv.h>

typedef struct work_pool work_pool;
typedef struct work_job work_job;
typedef void (*work_fn)(work_job *j);

struct work_job {
    work_fn run;  /* pool thread */
    work_fn done; /* loop thread, after run; or without it, canceled, at destroy */
    int canceled; /* set before done when the pool was destroyed before run */
    work_job *next;
};

/* n_threads >= 1.  DX_ENOMEM when a thread cannot start. */
int work_pool_create(uv_loop_t *loop, int n_threads, work_pool **out);
/* Loop thread.  j must stay valid until its done has run. */
void work_pool_submit(work_pool *p, work_job *j);
/* Loop thread: lets the jobs that are running finish, then runs done for
 * every job not yet handed back (those that never ran with canceled set),
 * stops the threads and frees the pool once the loop has closed its handle
 * (run the loop afterwards).  NULL: no-op. */
void work_pool_destroy(work_pool *p);

#endif
