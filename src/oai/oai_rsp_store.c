/* oai_rsp_store: stored responses in memory (see .h). */
#include "oai/oai_rsp_store.h"

#include <pthread.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_lru.h"
#include "oai/oai_rsp.h"

struct oai_rsp_store {
    pthread_mutex_t mu; /* guards lru */
    dx_lru *lru;
};

int oai_rsp_store_create(const oai_rsp_store_config *cfg, oai_rsp_store **out)
{
    *out = NULL;
    if (!(cfg->ttl_s > 0) || !cfg->max_bytes)
        return dx_errf(DX_EINVAL, "responses store: the TTL and the size must be positive");
    oai_rsp_store *s = dx_calloc(1, sizeof *s);
    if (!s) return dx_errf(DX_ENOMEM, "responses store: out of memory");
    dx_lru_config lc = {.ttl_s = cfg->ttl_s, .max_bytes = cfg->max_bytes};
    int rc = dx_lru_create(&lc, &s->lru);
    if (rc) {
        dx_free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return 0;
}

void oai_rsp_store_destroy(oai_rsp_store *s)
{
    if (!s) return;
    dx_lru_destroy(s->lru);
    pthread_mutex_destroy(&s->mu);
    dx_free(s);
}

int oai_rsp_store_id_ok(const char *id)
{
    return strnlen(id, OAI_RSP_MAX_ID + 1) <= OAI_RSP_MAX_ID;
}

/* tenant ‖ id: the tenant's bytes are fixed-length, so no two (tenant, id)
 * pairs give one key. */
static size_t make_key(const uint8_t *tenant, const char *id, uint8_t *key)
{
    size_t n = strnlen(id, OAI_RSP_MAX_ID);
    if (tenant)
        memcpy(key, tenant, OAI_RSP_STORE_TENANT);
    else
        memset(key, 0, OAI_RSP_STORE_TENANT);
    memcpy(key + OAI_RSP_STORE_TENANT, id, n);
    return OAI_RSP_STORE_TENANT + n;
}

int oai_rsp_store_encode(const json_t *messages, const char *response, size_t response_len,
                         dx_buf *out)
{
    size_t flags = JSON_COMPACT | JSON_ENCODE_ANY, ml = json_dumpb(messages, NULL, 0, flags);
    if (!ml || ml > UINT32_MAX)
        return dx_errf(DX_EINVAL, "responses store: a conversation that cannot be kept");
    uint8_t len[4] = {(uint8_t)ml, (uint8_t)(ml >> 8), (uint8_t)(ml >> 16), (uint8_t)(ml >> 24)};
    size_t at = out->len + 4;
    int rc = dx_buf_append(out, len, 4);
    if (!rc) rc = dx_buf_reserve(out, ml);
    if (!rc && json_dumpb(messages, out->data + at, ml, flags) != ml)
        rc = dx_errf(DX_ENOMEM, "responses store: out of memory for a conversation");
    if (!rc) out->len = at + ml;
    if (!rc) rc = dx_buf_append(out, response, response_len);
    return rc;
}

int oai_rsp_store_decode(const void *v, size_t len, const char **messages, size_t *mlen,
                         const char **response, size_t *rlen)
{
    const uint8_t *p = v;
    if (len < 4) return dx_errf(DX_EFORMAT, "responses store: an entry of %zu bytes", len);
    size_t ml = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
    if (ml > len - 4)
        return dx_errf(DX_EFORMAT, "responses store: a conversation of %zu bytes in %zu", ml,
                       len - 4);
    *messages = (const char *)p + 4;
    *mlen = ml;
    *response = (const char *)p + 4 + ml;
    *rlen = len - 4 - ml;
    return 0;
}

int oai_rsp_store_put(oai_rsp_store *s, const uint8_t *tenant, const char *id,
                      const json_t *messages, const char *response, size_t response_len, double now)
{
    if (!oai_rsp_store_id_ok(id))
        return dx_errf(DX_EINVAL, "responses store: an id longer than %d bytes", OAI_RSP_MAX_ID);
    uint8_t key[OAI_RSP_STORE_TENANT + OAI_RSP_MAX_ID];
    size_t klen = make_key(tenant, id, key);
    dx_buf v;
    dx_buf_init(&v, 0);
    int rc = oai_rsp_store_encode(messages, response, response_len, &v);
    if (!rc) {
        pthread_mutex_lock(&s->mu);
        rc = dx_lru_put(s->lru, key, klen, v.data, v.len, now);
        pthread_mutex_unlock(&s->mu);
    }
    dx_buf_free(&v);
    return rc;
}

/* Under the lock: the entry's two parts copied out (the lru's pointers
 * last only until it changes). */
static int get_parts(oai_rsp_store *s, const uint8_t *tenant, const char *id, double now,
                     dx_buf *copy)
{
    if (!oai_rsp_store_id_ok(id)) return 0;
    uint8_t key[OAI_RSP_STORE_TENANT + OAI_RSP_MAX_ID];
    size_t klen = make_key(tenant, id, key);
    const void *v;
    size_t n;
    pthread_mutex_lock(&s->mu);
    int found = dx_lru_get(s->lru, key, klen, now, 1, &v, &n);
    int rc = found ? dx_buf_append(copy, v, n) : 0;
    pthread_mutex_unlock(&s->mu);
    return rc < 0 ? rc : found;
}

int oai_rsp_store_messages(oai_rsp_store *s, const uint8_t *tenant, const char *id, double now,
                           json_t **messages)
{
    *messages = NULL;
    dx_buf copy;
    dx_buf_init(&copy, 0);
    int rc = get_parts(s, tenant, id, now, &copy);
    const char *m, *r;
    size_t ml, rl;
    if (rc == 1 && (rc = oai_rsp_store_decode(copy.data, copy.len, &m, &ml, &r, &rl)) == 0) {
        json_error_t je;
        *messages = json_loadb(m, ml, JSON_ALLOW_NUL, &je); /* an answer's NUL, as stored */
        rc = json_is_array(*messages)
                 ? 1
                 : dx_errf(DX_EFORMAT, "responses store: %s: a broken entry", id);
        if (rc < 0) {
            json_decref(*messages);
            *messages = NULL;
        }
    }
    dx_buf_free(&copy);
    return rc;
}

int oai_rsp_store_response(oai_rsp_store *s, const uint8_t *tenant, const char *id, double now,
                           char **response, size_t *len)
{
    *response = NULL;
    *len = 0;
    dx_buf copy;
    dx_buf_init(&copy, 0);
    int rc = get_parts(s, tenant, id, now, &copy);
    const char *m, *r;
    size_t ml, rl;
    if (rc == 1 && (rc = oai_rsp_store_decode(copy.data, copy.len, &m, &ml, &r, &rl)) == 0) {
        if (!(*response = dx_strndup(r, rl)))
            rc = dx_errf(DX_ENOMEM, "responses store: out of memory");
        else
            *len = rl, rc = 1;
    }
    dx_buf_free(&copy);
    return rc;
}

int oai_rsp_store_delete(oai_rsp_store *s, const uint8_t *tenant, const char *id)
{
    if (!oai_rsp_store_id_ok(id)) return 0;
    uint8_t key[OAI_RSP_STORE_TENANT + OAI_RSP_MAX_ID];
    size_t klen = make_key(tenant, id, key);
    pthread_mutex_lock(&s->mu);
    int gone = dx_lru_remove(s->lru, key, klen);
    pthread_mutex_unlock(&s->mu);
    return gone;
}

void oai_rsp_store_get_stats(oai_rsp_store *s, oai_rsp_store_stats *out)
{
    dx_lru_stats st;
    pthread_mutex_lock(&s->mu);
    dx_lru_get_stats(s->lru, &st);
    pthread_mutex_unlock(&s->mu);
    *out = (oai_rsp_store_stats){st.entries, st.bytes,   st.puts,   st.hits,
                                 st.misses,  st.evicted, st.expired};
}
