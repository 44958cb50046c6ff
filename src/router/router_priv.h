/* router_priv: what the router's files share — the router itself, its node
 * table, its metrics, and the flow's entry points that router.c calls.
 * A request's own state (rt_req) is the flow's: router_flow_priv.h.
 *
 * The files call one way, top to bottom (scripts/check_layers.sh checks
 * that no two call each other in a circle):
 *
 *   router.c          config, the routes, the lifecycle (create, shutdown, destroy)
 *   router_flow.c     a completion's way: preparation done → lookup → route
 *   router_prefill.c  the prefill leg: its body, its answer, its retry
 *   router_decode.c   the decode leg: the answer proxied, its retry
 *   router_entry.c    the conversation's entry: the params it yields, its store
 *   router_prep.c     the preparation off the loop: parse, keys, token count
 *   router_req.c      a request's life, its answers to the client, its upstream request
 *   router_metrics.c  the router's own series and the /metrics text
 *   router_nodes.c    the node table: static and discovered nodes, their health
 *   router_pick.c     the node choice, pure (router_pick.h)
 *
 * What the flow must tell the top (a request has gone: the shutdown may be
 * over, a destroyed router may be freed) goes up through on_req_gone. */
#ifndef ROUTER_PRIV_H
#define ROUTER_PRIV_H

#include <jansson.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "base/dx_list.h"
#include "model/model.h"
#include "http/http_app.h"
#include "http/http_conn.h"
#include "oai/oai_anth.h"
#include "oai/oai_front.h"
#include "oai/oai_req.h"
#include "oai/oai_rsp.h"
#include "http/prom.h"
#include "http/work_pool.h"
#include "router/router.h"
#include "router/router_disc.h"
#include "router/router_key.h"
#include "router/router_pick.h"
#include "router/router_rsp.h"
#include "router/router_sse.h"
#include "router/router_store.h"
#include "router/router_up.h"

#define RT_URL_MAX      256
#define RT_DISCOVER_MAX 1024 /* discovered node URLs a router keeps slots for */

/* A node's identity and health check; its state and load, which the node
 * choice reads, are r->live[index] (router_pick_node). */
typedef struct {
    router *r;
    int index;
    char url[RT_URL_MAX];         /* normalised base, "http://host:port" */
    char labels[RT_URL_MAX + 32]; /* node="...",role="..." */
    int discovered;               /* from a registration (--discover), not a static list */
    int seen;                     /* in the current scan */
    char hbody[48];               /* the start of the health check's answer */
    size_t hlen;
    router_up_req *check; /* health check in flight */
} rt_node;

struct router {
    uv_loop_t *loop;
    dx_buf front_out; /* an event written again for its front door (loop) */
    router_config cfg;
    http_srv *http;
    router_rsp *responses; /* the Responses API's stored responses (off the loop only) */
    router_up *up;
    router_store *store;                  /* the conversation map: memory or Redis */
    model *tok;                           /* tokenizer and chat template only, or NULL */
    http_auth *auth;                      /* clients' API keys; the internal key nodes get */
    uint8_t ns_secret[ROUTER_KEY_SECRET]; /* keys tenants' namespaces (router_key.h) */
    /* Static prefill nodes, static decode nodes, then discovered ones in the
     * order they appeared.  The arrays are sized once (statics +
     * RT_DISCOVER_MAX) and never move, and a node keeps its index for the
     * router's life (a vanished one is marked gone and comes back in the
     * same slot), so the indices requests and conversation entries hold
     * stay valid.  nodes[i] and live[i] are one node. */
    rt_node *nodes;
    router_pick_node *live;
    size_t n_nodes, cap_nodes;
    size_t n_prefill; /* prefill nodes not gone */
    router_disc *disc;
    char model[33];        /* the fingerprint discovered nodes must have ("" until the first) */
    size_t n_skipped;      /* registrations skipped in the last scan (another model) */
    uint64_t disc_dropped; /* registrations not taken: no free slot */
    uv_timer_t health, grace;
    int n_handles;   /* uv handles not yet closed */
    work_pool *prep; /* requests' preparation, off the loop */
    int n_work;      /* requests being prepared there */
    int draining, stopped, destroying;
    dx_list active; /* rt_req, newest first */
    size_t n_active;
    /* Set by router.c: called when a request has left `active` (ended, or
     * forgotten after destroy). */
    void (*on_req_gone)(router *r);
    unsigned rr[2];      /* the node choice's rotations (router_pick_cluster) */
    dx_buf scratch, out; /* per event work space (loop thread) */
    /* metrics */
    http_app *app;         /* routes, checks, counted answers (the requests family) */
    prom_family routed;    /* via = local | prefill */
    prom_family fallbacks; /* reason */
    uint64_t affinity_hits, affinity_misses;
    prom_hist ttft, added_before, added_between, added_stream;
};

/* ---- router_nodes.c: the node table ---- */
/* The static lists (--prefill, --decode): DX_EINVAL naming the flag. */
int rt_nodes_setup(router *r);
/* --discover: registrations read every health interval add and drop nodes. */
int rt_nodes_discover(router *r);
void rt_nodes_free(router *r);
/* Starts a health check on every node without one (the health timer). */
void rt_nodes_check(router *r);
/* Cancels the checks in flight (destroy). */
void rt_nodes_stop(router *r);
/* A request to the node failed to connect: skip it until a check succeeds. */
void rt_nodes_failed(router *r, int node, const char *why);
/* A decode node takes requests, and a prefill node too if any are known. */
int rt_nodes_healthy(const router *r);
/* The node choice's input: the table's states, the rotations, the knobs. */
router_pick_cluster rt_nodes_cluster(router *r);
/* The store names decode nodes by URL (router_store_config's callbacks;
 * user is the router). */
const char *rt_nodes_url_of(void *user, int node);
int rt_nodes_decode_of(void *user, const char *url, size_t len);
/* The per-node gauges and, with --discover, the discovery's. */
void rt_nodes_write_metrics(const router *r, dx_buf *b);

/* ---- router_metrics.c ---- */
void rt_metrics_init(router *r);
void rt_metrics_free(router *r);
void rt_metrics_request(router *r, const char *path, int status);
void rt_metrics_fallback(router *r, const char *reason);
/* Observes the seconds since since_ns (dx_now_ns) in h. */
void rt_metrics_observe(prom_hist *h, uint64_t since_ns);
void rt_metrics_render(router *r, dx_buf *b);

/* ---- the flow's entry points, for router.c ---- */
/* router_flow.c */
/* front: the door it came through (oai_front.h); count: Anthropic's
 * count_tokens (the answer is the prompt's size). */
void rt_flow_completion(router *r, http_conn *c, const http_req *hr, enum oai_kind kind, int front,
                        int count, const http_auth_result *who, uint64_t t0);
/* GET and DELETE /v1/responses/{id}, on the work pool. */
void rt_flow_response(router *r, http_conn *c, const http_req *hr, const http_auth_result *who,
                      uint64_t t0);
/* GET passed through to a healthy node (/v1/models). */
void rt_flow_passthrough(router *r, http_conn *c, const http_req *hr, uint64_t t0);
/* router_req.c: an OpenAI-shaped error answer to a connection that has no
 * request (yet): refused; clears the connection's abort first. */
void rt_req_refuse(router *r, http_conn *c, const char *method, const char *path, int status,
                   const char *msg, const char *param, uint64_t t0);
/* router_req.c: answers and ends every request in flight (the grace period
 * is over, or destroy); one being prepared is ended when that is done. */
void rt_req_abort_all(router *r);

#endif
