/* sched: continuous batching over the forward pass (see sched.h). */
#include "engine/sched.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_list.h"
#include "base/dx_log.h"
#include "base/dx_utf8.h"
#include "engine/fwd.h"
#include "engine/sampler.h"
#include "engine/stop_match.h"

/* Tokens every running sequence must be able to add before another is
 * admitted (see admit). */
#define SCHED_CHECKPOINT 64

typedef struct seq {
    uint64_t id;
    dx_list wait; /* s->waiting, while it waits */
    engine_request req;
    stop_match *stop; /* the request's stop strings, or NULL */
    int32_t *tokens;  /* prompt, then generated */
    uint32_t n_tokens, n_prompt, cap_tokens;
    uint32_t max_total;  /* prompt + max_tokens, capped by n_ctx */
    uint32_t n_computed; /* tokens whose KV is in blocks */
    uint32_t n_cached;   /* prompt tokens taken from the prefix cache */
    int32_t *blocks;
    uint32_t n_blocks, cap_blocks;
    uint32_t n_hashed;   /* leading blocks already hashed */
    int32_t *pre_blocks; /* handed in with the request (referenced) until admitted */
    uint32_t n_pre;
    kv_hash seed; /* its hash chains' (the request's cache_salt namespace) */
    kv_hash last_hash;
    dx_rng rng;
    sampler_params sp;
    /* Logit biases and penalties (engine_sampling); the penalty state is
     * allocated at submit, only for the penalties asked. */
    engine_bias *bias;
    uint32_t *counts; /* frequency/presence: occurrences in the reply, by id */
    int32_t *uniq;    /* ... the distinct reply tokens */
    uint32_t n_uniq;
    uint8_t *seen;     /* repetition: a bit per id in the prompt or the reply */
    int32_t *uniq_all; /* ... those ids */
    uint32_t n_uniq_all;
    /* The sampled token's logprobs, for its TOKENS event. */
    int has_lp;
    float lp;
    int32_t lp_ids[ENGINE_MAX_TOP_LOGPROBS];
    float lp_vals[ENGINE_MAX_TOP_LOGPROBS];
    uint32_t n_lp;
    dx_buf text;    /* generated text */
    size_t emitted; /* bytes of text delivered */
    uint64_t t_submit, t_first;
    int canceled;
    uint64_t order;     /* arrival order: the newest running sequence is preempted first */
    uint32_t n_preempt; /* times this sequence was preempted */
    /* Constrained decoding: the request's position in its grammar, and the
     * mask of the tokens allowed next (valid while mask_ok: computed for
     * the tokens so far, by the mask thread during the step or here). */
    gram_match *gm;
    uint64_t *mask; /* [mask_words] */
    int mask_ok;
    int n_allowed;  /* gram_match_mask's result for mask */
    char gerr[200]; /* why the grammar ended it (ERROR), for the DONE event */
} seq;

/* The mask thread: while the forward step runs, it computes the masks of
 * the step's constrained sequences (a mask depends only on the tokens so
 * far, never on the logits), so sampling finds them ready.  The engine
 * thread hands it the list and waits for it after the step; between the
 * two it touches none of those matchers, and the mutex orders both ways. */
typedef struct {
    pthread_t th;
    int started, stop, busy;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    seq **jobs; /* [max_seqs] */
    uint32_t n_jobs;
} sched_masker;

struct sched {
    sched_config cfg;
    const model *m;
    const tok *tk;
    kv_pool *pool;
    fwd *fw;
    sampler *smp;
    uint32_t bs, n_vocab;
    seq **running;
    uint32_t n_running;
    dx_list waiting; /* oldest first; a preempted sequence goes back to the front */
    uint32_t n_waiting;
    uint64_t next_order;
    fwd_seq *batch;
    seq **batch_seq;
    float *logits;
    dx_buf scratch; /* sanitised text of one event */
    float *raw;     /* a logits row before biases and penalties (logprobs) */
    engine_stats st;
    const gram_vocab *gv; /* for requests with a grammar (sched_set_gram_vocab) */
    uint32_t mask_words;
    sched_masker mk;
};

/* ---- events ---- */

/* The KV event: the sequence's tokens and its hashed full blocks, still
 * referenced by the sequence while the callback runs. */
static void emit_kv(sched *s, seq *q)
{
    engine_event ev = {.type = ENGINE_EV_KV,
                       .req_id = q->id,
                       .tokens = q->tokens,
                       .n_tokens = q->n_tokens,
                       .kv_blocks = q->blocks,
                       .n_kv_blocks = q->n_hashed};
    (void)s;
    q->req.on_event(q->req.user, &ev);
}

static void emit_done(sched *s, seq *q, enum engine_finish fin, int err, const char *msg)
{
    /* the grammar is borrowed until DONE: its matcher goes first */
    gram_match_destroy(q->gm);
    q->gm = NULL;
    engine_event ev = {.type = ENGINE_EV_DONE,
                       .req_id = q->id,
                       .finish = fin,
                       .error = err,
                       .error_msg = msg,
                       .n_prompt = q->n_prompt,
                       .n_cached = q->n_cached,
                       .n_gen = q->n_tokens - q->n_prompt,
                       .n_preempted = q->n_preempt,
                       .stop_index = fin == ENGINE_FINISH_STOP && q->stop ? stop_match_which(q->stop)
                                                                          : -1,
                       .ttft_s = q->t_first ? (double)(q->t_first - q->t_submit) * 1e-9 : 0};
    (void)s;
    q->req.on_event(q->req.user, &ev);
}

/* Delivers new tokens and the text up to `upto` (sanitised into the
 * scheduler's scratch buffer, which keeps its memory: no allocation per
 * token once it has grown). */
static void emit_tokens(sched *s, seq *q, const int32_t *toks, size_t n, size_t upto)
{
    dx_buf *clean = &s->scratch;
    dx_buf_reset(clean);
    if (upto > q->emitted)
        dx_utf8_sanitize((const uint8_t *)q->text.data + q->emitted, upto - q->emitted, clean);
    if (!n && !clean->len) return;
    engine_event ev = {.type = ENGINE_EV_TOKENS,
                       .req_id = q->id,
                       .tokens = toks,
                       .n_tokens = n,
                       .text = clean->data ? clean->data : "",
                       .text_len = clean->len};
    if (n && q->has_lp) {
        ev.has_logprob = 1;
        ev.logprob = q->lp;
        ev.top_ids = q->lp_ids;
        ev.top_logprobs = q->lp_vals;
        ev.n_top = q->n_lp;
        q->has_lp = 0;
    }
    q->req.on_event(q->req.user, &ev);
    if (upto > q->emitted) q->emitted = upto;
}

/* ---- sequences ---- */

/* Tokens whose logits the penalties touch, and their counts. */
static void note_token(sched *s, seq *q, int32_t t, int in_reply)
{
    (void)s;
    if (q->seen && !(q->seen[t >> 3] & (1u << (t & 7)))) {
        q->seen[t >> 3] |= (uint8_t)(1u << (t & 7));
        q->uniq_all[q->n_uniq_all++] = t;
    }
    if (in_reply && q->counts && q->counts[t]++ == 0) q->uniq[q->n_uniq++] = t;
}

/* The bias list and the penalties' state (for the penalties asked only):
 * 0 or DX_ENOMEM. */
static int penalty_state(sched *s, seq *q, const engine_request *r)
{
    const engine_sampling *sp = &r->sampling;
    size_t cap = q->cap_tokens < s->n_vocab ? q->cap_tokens : s->n_vocab;
    if (sp->n_bias && !(q->bias = dx_memdup(sp->bias, sp->n_bias * sizeof *sp->bias)))
        return dx_errf(DX_ENOMEM, "out of memory for %zu logit biases", sp->n_bias);
    if (sp->presence_penalty != 0 || sp->frequency_penalty != 0) {
        q->counts = dx_calloc(s->n_vocab, sizeof *q->counts);
        q->uniq = dx_malloc(cap * sizeof *q->uniq);
        if (!q->counts || !q->uniq)
            return dx_errf(DX_ENOMEM, "out of memory for the presence/frequency penalties");
    }
    if (sp->repetition_penalty > 0 && sp->repetition_penalty != 1) {
        q->seen = dx_calloc((s->n_vocab + 7) / 8, 1);
        q->uniq_all = dx_malloc(cap * sizeof *q->uniq_all);
        if (!q->seen || !q->uniq_all)
            return dx_errf(DX_ENOMEM, "out of memory for the repetition penalty");
    }
    for (uint32_t i = 0; i < q->n_prompt; i++) note_token(s, q, q->tokens[i], 0);
    return 0;
}

/* Biases and penalties on the sequence's logits row, in engine.h's order. */
static int shape_logits(const seq *q, float *row)
{
    const engine_sampling *sp = &q->req.sampling;
    for (size_t i = 0; i < sp->n_bias; i++) row[q->bias[i].id] += q->bias[i].bias;
    for (uint32_t i = 0; i < q->n_uniq_all; i++) {
        float *l = &row[q->uniq_all[i]];
        *l = *l > 0 ? *l / sp->repetition_penalty : *l * sp->repetition_penalty;
    }
    for (uint32_t i = 0; i < q->n_uniq; i++) {
        int32_t t = q->uniq[i];
        row[t] -= sp->presence_penalty + sp->frequency_penalty * (float)q->counts[t];
    }
    return sp->n_bias || q->n_uniq_all || q->n_uniq;
}

/* log-softmax of the raw row: the sampled token's and the top n's. */
static void take_logprobs(seq *q, const float *row, uint32_t n_vocab, int32_t t)
{
    float mx = row[0];
    for (uint32_t i = 1; i < n_vocab; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (uint32_t i = 0; i < n_vocab; i++) sum += exp((double)row[i] - mx);
    double lse = mx + log(sum);
    uint32_t k = q->req.top_logprobs, n = 0;
    for (uint32_t i = 0; i < n_vocab && k; i++) { /* a sorted top k: larger logit, then lower id */
        if (n == k && row[i] <= row[q->lp_ids[n - 1]]) continue;
        uint32_t j = n < k ? n++ : n - 1;
        while (j > 0 && row[i] > row[q->lp_ids[j - 1]]) {
            q->lp_ids[j] = q->lp_ids[j - 1];
            j--;
        }
        q->lp_ids[j] = (int32_t)i;
    }
    for (uint32_t i = 0; i < n; i++) q->lp_vals[i] = (float)(row[q->lp_ids[i]] - lse);
    q->n_lp = n;
    q->lp = (float)(row[t] - lse);
    q->has_lp = 1;
}

/* ---- constrained decoding ---- */

/* q's mask for its tokens so far (timed: the figure /metrics reports). */
static void mask_compute(sched *s, seq *q, uint64_t *ns)
{
    uint64_t t0 = dx_now_ns();
    q->n_allowed = gram_match_mask(q->gm, q->mask);
    if (q->n_allowed < 0)
        snprintf(q->gerr, sizeof q->gerr, "grammar: %s", dx_errmsg());
    else if (q->n_allowed == 0)
        snprintf(q->gerr, sizeof q->gerr, "grammar: no token of the vocabulary can continue");
    q->mask_ok = 1;
    *ns += dx_now_ns() - t0;
}

static void *masker_main(void *arg)
{
    sched *s = arg;
    sched_masker *k = &s->mk;
    pthread_mutex_lock(&k->mu);
    for (;;) {
        while (!k->busy && !k->stop) pthread_cond_wait(&k->go, &k->mu);
        if (k->stop) break;
        uint32_t n = k->n_jobs;
        pthread_mutex_unlock(&k->mu);
        uint64_t ns = 0;
        for (uint32_t i = 0; i < n; i++) mask_compute(s, k->jobs[i], &ns);
        pthread_mutex_lock(&k->mu);
        s->st.gram_masks += n;
        s->st.gram_mask_ns += ns;
        k->busy = 0;
        pthread_cond_signal(&k->done);
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

/* Before the forward step: hands the masks the step's samples will need to
 * the mask thread (started on the first constrained request; if it cannot
 * start, sampling computes them inline). */
static void masks_start(sched *s, size_t n)
{
    sched_masker *k = &s->mk;
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        seq *q = s->batch_seq[i];
        if (s->batch[i].logits && q->gm && !q->mask_ok) k->jobs[m++] = q;
    }
    if (!m) return;
    if (!k->started) {
        pthread_mutex_init(&k->mu, NULL);
        pthread_cond_init(&k->go, NULL);
        pthread_cond_init(&k->done, NULL);
        if (pthread_create(&k->th, NULL, masker_main, s)) {
            pthread_mutex_destroy(&k->mu);
            pthread_cond_destroy(&k->go);
            pthread_cond_destroy(&k->done);
            return;
        }
        k->started = 1;
    }
    pthread_mutex_lock(&k->mu);
    k->n_jobs = m;
    k->busy = 1;
    pthread_cond_signal(&k->go);
    pthread_mutex_unlock(&k->mu);
}

/* After the forward step: the masks are ready. */
static void masks_wait(sched *s)
{
    sched_masker *k = &s->mk;
    if (!k->started) return;
    uint64_t t0 = dx_now_ns();
    pthread_mutex_lock(&k->mu);
    int waited = k->busy;
    while (k->busy) pthread_cond_wait(&k->done, &k->mu);
    pthread_mutex_unlock(&k->mu);
    if (waited) s->st.gram_wait_ns += dx_now_ns() - t0;
}

static void masker_stop(sched *s)
{
    sched_masker *k = &s->mk;
    if (!k->started) return;
    pthread_mutex_lock(&k->mu);
    k->stop = 1;
    pthread_cond_signal(&k->go);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->th, NULL);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->go);
    pthread_cond_destroy(&k->done);
    k->started = 0;
}

/* Tokens the grammar does not allow next can never be sampled: -inf is
 * what both greedy (argmax) and random sampling (finite logits only) skip. */
static void apply_mask(const uint64_t *mask, float *row, uint32_t n)
{
    for (uint32_t w = 0; (size_t)w * 64 < n; w++) {
        uint64_t m = mask[w];
        if (m == ~(uint64_t)0) continue;
        uint32_t base = w * 64, end = base + 64 < n ? base + 64 : n;
        for (uint32_t i = base; i < end; i++)
            if (!((m >> (i - base)) & 1)) row[i] = -INFINITY;
    }
}

/* Picks the sequence's next token from its logits row; DX_NONE when its
 * grammar allows none (q->gerr says why). */
static int32_t sample_row(sched *s, seq *q, float *row)
{
    int lp = q->req.logprobs;
    int shaped = q->bias || q->counts || q->seen;
    if (lp && (shaped || q->gm)) memcpy(s->raw, row, (size_t)s->n_vocab * sizeof *row);
    if (shaped) shape_logits(q, row);
    if (q->gm) {
        if (!q->mask_ok) {
            uint64_t ns = 0;
            mask_compute(s, q, &ns);
            s->st.gram_masks++;
            s->st.gram_mask_ns += ns;
        }
        q->mask_ok = 0; /* the token about to be taken moves the matcher on */
        if (q->n_allowed <= 0) return DX_NONE;
        apply_mask(q->mask, row, s->n_vocab);
    }
    int32_t t = sampler_sample(s->smp, row, &q->sp, &q->rng);
    if (lp) take_logprobs(q, shaped || q->gm ? s->raw : row, s->n_vocab, t);
    return t;
}

static void seq_free(seq *q)
{
    if (!q) return;
    DX_ASSERT(q->n_pre == 0); /* handed blocks are released before (drop_pre_blocks) */
    dx_free(q->pre_blocks);
    stop_match_destroy(q->stop);
    gram_match_destroy(q->gm);
    dx_free(q->mask);
    dx_free(q->tokens);
    dx_free(q->blocks);
    dx_free(q->bias);
    dx_free(q->counts);
    dx_free(q->uniq);
    dx_free(q->seen);
    dx_free(q->uniq_all);
    dx_buf_free(&q->text);
    dx_free(q);
}

static void release_blocks(sched *s, seq *q)
{
    for (uint32_t i = 0; i < q->n_blocks; i++) kv_pool_unref(s->pool, q->blocks[i]);
    q->n_blocks = 0;
    q->n_computed = 0;
    q->n_hashed = 0;
    q->last_hash = q->seed;
}

/* Releases blocks handed in with a request that was never admitted. */
static void drop_pre_blocks(sched *s, seq *q)
{
    for (uint32_t i = 0; i < q->n_pre; i++) kv_pool_unref(s->pool, q->pre_blocks[i]);
    q->n_pre = 0;
}

static int check_prefix_blocks(const sched *s, const engine_request *r)
{
    if (!r->n_prefix_blocks) return 0;
    if (!r->prefix_blocks) return dx_errf(DX_EINVAL, "prefix_blocks is NULL");
    /* the last token is computed for its logits: the prompt's last one, or
     * with pregen tokens the last of those */
    size_t max_pre = (r->n_pregen ? r->n_prompt : r->n_prompt - 1) / s->bs;
    if (r->n_prefix_blocks > max_pre)
        return dx_errf(DX_EINVAL,
                       "%zu prefix blocks cover %zu tokens, but at most %zu of the %zu-token "
                       "prompt may come precomputed (the last token is always computed)",
                       r->n_prefix_blocks, r->n_prefix_blocks * s->bs, max_pre * s->bs,
                       r->n_prompt);
    for (size_t i = 0; i < r->n_prefix_blocks; i++) {
        kv_hash h;
        if (!kv_pool_valid_id(s->pool, r->prefix_blocks[i]) ||
            kv_pool_refcount(s->pool, r->prefix_blocks[i]) == 0 ||
            !kv_pool_block_hash(s->pool, r->prefix_blocks[i], &h))
            return dx_errf(DX_EINVAL, "prefix block %zu (id %d) is not a held, hashed block", i,
                           r->prefix_blocks[i]);
    }
    return 0;
}

int sched_check(const sched *s, const engine_request *r)
{
    if (!r->n_prompt) return dx_errf(DX_EINVAL, "the prompt is empty");
    if (!r->on_event) return dx_errf(DX_EINVAL, "no event callback");
    uint64_t want = (uint64_t)r->n_prompt + (r->max_tokens ? r->max_tokens : 1);
    if (want > s->cfg.n_ctx)
        return dx_errf(DX_EINVAL,
                       "prompt (%zu tokens) + max_tokens (%u) exceeds the context length of %u",
                       r->n_prompt, r->max_tokens, s->cfg.n_ctx);
    uint32_t need = (uint32_t)((want + s->bs - 1) / s->bs);
    if (need > kv_pool_n_blocks(s->pool))
        return dx_errf(DX_EINVAL, "request needs %u KV blocks but the pool has only %u", need,
                       kv_pool_n_blocks(s->pool));
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || (uint32_t)r->prompt[i] >= s->n_vocab)
            return dx_errf(DX_EINVAL, "prompt token %zu (%d) is outside the vocabulary of %u", i,
                           r->prompt[i], s->n_vocab);
    for (size_t i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0]) return dx_errf(DX_EINVAL, "stop[%zu] is empty", i);
    const engine_sampling *sp = &r->sampling;
    if (!(sp->repetition_penalty >= 0) || !isfinite(sp->repetition_penalty) ||
        !isfinite(sp->presence_penalty) || !isfinite(sp->frequency_penalty))
        return dx_errf(DX_EINVAL,
                       "penalties out of range (repetition %g, presence %g, frequency %g)",
                       sp->repetition_penalty, sp->presence_penalty, sp->frequency_penalty);
    if (sp->n_bias && !sp->bias) return dx_errf(DX_EINVAL, "logit bias is NULL");
    for (size_t i = 0; i < sp->n_bias; i++)
        if (sp->bias[i].id < 0 || (uint32_t)sp->bias[i].id >= s->n_vocab ||
            !isfinite(sp->bias[i].bias))
            return dx_errf(DX_EINVAL,
                           "logit bias %zu: token %d outside the vocabulary of %u or not finite", i,
                           sp->bias[i].id, s->n_vocab);
    if (r->top_logprobs > ENGINE_MAX_TOP_LOGPROBS)
        return dx_errf(DX_EINVAL, "top_logprobs %u: at most %d", r->top_logprobs,
                       ENGINE_MAX_TOP_LOGPROBS);
    if (r->logprobs && r->n_pregen)
        return dx_errf(DX_EINVAL, "logprobs cannot be reported for pregenerated tokens");
    if (r->n_pregen > ENGINE_MAX_PREGEN || (r->max_tokens && r->n_pregen > r->max_tokens))
        return dx_errf(DX_EINVAL, "%u pregenerated tokens: at most %u and at most max_tokens (%u)",
                       r->n_pregen, ENGINE_MAX_PREGEN, r->max_tokens);
    for (uint32_t i = 0; i < r->n_pregen; i++)
        if (r->pregen[i] < 0 || (uint32_t)r->pregen[i] >= s->n_vocab)
            return dx_errf(DX_EINVAL, "pregenerated token %u (%d) is outside the vocabulary of %u",
                           i, r->pregen[i], s->n_vocab);
    return check_prefix_blocks(s, r);
}

/* The request's matcher and mask buffer. */
static int grammar_state(sched *s, seq *q, const gram *g)
{
    if (!s->gv)
        return dx_errf(DX_EINVAL, "a request with a grammar needs the grammar vocabulary "
                                  "(sched_set_gram_vocab)");
    int rc = gram_match_create(g, s->gv, &q->gm);
    if (rc < 0) return rc;
    if (!(q->mask = dx_malloc((size_t)s->mask_words * sizeof *q->mask)))
        return dx_errf(DX_ENOMEM, "out of memory for a grammar mask");
    return 0;
}

void sched_set_gram_vocab(sched *s, const gram_vocab *v)
{
    DX_ASSERT(!s->gv || s->gv == v);
    s->gv = v;
}

int sched_submit(sched *s, const engine_request *r, uint64_t id)
{
    return sched_submit_at(s, r, id, dx_now_ns());
}

int sched_submit_at(sched *s, const engine_request *r, uint64_t id, uint64_t t_submit_ns)
{
    int rc = sched_check(s, r);
    if (rc) return rc;
    uint64_t want = (uint64_t)r->n_prompt + (r->max_tokens ? r->max_tokens : 1);
    if (s->n_running + s->n_waiting >= s->cfg.max_seqs + s->cfg.max_waiting)
        return dx_errf(DX_EBUSY, "the scheduler is at capacity (%u requests)",
                       s->cfg.max_seqs + s->cfg.max_waiting);
    seq *q = dx_calloc(1, sizeof *q);
    if (!q) return dx_errf(DX_ENOMEM, "out of memory");
    q->id = id;
    q->req = *r;
    q->n_prompt = (uint32_t)r->n_prompt;
    q->max_total = r->max_tokens ? (uint32_t)want : s->cfg.n_ctx;
    q->cap_tokens = q->max_total;
    q->cap_blocks = (q->cap_tokens + s->bs - 1) / s->bs;
    q->tokens = dx_malloc(q->cap_tokens * sizeof(int32_t));
    q->blocks = dx_malloc(q->cap_blocks * sizeof(int32_t));
    if (r->n_prefix_blocks)
        q->pre_blocks = dx_memdup(r->prefix_blocks, r->n_prefix_blocks * sizeof(int32_t));
    dx_buf_init(&q->text, 0);
    int oom = !q->tokens || !q->blocks || (r->n_prefix_blocks && !q->pre_blocks) ||
              (r->n_stop && stop_match_create(r->stop, r->n_stop, &q->stop) < 0);
    if (oom) {
        seq_free(q);
        return dx_errf(DX_ENOMEM, "out of memory");
    }
    memcpy(q->tokens, r->prompt, r->n_prompt * sizeof(int32_t));
    q->n_tokens = q->n_prompt;
    if ((rc = penalty_state(s, q, r))) { /* the handed blocks are still the caller's */
        seq_free(q);
        return rc;
    }
    if (r->grammar && (rc = grammar_state(s, q, r->grammar)) < 0) {
        seq_free(q);
        return rc;
    }
    q->n_pre = (uint32_t)r->n_prefix_blocks; /* the references are ours from here on */
    q->req.prompt = NULL;
    q->req.stop = NULL;
    q->req.prefix_blocks = NULL;
    q->req.sampling.bias = q->bias;
    q->sp = (sampler_params){r->sampling.temperature, r->sampling.top_k, r->sampling.top_p,
                             r->sampling.min_p};
    dx_rng_seed(&q->rng, r->sampling.has_seed ? r->sampling.seed : dx_now_ns() ^ id);
    q->seed = kv_pool_seed_salted(s->pool, r->cache_salt);
    q->last_hash = q->seed;
    q->t_submit = t_submit_ns;
    q->order = s->next_order++;
    dx_list_push_back(&s->waiting, &q->wait);
    s->n_waiting++;
    return 0;
}

int sched_cancel(sched *s, uint64_t id)
{
    for (uint32_t i = 0; i < s->n_running; i++)
        if (s->running[i]->id == id) return s->running[i]->canceled = 1, 0;
    DX_LIST_FOR_EACH(it, &s->waiting)
    {
        seq *q = DX_LIST_ENTRY(it, seq, wait);
        if (q->id == id) return q->canceled = 1, 0;
    }
    return dx_errf(DX_ENOENT, "no request %llu", (unsigned long long)id);
}

static void remove_running(sched *s, uint32_t i)
{
    memmove(&s->running[i], &s->running[i + 1], (s->n_running - i - 1) * sizeof(seq *));
    s->n_running--;
}

static void finish(sched *s, uint32_t i, enum engine_finish fin, int err, const char *msg)
{
    seq *q = s->running[i];
    int normal = fin != ENGINE_FINISH_CANCELED && fin != ENGINE_FINISH_ERROR;
    if (normal) emit_tokens(s, q, NULL, 0, q->text.len);
    if (normal && q->req.want_kv) emit_kv(s, q);
    release_blocks(s, q);
    remove_running(s, i);
    emit_done(s, q, fin, err, msg);
    seq_free(q);
}

/* The oldest / newest waiting sequence, or NULL. */
static seq *first_waiting(const sched *s)
{
    dx_list *n = dx_list_first(&s->waiting);
    return n ? DX_LIST_ENTRY(n, seq, wait) : NULL;
}

static seq *last_waiting(const sched *s)
{
    dx_list *n = dx_list_last(&s->waiting);
    return n ? DX_LIST_ENTRY(n, seq, wait) : NULL;
}

static void unlink_waiting(sched *s, seq *q)
{
    dx_list_remove(&q->wait);
    s->n_waiting--;
}

static void push_waiting_front(sched *s, seq *q)
{
    dx_list_push_front(&s->waiting, &q->wait);
    s->n_waiting++;
}

static void handle_cancels(sched *s)
{
    for (uint32_t i = s->n_running; i-- > 0;)
        if (s->running[i]->canceled) finish(s, i, ENGINE_FINISH_CANCELED, 0, NULL);
    DX_LIST_FOR_EACH_SAFE(it, tmp, &s->waiting)
    {
        seq *q = DX_LIST_ENTRY(it, seq, wait);
        if (!q->canceled) continue;
        unlink_waiting(s, q);
        drop_pre_blocks(s, q);
        emit_done(s, q, ENGINE_FINISH_CANCELED, 0, NULL);
        seq_free(q);
    }
}

static void match_cached_prefix(sched *s, seq *q);

/* Blocks handed in with the request become the sequence's first blocks. */
static void take_pre_blocks(sched *s, seq *q)
{
    memcpy(q->blocks, q->pre_blocks, q->n_pre * sizeof(int32_t));
    q->n_blocks = q->n_hashed = q->n_pre;
    q->n_computed = q->n_pre * s->bs;
    int hashed = kv_pool_block_hash(s->pool, q->blocks[q->n_pre - 1], &q->last_hash);
    DX_ASSERT(hashed); /* sched_check saw it hashed, and a held block keeps its hash */
    q->n_pre = 0;
}

/* Takes the longest cached prefix of everything but the last token (the
 * last token must be computed to get logits): the blocks handed in with the
 * request, else (prefix caching on) the prefix cache's. */
static void take_cached_prefix(sched *s, seq *q)
{
    if (q->n_pre) {
        take_pre_blocks(s, q);
    } else if (!s->cfg.no_prefix_cache) {
        match_cached_prefix(s, q);
    }
    uint32_t cached = q->n_computed < q->n_prompt ? q->n_computed : q->n_prompt;
    if (cached > q->n_cached) {
        s->st.prompt_tokens_cached += cached - q->n_cached;
        q->n_cached = cached;
    }
}

static void match_cached_prefix(sched *s, seq *q)
{
    /* the last token is computed: the last given one when there are some */
    uint32_t n_full = (q->req.n_pregen ? q->n_tokens : q->n_tokens - 1) / s->bs;
    kv_hash *chain = dx_malloc((n_full ? n_full : 1) * sizeof *chain);
    if (!chain) return; /* no reuse; correct, just slower */
    kv_pool_hash_chain_from(s->pool, q->seed, q->tokens, (size_t)n_full * s->bs, chain);
    size_t got = kv_pool_match_prefix(s->pool, chain, n_full, q->blocks);
    q->n_blocks = q->n_hashed = (uint32_t)got;
    q->n_computed = (uint32_t)got * s->bs;
    if (got) q->last_hash = chain[got - 1];
    dx_free(chain);
}

/* Asks the owner of references held outside the engine (retained leases)
 * to drop some; 1 if it did. */
static int reclaim(sched *s)
{
    if (!s->cfg.reclaim || !s->cfg.reclaim(s->cfg.reclaim_user)) return 0;
    s->st.reclaims++;
    return 1;
}

/* Room for `need` more blocks, reclaiming retained KV if that makes room. */
static int pool_has_room(sched *s, uint32_t need)
{
    for (;;) {
        kv_pool_stats ps;
        kv_pool_get_stats(s->pool, &ps);
        if (ps.n_free + ps.n_cached >= need) return 1;
        if (!reclaim(s)) return 0;
    }
}

/* Blocks q needs to hold all its tokens and SCHED_CHECKPOINT more (at most
 * up to its end), beyond what it holds now. */
static uint32_t growth(const sched *s, const seq *q)
{
    uint32_t upto = q->n_tokens + SCHED_CHECKPOINT;
    if (upto > q->max_total) upto = q->max_total;
    uint32_t need = (upto + s->bs - 1) / s->bs;
    uint32_t held = q->n_blocks + q->n_pre;
    return need > held ? need - held : 0;
}

static enum engine_finish accept_token(sched *s, seq *q, int32_t t);
static void finish(sched *s, uint32_t i, enum engine_finish fin, int err, const char *msg);

/* Ends running[idx] as accept_token said (ERROR: its text could not be kept). */
static void finish_token(sched *s, uint32_t idx, enum engine_finish fin)
{
    const seq *q = s->running[idx];
    if (fin == ENGINE_FINISH_ERROR && q->gerr[0])
        finish(s, idx, fin, DX_EINVAL, q->gerr);
    else if (fin == ENGINE_FINISH_ERROR)
        finish(s, idx, fin, DX_ENOMEM, "out of memory keeping the answer's text");
    else
        finish(s, idx, fin, 0, NULL);
}

/* The tokens another engine generated for this prompt, taken as if sampled
 * here (once: a preempted sequence keeps them as generated tokens).  The
 * sampler draws one uniform per token when it samples at random and none
 * when greedy; drawing the same here keeps the tokens after them equal. */
static void accept_pregen(sched *s, seq *q)
{
    uint32_t n = q->req.n_pregen;
    q->req.n_pregen = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (q->sp.temperature > 0.0f) (void)dx_rng_uniform(&q->rng);
        enum engine_finish fin = accept_token(s, q, q->req.pregen[i]);
        if (fin != ENGINE_FINISH_NONE) {
            finish_token(s, s->n_running - 1, fin);
            return;
        }
    }
}

/* A sequence is admitted only when it and every running sequence can reach
 * their next checkpoint without a preemption: otherwise the newest would be
 * preempted at once, requeued, admitted again — thrash that recomputes the
 * same tokens over and over.  Nothing running: it is admitted anyway. */
static void admit(sched *s)
{
    for (seq *q; (q = first_waiting(s)) && s->n_running < s->cfg.max_seqs;) {
        uint32_t need = growth(s, q);
        for (uint32_t i = 0; i < s->n_running; i++) need += growth(s, s->running[i]);
        if (s->n_running && !pool_has_room(s, need)) break;
        unlink_waiting(s, q);
        take_cached_prefix(s, q);
        s->running[s->n_running++] = q;
        if (q->req.n_pregen) accept_pregen(s, q);
    }
}

/* Past --max-waiting, requests that never ran are turned away (newest
 * first): a client gets 503 now rather than a timeout later. */
static void shed_waiting(sched *s)
{
    for (seq *q; s->n_waiting > s->cfg.max_waiting && (q = last_waiting(s)) && !q->n_preempt;) {
        unlink_waiting(s, q);
        s->st.shed++;
        drop_pre_blocks(s, q);
        char msg[160];
        snprintf(msg, sizeof msg, "server busy: %u requests are waiting (the limit is %u)",
                 s->n_waiting + 1, s->cfg.max_waiting);
        emit_done(s, q, ENGINE_FINISH_ERROR, DX_EBUSY, msg);
        seq_free(q);
    }
}

/* Frees the newest running sequence's blocks and requeues it. */
static void preempt(sched *s, uint32_t i)
{
    seq *q = s->running[i];
    DX_LOGD("preempting request %llu (%u tokens computed)", (unsigned long long)q->id,
            q->n_computed);
    q->n_preempt++;
    release_blocks(s, q);
    remove_running(s, i);
    push_waiting_front(s, q);
    s->st.preemptions++;
}

static uint32_t newest_running(const sched *s)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < s->n_running; i++)
        if (s->running[i]->order > s->running[best]->order) best = i;
    return best;
}

/* The newest waiting request holding handed-in prefix blocks lets them go;
 * 0 when none holds any. */
static int drop_newest_waiting_prefix(sched *s)
{
    seq *newest = NULL;
    DX_LIST_FOR_EACH(it, &s->waiting)
    {
        seq *w = DX_LIST_ENTRY(it, seq, wait);
        if (w->n_pre) newest = w;
    }
    if (!newest) return 0;
    drop_pre_blocks(s, newest);
    return 1;
}

/* Makes q's block table cover `upto` tokens, preempting newer sequences when
 * the pool is dry.  Returns 0, 1 if q itself had to be preempted, 2 if q runs
 * alone and the pool still has no room (blocks pinned outside the scheduler). */
static int ensure_blocks(sched *s, seq *q, uint32_t upto)
{
    uint32_t need = (upto + s->bs - 1) / s->bs;
    while (q->n_blocks < need) {
        int32_t id;
        if (kv_pool_alloc(s->pool, &id) == 0) {
            q->blocks[q->n_blocks++] = id;
            continue;
        }
        if (reclaim(s)) continue; /* retained KV gives way before anything running */
        if (s->n_running == 1) {
            /* alone: what else holds blocks is waiting requests' handed-in
             * prefixes (they give way, and compute those tokens when
             * admitted) and pins of reads in flight */
            if (drop_newest_waiting_prefix(s)) continue;
            return 2;
        }
        uint32_t v = newest_running(s);
        int self = s->running[v] == q;
        preempt(s, v);
        if (self) return 1;
    }
    return 0;
}

/* Registers newly completed full blocks in the prefix cache.  A block
 * whose tokens another sequence computed first is swapped for that one (the
 * same KV), so every full block of a sequence is findable and leasable. */
static void hash_new_blocks(sched *s, seq *q)
{
    uint32_t full = q->n_computed / s->bs;
    for (; q->n_hashed < full; q->n_hashed++) {
        uint32_t b = q->n_hashed;
        q->last_hash = kv_hash_next(q->last_hash, q->tokens + (size_t)b * s->bs, s->bs);
        kv_pool_publish(s->pool, &q->blocks[b], q->last_hash);
    }
}

/* Appends the sampled token; returns the finish reason or NONE. */
static enum engine_finish accept_token(sched *s, seq *q, int32_t t)
{
    q->tokens[q->n_tokens++] = t;
    note_token(s, q, t, 1);
    if (!q->t_first) q->t_first = dx_now_ns();
    s->st.gen_tokens++;
    /* with a grammar, end-of-generation was allowed only on a complete
     * output: it ends the request even with ignore_eos */
    int is_end = (!q->req.ignore_eos || q->gm) && tok_is_eog(s->tk, t);
    if (q->gm && !is_end && gram_match_accept(q->gm, t) < 0) {
        snprintf(q->gerr, sizeof q->gerr, "grammar: token %d: %s", t, dx_errmsg());
        return ENGINE_FINISH_ERROR;
    }
    size_t before = q->text.len, hold = 0;
    if (!is_end && tok_is_text(s->tk, t)) {
        char piece[256];
        int n = tok_token_bytes(s->tk, t, piece, sizeof piece);
        /* text that cannot be kept would make a wrong answer: end it */
        if (n > 0 && dx_buf_append(&q->text, piece, (size_t)n) < 0) return ENGINE_FINISH_ERROR;
    }
    /* only the new bytes are searched: the work is bounded by the text */
    const char *added = q->text.len > before ? q->text.data + before : "";
    long stop_at =
        q->stop ? stop_match_feed(q->stop, added, q->text.len - before, before, &hold) : DX_NONE;
    if (stop_at >= 0) {
        emit_tokens(s, q, &q->tokens[q->n_tokens - 1], 1, (size_t)stop_at);
        q->text.len = (size_t)stop_at;
        return ENGINE_FINISH_STOP;
    }
    if (is_end) {
        emit_tokens(s, q, &q->tokens[q->n_tokens - 1], 1, q->text.len);
        return ENGINE_FINISH_STOP;
    }
    size_t tail = dx_utf8_incomplete_tail((const uint8_t *)q->text.data, q->text.len);
    if (tail > hold) hold = tail;
    emit_tokens(s, q, &q->tokens[q->n_tokens - 1], 1, q->text.len - hold);
    if (q->gm && gram_match_done(q->gm)) return ENGINE_FINISH_STOP; /* nothing more may follow */
    if (q->n_tokens >= q->max_total) return ENGINE_FINISH_LENGTH;
    return ENGINE_FINISH_NONE;
}

/* Builds the step: decodes first (one token each), then prefill chunks. */
static size_t build_batch(sched *s)
{
    size_t n = 0;
    uint32_t budget = s->cfg.max_batch_tokens;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < s->n_running && budget; i++) {
            seq *q = s->running[i];
            uint32_t pending = q->n_tokens - q->n_computed;
            if ((pass == 0) != (pending == 1)) continue;
            uint32_t take = pending < budget ? pending : budget;
            int rc = ensure_blocks(s, q, q->n_computed + take);
            if (rc == 2) {
                finish(s, i, ENGINE_FINISH_ERROR, DX_EFULL, "KV pool exhausted");
                rc = 1;
            }
            if (rc) {
                i = (uint32_t)-1; /* the running set changed: rebuild from scratch */
                n = 0;
                budget = s->cfg.max_batch_tokens;
                pass = 0;
                continue;
            }
            s->batch[n] = (fwd_seq){q->blocks, q->n_computed, take, q->tokens + q->n_computed,
                                    q->n_computed + take == q->n_tokens};
            s->batch_seq[n++] = q;
            budget -= take;
        }
    }
    return n;
}

static uint32_t running_index(const sched *s, const seq *q)
{
    for (uint32_t i = 0; i < s->n_running; i++)
        if (s->running[i] == q) return i;
    DX_ASSERT(0);
    return 0;
}

int sched_step(sched *s)
{
    handle_cancels(s);
    admit(s);
    shed_waiting(s);
    size_t n = build_batch(s);
    if (!n) return sched_busy(s);
    masks_start(s, n);
    int rc = fwd_step(s->fw, s->batch, n, s->logits);
    masks_wait(s);
    if (rc) {
        DX_LOGE("forward step failed: %s", dx_errmsg());
        for (size_t i = 0; i < n; i++)
            finish(s, running_index(s, s->batch_seq[i]), ENGINE_FINISH_ERROR, rc, dx_errmsg());
        return rc;
    }
    size_t row = 0;
    for (size_t i = 0; i < n; i++) {
        seq *q = s->batch_seq[i];
        uint32_t before = q->n_computed;
        q->n_computed += s->batch[i].n_tokens;
        if (before < q->n_prompt)
            s->st.prompt_tokens_computed +=
                (q->n_computed < q->n_prompt ? q->n_computed : q->n_prompt) - before;
        hash_new_blocks(s, q);
        if (!s->batch[i].logits) continue;
        int32_t t = sample_row(s, q, s->logits + row++ * s->n_vocab);
        enum engine_finish fin = t < 0 ? ENGINE_FINISH_ERROR : accept_token(s, q, t);
        if (fin != ENGINE_FINISH_NONE) finish_token(s, running_index(s, q), fin);
    }
    return sched_busy(s);
}

int sched_busy(const sched *s)
{
    return (int)(s->n_running + s->n_waiting);
}

void sched_get_stats(const sched *s, engine_stats *out)
{
    *out = s->st;
    out->running = s->n_running;
    out->waiting = s->n_waiting;
    kv_pool_get_stats(s->pool, &out->kv);
}

uint32_t sched_n_ctx(const sched *s)
{
    return s->cfg.n_ctx;
}

int sched_create(const sched_config *cfg, const model *m, kv_pool *pool, dx_tpool *tp, sched **out)
{
    *out = NULL;
    sched *s = dx_calloc(1, sizeof *s);
    if (!s) return dx_errf(DX_ENOMEM, "out of memory");
    dx_list_init(&s->waiting);
    s->cfg = *cfg;
    s->m = m;
    s->tk = model_tokenizer(m);
    s->pool = pool;
    s->bs = kv_pool_block_size(pool);
    s->n_vocab = model_hp(m)->n_vocab;
    s->mask_words = (s->n_vocab + 63) / 64;
    dx_buf_init(&s->scratch, 0);
    int rc = fwd_create(m, pool, tp, cfg->max_batch_tokens, cfg->max_seqs, cfg->n_ctx, &s->fw);
    if (!rc) rc = sampler_create(s->n_vocab, &s->smp);
    if (!rc) {
        s->running = dx_calloc(cfg->max_seqs, sizeof *s->running);
        s->batch = dx_calloc(cfg->max_seqs, sizeof *s->batch);
        s->batch_seq = dx_calloc(cfg->max_seqs, sizeof *s->batch_seq);
        s->logits = dx_aligned_alloc(64, (size_t)cfg->max_seqs * s->n_vocab * sizeof(float));
        s->raw = dx_malloc((size_t)s->n_vocab * sizeof(float));
        s->mk.jobs = dx_calloc(cfg->max_seqs, sizeof *s->mk.jobs);
        if (!s->running || !s->batch || !s->batch_seq || !s->logits || !s->raw || !s->mk.jobs)
            rc = dx_errf(DX_ENOMEM, "out of memory for the scheduler");
    }
    if (rc) {
        sched_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void sched_destroy(sched *s)
{
    if (!s) return;
    while (s->n_running) finish(s, s->n_running - 1, ENGINE_FINISH_CANCELED, 0, NULL);
    for (seq *q; (q = first_waiting(s));) {
        unlink_waiting(s, q);
        drop_pre_blocks(s, q);
        emit_done(s, q, ENGINE_FINISH_CANCELED, 0, NULL);
        seq_free(q);
    }
    masker_stop(s);
    dx_free(s->mk.jobs);
    fwd_destroy(s->fw);
    sampler_destroy(s->smp);
    dx_free(s->running);
    dx_free(s->batch);
    dx_free(s->batch_seq);
    dx_aligned_free(s->logits);
    dx_free(s->raw);
    dx_buf_free(&s->scratch);
    dx_free(s);
}
