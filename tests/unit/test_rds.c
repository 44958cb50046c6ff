/* test_rds: the redis:// URLs `duplex router --state` and `duplex serve
 * --register` accept, and every other shape refused with a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/dx_err.h"
#include "http/rds.h"

static void test_good(void **state)
{
    (void)state;
    rds_url u;
    char s[512];
    assert_int_equal(rds_url_parse("redis://127.0.0.1", &u), 0);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 6379);
    assert_int_equal(u.db, 0);
    assert_int_equal(rds_url_parse("redis://localhost:7000/3", &u), 0);
    assert_string_equal(u.host, "localhost");
    assert_int_equal(u.port, 7000);
    assert_int_equal(u.db, 3);
    assert_int_equal(rds_url_parse("redis://[::1]:6380/", &u), 0);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 6380);
    rds_url_format(&u, s, sizeof s);
    assert_string_equal(s, "redis://[::1]:6380/0");
    assert_int_equal(rds_url_parse("redis://:pw@h:1/15", &u), 0);
    assert_string_equal(u.password, "pw");
    assert_string_equal(u.user, "");
    assert_int_equal(u.db, 15);
    rds_url_format(&u, s, sizeof s);
    assert_null(strstr(s, "pw")); /* never in logs */
    assert_int_equal(rds_url_parse("redis://bob:pw@h", &u), 0);
    assert_string_equal(u.user, "bob");
}

static void test_bad(void **state)
{
    (void)state;
    static const char *const bad[][2] = {
        {"http://h:1", "redis://"},       {"redis://", "no host"},
        {"redis://:1", "no host"},        {"redis://h:0", "port"},
        {"redis://h:65536", "port"},      {"redis://h:01", "port"},
        {"redis://h:x", "port"},          {"redis://h/16", "database"},
        {"redis://h/-1", "database"},     {"redis://h/1x", "database"},
        {"redis://[::1", "']'"},          {"redis://[::1]x", "':'"},
        {"redis://pw@h", "PASSWORD@"},    {"redis://u:@h", "empty password"},
        {"redis://h h:1", "in the host"}, {"redis://a?b:1", "in the host"},
    };
    rds_url u;
    for (size_t i = 0; i < DX_ARRAY_LEN(bad); i++) {
        assert_int_equal(rds_url_parse(bad[i][0], &u), DX_EINVAL);
        if (!strstr(dx_errmsg(), bad[i][1])) fail_msg("%s: %s", bad[i][0], dx_errmsg());
    }
    assert_int_equal(rds_url_parse(NULL, &u), DX_EINVAL);
}

/* Nothing listens on port 1 of loopback: a clear error, not a hang. */
static void test_connect_refused(void **state)
{
    (void)state;
    rds_url u;
    redisContext *c = (redisContext *)1;
    assert_int_equal(rds_url_parse("redis://127.0.0.1:1", &u), 0);
    assert_int_equal(rds_connect(&u, 1000, &c), DX_EIO);
    assert_null(c);
    assert_non_null(strstr(dx_errmsg(), "redis://127.0.0.1:1/0: connect failed"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_connect_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
