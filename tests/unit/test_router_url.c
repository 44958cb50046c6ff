/* test_router_url: node URLs and modes as `duplex router` accepts them —
 * http://HOST:PORT with an optional trailing slash (normalised away), and
 * every other shape refused with a message that says what is wrong. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/dx_err.h"
#include "router/router.h"

static void test_good(void **state)
{
    (void)state;
    static const char *const in[][2] = {
        {"http://127.0.0.1:8000", "http://127.0.0.1:8000"},
        {"http://127.0.0.1:8000/", "http://127.0.0.1:8000"},
        {"http://node-1.cluster.local:1", "http://node-1.cluster.local:1"},
        {"http://[::1]:65535", "http://[::1]:65535"},
    };
    char out[256];
    for (size_t i = 0; i < DX_ARRAY_LEN(in); i++) {
        assert_int_equal(router_parse_url(in[i][0], out, sizeof out), 0);
        assert_string_equal(out, in[i][1]);
    }
}

static void test_bad(void **state)
{
    (void)state;
    static const char *const in[][2] = {
        {"", "wants http://HOST:PORT"},
        {"127.0.0.1:8000", "wants http://HOST:PORT"},
        {"https://127.0.0.1:8000", "https is not supported"},
        {"http://", "wants http://HOST:PORT"},
        {"http://127.0.0.1", "wants http://HOST:PORT"},
        {"http://:80", "wants http://HOST:PORT"},
        {"http://127.0.0.1:", "bad port"},
        {"http://127.0.0.1:0", "out of range"},
        {"http://127.0.0.1:65536", "out of range"},
        {"http://127.0.0.1:123456", "bad port"},
        {"http://127.0.0.1:80x", "bad port"},
        {"http://127.0.0.1:80/v1", "no path"},
        {"http://127.0.0.1:80?a", "no path"},
        {"http://user@127.0.0.1:80", "no path, query or user"},
        {"http://bad_host:80", "bad character"},
        {"http://[::1:80", "bad IPv6"},
        {"http://[::1]80", "wants http://HOST:PORT"},
    };
    char out[256];
    for (size_t i = 0; i < DX_ARRAY_LEN(in); i++) {
        int rc = router_parse_url(in[i][0], out, sizeof out);
        if (rc != DX_EINVAL || !strstr(dx_errmsg(), in[i][1]))
            fail_msg("'%s': rc %d, message '%s' (want '%s')", in[i][0], rc, dx_errmsg(), in[i][1]);
    }
    char small[8];
    assert_int_equal(router_parse_url("http://127.0.0.1:8000", small, sizeof small), DX_EINVAL);
}

static void test_modes(void **state)
{
    (void)state;
    enum router_mode m;
    assert_int_equal(router_parse_mode("unidirectional", &m), 0);
    assert_int_equal(m, ROUTER_UNIDIRECTIONAL);
    assert_string_equal(router_mode_name(m), "unidirectional");
    assert_int_equal(router_parse_mode("bidirectional", &m), 0);
    assert_string_equal(router_mode_name(m), "bidirectional");
    assert_int_equal(router_parse_mode("colocated", &m),
                     DX_EINVAL); /* that is the absence of --prefill */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
