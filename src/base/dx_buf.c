/* dx_buf: growable buffer (doubling growth, hard max). */
#include "dx_buf.h"
#include "dx_alloc.h"
#include "dx_err.h"

#include <stdio.h>
#include <string.h>

void dx_buf_init(dx_buf *b, size_t max)
{
    b->data = NULL;
    b->len = b->cap = 0;
    b->max = max;
}

void dx_buf_free(dx_buf *b)
{
    dx_free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void dx_buf_reset(dx_buf *b)
{
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

int dx_buf_reserve(dx_buf *b, size_t extra)
{
    size_t need;
    if (dx_add_overflow(b->len, extra, &need) || dx_add_overflow(need, 1, &need))
        return dx_errf(DX_ETOOBIG, "buffer size overflow");
    if (b->max && need - 1 > b->max)
        return dx_errf(DX_ETOOBIG, "buffer limit of %zu bytes exceeded", b->max);
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap = cap > (size_t)-1 / 2 ? need : cap * 2;
    char *p = dx_realloc(b->data, cap);
    if (!p) return dx_errf(DX_ENOMEM, "out of memory growing a buffer to %zu bytes", cap);
    b->data = p;
    b->cap = cap;
    return 0;
}

int dx_buf_append(dx_buf *b, const void *p, size_t n)
{
    int rc = dx_buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

int dx_buf_puts(dx_buf *b, const char *s)
{
    return dx_buf_append(b, s, strlen(s));
}

int dx_buf_putc(dx_buf *b, char c)
{
    return dx_buf_append(b, &c, 1);
}

int dx_buf_vprintf(dx_buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return dx_errf(DX_EINVAL, "bad format string");
    int rc = dx_buf_reserve(b, (size_t)n);
    if (rc) return rc;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return 0;
}

int dx_buf_printf(dx_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = dx_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void dx_buf_consume(dx_buf *b, size_t n)
{
    if (n >= b->len) {
        dx_buf_reset(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

char *dx_buf_take(dx_buf *b)
{
    char *p = b->data;
    if (!p) p = dx_strdup("");
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}
