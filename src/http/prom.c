/* prom: Prometheus text format (see .h). */
#include "http/prom.h"

#include <math.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

void prom_hist_init(prom_hist *h, const double *bounds, size_t n)
{
    DX_ASSERT(n <= PROM_MAX_BUCKETS);
    memset(h, 0, sizeof *h);
    memcpy(h->bounds, bounds, n * sizeof *bounds);
    h->n_bounds = n;
}

void prom_hist_init_latency(prom_hist *h)
{
    static const double b[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                               0.5,   1,      2.5,   5,    10,    20,   30,  60};
    prom_hist_init(h, b, DX_ARRAY_LEN(b));
}

void prom_hist_observe(prom_hist *h, double v)
{
    if (!isfinite(v)) return;
    size_t i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void prom_family_init(prom_family *f)
{
    memset(f, 0, sizeof *f);
}

void prom_family_free(prom_family *f)
{
    for (size_t i = 0; i < f->n; i++) dx_free(f->labels[i]);
    dx_free(f->labels);
    dx_free(f->values);
    memset(f, 0, sizeof *f);
}

static size_t family_find(const prom_family *f, const char *labels)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->labels[i], labels) == 0) return i;
    return SIZE_MAX;
}

uint64_t prom_family_get(const prom_family *f, const char *labels)
{
    size_t i = family_find(f, labels);
    return i == SIZE_MAX ? 0 : f->values[i];
}

int prom_family_add(prom_family *f, const char *labels, uint64_t v)
{
    size_t i = family_find(f, labels);
    if (i != SIZE_MAX) {
        f->values[i] += v;
        return 0;
    }
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        char **l = dx_realloc(f->labels, cap * sizeof *l);
        if (!l) return dx_errf(DX_ENOMEM, "metrics: %zu series", cap);
        f->labels = l;
        uint64_t *vals = dx_realloc(f->values, cap * sizeof *vals);
        if (!vals) return dx_errf(DX_ENOMEM, "metrics: %zu series", cap);
        f->values = vals;
        f->cap = cap;
    }
    f->labels[f->n] = dx_strdup(labels);
    if (!f->labels[f->n]) return dx_errf(DX_ENOMEM, "metrics: series {%.60s}", labels);
    f->values[f->n++] = v;
    return 0;
}

int prom_write_header(dx_buf *b, const char *name, const char *type, const char *help)
{
    return dx_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

int prom_write_value(dx_buf *b, const char *name, const char *labels, double v)
{
    if (labels && *labels) return dx_buf_printf(b, "%s{%s} %.17g\n", name, labels, v);
    return dx_buf_printf(b, "%s %.17g\n", name, v);
}

int prom_write_counter(dx_buf *b, const char *name, const char *help, double v)
{
    int rc = prom_write_header(b, name, "counter", help);
    return rc ? rc : prom_write_value(b, name, NULL, v);
}

int prom_write_gauge(dx_buf *b, const char *name, const char *help, double v)
{
    int rc = prom_write_header(b, name, "gauge", help);
    return rc ? rc : prom_write_value(b, name, NULL, v);
}

int prom_write_family(dx_buf *b, const char *name, const char *help, const prom_family *f)
{
    int rc = prom_write_header(b, name, "counter", help);
    for (size_t i = 0; rc == 0 && i < f->n; i++)
        rc = prom_write_value(b, name, f->labels[i], (double)f->values[i]);
    return rc;
}

int prom_write_hist(dx_buf *b, const char *name, const char *help, const prom_hist *h)
{
    int rc = prom_write_header(b, name, "histogram", help);
    return rc ? rc : prom_write_hist_series(b, name, NULL, h);
}

int prom_write_hist_series(dx_buf *b, const char *name, const char *labels, const prom_hist *h)
{
    const char *l = labels && *labels ? labels : "", *sep = *l ? "," : "";
    const char *open = *l ? "{" : "", *close = *l ? "}" : "";
    uint64_t cum = 0;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < h->n_bounds; i++) {
        cum += h->counts[i];
        rc = dx_buf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, l, sep, h->bounds[i],
                           (unsigned long long)cum);
    }
    if (!rc)
        rc = dx_buf_printf(
            b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n%s_sum%s%s%s %.17g\n%s_count%s%s%s %llu\n", name,
            l, sep, (unsigned long long)h->count, name, open, l, close, h->sum, name, open, l,
            close, (unsigned long long)h->count);
    return rc;
}
