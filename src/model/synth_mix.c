/* synth_mix: the per-tensor types of llama-quantize's K-quant presets
 * (Q2_K ... Q6_K, IQ4_XS), for `duplex model synth --dtype q4_k_m` and kin.
 *
 * These are the rules of llama.cpp's llama_tensor_get_type (src/llama-quant.cpp)
 * for the architectures duplex has (llama, qwen2, qwen3, qwen3moe, Mixtral's
 * llama with experts) and no importance matrix, restated; where they count
 * tensors, the count is the layer:
 *  - llama-quantize visits the tensors ordered by layer number, and each
 *    layer has one attn_v, so its running attn_v count is the layer index
 *    and the total is n_layer;
 *  - its ffn_down count is likewise the layer index for a dense model (one
 *    ffn_down a layer), and for a mixture of experts it reads the layer from
 *    the name; either way out of n_layer.  ffn_down_exps is an ffn_down,
 *    ffn_gate_exps/ffn_up_exps are ffn_gate/ffn_up (it matches names by
 *    substring), and the router ffn_gate_inp is never quantised.
 * A row length the chosen type cannot hold then falls back
 * (synth_fallback_type), after the rules and without changing any count. */
#include "model/synth_priv.h"

#include "base/dx_dtype.h"
#include "base/dx_err.h"

/* llama.cpp's llama_ftype numbers of the presets (general.file_type). */
enum {
    FT_Q2_K = 10,
    FT_Q3_K_S = 11,
    FT_Q3_K_M = 12,
    FT_Q3_K_L = 13,
    FT_Q4_K_S = 14,
    FT_Q4_K_M = 15,
    FT_Q5_K_S = 16,
    FT_Q5_K_M = 17,
    FT_Q6_K = 18,
    FT_Q2_K_S = 21,
    FT_IQ4_XS = 30,
};

/* The layers that get more bits in the _M presets: the first and last
 * eighth, and every third one between. */
static int more_bits(uint32_t il, uint32_t n)
{
    return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2;
}

/* llama.cpp's LLM_TYPE_70B, the one model size its rules look at: 80
 * layers of llama with grouped-query attention (Llama 2/3 70B; Mixtral's
 * 8 experts are sized apart) or of qwen2 (Qwen2-72B). */
static int is_70b(const synth_shape *s)
{
    if (s->n_layer != 80) return 0;
    if (s->arch == MODEL_QWEN2) return 1;
    return s->arch == MODEL_LLAMA && s->n_expert != 8 && s->n_head != s->n_kv_head;
}

/* The output head (and token_embd when it is the head too): q6_K, or q8_0
 * when the rows do not fit the preset's own type. */
static int output_type(const synth_wtypes *w, uint64_t n_in)
{
    return n_in % dx_dtype_block_elems(w->type) ? DX_Q8_0 : DX_Q6_K;
}

static int attn_v_type(const synth_wtypes *w, const synth_shape *s, uint32_t il)
{
    uint32_t gqa = s->n_head / s->n_kv_head;
    int t = w->type;
    switch (w->ftype) {
    case FT_Q2_K:
        t = gqa >= 4 ? DX_Q4_K : DX_Q3_K;
        break;
    case FT_Q2_K_S:
        if (gqa >= 4) t = DX_Q4_K;
        break;
    case FT_Q3_K_M:
        t = il < 2 ? DX_Q5_K : DX_Q4_K;
        break;
    case FT_Q3_K_L:
        t = DX_Q5_K;
        break;
    case FT_IQ4_XS:
        if (gqa >= 4) t = DX_Q5_K;
        break;
    case FT_Q4_K_M:
    case FT_Q5_K_M:
        if (more_bits(il, s->n_layer)) t = DX_Q6_K;
        break;
    case FT_Q4_K_S:
        if (il < 4) t = DX_Q5_K;
        break;
    }
    /* 8 heads share each attn_v in a 70B model: cheap to give more bits */
    if (is_70b(s) && (t == DX_Q3_K || t == DX_Q4_K)) t = DX_Q5_K;
    return s->n_expert == 8 ? DX_Q8_0 : t; /* Mixtral-sized: attention is small */
}

static int attn_output_type(const synth_wtypes *w, const synth_shape *s)
{
    if (s->n_expert == 8) {
        switch (w->ftype) {
        case FT_Q2_K:
        case FT_Q3_K_S:
        case FT_Q3_K_M:
        case FT_Q4_K_S:
        case FT_Q4_K_M:
        case FT_IQ4_XS:
            return DX_Q5_K;
        }
        return w->type;
    }
    switch (w->ftype) {
    case FT_Q2_K:
        return DX_Q3_K;
    case FT_Q3_K_M:
        return DX_Q4_K;
    case FT_Q3_K_L:
        return DX_Q5_K;
    }
    return w->type;
}

static int ffn_down_type(const synth_wtypes *w, const synth_shape *s, uint32_t il)
{
    uint32_t n = s->n_layer;
    switch (w->ftype) {
    case FT_Q2_K:
        return DX_Q3_K;
    case FT_Q2_K_S:
        return il < n / 8 ? DX_Q4_K : w->type;
    case FT_Q3_K_M:
        return il < n / 16 ? DX_Q5_K : DX_Q4_K;
    case FT_Q3_K_L:
        return DX_Q5_K;
    case FT_Q4_K_M:
    case FT_Q5_K_M:
        return more_bits(il, n) ? DX_Q6_K : w->type;
    case FT_Q4_K_S:
    case FT_IQ4_XS:
        return il < n / 8 ? DX_Q5_K : w->type;
    }
    return w->type;
}

int synth_mix_rule(const synth_wtypes *w, const synth_shape *s, enum synth_role r, uint32_t il,
                   uint64_t n_in)
{
    DX_ASSERT(s->n_kv_head > 0 && s->n_layer > 0);
    switch (r) {
    case SYNTH_OUTPUT:
        return output_type(w, n_in);
    case SYNTH_TOKEN_EMBD:
        return s->tied ? output_type(w, n_in) : w->type;
    case SYNTH_ATTN_V:
        return attn_v_type(w, s, il);
    case SYNTH_ATTN_K:
        return s->n_expert == 8 ? DX_Q8_0 : w->type;
    case SYNTH_ATTN_OUTPUT:
        return attn_output_type(w, s);
    case SYNTH_FFN_DOWN:
    case SYNTH_FFN_DOWN_EXPS:
        return ffn_down_type(w, s, il);
    case SYNTH_FFN_GATE_INP:
        return DX_F32;
    default: /* attn_q, ffn_gate, ffn_up and their experts */
        return w->type;
    }
}

int synth_fallback_type(int type, uint64_t n_in)
{
    size_t be = dx_dtype_block_elems(type);
    DX_ASSERT(be > 0);
    if (n_in % be == 0) return type;
    int t;
    switch (type) {
    case DX_IQ4_XS:
        t = DX_IQ4_NL;
        break;
    case DX_Q2_K:
    case DX_Q3_K:
        t = DX_Q4_0;
        break;
    case DX_Q4_K:
        t = DX_Q5_0;
        break;
    case DX_Q5_K:
        t = DX_Q5_1;
        break;
    case DX_Q6_K:
        t = DX_Q8_0;
        break;
    default: /* llama-quantize has no fallback for blocks of 32: f16 */
        return DX_F16;
    }
    return n_in % dx_dtype_block_elems(t) ? DX_F16 : t;
}
