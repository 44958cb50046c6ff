/* bench_kld: KL divergence and top-1 agreement between KV dtypes (see .h).
 *
 * Per position, in double: each dtype's log-softmax (max + log-sum-exp),
 * then for each pair KL(P || Q) = sum_v p_v (log p_v - log q_v), whether
 * the argmaxes agree and the mean squared logit difference.  Positions are
 * scored in parallel into per-position slots and summed in position order
 * afterwards, so the figures do not depend on the thread count. */
#include "bench/bench_kld.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_tpool.h"
#include "bench/bench_engine.h"
#include "engine/engine.h"
#include "engine/fwd.h"
#include "engine/kv_pool.h"

#define MAX_PAIRS (BENCH_KLD_MAX_KV * (BENCH_KLD_MAX_KV - 1) / 2)

static const uint32_t k_depth[BENCH_KLD_N_DEPTHS + 1] = {0, 1024, 4096, 8192, 16384, UINT32_MAX};

uint32_t bench_kld_depth(int d)
{
    return k_depth[d];
}

/* One dtype's pool and forward pass over the whole window. */
typedef struct {
    kv_pool *pool;
    fwd *f;
    int32_t *blocks;
    float *logits; /* [chunk][n_vocab] */
} kld_run;

typedef struct {
    int n_kv, n_pairs;
    int pi[MAX_PAIRS], pj[MAX_PAIRS];
    uint32_t V;
    kld_run *runs;
    uint32_t p0; /* first position of the chunk */
    /* per position [pos][pair] */
    float *kld, *dl2;
    uint8_t *same;
    double *entropy; /* [pos] */
} kld_job;

static int kld_run_create(const model *m, dx_tpool *tp, int kv_type, uint32_t ctx, uint32_t chunk,
                          kld_run *r)
{
    const model_hparams *hp = model_hp(m);
    uint32_t bs = ENGINE_DEFAULT_BLOCK_SIZE, nb = (ctx + bs - 1) / bs;
    uint64_t fp[2];
    model_fingerprint(m, fp);
    kv_pool_config pc = {.n_layer = hp->n_layer,
                         .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim,
                         .block_size = bs,
                         .dtype = kv_type,
                         .n_blocks = nb,
                         .seed = {fp[0], fp[1]}};
    int rc = kv_pool_create(&pc, &r->pool);
    if (!rc) rc = fwd_create(m, r->pool, tp, chunk, 1, ctx, &r->f);
    r->blocks = dx_malloc(nb * sizeof *r->blocks);
    r->logits = dx_malloc((size_t)chunk * hp->n_vocab * sizeof *r->logits);
    if (!rc && (!r->blocks || !r->logits))
        rc = dx_errf(DX_ENOMEM, "bench kld: logits of %u tokens", chunk);
    if (!rc) rc = kv_pool_alloc_n(r->pool, nb, r->blocks);
    return rc;
}

static void kld_run_free(kld_run *r)
{
    fwd_destroy(r->f);
    dx_free(r->blocks);
    dx_free(r->logits);
    kv_pool_destroy(r->pool);
}

static double log_sum_exp(const float *x, uint32_t n, uint32_t *argmax)
{
    uint32_t am = 0;
    for (uint32_t v = 1; v < n; v++)
        if (x[v] > x[am]) am = v;
    double mx = x[am], s = 0;
    for (uint32_t v = 0; v < n; v++) s += exp((double)x[v] - mx);
    *argmax = am;
    return mx + log(s);
}

static void score_task(void *arg, size_t task, int tid)
{
    (void)tid;
    kld_job *j = arg;
    size_t pos = j->p0 + task;
    const float *x[BENCH_KLD_MAX_KV];
    double lse[BENCH_KLD_MAX_KV], kl[MAX_PAIRS] = {0}, d2[MAX_PAIRS] = {0}, h = 0;
    uint32_t am[BENCH_KLD_MAX_KV];
    for (int k = 0; k < j->n_kv; k++) {
        x[k] = j->runs[k].logits + task * j->V;
        lse[k] = log_sum_exp(x[k], j->V, &am[k]);
    }
    for (uint32_t v = 0; v < j->V; v++) {
        double lp[BENCH_KLD_MAX_KV], p[BENCH_KLD_MAX_KV];
        for (int k = 0; k < j->n_kv; k++) lp[k] = (double)x[k][v] - lse[k];
        for (int k = 0; k < j->n_kv - 1; k++) p[k] = exp(lp[k]);
        h -= p[0] * lp[0];
        for (int q = 0; q < j->n_pairs; q++) {
            int a = j->pi[q], b = j->pj[q];
            double d = (double)x[a][v] - (double)x[b][v];
            kl[q] += p[a] * (lp[a] - lp[b]);
            d2[q] += d * d;
        }
    }
    j->entropy[pos] = h;
    for (int q = 0; q < j->n_pairs; q++) {
        j->kld[pos * MAX_PAIRS + (size_t)q] = (float)(kl[q] > 0 ? kl[q] : 0);
        j->dl2[pos * MAX_PAIRS + (size_t)q] = (float)(d2[q] / j->V);
        j->same[pos * MAX_PAIRS + (size_t)q] = am[j->pi[q]] == am[j->pj[q]];
    }
}

/* One chunk [p0, p0 + n) through every dtype, then scored. */
static int kld_chunk(kld_job *j, dx_tpool *tp, const int32_t *tokens, uint32_t p0, uint32_t n)
{
    for (int k = 0; k < j->n_kv; k++) {
        fwd_seq s = {j->runs[k].blocks, p0, n, tokens + p0, 2};
        int rc = fwd_step(j->runs[k].f, &s, 1, j->runs[k].logits);
        if (rc) return rc;
    }
    j->p0 = p0;
    dx_tpool_run(tp, n, score_task, j);
    return 0;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Pair q's figures over positions [lo, hi) (the last predicts nothing). */
static void summarise(const kld_job *j, int q, size_t lo, size_t hi, int quantiles,
                      bench_kld_stat *st, float *tmp)
{
    double sk = 0, sd = 0, same = 0, mx = 0;
    size_t n = 0;
    for (size_t p = lo; p < hi; p++, n++) {
        float k = j->kld[p * MAX_PAIRS + (size_t)q];
        sk += k;
        sd += j->dl2[p * MAX_PAIRS + (size_t)q];
        same += j->same[p * MAX_PAIRS + (size_t)q];
        mx = k > mx ? k : mx;
        tmp[n] = k;
    }
    if (!n) return;
    *st = (bench_kld_stat){.n = n,
                           .kld_mean = sk / (double)n,
                           .kld_max = mx,
                           .same_top = same / (double)n,
                           .rms_dlogit = sqrt(sd / (double)n)};
    if (!quantiles) return;
    qsort(tmp, n, sizeof *tmp, cmp_float);
    st->kld_median = tmp[n / 2];
    st->kld_p99 = tmp[(size_t)((double)(n - 1) * 0.99)];
}

static void report(const kld_job *j, uint32_t ctx, bench_kld_result *out, float *tmp)
{
    size_t last = ctx - 1; /* position ctx-1 predicts no token of the window */
    for (int q = 0; q < j->n_pairs; q++) {
        bench_kld_stat *st = out->st[j->pi[q]][j->pj[q]];
        for (int d = 0; d < BENCH_KLD_N_DEPTHS; d++) {
            size_t lo = k_depth[d], hi = k_depth[d + 1] < last ? k_depth[d + 1] : last;
            if (lo < hi) summarise(j, q, lo, hi, 1, &st[d], tmp);
        }
        summarise(j, q, ctx / 2, last, 1, &st[BENCH_KLD_HALF], tmp);
    }
    double h = 0;
    for (size_t p = 0; p < last; p++) h += j->entropy[p];
    out->mean_entropy = last ? h / (double)last : 0;
}

int bench_kld_run(const bench_kld_config *cfg, const model *m, bench_kld_result *out)
{
    memset(out, 0, sizeof *out);
    uint32_t ctx = cfg->ctx, chunk = cfg->chunk ? cfg->chunk : BENCH_KLD_DEFAULT_CHUNK;
    if (ctx < 2 || ctx > cfg->n_tokens)
        return dx_errf(DX_EINVAL, "bench kld: a window of %u tokens from a text of %zu", ctx,
                       cfg->n_tokens);
    int types[BENCH_ENGINE_MAX_KV], n_kv, rc = bench_engine_parse_kv(cfg->kv_dtype, types, &n_kv);
    if (rc) return rc;
    const model *models[BENCH_KLD_MAX_KV];
    int is_base[BENCH_KLD_MAX_KV] = {0};
    if (cfg->base) {
        if (model_hp(cfg->base)->n_vocab != model_hp(m)->n_vocab)
            return dx_errf(DX_EINVAL, "bench kld: the base model has %u tokens, the model %u",
                           model_hp(cfg->base)->n_vocab, model_hp(m)->n_vocab);
        if (n_kv >= BENCH_KLD_MAX_KV)
            return dx_errf(DX_EINVAL, "bench kld: at most %d KV dtypes with a base model",
                           BENCH_KLD_MAX_KV - 1);
        memmove(types + 1, types, (size_t)n_kv * sizeof *types);
        n_kv++;
        is_base[0] = 1;
    }
    for (int k = 0; k < n_kv; k++) models[k] = is_base[k] ? cfg->base : m;
    if (n_kv < 2)
        return dx_errf(DX_EINVAL, "bench kld: compare two KV dtypes or more, or a base model");
    kld_job j = {.n_kv = n_kv, .V = model_hp(m)->n_vocab};
    for (int a = 0; a < n_kv; a++)
        for (int b = a + 1; b < n_kv; b++) j.pi[j.n_pairs] = a, j.pj[j.n_pairs++] = b;
    int threads = cfg->n_threads > 0 ? cfg->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    dx_tpool *tp = NULL;
    j.runs = dx_calloc((size_t)n_kv, sizeof *j.runs);
    j.kld = dx_calloc((size_t)ctx * MAX_PAIRS, sizeof *j.kld);
    j.dl2 = dx_calloc((size_t)ctx * MAX_PAIRS, sizeof *j.dl2);
    j.same = dx_calloc((size_t)ctx * MAX_PAIRS, 1);
    j.entropy = dx_calloc(ctx, sizeof *j.entropy);
    float *tmp = dx_malloc((size_t)ctx * sizeof *tmp);
    if (!j.runs || !j.kld || !j.dl2 || !j.same || !j.entropy || !tmp)
        rc = dx_errf(DX_ENOMEM, "bench kld: figures of %u positions", ctx);
    if (!rc) rc = dx_tpool_create(threads < 1 ? 1 : threads, &tp);
    for (int k = 0; !rc && k < n_kv; k++)
        rc = kld_run_create(models[k], tp, types[k], ctx, chunk, &j.runs[k]);
    uint64_t t0 = dx_now_ns();
    for (uint32_t p = 0; !rc && p < ctx; p += chunk) {
        uint32_t n = ctx - p < chunk ? ctx - p : chunk;
        rc = kld_chunk(&j, tp, cfg->tokens, p, n);
        if (!rc && cfg->progress) cfg->progress(cfg->user, p + n, ctx);
    }
    if (!rc) {
        out->n_kv = n_kv;
        out->ctx = ctx;
        memcpy(out->kv_type, types, (size_t)n_kv * sizeof *types);
        memcpy(out->is_base, is_base, sizeof is_base);
        report(&j, ctx, out, tmp);
        out->seconds = (double)(dx_now_ns() - t0) * 1e-9;
    }
    for (int k = 0; j.runs && k < n_kv; k++) kld_run_free(&j.runs[k]);
    dx_free(j.runs);
    dx_free(j.kld);
    dx_free(j.dl2);
    dx_free(j.same);
    dx_free(j.entropy);
    dx_free(tmp);
    dx_tpool_destroy(tp);
    return rc;
}
