/* router_key: conversation keys — 128-bit XXH3 hashes that name a
 * conversation in the router's state (router_state.h).
 *
 * Every key lives in its tenant's namespace: a keyed BLAKE2b hash, under
 * the router's secret, of the API key the caller presented (with API keys
 * configured), else of its whole Authorization header (absent = a namespace
 * of its own).  One tenant's conversation id or history can never name
 * another tenant's entry and send its requests to that tenant's KV, and
 * without the secret no one can compute a namespace.  The same namespace
 * gives the tenant's prefix-cache salt on the nodes (router_key_salt).
 * Three kinds of key, kept apart by a tag byte:
 *
 *   - an explicit id (X-Conversation-Id, or the body's conversation_id);
 *   - content: a running hash over the model name and the chat messages,
 *     one key per prefix m[0..k), so the router can look up the longest
 *     prefix it has an entry for.  A finished turn is stored under the key of
 *     its messages plus the assistant reply as the client received it, which
 *     is exactly the prefix the client resends on the next turn.
 *
 * Keys are seeded with a per-process random seed: clients choose the hashed
 * bytes, and must not be able to aim entries at one hash-table slot. */
#ifndef ROUTER_KEY_H
#define ROUTER_KEY_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t lo, hi;
} router_key;

static inline int router_key_eq(const router_key *a, const router_key *b)
{
    return a->lo == b->lo && a->hi == b->hi;
}

#define ROUTER_KEY_SECRET 32 /* bytes of the router's namespace secret */

enum router_tenant {
    ROUTER_TENANT_NONE,     /* no credentials (no keys configured, no header) */
    ROUTER_TENANT_HEADER,   /* no keys configured: the whole Authorization value */
    ROUTER_TENANT_KEY,      /* the digest of the API key presented */
    ROUTER_TENANT_INTERNAL, /* the internal key was presented (id unused) */
};

/* The caller's namespace: id[0..len) as the kind says. */
void router_key_ns(const uint8_t secret[ROUTER_KEY_SECRET], enum router_tenant kind, const void *id,
                   size_t len, router_key *ns);
/* The prefix-cache salt the nodes get for a namespace and the client's own
 * cache_salt (may be empty): 32 hex digits and a NUL into out. */
void router_key_salt(const uint8_t secret[ROUTER_KEY_SECRET], const router_key *ns,
                     const char *client_salt, size_t len, char out[33]);
/* The key of an explicit conversation id. */
void router_key_id(uint64_t seed, const router_key *ns, const char *id, size_t len,
                   router_key *out);
/* Content keys: start the chain with the model name, then fold in one
 * message at a time; after each fold *chain is the key of that prefix. */
void router_key_chat_begin(uint64_t seed, const router_key *ns, const char *model, size_t len,
                           router_key *chain);
void router_key_chat_add(uint64_t seed, router_key *chain, const char *role, const char *content,
                         size_t len);

#endif
