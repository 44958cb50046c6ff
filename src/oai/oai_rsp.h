/* oai_rsp: the OpenAI Responses API on the wire (POST /v1/responses, and
 * the objects GET and DELETE /v1/responses/{id} return).
 *
 * A front door, not a second engine path.  A Responses request is
 * translated into the Chat Completions request that says the same
 * conversation (a jansson document), which then goes through oai_req_parse
 * like any chat request — so chat templates, tools, structured outputs, P/D
 * and the router's conversation keys work unchanged, and a conversation
 * renders to the same prompt tokens whichever API carried it.  The answer
 * is written back in the Responses shape from the pieces the chat path
 * already has: an oai_tools_result for a whole answer, the oai_tools_ev
 * events of a stream.
 *
 * previous_response_id: the store (the integrator's) keeps, per response
 * id, the conversation so far as an array of chat messages — what the
 * input was, and the answer as the assistant message a chat client would
 * send back (oai_rsp_history).  oai_rsp_to_chat puts those messages before
 * the new input's.  Instructions are never stored: each request's own go
 * first, as OpenAI does (the previous turn's are not carried over).
 *
 * Every field and event follows the official SDK's types (openai 6.49.0,
 * resources/responses/responses.d.ts); docs/api.md ("The Responses API")
 * has the mapping field by field and each decision with its reason. */
#ifndef OAI_RSP_H
#define OAI_RSP_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "oai/oai_req.h"
#include "oai/oai_tools.h"

/* Bounds on a request, each a 400 naming the field and the limit.  Items
 * and messages have the chat API's limit (a Responses conversation becomes
 * one chat request); parts and depth bound the work of walking and copying
 * a hostile document, far above what any client sends. */
#define OAI_RSP_MAX_ITEMS    OAI_MAX_MESSAGES /* input items */
#define OAI_RSP_MAX_PARTS    65536            /* content parts, in all items together */
#define OAI_RSP_MAX_DEPTH    128              /* JSON nesting of the whole request */
#define OAI_RSP_MAX_METADATA 16               /* metadata keys (OpenAI's limit) */
#define OAI_RSP_MAX_ID       128              /* bytes of a response id */

/* ---- requests ---------------------------------------------------------- */

typedef struct {
    json_t *root;  /* the request as sent (owned) */
    json_t *input; /* the input as chat messages, without the instructions (owned) */
    json_t *chat;  /* the chat request's other members: model, max_tokens, tools... (owned) */
    const char *model;
    const char *instructions; /* NULL: none; into root */
    size_t instructions_len;
    const char *previous_response_id; /* NULL: none; into root */
    int stream;
    int store;        /* default 1: keep the response for previous_response_id and GET */
    json_t *metadata; /* an object of strings, borrowed from root; NULL when none */
    /* The response object's members that repeat the request (instructions,
     * tools, text, temperature, metadata...), raw JSON without braces, for
     * oai_rsp_meta.echo (dx_malloc'd). */
    char *echo;
    size_t n_items;   /* input items (1 for a string input) */
    size_t mem_bytes; /* bytes the parse left allocated */
} oai_rsp_req;

/* Parses and validates a POST /v1/responses body.  0 and a filled *out, or
 * a negative code with *err filled: DX_EINVAL and a 400 whose param names
 * the Responses field ("input[3].content[0].type"), or DX_ENOMEM and a 503.
 * Unknown fields are ignored; what is accepted translates to a chat request
 * oai_req_parse accepts. */
int oai_rsp_parse(const char *body, size_t len, oai_rsp_req *out, oai_err *err);
void oai_rsp_req_free(oai_rsp_req *r);

/* The chat request for r, continuing `previous` (the messages the store
 * keeps for r->previous_response_id; NULL when there is none): r's
 * instructions as a system message, a deep copy of previous, then r's
 * input.  *chat is the caller's (json_decref).  A conversation over
 * OAI_MAX_MESSAGES is a 400 naming "input"; a `previous` that is not an
 * array of objects is a 500 (the store is broken, not the request). */
int oai_rsp_to_chat(const oai_rsp_req *r, const json_t *previous, json_t **chat, oai_err *err);

/* oai_req_parse of a chat document (written out and parsed, as the chat
 * path would receive it), with a failure's param and message named in the
 * Responses API's terms (oai_rsp_err_from_chat). */
int oai_rsp_chat_parse(const json_t *chat, const oai_parse_opts *opts, oai_req *out, oai_err *err);

/* Rewrites an error that names a chat field (from oai_req_parse, or the
 * node's later checks: "messages" for a prompt over the context,
 * "max_tokens", "response_format.json_schema.schema",
 * "tools[2].function.parameters") to the Responses field: "input",
 * "max_output_tokens", "text.format.schema", "tools[2].parameters". */
void oai_rsp_err_from_chat(oai_err *err);

/* The 400 for a previous_response_id the store does not have. */
int oai_rsp_err_previous(oai_err *err, const char *id);

/* What the store keeps for a response: the chat request's messages without
 * the instructions' system message, then the answer as the assistant
 * message a chat client sends back ({"role":"assistant","content":…,
 * "reasoning_content":…,"tool_calls":[…]}, as oai_tools_message_json
 * writes it).  Continuing from it renders the same prompt as sending the
 * whole conversation again as input items.  *messages is the caller's. */
int oai_rsp_history(const oai_rsp_req *r, const json_t *chat, const oai_tools_result *answer,
                    json_t **messages);

/* ---- responses --------------------------------------------------------- */

typedef struct {
    const char *id; /* "resp_…" (oai_rsp_make_id), at most OAI_RSP_MAX_ID bytes */
    const char *model;
    int64_t created_at; /* unix seconds */
    const char *echo;   /* oai_rsp_req.echo; NULL: the defaults */
} oai_rsp_meta;

/* cached: prompt tokens whose KV was reused, from this node's cache or
 * pulled from another (what the cluster saved); reasoning: answer tokens
 * that went to reasoning (0 when not counted). */
typedef struct {
    uint32_t input, cached, output, reasoning;
} oai_rsp_usage;

/* "resp_<32 hex digits>" into out (cap >= 38). */
void oai_rsp_make_id(char *out, size_t cap);

/* The response object of a whole answer: status "completed", or
 * "incomplete" with incomplete_details.reason "max_output_tokens" when
 * finish is "length"; output items: a reasoning item (with reasoning), a
 * message (with content, or when the answer is empty), one function_call
 * per call.  Item ids derive from m->id. */
int oai_rsp_response_json(dx_buf *b, const oai_rsp_meta *m, const oai_tools_result *r,
                          const char *finish, const oai_rsp_usage *u);
/* DELETE /v1/responses/{id}: {"id","object":"response","deleted":true}. */
int oai_rsp_deleted_json(dx_buf *b, const char *id);

/* ---- streaming ---------------------------------------------------------
 *
 * Server-sent events "event: TYPE\ndata: {JSON}\n\n", each with its type and
 * a sequence_number counting from 0: response.created, response.in_progress,
 * then per output item response.output_item.added, its content's events
 * (content_part.added, output_text.delta… / reasoning_text.delta…,
 * .done, content_part.done; function_call_arguments.delta and .done) and
 * response.output_item.done; at the end response.completed or
 * response.incomplete with the whole response object.  Items follow one
 * another (one is done before the next is added), in the order the events
 * come: text after a call is a new message item, whose text continues the
 * answer's content.  The events append to the caller's buffer; the
 * encoder's own buffers are reused, so once warm an event allocates
 * nothing. */

typedef struct oai_rsp_stream oai_rsp_stream;

/* Copies what it needs from m; NULL when out of memory. */
oai_rsp_stream *oai_rsp_stream_create(const oai_rsp_meta *m);
void oai_rsp_stream_destroy(oai_rsp_stream *s);
/* response.created and response.in_progress. */
int oai_rsp_stream_begin(oai_rsp_stream *s, dx_buf *out);
/* The events of one oai_tools feed.  DX_EINVAL for an event out of order —
 * ARGS that are not the open call's, anything before begin or after the
 * end — which writes nothing (the events before it are written, and the
 * stream goes on well formed). */
int oai_rsp_stream_feed(oai_rsp_stream *s, const oai_tools_ev *ev, size_t n, dx_buf *out);
/* Closes the open item and ends with response.completed, or
 * response.incomplete when finish is "length". */
int oai_rsp_stream_finish(oai_rsp_stream *s, const char *finish, const oai_rsp_usage *u,
                          dx_buf *out);
/* An error after the stream began (before it, answer with an HTTP error):
 * the `error` event with a code for the status ("server_error" for >= 500,
 * "rate_limit_exceeded" for 429, else "invalid_prompt": the response
 * error codes the SDK knows), the message and param (may be NULL), then
 * response.failed with the items written so far. */
int oai_rsp_stream_fail(oai_rsp_stream *s, int status, const char *message, const char *param,
                        dx_buf *out);
/* The last response object the stream wrote (the final one after finish or
 * fail: what GET /v1/responses/{id} returns), or NULL before begin. */
const char *oai_rsp_stream_response(const oai_rsp_stream *s, size_t *len);
/* The answer so far as one result (content and reasoning concatenated
 * across items), for oai_rsp_history; free with oai_tools_result_free. */
int oai_rsp_stream_result(const oai_rsp_stream *s, oai_tools_result *out);

#endif
