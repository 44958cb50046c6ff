/* Fuzz target: raw bytes from a client into the node's HTTP server.
 *
 * One server (node_server + an instant fake engine) runs on a loop thread for
 * the whole process; each input is written to a fresh loopback connection,
 * the write side is shut, and whatever the server answers is read until it
 * closes.  The server must neither crash nor leak, and afterwards it must
 * still answer GET /health. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "node/node_server.h"
#include "node/oai_req.h"

static int g_port;

/* Engine that finishes every request at once with one token "x". */
static int inst_submit(void *self, const engine_request *r, uint64_t *id)
{
    static uint64_t next;
    (void)self;
    if (r->n_prompt + (r->max_tokens ? r->max_tokens : 1) > 4096)
        return dx_errf(DX_EINVAL, "too long");
    *id = ++next;
    int32_t tok = 'x';
    engine_event t = {.type = ENGINE_EV_TOKENS,
                      .req_id = *id,
                      .tokens = &tok,
                      .n_tokens = 1,
                      .text = "x",
                      .text_len = 1};
    r->on_event(r->user, &t);
    engine_event d = {.type = ENGINE_EV_DONE,
                      .req_id = *id,
                      .finish = ENGINE_FINISH_LENGTH,
                      .n_prompt = (uint32_t)r->n_prompt,
                      .n_gen = 1};
    r->on_event(r->user, &d);
    return 0;
}

static int inst_cancel(void *self, uint64_t id)
{
    (void)self;
    (void)id;
    return 0;
}

static void inst_stats(void *self, engine_stats *out)
{
    (void)self;
    memset(out, 0, sizeof *out);
}

static int inst_encode(void *self, const char *t, size_t n, int32_t **ids, size_t *n_ids)
{
    (void)self;
    *ids = dx_malloc((n ? n : 1) * sizeof **ids);
    if (!*ids) return DX_ENOMEM;
    for (size_t i = 0; i < n; i++) (*ids)[i] = (unsigned char)t[i];
    *n_ids = n;
    return 0;
}

static int inst_encode_chat(void *self, const chat_msg *m, size_t n, int32_t **ids, size_t *n_ids)
{
    return inst_encode(self, n ? m[n - 1].content : "", n ? m[n - 1].content_len : 0, ids, n_ids);
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
    signal(SIGPIPE, SIG_IGN);
    oai_json_use_dx_alloc();
    uv_loop_init(&loop);
    node_server_config cfg = {.max_body_bytes = 1 << 16, .request_timeout_ms = 2000};
    DX_ASSERT(node_server_create(&loop, &cfg, &srv) == 0);
    node_backend be = {.submit = inst_submit,
                       .cancel = inst_cancel,
                       .stats = inst_stats,
                       .encode_chat = inst_encode_chat,
                       .encode_text = inst_encode,
                       .model_name = "m",
                       .n_vocab = 256,
                       .n_ctx = 4096};
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
    return 0;
}
