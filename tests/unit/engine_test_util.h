/* Shared helpers for the engine tests: tiny synthetic models (dense, or the
 * tiny-moe mixture of experts) written once per test binary into a
 * temporary directory. */
#ifndef ENGINE_TEST_UTIL_H
#define ENGINE_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "model/model.h"
#include "model/synth.h"

static char etu_dir[64];

static inline int etu_setup(void)
{
    strcpy(etu_dir, "/tmp/dx_engine_test_XXXXXX");
    return mkdtemp(etu_dir) ? 0 : -1;
}

static inline void etu_teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", etu_dir);
    if (system(cmd)) fprintf(stderr, "cleanup of %s failed\n", etu_dir);
}

/* Writes c's model to path unless it is there, then loads it (NULL, with
 * the reason on stderr, on failure). */
static inline model *etu_load_synth(const synth_config *c, const char *path)
{
    if (access(path, F_OK) != 0 && synth_write(c, path)) {
        fprintf(stderr, "synth: %s\n", dx_errmsg());
        return NULL;
    }
    model *m = NULL;
    if (model_load(path, &m)) fprintf(stderr, "load: %s\n", dx_errmsg());
    return m;
}

/* Synthesises (once per name) and loads a model of a small preset (seed 42). */
static inline model *etu_model_p(enum model_arch arch, const char *preset, int dtype)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s-%d-%d.gguf", etu_dir, preset, (int)arch, dtype);
    synth_config c = {.arch = arch, .preset = preset, .dtype = dtype, .seed = 42};
    return etu_load_synth(&c, path);
}

/* A mixture of weight types, as llama-quantize writes them and more: q4_0
 * with attn_v q4_1 in layer 0 (its QKV group shares one activation prep),
 * layer 1's QKV group of bf16, q4_0 and f16 (three preps), attn_output
 * q5_0, ffn_down q8_0, an iq4_nl embedding and a q5_1 output head. */
static inline int etu_mix_rule(const synth_wtypes *w, const synth_shape *s, enum synth_role r,
                               uint32_t il, uint64_t n_in)
{
    (void)w;
    (void)s;
    (void)n_in;
    switch (r) {
    case SYNTH_ATTN_Q:
        return il == 1 ? DX_BF16 : DX_Q4_0;
    case SYNTH_ATTN_V:
        return il == 1 ? DX_F16 : DX_Q4_1;
    case SYNTH_ATTN_OUTPUT:
        return DX_Q5_0;
    case SYNTH_FFN_DOWN:
        return DX_Q8_0;
    case SYNTH_TOKEN_EMBD:
        return DX_IQ4_NL;
    case SYNTH_OUTPUT:
        return DX_Q5_1;
    default:
        return DX_Q4_0;
    }
}

/* Synthesises (once) and loads the tiny model with etu_mix_rule's types. */
static inline model *etu_model_mix(enum model_arch arch)
{
    static const synth_wtypes mix = {"test-mix", 2, DX_Q4_0, etu_mix_rule};
    char path[256];
    snprintf(path, sizeof path, "%s/tiny-%d-mix.gguf", etu_dir, (int)arch);
    synth_config c = {.arch = arch, .preset = "tiny", .wtypes = &mix, .seed = 42};
    return etu_load_synth(&c, path);
}

/* Synthesises (once per name) and loads a preset with the weight types of
 * a `--dtype` scheme (a llama-quantize preset such as "q4_k_m"). */
static inline model *etu_model_scheme(enum model_arch arch, const char *preset, const char *scheme)
{
    const synth_wtypes *wt = synth_find_wtypes(scheme);
    if (!wt) return NULL;
    char path[256];
    snprintf(path, sizeof path, "%s/%s-%d-%s.gguf", etu_dir, preset, (int)arch, scheme);
    synth_config c = {.arch = arch, .preset = preset, .wtypes = wt, .seed = 42};
    return etu_load_synth(&c, path);
}

/* The tiny preset. */
static inline model *etu_model(enum model_arch arch, int dtype)
{
    return etu_model_p(arch, "tiny", dtype);
}

/* Deterministic pseudo-random token ids below n_vocab - 16 (avoids the
 * control tokens at the end of the synthetic vocabulary). */
static inline void etu_tokens(int32_t *out, size_t n, uint32_t n_vocab, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = (int32_t)((seed >> 33) % (n_vocab - 16));
    }
}

#endif
