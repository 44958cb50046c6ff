/* xfer_lease: the lease and pin registry.  Leases and pins live in two small
 * arrays searched linearly: a node holds at most a few thousand leases and a
 * PIN is a network round trip anyway.  Token comparison is constant-time so
 * that response timing does not leak how many token bytes were right. */
#include "xfer/xfer_lease.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"

typedef struct {
    xfer_token tok;
    int32_t *ids;    /* [n] as given */
    int32_t *sorted; /* [n] for membership tests */
    uint32_t n;
    int policy;
    double ttl_s;
    uint64_t expires_ns;
    uint32_t n_pins;
} lease;

typedef struct {
    uint64_t id;
    lease *owner; /* NULL once the lease is gone */
    int32_t *ids; /* [n] referenced */
    uint32_t n;
    uint64_t expires_ns;
} pin;

struct xfer_leases {
    pthread_mutex_t mu;
    kv_pool *pool;
    double pin_ttl_s;
    lease **leases;
    size_t n_leases, cap_leases;
    pin *pins;
    size_t n_pins, cap_pins;
    uint64_t next_pin;
    xfer_leases_stats st;
};

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

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
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

int xfer_leases_create(kv_pool *pool, double pin_ttl_s, xfer_leases **out)
{
    if (!pool) return dx_errf(DX_EINVAL, "xfer_leases_create: no pool");
    xfer_leases *L = dx_calloc(1, sizeof *L);
    if (!L) return DX_ENOMEM;
    pthread_mutex_init(&L->mu, NULL);
    L->pool = pool;
    L->pin_ttl_s = pin_ttl_s > 0 ? pin_ttl_s : 30;
    L->next_pin = 1;
    *out = L;
    return 0;
}

static void unref_all(kv_pool *pool, const int32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) kv_pool_unref(pool, ids[i]);
}

static void lease_free(xfer_leases *L, size_t idx)
{
    lease *l = L->leases[idx];
    for (size_t i = 0; i < L->n_pins; i++)
        if (L->pins[i].owner == l) L->pins[i].owner = NULL;
    unref_all(L->pool, l->ids, l->n);
    dx_free(l->ids);
    dx_free(l->sorted);
    dx_free(l);
    L->leases[idx] = L->leases[--L->n_leases];
}

static void pin_free(xfer_leases *L, size_t idx)
{
    pin *p = &L->pins[idx];
    if (p->owner) p->owner->n_pins--;
    unref_all(L->pool, p->ids, p->n);
    dx_free(p->ids);
    L->pins[idx] = L->pins[--L->n_pins];
}

void xfer_leases_destroy(xfer_leases *L)
{
    if (!L) return;
    while (L->n_pins) pin_free(L, L->n_pins - 1);
    while (L->n_leases) lease_free(L, L->n_leases - 1);
    dx_free(L->leases);
    dx_free(L->pins);
    pthread_mutex_destroy(&L->mu);
    dx_free(L);
}

static int grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 16;
    void *p = dx_realloc(*arr, nc * elem);
    if (!p) return DX_ENOMEM;
    *arr = p;
    *cap = nc;
    return 0;
}

static lease *lease_new(const int32_t *ids, size_t n, double ttl_s, int policy)
{
    lease *l = dx_calloc(1, sizeof *l);
    if (!l) return NULL;
    l->ids = dx_memdup(ids, n * sizeof *ids);
    l->sorted = dx_memdup(ids, n * sizeof *ids);
    if (!l->ids || !l->sorted) {
        dx_free(l->ids);
        dx_free(l->sorted);
        dx_free(l);
        return NULL;
    }
    qsort(l->sorted, n, sizeof *ids, cmp_i32);
    l->n = (uint32_t)n;
    l->policy = policy;
    l->ttl_s = ttl_s;
    l->expires_ns = dx_now_ns() + ttl_ns(ttl_s);
    return l;
}

int xfer_lease_create(xfer_leases *L, const int32_t *ids, size_t n, double ttl_s, int policy,
                      xfer_token *tok)
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
    int rc = xfer_token_random(tok);
    if (rc) return rc;
    lease *l = lease_new(ids, n, ttl_s, policy);
    if (!l) return DX_ENOMEM;
    l->tok = *tok;
    pthread_mutex_lock(&L->mu);
    rc = grow((void **)&L->leases, &L->cap_leases, L->n_leases, sizeof *L->leases);
    if (!rc) {
        for (size_t i = 0; i < n; i++) kv_pool_ref(L->pool, ids[i]);
        L->leases[L->n_leases++] = l;
        L->st.created++;
    }
    pthread_mutex_unlock(&L->mu);
    if (rc) {
        dx_free(l->ids);
        dx_free(l->sorted);
        dx_free(l);
    }
    return rc;
}

/* Index of the live lease with this token, or -1.  Called with mu held. */
static long find_lease(xfer_leases *L, const xfer_token *tok, uint64_t now)
{
    long found = -1;
    for (size_t i = 0; i < L->n_leases; i++)
        if (tok_eq(&L->leases[i]->tok, tok)) found = (long)i;
    if (found >= 0 && L->leases[found]->expires_ns <= now) return -1;
    return found;
}

int xfer_lease_renew(xfer_leases *L, const xfer_token *tok, double ttl_s)
{
    if (!(ttl_s > 0)) return dx_errf(DX_EINVAL, "lease renew: ttl %g s must be positive", ttl_s);
    uint64_t now = dx_now_ns();
    pthread_mutex_lock(&L->mu);
    long i = find_lease(L, tok, now);
    if (i >= 0) {
        L->leases[i]->expires_ns = now + ttl_ns(ttl_s);
        L->leases[i]->ttl_s = ttl_s;
    }
    pthread_mutex_unlock(&L->mu);
    return i >= 0 ? 0 : dx_errf(DX_EGONE, "lease renew: unknown or expired lease");
}

int xfer_lease_revoke(xfer_leases *L, const xfer_token *tok)
{
    pthread_mutex_lock(&L->mu);
    long i = find_lease(L, tok, 0);
    if (i >= 0) {
        lease_free(L, (size_t)i);
        L->st.revoked++;
    }
    pthread_mutex_unlock(&L->mu);
    return i >= 0 ? 0 : dx_errf(DX_EGONE, "lease revoke: unknown lease");
}

int xfer_lease_lookup(xfer_leases *L, const xfer_token *tok, xfer_lease_info *out)
{
    pthread_mutex_lock(&L->mu);
    long i = find_lease(L, tok, dx_now_ns());
    if (i >= 0) {
        lease *l = L->leases[i];
        *out = (xfer_lease_info){l->n, l->policy, l->ttl_s, l->expires_ns, l->n_pins};
    }
    pthread_mutex_unlock(&L->mu);
    return i >= 0 ? 0 : dx_errf(DX_EGONE, "lease lookup: unknown or expired lease");
}

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
                     uint64_t now, long *li)
{
    *li = find_lease(L, tok, now);
    if (*li < 0) return dx_errf(DX_EGONE, "PIN: unknown or expired lease");
    lease *l = L->leases[*li];
    for (size_t i = 0; i < n; i++)
        if (!bsearch(&ids[i], l->sorted, l->n, sizeof *ids, cmp_i32))
            return dx_errf(DX_EGONE, "PIN: block %d (index %zu) is not held by this lease", ids[i],
                           i);
    return 0;
}

int xfer_pin(xfer_leases *L, const xfer_token *tok, const int32_t *ids, const kv_hash *chain,
             size_t n, uint64_t *pin_id, uint32_t *n_matched)
{
    if (n == 0 || n > UINT32_MAX) return dx_errf(DX_EINVAL, "PIN: %zu blocks", n);
    int32_t *copy = dx_malloc(n * sizeof *ids);
    if (!copy) return DX_ENOMEM;
    uint64_t now = dx_now_ns();
    long li;
    pthread_mutex_lock(&L->mu);
    int rc = pin_check(L, tok, ids, n, now, &li), unhashed = 0;
    uint32_t k = 0;
    if (!rc) {
        k = count_matching(L, ids, chain, n, &unhashed);
        if (unhashed)
            rc = dx_errf(DX_EGONE, "PIN: block %d no longer holds KV", ids[0]);
        else if (k == 0)
            rc = dx_errf(DX_EMISMATCH, "PIN: block %d's hash differs from the reader's", ids[0]);
    }
    if (!rc) rc = grow((void **)&L->pins, &L->cap_pins, L->n_pins, sizeof *L->pins);
    if (!rc) {
        lease *l = L->leases[li];
        memcpy(copy, ids, k * sizeof *ids);
        for (uint32_t i = 0; i < k; i++) kv_pool_ref(L->pool, ids[i]);
        pin *p = &L->pins[L->n_pins++];
        *p = (pin){L->next_pin++, l, copy, k, now + ttl_ns(L->pin_ttl_s)};
        l->n_pins++;
        if (l->policy == XFER_LEASE_RENEW_ON_READ) l->expires_ns = now + ttl_ns(l->ttl_s);
        *pin_id = p->id;
        *n_matched = k;
        copy = NULL;
        L->st.pins_made++;
    } else if (rc == DX_EGONE) {
        L->st.gone++;
    } else if (rc == DX_EMISMATCH) {
        L->st.mismatches++;
    }
    pthread_mutex_unlock(&L->mu);
    dx_free(copy);
    return rc;
}

int xfer_unpin(xfer_leases *L, uint64_t pin_id, int consumed)
{
    int rc = DX_ENOENT;
    pthread_mutex_lock(&L->mu);
    for (size_t i = 0; i < L->n_pins; i++) {
        if (L->pins[i].id != pin_id) continue;
        lease *owner = L->pins[i].owner;
        pin_free(L, i);
        if (consumed && owner && owner->policy == XFER_LEASE_SINGLE_USE) {
            for (size_t j = 0; j < L->n_leases; j++)
                if (L->leases[j] == owner) lease_free(L, j);
        }
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&L->mu);
    return rc ? dx_errf(rc, "RELEASE: unknown pin %llu", (unsigned long long)pin_id) : 0;
}

uint32_t xfer_leases_sweep(xfer_leases *L, uint64_t now_ns)
{
    uint32_t gone = 0;
    pthread_mutex_lock(&L->mu);
    for (size_t i = L->n_pins; i-- > 0;)
        if (L->pins[i].expires_ns <= now_ns) {
            pin_free(L, i);
            L->st.pins_timed_out++;
            gone++;
        }
    for (size_t i = L->n_leases; i-- > 0;)
        if (L->leases[i]->expires_ns <= now_ns) {
            lease_free(L, i);
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
    out->pins = (uint32_t)L->n_pins;
    pthread_mutex_unlock(&L->mu);
}
