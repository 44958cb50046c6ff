/* kv_proc: the KV-transfer integration tests' processes — `duplex kv hold`
 * and `duplex kv pull` started as children (optionally inside a network
 * namespace), their JSON lines read with a timeout, their exit awaited with
 * a limit.  Static functions in a header: each test binary is one
 * translation unit (like tests/test_client.h).  Include after cmocka.h. */
#ifndef KV_PROC_H
#define KV_PROC_H

#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *g_bin;   /* the duplex binary (DUPLEX_BIN) */
static pid_t g_holder = -1; /* killed by kp_kill_holder if a test fails midway */

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

/* Next stdout line that is a JSON object (UCX may log to stdout too). */
static inline json_t *kp_next_json(kp_proc *p, int timeout_ms)
{
    for (;;) {
        char *nl = memchr(p->buf, '\n', p->len);
        if (nl) {
            *nl = 0;
            json_t *j = p->buf[0] == '{' ? json_loads(p->buf, 0, NULL) : NULL;
            size_t used = (size_t)(nl - p->buf) + 1;
            memmove(p->buf, nl + 1, p->len - used);
            p->len -= used;
            if (j) return j;
            continue;
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

#endif
