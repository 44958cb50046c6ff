/* node_gram: structured-output constraints → EBNF → cached grammars (see .h). */
#include "node/node_gram.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_list.h"
#include "oai/oai_tools.h"

struct node_gram {
    dx_list link; /* c->lru; not linked: only references keep it */
    uint32_t refs;
    uint64_t h;
    char *key; /* what it was built from (see request_key) */
    size_t len;
    gram *g;
    char *warn; /* keywords a non-strict schema ignored, or NULL */
};

struct node_gram_cache {
    pthread_mutex_t mu;
    uint32_t max, n;
    dx_list lru; /* most recent first */
    node_gram_stats st;
};

/* ---- EBNF text ----------------------------------------------------------- */

static int fail400(oai_err *err, const char *param, const char *msg)
{
    if (!strncmp(msg, "grammar: ", 9)) msg += 9; /* gram's own prefix: the param says it */
    err->status = 400;
    snprintf(err->param, sizeof err->param, "%s", param);
    snprintf(err->message, sizeof err->message, "%s: %s", param, msg);
    return dx_errf(DX_EINVAL, "%s", err->message);
}

static int fail503(oai_err *err)
{
    err->status = 503;
    err->param[0] = 0;
    snprintf(err->message, sizeof err->message, "out of memory building the grammar; try again");
    return dx_errf(DX_ENOMEM, "%s", err->message);
}

/* s as an EBNF string literal: quotes, backslashes and control bytes
 * escaped, other bytes (UTF-8 included) as they are. */
static int put_lit(dx_buf *b, const char *s, size_t n)
{
    int rc = dx_buf_putc(b, '"');
    for (size_t i = 0; !rc && i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            rc = dx_buf_printf(b, "\\%c", c);
        else if (c == '\n')
            rc = dx_buf_puts(b, "\\n");
        else if (c < 0x20 || c == 0x7f)
            rc = dx_buf_printf(b, "\\x%02X", c);
        else
            rc = dx_buf_putc(b, (char)c);
    }
    return rc ? rc : dx_buf_putc(b, '"');
}

/* A JSON value as compact text, appended to b. */
static int put_json(dx_buf *b, const json_t *v)
{
    size_t n = json_dumpb(v, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!n || dx_buf_reserve(b, n + 1)) return dx_errf(DX_ENOMEM, "out of memory writing JSON");
    json_dumpb(v, b->data + b->len, n, JSON_COMPACT | JSON_ENCODE_ANY);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

/* gram's warnings, each line prefixed with the field it is about. */
static int put_warnings(dx_buf *warnings, const char *param, const dx_buf *w)
{
    const char *p = w->data, *end = w->data + w->len;
    int rc = 0;
    while (!rc && p && p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (n) rc = dx_buf_printf(warnings, "%s: %.*s\n", param, (int)n, p);
        p = nl ? nl + 1 : end;
    }
    return rc;
}

/* The schema's rules (start `<prefix>root`); schema NULL: any JSON object. */
static int put_schema(dx_buf *src, const json_t *schema, int strict, const char *prefix,
                      const char *param, dx_buf *warnings, oai_err *err)
{
    if (!schema) return gram_json_value_ebnf(prefix, 1, src) ? fail503(err) : 0;
    dx_buf text, w;
    dx_buf_init(&text, 0);
    dx_buf_init(&w, 0);
    int rc = put_json(&text, schema);
    if (!rc) {
        rc = gram_schema_to_ebnf(text.data, text.len, strict, prefix, src, &w);
        if (rc == DX_EINVAL)
            fail400(err, param, dx_errmsg());
        else if (rc < 0)
            fail503(err);
    } else {
        fail503(err);
    }
    if (!rc && warnings && put_warnings(warnings, param, &w)) rc = fail503(err);
    dx_buf_free(&text);
    dx_buf_free(&w);
    return rc;
}

/* One tool's call rule `t<i>-call` in the node's format. */
static int put_tool(dx_buf *src, const json_t *fn, size_t i, int fmt, dx_buf *warnings,
                    oai_err *err)
{
    char prefix[32], param[64];
    snprintf(prefix, sizeof prefix, "t%zu-", i);
    snprintf(param, sizeof param, "tools[%zu].function.parameters", i);
    const json_t *params = json_object_get(fn, "parameters"), *st = json_object_get(fn, "strict");
    int strict = !json_is_false(st);
    dx_buf head;
    dx_buf_init(&head, 0);
    int rc = dx_buf_puts(&head, fmt == OAI_TOOLS_QWEN ? "<tool_call>\n{\"name\": " : "{\"name\": ");
    if (!rc) rc = put_json(&head, json_object_get(fn, "name"));
    if (!rc)
        rc = dx_buf_puts(&head, fmt == OAI_TOOLS_QWEN ? ", \"arguments\": " : ", \"parameters\": ");
    if (!rc) rc = dx_buf_printf(src, "t%zu-call ::= ", i);
    if (!rc) rc = put_lit(src, head.data, head.len);
    if (!rc) rc = dx_buf_printf(src, " t%zu-args ", i);
    if (!rc) rc = put_lit(src, "}\n</tool_call>", fmt == OAI_TOOLS_QWEN ? 14 : 1);
    if (!rc && json_is_null(params)) params = NULL;
    if (!rc && !params) rc = dx_buf_printf(src, "\nt%zu-args ::= \"{}\"\n", i);
    if (!rc && params) rc = dx_buf_printf(src, "\nt%zu-args ::= t%zu-root\n", i, i);
    dx_buf_free(&head);
    if (rc) return fail503(err);
    return params ? put_schema(src, params, strict, prefix, param, warnings, err) : 0;
}

/* root ::= one call of one allowed tool (every tool, or the named one). */
static int put_tools(dx_buf *src, const oai_req *o, int fmt, dx_buf *warnings, oai_err *err)
{
    if (fmt != OAI_TOOLS_QWEN && fmt != OAI_TOOLS_LLAMA3)
        return fail400(err, "tool_choice",
                       "this node's model has no tool-call format (--tool-call-parser none), so a "
                       "tool call cannot be forced");
    dx_buf alts;
    dx_buf_init(&alts, 0);
    size_t i;
    json_t *t;
    int rc = 0, n = 0;
    json_array_foreach((json_t *)o->tools, i, t)
    {
        const json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (o->tool_choice == OAI_CHOICE_NAMED && strcmp(name, o->tool_choice_name)) continue;
        if ((rc = put_tool(src, fn, i, fmt, warnings, err)) < 0) break;
        if (dx_buf_printf(&alts, "%st%zu-call", n++ ? " | " : "", i)) {
            rc = fail503(err);
            break;
        }
    }
    /* parallel_tool_calls (OpenAI's default): one call or more, each after
     * the one before as the model family writes several; else exactly one */
    const char *sep = fmt == OAI_TOOLS_QWEN ? "\"\\n\"" : "\"; \"";
    if (!rc && (o->parallel_tool_calls
                    ? dx_buf_printf(src, "calls ::= call (%s call)*\ncall ::= %s\n", sep, alts.data)
                    : dx_buf_printf(src, "calls ::= %s\n", alts.data)))
        rc = fail503(err);
    dx_buf_free(&alts);
    return rc;
}

const char *node_gram_param(const oai_req *o)
{
    if (o->grammar) return "grammar";
    if (o->format != OAI_FORMAT_TEXT) return "response_format";
    if (o->tool_choice >= OAI_CHOICE_REQUIRED && o->n_tools) return "tool_choice";
    return NULL;
}

int node_gram_source(const oai_req *o, int tool_fmt, int think_open, dx_buf *src, dx_buf *warnings,
                     oai_err *err)
{
    const char *param = node_gram_param(o);
    if (!param) return 0;
    if (o->grammar) { /* the user's own: its start rule is root */
        if (!think_open) return dx_buf_append(src, o->grammar, o->grammar_len) ? fail503(err) : 0;
        return fail400(err, "grammar",
                       "the prompt leaves a <think> block open (a reasoning template), which a "
                       "grammar cannot close; use response_format or disable thinking");
    }
    /* the output closes an open <think> first, so the parsers see it as content */
    int rc =
        dx_buf_puts(src, think_open ? "root ::= \"</think>\\n\\n\" body\n" : "root ::= body\n");
    if (rc) return fail503(err);
    if (o->format != OAI_FORMAT_TEXT) {
        if (dx_buf_puts(src, "body ::= s-root\n")) return fail503(err);
        return put_schema(src, o->schema, o->schema_strict, "s-",
                          "response_format.json_schema.schema", warnings, err);
    }
    if (dx_buf_puts(src, "body ::= calls\n")) return fail503(err);
    return put_tools(src, o, tool_fmt, warnings, err);
}

/* ---- the cache ----------------------------------------------------------- */

int node_gram_cache_create(uint32_t max_entries, node_gram_cache **out)
{
    node_gram_cache *c = dx_calloc(1, sizeof *c);
    if (!c) return dx_errf(DX_ENOMEM, "out of memory for the grammar cache");
    pthread_mutex_init(&c->mu, NULL);
    dx_list_init(&c->lru);
    c->max = max_entries ? max_entries : NODE_GRAM_CACHE_DEFAULT;
    *out = c;
    return 0;
}

static void entry_free(node_gram *e)
{
    gram_destroy(e->g);
    dx_free(e->key);
    dx_free(e->warn);
    dx_free(e);
}

static void unlink_entry(node_gram_cache *c, node_gram *e)
{
    dx_list_remove(&e->link);
    c->n--;
}

void node_gram_cache_destroy(node_gram_cache *c)
{
    if (!c) return;
    for (dx_list *n; (n = dx_list_first(&c->lru));) {
        node_gram *e = DX_LIST_ENTRY(n, node_gram, link);
        DX_ASSERT(e->refs == 0); /* every request released its grammar */
        unlink_entry(c, e);
        entry_free(e);
    }
    pthread_mutex_destroy(&c->mu);
    dx_free(c);
}

/* Locked: the entry for src, made the most recent, or NULL. */
static node_gram *lookup(node_gram_cache *c, uint64_t h, const char *src, size_t len)
{
    DX_LIST_FOR_EACH(it, &c->lru)
    {
        node_gram *e = DX_LIST_ENTRY(it, node_gram, link);
        if (e->h != h || e->len != len || memcmp(e->key, src, len)) continue;
        dx_list_move_front(&c->lru, &e->link);
        return e;
    }
    return NULL;
}

/* Locked: adds e (one reference, the caller's), evicting the least recent. */
static void insert(node_gram_cache *c, node_gram *e)
{
    dx_list_push_front(&c->lru, &e->link);
    c->n++;
    while (c->n > c->max) {
        node_gram *old = DX_LIST_ENTRY(dx_list_last(&c->lru), node_gram, link);
        unlink_entry(c, old);
        c->st.evictions++;
        if (!old->refs) entry_free(old);
    }
}

/* How an entry is made when the cache does not have it: the EBNF text
 * compiled, or a request's constraint built and compiled. */
typedef struct {
    const char *src; /* EBNF, or NULL: build it from o */
    size_t len;
    const char *param;
    const oai_req *o;
    int tool_fmt, think_open;
} gram_build;

static int build(const gram_build *b, node_gram *n, oai_err *err)
{
    if (b->src) {
        int rc = gram_compile_ebnf(b->src, b->len, &n->g);
        if (rc < 0) return rc == DX_EINVAL ? fail400(err, b->param, dx_errmsg()) : fail503(err);
        return 0;
    }
    dx_buf src, warn;
    dx_buf_init(&src, 0);
    dx_buf_init(&warn, 0);
    int rc = node_gram_source(b->o, b->tool_fmt, b->think_open, &src, &warn, err);
    if (!rc) {
        gram_build g = {.src = src.data ? src.data : "", .len = src.len, .param = b->param};
        rc = build(&g, n, err);
    }
    if (!rc && warn.len) n->warn = dx_buf_take(&warn);
    dx_buf_free(&src);
    dx_buf_free(&warn);
    return rc;
}

/* The entry for key, from the cache or built (outside the lock: another
 * thread may build the same one meanwhile, and the first one in is kept). */
static int cache_get(node_gram_cache *c, const char *key, size_t len, const gram_build *b,
                     node_gram **out, oai_err *err)
{
    uint64_t h = XXH3_64bits(key, len);
    pthread_mutex_lock(&c->mu);
    node_gram *e = lookup(c, h, key, len);
    if (e) {
        e->refs++;
        c->st.hits++;
    }
    pthread_mutex_unlock(&c->mu);
    if (e) {
        *out = e;
        return 0;
    }
    node_gram *n = dx_calloc(1, sizeof *n);
    if (n) n->key = dx_memdup(key, len ? len : 1);
    if (!n || !n->key) {
        if (n) entry_free(n);
        return fail503(err);
    }
    n->h = h;
    n->len = len;
    n->refs = 1;
    int rc = build(b, n, err);
    if (rc < 0) {
        entry_free(n);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    c->st.misses++;
    if ((e = lookup(c, h, key, len))) {
        e->refs++;
    } else {
        insert(c, n);
        e = n;
        n = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    if (n) entry_free(n);
    *out = e;
    return 0;
}

int node_gram_get(node_gram_cache *c, const char *src, size_t len, const char *param,
                  node_gram **out, oai_err *err)
{
    gram_build b = {.src = src, .len = len, .param = param};
    return cache_get(c, src, len, &b, out, err);
}

/* What a request's constraint depends on, as one string: the kind, the
 * options, and the JSON it comes from (the schema, or the tools and the
 * choice).  A cache hit on it skips the schema compiler as well. */
static int request_key(const oai_req *o, int tool_fmt, int think_open, dx_buf *k)
{
    int rc = dx_buf_printf(k, "%s|%d|%d|%d|%d|", node_gram_param(o), tool_fmt, think_open,
                           (int)o->format, o->schema_strict);
    if (rc) return rc;
    if (o->grammar) return dx_buf_append(k, o->grammar, o->grammar_len);
    if (o->format != OAI_FORMAT_TEXT) return o->schema ? put_json(k, o->schema) : 0;
    if (o->tool_choice == OAI_CHOICE_NAMED && (rc = dx_buf_printf(k, "%s|", o->tool_choice_name)))
        return rc;
    if ((rc = dx_buf_printf(k, "%d|", o->parallel_tool_calls))) return rc;
    return put_json(k, o->tools);
}

int node_gram_request(node_gram_cache *c, const oai_req *o, int tool_fmt, int think_open,
                      node_gram **out, oai_err *err)
{
    *out = NULL;
    const char *param = node_gram_param(o);
    if (!param) return 0;
    dx_buf k;
    dx_buf_init(&k, 0);
    int rc = request_key(o, tool_fmt, think_open, &k) ? fail503(err) : 0;
    gram_build b = {.param = param, .o = o, .tool_fmt = tool_fmt, .think_open = think_open};
    if (!rc) rc = cache_get(c, k.data, k.len, &b, out, err);
    dx_buf_free(&k);
    return rc;
}

const char *node_gram_warnings(const node_gram *g)
{
    return g->warn ? g->warn : "";
}

const gram *node_gram_grammar(const node_gram *g)
{
    return g->g;
}

void node_gram_release(node_gram_cache *c, node_gram *g)
{
    if (!g) return;
    pthread_mutex_lock(&c->mu);
    DX_ASSERT(g->refs > 0);
    int gone = --g->refs == 0 && !dx_list_linked(&g->link);
    pthread_mutex_unlock(&c->mu);
    if (gone) entry_free(g);
}

void node_gram_get_stats(node_gram_cache *c, node_gram_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    out->entries = c->n;
    pthread_mutex_unlock(&c->mu);
}
