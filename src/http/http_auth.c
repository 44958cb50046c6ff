/* http_auth: callers' credentials and trust (see .h). */
#include "http/http_auth.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/dx_addr.h"
#include "base/dx_alloc.h"
#include "base/dx_cidr.h"
#include "base/dx_err.h"
#include "base/dx_keys.h"
#include "oai/oai_resp.h"

struct http_auth {
    dx_keys *api;      /* the API keys (maybe none) */
    dx_keys *internal; /* the internal key alone, or NULL */
    char *internal_raw;
    dx_cidr trust[HTTP_AUTH_MAX_LIST];
    size_t n_trust;
};

static int load_keys(http_auth *a, const http_auth_config *c)
{
    int rc = dx_keys_create(&a->api);
    for (size_t i = 0; !rc && i < c->n_api_keys; i++)
        rc = dx_keys_add(a->api, c->api_keys[i], strlen(c->api_keys[i]), "--api-key");
    for (size_t i = 0; !rc && i < c->n_api_key_files; i++)
        if ((rc = dx_keys_load(a->api, c->api_key_files[i]))) dx_err_wrap(rc, "--api-key-file");
    if (rc || !c->internal_key_file) return rc;
    rc = dx_keys_read_one(c->internal_key_file, HTTP_AUTH_INTERNAL_MIN, &a->internal_raw);
    if (!rc) rc = dx_keys_create(&a->internal);
    if (!rc)
        rc = dx_keys_add(a->internal, a->internal_raw, strlen(a->internal_raw),
                         "--internal-key-file");
    return rc ? dx_err_wrap(rc, "--internal-key-file") : 0;
}

int http_auth_create(const http_auth_config *c, http_auth **out)
{
    *out = NULL;
    if (c->n_trust_kv_from > HTTP_AUTH_MAX_LIST)
        return dx_errf(DX_EINVAL, "--trust-kv-params-from: more than %d ranges",
                       HTTP_AUTH_MAX_LIST);
    http_auth *a = dx_calloc(1, sizeof *a);
    if (!a) return dx_errf(DX_ENOMEM, "out of memory");
    int rc = load_keys(a, c);
    for (size_t i = 0; !rc && i < c->n_trust_kv_from; i++)
        if ((rc = dx_cidr_parse(c->trust_kv_from[i], &a->trust[a->n_trust++])))
            dx_err_wrap(rc, "--trust-kv-params-from");
    if (rc) {
        http_auth_destroy(a);
        return rc;
    }
    *out = a;
    return 0;
}

void http_auth_destroy(http_auth *a)
{
    if (!a) return;
    dx_keys_destroy(a->api);
    dx_keys_destroy(a->internal);
    dx_keys_free_secret(a->internal_raw);
    dx_free(a);
}

size_t http_auth_n_keys(const http_auth *a)
{
    return a ? dx_keys_count(a->api) : 0;
}

const char *http_auth_internal_key(const http_auth *a)
{
    return a ? a->internal_raw : NULL;
}

const uint8_t *http_auth_key_digest(const http_auth *a, int i)
{
    return dx_keys_digest(a->api, i);
}

/* ---- a request's credentials --------------------------------------------------- */

enum bearer { BEARER_NONE, BEARER_BAD, BEARER_OK };

static int blank(char c)
{
    return c == ' ' || c == '\t';
}

/* The token in v: one word, blanks around it. */
static enum bearer one_token(const char *v, const char **tok, size_t *len)
{
    while (blank(*v)) v++;
    size_t n = strlen(v);
    while (n && blank(v[n - 1])) n--;
    if (n == 0) return BEARER_BAD;
    for (size_t i = 0; i < n; i++)
        if (blank(v[i])) return BEARER_BAD;
    *tok = v;
    *len = n;
    return BEARER_OK;
}

/* "Bearer TOKEN" (the scheme in any case, RFC 9110), blanks around. */
static enum bearer parse_bearer(const char *v, int count, const char **tok, size_t *len)
{
    if (count == 0) return BEARER_NONE;
    if (count > 1) return BEARER_BAD; /* which one would a proxy have read? */
    while (blank(*v)) v++;
    if (strncasecmp(v, "Bearer", 6) != 0 || !blank(v[6])) return BEARER_BAD;
    return one_token(v + 7, tok, len);
}

/* "x-api-key: KEY" (Anthropic's header, which its SDK and Claude Code
 * send instead of Authorization), blanks around: read only when there is
 * no Authorization header. */
static enum bearer parse_x_api_key(const char *v, int count, const char **tok, size_t *len)
{
    if (count == 0) return BEARER_NONE;
    if (count > 1) return BEARER_BAD;
    return one_token(v, tok, len);
}

static int refuse(http_auth_result *out, const char *message)
{
    out->status = 401;
    out->message = message;
    return 0;
}

static int address_trusted(const http_auth *a, const struct sockaddr *peer)
{
    if (!peer) return 0;
    if (!a || (!a->internal && !a->n_trust)) return dx_addr_is_loopback(peer);
    for (size_t i = 0; i < a->n_trust; i++)
        if (dx_cidr_match(&a->trust[i], peer)) return 1;
    return 0;
}

/* internal_presented's answers.  WRONG is for its header only: a wrong
 * Bearer may still be an API key. */
enum { INTERNAL_WRONG = -1, INTERNAL_ABSENT = 0, INTERNAL_OK = 1 };

/* The internal key, in its header or as the Bearer token: INTERNAL_OK
 * presented, INTERNAL_ABSENT not, INTERNAL_WRONG presented wrong. */
static int internal_presented(const http_auth *a, const http_req *r, enum bearer b, const char *tok,
                              size_t len)
{
    int n;
    const char *ik = http_req_header(r, HTTP_AUTH_INTERNAL_HEADER, &n);
    if (n) {
        if (n > 1 || !a || !a->internal) return INTERNAL_WRONG;
        return dx_keys_find(a->internal, ik, strlen(ik)) == 0 ? INTERNAL_OK : INTERNAL_WRONG;
    }
    return b == BEARER_OK && a && a->internal && dx_keys_find(a->internal, tok, len) == 0
               ? INTERNAL_OK
               : INTERNAL_ABSENT;
}

void http_auth_check(const http_auth *a, const http_req *r, http_auth_result *out)
{
    *out = (http_auth_result){.status = 0, .key = DX_NONE};
    int n;
    const char *v = http_req_header(r, "Authorization", &n), *tok = NULL;
    size_t len = 0;
    enum bearer b = parse_bearer(v, n, &tok, &len);
    if (b == BEARER_NONE) {
        v = http_req_header(r, "x-api-key", &n);
        b = parse_x_api_key(v, n, &tok, &len);
    }
    int internal = internal_presented(a, r, b, tok, len);
    if (internal == INTERNAL_WRONG) {
        refuse(out, "invalid internal key (" HTTP_AUTH_INTERNAL_HEADER ")");
        return;
    }
    if (internal == INTERNAL_OK) {
        out->internal = out->trusted = 1;
        return;
    }
    if (http_auth_n_keys(a)) {
        if (b == BEARER_NONE)
            refuse(out,
                   "missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
        else if (b == BEARER_BAD)
            refuse(out, "malformed Authorization header: expected 'Bearer KEY' (or one x-api-key)");
        else if ((out->key = dx_keys_find(a->api, tok, len)) < 0)
            refuse(out, "invalid API key");
        if (out->status) return;
    }
    out->trusted = address_trusted(a, r->peer);
}

int http_auth_error_json(dx_buf *b, const char *message)
{
    /* OpenAI's own answer to a bad key has this type and code */
    return oai_error_json(b, message, "invalid_request_error", NULL, "invalid_api_key");
}

/* ---- binding, start-up lines ----------------------------------------------------- */

int http_auth_bind_check(const http_auth *a, const char *host, int insecure)
{
    if (http_auth_n_keys(a) || insecure) return 0;
    struct sockaddr_storage ss;
    socklen_t len;
    /* a host that does not resolve is the listener's to report, as ever */
    if (dx_addr_resolve(host, 0, &ss, &len) < 0) return 0;
    if (dx_addr_is_loopback((const struct sockaddr *)&ss)) return 0;
    return dx_errf(DX_EINVAL,
                   "--host %s is not a loopback address, and no API key is set: anyone who can "
                   "reach it could use this server.  Give --api-key KEY or --api-key-file FILE, "
                   "or --insecure-no-auth to serve without keys anyway",
                   host);
}

void http_auth_describe(const http_auth *a, int insecure, char *out, size_t cap)
{
    size_t n = http_auth_n_keys(a);
    if (n)
        snprintf(out, cap, "api-keys(%zu)", n);
    else
        snprintf(out, cap, "none (%s)", insecure ? "--insecure-no-auth" : "loopback only");
}

void http_auth_describe_trust(const http_auth *a, char *out, size_t cap)
{
    if (!a || (!a->internal && !a->n_trust)) {
        snprintf(out, cap, "loopback");
        return;
    }
    size_t used = (size_t)snprintf(out, cap, "%s", a->internal ? "internal-key" : "");
    for (size_t i = 0; i < a->n_trust && used + 1 < cap; i++) {
        char r[64];
        dx_cidr_format(&a->trust[i], r, sizeof r);
        used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? "," : "", r);
    }
}

/* ---- tenants ------------------------------------------------------------------------ */

void http_auth_cache_salt(const http_auth *a, const http_auth_result *who, const char *salt,
                          size_t salt_len, uint8_t out[HTTP_AUTH_SALT])
{
    memset(out, 0, HTTP_AUTH_SALT);
    int tenant = !who->trusted && who->key >= 0;
    if (!tenant && !salt_len) return; /* the shared namespace */
    /* a domain tag; who gave the salt (0 a trusted caller, 1 an untrusted
     * one without a key, 2 with one: an untrusted caller's namespaces never
     * meet a trusted one's); the key's digest (fixed size); the salt */
    uint8_t pre[16 + 1 + DX_KEY_DIGEST] = "duplex salt v1";
    pre[16] = (uint8_t)(who->trusted ? 0 : tenant ? 2 : 1);
    if (tenant) memcpy(pre + 17, dx_keys_digest(a->api, who->key), DX_KEY_DIGEST);
    uint8_t h[HTTP_AUTH_SALT];
    dx_keys_hash(pre, sizeof pre, salt, salt_len, NULL, 0, h, sizeof h);
    int zero = 1;
    for (size_t i = 0; i < sizeof h; i++) zero &= h[i] == 0;
    if (zero) h[0] = 1; /* all zero means "shared" */
    memcpy(out, h, sizeof h);
}
