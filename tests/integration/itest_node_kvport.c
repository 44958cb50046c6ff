/* itest_node_kvport: `duplex serve --kv-port` runs the KV port on the node's
 * loop over a UCX-allocated pool.  A real reader (this process: UCX agent,
 * its own pool, the xfer client) checks that the node says HELLO with its
 * model's fingerprint and layout, refuses a reader of another model, answers
 * GONE to a lease token it never issued, survives garbage on the port, and
 * keeps serving HTTP throughout; SIGTERM still exits 0. */
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
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kv_pool.h"
#include "model/model.h"
#include "model/synth.h"
#include "xfer/xfer_client.h"
#include "xfer/xfer_ucx.h"

static char g_dir[64], g_model[128], g_log[128];
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
        const char *a = strstr(buf, "address=http://127.0.0.1:"), *k = strstr(buf, "kv_port=127.0.0.1:");
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
    strcpy(g_dir, "/tmp/dx_itest_kvport_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_model, sizeof g_model, "%s/tiny.gguf", g_dir);
    snprintf(g_log, sizeof g_log, "%s/serve.log", g_dir);
    synth_config c = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 3};
    if (synth_write(&c, g_model)) return -1;
    g_pid = fork();
    if (g_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test leaves no server behind */
        FILE *f = freopen(g_log, "w", stderr);
        (void)f;
        execl(bin, bin, "serve", "--model", g_model, "--port", "0", "--kv-port", "0",
              "--kv-cache-mb", "16", "--threads", "1", (char *)NULL);
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
} reader;

static void reader_init(reader *r, const model *m, const uint8_t fp[16])
{
    const model_hparams *hp = model_hp(m);
    xfer_agent_config ac = {.no_progress_thread = 1};
    assert_int_equal(xfer_agent_create(&ac, &r->agent), 0);
    kv_pool_config pc = {.n_layer = hp->n_layer, .n_kv_head = hp->n_kv_head,
                         .head_dim = hp->head_dim, .block_size = 16, .dtype = DX_F16,
                         .n_blocks = 8, .alloc = xfer_agent_alloc,
                         .release = xfer_agent_release, .alloc_user = r->agent};
    assert_int_equal(kv_pool_create(&pc, &r->pool), 0);
    xfer_hello_init(&r->hello, "itest-reader", fp, r->pool, r->agent);
    xfer_client_config cc = {.agent = r->agent, .pool = r->pool, .hello = &r->hello};
    assert_int_equal(xfer_client_create(&cc, &r->client), 0);
}

static void reader_free(reader *r)
{
    xfer_client_destroy(r->client);
    kv_pool_destroy(r->pool);
    xfer_agent_destroy(r->agent);
}

static int try_pull(reader *r, xfer_pull_result *res)
{
    int32_t local;
    assert_int_equal(kv_pool_alloc(r->pool, &local), 0);
    int32_t remote = 0;
    int32_t toks[16] = {0};
    kv_hash chain = kv_hash_next(kv_pool_seed(r->pool), toks, 16);
    xfer_pull_req q = {.host = "127.0.0.1", .port = g_kv, .chain = &chain, .remote_ids = &remote,
                       .local_ids = &local, .n = 1, .timeout_s = 10};
    assert_int_equal(xfer_token_random(&q.token), 0);
    int rc = xfer_pull(r->client, &q, res);
    kv_pool_unref(r->pool, local);
    return rc;
}

static void test_hello_and_unknown_lease(void **state)
{
    (void)state;
    model *m;
    assert_int_equal(model_load(g_model, &m), 0);
    uint64_t fp64[2];
    uint8_t fp[16];
    model_fingerprint(m, fp64);
    memcpy(fp, fp64, 16);
    reader r;
    reader_init(&r, m, fp);
    xfer_pull_result res;
    /* same model: HELLO accepted, but the node issued no such lease */
    int rc0 = try_pull(&r, &res);
    if (rc0 != DX_EGONE) fail_msg("want GONE, got %d: %s", rc0, res.reason);
    assert_int_equal(res.n_pulled, 0);
    reader_free(&r);
    /* another model's fingerprint: refused at HELLO, saying what differs */
    fp[0] ^= 0xff;
    reader_init(&r, m, fp);
    int rc = try_pull(&r, &res);
    assert_true(rc < 0 && rc != DX_EGONE);
    if (!strstr(res.reason, "fingerprint")) fail_msg("reason: %s", res.reason);
    reader_free(&r);
    model_free(m);
    assert_int_equal(http_get("/health"), 200);
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
        cmocka_unit_test(test_garbage_then_http),
        cmocka_unit_test(test_sigterm_exits_zero),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
