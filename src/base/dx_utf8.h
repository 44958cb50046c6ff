/* dx_utf8: strict UTF-8 (no overlongs, no surrogates, nothing above
 * U+10FFFF) for every place that meets bytes that must become text: the
 * tokenizer's valid runs, the engine's streamed text, JSON output. */
#ifndef DX_UTF8_H
#define DX_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

/* Length (1–4) of the valid sequence at s with n bytes left, 0 if invalid or
 * truncated. */
size_t dx_utf8_seq_len(const uint8_t *s, size_t n);
/* The code point of the valid sequence at s (n bytes left) into *cp; its
 * length (1–4), or 0 if invalid or truncated (then *cp is untouched). */
size_t dx_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
/* Length of the longest valid prefix of s[0..n). */
size_t dx_utf8_valid_prefix(const uint8_t *s, size_t n);
/* Bytes at the end of p[0..n) that start a sequence still incomplete (a
 * streaming writer holds them back until the next bytes arrive), else 0. */
size_t dx_utf8_incomplete_tail(const uint8_t *p, size_t n);
/* Writes cp as UTF-8 into out (room for 4 bytes) and returns its length
 * (1–4); 0 when cp is past U+10FFFF.  Surrogates (U+D800–U+DFFF) are
 * encoded as their three bytes: a caller whose output must be strict
 * rejects them first (dx_utf8_decode would). */
size_t dx_utf8_encode(uint32_t cp, uint8_t out[4]);
/* Appends cp as dx_utf8_encode writes it: 0, DX_EINVAL past U+10FFFF, or
 * dx_buf's error. */
int dx_utf8_put(dx_buf *b, uint32_t cp);
/* Appends p[0..n) with each invalid byte replaced by U+FFFD. */
int dx_utf8_sanitize(const uint8_t *p, size_t n, dx_buf *out);

#endif
