/* tok: byte-level BPE tokenizer (GPT-2 / Qwen2 / Llama 3 style).
 *
 * Layout: every token string is copied into one blob at create; two
 * open-addressing tables (hashed with xxHash) map a byte-level string to its
 * id and a (left id, right id) pair to (merge rank, merged id).  After create
 * the tok is immutable, so any number of threads may encode and decode with
 * it at once; every call keeps its scratch to itself (stack for short pieces,
 * dx_malloc for long ones).
 *
 * Encoding: optional special-token matching (TOK_ALLOW_SPECIAL, longest
 * match first at each position), then the pre-tokenizer regex (PCRE2,
 * UTF + UCP, JIT when available), then BPE per piece: the lowest-rank
 * adjacent pair is merged first, the leftmost among equals, using a binary
 * heap over a linked list of symbols so that even a megabyte-long piece
 * costs O(n log n).  For "llama-bpe" a piece that is itself a vocabulary
 * token is emitted whole (Llama 3's ignore_merges, as llama.cpp does).
 *
 * Invalid UTF-8: the text is cut into maximal valid UTF-8 runs (strict:
 * no overlongs, no surrogates, nothing above U+10FFFF); only valid runs go
 * through the regex, and every byte outside them is a piece of its own,
 * which encodes to that byte's token.  Every byte has a token (checked at
 * create) and decoding maps tokens back to their bytes, so
 * decode(encode(s)) == s for ANY byte string.
 *
 * Special tokens (control, user-defined) and unknown/unused ones decode to
 * their vocabulary text as is; normal and byte tokens must be valid
 * byte-level strings and decode through the inverse GPT-2 map.
 *
 * Which special tokens are matched: user-defined ones always and control
 * ones only with TOK_ALLOW_SPECIAL, as llama.cpp's parse_special and
 * Hugging Face's split_special_tokens decide it.  With a normalizer (NFC),
 * each stretch between matched tokens is normalised first (tok_norm.c). */
#include "tok/tok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_utf8.h"
#include "base/dx_err.h"
#include "tok/tok_priv.h"
#include "tok/tok_norm.h"

/* ---- GPT-2 byte <-> code point map ---------------------------------------------------------- */

/* Bytes that GPT-2 keeps as their own code point: '!'..'~', 0xA1..0xAC,
 * 0xAE..0xFF.  The other 68 map to 256, 257, ... in byte order. */
static int byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tok_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b)) return b;
    if (b <= 0x20) return 256u + b;                              /* 33 bytes 0x00..0x20 */
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu); /* 34 bytes */
    return 256u + 67u;                                           /* 0xAD */
}

/* Inverse of tok_byte_to_cp; DX_NONE for a code point outside the map. */
static int cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : DX_NONE;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(0x7F + cp - 256 - 33);
    if (cp == 256 + 67) return 0xAD;
    return DX_NONE;
}

size_t tok_bytes_to_bl(const uint8_t *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        /* through u: out has room for 2 bytes a byte (every mapped code
         * point is below U+0144), not for the 4 the encoder may write */
        uint8_t u[4];
        size_t k = dx_utf8_encode(tok_byte_to_cp(in[i]), u);
        for (size_t j = 0; j < k; j++) out[o++] = (char)u[j];
    }
    return o;
}

/* Decodes a byte-level string into raw bytes (out has room for len bytes);
 * returns the byte count or DX_NONE if s is not a valid byte-level string. */
static long bl_to_bytes(const char *s, size_t len, uint8_t *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = dx_utf8_decode((const uint8_t *)s + i, len - i, &cp);
        if (!k || k > 2) return DX_NONE; /* the map only produces 1- and 2-byte sequences */
        i += k;
        int b = cp_to_byte(cp);
        if (b < 0) return DX_NONE;
        out[o++] = (uint8_t)b;
    }
    return (long)o;
}

/* ---- pre-tokenizer regex ------------------------------------------------------------------- */

/* Both as llama.cpp runs them: the tokenizer.json patterns with the
 * case-insensitive contractions spelled out, so that PCRE2's Unicode case
 * folding (e.g. U+017F LONG S ~ 's') cannot widen them.  Qwen2 splits
 * numbers into single digits, Llama 3 into groups of up to three. */
#define TOK_RE_HEAD                                                                                \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define TOK_RE_TAIL " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const char re_qwen2[] = TOK_RE_HEAD "\\p{N}|" TOK_RE_TAIL;
static const char re_llama3[] = TOK_RE_HEAD "\\p{N}{1,3}|" TOK_RE_TAIL;

struct tok_regex {
    pcre2_general_context *gctx;
    pcre2_code *code;
    int jit; /* pcre2_jit_compile succeeded */
};

static void *re_malloc(size_t n, void *ud)
{
    (void)ud;
    return dx_malloc(n);
}

static void re_free(void *p, void *ud)
{
    (void)ud;
    dx_free(p);
}

int tok_pre_parse(const char *name, size_t len, enum tok_pre *out)
{
    static const struct {
        const char *name;
        enum tok_pre pre;
    } names[] = {
        {"qwen2", TOK_PRE_QWEN2}, {"llama-bpe", TOK_PRE_LLAMA3}, {"llama3", TOK_PRE_LLAMA3}};
    for (size_t i = 0; i < DX_ARRAY_LEN(names); i++) {
        if (strlen(names[i].name) == len && memcmp(names[i].name, name, len) == 0) {
            *out = names[i].pre;
            return 0;
        }
    }
    int shown = len > 64 ? 64 : (int)len;
    return dx_errf(DX_EUNSUPPORTED,
                   "tokenizer pre-tokenizer '%.*s%s' is not supported (qwen2, llama-bpe, llama3)",
                   shown, name, len > 64 ? "..." : "");
}

const char *tok_pre_name(enum tok_pre p)
{
    return p == TOK_PRE_LLAMA3 ? "llama-bpe" : "qwen2";
}

const char *tok_pre_regex(enum tok_pre p)
{
    return p == TOK_PRE_LLAMA3 ? re_llama3 : re_qwen2;
}

int tok_regex_create(enum tok_pre pre, tok_regex **out)
{
    *out = NULL;
    tok_regex *re = dx_calloc(1, sizeof *re);
    if (!re) return dx_errf(DX_ENOMEM, "tokenizer: regex");
    re->gctx = pcre2_general_context_create(re_malloc, re_free, NULL);
    pcre2_compile_context *cctx = re->gctx ? pcre2_compile_context_create(re->gctx) : NULL;
    if (!cctx) {
        tok_regex_destroy(re);
        return dx_errf(DX_ENOMEM, "tokenizer: out of memory compiling the pre-tokenizer");
    }
    int err;
    PCRE2_SIZE erroff;
    re->code = pcre2_compile((PCRE2_SPTR)tok_pre_regex(pre), PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP, &err, &erroff, cctx);
    pcre2_compile_context_free(cctx);
    if (!re->code) {
        /* The patterns are constants that the tests compile, so only memory
         * can fail here; pcre2's own words say which. */
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(err, msg, sizeof msg);
        tok_regex_destroy(re);
        return dx_errf(DX_ENOMEM, "tokenizer: compiling the %s pre-tokenizer at %zu: %s",
                       tok_pre_name(pre), (size_t)erroff, (const char *)msg);
    }
    /* Without JIT (unsupported platform, no executable memory) the
     * interpreter gives the same matches, only slower. */
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    *out = re;
    return 0;
}

void tok_regex_destroy(tok_regex *re)
{
    if (!re) return;
    pcre2_code_free(re->code);
    pcre2_general_context_free(re->gctx);
    dx_free(re);
}

/* Splits one valid UTF-8 run with the regex. */
static int split_valid(const tok_regex *re, pcre2_match_data *md, const char *s, size_t n,
                       tok_piece_fn fn, void *ctx)
{
    PCRE2_SPTR subj = (PCRE2_SPTR)s;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t off = 0;
    while (off < n) {
        int rc = re->jit ? pcre2_jit_match(re->code, subj, n, off, 0, md, NULL)
                         : pcre2_match(re->code, subj, n, off, PCRE2_NO_UTF_CHECK, md, NULL);
        size_t start, end;
        if (rc > 0 && ov[0] >= off && ov[1] > ov[0] && ov[1] <= n) {
            start = ov[0];
            end = ov[1];
        } else {
            /* The patterns match every character, so this is only reached on
             * a resource limit; one character per piece keeps going, and
             * still concatenates to the text. */
            start = off;
            end = off + dx_utf8_seq_len((const uint8_t *)s + off, n - off);
        }
        if (start > off) {
            int r = fn(ctx, s + off, start - off);
            if (r) return r;
        }
        int r = fn(ctx, s + start, end - start);
        if (r) return r;
        off = end;
    }
    return 0;
}

int tok_split(const tok_regex *re, const char *text, size_t len, tok_piece_fn fn, void *ctx)
{
    pcre2_match_data *md = pcre2_match_data_create(1, re->gctx);
    if (!md) return dx_errf(DX_ENOMEM, "tokenizer: out of memory for regex match data");
    const uint8_t *u = (const uint8_t *)text;
    size_t i = 0;
    int rc = 0;
    while (i < len && rc == 0) {
        size_t run = dx_utf8_valid_prefix(u + i, len - i);
        if (run == 0) { /* an invalid byte: a piece of its own */
            rc = fn(ctx, text + i, 1);
            i++;
        } else {
            rc = split_valid(re, md, text + i, run, fn, ctx);
            i += run;
        }
    }
    pcre2_match_data_free(md);
    return rc;
}

/* ---- the tokenizer ------------------------------------------------------------------------- */

typedef struct {
    uint32_t off, len;         /* byte-level string in blob */
    uint32_t raw_off, raw_len; /* decoded bytes in raw */
} tok_ent;

typedef struct {
    uint64_t key; /* left << 32 | right; PAIR_EMPTY if free */
    int32_t rank;
    int32_t id; /* merged token */
} tok_pair;

#define PAIR_EMPTY  UINT64_MAX
#define TOK_MAX_EOG 32

struct tok {
    enum tok_pre pre;
    size_t n;
    size_t max_raw; /* longest decoded normal token */
    tok_ent *ent;   /* [n] */
    uint8_t *type;  /* [n] */
    char *blob;     /* byte-level strings, back to back */
    uint8_t *raw;   /* decoded bytes, back to back */
    int32_t *slots; /* [str_mask + 1] string -> id, -1 free */
    size_t str_mask;
    tok_pair *pairs; /* [pair_mask + 1] */
    size_t pair_mask;
    int32_t byte_id[256];
    int32_t *spec;         /* special ids by first byte, then longest first */
    uint32_t spec_at[257]; /* spec[spec_at[b] .. spec_at[b+1]) start with byte b */
    tok_regex *re;
    int32_t bos, eos, eot;
    int add_bos, add_eos;
    enum tok_norm norm;
    size_t n_user;            /* user-defined tokens in spec: matched always */
    int32_t eog[TOK_MAX_EOG]; /* end-of-generation ids, ascending */
    size_t n_eog;
};

static int type_is_special(int ty)
{
    return ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED;
}

/* Types whose text is taken literally rather than through the byte map. */
static int type_is_literal(int ty)
{
    return ty != TOK_TYPE_NORMAL && ty != TOK_TYPE_BYTE;
}

static size_t table_size(size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    return cap;
}

static uint64_t hash_str(const char *s, size_t len)
{
    return XXH3_64bits(s, len);
}

/* The merge table is probed for every adjacent pair of every piece: a
 * 64-bit mix (murmur3's finaliser) inlines where a library hash call would
 * not, and spreads the (left, right) id pairs as well. */
static inline uint64_t hash_pair(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

static int32_t str_lookup(const tok *t, const char *s, size_t len)
{
    size_t h = (size_t)hash_str(s, len) & t->str_mask;
    for (;; h = (h + 1) & t->str_mask) {
        int32_t id = t->slots[h];
        if (id < 0) return DX_NONE;
        if (t->ent[id].len == len && memcmp(t->blob + t->ent[id].off, s, len) == 0) return id;
    }
}

static const tok_pair *pair_lookup(const tok *t, int32_t l, int32_t r)
{
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    size_t h = (size_t)hash_pair(key) & t->pair_mask;
    for (;; h = (h + 1) & t->pair_mask) {
        const tok_pair *p = &t->pairs[h];
        if (p->key == key) return p;
        if (p->key == PAIR_EMPTY) return NULL;
    }
}

/* Copies the strings and types; checks sizes and type values. */
static int load_tokens(tok *t, const tok_config *cfg)
{
    size_t total = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (!cfg->tokens[i].ptr && cfg->tokens[i].len)
            return dx_errf(DX_EINVAL, "tokenizer: token %zu has no text", i);
        total += cfg->tokens[i].len;
        if (total > UINT32_MAX / 2)
            return dx_errf(DX_ETOOBIG, "tokenizer: vocabulary text over 2 GiB at token %zu", i);
    }
    t->ent = dx_calloc(t->n, sizeof *t->ent);
    t->type = dx_malloc(t->n);
    t->blob = dx_malloc(total + 1);
    t->raw = dx_malloc(total + 1);
    if (!t->ent || !t->type || !t->blob || !t->raw)
        return dx_errf(DX_ENOMEM, "tokenizer: %zu tokens", t->n);
    size_t off = 0;
    for (size_t i = 0; i < t->n; i++) {
        int ty = cfg->token_types ? cfg->token_types[i] : TOK_TYPE_NORMAL;
        if (ty < TOK_TYPE_NORMAL || ty > TOK_TYPE_BYTE)
            return dx_errf(DX_EFORMAT, "tokenizer: token %zu has unknown type %d", i, ty);
        t->type[i] = (uint8_t)ty;
        if (cfg->tokens[i].len) memcpy(t->blob + off, cfg->tokens[i].ptr, cfg->tokens[i].len);
        t->ent[i].off = (uint32_t)off;
        t->ent[i].len = (uint32_t)cfg->tokens[i].len;
        off += cfg->tokens[i].len;
    }
    return 0;
}

/* Builds the decoded form of every token; byte-level tokens must decode. */
static int decode_tokens(tok *t)
{
    size_t off = 0;
    for (size_t i = 0; i < t->n; i++) {
        const char *s = t->blob + t->ent[i].off;
        size_t len = t->ent[i].len;
        long got;
        if (type_is_literal(t->type[i])) {
            memcpy(t->raw + off, s, len);
            got = (long)len;
        } else {
            got = bl_to_bytes(s, len, t->raw + off);
            if (got < 0)
                return dx_errf(DX_EFORMAT, "tokenizer: token %zu '%.*s' is not a byte-level string",
                               i, (int)(len > 64 ? 64 : len), s);
        }
        t->ent[i].raw_off = (uint32_t)off;
        t->ent[i].raw_len = (uint32_t)got;
        if (!type_is_literal(t->type[i]) && (size_t)got > t->max_raw) t->max_raw = (size_t)got;
        off += (size_t)got;
    }
    return 0;
}

static int build_str_map(tok *t)
{
    size_t cap = table_size(t->n);
    t->slots = dx_malloc(cap * sizeof *t->slots);
    if (!t->slots) return dx_errf(DX_ENOMEM, "tokenizer: string map of %zu slots", cap);
    memset(t->slots, 0xFF, cap * sizeof *t->slots);
    t->str_mask = cap - 1;
    for (size_t i = 0; i < t->n; i++) {
        const char *s = t->blob + t->ent[i].off;
        size_t len = t->ent[i].len;
        size_t h = (size_t)hash_str(s, len) & t->str_mask;
        for (; t->slots[h] >= 0; h = (h + 1) & t->str_mask) {
            int32_t o = t->slots[h];
            if (t->ent[o].len == len && memcmp(t->blob + t->ent[o].off, s, len) == 0)
                return dx_errf(DX_EFORMAT, "tokenizer: tokens %d and %zu are both '%.*s'", o, i,
                               (int)(len > 64 ? 64 : len), s);
        }
        t->slots[h] = (int32_t)i;
    }
    return 0;
}

static int find_byte_tokens(tok *t)
{
    for (unsigned b = 0; b < 256; b++) {
        char bl[2];
        uint8_t byte = (uint8_t)b;
        size_t n = tok_bytes_to_bl(&byte, 1, bl);
        int32_t id = str_lookup(t, bl, n);
        if (id < 0) return dx_errf(DX_EFORMAT, "tokenizer: no token for byte 0x%02x", b);
        if (type_is_literal(t->type[id]))
            return dx_errf(DX_EFORMAT, "tokenizer: the token for byte 0x%02x (id %d) has type %d",
                           b, id, t->type[id]);
        t->byte_id[b] = id;
    }
    return 0;
}

/* Resolves merge `rank` "left right" to the pair key (left id, right id)
 * and the merged token's id. */
static int resolve_merge(tok *t, const tok_strview *m, size_t rank, uint64_t *key, int32_t *id)
{
    const char *sp = m->len ? memchr(m->ptr, ' ', m->len) : NULL;
    if (!sp || sp == m->ptr || sp == m->ptr + m->len - 1 ||
        memchr(sp + 1, ' ', (size_t)(m->ptr + m->len - sp - 1)))
        return dx_errf(DX_EFORMAT, "tokenizer: merge %zu '%.*s' is not 'left right'", rank,
                       (int)(m->len > 64 ? 64 : m->len), m->ptr ? m->ptr : "");
    size_t ll = (size_t)(sp - m->ptr), rl = m->len - ll - 1;
    int32_t l = str_lookup(t, m->ptr, ll), r = str_lookup(t, sp + 1, rl);
    if (l < 0 || r < 0)
        return dx_errf(DX_EFORMAT, "tokenizer: merge %zu '%.*s': unknown token '%.*s'", rank,
                       (int)m->len, m->ptr, (int)(l < 0 ? ll : rl), l < 0 ? m->ptr : sp + 1);
    char stackbuf[256];
    char *cat = ll + rl <= sizeof stackbuf ? stackbuf : dx_malloc(ll + rl);
    if (!cat) return dx_errf(DX_ENOMEM, "tokenizer: merge %zu", rank);
    memcpy(cat, m->ptr, ll);
    memcpy(cat + ll, sp + 1, rl);
    *id = str_lookup(t, cat, ll + rl);
    if (cat != stackbuf) dx_free(cat);
    if (*id < 0)
        return dx_errf(DX_EFORMAT, "tokenizer: merge %zu '%.*s': result is not a token", rank,
                       (int)m->len, m->ptr);
    if (type_is_literal(t->type[*id]))
        return dx_errf(DX_EFORMAT, "tokenizer: merge %zu '%.*s' makes special token %d", rank,
                       (int)m->len, m->ptr, *id);
    *key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    return 0;
}

static void insert_merge(tok *t, uint64_t key, int32_t id, size_t rank)
{
    size_t h = (size_t)hash_pair(key) & t->pair_mask;
    for (; t->pairs[h].key != PAIR_EMPTY; h = (h + 1) & t->pair_mask)
        if (t->pairs[h].key == key) return; /* a repeated merge keeps its first rank */
    t->pairs[h] = (tok_pair){.key = key, .rank = (int32_t)rank, .id = id};
}

/* Every lookup and insert here lands on a random cache line of tables of
 * several MB, so merges go in batches: first the string-table slots of
 * their parts are prefetched, then they are resolved, then the pair slots
 * are prefetched and filled.  The misses of a batch overlap instead of
 * queueing (Llama 3's 280k merges load ~2x faster). */
enum { MERGE_BATCH = 32 };

static int build_merges(tok *t, const tok_config *cfg)
{
    size_t cap = table_size(cfg->n_merges);
    t->pairs = dx_malloc(cap * sizeof *t->pairs);
    if (!t->pairs) return dx_errf(DX_ENOMEM, "tokenizer: merge table of %zu slots", cap);
    for (size_t i = 0; i < cap; i++) t->pairs[i].key = PAIR_EMPTY;
    t->pair_mask = cap - 1;
    uint64_t key[MERGE_BATCH];
    int32_t id[MERGE_BATCH];
    for (size_t i = 0; i < cfg->n_merges; i += MERGE_BATCH) {
        size_t k = cfg->n_merges - i < MERGE_BATCH ? cfg->n_merges - i : MERGE_BATCH;
        for (size_t j = 0; j < k; j++) {
            const tok_strview *m = &cfg->merges[i + j];
            const char *sp = m->len ? memchr(m->ptr, ' ', m->len) : NULL;
            if (!sp) continue; /* resolve_merge reports it */
            size_t ll = (size_t)(sp - m->ptr);
            __builtin_prefetch(&t->slots[hash_str(m->ptr, ll) & t->str_mask]);
            __builtin_prefetch(&t->slots[hash_str(sp + 1, m->len - ll - 1) & t->str_mask]);
        }
        for (size_t j = 0; j < k; j++) {
            int rc = resolve_merge(t, &cfg->merges[i + j], i + j, &key[j], &id[j]);
            if (rc) return rc;
            __builtin_prefetch(&t->pairs[hash_pair(key[j]) & t->pair_mask], 1);
        }
        for (size_t j = 0; j < k; j++) insert_merge(t, key[j], id[j], i + j);
    }
    return 0;
}

static int check_id(const tok *t, int32_t id, const char *what)
{
    if (id == -1 || (id >= 0 && (size_t)id < t->n)) return 0;
    return dx_errf(DX_ERANGE, "tokenizer: %s id %d out of range (vocabulary of %zu)", what, id,
                   t->n);
}

static int spec_before(const tok *t, int32_t a, int32_t b)
{
    uint8_t fa = t->raw[t->ent[a].raw_off], fb = t->raw[t->ent[b].raw_off];
    if (fa != fb) return fa < fb;
    if (t->ent[a].raw_len != t->ent[b].raw_len) return t->ent[a].raw_len > t->ent[b].raw_len;
    return a < b;
}

/* Indexes special tokens by first byte, longest first, for matching. */
static int build_specials(tok *t)
{
    size_t ns = 0;
    for (size_t i = 0; i < t->n; i++)
        if (type_is_special(t->type[i]) && t->ent[i].raw_len) ns++;
    t->spec = dx_malloc((ns ? ns : 1) * sizeof *t->spec);
    if (!t->spec) return dx_errf(DX_ENOMEM, "tokenizer: %zu special tokens", ns);
    size_t k = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (!type_is_special(t->type[i]) || !t->ent[i].raw_len) continue;
        /* insertion sort: special tokens are few */
        size_t j = k++;
        while (j > 0 && spec_before(t, (int32_t)i, t->spec[j - 1])) {
            t->spec[j] = t->spec[j - 1];
            j--;
        }
        t->spec[j] = (int32_t)i;
    }
    size_t j = 0;
    for (unsigned b = 0; b < 256; b++) {
        t->spec_at[b] = (uint32_t)j;
        while (j < ns && t->raw[t->ent[t->spec[j]].raw_off] == b) j++;
    }
    t->spec_at[256] = (uint32_t)ns;
    for (size_t i = 0; i < ns; i++) t->n_user += t->type[t->spec[i]] == TOK_TYPE_USER_DEFINED;
    return 0;
}

/* Token texts llama.cpp takes for an end of generation whatever the file's
 * EOS/EOT ids say (llama-vocab.cpp: its EOG list, plus the FIM pad, repo
 * and file-separator tokens it adds to it): a chat model fine-tuned from a
 * base model may end a turn with either family's token. */
static const char *const k_eog_texts[] = {
    "<|eot_id|>",      "<|im_end|>",         "<|end|>",     "<|return|>", "<|call|>",
    "<end_of_turn>",   "<|endoftext|>",      "<|eom_id|>",  "<EOT>",      "_<EOT>",
    "<|end_of_text|>", "<end_of_utterance>", "<|fim_pad|>", "<fim-pad>",  "<fim_pad>",
    "<|fim_repo|>",    "<|repo_name|>",      "<fim-repo>",  "<REPO>",     "<reponame>",
    "<|file_sep|>",    "<file_sep>",
};

static void eog_add(tok *t, int32_t id)
{
    if (id < 0) return;
    size_t i = 0;
    while (i < t->n_eog && t->eog[i] < id) i++;
    if (i < t->n_eog && t->eog[i] == id) return;
    DX_ASSERT(t->n_eog < TOK_MAX_EOG); /* 2 ids + the texts above */
    memmove(t->eog + i + 1, t->eog + i, (t->n_eog - i) * sizeof *t->eog);
    t->eog[i] = id;
    t->n_eog++;
}

/* EOS, EOT and every special token spelled like an end of generation; a
 * normal token with that spelling is ordinary text and stays out. */
static void build_eog(tok *t)
{
    _Static_assert(DX_ARRAY_LEN(k_eog_texts) + 2 <= TOK_MAX_EOG, "eog room");
    eog_add(t, t->eos);
    eog_add(t, t->eot);
    for (size_t i = 0; i < DX_ARRAY_LEN(k_eog_texts); i++) {
        int32_t id = str_lookup(t, k_eog_texts[i], strlen(k_eog_texts[i]));
        if (id >= 0 && type_is_special(t->type[id])) eog_add(t, id);
    }
}

int tok_create(const tok_config *cfg, tok **out)
{
    *out = NULL;
    if (!cfg || (!cfg->tokens && cfg->n_tokens) || (!cfg->merges && cfg->n_merges))
        return dx_errf(DX_EINVAL, "tokenizer: missing tokens or merges");
    if (cfg->n_tokens > INT32_MAX || cfg->n_merges > INT32_MAX)
        return dx_errf(DX_ETOOBIG, "tokenizer: %zu tokens / %zu merges is too many", cfg->n_tokens,
                       cfg->n_merges);
    if (!cfg->n_tokens) return dx_errf(DX_EFORMAT, "tokenizer: empty vocabulary");
    if (cfg->pre != TOK_PRE_QWEN2 && cfg->pre != TOK_PRE_LLAMA3)
        return dx_errf(DX_EINVAL, "tokenizer: unknown pre-tokenizer %d", (int)cfg->pre);
    if (cfg->norm != TOK_NORM_NONE && cfg->norm != TOK_NORM_NFC)
        return dx_errf(DX_EINVAL, "tokenizer: unknown normalizer %d", (int)cfg->norm);
    tok *t = dx_calloc(1, sizeof *t);
    if (!t) return dx_errf(DX_ENOMEM, "tokenizer: out of memory");
    dx_err_clear(); /* so that a bare DX_ENOMEM below gets a message */
    t->pre = cfg->pre;
    t->n = cfg->n_tokens;
    t->bos = cfg->bos;
    t->eos = cfg->eos;
    t->eot = cfg->eot;
    t->add_bos = !!cfg->add_bos;
    t->add_eos = !!cfg->add_eos;
    t->norm = cfg->norm;
    int rc = load_tokens(t, cfg);
    if (!rc) rc = build_str_map(t);
    if (!rc) rc = decode_tokens(t);
    if (!rc) rc = find_byte_tokens(t);
    if (!rc) rc = build_merges(t, cfg);
    if (!rc) rc = check_id(t, t->bos, "bos");
    if (!rc) rc = check_id(t, t->eos, "eos");
    if (!rc) rc = check_id(t, t->eot, "eot");
    if (!rc && t->add_bos && t->bos < 0)
        rc = dx_errf(DX_EFORMAT, "tokenizer: add_bos_token is set but there is no bos token");
    if (!rc && t->add_eos && t->eos < 0)
        rc = dx_errf(DX_EFORMAT, "tokenizer: add_eos_token is set but there is no eos token");
    if (!rc) rc = build_specials(t);
    if (!rc) build_eog(t);
    if (!rc && t->norm != TOK_NORM_NONE) tok_norm_init();
    if (!rc) rc = tok_regex_create(t->pre, &t->re);
    if (rc) {
        if (rc == DX_ENOMEM && dx_errcode() != DX_ENOMEM)
            dx_errf(DX_ENOMEM, "tokenizer: out of memory building a %zu-token vocabulary", t->n);
        tok_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tok_destroy(tok *t)
{
    if (!t) return;
    tok_regex_destroy(t->re);
    dx_free(t->ent);
    dx_free(t->type);
    dx_free(t->blob);
    dx_free(t->raw);
    dx_free(t->slots);
    dx_free(t->pairs);
    dx_free(t->spec);
    dx_free(t);
}

/* ---- id vectors ---------------------------------------------------------------------------- */

void tok_ids_init(tok_ids *v)
{
    v->ids = NULL;
    v->n = v->cap = 0;
}

void tok_ids_free(tok_ids *v)
{
    dx_free(v->ids);
    tok_ids_init(v);
}

int tok_ids_push(tok_ids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = dx_realloc(v->ids, cap * sizeof *p);
        if (!p) return dx_errf(DX_ENOMEM, "tokenizer: out of memory for %zu token ids", cap);
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return 0;
}

/* ---- BPE ----------------------------------------------------------------------------------- */

/* A candidate merge of symbol `left` with the symbol after it.  It is stale
 * once left died, left's next changed, or the right symbol grew (rid). */
typedef struct {
    int32_t rank, id, left, right, rid;
} bpe_cand;

/* The symbols of one word as a doubly linked list by position (prev/next
 * are indexes into parallel arrays, not base/dx_list): positions are what
 * the candidates name, and three flat arrays need no per-symbol node. */
typedef struct {
    int32_t *sym;  /* [n] token id, -1 once merged into its left neighbour */
    int32_t *prev; /* [n] */
    int32_t *next; /* [n], n = none */
    bpe_cand *heap;
    size_t nheap;
} bpe_work;

static int cand_less(const bpe_cand *a, const bpe_cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(bpe_work *w, bpe_cand c)
{
    size_t i = w->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static bpe_cand heap_pop(bpe_work *w)
{
    bpe_cand top = w->heap[0], last = w->heap[--w->nheap];
    size_t i = 0, n = w->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!cand_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static void try_pair(const tok *t, bpe_work *w, int32_t l, int32_t r, int32_t n)
{
    if (l < 0 || r >= n) return;
    const tok_pair *p = pair_lookup(t, w->sym[l], w->sym[r]);
    if (p)
        heap_push(
            w, (bpe_cand){.rank = p->rank, .id = p->id, .left = l, .right = r, .rid = w->sym[r]});
}

/* Merges the n byte symbols in w by rank; the heap holds at most 3n
 * candidates (n-1 initial, two per merge). */
static void bpe_run(const tok *t, bpe_work *w, int32_t n)
{
    for (int32_t i = 0; i + 1 < n; i++) try_pair(t, w, i, i + 1, n);
    while (w->nheap) {
        bpe_cand c = heap_pop(w);
        if (w->sym[c.left] < 0 || w->next[c.left] != c.right || w->sym[c.right] != c.rid) continue;
        w->sym[c.left] = c.id;
        w->sym[c.right] = -1;
        int32_t nx = w->next[c.right];
        w->next[c.left] = nx;
        if (nx < n) w->prev[nx] = c.left;
        try_pair(t, w, w->prev[c.left], c.left, n);
        try_pair(t, w, c.left, nx, n);
    }
}

enum { ENC_STACK_SYMS = 128 };

typedef struct {
    const tok *t;
    tok_ids *out;
    void *heap_mem; /* scratch for pieces over ENC_STACK_SYMS, grown as needed */
    size_t heap_syms;
    dx_buf norm; /* the normalised stretch of text, reused */
} enc_ctx;

static size_t work_bytes(size_t n)
{
    return n * 3 * sizeof(int32_t) + n * 3 * sizeof(bpe_cand);
}

static void work_carve(bpe_work *w, void *mem, size_t n)
{
    w->heap = mem; /* bpe_cand first: it has the strictest alignment */
    w->sym = (int32_t *)(w->heap + 3 * n);
    w->prev = w->sym + n;
    w->next = w->prev + n;
    w->nheap = 0;
}

static int emit_bpe(enc_ctx *e, const uint8_t *p, size_t n, void *mem)
{
    bpe_work w;
    work_carve(&w, mem, n);
    for (size_t i = 0; i < n; i++) {
        w.sym[i] = e->t->byte_id[p[i]];
        w.prev[i] = (int32_t)i - 1;
        w.next[i] = (int32_t)i + 1;
    }
    bpe_run(e->t, &w, (int32_t)n);
    for (int32_t i = 0; i < (int32_t)n; i = w.next[i]) {
        int rc = tok_ids_push(e->out, w.sym[i]);
        if (rc) return rc;
    }
    return 0;
}

/* Llama 3 (ignore_merges): a piece that is a whole normal token is kept.
 * Returns the id, DX_NONE if the piece is not one, DX_ENOMEM. */
static int32_t whole_piece_token(const tok *t, const uint8_t *p, size_t n)
{
    char stackbuf[2 * ENC_STACK_SYMS];
    if (n > t->max_raw) return DX_NONE;
    char *bl = n <= ENC_STACK_SYMS ? stackbuf : dx_malloc(2 * n);
    if (!bl) return dx_errf(DX_ENOMEM, "tokenizer: out of memory for a %zu-byte piece", n);
    int32_t id = str_lookup(t, bl, tok_bytes_to_bl(p, n, bl));
    if (bl != stackbuf) dx_free(bl);
    return id >= 0 && !type_is_literal(t->type[id]) ? id : DX_NONE;
}

static int encode_piece(void *ctx, const char *piece, size_t n)
{
    enc_ctx *e = ctx;
    const uint8_t *p = (const uint8_t *)piece;
    if (n == 1) return tok_ids_push(e->out, e->t->byte_id[p[0]]);
    if (e->t->pre == TOK_PRE_LLAMA3) {
        int32_t id = whole_piece_token(e->t, p, n);
        if (id >= 0) return tok_ids_push(e->out, id);
        if (id != DX_NONE) return id; /* out of memory */
    }
    if (n <= ENC_STACK_SYMS) {
        bpe_cand mem[ENC_STACK_SYMS * 3 + ENC_STACK_SYMS]; /* room for sym/prev/next too */
        _Static_assert(sizeof(bpe_cand) >= 3 * sizeof(int32_t), "scratch layout");
        return emit_bpe(e, p, n, mem);
    }
    if (n > INT32_MAX / 4) return dx_errf(DX_ETOOBIG, "tokenizer: a %zu-byte piece", n);
    if (n > e->heap_syms) {
        void *m = dx_realloc(e->heap_mem, work_bytes(n));
        if (!m) return dx_errf(DX_ENOMEM, "tokenizer: out of memory for a %zu-byte piece", n);
        e->heap_mem = m;
        e->heap_syms = n;
    }
    return emit_bpe(e, p, n, e->heap_mem);
}

/* The longest special token starting at s, or DX_NONE; control tokens only
 * when allowed. */
static int32_t match_special(const tok *t, const char *s, size_t n, int allow_control)
{
    uint8_t b = (uint8_t)s[0];
    for (uint32_t k = t->spec_at[b]; k < t->spec_at[b + 1]; k++) {
        const tok_ent *en = &t->ent[t->spec[k]];
        if (!allow_control && t->type[t->spec[k]] != TOK_TYPE_USER_DEFINED) continue;
        if (en->raw_len <= n && memcmp(t->raw + en->raw_off, s, en->raw_len) == 0)
            return t->spec[k];
    }
    return DX_NONE;
}

/* A stretch of text without special tokens: normalised when the vocabulary
 * asks (Hugging Face normalises each stretch between added tokens on its
 * own), then split and merged. */
static int encode_text(enc_ctx *e, const char *s, size_t n)
{
    const tok *t = e->t;
    if (!tok_norm_needed(t->norm, s, n)) return tok_split(t->re, s, n, encode_piece, e);
    dx_buf_reset(&e->norm);
    int rc = tok_norm_apply(t->norm, s, n, &e->norm);
    return rc ? rc : tok_split(t->re, e->norm.data, e->norm.len, encode_piece, e);
}

static int encode_specials(enc_ctx *e, const char *text, size_t len, int allow_control)
{
    const tok *t = e->t;
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        uint8_t b = (uint8_t)text[i];
        int32_t id = t->spec_at[b] != t->spec_at[b + 1]
                         ? match_special(t, text + i, len - i, allow_control)
                         : DX_NONE;
        if (id < 0) {
            i++;
            continue;
        }
        int rc = encode_text(e, text + seg, i - seg);
        if (!rc) rc = tok_ids_push(e->out, id);
        if (rc) return rc;
        i += t->ent[id].raw_len;
        seg = i;
    }
    return encode_text(e, text + seg, len - seg);
}

int tok_encode(const tok *t, const char *text, size_t len, unsigned flags, tok_ids *out)
{
    if (!text && len) return dx_errf(DX_EINVAL, "tokenizer: NULL text of %zu bytes", len);
    enc_ctx e = {.t = t, .out = out};
    dx_buf_init(&e.norm, 0);
    size_t start = out->n;
    int allow = !!(flags & TOK_ALLOW_SPECIAL), add = !!(flags & TOK_ADD_SPECIAL);
    int rc = add && t->add_bos ? tok_ids_push(out, t->bos) : 0;
    if (!rc)
        rc = allow || t->n_user ? encode_specials(&e, text ? text : "", len, allow)
                                : encode_text(&e, text ? text : "", len);
    if (!rc && add && t->add_eos) rc = tok_ids_push(out, t->eos);
    dx_free(e.heap_mem);
    dx_buf_free(&e.norm);
    if (rc) out->n = start; /* all or nothing */
    return rc;
}

/* ---- decoding and accessors ---------------------------------------------------------------- */

int tok_decode(const tok *t, const int32_t *ids, size_t n, dx_buf *out)
{
    size_t start = out->len;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= t->n) {
            out->len = start;
            if (out->data) out->data[start] = '\0';
            return dx_errf(DX_ERANGE, "tokenizer: id %d at %zu out of range (vocabulary of %zu)",
                           ids[i], i, t->n);
        }
        const tok_ent *en = &t->ent[ids[i]];
        int rc = dx_buf_append(out, t->raw + en->raw_off, en->raw_len);
        if (rc) {
            out->len = start;
            if (out->data) out->data[start] = '\0';
            return rc;
        }
    }
    return 0;
}

/* Returns DX_ERANGE for a bad id and DX_ETOOBIG if cap is too small. */
int tok_token_bytes(const tok *t, int32_t id, char *buf, size_t cap)
{
    if (id < 0 || (size_t)id >= t->n)
        return dx_errf(DX_ERANGE, "tokenizer: id %d out of range (vocabulary of %zu)", id, t->n);
    const tok_ent *en = &t->ent[id];
    if (en->raw_len > cap)
        return dx_errf(DX_ETOOBIG, "tokenizer: token %d has %u bytes, buffer %zu", id, en->raw_len,
                       cap);
    if (en->raw_len) memcpy(buf, t->raw + en->raw_off, en->raw_len);
    return (int)en->raw_len;
}

tok_strview tok_piece(const tok *t, int32_t id)
{
    if (id < 0 || (size_t)id >= t->n) return (tok_strview){NULL, 0};
    return (tok_strview){t->blob + t->ent[id].off, t->ent[id].len};
}

int32_t tok_find(const tok *t, const char *piece, size_t len)
{
    return str_lookup(t, piece, len);
}

size_t tok_vocab_size(const tok *t)
{
    return t->n;
}
int32_t tok_bos(const tok *t)
{
    return t->bos;
}
int32_t tok_eos(const tok *t)
{
    return t->eos;
}
int32_t tok_eot(const tok *t)
{
    return t->eot;
}
enum tok_pre tok_get_pre(const tok *t)
{
    return t->pre;
}
int tok_add_bos(const tok *t)
{
    return t->add_bos;
}
int tok_add_eos(const tok *t)
{
    return t->add_eos;
}
enum tok_norm tok_get_norm(const tok *t)
{
    return t->norm;
}

int tok_is_control(const tok *t, int32_t id)
{
    return id >= 0 && (size_t)id < t->n && t->type[id] == TOK_TYPE_CONTROL;
}

int tok_is_text(const tok *t, int32_t id)
{
    if (id < 0 || (size_t)id >= t->n) return 0;
    int ty = t->type[id];
    return ty == TOK_TYPE_NORMAL || ty == TOK_TYPE_BYTE || ty == TOK_TYPE_USER_DEFINED;
}

int tok_is_eog(const tok *t, int32_t id)
{
    for (size_t i = 0; i < t->n_eog && t->eog[i] <= id; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

const int32_t *tok_eog_ids(const tok *t, size_t *n)
{
    *n = t->n_eog;
    return t->eog;
}

int tok_is_special(const tok *t, int32_t id)
{
    return id >= 0 && (size_t)id < t->n && type_is_special(t->type[id]);
}
