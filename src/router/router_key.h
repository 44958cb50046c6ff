/* router_key: conversation keys — 128-bit XXH3 hashes that name a
 * conversation in the router's state (router_state.h).
 *
 * Every key lives in a namespace derived from the caller's Authorization
 * header (absent = a namespace of its own), so one tenant's conversation id
 * or history can never name another tenant's entry and send its requests to
 * that tenant's KV.  Three kinds of key, kept apart by a tag byte:
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

/* The caller's namespace: auth is the Authorization header's value (the
 * whole "Bearer ..." string) or NULL when the request has none. */
void router_key_ns(uint64_t seed, const char *auth, size_t auth_len, router_key *ns);
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
