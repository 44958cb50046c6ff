/* bench_engine: prefill and decode speed of the forward pass, the figures to
 * compare with llama.cpp's llama-bench (pp512, tg128, pp512 at depth D). */
#ifndef BENCH_ENGINE_H
#define BENCH_ENGINE_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    int n_threads;          /* default: cores */
    uint32_t prompt_tokens; /* default 512 */
    uint32_t gen_tokens;    /* default 128 */
    uint32_t depth;         /* context already present before the timed prompt */
    uint32_t reps;          /* runs; the median is reported (default 3) */
    const char *kv_dtype;   /* "f16" (default, NULL) | "bf16" | "f32" */
} bench_engine_config;

typedef struct {
    double pp_tok_s, tg_tok_s; /* medians */
    double pp_min, pp_max, tg_min, tg_max;
    const char *isa;
} bench_engine_result;

int bench_engine_run(const bench_engine_config *cfg, const model *m, bench_engine_result *out);

#endif
