/* router_rsp: stored responses, in memory or in the shared Redis (see .h). */
#include "router/router_rsp.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "http/rds.h"
#include "oai/oai_rsp.h"

struct router_rsp {
    oai_rsp_store *mem; /* NULL with Redis */
    pthread_mutex_t mu; /* guards c and errors */
    rds_url url;
    char prefix[64];
    int timeout_ms;
    unsigned ttl_ms;
    redisContext *c; /* NULL until (re)connected */
    uint64_t errors;
};

int router_rsp_create(const router_rsp_config *cfg, router_rsp **out)
{
    *out = NULL;
    router_rsp *s = dx_calloc(1, sizeof *s);
    if (!s) return dx_errf(DX_ENOMEM, "responses store: out of memory");
    int rc = 0;
    if (!cfg->redis) {
        oai_rsp_store_config mc = {.ttl_s = cfg->ttl_s, .max_bytes = cfg->max_bytes};
        rc = oai_rsp_store_create(&mc, &s->mem);
    } else if (!(cfg->ttl_s > 0)) {
        rc = dx_errf(DX_EINVAL, "responses store: the TTL must be positive");
    } else if ((rc = rds_url_parse(cfg->redis, &s->url)) == 0) {
        snprintf(s->prefix, sizeof s->prefix, "%s", cfg->prefix ? cfg->prefix : "duplex:");
        s->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 50;
        s->ttl_ms = (unsigned)(cfg->ttl_s * 1e3);
    }
    if (rc) {
        dx_free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return 0;
}

void router_rsp_destroy(router_rsp *s)
{
    if (!s) return;
    oai_rsp_store_destroy(s->mem);
    if (s->c) redisFree(s->c);
    pthread_mutex_destroy(&s->mu);
    dx_free(s);
}

uint64_t router_rsp_errors(router_rsp *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->errors;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* ---- Redis ---------------------------------------------------------------------- */

static void key_of(const router_rsp *s, const uint8_t *tenant, const char *id, char *out,
                   size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    char t[2 * OAI_RSP_STORE_TENANT + 1];
    for (int i = 0; i < OAI_RSP_STORE_TENANT; i++) {
        uint8_t b = tenant ? tenant[i] : 0;
        t[2 * i] = hex[b >> 4];
        t[2 * i + 1] = hex[b & 15];
    }
    t[sizeof t - 1] = 0;
    snprintf(out, cap, "%srsp:%s:%.*s", s->prefix, t, OAI_RSP_MAX_ID, id);
}

/* Under the mutex: one command, connecting first if need be; the reply, or
 * NULL (logged and counted; the connection is dropped, to be opened again
 * by the next call). */
static redisReply *command(router_rsp *s, int argc, const char **argv, const size_t *lens)
{
    if (!s->c && rds_connect(&s->url, s->timeout_ms, &s->c) < 0) {
        s->c = NULL;
        s->errors++;
        DX_LOGW("router: responses store: %s", dx_errmsg());
        return NULL;
    }
    redisReply *r = redisCommandArgv(s->c, argc, argv, lens);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        s->errors++;
        DX_LOGW("router: responses store: %s failed: %s", argv[0],
                r                 ? r->str
                : s->c->errstr[0] ? s->c->errstr
                                  : "no answer");
        if (r) freeReplyObject(r);
        redisFree(s->c);
        s->c = NULL;
        return NULL;
    }
    return r;
}

/* The value under key (GETEX: its TTL starts again) copied into *v; 1
 * found, 0 not, or not reachable. */
static int redis_get(router_rsp *s, const uint8_t *tenant, const char *id, dx_buf *v)
{
    if (!oai_rsp_store_id_ok(id)) return 0;
    char key[512], px[24];
    key_of(s, tenant, id, key, sizeof key);
    snprintf(px, sizeof px, "%u", s->ttl_ms);
    const char *argv[] = {"GETEX", key, "PX", px};
    size_t lens[] = {5, strlen(key), 2, strlen(px)};
    pthread_mutex_lock(&s->mu);
    redisReply *r = command(s, 4, argv, lens);
    int rc = 0;
    if (r && r->type == REDIS_REPLY_STRING)
        rc = dx_buf_append(v, r->str, r->len) < 0 ? DX_ENOMEM : 1;
    if (r) freeReplyObject(r);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int decode(const dx_buf *v, json_t **messages, char **response, size_t *len)
{
    const char *m, *r;
    size_t ml, rl;
    int rc = oai_rsp_store_decode(v->data, v->len, &m, &ml, &r, &rl);
    if (rc) return rc;
    if (messages) {
        json_error_t je;
        *messages = json_loadb(m, ml, JSON_ALLOW_NUL, &je); /* an answer's NUL, as stored */
        if (!json_is_array(*messages)) {
            json_decref(*messages);
            *messages = NULL;
            return dx_errf(DX_EFORMAT, "responses store: a broken entry in Redis");
        }
    }
    if (response) {
        if (!(*response = dx_strndup(r, rl)))
            return dx_errf(DX_ENOMEM, "responses store: out of memory");
        *len = rl;
    }
    return 1;
}

/* ---- the interface ----------------------------------------------------------------- */

int router_rsp_messages(router_rsp *s, const uint8_t *tenant, const char *id, json_t **messages)
{
    *messages = NULL;
    if (s->mem) return oai_rsp_store_messages(s->mem, tenant, id, dx_now_s(), messages);
    dx_buf v;
    dx_buf_init(&v, 0);
    int rc = redis_get(s, tenant, id, &v);
    if (rc == 1) rc = decode(&v, messages, NULL, NULL);
    dx_buf_free(&v);
    return rc;
}

int router_rsp_response(router_rsp *s, const uint8_t *tenant, const char *id, char **response,
                        size_t *len)
{
    *response = NULL;
    *len = 0;
    if (s->mem) return oai_rsp_store_response(s->mem, tenant, id, dx_now_s(), response, len);
    dx_buf v;
    dx_buf_init(&v, 0);
    int rc = redis_get(s, tenant, id, &v);
    if (rc == 1) rc = decode(&v, NULL, response, len);
    dx_buf_free(&v);
    return rc;
}

int router_rsp_put(router_rsp *s, const uint8_t *tenant, const char *id, const json_t *messages,
                   const char *response, size_t len)
{
    if (s->mem) return oai_rsp_store_put(s->mem, tenant, id, messages, response, len, dx_now_s());
    if (!oai_rsp_store_id_ok(id))
        return dx_errf(DX_EINVAL, "responses store: an id longer than %d bytes", OAI_RSP_MAX_ID);
    dx_buf v;
    dx_buf_init(&v, 0);
    int rc = oai_rsp_store_encode(messages, response, len, &v);
    if (!rc) {
        char key[512], px[24];
        key_of(s, tenant, id, key, sizeof key);
        snprintf(px, sizeof px, "%u", s->ttl_ms);
        const char *argv[] = {"SET", key, v.data, "PX", px};
        size_t lens[] = {3, strlen(key), v.len, 2, strlen(px)};
        pthread_mutex_lock(&s->mu);
        redisReply *r = command(s, 5, argv, lens);
        if (r)
            freeReplyObject(r);
        else
            rc = dx_errf(DX_EIO, "responses store: Redis did not keep %s", id);
        pthread_mutex_unlock(&s->mu);
    }
    dx_buf_free(&v);
    return rc;
}

int router_rsp_delete(router_rsp *s, const uint8_t *tenant, const char *id)
{
    if (s->mem) return oai_rsp_store_delete(s->mem, tenant, id);
    if (!oai_rsp_store_id_ok(id)) return 0;
    char key[512];
    key_of(s, tenant, id, key, sizeof key);
    const char *argv[] = {"DEL", key};
    size_t lens[] = {3, strlen(key)};
    pthread_mutex_lock(&s->mu);
    redisReply *r = command(s, 2, argv, lens);
    int gone = r && r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    if (r) freeReplyObject(r);
    pthread_mutex_unlock(&s->mu);
    return gone;
}
