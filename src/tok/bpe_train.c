/* bpe_train: learns byte-level BPE merges from a corpus.
 *
 * The corpus is cut with the tokenizer's own splitter (tok_split: the same
 * regex and the same handling of invalid UTF-8 as encoding), distinct pieces
 * ("words") are counted, and each word starts as a sequence of its bytes.
 * Each round merges the adjacent symbol pair with the highest count summed
 * over all words (weighted by word count, overlapping occurrences counted as
 * in the GPT-2 trainer).  Ties go to the pair whose (left, right) raw byte
 * strings sort first (memcmp order, a proper prefix first), so the output
 * depends on nothing but the corpus: not on hash order, not on the machine.
 *
 * A pair whose concatenation is already a symbol (reachable another way,
 * e.g. "ab"+"c" after "a"+"bc") is skipped for good, so that every merge adds
 * exactly one new token and the vocabulary has no duplicates.  Learning
 * stops at n_merges or when the best pair occurs fewer than twice.
 *
 * Pair counts are kept in a table and updated only for the words a merge
 * touches; picking the best pair is a scan of that table, which for the
 * embedded corpus (a few thousand distinct words) is far cheaper than
 * maintaining a heap with decrease-key. */
#include "tok/bpe_train.h"

#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "tok/tok_priv.h"

/* Open-addressing index from a key to a dense position; -1 = free. */
typedef struct {
    int32_t *slot;
    size_t mask;
} bt_index;

typedef struct {
    uint32_t off;  /* first symbol in bt.syms, first byte in bt.wbytes */
    uint32_t n;    /* bytes of the word */
    uint32_t nsym; /* symbols now */
    int64_t count;
} bt_word;

typedef struct {
    int32_t a, b;
    int64_t count;
    int skip; /* its concatenation already exists */
} bt_pair;

typedef struct {
    /* words */
    dx_buf wbytes;
    bt_word *words;
    size_t nwords, capwords;
    bt_index widx;
    int32_t *syms; /* [wbytes.len] */
    /* symbols: raw byte strings */
    dx_buf sbytes;
    uint32_t *soff, *slen;
    size_t nsym, capsym;
    bt_index sidx;
    /* pairs */
    bt_pair *pairs;
    size_t npairs, cappairs;
    bt_index pidx;
} bt;

static int index_init(bt_index *x, size_t cap)
{
    x->slot = dx_malloc(cap * sizeof *x->slot);
    if (!x->slot) return dx_errf(DX_ENOMEM, "bpe_train: index of %zu slots", cap);
    memset(x->slot, 0xFF, cap * sizeof *x->slot);
    x->mask = cap - 1;
    return 0;
}

/* Doubles the index; hash(i) gives the hash of dense entry i. */
static int index_grow(bt_index *x, size_t n, uint64_t (*hash)(const bt *, size_t), const bt *b)
{
    bt_index nx;
    if (index_init(&nx, (x->mask + 1) * 2))
        return dx_errf(DX_ENOMEM, "bpe_train: index of %zu slots", (x->mask + 1) * 2);
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)hash(b, i) & nx.mask;
        while (nx.slot[h] >= 0) h = (h + 1) & nx.mask;
        nx.slot[h] = (int32_t)i;
    }
    dx_free(x->slot);
    *x = nx;
    return 0;
}

static int grow_array(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 256;
    while (nc < need) nc *= 2;
    void *q = dx_realloc(*p, nc * elem);
    if (!q) return dx_errf(DX_ENOMEM, "bpe_train: array of %zu", nc);
    *p = q;
    *cap = nc;
    return 0;
}

/* ---- words --------------------------------------------------------------------------------- */

static uint64_t word_hash(const bt *b, size_t i)
{
    return XXH3_64bits(b->wbytes.data + b->words[i].off, b->words[i].n);
}

static int add_word(void *ctx, const char *piece, size_t len)
{
    bt *b = ctx;
    size_t h = (size_t)XXH3_64bits(piece, len) & b->widx.mask;
    for (; b->widx.slot[h] >= 0; h = (h + 1) & b->widx.mask) {
        bt_word *w = &b->words[b->widx.slot[h]];
        if (w->n == len && memcmp(b->wbytes.data + w->off, piece, len) == 0) {
            w->count++;
            return 0;
        }
    }
    if (b->wbytes.len + len > INT32_MAX) return dx_errf(DX_ETOOBIG, "bpe_train: corpus too large");
    if (grow_array((void **)&b->words, &b->capwords, b->nwords + 1, sizeof *b->words))
        return dx_errf(DX_ENOMEM, "bpe_train: %zu words", b->nwords + 1);
    b->words[b->nwords] = (bt_word){
        .off = (uint32_t)b->wbytes.len, .n = (uint32_t)len, .nsym = (uint32_t)len, .count = 1};
    if (dx_buf_append(&b->wbytes, piece, len)) return dx_errf(DX_ENOMEM, "bpe_train: word bytes");
    b->widx.slot[h] = (int32_t)b->nwords++;
    if (b->nwords * 2 > b->widx.mask + 1) return index_grow(&b->widx, b->nwords, word_hash, b);
    return 0;
}

/* ---- symbols ------------------------------------------------------------------------------- */

static uint64_t sym_hash(const bt *b, size_t i)
{
    return XXH3_64bits(b->sbytes.data + b->soff[i], b->slen[i]);
}

/* Finds the symbol spelled s, DX_NONE if none; *slot gets where to insert it. */
static int32_t sym_find(const bt *b, const char *s, size_t len, size_t *slot)
{
    size_t h = (size_t)XXH3_64bits(s, len) & b->sidx.mask;
    for (; b->sidx.slot[h] >= 0; h = (h + 1) & b->sidx.mask) {
        int32_t i = b->sidx.slot[h];
        if (b->slen[i] == len && memcmp(b->sbytes.data + b->soff[i], s, len) == 0) return i;
    }
    *slot = h;
    return DX_NONE;
}

static int sym_add(bt *b, const char *s, size_t len, size_t slot)
{
    size_t need = b->nsym + 1, c1 = b->capsym, c2 = b->capsym;
    if (grow_array((void **)&b->soff, &c1, need, sizeof *b->soff) ||
        grow_array((void **)&b->slen, &c2, need, sizeof *b->slen))
        return dx_errf(DX_ENOMEM, "bpe_train: %zu symbols", need);
    b->capsym = c1 < c2 ? c1 : c2;
    b->soff[b->nsym] = (uint32_t)b->sbytes.len;
    b->slen[b->nsym] = (uint32_t)len;
    if (dx_buf_append(&b->sbytes, s, len)) return dx_errf(DX_ENOMEM, "bpe_train: symbol bytes");
    b->sidx.slot[slot] = (int32_t)b->nsym++;
    if (b->nsym * 2 > b->sidx.mask + 1) return index_grow(&b->sidx, b->nsym, sym_hash, b);
    return 0;
}

/* ---- pairs --------------------------------------------------------------------------------- */

static uint64_t pair_key_hash(int32_t a, int32_t c)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)c;
    return XXH3_64bits(&key, sizeof key);
}

static uint64_t pair_hash(const bt *b, size_t i)
{
    return pair_key_hash(b->pairs[i].a, b->pairs[i].b);
}

static int pair_add(bt *b, int32_t x, int32_t y, int64_t d)
{
    size_t h = (size_t)pair_key_hash(x, y) & b->pidx.mask;
    for (; b->pidx.slot[h] >= 0; h = (h + 1) & b->pidx.mask) {
        bt_pair *p = &b->pairs[b->pidx.slot[h]];
        if (p->a == x && p->b == y) {
            p->count += d;
            return 0;
        }
    }
    DX_ASSERT(d > 0); /* only pairs already counted are ever removed */
    if (grow_array((void **)&b->pairs, &b->cappairs, b->npairs + 1, sizeof *b->pairs))
        return dx_errf(DX_ENOMEM, "bpe_train: %zu pairs", b->npairs + 1);
    b->pairs[b->npairs] = (bt_pair){.a = x, .b = y, .count = d};
    b->pidx.slot[h] = (int32_t)b->npairs++;
    if (b->npairs * 2 > b->pidx.mask + 1) return index_grow(&b->pidx, b->npairs, pair_hash, b);
    return 0;
}

static int word_pairs(bt *b, const bt_word *w, int64_t sign)
{
    const int32_t *s = b->syms + w->off;
    for (uint32_t i = 0; i + 1 < w->nsym; i++) {
        int rc = pair_add(b, s[i], s[i + 1], sign * w->count);
        if (rc) return rc;
    }
    return 0;
}

static int str_cmp(const bt *b, int32_t x, int32_t y)
{
    size_t lx = b->slen[x], ly = b->slen[y];
    int c = memcmp(b->sbytes.data + b->soff[x], b->sbytes.data + b->soff[y], lx < ly ? lx : ly);
    return c ? c : (lx > ly) - (lx < ly);
}

/* Is pair p better than pair q (higher count, then lower strings)? */
static int pair_better(const bt *b, const bt_pair *p, const bt_pair *q)
{
    if (p->count != q->count) return p->count > q->count;
    int c = str_cmp(b, p->a, q->a);
    return c ? c < 0 : str_cmp(b, p->b, q->b) < 0;
}

static bt_pair *best_pair(bt *b)
{
    bt_pair *best = NULL;
    for (size_t i = 0; i < b->npairs; i++) {
        bt_pair *p = &b->pairs[i];
        if (p->count >= 2 && !p->skip && (!best || pair_better(b, p, best))) best = p;
    }
    return best;
}

/* Replaces every (x, y) in the words by z, updating the pair counts. */
static int apply_merge(bt *b, int32_t x, int32_t y, int32_t z)
{
    for (size_t wi = 0; wi < b->nwords; wi++) {
        bt_word *w = &b->words[wi];
        int32_t *s = b->syms + w->off;
        uint32_t i = 0;
        while (i + 1 < w->nsym && !(s[i] == x && s[i + 1] == y)) i++;
        if (i + 1 >= w->nsym) continue;
        int rc = word_pairs(b, w, -1);
        if (rc) return rc;
        uint32_t o = i;
        while (i < w->nsym) {
            if (i + 1 < w->nsym && s[i] == x && s[i + 1] == y) {
                s[o++] = z;
                i += 2;
            } else {
                s[o++] = s[i++];
            }
        }
        w->nsym = o;
        rc = word_pairs(b, w, +1);
        if (rc) return rc;
    }
    return 0;
}

/* ---- driver -------------------------------------------------------------------------------- */

static void bt_free(bt *b)
{
    dx_buf_free(&b->wbytes);
    dx_buf_free(&b->sbytes);
    dx_free(b->words);
    dx_free(b->widx.slot);
    dx_free(b->syms);
    dx_free(b->soff);
    dx_free(b->slen);
    dx_free(b->sidx.slot);
    dx_free(b->pairs);
    dx_free(b->pidx.slot);
}

static int bt_init(bt *b, const char *corpus, size_t len, enum tok_pre pre)
{
    dx_buf_init(&b->wbytes, 0);
    dx_buf_init(&b->sbytes, 0);
    if (index_init(&b->widx, 1024) || index_init(&b->sidx, 1024) || index_init(&b->pidx, 1024))
        return dx_errf(DX_ENOMEM, "bpe_train: indexes");
    tok_regex *re;
    int rc = tok_regex_create(pre, &re);
    if (rc) return rc;
    rc = tok_split(re, corpus, len, add_word, b);
    tok_regex_destroy(re);
    if (rc) return rc;
    b->syms = dx_malloc((b->wbytes.len ? b->wbytes.len : 1) * sizeof *b->syms);
    if (!b->syms)
        return dx_errf(DX_ENOMEM, "bpe_train: symbols of a %zu-byte corpus", b->wbytes.len);
    for (size_t i = 0; i < b->wbytes.len; i++) b->syms[i] = (uint8_t)b->wbytes.data[i];
    /* symbol c is byte c, so a word's initial symbols are its bytes */
    for (unsigned c = 0; c < 256; c++) {
        char ch = (char)c;
        size_t slot;
        DX_ASSERT(sym_find(b, &ch, 1, &slot) < 0);
        if ((rc = sym_add(b, &ch, 1, slot))) return rc;
    }
    for (size_t wi = 0; wi < b->nwords; wi++)
        if ((rc = word_pairs(b, &b->words[wi], +1))) return rc;
    return 0;
}

/* Byte-level form of symbol i, or of "i j" when j >= 0, as a new string. */
static char *sym_bl(const bt *b, int32_t i, int32_t j)
{
    size_t li = b->slen[i], lj = j >= 0 ? b->slen[j] : 0;
    char *s = dx_malloc(2 * (li + lj) + 2);
    if (!s) return NULL;
    size_t o = tok_bytes_to_bl((const uint8_t *)b->sbytes.data + b->soff[i], li, s);
    if (j >= 0) {
        s[o++] = ' ';
        o += tok_bytes_to_bl((const uint8_t *)b->sbytes.data + b->soff[j], lj, s + o);
    }
    s[o] = '\0';
    return s;
}

/* Learns one merge; *done set when no pair qualifies. */
static int learn_one(bt *b, bpe_vocab *out, int *done)
{
    for (;;) {
        bt_pair *p = best_pair(b);
        if (!p) {
            *done = 1;
            return 0;
        }
        int32_t x = p->a, y = p->b;
        size_t lx = b->slen[x], ly = b->slen[y], slot;
        char *cat = dx_malloc(lx + ly);
        if (!cat) return dx_errf(DX_ENOMEM, "bpe_train: merge of %zu bytes", lx + ly);
        memcpy(cat, b->sbytes.data + b->soff[x], lx);
        memcpy(cat + lx, b->sbytes.data + b->soff[y], ly);
        int32_t found = sym_find(b, cat, lx + ly, &slot);
        int rc = found >= 0 ? 0 : sym_add(b, cat, lx + ly, slot);
        dx_free(cat);
        if (rc) return rc;
        if (found >= 0) {
            p->skip = 1;
            continue;
        }
        int32_t z = (int32_t)b->nsym - 1;
        char *merge = sym_bl(b, x, y), *token = sym_bl(b, z, -1);
        if (!merge || !token) {
            dx_free(merge);
            dx_free(token);
            return dx_errf(DX_ENOMEM, "bpe_train: merge text");
        }
        out->merges[out->n_merges++] = merge;
        out->tokens[out->n_tokens++] = token;
        return apply_merge(b, x, y, z);
    }
}

int bpe_train(const char *corpus, size_t len, enum tok_pre pre, size_t n_merges, bpe_vocab *out)
{
    memset(out, 0, sizeof *out);
    if (!corpus && len) return dx_errf(DX_EINVAL, "bpe_train: NULL corpus of %zu bytes", len);
    if (n_merges > (size_t)INT32_MAX - 256)
        return dx_errf(DX_ETOOBIG, "bpe_train: %zu merges is too many", n_merges);
    bt b = {0};
    out->tokens = dx_calloc(256 + n_merges, sizeof *out->tokens);
    out->merges = dx_calloc(n_merges ? n_merges : 1, sizeof *out->merges);
    int rc = out->tokens && out->merges ? bt_init(&b, corpus, len, pre)
                                        : dx_errf(DX_ENOMEM, "bpe_train: %zu merges", n_merges);
    for (int32_t c = 0; !rc && c < 256; c++) {
        out->tokens[out->n_tokens] = sym_bl(&b, c, -1);
        if (!out->tokens[out->n_tokens++]) rc = dx_errf(DX_ENOMEM, "bpe_train: byte tokens");
    }
    int done = 0;
    for (size_t m = 0; !rc && !done && m < n_merges; m++) rc = learn_one(&b, out, &done);
    bt_free(&b);
    if (rc) {
        if (rc == DX_ENOMEM) dx_errf(rc, "bpe_train: out of memory");
        bpe_vocab_free(out);
    }
    return rc;
}

void bpe_vocab_free(bpe_vocab *v)
{
    if (v->tokens)
        for (size_t i = 0; i < v->n_tokens; i++) dx_free(v->tokens[i]);
    if (v->merges)
        for (size_t i = 0; i < v->n_merges; i++) dx_free(v->merges[i]);
    dx_free(v->tokens);
    dx_free(v->merges);
    memset(v, 0, sizeof *v);
}
