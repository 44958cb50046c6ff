/* jinja_builtin: filters, tests, string and dict methods and the global
 * functions, as @huggingface/jinja's runtime.ts defines them.
 *
 * What a template can call is the reference's set, with the reference's
 * semantics even where Python Jinja differs: strip/lstrip/rstrip ignore their
 * argument and trim JavaScript whitespace, `capitalize` leaves the rest of
 * the string as it is, `title` upper-cases ASCII letters after a non-word
 * character, `int` floors, `string` of none is an error.  A few filters and
 * methods Python Jinja has and the reference lacks are added (`count`,
 * `round`, str.find); docs/templates.md lists them.  Filters dispatch on the
 * operand's type first, as in the reference, so `x|length` on none is an
 * error, not 0. */
#include "jinja/jinja_priv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dx_err.h"

enum native {
    NF_NAMESPACE,
    NF_RANGE,
    NF_RAISE,
    NF_STRFTIME,
    NF_S_UPPER,
    NF_S_LOWER,
    NF_S_STRIP,
    NF_S_TITLE,
    NF_S_CAPITALIZE,
    NF_S_RSTRIP,
    NF_S_LSTRIP,
    NF_S_STARTSWITH,
    NF_S_ENDSWITH,
    NF_S_SPLIT,
    NF_S_REPLACE,
    NF_S_FIND,
    NF_O_GET,
    NF_O_ITEMS,
    NF_O_KEYS,
    NF_O_VALUES,
    NF_O_DICTSORT,
};

typedef struct {
    const char *name;
    uint8_t id;
} named;

static const named k_str_methods[] = {
    {"upper", NF_S_UPPER},   {"lower", NF_S_LOWER},           {"strip", NF_S_STRIP},
    {"title", NF_S_TITLE},   {"capitalize", NF_S_CAPITALIZE}, {"rstrip", NF_S_RSTRIP},
    {"lstrip", NF_S_LSTRIP}, {"startswith", NF_S_STARTSWITH}, {"endswith", NF_S_ENDSWITH},
    {"split", NF_S_SPLIT},   {"replace", NF_S_REPLACE},       {"find", NF_S_FIND},
};

static const named k_obj_methods[] = {
    {"get", NF_O_GET},       {"items", NF_O_ITEMS},       {"keys", NF_O_KEYS},
    {"values", NF_O_VALUES}, {"dictsort", NF_O_DICTSORT},
};

/* The id of the entry called name; DX_NONE when there is none. */
static int find_named(const named *t, size_t n, jstr name)
{
    for (size_t i = 0; i < n; i++)
        if (jstr_is(name, t[i].name)) return t[i].id;
    return DX_NONE;
}

static int make_fn(jcx *cx, uint32_t pos, int id, jv self, jv *out)
{
    jfn *f = jx_alloc(cx, sizeof *f);
    if (!f) return jx_oom(cx, pos);
    f->kind = JF_NATIVE;
    f->id = (uint8_t)id;
    f->self = self;
    *out = (jv){.k = JV_FN, .f = f};
    return 0;
}

int jx_builtin_member(jcx *cx, uint32_t pos, jv self, jstr name, jv *out)
{
    *out = jv_undef();
    int id = DX_NONE;
    if ((self.k == JV_STR || self.k == JV_ARR) && jstr_is(name, "length")) {
        *out = jv_int(self.k == JV_STR ? (double)js_utf16_len(self.s) : (double)self.a->n);
        return self.k == JV_STR ? jx_steps(cx, pos, self.s.n / 64) : 0;
    }
    if (self.k == JV_STR) id = find_named(k_str_methods, DX_ARRAY_LEN(k_str_methods), name);
    if (self.k == JV_OBJ) id = find_named(k_obj_methods, DX_ARRAY_LEN(k_obj_methods), name);
    return id < 0 ? 0 : make_fn(cx, pos, id, self, out);
}

/* args[i] ?? default: absent, or JavaScript's raw undefined. */
static const jv *arg_at(const jv *args, size_t n, size_t i)
{
    return i < n && args[i].k != JV_RAW ? &args[i] : NULL;
}

/* positional[i] ?? kw[name] */
static const jv *opt_arg(const jv *args, size_t n, size_t i, const jobj *kw, const char *name)
{
    const jv *a = arg_at(args, n, i);
    if (a) return a;
    jv *k = kw ? jo_get(kw, (jstr){name, strlen(name)}) : NULL;
    return k && k->k != JV_RAW ? k : NULL;
}

static int new_str(jcx *cx, uint32_t pos, const dx_buf *b, jv *out)
{
    return jx_buf_str(cx, pos, b, out);
}

/* ---- number parsing (parseInt, parseFloat) -------------------------------- */

static double parse_int10(jstr s)
{
    s = js_trim(s, true, false);
    size_t i = 0;
    bool neg = false;
    if (i < s.n && (s.p[i] == '+' || s.p[i] == '-')) neg = s.p[i++] == '-';
    size_t start = i;
    while (i < s.n && s.p[i] >= '0' && s.p[i] <= '9') i++;
    if (i == start) return NAN;
    char buf[400];
    size_t n = i - start < sizeof buf - 1 ? i - start : sizeof buf - 1;
    memcpy(buf, s.p + start, n);
    buf[n] = 0;
    double v = i - start < sizeof buf - 1 ? strtod(buf, NULL) : INFINITY;
    return neg ? -v : v;
}

static size_t digits_at(jstr s, size_t i)
{
    while (i < s.n && s.p[i] >= '0' && s.p[i] <= '9') i++;
    return i;
}

static double parse_float(jstr s)
{
    s = js_trim(s, true, false);
    size_t i = s.n && (s.p[0] == '+' || s.p[0] == '-');
    if (s.n - i >= 8 && !memcmp(s.p + i, "Infinity", 8))
        return s.p[0] == '-' ? -INFINITY : INFINITY;
    size_t int_end = digits_at(s, i), end = int_end;
    bool digits = int_end > i;
    if (end < s.n && s.p[end] == '.') {
        size_t frac_end = digits_at(s, end + 1);
        if (digits || frac_end > end + 1) {
            digits = true;
            end = frac_end;
        }
    }
    if (!digits) return NAN;
    if (end < s.n && (s.p[end] | 32) == 'e') {
        size_t e = end + 1;
        if (e < s.n && (s.p[e] == '+' || s.p[e] == '-')) e++;
        size_t e_end = digits_at(s, e);
        if (e_end > e) end = e_end;
    }
    char buf[512];
    if (end >= sizeof buf) return strtod(s.p, NULL); /* absurdly long: close enough */
    memcpy(buf, s.p, end);
    buf[end] = 0;
    return strtod(buf, NULL);
}

/* ---- slicing (utils.ts slice) --------------------------------------------- */

/* Python-style slicing (utils.ts slice) of n items: the indices taken, in an
 * arena array. */
static int slice_indices(jcx *cx, uint32_t pos, size_t n, jv start, jv stop, jv step, size_t **idx,
                         size_t *count)
{
    double len = (double)n, st = step.k == JV_INT ? step.n : 1;
    double dir = st > 0 ? 1 : st < 0 ? -1 : isnan(st) ? NAN : 0;
    double a, b;
    if (dir >= 0) {
        a = start.k == JV_INT ? start.n : 0;
        b = stop.k == JV_INT ? stop.n : len;
        a = a < 0 ? fmax(len + a, 0) : fmin(a, len);
        b = b < 0 ? fmax(len + b, 0) : fmin(b, len);
    } else {
        a = start.k == JV_INT ? start.n : len - 1;
        b = stop.k == JV_INT ? stop.n : -1;
        a = a < 0 ? fmax(len + a, -1) : fmin(a, len - 1);
        b = b < -1 ? fmax(len + b, -1) : fmin(b, len - 1);
    }
    *count = 0;
    *idx = jx_alloc(cx, (n + 1) * sizeof **idx);
    if (!*idx) return jx_oom(cx, pos);
    /* a and b lie in [-1, len], so at most len + 1 indices */
    for (double i = a; dir * i < dir * b && *count <= n; i += st) (*idx)[(*count)++] = (size_t)i;
    return jx_steps(cx, pos, *count / 16);
}

int jx_slice_value(jcx *cx, uint32_t pos, jv obj, jv start, jv stop, jv step, jv *out)
{
    size_t n = obj.k == JV_ARR ? obj.a->n : 0, *idx, count;
    size_t *offs = NULL; /* a string's code point offsets, n + 1 of them */
    if (obj.k == JV_STR) {
        offs = jx_alloc(cx, (obj.s.n + 1) * sizeof *offs);
        if (!offs) return jx_oom(cx, pos);
        for (size_t i = 0; i < obj.s.n;) {
            uint32_t cp;
            offs[n++] = i;
            i += utf8_dec(obj.s.p + i, obj.s.n - i, &cp);
        }
        offs[n] = obj.s.n;
    }
    int rc = slice_indices(cx, pos, n, start, stop, step, &idx, &count);
    if (rc) return rc;
    if (obj.k == JV_ARR) {
        rc = jx_arr_new(cx, pos, count, out);
        for (size_t i = 0; !rc && i < count; i++) out->a->v[i] = obj.a->v[idx[i]];
        return rc;
    }
    dx_buf b;
    jx_buf_init(cx, &b);
    for (size_t i = 0; !rc && i < count; i++)
        rc = jx_append(cx, pos, &b, obj.s.p + offs[idx[i]], offs[idx[i] + 1] - offs[idx[i]]);
    if (!rc) rc = new_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

/* ---- string methods ------------------------------------------------------- */

static bool ascii_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* value.replace(/\b\w/g, c => c.toUpperCase()): ASCII word characters only. */
static int str_title(jcx *cx, uint32_t pos, jstr s, jv *out)
{
    jv r;
    int rc = jx_strdup(cx, pos, s.p, s.n, &r);
    if (rc) return rc;
    char *p = (char *)r.s.p;
    for (size_t i = 0; i < s.n; i++)
        if (ascii_word(p[i]) && (i == 0 || !ascii_word(s.p[i - 1])) && p[i] >= 'a' && p[i] <= 'z')
            p[i] = (char)(p[i] - 32);
    *out = r;
    return 0;
}

/* charAt(0).toUpperCase() + slice(1): a character beyond U+FFFF is two
 * units, whose first alone does not change. */
static int str_capitalize(jcx *cx, uint32_t pos, jstr s, jv *out)
{
    if (!s.n) {
        *out = jv_str(s);
        return 0;
    }
    uint32_t cp;
    size_t l = utf8_dec(s.p, s.n, &cp);
    if (cp >= 0x10000) {
        *out = jv_str(s);
        return 0;
    }
    jv head;
    int rc = jx_case(cx, pos, (jstr){s.p, l}, true, &head);
    dx_buf b;
    jx_buf_init(cx, &b);
    if (!rc) rc = jx_append(cx, pos, &b, head.s.p, head.s.n);
    if (!rc) rc = jx_append(cx, pos, &b, s.p + l, s.n - l);
    if (!rc) rc = new_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

static bool starts_with(jstr s, jstr p)
{
    return p.n <= s.n && !memcmp(s.p, p.p, p.n);
}
static bool ends_with(jstr s, jstr p)
{
    return p.n <= s.n && !memcmp(s.p + s.n - p.n, p.p, p.n);
}

static int str_affix(jcx *cx, uint32_t pos, jstr s, const jv *args, size_t n, bool start, jv *out)
{
    const char *name = start ? "startswith" : "endswith";
    if (!n) return jx_fail(cx, pos, "%s() needs an argument", name);
    jv p = args[0];
    if (p.k == JV_STR) {
        *out = jv_bool(start ? starts_with(s, p.s) : ends_with(s, p.s));
        return 0;
    }
    if (p.k != JV_ARR)
        return jx_fail(cx, pos, "%s() takes a string or a tuple of strings, not %s", name,
                       jx_type_name(p));
    for (size_t i = 0; i < p.a->n; i++) {
        if (p.a->v[i].k != JV_STR)
            return jx_fail(cx, pos, "%s(): the tuple's items must be strings", name);
        if (start ? starts_with(s, p.a->v[i].s) : ends_with(s, p.a->v[i].s)) {
            *out = jv_bool(true);
            return 0;
        }
    }
    *out = jv_bool(false);
    return 0;
}

static int push_part(jcx *cx, uint32_t pos, jv *list, const char *p, size_t n)
{
    int rc = jx_arr_push(cx, pos, list->a, jv_str((jstr){p, n}));
    return rc ? rc : jx_steps(cx, pos, 1);
}

/* split() without a separator: runs of non-whitespace; with maxsplit the
 * last part is the rest of the text. */
static int split_ws(jcx *cx, uint32_t pos, jstr s, double maxsplit, jv *out)
{
    jstr text = js_trim(s, true, false);
    int rc = 0;
    size_t i = 0;
    while (!rc && i < text.n) {
        size_t w, start;
        while (i < text.n && (w = js_ws_len(text.p + i, text.n - i))) i += w;
        if (i >= text.n) break;
        start = i;
        while (i < text.n && !js_ws_len(text.p + i, text.n - i)) i++;
        if (maxsplit != -1 && (double)out->a->n >= maxsplit)
            return push_part(cx, pos, out, text.p + start, text.n - start);
        rc = push_part(cx, pos, out, text.p + start, i - start);
    }
    return rc;
}

/* JavaScript's split(sep), then Python's maxsplit as the reference does it:
 * result.push(result.splice(maxsplit).join(sep)). */
static int split_sep(jcx *cx, uint32_t pos, jstr s, jstr sep, double maxsplit, jv *out)
{
    int rc = jx_steps(cx, pos, s.n / 64);
    size_t start = 0;
    const char *hit;
    while (!rc && (hit = memmem(s.p + start, s.n - start, sep.p, sep.n)) != NULL) {
        rc = push_part(cx, pos, out, s.p + start, (size_t)(hit - (s.p + start)));
        start = (size_t)(hit - s.p) + sep.n;
    }
    if (!rc) rc = push_part(cx, pos, out, s.p + start, s.n - start);
    double len = (double)out->a->n;
    if (rc || maxsplit == -1 || !(len > maxsplit)) return rc;
    double m = isnan(maxsplit) ? 0 : trunc(maxsplit);
    size_t from = (size_t)(m < 0 ? fmax(len + m, 0) : fmin(m, len));
    dx_buf b;
    jx_buf_init(cx, &b);
    for (size_t i = from; !rc && i < out->a->n; i++) {
        if (i > from) rc = jx_append(cx, pos, &b, sep.p, sep.n);
        if (!rc) rc = jx_append(cx, pos, &b, out->a->v[i].s.p, out->a->v[i].s.n);
    }
    jv joined;
    if (!rc) rc = new_str(cx, pos, &b, &joined);
    dx_buf_free(&b);
    if (rc) return rc;
    out->a->n = from;
    return push_part(cx, pos, out, joined.s.p, joined.s.n);
}

static int str_split(jcx *cx, uint32_t pos, jstr s, const jv *args, size_t n, jv *out)
{
    const jv *sep = arg_at(args, n, 0), *max = arg_at(args, n, 1);
    if (sep && sep->k != JV_STR && sep->k != JV_NULL)
        return jx_fail(cx, pos, "split(): the separator must be a string or none, not %s",
                       jx_type_name(*sep));
    if (max && max->k != JV_INT)
        return jx_fail(cx, pos, "split(): maxsplit must be an integer, not %s", jx_type_name(*max));
    double maxsplit = max ? max->n : -1;
    int rc = jx_arr_new(cx, pos, 0, out);
    if (rc) return rc;
    if (!sep || sep->k == JV_NULL) return split_ws(cx, pos, s, maxsplit, out);
    if (!sep->s.n) return jx_fail(cx, pos, "split(): empty separator");
    return split_sep(cx, pos, s, sep->s, maxsplit, out);
}

/* utils.ts replace: count none or negative replaces all; an empty `old`
 * matches before every character and at the end. */
static int replace_in(jcx *cx, uint32_t pos, jstr s, jstr old, jstr rep, double count, jv *out)
{
    if (count == 0) {
        *out = jv_str(s);
        return 0;
    }
    double remaining = isnan(count) ? NAN : count < 0 ? INFINITY : count;
    dx_buf b;
    jx_buf_init(cx, &b);
    int rc = jx_steps(cx, pos, s.n / 64);
    size_t run = 0; /* start of the text not yet copied */
    for (size_t i = 0; !rc && remaining > 0 && i <= s.n;) {
        size_t at = i; /* the next match: anywhere for old, before the next character for "" */
        if (old.n) {
            const char *hit = memmem(s.p + i, s.n - i, old.p, old.n);
            if (!hit) break;
            at = (size_t)(hit - s.p);
        }
        remaining--;
        rc = jx_append(cx, pos, &b, s.p + run, at - run);
        if (!rc) rc = jx_append(cx, pos, &b, rep.p, rep.n);
        if (!rc) rc = jx_steps(cx, pos, 1);
        run = at + old.n;
        uint32_t cp;
        i = old.n ? run : at < s.n ? at + utf8_dec(s.p + at, s.n - at, &cp) : s.n + 1;
    }
    if (!rc) rc = jx_append(cx, pos, &b, s.p + run, s.n - run);
    if (!rc) rc = new_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

static int str_replace(jcx *cx, uint32_t pos, jstr s, const jv *args, size_t n, jv *out)
{
    if (n < 2) return jx_fail(cx, pos, "replace() needs two arguments");
    if (args[0].k != JV_STR || args[1].k != JV_STR)
        return jx_fail(cx, pos, "replace(): the arguments must be strings");
    jv count = jv_null();
    if (n > 2) {
        if (args[2].k == JV_OBJ && args[2].o->kw) {
            jv *c = jo_get(args[2].o, JSTR("count"));
            count = c && c->k != JV_RAW ? *c : jv_null();
        } else {
            count = args[2];
        }
    }
    if (count.k != JV_INT && count.k != JV_NULL)
        return jx_fail(cx, pos, "replace(): count must be an integer or none");
    return replace_in(cx, pos, s, args[0].s, args[1].s, count.k == JV_INT ? count.n : -1, out);
}

/* Python's str.find(sub): the code point index, or -1 (an addition). */
static int str_find(jcx *cx, uint32_t pos, jstr s, const jv *args, size_t n, jv *out)
{
    if (!n || args[0].k != JV_STR) return jx_fail(cx, pos, "find() needs a string argument");
    jstr sub = args[0].s;
    const char *hit = sub.n ? memmem(s.p, s.n, sub.p, sub.n) : s.p;
    size_t cps = 0;
    for (const char *c = s.p; hit && c < hit; c++) cps += ((unsigned char)*c & 0xC0) != 0x80;
    *out = jv_int(hit ? (double)cps : -1);
    return jx_steps(cx, pos, s.n / 64);
}

static int call_str_method(jcx *cx, uint32_t pos, int id, jstr s, const jv *args, size_t n, jv *out)
{
    switch (id) {
    case NF_S_UPPER:
        return jx_case(cx, pos, s, true, out);
    case NF_S_LOWER:
        return jx_case(cx, pos, s, false, out);
    case NF_S_STRIP:
        *out = jv_str(js_trim(s, true, true));
        return 0;
    case NF_S_LSTRIP:
        *out = jv_str(js_trim(s, true, false));
        return 0;
    case NF_S_RSTRIP:
        *out = jv_str(js_trim(s, false, true));
        return 0;
    case NF_S_TITLE:
        return str_title(cx, pos, s, out);
    case NF_S_CAPITALIZE:
        return str_capitalize(cx, pos, s, out);
    case NF_S_STARTSWITH:
        return str_affix(cx, pos, s, args, n, true, out);
    case NF_S_ENDSWITH:
        return str_affix(cx, pos, s, args, n, false, out);
    case NF_S_SPLIT:
        return str_split(cx, pos, s, args, n, out);
    case NF_S_REPLACE:
        return str_replace(cx, pos, s, args, n, out);
    default:
        return str_find(cx, pos, s, args, n, out);
    }
}

/* ---- dict methods --------------------------------------------------------- */

static int pair(jcx *cx, uint32_t pos, jstr k, jv v, jv *out)
{
    int rc = jx_arr_new(cx, pos, 2, out);
    if (!rc) {
        out->a->v[0] = jv_str(k);
        out->a->v[1] = v;
    }
    return rc;
}

static int obj_items(jcx *cx, uint32_t pos, const jobj *o, jv *out)
{
    int rc = jx_arr_new(cx, pos, o->n, out);
    for (size_t i = 0; !rc && i < o->n; i++)
        rc = pair(cx, pos, o->keys[i], o->vals[i], &out->a->v[i]);
    return rc ? rc : jx_steps(cx, pos, o->n / 16);
}

int jx_builtin_keys(jcx *cx, uint32_t pos, const jobj *o, jv *out)
{
    int rc = jx_arr_new(cx, pos, o->n, out);
    for (size_t i = 0; !rc && i < o->n; i++) out->a->v[i] = jv_str(o->keys[i]);
    return rc;
}

static int obj_values(jcx *cx, uint32_t pos, const jobj *o, jv *out)
{
    int rc = jx_arr_new(cx, pos, o->n, out);
    if (!rc && o->n) memcpy(out->a->v, o->vals, o->n * sizeof *o->vals);
    return rc;
}

static int obj_get(jcx *cx, uint32_t pos, const jobj *o, const jv *args, size_t n, jv *out)
{
    if (!n || args[0].k != JV_STR)
        return jx_fail(cx, pos, "get(): the key must be a string, not %s",
                       n ? jx_type_name(args[0]) : "nothing");
    jv *v = jo_get(o, args[0].s);
    const jv *dflt = arg_at(args, n, 1);
    *out = v && v->k != JV_RAW ? *v : dflt ? *dflt : jv_null();
    return 0;
}

typedef struct {
    jcx *cx;
    const jv *vals;
    bool case_sensitive, reverse;
} sort_ctx;

static int sort_cmp(void *ctx, size_t i, size_t j)
{
    sort_ctx *s = ctx;
    int r = 0;
    jx_compare(s->cx, 0, s->vals[i], s->vals[j], s->case_sensitive, &r); /* checked beforehand */
    return s->reverse ? -r : r;
}

/* Stable sort of n items by keys[i]; *order receives the permutation. */
static int sort_by(jcx *cx, uint32_t pos, const jv *keys, size_t n, bool cs, bool rev,
                   size_t **order)
{
    int rc = jx_check_sortable(cx, pos, keys, n);
    if (!rc) rc = jx_steps(cx, pos, n);
    if (rc) return rc;
    size_t *idx = jx_alloc(cx, (2 * n + 1) * sizeof *idx);
    if (!idx) return jx_oom(cx, pos);
    for (size_t i = 0; i < n; i++) idx[i] = i;
    sort_ctx s = {cx, keys, cs, rev};
    jx_stable_sort(idx, n, idx + n, sort_cmp, &s);
    *order = idx;
    return 0;
}

static int bool_opt(jcx *cx, uint32_t pos, const jv *v, const char *name, bool *out)
{
    if (!v) return 0;
    if (v->k != JV_BOOL) return jx_fail(cx, pos, "%s must be a boolean", name);
    *out = v->b;
    return 0;
}

static int obj_dictsort(jcx *cx, uint32_t pos, const jobj *o, const jv *args, size_t n, jv *out)
{
    const jobj *kw = NULL;
    if (n && args[n - 1].k == JV_OBJ && args[n - 1].o->kw) kw = args[--n].o;
    bool cs = false, rev = false, by_value = false;
    int rc = bool_opt(cx, pos, opt_arg(args, n, 0, kw, "case_sensitive"), "case_sensitive", &cs);
    const jv *by = opt_arg(args, n, 1, kw, "by");
    if (!rc && by && (by->k != JV_STR || !(jstr_is(by->s, "key") || jstr_is(by->s, "value"))))
        rc = jx_fail(cx, pos, "dictsort: by must be 'key' or 'value'");
    by_value = by && jstr_is(by->s, "value");
    if (!rc) rc = bool_opt(cx, pos, opt_arg(args, n, 2, kw, "reverse"), "reverse", &rev);
    jv *keys = rc ? NULL : jx_alloc(cx, (o->n + 1) * sizeof *keys);
    if (!rc && !keys) rc = jx_oom(cx, pos);
    for (size_t i = 0; !rc && i < o->n; i++) keys[i] = by_value ? o->vals[i] : jv_str(o->keys[i]);
    size_t *order;
    if (!rc) rc = sort_by(cx, pos, keys, o->n, cs, rev, &order);
    if (!rc) rc = jx_arr_new(cx, pos, o->n, out);
    for (size_t i = 0; !rc && i < o->n; i++)
        rc = pair(cx, pos, o->keys[order[i]], o->vals[order[i]], &out->a->v[i]);
    return rc;
}

static int call_obj_method(jcx *cx, uint32_t pos, int id, const jobj *o, const jv *args, size_t n,
                           jv *out)
{
    switch (id) {
    case NF_O_GET:
        return obj_get(cx, pos, o, args, n, out);
    case NF_O_ITEMS:
        return obj_items(cx, pos, o, out);
    case NF_O_KEYS:
        return jx_builtin_keys(cx, pos, o, out);
    case NF_O_VALUES:
        return obj_values(cx, pos, o, out);
    default:
        return obj_dictsort(cx, pos, o, args, n, out);
    }
}

/* ---- globals -------------------------------------------------------------- */

/* namespace(dict or [[key, value]...], key=value...) */
static int ns_entry(jcx *cx, uint32_t pos, jobj *ns, jv pairv)
{
    jv k, v;
    if (pairv.k == JV_ARR && pairv.a->n == 2) {
        k = pairv.a->v[0];
        v = pairv.a->v[1];
    } else if (pairv.k == JV_STR) {
        /* a two-character string is a (key, value) pair of characters */
        uint32_t cp;
        size_t l1 = pairv.s.n ? utf8_dec(pairv.s.p, pairv.s.n, &cp) : 0;
        size_t l2 = l1 < pairv.s.n ? utf8_dec(pairv.s.p + l1, pairv.s.n - l1, &cp) : 0;
        if (!l1 || !l2 || l1 + l2 != pairv.s.n) goto bad;
        k = jv_str((jstr){pairv.s.p, l1});
        v = jv_str((jstr){pairv.s.p + l1, l2});
    } else {
        goto bad;
    }
    if (k.k != JV_STR) return jx_fail(cx, pos, "namespace(): keys must be strings");
    return jo_set(cx, pos, ns, k.s, v);
bad:
    return jx_fail(cx, pos, "namespace() expects a dict or a list of [key, value] pairs");
}

static int fn_namespace(jcx *cx, uint32_t pos, const jv *args, size_t n, jv *out)
{
    const jobj *kw = NULL;
    if (n && args[n - 1].k == JV_OBJ && args[n - 1].o->kw) kw = args[--n].o;
    if (n > 1) return jx_fail(cx, pos, "namespace() takes at most 1 argument, got %zu", n);
    int rc = jx_obj_new(cx, pos, JV_NS, out);
    if (!rc && n == 1) {
        jv src = args[0];
        if (src.k == JV_OBJ)
            for (size_t i = 0; !rc && i < src.o->n; i++)
                rc = jo_set(cx, pos, out->o, src.o->keys[i], src.o->vals[i]);
        else if (src.k == JV_ARR)
            for (size_t i = 0; !rc && i < src.a->n; i++)
                rc = ns_entry(cx, pos, out->o, src.a->v[i]);
        else
            rc = jx_fail(cx, pos, "namespace(): %s is not iterable", jx_type_name(src));
    }
    for (size_t i = 0; !rc && kw && i < kw->n; i++)
        rc = jo_set(cx, pos, out->o, kw->keys[i], kw->vals[i]);
    return rc;
}

/* A number argument of range() as JavaScript would use it (ToNumber for
 * stop, which is only compared); false when absent.  A string start or a
 * non-number step would make the reference concatenate strings, which is
 * not followed: an error. */
static int range_arg(jcx *cx, uint32_t pos, const jv *args, size_t n, size_t i, double *v,
                     bool *present)
{
    const jv *a = arg_at(args, n, i);
    *present = a && a->k != JV_UNDEF;
    if (!*present) return 0;
    if (i != 1 && a->k != JV_INT && a->k != JV_FLOAT && a->k != JV_BOOL && a->k != JV_NULL &&
        !(i == 0 && n == 1))
        return jx_fail(cx, pos, "range() takes numbers, not %s", jx_type_name(*a));
    return jx_to_number(cx, pos, *a, v);
}

static int fn_range(jcx *cx, uint32_t pos, const jv *args, size_t n, jv *out)
{
    double start = 0, stop = 0, step = 1;
    bool has_start, has_stop, has_step;
    int rc = range_arg(cx, pos, args, n, 0, &start, &has_start);
    if (!rc) rc = range_arg(cx, pos, args, n, 1, &stop, &has_stop);
    if (!rc) rc = range_arg(cx, pos, args, n, 2, &step, &has_step);
    if (rc) return rc;
    if (!has_stop) {
        stop = has_start ? start : NAN;
        start = 0;
    } else if (!has_start) {
        start = NAN;
    }
    if (!has_step) step = 1;
    if (step == 0) return jx_fail(cx, pos, "range() step must not be zero");
    if ((rc = jx_arr_new(cx, pos, 0, out))) return rc;
    for (double i = start; step > 0 ? i < stop : i > stop; i += step) {
        if ((rc = jx_steps(cx, pos, 1))) return rc;
        if ((rc = jx_arr_push(cx, pos, out->a, i == floor(i) ? jv_int(i) : jv_float(i)))) return rc;
    }
    return 0;
}

static int fn_raise(jcx *cx, uint32_t pos, const jv *args, size_t n)
{
    dx_buf b;
    jx_buf_init(cx, &b);
    const jv *m = arg_at(args, n, 0);
    int rc = m && m->k != JV_UNDEF ? jx_put_raw(cx, pos, &b, *m) : 0;
    if (!rc)
        rc = jx_fail(cx, pos, "raise_exception: %.*s", (int)(b.len > 600 ? 600 : b.len),
                     b.data ? b.data : "");
    dx_buf_free(&b);
    return rc;
}

static const char *const k_months[] = {"January",   "February", "March",    "April",
                                       "May",       "June",     "July",     "August",
                                       "September", "October",  "November", "December"};

/* The text for %c, or NULL when c is not one of the supported fields. */
static const char *strftime_field(char c, const struct tm *tm, char tmp[16])
{
    int v = c == 'Y'   ? tm->tm_year + 1900
            : c == 'm' ? tm->tm_mon + 1
            : c == 'd' ? tm->tm_mday
            : c == 'H' ? tm->tm_hour
            : c == 'M' ? tm->tm_min
                       : -1;
    if (v >= 0) {
        snprintf(tmp, 16, c == 'Y' ? "%d" : "%02d", v);
        return tmp;
    }
    if (c == 'B') return k_months[tm->tm_mon];
    if (c == 'b') {
        snprintf(tmp, 16, "%.3s", k_months[tm->tm_mon]);
        return tmp;
    }
    return c == '%' ? "%" : NULL;
}

/* strftime_now(format): %Y %m %d %b %B %H %M %% in local time, English
 * month names; anything else stays as written (utils.ts strftime). */
static int fn_strftime(jcx *cx, uint32_t pos, const jv *args, size_t n, jv *out)
{
    const jv *f = arg_at(args, n, 0);
    if (!f || f->k != JV_STR) return jx_fail(cx, pos, "strftime_now() needs a format string");
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    dx_buf b;
    jx_buf_init(cx, &b);
    int rc = 0;
    for (size_t i = 0; !rc && i < f->s.n; i++) {
        char tmp[16];
        const char *rep =
            f->s.p[i] == '%' && i + 1 < f->s.n ? strftime_field(f->s.p[i + 1], &tm, tmp) : NULL;
        rc = rep ? jx_append(cx, pos, &b, rep, strlen(rep)) : jx_append(cx, pos, &b, f->s.p + i, 1);
        i += rep != NULL;
    }
    if (!rc) rc = new_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

int jx_call_native(jcx *cx, uint32_t pos, const jfn *f, jv *args, size_t nargs, jv *out)
{
    switch (f->id) {
    case NF_NAMESPACE:
        return fn_namespace(cx, pos, args, nargs, out);
    case NF_RANGE:
        return fn_range(cx, pos, args, nargs, out);
    case NF_RAISE:
        return fn_raise(cx, pos, args, nargs);
    case NF_STRFTIME:
        return fn_strftime(cx, pos, args, nargs, out);
    case NF_O_GET:
    case NF_O_ITEMS:
    case NF_O_KEYS:
    case NF_O_VALUES:
    case NF_O_DICTSORT:
        return call_obj_method(cx, pos, f->id, f->self.o, args, nargs, out);
    default:
        return call_str_method(cx, pos, f->id, f->self.s, args, nargs, out);
    }
}

int jx_add_globals(jcx *cx, jenv *g)
{
    static const struct {
        const char *name;
        int id; /* -1: a constant */
        jv v;
    } globals[] = {
        {"false", -1, {.k = JV_BOOL, .b = false}},
        {"true", -1, {.k = JV_BOOL, .b = true}},
        {"none", -1, {.k = JV_NULL}},
        {"raise_exception", NF_RAISE, {0}},
        {"range", NF_RANGE, {0}},
        {"strftime_now", NF_STRFTIME, {0}},
        {"True", -1, {.k = JV_BOOL, .b = true}},
        {"False", -1, {.k = JV_BOOL, .b = false}},
        {"None", -1, {.k = JV_NULL}},
    };
    int rc = make_fn(cx, 0, NF_NAMESPACE, jv_undef(), &cx->ns_fn);
    for (size_t i = 0; !rc && i < DX_ARRAY_LEN(globals); i++) {
        jv v = globals[i].v;
        if (globals[i].id >= 0) rc = make_fn(cx, 0, globals[i].id, jv_undef(), &v);
        if (!rc) rc = jo_set(cx, 0, &g->vars, (jstr){globals[i].name, strlen(globals[i].name)}, v);
    }
    return rc;
}

/* ---- tests ---------------------------------------------------------------- */

enum test_id {
    T_BOOLEAN,
    T_CALLABLE,
    T_ODD,
    T_EVEN,
    T_FALSE,
    T_TRUE,
    T_NONE,
    T_STRING,
    T_NUMBER,
    T_INTEGER,
    T_ITERABLE,
    T_MAPPING,
    T_SEQUENCE,
    T_LOWER,
    T_UPPER,
    T_DEFINED,
    T_UNDEFINED,
    T_EQUALTO,
};

static const named k_tests[] = {
    {"boolean", T_BOOLEAN},   {"callable", T_CALLABLE},   {"odd", T_ODD},
    {"even", T_EVEN},         {"false", T_FALSE},         {"true", T_TRUE},
    {"none", T_NONE},         {"string", T_STRING},       {"number", T_NUMBER},
    {"integer", T_INTEGER},   {"iterable", T_ITERABLE},   {"mapping", T_MAPPING},
    {"sequence", T_SEQUENCE}, {"lower", T_LOWER},         {"upper", T_UPPER},
    {"defined", T_DEFINED},   {"undefined", T_UNDEFINED}, {"equalto", T_EQUALTO},
    {"eq", T_EQUALTO},
};

bool jx_test_exists(jstr name)
{
    return find_named(k_tests, DX_ARRAY_LEN(k_tests), name) >= 0;
}

static int test_case(jcx *cx, uint32_t pos, jv v, bool upper, bool *res)
{
    *res = false;
    if (v.k != JV_STR) return 0;
    jv c;
    int rc = jx_case(cx, pos, v.s, upper, &c);
    if (!rc) *res = jstr_eq(c.s, v.s);
    return rc;
}

int jx_run_test(jcx *cx, uint32_t pos, jstr name, jv v, const jv *arg, bool *res)
{
    int id = find_named(k_tests, DX_ARRAY_LEN(k_tests), name);
    if (id < 0) return jx_fail(cx, pos, "unknown test '%.*s'", (int)name.n, name.p);
    if (v.k == JV_RAW) {
        /* the reference's instanceof tests answer false; the others throw */
        if (id != T_CALLABLE && id != T_NUMBER && id != T_INTEGER && id != T_MAPPING &&
            id != T_SEQUENCE)
            return jx_raw_error(cx, pos);
        *res = false;
        return 0;
    }
    switch (id) {
    case T_BOOLEAN:
        *res = v.k == JV_BOOL;
        return 0;
    case T_CALLABLE:
        *res = v.k == JV_FN;
        return 0;
    case T_ODD:
    case T_EVEN:
        if (v.k != JV_INT)
            return jx_fail(cx, pos, "the '%s' test needs an integer, not %s",
                           id == T_ODD ? "odd" : "even", jx_type_name(v));
        *res = (fmod(v.n, 2) != 0) == (id == T_ODD);
        return 0;
    case T_FALSE:
    case T_TRUE:
        *res = v.k == JV_BOOL && v.b == (id == T_TRUE);
        return 0;
    case T_NONE:
        *res = v.k == JV_NULL;
        return 0;
    case T_STRING:
        *res = v.k == JV_STR;
        return 0;
    case T_NUMBER:
        *res = jv_is_num(v);
        return 0;
    case T_INTEGER:
        *res = v.k == JV_INT;
        return 0;
    case T_ITERABLE:
        *res = (v.k == JV_ARR && !v.a->tuple) || v.k == JV_STR;
        return 0;
    case T_MAPPING:
        *res = v.k == JV_OBJ;
        return 0;
    case T_SEQUENCE:
        *res = v.k == JV_ARR || v.k == JV_OBJ || v.k == JV_STR;
        return 0;
    case T_LOWER:
    case T_UPPER:
        return test_case(cx, pos, v, id == T_UPPER, res);
    case T_DEFINED:
    case T_UNDEFINED:
        *res = (v.k == JV_UNDEF) == (id == T_UNDEFINED);
        return 0;
    default:
        if (!arg || arg->k == JV_RAW)
            return jx_fail(cx, pos, "the '%.*s' test needs a value to compare with", (int)name.n,
                           name.p);
        *res = jx_strict_eq(v, *arg);
        return 0;
    }
}

/* ---- filters without arguments -------------------------------------------- */

static int to_json_str(jcx *cx, uint32_t pos, jv v, const jjson_opts *o, bool undef_null, jv *out)
{
    dx_buf b;
    jx_buf_init(cx, &b);
    int rc = jx_put_json(cx, pos, &b, v, o, 0, undef_null);
    if (!rc) rc = new_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

static int join_items(jcx *cx, uint32_t pos, const jarr *a, jstr sep, jv *out)
{
    dx_buf b;
    jx_buf_init(cx, &b);
    int rc = 0;
    for (size_t i = 0; !rc && i < a->n; i++) {
        if (i) rc = jx_append(cx, pos, &b, sep.p, sep.n);
        if (!rc) rc = jx_put_join_item(cx, pos, &b, a->v[i]);
    }
    if (!rc) rc = new_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

static int unique(jcx *cx, uint32_t pos, const jarr *a, jv *out)
{
    int rc = jx_steps(cx, pos, a->n * a->n / 64);
    if (!rc) rc = jx_arr_new(cx, pos, 0, out);
    for (size_t i = 0; !rc && i < a->n; i++) {
        if (a->v[i].k == JV_RAW) return jx_raw_error(cx, pos);
        bool seen = false;
        for (size_t j = 0; j < out->a->n && !seen; j++)
            seen = jx_same_value_zero(out->a->v[j], a->v[i]);
        if (!seen) rc = jx_arr_push(cx, pos, out->a, a->v[i]);
    }
    return rc;
}

static int reversed(jcx *cx, uint32_t pos, const jarr *a, jv *out)
{
    int rc = jx_arr_new(cx, pos, a->n, out);
    for (size_t i = 0; !rc && i < a->n; i++) out->a->v[i] = a->v[a->n - 1 - i];
    return rc;
}

static int sorted(jcx *cx, uint32_t pos, const jarr *a, const jv *keys, bool cs, bool rev, jv *out)
{
    size_t *order;
    int rc = sort_by(cx, pos, keys, a->n, cs, rev, &order);
    if (!rc) rc = jx_arr_new(cx, pos, a->n, out);
    for (size_t i = 0; !rc && i < a->n; i++) out->a->v[i] = a->v[order[i]];
    return rc;
}

static int indent_lines(jcx *cx, uint32_t pos, jstr s, double width, bool first, bool blank,
                        jv *out)
{
    if (width < 0 || width > (double)cx->lim.max_output)
        return jx_fail(cx, pos, "indent: invalid width");
    dx_buf b;
    jx_buf_init(cx, &b);
    int rc = 0;
    size_t start = 0, line = 0;
    for (size_t i = 0; !rc && i <= s.n; i++) {
        if (i < s.n && s.p[i] != '\n') continue;
        bool pad = !((!first && line == 0) || (!blank && i == start));
        for (size_t k = 0; !rc && pad && k < (size_t)width; k++)
            rc = jx_append(cx, pos, &b, " ", 1);
        if (!rc) rc = jx_append(cx, pos, &b, s.p + start, i - start + (i < s.n));
        start = i + 1;
        line++;
    }
    if (!rc) rc = new_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

/* Python's round(x, ndigits) for 'common' (an addition): the correctly
 * rounded decimal, ties to even. */
static double round_common(double x, double prec)
{
    if (!isfinite(x)) return x;
    if (prec < 0 || prec > 30) {
        double p = pow(10, prec);
        return nearbyint(x * p) / p;
    }
    char buf[400];
    snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
    return strtod(buf, NULL);
}

static int unknown_filter(jcx *cx, uint32_t pos, jstr name, jv v)
{
    return jx_fail(cx, pos, "filter '%.*s' cannot be applied to %s", (int)name.n, name.p,
                   jx_type_name(v));
}

static bool is_name(jstr n, const char *z)
{
    return jstr_is(n, z);
}

static int array_filter(jcx *cx, uint32_t pos, jv v, jstr f, jv *out)
{
    const jarr *a = v.a;
    if (is_name(f, "list"))
        *out = v;
    else if (is_name(f, "first"))
        *out = a->n ? a->v[0] : (jv){.k = JV_RAW};
    else if (is_name(f, "last"))
        *out = a->n ? a->v[a->n - 1] : (jv){.k = JV_RAW};
    else if (is_name(f, "length") || is_name(f, "count"))
        *out = jv_int((double)a->n);
    else if (is_name(f, "reverse"))
        return reversed(cx, pos, a, out);
    else if (is_name(f, "sort"))
        return sorted(cx, pos, a, a->v, false, false, out);
    else if (is_name(f, "join"))
        return join_items(cx, pos, a, JSTR(""), out);
    else if (is_name(f, "string"))
        return to_json_str(cx, pos, v, &(jjson_opts){0}, false, out);
    else if (is_name(f, "unique"))
        return unique(cx, pos, a, out);
    else
        return unknown_filter(cx, pos, f, v);
    return 0;
}

static int string_filter(jcx *cx, uint32_t pos, jv v, jstr f, jv *out)
{
    double d;
    if (is_name(f, "length") || is_name(f, "count")) {
        *out = jv_int((double)js_utf16_len(v.s));
        return jx_steps(cx, pos, v.s.n / 64);
    } else if (is_name(f, "upper"))
        return jx_case(cx, pos, v.s, true, out);
    else if (is_name(f, "lower"))
        return jx_case(cx, pos, v.s, false, out);
    else if (is_name(f, "title"))
        return str_title(cx, pos, v.s, out);
    else if (is_name(f, "capitalize"))
        return str_capitalize(cx, pos, v.s, out);
    else if (is_name(f, "trim"))
        *out = jv_str(js_trim(v.s, true, true));
    else if (is_name(f, "indent"))
        return indent_lines(cx, pos, v.s, 4, false, false, out);
    else if (is_name(f, "join") || is_name(f, "string"))
        *out = v;
    else if (is_name(f, "int"))
        *out = jv_int(isnan(d = parse_int10(v.s)) ? 0 : d);
    else if (is_name(f, "float"))
        *out = jv_float(isnan(d = parse_float(v.s)) ? 0 : d);
    else
        return unknown_filter(cx, pos, f, v);
    return 0;
}

static int number_filter(jcx *cx, uint32_t pos, jv v, jstr f, jv *out)
{
    if (is_name(f, "abs"))
        *out = v.k == JV_INT ? jv_int(fabs(v.n)) : jv_float(fabs(v.n));
    else if (is_name(f, "int"))
        *out = jv_int(floor(v.n));
    else if (is_name(f, "float"))
        *out = jv_float(v.n);
    else if (is_name(f, "string"))
        return jx_to_str(cx, pos, v, out);
    else if (is_name(f, "round"))
        *out = v.k == JV_INT ? v : jv_float(round_common(v.n, 0));
    else
        return unknown_filter(cx, pos, f, v);
    return 0;
}

static int object_filter(jcx *cx, uint32_t pos, jv v, jstr f, jv *out)
{
    if (is_name(f, "items")) return obj_items(cx, pos, v.o, out);
    if (is_name(f, "length") || is_name(f, "count")) {
        *out = jv_int((double)v.o->n);
        return 0;
    }
    int id = find_named(k_obj_methods, DX_ARRAY_LEN(k_obj_methods), f);
    if (id < 0) return unknown_filter(cx, pos, f, v);
    return call_obj_method(cx, pos, id, v.o, NULL, 0, out);
}

static int bool_filter(jcx *cx, uint32_t pos, jv v, jstr f, jv *out)
{
    if (is_name(f, "bool"))
        *out = v;
    else if (is_name(f, "int"))
        *out = jv_int(v.b);
    else if (is_name(f, "float"))
        *out = jv_float(v.b);
    else if (is_name(f, "string"))
        *out = jv_str(v.b ? JSTR("true") : JSTR("false"));
    else
        return unknown_filter(cx, pos, f, v);
    return 0;
}

int jx_filter_ident(jcx *cx, uint32_t pos, jv v, jstr f, jv *out)
{
    if (is_name(f, "safe")) {
        *out = v;
        return 0;
    }
    if (is_name(f, "tojson")) return to_json_str(cx, pos, v, &(jjson_opts){0}, true, out);
    switch (v.k) {
    case JV_ARR:
        return array_filter(cx, pos, v, f, out);
    case JV_STR:
        return string_filter(cx, pos, v, f, out);
    case JV_INT:
    case JV_FLOAT:
        return number_filter(cx, pos, v, f, out);
    case JV_OBJ:
        return object_filter(cx, pos, v, f, out);
    case JV_BOOL:
        return bool_filter(cx, pos, v, f, out);
    case JV_RAW:
        return jx_raw_error(cx, pos);
    default:
        return unknown_filter(cx, pos, f, v);
    }
}

/* ---- filters with arguments ----------------------------------------------- */

typedef struct {
    jv *pos;
    size_t n;
    jobj *kw;
} fargs;

static const jv *fa_get(const fargs *a, size_t i, const char *kw)
{
    return opt_arg(a->pos, a->n, i, kw ? a->kw : NULL, kw ? kw : "");
}

static const jv *fa_kw(const fargs *a, const char *kw)
{
    jv *v = jo_get(a->kw, (jstr){kw, strlen(kw)});
    return v && v->k != JV_RAW ? v : NULL;
}

static int tojson_filter(jcx *cx, uint32_t pos, jv v, const fargs *a, jv *out)
{
    jjson_opts o = {0};
    const jv *ind = fa_kw(a, "indent"), *seps = fa_kw(a, "separators");
    if (ind && ind->k != JV_INT && ind->k != JV_NULL)
        return jx_fail(cx, pos, "tojson: indent must be an integer");
    o.indent = ind && ind->k == JV_INT ? ind->n : 0;
    if (isnan(o.indent)) o.indent = 0;
    if (o.indent < 0 || o.indent > 1024) return jx_fail(cx, pos, "tojson: invalid indent");
    int rc = bool_opt(cx, pos, fa_kw(a, "ensure_ascii"), "tojson: ensure_ascii", &o.ensure_ascii);
    if (!rc) rc = bool_opt(cx, pos, fa_kw(a, "sort_keys"), "tojson: sort_keys", &o.sort_keys);
    if (rc) return rc;
    if (seps && seps->k != JV_NULL) {
        if (seps->k != JV_ARR || seps->a->n != 2 || seps->a->v[0].k != JV_STR ||
            seps->a->v[1].k != JV_STR)
            return jx_fail(cx, pos, "tojson: separators must be a pair of strings");
        o.has_seps = true;
        o.item_sep = seps->a->v[0].s;
        o.key_sep = seps->a->v[1].s;
    }
    return to_json_str(cx, pos, v, &o, true, out);
}

static int join_filter(jcx *cx, uint32_t pos, jv v, const fargs *a, jv *out)
{
    const jv *sep = fa_get(a, 0, "separator");
    if (sep && sep->k != JV_STR) return jx_fail(cx, pos, "join: the separator must be a string");
    jstr s = sep ? sep->s : JSTR("");
    if (v.k == JV_ARR) return join_items(cx, pos, v.a, s, out);
    if (v.k != JV_STR) return unknown_filter(cx, pos, JSTR("join"), v);
    dx_buf b; /* Array.from(string).join(sep): between code points */
    jx_buf_init(cx, &b);
    int rc = 0;
    for (size_t i = 0; !rc && i < v.s.n;) {
        uint32_t cp;
        size_t l = utf8_dec(v.s.p + i, v.s.n - i, &cp);
        if (i) rc = jx_append(cx, pos, &b, s.p, s.n);
        if (!rc) rc = jx_append(cx, pos, &b, v.s.p + i, l);
        i += l;
    }
    if (!rc) rc = new_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

static int number_conv_filter(jcx *cx, uint32_t pos, jv v, bool to_int, const fargs *a, jv *out)
{
    const jv *d = fa_get(a, 0, "default");
    if (v.k == JV_STR) {
        double x = to_int ? parse_int10(v.s) : parse_float(v.s);
        *out = !isnan(x) ? (to_int ? jv_int(x) : jv_float(x))
               : d       ? *d
               : to_int  ? jv_int(0)
                         : jv_float(0);
    } else if (jv_is_num(v)) {
        *out = v; /* the reference leaves numbers as they are here */
    } else if (v.k == JV_BOOL) {
        *out = to_int ? jv_int(v.b) : jv_float(v.b);
    } else {
        return unknown_filter(cx, pos, to_int ? JSTR("int") : JSTR("float"), v);
    }
    return 0;
}

static int default_filter(jcx *cx, uint32_t pos, jv v, const fargs *a, jv *out)
{
    const jv *d = arg_at(a->pos, a->n, 0);
    bool boolean = false;
    int rc = bool_opt(cx, pos, fa_get(a, 1, "boolean"), "default: the boolean flag", &boolean);
    if (rc) return rc;
    bool use = v.k == JV_UNDEF;
    if (!use && boolean) {
        bool t;
        if ((rc = jx_test_truth(cx, pos, v, &t))) return rc;
        use = !t;
    }
    *out = use ? (d ? *d : jv_str(JSTR(""))) : v;
    return 0;
}

/* getAttributeValue: "a.b.0" through dicts, namespaces and list indices. */
static jv attr_path(jv item, jstr path)
{
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < path.n && path.p[j] != '.') j++;
        jstr part = {path.p + i, j - i};
        if (jv_is_map(item)) {
            jv *v = jo_get(item.o, part);
            item = v && v->k != JV_RAW ? *v : jv_undef();
        } else if (item.k == JV_ARR) {
            double k = parse_int10(part);
            if (!(k >= 0 && k < (double)item.a->n)) return jv_undef();
            item = item.a->v[(size_t)k];
        } else {
            return jv_undef();
        }
        if (j >= path.n) return item;
        i = j + 1;
    }
}

static int sort_filter(jcx *cx, uint32_t pos, jv v, const fargs *a, jv *out)
{
    bool rev = false, cs = false;
    int rc = bool_opt(cx, pos, fa_get(a, 0, "reverse"), "sort: reverse", &rev);
    if (!rc) rc = bool_opt(cx, pos, fa_get(a, 1, "case_sensitive"), "sort: case_sensitive", &cs);
    const jv *attr = fa_get(a, 2, "attribute");
    if (!rc && attr && attr->k != JV_STR && attr->k != JV_INT && attr->k != JV_NULL)
        rc = jx_fail(cx, pos, "sort: attribute must be a string, an integer or none");
    if (rc) return rc;
    jv *keys = jx_alloc(cx, (v.a->n + 1) * sizeof *keys), path = jv_undef();
    if (!keys) return jx_oom(cx, pos);
    if (attr && attr->k == JV_INT) rc = jx_to_str(cx, pos, *attr, &path);
    if (attr && attr->k == JV_STR) path = *attr;
    for (size_t i = 0; !rc && i < v.a->n; i++)
        keys[i] = path.k == JV_STR ? attr_path(v.a->v[i], path.s) : v.a->v[i];
    return rc ? rc : sorted(cx, pos, v.a, keys, cs, rev, out);
}

static int select_filter(jcx *cx, uint32_t pos, jv v, const jnode *f, bool select, jv *out)
{
    const char *name = select ? "selectattr" : "rejectattr";
    for (size_t i = 0; i < v.a->n; i++)
        if (!jv_is_map(v.a->v[i]))
            return jx_fail(cx, pos, "%s can only be applied to a list of dicts", name);
    jv args[3];
    for (uint32_t i = 0; i < f->l1.n; i++) {
        if (f->l1.v[i]->kind != JN_STR)
            return jx_fail(cx, pos, "%s: the arguments must be strings", name);
        if (i < 3) args[i] = jv_str(f->l1.v[i]->str);
    }
    if (f->l1.n > 1 && !jx_test_exists(args[1].s))
        return jx_fail(cx, pos, "%s: unknown test '%.*s'", name, (int)args[1].s.n, args[1].s.p);
    int rc = jx_arr_new(cx, pos, v.a->n, out);
    if (!rc) out->a->n = 0;
    for (size_t i = 0; !rc && i < v.a->n; i++) {
        if (!f->l1.n) return jx_fail(cx, pos, "%s needs an attribute name", name);
        jv *at = jo_get(v.a->v[i].o, args[0].s);
        bool res = false;
        if (at && at->k != JV_RAW) {
            if (f->l1.n > 1)
                rc = jx_run_test(cx, pos, args[1].s, *at, f->l1.n > 2 ? &args[2] : NULL, &res);
            else
                res = jx_truthy(*at);
        }
        if (!rc && res == select) out->a->v[out->a->n++] = v.a->v[i];
    }
    return rc;
}

static int map_filter(jcx *cx, uint32_t pos, jv v, const fargs *a, jv *out)
{
    const jv *attr = fa_kw(a, "attribute"), *dflt = fa_kw(a, "default");
    if (!jo_get(a->kw, JSTR("attribute")))
        return jx_fail(cx, pos, "map is only supported with attribute=...");
    if (!attr || attr->k != JV_STR) return jx_fail(cx, pos, "map: attribute must be a string");
    int rc = jx_arr_new(cx, pos, v.a->n, out);
    for (size_t i = 0; !rc && i < v.a->n; i++) {
        if (!jv_is_map(v.a->v[i])) return jx_fail(cx, pos, "map: the items must be dicts");
        jv x = attr_path(v.a->v[i], attr->s);
        out->a->v[i] = x.k == JV_UNDEF && dflt ? *dflt : x;
    }
    return rc;
}

static int indent_filter(jcx *cx, uint32_t pos, jv v, const fargs *a, jv *out)
{
    const jv *w = fa_get(a, 0, "width"), *first = fa_get(a, 1, "first"),
             *blank = fa_get(a, 2, "blank");
    if (w && w->k != JV_INT) return jx_fail(cx, pos, "indent: width must be an integer");
    return indent_lines(cx, pos, v.s, w ? w->n : 4, first && jx_truthy_raw(*first),
                        blank && jx_truthy_raw(*blank), out);
}

/* The positional arguments, then the keyword arguments as one more
 * (when there are any, or always). */
static int with_kwargs(jcx *cx, uint32_t pos, const fargs *a, bool always, jv **args, size_t *n)
{
    *n = a->n;
    *args = jx_alloc(cx, (a->n + 1) * sizeof **args);
    if (!*args) return jx_oom(cx, pos);
    if (a->n) memcpy(*args, a->pos, a->n * sizeof **args);
    if (always || a->kw->n) (*args)[(*n)++] = (jv){.k = JV_OBJ, .o = a->kw};
    return 0;
}

/* round(precision=0, method='common'|'ceil'|'floor'), as Python Jinja (an
 * addition: the reference has no round). */
static int round_filter(jcx *cx, uint32_t pos, jv v, const fargs *a, jv *out)
{
    const jv *p = fa_get(a, 0, "precision"), *m = fa_get(a, 1, "method");
    if (p && p->k != JV_INT) return jx_fail(cx, pos, "round: precision must be an integer");
    if (m && (m->k != JV_STR ||
              !(jstr_is(m->s, "common") || jstr_is(m->s, "ceil") || jstr_is(m->s, "floor"))))
        return jx_fail(cx, pos, "round: method must be 'common', 'ceil' or 'floor'");
    double prec = p ? p->n : 0;
    if (!m || jstr_is(m->s, "common")) {
        *out = v.k == JV_INT && prec >= 0 ? v
               : v.k == JV_INT            ? jv_int(round_common(v.n, prec))
                                          : jv_float(round_common(v.n, prec));
        return 0;
    }
    double scale = pow(10, prec), x = v.n * scale;
    *out = jv_float((jstr_is(m->s, "ceil") ? ceil(x) : floor(x)) / scale);
    return 0;
}

bool jx_filter_literal_args(jstr name)
{
    return is_name(name, "selectattr") || is_name(name, "rejectattr");
}

int jx_filter_literal(jcx *cx, jv v, const jnode *f, jv *out)
{
    jstr name = f->a->str;
    if (v.k != JV_ARR) return unknown_filter(cx, f->pos, name, v);
    return select_filter(cx, f->pos, v, f, is_name(name, "selectattr"), out);
}

int jx_filter_call(jcx *cx, uint32_t pos, jv v, jstr name, jv *pos_args, size_t npos, jobj *kw,
                   jv *out)
{
    const fargs a = {pos_args, npos, kw};
    int rc;
    if (is_name(name, "tojson")) return tojson_filter(cx, pos, v, &a, out);
    if (is_name(name, "join")) return join_filter(cx, pos, v, &a, out);
    if (is_name(name, "int") || is_name(name, "float"))
        return number_conv_filter(cx, pos, v, is_name(name, "int"), &a, out);
    if (is_name(name, "default")) return default_filter(cx, pos, v, &a, out);
    if (v.k == JV_ARR && is_name(name, "sort")) return sort_filter(cx, pos, v, &a, out);
    if (v.k == JV_ARR && is_name(name, "map")) return map_filter(cx, pos, v, &a, out);
    if (v.k == JV_STR && is_name(name, "indent")) return indent_filter(cx, pos, v, &a, out);
    if (v.k == JV_STR && is_name(name, "replace")) {
        jv *args;
        size_t n;
        /* the reference always passes the keyword arguments, even none */
        if ((rc = with_kwargs(cx, pos, &a, true, &args, &n))) return rc;
        return str_replace(cx, pos, v.s, args, n, out);
    }
    if (jv_is_num(v) && is_name(name, "round")) return round_filter(cx, pos, v, &a, out);
    int id = v.k == JV_OBJ ? find_named(k_obj_methods, DX_ARRAY_LEN(k_obj_methods), name) : DX_NONE;
    if (id >= 0) {
        jv *args;
        size_t n;
        if ((rc = with_kwargs(cx, pos, &a, false, &args, &n))) return rc;
        return call_obj_method(cx, pos, id, v.o, args, n, out);
    }
    if (v.k == JV_RAW) return jx_raw_error(cx, pos);
    return unknown_filter(cx, pos, name, v);
}
