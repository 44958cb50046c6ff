/* test_xfer_peers: the KV-peer allow-list.  Without a list, loopback only
 * (127.0.0.0/8 and ::1, any port); entries HOST, HOST:PORT, [V6]:PORT and
 * ADDR/BITS admit exactly what they name (IPv4 also through IPv4-mapped
 * IPv6); entries added later count; bad entries are refused naming them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cmocka.h>

#include "base/dx_err.h"
#include "xfer/xfer_peers.h"

/* Whether p admits ip (v4 or v6 literal) at port. */
static int ok(xfer_peers *p, const char *ip, int port)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    if (strchr(ip, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        assert_int_equal(inet_pton(AF_INET6, ip, &a->sin6_addr), 1);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        assert_int_equal(inet_pton(AF_INET, ip, &a->sin_addr), 1);
    }
    return xfer_peers_allowed(p, (struct sockaddr *)&ss);
}

static void test_default_loopback(void **state)
{
    xfer_peers *p;
    assert_int_equal(xfer_peers_create(NULL, &p), 0);
    assert_string_equal(xfer_peers_describe(p), "loopback");
    assert_true(ok(p, "127.0.0.1", 5000) && ok(p, "127.9.9.9", 1) && ok(p, "::1", 2));
    assert_true(ok(p, "::ffff:127.0.0.1", 3));
    assert_false(ok(p, "10.0.0.1", 5000) || ok(p, "128.0.0.1", 1) || ok(p, "::2", 1));
    assert_false(ok(p, "0.0.0.0", 5000) || ok(p, "169.254.169.254", 80));
    xfer_peers_destroy(p);
    assert_int_equal(xfer_peers_create("", &p), 0);
    assert_true(ok(p, "127.0.0.1", 1));
    xfer_peers_destroy(p);
}

static void test_entries(void **state)
{
    xfer_peers *p;
    assert_int_equal(
        xfer_peers_create("10.1.2.3,10.1.2.4:7000,[fd00::5]:9000,fd00::6,192.168.8.0/22", &p), 0);
    assert_true(ok(p, "10.1.2.3", 1) && ok(p, "10.1.2.3", 65535));
    assert_true(ok(p, "10.1.2.4", 7000) && !ok(p, "10.1.2.4", 7001));
    assert_true(ok(p, "fd00::5", 9000) && !ok(p, "fd00::5", 9001));
    assert_true(ok(p, "fd00::6", 1));
    assert_true(ok(p, "192.168.8.1", 1) && ok(p, "192.168.11.254", 1) && !ok(p, "192.168.12.1", 1));
    assert_true(ok(p, "::ffff:10.1.2.3", 1)); /* a v4 peer through a dual-stack socket */
    assert_false(ok(p, "127.0.0.1", 1));      /* a list replaces the loopback default */
    assert_false(ok(p, "10.1.2.5", 1));
    assert_int_equal(xfer_peers_add(p, "127.0.0.1"), 0);
    assert_true(ok(p, "127.0.0.1", 1) && !ok(p, "127.0.0.2", 1));
    assert_int_equal(xfer_peers_add(p, "localhost:8100"), 0); /* names resolve */
    assert_true(ok(p, "127.0.0.1", 8100));
    xfer_peers_destroy(p);
}

static void test_bad_entries(void **state)
{
    static const char *const bad[] = {"10.0.0.1:0", "10.0.0.1:70000",      "10.0.0.1:", "[fd00::1",
                                      "[fd00::1]x", "10.0.0.0/33",         "10.0.0.0/", "name/8",
                                      ",",          "no-such-host.invalid"};
    for (size_t i = 0; i < DX_ARRAY_LEN(bad); i++) {
        xfer_peers *p = NULL;
        int rc = xfer_peers_create(bad[i], &p);
        if (rc != DX_EINVAL) fail_msg("'%s': got %d, want DX_EINVAL", bad[i], rc);
        assert_null(p);
        assert_non_null(strstr(dx_errmsg(), "--kv-peers"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_loopback),
        cmocka_unit_test(test_entries),
        cmocka_unit_test(test_bad_entries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
