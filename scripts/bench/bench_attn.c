/* bench_attn: prefill attention speed for one layer at Qwen3-0.6B shapes
 * (16 query heads, 8 kv heads, head_dim 128, block 16, f16 KV): 512 new
 * queries after a 4096-token context, on 1 and 2 threads (split by kv head,
 * plain pthreads), median of several runs, for each ISA the CPU has.
 *
 * Build and run (after `make V=release`):
 *   cc -O2 -march=native -ffp-contract=off -std=c11 -D_GNU_SOURCE -pthread -Isrc \
 *      scripts/bench/bench_attn.c build/release/libduplex.a -lm -o build/bench_attn
 *   build/bench_attn [reps=5] [depth=4096] [n_q=512]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "engine/kern.h"

enum { N_HEAD = 16, N_KV = 8, D = 128, BS = 16 };

typedef struct {
    const kern_attn_layout *L;
    const int32_t *blocks;
    size_t pos0, n_q;
    const float *q;
    float *out;
    int h0, h1;
    void *scratch;
} bench_job;

static void *bench_worker(void *arg)
{
    bench_job *j = arg;
    kern_attn(j->L, j->blocks, j->pos0, j->n_q, j->q, j->out, j->h0, j->h1, j->scratch);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of `reps` runs of all heads on n_thr threads. */
static double bench_run(bench_job *jobs, int n_thr, int reps)
{
    double t[32];
    for (int r = 0; r < reps; r++) {
        pthread_t th[8];
        double t0 = dx_now_s();
        for (int i = 1; i < n_thr; i++) pthread_create(&th[i], NULL, bench_worker, &jobs[i]);
        bench_worker(&jobs[0]);
        for (int i = 1; i < n_thr; i++) pthread_join(th[i], NULL);
        t[r] = dx_now_s() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    return t[reps / 2];
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    size_t depth = argc > 2 ? strtoul(argv[2], NULL, 10) : 4096;
    size_t n_q = argc > 3 ? strtoul(argv[3], NULL, 10) : 512;
    if (reps < 1 || reps > 31) reps = 5;
    size_t n_blocks = (depth + n_q + BS - 1) / BS;
    size_t region = (size_t)N_KV * BS * D * 2;
    kern_attn_layout L = {.block_bytes = 2 * region,
                          .k_off = 0,
                          .v_off = region,
                          .kv_type = DX_F16,
                          .block_size = BS,
                          .head_dim = D,
                          .n_head = N_HEAD,
                          .n_kv_head = N_KV,
                          .scale = 0.08838834764f};
    uint8_t *arena = dx_aligned_alloc(64, n_blocks * L.block_bytes);
    uint16_t *h = (uint16_t *)arena;
    for (size_t i = 0; i < n_blocks * L.block_bytes / 2; i++)
        h[i] = dx_f32_to_f16((float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f);
    L.base = arena;
    int32_t *blocks = dx_calloc(n_blocks, sizeof(int32_t));
    for (size_t i = 0; i < n_blocks; i++) blocks[i] = (int32_t)((i * 7) % n_blocks);
    size_t nq = n_q * N_HEAD * D;
    float *q = dx_calloc(nq, 4), *out = dx_calloc(nq, 4);
    for (size_t i = 0; i < nq; i++) q[i] = (float)((i * 40503u) % 2001) / 1000.0f - 1.0f;
    double flops = 0;
    for (size_t t = 0; t < n_q; t++) flops += 4.0 * N_HEAD * D * (double)(depth + t + 1);
    size_t sbytes = kern_attn_scratch_bytes(&L, n_q);
    bench_job jobs[2];
    for (int i = 0; i < 2; i++)
        jobs[i] =
            (bench_job){&L, blocks, depth, n_q, q, out, 0, N_KV, dx_aligned_alloc(64, sbytes)};
    printf("attention: %zu queries after %zu tokens, %d/%d heads, head_dim %d, f16 KV, "
           "%.2f GFLOP per layer\n",
           n_q, depth, N_HEAD, N_KV, D, flops * 1e-9);
    for (int isa = KERN_AVX2; isa <= (int)kern_isa_detect(); isa++) {
        kern_set_isa((enum kern_isa)isa);
        for (int n_thr = 1; n_thr <= 2; n_thr++) {
            for (int i = 0; i < n_thr; i++) {
                jobs[i].h0 = N_KV * i / n_thr;
                jobs[i].h1 = N_KV * (i + 1) / n_thr;
            }
            double s = bench_run(jobs, n_thr, reps);
            printf("%-7s %d thread%s: %8.2f ms/layer  %6.1f GFLOP/s  (x28 layers: %.0f ms)\n",
                   kern_isa_name((enum kern_isa)isa), n_thr, n_thr > 1 ? "s" : " ", s * 1e3,
                   flops / s * 1e-9, 28 * s * 1e3);
        }
    }
    return 0;
}
