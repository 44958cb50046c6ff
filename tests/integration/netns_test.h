/* netns_test: what the tests that build hosts out of network namespaces
 * share — quiet shell steps that record why a setup step failed (the tests
 * then report themselves skipped, with that reason), the path of `ip` (for
 * `ip netns exec`), and the removal of the namespaces a killed earlier run
 * left.  It builds on pd_test.h (the test's directory, model and secret).
 * Namespaces are named PREFIX<pid>-<letter> after the run that made
 * them.  Static functions: each test binary is one translation unit.
 * Include after cmocka.h. */
#ifndef NETNS_TEST_H
#define NETNS_TEST_H

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pd_test.h"

static char nt_skip[800]; /* why the setup could not be done; empty when it was */

/* Runs a shell command quietly; 0 when it exited 0. */
static int nt_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static int nt_sh(const char *fmt, ...)
{
    char cmd[512], full[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "{ %s; } >/dev/null 2>&1", cmd);
    return system(full) == 0 ? 0 : -1;
}

/* Runs one setup step; on failure records why in nt_skip and returns -1. */
static int nt_step(const char *why, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), unused));
static int nt_step(const char *why, const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (nt_sh("%s", cmd) == 0) return 0;
    snprintf(nt_skip, sizeof nt_skip, "%s (`%s` failed)", why, cmd);
    return -1;
}

/* Namespaces PREFIX<pid>-<c> whose pid no longer runs are a killed earlier
 * run's: removes them (never another live run's), and the veth PREFIX<pid><c>
 * such a run may have left in this namespace. */
static inline void nt_remove_stale(const char *prefix)
{
    char fmt[64];
    snprintf(fmt, sizeof fmt, "%s%%d-%%c", prefix);
    DIR *d = opendir("/run/netns");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid;
        char side;
        if (sscanf(e->d_name, fmt, &pid, &side) == 2 && pid > 0 && kill(pid, 0) < 0 &&
            errno == ESRCH) {
            nt_sh("ip netns del %s", e->d_name);
            nt_sh("ip link del %s%d%c", prefix, pid, side);
        }
    }
    if (d) closedir(d);
}

/* The ip command's full path in out ("" when there is none). */
static inline void nt_ip_path(char *out, size_t cap)
{
    char path[256];
    out[0] = 0;
    if (tp_capture("command -v ip", path, sizeof path) == 0)
        snprintf(out, cap, "%.*s", (int)strcspn(path, "\n"), path);
}

/* The start of a group setup: root, the commands `tools` runs (a shell
 * test such as "command -v ip && ip netns list"; what is missing is named
 * by `missing`), no namespaces of killed runs, ip's path in ip, and
 * pd_test's directory with the model and secret for test `name`.  0, or -1
 * with the reason in nt_skip. */
static inline int nt_begin(const char *prefix, const char *tools, const char *missing,
                           const char *name, char *ip, size_t cap)
{
    nt_skip[0] = 0;
    if (geteuid() != 0) {
        snprintf(nt_skip, sizeof nt_skip, "needs root to create network namespaces");
        return -1;
    }
    if (nt_sh("%s", tools)) {
        snprintf(nt_skip, sizeof nt_skip, "%s", missing);
        return -1;
    }
    nt_remove_stale(prefix);
    nt_ip_path(ip, cap);
    if (pdt_setup(name)) {
        snprintf(nt_skip, sizeof nt_skip, "cannot write the test model and secret");
        return -1;
    }
    return 0;
}

/* At the start of a test: skipped, saying why, when the setup failed. */
static inline void nt_skip_unless_ready(void)
{
    if (!nt_skip[0]) return;
    print_message("skipped: %s\n", nt_skip);
    skip();
}

#endif
