/* Fuzz target: OpenAI request parsing and the answer builders.
 * First byte picks chat or completion; the rest is the body.  Every accepted
 * request's strings are pushed through the JSON writer, whose output must
 * parse back as JSON. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "node/oai_req.h"
#include "node/oai_resp.h"

static void check_json(const dx_buf *b)
{
    json_error_t je;
    json_t *v = json_loadb(b->data, b->len, JSON_DECODE_ANY, &je);
    DX_ASSERT(v != NULL);
    json_decref(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    enum oai_kind kind = data[0] & 1 ? OAI_COMPLETION : OAI_CHAT;
    oai_parse_opts opts = {.n_vocab = 151936};
    oai_req r;
    oai_err e;
    if (oai_req_parse(kind, (const char *)data + 1, size - 1, &opts, &r, &e) != 0) {
        DX_ASSERT(e.status == 400 && e.message[0]);
        return 0;
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_meta m = {kind, "id-1", r.model, 1};
    oai_usage u = {1, 0, 1};
    for (size_t i = 0; i < r.n_msgs; i++) {
        dx_buf_reset(&b);
        oai_resp_full(&b, &m, r.msgs[i].content, r.msgs[i].content_len, "stop", &u, NULL);
        check_json(&b);
    }
    if (r.prompt) {
        dx_buf_reset(&b);
        oai_error_json(&b, r.prompt, "x", r.user, NULL);
        check_json(&b);
    }
    dx_buf_free(&b);
    oai_req_free(&r);
    return 0;
}
