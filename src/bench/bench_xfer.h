/* bench_xfer: `duplex bench xfer` — KV block transfer throughput and
 * latency between two processes, per transport, next to a memcpy of the same
 * bytes in one process and a plain loopback TCP socket. */
#ifndef BENCH_XFER_H
#define BENCH_XFER_H

#include <stdio.h>

typedef struct {
    const char *duplex_bin; /* this binary, to start the holder (`kv hold`) */
    unsigned blocks;        /* blocks per pull; default 128 (≈ 235 MB) */
    unsigned reps;          /* pulls per transport; default 5 (median reported) */
    unsigned lat_reps;      /* single-block pulls for latency; default 50 */
    const char *transports; /* comma list of UCX_TLS values; "default" = UCX's choice */
    const char *secret_file; /* --kv-secret-file for both ends; NULL: none (loopback) */
} bench_xfer_config;

int bench_xfer_run(const bench_xfer_config *cfg, FILE *out);

#endif
