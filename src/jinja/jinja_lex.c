/* jinja_lex: template text -> tokens, as @huggingface/jinja's lexer.ts.
 *
 * Preprocessing first, with the options transformers uses for chat
 * templates: a single trailing newline is dropped; lstrip_blocks removes
 * spaces and tabs between a line start and `{%`, `{#` (and, as the
 * reference's regex has it, `{-`); trim_blocks removes the newline after
 * `%}`, `#}` (and `-}`); the transformers-only `{% generation %}` tags are
 * cut out.  These are textual rewrites of the whole source, exactly as the
 * reference's regular expressions do them, so they apply inside string
 * literals too.  Every preprocessed byte keeps the offset of the source byte
 * it came from, so that messages name the line and column the author wrote.
 *
 * The tokenizer is a port of the reference's single loop, odd corners
 * included (a `-` after an operand is binary, elsewhere it glues to the
 * digits that follow; commas are optional in lists; whitespace control
 * trims JavaScript whitespace, which includes U+00A0 and friends). */
#include "jinja/jinja_priv.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"

/* ---- preprocessing -------------------------------------------------------- */

typedef struct {
    char *s;
    uint32_t *map; /* map[i]: source offset of s[i]; map[n]: the source length */
    size_t n;
} ppbuf;

static int pp_alloc(ppbuf *b, size_t n)
{
    b->s = dx_malloc(n + 1);
    b->map = dx_malloc((n + 1) * sizeof *b->map);
    b->n = 0;
    if (b->s && b->map) return 0;
    dx_free(b->s);
    dx_free(b->map);
    b->s = NULL;
    b->map = NULL;
    return dx_errf(DX_ENOMEM, "jinja: out of memory preprocessing a template");
}

static void pp_free(ppbuf *b)
{
    dx_free(b->s);
    dx_free(b->map);
    b->s = NULL;
    b->map = NULL;
}

static void pp_copy(ppbuf *dst, const ppbuf *src, size_t from, size_t to)
{
    memcpy(dst->s + dst->n, src->s + from, to - from);
    memcpy(dst->map + dst->n, src->map + from, (to - from) * sizeof *dst->map);
    dst->n += to - from;
}

static void pp_end(ppbuf *dst, const ppbuf *src)
{
    dst->map[dst->n] = src->map[src->n];
    dst->s[dst->n] = 0;
}

/* JavaScript's `^` in multiline mode: after \n, \r, U+2028 or U+2029. */
static bool line_start(const char *s, size_t i)
{
    if (i == 0) return true;
    if (s[i - 1] == '\n' || s[i - 1] == '\r') return true;
    return i >= 3 && (unsigned char)s[i - 3] == 0xE2 && (unsigned char)s[i - 2] == 0x80 &&
           ((unsigned char)s[i - 1] == 0xA8 || (unsigned char)s[i - 1] == 0xA9);
}

/* template.replace(/^[ \t]*({[#%-])/gm, "$1") */
static void pp_lstrip(const ppbuf *in, ppbuf *out)
{
    size_t i = 0;
    while (i < in->n) {
        if (line_start(in->s, i)) {
            size_t j = i;
            while (j < in->n && (in->s[j] == ' ' || in->s[j] == '\t')) j++;
            if (j + 1 < in->n && in->s[j] == '{' && strchr("#%-", in->s[j + 1]) && in->s[j + 1]) {
                pp_copy(out, in, j, j + 2);
                i = j + 2;
                continue;
            }
        }
        pp_copy(out, in, i, i + 1);
        i++;
    }
    pp_end(out, in);
}

/* template.replace(/([#%-]})\n/g, "$1") */
static void pp_trim(const ppbuf *in, ppbuf *out)
{
    size_t i = 0;
    while (i < in->n) {
        if (i + 2 < in->n && in->s[i] && strchr("#%-", in->s[i]) && in->s[i + 1] == '}' &&
            in->s[i + 2] == '\n') {
            pp_copy(out, in, i, i + 2);
            i += 3;
            continue;
        }
        pp_copy(out, in, i, i + 1);
        i++;
    }
    pp_end(out, in);
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    size_t w;
    while (i < n && (w = js_ws_len(s + i, n - i))) i += w;
    return i;
}

static bool has_at(const char *s, size_t n, size_t i, const char *lit)
{
    size_t l = strlen(lit);
    return i + l <= n && !memcmp(s + i, lit, l);
}

/* At i, `{%(-?)\s*(?:end)?generation\s*(-?)%}`: its end, the two dashes. */
static size_t gen_tag(const char *s, size_t n, size_t i, bool *lstrip, bool *rstrip)
{
    if (!has_at(s, n, i, "{%")) return 0;
    i += 2;
    *lstrip = i < n && s[i] == '-';
    i = skip_ws(s, n, i + *lstrip);
    if (has_at(s, n, i, "end")) i += 3;
    if (!has_at(s, n, i, "generation")) return 0;
    i = skip_ws(s, n, i + 10);
    *rstrip = i < n && s[i] == '-';
    i += *rstrip;
    return has_at(s, n, i, "%}") ? i + 2 : 0;
}

/* template.replace(/(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs,
 *   (_, before, l, r, after) => (l ? "" : before) + (r ? "" : after)) */
static void pp_generation(const ppbuf *in, ppbuf *out)
{
    size_t i = 0, ws_start = 0; /* start of the whitespace run before i */
    bool in_ws = false;
    while (i < in->n) {
        bool l, r;
        size_t end = in->s[i] == '{' ? gen_tag(in->s, in->n, i, &l, &r) : 0;
        if (end) {
            size_t before = in_ws ? ws_start : i, after = skip_ws(in->s, in->n, end);
            out->n -= i - before; /* the run was copied already */
            if (!l) pp_copy(out, in, before, i);
            if (!r) pp_copy(out, in, end, after);
            i = after;
            in_ws = false;
            continue;
        }
        size_t w = js_ws_len(in->s + i, in->n - i);
        if (w && !in_ws) ws_start = i;
        in_ws = w != 0;
        pp_copy(out, in, i, i + (w ? w : 1));
        i += w ? w : 1;
    }
    pp_end(out, in);
}

static int preprocess(const char *src, size_t len, ppbuf *out)
{
    ppbuf a, b;
    int rc = pp_alloc(&a, len);
    if (rc) return rc;
    if ((rc = pp_alloc(&b, len))) {
        pp_free(&a);
        return rc;
    }
    size_t n = len && src[len - 1] == '\n' ? len - 1 : len;
    memcpy(a.s, src, n);
    for (size_t i = 0; i <= n; i++) a.map[i] = (uint32_t)i;
    a.n = n;
    a.s[n] = 0;
    pp_lstrip(&a, &b);
    a.n = 0;
    pp_trim(&b, &a);
    b.n = 0;
    pp_generation(&a, &b);
    pp_free(&a);
    *out = b;
    return 0;
}

/* ---- tokenizer ------------------------------------------------------------ */

typedef struct {
    jarena *ar;
    const char *src; /* the original, for messages */
    size_t len;
    const char *s; /* preprocessed */
    const uint32_t *map;
    size_t n, i;
    jtok *v;
    size_t nt, cap;
    int curly; /* depth of { } inside {{ }}, where }} closes a dict */
} lexer;

static int lx_fail(lexer *lx, size_t i, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int lx_fail(lexer *lx, size_t i, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = jinja_verr_at(DX_EINVAL, lx->src, lx->len, lx->map[i < lx->n ? i : lx->n], fmt, ap);
    va_end(ap);
    return rc;
}

static int lx_eof(lexer *lx)
{
    return lx_fail(lx, lx->n, "unexpected end of template inside a tag or string");
}

static int lx_push(lexer *lx, uint8_t type, size_t at, const char *p, size_t n)
{
    if (lx->nt == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        jtok *v = dx_realloc(lx->v, cap * sizeof *v);
        if (!v) return dx_errf(DX_ENOMEM, "jinja: out of memory tokenising");
        lx->v = v;
        lx->cap = cap;
    }
    char *copy = ja_alloc(lx->ar, n + 1);
    if (!copy) return dx_errcode();
    memcpy(copy, p, n);
    lx->v[lx->nt++] = (jtok){type, lx->map[at], {copy, n}};
    return 0;
}

static int lx_last(const lexer *lx)
{
    return lx->nt ? lx->v[lx->nt - 1].type : -1;
}

static void lx_strip_last_text(lexer *lx)
{
    if (lx_last(lx) != JT_TEXT) return;
    jtok *t = &lx->v[lx->nt - 1];
    t->s = js_trim(t->s, false, true);
    if (!t->s.n) lx->nt--;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}
static bool is_word(char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* consumeWhile for the escape-free predicates: a run that reaches the end of
 * the template is an error, as in the reference. */
static int lx_run(lexer *lx, bool (*pred)(char), size_t *end)
{
    size_t i = lx->i;
    while (i < lx->n && pred(lx->s[i])) {
        if (++i >= lx->n) return lx_eof(lx);
    }
    *end = i;
    return 0;
}

static int lx_skip_ws_run(lexer *lx)
{
    size_t w;
    while (lx->i < lx->n && (w = js_ws_len(lx->s + lx->i, lx->n - lx->i))) {
        lx->i += w;
        if (lx->i >= lx->n) return lx_eof(lx);
    }
    return 0;
}

/* A hex digit's value; DX_NONE for another character. */
static int hexval(char c)
{
    if (is_digit(c)) return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return DX_NONE;
}

static int lx_hex(lexer *lx, size_t at, int digits, uint32_t *cp)
{
    *cp = 0;
    for (int k = 0; k < digits; k++) {
        int h = lx->i + k < lx->n ? hexval(lx->s[lx->i + k]) : DX_NONE;
        if (h < 0) return lx_fail(lx, at, "invalid hexadecimal escape sequence");
        *cp = *cp * 16 + (uint32_t)h;
    }
    lx->i += (size_t)digits;
    return 0;
}

/* \xHH or \uHHHH (a surrogate pair written as two escapes joins up). */
static int lx_hex_escape(lexer *lx, size_t at, char kind, dx_buf *b)
{
    uint32_t cp;
    int rc = lx_hex(lx, at, kind == 'x' ? 2 : 4, &cp);
    if (rc) return rc;
    if (cp >= 0xD800 && cp <= 0xDBFF && has_at(lx->s, lx->n, lx->i, "\\u")) {
        size_t save = lx->i;
        uint32_t lo;
        lx->i += 2;
        if (!lx_hex(lx, at, 4, &lo) && lo >= 0xDC00 && lo <= 0xDFFF)
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        else
            lx->i = save;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return lx_fail(lx, at, "a lone surrogate (\\u%04X) cannot be represented in UTF-8", cp);
    return dx_utf8_put(b, cp);
}

static int lx_escape(lexer *lx, dx_buf *b)
{
    size_t at = lx->i++;
    if (lx->i >= lx->n) return lx_eof(lx);
    char e = lx->s[lx->i++];
    if (e == 'x' || e == 'u') return lx_hex_escape(lx, at, e, b);
    static const char from[] = "ntrbfv'\"\\", to[] = "\n\t\r\b\f\v'\"\\";
    const char *k = e ? strchr(from, e) : NULL;
    if (!k) return lx_fail(lx, at, "unexpected escaped character '%c'", e);
    return dx_buf_putc(b, to[k - from]) ? dx_errcode() : 0;
}

static int lx_string(lexer *lx)
{
    size_t at = lx->i;
    char quote = lx->s[lx->i++];
    dx_buf b;
    dx_buf_init(&b, 0);
    int rc = 0;
    for (;;) {
        if (lx->i >= lx->n) {
            rc = lx_fail(lx, at, "unterminated string");
            break;
        }
        char c = lx->s[lx->i];
        if (c == quote) break;
        if (c == '\\') {
            if ((rc = lx_escape(lx, &b))) break;
            continue;
        }
        if ((rc = dx_buf_putc(&b, c) ? dx_errcode() : 0)) break;
        if (++lx->i >= lx->n) {
            rc = lx_fail(lx, at, "unterminated string");
            break;
        }
    }
    if (!rc) {
        lx->i++;
        rc = lx_push(lx, JT_STR, at, b.data ? b.data : "", b.len);
    }
    dx_buf_free(&b);
    return rc;
}

static bool is_tag_start(const char *s, size_t n, size_t i)
{
    return s[i] == '{' && i + 1 < n && (s[i + 1] == '%' || s[i + 1] == '{' || s[i + 1] == '#');
}

static int lx_text(lexer *lx, bool *pushed)
{
    size_t start = lx->i;
    while (lx->i < lx->n && !is_tag_start(lx->s, lx->n, lx->i)) lx->i++;
    *pushed = lx->i > start;
    return *pushed ? lx_push(lx, JT_TEXT, start, lx->s + start, lx->i - start) : 0;
}

static int lx_comment(lexer *lx)
{
    size_t at = lx->i;
    lx->i += 2;
    bool strip_before = lx->i < lx->n && lx->s[lx->i] == '-';
    lx->i += strip_before;
    size_t start = lx->i;
    while (!(lx->i + 1 < lx->n && lx->s[lx->i] == '#' && lx->s[lx->i + 1] == '}')) {
        if (lx->i + 2 >= lx->n) return lx_fail(lx, at, "missing end of comment tag '#}'");
        lx->i++;
    }
    size_t end = lx->i;
    bool strip_after = end > start && lx->s[end - 1] == '-';
    if (strip_before) lx_strip_last_text(lx);
    int rc = lx_push(lx, JT_COMMENT, at, lx->s + start, end - start - strip_after);
    lx->i += 2;
    if (strip_after) lx->i = skip_ws(lx->s, lx->n, lx->i);
    return rc;
}

/* After a lone + or -: glued digits make a signed number literal. */
static int lx_sign(lexer *lx)
{
    size_t at = lx->i++, end = lx->i;
    int rc = lx_run(lx, is_digit, &end);
    if (rc) return rc;
    bool digits = end > lx->i;
    lx->i = end;
    if (digits && lx->i + 1 < lx->n && lx->s[lx->i] == '.' && is_digit(lx->s[lx->i + 1])) {
        lx->i++;
        if ((rc = lx_run(lx, is_digit, &end))) return rc;
        lx->i = end;
    }
    return lx_push(lx, digits ? JT_NUM : JT_UNARY, at, lx->s + at, lx->i - at);
}

static const struct {
    const char *seq;
    uint8_t type;
} k_table[] = {
    {"{%", JT_OPEN_STMT}, {"%}", JT_CLOSE_STMT}, {"{{", JT_OPEN_EXPR}, {"}}", JT_CLOSE_EXPR},
    {"(", JT_LPAREN},     {")", JT_RPAREN},      {"{", JT_LBRACE},     {"}", JT_RBRACE},
    {"[", JT_LBRACKET},   {"]", JT_RBRACKET},    {",", JT_COMMA},      {".", JT_DOT},
    {":", JT_COLON},      {"|", JT_PIPE},        {"<=", JT_CMP},       {">=", JT_CMP},
    {"==", JT_CMP},       {"!=", JT_CMP},        {"<", JT_CMP},        {">", JT_CMP},
    {"+", JT_ADD},        {"-", JT_ADD},         {"~", JT_ADD},        {"**", JT_POW},
    {"*", JT_MUL},        {"//", JT_MUL},        {"/", JT_MUL},        {"%", JT_MUL},
    {"=", JT_EQUALS},
};

static int lx_table(lexer *lx, bool *matched)
{
    for (size_t k = 0; k < DX_ARRAY_LEN(k_table); k++) {
        const char *seq = k_table[k].seq;
        uint8_t type = k_table[k].type;
        if (type == JT_CLOSE_EXPR && lx->curly > 0) continue;
        if (!has_at(lx->s, lx->n, lx->i, seq)) continue;
        size_t at = lx->i;
        lx->i += strlen(seq);
        if (type == JT_OPEN_EXPR) lx->curly = 0;
        if (type == JT_LBRACE) lx->curly++;
        if (type == JT_RBRACE) lx->curly--;
        *matched = true;
        return lx_push(lx, type, at, seq, strlen(seq));
    }
    *matched = false;
    return 0;
}

static int lx_number(lexer *lx)
{
    size_t at = lx->i, end = lx->i;
    int rc = lx_run(lx, is_digit, &end);
    if (rc) return rc;
    lx->i = end;
    if (lx_last(lx) != JT_DOT && lx->i + 1 < lx->n && lx->s[lx->i] == '.' &&
        is_digit(lx->s[lx->i + 1])) {
        lx->i++;
        if ((rc = lx_run(lx, is_digit, &end))) return rc;
        lx->i = end;
    }
    return lx_push(lx, JT_NUM, at, lx->s + at, lx->i - at);
}

static int lx_word(lexer *lx)
{
    size_t at = lx->i, end = lx->i;
    int rc = lx_run(lx, is_word, &end);
    if (rc) return rc;
    lx->i = end;
    return lx_push(lx, JT_IDENT, at, lx->s + at, end - at);
}

/* Whitespace control and closing tags, checked before anything else. */
static int lx_controls(lexer *lx, bool *done)
{
    *done = true;
    if (has_at(lx->s, lx->n, lx->i, "{%-") || has_at(lx->s, lx->n, lx->i, "{{-")) {
        bool stmt = lx->s[lx->i + 1] == '%';
        lx_strip_last_text(lx);
        if (!stmt) lx->curly = 0;
        lx->i += 3;
        return lx_push(lx, stmt ? JT_OPEN_STMT : JT_OPEN_EXPR, lx->i - 3, stmt ? "{%" : "{{", 2);
    }
    int rc = lx_skip_ws_run(lx);
    if (rc) return rc;
    if (has_at(lx->s, lx->n, lx->i, "-%}") || has_at(lx->s, lx->n, lx->i, "-}}")) {
        bool stmt = lx->s[lx->i + 1] == '%';
        rc = lx_push(lx, stmt ? JT_CLOSE_STMT : JT_CLOSE_EXPR, lx->i, stmt ? "%}" : "}}", 2);
        lx->i = skip_ws(lx->s, lx->n, lx->i + 3);
        return rc;
    }
    *done = false;
    return 0;
}

static int lx_operand_char(lexer *lx)
{
    char c = lx->s[lx->i];
    int last = lx_last(lx);
    if (c == '-' || c == '+') {
        if (last == JT_TEXT || last < 0) return lx_fail(lx, lx->i, "unexpected character '%c'", c);
        if (last != JT_IDENT && last != JT_NUM && last != JT_STR && last != JT_RPAREN &&
            last != JT_RBRACKET)
            return lx_sign(lx);
    }
    bool matched;
    int rc = lx_table(lx, &matched);
    if (rc || matched) return rc;
    if (c == '\'' || c == '"') return lx_string(lx);
    if (is_digit(c)) return lx_number(lx);
    if (is_word(c)) return lx_word(lx);
    if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7F)
        return lx_fail(lx, lx->i, "unexpected character (byte 0x%02X)", (unsigned char)c);
    return lx_fail(lx, lx->i, "unexpected character '%c'", c);
}

static int lx_step(lexer *lx)
{
    int last = lx_last(lx);
    if (last < 0 || last == JT_CLOSE_STMT || last == JT_CLOSE_EXPR || last == JT_COMMENT) {
        bool pushed;
        int rc = lx_text(lx, &pushed);
        if (rc || pushed) return rc;
    }
    if (has_at(lx->s, lx->n, lx->i, "{#")) return lx_comment(lx);
    bool done;
    int rc = lx_controls(lx, &done);
    if (rc || done) return rc;
    return lx_operand_char(lx);
}

int jl_tokenize(jarena *a, const char *src, size_t len, jtoks *out)
{
    ppbuf pp;
    int rc = preprocess(src, len, &pp);
    if (rc) return rc;
    lexer lx = {.ar = a, .src = src, .len = len, .s = pp.s, .map = pp.map, .n = pp.n};
    while (!rc && lx.i < lx.n) rc = lx_step(&lx);
    if (!rc) {
        out->n = lx.nt;
        out->v = ja_alloc(a, (lx.nt ? lx.nt : 1) * sizeof *out->v);
        if (!out->v)
            rc = dx_errcode();
        else if (lx.nt)
            memcpy(out->v, lx.v, lx.nt * sizeof *out->v);
    }
    dx_free(lx.v);
    pp_free(&pp);
    return rc;
}
