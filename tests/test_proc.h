/* test_proc: duplex processes for integration tests — start `duplex serve`
 * (or any subcommand that prints an `address=http://127.0.0.1:PORT` line)
 * with stderr to a log, wait for its start-up line, read its HTTP and KV
 * ports, stop it.  A start that does not finish within 60 s fails the test
 * (a hang is a failure, never a timing).  Include after cmocka.h. */
#ifndef TEST_PROC_H
#define TEST_PROC_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    pid_t pid;
    int http, kv; /* kv 0: no KV port */
    char log[256];
} tp_proc;

static inline void tp_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Reads the whole log (up to cap - 1 bytes). */
static inline size_t tp_read_log(const tp_proc *p, char *buf, size_t cap)
{
    FILE *f = fopen(p->log, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    return n;
}

/* Spawns bin with argv (NULL-terminated, argv[0] = the subcommand) and
 * waits for `ready` (e.g. "address=http://") in its log. */
static inline void tp_start(tp_proc *p, const char *bin, const char *log, const char *const *argv,
                            const char *ready)
{
    memset(p, 0, sizeof *p);
    snprintf(p->log, sizeof p->log, "%s", log);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        const char *args[64] = {bin};
        int n = 1;
        for (; argv[n - 1] && n < 63; n++) args[n] = argv[n - 1];
        args[n] = NULL;
        execv(bin, (char *const *)args);
        _exit(127);
    }
    static char buf[1 << 16];
    for (int i = 0; i < 600; i++) {
        tp_read_log(p, buf, sizeof buf);
        const char *a = strstr(buf, ready);
        const char *h = strstr(buf, "address=http://127.0.0.1:");
        if (a && h) {
            p->http = atoi(h + strlen("address=http://127.0.0.1:"));
            const char *k = strstr(buf, "kv_port=127.0.0.1:");
            p->kv = k ? atoi(k + strlen("kv_port=127.0.0.1:")) : 0;
            return;
        }
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = -1;
            fail_msg("%s exited before it was ready: %s", argv[0], buf);
        }
        tp_sleep_ms(100);
    }
    fail_msg("%s did not start within 60 s: %s", argv[0], buf);
}

/* Sends sig and waits; returns the exit status (waitpid's). */
static inline int tp_stop(tp_proc *p, int sig)
{
    int st = 0;
    if (p->pid > 0) {
        kill(p->pid, sig);
        waitpid(p->pid, &st, 0);
    }
    p->pid = -1;
    return st;
}

#endif
