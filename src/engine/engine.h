/* engine: the inference engine a node runs — model, KV pool, prefix cache,
 * forward pass, sampler and continuous-batching scheduler on a thread of its
 * own.
 *
 * Callers (the HTTP server's event loop, the CLI, tests) submit requests and
 * receive events through a callback that runs ON THE ENGINE THREAD: it must
 * be short and must not call back into the engine except engine_cancel.  The
 * server copies events into a locked queue and wakes its loop with
 * uv_async_send.  engine_cancel may be called from any thread; it frees the
 * request's blocks at the next step boundary and delivers a final event. */
#ifndef ENGINE_H
#define ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kv_pool.h"
#include "gram/gram.h"
#include "model/model.h"

/* Tokens per KV block unless the caller sets engine_config.block_size:
 * one place, so tools that build pools of their own (bench engine) lay
 * KV out as the server does. */
#define ENGINE_DEFAULT_BLOCK_SIZE 16

/* What engine_create puts in a field of engine_config left 0 (duplex
 * serve's and generate's help shows them).  Each is a plain literal so that
 * help text can spell it (CLI_DEFAULT_INT). */
#define ENGINE_DEFAULT_KV_CACHE_MB      1024
#define ENGINE_DEFAULT_MAX_BATCH_TOKENS 512
#define ENGINE_DEFAULT_MAX_SEQS         64
#define ENGINE_DEFAULT_MAX_WAITING      256
#define ENGINE_DEFAULT_MAX_CTX          32768 /* n_ctx: the model's, at most this */
/* The KV cache's dtype unless engine_config.kv_dtype says, and the names it
 * takes: q8_0 holds a token's KV in 0.53 of f16's bytes (kern.h, docs/pd.md
 * "Sizing"); f16 stays the default, see the README's accuracy figures. */
#define ENGINE_DEFAULT_KV_DTYPE "f16"
#define ENGINE_KV_DTYPES        "f16|bf16|f32|q8_0"

typedef struct {
    int n_threads;             /* default: number of cores */
    size_t kv_cache_mb;        /* KV pool size (0: ENGINE_DEFAULT_KV_CACHE_MB) */
    uint32_t kv_blocks;        /* overrides kv_cache_mb when non-zero */
    uint32_t block_size;       /* tokens per block, default 16 */
    const char *kv_dtype;      /* ENGINE_KV_DTYPES (NULL: ENGINE_DEFAULT_KV_DTYPE) */
    uint32_t max_batch_tokens; /* tokens per forward step (0: ENGINE_DEFAULT_MAX_BATCH_TOKENS) */
    uint32_t max_seqs;         /* running sequences (0: ENGINE_DEFAULT_MAX_SEQS) */
    /* Requests waiting to run (not running) at most; the newest past it end
     * with ERROR / DX_EBUSY ("server busy"); 0: ENGINE_DEFAULT_MAX_WAITING.
     * A request is admitted only when it and every running one can add 64
     * more tokens without a preemption. */
    uint32_t max_waiting;
    uint32_t n_ctx;            /* max tokens per sequence (0: see ENGINE_DEFAULT_MAX_CTX) */
    /* 1: never reuse blocks computed for earlier requests (vLLM's
     * --no-enable-prefix-caching).  Blocks are still hashed, so leases and
     * pins can check them, and prefix_blocks handed in with a request are
     * still used. */
    int no_prefix_cache;
    /* 1: do not fault the pool's pages in on a background thread at start
     * (kv_pool_populate); they then fault in on first use. */
    int no_populate;
    int log_populate; /* say when the pages are in at INFO (servers), else DEBUG */
    /* KV arena allocation hook (the transfer layer registers it with UCX). */
    void *(*kv_alloc)(void *user, size_t bytes);
    void (*kv_release)(void *user, void *p, size_t bytes);
    void *kv_alloc_user;
    /* Called on the engine thread when a request needs a block and the pool
     * has none free or cached, before anything running is preempted: drop
     * references held outside the engine (the node revokes retained leases,
     * least recently used first) and return non-zero if any were dropped,
     * so the engine tries again.  NULL: nothing to reclaim. */
    int (*kv_reclaim)(void *user);
    void *kv_reclaim_user;
} engine_config;

enum engine_finish { ENGINE_FINISH_NONE = 0, ENGINE_FINISH_STOP, ENGINE_FINISH_LENGTH,
                     ENGINE_FINISH_CANCELED, ENGINE_FINISH_ERROR };

typedef struct {
    int32_t id;
    float bias;
} engine_bias;

#define ENGINE_MAX_TOP_LOGPROBS 20

/* Applied to a sequence's logits row before sampling, in this order: the
 * logit biases, the repetition penalty (Hugging Face's: every token of the
 * prompt or the reply so far, a positive logit divided by it, a negative one
 * multiplied), the presence and frequency penalties (OpenAI's: over the
 * reply so far, minus presence once and frequency per occurrence); then
 * temperature, top-k, top-p, min-p. */
typedef struct {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;
    int has_seed; /* else a random seed per request */
    float presence_penalty, frequency_penalty; /* 0 = off */
    float repetition_penalty;                  /* 0 or 1 = off; else > 0 */
    const engine_bias *bias;                   /* copied at submit */
    size_t n_bias;
} engine_sampling;

enum engine_event_type { ENGINE_EV_TOKENS, ENGINE_EV_KV, ENGINE_EV_DONE };

typedef struct {
    enum engine_event_type type;
    uint64_t req_id;
    /* TOKENS: newly generated token ids and their text.  Text is held back
     * while it could be the start of a stop string or an incomplete UTF-8
     * sequence, so concatenating every event's text gives exactly the final
     * output (stop strings excluded). */
    const int32_t *tokens;
    size_t n_tokens;
    const char *text;
    size_t text_len;
    /* TOKENS of a request with logprobs (n_tokens is then 1): the token's
     * log-probability under the model (the raw logits: before biases,
     * penalties and temperature, as vLLM reports by default) and the
     * n_top most likely tokens with theirs, most likely first. */
    int has_logprob;
    float logprob;
    const int32_t *top_ids;
    const float *top_logprobs;
    uint32_t n_top;
    /* KV (only for requests with want_kv, just before a DONE that ends them
     * normally — stop or length): the sequence's tokens (prompt, then every
     * generated token) and the ids of its full blocks whose KV is computed,
     * in token order, each hashed in the prefix cache.  Both are valid only
     * during the callback, which may take pool references on the blocks
     * (kv_pool_ref, or a lease) to keep them past the request. */
    const int32_t *kv_blocks;
    size_t n_kv_blocks;
    /* DONE: how it ended and the usage figures. */
    enum engine_finish finish;
    int error;            /* DX_E* when finish == ERROR */
    const char *error_msg;
    uint32_t n_prompt, n_cached, n_gen; /* n_cached: prompt tokens not computed here */
    uint32_t n_preempted;                /* times the request was preempted (recomputed) */
    int stop_index; /* STOP by a stop string: its index in engine_request.stop; else -1 */
    double ttft_s;        /* submit → first token */
} engine_event;

typedef void (*engine_event_fn)(void *user, const engine_event *ev);

#define ENGINE_MAX_PREGEN 8

typedef struct {
    const int32_t *prompt; /* copied at submit */
    size_t n_prompt;
    uint32_t max_tokens;   /* 0 = up to n_ctx */
    engine_sampling sampling;
    const char *const *stop; /* stop strings (copied), may be NULL */
    size_t n_stop;
    int ignore_eos;
    /* Blocks that already hold the KV of the prompt's first
     * n_prefix_blocks × block_size tokens (from the caller's own prefix
     * match, or pulled from another node), in token order, each hashed
     * (kv_pool_publish) and referenced by the caller.  At most
     * (n_prompt - 1) / block_size of them: the last prompt token is always
     * computed.  When engine_submit succeeds the engine owns those
     * references (it drops them when the request ends); when it fails the
     * caller still does.  The ids are copied. */
    const int32_t *prefix_blocks;
    size_t n_prefix_blocks;
    int want_kv; /* deliver an ENGINE_EV_KV event before a normal DONE */
    /* Tokens already generated after this prompt by another engine with the
     * same model and sampling (a prefill node's first token): delivered as
     * the request's first output when it is admitted, without waiting for a
     * forward step, and the sampler's generator is advanced past them, so
     * that what follows equals a run that generated them here.  Their KV is
     * computed with the next step, and all n_prompt / block_size full
     * prompt blocks may then come in prefix_blocks.  At most max_tokens. */
    int32_t pregen[ENGINE_MAX_PREGEN];
    uint32_t n_pregen;
    /* Report each generated token's log-probability, and the top_logprobs
     * (<= ENGINE_MAX_TOP_LOGPROBS) most likely tokens at each step.  Not
     * with pregen tokens (their probabilities were another engine's). */
    int logprobs;
    uint32_t top_logprobs;
    /* The prefix-cache namespace (kv_pool_seed_salted): the request reuses,
     * and publishes, blocks only under it; all zero = the shared one. */
    uint8_t cache_salt[KV_SALT_BYTES];
    /* Constrained decoding (structured outputs, docs/api.md): every
     * generated token must keep the output a prefix of a sentence of this
     * grammar.  Before sampling, the logits of the tokens it does not allow
     * are set to -inf (only logits: KV and batching are unchanged);
     * end-of-generation is allowed only once the output is complete, and
     * the request ends (STOP) as soon as nothing more may follow.  Pregen
     * tokens are fed to it too (one it refuses ends the request: ERROR).
     * Borrowed: it must stay valid until the request's DONE event (the
     * engine is done with it before that event).  NULL: unconstrained. */
    const gram *grammar;
    engine_event_fn on_event;
    void *user;
} engine_request;

typedef struct {
    uint32_t running, waiting;
    kv_pool_stats kv;
    uint64_t prompt_tokens_computed, prompt_tokens_cached, gen_tokens;
    uint64_t preemptions;
    uint64_t reclaims; /* kv_reclaim calls that dropped outside references */
    uint64_t shed;     /* requests turned away past max_waiting (DONE: ERROR, DX_EBUSY) */
    /* Constrained decoding: token masks computed, the time spent computing
     * them (on the mask thread, overlapped with the forward step), and the
     * time the engine thread waited for them after the step. */
    uint64_t gram_masks, gram_mask_ns, gram_wait_ns;
} engine_stats;

typedef struct engine engine;

/* One of ENGINE_KV_DTYPES (NULL: ENGINE_DEFAULT_KV_DTYPE) to an enum
 * dx_dtype; DX_EINVAL otherwise.  A q8_0 cache needs head_dim % 32 == 0
 * (engine_create says so otherwise). */
int engine_parse_kv_dtype(const char *name, int *out);

int engine_create(const engine_config *cfg, const model *m, engine **out);
/* Cancels everything (final events delivered) and joins the thread; the
 * pool stays until engine_destroy, so references held outside the engine
 * (leases) can be dropped in between.  Idempotent; submit fails after it. */
void engine_stop(engine *e);
void engine_destroy(engine *e); /* engine_stop, then frees the pool */

/* DX_EINVAL: empty prompt, prompt + max_tokens over n_ctx, bad
 * prefix_blocks (message says which); DX_EBUSY: the requests running,
 * waiting and submitted but not yet scheduled number max_seqs + max_waiting
 * already.  That count is exact, so a request accepted here is never turned
 * away for capacity later; only max_waiting's shedding of the newest waiting
 * request (when the pool, not max_seqs, holds requests back) can still end
 * one with ERROR / DX_EBUSY, always before its first token. */
int engine_submit(engine *e, const engine_request *req, uint64_t *req_id);
int engine_cancel(engine *e, uint64_t req_id);
/* The model's vocabulary prepared for grammars (gram_vocab), built on the
 * first call (a walk over the vocabulary: call it off latency-critical
 * threads, e.g. while preparing a request); engine_submit of a request with
 * a grammar builds it too.  Thread-safe; the engine owns it. */
int engine_gram_vocab(engine *e, const gram_vocab **out);
void engine_get_stats(engine *e, engine_stats *out);
const model *engine_model(const engine *e);
kv_pool *engine_kv_pool(engine *e);
uint32_t engine_n_ctx(const engine *e);

#endif
