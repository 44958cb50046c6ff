/* test_proc: duplex processes for integration tests — start one with its
 * output in a log file, wait for a line of that log (a start-up line's
 * address), stop it with a signal and collect its exit status.  Waits are
 * bounded so a hang fails the test instead of blocking it; nothing here
 * asserts a duration.
 *
 * A `duplex serve` is recognised when it is spawned (tp_spawn reads its
 * command line: role, retention, where its HTTP port listens, the network
 * namespace it runs in), and every graceful stop of one — tp_stop_clean,
 * pd_test.h's stop_ok, tp_up_stop for the nodes of a `duplex up` — first
 * checks it at rest on /metrics (tp_at_rest): nothing running or waiting,
 * no pin, every block reference a lease's, and leases only of the kinds
 * its role keeps.  So a test cannot forget the leak check:
 * scripts/check_at_rest.sh (make test's lint/at-rest) fails a test source
 * that starts nodes and stops them another way.  Include after cmocka.h. */
#ifndef TEST_PROC_H
#define TEST_PROC_H

#include "test_client.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* What tp_at_rest expects of a node, from its command line. */
typedef struct {
    int on;         /* a `duplex serve` */
    int may_hold;   /* --role prefill: prompts held for decode nodes live to --kv-lease-ttl */
    int may_retain; /* --bidirectional-kv-xfer, not prefill: finished requests' KV retained */
    char host[48];  /* where its HTTP port listens (--host; 127.0.0.1) */
    char netns[48]; /* run under `ip netns exec NS`: /metrics is read from inside NS */
} tp_node;

typedef struct {
    pid_t pid;
    int status;   /* wait status once reaped, else -1 */
    int http, kv; /* ports read by tp_start (kv 0: no KV port) */
    char log[192];
    tp_node node;
} tp_proc;

static inline void tp_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Reads a node's expectations from its command line: `BIN serve ...`, or
 * `ip netns exec NS BIN serve ...` (later flags win, as in the CLI). */
static inline void tp_node_from_argv(tp_node *n, char *const argv[])
{
    memset(n, 0, sizeof *n);
    int i = 1;
    if (argv[0] && argv[1] && argv[2] && argv[3] && !strcmp(argv[1], "netns") &&
        !strcmp(argv[2], "exec")) {
        snprintf(n->netns, sizeof n->netns, "%s", argv[3]);
        i = 5; /* past the namespace and the duplex binary */
    }
    for (int k = 0; k < i; k++)
        if (!argv[k]) return;
    if (strcmp(argv[i], "serve") != 0) return;
    n->on = 1;
    snprintf(n->host, sizeof n->host, "127.0.0.1");
    const char *role = "both";
    int bidi = 0;
    for (int k = i + 1; argv[k]; k++) {
        if (!strcmp(argv[k], "--role") && argv[k + 1]) role = argv[k + 1];
        if (!strcmp(argv[k], "--bidirectional-kv-xfer")) bidi = 1;
        const char *h = !strcmp(argv[k], "--host") ? argv[k + 1] : NULL;
        if (h && strcmp(h, "0.0.0.0") && strcmp(h, "::") && strcmp(h, "[::]"))
            snprintf(n->host, sizeof n->host, strchr(h, ':') && h[0] != '[' ? "[%s]" : "%s", h);
    }
    n->may_hold = !strcmp(role, "prefill");
    n->may_retain = bidi && !n->may_hold;
}

/* Runs argv (argv[0] is the program) with stdout and stderr in `log`. */
static inline int tp_spawn(tp_proc *p, const char *log, char *const argv[])
{
    snprintf(p->log, sizeof p->log, "%s", log);
    tp_node_from_argv(&p->node, argv);
    p->http = p->kv = 0; /* read from the log later (tp_start, tp_at_rest) */
    p->status = -1;
    p->pid = fork();
    if (p->pid < 0) return -1;
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that fails leaves no server behind */
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        dup2(2, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    return 0;
}

/* Reaps p if it has exited; 1 when it is gone. */
static inline int tp_gone(tp_proc *p)
{
    if (p->pid <= 0 || p->status != -1) return 1;
    int st;
    if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
        p->status = st;
        return 1;
    }
    return 0;
}

/* The start of p's log (up to cap - 1 bytes), NUL-terminated. */
static inline size_t tp_read_log(const tp_proc *p, char *buf, size_t cap)
{
    FILE *f = fopen(p->log, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    return n;
}

/* The integer after the first `key` in p's log, waiting up to timeout_s for
 * it to appear; 0 if p died or the time ran out. */
static inline long tp_wait_int(tp_proc *p, const char *key, int timeout_s)
{
    char buf[65536];
    for (int i = 0; i < timeout_s * 20; i++) {
        tp_read_log(p, buf, sizeof buf);
        const char *k = strstr(buf, key);
        if (k) return strtol(k + strlen(key), NULL, 10);
        if (tp_gone(p)) return 0;
        tp_sleep_ms(50);
    }
    return 0;
}

/* Sends sig (0: none) and waits up to timeout_s; the wait status, or -1 if
 * it is still running (it is then killed). */
static inline int tp_stop(tp_proc *p, int sig, int timeout_s)
{
    if (p->pid <= 0) return -1;
    if (!tp_gone(p) && sig) kill(p->pid, sig);
    for (int i = 0; i < timeout_s * 20 && !tp_gone(p); i++) tp_sleep_ms(50);
    if (!tp_gone(p)) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
        return -1;
    }
    return p->status;
}

/* Runs a shell command with its stdout in out (cut at cap - 1 bytes, NUL
 * ended); returns its exit code, -1 if a signal ended it. */
static inline int tp_capture(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A whole file, NUL-terminated (malloc'd), its length in *n when n is
 * not NULL; NULL if it cannot be read. */
static inline char *tp_slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len + 4096 + 1 > cap) {
            char *t = realloc(s, cap = 2 * cap + 8192);
            if (!t) break;
            s = t;
        }
        got = fread(s + len, 1, cap - len - 1, f);
        len += got;
    } while (got > 0);
    fclose(f);
    if (s) s[len] = 0;
    if (n) *n = len;
    return s;
}

/* Removes a test's temporary folder and all in it; 0, or -1. */
static inline int tp_rm_rf(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) ? -1 : 0;
}

/* Runs `bin sub args` (stderr joined to stdout) and fails the test unless it
 * exits with want_rc and its output contains phrase. */
static inline void tp_expect(const char *bin, const char *sub, int want_rc, const char *phrase,
                             const char *args)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s %s %s 2>&1", bin, sub, args);
    int rc = tp_capture(cmd, out, sizeof out);
    if (rc != want_rc || !strstr(out, phrase))
        fail_msg("duplex %s %s: exit %d (want %d), output lacks '%s':\n%s", sub, args, rc, want_rc,
                 phrase, out);
}

/* Runs `bin argv...` (argv NULL-terminated, argv[0] the subcommand) and
 * waits up to 60 s for `ready` and an `address=http://127.0.0.1:PORT` in its
 * log; reads the HTTP port and, if the log names one, the KV port
 * (`kv_port=127.0.0.1:PORT`).  Fails the test if it dies or hangs first. */
static inline void tp_start(tp_proc *p, const char *bin, const char *log, const char *const *argv,
                            const char *ready)
{
    char *args[64] = {(char *)bin};
    int n = 1;
    for (; argv[n - 1] && n < 63; n++) args[n] = (char *)argv[n - 1];
    args[n] = NULL;
    memset(p, 0, sizeof *p);
    assert_int_equal(tp_spawn(p, log, args), 0);
    static char buf[1 << 16];
    for (int i = 0; i < 1200; i++) {
        tp_read_log(p, buf, sizeof buf);
        const char *h = strstr(buf, "address=http://127.0.0.1:");
        if (strstr(buf, ready) && h) {
            p->http = atoi(h + strlen("address=http://127.0.0.1:"));
            const char *k = strstr(buf, "kv_port=127.0.0.1:");
            p->kv = k ? atoi(k + strlen("kv_port=127.0.0.1:")) : 0;
            return;
        }
        if (tp_gone(p)) fail_msg("%s exited before it was ready: %s", argv[0], buf);
        tp_sleep_ms(50);
    }
    fail_msg("%s did not start within 60 s: %s", argv[0], buf);
}

static inline void tp_log_tail(const tp_proc *p, int lines)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "tail -n %d %s >&2", lines, p->log);
    (void)!system(cmd);
}

/* ---- at rest ------------------------------------------------------------ */

/* A node's /metrics text into *out (reset first): straight from here, or
 * with curl inside its namespace.  0, or -1 when it does not answer. */
static inline int tp_metrics_text(const tp_node *n, int port, dx_buf *out)
{
    dx_buf_reset(out);
    if (!n->netns[0]) {
        CURL *c;
        struct curl_slist *h;
        c = tc_curl_at(n->host, port, "GET", "/metrics", NULL, out, &h, 20);
        CURLcode rc = curl_easy_perform(c);
        long st = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
        curl_easy_cleanup(c);
        curl_slist_free_all(h);
        tc_terminate(out);
        return rc == CURLE_OK && st == 200 ? 0 : -1;
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ip netns exec %s curl -sf -m 20 http://%s:%d/metrics", n->netns,
             n->host, port);
    return tc_run_cmd(cmd, out) == 0 ? 0 : -1;
}

/* A series' value in a /metrics text ("name" or "name{labels}"), dflt when
 * it is absent (a node without a KV port has no lease series). */
static inline double tp_series(const dx_buf *text, const char *series, double dflt)
{
    char key[256];
    snprintf(key, sizeof key, "\n%s ", series);
    const char *p = text->data ? strstr(text->data, key) : NULL;
    return p ? strtod(p + strlen(key), NULL) : dflt;
}

typedef struct {
    double running, waiting, pins, refs, leased, leases, holds;
} tp_rest;

/* "" when r is at rest for a node that may hold / retain, else why not. */
static inline const char *tp_rest_why(const tp_rest *r, const tp_node *n, char *why, size_t cap)
{
    why[0] = 0;
    if (r->running || r->waiting || r->pins)
        snprintf(why, cap, "%.0f running, %.0f waiting, %.0f pins", r->running, r->waiting,
                 r->pins);
    else if (r->refs != r->leased) /* nothing else may hold a block now */
        snprintf(why, cap, "%.0f block references held, %.0f of them by leases: %.0f leaked",
                 r->refs, r->leased, r->refs - r->leased);
    else if (r->holds && !n->may_hold)
        snprintf(why, cap, "%.0f prompts held for a decode node (not a prefill node)", r->holds);
    else if (r->leases - r->holds && !n->may_retain)
        snprintf(why, cap, "%.0f retained requests' leases (no --bidirectional-kv-xfer)",
                 r->leases - r->holds);
    return why;
}

/* The node listening on port is at rest (see the top): waits up to 60 s
 * for work in flight to end (a cancelled request frees its blocks on the
 * engine's next step, a lapsed pin at its deadline), then fails the test
 * saying what is left. */
static inline void tp_rest_check(const tp_node *n, int port, const char *name)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    tp_rest r = {0};
    char why[256] = "it does not answer /metrics";
    for (int i = 0; i < 1200; i++) {
        if (tp_metrics_text(n, port, &b) == 0) {
            r = (tp_rest){tp_series(&b, "duplex_requests_running", -1),
                          tp_series(&b, "duplex_requests_waiting", -1),
                          tp_series(&b, "duplex_kv_pins", 0),
                          tp_series(&b, "duplex_kv_block_refs", -1),
                          tp_series(&b, "duplex_kv_leased_blocks", 0),
                          tp_series(&b, "duplex_kv_leases", 0),
                          tp_series(&b, "duplex_kv_hold_leases", 0)};
            if (!tp_rest_why(&r, n, why, sizeof why)[0]) {
                dx_buf_free(&b);
                return;
            }
        }
        tp_sleep_ms(50);
    }
    dx_buf_free(&b);
    fail_msg("%s (port %d) is not at rest: %s", name, port, why);
}

/* p, if it is a node that still runs, is at rest. */
static inline void tp_at_rest(tp_proc *p)
{
    if (!p->node.on || tp_gone(p)) return;
    if (p->http <= 0) { /* spawned without tp_start: its start-up line says */
        static char buf[1 << 16];
        tp_read_log(p, buf, sizeof buf);
        const char *a = strstr(buf, "address=http://");
        if (a) a += strlen("address=http://");
        if (a && *a == '[') a = strchr(a, ']'); /* past an IPv6 address */
        const char *colon = a ? strchr(a, ':') : NULL;
        if (colon) p->http = atoi(colon + 1);
    }
    if (p->http <= 0) fail_msg("%s: a node whose HTTP port is not in its log", p->log);
    tp_rest_check(&p->node, p->http, p->log);
}

/* SIGTERM, and a clean exit 0 within timeout_s (a node checked at rest
 * first): 0, or -1 after printing the status and the log's tail (where a
 * sanitizer's report or a shutdown error is). */
static inline int tp_stop_clean_in(tp_proc *p, int timeout_s)
{
    tp_at_rest(p);
    int st = tp_stop(p, SIGTERM, timeout_s);
    if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    fprintf(stderr, "%s: exited with status %d\n", p->log, st);
    tp_log_tail(p, 60);
    return -1;
}

static inline int tp_stop_clean(tp_proc *p)
{
    return tp_stop_clean_in(p, 30);
}

/* The nodes a `duplex up` started (its summary lines "duplex up: NAME pid
 * N http://127.0.0.1:PORT ..."), each checked at rest: prefill nodes may
 * hold prompts, decode nodes retain in the bidirectional mode.  Returns
 * how many it checked. */
static inline int tp_up_at_rest(const tp_proc *up)
{
    size_t len;
    char *log = tp_slurp(up->log, &len);
    assert_non_null(log);
    int bidi = strstr(log, "mode bidirectional") != NULL, n = 0;
    for (const char *l = log; (l = strstr(l, "duplex up: ")); l++) {
        char name[32];
        int pid, port;
        if (sscanf(l, "duplex up: %31s pid %d http://127.0.0.1:%d", name, &pid, &port) != 3 ||
            !strcmp(name, "router"))
            continue;
        tp_node nd = {.on = 1, .host = "127.0.0.1"};
        nd.may_hold = !strncmp(name, "prefill", 7);
        nd.may_retain = bidi && !nd.may_hold;
        tp_rest_check(&nd, port, name);
        n++;
    }
    free(log);
    return n;
}

/* A `duplex up`'s nodes at rest, then SIGTERM and a clean exit 0 within
 * timeout_s: 0, or -1 after printing the status and the log's tail. */
static inline int tp_up_stop(tp_proc *up, int timeout_s)
{
    if (!tp_gone(up)) tp_up_at_rest(up);
    int st = tp_stop(up, SIGTERM, timeout_s);
    if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    fprintf(stderr, "%s: exited with status %d\n", up->log, st);
    tp_log_tail(up, 40);
    return -1;
}

#endif
