/* http_auth: who is calling one of duplex's HTTP servers, for nodes and the
 * router alike (SECURITY.md, "API keys and the internal key").
 *
 *   API keys (--api-key, --api-key-file): with any configured, every route
 *   but /health and /metrics wants `Authorization: Bearer KEY` with one of
 *   them; a missing, malformed or wrong one is a 401 in OpenAI's shape that
 *   says which of the three it was and nothing about the keys.
 *
 *   The internal key (--internal-key-file, one per cluster): what the
 *   router presents to nodes, in `X-Duplex-Internal-Key` (or, from a proxy
 *   that knows nothing of duplex, as its Bearer token).  It stands in for an
 *   API key and marks the caller as trusted: only a trusted caller's
 *   kv_transfer_params are honoured, as they make a node pull from, or hold
 *   KV for, an address the caller names.  A caller from a range given with
 *   --trust-kv-params-from is trusted too; a node with neither an internal
 *   key nor ranges trusts loopback callers, as its KV port then serves
 *   loopback only.  An X-Duplex-Internal-Key that is wrong, or sent to a
 *   server without one, is a 401: a router and nodes that disagree about the
 *   key fail loudly rather than silently lose their KV reuse.
 *
 *   Binding: without API keys a server must listen on a loopback address,
 *   unless --insecure-no-auth says otherwise (http_auth_bind_check).
 *
 *   Tenants: a caller's prefix-cache namespace (http_auth_cache_salt) keeps
 *   one API key's requests from reusing KV another key's requests computed.
 *
 * Keys are compared as digests in constant time (base/dx_keys.h). */
#ifndef HTTP_AUTH_H
#define HTTP_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "http/http_conn.h"

#define HTTP_AUTH_MAX_LIST        64 /* --api-key, --api-key-file, --trust-kv-params-from */
#define HTTP_AUTH_INTERNAL_MIN    16 /* characters in an internal key at least */
#define HTTP_AUTH_SALT            16 /* bytes of a prefix-cache namespace */
#define HTTP_AUTH_INTERNAL_HEADER "X-Duplex-Internal-Key"
/* Extra header lines of a 401 (RFC 9110: the scheme that would work). */
#define HTTP_AUTH_401_HEADERS "WWW-Authenticate: Bearer\r\n"

typedef struct {
    const char *const *api_keys; /* --api-key values */
    size_t n_api_keys;
    const char *const *api_key_files; /* --api-key-file paths */
    size_t n_api_key_files;
    const char *internal_key_file;    /* --internal-key-file, or NULL */
    const char *const *trust_kv_from; /* --trust-kv-params-from ranges (nodes) */
    size_t n_trust_kv_from;
} http_auth_config;

typedef struct http_auth http_auth;

/* Reads the files and parses the ranges: DX_EINVAL / DX_EIO with a message
 * naming the flag, file and line, or the range. */
int http_auth_create(const http_auth_config *c, http_auth **out);
void http_auth_destroy(http_auth *a); /* NULL: no-op */
size_t http_auth_n_keys(const http_auth *a);
/* The internal key as configured (to send upstream), or NULL. */
const char *http_auth_internal_key(const http_auth *a);
/* API key i's digest (DX_KEY_DIGEST bytes): names its tenant. */
const uint8_t *http_auth_key_digest(const http_auth *a, int i);

typedef struct {
    int status;          /* 0: allowed; 401: refused (message says why) */
    const char *message; /* the 401's message */
    int internal;        /* the internal key was presented */
    int trusted;         /* kv_transfer_params are honoured (see above) */
    int key;             /* the API key presented (index), or DX_NONE */
} http_auth_result;

/* Checks r's credentials and address (a NULL a is a server with nothing
 * configured).  The caller leaves /health and /metrics unchecked. */
void http_auth_check(const http_auth *a, const http_req *r, http_auth_result *out);
/* Who was refused: the 401 body in OpenAI's shape
 * ({"error":{"message",...,"type":"invalid_request_error","code":"invalid_api_key"}}). */
int http_auth_error_json(dx_buf *b, const char *message);

/* A server about to listen on host: 0 when it has API keys, when host is a
 * loopback address, or with insecure (--insecure-no-auth) — and when host
 * does not resolve, which binding then reports; DX_EINVAL saying what to
 * do otherwise. */
int http_auth_bind_check(const http_auth *a, const char *host, int insecure);
/* For start-up lines: "api-keys(N)", "none (loopback only)" or
 * "none (--insecure-no-auth)"; and whose kv_transfer_params a node honours:
 * "internal-key", "internal-key,10.0.0.0/8", "loopback", ... */
void http_auth_describe(const http_auth *a, int insecure, char *out, size_t cap);
void http_auth_describe_trust(const http_auth *a, char *out, size_t cap);

/* A request's prefix-cache namespace: HTTP_AUTH_SALT bytes, all zero for
 * the shared default (no tenant, no cache_salt).  A trusted caller's
 * cache_salt (the router's, which names the tenant) is taken as it is; any
 * other caller's is bound to the API key it presented, in a separate domain,
 * so an untrusted caller can never pick another tenant's namespace. */
void http_auth_cache_salt(const http_auth *a, const http_auth_result *who, const char *salt,
                          size_t salt_len, uint8_t out[HTTP_AUTH_SALT]);

#endif
