/* hist: token-faithful history (see .h).
 *
 * The memory is a hash index (base/dx_hidx, seeded: the text comes from
 * clients) over entries on one use-ordered list.  Every entry lives for the
 * same TTL from its last use, so the list's head is also the next to expire:
 * pruning is a walk from the head, and the bounds evict from there too.
 * One mutex guards it: lookups come from the threads that prepare prompts. */
#include "node/hist.h"

#include <pthread.h>
#include <string.h>
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_hidx.h"
#include "base/dx_list.h"
#include "base/dx_utf8.h"
#include "xfer/xfer_lease.h"

typedef struct entry entry;
struct entry {
    dx_list link;      /* m->use */
    uint64_t h;        /* index hash */
    XXH128_hash_t ctx; /* hash of the preceding tokens */
    uint64_t expires_ns;
    char *text;
    size_t len;
    int32_t *ids;
    size_t n_ids;
};

struct hist_mem {
    pthread_mutex_t mu; /* guards everything below cfg and seed */
    hist_mem_config cfg;
    uint64_t seed;
    dx_hidx *idx;
    dx_list use; /* use order, head = least recent */
    hist_mem_stats st;
};

static size_t entry_bytes(const entry *e)
{
    return sizeof *e + e->len + e->n_ids * sizeof(int32_t);
}

/* The least recently used entry, the next to expire; NULL when empty. */
static entry *oldest(const hist_mem *m)
{
    dx_list *n = dx_list_first(&m->use);
    return n ? DX_LIST_ENTRY(n, entry, link) : NULL;
}

static void entry_drop(hist_mem *m, entry *e)
{
    DX_ASSERT(dx_hidx_remove(m->idx, e->h, (uintptr_t)e) == 0);
    dx_list_remove(&e->link);
    m->st.entries--;
    m->st.bytes -= entry_bytes(e);
    dx_free(e->text);
    dx_free(e->ids);
    dx_free(e);
}

int hist_mem_create(const hist_mem_config *cfg, hist_mem **out)
{
    *out = NULL;
    hist_mem *m = dx_calloc(1, sizeof *m);
    if (!m) return dx_errf(DX_ENOMEM, "out of memory");
    m->cfg = *cfg;
    dx_list_init(&m->use);
    if (!(m->cfg.ttl_s > 0)) m->cfg.ttl_s = HIST_DEFAULT_TTL_S;
    if (!m->cfg.max_entries) m->cfg.max_entries = 65536;
    if (!m->cfg.max_bytes) m->cfg.max_bytes = 256u << 20;
    xfer_token seed;
    int rc = xfer_token_random(&seed);
    memcpy(&m->seed, seed.b, sizeof m->seed);
    if (!rc) rc = dx_hidx_create(0, &m->idx);
    if (rc) {
        dx_free(m);
        return rc;
    }
    pthread_mutex_init(&m->mu, NULL);
    *out = m;
    return 0;
}

void hist_mem_destroy(hist_mem *m)
{
    if (!m) return;
    for (entry *e; (e = oldest(m));) entry_drop(m, e);
    dx_hidx_destroy(m->idx);
    pthread_mutex_destroy(&m->mu);
    dx_free(m);
}

/* The context's hash in a namespace: a tenant finds only replies generated
 * for its own requests (the same tokens in another namespace hash apart). */
static XXH128_hash_t ctx_hash(const int32_t *ctx, size_t n, uint64_t ns)
{
    return XXH3_128bits_withSeed(ctx, n * sizeof *ctx, ns);
}

static uint64_t key_hash(const hist_mem *m, XXH128_hash_t ctx, const char *text, size_t len)
{
    uint64_t k[3] = {ctx.low64, ctx.high64, XXH3_64bits(text, len)};
    return XXH3_64bits_withSeed(k, sizeof k, m->seed);
}

static entry *find(hist_mem *m, uint64_t h, XXH128_hash_t ctx, const char *text, size_t len)
{
    dx_hidx_iter it;
    uint64_t v;
    for (dx_hidx_find(m->idx, h, &it); dx_hidx_next(m->idx, &it, &v);) {
        entry *e = (entry *)(uintptr_t)v;
        if (XXH128_isEqual(e->ctx, ctx) && e->len == len && !memcmp(e->text, text, len)) return e;
    }
    return NULL;
}

static void prune(hist_mem *m, uint64_t now_ns, size_t room_bytes)
{
    for (entry *e; (e = oldest(m)) && e->expires_ns <= now_ns;) {
        entry_drop(m, e);
        m->st.expired++;
    }
    for (entry *e; (e = oldest(m)) && (m->st.entries >= m->cfg.max_entries ||
                                       m->st.bytes + room_bytes > m->cfg.max_bytes);) {
        entry_drop(m, e);
        m->st.evicted++;
    }
}

static uint64_t ttl_ns(const hist_mem *m)
{
    return (uint64_t)(m->cfg.ttl_s * 1e9);
}

static int put_locked(hist_mem *m, uint64_t ns, const int32_t *ctx, size_t n_ctx, const char *text,
                      size_t len, const int32_t *ids, size_t n_ids, uint64_t now_ns)
{
    XXH128_hash_t c = ctx_hash(ctx, n_ctx, ns);
    uint64_t h = key_hash(m, c, text, len);
    entry *old = find(m, h, c, text, len);
    if (old) entry_drop(m, old);
    entry *e = dx_calloc(1, sizeof *e);
    if (!e) return dx_errf(DX_ENOMEM, "out of memory");
    e->h = h;
    e->ctx = c;
    e->len = len;
    e->n_ids = n_ids;
    e->text = dx_memdup(len ? text : "", len ? len : 1);
    e->ids = dx_memdup(n_ids ? ids : (const int32_t[1]){0}, (n_ids ? n_ids : 1) * sizeof *ids);
    if (entry_bytes(e) > m->cfg.max_bytes) { /* would evict everything and still not fit */
        dx_free(e->text);
        dx_free(e->ids);
        dx_free(e);
        return 0;
    }
    prune(m, now_ns, entry_bytes(e));
    if (!e->text || !e->ids || dx_hidx_insert(m->idx, h, (uintptr_t)e)) {
        dx_free(e->text);
        dx_free(e->ids);
        dx_free(e);
        return dx_errf(DX_ENOMEM, "out of memory");
    }
    e->expires_ns = now_ns + ttl_ns(m);
    dx_list_push_back(&m->use, &e->link);
    m->st.entries++;
    m->st.bytes += entry_bytes(e);
    m->st.puts++;
    return 0;
}

int hist_mem_put(hist_mem *m, uint64_t ns, const int32_t *ctx, size_t n_ctx, const char *text,
                 size_t len, const int32_t *ids, size_t n_ids, uint64_t now_ns)
{
    pthread_mutex_lock(&m->mu);
    int rc = put_locked(m, ns, ctx, n_ctx, text, len, ids, n_ids, now_ns);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void hist_mem_get_stats(const hist_mem *m, hist_mem_stats *out)
{
    pthread_mutex_lock((pthread_mutex_t *)&m->mu);
    *out = m->st;
    pthread_mutex_unlock((pthread_mutex_t *)&m->mu);
}

/* ---- replies -------------------------------------------------------------- */

int hist_reply_text(const tok *tk, const int32_t *ids, size_t n, dx_buf *out)
{
    dx_buf raw;
    dx_buf_init(&raw, 0);
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        if (!tok_is_text(tk, ids[i])) continue; /* the engine never streams them */
        char piece[256];
        int k = tok_token_bytes(tk, ids[i], piece, sizeof piece);
        rc = k < 0 ? k : dx_buf_append(&raw, piece, (size_t)k);
    }
    if (!rc && raw.len) rc = dx_utf8_sanitize((const uint8_t *)raw.data, raw.len, out);
    dx_buf_free(&raw);
    return rc;
}

static int is_end(const int32_t *end_ids, size_t n_end, int32_t t)
{
    for (size_t i = 0; i < n_end; i++)
        if (end_ids[i] == t) return 1;
    return 0;
}

size_t hist_strip_end(const int32_t *ids, size_t n, const int32_t *end_ids, size_t n_end)
{
    return n && is_end(end_ids, n_end, ids[n - 1]) ? n - 1 : n;
}

void hist_src_init(hist_src *s, const tok *tk, const int32_t *end_ids, size_t n_end)
{
    memset(s, 0, sizeof *s);
    s->tk = tk;
    s->end_ids = end_ids;
    s->n_end = n_end;
    dx_buf_init(&s->scratch, 0);
}

void hist_src_free(hist_src *s)
{
    dx_buf_free(&s->scratch);
}

/* ids[0..n) give exactly text, as the client saw it. */
static int same_text(hist_src *s, const int32_t *ids, size_t n, const char *text, size_t len)
{
    dx_buf_reset(&s->scratch);
    return hist_reply_text(s->tk, ids, n, &s->scratch) == 0 && s->scratch.len == len &&
           (len == 0 || !memcmp(s->scratch.data, text, len));
}

static int append_ids(tok_ids *out, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = tok_ids_push(out, ids[i]);
        if (rc) return rc;
    }
    return 1;
}

/* The reply in the request's own sequence: after ctx, up to an end token. */
static int from_seq(hist_src *s, const int32_t *ctx, size_t n_ctx, const char *text, size_t len,
                    tok_ids *out)
{
    if (!s->seq || n_ctx > s->n_seq || (n_ctx && memcmp(ctx, s->seq, n_ctx * sizeof *ctx)))
        return 0;
    size_t e = n_ctx;
    while (e < s->n_seq && !is_end(s->end_ids, s->n_end, s->seq[e])) e++;
    if (!same_text(s, s->seq + n_ctx, e - n_ctx, text, len)) return 0;
    return append_ids(out, s->seq + n_ctx, e - n_ctx);
}

static int from_mem(hist_src *s, const int32_t *ctx, size_t n_ctx, const char *text, size_t len,
                    tok_ids *out)
{
    hist_mem *m = s->mem;
    if (!m) return 0;
    XXH128_hash_t c = ctx_hash(ctx, n_ctx, s->ns);
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    entry *e = find(m, key_hash(m, c, text, len), c, text, len);
    if (e && e->expires_ns <= s->now_ns) {
        entry_drop(m, e);
        m->st.expired++;
    } else if (e) {
        e->expires_ns = s->now_ns + ttl_ns(m); /* in use: keep it as long as a lease would */
        dx_list_move_back(&m->use, &e->link);
        m->st.hits++;
        rc = append_ids(out, e->ids, e->n_ids);
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int hist_reply(void *user, const int32_t *ctx, size_t n_ctx, const char *text, size_t len,
               tok_ids *out)
{
    hist_src *s = user;
    int rc = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        int mem = pass == 0 ? s->mem_first : !s->mem_first;
        rc =
            mem ? from_mem(s, ctx, n_ctx, text, len, out) : from_seq(s, ctx, n_ctx, text, len, out);
        if (rc > 0) *(mem ? &s->from_mem : &s->from_seq) += 1;
    }
    if (rc == 0) s->retokenised++;
    return rc;
}
