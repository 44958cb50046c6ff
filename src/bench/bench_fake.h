/* bench_fake: an OpenAI-compatible endpoint that answers at once, on a
 * thread of its own — what the benchmark client's own overhead is measured
 * against (`duplex bench` reports it next to every figure), and, with
 * faults switched on, what its tests run against: every Nth request answered
 * 500, left without an answer, or cut off mid-stream.
 *
 * GET /v1/models lists "fake"; POST /v1/chat/completions streams max_tokens
 * chunks of one word each, a finish chunk, a usage chunk and [DONE] (or a
 * JSON answer when stream is false). */
#ifndef BENCH_FAKE_H
#define BENCH_FAKE_H

#include <stdint.h>

#include "bench/bench_work.h"

typedef struct {
    unsigned fail_every;  /* every Nth chat request: 500 (0: never) */
    unsigned stall_every; /* every Nth: never answered */
    unsigned cut_every;   /* every Nth: the connection closes after two chunks */
} bench_fake_config;

typedef struct bench_fake bench_fake;

int bench_fake_start(const bench_fake_config *cfg, bench_fake **out);
int bench_fake_port(const bench_fake *f);
void bench_fake_stop(bench_fake *f);

/* The benchmark client's own time to first token (p50, ms): the workload
 * run against an instant endpoint; BENCH_UNKNOWN if it could not run. */
double bench_fake_overhead_ms(const bench_workload *w, bench_text *text, const volatile int *stop);

#endif
