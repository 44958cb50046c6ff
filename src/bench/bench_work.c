/* bench_work: the multi-turn workload (see .h). */
#include "bench/bench_work.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "model/model.h"

/* ---- distributions ------------------------------------------------------ */

static int parse_num(const char *s, char **end, double *out)
{
    *out = strtod(s, end);
    return *end != s && isfinite(*out) && *out >= 0;
}

int bench_dist_parse(const char *s, bench_dist *d)
{
    char *end;
    memset(d, 0, sizeof *d);
    if (!strncmp(s, "uniform:", 8) || !strncmp(s, "lognormal:", 10)) {
        int uni = s[0] == 'u';
        const char *p = s + (uni ? 8 : 10);
        d->kind = uni ? BENCH_UNIFORM : BENCH_LOGNORMAL;
        if (!parse_num(p, &end, &d->a) || *end != ':' || !parse_num(end + 1, &end, &d->b) || *end)
            return dx_errf(DX_EINVAL, "'%s': want %s", s,
                           uni ? "uniform:MIN:MAX" : "lognormal:MEDIAN:SIGMA");
        if (uni && d->b < d->a) return dx_errf(DX_EINVAL, "'%s': MAX below MIN", s);
        if (d->a < 1) return dx_errf(DX_EINVAL, "'%s': lengths are at least 1 token", s);
        return 0;
    }
    d->kind = BENCH_CONST;
    if (!parse_num(s, &end, &d->a) || *end || d->a < 1 || d->a != floor(d->a))
        return dx_errf(DX_EINVAL,
                       "'%s': want a token count N >= 1, uniform:MIN:MAX or lognormal:MEDIAN:SIGMA",
                       s);
    return 0;
}

uint32_t bench_dist_draw(const bench_dist *d, dx_rng *r)
{
    double v = d->a;
    if (d->kind == BENCH_UNIFORM) {
        v = d->a + floor(dx_rng_uniform(r) * (d->b - d->a + 1));
    } else if (d->kind == BENCH_LOGNORMAL) { /* Box-Muller: one normal per draw */
        double u1 = dx_rng_uniform(r), u2 = dx_rng_uniform(r);
        double z = sqrt(-2.0 * log(u1 > 0 ? u1 : 1e-300)) * cos(2 * M_PI * u2);
        v = d->a * exp(d->b * z);
    }
    if (v < 1) v = 1;
    if (v > 1e7) v = 1e7;
    return (uint32_t)llround(v);
}

double bench_dist_mean(const bench_dist *d)
{
    if (d->kind == BENCH_UNIFORM) return (d->a + d->b) / 2;
    if (d->kind == BENCH_LOGNORMAL) return d->a * exp(d->b * d->b / 2);
    return d->a;
}

void bench_dist_format(const bench_dist *d, char *out, size_t cap)
{
    if (d->kind == BENCH_CONST)
        snprintf(out, cap, "%.0f", d->a);
    else
        snprintf(out, cap, "%s:%g:%g", d->kind == BENCH_UNIFORM ? "uniform" : "lognormal", d->a,
                 d->b);
}

/* ---- workloads -------------------------------------------------------------- */

static void scale_dist(bench_dist *d, double s)
{
    d->a = fmax(1, round(d->a * s));
    if (d->kind == BENCH_UNIFORM) d->b = fmax(d->a, round(d->b * s));
}

int bench_workload_preset(const char *name, double scale, bench_workload *w)
{
    if (!(scale > 0 && scale <= 1)) return dx_errf(DX_EINVAL, "--scale %g: want 0 < S <= 1", scale);
    if (!strcmp(name, "quick")) {
        /* under a minute for three modes on the small model, 2 cores; one
         * conversation at a time, so a turn's figure is its own cost (with
         * more, prefill and decode nodes share the same two cores) */
        w->conversations = 8, w->turns = 8, w->clients = 1, w->shared_prefix = 200;
        w->prefix = (bench_dist){BENCH_CONST, 1000, 0};
        w->input = (bench_dist){BENCH_UNIFORM, 100, 150};
        w->output = (bench_dist){BENCH_CONST, 64, 0};
    } else if (!strcmp(name, "paper")) {
        /* the AWS/vLLM shape: 10 conversations x 10 turns, 150 in / 300 out;
         * the prefix (2k..24k) is the sweep's variable (--prefix-tokens) */
        w->conversations = 10, w->turns = 10, w->clients = 10, w->shared_prefix = 0;
        w->prefix = (bench_dist){BENCH_CONST, 2048, 0};
        w->input = (bench_dist){BENCH_CONST, 150, 0};
        w->output = (bench_dist){BENCH_CONST, 300, 0};
    } else {
        return dx_errf(DX_EINVAL, "unknown preset '%s' (quick|paper)", name);
    }
    w->shared_prefix = (uint32_t)round(w->shared_prefix * scale);
    scale_dist(&w->prefix, scale);
    scale_dist(&w->input, scale);
    scale_dist(&w->output, scale);
    w->scale = scale;
    w->preset = !strcmp(name, "quick") ? "quick" : "paper";
    return 0;
}

int bench_workload_check(const bench_workload *w)
{
    if (!w->conversations) return dx_errf(DX_EINVAL, "--conversations must be at least 1");
    if (!w->turns) return dx_errf(DX_EINVAL, "--turns must be at least 1");
    if (!w->clients) return dx_errf(DX_EINVAL, "--clients must be at least 1");
    if (w->think_s < 0) return dx_errf(DX_EINVAL, "--think-time must not be negative");
    return 0;
}

/* ---- text ------------------------------------------------------------------------ */

static const char *const k_words[] = {
    "the",      "agent",    "reads",     "a",         "file",      "and",       "calls",
    "tool",     "with",     "its",       "arguments", "then",      "reports",   "what",
    "changed",  "in",       "the",       "build",     "output",    "every",     "function",
    "returns",  "an",       "error",     "code",      "when",      "input",     "is",
    "invalid",  "so",       "callers",   "check",     "it",        "before",    "using",
    "result",   "tests",    "run",       "on",        "each",      "commit",    "which",
    "keeps",    "history",  "of",        "failures",  "short",     "search",    "query",
    "found",    "three",    "matches",   "two",       "are",       "stale",     "one",
    "needs",    "update",   "because",   "interface", "moved",     "last",      "week",
    "please",   "summarise", "document", "section",   "by",        "section",   "keeping",
    "numbers",  "exact",    "table",     "shows",     "latency",   "throughput", "memory",
    "for",      "request",  "service",   "cache",     "stores",    "recent",    "answers",
    "long",     "context",  "windows",   "cost",      "time",      "to",        "first",
    "token",    "grows",    "history",   "length",    "this",      "plan",      "has",
    "steps",    "open",     "repository", "list",     "directory", "patch",     "apply",
    "verify",   "deploy",   "rollback",  "monitor",   "alert",     "metric",    "dashboard",
    "user",     "asked",    "about",     "config",    "values",    "default",   "port",
    "timeout",  "retry",    "budget",    "limit",     "queue",     "worker",    "thread",
    "schema",   "field",    "type",      "string",    "integer",   "array",     "object",
    "network",  "packet",   "route",     "server",    "client",    "session",   "state"};

struct bench_text {
    model *m; /* tokenizer only, or NULL */
    double per_word; /* tokens per word, measured on a sample with a tokenizer */
    dx_buf scratch;
};

static void add_words(dx_buf *b, dx_rng *r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *w = k_words[dx_rng_next(r) % DX_ARRAY_LEN(k_words)];
        if (b->len) dx_buf_putc(b, ' ');
        dx_buf_puts(b, w);
        if (dx_rng_next(r) % 12 == 0) dx_buf_putc(b, dx_rng_next(r) % 3 ? ',' : '.');
    }
}

static size_t count_tokens(bench_text *t, const char *s, size_t n)
{
    tok_ids v;
    tok_ids_init(&v);
    size_t k = tok_encode(model_tokenizer(t->m), s, n, 0, &v) == 0 ? v.n : 0;
    tok_ids_free(&v);
    return k;
}

int bench_text_create(const char *tokenizer, bench_text **out)
{
    *out = NULL;
    bench_text *t = dx_calloc(1, sizeof *t);
    if (!t) return dx_errf(DX_ENOMEM, "out of memory");
    dx_buf_init(&t->scratch, 0);
    t->per_word = BENCH_TOKENS_PER_WORD;
    if (tokenizer) {
        int rc = model_load_tokenizer(tokenizer, &t->m);
        if (rc) {
            bench_text_destroy(t);
            return dx_err_wrap(rc, "--tokenizer");
        }
        dx_rng r;
        dx_rng_seed(&r, 1);
        add_words(&t->scratch, &r, 2000);
        t->per_word = (double)count_tokens(t, t->scratch.data, t->scratch.len) / 2000.0;
        if (t->per_word <= 0) t->per_word = BENCH_TOKENS_PER_WORD;
    }
    *out = t;
    return 0;
}

void bench_text_destroy(bench_text *t)
{
    if (!t) return;
    model_free(t->m);
    dx_buf_free(&t->scratch);
    dx_free(t);
}

int bench_text_exact(const bench_text *t)
{
    return t->m != NULL;
}

/* With a tokenizer: words drawn once, then the most words whose tokens are
 * at most n (bisection over the word boundaries: O(log words) encodes). */
int bench_text_make(bench_text *t, dx_rng *r, uint32_t n, dx_buf *out)
{
    dx_buf *b = &t->scratch;
    dx_buf_reset(b);
    size_t words = (size_t)ceil(n / t->per_word * (t->m ? 1.3 : 1.0)) + 1;
    add_words(b, r, words);
    size_t *cut = dx_malloc((words + 1) * sizeof *cut), k = 0; /* end of word i */
    if (!cut) return dx_errf(DX_ENOMEM, "out of memory");
    for (size_t i = 0; i < b->len; i++)
        if (b->data[i] == ' ') cut[k++] = i;
    cut[k++] = b->len;
    size_t keep; /* words kept */
    if (!t->m) {
        keep = (size_t)llround(n / t->per_word);
    } else {
        size_t lo = 1, hi = k; /* the answer is in [lo, hi] */
        while (lo < hi) {
            size_t mid = lo + (hi - lo + 1) / 2;
            if (count_tokens(t, b->data, cut[mid - 1]) <= n)
                lo = mid;
            else
                hi = mid - 1;
        }
        keep = lo;
    }
    if (keep < 1) keep = 1;
    if (keep > k) keep = k;
    int rc = dx_buf_append(out, b->data, cut[keep - 1]);
    dx_free(cut);
    return rc;
}

/* ---- conversations ---------------------------------------------------------------- */

static char *take(dx_buf *b)
{
    char *s = dx_buf_take(b);
    return s ? s : dx_strdup("");
}

int bench_conv_make(const bench_workload *w, bench_text *t, uint32_t index, bench_conv *c)
{
    memset(c, 0, sizeof *c);
    dx_rng shared, r;
    dx_rng_seed(&shared, w->seed ^ 0x5eedull);
    dx_rng_seed(&r, w->seed * 1000003ull + index);
    snprintf(c->id, sizeof c->id, "conv-%llu-%u", (unsigned long long)w->seed, index);
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_puts(&b, "You are an agent working through a long task. ");
    int rc = w->shared_prefix ? bench_text_make(t, &shared, w->shared_prefix, &b) : 0;
    c->system = take(&b);
    dx_buf_puts(&b, "Here is the document: ");
    if (!rc) rc = bench_text_make(t, &r, bench_dist_draw(&w->prefix, &r), &b);
    c->document = take(&b);
    c->n_turns = w->turns;
    c->inputs = dx_calloc(w->turns, sizeof *c->inputs);
    c->outputs = dx_calloc(w->turns, sizeof *c->outputs);
    if (!c->inputs || !c->outputs) rc = dx_errf(DX_ENOMEM, "out of memory");
    for (uint32_t i = 0; !rc && i < w->turns; i++) {
        if (i > 0 && i % 3 == 2) dx_buf_puts(&b, "Tool output: ");
        if (i > 0) rc = bench_text_make(t, &r, bench_dist_draw(&w->input, &r), &b);
        c->inputs[i] = take(&b);
        c->outputs[i] = bench_dist_draw(&w->output, &r);
    }
    dx_buf_free(&b);
    if (rc || !c->system || !c->document) {
        bench_conv_free(c);
        return rc ? rc : dx_errf(DX_ENOMEM, "out of memory");
    }
    return 0;
}

void bench_conv_free(bench_conv *c)
{
    dx_free(c->system);
    dx_free(c->document);
    for (uint32_t i = 0; c->inputs && i < c->n_turns; i++) dx_free(c->inputs[i]);
    dx_free(c->inputs);
    dx_free(c->outputs);
    memset(c, 0, sizeof *c);
}

