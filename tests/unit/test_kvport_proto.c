/* test_kvport_proto: KV-port frames round-trip; every truncation, wrong
 * magic/version (a version-1 peer included), oversized length, hostile count
 * and trailing byte is refused with the right code, for every frame type;
 * the fuzz seed corpus is written from here when DUPLEX_WRITE_CORPUS names a
 * directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "xfer/kvport_proto.h"

static int decode(const dx_buf *b, kvport_msg *m)
{
    kvport_hdr h;
    int rc = kvport_hdr_read((const uint8_t *)b->data, b->len, &h);
    if (rc) return rc;
    if (b->len != KVPORT_HDR_BYTES + h.length) return DX_EAGAIN;
    return kvport_decode(&h, (const uint8_t *)b->data + KVPORT_HDR_BYTES, m);
}

static kvport_hello sample_hello(void)
{
    static const uint8_t addr[] = {1, 2, 3, 4, 5, 6, 7}, rkey[] = {9, 8, 7};
    kvport_hello h = {.engine_id = {(const uint8_t *)"node-a", 6},
                      .instance = 0x1122334455667788ull,
                      .n_layer = 28,
                      .n_kv_head = 8,
                      .head_dim = 128,
                      .dtype = 1,
                      .block_size = 16,
                      .n_blocks = 512,
                      .block_bytes = 1835008,
                      .transports = {(const uint8_t *)"ucx", 3},
                      .worker_addr = {addr, sizeof addr},
                      .rkey = {rkey, sizeof rkey},
                      .base_addr = 0x7f0000001000ull};
    for (int i = 0; i < 16; i++) h.fingerprint[i] = (uint8_t)(i * 17);
    return h;
}

static void set_len(dx_buf *b, uint32_t len)
{
    memcpy(b->data + 8, &len, 4);
}

/* A well-formed frame cut anywhere inside its payload (the header's length
 * following the cut) is a format error, never a read past the end; so is
 * one more byte than its fields need. */
static void check_cuts_and_trailing(const dx_buf *frame)
{
    kvport_msg m;
    for (size_t cut = KVPORT_HDR_BYTES; cut < frame->len; cut++) {
        dx_buf t;
        dx_buf_init(&t, 0);
        dx_buf_append(&t, frame->data, cut);
        set_len(&t, (uint32_t)(cut - KVPORT_HDR_BYTES));
        int rc = decode(&t, &m);
        if (rc != DX_EFORMAT)
            fail_msg("%s cut to %zu of %zu bytes: got %d, want DX_EFORMAT",
                     kvport_type_name((uint8_t)frame->data[6]), cut, frame->len, rc);
        dx_buf_free(&t);
    }
    dx_buf t;
    dx_buf_init(&t, 0);
    dx_buf_append(&t, frame->data, frame->len);
    dx_buf_putc(&t, 0);
    set_len(&t, (uint32_t)(t.len - KVPORT_HDR_BYTES));
    assert_int_equal(decode(&t, &m), DX_EFORMAT);
    assert_non_null(strstr(dx_errmsg(), "trailing"));
    dx_buf_free(&t);
}

static void dump(const char *name, const dx_buf *b)
{
    const char *dir = getenv("DUPLEX_WRITE_CORPUS");
    if (!dir) return;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(b->data, 1, b->len, f);
        fclose(f);
    }
}

static void test_hello_roundtrip(void **state)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_hello h = sample_hello();
    assert_int_equal(kvport_encode_hello(&b, &h), 0);
    dump("hello", &b);
    kvport_msg m;
    assert_int_equal(decode(&b, &m), 0);
    assert_int_equal(m.type, KVPORT_HELLO);
    const kvport_hello *d = &m.u.hello;
    assert_int_equal(d->engine_id.n, 6);
    assert_memory_equal(d->engine_id.p, "node-a", 6);
    assert_memory_equal(d->fingerprint, h.fingerprint, 16);
    assert_true(d->instance == h.instance && d->base_addr == h.base_addr);
    assert_int_equal(d->block_bytes, 1835008);
    assert_int_equal(d->n_blocks, 512);
    assert_int_equal(d->worker_addr.n, 7);
    assert_memory_equal(d->rkey.p, h.rkey.p, 3);
    assert_int_equal(kvport_hello_compatible(&h, d), 0);
    kvport_hello other = h;
    other.head_dim = 64;
    assert_int_equal(kvport_hello_compatible(&h, &other), DX_ELAYOUT);
    assert_non_null(strstr(dx_errmsg(), "head_dim"));
    /* the same model with a q8_0 KV cache: a layout of its own, named */
    other = h;
    other.dtype = DX_Q8_0;
    other.block_bytes = h.block_bytes / 32 * 17;
    assert_int_equal(kvport_hello_compatible(&h, &other), DX_ELAYOUT);
    assert_non_null(strstr(dx_errmsg(), "the KV dtype is f16 here, q8_0 on the peer"));
    other = h;
    other.block_size = 32;
    assert_int_equal(kvport_hello_compatible(&h, &other), DX_ELAYOUT);
    assert_non_null(strstr(dx_errmsg(), "block_size"));
    other = h;
    other.fingerprint[3] ^= 1;
    assert_int_equal(kvport_hello_compatible(&h, &other), DX_EMISMATCH);
    assert_non_null(strstr(dx_errmsg(), "fingerprint"));
    check_cuts_and_trailing(&b);
    /* a hostile string length: engine_id claims 64 KiB in a short frame */
    b.data[KVPORT_HDR_BYTES] = 0xff;
    b.data[KVPORT_HDR_BYTES + 1] = 0xff;
    assert_int_equal(decode(&b, &m), DX_EFORMAT);
    assert_non_null(strstr(dx_errmsg(), "engine_id"));
    dx_buf_free(&b);
}

static void test_pin_roundtrip(void **state)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    uint8_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (uint8_t)(0xa0 + i);
    int32_t ids[3] = {5, 6, 900};
    uint64_t hs[6] = {1, 2, 3, 4, 0xffffffffffffffffull, 6};
    assert_int_equal(kvport_encode_pin(&b, tok, ids, hs, 3), 0);
    dump("pin", &b);
    kvport_msg m;
    assert_int_equal(decode(&b, &m), 0);
    assert_int_equal(m.u.pin.n, 3);
    assert_memory_equal(m.u.pin.token, tok, 16);
    for (uint32_t i = 0; i < 3; i++) {
        uint64_t lo, hi;
        assert_int_equal(kvport_pin_id(&m.u.pin, i), ids[i]);
        kvport_pin_hash(&m.u.pin, i, &lo, &hi);
        assert_true(lo == hs[2 * i] && hi == hs[2 * i + 1]);
    }
    check_cuts_and_trailing(&b);
    /* hostile count: says 2^31 blocks in a 44-byte payload */
    uint32_t big = 0x80000000u;
    memcpy(b.data + KVPORT_HDR_BYTES + 16, &big, 4);
    assert_int_equal(decode(&b, &m), DX_EFORMAT);
    big = 4; /* one more than present */
    memcpy(b.data + KVPORT_HDR_BYTES + 16, &big, 4);
    assert_int_equal(decode(&b, &m), DX_EFORMAT);
    dx_buf_free(&b);
}

static void test_small_frames(void **state)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_msg m;
    kvport_pin_ok ok = {42, 7, 99, 30000};
    assert_int_equal(kvport_encode_pin_ok(&b, &ok), 0);
    dump("pin_ok", &b);
    assert_int_equal(b.len, KVPORT_HDR_BYTES + 24);
    assert_int_equal(decode(&b, &m), 0);
    assert_true(m.u.pin_ok.pin_id == 42 && m.u.pin_ok.n_matched == 7 && m.u.pin_ok.instance == 99);
    assert_int_equal(m.u.pin_ok.ttl_ms, 30000);
    check_cuts_and_trailing(&b);
    dx_buf_reset(&b);
    kvport_release rel = {42, 1};
    assert_int_equal(kvport_encode_release(&b, &rel), 0);
    dump("release", &b);
    assert_int_equal(decode(&b, &m), 0);
    assert_true(m.u.release.pin_id == 42 && m.u.release.consumed == 1);
    check_cuts_and_trailing(&b);
    dx_buf_reset(&b);
    assert_int_equal(kvport_encode_release_ok(&b), 0);
    dump("release_ok", &b);
    assert_int_equal(b.len, KVPORT_HDR_BYTES);
    assert_int_equal(decode(&b, &m), 0);
    assert_int_equal(m.type, KVPORT_RELEASE_OK);
    check_cuts_and_trailing(&b);
    dx_buf_reset(&b);
    assert_int_equal(kvport_encode_error(&b, KVPORT_GONE, DX_EGONE, "lease expired"), 0);
    dump("gone", &b);
    assert_int_equal(decode(&b, &m), 0);
    assert_int_equal(m.type, KVPORT_GONE);
    assert_int_equal(m.u.error.code, DX_EGONE);
    assert_memory_equal(m.u.error.message.p, "lease expired", 13);
    check_cuts_and_trailing(&b);
    assert_int_equal(kvport_encode_error(&b, KVPORT_HELLO, 0, "x"), DX_EINVAL);
    dx_buf_free(&b);
}

static void test_renew_frames(void **state)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_msg m;
    kvport_renew rn = {0x0102030405060708ull};
    assert_int_equal(kvport_encode_renew(&b, &rn), 0);
    dump("renew", &b);
    assert_int_equal(b.len, KVPORT_HDR_BYTES + 8);
    assert_int_equal(decode(&b, &m), 0);
    assert_int_equal(m.type, KVPORT_RENEW);
    assert_true(m.u.renew.pin_id == rn.pin_id);
    assert_string_equal(kvport_type_name(m.type), "RENEW");
    check_cuts_and_trailing(&b);
    dx_buf_reset(&b);
    kvport_renew_ok ro = {UINT32_MAX};
    assert_int_equal(kvport_encode_renew_ok(&b, &ro), 0);
    dump("renew_ok", &b);
    assert_int_equal(b.len, KVPORT_HDR_BYTES + 4);
    assert_int_equal(decode(&b, &m), 0);
    assert_int_equal(m.type, KVPORT_RENEW_OK);
    assert_int_equal(m.u.renew_ok.ttl_ms, UINT32_MAX);
    assert_string_equal(kvport_type_name(m.type), "RENEW_OK");
    check_cuts_and_trailing(&b);
    /* hostile length: a RENEW_OK that claims the maximal payload but brings
     * 4 bytes is incomplete (not decodable yet), and one over the maximum is
     * refused at the header */
    kvport_hdr h;
    set_len(&b, KVPORT_MAX_PAYLOAD);
    assert_int_equal(kvport_hdr_read((const uint8_t *)b.data, b.len, &h), 0);
    assert_true(b.len < KVPORT_HDR_BYTES + h.length);
    set_len(&b, KVPORT_MAX_PAYLOAD + 1);
    assert_int_equal(kvport_hdr_read((const uint8_t *)b.data, b.len, &h), DX_ETOOBIG);
    assert_non_null(strstr(dx_errmsg(), "RENEW_OK"));
    dx_buf_free(&b);
}

/* The handshake's frames: fixed-size nonces and proofs; every cut and a
 * trailing byte are format errors; the encoder refuses other types. */
static void test_auth_frames(void **state)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_auth_msg a;
    for (unsigned i = 0; i < KVPORT_NONCE_BYTES; i++) a.nonce[i] = (uint8_t)(i + 1);
    for (unsigned i = 0; i < KVPORT_PROOF_BYTES; i++) a.proof[i] = (uint8_t)(0xf0 - i);
    static const struct {
        uint16_t type;
        size_t payload;
        const char *name;
    } k[] = {{KVPORT_AUTH_INIT, KVPORT_NONCE_BYTES, "auth_init"},
             {KVPORT_AUTH_CHALLENGE, KVPORT_NONCE_BYTES + KVPORT_PROOF_BYTES, "auth_challenge"},
             {KVPORT_AUTH_PROOF, KVPORT_PROOF_BYTES, "auth_proof"},
             {KVPORT_AUTH_OK, 0, "auth_ok"}};
    for (size_t i = 0; i < DX_ARRAY_LEN(k); i++) {
        dx_buf_reset(&b);
        assert_int_equal(kvport_encode_auth(&b, k[i].type, &a), 0);
        dump(k[i].name, &b);
        assert_int_equal(b.len, KVPORT_HDR_BYTES + k[i].payload);
        assert_true(k[i].payload <= KVPORT_MAX_AUTH_PAYLOAD);
        kvport_msg m;
        assert_int_equal(decode(&b, &m), 0);
        assert_int_equal(m.type, k[i].type);
        if (k[i].type == KVPORT_AUTH_INIT || k[i].type == KVPORT_AUTH_CHALLENGE)
            assert_memory_equal(m.u.auth.nonce, a.nonce, KVPORT_NONCE_BYTES);
        if (k[i].type == KVPORT_AUTH_CHALLENGE || k[i].type == KVPORT_AUTH_PROOF)
            assert_memory_equal(m.u.auth.proof, a.proof, KVPORT_PROOF_BYTES);
        check_cuts_and_trailing(&b);
    }
    assert_string_equal(kvport_type_name(KVPORT_AUTH_CHALLENGE), "AUTH_CHALLENGE");
    assert_int_equal(kvport_encode_auth(&b, KVPORT_HELLO, &a), DX_EINVAL);
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_PROOF, NULL), DX_EINVAL);
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_OK, NULL), 0);
    dx_buf_free(&b);
}

/* A version-1 peer's frames (PIN_OK without ttl_ms) are refused at the
 * header with the version in the message, before any field is read; so are
 * a version-3 peer's (it does not authenticate). */
static void test_version1_peer(void **state)
{
    uint8_t v1_pin_ok[12 + 20] = {0x44, 0x58, 0x4b, 0x56, 1, 0, KVPORT_PIN_OK, 0, 20, 0, 0, 0, 42};
    kvport_hdr h;
    assert_int_equal(kvport_hdr_read(v1_pin_ok, sizeof v1_pin_ok, &h), DX_EUNSUPPORTED);
    assert_non_null(strstr(dx_errmsg(), "version 1"));
    char speaks[32];
    snprintf(speaks, sizeof speaks, "speaks %d", KVPORT_VERSION);
    assert_non_null(strstr(dx_errmsg(), speaks));
    uint8_t v3_hello[12] = {0x44, 0x58, 0x4b, 0x56, 3, 0, KVPORT_HELLO, 0, 0, 0, 0, 0};
    assert_int_equal(kvport_hdr_read(v3_hello, sizeof v3_hello, &h), DX_EUNSUPPORTED);
    assert_non_null(strstr(dx_errmsg(), "version 3"));
    /* the same 20-byte payload under this version's header is one field short */
    v1_pin_ok[4] = KVPORT_VERSION;
    kvport_msg m;
    assert_int_equal(kvport_hdr_read(v1_pin_ok, sizeof v1_pin_ok, &h), 0);
    assert_int_equal(kvport_decode(&h, v1_pin_ok + KVPORT_HDR_BYTES, &m), DX_EFORMAT);
    assert_non_null(strstr(dx_errmsg(), "ttl_ms"));
}

static void test_bad_headers(void **state)
{
    kvport_hdr h;
    uint8_t f[12] = {0x44, 0x58, 0x4b, 0x56, KVPORT_VERSION, 0, KVPORT_PIN, 0, 0, 0, 0, 0};
    for (size_t n = 0; n < 12; n++) assert_int_equal(kvport_hdr_read(f, n, &h), DX_EAGAIN);
    assert_int_equal(kvport_hdr_read(f, 12, &h), 0);
    f[0] = 'X';
    assert_int_equal(kvport_hdr_read(f, 12, &h), DX_EPROTO);
    f[0] = 0x44;
    f[4] = KVPORT_VERSION + 1;
    assert_int_equal(kvport_hdr_read(f, 12, &h), DX_EUNSUPPORTED);
    f[4] = KVPORT_VERSION;
    f[11] = 0x7f; /* 2 GiB payload */
    assert_int_equal(kvport_hdr_read(f, 12, &h), DX_ETOOBIG);
    f[11] = 0;
    f[6] = 77; /* unknown type */
    kvport_msg m;
    assert_int_equal(kvport_hdr_read(f, 12, &h), 0);
    assert_int_equal(kvport_decode(&h, f + 12, &m), DX_EUNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_roundtrip), cmocka_unit_test(test_pin_roundtrip),
        cmocka_unit_test(test_small_frames),    cmocka_unit_test(test_renew_frames),
        cmocka_unit_test(test_version1_peer),   cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_auth_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
