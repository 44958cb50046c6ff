/* dx_err: error table, thread-local messages, assertion. */
#include "dx_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char tl_msg[1024];
static _Thread_local int tl_code;

const char *dx_strerror(int err)
{
    switch (err) {
    case DX_OK:
        return "success";
#define DX__ERR_CASE(name, val, msg)                                                               \
    case val:                                                                                      \
        return msg;
        DX_ERRNO_MAP(DX__ERR_CASE)
#undef DX__ERR_CASE
    default:
        return "unknown error";
    }
}

int dx_err_known(int err)
{
    return err < 0 && strcmp(dx_strerror(err), "unknown error") != 0;
}

int dx_verrf(int err, const char *fmt, va_list ap)
{
    vsnprintf(tl_msg, sizeof tl_msg, fmt, ap);
    tl_code = err;
    return err;
}

int dx_errf(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dx_verrf(err, fmt, ap);
    va_end(ap);
    return err;
}

int dx_verrp(int err, const char *prefix, const char *fmt, va_list ap)
{
    if (!prefix || !prefix[0]) return dx_verrf(err, fmt, ap);
    /* formatted aside first: an argument may be dx_errmsg() itself */
    char msg[sizeof tl_msg];
    vsnprintf(msg, sizeof msg, fmt, ap);
    /* truncation is acceptable here: messages are for people */
    size_t n = strnlen(prefix, sizeof tl_msg - 3);
    memcpy(tl_msg, prefix, n);
    memcpy(tl_msg + n, ": ", 2);
    size_t room = sizeof tl_msg - n - 3, m = strnlen(msg, room);
    memcpy(tl_msg + n + 2, msg, m);
    tl_msg[n + 2 + m] = 0;
    tl_code = err;
    return err;
}

int dx_errp(int err, const char *prefix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dx_verrp(err, prefix, fmt, ap);
    va_end(ap);
    return err;
}

int dx_err_wrap(int err, const char *fmt, ...)
{
    char prefix[512], old[sizeof tl_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%s", tl_msg[0] ? tl_msg : dx_strerror(err));
    /* truncation is acceptable here: messages are for people */
    size_t n = strnlen(prefix, sizeof tl_msg - 3);
    memcpy(tl_msg, prefix, n);
    memcpy(tl_msg + n, ": ", 2);
    size_t room = sizeof tl_msg - n - 3, m = strnlen(old, room);
    memcpy(tl_msg + n + 2, old, m);
    tl_msg[n + 2 + m] = 0;
    tl_code = err;
    return err;
}

const char *dx_errmsg(void)
{
    return tl_msg[0] ? tl_msg : dx_strerror(tl_code);
}

int dx_errcode(void)
{
    return tl_code;
}

void dx_err_clear(void)
{
    tl_msg[0] = 0;
    tl_code = 0;
}

void dx_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "duplex: assertion failed: %s (%s:%d)\n", expr, file, line);
    fflush(stderr);
    abort();
}
