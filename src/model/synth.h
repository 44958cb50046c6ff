/* synth: writes random-weight GGUF models that real tools can load — every
 * metadata key llama.cpp reads for the architecture, a byte-level BPE
 * tokenizer whose merges are learned from the embedded corpus, the chat
 * template — deterministic for a seed (same seed → byte-identical file).
 * Presets: tiny (unit tests), small (the demo), 0.6b (Qwen3-0.6B shapes). */
#ifndef SYNTH_H
#define SYNTH_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    const char *name;
    uint32_t n_embd, n_layer, n_head, n_kv_head, head_dim, n_ff, n_ctx;
    uint32_t n_merges; /* upper bound: training stops when the corpus runs out */
    int tied;          /* share token_embd as the output head */
} synth_preset;

typedef struct {
    enum model_arch arch;
    const char *preset; /* tiny | small | 0.6b */
    int dtype;          /* weight type of 2-D tensors: DX_F32 | DX_F16 | DX_BF16 | DX_Q8_0 */
    uint64_t seed;
} synth_config;

const synth_preset *synth_find_preset(const char *name); /* NULL if unknown */
/* 0 for a known preset, else DX_EINVAL with a message naming it and the presets. */
int synth_check_preset(const char *name);
int synth_parse_arch(const char *s, enum model_arch *out);
int synth_write(const synth_config *cfg, const char *path);

#endif
