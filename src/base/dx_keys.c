/* dx_keys: key sets, key files and the constant-time check (see .h). */
#include "base/dx_keys.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"

struct dx_keys {
    uint8_t (*dig)[DX_KEY_DIGEST];
    size_t n, cap;
};

static int sodium_ready(void)
{
    /* idempotent and thread-safe; fails only when the system has no
     * randomness source, which nothing here could work without */
    if (sodium_init() < 0) return dx_errf(DX_EIO, "libsodium could not be initialised");
    return 0;
}

int dx_keys_create(dx_keys **out)
{
    *out = NULL;
    int rc = sodium_ready();
    if (rc) return rc;
    dx_keys *k = dx_calloc(1, sizeof *k);
    if (!k) return dx_errf(DX_ENOMEM, "out of memory");
    *out = k;
    return 0;
}

void dx_keys_destroy(dx_keys *k)
{
    if (!k) return;
    if (k->dig) sodium_memzero(k->dig, k->cap * sizeof *k->dig);
    dx_free(k->dig);
    dx_free(k);
}

size_t dx_keys_count(const dx_keys *k)
{
    return k ? k->n : 0;
}

const uint8_t *dx_keys_digest(const dx_keys *k, int i)
{
    DX_ASSERT(i >= 0 && (size_t)i < k->n);
    return k->dig[i];
}

static void digest(const char *p, size_t n, uint8_t out[DX_KEY_DIGEST])
{
    crypto_generichash(out, DX_KEY_DIGEST, (const unsigned char *)p, n, NULL, 0);
}

void dx_keys_hash(const void *in, size_t n, const void *in2, size_t n2, const void *key,
                  size_t key_len, uint8_t *out, size_t out_len)
{
    DX_ASSERT(out_len >= crypto_generichash_BYTES_MIN && out_len <= crypto_generichash_BYTES_MAX);
    DX_ASSERT(key_len == 0 || (key_len >= crypto_generichash_KEYBYTES_MIN &&
                               key_len <= crypto_generichash_KEYBYTES_MAX));
    DX_ASSERT(sodium_init() >= 0); /* cheap once done; see sodium_ready */
    crypto_generichash_state st;
    crypto_generichash_init(&st, key, key_len, out_len);
    crypto_generichash_update(&st, in, n);
    if (n2) crypto_generichash_update(&st, in2, n2);
    crypto_generichash_final(&st, out, out_len);
}

void dx_keys_random_hex(char *out, size_t n_bytes)
{
    DX_ASSERT(sodium_init() >= 0);
    uint8_t b[64];
    DX_ASSERT(n_bytes <= sizeof b);
    randombytes_buf(b, n_bytes);
    sodium_bin2hex(out, 2 * n_bytes + 1, b, n_bytes);
    sodium_memzero(b, sizeof b);
}

int dx_keys_find(const dx_keys *k, const char *tok, size_t len)
{
    if (!k || !k->n) return DX_NONE;
    uint8_t d[DX_KEY_DIGEST];
    digest(tok, len, d);
    /* every key is compared, and the index is chosen without a branch, so
     * the time does not say which key (or whether one) matched */
    int found = DX_NONE;
    for (size_t i = 0; i < k->n; i++) {
        int eq = sodium_memcmp(d, k->dig[i], DX_KEY_DIGEST) == 0; /* 0 or 1 */
        int mask = -eq;                                           /* 0 or all ones */
        found = (found & ~mask) | ((int)i & mask);
    }
    sodium_memzero(d, sizeof d);
    return found;
}

/* What is wrong with key[0..len) as a key, or NULL. */
_Static_assert(DX_KEY_MAX == 512, "the message below says 512");

static const char *key_problem(const char *key, size_t len)
{
    if (len == 0) return "an empty key";
    if (len > DX_KEY_MAX) return "a key over 512 bytes";
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c == ' ' || c == '\t') return "white space inside a key";
        if (c < '!' || c > '~') return "a byte that is not visible ASCII ('!'..'~')";
    }
    return NULL;
}

/* Adds a checked key; DX_EEXIST when the set has it already. */
static int add_digest(dx_keys *k, const char *key, size_t len)
{
    uint8_t d[DX_KEY_DIGEST];
    digest(key, len, d);
    for (size_t i = 0; i < k->n; i++)
        if (sodium_memcmp(d, k->dig[i], DX_KEY_DIGEST) == 0)
            return dx_errf(DX_EEXIST, "the same key twice");
    if (k->n == DX_KEYS_MAX) return dx_errf(DX_EFULL, "more than %d keys", DX_KEYS_MAX);
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 8;
        void *p = dx_calloc(cap, sizeof *k->dig);
        if (!p) return dx_errf(DX_ENOMEM, "out of memory for %zu keys", cap);
        if (k->n) memcpy(p, k->dig, k->n * sizeof *k->dig);
        if (k->dig) sodium_memzero(k->dig, k->cap * sizeof *k->dig);
        dx_free(k->dig);
        k->dig = p;
        k->cap = cap;
    }
    memcpy(k->dig[k->n++], d, DX_KEY_DIGEST);
    return 0;
}

static int add_error(int rc, const char *where)
{
    if (rc == DX_EEXIST) return dx_errf(DX_EINVAL, "%s: the same key is given twice", where);
    if (rc == DX_EFULL) return dx_errf(DX_EINVAL, "%s: more than %d keys", where, DX_KEYS_MAX);
    return dx_errf(DX_ENOMEM, "%s: out of memory", where);
}

int dx_keys_add(dx_keys *k, const char *key, size_t len, const char *where)
{
    const char *why = key_problem(key, len);
    if (why) return dx_errf(DX_EINVAL, "%s: %s", where, why);
    int rc = add_digest(k, key, len);
    return rc ? add_error(rc, where) : 0;
}

/* ---- key files -------------------------------------------------------------------- */

typedef struct {
    const char *text;
    size_t len, pos;
    unsigned line;
} key_lines;

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* The next key: 1 and key/klen; 0 at the end; DX_EINVAL naming name and
 * the line. */
static int next_key(key_lines *L, const char *name, const char **key, size_t *klen)
{
    while (L->pos < L->len) {
        const char *s = L->text + L->pos, *nl = memchr(s, '\n', L->len - L->pos);
        size_t n = nl ? (size_t)(nl - s) : L->len - L->pos;
        L->pos += n + (nl != NULL);
        L->line++;
        while (n && is_blank(*s)) s++, n--;
        while (n && is_blank(s[n - 1])) n--;
        if (n == 0 || s[0] == '#') continue;
        const char *why = key_problem(s, n);
        if (why) return dx_errf(DX_EINVAL, "%s: line %u: %s", name, L->line, why);
        *key = s;
        *klen = n;
        return 1;
    }
    return 0;
}

int dx_keys_parse(dx_keys *k, const char *text, size_t len, const char *name)
{
    key_lines L = {text, len, 0, 0};
    const char *key;
    size_t klen, before = k->n;
    int rc;
    while ((rc = next_key(&L, name, &key, &klen)) == 1) {
        if ((rc = add_digest(k, key, klen))) {
            char where[300];
            snprintf(where, sizeof where, "%s: line %u", name, L.line);
            return add_error(rc, where);
        }
    }
    if (rc < 0) return rc;
    if (k->n == before)
        return dx_errf(DX_EINVAL, "%s: no key in the file (one key per line; '#' starts a comment)",
                       name);
    return 0;
}

int dx_keys_read_file(const char *path, dx_buf *b)
{
    FILE *f = fopen(path, "rb");
    if (!f) return dx_errf(DX_EIO, "%s: %s", path, strerror(errno));
    char chunk[4096];
    size_t n, start = b->len;
    int rc = 0;
    while (!rc && (n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (b->len - start + n > DX_KEY_FILE_MAX)
            rc = dx_errf(DX_EINVAL, "%s: over %u bytes: not a key file", path, DX_KEY_FILE_MAX);
        else if (dx_buf_append(b, chunk, n) < 0)
            rc = dx_errf(DX_ENOMEM, "%s: out of memory", path);
    }
    if (!rc && ferror(f)) rc = dx_errf(DX_EIO, "%s: %s", path, strerror(errno));
    sodium_memzero(chunk, sizeof chunk);
    fclose(f);
    if (!rc && b->len > start && memchr(b->data + start, 0, b->len - start))
        rc = dx_errf(DX_EINVAL, "%s: a NUL byte: not a text file of keys", path);
    return rc;
}

void dx_keys_wipe(dx_buf *b)
{
    if (b->data) sodium_memzero(b->data, b->len);
    dx_buf_free(b);
}

int dx_keys_load(dx_keys *k, const char *path)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    int rc = dx_keys_read_file(path, &b);
    if (!rc) rc = dx_keys_parse(k, b.data ? b.data : "", b.len, path);
    dx_keys_wipe(&b);
    return rc;
}

int dx_keys_read_one(const char *path, size_t min_len, char **out)
{
    *out = NULL;
    int rc = sodium_ready();
    dx_buf b;
    dx_buf_init(&b, 0);
    if (!rc) rc = dx_keys_read_file(path, &b);
    key_lines L = {b.data ? b.data : "", b.len, 0, 0};
    const char *key = NULL, *extra;
    size_t klen = 0, xlen;
    if (!rc) rc = next_key(&L, path, &key, &klen);
    if (rc == 0) rc = dx_errf(DX_EINVAL, "%s: no key in the file", path);
    if (rc == 1 && klen < min_len)
        rc = dx_errf(DX_EINVAL, "%s: line %u: the key has %zu characters; at least %zu are needed",
                     path, L.line, klen, min_len);
    if (rc == 1 && (rc = next_key(&L, path, &extra, &xlen)) == 1)
        rc = dx_errf(DX_EINVAL, "%s: line %u: a second key (this file holds exactly one)", path,
                     L.line);
    if (rc == 0 && !(*out = dx_strndup(key, klen))) rc = dx_errf(DX_ENOMEM, "out of memory");
    dx_keys_wipe(&b);
    return rc;
}

void dx_keys_free_secret(char *s)
{
    if (!s) return;
    sodium_memzero(s, strlen(s));
    dx_free(s);
}
