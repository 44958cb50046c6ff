/* synth: random-weight model writer (see synth.h).
 *
 * Weights are uniform in [-a, a] with a = sqrt(3 / n_in) (unit variance
 * through each matmul, so activations stay O(1) and greedy output is varied
 * rather than degenerate); norm weights are 1 ± 0.1.  Each tensor has its own
 * generator seeded from (seed, tensor name), so tensors are produced one at a
 * time while the file is streamed out.
 *
 * Both vocabularies, the synthetic one and an imported one, go through one
 * hf_tok description, so padding, validation and the GGUF keys are written
 * by the same code. */
#include "model/synth_priv.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"
#include "tok/bpe_train.h"
#include "tok/hf_tok.h"
#include "tok/tok_norm.h"

#define SHAPE(e, l, h, kv, hd, ff, ctx)                                                            \
    .n_embd = e, .n_layer = l, .n_head = h, .n_kv_head = kv, .head_dim = hd, .n_ff = ff,           \
    .n_ctx = ctx
static const synth_preset k_presets[] = {
    {.name = "tiny", SHAPE(128, 2, 4, 2, 32, 256, 4096), .n_merges = 600, .arch = -1},
    /* tiny with every row (n_embd, n_head * head_dim, n_ff) a multiple of
     * 256: the super-block types hold every matrix, no fallback */
    {.name = "tiny-k", SHAPE(256, 2, 4, 2, 64, 512, 4096), .n_merges = 600, .arch = -1},
    {.name = "small",
     SHAPE(512, 8, 8, 4, 64, 1536, 32768),
     .n_merges = 3000,
     .tied = 1,
     .arch = -1},
    {.name = "0.6b",
     SHAPE(1024, 28, 16, 8, 128, 3072, 40960),
     .n_merges = 3000,
     .tied = 1,
     .arch = -1},
    /* Qwen/Qwen3-0.6B's config.json */
    {.name = "qwen3-0.6b",
     SHAPE(1024, 28, 16, 8, 128, 3072, 40960),
     .n_merges = 3000,
     .tied = 1,
     .arch = MODEL_QWEN3,
     .n_vocab = 151936,
     .rope_base = 1e6f,
     .rms_eps = 1e-6f},
    /* meta-llama/Llama-3.2-1B's config.json: rope_scaling "llama3", factor 32 */
    {.name = "llama3.2-1b",
     SHAPE(2048, 16, 32, 8, 64, 8192, 131072),
     .n_merges = 3000,
     .tied = 1,
     .arch = MODEL_LLAMA,
     .n_vocab = 128256,
     .rope_base = 500000.0f,
     .rms_eps = 1e-5f,
     .rope_scaling = {.factor = 32.0f,
                      .low_freq_factor = 1.0f,
                      .high_freq_factor = 4.0f,
                      .original_context = 8192}},
    /* a mixture of experts for the tests: qwen3moe by default, or llama
     * (Mixtral-style); 8 experts, 2 per token */
    {.name = "tiny-moe",
     SHAPE(128, 2, 4, 2, 32, 192, 4096),
     .n_merges = 600,
     .arch = -1,
     .n_expert = 8,
     .n_expert_used = 2,
     .n_ff_exp = 96},
    /* tiny-moe with every row a multiple of 256 (tiny-k's layers), so the
     * experts of a K-quant mixture are K-quants too */
    {.name = "tiny-moe-k",
     SHAPE(256, 2, 4, 2, 64, 512, 4096),
     .n_merges = 600,
     .arch = -1,
     .n_expert = 8,
     .n_expert_used = 2,
     .n_ff_exp = 256},
    /* Qwen/Qwen3-30B-A3B's config.json: 128 experts, 8 per token,
     * moe_intermediate_size 768, norm_topk_prob, untied output */
    {.name = "qwen3-30b-a3b",
     SHAPE(2048, 48, 32, 4, 128, 6144, 40960),
     .n_merges = 3000,
     .arch = MODEL_QWEN3MOE,
     .n_vocab = 151936,
     .rope_base = 1e6f,
     .rms_eps = 1e-6f,
     .n_expert = 128,
     .n_expert_used = 8,
     .n_ff_exp = 768},
};
#undef SHAPE

const synth_preset *synth_find_preset(const char *name)
{
    for (size_t i = 0; i < DX_ARRAY_LEN(k_presets); i++)
        if (name && !strcmp(name, k_presets[i].name)) return &k_presets[i];
    return NULL;
}

const char *synth_preset_names(void)
{
    return "tiny|tiny-k|small|0.6b|qwen3-0.6b|llama3.2-1b|tiny-moe|tiny-moe-k|qwen3-30b-a3b";
}

int synth_check_preset(const char *name)
{
    if (synth_find_preset(name)) return 0;
    return dx_errf(DX_EINVAL, "unknown preset '%s' (want %s)", name ? name : "",
                   synth_preset_names());
}

/* transformers' _compute_llama3_parameters, as convert_hf_to_gguf.py writes
 * it: long wavelengths are slowed down by `factor`, short ones kept, the
 * band between interpolated; out[i] divides frequency i. */
void synth_llama3_rope_factors(const synth_rope_scaling *s, float base, uint32_t head_dim,
                               float *out)
{
    double lo_wl = s->original_context / s->low_freq_factor,
           hi_wl = s->original_context / s->high_freq_factor;
    for (uint32_t i = 0; i < head_dim / 2; i++) {
        double freq = 1.0 / pow(base, 2.0 * i / head_dim), wl = 2 * M_PI / freq;
        if (wl < hi_wl) {
            out[i] = 1.0f;
        } else if (wl > lo_wl) {
            out[i] = s->factor;
        } else {
            double smooth = (s->original_context / wl - s->low_freq_factor) /
                            (s->high_freq_factor - s->low_freq_factor);
            out[i] = (float)(1.0 / ((1 - smooth) / s->factor + smooth));
        }
    }
}

/* The plain schemes, every matrix one type, then llama-quantize's K-quant
 * presets (synth_mix.c), with llama.cpp's llama_ftype numbers. */
static const synth_wtypes k_wtypes[] = {
    {"f32", 0, DX_F32, NULL},
    {"f16", 1, DX_F16, NULL},
    {"bf16", 32, DX_BF16, NULL},
    {"q8_0", 7, DX_Q8_0, NULL},
    {"q5_1", 9, DX_Q5_1, NULL},
    {"q5_0", 8, DX_Q5_0, NULL},
    {"q4_1", 3, DX_Q4_1, NULL},
    {"q4_0", 2, DX_Q4_0, NULL},
    {"iq4_nl", 25, DX_IQ4_NL, NULL},
    {"q6_k", 18, DX_Q6_K, synth_mix_rule},
    {"q5_k_m", 17, DX_Q5_K, synth_mix_rule},
    {"q5_k_s", 16, DX_Q5_K, synth_mix_rule},
    {"q4_k_m", 15, DX_Q4_K, synth_mix_rule},
    {"q4_k_s", 14, DX_Q4_K, synth_mix_rule},
    {"iq4_xs", 30, DX_IQ4_XS, synth_mix_rule},
    {"q3_k_l", 13, DX_Q3_K, synth_mix_rule},
    {"q3_k_m", 12, DX_Q3_K, synth_mix_rule},
    {"q3_k_s", 11, DX_Q3_K, synth_mix_rule},
    {"q2_k", 10, DX_Q2_K, synth_mix_rule},
    {"q2_k_s", 21, DX_Q2_K, synth_mix_rule},
};

const synth_wtypes *synth_find_wtypes(const char *s)
{
    for (size_t i = 0; i < DX_ARRAY_LEN(k_wtypes); i++)
        if (s && !strcmp(s, k_wtypes[i].name)) return &k_wtypes[i];
    return NULL;
}

const char *synth_wtypes_names(void)
{
    return "f32|f16|bf16|q8_0|q5_1|q5_0|q4_1|q4_0|iq4_nl|q6_k|q5_k_m|q5_k_s|q4_k_m|q4_k_s|"
           "iq4_xs|q3_k_l|q3_k_m|q3_k_s|q2_k|q2_k_s";
}

int synth_check_wtypes(const char *s)
{
    if (synth_find_wtypes(s)) return 0;
    return dx_errf(DX_EINVAL, "unknown dtype '%s' (want %s)", s ? s : "", synth_wtypes_names());
}

int synth_wtypes_type(const synth_wtypes *w, const synth_shape *s, enum synth_role r, uint32_t il,
                      uint64_t n_in)
{
    if (r == SYNTH_FFN_GATE_INP) return DX_F32;
    return w->rule ? synth_fallback_type(w->rule(w, s, r, il, n_in), n_in) : w->type;
}

/* A plain scheme for a type given by id (synth_config.dtype). */
static const synth_wtypes *wtypes_of(int type)
{
    for (size_t i = 0; i < DX_ARRAY_LEN(k_wtypes); i++)
        if (k_wtypes[i].type == type && !k_wtypes[i].rule) return &k_wtypes[i];
    return NULL;
}

static const char *const k_arch_names[] = {[MODEL_LLAMA] = "llama",
                                           [MODEL_QWEN2] = "qwen2",
                                           [MODEL_QWEN3] = "qwen3",
                                           [MODEL_QWEN3MOE] = "qwen3moe"};

int synth_parse_arch(const char *s, enum model_arch *out)
{
    for (size_t i = 0; i < DX_ARRAY_LEN(k_arch_names); i++)
        if (s && !strcmp(s, k_arch_names[i])) {
            *out = (enum model_arch)i;
            return 0;
        }
    return dx_errf(DX_EINVAL, "unknown architecture '%s' (want qwen3|qwen2|llama|qwen3moe)",
                   s ? s : "");
}

static const char *arch_name(enum model_arch a)
{
    return k_arch_names[a];
}

enum model_arch synth_default_arch(const synth_preset *p)
{
    return p->arch >= 0 ? (enum model_arch)p->arch : p->n_expert ? MODEL_QWEN3MOE : MODEL_QWEN3;
}

synth_shape synth_shape_of(const synth_preset *p, enum model_arch a, uint32_t n_layer)
{
    return (synth_shape){.arch = a,
                         .n_layer = n_layer ? n_layer : p->n_layer,
                         .n_head = p->n_head,
                         .n_kv_head = p->n_kv_head,
                         .n_expert = p->n_expert,
                         .tied = p->tied};
}

/* Uniform in [-1, 1). */
static float rng_unit(dx_rng *r)
{
    return (float)((double)(dx_rng_next(r) >> 40) * (1.0 / 8388608.0) - 1.0);
}

typedef struct {
    uint64_t seed;
    int type;
    uint64_t n_in, rows;
    float center, amp; /* value = center + amp * u */
    uint64_t zero_from; /* rows from here on are zero (padding tokens) */
} fill_spec;

static int fill_tensor(void *user, void *dst, uint64_t nbytes)
{
    const fill_spec *f = user;
    dx_rng r;
    dx_rng_seed(&r, f->seed);
    float *row = dx_malloc(f->n_in * sizeof(float));
    if (!row) return dx_errf(DX_ENOMEM, "out of memory synthesising a tensor");
    size_t rb = dx_dtype_row_bytes(f->type, f->n_in);
    DX_ASSERT(rb * f->rows == nbytes);
    for (uint64_t o = 0; o < f->rows; o++) {
        if (o < f->zero_from)
            for (uint64_t k = 0; k < f->n_in; k++) row[k] = f->center + f->amp * rng_unit(&r);
        else
            memset(row, 0, f->n_in * sizeof *row);
        uint8_t *out = (uint8_t *)dst + o * rb;
        DX_ASSERT(dx_dtype_from_f32_row(f->type, row, out, f->n_in) == 0);
    }
    dx_free(row);
    return 0;
}

typedef struct {
    gguf_writer *w;
    const synth_config *cfg;
    const synth_wtypes *wt;
    synth_shape shape;
    fill_spec *specs;
    size_t n_specs, cap_specs;
    size_t n_listed, n_fallback; /* the dry run's tensors, and matrices a mixture's type
                                  * did not fit */
} synth_ctx;

/* 0 when synth can quantise to `type`, else DX_EUNSUPPORTED naming the
 * tensor (fill_tensor asserts it can). */
static int check_writable(const char *name, int type)
{
    static const float zero[DX_QK_K];
    uint8_t block[512];
    size_t be = dx_dtype_block_elems(type);
    DX_ASSERT(be && be <= DX_ARRAY_LEN(zero) && dx_dtype_block_bytes(type) <= sizeof block);
    if (dx_dtype_from_f32_row(type, zero, block, be) == 0) return 0;
    return dx_errf(DX_EUNSUPPORTED, "%s: duplex cannot write type %s yet", name,
                   dx_dtype_name(type));
}

/* The dry run's line for a tensor: "name type [ne0, ne1...]", and what a
 * mixture wanted when the rows did not fit it. */
static int list_tensor(synth_ctx *c, const char *name, uint32_t n_dims, const uint64_t *ne,
                       int type, int wanted)
{
    dx_buf *b = c->cfg->list;
    int rc = dx_buf_printf(b, "%-32s %-7s [", name, dx_dtype_name(type));
    for (uint32_t d = 0; d < n_dims && !rc; d++)
        rc = dx_buf_printf(b, "%s%llu", d ? ", " : "", (unsigned long long)ne[d]);
    if (!rc) rc = dx_buf_puts(b, "]");
    c->n_listed++;
    if (!rc && wanted != type) {
        c->n_fallback++;
        rc = dx_buf_printf(b, " (%s wanted: rows of %llu are not a multiple of %zu)",
                           dx_dtype_name(wanted), (unsigned long long)ne[0],
                           dx_dtype_block_elems(wanted));
    }
    if (!rc) rc = dx_buf_puts(b, "\n");
    return rc ? dx_errf(DX_ENOMEM, "out of memory listing the tensors") : 0;
}

/* A tensor of type `type` (for the dry run's list: the mixture wanted
 * `wanted`) and shape ne[0 .. n_dims): a vector, a matrix [ne1][ne0], or
 * ne2 stacked such matrices. */
static int add_tensor_typed(synth_ctx *c, const char *name, uint32_t n_dims, const uint64_t *ne,
                            int type, int wanted, int is_norm, float amp)
{
    if (c->n_specs == c->cap_specs) return dx_errf(DX_ENOMEM, "too many tensors");
    if (ne[0] % dx_dtype_block_elems(type))
        return dx_errf(DX_EINVAL, "%s: rows of %llu cannot be stored as %s (blocks of %zu)", name,
                       (unsigned long long)ne[0], dx_dtype_name(type), dx_dtype_block_elems(type));
    int rc = c->cfg->list ? list_tensor(c, name, n_dims, ne, type, wanted)
                          : check_writable(name, type);
    if (rc) return rc;
    fill_spec *f = &c->specs[c->n_specs++];
    f->seed = c->cfg->seed ^ XXH3_64bits(name, strlen(name));
    f->type = type;
    f->n_in = ne[0];
    f->rows = 1; /* filled row by row, expert after expert */
    for (uint32_t d = 1; d < n_dims; d++) f->rows *= ne[d];
    f->center = is_norm ? 1.0f : 0.0f;
    f->amp = is_norm ? 0.1f : amp;
    f->zero_from = f->rows;
    return gguf_w_add_tensor_fill(c->w, name, f->type, n_dims, ne, fill_tensor, f);
}

/* A matrix of role r in layer il, ne[0] = n_in wide ([ne1][ne0], or ne2
 * stacked experts), of the type the scheme gives it. */
static int add_matrix(synth_ctx *c, const char *name, enum synth_role r, uint32_t il,
                      uint32_t n_dims, const uint64_t *ne, float amp)
{
    int type = synth_wtypes_type(c->wt, &c->shape, r, il, ne[0]);
    int wanted = c->wt->rule && r != SYNTH_FFN_GATE_INP
                     ? c->wt->rule(c->wt, &c->shape, r, il, ne[0])
                     : type;
    return add_tensor_typed(c, name, n_dims, ne, type, wanted, 0, amp);
}

/* A matrix [rows][n_in]. */
static int add_tensor(synth_ctx *c, const char *name, enum synth_role r, uint32_t il, uint64_t n_in,
                      uint64_t rows, float amp)
{
    const uint64_t ne[2] = {n_in, rows};
    return add_matrix(c, name, r, il, 2, ne, amp);
}

/* A vector: always f32, as llama.cpp writes them. */
static int add_vector(synth_ctx *c, const char *name, uint64_t n, int is_norm, float amp)
{
    const uint64_t ne[1] = {n};
    return add_tensor_typed(c, name, 1, ne, DX_F32, DX_F32, is_norm, amp);
}

/* An MoE layer's FFN: the router, f32 as llama.cpp's converter always
 * writes it, and the experts stacked in ggml's order (model.h). */
static int add_experts(synth_ctx *c, const synth_preset *p, uint32_t i)
{
    uint64_t e = p->n_embd, ff = p->n_ff_exp, x = p->n_expert;
    float a_e = sqrtf(3.0f / (float)e), a_ff = sqrtf(3.0f / (float)ff);
    const struct {
        const char *suffix;
        uint32_t n_dims;
        uint64_t ne[3];
        enum synth_role role;
        float amp;
    } t[] = {
        {"ffn_gate_inp.weight", 2, {e, x, 1}, SYNTH_FFN_GATE_INP, a_e},
        {"ffn_gate_exps.weight", 3, {e, ff, x}, SYNTH_FFN_GATE_EXPS, a_e},
        {"ffn_up_exps.weight", 3, {e, ff, x}, SYNTH_FFN_UP_EXPS, a_e},
        {"ffn_down_exps.weight", 3, {ff, e, x}, SYNTH_FFN_DOWN_EXPS, a_ff},
    };
    for (size_t k = 0; k < DX_ARRAY_LEN(t); k++) {
        char n[64];
        snprintf(n, sizeof n, "blk.%u.%s", i, t[k].suffix);
        int rc = add_matrix(c, n, t[k].role, i, t[k].n_dims, t[k].ne, t[k].amp);
        if (rc) return rc;
    }
    return 0;
}

/* Llama 3 rope scaling as llama.cpp stores it: a [head_dim / 2] tensor of
 * frequency divisors (no metadata key). */
static int add_rope_freqs(synth_ctx *c, const synth_preset *p, const synth_rope_scaling *rs,
                          float base)
{
    float f[256];
    DX_ASSERT(p->head_dim / 2 <= DX_ARRAY_LEN(f));
    synth_llama3_rope_factors(rs, base, p->head_dim, f);
    uint64_t ne[1] = {p->head_dim / 2};
    const char *name = "rope_freqs.weight";
    int rc = c->cfg->list ? list_tensor(c, name, 1, ne, DX_F32, DX_F32) : 0;
    return rc ? rc : gguf_w_add_tensor(c->w, name, DX_F32, 1, ne, f);
}

static int add_weights(synth_ctx *c, const synth_preset *p, uint32_t n_vocab, uint32_t n_real,
                       float rope_base)
{
    uint64_t e = p->n_embd, q = (uint64_t)p->n_head * p->head_dim,
             kv = (uint64_t)p->n_kv_head * p->head_dim, ff = p->n_ff;
    float a_e = sqrtf(3.0f / (float)e), a_q = sqrtf(3.0f / (float)q),
          a_ff = sqrtf(3.0f / (float)ff);
    int rc;
    if ((rc = add_tensor(c, "token_embd.weight", SYNTH_TOKEN_EMBD, 0, e, n_vocab,
                         p->tied ? a_e : 1.7f)))
        return rc;
    c->specs[c->n_specs - 1].zero_from = n_real;
    const synth_rope_scaling *rs = c->cfg->rope_scaling ? c->cfg->rope_scaling : &p->rope_scaling;
    if (rs->original_context && (rc = add_rope_freqs(c, p, rs, rope_base))) return rc;
    for (uint32_t i = 0; i < p->n_layer; i++) {
        char n[64];
#define T(suffix, role, nin, rows, amp)                                                            \
    snprintf(n, sizeof n, "blk.%u.%s", i, suffix);                                                 \
    if ((rc = add_tensor(c, n, role, i, nin, rows, amp))) return rc;
#define V(suffix, nin, norm, amp)                                                                  \
    snprintf(n, sizeof n, "blk.%u.%s", i, suffix);                                                 \
    if ((rc = add_vector(c, n, nin, norm, amp))) return rc;
        V("attn_norm.weight", e, 1, 0);
        T("attn_q.weight", SYNTH_ATTN_Q, e, q, a_e);
        T("attn_k.weight", SYNTH_ATTN_K, e, kv, a_e);
        T("attn_v.weight", SYNTH_ATTN_V, e, kv, a_e);
        if (c->cfg->arch == MODEL_QWEN2) {
            V("attn_q.bias", q, 0, 0.1f);
            V("attn_k.bias", kv, 0, 0.1f);
            V("attn_v.bias", kv, 0, 0.1f);
        }
        if (c->cfg->arch == MODEL_QWEN3 || c->cfg->arch == MODEL_QWEN3MOE) {
            V("attn_q_norm.weight", p->head_dim, 1, 0);
            V("attn_k_norm.weight", p->head_dim, 1, 0);
        }
        T("attn_output.weight", SYNTH_ATTN_OUTPUT, q, e, a_q);
        V("ffn_norm.weight", e, 1, 0);
        if (p->n_expert) {
            if ((rc = add_experts(c, p, i))) return rc;
            continue;
        }
        T("ffn_gate.weight", SYNTH_FFN_GATE, e, ff, a_e);
        T("ffn_up.weight", SYNTH_FFN_UP, e, ff, a_e);
        T("ffn_down.weight", SYNTH_FFN_DOWN, ff, e, a_ff);
#undef V
#undef T
    }
    if ((rc = add_vector(c, "output_norm.weight", e, 1, 0))) return rc;
    if (!p->tied) {
        if ((rc = add_tensor(c, "output.weight", SYNTH_OUTPUT, 0, e, n_vocab, a_e))) return rc;
        c->specs[c->n_specs - 1].zero_from = n_real;
    }
    return 0;
}

static int add_hparams(gguf_writer *w, const synth_config *cfg, const synth_wtypes *wt,
                       const synth_preset *p, uint32_t n_vocab, float rope_base)
{
    const char *a = arch_name(cfg->arch);
    char key[96], name[96];
    int rc = 0;
    if (cfg->n_layer)
        snprintf(name, sizeof name, "duplex-synth-%s-%s-%ul-%s", a, p->name, p->n_layer, wt->name);
    else
        snprintf(name, sizeof name, "duplex-synth-%s-%s-%s", a, p->name, wt->name);
    rc |= gguf_w_set_str(w, "general.architecture", a);
    rc |= gguf_w_set_str(w, "general.name", name);
    rc |= gguf_w_set_u32(w, "general.file_type", wt->ftype);
    rc |= gguf_w_set_u32(w, "general.quantization_version", 2);
#define U(suffix, v)                                                                               \
    snprintf(key, sizeof key, "%s.%s", a, suffix);                                                 \
    rc |= gguf_w_set_u32(w, key, v);
    U("context_length", p->n_ctx);
    U("embedding_length", p->n_embd);
    U("block_count", p->n_layer);
    /* llama's experts are feed_forward_length wide (llama.cpp: n_ff) */
    U("feed_forward_length", p->n_expert && cfg->arch == MODEL_LLAMA ? p->n_ff_exp : p->n_ff);
    if (p->n_expert) {
        U("expert_count", p->n_expert);
        U("expert_used_count", p->n_expert_used);
        if (cfg->arch == MODEL_QWEN3MOE) {
            U("expert_feed_forward_length", p->n_ff_exp);
        }
    }
    U("attention.head_count", p->n_head);
    U("attention.head_count_kv", p->n_kv_head);
    U("attention.key_length", p->head_dim);
    U("attention.value_length", p->head_dim);
    U("rope.dimension_count", p->head_dim);
    U("vocab_size", n_vocab);
#undef U
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    rc |= gguf_w_set_f32(w, key, p->rms_eps > 0 ? p->rms_eps : 1e-6f);
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    rc |= gguf_w_set_f32(w, key, rope_base);
    return rc ? dx_errf(DX_ENOMEM, "out of memory writing metadata") : 0;
}

/* Control tokens of both template families, appended after the merges. */
static const char *const k_specials[] = {
    "<|endoftext|>",   "<|im_start|>",        "<|im_end|>",        "<|begin_of_text|>",
    "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
};
enum { SP_ENDOFTEXT, SP_IM_START, SP_IM_END, SP_BOT, SP_EOT_TEXT, SP_SH, SP_EH, SP_EOT_ID, SP_N };

/* The synthetic vocabulary: merges learned from the embedded corpus, then
 * the control tokens of both template families. */
static int synth_vocab(const synth_config *cfg, const synth_preset *p, hf_tok *h)
{
    memset(h, 0, sizeof *h);
    h->bos = h->eos = h->eot = h->pad = -1;
    int llama = cfg->arch == MODEL_LLAMA;
    size_t clen;
    const char *corpus = bpe_corpus(&clen);
    bpe_vocab v = {0};
    int rc = bpe_train(corpus, clen, llama ? TOK_PRE_LLAMA3 : TOK_PRE_QWEN2, p->n_merges, &v);
    if (rc) return dx_err_wrap(rc, "training the synthetic tokenizer");
    size_t base = v.n_tokens;
    h->tokens = dx_calloc(base + SP_N, sizeof *h->tokens);
    h->types = dx_calloc(base + SP_N, sizeof *h->types);
    if (!h->tokens || !h->types) goto oom;
    h->n_tokens = base + SP_N;
    for (size_t i = 0; i < base; i++) { /* the trainer's strings are taken over */
        h->tokens[i] = v.tokens[i];
        h->types[i] = TOK_TYPE_NORMAL;
        v.tokens[i] = NULL;
    }
    for (size_t i = 0; i < SP_N; i++) {
        if (!(h->tokens[base + i] = dx_strdup(k_specials[i]))) goto oom;
        h->types[base + i] = TOK_TYPE_CONTROL;
    }
    h->merges = v.merges;
    h->n_merges = v.n_merges;
    v.merges = NULL;
    v.n_merges = 0;
    bpe_vocab_free(&v);
    h->chat_template = dx_strdup(chat_tmpl_jinja(llama ? CHAT_TMPL_LLAMA3 : CHAT_TMPL_CHATML));
    if (!h->chat_template) goto oom;
    h->pre = llama ? TOK_PRE_LLAMA3 : TOK_PRE_QWEN2;
    h->bos = (int32_t)base + (llama ? SP_BOT : SP_ENDOFTEXT);
    h->eos = (int32_t)base + (llama ? SP_EOT_TEXT : SP_ENDOFTEXT);
    h->eot = (int32_t)base + (llama ? SP_EOT_ID : SP_IM_END);
    h->pad = (int32_t)base + SP_ENDOFTEXT;
    h->add_bos = llama;
    return 0;
oom:
    bpe_vocab_free(&v);
    hf_tok_free(h);
    return dx_errf(DX_ENOMEM, "out of memory building the synthetic vocabulary");
}

static int set_id(gguf_writer *w, const char *key, int32_t id)
{
    return id >= 0 ? gguf_w_set_u32(w, key, (uint32_t)id) : 0;
}

static int add_tokenizer(gguf_writer *w, const hf_tok *h)
{
    int rc = gguf_w_set_str(w, "tokenizer.ggml.model", "gpt2");
    rc |= gguf_w_set_str(w, "tokenizer.ggml.pre", tok_pre_name(h->pre));
    rc |=
        gguf_w_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)h->tokens, h->n_tokens);
    rc |= gguf_w_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, h->types, h->n_tokens);
    rc |=
        gguf_w_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)h->merges, h->n_merges);
    rc |= set_id(w, "tokenizer.ggml.bos_token_id", h->bos);
    rc |= set_id(w, "tokenizer.ggml.eos_token_id", h->eos);
    rc |= set_id(w, "tokenizer.ggml.eot_token_id", h->eot);
    rc |= set_id(w, "tokenizer.ggml.padding_token_id", h->pad);
    rc |= gguf_w_set_bool(w, "tokenizer.ggml.add_bos_token", h->add_bos);
    if (h->add_eos) rc |= gguf_w_set_bool(w, "tokenizer.ggml.add_eos_token", 1);
    if (h->norm != TOK_NORM_NONE)
        rc |= gguf_w_set_str(w, MODEL_KEY_NORMALIZER, tok_norm_name(h->norm));
    if (h->chat_template) rc |= gguf_w_set_str(w, "tokenizer.chat_template", h->chat_template);
    return rc ? dx_errf(DX_ENOMEM, "out of memory writing the tokenizer") : 0;
}

/* The vocabulary the model gets, padded to the preset's size and checked by
 * building a tokenizer from it. */
static int make_vocab(const synth_config *cfg, const synth_preset *p, hf_tok *h)
{
    const char *what = cfg->tokenizer ? cfg->tokenizer : "the synthetic tokenizer";
    int rc = cfg->tokenizer ? hf_tok_load(cfg->tokenizer, h) : synth_vocab(cfg, p, h);
    if (rc) return rc;
    tok *t = NULL;
    if (p->n_vocab && (rc = hf_tok_pad(h, p->n_vocab)))
        dx_err_wrap(rc, "%s for preset %s", what, p->name);
    else if ((rc = hf_tok_build(h, &t)))
        dx_err_wrap(rc, "%s", what);
    tok_destroy(t);
    if (rc) hf_tok_free(h);
    return rc;
}

/* Tokens before the padding (their rows are random, the rest zero). */
static uint32_t real_tokens(const hf_tok *h)
{
    size_t n = h->n_tokens;
    while (n > 0 && h->types[n - 1] == TOK_TYPE_UNUSED) n--;
    return (uint32_t)n;
}

/* The architecture fits the preset: its own if it has one; experts only in
 * qwen3moe and llama, and qwen3moe only with experts. */
static int check_arch(const synth_config *cfg, const synth_preset *p)
{
    if (p->arch >= 0 && (int)cfg->arch != p->arch)
        return dx_errf(DX_EINVAL, "preset %s is a %s model, not %s", p->name,
                       arch_name((enum model_arch)p->arch), arch_name(cfg->arch));
    if (p->n_expert && cfg->arch != MODEL_QWEN3MOE && cfg->arch != MODEL_LLAMA)
        return dx_errf(DX_EINVAL,
                       "preset %s is a mixture of experts: its architecture is "
                       "qwen3moe or llama, not %s",
                       p->name, arch_name(cfg->arch));
    if (!p->n_expert && cfg->arch == MODEL_QWEN3MOE)
        return dx_errf(DX_EINVAL,
                       "qwen3moe needs a mixture-of-experts preset (tiny-moe|"
                       "tiny-moe-k|qwen3-30b-a3b), not %s",
                       p->name);
    return 0;
}

int synth_write(const synth_config *cfg, const char *path)
{
    const synth_preset *p0 = synth_find_preset(cfg->preset);
    if (!p0) return synth_check_preset(cfg->preset);
    synth_preset shape = *p0;
    const synth_preset *p = &shape;
    if (cfg->n_layer > 1024) return dx_errf(DX_EINVAL, "%u layers: at most 1024", cfg->n_layer);
    if (cfg->n_layer) shape.n_layer = cfg->n_layer;
    const synth_wtypes *wt = cfg->wtypes ? cfg->wtypes : wtypes_of(cfg->dtype);
    if (!wt) return dx_errf(DX_EINVAL, "unsupported weight dtype %d", cfg->dtype);
    int rc = check_arch(cfg, p);
    if (rc) return rc;
    const synth_rope_scaling *rs = cfg->rope_scaling ? cfg->rope_scaling : &p->rope_scaling;
    if (rs->original_context &&
        !(rs->factor >= 1 && rs->low_freq_factor > 0 && rs->high_freq_factor > rs->low_freq_factor))
        return dx_errf(DX_EINVAL,
                       "rope scaling: factor %g, low %g, high %g (want factor >= 1, "
                       "0 < low < high)",
                       (double)rs->factor, (double)rs->low_freq_factor,
                       (double)rs->high_freq_factor);
    hf_tok h;
    if ((rc = make_vocab(cfg, p, &h))) return rc;
    uint32_t n_vocab = (uint32_t)h.n_tokens;
    float rope_base = p->rope_base > 0           ? p->rope_base
                      : cfg->arch == MODEL_LLAMA ? 500000.0f
                                                 : 1000000.0f;
    synth_ctx c = {.cfg = cfg,
                   .wt = wt,
                   .shape = synth_shape_of(p, cfg->arch, 0),
                   .cap_specs = 8 + 16 * (size_t)p->n_layer};
    c.w = gguf_writer_create();
    c.specs = dx_calloc(c.cap_specs, sizeof *c.specs);
    if (!c.w || !c.specs) {
        rc = dx_errf(DX_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = add_hparams(c.w, cfg, wt, p, n_vocab, rope_base)) || (rc = add_tokenizer(c.w, &h)) ||
        (rc = add_weights(&c, p, n_vocab, real_tokens(&h), rope_base)))
        goto out;
    if (!cfg->list)
        rc = gguf_w_write_file(c.w, path);
    else if (dx_buf_printf(cfg->list,
                           "%zu tensors, %zu of them fell back to another type; "
                           "general.file_type %u\n",
                           c.n_listed, c.n_fallback, wt->ftype))
        rc = dx_errf(DX_ENOMEM, "out of memory listing the tensors");
out:
    gguf_writer_destroy(c.w);
    dx_free(c.specs);
    hf_tok_free(&h);
    return rc;
}
