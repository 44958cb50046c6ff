/* chat_tmpl: chat templates (ChatML for Qwen, Llama 3), rendered natively.
 *
 * The GGUF carries a Jinja template in tokenizer.chat_template.  duplex's
 * own synthetic models' templates (chat_tmpl_jinja), or none at all, are
 * rendered here in C; any other template runs in the Jinja interpreter
 * (jinja/jinja.h; model_chat picks, docs/templates.md) and its output is
 * tokenised by chat_tmpl_encode_rendered below.  Either way the family is
 * recognised from the template text (or the architecture), for the
 * tool-call format and the end of a turn.  The native rendering has the
 * prefix property KV reuse relies on: render(m[0..N]) with
 * add_generation_prompt, followed by the assistant reply as generated (its
 * text and end-of-turn token), is a prefix of render(m[0..N+1]) where
 * m[N+1] is that reply.
 *
 * chat_tmpl_encode tokenises the markup with special tokens allowed and the
 * message contents without, so user text can never produce a control token
 * (user-defined tokens such as <think> are matched in contents too, as the
 * model's own tokenizer matches them).  A vocabulary that asks for BOS
 * (tokenizer.ggml.add_bos_token) gets exactly one at the start. */
#ifndef CHAT_TMPL_H
#define CHAT_TMPL_H

#include <stddef.h>

#include "base/dx_buf.h"
#include "tok/tok.h"

enum chat_tmpl_kind { CHAT_TMPL_CHATML, CHAT_TMPL_LLAMA3 };

typedef struct {
    const char *role; /* system | user | assistant | tool */
    const char *content;
    size_t content_len;
} chat_msg;

/* From the GGUF template text (may be NULL) and architecture name (may be
 * NULL): DX_ENOENT if neither identifies a supported family. */
int chat_tmpl_detect(const char *tmpl_text, const char *arch, enum chat_tmpl_kind *out);
const char *chat_tmpl_name(enum chat_tmpl_kind k); /* "chatml" | "llama3" */
/* The Jinja text written into synthetic models' tokenizer.chat_template. */
const char *chat_tmpl_jinja(enum chat_tmpl_kind k);
/* The token text that ends an assistant turn ("<|im_end|>" / "<|eot_id|>"). */
const char *chat_tmpl_end_of_turn(enum chat_tmpl_kind k);

/* Render to text.  DX_EINVAL (naming the message index) for an unknown role. */
int chat_tmpl_apply(enum chat_tmpl_kind k, const chat_msg *msgs, size_t n,
                    int add_generation_prompt, dx_buf *out);
/* Render and tokenise (markup with specials, contents without). */
int chat_tmpl_encode(enum chat_tmpl_kind k, const tok *t, const chat_msg *msgs, size_t n,
                     int add_generation_prompt, tok_ids *out);

/* Token-faithful history: called for each assistant message's content with
 * the tokens rendered so far (ctx[0..n_ctx) — everything before the content)
 * and the content.  Return 1 after appending to *out the token ids to use
 * for it (the ids the model generated for that text), 0 to have the text
 * tokenised, or a negative code.  Every part of the rendering is tokenised
 * on its own and the markup after a reply begins with the end-of-turn
 * special token, so a substitution never changes the tokens around it. */
typedef int (*chat_reply_fn)(void *user, const int32_t *ctx, size_t n_ctx, const char *text,
                             size_t len, tok_ids *out);
int chat_tmpl_encode_faithful(enum chat_tmpl_kind k, const tok *t, const chat_msg *msgs, size_t n,
                              int add_generation_prompt, chat_reply_fn reply, void *user,
                              tok_ids *out);

/* Tokenises a chat template's output s (a Jinja template's): each
 * message's content, where it appears verbatim after the previous one (or
 * trimmed of surrounding whitespace, as templates often do), is tokenised
 * without special tokens — an assistant's through `reply` first — and
 * everything else (the template's markup) with them.  A content the
 * template changed beyond trimming is found nowhere and is tokenised as
 * markup, as llama.cpp and vLLM tokenise whole prompts.  With a native
 * template's output this gives chat_tmpl_encode_faithful's tokens. */
int chat_tmpl_encode_rendered(const tok *t, const char *s, size_t len, const chat_msg *msgs,
                              size_t n, chat_reply_fn reply, void *user, tok_ids *out);

#endif
