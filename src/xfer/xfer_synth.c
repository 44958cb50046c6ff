/* xfer_synth: see xfer_synth.h.  The fill is splitmix64 of (seed, id, word)
 * so any single flipped or misplaced word shows up in xfer_synth_check. */
#include "xfer/xfer_synth.h"

#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"

/* splitmix64 of a value: a stateless hash of it */
static uint64_t mix(uint64_t x)
{
    return dx_splitmix64(&x);
}

static void fingerprint_of(uint64_t model_seed, kv_pool_config *cfg, uint8_t fp[16])
{
    uint64_t lo = mix(model_seed), hi = mix(lo ^ 0x5eedull);
    memcpy(fp, &lo, 8);
    memcpy(fp + 8, &hi, 8);
    cfg->seed = (kv_hash){lo, hi};
}

int xfer_synth_layout(size_t block_bytes, uint32_t n_blocks, uint64_t model_seed,
                      kv_pool_config *cfg, uint8_t fingerprint[16])
{
    if (block_bytes < 64 || block_bytes % 64)
        return dx_errf(DX_EINVAL, "block bytes %zu: must be a positive multiple of 64",
                       block_bytes);
    memset(cfg, 0, sizeof *cfg);
    cfg->n_layer = 1;
    cfg->n_kv_head = 1;
    cfg->head_dim = (uint32_t)(block_bytes / 64);
    cfg->block_size = 16;
    cfg->dtype = DX_F16;
    cfg->n_blocks = n_blocks;
    fingerprint_of(model_seed, cfg, fingerprint);
    return 0;
}

void xfer_synth_layout_06b(uint32_t n_blocks, uint64_t model_seed, kv_pool_config *cfg,
                           uint8_t fingerprint[16])
{
    memset(cfg, 0, sizeof *cfg);
    cfg->n_layer = 28;
    cfg->n_kv_head = 8;
    cfg->head_dim = 128;
    cfg->block_size = 16;
    cfg->dtype = DX_F16;
    cfg->n_blocks = n_blocks;
    fingerprint_of(model_seed, cfg, fingerprint);
}

void xfer_synth_fill(kv_pool *p, int32_t id, uint64_t seed)
{
    uint64_t *w = (uint64_t *)kv_pool_block_ptr(p, id);
    size_t n = kv_pool_block_bytes(p) / 8;
    uint64_t base = mix(seed ^ ((uint64_t)(uint32_t)id << 32));
    for (size_t i = 0; i < n; i++) w[i] = base ^ (i * 0x9e3779b97f4a7c15ull);
}

int xfer_synth_check(const kv_pool *p, int32_t id, uint64_t seed, int32_t want_id)
{
    const uint64_t *w = (const uint64_t *)kv_pool_block_ptr(p, id);
    size_t n = kv_pool_block_bytes(p) / 8;
    uint64_t base = mix(seed ^ ((uint64_t)(uint32_t)want_id << 32));
    for (size_t i = 0; i < n; i++)
        if (w[i] != (base ^ (i * 0x9e3779b97f4a7c15ull))) return 0;
    return 1;
}

void xfer_synth_chain(const kv_pool *p, uint64_t seed, size_t n, kv_hash *chain)
{
    uint32_t bs = kv_pool_block_size(p);
    kv_hash h = kv_pool_seed(p);
    int32_t tok[1024];
    for (size_t b = 0; b < n; b++) {
        for (uint32_t j = 0; j < bs && j < 1024; j++)
            tok[j] = (int32_t)(mix(seed * 1000003u + b * bs + j) & 0x7fff);
        chain[b] = h = kv_hash_next(h, tok, bs);
    }
}
