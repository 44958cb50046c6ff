/* bench_report: statistics and report writers (see .h). */
#include "bench/bench_report.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

/* ---- statistics ------------------------------------------------------------- */

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the smallest value with at least q of the data at or below. */
static double rank(const double *v, size_t n, double q)
{
    size_t k = (size_t)ceil(q * (double)n - 1e-9); /* 0.9 * 100 is 90.000...01 in binary */
    return v[k ? k - 1 : 0];
}

void bench_stat_of(double *v, size_t n, bench_stat *out)
{
    memset(out, 0, sizeof *out);
    out->n = n;
    if (!n) return;
    qsort(v, n, sizeof *v, cmp_dbl);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    out->mean = sum / (double)n;
    out->p50 = rank(v, n, 0.50);
    out->p90 = rank(v, n, 0.90);
    out->p99 = rank(v, n, 0.99);
}

enum field { F_TTFT, F_TPOT, F_E2E };

/* The field of the successful records of turn `turn` (0: all turns). */
static void collect(const bench_results *r, uint32_t turn, enum field f, bench_stat *out)
{
    double *v = dx_malloc((r->n ? r->n : 1) * sizeof *v);
    size_t k = 0;
    for (size_t i = 0; v && i < r->n; i++) {
        const bench_record *x = &r->rec[i];
        if (x->err || (turn && x->turn != turn)) continue;
        double val = f == F_TTFT ? x->ttft_s : f == F_TPOT ? x->tpot_s : x->e2e_s;
        if (f == F_TTFT && val < 0) continue;
        if (f == F_TPOT && x->completion_tokens < 2) continue;
        v[k++] = val;
    }
    bench_stat_of(v, k, out);
    dx_free(v);
}

double bench_turn_p50(const bench_results *r, uint32_t turn)
{
    bench_stat st;
    collect(r, turn, F_TTFT, &st);
    return st.n ? st.p50 : BENCH_UNKNOWN;
}

/* ---- results.json ----------------------------------------------------------------- */

static json_t *dist_json(const bench_dist *d)
{
    char s[64];
    bench_dist_format(d, s, sizeof s);
    return json_string(s);
}

int bench_write_json(const char *path, const bench_workload *w, const bench_meta *m,
                     const bench_results *r)
{
    json_t *recs = json_array();
    for (size_t i = 0; i < r->n; i++) {
        const bench_record *x = &r->rec[i];
        json_array_append_new(
            recs, json_pack("{s:i,s:i,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:i,s:s,s:s}", "conversation",
                            (int)x->conversation, "turn", (int)x->turn, "t_start_s", x->t_start_s,
                            "ttft_s", x->ttft_s, "tpot_s", x->tpot_s, "e2e_s", x->e2e_s,
                            "prompt_tokens", (json_int_t)x->prompt_tokens, "cached_tokens",
                            (json_int_t)x->cached_tokens, "completion_tokens",
                            (json_int_t)x->completion_tokens, "status", x->status, "error",
                            bench_err_name(x->err), "detail", x->detail));
    }
    json_t *root = json_pack(
        "{s:{s:s,s:s,s:s?,s:f,s:i,s:i,s:i,s:i,s:o,s:o,s:o,s:f,s:I,s:i,s:b,s:f,s:b},s:f,s:o}",
        "meta", "url", m->url ? m->url : "", "model", r->model, "preset", w->preset, "scale",
        w->scale, "conversations", (int)w->conversations, "turns", (int)w->turns, "clients",
        (int)w->clients, "shared_prefix_tokens", (int)w->shared_prefix, "prefix_tokens",
        dist_json(&w->prefix), "input_tokens", dist_json(&w->input), "output_tokens",
        dist_json(&w->output), "think_time_s", w->think_s, "seed", (json_int_t)w->seed, "warmup",
        (int)w->warmup, "send_conversation_id", w->send_conversation_id, "client_overhead_ms",
        m->overhead_ms, "tokens_exact", m->tokens_exact, "wall_s", r->wall_s, "records", recs);
    if (root && w->rounds > 1)
        json_object_set_new(json_object_get(root, "meta"), "rounds", json_integer(w->rounds));
    if (root && m->kv.has)
        json_object_set_new(json_object_get(root, "meta"), "kv",
                            json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "bytes_p2d",
                                      m->kv.bytes_p2d, "bytes_d2p", m->kv.bytes_d2p,
                                      "tokens_local", m->kv.tok_local, "tokens_pulled",
                                      m->kv.tok_pulled, "tokens_computed", m->kv.tok_computed,
                                      "pulls_p2d", m->kv.pulls_p2d, "pulls_d2p", m->kv.pulls_d2p,
                                      "blocks_p2d", m->kv.blocks_p2d, "blocks_d2p",
                                      m->kv.blocks_d2p, "revoked_lru", m->kv.revoked_lru));
    if (!root) return dx_errf(DX_ENOMEM, "out of memory");
    int rc = json_dump_file(root, path, JSON_INDENT(1)) ? dx_errf(DX_EIO, "%s: cannot write", path)
                                                        : 0;
    json_decref(root);
    return rc;
}

static int get_dist(json_t *meta, const char *key, bench_dist *d)
{
    json_t *v = json_object_get(meta, key);
    if (!json_is_string(v) || bench_dist_parse(json_string_value(v), d))
        return dx_errf(DX_EFORMAT, "meta.%s: expected a length distribution", key);
    return 0;
}

static int err_of(const char *s)
{
    for (int e = 0; e < BENCH_N_ERR; e++)
        if (!strcmp(s, bench_err_name((enum bench_err)e))) return e;
    return DX_NONE;
}

static int read_record(json_t *x, bench_record *r)
{
    memset(r, 0, sizeof *r);
    const char *err = "ok", *detail = "";
    json_int_t conv = 0, turn = 0, pt = 0, ct = 0, gt = 0;
    int status = 0;
    json_error_t je;
    if (json_unpack_ex(x, &je, 0, "{s:I,s:I,s:F,s:F,s:F,s:F,s:I,s:I,s:I,s:i,s:s,s:s}",
                       "conversation", &conv, "turn", &turn, "t_start_s", &r->t_start_s, "ttft_s",
                       &r->ttft_s, "tpot_s", &r->tpot_s, "e2e_s", &r->e2e_s, "prompt_tokens", &pt,
                       "cached_tokens", &ct, "completion_tokens", &gt, "status", &status, "error",
                       &err, "detail", &detail))
        return dx_errf(DX_EFORMAT, "%s", je.text);
    int kind = err_of(err);
    if (kind < 0) return dx_errf(DX_EFORMAT, "error: unknown kind \"%s\"", err);
    if (conv < 0 || conv > UINT32_MAX || turn < 1 || turn > UINT32_MAX)
        return dx_errf(DX_EFORMAT, "conversation %lld, turn %lld: out of range", (long long)conv,
                       (long long)turn);
    r->conversation = (uint32_t)conv;
    r->turn = (uint32_t)turn;
    r->prompt_tokens = pt;
    r->cached_tokens = ct;
    r->completion_tokens = gt;
    r->status = status;
    r->err = (enum bench_err)kind;
    snprintf(r->detail, sizeof r->detail, "%s", detail);
    return 0;
}

int bench_read_json(const char *path, bench_workload *w, bench_meta *m, bench_results *r)
{
    memset(r, 0, sizeof *r);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return dx_errf(DX_EFORMAT, "%s:%d: %s", path, je.line, je.text);
    json_t *meta = json_object_get(root, "meta"), *recs = json_object_get(root, "records");
    int rc = json_is_object(meta) && json_is_array(recs)
                 ? 0
                 : dx_errf(DX_EFORMAT, "%s: no meta or records", path);
    static char url[256], model_preset[32];
    json_t *v;
    if (!rc) {
        memset(w, 0, sizeof *w);
        snprintf(url, sizeof url, "%s", json_string_value(json_object_get(meta, "url")) ?: "");
        m->url = url;
        m->overhead_ms = json_number_value(json_object_get(meta, "client_overhead_ms"));
        m->tokens_exact = json_is_true(json_object_get(meta, "tokens_exact"));
        snprintf(r->model, sizeof r->model, "%s",
                 json_string_value(json_object_get(meta, "model")) ?: "");
        if ((v = json_object_get(meta, "preset")) && json_is_string(v)) {
            snprintf(model_preset, sizeof model_preset, "%s", json_string_value(v));
            w->preset = model_preset;
        }
        w->scale = json_number_value(json_object_get(meta, "scale"));
        w->conversations = (uint32_t)json_integer_value(json_object_get(meta, "conversations"));
        w->turns = (uint32_t)json_integer_value(json_object_get(meta, "turns"));
        w->rounds = (uint32_t)json_integer_value(json_object_get(meta, "rounds"));
        json_t *kv = json_object_get(meta, "kv");
        m->kv = (bench_kv){0};
        if (json_is_object(kv))
            m->kv = (bench_kv){1, json_number_value(json_object_get(kv, "bytes_p2d")),
                               json_number_value(json_object_get(kv, "bytes_d2p")),
                               json_number_value(json_object_get(kv, "tokens_local")),
                               json_number_value(json_object_get(kv, "tokens_pulled")),
                               json_number_value(json_object_get(kv, "tokens_computed")),
                               json_number_value(json_object_get(kv, "pulls_p2d")),
                               json_number_value(json_object_get(kv, "pulls_d2p")),
                               json_number_value(json_object_get(kv, "blocks_p2d")),
                               json_number_value(json_object_get(kv, "blocks_d2p")),
                               json_number_value(json_object_get(kv, "revoked_lru"))};
        w->clients = (uint32_t)json_integer_value(json_object_get(meta, "clients"));
        w->shared_prefix =
            (uint32_t)json_integer_value(json_object_get(meta, "shared_prefix_tokens"));
        w->think_s = json_number_value(json_object_get(meta, "think_time_s"));
        w->seed = (uint64_t)json_integer_value(json_object_get(meta, "seed"));
        w->warmup = (uint32_t)json_integer_value(json_object_get(meta, "warmup"));
        w->send_conversation_id = json_is_true(json_object_get(meta, "send_conversation_id"));
        r->wall_s = json_number_value(json_object_get(root, "wall_s"));
        rc = get_dist(meta, "prefix_tokens", &w->prefix);
        if (!rc) rc = get_dist(meta, "input_tokens", &w->input);
        if (!rc) rc = get_dist(meta, "output_tokens", &w->output);
        if (rc) rc = dx_err_wrap(rc, "%s", path);
    }
    size_t i;
    json_array_foreach(recs, i, v)
    {
        bench_record rec;
        if (rc) break;
        rc = read_record(v, &rec);
        if (rc) rc = dx_err_wrap(rc, "%s: records[%zu]", path, i);
        if (!rc) rc = bench_results_add(r, &rec);
    }
    json_decref(root);
    if (rc) bench_results_free(r);
    return rc;
}

/* ---- summary.md ------------------------------------------------------------------- */

static void stat_row(FILE *f, const char *what, const bench_stat *s, double unit)
{
    if (!s->n) {
        fprintf(f, "| %s | - | - | - | - |\n", what);
        return;
    }
    fprintf(f, "| %s | %.1f | %.1f | %.1f | %.1f |\n", what, s->mean * unit, s->p50 * unit,
            s->p90 * unit, s->p99 * unit);
}

static void write_workload(FILE *f, const bench_workload *w, const bench_meta *m,
                           const bench_results *r)
{
    char pre[64], in[64], out[64];
    bench_dist_format(&w->prefix, pre, sizeof pre);
    bench_dist_format(&w->input, in, sizeof in);
    bench_dist_format(&w->output, out, sizeof out);
    fprintf(f, "# duplex bench%s%s\n\n", w->preset ? ": preset " : "", w->preset ? w->preset : "");
    if (w->preset) fprintf(f, "Preset `%s` at scale %g.\n\n", w->preset, w->scale);
    fprintf(f,
            "%u conversations x %u turns, %u at a time; shared system prefix %u tokens, "
            "per-conversation prefix %s, input %s and output %s tokens per turn (%s); think time "
            "%g s; seed %llu; model `%s`.\n",
            w->conversations, w->turns, w->clients, w->shared_prefix, pre, in, out,
            m->tokens_exact ? "counted by the model's tokenizer" : "estimated from words",
            w->think_s, (unsigned long long)w->seed, r ? r->model : "");
    if (w->rounds > 1)
        fprintf(f, "Each mode ran %u times, the modes in turn (A B C A B C ...), each time "
                   "started afresh; the figures are over all %u rounds.\n",
                w->rounds, w->rounds);
    if (m->overhead_ms >= 0)
        fprintf(f, "The client's own time to first token against an instant endpoint: %.2f ms "
                   "(p50).\n",
                m->overhead_ms);
    fputc('\n', f);
}

static void write_overall(FILE *f, const bench_series *s)
{
    const bench_results *r = s->res;
    bench_stat ttft, tpot, e2e;
    collect(r, 0, F_TTFT, &ttft);
    collect(r, 0, F_TPOT, &tpot);
    collect(r, 0, F_E2E, &e2e);
    size_t errs[BENCH_N_ERR] = {0};
    long out_tokens = 0;
    for (size_t i = 0; i < r->n; i++) {
        errs[r->rec[i].err]++;
        if (!r->rec[i].err) out_tokens += r->rec[i].completion_tokens;
    }
    fprintf(f, "### %s\n\n| ms | mean | p50 | p90 | p99 |\n|---|---|---|---|---|\n", s->name);
    stat_row(f, "TTFT", &ttft, 1e3);
    stat_row(f, "TPOT", &tpot, 1e3);
    stat_row(f, "end to end", &e2e, 1e3);
    fprintf(f, "\n%zu requests in %.1f s: %.2f requests/s, %.1f output tokens/s; errors: ", r->n,
            r->wall_s, r->wall_s > 0 ? (double)r->n / r->wall_s : 0,
            r->wall_s > 0 ? (double)out_tokens / r->wall_s : 0);
    int any = 0;
    for (int e = 1; e < BENCH_N_ERR; e++)
        if (errs[e]) fprintf(f, "%s%s %zu", any++ ? ", " : "", bench_err_name((enum bench_err)e),
                             errs[e]);
    fprintf(f, "%s.\n\n", any ? "" : "none");
    /* per turn: the spread, and how much of each prompt the server said it had cached */
    fprintf(f, "| turn | requests | TTFT mean | p50 | p90 | p99 | prompt tokens | cached |\n"
               "|---|---|---|---|---|---|---|---|\n");
    uint32_t last = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->rec[i].turn > last) last = r->rec[i].turn;
    for (uint32_t t = 1; t <= last; t++) {
        bench_stat st;
        collect(r, t, F_TTFT, &st);
        double prompt = 0, cached = 0;
        for (size_t i = 0; i < r->n; i++)
            if (r->rec[i].turn == t && !r->rec[i].err) {
                prompt += (double)r->rec[i].prompt_tokens;
                cached += (double)r->rec[i].cached_tokens;
            }
        if (!st.n) {
            fprintf(f, "| %u | 0 | - | - | - | - | - | - |\n", t);
            continue;
        }
        fprintf(f, "| %u | %zu | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f%% |\n", t, st.n,
                st.mean * 1e3, st.p50 * 1e3, st.p90 * 1e3, st.p99 * 1e3, prompt / (double)st.n,
                prompt > 0 ? 100 * cached / prompt : 0);
    }
    fputc('\n', f);
}

static int find(const bench_series *s, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s[i].name, name)) return (int)i;
    return DX_NONE;
}

/* The ratios the P/D comparison is about, when both sides ran. */
static void ratio_pairs(const bench_series *s, size_t n, int pairs[2][2])
{
    pairs[0][0] = find(s, n, "uni-nocache"), pairs[0][1] = find(s, n, "bidi");
    pairs[1][0] = find(s, n, "bidi"), pairs[1][1] = find(s, n, "colocated");
}

static void write_turns(FILE *f, const bench_workload *w, const bench_series *s, size_t n)
{
    int pr[2][2];
    ratio_pairs(s, n, pr);
    fprintf(f, "## TTFT by turn (p50, ms)\n\n| turn |");
    for (size_t i = 0; i < n; i++) fprintf(f, " %s |", s[i].name);
    for (int k = 0; k < 2; k++)
        if (pr[k][0] >= 0 && pr[k][1] >= 0) fprintf(f, " %s / %s |", s[pr[k][0]].name, s[pr[k][1]].name);
    fprintf(f, "\n|---|");
    for (size_t i = 0; i < n; i++) fprintf(f, "---|");
    for (int k = 0; k < 2; k++)
        if (pr[k][0] >= 0 && pr[k][1] >= 0) fprintf(f, "---|");
    fputc('\n', f);
    for (uint32_t t = 1; t <= w->turns; t++) {
        fprintf(f, "| %u |", t);
        for (size_t i = 0; i < n; i++) {
            double p = bench_turn_p50(s[i].res, t);
            if (p < 0)
                fprintf(f, " - |");
            else
                fprintf(f, " %.1f |", p * 1e3);
        }
        for (int k = 0; k < 2; k++) {
            if (pr[k][0] < 0 || pr[k][1] < 0) continue;
            double a = bench_turn_p50(s[pr[k][0]].res, t), b = bench_turn_p50(s[pr[k][1]].res, t);
            if (a > 0 && b > 0)
                fprintf(f, " %.2f |", a / b);
            else
                fprintf(f, " - |");
        }
        fputc('\n', f);
    }
    fputc('\n', f);
}

static void write_kv(FILE *f, const bench_series *s, size_t n)
{
    int any = 0;
    for (size_t i = 0; i < n; i++) any |= s[i].kv.has;
    if (!any) return;
    fprintf(f, "## Where the prompts' KV came from (node metrics)\n\n"
               "| mode | reused locally | pulled | recomputed | MB pulled P->D | MB pulled D->P "
               "| KB per pull D->P | KB per block | retained revoked |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const bench_kv *k = &s[i].kv;
        if (!k->has) continue;
        double tot = k->tok_local + k->tok_pulled + k->tok_computed;
        if (tot <= 0) tot = 1;
        fprintf(f, "| %s | %.1f%% | %.1f%% | %.1f%% | %.1f | %.1f | %.1f | %.1f | %.0f |\n",
                s[i].name, 100 * k->tok_local / tot, 100 * k->tok_pulled / tot,
                100 * k->tok_computed / tot, k->bytes_p2d / 1e6, k->bytes_d2p / 1e6,
                k->pulls_d2p > 0 ? k->bytes_d2p / k->pulls_d2p / 1e3 : 0,
                k->blocks_p2d + k->blocks_d2p > 0
                    ? (k->bytes_p2d + k->bytes_d2p) / (k->blocks_p2d + k->blocks_d2p) / 1e3
                    : 0,
                k->revoked_lru);
    }
    fprintf(f, "\nShares are of the prompt tokens all nodes saw (a turn through a prefill node "
               "counts on both nodes).  A pull moves whole KV blocks as the pool stores them (a "
               "q8_0 block is 17/32 of an f16 one); per pull counts every pull tried, \"retained "
               "revoked\" the conversations the decode nodes gave up under memory pressure.\n\n");
}

int bench_write_summary(FILE *f, const bench_workload *w, const bench_meta *m,
                        const bench_series *s, size_t n)
{
    write_workload(f, w, m, n ? s[0].res : NULL);
    write_turns(f, w, s, n);
    fprintf(f, "## Overall\n\n");
    for (size_t i = 0; i < n; i++) write_overall(f, &s[i]);
    write_kv(f, s, n);
    return ferror(f) ? dx_errf(DX_EIO, "writing the summary failed") : 0;
}

void bench_print_turns(FILE *f, const bench_workload *w, const bench_series *s, size_t n)
{
    write_turns(f, w, s, n);
    int pr[2][2];
    ratio_pairs(s, n, pr);
    uint32_t last = w->turns;
    for (int k = 0; k < 2; k++) {
        if (pr[k][0] < 0 || pr[k][1] < 0) continue;
        double a = bench_turn_p50(s[pr[k][0]].res, last), b = bench_turn_p50(s[pr[k][1]].res, last);
        if (a > 0 && b > 0)
            fprintf(f, "At the last turn, %s takes %.2fx the time to first token of %s.\n",
                    s[pr[k][0]].name, a / b, s[pr[k][1]].name);
    }
}

/* ---- ttft.svg ------------------------------------------------------------------------- */

/* A "nice" axis step: 1, 2 or 5 times a power of ten, about max/5. */
static double nice_step(double max)
{
    double raw = max / 5, p = pow(10, floor(log10(raw > 0 ? raw : 1)));
    double m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

/* Text inside an element: a model name comes from the endpoint. */
static void xml_text(FILE *f, const char *t)
{
    for (; *t; t++) {
        switch (*t) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        default:
            if ((unsigned char)*t >= 0x20 || *t == '\t') fputc(*t, f);
        }
    }
}

/* The legend's words for a mode of `duplex bench compare`. */
static const char *mode_label(const char *name)
{
    static const char *const k[][2] = {
        {"uni-nocache", "P/D one-way, P recomputes"}, {"uni", "P/D one-way, P prefix cache"},
        {"bidi", "P/D bidirectional"},                 {"bidi-rt", "bidirectional + local prefill"},
        {"colocated", "one node, prefill and decode"},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(k); i++)
        if (!strcmp(name, k[i][0])) return k[i][1];
    return NULL;
}

/* The y axis: linear from 0, or logarithmic when the lines span more than
 * a factor of 8 (a 10x baseline would otherwise flatten the lines that
 * matter onto the x axis); ticks at 1, 2 and 5 times powers of ten. */
typedef struct {
    int log;
    double lo, hi, step; /* ms; step: linear only */
    double top, bottom;  /* pixels */
} yaxis;

static double y_of(const yaxis *a, double v)
{
    double f = a->log ? (log10(fmax(v, a->lo)) - log10(a->lo)) / (log10(a->hi) - log10(a->lo))
                      : v / a->hi;
    return a->bottom - f * (a->bottom - a->top);
}

static void y_ticks(FILE *f, const yaxis *a, double x0, double x1)
{
    double dec = a->log ? pow(10, floor(log10(a->lo) + 1e-9)) : 0;
    for (double v = a->log ? a->lo : 0; v <= a->hi * 1.0001;) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                x0, y_of(a, v), x1, y_of(a, v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", x0 - 6,
                y_of(a, v) + 4, v);
        if (!a->log) {
            v += a->step;
        } else { /* 1, 2, 5, 10, 20, ... */
            double m = v / dec;
            v = m < 1.5 ? 2 * dec : m < 3 ? 5 * dec : (dec *= 10);
        }
    }
}

static yaxis y_axis(const bench_workload *w, const bench_series *s, size_t n, double top,
                    double bottom)
{
    double ymin = INFINITY, ymax = 0;
    for (size_t i = 0; i < n; i++)
        for (uint32_t t = 1; t <= w->turns; t++) {
            double p = bench_turn_p50(s[i].res, t) * 1e3;
            if (p > 0) ymin = fmin(ymin, p), ymax = fmax(ymax, p);
        }
    yaxis a = {.top = top, .bottom = bottom};
    if (ymax > 0 && ymax / ymin > 8) {
        a.log = 1; /* the nearest 1-2-5 values around the data */
        double d = pow(10, floor(log10(ymin)));
        a.lo = ymin >= 5 * d ? 5 * d : ymin >= 2 * d ? 2 * d : d;
        d = pow(10, floor(log10(ymax)));
        a.hi = ymax <= d ? d : ymax <= 2 * d ? 2 * d : ymax <= 5 * d ? 5 * d : 10 * d;
        return a;
    }
    a.step = nice_step(ymax > 0 ? ymax : 1);
    a.hi = ceil((ymax > 0 ? ymax : 1) / a.step) * a.step;
    return a;
}

int bench_write_svg(FILE *f, const bench_workload *w, const bench_series *s, size_t n)
{
    static const char *const colors[] = {"#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd",
                                         "#8c564b"};
    const double W = 860, H = 460, L = 70, R = 250, T = 56, B = 50;
    yaxis ya = y_axis(w, s, n, T, H - B);
    uint32_t turns = w->turns > 1 ? w->turns : 2;
#define X(t) (L + ((double)(t) - 1) * (W - L - R) / (turns - 1))
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H, W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">Time to first token by turn (p50 of %u "
               "conversations)</text>\n",
            L, w->conversations * (w->rounds > 1 ? w->rounds : 1));
    fprintf(f, "<text x=\"%.0f\" y=\"40\" fill=\"#555\">%s%s%sscale %g; %u at a time; model ",
            L, w->preset ? "preset " : "", w->preset ? w->preset : "", w->preset ? ", " : "",
            w->scale, w->clients);
    xml_text(f, n && s[0].res->model[0] ? s[0].res->model : "?");
    fputs("</text>\n", f);
    y_ticks(f, &ya, L, W - R);
    for (uint32_t t = 1; t <= w->turns; t++)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%u</text>\n", X(t),
                H - B + 18, t);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L,
            H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, T,
            L, H - B);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">turn</text>\n",
            (L + W - R) / 2, H - 12);
    fprintf(f, "<text transform=\"translate(18 %.1f) rotate(-90)\" text-anchor=\"middle\">"
               "TTFT (ms%s)</text>\n",
            (T + H - B) / 2, ya.log ? ", log scale" : "");
    for (size_t i = 0; i < n; i++) {
        const char *col = colors[i % DX_ARRAY_LEN(colors)];
        fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"2\" d=\"", col);
        int pen = 0;
        for (uint32_t t = 1; t <= w->turns; t++) {
            double p = bench_turn_p50(s[i].res, t);
            if (p < 0) continue;
            fprintf(f, "%s%.1f %.1f", pen++ ? " L" : "M", X(t), y_of(&ya, p * 1e3));
        }
        fprintf(f, "\"/>\n");
        for (uint32_t t = 1; t <= w->turns; t++) { /* a dot per measured turn */
            double p = bench_turn_p50(s[i].res, t);
            if (p >= 0)
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", X(t),
                        y_of(&ya, p * 1e3), col);
        }
        /* the legend: the mode's name, and under it what it is */
        double ly = T + 10 + 34.0 * (double)i;
        const char *label = mode_label(s[i].name);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"2\"/>\n",
                W - R + 15, ly, W - R + 40, ly, col);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">", W - R + 46, ly + 4);
        xml_text(f, s[i].name);
        fputs("</text>\n", f);
        if (label)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\" font-size=\"11\">%s</text>\n",
                    W - R + 46, ly + 18, label);
    }
    fprintf(f, "</svg>\n");
#undef X
    return ferror(f) ? dx_errf(DX_EIO, "writing the plot failed") : 0;
}
