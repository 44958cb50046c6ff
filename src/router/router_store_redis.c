/* router_store_redis: the conversation map in a shared Redis (see
 * router_store.h), on the router's libuv loop through hiredis' async API:
 * the backend rstore_redis (router_store_priv.h), the entries' encoding and
 * the routers' shared secret.
 *
 * Every call the router waits for (a lookup) or counts (a write) is an op
 * with a deadline; ops are sent in order with one timeout, so their
 * deadlines are in order too and one timer, armed for the oldest, serves
 * them all.  An op whose deadline passed is answered (lookup: an error, the
 * router routes without affinity) and stays allocated until hiredis hands
 * its reply or drops it.  The connection is re-made with backoff when it
 * breaks, when connecting takes too long, or when it has answered nothing
 * for STALL_MS while calls wait (a stopped server). */
#include <adapters/libuv.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_keys.h"
#include "base/dx_log.h"
#include "http/prom.h"
#include "router/router_store_priv.h"

#define MAX_INFLIGHT 4096 /* calls hiredis may hold; beyond, fail at once */
#define BACKOFF_MIN  100  /* ms */
#define BACKOFF_MAX  2000
#define STALL_MS     2000 /* calls waiting and no answer this long: reconnect */
#define KEY_MAX      (ROUTER_STORE_PREFIX_MAX + 48)
#define PUT_ARGS     8

struct router_store_op {
    router_store *s;
    dx_list link; /* on s->live while it waits for its answer or deadline */
    int get;
    uint64_t deadline_ns;
    router_store_cb cb; /* get; NULL once answered or canceled */
    void *user;
    size_t n; /* get: keys asked for */
    /* put: the command, kept for the EVAL fallback */
    int argc;
    const char *argv[PUT_ARGS];
    size_t lens[PUT_ARGS];
    char keys[2][KEY_MAX], num[2][24];
    char *value;
    char sha[48];
};

/* ---- encoding ---------------------------------------------------------------- */

/* Replaces an entry only with one of at least as many tokens: a later turn
 * has more, and a tie is the newer write of the same turn. */
const char router_store_cas_lua[] = "local cur = redis.call('GET', KEYS[1])\n"
                                    "if cur then\n"
                                    "  local t = tonumber(string.match(cur, '^(%d+) '))\n"
                                    "  if t and t > tonumber(ARGV[2]) then return 0 end\n"
                                    "end\n"
                                    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])\n"
                                    "if KEYS[2] then redis.call('DEL', KEYS[2]) end\n"
                                    "return 1\n";

void router_store_key(const char *prefix, const router_key *k, char *out, size_t cap)
{
    snprintf(out, cap, "%sconv:%016" PRIx64 "%016" PRIx64, prefix, k->hi, k->lo);
}

int router_store_encode(const char *url, uint32_t num_tokens, const char *params, size_t len,
                        dx_buf *out)
{
    int rc = dx_buf_printf(out, "%" PRIu32 " %s\n", params ? num_tokens : 0, url);
    if (!rc && params) rc = dx_buf_append(out, params, len);
    return rc;
}

int router_store_decode(const char *v, size_t n, router_store_val *out)
{
    memset(out, 0, sizeof *out);
    size_t i = 0;
    uint64_t t = 0;
    for (; i < n && v[i] >= '0' && v[i] <= '9'; i++) {
        t = t * 10 + (uint64_t)(v[i] - '0');
        if (t > UINT32_MAX) return dx_errf(DX_EFORMAT, "state entry: token count out of range");
    }
    if (i == 0 || i >= n || v[i] != ' ')
        return dx_errf(DX_EFORMAT, "state entry: no token count before the node URL");
    const char *url = v + i + 1, *nl = memchr(url, '\n', n - i - 1);
    if (!nl || nl == url) return dx_errf(DX_EFORMAT, "state entry: no node URL line");
    out->num_tokens = (uint32_t)t;
    out->url = url;
    out->url_len = (size_t)(nl - url);
    size_t rest = n - (size_t)(nl + 1 - v);
    if (rest) {
        out->params = nl + 1;
        out->params_len = rest;
    }
    return 0;
}

/* ---- outage bookkeeping ---------------------------------------------------------- */

static void mark_error(router_store *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void mark_error(router_store *s, const char *fmt, ...)
{
    if (!s->healthy || s->destroying) return;
    s->healthy = 0;
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    DX_LOGW("router: state store %s: %s; routing without affinity until it answers "
            "(duplex_router_state_errors_total counts the calls)",
            s->where, why);
}

static void mark_ok(router_store *s)
{
    s->last_answer_ns = dx_now_ns();
    if (s->healthy) return;
    s->healthy = 1;
    DX_LOGI("router: state store %s answers again; affinity resumes", s->where);
}

/* ---- the live list and its deadline ------------------------------------------------------ */

static void on_deadline(uv_timer_t *t);

/* The oldest op waiting, or NULL. */
static router_store_op *live_first(const router_store *s)
{
    dx_list *l = dx_list_first(&s->live);
    return l ? DX_LIST_ENTRY(l, router_store_op, link) : NULL;
}

static void arm(router_store *s)
{
    router_store_op *first = live_first(s);
    if (!first || s->destroying) return;
    uint64_t now = dx_now_ns(), d = first->deadline_ns;
    uint64_t ms = d > now ? (d - now + 999999) / 1000000 : 0;
    uv_timer_start(&s->deadline, on_deadline, ms, 0);
}

static void live_push(router_store *s, router_store_op *op)
{
    op->deadline_ns = dx_now_ns() + (uint64_t)s->cfg.timeout_ms * 1000000;
    dx_list_push_back(&s->live, &op->link);
    if (live_first(s) == op) arm(s);
}

static int op_live(const router_store_op *op)
{
    return dx_list_linked(&op->link);
}

static void schedule_retry(router_store *s);
static void on_retry(uv_timer_t *t);

/* Drops the connection (hiredis answers its calls with no reply) and
 * reconnects after the backoff. */
static void drop_conn(router_store *s)
{
    redisAsyncContext *ac = s->ac;
    s->ac = NULL;
    s->connected = 0;
    if (ac) redisAsyncFree(ac); /* its disconnect callback may have scheduled the retry */
    if (!s->destroying && !uv_is_active((uv_handle_t *)&s->retry)) schedule_retry(s);
}

static void on_deadline(uv_timer_t *t)
{
    router_store *s = t->data;
    uint64_t now = dx_now_ns();
    router_store_op *op;
    while ((op = live_first(s)) && op->deadline_ns <= now + 100000) {
        dx_list_remove(&op->link);
        rstore_count_error(s, op->get);
        mark_error(s, "no answer within %d ms (--state-timeout-ms)", s->cfg.timeout_ms);
        router_store_cb cb = op->cb;
        op->cb = NULL;
        if (cb) {
            cb(op->user, DX_ETIMEDOUT, NULL);
            if (s->destroying) return;
        }
    }
    if (s->connected && s->n_inflight && now - s->last_answer_ns > (uint64_t)STALL_MS * 1000000) {
        mark_error(s, "no answer for %d ms: reconnecting", STALL_MS);
        drop_conn(s);
    }
    arm(s);
}

/* ---- replies ---------------------------------------------------------------------- */

static void send_put(router_store *s, router_store_op *op);

/* The newest key with an entry naming a node this router knows. */
static void answer_get(router_store *s, const redisReply *rep, size_t n, router_store_cb cb,
                       void *user)
{
    for (size_t i = n; i-- > 0;) {
        const redisReply *e = rep->element[i];
        router_store_val v;
        if (e->type != REDIS_REPLY_STRING || router_store_decode(e->str, e->len, &v) < 0) continue;
        int node = s->cfg.node_of(s->cfg.user, v.url, v.url_len);
        if (node < 0) continue; /* a node this replica does not route to: no affinity */
        rstore_hit(cb, user, i, node, v.params, v.params_len, v.num_tokens);
        return;
    }
    cb(user, 0, NULL);
}

static void on_get_reply(router_store *s, router_store_op *op, const redisReply *rep)
{
    int was_live = op_live(op);
    router_store_cb cb = op->cb;
    void *user = op->user;
    size_t n = op->n;
    uint64_t now = dx_now_ns(), deadline = op->deadline_ns;
    dx_list_remove(&op->link);
    dx_free(op);
    if (rep && !s->destroying) s->last_answer_ns = now; /* late is not stalled */
    if (s->destroying || !was_live || !cb) return;      /* timed out or canceled: done with */
    if (now > deadline) {
        /* past its deadline, though the timer has not run yet (a loop held
         * up, with the reply and the timer due together): late all the
         * same, so the rule does not depend on which callback runs first */
        rstore_count_error(s, 1);
        mark_error(s, "no answer within %d ms (--state-timeout-ms)", s->cfg.timeout_ms);
        arm(s);
        cb(user, DX_ETIMEDOUT, NULL);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != n) {
        rstore_count_error(s, 1);
        mark_error(s, "lookup: %s",
                   !rep                             ? "connection lost"
                   : rep->type == REDIS_REPLY_ERROR ? rep->str
                                                    : "unexpected reply");
        cb(user, DX_EIO, NULL);
        return;
    }
    mark_ok(s);
    answer_get(s, rep, n, cb, user);
}

static void on_put_reply(router_store *s, router_store_op *op, const redisReply *rep)
{
    if (rep && rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "NOSCRIPT", 8) &&
        !strcmp(op->argv[0], "EVALSHA") && s->ac && !s->destroying) {
        s->sha[0] = 0; /* the server lost it (restart, SCRIPT FLUSH): the script itself */
        op->argv[0] = "EVAL";
        op->argv[1] = router_store_cas_lua;
        op->lens[0] = 4;
        op->lens[1] = strlen(router_store_cas_lua);
        send_put(s, op);
        return;
    }
    int was_live = op_live(op);
    dx_list_remove(&op->link);
    if (!s->destroying && was_live) {
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            rstore_count_error(s, 0);
            mark_error(s, "write: %s", rep ? rep->str : "connection lost");
        } else {
            mark_ok(s);
            if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 0) s->stale++;
        }
    } else if (rep && !s->destroying) {
        s->last_answer_ns = dx_now_ns();
    }
    dx_free(op->value);
    dx_free(op);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    router_store_op *op = priv;
    router_store *s = op->s;
    (void)ac;
    s->n_inflight--;
    if (op->get)
        on_get_reply(s, op, reply);
    else
        on_put_reply(s, op, reply);
}

/* AUTH, SELECT, SCRIPT LOAD: sent first on every connection. */
static void on_setup_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    router_store *s = priv;
    const redisReply *rep = reply;
    (void)ac;
    if (!rep || s->destroying) return;
    if (rep->type == REDIS_REPLY_ERROR) {
        mark_error(s, "%s", rep->str);
        return;
    }
    mark_ok(s);
    if (rep->type == REDIS_REPLY_STRING && rep->len < sizeof s->sha)
        memcpy(s->sha, rep->str, rep->len + 1); /* SCRIPT LOAD's */
}

/* ---- connection --------------------------------------------------------------------- */

static void on_connect(const redisAsyncContext *ac, int status)
{
    router_store *s = ac->data;
    if (status != REDIS_OK) { /* hiredis frees ac after this */
        if (s->ac == ac) s->ac = NULL;
        s->connected = 0;
        if (!s->destroying) {
            mark_error(s, "connect: %s", ac->errstr[0] ? ac->errstr : "failed");
            schedule_retry(s);
        }
        return;
    }
    s->connected = 1;
    s->backoff_ms = BACKOFF_MIN;
    s->last_answer_ns = dx_now_ns();
    uv_timer_stop(&s->retry);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    router_store *s = ac->data;
    (void)status;
    if (s->ac == ac) s->ac = NULL;
    s->connected = 0;
    if (s->destroying) return;
    mark_error(s, "connection lost%s%s", ac->errstr[0] ? ": " : "", ac->errstr);
    schedule_retry(s);
}

static void setup_cmd(router_store *s, int argc, const char **argv)
{
    redisAsyncCommandArgv(s->ac, on_setup_reply, s, argc, argv, NULL);
}

static void conn_start(router_store *s)
{
    redisAsyncContext *ac = redisAsyncConnect(s->url.host, s->url.port);
    if (!ac || ac->err || redisLibuvAttach(ac, s->cfg.loop) != REDIS_OK) {
        mark_error(s, "connect: %s", !ac ? "out of memory" : ac->err ? ac->errstr : "libuv");
        if (ac) redisAsyncFree(ac);
        schedule_retry(s);
        return;
    }
    ac->data = s;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    s->ac = ac;
    char db[16];
    snprintf(db, sizeof db, "%d", s->url.db);
    if (s->url.password[0]) {
        const char *a[] = {"AUTH", s->url.user, s->url.password};
        if (s->url.user[0])
            setup_cmd(s, 3, a);
        else
            setup_cmd(s, 2, (const char *[]){"AUTH", s->url.password});
    }
    if (s->url.db) setup_cmd(s, 2, (const char *[]){"SELECT", db});
    setup_cmd(s, 3, (const char *[]){"SCRIPT", "LOAD", router_store_cas_lua});
    /* the connect's own deadline: a peer that never answers the handshake,
     * and a refused connect — hiredis' libuv adapter drops a poll error, so
     * no callback says so and only this timer moves on.  Bounded apart from
     * --state-timeout-ms: a long call deadline must not make the router wait
     * that much longer for a Redis that is back. */
    uint64_t ms = (uint64_t)s->cfg.timeout_ms * 20;
    ms = ms < 1000 ? 1000 : ms > 3000 ? 3000 : ms;
    uv_timer_start(&s->retry, on_retry, ms, 0);
}

/* The backoff is over (no connection): connect.  Or the connection did
 * not come up in time: drop it and back off. */
static void on_retry(uv_timer_t *t)
{
    router_store *s = t->data;
    if (s->destroying) return;
    if (!s->ac) {
        conn_start(s);
        return;
    }
    if (!s->connected) {
        mark_error(s, "connect: no answer");
        drop_conn(s);
    }
}

static void schedule_retry(router_store *s)
{
    if (s->destroying) return;
    if (!s->backoff_ms) s->backoff_ms = BACKOFF_MIN;
    uv_timer_start(&s->retry, on_retry, s->backoff_ms, 0);
    s->backoff_ms = s->backoff_ms * 2 > BACKOFF_MAX ? BACKOFF_MAX : s->backoff_ms * 2;
}

/* ---- the backend ------------------------------------------------------------------------ */

static int redis_init(router_store *s)
{
    dx_list_init(&s->live);
    int rc = rds_url_parse(s->cfg.url, &s->url);
    if (rc) return dx_err_wrap(rc, "--state");
    rds_url_format(&s->url, s->where, sizeof s->where);
    uv_timer_init(s->cfg.loop, &s->deadline);
    uv_timer_init(s->cfg.loop, &s->retry);
    s->deadline.data = s->retry.data = s;
    s->n_handles = 2;
    s->backoff_ms = BACKOFF_MIN;
    conn_start(s);
    return 0;
}

static void on_closed(uv_handle_t *h)
{
    router_store *s = h->data;
    if (--s->n_handles == 0) rstore_free(s);
}

static void redis_destroy(router_store *s)
{
    s->destroying = 1;
    router_store_op *op;
    while ((op = live_first(s))) {
        dx_list_remove(&op->link);
        op->cb = NULL;
    }
    redisAsyncContext *ac = s->ac;
    s->ac = NULL;
    if (ac) redisAsyncFree(ac); /* answers every call it holds (no reply): they are freed */
    uv_close((uv_handle_t *)&s->deadline, on_closed);
    uv_close((uv_handle_t *)&s->retry, on_closed);
}

/* Fails a lookup at once: no connection, or too many calls waiting. */
static void get_fail(router_store *s, router_store_cb cb, void *user, const char *why)
{
    rstore_count_error(s, 1);
    mark_error(s, "%s", why);
    cb(user, DX_EIO, NULL);
}

static void redis_get(router_store *s, const router_key *keys, size_t n, router_store_cb cb,
                      void *user, router_store_op **out)
{
    if (!s->ac || s->n_inflight >= MAX_INFLIGHT) {
        get_fail(s, cb, user, s->ac ? "too many calls waiting" : "not connected");
        return;
    }
    router_store_op *op = dx_calloc(1, sizeof *op);
    const char **argv = dx_malloc((n + 1) * sizeof *argv);
    char *kb = dx_malloc(n * KEY_MAX);
    if (!op || !argv || !kb) {
        dx_free(op);
        dx_free(argv);
        dx_free(kb);
        get_fail(s, cb, user, "out of memory");
        return;
    }
    argv[0] = "MGET";
    for (size_t i = 0; i < n; i++) {
        router_store_key(s->prefix, &keys[i], kb + i * KEY_MAX, KEY_MAX);
        argv[i + 1] = kb + i * KEY_MAX;
    }
    *op = (router_store_op){.s = s, .get = 1, .cb = cb, .user = user, .n = n};
    int rc = redisAsyncCommandArgv(s->ac, on_reply, op, (int)n + 1, argv, NULL);
    dx_free(argv); /* hiredis has copied the command */
    dx_free(kb);
    if (rc != REDIS_OK) {
        dx_free(op);
        get_fail(s, cb, user, "the connection is closing");
        return;
    }
    s->n_inflight++;
    live_push(s, op);
    *out = op;
}

/* Here, not in router_store.c: only this backend hands out ops. */
void router_store_cancel(router_store_op *op)
{
    if (!op) return;
    dx_list_remove(&op->link);
    op->cb = NULL;
}

static void send_put(router_store *s, router_store_op *op)
{
    if (redisAsyncCommandArgv(s->ac, on_reply, op, op->argc, op->argv, op->lens) == REDIS_OK) {
        s->n_inflight++;
        return;
    }
    dx_list_remove(&op->link);
    rstore_count_error(s, 0);
    dx_free(op->value);
    dx_free(op);
}

static void redis_put(router_store *s, const router_key *k, const router_key *drop, int node,
                      const char *params, size_t len, uint32_t num_tokens, double ttl_s)
{
    const char *url = s->cfg.node_url(s->cfg.user, node);
    dx_buf_reset(&s->val);
    router_store_op *op = NULL;
    size_t vlen = 0;
    if (!s->ac || s->n_inflight >= MAX_INFLIGHT || !url ||
        router_store_encode(url, num_tokens, params, len, &s->val) < 0 || !(vlen = s->val.len) ||
        !(op = dx_calloc(1, sizeof *op)) || !(op->value = dx_buf_take(&s->val))) {
        dx_free(op);
        rstore_count_error(s, 0);
        mark_error(s, "write: %s", s->ac ? "out of memory" : "not connected");
        return;
    }
    op->s = s;
    int sha = s->sha[0] != 0, nk = drop && !router_key_eq(drop, k) ? 2 : 1;
    op->argv[0] = sha ? "EVALSHA" : "EVAL";
    op->argv[1] = sha ? s->sha : router_store_cas_lua;
    op->argv[2] = nk == 2 ? "2" : "1";
    router_store_key(s->prefix, k, op->keys[0], KEY_MAX);
    op->argv[3] = op->keys[0];
    int a = 4;
    if (nk == 2) {
        router_store_key(s->prefix, drop, op->keys[1], KEY_MAX);
        op->argv[a++] = op->keys[1];
    }
    double ms = ttl_s * 1e3;
    snprintf(op->num[0], sizeof op->num[0], "%u", num_tokens);
    snprintf(op->num[1], sizeof op->num[1], "%.0f", ms < 1 ? 1 : ms > 1e15 ? 1e15 : ms);
    op->argv[a++] = op->value;
    op->argv[a++] = op->num[0];
    op->argv[a++] = op->num[1];
    op->argc = a;
    for (int i = 0; i < a; i++) op->lens[i] = op->argv[i] == op->value ? vlen : strlen(op->argv[i]);
    if (sha) memcpy(op->sha, s->sha, sizeof op->sha); /* the store's may change meanwhile */
    if (sha) op->argv[1] = op->sha;
    live_push(s, op);
    send_put(s, op);
}

static int redis_metrics(router_store *s, dx_buf *b)
{
    return prom_write_gauge(b, "duplex_router_state_up", "1 while the shared state store answers",
                            s->healthy && s->ac);
}

const rstore_backend rstore_redis = {
    .init = redis_init,
    .destroy = redis_destroy,
    .get = redis_get,
    .put = redis_put,
    .metrics = redis_metrics,
    .shared = 1,
};

int router_store_secret(const char *url, const char *prefix, int timeout_ms, uint8_t *out,
                        size_t len)
{
    static const char lua[] = "redis.call('SET', KEYS[1], ARGV[1], 'NX')\n"
                              "return redis.call('GET', KEYS[1])\n";
    rds_url u;
    int rc = rds_url_parse(url, &u);
    if (rc) return dx_err_wrap(rc, "--state");
    uint8_t rnd[32];
    char hex[65], key[KEY_MAX];
    if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd)
        return dx_errf(DX_EIO, "getrandom: no randomness for the routers' secret");
    for (size_t i = 0; i < sizeof rnd; i++) snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    snprintf(key, sizeof key, "%ssecret", prefix ? prefix : "duplex:");
    redisContext *c;
    if ((rc = rds_connect(&u, timeout_ms, &c)))
        return dx_err_wrap(rc, "--state: the routers' shared key secret (start Redis first, or "
                               "give every router the same --internal-key-file)");
    redisReply *r = redisCommand(c, "EVAL %s 1 %s %s", lua, key, hex);
    if (!r || r->type != REDIS_REPLY_STRING || r->len < 32) {
        rc = dx_errf(DX_EIO, "--state: reading %s: %s", key,
                     !r                             ? c->errstr
                     : r->type == REDIS_REPLY_ERROR ? r->str
                                                    : "not a secret");
    } else {
        /* spread whatever the key holds over out: the same on every router */
        dx_keys_hash("duplex router shared secret v1", 30, r->str, r->len, NULL, 0, out, len);
    }
    if (r) freeReplyObject(r);
    redisFree(c);
    return rc;
}
