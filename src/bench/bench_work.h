/* bench_work: the multi-turn agentic workload `duplex bench run` sends — in
 * the spirit of vLLM's benchmarks/multi_turn.
 *
 * Every conversation is a system message shared by all conversations
 * (shared_prefix tokens), a first user message carrying a per-conversation
 * "document" (prefix tokens), then `turns` turns; turn t appends a user
 * message of `input` tokens (every third one "Tool output: ...", an agent
 * feeding a tool's result back) and asks for `output` tokens.  Tool results
 * travel as user messages: a "tool" message must answer a tool call in the
 * assistant message before it, which the model's answers do not contain, and
 * strict endpoints reject one that does not.  Lengths come from distributions, drawn from a seeded generator per
 * conversation, so a workload is the same whatever the concurrency.  Text is
 * made of real words (a list embedded here) so token counts behave like real
 * text; lengths are exact in the target model's tokens with a tokenizer (a
 * GGUF file), else estimated (BENCH_TOKENS_PER_WORD). */
#ifndef BENCH_WORK_H
#define BENCH_WORK_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "base/dx_rng.h"

/* Tokens per word of the embedded list, when no tokenizer is given (GPT-like
 * vocabularies give about 1.3; duplex's small synthetic one about 1.7). */
#define BENCH_TOKENS_PER_WORD 1.5

/* A time that could not be measured (the client's overhead, a turn with no
 * answer): a value, not an error code; any negative time reads as it. */
#define BENCH_UNKNOWN (-1.0)

enum bench_dist_kind { BENCH_CONST, BENCH_UNIFORM, BENCH_LOGNORMAL };

/* A length in tokens: "N", "uniform:A:B" or "lognormal:MEDIAN:SIGMA". */
typedef struct {
    enum bench_dist_kind kind;
    double a, b;
} bench_dist;

/* DX_EINVAL with a message naming the bad part. */
int bench_dist_parse(const char *s, bench_dist *out);
uint32_t bench_dist_draw(const bench_dist *d, dx_rng *r); /* at least 1 */
void bench_dist_format(const bench_dist *d, char *out, size_t cap);
double bench_dist_mean(const bench_dist *d);

typedef struct {
    uint32_t conversations, turns, clients;
    uint32_t shared_prefix; /* tokens of the system message all conversations share */
    bench_dist prefix, input, output;
    double think_s; /* between a reply and the conversation's next turn */
    uint64_t seed;
    uint32_t warmup; /* conversations run first and not recorded */
    int send_conversation_id; /* X-Conversation-Id (else routers derive keys) */
    double scale;             /* the preset's scale factor (reports say it) */
    uint32_t rounds;          /* bench compare: interleaved rounds (0 = 1); the reports'
                               * figures are over conversations x rounds */
    const char *preset;       /* name, or NULL */
} bench_workload;

/* "quick" or "paper" (lengths multiplied by scale, at least 1 token);
 * DX_EINVAL for another name.  Fields not set by a preset keep their values. */
int bench_workload_preset(const char *name, double scale, bench_workload *w);
/* Checks bounds; DX_EINVAL naming the field. */
int bench_workload_check(const bench_workload *w);

typedef struct bench_text bench_text;

/* tokenizer: a GGUF file whose tokenizer counts the tokens, or NULL. */
int bench_text_create(const char *tokenizer, bench_text **out);
void bench_text_destroy(bench_text *t);
int bench_text_exact(const bench_text *t); /* 1 with a tokenizer */
/* Appends text of n tokens (exact with a tokenizer, else estimated). */
int bench_text_make(bench_text *t, dx_rng *r, uint32_t n, dx_buf *out);

/* One conversation's plan: its texts and lengths, fixed by the seed. */
typedef struct {
    char *system, *document;
    uint32_t n_turns;
    char **inputs;     /* [n_turns] the user/tool message of each turn */
    uint32_t *outputs; /* [n_turns] max_tokens of each turn */
    char id[40];       /* "conv-<seed>-<index>" */
} bench_conv;

int bench_conv_make(const bench_workload *w, bench_text *t, uint32_t index, bench_conv *c);
void bench_conv_free(bench_conv *c);

#endif
