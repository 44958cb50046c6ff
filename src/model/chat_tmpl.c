/* chat_tmpl: ChatML and Llama 3 chat templates rendered in C.
 *
 * Each message renders to (header markup, content, trailer markup) and the
 * generation prompt is exactly the header of an assistant message, so
 * render(m[0..N], gen) + reply + end-of-turn is a prefix of
 * render(m[0..N+1]).  Contents are not trimmed (Llama 3's reference template
 * trims them; trimming would break that property for replies that end in
 * whitespace).  Tool results: ChatML wraps them in a user turn with
 * <tool_response> tags, as Qwen's template does; Llama 3 uses its "ipython"
 * role. */
#include "model/chat_tmpl.h"

#include <ctype.h>
#include <string.h>

#include "base/dx_err.h"

static const char k_chatml_jinja[] =
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{'<|im_start|>user\\n<tool_response>\\n' + message['content'] + "
    "'\\n</tool_response><|im_end|>\\n'}}"
    "{% else %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static const char k_llama3_jinja[] =
    "{{- bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + message['content'] + "
    "'<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";

int chat_tmpl_detect(const char *tmpl_text, const char *arch, enum chat_tmpl_kind *out)
{
    if (tmpl_text && strstr(tmpl_text, "<|im_start|>")) {
        *out = CHAT_TMPL_CHATML;
        return 0;
    }
    if (tmpl_text && strstr(tmpl_text, "<|start_header_id|>")) {
        *out = CHAT_TMPL_LLAMA3;
        return 0;
    }
    if (arch && (!strcmp(arch, "qwen2") || !strcmp(arch, "qwen3") || !strcmp(arch, "qwen3moe"))) {
        *out = CHAT_TMPL_CHATML;
        return 0;
    }
    if (arch && !strcmp(arch, "llama")) {
        *out = CHAT_TMPL_LLAMA3;
        return 0;
    }
    return dx_errf(DX_ENOENT, "no supported chat template (template %s, architecture '%s')",
                   tmpl_text ? "not recognised" : "absent", arch ? arch : "?");
}

const char *chat_tmpl_name(enum chat_tmpl_kind k)
{
    return k == CHAT_TMPL_CHATML ? "chatml" : "llama3";
}

const char *chat_tmpl_jinja(enum chat_tmpl_kind k)
{
    return k == CHAT_TMPL_CHATML ? k_chatml_jinja : k_llama3_jinja;
}

const char *chat_tmpl_end_of_turn(enum chat_tmpl_kind k)
{
    return k == CHAT_TMPL_CHATML ? "<|im_end|>" : "<|eot_id|>";
}

/* A message as three parts: markup before the content, the content itself,
 * markup after.  Markup may contain special tokens; content never does. */
typedef struct {
    char head[96];
    const char *tail;
} msg_parts;

static int role_ok(const char *r)
{
    return r && (!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant") ||
                 !strcmp(r, "tool"));
}

static void split_msg(enum chat_tmpl_kind k, const chat_msg *m, msg_parts *p)
{
    int tool = !strcmp(m->role, "tool");
    if (k == CHAT_TMPL_CHATML) {
        if (tool) {
            strcpy(p->head, "<|im_start|>user\n<tool_response>\n");
            p->tail = "\n</tool_response><|im_end|>\n";
        } else {
            strcpy(p->head, "<|im_start|>");
            strcat(p->head, m->role);
            strcat(p->head, "\n");
            p->tail = "<|im_end|>\n";
        }
    } else {
        strcpy(p->head, "<|start_header_id|>");
        strcat(p->head, tool ? "ipython" : m->role);
        strcat(p->head, "<|end_header_id|>\n\n");
        p->tail = "<|eot_id|>";
    }
}

static const char *prologue(enum chat_tmpl_kind k)
{
    return k == CHAT_TMPL_LLAMA3 ? "<|begin_of_text|>" : "";
}

static const char *gen_prompt(enum chat_tmpl_kind k)
{
    return k == CHAT_TMPL_CHATML ? "<|im_start|>assistant\n"
                                 : "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

static int check_msgs(const chat_msg *msgs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!role_ok(msgs[i].role))
            return dx_errf(DX_EINVAL, "messages[%zu].role: '%s' is not system|user|assistant|tool",
                           i, msgs[i].role ? msgs[i].role : "(null)");
        if (!msgs[i].content && msgs[i].content_len)
            return dx_errf(DX_EINVAL, "messages[%zu].content: missing", i);
    }
    return 0;
}

/* Walks the rendering, handing each part to emit in order. */
enum part_kind { PART_CONTENT, PART_MARKUP, PART_REPLY /* an assistant message's content */ };
typedef int (*emit_fn)(void *ctx, const char *s, size_t n, enum part_kind kind);

static int render(enum chat_tmpl_kind k, const chat_msg *msgs, size_t n, int add_gen, emit_fn emit,
                  void *ctx)
{
    int rc = check_msgs(msgs, n);
    if (rc) return rc;
    const char *pro = prologue(k);
    if (*pro && (rc = emit(ctx, pro, strlen(pro), PART_MARKUP))) return rc;
    for (size_t i = 0; i < n; i++) {
        msg_parts p;
        split_msg(k, &msgs[i], &p);
        int reply = !strcmp(msgs[i].role, "assistant");
        if ((rc = emit(ctx, p.head, strlen(p.head), PART_MARKUP))) return rc;
        /* a reply is offered to the hook even when empty: its ids may not be */
        if ((msgs[i].content_len || reply) &&
            (rc = emit(ctx, msgs[i].content ? msgs[i].content : "", msgs[i].content_len,
                       reply ? PART_REPLY : PART_CONTENT)))
            return rc;
        if ((rc = emit(ctx, p.tail, strlen(p.tail), PART_MARKUP))) return rc;
    }
    if (add_gen) rc = emit(ctx, gen_prompt(k), strlen(gen_prompt(k)), PART_MARKUP);
    return rc;
}

static int emit_text(void *ctx, const char *s, size_t n, enum part_kind kind)
{
    (void)kind;
    return dx_buf_append(ctx, s, n);
}

int chat_tmpl_apply(enum chat_tmpl_kind k, const chat_msg *msgs, size_t n, int add_gen, dx_buf *out)
{
    return render(k, msgs, n, add_gen, emit_text, out);
}

typedef struct {
    const tok *t;
    tok_ids *out;
    chat_reply_fn reply;
    void *user;
} enc_ctx;

static int emit_tokens(void *ctx, const char *s, size_t n, enum part_kind kind)
{
    enc_ctx *c = ctx;
    if (kind == PART_REPLY && c->reply) {
        int rc = c->reply(c->user, c->out->ids, c->out->n, s, n, c->out);
        if (rc) return rc < 0 ? rc : 0;
    }
    if (!n) return 0;
    return tok_encode(c->t, s, n, kind == PART_MARKUP ? TOK_ALLOW_SPECIAL : 0, c->out);
}

int chat_tmpl_encode(enum chat_tmpl_kind k, const tok *t, const chat_msg *msgs, size_t n,
                     int add_gen, tok_ids *out)
{
    return chat_tmpl_encode_faithful(k, t, msgs, n, add_gen, NULL, NULL, out);
}

/* Whether the rendering's first markup is the vocabulary's BOS token (the
 * Llama 3 template opens with bos_token). */
static int opens_with_bos(enum chat_tmpl_kind k, const tok *t)
{
    char bos[128];
    int n = tok_token_bytes(t, tok_bos(t), bos, sizeof bos);
    const char *pro = prologue(k);
    return n > 0 && strlen(pro) >= (size_t)n && !memcmp(pro, bos, (size_t)n);
}

int chat_tmpl_encode_faithful(enum chat_tmpl_kind k, const tok *t, const chat_msg *msgs, size_t n,
                              int add_gen, chat_reply_fn reply, void *user, tok_ids *out)
{
    enc_ctx c = {t, out, reply, user};
    size_t start = out->n;
    /* A vocabulary that asks for BOS gets exactly one: llama.cpp tokenises
     * the rendered prompt with add_special after stripping a BOS the
     * template wrote itself, which comes to the same. */
    int rc = tok_add_bos(t) && !opens_with_bos(k, t) ? tok_ids_push(out, tok_bos(t)) : 0;
    if (!rc) rc = render(k, msgs, n, add_gen, emit_tokens, &c);
    if (rc) out->n = start;
    return rc;
}

/* Where msg's content (or its trimmed form) first appears in s[from..len). */
static int find_content(const char *s, size_t len, size_t from, const chat_msg *m, size_t *at,
                        size_t *n)
{
    const char *c = m->content ? m->content : "";
    size_t cl = m->content_len;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) { /* the trimmed form: `| trim`, `.strip()` */
            while (cl && isspace((unsigned char)*c)) c++, cl--;
            while (cl && isspace((unsigned char)c[cl - 1])) cl--;
        }
        if (!cl) return 0;
        const char *p = memmem(s + from, len - from, c, cl);
        if (p) {
            *at = (size_t)(p - s);
            *n = cl;
            return 1;
        }
    }
    return 0;
}

int chat_tmpl_encode_rendered(const tok *t, const char *s, size_t len, const chat_msg *msgs,
                              size_t n, chat_reply_fn reply, void *user, tok_ids *out)
{
    enc_ctx c = {t, out, reply, user};
    size_t pos = 0, start = out->n;
    int rc = check_msgs(msgs, n);
    /* one BOS when the vocabulary asks for it and the template did not
     * write it (Llama 3's opens with {{ bos_token }}) */
    char bos[128];
    int bl = tok_add_bos(t) ? tok_token_bytes(t, tok_bos(t), bos, sizeof bos) : 0;
    if (!rc && bl > 0 && !(len >= (size_t)bl && !memcmp(s, bos, (size_t)bl)))
        rc = tok_ids_push(out, tok_bos(t));
    for (size_t i = 0; !rc && i < n; i++) {
        size_t at, cl;
        if (!find_content(s, len, pos, &msgs[i], &at, &cl)) continue;
        int is_reply = !strcmp(msgs[i].role, "assistant");
        rc = emit_tokens(&c, s + pos, at - pos, PART_MARKUP);
        if (!rc) rc = emit_tokens(&c, s + at, cl, is_reply ? PART_REPLY : PART_CONTENT);
        pos = at + cl;
    }
    if (!rc) rc = emit_tokens(&c, s + pos, len - pos, PART_MARKUP);
    if (rc) out->n = start;
    return rc;
}
