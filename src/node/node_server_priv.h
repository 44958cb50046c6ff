/* node_server_priv: the server's and a request's state, shared by the files
 * of the node server, and what each of them offers the ones above it.
 *
 * The files form layers (scripts/check_layers.sh): each calls only the ones
 * below it, and a lower one reaches an upper one only through a function
 * pointer the upper one hands it (node_events_drain's `done`, node_pd's
 * on_pulled), as libuv's loop calls back and is never called back into.
 *
 *   node_server.c   routes, a request's lifecycle (arrival, submit, end),
 *                   the server's (create, drain, shutdown, destroy)
 *   node_prep.c     a request's preparation, on the work pool
 *   node_events.c   engine events: the engine thread → loop hand-off
 *   node_metrics.c  GET /metrics, and what a finished request adds to it
 *   node_answer.c   the answers: streamed chunks, final answers, logprobs,
 *                   tool calls and reasoning parsed out of the text
 *   node_hooks.c    the P/D hooks: the request as node_pd sees it
 *   node_pd.c       the P/D steps (node_pd.h), knowing no node_req
 *
 * A request's fields say which thread may touch them when. */
#ifndef NODE_SERVER_PRIV_H
#define NODE_SERVER_PRIV_H

#include <pthread.h>
#include <uv.h>

#include "base/dx_buf.h"
#include "base/dx_list.h"
#include "node/hist.h"
#include "http/http_app.h"
#include "http/http_auth.h"
#include "http/http_conn.h"
#include "node/node_gram.h"
#include "node/node_pd.h"
#include "node/node_server.h"
#include "oai/oai_front.h"
#include "oai/oai_req.h"
#include "oai/oai_resp.h"
#include "oai/oai_rsp.h"
#include "oai/oai_rsp_store.h"
#include "oai/oai_tools.h"
#include "http/prom.h"
#include "http/work_pool.h"

typedef struct node_req node_req;

#define NODE_WARN_MAX 1024 /* bytes of an X-Duplex-Warning value */

/* A generated token's logprobs, engine thread → loop. */
typedef struct {
    int32_t id;
    float lp;
    uint32_t n_top;
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
    float top_lps[ENGINE_MAX_TOP_LOGPROBS];
} node_lp;

/* One piece of pending text (a token's, as its SSE chunk): its end offset,
 * and its token's logprobs record (index in the same take), or -1. */
typedef struct {
    uint32_t end;
    int32_t lp;
} node_cut;

/* A DONE event's figures, copied off the engine thread into the request
 * (the message into a fixed array: the DONE path never allocates, so it
 * cannot be lost). */
typedef struct {
    enum engine_finish finish;
    int error;
    uint32_t n_prompt, n_cached, n_gen, n_preempted;
    int stop_index; /* the stop string that ended it (index in the request's), or -1 */
    double ttft_s;  /* engine-side: submit → first token */
    int has_msg;
    char msg[256];
} node_done;

struct node_req {
    node_server *srv;
    dx_list link; /* on srv->active, from arrival until the request is freed */
    /* Preparation — parsing, the P/D params, the prompt's tokens — runs on
     * the server's work pool (node_prep_run); until its done the loop
     * touches only conn and preparing. */
    http_app_prep prep; /* the body, held while it is read off the loop */
    int preparing;      /* loop: with the pool */
    size_t charged;     /* loop: the parsed request's bytes in conn's buffer budget */
    int tokenize;       /* POST /tokenize: the answer is the prompt's tokens */
    enum oai_kind kind;
    /* The front door it came through (docs/api.md): chat and completions
     * are answered as they are; a Messages or Responses request was
     * translated into a chat request while preparing, and its chat answer
     * goes out through `fr` in the door's shape. */
    enum oai_front_api front;
    int count_only;     /* POST /v1/messages/count_tokens: the answer is the prompt's size */
    oai_front *fr;      /* the answer's transcoder (front doors; made at submit) */
    char *client_model; /* the model string the client sent (front doors' answers) */
    oai_rsp_req rsp;    /* Responses: the request as parsed (store, echo, previous id) */
    json_t *chat_doc;   /* Responses: the chat request it became (its messages: the history) */
    char rsp_id[48];    /* Responses: "resp_…" */
    uint8_t tenant[OAI_RSP_STORE_TENANT]; /* the caller's API-key digest (stored responses) */
    int has_tenant;
    /* the request's stop strings (NUL-separated), to say which ended it */
    dx_buf stops;
    uint32_t n_stops;
    int prep_rc; /* pool → loop: 0, or the failure in prep_err */
    oai_err prep_err;
    const char *prep_code; /* the error's OpenAI code, or NULL */
    oai_req o;             /* the parsed request, until the engine has it */
    http_conn *conn;       /* NULL once the client is gone */
    uint64_t engine_id;
    char id[64];
    oai_meta meta;
    int stream, include_usage;
    int logprobs; /* report logprobs (copied from o) */
    uint32_t top_logprobs;
    int has_max_tokens; /* copied from o: P/D reads them after o is freed */
    uint32_t max_tokens;
    dx_buf lp_all; /* loop: every token's node_lp, for a non-streamed answer */
    int parse;     /* tool calls or reasoning are parsed out of the answer */
    oai_tools_opts topts;
    oai_tools *tp;    /* streaming: the parser the answer's pieces go through */
    size_t lp_offset; /* loop: completions' text_offset so far */
    int head_sent;    /* a stream's HTTP head and first chunk have gone out */
    dx_buf text;      /* the answer so far (non-streaming, or kept for the reply memory) */
    int keep_text;    /* streaming too: the reply memory needs what the client got */
    uint64_t t_start_ns, t_first_ns;
    const char *path;
    char *extra;     /* raw JSON members for the final answer (P/D roles) */
    int32_t *prompt; /* the tokens submitted (P/D and the reply memory need them) */
    size_t n_prompt;
    node_pd_req pd;
    int trusted;                  /* the caller may give kv_transfer_params (http_auth.h) */
    http_auth_result who;         /* the caller's credentials, for the preparation */
    uint8_t salt[HTTP_AUTH_SALT]; /* its prefix-cache namespace; all zero: shared */
    int lost;                     /* loop: text was lost (out of memory); the request is canceled */
    /* Structured outputs (node_gram.h): the compiled constraint, held until
     * the request is freed (after its DONE: the engine is done with it), and
     * the warning header for keywords a non-strict schema ignored. */
    node_gram *gram;
    char *warn_hdr; /* "X-Duplex-Warning: …\r\n", or NULL */
    /* Engine thread → loop, guarded by srv->mu. */
    dx_buf pend;        /* text not yet taken by the loop (reset, never freed, when taken) */
    dx_buf pend_cuts;   /* node_cut of each event's text (or logprobs) */
    dx_buf pend_lp;     /* node_lp records the cuts point to */
    size_t pend_tokens; /* tokens not yet taken */
    int pend_lost;      /* text could not be appended (out of memory) */
    int queued;         /* on srv->ready or in the batch the loop is working through */
    node_req *ready_next;
    int done;      /* DONE has arrived: `fin` is final, the engine is finished with q */
    node_done fin; /* the DONE event's figures, copied */
};

struct node_server {
    uv_loop_t *loop;
    node_server_config cfg;
    http_srv *http;
    node_backend be;
    int ready, draining, stopped, quiet;
    int shutting; /* node_server_shutdown: stop once idle (draining alone keeps serving the rest) */
    uv_async_t wake;
    uv_timer_t grace; /* the grace period; then the wait for the last bytes to go out */
    int flush_waits;
    pthread_mutex_t mu;
    /* Guarded by mu: requests with events to handle, oldest first.  A
     * singly linked queue, not a dx_list: the engine thread appends at the
     * tail and the loop detaches it whole (node_events.c), never unlinking
     * one from the middle, which is what a doubly linked list is for. */
    node_req *ready_head, *ready_tail;
    dx_list active; /* loop: every request not yet freed (node_req.link) */
    size_t n_active;
    int64_t started;
    dx_buf scratch;       /* chunk being built (loop thread) */
    dx_buf take;          /* a request's pending text, copied out (loop thread) */
    dx_buf take_cuts;     /* and its pieces (node_cut) */
    dx_buf take_lp;       /* and their logprobs (node_lp) */
    dx_buf scratch_lp;    /* a chunk's logprobs JSON (loop thread) */
    dx_buf scratch_front; /* a chunk written again for its front door (loop thread) */
    http_app *app;        /* routes, checks, counted answers (the requests family) */
    /* metrics (loop thread only) */
    prom_hist ttft, engine_ttft, tpot, e2e;
    uint64_t gen_tokens, prompt_tokens, cached_tokens;
    hist_mem *mem;            /* replies this node generated (token-faithful history) */
    work_pool *prep;          /* requests' preparation, off the loop */
    node_gram_cache *grams;   /* compiled structured-output grammars (thread-safe) */
    oai_rsp_store *responses; /* the Responses API's stored responses (thread-safe) */
    node_pd pd;               /* P/D's configuration and counters */
};

/* The model's name in answers and /v1/models. */
static inline const char *node_served_name(const node_server *s)
{
    return s->cfg.served_model_name ? s->cfg.served_model_name : s->be.model_name;
}

/* ---- node_hooks.c: the P/D hooks ---------------------------------------- */

/* The request as node_pd sees it: only fields fixed once it is prepared,
 * so any thread that holds q may call it (the engine thread does). */
void node_hooks_view(const node_req *q, node_pd_view *v);
/* What P/D needs of the server once the backend is set; on_pulled: the
 * server's end of a pull (its user is the node_req). */
void node_hooks_config(const node_server *s, void (*on_pulled)(void *user), node_pd_config *c);
/* Loop, at the request's DONE: the answer's kv_transfer_params (q->extra),
 * the reply memory, the P/D counters. */
void node_hooks_finish(node_server *s, node_req *q);

/* ---- node_answer.c: the answers ----------------------------------------- */

/* Pool thread: whether and how the answer's tool calls and reasoning are
 * parsed out (q->parse, q->topts), from the parsed request and the prompt. */
void node_answer_parse_opts(const node_server *s, node_req *q);
/* Loop, at submit: the streaming parser, when the answer is parsed.  0 or
 * DX_ENOMEM. */
int node_answer_setup(node_req *q);
/* Loop: text taken from q in one go (several events' worth), cut into
 * cuts[0..n_cuts); streamed as one SSE chunk per piece, or kept. */
void node_answer_tokens(node_req *q, const char *text, size_t len, size_t n_tokens,
                        const node_cut *cuts, size_t n_cuts, const node_lp *lps, size_t n_lps);
/* Loop, at q's DONE: the final answer, if the client is still there;
 * returns the status (499: it left first). */
int node_answer_done(node_req *q);
const char *node_answer_finish_name(enum engine_finish f);

/* ---- node_metrics.c: /metrics ------------------------------------------- */

/* GET /metrics. */
void node_metrics_respond(node_server *s, http_conn *c, const http_req *r, uint64_t t0);
/* q has been answered with status: its figures into the metrics, its log
 * line. */
void node_metrics_done(node_server *s, node_req *q, int status);

/* ---- node_events.c: engine thread → loop -------------------------------- */

/* engine_request.on_event, with the node_req as user (engine thread). */
void node_events_on_engine(void *user, const engine_event *ev);
/* Loop: hands every request with events its text (node_answer_tokens) and,
 * for one whose DONE has come, calls done(s, q) after it: the engine is
 * finished with q, and done ends it. */
void node_events_drain(node_server *s, void (*done)(node_server *s, node_req *q));

/* ---- node_prep.c: preparation off the loop ------------------------------- */

/* The job's run (work_fn; the job is q->prep.job), on a pool thread: parse,
 * check, P/D params, the prompt's tokens, the grammar.  Touches only q
 * (never q->conn) and what the server does not change while serving;
 * leaves the outcome in q->prep_rc and q->prep_err. */
void node_prep_run(work_job *j);

#endif
