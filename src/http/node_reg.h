/* node_reg: nodes that register themselves in Redis (`duplex serve
 * --register`, docs/router.md "Nodes that register themselves").
 *
 * A node writes one key, <prefix>node:<advertise-url>, whose value is a
 * small JSON object (node_reg_info: role, URL, KV address, model
 * fingerprint, load, draining), with `SET key value PX 3*heartbeat` every
 * heartbeat, and DELs it on a clean stop; routers (`--discover`) read every
 * such key with SCAN + MGET.  A node that dies without DEL vanishes when the
 * TTL runs out.
 *
 * The writes run on a thread of their own with a blocking hiredis
 * connection (node/rds.h): a slow or absent Redis never stalls the HTTP
 * loop.  The loop hands the thread the next value (node_reg_publish); the
 * thread sends it, and when Redis is down logs that once per outage and
 * tries again with the next value.  The node serves all the while.
 *
 * Trust: Redis is inside the cluster's trust boundary (SECURITY.md): with
 * a peers list the thread also allows KV pulls from every KV address
 * registered under the same prefix. */
#ifndef NODE_REG_H
#define NODE_REG_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "http/rds.h"
#include "xfer/xfer_peers.h"

#define NODE_REG_URL_MAX    256
#define NODE_REG_PREFIX_MAX 64
#define NODE_REG_VALUE_MAX  2048 /* a registration's JSON; longer values are skipped */
#define NODE_REG_SCAN_MAX   1024 /* registrations one scan reads at most */

typedef struct {
    char url[NODE_REG_URL_MAX]; /* "http://host:port" */
    char role[8];               /* "prefill" | "decode" | "both" */
    char kv[NODE_REG_URL_MAX];  /* "host:port" of the KV port, "" when it has none */
    char model[33];             /* the model fingerprint, 32 hex digits */
    uint32_t outstanding;       /* requests running or queued */
    uint32_t free_kv_blocks;    /* blocks free or evictable */
    int draining;
    uint32_t heartbeat_ms;
    uint64_t started_ms; /* Unix time, ms */
} node_reg_info;

/* The JSON value (registry contract); appended to out. */
int node_reg_format(const node_reg_info *ni, dx_buf *out);
/* Parses and checks a value (url a valid http URL, role known, model 32 hex
 * digits, numbers in range).  0 and *out, or DX_EFORMAT saying what is
 * wrong. */
int node_reg_parse(const char *json, size_t len, node_reg_info *out);

/* A key prefix: 1..64 bytes, none of the SCAN pattern's *?[]\ nor space.
 * DX_EINVAL naming flag otherwise. */
int node_reg_check_prefix(const char *prefix, const char *flag);
/* "<prefix>node:<url>" into out; DX_EINVAL when it does not fit. */
int node_reg_key(const char *prefix, const char *url, char *out, size_t cap);

/* Every registration under prefix (SCAN 0 MATCH <prefix>node:* + MGET),
 * at most NODE_REG_SCAN_MAX: each valid one goes to fn; *n_bad counts those
 * that did not parse.  Blocking on c.  0, or DX_EIO (the connection is then
 * unusable: free it). */
typedef void (*node_reg_each_fn)(void *user, const node_reg_info *ni);
int node_reg_scan(redisContext *c, const char *prefix, node_reg_each_fn fn, void *user,
                  size_t *n_bad);

/* ---- the node's heartbeat ---- */

typedef struct node_reg node_reg;

/* The heartbeat and the keys' prefix unless the config says (the router's
 * --state-prefix has the same default: one prefix serves both). */
#define NODE_REG_DEFAULT_HEARTBEAT_MS 1000
#define NODE_REG_DEFAULT_PREFIX       "duplex:"

typedef struct {
    const rds_url *redis;  /* copied */
    const char *prefix;    /* NULL: NODE_REG_DEFAULT_PREFIX */
    const char *url;       /* the advertised URL: the key's name */
    uint32_t heartbeat_ms; /* 0: the default; the key lives 3 x this */
    xfer_peers *peers;     /* NULL, or: allow pulls from every registered KV address */
} node_reg_config;

/* Starts the thread (it connects with the first value).  DX_EINVAL for a
 * bad prefix or URL, DX_ENOMEM. */
int node_reg_create(const node_reg_config *c, node_reg **out);
/* The value to write next (loop thread; copied).  Never blocks on Redis. */
void node_reg_publish(node_reg *r, const node_reg_info *ni);
/* Sends the key's DEL (bounded by the connection's deadline), stops the
 * thread and frees.  NULL: no-op. */
void node_reg_destroy(node_reg *r);

#endif
