/* bench_engine: times fwd_step directly (no scheduler, no sampling) so the
 * figures are the engine's own: pp = one sequence prefilling prompt_tokens
 * in chunks of up to 512 after `depth` tokens of context; tg = one token at
 * a time after `depth` tokens. */
#include "bench/bench_engine.h"

#include <stdlib.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_tpool.h"
#include "engine/engine.h"
#include "engine/fwd.h"
#include "engine/kern.h"
#include "engine/kv_pool.h"

#define CHUNK 512

typedef struct {
    fwd *f;
    int32_t *blocks, *tokens;
    float *logits;
} bench_ctx;

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

static int run(const bench_engine_config *cfg, bench_ctx *c, bench_engine_result *out)
{
    double pp[64], tg[64];
    uint32_t D = cfg->depth, P = cfg->prompt_tokens, G = cfg->gen_tokens;
    int rc = prefill(c, 0, D);
    if (rc) return rc;
    for (uint32_t r = 0; r < cfg->reps; r++) {
        uint64_t t0 = dx_now_ns();
        if (P && (rc = prefill(c, D, D + P))) return rc;
        pp[r] = P ? P / ((double)(dx_now_ns() - t0) * 1e-9) : 0;
        t0 = dx_now_ns();
        for (uint32_t i = 0; i < G; i++) {
            fwd_seq s = {c->blocks, D + i, 1, c->tokens + D + i, 1};
            if ((rc = fwd_step(c->f, &s, 1, c->logits))) return rc;
        }
        tg[r] = G ? G / ((double)(dx_now_ns() - t0) * 1e-9) : 0;
    }
    summarize(pp, cfg->reps, &out->pp_tok_s, &out->pp_min, &out->pp_max);
    summarize(tg, cfg->reps, &out->tg_tok_s, &out->tg_min, &out->tg_max);
    return 0;
}

int bench_engine_run(const bench_engine_config *cfg_in, const model *m, bench_engine_result *out)
{
    bench_engine_config cfg = *cfg_in;
    if (cfg.n_threads <= 0) cfg.n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (!cfg.reps) cfg.reps = 3;
    if (cfg.reps > 64) cfg.reps = 64;
    int kv_type;
    int rc = engine_parse_kv_dtype(cfg.kv_dtype, &kv_type);
    if (rc) return rc;
    const model_hparams *hp = model_hp(m);
    uint32_t total = cfg.depth + (cfg.prompt_tokens > cfg.gen_tokens ? cfg.prompt_tokens
                                                                      : cfg.gen_tokens);
    uint32_t bs = 16, nb = (total + bs - 1) / bs + 1;
    uint64_t fp[2];
    model_fingerprint(m, fp);
    kv_pool_config pc = {.n_layer = hp->n_layer, .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim, .block_size = bs, .dtype = kv_type,
                         .n_blocks = nb, .seed = {fp[0], fp[1]}};
    kv_pool *pool = NULL;
    dx_tpool *tp = NULL;
    bench_ctx c = {0};
    rc = kv_pool_create(&pc, &pool);
    if (!rc) rc = dx_tpool_create(cfg.n_threads, &tp);
    if (!rc) rc = fwd_create(m, pool, tp, CHUNK, 1, total + 1, &c.f);
    c.blocks = dx_malloc(nb * sizeof(int32_t));
    c.tokens = dx_malloc((total + 1) * sizeof(int32_t));
    c.logits = dx_malloc((size_t)hp->n_vocab * sizeof(float));
    if (!rc && (!c.blocks || !c.tokens || !c.logits)) rc = dx_errf(DX_ENOMEM, "out of memory");
    if (!rc) rc = kv_pool_alloc_n(pool, nb, c.blocks);
    if (!rc) {
        uint64_t x = 12345;
        for (uint32_t i = 0; i <= total; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            c.tokens[i] = (int32_t)((x >> 33) % hp->n_vocab);
        }
        out->isa = kern_isa_name(kern_get_isa());
        rc = run(&cfg, &c, out);
    }
    fwd_destroy(c.f);
    dx_free(c.blocks);
    dx_free(c.tokens);
    dx_free(c.logits);
    dx_tpool_destroy(tp);
    kv_pool_destroy(pool);
    return rc;
}
