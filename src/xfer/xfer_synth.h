/* xfer_synth: synthetic KV for transfer tests and benchmarks — a pool laid
 * out with a given block size in bytes, blocks filled with a pattern that is
 * a function of (seed, block id), and a hash chain over synthetic tokens, so
 * that two processes given the same seed agree on contents and hashes
 * without exchanging anything. */
#ifndef XFER_SYNTH_H
#define XFER_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kv_pool.h"
#include "xfer/xfer_ucx.h"

/* A layout whose block is block_bytes (a multiple of 64: one layer, one KV
 * head, 16 tokens, f16, head_dim = block_bytes / 64) and whose hash seed is
 * derived from model_seed; fingerprint[16] is filled to match. */
int xfer_synth_layout(size_t block_bytes, uint32_t n_blocks, uint64_t model_seed,
                      kv_pool_config *cfg, uint8_t fingerprint[16]);
/* The 0.6b preset's layout (28 layers, 8 KV heads, head_dim 128, 16 tokens,
 * f16: 1,835,008-byte blocks). */
void xfer_synth_layout_06b(uint32_t n_blocks, uint64_t model_seed, kv_pool_config *cfg,
                           uint8_t fingerprint[16]);

void xfer_synth_fill(kv_pool *p, int32_t id, uint64_t seed);
/* 1 if block id holds the pattern of (seed, want_id). */
int xfer_synth_check(const kv_pool *p, int32_t id, uint64_t seed, int32_t want_id);
/* chain[0..n): hashes of blocks 0..n of the synthetic token stream of seed. */
void xfer_synth_chain(const kv_pool *p, uint64_t seed, size_t n, kv_hash *chain);

#endif
