/* model: load a GGUF model (llama / qwen2 / qwen3 / qwen3moe, and llama
 * with experts) for the engine.
 *
 * Weights stay in the mmap and are used in place, the stacked expert
 * tensors too (the engine addresses expert e's matrix inside them).  1-D
 * tensors (norm weights, biases) are small and converted once into owned f32
 * arrays, so kernels only ever see f32 vectors.  Every tensor is checked for
 * presence, shape and type — any type dx_dtype_supported() lists, each tensor
 * its own (llama-quantize mixes them) — and the error names it. */
#include "model/model.h"

#include "jinja/jinja.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "tok/tok_norm.h"

struct model {
    gguf_ctx *g;
    char *path;
    char name[128];
    model_hparams hp;
    model_tensor tok_embd, output_norm, output, rope_freqs;
    model_layer *layers;
    float **owned; /* f32 copies of 1-D tensors */
    size_t n_owned, cap_owned;
    tok *tk;
    enum chat_tmpl_kind chat;
    char *chat_text;   /* tokenizer.chat_template (or --chat-template), or NULL */
    jinja_tmpl *jinja; /* chat_text parsed, unless it is a template duplex renders natively */
    char *chat_err;    /* why the template cannot be run, or NULL */
    uint64_t fingerprint[2];
    uint64_t n_params;
};

/* GGUF namespaces hyper-parameters by architecture: "{arch}.{suffix}".  A
 * missing optional key keeps the caller's default; anything else wrong is an
 * error that names the file. */
static int arch_rc(const model *m, int rc, int required)
{
    if (rc == DX_ENOENT && !required) return 0;
    return rc ? dx_err_wrap(rc, "%s", m->path) : 0;
}

static const char *arch_key(const model *m, const char *suffix, char key[128])
{
    snprintf(key, 128, "%s.%s", m->hp.arch_name, suffix);
    return key;
}

static int get_u32_arch(const model *m, const char *suffix, uint32_t *out, int required)
{
    char key[128];
    return arch_rc(m, gguf_get_u32(m->g, arch_key(m, suffix, key), out), required);
}

static int get_f32_arch(const model *m, const char *suffix, float *out, int required)
{
    char key[128];
    return arch_rc(m, gguf_get_f32(m->g, arch_key(m, suffix, key), out), required);
}

static int get_bool_arch(const model *m, const char *suffix, int *out)
{
    char key[128];
    return arch_rc(m, gguf_get_bool(m->g, arch_key(m, suffix, key), out), 0);
}

/* The experts' keys as llama.cpp reads them for these architectures:
 * expert_count and expert_used_count (both, or neither for a dense model),
 * qwen3moe's expert_feed_forward_length (llama.cpp's fallback without it:
 * n_ff / n_expert_used; llama's experts are n_ff wide).  The gating is
 * softmax for both families; a file asking for another is refused. */
static int load_moe_hparams(model *m)
{
    model_hparams *hp = &m->hp;
    uint32_t gating = 1; /* llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX */
    int rc;
    hp->expert_weights_norm = 1;
    if ((rc = get_u32_arch(m, "expert_count", &hp->n_expert, 0)) ||
        (rc = get_u32_arch(m, "expert_used_count", &hp->n_expert_used, 0)) ||
        (rc = get_u32_arch(m, "expert_feed_forward_length", &hp->n_ff_exp, 0)) ||
        (rc = get_bool_arch(m, "expert_weights_norm", &hp->expert_weights_norm)) ||
        (rc = get_u32_arch(m, "expert_gating_func", &gating, 0)))
        return rc;
    const char *a = hp->arch_name;
    if (!hp->n_expert && hp->arch == MODEL_QWEN3MOE)
        return dx_errf(DX_EFORMAT,
                       "%s: %s.expert_count is missing or 0 (qwen3moe routes every "
                       "FFN to experts)",
                       m->path, a);
    if (hp->n_expert && hp->arch != MODEL_QWEN3MOE && hp->arch != MODEL_LLAMA)
        return dx_errf(DX_EUNSUPPORTED,
                       "%s: %s.expert_count is %u: experts are supported in "
                       "qwen3moe and llama models only",
                       m->path, a, hp->n_expert);
    if (!hp->n_expert) {
        if (hp->n_expert_used)
            return dx_errf(DX_EFORMAT, "%s: %s.expert_used_count is %u without %s.expert_count",
                           m->path, a, hp->n_expert_used, a);
        hp->n_ff_exp = 0;
        return 0;
    }
    if (hp->n_expert > MODEL_MAX_EXPERTS || !hp->n_expert_used ||
        hp->n_expert_used > hp->n_expert || hp->n_expert_used > MODEL_MAX_EXPERTS_USED)
        return dx_errf(DX_EFORMAT,
                       "%s: %s.expert_used_count is %u and %s.expert_count %u (want "
                       "1 <= used <= count <= %d, used <= %d)",
                       m->path, a, hp->n_expert_used, a, hp->n_expert, MODEL_MAX_EXPERTS,
                       MODEL_MAX_EXPERTS_USED);
    if (gating > 1)
        return dx_errf(DX_EUNSUPPORTED,
                       "%s: %s.expert_gating_func is %u (duplex routes with "
                       "softmax, 1)",
                       m->path, a, gating);
    if (hp->arch == MODEL_LLAMA) hp->n_ff_exp = hp->n_ff;
    if (!hp->n_ff_exp) hp->n_ff_exp = hp->n_ff / hp->n_expert_used;
    if (!hp->n_ff_exp)
        return dx_errf(DX_EFORMAT, "%s: the experts' feed-forward length is 0", m->path);
    return 0;
}

static int load_hparams(model *m)
{
    gguf_str a;
    int rc = gguf_get_str(m->g, "general.architecture", &a);
    if (rc) return dx_err_wrap(rc, "%s", m->path);
    model_hparams *hp = &m->hp;
    if (a.len >= sizeof hp->arch_name) a.len = sizeof hp->arch_name - 1;
    memcpy(hp->arch_name, a.ptr, a.len);
    hp->arch_name[a.len] = 0;
    if (!strcmp(hp->arch_name, "llama"))
        hp->arch = MODEL_LLAMA;
    else if (!strcmp(hp->arch_name, "qwen2"))
        hp->arch = MODEL_QWEN2;
    else if (!strcmp(hp->arch_name, "qwen3"))
        hp->arch = MODEL_QWEN3;
    else if (!strcmp(hp->arch_name, "qwen3moe"))
        hp->arch = MODEL_QWEN3MOE;
    else
        return dx_errf(DX_EUNSUPPORTED,
                       "%s: architecture '%s' is not supported (llama|qwen2|qwen3|qwen3moe)",
                       m->path, hp->arch_name);
    hp->rope_neox = hp->arch != MODEL_LLAMA;
    hp->qk_norm = hp->arch == MODEL_QWEN3 || hp->arch == MODEL_QWEN3MOE;
    hp->qkv_bias = hp->arch == MODEL_QWEN2;
    hp->rms_eps = 1e-6f;
    hp->rope_base = 10000.0f;
    hp->n_ctx_train = 4096;
    if ((rc = get_u32_arch(m, "embedding_length", &hp->n_embd, 1)) ||
        (rc = get_u32_arch(m, "block_count", &hp->n_layer, 1)) ||
        (rc = get_u32_arch(m, "feed_forward_length", &hp->n_ff, 1)) ||
        (rc = get_u32_arch(m, "attention.head_count", &hp->n_head, 1)) ||
        (rc = get_u32_arch(m, "context_length", &hp->n_ctx_train, 0)) ||
        (rc = get_f32_arch(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps, 0)) ||
        (rc = get_f32_arch(m, "rope.freq_base", &hp->rope_base, 0)))
        return rc;
    hp->n_kv_head = hp->n_head;
    if ((rc = get_u32_arch(m, "attention.head_count_kv", &hp->n_kv_head, 0))) return rc;
    hp->head_dim = hp->n_head ? hp->n_embd / hp->n_head : 0;
    if ((rc = get_u32_arch(m, "attention.key_length", &hp->head_dim, 0))) return rc;
    uint32_t vlen = hp->head_dim;
    if ((rc = get_u32_arch(m, "attention.value_length", &vlen, 0))) return rc;
    if (!hp->n_embd || !hp->n_layer || !hp->n_ff || !hp->n_head || !hp->n_kv_head ||
        hp->n_head % hp->n_kv_head || !hp->head_dim || hp->head_dim % 2 || vlen != hp->head_dim ||
        hp->head_dim > 512 || hp->n_layer > 1024 || hp->n_ctx_train == 0)
        return dx_errf(DX_EFORMAT,
                       "%s: inconsistent hyper-parameters (embd %u, layers %u, ff %u, heads %u/%u, "
                       "head dim %u/%u, context %u)",
                       m->path, hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head, hp->n_kv_head,
                       hp->head_dim, vlen, hp->n_ctx_train);
    if (!(hp->rms_eps > 0 && hp->rms_eps < 1) || !(hp->rope_base > 1))
        return dx_errf(DX_EFORMAT, "%s: bad rms epsilon %g or rope base %g", m->path, hp->rms_eps,
                       hp->rope_base);
    return load_moe_hparams(m);
}

static int own_f32(model *m, const gguf_tensor_info *ti, model_tensor *t)
{
    if (m->n_owned == m->cap_owned) {
        size_t cap = m->cap_owned ? m->cap_owned * 2 : 64;
        float **p = dx_realloc(m->owned, cap * sizeof *p);
        if (!p) return dx_errf(DX_ENOMEM, "out of memory loading %s", m->path);
        m->owned = p;
        m->cap_owned = cap;
    }
    float *f = dx_malloc(ti->ne[0] * sizeof(float));
    if (!f) return dx_errf(DX_ENOMEM, "out of memory loading %s", m->path);
    m->owned[m->n_owned++] = f;
    int rc = dx_dtype_to_f32_row(ti->type, ti->data, f, ti->ne[0]);
    if (rc) return rc;
    t->data = f;
    t->type = DX_F32;
    return 0;
}

static void fmt_shape(char *buf, size_t cap, uint32_t n_dims, const uint64_t *ne)
{
    size_t off = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < n_dims && off < cap; d++)
        off += (size_t)snprintf(buf + off, cap - off, "%s%llu", d ? ", " : "",
                                (unsigned long long)ne[d]);
    if (off < cap) snprintf(buf + off, cap - off, "]");
}

/* Bind tensor `name` expecting shape want[0 .. n_dims): 1 dim, a vector
 * (converted to f32); 2, a matrix; 3, stacked experts' matrices. */
static int bind_nd(model *m, const char *name, uint32_t n_dims, const uint64_t *want, int optional,
                   model_tensor *t)
{
    gguf_tensor_info ti;
    memset(t, 0, sizeof *t);
    int rc = gguf_find_tensor(m->g, name, &ti);
    if (rc == DX_ENOENT && optional) return 0;
    if (rc) return dx_errf(rc, "%s: tensor '%s' is missing", m->path, name);
    int ok = ti.n_dims == n_dims;
    for (uint32_t d = 0; d < n_dims && ok; d++) ok = ti.ne[d] == want[d];
    if (!ok) {
        char have[96], need[96];
        fmt_shape(have, sizeof have, ti.n_dims, ti.ne);
        fmt_shape(need, sizeof need, n_dims, want);
        return dx_errf(DX_EFORMAT, "%s: tensor '%s' has shape %s, want %s", m->path, name, have,
                       need);
    }
    if (!dx_dtype_supported(ti.type))
        return dx_errf(DX_EUNSUPPORTED,
                       "%s: tensor '%s' has type %s (id %d), which duplex cannot run "
                       "(supported: %s)",
                       m->path, name, dx_dtype_name(ti.type), ti.type,
                       dx_dtype_supported_names());
    for (uint32_t d = 0; d < 3; d++) t->ne[d] = d < n_dims ? want[d] : 1;
    m->n_params += t->ne[0] * t->ne[1] * t->ne[2];
    if (n_dims == 1) return own_f32(m, &ti, t);
    t->data = ti.data;
    t->type = ti.type;
    return 0;
}

/* Bind tensor `name` expecting shape [n_in, rows] (rows = 0 for a vector). */
static int bind(model *m, const char *name, uint64_t n_in, uint64_t rows, int optional,
                model_tensor *t)
{
    const uint64_t want[2] = {n_in, rows};
    return bind_nd(m, name, rows ? 2 : 1, want, optional, t);
}

/* An MoE layer's router and experts (ggml's ne order, see model.h). */
static int bind_experts(model *m, uint32_t i, model_layer *L)
{
    const model_hparams *hp = &m->hp;
    uint64_t e = hp->n_embd, ff = hp->n_ff_exp, x = hp->n_expert;
    const struct {
        const char *suffix;
        uint32_t n_dims;
        uint64_t ne[3];
        model_tensor *t;
    } want[] = {
        {"ffn_gate_inp.weight", 2, {e, x, 1}, &L->ffn_gate_inp},
        {"ffn_gate_exps.weight", 3, {e, ff, x}, &L->ffn_gate_exps},
        {"ffn_up_exps.weight", 3, {e, ff, x}, &L->ffn_up_exps},
        {"ffn_down_exps.weight", 3, {ff, e, x}, &L->ffn_down_exps},
    };
    for (size_t k = 0; k < DX_ARRAY_LEN(want); k++) {
        char n[96];
        snprintf(n, sizeof n, "blk.%u.%s", i, want[k].suffix);
        int rc = bind_nd(m, n, want[k].n_dims, want[k].ne, 0, want[k].t);
        if (rc) return rc;
    }
    return 0;
}

static int bind_layer(model *m, uint32_t i)
{
    const model_hparams *hp = &m->hp;
    model_layer *L = &m->layers[i];
    uint64_t e = hp->n_embd, q = (uint64_t)hp->n_head * hp->head_dim,
             kv = (uint64_t)hp->n_kv_head * hp->head_dim, ff = hp->n_ff;
    char n[96];
    int rc = 0;
#define B(field, suffix, nin, rows, opt)                                                           \
    snprintf(n, sizeof n, "blk.%u.%s", i, suffix);                                                 \
    if ((rc = bind(m, n, nin, rows, opt, &L->field))) return rc;
    B(attn_norm, "attn_norm.weight", e, 0, 0);
    B(wq, "attn_q.weight", e, q, 0);
    B(wk, "attn_k.weight", e, kv, 0);
    B(wv, "attn_v.weight", e, kv, 0);
    B(wo, "attn_output.weight", q, e, 0);
    B(ffn_norm, "ffn_norm.weight", e, 0, 0);
    if (!hp->n_expert) {
        B(w_gate, "ffn_gate.weight", e, ff, 0);
        B(w_up, "ffn_up.weight", e, ff, 0);
        B(w_down, "ffn_down.weight", ff, e, 0);
    }
    int opt_bias = hp->arch != MODEL_QWEN2;
    B(bq, "attn_q.bias", q, 0, opt_bias);
    B(bk, "attn_k.bias", kv, 0, opt_bias);
    B(bv, "attn_v.bias", kv, 0, opt_bias);
    int opt_norm = !hp->qk_norm;
    B(q_norm, "attn_q_norm.weight", hp->head_dim, 0, opt_norm);
    B(k_norm, "attn_k_norm.weight", hp->head_dim, 0, opt_norm);
#undef B
    return hp->n_expert ? bind_experts(m, i, L) : 0;
}

typedef struct {
    int add_bos, add_eos;
    enum tok_norm norm;
} tok_flags;

/* An optional boolean key; anything but a bool is an error naming it. */
static int get_opt_bool(const model *m, const char *key, int *v)
{
    int rc = gguf_get_bool(m->g, key, v);
    return rc == DX_ENOENT ? 0 : rc ? dx_err_wrap(rc, "%s", m->path) : 0;
}

/* add_bos_token defaults as in llama.cpp: on for the Llama 3 pre-tokenizer,
 * off otherwise, and the file's key wins.  The normalizer is duplex's own
 * key (duplex model synth --tokenizer writes it from tokenizer.json); a
 * file converted elsewhere has none and is not normalised, as llama.cpp
 * does not normalise either, so both give the same tokens for it. */
static int load_tok_flags(const model *m, enum tok_pre pre, tok_flags *out)
{
    out->add_bos = pre == TOK_PRE_LLAMA3;
    out->add_eos = 0;
    out->norm = TOK_NORM_NONE;
    int rc;
    if ((rc = get_opt_bool(m, "tokenizer.ggml.add_bos_token", &out->add_bos)) ||
        (rc = get_opt_bool(m, "tokenizer.ggml.add_eos_token", &out->add_eos)))
        return rc;
    gguf_str s;
    rc = gguf_get_str(m->g, MODEL_KEY_NORMALIZER, &s);
    if (rc == DX_ENOENT) return 0;
    if (rc) return dx_err_wrap(rc, "%s", m->path);
    if ((rc = tok_norm_parse(s.ptr, (size_t)s.len, &out->norm)))
        return dx_err_wrap(rc, "%s: %s", m->path, MODEL_KEY_NORMALIZER);
    return 0;
}

static int load_tokenizer(model *m)
{
    gguf_str s;
    int rc = gguf_get_str(m->g, "tokenizer.ggml.model", &s);
    if (rc) return dx_err_wrap(rc, "%s", m->path);
    if (!gguf_str_eq(s, "gpt2"))
        return dx_errf(DX_EUNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' is not supported (gpt2)",
                       m->path, (int)s.len, s.ptr);
    enum tok_pre pre = m->hp.arch == MODEL_LLAMA ? TOK_PRE_LLAMA3 : TOK_PRE_QWEN2;
    if (gguf_get_str(m->g, "tokenizer.ggml.pre", &s) == 0 && (rc = tok_pre_parse(s.ptr, s.len, &pre)))
        return dx_err_wrap(rc, "%s", m->path);
    enum gguf_vtype et;
    uint64_t n_tok = 0, n_merge = 0, n_types = 0;
    const void *types = NULL, *unused;
    if ((rc = gguf_get_arr(m->g, "tokenizer.ggml.tokens", &et, &n_tok, &unused)))
        return dx_err_wrap(rc, "%s", m->path);
    if (et != GGUF_T_STRING || n_tok == 0 || n_tok > (1u << 24))
        return dx_errf(DX_EFORMAT, "%s: tokenizer.ggml.tokens must be a non-empty string array",
                       m->path);
    if (gguf_get_arr(m->g, "tokenizer.ggml.token_type", &et, &n_types, &types) == 0 &&
        (et != GGUF_T_INT32 || n_types != n_tok))
        return dx_errf(DX_EFORMAT, "%s: tokenizer.ggml.token_type must be %llu int32 values",
                       m->path, (unsigned long long)n_tok);
    if (gguf_get_arr(m->g, "tokenizer.ggml.merges", &et, &n_merge, &unused) == 0 &&
        et != GGUF_T_STRING)
        return dx_errf(DX_EFORMAT, "%s: tokenizer.ggml.merges must be a string array", m->path);

    tok_strview *tv = dx_calloc(n_tok, sizeof *tv);
    tok_strview *mv = dx_calloc(n_merge ? n_merge : 1, sizeof *mv);
    int32_t *tt = n_types ? dx_calloc(n_tok, sizeof *tt) : NULL;
    if (!tv || !mv || (n_types && !tt)) {
        rc = dx_errf(DX_ENOMEM, "out of memory loading the tokenizer of %s", m->path);
        goto out;
    }
    for (uint64_t i = 0; i < n_tok; i++) {
        gguf_get_arr_str(m->g, "tokenizer.ggml.tokens", i, &s);
        tv[i].ptr = s.ptr;
        tv[i].len = s.len;
    }
    for (uint64_t i = 0; i < n_merge; i++) {
        gguf_get_arr_str(m->g, "tokenizer.ggml.merges", i, &s);
        mv[i].ptr = s.ptr;
        mv[i].len = s.len;
    }
    if (tt) memcpy(tt, types, n_tok * sizeof *tt);
    uint32_t bos = (uint32_t)-1, eos = (uint32_t)-1, eot = (uint32_t)-1;
    gguf_get_u32(m->g, "tokenizer.ggml.bos_token_id", &bos);
    gguf_get_u32(m->g, "tokenizer.ggml.eos_token_id", &eos);
    gguf_get_u32(m->g, "tokenizer.ggml.eot_token_id", &eot);
    tok_flags fl;
    if ((rc = load_tok_flags(m, pre, &fl))) goto out;
    tok_config tc = {.add_bos = fl.add_bos,
                     .add_eos = fl.add_eos,
                     .norm = fl.norm,
                     .tokens = tv,
                     .n_tokens = n_tok,
                     .token_types = tt,
                     .merges = mv,
                     .n_merges = n_merge,
                     .pre = pre,
                     .bos = (int32_t)bos,
                     .eos = (int32_t)eos,
                     .eot = (int32_t)eot};
    rc = tok_create(&tc, &m->tk);
    if (rc) dx_err_wrap(rc, "%s: tokenizer", m->path);
out:
    dx_free(tv);
    dx_free(mv);
    dx_free(tt);
    return rc;
}

/* The template as Jinja unless it is one of duplex's own (synthetic
 * models' ChatML and Llama 3), which render natively. */
static int parse_chat(model *m, const char *where)
{
    jinja_free(m->jinja);
    m->jinja = NULL;
    if (!m->chat_text || !strcmp(m->chat_text, chat_tmpl_jinja(m->chat))) return 0;
    int rc = jinja_parse(m->chat_text, strlen(m->chat_text), &m->jinja);
    return rc ? dx_err_wrap(rc, "%s: the chat template (%s) cannot be run; --chat-template FILE "
                                "gives another",
                            m->path, where)
              : 0;
}

static int load_chat(model *m)
{
    gguf_str s;
    char *text = NULL;
    if (gguf_get_str(m->g, "tokenizer.chat_template", &s) == 0) {
        text = dx_strndup(s.ptr, s.len);
        if (!text) return dx_errf(DX_ENOMEM, "out of memory");
    }
    m->chat_text = text;
    /* the family: a native rendering, the tool-call format, the end of a
     * turn; a template duplex runs as Jinja needs none it can name */
    int rc = chat_tmpl_detect(text, m->hp.arch_name, &m->chat);
    if (rc && text) {
        m->chat = CHAT_TMPL_CHATML;
        rc = 0;
    }
    if (rc) return dx_err_wrap(rc, "%s", m->path);
    /* a template that cannot be run is the caller's error to report (serve
     * and generate stop, unless --chat-template gives another) */
    if (parse_chat(m, "tokenizer.chat_template") && !(m->chat_err = dx_strdup(dx_errmsg())))
        return dx_errf(DX_ENOMEM, "out of memory");
    return 0;
}

int model_set_chat_template(model *m, const char *text, size_t len, const char *where)
{
    char *t = dx_strndup(text, len);
    if (!t) return dx_errf(DX_ENOMEM, "out of memory");
    if (strlen(t) != len) {
        dx_free(t);
        return dx_errf(DX_EINVAL, "%s: a chat template cannot contain NUL bytes", where);
    }
    char *old = m->chat_text;
    jinja_tmpl *old_j = m->jinja;
    m->chat_text = t;
    m->jinja = NULL;
    enum chat_tmpl_kind k;
    if (chat_tmpl_detect(t, m->hp.arch_name, &k) == 0) m->chat = k;
    int rc = parse_chat(m, where);
    if (rc) { /* keep the model's own */
        dx_free(t);
        m->chat_text = old;
        m->jinja = old_j;
        return rc;
    }
    dx_free(old);
    jinja_free(old_j);
    dx_free(m->chat_err);
    m->chat_err = NULL;
    return 0;
}

const char *model_chat_error(const model *m)
{
    return m->chat_err;
}

/* ---- fingerprint ----
 *
 * Two nodes share KV only if their fingerprints match, and the fingerprint
 * seeds every KV block hash chain, so it must change whenever a single
 * computed value could: it is XXH3-128 over a version tag, the hyper-
 * parameters that enter the forward pass, and every tensor's name, shape,
 * type and *all* of its bytes.  (A sample of each tensor let two different
 * weight files share a fingerprint.)  Fields are hashed one by one as
 * little-endian integers, never as struct bytes, so padding and layout
 * cannot leak in.  n_ctx_train is left out on purpose: it bounds the context
 * a node accepts but changes no value computed at any position.  Each
 * tensor's data gets its own XXH3-128 digest, folded in file order. */
#define FP_TAG "duplex model fingerprint v2"

static void fp_u64(XXH3_state_t *st, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++, v >>= 8) b[i] = (uint8_t)v;
    XXH3_128bits_update(st, b, sizeof b);
}

static void fp_f32(XXH3_state_t *st, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    fp_u64(st, u);
}

/* Length first, so that adjacent strings cannot trade bytes. */
static void fp_str(XXH3_state_t *st, const void *p, size_t n)
{
    fp_u64(st, n);
    XXH3_128bits_update(st, p, n);
}

static void fp_hparams(XXH3_state_t *st, const model_hparams *hp)
{
    const uint64_t u[] = {hp->arch,      hp->n_vocab,   hp->n_embd,   hp->n_layer,
                          hp->n_head,    hp->n_kv_head, hp->head_dim, hp->n_ff,
                          hp->rope_neox, hp->qk_norm,   hp->qkv_bias, hp->tied_output};
    fp_str(st, hp->arch_name, strlen(hp->arch_name));
    for (size_t i = 0; i < DX_ARRAY_LEN(u); i++) fp_u64(st, u[i]);
    fp_f32(st, hp->rms_eps);
    fp_f32(st, hp->rope_base);
    /* The routing: n_expert_used and the normalisation change every MoE
     * output and no tensor shape shows them.  Hashed only for MoE models, so
     * a dense model's fingerprint is what it was before experts existed
     * (nodes of both versions still share its KV). */
    if (hp->n_expert) {
        const uint64_t moe[] = {hp->n_expert, hp->n_expert_used, hp->n_ff_exp,
                                (uint64_t)hp->expert_weights_norm};
        fp_str(st, "moe", 3);
        for (size_t i = 0; i < DX_ARRAY_LEN(moe); i++) fp_u64(st, moe[i]);
    }
}

static void fp_tensor(XXH3_state_t *st, const gguf_tensor_info *ti)
{
    fp_str(st, ti->name.ptr, ti->name.len);
    fp_u64(st, (uint64_t)ti->type);
    fp_u64(st, ti->n_dims);
    for (uint32_t d = 0; d < ti->n_dims; d++) fp_u64(st, ti->ne[d]);
    XXH128_hash_t h = XXH3_128bits(ti->data, ti->nbytes);
    fp_u64(st, ti->nbytes);
    fp_u64(st, h.low64);
    fp_u64(st, h.high64);
}

/* Hashes everything into st (created by the caller, so that nothing here
 * can fail: it may run on a thread of its own) and stores the result. */
static void fingerprint_into(model *m, XXH3_state_t *st)
{
    XXH3_128bits_reset(st);
    fp_str(st, FP_TAG, strlen(FP_TAG));
    fp_hparams(st, &m->hp);
    fp_u64(st, gguf_n_tensors(m->g));
    for (uint64_t i = 0; i < gguf_n_tensors(m->g); i++) {
        gguf_tensor_info ti;
        gguf_tensor(m->g, i, &ti);
        fp_tensor(st, &ti);
    }
    XXH128_hash_t h = XXH3_128bits_digest(st);
    m->fingerprint[0] = h.low64;
    m->fingerprint[1] = h.high64;
}

typedef struct {
    model *m;
    XXH3_state_t *st;
} fp_job;

static void *fingerprint_thread(void *arg)
{
    fp_job *j = arg;
    fingerprint_into(j->m, j->st);
    return NULL;
}

static void set_name(model *m)
{
    gguf_str nm;
    if (gguf_get_str(m->g, "general.name", &nm) == 0 && nm.len)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(nm.len < 127 ? nm.len : 127), nm.ptr);
    else {
        const char *b = strrchr(m->path, '/');
        snprintf(m->name, sizeof m->name, "%s", b ? b + 1 : m->path);
    }
}

/* Optional; each divisor must be a positive finite number. */
static int bind_rope_freqs(model *m)
{
    int rc = bind(m, "rope_freqs.weight", m->hp.head_dim / 2, 0, 1, &m->rope_freqs);
    if (rc || !m->rope_freqs.data) return rc;
    m->n_params -= m->hp.head_dim / 2; /* not a weight of the network */
    const float *f = m->rope_freqs.data;
    for (uint32_t i = 0; i < m->hp.head_dim / 2; i++)
        if (!(f[i] > 0 && f[i] < 1e30f))
            return dx_errf(DX_EFORMAT, "%s: rope_freqs.weight[%u] is %g (want a positive number)",
                           m->path, i, (double)f[i]);
    return 0;
}

static int load_all(model *m)
{
    int rc;
    if ((rc = load_hparams(m))) return rc;
    const model_hparams *hp = &m->hp;
    gguf_tensor_info ti;
    if ((rc = gguf_find_tensor(m->g, "token_embd.weight", &ti)))
        return dx_errf(rc, "%s: tensor 'token_embd.weight' is missing", m->path);
    m->hp.n_vocab = (uint32_t)ti.ne[1];
    if ((rc = bind(m, "token_embd.weight", hp->n_embd, hp->n_vocab, 0, &m->tok_embd)) ||
        (rc = bind(m, "output_norm.weight", hp->n_embd, 0, 0, &m->output_norm)) ||
        (rc = bind(m, "output.weight", hp->n_embd, hp->n_vocab, 1, &m->output)))
        return rc;
    if (!m->output.data) {
        m->output = m->tok_embd;
        m->hp.tied_output = 1;
    }
    if ((rc = bind_rope_freqs(m))) return rc;
    m->layers = dx_calloc(hp->n_layer, sizeof *m->layers);
    if (!m->layers) return dx_errf(DX_ENOMEM, "out of memory loading %s", m->path);
    for (uint32_t i = 0; i < hp->n_layer; i++)
        if ((rc = bind_layer(m, i))) return rc;
    /* The fingerprint reads every weight byte and a real vocabulary takes
     * tens of ms to index: the two run side by side (both only read the
     * mapping), which takes the vocabulary off the start-up time. */
    fp_job job = {.m = m, .st = XXH3_createState()};
    if (!job.st) return dx_errf(DX_ENOMEM, "out of memory fingerprinting %s", m->path);
    pthread_t th;
    int threaded = pthread_create(&th, NULL, fingerprint_thread, &job) == 0;
    rc = load_tokenizer(m);
    if (!rc && tok_vocab_size(m->tk) > hp->n_vocab)
        rc = dx_errf(DX_EFORMAT, "%s: tokenizer has %zu tokens but the embedding only %u rows",
                     m->path, tok_vocab_size(m->tk), hp->n_vocab);
    if (!rc) rc = load_chat(m);
    if (threaded)
        pthread_join(th, NULL); /* also on error: the caller unmaps the file next */
    else
        fingerprint_into(m, job.st);
    XXH3_freeState(job.st);
    if (!rc) set_name(m);
    return rc;
}

/* Only what counting a prompt's tokens needs: the hyper-parameters (the
 * architecture picks the pre-tokenizer and template), the tokenizer and the
 * chat template.  Tensors are neither bound nor read. */
static int load_tokenizer_only(model *m)
{
    int rc;
    if ((rc = load_hparams(m)) || (rc = load_tokenizer(m)) || (rc = load_chat(m))) return rc;
    set_name(m);
    return 0;
}

static int load_with(const char *path, int (*load)(model *), model **out)
{
    *out = NULL;
    model *m = dx_calloc(1, sizeof *m);
    if (!m || !(m->path = dx_strdup(path))) {
        dx_free(m);
        return dx_errf(DX_ENOMEM, "out of memory");
    }
    int rc = gguf_open(path, &m->g);
    if (!rc) rc = load(m);
    if (rc) {
        model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int model_load(const char *path, model **out)
{
    return load_with(path, load_all, out);
}

int model_load_tokenizer(const char *path, model **out)
{
    return load_with(path, load_tokenizer_only, out);
}

void model_free(model *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n_owned; i++) dx_free(m->owned[i]);
    dx_free(m->owned);
    dx_free(m->layers);
    dx_free(m->chat_text);
    dx_free(m->chat_err);
    jinja_free(m->jinja);
    tok_destroy(m->tk);
    gguf_close(m->g);
    dx_free(m->path);
    dx_free(m);
}

const model_hparams *model_hp(const model *m) { return &m->hp; }
const char *model_chat_template(const model *m) { return m->chat_text; }
const jinja_tmpl *model_chat_jinja(const model *m) { return m->jinja; }
const model_layer *model_layer_at(const model *m, uint32_t i) { return &m->layers[i]; }
const model_tensor *model_tok_embd(const model *m) { return &m->tok_embd; }
const model_tensor *model_output_norm(const model *m) { return &m->output_norm; }
const model_tensor *model_output(const model *m) { return &m->output; }
const float *model_rope_freqs(const model *m)
{
    return m->rope_freqs.data;
}
const tok *model_tokenizer(const model *m) { return m->tk; }
enum chat_tmpl_kind model_chat_kind(const model *m) { return m->chat; }
const gguf_ctx *model_gguf(const model *m) { return m->g; }
const char *model_path(const model *m) { return m->path; }
const char *model_name(const model *m) { return m->name; }
uint64_t model_n_params(const model *m) { return m->n_params; }

uint64_t model_n_active_params(const model *m)
{
    const model_hparams *hp = &m->hp;
    uint64_t per_expert = 3 * (uint64_t)hp->n_embd * hp->n_ff_exp;
    return m->n_params - (uint64_t)hp->n_layer * (hp->n_expert - hp->n_expert_used) * per_expert;
}

void model_fingerprint(const model *m, uint64_t out[2])
{
    out[0] = m->fingerprint[0];
    out[1] = m->fingerprint[1];
}
