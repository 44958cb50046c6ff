/* engine: the scheduler on a thread of its own, fed through a locked inbox.
 *
 * Callers never touch the scheduler: engine_submit validates synchronously
 * (so the HTTP layer can answer 400/503 at once), copies the request into the
 * inbox and signals; the engine thread drains the inbox between steps.  Events
 * are delivered on the engine thread, never while the inbox lock is held, so
 * a callback may call engine_cancel.
 *
 * Admission is decided once, in engine_submit, against an exact count: the
 * requests the scheduler held at its last snapshot plus every request
 * submitted since (n_in stays counted until a snapshot includes it), so the
 * scheduler never has to refuse for capacity a request the caller was told
 * it accepted. */
#include "engine/engine.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "base/dx_tpool.h"
#include "engine/sched.h"

typedef struct item {
    struct item *next;
    int cancel;
    uint64_t id;
    uint64_t t_submit;  /* when engine_submit took it, for TTFT */
    engine_request req; /* prompt and stop owned by the item */
} item;

struct engine {
    engine_config cfg;
    const model *m;
    kv_pool *pool;
    dx_tpool *tp;
    sched *s;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *in_head, *in_tail;
    uint32_t n_in; /* submitted requests not yet in the stats snapshot */
    int stop;
    int stopped; /* engine_stop has run: no scheduler any more */
    uint64_t next_id;
    int kv_type;      /* enum dx_dtype parsed from cfg.kv_dtype */
    pthread_t pop_th; /* faults the pool's pages in while the engine already runs */
    int pop_started;
    int pop_stop;          /* atomic: set by engine_stop, read by the populate thread */
    engine_stats stats;    /* snapshot after the last step */
    pthread_mutex_t gv_mu; /* builds gv once, without holding mu */
    gram_vocab *gv;        /* written once under gv_mu; read by the engine thread after an item */
};

static void item_free(item *it)
{
    if (!it) return;
    if (!it->cancel) {
        dx_free((void *)it->req.prefix_blocks);
        dx_free((void *)it->req.sampling.bias);
        dx_free((void *)it->req.prompt);
        for (size_t i = 0; i < it->req.n_stop; i++) dx_free((void *)it->req.stop[i]);
        dx_free((void *)it->req.stop);
    }
    dx_free(it);
}

static void push_item(engine *e, item *it)
{
    if (e->in_tail)
        e->in_tail->next = it;
    else
        e->in_head = it;
    e->in_tail = it;
    if (!it->cancel) e->n_in++;
    pthread_cond_signal(&e->cv);
}

/* A request the engine accepted but will not run: its handed-in blocks go
 * back (the engine owns their references since engine_submit). */
static void drop_prefix_blocks(engine *e, const item *it)
{
    for (size_t i = 0; i < it->req.n_prefix_blocks; i++)
        kv_pool_unref(e->pool, it->req.prefix_blocks[i]);
}

static void fail_request(const item *it, enum engine_finish fin, int err, const char *msg)
{
    engine_event ev = {.type = ENGINE_EV_DONE,
                       .req_id = it->id,
                       .finish = fin,
                       .error = err,
                       .error_msg = msg,
                       .stop_index = -1,
                       .n_prompt = (uint32_t)it->req.n_prompt};
    it->req.on_event(it->req.user, &ev);
}

static void drain(engine *e, item *list)
{
    while (list) {
        item *it = list;
        list = it->next;
        if (it->cancel) {
            sched_cancel(e->s, it->id); /* ENOENT: already finished */
        } else {
            /* engine_submit built it before queueing the item */
            if (it->req.grammar) sched_set_gram_vocab(e->s, e->gv);
            if (sched_submit_at(e->s, &it->req, it->id, it->t_submit)) {
                drop_prefix_blocks(e, it);
                fail_request(it, ENGINE_FINISH_ERROR, dx_errcode(), dx_errmsg());
            }
        }
        item_free(it);
    }
}

static void *engine_main(void *arg)
{
    engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        if (!e->in_head && !sched_busy(e->s)) {
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        item *list = e->in_head;
        e->in_head = e->in_tail = NULL;
        uint32_t taken = e->n_in; /* still counted until the snapshot below has them */
        pthread_mutex_unlock(&e->mu);
        drain(e, list);
        engine_stats st;
        sched_get_stats(e->s, &st);
        pthread_mutex_lock(&e->mu);
        e->stats = st;
        e->n_in -= taken;
        pthread_mutex_unlock(&e->mu);
        sched_step(e->s);
        sched_get_stats(e->s, &st);
        pthread_mutex_lock(&e->mu);
        e->stats = st;
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int engine_parse_kv_dtype(const char *name, int *out)
{
    enum dx_dtype t = DX_F16;
    if (!name) name = ENGINE_DEFAULT_KV_DTYPE;
    /* the weight dtypes may grow; the KV cache takes these four */
    if (dx_dtype_parse(name, &t) || (t != DX_F16 && t != DX_BF16 && t != DX_F32 && t != DX_Q8_0))
        return dx_errf(DX_EINVAL, "KV cache dtype '%s' is not supported (" ENGINE_KV_DTYPES ")",
                       name);
    *out = (int)t;
    return 0;
}

static int make_pool(engine *e)
{
    const model_hparams *hp = model_hp(e->m);
    uint64_t fp[2];
    model_fingerprint(e->m, fp);
    kv_pool_config pc = {.n_layer = hp->n_layer,
                         .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim,
                         .block_size = e->cfg.block_size,
                         .dtype = e->kv_type,
                         .n_blocks = e->cfg.kv_blocks,
                         .pool_bytes = e->cfg.kv_cache_mb << 20,
                         .seed = {fp[0], fp[1]},
                         .alloc = e->cfg.kv_alloc,
                         .release = e->cfg.kv_release,
                         .alloc_user = e->cfg.kv_alloc_user};
    return kv_pool_create(&pc, &e->pool);
}

static void *populate_main(void *arg)
{
    engine *e = arg;
    uint64_t t0 = dx_now_ns();
    int rc = kv_pool_populate(e->pool, &e->pop_stop);
    double mib = (double)kv_pool_arena_bytes(e->pool) / (1024.0 * 1024.0);
    if (rc == 0)
        dx_log(e->cfg.log_populate ? DX_LOG_INFO : DX_LOG_DEBUG,
               "KV pool: %.0f MiB faulted in, in the background, in %.0f ms", mib,
               (double)(dx_now_ns() - t0) * 1e-6);
    else if (rc != DX_ECANCELED)
        DX_LOGD("KV pool: pages fault in on first use (%s)", dx_errmsg());
    return NULL;
}

static void apply_defaults(engine_config *c, const model *m)
{
    if (c->n_threads <= 0) c->n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (c->n_threads <= 0) c->n_threads = 1;
    if (!c->kv_cache_mb && !c->kv_blocks) c->kv_cache_mb = ENGINE_DEFAULT_KV_CACHE_MB;
    if (!c->block_size) c->block_size = ENGINE_DEFAULT_BLOCK_SIZE;
    if (!c->max_batch_tokens) c->max_batch_tokens = ENGINE_DEFAULT_MAX_BATCH_TOKENS;
    if (!c->max_seqs) c->max_seqs = ENGINE_DEFAULT_MAX_SEQS;
    if (!c->max_waiting) c->max_waiting = ENGINE_DEFAULT_MAX_WAITING;
    uint32_t train = model_hp(m)->n_ctx_train;
    if (!c->n_ctx) c->n_ctx = train < ENGINE_DEFAULT_MAX_CTX ? train : ENGINE_DEFAULT_MAX_CTX;
}

int engine_create(const engine_config *cfg, const model *m, engine **out)
{
    *out = NULL;
    engine *e = dx_calloc(1, sizeof *e);
    if (!e) return dx_errf(DX_ENOMEM, "out of memory");
    e->cfg = *cfg;
    e->m = m;
    apply_defaults(&e->cfg, m);
    e->next_id = 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->gv_mu, NULL);
    sched_config sc = {
        e->cfg.max_batch_tokens, e->cfg.max_seqs,   e->cfg.max_waiting,    e->cfg.n_ctx,
        e->cfg.no_prefix_cache,  e->cfg.kv_reclaim, e->cfg.kv_reclaim_user};
    int rc = engine_parse_kv_dtype(e->cfg.kv_dtype, &e->kv_type);
    if (!rc) rc = make_pool(e);
    if (!rc) rc = dx_tpool_create(e->cfg.n_threads, &e->tp);
    if (!rc) rc = sched_create(&sc, m, e->pool, e->tp, &e->s);
    if (!rc && pthread_create(&e->th, NULL, engine_main, e))
        rc = dx_errf(DX_ENOMEM, "cannot start the engine thread");
    if (rc) {
        engine_destroy(e);
        return rc;
    }
    e->started = 1;
    /* best effort: without it pages fault in on first use */
    e->pop_started = !e->cfg.no_populate && pthread_create(&e->pop_th, NULL, populate_main, e) == 0;
    sched_get_stats(e->s, &e->stats);
    *out = e;
    return 0;
}

void engine_stop(engine *e)
{
    if (!e || e->stopped) return;
    if (e->pop_started) {
        __atomic_store_n(&e->pop_stop, 1, __ATOMIC_RELAXED);
        pthread_join(e->pop_th, NULL);
        e->pop_started = 0;
    }
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->th, NULL);
    }
    pthread_mutex_lock(&e->mu);
    item *list = e->in_head;
    e->in_head = e->in_tail = NULL;
    e->n_in = 0;
    e->stopped = 1;
    pthread_mutex_unlock(&e->mu);
    for (item *it = list, *next; it; it = next) {
        next = it->next;
        if (!it->cancel) {
            drop_prefix_blocks(e, it);
            fail_request(it, ENGINE_FINISH_CANCELED, 0, NULL);
        }
        item_free(it);
    }
    sched_destroy(e->s);
    e->s = NULL;
    dx_tpool_destroy(e->tp);
    e->tp = NULL;
}

void engine_destroy(engine *e)
{
    if (!e) return;
    engine_stop(e);
    for (item *it = e->in_head, *next; it; it = next) { /* cancels sent after the stop */
        next = it->next;
        item_free(it);
    }
    kv_pool_destroy(e->pool);
    gram_vocab_destroy(e->gv);
    pthread_mutex_destroy(&e->gv_mu);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    dx_free(e);
}

static item *copy_request(const engine_request *r)
{
    item *it = dx_calloc(1, sizeof *it);
    if (!it) return NULL;
    it->req = *r;
    it->req.prompt = dx_memdup(r->prompt, r->n_prompt * sizeof(int32_t));
    it->req.stop = r->n_stop ? dx_calloc(r->n_stop, sizeof(char *)) : NULL;
    it->req.prefix_blocks = r->n_prefix_blocks
                                ? dx_memdup(r->prefix_blocks, r->n_prefix_blocks * sizeof(int32_t))
                                : NULL;
    it->req.sampling.bias =
        r->sampling.n_bias ? dx_memdup(r->sampling.bias, r->sampling.n_bias * sizeof(engine_bias))
                           : NULL;
    int oom = !it->req.prompt || (r->n_stop && !it->req.stop) ||
              (r->n_prefix_blocks && !it->req.prefix_blocks) ||
              (r->sampling.n_bias && !it->req.sampling.bias);
    for (size_t i = 0; !oom && i < r->n_stop; i++)
        oom = !(((char **)it->req.stop)[i] = dx_strdup(r->stop[i]));
    if (oom) {
        item_free(it);
        return NULL;
    }
    return it;
}

int engine_submit(engine *e, const engine_request *req, uint64_t *req_id)
{
    if (e->stopped) return dx_errf(DX_ECLOSED, "the engine has stopped");
    int rc = sched_check(e->s, req);
    const gram_vocab *gv;
    if (!rc && req->grammar) rc = engine_gram_vocab(e, &gv);
    if (rc) return rc;
    item *it = copy_request(req);
    if (!it) return dx_errf(DX_ENOMEM, "out of memory");
    pthread_mutex_lock(&e->mu);
    if (e->stopped) {
        pthread_mutex_unlock(&e->mu);
        item_free(it);
        return dx_errf(DX_ECLOSED, "the engine has stopped");
    }
    uint32_t outstanding = e->n_in + e->stats.running + e->stats.waiting;
    if (outstanding >= e->cfg.max_seqs + e->cfg.max_waiting) {
        pthread_mutex_unlock(&e->mu);
        item_free(it);
        return dx_errf(DX_EBUSY, "the engine is at capacity (%u requests queued or running)",
                       outstanding);
    }
    it->id = e->next_id++;
    it->t_submit = dx_now_ns();
    if (req_id) *req_id = it->id;
    push_item(e, it);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int engine_cancel(engine *e, uint64_t req_id)
{
    item *it = dx_calloc(1, sizeof *it);
    if (!it) return dx_errf(DX_ENOMEM, "out of memory");
    it->cancel = 1;
    it->id = req_id;
    pthread_mutex_lock(&e->mu);
    push_item(e, it);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int engine_gram_vocab(engine *e, const gram_vocab **out)
{
    pthread_mutex_lock(&e->gv_mu);
    int rc = 0;
    if (!e->gv) {
        uint64_t t0 = dx_now_ns();
        rc = gram_vocab_create(model_tokenizer(e->m), &e->gv);
        if (!rc)
            DX_LOGI("grammar vocabulary: %u tokens prepared in %.0f ms", gram_vocab_size(e->gv),
                    (double)(dx_now_ns() - t0) * 1e-6);
    }
    *out = e->gv;
    pthread_mutex_unlock(&e->gv_mu);
    return rc;
}

void engine_get_stats(engine *e, engine_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
    /* the pool is thread-safe: read it live, so blocks freed by a request
     * whose DONE event was just delivered are already counted as free */
    kv_pool_get_stats(e->pool, &out->kv);
}

const model *engine_model(const engine *e)
{
    return e->m;
}

kv_pool *engine_kv_pool(engine *e)
{
    return e->pool;
}

uint32_t engine_n_ctx(const engine *e)
{
    return e->cfg.n_ctx;
}
