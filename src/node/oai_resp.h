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
#include "node/oai_req.h"

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

/* Non-streaming answer.  finish: "stop" | "length". */
int oai_resp_full(dx_buf *b, const oai_meta *m, const char *text, size_t len, const char *finish,
                  const oai_usage *u, const char *extra);
/* One SSE event "data: {chunk}\n\n".  role_first: the chat stream's opening
 * chunk (delta.role); finish NULL for content chunks.  with_usage_null: the
 * client asked for usage, so every ordinary chunk says "usage":null. */
int oai_sse_chunk(dx_buf *b, const oai_meta *m, const char *text, size_t len, int role_first,
                  const char *finish, int with_usage_null, const char *extra);
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
