/* model_chat: a chat request's prompt tokens through the model's own chat
 * template — the GGUF's Jinja (rendered as transformers renders it, with the
 * variables it passes) or, for duplex's synthetic models, the native
 * renderer — tokenised with message contents kept plain (no special tokens
 * from user text), the template's markup with special tokens, assistant
 * replies through the token-faithful hook, and one BOS when the vocabulary
 * asks for it. */
#ifndef MODEL_CHAT_H
#define MODEL_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "model/chat_tmpl.h"
#include "model/model.h"

/* What a request adds to its messages' roles and texts (all may be NULL):
 * the messages as sent (tool_calls, tool_call_id, reasoning_content...; one
 * per chat_msg, in order), the tool definitions, and chat_template_kwargs
 * (enable_thinking...), whose members become template variables. */
typedef struct {
    const json_t *messages;
    const json_t *tools;
    const json_t *kwargs;
} model_chat_extra;

int model_chat_encode(const model *m, const chat_msg *msgs, size_t n, const model_chat_extra *x,
                      int add_gen, chat_reply_fn reply, void *user, tok_ids *out);
/* Reads a --chat-template FILE into the model (model_set_chat_template). */
int model_load_chat_template(model *m, const char *path);

/* The rendered text (the Jinja template's or the native one's). */
int model_chat_render(const model *m, const chat_msg *msgs, size_t n, const model_chat_extra *x,
                      int add_gen, dx_buf *out);

#endif
