/* model_chat: chat prompts through the model's template (see .h). */
#include "model/model_chat.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_err.h"
#include "jinja/jinja.h"

/* A token's text as a template variable ("" when the vocabulary has none). */
static json_t *token_text(const tok *t, int32_t id)
{
    char b[256];
    int n = id >= 0 ? tok_token_bytes(t, id, b, sizeof b) : 0;
    return json_stringn(b, n > 0 ? (size_t)n : 0);
}

/* The messages the template sees: the request's objects (shallow copies)
 * with duplex's reading of role and content — "developer" as "system",
 * text parts joined, null as "" — or, without them, {role, content} from
 * msgs. */
static json_t *template_messages(const chat_msg *msgs, size_t n, const json_t *sent)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        json_t *src = sent ? json_array_get(sent, i) : NULL;
        json_t *o = json_is_object(src) ? json_copy((json_t *)src) : json_object();
        if (!o || json_object_set_new(o, "role", json_string(msgs[i].role))) goto fail;
        /* content as text, always: a null one (an assistant turn of tool
         * calls only, as the OpenAI SDK sends it back) is "" — templates
         * test `'</think>' in message.content`, which null fails, and vLLM
         * and llama.cpp give templates "" there too */
        if (json_object_set_new(o, "content", json_stringn(msgs[i].content ? msgs[i].content : "",
                                                           msgs[i].content_len)))
            goto fail;
        if (json_array_append_new(arr, o)) goto fail;
        continue;
    fail:
        json_decref(o);
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static int render_jinja(const model *m, const chat_msg *msgs, size_t n, const model_chat_extra *x,
                        int add_gen, dx_buf *out)
{
    const tok *t = model_tokenizer(m);
    json_t *vars = json_object();
    const char *key;
    json_t *v;
    if (vars && x && json_is_object(x->kwargs))
        json_object_foreach((json_t *)x->kwargs, key, v) json_object_set(vars, key, v);
    json_t *msgs_j = template_messages(msgs, n, x ? x->messages : NULL);
    int rc = vars && msgs_j ? 0 : dx_errf(DX_ENOMEM, "out of memory");
    if (!rc) {
        json_object_set_new(vars, "messages", msgs_j);
        msgs_j = NULL;
        if (x && x->tools) json_object_set(vars, "tools", (json_t *)x->tools);
        json_object_set_new(vars, "add_generation_prompt", json_boolean(add_gen));
        json_object_set_new(vars, "bos_token", token_text(t, tok_bos(t)));
        json_object_set_new(vars, "eos_token", token_text(t, tok_eos(t)));
        rc = jinja_render(model_chat_jinja(m), vars, out);
        if (rc) rc = dx_err_wrap(rc, "the chat template");
    }
    json_decref(msgs_j);
    json_decref(vars);
    return rc;
}

int model_chat_render(const model *m, const chat_msg *msgs, size_t n, const model_chat_extra *x,
                      int add_gen, dx_buf *out)
{
    if (model_chat_error(m)) return dx_errf(DX_EINVAL, "%s", model_chat_error(m));
    if (!model_chat_jinja(m)) return chat_tmpl_apply(model_chat_kind(m), msgs, n, add_gen, out);
    return render_jinja(m, msgs, n, x, add_gen, out);
}

int model_chat_encode(const model *m, const chat_msg *msgs, size_t n, const model_chat_extra *x,
                      int add_gen, chat_reply_fn reply, void *user, tok_ids *out)
{
    const tok *t = model_tokenizer(m);
    if (model_chat_error(m)) return dx_errf(DX_EINVAL, "%s", model_chat_error(m));
    if (!model_chat_jinja(m))
        return chat_tmpl_encode_faithful(model_chat_kind(m), t, msgs, n, add_gen, reply, user, out);
    dx_buf text;
    dx_buf_init(&text, 0);
    int rc = render_jinja(m, msgs, n, x, add_gen, &text);
    if (!rc)
        rc = chat_tmpl_encode_rendered(t, text.data ? text.data : "", text.len, msgs, n, reply,
                                       user, out);
    dx_buf_free(&text);
    return rc;
}

int model_load_chat_template(model *m, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return dx_errf(DX_EIO, "--chat-template %s: %s", path, strerror(errno));
    dx_buf b;
    dx_buf_init(&b, 0);
    char chunk[65536];
    size_t n;
    int rc = 0;
    while (!rc && (n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        rc = dx_buf_append(&b, chunk, n);
        if (!rc && b.len > JINJA_MAX_SOURCE)
            rc = dx_errf(DX_ETOOBIG, "--chat-template %s: over %u bytes", path, JINJA_MAX_SOURCE);
    }
    if (!rc && ferror(f)) rc = dx_errf(DX_EIO, "--chat-template %s: read error", path);
    fclose(f);
    if (!rc) {
        char where[600];
        snprintf(where, sizeof where, "--chat-template %s", path);
        rc = model_set_chat_template(m, b.data ? b.data : "", b.len, where);
    }
    dx_buf_free(&b);
    return rc;
}
