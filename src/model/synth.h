/* synth: writes random-weight GGUF models that real tools can load — every
 * metadata key llama.cpp reads for the architecture, a byte-level BPE
 * tokenizer whose merges are learned from the embedded corpus (or a real one
 * imported from a Hugging Face tokenizer.json), the chat template —
 * deterministic for a seed (same seed and inputs → byte-identical file).
 *
 * Presets: tiny (unit tests), tiny-k (tiny with every row a multiple of
 * 256, so the super-block types of the llama-quantize mixtures need no
 * fallback), small (the demo), 0.6b (Qwen3-0.6B's layers
 * with the small synthetic vocabulary), and two real shapes with their real
 * vocabulary sizes: qwen3-0.6b (151,936 embedding rows) and llama3.2-1b
 * (128,256 rows, Llama 3 rope scaling written as llama.cpp's rope_freqs
 * tensor).  Embedding rows past the tokenizer's tokens are padding, as in
 * the real checkpoints: "[PAD<id>]" UNUSED tokens with all-zero rows.
 * Mixtures of experts: tiny-moe (the tests; qwen3moe, or llama as Mixtral
 * is), tiny-moe-k (its experts 256 wide, for the K-quants) and qwen3-30b-a3b (Qwen3-30B-A3B's
 * shape, 151,936 rows; with synth_config.n_layer fewer than its 48 layers keep the real per-layer
 * shape in a file that fits a small machine). */
#ifndef SYNTH_H
#define SYNTH_H

#include <stdint.h>

#include "base/dx_buf.h"
#include "model/model.h"

/* Llama 3 rope scaling (rope_scaling.rope_type "llama3" in config.json). */
typedef struct {
    float factor, low_freq_factor, high_freq_factor;
    uint32_t original_context; /* 0: no scaling */
} synth_rope_scaling;

typedef struct {
    const char *name;
    uint32_t n_embd, n_layer, n_head, n_kv_head, head_dim, n_ff, n_ctx;
    uint32_t n_merges; /* upper bound: training stops when the corpus runs out */
    int tied;          /* share token_embd as the output head */
    int arch;          /* the architecture it must be (enum model_arch), -1 for any */
    uint32_t n_vocab;  /* embedding rows (vocabulary padded to it); 0: the tokenizer's size */
    float rope_base;   /* 0: the architecture's default (llama 500000, qwen 1000000) */
    float rms_eps;     /* 0: 1e-6 */
    synth_rope_scaling rope_scaling;
    uint32_t n_expert, n_expert_used, n_ff_exp; /* a mixture of experts; 0: dense */
} synth_preset;

/* The roles of a model's matrices, for choosing their types: llama.cpp's
 * tensor categories.  An expert tensor (ffn_*_exps) has the role of its
 * dense counterpart in llama-quantize's rules, and its own one here so that
 * a table can tell them apart; the MoE router (ffn_gate_inp) is always
 * f32, as llama.cpp's converter writes it and llama-quantize keeps it. */
enum synth_role {
    SYNTH_TOKEN_EMBD,
    SYNTH_OUTPUT,
    SYNTH_ATTN_Q,
    SYNTH_ATTN_K,
    SYNTH_ATTN_V,
    SYNTH_ATTN_OUTPUT,
    SYNTH_FFN_GATE,
    SYNTH_FFN_UP,
    SYNTH_FFN_DOWN,
    SYNTH_FFN_GATE_INP,
    SYNTH_FFN_GATE_EXPS,
    SYNTH_FFN_UP_EXPS,
    SYNTH_FFN_DOWN_EXPS,
    SYNTH_N_ROLES
};

/* What a type rule knows of the model (llama-quantize's inputs). */
typedef struct {
    enum model_arch arch;
    uint32_t n_layer, n_head, n_kv_head;
    uint32_t n_expert; /* 0: dense */
    int tied;          /* no output.weight: token_embd is the output head too */
} synth_shape;

/* What --dtype names: the weight types of a file.  A plain scheme gives
 * every matrix one type; a mixture (llama-quantize's q4_k_m and kin) has a
 * rule picking a matrix's type from its role, layer and row length, as
 * llama-quantize's own rules do.  Vectors (norms, biases, rope
 * frequencies) and an MoE router are always F32, as llama.cpp writes them. */
typedef struct synth_wtypes {
    const char *name; /* as --dtype takes it */
    uint32_t ftype;   /* general.file_type (llama.cpp's llama_ftype) */
    int type;         /* every matrix's type, or a mixture's usual one */
    /* A mixture's rule (NULL: `type` throughout): the type it wants for the
     * matrix of role r in layer il (0 for token_embd and output) whose rows
     * are n_in long (ggml's ne[0]), before synth_fallback_type. */
    int (*rule)(const struct synth_wtypes *w, const synth_shape *s, enum synth_role r, uint32_t il,
                uint64_t n_in);
} synth_wtypes;

/* The scheme named s, or NULL. */
const synth_wtypes *synth_find_wtypes(const char *s);
/* 0 for a known scheme, else DX_EINVAL naming s and the schemes. */
int synth_check_wtypes(const char *s);
/* "f32|f16|bf16|q8_0|...|q4_k_m|..." */
const char *synth_wtypes_names(void);
/* The type synth gives the matrix of role r in layer il with rows of n_in:
 * a mixture's rule, then synth_fallback_type. */
int synth_wtypes_type(const synth_wtypes *w, const synth_shape *s, enum synth_role r, uint32_t il,
                      uint64_t n_in);
/* llama-quantize's fallback for a row length its type cannot hold (rows of
 * the super-block types must be multiples of 256): iq4_xs -> iq4_nl,
 * q2_K and q3_K -> q4_0, q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, and f16
 * when that does not fit either; `type` itself when it fits. */
int synth_fallback_type(int type, uint64_t n_in);

typedef struct {
    enum model_arch arch;
    const char *preset; /* tiny | tiny-k | small | 0.6b | qwen3-0.6b | llama3.2-1b | tiny-moe |
                           tiny-moe-k | qwen3-30b-a3b */
    uint32_t n_layer;   /* layers instead of the preset's (0: the preset's) */
    /* The weight types: a scheme (--dtype), or when NULL every matrix of
     * type `dtype` (any dx_dtype_supported() type); an MoE router is f32. */
    const synth_wtypes *wtypes;
    int dtype;
    uint64_t seed;
    const char *tokenizer; /* a Hugging Face tokenizer.json (or its directory); NULL: synthetic */
    /* Llama 3 rope scaling instead of the preset's (NULL: the preset's);
     * lets tests try scaling on a tiny shape. */
    const synth_rope_scaling *rope_scaling;
    /* Non-NULL: a dry run.  Nothing is written (and no tensor quantised):
     * a line per tensor, "name type [ne0, ne1...]" with what a mixture
     * wanted where a row length made it fall back, is appended, then a
     * summary line. */
    dx_buf *list;
} synth_config;

const synth_preset *synth_find_preset(const char *name); /* NULL if unknown */
/* 0 for a known preset, else DX_EINVAL with a message naming it and the presets. */
int synth_check_preset(const char *name);
/* "tiny|small|..." */
const char *synth_preset_names(void);
/* The rope frequency divisors of Llama 3 scaling, [head_dim / 2], as
 * llama.cpp's converter computes them into rope_freqs.weight. */
void synth_llama3_rope_factors(const synth_rope_scaling *s, float base, uint32_t head_dim,
                               float *out);
int synth_parse_arch(const char *s, enum model_arch *out);
/* The architecture a preset gets without --arch: its own, else qwen3moe for
 * a mixture of experts and qwen3 for the rest. */
enum model_arch synth_default_arch(const synth_preset *p);
/* What a type rule sees of preset p written as architecture a with n_layer
 * layers (0: the preset's). */
synth_shape synth_shape_of(const synth_preset *p, enum model_arch a, uint32_t n_layer);
int synth_write(const synth_config *cfg, const char *path);

#endif
