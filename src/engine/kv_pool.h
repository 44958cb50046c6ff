/* kv_pool: the paged KV block pool and its prefix cache.
 *
 * One arena, allocated once at start-up through a hook (so the transfer
 * layer can have UCX allocate and register it); its pages are faulted in by
 * kv_pool_populate, which the engine runs in the background so start-up does
 * not wait for a GiB of page faults.  The arena is
 * n_blocks fixed-size blocks; a block holds K and V of *all* layers for
 * block_size tokens, contiguously, so one block is one contiguous byte range
 * and adjacent block ids are adjacent memory.  Layout inside a block:
 *
 *   [layer][K|V][kv_head] then K as [head_dim][token_in_block] (transposed,
 *   so attention scores 16 keys per vector) and V as [token_in_block][head_dim]
 *   (elements of dtype; kern.h has the index formulas).  A q8_0 pool stores
 *   int8 quants with one f16 scale per 32 elements of a token's row, the
 *   scales after the quants of each kv head (kern.h: 17/16 bytes an element,
 *   0.53 of f16).
 *
 * Blocks are refcounted.  A block with refcount 0 is either free or cached:
 * cached blocks carry a prefix hash and stay findable until evicted, least
 * recently released first.  Allocation takes a free block, else evicts the
 * LRU cached one, else fails with DX_EFULL (never aborts).
 *
 * Prefix hashes: h_i = XXH3-128(h_{i-1} || token ids of block i as int32
 * little-endian), h_{-1} = the seed derived from the model fingerprint.  A
 * chain identifies a block's tokens *and* all tokens before it, so equal
 * hashes mean equal KV (same model, same positions).
 *
 * Thread safety: all functions take one internal mutex (the engine thread,
 * the event loop and transfer threads all touch refcounts); block *contents*
 * are not synchronised — whoever holds a reference decides.
 *
 * Nothing is allocated after kv_pool_create: block metadata, the free list,
 * the LRU list and the hash index are all sized from n_blocks up front.
 *
 * Block ids: functions that take an id DX_ASSERT that it is in range (ids
 * come from kv_pool_alloc; an id from outside the process — the KV port —
 * must be checked with kv_pool_valid_id first).  kv_pool_block_ptr returns
 * NULL and kv_pool_insert DX_EINVAL for an out-of-range id instead. */
#ifndef KV_POOL_H
#define KV_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t lo, hi;
} kv_hash;

static inline int kv_hash_eq(kv_hash a, kv_hash b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

typedef struct {
    uint32_t n_layer, n_kv_head, head_dim;
    uint32_t block_size; /* tokens per block, 1..1024; 0 means the default 16 */
    /* DX_F16 (the CLI default) | DX_BF16 | DX_F32 | DX_Q8_0 (head_dim a
     * multiple of 32).  DX_F32 == 0, so a zeroed config means f32: set it
     * explicitly. */
    int dtype;
    uint32_t n_blocks; /* 1..2^30; if 0: pool_bytes / block bytes, capped */
    size_t pool_bytes;
    kv_hash seed; /* model fingerprint: seeds every hash chain */
    /* Arena allocation hook; NULL = anonymous mmap.  Must return page-aligned
     * memory or NULL (contents unspecified); the pool calls release(user, p,
     * bytes) with the same bytes at destroy.  Set both or neither. */
    void *(*alloc)(void *user, size_t bytes);
    void (*release)(void *user, void *p, size_t bytes);
    void *alloc_user;
} kv_pool_config;

typedef struct kv_pool kv_pool;

typedef struct {
    uint32_t n_blocks;
    uint32_t n_free;   /* refcount 0, no hash */
    uint32_t n_cached; /* refcount 0, hashed, evictable */
    uint32_t n_used;   /* refcount > 0 */
    uint64_t evictions;
    /* kv_pool_match_prefix, counted per block: hits = blocks matched,
     * misses = blocks asked for but not matched (n - matched). */
    uint64_t hits, misses;
} kv_pool_stats;

int kv_pool_create(const kv_pool_config *cfg, kv_pool **out);
void kv_pool_destroy(kv_pool *p);

/* The geometry the pool was built with (defaults resolved; no hooks), e.g.
 * what a KV-port HELLO announces. */
void kv_pool_geometry(const kv_pool *p, kv_pool_config *out);
uint32_t kv_pool_n_blocks(const kv_pool *p);
uint32_t kv_pool_block_size(const kv_pool *p);
/* The bytes of one block of the pool c describes, without making it;
 * DX_EINVAL for a config kv_pool_create would refuse. */
int kv_pool_config_block_bytes(const kv_pool_config *c, size_t *out);
size_t kv_pool_block_bytes(const kv_pool *p);
int kv_pool_dtype(const kv_pool *p);
uint8_t *kv_pool_base(const kv_pool *p);
/* Faults every page of the arena in, writable, without changing its
 * contents (madvise MADV_POPULATE_WRITE), so first use does not pay page
 * faults; safe while the pool is in use.  Stops early with DX_ECANCELED when
 * *stop becomes non-zero (read atomically; stop may be NULL); DX_EUNSUPPORTED on a kernel
 * without it (pages then fault on first use, which is only slower). */
int kv_pool_populate(kv_pool *p, const int *stop);
/* Bytes allocated through the hook (n_blocks * block_bytes rounded up to
 * the page size): the range to register for transfers. */
size_t kv_pool_arena_bytes(const kv_pool *p);
/* base + id * block_bytes, or NULL for an id out of range. */
uint8_t *kv_pool_block_ptr(const kv_pool *p, int32_t id);
/* Byte offset, within a block, of layer l's K (or V) region. */
size_t kv_pool_k_offset(const kv_pool *p, uint32_t layer);
size_t kv_pool_v_offset(const kv_pool *p, uint32_t layer);

/* Take a block with refcount 1 (free first, else evict LRU cached).
 * DX_EFULL when every block is referenced. */
int kv_pool_alloc(kv_pool *p, int32_t *id);
/* Take n blocks or none (DX_EFULL, nothing taken). */
int kv_pool_alloc_n(kv_pool *p, size_t n, int32_t *ids);
/* Refcount + 1.  On a cached block (refcount 0) it takes it out of the LRU;
 * on a free block it is a broken invariant (DX_ASSERT). */
void kv_pool_ref(kv_pool *p, int32_t id);
/* Refcount - 1; at 0 a hashed block becomes cached (most recently used end of
 * the LRU), an unhashed one becomes free.  Below 0 is a broken invariant. */
void kv_pool_unref(kv_pool *p, int32_t id);
uint32_t kv_pool_refcount(const kv_pool *p, int32_t id);
int kv_pool_valid_id(const kv_pool *p, int32_t id);

/* Hashing. */
kv_hash kv_pool_seed(const kv_pool *p);
kv_hash kv_hash_next(kv_hash prev, const int32_t *tokens, size_t n);
/* Hashes of the full blocks of tokens[0..n): out[i] for block i; returns the
 * number of full blocks (n / block_size). */
size_t kv_pool_hash_chain(const kv_pool *p, const int32_t *tokens, size_t n, kv_hash *out);
/* Prefix-cache namespaces (vLLM's cache_salt; duplex gives each API key
 * one): the seed of a salted chain mixes the salt into the pool's, so a
 * block is found, pinned or pulled only with the same salt.  An all-zero
 * salt is the shared namespace: the pool's own seed. */
#define KV_SALT_BYTES 16
kv_hash kv_pool_seed_salted(const kv_pool *p, const uint8_t salt[KV_SALT_BYTES]);
/* kv_pool_hash_chain from a given seed (kv_pool_seed_salted's). */
size_t kv_pool_hash_chain_from(const kv_pool *p, kv_hash seed, const int32_t *tokens, size_t n,
                               kv_hash *out);

/* Prefix cache. */
/* Register a full, computed block under hash h.  If another block already has
 * h, returns DX_EEXIST and sets *existing (the caller may switch to it);
 * re-inserting the same block with the same hash is a no-op (existing may be
 * NULL).  The block must be referenced (DX_ASSERT); a block that already has a
 * different hash is refused with DX_EINVAL (its KV cannot have changed). */
int kv_pool_insert(kv_pool *p, int32_t id, kv_hash h, int32_t *existing);
/* Register a full, computed, referenced block *id under h, or — when another
 * block already holds h (the same tokens at the same positions, computed
 * twice) — switch to that one: take a reference on it, drop ours (it goes
 * back to the free list) and set *id.  Returns 1 if it switched, else 0.
 * Either way *id is then a hashed, referenced block holding h's KV. */
int kv_pool_publish(kv_pool *p, int32_t *id, kv_hash h);
/* Block id holding h, or -1.  Does not take a reference. */
int32_t kv_pool_lookup(kv_pool *p, kv_hash h);
/* Longest prefix of chain[0..n) present in the cache: takes a reference on
 * each matched block, writes their ids to ids[], returns the count. */
size_t kv_pool_match_prefix(kv_pool *p, const kv_hash *chain, size_t n, int32_t *ids);
/* Hash of a block, if it has one: 1 and *h set, else 0. */
int kv_pool_block_hash(const kv_pool *p, int32_t id, kv_hash *h);
/* Drop the hash of a block (it stays allocated if referenced). */
void kv_pool_forget(kv_pool *p, int32_t id);
/* Evict up to n cached blocks now (LRU first); returns how many. */
uint32_t kv_pool_evict(kv_pool *p, uint32_t n);
/* Visit every hashed block (cached or in use), in id order; stop if fn
 * returns non-zero.  fn runs under the pool mutex: it must not call back into
 * the pool (the mutex is not recursive). */
void kv_pool_foreach_cached(kv_pool *p, int (*fn)(void *user, int32_t id, kv_hash h, uint32_t ref),
                            void *user);

void kv_pool_get_stats(const kv_pool *p, kv_pool_stats *out);

/* Check every internal invariant — free list, LRU links, counts, hash index
 * — in O(n_blocks + index size).  For tests and debugging: returns 0, or
 * DX_EMISMATCH with a message naming the first broken invariant. */
int kv_pool_check(kv_pool *p);

#endif
