/* router_flow_priv: a completion request's state (rt_req) and what the
 * flow's files share (router_priv.h lists them, top to bottom).
 *
 * Lifetime: an rt_req lives from the parsed request until rt_req_end, which
 * answers nothing itself — every path answers the client first.  At most
 * one upstream request is in flight per rt_req (q->up).  The client leaving
 * runs the request's abort: outside an upstream callback it stops the
 * upstream request and ends q at once; inside one (q->busy: a write to the
 * client failed under us) it only clears q->conn, and the callback, seeing
 * that, stops the transfer and ends q itself.  Node load counters are
 * taken when an upstream request starts and given back exactly once. */
#ifndef ROUTER_FLOW_PRIV_H
#define ROUTER_FLOW_PRIV_H

#include "router/router_priv.h"

#define RT_ANSWER_MAX ((size_t)64 << 20) /* a node's whole (non-streamed) answer */
#define RT_EVENT_MAX  ((size_t)16 << 20) /* one SSE event (the final one carries token ids) */
#define RT_REPLY_MAX  ((size_t)16 << 20) /* reply text kept for a content key */

enum rt_phase { PH_PASS, PH_PREFILL, PH_DECODE };
enum rt_keykind { KEY_NONE, KEY_ID, KEY_CHAT };

typedef struct rt_req rt_req;

struct rt_req {
    router *r;
    dx_list link;    /* r->active */
    http_conn *conn; /* NULL once answered or gone */
    const char *method, *path;
    const char *up_path; /* what the nodes are asked: the chat route for the other doors */
    enum oai_kind kind;
    /* The front door it came through (oai_front.h): a Messages or Responses
     * request is translated into a chat request while it is prepared, the
     * nodes answer chat, and `fr` writes their answer in the door's shape
     * (router_req.c's answers). */
    enum oai_front_api front;
    int count_only;     /* Anthropic's count_tokens: the nodes' /tokenize, answered as its size */
    oai_front *fr;      /* made once prepared */
    char *client_model; /* the model string the client sent */
    oai_rsp_req rsp;    /* Responses: the request as parsed */
    json_t *chat_doc;   /* Responses: the chat request it became (the history's start) */
    char rsp_id[48];
    uint8_t tenant[OAI_RSP_STORE_TENANT]; /* the caller's API-key digest */
    int has_tenant;
    char *warn_hdr; /* the decode node's "X-Duplex-Warning: …\r\n", passed on, or NULL */
    /* Responses with store: the answer's end (response.completed, or the
     * whole body) waits until the response is stored, so a client that
     * continues it at once finds it (router_entry.c) */
    int defer_end;
    int end_held;   /* the end is in `tail`, waiting for the store */
    int tail_whole; /* tail is a whole answer's body, not a stream's last events */
    dx_buf tail;
    int storing; /* the store job owns q (in_work is set too) */
    enum rt_phase phase;
    int stream; /* the client asked for a stream */
    int busy;   /* an upstream callback (or the shutdown) owns q and will end it */
    uint64_t t0, t_first;
    /* conversation */
    enum rt_keykind key_kind;
    router_key key;             /* ID: the key; CHAT: the prefix an entry was found under */
    router_key chain;           /* CHAT: the key of all the request's messages */
    router_pick_entry entry;    /* what the lookup found (entry.node -1: nothing) */
    int affinity;               /* enum router_pick_affinity: -1 unkeyed, 0 miss, 1 hit */
    router_store_op *lookup_op; /* the conversation's lookup, while it waits for Redis */
    char *entry_params;         /* the entry's params (entry.has_params) */
    char *hist_params;          /* entry_params without the pull: their holder is down */
    uint32_t prompt_tokens;
    char *auth;
    /* bodies */
    dx_buf body;         /* the client's body, stripped: what a decode node gets */
    dx_buf pbody;        /* what a prefill node gets */
    dx_buf dbody;        /* body with the decode params spliced in */
    char *pparams;       /* the prefill node's params (JSON text) */
    const char *dparams; /* what the decode request carries: pparams, entry_params or NULL */
    const char *via;     /* "local" | "prefill" */
    /* upstream */
    router_up_req *up;
    int up_node; /* the node whose load counters hold q, or -1 */
    int decode, prefill, decode_tries, prefill_tries;
    int relay_events; /* the decode node streams: events go straight on */
    int stream_begun, sent_any, status_out;
    int client_left; /* before its answer was complete: counted as 499 */
    router_sse sse;
    dx_buf acc;   /* a whole answer (prefill, non-streamed, errors) */
    dx_buf reply; /* the reply text (content keys; and until the first text, for TTFT) */
    int reply_lost;
    json_t *new_params; /* what the decode node returned */
    long p_cached;      /* prompt tokens the prefill node did not compute (its usage) */
    oai_req o;          /* the parsed request, until the first upstream request starts */
    /* Preparation on the work pool (router_prep.c); until it is done the
     * loop touches only conn. */
    work_job job;
    int in_work;
    http_conn *held;     /* held while its body is read off the loop */
    const char *in_body; /* the client's body (held's) */
    size_t in_len;
    char *conv_hdr;   /* X-Conversation-Id, copied */
    router_key *keys; /* CHAT: the key of each prefix of the messages */
    size_t n_keys;
    dx_buf pbase;          /* the prefill body without its params */
    int prep_status;       /* 0, or the HTTP status of what was wrong */
    const char *prep_code; /* and its error code, or NULL */
    char prep_msg[256], prep_param[64];
    http_auth_result who; /* the caller's credentials: its tenant */
};

/* ---- router_req.c: life, answers, the upstream request ---- */
/* A request on r->active with c's abort set; NULL: out of memory. */
rt_req *rt_req_new(router *r, http_conn *c, const http_req *hr, uint64_t t0);
/* q is over: the client has its answer (or is gone); counted, logged, freed. */
void rt_req_end(rt_req *q);
/* q leaves without being counted or logged: it was never routed (its
 * answer, if any, was given and counted otherwise). */
void rt_req_forget(rt_req *q);
/* Starts q's upstream request to node's base URL + q's path and takes the
 * node's load counters. */
int rt_req_up_send(rt_req *q, int node, const char *body, size_t len, long timeout_ms,
                   const router_up_cb *cb);
/* An upstream request is over: q is the callback's to end.  1 when the
 * client has left (q is then ended already). */
int rt_req_up_finished(rt_req *q);
/* The upstream callback's on_data that keeps the whole answer in q->acc. */
int rt_req_acc_on_data(void *user, const char *p, size_t n);
void rt_req_reply_full(rt_req *q, int status, const char *body, size_t len);
void rt_req_reply_error(rt_req *q, int status, const char *msg, const char *param);
/* The same with an error code (OpenAI's "code": previous_response_not_found…). */
void rt_req_reply_error_code(rt_req *q, int status, const char *msg, const char *param,
                             const char *code);
/* Writes to the client's stream, begun with the first write.  Non-zero (a
 * DX code): the client is gone. */
int rt_req_stream_write(rt_req *q, const char *p, size_t n);
/* Ends the client's stream, after an error event when msg is set; with an
 * end held for the store, waits for rt_req_release_end. */
void rt_req_stream_finish(rt_req *q, const char *msg);
/* The held end goes out (the stream's last events and its end, or the
 * whole answer).  No-op when nothing is held. */
void rt_req_release_end(rt_req *q);

/* ---- router_prep.c: the work pool's part (a work_job's run) ---- */
void rt_prep_run(work_job *j);

/* ---- router_entry.c: the conversation's entry ---- */
/* Takes the lookup's hit into q (found stays 0 when its params cannot be
 * copied). */
void rt_entry_take(rt_req *q, const router_store_hit *e);
/* The entry's params are worth sending (router_pick_entry_usable). */
int rt_entry_usable(rt_req *q);
/* The stored params without the pull (their holder is down): their token
 * ids still give the history; NULL without params. */
const char *rt_entry_history_params(rt_req *q);
/* What a decode node gets when it prefills locally, or NULL. */
const char *rt_entry_local_params(rt_req *q);
/* What a prefill node gets (a new reference; NULL: out of memory). */
json_t *rt_entry_prefill_params(rt_req *q);
/* base with "kv_transfer_params":params spliced in as its first member. */
int rt_entry_splice(const dx_buf *base, const char *params, dx_buf *out);
/* The turn finished normally: store which node holds it, with its params. */
void rt_entry_store(rt_req *q);
/* A Responses answer that completed (and may be stored): kept for
 * previous_response_id and GET, on the work pool.  When the answer's end
 * waits for it (q->end_held), the job sends that end and ends q
 * (q->storing); otherwise the end goes now. */
void rt_entry_store_response(rt_req *q);

/* ---- router_decode.c: the decode leg ---- */
/* Starts the decode request (on another node if q->decode went down). */
int rt_decode_start(rt_req *q);

/* ---- router_prefill.c: the prefill leg ---- */
/* Builds the prefill body and starts the prefill request on q->prefill. */
int rt_prefill_start(rt_req *q);

#endif
