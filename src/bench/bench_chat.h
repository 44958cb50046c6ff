/* bench_chat: one multi-turn chat against any OpenAI-compatible endpoint,
 * timed per turn — the quick P/D benchmark's client (scripts/bench/pd_quick.sh)
 * and the demo's.
 *
 * The conversation is deterministic for a seed: a system message, a first
 * user message carrying a "document" of prefix_words words, then each turn
 * appends input_words words; the client resends the whole history every turn
 * with the assistant messages exactly as returned, as agents do.  Each turn
 * streams with max_tokens = output_tokens and ignore_eos (so every mode
 * generates the same number of tokens) at temperature 0, and records the
 * time to the first content token, the whole time, and usage (prompt,
 * cached, completion tokens).
 *
 * Blocking (libcurl easy), one conversation at a time; the full multi-turn
 * benchmark with concurrency and distributions is a later `duplex bench`. */
#ifndef BENCH_CHAT_H
#define BENCH_CHAT_H

#include <stddef.h>
#include <stdint.h>

typedef struct bench_chat_turn bench_chat_turn;

typedef struct {
    const char *url;   /* base URL, e.g. http://127.0.0.1:8000 */
    const char *model; /* NULL: the first of GET /v1/models */
    int turns;
    int prefix_words, input_words, output_tokens;
    unsigned seed;
    const char *conversation_id; /* sent as X-Conversation-Id when set */
    double timeout_s;            /* per request; default 600 */
    /* Called after each turn (may be NULL). */
    void (*on_turn)(void *user, int turn, const bench_chat_turn *t);
    void *user;
} bench_chat_config;

struct bench_chat_turn {
    double ttft_s, total_s;
    long prompt_tokens, cached_tokens, completion_tokens;
    size_t answer_bytes;
    const char *answer; /* the answer's text: valid only during on_turn */
};

/* Runs the conversation; out[0..turns).  0, or a negative code with a
 * message (HTTP status and body, transport error). */
int bench_chat_run(const bench_chat_config *c, bench_chat_turn *out);

#endif
