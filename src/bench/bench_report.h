/* bench_report: what a benchmark run leaves behind — results.json (every
 * request), summary.md (tables: overall figures, TTFT per turn by mode,
 * ratios, where the KV came from) and ttft.svg (TTFT against turn, one line
 * per mode) — and the statistics behind them (mean, p50, p90, p99, nearest
 * rank).  The writers are pure functions of their inputs, so a fixed
 * results.json gives a fixed summary (the tests compare it byte for byte). */
#ifndef BENCH_REPORT_H
#define BENCH_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include "bench/bench_run.h"
#include "bench/bench_work.h"

typedef struct {
    size_t n;
    double mean, p50, p90, p99;
} bench_stat;

/* Sorts v in place. */
void bench_stat_of(double *v, size_t n, bench_stat *out);

/* Where the prompts' KV came from during a run (the nodes' /metrics,
 * after minus before). */
typedef struct {
    int has; /* 0: not measured (an endpoint that is not duplex) */
    double bytes_p2d, bytes_d2p;
    double tok_local, tok_pulled, tok_computed;
    double pulls_p2d, pulls_d2p;   /* pulls tried, by direction */
    double blocks_p2d, blocks_d2p; /* blocks pulled */
    double revoked_lru;            /* retained conversations revoked to make room */
} bench_kv;

typedef struct {
    const char *name; /* the mode, or "run" */
    const bench_results *res;
    bench_kv kv;
} bench_series;

typedef struct {
    const char *url;
    double overhead_ms; /* the client's own TTFT against an instant endpoint; < 0: unknown */
    int tokens_exact;   /* lengths counted by the model's tokenizer */
    bench_kv kv;        /* bench compare: the mode's node counters (kept in results.json) */
} bench_meta;

int bench_write_json(const char *path, const bench_workload *w, const bench_meta *m,
                     const bench_results *r);
/* Reads what bench_write_json wrote (for re-reporting and the tests). */
int bench_read_json(const char *path, bench_workload *w, bench_meta *m, bench_results *r);

int bench_write_summary(FILE *f, const bench_workload *w, const bench_meta *m,
                        const bench_series *s, size_t n);
int bench_write_svg(FILE *f, const bench_workload *w, const bench_series *s, size_t n);
/* The terminal's per-turn TTFT table (p50, ms) with the headline ratios. */
void bench_print_turns(FILE *f, const bench_workload *w, const bench_series *s, size_t n);

/* Per-turn TTFT p50 of the successful requests, in seconds (BENCH_UNKNOWN:
 * none). */
double bench_turn_p50(const bench_results *r, uint32_t turn);

#endif
