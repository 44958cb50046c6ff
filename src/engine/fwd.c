/* fwd: transformer forward pass (llama / qwen2 / qwen3 / qwen3moe) over
 * paged KV.  A mixture-of-experts model's FFN is engine/moe's.
 *
 * One step processes T tokens from several sequences together: every matmul
 * sees all T tokens (weights stream from memory once per step, not once per
 * sequence), attention runs per sequence over its block table.  Work is
 * spread over the thread pool as independent tasks (output-column ranges of a
 * matmul, (sequence, query chunk, kv head) for attention, token ranges for
 * per-token ops); each output element is computed by exactly one task with
 * a fixed reduction order, which is what makes results batch-invariant. */
#include "engine/fwd.h"

#include <math.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern.h"
#include "engine/moe.h"

#define ATTN_Q_CHUNK 64 /* queries per attention task */
#define TOK_CHUNK 16    /* tokens per task for per-token ops */
/* A sequence with at most this many tokens in a step and a history longer
 * than one split spreads its splits over tasks (kern_attn_part), merged in
 * a second run: a decode step over a long history is then as parallel as
 * its splits, not only its kv heads.  The bits are the same either way. */
#define ATTN_SPLIT_MAX_Q 16
/* Bytes of split parts one step may hold (at least one sequence's worth);
 * sequences past it run unsplit. */
#define ATTN_PART_BUDGET ((size_t)8 << 20)

struct fwd {
    const model *m;
    const model_hparams *hp;
    kv_pool *pool;
    dx_tpool *tp;
    int n_threads;
    uint32_t max_tokens, max_seqs, n_ctx;
    uint32_t q_dim, kv_dim;
    float *x;    /* [T][n_embd] residual stream */
    float *xb;   /* [T][n_embd] normed input of a block */
    float *q;    /* [T][q_dim] */
    float *k;    /* [T][kv_dim] */
    float *v;    /* [T][kv_dim] */
    float *att;  /* [T][q_dim] attention output */
    float *gate; /* [T][n_ff] */
    float *up;   /* [T][n_ff] */
    float *tmp;  /* [T][n_embd] block output before the residual add */
    void *act[3];      /* prepared matmul activations (one per activation kind in a group) */
    size_t act_bytes;
    void **attn_scratch; /* per thread */
    float *rope;       /* [n_ctx][head_dim/2][cos, sin] */
    int32_t *tok_seq;  /* [T] which sequence */
    uint32_t *tok_pos; /* [T] position */
    uint32_t *seq_first; /* [n_seqs] first token index of each sequence */
    const fwd_seq *cur;  /* the step being computed */
    /* attention plan of the step: tasks of sequence s are
     * [attn_first[s], attn_first[s+1]); a split sequence's parts start at
     * part + part_off[s] (SIZE_MAX: not split); merge_seq lists the split
     * sequences */
    size_t *attn_first, *part_off;
    uint32_t *merge_seq, n_merge;
    float *part;            /* [part_floats] */
    size_t part_floats;
    moe *moe;           /* the FFN of an MoE model, else NULL */
    int32_t *route_log; /* fwd_set_route_log's, or NULL */
    fwd_stats stats;
};

/* ---- matmul groups: up to 3 matmuls over the same input in one pool run ---- */

typedef struct {
    const model_tensor *w;
    float *y;
    size_t ldy;
    const void *act;
    size_t chunk, first_task, n_tasks;
} mm_job;

typedef struct {
    mm_job job[3];
    int n;
    size_t n_tok, n_tasks;
} mm_group;

static void mm_task(void *arg, size_t task, int tid)
{
    (void)tid;
    mm_group *g = arg;
    int j = 0;
    while (task >= g->job[j].first_task + g->job[j].n_tasks) j++;
    const mm_job *b = &g->job[j];
    size_t n_out = b->w->ne[1], o0 = (task - b->first_task) * b->chunk;
    size_t o1 = o0 + b->chunk < n_out ? o0 + b->chunk : n_out;
    kern_matmul(b->w->type, b->w->data, b->w->ne[0], o0, o1, b->act, g->n_tok, b->y, b->ldy);
}

/* Runs y_i = W_i x for up to three weights sharing the input x [n_tok][n_in]. */
static void matmul_group(fwd *f, const float *x, size_t n_tok, const model_tensor *const *w,
                         float *const *y, int n)
{
    mm_group g = {.n = n, .n_tok = n_tok};
    /* one prep per activation kind: weights of different types that consume
     * the same layout (q4_0 and q5_0 in one QKV group) share it */
    int prepped_kind[3] = {-1, -1, -1};
    for (int i = 0; i < n; i++) {
        int t = w[i]->type, kind = kern_act_kind(t), slot = 0;
        DX_ASSERT(kind >= 0); /* the loader admits only types with kernels */
        while (prepped_kind[slot] >= 0 && prepped_kind[slot] != kind) slot++;
        if (prepped_kind[slot] < 0) {
            kern_act_prep(t, x, n_tok, w[i]->ne[0], f->act[slot]);
            prepped_kind[slot] = kind;
        }
        size_t n_out = w[i]->ne[1], tile = kern_matmul_tile(t);
        size_t want = (size_t)f->n_threads * 4, chunk = (n_out + want - 1) / want;
        chunk = (chunk + tile - 1) / tile * tile;
        g.job[i] = (mm_job){w[i], y[i], n_out, f->act[slot], chunk, g.n_tasks,
                            (n_out + chunk - 1) / chunk};
        g.n_tasks += g.job[i].n_tasks;
    }
    dx_tpool_run(f->tp, g.n_tasks, mm_task, &g);
}

static void matmul1(fwd *f, const float *x, size_t n_tok, const model_tensor *w, float *y)
{
    const model_tensor *ws[1] = {w};
    float *ys[1] = {y};
    matmul_group(f, x, n_tok, ws, ys, 1);
}

/* ---- per-token ops ---- */

typedef struct {
    fwd *f;
    size_t n_tok;
    uint32_t layer;
    void (*fn)(fwd *f, uint32_t layer, size_t t);
} tok_job;

static void tok_task(void *arg, size_t task, int tid)
{
    (void)tid;
    tok_job *j = arg;
    size_t t1 = (task + 1) * TOK_CHUNK < j->n_tok ? (task + 1) * TOK_CHUNK : j->n_tok;
    for (size_t t = task * TOK_CHUNK; t < t1; t++) j->fn(j->f, j->layer, t);
}

static void for_tokens(fwd *f, size_t n_tok, uint32_t layer, void (*fn)(fwd *, uint32_t, size_t))
{
    tok_job j = {f, n_tok, layer, fn};
    dx_tpool_run(f->tp, (n_tok + TOK_CHUNK - 1) / TOK_CHUNK, tok_task, &j);
}

static void attn_norm_tok(fwd *f, uint32_t l, size_t t)
{
    const model_layer *L = model_layer_at(f->m, l);
    size_t e = f->hp->n_embd;
    kern_rmsnorm(f->x + t * e, L->attn_norm.data, f->hp->rms_eps, e, f->xb + t * e);
}

static void ffn_norm_tok(fwd *f, uint32_t l, size_t t)
{
    const model_layer *L = model_layer_at(f->m, l);
    size_t e = f->hp->n_embd;
    kern_rmsnorm(f->x + t * e, L->ffn_norm.data, f->hp->rms_eps, e, f->xb + t * e);
}

static void store_kv(float *src, uint8_t *dst, int dtype, size_t n)
{
    if (dtype == DX_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dtype == DX_BF16) {
        dx_f32_to_bf16_row(src, (uint16_t *)dst, n);
    } else {
        size_t i = 0;
#if defined(__F16C__)
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(dst + 2 * i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
        dx_f32_to_f16_row(src + i, (uint16_t *)dst + i, n - i);
    }
}

/* One token's K row into the block's transposed K (kern.h): dim d goes to
 * element d*block_size; converted as a row first, so the bits are store_kv's. */
static void store_k_transposed(float *src, uint8_t *dst, int dtype, size_t n, size_t bs)
{
    uint8_t row[4 * 512]; /* head_dim <= 512 (model.c) */
    size_t es = dx_dtype_block_bytes(dtype);
    DX_ASSERT(n * es <= sizeof row);
    store_kv(src, row, dtype, n);
    for (size_t d = 0; d < n; d++) memcpy(dst + d * bs * es, row + d * es, es);
}

static kern_attn_layout attn_layout(const fwd *f, uint32_t l);

/* Biases, q/k norm, RoPE, then K/V into the sequence's KV block. */
static void qkv_post_tok(fwd *f, uint32_t l, size_t t)
{
    const model_hparams *hp = f->hp;
    const model_layer *L = model_layer_at(f->m, l);
    uint32_t D = hp->head_dim, pos = f->tok_pos[t];
    float *q = f->q + t * f->q_dim, *k = f->k + t * f->kv_dim, *v = f->v + t * f->kv_dim;
    if (hp->qkv_bias) {
        kern_add(q, L->bq.data, f->q_dim);
        kern_add(k, L->bk.data, f->kv_dim);
        kern_add(v, L->bv.data, f->kv_dim);
    }
    const float *cs = f->rope + (size_t)pos * D;
    for (uint32_t h = 0; h < hp->n_head; h++) {
        if (hp->qk_norm) kern_rmsnorm(q + h * D, L->q_norm.data, hp->rms_eps, D, q + h * D);
        kern_rope(q + h * D, (int)D, cs, hp->rope_neox);
    }
    for (uint32_t h = 0; h < hp->n_kv_head; h++) {
        if (hp->qk_norm) kern_rmsnorm(k + h * D, L->k_norm.data, hp->rms_eps, D, k + h * D);
        kern_rope(k + h * D, (int)D, cs, hp->rope_neox);
    }
    uint32_t bs = kv_pool_block_size(f->pool);
    int dtype = kv_pool_dtype(f->pool);
    size_t es = dx_dtype_block_bytes(dtype);
    int32_t blk = f->cur[f->tok_seq[t]].blocks[pos / bs];
    uint8_t *base = kv_pool_block_ptr(f->pool, blk);
    size_t koff = kv_pool_k_offset(f->pool, l), voff = kv_pool_v_offset(f->pool, l);
    if (dtype == DX_Q8_0) { /* quantised once, here, from this token's rows alone */
        kern_attn_layout L = attn_layout(f, l);
        for (uint32_t h = 0; h < hp->n_kv_head; h++)
            kern_attn_store_q8(&L, base + koff, base + voff, (int)h, (int)(pos % bs), k + h * D,
                               v + h * D);
        return;
    }
    for (uint32_t h = 0; h < hp->n_kv_head; h++) {
        size_t krow = ((size_t)h * D * bs + pos % bs) * es, vrow = ((size_t)h * bs + pos % bs) * D * es;
        store_k_transposed(k + h * D, base + koff + krow, dtype, D, bs);
        store_kv(v + h * D, base + voff + vrow, dtype, D);
    }
}

static void swiglu_tok(fwd *f, uint32_t l, size_t t)
{
    (void)l;
    size_t ff = f->hp->n_ff;
    kern_swiglu(f->gate + t * ff, f->up + t * ff, ff);
}

static void residual_tok(fwd *f, uint32_t l, size_t t)
{
    (void)l;
    size_t e = f->hp->n_embd;
    kern_add(f->x + t * e, f->tmp + t * e, e);
}

/* ---- attention: tasks are (sequence, query chunk, kv head), or for a split
 * sequence (sequence, split, kv head) then (sequence, kv head) merges ---- */

typedef struct {
    fwd *f;
    kern_attn_layout L;
    size_t n_seqs;
} attn_job;

static size_t attn_n_splits(const fwd_seq *sq)
{
    return (sq->pos0 + sq->n_tokens - 1) / KERN_ATTN_SPLIT + 1;
}

/* Floats of one split sequence's parts: [split][kv head][token][G][PF]. */
static size_t attn_part_floats(const fwd *f, const kern_attn_layout *L, const fwd_seq *sq)
{
    return attn_n_splits(sq) * sq->n_tokens * f->hp->n_head * kern_attn_part_floats(L);
}

static void attn_task(void *arg, size_t task, int tid)
{
    attn_job *j = arg;
    fwd *f = j->f;
    size_t s = 0;
    while (task >= f->attn_first[s + 1]) s++;
    const fwd_seq *sq = &f->cur[s];
    size_t local = task - f->attn_first[s], n_kv = f->hp->n_kv_head, t0 = f->seq_first[s];
    size_t chunk = local / n_kv, h = local % n_kv;
    const float *q = f->q + t0 * f->q_dim;
    if (f->part_off[s] != SIZE_MAX) { /* chunk is the split */
        size_t rows = sq->n_tokens * (f->hp->n_head / n_kv), PF = kern_attn_part_floats(&j->L);
        float *part = f->part + f->part_off[s] + (chunk * n_kv + h) * rows * PF;
        kern_attn_part(&j->L, sq->blocks, sq->pos0, sq->n_tokens, q, (int)h, chunk, part,
                       f->attn_scratch[tid]);
        return;
    }
    size_t q0 = chunk * ATTN_Q_CHUNK;
    size_t nq = sq->n_tokens - q0 < ATTN_Q_CHUNK ? sq->n_tokens - q0 : ATTN_Q_CHUNK;
    kern_attn(&j->L, sq->blocks, sq->pos0 + q0, nq, q + q0 * f->q_dim,
              f->att + (t0 + q0) * f->q_dim, (int)h, (int)h + 1, f->attn_scratch[tid]);
}

static void merge_task(void *arg, size_t task, int tid)
{
    (void)tid;
    attn_job *j = arg;
    fwd *f = j->f;
    size_t n_kv = f->hp->n_kv_head, s = f->merge_seq[task / n_kv], h = task % n_kv;
    const fwd_seq *sq = &f->cur[s];
    size_t rows = sq->n_tokens * (f->hp->n_head / n_kv), PF = kern_attn_part_floats(&j->L);
    kern_attn_merge(&j->L, sq->pos0, sq->n_tokens, (int)h, f->part + f->part_off[s] + h * rows * PF,
                    n_kv * rows * PF, f->att + (size_t)f->seq_first[s] * f->q_dim);
}

static kern_attn_layout attn_layout(const fwd *f, uint32_t l)
{
    const model_hparams *hp = f->hp;
    return (kern_attn_layout){.base = kv_pool_base(f->pool),
                              .block_bytes = kv_pool_block_bytes(f->pool),
                              .k_off = kv_pool_k_offset(f->pool, l),
                              .v_off = kv_pool_v_offset(f->pool, l),
                              .kv_type = kv_pool_dtype(f->pool),
                              .block_size = (int)kv_pool_block_size(f->pool),
                              .head_dim = (int)hp->head_dim,
                              .n_head = (int)hp->n_head,
                              .n_kv_head = (int)hp->n_kv_head,
                              .scale = 1.0f / sqrtf((float)hp->head_dim)};
}

/* The step's attention tasks: which sequences split (the budget taken in
 * batch order) and where each sequence's tasks start. */
static void attn_plan(fwd *f, const fwd_seq *seqs, size_t n_seqs)
{
    kern_attn_layout L = attn_layout(f, 0);
    size_t n_tasks = 0, used = 0, n_kv = f->hp->n_kv_head;
    f->n_merge = 0;
    for (size_t s = 0; s < n_seqs; s++) {
        const fwd_seq *sq = &seqs[s];
        size_t need = attn_part_floats(f, &L, sq);
        f->attn_first[s] = n_tasks;
        f->part_off[s] = SIZE_MAX;
        if (sq->n_tokens <= ATTN_SPLIT_MAX_Q && attn_n_splits(sq) > 1 &&
            used + need <= f->part_floats) {
            f->part_off[s] = used;
            used += need;
            f->merge_seq[f->n_merge++] = (uint32_t)s;
            n_tasks += attn_n_splits(sq) * n_kv;
        } else {
            n_tasks += (sq->n_tokens + ATTN_Q_CHUNK - 1) / ATTN_Q_CHUNK * n_kv;
        }
    }
    f->attn_first[n_seqs] = n_tasks;
}

/* What a step's attention does, for fwd_stats: 4*head_dim FLOPs per query
 * head per visible key (QK and PV), and each key's K and V read once. */
static void attn_count(fwd *f, const fwd_seq *seqs, size_t n_seqs)
{
    const model_hparams *hp = f->hp;
    double keys = 0, ctx = 0;
    for (size_t s = 0; s < n_seqs; s++) {
        double p0 = seqs[s].pos0, n = seqs[s].n_tokens;
        keys += n * p0 + n * (n + 1) / 2;
        ctx += p0 + n;
    }
    /* bytes a key's head takes (q8_0: quants and scales) */
    double es = (double)kern_attn_head_bytes(kv_pool_dtype(f->pool), 1, hp->head_dim);
    f->stats.attn_flop += keys * 4.0 * hp->head_dim * hp->n_head * hp->n_layer;
    f->stats.attn_bytes += ctx * 2.0 * hp->n_kv_head * es * hp->n_layer;
}

static void attention(fwd *f, uint32_t l, size_t n_seqs)
{
    uint64_t t0 = dx_now_ns();
    attn_job j = {.f = f, .L = attn_layout(f, l), .n_seqs = n_seqs};
    dx_tpool_run(f->tp, f->attn_first[n_seqs], attn_task, &j);
    if (f->n_merge) dx_tpool_run(f->tp, (size_t)f->n_merge * f->hp->n_kv_head, merge_task, &j);
    f->stats.attn_ns += dx_now_ns() - t0;
}

static void layer(fwd *f, uint32_t l, size_t T, size_t n_seqs)
{
    const model_layer *L = model_layer_at(f->m, l);
    for_tokens(f, T, l, attn_norm_tok);
    const model_tensor *wqkv[3] = {&L->wq, &L->wk, &L->wv};
    float *yqkv[3] = {f->q, f->k, f->v};
    matmul_group(f, f->xb, T, wqkv, yqkv, 3);
    for_tokens(f, T, l, qkv_post_tok);
    attention(f, l, n_seqs);
    matmul1(f, f->att, T, &L->wo, f->tmp);
    for_tokens(f, T, l, residual_tok);
    for_tokens(f, T, l, ffn_norm_tok);
    if (f->moe) {
        int32_t *route = f->route_log ? f->route_log + (size_t)l * T * f->hp->n_expert_used : NULL;
        uint64_t t0 = dx_now_ns();
        moe_ffn(f->moe, f->tp, L, f->xb, T, f->tmp, route);
        f->stats.moe_ns += dx_now_ns() - t0;
    } else {
        const model_tensor *wgu[2] = {&L->w_gate, &L->w_up};
        float *ygu[2] = {f->gate, f->up};
        matmul_group(f, f->xb, T, wgu, ygu, 2);
        for_tokens(f, T, l, swiglu_tok);
        matmul1(f, f->gate, T, &L->w_down, f->tmp);
    }
    for_tokens(f, T, l, residual_tok);
}

static int embed(fwd *f, const int32_t *tokens, size_t n, float *x)
{
    const model_tensor *te = model_tok_embd(f->m);
    size_t e = f->hp->n_embd, rb = dx_dtype_row_bytes(te->type, e);
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint64_t)tokens[i] >= te->ne[1])
            return dx_errf(DX_ERANGE, "token id %d is outside the vocabulary (%llu)", tokens[i],
                           (unsigned long long)te->ne[1]);
        dx_dtype_to_f32_row(te->type, (const uint8_t *)te->data + (size_t)tokens[i] * rb, x + i * e,
                            e);
    }
    return 0;
}

int fwd_step(fwd *f, const fwd_seq *seqs, size_t n_seqs, float *logits)
{
    size_t T = 0;
    uint64_t t_start = dx_now_ns();
    if (n_seqs > f->max_seqs)
        return dx_errf(DX_EINVAL, "batch of %zu sequences exceeds %u", n_seqs, f->max_seqs);
    for (size_t s = 0; s < n_seqs; s++) {
        if (seqs[s].n_tokens == 0 || seqs[s].pos0 + seqs[s].n_tokens > f->n_ctx)
            return dx_errf(DX_EINVAL, "sequence %zu: tokens [%u, %u) outside the context of %u", s,
                           seqs[s].pos0, seqs[s].pos0 + seqs[s].n_tokens, f->n_ctx);
        if (T + seqs[s].n_tokens > f->max_tokens)
            return dx_errf(DX_EINVAL, "batch exceeds %u tokens", f->max_tokens);
        f->seq_first[s] = (uint32_t)T;
        int rc = embed(f, seqs[s].tokens, seqs[s].n_tokens, f->x + T * f->hp->n_embd);
        if (rc) return rc;
        for (uint32_t i = 0; i < seqs[s].n_tokens; i++) {
            f->tok_seq[T + i] = (int32_t)s;
            f->tok_pos[T + i] = seqs[s].pos0 + i;
        }
        T += seqs[s].n_tokens;
    }
    f->cur = seqs;
    attn_plan(f, seqs, n_seqs);
    attn_count(f, seqs, n_seqs);
    for (uint32_t l = 0; l < f->hp->n_layer; l++) layer(f, l, T, n_seqs);

    /* logits for the requested rows: gather, final norm, output head */
    size_t rows = 0, e = f->hp->n_embd;
    const model_tensor *on = model_output_norm(f->m);
    for (size_t s = 0; s < n_seqs; s++) {
        size_t first = f->seq_first[s], n = seqs[s].n_tokens;
        size_t from = seqs[s].logits == 2 ? first : first + n - 1;
        for (size_t t = seqs[s].logits ? from : first + n; t < first + n; t++, rows++)
            kern_rmsnorm(f->x + t * e, on->data, f->hp->rms_eps, e, f->xb + rows * e);
    }
    if (rows) matmul1(f, f->xb, rows, model_output(f->m), logits);
    f->cur = NULL;
    f->stats.steps++;
    f->stats.tokens += T;
    f->stats.step_ns += dx_now_ns() - t_start;
    return 0;
}

void fwd_get_stats(const fwd *f, fwd_stats *out)
{
    *out = f->stats;
}

void fwd_reset_stats(fwd *f)
{
    memset(&f->stats, 0, sizeof f->stats);
}

uint32_t fwd_n_vocab(const fwd *f)
{
    return f->hp->n_vocab;
}

void fwd_set_route_log(fwd *f, int32_t *route)
{
    f->route_log = route;
}

static int build_rope(fwd *f)
{
    uint32_t D = f->hp->head_dim, half = D / 2;
    f->rope = dx_malloc((size_t)f->n_ctx * D * sizeof(float));
    if (!f->rope) return dx_errf(DX_ENOMEM, "fwd: rope table for %u positions", f->n_ctx);
    const float *div = model_rope_freqs(f->m); /* Llama 3 rope scaling, or NULL */
    for (uint32_t i = 0; i < half; i++) {
        double theta = pow((double)f->hp->rope_base, -2.0 * i / (double)D);
        if (div) theta /= div[i];
        for (uint32_t p = 0; p < f->n_ctx; p++) {
            f->rope[(size_t)p * D + 2 * i] = (float)cos(p * theta);
            f->rope[(size_t)p * D + 2 * i + 1] = (float)sin(p * theta);
        }
    }
    return 0;
}

/* Preps a matmul group may need at once: the most activation kinds among
 * the q/k/v weights of a layer (gate/up are two), so the third buffer
 * exists only for a file that mixes three kinds in one QKV group. */
static int act_slots(const model *m)
{
    int most = 2;
    for (uint32_t l = 0; l < model_hp(m)->n_layer; l++) {
        const model_layer *L = model_layer_at(m, l);
        int q = kern_act_kind(L->wq.type), k = kern_act_kind(L->wk.type),
            v = kern_act_kind(L->wv.type);
        if (q != k && q != v && k != v) most = 3;
    }
    return most;
}

static int alloc_buffers(fwd *f)
{
    const model_hparams *hp = f->hp;
    /* an MoE model's FFN has buffers of its own (moe_create) */
    size_t ff = hp->n_expert ? 1 : hp->n_ff;
    size_t T = f->max_tokens, big = ff > hp->n_embd ? ff : hp->n_embd;
    if (f->q_dim > big) big = f->q_dim;
    float **bufs[] = {&f->x, &f->xb, &f->q, &f->k, &f->v, &f->att, &f->gate, &f->up, &f->tmp};
    size_t widths[] = {hp->n_embd, hp->n_embd, f->q_dim, f->kv_dim, f->kv_dim,
                       f->q_dim,   ff,         ff,       hp->n_embd};
    for (size_t i = 0; i < DX_ARRAY_LEN(bufs); i++)
        if (!(*bufs[i] = dx_aligned_alloc(64, T * widths[i] * sizeof(float))))
            return dx_errf(DX_ENOMEM, "fwd: activations for %zu tokens", (size_t)T);
    /* activations for any weight type, for the widest input */
    f->act_bytes = kern_act_bytes_max(T, big);
    for (int i = 0; i < act_slots(f->m); i++)
        if (!(f->act[i] = dx_aligned_alloc(64, f->act_bytes)))
            return dx_errf(DX_ENOMEM, "fwd: %zu-byte quantised activations", f->act_bytes);
    f->attn_scratch = dx_calloc((size_t)f->n_threads, sizeof(void *));
    if (!f->attn_scratch) return dx_errf(DX_ENOMEM, "fwd: attention scratch");
    kern_attn_layout L = {.kv_type = kv_pool_dtype(f->pool),
                          .block_size = (int)kv_pool_block_size(f->pool),
                          .head_dim = (int)hp->head_dim,
                          .n_head = (int)hp->n_head,
                          .n_kv_head = (int)hp->n_kv_head};
    size_t sb = kern_attn_scratch_bytes(&L, ATTN_Q_CHUNK);
    for (int i = 0; i < f->n_threads; i++)
        if (!(f->attn_scratch[i] = dx_aligned_alloc(64, sb ? sb : 64)))
            return dx_errf(DX_ENOMEM, "fwd: attention scratch of %zu bytes", sb);
    /* split parts: the budget, but at least one sequence of ATTN_SPLIT_MAX_Q
     * tokens at the longest context */
    size_t PF = kern_attn_part_floats(&L), splits = (f->n_ctx - 1) / KERN_ATTN_SPLIT + 1;
    size_t one = splits * ATTN_SPLIT_MAX_Q * hp->n_head * PF;
    f->part_floats = ATTN_PART_BUDGET / sizeof(float);
    if (f->part_floats < one) f->part_floats = one;
    if (!(f->part = dx_aligned_alloc(64, f->part_floats * sizeof(float))))
        return dx_errf(DX_ENOMEM, "fwd: attention split parts of %zu floats", f->part_floats);
    f->attn_first = dx_calloc(f->max_seqs + 1, sizeof *f->attn_first);
    f->part_off = dx_calloc(f->max_seqs, sizeof *f->part_off);
    f->merge_seq = dx_calloc(f->max_seqs, sizeof *f->merge_seq);
    if (!f->attn_first || !f->part_off || !f->merge_seq)
        return dx_errf(DX_ENOMEM, "fwd: attention plan for %u sequences", f->max_seqs);
    f->tok_seq = dx_calloc(T, sizeof *f->tok_seq);
    f->tok_pos = dx_calloc(T, sizeof *f->tok_pos);
    f->seq_first = dx_calloc(f->max_seqs, sizeof *f->seq_first);
    if (!f->tok_seq || !f->tok_pos || !f->seq_first)
        return dx_errf(DX_ENOMEM, "fwd: batch tables for %zu tokens", (size_t)T);
    int rc = hp->n_expert ? moe_create(f->m, f->n_threads, f->max_tokens, &f->moe) : 0;
    return rc ? rc : build_rope(f);
}

int fwd_create(const model *m, kv_pool *pool, dx_tpool *tp, uint32_t max_tokens, uint32_t max_seqs,
               uint32_t n_ctx, fwd **out)
{
    *out = NULL;
    const model_hparams *hp = model_hp(m);
    if (kv_pool_block_bytes(pool) !=
        (size_t)hp->n_layer * 2 * hp->n_kv_head *
            kern_attn_head_bytes(kv_pool_dtype(pool), kv_pool_block_size(pool), hp->head_dim))
        return dx_errf(DX_EINVAL, "KV pool layout does not match the model");
    if (!max_tokens || !max_seqs || !n_ctx || max_seqs > 4096)
        return dx_errf(DX_EINVAL, "bad forward sizes (tokens %u, sequences %u, context %u)",
                       max_tokens, max_seqs, n_ctx);
    fwd *f = dx_calloc(1, sizeof *f);
    if (!f) return dx_errf(DX_ENOMEM, "out of memory");
    *f = (fwd){.m = m,
               .hp = hp,
               .pool = pool,
               .tp = tp,
               .n_threads = tp ? dx_tpool_size(tp) : 1,
               .max_tokens = max_tokens,
               .max_seqs = max_seqs,
               .n_ctx = n_ctx,
               .q_dim = hp->n_head * hp->head_dim,
               .kv_dim = hp->n_kv_head * hp->head_dim};
    if (alloc_buffers(f)) {
        fwd_destroy(f);
        return dx_errf(DX_ENOMEM, "out of memory for forward buffers (%u tokens)", max_tokens);
    }
    *out = f;
    return 0;
}

void fwd_destroy(fwd *f)
{
    if (!f) return;
    float *bufs[] = {f->x, f->xb, f->q, f->k, f->v, f->att, f->gate, f->up, f->tmp};
    for (size_t i = 0; i < DX_ARRAY_LEN(bufs); i++) dx_aligned_free(bufs[i]);
    for (int i = 0; i < 3; i++) dx_aligned_free(f->act[i]);
    if (f->attn_scratch)
        for (int i = 0; i < f->n_threads; i++) dx_aligned_free(f->attn_scratch[i]);
    dx_free(f->attn_scratch);
    dx_free(f->rope);
    dx_free(f->tok_seq);
    dx_free(f->tok_pos);
    dx_free(f->seq_first);
    dx_aligned_free(f->part);
    dx_free(f->attn_first);
    dx_free(f->part_off);
    dx_free(f->merge_seq);
    moe_destroy(f->moe);
    dx_free(f);
}
