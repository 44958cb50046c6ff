/* Fuzz target: OpenAI Responses API requests (oai_rsp_parse) and their
 * translation.  Any bytes are a body.  A rejection is a 400 in OpenAI's
 * error shape whose message begins with the field its param names.  An
 * accepted request translates (alone, and continuing a stored
 * conversation when it names a previous_response_id) into a chat document
 * oai_req_parse accepts, message for message; its structured-output
 * constraint builds or fails with a 400 that maps back to a Responses
 * field; its echo is JSON members; and the history stored after an answer
 * continues into a chat request that parses again. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "node/node_gram.h"
#include "oai/oai_req.h"
#include "oai/oai_resp.h"
#include "oai/oai_rsp.h"
#include "oai/oai_tools.h"

static void check_json(const char *p, size_t n)
{
    json_error_t je;
    json_t *v = json_loadb(p, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    DX_ASSERT(v != NULL);
    json_decref(v);
}

static void check_rejection(const oai_err *e)
{
    DX_ASSERT((e->status == 400 || e->status == 503) && e->message[0]);
    DX_ASSERT(!strncmp(e->message, e->param, strlen(e->param)));
    dx_buf b;
    dx_buf_init(&b, 0);
    DX_ASSERT(oai_error_json(&b, e->message, oai_error_type(e->status), e->param, NULL) == 0);
    check_json(b.data, b.len);
    dx_buf_free(&b);
}

/* A node's later checks of the constraint name chat fields; mapped, they
 * name the Responses field the constraint came from. */
static void check_gram(const oai_req *o)
{
    dx_buf src;
    dx_buf_init(&src, 0);
    oai_err e;
    int rc = node_gram_source(o, OAI_TOOLS_QWEN, 0, &src, NULL, &e);
    DX_ASSERT(rc == 0 || rc == DX_ENOMEM || (rc == DX_EINVAL && e.status == 400));
    if (rc == DX_EINVAL) {
        oai_rsp_err_from_chat(&e);
        DX_ASSERT(!strncmp(e.param, "text.format", 11) || !strncmp(e.param, "tools[", 6) ||
                  !strcmp(e.param, "tool_choice"));
    }
    dx_buf_free(&src);
}

/* The chat request r translates to (continuing prev) parses, and so does
 * the next turn continuing what the store keeps after an answer. */
static void check_chat(const oai_rsp_req *r, const json_t *prev)
{
    json_t *chat, *hist;
    oai_err e;
    oai_req o;
    oai_parse_opts opts = {.n_vocab = 151936};
    int rc = oai_rsp_to_chat(r, prev, &chat, &e);
    if (rc) { /* only the conversation's length is checked here */
        DX_ASSERT(rc == DX_EINVAL && e.status == 400 && !strcmp(e.param, "input"));
        return;
    }
    rc = oai_rsp_chat_parse(chat, &opts, &o, &e);
    if (rc) fprintf(stderr, "chat request rejected: %s: %s\n", e.param, e.message);
    DX_ASSERT(rc == 0);
    DX_ASSERT(o.n_msgs == json_array_size(json_object_get(chat, "messages")));
    DX_ASSERT(o.stream == r->stream);
    if (node_gram_param(&o)) check_gram(&o);
    /* an answer: the last message's text, a call of the first tool */
    const oai_msg *last = &o.msgs[o.n_msgs - 1];
    oai_tool_call call = {.id = "call_0", .name = "f", .arguments = "{}", .arguments_len = 2};
    oai_tools_result a = {.content = (char *)last->content, .content_len = last->content_len};
    if (o.n_tools) a.calls = &call, a.n_calls = 1;
    DX_ASSERT(oai_rsp_history(r, chat, &a, &hist) == 0);
    DX_ASSERT(json_array_size(hist) == o.n_msgs - (r->instructions ? 1 : 0) + 1);
    oai_rsp_meta m = {"resp_0123", o.model, 1, r->echo};
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_rsp_usage u = {1, 0, 1, 0};
    DX_ASSERT(oai_rsp_response_json(&b, &m, &a, "length", &u) == 0);
    check_json(b.data, b.len);
    dx_buf_free(&b);
    oai_req_free(&o);
    json_decref(chat);
    if (!prev) check_chat(r, hist); /* the next turn, from the store */
    json_decref(hist);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    if (!init) oai_json_use_dx_alloc(), init = 1;
    oai_rsp_req r;
    oai_err e;
    if (oai_rsp_parse((const char *)data, size, &r, &e) != 0) {
        check_rejection(&e);
        return 0;
    }
    dx_buf echo;
    dx_buf_init(&echo, 0);
    dx_buf_printf(&echo, "{%s}", r.echo);
    check_json(echo.data, echo.len);
    dx_buf_free(&echo);
    json_t *prev = NULL;
    if (r.previous_response_id) /* what a store could hold for it */
        prev = json_pack("[{ssss},{ssss}]", "role", "user", "content", "before", "role",
                         "assistant", "content", "ok");
    check_chat(&r, prev);
    json_decref(prev);
    oai_rsp_req_free(&r);
    return 0;
}
