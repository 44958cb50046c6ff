/* gram_priv: the compiled grammar shared by gram_ebnf.c (parser, checks),
 * gram_match.c (vocabulary trie, matcher, masks) and gram_schema.c.
 *
 * A compiled grammar is a flat array of elements, llama.cpp-style: each rule
 * is a list of alternatives, each alternative a run of elements closed by
 * GE_END.  An element is a literal code point, a code-point set or a rule
 * reference; repetition and groups were expanded into generated rules by
 * the parser, so the matcher only knows sequences, alternatives and calls. */
#ifndef GRAM_PRIV_H
#define GRAM_PRIV_H

#include <stdint.h>

#include "gram/gram.h"

/* Limits (docs/structured.md lists them). */
#define GRAM_MAX_SRC    (8u << 20) /* EBNF text bytes */
#define GRAM_MAX_RULES  200000u    /* rules, generated ones included */
#define GRAM_MAX_ELEMS  (4u << 20) /* elements in all rules */
#define GRAM_MAX_REPEAT 10000u     /* m and n of {m,n} */
#define GRAM_MAX_NEST   200u       /* ( ) and [ ] nesting in the EBNF text */

/* element = type << 28 | value */
enum { GE_END = 0, GE_LIT = 1, GE_SET = 2, GE_REF = 3 };
#define GE_MAKE(t, v) (((uint32_t)(t) << 28) | (uint32_t)(v))
#define GE_TYPE(e)    ((e) >> 28)
#define GE_VAL(e)     ((e)&0x0fffffffu)

struct gram {
    uint32_t *elems; /* [n_elems] */
    uint32_t n_elems;
    uint32_t n_rules;
    uint32_t *alt_off; /* [n_rules + 1]: rule r's alternatives are alts[alt_off[r]..alt_off[r+1]) */
    uint32_t *alts;    /* element index of each alternative's first element */
    uint32_t *set_off; /* [n_sets + 1]: set s is ranges[set_off[s]..set_off[s+1]) */
    uint32_t *ranges;  /* pairs lo, hi (inclusive), sorted, disjoint, no surrogates */
    uint64_t (*set_ascii)[2]; /* [n_sets]: bitmap of the set's ASCII members */
    uint32_t n_sets;
    uint32_t root;
};

/* Whether code point c is in set s / whether some member lies in [lo, hi]. */
int gram_set_has(const gram *g, uint32_t s, uint32_t c);
int gram_set_meets(const gram *g, uint32_t s, uint32_t lo, uint32_t hi);

/* A JSON Schema `pattern` to an EBNF expression for the JSON string (quotes
 * included) holding a matching value; uses the rule <prefix>char.  The
 * subset and its limits: gram_regex.c. */
int gram_regex_to_ebnf(const char *re, size_t len, const char *prefix, dx_buf *out);

/* For tests: the match's current parse state (an interned id) and a way
 * back to it, so one match can try every token from the same state. */
int32_t gram_match_state(const gram_match *m);
void gram_match_restore(gram_match *m, int32_t state, int ended);

#endif
