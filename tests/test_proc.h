/* test_proc: duplex processes for integration tests — start one with its
 * output in a log file, wait for a line of that log (a start-up line's
 * address), stop it with a signal and collect its exit status.  Waits are
 * bounded so a hang fails the test instead of blocking it; nothing here
 * asserts a duration.  Include after cmocka.h. */
#ifndef TEST_PROC_H
#define TEST_PROC_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    pid_t pid;
    int status;   /* wait status once reaped, else -1 */
    int http, kv; /* ports read by tp_start (kv 0: no KV port) */
    char log[192];
} tp_proc;

static inline void tp_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Runs argv (argv[0] is the program) with stdout and stderr in `log`. */
static inline int tp_spawn(tp_proc *p, const char *log, char *const argv[])
{
    snprintf(p->log, sizeof p->log, "%s", log);
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

/* SIGTERM, and a clean exit 0 within 30 s: 0, or -1 after printing the
 * status and the log's tail. */
static inline int tp_stop_clean(tp_proc *p)
{
    int st = tp_stop(p, SIGTERM, 30);
    if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    fprintf(stderr, "%s: exited with status %d\n", p->log, st);
    tp_log_tail(p, 30);
    return -1;
}

#endif
