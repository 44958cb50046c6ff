/* router_key: conversation keys (see .h).
 *
 * Each step hashes a small fixed-layout record: the previous key, a tag byte
 * and length-prefixed fields, so that no two different sequences of fields
 * produce the same bytes.  Long fields (message contents) are hashed on their
 * own first and enter the record as their 128-bit digest: nothing is copied
 * and nothing is allocated. */
#include "router/router_key.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "base/dx_keys.h"

enum { TAG_ID = 'I', TAG_CHAT = 'C', TAG_MSG = 'M' };

/* Up to: key (16) + tag (1) + one digest (16) + a short length-prefixed
 * string (8 + 32) — roles are at most "assistant". */
typedef struct {
    uint8_t b[96];
    size_t n;
} key_rec;

static void rec_put(key_rec *r, const void *p, size_t n)
{
    memcpy(r->b + r->n, p, n);
    r->n += n;
}

static void rec_u64(key_rec *r, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++, v >>= 8) b[i] = (uint8_t)v;
    rec_put(r, b, sizeof b);
}

static void rec_key(key_rec *r, const router_key *k)
{
    rec_u64(r, k->lo);
    rec_u64(r, k->hi);
}

/* A long field enters as its length and digest. */
static void rec_digest(key_rec *r, uint64_t seed, const void *p, size_t n)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(p, n, seed);
    rec_u64(r, n);
    rec_u64(r, h.low64);
    rec_u64(r, h.high64);
}

static void rec_finish(const key_rec *r, uint64_t seed, router_key *out)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(r->b, r->n, seed);
    out->lo = h.low64;
    out->hi = h.high64;
}

static void put_le64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8) b[i] = (uint8_t)v;
}

void router_key_ns(const uint8_t secret[ROUTER_KEY_SECRET], enum router_tenant kind, const void *id,
                   size_t len, router_key *ns)
{
    /* "ns", the kind, then the id: a kind can never pass for another */
    uint8_t pre[3] = {'n', 's', (uint8_t)kind}, h[16];
    int with_id = kind == ROUTER_TENANT_HEADER || kind == ROUTER_TENANT_KEY;
    dx_keys_hash(pre, sizeof pre, with_id ? id : NULL, with_id ? len : 0, secret, ROUTER_KEY_SECRET,
                 h, sizeof h);
    ns->lo = ns->hi = 0;
    for (int i = 7; i >= 0; i--) {
        ns->lo = ns->lo << 8 | h[i];
        ns->hi = ns->hi << 8 | h[8 + i];
    }
}

void router_key_salt(const uint8_t secret[ROUTER_KEY_SECRET], const router_key *ns,
                     const char *client_salt, size_t len, char out[33])
{
    uint8_t pre[2 + 16] = {'c', 's'}, h[16];
    put_le64(pre + 2, ns->lo);
    put_le64(pre + 10, ns->hi);
    dx_keys_hash(pre, sizeof pre, client_salt, len, secret, ROUTER_KEY_SECRET, h, sizeof h);
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* A key derived from the namespace, a tag and one string. */
static void key_tagged(uint64_t seed, const router_key *ns, uint8_t tag, const char *s, size_t len,
                       router_key *out)
{
    key_rec r = {.n = 0};
    rec_key(&r, ns);
    rec_put(&r, &tag, 1);
    rec_digest(&r, seed, s, len);
    rec_finish(&r, seed, out);
}

void router_key_id(uint64_t seed, const router_key *ns, const char *id, size_t len, router_key *out)
{
    key_tagged(seed, ns, TAG_ID, id, len, out);
}

void router_key_chat_begin(uint64_t seed, const router_key *ns, const char *model, size_t len,
                           router_key *chain)
{
    key_tagged(seed, ns, TAG_CHAT, model, len, chain);
}

void router_key_chat_add(uint64_t seed, router_key *chain, const char *role, const char *content,
                         size_t len)
{
    key_rec r = {.n = 0};
    uint8_t tag = TAG_MSG;
    rec_key(&r, chain);
    rec_put(&r, &tag, 1);
    size_t rl = strlen(role);
    if (rl <= 32) { /* the normalised roles: short, hashed in place */
        rec_u64(&r, rl);
        rec_put(&r, role, rl);
    } else {
        rec_digest(&r, seed, role, rl);
    }
    rec_digest(&r, seed, content, len);
    rec_finish(&r, seed, chain);
}
