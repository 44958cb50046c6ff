/* oai_anth: the Anthropic Messages API (POST /v1/messages and
 * /v1/messages/count_tokens) as a front door to the chat path.
 *
 * A request is validated with Anthropic's field names and translated into
 * the equivalent OpenAI chat-completions request document, which then goes
 * through oai_req_parse unchanged: chat templates, tools, structured
 * outputs, P/D, the router's conversation keys and token-faithful history
 * see one kind of request whichever door it came in by, and the same
 * conversation renders to the same prompt tokens.  The answer is written
 * back in Anthropic's shape from the pieces the chat path already has: an
 * oai_tools_result for a whole message, the oai_tools_ev events for a
 * stream.  docs/api.md ("The Anthropic Messages API") has the mapping
 * field by field and the reasons for each choice; in short:
 *
 *   system (string or text blocks)   one system message, first
 *   text blocks of a user turn       joined with "\n" (as chat text parts)
 *   text blocks of an assistant turn concatenated (a streamed answer's text
 *                                    blocks, split at its tool calls, add up
 *                                    to the content byte for byte)
 *   consecutive same-role messages   one turn (Anthropic combines them too)
 *   tool_use                         tool_calls, arguments = the input as
 *                                    JSON.stringify writes it
 *   tool_result                      one tool message each; is_error
 *                                    prefixes "Error: "; the turn's text
 *                                    after them, a user message
 *   thinking                         reasoning_content
 *   thinking config                  chat_template_kwargs.enable_thinking
 *
 * Everything the translation accepts, oai_req_parse(OAI_CHAT) accepts: the
 * chat parser's limits are checked here first, under Anthropic's names and
 * counted after translation, with bounds on content blocks and nesting.
 * Only what the chat path alone can judge (the context length, a schema's
 * keywords) fails later; oai_anth_param_name says such a field in
 * Anthropic's terms.
 *
 * x-api-key, Anthropic's key header, is read by the HTTP layer (http/ is
 * above oai/), not here. */
#ifndef OAI_ANTH_H
#define OAI_ANTH_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "oai/oai_req.h"
#include "oai/oai_resp.h"
#include "oai/oai_tools.h"

struct json_t; /* jansson's */

/* Content blocks in a request (system, messages and tool results
 * together), and nesting of a tool's input_schema, a tool_use's input and
 * an output schema: 400s naming the field past them. */
#define OAI_ANTH_MAX_BLOCKS (4 * OAI_MAX_MESSAGES)
#define OAI_ANTH_MAX_DEPTH  128

typedef struct {
    int count_tokens; /* the body of /v1/messages/count_tokens: no max_tokens */
} oai_anth_opts;

enum oai_anth_thinking {
    OAI_ANTH_THINK_DEFAULT = 0, /* no thinking config: the template's default */
    OAI_ANTH_THINK_OFF,         /* {"type":"disabled"} */
    OAI_ANTH_THINK_ON,          /* enabled, adaptive or between_tools */
};

/* What the caller needs that the chat request does not say. */
typedef struct {
    int stream;
    int count_tokens;
    enum oai_anth_thinking thinking;
    uint32_t thinking_budget; /* budget_tokens of {"type":"enabled"}, else 0 */
    /* the client's model string, verbatim: it points into the chat document
     * (oai_anth_to_chat) or the oai_req (oai_anth_req_parse) */
    const char *model;
    /* the chat request's stop[k] is the client's stop_sequences[stop_index[k]]
     * (empty strings are dropped, as the chat parser drops them) */
    size_t n_stop;
    uint16_t stop_index[OAI_MAX_STOP];
} oai_anth_info;

/* Validates the Anthropic request body[0..len) and builds the chat request
 * document: 0 and *chat (a json_t object to json_decref), or DX_EINVAL with
 * *err a 400 whose message starts with the field ("messages[2].content[1]
 * .type: image blocks are not supported (text-only model)") and whose param
 * is that field; DX_ENOMEM is a 503. */
int oai_anth_to_chat(const char *body, size_t len, const oai_anth_opts *o, struct json_t **chat,
                     oai_anth_info *info, oai_err *err);

/* oai_anth_to_chat, then oai_req_parse(OAI_CHAT) on the document's text:
 * *out as a chat request would give it (free with oai_req_free). */
int oai_anth_req_parse(const char *body, size_t len, const oai_anth_opts *o,
                       const oai_parse_opts *po, oai_req *out, oai_anth_info *info, oai_err *err);

/* A field the chat path names ("tools[3].function.parameters", "stop",
 * "response_format.json_schema.schema") in Anthropic's terms
 * ("tools[3].input_schema", "stop_sequences", "output_config.format.schema");
 * messages[i] becomes messages, whose positions the translation moves. */
void oai_anth_param_name(const char *chat_param, char *out, size_t cap);
/* An error the chat path made (the chat parser on a translated request, a
 * node's later checks: a schema's keyword, the prompt's size), its param
 * and its message's leading "param: " in Anthropic's terms. */
void oai_anth_err_from_chat(oai_err *err);

/* ---- answers ---------------------------------------------------------- */

/* "msg_" and 32 hex digits (cap >= 40). */
void oai_anth_make_id(char *out, size_t cap);

/* What ended the answer.  finish: the chat path's "stop" or "length" (or
 * "tool_calls"); stop_sequence: the stop string that ended it, or NULL.
 * usage: prompt (all the prompt's tokens), cached (those the cluster reused,
 * from the node's cache or pulled) and completion.  extra: raw JSON members
 * ("\"k\":v", no braces) added at the top level of the whole message and
 * of message_delta, as oai_resp's extra (the decode role's
 * kv_transfer_params), or NULL. */
typedef struct {
    const char *finish;
    const char *stop_sequence;
    oai_usage usage;
    const char *extra;
} oai_anth_end;

/* stop_reason: "tool_use" once a call was made, "max_tokens" for length,
 * "stop_sequence" when a stop string ended it, else "end_turn". */
const char *oai_anth_stop_reason(const oai_anth_end *e, size_t n_calls);

/* The whole message: {"id","type":"message","role":"assistant","content":[
 * thinking (reasoning), text (content), tool_use per call],"model",
 * "stop_reason","stop_sequence","usage"}.  A call's input is its arguments
 * object as the model wrote it; tool_use ids are "toolu_" and the call id's
 * hex digits. */
int oai_anth_message_json(dx_buf *b, const char *id, const char *model, const oai_tools_result *r,
                          const oai_anth_end *e);

/* {"input_tokens":N} for count_tokens. */
int oai_anth_count_json(dx_buf *b, uint32_t input_tokens);

/* A stream's events, appended to the caller's buffer ("event: NAME\ndata:
 * {…}\n\n" each).  start: message_start (empty content, the input usage)
 * and a ping; feed: the chat path's events, a block per run of one kind (a
 * text, thinking or tool_use block, each call its own, opened by its CALL
 * event and given its arguments as one input_json_delta); end: the open
 * block's stop, message_delta (stop_reason, stop_sequence, usage) and
 * message_stop.  The text of each kind concatenated over its blocks, and
 * the tool_use blocks, are those of oai_anth_message_json for the same
 * events collected.  An encoder holds no buffers: past the caller's buffer
 * growing, nothing is allocated; start makes it ready for a new message. */
typedef struct oai_anth_stream oai_anth_stream;

oai_anth_stream *oai_anth_stream_create(void); /* NULL when out of memory */
void oai_anth_stream_destroy(oai_anth_stream *s);
int oai_anth_stream_start(oai_anth_stream *s, dx_buf *b, const char *id, const char *model,
                          const oai_usage *u);
/* An ARGS event that does not directly follow its CALL is dropped, and a
 * call whose arguments are not one JSON object gets input {} (neither
 * happens with oai_tools' events). */
int oai_anth_stream_feed(oai_anth_stream *s, dx_buf *b, const oai_tools_ev *ev, size_t n);
/* Plain answer text (no tool or reasoning parser): one content event. */
int oai_anth_stream_text(oai_anth_stream *s, dx_buf *b, const char *text, size_t len);
int oai_anth_stream_end(oai_anth_stream *s, dx_buf *b, const oai_anth_end *e);
size_t oai_anth_stream_n_calls(const oai_anth_stream *s);

/* ---- errors ----------------------------------------------------------- */

/* The error type Anthropic uses with an HTTP status (400
 * invalid_request_error, 401 authentication_error, 403 permission_error,
 * 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 500
 * api_error, 503 and 529 overloaded_error, …). */
const char *oai_anth_error_type(int status);
/* {"type":"error","error":{"type","message"}}. */
int oai_anth_error_json(dx_buf *b, int status, const char *message);
/* The same as an event of a stream that has begun: "event: error\n…". */
int oai_anth_sse_error(dx_buf *b, int status, const char *message);
/* http_app_error_fn (src/http/http_app.h) for the Messages routes: every
 * error of the route in Anthropic's shape.  Anthropic's error has no param
 * and no code; the message is taken as it is (in Anthropic's terms
 * already: oai_anth_req_parse renames what the chat parser says). */
int oai_anth_http_error(dx_buf *b, int status, const char *message, const char *param,
                        const char *code);

#endif
