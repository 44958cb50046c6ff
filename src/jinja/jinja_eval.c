/* jinja_eval: runs a parsed template, as @huggingface/jinja's Interpreter.
 *
 * Statements write straight into the current output buffer; a block whose
 * text becomes a value (a macro call, `{% set x %}...{% endset %}`, a filter
 * block) renders into a scratch buffer instead.  break and continue unwind
 * as positive signals to the nearest loop that is running (dynamically, so a
 * macro called in a loop can break it, as in the reference), and the loop
 * drops what the interrupted iteration wrote, as the reference does.
 *
 * Scopes follow the reference, not Python Jinja: a for loop gets one scope
 * for all its iterations (so `set` in a loop body persists across
 * iterations but not after the loop), `if` bodies share the enclosing
 * scope, and a macro's body sees the scope it is called from.
 *
 * Every expression and statement counts a step and a level of depth
 * against the render's limits, so loops end and recursion is bounded. */
#include "jinja/jinja_priv.h"

#include <math.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

static const jinja_limits k_defaults = {
    .max_output = 16u << 20,
    .max_memory = 256u << 20,
    .max_steps = 20000000,
    .max_depth = 400,
};

/* ---- scopes --------------------------------------------------------------- */

int jx_env_new(jcx *cx, uint32_t pos, jenv *parent, jenv **out)
{
    *out = jx_alloc(cx, sizeof **out);
    if (!*out) return jx_oom(cx, pos);
    (*out)->parent = parent;
    return 0;
}

/* Every scope has its own `namespace` (Environment's initial variables), so
 * only the innermost scope can shadow it. */
jv jx_lookup(jcx *cx, jenv *env, jstr name)
{
    if (jstr_is(name, "namespace")) {
        jv *v = jo_get(&env->vars, name);
        return v ? (v->k == JV_RAW ? jv_undef() : *v) : cx->ns_fn;
    }
    for (jenv *e = env; e; e = e->parent) {
        jv *v = jo_get(&e->vars, name);
        if (v) return v->k == JV_RAW ? jv_undef() : *v;
    }
    return jv_undef();
}

static int env_set(jcx *cx, uint32_t pos, jenv *env, jstr name, jv v)
{
    return jo_set(cx, pos, &env->vars, name, v);
}

/* One step and one level of depth; the caller leaves with cx->depth--. */
static int enter(jcx *cx, uint32_t pos)
{
    int rc = jx_steps(cx, pos, 1);
    if (rc) return rc;
    if (cx->depth >= cx->lim.max_depth)
        return jx_limit(cx, pos, "the template nests deeper than %u levels (runaway recursion?)",
                        cx->lim.max_depth);
    cx->depth++;
    return 0;
}

/* ---- calls ---------------------------------------------------------------- */

/* A growable list of values in the arena. */
typedef struct {
    jv *v;
    size_t n, cap;
} vlist;

static int vl_push(jcx *cx, uint32_t pos, vlist *l, jv v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *nv = jx_alloc(cx, cap * sizeof *nv);
        if (!nv) return jx_oom(cx, pos);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

static int add_kwarg(jcx *cx, uint32_t pos, jobj *kw, jstr key, jv v)
{
    if (jo_get(kw, key))
        return jx_fail(cx, pos, "got multiple values for keyword argument '%.*s'", (int)key.n,
                       key.p);
    return jo_set(cx, pos, kw, key, v);
}

static int eval_positional(jcx *cx, jenv *env, const jnode *a, vlist *l)
{
    jv v;
    int rc = jx_eval(cx, env, a->kind == JN_SPREAD ? a->a : a, &v);
    if (rc || a->kind != JN_SPREAD) return rc ? rc : vl_push(cx, a->pos, l, v);
    if (v.k != JV_ARR)
        return jx_fail(cx, a->pos, "cannot unpack %s with '*': not a list", jx_type_name(v));
    for (size_t i = 0; !rc && i < v.a->n; i++) rc = vl_push(cx, a->pos, l, v.a->v[i]);
    return rc;
}

static int eval_keyword(jcx *cx, jenv *env, const jnode *a, jobj *kw)
{
    jv v;
    int rc = jx_eval(cx, env, a->a, &v);
    if (rc) return rc;
    if (a->kind == JN_KWARG) return add_kwarg(cx, a->pos, kw, a->str, v);
    if (v.k != JV_OBJ)
        return jx_fail(cx, a->pos, "the argument after '**' must be a dict, not %s",
                       jx_type_name(v));
    for (size_t i = 0; !rc && i < v.o->n; i++)
        rc = add_kwarg(cx, a->pos, kw, v.o->keys[i], v.o->vals[i]);
    return rc;
}

/* Like Python, every positional argument before any keyword value. */
int jx_eval_args(jcx *cx, jenv *env, const jlist *args, jv **pos_out, size_t *npos, jobj **kw)
{
    vlist l = {0};
    int rc = 0;
    for (uint32_t i = 0; !rc && i < args->n; i++) {
        const jnode *a = args->v[i];
        if (a->kind != JN_KWARG && a->kind != JN_KWSPREAD) rc = eval_positional(cx, env, a, &l);
    }
    jv kwv;
    if (!rc) rc = jx_obj_new(cx, args->n ? args->v[0]->pos : 0, JV_OBJ, &kwv);
    for (uint32_t i = 0; !rc && i < args->n; i++) {
        const jnode *a = args->v[i];
        if (a->kind == JN_KWARG || a->kind == JN_KWSPREAD) rc = eval_keyword(cx, env, a, kwv.o);
    }
    if (rc) return rc;
    kwv.o->kw = true;
    *pos_out = l.v;
    *npos = l.n;
    *kw = kwv.o;
    return 0;
}

/* `v | f`: f is a name, or a call whose arguments are evaluated here, after
 * the checks of a filter that reads them as written. */
static int apply_filter(jcx *cx, jenv *env, jv v, const jnode *f, jv *out)
{
    if (f->kind == JN_IDENT) return jx_filter_ident(cx, f->pos, v, f->str, out);
    if (f->kind != JN_CALL || f->a->kind != JN_IDENT)
        return jx_fail(cx, f->pos, "a filter must be a name or a call");
    if (jx_filter_literal_args(f->a->str)) return jx_filter_literal(cx, v, f, out);
    jv *args;
    size_t n;
    jobj *kw;
    int rc = jx_eval_args(cx, env, &f->l1, &args, &n, &kw);
    return rc ? rc : jx_filter_call(cx, f->pos, v, f->a->str, args, n, kw, out);
}

static int bind_error(jcx *cx, uint32_t pos, const jnode *fn_node, jstr key, size_t n)
{
    char name[80];
    if (fn_node->kind == JN_MACRO)
        snprintf(name, sizeof name, "'%.*s'", (int)(fn_node->str.n > 60 ? 60 : fn_node->str.n),
                 fn_node->str.p);
    else
        strcpy(name, "None"); /* a call block, as Jinja names it */
    if (key.n)
        return jx_fail(cx, pos, "macro %s takes no keyword argument '%.*s'", name, (int)key.n,
                       key.p);
    return jx_fail(cx, pos, "macro %s takes not more than %zu argument(s)", name, n);
}

/* The call's trailing keyword arguments, copied because binding takes the
 * parameters' names out of them; an empty dict if there are none. */
static int take_kwargs(jcx *cx, uint32_t pos, jv *args, size_t *nargs, jv *kw)
{
    int rc = jx_obj_new(cx, pos, JV_OBJ, kw);
    if (rc || !*nargs || args[*nargs - 1].k != JV_OBJ || !args[*nargs - 1].o->kw) return rc;
    const jobj *src = args[--*nargs].o;
    for (size_t i = 0; !rc && i < src->n; i++)
        rc = jo_set(cx, pos, kw->o, src->keys[i], src->vals[i]);
    return rc;
}

/* What no parameter took goes to kwargs / varargs when the body reads them,
 * and is an error otherwise. */
static int bind_extras(jcx *cx, uint32_t pos, const jnode *fn_node, size_t nparams, const jv *args,
                       size_t nargs, jv kw, jenv *scope)
{
    int rc = 0;
    if (fn_node->op & JN_USES_KWARGS)
        rc = env_set(cx, pos, scope, JSTR("kwargs"), kw);
    else if (kw.o->n)
        return bind_error(cx, pos, fn_node, kw.o->keys[0], 0);
    if (rc || !(fn_node->op & JN_USES_VARARGS))
        return rc || nargs <= nparams ? rc : bind_error(cx, pos, fn_node, (jstr){NULL, 0}, nparams);
    size_t extra = nargs > nparams ? nargs - nparams : 0;
    jv va;
    rc = jx_arr_new(cx, pos, extra, &va);
    for (size_t i = 0; !rc && i < extra; i++) va.a->v[i] = args[nparams + i];
    return rc ? rc : env_set(cx, pos, scope, JSTR("varargs"), va);
}

/* bindMacroArguments: every parameter is bound (to undefined if missing)
 * before any default is evaluated, so defaults see parameters, not outer
 * names.  JavaScript's raw undefined counts as a missing argument. */
static int bind_args(jcx *cx, uint32_t pos, const jnode *fn_node, const jlist *params, jv *args,
                     size_t nargs, jenv *scope)
{
    jv kw;
    int rc = take_kwargs(cx, pos, args, &nargs, &kw);
    bool *pending = params->n ? jx_alloc(cx, params->n * sizeof *pending) : NULL;
    if (!rc && params->n && !pending) rc = jx_oom(cx, pos);
    for (uint32_t i = 0; !rc && i < params->n; i++) {
        const jnode *p = params->v[i];
        jv v = i < nargs ? args[i] : (jv){.k = JV_RAW};
        jv *k = v.k == JV_RAW ? jo_get(kw.o, p->str) : NULL;
        if (k) {
            v = *k;
            jo_del(kw.o, p->str);
        }
        pending[i] = v.k == JV_RAW && p->kind == JN_KWARG;
        rc = env_set(cx, pos, scope, p->str, v.k == JV_RAW ? jv_undef() : v);
    }
    if (!rc) rc = bind_extras(cx, pos, fn_node, params->n, args, nargs, kw, scope);
    for (uint32_t i = 0; !rc && i < params->n; i++) {
        jv v;
        if (!pending[i]) continue;
        rc = jx_eval(cx, scope, params->v[i]->a, &v);
        if (!rc) rc = env_set(cx, pos, scope, params->v[i]->str, v);
    }
    return rc;
}

int jx_call(jcx *cx, uint32_t pos, jenv *env, jv fn, jv *args, size_t nargs, jv *out)
{
    if (fn.k != JV_FN)
        return jx_fail(cx, pos, "cannot call %s: it is not a function", jx_type_name(fn));
    const jfn *f = fn.f;
    if (f->kind == JF_NATIVE) return jx_call_native(cx, pos, f, args, nargs, out);
    int rc = enter(cx, pos);
    if (rc) return rc;
    const jnode *n = f->node;
    jenv *scope;
    /* a macro sees its caller's scope; a call block's caller() its own */
    rc = jx_env_new(cx, pos, f->kind == JF_MACRO ? env : f->env, &scope);
    if (!rc) rc = bind_args(cx, pos, n, &n->l1, args, nargs, scope);
    if (!rc) rc = jx_capture(cx, pos, scope, &n->l2, out);
    cx->depth--;
    return rc;
}

static int eval_call(jcx *cx, jenv *env, const jnode *n, jv *out)
{
    jv *args, fn;
    size_t nargs;
    jobj *kw;
    int rc = jx_eval_args(cx, env, &n->l1, &args, &nargs, &kw);
    if (!rc && kw->n) {
        vlist l = {args, nargs, nargs};
        rc = vl_push(cx, n->pos, &l, (jv){.k = JV_OBJ, .o = kw});
        args = l.v;
        nargs = l.n;
    }
    if (!rc) rc = jx_eval(cx, env, n->a, &fn);
    if (rc) return rc;
    const jnode *name = n->a->kind == JN_MEMBER && !n->a->op ? n->a->b : n->a;
    if (fn.k != JV_FN && name->kind == JN_IDENT)
        return jx_fail(cx, n->pos, "'%.*s' is not a function (it is %s)", (int)name->str.n,
                       name->str.p, jx_type_name(fn));
    return jx_call(cx, n->pos, env, fn, args, nargs, out);
}

/* ---- member access -------------------------------------------------------- */

/* String.prototype.at on UTF-16 units; a unit inside a surrogate pair,
 * which JavaScript would return alone, comes back as U+FFFD. */
static int string_at(jcx *cx, uint32_t pos, jstr s, double idx, jv *out)
{
    double len = (double)js_utf16_len(s), i = isnan(idx) ? 0 : trunc(idx);
    if (i < 0) i += len;
    *out = jv_undef();
    int rc = jx_steps(cx, pos, s.n / 32); /* the walks over the string */
    if (rc) return rc;
    if (!(i >= 0 && i < len)) return 0;
    size_t unit = 0, at = 0;
    for (;;) {
        uint32_t cp;
        size_t l = utf8_dec(s.p + at, s.n - at, &cp);
        size_t units = cp >= 0x10000 ? 2 : 1;
        if ((double)(unit + units) > i) {
            if (units == 2) return jx_strdup(cx, pos, "\xEF\xBF\xBD", 3, out);
            return jx_strdup(cx, pos, s.p + at, l, out);
        }
        unit += units;
        at += l;
    }
}

static jv array_at(const jarr *a, double idx)
{
    double len = (double)a->n, i = isnan(idx) ? 0 : trunc(idx);
    if (i < 0) i += len;
    if (!(i >= 0 && i < len)) return jv_undef();
    jv v = a->v[(size_t)i];
    return v.k == JV_RAW ? jv_undef() : v;
}

static int eval_slice(jcx *cx, jenv *env, jv obj, const jnode *s, jv *out)
{
    if (obj.k != JV_ARR && obj.k != JV_STR)
        return jx_fail(cx, s->pos, "only a list or a string can be sliced, not %s",
                       jx_type_name(obj));
    jv part[3];
    const jnode *nodes[3] = {s->a, s->b, s->c};
    for (int i = 0; i < 3; i++) {
        part[i] = jv_undef();
        int rc = nodes[i] ? jx_eval(cx, env, nodes[i], &part[i]) : 0;
        if (rc) return rc;
        if (part[i].k != JV_INT && part[i].k != JV_UNDEF)
            return jx_fail(cx, s->pos, "slice %s must be an integer or left out, not %s",
                           i == 0   ? "start"
                           : i == 1 ? "stop"
                                    : "step",
                           jx_type_name(part[i]));
    }
    return jx_slice_value(cx, s->pos, obj, part[0], part[1], part[2], out);
}

static int member_of_map(jcx *cx, uint32_t pos, jv obj, jv prop, jv *out)
{
    if (prop.k != JV_STR)
        return jx_fail(cx, pos, "a %s's keys are strings; cannot look up %s", jx_type_name(obj),
                       jx_type_name(prop));
    jv *v = jo_get(obj.o, prop.s);
    if (v && v->k != JV_RAW) {
        *out = *v;
        return 0;
    }
    if (obj.k == JV_OBJ) return jx_builtin_member(cx, pos, obj, prop.s, out);
    *out = jv_undef();
    return 0;
}

static int member_value(jcx *cx, uint32_t pos, jv obj, jv prop, jv *out)
{
    if (obj.k == JV_RAW) return jx_raw_error(cx, pos);
    if (jv_is_map(obj)) return member_of_map(cx, pos, obj, prop, out);
    if (obj.k == JV_ARR || obj.k == JV_STR) {
        if (prop.k == JV_INT) {
            if (obj.k == JV_STR) return string_at(cx, pos, obj.s, prop.n, out);
            *out = array_at(obj.a, prop.n);
            return 0;
        }
        if (prop.k == JV_STR) return jx_builtin_member(cx, pos, obj, prop.s, out);
        return jx_fail(cx, pos, "a %s is indexed by integers, not by %s", jx_type_name(obj),
                       jx_type_name(prop));
    }
    if (prop.k != JV_STR)
        return jx_fail(cx, pos, "cannot index %s with %s", jx_type_name(obj), jx_type_name(prop));
    *out = jv_undef(); /* attributes of none, numbers, undefined...: undefined */
    return 0;
}

static int eval_member(jcx *cx, jenv *env, const jnode *n, jv *out)
{
    jv obj, prop;
    int rc = jx_eval(cx, env, n->a, &obj);
    if (rc) return rc;
    if (n->op && n->b->kind == JN_SLICE) return eval_slice(cx, env, obj, n->b, out);
    if (n->op)
        rc = jx_eval(cx, env, n->b, &prop);
    else
        prop = n->b->kind == JN_INT ? jv_int(n->b->num) : jv_str(n->b->str);
    return rc ? rc : member_value(cx, n->pos, obj, prop, out);
}

/* ---- operators ------------------------------------------------------------ */

static const char *op_name(uint8_t op)
{
    static const char *const names[] = {
        [JOP_AND] = "and",     [JOP_OR] = "or",    [JOP_NOT] = "not",       [JOP_EQ] = "==",
        [JOP_NE] = "!=",       [JOP_LT] = "<",     [JOP_GT] = ">",          [JOP_LE] = "<=",
        [JOP_GE] = ">=",       [JOP_IN] = "in",    [JOP_NOT_IN] = "not in", [JOP_ADD] = "+",
        [JOP_SUB] = "-",       [JOP_CONCAT] = "~", [JOP_MUL] = "*",         [JOP_DIV] = "/",
        [JOP_FLOORDIV] = "//", [JOP_MOD] = "%",    [JOP_POW] = "**",
    };
    return op < DX_ARRAY_LEN(names) && names[op] ? names[op] : "?";
}

static int eval_unary(jcx *cx, jenv *env, const jnode *n, jv *out)
{
    jv v;
    int rc = jx_eval(cx, env, n->a, &v);
    if (rc) return rc;
    if (n->op == JOP_NOT) {
        bool b = false;
        rc = jx_test_truth(cx, n->pos, v, &b);
        *out = jv_bool(!b);
        return rc;
    }
    if (v.k != JV_INT && v.k != JV_FLOAT && v.k != JV_BOOL)
        return jx_fail(cx, n->pos, "unary '%s' needs a number, not %s", op_name(n->op),
                       jx_type_name(v));
    double x = v.k == JV_BOOL ? (double)v.b : v.n, sign = n->op == JOP_SUB ? -1 : 1;
    *out = v.k == JV_FLOAT ? jv_float(sign * x) : jv_int(sign * x);
    return 0;
}

static int concat_raw(jcx *cx, uint32_t pos, jv a, jv b, jv *out)
{
    dx_buf buf;
    jx_buf_init(cx, &buf);
    int rc = jx_put_raw(cx, pos, &buf, a);
    if (!rc) rc = jx_put_raw(cx, pos, &buf, b);
    if (!rc) rc = jx_buf_str(cx, pos, &buf, out);
    dx_buf_free(&buf);
    return rc;
}

/* JavaScript's ** (NaN where Math.pow differs from C's pow). */
static double js_pow(double a, double b)
{
    if (isnan(b) || (fabs(a) == 1 && isinf(b))) return NAN;
    return pow(a, b);
}

static int eval_pow(jcx *cx, uint32_t pos, jv l, jv r, jv *out)
{
    double a = l.k == JV_BOOL ? (double)l.b : l.n, b = r.k == JV_BOOL ? (double)r.b : r.n;
    if (a == 0 && b < 0) return jx_fail(cx, pos, "0.0 cannot be raised to a negative power");
    double res = js_pow(a, b);
    if (!isfinite(res)) return jx_fail(cx, pos, "'**' gives no finite real number here");
    *out = l.k == JV_FLOAT || r.k == JV_FLOAT || b < 0 ? jv_float(res) : jv_int(res);
    return 0;
}

/* Numbers: arithmetic and ordering; false for operators numbers lack. */
static bool eval_numeric(uint8_t op, jv l, jv r, jv *out)
{
    double a = l.n, b = r.n, res;
    bool fl = l.k == JV_FLOAT || r.k == JV_FLOAT;
    switch (op) {
    case JOP_ADD:
        res = a + b;
        break;
    case JOP_SUB:
        res = a - b;
        break;
    case JOP_MUL:
        res = a * b;
        break;
    case JOP_DIV:
        *out = jv_float(a / b);
        return true;
    case JOP_FLOORDIV:
        res = floor(a / b);
        break;
    case JOP_MOD:
        res = fmod(a, b);
        break;
    case JOP_LT:
        *out = jv_bool(a < b);
        return true;
    case JOP_GT:
        *out = jv_bool(a > b);
        return true;
    case JOP_GE:
        *out = jv_bool(a >= b);
        return true;
    case JOP_LE:
        *out = jv_bool(a <= b);
        return true;
    default:
        return false;
    }
    *out = fl ? jv_float(res) : jv_int(res);
    return true;
}

static bool str_contains(jstr hay, jstr needle)
{
    return !needle.n || (hay.n && memmem(hay.p, hay.n, needle.p, needle.n));
}

static bool in_array(const jarr *a, jv x)
{
    for (size_t i = 0; i < a->n; i++)
        if (jx_strict_eq(a->v[i], x)) return true;
    return false;
}

static int concat_arrays(jcx *cx, uint32_t pos, const jarr *a, const jarr *b, jv *out)
{
    int rc = jx_steps(cx, pos, (a->n + b->n) / 16);
    if (!rc) rc = jx_arr_new(cx, pos, a->n + b->n, out);
    if (rc) return rc;
    if (a->n) memcpy(out->a->v, a->v, a->n * sizeof *a->v);
    if (b->n) memcpy(out->a->v + a->n, b->v, b->n * sizeof *b->v);
    return 0;
}

/* The operators after the undefined and none checks, in the reference's
 * order of cases; 1 when none applies. */
static int eval_typed(jcx *cx, uint32_t pos, uint8_t op, jv l, jv r, jv *out)
{
    bool in = op == JOP_IN || op == JOP_NOT_IN;
    if (op == JOP_CONCAT) return concat_raw(cx, pos, l, r, out);
    bool nl = l.k == JV_INT || l.k == JV_FLOAT || l.k == JV_BOOL;
    bool nr = r.k == JV_INT || r.k == JV_FLOAT || r.k == JV_BOOL;
    if (op == JOP_POW && nl && nr) return eval_pow(cx, pos, l, r, out);
    if (jv_is_num(l) && jv_is_num(r)) {
        if (eval_numeric(op, l, r, out)) return 0;
    } else if (l.k == JV_ARR && r.k == JV_ARR) {
        if (op == JOP_ADD) return concat_arrays(cx, pos, l.a, r.a, out);
    } else if (r.k == JV_ARR && in) {
        int rc = jx_steps(cx, pos, r.a->n / 16);
        *out = jv_bool(in_array(r.a, l) == (op == JOP_IN));
        return rc;
    }
    if ((l.k == JV_STR || r.k == JV_STR) && op == JOP_ADD) return concat_raw(cx, pos, l, r, out);
    if (l.k == JV_STR && r.k == JV_STR && in) {
        *out = jv_bool(str_contains(r.s, l.s) == (op == JOP_IN));
        return jx_steps(cx, pos, r.s.n / 64);
    }
    if (l.k == JV_STR && r.k == JV_OBJ && in) {
        *out = jv_bool((jo_get(r.o, l.s) != NULL) == (op == JOP_IN));
        return 0;
    }
    return 1;
}

static int eval_binary(jcx *cx, jenv *env, const jnode *n, jv *out)
{
    jv l, r;
    bool b = false;
    int rc = jx_eval(cx, env, n->a, &l);
    if (rc) return rc;
    if (n->op == JOP_AND || n->op == JOP_OR) {
        if ((rc = jx_test_truth(cx, n->pos, l, &b))) return rc;
        if (b == (n->op == JOP_OR)) {
            *out = l;
            return 0;
        }
        return jx_eval(cx, env, n->b, out);
    }
    if ((rc = jx_eval(cx, env, n->b, &r))) return rc;
    if (n->op == JOP_EQ || n->op == JOP_NE) {
        rc = jx_loose_eq(cx, n->pos, l, r, &b);
        *out = jv_bool(b == (n->op == JOP_EQ));
        return rc;
    }
    if (l.k == JV_RAW || r.k == JV_RAW) return jx_raw_error(cx, n->pos);
    if (l.k == JV_UNDEF || r.k == JV_UNDEF) {
        if (r.k == JV_UNDEF && (n->op == JOP_IN || n->op == JOP_NOT_IN)) {
            *out = jv_bool(n->op == JOP_NOT_IN); /* anything in undefined is false */
            return 0;
        }
        return jx_fail(cx, n->pos, "cannot apply '%s' to an undefined value", op_name(n->op));
    }
    if (l.k == JV_NULL || r.k == JV_NULL)
        return jx_fail(cx, n->pos, "cannot apply '%s' to none", op_name(n->op));
    rc = eval_typed(cx, n->pos, n->op, l, r, out);
    if (rc <= 0) return rc;
    return jx_fail(cx, n->pos, "operator '%s' is not defined between %s and %s", op_name(n->op),
                   jx_type_name(l), jx_type_name(r));
}

/* ---- other expressions ---------------------------------------------------- */

static int eval_list(jcx *cx, jenv *env, const jnode *n, jv *out)
{
    int rc = jx_arr_new(cx, n->pos, n->l1.n, out);
    for (uint32_t i = 0; !rc && i < n->l1.n; i++) rc = jx_eval(cx, env, n->l1.v[i], &out->a->v[i]);
    if (!rc) out->a->tuple = n->kind == JN_TUPLE;
    return rc;
}

static int eval_dict(jcx *cx, jenv *env, const jnode *n, jv *out)
{
    int rc = jx_obj_new(cx, n->pos, JV_OBJ, out);
    for (uint32_t i = 0; !rc && i + 1 < n->l1.n; i += 2) {
        jv k, v;
        rc = jx_eval(cx, env, n->l1.v[i], &k);
        if (!rc && k.k != JV_STR)
            rc = jx_fail(cx, n->l1.v[i]->pos, "dict keys must be strings, not %s", jx_type_name(k));
        if (!rc) rc = jx_eval(cx, env, n->l1.v[i + 1], &v);
        if (!rc) rc = jo_set(cx, n->pos, out->o, k.s, v);
    }
    return rc;
}

static int eval_test(jcx *cx, jenv *env, const jnode *n, jv *out)
{
    jv v;
    bool res;
    int rc = jx_eval(cx, env, n->a, &v);
    if (!rc && !jx_test_exists(n->str))
        rc = jx_fail(cx, n->pos, "unknown test '%.*s'", (int)n->str.n, n->str.p);
    if (!rc) rc = jx_run_test(cx, n->pos, n->str, v, NULL, &res);
    if (!rc) *out = jv_bool(res != (bool)n->op);
    return rc;
}

static int eval_cond(jcx *cx, jenv *env, const jnode *n, jv *out)
{
    jv c;
    bool b = false;
    const jnode *cond = n->kind == JN_SELECT ? n->b : n->a;
    int rc = jx_eval(cx, env, cond, &c);
    if (!rc) rc = jx_test_truth(cx, n->pos, c, &b);
    if (rc) return rc;
    if (n->kind == JN_SELECT && !b) {
        *out = jv_undef();
        return 0;
    }
    return jx_eval(cx, env, n->kind == JN_SELECT ? n->a : b ? n->b : n->c, out);
}

static int eval_in(jcx *cx, jenv *env, const jnode *n, jv *out)
{
    jv v;
    int rc;
    switch (n->kind) {
    case JN_INT:
        *out = jv_int(n->num);
        return 0;
    case JN_FLOAT:
        *out = jv_float(n->num);
        return 0;
    case JN_STR:
    case JN_TEXT:
        *out = jv_str(n->str);
        return 0;
    case JN_IDENT:
        *out = jx_lookup(cx, env, n->str);
        return 0;
    case JN_ARRAY:
    case JN_TUPLE:
        return eval_list(cx, env, n, out);
    case JN_OBJECT:
        return eval_dict(cx, env, n, out);
    case JN_CALL:
        return eval_call(cx, env, n, out);
    case JN_MEMBER:
        return eval_member(cx, env, n, out);
    case JN_UNARY:
        return eval_unary(cx, env, n, out);
    case JN_BINARY:
        return eval_binary(cx, env, n, out);
    case JN_FILTER:
        rc = jx_eval(cx, env, n->a, &v);
        return rc ? rc : apply_filter(cx, env, v, n->b, out);
    case JN_TEST:
        return eval_test(cx, env, n, out);
    case JN_SELECT:
    case JN_TERNARY:
        return eval_cond(cx, env, n, out);
    default:
        return jx_fail(cx, n->pos, "this cannot be used as a value here");
    }
}

int jx_eval(jcx *cx, jenv *env, const jnode *n, jv *out)
{
    int rc = enter(cx, n->pos);
    if (rc) return rc;
    rc = eval_in(cx, env, n, out);
    cx->depth--;
    return rc;
}

/* ---- statements ----------------------------------------------------------- */

int jx_capture(jcx *cx, uint32_t pos, jenv *env, const jlist *body, jv *out)
{
    dx_buf b, *saved = cx->out;
    jx_buf_init(cx, &b);
    cx->out = &b;
    int rc = jx_exec(cx, env, body);
    cx->out = saved;
    if (!rc) rc = jx_buf_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

static int output(jcx *cx, uint32_t pos, jv v)
{
    if (v.k == JV_NULL || v.k == JV_UNDEF) return 0;
    if (v.k == JV_STR) return jx_append(cx, pos, cx->out, v.s.p, v.s.n);
    return jx_put_str(cx, pos, cx->out, v);
}

/* The loop variable(s) for one item. */
static int bind_loop_var(jcx *cx, jenv *scope, const jnode *var, jv item)
{
    if (var->kind == JN_IDENT) return env_set(cx, var->pos, scope, var->str, item);
    if (item.k != JV_ARR || item.a->tuple)
        return jx_fail(cx, var->pos, "cannot unpack %s into loop variables", jx_type_name(item));
    if (item.a->n != var->l1.n)
        return jx_fail(cx, var->pos, "too %s items to unpack: %zu for %u names",
                       item.a->n < var->l1.n ? "few" : "many", item.a->n, var->l1.n);
    int rc = 0;
    for (uint32_t j = 0; !rc && j < var->l1.n; j++) {
        const jnode *name = var->l1.v[j];
        if (name->kind != JN_IDENT) return jx_fail(cx, name->pos, "a loop variable must be a name");
        rc = env_set(cx, name->pos, scope, name->str, item.a->v[j]);
    }
    return rc;
}

/* The items a loop runs over: a list's items or a dict's keys, filtered by
 * `for x in xs if cond`. */
static int loop_items(jcx *cx, jenv *scope, const jnode *n, vlist *items)
{
    const jnode *src = n->b->kind == JN_SELECT ? n->b->a : n->b;
    const jnode *test = n->b->kind == JN_SELECT ? n->b->b : NULL;
    jv it;
    int rc = jx_eval(cx, scope, src, &it);
    if (rc) return rc;
    if (it.k == JV_OBJ)
        rc = jx_builtin_keys(cx, n->pos, it.o, &it);
    else if (it.k != JV_ARR)
        return jx_fail(cx, n->pos, "for loop: cannot iterate over %s", jx_type_name(it));
    for (size_t i = 0; !rc && i < it.a->n; i++) {
        bool keep = true;
        if (test) {
            jenv *ls;
            jv c;
            rc = jx_env_new(cx, n->pos, scope, &ls);
            if (!rc) rc = bind_loop_var(cx, ls, n->a, it.a->v[i]);
            if (!rc) rc = jx_eval(cx, ls, test, &c);
            if (!rc) rc = jx_test_truth(cx, test->pos, c, &keep);
        }
        if (!rc) rc = jx_steps(cx, n->pos, 1);
        if (!rc && keep) rc = vl_push(cx, n->pos, items, it.a->v[i]);
    }
    return rc;
}

static int loop_object(jcx *cx, uint32_t pos, const vlist *items, size_t i, jv *out)
{
    size_t n = items->n;
    jv none = jv_undef();
    const struct {
        const char *k;
        jv v;
    } f[] = {
        {"index", jv_int((double)i + 1)},
        {"index0", jv_int((double)i)},
        {"revindex", jv_int((double)(n - i))},
        {"revindex0", jv_int((double)(n - i - 1))},
        {"first", jv_bool(i == 0)},
        {"last", jv_bool(i == n - 1)},
        {"length", jv_int((double)n)},
        {"previtem", i > 0 ? items->v[i - 1] : none},
        {"nextitem", i + 1 < n ? items->v[i + 1] : none},
    };
    int rc = jx_obj_new(cx, pos, JV_OBJ, out);
    for (size_t k = 0; !rc && k < DX_ARRAY_LEN(f); k++)
        rc = jo_set(cx, pos, out->o, (jstr){f[k].k, strlen(f[k].k)}, f[k].v);
    return rc;
}

static int exec_for(jcx *cx, jenv *env, const jnode *n)
{
    jenv *scope;
    vlist items = {0};
    int rc = jx_env_new(cx, n->pos, env, &scope);
    if (!rc) rc = loop_items(cx, scope, n, &items);
    bool none = true;
    for (size_t i = 0; !rc && i < items.n; i++) {
        jv loop;
        size_t mark = cx->out->len;
        rc = jx_steps(cx, n->pos, 1);
        if (!rc) rc = loop_object(cx, n->pos, &items, i, &loop);
        if (!rc) rc = env_set(cx, n->pos, scope, JSTR("loop"), loop);
        if (!rc) rc = bind_loop_var(cx, scope, n->a, items.v[i]);
        if (!rc) rc = jx_exec(cx, scope, &n->l1);
        if (rc == JX_BREAK || rc == JX_CONTINUE) {
            /* the interrupted iteration's text is dropped, and it does not
             * count as an iteration for the else block */
            cx->out->len = mark;
            if (cx->out->data) cx->out->data[mark] = 0;
            if (rc == JX_BREAK) {
                rc = 0;
                break;
            }
            rc = 0;
            continue;
        }
        none = false;
    }
    if (!rc && none) rc = jx_exec(cx, scope, &n->l2);
    return rc;
}

static int set_target(jcx *cx, jenv *env, const jnode *t, jv v)
{
    if (t->kind == JN_IDENT) return env_set(cx, t->pos, env, t->str, v);
    if (t->kind == JN_TUPLE) {
        if (v.k != JV_ARR) return jx_fail(cx, t->pos, "cannot unpack %s in set", jx_type_name(v));
        if (v.a->n != t->l1.n)
            return jx_fail(cx, t->pos, "too %s items to unpack in set: %zu for %u names",
                           v.a->n < t->l1.n ? "few" : "many", v.a->n, t->l1.n);
        for (uint32_t i = 0; i < t->l1.n; i++) {
            if (t->l1.v[i]->kind != JN_IDENT)
                return jx_fail(cx, t->l1.v[i]->pos, "can only unpack into names in set");
            int rc = env_set(cx, t->pos, env, t->l1.v[i]->str, v.a->v[i]);
            if (rc) return rc;
        }
        return 0;
    }
    if (t->kind != JN_MEMBER) return jx_fail(cx, t->pos, "cannot assign to this expression");
    jv obj;
    int rc = jx_eval(cx, env, t->a, &obj);
    if (rc) return rc;
    if (obj.k != JV_NS)
        return jx_fail(cx, t->pos, "cannot set an attribute of %s: only of a namespace()",
                       jx_type_name(obj));
    if (t->b->kind != JN_IDENT)
        return jx_fail(cx, t->pos, "cannot assign to a member that is not a name");
    return jo_set(cx, t->pos, obj.o, t->b->str, v);
}

static int exec_set(jcx *cx, jenv *env, const jnode *n)
{
    jv v;
    int rc = n->b ? jx_eval(cx, env, n->b, &v) : jx_capture(cx, n->pos, env, &n->l1, &v);
    return rc ? rc : set_target(cx, env, n->a, v);
}

static int exec_macro(jcx *cx, jenv *env, const jnode *n)
{
    jfn *f = jx_alloc(cx, sizeof *f);
    if (!f) return jx_oom(cx, n->pos);
    f->kind = JF_MACRO;
    f->node = n;
    return env_set(cx, n->pos, env, n->str, (jv){.k = JV_FN, .f = f});
}

/* {% call(params) m(args) %}body{% endcall %}: m runs with caller() = body. */
static int exec_call_block(jcx *cx, jenv *env, const jnode *n)
{
    jfn *caller = jx_alloc(cx, sizeof *caller);
    if (!caller) return jx_oom(cx, n->pos);
    caller->kind = JF_CALLER;
    caller->node = n;
    caller->env = env;
    jv *args, fn, res;
    size_t nargs;
    jobj *kw;
    jenv *scope;
    int rc = jx_eval_args(cx, env, &n->a->l1, &args, &nargs, &kw);
    vlist l = {args, nargs, nargs};
    if (!rc) rc = vl_push(cx, n->pos, &l, (jv){.k = JV_OBJ, .o = kw});
    if (!rc) rc = jx_eval(cx, env, n->a->a, &fn);
    if (!rc && fn.k != JV_FN)
        rc = jx_fail(cx, n->pos, "cannot call %s: it is not a function", jx_type_name(fn));
    if (!rc) rc = jx_env_new(cx, n->pos, env, &scope);
    if (!rc) rc = env_set(cx, n->pos, scope, JSTR("caller"), (jv){.k = JV_FN, .f = caller});
    if (!rc) rc = jx_call(cx, n->pos, scope, fn, l.v, l.n, &res);
    return rc ? rc : output(cx, n->pos, res);
}

static int exec_filter_block(jcx *cx, jenv *env, const jnode *n)
{
    jv text, res;
    int rc = jx_capture(cx, n->pos, env, &n->l1, &text);
    if (!rc) rc = apply_filter(cx, env, text, n->b, &res);
    return rc ? rc : output(cx, n->pos, res);
}

static int exec_in(jcx *cx, jenv *env, const jnode *n)
{
    jv v;
    bool b = false;
    int rc;
    switch (n->kind) {
    case JN_TEXT:
        return jx_append(cx, n->pos, cx->out, n->str.p, n->str.n);
    case JN_COMMENT:
        return 0;
    case JN_IF:
        rc = jx_eval(cx, env, n->a, &v);
        if (!rc) rc = jx_test_truth(cx, n->pos, v, &b);
        return rc ? rc : jx_exec(cx, env, b ? &n->l1 : &n->l2);
    case JN_FOR:
        return exec_for(cx, env, n);
    case JN_SET:
        return exec_set(cx, env, n);
    case JN_MACRO:
        return exec_macro(cx, env, n);
    case JN_CALL_BLOCK:
        return exec_call_block(cx, env, n);
    case JN_FILTER_BLOCK:
        return exec_filter_block(cx, env, n);
    case JN_BREAK:
    case JN_CONTINUE:
        cx->signal_pos = n->pos;
        return n->kind == JN_BREAK ? JX_BREAK : JX_CONTINUE;
    default:
        rc = jx_eval(cx, env, n, &v);
        return rc ? rc : output(cx, n->pos, v);
    }
}

int jx_exec(jcx *cx, jenv *env, const jlist *body)
{
    for (uint32_t i = 0; i < body->n; i++) {
        int rc = enter(cx, body->v[i]->pos);
        if (rc) return rc;
        rc = exec_in(cx, env, body->v[i]);
        cx->depth--;
        if (rc) return rc;
    }
    return 0;
}

/* ---- entry ---------------------------------------------------------------- */

static int add_vars(jcx *cx, const json_t *vars)
{
    if (!vars) return 0;
    if (!json_is_object(vars))
        return dx_errf(DX_EINVAL, "jinja: the variables must be a JSON object");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)vars, k, v)
    {
        jstr name = {k, strlen(k)};
        if (jo_get(&cx->global->vars, name) || jstr_is(name, "namespace"))
            return dx_errf(DX_EINVAL,
                           "jinja: variable '%s' is a built-in name and cannot be passed", k);
        jv val;
        int rc = jx_from_json(cx, v, 0, &val);
        if (!rc) rc = env_set(cx, 0, cx->global, name, val);
        if (rc) return rc;
    }
    return 0;
}

static void limits_of(const jinja_limits *lim, jinja_limits *out)
{
    *out = k_defaults;
    if (!lim) return;
    if (lim->max_output) out->max_output = lim->max_output;
    if (lim->max_memory) out->max_memory = lim->max_memory;
    if (lim->max_steps) out->max_steps = lim->max_steps;
    if (lim->max_depth) out->max_depth = lim->max_depth;
}

int jinja_render_ex(const jinja_tmpl *t, const json_t *vars, const jinja_limits *lim, dx_buf *out)
{
    jcx cx = {.t = t};
    limits_of(lim, &cx.lim);
    cx.ar.max = cx.lim.max_memory;
    dx_buf text;
    dx_buf_init(&text, cx.lim.max_output);
    cx.out = &text;
    int rc = jx_env_new(&cx, 0, NULL, &cx.global);
    if (!rc) rc = jx_add_globals(&cx, cx.global);
    if (!rc) rc = add_vars(&cx, vars);
    if (!rc) rc = jx_exec(&cx, cx.global, &t->body);
    if (rc > 0)
        rc = jx_fail(&cx, cx.signal_pos, "'%s' outside a loop",
                     rc == JX_BREAK ? "break" : "continue");
    if (!rc && dx_buf_append(out, text.data ? text.data : "", text.len)) rc = dx_errcode();
    dx_buf_free(&text);
    ja_free_all(&cx.ar);
    return rc;
}

int jinja_render(const jinja_tmpl *t, const json_t *vars, dx_buf *out)
{
    return jinja_render_ex(t, vars, NULL, out);
}
