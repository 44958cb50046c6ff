/* fuzz_kvport: feeds arbitrary bytes to the KV-port frame parser as a stream
 * of frames, and re-encodes whatever decodes (every frame type but the
 * error ones) to check it comes back byte for byte. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "xfer/kvport_proto.h"

/* Re-encodes a decoded frame.  Every field is fixed-width or length-
 * prefixed, so encoding is canonical: the bytes must come back exactly.
 * ERROR-type frames are left out: the encoder takes a C string, and a
 * message with a NUL byte in it decodes fine but re-encodes shorter. */
static void roundtrip(const kvport_msg *m, const uint8_t *frame, size_t len)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    int rc = 0, check = 1;
    switch (m->type) {
    case KVPORT_HELLO:
        rc = kvport_encode_hello(&b, &m->u.hello);
        break;
    case KVPORT_PIN: {
        const kvport_pin *p = &m->u.pin;
        int32_t *ids = malloc(((size_t)p->n + 1) * sizeof *ids);
        uint64_t *hs = malloc(((size_t)p->n + 1) * 2 * sizeof *hs);
        for (uint32_t i = 0; i < p->n; i++) {
            ids[i] = kvport_pin_id(p, i);
            kvport_pin_hash(p, i, &hs[2 * i], &hs[2 * i + 1]);
        }
        rc = kvport_encode_pin(&b, p->token, ids, hs, p->n);
        free(ids);
        free(hs);
        break;
    }
    case KVPORT_PIN_OK:
        rc = kvport_encode_pin_ok(&b, &m->u.pin_ok);
        break;
    case KVPORT_RELEASE:
        rc = kvport_encode_release(&b, &m->u.release);
        break;
    case KVPORT_RELEASE_OK:
        rc = kvport_encode_release_ok(&b);
        break;
    case KVPORT_RENEW:
        rc = kvport_encode_renew(&b, &m->u.renew);
        break;
    case KVPORT_RENEW_OK:
        rc = kvport_encode_renew_ok(&b, &m->u.renew_ok);
        break;
    case KVPORT_AUTH_INIT:
    case KVPORT_AUTH_CHALLENGE:
    case KVPORT_AUTH_PROOF:
    case KVPORT_AUTH_OK:
        rc = kvport_encode_auth(&b, m->type, &m->u.auth);
        break;
    default:
        check = 0;
        break;
    }
    if (check) {
        DX_ASSERT(rc == 0);
        DX_ASSERT(b.len == len && memcmp(b.data, frame, len) == 0);
    }
    dx_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    while (off < size) {
        kvport_hdr h;
        if (kvport_hdr_read(data + off, size - off, &h)) break;
        if (size - off - KVPORT_HDR_BYTES < h.length) break;
        /* copy the payload so ASan sees reads past its exact end */
        uint8_t *p = malloc(h.length ? h.length : 1);
        memcpy(p, data + off + KVPORT_HDR_BYTES, h.length);
        kvport_msg m;
        if (kvport_decode(&h, p, &m) == 0)
            roundtrip(&m, data + off, KVPORT_HDR_BYTES + (size_t)h.length);
        free(p);
        off += KVPORT_HDR_BYTES + h.length;
    }
    return 0;
}
