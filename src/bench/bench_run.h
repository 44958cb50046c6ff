/* bench_run: drives a workload (bench_work.h) against any OpenAI-compatible
 * endpoint with libcurl's multi interface — `clients` conversations at once,
 * each resending its whole history every turn with the assistant messages
 * exactly as returned, as agents do — and records every request: time to the
 * first content token, time per output token, end-to-end latency, prompt and
 * cached tokens (from the stream's usage chunk), and any error by kind.
 *
 * A request that fails (an HTTP error, a broken connection, a timeout, an
 * error event in the stream) is recorded with its kind and ends its
 * conversation; the run goes on with the others. */
#ifndef BENCH_RUN_H
#define BENCH_RUN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bench/bench_work.h"

enum bench_err {
    BENCH_OK = 0,
    BENCH_ERR_HTTP,      /* a status other than 200 */
    BENCH_ERR_TRANSPORT, /* refused, reset, closed mid-answer */
    BENCH_ERR_TIMEOUT,
    BENCH_ERR_STREAM,    /* an error event inside the stream */
    BENCH_ERR_MALFORMED, /* not SSE/JSON, no [DONE], no content */
    BENCH_N_ERR
};
const char *bench_err_name(enum bench_err e);

typedef struct {
    uint32_t conversation, turn; /* turn from 1 */
    double t_start_s;            /* since the measured part began */
    double ttft_s, tpot_s, e2e_s;
    long prompt_tokens, cached_tokens, completion_tokens;
    int status; /* HTTP status, 0 when none */
    enum bench_err err;
    char detail[160];
} bench_record;

typedef struct {
    bench_record *rec;
    size_t n, cap;
    double wall_s; /* the measured part (warm-up excluded) */
    char model[128];
} bench_results;

void bench_results_free(bench_results *r);
int bench_results_add(bench_results *r, const bench_record *rec);

enum bench_progress { BENCH_PROGRESS_NONE, BENCH_PROGRESS_BAR, BENCH_PROGRESS_LINES };

/* A request's limit unless the config says (a plain literal, for help). */
#define BENCH_RUN_DEFAULT_TIMEOUT_S 600

/* The front door the workload goes through (the same conversations):
 * Chat Completions, the Anthropic Messages API, or the Responses API (each
 * turn continues the last with previous_response_id). */
enum bench_api { BENCH_API_CHAT = 0, BENCH_API_MESSAGES, BENCH_API_RESPONSES };

/* "chat" | "messages" | "responses" → *out; DX_EINVAL naming them. */
int bench_api_parse(const char *s, enum bench_api *out);
const char *bench_api_name(enum bench_api a);

typedef struct {
    const char *url; /* base URL: http://HOST:PORT */
    enum bench_api api;
    const char *model;   /* NULL: the first of GET /v1/models */
    const char *api_key; /* sent as Authorization: Bearer, or NULL */
    const bench_workload *w;
    bench_text *text;
    double timeout_s; /* per request; 0: BENCH_RUN_DEFAULT_TIMEOUT_S */
    enum bench_progress progress;
    FILE *progress_out; /* default stderr */
    /* Called after each measured request (may be NULL); answer is the reply
     * text (NULL after an error). */
    void (*on_record)(void *user, const bench_record *r, const char *answer, size_t len);
    void *user;
    /* Set to non-zero (a signal handler may) to stop: requests in flight
     * are dropped unrecorded and bench_run returns DX_ECANCELED. */
    const volatile int *stop;
} bench_run_config;

/* 0 (errors inside are records, not failures), or a negative code when the
 * run could not start (no model, bad URL, out of memory). */
int bench_run(const bench_run_config *c, bench_results *out);

#endif
