/* itest_router: `duplex router` as a real process on loopback, in front of
 * real `duplex serve --role both` nodes (a synthesised tiny model) and of
 * fake nodes inside this test that speak the P/D side of docs/pd.md.
 *
 * Today's nodes ignore kv_transfer_params and answer without them, so
 * through the router every request takes the degenerate path (prefill
 * answers without params → retry → local prefill); greedy decoding on a
 * batch-invariant engine makes the output exactly what a node gives when
 * hit directly, which is what the tests compare.  The fake nodes answer
 * with params and record what they receive, so the tests can check what
 * the router sends each node (the client's params and conversation_id
 * stripped, max_tokens 1 for the prefill node, the prefill node's params
 * verbatim to the decode node, the stored params on the next turn, none
 * across tenants) and that a client never sees params.
 *
 * No timing is asserted; waits are bounded and wait for an event. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../test_client.h"
#include "../test_proc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "model/synth.h"

/* ---- fake P/D nodes -------------------------------------------------------- */

#define FAKE_LOG   64
#define FAKE_CONNS 16

typedef struct {
    char path[64], auth[128];
    char *body;
} fake_rec;

typedef struct {
    int lfd, port, prefill;
    pthread_t th;
    pthread_mutex_t mu;
    fake_rec log[FAKE_LOG];
    int n_log;
    int stop; /* atomic: fake_stop sets it, the fake's thread polls it */
} fake_node;

#define P_PARAMS                                                                                   \
    "{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"remote_engine_id\":\"fakeP\","       \
    "\"remote_request_id\":\"p-1\",\"remote_host\":\"127.0.0.1\",\"remote_port\":1,"               \
    "\"remote_block_ids\":[1,2],\"remote_num_tokens\":32,"                                         \
    "\"remote_lease\":\"00112233445566778899aabbccddeeff\",\"remote_blocks_ttl_s\":30,"            \
    "\"remote_token_ids\":[1,2,3]}"
#define D_PARAMS                                                                                   \
    "{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"remote_engine_id\":\"fakeD\","       \
    "\"remote_request_id\":\"d-1\",\"remote_host\":\"127.0.0.1\",\"remote_port\":2,"               \
    "\"remote_block_ids\":[5,6,7],\"remote_num_tokens\":48,"                                       \
    "\"remote_lease\":\"ffeeddccbbaa99887766554433221100\",\"remote_blocks_ttl_s\":480,"           \
    "\"remote_token_ids\":[4,5,6]}"
#define FAKE_REPLY "Hello world"

static void fake_write(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void fake_answer(int fd, int status, const char *ctype, const char *body, int split)
{
    char head[256];
    size_t n = strlen(body);
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n", status,
                      ctype, n);
    fake_write(fd, head, (size_t)hn);
    /* in two writes, cut inside the last event: the router must join them */
    size_t cut = split && n > 40 ? n - 30 : n;
    fake_write(fd, body, cut);
    if (cut < n) {
        tp_sleep_ms(5);
        fake_write(fd, body + cut, n - cut);
    }
}

static const char *last_content(json_t *req)
{
    json_t *msgs = json_object_get(req, "messages");
    json_t *c = json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "content");
    return json_is_string(c) ? json_string_value(c) : "";
}

static void fake_completion(fake_node *f, int fd, const char *body)
{
    json_t *req = json_loads(body, 0, NULL);
    const char *content = last_content(req);
    int stream = json_is_true(json_object_get(req, "stream"));
    char buf[4096];
    if (!strcmp(content, "bad")) {
        fake_answer(fd, 400, "application/json",
                    "{\"error\":{\"message\":\"fake: bad\",\"type\":\"invalid_request_error\","
                    "\"param\":null,\"code\":null}}",
                    0);
    } else if (!strcmp(content, "die-mid")) { /* two events of a promised many, then gone */
        const char *h = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        "Content-Length: 100000\r\n\r\n"
                        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":"
                        "\"assistant\",\"content\":\"\"}}]}\n\n"
                        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                        "\"Hel\"}}]}\n\ndata: {\"id\":";
        fake_write(fd, h, strlen(h));
        shutdown(fd, SHUT_RDWR);
    } else if (f->prefill && !strcmp(content, "p500")) {
        fake_answer(fd, 500, "application/json", "{\"error\":{\"message\":\"fake: 500\"}}", 0);
    } else if (f->prefill) {
        snprintf(buf, sizeof buf,
                 "{\"id\":\"chatcmpl-p\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,"
                 "\"message\":{\"role\":\"assistant\",\"content\":\"x\"},\"finish_reason\":"
                 "\"length\"}],\"kv_transfer_params\":%s}",
                 P_PARAMS);
        fake_answer(fd, 200, "application/json", buf, 0);
    } else if (stream) {
        snprintf(buf, sizeof buf,
                 "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                 "\"content\":\"\"},\"finish_reason\":null}]}\n\n"
                 "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},"
                 "\"finish_reason\":null}]}\n\n"
                 "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},"
                 "\"finish_reason\":null}]}\n\n"
                 "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":"
                 "\"stop\"}],\"kv_transfer_params\":%s}\n\n"
                 "data: [DONE]\n\n",
                 D_PARAMS);
        fake_answer(fd, 200, "text/event-stream", buf, 1);
    } else {
        snprintf(buf, sizeof buf,
                 "{\"id\":\"c\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,"
                 "\"message\":{\"role\":\"assistant\",\"content\":\"" FAKE_REPLY "\"},"
                 "\"finish_reason\":\"stop\"}],\"kv_transfer_params\":%s,\"usage\":"
                 "{\"prompt_tokens\":3}}",
                 D_PARAMS);
        fake_answer(fd, 200, "application/json", buf, 0);
    }
    json_decref(req);
}

static void fake_record(fake_node *f, const char *path, const char *head, const char *body)
{
    pthread_mutex_lock(&f->mu);
    if (f->n_log < FAKE_LOG) {
        fake_rec *r = &f->log[f->n_log++];
        snprintf(r->path, sizeof r->path, "%s", path);
        const char *a = strcasestr(head, "\r\nAuthorization: ");
        r->auth[0] = 0;
        if (a) sscanf(a + 17, "%127[^\r]", r->auth);
        r->body = strdup(body);
    }
    pthread_mutex_unlock(&f->mu);
}

/* One complete request at the start of buf, or 0 bytes used. */
static size_t fake_request(fake_node *f, int fd, char *buf, size_t len)
{
    char *end = memmem(buf, len, "\r\n\r\n", 4);
    if (!end) return 0;
    size_t hl = (size_t)(end - buf) + 4, cl = 0;
    *end = 0;
    const char *c = strcasestr(buf, "\r\nContent-Length: ");
    if (c) cl = strtoul(c + 18, NULL, 10);
    if (len < hl + cl) {
        *end = '\r';
        return 0;
    }
    char method[8] = "", path[64] = "";
    sscanf(buf, "%7s %63s", method, path);
    path[strcspn(path, "?")] = 0; /* the router's health check asks /health?load=1 */
    char *body = strndup(buf + hl, cl);
    if (!strcmp(path, "/health"))
        fake_answer(fd, 200, "application/json", "{\"status\":\"ok\"}", 0);
    else if (!strcmp(path, "/v1/models"))
        fake_answer(fd, 200, "application/json", "{\"object\":\"list\",\"data\":[{\"id\":\"f\"}]}",
                    0);
    else {
        fake_record(f, path, buf, body);
        fake_completion(f, fd, body);
    }
    free(body);
    return hl + cl;
}

static void *fake_main(void *arg)
{
    fake_node *f = arg;
    struct pollfd p[FAKE_CONNS + 1];
    static char bufs[2][FAKE_CONNS][65536];
    char(*in)[65536] = bufs[f->prefill];
    size_t lens[FAKE_CONNS] = {0};
    int n = 0;
    p[0] = (struct pollfd){.fd = f->lfd, .events = POLLIN};
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        if (poll(p, (nfds_t)n + 1, 50) <= 0) continue;
        if ((p[0].revents & POLLIN) && n < FAKE_CONNS) {
            int c = accept(f->lfd, NULL, NULL);
            if (c >= 0) {
                p[++n] = (struct pollfd){.fd = c, .events = POLLIN};
                lens[n - 1] = 0;
            }
        }
        for (int i = 1; i <= n; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t r = read(p[i].fd, in[i - 1] + lens[i - 1], sizeof in[0] - lens[i - 1] - 1);
            if (r <= 0) { /* closed: the last slot moves here */
                close(p[i].fd);
                p[i] = p[n];
                memcpy(in[i - 1], in[n - 1], lens[n - 1]);
                lens[i - 1] = lens[n - 1];
                n--;
                i--;
                continue;
            }
            lens[i - 1] += (size_t)r;
            size_t used;
            while ((used = fake_request(f, p[i].fd, in[i - 1], lens[i - 1])) > 0) {
                memmove(in[i - 1], in[i - 1] + used, lens[i - 1] - used);
                lens[i - 1] -= used;
            }
        }
    }
    for (int i = 1; i <= n; i++) close(p[i].fd);
    return NULL;
}

static void fake_start(fake_node *f, int prefill)
{
    memset(f, 0, sizeof *f);
    f->prefill = prefill;
    pthread_mutex_init(&f->mu, NULL);
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    DX_ASSERT(bind(f->lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(f->lfd, 64) == 0);
    socklen_t al = sizeof a;
    getsockname(f->lfd, (struct sockaddr *)&a, &al);
    f->port = ntohs(a.sin_port);
    pthread_create(&f->th, NULL, fake_main, f);
}

static void fake_clear(fake_node *f)
{
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->n_log; i++) free(f->log[i].body);
    f->n_log = 0;
    pthread_mutex_unlock(&f->mu);
}

static void fake_stop(fake_node *f)
{
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    pthread_join(f->th, NULL);
    close(f->lfd);
    fake_clear(f);
}

/* The body of the only completion the fake received since fake_clear. */
static json_t *fake_only(fake_node *f, char *auth, size_t cap)
{
    pthread_mutex_lock(&f->mu);
    if (f->n_log != 1) {
        int n = f->n_log;
        pthread_mutex_unlock(&f->mu);
        fail_msg("fake node on %d received %d completions, want 1", f->port, n);
    }
    json_t *v = json_loads(f->log[0].body, 0, NULL);
    if (auth) snprintf(auth, cap, "%s", f->log[0].auth);
    pthread_mutex_unlock(&f->mu);
    assert_non_null(v);
    return v;
}

/* ---- the cluster --------------------------------------------------------- */

enum { P0, P1, D0, D1, N_NODES };

static struct {
    const char *bin;
    char dir[64], model_path[128], model[128];
    tp_proc node[N_NODES];
    int node_port[N_NODES];
    tp_proc pd, colo, fl, fpd, funi; /* routers */
    int pd_port, colo_port, fl_port, fpd_port, funi_port;
    fake_node fp, fd;
} G;

static int start_node(int i)
{
    char log[160], port[] = "0";
    snprintf(log, sizeof log, "%s/node%d.log", G.dir, i);
    char *argv[] = {(char *)G.bin,
                    "serve",
                    "--model",
                    G.model_path,
                    "--port",
                    port,
                    "--threads",
                    "1",
                    "--kv-cache-mb",
                    "32",
                    "--ctx",
                    "4096",
                    "--shutdown-grace-s",
                    "5",
                    NULL};
    if (tp_spawn(&G.node[i], log, argv)) return -1;
    G.node_port[i] = (int)tp_wait_int(&G.node[i], "address=http://127.0.0.1:", 60);
    return G.node_port[i] > 0 ? 0 : -1;
}

static void url_of(int port, char *out, size_t cap)
{
    snprintf(out, cap, "http://127.0.0.1:%d", port);
}

/* Starts `duplex router` with the given flags (a NULL-terminated list) and
 * waits until it is listening and, when want_healthy, healthy. */
static int start_router(tp_proc *p, const char *name, int want_healthy, ...)
{
    char log[160];
    snprintf(log, sizeof log, "%s/router-%s.log", G.dir, name);
    char *argv[40] = {(char *)G.bin,          "router", "--port",      "0",
                      "--health-interval-ms", "100",    "--log-level", "debug"};
    int n = 8;
    va_list ap;
    va_start(ap, want_healthy);
    for (char *a; (a = va_arg(ap, char *)) && n < 38;) argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    if (tp_spawn(p, log, argv)) return 0;
    int port = (int)tp_wait_int(p, "address=http://127.0.0.1:", 30);
    if (port <= 0) {
        tp_log_tail(p, 20);
        return 0;
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    for (int i = 0; want_healthy && i < 600; i++) {
        if (tc_http(port, "GET", "/health", NULL, &b, 10) == 200) break;
        tp_sleep_ms(50);
    }
    dx_buf_free(&b);
    return port;
}

static int group_setup(void **state)
{
    (void)state;
    G.bin = getenv("DUPLEX_BIN");
    if (!G.bin) G.bin = "build/release/duplex";
    snprintf(G.dir, sizeof G.dir, "/tmp/dx_itest_router_XXXXXX");
    if (!mkdtemp(G.dir)) return -1;
    snprintf(G.model_path, sizeof G.model_path, "%s/tiny.gguf", G.dir);
    synth_config c = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 5};
    if (synth_write(&c, G.model_path)) return -1;
    for (int i = 0; i < N_NODES; i++)
        if (start_node(i)) return -1;
    char p0[64], p1[64], d0[64], d1[64], pl[140], dl[140];
    url_of(G.node_port[P0], p0, sizeof p0);
    url_of(G.node_port[P1], p1, sizeof p1);
    url_of(G.node_port[D0], d0, sizeof d0);
    url_of(G.node_port[D1], d1, sizeof d1);
    snprintf(pl, sizeof pl, "%s,%s", p0, p1);
    snprintf(dl, sizeof dl, "%s,%s", d0, d1);
    /* every request through the prefill nodes (the threshold is 0) */
    G.pd_port = start_router(&G.pd, "pd", 1, "--prefill", pl, "--decode", dl,
                             "--local-prefill-max-tokens", "0", "--tokenizer", G.model_path, NULL);
    G.colo_port = start_router(&G.colo, "colo", 1, "--decode", dl, NULL);
    fake_start(&G.fp, 1);
    fake_start(&G.fd, 0);
    char fp[64], fdu[64];
    url_of(G.fp.port, fp, sizeof fp);
    url_of(G.fd.port, fdu, sizeof fdu);
    G.fl_port = start_router(&G.fl, "fake-local", 1, "--decode", fdu, NULL);
    G.fpd_port = start_router(&G.fpd, "fake-pd", 1, "--prefill", fp, "--decode", fdu,
                              "--local-prefill-max-tokens", "0", NULL);
    G.funi_port = start_router(&G.funi, "fake-uni", 1, "--prefill", fp, "--decode", fdu,
                               "--local-prefill-max-tokens", "0", "--mode", "unidirectional", NULL);
    int ok = G.pd_port && G.colo_port && G.fl_port && G.fpd_port && G.funi_port;
    return ok ? tc_model_id(G.node_port[D0], G.model, sizeof G.model) : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    int bad = 0;
    tp_proc *routers[] = {&G.pd, &G.colo, &G.fl, &G.fpd, &G.funi};
    for (size_t i = 0; i < DX_ARRAY_LEN(routers); i++) bad |= tp_stop_clean(routers[i]) != 0;
    /* every node a test did not kill on purpose exits 0: drained, and its
     * shutdown audit found no leaked KV block */
    for (int i = 0; i < N_NODES; i++) {
        tp_proc *n = &G.node[i];
        if (tp_gone(n) && WIFSIGNALED(n->status) && WTERMSIG(n->status) == SIGKILL) continue;
        bad |= tp_stop_clean(n) != 0;
    }
    fake_stop(&G.fp);
    fake_stop(&G.fd);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", G.dir);
    (void)!system(cmd);
    return bad ? -1 : 0;
}

/* ---- clients --------------------------------------------------------------- */

/* A request with optional extra headers ("Name: value", NULL-terminated
 * list); status back, body in *out. */
static long req(int port, const char *method, const char *path, const char *body, dx_buf *out,
                const char *h1, const char *h2)
{
    struct curl_slist *hdrs;
    dx_buf_reset(out);
    CURL *c = tc_curl(port, method, path, body, out, &hdrs, 120);
    if (h1) hdrs = curl_slist_append(hdrs, h1);
    if (h2) hdrs = curl_slist_append(hdrs, h2);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    if (rc != CURLE_OK) fail_msg("%s %s on %d: %s", method, path, port, curl_easy_strerror(rc));
    tc_terminate(out);
    return status;
}

static char *chat_body(const char *content, int max_tokens, int stream, const char *extra)
{
    size_t cap = strlen(content) + (extra ? strlen(extra) : 0) + 512;
    char *b = malloc(cap);
    snprintf(b, cap,
             "{\"model\":\"%s\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
             "{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,\"temperature\":0,"
             "\"stream\":%s%s%s}",
             G.model, content, max_tokens, stream ? "true" : "false", extra ? "," : "",
             extra ? extra : "");
    return b;
}

static char *cmpl_body(const char *prompt, int max_tokens, int stream)
{
    char *b = malloc(1024);
    snprintf(b, 1024,
             "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,"
             "\"stream\":%s}",
             G.model, prompt, max_tokens, stream ? "true" : "false");
    return b;
}

/* What a client can compare: the text, the finish reason and, for a whole
 * answer, the usage (ids and timestamps differ between any two answers). */
typedef struct {
    char *text;
    char finish[16];
    long completion_tokens, prompt_tokens;
} answer;

static answer parse_answer(const dx_buf *b, int chat, int stream)
{
    answer a = {0};
    dx_buf t;
    dx_buf_init(&t, 0);
    assert_null(strstr(b->data, "kv_transfer_params"));
    if (stream) {
        int u;
        tc_parse_sse(b, chat, &t, a.finish, &u);
        a.completion_tokens = u;
    } else {
        tc_answer_text(b, chat, &t);
        json_t *v = tc_json(b);
        json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
        snprintf(a.finish, sizeof a.finish, "%s",
                 json_string_value(json_object_get(ch, "finish_reason")));
        json_t *u = json_object_get(v, "usage");
        a.completion_tokens = (long)json_integer_value(json_object_get(u, "completion_tokens"));
        a.prompt_tokens = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
        json_decref(v);
    }
    a.text = strdup(t.data ? t.data : "");
    dx_buf_free(&t);
    return a;
}

static answer ask(int port, const char *path, const char *body, const char *h1, const char *h2)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    long st = req(port, "POST", path, body, &b, h1, h2);
    if (st != 200) fail_msg("POST %s on %d: %ld %s", path, port, st, b.data);
    answer a =
        parse_answer(&b, strstr(path, "chat") != NULL, strstr(body, "\"stream\":true") != NULL);
    dx_buf_free(&b);
    return a;
}

static void assert_same(answer *want, answer *got)
{
    assert_string_equal(got->text, want->text);
    assert_string_equal(got->finish, want->finish);
    assert_int_equal(got->completion_tokens, want->completion_tokens);
    assert_int_equal(got->prompt_tokens, want->prompt_tokens);
    free(want->text);
    free(got->text);
}

/* A metric with its labels, 0 when the series does not exist yet. */
static double metric(int port, const char *series)
{
    return tc_metric_or(port, series, 0);
}

/* The kv_transfer_params a fake node received are `want` (NULL: none);
 * drops v. */
static void assert_kv(json_t *v, const json_t *want)
{
    json_t *kv = json_object_get(v, "kv_transfer_params");
    if (want ? !json_equal(kv, want) : kv != NULL) {
        char *got = json_dumps(v, JSON_COMPACT);
        fail_msg("a fake node received: %s", got);
    }
    json_decref(v);
}

/* Asks through `port` (a router in front of the fake decode node); returns
 * what the fake decode node received, after checking the client got the
 * fake's reply. */
static json_t *via_fake(int port, const char *body, const char *h1, const char *h2, char *auth,
                        size_t cap)
{
    fake_clear(&G.fd);
    answer a = ask(port, "/v1/chat/completions", body, h1, h2);
    assert_string_equal(a.text, FAKE_REPLY);
    free(a.text);
    return fake_only(&G.fd, auth, cap);
}

#define NODE_CHATS "duplex_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"}"

/* ---- tests ------------------------------------------------------------------ */

static void test_routes(void **state)
{
    (void)state;
    dx_buf b, n;
    dx_buf_init(&b, 0);
    dx_buf_init(&n, 0);
    assert_int_equal(req(G.pd_port, "GET", "/health", NULL, &b, NULL, NULL), 200);
    assert_string_equal(b.data, "{\"status\":\"ok\"}");
    /* /v1/models: a node's answer */
    assert_int_equal(req(G.pd_port, "GET", "/v1/models", NULL, &b, NULL, NULL), 200);
    assert_int_equal(req(G.node_port[D0], "GET", "/v1/models", NULL, &n, NULL, NULL), 200);
    assert_string_equal(b.data, n.data);
    /* 404, 405: OpenAI-shaped */
    assert_int_equal(req(G.pd_port, "GET", "/nope", NULL, &b, NULL, NULL), 404);
    json_t *v = tc_json(&b);
    assert_true(json_is_string(json_object_get(json_object_get(v, "error"), "message")));
    json_decref(v);
    assert_int_equal(req(G.pd_port, "GET", "/v1/chat/completions", NULL, &b, NULL, NULL), 405);
    assert_int_equal(req(G.pd_port, "POST", "/health", "{}", &b, NULL, NULL), 405);
    v = tc_json(&b);
    assert_non_null(json_object_get(v, "error"));
    json_decref(v);
    assert_int_equal(req(G.pd_port, "GET", "/metrics", NULL, &b, NULL, NULL), 200);
    const char *names[] = {
        "duplex_router_conversations",       "duplex_router_affinity_hits_total",
        "duplex_router_ttft_seconds_bucket", "duplex_router_added_seconds_bucket",
        "duplex_router_node_healthy{",       "duplex_router_node_outstanding_requests{"};
    for (size_t i = 0; i < DX_ARRAY_LEN(names); i++)
        if (!strstr(b.data, names[i])) fail_msg("/metrics lacks %s", names[i]);
    dx_buf_free(&b);
    dx_buf_free(&n);
}

/* Through the prefill path (retry, fallback) and colocated: exactly the
 * answer a node gives directly — chat and completions, streamed or not. */
static void test_equal_to_direct(void **state)
{
    (void)state;
    int routers[] = {G.pd_port, G.colo_port};
    for (int s = 0; s < 2; s++) {
        char *cb = chat_body("Tell me about rivers and seas.", 24, s,
                             s ? "\"stream_options\":{\"include_usage\":true}" : NULL);
        char *pb = cmpl_body("Once upon a time", 20, s);
        for (size_t r = 0; r < DX_ARRAY_LEN(routers); r++) {
            answer want = ask(G.node_port[D1], "/v1/chat/completions", cb, NULL, NULL);
            answer got = ask(routers[r], "/v1/chat/completions", cb, NULL, NULL);
            assert_same(&want, &got);
            want = ask(G.node_port[D1], "/v1/completions", pb, NULL, NULL);
            got = ask(routers[r], "/v1/completions", pb, NULL, NULL);
            assert_same(&want, &got);
        }
        free(cb);
        free(pb);
    }
    /* a long prompt: the router with --tokenizer counts it on its thread pool */
    char *long_prompt = malloc(8600), *lb;
    long_prompt[0] = 0;
    for (int i = 0; i < 850; i++) strcat(long_prompt, "the river ");
    lb = chat_body(long_prompt, 6, 1, NULL);
    for (size_t r = 0; r < DX_ARRAY_LEN(routers); r++) {
        answer want = ask(G.node_port[D1], "/v1/chat/completions", lb, NULL, NULL);
        answer got = ask(routers[r], "/v1/chat/completions", lb, NULL, NULL);
        assert_same(&want, &got);
    }
    free(long_prompt);
    free(lb);
    /* the degenerate flow was taken and counted: prefill answered without params */
    assert_true(metric(G.pd_port, "duplex_router_fallbacks_total{reason=\"prefill_no_params\"}") >=
                4);
    assert_true(metric(G.pd_port, "duplex_router_routed_total{via=\"prefill\"}") >= 4);
    assert_true(metric(G.colo_port, "duplex_router_routed_total{via=\"local\"}") >= 4);
}

#define N_CONC 8

static void test_concurrent_streams(void **state)
{
    (void)state;
    char *bodies[N_CONC];
    answer alone[N_CONC];
    for (int i = 0; i < N_CONC; i++) {
        char content[64];
        snprintf(content, sizeof content, "Story number %d about %c.", i, 'A' + i);
        bodies[i] = chat_body(content, 20, 1, NULL);
        alone[i] = ask(G.node_port[D0], "/v1/chat/completions", bodies[i], NULL, NULL);
    }
    CURLM *m = curl_multi_init();
    CURL *c[N_CONC];
    dx_buf out[N_CONC];
    struct curl_slist *h[N_CONC];
    for (int i = 0; i < N_CONC; i++) {
        dx_buf_init(&out[i], 0);
        c[i] = tc_curl(G.pd_port, "POST", "/v1/chat/completions", bodies[i], &out[i], &h[i], 120);
        curl_multi_add_handle(m, c[i]);
    }
    tc_multi_run(m);
    for (int i = 0; i < N_CONC; i++) {
        long st = 0;
        curl_easy_getinfo(c[i], CURLINFO_RESPONSE_CODE, &st);
        assert_int_equal(st, 200);
        tc_terminate(&out[i]);
        answer got = parse_answer(&out[i], 1, 1);
        assert_same(&alone[i], &got);
        curl_multi_remove_handle(m, c[i]);
        curl_easy_cleanup(c[i]);
        curl_slist_free_all(h[i]);
        dx_buf_free(&out[i]);
        free(bodies[i]);
    }
    curl_multi_cleanup(m);
}

/* A client's kv_transfer_params and conversation_id never reach a node,
 * and params never reach a client. */
static void test_client_params_stripped(void **state)
{
    (void)state;
    const char *extra = "\"kv_transfer_params\":{\"do_remote_prefill\":true,\"remote_host\":"
                        "\"10.0.0.1\"},\"conversation_id\":\"strip-1\"";
    char *b = chat_body("Hi", 8, 0, extra);
    /* real nodes: the answer is the plain one */
    char *plain = chat_body("Hi", 8, 0, NULL);
    answer want = ask(G.node_port[D0], "/v1/chat/completions", plain, NULL, NULL);
    answer got = ask(G.pd_port, "/v1/chat/completions", b, NULL, NULL);
    assert_same(&want, &got);
    /* a fake decode node: what it received */
    json_t *v = via_fake(G.fl_port, b, NULL, NULL, NULL, 0);
    assert_null(json_object_get(v, "kv_transfer_params"));
    assert_null(json_object_get(v, "conversation_id"));
    assert_int_equal(json_integer_value(json_object_get(v, "max_tokens")), 8);
    json_decref(v);
    free(b);
    /* whatever they hold */
    b = chat_body("Hi", 8, 0, "\"kv_transfer_params\":\"not even an object\"");
    assert_kv(via_fake(G.fl_port, b, NULL, NULL, NULL, 0), NULL);
    free(b);
    free(plain);
}

/* The decode node's params: removed from what the client sees (streamed
 * and not), kept, and sent back to it on the conversation's next turn —
 * for the same tenant only. */
static void test_params_kept_per_tenant(void **state)
{
    (void)state;
    json_t *dp = json_loads(D_PARAMS, 0, NULL);
    for (int stream = 0; stream < 2; stream++) {
        char id[64], auth_a[64], auth_b[64], seen[128];
        snprintf(id, sizeof id, "X-Conversation-Id: conv-%d", stream);
        snprintf(auth_a, sizeof auth_a, "Authorization: Bearer tenant-a-%d", stream);
        snprintf(auth_b, sizeof auth_b, "Authorization: Bearer tenant-b-%d", stream);
        char *b = chat_body("turn", 16, stream, NULL);
        /* the client sees no params (ask checks); nothing stored yet */
        assert_kv(via_fake(G.fl_port, b, id, auth_a, seen, sizeof seen), NULL);
        assert_string_equal(seen, auth_a + 15); /* Authorization passed on */
        /* turn 2, same tenant: the stored params go to the decode node */
        assert_kv(via_fake(G.fl_port, b, id, auth_a, NULL, 0), dp);
        /* the same conversation id from another tenant: its own entry */
        assert_kv(via_fake(G.fl_port, b, id, auth_b, NULL, 0), NULL);
        free(b);
    }
    json_decref(dp);
}

/* Content-derived keys: the next turn (history + the reply as received +
 * a new message) finds the entry; an edited reply or another tenant does
 * not. */
static void test_content_keys(void **state)
{
    (void)state;
    json_t *dp = json_loads(D_PARAMS, 0, NULL);
    const char *t1 = "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\","
                     "\"content\":\"content-key\"}]}";
    char t2[512], t2_edit[512];
    snprintf(
        t2, sizeof t2,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"content-key\"},"
        "{\"role\":\"assistant\",\"content\":\"%s\"},{\"role\":\"user\",\"content\":\"more\"}]}",
        FAKE_REPLY);
    snprintf(
        t2_edit, sizeof t2_edit,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"content-key\"},"
        "{\"role\":\"assistant\",\"content\":\"%s!\"},{\"role\":\"user\",\"content\":\"more\"}]}",
        FAKE_REPLY);
    json_decref(via_fake(G.fl_port, t1, NULL, NULL, NULL, 0));
    const char *bodies[] = {t2_edit, t2, t2};
    const char *auths[] = {NULL, "Authorization: Bearer other", NULL};
    int want_params[] = {0, 0, 1};
    for (int i = 0; i < 3; i++)
        assert_kv(via_fake(G.fl_port, bodies[i], auths[i], NULL, NULL, 0),
                  want_params[i] ? dp : NULL);
    json_decref(dp);
    /* real nodes: the second turn is an affinity hit on the first turn's node */
    char *b1 = chat_body("A conversation without an id.", 12, 0, NULL);
    double h0 = metric(G.colo_port, "duplex_router_affinity_hits_total");
    dx_buf out;
    dx_buf_init(&out, 0);
    assert_int_equal(req(G.colo_port, "POST", "/v1/chat/completions", b1, &out, NULL, NULL), 200);
    /* the reply exactly as received (a model may emit \u0000: keep the JSON value) */
    json_t *ans = tc_json(&out);
    json_t *reply = json_object_get(
        json_object_get(json_array_get(json_object_get(ans, "choices"), 0), "message"), "content");
    json_t *req1 = json_loads(b1, 0, NULL);
    json_t *msgs = json_object_get(req1, "messages");
    json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "assistant", "content", reply));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", "Go on."));
    char *b2 = json_dumps(req1, JSON_COMPACT);
    answer r2 = ask(G.colo_port, "/v1/chat/completions", b2, NULL, NULL);
    assert_true(metric(G.colo_port, "duplex_router_affinity_hits_total") == h0 + 1);
    free(r2.text);
    free(b1);
    free(b2);
    json_decref(req1);
    json_decref(ans);
    dx_buf_free(&out);
}

/* The P/D flow on fake nodes: what the prefill node gets, the prefill
 * node's params verbatim to the decode node, the decode node's params to
 * the prefill node on the next turn; a 400 from the prefill node is the
 * client's answer; a 500 falls back to local prefill. */
static void test_prefill_flow(void **state)
{
    (void)state;
    json_t *pp = json_loads(P_PARAMS, 0, NULL), *dp = json_loads(D_PARAMS, 0, NULL);
    const char *id = "X-Conversation-Id: pd-flow";
    char *b = chat_body("flow", 20, 1,
                        "\"stream_options\":{\"include_usage\":true},\"max_completion_tokens\":20,"
                        "\"kv_transfer_params\":{\"remote_host\":\"evil\"}");
    for (int turn = 0; turn < 2; turn++) {
        fake_clear(&G.fp);
        fake_clear(&G.fd);
        answer a = ask(G.fpd_port, "/v1/chat/completions", b, id, NULL);
        assert_string_equal(a.text, FAKE_REPLY);
        free(a.text);
        json_t *p = fake_only(&G.fp, NULL, 0), *d = fake_only(&G.fd, NULL, 0);
        assert_int_equal(json_integer_value(json_object_get(p, "max_tokens")), 1);
        assert_true(json_is_false(json_object_get(p, "stream")));
        assert_null(json_object_get(p, "stream_options"));
        assert_null(json_object_get(p, "max_completion_tokens"));
        assert_null(json_object_get(p, "conversation_id"));
        json_t *pkv = json_object_get(p, "kv_transfer_params");
        if (turn == 0) {
            json_t *want = json_pack("{s:b,s:b}", "do_remote_decode", 1, "do_remote_prefill", 0);
            assert_true(json_equal(pkv, want));
            json_decref(want);
        } else { /* the decode node's params, asking the prefill node to pull */
            json_t *want = json_deep_copy(dp);
            json_object_set_new(want, "do_remote_decode", json_true());
            json_object_set_new(want, "do_remote_prefill", json_true());
            assert_true(json_equal(pkv, want));
            json_decref(want);
        }
        /* the decode node: the client's own body with the prefill node's params */
        assert_true(json_equal(json_object_get(d, "kv_transfer_params"), pp));
        assert_true(json_is_true(json_object_get(d, "stream")));
        assert_int_equal(json_integer_value(json_object_get(d, "max_completion_tokens")), 20);
        assert_non_null(json_object_get(d, "stream_options"));
        json_decref(p);
        json_decref(d);
    }
    free(b);
    /* a 4xx from the prefill node goes back as it is */
    dx_buf out;
    dx_buf_init(&out, 0);
    b = chat_body("bad", 4, 0, NULL);
    assert_int_equal(req(G.fpd_port, "POST", "/v1/chat/completions", b, &out, NULL, NULL), 400);
    assert_non_null(strstr(out.data, "fake: bad"));
    free(b);
    /* a 5xx: local prefill on the decode node (no retry: one prefill node) */
    double failed = metric(G.fpd_port, "duplex_router_fallbacks_total{reason=\"prefill_failed\"}");
    b = chat_body("p500", 4, 0, NULL);
    assert_kv(via_fake(G.fpd_port, b, NULL, NULL, NULL, 0), NULL);
    assert_true(metric(G.fpd_port, "duplex_router_fallbacks_total{reason=\"prefill_failed\"}") ==
                failed + 1);
    free(b);
    dx_buf_free(&out);
    json_decref(pp);
    json_decref(dp);
}

/* The decode node dies after the first bytes went to the client: the
 * stream ends with an OpenAI-style error event and [DONE]; what the client
 * had is intact, the half event is not passed on. */
static void test_decode_dies_mid_stream(void **state)
{
    (void)state;
    char *b = chat_body("die-mid", 8, 1, NULL);
    dx_buf out;
    dx_buf_init(&out, 0);
    assert_int_equal(req(G.fl_port, "POST", "/v1/chat/completions", b, &out, NULL, NULL), 200);
    const char *err = strstr(out.data, "data: {\"error\":");
    if (!err || !strstr(out.data, "\"content\":\"Hel\"") || strstr(out.data, "{\"id\":\n") ||
        !strstr(err, "decode node failed mid-answer") || !strstr(err, "data: [DONE]\n\n"))
        fail_msg("stream: %s", out.data);
    dx_buf_free(&out);
    free(b);
    /* and the router keeps serving */
    b = chat_body("after", 8, 0, NULL);
    json_decref(via_fake(G.fl_port, b, NULL, NULL, NULL, 0));
    free(b);
}

/* Unidirectional: stored params never go to a prefill node. */
static void test_unidirectional(void **state)
{
    (void)state;
    json_t *want = json_pack("{s:b,s:b}", "do_remote_decode", 1, "do_remote_prefill", 0);
    char *b = chat_body("uni", 8, 0, NULL);
    for (int turn = 0; turn < 2; turn++) {
        fake_clear(&G.fp);
        answer a = ask(G.funi_port, "/v1/chat/completions", b, "X-Conversation-Id: uni", NULL);
        free(a.text);
        assert_kv(fake_only(&G.fp, NULL, 0), want);
    }
    free(b);
    json_decref(want);
}

/* Affinity on real nodes: one conversation id, one decode node; the same
 * id from two tenants is two conversations. */
static void test_affinity(void **state)
{
    (void)state;
    double before[2] = {metric(G.node_port[D0], NODE_CHATS), metric(G.node_port[D1], NODE_CHATS)};
    double conv0 = metric(G.colo_port, "duplex_router_conversations");
    char *b = chat_body("Which node am I on?", 4, 0, NULL);
    for (int i = 0; i < 4; i++) {
        answer a = ask(G.colo_port, "/v1/chat/completions", b, "X-Conversation-Id: sticky",
                       "Authorization: Bearer one");
        free(a.text);
    }
    double d0 = metric(G.node_port[D0], NODE_CHATS) - before[0];
    double d1 = metric(G.node_port[D1], NODE_CHATS) - before[1];
    if (!((d0 == 4 && d1 == 0) || (d0 == 0 && d1 == 4)))
        fail_msg("4 turns of one conversation went %g to D0 and %g to D1", d0, d1);
    answer a = ask(G.colo_port, "/v1/chat/completions", b, "X-Conversation-Id: sticky",
                   "Authorization: Bearer two");
    free(a.text);
    assert_true(metric(G.colo_port, "duplex_router_conversations") == conv0 + 2);
    free(b);
}

/* Bad bodies: 400 naming the problem, and the router keeps serving. */
static void test_bad_bodies(void **state)
{
    (void)state;
    static const struct {
        const char *body, *phrase;
    } bad[] = {
        {"{", "invalid JSON"},
        {"[1,2]", "JSON object"},
        {"{\"model\":\"m\"}", "messages"},
        {"{\"model\":\"m\",\"messages\":[]}", "messages"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"conversation_id\":7}",
         "conversation_id"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}",
         "max_tokens"},
        {"\xff\xfe", "invalid JSON"},
    };
    dx_buf b;
    dx_buf_init(&b, 0);
    for (size_t i = 0; i < DX_ARRAY_LEN(bad); i++) {
        long st = req(G.pd_port, "POST", "/v1/chat/completions", bad[i].body, &b, NULL, NULL);
        if (st != 400 || !strstr(b.data, bad[i].phrase))
            fail_msg("body %zu: %ld %s (want 400 naming '%s')", i, st, b.data, bad[i].phrase);
        json_t *v = tc_json(&b);
        assert_string_equal(json_string_value(json_object_get(json_object_get(v, "error"), "type")),
                            "invalid_request_error");
        json_decref(v);
    }
    assert_int_equal(req(G.pd_port, "POST", "/v1/completions", "{\"model\":\"m\"}", &b, NULL, NULL),
                     400);
    assert_non_null(strstr(b.data, "prompt"));
    /* a raw request with a control character in Authorization */
    const char raw[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: a\x01"
                       "b\r\nContent-Length: 2\r\n\r\n{}";
    tc_raw_exchange(G.pd_port, raw, sizeof raw - 1, &b, 2000);
    assert_non_null(strstr(b.data, " 400 "));
    char *ok = chat_body("Still there?", 4, 0, NULL);
    answer a = ask(G.pd_port, "/v1/chat/completions", ok, NULL, NULL);
    free(a.text);
    free(ok);
    dx_buf_free(&b);
}

static void expect_flags(int want_rc, const char *phrase, const char *args)
{
    tp_expect(G.bin, "router", want_rc, phrase, args);
}

static void test_bad_flags(void **state)
{
    (void)state;
    expect_flags(2, "--decode URL[,URL...] is required", "--prefill http://127.0.0.1:1");
    expect_flags(2, "--decode: empty list", "--decode ''");
    expect_flags(2, "--decode: 'ftp://x:1': wants http://HOST:PORT", "--decode ftp://x:1");
    expect_flags(2, "--decode: 'http://127.0.0.1': wants http://HOST:PORT",
                 "--decode http://127.0.0.1");
    expect_flags(2, "port out of range", "--decode http://127.0.0.1:70000");
    expect_flags(2, "https is not supported", "--decode https://127.0.0.1:1");
    expect_flags(2, "no path", "--decode http://127.0.0.1:1/v1");
    expect_flags(2, "--prefill: an empty entry", "--decode http://a:1 --prefill http://b:1,");
    expect_flags(2, "given twice", "--decode http://a:1,http://a:1/");
    expect_flags(2, "given twice (as prefill and as decode)",
                 "--decode http://a:1 --prefill http://a:1");
    expect_flags(2, "--mode: 'sideways' is not a mode", "--decode http://a:1 --mode sideways");
    expect_flags(2, "--port 70000 is out of range", "--decode http://a:1 --port 70000");
    expect_flags(2, "unknown option '--bogus'", "--decode http://a:1 --bogus 1");
    expect_flags(2, "--log-level: unknown log level 'loud' (want error|warn|info|debug)",
                 "--decode http://a:1 --log-level loud");
    expect_flags(1, "/nonexistent.gguf", "--decode http://a:1 --tokenizer /nonexistent.gguf");
}

/* /health: 503 without a healthy decode node, or without a healthy prefill
 * node when some are configured; completions then say why or fall back. */
static void test_health(void **state)
{
    (void)state;
    char d0[64], ok_args[160];
    url_of(G.node_port[D0], d0, sizeof d0);
    tp_proc nodec, nopre;
    int p1 = start_router(&nodec, "dead-decode", 0, "--decode", "http://127.0.0.1:1", NULL);
    snprintf(ok_args, sizeof ok_args, "%s", d0);
    int p2 = start_router(&nopre, "dead-prefill", 0, "--prefill", "http://127.0.0.1:1", "--decode",
                          ok_args, "--local-prefill-max-tokens", "0", NULL);
    assert_true(p1 > 0 && p2 > 0);
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(req(p1, "GET", "/health", NULL, &b, NULL, NULL), 503);
    char *cb = chat_body("anyone?", 4, 0, NULL);
    assert_int_equal(req(p1, "POST", "/v1/chat/completions", cb, &b, NULL, NULL), 503);
    assert_non_null(strstr(b.data, "no healthy decode node"));
    /* the decode node turns healthy within a few checks; the prefill node never */
    char series[160];
    snprintf(series, sizeof series, "duplex_router_node_healthy{node=\"%s\",role=\"decode\"}", d0);
    for (int i = 0; i < 600 && metric(p2, series) != 1; i++) tp_sleep_ms(50);
    assert_true(metric(p2, series) == 1);
    assert_int_equal(req(p2, "GET", "/health", NULL, &b, NULL, NULL), 503);
    answer want = ask(G.node_port[D0], "/v1/chat/completions", cb, NULL, NULL);
    answer got = ask(p2, "/v1/chat/completions", cb, NULL, NULL);
    assert_same(&want, &got);
    free(cb);
    dx_buf_free(&b);
    assert_int_equal(tp_stop_clean(&nodec), 0);
    assert_int_equal(tp_stop_clean(&nopre), 0);
}

/* Both decode nodes idle: no request running, no KV block held (a cancel
 * reaches the engine asynchronously: wait for it, bounded). */
static void assert_nodes_idle(void)
{
    for (int n = D0; n <= D1; n++) {
        double running = -1, used = -1;
        for (int i = 0; i < 600; i++) {
            running = metric(G.node_port[n], "duplex_requests_running");
            used = metric(G.node_port[n], "duplex_kv_blocks_used");
            if (running == 0 && used == 0) break;
            tp_sleep_ms(20);
        }
        assert_true(running == 0 && used == 0);
    }
}

/* A client that leaves mid-stream: the router stops the upstream request,
 * so the node cancels it and frees its blocks; the router keeps serving. */
static void test_client_leaves(void **state)
{
    (void)state;
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"Tell me everything\",\"max_tokens\":900,"
             "\"ignore_eos\":true,\"stream\":true}",
             G.model);
    int fd = tc_raw_stream_open(G.colo_port, "/v1/completions", body, 600);
    close(fd);
    assert_nodes_idle();
    const char *left =
        "duplex_router_http_requests_total{route=\"/v1/completions\",status=\"499\"}";
    for (int i = 0; i < 600 && metric(G.colo_port, left) < 1; i++) tp_sleep_ms(20);
    assert_true(metric(G.colo_port, left) == 1);
    char *ok = chat_body("Still there?", 4, 0, NULL);
    answer a = ask(G.colo_port, "/v1/chat/completions", ok, NULL, NULL);
    free(a.text);
    free(ok);
}

/* SIGTERM while a stream runs: the router stops accepting, finishes the
 * stream (every token, [DONE]) and exits 0. */
static void test_graceful_stop(void **state)
{
    (void)state;
    char d0[64];
    url_of(G.node_port[D0], d0, sizeof d0);
    tp_proc r;
    int port = start_router(&r, "graceful", 1, "--decode", d0, NULL);
    assert_true(port > 0);
    char *b = chat_body("A long answer, please.", 400, 1,
                        "\"ignore_eos\":true,\"stream_options\":{\"include_usage\":true}");
    dx_buf out;
    dx_buf_init(&out, 0);
    struct curl_slist *h;
    CURL *c = tc_curl(port, "POST", "/v1/chat/completions", b, &out, &h, 120);
    CURLM *m = curl_multi_init();
    curl_multi_add_handle(m, c);
    int running = 1, signalled = 0;
    while (running) {
        curl_multi_perform(m, &running);
        if (!signalled && out.len > 0) { /* the stream has begun */
            kill(r.pid, SIGTERM);        /* at-rest: SIGTERM mid-stream is the test (a router) */
            signalled = 1;
        }
        if (running) curl_multi_poll(m, NULL, 0, 20, NULL);
    }
    assert_true(signalled);
    tc_terminate(&out);
    answer got = parse_answer(&out, 1, 1);
    answer want = ask(G.node_port[D0], "/v1/chat/completions", b, NULL, NULL);
    assert_int_equal(got.completion_tokens, 400);
    assert_same(&want, &got);
    int st = tp_stop(&r, 0, 30);
    assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    curl_multi_remove_handle(m, c);
    curl_easy_cleanup(c);
    curl_multi_cleanup(m);
    curl_slist_free_all(h);
    dx_buf_free(&out);
    free(b);
}

/* A prefill node dies: requests are still served, the same answer. */
static void test_prefill_killed(void **state)
{
    (void)state;
    tp_stop(&G.node[P0], SIGKILL, 10);
    char *b = chat_body("After the prefill node died.", 12, 1, NULL);
    for (int i = 0; i < 3; i++) {
        answer want = ask(G.node_port[D0], "/v1/chat/completions", b, NULL, NULL);
        answer got = ask(G.pd_port, "/v1/chat/completions", b, NULL, NULL);
        assert_same(&want, &got);
    }
    free(b);
}

/* The decode node holding a conversation dies: its next turn is served by
 * the other one, with the same answer. */
static void test_decode_killed(void **state)
{
    (void)state;
    char *b = chat_body("Where does this conversation live?", 10, 1, NULL);
    const char *id = "X-Conversation-Id: doomed";
    double before[2] = {metric(G.node_port[D0], NODE_CHATS), metric(G.node_port[D1], NODE_CHATS)};
    answer a = ask(G.colo_port, "/v1/chat/completions", b, id, NULL);
    free(a.text);
    int holder = metric(G.node_port[D0], NODE_CHATS) > before[0] ? D0 : D1;
    int other = holder == D0 ? D1 : D0;
    assert_true(metric(G.node_port[holder], NODE_CHATS) == before[holder - D0] + 1);
    tp_stop(&G.node[holder], SIGKILL, 10);
    for (int i = 0; i < 3; i++) {
        answer want = ask(G.node_port[other], "/v1/chat/completions", b, NULL, NULL);
        answer got = ask(G.colo_port, "/v1/chat/completions", b, id, NULL);
        assert_same(&want, &got);
    }
    free(b);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_equal_to_direct),
        cmocka_unit_test(test_concurrent_streams),
        cmocka_unit_test(test_client_params_stripped),
        cmocka_unit_test(test_params_kept_per_tenant),
        cmocka_unit_test(test_content_keys),
        cmocka_unit_test(test_prefill_flow),
        cmocka_unit_test(test_unidirectional),
        cmocka_unit_test(test_decode_dies_mid_stream),
        cmocka_unit_test(test_affinity),
        cmocka_unit_test(test_bad_bodies),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_health),
        cmocka_unit_test(test_client_leaves),
        cmocka_unit_test(test_graceful_stop),
        /* these two kill nodes: last */
        cmocka_unit_test(test_prefill_killed),
        cmocka_unit_test(test_decode_killed),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
