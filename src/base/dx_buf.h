/* dx_buf: a growable byte buffer with a hard maximum (every buffer fed from
 * the network or a file has one).  Always NUL-terminated for convenience. */
#ifndef DX_BUF_H
#define DX_BUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct {
    char *data;
    size_t len;
    size_t cap;
    size_t max; /* 0 = no limit beyond memory */
} dx_buf;

void dx_buf_init(dx_buf *b, size_t max);
void dx_buf_free(dx_buf *b);
void dx_buf_reset(dx_buf *b); /* len = 0, keeps memory */
/* Make room for `extra` more bytes: 0, DX_ENOMEM or DX_ETOOBIG (over max). */
int dx_buf_reserve(dx_buf *b, size_t extra);
int dx_buf_append(dx_buf *b, const void *p, size_t n);
int dx_buf_puts(dx_buf *b, const char *s);
int dx_buf_putc(dx_buf *b, char c);
int dx_buf_printf(dx_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int dx_buf_vprintf(dx_buf *b, const char *fmt, va_list ap);
/* Drop the first n bytes. */
void dx_buf_consume(dx_buf *b, size_t n);
/* Hand the data to the caller (free with dx_free); the buffer is reset. */
char *dx_buf_take(dx_buf *b);

#endif
