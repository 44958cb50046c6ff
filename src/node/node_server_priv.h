/* node_server_priv: the server's and a request's state, shared by the
 * files of the node server (node_server.c: HTTP, engine events, answers;
 * node_pd.c: the P/D steps of a request). */
#ifndef NODE_SERVER_PRIV_H
#define NODE_SERVER_PRIV_H

#include <pthread.h>
#include <uv.h>

#include "base/dx_buf.h"
#include "node/hist.h"
#include "http/http_app.h"
#include "http/http_auth.h"
#include "http/http_conn.h"
#include "node/node_gram.h"
#include "node/node_pd.h"
#include "node/node_server.h"
#include "oai/oai_req.h"
#include "oai/oai_resp.h"
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
    double ttft_s; /* engine-side: submit → first token */
    int has_msg;
    char msg[256];
} node_done;

struct node_req {
    node_server *srv;
    node_req *prev, *next; /* active list */
    int linked;            /* on the active list */
    /* Preparation — parsing, the P/D params, the prompt's tokens — runs on
     * the server's work pool (prep_run); until its done the loop touches
     * only conn and preparing. */
    http_app_prep prep; /* the body, held while it is read off the loop */
    int preparing;      /* loop: with the pool */
    size_t charged; /* loop: the parsed request's bytes in conn's buffer budget */
    int tokenize;   /* POST /tokenize: the answer is the prompt's tokens */
    enum oai_kind kind;
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
    node_req *ready_head, *ready_tail; /* guarded by mu: requests with events to handle */
    node_req *active;
    size_t n_active;
    int64_t started;
    /* metrics (loop thread only) */
    dx_buf scratch;    /* chunk being built (loop thread) */
    dx_buf take;       /* a request's pending text, copied out (loop thread) */
    dx_buf take_cuts;  /* and its pieces (node_cut) */
    dx_buf take_lp;    /* and their logprobs (node_lp) */
    dx_buf scratch_lp; /* a chunk's logprobs JSON (loop thread) */
    http_app *app; /* routes, checks, counted answers (the requests family) */
    prom_hist ttft, engine_ttft, tpot, e2e;
    uint64_t gen_tokens, prompt_tokens, cached_tokens;
    hist_mem *mem;    /* replies this node generated (token-faithful history) */
    work_pool *prep;  /* requests' preparation, off the loop */
    node_gram_cache *grams; /* compiled structured-output grammars (thread-safe) */
    node_pd_stats pd; /* loop thread only */
};

/* Hands q (tokens in q->prompt, P/D blocks in q->pd) to the engine and
 * links it into the active list; on failure answers the client and frees q.
 * Returns 0 or the HTTP status sent. */
int node_server_submit(node_server *s, node_req *q);
/* Answers an error (param may be NULL) for a request the engine never saw,
 * and frees it. */
void node_server_fail_early(node_server *s, node_req *q, int status, const char *msg,
                            const char *param);

#endif
