/* router_priv: what router.c (nodes, health, metrics, simple routes,
 * lifecycle) and router_flow.c (the completion flow) share. */
#ifndef ROUTER_PRIV_H
#define ROUTER_PRIV_H

#include <jansson.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "model/model.h"
#include "http/http_app.h"
#include "http/http_conn.h"
#include "oai/oai_req.h"
#include "http/prom.h"
#include "http/work_pool.h"
#include "router/router.h"
#include "router/router_disc.h"
#include "router/router_key.h"
#include "router/router_sse.h"
#include "router/router_store.h"
#include "router/router_up.h"

#define RT_URL_MAX      256
#define RT_DISCOVER_MAX 1024 /* discovered node URLs a router keeps slots for */

typedef struct {
    router *r;
    int index;
    char url[RT_URL_MAX];         /* normalised base, "http://host:port" */
    char labels[RT_URL_MAX + 32]; /* node="...",role="..." */
    int prefill;                  /* role: 1 prefill, 0 decode */
    int healthy;                  /* the last check or connection succeeded */
    /* Draining (its /health said so, or its registration): no new requests,
     * but its KV port still serves what it holds — not a dead holder. */
    int draining, reg_draining;
    int discovered; /* from a registration (--discover), not a static list */
    int gone;       /* its registration vanished: never picked, never checked */
    int seen;       /* in the current scan */
    char hbody[48]; /* the start of the health check's answer */
    size_t hlen;
    router_up_req *check;        /* health check in flight */
    uint32_t outstanding;        /* requests in flight */
    uint64_t outstanding_tokens; /* prompt tokens in flight (prefill) */
} rt_node;

typedef struct rt_req rt_req;

struct router {
    uv_loop_t *loop;
    router_config cfg;
    http_srv *http;
    router_up *up;
    router_store *store; /* the conversation map: memory or Redis */
    model *tok;                           /* tokenizer and chat template only, or NULL */
    http_auth *auth;                      /* clients' API keys; the internal key nodes get */
    uint8_t ns_secret[ROUTER_KEY_SECRET]; /* keys tenants' namespaces (router_key.h) */
    /* Static prefill nodes, static decode nodes, then discovered ones in the
     * order they appeared.  The array is sized once (statics + RT_DISCOVER_MAX)
     * and never moves, and a node keeps its index for the router's life (a
     * vanished one is marked gone and comes back in the same slot), so the
     * indices requests and conversation entries hold stay valid. */
    rt_node *nodes;
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
    rt_req *active;
    size_t n_active;
    unsigned rr[2];      /* rotate ties between equally loaded nodes: [0] decode, [1] prefill */
    dx_buf scratch, out; /* per event work space (loop thread) */
    /* metrics */
    http_app *app;             /* routes, checks, counted answers (the requests family) */
    prom_family routed;        /* via = local | prefill */
    prom_family fallbacks;     /* reason */
    uint64_t affinity_hits, affinity_misses;
    prom_hist ttft, added_before, added_between, added_stream;
};

/* ---- router.c ---- */
void rt_count_request(router *r, const char *path, int status);
void rt_count_fallback(router *r, const char *reason);
/* An OpenAI-shaped error answer; clears the connection's abort first. */
void rt_respond_error(router *r, http_conn *c, const char *method, const char *path, int status,
                      const char *msg, const char *param, uint64_t t0);
/* A request to a node failed to connect: skip it until a check succeeds. */
void rt_node_failed(router *r, int node, const char *why);
int rt_node_is_decode(const router *r, int node);
/* The node may get new requests: healthy, not draining, not gone. */
int rt_node_takes_new(const rt_node *n);
/* The node still serves the KV it holds: up or draining, not gone. */
int rt_node_holds(const rt_node *n);
/* A prefill body is worth preparing: prefill nodes are configured or may
 * be discovered (immutable: read on the preparation threads). */
int rt_may_prefill(const router *r);
void rt_maybe_stopped(router *r);
/* Frees a destroyed router once its handles and thread-pool work are done. */
void rt_maybe_free(router *r);
double rt_now_s(void);

/* ---- router_flow.c ---- */
void rt_route_completion(router *r, http_conn *c, const http_req *hr, enum oai_kind kind,
                         const http_auth_result *who, uint64_t t0);
/* GET passed through to a healthy node (/v1/models). */
void rt_route_passthrough(router *r, http_conn *c, const http_req *hr, uint64_t t0);
/* Answers and ends every request in flight (the grace period is over, or
 * destroy); one whose prompt is being counted is ended when that is done. */
void rt_abort_all(router *r);
void rt_forget(router *r, rt_req *q);

#endif
