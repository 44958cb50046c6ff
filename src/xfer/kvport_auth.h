/* kvport_auth: the KV port's mutual challenge-response over a cluster secret
 * (docs/kvport.md, "Authentication"; SECURITY.md).
 *
 * A UCX remote key opens a holder's whole KV pool to one-sided reads, so a
 * holder hands out its HELLO (remote key, worker address, pool base, layout)
 * only to a peer that proved it holds the cluster secret — and a reader
 * believes a holder's HELLO (and so the bytes it will read from it) only
 * after the holder proved the same.  Each side sends a fresh random nonce;
 * each proves knowledge of the secret with
 *
 *   HMAC-SHA-256(secret, "duplex-kvport-auth" | label | version |
 *                nonce_reader | nonce_holder | holder address | holder port)
 *
 * where label is "holder" or "reader" (a proof is never valid in the other
 * direction, so a peer cannot reflect one back), version is the KV-port
 * protocol version (no downgrade), and the holder's address and port are the
 * TCP connection's holder end as each side sees it (the reader: the address
 * it connected to; the holder: the address the connection arrived on), so a
 * proof made for one holder is useless at another and a third party cannot
 * relay a handshake between two nodes.  The secret never crosses the wire;
 * proofs are compared in constant time (sodium_memcmp).
 *
 * Without a secret (key NULL) both sides use the empty key: the handshake
 * still runs, but proves nothing, so a node without a secret keeps its KV
 * port on loopback (node_run).  A reader with a secret and a holder without
 * one (or the reverse) fail to authenticate each other.
 *
 * Built on libsodium (crypto_auth_hmacsha256, sodium_memcmp,
 * randombytes_buf). */
#ifndef KVPORT_AUTH_H
#define KVPORT_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_addr.h"
#include "xfer/kvport_proto.h"

#define KVPORT_SECRET_MIN 16u /* bytes, after trailing whitespace is dropped */
#define KVPORT_SECRET_MAX 4096u

typedef struct kvport_secret kvport_secret;

/* Reads the secret from a file: its bytes with trailing whitespace (a final
 * newline) dropped, KVPORT_SECRET_MIN..MAX of them.  Warns (log) when group
 * or others may read the file.  0, or DX_EINVAL/DX_EIO naming the file. */
int kvport_secret_load(const char *path, kvport_secret **out);
int kvport_secret_from_bytes(const void *p, size_t n, kvport_secret **out);
/* Wipes and frees; NULL is a no-op. */
void kvport_secret_destroy(kvport_secret *s);
/* Creates path (mode 0600; an existing file is an error) holding a fresh
 * random secret: 32 random bytes as 64 hex digits and a newline. */
int kvport_secret_write_new(const char *path);

/* Whether a KV port may listen on host.  It hands out the whole pool to any
 * peer that authenticates, and without a secret every peer does: so off
 * loopback only with a secret, or when the operator accepted that with
 * --insecure-no-auth (insecure).  0 when allowed, with *mode saying how
 * ("secret", "none, loopback only", "NONE (--insecure-no-auth...)");
 * DX_EDENIED with a message naming `flag` when not; DX_EINVAL when host does
 * not resolve. */
int kvport_listen_allowed(const char *host, const kvport_secret *s, int insecure, const char *flag,
                          const char **mode);

/* One connection's handshake, either side. */
typedef struct {
    const kvport_secret *key; /* NULL: no secret */
    dx_ipport holder;         /* the connection's holder end */
    uint8_t nonce_r[KVPORT_NONCE_BYTES], nonce_h[KVPORT_NONCE_BYTES];
    int step; /* what the next call may be; anything else fails */
} kvport_auth;

/* Reader, step 1: a fresh nonce, in init (send it as AUTH_INIT). */
int kvport_auth_reader_start(kvport_auth *a, const kvport_secret *key, const dx_ipport *holder,
                             kvport_auth_msg *init);
/* Reader, step 2: checks the holder's AUTH_CHALLENGE; 0 and the reader's
 * proof in proof (send it as AUTH_PROOF), or DX_EAUTH. */
int kvport_auth_reader_prove(kvport_auth *a, const kvport_auth_msg *challenge,
                             kvport_auth_msg *proof);

/* Holder, step 1: answers the reader's AUTH_INIT with AUTH_CHALLENGE (a
 * fresh nonce and the holder's proof). */
int kvport_auth_holder_challenge(kvport_auth *a, const kvport_secret *key, const dx_ipport *holder,
                                 const kvport_auth_msg *init, kvport_auth_msg *challenge);
/* Holder, step 2: checks the reader's AUTH_PROOF; 0 or DX_EAUTH.  A
 * handshake is verified at most once. */
int kvport_auth_holder_verify(kvport_auth *a, const kvport_auth_msg *proof);

#endif
