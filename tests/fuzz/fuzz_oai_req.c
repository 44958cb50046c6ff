/* Fuzz target: OpenAI request parsing, kv_transfer_params (kvtp) and the
 * answer builders.  First byte picks chat or completion; the rest is the
 * body.  Every accepted request's strings are pushed through the JSON
 * writer, whose output must parse back as JSON; accepted params are written
 * back and must parse again to the same values.  A structured-output
 * constraint (response_format, a forced tool call) becomes EBNF that must
 * compile; only a request's own `grammar` may fail to. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "gram/gram.h"
#include "node/kvtp.h"
#include "node/node_gram.h"
#include "oai/oai_req.h"
#include "oai/oai_resp.h"

static void check_json(const dx_buf *b)
{
    json_error_t je;
    json_t *v = json_loadb(b->data, b->len, JSON_DECODE_ANY, &je);
    DX_ASSERT(v != NULL);
    json_decref(v);
}

/* Accepted params survive a write and a parse unchanged. */
static void check_params(const void *obj)
{
    kvtp_limits lim = {151936, 16, 1u << 20};
    kvtp p, q;
    oai_err e;
    if (kvtp_parse(obj, &lim, &p, &e) != 0) {
        DX_ASSERT(e.status == 400 && !strncmp(e.param, "kv_transfer_params.", 19));
        return;
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_putc(&b, '{');
    DX_ASSERT(kvtp_write(&b, &p) == 0);
    dx_buf_putc(&b, '}');
    json_error_t je;
    json_t *v = json_loadb(b.data, b.len, 0, &je);
    DX_ASSERT(v != NULL);
    DX_ASSERT(kvtp_parse(json_object_get(v, "kv_transfer_params"), &lim, &q, &e) == 0);
    DX_ASSERT(p.do_remote_decode == q.do_remote_decode && p.port == q.port &&
              p.n_blocks == q.n_blocks && p.n_tokens == q.n_tokens &&
              p.num_tokens == q.num_tokens && p.has_lease == q.has_lease &&
              !strcmp(p.host, q.host) && !strcmp(p.engine_id, q.engine_id));
    DX_ASSERT(!p.n_tokens || !memcmp(p.token_ids, q.token_ids, p.n_tokens * sizeof(int32_t)));
    json_decref(v);
    kvtp_free(&p);
    kvtp_free(&q);
    dx_buf_free(&b);
}

/* The constraint's EBNF, in the format the first byte's bits pick. */
static void check_gram(const oai_req *r, uint8_t sel)
{
    dx_buf src;
    dx_buf_init(&src, 0);
    oai_err e;
    int rc = node_gram_source(r, (sel >> 1) % 3, (sel >> 3) & 1, &src, NULL, &e);
    DX_ASSERT(rc == 0 || (rc == DX_EINVAL && e.status == 400 && e.param[0]) || rc == DX_ENOMEM);
    if (rc == 0 && src.len) {
        gram *g;
        rc = gram_compile_ebnf(src.data, src.len, &g);
        DX_ASSERT(rc == 0 || r->grammar || rc == DX_ENOMEM);
        gram_destroy(g);
    }
    dx_buf_free(&src);
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
    if (r.kv_transfer_params) check_params(r.kv_transfer_params);
    if (node_gram_param(&r)) check_gram(&r, data[0]);
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_meta m = {kind, "id-1", r.model, 1};
    oai_usage u = {1, 0, 1};
    for (size_t i = 0; i < r.n_msgs; i++) {
        dx_buf_reset(&b);
        oai_resp_full(&b, &m,
                      &(oai_choice){.text = r.msgs[i].content,
                                    .len = r.msgs[i].content_len,
                                    .finish = "stop"},
                      &u, NULL);
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
