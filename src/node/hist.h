/* hist: token-faithful conversation history (docs/pd.md).
 *
 * A reply's text, tokenised again on the next turn, does not always give
 * back the tokens the model generated (BPE may have generated a
 * non-canonical split; invalid UTF-8 reaches the client as U+FFFD), and then
 * KV reuse would stop at the reply's first block.  So when a chat prompt is
 * tokenised (chat_tmpl_encode_faithful), every assistant message whose text
 * is exactly a reply generated after exactly the same preceding tokens gets
 * the generated ids instead.  Two sources give them:
 *
 *  - the request's own history: `remote_token_ids` of its kv_transfer_params
 *    (the sequence a decode node holds — prompt and reply).  The reply is the
 *    span after the tokens rendered so far (which must be a prefix of the
 *    sequence) up to the next end-of-turn token, used when its text equals
 *    the message;
 *  - the node's memory of the replies it generated itself (hist_mem): keyed
 *    by a hash of the preceding tokens and of the text, kept for the
 *    retention TTL, bounded, least recently used first out.
 *
 * A decode node's sequence holds the ids it generated, so it comes first.  A
 * prefill node's prompt (what a decode node receives) holds whatever that
 * node knew: its replies are generated ids when it had a decode node's
 * sequence, a fresh tokenisation when it had nothing (the one-way flow).
 * For it the memory of the node that generated the replies comes first
 * (mem_first); a walk over the prompt is then never worse than tokenising.
 *
 * "Its text" is what the client received: the bytes of the reply's
 * non-special tokens, invalid UTF-8 replaced by U+FFFD (hist_reply_text) —
 * exactly the engine's streamed text.  A reply cut by a stop string does not
 * match its ids and is tokenised afresh.
 *
 * hist_mem may be used from several threads: the node's loop remembers
 * replies while prompts are prepared on worker threads (one mutex inside). */
#ifndef HIST_H
#define HIST_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "tok/tok.h"

typedef struct hist_mem hist_mem;

/* How long a reply is remembered unless the config says: as long as a
 * decode node retains its KV (NODE_KV_DEFAULT_RETAIN_TTL_S is this). */
#define HIST_DEFAULT_TTL_S 480

typedef struct {
    double ttl_s;       /* 0: HIST_DEFAULT_TTL_S */
    size_t max_entries; /* default 65536 */
    size_t max_bytes;   /* text + ids; default 256 MiB */
} hist_mem_config;

typedef struct {
    size_t entries, bytes;
    uint64_t puts, hits, evicted, expired;
} hist_mem_stats;

int hist_mem_create(const hist_mem_config *cfg, hist_mem **out);
void hist_mem_destroy(hist_mem *m);
/* Remembers that after ctx[0..n_ctx) the model generated ids[0..n_ids)
 * (without a final end-of-turn token) and the client received text, in
 * namespace ns (0: the shared one; a tenant's otherwise, found only with the
 * same ns).  A second put for the same context and text replaces the
 * first. */
int hist_mem_put(hist_mem *m, uint64_t ns, const int32_t *ctx, size_t n_ctx, const char *text,
                 size_t len, const int32_t *ids, size_t n_ids, uint64_t now_ns);
void hist_mem_get_stats(const hist_mem *m, hist_mem_stats *out);

/* The sources for one prompt; pass as the chat_reply_fn's user data. */
typedef struct {
    const tok *tk;
    const int32_t *end_ids; /* tokens that end a reply (EOS, EOT, the template's end of turn) */
    size_t n_end;
    const int32_t *seq; /* the request's remote_token_ids, or NULL */
    size_t n_seq;
    hist_mem *mem; /* or NULL */
    uint64_t ns;   /* the request's namespace in mem (hist_mem_put) */
    int mem_first; /* the sequence is a prefill node's prompt, not generated ids: memory first */
    uint64_t now_ns;
    dx_buf scratch;                           /* hist_src_init/free */
    uint32_t from_seq, from_mem, retokenised; /* replies, by where their ids came from */
} hist_src;

void hist_src_init(hist_src *s, const tok *tk, const int32_t *end_ids, size_t n_end);
void hist_src_free(hist_src *s);
/* chat_reply_fn over a hist_src. */
int hist_reply(void *user, const int32_t *ctx, size_t n_ctx, const char *text, size_t len,
               tok_ids *out);

/* Appends the text a client receives for ids (see above) to out. */
int hist_reply_text(const tok *tk, const int32_t *ids, size_t n, dx_buf *out);
/* n without a trailing token from end_ids[0..n_end). */
size_t hist_strip_end(const int32_t *ids, size_t n, const int32_t *end_ids, size_t n_end);

#endif
