/* prom: Prometheus text exposition helpers — histograms with fixed buckets,
 * labelled counters, and writers for the text format (version 0.0.4).
 *
 * Not thread-safe: each process updates its metrics on its event loop's
 * thread and renders them there.  Shared by the node and the router. */
#ifndef PROM_H
#define PROM_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

#define PROM_MAX_BUCKETS 24

typedef struct {
    double bounds[PROM_MAX_BUCKETS];       /* upper bounds, ascending; +Inf implied */
    uint64_t counts[PROM_MAX_BUCKETS + 1]; /* per bucket (not cumulative) */
    size_t n_bounds;
    double sum;
    uint64_t count;
} prom_hist;

/* Latency buckets in seconds (1 ms .. 60 s). */
void prom_hist_init_latency(prom_hist *h);
void prom_hist_init(prom_hist *h, const double *bounds, size_t n);
void prom_hist_observe(prom_hist *h, double v);

/* A counter family keyed by its label set ("route=\"/x\",status=\"200\""). */
typedef struct {
    char **labels;
    uint64_t *values;
    size_t n, cap;
} prom_family;

void prom_family_init(prom_family *f);
void prom_family_free(prom_family *f);
int prom_family_add(prom_family *f, const char *labels, uint64_t v);
uint64_t prom_family_get(const prom_family *f, const char *labels);

int prom_write_header(dx_buf *b, const char *name, const char *type, const char *help);
int prom_write_value(dx_buf *b, const char *name, const char *labels, double v);
int prom_write_counter(dx_buf *b, const char *name, const char *help, double v);
int prom_write_gauge(dx_buf *b, const char *name, const char *help, double v);
int prom_write_family(dx_buf *b, const char *name, const char *help, const prom_family *f);
int prom_write_hist(dx_buf *b, const char *name, const char *help, const prom_hist *h);
/* One labelled series of a histogram family ("stage=\"x\""; NULL or "" for
 * none), without the HELP/TYPE header: write that once with
 * prom_write_header(b, name, "histogram", help), then each series. */
int prom_write_hist_series(dx_buf *b, const char *name, const char *labels, const prom_hist *h);

#endif
