/* dx_log: stderr logger. */
#include "dx_log.h"
#include "dx_err.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_int g_level = -1;

static const char *const k_names[] = {"error", "warn", "info", "debug"};

int dx_log_parse_level(const char *s, enum dx_log_level *out)
{
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, k_names[i]) == 0) {
            *out = (enum dx_log_level)i;
            return 0;
        }
    return dx_errf(DX_EINVAL, "unknown log level '%s' (want error|warn|info|debug)", s ? s : "");
}

enum dx_log_level dx_log_get_level(void)
{
    int l = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (l < 0) {
        enum dx_log_level p = DX_LOG_INFO;
        const char *env = getenv("DUPLEX_LOG");
        if (env) dx_log_parse_level(env, &p);
        atomic_store(&g_level, (int)p);
        l = (int)p;
    }
    return (enum dx_log_level)l;
}

void dx_log_set_level(enum dx_log_level lvl)
{
    atomic_store(&g_level, (int)lvl);
}

void dx_log(enum dx_log_level lvl, const char *fmt, ...)
{
    if (lvl > dx_log_get_level()) return;
    static const char *const tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ldZ %s %s\n", when, ts.tv_nsec / 1000000, tags[lvl], msg);
}
