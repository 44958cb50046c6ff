/* test_router_store: the conversation map's interface — the Redis key and
 * value encoding (every malformed value refused), the config checks, and
 * the memory backend's compare-and-set, superseded keys and longest-key
 * lookups.  (The Redis backend runs against a real server in
 * tests/integration/itest_rstate.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/dx_err.h"
#include "router/router_store.h"
#include "../store_test.h"

static void test_key(void **state)
{
    (void)state;
    char k[128];
    router_key key = {.lo = 0xabcull, .hi = 0x1ull};
    router_store_key("duplex:", &key, k, sizeof k);
    assert_string_equal(k, "duplex:conv:00000000000000010000000000000abc");
}

static void test_encode_decode(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(router_store_encode("http://h:1", 42, "{\"a\":1}", 7, &b), 0);
    assert_string_equal(b.data, "42 http://h:1\n{\"a\":1}");
    router_store_val v;
    assert_int_equal(router_store_decode(b.data, b.len, &v), 0);
    assert_int_equal(v.num_tokens, 42);
    assert_int_equal(v.url_len, 10);
    assert_memory_equal(v.url, "http://h:1", 10);
    assert_int_equal(v.params_len, 7);
    assert_memory_equal(v.params, "{\"a\":1}", 7);
    /* affinity only: no params, no tokens */
    dx_buf_reset(&b);
    assert_int_equal(router_store_encode("http://h:1", 42, NULL, 0, &b), 0);
    assert_string_equal(b.data, "0 http://h:1\n");
    assert_int_equal(router_store_decode(b.data, b.len, &v), 0);
    assert_null(v.params);
    assert_int_equal(v.num_tokens, 0);
    dx_buf_free(&b);
    static const char *const bad[] = {"",
                                      "x http://h\n{}",
                                      "12",
                                      "12 ",
                                      "12 http://h",
                                      "12 \n{}",
                                      "4294967296 http://h\n",
                                      " 1 http://h\n",
                                      "1\thttp://h\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(router_store_decode(bad[i], strlen(bad[i]), &v), DX_EFORMAT);
}

static void test_config(void **state)
{
    (void)state;
    router_store *s;
    router_store_config c = {.prefix = "a b"};
    assert_int_equal(router_store_create(&c, &s), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "--state-prefix"));
    c = (router_store_config){.timeout_ms = 60001};
    assert_int_equal(router_store_create(&c, &s), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "--state-timeout-ms"));
    c = (router_store_config){.url = "redis://h:0"};
    assert_int_equal(router_store_create(&c, &s), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "--state"));
    char longp[80];
    memset(longp, 'p', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    assert_int_equal(router_store_check_prefix(longp), DX_EINVAL);
    assert_int_equal(router_store_check_prefix("duplex:"), 0);
}

static st_got get(router_store *s, const router_key *k, size_t n)
{
    st_got g = {0};
    router_store_op *op = (router_store_op *)1;
    router_store_get(s, k, n, st_on_got, &g, &op);
    assert_int_equal(g.calls, 1); /* answered before it returns */
    assert_null(op);
    return g;
}

static void test_memory(void **state)
{
    (void)state;
    router_store *s;
    router_store_config c = {0};
    assert_int_equal(router_store_create(&c, &s), 0);
    assert_false(router_store_is_shared(s));
    router_key a = {1, 2}, b = {3, 4}, none = {5, 6};
    assert_false(get(s, &a, 1).found);
    /* out of order: the later turn (more tokens) stays; a tie is written */
    router_store_put(s, &a, NULL, 3, "{\"t\":2}", 7, 20, 60);
    router_store_put(s, &a, NULL, 4, "{\"t\":1}", 7, 10, 60);
    st_got g = get(s, &a, 1);
    assert_int_equal(g.node, 3);
    assert_string_equal(g.params, "{\"t\":2}");
    router_store_put(s, &a, NULL, 4, "{\"t\":3}", 7, 20, 60);
    assert_string_equal(get(s, &a, 1).params, "{\"t\":3}");
    /* the longest key found wins; a superseding entry drops its prefix's */
    router_key ks[] = {none, a, b};
    assert_int_equal(get(s, ks, 3).which, 1);
    router_store_put(s, &b, &a, 5, NULL, 0, 0, 60);
    g = get(s, ks, 3);
    assert_int_equal(g.which, 2);
    assert_int_equal(g.node, 5);
    assert_false(get(s, &a, 1).found);
    /* expired: gone */
    router_store_put(s, &none, NULL, 1, "{}", 2, 1, -1);
    assert_false(get(s, &none, 1).found);
    dx_buf m;
    dx_buf_init(&m, 0);
    assert_int_equal(router_store_metrics(s, &m), 0);
    assert_non_null(strstr(m.data, "duplex_router_state_stale_writes_total 1\n"));
    assert_non_null(strstr(m.data, "duplex_router_conversations 1\n"));
    assert_int_equal(router_store_errors(s, "get"), 0);
    dx_buf_free(&m);
    router_store_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key),
        cmocka_unit_test(test_encode_decode),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
