/* bench_attn: attention speed for one layer at Qwen3-0.6B shapes (16 query
 * heads, 8 kv heads, head_dim 128, block 16) in a pool laid out like the
 * engine's (a block holds all `layers` layers, so one layer's K/V pieces are
 * a whole block apart), on 1 and 2 threads, median of several runs, for each
 * ISA the CPU has.  Up to 16 queries take the engine's split form (one task
 * per kv head and 1024-key split, then the merges), more are split by kv
 * head.  Reports GFLOP/s and the KV read rate.
 *
 * Build and run from the repository root (docs/bench.md):
 *   make bench && build/release/bench/bench_attn [reps=5] [depth=4096] [n_q=512] [layers=28]
 *       [f16|bf16|f32|q8_0]
 * HUGE=0 leaves the arena on 4 KiB pages (the pool asks for huge pages);
 * BS=n sets the block size (default: the engine's); QSCALE=x scales the queries (wider
 * score ranges, more probabilities near zero).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "engine/engine.h"
#include "engine/kern/kern.h"

enum { N_HEAD = 16, N_KV = 8, D = 128, MAX_THR = 8 };
static size_t BS = ENGINE_DEFAULT_BLOCK_SIZE;

typedef struct {
    const kern_attn_layout *L;
    const int32_t *blocks;
    size_t pos0, n_q, n_split, PF, rows;
    const float *q;
    float *out, *part;
    void *scratch[MAX_THR];
    atomic_size_t next;
    pthread_barrier_t bar;
    int n_thr;
} bench_job;

typedef struct {
    bench_job *j;
    int tid;
} bench_arg;

static void *bench_worker(void *arg)
{
    bench_arg *a = arg;
    bench_job *j = a->j;
    int split = j->n_q <= 16 && j->n_split > 1;
    size_t n_tasks = split ? N_KV * j->n_split : N_KV;
    for (size_t t; (t = atomic_fetch_add(&j->next, 1)) < n_tasks;) {
        int h = (int)(t % N_KV);
        if (!split) {
            kern_attn(j->L, j->blocks, j->pos0, j->n_q, j->q, j->out, h, h + 1, j->scratch[a->tid]);
            continue;
        }
        size_t s = t / N_KV;
        kern_attn_part(j->L, j->blocks, j->pos0, j->n_q, j->q, h, s,
                       j->part + (s * N_KV + (size_t)h) * j->rows * j->PF, j->scratch[a->tid]);
    }
    if (!split) return NULL;
    pthread_barrier_wait(&j->bar);
    for (int h = a->tid; h < N_KV; h += j->n_thr)
        kern_attn_merge(j->L, j->pos0, j->n_q, h, j->part + (size_t)h * j->rows * j->PF,
                        N_KV * j->rows * j->PF, j->out);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of `reps` runs of all heads on n_thr threads. */
static double bench_run(bench_job *j, int n_thr, int reps)
{
    double t[32];
    bench_arg args[MAX_THR];
    for (int r = 0; r < reps; r++) {
        pthread_t th[MAX_THR];
        atomic_store(&j->next, 0);
        j->n_thr = n_thr;
        pthread_barrier_init(&j->bar, NULL, (unsigned)n_thr);
        double t0 = dx_now_s();
        for (int i = 0; i < n_thr; i++) args[i] = (bench_arg){j, i};
        for (int i = 1; i < n_thr; i++) pthread_create(&th[i], NULL, bench_worker, &args[i]);
        bench_worker(&args[0]);
        for (int i = 1; i < n_thr; i++) pthread_join(th[i], NULL);
        t[r] = dx_now_s() - t0;
        pthread_barrier_destroy(&j->bar);
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    return t[reps / 2];
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    size_t depth = argc > 2 ? strtoul(argv[2], NULL, 10) : 4096;
    size_t n_q = argc > 3 ? strtoul(argv[3], NULL, 10) : 512;
    size_t layers = argc > 4 ? strtoul(argv[4], NULL, 10) : 28;
    enum dx_dtype kv = DX_F16;
    if (argc > 5 && dx_dtype_parse(argv[5], &kv)) return 2;
    if (reps < 1 || reps > 31) reps = 5;
    if (getenv("BS")) BS = strtoul(getenv("BS"), NULL, 10);
    if (layers < 1) layers = 1;
    size_t es = kv == DX_F32 ? 4 : 2, n_blocks = (depth + n_q + BS - 1) / BS;
    size_t region = (size_t)N_KV * kern_attn_head_bytes(kv, BS, D);
    kern_attn_layout L = {.block_bytes = 2 * region * layers,
                          .k_off = 0,
                          .v_off = region,
                          .kv_type = kv,
                          .block_size = (int)BS,
                          .head_dim = D,
                          .n_head = N_HEAD,
                          .n_kv_head = N_KV,
                          .scale = 0.08838834764f};
    size_t arena_bytes = n_blocks * L.block_bytes;
    uint8_t *arena =
        mmap(NULL, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED) return 1;
    if (!getenv("HUGE") || atoi(getenv("HUGE"))) madvise(arena, arena_bytes, MADV_HUGEPAGE);
    for (size_t b = 0; b < n_blocks && kv == DX_Q8_0; b++) /* quantised as the engine stores */
        for (int h = 0; h < N_KV; h++)
            for (size_t t = 0; t < BS; t++) {
                float k[D], v[D];
                for (int d = 0; d < D; d++) {
                    size_t i = ((b * BS + t) * N_KV + (size_t)h) * D + (size_t)d;
                    k[d] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
                    v[d] = (float)((i * 40503u + 7) % 2001) / 1000.0f - 1.0f;
                }
                uint8_t *blk = arena + b * L.block_bytes;
                kern_attn_store_q8(&L, blk, blk + region, h, (int)t, k, v);
            }
    for (size_t b = 0; b < n_blocks && kv != DX_Q8_0; b++)
        for (size_t i = 0; i < 2 * region / es; i++) {
            float f = (float)(((b * 2 * region / es + i) * 2654435761u) % 2001) / 1000.0f - 1.0f;
            uint8_t *p = arena + b * L.block_bytes + i * es;
            if (kv == DX_F32) {
                memcpy(p, &f, 4);
            } else {
                uint16_t h = kv == DX_F16 ? dx_f32_to_f16(f) : dx_f32_to_bf16(f);
                memcpy(p, &h, 2);
            }
        }
    L.base = arena;
    int32_t *blocks = dx_calloc(n_blocks, sizeof(int32_t));
    for (size_t i = 0; i < n_blocks; i++) blocks[i] = (int32_t)i;
    size_t nq = n_q * N_HEAD * D;
    float *q = dx_calloc(nq, 4), *out = dx_calloc(nq, 4);
    float qs = getenv("QSCALE") ? strtof(getenv("QSCALE"), NULL) : 1.0f;
    for (size_t i = 0; i < nq; i++) q[i] = qs * ((float)((i * 40503u) % 2001) / 1000.0f - 1.0f);
    double flops = 0, kv_bytes = (double)(depth + n_q) * N_KV * 2 * kern_attn_head_bytes(kv, 1, D);
    for (size_t t = 0; t < n_q; t++) flops += 4.0 * N_HEAD * D * (double)(depth + t + 1);
    bench_job j = {.L = &L, .blocks = blocks, .pos0 = depth, .n_q = n_q, .q = q, .out = out};
    j.n_split = (depth + n_q - 1) / KERN_ATTN_SPLIT + 1;
    j.PF = kern_attn_part_floats(&L);
    j.rows = n_q * (N_HEAD / N_KV);
    j.part = dx_aligned_alloc(64, j.n_split * N_KV * j.rows * j.PF * sizeof(float));
    for (int i = 0; i < MAX_THR; i++)
        j.scratch[i] = dx_aligned_alloc(64, kern_attn_scratch_bytes(&L, n_q));
    printf("attention: %zu queries after %zu tokens, %d/%d heads, head_dim %d, %s KV, "
           "%zu-layer blocks, %.2f GFLOP and %.1f MB of KV per layer\n",
           n_q, depth, N_HEAD, N_KV, D, dx_dtype_name(kv), layers, flops * 1e-9, kv_bytes * 1e-6);
    /* up to AVX-512: KERN_AMX's attention is the AVX-512 path's */
    for (int isa = KERN_AVX2; isa <= (int)kern_isa_detect() && isa <= KERN_AVX512; isa++) {
        kern_set_isa((enum kern_isa)isa);
        for (int n_thr = 1; n_thr <= 2; n_thr++) {
            double s = bench_run(&j, n_thr, reps);
            printf("%-7s %d thread%s: %8.3f ms/layer  %6.1f GFLOP/s  %5.1f GB/s  (x28 layers: %.0f "
                   "ms)\n",
                   kern_isa_name((enum kern_isa)isa), n_thr, n_thr > 1 ? "s" : " ", s * 1e3,
                   flops / s * 1e-9, kv_bytes / s * 1e-9, 28 * s * 1e3);
        }
    }
    for (int i = 0; i < MAX_THR; i++) dx_aligned_free(j.scratch[i]);
    dx_aligned_free(j.part);
    dx_free(q);
    dx_free(out);
    dx_free(blocks);
    munmap(arena, arena_bytes);
    return 0;
}
