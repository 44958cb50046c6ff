/* oai_resp: OpenAI response bodies, stream chunks and errors.
 *
 * Written by hand into a dx_buf rather than through a JSON tree: a stream
 * sends one small chunk per token batch and this is on its path.  Every
 * string goes through oai_json_str, which escapes it and replaces bytes that
 * are not valid UTF-8 with U+FFFD (a random model can emit any byte), so the
 * output is always valid JSON.
 *
 * `extra` arguments are raw JSON members ("\"k\":v", no braces) added at the
 * top level of the object; the decode role puts kv_transfer_params there. */
#ifndef OAI_RESP_H
#define OAI_RESP_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "oai/oai_req.h"

typedef struct {
    enum oai_kind kind;
    const char *id; /* "chatcmpl-<hex>" | "cmpl-<hex>" */
    const char *model;
    int64_t created; /* unix seconds */
} oai_meta;

typedef struct {
    uint32_t prompt, cached, completion;
} oai_usage;

/* "<prefix>-<32 hex digits>" from a non-cryptographic random source. */
void oai_make_id(char *out, size_t cap, const char *prefix);

/* Appends a JSON string literal (with quotes); invalid UTF-8 becomes U+FFFD. */
int oai_json_str(dx_buf *b, const char *s, size_t len);

/* One choice of an answer, or of a stream chunk (its delta). */
typedef struct {
    const char *text; /* content (may be NULL with len 0) */
    size_t len;
    /* chat: the message's or delta's members after "role" as raw JSON
     * ("content":…,"reasoning_content":…,"tool_calls":[…], from oai_tools),
     * used instead of text when not NULL */
    const char *raw;
    const char *logprobs; /* raw JSON value of "logprobs", or NULL (null) */
    const char *finish;   /* "stop" | "length" | "tool_calls", or NULL */
    /* with finish "stop": the stop string that ended the answer (vLLM's
     * "stop_reason", which the other front doors report as their stop
     * sequence), or NULL — then the member is left out */
    const char *stop_reason;
} oai_choice;

/* Non-streaming answer. */
int oai_resp_full(dx_buf *b, const oai_meta *m, const oai_choice *c, const oai_usage *u,
                  const char *extra);
/* One SSE event "data: {chunk}\n\n".  role_first: the chat stream's opening
 * chunk (delta.role); c->finish NULL for content chunks, and a finish chunk
 * with no text carries no content.  with_usage_null: the client asked for
 * usage, so every ordinary chunk says "usage":null. */
int oai_sse_chunk(dx_buf *b, const oai_meta *m, const oai_choice *c, int role_first,
                  int with_usage_null, const char *extra);

/* A token's log-probability as the API reports it: the token's bytes (the
 * "token" string is their UTF-8, invalid bytes as U+FFFD; "bytes" the
 * raw values) and its most likely alternatives. */
typedef struct {
    const char *bytes;
    size_t len;
    float logprob;
} oai_lp_tok;

typedef struct {
    oai_lp_tok tok;
    const oai_lp_tok *top;
    size_t n_top;
} oai_lp_entry;

/* The value of a choice's "logprobs": chat {"content":[{token, logprob,
 * bytes, top_logprobs}]}, completions {"tokens", "token_logprobs",
 * "top_logprobs", "text_offset"} (offsets from *text_offset, advanced). */
int oai_logprobs_json(dx_buf *b, enum oai_kind kind, const oai_lp_entry *e, size_t n,
                      size_t *text_offset);
/* The usage chunk (choices []) sent before [DONE] when include_usage. */
int oai_sse_usage(dx_buf *b, const oai_meta *m, const oai_usage *u);
int oai_sse_done(dx_buf *b);
/* An error inside a stream that has already begun. */
int oai_sse_error(dx_buf *b, const char *message, const char *type);

/* {"error":{"message","type","param","code"}}; param/code NULL → null. */
int oai_error_json(dx_buf *b, const char *message, const char *type, const char *param,
                   const char *code);
/* The error type OpenAI uses with an HTTP status. */
const char *oai_error_type(int status);

/* GET /v1/models with one model. */
int oai_models_json(dx_buf *b, const char *model, int64_t created);

#endif
