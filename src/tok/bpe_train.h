/* bpe_train: learns byte-level BPE merges from a text corpus, the way the
 * GPT-2/Qwen tokenizers were trained: pre-tokenize with the family's regex,
 * count words, repeatedly merge the most frequent adjacent pair.  Fully
 * deterministic: ties are broken by the byte-wise order of the pair's
 * (left, right) strings.  Used by `duplex model synth` so that synthetic
 * models have real, data-learned merges. */
#ifndef BPE_TRAIN_H
#define BPE_TRAIN_H

#include <stddef.h>

#include "tok/tok.h"

typedef struct {
    char **tokens;   /* 256 byte tokens in GPT-2 byte order, then one per merge */
    size_t n_tokens;
    char **merges;   /* "left right" in byte-level form, rank order */
    size_t n_merges;
} bpe_vocab;

/* Learns up to n_merges merges (fewer if no pair occurs twice). */
int bpe_train(const char *corpus, size_t len, enum tok_pre pre, size_t n_merges, bpe_vocab *out);
void bpe_vocab_free(bpe_vocab *v);

/* The project's embedded training corpus (English prose, C/Python code, JSON,
 * written for duplex), NUL-terminated. */
const char *bpe_corpus(size_t *len);

#endif
