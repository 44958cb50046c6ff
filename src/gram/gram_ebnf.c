/* gram_ebnf: the EBNF (GBNF-compatible) parser and the checks that make a
 * grammar safe to match.
 *
 * Parsing writes each rule's alternatives as element runs; a group, and any
 * repeated item longer than one element, becomes a generated rule, so that
 * x{m,n} costs m + (n-m) small rules and nested repetitions add up instead
 * of multiplying.  Repetition is right recursion (R ::= x R | ""), which the
 * matcher runs without growing its stack (a call in last position pushes no
 * return address).
 *
 * After parsing, three linear passes make matching total: rules that derive
 * no finite string are dropped with every alternative using them (so the
 * matcher never walks into a dead end; a root that derives nothing is an
 * error), nullable rules are found, and left recursion (a rule reaching
 * itself without consuming input, which would make the matcher's expansion
 * infinite) is refused with the place it starts.  Everything is bounded by
 * the GRAM_MAX_* limits; recursion in the parser is bounded by
 * GRAM_MAX_NEST. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"
#include "gram/gram_priv.h"

typedef struct {
    uint32_t *e;
    uint32_t n, cap;
} evec;

typedef struct {
    evec body;        /* alternatives, each closed by GE_END */
    const char *name; /* NULL: generated */
    uint32_t name_len;
    uint32_t pos; /* source offset of the definition (or first use) */
    int defined;
} prule;

typedef struct {
    const char *src;
    size_t len, pos;
    prule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *ht; /* name hash: rule id + 1, 0 = empty */
    uint32_t ht_cap;
    uint32_t *ranges; /* pairs */
    uint32_t n_ranges, cap_ranges;
    uint32_t *set_off;
    uint32_t n_sets, cap_sets;
    uint64_t n_elems; /* all rules together */
    unsigned depth;
} pst;

/* ---- errors ---------------------------------------------------------------- */

static void line_col(const char *s, size_t pos, unsigned *line, unsigned *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (s[i] == '\n') {
            ++*line;
            *col = 1;
        } else if (((unsigned char)s[i] & 0xc0) != 0x80) {
            ++*col;
        }
    }
}

__attribute__((format(printf, 3, 4))) static int perr(const pst *p, size_t pos, const char *fmt,
                                                      ...)
{
    unsigned line, col;
    line_col(p->src, pos > p->len ? p->len : pos, &line, &col);
    char where[64];
    snprintf(where, sizeof where, "grammar: line %u col %u", line, col);
    va_list ap;
    va_start(ap, fmt);
    int rc = dx_verrp(DX_EINVAL, where, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- growing arrays ---------------------------------------------------------- */

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elsz)
{
    if (need <= *cap) return 0;
    uint32_t nc = *cap ? *cap : 16;
    while (nc < need) nc = nc > UINT32_MAX / 2 ? need : nc * 2;
    void *q = dx_realloc(*p, (size_t)nc * elsz);
    if (!q) return dx_errf(DX_ENOMEM, "grammar: out of memory");
    *p = q;
    *cap = nc;
    return 0;
}

static int emit(pst *p, uint32_t rule, uint32_t el)
{
    if (++p->n_elems > GRAM_MAX_ELEMS)
        return perr(p, p->pos, "grammar too large (over %u elements after expansion)",
                    GRAM_MAX_ELEMS);
    evec *v = &p->rules[rule].body;
    int rc = grow((void **)&v->e, &v->cap, v->n + 1, sizeof *v->e);
    if (rc) return rc;
    v->e[v->n++] = el;
    return 0;
}

static int new_rule(pst *p, size_t pos, uint32_t *out)
{
    if (p->n_rules >= GRAM_MAX_RULES)
        return perr(p, pos, "too many rules (over %u after expansion)", GRAM_MAX_RULES);
    int rc = grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof *p->rules);
    if (rc) return rc;
    p->rules[p->n_rules] = (prule){.pos = (uint32_t)pos, .defined = 1};
    *out = p->n_rules++;
    return 0;
}

/* ---- names ----------------------------------------------------------------- */

static uint32_t name_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static int ht_grow(pst *p)
{
    uint32_t nc = p->ht_cap ? p->ht_cap * 2 : 256;
    uint32_t *t = dx_calloc(nc, sizeof *t);
    if (!t) return dx_errf(DX_ENOMEM, "grammar: out of memory");
    for (uint32_t r = 0; r < p->n_rules; r++) {
        if (!p->rules[r].name) continue;
        uint32_t i = name_hash(p->rules[r].name, p->rules[r].name_len) & (nc - 1);
        while (t[i]) i = (i + 1) & (nc - 1);
        t[i] = r + 1;
    }
    dx_free(p->ht);
    p->ht = t;
    p->ht_cap = nc;
    return 0;
}

/* The rule named s[0..n), created undefined at pos if new. */
static int lookup(pst *p, const char *s, size_t n, size_t pos, uint32_t *out)
{
    if (p->n_rules * 2 + 2 > p->ht_cap) {
        int rc = ht_grow(p);
        if (rc) return rc;
    }
    uint32_t i = name_hash(s, n) & (p->ht_cap - 1);
    for (; p->ht[i]; i = (i + 1) & (p->ht_cap - 1)) {
        prule *r = &p->rules[p->ht[i] - 1];
        if (r->name_len == n && !memcmp(r->name, s, n)) {
            *out = p->ht[i] - 1;
            return 0;
        }
    }
    int rc = new_rule(p, pos, out);
    if (rc) return rc;
    p->rules[*out].name = s;
    p->rules[*out].name_len = (uint32_t)n;
    p->rules[*out].defined = 0;
    p->ht[i] = *out + 1;
    return 0;
}

/* ---- lexing ---------------------------------------------------------------- */

static void skip_ws(pst *p)
{
    while (p->pos < p->len) {
        char c = p->src[p->pos];
        if (c == '#') {
            while (p->pos < p->len && p->src[p->pos] != '\n') p->pos++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->pos++;
        } else {
            break;
        }
    }
}

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
}

static size_t name_len_at(const pst *p, size_t pos)
{
    size_t n = 0;
    /* '.' alone is "any character"; inside a name it is allowed (a.b) */
    while (pos + n < p->len && is_name_char(p->src[pos + n]) && (p->src[pos + n] != '.' || n)) n++;
    return n;
}

/* Whether a rule definition (name ::=) starts at pos. */
static int at_definition(const pst *p, size_t pos)
{
    size_t n = name_len_at(p, pos);
    if (!n) return 0;
    pst q = *p;
    q.pos = pos + n;
    skip_ws(&q);
    return q.len - q.pos >= 3 && !memcmp(q.src + q.pos, "::=", 3);
}

/* A hex digit's value; DX_NONE for another character. */
static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return DX_NONE;
}

/* Decodes one UTF-8 code point at p->pos (strict). */
static int read_utf8(pst *p, uint32_t *cp)
{
    size_t n = dx_utf8_decode((const uint8_t *)p->src + p->pos, p->len - p->pos, cp);
    if (!n) return perr(p, p->pos, "invalid UTF-8");
    p->pos += n;
    return 0;
}

/* One character of a literal or class, escapes decoded. */
static int read_char(pst *p, uint32_t *cp)
{
    if (p->pos >= p->len) return perr(p, p->pos, "unexpected end of grammar");
    if (p->src[p->pos] != '\\') return read_utf8(p, cp);
    size_t at = p->pos;
    if (p->pos + 1 >= p->len) return perr(p, at, "unfinished escape");
    char e = p->src[p->pos + 1];
    p->pos += 2;
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = p->pos < p->len ? hexval(p->src[p->pos]) : DX_NONE;
            if (h < 0) return perr(p, at, "\\%c needs %d hex digits", e, digits);
            v = v << 4 | (uint32_t)h;
            p->pos++;
        }
        if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
            return perr(p, at, "escape names no Unicode scalar value (U+%X)", v);
        *cp = v;
        return 0;
    }
    switch (e) {
    case 'n':
        *cp = '\n';
        return 0;
    case 'r':
        *cp = '\r';
        return 0;
    case 't':
        *cp = '\t';
        return 0;
    case '0':
        *cp = 0;
        return 0;
    case '\\':
    case '"':
    case '\'':
    case '[':
    case ']':
    case '-':
    case '^':
    case '/':
    case '.':
    case '(':
    case ')':
    case '|':
    case '*':
    case '+':
    case '?':
    case '{':
    case '}':
        *cp = (uint32_t)e;
        return 0;
    default:
        return perr(p, at,
                    "unknown escape '\\%c' (known: \\n \\r \\t \\0 \\xHH \\uHHHH "
                    "\\UHHHHHHHH and \\ before a punctuation character)",
                    e);
    }
}

/* ---- character sets ---------------------------------------------------------- */

static int cmp_range(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static int add_range(pst *p, uint32_t lo, uint32_t hi)
{
    int rc = grow((void **)&p->ranges, &p->cap_ranges, p->n_ranges * 2 + 2, 2 * sizeof(uint32_t));
    if (rc) return rc;
    p->ranges[p->n_ranges * 2] = lo;
    p->ranges[p->n_ranges * 2 + 1] = hi;
    p->n_ranges++;
    return 0;
}

/* Turns ranges[from..] into a set: sorted, merged, negated if asked, without
 * surrogates (which UTF-8 cannot carry). */
static int finish_set(pst *p, uint32_t from, int negate, uint32_t *out)
{
    uint32_t n = p->n_ranges - from, *r = p->ranges + 2 * from, m = 0;
    if (n > 1) qsort(r, n, 2 * sizeof *r, cmp_range);
    for (uint32_t i = 0; i < n; i++) {
        if (m && r[2 * i] <= r[2 * (m - 1) + 1] + 1) {
            if (r[2 * i + 1] > r[2 * (m - 1) + 1]) r[2 * (m - 1) + 1] = r[2 * i + 1];
        } else {
            r[2 * m] = r[2 * i];
            r[2 * m + 1] = r[2 * i + 1];
            m++;
        }
    }
    p->n_ranges = from + m;
    if (negate) {
        uint32_t tmp[2 * 64], *neg = NULL, nn = 0, next = 0;
        neg = m + 1 <= 64 ? tmp : dx_malloc((size_t)(m + 1) * 2 * sizeof *neg);
        if (!neg) return dx_errf(DX_ENOMEM, "grammar: out of memory");
        r = p->ranges + 2 * from;
        for (uint32_t i = 0; i < m; i++) {
            if (r[2 * i] > next) neg[2 * nn] = next, neg[2 * nn + 1] = r[2 * i] - 1, nn++;
            next = r[2 * i + 1] + 1;
        }
        if (next <= 0x10ffff) neg[2 * nn] = next, neg[2 * nn + 1] = 0x10ffff, nn++;
        p->n_ranges = from;
        int rc = 0;
        for (uint32_t i = 0; i < nn && !rc; i++) rc = add_range(p, neg[2 * i], neg[2 * i + 1]);
        if (neg != tmp) dx_free(neg);
        if (rc) return rc;
        m = nn;
    }
    /* cut out the surrogates */
    uint32_t end = p->n_ranges;
    for (uint32_t i = from; i < end; i++) {
        uint32_t lo = p->ranges[2 * i], hi = p->ranges[2 * i + 1];
        if (hi < 0xd800 || lo > 0xdfff) continue;
        if (lo < 0xd800 && hi > 0xdfff) {
            p->ranges[2 * i + 1] = 0xd7ff;
            int rc = add_range(p, 0xe000, hi);
            if (rc) return rc;
        } else if (lo < 0xd800) {
            p->ranges[2 * i + 1] = 0xd7ff;
        } else if (hi > 0xdfff) {
            p->ranges[2 * i] = 0xe000;
        } else {
            p->ranges[2 * i] = 1, p->ranges[2 * i + 1] = 0; /* empty: dropped below */
        }
    }
    uint32_t k = from;
    for (uint32_t i = from; i < p->n_ranges; i++)
        if (p->ranges[2 * i] <= p->ranges[2 * i + 1]) {
            p->ranges[2 * k] = p->ranges[2 * i];
            p->ranges[2 * k + 1] = p->ranges[2 * i + 1];
            k++;
        }
    p->n_ranges = k;
    if (k - from > 1) qsort(p->ranges + 2 * from, k - from, 2 * sizeof *p->ranges, cmp_range);
    int rc = grow((void **)&p->set_off, &p->cap_sets, p->n_sets + 2, sizeof *p->set_off);
    if (rc) return rc;
    if (p->n_sets == 0) p->set_off[0] = 0;
    DX_ASSERT(p->set_off[p->n_sets] == from);
    p->set_off[++p->n_sets] = p->n_ranges;
    *out = p->n_sets - 1;
    return 0;
}

static int parse_class(pst *p, uint32_t *set)
{
    size_t at = p->pos++;
    int neg = p->pos < p->len && p->src[p->pos] == '^';
    if (neg) p->pos++;
    uint32_t from = p->n_ranges;
    for (;;) {
        if (p->pos >= p->len) return perr(p, at, "unterminated character class");
        if (p->src[p->pos] == ']') break;
        uint32_t lo, hi;
        int rc = read_char(p, &lo);
        if (rc) return rc;
        hi = lo;
        if (p->pos + 1 < p->len && p->src[p->pos] == '-' && p->src[p->pos + 1] != ']') {
            p->pos++;
            size_t hat = p->pos;
            if ((rc = read_char(p, &hi))) return rc;
            if (hi < lo) return perr(p, hat, "range end U+%X below its start U+%X", hi, lo);
        }
        if ((rc = add_range(p, lo, hi))) return rc;
    }
    p->pos++;
    return finish_set(p, from, neg, set);
}

/* ---- grammar ------------------------------------------------------------------ */

static int parse_alts(pst *p, uint32_t rule);

/* Moves body[start..] of rule into a new rule; leaves one REF in its place. */
static int wrap_tail(pst *p, uint32_t rule, uint32_t start, size_t pos)
{
    uint32_t g;
    int rc = new_rule(p, pos, &g);
    if (rc) return rc;
    evec *v = &p->rules[rule].body;
    uint32_t n = v->n - start;
    evec *w = &p->rules[g].body;
    if ((rc = grow((void **)&w->e, &w->cap, n + 1, sizeof *w->e))) return rc;
    v = &p->rules[rule].body; /* grow may not move it, but new_rule may have */
    if (n) memcpy(w->e, v->e + start, n * sizeof *w->e);
    w->e[n] = GE_MAKE(GE_END, 0);
    w->n = n + 1;
    p->n_elems += 1;
    v->n = start;
    return emit(p, rule, GE_MAKE(GE_REF, g));
}

/* Replaces the single element at body[start] by x{m,n} (n = UINT32_MAX: no
 * upper bound). */
static int repeat(pst *p, uint32_t rule, uint32_t start, uint32_t m, uint32_t n, size_t pos)
{
    uint32_t x = p->rules[rule].body.e[start];
    p->rules[rule].body.n = start;
    p->n_elems--;
    int rc = 0;
    for (uint32_t i = 0; i < m && !rc; i++) rc = emit(p, rule, x);
    if (rc) return rc;
    if (n == UINT32_MAX) { /* R ::= x R | "" */
        uint32_t r;
        if ((rc = new_rule(p, pos, &r))) return rc;
        if ((rc = emit(p, r, x)) || (rc = emit(p, r, GE_MAKE(GE_REF, r))) ||
            (rc = emit(p, r, GE_MAKE(GE_END, 0))) || (rc = emit(p, r, GE_MAKE(GE_END, 0))))
            return rc;
        return emit(p, rule, GE_MAKE(GE_REF, r));
    }
    if (n == m) return 0;
    /* R1 ::= x R2 | "" ... Rk ::= x | "", built innermost first */
    uint32_t next = UINT32_MAX;
    for (uint32_t k = n - m; k > 0; k--) {
        uint32_t r;
        if ((rc = new_rule(p, pos, &r)) || (rc = emit(p, r, x))) return rc;
        if (next != UINT32_MAX && (rc = emit(p, r, GE_MAKE(GE_REF, next)))) return rc;
        if ((rc = emit(p, r, GE_MAKE(GE_END, 0))) || (rc = emit(p, r, GE_MAKE(GE_END, 0))))
            return rc;
        next = r;
    }
    return emit(p, rule, GE_MAKE(GE_REF, next));
}

static int read_uint(pst *p, uint32_t *v)
{
    size_t at = p->pos;
    uint64_t x = 0;
    if (p->pos >= p->len || p->src[p->pos] < '0' || p->src[p->pos] > '9')
        return perr(p, at, "expected a number in { }");
    while (p->pos < p->len && p->src[p->pos] >= '0' && p->src[p->pos] <= '9') {
        x = x * 10 + (uint64_t)(p->src[p->pos++] - '0');
        if (x > GRAM_MAX_REPEAT) return perr(p, at, "repetition count over %u", GRAM_MAX_REPEAT);
    }
    *v = (uint32_t)x;
    return 0;
}

/* Parses {m}, {m,}, {m,n} (p->pos at '{'). */
static int parse_braces(pst *p, uint32_t *m, uint32_t *n)
{
    size_t at = p->pos++;
    skip_ws(p);
    int rc = read_uint(p, m);
    if (rc) return rc;
    skip_ws(p);
    *n = *m;
    if (p->pos < p->len && p->src[p->pos] == ',') {
        p->pos++;
        skip_ws(p);
        *n = UINT32_MAX;
        if (p->pos < p->len && p->src[p->pos] != '}') {
            if ((rc = read_uint(p, n))) return rc;
            skip_ws(p);
            if (*n < *m) return perr(p, at, "{%u,%u}: maximum below minimum", *m, *n);
        }
    }
    if (p->pos >= p->len || p->src[p->pos] != '}') return perr(p, at, "expected '}'");
    p->pos++;
    return 0;
}

static int parse_primary(pst *p, uint32_t rule)
{
    size_t at = p->pos;
    char c = p->src[p->pos];
    int rc;
    if (c == '"') {
        p->pos++;
        for (;;) {
            if (p->pos >= p->len) return perr(p, at, "unterminated string literal");
            if (p->src[p->pos] == '"') break;
            uint32_t cp;
            if ((rc = read_char(p, &cp)) || (rc = emit(p, rule, GE_MAKE(GE_LIT, cp)))) return rc;
        }
        p->pos++;
        return 0;
    }
    if (c == '[' || c == '.') {
        uint32_t set;
        if (c == '[') {
            if ((rc = parse_class(p, &set))) return rc;
        } else {
            p->pos++;
            if ((rc = add_range(p, 0, 0x10ffff)) || (rc = finish_set(p, p->n_ranges - 1, 0, &set)))
                return rc;
        }
        return emit(p, rule, GE_MAKE(GE_SET, set));
    }
    if (c == '(') {
        if (++p->depth > GRAM_MAX_NEST) return perr(p, at, "nesting deeper than %u", GRAM_MAX_NEST);
        p->pos++;
        uint32_t g;
        if ((rc = new_rule(p, at, &g)) || (rc = parse_alts(p, g))) return rc;
        skip_ws(p);
        if (p->pos >= p->len || p->src[p->pos] != ')') return perr(p, at, "unclosed '('");
        p->pos++;
        p->depth--;
        return emit(p, rule, GE_MAKE(GE_REF, g));
    }
    size_t n = name_len_at(p, p->pos);
    if (!n) return perr(p, at, "unexpected character '%c'", c);
    uint32_t r;
    if ((rc = lookup(p, p->src + p->pos, n, at, &r))) return rc;
    p->pos += n;
    return emit(p, rule, GE_MAKE(GE_REF, r));
}

static int parse_item(pst *p, uint32_t rule)
{
    uint32_t start = p->rules[rule].body.n;
    int rc = parse_primary(p, rule);
    if (rc) return rc;
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len) return 0;
        size_t at = p->pos;
        char c = p->src[p->pos];
        uint32_t m, n;
        if (c == '*' || c == '+' || c == '?') {
            m = c == '+';
            n = c == '?' ? 1 : UINT32_MAX;
            p->pos++;
        } else if (c == '{') {
            if ((rc = parse_braces(p, &m, &n))) return rc;
        } else {
            return 0;
        }
        if (p->rules[rule].body.n - start != 1 && (rc = wrap_tail(p, rule, start, at))) return rc;
        if ((rc = repeat(p, rule, start, m, n, at))) return rc;
    }
}

static int parse_seq(pst *p, uint32_t rule)
{
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len) break;
        char c = p->src[p->pos];
        if (c == '|' || c == ')' || at_definition(p, p->pos)) break;
        int rc = parse_item(p, rule);
        if (rc) return rc;
    }
    return emit(p, rule, GE_MAKE(GE_END, 0));
}

static int parse_alts(pst *p, uint32_t rule)
{
    for (;;) {
        int rc = parse_seq(p, rule);
        if (rc) return rc;
        if (p->pos >= p->len || p->src[p->pos] != '|') return 0;
        p->pos++;
    }
}

static int parse_grammar(pst *p)
{
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len) return 0;
        size_t at = p->pos, n = name_len_at(p, p->pos);
        if (!n || !at_definition(p, at)) return perr(p, at, "expected a rule 'name ::= ...'");
        uint32_t r;
        int rc = lookup(p, p->src + at, n, at, &r);
        if (rc) return rc;
        if (p->rules[r].defined) {
            unsigned l, c;
            line_col(p->src, p->rules[r].pos, &l, &c);
            return perr(p, at, "rule '%.*s' defined twice (first at line %u col %u)", (int)n,
                        p->src + at, l, c);
        }
        p->rules[r].defined = 1;
        p->rules[r].pos = (uint32_t)at;
        p->pos = at + n;
        skip_ws(p);
        p->pos += 3;
        if ((rc = parse_alts(p, r))) return rc;
        if (p->pos < p->len && p->src[p->pos] == ')') return perr(p, p->pos, "unmatched ')'");
    }
}

/* ---- checks ------------------------------------------------------------------- */

typedef struct {
    uint32_t *alt_rule;      /* rule of each alternative */
    uint32_t *need;          /* per alternative: references not yet known productive / nullable */
    uint32_t *occ_off, *occ; /* rule -> alternatives referencing it (one entry per occurrence) */
    uint32_t *queue;
    uint8_t *flag; /* per rule */
} chk;

static void chk_free(chk *c)
{
    dx_free(c->alt_rule);
    dx_free(c->need);
    dx_free(c->occ_off);
    dx_free(c->occ);
    dx_free(c->queue);
    dx_free(c->flag);
}

static uint32_t alt_len(const gram *g, uint32_t a)
{
    uint32_t i = g->alts[a];
    while (GE_TYPE(g->elems[i]) != GE_END) i++;
    return i - g->alts[a];
}

/* Worklist fixpoint over rules: a rule gets the flag when one alternative
 * has all its references flagged and (for `productive`) no empty set, (for
 * nullable) no terminal at all.  Linear in the grammar's size. */
static int fixpoint(const gram *g, chk *c, int nullable)
{
    uint32_t n_alts = g->alt_off[g->n_rules], qh = 0, qt = 0;
    memset(c->flag, 0, g->n_rules);
    for (uint32_t a = 0; a < n_alts; a++) {
        uint32_t need = 0, len = alt_len(g, a);
        for (uint32_t k = 0; k < len; k++) {
            uint32_t e = g->elems[g->alts[a] + k];
            if (GE_TYPE(e) == GE_REF)
                need++;
            else if (nullable ||
                     (GE_TYPE(e) == GE_SET && g->set_off[GE_VAL(e)] == g->set_off[GE_VAL(e) + 1]))
                need = UINT32_MAX / 2;
        }
        c->need[a] = need;
        if (!need && !c->flag[c->alt_rule[a]]) {
            c->flag[c->alt_rule[a]] = 1;
            c->queue[qt++] = c->alt_rule[a];
        }
    }
    while (qh < qt) {
        uint32_t r = c->queue[qh++];
        for (uint32_t i = c->occ_off[r]; i < c->occ_off[r + 1]; i++) {
            uint32_t a = c->occ[i];
            if (--c->need[a] == 0 && !c->flag[c->alt_rule[a]]) {
                c->flag[c->alt_rule[a]] = 1;
                c->queue[qt++] = c->alt_rule[a];
            }
        }
    }
    return 0;
}

static int chk_init(const gram *g, chk *c)
{
    uint32_t n_alts = g->alt_off[g->n_rules];
    memset(c, 0, sizeof *c);
    c->alt_rule = dx_calloc(n_alts + 1, sizeof *c->alt_rule);
    c->need = dx_calloc(n_alts + 1, sizeof *c->need);
    c->occ_off = dx_calloc(g->n_rules + 2, sizeof *c->occ_off);
    c->queue = dx_calloc(g->n_rules + 1, sizeof *c->queue);
    c->flag = dx_calloc(g->n_rules + 1, 1);
    if (!c->alt_rule || !c->need || !c->occ_off || !c->queue || !c->flag)
        return dx_errf(DX_ENOMEM, "grammar: out of memory");
    uint32_t n_occ = 0;
    for (uint32_t r = 0; r < g->n_rules; r++)
        for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
            c->alt_rule[a] = r;
            for (uint32_t i = g->alts[a]; GE_TYPE(g->elems[i]) != GE_END; i++)
                if (GE_TYPE(g->elems[i]) == GE_REF) c->occ_off[GE_VAL(g->elems[i]) + 1]++, n_occ++;
        }
    for (uint32_t r = 0; r < g->n_rules; r++) c->occ_off[r + 1] += c->occ_off[r];
    c->occ = dx_calloc(n_occ + 1, sizeof *c->occ);
    uint32_t *fill = dx_calloc(g->n_rules + 1, sizeof *fill);
    if (!c->occ || !fill) {
        dx_free(fill);
        return dx_errf(DX_ENOMEM, "grammar: out of memory");
    }
    for (uint32_t a = 0; a < n_alts; a++)
        for (uint32_t i = g->alts[a]; GE_TYPE(g->elems[i]) != GE_END; i++)
            if (GE_TYPE(g->elems[i]) == GE_REF) {
                uint32_t r = GE_VAL(g->elems[i]);
                c->occ[c->occ_off[r] + fill[r]++] = a;
            }
    dx_free(fill);
    return 0;
}

/* Drops alternatives that use a rule deriving no finite string. */
static void drop_unproductive(gram *g, const uint8_t *prod)
{
    uint32_t k = 0, old_start = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        uint32_t end = g->alt_off[r + 1];
        g->alt_off[r] = k;
        for (uint32_t a = old_start; a < end; a++) {
            int ok = 1;
            for (uint32_t i = g->alts[a]; ok && GE_TYPE(g->elems[i]) != GE_END; i++) {
                uint32_t e = g->elems[i];
                if (GE_TYPE(e) == GE_REF) ok = prod[GE_VAL(e)];
                if (GE_TYPE(e) == GE_SET) ok = g->set_off[GE_VAL(e)] != g->set_off[GE_VAL(e) + 1];
            }
            if (ok) g->alts[k++] = g->alts[a];
        }
        old_start = end;
    }
    g->alt_off[g->n_rules] = k;
}

/* Left recursion: rule r reaching itself through references each preceded
 * only by nullable rules.  Iterative DFS (rules can chain 10^5 deep); a frame
 * is (rule, alternative, element) and walks the rule's "first" references. */
static int left_recursion(const gram *g, const uint8_t *nullable, uint32_t *out_rule)
{
    uint8_t *color = dx_calloc(g->n_rules + 1, 1);
    uint32_t *st = dx_calloc(g->n_rules + 1, 3 * sizeof *st);
    if (!color || !st) {
        dx_free(color);
        dx_free(st);
        return dx_errf(DX_ENOMEM, "grammar: out of memory");
    }
    int found = 0;
    for (uint32_t s = 0; s < g->n_rules && !found; s++) {
        if (color[s]) continue;
        uint32_t sp = 1;
        st[0] = s, st[1] = g->alt_off[s], st[2] = 0, color[s] = 1;
        while (sp && !found) {
            uint32_t *f = &st[3 * (sp - 1)], r = f[0], next = UINT32_MAX;
            while (next == UINT32_MAX && f[1] < g->alt_off[r + 1]) {
                uint32_t e = g->elems[g->alts[f[1]] + f[2]];
                if (GE_TYPE(e) == GE_REF) {
                    next = GE_VAL(e);
                    if (nullable[next])
                        f[2]++;
                    else
                        f[1]++, f[2] = 0;
                } else {
                    f[1]++, f[2] = 0;
                }
            }
            if (next == UINT32_MAX) {
                color[r] = 2;
                sp--;
            } else if (color[next] == 1) {
                *out_rule = next;
                found = 1;
            } else if (!color[next]) {
                color[next] = 1;
                st[3 * sp] = next, st[3 * sp + 1] = g->alt_off[next], st[3 * sp + 2] = 0, sp++;
            }
        }
    }
    dx_free(color);
    dx_free(st);
    return found;
}

static int check(pst *p, gram *g)
{
    chk c;
    int rc = chk_init(g, &c);
    if (rc) {
        chk_free(&c);
        return rc;
    }
    fixpoint(g, &c, 0);
    if (!c.flag[g->root]) {
        chk_free(&c);
        return perr(p, p->rules[g->root].pos,
                    "rule 'root' derives no finite string (every alternative recurses "
                    "without end or uses an empty class)");
    }
    drop_unproductive(g, c.flag);
    chk_free(&c);
    if ((rc = chk_init(g, &c))) {
        chk_free(&c);
        return rc;
    }
    fixpoint(g, &c, 1);
    uint32_t r = 0;
    rc = left_recursion(g, c.flag, &r);
    chk_free(&c);
    if (rc < 0) return rc;
    if (rc) {
        const prule *pr = &p->rules[r];
        if (pr->name)
            return perr(p, pr->pos,
                        "left recursion: rule '%.*s' can reach itself without "
                        "consuming input",
                        (int)pr->name_len, pr->name);
        return perr(p, pr->pos,
                    "left recursion: this group or repetition can reach itself "
                    "without consuming input (a repeated item that may be empty?)");
    }
    return 0;
}

/* ---- building ------------------------------------------------------------------ */

static int build(pst *p, gram *g)
{
    uint32_t n_alts = 0;
    for (uint32_t r = 0; r < p->n_rules; r++)
        for (uint32_t i = 0; i < p->rules[r].body.n; i++)
            n_alts += GE_TYPE(p->rules[r].body.e[i]) == GE_END;
    g->n_rules = p->n_rules;
    g->n_elems = (uint32_t)p->n_elems;
    g->elems = dx_malloc(((size_t)g->n_elems + 1) * sizeof *g->elems);
    g->alt_off = dx_malloc(((size_t)g->n_rules + 1) * sizeof *g->alt_off);
    g->alts = dx_malloc(((size_t)n_alts + 1) * sizeof *g->alts);
    g->n_sets = p->n_sets;
    g->set_off = dx_calloc((size_t)g->n_sets + 1, sizeof *g->set_off);
    g->ranges = dx_malloc(((size_t)p->n_ranges + 1) * 2 * sizeof *g->ranges);
    g->set_ascii = dx_calloc((size_t)g->n_sets + 1, sizeof *g->set_ascii);
    if (!g->elems || !g->alt_off || !g->alts || !g->set_off || !g->ranges || !g->set_ascii)
        return dx_errf(DX_ENOMEM, "grammar: out of memory");
    uint32_t k = 0, a = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        g->alt_off[r] = a;
        const evec *v = &p->rules[r].body;
        for (uint32_t i = 0; i < v->n; i++) {
            if (i == 0 || GE_TYPE(v->e[i - 1]) == GE_END) g->alts[a++] = k;
            g->elems[k++] = v->e[i];
        }
    }
    g->alt_off[p->n_rules] = a;
    DX_ASSERT(k == g->n_elems && a == n_alts);
    if (p->n_sets) memcpy(g->set_off, p->set_off, ((size_t)g->n_sets + 1) * sizeof *g->set_off);
    if (p->n_ranges) memcpy(g->ranges, p->ranges, (size_t)p->n_ranges * 2 * sizeof *g->ranges);
    for (uint32_t s = 0; s < g->n_sets; s++)
        for (uint32_t i = g->set_off[s]; i < g->set_off[s + 1]; i++)
            for (uint32_t c = g->ranges[2 * i]; c <= g->ranges[2 * i + 1] && c < 128; c++)
                g->set_ascii[s][c >> 6] |= 1ull << (c & 63);
    return 0;
}

static void pst_free(pst *p)
{
    for (uint32_t r = 0; r < p->n_rules; r++) dx_free(p->rules[r].body.e);
    dx_free(p->rules);
    dx_free(p->ht);
    dx_free(p->ranges);
    dx_free(p->set_off);
}

int gram_compile_ebnf(const char *src, size_t len, gram **out)
{
    *out = NULL;
    if (len > GRAM_MAX_SRC)
        return dx_errf(DX_EINVAL, "grammar: %zu bytes, over the limit of %u", len, GRAM_MAX_SRC);
    pst p = {.src = src, .len = len};
    gram *g = dx_calloc(1, sizeof *g);
    if (!g) return dx_errf(DX_ENOMEM, "grammar: out of memory");
    /* allocated up front: set arithmetic never starts from a null pointer */
    int rc = grow((void **)&p.ranges, &p.cap_ranges, 32, 2 * sizeof(uint32_t));
    if (!rc) rc = parse_grammar(&p);
    uint32_t root = 0;
    if (!rc) {
        rc = lookup(&p, "root", 4, 0, &root);
        if (!rc && !p.rules[root].defined) rc = perr(&p, 0, "no rule named 'root'");
    }
    for (uint32_t r = 0; !rc && r < p.n_rules; r++)
        if (!p.rules[r].defined)
            rc = perr(&p, p.rules[r].pos, "rule '%.*s' is used but not defined",
                      (int)p.rules[r].name_len, p.rules[r].name);
    if (!rc) {
        g->root = root;
        rc = build(&p, g);
    }
    if (!rc) rc = check(&p, g);
    pst_free(&p);
    if (rc) {
        gram_destroy(g);
        return rc;
    }
    *out = g;
    return 0;
}

void gram_destroy(gram *g)
{
    if (!g) return;
    dx_free(g->elems);
    dx_free(g->alt_off);
    dx_free(g->alts);
    dx_free(g->set_off);
    dx_free(g->ranges);
    dx_free(g->set_ascii);
    dx_free(g);
}

int gram_set_has(const gram *g, uint32_t s, uint32_t c)
{
    if (c < 128) return (int)(g->set_ascii[s][c >> 6] >> (c & 63)) & 1;
    uint32_t lo = g->set_off[s], hi = g->set_off[s + 1];
    while (lo < hi) { /* first range whose end is >= c */
        uint32_t mid = (lo + hi) / 2;
        if (g->ranges[2 * mid + 1] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < g->set_off[s + 1] && g->ranges[2 * lo] <= c;
}

int gram_set_meets(const gram *g, uint32_t s, uint32_t lo, uint32_t hi)
{
    uint32_t a = g->set_off[s], b = g->set_off[s + 1];
    while (a < b) {
        uint32_t mid = (a + b) / 2;
        if (g->ranges[2 * mid + 1] < lo)
            a = mid + 1;
        else
            b = mid;
    }
    return a < g->set_off[s + 1] && g->ranges[2 * a] <= hi;
}
