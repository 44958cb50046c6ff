/* Fuzz target for results.json as `duplex bench` reads it back
 * (bench_read_json, used to re-report and by the tests): any bytes give a
 * result or an error naming the file, never a crash or a half-filled
 * result; what it accepts, it writes back and reads again to the same
 * records. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench/bench_report.h"

/* The bytes as a file bench_read_json can open. */
static int as_file(const uint8_t *data, size_t size, char *path, size_t cap)
{
    int fd = memfd_create("fuzz_bench_json", 0);
    if (fd < 0) abort();
    if (size && write(fd, data, size) != (ssize_t)size) abort();
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = as_file(data, size, path, sizeof path);
    bench_workload w;
    bench_meta m;
    bench_results r;
    int rc = bench_read_json(path, &w, &m, &r);
    close(fd);
    if (rc) {
        if (r.n || r.rec) abort(); /* nothing half-read */
        return 0;
    }
    char out[] = "/tmp/fuzz_bench_json_XXXXXX";
    int ofd = mkstemp(out);
    if (ofd < 0) abort();
    close(ofd);
    bench_workload w2;
    bench_meta m2;
    bench_results r2;
    if (bench_write_json(out, &w, &m, &r) || bench_read_json(out, &w2, &m2, &r2)) abort();
    if (r2.n != r.n) abort();
    for (size_t i = 0; i < r.n; i++)
        if (r2.rec[i].turn != r.rec[i].turn || r2.rec[i].err != r.rec[i].err ||
            r2.rec[i].prompt_tokens != r.rec[i].prompt_tokens)
            abort();
    unlink(out);
    bench_results_free(&r);
    bench_results_free(&r2);
    return 0;
}
