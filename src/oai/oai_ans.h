/* oai_ans: a Chat Completions answer read back into its pieces, for the
 * front doors that answer in another shape (the Anthropic Messages API,
 * the Responses API).
 *
 * Inside duplex every answer is a Chat Completions answer: the engine's
 * events become chat chunks on the node, the router proxies chat chunks
 * between nodes and clients.  A request that came in through another front
 * door is translated into a chat request on the way in (oai_anth, oai_rsp);
 * on the way out its chat answer is read back here — a whole answer into an
 * oai_tools_result, a stream chunk into the oai_tools_ev events it carries
 * — and written again in the front door's shape.  The node and the router
 * do this with the same code, so the two give the same bytes for the same
 * answer.
 *
 * What is read: choices[0]'s message (content, reasoning_content,
 * tool_calls) or delta, finish_reason, stop_reason (vLLM's: the stop string
 * that ended the answer), usage (prompt, cached, completion tokens), and an
 * error object in place of an answer.  A tool call's delta may carry its
 * head (index, id, name) and arguments together: that is a CALL event and
 * an ARGS event, in that order. */
#ifndef OAI_ANS_H
#define OAI_ANS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "oai/oai_resp.h"
#include "oai/oai_tools.h"

/* What an answer or chunk said besides its text.  Fields stay as they were
 * when a chunk does not mention them, so one info follows a whole stream. */
typedef struct {
    char finish[16];    /* "" until the finish: "stop" | "length" | "tool_calls" */
    dx_buf stop_reason; /* the stop string (NUL-terminated), empty when none */
    int has_usage;
    oai_usage usage;
    int done;  /* "[DONE]" */
    int error; /* the chunk or answer was an error object */
    char error_message[512];
    char error_type[64];
    char error_param[64];
    char error_code[64];
} oai_ans_info;

void oai_ans_info_init(oai_ans_info *i);
void oai_ans_info_free(oai_ans_info *i);

/* A whole answer (body of a 200 or an error status): 0 with *r filled (to
 * be freed with oai_tools_result_free) and *info; DX_EFORMAT (message: what
 * is wrong) when it is not a chat answer or error; DX_ENOMEM. */
int oai_ans_full(const char *body, size_t len, oai_tools_result *r, oai_ans_info *info);

/* A reader of one stream: events point into its own memory, valid until
 * its next call. */
typedef struct oai_ans_stream oai_ans_stream;

oai_ans_stream *oai_ans_stream_create(void); /* NULL: out of memory */
void oai_ans_stream_destroy(oai_ans_stream *s);
/* One event's data (the "data:" payload: a chunk's JSON, or "[DONE]"):
 * its events in *ev (n of them, maybe 0) and what else it said in *info.
 * DX_EFORMAT for data that is neither, DX_ENOMEM. */
int oai_ans_chunk(oai_ans_stream *s, const char *data, size_t len, const oai_tools_ev **ev,
                  size_t *n, oai_ans_info *info);

#endif
