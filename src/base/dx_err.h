/* dx_err: the one table of error codes, the per-thread error message, and
 * the always-on assertion.
 *
 * Every fallible function returns 0 (or a count) on success and a negative
 * DX_E* code on failure.  The code says what kind of failure; the message set
 * with dx_errf() says what and where ("model.gguf: offset 1234: tensor
 * 'blk.0.attn_q.weight' ends past end of file").  The message lives in a
 * thread-local buffer so that no allocation is needed to report an error.
 *
 * DX_ASSERT is for broken invariants only (a bug, never bad input): it stays
 * on in release builds and aborts with file and line. */
#ifndef DX_ERR_H
#define DX_ERR_H

#include <stdarg.h>

/* No code is -1: a stray `return -1` (a sentinel, errno's convention)
 * can never be read as one of these.  The values are on the wire (the KV
 * port's ERROR frames): never renumber one, add new ones at the end. */
#define DX_ERRNO_MAP(X)                                                                            \
    X(NOMEM, -2, "out of memory")                                                                  \
    X(INVAL, -3, "invalid argument")                                                               \
    X(IO, -4, "input/output error")                                                                \
    X(FORMAT, -5, "malformed data")                                                                \
    X(UNSUPPORTED, -6, "not supported")                                                            \
    X(RANGE, -7, "value out of range")                                                             \
    X(NOENT, -8, "not found")                                                                      \
    X(FULL, -9, "no space left (pool exhausted)")                                                  \
    X(TIMEDOUT, -10, "timed out")                                                                  \
    X(CLOSED, -11, "connection closed")                                                            \
    X(MISMATCH, -12, "mismatch")                                                                   \
    X(GONE, -13, "gone (expired, evicted or unknown)")                                             \
    X(PROTO, -14, "protocol error")                                                                \
    X(CANCELED, -15, "canceled")                                                                   \
    X(EXIST, -16, "already exists")                                                                \
    X(BUSY, -17, "busy")                                                                           \
    X(TRANSPORT, -18, "transport error")                                                           \
    X(TOOBIG, -19, "too large")                                                                    \
    X(AUTH, -20, "authentication failed")                                                          \
    X(DENIED, -21, "not allowed")                                                                  \
    X(AGAIN, -22, "try again / partial result")                                                    \
    X(LAYOUT, -23, "KV layout differs (KV dtype or block size)")

enum {
    DX_OK = 0,
#define DX__ERR_ENUM(name, val, msg) DX_E##name = (val),
    DX_ERRNO_MAP(DX__ERR_ENUM)
#undef DX__ERR_ENUM
};

/* A lookup's "none" (no such index, entry or token; not a number): never
 * an error code, so a caller may tell it from a failure the same function
 * returns.  Functions that return it say so; test it with `== DX_NONE` or,
 * where no code can come back, `< 0`. */
#define DX_NONE (-1)

/* Static description of a code ("out of memory"); never NULL. */
const char *dx_strerror(int err);
/* 1 when err is one of the DX_E* codes above (e.g. one a peer sent). */
int dx_err_known(int err);

/* Record a formatted message for the calling thread and return `err`, so a
 * failure site reads `return dx_errf(DX_EFORMAT, "%s: offset %zu: ...", ...)`. */
int dx_errf(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int dx_verrf(int err, const char *fmt, va_list ap);

/* The message "PREFIX: FMT…" in one call: the shared end of every module's
 * own failure helper, which adds where (a file and offset, a line and
 * column, a field) to what its caller says went wrong:
 *
 *   static int fail(const lexer *lx, const char *fmt, ...)
 *   {
 *       char where[64];
 *       snprintf(where, sizeof where, "jinja: line %u, column %u", lx->line, lx->col);
 *       va_list ap;
 *       va_start(ap, fmt);
 *       int rc = dx_verrp(DX_EINVAL, where, fmt, ap);
 *       va_end(ap);
 *       return rc;
 *   }
 *
 * A NULL or empty prefix gives FMT's text alone. */
int dx_verrp(int err, const char *prefix, const char *fmt, va_list ap);
int dx_errp(int err, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The calling thread's last message; dx_strerror(code) if none was set since
 * dx_err_clear().  Valid until the next dx_errf on this thread. */
const char *dx_errmsg(void);
int dx_errcode(void);
void dx_err_clear(void);

/* Prefix the current message with "prefix: " (adds context while unwinding). */
int dx_err_wrap(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

_Noreturn void dx_assert_fail(const char *expr, const char *file, int line);

#define DX_ASSERT(cond) ((cond) ? (void)0 : dx_assert_fail(#cond, __FILE__, __LINE__))

#define DX_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
