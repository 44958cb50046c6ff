/* bench_gram: the cost of grammar-constrained decoding per token — how long
 * the mask of allowed tokens takes (the first time a parse state is met and
 * from the cache) and how long accepting a token takes, over a valid
 * document tokenised with the model's vocabulary, for json_object mode and
 * a tool call's arguments schema. */
#ifndef BENCH_GRAM_H
#define BENCH_GRAM_H

#include <stddef.h>
#include <stdint.h>

#include "tok/tok.h"

typedef struct {
    const char *name;      /* "json_object", "tool schema" */
    size_t tokens;         /* of the document */
    double compile_ms;     /* EBNF (and schema) to grammar */
    double cold_mean_us;   /* first pass on a new match: every new state walks the trie */
    double cold_max_us;    /* the slowest mask of that pass (a full trie walk) */
    double cached_mean_us; /* the same document again on the reset match: cache hits */
    double cached_p99_us;
    double accept_mean_us;  /* accepting one token (cached transitions) */
    uint32_t n_allowed_max; /* largest mask, in tokens */
} bench_gram_case;

typedef struct {
    double vocab_ms; /* gram_vocab_create: the byte trie of the vocabulary */
    uint32_t n_vocab;
    bench_gram_case cases[2];
} bench_gram_result;

/* reps: the cached pass is repeated reps times (the medians' population). */
int bench_gram_run(const tok *t, uint32_t reps, bench_gram_result *out);

#endif
