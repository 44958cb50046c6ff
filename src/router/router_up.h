/* router_up: the router's HTTP client for its upstream nodes — libcurl's
 * multi interface driven by a libuv loop.
 *
 * curl tells us which sockets to watch (CURLMOPT_SOCKETFUNCTION: one
 * uv_poll_t per socket) and when to call it back (CURLMOPT_TIMERFUNCTION:
 * one uv_timer_t); uv events go back to curl_multi_socket_action.  Nothing
 * blocks the loop: name resolution uses curl's threaded resolver.  One multi
 * handle means one connection cache, so connections to a node are kept
 * alive across requests; finished easy handles are kept for reuse.
 *
 * Callbacks run on the loop thread.  on_head and on_data run inside curl
 * (from curl_multi_socket_action); on_done runs after curl has returned, so
 * it may start new requests.  router_up_cancel is safe anywhere, inside a
 * callback too: a request canceled inside curl is aborted when its callback
 * returns. */
#ifndef ROUTER_UP_H
#define ROUTER_UP_H

#include <stddef.h>
#include <uv.h>

typedef struct router_up router_up;
typedef struct router_up_req router_up_req;

typedef struct {
    /* The final response head has arrived (a 100 Continue is skipped). */
    void (*on_head)(void *user, long status);
    /* Each header line of the response as it arrives ("Name: value", no
     * line end; the status lines too, interim ones included), or NULL. */
    void (*on_header)(void *user, const char *line, size_t len);
    /* Body bytes as they arrive, transfer coding removed.  Non-zero aborts
     * the transfer; on_done follows with DX_ECANCELED. */
    int (*on_data)(void *user, const char *p, size_t n);
    /* Once, last.  rc 0: the whole answer arrived.  Negative: DX_ETRANSPORT
     * (refused, reset, a broken answer), DX_ETIMEDOUT, DX_ECANCELED;
     * dx_errmsg() says what happened.  status is 0 when no head came.
     * The request handle is gone once this returns. */
    void (*on_done)(void *user, int rc, long status);
} router_up_cb;

typedef struct {
    const char *method;       /* "GET" | "POST" */
    const char *url;          /* absolute http:// URL */
    const char *auth;         /* Authorization header value to pass on, or NULL */
    const char *internal_key; /* sent as X-Duplex-Internal-Key, or NULL */
    const char *body;         /* POST: borrowed, must live until on_done or cancel */
    size_t body_len;
    long timeout_ms;         /* whole request; 0 = none (streams) */
    long connect_timeout_ms; /* 0 = 2000 */
} router_up_request;

int router_up_create(uv_loop_t *loop, router_up **out);
/* Aborts every request without callbacks and closes the handles: run the
 * loop afterwards, as libuv closes them asynchronously.  Not from inside
 * one of this client's callbacks.  NULL: no-op. */
void router_up_destroy(router_up *u);

/* Starts a request; its callbacks run on later loop turns, never inside
 * this call.  DX_ENOMEM / DX_EIO with a message. */
int router_up_start(router_up *u, const router_up_request *r, const router_up_cb *cb, void *user,
                    router_up_req **out);
/* No callback of q runs after this.  NULL: no-op. */
void router_up_cancel(router_up_req *q);
size_t router_up_n_active(const router_up *u);

#endif
