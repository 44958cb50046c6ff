/* Scheduler and engine: pinned greedy output, concurrency and preemption
 * never change a sequence's tokens, prefix-cache reuse, cancellation frees
 * every block, stop strings, seeded sampling, the threaded engine API. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "base/dx_tpool.h"
#include "engine/engine.h"
#include "engine/kern/kern.h"
#include "engine/sched.h"
#include "engine/sampler.h"
#include "engine_test_util.h"

/* Pinned greedy output of prompt 0 on the tiny qwen3 q4_0 model (seed 42). */
#define PINNED_Q4_0 293, 95, 185, 137, 475, 854, 653, 539, 201, 470, 411, 436

typedef struct {
    int32_t toks[512];
    size_t n;
    dx_buf text;
    int done;
    engine_event fin;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void *engine_for_cancel; /* cancel from inside the callback after n tokens */
    uint64_t id;
    size_t cancel_after;
    /* ENGINE_EV_KV: what it carried; with hold_pool set, the blocks are
     * referenced (kept past the request, as a lease would) */
    int kv_events, kv_before_done;
    int32_t kv_toks[512], kv_blocks[64];
    size_t kv_n_toks, kv_n_blocks;
    kv_pool *hold_pool;
    /* logprobs of each token, when asked */
    int n_lp;
    float lp[512];
    int32_t top_ids[512][ENGINE_MAX_TOP_LOGPROBS];
    float top_lp[512][ENGINE_MAX_TOP_LOGPROBS];
    uint32_t n_top[512];
} collector;

static void collect(void *user, const engine_event *ev)
{
    collector *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->type == ENGINE_EV_TOKENS) {
        for (size_t i = 0; i < ev->n_tokens && c->n < 512; i++) c->toks[c->n++] = ev->tokens[i];
        if (ev->has_logprob && c->n_lp < 512) {
            c->lp[c->n_lp] = ev->logprob;
            c->n_top[c->n_lp] = ev->n_top;
            memcpy(c->top_ids[c->n_lp], ev->top_ids, ev->n_top * sizeof(int32_t));
            memcpy(c->top_lp[c->n_lp], ev->top_logprobs, ev->n_top * sizeof(float));
            c->n_lp++;
        }
        dx_buf_append(&c->text, ev->text, ev->text_len);
        if (c->engine_for_cancel && c->n == c->cancel_after)
            engine_cancel(c->engine_for_cancel, c->id);
    } else if (ev->type == ENGINE_EV_KV) {
        c->kv_events++;
        c->kv_before_done = !c->done;
        c->kv_n_toks = ev->n_tokens < 512 ? ev->n_tokens : 512;
        memcpy(c->kv_toks, ev->tokens, c->kv_n_toks * sizeof(int32_t));
        c->kv_n_blocks = ev->n_kv_blocks < 64 ? ev->n_kv_blocks : 64;
        memcpy(c->kv_blocks, ev->kv_blocks, c->kv_n_blocks * sizeof(int32_t));
        if (c->hold_pool)
            for (size_t i = 0; i < c->kv_n_blocks; i++) kv_pool_ref(c->hold_pool, c->kv_blocks[i]);
    } else {
        c->done = 1;
        c->fin = *ev;
        c->fin.error_msg = NULL;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

static void col_init(collector *c)
{
    memset(c, 0, sizeof *c);
    dx_buf_init(&c->text, 0);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
}

static void col_free(collector *c)
{
    dx_buf_free(&c->text);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

typedef struct {
    model *m;
    kv_pool *pool;
    dx_tpool *tp;
    sched *s;
} srig;

static int g_reclaims;
static int reclaim_one(void *user); /* the test's retained references, dropped one by one */

static void srig_init_cfg(srig *r, model *m, uint32_t n_blocks, uint32_t max_batch, int threads,
                          int no_prefix_cache, void *reclaim_user)
{
    const model_hparams *hp = model_hp(m);
    r->m = m;
    uint64_t fp[2];
    model_fingerprint(m, fp);
    kv_pool_config pc = {.n_layer = hp->n_layer,
                         .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim,
                         .block_size = 16,
                         .dtype = DX_F16,
                         .n_blocks = n_blocks,
                         .seed = {fp[0], fp[1]}};
    assert_int_equal(kv_pool_create(&pc, &r->pool), 0);
    assert_int_equal(dx_tpool_create(threads, &r->tp), 0);
    sched_config sc = {
        max_batch, 16, 64, 1024, no_prefix_cache, reclaim_user ? reclaim_one : NULL, reclaim_user};
    assert_int_equal(sched_create(&sc, m, r->pool, r->tp, &r->s), 0);
}

static void srig_init(srig *r, model *m, uint32_t n_blocks, uint32_t max_batch, int threads)
{
    srig_init_cfg(r, m, n_blocks, max_batch, threads, 0, NULL);
}

static void srig_free(srig *r)
{
    sched_destroy(r->s);
    dx_tpool_destroy(r->tp);
    kv_pool_destroy(r->pool);
}

static void run_all(srig *r)
{
    int guard = 0;
    while (sched_step(r->s) > 0) assert_true(++guard < 100000);
}

static engine_request greedy(const int32_t *p, size_t n, uint32_t max_tokens, collector *c)
{
    return (engine_request){.prompt = p,
                            .n_prompt = n,
                            .max_tokens = max_tokens,
                            .ignore_eos = 1,
                            .on_event = collect,
                            .user = c};
}

static model *g_m;
static int32_t g_prompts[8][80];
static size_t g_plen[8] = {5, 17, 32, 33, 48, 64, 71, 80};

static int setup(void **state)
{
    (void)state;
    if (etu_setup()) return -1;
    g_m = etu_model(MODEL_QWEN3, DX_F32);
    if (!g_m) return -1;
    for (int i = 0; i < 8; i++)
        etu_tokens(g_prompts[i], g_plen[i], model_hp(g_m)->n_vocab, 100 + (uint64_t)i);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    model_free(g_m);
    etu_teardown();
    return 0;
}

/* Outputs of each prompt run alone (the reference for the others). */
static collector g_alone[8];

static void test_alone_and_pinned(void **state)
{
    (void)state;
    for (int i = 0; i < 8; i++) {
        srig r;
        srig_init(&r, g_m, 64, 512, 2);
        col_init(&g_alone[i]);
        engine_request q = greedy(g_prompts[i], g_plen[i], 24, &g_alone[i]);
        assert_int_equal(sched_submit(r.s, &q, 1), 0);
        run_all(&r);
        assert_true(g_alone[i].done);
        assert_int_equal(g_alone[i].fin.finish, ENGINE_FINISH_LENGTH);
        assert_int_equal(g_alone[i].n, 24);
        assert_int_equal(g_alone[i].fin.n_prompt, g_plen[i]);
        kv_pool_stats ps;
        kv_pool_get_stats(r.pool, &ps);
        assert_int_equal(ps.n_used, 0);
        srig_free(&r);
    }
}

/* Pinned greedy output of prompt 0 on the tiny qwen3 f32 model (seed 42)
 * with the scalar kernels (portable across x86 CPUs): a numerical change in
 * the model, tokenizer training, synth or forward pass shows up here. */
static void test_pinned_greedy(void **state)
{
    (void)state;
    static const int32_t pinned[12] = {170, 812, 677, 850, 283, 438, 843, 129, 810, 212, 403, 203};
    enum kern_isa saved = kern_get_isa();
    assert_int_equal(kern_set_isa(KERN_SCALAR), 0);
    srig r;
    srig_init(&r, g_m, 64, 512, 2);
    collector c;
    col_init(&c);
    engine_request q = greedy(g_prompts[0], g_plen[0], 12, &c);
    assert_int_equal(sched_submit(r.s, &q, 1), 0);
    run_all(&r);
    srig_free(&r);
    kern_set_isa(saved);
    for (int i = 0; i < 12; i++)
        if (c.toks[i] != pinned[i]) {
            fprintf(stderr, "got:");
            for (int k = 0; k < 12; k++) fprintf(stderr, " %d,", c.toks[k]);
            fprintf(stderr, "\n");
            fail_msg("greedy token %d differs from the pinned output", i);
        }
    col_free(&c);
}

/* Pinned greedy output of the tiny mixtures of experts (tiny-moe, f32, seed
 * 42; qwen3moe and llama), scalar kernels: 16 tokens after a 9-token prompt,
 * through the scheduler as `duplex generate` runs it (itest_cli pins
 * `duplex generate` itself). */
static void test_pinned_greedy_moe(void **state)
{
    (void)state;
    static const int32_t pinned[2][16] = {
        {406, 49, 150, 107, 140, 814, 772, 376, 631, 182, 126, 312, 848, 256, 617, 503},
        {143, 492, 537, 656, 171, 408, 171, 408, 337, 101, 656, 793, 407, 99, 820, 614},
    };
    const enum model_arch archs[2] = {MODEL_QWEN3MOE, MODEL_LLAMA};
    enum kern_isa saved = kern_get_isa();
    assert_int_equal(kern_set_isa(KERN_SCALAR), 0);
    for (int a = 0; a < 2; a++) {
        model *m = etu_model_p(archs[a], "tiny-moe", DX_F32);
        assert_non_null(m);
        int32_t prompt[9];
        etu_tokens(prompt, 9, model_hp(m)->n_vocab, 77 + 10 * (uint64_t)a);
        srig r;
        srig_init(&r, m, 64, 512, 2);
        collector c;
        col_init(&c);
        engine_request q = greedy(prompt, 9, 16, &c);
        assert_int_equal(sched_submit(r.s, &q, 1), 0);
        run_all(&r);
        srig_free(&r);
        model_free(m);
        assert_int_equal(c.n, 16);
        if (memcmp(c.toks, pinned[a], sizeof pinned[a])) {
            fprintf(stderr, "got:");
            for (int k = 0; k < 16; k++) fprintf(stderr, " %d,", c.toks[k]);
            fprintf(stderr, "\n");
            fail_msg("%s: the greedy tokens differ from the pinned output",
                     a ? "llama" : "qwen3moe");
        }
        col_free(&c);
    }
    kern_set_isa(saved);
}

static void test_concurrent_equals_alone(void **state)
{
    (void)state;
    srig r;
    srig_init(&r, g_m, 128, 64, 2); /* small batch budget: prefills are chunked */
    collector c[8];
    for (int i = 0; i < 8; i++) {
        col_init(&c[i]);
        engine_request q = greedy(g_prompts[i], g_plen[i], 24, &c[i]);
        assert_int_equal(sched_submit(r.s, &q, (uint64_t)i + 1), 0);
    }
    run_all(&r);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(c[i].n, 24);
        assert_memory_equal(c[i].toks, g_alone[i].toks, 24 * sizeof(int32_t));
        assert_int_equal(c[i].text.len, g_alone[i].text.len);
        col_free(&c[i]);
    }
    srig_free(&r);
}

/* Greedy tokens of prompt i alone on a fresh rig of `threads` threads. */
static void run_alone(model *m, int i, int threads, size_t n, collector *c)
{
    srig r;
    srig_init(&r, m, 64, 512, threads);
    col_init(c);
    engine_request q = greedy(g_prompts[i], g_plen[i], n, c);
    assert_int_equal(sched_submit(r.s, &q, 1), 0);
    run_all(&r);
    assert_int_equal(c->n, n);
    srig_free(&r);
}

/* Models in block formats (q4_0, iq4_nl, and a mixture of them with q8_0
 * and the _1 formats): every prompt gets the same greedy tokens alone on 1
 * and 2 threads, and among the 7 others with chunked prefill; q4_0's are
 * pinned (scalar kernels) and are the same on every ISA this CPU has. */
static void test_quant_models(void **state)
{
    (void)state;
    static const int32_t pinned[12] = {PINNED_Q4_0};
    model *ms[3] = {etu_model(MODEL_QWEN3, DX_Q4_0), etu_model(MODEL_QWEN3, DX_IQ4_NL),
                    etu_model_mix(MODEL_QWEN3)};
    enum kern_isa saved = kern_get_isa();
    for (int mi = 0; mi < 3; mi++) {
        model *m = ms[mi];
        assert_non_null(m);
        collector alone[8], c[8];
        for (int i = 0; i < 8; i++) {
            run_alone(m, i, 1, 16, &alone[i]);
            collector two;
            run_alone(m, i, 2, 16, &two);
            assert_memory_equal(two.toks, alone[i].toks, 16 * sizeof(int32_t));
            col_free(&two);
        }
        srig r;
        srig_init(&r, m, 128, 64, 2); /* small batch budget: prefills are chunked */
        for (int i = 0; i < 8; i++) {
            col_init(&c[i]);
            engine_request q = greedy(g_prompts[i], g_plen[i], 16, &c[i]);
            assert_int_equal(sched_submit(r.s, &q, (uint64_t)i + 1), 0);
        }
        run_all(&r);
        srig_free(&r);
        for (int i = 0; i < 8; i++) {
            assert_memory_equal(c[i].toks, alone[i].toks, 16 * sizeof(int32_t));
            col_free(&c[i]);
        }
        for (int i = 0; i < 8; i++) col_free(&alone[i]);
    }
    /* pinned, on every ISA */
    for (int isa = KERN_SCALAR; isa <= (int)kern_isa_detect(); isa++) {
        assert_int_equal(kern_set_isa((enum kern_isa)isa), 0);
        collector c;
        run_alone(ms[0], 0, 2, 12, &c);
        for (int i = 0; i < 12; i++)
            if (c.toks[i] != pinned[i]) {
                fprintf(stderr, "%s got:", kern_isa_name((enum kern_isa)isa));
                for (int k = 0; k < 12; k++) fprintf(stderr, " %d,", c.toks[k]);
                fprintf(stderr, "\n");
                fail_msg("q4_0 greedy token %d differs from the pinned output", i);
            }
        col_free(&c);
    }
    kern_set_isa(saved);
    for (int mi = 0; mi < 3; mi++) model_free(ms[mi]);
}

/* A pool too small for everything: sequences outgrow their checkpoint, the
 * newest is preempted and recomputed later — its tokens do not change, and
 * nothing thrashes (each sequence is preempted a bounded number of times). */
static void test_preemption_keeps_tokens(void **state)
{
    (void)state;
    enum { N = 6, GEN = 150 };
    collector alone[N], c[N];
    for (int i = 0; i < N; i++) { /* references: each alone, in a pool that fits it */
        srig r;
        srig_init(&r, g_m, 64, 512, 1);
        col_init(&alone[i]);
        engine_request q = greedy(g_prompts[i], g_plen[i], GEN, &alone[i]);
        assert_int_equal(sched_submit(r.s, &q, 1), 0);
        run_all(&r);
        srig_free(&r);
    }
    srig r;
    /* 16 blocks of 16 tokens; each sequence ends needing 10 to 15 */
    srig_init(&r, g_m, 16, 512, 1);
    for (int i = 0; i < N; i++) {
        col_init(&c[i]);
        engine_request q = greedy(g_prompts[i], g_plen[i], GEN, &c[i]);
        assert_int_equal(sched_submit(r.s, &q, (uint64_t)i + 1), 0);
    }
    run_all(&r);
    engine_stats st;
    sched_get_stats(r.s, &st);
    assert_true(st.preemptions > 0);
    uint32_t most = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(c[i].fin.finish, ENGINE_FINISH_LENGTH);
        assert_memory_equal(c[i].toks, alone[i].toks, GEN * sizeof(int32_t));
        if (c[i].fin.n_preempted > most) most = c[i].fin.n_preempted;
        col_free(&c[i]);
        col_free(&alone[i]);
    }
    if (most > 3) fail_msg("a sequence was preempted %u times", most);
    assert_int_equal(st.kv.n_used, 0);
    srig_free(&r);
}

/* Past max_waiting, the newest requests that never ran end at once with
 * DX_EBUSY; the others run to the end. */
static void test_waiting_limit(void **state)
{
    (void)state;
    srig r;
    srig_init(&r, g_m, 16, 512, 1);
    sched_config sc = {512, 16, 2, 1024, 0, NULL, NULL}; /* at most 2 waiting */
    sched_destroy(r.s);
    assert_int_equal(sched_create(&sc, g_m, r.pool, r.tp, &r.s), 0);
    collector c[8];
    for (int i = 0; i < 8; i++) {
        col_init(&c[i]);
        engine_request q = greedy(g_prompts[7], g_plen[7], 100, &c[i]); /* 12 blocks each */
        assert_int_equal(sched_submit(r.s, &q, (uint64_t)i + 1), 0);
    }
    run_all(&r);
    int ok = 0, busy = 0;
    for (int i = 0; i < 8; i++) {
        if (c[i].fin.finish == ENGINE_FINISH_LENGTH) ok++;
        if (c[i].fin.finish == ENGINE_FINISH_ERROR && c[i].fin.error == DX_EBUSY) busy++;
        col_free(&c[i]);
    }
    assert_int_equal(ok, 3); /* one running, two waiting */
    assert_int_equal(busy, 5);
    engine_stats st;
    sched_get_stats(r.s, &st);
    assert_int_equal(st.shed, 5);
    srig_free(&r);
}

static void test_prefix_cache_reuse(void **state)
{
    (void)state;
    srig r;
    srig_init(&r, g_m, 64, 512, 2);
    collector a, b;
    col_init(&a);
    col_init(&b);
    engine_request q = greedy(g_prompts[7], g_plen[7], 24, &a);
    assert_int_equal(sched_submit(r.s, &q, 1), 0);
    run_all(&r);
    assert_int_equal(a.fin.n_cached, 0);
    /* the same prompt again: its 4 full blocks before the last token are cached */
    q.user = &b;
    assert_int_equal(sched_submit(r.s, &q, 2), 0);
    run_all(&r);
    assert_int_equal(b.fin.n_cached, 64);
    assert_memory_equal(b.toks, g_alone[7].toks, 24 * sizeof(int32_t));
    /* a follow-up turn: prompt + answer + more; reuses prompt and answer blocks */
    int32_t turn2[128];
    memcpy(turn2, g_prompts[7], 80 * 4);
    memcpy(turn2 + 80, a.toks, 24 * 4);
    etu_tokens(turn2 + 104, 20, model_hp(g_m)->n_vocab, 999);
    collector c2;
    col_init(&c2);
    engine_request q2 = greedy(turn2, 124, 8, &c2);
    assert_int_equal(sched_submit(r.s, &q2, 3), 0);
    run_all(&r);
    assert_int_equal(c2.fin.n_cached, 96); /* 6 full blocks: prompt and most of the answer */
    col_free(&a);
    col_free(&b);
    col_free(&c2);
    srig_free(&r);
}

/* cache_salt namespaces: the same prompt under another salt reuses nothing
 * (and publishes its own blocks), under the same salt everything; the
 * shared namespace (no salt) never sees a salted request's blocks; the
 * output is the same everywhere. */
static void test_cache_salt(void **state)
{
    (void)state;
    srig r;
    srig_init(&r, g_m, 64, 512, 2);
    static const uint8_t sa[KV_SALT_BYTES] = {1}, sb[KV_SALT_BYTES] = {2};
    const uint8_t *salts[] = {sa, sb, sa, NULL, sb};
    const uint32_t want[] = {0, 0, 64, 0, 64};
    for (int i = 0; i < 5; i++) {
        collector c;
        col_init(&c);
        engine_request q = greedy(g_prompts[7], g_plen[7], 24, &c);
        if (salts[i]) memcpy(q.cache_salt, salts[i], KV_SALT_BYTES);
        assert_int_equal(sched_submit(r.s, &q, 10 + (uint64_t)i), 0);
        run_all(&r);
        if (c.fin.n_cached != want[i])
            fail_msg("request %d: %u tokens cached, want %u", i, c.fin.n_cached, want[i]);
        assert_memory_equal(c.toks, g_alone[7].toks, 24 * sizeof(int32_t));
        col_free(&c);
    }
    /* a salted seed is the pool's own only for the zero salt */
    static const uint8_t zero[KV_SALT_BYTES];
    kv_hash s0 = kv_pool_seed_salted(r.pool, zero), s1 = kv_pool_seed_salted(r.pool, sa);
    assert_true(kv_hash_eq(s0, kv_pool_seed(r.pool)));
    assert_false(kv_hash_eq(s1, s0));
    assert_false(kv_hash_eq(s1, kv_pool_seed_salted(r.pool, sb)));
    srig_free(&r);
}

/* Copies a sequence's blocks from one pool into fresh blocks of another with
 * the same geometry and publishes them under the destination's hash chain:
 * what a node does with blocks it pulled from a peer. */
static size_t transplant(kv_pool *from, const int32_t *src, kv_pool *to, const int32_t *toks,
                         size_t n_blocks, int32_t *dst)
{
    kv_hash chain[64];
    assert_int_equal(kv_pool_hash_chain(to, toks, n_blocks * 16, chain), n_blocks);
    assert_int_equal(kv_pool_alloc_n(to, n_blocks, dst), 0);
    for (size_t i = 0; i < n_blocks; i++) {
        memcpy(kv_pool_block_ptr(to, dst[i]), kv_pool_block_ptr(from, src[i]),
               kv_pool_block_bytes(to));
        kv_pool_publish(to, &dst[i], chain[i]);
    }
    return n_blocks;
}

static void test_kv_event_and_prefix_blocks(void **state)
{
    (void)state;
    srig a, b;
    srig_init(&a, g_m, 64, 512, 2);
    srig_init(&b, g_m, 64, 512, 1);
    collector ca, cb;
    col_init(&ca);
    col_init(&cb);
    ca.hold_pool = a.pool;
    engine_request q = greedy(g_prompts[7], g_plen[7], 24, &ca);
    q.want_kv = 1;
    assert_int_equal(sched_submit(a.s, &q, 1), 0);
    run_all(&a);
    /* KV before DONE: every token, and the 6 full blocks of the 103 computed */
    assert_int_equal(ca.kv_events, 1);
    assert_true(ca.kv_before_done);
    assert_int_equal(ca.kv_n_toks, 80 + 24);
    assert_memory_equal(ca.kv_toks, g_prompts[7], 80 * sizeof(int32_t));
    assert_memory_equal(ca.kv_toks + 80, g_alone[7].toks, 24 * sizeof(int32_t));
    assert_int_equal(ca.kv_n_blocks, 103 / 16);
    kv_hash chain[8];
    kv_pool_hash_chain(a.pool, ca.kv_toks, ca.kv_n_blocks * 16, chain);
    for (size_t i = 0; i < ca.kv_n_blocks; i++) {
        kv_hash h;
        assert_true(kv_pool_block_hash(a.pool, ca.kv_blocks[i], &h));
        assert_true(kv_hash_eq(h, chain[i]));
        assert_int_equal(kv_pool_refcount(a.pool, ca.kv_blocks[i]), 1); /* ours alone now */
    }
    /* the next turn on another pool, its first 6 blocks handed in: same
     * tokens as computing everything there */
    int32_t turn2[128], pre[8];
    memcpy(turn2, ca.kv_toks, 104 * 4);
    etu_tokens(turn2 + 104, 20, model_hp(g_m)->n_vocab, 4242);
    size_t n_pre = transplant(a.pool, ca.kv_blocks, b.pool, turn2, ca.kv_n_blocks, pre);
    engine_request q2 = greedy(turn2, 124, 12, &cb);
    q2.prefix_blocks = pre;
    q2.n_prefix_blocks = n_pre;
    assert_int_equal(sched_submit(b.s, &q2, 1), 0);
    run_all(&b);
    assert_int_equal(cb.fin.n_cached, 96);
    engine_stats st;
    sched_get_stats(b.s, &st);
    assert_int_equal(st.prompt_tokens_cached, 96);
    assert_int_equal(st.prompt_tokens_computed, 124 - 96);
    collector ref;
    col_init(&ref);
    q2.prefix_blocks = NULL;
    q2.n_prefix_blocks = 0;
    q2.user = &ref;
    assert_int_equal(sched_submit(a.s, &q2, 2), 0); /* a's cache also holds them: force none */
    run_all(&a);
    assert_int_equal(cb.n, 12);
    assert_memory_equal(cb.toks, ref.toks, 12 * sizeof(int32_t));
    for (size_t i = 0; i < ca.kv_n_blocks; i++) kv_pool_unref(a.pool, ca.kv_blocks[i]);
    kv_pool_stats ps;
    kv_pool_get_stats(b.pool, &ps);
    assert_int_equal(ps.n_used, 0);
    assert_int_equal(kv_pool_check(a.pool), 0);
    assert_int_equal(kv_pool_check(b.pool), 0);
    col_free(&ca);
    col_free(&cb);
    col_free(&ref);
    srig_free(&a);
    srig_free(&b);
}

static void test_prefix_blocks_rules(void **state)
{
    (void)state;
    srig r;
    srig_init(&r, g_m, 32, 512, 1);
    collector c;
    col_init(&c);
    int32_t ids[8];
    assert_int_equal(kv_pool_alloc_n(r.pool, 5, ids), 0);
    kv_hash chain[8];
    kv_pool_hash_chain(r.pool, g_prompts[7], 80, chain);
    /* unhashed blocks are refused */
    engine_request q = greedy(g_prompts[7], g_plen[7], 4, &c);
    q.prefix_blocks = ids;
    q.n_prefix_blocks = 2;
    assert_int_equal(sched_submit(r.s, &q, 1), DX_EINVAL);
    for (int i = 0; i < 5; i++) kv_pool_publish(r.pool, &ids[i], chain[i]);
    /* all 5 blocks (80 tokens) would leave no prompt token to compute */
    q.n_prefix_blocks = 5;
    assert_int_equal(sched_submit(r.s, &q, 1), DX_EINVAL);
    /* a waiting request that is canceled gives its handed blocks back */
    q.n_prefix_blocks = 4;
    assert_int_equal(sched_submit(r.s, &q, 1), 0);
    assert_int_equal(sched_cancel(r.s, 1), 0);
    sched_step(r.s);
    assert_int_equal(c.fin.finish, ENGINE_FINISH_CANCELED);
    for (int i = 0; i < 4; i++) assert_int_equal(kv_pool_refcount(r.pool, ids[i]), 0);
    kv_pool_unref(r.pool, ids[4]);
    kv_pool_stats ps;
    kv_pool_get_stats(r.pool, &ps);
    assert_int_equal(ps.n_used, 0);
    col_free(&c);
    srig_free(&r);
}

/* Tokens generated elsewhere (a prefill node's first token): given with the
 * prompt they are the request's first output, every full prompt block may
 * come precomputed, and what follows equals generating them here — greedy
 * and with seeded sampling (the generator is advanced past them). */
static void test_pregen_first_token(void **state)
{
    (void)state;
    srig a, b;
    srig_init(&a, g_m, 64, 512, 2);
    srig_init(&b, g_m, 64, 512, 1);
    collector ca, cb;
    col_init(&ca);
    col_init(&cb);
    ca.hold_pool = a.pool;
    engine_request q = greedy(g_prompts[7], g_plen[7], 1, &ca);
    q.want_kv = 1;
    assert_int_equal(sched_submit(a.s, &q, 1), 0);
    run_all(&a);
    assert_int_equal(ca.kv_n_blocks, 5); /* the 80-token prompt's 5 blocks */
    int32_t pre[8];
    size_t n_pre = transplant(a.pool, ca.kv_blocks, b.pool, g_prompts[7], 5, pre);
    engine_request q2 = greedy(g_prompts[7], g_plen[7], 24, &cb);
    q2.prefix_blocks = pre;
    q2.n_prefix_blocks = n_pre;
    assert_int_equal(sched_submit(b.s, &q2, 1), DX_EINVAL); /* 5 blocks: nothing to compute */
    q2.pregen[0] = ca.toks[0];
    q2.n_pregen = 1;
    assert_int_equal(sched_submit(b.s, &q2, 1), 0);
    sched_step(b.s); /* admission delivers the given token before any compute */
    assert_true(cb.n >= 1);
    assert_int_equal(cb.toks[0], g_alone[7].toks[0]);
    run_all(&b);
    assert_int_equal(cb.n, 24);
    assert_memory_equal(cb.toks, g_alone[7].toks, 24 * sizeof(int32_t));
    assert_int_equal(cb.fin.n_cached, 80);
    assert_int_equal(cb.fin.n_gen, 24);
    engine_stats st;
    sched_get_stats(b.s, &st);
    assert_int_equal(st.prompt_tokens_computed, 0);
    for (size_t i = 0; i < 5; i++) kv_pool_unref(a.pool, ca.kv_blocks[i]);

    /* max_tokens 1: ends at admission, with the KV event of what it holds */
    collector c1;
    col_init(&c1);
    c1.hold_pool = b.pool;
    engine_request q3 = greedy(g_prompts[7], g_plen[7], 1, &c1);
    q3.pregen[0] = 7;
    q3.n_pregen = 1;
    q3.want_kv = 1;
    assert_int_equal(sched_submit(b.s, &q3, 2), 0);
    sched_step(b.s);
    assert_true(c1.done);
    assert_int_equal(c1.fin.finish, ENGINE_FINISH_LENGTH);
    assert_int_equal(c1.n, 1);
    assert_int_equal(c1.toks[0], 7);
    assert_int_equal(c1.kv_events, 1);
    assert_int_equal(c1.kv_n_toks, 81);
    assert_int_equal(c1.kv_n_blocks, 5); /* b's cache had the prompt's blocks */
    for (size_t i = 0; i < c1.kv_n_blocks; i++) kv_pool_unref(b.pool, c1.kv_blocks[i]);
    /* bad given tokens */
    q3.n_pregen = 2;
    assert_int_equal(sched_submit(b.s, &q3, 3), DX_EINVAL); /* over max_tokens */
    q3.max_tokens = 4;
    q3.pregen[1] = (int32_t)model_hp(g_m)->n_vocab;
    assert_int_equal(sched_submit(b.s, &q3, 3), DX_EINVAL);
    q3.n_pregen = ENGINE_MAX_PREGEN + 1;
    q3.max_tokens = 0;
    assert_int_equal(sched_submit(b.s, &q3, 3), DX_EINVAL);
    kv_pool_stats ps;
    kv_pool_get_stats(b.pool, &ps);
    assert_int_equal(ps.n_used, 0);
    assert_int_equal(kv_pool_check(b.pool), 0);

    /* seeded sampling: the rest of the reply equals sampling it all here */
    collector cs[2];
    for (int i = 0; i < 2; i++) {
        srig r;
        srig_init(&r, g_m, 64, 512, 1);
        col_init(&cs[i]);
        engine_request s = greedy(g_prompts[1], g_plen[1], 24, &cs[i]);
        s.sampling = (engine_sampling){.temperature = 1.5f,
                                       .top_k = 50,
                                       .top_p = 0.95f,
                                       .min_p = 0.01f,
                                       .seed = 5,
                                       .has_seed = 1};
        if (i) {
            s.pregen[0] = cs[0].toks[0];
            s.n_pregen = 1;
        }
        assert_int_equal(sched_submit(r.s, &s, 1), 0);
        run_all(&r);
        srig_free(&r);
    }
    assert_int_equal(cs[1].n, 24);
    assert_memory_equal(cs[0].toks, cs[1].toks, 24 * 4);
    for (int i = 0; i < 2; i++) col_free(&cs[i]);
    col_free(&ca);
    col_free(&cb);
    col_free(&c1);
    srig_free(&a);
    srig_free(&b);
}

/* ---- constrained decoding (structured outputs) ---- */

static const char k_gram_src[] =
    "root ::= \"{\\\"ok\\\": \" (\"true\" | \"false\") \", \\\"n\\\": \" [1-9] [0-9]{0,2} \", "
    "\\\"w\\\": \\\"\" [a-z]{1,6} \"\\\"}\"\n";

/* The answer is a complete sentence of k_gram_src: a JSON object of that
 * shape and nothing after it. */
static void assert_gram_text(const collector *c)
{
    json_error_t je;
    json_t *v = json_loadb(c->text.data, c->text.len, 0, &je);
    if (!json_is_boolean(json_object_get(v, "ok")) || !json_is_integer(json_object_get(v, "n")) ||
        !json_is_string(json_object_get(v, "w")) || json_object_size(v) != 3)
        fail_msg("not the grammar's shape: '%.*s'", (int)c->text.len, c->text.data);
    json_decref(v);
}

static engine_request constrained(const int32_t *p, size_t n, uint32_t max_tokens, uint64_t seed,
                                  const gram *g, collector *c)
{
    engine_request q = greedy(p, n, max_tokens, c);
    q.ignore_eos = 0;
    q.sampling = (engine_sampling){.temperature = 1.0f, .seed = seed, .has_seed = 1};
    q.grammar = g;
    return q;
}

/* Sampled at temperature 1 from a random model, every answer follows the
 * grammar and ends (STOP) when it is complete; masking touches only logits,
 * so constrained and unconstrained sequences batched together give what
 * each gives alone; max_tokens still cuts (LENGTH); a pregenerated token
 * goes through the matcher (the rest equals a run that sampled it), and one
 * the grammar refuses ends the request with an error. */
static void test_grammar_constrained(void **state)
{
    (void)state;
    gram_vocab *gv;
    gram *g;
    assert_int_equal(gram_vocab_create(model_tokenizer(g_m), &gv), 0);
    assert_int_equal(gram_compile_ebnf(k_gram_src, strlen(k_gram_src), &g), 0);
    enum { N = 6 };
    collector alone[N], mixed[N], free_run;
    for (int i = 0; i < N; i++) {
        srig r;
        srig_init(&r, g_m, 64, 512, 1);
        col_init(&alone[i]);
        engine_request q =
            constrained(g_prompts[i], g_plen[i], 200, 10 + (uint64_t)i, g, &alone[i]);
        assert_int_equal(sched_submit(r.s, &q, 1), DX_EINVAL); /* no vocabulary set */
        sched_set_gram_vocab(r.s, gv);
        assert_int_equal(sched_submit(r.s, &q, 1), 0);
        run_all(&r);
        assert_int_equal(alone[i].fin.finish, ENGINE_FINISH_STOP);
        assert_gram_text(&alone[i]);
        engine_stats st;
        sched_get_stats(r.s, &st);
        assert_int_equal(st.gram_masks, alone[i].n); /* one mask per sampled token */
        srig_free(&r);
    }
    /* all at once, with an unconstrained greedy sequence among them */
    srig r;
    srig_init(&r, g_m, 128, 512, 2);
    sched_set_gram_vocab(r.s, gv);
    for (int i = 0; i < N; i++) {
        col_init(&mixed[i]);
        engine_request q =
            constrained(g_prompts[i], g_plen[i], 200, 10 + (uint64_t)i, g, &mixed[i]);
        assert_int_equal(sched_submit(r.s, &q, 1 + (uint64_t)i), 0);
    }
    col_init(&free_run);
    engine_request u = greedy(g_prompts[7], g_plen[7], 24, &free_run);
    assert_int_equal(sched_submit(r.s, &u, 99), 0);
    run_all(&r);
    for (int i = 0; i < N; i++) {
        assert_int_equal(mixed[i].n, alone[i].n);
        assert_memory_equal(mixed[i].toks, alone[i].toks, alone[i].n * sizeof(int32_t));
    }
    assert_int_equal(free_run.n, 24);
    assert_memory_equal(free_run.toks, g_alone[7].toks, 24 * sizeof(int32_t));
    engine_stats st;
    sched_get_stats(r.s, &st);
    assert_true(st.gram_masks > 0 && st.gram_mask_ns > 0);

    /* max_tokens cuts the structure */
    collector cut;
    col_init(&cut);
    engine_request q = constrained(g_prompts[0], g_plen[0], 3, 10, g, &cut);
    assert_int_equal(sched_submit(r.s, &q, 100), 0);
    run_all(&r);
    assert_int_equal(cut.fin.finish, ENGINE_FINISH_LENGTH);
    assert_int_equal(cut.n, 3);
    assert_memory_equal(cut.toks, alone[0].toks, 3 * sizeof(int32_t));

    /* the first token from elsewhere (P/D): fed to the matcher */
    collector pg, refused;
    col_init(&pg);
    q = constrained(g_prompts[2], g_plen[2], 200, 12, g, &pg);
    q.pregen[0] = alone[2].toks[0];
    q.n_pregen = 1;
    assert_int_equal(sched_submit(r.s, &q, 101), 0);
    run_all(&r);
    assert_int_equal(pg.fin.finish, ENGINE_FINISH_STOP);
    assert_int_equal(pg.n, alone[2].n);
    assert_memory_equal(pg.toks, alone[2].toks, pg.n * sizeof(int32_t));
    col_init(&refused);
    q = constrained(g_prompts[2], g_plen[2], 200, 12, g, &refused);
    q.pregen[0] = alone[2].toks[alone[2].n - 2]; /* not how the object starts */
    q.n_pregen = 1;
    assert_int_equal(sched_submit(r.s, &q, 102), 0);
    run_all(&r);
    assert_int_equal(refused.fin.finish, ENGINE_FINISH_ERROR);
    assert_int_equal(refused.fin.error, DX_EINVAL);
    kv_pool_stats ps;
    kv_pool_get_stats(r.pool, &ps);
    assert_int_equal(ps.n_used, 0);
    srig_free(&r);
    for (int i = 0; i < N; i++) {
        col_free(&alone[i]);
        col_free(&mixed[i]);
    }
    col_free(&free_run);
    col_free(&cut);
    col_free(&pg);
    col_free(&refused);
    gram_destroy(g);
    gram_vocab_destroy(gv);
}

/* Logit biases, penalties and logprobs: a +100 bias makes a token every
 * answer; huge presence/frequency penalties repeat no reply token; a huge
 * repetition penalty reuses no prompt or reply token; logprobs are sorted
 * log-probabilities whose first is the greedy token; and all of it is the
 * same batched as alone, bit for bit.  Bad values are refused. */
static void test_bias_penalties_logprobs(void **state)
{
    (void)state;
    srig r;
    srig_init(&r, g_m, 128, 512, 2);
    uint32_t nv = model_hp(g_m)->n_vocab;
    collector c[6], alone[6];
    engine_bias up = {77, 100.0f};
    engine_request q[6];
    for (int i = 0; i < 6; i++) {
        col_init(&c[i]);
        col_init(&alone[i]);
        q[i] = greedy(g_prompts[6], g_plen[6], 24, &c[i]);
    }
    q[0].sampling.bias = &up, q[0].sampling.n_bias = 1;
    q[1].sampling.presence_penalty = 100;
    q[2].sampling.frequency_penalty = 100;
    q[3].sampling.repetition_penalty = 1000;
    q[4].logprobs = 1, q[4].top_logprobs = 5;
    q[5] = q[1];
    q[5].logprobs = 1, q[5].top_logprobs = ENGINE_MAX_TOP_LOGPROBS;
    q[5].sampling.temperature = 0.8f, q[5].sampling.seed = 3, q[5].sampling.has_seed = 1;
    q[5].user = &c[5];
    for (int i = 0; i < 6; i++) assert_int_equal(sched_submit(r.s, &q[i], (uint64_t)i + 1), 0);
    run_all(&r);
    for (int i = 0; i < 24; i++) assert_int_equal(c[0].toks[i], 77);
    for (int k = 1; k <= 2; k++)
        for (int i = 0; i < 24; i++)
            for (int j = 0; j < i; j++)
                if (c[k].toks[i] == c[k].toks[j]) fail_msg("penalty %d: token %d repeats", k, i);
    for (int i = 0; i < 24; i++) {
        for (int j = 0; j < i; j++) assert_int_not_equal(c[3].toks[i], c[3].toks[j]);
        for (size_t j = 0; j < g_plen[6]; j++) assert_int_not_equal(c[3].toks[i], g_prompts[6][j]);
    }
    assert_int_equal(c[4].n_lp, 24);
    for (int i = 0; i < 24; i++) {
        assert_int_equal(c[4].n_top[i], 5);
        assert_int_equal(c[4].top_ids[i][0], c[4].toks[i]); /* greedy: the most likely */
        assert_true(c[4].lp[i] == c[4].top_lp[i][0] && c[4].lp[i] <= 0);
        double mass = 0;
        for (int j = 0; j < 5; j++) {
            if (j) assert_true(c[4].top_lp[i][j] <= c[4].top_lp[i][j - 1]);
            mass += exp(c[4].top_lp[i][j]);
        }
        assert_true(mass <= 1.0 + 1e-5);
    }
    assert_memory_equal(c[4].toks, g_alone[6].toks, 24 * sizeof(int32_t)); /* unchanged */
    /* the sampled token's logprob is among the top 20 ones when it is there */
    for (int i = 0; i < 24; i++)
        for (uint32_t j = 0; j < c[5].n_top[i]; j++)
            if (c[5].top_ids[i][j] == c[5].toks[i]) assert_true(c[5].top_lp[i][j] == c[5].lp[i]);
    /* alone, on a fresh scheduler each: the same bits */
    for (int i = 0; i < 6; i++) {
        srig one;
        srig_init(&one, g_m, 128, 512, 1);
        engine_request a = q[i];
        a.user = &alone[i];
        assert_int_equal(sched_submit(one.s, &a, 1), 0);
        run_all(&one);
        assert_memory_equal(alone[i].toks, c[i].toks, 24 * sizeof(int32_t));
        assert_int_equal(alone[i].n_lp, c[i].n_lp);
        assert_memory_equal(alone[i].lp, c[i].lp, (size_t)c[i].n_lp * sizeof(float));
        assert_memory_equal(alone[i].top_lp, c[i].top_lp, sizeof c[i].top_lp);
        srig_free(&one);
    }
    /* refused */
    engine_request bad = greedy(g_prompts[6], g_plen[6], 4, &c[0]);
    engine_bias out = {(int32_t)nv, 1.0f};
    bad.sampling.bias = &out, bad.sampling.n_bias = 1;
    assert_int_equal(sched_submit(r.s, &bad, 9), DX_EINVAL);
    bad.sampling.n_bias = 0;
    bad.top_logprobs = ENGINE_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(sched_submit(r.s, &bad, 9), DX_EINVAL);
    bad.top_logprobs = 0;
    bad.sampling.repetition_penalty = -1;
    assert_int_equal(sched_submit(r.s, &bad, 9), DX_EINVAL);
    bad.sampling.repetition_penalty = 0;
    bad.logprobs = 1, bad.n_pregen = 1, bad.pregen[0] = 3;
    assert_int_equal(sched_submit(r.s, &bad, 9), DX_EINVAL);
    for (int i = 0; i < 6; i++) {
        col_free(&c[i]);
        col_free(&alone[i]);
    }
    srig_free(&r);
}

/* Every end-of-generation token of the vocabulary stops a request, not
 * only the file's EOS and EOT ids; its text is not output, and it counts
 * in n_gen (as OpenAI's completion_tokens counts it).  Given tokens
 * (pregen) go through the same acceptance as sampled ones. */
static void test_stops_on_every_end_token(void **state)
{
    (void)state;
    const tok *tk = model_tokenizer(g_m);
    const char *ends[] = {"<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>"};
    for (size_t i = 0; i < DX_ARRAY_LEN(ends); i++) {
        int32_t id = tok_find(tk, ends[i], strlen(ends[i]));
        assert_true(id >= 0);
        for (int ignore = 0; ignore < 2; ignore++) {
            srig r;
            srig_init(&r, g_m, 64, 512, 1);
            collector c;
            col_init(&c);
            engine_request q = greedy(g_prompts[0], g_plen[0], 3, &c);
            q.ignore_eos = ignore;
            q.pregen[0] = 'a';
            q.pregen[1] = id;
            q.n_pregen = 2;
            assert_int_equal(sched_submit(r.s, &q, 1), 0);
            run_all(&r);
            assert_true(c.done);
            if (ignore) {
                assert_int_equal(c.fin.finish, ENGINE_FINISH_LENGTH);
                assert_int_equal(c.fin.n_gen, 3);
            } else {
                assert_int_equal(c.fin.finish, ENGINE_FINISH_STOP);
                assert_int_equal(c.fin.n_gen, 2);
                assert_int_equal(c.text.len, 1);
                assert_memory_equal(c.text.data, "a", 1);
            }
            col_free(&c);
            srig_free(&r);
        }
    }
}

static void test_no_prefix_cache(void **state)
{
    (void)state;
    srig r;
    srig_init_cfg(&r, g_m, 64, 512, 1, 1, NULL);
    collector a, b;
    col_init(&a);
    col_init(&b);
    engine_request q = greedy(g_prompts[7], g_plen[7], 24, &a);
    assert_int_equal(sched_submit(r.s, &q, 1), 0);
    run_all(&r);
    q.user = &b;
    assert_int_equal(sched_submit(r.s, &q, 2), 0);
    run_all(&r);
    assert_int_equal(b.fin.n_cached, 0); /* computed again */
    assert_memory_equal(a.toks, b.toks, 24 * sizeof(int32_t));
    col_free(&a);
    col_free(&b);
    srig_free(&r);
}

/* Retained references the test holds, given back one block per call. */
typedef struct {
    kv_pool *pool;
    int32_t ids[64];
    size_t n;
} held;

static int reclaim_one(void *user)
{
    held *h = user;
    if (!h->n) return 0;
    kv_pool_unref(h->pool, h->ids[--h->n]);
    g_reclaims++;
    return 1;
}

static void test_reclaim_before_preempt(void **state)
{
    (void)state;
    held h = {0};
    srig r;
    srig_init_cfg(&r, g_m, 12, 512, 1, 0, &h);
    h.pool = r.pool;
    /* 10 of the 12 blocks held outside the engine, as retained leases would */
    assert_int_equal(kv_pool_alloc_n(r.pool, 10, h.ids), 0);
    h.n = 10;
    collector c;
    col_init(&c);
    engine_request q = greedy(g_prompts[7], g_plen[7], 24, &c); /* needs 7 blocks */
    g_reclaims = 0;
    assert_int_equal(sched_submit(r.s, &q, 1), 0);
    run_all(&r);
    assert_int_equal(c.fin.finish, ENGINE_FINISH_LENGTH);
    assert_memory_equal(c.toks, g_alone[7].toks, 24 * sizeof(int32_t));
    assert_int_equal(g_reclaims, 5); /* only as many as it needed */
    engine_stats st;
    sched_get_stats(r.s, &st);
    assert_int_equal(st.reclaims, 5);
    assert_int_equal(st.preemptions, 0);
    while (h.n) kv_pool_unref(r.pool, h.ids[--h.n]);
    col_free(&c);
    srig_free(&r);
}

/* A sequence running alone runs out of blocks while a waiting request holds
 * handed-in prefix blocks (pulled KV, say): those give way — the waiting
 * request computes the tokens itself later — instead of the running one
 * failing with "KV pool exhausted".  Both answers equal their runs alone. */
static void test_alone_takes_waiting_prefix(void **state)
{
    (void)state;
    srig big, r;
    srig_init(&big, g_m, 64, 512, 1);
    /* references: A = prompt 0 with 200 tokens; B = prompt 7 with 24
     * (g_alone[7]); and B's first 4 prompt blocks, kept to hand in */
    collector ra, cb0;
    col_init(&ra);
    col_init(&cb0);
    engine_request qa = greedy(g_prompts[0], g_plen[0], 200, &ra);
    assert_int_equal(sched_submit(big.s, &qa, 1), 0);
    cb0.hold_pool = big.pool;
    engine_request qb = greedy(g_prompts[7], g_plen[7], 24, &cb0);
    qb.want_kv = 1;
    assert_int_equal(sched_submit(big.s, &qb, 2), 0);
    run_all(&big);
    assert_int_equal(ra.fin.finish, ENGINE_FINISH_LENGTH);

    /* 16 blocks, one sequence at a time: A needs 13 (205 tokens), and B's
     * 4 handed-in blocks leave it 12 */
    r.m = g_m;
    const model_hparams *hp = model_hp(g_m);
    uint64_t fp[2];
    model_fingerprint(g_m, fp);
    kv_pool_config pc = {.n_layer = hp->n_layer,
                         .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim,
                         .block_size = 16,
                         .dtype = DX_F16,
                         .n_blocks = 16,
                         .seed = {fp[0], fp[1]}};
    assert_int_equal(kv_pool_create(&pc, &r.pool), 0);
    assert_int_equal(dx_tpool_create(1, &r.tp), 0);
    sched_config sc = {512, 1, 64, 1024, 0, NULL, NULL};
    assert_int_equal(sched_create(&sc, g_m, r.pool, r.tp, &r.s), 0);
    int32_t pre[8];
    size_t n_pre = transplant(big.pool, cb0.kv_blocks, r.pool, g_prompts[7], 4, pre);
    for (size_t i = 0; i < cb0.kv_n_blocks; i++) kv_pool_unref(big.pool, cb0.kv_blocks[i]);

    collector ca, cb;
    col_init(&ca);
    col_init(&cb);
    qa.user = &ca;
    qb = greedy(g_prompts[7], g_plen[7], 24, &cb);
    qb.prefix_blocks = pre;
    qb.n_prefix_blocks = n_pre;
    assert_int_equal(sched_submit(r.s, &qa, 1), 0);
    assert_int_equal(sched_submit(r.s, &qb, 2), 0);
    run_all(&r);
    assert_int_equal(ca.fin.finish, ENGINE_FINISH_LENGTH);
    assert_int_equal(ca.n, 200);
    assert_memory_equal(ca.toks, ra.toks, 200 * sizeof(int32_t));
    assert_int_equal(cb.fin.finish, ENGINE_FINISH_LENGTH);
    assert_memory_equal(cb.toks, g_alone[7].toks, 24 * sizeof(int32_t));
    /* B lost its handed-in prefix (A reused one of the blocks) and
     * computed what the prefix cache no longer had */
    assert_true(cb.fin.n_cached < 64);
    engine_stats st;
    sched_get_stats(r.s, &st);
    assert_int_equal(st.preemptions, 0);
    kv_pool_stats ps;
    kv_pool_get_stats(r.pool, &ps);
    assert_int_equal(ps.n_used, 0);
    assert_int_equal(kv_pool_check(r.pool), 0);
    col_free(&ra);
    col_free(&cb0);
    col_free(&ca);
    col_free(&cb);
    srig_free(&r);
    srig_free(&big);
}

static void test_cancel_frees_blocks(void **state)
{
    (void)state;
    srig r;
    srig_init(&r, g_m, 64, 512, 1);
    collector c[3];
    for (int i = 0; i < 3; i++) {
        col_init(&c[i]);
        engine_request q = greedy(g_prompts[5 + i], g_plen[5 + i], 200, &c[i]);
        assert_int_equal(sched_submit(r.s, &q, (uint64_t)i + 1), 0);
    }
    for (int i = 0; i < 5; i++) sched_step(r.s);
    kv_pool_stats ps;
    kv_pool_get_stats(r.pool, &ps);
    assert_true(ps.n_used > 0);
    for (int i = 0; i < 3; i++) assert_int_equal(sched_cancel(r.s, (uint64_t)i + 1), 0);
    assert_int_equal(sched_cancel(r.s, 77), DX_ENOENT);
    assert_int_equal(sched_step(r.s), 0);
    kv_pool_get_stats(r.pool, &ps);
    assert_int_equal(ps.n_used, 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(c[i].fin.finish, ENGINE_FINISH_CANCELED);
        col_free(&c[i]);
    }
    srig_free(&r);
}

static void test_stop_string_and_validation(void **state)
{
    (void)state;
    srig r;
    srig_init(&r, g_m, 64, 512, 1);
    /* pick a stop string from the middle of prompt 2's greedy text */
    const collector *ref = &g_alone[2];
    assert_true(ref->text.len > 8);
    size_t at = ref->text.len / 2;
    char stop[4] = {ref->text.data[at], ref->text.data[at + 1], 0, 0};
    const char *first = memmem(ref->text.data, ref->text.len, stop, 2);
    /* the DONE says which string matched (the one that can occur is second) */
    const char *stops[2] = {"\x01never\x02", stop};
    collector c;
    col_init(&c);
    engine_request q = greedy(g_prompts[2], g_plen[2], 24, &c);
    q.stop = stops;
    q.n_stop = 2;
    assert_int_equal(sched_submit(r.s, &q, 1), 0);
    run_all(&r);
    assert_int_equal(c.fin.finish, ENGINE_FINISH_STOP);
    assert_int_equal(c.fin.stop_index, 1);
    assert_int_equal(c.text.len, (size_t)(first - ref->text.data));
    assert_memory_equal(c.text.data, ref->text.data, c.text.len);
    col_free(&c);
    /* ended by the length, or with no stop string: no index */
    col_init(&c);
    q = greedy(g_prompts[2], g_plen[2], 2, &c);
    assert_int_equal(sched_submit(r.s, &q, 5), 0);
    run_all(&r);
    assert_int_equal(c.fin.stop_index, -1);
    col_free(&c);
    /* bad requests */
    engine_request bad = greedy(g_prompts[0], 0, 4, &c);
    assert_int_equal(sched_submit(r.s, &bad, 2), DX_EINVAL);
    bad = greedy(g_prompts[0], 5, 1020, &c);
    assert_int_equal(sched_submit(r.s, &bad, 3), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "context"));
    int32_t oov[2] = {0, (int32_t)model_hp(g_m)->n_vocab};
    bad = greedy(oov, 2, 4, &c);
    assert_int_equal(sched_submit(r.s, &bad, 4), DX_EINVAL);
    srig_free(&r);
}

static void test_seeded_sampling(void **state)
{
    (void)state;
    collector c[3];
    for (int i = 0; i < 3; i++) {
        srig r;
        srig_init(&r, g_m, 64, 512, 1);
        col_init(&c[i]);
        engine_request q = greedy(g_prompts[1], g_plen[1], 24, &c[i]);
        q.sampling = (engine_sampling){.temperature = 1.5f,
                                       .top_k = 50,
                                       .top_p = 0.95f,
                                       .min_p = 0.01f,
                                       .seed = i < 2 ? 5 : 6,
                                       .has_seed = 1};
        assert_int_equal(sched_submit(r.s, &q, 1), 0);
        run_all(&r);
        srig_free(&r);
    }
    assert_memory_equal(c[0].toks, c[1].toks, 24 * 4);
    assert_memory_not_equal(c[0].toks, c[2].toks, 24 * 4);
    for (int i = 0; i < 3; i++) col_free(&c[i]);
    /* sampler unit checks: top_k 1 is greedy; min_p 1 keeps only the max */
    sampler *s;
    assert_int_equal(sampler_create(5, &s), 0);
    float lg[5] = {0.1f, 2.0f, 1.9f, -1.0f, 2.0f};
    dx_rng rng;
    dx_rng_seed(&rng, 1);
    sampler_params k1 = {1.0f, 1, 1.0f, 0};
    for (int i = 0; i < 20; i++) assert_int_equal(sampler_sample(s, lg, &k1, &rng), 1);
    assert_int_equal(sampler_argmax(lg, 5), 1);
    sampler_destroy(s);
}

static void wait_done(collector *c)
{
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static void test_engine_thread(void **state)
{
    (void)state;
    engine_config ec = {.n_threads = 2, .kv_blocks = 64, .max_seqs = 4, .max_waiting = 2};
    engine *e;
    engine_config bad_kv = ec;
    bad_kv.kv_dtype = "q4_0";
    assert_int_equal(engine_create(&bad_kv, g_m, &e), DX_EINVAL);
    assert_int_equal(engine_create(&ec, g_m, &e), 0);
    assert_int_equal(kv_pool_dtype(engine_kv_pool(e)), DX_F16); /* the default */
    collector c[3];
    uint64_t ids[3];
    for (int i = 0; i < 3; i++) {
        col_init(&c[i]);
        engine_request q = greedy(g_prompts[i], g_plen[i], 24, &c[i]);
        assert_int_equal(engine_submit(e, &q, &ids[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        wait_done(&c[i]);
        assert_memory_equal(c[i].toks, g_alone[i].toks, 24 * 4);
    }
    /* cancel from inside the event callback after 3 tokens */
    collector k;
    col_init(&k);
    k.engine_for_cancel = e;
    k.cancel_after = 3;
    pthread_mutex_lock(&k.mu);
    engine_request q = greedy(g_prompts[4], g_plen[4], 200, &k);
    assert_int_equal(engine_submit(e, &q, &k.id), 0);
    pthread_mutex_unlock(&k.mu);
    wait_done(&k);
    assert_int_equal(k.fin.finish, ENGINE_FINISH_CANCELED);
    engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.kv.n_used, 0);
    engine_request bad = greedy(g_prompts[0], 5, 5000, &k);
    assert_int_equal(engine_submit(e, &bad, NULL), DX_EINVAL);
    engine_destroy(e);
    for (int i = 0; i < 3; i++) col_free(&c[i]);
    col_free(&k);
}

/* Admission is decided once, in engine_submit, against an exact count:
 * every request it accepted runs to its end, never "at capacity" later,
 * whatever the engine thread was doing when it came (draining its inbox,
 * stepping).  Requests submitted as fast as one thread can, against
 * max_seqs 2 + max_waiting 2 and a pool with room for all of them; the
 * rest are refused at once with DX_EBUSY. */
static void test_admission_exact(void **state)
{
    (void)state;
    enum { N = 300 };
    engine_config ec = {.n_threads = 1, .kv_blocks = 256, .max_seqs = 2, .max_waiting = 2};
    collector *c = calloc(N, sizeof *c);
    int accepted[N];
    for (int round = 0; round < 8; round++) { /* the engine thread is somewhere else each time */
        engine *e;
        assert_int_equal(engine_create(&ec, g_m, &e), 0);
        int n_ok = 0;
        for (int i = 0; i < N; i++) col_init(&c[i]);
        for (int i = 0; i < N; i++) {
            /* paced over many engine steps, so that submissions meet the
             * engine in every phase (the pace decides nothing else) */
            for (uint64_t t = dx_now_ns(); dx_now_ns() - t < 40000;) {
            }
            engine_request q = greedy(g_prompts[i % 8], g_plen[i % 8], 3, &c[i]);
            int rc = engine_submit(e, &q, NULL);
            if (rc) assert_int_equal(rc, DX_EBUSY);
            accepted[i] = rc == 0;
            n_ok += accepted[i];
        }
        assert_true(n_ok >= 4);
        for (int i = 0; i < N; i++) {
            if (!accepted[i]) continue;
            wait_done(&c[i]);
            if (c[i].fin.finish != ENGINE_FINISH_LENGTH)
                fail_msg("round %d: request %d was accepted, then ended with %d (error %d)", round,
                         i, c[i].fin.finish, c[i].fin.error);
        }
        engine_destroy(e);
        for (int i = 0; i < N; i++) col_free(&c[i]);
    }
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone_and_pinned),
        cmocka_unit_test(test_pinned_greedy),
        cmocka_unit_test(test_pinned_greedy_moe),
        cmocka_unit_test(test_concurrent_equals_alone),
        cmocka_unit_test(test_quant_models),
        cmocka_unit_test(test_preemption_keeps_tokens),
        cmocka_unit_test(test_waiting_limit),
        cmocka_unit_test(test_prefix_cache_reuse),
        cmocka_unit_test(test_cache_salt),
        cmocka_unit_test(test_kv_event_and_prefix_blocks),
        cmocka_unit_test(test_prefix_blocks_rules),
        cmocka_unit_test(test_pregen_first_token),
        cmocka_unit_test(test_grammar_constrained),
        cmocka_unit_test(test_bias_penalties_logprobs),
        cmocka_unit_test(test_no_prefix_cache),
        cmocka_unit_test(test_reclaim_before_preempt),
        cmocka_unit_test(test_alone_takes_waiting_prefix),
        cmocka_unit_test(test_cancel_frees_blocks),
        cmocka_unit_test(test_stop_string_and_validation),
        cmocka_unit_test(test_seeded_sampling),
        cmocka_unit_test(test_engine_thread),
        cmocka_unit_test(test_admission_exact),
        cmocka_unit_test(test_stops_on_every_end_token),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
