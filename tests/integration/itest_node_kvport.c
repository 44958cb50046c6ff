/* itest_node_kvport: `duplex serve --kv-port --kv-secret-file` runs the KV
 * port on the node's loop over a UCX-allocated pool.  A real reader (this
 * process: UCX agent, its own pool, the xfer client, the same secret)
 * checks that the node says HELLO with its model's fingerprint and layout,
 * refuses a reader of another model, answers GONE to a lease token it never
 * issued, survives garbage on the port, and keeps serving HTTP throughout;
 * a reader with another secret or none gets "authentication failed" and
 * nothing else, counted on /metrics; the KV flags' mistakes stop serve with
 * a message naming them, and a node without a secret keeps its KV port on
 * loopback whatever --host says; SIGTERM still exits 0. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../test_client.h"
#include "../test_proc.h"
#include "kv_proc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kv_pool.h"
#include "model/model.h"
#include "model/synth.h"
#include "xfer/xfer_client.h"
#include "xfer/xfer_ucx.h"

static char g_dir[64], g_model[128], g_log[128], g_other[160];
static pid_t g_pid = -1;
static int g_http, g_kv;

static int read_ports(void)
{
    char buf[8192];
    for (int i = 0; i < 300; i++) { /* up to 30 s: a hang is a failure, not a timing */
        FILE *f = fopen(g_log, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        const char *a = strstr(buf, "address=http://127.0.0.1:"),
                   *k = strstr(buf, "kv_port=127.0.0.1:");
        if (a && k) {
            g_http = atoi(a + strlen("address=http://127.0.0.1:"));
            g_kv = atoi(k + strlen("kv_port=127.0.0.1:"));
            return 0;
        }
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

static int setup(void **state)
{
    (void)state;
    const char *bin = getenv("DUPLEX_BIN");
    if (!bin) bin = "build/release/duplex";
    g_bin = bin;
    strcpy(g_dir, "/tmp/dx_itest_kvport_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_model, sizeof g_model, "%s/tiny.gguf", g_dir);
    snprintf(g_log, sizeof g_log, "%s/serve.log", g_dir);
    synth_config c = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 3};
    if (synth_write(&c, g_model)) return -1;
    kp_make_secret(g_dir);
    snprintf(g_other, sizeof g_other, "%s/other.secret", g_dir);
    if (kvport_secret_write_new(g_other)) return -1;
    g_pid = fork();
    if (g_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test leaves no server behind */
        FILE *f = freopen(g_log, "w", stderr);
        (void)f;
        execl(bin, bin, "serve", "--model", g_model, "--port", "0", "--kv-port", "0",
              "--kv-cache-mb", "16", "--threads", "1", "--kv-secret-file", g_secret, (char *)NULL);
        _exit(127);
    }
    return read_ports();
}

static int teardown(void **state)
{
    (void)state;
    if (g_pid > 0) {
        kill(g_pid, SIGKILL);
        waitpid(g_pid, NULL, 0);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) ? -1 : 0;
}

static long http_get(const char *path)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    long code = tc_http(g_http, "GET", path, NULL, &b, 20);
    dx_buf_free(&b);
    return code;
}

/* A reader with its own UCX pool, laid out for `m`, claiming fingerprint fp. */
typedef struct {
    xfer_agent *agent;
    kv_pool *pool;
    xfer_client *client;
    kvport_hello hello;
    kvport_secret *secret;
} reader;

/* secret: a file, or NULL for none */
static void reader_init(reader *r, const model *m, const uint8_t fp[16], const char *secret)
{
    r->secret = NULL;
    if (secret) assert_int_equal(kvport_secret_load(secret, &r->secret), 0);
    const model_hparams *hp = model_hp(m);
    xfer_agent_config ac = {.no_progress_thread = 1};
    assert_int_equal(xfer_agent_create(&ac, &r->agent), 0);
    kv_pool_config pc = {.n_layer = hp->n_layer,
                         .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim,
                         .block_size = 16,
                         .dtype = DX_F16,
                         .n_blocks = 8,
                         .alloc = xfer_agent_alloc,
                         .release = xfer_agent_release,
                         .alloc_user = r->agent};
    assert_int_equal(kv_pool_create(&pc, &r->pool), 0);
    xfer_hello_init(&r->hello, "itest-reader", fp, r->pool, r->agent);
    xfer_client_config cc = {
        .agent = r->agent, .pool = r->pool, .hello = &r->hello, .secret = r->secret};
    assert_int_equal(xfer_client_create(&cc, &r->client), 0);
}

static void reader_free(reader *r)
{
    xfer_client_destroy(r->client);
    kv_pool_destroy(r->pool);
    xfer_agent_destroy(r->agent);
    kvport_secret_destroy(r->secret);
}

static int try_pull(reader *r, xfer_pull_result *res)
{
    int32_t local;
    assert_int_equal(kv_pool_alloc(r->pool, &local), 0);
    int32_t remote = 0;
    int32_t toks[16] = {0};
    kv_hash chain = kv_hash_next(kv_pool_seed(r->pool), toks, 16);
    xfer_pull_req q = {.host = "127.0.0.1",
                       .port = g_kv,
                       .chain = &chain,
                       .remote_ids = &remote,
                       .local_ids = &local,
                       .n = 1,
                       .timeout_s = 10};
    assert_int_equal(xfer_token_random(&q.token), 0);
    int rc = xfer_pull(r->client, &q, res);
    kv_pool_unref(r->pool, local);
    return rc;
}

/* The test model, and its fingerprint as 16 bytes. */
static model *load_model(uint8_t fp[16])
{
    model *m;
    assert_int_equal(model_load(g_model, &m), 0);
    uint64_t fp64[2];
    model_fingerprint(m, fp64);
    memcpy(fp, fp64, 16);
    return m;
}

static void test_hello_and_unknown_lease(void **state)
{
    (void)state;
    uint8_t fp[16];
    model *m = load_model(fp);
    reader r;
    reader_init(&r, m, fp, g_secret);
    xfer_pull_result res;
    /* same model: HELLO accepted, but the node issued no such lease */
    int rc0 = try_pull(&r, &res);
    if (rc0 != DX_EGONE) fail_msg("want GONE, got %d: %s", rc0, res.reason);
    assert_int_equal(res.n_pulled, 0);
    reader_free(&r);
    /* another model's fingerprint: refused at HELLO, saying what differs */
    fp[0] ^= 0xff;
    reader_init(&r, m, fp, g_secret);
    int rc = try_pull(&r, &res);
    assert_true(rc < 0 && rc != DX_EGONE);
    if (!strstr(res.reason, "fingerprint")) fail_msg("reason: %s", res.reason);
    reader_free(&r);
    model_free(m);
    assert_int_equal(http_get("/health"), 200);
}

/* Without the node's secret a reader learns nothing: not the rkey, worker
 * address or layout (its HELLO), not even whether its model matches. */
static void test_wrong_secret(void **state)
{
    (void)state;
    uint8_t fp[16];
    model *m = load_model(fp);
    long failed0 = tc_metric(g_http, "duplex_kv_port_connections_total{event=\"auth_failed\"}");
    const char *bad[] = {g_other, NULL};
    for (int i = 0; i < 2; i++) {
        reader r;
        reader_init(&r, m, fp, bad[i]);
        xfer_pull_result res;
        int rc = try_pull(&r, &res);
        if (rc != DX_EAUTH) fail_msg("want DX_EAUTH, got %d: %s", rc, res.reason);
        assert_int_equal(res.t_hello_ms, 0); /* never got as far as HELLO */
        reader_free(&r);
    }
    /* a HELLO probe before authenticating, and a made-up proof: one ERROR
     * frame, "authentication failed", then the node hangs up */
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_hello probe = {.n_layer = 99};
    assert_int_equal(kvport_encode_hello(&b, &probe), 0);
    int fd = kp_connect_from(g_kv, NULL);
    kp_send(fd, &b);
    kp_expect_auth_failed(fd, 0);
    kvport_auth_msg a = {{1}, {2}};
    fd = kp_connect_from(g_kv, NULL);
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_INIT, &a), 0);
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_PROOF, &a), 0);
    kp_send(fd, &b);
    kp_expect_auth_failed(fd, KVPORT_HDR_BYTES + KVPORT_NONCE_BYTES + KVPORT_PROOF_BYTES);
    dx_buf_free(&b);
    model_free(m);
    /* both hostile connections were counted; HTTP is unaffected */
    for (int i = 0; i < 100; i++) {
        long f = tc_metric(g_http, "duplex_kv_port_connections_total{event=\"auth_failed\"}");
        if (f >= failed0 + 2) break;
        tp_sleep_ms(50);
    }
    assert_true(tc_metric(g_http, "duplex_kv_port_connections_total{event=\"auth_failed\"}") >=
                failed0 + 2);
    assert_int_equal(http_get("/health"), 200);
}

/* Mistakes in the KV flags stop serve at once, naming the flag; without a
 * secret a non-loopback --host leaves the KV port on loopback, saying so. */
static void test_kv_flags(void **state)
{
    (void)state;
    char args[512];
    snprintf(args, sizeof args, "--model %s --role prefill --kv-host 0.0.0.0", g_model);
    tp_expect(g_bin, "serve", 2, "--kv-host 0.0.0.0 is not a loopback address", args);
    snprintf(args, sizeof args, "--model %s --role prefill --kv-secret-file %s/nope", g_model,
             g_dir);
    tp_expect(g_bin, "serve", 2, "KV secret file", args);
    snprintf(args, sizeof args, "--model %s --role prefill --kv-peers 10.0.0.1:0", g_model);
    tp_expect(g_bin, "serve", 2, "--kv-peers: '10.0.0.1:0'", args);
    char log[160];
    snprintf(log, sizeof log, "%s/any.log", g_dir);
    /* an API key, so the HTTP side may leave loopback (http_auth) */
    char *argv[] = {(char *)g_bin,      "serve",  "--model",   g_model,  "--role",
                    "prefill",          "--host", "0.0.0.0",   "--port", "0",
                    "--kv-cache-mb",    "16",     "--threads", "1",      "--api-key",
                    "sk-test-kv-flags", NULL};
    tp_proc p;
    assert_int_equal(tp_spawn(&p, log, argv), 0);
    long kv = tp_wait_int(&p, "kv_port=127.0.0.1:", 60);
    char buf[8192];
    tp_read_log(&p, buf, sizeof buf);
    assert_int_equal(tp_stop_clean(&p), 0);
    if (kv <= 0 || !strstr(buf, "auth: none, loopback only") ||
        !strstr(buf, "listens on 127.0.0.1 only"))
        fail_msg("serve --host 0.0.0.0 without a secret:\n%s", buf);
}

static void test_garbage_then_http(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_kv)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\xff\xfe garbage";
    assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    char buf[256];
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t n = read(fd, buf, sizeof buf);
    assert_true(n >= 12); /* an ERROR frame (header is 12 bytes) */
    assert_memory_equal(buf, "DXKV", 4);
    close(fd);
    assert_int_equal(http_get("/health"), 200);
    assert_int_equal(http_get("/v1/models"), 200);
}

static void test_sigterm_exits_zero(void **state)
{
    (void)state;
    tp_node n = {.on = 1, .host = "127.0.0.1"}; /* role both, no retention */
    tp_rest_check(&n, g_http, "the node");
    /* at-rest: checked just above; the signal's exit status is the test */
    assert_int_equal(kill(g_pid, SIGTERM), 0);
    int st = 0;
    for (int i = 0; i < 300 && waitpid(g_pid, &st, WNOHANG) == 0; i++) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    g_pid = -1;
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_and_unknown_lease),
        cmocka_unit_test(test_wrong_secret),
        cmocka_unit_test(test_kv_flags),
        cmocka_unit_test(test_garbage_then_http),
        cmocka_unit_test(test_sigterm_exits_zero),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
