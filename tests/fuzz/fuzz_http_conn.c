/* Fuzz target: raw bytes from a client into the node's HTTP server.
 *
 * One server (node_server + the real engine on a tiny synthetic model) runs
 * on a loop thread for the whole process; each input is written to a fresh loopback connection,
 * the write side is shut, and whatever the server answers is read until it
 * closes.  The server must neither crash nor leak, afterwards it must still
 * answer GET /health, and every request the input started must end in the
 * engine with its KV blocks freed (a client that half-closes counts as gone,
 * so most completions are canceled: the cancel path gets fuzzed too). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "node/node_engine.h"
#include "node/node_server.h"
#include "oai/oai_req.h"

static int g_port;
static engine *g_engine; /* live until the process exits */

/* The real engine behind the server, on a tiny synthetic model: a context
 * of 64 tokens keeps every accepted request short (a request without
 * max_tokens runs to the context). */
static void start_engine(engine **e, model **m)
{
    char dir[] = "/tmp/dx_fuzz_http_XXXXXX", path[64];
    DX_ASSERT(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    synth_config sc = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 42};
    DX_ASSERT(synth_write(&sc, path) == 0);
    DX_ASSERT(model_load(path, m) == 0);
    unlink(path); /* the loaded model no longer needs the file */
    rmdir(dir);
    engine_config ec = {
        .n_threads = 1, .kv_blocks = 32, .max_seqs = 4, .max_waiting = 8, .n_ctx = 64};
    DX_ASSERT(engine_create(&ec, *m, e) == 0);
}

static void *loop_main(void *arg)
{
    uv_loop_t *loop = arg;
    uv_run(loop, UV_RUN_DEFAULT);
    return NULL;
}

static void start_server(void)
{
    static uv_loop_t loop;
    static node_server *srv;
    static model *mdl;
    signal(SIGPIPE, SIG_IGN);
    oai_json_use_dx_alloc();
    uv_loop_init(&loop);
    node_server_config cfg = {.http = {.max_body_bytes = 1 << 16, .request_timeout_ms = 2000}};
    DX_ASSERT(node_server_create(&loop, &cfg, &srv) == 0);
    start_engine(&g_engine, &mdl);
    node_backend be;
    node_engine_backend(g_engine, mdl, &be);
    node_server_set_backend(srv, &be);
    g_port = node_server_port(srv);
    pthread_t th;
    pthread_create(&th, NULL, loop_main, &loop);
    pthread_detach(th); /* serves until the process exits */
}

/* Sends the bytes, half-closes, returns what came back (bounded). */
static size_t exchange(const uint8_t *data, size_t size, char *out, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    DX_ASSERT(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        if (n <= 0) break; /* the server refused and closed */
        off += (size_t)n;
    }
    shutdown(fd, SHUT_WR);
    size_t got = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0) break;
        char buf[4096];
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        size_t k = (size_t)n < cap - got ? (size_t)n : cap - got;
        memcpy(out + got, buf, k);
        got += k;
    }
    close(fd);
    return got;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_port) start_server();
    char out[8192];
    exchange(data, size, out, sizeof out);
    static const char health[] = "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n";
    size_t n = exchange((const uint8_t *)health, sizeof health - 1, out, sizeof out - 1);
    out[n] = 0;
    DX_ASSERT(strstr(out, "HTTP/1.1 200 OK") == out);
    engine_stats st;
    engine_get_stats(g_engine, &st);
    for (int i = 0; i < 5000 && (st.running || st.waiting || st.kv.n_used); i++) {
        usleep(1000);
        engine_get_stats(g_engine, &st);
    }
    DX_ASSERT(!st.running && !st.waiting && !st.kv.n_used);
    return 0;
}
