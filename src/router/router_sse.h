/* router_sse: the router's view of an upstream answer — splitting a
 * Server-Sent Events stream into events, and finding (and removing) the
 * kv_transfer_params a decode node puts in its final chunk or answer.
 *
 * The splitter hands out each complete event (its bytes up to and including
 * the blank line that ends it) as soon as its last byte arrives, and keeps
 * only an incomplete event: pointers go straight into the caller's chunk
 * when the event lies inside it, so the common case copies nothing.  Lines
 * end in "\n" or "\r\n" (what HTTP servers send; a lone "\r" is not treated
 * as a line end).  An incomplete event over `max_event` bytes is an error
 * (a hard maximum on what the network can make the router hold).
 *
 * The inspectors parse one event or answer with jansson.  Everything that
 * needs no change passes through byte for byte; only an answer with a
 * top-level kv_transfer_params member is re-serialised without it. */
#ifndef ROUTER_SSE_H
#define ROUTER_SSE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

typedef struct {
    dx_buf pend; /* an incomplete event */
    size_t scan; /* pend's bytes already searched for an event end */
} router_sse;

/* Returns 0 to go on; anything else stops the feed and is returned by it. */
typedef int (*router_sse_fn)(void *user, const char *ev, size_t len);

void router_sse_init(router_sse *s, size_t max_event);
void router_sse_free(router_sse *s);
void router_sse_reset(router_sse *s);
/* Hands every event completed by these bytes to fn, in order.  0, fn's
 * non-zero return, or DX_ETOOBIG / DX_ENOMEM (the pending event is
 * dropped). */
int router_sse_feed(router_sse *s, const char *p, size_t n, router_sse_fn fn, void *user);
size_t router_sse_pending(const router_sse *s);

/* The event's data: the "data:" lines' values joined by "\n" (one optional
 * space after the colon dropped, as the SSE standard says).  A one-line
 * event points into ev; several lines are joined into *scratch.  0, or
 * DX_ENOENT when the event has no data line. */
int router_sse_data(const char *ev, size_t len, dx_buf *scratch, const char **data, size_t *dlen);

/* What one event or answer held.  text: the first choice's text is
 * appended there (delta.content for a chat chunk, message.content for a
 * chat answer, text for completions) when the pointer is not NULL. */
typedef struct {
    dx_buf *text;
    size_t text_added; /* bytes appended to *text */
    int text_lost;     /* *text could not take them (its maximum): it is incomplete */
    json_t *params;    /* the removed kv_transfer_params (new reference) or NULL */
    /* In, when has_cap: the prompt tokens another node (the prefill node)
     * had cached for this request.  usage.prompt_tokens_details.cached_tokens
     * is capped by it, so the client sees what the cluster reused, not what
     * this node pulled from a node that computed it. */
    int has_cap;
    long cached_cap;
} router_sse_info;

/* One SSE event of an OpenAI stream.  Returns 1 when the event changes: a
 * top-level kv_transfer_params taken out (into info->params) or its usage
 * capped (info->cached_cap); *out then holds the new event
 * ("data: {...}\n\n").  Returns 0 when the event goes to the client as it is
 * (not JSON — [DONE], comments — or nothing to change); DX_ENOMEM on
 * failure.  scratch: reused work space. */
int router_sse_event(const char *ev, size_t len, int chat, dx_buf *scratch, dx_buf *out,
                     router_sse_info *info);
/* The same for a whole JSON answer (non-streamed): 1 with *out the answer
 * without the member, 0 when it passes as it is (no member, or not JSON). */
int router_sse_answer(const char *body, size_t len, int chat, dx_buf *out, router_sse_info *info);

/* Appends v as compact JSON (the serialiser the inspectors use). */
int router_json_append(dx_buf *b, const json_t *v);

/* ---- the params a node hands back -------------------------------------------- */

/* The prefill node's (non-streamed) answer: its kv_transfer_params as
 * compact JSON text in *params (dx_malloc'd; NULL when there are none or
 * the answer is not a JSON object) and its
 * usage.prompt_tokens_details.cached_tokens in *cached (-1 when absent or
 * not a count).  1 with params, 0 without, DX_ENOMEM. */
int router_answer_params(const char *body, size_t len, char **params, long *cached);
/* How long params may be kept: ttl_s, or less when the holder promises
 * less (remote_blocks_ttl_s), a margin before the holder drops them.  May be
 * <= 0: not worth keeping. */
double router_params_ttl(const json_t *params, double ttl_s);
/* remote_num_tokens when it is a count that fits 32 bits, else 0. */
uint32_t router_params_tokens(const json_t *params);
/* Stored params text as a JSON object with do_remote_decode and
 * do_remote_prefill set; NULL when the text is not a JSON object. */
json_t *router_params_flagged(const char *text, int decode, int prefill);

#endif
