/* test_node_reg: the registration value nodes write and routers read
 * (node/node_reg.h) — a round trip, every bad field refused with a message
 * naming it, the key prefix rules, and the node's costs it carries
 * (http/node_load.h). */
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

/* The node's costs and queue (http/node_load.h) ride in the value: a round
 * trip keeps every figure exactly; a value without them is read as before;
 * a bad member is refused naming it; --fixed-costs' subset parses. */
static void test_load(void **state)
{
    (void)state;
    node_reg_info ni = k_info;
    node_load *l = &ni.load;
    *l = (node_load){.has = 1,
                     .samples = 412,
                     .step_s = 0.004,
                     .prefill_tok_s = 2e-4,
                     .prefill_key_s = 1.25e-8,
                     .decode_tok_s = 3e-4,
                     .decode_key_s = 1.1e-8,
                     .itl_s = 0.012,
                     .itl_prefill_s = 0.045,
                     .running = 3,
                     .prefill_pending = 77,
                     .batch_tokens = 512,
                     .kv_token_bytes = 16384,
                     .kv = "127.0.0.1:9201",
                     .pull_setup_s = 0.001,
                     .pull_byte_s = 1e-9,
                     .n_peers = 2};
    l->peers[0] = (node_load_peer){.kv = "127.0.0.1:9101",
                                   .transport = "default",
                                   .samples = 5,
                                   .setup_s = 3e-4,
                                   .byte_s = 5e-11};
    l->peers[1] = (node_load_peer){
        .kv = "10.0.0.2:9100", .transport = "tcp", .samples = 1, .setup_s = 0.02, .byte_s = 8e-9};
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(node_reg_format(&ni, &b), 0);
    assert_non_null(strstr(b.data, "\"load\":{\"v\":1,"));
    node_reg_info o;
    assert_int_equal(node_reg_parse(b.data, b.len, &o), 0);
    assert_memory_equal(&o, &ni, sizeof o);
    assert_ptr_equal(node_load_peer_of(&o.load, "10.0.0.2:9100"), &o.load.peers[1]);
    assert_null(node_load_peer_of(&o.load, "10.0.0.3:9100"));
    /* a bad member, named */
    char *at = strstr(b.data, "\"running\":3");
    memcpy(at, "\"running\":-", 11);
    assert_int_equal(node_reg_parse(b.data, b.len, &o), DX_EFORMAT);
    dx_buf_free(&b);
    node_load x;
    assert_int_equal(node_load_parse("{\"step_s\":\"x\"}", 14, &x), DX_EFORMAT);
    assert_non_null(strstr(dx_errmsg(), "\"step_s\""));
    const char *peers9 = "{\"peers\":[{},{},{},{},{},{},{},{},{}]}";
    assert_int_equal(node_load_parse(peers9, strlen(peers9), &x), DX_EFORMAT);
    assert_non_null(strstr(dx_errmsg(), "\"peers\""));
    assert_int_equal(node_load_parse("{\"itl_s\":1e300}", 15, &x), DX_EFORMAT);
    /* --fixed-costs: any subset, unknown members ignored */
    const char *fixed = "{\"prefill_tok_s\":0.001,\"pull\":{\"setup_s\":0.005},\"later\":true}";
    assert_int_equal(node_load_parse(fixed, strlen(fixed), &x), 0);
    assert_true(x.has && x.prefill_tok_s == 0.001 && x.pull_setup_s == 0.005 && x.step_s == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_prefix_and_key),
        cmocka_unit_test(test_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
