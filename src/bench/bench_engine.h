/* bench_engine: prefill and decode speed of the forward pass, the figures to
 * compare with llama.cpp's llama-bench (pp512, tg128, pp512 at depth D), and
 * where the time goes: attention's share, its GFLOP/s and KV GB/s, and for
 * decode the bytes a token reads against the memory's measured read rate. */
#ifndef BENCH_ENGINE_H
#define BENCH_ENGINE_H

#include <stdint.h>

#include "model/model.h"

/* Runs unless the config says (a plain literal, for help text). */
#define BENCH_ENGINE_DEFAULT_REPS 3
/* KV dtypes one run compares at most. */
#define BENCH_ENGINE_MAX_KV 4

typedef struct {
    int n_threads;          /* default: cores */
    uint32_t prompt_tokens; /* prefill tokens timed; 0: none */
    uint32_t gen_tokens;    /* decode tokens timed; 0: none */
    uint32_t depth;         /* context already present before the timed prompt */
    uint32_t reps;          /* runs; the median is reported (0: BENCH_ENGINE_DEFAULT_REPS) */
    /* One of ENGINE_KV_DTYPES (NULL: the engine's default), or several
     * separated by commas: each gets its own pool and forward pass, and the
     * runs alternate between them (run 1 of each, then run 2 of each...), so
     * that a change in the machine's load falls on all of them alike. */
    const char *kv_dtype;
    /* 1: the depth's KV is written with random values in the cache's
     * format instead of computed: decode and prefill after it read and
     * compute exactly as after a real prefill (neither depends on the
     * values), without the minutes a 16k-token prefill takes. */
    int synthetic_depth;
} bench_engine_config;

/* One phase (prefill or decode) over all runs. */
typedef struct {
    double tok_s, min, max;   /* median and range over the runs */
    /* median tokens per second of this process's CPU time: on a shared
     * machine, where other work takes the CPUs away for part of a run, this
     * still says what a token costs (with one thread exactly; with more it
     * also counts the pool's spinning while it waits for a descheduled peer) */
    double cpu_tok_s;
    double attn_share;        /* of the forward pass's time */
    double moe_share;         /* a mixture of experts' FFNs' share of it */
    double attn_gflop_s;      /* attention FLOPs / attention time */
    double attn_gb_s;         /* KV bytes (each key once per layer) / attention time */
    double bytes_per_tok;     /* weights + KV read per decode token (decode only) */
} bench_engine_phase;

typedef struct {
    int kv_type; /* enum dx_dtype */
    bench_engine_phase pp, tg;
} bench_engine_kv;

typedef struct {
    bench_engine_kv kv[BENCH_ENGINE_MAX_KV]; /* in the order of bench_engine_config.kv_dtype */
    int n_kv;
    double mem_gb_s; /* read rate of a large buffer on n_threads threads */
    const char *isa;
    const char *decode; /* how a lone token walks F16/BF16/F32 rows (kern_get_decode) */
    int n_threads;
} bench_engine_result;

/* bench_engine_config.kv_dtype's list into types[BENCH_ENGINE_MAX_KV]:
 * 0 and *n, or DX_EINVAL naming the dtype. */
int bench_engine_parse_kv(const char *list, int *types, int *n);
int bench_engine_run(const bench_engine_config *cfg, const model *m, bench_engine_result *out);

#endif
