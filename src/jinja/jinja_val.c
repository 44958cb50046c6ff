/* jinja_val: values of the Jinja interpreter and their JavaScript-exact
 * forms.
 *
 * @huggingface/jinja's values wrap JavaScript values, and what a template
 * prints follows JavaScript: numbers print with Number.prototype.toString
 * (shortest round-trip digits, "1e+21"), a float that is whole prints with
 * one decimal ("3.0") but concatenates without it ("3"), lists and dicts
 * print as JSON with ", " and ": ", `==` is JavaScript's loose equality and
 * `in` its strict one, strings compare by UTF-16 code units.  Each rule
 * below names the piece of runtime.ts it follows. */
#include "jinja/jinja_priv.h"

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"

/* ---- arena ---------------------------------------------------------------- */

struct ja_chunk {
    ja_chunk *next;
    size_t cap, used;
    max_align_t data[];
};

#define JA_CHUNK (64u << 10)

void *ja_alloc(jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (a->max && (n > a->max || a->used > a->max - n)) {
        dx_errf(DX_ETOOBIG, "jinja: the render needs more than %zu bytes of memory", a->max);
        return NULL;
    }
    ja_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > JA_CHUNK ? n : JA_CHUNK;
        c = dx_malloc(sizeof *c + cap);
        if (!c) {
            dx_errf(DX_ENOMEM, "jinja: out of memory (%zu bytes)", cap);
            return NULL;
        }
        c->cap = cap;
        c->used = 0;
        /* a big block goes behind the current chunk, which keeps its room */
        if (a->head && n > JA_CHUNK) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = (unsigned char *)c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void ja_free_all(jarena *a)
{
    ja_chunk *c = a->head;
    while (c) {
        ja_chunk *next = c->next;
        dx_free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- errors and allocation in a render ----------------------------------- */

static int jx_vfail(jcx *cx, int code, uint32_t pos, const char *fmt, va_list ap)
{
    return jinja_verr_at(code, cx->t->src, cx->t->len, pos, fmt, ap);
}

int jx_fail(jcx *cx, uint32_t pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = jx_vfail(cx, DX_EINVAL, pos, fmt, ap);
    va_end(ap);
    return rc;
}

int jx_limit(jcx *cx, uint32_t pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = jx_vfail(cx, DX_ETOOBIG, pos, fmt, ap);
    va_end(ap);
    return rc;
}

int jx_steps(jcx *cx, uint32_t pos, uint64_t n)
{
    cx->steps += n;
    if (cx->steps <= cx->lim.max_steps) return 0;
    return jx_limit(cx, pos, "the template ran more than %llu steps (a loop that does not end?)",
                    (unsigned long long)cx->lim.max_steps);
}

static int jx_failc(jcx *cx, int code, uint32_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int jx_failc(jcx *cx, int code, uint32_t pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = jx_vfail(cx, code, pos, fmt, ap);
    va_end(ap);
    return rc;
}

/* ja_alloc set the message; this adds where it happened. */
int jx_oom(jcx *cx, uint32_t pos)
{
    int code = dx_errcode() == DX_ETOOBIG ? DX_ETOOBIG : DX_ENOMEM;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dx_errmsg());
    return jx_failc(cx, code, pos, "%s", strncmp(msg, "jinja: ", 7) ? msg : msg + 7);
}

int jx_raw_error(jcx *cx, uint32_t pos)
{
    return jx_fail(cx, pos, "value is undefined (the first or last item of an empty list)");
}

void *jx_alloc(jcx *cx, size_t n)
{
    return ja_alloc(&cx->ar, n);
}

int jx_strdup(jcx *cx, uint32_t pos, const char *p, size_t n, jv *out)
{
    if (n > cx->lim.max_output)
        return jx_limit(cx, pos, "a string of %zu bytes is longer than the limit of %zu", n,
                        cx->lim.max_output);
    char *s = jx_alloc(cx, n + 1);
    if (!s) return jx_oom(cx, pos);
    if (n) memcpy(s, p, n);
    *out = jv_str((jstr){s, n});
    return 0;
}

int jx_buf_str(jcx *cx, uint32_t pos, const dx_buf *b, jv *out)
{
    return jx_strdup(cx, pos, b->data ? b->data : "", b->len, out);
}

int jx_arr_new(jcx *cx, uint32_t pos, size_t n, jv *out)
{
    size_t bytes;
    if (dx_mul_overflow(n ? n : 1, sizeof(jv), &bytes))
        return jx_limit(cx, pos, "a list of %zu items is too long", n);
    jarr *a = jx_alloc(cx, sizeof *a);
    if (!a || !(a->v = jx_alloc(cx, bytes))) return jx_oom(cx, pos);
    a->n = a->cap = n;
    *out = (jv){.k = JV_ARR, .a = a};
    return 0;
}

int jx_arr_push(jcx *cx, uint32_t pos, jarr *a, jv v)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 8;
        jv *nv = jx_alloc(cx, cap * sizeof *nv);
        if (!nv) return jx_oom(cx, pos);
        if (a->n) memcpy(nv, a->v, a->n * sizeof *nv);
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n++] = v;
    return 0;
}

int jx_obj_new(jcx *cx, uint32_t pos, enum jkind k, jv *out)
{
    jobj *o = jx_alloc(cx, sizeof *o);
    if (!o) return jx_oom(cx, pos);
    *out = (jv){.k = (uint8_t)k, .o = o};
    return 0;
}

static size_t slot_start(const jobj *o, jstr key)
{
    return (size_t)XXH3_64bits(key.p, key.n) & (o->nslots - 1);
}

/* The slot holding key, or the empty slot where it would go. */
static size_t slot_find(const jobj *o, jstr key)
{
    size_t s = slot_start(o, key);
    while (o->slots[s] && !jstr_eq(o->keys[o->slots[s] - 1], key)) s = (s + 1) & (o->nslots - 1);
    return s;
}

static void index_fill(jobj *o)
{
    memset(o->slots, 0, o->nslots * sizeof *o->slots);
    for (size_t i = 0; i < o->n; i++) o->slots[slot_find(o, o->keys[i])] = (uint32_t)(i + 1);
}

jv *jo_get(const jobj *o, jstr key)
{
    if (o->slots) {
        uint32_t at = o->slots[slot_find(o, key)];
        return at ? &o->vals[at - 1] : NULL;
    }
    for (size_t i = 0; i < o->n; i++)
        if (jstr_eq(o->keys[i], key)) return &o->vals[i];
    return NULL;
}

static int grow(jcx *cx, uint32_t pos, jobj *o)
{
    size_t cap = o->cap ? o->cap * 2 : 4;
    if (cap > UINT32_MAX / 4) return jx_limit(cx, pos, "a dict with too many keys");
    jstr *keys = jx_alloc(cx, cap * sizeof *keys);
    jv *vals = jx_alloc(cx, cap * sizeof *vals);
    if (!keys || !vals) return jx_oom(cx, pos);
    if (o->n) {
        memcpy(keys, o->keys, o->n * sizeof *keys);
        memcpy(vals, o->vals, o->n * sizeof *vals);
    }
    o->keys = keys;
    o->vals = vals;
    o->cap = cap;
    if (cap <= JO_LINEAR) return 0;
    o->nslots = cap * 2;
    if (!(o->slots = jx_alloc(cx, o->nslots * sizeof *o->slots))) return jx_oom(cx, pos);
    index_fill(o);
    return 0;
}

int jo_set(jcx *cx, uint32_t pos, jobj *o, jstr key, jv v)
{
    jv *slot = jo_get(o, key);
    if (slot) {
        *slot = v;
        return 0;
    }
    int rc = o->n == o->cap ? grow(cx, pos, o) : 0;
    if (rc) return rc;
    o->keys[o->n] = key;
    o->vals[o->n++] = v;
    if (o->slots) o->slots[slot_find(o, key)] = (uint32_t)o->n;
    return 0;
}

bool jo_del(jobj *o, jstr key)
{
    for (size_t i = 0; i < o->n; i++) {
        if (!jstr_eq(o->keys[i], key)) continue;
        memmove(o->keys + i, o->keys + i + 1, (o->n - i - 1) * sizeof *o->keys);
        memmove(o->vals + i, o->vals + i + 1, (o->n - i - 1) * sizeof *o->vals);
        o->n--;
        if (o->slots) index_fill(o); /* later keys moved down one place */
        return true;
    }
    return false;
}

void jx_buf_init(jcx *cx, dx_buf *b)
{
    dx_buf_init(b, cx->lim.max_output);
}

/* Text work counts against the steps too (a step per 64 bytes), so that
 * string operations in a loop cannot run long on few steps. */
int jx_append(jcx *cx, uint32_t pos, dx_buf *b, const char *p, size_t n)
{
    int rc = n >= 64 ? jx_steps(cx, pos, n / 64) : 0;
    if (rc) return rc;
    if (!dx_buf_append(b, p, n)) return 0;
    if (dx_errcode() == DX_ETOOBIG)
        return jx_limit(cx, pos, "output longer than the limit of %zu bytes", b->max);
    return jx_oom(cx, pos);
}

bool jstr_eq(jstr a, jstr b)
{
    return a.n == b.n && (!a.n || !memcmp(a.p, b.p, a.n));
}
bool jstr_is(jstr a, const char *z)
{
    return jstr_eq(a, (jstr){z, strlen(z)});
}

/* Line and column (1-based, columns in characters) of byte `pos` of src. */
static void linecol(const char *src, size_t len, size_t pos, unsigned *line, unsigned *col)
{
    unsigned l = 1, c = 1;
    for (size_t i = 0; i < pos && i < len; i++) {
        if (src[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)src[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

int jinja_verr_at(int code, const char *src, size_t len, size_t pos, const char *fmt, va_list ap)
{
    unsigned line, col;
    linecol(src, len, pos, &line, &col);
    char where[64];
    snprintf(where, sizeof where, "jinja: line %u, column %u", line, col);
    return dx_verrp(code, where, fmt, ap);
}

int jinja_err_at(int code, const char *src, size_t len, size_t pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = jinja_verr_at(code, src, len, pos, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- values from JSON ----------------------------------------------------- */

/* An array index as JavaScript objects order them first: "0" or a canonical
 * decimal below 2^32 - 1. */
static bool index_key(const char *k, size_t n, double *val)
{
    if (!n || n > 10 || (n > 1 && k[0] == '0')) return false;
    double v = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9') return false;
        v = v * 10 + (k[i] - '0');
    }
    *val = v;
    return v <= 4294967294.0;
}

static int obj_from_json(jcx *cx, const json_t *j, unsigned depth, jv *out);

int jx_from_json(jcx *cx, const json_t *j, unsigned depth, jv *out)
{
    if (depth > cx->lim.max_depth)
        return jx_limit(cx, 0, "variables nested deeper than %u levels", cx->lim.max_depth);
    switch (json_typeof(j)) {
    case JSON_NULL:
        *out = jv_null();
        return 0;
    case JSON_TRUE:
    case JSON_FALSE:
        *out = jv_bool(json_is_true(j));
        return 0;
    case JSON_INTEGER:
        *out = jv_int((double)json_integer_value(j));
        return 0;
    case JSON_REAL: {
        /* JavaScript has one number type: a whole real is an integer */
        double d = json_real_value(j);
        *out = isfinite(d) && d == floor(d) ? jv_int(d) : jv_float(d);
        return 0;
    }
    case JSON_STRING:
        *out = jv_str((jstr){json_string_value(j), json_string_length(j)});
        return 0;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        int rc = jx_arr_new(cx, 0, n, out);
        for (size_t i = 0; !rc && i < n; i++)
            rc = jx_from_json(cx, json_array_get(j, i), depth + 1, &out->a->v[i]);
        return rc;
    }
    case JSON_OBJECT:
        return obj_from_json(cx, j, depth, out);
    }
    return jx_fail(cx, 0, "unsupported JSON value");
}

static int obj_put_json(jcx *cx, jobj *o, const char *k, const json_t *v, unsigned depth)
{
    jv val;
    int rc = jx_from_json(cx, v, depth + 1, &val);
    return rc ? rc : jo_set(cx, 0, o, (jstr){k, strlen(k)}, val);
}

/* Object.entries order: index keys ascending, then the rest as inserted. */
static int obj_from_json(jcx *cx, const json_t *j, unsigned depth, jv *out)
{
    int rc = jx_obj_new(cx, 0, JV_OBJ, out);
    size_t n = json_object_size(j), ni = 0;
    const char **idx = n ? jx_alloc(cx, n * sizeof *idx) : NULL;
    double *num = n ? jx_alloc(cx, n * sizeof *num) : NULL;
    if (!rc && n && (!idx || !num)) rc = jx_oom(cx, 0);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)j, k, v)
    {
        double d;
        if (rc || !index_key(k, strlen(k), &d)) continue;
        size_t at = ni++;
        while (at > 0 && num[at - 1] > d) {
            idx[at] = idx[at - 1];
            num[at] = num[at - 1];
            at--;
        }
        idx[at] = k;
        num[at] = d;
    }
    for (size_t i = 0; !rc && i < ni; i++)
        rc = obj_put_json(cx, out->o, idx[i], json_object_get(j, idx[i]), depth);
    json_object_foreach((json_t *)j, k, v)
    {
        double d;
        if (!rc && !index_key(k, strlen(k), &d)) rc = obj_put_json(cx, out->o, k, v, depth);
    }
    return rc;
}

/* ---- Unicode and JavaScript string helpers ------------------------------- */

/* Lenient on purpose, unlike dx_utf8_decode (which answers 0 for anything
 * not strict UTF-8): every caller steps over what this returns, so it must
 * always advance (1..n bytes), and it decodes by the lead byte alone, never
 * checking the bytes that follow (a truncated 3-byte sequence is U+FFFD).
 * Its inputs should be valid UTF-8 (the parser checks templates, jansson the
 * JSON it reads), where the two agree; on anything else, this one's answer is
 * what templates have always printed. */
size_t utf8_dec(const char *p, size_t n, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)p;
    if (s[0] < 0x80 || n < 2) {
        *cp = s[0];
        return 1;
    }
    if (s[0] < 0xE0) {
        *cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (s[0] < 0xF0 || n < 4) {
        *cp = n < 3 ? 0xFFFD
                    : ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) |
                          (s[2] & 0x3F);
        return n < 3 ? n : 3;
    }
    *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

/* JavaScript's WhiteSpace and LineTerminator (\s, String.prototype.trim). */
static bool js_ws_cp(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

size_t js_ws_len(const char *p, size_t n)
{
    if (!n) return 0;
    uint32_t cp;
    size_t l = utf8_dec(p, n, &cp);
    return js_ws_cp(cp) ? l : 0;
}

size_t js_ws_len_before(const char *p, size_t n)
{
    for (size_t l = 1; l <= 3 && l <= n; l++) {
        unsigned char c = (unsigned char)p[n - l];
        if ((c & 0xC0) == 0x80) continue;
        return js_ws_len(p + n - l, l) == l ? l : 0;
    }
    return 0;
}

jstr js_trim(jstr s, bool start, bool end)
{
    size_t w;
    while (start && s.n && (w = js_ws_len(s.p, s.n))) {
        s.p += w;
        s.n -= w;
    }
    while (end && s.n && (w = js_ws_len_before(s.p, s.n))) s.n -= w;
    return s;
}

size_t js_utf16_len(jstr s)
{
    size_t n = 0;
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        if ((c & 0xC0) != 0x80) n += c >= 0xF0 ? 2 : 1;
    }
    return n;
}

/* Compares as JavaScript's < on strings: by UTF-16 code units, where a
 * character above U+FFFF (a surrogate pair, 0xD800...) sorts before
 * U+E000..U+FFFF. */
int jx_utf16_cmp(jstr a, jstr b)
{
    size_t i = 0, j = 0;
    while (i < a.n && j < b.n) {
        uint32_t x, y;
        i += utf8_dec(a.p + i, a.n - i, &x);
        j += utf8_dec(b.p + j, b.n - j, &y);
        if (x == y) continue;
        uint32_t ux = x >= 0x10000 ? 0xD800 + ((x - 0x10000) >> 10) : x;
        uint32_t uy = y >= 0x10000 ? 0xD800 + ((y - 0x10000) >> 10) : y;
        if (ux != uy) return ux < uy ? -1 : 1;
        return x < y ? -1 : 1; /* same high surrogate: the low ones order as the code points */
    }
    return i < a.n ? 1 : j < b.n ? -1 : 0;
}

static locale_t g_utf8_locale;
static pthread_once_t g_locale_once = PTHREAD_ONCE_INIT;

static void locale_init(void)
{
    g_utf8_locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
}

uint32_t jx_lower_cp(uint32_t cp)
{
    if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    pthread_once(&g_locale_once, locale_init);
    return g_utf8_locale ? (uint32_t)towlower_l((wint_t)cp, g_utf8_locale) : cp;
}

uint32_t jx_upper_cp(uint32_t cp)
{
    if (cp < 0x80) return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
    pthread_once(&g_locale_once, locale_init);
    return g_utf8_locale ? (uint32_t)towupper_l((wint_t)cp, g_utf8_locale) : cp;
}

/* Upper-case mappings that grow a character (SpecialCasing.txt), which
 * toUpperCase applies and towupper cannot. */
static const char *upper_special(uint32_t cp)
{
    switch (cp) {
    case 0xDF:
        return "SS";
    case 0xFB00:
        return "FF";
    case 0xFB01:
        return "FI";
    case 0xFB02:
        return "FL";
    case 0xFB03:
        return "FFI";
    case 0xFB04:
        return "FFL";
    case 0xFB05:
    case 0xFB06:
        return "ST";
    default:
        return NULL;
    }
}

/* String.prototype.toUpperCase / toLowerCase (full Unicode where the C
 * library knows the mapping; see docs/templates.md). */
int jx_case(jcx *cx, uint32_t pos, jstr s, bool upper, jv *out)
{
    dx_buf b;
    jx_buf_init(cx, &b);
    int rc = jx_steps(cx, pos, s.n / 64);
    for (size_t i = 0; !rc && i < s.n;) {
        uint32_t cp;
        i += utf8_dec(s.p + i, s.n - i, &cp);
        const char *sp = upper ? upper_special(cp) : (cp == 0x130 ? "i\xCC\x87" : NULL);
        if (sp) {
            rc = jx_append(cx, pos, &b, sp, strlen(sp));
            continue;
        }
        uint32_t m = upper ? jx_upper_cp(cp) : jx_lower_cp(cp);
        if (m > 0x10FFFF || (m >= 0xD800 && m <= 0xDFFF)) m = cp;
        /* 4 bytes are the bound check, whatever m's length: as it always was */
        if (dx_buf_reserve(&b, 4))
            rc = jx_limit(cx, pos, "string longer than the limit of %zu bytes", b.max);
        else
            rc = dx_utf8_put(&b, m); /* cannot fail: room is reserved, m <= U+10FFFF */
    }
    if (!rc) rc = jx_buf_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

/* ---- numbers as JavaScript prints them ------------------------------------ */

static bool reads_back(uint64_t m, int e, double x)
{
    char b[48];
    snprintf(b, sizeof b, "%llue%d", (unsigned long long)m, e);
    return strtod(b, NULL) == x;
}

/* The fewest digits m * 10^e that read back as x > 0 (ECMAScript
 * Number::toString).  The correctly rounded p-digit value is tried first;
 * next to a power of two, where the gap below x is half the gap above, the
 * value one unit up (or down) may read back when it does not. */
static void shortest(double x, uint64_t *mant, int *exp10)
{
    uint64_t pow10 = 1;
    for (int p = 1; p <= 17; p++, pow10 *= 10) {
        char tmp[48];
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
        uint64_t m = 0;
        const char *c = tmp;
        for (; *c && *c != 'e'; c++)
            if (*c >= '0' && *c <= '9') m = m * 10 + (uint64_t)(*c - '0');
        int e = atoi(c + 1) - (p - 1);
        uint64_t up = m + 1 < pow10 * 10 ? m + 1 : pow10;
        int up_e = m + 1 < pow10 * 10 ? e : e + 1;
        uint64_t down = m > pow10 ? m - 1 : pow10 * 10 - 1;
        int down_e = m > pow10 ? e : e - 1;
        if (reads_back(m, e, x) || p == 17) {
            *mant = m;
            *exp10 = e;
            return;
        }
        if (reads_back(up, up_e, x)) {
            *mant = up;
            *exp10 = up_e;
            return;
        }
        if (reads_back(down, down_e, x)) {
            *mant = down;
            *exp10 = down_e;
            return;
        }
    }
}

/* Shortest digits that read back as x: digits[0..k), x = 0.d1d2... * 10^n. */
static int shortest_digits(double x, char *digits, int *n)
{
    uint64_t m = 0; /* set by shortest(); gcc -O1 (tsan) cannot see it */
    int e = 0;
    shortest(x, &m, &e);
    while (m >= 10 && m % 10 == 0) {
        m /= 10;
        e++;
    }
    int k = snprintf(digits, 24, "%llu", (unsigned long long)m);
    *n = e + k;
    return k;
}

void js_num_str(double x, char buf[32])
{
    if (isnan(x)) {
        strcpy(buf, "NaN");
        return;
    }
    if (isinf(x)) {
        strcpy(buf, x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (x == 0) {
        strcpy(buf, "0");
        return;
    }
    char d[24], *o = buf;
    if (x < 0) *o++ = '-';
    int n, k = shortest_digits(fabs(x), d, &n);
    if (k <= n && n <= 21) {
        memcpy(o, d, (size_t)k);
        memset(o + k, '0', (size_t)(n - k));
        o[n] = 0;
    } else if (0 < n && n <= 21) {
        memcpy(o, d, (size_t)n);
        o[n] = '.';
        strcpy(o + n + 1, d + n);
    } else if (-6 < n && n <= 0) {
        o[0] = '0';
        o[1] = '.';
        memset(o + 2, '0', (size_t)-n);
        strcpy(o + 2 - n, d);
    } else {
        int e = n - 1;
        *o++ = d[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, d + 1, (size_t)(k - 1));
            o += k - 1;
        }
        sprintf(o, "e%c%d", e < 0 ? '-' : '+', abs(e));
    }
}

/* FloatValue.toString: -0 is "-0.0", a whole number gets ".0" (toFixed(1)). */
static void float_str(double x, char buf[40])
{
    if (x == 0 && signbit(x))
        strcpy(buf, "-0.0");
    else if (isfinite(x) && x == floor(x) && fabs(x) < 1e21)
        snprintf(buf, 40, "%.1f", x);
    else
        js_num_str(x, buf);
}

/* ---- text forms ----------------------------------------------------------- */

static int put_z(jcx *cx, uint32_t pos, dx_buf *b, const char *z)
{
    return jx_append(cx, pos, b, z, strlen(z));
}

/* Array.prototype.join(",") over RuntimeValue objects: each element's
 * toString(), JavaScript's undefined as "". */
static int put_array_join(jcx *cx, uint32_t pos, dx_buf *b, const jarr *a)
{
    int rc = 0;
    for (size_t i = 0; !rc && i < a->n; i++) {
        if (i) rc = put_z(cx, pos, b, ",");
        if (!rc && a->v[i].k != JV_RAW) rc = jx_put_str(cx, pos, b, a->v[i]);
    }
    return rc;
}

int jx_put_raw(jcx *cx, uint32_t pos, dx_buf *b, jv v)
{
    char num[32];
    switch (v.k) {
    case JV_INT:
    case JV_FLOAT:
        js_num_str(v.n, num);
        return put_z(cx, pos, b, num);
    case JV_STR:
        return jx_append(cx, pos, b, v.s.p, v.s.n);
    case JV_BOOL:
        return put_z(cx, pos, b, v.b ? "true" : "false");
    case JV_NULL:
        return put_z(cx, pos, b, "null");
    case JV_UNDEF:
        return put_z(cx, pos, b, "undefined");
    case JV_ARR:
        return put_array_join(cx, pos, b, v.a);
    case JV_OBJ:
    case JV_NS:
        return put_z(cx, pos, b, "[object Map]");
    case JV_FN:
        return jx_fail(cx, pos, "cannot convert a function to text");
    default:
        return jx_raw_error(cx, pos);
    }
}

int jx_put_join_item(jcx *cx, uint32_t pos, dx_buf *b, jv v)
{
    if (v.k == JV_NULL || v.k == JV_UNDEF) return 0;
    return jx_put_raw(cx, pos, b, v);
}

int jx_put_str(jcx *cx, uint32_t pos, dx_buf *b, jv v)
{
    char num[40];
    switch (v.k) {
    case JV_FLOAT:
        float_str(v.n, num);
        return put_z(cx, pos, b, num);
    case JV_ARR:
    case JV_OBJ:
    case JV_NS: {
        jjson_opts o = {0};
        return jx_put_json(cx, pos, b, v, &o, 0, false);
    }
    default:
        return jx_put_raw(cx, pos, b, v);
    }
}

int jx_to_str(jcx *cx, uint32_t pos, jv v, jv *out)
{
    if (v.k == JV_STR) {
        *out = v;
        return 0;
    }
    dx_buf b;
    jx_buf_init(cx, &b);
    int rc = jx_put_str(cx, pos, &b, v);
    if (!rc) rc = jx_buf_str(cx, pos, &b, out);
    dx_buf_free(&b);
    return rc;
}

/* ---- JSON (runtime.ts toJSON) --------------------------------------------- */

static int put_u16(jcx *cx, uint32_t pos, dx_buf *b, unsigned u)
{
    char esc[16];
    snprintf(esc, sizeof esc, "\\u%04x", u & 0xFFFF);
    return put_z(cx, pos, b, esc);
}

/* JSON.stringify of a string, then makeAsciiSafe when ensure_ascii. */
static int put_json_string(jcx *cx, uint32_t pos, dx_buf *b, jstr s, bool ascii)
{
    int rc = put_z(cx, pos, b, "\"");
    size_t run = 0; /* start of bytes copied as they are */
    for (size_t i = 0; !rc && i < s.n;) {
        uint32_t cp;
        size_t l = utf8_dec(s.p + i, s.n - i, &cp);
        const char *esc = cp == '"'    ? "\\\""
                          : cp == '\\' ? "\\\\"
                          : cp == '\b' ? "\\b"
                          : cp == '\f' ? "\\f"
                          : cp == '\n' ? "\\n"
                          : cp == '\r' ? "\\r"
                          : cp == '\t' ? "\\t"
                                       : NULL;
        bool plain = !esc && cp >= 0x20 && !(ascii && cp >= 0x7F);
        if (!plain) {
            rc = jx_append(cx, pos, b, s.p + run, i - run);
            if (!rc && esc) rc = put_z(cx, pos, b, esc);
            if (!rc && !esc && cp >= 0x10000) {
                rc = put_u16(cx, pos, b, 0xD800 + ((cp - 0x10000) >> 10));
                if (!rc) rc = put_u16(cx, pos, b, 0xDC00 + ((cp - 0x10000) & 0x3FF));
            } else if (!rc && !esc) {
                rc = put_u16(cx, pos, b, cp);
            }
            run = i + l;
        }
        i += l;
    }
    if (!rc) rc = jx_append(cx, pos, b, s.p + run, s.n - run);
    return rc ? rc : put_z(cx, pos, b, "\"");
}

static int put_pad(jcx *cx, uint32_t pos, dx_buf *b, const jjson_opts *o, unsigned depth)
{
    int rc = put_z(cx, pos, b, "\n");
    size_t width = (size_t)o->indent;
    for (unsigned d = 0; !rc && d < depth; d++)
        for (size_t k = 0; !rc && k < width; k++) rc = put_z(cx, pos, b, " ");
    return rc;
}

static void json_seps(const jjson_opts *o, jstr *item, jstr *key)
{
    if (o->has_seps) {
        *item = o->item_sep;
        *key = o->key_sep;
    } else {
        *item = o->indent > 0 ? JSTR(",") : JSTR(", ");
        *key = JSTR(": ");
    }
}

static int put_json_array(jcx *cx, uint32_t pos, dx_buf *b, const jarr *a, const jjson_opts *o,
                          unsigned depth, bool undef_null)
{
    jstr item, key;
    json_seps(o, &item, &key);
    bool pad = o->indent > 0 && a->n;
    int rc = put_z(cx, pos, b, "[");
    for (size_t i = 0; !rc && i < a->n; i++) {
        if (i) rc = jx_append(cx, pos, b, item.p, item.n);
        if (!rc && pad) rc = put_pad(cx, pos, b, o, depth + 1);
        if (!rc) rc = jx_put_json(cx, pos, b, a->v[i], o, depth + 1, undef_null);
    }
    if (!rc && pad) rc = put_pad(cx, pos, b, o, depth);
    return rc ? rc : put_z(cx, pos, b, "]");
}

static int key_cmp(void *ctx, size_t i, size_t j)
{
    const jobj *o = ctx;
    return jx_locale_compare(o->keys[i], o->keys[j]);
}

static int put_json_object(jcx *cx, uint32_t pos, dx_buf *b, const jobj *m, const jjson_opts *o,
                           unsigned depth, bool undef_null)
{
    jstr item, key;
    json_seps(o, &item, &key);
    size_t *idx = jx_alloc(cx, (m->n + 1) * sizeof *idx * 2);
    if (!idx) return jx_oom(cx, pos);
    for (size_t i = 0; i < m->n; i++) idx[i] = i;
    if (o->sort_keys) jx_stable_sort(idx, m->n, idx + m->n + 1, key_cmp, (void *)m);
    int rc = put_z(cx, pos, b, "{");
    for (size_t i = 0; !rc && i < m->n; i++) {
        if (i) rc = jx_append(cx, pos, b, item.p, item.n);
        if (!rc && o->indent > 0) rc = put_pad(cx, pos, b, o, depth + 1);
        if (!rc) rc = put_json_string(cx, pos, b, m->keys[idx[i]], o->ensure_ascii);
        if (!rc) rc = jx_append(cx, pos, b, key.p, key.n);
        if (!rc) rc = jx_put_json(cx, pos, b, m->vals[idx[i]], o, depth + 1, undef_null);
    }
    if (!rc && o->indent > 0 && m->n) rc = put_pad(cx, pos, b, o, depth);
    return rc ? rc : put_z(cx, pos, b, "}");
}

int jx_put_json(jcx *cx, uint32_t pos, dx_buf *b, jv v, const jjson_opts *o, unsigned depth,
                bool undef_null)
{
    char num[32];
    if (depth > cx->lim.max_depth)
        return jx_limit(cx, pos, "value nested deeper than %u levels (does it contain itself?)",
                        cx->lim.max_depth);
    switch (v.k) {
    case JV_NULL:
        return put_z(cx, pos, b, "null");
    case JV_UNDEF:
        return put_z(cx, pos, b, undef_null ? "null" : "undefined");
    case JV_INT:
    case JV_FLOAT:
        if (!isfinite(v.n)) return put_z(cx, pos, b, "null");
        js_num_str(v.n, num);
        return put_z(cx, pos, b, num);
    case JV_BOOL:
        return put_z(cx, pos, b, v.b ? "true" : "false");
    case JV_STR:
        return put_json_string(cx, pos, b, v.s, o->ensure_ascii);
    case JV_ARR:
        if (v.a->tuple) return jx_fail(cx, pos, "cannot convert a tuple to JSON");
        return put_json_array(cx, pos, b, v.a, o, depth, undef_null);
    case JV_OBJ:
        if (v.o->kw) return jx_fail(cx, pos, "cannot convert keyword arguments to JSON");
        return put_json_object(cx, pos, b, v.o, o, depth, undef_null);
    case JV_NS:
        return put_json_object(cx, pos, b, v.o, o, depth, undef_null);
    case JV_FN:
        return jx_fail(cx, pos, "cannot convert a function to JSON");
    default:
        return jx_raw_error(cx, pos);
    }
}

/* ---- truthiness ----------------------------------------------------------- */

bool jx_truthy(jv v)
{
    switch (v.k) {
    case JV_BOOL:
        return v.b;
    case JV_INT:
    case JV_FLOAT:
        return v.n != 0 && !isnan(v.n);
    case JV_STR:
        return v.s.n > 0;
    case JV_ARR:
        return v.a->n > 0;
    case JV_OBJ:
        return v.o->n > 0;
    case JV_NS:
    case JV_FN:
        return true;
    default:
        return false;
    }
}

bool jx_truthy_raw(jv v)
{
    return v.k == JV_ARR || v.k == JV_OBJ ? true : jx_truthy(v);
}

int jx_test_truth(jcx *cx, uint32_t pos, jv v, bool *b)
{
    if (v.k == JV_RAW) return jx_raw_error(cx, pos);
    *b = jx_truthy(v);
    return 0;
}

/* ---- equality ------------------------------------------------------------- */

/* JavaScript's StringToNumber: trimmed; "" is 0; decimal, Infinity, 0x/0o/0b. */
static double js_str_num(jstr s)
{
    s = js_trim(s, true, true);
    if (!s.n) return 0;
    char buf[128];
    if (s.n >= sizeof buf) return NAN; /* no valid number literal is this long... */
    memcpy(buf, s.p, s.n);
    buf[s.n] = 0;
    const char *p = buf;
    char radix = p[0] == '0' ? (char)(p[1] | 32) : 0;
    if ((radix == 'x' || radix == 'o' || radix == 'b') && p[2]) {
        int base = radix == 'x' ? 16 : radix == 'o' ? 8 : 2;
        double v = 0;
        for (p += 2; *p; p++) {
            int c = *p | 32, d = *p >= '0' && *p <= '9' ? *p - '0'
                                 : c >= 'a' && c <= 'z' ? c - 'a' + 10
                                                        : 99;
            if (d >= base) return NAN;
            v = v * base + d;
        }
        return v;
    }
    const char *q = p + (*p == '+' || *p == '-');
    if (!strcmp(q, "Infinity")) return *p == '-' ? -INFINITY : INFINITY;
    bool digits = false;
    while (*q >= '0' && *q <= '9') q++, digits = true;
    if (*q == '.')
        for (q++; *q >= '0' && *q <= '9'; q++) digits = true;
    if (!digits) return NAN;
    if (*q == 'e' || *q == 'E') {
        q++;
        q += *q == '+' || *q == '-';
        if (!(*q >= '0' && *q <= '9')) return NAN;
        while (*q >= '0' && *q <= '9') q++;
    }
    return *q ? NAN : strtod(p, NULL);
}

/* A raw value reduced to a JavaScript primitive for ==. */
static int to_primitive_str(jcx *cx, uint32_t pos, jv v, jstr *out);

int jx_to_number(jcx *cx, uint32_t pos, jv v, double *out)
{
    jstr s;
    int rc;
    switch (v.k) {
    case JV_INT:
    case JV_FLOAT:
        *out = v.n;
        return 0;
    case JV_BOOL:
        *out = v.b;
        return 0;
    case JV_NULL:
        *out = 0;
        return 0;
    case JV_STR:
        *out = js_str_num(v.s);
        return 0;
    case JV_ARR:
        rc = to_primitive_str(cx, pos, v, &s);
        if (!rc) *out = js_str_num(s);
        return rc;
    case JV_RAW:
        return jx_raw_error(cx, pos);
    default:
        *out = NAN;
        return 0;
    }
}

typedef struct {
    enum { P_NUM, P_STR, P_BOOL, P_NULLISH, P_OBJ } t;
    double n;
    jstr s;
    const void *obj;
} jprim;

static jprim prim_of(jv v)
{
    switch (v.k) {
    case JV_INT:
    case JV_FLOAT:
        return (jprim){.t = P_NUM, .n = v.n};
    case JV_STR:
        return (jprim){.t = P_STR, .s = v.s};
    case JV_BOOL:
        return (jprim){.t = P_BOOL, .n = v.b};
    case JV_NULL:
    case JV_UNDEF:
        return (jprim){.t = P_NULLISH};
    case JV_ARR:
        return (jprim){.t = P_OBJ, .obj = v.a};
    case JV_FN:
        return (jprim){.t = P_OBJ, .obj = v.f};
    default:
        return (jprim){.t = P_OBJ, .obj = v.o};
    }
}

/* ToPrimitive of an object: an array joins its items, a Map is "[object Map]". */
static int to_primitive_str(jcx *cx, uint32_t pos, jv v, jstr *out)
{
    if (v.k == JV_FN) return jx_fail(cx, pos, "cannot compare a function with a value");
    dx_buf b;
    jx_buf_init(cx, &b);
    int rc = jx_put_raw(cx, pos, &b, v);
    jv s;
    if (!rc) rc = jx_buf_str(cx, pos, &b, &s);
    dx_buf_free(&b);
    if (!rc) *out = s.s;
    return rc;
}

static int to_primitive(jcx *cx, uint32_t pos, jv v, jprim *out)
{
    jstr s;
    int rc = to_primitive_str(cx, pos, v, &s);
    if (!rc) *out = (jprim){.t = P_STR, .s = s};
    return rc;
}

static bool prim_eq(jprim a, jprim b)
{
    if (a.t == P_NULLISH || b.t == P_NULLISH) return a.t == b.t;
    if (a.t == P_OBJ || b.t == P_OBJ) return a.t == b.t && a.obj == b.obj;
    if (a.t == P_STR && b.t == P_STR) return jstr_eq(a.s, b.s);
    double x = a.t == P_STR ? js_str_num(a.s) : a.n;
    double y = b.t == P_STR ? js_str_num(b.s) : b.n;
    return x == y;
}

int jx_loose_eq(jcx *cx, uint32_t pos, jv a, jv b, bool *eq)
{
    if (a.k == JV_RAW || b.k == JV_RAW) return jx_raw_error(cx, pos);
    jprim x = prim_of(a), y = prim_of(b);
    int rc = 0;
    /* an object against a primitive other than null/undefined converts */
    if (x.t == P_OBJ && y.t != P_OBJ && y.t != P_NULLISH) rc = to_primitive(cx, pos, a, &x);
    if (!rc && y.t == P_OBJ && x.t != P_OBJ && x.t != P_NULLISH) rc = to_primitive(cx, pos, b, &y);
    if (!rc) *eq = prim_eq(x, y);
    return rc;
}

bool jx_strict_eq(jv a, jv b)
{
    jprim x = prim_of(a), y = prim_of(b);
    if (x.t != y.t) return false;
    if (x.t == P_NULLISH) return a.k == b.k;
    if (x.t == P_OBJ) return x.obj == y.obj;
    if (x.t == P_STR) return jstr_eq(x.s, y.s);
    return x.n == y.n;
}

bool jx_same_value_zero(jv a, jv b)
{
    if (jv_is_num(a) && jv_is_num(b) && isnan(a.n) && isnan(b.n)) return true;
    return jx_strict_eq(a, b);
}

/* ---- ordering (compareRuntimeValues) -------------------------------------- */

static const char *type_name(jv v)
{
    switch (v.k) {
    case JV_UNDEF:
        return "undefined";
    case JV_NULL:
        return "none";
    case JV_BOOL:
        return "boolean";
    case JV_INT:
        return "integer";
    case JV_FLOAT:
        return "float";
    case JV_STR:
        return "string";
    case JV_ARR:
        return v.a->tuple ? "tuple" : "list";
    case JV_OBJ:
        return v.o->kw ? "keyword arguments" : "dict";
    case JV_NS:
        return "namespace";
    case JV_FN:
        return "function";
    default:
        return "raw undefined";
    }
}

const char *jx_type_name(jv v)
{
    return type_name(v);
}

static bool numeric_like(jv v)
{
    return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL;
}
static double numeric_value(jv v)
{
    return v.k == JV_BOOL ? (double)v.b : v.n;
}

static int lower_cmp(jstr a, jstr b)
{
    size_t i = 0, j = 0;
    while (i < a.n && j < b.n) {
        uint32_t x, y;
        size_t li = utf8_dec(a.p + i, a.n - i, &x), lj = utf8_dec(b.p + j, b.n - j, &y);
        x = x == 0x130 ? 'i' : jx_lower_cp(x);
        y = y == 0x130 ? 'i' : jx_lower_cp(y);
        if (x != y) {
            uint32_t ux = x >= 0x10000 ? 0xD800 + ((x - 0x10000) >> 10) : x;
            uint32_t uy = y >= 0x10000 ? 0xD800 + ((y - 0x10000) >> 10) : y;
            if (ux != uy) return ux < uy ? -1 : 1;
            return x < y ? -1 : 1;
        }
        i += li;
        j += lj;
    }
    return i < a.n ? 1 : j < b.n ? -1 : 0;
}

int jx_compare(jcx *cx, uint32_t pos, jv a, jv b, bool case_sensitive, int *res)
{
    if (a.k == JV_RAW || b.k == JV_RAW) return jx_raw_error(cx, pos);
    if (a.k == JV_NULL || b.k == JV_NULL || a.k == JV_UNDEF || b.k == JV_UNDEF) {
        if (a.k != b.k)
            return jx_fail(cx, pos, "cannot compare %s with %s", type_name(a), type_name(b));
        *res = 0;
        return 0;
    }
    if (numeric_like(a) && numeric_like(b)) {
        double x = numeric_value(a), y = numeric_value(b);
        *res = x < y ? -1 : x > y ? 1 : 0;
        return 0;
    }
    if (a.k != JV_STR || b.k != JV_STR)
        return jx_fail(cx, pos, "cannot compare %s with %s", type_name(a), type_name(b));
    *res = case_sensitive ? jx_utf16_cmp(a.s, b.s) : lower_cmp(a.s, b.s);
    return 0;
}

/* Which values compareRuntimeValues accepts together: one class each. */
static int sort_class(jv v)
{
    switch (v.k) {
    case JV_INT:
    case JV_FLOAT:
    case JV_BOOL:
        return 1;
    case JV_STR:
        return 2;
    case JV_NULL:
        return 3;
    case JV_UNDEF:
        return 4;
    default:
        return 0; /* never comparable */
    }
}

/* Any comparison sort of two or more values compares across every class
 * boundary at least once, so the reference's sort throws exactly when the
 * values are not all of one comparable class. */
int jx_check_sortable(jcx *cx, uint32_t pos, const jv *vals, size_t n)
{
    if (n < 2) return 0;
    int c0 = sort_class(vals[0]);
    for (size_t i = 0; i < n; i++) {
        if (vals[i].k == JV_RAW) return jx_raw_error(cx, pos);
        int c = sort_class(vals[i]);
        if (!c || c != c0) {
            jv other = i ? vals[0] : vals[1];
            return jx_fail(cx, pos, "cannot compare %s with %s", type_name(vals[i]),
                           type_name(other));
        }
    }
    return 0;
}

void jx_stable_sort(size_t *idx, size_t n, size_t *tmp, int (*cmp)(void *, size_t, size_t),
                    void *ctx)
{
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = cmp(ctx, idx[j], idx[i]) < 0 ? idx[j++] : idx[i++];
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
    }
}

/* ---- localeCompare (tojson sort_keys) ------------------------------------- */

/* ICU's root collation orders ASCII as: whitespace, punctuation and symbols
 * in this order, digits, then letters with case a tie-breaker (a < A < b);
 * other control characters are ignored.  Beyond ASCII this falls back to
 * code point order, after every letter. */
static const char k_punct[] = "_-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$";

static int primary(uint32_t c)
{
    if (c >= 0x09 && c <= 0x0D) return 1 + (int)(c - 0x09);
    if (c == ' ') return 6;
    const char *p = c > 0 && c < 0x80 ? strchr(k_punct, (int)c) : NULL;
    if (p) return 10 + (int)(p - k_punct);
    if (c >= '0' && c <= '9') return 100 + (int)(c - '0');
    if (c >= 'a' && c <= 'z') return 200 + (int)(c - 'a');
    if (c >= 'A' && c <= 'Z') return 200 + (int)(c - 'A');
    if (c < 0x80) return 0; /* ignorable */
    return 1000 + (int)c;
}

static int coll_level(jstr a, jstr b, bool tertiary)
{
    size_t i = 0, j = 0;
    for (;;) {
        uint32_t x = 0, y = 0;
        int px = 0, py = 0;
        while (i < a.n && !px) i += utf8_dec(a.p + i, a.n - i, &x), px = primary(x);
        while (j < b.n && !py) j += utf8_dec(b.p + j, b.n - j, &y), py = primary(y);
        if (!px || !py) return px ? 1 : py ? -1 : 0;
        int wx = tertiary ? (x >= 'A' && x <= 'Z') : px;
        int wy = tertiary ? (y >= 'A' && y <= 'Z') : py;
        if (wx != wy) return wx < wy ? -1 : 1;
    }
}

int jx_locale_compare(jstr a, jstr b)
{
    int r = coll_level(a, b, false);
    return r ? r : coll_level(a, b, true);
}
