/* gram: grammars for constrained decoding (structured outputs).
 *
 * A grammar (EBNF text, or compiled from a JSON Schema) is compiled once into
 * an immutable `gram` (shareable across threads); a `gram_vocab` is the model's
 * vocabulary prepared once per model (token byte strings in a byte trie, which
 * tokens end generation); a `gram_match` is one sequence's position in a
 * grammar: it gives the mask of tokens allowed next and accepts the token the
 * sampler picked.  Masks are cached per parser state so repeated states cost a
 * lookup, not a vocabulary walk.  Nothing here touches logits or KV.
 *
 * EBNF syntax (docs/structured.md documents it; GBNF-compatible subset):
 *   rule-name ::= alternatives      (a rule ends where the next `name ::=`
 *   starts, so rules may span lines), "literal" with \n \r \t \0 \xHH
 *   \uHHHH \UHHHHHHHH escapes, [a-z0-9_] and [^"\\] char classes (UTF-8
 *   code points), `.` any character, ( ... ) grouping, | alternatives,
 *   postfix * + ? and {m}, {m,}, {m,n} repetition, # comments.  The start
 *   rule is `root`.  Every error is DX_EINVAL with a message naming
 *   line:col; left recursion and a root deriving no finite string are
 *   errors too. */
#ifndef GRAM_H
#define GRAM_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "tok/tok.h"

typedef struct gram gram;
typedef struct gram_vocab gram_vocab;
typedef struct gram_match gram_match;

/* ---- vocabulary (once per model) ---------------------------------------- */
/* Control tokens other than end-of-generation ones are never allowed by a
 * grammar; end-of-generation tokens (tok_eog_ids) are allowed exactly when
 * the grammar has accepted a complete string. */
int gram_vocab_create(const tok *t, gram_vocab **out);
void gram_vocab_destroy(gram_vocab *v);
uint32_t gram_vocab_size(const gram_vocab *v);

/* ---- compiling --------------------------------------------------------- */
int gram_compile_ebnf(const char *src, size_t len, gram **out);
/* The JSON Schema subset documented in docs/structured.md → EBNF text whose
 * rules are all named with `prefix` (e.g. "t0-"), start rule `<prefix>root`,
 * appended to `out`, so callers can compose several schemas into one grammar
 * (tool calls).  strict != 0: an unsupported keyword is DX_EINVAL naming it
 * (and its JSON pointer); strict == 0: it is ignored and named in `warnings`
 * (one line each; warnings may be NULL).  Hostile schemas (depth, size,
 * recursive $ref) are refused with a message, never hang. */
int gram_schema_to_ebnf(const char *schema_json, size_t len, int strict, const char *prefix,
                        dx_buf *out, dx_buf *warnings);
/* EBNF for any JSON value / any JSON object, rules named with prefix. */
int gram_json_value_ebnf(const char *prefix, int object_only, dx_buf *out);
void gram_destroy(gram *g); /* NULL: no-op */

/* ---- matching (one per sequence; not thread-safe, the engine thread owns it) */
int gram_match_create(const gram *g, const gram_vocab *v, gram_match **out);
void gram_match_destroy(gram_match *m); /* NULL: no-op */
/* Fills `mask` (ceil(n_vocab/64) words, bit i of word i/64 = token i
 * allowed) for the next token; returns the number of allowed tokens (>= 1
 * while the grammar can go on or end; 0 after an end-of-generation token was
 * accepted), or a negative error (DX_ETOOBIG: a hostile grammar passed a
 * run-time bound — too ambiguous, or nesting past the stack depth — and the
 * sequence cannot go on under the grammar). */
int gram_match_mask(gram_match *m, uint64_t *mask);
/* Advances by the token's bytes; DX_EINVAL if the grammar does not allow it
 * (the match is left unchanged). */
int gram_match_accept(gram_match *m, int32_t tok);
/* Back to the start of the grammar, keeping the caches: a match reused for
 * the next request with the same grammar and vocabulary starts with warm
 * masks. */
int gram_match_reset(gram_match *m); /* 0 or DX_ENOMEM */
/* 1 when the input so far is a complete sentence of the grammar. */
int gram_match_complete(const gram_match *m);
/* 1 when it is complete and nothing more may follow (only EOG allowed). */
int gram_match_done(const gram_match *m);

#endif
