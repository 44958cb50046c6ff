/* xfer_lease: the lease and pin registry.  A decode node retains one lease
 * per conversation for minutes, so thousands of live leases are normal and
 * every PIN, RELEASE, renew, revoke and lookup is O(1): leases are found by
 * token and pins by id through hash indexes (base/dx_hidx) keyed with a
 * per-registry random seed, because a PIN carries a token the peer chose.
 * Each lease lists its live pins so that dropping it disowns only those.
 * Plain arrays of both serve the periodic sweep, the one O(all) walk.
 * Leases also sit on a use-ordered list (creating, renewing or pinning one
 * moves it to the recent end), so memory pressure revokes the least recently
 * used first in O(1), and a tagged lease is found by its tag through a third
 * index, so a newer lease can supersede it in O(1) per tag.
 * Token comparison is constant-time so that response timing does not leak
 * how many token bytes were right. */
#include "xfer/xfer_lease.h"
#include "xfer/xfer_lease_priv.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_hidx.h"
#include "base/dx_list.h"

typedef struct pin pin;
typedef struct lease lease;

struct lease {
    xfer_token tok;
    uint64_t h;      /* tok's index hash */
    size_t at;       /* position in L->leases */
    int32_t *ids;    /* [n] as given */
    int32_t *sorted; /* [n] for membership tests */
    uint32_t n;
    int policy;
    double ttl_s;
    uint64_t expires_ns;
    uint32_t n_pins;
    dx_list pins; /* the live pins made through it, so it can disown them in O(own pins) */
    dx_list lru;  /* L->lru */
    uint64_t tag; /* 0 = untagged */
};

struct pin {
    uint64_t id;
    uint64_t h;   /* id's index hash */
    size_t at;    /* position in L->pins */
    lease *owner; /* NULL once the lease is gone */
    dx_list link; /* owner->pins, newest first; not linked once ownerless */
    uint64_t expires_ns;
    uint32_t n;
    int32_t ids[]; /* [n] referenced */
};

struct xfer_leases {
    pthread_mutex_t mu;
    kv_pool *pool;
    double pin_ttl_s;
    uint64_t seed; /* keys the index hashes: a peer cannot aim tokens at one slot */
    int weak_hash; /* tests only: hash = low 64 key bits & weak_mask */
    uint64_t weak_mask;
    lease **leases; /* [n_leases] for the periodic sweep; lookups use by_tok */
    size_t n_leases, cap_leases;
    pin **pins; /* [n_pins] likewise; lookups use by_pin */
    size_t n_pins, cap_pins;
    dx_hidx *by_tok;       /* tok hash -> lease * */
    dx_hidx *by_pin;       /* pin id hash -> pin * */
    dx_hidx *by_tag;       /* tag hash -> lease * (tagged leases only) */
    dx_list lru;           /* use order; head = least recently used */
    uint64_t lease_blocks; /* sum of the live leases' block counts */
    uint32_t n_retained;   /* live RENEW_ON_READ leases */
    uint64_t retained_blocks;
    uint64_t next_pin;
    uint64_t (*now)(void); /* tests: an injected clock; NULL = dx_now_ns */
    xfer_leases_stats st;
};

static uint64_t now_ns(const xfer_leases *L)
{
    return L->now ? L->now() : dx_now_ns();
}

static uint64_t ttl_ns(double s)
{
    return s <= 0 ? 0 : (uint64_t)(s * 1e9);
}

static int tok_eq(const xfer_token *a, const xfer_token *b)
{
    uint8_t d = 0;
    for (int i = 0; i < 16; i++) d |= (uint8_t)(a->b[i] ^ b->b[i]);
    return d == 0;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int xfer_token_random(xfer_token *tok)
{
    size_t got = 0;
    while (got < sizeof tok->b) {
        ssize_t r = getrandom(tok->b + got, sizeof tok->b - got, 0);
        if (r < 0) return dx_errf(DX_EIO, "getrandom failed while making a lease token");
        got += (size_t)r;
    }
    return 0;
}

void xfer_token_hex(const xfer_token *tok, char out[33])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hx[tok->b[i] >> 4];
        out[2 * i + 1] = hx[tok->b[i] & 15];
    }
    out[32] = 0;
}

/* A hex digit's value; DX_NONE for another character. */
static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return DX_NONE;
}

int xfer_token_parse(const char *hex, xfer_token *tok)
{
    if (!hex || strlen(hex) != 32) return dx_errf(DX_EINVAL, "lease token must be 32 hex digits");
    for (int i = 0; i < 16; i++) {
        int h = hexval(hex[2 * i]), l = hexval(hex[2 * i + 1]);
        if (h < 0 || l < 0)
            return dx_errf(DX_EINVAL, "lease token: non-hex character at %d",
                           h < 0 ? 2 * i : 2 * i + 1);
        tok->b[i] = (uint8_t)(h << 4 | l);
    }
    return 0;
}

/* ---- index keys (caller holds mu, except in create) ------------------- */

static uint64_t low64(const void *p)
{
    uint64_t x;
    memcpy(&x, p, sizeof x);
    return x;
}

static uint64_t tok_hash(const xfer_leases *L, const xfer_token *t)
{
    if (L->weak_hash) return low64(t->b) & L->weak_mask;
    return XXH3_64bits_withSeed(t->b, sizeof t->b, L->seed);
}

static uint64_t pin_hash(const xfer_leases *L, uint64_t id)
{
    /* Pin ids are sequential: hashed, they spread instead of forming one run. */
    if (L->weak_hash) return id & L->weak_mask;
    return XXH3_64bits_withSeed(&id, sizeof id, L->seed);
}

/* The lease with this token (live or not), or NULL.  Only candidates with the
 * same seeded hash reach the constant-time compare, and which tokens share a
 * hash is unknowable without the seed, so timing still says nothing about
 * how many token bytes were right. */
static lease *find_any_lease(xfer_leases *L, const xfer_token *tok)
{
    dx_hidx_iter it;
    uint64_t v;
    for (dx_hidx_find(L->by_tok, tok_hash(L, tok), &it); dx_hidx_next(L->by_tok, &it, &v);) {
        lease *l = (lease *)(uintptr_t)v;
        if (tok_eq(&l->tok, tok)) return l;
    }
    return NULL;
}

/* The live lease with this token, or NULL (an expired one waits for the
 * sweep).  now = 0 accepts expired leases. */
static lease *find_lease(xfer_leases *L, const xfer_token *tok, uint64_t now)
{
    lease *l = find_any_lease(L, tok);
    return l && l->expires_ns > now ? l : NULL;
}

static uint64_t tag_hash(const xfer_leases *L, uint64_t tag)
{
    return XXH3_64bits_withSeed(&tag, sizeof tag, L->seed);
}

/* ---- use order ----------------------------------------------------------- */

/* Creating, renewing or pinning l: it becomes the most recently used. */
static void lru_touch(xfer_leases *L, lease *l)
{
    dx_list_move_back(&L->lru, &l->lru);
}

static pin *find_pin(xfer_leases *L, uint64_t id)
{
    dx_hidx_iter it;
    uint64_t v;
    for (dx_hidx_find(L->by_pin, pin_hash(L, id), &it); dx_hidx_next(L->by_pin, &it, &v);) {
        pin *p = (pin *)(uintptr_t)v;
        if (p->id == id) return p;
    }
    return NULL;
}

/* ---- create / destroy -------------------------------------------------- */

int xfer_leases_create(kv_pool *pool, double pin_ttl_s, xfer_leases **out)
{
    if (!pool) return dx_errf(DX_EINVAL, "xfer_leases_create: no pool");
    xfer_token s;
    int rc = xfer_token_random(&s);
    if (rc) return rc;
    xfer_leases *L = dx_calloc(1, sizeof *L);
    if (!L) return dx_errf(DX_ENOMEM, "leases: registry");
    rc = dx_hidx_create(0, &L->by_tok);
    if (!rc) rc = dx_hidx_create(0, &L->by_pin);
    if (!rc) rc = dx_hidx_create(0, &L->by_tag);
    if (rc) {
        dx_hidx_destroy(L->by_tok);
        dx_hidx_destroy(L->by_pin);
        dx_free(L);
        return rc;
    }
    pthread_mutex_init(&L->mu, NULL);
    dx_list_init(&L->lru);
    L->pool = pool;
    L->pin_ttl_s = pin_ttl_s > 0 ? pin_ttl_s : XFER_LEASE_DEFAULT_PIN_TTL_S;
    L->seed = low64(s.b);
    L->next_pin = 1;
    *out = L;
    return 0;
}

static void unref_all(kv_pool *pool, const int32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) kv_pool_unref(pool, ids[i]);
}

static void lease_dealloc(lease *l)
{
    dx_free(l->ids);
    dx_free(l->sorted);
    dx_free(l);
}

/* Takes the lease out of the registry and drops its references; its pins
 * keep theirs and outlive it ownerless. */
static void lease_free(xfer_leases *L, lease *l)
{
    DX_ASSERT(dx_hidx_remove(L->by_tok, l->h, (uintptr_t)l) == 0);
    if (l->tag) DX_ASSERT(dx_hidx_remove(L->by_tag, tag_hash(L, l->tag), (uintptr_t)l) == 0);
    dx_list_remove(&l->lru);
    L->lease_blocks -= l->n;
    if (l->policy == XFER_LEASE_RENEW_ON_READ) L->n_retained--, L->retained_blocks -= l->n;
    lease *last = L->leases[--L->n_leases];
    L->leases[l->at] = last;
    last->at = l->at;
    DX_LIST_FOR_EACH_SAFE(it, tmp, &l->pins)
    {
        pin *p = DX_LIST_ENTRY(it, pin, link);
        p->owner = NULL;
        dx_list_init(&p->link); /* the head goes with l */
    }
    unref_all(L->pool, l->ids, l->n);
    lease_dealloc(l);
}

static void pin_free(xfer_leases *L, pin *p)
{
    DX_ASSERT(dx_hidx_remove(L->by_pin, p->h, (uintptr_t)p) == 0);
    pin *last = L->pins[--L->n_pins];
    L->pins[p->at] = last;
    last->at = p->at;
    if (p->owner) {
        dx_list_remove(&p->link);
        p->owner->n_pins--;
    }
    unref_all(L->pool, p->ids, p->n);
    dx_free(p);
}

void xfer_leases_destroy(xfer_leases *L)
{
    if (!L) return;
    while (L->n_pins) pin_free(L, L->pins[L->n_pins - 1]);
    while (L->n_leases) lease_free(L, L->leases[L->n_leases - 1]);
    dx_free(L->leases);
    dx_free(L->pins);
    dx_hidx_destroy(L->by_tok);
    dx_hidx_destroy(L->by_pin);
    dx_hidx_destroy(L->by_tag);
    pthread_mutex_destroy(&L->mu);
    dx_free(L);
}

static int grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 16;
    void *p = dx_realloc(*arr, nc * elem);
    if (!p) return dx_errf(DX_ENOMEM, "leases: table of %zu", nc);
    *arr = p;
    *cap = nc;
    return 0;
}

/* ---- leases -------------------------------------------------------------- */

static lease *lease_new(const int32_t *ids, size_t n, double ttl_s, int policy, uint64_t now)
{
    lease *l = dx_calloc(1, sizeof *l);
    if (!l) return NULL;
    l->ids = dx_memdup(ids, n * sizeof *ids);
    l->sorted = dx_memdup(ids, n * sizeof *ids);
    if (!l->ids || !l->sorted) {
        lease_dealloc(l);
        return NULL;
    }
    qsort(l->sorted, n, sizeof *ids, cmp_i32);
    l->n = (uint32_t)n;
    l->policy = policy;
    l->ttl_s = ttl_s;
    l->expires_ns = now + ttl_ns(ttl_s);
    dx_list_init(&l->pins);
    return l;
}

static int lease_args_check(xfer_leases *L, const int32_t *ids, size_t n, double ttl_s, int policy)
{
    if (n == 0 || n > UINT32_MAX) return dx_errf(DX_EINVAL, "lease: %zu blocks", n);
    if (!(ttl_s > 0)) return dx_errf(DX_EINVAL, "lease: ttl %g s must be positive", ttl_s);
    if (policy < XFER_LEASE_MULTI || policy > XFER_LEASE_RENEW_ON_READ)
        return dx_errf(DX_EINVAL, "lease: unknown policy %d", policy);
    for (size_t i = 0; i < n; i++) {
        kv_hash h;
        if (!kv_pool_valid_id(L->pool, ids[i]))
            return dx_errf(DX_EINVAL, "lease: block id %d (index %zu) is not in the pool", ids[i],
                           i);
        /* A free block holds no KV (and may not be referenced). */
        if (kv_pool_refcount(L->pool, ids[i]) == 0 && !kv_pool_block_hash(L->pool, ids[i], &h))
            return dx_errf(DX_EINVAL, "lease: block %d (index %zu) is free", ids[i], i);
    }
    return 0;
}

/* Registers l under l->tok and takes its references.  Called with mu held. */
static int lease_add(xfer_leases *L, lease *l)
{
    if (find_any_lease(L, &l->tok)) return dx_errf(DX_EEXIST, "lease: token already in use");
    int rc = grow((void **)&L->leases, &L->cap_leases, L->n_leases, sizeof *L->leases);
    l->h = tok_hash(L, &l->tok);
    if (!rc) rc = dx_hidx_insert(L->by_tok, l->h, (uintptr_t)l);
    if (rc) return rc;
    if (l->tag && (rc = dx_hidx_insert(L->by_tag, tag_hash(L, l->tag), (uintptr_t)l))) {
        DX_ASSERT(dx_hidx_remove(L->by_tok, l->h, (uintptr_t)l) == 0);
        return rc;
    }
    for (uint32_t i = 0; i < l->n; i++) kv_pool_ref(L->pool, l->ids[i]);
    l->at = L->n_leases;
    L->leases[L->n_leases++] = l;
    dx_list_push_back(&L->lru, &l->lru);
    L->lease_blocks += l->n;
    if (l->policy == XFER_LEASE_RENEW_ON_READ) L->n_retained++, L->retained_blocks += l->n;
    L->st.created++;
    return 0;
}

/* tok == NULL: a fresh random token, returned in *out. */
static int lease_create(xfer_leases *L, const xfer_token *tok, const int32_t *ids, size_t n,
                        double ttl_s, int policy, uint64_t tag, xfer_token *out)
{
    int rc = lease_args_check(L, ids, n, ttl_s, policy);
    if (rc) return rc;
    lease *l = lease_new(ids, n, ttl_s, policy, now_ns(L));
    if (!l) return dx_errf(DX_ENOMEM, "lease of %zu blocks", n);
    l->tag = tag;
    /* A random token repeats with odds of 2^-128; retrying costs nothing. */
    for (int tries = 0; tries < 4; tries++) {
        if (tok)
            l->tok = *tok;
        else if ((rc = xfer_token_random(&l->tok)))
            break;
        pthread_mutex_lock(&L->mu);
        rc = lease_add(L, l);
        pthread_mutex_unlock(&L->mu);
        if (rc != DX_EEXIST || tok) break;
    }
    if (rc) {
        lease_dealloc(l);
        return rc == DX_EEXIST ? dx_errf(rc, "lease: token already in use") : rc;
    }
    if (out) *out = l->tok;
    return 0;
}

int xfer_lease_create(xfer_leases *L, const int32_t *ids, size_t n, double ttl_s, int policy,
                      xfer_token *tok)
{
    return lease_create(L, NULL, ids, n, ttl_s, policy, 0, tok);
}

int xfer_lease_create_tagged(xfer_leases *L, const int32_t *ids, size_t n, double ttl_s, int policy,
                             uint64_t tag, xfer_token *tok)
{
    return lease_create(L, NULL, ids, n, ttl_s, policy, tag, tok);
}

int xfer_lease_create_as(xfer_leases *L, const xfer_token *tok, const int32_t *ids, size_t n,
                         double ttl_s, int policy)
{
    return lease_create(L, tok, ids, n, ttl_s, policy, 0, NULL);
}

void xfer_leases_set_clock(xfer_leases *L, uint64_t (*now)(void))
{
    pthread_mutex_lock(&L->mu);
    L->now = now;
    pthread_mutex_unlock(&L->mu);
}

void xfer_leases_weak_hash(xfer_leases *L, uint64_t mask)
{
    pthread_mutex_lock(&L->mu);
    DX_ASSERT(L->n_leases == 0 && L->n_pins == 0);
    L->weak_hash = 1;
    L->weak_mask = mask;
    pthread_mutex_unlock(&L->mu);
}

int xfer_lease_renew(xfer_leases *L, const xfer_token *tok, double ttl_s)
{
    if (!(ttl_s > 0)) return dx_errf(DX_EINVAL, "lease renew: ttl %g s must be positive", ttl_s);
    uint64_t now = now_ns(L);
    pthread_mutex_lock(&L->mu);
    lease *l = find_lease(L, tok, now);
    if (l) {
        l->expires_ns = now + ttl_ns(ttl_s);
        l->ttl_s = ttl_s;
        lru_touch(L, l);
    }
    pthread_mutex_unlock(&L->mu);
    return l ? 0 : dx_errf(DX_EGONE, "lease renew: unknown or expired lease");
}

int xfer_leases_revoke_lru(xfer_leases *L, uint32_t *n_blocks)
{
    pthread_mutex_lock(&L->mu);
    dx_list *n = dx_list_first(&L->lru);
    lease *l = n ? DX_LIST_ENTRY(n, lease, lru) : NULL;
    if (l) {
        if (n_blocks) *n_blocks = l->n;
        lease_free(L, l);
        L->st.revoked_lru++;
    }
    pthread_mutex_unlock(&L->mu);
    return l != NULL;
}

uint32_t xfer_leases_supersede(xfer_leases *L, const uint64_t *tags, size_t n)
{
    uint32_t gone = 0;
    pthread_mutex_lock(&L->mu);
    for (size_t i = 0; i < n; i++) {
        if (!tags[i]) continue;
        dx_hidx_iter it;
        uint64_t v;
        lease *hit;
        do { /* the walk restarts after each removal: the index changed */
            hit = NULL;
            for (dx_hidx_find(L->by_tag, tag_hash(L, tags[i]), &it);
                 !hit && dx_hidx_next(L->by_tag, &it, &v);)
                if (((lease *)(uintptr_t)v)->tag == tags[i]) hit = (lease *)(uintptr_t)v;
            if (hit) {
                lease_free(L, hit);
                L->st.superseded++;
                gone++;
            }
        } while (hit);
    }
    pthread_mutex_unlock(&L->mu);
    return gone;
}

int xfer_lease_revoke(xfer_leases *L, const xfer_token *tok)
{
    pthread_mutex_lock(&L->mu);
    lease *l = find_lease(L, tok, 0);
    if (l) {
        lease_free(L, l);
        L->st.revoked++;
    }
    pthread_mutex_unlock(&L->mu);
    return l ? 0 : dx_errf(DX_EGONE, "lease revoke: unknown lease");
}

int xfer_lease_lookup(xfer_leases *L, const xfer_token *tok, xfer_lease_info *out)
{
    pthread_mutex_lock(&L->mu);
    lease *l = find_lease(L, tok, now_ns(L));
    if (l) *out = (xfer_lease_info){l->n, l->policy, l->ttl_s, l->expires_ns, l->n_pins};
    pthread_mutex_unlock(&L->mu);
    return l ? 0 : dx_errf(DX_EGONE, "lease lookup: unknown or expired lease");
}

/* ---- pins ------------------------------------------------------------------ */

/* Leading blocks of ids[] whose pool hash equals the reader's chain; sets
 * *first_unhashed when block 0 holds no KV any more.  Called with mu held. */
static uint32_t count_matching(xfer_leases *L, const int32_t *ids, const kv_hash *chain, size_t n,
                               int *first_unhashed)
{
    uint32_t k = 0;
    *first_unhashed = 0;
    for (; k < n; k++) {
        kv_hash h;
        if (!kv_pool_block_hash(L->pool, ids[k], &h)) {
            if (k == 0) *first_unhashed = 1;
            break;
        }
        if (!kv_hash_eq(h, chain[k])) break;
    }
    return k;
}

static int pin_check(xfer_leases *L, const xfer_token *tok, const int32_t *ids, size_t n,
                     uint64_t now, lease **out)
{
    lease *l = *out = find_lease(L, tok, now);
    if (!l) return dx_errf(DX_EGONE, "PIN: unknown or expired lease");
    for (size_t i = 0; i < n; i++)
        if (!bsearch(&ids[i], l->sorted, l->n, sizeof *ids, cmp_i32))
            return dx_errf(DX_EGONE, "PIN: block %d (index %zu) is not held by this lease", ids[i],
                           i);
    return 0;
}

/* Registers p (k blocks matched) under lease l and takes its references.
 * Called with mu held. */
static int pin_add(xfer_leases *L, lease *l, pin *p, uint32_t k, uint64_t now)
{
    int rc = grow((void **)&L->pins, &L->cap_pins, L->n_pins, sizeof *L->pins);
    p->id = L->next_pin;
    p->h = pin_hash(L, p->id);
    if (!rc) rc = dx_hidx_insert(L->by_pin, p->h, (uintptr_t)p);
    if (rc) return rc;
    L->next_pin++;
    p->n = k;
    p->owner = l;
    lru_touch(L, l);
    dx_list_push_front(&l->pins, &p->link);
    p->expires_ns = now + ttl_ns(L->pin_ttl_s);
    p->at = L->n_pins;
    L->pins[L->n_pins++] = p;
    for (uint32_t i = 0; i < k; i++) kv_pool_ref(L->pool, p->ids[i]);
    l->n_pins++;
    if (l->policy == XFER_LEASE_RENEW_ON_READ) l->expires_ns = now + ttl_ns(l->ttl_s);
    L->st.pins_made++;
    return 0;
}

int xfer_pin(xfer_leases *L, const xfer_token *tok, const int32_t *ids, const kv_hash *chain,
             size_t n, uint64_t *pin_id, uint32_t *n_matched)
{
    if (n == 0 || n > UINT32_MAX) return dx_errf(DX_EINVAL, "PIN: %zu blocks", n);
    pin *p = dx_malloc(sizeof *p + n * sizeof *ids);
    if (!p) return dx_errf(DX_ENOMEM, "PIN: %zu blocks", n);
    memcpy(p->ids, ids, n * sizeof *ids);
    uint64_t now = now_ns(L);
    lease *l;
    pthread_mutex_lock(&L->mu);
    int rc = pin_check(L, tok, ids, n, now, &l), unhashed = 0;
    uint32_t k = 0;
    if (!rc) {
        k = count_matching(L, ids, chain, n, &unhashed);
        if (unhashed)
            rc = dx_errf(DX_EGONE, "PIN: block %d no longer holds KV", ids[0]);
        else if (k == 0)
            rc = dx_errf(DX_EMISMATCH, "PIN: block %d's hash differs from the reader's", ids[0]);
    }
    if (!rc) rc = pin_add(L, l, p, k, now);
    if (!rc) {
        *pin_id = p->id;
        *n_matched = k;
        p = NULL;
    } else if (rc == DX_EGONE) {
        L->st.gone++;
    } else if (rc == DX_EMISMATCH) {
        L->st.mismatches++;
    }
    pthread_mutex_unlock(&L->mu);
    dx_free(p);
    return rc;
}

int xfer_unpin(xfer_leases *L, uint64_t pin_id, int consumed)
{
    pthread_mutex_lock(&L->mu);
    pin *p = find_pin(L, pin_id);
    if (p) {
        lease *owner = p->owner;
        pin_free(L, p);
        if (consumed && owner && owner->policy == XFER_LEASE_SINGLE_USE) lease_free(L, owner);
    }
    pthread_mutex_unlock(&L->mu);
    return p ? 0 : dx_errf(DX_ENOENT, "RELEASE: unknown pin %llu", (unsigned long long)pin_id);
}

int xfer_pin_live(xfer_leases *L, uint64_t pin_id)
{
    pthread_mutex_lock(&L->mu);
    int live = find_pin(L, pin_id) != NULL;
    pthread_mutex_unlock(&L->mu);
    return live;
}

int xfer_pin_renew(xfer_leases *L, uint64_t pin_id, double *ttl_s)
{
    uint64_t now = now_ns(L);
    pthread_mutex_lock(&L->mu);
    pin *p = find_pin(L, pin_id);
    /* Past its deadline a pin is gone even before the sweep frees it: the
     * reader must not be told its blocks are held for another TTL. */
    int live = p && p->expires_ns > now;
    if (live) p->expires_ns = now + ttl_ns(L->pin_ttl_s);
    pthread_mutex_unlock(&L->mu);
    *ttl_s = L->pin_ttl_s;
    return live ? 0
                : dx_errf(DX_EGONE, "RENEW: pin %llu was released or timed out",
                          (unsigned long long)pin_id);
}

double xfer_leases_pin_ttl(const xfer_leases *L)
{
    return L->pin_ttl_s;
}

/* ---- sweep, stats, check ------------------------------------------------ */

uint32_t xfer_leases_sweep(xfer_leases *L, uint64_t now_ns)
{
    uint32_t gone = 0;
    pthread_mutex_lock(&L->mu);
    /* Backwards: freeing slot i moves the last (already visited) entry into it. */
    for (size_t i = L->n_pins; i-- > 0;)
        if (L->pins[i]->expires_ns <= now_ns) {
            pin_free(L, L->pins[i]);
            L->st.pins_timed_out++;
            gone++;
        }
    for (size_t i = L->n_leases; i-- > 0;)
        if (L->leases[i]->expires_ns <= now_ns) {
            lease_free(L, L->leases[i]);
            L->st.expired++;
            gone++;
        }
    pthread_mutex_unlock(&L->mu);
    return gone;
}

void xfer_leases_get_stats(xfer_leases *L, xfer_leases_stats *out)
{
    pthread_mutex_lock(&L->mu);
    *out = L->st;
    out->leases = (uint32_t)L->n_leases;
    out->blocks = L->lease_blocks;
    out->retained = L->n_retained;
    out->retained_blocks = L->retained_blocks;
    out->pins = (uint32_t)L->n_pins;
    pthread_mutex_unlock(&L->mu);
}

static int check_lease(xfer_leases *L, size_t i, size_t *n_owned)
{
    lease *l = L->leases[i];
    if (l->at != i) return dx_errf(DX_EMISMATCH, "lease %zu records position %zu", i, l->at);
    if (find_any_lease(L, &l->tok) != l)
        return dx_errf(DX_EMISMATCH, "lease %zu not found by its token", i);
    uint32_t k = 0;
    DX_LIST_FOR_EACH(it, &l->pins)
    {
        pin *p = DX_LIST_ENTRY(it, pin, link);
        if (p->owner != l || it->next->prev != it)
            return dx_errf(DX_EMISMATCH, "lease %zu: pin list broken at pin %llu", i,
                           (unsigned long long)p->id);
        k++;
    }
    if (k != l->n_pins)
        return dx_errf(DX_EMISMATCH, "lease %zu lists %u pins, counts %u", i, k, l->n_pins);
    *n_owned += k;
    return 0;
}

int xfer_leases_check(xfer_leases *L)
{
    pthread_mutex_lock(&L->mu);
    int rc = dx_hidx_check(L->by_tok);
    if (!rc) rc = dx_hidx_check(L->by_pin);
    if (!rc) rc = dx_hidx_check(L->by_tag);
    size_t n_lru = 0, n_tagged = 0;
    for (dx_list *it = L->lru.next; !rc && it != &L->lru; it = it->next, n_lru++)
        if (it->next->prev != it)
            rc = dx_errf(DX_EMISMATCH, "lease use list broken after %zu entries", n_lru);
    for (size_t i = 0; !rc && i < L->n_leases; i++) n_tagged += L->leases[i]->tag != 0;
    if (!rc && (n_lru != L->n_leases || n_tagged != dx_hidx_count(L->by_tag)))
        rc = dx_errf(DX_EMISMATCH, "%zu leases, %zu on the use list, %zu tagged, %zu indexed",
                     L->n_leases, n_lru, n_tagged, dx_hidx_count(L->by_tag));
    if (!rc && (dx_hidx_count(L->by_tok) != L->n_leases || dx_hidx_count(L->by_pin) != L->n_pins))
        rc = dx_errf(DX_EMISMATCH, "index counts %zu/%zu, arrays %zu/%zu", dx_hidx_count(L->by_tok),
                     dx_hidx_count(L->by_pin), L->n_leases, L->n_pins);
    size_t owned = 0, with_owner = 0;
    for (size_t i = 0; !rc && i < L->n_leases; i++) rc = check_lease(L, i, &owned);
    for (size_t i = 0; !rc && i < L->n_pins; i++) {
        pin *p = L->pins[i];
        if (p->at != i || find_pin(L, p->id) != p)
            rc = dx_errf(DX_EMISMATCH, "pin %zu (id %llu) misplaced or not found by id", i,
                         (unsigned long long)p->id);
        with_owner += p->owner != NULL;
    }
    if (!rc && owned != with_owner)
        rc = dx_errf(DX_EMISMATCH, "%zu pins on lease lists, %zu have owners", owned, with_owner);
    pthread_mutex_unlock(&L->mu);
    return rc;
}
