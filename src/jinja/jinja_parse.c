/* jinja_parse: tokens -> syntax tree, a port of @huggingface/jinja's
 * parser.ts (recursive descent, one function per precedence level, same
 * order: `if`-expression < or < and < not < comparison and membership <
 * + - ~ < * / // % < ** < is-tests < | filters < unary sign < call/member <
 * primary).  Its leniencies are kept, because a template the reference
 * accepts must render here too: commas between list items, dict entries and
 * arguments are optional, `[a b]` takes the first item, adjacent string
 * literals join.
 *
 * Nesting is bounded (JINJA_MAX_PARSE_DEPTH) so a hostile template cannot
 * exhaust the stack; every error names the line and column of the token
 * where parsing stopped. */
#include "jinja/jinja_priv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"

typedef struct {
    jarena *ar;
    const char *src;
    size_t len;
    const jtok *t;
    size_t n, i;
    unsigned depth;
} parser;

/* A list under construction (heap), moved into the arena when complete. */
typedef struct {
    jnode **v;
    size_t n, cap;
} nlist;

static int p_vfail(parser *p, int code, const char *fmt, va_list ap)
{
    size_t pos = p->i < p->n ? p->t[p->i].pos : p->len;
    return jinja_verr_at(code, p->src, p->len, pos, fmt, ap);
}

static int p_fail(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int p_fail(parser *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = p_vfail(p, DX_EINVAL, fmt, ap);
    va_end(ap);
    return rc;
}

static int p_too_deep(parser *p, ...)
{
    va_list ap;
    va_start(ap, p);
    int rc = p_vfail(p, DX_ETOOBIG, "template nested deeper than %d levels", ap);
    va_end(ap);
    return rc;
}

/* What the current token is, for messages. */
static const char *p_found(const parser *p, char *buf, size_t cap)
{
    if (p->i >= p->n) return "the end of the template";
    const jtok *t = &p->t[p->i];
    if (t->type == JT_TEXT) return "text";
    if (t->type == JT_COMMENT) return "a comment";
    snprintf(buf, cap, "'%.*s'%s", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p,
             t->type == JT_STR ? " (a string)" : "");
    return buf;
}

static int p_expected(parser *p, const char *what)
{
    char buf[64];
    return p_fail(p, "expected %s, found %s", what, p_found(p, buf, sizeof buf));
}

static bool is(const parser *p, uint8_t type)
{
    return p->i < p->n && p->t[p->i].type == type;
}

static bool is_ident_at(const parser *p, size_t k, const char *name)
{
    return p->i + k < p->n && p->t[p->i + k].type == JT_IDENT && jstr_is(p->t[p->i + k].s, name);
}

static bool is_ident(const parser *p, const char *name)
{
    return is_ident_at(p, 0, name);
}

/* {% name ... with name one of names (NULL-terminated). */
static bool is_stmt(const parser *p, const char *const *names)
{
    if (!is(p, JT_OPEN_STMT)) return false;
    for (; *names; names++)
        if (is_ident_at(p, 1, *names)) return true;
    return false;
}

static int expect(parser *p, uint8_t type, const char *what)
{
    if (!is(p, type)) return p_expected(p, what);
    p->i++;
    return 0;
}

static int expect_ident(parser *p, const char *name)
{
    char what[48];
    snprintf(what, sizeof what, "'%s'", name);
    if (!is_ident(p, name)) return p_expected(p, what);
    p->i++;
    return 0;
}

static int enter(parser *p)
{
    return ++p->depth <= JINJA_MAX_PARSE_DEPTH ? 0 : p_too_deep(p, JINJA_MAX_PARSE_DEPTH);
}

/* Each link of a left-associative chain (a + b + c, x|f|g, x is t) nests
 * the tree one level deeper, so it counts like any other nesting; the
 * caller gives the levels back with p->depth -= links. */
static int link(parser *p, unsigned *links)
{
    (*links)++;
    return enter(p);
}

static jnode *node(parser *p, uint8_t kind, uint32_t pos)
{
    jnode *n = ja_alloc(p->ar, sizeof *n);
    if (n) {
        n->kind = kind;
        n->pos = pos;
    }
    return n;
}

static uint32_t here(const parser *p)
{
    return p->i < p->n ? p->t[p->i].pos : (uint32_t)p->len;
}

static int nl_push(nlist *l, jnode *n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jnode **v = dx_realloc(l->v, cap * sizeof *v);
        if (!v) return dx_errf(DX_ENOMEM, "jinja: out of memory parsing");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
    return 0;
}

static int nl_finish(parser *p, nlist *l, jlist *out)
{
    out->n = (uint32_t)l->n;
    out->v = l->n ? ja_alloc(p->ar, l->n * sizeof *out->v) : NULL;
    int rc = l->n && !out->v ? dx_errcode() : 0;
    if (!rc && l->n) memcpy(out->v, l->v, l->n * sizeof *out->v);
    dx_free(l->v);
    *l = (nlist){0};
    return rc;
}

static int parse_any(parser *p, jnode **out);
static int parse_expr(parser *p, jnode **out);
static int parse_primary(parser *p, jnode **out);
static int parse_call(parser *p, jnode *callee, jnode **out);
static int parse_args(parser *p, bool params, jlist *out);

/* Statements until `{% name` for one of names. */
static int parse_body(parser *p, const char *const *names, const char *closer, jlist *out)
{
    nlist l = {0};
    int rc = 0;
    while (!rc && !is_stmt(p, names)) {
        jnode *n;
        if (p->i >= p->n) {
            rc = p_fail(p, "unexpected end of the template: missing %s", closer);
            break;
        }
        rc = parse_any(p, &n);
        if (!rc) rc = nl_push(&l, n);
    }
    int rc2 = nl_finish(p, &l, out);
    return rc ? rc : rc2;
}

/* {% endname %} */
static int parse_end(parser *p, const char *name)
{
    char what[48];
    snprintf(what, sizeof what, "'{%% %s %%}'", name);
    if (!is(p, JT_OPEN_STMT)) return p_expected(p, what);
    p->i++;
    int rc = expect_ident(p, name);
    return rc ? rc : expect(p, JT_CLOSE_STMT, "'%}'");
}

/* ---- statements ----------------------------------------------------------- */

static int parse_expr_seq(parser *p, bool primary, jnode **out)
{
    uint32_t pos = here(p);
    jnode *first;
    int rc = primary ? parse_primary(p, &first) : parse_expr(p, &first);
    if (rc || !is(p, JT_COMMA)) {
        *out = first;
        return rc;
    }
    nlist l = {0};
    rc = nl_push(&l, first);
    while (!rc) {
        p->i++; /* the comma */
        jnode *e;
        rc = primary ? parse_primary(p, &e) : parse_expr(p, &e);
        if (!rc) rc = nl_push(&l, e);
        if (!is(p, JT_COMMA)) break;
    }
    jnode *t = node(p, JN_TUPLE, pos);
    int rc2 = t ? nl_finish(p, &l, &t->l1) : (dx_free(l.v), dx_errcode());
    *out = t;
    return rc ? rc : rc2;
}

static int parse_set(parser *p, uint32_t pos, jnode **out)
{
    jnode *n = node(p, JN_SET, pos);
    if (!n) return dx_errcode();
    int rc = parse_expr_seq(p, false, &n->a);
    if (!rc && is(p, JT_EQUALS)) {
        p->i++;
        rc = parse_expr_seq(p, false, &n->b);
    } else if (!rc) {
        static const char *const endset[] = {"endset", NULL};
        rc = expect(p, JT_CLOSE_STMT, "'=' or '%}'");
        if (!rc) rc = parse_body(p, endset, "'{% endset %}'", &n->l1);
        if (!rc) p->i++;
        if (!rc) rc = expect_ident(p, "endset");
    }
    if (!rc) rc = expect(p, JT_CLOSE_STMT, "'%}'");
    *out = n;
    return rc;
}

static int parse_if(parser *p, uint32_t pos, jnode **out)
{
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    jnode *n = node(p, JN_IF, pos);
    if (!n) return dx_errcode();
    *out = n;
    int rc = parse_expr(p, &n->a);
    if (!rc) rc = expect(p, JT_CLOSE_STMT, "'%}'");
    if (!rc) rc = parse_body(p, stops, "'{% endif %}'", &n->l1);
    if (rc) return rc;
    if (is_ident_at(p, 1, "elif")) {
        uint32_t at = here(p);
        p->i += 2;
        jnode *e;
        rc = parse_if(p, at, &e);
        if (rc) return rc;
        n->l2.v = ja_alloc(p->ar, sizeof *n->l2.v);
        if (!n->l2.v) return dx_errcode();
        n->l2.v[0] = e;
        n->l2.n = 1;
        return 0;
    }
    if (is_ident_at(p, 1, "else")) {
        p->i += 2;
        rc = expect(p, JT_CLOSE_STMT, "'%}'");
        if (!rc) rc = parse_body(p, endif, "'{% endif %}'", &n->l2);
    }
    return rc;
}

static int parse_for(parser *p, uint32_t pos, jnode **out)
{
    static const char *const stops[] = {"endfor", "else", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    jnode *n = node(p, JN_FOR, pos);
    if (!n) return dx_errcode();
    *out = n;
    int rc = parse_expr_seq(p, true, &n->a);
    if (rc) return rc;
    if (n->a->kind != JN_IDENT && n->a->kind != JN_TUPLE)
        return p_fail(p, "expected a name or names (a, b) for the loop variable");
    if (!is_ident(p, "in")) return p_expected(p, "'in' after the loop variable");
    p->i++;
    rc = parse_expr(p, &n->b);
    if (!rc) rc = expect(p, JT_CLOSE_STMT, "'%}'");
    if (!rc) rc = parse_body(p, stops, "'{% endfor %}'", &n->l1);
    if (!rc && is_ident_at(p, 1, "else")) {
        p->i += 2;
        rc = expect(p, JT_CLOSE_STMT, "'%}'");
        if (!rc) rc = parse_body(p, endfor, "'{% endfor %}'", &n->l2);
    }
    return rc;
}

/* ---- kwargs/varargs use (findAccessedSpecialMacroArguments) -------------- */

typedef struct {
    unsigned declared, accessed;
} scan;

static unsigned special_bit(jstr name)
{
    return jstr_is(name, "kwargs")    ? JN_USES_KWARGS
           : jstr_is(name, "varargs") ? JN_USES_VARARGS
                                      : 0;
}

static void sc_target(scan *s, const jnode *t)
{
    if (t->kind == JN_IDENT) s->declared |= special_bit(t->str);
    if (t->kind == JN_TUPLE)
        for (uint32_t i = 0; i < t->l1.n; i++) sc_target(s, t->l1.v[i]);
}

static void sc_visit(scan *s, const jnode *n);

static void sc_list(scan *s, const jlist *l)
{
    for (uint32_t i = 0; i < l->n; i++) sc_visit(s, l->v[i]);
}

static void sc_params(scan *s, const jlist *params, bool defaults)
{
    for (uint32_t i = 0; i < params->n; i++) {
        const jnode *a = params->v[i];
        if (!defaults) s->declared |= special_bit(a->str);
        if (defaults && a->kind == JN_KWARG) sc_visit(s, a->a);
    }
}

static void sc_filter_args(scan *s, const jnode *f)
{
    if (f && f->kind == JN_CALL) sc_list(s, &f->l1);
}

static void sc_visit(scan *s, const jnode *n)
{
    if (!n) return;
    switch (n->kind) {
    case JN_FOR:
        sc_target(s, n->a);
        sc_visit(s, n->b->kind == JN_SELECT ? n->b->a : n->b);
        sc_list(s, &n->l1);
        sc_list(s, &n->l2);
        if (n->b->kind == JN_SELECT) sc_visit(s, n->b->b);
        return;
    case JN_SET:
        sc_target(s, n->a);
        sc_visit(s, n->b);
        sc_list(s, &n->l1);
        return;
    case JN_MACRO:
        sc_params(s, &n->l1, false);
        sc_params(s, &n->l1, true);
        sc_list(s, &n->l2);
        return;
    case JN_CALL_BLOCK:
        sc_visit(s, n->a);
        sc_params(s, &n->l1, false);
        sc_params(s, &n->l1, true);
        sc_list(s, &n->l2);
        return;
    case JN_FILTER_BLOCK:
        sc_list(s, &n->l1);
        sc_filter_args(s, n->b);
        return;
    case JN_IDENT:
        s->accessed |= special_bit(n->str) & ~s->declared;
        return;
    case JN_MEMBER:
        sc_visit(s, n->a);
        if (n->op) sc_visit(s, n->b);
        return;
    case JN_FILTER:
        sc_visit(s, n->a);
        sc_filter_args(s, n->b);
        return;
    case JN_TEST:
    case JN_KWARG:
        sc_visit(s, n->a);
        return;
    case JN_SELECT:
        sc_visit(s, n->b);
        sc_visit(s, n->a);
        return;
    default: /* every child, in the reference's field order */
        sc_visit(s, n->a);
        sc_visit(s, n->b);
        sc_visit(s, n->c);
        sc_list(s, &n->l1);
        sc_list(s, &n->l2);
    }
}

static uint8_t special_uses(const jlist *params, const jlist *body)
{
    scan s = {0, 0};
    sc_params(&s, params, false);
    sc_list(&s, body);
    return (uint8_t)s.accessed;
}

/* ---- macro, call, filter blocks ------------------------------------------ */

static int parse_macro(parser *p, uint32_t pos, jnode **out)
{
    static const char *const endmacro[] = {"endmacro", NULL};
    jnode *n = node(p, JN_MACRO, pos), *name;
    if (!n) return dx_errcode();
    *out = n;
    int rc = parse_primary(p, &name);
    if (rc) return rc;
    if (name->kind != JN_IDENT) return p_fail(p, "expected the macro's name");
    n->str = name->str;
    rc = parse_args(p, true, &n->l1);
    if (!rc) rc = expect(p, JT_CLOSE_STMT, "'%}'");
    if (!rc) rc = parse_body(p, endmacro, "'{% endmacro %}'", &n->l2);
    if (!rc) n->op = special_uses(&n->l1, &n->l2);
    return rc;
}

static int parse_call_block(parser *p, uint32_t pos, jnode **out)
{
    static const char *const endcall[] = {"endcall", NULL};
    jnode *n = node(p, JN_CALL_BLOCK, pos), *callee;
    if (!n) return dx_errcode();
    *out = n;
    int rc = is(p, JT_LPAREN) ? parse_args(p, true, &n->l1) : 0;
    if (!rc) rc = parse_primary(p, &callee);
    if (rc) return rc;
    if (callee->kind != JN_IDENT) return p_fail(p, "expected a macro name after 'call'");
    if (!(n->a = node(p, JN_CALL, callee->pos))) return dx_errcode();
    n->a->a = callee;
    rc = parse_args(p, false, &n->a->l1);
    if (!rc) rc = expect(p, JT_CLOSE_STMT, "'%}'");
    if (!rc) rc = parse_body(p, endcall, "'{% endcall %}'", &n->l2);
    if (!rc) rc = parse_end(p, "endcall");
    if (!rc) n->op = special_uses(&n->l1, &n->l2);
    return rc;
}

static int parse_filter_block(parser *p, uint32_t pos, jnode **out)
{
    static const char *const endfilter[] = {"endfilter", NULL};
    jnode *n = node(p, JN_FILTER_BLOCK, pos);
    if (!n) return dx_errcode();
    *out = n;
    int rc = parse_primary(p, &n->b);
    if (!rc && n->b->kind == JN_IDENT && is(p, JT_LPAREN)) rc = parse_call(p, n->b, &n->b);
    if (!rc) rc = expect(p, JT_CLOSE_STMT, "'%}'");
    if (!rc) rc = parse_body(p, endfilter, "'{% endfilter %}'", &n->l1);
    if (!rc) rc = parse_end(p, "endfilter");
    return rc;
}

static int parse_simple(parser *p, uint8_t kind, uint32_t pos, jnode **out)
{
    *out = node(p, kind, pos);
    return *out ? expect(p, JT_CLOSE_STMT, "'%}'") : dx_errcode();
}

static int parse_stmt(parser *p, jnode **out)
{
    uint32_t pos = here(p);
    p->i++; /* {% */
    if (!is(p, JT_IDENT)) return p_expected(p, "a statement name after '{%'");
    jstr name = p->t[p->i].s;
    p->i++;
    if (jstr_is(name, "set")) return parse_set(p, pos, out);
    if (jstr_is(name, "call")) return parse_call_block(p, pos, out);
    if (jstr_is(name, "filter")) return parse_filter_block(p, pos, out);
    if (jstr_is(name, "break")) return parse_simple(p, JN_BREAK, pos, out);
    if (jstr_is(name, "continue")) return parse_simple(p, JN_CONTINUE, pos, out);
    int rc;
    if (jstr_is(name, "if")) {
        rc = parse_if(p, pos, out);
        return rc ? rc : parse_end(p, "endif");
    }
    if (jstr_is(name, "for")) {
        rc = parse_for(p, pos, out);
        return rc ? rc : parse_end(p, "endfor");
    }
    if (jstr_is(name, "macro")) {
        rc = parse_macro(p, pos, out);
        return rc ? rc : parse_end(p, "endmacro");
    }
    p->i--;
    return p_fail(p, "unknown statement '%.*s'", (int)(name.n > 40 ? 40 : name.n), name.p);
}

static int parse_any_in(parser *p, jnode **out)
{
    const jtok *t = &p->t[p->i];
    if (t->type == JT_COMMENT || t->type == JT_TEXT) {
        *out = node(p, t->type == JT_TEXT ? JN_TEXT : JN_COMMENT, t->pos);
        if (!*out) return dx_errcode();
        (*out)->str = t->s;
        p->i++;
        return 0;
    }
    if (t->type == JT_OPEN_STMT) return parse_stmt(p, out);
    if (t->type != JT_OPEN_EXPR) return p_expected(p, "text, '{{' or '{%'");
    p->i++;
    int rc = parse_expr(p, out);
    return rc ? rc : expect(p, JT_CLOSE_EXPR, "'}}'");
}

static int parse_any(parser *p, jnode **out)
{
    int rc = enter(p);
    if (!rc) rc = parse_any_in(p, out);
    p->depth--;
    return rc;
}

/* ---- expressions ---------------------------------------------------------- */

static int binary(parser *p, uint8_t op, uint32_t pos, jnode *a, jnode *b, jnode **out)
{
    jnode *n = node(p, JN_BINARY, pos);
    if (!n) return dx_errcode();
    n->op = op;
    n->a = a;
    n->b = b;
    *out = n;
    return 0;
}

static int parse_if_expr_in(parser *p, jnode **out);

static int parse_expr(parser *p, jnode **out)
{
    int rc = enter(p);
    if (!rc) rc = parse_if_expr_in(p, out);
    p->depth--;
    return rc;
}

static int parse_or(parser *p, jnode **out);

static int parse_if_expr_in(parser *p, jnode **out)
{
    jnode *a, *test;
    int rc = parse_or(p, &a);
    if (rc || !is_ident(p, "if")) {
        *out = a;
        return rc;
    }
    uint32_t pos = here(p);
    p->i++;
    if ((rc = parse_or(p, &test))) return rc;
    bool has_else = is_ident(p, "else");
    jnode *n = node(p, has_else ? JN_TERNARY : JN_SELECT, pos);
    if (!n) return dx_errcode();
    *out = n;
    if (!has_else) {
        n->a = a;
        n->b = test;
        return 0;
    }
    p->i++;
    n->a = test;
    n->b = a;
    return parse_expr(p, &n->c);
}

static int parse_and(parser *p, jnode **out);
static int parse_not(parser *p, jnode **out);

static int parse_or(parser *p, jnode **out)
{
    unsigned links = 0;
    int rc = parse_and(p, out);
    while (!rc && is_ident(p, "or")) {
        if ((rc = link(p, &links))) break;
        uint32_t pos = here(p);
        jnode *b;
        p->i++;
        rc = parse_and(p, &b);
        if (!rc) rc = binary(p, JOP_OR, pos, *out, b, out);
    }
    p->depth -= links;
    return rc;
}

static int parse_and(parser *p, jnode **out)
{
    unsigned links = 0;
    int rc = parse_not(p, out);
    while (!rc && is_ident(p, "and")) {
        if ((rc = link(p, &links))) break;
        uint32_t pos = here(p);
        jnode *b;
        p->i++;
        rc = parse_not(p, &b);
        if (!rc) rc = binary(p, JOP_AND, pos, *out, b, out);
    }
    p->depth -= links;
    return rc;
}

static int parse_cmp(parser *p, jnode **out);

/* `not not x`; as in the reference, a later `not` in the same run replaces
 * an earlier operand. */
static int parse_not_in(parser *p, jnode **out)
{
    jnode *right = NULL;
    while (is_ident(p, "not")) {
        uint32_t pos = here(p);
        p->i++;
        jnode *arg;
        int rc = parse_not(p, &arg);
        if (rc) return rc;
        if (!(right = node(p, JN_UNARY, pos))) return dx_errcode();
        right->op = JOP_NOT;
        right->a = arg;
    }
    if (right) {
        *out = right;
        return 0;
    }
    return parse_cmp(p, out);
}

static int parse_not(parser *p, jnode **out)
{
    int rc = enter(p);
    if (!rc) rc = parse_not_in(p, out);
    p->depth--;
    return rc;
}

static uint8_t op_of(jstr s)
{
    static const struct {
        const char *s;
        uint8_t op;
    } ops[] = {
        {"==", JOP_EQ}, {"!=", JOP_NE},       {"<", JOP_LT},  {">", JOP_GT},     {"<=", JOP_LE},
        {">=", JOP_GE}, {"+", JOP_ADD},       {"-", JOP_SUB}, {"~", JOP_CONCAT}, {"*", JOP_MUL},
        {"/", JOP_DIV}, {"//", JOP_FLOORDIV}, {"%", JOP_MOD}, {"**", JOP_POW},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(ops); i++)
        if (jstr_is(s, ops[i].s)) return ops[i].op;
    return JOP_NONE;
}

static int parse_add(parser *p, jnode **out);

static int parse_cmp(parser *p, jnode **out)
{
    unsigned links = 0;
    int rc = parse_add(p, out);
    while (!rc) {
        if ((rc = link(p, &links))) break;
        uint32_t pos = here(p);
        uint8_t op;
        if (is_ident(p, "not") && is_ident_at(p, 1, "in")) {
            op = JOP_NOT_IN;
            p->i += 2;
        } else if (is_ident(p, "in")) {
            op = JOP_IN;
            p->i++;
        } else if (is(p, JT_CMP)) {
            op = op_of(p->t[p->i++].s);
        } else {
            break;
        }
        jnode *b;
        rc = parse_add(p, &b);
        if (!rc) rc = binary(p, op, pos, *out, b, out);
    }
    p->depth -= links;
    return rc;
}

/* One left-associative level: operands from next, operators of type `type`. */
static int parse_level(parser *p, uint8_t type, int (*next)(parser *, jnode **), jnode **out)
{
    unsigned links = 0;
    int rc = next(p, out);
    while (!rc && is(p, type)) {
        if ((rc = link(p, &links))) break;
        uint32_t pos = here(p);
        uint8_t op = op_of(p->t[p->i++].s);
        jnode *b;
        rc = next(p, &b);
        if (!rc) rc = binary(p, op, pos, *out, b, out);
    }
    p->depth -= links;
    return rc;
}

static int parse_mul(parser *p, jnode **out);
static int parse_pow(parser *p, jnode **out);
static int parse_test(parser *p, jnode **out);

static int parse_add(parser *p, jnode **out)
{
    return parse_level(p, JT_ADD, parse_mul, out);
}
static int parse_mul(parser *p, jnode **out)
{
    return parse_level(p, JT_MUL, parse_pow, out);
}
/* left-associative, as in Jinja: 2 ** 3 ** 2 is 64 */
static int parse_pow(parser *p, jnode **out)
{
    return parse_level(p, JT_POW, parse_test, out);
}

static int parse_filter_expr(parser *p, jnode **out);

static int parse_test(parser *p, jnode **out)
{
    unsigned links = 0;
    int rc = parse_filter_expr(p, out);
    while (!rc && is_ident(p, "is")) {
        if ((rc = link(p, &links))) break;
        uint32_t pos = here(p);
        p->i++;
        bool negate = is_ident(p, "not");
        p->i += negate;
        jnode *name, *n;
        if ((rc = parse_primary(p, &name))) return rc;
        if (name->kind != JN_IDENT) return p_fail(p, "expected the name of a test after 'is'");
        if (!(n = node(p, JN_TEST, pos))) return dx_errcode();
        n->a = *out;
        n->str = name->str;
        n->op = negate;
        *out = n;
    }
    p->depth -= links;
    return rc;
}

static int parse_unary(parser *p, jnode **out);

static int parse_filter_expr(parser *p, jnode **out)
{
    unsigned links = 0;
    int rc = parse_unary(p, out);
    while (!rc && is(p, JT_PIPE)) {
        if ((rc = link(p, &links))) break;
        uint32_t pos = here(p);
        p->i++;
        jnode *f, *n;
        if ((rc = parse_primary(p, &f))) return rc;
        if (f->kind != JN_IDENT) return p_fail(p, "expected the name of a filter after '|'");
        if (is(p, JT_LPAREN) && (rc = parse_call(p, f, &f))) return rc;
        if (!(n = node(p, JN_FILTER, pos))) return dx_errcode();
        n->a = *out;
        n->b = f;
        *out = n;
    }
    p->depth -= links;
    return rc;
}

static int parse_call_member(parser *p, jnode **out);
static int parse_member(parser *p, jnode *obj, jnode **out);

static int parse_unary_in(parser *p, jnode **out)
{
    if (p->i < p->n && (is(p, JT_UNARY) || is(p, JT_ADD)) &&
        (jstr_is(p->t[p->i].s, "-") || jstr_is(p->t[p->i].s, "+"))) {
        jnode *n = node(p, JN_UNARY, here(p));
        if (!n) return dx_errcode();
        n->op = p->t[p->i++].s.p[0] == '-' ? JOP_SUB : JOP_ADD;
        *out = n;
        return parse_unary(p, &n->a);
    }
    return parse_call_member(p, out);
}

static int parse_unary(parser *p, jnode **out)
{
    int rc = enter(p);
    if (!rc) rc = parse_unary_in(p, out);
    p->depth--;
    return rc;
}

static int parse_call_member(parser *p, jnode **out)
{
    jnode *prim;
    int rc = parse_primary(p, &prim);
    if (!rc) rc = parse_member(p, prim, out);
    if (!rc && is(p, JT_LPAREN)) rc = parse_call(p, *out, out);
    return rc;
}

static int parse_call_in(parser *p, jnode *callee, jnode **out)
{
    jnode *n = node(p, JN_CALL, callee->pos);
    if (!n) return dx_errcode();
    n->a = callee;
    int rc = parse_args(p, false, &n->l1);
    if (!rc) rc = parse_member(p, n, out);
    if (!rc && is(p, JT_LPAREN)) rc = parse_call(p, *out, out);
    return rc;
}

static int parse_call(parser *p, jnode *callee, jnode **out)
{
    int rc = enter(p);
    if (!rc) rc = parse_call_in(p, callee, out);
    p->depth--;
    return rc;
}

/* One argument or parameter: expr, name=expr, *expr or **expr. */
static int parse_arg(parser *p, bool params, bool *seen_kw, bool *seen_spread, jnode **out)
{
    uint32_t pos = here(p);
    bool kwspread = is(p, JT_POW), spread = is(p, JT_MUL) && jstr_is(p->t[p->i].s, "*");
    if (params && (kwspread || spread))
        return p_fail(p, "argument unpacking is not allowed in parameter declarations");
    if (kwspread || spread) {
        if (spread && *seen_spread) return p_fail(p, "only one '*' argument unpacking is allowed");
        *seen_spread |= spread;
        p->i++;
        jnode *n = node(p, kwspread ? JN_KWSPREAD : JN_SPREAD, pos);
        *out = n;
        return n ? parse_expr(p, &n->a) : dx_errcode();
    }
    int rc = parse_expr(p, out);
    if (!rc && is(p, JT_EQUALS)) {
        p->i++;
        if ((*out)->kind != JN_IDENT)
            return p_fail(p, params ? "expected a name for the parameter"
                                    : "expected a name for the keyword argument");
        jnode *n = node(p, JN_KWARG, (*out)->pos);
        if (!n) return dx_errcode();
        n->str = (*out)->str;
        *out = n;
        rc = parse_expr(p, &n->a);
    }
    if (rc) return rc;
    if (params && (*out)->kind != JN_IDENT && (*out)->kind != JN_KWARG)
        return p_fail(p, "expected a name for the parameter");
    if ((*out)->kind == JN_KWARG) {
        *seen_kw = true;
    } else if (*seen_kw) {
        return p_fail(p, params ? "a parameter without a default follows one with a default"
                                : "positional arguments must come before keyword arguments");
    } else if (*seen_spread) {
        return p_fail(p, "positional arguments must not follow '*' argument unpacking");
    }
    return 0;
}

static bool dup_param(const nlist *l, const jnode *a)
{
    for (size_t i = 0; i < l->n; i++)
        if (jstr_eq(l->v[i]->str, a->str)) return true;
    return false;
}

static int parse_args_in(parser *p, bool params, nlist *l)
{
    bool seen_kw = false, seen_spread = false;
    while (!is(p, JT_RPAREN)) {
        if (p->i >= p->n) return p_expected(p, "')'");
        jnode *a = NULL;
        int rc = parse_arg(p, params, &seen_kw, &seen_spread, &a);
        if (rc) return rc;
        if (params && dup_param(l, a))
            return p_fail(p, "duplicate parameter '%.*s'", (int)a->str.n, a->str.p);
        if ((rc = nl_push(l, a))) return rc;
        if (a->kind == JN_KWSPREAD) {
            if (is(p, JT_COMMA)) p->i++;
            if (!is(p, JT_RPAREN)) return p_expected(p, "')' after the '**' argument");
            break;
        }
        if (is(p, JT_COMMA)) p->i++;
    }
    return 0;
}

static int parse_args(parser *p, bool params, jlist *out)
{
    int rc = expect(p, JT_LPAREN, "'('");
    if (rc) return rc;
    nlist l = {0};
    rc = parse_args_in(p, params, &l);
    int rc2 = nl_finish(p, &l, out);
    if (!rc) rc = rc2;
    return rc ? rc : expect(p, JT_RPAREN, "')'");
}

/* Inside [ ]: an index, or a slice [a:b:c] with any part left out. */
static int parse_subscript(parser *p, jnode **out)
{
    uint32_t pos = here(p);
    jnode *parts[4] = {NULL, NULL, NULL, NULL};
    size_t n = 0;
    bool slice = false;
    while (!is(p, JT_RBRACKET)) {
        if (p->i >= p->n) return p_expected(p, "']'");
        jnode *part = NULL;
        if (is(p, JT_COLON)) {
            p->i++;
            slice = true;
        } else {
            int rc = parse_expr(p, &part);
            if (rc) return rc;
            if (is(p, JT_COLON)) {
                p->i++;
                slice = true;
            }
        }
        if (n < 4) parts[n] = part;
        n++;
    }
    if (!n) return p_fail(p, "expected an index or a slice inside '[]'");
    if (!slice) {
        *out = parts[0];
        return 0;
    }
    if (n > 3) return p_fail(p, "a slice has at most three parts [start:stop:step]");
    jnode *s = node(p, JN_SLICE, pos);
    if (!s) return dx_errcode();
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    *out = s;
    return 0;
}

static int parse_member(parser *p, jnode *obj, jnode **out)
{
    unsigned links = 0;
    while (is(p, JT_DOT) || is(p, JT_LBRACKET)) {
        if (link(p, &links)) return dx_errcode();
        bool computed = is(p, JT_LBRACKET);
        jnode *n = node(p, JN_MEMBER, here(p));
        if (!n) return dx_errcode();
        p->i++;
        n->a = obj;
        n->op = computed;
        int rc = computed ? parse_subscript(p, &n->b) : parse_primary(p, &n->b);
        if (!rc && computed) rc = expect(p, JT_RBRACKET, "']'");
        if (rc) return rc;
        if (!computed && n->b->kind != JN_IDENT && n->b->kind != JN_INT)
            return p_fail(p, "expected a name or an integer after '.'");
        obj = n;
    }
    p->depth -= links;
    *out = obj;
    return 0;
}

static int parse_number(parser *p, const jtok *t, jnode **out)
{
    bool fl = memchr(t->s.p, '.', t->s.n) != NULL;
    jnode *n = node(p, fl ? JN_FLOAT : JN_INT, t->pos);
    if (!n) return dx_errcode();
    n->num = strtod(t->s.p, NULL); /* the token is NUL-terminated digits */
    *out = n;
    return 0;
}

/* 'a' 'b' is 'ab' */
static int parse_string(parser *p, const jtok *t, jnode **out)
{
    jnode *n = node(p, JN_STR, t->pos);
    if (!n) return dx_errcode();
    n->str = t->s;
    size_t total = t->s.n, k = p->i;
    while (k < p->n && p->t[k].type == JT_STR) total += p->t[k++].s.n;
    if (k > p->i) {
        char *s = ja_alloc(p->ar, total + 1);
        if (!s) return dx_errcode();
        memcpy(s, t->s.p, t->s.n);
        for (size_t o = t->s.n; p->i < k; p->i++) {
            memcpy(s + o, p->t[p->i].s.p, p->t[p->i].s.n);
            o += p->t[p->i].s.n;
        }
        n->str = (jstr){s, total};
    }
    *out = n;
    return 0;
}

static int parse_list_lit(parser *p, uint32_t pos, jnode **out)
{
    jnode *n = node(p, JN_ARRAY, pos);
    if (!n) return dx_errcode();
    *out = n;
    nlist l = {0};
    int rc = 0;
    while (!rc && !is(p, JT_RBRACKET)) {
        jnode *e;
        rc = p->i >= p->n ? p_expected(p, "']'") : parse_expr(p, &e);
        if (!rc) rc = nl_push(&l, e);
        if (!rc && is(p, JT_COMMA)) p->i++;
    }
    p->i++;
    int rc2 = nl_finish(p, &l, &n->l1);
    return rc ? rc : rc2;
}

static int parse_dict_lit(parser *p, uint32_t pos, jnode **out)
{
    jnode *n = node(p, JN_OBJECT, pos);
    if (!n) return dx_errcode();
    *out = n;
    nlist l = {0};
    int rc = 0;
    while (!rc && !is(p, JT_RBRACE)) {
        jnode *k, *v;
        rc = p->i >= p->n ? p_expected(p, "'}'") : parse_expr(p, &k);
        if (!rc) rc = expect(p, JT_COLON, "':' between a key and its value");
        if (!rc) rc = parse_expr(p, &v);
        if (!rc) rc = nl_push(&l, k);
        if (!rc) rc = nl_push(&l, v);
        if (!rc && is(p, JT_COMMA)) p->i++;
    }
    p->i++;
    int rc2 = nl_finish(p, &l, &n->l1);
    return rc ? rc : rc2;
}

static int parse_primary(parser *p, jnode **out)
{
    if (p->i >= p->n) return p_expected(p, "an expression");
    const jtok *t = &p->t[p->i++];
    switch (t->type) {
    case JT_NUM:
        return parse_number(p, t, out);
    case JT_STR:
        return parse_string(p, t, out);
    case JT_IDENT:
        if (!(*out = node(p, JN_IDENT, t->pos))) return dx_errcode();
        (*out)->str = t->s;
        return 0;
    case JT_LPAREN: {
        int rc = parse_expr_seq(p, false, out);
        return rc ? rc : expect(p, JT_RPAREN, "')'");
    }
    case JT_LBRACKET:
        return parse_list_lit(p, t->pos, out);
    case JT_LBRACE:
        return parse_dict_lit(p, t->pos, out);
    default:
        p->i--;
        return p_expected(p, "an expression");
    }
}

/* ---- entry points --------------------------------------------------------- */

int jinja_parse(const char *src, size_t len, jinja_tmpl **out)
{
    *out = NULL;
    if (len > JINJA_MAX_SOURCE)
        return dx_errf(DX_ETOOBIG, "jinja: template of %zu bytes is larger than the limit of %u",
                       len, JINJA_MAX_SOURCE);
    size_t valid = 0;
    while (valid < len) {
        size_t l = dx_utf8_seq_len((const uint8_t *)src + valid, len - valid);
        if (!l) break;
        valid += l;
    }
    jinja_tmpl *t = dx_calloc(1, sizeof *t);
    if (!t) return dx_errf(DX_ENOMEM, "jinja: out of memory");
    char *copy = ja_alloc(&t->ar, len + 1);
    int rc = copy ? 0 : dx_errcode();
    if (!rc) {
        if (len) memcpy(copy, src, len);
        t->src = copy;
        t->len = len;
    }
    if (!rc && valid < len)
        rc = jinja_err_at(DX_EINVAL, src, len, valid, "the template is not valid UTF-8");
    jtoks toks = {0};
    if (!rc) rc = jl_tokenize(&t->ar, t->src, len, &toks);
    parser p = {.ar = &t->ar, .src = t->src, .len = len, .t = toks.v, .n = toks.n};
    nlist body = {0};
    while (!rc && p.i < p.n) {
        jnode *n;
        rc = parse_any(&p, &n);
        if (!rc) rc = nl_push(&body, n);
    }
    int rc2 = nl_finish(&p, &body, &t->body);
    if (!rc) rc = rc2;
    if (rc) {
        jinja_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void jinja_free(jinja_tmpl *t)
{
    if (!t) return;
    ja_free_all(&t->ar);
    dx_free(t);
}
