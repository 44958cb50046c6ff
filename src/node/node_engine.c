/* node_engine: node_backend over engine_* and the model's tokenizer.
 *
 * Completions prompts are tokenised as plain text without special tokens,
 * with BOS first when the vocabulary asks (tokenizer.ggml.add_bos_token, as
 * llama.cpp and vLLM add it), exactly as `duplex generate --prompt` does, so
 * the two give the same tokens; chat prompts go through the model's chat
 * template with the generation prompt appended (`duplex generate --chat`). */
#include "node/node_engine.h"

#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

static int be_submit(void *self, const engine_request *req, uint64_t *id)
{
    return engine_submit(self, req, id);
}

static int be_cancel(void *self, uint64_t id)
{
    return engine_cancel(self, id);
}

static void be_stats(void *self, engine_stats *out)
{
    engine_get_stats(self, out);
}

static void be_cost(void *self, step_cost_model *out)
{
    engine_get_cost(self, out);
}

/* Hands the ids over as one dx_malloc'd array (the caller frees it). */
static int take_ids(int rc, tok_ids *v, int32_t **ids, size_t *n)
{
    if (rc == 0) {
        *ids = dx_memdup(v->ids ? v->ids : (int32_t[1]){0}, (v->n ? v->n : 1) * sizeof **ids);
        *n = v->n;
        if (!*ids) rc = dx_errf(DX_ENOMEM, "%zu token ids", v->n);
    }
    tok_ids_free(v);
    return rc;
}

static int be_encode_chat(void *self, const chat_msg *msgs, size_t n, const model_chat_extra *x,
                          chat_reply_fn reply, void *reply_user, int32_t **ids, size_t *n_ids)
{
    const model *m = engine_model(self);
    tok_ids v;
    tok_ids_init(&v);
    int rc = model_chat_encode(m, msgs, n, x, 1, reply, reply_user, &v);
    return take_ids(rc, &v, ids, n_ids);
}

static int be_gram_prepare(void *self)
{
    const gram_vocab *v;
    return engine_gram_vocab(self, &v);
}

static void end_add(node_backend *out, int32_t id)
{
    int dup = id < 0;
    for (size_t j = 0; j < out->n_end; j++) dup |= out->end_ids[j] == id;
    if (!dup && out->n_end < NODE_MAX_END_IDS) out->end_ids[out->n_end++] = id;
}

/* The vocabulary's end-of-generation set (what stops the engine) and the
 * chat template's end-of-turn token, each once. */
static void end_ids(const model *m, node_backend *out)
{
    const tok *t = model_tokenizer(m);
    const char *eot = chat_tmpl_end_of_turn(model_chat_kind(m));
    size_t n;
    const int32_t *eog = tok_eog_ids(t, &n);
    for (size_t i = 0; i < n; i++) end_add(out, eog[i]);
    end_add(out, tok_find(t, eot, strlen(eot)));
}

static int be_encode_text(void *self, const char *text, size_t len, int32_t **ids, size_t *n_ids)
{
    const model *m = engine_model(self);
    tok_ids v;
    tok_ids_init(&v);
    int rc = tok_encode(model_tokenizer(m), text, len, TOK_ADD_SPECIAL, &v);
    return take_ids(rc, &v, ids, n_ids);
}

void node_engine_backend(engine *e, const model *m, node_backend *out)
{
    memset(out, 0, sizeof *out);
    out->self = e;
    out->submit = be_submit;
    out->cancel = be_cancel;
    out->stats = be_stats;
    out->encode_chat = be_encode_chat;
    out->encode_text = be_encode_text;
    out->gram_prepare = be_gram_prepare;
    out->cost = be_cost;
    out->batch_tokens = engine_max_batch_tokens(e);
    out->model_name = model_name(m);
    /* an id must index the embedding and decode to text */
    uint32_t n_tok = (uint32_t)tok_vocab_size(model_tokenizer(m));
    out->n_vocab = model_hp(m)->n_vocab < n_tok ? model_hp(m)->n_vocab : n_tok;
    out->n_ctx = engine_n_ctx(e);
    out->tk = model_tokenizer(m);
    end_ids(m, out);
}
