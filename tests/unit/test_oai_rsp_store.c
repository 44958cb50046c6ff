/* Unit tests for src/oai/oai_rsp_store: stored responses per tenant —
 * the conversation and the object come back as stored, another tenant's id
 * is not found, the TTL runs from the last use, DELETE forgets, the bound
 * evicts the least recently used, the encoding round-trips and rejects
 * what it did not write. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "oai/oai_req.h"
#include "oai/oai_rsp.h"
#include "oai/oai_rsp_store.h"

static const char k_conv[] = "[{\"role\":\"user\",\"content\":\"hi\"},"
                             "{\"role\":\"assistant\",\"content\":\"hello\"}]";
static const char k_obj[] = "{\"id\":\"resp_1\",\"object\":\"response\"}";

static json_t *conv(void)
{
    json_error_t je;
    json_t *v = json_loads(k_conv, 0, &je);
    assert_non_null(v);
    return v;
}

static void test_put_get_tenants(void **state)
{
    (void)state;
    oai_rsp_store *s;
    oai_rsp_store_config c = {.ttl_s = 100, .max_bytes = 1 << 20};
    assert_int_equal(oai_rsp_store_create(&c, &s), 0);
    uint8_t t1[OAI_RSP_STORE_TENANT], t2[OAI_RSP_STORE_TENANT];
    memset(t1, 1, sizeof t1);
    memset(t2, 2, sizeof t2);
    json_t *m = conv();
    assert_int_equal(oai_rsp_store_put(s, t1, "resp_1", m, k_obj, strlen(k_obj), 0), 0);
    json_t *got;
    assert_int_equal(oai_rsp_store_messages(s, t1, "resp_1", 1, &got), 1);
    assert_true(json_equal(got, m));
    json_decref(got);
    char *obj;
    size_t len;
    assert_int_equal(oai_rsp_store_response(s, t1, "resp_1", 1, &obj, &len), 1);
    assert_int_equal(len, strlen(k_obj));
    assert_string_equal(obj, k_obj);
    dx_free(obj);
    /* another tenant, the shared one, another id: not found */
    assert_int_equal(oai_rsp_store_messages(s, t2, "resp_1", 1, &got), 0);
    assert_null(got);
    assert_int_equal(oai_rsp_store_messages(s, NULL, "resp_1", 1, &got), 0);
    assert_int_equal(oai_rsp_store_response(s, t1, "resp_2", 1, &obj, &len), 0);
    assert_null(obj);
    /* an id of OAI_RSP_MAX_ID bytes is kept whole; a longer one beginning
     * with it is another id, never found, and cannot be stored */
    char full[OAI_RSP_MAX_ID + 1], over[OAI_RSP_MAX_ID + 2];
    memset(full, 'a', OAI_RSP_MAX_ID);
    full[OAI_RSP_MAX_ID] = 0;
    snprintf(over, sizeof over, "%sb", full);
    assert_int_equal(oai_rsp_store_put(s, t1, full, m, k_obj, strlen(k_obj), 0), 0);
    assert_int_equal(oai_rsp_store_response(s, t1, full, 1, &obj, &len), 1);
    dx_free(obj);
    assert_int_equal(oai_rsp_store_response(s, t1, over, 1, &obj, &len), 0);
    assert_null(obj);
    assert_int_equal(oai_rsp_store_delete(s, t1, over), 0);
    assert_int_equal(oai_rsp_store_put(s, t1, over, m, k_obj, strlen(k_obj), 0), DX_EINVAL);
    assert_int_equal(oai_rsp_store_delete(s, t1, full), 1);
    /* DELETE: gone, and only for its tenant */
    assert_int_equal(oai_rsp_store_delete(s, t2, "resp_1"), 0);
    assert_int_equal(oai_rsp_store_delete(s, t1, "resp_1"), 1);
    assert_int_equal(oai_rsp_store_messages(s, t1, "resp_1", 1, &got), 0);
    json_decref(m);
    oai_rsp_store_destroy(s);
}

static void test_ttl_and_bound(void **state)
{
    (void)state;
    oai_rsp_store *s;
    oai_rsp_store_config c = {.ttl_s = 10, .max_bytes = 1024};
    assert_int_equal(oai_rsp_store_create(&c, &s), 0);
    json_t *m = conv(), *got;
    assert_int_equal(oai_rsp_store_put(s, NULL, "a", m, k_obj, strlen(k_obj), 0), 0);
    assert_int_equal(oai_rsp_store_put(s, NULL, "b", m, k_obj, strlen(k_obj), 0), 0);
    /* a continuation refreshes a; b expires on its own */
    assert_int_equal(oai_rsp_store_messages(s, NULL, "a", 8, &got), 1);
    json_decref(got);
    assert_int_equal(oai_rsp_store_messages(s, NULL, "b", 10, &got), 0);
    assert_int_equal(oai_rsp_store_messages(s, NULL, "a", 17, &got), 1);
    json_decref(got);
    /* the bound: the least recently used goes first */
    char id[16];
    for (int i = 0; i < 20; i++) {
        snprintf(id, sizeof id, "r%d", i);
        assert_int_equal(oai_rsp_store_put(s, NULL, id, m, k_obj, strlen(k_obj), 20), 0);
    }
    oai_rsp_store_stats st;
    oai_rsp_store_get_stats(s, &st);
    assert_true(st.bytes <= 1024);
    assert_true(st.evicted > 0);
    assert_int_equal(oai_rsp_store_messages(s, NULL, "r19", 20, &got), 1);
    json_decref(got);
    assert_int_equal(oai_rsp_store_messages(s, NULL, "r0", 20, &got), 0);
    /* one entry over the bound alone */
    static char big[2048];
    memset(big, 'x', sizeof big);
    assert_int_equal(oai_rsp_store_put(s, NULL, "big", m, big, sizeof big, 21), DX_ETOOBIG);
    json_decref(m);
    oai_rsp_store_destroy(s);
    oai_rsp_store_config bad = {.ttl_s = 0, .max_bytes = 1};
    assert_int_equal(oai_rsp_store_create(&bad, &s), DX_EINVAL);
}

static void test_encoding(void **state)
{
    (void)state;
    json_t *m = conv();
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(oai_rsp_store_encode(m, k_obj, strlen(k_obj), &b), 0);
    const char *mp, *rp;
    size_t ml, rl;
    assert_int_equal(oai_rsp_store_decode(b.data, b.len, &mp, &ml, &rp, &rl), 0);
    assert_int_equal(ml, strlen(k_conv));
    assert_memory_equal(mp, k_conv, ml);
    assert_int_equal(rl, strlen(k_obj));
    assert_memory_equal(rp, k_obj, rl);
    /* what it did not write: too short, a length past the end */
    assert_int_equal(oai_rsp_store_decode(b.data, 3, &mp, &ml, &rp, &rl), DX_EFORMAT);
    assert_int_equal(oai_rsp_store_decode(b.data, 4 + ml - 1, &mp, &ml, &rp, &rl), DX_EFORMAT);
    dx_buf_free(&b);
    json_decref(m);
}

/* Preparation threads read while the loop writes. */
static void *reader(void *arg)
{
    oai_rsp_store *s = arg;
    for (int i = 0; i < 2000; i++) {
        json_t *got;
        if (oai_rsp_store_messages(s, NULL, "shared", 1, &got) == 1) {
            assert_true(json_array_size(got) == 2);
            json_decref(got);
        }
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    oai_rsp_store *s;
    oai_rsp_store_config c = {.ttl_s = 100, .max_bytes = 1 << 20};
    assert_int_equal(oai_rsp_store_create(&c, &s), 0);
    json_t *m = conv();
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, reader, s);
    for (int i = 0; i < 2000; i++)
        assert_int_equal(oai_rsp_store_put(s, NULL, "shared", m, k_obj, strlen(k_obj), 1), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    json_decref(m);
    oai_rsp_store_destroy(s);
}

int main(void)
{
    oai_json_use_dx_alloc();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_tenants),
        cmocka_unit_test(test_ttl_and_bound),
        cmocka_unit_test(test_encoding),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
