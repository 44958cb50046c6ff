/* moe: mixture-of-experts FFN, tokens grouped by expert (see moe.h).
 *
 * A step runs, as pool runs over tasks:
 *   router   logits [T][n_expert] = x W_router (column chunks)
 *   (serial) routing per token, then the grouping: expert e's rows are
 *            [first[e], first[e] + count[e]) of the grouped buffers, its
 *            tokens in batch order; row_tok / tok_row map both ways
 *   gather   each grouped row's input, prepared for the gate (and up, if
 *            its type differs) kernel straight from x (row chunks)
 *   gate/up  per (expert, column chunk): g, u = the group's rows x W_e
 *   swiglu   g = silu(g) * u, prepared for the down kernel (row chunks)
 *   down     per (expert, column chunk): y = the group's rows x Wd_e
 *   combine  out[t] = sum over t's slots, in slot order, of w * y (tokens)
 * Expert e's matrix is the 2-D slice at e * ne[1] rows of the stacked
 * tensor, so every weight type the matmul kernels know works here. */
#include "engine/moe.h"

#include <math.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern.h"

#define ROW_CHUNK 16 /* grouped rows (or tokens) per task of the per-row passes */

struct moe {
    uint32_t n_embd, n_expert, k, ff;
    int norm, n_threads;
    size_t max_tok;
    float *logits;     /* [T][n_expert] router output */
    int32_t *sel;      /* [T][k] chosen experts, slot order */
    float *w;          /* [T][k] their weights */
    uint32_t *count;   /* [n_expert] grouped rows of each expert */
    uint32_t *first;   /* [n_expert] its first grouped row */
    uint32_t *row_tok; /* [T*k] the token of each grouped row */
    uint32_t *tok_row; /* [T][k] the grouped row of each (token, slot) */
    uint32_t *active;  /* [n_expert] experts with rows this step, ascending */
    size_t n_active;
    size_t *task_first; /* [n_expert + 1] first task of each active expert (one matrix) */
    size_t *chunk;      /* [n_expert] output rows per task of each active expert */
    void *act[2];       /* grouped prepared inputs: gate's (then down's), up's if typed apart */
    size_t act_bytes[2];
    float *g, *u; /* [T*k][ff] */
    float *y;     /* [T*k][n_embd] each grouped row's expert output */
};

/* ---- routing ---- */

void moe_route(const float *logits, uint32_t n, uint32_t k, int norm, int32_t *ids, float *w)
{
    DX_ASSERT(k >= 1 && k <= n && n <= MODEL_MAX_EXPERTS);
    float p[MODEL_MAX_EXPERTS], mx = -INFINITY;
    uint8_t taken[MODEL_MAX_EXPERTS];
    for (uint32_t i = 0; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        p[i] = expf(logits[i] - mx);
        sum += p[i];
        taken[i] = 0;
    }
    float inv = (float)(1.0 / sum);
    for (uint32_t i = 0; i < n; i++) p[i] *= inv;
    /* k passes of a strict '>' scan: the first of equal maxima wins, and an
     * expert whose probability is NaN is taken only when nothing else is left */
    for (uint32_t j = 0; j < k; j++) {
        uint32_t best = n;
        for (uint32_t i = 0; i < n; i++)
            if (!taken[i] && (best == n || p[i] > p[best] || (p[best] != p[best] && p[i] == p[i])))
                best = i;
        taken[best] = 1;
        ids[j] = (int32_t)best;
        w[j] = p[best];
    }
    if (!norm) return;
    double s = 0;
    for (uint32_t j = 0; j < k; j++) s += w[j];
    float fs = (float)s;
    if (!(fs >= 6.103515625e-5f)) fs = 6.103515625e-5f; /* llama.cpp's clamp (and NaN) */
    for (uint32_t j = 0; j < k; j++) w[j] = w[j] / fs;
}

/* Routes every token and lays out the grouped rows (experts ascending, each
 * expert's tokens in batch order). */
static void group(moe *mo, size_t T)
{
    uint32_t K = mo->k, E = mo->n_expert;
    memset(mo->count, 0, E * sizeof *mo->count);
    for (size_t t = 0; t < T; t++) {
        moe_route(mo->logits + t * E, E, K, mo->norm, mo->sel + t * K, mo->w + t * K);
        for (uint32_t s = 0; s < K; s++) mo->count[mo->sel[t * K + s]]++;
    }
    uint32_t row = 0;
    mo->n_active = 0;
    for (uint32_t e = 0; e < E; e++) {
        mo->first[e] = row;
        row += mo->count[e];
        if (mo->count[e]) mo->active[mo->n_active++] = e;
        mo->count[e] = 0; /* refilled below as the cursor */
    }
    for (size_t t = 0; t < T; t++)
        for (uint32_t s = 0; s < K; s++) {
            uint32_t e = (uint32_t)mo->sel[t * K + s], r = mo->first[e] + mo->count[e]++;
            mo->row_tok[r] = (uint32_t)t;
            mo->tok_row[t * K + s] = r;
        }
}

/* ---- expert matmuls: tasks (matrix, active expert, column chunk) ---- */

typedef struct {
    moe *mo;
    const model_tensor *w[2];
    const void *act[2];
    float *y[2];
    size_t n_in, n_out, per_w; /* per_w: tasks of one matrix */
} exp_job;

/* Chunks each active expert's n_out rows so that a task carries about
 * rows x tokens = all the work / (4 per thread): a lone decode token's
 * expert is one task, a crowded expert's rows are spread. */
static size_t plan(moe *mo, size_t n_rows, size_t n_out, size_t tile)
{
    double target = (double)n_rows * (double)n_out / (double)(4 * mo->n_threads);
    size_t n = 0;
    for (size_t a = 0; a < mo->n_active; a++) {
        double want = target / mo->count[mo->active[a]];
        size_t ch = want >= (double)n_out ? n_out : ((size_t)want + tile - 1) / tile * tile;
        if (ch < tile) ch = tile;
        if (ch > n_out) ch = n_out;
        mo->chunk[a] = ch;
        mo->task_first[a] = n;
        n += (n_out + ch - 1) / ch;
    }
    mo->task_first[mo->n_active] = n;
    return n;
}

static void exp_task(void *arg, size_t task, int tid)
{
    (void)tid;
    const exp_job *j = arg;
    const moe *mo = j->mo;
    size_t wi = task / j->per_w, r = task % j->per_w, lo = 0, hi = mo->n_active;
    while (hi - lo > 1) { /* the active expert whose tasks hold r */
        size_t mid = (lo + hi) / 2;
        if (mo->task_first[mid] <= r)
            lo = mid;
        else
            hi = mid;
    }
    uint32_t e = mo->active[lo];
    size_t o0 = (r - mo->task_first[lo]) * mo->chunk[lo];
    size_t o1 = o0 + mo->chunk[lo] < j->n_out ? o0 + mo->chunk[lo] : j->n_out;
    const model_tensor *W = j->w[wi];
    size_t mat = dx_dtype_row_bytes(W->type, j->n_in) * j->n_out;
    size_t arow = kern_act_bytes(W->type, 1, j->n_in);
    kern_matmul(W->type, (const uint8_t *)W->data + e * mat, j->n_in, o0, o1,
                (const uint8_t *)j->act[wi] + mo->first[e] * arow, mo->count[e],
                j->y[wi] + (size_t)mo->first[e] * j->n_out, j->n_out);
}

static void run_experts(moe *mo, dx_tpool *tp, exp_job *j, size_t n_w, size_t n_rows)
{
    j->mo = mo;
    j->per_w = plan(mo, n_rows, j->n_out, kern_matmul_tile(j->w[0]->type));
    dx_tpool_run(tp, j->per_w * n_w, exp_task, j);
}

/* ---- router: column chunks of one matmul over all tokens ---- */

typedef struct {
    const model_tensor *w;
    const void *act;
    size_t n_tok, chunk;
    float *y;
} router_job;

static void router_task(void *arg, size_t task, int tid)
{
    (void)tid;
    const router_job *j = arg;
    size_t n_out = j->w->ne[1], o0 = task * j->chunk;
    size_t o1 = o0 + j->chunk < n_out ? o0 + j->chunk : n_out;
    kern_matmul(j->w->type, j->w->data, j->w->ne[0], o0, o1, j->act, j->n_tok, j->y, n_out);
}

static void router(moe *mo, dx_tpool *tp, const model_tensor *w, const float *x, size_t T)
{
    size_t n_out = w->ne[1], tile = kern_matmul_tile(w->type);
    size_t want = (size_t)mo->n_threads * 4, chunk = (n_out + want - 1) / want;
    chunk = (chunk + tile - 1) / tile * tile;
    kern_act_prep(w->type, x, T, w->ne[0], mo->act[0]);
    router_job j = {w, mo->act[0], T, chunk, mo->logits};
    dx_tpool_run(tp, (n_out + chunk - 1) / chunk, router_task, &j);
}

/* ---- per-row passes ---- */

typedef struct {
    moe *mo;
    const model_layer *L;
    const float *x;
    float *out;
    size_t n; /* rows or tokens */
} row_job;

/* Whether up's input must be prepared apart from gate's: weight types of
 * one kern_act_kind() (q4_0 and q5_1, say) consume the same prepared rows. */
static int typed_apart(int tg, int tu)
{
    return kern_act_kind(tg) != kern_act_kind(tu);
}

/* Grouped row r's input: token row_tok[r]'s x, prepared for gate and up. */
static void gather_task(void *arg, size_t task, int tid)
{
    (void)tid;
    const row_job *j = arg;
    const moe *mo = j->mo;
    int tg = j->L->ffn_gate_exps.type, tu = j->L->ffn_up_exps.type;
    size_t rg = kern_act_bytes(tg, 1, mo->n_embd), ru = kern_act_bytes(tu, 1, mo->n_embd);
    size_t r1 = (task + 1) * ROW_CHUNK < j->n ? (task + 1) * ROW_CHUNK : j->n;
    for (size_t r = task * ROW_CHUNK; r < r1; r++) {
        const float *xr = j->x + (size_t)mo->row_tok[r] * mo->n_embd;
        kern_act_prep(tg, xr, 1, mo->n_embd, (uint8_t *)mo->act[0] + r * rg);
        if (typed_apart(tg, tu))
            kern_act_prep(tu, xr, 1, mo->n_embd, (uint8_t *)mo->act[1] + r * ru);
    }
}

static void swiglu_task(void *arg, size_t task, int tid)
{
    (void)tid;
    const row_job *j = arg;
    const moe *mo = j->mo;
    int td = j->L->ffn_down_exps.type;
    size_t ff = mo->ff, rd = kern_act_bytes(td, 1, ff);
    size_t r1 = (task + 1) * ROW_CHUNK < j->n ? (task + 1) * ROW_CHUNK : j->n;
    for (size_t r = task * ROW_CHUNK; r < r1; r++) {
        kern_swiglu(mo->g + r * ff, mo->u + r * ff, ff);
        kern_act_prep(td, mo->g + r * ff, 1, ff, (uint8_t *)mo->act[0] + r * rd);
    }
}

/* out[t] = w_0 y_0 + w_1 y_1 + ... in t's slot order: each product rounded,
 * then added to the running sum (what ggml's mul and chained adds do). */
static void combine_task(void *arg, size_t task, int tid)
{
    (void)tid;
    const row_job *j = arg;
    const moe *mo = j->mo;
    size_t E = mo->n_embd, K = mo->k;
    size_t t1 = (task + 1) * ROW_CHUNK < j->n ? (task + 1) * ROW_CHUNK : j->n;
    for (size_t t = task * ROW_CHUNK; t < t1; t++) {
        float *o = j->out + t * E;
        const float *y0 = mo->y + (size_t)mo->tok_row[t * K] * E;
        float w0 = mo->w[t * K];
        for (size_t i = 0; i < E; i++) o[i] = w0 * y0[i];
        for (size_t s = 1; s < K; s++) {
            const float *ys = mo->y + (size_t)mo->tok_row[t * K + s] * E;
            float ws = mo->w[t * K + s];
            for (size_t i = 0; i < E; i++) {
                float p = ws * ys[i];
                o[i] = o[i] + p;
            }
        }
    }
}

static void rows_run(dx_tpool *tp, row_job *j, dx_tpool_fn fn)
{
    dx_tpool_run(tp, (j->n + ROW_CHUNK - 1) / ROW_CHUNK, fn, j);
}

void moe_ffn(moe *mo, dx_tpool *tp, const model_layer *L, const float *x, size_t T, float *out,
             int32_t *route)
{
    DX_ASSERT(T <= mo->max_tok);
    size_t rows = T * mo->k;
    router(mo, tp, &L->ffn_gate_inp, x, T);
    group(mo, T);
    if (route) memcpy(route, mo->sel, rows * sizeof *route);
    row_job rj = {mo, L, x, out, rows};
    rows_run(tp, &rj, gather_task);
    int apart = typed_apart(L->ffn_gate_exps.type, L->ffn_up_exps.type);
    exp_job gu = {.w = {&L->ffn_gate_exps, &L->ffn_up_exps},
                  .act = {mo->act[0], mo->act[apart]},
                  .y = {mo->g, mo->u},
                  .n_in = mo->n_embd,
                  .n_out = mo->ff};
    run_experts(mo, tp, &gu, 2, rows);
    rows_run(tp, &rj, swiglu_task);
    exp_job dn = {.w = {&L->ffn_down_exps},
                  .act = {mo->act[0]},
                  .y = {mo->y},
                  .n_in = mo->ff,
                  .n_out = mo->n_embd};
    run_experts(mo, tp, &dn, 1, rows);
    rj.n = T;
    rows_run(tp, &rj, combine_task);
}

/* ---- lifecycle ---- */

static void grow(size_t *have, size_t want)
{
    if (want > *have) *have = want;
}

/* Prepared-activation bytes for every layer's weight types: act[0] holds
 * the router's input (T rows), the gate's and the down's (T*k rows each,
 * one after the other); act[1] the up's when some layer types it apart. */
static void size_acts(moe *mo, const model *m, size_t T, size_t rows)
{
    const model_hparams *hp = model_hp(m);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const model_layer *L = model_layer_at(m, l);
        grow(&mo->act_bytes[0], kern_act_bytes(L->ffn_gate_inp.type, T, mo->n_embd));
        grow(&mo->act_bytes[0], kern_act_bytes(L->ffn_gate_exps.type, rows, mo->n_embd));
        grow(&mo->act_bytes[0], kern_act_bytes(L->ffn_down_exps.type, rows, mo->ff));
        if (typed_apart(L->ffn_gate_exps.type, L->ffn_up_exps.type))
            grow(&mo->act_bytes[1], kern_act_bytes(L->ffn_up_exps.type, rows, mo->n_embd));
    }
}

int moe_create(const model *m, int n_threads, uint32_t max_tokens, moe **out)
{
    const model_hparams *hp = model_hp(m);
    *out = NULL;
    DX_ASSERT(hp->n_expert && hp->n_expert_used && n_threads >= 1 && max_tokens >= 1);
    moe *mo = dx_calloc(1, sizeof *mo);
    if (!mo) return dx_errf(DX_ENOMEM, "moe: out of memory");
    *mo = (moe){.n_embd = hp->n_embd,
                .n_expert = hp->n_expert,
                .k = hp->n_expert_used,
                .ff = hp->n_ff_exp,
                .norm = hp->expert_weights_norm,
                .n_threads = n_threads,
                .max_tok = max_tokens};
    size_t T = max_tokens, rows = T * mo->k, X = mo->n_expert;
    size_acts(mo, m, T, rows);
    int ok = (mo->logits = dx_aligned_alloc(64, T * X * sizeof(float))) &&
             (mo->sel = dx_calloc(rows, sizeof *mo->sel)) &&
             (mo->w = dx_calloc(rows, sizeof *mo->w)) &&
             (mo->count = dx_calloc(X, sizeof *mo->count)) &&
             (mo->first = dx_calloc(X, sizeof *mo->first)) &&
             (mo->row_tok = dx_calloc(rows, sizeof *mo->row_tok)) &&
             (mo->tok_row = dx_calloc(rows, sizeof *mo->tok_row)) &&
             (mo->active = dx_calloc(X, sizeof *mo->active)) &&
             (mo->task_first = dx_calloc(X + 1, sizeof *mo->task_first)) &&
             (mo->chunk = dx_calloc(X, sizeof *mo->chunk)) &&
             (mo->act[0] = dx_aligned_alloc(64, mo->act_bytes[0])) &&
             (!mo->act_bytes[1] || (mo->act[1] = dx_aligned_alloc(64, mo->act_bytes[1]))) &&
             (mo->g = dx_aligned_alloc(64, rows * mo->ff * sizeof(float))) &&
             (mo->u = dx_aligned_alloc(64, rows * mo->ff * sizeof(float))) &&
             (mo->y = dx_aligned_alloc(64, rows * mo->n_embd * sizeof(float)));
    if (!ok) {
        moe_destroy(mo);
        return dx_errf(DX_ENOMEM, "moe: buffers for %zu tokens x %u experts", T, hp->n_expert_used);
    }
    *out = mo;
    return 0;
}

void moe_destroy(moe *mo)
{
    if (!mo) return;
    dx_aligned_free(mo->logits);
    dx_free(mo->sel);
    dx_free(mo->w);
    dx_free(mo->count);
    dx_free(mo->first);
    dx_free(mo->row_tok);
    dx_free(mo->tok_row);
    dx_free(mo->active);
    dx_free(mo->task_first);
    dx_free(mo->chunk);
    dx_aligned_free(mo->act[0]);
    dx_aligned_free(mo->act[1]);
    dx_aligned_free(mo->g);
    dx_aligned_free(mo->u);
    dx_aligned_free(mo->y);
    dx_free(mo);
}
