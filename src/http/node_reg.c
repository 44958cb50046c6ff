/* node_reg: registration keys in Redis — the value's format, the scan routers
 * and nodes share, and the node's heartbeat thread (see .h). */
#include "http/node_reg.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_addr.h"
#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_log.h"

/* ---- the value ---------------------------------------------------------------- */

int node_reg_format(const node_reg_info *ni, dx_buf *out)
{
    json_t *v = json_pack("{s:s, s:s, s:o, s:s, s:I, s:I, s:b, s:I, s:I}", "url", ni->url, "role",
                          ni->role, "kv", ni->kv[0] ? json_string(ni->kv) : json_null(), "model",
                          ni->model, "outstanding", (json_int_t)ni->outstanding, "free_kv_blocks",
                          (json_int_t)ni->free_kv_blocks, "draining", ni->draining, "heartbeat_ms",
                          (json_int_t)ni->heartbeat_ms, "started_ms", (json_int_t)ni->started_ms);
    char s[NODE_REG_VALUE_MAX];
    size_t n = v ? json_dumpb(v, s, sizeof s, JSON_COMPACT) : 0;
    json_decref(v);
    if (!v) return dx_errf(DX_ENOMEM, "out of memory");
    if (n == 0 || n > sizeof s) return dx_errf(DX_ETOOBIG, "registration: value too long");
    return dx_buf_append(out, s, n);
}

static int get_str(json_t *o, const char *name, char *out, size_t cap, int nullable)
{
    json_t *v = json_object_get(o, name);
    if (nullable && json_is_null(v)) {
        out[0] = 0;
        return 0;
    }
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= cap)
        return dx_errf(DX_EFORMAT, "registration: \"%s\": expected a string of 1..%zu bytes", name,
                       cap - 1);
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

static int get_num(json_t *o, const char *name, uint64_t max, uint64_t *out)
{
    json_t *v = json_object_get(o, name);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
        return dx_errf(DX_EFORMAT, "registration: \"%s\": expected an integer 0..%llu", name,
                       (unsigned long long)max);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int check_fields(const node_reg_info *ni)
{
    char norm[NODE_REG_URL_MAX];
    if (dx_addr_http_url(ni->url, norm, sizeof norm) || strcmp(norm, ni->url))
        return dx_errf(DX_EFORMAT, "registration: \"url\" '%.200s' is not http://HOST:PORT",
                       ni->url);
    if (strcmp(ni->role, "prefill") && strcmp(ni->role, "decode") && strcmp(ni->role, "both"))
        return dx_errf(DX_EFORMAT, "registration: \"role\" '%s' is not prefill|decode|both",
                       ni->role);
    if (strlen(ni->model) != 32 || strspn(ni->model, "0123456789abcdef") != 32)
        return dx_errf(DX_EFORMAT, "registration: \"model\" is not 32 lowercase hex digits");
    return 0;
}

int node_reg_parse(const char *json, size_t len, node_reg_info *out)
{
    memset(out, 0, sizeof *out);
    if (len > NODE_REG_VALUE_MAX)
        return dx_errf(DX_EFORMAT, "registration: %zu bytes > %d", len, NODE_REG_VALUE_MAX);
    json_error_t je;
    json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return dx_errf(DX_EFORMAT, "registration: not a JSON object");
    }
    uint64_t out_n = 0, free_n = 0, hb = 0, st = 0;
    json_t *dr = json_object_get(o, "draining");
    int rc = get_str(o, "url", out->url, sizeof out->url, 0);
    if (!rc) rc = get_str(o, "role", out->role, sizeof out->role, 0);
    if (!rc) rc = get_str(o, "kv", out->kv, sizeof out->kv, 1);
    if (!rc) rc = get_str(o, "model", out->model, sizeof out->model, 0);
    if (!rc) rc = get_num(o, "outstanding", UINT32_MAX, &out_n);
    if (!rc) rc = get_num(o, "free_kv_blocks", UINT32_MAX, &free_n);
    if (!rc) rc = get_num(o, "heartbeat_ms", 3600000, &hb);
    if (!rc) rc = get_num(o, "started_ms", (uint64_t)1 << 53, &st);
    if (!rc && !json_is_boolean(dr))
        rc = dx_errf(DX_EFORMAT, "registration: \"draining\": expected true or false");
    if (!rc) rc = check_fields(out);
    out->outstanding = (uint32_t)out_n;
    out->free_kv_blocks = (uint32_t)free_n;
    out->heartbeat_ms = (uint32_t)hb;
    out->started_ms = st;
    out->draining = json_is_true(dr);
    json_decref(o);
    return rc;
}

/* ---- keys --------------------------------------------------------------------- */

int node_reg_check_prefix(const char *prefix, const char *flag)
{
    size_t n = strlen(prefix);
    if (n == 0 || n > NODE_REG_PREFIX_MAX)
        return dx_errf(DX_EINVAL, "%s: '%.100s' must be 1..%d bytes", flag, prefix,
                       NODE_REG_PREFIX_MAX);
    for (const char *p = prefix; *p; p++)
        if (strchr("*?[]\\ ", *p) || (unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e)
            return dx_errf(DX_EINVAL,
                           "%s: '%.100s': printable characters other than * ? [ ] \\ only", flag,
                           prefix);
    return 0;
}

int node_reg_key(const char *prefix, const char *url, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%snode:%s", prefix, url);
    if (n < 0 || (size_t)n >= cap) return dx_errf(DX_EINVAL, "registration key too long");
    return 0;
}

/* ---- scan ----------------------------------------------------------------------- */

static int scan_fail(redisContext *c, redisReply *r, const char *what)
{
    int rc = dx_errf(DX_EIO, "redis %s: %s", what,
                     r && r->type == REDIS_REPLY_ERROR ? r->str
                     : c->err                          ? c->errstr
                                                       : "unexpected reply");
    if (r) freeReplyObject(r);
    return rc;
}

/* The values of keys[0..n), each valid one to fn. */
static int mget(redisContext *c, char **keys, size_t n, node_reg_each_fn fn, void *user,
                size_t *n_bad)
{
    const char **argv = dx_malloc((n + 1) * sizeof *argv);
    if (!argv) return dx_errf(DX_ENOMEM, "out of memory");
    argv[0] = "MGET";
    for (size_t i = 0; i < n; i++) argv[i + 1] = keys[i];
    redisReply *r = redisCommandArgv(c, (int)n + 1, argv, NULL);
    dx_free(argv);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != n) return scan_fail(c, r, "MGET");
    for (size_t i = 0; i < n; i++) {
        redisReply *v = r->element[i];
        node_reg_info ni;
        if (v->type != REDIS_REPLY_STRING) continue; /* expired between SCAN and MGET */
        if (node_reg_parse(v->str, v->len, &ni) == 0)
            fn(user, &ni);
        else
            (*n_bad)++;
    }
    freeReplyObject(r);
    return 0;
}

int node_reg_scan(redisContext *c, const char *prefix, node_reg_each_fn fn, void *user,
                  size_t *n_bad)
{
    char pattern[NODE_REG_PREFIX_MAX + 16];
    snprintf(pattern, sizeof pattern, "%snode:*", prefix);
    char **keys = dx_calloc(NODE_REG_SCAN_MAX, sizeof *keys);
    if (!keys) return dx_errf(DX_ENOMEM, "out of memory");
    size_t n = 0;
    int rc = 0;
    char cursor[32] = "0";
    *n_bad = 0;
    do {
        redisReply *r = redisCommand(c, "SCAN %s MATCH %s COUNT 256", cursor, pattern);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
            rc = scan_fail(c, r, "SCAN");
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *ks = r->element[1];
        for (size_t i = 0; i < ks->elements && n < NODE_REG_SCAN_MAX && !rc; i++)
            if (ks->element[i]->type == REDIS_REPLY_STRING &&
                !(keys[n++] = dx_strdup(ks->element[i]->str)))
                rc = dx_errf(DX_ENOMEM, "out of memory");
        freeReplyObject(r);
    } while (!rc && strcmp(cursor, "0") && n < NODE_REG_SCAN_MAX);
    if (!rc && n) rc = mget(c, keys, n, fn, user, n_bad);
    for (size_t i = 0; i < n; i++) dx_free(keys[i]);
    dx_free(keys);
    return rc;
}

/* ---- the heartbeat thread ------------------------------------------------------------ */

struct node_reg {
    rds_url redis;
    char where[RDS_HOST_MAX + 32]; /* the URL for logs, no password */
    char prefix[NODE_REG_PREFIX_MAX + 1];
    char key[NODE_REG_PREFIX_MAX + NODE_REG_URL_MAX + 8];
    uint32_t heartbeat_ms;
    xfer_peers *peers;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, have;       /* guarded by mu */
    dx_buf next;          /* guarded by mu: the value to write */
    dx_buf value;         /* thread: the value being written */
    redisContext *c;      /* thread */
    int down, registered; /* thread: an outage is logged; the key was written once */
    char **peer_kv;       /* thread: KV addresses already allowed */
    size_t n_peer_kv;
};

static int timeout_ms(const node_reg *r)
{
    uint32_t t = r->heartbeat_ms;
    return (int)(t < 200 ? 200 : t > 2000 ? 2000 : t);
}

static int ensure_conn(node_reg *r)
{
    if (r->c) return 0;
    return rds_connect(&r->redis, timeout_ms(r), &r->c);
}

static void lost(node_reg *r, const char *why)
{
    if (r->c) redisFree(r->c);
    r->c = NULL;
    if (r->down) return;
    r->down = 1;
    DX_LOGW("duplex serve: registration: %s; serving anyway, trying again every %u ms", why,
            r->heartbeat_ms);
}

static void on_registered(void *user, const node_reg_info *ni)
{
    node_reg *r = user;
    if (!ni->kv[0] || r->n_peer_kv >= XFER_PEERS_MAX / 4) return;
    for (size_t i = 0; i < r->n_peer_kv; i++)
        if (!strcmp(r->peer_kv[i], ni->kv)) return;
    char **v = dx_realloc(r->peer_kv, (r->n_peer_kv + 1) * sizeof *v);
    if (!v) return;
    r->peer_kv = v;
    if (!(v[r->n_peer_kv] = dx_strdup(ni->kv))) return;
    r->n_peer_kv++;
    if (xfer_peers_add(r->peers, ni->kv) < 0)
        DX_LOGW("duplex serve: registration: KV peer %s of %s: %s", ni->kv, ni->url, dx_errmsg());
    else
        DX_LOGI("duplex serve: registration: KV pulls from %s (%s) allowed", ni->kv, ni->url);
}

static void beat(node_reg *r)
{
    char why[512];
    if (ensure_conn(r) < 0) {
        snprintf(why, sizeof why, "%s", dx_errmsg());
        lost(r, why);
        return;
    }
    redisReply *rep = redisCommand(r->c, "SET %s %b PX %u", r->key, r->value.data, r->value.len,
                                   3 * r->heartbeat_ms);
    int ok = rep && rep->type == REDIS_REPLY_STATUS;
    if (!ok) {
        snprintf(why, sizeof why, "%s: SET failed: %s", r->where,
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : r->c->errstr);
        if (rep) freeReplyObject(rep);
        lost(r, why);
        return;
    }
    freeReplyObject(rep);
    if (r->down || !r->registered)
        DX_LOGI("duplex serve: registration: %s%s as %s (every %u ms)", r->down ? "back, " : "",
                r->where, r->key, r->heartbeat_ms);
    r->down = 0;
    r->registered = 1;
    size_t bad;
    if (r->peers && node_reg_scan(r->c, r->prefix, on_registered, r, &bad) < 0) {
        snprintf(why, sizeof why, "%s: %s", r->where, dx_errmsg());
        lost(r, why);
    }
}

static void deregister(node_reg *r)
{
    if (!r->registered) return;
    if (ensure_conn(r) < 0) {
        DX_LOGW("duplex serve: registration: cannot remove %s: %s (it expires by itself)", r->key,
                dx_errmsg());
        return;
    }
    redisReply *rep = redisCommand(r->c, "DEL %s", r->key);
    if (rep && rep->type == REDIS_REPLY_INTEGER)
        DX_LOGI("duplex serve: registration: %s removed", r->key);
    else
        DX_LOGW("duplex serve: registration: DEL %s failed (it expires by itself)", r->key);
    if (rep) freeReplyObject(rep);
}

static void *reg_thread(void *arg)
{
    node_reg *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && !r->have) pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) break;
        dx_buf_reset(&r->value);
        int rc = dx_buf_append(&r->value, r->next.data, r->next.len);
        r->have = 0;
        pthread_mutex_unlock(&r->mu);
        if (!rc) beat(r);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    deregister(r);
    return NULL;
}

int node_reg_create(const node_reg_config *c, node_reg **out)
{
    *out = NULL;
    const char *prefix = c->prefix ? c->prefix : NODE_REG_DEFAULT_PREFIX;
    int rc = node_reg_check_prefix(prefix, "--register-prefix");
    if (rc) return rc;
    node_reg *r = dx_calloc(1, sizeof *r);
    if (!r) return dx_errf(DX_ENOMEM, "out of memory");
    r->redis = *c->redis;
    rds_url_format(&r->redis, r->where, sizeof r->where);
    snprintf(r->prefix, sizeof r->prefix, "%s", prefix);
    r->heartbeat_ms = c->heartbeat_ms ? c->heartbeat_ms : NODE_REG_DEFAULT_HEARTBEAT_MS;
    r->peers = c->peers;
    if ((rc = node_reg_key(prefix, c->url, r->key, sizeof r->key))) {
        dx_free(r);
        return rc;
    }
    dx_buf_init(&r->next, NODE_REG_VALUE_MAX);
    dx_buf_init(&r->value, NODE_REG_VALUE_MAX);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->th, NULL, reg_thread, r)) {
        node_reg_destroy(r);
        return dx_errf(DX_ENOMEM, "registration: cannot start its thread");
    }
    *out = r;
    return 0;
}

void node_reg_publish(node_reg *r, const node_reg_info *ni)
{
    dx_buf b;
    dx_buf_init(&b, NODE_REG_VALUE_MAX);
    if (node_reg_format(ni, &b) == 0) {
        pthread_mutex_lock(&r->mu);
        dx_buf_reset(&r->next);
        if (dx_buf_append(&r->next, b.data, b.len) == 0) r->have = 1;
        pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    dx_buf_free(&b);
}

void node_reg_destroy(node_reg *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int started = !r->stop;
    r->stop = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (started && r->th) pthread_join(r->th, NULL);
    if (r->c) redisFree(r->c);
    for (size_t i = 0; i < r->n_peer_kv; i++) dx_free(r->peer_kv[i]);
    dx_free(r->peer_kv);
    dx_buf_free(&r->next);
    dx_buf_free(&r->value);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    dx_free(r);
}
