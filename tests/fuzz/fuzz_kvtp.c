/* Fuzz target: kv_transfer_params as a node reads them (kvtp_parse, what
 * node_pd_parse calls), straight from JSON — any value, not only one inside
 * an otherwise valid request.  Byte 0 picks the limits (vocabulary, block
 * size, longest remote_token_ids); the rest is the params.  Invariants: a
 * refusal is a 400 naming the field ("kv_transfer_params.<field>"), with the
 * same text as the thread's error message; accepted params obey the limits
 * (ids in range, lengths bounded, tokens = blocks × block size, first ids
 * only with the tokens and model they follow), name a holder exactly when
 * host, port, lease and blocks are all there, and survive kvtp_write and a
 * second parse unchanged; nothing leaks. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "node/kvtp.h"
#include "oai/oai_req.h"

static void check_limits(const kvtp *p, const kvtp_limits *lim)
{
    for (size_t i = 0; i < p->n_tokens; i++)
        DX_ASSERT(p->token_ids[i] >= 0 && (uint32_t)p->token_ids[i] < lim->n_vocab);
    for (size_t i = 0; i < p->n_first; i++)
        DX_ASSERT(p->first_ids[i] >= 0 && (uint32_t)p->first_ids[i] < lim->n_vocab);
    for (size_t i = 0; i < p->n_blocks; i++) DX_ASSERT(p->block_ids[i] >= 0);
    DX_ASSERT(p->n_tokens <= lim->max_tokens && p->n_first <= KVTP_MAX_FIRST);
    if (p->num_tokens >= 0 && p->block_ids)
        DX_ASSERT((uint64_t)p->num_tokens == (uint64_t)p->n_blocks * lim->block_size);
    DX_ASSERT(!p->first_ids || p->token_ids);
    DX_ASSERT(p->port >= 0 && p->port <= 65535 && (p->ttl_s < 0 || p->ttl_s <= 1e7));
    int holder = p->host[0] && p->port > 0 && p->has_lease && p->block_ids && p->n_blocks > 0;
    DX_ASSERT(kvtp_has_holder(p) == holder);
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && !a == !b && (!na || !memcmp(a, b, na * sizeof *a));
}

/* Written and parsed again: the same params. */
static void check_round_trip(const kvtp *p, const kvtp_limits *lim)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    DX_ASSERT(dx_buf_putc(&b, '{') == 0 && kvtp_write(&b, p) == 0 && dx_buf_putc(&b, '}') == 0);
    json_error_t je;
    json_t *v = json_loadb(b.data, b.len, 0, &je);
    DX_ASSERT(json_is_object(v));
    kvtp q;
    oai_err e;
    DX_ASSERT(kvtp_parse(json_object_get(v, "kv_transfer_params"), lim, &q, &e) == 0);
    DX_ASSERT(p->do_remote_decode == q.do_remote_decode &&
              p->do_remote_prefill == q.do_remote_prefill && p->port == q.port &&
              p->num_tokens == q.num_tokens && p->has_lease == q.has_lease &&
              p->ttl_s == q.ttl_s && !strcmp(p->host, q.host) &&
              !strcmp(p->engine_id, q.engine_id) && !strcmp(p->request_id, q.request_id));
    DX_ASSERT(!p->has_lease || !memcmp(p->lease.b, q.lease.b, sizeof q.lease.b));
    DX_ASSERT(same_ids(p->block_ids, p->n_blocks, q.block_ids, q.n_blocks));
    DX_ASSERT(same_ids(p->token_ids, p->n_tokens, q.token_ids, q.n_tokens));
    DX_ASSERT(same_ids(p->first_ids, p->n_first, q.first_ids, q.n_first));
    DX_ASSERT(!p->first_ids || !memcmp(p->first_model.b, q.first_model.b, 16));
    kvtp_free(&q);
    json_decref(v);
    dx_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int once;
    if (!once) {
        oai_json_use_dx_alloc(); /* jansson's memory counted too */
        once = 1;
    }
    if (size < 1) return 0;
    static const uint32_t vocab[4] = {0, 1, 1000, 151936}, bsize[4] = {16, 1, 0, 32};
    static const size_t max_tok[4] = {0, 3, 64, 1u << 20};
    kvtp_limits lim = {vocab[data[0] & 3], bsize[(data[0] >> 2) & 3], max_tok[(data[0] >> 4) & 3]};
    size_t live = dx_alloc_live_count();
    json_error_t je;
    json_t *obj = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, &je);
    if (obj) {
        kvtp p;
        oai_err e;
        dx_err_clear();
        if (kvtp_parse(obj, &lim, &p, &e) == 0) {
            check_limits(&p, &lim);
            check_round_trip(&p, &lim);
            kvtp_free(&p);
        } else {
            DX_ASSERT(e.status == 400 && !strncmp(e.param, "kv_transfer_params.", 19));
            DX_ASSERT(!strncmp(e.message, e.param, strlen(e.param)));
            DX_ASSERT(!strcmp(dx_errmsg(), e.message) && dx_errcode() == DX_EINVAL);
            DX_ASSERT(!p.block_ids && !p.token_ids && !p.first_ids); /* freed on refusal */
        }
        json_decref(obj);
    }
    if (dx_alloc_live_count() != live) abort(); /* a leak */
    return 0;
}
