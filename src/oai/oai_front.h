/* oai_front: a chat answer written again in the shape of the front door its
 * request came through — the Anthropic Messages API (oai_anth) or the
 * Responses API (oai_rsp).
 *
 * Inside duplex every answer is a Chat Completions answer: the node's
 * engine events become chat chunks, and the router speaks chat to its nodes
 * (so P/D, kv_transfer_params and the conversation keys have one form).  A
 * request that came through another door is translated on the way in; on
 * the way out its chat answer — a stream's SSE bytes, or a whole body with
 * its HTTP status — passes through one of these, which reads it back
 * (oai_ans) and writes the door's answer.  The node and the router use the
 * same code, so a front door answers alike whether one node or a cluster
 * served it.  The chat stream is asked for with include_usage (the
 * translations do), so its usage arrives before [DONE], where the door's
 * last events (message_delta, response.completed) are written.
 *
 * An answer that ended is kept as one result (content, reasoning, calls)
 * and, for the Responses API, as its final object: what a responses store
 * keeps. */
#ifndef OAI_FRONT_H
#define OAI_FRONT_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "oai/oai_rsp.h"
#include "oai/oai_tools.h"

enum oai_front_api { OAI_FRONT_CHAT = 0, OAI_FRONT_MESSAGES, OAI_FRONT_RESPONSES };

typedef struct {
    enum oai_front_api api; /* MESSAGES or RESPONSES */
    const char *model;      /* the model name the answer reports (copied) */
    /* Messages: message_start's input_tokens (the prompt's tokens as far as
     * they are known when the stream begins; the final figures come in
     * message_delta) */
    uint32_t prompt_hint;
    /* Responses: the id, created_at and the request's echoed members
     * (copied) */
    oai_rsp_meta rsp;
} oai_front_config;

typedef struct oai_front oai_front;

oai_front *oai_front_create(const oai_front_config *c); /* NULL when out of memory */
void oai_front_destroy(oai_front *f);

/* A chat stream's bytes (SSE events; an event may be split across calls)
 * → the door's events appended to *out.  The first call writes the door's
 * opening events; [DONE] writes its closing ones; an error event from
 * upstream becomes the door's error event.  0, DX_EFORMAT (the bytes are
 * not a chat stream) or DX_ENOMEM. */
int oai_front_sse(oai_front *f, const char *p, size_t n, dx_buf *out);
/* The stream broke before its end (the upstream failed mid-answer): the
 * door's error event, with status (500, 502…) and message. */
int oai_front_sse_fail(oai_front *f, int status, const char *message, dx_buf *out);
/* A whole chat answer (or error body) with its HTTP status → the door's
 * body into *out.  0, DX_EFORMAT, DX_ENOMEM. */
int oai_front_full(oai_front *f, int status, const char *body, size_t n, dx_buf *out);

/* Whether the answer ended normally (a stream's [DONE] after its finish, or
 * a whole answer with status 200). */
int oai_front_completed(const oai_front *f);
/* The answer as one result (free with oai_tools_result_free); 0 or
 * DX_ENOMEM. */
int oai_front_result(const oai_front *f, oai_tools_result *r);
/* Responses: the final response object's text (valid until destroy), or
 * NULL. */
const char *oai_front_response(const oai_front *f, size_t *len);

#endif
