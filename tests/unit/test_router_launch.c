/* test_router_launch: the command lines `duplex up` gives its children in
 * each mode, as docs/pd.md specifies them (the prefill/decode modes cannot
 * run end to end until the nodes offer those roles). */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "up/router_launch.h"

/* The argv joined by spaces. */
static const char *joined(const router_launch_argv *a)
{
    static char buf[2048];
    buf[0] = 0;
    for (int i = 0; i < a->argc; i++) {
        if (i) strcat(buf, " ");
        strcat(buf, a->argv[i]);
    }
    assert_null(a->argv[a->argc]);
    return buf;
}

static router_launch_config cfg(enum router_launch_mode m)
{
    router_launch_config c = {.exe = "/bin/duplex",
                              .model = "m.gguf",
                              .n_prefill = 1,
                              .n_decode = 2,
                              .mode = m,
                              .port = 8000,
                              .threads_per_node = 2,
                              .kv_cache_mb = 512};
    return c;
}

static void test_nodes(void **state)
{
    (void)state;
    router_launch_argv a;
    router_launch_config c = cfg(LAUNCH_BIDIRECTIONAL);
    router_launch_node_argv(&c, 1, &a);
    assert_string_equal(joined(&a),
                        "/bin/duplex serve --model m.gguf --role prefill --host 127.0.0.1 --port 0 "
                        "--trusted-peer 127.0.0.1 --kv-port 0 --bidirectional-kv-xfer --threads 2 "
                        "--kv-cache-mb 512");
    router_launch_node_argv(&c, 0, &a);
    assert_string_equal(joined(&a),
                        "/bin/duplex serve --model m.gguf --role decode --host 127.0.0.1 --port 0 "
                        "--trusted-peer 127.0.0.1 --kv-port 0 --bidirectional-kv-xfer --threads 2 "
                        "--kv-cache-mb 512");
    c.prefill_no_prefix_caching = 1;
    router_launch_node_argv(&c, 1, &a);
    assert_non_null(strstr(joined(&a), " --no-enable-prefix-caching"));
    router_launch_node_argv(&c, 0, &a); /* never on decode nodes */
    assert_null(strstr(joined(&a), "prefix-caching"));
    c = cfg(LAUNCH_UNIDIRECTIONAL);
    router_launch_node_argv(&c, 1, &a);
    assert_string_equal(joined(&a),
                        "/bin/duplex serve --model m.gguf --role prefill --host "
                        "127.0.0.1 --port 0 --trusted-peer 127.0.0.1 --kv-port 0 --threads 2 "
                        "--kv-cache-mb 512");
    /* the cluster's secret (router_launch_run's), and its loopback peers */
    c.kv_secret_file = "/run/duplex-up-x/kv.secret";
    router_launch_node_argv(&c, 0, &a);
    assert_string_equal(joined(&a),
                        "/bin/duplex serve --model m.gguf --role decode --host 127.0.0.1 --port 0 "
                        "--trusted-peer 127.0.0.1 --kv-port 0 --kv-secret-file "
                        "/run/duplex-up-x/kv.secret --kv-peers 127.0.0.1 --threads 2 "
                        "--kv-cache-mb 512");
    /* one KV layout for the cluster: every node gets up's --kv-dtype */
    c.kv_dtype = "q8_0";
    router_launch_node_argv(&c, 1, &a);
    assert_non_null(strstr(joined(&a), " --kv-cache-mb 512 --kv-dtype q8_0"));
    router_launch_node_argv(&c, 0, &a);
    assert_non_null(strstr(joined(&a), " --kv-cache-mb 512 --kv-dtype q8_0"));
    c = cfg(LAUNCH_COLOCATED);
    c.threads_per_node = 0;
    c.kv_cache_mb = 0;
    c.kv_secret_file = "/run/duplex-up-x/kv.secret"; /* no KV port: no secret */
    router_launch_node_argv(&c, 0, &a);
    assert_string_equal(joined(&a),
                        "/bin/duplex serve --model m.gguf --role both --host 127.0.0.1 --port 0 "
                        "--trusted-peer 127.0.0.1");
}

static void test_router(void **state)
{
    (void)state;
    router_launch_argv a;
    router_launch_config c = cfg(LAUNCH_BIDIRECTIONAL);
    assert_int_equal(router_launch_router_argv(&c, "http://127.0.0.1:1",
                                               "http://127.0.0.1:2,"
                                               "http://127.0.0.1:3",
                                               &a),
                     0);
    assert_string_equal(joined(&a), "/bin/duplex router --prefill http://127.0.0.1:1 --decode "
                                    "http://127.0.0.1:2,http://127.0.0.1:3 --host 127.0.0.1 --port "
                                    "8000 --tokenizer m.gguf --mode bidirectional");
    router_launch_argv_free(&a);
    c = cfg(LAUNCH_UNIDIRECTIONAL);
    assert_int_equal(router_launch_router_argv(&c, "http://127.0.0.1:1", "http://127.0.0.1:2", &a),
                     0);
    assert_non_null(strstr(joined(&a), " --mode unidirectional"));
    router_launch_argv_free(&a);
    c.has_local_prefill = 1; /* 0 is a value: every prompt via a prefill node */
    c.local_prefill_max_tokens = 0;
    assert_int_equal(router_launch_router_argv(&c, "http://127.0.0.1:1", "http://127.0.0.1:2", &a),
                     0);
    assert_non_null(strstr(joined(&a), " --local-prefill-max-tokens 0"));
    router_launch_argv_free(&a);
    c = cfg(LAUNCH_COLOCATED);
    c.port = 0;
    assert_int_equal(router_launch_router_argv(&c, "", "http://127.0.0.1:2", &a), 0);
    assert_string_equal(joined(&a), "/bin/duplex router --decode http://127.0.0.1:2 --host "
                                    "127.0.0.1 --port 0 --tokenizer m.gguf");
    router_launch_argv_free(&a);
    /* `duplex up --log-level debug` reaches every child */
    c.debug_children = 1;
    assert_int_equal(router_launch_router_argv(&c, "", "http://127.0.0.1:2", &a), 0);
    assert_non_null(strstr(joined(&a), " --log-level debug"));
    router_launch_argv_free(&a);
    router_launch_node_argv(&c, 0, &a);
    assert_non_null(strstr(joined(&a), " --log-level debug"));
}

static void test_modes(void **state)
{
    (void)state;
    enum router_launch_mode m;
    assert_int_equal(router_launch_parse_mode("colocated", &m), 0);
    assert_int_equal(m, LAUNCH_COLOCATED);
    assert_int_equal(router_launch_parse_mode("unidirectional", &m), 0);
    assert_int_equal(m, LAUNCH_UNIDIRECTIONAL);
    assert_int_equal(router_launch_parse_mode("bidirectional", &m), 0);
    assert_int_equal(m, LAUNCH_BIDIRECTIONAL);
    assert_true(router_launch_parse_mode("both", &m) < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nodes),
        cmocka_unit_test(test_router),
        cmocka_unit_test(test_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
