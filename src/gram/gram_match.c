/* gram_match: the vocabulary trie and the token-level matcher.
 *
 * A parse state is the set of the grammar's pushdown stacks that are still
 * alive (llama.cpp's GBNF matcher), plus a partly read UTF-8 code point,
 * since a token may end inside one.  Stacks are persistent linked lists
 * whose nodes are interned (pos, parent) pairs, so equal stacks are equal
 * ids, a state is a sorted id list, and states are interned too: a state is
 * a small integer.  Two caches make masks cheap:
 *   - transitions (state, byte) -> state are memoised in a hash table, so
 *     walking the vocabulary trie costs one probe per trie node, and a
 *     subtree the grammar cannot enter is skipped whole;
 *   - masks are cached per state (LRU, GM_SLOTS of them), so a state seen
 *     again (inside a JSON string every character leads back to the same
 *     state) costs a copy.
 * Both grow only when new states appear; when they pass their soft limits the
 * match forgets everything but its current state (gm_gc), so memory stays
 * bounded on any grammar and any input.
 *
 * Hostile grammars are bounded at run time as well: a stack deeper than
 * GM_MAX_DEPTH is not entered, a state with more than GM_MAX_STACKS stacks
 * or a closure of more than GM_MAX_CLOSURE items fails with DX_ETOOBIG. */
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "gram/gram_priv.h"

#define GM_MAX_TOKEN   1024u /* longer tokens are never allowed */
#define GM_MAX_DEPTH   2048u
#define GM_MAX_STACKS  4096u
#define GM_MAX_CLOSURE (1u << 16)
#define GM_SOFT_NODES  (1u << 20)
#define GM_SOFT_STATES (1u << 16)
#define GM_SOFT_TRANS  (1u << 22)
#define GM_HARD_TRANS  (1u << 24)
#define GM_CACHE_BYTES (8u << 20) /* cached masks per match */
#define GM_MAX_ENTRIES 4096u      /* cached masks per match */
#define GM_MAX_DENSE   4096u      /* states with a direct 256-entry transition table */
#define GM_UNKNOWN     (INT32_MIN + 1)
#define GM_HOT         256u /* walk arrivals before a state's self-loops are worked out */
#define GM_DEAD        INT32_MIN

/* ---- vocabulary ----------------------------------------------------------------- */

struct gram_vocab {
    uint32_t n_vocab;
    uint32_t n_nodes;  /* trie in DFS preorder, node 0 the root */
    uint32_t *end;     /* [n_nodes] index past the node's subtree */
    uint8_t *byte;     /* [n_nodes] the byte leading into the node */
    uint32_t *tok_off; /* [n_nodes + 1] tokens ending at node i: toks[tok_off[i]..tok_off[i+1]) */
    uint32_t *toks;
    uint32_t *tb_off; /* [n_vocab + 1] each token's bytes in tb */
    uint8_t *tb;
    uint8_t *kind; /* [n_vocab] 0 never allowed, 1 text, 2 end of generation */
    int32_t *eog;
    uint32_t n_eog;
    /* [n_nodes][2]: what the strings below node i (after its byte) hold:
     * bit b for each ASCII byte b >= 0x20, SUM_CTL for a control byte,
     * SUM_HIGH for a byte >= 0x80, SUM_BAD when one of them is not valid
     * UTF-8 continuing from node i (see walk) */
    uint64_t (*sum)[2];
};

#define SUM_CTL  (1ull << 0)
#define SUM_HIGH (1ull << 1)
#define SUM_BAD  (1ull << 2)
#define SUM_SELF (1ull << 3) /* the node's own byte is not valid UTF-8 there */

/* UTF-8 decoding, one byte at a time: what the next byte may be. */
enum { U8_START, U8_C1, U8_C2, U8_C3, U8_E0, U8_ED, U8_F0, U8_F4, U8_BAD };

static uint8_t u8_next(uint8_t st, uint8_t b)
{
    static const uint8_t lo[8] = {0, 0x80, 0x80, 0x80, 0xa0, 0x80, 0x90, 0x80};
    static const uint8_t hi[8] = {0, 0xbf, 0xbf, 0xbf, 0xbf, 0x9f, 0xbf, 0x8f};
    static const uint8_t left[8] = {0, 1, 2, 3, 2, 2, 3, 3};
    if (st == U8_BAD) return U8_BAD;
    if (st != U8_START) {
        if (b < lo[st] || b > hi[st]) return U8_BAD;
        return left[st] == 1 ? U8_START : left[st] == 2 ? U8_C1 : U8_C2;
    }
    if (b < 0x80) return U8_START;
    if (b >= 0xc2 && b <= 0xdf) return U8_C1;
    if (b == 0xe0) return U8_E0;
    if (b == 0xed) return U8_ED;
    if (b >= 0xe1 && b <= 0xef) return U8_C2;
    if (b == 0xf0) return U8_F0;
    if (b == 0xf4) return U8_F4;
    if (b >= 0xf1 && b <= 0xf3) return U8_C3;
    return U8_BAD;
}

static void sum_byte(uint64_t *sm, uint8_t b)
{
    if (b >= 0x80)
        sm[0] |= SUM_HIGH;
    else if (b < 0x20)
        sm[0] |= SUM_CTL;
    else
        sm[b >> 6] |= 1ull << (b & 63);
}

/* The subtree summaries, bottom-up (children come after their parent in
 * preorder); each node's UTF-8 state from the root says which bytes below
 * are well-formed. */
static int vocab_sums(gram_vocab *v)
{
    uint32_t n = v->n_nodes, *parent = dx_malloc((size_t)n * sizeof *parent), sp = 0;
    uint8_t *dec = dx_malloc(n);
    uint32_t path[GM_MAX_TOKEN + 2];
    v->sum = dx_calloc(n, sizeof *v->sum);
    if (!parent || !dec || !v->sum) {
        dx_free(parent);
        dx_free(dec);
        return dx_errf(DX_ENOMEM, "gram: out of memory building the vocabulary trie");
    }
    path[sp++] = 0;
    dec[0] = U8_START;
    parent[0] = 0;
    for (uint32_t i = 1; i < n; i++) {
        while (v->end[path[sp - 1]] <= i) sp--; /* leave finished subtrees */
        parent[i] = path[sp - 1];
        dec[i] = u8_next(dec[parent[i]], v->byte[i]);
        path[sp++] = i;
    }
    for (uint32_t i = n; i-- > 1;) {
        uint64_t *ps = v->sum[parent[i]];
        ps[0] |= v->sum[i][0];
        ps[1] |= v->sum[i][1];
        sum_byte(ps, v->byte[i]);
        if (dec[i] == U8_BAD) ps[0] |= SUM_BAD, v->sum[i][0] |= SUM_SELF;
    }
    dx_free(parent);
    dx_free(dec);
    return 0;
}

static int cmp_tok(const void *a, const void *b, void *ctx)
{
    const gram_vocab *v = ctx;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    uint32_t lx = v->tb_off[x + 1] - v->tb_off[x], ly = v->tb_off[y + 1] - v->tb_off[y];
    int c = memcmp(v->tb + v->tb_off[x], v->tb + v->tb_off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int vocab_bytes(gram_vocab *v, const tok *t)
{
    size_t n = v->n_vocab, cap = 1 << 20, len = 0;
    char buf[GM_MAX_TOKEN];
    v->tb = dx_malloc(cap);
    if (!v->tb) return dx_errf(DX_ENOMEM, "gram: out of memory building the vocabulary");
    for (size_t id = 0; id < n; id++) {
        v->tb_off[id] = (uint32_t)len;
        int32_t i = (int32_t)id;
        if (tok_is_eog(t, i)) {
            v->kind[id] = 2;
            continue;
        }
        if (!tok_is_text(t, i)) continue;
        int k = tok_token_bytes(t, i, buf, sizeof buf);
        if (k == DX_ETOOBIG) continue; /* longer than GM_MAX_TOKEN: never allowed */
        if (k < 0) return k;
        if (k == 0) continue;
        if (len + (size_t)k > cap) {
            uint8_t *nb = dx_realloc(v->tb, cap * 2);
            if (!nb) return dx_errf(DX_ENOMEM, "gram: out of memory building the vocabulary");
            v->tb = nb;
            cap *= 2;
        }
        if (len + (size_t)k > UINT32_MAX) return dx_errf(DX_ETOOBIG, "gram: vocabulary too large");
        memcpy(v->tb + len, buf, (size_t)k);
        len += (size_t)k;
        v->kind[id] = 1;
    }
    v->tb_off[n] = (uint32_t)len;
    return 0;
}

/* Builds the trie from the tokens sorted by bytes: each token shares the
 * path of its common prefix with the one before. */
static int vocab_trie(gram_vocab *v)
{
    uint32_t n = 0, *order = dx_malloc(((size_t)v->n_vocab + 1) * sizeof *order);
    size_t cap = (size_t)v->tb_off[v->n_vocab] + 1;
    v->end = dx_malloc(cap * sizeof *v->end);
    v->byte = dx_malloc(cap);
    v->tok_off = dx_malloc((cap + 1) * sizeof *v->tok_off);
    v->toks = dx_malloc(((size_t)v->n_vocab + 1) * sizeof *v->toks);
    if (!order || !v->end || !v->byte || !v->tok_off || !v->toks) {
        dx_free(order);
        return dx_errf(DX_ENOMEM, "gram: out of memory building the vocabulary trie");
    }
    for (uint32_t id = 0; id < v->n_vocab; id++)
        if (v->kind[id] == 1) order[n++] = id;
    qsort_r(order, n, sizeof *order, cmp_tok, v);
    uint32_t path[GM_MAX_TOKEN + 1], depth = 0, nn = 1, nt = 0;
    path[0] = 0;
    v->byte[0] = 0;
    v->tok_off[0] = 0;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t id = order[k], len = v->tb_off[id + 1] - v->tb_off[id];
        const uint8_t *b = v->tb + v->tb_off[id];
        uint32_t lcp = 0;
        while (lcp < len && lcp < prev_len && b[lcp] == prev[lcp]) lcp++;
        while (depth > lcp) v->end[path[depth--]] = nn;
        for (; depth < len; depth++) {
            v->byte[nn] = b[depth];
            v->tok_off[nn] = nt;
            path[depth + 1] = nn++;
        }
        v->toks[nt++] = id;
        prev = b;
        prev_len = len;
    }
    while (depth > 0) v->end[path[depth--]] = nn;
    v->end[0] = nn;
    v->n_nodes = nn;
    dx_free(order);
    /* The tokens ending at node i are appended while i is the newest node
     * (equal strings are adjacent, a prefix sorts first), so they are
     * toks[tok_off[i] .. tok_off[i + 1]). */
    v->tok_off[nn] = nt;
    return 0;
}

int gram_vocab_create(const tok *t, gram_vocab **out)
{
    *out = NULL;
    gram_vocab *v = dx_calloc(1, sizeof *v);
    if (!v) return dx_errf(DX_ENOMEM, "gram: out of memory");
    v->n_vocab = (uint32_t)tok_vocab_size(t);
    v->tb_off = dx_calloc((size_t)v->n_vocab + 1, sizeof *v->tb_off);
    v->kind = dx_calloc((size_t)v->n_vocab + 1, 1);
    size_t n_eog = 0;
    const int32_t *eog = tok_eog_ids(t, &n_eog);
    v->eog = dx_calloc(n_eog + 1, sizeof *v->eog);
    int rc = !v->tb_off || !v->kind || !v->eog ? dx_errf(DX_ENOMEM, "gram: out of memory") : 0;
    if (!rc) {
        if (n_eog) memcpy(v->eog, eog, n_eog * sizeof *eog);
        v->n_eog = (uint32_t)n_eog;
        rc = vocab_bytes(v, t);
    }
    if (!rc) rc = vocab_trie(v);
    if (!rc) rc = vocab_sums(v);
    if (rc) {
        gram_vocab_destroy(v);
        return rc;
    }
    *out = v;
    return 0;
}

void gram_vocab_destroy(gram_vocab *v)
{
    if (!v) return;
    dx_free(v->end);
    dx_free(v->byte);
    dx_free(v->tok_off);
    dx_free(v->toks);
    dx_free(v->tb_off);
    dx_free(v->tb);
    dx_free(v->kind);
    dx_free(v->eog);
    dx_free(v->sum);
    dx_free(v);
}

uint32_t gram_vocab_size(const gram_vocab *v)
{
    return v->n_vocab;
}

/* ---- matcher -------------------------------------------------------------------- */

typedef struct {
    uint32_t pos, parent, depth; /* node 0 is the empty stack */
} gm_node;

typedef struct {
    uint32_t off, n;  /* node ids in spool, ascending; id 0 = the input may end here */
    uint32_t pu;      /* partial code point: need << 24 | len << 21 | bits, 0 = none */
    int32_t slot;     /* mask cache entry, -1 none */
    int32_t dense;    /* index of its direct transition table, -1 none (hash only) */
    uint32_t n_hash;  /* transitions from it in the hash table */
    uint32_t hits;    /* trie nodes that led to it in walks, up to GM_HOT */
    uint64_t loop[2]; /* (see state_loops) the bytes after which it is itself again */
} gm_state;

typedef struct {
    uint32_t key; /* (state << 8 | byte) + 1, 0 = empty */
    int32_t val;
} gm_trans;

typedef struct {
    uint32_t pos, parent, gen;
} gm_seen;

typedef struct {
    uint32_t i, end;
    int32_t st;
} gm_frame;

typedef struct {
    int32_t owner; /* state */
    uint32_t count;
    uint8_t list;  /* data holds count ids, else nw words */
    uint64_t used; /* clock of the last use */
    void *data;
} gm_entry;

struct gram_match {
    const gram *g;
    const gram_vocab *v;
    uint32_t nw; /* mask words */
    gm_node *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *node_ht, node_ht_cap; /* node id, 0 = empty */
    gm_state *states;
    uint32_t n_states, cap_states;
    uint32_t *state_ht, state_ht_cap; /* state id + 1 */
    uint32_t *spool;
    uint32_t n_spool, cap_spool;
    gm_trans *trans;
    uint32_t n_trans, trans_cap;
    /* closure scratch */
    uint32_t *work; /* pairs pos, parent */
    uint32_t cap_work;
    uint32_t *out;
    uint32_t n_out, cap_out;
    gm_seen *seen;
    uint32_t seen_cap, gen;
    /* mask cache: allowed ids when few, else the bitmap */
    gm_entry *ent;
    uint32_t n_ent;
    size_t ent_bytes;
    uint64_t clock;
    /* direct transition tables [GM_MAX_DENSE][256], next state or GM_UNKNOWN */
    int32_t *dense;
    uint32_t n_dense;
    gm_frame dfs[GM_MAX_TOKEN + 2];
    int32_t cur, start; /* start: the state before any input (no gm_gc since) */
    int ended;          /* an end-of-generation token was accepted */
};

static inline uint32_t mix32(uint32_t a, uint32_t b)
{
    uint64_t h = ((uint64_t)a << 32 | b) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32) ^ (uint32_t)h;
}

static int gm_grow(void **p, uint32_t *cap, uint32_t need, size_t elsz)
{
    if (need <= *cap) return 0;
    uint32_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = dx_realloc(*p, (size_t)nc * elsz);
    if (!q) return dx_errf(DX_ENOMEM, "gram: out of memory");
    *p = q;
    *cap = nc;
    return 0;
}

static int node_rehash(gram_match *m, uint32_t cap)
{
    uint32_t *t = dx_calloc(cap, sizeof *t);
    if (!t) return dx_errf(DX_ENOMEM, "gram: out of memory");
    for (uint32_t id = 1; id < m->n_nodes; id++) {
        uint32_t i = mix32(m->nodes[id].pos, m->nodes[id].parent) & (cap - 1);
        while (t[i]) i = (i + 1) & (cap - 1);
        t[i] = id;
    }
    dx_free(m->node_ht);
    m->node_ht = t;
    m->node_ht_cap = cap;
    return 0;
}

/* The stack (pos, parent) as a node id; 0 if it would be too deep; < 0 error. */
static int64_t intern_node(gram_match *m, uint32_t pos, uint32_t parent)
{
    uint32_t depth = m->nodes[parent].depth + 1;
    if (depth > GM_MAX_DEPTH) return 0;
    if (m->n_nodes * 2 >= m->node_ht_cap) {
        int rc = node_rehash(m, m->node_ht_cap ? m->node_ht_cap * 2 : 1024);
        if (rc) return rc;
    }
    uint32_t i = mix32(pos, parent) & (m->node_ht_cap - 1);
    for (; m->node_ht[i]; i = (i + 1) & (m->node_ht_cap - 1)) {
        const gm_node *n = &m->nodes[m->node_ht[i]];
        if (n->pos == pos && n->parent == parent) return m->node_ht[i];
    }
    int rc = gm_grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof *m->nodes);
    if (rc) return rc;
    m->nodes[m->n_nodes] = (gm_node){pos, parent, depth};
    m->node_ht[i] = m->n_nodes;
    return m->n_nodes++;
}

static uint64_t state_hash(uint32_t pu, const uint32_t *ids, uint32_t n)
{
    uint64_t h = 0x243f6a8885a308d3ull ^ pu;
    for (uint32_t i = 0; i < n; i++) h = (h ^ ids[i]) * 0x100000001b3ull, h ^= h >> 29;
    return h;
}

static int state_rehash(gram_match *m, uint32_t cap)
{
    uint32_t *t = dx_calloc(cap, sizeof *t);
    if (!t) return dx_errf(DX_ENOMEM, "gram: out of memory");
    for (uint32_t s = 0; s < m->n_states; s++) {
        const gm_state *st = &m->states[s];
        uint32_t i = (uint32_t)state_hash(st->pu, m->spool + st->off, st->n) & (cap - 1);
        while (t[i]) i = (i + 1) & (cap - 1);
        t[i] = s + 1;
    }
    dx_free(m->state_ht);
    m->state_ht = t;
    m->state_ht_cap = cap;
    return 0;
}

/* The state (pu, sorted ids) as a state id, or < 0 error. */
static int64_t intern_state(gram_match *m, uint32_t pu, const uint32_t *ids, uint32_t n)
{
    if (m->n_states * 2 >= m->state_ht_cap) {
        int rc = state_rehash(m, m->state_ht_cap ? m->state_ht_cap * 2 : 256);
        if (rc) return rc;
    }
    uint32_t i = (uint32_t)state_hash(pu, ids, n) & (m->state_ht_cap - 1);
    for (; m->state_ht[i]; i = (i + 1) & (m->state_ht_cap - 1)) {
        const gm_state *s = &m->states[m->state_ht[i] - 1];
        if (s->pu == pu && s->n == n && !memcmp(m->spool + s->off, ids, n * sizeof *ids))
            return m->state_ht[i] - 1;
    }
    if (m->n_states >= (1u << 23)) return dx_errf(DX_ETOOBIG, "gram: too many parse states");
    int rc = gm_grow((void **)&m->states, &m->cap_states, m->n_states + 1, sizeof *m->states);
    if (!rc) rc = gm_grow((void **)&m->spool, &m->cap_spool, m->n_spool + n, sizeof *m->spool);
    if (rc) return rc;
    if (n) memcpy(m->spool + m->n_spool, ids, n * sizeof *ids);
    m->states[m->n_states] =
        (gm_state){.off = m->n_spool, .n = n, .pu = pu, .slot = -1, .dense = -1};
    m->n_spool += n;
    m->state_ht[i] = m->n_states + 1;
    return m->n_states++;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Whether (pos, parent) was already expanded in this closure; marks it. */
static int seen_mark(gram_match *m, uint32_t pos, uint32_t parent, uint32_t n_items)
{
    if (n_items * 2 >= m->seen_cap) { /* keep the load under one half */
        uint32_t nc = m->seen_cap ? m->seen_cap * 2 : 1024;
        gm_seen *t = dx_calloc(nc, sizeof *t), *o = m->seen;
        if (!t) return dx_errf(DX_ENOMEM, "gram: out of memory");
        for (uint32_t k = 0; k < m->seen_cap; k++) {
            if (o[k].gen != m->gen) continue;
            uint32_t i = mix32(o[k].pos, o[k].parent) & (nc - 1);
            while (t[i].gen == m->gen) i = (i + 1) & (nc - 1);
            t[i] = o[k];
        }
        dx_free(o);
        m->seen = t;
        m->seen_cap = nc;
    }
    uint32_t i = mix32(pos, parent) & (m->seen_cap - 1);
    for (; m->seen[i].gen == m->gen; i = (i + 1) & (m->seen_cap - 1))
        if (m->seen[i].pos == pos && m->seen[i].parent == parent) return 1;
    m->seen[i] = (gm_seen){pos, parent, m->gen};
    return 0;
}

static int push_work(gram_match *m, uint32_t *n, uint32_t pos, uint32_t parent)
{
    int rc = gm_grow((void **)&m->work, &m->cap_work, 2 * (*n + 1), sizeof *m->work);
    if (rc) return rc;
    m->work[2 * *n] = pos;
    m->work[2 * *n + 1] = parent;
    ++*n;
    return 0;
}

static int push_out(gram_match *m, uint32_t id)
{
    if (m->n_out >= GM_MAX_STACKS)
        return dx_errf(DX_ETOOBIG, "gram: over %u parse stacks at once (grammar too ambiguous)",
                       GM_MAX_STACKS);
    int rc = gm_grow((void **)&m->out, &m->cap_out, m->n_out + 1, sizeof *m->out);
    if (rc) return rc;
    m->out[m->n_out++] = id;
    return 0;
}

/* Expands the n seeds in m->work until every stack has a terminal on top;
 * the stacks (sorted, unique) go to m->out.  Positions are expanded once per
 * parent, so ambiguity costs linear work. */
static int closure(gram_match *m, uint32_t n)
{
    const gram *g = m->g;
    uint32_t items = 0;
    m->n_out = 0;
    if (++m->gen == 0) {
        if (m->seen) memset(m->seen, 0, (size_t)m->seen_cap * sizeof *m->seen);
        m->gen = 1;
    }
    while (n) {
        n--;
        uint32_t pos = m->work[2 * n], parent = m->work[2 * n + 1];
        int rc = seen_mark(m, pos, parent, items);
        if (rc < 0) return rc;
        if (rc) continue;
        if (++items > GM_MAX_CLOSURE)
            return dx_errf(DX_ETOOBIG, "gram: parse closure over %u items (grammar too ambiguous)",
                           GM_MAX_CLOSURE);
        uint32_t e = g->elems[pos];
        if (GE_TYPE(e) == GE_END) {
            if (!parent)
                rc = push_out(m, 0);
            else
                rc = push_work(m, &n, m->nodes[parent].pos, m->nodes[parent].parent);
        } else if (GE_TYPE(e) != GE_REF) {
            int64_t id = intern_node(m, pos, parent);
            rc = id < 0 ? (int)id : id ? push_out(m, (uint32_t)id) : 0;
        } else {
            int64_t np = parent;
            if (GE_TYPE(g->elems[pos + 1]) != GE_END) np = intern_node(m, pos + 1, parent);
            if (np < 0) return (int)np;
            if (np == 0 && GE_TYPE(g->elems[pos + 1]) != GE_END) continue; /* too deep */
            uint32_t r = GE_VAL(e);
            for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1] && !rc; a++)
                rc = push_work(m, &n, g->alts[a], (uint32_t)np);
        }
        if (rc) return rc;
    }
    if (m->n_out > 1) qsort(m->out, m->n_out, sizeof *m->out, cmp_u32);
    uint32_t k = 0;
    for (uint32_t i = 0; i < m->n_out; i++)
        if (!k || m->out[k - 1] != m->out[i]) m->out[k++] = m->out[i];
    m->n_out = k;
    return 0;
}

static int elem_has(const gram *g, uint32_t e, uint32_t c)
{
    return GE_TYPE(e) == GE_LIT ? GE_VAL(e) == c : gram_set_has(g, GE_VAL(e), c);
}

static int elem_meets(const gram *g, uint32_t e, uint32_t lo, uint32_t hi)
{
    return GE_TYPE(e) == GE_LIT ? GE_VAL(e) >= lo && GE_VAL(e) <= hi
                                : gram_set_meets(g, GE_VAL(e), lo, hi);
}

/* State s after code point c. */
static int64_t step_cp(gram_match *m, const gm_state *s, uint32_t c)
{
    uint32_t n = 0, off = s->off, cnt = s->n;
    for (uint32_t i = 0; i < cnt; i++) {
        uint32_t id = m->spool[off + i];
        if (!id) continue;
        const gm_node *nd = &m->nodes[id];
        if (!elem_has(m->g, m->g->elems[nd->pos], c)) continue;
        int rc = push_work(m, &n, nd->pos + 1, nd->parent);
        if (rc) return rc;
    }
    if (!n) return GM_DEAD;
    int rc = closure(m, n);
    if (rc) return rc;
    if (!m->n_out) return GM_DEAD;
    return intern_state(m, 0, m->out, m->n_out);
}

/* State s with a code point in [lo, hi] begun: keeps the stacks that can
 * take one of them. */
static int64_t step_partial(gram_match *m, const gm_state *s, uint32_t pu, uint32_t lo, uint32_t hi)
{
    m->n_out = 0;
    uint32_t off = s->off, cnt = s->n;
    for (uint32_t i = 0; i < cnt; i++) {
        uint32_t id = m->spool[off + i];
        if (id && elem_meets(m->g, m->g->elems[m->nodes[id].pos], lo, hi)) {
            int rc = push_out(m, id);
            if (rc) return rc;
        }
    }
    if (!m->n_out) return GM_DEAD;
    return intern_state(m, pu, m->out, m->n_out);
}

/* Valid code points of an n-byte UTF-8 sequence. */
static const uint32_t k_min[5] = {0, 0, 0x80, 0x800, 0x10000};
static const uint32_t k_max[5] = {0, 0x7f, 0x7ff, 0xffff, 0x10ffff};

static int64_t step_byte(gram_match *m, int32_t sid, uint8_t b)
{
    gm_state s = m->states[sid]; /* a copy: interning may move the array */
    uint32_t need, len, bits;
    if (s.pu) {
        if ((b & 0xc0) != 0x80) return GM_DEAD;
        need = (s.pu >> 24) - 1;
        len = (s.pu >> 21) & 7;
        bits = (s.pu & 0x1fffff) << 6 | (b & 0x3f);
        if (!need) {
            if (bits < k_min[len] || bits > k_max[len] || (bits >= 0xd800 && bits <= 0xdfff))
                return GM_DEAD;
            return step_cp(m, &s, bits);
        }
    } else if (b < 0x80) {
        return step_cp(m, &s, b);
    } else {
        len = b >= 0xc2 && b <= 0xdf   ? 2
              : b >= 0xe0 && b <= 0xef ? 3
              : b >= 0xf0 && b <= 0xf4 ? 4
                                       : 0;
        if (!len) return GM_DEAD;
        need = len - 1;
        bits = b & (0x3fu >> (len - 1));
    }
    uint32_t lo = bits << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
    if (lo < k_min[len]) lo = k_min[len];
    if (hi > k_max[len]) hi = k_max[len];
    if (lo > hi) return GM_DEAD;
    return step_partial(m, &s, need << 24 | len << 21 | bits, lo, hi);
}

static int trans_rehash(gram_match *m, uint32_t cap)
{
    gm_trans *t = dx_calloc(cap, sizeof *t);
    if (!t) return dx_errf(DX_ENOMEM, "gram: out of memory");
    for (uint32_t k = 0; k < m->trans_cap; k++) {
        if (!m->trans[k].key) continue;
        uint32_t i = mix32(m->trans[k].key, 0) & (cap - 1);
        while (t[i].key) i = (i + 1) & (cap - 1);
        t[i] = m->trans[k];
    }
    dx_free(m->trans);
    m->trans = t;
    m->trans_cap = cap;
    return 0;
}

static int64_t trans_hash(gram_match *m, int32_t sid, uint8_t b)
{
    uint32_t key = ((uint32_t)sid << 8 | b) + 1, i = mix32(key, 0) & (m->trans_cap - 1);
    for (; m->trans[i].key; i = (i + 1) & (m->trans_cap - 1))
        if (m->trans[i].key == key) return m->trans[i].val;
    int64_t t = step_byte(m, sid, b);
    if (t < 0 && t != GM_DEAD) return t;
    if (m->n_trans * 2 >= m->trans_cap) {
        if (m->trans_cap >= GM_HARD_TRANS)
            return dx_errf(DX_ETOOBIG, "gram: over %u memoised transitions", GM_HARD_TRANS / 2);
        int rc = trans_rehash(m, m->trans_cap * 2);
        if (rc) return rc;
        i = mix32(key, 0) & (m->trans_cap - 1);
        while (m->trans[i].key) i = (i + 1) & (m->trans_cap - 1);
    }
    m->trans[i] = (gm_trans){key, (int32_t)t};
    m->n_trans++;
    if (++m->states[sid].n_hash == 16 && m->n_dense < GM_MAX_DENSE) {
        /* a busy state: give it a direct table */
        int32_t d = m->states[sid].dense = (int32_t)m->n_dense++, *row = m->dense + (size_t)d * 256;
        for (int k = 0; k < 256; k++) row[k] = GM_UNKNOWN;
    }
    return t;
}

/* Memoised transition: next state id, GM_DEAD, or < 0 error (not GM_DEAD).
 * A state with many transitions gets a direct table (one load per trie node
 * in a walk); the others go through the hash table. */
static inline int64_t trans(gram_match *m, int32_t sid, uint8_t b)
{
    int32_t d = m->states[sid].dense;
    if (d >= 0) {
        int32_t v = m->dense[(size_t)d * 256 + b];
        if (v != GM_UNKNOWN) return v;
        int64_t t = trans_hash(m, sid, b);
        if (t >= 0 || t == GM_DEAD) m->dense[(size_t)d * 256 + b] = (int32_t)t;
        return t;
    }
    return trans_hash(m, sid, b);
}

static void ent_drop(gram_match *m, uint32_t k)
{
    gm_entry *e = &m->ent[k];
    m->states[e->owner].slot = -1;
    m->ent_bytes -= e->list ? (size_t)e->count * 4 : (size_t)m->nw * 8;
    dx_free(e->data);
    m->ent[k] = m->ent[--m->n_ent];
    if (k < m->n_ent) m->states[m->ent[k].owner].slot = (int32_t)k;
}

/* Forgets every state but the current one (re-interned from scratch). */
static int gm_reset(gram_match *m, const uint32_t *chains, uint32_t n_chains, uint32_t pu)
{
    m->n_nodes = 1;
    m->n_states = 0;
    m->n_spool = 0;
    m->n_trans = 0;
    memset(m->node_ht, 0, (size_t)m->node_ht_cap * sizeof *m->node_ht);
    memset(m->state_ht, 0, (size_t)m->state_ht_cap * sizeof *m->state_ht);
    memset(m->trans, 0, (size_t)m->trans_cap * sizeof *m->trans);
    for (uint32_t k = 0; k < m->n_ent; k++) dx_free(m->ent[k].data);
    m->n_ent = 0;
    m->ent_bytes = 0;
    m->n_dense = 0;
    /* chains: for each stack, its length then positions from the bottom */
    m->n_out = 0;
    for (uint32_t c = 0, i = 0; c < n_chains; c++) {
        uint32_t len = chains[i++], parent = 0;
        for (uint32_t k = 0; k < len; k++) {
            int64_t id = intern_node(m, chains[i++], parent);
            if (id <= 0) return id ? (int)id : dx_errf(DX_ETOOBIG, "gram: stack too deep");
            parent = (uint32_t)id;
        }
        int rc = push_out(m, parent);
        if (rc) return rc;
    }
    if (m->n_out > 1) qsort(m->out, m->n_out, sizeof *m->out, cmp_u32);
    int64_t s = intern_state(m, pu, m->out, m->n_out);
    if (s < 0) return (int)s;
    m->cur = (int32_t)s;
    return 0;
}

static int gm_gc(gram_match *m)
{
    if (m->n_nodes < GM_SOFT_NODES && m->n_states < GM_SOFT_STATES && m->n_trans < GM_SOFT_TRANS)
        return 0;
    const gm_state *s = &m->states[m->cur];
    size_t total = 0;
    for (uint32_t i = 0; i < s->n; i++) total += 1 + m->nodes[m->spool[s->off + i]].depth;
    uint32_t *chains = dx_malloc((total + 1) * sizeof *chains), k = 0;
    if (!chains) return dx_errf(DX_ENOMEM, "gram: out of memory");
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t id = m->spool[s->off + i], d = m->nodes[id].depth;
        chains[k] = d;
        for (uint32_t j = d; j > 0; j--, id = m->nodes[id].parent) chains[k + j] = m->nodes[id].pos;
        k += d + 1;
    }
    int rc = gm_reset(m, chains, s->n, s->pu);
    dx_free(chains);
    m->start = -1; /* forgotten: gram_match_reset computes it again */
    return rc;
}

int gram_match_create(const gram *g, const gram_vocab *v, gram_match **out)
{
    *out = NULL;
    gram_match *m = dx_calloc(1, sizeof *m);
    if (!m) return dx_errf(DX_ENOMEM, "gram: out of memory");
    m->g = g;
    m->v = v;
    m->nw = (v->n_vocab + 63) / 64;
    m->ent = dx_calloc(GM_MAX_ENTRIES, sizeof *m->ent);
    m->dense = dx_malloc((size_t)GM_MAX_DENSE * 256 * sizeof *m->dense);
    int rc = m->ent && m->dense ? 0 : dx_errf(DX_ENOMEM, "gram: out of memory");
    if (!rc) rc = gm_grow((void **)&m->nodes, &m->cap_nodes, 256, sizeof *m->nodes);
    if (!rc) rc = node_rehash(m, 1024);
    if (!rc) rc = state_rehash(m, 256);
    if (!rc) rc = trans_rehash(m, 4096);
    uint32_t n = 0;
    if (!rc) {
        m->nodes[0] = (gm_node){0, 0, 0};
        m->n_nodes = 1;
        for (uint32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1] && !rc; a++)
            rc = push_work(m, &n, g->alts[a], 0);
    }
    if (!rc) rc = closure(m, n);
    if (!rc && !m->n_out)
        rc = dx_errf(DX_ETOOBIG, "gram: the grammar's first step nests deeper than %u",
                     GM_MAX_DEPTH);
    if (!rc) {
        int64_t s = intern_state(m, 0, m->out, m->n_out);
        rc = s < 0 ? (int)s : 0;
        m->cur = m->start = (int32_t)s;
    }
    if (rc) {
        gram_match_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

void gram_match_destroy(gram_match *m)
{
    if (!m) return;
    dx_free(m->nodes);
    dx_free(m->node_ht);
    dx_free(m->states);
    dx_free(m->state_ht);
    dx_free(m->spool);
    dx_free(m->trans);
    dx_free(m->work);
    dx_free(m->out);
    dx_free(m->seen);
    if (m->ent)
        for (uint32_t k = 0; k < m->n_ent; k++) dx_free(m->ent[k].data);
    dx_free(m->ent);
    dx_free(m->dense);
    dx_free(m);
}

static int is_complete(const gram_match *m, int32_t s)
{
    const gm_state *st = &m->states[s];
    return !st->pu && st->n && m->spool[st->off] == 0;
}

int gram_match_complete(const gram_match *m)
{
    return m->ended || is_complete(m, m->cur);
}

int gram_match_done(const gram_match *m)
{
    return m->ended || (is_complete(m, m->cur) && m->states[m->cur].n == 1);
}

/* The bytes after which state s is s again, in the layout of the trie's
 * summaries: each ASCII byte >= 0x20; SUM_CTL if every control byte does;
 * SUM_HIGH if every character >= U+0080 does (checked on one character of
 * each run of characters the stacks' terminals treat alike, up to 64 runs).
 * A subtree whose summary is inside it is allowed whole: every string in it
 * leads from s back to s, through partial characters that s can finish. */
static int state_loops(gram_match *m, int32_t s, uint64_t *loop)
{
    loop[0] = loop[1] = 0;
    if (m->states[s].pu) return 0;
    int ctl = 1;
    for (uint32_t b = 0; b < 0x80; b++) {
        int64_t t = trans(m, s, (uint8_t)b);
        if (t < 0 && t != GM_DEAD) return (int)t;
        if (t != s) {
            if (b < 0x20) ctl = 0;
            continue;
        }
        if (b >= 0x20) loop[b >> 6] |= 1ull << (b & 63);
    }
    if (ctl) loop[0] |= SUM_CTL;
    /* runs: the cut points of every terminal's set above U+007F */
    uint32_t cuts[130], n = 0;
    cuts[n++] = 0x80;
    const gm_state st = m->states[s];
    for (uint32_t i = 0; i < st.n && n < 128; i++) {
        uint32_t id = m->spool[st.off + i];
        if (!id) continue;
        uint32_t e = m->g->elems[m->nodes[id].pos];
        if (GE_TYPE(e) == GE_LIT) {
            if (GE_VAL(e) >= 0x80) cuts[n++] = GE_VAL(e), cuts[n++] = GE_VAL(e) + 1;
            continue;
        }
        const gram *g = m->g;
        for (uint32_t r = g->set_off[GE_VAL(e)]; r < g->set_off[GE_VAL(e) + 1] && n < 128; r++) {
            if (g->ranges[2 * r] > 0x80) cuts[n++] = g->ranges[2 * r];
            if (g->ranges[2 * r + 1] >= 0x80) cuts[n++] = g->ranges[2 * r + 1] + 1;
        }
    }
    if (n >= 128) return 0; /* too many runs: not worth it */
    cuts[n++] = 0xd800, cuts[n++] = 0xe000, cuts[n++] = 0x110000;
    for (uint32_t i = 0; i < n; i++) /* each cut starts a run; check its first character */
        if (cuts[i] < 0x110000 && (cuts[i] < 0xd800 || cuts[i] >= 0xe000)) {
            int64_t t = step_cp(m, &st, cuts[i]);
            if (t < 0 && t != GM_DEAD) return (int)t;
            if (t != s) return 0;
        }
    loop[0] |= SUM_HIGH;
    return 0;
}

/* Walks the vocabulary trie from state s, setting the bits of every token
 * the grammar can take; a subtree whose prefix it cannot take is skipped,
 * and one that leads back to a state again and again (inside a JSON string)
 * is taken whole from its summary. */
static int64_t walk(gram_match *m, int32_t s, uint64_t *mask)
{
    const gram_vocab *v = m->v;
    int64_t count = 0;
    uint32_t sp = 0, i = 1, end = v->end[0];
    int32_t st = s;
    /* the summaries decode UTF-8 from the root: only a walk that starts
     * between characters reads them right */
    int whole = !m->states[s].pu;
    for (;;) {
        while (i < end) {
            /* the strings from node i's byte on all lead st back to itself:
             * the subtree is in, without stepping into it (this is what
             * spares the partial characters of non-ASCII tokens) */
            const uint64_t *sm = v->sum[i], *lp = m->states[st].loop;
            if (whole && m->states[st].hits >= GM_HOT) {
                uint64_t self[2] = {sm[0], sm[1]};
                sum_byte(self, v->byte[i]);
                if (self[0] & SUM_SELF) self[0] |= SUM_BAD;
                if (!(self[0] & ~lp[0]) && !(self[1] & ~lp[1])) {
                    for (uint32_t k = v->tok_off[i]; k < v->tok_off[v->end[i]]; k++) {
                        uint32_t id = v->toks[k];
                        mask[id >> 6] |= 1ull << (id & 63);
                        count++;
                    }
                    i = v->end[i];
                    continue;
                }
            }
            int64_t t = trans(m, st, v->byte[i]);
            if (t == GM_DEAD) {
                i = v->end[i];
                continue;
            }
            if (t < 0) return t;
            gm_state *ts = &m->states[t];
            if (ts->hits < GM_HOT && ++ts->hits == GM_HOT) {
                uint64_t loop[2];
                int rc = state_loops(m, (int32_t)t, loop);
                if (rc) return rc;
                ts = &m->states[t];
                ts->loop[0] = loop[0];
                ts->loop[1] = loop[1];
            }
            uint32_t last =
                !whole || (sm[0] & ~ts->loop[0]) || (sm[1] & ~ts->loop[1]) ? i + 1 : v->end[i];
            for (uint32_t k = v->tok_off[i]; k < v->tok_off[last]; k++) {
                uint32_t id = v->toks[k];
                mask[id >> 6] |= 1ull << (id & 63);
                count++;
            }
            if (last != i + 1) { /* the whole subtree is in */
                i = last;
                continue;
            }
            m->dfs[sp++] = (gm_frame){v->end[i], end, st};
            end = v->end[i];
            i++;
            st = (int32_t)t;
        }
        if (!sp) break;
        sp--;
        i = m->dfs[sp].i;
        end = m->dfs[sp].end;
        st = m->dfs[sp].st;
    }
    return count;
}

/* Keeps the mask of state s (count tokens) in the cache, evicting the least
 * recently used masks past the budget.  Failing to allocate only means no
 * caching. */
static void ent_store(gram_match *m, int32_t s, const uint64_t *mask, uint32_t count)
{
    int list = (size_t)count * 4 < (size_t)m->nw * 8;
    size_t bytes = list ? (size_t)count * 4 : (size_t)m->nw * 8;
    while (m->n_ent && (m->n_ent >= GM_MAX_ENTRIES || m->ent_bytes + bytes > GM_CACHE_BYTES)) {
        uint32_t lru = 0;
        for (uint32_t k = 1; k < m->n_ent; k++)
            if (m->ent[k].used < m->ent[lru].used) lru = k;
        ent_drop(m, lru);
    }
    void *data = dx_malloc(bytes ? bytes : 1);
    if (!data) return;
    if (list) {
        uint32_t *ids = data, n = 0;
        for (uint32_t w = 0; w < m->nw; w++)
            for (uint64_t b = mask[w]; b; b &= b - 1)
                ids[n++] = w * 64 + (uint32_t)__builtin_ctzll(b);
    } else {
        memcpy(data, mask, bytes);
    }
    m->ent[m->n_ent] = (gm_entry){s, count, (uint8_t)list, m->clock, data};
    m->states[s].slot = (int32_t)m->n_ent++;
    m->ent_bytes += bytes;
}

int gram_match_mask(gram_match *m, uint64_t *mask)
{
    int rc = gm_gc(m);
    if (rc) return rc;
    memset(mask, 0, (size_t)m->nw * sizeof *mask);
    if (m->ended) return 0;
    m->clock++;
    int32_t slot = m->states[m->cur].slot;
    if (slot >= 0) {
        gm_entry *e = &m->ent[slot];
        e->used = m->clock;
        if (!e->list) {
            memcpy(mask, e->data, (size_t)m->nw * sizeof *mask);
        } else {
            const uint32_t *ids = e->data;
            for (uint32_t k = 0; k < e->count; k++) mask[ids[k] >> 6] |= 1ull << (ids[k] & 63);
        }
        return (int)e->count;
    }
    int64_t count = walk(m, m->cur, mask);
    if (count < 0) return (int)count;
    if (count == 0 && !is_complete(m, m->cur)) /* only deeper nesting could go on */
        return dx_errf(DX_ETOOBIG,
                       "gram: no token continues the grammar within the stack "
                       "depth of %u",
                       GM_MAX_DEPTH);
    if (is_complete(m, m->cur))
        for (uint32_t e = 0; e < m->v->n_eog; e++) {
            uint32_t id = (uint32_t)m->v->eog[e];
            if (id < m->v->n_vocab && !(mask[id >> 6] >> (id & 63) & 1)) {
                mask[id >> 6] |= 1ull << (id & 63);
                count++;
            }
        }
    ent_store(m, m->cur, mask, (uint32_t)count);
    return (int)count;
}

int gram_match_accept(gram_match *m, int32_t tok)
{
    const gram_vocab *v = m->v;
    if (tok < 0 || (uint32_t)tok >= v->n_vocab)
        return dx_errf(DX_EINVAL, "gram: token %d out of range (vocabulary of %u)", tok,
                       v->n_vocab);
    if (m->ended) return dx_errf(DX_EINVAL, "gram: token %d after the end of generation", tok);
    if (v->kind[tok] == 2) {
        if (!is_complete(m, m->cur))
            return dx_errf(DX_EINVAL,
                           "gram: end of generation (token %d) before the grammar "
                           "is complete",
                           tok);
        m->ended = 1;
        return 0;
    }
    if (v->kind[tok] != 1)
        return dx_errf(DX_EINVAL, "gram: token %d is a control token the grammar never allows",
                       tok);
    int rc = gm_gc(m);
    if (rc) return rc;
    int32_t s = m->cur;
    for (uint32_t i = v->tb_off[tok]; i < v->tb_off[tok + 1]; i++) {
        int64_t t = trans(m, s, v->tb[i]);
        if (t == GM_DEAD)
            return dx_errf(DX_EINVAL, "gram: token %d does not continue the grammar here", tok);
        if (t < 0) return (int)t;
        s = (int32_t)t;
    }
    m->cur = s;
    return 0;
}

int32_t gram_match_state(const gram_match *m)
{
    return m->cur;
}

void gram_match_restore(gram_match *m, int32_t state, int ended)
{
    DX_ASSERT(state >= 0 && (uint32_t)state < m->n_states);
    m->cur = state;
    m->ended = ended;
}

int gram_match_reset(gram_match *m)
{
    m->ended = 0;
    if (m->start >= 0) {
        m->cur = m->start;
        return 0;
    }
    /* after gm_gc: the start state again from the root's alternatives */
    const gram *g = m->g;
    uint32_t n = 0;
    int rc = 0;
    for (uint32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1] && !rc; a++)
        rc = push_work(m, &n, g->alts[a], 0);
    if (!rc) rc = closure(m, n);
    int64_t s = rc ? rc : intern_state(m, 0, m->out, m->n_out);
    if (s < 0) return (int)s;
    m->cur = m->start = (int32_t)s;
    return 0;
}
