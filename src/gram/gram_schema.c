/* gram_schema: JSON Schema (the subset in docs/structured.md) to EBNF.
 *
 * Each subschema becomes one rule; a $ref target becomes one rule the first
 * time it is met and is referred to by name after that, so recursive schemas
 * are recursive rules (a recursion without a base case is refused when the
 * grammar is compiled: its root derives no finite string).  The output is
 * compiled once here as a check, so a schema that passes gives a grammar
 * that compiles.
 *
 * The JSON written is compact and deterministic: no whitespace except one
 * optional space after ':' and ',' (so a model cannot loop on whitespace),
 * object members in the order of `properties` (required ones mandatory,
 * optional ones may be skipped, then any extra members when
 * additionalProperties allows them, under keys other than the declared ones),
 * numbers in JSON syntax with at most 16 integer digits, 16 fraction digits
 * and 2 exponent digits (jansson and doubles hold them all).  Enumerations and excluded keys are
 * written as a trie of rules, so a 10,000-entry enum costs a few parse stacks, not 10,000. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "gram/gram_priv.h"

#define SC_MAX_DEPTH  64         /* nested subschemas */
#define SC_MAX_ENUM   10000      /* enum entries */
#define SC_MAX_OUT    (4u << 20) /* EBNF bytes per schema */
#define SC_MAX_SCHEMA (4u << 20) /* schema JSON bytes */

typedef struct {
    char *ptr; /* "#/$defs/x" */
    uint32_t id;
} sc_ref;

typedef struct {
    json_t *root;
    int strict;
    const char *prefix;
    dx_buf *out, *warn;
    sc_ref *refs;
    uint32_t n_refs, cap_refs;
    uint32_t n_rules;
    int depth;
    char path[512]; /* JSON pointer of the subschema being compiled */
} sc;

/* ---- helpers ---------------------------------------------------------------- */

static int sc_nomem(void)
{
    return dx_errf(DX_ENOMEM, "json schema: out of memory");
}

static int sc_put(sc *c, dx_buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sc_put(sc *c, dx_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = dx_buf_vprintf(b, fmt, ap);
    va_end(ap);
    if (rc == DX_ETOOBIG)
        return dx_errf(DX_EINVAL, "json schema: the grammar for it is over %u bytes", SC_MAX_OUT);
    return rc ? sc_nomem() : 0;
}

/* An EBNF string literal for bytes s[0..n). */
static int put_lit(sc *c, dx_buf *b, const char *s, size_t n)
{
    int rc = sc_put(c, b, "\"");
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            rc = sc_put(c, b, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            rc = sc_put(c, b, "\\x%02X", ch);
        else
            rc = sc_put(c, b, "%c", ch);
    }
    return rc ? rc : sc_put(c, b, "\"");
}

static int sc_fail(sc *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sc_fail(sc *c, const char *fmt, ...)
{
    char where[sizeof c->path + 32];
    snprintf(where, sizeof where, "json schema: at '%s'", c->path[0] ? c->path : "/");
    va_list ap;
    va_start(ap, fmt);
    int rc = dx_verrp(DX_EINVAL, where, fmt, ap);
    va_end(ap);
    return rc;
}

/* An unsupported keyword: an error when strict, else a warning line. */
static int sc_unsupported(sc *c, const char *kw, const char *why)
{
    if (c->strict)
        return dx_errf(DX_EINVAL, "json schema: keyword '%s' at '%s' is not supported%s%s", kw,
                       c->path[0] ? c->path : "/", why ? ": " : "", why ? why : "");
    if (!c->warn) return 0;
    int rc = dx_buf_printf(c->warn, "json schema: keyword '%s' at '%s' ignored%s%s\n", kw,
                           c->path[0] ? c->path : "/", why ? ": " : "", why ? why : "");
    return rc == DX_ENOMEM ? sc_nomem() : 0;
}

/* Appends "/seg" (escaped as a JSON pointer) to the path; returns the old length. */
static size_t path_push(sc *c, const char *seg)
{
    size_t old = strlen(c->path), n = old;
    if (n + 2 < sizeof c->path) c->path[n++] = '/';
    for (const char *s = seg; *s && n + 3 < sizeof c->path; s++) {
        if (*s == '~' || *s == '/') {
            c->path[n++] = '~';
            c->path[n++] = *s == '~' ? '0' : '1';
        } else {
            c->path[n++] = *s;
        }
    }
    c->path[n] = 0;
    return old;
}

static size_t path_push_idx(sc *c, size_t i)
{
    char b[24];
    snprintf(b, sizeof b, "%zu", i);
    return path_push(c, b);
}

static void path_pop(sc *c, size_t old)
{
    c->path[old] = 0;
}

/* A fresh rule name "<prefix>sN" written to name[]. */
static void new_name(sc *c, char *name, size_t cap)
{
    snprintf(name, cap, "%ss%u", c->prefix, c->n_rules++);
}

/* ---- shared rules ------------------------------------------------------------- */

/* The rules every schema may use; '@' stands for the prefix. */
static const char k_common[] =
    "@sp ::= \" \"?\n"
    "@char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "@string ::= \"\\\"\" @char* \"\\\"\"\n"
    "@int ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "@number ::= @int (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?\n"
    "@bool ::= \"true\" | \"false\"\n"
    "@null ::= \"null\"\n"
    "@value ::= @object | @array | @string | @number | @bool | @null\n"
    "@object ::= \"{\" (@string \":\" @sp @value (\",\" @sp @string \":\" @sp @value)*)? \"}\"\n"
    "@array ::= \"[\" (@value (\",\" @sp @value)*)? \"]\"\n";

static int put_common(sc *c, dx_buf *b, const char *p)
{
    int rc = 0;
    for (const char *s = k_common; *s && !rc; s++)
        rc = *s == '@' ? sc_put(c, b, "%s", p) : sc_put(c, b, "%c", *s);
    return rc;
}

int gram_json_value_ebnf(const char *prefix, int object_only, dx_buf *out)
{
    sc c = {.prefix = prefix, .out = out};
    int rc = sc_put(&c, out, "%sroot ::= %s%s\n", prefix, prefix, object_only ? "object" : "value");
    return rc ? rc : put_common(&c, out, prefix);
}

/* ---- tries (enums, excluded keys) ------------------------------------------------ */

typedef struct {
    uint32_t first, next; /* first child, next sibling (0 = none) */
    uint8_t ch, end;
} tnode;

typedef struct {
    tnode *n;
    uint32_t len, cap;
} trie;

static int trie_add(trie *t, const char *s, size_t len)
{
    if (!t->len) {
        if (!(t->n = dx_calloc(64, sizeof *t->n))) return sc_nomem();
        t->cap = 64;
        t->len = 1;
    }
    uint32_t at = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t k = t->n[at].first;
        while (k && t->n[k].ch != (uint8_t)s[i]) k = t->n[k].next;
        if (!k) {
            if (t->len == t->cap) {
                tnode *q = dx_realloc(t->n, (size_t)t->cap * 2 * sizeof *q);
                if (!q) return sc_nomem();
                t->n = q;
                t->cap *= 2;
            }
            k = t->len++;
            t->n[k] = (tnode){.ch = (uint8_t)s[i], .next = t->n[at].first};
            t->n[at].first = k;
        }
        at = k;
    }
    t->n[at].end = 1;
    return 0;
}

/* Rule name of trie node k: "<base>-k". */
static int put_tname(sc *c, dx_buf *b, const char *base, uint32_t k)
{
    return sc_put(c, b, " %s-%u", base, k);
}

/* Writes "<base>-k ::= ..." for the root and every node that ends a string
 * and goes on, or branches (a chain of single children is one literal): the
 * language of <base>-0 is exactly the strings added. */
static int trie_enum_rules(sc *c, const trie *t, const char *base)
{
    int rc = 0;
    dx_buf lit;
    dx_buf_init(&lit, SC_MAX_OUT);
    for (uint32_t k = 0; k < t->len && !rc; k++) {
        const tnode *n = &t->n[k];
        if (k && (!n->first || (!n->end && !t->n[n->first].next))) continue;
        rc = sc_put(c, c->out, "%s-%u ::=", base, k);
        int first = 1;
        if (!rc && n->end) rc = sc_put(c, c->out, " \"\""), first = 0;
        for (uint32_t ch = n->first; ch && !rc; ch = t->n[ch].next) {
            uint32_t at = ch;
            dx_buf_reset(&lit);
            rc = sc_put(c, &lit, "%c", t->n[at].ch);
            while (!rc && !t->n[at].end && t->n[at].first && !t->n[t->n[at].first].next) {
                at = t->n[at].first;
                rc = sc_put(c, &lit, "%c", t->n[at].ch);
            }
            if (!rc) rc = sc_put(c, c->out, "%s ", first ? "" : " |");
            first = 0;
            if (!rc) rc = put_lit(c, c->out, lit.data, lit.len);
            if (!rc && t->n[at].first) rc = put_tname(c, c->out, base, at);
        }
        if (!rc) rc = sc_put(c, c->out, "\n");
    }
    dx_buf_free(&lit);
    return rc;
}

/* The content and closing quote of a JSON string that is none of the trie's
 * strings (spelled without escapes). */
static int trie_notkey_rules(sc *c, const trie *t, const char *base)
{
    const char *p = c->prefix;
    int rc = 0;
    for (uint32_t k = 0; k < t->len && !rc; k++) {
        const tnode *n = &t->n[k];
        rc = sc_put(c, c->out, "%s-%u ::=", base, k);
        if (!rc && !n->end) rc = sc_put(c, c->out, " \"\\\"\" |");
        for (uint32_t ch = n->first; ch && !rc; ch = t->n[ch].next) {
            char l = (char)t->n[ch].ch;
            rc = sc_put(c, c->out, " ");
            if (!rc) rc = put_lit(c, c->out, &l, 1);
            if (!rc) rc = put_tname(c, c->out, base, ch);
            if (!rc) rc = sc_put(c, c->out, " |");
        }
        /* any other character, then anything */
        if (!rc) rc = sc_put(c, c->out, " ([^\"\\\\\\x00-\\x1F");
        for (uint32_t ch = n->first; ch && !rc; ch = t->n[ch].next) {
            unsigned char l = t->n[ch].ch;
            if (l == ']' || l == '-' || l == '^' || l == '\\')
                rc = sc_put(c, c->out, "\\%c", l);
            else
                rc = sc_put(c, c->out, "%c", l);
        }
        if (!rc)
            rc = sc_put(c, c->out,
                        "] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})) %schar* \"\\\"\"\n",
                        p);
    }
    return rc;
}

/* ---- subschemas ------------------------------------------------------------------ */

static int gen(sc *c, json_t *s, char *name, size_t cap);

/* Generates subschema s at path segment seg into a rule, its name to name[]. */
static int gen_at(sc *c, json_t *s, const char *seg, char *name, size_t cap)
{
    size_t old = path_push(c, seg);
    int rc = gen(c, s, name, cap);
    path_pop(c, old);
    return rc;
}

static int gen_at_idx(sc *c, json_t *s, size_t i, char *name, size_t cap)
{
    size_t old = path_push_idx(c, i);
    int rc = gen(c, s, name, cap);
    path_pop(c, old);
    return rc;
}

/* Strings from json_dumps belong to jansson's allocator (the node sets it). */
static void json_str_free(char *s)
{
    json_malloc_t a;
    json_free_t f;
    json_get_alloc_funcs(&a, &f);
    f(s);
}

static int json_lit(sc *c, dx_buf *b, const json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
    if (!s) return sc_nomem();
    int rc = put_lit(c, b, s, strlen(s));
    json_str_free(s);
    return rc;
}

static int gen_enum(sc *c, json_t *vals, dx_buf *body)
{
    if (!json_is_array(vals)) return sc_fail(c, "'enum' must be an array");
    size_t n = json_array_size(vals);
    if (n == 0) return sc_fail(c, "'enum' is empty (no value allowed)");
    if (n > SC_MAX_ENUM) return sc_fail(c, "'enum' has %zu entries, over %u", n, SC_MAX_ENUM);
    trie t = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char *s =
            json_dumps(json_array_get(vals, i), JSON_COMPACT | JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
        if (!s) rc = sc_nomem();
        if (!rc) rc = trie_add(&t, s, strlen(s));
        json_str_free(s);
    }
    char base[64];
    new_name(c, base, sizeof base);
    if (!rc) rc = trie_enum_rules(c, &t, base);
    if (!rc) rc = sc_put(c, body, "%s-0", base);
    dx_free(t.n);
    return rc;
}

static int get_count(sc *c, json_t *s, const char *kw, uint64_t def, uint64_t *out)
{
    json_t *v = json_object_get(s, kw);
    *out = def;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return sc_fail(c, "'%s' must be a non-negative integer", kw);
    *out = (uint64_t)json_integer_value(v);
    if (*out > GRAM_MAX_REPEAT) {
        if (def == UINT64_MAX) { /* an upper bound too large to expand: not enforced */
            *out = UINT64_MAX;
            return sc_unsupported(c, kw, "values over 10000 are not enforced");
        }
        return sc_fail(c, "'%s' %llu is over the limit of %u", kw, (unsigned long long)*out,
                       GRAM_MAX_REPEAT);
    }
    return 0;
}

/* "x{min,max}" with x a rule name (max UINT64_MAX: no bound). */
static int put_repeat(sc *c, dx_buf *b, uint64_t min, uint64_t max)
{
    if (max == UINT64_MAX) return sc_put(c, b, "{%llu,}", (unsigned long long)min);
    return sc_put(c, b, "{%llu,%llu}", (unsigned long long)min, (unsigned long long)max);
}

static int gen_string(sc *c, json_t *s, dx_buf *body)
{
    const char *p = c->prefix;
    uint64_t min, max;
    int rc = get_count(c, s, "minLength", 0, &min);
    if (!rc) rc = get_count(c, s, "maxLength", UINT64_MAX, &max);
    if (rc) return rc;
    if (min > max) return sc_fail(c, "minLength above maxLength");
    json_t *pat = json_object_get(s, "pattern");
    if (pat && !json_is_string(pat)) return sc_fail(c, "'pattern' must be a string");
    if (pat && (min || max != UINT64_MAX)) {
        rc = sc_unsupported(c, "pattern", "together with minLength or maxLength");
        if (rc) return rc;
    } else if (pat) {
        size_t at = body->len;
        rc = gram_regex_to_ebnf(json_string_value(pat), json_string_length(pat), p, body);
        if (rc == DX_EINVAL) {
            body->len = at;
            if (body->data) body->data[at] = 0;
            char why[200];
            snprintf(why, sizeof why, "%s", dx_errmsg());
            return sc_unsupported(c, "pattern", why) ? DX_EINVAL : sc_put(c, body, "%sstring", p);
        }
        return rc;
    }
    if (!min && max == UINT64_MAX) return sc_put(c, body, "%sstring", p);
    rc = sc_put(c, body, "\"\\\"\" %schar", p);
    if (!rc) rc = put_repeat(c, body, min, max);
    return rc ? rc : sc_put(c, body, " \"\\\"\"");
}

static int gen_array(sc *c, json_t *s, dx_buf *body)
{
    const char *p = c->prefix;
    uint64_t min, max;
    int rc = get_count(c, s, "minItems", 0, &min);
    if (!rc) rc = get_count(c, s, "maxItems", UINT64_MAX, &max);
    if (rc) return rc;
    if (min > max) return sc_fail(c, "minItems above maxItems");
    char item[64];
    json_t *it = json_object_get(s, "items");
    if (it && !json_is_object(it) && !json_is_boolean(it))
        return sc_unsupported(c, "items", "only a single schema is supported (no tuples)");
    if (it && json_is_false(it)) max = 0;
    if (it && !json_is_false(it)) {
        if ((rc = gen_at(c, it, "items", item, sizeof item))) return rc;
    } else {
        snprintf(item, sizeof item, "%svalue", p);
    }
    if (max == 0) return sc_put(c, body, "\"[\" \"]\"");
    if (min == 0) {
        rc = sc_put(c, body, "\"[\" (%s (\",\" %ssp %s)", item, p, item);
        if (!rc) rc = put_repeat(c, body, 0, max == UINT64_MAX ? max : max - 1);
        return rc ? rc : sc_put(c, body, ")? \"]\"");
    }
    rc = sc_put(c, body, "\"[\" %s (\",\" %ssp %s)", item, p, item);
    if (!rc) rc = put_repeat(c, body, min - 1, max == UINT64_MAX ? max : max - 1);
    return rc ? rc : sc_put(c, body, " \"]\"");
}

/* Keys of declared properties that the extra-key grammar can exclude (no
 * character needing an escape, ASCII). */
static int plain_key(const char *k)
{
    for (const unsigned char *s = (const unsigned char *)k; *s; s++)
        if (*s < 0x20 || *s >= 0x7f || *s == '"' || *s == '\\') return 0;
    return 1;
}

typedef struct {
    const char *key;
    char rule[64];
    int required;
} sc_prop;

static int gen_object(sc *c, json_t *s, dx_buf *body)
{
    const char *p = c->prefix;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
           *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return sc_fail(c, "'properties' must be an object");
    if (req && !json_is_array(req)) return sc_fail(c, "'required' must be an array");
    if (add && !json_is_object(add) && !json_is_boolean(add))
        return sc_fail(c, "'additionalProperties' must be a schema or a boolean");
    size_t n_props = props ? json_object_size(props) : 0, n_req = req ? json_array_size(req) : 0;
    if (!n_props && !n_req && (!add || json_is_true(add))) return sc_put(c, body, "%sobject", p);
    sc_prop *pr = dx_calloc(n_props + n_req + 1, sizeof *pr);
    if (!pr) return sc_nomem();
    size_t n = 0;
    int rc = 0;
    const char *key;
    json_t *val;
    size_t old = props ? path_push(c, "properties") : 0;
    json_object_foreach(props, key, val)
    {
        if (rc) break;
        pr[n].key = key;
        rc = gen_at(c, val, key, pr[n].rule, sizeof pr[n].rule);
        n++;
    }
    if (props) path_pop(c, old);
    for (size_t i = 0; i < n_req && !rc; i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) {
            rc = sc_fail(c, "'required' entries must be strings");
            break;
        }
        size_t k = 0;
        while (k < n && strcmp(pr[k].key, json_string_value(r))) k++;
        if (k == n) { /* required but not described: any value */
            pr[n].key = json_string_value(r);
            snprintf(pr[n].rule, sizeof pr[n].rule, "%svalue", p);
            n++;
        }
        pr[k].required = 1;
    }
    char extra[160] = "", base[64];
    new_name(c, base, sizeof base);
    if (!rc && (!add || !json_is_false(add))) {
        char val_rule[64];
        snprintf(val_rule, sizeof val_rule, "%svalue", p);
        if (add && json_is_object(add))
            rc = gen_at(c, add, "additionalProperties", val_rule, sizeof val_rule);
        trie t = {0};
        for (size_t i = 0; i < n && !rc; i++)
            if (plain_key(pr[i].key)) rc = trie_add(&t, pr[i].key, strlen(pr[i].key));
        char nk[160];
        snprintf(nk, sizeof nk, "%s-k", base);
        if (!rc && t.len) rc = trie_notkey_rules(c, &t, nk);
        dx_free(t.n);
        snprintf(extra, sizeof extra, "%s-x", base);
        if (!rc && t.len)
            rc = sc_put(c, c->out, "%s ::= \"\\\"\" %s-0 \":\" %ssp %s\n", extra, nk, p, val_rule);
        else if (!rc)
            rc = sc_put(c, c->out, "%s ::= %sstring \":\" %ssp %s\n", extra, p, p, val_rule);
    }
    /* first-i: members from i on, none written yet; rest-i: some written */
    for (size_t i = n + 1; i-- > 0 && !rc;) {
        if (i == n) {
            if (extra[0])
                rc = sc_put(c, c->out,
                            "%s-f%zu ::= (%s (\",\" %ssp %s)*)?\n%s-r%zu ::= (\",\" %ssp %s)*\n",
                            base, i, extra, p, extra, base, i, p, extra);
            else
                rc = sc_put(c, c->out, "%s-f%zu ::= \"\"\n%s-r%zu ::= \"\"\n", base, i, base, i);
            continue;
        }
        dx_buf kv;
        dx_buf_init(&kv, SC_MAX_OUT);
        json_t *js = json_string(pr[i].key);
        char *ks = js ? json_dumps(js, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
        json_decref(js);
        if (!ks) rc = sc_nomem();
        if (!rc) rc = put_lit(c, &kv, ks, strlen(ks));
        if (ks) json_str_free(ks);
        if (!rc) rc = sc_put(c, &kv, " \":\" %ssp %s", p, pr[i].rule);
        if (!rc) rc = sc_put(c, c->out, "%s-f%zu ::= %s %s-r%zu", base, i, kv.data, base, i + 1);
        if (!rc && !pr[i].required) rc = sc_put(c, c->out, " | %s-f%zu", base, i + 1);
        if (!rc) rc = sc_put(c, c->out, "\n");
        if (!rc && pr[i].required)
            rc = sc_put(c, c->out, "%s-r%zu ::= \",\" %ssp %s %s-r%zu\n", base, i, p, kv.data, base,
                        i + 1);
        else if (!rc)
            rc = sc_put(c, c->out, "%s-r%zu ::= \",\" %ssp %s %s-r%zu | %s-r%zu\n", base, i, p,
                        kv.data, base, i + 1, base, i + 1);
        dx_buf_free(&kv);
    }
    dx_free(pr);
    return rc ? rc : sc_put(c, body, "\"{\" %s-f0 \"}\"", base);
}

static int gen_type(sc *c, json_t *s, const char *t, dx_buf *body)
{
    const char *p = c->prefix;
    if (!strcmp(t, "string")) return gen_string(c, s, body);
    if (!strcmp(t, "integer")) {
        json_t *mn = json_object_get(s, "minimum");
        if (mn && json_is_number(mn) && json_number_value(mn) == 0) /* non-negative: no sign */
            return sc_put(c, body, "(\"0\" | [1-9] [0-9]{0,15})");
        return sc_put(c, body, "%sint", p);
    }
    if (!strcmp(t, "number")) return sc_put(c, body, "%snumber", p);
    if (!strcmp(t, "boolean")) return sc_put(c, body, "%sbool", p);
    if (!strcmp(t, "null")) return sc_put(c, body, "%snull", p);
    if (!strcmp(t, "object")) return gen_object(c, s, body);
    if (!strcmp(t, "array")) return gen_array(c, s, body);
    return sc_fail(c, "unknown type '%s' (string, number, integer, boolean, null, object, array)",
                   t);
}

/* Keywords: what each one is to the compiler. */
enum { KW_USED, KW_NOTE, KW_BOUND };
static const struct {
    const char *name;
    int kind;
} k_kw[] = {
    {"type", KW_USED},
    {"properties", KW_USED},
    {"required", KW_USED},
    {"additionalProperties", KW_USED},
    {"enum", KW_USED},
    {"const", KW_USED},
    {"items", KW_USED},
    {"minItems", KW_USED},
    {"maxItems", KW_USED},
    {"anyOf", KW_USED},
    {"oneOf", KW_USED},
    {"allOf", KW_USED},
    {"$ref", KW_USED},
    {"$defs", KW_USED},
    {"definitions", KW_USED},
    {"minLength", KW_USED},
    {"maxLength", KW_USED},
    {"pattern", KW_USED},
    {"title", KW_NOTE},
    {"description", KW_NOTE},
    {"default", KW_NOTE},
    {"examples", KW_NOTE},
    {"$schema", KW_NOTE},
    {"$id", KW_NOTE},
    {"$comment", KW_NOTE},
    {"format", KW_NOTE},
    {"deprecated", KW_NOTE},
    {"readOnly", KW_NOTE},
    {"writeOnly", KW_NOTE},
    {"minimum", KW_BOUND},
    {"maximum", KW_BOUND},
    {"exclusiveMinimum", KW_BOUND},
    {"exclusiveMaximum", KW_BOUND},
    {"multipleOf", KW_BOUND},
};

static int check_keywords(sc *c, json_t *s)
{
    const char *key;
    json_t *val;
    json_object_foreach(s, key, val)
    {
        size_t i = 0;
        while (i < DX_ARRAY_LEN(k_kw) && strcmp(k_kw[i].name, key)) i++;
        int rc = 0;
        if (i == DX_ARRAY_LEN(k_kw))
            rc = sc_unsupported(c, key, NULL);
        else if (k_kw[i].kind == KW_BOUND &&
                 !(!strcmp(key, "minimum") && json_is_number(val) && json_number_value(val) == 0 &&
                   json_is_string(json_object_get(s, "type")) &&
                   !strcmp(json_string_value(json_object_get(s, "type")), "integer")))
            rc = sc_unsupported(c, key, "numeric bounds are not enforced");
        if (rc) return rc;
    }
    return 0;
}

/* Resolves a local JSON pointer "#/a/b" in the root schema. */
static json_t *resolve(sc *c, const char *ref)
{
    if (ref[0] != '#') return NULL;
    json_t *at = c->root;
    const char *s = ref + 1;
    while (*s == '/' && at) {
        s++;
        char seg[256];
        size_t n = 0;
        for (; *s && *s != '/' && n + 1 < sizeof seg; s++) {
            if (*s == '~' && (s[1] == '0' || s[1] == '1')) {
                seg[n++] = s[1] == '0' ? '~' : '/';
                s++;
            } else {
                seg[n++] = *s;
            }
        }
        seg[n] = 0;
        if (json_is_object(at)) {
            at = json_object_get(at, seg);
        } else if (json_is_array(at)) {
            char *e;
            unsigned long i = strtoul(seg, &e, 10);
            at = *e || !n ? NULL : json_array_get(at, i);
        } else {
            at = NULL;
        }
    }
    return *s ? NULL : at;
}

static int gen_ref(sc *c, const char *ref, char *name, size_t cap)
{
    for (uint32_t i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ptr, ref)) {
            snprintf(name, cap, "%sref%u", c->prefix, c->refs[i].id);
            return 0;
        }
    json_t *t = resolve(c, ref);
    if (!t)
        return sc_fail(c, "$ref '%s' does not resolve (only local refs '#/...' are supported)",
                       ref);
    if (c->n_refs == c->cap_refs) {
        uint32_t nc = c->cap_refs ? c->cap_refs * 2 : 8;
        sc_ref *q = dx_realloc(c->refs, nc * sizeof *q);
        if (!q) return sc_nomem();
        c->refs = q;
        c->cap_refs = nc;
    }
    uint32_t id = c->n_refs;
    if (!(c->refs[id].ptr = dx_strdup(ref))) return sc_nomem();
    c->refs[id].id = id;
    c->n_refs++;
    snprintf(name, cap, "%sref%u", c->prefix, id);
    /* the target is compiled under its own path, into the ref's rule */
    char saved[sizeof c->path], inner[64];
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ref + 1);
    int rc = gen(c, t, inner, sizeof inner);
    memcpy(c->path, saved, sizeof saved);
    return rc ? rc : sc_put(c, c->out, "%s ::= %s\n", name, inner);
}

static int gen_alts(sc *c, json_t *s, const char *kw, dx_buf *body)
{
    json_t *a = json_object_get(s, kw);
    if (!json_is_array(a) || !json_array_size(a))
        return sc_fail(c, "'%s' must be a non-empty array of schemas", kw);
    size_t old = path_push(c, kw);
    int rc = sc_put(c, body, "(");
    for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
        char r[64];
        rc = gen_at_idx(c, json_array_get(a, i), i, r, sizeof r);
        if (!rc) rc = sc_put(c, body, "%s%s", i ? " | " : "", r);
    }
    path_pop(c, old);
    return rc ? rc : sc_put(c, body, ")");
}

static int gen_body(sc *c, json_t *s, dx_buf *body)
{
    int rc;
    json_t *v;
    if ((v = json_object_get(s, "$ref"))) {
        if (!json_is_string(v)) return sc_fail(c, "'$ref' must be a string");
        char r[64];
        if ((rc = gen_ref(c, json_string_value(v), r, sizeof r))) return rc;
        return sc_put(c, body, "%s", r);
    }
    if ((v = json_object_get(s, "const"))) return json_lit(c, body, v);
    if ((v = json_object_get(s, "enum"))) return gen_enum(c, v, body);
    if (json_object_get(s, "anyOf")) return gen_alts(c, s, "anyOf", body);
    if (json_object_get(s, "oneOf")) return gen_alts(c, s, "oneOf", body); /* as anyOf */
    if ((v = json_object_get(s, "allOf"))) {
        if (!json_is_array(v) || json_array_size(v) != 1) {
            rc = sc_unsupported(c, "allOf", "only a single schema is supported");
            return rc ? rc : sc_put(c, body, "%svalue", c->prefix);
        }
        return gen_alts(c, s, "allOf", body);
    }
    json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) return gen_type(c, s, json_string_value(t), body);
    if (json_is_array(t)) {
        if (!json_array_size(t)) return sc_fail(c, "'type' is an empty array");
        rc = sc_put(c, body, "(");
        for (size_t i = 0; i < json_array_size(t) && !rc; i++) {
            json_t *e = json_array_get(t, i);
            if (!json_is_string(e)) return sc_fail(c, "'type' entries must be strings");
            if (i) rc = sc_put(c, body, " | ");
            if (!rc) rc = gen_type(c, s, json_string_value(e), body);
        }
        return rc ? rc : sc_put(c, body, ")");
    }
    if (t) return sc_fail(c, "'type' must be a string or an array of strings");
    if (json_object_get(s, "properties") || json_object_get(s, "required") ||
        json_object_get(s, "additionalProperties"))
        return gen_object(c, s, body);
    if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
        json_object_get(s, "maxItems"))
        return gen_array(c, s, body);
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
        json_object_get(s, "pattern"))
        return gen_string(c, s, body);
    return sc_put(c, body, "%svalue", c->prefix);
}

static int gen(sc *c, json_t *s, char *name, size_t cap)
{
    if (json_is_true(s)) {
        snprintf(name, cap, "%svalue", c->prefix);
        return 0;
    }
    if (json_is_false(s)) return sc_fail(c, "schema 'false' allows no value");
    if (!json_is_object(s)) return sc_fail(c, "a schema must be an object or a boolean");
    if (++c->depth > SC_MAX_DEPTH) return sc_fail(c, "schemas nested deeper than %d", SC_MAX_DEPTH);
    int rc = check_keywords(c, s);
    dx_buf body;
    dx_buf_init(&body, SC_MAX_OUT);
    if (!rc) rc = gen_body(c, s, &body);
    new_name(c, name, cap);
    if (!rc) rc = sc_put(c, c->out, "%s ::= %s\n", name, body.data ? body.data : "\"\"");
    dx_buf_free(&body);
    c->depth--;
    return rc;
}

/* Compiles the schema's grammar on its own to refuse what would not compile
 * (a recursion without base case, a bound over the limits). */
static int check_compiles(const char *prefix, const dx_buf *rules)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    int rc = dx_buf_printf(&b, "root ::= %sroot\n", prefix);
    if (!rc) rc = dx_buf_append(&b, rules->data, rules->len);
    if (rc) {
        dx_buf_free(&b);
        return dx_errf(DX_ENOMEM, "json schema: out of memory");
    }
    gram *g = NULL;
    rc = gram_compile_ebnf(b.data, b.len, &g);
    gram_destroy(g);
    dx_buf_free(&b);
    return rc ? dx_err_wrap(rc, "json schema: its grammar does not compile") : 0;
}

int gram_schema_to_ebnf(const char *schema_json, size_t len, int strict, const char *prefix,
                        dx_buf *out, dx_buf *warnings)
{
    if (len > SC_MAX_SCHEMA)
        return dx_errf(DX_EINVAL, "json schema: %zu bytes, over the limit of %u", len,
                       SC_MAX_SCHEMA);
    if (strlen(prefix) > 32)
        return dx_errf(DX_EINVAL, "json schema: rule prefix longer than 32 characters");
    for (const char *q = prefix; *q; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
              *q == '-' || *q == '_'))
            return dx_errf(DX_EINVAL,
                           "json schema: rule prefix '%s' has a character other than "
                           "letters, digits, '-' and '_'",
                           prefix);
    json_error_t je;
    size_t failed = dx_alloc_failed_count();
    json_t *root = json_loadb(schema_json, len, JSON_DECODE_ANY, &je);
    if (!root && dx_alloc_failed_count() != failed)
        return dx_errf(DX_ENOMEM, "json schema: out of memory parsing it");
    if (!root)
        return dx_errf(DX_EINVAL, "json schema: not JSON (line %d col %d: %s)", je.line, je.column,
                       je.text);
    dx_buf rules;
    dx_buf_init(&rules, SC_MAX_OUT);
    sc c = {.root = root, .strict = strict, .prefix = prefix, .out = &rules, .warn = warnings};
    char top[64];
    int rc = gen(&c, root, top, sizeof top);
    if (!rc) rc = sc_put(&c, &rules, "%sroot ::= %s\n", prefix, top);
    if (!rc) rc = put_common(&c, &rules, prefix);
    if (!rc) rc = check_compiles(prefix, &rules);
    if (!rc && dx_buf_append(out, rules.data, rules.len))
        rc = dx_errf(DX_ENOMEM, "json schema: out of memory");
    for (uint32_t i = 0; i < c.n_refs; i++) dx_free(c.refs[i].ptr);
    dx_free(c.refs);
    dx_buf_free(&rules);
    json_decref(root);
    return rc;
}
