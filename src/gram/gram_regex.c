/* gram_regex: a JSON Schema `pattern` (an ECMA-262 regular expression) to
 * EBNF for the JSON string that holds a matching value.
 *
 * The subset: literals, escapes of punctuation, \d \w \s \D \W \S, '.',
 * classes [a-z] [^...] (with those escapes inside), groups (...) and (?:...),
 * '|', quantifiers * + ? {m} {m,} {m,n} (a lazy '?' after them changes
 * nothing here), '^' first and '$' last.  A pattern is a search (JSON
 * Schema): without '^' anything may come before, without '$' anything
 * after.  Anything else (backreferences, lookaround, \b, \p{...}) is
 * refused with its offset.
 *
 * The grammar writes the value as JSON text, so a '"' or '\' in the value is
 * written escaped, and it is sound rather than complete: it never writes a
 * string the pattern refuses, but writes some characters only one way (a
 * control character, matched by [^a] say, is never written; '.' and \s never
 * write an escape other than \" \\ \/ \b \f \r \t, \s only a space). */
#include <stdio.h>
#include <string.h>

#include "base/dx_err.h"
#include "base/dx_utf8.h"
#include "gram/gram_priv.h"

#define RX_MAX_DEPTH 64

typedef struct {
    const char *s;
    size_t len, pos;
    const char *p; /* rule prefix */
    dx_buf *out;
    int depth;
} rx;

static int rx_err(const rx *r, const char *what)
{
    return dx_errf(DX_EINVAL, "pattern: %s at offset %zu", what, r->pos);
}

static int rx_put(rx *r, const char *s)
{
    int rc = dx_buf_puts(r->out, s);
    return rc == DX_ETOOBIG ? dx_errf(DX_EINVAL, "pattern: its grammar is too large")
           : rc             ? dx_errf(DX_ENOMEM, "pattern: out of memory")
                            : 0;
}

static int rx_putf(rx *r, const char *fmt, unsigned a, unsigned b)
{
    char t[64];
    snprintf(t, sizeof t, fmt, a, b);
    return rx_put(r, t);
}

/* One code point of the pattern (UTF-8, strict). */
static int rx_cp(rx *r, uint32_t *cp)
{
    size_t n = dx_utf8_decode((const uint8_t *)r->s + r->pos, r->len - r->pos, cp);
    if (!n) return rx_err(r, "invalid UTF-8");
    r->pos += n;
    return 0;
}

/* The JSON text of code point c as an EBNF literal ("\"" for '"'). */
static int rx_lit(rx *r, uint32_t c)
{
    if (c == '"') return rx_put(r, "\"\\\\\\\"\"");
    if (c == '\\') return rx_put(r, "\"\\\\\\\\\"");
    if (c < 0x20) return rx_putf(r, "\"\\\\u%04x\"", c, 0);
    return rx_putf(r, "\"\\U%08X\"", c, 0);
}

/* Ranges of a class, as [lo, hi] pairs. */
typedef struct {
    uint32_t r[2 * 128];
    unsigned n;
} rx_set;

static int set_add(rx *r, rx_set *s, uint32_t lo, uint32_t hi)
{
    if (s->n >= 128) return rx_err(r, "character class with over 128 ranges");
    s->r[2 * s->n] = lo;
    s->r[2 * s->n + 1] = hi;
    s->n++;
    return 0;
}

/* \d \w \s into a set; 1 if c is one of them (upper case: negated, *neg set). */
static int class_escape(rx *r, char c, rx_set *s, int *neg)
{
    char l = (char)(c | 0x20);
    if (l != 'd' && l != 'w' && l != 's') return 0;
    *neg = c != l;
    int rc = 0;
    if (l == 'd') rc = set_add(r, s, '0', '9');
    if (l == 'w')
        rc = set_add(r, s, '0', '9') || set_add(r, s, 'a', 'z') || set_add(r, s, 'A', 'Z') ||
             set_add(r, s, '_', '_');
    if (l == 's') rc = set_add(r, s, ' ', ' ');
    return rc ? rc : 1;
}

/* Writes a class: the characters of s (or all but them, neg) that JSON
 * writes as themselves in one EBNF class, then '"' and '\' as their
 * escapes when the class has them; control characters are left out. */
static int put_set(rx *r, const rx_set *s, int neg)
{
    int has_q = 0, has_bs = 0, rc = rx_put(r, neg ? "([^\\x00-\\x1F\"\\\\" : "([");
    for (unsigned i = 0; i < s->n && !rc; i++) {
        uint32_t lo = s->r[2 * i], hi = s->r[2 * i + 1];
        has_q |= lo <= '"' && '"' <= hi;
        has_bs |= lo <= '\\' && '\\' <= hi;
        if (neg) {
            rc = rx_putf(r, "\\U%08X-\\U%08X", lo, hi);
            continue;
        }
        if (lo < 0x20) lo = 0x20;
        static const uint32_t cut[2] = {'"', '\\'};
        for (int k = 0; k < 2 && lo <= hi && !rc; k++) {
            if (cut[k] < lo || cut[k] > hi) continue;
            if (cut[k] > lo) rc = rx_putf(r, "\\U%08X-\\U%08X", lo, cut[k] - 1);
            lo = cut[k] + 1;
        }
        if (!rc && lo <= hi) rc = rx_putf(r, "\\U%08X-\\U%08X", lo, hi);
    }
    if (!rc) rc = rx_put(r, "]");
    if (!rc && (neg ? !has_q : has_q)) rc = rx_put(r, " | \"\\\\\\\"\"");
    if (!rc && (neg ? !has_bs : has_bs)) rc = rx_put(r, " | \"\\\\\\\\\"");
    return rc ? rc : rx_put(r, ")");
}

static int parse_class(rx *r)
{
    rx_set s = {.n = 0};
    int neg = 0;
    r->pos++;
    if (r->pos < r->len && r->s[r->pos] == '^') neg = 1, r->pos++;
    int first = 1;
    while (r->pos < r->len && (r->s[r->pos] != ']' || first)) {
        first = 0;
        uint32_t lo, hi;
        int rc;
        if (r->s[r->pos] == '\\') {
            if (r->pos + 1 >= r->len) return rx_err(r, "unfinished escape");
            char e = r->s[r->pos + 1];
            int eneg;
            if ((rc = class_escape(r, e, &s, &eneg))) {
                if (rc < 0) return rc;
                if (eneg) return rx_err(r, "\\D \\W \\S inside a class are not supported");
                r->pos += 2;
                continue;
            }
            if (e == 'n' || e == 't' || e == 'r' || e == 'f' || e == 'v' || e == '0') {
                lo = e == 'n'   ? '\n'
                     : e == 't' ? '\t'
                     : e == 'r' ? '\r'
                     : e == 'f' ? '\f'
                     : e == 'v' ? '\v'
                                : 0;
                r->pos += 2;
            } else if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
                return rx_err(r, "unsupported escape in a class");
            } else {
                r->pos++;
                if ((rc = rx_cp(r, &lo))) return rc;
            }
        } else if ((rc = rx_cp(r, &lo))) {
            return rc;
        }
        hi = lo;
        if (r->pos + 1 < r->len && r->s[r->pos] == '-' && r->s[r->pos + 1] != ']') {
            r->pos++;
            if (r->s[r->pos] == '\\') return rx_err(r, "escape as a range end is not supported");
            if ((rc = rx_cp(r, &hi))) return rc;
            if (hi < lo) return rx_err(r, "range out of order");
        }
        if ((rc = set_add(r, &s, lo, hi))) return rc;
    }
    if (r->pos >= r->len) return rx_err(r, "unterminated class");
    r->pos++;
    return put_set(r, &s, neg);
}

static int parse_alt(rx *r);

static int parse_atom(rx *r)
{
    char c = r->s[r->pos];
    int rc;
    if (c == '(') {
        if (++r->depth > RX_MAX_DEPTH) return rx_err(r, "groups nested too deep");
        r->pos++;
        if (r->pos + 1 < r->len && r->s[r->pos] == '?') {
            if (r->s[r->pos + 1] != ':')
                return rx_err(r, "lookaround and named groups are not supported");
            r->pos += 2;
        }
        if ((rc = rx_put(r, "(")) || (rc = parse_alt(r))) return rc;
        if (r->pos >= r->len || r->s[r->pos] != ')') return rx_err(r, "unclosed group");
        r->pos++;
        r->depth--;
        return rx_put(r, ")");
    }
    if (c == '[') return parse_class(r);
    if (c == '.') {
        r->pos++;
        return rx_put(r, "([^\\x00-\\x1F\"\\\\] | \"\\\\\" [\"\\\\/bfrt])");
    }
    if (c == '^' || c == '$') return rx_err(r, "'^' or '$' inside the pattern is not supported");
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return rx_err(r, "quantifier without an item");
    if (c == '\\') {
        if (r->pos + 1 >= r->len) return rx_err(r, "unfinished escape");
        char e = r->s[r->pos + 1];
        rx_set s = {.n = 0};
        int neg;
        if ((rc = class_escape(r, e, &s, &neg))) {
            if (rc < 0) return rc;
            r->pos += 2;
            return put_set(r, &s, neg);
        }
        if (e == 'n' || e == 't' || e == 'r' || e == 'f') {
            r->pos += 2;
            return rx_lit(r, e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : '\f');
        }
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
            return rx_err(r, "unsupported escape (backreference, \\b, \\p, \\u ...)");
        r->pos++;
    }
    uint32_t cp;
    if ((rc = rx_cp(r, &cp))) return rc;
    return rx_lit(r, cp);
}

static int read_num(rx *r, unsigned *v)
{
    unsigned x = 0, digits = 0;
    while (r->pos < r->len && r->s[r->pos] >= '0' && r->s[r->pos] <= '9') {
        x = x * 10 + (unsigned)(r->s[r->pos++] - '0');
        if (x > GRAM_MAX_REPEAT) return rx_err(r, "repetition count over 10000");
        digits++;
    }
    if (!digits) return rx_err(r, "expected a number in { }");
    *v = x;
    return 0;
}

static int parse_quant(rx *r)
{
    if (r->pos >= r->len) return 0;
    char c = r->s[r->pos];
    int rc = 0;
    if (c == '*' || c == '+' || c == '?') {
        char q[2] = {c, 0};
        r->pos++;
        rc = rx_put(r, q);
    } else if (c == '{') {
        unsigned m, n;
        r->pos++;
        if ((rc = read_num(r, &m))) return rc;
        n = m;
        if (r->pos < r->len && r->s[r->pos] == ',') {
            r->pos++;
            n = UINT32_MAX;
            if (r->pos < r->len && r->s[r->pos] != '}' && (rc = read_num(r, &n))) return rc;
        }
        if (r->pos >= r->len || r->s[r->pos] != '}') return rx_err(r, "expected '}'");
        r->pos++;
        if (n < m) return rx_err(r, "{m,n} with n below m");
        rc = n == UINT32_MAX ? rx_putf(r, "{%u,}", m, 0) : rx_putf(r, "{%u,%u}", m, n);
    } else {
        return 0;
    }
    if (!rc && r->pos < r->len && r->s[r->pos] == '?') r->pos++; /* lazy: same language */
    if (!rc && r->pos < r->len &&
        (r->s[r->pos] == '*' || r->s[r->pos] == '+' || r->s[r->pos] == '?' || r->s[r->pos] == '{'))
        return rx_err(r, "quantifier after a quantifier");
    return rc;
}

static int at_end(const rx *r)
{
    return r->pos >= r->len;
}

static int parse_seq(rx *r)
{
    int rc = rx_put(r, "(\"\"");
    while (!rc && !at_end(r) && r->s[r->pos] != '|' && r->s[r->pos] != ')') {
        if ((rc = rx_put(r, " ("))) return rc;
        if ((rc = parse_atom(r)) || (rc = rx_put(r, ")")) || (rc = parse_quant(r))) return rc;
    }
    return rc ? rc : rx_put(r, ")");
}

static int parse_alt(rx *r)
{
    int rc = parse_seq(r);
    while (!rc && !at_end(r) && r->s[r->pos] == '|') {
        r->pos++;
        if (!(rc = rx_put(r, " | "))) rc = parse_seq(r);
    }
    return rc;
}

int gram_regex_to_ebnf(const char *re, size_t len, const char *prefix, dx_buf *out)
{
    rx r = {.s = re, .len = len, .p = prefix, .out = out};
    int anchored_start = len && re[0] == '^', anchored_end = 0;
    if (anchored_start) r.pos = 1;
    if (len > r.pos && re[len - 1] == '$') {
        size_t bs = 0; /* '$' escaped by an odd number of backslashes is a literal */
        while (bs + 1 < len && re[len - 2 - bs] == '\\') bs++;
        if (!(bs & 1)) anchored_end = 1, r.len = len - 1;
    }
    char any[80];
    snprintf(any, sizeof any, " %schar* ", prefix);
    int rc = rx_put(&r, "\"\\\"\" (");
    if (!rc && !anchored_start) rc = rx_put(&r, any);
    if (!rc) rc = rx_put(&r, "(");
    if (!rc) rc = parse_alt(&r);
    if (!rc && !at_end(&r)) rc = rx_err(&r, "unmatched ')'");
    if (!rc) rc = rx_put(&r, ")");
    if (!rc && !anchored_end) rc = rx_put(&r, any);
    return rc ? rc : rx_put(&r, ") \"\\\"\"");
}
