/* oai_rsp_store: the Responses API's stored responses, in memory — what
 * `previous_response_id` continues and GET /v1/responses/{id} returns.
 *
 * Each response id keeps the conversation so far as chat messages (what
 * oai_rsp_history builds: the input and the answer as a chat client would
 * send them back) and the response object as it was written.  Entries are
 * per tenant: the key is the tenant (the caller's API-key digest, or none)
 * followed by the id, so another tenant's id is simply not found — never
 * its history.  They live for the TTL from their last use (a continuation
 * or a GET refreshes it) and the store keeps at most max_bytes, least
 * recently used out first (base/dx_lru).
 *
 * Thread-safe (one mutex): a node's preparation threads look conversations
 * up while its loop stores answers. */
#ifndef OAI_RSP_STORE_H
#define OAI_RSP_STORE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

#define OAI_RSP_STORE_TENANT 32 /* bytes of a tenant's name (an API key's digest) */

typedef struct oai_rsp_store oai_rsp_store;

typedef struct {
    double ttl_s;     /* > 0 */
    size_t max_bytes; /* > 0 */
} oai_rsp_store_config;

typedef struct {
    size_t entries, bytes;
    uint64_t puts, hits, misses, evicted, expired;
} oai_rsp_store_stats;

int oai_rsp_store_create(const oai_rsp_store_config *cfg, oai_rsp_store **out);
void oai_rsp_store_destroy(oai_rsp_store *s); /* NULL: no-op */

/* Keeps messages (a JSON array) and the response object's text under id
 * for tenant (OAI_RSP_STORE_TENANT bytes; NULL: the shared one), at time
 * now (seconds).  DX_ETOOBIG when it alone is over max_bytes, DX_ENOMEM. */
int oai_rsp_store_put(oai_rsp_store *s, const uint8_t *tenant, const char *id,
                      const json_t *messages, const char *response, size_t response_len,
                      double now);
/* 1 with *messages (a new reference) when id is there for tenant, else 0;
 * DX_ENOMEM / DX_EFORMAT (a broken entry) as negative codes. */
int oai_rsp_store_messages(oai_rsp_store *s, const uint8_t *tenant, const char *id, double now,
                           json_t **messages);
/* 1 with *response (dx_malloc'd, NUL-terminated, the caller's) when id is
 * there for tenant, else 0; DX_ENOMEM. */
int oai_rsp_store_response(oai_rsp_store *s, const uint8_t *tenant, const char *id, double now,
                           char **response, size_t *len);
/* 1 when id was there for tenant (now gone), else 0. */
int oai_rsp_store_delete(oai_rsp_store *s, const uint8_t *tenant, const char *id);

/* Whether id can name a stored response at all: ids are at most
 * OAI_RSP_MAX_ID bytes, so a longer one (from a URL path) is never found
 * rather than matched by its first OAI_RSP_MAX_ID bytes. */
int oai_rsp_store_id_ok(const char *id);
void oai_rsp_store_get_stats(oai_rsp_store *s, oai_rsp_store_stats *out);

/* The value as kept (also what a shared store, e.g. Redis, holds): a
 * 4-byte little-endian length of the messages' JSON, that JSON, then the
 * response object's text.  Encode appends to *out (dx_buf); decode points
 * into v. */
int oai_rsp_store_encode(const json_t *messages, const char *response, size_t response_len,
                         dx_buf *out);
int oai_rsp_store_decode(const void *v, size_t len, const char **messages, size_t *mlen,
                         const char **response, size_t *rlen);

#endif
