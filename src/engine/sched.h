/* sched: continuous-batching scheduler.  Single-threaded: the engine thread
 * owns it (tests drive it directly).
 *
 * Each step mixes one decode token from every running sequence with chunks of
 * pending prefills, up to max_batch_tokens; waiting requests are admitted
 * when the pool has room for their prompt; a new request first takes the
 * longest prefix of its prompt from the prefix cache.  When the pool runs dry
 * mid-step, the newest running sequence is preempted: its blocks are released
 * (its full blocks stay cached, so it usually gets them back) and it is
 * recomputed later — old sequences never fail because of new ones.  Because
 * the forward pass is batch-invariant, preemption, batching and caching never
 * change a sequence's tokens. */
#ifndef SCHED_H
#define SCHED_H

#include <stdint.h>

#include "base/dx_tpool.h"
#include "engine/engine.h"
#include "engine/kv_pool.h"
#include "engine/step_cost.h"
#include "model/model.h"

typedef struct {
    uint32_t max_batch_tokens;
    uint32_t max_seqs;
    uint32_t max_waiting;
    uint32_t n_ctx;
    int no_prefix_cache;        /* engine_config.no_prefix_cache */
    int (*reclaim)(void *user); /* engine_config.kv_reclaim */
    void *reclaim_user;
} sched_config;

typedef struct sched sched;

int sched_create(const sched_config *cfg, const model *m, kv_pool *pool, dx_tpool *tp,
                 sched **out);
/* Finishes every request with ENGINE_FINISH_CANCELED (events delivered). */
void sched_destroy(sched *s);
/* Validation alone (prompt, context, vocabulary, stop strings); reads only
 * immutable state, so any thread may call it. */
int sched_check(const sched *s, const engine_request *req);
/* Validates and queues; DX_EINVAL / DX_EBUSY with a message. */
int sched_submit(sched *s, const engine_request *req, uint64_t id);
/* Same, with the time the caller received the request (dx_now_ns clock), so
 * TTFT includes time spent in the caller's queue. */
int sched_submit_at(sched *s, const engine_request *req, uint64_t id, uint64_t t_submit_ns);
/* Marks the request for cancellation at the next step; DX_ENOENT if unknown. */
int sched_cancel(sched *s, uint64_t id);
/* One forward step (or just admissions/cancellations).  Returns the number of
 * requests still running or waiting, or a negative code on an internal
 * failure (every affected request has received an ERROR event). */
int sched_step(sched *s);
int sched_busy(const sched *s); /* requests running or waiting */
void sched_get_stats(const sched *s, engine_stats *out);
/* The work of the last sched_step's forward pass (no time: the caller
 * times the step); all zero when it ran none. */
void sched_last_step(const sched *s, step_cost_sample *out);
uint32_t sched_n_ctx(const sched *s);
/* The vocabulary requests with a grammar are matched over (engine.h
 * engine_gram_vocab); set before the first such request, never changed
 * afterwards (a later call with the same pointer is a no-op). */
void sched_set_gram_vocab(sched *s, const gram_vocab *v);

#endif
