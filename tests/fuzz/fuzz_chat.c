/* Fuzz target: chat prompts through the model's template — the native
 * ChatML and Llama 3 renderers, a small Jinja template that reads tools,
 * tool calls, reasoning and chat_template_kwargs, and the ChatML template
 * run as Jinja — with arbitrary message JSON, parsed as the server parses a
 * /v1/chat/completions body.  Byte 0 picks the template (bits 0-1) and
 * add_generation_prompt (bit 2); the rest is the body.  Invariants: every
 * failure is an error with a message, never a crash or leak; the prompt's
 * tokens decode to the rendered text; a token-faithful hook that hands back
 * a reply's own tokens changes nothing; with the native templates a
 * conversation that ends in a reply renders and tokenises with the turn
 * before it (plus the generation prompt) as a prefix; and the ChatML text run
 * as Jinja gives the native rendering, text and tokens. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "model/chat_tmpl.h"
#include "model/model.h"
#include "model/model_chat.h"
#include "model/synth.h"
#include "oai/oai_req.h"

/* Reads what the native renderers ignore: tools, tool calls, reasoning,
 * and a kwarg — the shapes real templates (Qwen3's) use. */
static const char k_small_jinja[] =
    "{%- if tools %}<|im_start|>system\n# Tools\n"
    "{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if m.reasoning_content is string and m.reasoning_content %}"
    "<think>\n{{ m.reasoning_content | trim }}\n</think>\n\n{% endif %}"
    "{{- m.content if m.content is string else '' }}"
    "{%- for c in m.tool_calls or [] %}\n<tool_call>\n"
    "{\"name\": {{ c.function.name | tojson }}, \"arguments\": {{ c.function.arguments | tojson }}}"
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{%- endif %}{%- endif %}";

enum { T_CHATML, T_LLAMA3, T_SMALL, T_CHATML_JINJA, N_T };
static model *g_m[N_T];
static char g_dir[64];

static void cleanup(void)
{
    for (int i = 0; i < N_T; i++) model_free(g_m[i]);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (g_dir[0] && system(cmd)) fprintf(stderr, "fuzz_chat: cannot remove %s\n", g_dir);
}

static model *load(enum model_arch arch, const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s.gguf", g_dir, name);
    synth_config c = {.arch = arch, .preset = "tiny", .dtype = DX_F32, .seed = 42};
    model *m = NULL;
    if ((access(path, F_OK) && synth_write(&c, path)) || model_load_tokenizer(path, &m)) {
        fprintf(stderr, "fuzz_chat: %s: %s\n", name, dx_errmsg());
        abort();
    }
    return m;
}

static void setup(void)
{
    oai_json_use_dx_alloc();
    snprintf(g_dir, sizeof g_dir, "/tmp/dx_fuzz_chat_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    atexit(cleanup);
    g_m[T_CHATML] = load(MODEL_QWEN3, "qwen3");
    g_m[T_LLAMA3] = load(MODEL_LLAMA, "llama");
    g_m[T_SMALL] = load(MODEL_QWEN3, "qwen3");
    g_m[T_CHATML_JINJA] = load(MODEL_QWEN3, "qwen3");
    DX_ASSERT(model_set_chat_template(g_m[T_SMALL], k_small_jinja, strlen(k_small_jinja),
                                      "fuzz") == 0);
    /* the same text with a comment: not recognised as duplex's own, so it
     * runs in the interpreter */
    char tj[2048];
    int n = snprintf(tj, sizeof tj, "%s{#- run as Jinja #}", chat_tmpl_jinja(CHAT_TMPL_CHATML));
    DX_ASSERT(model_set_chat_template(g_m[T_CHATML_JINJA], tj, (size_t)n, "fuzz") == 0);
    DX_ASSERT(model_chat_jinja(g_m[T_SMALL]) && model_chat_jinja(g_m[T_CHATML_JINJA]));
}

/* The token-faithful hook at its simplest: a reply's ids are its own text
 * tokenised as the renderer would, so the prompt must not change. */
static int same_reply(void *user, const int32_t *ctx, size_t n_ctx, const char *text, size_t len,
                      tok_ids *out)
{
    (void)ctx, (void)n_ctx;
    if (!len) return 0;
    int rc = tok_encode(user, text, len, 0, out);
    return rc ? rc : 1;
}

typedef struct {
    const model *m;
    const chat_msg *msgs;
    size_t n;
    model_chat_extra x;
} conv;

/* Renders and tokenises c; 0 with *text and *ids, or the render's error. */
static int prompt(const conv *c, size_t n, int gen, dx_buf *text, tok_ids *ids)
{
    dx_buf_reset(text);
    tok_ids_free(ids);
    int rc = model_chat_render(c->m, c->msgs, n, &c->x, gen, text);
    if (rc) {
        DX_ASSERT(rc < 0 && dx_errmsg()[0]);
        return rc;
    }
    DX_ASSERT(model_chat_encode(c->m, c->msgs, n, &c->x, gen, NULL, NULL, ids) == 0);
    return 0;
}

static void check_decodes(const model *m, const dx_buf *text, const tok_ids *ids)
{
    const tok *t = model_tokenizer(m);
    dx_buf d;
    dx_buf_init(&d, 0);
    DX_ASSERT(tok_decode(t, ids->ids, ids->n, &d) == 0);
    /* one BOS in front when the vocabulary asks and the template has none */
    char bos[64];
    int bn = tok_bos(t) >= 0 ? tok_token_bytes(t, tok_bos(t), bos, sizeof bos) : 0;
    size_t skip = d.len == text->len + (size_t)(bn > 0 ? bn : 0) && bn > 0 &&
                          !memcmp(d.data, bos, (size_t)bn)
                      ? (size_t)bn
                      : 0;
    DX_ASSERT(d.len - skip == text->len);
    DX_ASSERT(!text->len || !memcmp(d.data + skip, text->data, text->len));
    dx_buf_free(&d);
}

static void check_hook(const conv *c, int gen, const tok_ids *want)
{
    tok_ids got;
    tok_ids_init(&got);
    DX_ASSERT(model_chat_encode(c->m, c->msgs, c->n, &c->x, gen, same_reply,
                                (void *)model_tokenizer(c->m), &got) == 0);
    DX_ASSERT(got.n == want->n && !memcmp(got.ids, want->ids, got.n * sizeof *got.ids));
    tok_ids_free(&got);
}

/* Native templates: the turn before a closing reply, with the generation
 * prompt, then the reply and the end of turn, is a prefix (text and ids). */
static void check_prefix(const conv *c, enum chat_tmpl_kind k, const dx_buf *text,
                         const tok_ids *ids)
{
    const chat_msg *last = &c->msgs[c->n - 1];
    if (strcmp(last->role, "assistant")) return;
    dx_buf before;
    tok_ids bids;
    dx_buf_init(&before, 0);
    tok_ids_init(&bids);
    DX_ASSERT(prompt(c, c->n - 1, 1, &before, &bids) == 0);
    dx_buf_append(&before, last->content, last->content_len);
    dx_buf_puts(&before, chat_tmpl_end_of_turn(k));
    DX_ASSERT(text->len >= before.len && !memcmp(text->data, before.data, before.len));
    DX_ASSERT(ids->n >= bids.n && !memcmp(ids->ids, bids.ids, bids.n * sizeof *bids.ids));
    dx_buf_free(&before);
    tok_ids_free(&bids);
}

/* The ChatML text run as Jinja renders what the native renderer renders,
 * when every message's content was a plain string. */
static void check_same_as_native(const conv *c, const json_t *sent, int gen, const dx_buf *text,
                                 const tok_ids *ids)
{
    size_t i;
    json_t *m;
    json_array_foreach(sent, i, m) if (!json_is_string(json_object_get(m, "content"))) return;
    conv nc = *c;
    nc.m = g_m[T_CHATML];
    dx_buf nt;
    tok_ids nids;
    dx_buf_init(&nt, 0);
    tok_ids_init(&nids);
    DX_ASSERT(prompt(&nc, c->n, gen, &nt, &nids) == 0);
    DX_ASSERT(nt.len == text->len && (!nt.len || !memcmp(nt.data, text->data, nt.len)));
    DX_ASSERT(nids.n == ids->n && !memcmp(nids.ids, ids->ids, ids->n * sizeof *ids->ids));
    dx_buf_free(&nt);
    tok_ids_free(&nids);
}

static void run(int which, int gen, const oai_req *o)
{
    chat_msg *msgs = dx_malloc((o->n_msgs ? o->n_msgs : 1) * sizeof *msgs);
    DX_ASSERT(msgs);
    for (size_t i = 0; i < o->n_msgs; i++)
        msgs[i] = (chat_msg){o->msgs[i].role, o->msgs[i].content, o->msgs[i].content_len};
    json_t *sent = json_object_get(o->root, "messages");
    conv c = {g_m[which], msgs, o->n_msgs, {sent, o->tools, o->template_kwargs}};
    dx_buf text;
    tok_ids ids;
    dx_buf_init(&text, 0);
    tok_ids_init(&ids);
    if (prompt(&c, c.n, gen, &text, &ids) == 0) {
        check_decodes(c.m, &text, &ids);
        check_hook(&c, gen, &ids);
        if (which <= T_LLAMA3 && c.n)
            check_prefix(&c, which == T_CHATML ? CHAT_TMPL_CHATML : CHAT_TMPL_LLAMA3, &text, &ids);
        if (which == T_CHATML_JINJA) check_same_as_native(&c, sent, gen, &text, &ids);
    }
    dx_buf_free(&text);
    tok_ids_free(&ids);
    dx_free(msgs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (!g_m[0]) setup();
    size_t live = dx_alloc_live_count();
    oai_parse_opts opts = {.n_vocab = 0};
    oai_req o;
    oai_err e;
    if (oai_req_parse(OAI_CHAT, (const char *)data + 1, size - 1, &opts, &o, &e) == 0) {
        run(data[0] & 3, (data[0] >> 2) & 1, &o);
        oai_req_free(&o);
    }
    if (dx_alloc_live_count() != live) abort(); /* a leak */
    return 0;
}
