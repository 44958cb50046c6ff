/* jinja_priv: what the parts of the Jinja interpreter share.
 *
 *   jinja_lex.c      preprocessing (trim_blocks, lstrip_blocks) and tokens
 *   jinja_parse.c    tokens -> syntax tree; jinja_parse/jinja_free
 *   jinja_val.c      the arena, values, JavaScript-exact text and JSON forms,
 *                    equality and ordering, Unicode helpers
 *   jinja_eval.c     statements and expressions; jinja_render
 *   jinja_builtin.c  filters, tests, string and dict methods, globals
 *
 * The files call each other in layers, each only those below it:
 *
 *   jinja_parse.c               jinja_eval.c
 *   jinja_lex.c                 jinja_builtin.c
 *                  jinja_val.c
 *
 * so a builtin never evaluates a node: jinja_eval.c evaluates a filter
 * call's arguments before handing them over (selectattr and rejectattr get
 * their string literals as written).  scripts/check_layers.sh holds the files
 * of a folder to no circle of calls.
 *
 * The reference is @huggingface/jinja 0.5.11 (lexer.ts, parser.ts,
 * runtime.ts): where a rule below looks odd, it is that implementation's
 * rule, kept so that output is byte-identical.  Its values are JavaScript
 * values, so numbers here are doubles (an "integer" is a double flagged as
 * such) and text conversions follow JavaScript's Number and JSON rules.
 *
 * Memory: a template's tree and every value of a render live in arenas
 * (jarena) freed in one go, so values can share and even form cycles
 * (a namespace holding itself) without reference counting, and no error path
 * can leak. */
#ifndef JINJA_PRIV_H
#define JINJA_PRIV_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "jinja/jinja.h"

/* ---- arena ---------------------------------------------------------------- */

typedef struct ja_chunk ja_chunk;
typedef struct {
    ja_chunk *head;
    size_t used; /* bytes handed out so far */
    size_t max;  /* 0: no bound */
} jarena;

/* n bytes, 16-aligned, zeroed; NULL after setting the error (DX_ENOMEM, or
 * DX_ETOOBIG past max). */
void *ja_alloc(jarena *a, size_t n);
void ja_free_all(jarena *a);

/* ---- text ----------------------------------------------------------------- */

typedef struct {
    const char *p;
    size_t n;
} jstr;

#define JSTR(lit) ((jstr){lit, sizeof(lit) - 1})
bool jstr_eq(jstr a, jstr b);
bool jstr_is(jstr a, const char *z);

/* Sets "jinja: line L, column C: <message>" (L and C 1-based, columns in
 * characters) for byte pos of src, and returns code: the one form of every
 * message about a place in a template. */
int jinja_verr_at(int code, const char *src, size_t len, size_t pos, const char *fmt, va_list ap);
int jinja_err_at(int code, const char *src, size_t len, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---- tokens (lexer.ts) ---------------------------------------------------- */

enum jtok_type {
    JT_TEXT,
    JT_NUM,
    JT_STR,
    JT_IDENT,
    JT_EQUALS,
    JT_LPAREN,
    JT_RPAREN,
    JT_OPEN_STMT,
    JT_CLOSE_STMT,
    JT_OPEN_EXPR,
    JT_CLOSE_EXPR,
    JT_LBRACKET,
    JT_RBRACKET,
    JT_LBRACE,
    JT_RBRACE,
    JT_COMMA,
    JT_DOT,
    JT_COLON,
    JT_PIPE,
    JT_ADD,   /* + - ~ */
    JT_MUL,   /* * / // % */
    JT_POW,   /* ** */
    JT_CMP,   /* < > <= >= == != */
    JT_UNARY, /* a lone + or - where an operand starts */
    JT_COMMENT,
};

typedef struct {
    uint8_t type;
    uint32_t pos; /* byte offset in the original source */
    jstr s;       /* the text: unescaped for strings, raw otherwise */
} jtok;

typedef struct {
    jtok *v;
    size_t n;
} jtoks;

/* Preprocesses and tokenises src into tokens allocated in a. */
int jl_tokenize(jarena *a, const char *src, size_t len, jtoks *out);

/* ---- syntax tree (ast.ts) ------------------------------------------------- */

enum jnode_kind {
    JN_TEXT,         /* str */
    JN_COMMENT,      /* - */
    JN_INT,          /* num */
    JN_FLOAT,        /* num */
    JN_STR,          /* str */
    JN_IDENT,        /* str: the name */
    JN_ARRAY,        /* l1: elements */
    JN_TUPLE,        /* l1: elements */
    JN_OBJECT,       /* l1: key, value, key, value... */
    JN_MEMBER,       /* a: object, b: property, op: computed ([...]) */
    JN_SLICE,        /* a, b, c: start, stop, step (each may be NULL) */
    JN_CALL,         /* a: callee, l1: arguments */
    JN_KWARG,        /* str: key, a: value */
    JN_SPREAD,       /* a: *expr */
    JN_KWSPREAD,     /* a: **expr */
    JN_BINARY,       /* op, a, b */
    JN_UNARY,        /* op, a */
    JN_FILTER,       /* a: operand, b: the filter (identifier or call) */
    JN_TEST,         /* a: operand, str: test name, op: negated */
    JN_SELECT,       /* a: value, b: condition (`a if b` without else) */
    JN_TERNARY,      /* a: condition, b: if true, c: if false */
    JN_IF,           /* a: test, l1: body, l2: else (an elif is a nested JN_IF) */
    JN_FOR,          /* a: loop variable(s), b: iterable, l1: body, l2: else */
    JN_SET,          /* a: target, b: value or NULL (block set), l1: block body */
    JN_MACRO,        /* str: name, l1: parameters, l2: body, op: JN_USES_* */
    JN_CALL_BLOCK,   /* a: the call, l1: caller parameters, l2: body, op: JN_USES_* */
    JN_FILTER_BLOCK, /* b: the filter, l1: body */
    JN_BREAK,
    JN_CONTINUE,
};

enum jop {
    JOP_NONE,
    JOP_AND,
    JOP_OR,
    JOP_NOT,
    JOP_EQ,
    JOP_NE,
    JOP_LT,
    JOP_GT,
    JOP_LE,
    JOP_GE,
    JOP_IN,
    JOP_NOT_IN,
    JOP_ADD,
    JOP_SUB,
    JOP_CONCAT,
    JOP_MUL,
    JOP_DIV,
    JOP_FLOORDIV,
    JOP_MOD,
    JOP_POW,
};

/* A macro or call block whose body reads `kwargs` / `varargs` collects the
 * extra arguments there (runtime.ts findAccessedSpecialMacroArguments). */
#define JN_USES_KWARGS  1
#define JN_USES_VARARGS 2

typedef struct jnode jnode;
typedef struct {
    jnode **v;
    uint32_t n;
} jlist;

struct jnode {
    uint8_t kind;
    uint8_t op;
    uint32_t pos; /* byte offset in the source, for messages */
    double num;
    jstr str;
    jnode *a, *b, *c;
    jlist l1, l2;
};

struct jinja_tmpl {
    jarena ar; /* the tree, its strings and the source copy */
    const char *src;
    size_t len;
    jlist body;
};

/* ---- values (runtime.ts RuntimeValue) ------------------------------------ */

enum jkind {
    JV_UNDEF, /* UndefinedValue */
    JV_RAW,   /* JavaScript's own undefined: what first/last of [] yield */
    JV_NULL,
    JV_BOOL,
    JV_INT, /* a double flagged integer, as IntegerValue */
    JV_FLOAT,
    JV_STR,
    JV_ARR, /* ArrayValue, or TupleValue when tuple */
    JV_OBJ, /* ObjectValue, or KeywordArgumentsValue when kw */
    JV_NS,  /* NamespaceValue */
    JV_FN,
};

typedef struct jarr jarr;
typedef struct jobj jobj;
typedef struct jfn jfn;

typedef struct {
    uint8_t k;
    union {
        double n;
        bool b;
        jstr s;
        jarr *a;
        jobj *o;
        jfn *f;
    };
} jv;

struct jarr {
    size_t n, cap; /* cap: room in v, for jx_arr_push */
    bool tuple;
    jv *v;
};

/* Insertion-ordered map (JavaScript Map).  Small ones are searched
 * linearly; past JO_LINEAR keys a hash index (open addressing, slot = key
 * index + 1) keeps lookups constant, so a huge dict from the variables
 * cannot make a render quadratic. */
#define JO_LINEAR 16
struct jobj {
    size_t n, cap;
    bool kw;
    jstr *keys;
    jv *vals;
    uint32_t *slots; /* NULL until n > JO_LINEAR */
    size_t nslots;   /* a power of two, at least 2 * cap */
};

enum jfn_kind { JF_NATIVE, JF_MACRO, JF_CALLER };
typedef struct jenv jenv;
struct jfn {
    uint8_t kind;
    uint8_t id;        /* JF_NATIVE: which builtin (jinja_builtin.c) */
    jv self;           /* JF_NATIVE: the string or dict a method is bound to */
    const jnode *node; /* JF_MACRO: the macro; JF_CALLER: the call block */
    jenv *env;         /* JF_CALLER: where the call block stands */
};

struct jenv {
    jenv *parent;
    jobj vars;
};

static inline jv jv_undef(void)
{
    return (jv){.k = JV_UNDEF};
}
static inline jv jv_null(void)
{
    return (jv){.k = JV_NULL};
}
static inline jv jv_bool(bool b)
{
    return (jv){.k = JV_BOOL, .b = b};
}
static inline jv jv_int(double n)
{
    return (jv){.k = JV_INT, .n = n};
}
static inline jv jv_float(double n)
{
    return (jv){.k = JV_FLOAT, .n = n};
}
static inline jv jv_str(jstr s)
{
    return (jv){.k = JV_STR, .s = s};
}
static inline bool jv_is_num(jv v)
{
    return v.k == JV_INT || v.k == JV_FLOAT;
}
static inline bool jv_is_map(jv v)
{
    return v.k == JV_OBJ || v.k == JV_NS;
}

/* ---- render context ------------------------------------------------------ */

typedef struct {
    const jinja_tmpl *t;
    jarena ar;
    dx_buf *out; /* where statements write; swapped to capture a block */
    jinja_limits lim;
    uint64_t steps;
    unsigned depth;
    jenv *global;
    jv ns_fn;            /* namespace(), which every scope has */
    uint32_t signal_pos; /* where the pending break/continue was */
} jcx;

/* Signals that unwind to the enclosing loop (positive, unlike errors). */
#define JX_BREAK    1
#define JX_CONTINUE 2

/* DX_EINVAL "line L, column C: <message>" for a run-time error at pos. */
int jx_fail(jcx *cx, uint32_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* DX_ETOOBIG, same form, for a bound hit. */
int jx_limit(jcx *cx, uint32_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Counts n steps against the bound. */
int jx_steps(jcx *cx, uint32_t pos, uint64_t n);
/* The arena error (set by ja_alloc) with the position added. */
int jx_oom(jcx *cx, uint32_t pos);
/* A type error at pos about JavaScript's raw undefined reaching an operation. */
int jx_raw_error(jcx *cx, uint32_t pos);

void *jx_alloc(jcx *cx, size_t n);
int jx_strdup(jcx *cx, uint32_t pos, const char *p, size_t n, jv *out);
int jx_buf_str(jcx *cx, uint32_t pos, const dx_buf *b, jv *out); /* copy b into a string */
int jx_arr_new(jcx *cx, uint32_t pos, size_t n, jv *out);        /* n undefined elements */
int jx_arr_push(jcx *cx, uint32_t pos, jarr *a, jv v);           /* grows by doubling */
int jx_obj_new(jcx *cx, uint32_t pos, enum jkind k, jv *out);    /* JV_OBJ or JV_NS */
jv *jo_get(const jobj *o, jstr key);
int jo_set(jcx *cx, uint32_t pos, jobj *o, jstr key, jv v);
bool jo_del(jobj *o, jstr key);
void jx_buf_init(jcx *cx, dx_buf *b); /* a scratch buffer bounded like a string */
/* dx_buf_append with the limit or memory error placed at pos. */
int jx_append(jcx *cx, uint32_t pos, dx_buf *b, const char *p, size_t n);
const char *jx_type_name(jv v); /* "string", "list"... for messages */

/* Values from JSON (objects keep JavaScript's key order: integer-like keys
 * first, ascending). */
int jx_from_json(jcx *cx, const json_t *j, unsigned depth, jv *out);

/* ---- text forms (jinja_val.c) --------------------------------------------- */

/* JavaScript's Number.prototype.toString: shortest round-trip digits. */
void js_num_str(double x, char buf[32]);
/* RuntimeValue.toString(): what {{ v }} prints. */
int jx_put_str(jcx *cx, uint32_t pos, dx_buf *b, jv v);
/* String(v.value): what ~ and + concatenate. */
int jx_put_raw(jcx *cx, uint32_t pos, dx_buf *b, jv v);
/* As an element of Array.prototype.join on raw values (null/undefined: ""). */
int jx_put_join_item(jcx *cx, uint32_t pos, dx_buf *b, jv v);
int jx_to_str(jcx *cx, uint32_t pos, jv v, jv *out); /* jx_put_str as a value */

typedef struct {
    double indent; /* 0 or NaN: none */
    bool ensure_ascii;
    bool sort_keys;
    bool has_seps;
    jstr item_sep, key_sep;
} jjson_opts;
/* runtime.ts toJSON. */
int jx_put_json(jcx *cx, uint32_t pos, dx_buf *b, jv v, const jjson_opts *o, unsigned depth,
                bool undef_as_null);

/* JavaScript truthiness of a RuntimeValue (__bool__) and of a raw value. */
bool jx_truthy(jv v);
bool jx_truthy_raw(jv v);
/* A value's truth for if/and/or/not; JavaScript's raw undefined is an error. */
int jx_test_truth(jcx *cx, uint32_t pos, jv v, bool *b);

/* JavaScript's ToNumber of the raw value ("3" is 3, an array joins first). */
int jx_to_number(jcx *cx, uint32_t pos, jv v, double *out);
/* `==` (JavaScript's loose equality on the raw values), `===`, SameValueZero. */
int jx_loose_eq(jcx *cx, uint32_t pos, jv a, jv b, bool *eq);
bool jx_strict_eq(jv a, jv b);
bool jx_same_value_zero(jv a, jv b);
/* compareRuntimeValues: -1/0/1 or an error for values it cannot order. */
int jx_compare(jcx *cx, uint32_t pos, jv a, jv b, bool case_sensitive, int *res);
/* Whether every pair of vals can be compared (sorting n >= 2 values). */
int jx_check_sortable(jcx *cx, uint32_t pos, const jv *vals, size_t n);
/* Stable merge sort of idx[0..n) by cmp(ctx, a, b). */
void jx_stable_sort(size_t *idx, size_t n, size_t *tmp, int (*cmp)(void *, size_t, size_t),
                    void *ctx);
/* String.prototype.localeCompare as ICU's root collation orders ASCII. */
int jx_locale_compare(jstr a, jstr b);

/* ---- Unicode and JavaScript string helpers ------------------------------- */

size_t js_ws_len(const char *p, size_t n);        /* JS whitespace char at p: bytes, else 0 */
size_t js_ws_len_before(const char *p, size_t n); /* ... ending at p + n */
jstr js_trim(jstr s, bool start, bool end);
size_t js_utf16_len(jstr s);
/* Bytes (1..n) of the char at p and its code point; lenient on invalid input
 * (jinja_val.c says why).  Encoding is dx_utf8_put's. */
size_t utf8_dec(const char *p, size_t n, uint32_t *cp);
int jx_case(jcx *cx, uint32_t pos, jstr s, bool upper, jv *out);
uint32_t jx_lower_cp(uint32_t cp);
uint32_t jx_upper_cp(uint32_t cp);
int jx_utf16_cmp(jstr a, jstr b);

/* ---- evaluation (jinja_eval.c) -------------------------------------------- */

int jx_eval(jcx *cx, jenv *env, const jnode *n, jv *out);
int jx_exec(jcx *cx, jenv *env, const jlist *body);
/* Renders body into a string value instead of the output. */
int jx_capture(jcx *cx, uint32_t pos, jenv *env, const jlist *body, jv *out);
jv jx_lookup(jcx *cx, jenv *env, jstr name);
int jx_env_new(jcx *cx, uint32_t pos, jenv *parent, jenv **out);
/* Positional arguments and keyword arguments of a call (runtime.ts
 * evaluateArguments); *kw is never NULL. */
int jx_eval_args(jcx *cx, jenv *env, const jlist *args, jv **pos_out, size_t *npos, jobj **kw);
int jx_call(jcx *cx, uint32_t pos, jenv *env, jv fn, jv *args, size_t nargs, jv *out);

/* ---- builtins (jinja_builtin.c) ------------------------------------------ */

/* Filters.  The caller (jinja_eval.c) evaluates a call's arguments: these
 * see values only, or, for the filters that read their arguments as written
 * (jx_filter_literal_args: selectattr and rejectattr take string literals,
 * checked before anything is evaluated), the call's node.  `v | name`: */
int jx_filter_ident(jcx *cx, uint32_t pos, jv v, jstr name, jv *out);
bool jx_filter_literal_args(jstr name);
int jx_filter_literal(jcx *cx, jv v, const jnode *call, jv *out); /* `v | name(...)` */
/* `v | name(args)`, the arguments as jx_eval_args gives them. */
int jx_filter_call(jcx *cx, uint32_t pos, jv v, jstr name, jv *pos_args, size_t npos, jobj *kw,
                   jv *out);
/* A test by name; arg is the second operand (selectattr's value) or NULL. */
int jx_run_test(jcx *cx, uint32_t pos, jstr name, jv v, const jv *arg, bool *res);
bool jx_test_exists(jstr name);
/* A string's, array's or dict's built-in member (method or length); undef if none. */
int jx_builtin_member(jcx *cx, uint32_t pos, jv self, jstr name, jv *out);
int jx_call_native(jcx *cx, uint32_t pos, const jfn *f, jv *args, size_t nargs, jv *out);
/* The globals every render starts with (setupGlobals + namespace). */
int jx_add_globals(jcx *cx, jenv *g);
/* obj[start:stop:step] of a list or string (the parts integers or undefined). */
int jx_slice_value(jcx *cx, uint32_t pos, jv obj, jv start, jv stop, jv step, jv *out);
/* A dict's keys as a list (what a for loop over a dict runs over). */
int jx_builtin_keys(jcx *cx, uint32_t pos, const jobj *o, jv *out);

#endif
