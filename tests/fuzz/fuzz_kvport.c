/* fuzz_kvport: feeds arbitrary bytes to the KV-port frame parser as a stream
 * of frames, and re-encodes whatever decodes to check it round-trips. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "xfer/kvport_proto.h"

static void roundtrip(const kvport_msg *m)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    int rc = 0;
    switch (m->type) {
    case KVPORT_HELLO:
        rc = kvport_encode_hello(&b, &m->u.hello);
        break;
    case KVPORT_PIN_OK:
        rc = kvport_encode_pin_ok(&b, &m->u.pin_ok);
        break;
    case KVPORT_RELEASE:
        rc = kvport_encode_release(&b, &m->u.release);
        break;
    default:
        break;
    }
    if (rc == 0 && b.len) {
        kvport_hdr h;
        kvport_msg m2;
        DX_ASSERT(kvport_hdr_read((const uint8_t *)b.data, b.len, &h) == 0);
        DX_ASSERT(kvport_decode(&h, (const uint8_t *)b.data + KVPORT_HDR_BYTES, &m2) == 0);
        DX_ASSERT(m2.type == m->type);
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
        if (kvport_decode(&h, p, &m) == 0) {
            roundtrip(&m);
            if (m.type == KVPORT_PIN)
                for (uint32_t i = 0; i < m.u.pin.n; i++) {
                    uint64_t lo, hi;
                    (void)kvport_pin_id(&m.u.pin, i);
                    kvport_pin_hash(&m.u.pin, i, &lo, &hi);
                }
        }
        free(p);
        off += KVPORT_HDR_BYTES + h.length;
    }
    return 0;
}
