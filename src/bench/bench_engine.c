/* bench_engine: times fwd_step directly (no scheduler, no sampling) so the
 * figures are the engine's own: pp = one sequence prefilling prompt_tokens
 * in chunks of up to 512 after `depth` tokens of context; tg = one token at
 * a time after `depth` tokens.  The forward pass's own counters (fwd_stats)
 * give attention's share of the time and its rates; a timed read of a
 * buffer larger than the caches gives the memory rate a decode token's
 * bytes are held against.  Several KV dtypes run side by side, their runs
 * interleaved, for a comparison in one run (bench_engine.h). */
#include "bench/bench_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_tpool.h"
#include "engine/engine.h"
#include "engine/fwd.h"
#include "engine/kern/kern.h"
#include "engine/kv_pool.h"

#define CHUNK 512

typedef struct {
    kv_pool *pool;
    fwd *f;
    int32_t *blocks, *tokens;
    float *logits;
    double weight_bytes;
    fwd_stats sp, sg; /* summed over the runs */
    double pp[64], tg[64], pp_cpu[64], tg_cpu[64];
} bench_ctx;

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int prefill(bench_ctx *c, uint32_t from, uint32_t to)
{
    for (uint32_t p = from; p < to; p += CHUNK) {
        uint32_t n = to - p < CHUNK ? to - p : CHUNK;
        fwd_seq s = {c->blocks, p, n, c->tokens + p, p + n == to};
        int rc = fwd_step(c->f, &s, 1, c->logits);
        if (rc) return rc;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void summarize(double *v, uint32_t n, double *med, double *lo, double *hi)
{
    qsort(v, n, sizeof *v, cmp_double);
    *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    *lo = v[0];
    *hi = v[n - 1];
}

static void phase_stats(const fwd_stats *st, bench_engine_phase *ph)
{
    if (!st->step_ns || !st->attn_ns) return;
    ph->attn_share = (double)st->attn_ns / (double)st->step_ns;
    ph->moe_share = (double)st->moe_ns / (double)st->step_ns;
    ph->attn_gflop_s = st->attn_flop / (double)st->attn_ns;
    ph->attn_gb_s = st->attn_bytes / (double)st->attn_ns;
}

/* Run r of one forward pass: the timed prefill, then the timed decode. */
static int run_once(const bench_engine_config *cfg, bench_ctx *c, uint32_t r)
{
    uint32_t D = cfg->depth, P = cfg->prompt_tokens, G = cfg->gen_tokens;
    fwd_stats st;
    int rc;
    fwd_reset_stats(c->f);
    uint64_t t0 = dx_now_ns(), c0 = cpu_ns();
    if (P && (rc = prefill(c, D, D + P))) return rc;
    c->pp[r] = P ? P / ((double)(dx_now_ns() - t0) * 1e-9) : 0;
    c->pp_cpu[r] = P ? P / ((double)(cpu_ns() - c0) * 1e-9) : 0;
    fwd_get_stats(c->f, &st);
    c->sp.step_ns += st.step_ns, c->sp.attn_ns += st.attn_ns, c->sp.moe_ns += st.moe_ns;
    c->sp.attn_flop += st.attn_flop, c->sp.attn_bytes += st.attn_bytes;
    fwd_reset_stats(c->f);
    t0 = dx_now_ns(), c0 = cpu_ns();
    for (uint32_t i = 0; i < G; i++) {
        fwd_seq s = {c->blocks, D + i, 1, c->tokens + D + i, 1};
        if ((rc = fwd_step(c->f, &s, 1, c->logits))) return rc;
    }
    c->tg[r] = G ? G / ((double)(dx_now_ns() - t0) * 1e-9) : 0;
    c->tg_cpu[r] = G ? G / ((double)(cpu_ns() - c0) * 1e-9) : 0;
    fwd_get_stats(c->f, &st);
    c->sg.step_ns += st.step_ns, c->sg.attn_ns += st.attn_ns, c->sg.moe_ns += st.moe_ns;
    c->sg.attn_flop += st.attn_flop, c->sg.attn_bytes += st.attn_bytes, c->sg.steps += st.steps;
    return 0;
}

static void results(const bench_engine_config *cfg, bench_ctx *c, bench_engine_kv *out)
{
    summarize(c->pp, cfg->reps, &out->pp.tok_s, &out->pp.min, &out->pp.max);
    summarize(c->tg, cfg->reps, &out->tg.tok_s, &out->tg.min, &out->tg.max);
    double lo, hi;
    summarize(c->pp_cpu, cfg->reps, &out->pp.cpu_tok_s, &lo, &hi);
    summarize(c->tg_cpu, cfg->reps, &out->tg.cpu_tok_s, &lo, &hi);
    phase_stats(&c->sp, &out->pp);
    phase_stats(&c->sg, &out->tg);
    if (c->sg.steps)
        out->tg.bytes_per_tok = c->weight_bytes + c->sg.attn_bytes / (double)c->sg.steps;
}

/* The KV of positions [0, depth) of every layer and kv head, random
 * (|x| < 2, as normed keys are), stored as the forward pass stores it. */
static void synthetic_fill(const model *m, bench_ctx *c, uint32_t depth)
{
    const model_hparams *hp = model_hp(m);
    kv_pool *p = c->pool;
    uint32_t bs = kv_pool_block_size(p), D = hp->head_dim;
    int t = kv_pool_dtype(p);
    float k[512], v[512];
    uint64_t x = 88172645463325252ull;
    for (uint32_t pos = 0; pos < depth; pos++)
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            uint8_t *blk = kv_pool_block_ptr(p, c->blocks[pos / bs]);
            kern_attn_layout L = {.block_size = (int)bs, .head_dim = (int)D,
                                  .k_off = kv_pool_k_offset(p, l), .v_off = kv_pool_v_offset(p, l)};
            for (uint32_t h = 0; h < hp->n_kv_head; h++) {
                for (uint32_t d = 0; d < 2 * D; d++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    float f = (float)(x >> 40) / 4194304.0f - 2.0f;
                    if (d < D) k[d] = f; else v[d - D] = f;
                }
                if (t == DX_Q8_0) {
                    kern_attn_store_q8(&L, blk + L.k_off, blk + L.v_off, (int)h, (int)(pos % bs), k, v);
                    continue;
                }
                size_t es = t == DX_F32 ? 4 : 2;
                for (uint32_t d = 0; d < D; d++) {
                    size_t ki = kern_attn_k_index(&L, (int)h, (int)(pos % bs), (int)d);
                    size_t vi = kern_attn_v_index(&L, (int)h, (int)(pos % bs), (int)d);
                    uint16_t hk = t == DX_F16 ? dx_f32_to_f16(k[d]) : dx_f32_to_bf16(k[d]);
                    uint16_t hv = t == DX_F16 ? dx_f32_to_f16(v[d]) : dx_f32_to_bf16(v[d]);
                    memcpy(blk + L.k_off + ki * es, t == DX_F32 ? (void *)&k[d] : (void *)&hk, es);
                    memcpy(blk + L.v_off + vi * es, t == DX_F32 ? (void *)&v[d] : (void *)&hv, es);
                }
            }
        }
}

int bench_engine_parse_kv(const char *list, int *types, int *n)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", list ? list : ENGINE_DEFAULT_KV_DTYPE);
    *n = 0;
    for (char *save = NULL, *tk = strtok_r(buf, ",", &save); tk; tk = strtok_r(NULL, ",", &save)) {
        if (*n == BENCH_ENGINE_MAX_KV)
            return dx_errf(DX_EINVAL, "more than %d KV dtypes in '%s'", BENCH_ENGINE_MAX_KV, list);
        int rc = engine_parse_kv_dtype(tk, &types[(*n)++]);
        if (rc) return rc;
    }
    return *n ? 0 : dx_errf(DX_EINVAL, "no KV dtype in '%s'", list);
}

static double tensor_bytes(const model_tensor *t)
{
    return t->data ? (double)dx_dtype_row_bytes(t->type, t->ne[0]) * (double)t->ne[1] : 0;
}

/* Bytes of the weights a decode step streams: every layer's matmuls — of a
 * mixture of experts, the router and the n_expert_used experts one token
 * runs — and the output head (the embedding is only gathered, one row per
 * token). */
static double weight_bytes(const model *m)
{
    const model_hparams *hp = model_hp(m);
    double b = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const model_layer *L = model_layer_at(m, l);
        const model_tensor *t[8] = {&L->wq,     &L->wk,   &L->wv,     &L->wo,
                                    &L->w_gate, &L->w_up, &L->w_down, &L->ffn_gate_inp};
        for (int i = 0; i < 8; i++) b += tensor_bytes(t[i]);
        const model_tensor *x[3] = {&L->ffn_gate_exps, &L->ffn_up_exps, &L->ffn_down_exps};
        for (int i = 0; i < 3; i++) b += tensor_bytes(x[i]) * hp->n_expert_used;
    }
    const model_tensor *o = model_output(m);
    return b + (double)dx_dtype_row_bytes(o->type, o->ne[0]) * (double)o->ne[1];
}

/* ---- memory read rate: every thread sums its slice of a 1 GiB buffer ---- */

#define MEM_BYTES ((size_t)1 << 30)

typedef struct {
    const uint8_t *buf;
    size_t slice;
    uint64_t sink[64];
} mem_job;

static void mem_task(void *arg, size_t task, int tid)
{
    mem_job *j = arg;
    const uint8_t *p = j->buf + task * j->slice;
    uint64_t acc = 0;
#if defined(__AVX2__)
    __m256i a = _mm256_setzero_si256(), b = a;
    for (size_t i = 0; i < j->slice; i += 128) {
        a = _mm256_add_epi64(a, _mm256_add_epi64(_mm256_loadu_si256((const __m256i *)(p + i)),
                                                 _mm256_loadu_si256((const __m256i *)(p + i + 32))));
        b = _mm256_add_epi64(b, _mm256_add_epi64(_mm256_loadu_si256((const __m256i *)(p + i + 64)),
                                                 _mm256_loadu_si256((const __m256i *)(p + i + 96))));
    }
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, _mm256_add_epi64(a, b));
    acc = v[0] + v[1] + v[2] + v[3];
#else
    for (size_t i = 0; i < j->slice; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        acc += x;
    }
#endif
    j->sink[tid % 64] += acc;
}

/* GB/s of n_threads threads reading MEM_BYTES (the best of 3 passes, after
 * one that faults the pages in). */
static double mem_read_rate(dx_tpool *tp, int n_threads)
{
    uint8_t *buf = dx_aligned_alloc(4096, MEM_BYTES);
    if (!buf) return 0;
    memset(buf, 1, MEM_BYTES);
    size_t tasks = (size_t)n_threads * 4;
    mem_job j = {buf, MEM_BYTES / tasks, {0}};
    double best = 0;
    for (int r = 0; r < 4; r++) {
        uint64_t t0 = dx_now_ns();
        dx_tpool_run(tp, tasks, mem_task, &j);
        double gb_s = (double)(j.slice * tasks) / (double)(dx_now_ns() - t0);
        if (r && gb_s > best) best = gb_s;
    }
    dx_aligned_free(buf);
    return best;
}

/* One KV dtype's pool, forward pass and tokens, its depth filled. */
static int ctx_create(const bench_engine_config *cfg, const model *m, dx_tpool *tp, int kv_type,
                      bench_ctx *c)
{
    const model_hparams *hp = model_hp(m);
    uint32_t total = cfg->depth + (cfg->prompt_tokens > cfg->gen_tokens ? cfg->prompt_tokens
                                                                        : cfg->gen_tokens);
    uint32_t bs = ENGINE_DEFAULT_BLOCK_SIZE, nb = (total + bs - 1) / bs + 1;
    uint64_t fp[2];
    model_fingerprint(m, fp);
    kv_pool_config pc = {.n_layer = hp->n_layer, .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim, .block_size = bs, .dtype = kv_type,
                         .n_blocks = nb, .seed = {fp[0], fp[1]}};
    int rc = kv_pool_create(&pc, &c->pool);
    if (!rc) rc = fwd_create(m, c->pool, tp, CHUNK, 1, total + 1, &c->f);
    c->blocks = dx_malloc(nb * sizeof(int32_t));
    c->tokens = dx_malloc((total + 1) * sizeof(int32_t));
    c->logits = dx_malloc((size_t)hp->n_vocab * sizeof(float));
    if (!rc && (!c->blocks || !c->tokens || !c->logits)) rc = dx_errf(DX_ENOMEM, "out of memory");
    if (!rc) rc = kv_pool_alloc_n(c->pool, nb, c->blocks);
    if (rc) return rc;
    uint64_t x = 12345;
    for (uint32_t i = 0; i <= total; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        c->tokens[i] = (int32_t)((x >> 33) % hp->n_vocab);
    }
    c->weight_bytes = weight_bytes(m);
    if (!cfg->synthetic_depth) return prefill(c, 0, cfg->depth);
    synthetic_fill(m, c, cfg->depth);
    return 0;
}

static void ctx_free(bench_ctx *c)
{
    fwd_destroy(c->f);
    dx_free(c->blocks);
    dx_free(c->tokens);
    dx_free(c->logits);
    kv_pool_destroy(c->pool);
}

int bench_engine_run(const bench_engine_config *cfg_in, const model *m, bench_engine_result *out)
{
    bench_engine_config cfg = *cfg_in;
    if (cfg.n_threads <= 0) cfg.n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (!cfg.reps) cfg.reps = BENCH_ENGINE_DEFAULT_REPS;
    if (cfg.reps > 64) cfg.reps = 64;
    memset(out, 0, sizeof *out);
    int types[BENCH_ENGINE_MAX_KV], n_kv;
    int rc = bench_engine_parse_kv(cfg.kv_dtype, types, &n_kv);
    if (rc) return rc;
    dx_tpool *tp = NULL;
    bench_ctx *c = dx_calloc((size_t)n_kv, sizeof *c);
    if (!c) return dx_errf(DX_ENOMEM, "out of memory");
    rc = dx_tpool_create(cfg.n_threads, &tp);
    for (int k = 0; !rc && k < n_kv; k++) rc = ctx_create(&cfg, m, tp, types[k], &c[k]);
    for (uint32_t r = 0; !rc && r < cfg.reps; r++) /* interleaved: run r of each in turn */
        for (int k = 0; !rc && k < n_kv; k++) rc = run_once(&cfg, &c[k], r);
    if (!rc) {
        out->isa = kern_isa_name(kern_get_isa());
        out->decode = kern_decode_name(kern_get_decode());
        out->n_threads = cfg.n_threads;
        out->n_kv = n_kv;
        for (int k = 0; k < n_kv; k++) {
            out->kv[k].kv_type = types[k];
            results(&cfg, &c[k], &out->kv[k]);
        }
        out->mem_gb_s = mem_read_rate(tp, cfg.n_threads);
    }
    for (int k = 0; k < n_kv; k++) ctx_free(&c[k]);
    dx_free(c);
    dx_tpool_destroy(tp);
    return rc;
}
