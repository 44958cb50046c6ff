/* oai_jscan: a strict JSON scanner for one object, fed a byte at a time,
 * and the small JSON helpers a tool-call parser needs around it.
 *
 * The tool-call parser (oai_tools) holds a model's call text back while it
 * streams in and must know, at the earliest byte, whether that text is still
 * a well-formed JSON object, where the object ends (a `}` or `</tool_call>`
 * inside a string must not end it) and where its top-level "name",
 * "arguments" and "parameters" values lie.  A tree parser answers none of
 * that incrementally, so this is a push-down scanner over RFC 8259 with no
 * allocation: it keeps the container stack as bits and the offsets of the
 * three values.  Strings are checked for syntax (escapes, no raw control
 * characters) but not for UTF-8, which the caller checks once over the whole
 * object.  Keys are matched as written: an escaped spelling of "name" is some
 * other key. */
#ifndef OAI_JSCAN_H
#define OAI_JSCAN_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

/* Nesting deeper than this is rejected (jansson's own limit is 2048; tool
 * arguments nest a few levels). */
#define OAI_JSCAN_MAX_DEPTH 128

enum oai_jscan_rc {
    OAI_JSCAN_MORE = 0, /* byte accepted, object not complete */
    OAI_JSCAN_DONE = 1, /* byte accepted and it closed the top-level object */
    OAI_JSCAN_BAD = -1, /* byte cannot continue a JSON object: not consumed */
};

/* The top-level members whose values are tracked. */
enum oai_jscan_key { OAI_JSCAN_NAME, OAI_JSCAN_ARGUMENTS, OAI_JSCAN_PARAMETERS, OAI_JSCAN_N_KEYS };

typedef struct {
    size_t start, end; /* value bytes [start, end), offsets from the first byte fed */
    int seen;
} oai_jscan_val;

typedef struct {
    uint8_t mode, num, lit_pos, hex_left, is_key;
    uint8_t key_len; /* bytes of the current top-level key kept in key[] */
    int8_t cur;      /* tracked key whose value is being read, or -1 */
    uint8_t dup;     /* a tracked key appeared twice */
    const char *lit; /* "true" | "false" | "null" being matched */
    uint32_t depth;
    uint8_t stack[OAI_JSCAN_MAX_DEPTH / 8]; /* bit set: object, clear: array */
    char key[12];
    size_t pos; /* bytes accepted so far */
    oai_jscan_val val[OAI_JSCAN_N_KEYS];
} oai_jscan;

/* Ready for an object, which may be preceded by whitespace. */
void oai_jscan_init(oai_jscan *s);
/* Feeds one byte: OAI_JSCAN_MORE, OAI_JSCAN_DONE or OAI_JSCAN_BAD.  After
 * DONE or BAD the scanner must be initialised again before further use. */
int oai_jscan_byte(oai_jscan *s, unsigned char c);

/* 1 if p[0..n) is exactly one JSON object, whitespace around it allowed. */
int oai_jscan_is_object(const char *p, size_t n);
/* Appends the valid JSON value p[0..n) without the whitespace between its
 * tokens; strings and numbers are copied as written. */
int oai_jscan_compact(const char *p, size_t n, dx_buf *out);
/* Appends the value of the valid JSON string literal p[0..n) (quotes
 * included) as UTF-8.  DX_EFORMAT for an escaped lone surrogate. */
int oai_jscan_unquote(const char *p, size_t n, dx_buf *out);

#endif
