/* test_node_reg: the registration value nodes write and routers read
 * (node/node_reg.h) — a round trip, every bad field refused with a message
 * naming it, and the key prefix rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "http/node_reg.h"

static const node_reg_info k_info = {.url = "http://127.0.0.1:8101",
                                     .role = "decode",
                                     .kv = "127.0.0.1:9101",
                                     .model = "0123456789abcdef0123456789abcdef",
                                     .outstanding = 3,
                                     .free_kv_blocks = 2048,
                                     .draining = 1,
                                     .heartbeat_ms = 1000,
                                     .started_ms = 1796062644000ull};

static void test_round_trip(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(node_reg_format(&k_info, &b), 0);
    assert_string_equal(
        b.data, "{\"url\":\"http://127.0.0.1:8101\",\"role\":\"decode\",\"kv\":\"127.0.0.1:9101\","
                "\"model\":\"0123456789abcdef0123456789abcdef\",\"outstanding\":3,"
                "\"free_kv_blocks\":2048,\"draining\":true,\"heartbeat_ms\":1000,"
                "\"started_ms\":1796062644000}");
    node_reg_info o;
    assert_int_equal(node_reg_parse(b.data, b.len, &o), 0);
    assert_memory_equal(&o, &k_info, sizeof o);
    /* no KV port: null */
    node_reg_info n = k_info;
    n.kv[0] = 0;
    dx_buf_reset(&b);
    assert_int_equal(node_reg_format(&n, &b), 0);
    assert_non_null(strstr(b.data, "\"kv\":null"));
    assert_int_equal(node_reg_parse(b.data, b.len, &o), 0);
    assert_string_equal(o.kv, "");
    dx_buf_free(&b);
}

static void expect_bad(const char *json, const char *phrase)
{
    node_reg_info o;
    assert_int_equal(node_reg_parse(json, strlen(json), &o), DX_EFORMAT);
    if (!strstr(dx_errmsg(), phrase))
        fail_msg("'%s': message '%s' lacks '%s'", json, dx_errmsg(), phrase);
}

#define OK_REST                                                                                    \
    "\"model\":\"0123456789abcdef0123456789abcdef\",\"outstanding\":0,\"free_kv_blocks\":1,"       \
    "\"draining\":false,\"heartbeat_ms\":1000,\"started_ms\":1"

static void test_bad(void **state)
{
    (void)state;
    expect_bad("", "not a JSON object");
    expect_bad("[]", "not a JSON object");
    expect_bad("{\"url\":1}", "\"url\"");
    expect_bad("{\"url\":\"ftp://h:1\",\"role\":\"decode\",\"kv\":null," OK_REST "}", "\"url\"");
    expect_bad("{\"url\":\"http://h:1/x\",\"role\":\"decode\",\"kv\":null," OK_REST "}", "\"url\"");
    expect_bad("{\"url\":\"http://h:1\",\"role\":\"boss\",\"kv\":null," OK_REST "}", "\"role\"");
    expect_bad("{\"url\":\"http://h:1\",\"role\":\"decode\",\"kv\":7," OK_REST "}", "\"kv\"");
    expect_bad("{\"url\":\"http://h:1\",\"role\":\"decode\",\"kv\":null,"
               "\"model\":\"0123\",\"outstanding\":0,\"free_kv_blocks\":1,"
               "\"draining\":false,\"heartbeat_ms\":1000,\"started_ms\":1}",
               "\"model\"");
    expect_bad("{\"url\":\"http://h:1\",\"role\":\"decode\",\"kv\":null,"
               "\"model\":\"0123456789ABCDEF0123456789abcdef\",\"outstanding\":0,"
               "\"free_kv_blocks\":1,\"draining\":false,\"heartbeat_ms\":1000,\"started_ms\":1}",
               "\"model\"");
    expect_bad("{\"url\":\"http://h:1\",\"role\":\"decode\",\"kv\":null,"
               "\"model\":\"0123456789abcdef0123456789abcdef\",\"outstanding\":-1,"
               "\"free_kv_blocks\":1,\"draining\":false,\"heartbeat_ms\":1000,\"started_ms\":1}",
               "\"outstanding\"");
    expect_bad("{\"url\":\"http://h:1\",\"role\":\"decode\",\"kv\":null,"
               "\"model\":\"0123456789abcdef0123456789abcdef\",\"outstanding\":0,"
               "\"free_kv_blocks\":4294967296,\"draining\":false,\"heartbeat_ms\":1000,"
               "\"started_ms\":1}",
               "\"free_kv_blocks\"");
    expect_bad("{\"url\":\"http://h:1\",\"role\":\"decode\",\"kv\":null,"
               "\"model\":\"0123456789abcdef0123456789abcdef\",\"outstanding\":0,"
               "\"free_kv_blocks\":1,\"draining\":0,\"heartbeat_ms\":1000,\"started_ms\":1}",
               "\"draining\"");
    expect_bad("{\"url\":\"http://h:1\",\"url\":\"http://h:2\"}", "not a JSON object");
    char big[NODE_REG_VALUE_MAX + 8];
    memset(big, ' ', sizeof big);
    big[sizeof big - 1] = 0;
    expect_bad(big, "bytes >");
}

static void test_prefix_and_key(void **state)
{
    (void)state;
    char k[128];
    assert_int_equal(node_reg_check_prefix("duplex:", "--x"), 0);
    assert_int_equal(node_reg_check_prefix("prod/east:", "--x"), 0);
    static const char *const bad[] = {
        "",     "a*",
        "a?",   "a[b]",
        "a\\b", "a b",
        "a\tb", "0123456789012345678901234567890123456789012345678901234567890123456789"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(node_reg_check_prefix(bad[i], "--register-prefix"), DX_EINVAL);
        assert_non_null(strstr(dx_errmsg(), "--register-prefix"));
    }
    assert_int_equal(node_reg_key("duplex:", "http://127.0.0.1:8101", k, sizeof k), 0);
    assert_string_equal(k, "duplex:node:http://127.0.0.1:8101");
    assert_int_equal(node_reg_key("duplex:", "http://127.0.0.1:8101", k, 10), DX_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_prefix_and_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
