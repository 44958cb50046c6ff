/* work_pool: jobs off the loop, results back through a uv_async (see .h).
 *
 * One mutex guards both lists: `todo` (submitted, not started) and `fin`
 * (run, not yet handed back).  Threads sleep on a condition variable while
 * there is nothing to do; a finished job is appended to `fin` and the loop
 * woken, which takes the whole list at once. */
#include "http/work_pool.h"

#include <pthread.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

struct work_pool {
    uv_loop_t *loop;
    uv_async_t wake;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t *th;
    int n_th;
    int stop;                   /* guarded by mu */
    work_job *todo, *todo_tail; /* guarded by mu */
    work_job *fin, *fin_tail;   /* guarded by mu */
};

static void append(work_job **head, work_job **tail, work_job *j)
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static void *worker(void *arg)
{
    work_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->todo) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        work_job *j = p->todo;
        p->todo = j->next;
        if (!p->todo) p->todo_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        j->run(j);
        pthread_mutex_lock(&p->mu);
        append(&p->fin, &p->fin_tail, j);
        uv_async_send(&p->wake);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Hands back everything finished (loop thread). */
static void deliver(work_pool *p)
{
    pthread_mutex_lock(&p->mu);
    work_job *j = p->fin;
    p->fin = p->fin_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (j) {
        work_job *next = j->next;
        j->done(j);
        j = next;
    }
}

static void on_wake(uv_async_t *a)
{
    deliver(a->data);
}

static void stop_threads(work_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_th; i++) pthread_join(p->th[i], NULL);
    p->n_th = 0;
}

static void on_closed(uv_handle_t *h)
{
    work_pool *p = h->data;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    dx_free(p->th);
    dx_free(p);
}

int work_pool_create(uv_loop_t *loop, int n_threads, work_pool **out)
{
    *out = NULL;
    work_pool *p = dx_calloc(1, sizeof *p);
    if (!p) return dx_errf(DX_ENOMEM, "out of memory");
    p->loop = loop;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    uv_async_init(loop, &p->wake, on_wake);
    p->wake.data = p;
    p->th = dx_calloc(n_threads > 0 ? (size_t)n_threads : 1, sizeof *p->th);
    int rc = p->th ? 0 : dx_errf(DX_ENOMEM, "work pool: thread table");
    for (int i = 0; !rc && i < n_threads; i++) {
        if (pthread_create(&p->th[i], NULL, worker, p) != 0)
            rc = dx_errf(DX_ENOMEM, "work pool: thread %d", i);
        else
            p->n_th++;
    }
    if (rc) {
        stop_threads(p);
        uv_close((uv_handle_t *)&p->wake, on_closed);
        return dx_errf(rc, "cannot start the request preparation threads");
    }
    *out = p;
    return 0;
}

void work_pool_submit(work_pool *p, work_job *j)
{
    j->canceled = 0;
    pthread_mutex_lock(&p->mu);
    append(&p->todo, &p->todo_tail, j);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void work_pool_destroy(work_pool *p)
{
    if (!p) return;
    stop_threads(p); /* what runs finishes; no thread touches the lists after this */
    deliver(p);
    for (work_job *j = p->todo, *next; j; j = next) {
        next = j->next;
        j->canceled = 1;
        j->done(j);
    }
    p->todo = p->todo_tail = NULL;
    uv_close((uv_handle_t *)&p->wake, on_closed);
}
