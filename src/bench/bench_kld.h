/* bench_kld: what a KV cache dtype, or a model file's weight types, change
 * in what a model predicts — the KL divergence of the next-token
 * distribution and how often the most likely token stays the same, between
 * KV dtypes (or against a base model, e.g. the F32 file a quantised one was
 * made from), token by token over one long window of real text.  The same measure as llama.cpp's
 * `llama-perplexity --kl-divergence` (KL(base || test) over the whole
 * vocabulary, "same top p"), reported for the window's second half as it
 * does and by depth, so the two can be read side by side on one GGUF file.
 *
 * Every dtype runs the same tokens through its own pool and forward pass,
 * chunk by chunk, with the logits of every token; nothing is stored past a
 * chunk. */
#ifndef BENCH_KLD_H
#define BENCH_KLD_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

#define BENCH_KLD_MAX_KV 4
/* Depth ranges of the report: [0, 1024), [1024, 4096), [4096, 8192),
 * [8192, 16384), [16384, ...); then the window's second half. */
#define BENCH_KLD_N_DEPTHS 5
#define BENCH_KLD_HALF     BENCH_KLD_N_DEPTHS
/* Tokens per forward step unless the config says (a plain literal). */
#define BENCH_KLD_DEFAULT_CHUNK 256

typedef struct {
    int n_threads;         /* default: cores */
    const int32_t *tokens; /* the text's tokens (the caller's) */
    size_t n_tokens;
    uint32_t ctx; /* the window: the first ctx tokens (at most n_tokens) */
    /* KV dtypes, a comma list of two or more (ENGINE_KV_DTYPES): every
     * later one is compared with every earlier one */
    const char *kv_dtype;
    /* a base model to compare against (NULL: none): it runs first, with the
     * first KV dtype, and every run of the model is compared with it (and
     * with each other); same vocabulary as the model */
    const model *base;
    uint32_t chunk; /* tokens per step (0: BENCH_KLD_DEFAULT_CHUNK) */
    /* after each chunk (may be NULL) */
    void (*progress)(void *user, uint32_t done, uint32_t total);
    void *user;
} bench_kld_config;

/* One pair of dtypes over one range of positions. */
typedef struct {
    uint64_t n;        /* positions scored (each predicts the token after it) */
    double kld_mean;   /* KL(earlier || later), nats */
    double kld_median; /* (second half only: the others are 0) */
    double kld_p99, kld_max;
    double same_top;   /* share of positions with the same most likely token */
    double rms_dlogit; /* root mean square of the logit differences */
} bench_kld_stat;

typedef struct {
    /* the runs: enum dx_dtype, in the config's order, after the base's
     * (run 0) when there is one */
    int kv_type[BENCH_KLD_MAX_KV];
    int n_kv;                      /* runs */
    int is_base[BENCH_KLD_MAX_KV]; /* 1: the run is the base model's */
    uint32_t ctx;
    /* [i][j] for i < j: dtype j against dtype i; [.][.][BENCH_KLD_HALF] the
     * window's second half, positions [ctx/2, ctx-1) as llama.cpp scores */
    bench_kld_stat st[BENCH_KLD_MAX_KV][BENCH_KLD_MAX_KV][BENCH_KLD_N_DEPTHS + 1];
    double mean_entropy; /* of the first dtype's distributions, nats */
    double seconds;
} bench_kld_result;

/* Lower bound of depth range d (d <= BENCH_KLD_N_DEPTHS). */
uint32_t bench_kld_depth(int d);

int bench_kld_run(const bench_kld_config *cfg, const model *m, bench_kld_result *out);

#endif
