/* kv_pool: the paged KV block pool and its prefix cache (contract in
 * kv_pool.h).
 *
 * Everything is sized at create so the hot path (alloc, ref/unref, prefix
 * match) is O(1) and allocates nothing:
 *  - per-block metadata in one array; a block's state is implied by it:
 *    refcount > 0 = used, refcount 0 and hashed = cached, else free;
 *  - free blocks form a stack threaded through `next` (LIFO: the block freed
 *    last is the one most likely still in the CPU caches);
 *  - cached blocks form a doubly linked LRU list threaded through prev/next,
 *    head = least recently released = next to evict;
 *  - both link by block id, not with base/dx_list pointers: the metadata
 *    stays one flat array of 4-byte links, and an id is what the index,
 *    the callers and the consistency check name a block by;
 *  - the hash index is an open-addressing table of block ids (the key, the
 *    128-bit hash, lives in the block's metadata), at least 2x n_blocks slots
 *    so the load stays <= 1/2, linear probing with backward-shift deletion so
 *    churn leaves no tombstones and probe lengths never degrade.
 * One mutex guards all of it; kv_hash_next and the layout getters touch only
 * immutable fields and take no lock. */
#include "engine/kv_pool.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation */
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"

#define KV_NIL                (-1)
#define KV_DEFAULT_BLOCK_SIZE 16u
#define KV_MAX_BLOCK_SIZE     1024u
/* Keeps the index (2x, power of two) within 2^31 slots and ids in int32. */
#define KV_MAX_BLOCKS (1u << 30)
/* Tokens hashed from a stack buffer in one shot; longer runs stream. */
#define KV_HASH_STACK_TOKENS 256u

typedef struct {
    kv_hash h;    /* valid when hashed */
    uint32_t ref; /* holders */
    int32_t prev; /* LRU link (cached blocks only) */
    int32_t next; /* LRU link when cached, free-stack link when free */
    uint8_t hashed;
} kv_blk;

/* Geometry derived from a validated config. */
typedef struct {
    uint32_t n_blocks, block_size;
    size_t kv_bytes;    /* one layer's K (or V) region in a block */
    size_t block_bytes; /* n_layer * 2 * kv_bytes */
    size_t arena_bytes; /* n_blocks * block_bytes, rounded up to the page size */
} kv_layout;

struct kv_pool {
    pthread_mutex_t mu;
    kv_blk *blk;   /* [n_blocks] */
    int32_t *slot; /* [slot_mask + 1] hash index: block id or KV_NIL */
    uint32_t slot_mask;
    int32_t free_top;
    int32_t lru_head, lru_tail;
    uint32_t n_free, n_cached;
    uint64_t evictions, hits, misses;

    uint8_t *base;
    kv_layout L;
    uint32_t n_layer, n_kv_head, head_dim;
    int dtype;
    kv_hash seed;
    void (*release)(void *user, void *p, size_t bytes);
    void *alloc_user;
};

/* ---- configuration ---------------------------------------------------- */

/* Bytes of one kv head's K (or V) for block_size tokens of head_dim: plain
 * elements, or for q8_0 one int8 per element and one f16 scale per 32
 * elements of a token's row (kern.h has the layout); 0 for an unknown
 * dtype or a q8_0 head_dim that is not a multiple of 32. */
static size_t kv_head_bytes(int dtype, size_t head_dim, size_t block_size)
{
    switch (dtype) {
    case DX_F16:
    case DX_BF16:
        return 2 * head_dim * block_size;
    case DX_F32:
        return 4 * head_dim * block_size;
    case DX_Q8_0:
        if (head_dim % DX_QK8_0) return 0;
        return (head_dim + head_dim / DX_QK8_0 * 2) * block_size;
    default:
        return 0;
    }
}

/* a*b*c: 0 and *out set, or 1 on overflow (dx_mul_overflow's yes/no). */
static int kv_mul3(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab;
    return dx_mul_overflow(a, b, &ab) || dx_mul_overflow(ab, c, out);
}

static int kv_check_dims(const kv_pool_config *c)
{
    if (c->n_layer == 0) return dx_errf(DX_EINVAL, "kv_pool: config.n_layer is 0");
    if (c->n_kv_head == 0) return dx_errf(DX_EINVAL, "kv_pool: config.n_kv_head is 0");
    if (c->head_dim == 0) return dx_errf(DX_EINVAL, "kv_pool: config.head_dim is 0");
    if (c->block_size > KV_MAX_BLOCK_SIZE)
        return dx_errf(DX_EINVAL, "kv_pool: config.block_size %u is out of range 1..%u",
                       c->block_size, KV_MAX_BLOCK_SIZE);
    if (c->dtype != DX_F16 && c->dtype != DX_BF16 && c->dtype != DX_F32 && c->dtype != DX_Q8_0)
        return dx_errf(DX_EINVAL, "kv_pool: config.dtype %d is not f16, bf16, f32 or q8_0",
                       c->dtype);
    if (c->dtype == DX_Q8_0 && c->head_dim % DX_QK8_0)
        return dx_errf(DX_EINVAL,
                       "kv_pool: config.head_dim %u: a q8_0 KV cache needs a multiple of %d",
                       c->head_dim, DX_QK8_0);
    if ((c->alloc == NULL) != (c->release == NULL))
        return dx_errf(DX_EINVAL, "kv_pool: config.alloc and config.release must be set together");
    return 0;
}

static int kv_layout_from_config(const kv_pool_config *c, kv_layout *L)
{
    int rc = kv_check_dims(c);
    if (rc < 0) return rc;
    L->block_size = c->block_size ? c->block_size : KV_DEFAULT_BLOCK_SIZE;
    size_t head_bytes, blocks_bytes;
    /* head_dim < 2^32 and block_size <= 1024: one head fits a 64-bit size_t */
    head_bytes = kv_head_bytes(c->dtype, c->head_dim, L->block_size);
    if (dx_mul_overflow(head_bytes, c->n_kv_head, &L->kv_bytes) ||
        kv_mul3(L->kv_bytes, 2, c->n_layer, &L->block_bytes))
        return dx_errf(DX_EINVAL,
                       "kv_pool: config: block size overflows (n_layer %u, "
                       "n_kv_head %u, head_dim %u, block_size %u)",
                       c->n_layer, c->n_kv_head, c->head_dim, L->block_size);
    size_t n = c->n_blocks;
    if (n == 0) {
        n = c->pool_bytes / L->block_bytes;
        if (n == 0)
            return dx_errf(DX_EINVAL,
                           "kv_pool: config.n_blocks is 0 and config.pool_bytes %zu holds "
                           "no block of %zu bytes",
                           c->pool_bytes, L->block_bytes);
        if (n > KV_MAX_BLOCKS) n = KV_MAX_BLOCKS;
    }
    if (n > KV_MAX_BLOCKS)
        return dx_errf(DX_EINVAL, "kv_pool: config.n_blocks %zu exceeds %u", n, KV_MAX_BLOCKS);
    L->n_blocks = (uint32_t)n;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (dx_mul_overflow(n, L->block_bytes, &blocks_bytes) ||
        dx_add_overflow(blocks_bytes, page - 1, &L->arena_bytes))
        return dx_errf(DX_EINVAL, "kv_pool: config.n_blocks %zu x %zu-byte blocks overflows", n,
                       L->block_bytes);
    L->arena_bytes &= ~(page - 1);
    return 0;
}

int kv_pool_config_block_bytes(const kv_pool_config *c, size_t *out)
{
    kv_layout L;
    int rc = kv_layout_from_config(c, &L);
    *out = rc ? 0 : L.block_bytes;
    return rc;
}

/* ---- arena ------------------------------------------------------------ */

/* Huge pages where the system allows them (THP "madvise" mode): attention
 * over a long history reads one head's K and V of every block — pieces of a
 * few KiB a whole block (all layers) apart — so with 4 KiB pages nearly every
 * piece would cost a TLB miss.  Advice only: failure changes nothing. */
static void *kv_mmap_alloc(void *user, size_t bytes)
{
    (void)user;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

static void kv_mmap_release(void *user, void *p, size_t bytes)
{
    (void)user;
    munmap(p, bytes);
}

static int kv_arena_create(kv_pool *p, const kv_pool_config *c)
{
    void *(*alloc)(void *, size_t) = c->alloc ? c->alloc : kv_mmap_alloc;
    p->release = c->alloc ? c->release : kv_mmap_release;
    p->alloc_user = c->alloc_user;
    errno = 0;
    uint8_t *base = alloc(p->alloc_user, p->L.arena_bytes);
    if (!base)
        return dx_errf(DX_ENOMEM, "kv_pool: arena of %zu bytes (%u blocks): %s failed: %s",
                       p->L.arena_bytes, p->L.n_blocks, c->alloc ? "config.alloc" : "mmap",
                       errno ? strerror(errno) : "no memory");
    if ((uintptr_t)base % (uintptr_t)sysconf(_SC_PAGESIZE) != 0) {
        p->release(p->alloc_user, base, p->L.arena_bytes);
        return dx_errf(DX_EINVAL, "kv_pool: config.alloc returned %p, not page-aligned",
                       (void *)base);
    }
    p->base = base; /* pages are faulted in later: kv_pool_populate */
    return 0;
}

int kv_pool_populate(kv_pool *p, const int *stop)
{
    /* MADV_POPULATE_WRITE faults pages in writable without touching their
     * contents, so it is safe while the engine writes KV into them; in
     * chunks, so a stop request is seen soon. */
    const size_t chunk = (size_t)64 << 20;
    for (size_t off = 0; off < p->L.arena_bytes; off += chunk) {
        if (stop && __atomic_load_n(stop, __ATOMIC_RELAXED))
            return dx_errf(DX_ECANCELED, "KV pool: fault-in stopped at %zu MiB", off >> 20);
        size_t n = p->L.arena_bytes - off < chunk ? p->L.arena_bytes - off : chunk;
        if (madvise(p->base + off, n, MADV_POPULATE_WRITE) != 0)
            return dx_errf(errno == EINVAL ? DX_EUNSUPPORTED : DX_EIO,
                           "kv_pool: populating %zu bytes at offset %zu: %s", n, off,
                           strerror(errno));
    }
    return 0;
}

/* ---- lists (caller holds the mutex) ------------------------------------ */

static void kv_free_push(kv_pool *p, int32_t id)
{
    p->blk[id].next = p->free_top;
    p->free_top = id;
    p->n_free++;
}

static int32_t kv_free_pop(kv_pool *p)
{
    int32_t id = p->free_top;
    if (id != KV_NIL) {
        p->free_top = p->blk[id].next;
        p->n_free--;
    }
    return id;
}

static void kv_lru_push_tail(kv_pool *p, int32_t id)
{
    kv_blk *b = &p->blk[id];
    b->prev = p->lru_tail;
    b->next = KV_NIL;
    if (p->lru_tail != KV_NIL)
        p->blk[p->lru_tail].next = id;
    else
        p->lru_head = id;
    p->lru_tail = id;
    p->n_cached++;
}

static void kv_lru_remove(kv_pool *p, int32_t id)
{
    kv_blk *b = &p->blk[id];
    if (b->prev != KV_NIL)
        p->blk[b->prev].next = b->next;
    else
        p->lru_head = b->next;
    if (b->next != KV_NIL)
        p->blk[b->next].prev = b->prev;
    else
        p->lru_tail = b->prev;
    b->prev = b->next = KV_NIL;
    p->n_cached--;
}

/* ---- hash index (caller holds the mutex) ------------------------------ */

static uint32_t kv_idx_home(const kv_pool *p, kv_hash h)
{
    /* XXH3 output is uniform: its low bits are a fine slot number. */
    return (uint32_t)h.lo & p->slot_mask;
}

/* Slot holding h, or the empty slot where it would go. */
static uint32_t kv_idx_probe(const kv_pool *p, kv_hash h)
{
    uint32_t i = kv_idx_home(p, h);
    while (p->slot[i] != KV_NIL && !kv_hash_eq(p->blk[p->slot[i]].h, h)) i = (i + 1) & p->slot_mask;
    return i;
}

static int32_t kv_idx_find(const kv_pool *p, kv_hash h)
{
    return p->slot[kv_idx_probe(p, h)];
}

static void kv_idx_add(kv_pool *p, int32_t id)
{
    uint32_t i = kv_idx_probe(p, p->blk[id].h);
    DX_ASSERT(p->slot[i] == KV_NIL);
    p->slot[i] = id;
}

/* Backward-shift deletion: pull later entries of the probe run into the hole
 * whenever the hole lies between their home slot and where they sit. */
static void kv_idx_del(kv_pool *p, int32_t id)
{
    uint32_t m = p->slot_mask, i = kv_idx_probe(p, p->blk[id].h);
    DX_ASSERT(p->slot[i] == id);
    for (uint32_t j = (i + 1) & m; p->slot[j] != KV_NIL; j = (j + 1) & m) {
        uint32_t home = kv_idx_home(p, p->blk[p->slot[j]].h);
        if (((j - home) & m) >= ((j - i) & m)) {
            p->slot[i] = p->slot[j];
            i = j;
        }
    }
    p->slot[i] = KV_NIL;
}

static void kv_drop_hash(kv_pool *p, int32_t id)
{
    kv_idx_del(p, id);
    p->blk[id].hashed = 0;
}

/* ---- create / destroy / layout ----------------------------------------- */

static void kv_pool_init_lists(kv_pool *p)
{
    for (size_t i = 0; i <= p->slot_mask; i++) p->slot[i] = KV_NIL;
    p->free_top = p->lru_head = p->lru_tail = KV_NIL;
    /* Pushed in reverse so a fresh pool hands out ids 0, 1, 2, ... */
    for (uint32_t i = p->L.n_blocks; i-- > 0;) {
        p->blk[i].prev = KV_NIL;
        kv_free_push(p, (int32_t)i);
    }
}

int kv_pool_create(const kv_pool_config *cfg, kv_pool **out)
{
    DX_ASSERT(cfg && out);
    *out = NULL;
    kv_layout L;
    int rc = kv_layout_from_config(cfg, &L);
    if (rc < 0) return rc;
    uint32_t n_slots = 2;
    while (n_slots < 2u * L.n_blocks) n_slots <<= 1;
    kv_pool *p = dx_calloc(1, sizeof *p);
    if (!p) return dx_errf(DX_ENOMEM, "kv_pool: out of memory for the pool");
    pthread_mutex_init(&p->mu, NULL);
    p->L = L;
    p->n_layer = cfg->n_layer;
    p->n_kv_head = cfg->n_kv_head;
    p->head_dim = cfg->head_dim;
    p->dtype = cfg->dtype;
    p->seed = cfg->seed;
    p->slot_mask = n_slots - 1;
    p->blk = dx_calloc(L.n_blocks, sizeof *p->blk);
    p->slot = dx_calloc(n_slots, sizeof *p->slot);
    if (!p->blk || !p->slot) {
        kv_pool_destroy(p);
        return dx_errf(DX_ENOMEM, "kv_pool: out of memory for metadata of %u blocks", L.n_blocks);
    }
    rc = kv_arena_create(p, cfg);
    if (rc < 0) {
        kv_pool_destroy(p);
        return rc;
    }
    kv_pool_init_lists(p);
    *out = p;
    return 0;
}

void kv_pool_destroy(kv_pool *p)
{
    if (!p) return;
    if (p->base) p->release(p->alloc_user, p->base, p->L.arena_bytes);
    pthread_mutex_destroy(&p->mu);
    dx_free(p->slot);
    dx_free(p->blk);
    dx_free(p);
}

void kv_pool_geometry(const kv_pool *p, kv_pool_config *out)
{
    *out = (kv_pool_config){.n_layer = p->n_layer,
                            .n_kv_head = p->n_kv_head,
                            .head_dim = p->head_dim,
                            .block_size = p->L.block_size,
                            .dtype = p->dtype,
                            .n_blocks = p->L.n_blocks,
                            .seed = p->seed};
}

uint32_t kv_pool_n_blocks(const kv_pool *p)
{
    return p->L.n_blocks;
}
uint32_t kv_pool_block_size(const kv_pool *p)
{
    return p->L.block_size;
}
size_t kv_pool_block_bytes(const kv_pool *p)
{
    return p->L.block_bytes;
}
int kv_pool_dtype(const kv_pool *p)
{
    return p->dtype;
}
uint8_t *kv_pool_base(const kv_pool *p)
{
    return p->base;
}
size_t kv_pool_arena_bytes(const kv_pool *p)
{
    return p->L.arena_bytes;
}

int kv_pool_valid_id(const kv_pool *p, int32_t id)
{
    return id >= 0 && (uint32_t)id < p->L.n_blocks;
}

uint8_t *kv_pool_block_ptr(const kv_pool *p, int32_t id)
{
    if (!kv_pool_valid_id(p, id)) return NULL;
    return p->base + (size_t)id * p->L.block_bytes;
}

size_t kv_pool_k_offset(const kv_pool *p, uint32_t layer)
{
    DX_ASSERT(layer < p->n_layer);
    return (size_t)layer * 2 * p->L.kv_bytes;
}

size_t kv_pool_v_offset(const kv_pool *p, uint32_t layer)
{
    return kv_pool_k_offset(p, layer) + p->L.kv_bytes;
}

/* ---- refcounts --------------------------------------------------------- */

/* The mutex is state, not value: const getters still lock it. */
static void kv_lock(const kv_pool *p)
{
    pthread_mutex_lock(&((kv_pool *)p)->mu);
}
static void kv_unlock(const kv_pool *p)
{
    pthread_mutex_unlock(&((kv_pool *)p)->mu);
}

/* Free block first, else evict the LRU cached one; KV_NIL if all are used. */
static int32_t kv_take(kv_pool *p)
{
    int32_t id = kv_free_pop(p);
    if (id == KV_NIL && p->lru_head != KV_NIL) {
        id = p->lru_head;
        kv_lru_remove(p, id);
        kv_drop_hash(p, id);
        p->evictions++;
    }
    if (id != KV_NIL) p->blk[id].ref = 1;
    return id;
}

int kv_pool_alloc(kv_pool *p, int32_t *id)
{
    kv_lock(p);
    int32_t got = kv_take(p);
    kv_unlock(p);
    if (got == KV_NIL)
        return dx_errf(DX_EFULL, "KV pool exhausted: all %u blocks in use", p->L.n_blocks);
    *id = got;
    return 0;
}

int kv_pool_alloc_n(kv_pool *p, size_t n, int32_t *ids)
{
    kv_lock(p);
    size_t avail = (size_t)p->n_free + p->n_cached;
    if (n > avail) {
        kv_unlock(p);
        return dx_errf(DX_EFULL, "KV pool exhausted: %zu blocks wanted, %zu of %u available", n,
                       avail, p->L.n_blocks);
    }
    for (size_t i = 0; i < n; i++) {
        ids[i] = kv_take(p);
        DX_ASSERT(ids[i] != KV_NIL);
    }
    kv_unlock(p);
    return 0;
}

/* Caller holds the mutex. */
static void kv_ref_locked(kv_pool *p, int32_t id)
{
    kv_blk *b = &p->blk[id];
    if (b->ref == 0) {
        DX_ASSERT(b->hashed); /* a free block has no holder to share it */
        kv_lru_remove(p, id);
    }
    DX_ASSERT(b->ref < UINT32_MAX);
    b->ref++;
}

void kv_pool_ref(kv_pool *p, int32_t id)
{
    DX_ASSERT(kv_pool_valid_id(p, id));
    kv_lock(p);
    kv_ref_locked(p, id);
    kv_unlock(p);
}

void kv_pool_unref(kv_pool *p, int32_t id)
{
    DX_ASSERT(kv_pool_valid_id(p, id));
    kv_lock(p);
    kv_blk *b = &p->blk[id];
    DX_ASSERT(b->ref > 0);
    if (--b->ref == 0) {
        if (b->hashed)
            kv_lru_push_tail(p, id);
        else
            kv_free_push(p, id);
    }
    kv_unlock(p);
}

uint32_t kv_pool_refcount(const kv_pool *p, int32_t id)
{
    DX_ASSERT(kv_pool_valid_id(p, id));
    kv_lock(p);
    uint32_t r = p->blk[id].ref;
    kv_unlock(p);
    return r;
}

/* ---- hashing ----------------------------------------------------------- */

static void kv_put_le64(uint8_t *d, uint64_t v)
{
    for (int i = 0; i < 8; i++) d[i] = (uint8_t)(v >> (8 * i));
}

static void kv_put_tokens_le(uint8_t *d, const int32_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)t[i];
        d[4 * i] = (uint8_t)v;
        d[4 * i + 1] = (uint8_t)(v >> 8);
        d[4 * i + 2] = (uint8_t)(v >> 16);
        d[4 * i + 3] = (uint8_t)(v >> 24);
    }
}

/* For runs longer than the stack buffer: same bytes, fed in pieces. */
static XXH128_hash_t kv_hash_stream(uint8_t *buf, const int32_t *tokens, size_t n)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, buf, 16);
    for (size_t i = 0; i < n; i += KV_HASH_STACK_TOKENS) {
        size_t k = n - i < KV_HASH_STACK_TOKENS ? n - i : KV_HASH_STACK_TOKENS;
        kv_put_tokens_le(buf + 16, tokens + i, k);
        XXH3_128bits_update(&st, buf + 16, 4 * k);
    }
    return XXH3_128bits_digest(&st);
}

kv_hash kv_hash_next(kv_hash prev, const int32_t *tokens, size_t n)
{
    /* Input bytes: prev.lo, prev.hi (u64 LE), then tokens (int32 LE). */
    uint8_t buf[16 + 4 * KV_HASH_STACK_TOKENS];
    kv_put_le64(buf, prev.lo);
    kv_put_le64(buf + 8, prev.hi);
    XXH128_hash_t r;
    if (n <= KV_HASH_STACK_TOKENS) {
        kv_put_tokens_le(buf + 16, tokens, n);
        r = XXH3_128bits(buf, 16 + 4 * n);
    } else {
        r = kv_hash_stream(buf, tokens, n);
    }
    return (kv_hash){.lo = r.low64, .hi = r.high64};
}

kv_hash kv_pool_seed(const kv_pool *p)
{
    return p->seed;
}

kv_hash kv_pool_seed_salted(const kv_pool *p, const uint8_t salt[KV_SALT_BYTES])
{
    static const uint8_t none[KV_SALT_BYTES];
    if (!memcmp(salt, none, sizeof none)) return p->seed;
    /* seed (16) + a tag + the salt: never the input of a block step, which
     * is 16 + 4 * block_size bytes */
    uint8_t buf[16 + 1 + KV_SALT_BYTES];
    kv_put_le64(buf, p->seed.lo);
    kv_put_le64(buf + 8, p->seed.hi);
    buf[16] = 'S';
    memcpy(buf + 17, salt, KV_SALT_BYTES);
    XXH128_hash_t r = XXH3_128bits(buf, sizeof buf);
    return (kv_hash){.lo = r.low64, .hi = r.high64};
}

size_t kv_pool_hash_chain(const kv_pool *p, const int32_t *tokens, size_t n, kv_hash *out)
{
    return kv_pool_hash_chain_from(p, p->seed, tokens, n, out);
}

size_t kv_pool_hash_chain_from(const kv_pool *p, kv_hash seed, const int32_t *tokens, size_t n,
                               kv_hash *out)
{
    size_t bs = p->L.block_size, nb = n / bs;
    kv_hash h = seed;
    for (size_t i = 0; i < nb; i++) {
        h = kv_hash_next(h, tokens + i * bs, bs);
        out[i] = h;
    }
    return nb;
}

/* ---- prefix cache ------------------------------------------------------ */

int kv_pool_insert(kv_pool *p, int32_t id, kv_hash h, int32_t *existing)
{
    if (!kv_pool_valid_id(p, id))
        return dx_errf(DX_EINVAL, "kv_pool_insert: block id %d out of range 0..%u", id,
                       p->L.n_blocks - 1);
    int rc = 0;
    kv_lock(p);
    kv_blk *b = &p->blk[id];
    if (b->hashed && kv_hash_eq(b->h, h)) {
        rc = 0;
    } else if (b->hashed) {
        rc = DX_EINVAL;
    } else {
        DX_ASSERT(b->ref > 0); /* only a held block can have been computed */
        int32_t other = kv_idx_find(p, h);
        if (other != KV_NIL) {
            if (existing) *existing = other;
            rc = DX_EEXIST;
        } else {
            b->h = h;
            b->hashed = 1;
            kv_idx_add(p, id);
        }
    }
    kv_unlock(p);
    if (rc == DX_EINVAL)
        return dx_errf(DX_EINVAL, "kv_pool_insert: block %d already has a different hash", id);
    return rc;
}

/* Under one lock, so the block that already holds h cannot be evicted
 * between finding it and referencing it. */
int kv_pool_publish(kv_pool *p, int32_t *id, kv_hash h)
{
    DX_ASSERT(kv_pool_valid_id(p, *id));
    kv_lock(p);
    kv_blk *b = &p->blk[*id];
    DX_ASSERT(b->ref > 0);
    int switched = 0;
    if (b->hashed) {
        DX_ASSERT(kv_hash_eq(b->h, h)); /* a block's KV never changes under its hash */
    } else {
        int32_t other = kv_idx_find(p, h);
        if (other == KV_NIL) {
            b->h = h;
            b->hashed = 1;
            kv_idx_add(p, *id);
        } else {
            kv_ref_locked(p, other);
            if (--b->ref == 0) kv_free_push(p, *id); /* unhashed: straight back to free */
            *id = other;
            switched = 1;
        }
    }
    kv_unlock(p);
    return switched;
}

int32_t kv_pool_lookup(kv_pool *p, kv_hash h)
{
    kv_lock(p);
    int32_t id = kv_idx_find(p, h);
    kv_unlock(p);
    return id;
}

size_t kv_pool_match_prefix(kv_pool *p, const kv_hash *chain, size_t n, int32_t *ids)
{
    size_t m = 0;
    kv_lock(p);
    for (; m < n; m++) {
        int32_t id = kv_idx_find(p, chain[m]);
        if (id == KV_NIL) break;
        kv_ref_locked(p, id);
        ids[m] = id;
    }
    p->hits += m;
    p->misses += n - m;
    kv_unlock(p);
    return m;
}

int kv_pool_block_hash(const kv_pool *p, int32_t id, kv_hash *h)
{
    DX_ASSERT(kv_pool_valid_id(p, id));
    kv_lock(p);
    int has = p->blk[id].hashed;
    if (has) *h = p->blk[id].h;
    kv_unlock(p);
    return has;
}

void kv_pool_forget(kv_pool *p, int32_t id)
{
    DX_ASSERT(kv_pool_valid_id(p, id));
    kv_lock(p);
    if (p->blk[id].hashed) {
        kv_drop_hash(p, id);
        if (p->blk[id].ref == 0) {
            kv_lru_remove(p, id);
            kv_free_push(p, id);
        }
    }
    kv_unlock(p);
}

uint32_t kv_pool_evict(kv_pool *p, uint32_t n)
{
    uint32_t k = 0;
    kv_lock(p);
    for (; k < n && p->lru_head != KV_NIL; k++) {
        int32_t id = p->lru_head;
        kv_lru_remove(p, id);
        kv_drop_hash(p, id);
        kv_free_push(p, id);
        p->evictions++;
    }
    kv_unlock(p);
    return k;
}

void kv_pool_foreach_cached(kv_pool *p, int (*fn)(void *user, int32_t id, kv_hash h, uint32_t ref),
                            void *user)
{
    kv_lock(p);
    for (uint32_t i = 0; i < p->L.n_blocks; i++) {
        const kv_blk *b = &p->blk[i];
        if (b->hashed && fn(user, (int32_t)i, b->h, b->ref)) break;
    }
    kv_unlock(p);
}

void kv_pool_get_stats(const kv_pool *p, kv_pool_stats *out)
{
    kv_lock(p);
    out->n_blocks = p->L.n_blocks;
    out->n_free = p->n_free;
    out->n_cached = p->n_cached;
    out->n_used = p->L.n_blocks - p->n_free - p->n_cached;
    out->evictions = p->evictions;
    out->hits = p->hits;
    out->misses = p->misses;
    kv_unlock(p);
}

/* ---- invariant check --------------------------------------------------- */

/* A list from `head` following `next` must end (KV_NIL) after exactly `count`
 * nodes, each in the expected state; a cycle never ends, so this also proves
 * the nodes distinct.  For the LRU, prev links must mirror next links. */
static int kv_check_list(const kv_pool *p, int32_t head, uint32_t count, int lru)
{
    int32_t prev = KV_NIL, id = head;
    for (uint32_t k = 0; k < count; k++) {
        if (!kv_pool_valid_id(p, id)) return dx_errf(DX_EMISMATCH, "list ends early at %u", k);
        const kv_blk *b = &p->blk[id];
        if (b->ref != 0 || b->hashed != lru)
            return dx_errf(DX_EMISMATCH, "block %d on the %s list has ref %u hashed %d", id,
                           lru ? "LRU" : "free", b->ref, b->hashed);
        if (lru && b->prev != prev)
            return dx_errf(DX_EMISMATCH, "LRU block %d: prev %d, expected %d", id, b->prev, prev);
        prev = id;
        id = b->next;
    }
    if (id != KV_NIL)
        return dx_errf(DX_EMISMATCH, "%s list longer than its count %u", lru ? "LRU" : "free",
                       count);
    if (lru && p->lru_tail != prev)
        return dx_errf(DX_EMISMATCH, "LRU tail %d, last node %d", p->lru_tail, prev);
    return 0;
}

static int kv_check_index(const kv_pool *p)
{
    uint32_t n_hashed = 0, n_slots = 0;
    for (uint32_t i = 0; i < p->L.n_blocks; i++) {
        if (!p->blk[i].hashed) continue;
        n_hashed++;
        if (kv_idx_find(p, p->blk[i].h) != (int32_t)i)
            return dx_errf(DX_EMISMATCH, "hashed block %u not found in the index", i);
    }
    for (uint32_t s = 0; s <= p->slot_mask; s++) n_slots += p->slot[s] != KV_NIL;
    if (n_slots != n_hashed)
        return dx_errf(DX_EMISMATCH, "index holds %u entries for %u hashed blocks", n_slots,
                       n_hashed);
    return 0;
}

int kv_pool_check(kv_pool *p)
{
    kv_lock(p);
    uint32_t n_free = 0, n_cached = 0;
    for (uint32_t i = 0; i < p->L.n_blocks; i++) {
        if (p->blk[i].ref) continue;
        if (p->blk[i].hashed)
            n_cached++;
        else
            n_free++;
    }
    int rc = 0;
    if (n_free != p->n_free || n_cached != p->n_cached)
        rc = dx_errf(DX_EMISMATCH, "counts: free %u/%u cached %u/%u", n_free, p->n_free, n_cached,
                     p->n_cached);
    if (rc == 0) rc = kv_check_list(p, p->free_top, p->n_free, 0);
    if (rc == 0) rc = kv_check_list(p, p->lru_head, p->n_cached, 1);
    if (rc == 0) rc = kv_check_index(p);
    kv_unlock(p);
    return rc < 0 ? dx_err_wrap(rc, "kv_pool_check") : 0;
}
