/* oai_jscan: incremental JSON object scanner and helpers (see .h). */
#include "oai/oai_jscan.h"

#include <string.h>

#include "base/dx_err.h"
#include "base/dx_utf8.h"

enum {
    M_LEAD,      /* before the top-level object */
    M_VALUE,     /* a value is required (after ':' or ',' in an array) */
    M_ARR_FIRST, /* after '[': a value or ']' */
    M_OBJ_FIRST, /* after '{': a key or '}' */
    M_KEY,       /* after ',' in an object: a key */
    M_COLON,
    M_AFTER, /* after a value: ',' or the container's close */
    M_STR,
    M_ESC,
    M_HEX,
    M_NUM,
    M_LIT,
};

/* Number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const k_keys[OAI_JSCAN_N_KEYS] = {"name", "arguments", "parameters"};

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

void oai_jscan_init(oai_jscan *s)
{
    memset(s, 0, sizeof *s);
    s->mode = M_LEAD;
    s->cur = -1;
}

static int top_is_object(const oai_jscan *s)
{
    uint32_t d = s->depth - 1;
    return (s->stack[d / 8] >> (d % 8)) & 1;
}

/* A value of the top-level object starts or ends at s->pos: track it when
 * it belongs to one of the keys. */
static void value_begin(oai_jscan *s)
{
    if (s->depth == 1 && s->cur >= 0) s->val[s->cur].start = s->pos;
}

static void value_end(oai_jscan *s, size_t end)
{
    s->mode = M_AFTER;
    if (s->depth == 1 && s->cur >= 0) {
        s->val[s->cur].end = end;
        s->cur = -1;
    }
}

static int push(oai_jscan *s, int object)
{
    if (s->depth == OAI_JSCAN_MAX_DEPTH) return OAI_JSCAN_BAD;
    uint32_t d = s->depth++;
    if (object)
        s->stack[d / 8] |= (uint8_t)(1u << (d % 8));
    else
        s->stack[d / 8] &= (uint8_t) ~(1u << (d % 8));
    s->mode = object ? M_OBJ_FIRST : M_ARR_FIRST;
    return OAI_JSCAN_MORE;
}

/* The closing bracket at s->pos ends a container. */
static int pop(oai_jscan *s)
{
    if (--s->depth == 0) return OAI_JSCAN_DONE;
    value_end(s, s->pos + 1);
    return OAI_JSCAN_MORE;
}

static void key_done(oai_jscan *s)
{
    s->cur = -1;
    for (int k = 0; k < OAI_JSCAN_N_KEYS; k++)
        if (s->key_len == strlen(k_keys[k]) && !memcmp(s->key, k_keys[k], s->key_len)) {
            if (s->val[k].seen) s->dup = 1;
            s->val[k].seen = 1;
            s->cur = (int8_t)k;
        }
}

static int begin_value(oai_jscan *s, unsigned char c)
{
    value_begin(s);
    switch (c) {
    case '{':
        return push(s, 1);
    case '[':
        return push(s, 0);
    case '"':
        s->mode = M_STR;
        s->is_key = 0;
        return OAI_JSCAN_MORE;
    case 't':
        s->lit = "true";
        break;
    case 'f':
        s->lit = "false";
        break;
    case 'n':
        s->lit = "null";
        break;
    case '-':
        s->mode = M_NUM, s->num = N_MINUS;
        return OAI_JSCAN_MORE;
    default:
        if (!is_digit(c)) return OAI_JSCAN_BAD;
        s->mode = M_NUM;
        s->num = c == '0' ? N_ZERO : N_INT;
        return OAI_JSCAN_MORE;
    }
    s->mode = M_LIT;
    s->lit_pos = 1;
    return OAI_JSCAN_MORE;
}

static int step(oai_jscan *s, unsigned char c);

/* Next number state for c, or -1 when c does not continue the number. */
static int num_next(int st, unsigned char c)
{
    int d = is_digit(c), e = c == 'e' || c == 'E';
    switch (st) {
    case N_MINUS:
        return c == '0' ? N_ZERO : d ? N_INT : -1;
    case N_ZERO:
        return c == '.' ? N_DOT : e ? N_E : -1;
    case N_INT:
        return d ? N_INT : c == '.' ? N_DOT : e ? N_E : -1;
    case N_DOT:
        return d ? N_FRAC : -1;
    case N_FRAC:
        return d ? N_FRAC : e ? N_E : -1;
    case N_E:
        return c == '+' || c == '-' ? N_ESIGN : d ? N_EXP : -1;
    case N_ESIGN:
        return d ? N_EXP : -1;
    default:
        return d ? N_EXP : -1;
    }
}

static int step_num(oai_jscan *s, unsigned char c)
{
    int next = num_next(s->num, c);
    if (next >= 0) {
        s->num = (uint8_t)next;
        return OAI_JSCAN_MORE;
    }
    if (s->num != N_ZERO && s->num != N_INT && s->num != N_FRAC && s->num != N_EXP)
        return OAI_JSCAN_BAD;
    value_end(s, s->pos); /* c is the first byte after the number */
    return step(s, c);
}

static int step_str(oai_jscan *s, unsigned char c)
{
    if (c < 0x20) return OAI_JSCAN_BAD; /* raw control characters are not JSON */
    if (c == '\\') {
        s->mode = M_ESC;
    } else if (c == '"') {
        if (s->is_key) {
            if (s->depth == 1) key_done(s);
            s->mode = M_COLON;
        } else {
            value_end(s, s->pos + 1);
        }
        return OAI_JSCAN_MORE;
    }
    if (s->is_key && s->depth == 1) { /* keep the key's first bytes to match it */
        if (s->key_len < sizeof s->key)
            s->key[s->key_len++] = (char)c;
        else
            s->key_len = UINT8_MAX; /* too long to be a tracked key */
    }
    return OAI_JSCAN_MORE;
}

static int step(oai_jscan *s, unsigned char c)
{
    switch (s->mode) {
    case M_LEAD:
        if (is_ws(c)) return OAI_JSCAN_MORE;
        return c == '{' ? push(s, 1) : OAI_JSCAN_BAD;
    case M_ARR_FIRST:
        if (c == ']') return pop(s);
        /* fall through */
    case M_VALUE:
        if (is_ws(c)) return OAI_JSCAN_MORE;
        return begin_value(s, c);
    case M_OBJ_FIRST:
        if (c == '}') return pop(s);
        /* fall through */
    case M_KEY:
        if (is_ws(c)) return OAI_JSCAN_MORE;
        if (c != '"') return OAI_JSCAN_BAD;
        s->mode = M_STR;
        s->is_key = 1;
        s->key_len = 0;
        return OAI_JSCAN_MORE;
    case M_COLON:
        if (is_ws(c)) return OAI_JSCAN_MORE;
        if (c != ':') return OAI_JSCAN_BAD;
        s->mode = M_VALUE;
        return OAI_JSCAN_MORE;
    case M_AFTER:
        if (is_ws(c)) return OAI_JSCAN_MORE;
        if (c == ',') {
            s->mode = top_is_object(s) ? M_KEY : M_VALUE;
            return OAI_JSCAN_MORE;
        }
        if (c == (top_is_object(s) ? '}' : ']')) return pop(s);
        return OAI_JSCAN_BAD;
    case M_STR:
        return step_str(s, c);
    case M_ESC:
        if (c == 'u') {
            s->mode = M_HEX;
            s->hex_left = 4;
        } else if (c && strchr("\"\\/bfnrt", c)) {
            s->mode = M_STR;
        } else {
            return OAI_JSCAN_BAD;
        }
        if (s->is_key && s->depth == 1) s->key_len = UINT8_MAX; /* escaped: never tracked */
        return OAI_JSCAN_MORE;
    case M_HEX:
        if (!is_hex(c)) return OAI_JSCAN_BAD;
        if (--s->hex_left == 0) s->mode = M_STR;
        return OAI_JSCAN_MORE;
    case M_NUM:
        return step_num(s, c);
    case M_LIT:
        if (c != (unsigned char)s->lit[s->lit_pos]) return OAI_JSCAN_BAD;
        if (s->lit[++s->lit_pos] == '\0') value_end(s, s->pos + 1);
        return OAI_JSCAN_MORE;
    }
    DX_ASSERT(!"oai_jscan: unknown mode");
    return OAI_JSCAN_BAD;
}

int oai_jscan_byte(oai_jscan *s, unsigned char c)
{
    int rc = step(s, c);
    if (rc != OAI_JSCAN_BAD) s->pos++;
    return rc;
}

int oai_jscan_is_object(const char *p, size_t n)
{
    oai_jscan s;
    oai_jscan_init(&s);
    size_t i = 0;
    int rc = OAI_JSCAN_MORE;
    while (i < n && rc == OAI_JSCAN_MORE) rc = oai_jscan_byte(&s, (unsigned char)p[i++]);
    if (rc != OAI_JSCAN_DONE) return 0;
    while (i < n && is_ws((unsigned char)p[i])) i++;
    return i == n;
}

int oai_jscan_compact(const char *p, size_t n, dx_buf *out)
{
    int in_str = 0, esc = 0, rc = 0;
    size_t run = 0; /* start of the bytes not yet copied */
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char c = (unsigned char)p[i];
        if (in_str) {
            if (esc)
                esc = 0;
            else if (c == '\\')
                esc = 1;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (is_ws(c)) {
            rc = dx_buf_append(out, p + run, i - run);
            run = i + 1;
        }
    }
    return rc ? rc : dx_buf_append(out, p + run, n - run);
}

static unsigned hex4(const char *p)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = (unsigned char)p[i];
        v = v * 16 + (unsigned)(is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

/* The \u escape at p (6 bytes, and 6 more for a surrogate pair's second
 * half when it is there): code point and bytes used, or DX_NONE for a lone
 * surrogate. */
static long unicode_escape(const char *p, size_t left, size_t *used)
{
    unsigned hi = hex4(p + 2);
    *used = 6;
    if (hi < 0xd800 || hi > 0xdfff) return hi;
    if (hi > 0xdbff || left < 12 || p[6] != '\\' || p[7] != 'u') return DX_NONE;
    unsigned lo = hex4(p + 8);
    if (lo < 0xdc00 || lo > 0xdfff) return DX_NONE;
    *used = 12;
    return 0x10000 + ((long)(hi - 0xd800) << 10) + (lo - 0xdc00);
}

int oai_jscan_unquote(const char *p, size_t n, dx_buf *out)
{
    DX_ASSERT(n >= 2 && p[0] == '"' && p[n - 1] == '"');
    const char *e = p + n - 1;
    p++;
    int rc = 0;
    while (p < e && !rc) {
        const char *bs = memchr(p, '\\', (size_t)(e - p));
        size_t plain = bs ? (size_t)(bs - p) : (size_t)(e - p);
        rc = dx_buf_append(out, p, plain);
        p += plain;
        if (rc || p == e) break;
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *k = strchr(from, p[1]);
        if (p[1] != 'u') {
            DX_ASSERT(k && p[1]);
            rc = dx_buf_putc(out, to[k - from]);
            p += 2;
            continue;
        }
        size_t used;
        long cp = unicode_escape(p, (size_t)(e - p), &used);
        if (cp < 0) return dx_errf(DX_EFORMAT, "JSON string: lone surrogate \\u escape");
        rc = dx_utf8_put(out, (uint32_t)cp); /* cp <= U+10FFFF: a pair tops out there */
        p += used;
    }
    return rc;
}
