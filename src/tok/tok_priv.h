/* tok_priv: what the tokenizer shares with the BPE trainer (bpe_train.c)
 * and nothing else: the compiled pre-tokenizer and the splitter that applies
 * it.  The trainer must cut text exactly as the encoder does, or learned
 * merges would not match what encoding later sees, so both go through
 * tok_split(). */
#ifndef TOK_PRIV_H
#define TOK_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "tok/tok.h"

typedef struct tok_regex tok_regex;

/* Compiles the pre-tokenizer pattern of `pre` (JIT where available). */
int tok_regex_create(enum tok_pre pre, tok_regex **out);
void tok_regex_destroy(tok_regex *re);

/* Called once per piece, in text order; a non-zero return stops the split
 * and is returned by tok_split. */
typedef int (*tok_piece_fn)(void *ctx, const char *piece, size_t len);

/* Splits text into pre-tokenizer pieces: maximal valid UTF-8 runs go through
 * the regex, every byte outside them is a piece of its own.  The pieces
 * concatenate to the text.  Safe to call from several threads on one re. */
int tok_split(const tok_regex *re, const char *text, size_t len, tok_piece_fn fn, void *ctx);

/* Writes the byte-level (GPT-2 mapped) UTF-8 form of n raw bytes to out,
 * which has room for 2*n bytes; returns the length written. */
size_t tok_bytes_to_bl(const uint8_t *in, size_t n, char *out);

#endif
