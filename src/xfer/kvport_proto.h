/* kvport_proto: the KV port's binary wire format (DESIGN.md §5).
 *
 * Every frame is a fixed 12-byte little-endian header followed by `length`
 * payload bytes:
 *
 *   u32 magic 'DXKV' | u16 version | u16 type | u32 length
 *
 * Payload fields are little-endian integers, fixed 16-byte values (tokens,
 * hashes, fingerprints) and length-prefixed byte strings (u16 or u32 length).
 * Decoding checks every field against what remains, rejects trailing bytes,
 * and never reads past the buffer; arrays are not copied: the decoded message
 * points into the frame (read them with the accessors below).
 *
 * Conversation (docs/kvport.md): first the mutual authentication
 * (kvport_auth.h): AUTH_INIT {reader's nonce} → AUTH_CHALLENGE {holder's
 * nonce, holder's proof}; AUTH_PROOF {reader's proof} → AUTH_OK, or ERROR
 * (DX_EAUTH) and the connection closes.  Only then: the reader sends HELLO
 * (its own identity and layout) and the holder answers HELLO or
 * ERROR(MISMATCH);
 * PIN → PIN_OK {pin_id, n_matched, instance, ttl_ms} | GONE | MISMATCH;
 * while its one-sided reads run, the reader renews the pin every
 * min(ttl_ms, its peer timeout)/3 (xfer_client.h):
 * RENEW {pin_id} → RENEW_OK {ttl_ms} | GONE (the pin lapsed) | ERROR (not a
 * pin of this connection); then RELEASE → RELEASE_OK, which is the holder's
 * word that the blocks stayed pinned for the whole read.  Any request the
 * holder cannot accept is answered with ERROR {code, message}; a frame with
 * a bad magic, version or length gets an ERROR and the connection is closed
 * (the stream cannot be resynced); a frame of unknown type or with a
 * malformed payload gets an ERROR and the connection stays usable.
 *
 * Version 2 added RENEW/RENEW_OK and PIN_OK's ttl_ms; version 3 changed what
 * the pulled bytes mean (K is stored transposed inside a block, kv_pool.h);
 * version 4 added the AUTH frames (nothing else is answered before them).
 * An older peer gets the version error rather than misread KV or skip the
 * handshake. */
#ifndef KVPORT_PROTO_H
#define KVPORT_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

#define KVPORT_MAGIC       0x564b5844u /* "DXKV" read as little-endian u32 */
#define KVPORT_VERSION     4
#define KVPORT_HDR_BYTES   12
#define KVPORT_MAX_PAYLOAD (8u << 20)
/* Most blocks one PIN may name (1 Mi tokens at 16 tokens per block). */
#define KVPORT_MAX_PIN_BLOCKS 65536u
#define KVPORT_MAX_BLOB       4096u /* worker address, rkey */
#define KVPORT_MAX_STR        1024u
/* Authentication: nonce and proof (HMAC-SHA-256) sizes, and the largest
 * payload a holder reads from a peer that has not authenticated yet. */
#define KVPORT_NONCE_BYTES      32u
#define KVPORT_PROOF_BYTES      32u
#define KVPORT_MAX_AUTH_PAYLOAD 64u

enum kvport_type {
    KVPORT_HELLO = 1,
    KVPORT_PIN = 2,
    KVPORT_PIN_OK = 3,
    KVPORT_GONE = 4,
    KVPORT_MISMATCH = 5,
    KVPORT_RELEASE = 6,
    KVPORT_RELEASE_OK = 7,
    KVPORT_ERROR = 8,
    KVPORT_RENEW = 9,
    KVPORT_RENEW_OK = 10,
    KVPORT_AUTH_INIT = 11,      /* reader: nonce */
    KVPORT_AUTH_CHALLENGE = 12, /* holder: nonce, proof */
    KVPORT_AUTH_PROOF = 13,     /* reader: proof */
    KVPORT_AUTH_OK = 14,        /* holder: (empty) */
};

typedef struct {
    uint32_t magic;
    uint16_t version, type;
    uint32_t length;
} kvport_hdr;

/* Byte strings point into the decoded frame (or the caller's memory when
 * encoding); `str` fields are not NUL-terminated on decode. */
typedef struct {
    const uint8_t *p;
    size_t n;
} kvport_bytes;

typedef struct {
    kvport_bytes engine_id;
    uint8_t fingerprint[16];
    uint64_t instance; /* random per process: tells a restarted holder apart */
    uint32_t n_layer, n_kv_head, head_dim, dtype, block_size, n_blocks;
    uint64_t block_bytes;
    kvport_bytes transports; /* e.g. "ucx" */
    kvport_bytes worker_addr;
    kvport_bytes rkey;
    uint64_t base_addr;
} kvport_hello;

typedef struct {
    uint8_t token[16];
    uint32_t n;
    const uint8_t *ids;    /* n × i32 */
    const uint8_t *hashes; /* n × 16 bytes: kv_hash lo, hi as u64 each */
} kvport_pin;

typedef struct {
    uint64_t pin_id;
    uint32_t n_matched;
    uint64_t instance;
    uint32_t ttl_ms; /* the pin lapses this long after PIN_OK or a RENEW_OK unless renewed */
} kvport_pin_ok;

typedef struct {
    uint64_t pin_id;
    uint8_t consumed;
} kvport_release;

typedef struct {
    uint64_t pin_id;
} kvport_renew;

typedef struct {
    uint32_t ttl_ms; /* the pin's new deadline is this far from the holder's now */
} kvport_renew_ok;

/* AUTH_INIT uses nonce, AUTH_CHALLENGE both, AUTH_PROOF proof. */
typedef struct {
    uint8_t nonce[KVPORT_NONCE_BYTES];
    uint8_t proof[KVPORT_PROOF_BYTES];
} kvport_auth_msg;

typedef struct {
    int32_t code; /* DX_E* */
    kvport_bytes message;
} kvport_error;

typedef struct {
    uint16_t type;
    union {
        kvport_hello hello;
        kvport_pin pin;
        kvport_pin_ok pin_ok;
        kvport_release release;
        kvport_renew renew;
        kvport_renew_ok renew_ok;
        kvport_auth_msg auth;
        kvport_error error; /* ERROR, GONE and MISMATCH (code = DX_EGONE/DX_EMISMATCH) */
    } u;
} kvport_msg;

/* Reads the header of a frame starting at buf.  Returns 0 when a header is
 * there and valid (the whole frame is KVPORT_HDR_BYTES + h->length bytes),
 * DX_EAGAIN when fewer than KVPORT_HDR_BYTES bytes are available, DX_EPROTO
 * for a bad magic, DX_EUNSUPPORTED for another version, DX_ETOOBIG for a
 * length over KVPORT_MAX_PAYLOAD; the message says which. */
int kvport_hdr_read(const uint8_t *buf, size_t len, kvport_hdr *h);

/* Decodes the payload of a frame whose header was accepted.  DX_EUNSUPPORTED
 * for an unknown type, DX_EFORMAT for a payload that does not hold its
 * fields exactly (message names the field). */
int kvport_decode(const kvport_hdr *h, const uint8_t *payload, kvport_msg *out);

/* Encoders append one whole frame to b.  0 or DX_ENOMEM/DX_ETOOBIG/DX_EINVAL. */
int kvport_encode_hello(dx_buf *b, const kvport_hello *m);
int kvport_encode_pin(dx_buf *b, const uint8_t token[16], const int32_t *ids,
                      const uint64_t *hashes /* n × {lo, hi} */, uint32_t n);
int kvport_encode_pin_ok(dx_buf *b, const kvport_pin_ok *m);
int kvport_encode_release(dx_buf *b, const kvport_release *m);
int kvport_encode_release_ok(dx_buf *b);
int kvport_encode_renew(dx_buf *b, const kvport_renew *m);
int kvport_encode_renew_ok(dx_buf *b, const kvport_renew_ok *m);
/* type is KVPORT_AUTH_INIT (m->nonce), KVPORT_AUTH_CHALLENGE (both),
 * KVPORT_AUTH_PROOF (m->proof) or KVPORT_AUTH_OK (m unused, may be NULL). */
int kvport_encode_auth(dx_buf *b, uint16_t type, const kvport_auth_msg *m);
/* type is KVPORT_ERROR, KVPORT_GONE or KVPORT_MISMATCH. */
int kvport_encode_error(dx_buf *b, uint16_t type, int32_t code, const char *msg);

/* Accessors for PIN arrays (bounds were checked by kvport_decode). */
int32_t kvport_pin_id(const kvport_pin *p, uint32_t i);
void kvport_pin_hash(const kvport_pin *p, uint32_t i, uint64_t *lo, uint64_t *hi);

const char *kvport_type_name(uint16_t type);

/* Compares what must be equal for two nodes to share KV: model fingerprint
 * and layout.  0 if compatible, else DX_EMISMATCH (another model) or
 * DX_ELAYOUT (the same model, another KV dtype or block size) with a
 * message naming the first field that differs and both values. */
int kvport_hello_compatible(const kvport_hello *mine, const kvport_hello *theirs);

#endif
