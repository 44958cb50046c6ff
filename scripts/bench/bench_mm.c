/* bench_mm: GFLOP/s of kern_matmul per weight type, shape and thread count.
 * Build and run from the repository root (docs/bench.md):
 *   make bench && build/release/bench/bench_mm
 * Options: bench_mm [seconds per point (0.3)] [dtype filter] [n_tok] [n_out x n_in]
 * (n_tok: only that token count, any value; the shape, e.g. 4096x4096,
 * instead of the three defaults).
 * DUPLEX_KERNELS=avx2|scalar selects a slower path; BENCH_CHUNK=rows sets
 * the task size (default: 64 rows for decode, ~4 tasks per thread for prefill).  Decode (n_tok = 1)
 * rotates over enough copies of the weights (>= 256 MB) that they come from
 * memory, as in a real decode step (BENCH_HOT=1: one copy, from cache, to
 * see the kernel's compute rate); prefill reuses one copy.  Figures are the
 * median of 5 timed batches of runs; prep (activation conversion) is timed
 * separately and not included in GFLOP/s. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "base/dx_tpool.h"
#include "engine/kern/kern.h"

typedef struct {
    int wtype;
    const void *w, *act;
    float *y;
    size_t n_in, n_out, n_tok, chunk;
} bench_job;

static void bench_task(void *arg, size_t task, int tid)
{
    (void)tid;
    bench_job *j = arg;
    size_t o0 = task * j->chunk, o1 = o0 + j->chunk < j->n_out ? o0 + j->chunk : j->n_out;
    kern_matmul(j->wtype, j->w, j->n_in, o0, o1, j->act, j->n_tok, j->y, j->n_out);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The super-block formats have no quantiser yet: random bytes (every bit
 * pattern is a valid block) under f16 scales of a sane size. */
static void random_kq_row(int wtype, uint8_t *row, size_t n_in)
{
    size_t bb = dx_dtype_block_bytes(wtype), nb = n_in / DX_QK_K;
    size_t d = wtype == DX_Q2_K   ? offsetof(dx_block_q2_k, d)
               : wtype == DX_Q3_K ? offsetof(dx_block_q3_k, d)
               : wtype == DX_Q6_K ? offsetof(dx_block_q6_k, d)
                                  : 0;
    for (size_t i = 0; i < bb * nb; i++) row[i] = (uint8_t)rand();
    uint16_t h = dx_f32_to_f16(1.0f / 512);
    for (size_t b = 0; b < nb; b++) {
        memcpy(row + b * bb + d, &h, 2);
        if (wtype == DX_Q2_K || wtype == DX_Q4_K || wtype == DX_Q5_K)
            memcpy(row + b * bb + d + 2, &h, 2);
    }
}

static void *random_weights(int wtype, size_t n_out, size_t n_in)
{
    size_t rb = dx_dtype_row_bytes(wtype, n_in);
    uint8_t *w = dx_aligned_alloc(64, rb * n_out);
    float *row = dx_malloc(n_in * sizeof(float));
    for (size_t o = 0; o < n_out; o++) {
        for (size_t k = 0; k < n_in; k++) row[k] = (float)rand() / RAND_MAX - 0.5f;
        if (dx_dtype_block_elems(wtype) == DX_QK_K)
            random_kq_row(wtype, w + o * rb, n_in);
        else
            dx_dtype_from_f32_row(wtype, row, w + o * rb, n_in);
    }
    dx_free(row);
    return w;
}

/* Median seconds per matmul over 5 batches. */
static double time_matmul(dx_tpool *pool, bench_job *j, void **ws, size_t n_w, double secs)
{
    size_t n_tasks = (j->n_out + j->chunk - 1) / j->chunk, reps = 1;
    for (;;) { /* calibrate */
        double t0 = dx_now_s();
        for (size_t r = 0; r < reps; r++) {
            j->w = ws[r % n_w];
            dx_tpool_run(pool, n_tasks, bench_task, j);
        }
        if (dx_now_s() - t0 > secs / 5 || reps > (1u << 24)) break;
        reps *= 2;
    }
    double med[5];
    for (int b = 0; b < 5; b++) {
        double t0 = dx_now_s();
        for (size_t r = 0; r < reps; r++) {
            j->w = ws[r % n_w];
            dx_tpool_run(pool, n_tasks, bench_task, j);
        }
        med[b] = (dx_now_s() - t0) / (double)reps;
    }
    qsort(med, 5, sizeof(double), cmp_double);
    return med[2];
}

static void bench_point(dx_tpool *pool, int wtype, size_t n_out, size_t n_in, size_t n_tok,
                        double secs)
{
    size_t wbytes = dx_dtype_row_bytes(wtype, n_in) * n_out;
    size_t n_w = n_tok == 1 && !getenv("BENCH_HOT") ? (256u << 20) / wbytes + 1 : 1;
    void **ws = dx_calloc(n_w, sizeof(void *));
    for (size_t i = 0; i < n_w; i++)
        ws[i] = i ? dx_memdup(ws[0], wbytes) : random_weights(wtype, n_out, n_in);
    float *x = dx_malloc(n_tok * n_in * sizeof(float));
    for (size_t i = 0; i < n_tok * n_in; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    void *act = dx_aligned_alloc(64, kern_act_bytes(wtype, n_tok, n_in));
    double t_prep = 1e9; /* best of 5, after a first touch of the buffer */
    kern_act_prep(wtype, x, n_tok, n_in, act);
    for (int r = 0; r < 5; r++) {
        double t0 = dx_now_s();
        kern_act_prep(wtype, x, n_tok, n_in, act);
        double dt = dx_now_s() - t0;
        t_prep = dt < t_prep ? dt : t_prep;
    }
    int nth = dx_tpool_size(pool);
    size_t tile = kern_matmul_tile(wtype);
    /* Decode: small tasks balance bandwidth; prefill: ~4 tasks per thread. */
    size_t chunk = n_tok == 1 ? 64 : (n_out + 4 * (size_t)nth - 1) / (4 * (size_t)nth);
    if (getenv("BENCH_CHUNK")) chunk = (size_t)atol(getenv("BENCH_CHUNK"));
    chunk = (chunk + tile - 1) / tile * tile;
    bench_job j = {.wtype = wtype,
                   .act = act,
                   .n_in = n_in,
                   .n_out = n_out,
                   .n_tok = n_tok,
                   .chunk = chunk,
                   .y = dx_malloc(n_tok * n_out * sizeof(float))};
    double t = time_matmul(pool, &j, ws, n_w, secs);
    double gflops = 2.0 * (double)n_tok * (double)n_in * (double)n_out / t * 1e-9;
    printf("%-5s %2d thr  n_tok %4zu  %4zux%-4zu  %8.1f GFLOP/s  %7.1f GB/s weights  %8.1f us  "
           "(prep %.1f us)\n",
           dx_dtype_name(wtype), nth, n_tok, n_out, n_in, gflops, (double)wbytes / t * 1e-9,
           t * 1e6, t_prep * 1e6);
    fflush(stdout);
    for (size_t i = 0; i < n_w; i++) i ? dx_free(ws[i]) : dx_aligned_free(ws[i]);
    dx_free(ws);
    dx_free(x);
    dx_free(j.y);
    dx_aligned_free(act);
}

int main(int argc, char **argv)
{

    double secs = argc > 1 ? atof(argv[1]) : 0.3;
    const char *dt_filter = argc > 2 ? argv[2] : NULL;
    long tok_filter = argc > 3 ? atol(argv[3]) : 0;
    printf("kernels: %s\n", kern_isa_name(kern_get_isa()));
    static const int wtypes[] = {DX_BF16, DX_Q8_0, DX_F16,  DX_F32,    DX_Q4_0,
                                 DX_Q4_1, DX_Q5_0, DX_Q5_1, DX_IQ4_NL, DX_Q2_K,
                                 DX_Q3_K, DX_Q4_K, DX_Q5_K, DX_Q6_K,   DX_IQ4_XS};
    size_t shapes[3][2] = {{1024, 1024}, {3072, 1024}, {1024, 3072}}, n_shapes = 3;
    size_t toks[2] = {1, 512}, n_toks = 2;
    if (tok_filter > 0) toks[0] = (size_t)tok_filter, n_toks = 1;
    if (argc > 4 && sscanf(argv[4], "%zux%zu", &shapes[0][0], &shapes[0][1]) == 2) n_shapes = 1;
    for (int nth = 1; nth <= 2; nth++) {
        dx_tpool *pool = NULL;
        if (dx_tpool_create(nth, &pool) != 0) return 1;
        for (size_t d = 0; d < sizeof wtypes / sizeof *wtypes; d++) {
            if (dt_filter && strcmp(dt_filter, dx_dtype_name(wtypes[d])) != 0) continue;
            for (size_t tk = 0; tk < n_toks; tk++)
                for (size_t s = 0; s < n_shapes; s++) {
                    if (!dx_dtype_row_bytes(wtypes[d], shapes[s][1])) continue;
                    bench_point(pool, wtypes[d], shapes[s][0], shapes[s][1], toks[tk], secs);
                }
        }
        dx_tpool_destroy(pool);
    }
    return 0;
}
