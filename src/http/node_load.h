/* node_load: what a node publishes of its costs and its queue — the wire
 * format the node writes (GET /health's "load", its registration's "load",
 * `duplex serve --fixed-costs`) and routers read to decide where a turn is
 * prefilled (docs/router.md, "Local prefill or a prefill node";
 * docs/pd.md, "Measured costs").
 *
 * One JSON object, every time in seconds and every field optional (a
 * reader takes 0 for what is missing; a node that publishes none is one
 * the router decides about by the fixed rule):
 *
 *   {"v":1, "fixed":false, "samples":412,
 *    "step_s":0.004, "prefill_tok_s":0.0002, "prefill_key_s":1.2e-8,
 *    "decode_tok_s":0.0003, "decode_key_s":1.1e-8,
 *    "itl_s":0.012, "itl_prefill_s":0.045,
 *    "running":3, "waiting":0, "prefill_pending":0, "batch_tokens":512,
 *    "kv_token_bytes":16384, "kv":"127.0.0.1:9201",
 *    "pull":{"setup_s":0.001, "byte_s":1e-9},
 *    "peers":[{"kv":"127.0.0.1:9101", "transport":"default", "samples":5,
 *              "setup_s":0.0003, "byte_s":5e-11}]}
 *
 * The step terms are engine/step_cost.h's (a step's time is step_s plus
 * per prefill token prefill_tok_s plus per key it attends to prefill_key_s,
 * and the same for decode tokens); itl_* the measured time of a decode step
 * without and with prefill work in it; the queue the engine's; kv this
 * node's KV address; pull the pull cost it assumes for a peer it has not
 * pulled from; peers what it measured pulling from each (a pull takes
 * setup_s + byte_s × bytes).  Parsing checks types and ranges and ignores
 * members it does not know (a newer node's). */
#ifndef NODE_LOAD_H
#define NODE_LOAD_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

#define NODE_LOAD_MAX_PEERS 8   /* peers published: the most recently used */
#define NODE_LOAD_ADDR_MAX  128 /* "host:port" */
#define NODE_LOAD_NAME_MAX  24

typedef struct {
    char kv[NODE_LOAD_ADDR_MAX];
    char transport[NODE_LOAD_NAME_MAX];
    uint32_t samples;
    double setup_s, byte_s;
} node_load_peer;

typedef struct {
    int has;   /* an object was read (or is to be written) */
    int fixed; /* set by --fixed-costs, not measured */
    uint64_t samples;
    double step_s, prefill_tok_s, prefill_key_s, decode_tok_s, decode_key_s;
    double itl_s, itl_prefill_s;
    uint32_t running, waiting;
    uint64_t prefill_pending;
    uint32_t batch_tokens, kv_token_bytes;
    char kv[NODE_LOAD_ADDR_MAX];
    double pull_setup_s, pull_byte_s;
    node_load_peer peers[NODE_LOAD_MAX_PEERS];
    size_t n_peers;
} node_load;

/* The object (a new reference), or NULL: out of memory. */
json_t *node_load_json(const node_load *l);
/* The object as compact JSON text, appended to out. */
int node_load_write(const node_load *l, dx_buf *out);
/* Reads an object (borrowed).  0 and *out (has = 1), or DX_EFORMAT naming
 * the member ("load: \"step_s\": ..."). */
int node_load_from_json(const json_t *o, node_load *out);
/* The same from text (--fixed-costs, a /health body's "load" member). */
int node_load_parse(const char *text, size_t len, node_load *out);
/* The peer published for a KV address, or NULL. */
const node_load_peer *node_load_peer_of(const node_load *l, const char *kv);

#endif
