/* kvtp: `kv_transfer_params` — the P/D fields of a request or answer
 * (docs/pd.md), parsed and validated from the request's JSON and written
 * into answers.
 *
 * Field names are vLLM's NixlConnector's plus duplex's remote_lease,
 * remote_blocks_ttl_s, remote_token_ids and first_token_ids.  `null` means absent (vLLM-style
 * proxies send every field, most of them null).  Every field is type- and
 * range-checked; a bad one is a 400 whose message and param name it
 * ("kv_transfer_params.remote_port: ..."). */
#ifndef KVTP_H
#define KVTP_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "oai/oai_req.h"
#include "xfer/xfer_lease.h"

#define KVTP_MAX_ID    128 /* engine and request ids, bytes */
#define KVTP_MAX_HOST  255
#define KVTP_MAX_FIRST 8 /* first_token_ids (the engine's ENGINE_MAX_PREGEN) */

typedef struct {
    int do_remote_decode, do_remote_prefill;
    char engine_id[KVTP_MAX_ID + 1];  /* "" = absent */
    char request_id[KVTP_MAX_ID + 1]; /* "" = absent */
    char host[KVTP_MAX_HOST + 1];     /* "" = absent */
    int port;                         /* 0 = absent */
    int32_t *block_ids;               /* dx_malloc'd; NULL = absent */
    size_t n_blocks;
    int64_t num_tokens; /* -1 = absent */
    int has_lease;
    xfer_token lease;
    double ttl_s;       /* < 0 = absent */
    int32_t *token_ids; /* dx_malloc'd; NULL = absent */
    size_t n_tokens;
    /* first_token_ids: what a prefill node generated after remote_token_ids
     * (its first token); dx_malloc'd, NULL = absent */
    int32_t *first_ids;
    size_t n_first;
    xfer_token first_model; /* first_token_model: the fingerprint of the model that made them */
} kvtp;

typedef struct {
    uint32_t n_vocab;    /* token ids must be below it */
    uint32_t block_size; /* remote_num_tokens = blocks × this */
    size_t max_tokens;   /* longest remote_token_ids accepted */
} kvtp_limits;

/* obj: the request's kv_transfer_params (a jansson object, oai_req's).  0,
 * or DX_EINVAL with *err filled (status 400, the field as param). */
int kvtp_parse(const void *obj, const kvtp_limits *lim, kvtp *out, oai_err *err);
void kvtp_free(kvtp *p);

/* Names a holder a reader can pin: host, port, lease and blocks present. */
int kvtp_has_holder(const kvtp *p);

/* Appends `"kv_transfer_params":{...}` (every field; absent ones null). */
int kvtp_write(dx_buf *b, const kvtp *p);

#endif
