/* dx_keys: secrets that callers present — API keys, and the cluster's
 * internal key — and the one way they are checked.
 *
 * A set keeps each key only as its BLAKE2b-256 digest (libsodium's
 * crypto_generichash).  A presented token is digested too, and the digests
 * are compared with sodium_memcmp against every key of the set, whatever
 * matched: the time taken depends on neither the token's nor the keys'
 * bytes or lengths, so timing cannot reveal a key byte by byte (comparing
 * fixed-size digests is also what keeps a length difference from showing).
 *
 * Key files hold one key per line.  Lines that are empty or only white
 * space are skipped, as are lines whose first non-blank character is '#';
 * space and tab around a key are trimmed.  A key is 1..DX_KEY_MAX bytes of
 * visible ASCII ('!'..'~': it travels in an HTTP header); anything else —
 * a space inside a key, a control byte, a line over the limit, the same
 * key twice, a file with no key — is an error naming the file and line. */
#ifndef DX_KEYS_H
#define DX_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

#define DX_KEY_MAX      512        /* bytes in one key */
#define DX_KEYS_MAX     4096       /* keys in one set */
#define DX_KEY_DIGEST   32         /* bytes of a key's digest */
#define DX_KEY_FILE_MAX (4u << 20) /* bytes in a key file */

typedef struct dx_keys dx_keys;

int dx_keys_create(dx_keys **out);
void dx_keys_destroy(dx_keys *k); /* NULL: no-op */
/* One key, from `where` (a flag: "--api-key"); DX_EINVAL naming where and
 * what is wrong. */
int dx_keys_add(dx_keys *k, const char *key, size_t len, const char *where);
/* Keys from the text of a key file that messages call `name`. */
int dx_keys_parse(dx_keys *k, const char *text, size_t len, const char *name);
/* Keys from a file (at most DX_KEY_FILE_MAX bytes). */
int dx_keys_load(dx_keys *k, const char *path);
size_t dx_keys_count(const dx_keys *k);
/* The index of the key equal to tok[0..len), or DX_NONE (constant time,
 * see above). */
int dx_keys_find(const dx_keys *k, const char *tok, size_t len);
/* Key i's digest (DX_KEY_DIGEST bytes): names a tenant without its key. */
const uint8_t *dx_keys_digest(const dx_keys *k, int i);

/* A key file's text as it is (at most DX_KEY_FILE_MAX bytes, no NUL),
 * appended to out; the caller wipes it (dx_keys_wipe). */
int dx_keys_read_file(const char *path, dx_buf *out);
void dx_keys_wipe(dx_buf *b); /* zeroes, then frees */

/* A file that holds exactly one key of at least min_len bytes (the internal
 * key): 0 and *out (dx_malloc'd; the caller frees it with dx_keys_free_secret),
 * or DX_EINVAL / DX_EIO naming the file (and line). */
int dx_keys_read_one(const char *path, size_t min_len, char **out);
void dx_keys_free_secret(char *s); /* wiped, then freed; NULL: no-op */

/* BLAKE2b of in[0..n) then in2[0..n2) (in2 may be NULL with n2 0), keyed
 * with key[0..key_len) (16..64 bytes, or NULL with key_len 0); out_len
 * bytes (16..64).  Allocates nothing. */
void dx_keys_hash(const void *in, size_t n, const void *in2, size_t n2, const void *key,
                  size_t key_len, uint8_t *out, size_t out_len);
/* n_bytes random bytes as 2 * n_bytes lower-case hex digits and a NUL. */
void dx_keys_random_hex(char *out, size_t n_bytes);

#endif
