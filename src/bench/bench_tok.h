/* bench_tok: tokenizer speed — how long loading a model's vocabulary takes
 * (what it adds to a node's start-up) and how fast text encodes and decodes
 * with it, in MB of text per second. */
#ifndef BENCH_TOK_H
#define BENCH_TOK_H

#include <stddef.h>
#include <stdint.h>

/* Runs unless the config says (a plain literal, for help text). */
#define BENCH_TOK_DEFAULT_REPS 5

typedef struct {
    const char *model; /* GGUF file: its tokenizer is loaded reps times */
    const char *text;  /* sample text (the caller's) */
    size_t len;
    size_t bytes;   /* encode this much: the sample repeated, cut at a UTF-8 boundary (0: len) */
    uint32_t reps;  /* runs; medians reported (0: BENCH_TOK_DEFAULT_REPS) */
    unsigned flags; /* tok_encode flags */
} bench_tok_config;

typedef struct {
    double load_ms, load_min_ms, load_max_ms; /* model_load_tokenizer */
    double first_load_ms; /* the first run's: it also builds the process-wide NFC table */
    double encode_mb_s, encode_min, encode_max; /* MB (1e6 bytes) of text per second */
    double decode_mb_s;
    size_t bytes, tokens, n_vocab;
} bench_tok_result;

int bench_tok_run(const bench_tok_config *cfg, bench_tok_result *out);

#endif
