/* dx_clock: monotonic time for latencies and timeouts. */
#ifndef DX_CLOCK_H
#define DX_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t dx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double dx_now_s(void)
{
    return (double)dx_now_ns() * 1e-9;
}

#endif
