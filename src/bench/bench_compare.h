/* bench_compare: `duplex bench compare` — the same workload against each
 * serving mode, one after the other on this machine and model, each started
 * afresh with `duplex up` (a child process of this binary) and stopped after
 * its run:
 *
 *   uni-nocache  P/D, one-way KV, prefix caching off on the prefill node (the
 *                baseline vLLM's and AWS's measurements used); every turn
 *                through the prefill node
 *   uni          the same with prefix caching on
 *   bidi         P/D, bidirectional KV, prefix caching off on the prefill
 *                node, every turn through the prefill node: the history
 *                comes back from the decode node
 *   bidi-rt      bidirectional with the router's defaults (small new parts
 *                prefilled on the decode node that holds the history)
 *   colocated    one `--role both` node behind the router: what a
 *                disaggregated system chases
 *
 * MODE@DTYPE (bidi-rt@q8_0) runs the mode with that KV dtype on every node
 * (`duplex up --kv-dtype`): a mode and its dtypes are series of their own,
 * interleaved like the modes.
 *
 * With w->rounds > 1 the modes run in turn, round after round (A B C A B C
 * ...), each time started afresh, and every figure is over all rounds'
 * requests: a slow minute on a shared machine then falls on every mode.
 *
 * Before the modes, the client's own overhead is measured against an instant
 * endpoint (bench_fake).  Each mode's requests go to DIR/<mode>/results.json
 * (and duplex up's log to DIR/<mode>/up.log); DIR/summary.md has the per-turn
 * TTFT by mode with the ratios and where the KV came from (the nodes'
 * /metrics before and after), DIR/ttft.svg the plot. */
#ifndef BENCH_COMPARE_H
#define BENCH_COMPARE_H

#include <stdint.h>
#include <stdio.h>

#include "bench/bench_run.h"
#include "bench/bench_work.h"

typedef struct {
    const char *exe;      /* this duplex binary */
    const char *model;    /* GGUF file (duplex up's default when NULL) */
    const char *modes;    /* comma-separated, from the list above */
    long kv_cache_mb;     /* per node; 0: serve's default */
    const char *kv_dtype; /* every node's unless an entry says MODE@DTYPE; NULL: serve's */
    int threads_per_node;
    const bench_workload *w;
    bench_text *text;
    const char *tokenizer; /* for the report only */
    const char *out_dir;
    enum bench_progress progress;
    const volatile int *stop;
    FILE *out; /* the per-turn table at the end (stdout) */
    /* A prefix sweep's table (or NULL): one row is appended — the prefix,
     * each mode's last-turn TTFT p50 (ms), uni-nocache / bidi. */
    FILE *sweep;
    uint32_t sweep_prefix;
} bench_compare_config;

/* Checks the list against the known modes: DX_EINVAL naming the bad one. */
int bench_compare_check_modes(const char *modes);
int bench_compare_run(const bench_compare_config *c);

#endif
