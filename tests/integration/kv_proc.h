/* kv_proc: the KV-transfer integration tests' processes — `duplex kv hold`
 * and `duplex kv pull` started as children (optionally inside a network
 * namespace), their JSON lines read with a timeout, their exit awaited with
 * a limit — and raw KV-port connections that authenticate like a reader
 * does (kp_auth) and speak frames.  Both processes get the cluster secret
 * in g_secret (kp_make_secret) unless a test says otherwise.  Static
 * functions in a header: each test binary is one translation unit (like
 * tests/test_client.h).  Include after cmocka.h. */
#ifndef KV_PROC_H
#define KV_PROC_H

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/dx_addr.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "xfer/kvport_auth.h"
#include "xfer/kvport_proto.h"

static const char *g_bin;   /* the duplex binary (DUPLEX_BIN) */
static pid_t g_holder = -1; /* killed by kp_kill_holder if a test fails midway */
static char g_secret[128];  /* the cluster secret file both sides get ("": none) */
/* The secret a pull gets instead (a path, or "" for none); NULL: g_secret. */
static const char *g_pull_secret;

/* Writes a fresh secret file in dir as g_secret. */
static inline void kp_make_secret(const char *dir)
{
    snprintf(g_secret, sizeof g_secret, "%s/kv.secret", dir);
    unlink(g_secret);
    assert_int_equal(kvport_secret_write_new(g_secret), 0);
}

typedef struct {
    pid_t pid;
    int fd; /* the child's stdout */
    char buf[65536];
    size_t len;
} kp_proc;

/* Runs g_bin with argv, stdout into a pipe; inside network namespace
 * `netns` (as `ip netns add` makes them) unless NULL.  Through `ip netns
 * exec`, not a bare setns(): that also mounts the namespace's own /sys,
 * where UCX looks for network devices. */
static inline void kp_spawn(kp_proc *p, const char *netns, char *const argv[])
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    p->len = 0;
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that fails leaves no holder behind */
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        if (!netns) {
            execv(g_bin, argv);
            _exit(127);
        }
        char *nargv[48] = {"ip", "netns", "exec", (char *)netns, (char *)g_bin};
        for (int i = 1, n = 5; argv[i] && n < 47; i++) nargv[n++] = argv[i];
        execvp("ip", nargv);
        _exit(127);
    }
    close(pfd[1]);
    p->fd = pfd[0];
}

/* The next stdout line, which must be a JSON object: tools parse these
 * commands' stdout, so nothing else may land there (UCX's own log lines go
 * to stderr).  NULL at EOF or after timeout_ms without a line. */
static inline json_t *kp_next_json(kp_proc *p, int timeout_ms)
{
    for (;;) {
        char *nl = memchr(p->buf, '\n', p->len);
        if (nl) {
            *nl = 0;
            json_t *j = json_loads(p->buf, 0, NULL);
            if (!json_is_object(j)) fail_msg("stdout line is not a JSON object: %s", p->buf);
            size_t used = (size_t)(nl - p->buf) + 1;
            memmove(p->buf, nl + 1, p->len - used);
            p->len -= used;
            return j;
        }
        struct pollfd pf = {.fd = p->fd, .events = POLLIN};
        if (poll(&pf, 1, timeout_ms) <= 0) return NULL;
        ssize_t r = read(p->fd, p->buf + p->len, sizeof p->buf - 1 - p->len);
        if (r <= 0) return NULL;
        p->len += (size_t)r;
    }
}

/* Waits for exit, at most limit_s (a hang is a failure, not a timing). */
static inline int kp_reap(kp_proc *p, int limit_s)
{
    int st = 0;
    for (int i = 0; i < limit_s * 100; i++) {
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            close(p->fd);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(10000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    close(p->fd);
    fail_msg("process %d did not exit within %d s", (int)p->pid, limit_s);
    return -1;
}

typedef struct {
    kp_proc p;
    const char *netns; /* where it runs; pulls from it run in their own */
    int port;
    char tok[4][33];
} kp_holder;

/* Starts `duplex kv hold --fill-seed 7` with the NULL-terminated extra
 * arguments and reads its port and lease tokens. */
static inline void kp_hold_start(kp_holder *h, const char *netns, ...)
{
    char *argv[40] = {"duplex", "kv", "hold", "--fill-seed", "7"};
    int n = 5;
    if (g_secret[0]) {
        argv[n++] = "--kv-secret-file";
        argv[n++] = g_secret;
    }
    va_list ap;
    va_start(ap, netns);
    for (char *a; n < 38 && (a = va_arg(ap, char *));) argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    h->netns = netns;
    kp_spawn(&h->p, netns, argv);
    g_holder = h->p.pid;
    json_t *j = kp_next_json(&h->p, 30000);
    assert_non_null(j);
    h->port = (int)json_integer_value(json_object_get(j, "port"));
    json_t *ls = json_object_get(j, "leases");
    for (size_t i = 0; i < json_array_size(ls) && i < 4; i++)
        snprintf(h->tok[i], 33, "%s",
                 json_string_value(json_object_get(json_array_get(ls, i), "token")));
    json_decref(j);
    assert_true(h->port > 0);
}

static inline void kp_hold_stop(kp_holder *h)
{
    kill(h->p.pid, SIGTERM);
    g_holder = -1;
    assert_int_equal(kp_reap(&h->p, 30), 0); /* clean exit: asan leak check passes */
}

/* Runs `duplex kv pull --port <holder's> --token T --remote R --fill-seed 7`
 * plus the NULL-terminated extra arguments, in namespace `netns` (NULL:
 * ours); returns its last JSON line and its exit status in *rc (if given). */
static inline json_t *kp_vpull(const kp_holder *h, const char *netns, int *rc, const char *token,
                               const char *remote, va_list ap)
{
    char port[16];
    snprintf(port, sizeof port, "%d", h->port);
    char *argv[40] = {"duplex",      "kv",       "pull",         "--port",      port, "--token",
                      (char *)token, "--remote", (char *)remote, "--fill-seed", "7"};
    int n = 11;
    const char *secret = g_pull_secret ? g_pull_secret : g_secret;
    if (secret[0]) {
        argv[n++] = "--kv-secret-file";
        argv[n++] = (char *)secret;
    }
    for (char *a; n < 38 && (a = va_arg(ap, char *));) argv[n++] = a;
    argv[n] = NULL;
    kp_proc p;
    kp_spawn(&p, netns, argv);
    json_t *last = NULL, *j;
    while ((j = kp_next_json(&p, 60000))) {
        json_decref(last);
        last = j;
    }
    int st = kp_reap(&p, 60);
    if (rc) *rc = st;
    assert_non_null(last);
    return last;
}

static inline json_t *kp_pull(const kp_holder *h, const char *netns, int *rc, const char *token,
                              const char *remote, ...)
{
    va_list ap;
    va_start(ap, remote);
    json_t *j = kp_vpull(h, netns, rc, token, remote, ap);
    va_end(ap);
    return j;
}

static inline long kp_jint(json_t *j, const char *k)
{
    return (long)json_integer_value(json_object_get(j, k));
}

static inline const char *kp_jstr(json_t *j, const char *k)
{
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "";
}

/* A pull that succeeded: n blocks pulled, all verified, nothing leaked. */
static inline void kp_expect_ok(json_t *j, long n)
{
    if (kp_jint(j, "err")) fail_msg("pull failed: %s", kp_jstr(j, "reason"));
    assert_int_equal(kp_jint(j, "pulled"), n);
    assert_int_equal(kp_jint(j, "verified"), n);
    assert_int_equal(kp_jint(j, "corrupt"), 0);
    assert_int_equal(kp_jint(j, "leaked"), 0);
}

/* Per-test teardown: a holder left running by a failed test goes. */
static inline int kp_kill_holder(void **state)
{
    (void)state;
    if (g_holder > 0) {
        kill(g_holder, SIGCONT);
        kill(g_holder, SIGKILL);
        waitpid(g_holder, NULL, 0);
    }
    g_holder = -1;
    return 0;
}

/* ---- raw connections ---- */

/* A TCP connection to 127.0.0.1:port from source address src (NULL: any;
 * "127.0.0.N" gives a peer an address of its own on loopback). */
static inline int kp_connect_from(int port, const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    if (src) {
        struct sockaddr_in b = {.sin_family = AF_INET};
        inet_pton(AF_INET, src, &b.sin_addr);
        assert_int_equal(bind(fd, (struct sockaddr *)&b, sizeof b), 0);
    }
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static inline void kp_send(int fd, dx_buf *b)
{
    assert_int_equal(write(fd, b->data, b->len), (ssize_t)b->len);
    b->len = 0;
}

/* Reads one frame into buf; returns its type (0 if the connection closed
 * first or nothing came within 10 s). */
static inline int kp_read_frame(int fd, kvport_msg *m, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    kvport_hdr h;
    for (;;) {
        int rc = kvport_hdr_read(buf, len, &h);
        if (rc == 0 && len >= KVPORT_HDR_BYTES + h.length) break;
        assert_true(rc == 0 || rc == DX_EAGAIN);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 10000) <= 0) return 0;
        /* never past this frame: the next one is the caller's */
        size_t want = rc == 0 ? KVPORT_HDR_BYTES + h.length - len : KVPORT_HDR_BYTES - len;
        ssize_t r = read(fd, buf + len, want < cap - len ? want : cap - len);
        if (r <= 0) return 0;
        len += (size_t)r;
    }
    assert_int_equal(kvport_decode(&h, buf + KVPORT_HDR_BYTES, m), 0);
    return m->type;
}

/* The reader's side of the handshake on fd with the secret in file `path`
 * ("" or NULL: none): 0 once the holder sent AUTH_OK, DX_EAUTH when either
 * side refused the other.  The AUTH_INIT and AUTH_PROOF sent go to init
 * and proof when given (to replay them). */
static inline int kp_auth_rec(int fd, const char *path, kvport_auth_msg *rec_init,
                              kvport_auth_msg *rec_proof)
{
    kvport_secret *k = NULL;
    if (path && *path) assert_int_equal(kvport_secret_load(path, &k), 0);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    dx_ipport holder;
    assert_int_equal(getpeername(fd, (struct sockaddr *)&ss, &sl), 0);
    assert_int_equal(dx_addr_norm((struct sockaddr *)&ss, &holder), 0);
    kvport_auth a;
    kvport_auth_msg init, proof = {{0}, {0}};
    kvport_msg m;
    static uint8_t buf[4096];
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(kvport_auth_reader_start(&a, k, &holder, &init), 0);
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_INIT, &init), 0);
    kp_send(fd, &b);
    int rc = kp_read_frame(fd, &m, buf, sizeof buf) == KVPORT_AUTH_CHALLENGE ? 0 : DX_EAUTH;
    if (!rc) rc = kvport_auth_reader_prove(&a, &m.u.auth, &proof);
    if (!rc) {
        assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_PROOF, &proof), 0);
        kp_send(fd, &b);
        rc = kp_read_frame(fd, &m, buf, sizeof buf) == KVPORT_AUTH_OK ? 0 : DX_EAUTH;
    }
    dx_buf_free(&b);
    kvport_secret_destroy(k);
    if (rec_init) *rec_init = init;
    if (rec_proof) *rec_proof = proof;
    return rc;
}

static inline int kp_auth(int fd, const char *path)
{
    return kp_auth_rec(fd, path, NULL, NULL);
}

/* A connection from this process, authenticated with g_secret. */
static inline int kp_authed(int port)
{
    int fd = kp_connect_from(port, NULL);
    assert_int_equal(kp_auth(fd, g_secret), 0);
    return fd;
}

/* Every byte the holder sends on fd until it closes (at most cap; waits at
 * most 20 s for each read).  Returns the count, or -1 if it stayed open. */
static inline long kp_read_to_eof(int fd, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 20000) <= 0) return -1;
        ssize_t r = read(fd, buf + len, cap - len);
        if (r == 0 || (r < 0 && errno == ECONNRESET)) return (long)len;
        if (r < 0) return -1;
        len += (size_t)r;
        if (len == cap) return -1;
    }
}

/* The whole stream the holder sent before closing is one ERROR frame saying
 * "authentication failed", after `skip` bytes (a challenge). */
static inline void kp_expect_auth_failed(int fd, size_t skip)
{
    static uint8_t buf[1 << 16];
    long n = kp_read_to_eof(fd, buf, sizeof buf);
    if (n < 0) fail_msg("the holder kept the connection open");
    kvport_hdr h;
    kvport_msg m;
    assert_true((size_t)n > skip);
    assert_int_equal(kvport_hdr_read(buf + skip, (size_t)n - skip, &h), 0);
    assert_int_equal((size_t)n, skip + KVPORT_HDR_BYTES + h.length);
    assert_int_equal(kvport_decode(&h, buf + skip + KVPORT_HDR_BYTES, &m), 0);
    assert_int_equal(m.type, KVPORT_ERROR);
    assert_int_equal(m.u.error.code, DX_EAUTH);
    assert_int_equal(m.u.error.message.n, strlen("authentication failed"));
    assert_memory_equal(m.u.error.message.p, "authentication failed", m.u.error.message.n);
    close(fd);
}

#endif
