/* model: a loaded model — the GGUF file, its hyper-parameters, its weights
 * (pointers into the mmap, never copied), its tokenizer and chat template.
 *
 * Supported architectures: llama, qwen2 (q/k/v biases), qwen3 (q/k RMSNorm),
 * and the mixtures of experts qwen3moe (Qwen3-30B-A3B: qwen3's attention,
 * every FFN a routed MoE) and llama with {arch}.expert_count > 0
 * (Mixtral-style).  An MoE layer has a router ffn_gate_inp [n_embd ->
 * n_expert] and the experts' FFNs stacked in 3-D tensors ffn_{gate,up,down}_exps
 * (ggml's ne: [n_embd, n_ff_exp, n_expert] for gate/up, [n_ff_exp, n_embd,
 * n_expert] for down: expert e is the 2-D matrix at e * ne[1] rows), and no
 * dense ffn_gate/up/down.  Loading checks every tensor the architecture
 * needs: present, the expected shape, a supported type; a missing or
 * misshapen tensor is an error that names it.
 *
 * The fingerprint is XXH3-128 over everything that changes what the model
 * computes: the architecture, its hyper-parameters (each field hashed on its
 * own), and every tensor's name, shape, type and all of its data bytes.  It
 * is computed once at load (one pass over the weights: ~50 ms for 843 MiB
 * with the file in the page cache), on a thread of its own while the
 * tokenizer is built.  Two nodes share KV only if their
 * fingerprints match, and it seeds every KV block hash chain, so a change
 * of one weight byte anywhere gives other KV. */
#ifndef MODEL_H
#define MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/chat_tmpl.h"
#include "model/gguf.h"
#include "tok/tok.h"

enum model_arch { MODEL_LLAMA, MODEL_QWEN2, MODEL_QWEN3, MODEL_QWEN3MOE };

/* llama.cpp's limit (LLAMA_MAX_EXPERTS), and a bound on the experts one
 * token uses that keeps per-token routing state on the stack. */
#define MODEL_MAX_EXPERTS      512
#define MODEL_MAX_EXPERTS_USED 64

/* duplex's own GGUF key: the tokenizer's text normalizer ("nfc"), written
 * from a tokenizer.json that asks for one.  Files without it are not
 * normalised (as llama.cpp, which has no such key). */
#define MODEL_KEY_NORMALIZER "duplex.tokenizer.normalizer"

typedef struct {
    enum model_arch arch;
    char arch_name[16];
    uint32_t n_vocab, n_embd, n_layer, n_head, n_kv_head, head_dim, n_ff, n_ctx_train;
    float rms_eps, rope_base;
    int rope_neox;   /* qwen*: NeoX (half-split) rotary; llama: adjacent pairs */
    int qk_norm;     /* qwen3 */
    int qkv_bias;    /* qwen2 */
    int tied_output; /* no output.weight: the embedding matrix is reused */
    /* Mixture of experts (n_expert 0: dense).  Routing is llama.cpp's for
     * both families: softmax over all n_expert router logits, the
     * n_expert_used most probable, their probabilities divided by their sum
     * when expert_weights_norm (engine/moe.h). */
    uint32_t n_expert, n_expert_used;
    uint32_t n_ff_exp;       /* rows of one expert's gate/up: qwen3moe's
                                expert_feed_forward_length; llama's n_ff */
    int expert_weights_norm; /* {arch}.expert_weights_norm, default 1 */
} model_hparams;

/* One weight tensor: data in the mapping, type a dx_dtype, ne[0] = row length. */
typedef struct {
    const void *data;
    int type;
    /* [0] = n_in (row length), [1] = rows (1 for vectors), [2] = experts
     * (1 unless stacked: matrix e starts at row e * ne[1]) */
    uint64_t ne[3];
} model_tensor;

typedef struct {
    model_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm;
    model_tensor ffn_norm;
    model_tensor w_gate, w_up, w_down; /* dense FFN; absent (data NULL) in an MoE layer */
    model_tensor ffn_gate_inp;         /* router: [n_expert][n_embd] */
    model_tensor ffn_gate_exps;        /* [n_expert][n_ff_exp][n_embd] */
    model_tensor ffn_up_exps;          /* [n_expert][n_ff_exp][n_embd] */
    model_tensor ffn_down_exps;        /* [n_expert][n_embd][n_ff_exp] */
} model_layer;

typedef struct model model;

int model_load(const char *path, model **out);
/* The tokenizer, chat template, name and hyper-parameters only (a router
 * counting prompt tokens): no tensor is bound or read, so the weight
 * accessors and the fingerprint must not be used on the result. */
int model_load_tokenizer(const char *path, model **out);
void model_free(model *m);

const model_hparams *model_hp(const model *m);
const model_layer *model_layer_at(const model *m, uint32_t i);
const model_tensor *model_tok_embd(const model *m);    /* [n_vocab][n_embd] */
const model_tensor *model_output_norm(const model *m); /* [n_embd] */
const model_tensor *model_output(const model *m);      /* [n_vocab][n_embd], may be tok_embd */
/* Rope frequency divisors [head_dim / 2] (llama.cpp's rope_freqs.weight,
 * how Llama 3.1+ rope scaling is stored), or NULL: frequency i is
 * base^(-2i/head_dim) / divisor[i]. */
const float *model_rope_freqs(const model *m);
const tok *model_tokenizer(const model *m);
enum chat_tmpl_kind model_chat_kind(const model *m);
const char *model_chat_template(const model *m); /* the GGUF's Jinja text, or NULL */
/* The chat template as parsed Jinja, or NULL when duplex renders it
 * natively (its own synthetic models' templates) or there is none. */
const struct jinja_tmpl *model_chat_jinja(const model *m);
/* Replaces the chat template (--chat-template FILE; `where` names it in
 * errors): parsed now, DX_EINVAL naming line and column, the model's own
 * kept on failure. */
int model_set_chat_template(model *m, const char *text, size_t len, const char *where);
/* Why the model's chat template cannot be run (it does not parse), or
 * NULL.  Loading succeeds either way: a server or `generate` reports it
 * unless --chat-template replaced the template. */
const char *model_chat_error(const model *m);
const gguf_ctx *model_gguf(const model *m);
const char *model_path(const model *m);
const char *model_name(const model *m); /* general.name, or the file's base name */
/* 128-bit fingerprint (see above): out[0] = low 64 bits, out[1] = high. */
void model_fingerprint(const model *m, uint64_t out[2]);
uint64_t model_n_params(const model *m);
/* The parameters one token computes with: all but the experts it is not
 * routed to (n_params for a dense model). */
uint64_t model_n_active_params(const model *m);

#endif
