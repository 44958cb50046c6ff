/* kvport_proto: encode/decode of KV-port frames.  A cursor walks the payload;
 * every read checks the remaining length first, so a hostile frame can only
 * produce DX_EFORMAT with the name of the field it broke. */
#include "xfer/kvport_proto.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"

typedef struct {
    const uint8_t *p;
    size_t len, pos;
    const char *what; /* frame type name for messages */
    int err;
} rd;

static uint64_t le_load(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void le_store(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++, v >>= 8) p[i] = (uint8_t)v;
}

static int rd_need(rd *r, size_t n, const char *field)
{
    if (r->err) return 0;
    if (n > r->len - r->pos) {
        r->err =
            dx_errf(DX_EFORMAT, "kvport %s: field '%s' needs %zu bytes at offset %zu, %zu left",
                    r->what, field, n, r->pos, r->len - r->pos);
        return 0;
    }
    return 1;
}

static uint64_t rd_uint(rd *r, int n, const char *field)
{
    if (!rd_need(r, (size_t)n, field)) return 0;
    uint64_t v = le_load(r->p + r->pos, n);
    r->pos += (size_t)n;
    return v;
}

static const uint8_t *rd_raw(rd *r, size_t n, const char *field)
{
    if (!rd_need(r, n, field)) return NULL;
    const uint8_t *p = r->p + r->pos;
    r->pos += n;
    return p;
}

/* Length-prefixed byte string with a u16 or u32 length and a maximum. */
static kvport_bytes rd_bytes(rd *r, int lenbytes, size_t max, const char *field)
{
    kvport_bytes b = {NULL, 0};
    uint64_t n = rd_uint(r, lenbytes, field);
    if (r->err) return b;
    if (n > max) {
        r->err = dx_errf(DX_EFORMAT, "kvport %s: field '%s' is %llu bytes, limit %zu", r->what,
                         field, (unsigned long long)n, max);
        return b;
    }
    b.p = rd_raw(r, (size_t)n, field);
    b.n = b.p ? (size_t)n : 0;
    return b;
}

static void rd_fixed(rd *r, uint8_t *dst, size_t n, const char *field)
{
    const uint8_t *p = rd_raw(r, n, field);
    if (p) memcpy(dst, p, n);
}

static int rd_end(rd *r)
{
    if (r->err) return r->err;
    if (r->pos != r->len)
        return dx_errf(DX_EFORMAT, "kvport %s: %zu trailing bytes after the last field", r->what,
                       r->len - r->pos);
    return 0;
}

const char *kvport_type_name(uint16_t type)
{
    static const char *names[] = {
        "?",          "HELLO", "PIN",   "PIN_OK",   "GONE",      "MISMATCH",       "RELEASE",
        "RELEASE_OK", "ERROR", "RENEW", "RENEW_OK", "AUTH_INIT", "AUTH_CHALLENGE", "AUTH_PROOF",
        "AUTH_OK"};
    return type < DX_ARRAY_LEN(names) ? names[type] : "unknown";
}

int kvport_hdr_read(const uint8_t *buf, size_t len, kvport_hdr *h)
{
    if (len < KVPORT_HDR_BYTES)
        return dx_errf(DX_EAGAIN, "kvport: %zu of %d header bytes", len, KVPORT_HDR_BYTES);
    h->magic = (uint32_t)le_load(buf, 4);
    h->version = (uint16_t)le_load(buf + 4, 2);
    h->type = (uint16_t)le_load(buf + 6, 2);
    h->length = (uint32_t)le_load(buf + 8, 4);
    if (h->magic != KVPORT_MAGIC)
        return dx_errf(DX_EPROTO, "kvport: bad magic 0x%08x (not a KV-port peer)", h->magic);
    if (h->version != KVPORT_VERSION)
        return dx_errf(DX_EUNSUPPORTED, "kvport: protocol version %u, this node speaks %u",
                       h->version, KVPORT_VERSION);
    if (h->length > KVPORT_MAX_PAYLOAD)
        return dx_errf(DX_ETOOBIG, "kvport: %s frame of %u bytes exceeds the %u-byte limit",
                       kvport_type_name(h->type), h->length, KVPORT_MAX_PAYLOAD);
    return 0;
}

static void dec_hello(rd *r, kvport_hello *m)
{
    m->engine_id = rd_bytes(r, 2, KVPORT_MAX_STR, "engine_id");
    rd_fixed(r, m->fingerprint, 16, "fingerprint");
    m->instance = rd_uint(r, 8, "instance");
    m->n_layer = (uint32_t)rd_uint(r, 4, "n_layer");
    m->n_kv_head = (uint32_t)rd_uint(r, 4, "n_kv_head");
    m->head_dim = (uint32_t)rd_uint(r, 4, "head_dim");
    m->dtype = (uint32_t)rd_uint(r, 4, "dtype");
    m->block_size = (uint32_t)rd_uint(r, 4, "block_size");
    m->n_blocks = (uint32_t)rd_uint(r, 4, "n_blocks");
    m->block_bytes = rd_uint(r, 8, "block_bytes");
    m->transports = rd_bytes(r, 2, KVPORT_MAX_STR, "transports");
    m->worker_addr = rd_bytes(r, 4, KVPORT_MAX_BLOB, "worker_addr");
    m->rkey = rd_bytes(r, 4, KVPORT_MAX_BLOB, "rkey");
    m->base_addr = rd_uint(r, 8, "base_addr");
}

static void dec_pin(rd *r, kvport_pin *m)
{
    rd_fixed(r, m->token, 16, "token");
    m->n = (uint32_t)rd_uint(r, 4, "n_blocks");
    if (!r->err && m->n > KVPORT_MAX_PIN_BLOCKS) {
        r->err =
            dx_errf(DX_EFORMAT, "kvport PIN: %u blocks, limit %u", m->n, KVPORT_MAX_PIN_BLOCKS);
        return;
    }
    m->ids = rd_raw(r, (size_t)m->n * 4, "block_ids");
    m->hashes = rd_raw(r, (size_t)m->n * 16, "hash_chain");
}

int kvport_decode(const kvport_hdr *h, const uint8_t *payload, kvport_msg *out)
{
    memset(out, 0, sizeof *out);
    out->type = h->type;
    rd r = {payload, h->length, 0, kvport_type_name(h->type), 0};
    switch (h->type) {
    case KVPORT_HELLO:
        dec_hello(&r, &out->u.hello);
        break;
    case KVPORT_PIN:
        dec_pin(&r, &out->u.pin);
        break;
    case KVPORT_PIN_OK:
        out->u.pin_ok.pin_id = rd_uint(&r, 8, "pin_id");
        out->u.pin_ok.n_matched = (uint32_t)rd_uint(&r, 4, "n_matched");
        out->u.pin_ok.instance = rd_uint(&r, 8, "instance");
        out->u.pin_ok.ttl_ms = (uint32_t)rd_uint(&r, 4, "ttl_ms");
        break;
    case KVPORT_RELEASE:
        out->u.release.pin_id = rd_uint(&r, 8, "pin_id");
        out->u.release.consumed = (uint8_t)rd_uint(&r, 1, "consumed");
        break;
    case KVPORT_RELEASE_OK:
        break;
    case KVPORT_RENEW:
        out->u.renew.pin_id = rd_uint(&r, 8, "pin_id");
        break;
    case KVPORT_RENEW_OK:
        out->u.renew_ok.ttl_ms = (uint32_t)rd_uint(&r, 4, "ttl_ms");
        break;
    case KVPORT_AUTH_INIT:
        rd_fixed(&r, out->u.auth.nonce, KVPORT_NONCE_BYTES, "nonce");
        break;
    case KVPORT_AUTH_CHALLENGE:
        rd_fixed(&r, out->u.auth.nonce, KVPORT_NONCE_BYTES, "nonce");
        rd_fixed(&r, out->u.auth.proof, KVPORT_PROOF_BYTES, "proof");
        break;
    case KVPORT_AUTH_PROOF:
        rd_fixed(&r, out->u.auth.proof, KVPORT_PROOF_BYTES, "proof");
        break;
    case KVPORT_AUTH_OK:
        break;
    case KVPORT_GONE:
    case KVPORT_MISMATCH:
    case KVPORT_ERROR:
        out->u.error.code = (int32_t)(uint32_t)rd_uint(&r, 4, "code");
        out->u.error.message = rd_bytes(&r, 2, KVPORT_MAX_STR, "message");
        break;
    default:
        return dx_errf(DX_EUNSUPPORTED, "kvport: unknown frame type %u", h->type);
    }
    return rd_end(&r);
}

/* ---- encoding ---- */

typedef struct {
    dx_buf *b;
    size_t start;
    int err;
} wr;

static void wr_raw(wr *w, const void *p, size_t n)
{
    if (!w->err && n) w->err = dx_buf_append(w->b, p, n);
}

static void wr_uint(wr *w, uint64_t v, int n)
{
    uint8_t tmp[8];
    le_store(tmp, v, n);
    wr_raw(w, tmp, (size_t)n);
}

static void wr_bytes(wr *w, const void *p, size_t n, int lenbytes, size_t max)
{
    if (n > max) {
        if (!w->err)
            w->err = dx_errf(DX_EINVAL, "kvport: field of %zu bytes over limit %zu", n, max);
        return;
    }
    wr_uint(w, n, lenbytes);
    wr_raw(w, p, n);
}

static wr wr_begin(dx_buf *b, uint16_t type)
{
    wr w = {b, b->len, 0};
    wr_uint(&w, KVPORT_MAGIC, 4);
    wr_uint(&w, KVPORT_VERSION, 2);
    wr_uint(&w, type, 2);
    wr_uint(&w, 0, 4); /* length, patched by wr_finish */
    return w;
}

static int wr_finish(wr *w)
{
    size_t len = w->b->len - w->start - KVPORT_HDR_BYTES;
    if (!w->err && len > KVPORT_MAX_PAYLOAD)
        w->err = dx_errf(DX_ETOOBIG, "kvport: frame of %zu bytes over the limit", len);
    if (w->err) {
        w->b->len = w->start; /* leave the buffer as it was */
        return w->err;
    }
    le_store((uint8_t *)w->b->data + w->start + 8, len, 4);
    return 0;
}

int kvport_encode_hello(dx_buf *b, const kvport_hello *m)
{
    wr w = wr_begin(b, KVPORT_HELLO);
    wr_bytes(&w, m->engine_id.p, m->engine_id.n, 2, KVPORT_MAX_STR);
    wr_raw(&w, m->fingerprint, 16);
    wr_uint(&w, m->instance, 8);
    wr_uint(&w, m->n_layer, 4);
    wr_uint(&w, m->n_kv_head, 4);
    wr_uint(&w, m->head_dim, 4);
    wr_uint(&w, m->dtype, 4);
    wr_uint(&w, m->block_size, 4);
    wr_uint(&w, m->n_blocks, 4);
    wr_uint(&w, m->block_bytes, 8);
    wr_bytes(&w, m->transports.p, m->transports.n, 2, KVPORT_MAX_STR);
    wr_bytes(&w, m->worker_addr.p, m->worker_addr.n, 4, KVPORT_MAX_BLOB);
    wr_bytes(&w, m->rkey.p, m->rkey.n, 4, KVPORT_MAX_BLOB);
    wr_uint(&w, m->base_addr, 8);
    return wr_finish(&w);
}

int kvport_encode_pin(dx_buf *b, const uint8_t token[16], const int32_t *ids,
                      const uint64_t *hashes, uint32_t n)
{
    if (n > KVPORT_MAX_PIN_BLOCKS)
        return dx_errf(DX_EINVAL, "kvport PIN: %u blocks, limit %u", n, KVPORT_MAX_PIN_BLOCKS);
    wr w = wr_begin(b, KVPORT_PIN);
    wr_raw(&w, token, 16);
    wr_uint(&w, n, 4);
    for (uint32_t i = 0; i < n; i++) wr_uint(&w, (uint32_t)ids[i], 4);
    for (uint32_t i = 0; i < n; i++) {
        wr_uint(&w, hashes[2 * i], 8);
        wr_uint(&w, hashes[2 * i + 1], 8);
    }
    return wr_finish(&w);
}

int kvport_encode_pin_ok(dx_buf *b, const kvport_pin_ok *m)
{
    wr w = wr_begin(b, KVPORT_PIN_OK);
    wr_uint(&w, m->pin_id, 8);
    wr_uint(&w, m->n_matched, 4);
    wr_uint(&w, m->instance, 8);
    wr_uint(&w, m->ttl_ms, 4);
    return wr_finish(&w);
}

int kvport_encode_release(dx_buf *b, const kvport_release *m)
{
    wr w = wr_begin(b, KVPORT_RELEASE);
    wr_uint(&w, m->pin_id, 8);
    wr_uint(&w, m->consumed, 1);
    return wr_finish(&w);
}

int kvport_encode_release_ok(dx_buf *b)
{
    wr w = wr_begin(b, KVPORT_RELEASE_OK);
    return wr_finish(&w);
}

int kvport_encode_renew(dx_buf *b, const kvport_renew *m)
{
    wr w = wr_begin(b, KVPORT_RENEW);
    wr_uint(&w, m->pin_id, 8);
    return wr_finish(&w);
}

int kvport_encode_renew_ok(dx_buf *b, const kvport_renew_ok *m)
{
    wr w = wr_begin(b, KVPORT_RENEW_OK);
    wr_uint(&w, m->ttl_ms, 4);
    return wr_finish(&w);
}

int kvport_encode_auth(dx_buf *b, uint16_t type, const kvport_auth_msg *m)
{
    if (type < KVPORT_AUTH_INIT || type > KVPORT_AUTH_OK || (type != KVPORT_AUTH_OK && !m))
        return dx_errf(DX_EINVAL, "kvport: %u is not an authentication frame type", type);
    wr w = wr_begin(b, type);
    if (type == KVPORT_AUTH_INIT || type == KVPORT_AUTH_CHALLENGE)
        wr_raw(&w, m->nonce, KVPORT_NONCE_BYTES);
    if (type == KVPORT_AUTH_CHALLENGE || type == KVPORT_AUTH_PROOF)
        wr_raw(&w, m->proof, KVPORT_PROOF_BYTES);
    return wr_finish(&w);
}

int kvport_encode_error(dx_buf *b, uint16_t type, int32_t code, const char *msg)
{
    if (type != KVPORT_ERROR && type != KVPORT_GONE && type != KVPORT_MISMATCH)
        return dx_errf(DX_EINVAL, "kvport: %u is not an error frame type", type);
    size_t n = msg ? strlen(msg) : 0;
    if (n > KVPORT_MAX_STR) n = KVPORT_MAX_STR; /* truncate rather than fail to report */
    wr w = wr_begin(b, type);
    wr_uint(&w, (uint32_t)code, 4);
    wr_bytes(&w, msg, n, 2, KVPORT_MAX_STR);
    return wr_finish(&w);
}

int32_t kvport_pin_id(const kvport_pin *p, uint32_t i)
{
    return (int32_t)(uint32_t)le_load(p->ids + (size_t)i * 4, 4);
}

void kvport_pin_hash(const kvport_pin *p, uint32_t i, uint64_t *lo, uint64_t *hi)
{
    *lo = le_load(p->hashes + (size_t)i * 16, 8);
    *hi = le_load(p->hashes + (size_t)i * 16 + 8, 8);
}

/* DX_ELAYOUT, not DX_EMISMATCH: the same model with another KV dtype or
 * block size is a configuration to fix (duplex up gives every node one),
 * and nodes count it apart from a mismatched model (pd.md). */
static int differ_u(const char *field, uint64_t mine, uint64_t theirs)
{
    return dx_errf(DX_ELAYOUT, "KV layout differs: %s is %llu here, %llu on the peer", field,
                   (unsigned long long)mine, (unsigned long long)theirs);
}

static const char *dtype_name(uint32_t t)
{
    const char *n = dx_dtype_name((int)t);
    return n ? n : "unknown";
}

int kvport_hello_compatible(const kvport_hello *a, const kvport_hello *b)
{
    if (memcmp(a->fingerprint, b->fingerprint, 16)) {
        char x[33], y[33];
        for (int i = 0; i < 16; i++) {
            snprintf(x + 2 * i, 3, "%02x", a->fingerprint[i]);
            snprintf(y + 2 * i, 3, "%02x", b->fingerprint[i]);
        }
        return dx_errf(DX_EMISMATCH, "model fingerprint differs: %s here, %s on the peer", x, y);
    }
    if (a->n_layer != b->n_layer) return differ_u("n_layer", a->n_layer, b->n_layer);
    if (a->n_kv_head != b->n_kv_head) return differ_u("n_kv_head", a->n_kv_head, b->n_kv_head);
    if (a->head_dim != b->head_dim) return differ_u("head_dim", a->head_dim, b->head_dim);
    if (a->dtype != b->dtype)
        return dx_errf(DX_ELAYOUT, "KV layout differs: the KV dtype is %s here, %s on the peer",
                       dtype_name(a->dtype), dtype_name(b->dtype));
    if (a->block_size != b->block_size) return differ_u("block_size", a->block_size, b->block_size);
    if (a->block_bytes != b->block_bytes)
        return differ_u("block_bytes", a->block_bytes, b->block_bytes);
    return 0;
}
