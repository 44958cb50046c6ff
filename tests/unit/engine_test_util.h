/* Shared helpers for the engine tests: tiny synthetic models (dense, or the
 * tiny-moe mixture of experts) written once per test binary into a
 * temporary directory. */
#ifndef ENGINE_TEST_UTIL_H
#define ENGINE_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Synthesises (once per name) and loads a model of a small preset (seed 42). */
static inline model *etu_model_p(enum model_arch arch, const char *preset, int dtype)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s-%d-%d.gguf", etu_dir, preset, (int)arch, dtype);
    if (access(path, F_OK) != 0) {
        synth_config c = {.arch = arch, .preset = preset, .dtype = dtype, .seed = 42};
        if (synth_write(&c, path)) {
            fprintf(stderr, "synth: %s\n", dx_errmsg());
            return NULL;
        }
    }
    model *m = NULL;
    if (model_load(path, &m)) fprintf(stderr, "load: %s\n", dx_errmsg());
    return m;
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
