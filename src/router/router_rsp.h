/* router_rsp: the router's stored responses (the Responses API's
 * previous_response_id and GET/DELETE /v1/responses/{id}) — in this
 * process (oai_rsp_store), or in the Redis the router replicas already
 * share for the conversation map (--state), so a chain of responses may
 * continue through any replica.
 *
 * Each call blocks: on the memory store for a lock, on Redis for one
 * round trip bounded by timeout_ms (connect included).  So they run off
 * the loop, on the router's work pool: the lookup of a previous response
 * is part of a request's preparation, and the store, GET and DELETE are
 * jobs of their own.  Redis keeps, under PREFIX "rsp:" TENANT-HEX ":" ID,
 * the value oai_rsp_store_encode writes, with the TTL restarted by every
 * read (GETEX); one connection, behind a mutex, opened again after a
 * failure.  A Redis that does not answer loses continuations (a 404, as
 * for an expired id), never an answer. */
#ifndef ROUTER_RSP_H
#define ROUTER_RSP_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "oai/oai_rsp_store.h"

typedef struct router_rsp router_rsp;

typedef struct {
    double ttl_s;       /* > 0 */
    size_t max_bytes;   /* the memory store's bound */
    const char *redis;  /* redis://… shared by the replicas, or NULL: this process */
    const char *prefix; /* the keys' prefix (default "duplex:") */
    int timeout_ms;     /* each Redis call's deadline (default 50) */
} router_rsp_config;

int router_rsp_create(const router_rsp_config *c, router_rsp **out);
void router_rsp_destroy(router_rsp *s); /* NULL: no-op */

/* As oai_rsp_store's (tenant: OAI_RSP_STORE_TENANT bytes or NULL): 1
 * found, 0 not (or Redis failed: logged, counted), negative on failure. */
int router_rsp_messages(router_rsp *s, const uint8_t *tenant, const char *id, json_t **messages);
int router_rsp_response(router_rsp *s, const uint8_t *tenant, const char *id, char **response,
                        size_t *len);
int router_rsp_put(router_rsp *s, const uint8_t *tenant, const char *id, const json_t *messages,
                   const char *response, size_t len);
int router_rsp_delete(router_rsp *s, const uint8_t *tenant, const char *id);
/* Redis calls that failed (the metric). */
uint64_t router_rsp_errors(router_rsp *s);

#endif
