/* router_up: curl multi on a libuv loop (see .h).
 *
 * The standard integration (curl's docs/examples/multi-uv.c): curl asks for
 * sockets to be watched and for a timer; both call back into
 * curl_multi_socket_action, and finished transfers are collected with
 * curl_multi_info_read after each call.
 *
 * Cancelation inside curl: a callback of one request (the client went away
 * while its bytes were being written) may cancel that request or another.
 * curl forbids removing easy handles from inside its callbacks, so such a
 * request is only marked and put on the `doomed` list; it is removed as
 * soon as curl_multi_socket_action returns.  curl_multi_remove_handle also
 * drops any completion message the request had queued, so a doomed request
 * never reaches on_done. */
#include "router/router_up.h"

#include "http/http_auth.h"

#include <curl/curl.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_list.h"
#include "base/dx_log.h"

#define IDLE_EASY_MAX 32

typedef struct up_sock up_sock;

struct router_up_req {
    router_up *u;
    dx_list link; /* u->active */
    router_up_req *doomed_next;
    CURL *easy;
    struct curl_slist *hdrs;
    router_up_cb cb;
    void *user;
    int canceled;   /* no more callbacks */
    int user_abort; /* on_data asked to stop */
    int head_done;
    long status;
    char errbuf[CURL_ERROR_SIZE];
};

struct router_up {
    uv_loop_t *loop;
    CURLM *multi;
    uv_timer_t timer;
    int in_curl;           /* depth of curl_multi_socket_action calls */
    dx_list active;        /* newest first */
    router_up_req *doomed; /* a stack: reaped whole, in any order */
    size_t n_active;
    CURL *idle[IDLE_EASY_MAX];
    size_t n_idle;
    dx_list socks; /* newest first */
    int n_handles; /* uv handles not yet closed */
    int destroying;
};

struct up_sock {
    uv_poll_t poll;
    router_up *u;
    dx_list link; /* u->socks: open sockets, closed by destroy if curl has not */
    curl_socket_t fd;
};

static void check_done(router_up *u);
static void reap_doomed(router_up *u);

static void maybe_free(router_up *u)
{
    if (u->destroying && u->n_handles == 0) dx_free(u);
}

/* ---- curl ↔ libuv --------------------------------------------------------- */

static void socket_action(router_up *u, curl_socket_t fd, int flags)
{
    int running;
    u->in_curl++;
    curl_multi_socket_action(u->multi, fd, flags, &running);
    u->in_curl--;
    if (u->in_curl) return;
    reap_doomed(u);
    check_done(u);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    up_sock *s = h->data;
    int flags = 0;
    if (status < 0)
        flags = CURL_CSELECT_ERR;
    else
        flags = (events & UV_READABLE ? CURL_CSELECT_IN : 0) |
                (events & UV_WRITABLE ? CURL_CSELECT_OUT : 0);
    socket_action(s->u, s->fd, flags);
}

static void on_poll_closed(uv_handle_t *h)
{
    up_sock *s = h->data;
    router_up *u = s->u;
    dx_free(s);
    u->n_handles--;
    maybe_free(u);
}

static void sock_close(up_sock *s)
{
    dx_list_remove(&s->link);
    uv_close((uv_handle_t *)&s->poll, on_poll_closed);
}

/* What the socket callback (CURLMOPT_SOCKETFUNCTION) returns to fail the
 * transfer: libcurl takes -1 as an error. */
#define CURL_SOCKET_CB_FAIL (-1)

static int on_socket(CURL *e, curl_socket_t fd, int what, void *userp, void *socketp)
{
    router_up *u = userp;
    up_sock *s = socketp;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            curl_multi_assign(u->multi, fd, NULL);
            sock_close(s);
        }
        return 0;
    }
    if (!s) {
        s = dx_calloc(1, sizeof *s);
        if (!s || uv_poll_init_socket(u->loop, &s->poll, fd) < 0) {
            dx_free(s);
            DX_LOGW("router upstream: cannot watch a socket");
            return CURL_SOCKET_CB_FAIL;
        }
        s->u = u;
        s->fd = fd;
        s->poll.data = s;
        dx_list_push_front(&u->socks, &s->link);
        u->n_handles++;
        curl_multi_assign(u->multi, fd, s);
    }
    int ev = (what & CURL_POLL_IN ? UV_READABLE : 0) | (what & CURL_POLL_OUT ? UV_WRITABLE : 0);
    uv_poll_start(&s->poll, ev, on_poll);
    return 0;
}

static void on_timeout(uv_timer_t *t)
{
    socket_action(t->data, CURL_SOCKET_TIMEOUT, 0);
}

static int on_timer_set(CURLM *m, long timeout_ms, void *userp)
{
    router_up *u = userp;
    if (timeout_ms < 0)
        uv_timer_stop(&u->timer);
    else /* 0: on the next loop turn — curl must not be re-entered from here */
        uv_timer_start(&u->timer, on_timeout, (uint64_t)timeout_ms, 0);
    return 0;
}

/* ---- requests ---------------------------------------------------------------- */

static size_t on_header(char *p, size_t sz, size_t n, void *user)
{
    router_up_req *q = user;
    size_t len = sz * n;
    if (q->canceled) return 0;
    int blank = (len == 2 && p[0] == '\r' && p[1] == '\n') || (len == 1 && p[0] == '\n');
    if (!blank && !q->head_done && q->cb.on_header) {
        size_t n_line = len;
        while (n_line && (p[n_line - 1] == '\n' || p[n_line - 1] == '\r')) n_line--;
        q->cb.on_header(q->user, p, n_line);
        if (q->canceled) return 0;
    }
    if (!blank || q->head_done) return len;
    long status = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status < 200) return len; /* 100 Continue: the real head follows */
    q->status = status;
    q->head_done = 1;
    if (q->cb.on_head) q->cb.on_head(q->user, status);
    return q->canceled ? 0 : len;
}

static size_t on_write(char *p, size_t sz, size_t n, void *user)
{
    router_up_req *q = user;
    size_t len = sz * n;
    if (q->canceled) return 0;
    if (q->cb.on_data && q->cb.on_data(q->user, p, len) != 0) {
        q->user_abort = 1;
        return 0;
    }
    return q->canceled ? 0 : len;
}

/* Takes q out of curl and frees it; its easy handle is kept for reuse. */
static void detach_free(router_up_req *q)
{
    router_up *u = q->u;
    curl_multi_remove_handle(u->multi, q->easy);
    if (u->n_idle < IDLE_EASY_MAX && !u->destroying) {
        curl_easy_reset(q->easy);
        u->idle[u->n_idle++] = q->easy;
    } else {
        curl_easy_cleanup(q->easy);
    }
    curl_slist_free_all(q->hdrs);
    dx_list_remove(&q->link);
    u->n_active--;
    dx_free(q);
}

static void reap_doomed(router_up *u)
{
    while (u->doomed) {
        router_up_req *q = u->doomed;
        u->doomed = q->doomed_next;
        detach_free(q);
    }
}

static int map_result(router_up_req *q, CURLcode res)
{
    if (res == CURLE_OK) return 0;
    if (q->user_abort) return dx_errf(DX_ECANCELED, "upstream: transfer stopped by the router");
    const char *why = q->errbuf[0] ? q->errbuf : curl_easy_strerror(res);
    if (res == CURLE_OPERATION_TIMEDOUT) return dx_errf(DX_ETIMEDOUT, "%s", why);
    return dx_errf(DX_ETRANSPORT, "%s", why);
}

static void check_done(router_up *u)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(u->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        router_up_req *q = NULL;
        CURLcode res = m->data.result;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&q);
        DX_ASSERT(q && !q->canceled); /* canceled ones were removed with their message */
        int rc = map_result(q, res);
        long status = q->head_done ? q->status : 0;
        router_up_cb cb = q->cb;
        void *user = q->user;
        detach_free(q);
        cb.on_done(user, rc, status);
    }
}

/* h with "name: value" appended; NULL (h freed) when out of memory. */
static struct curl_slist *add_header(struct curl_slist *h, const char *name, const char *value)
{
    size_t n = strlen(name) + strlen(value) + 3;
    char *line = dx_malloc(n);
    struct curl_slist *t = NULL;
    if (line) {
        snprintf(line, n, "%s: %s", name, value);
        t = curl_slist_append(h, line);
        dx_free(line);
    }
    if (!t) curl_slist_free_all(h);
    return t;
}

static struct curl_slist *make_headers(const router_up_request *r)
{
    /* no "Expect: 100-continue" round trip before a large body */
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");
    if (h && r->body) h = add_header(h, "Content-Type", "application/json");
    if (h && r->auth) h = add_header(h, "Authorization", r->auth);
    if (h && r->internal_key) h = add_header(h, HTTP_AUTH_INTERNAL_HEADER, r->internal_key);
    return h;
}

static void set_options(router_up_req *q, const router_up_request *r)
{
    CURL *e = q->easy;
    curl_easy_setopt(e, CURLOPT_URL, r->url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)q);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, q);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, q->errbuf);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, q->hdrs);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                     r->connect_timeout_ms > 0 ? r->connect_timeout_ms : 2000L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, r->timeout_ms > 0 ? r->timeout_ms : 0L);
    if (strcmp(r->method, "POST") == 0) {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body ? r->body : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
    } else {
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    }
}

int router_up_start(router_up *u, const router_up_request *r, const router_up_cb *cb, void *user,
                    router_up_req **out)
{
    DX_ASSERT(!u->destroying && cb->on_done);
    *out = NULL;
    router_up_req *q = dx_calloc(1, sizeof *q);
    if (!q) return dx_errf(DX_ENOMEM, "upstream: out of memory");
    q->u = u;
    q->cb = *cb;
    q->user = user;
    q->easy = u->n_idle ? u->idle[--u->n_idle] : curl_easy_init();
    q->hdrs = make_headers(r);
    if (!q->easy || !q->hdrs) {
        if (q->easy) curl_easy_cleanup(q->easy);
        curl_slist_free_all(q->hdrs);
        dx_free(q);
        return dx_errf(DX_ENOMEM, "upstream: out of memory");
    }
    set_options(q, r);
    CURLMcode mc = curl_multi_add_handle(u->multi, q->easy);
    if (mc != CURLM_OK) {
        curl_easy_cleanup(q->easy);
        curl_slist_free_all(q->hdrs);
        dx_free(q);
        return dx_errf(DX_EIO, "upstream: %s", curl_multi_strerror(mc));
    }
    dx_list_push_front(&u->active, &q->link);
    u->n_active++;
    *out = q;
    return 0;
}

void router_up_cancel(router_up_req *q)
{
    if (!q || q->canceled) return;
    q->canceled = 1;
    router_up *u = q->u;
    if (u->in_curl) { /* removed when curl returns */
        q->doomed_next = u->doomed;
        u->doomed = q;
        return;
    }
    detach_free(q);
}

size_t router_up_n_active(const router_up *u)
{
    return u->n_active;
}

/* ---- lifecycle ---------------------------------------------------------------- */

int router_up_create(uv_loop_t *loop, router_up **out)
{
    static int curl_ready;
    *out = NULL;
    if (!curl_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            return dx_errf(DX_EIO, "upstream: curl_global_init failed");
        curl_ready = 1;
    }
    router_up *u = dx_calloc(1, sizeof *u);
    if (!u) return dx_errf(DX_ENOMEM, "upstream: out of memory");
    u->loop = loop;
    dx_list_init(&u->active);
    dx_list_init(&u->socks);
    u->multi = curl_multi_init();
    if (!u->multi) {
        dx_free(u);
        return dx_errf(DX_ENOMEM, "upstream: curl_multi_init failed");
    }
    curl_multi_setopt(u->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(u->multi, CURLMOPT_SOCKETDATA, u);
    curl_multi_setopt(u->multi, CURLMOPT_TIMERFUNCTION, on_timer_set);
    curl_multi_setopt(u->multi, CURLMOPT_TIMERDATA, u);
    curl_multi_setopt(u->multi, CURLMOPT_MAXCONNECTS, 1024L);
    uv_timer_init(loop, &u->timer);
    u->timer.data = u;
    u->n_handles = 1;
    *out = u;
    return 0;
}

static void on_timer_closed(uv_handle_t *h)
{
    router_up *u = h->data;
    u->n_handles--;
    maybe_free(u);
}

void router_up_destroy(router_up *u)
{
    if (!u) return;
    DX_ASSERT(u->in_curl == 0);
    u->destroying = 1;
    reap_doomed(u);
    for (dx_list *n; (n = dx_list_first(&u->active));) {
        router_up_req *q = DX_LIST_ENTRY(n, router_up_req, link);
        q->canceled = 1;
        detach_free(q);
    }
    while (u->n_idle) curl_easy_cleanup(u->idle[--u->n_idle]);
    curl_multi_cleanup(u->multi); /* closes cached connections */
    u->multi = NULL;
    for (dx_list *n; (n = dx_list_first(&u->socks));) sock_close(DX_LIST_ENTRY(n, up_sock, link));
    uv_timer_stop(&u->timer);
    uv_close((uv_handle_t *)&u->timer, on_timer_closed);
}
