/* dx_alloc: counting allocator with fault injection.
 *
 * Each block carries a 16-byte header holding its size, so frees can be
 * counted without a side table.  Counters are atomics: the engine thread, the
 * event loop and the transfer progress thread all allocate. */
#include "dx_alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HDR 16

static atomic_size_t g_live_bytes;
static atomic_size_t g_live_count;
static atomic_size_t g_total_count;
static atomic_size_t g_failed_count;
static atomic_long g_fail_countdown;
static atomic_int g_fail_sticky;
/* Net bytes this thread allocated (minus what it freed): differences around
 * a piece of work measure what that work left allocated. */
static _Thread_local long long t_net_bytes;

long long dx_alloc_thread_bytes(void)
{
    return t_net_bytes;
}

/* The meter this thread counts in (dx_alloc_meter_begin), its net bytes
 * when it began, what it has counted, and whether it refused. */
static _Thread_local dx_alloc_meter *t_meter;
static _Thread_local long long t_meter_base, t_meter_counted;
static _Thread_local int t_meter_refused;

void dx_alloc_meter_begin(dx_alloc_meter *m)
{
    t_meter = m;
    t_meter_base = t_net_bytes;
    t_meter_counted = 0;
    t_meter_refused = 0;
}

void dx_alloc_meter_end(void)
{
    if (t_meter) atomic_fetch_sub(&t_meter->used, t_meter_counted);
    t_meter = NULL;
    t_meter_counted = 0;
}

long long dx_alloc_meter_keep(void)
{
    long long kept = t_meter ? t_meter_counted : 0;
    t_meter = NULL;
    t_meter_counted = 0;
    return kept;
}

void dx_alloc_meter_put(dx_alloc_meter *m, long long bytes)
{
    if (m && bytes > 0) atomic_fetch_sub(&m->used, bytes);
}

int dx_alloc_meter_refused(void)
{
    return t_meter_refused;
}

/* Counts `grow` more bytes of this thread in its meter first; 1 (and
 * nothing counted) when they do not fit. */
static int meter_refuses(size_t grow)
{
    if (!t_meter) return 0;
    long long want = t_net_bytes + (long long)grow - t_meter_base;
    if (want <= t_meter_counted) return 0;
    long long delta = want - t_meter_counted;
    if (atomic_fetch_add(&t_meter->used, delta) + delta > atomic_load(&t_meter->room)) {
        atomic_fetch_sub(&t_meter->used, delta);
        t_meter_refused = 1;
        return 1;
    }
    t_meter_counted = want;
    return 0;
}

/* After a free: what this thread no longer holds leaves its meter. */
static void meter_shrink(void)
{
    if (!t_meter) return;
    long long want = t_net_bytes - t_meter_base;
    if (want < 0) want = 0;
    if (want >= t_meter_counted) return;
    atomic_fetch_sub(&t_meter->used, t_meter_counted - want);
    t_meter_counted = want;
}

/* A refusal is a failed allocation like any other (callers tell them by
 * dx_alloc_failed_count). */
static int meter_fail(size_t grow)
{
    if (!meter_refuses(grow)) return 0;
    atomic_fetch_add(&g_failed_count, 1);
    return 1;
}

static int should_fail(void)
{
    long c = atomic_load_explicit(&g_fail_countdown, memory_order_relaxed);
    if (c <= 0) return 0;
    if (atomic_fetch_sub(&g_fail_countdown, 1) != 1) return 0;
    if (atomic_load(&g_fail_sticky)) atomic_store(&g_fail_countdown, 1);
    atomic_fetch_add(&g_failed_count, 1);
    return 1;
}

size_t dx_alloc_failed_count(void)
{
    return atomic_load_explicit(&g_failed_count, memory_order_relaxed);
}

void dx_alloc_fail_after(long n, int sticky)
{
    atomic_store(&g_fail_sticky, sticky);
    atomic_store(&g_fail_countdown, n > 0 ? n : 0);
}

static void *account(unsigned char *raw, size_t size)
{
    if (!raw) {
        atomic_fetch_add(&g_failed_count, 1);
        return NULL;
    }
    memcpy(raw, &size, sizeof size);
    t_net_bytes += (long long)size;
    atomic_fetch_add_explicit(&g_live_bytes, size, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_live_count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_total_count, 1, memory_order_relaxed);
    return raw + HDR;
}

void *dx_malloc(size_t size)
{
    if (size > SIZE_MAX - HDR || should_fail() || meter_fail(size)) return NULL;
    return account(malloc(size + HDR), size);
}

void *dx_calloc(size_t n, size_t size)
{
    size_t total;
    if (dx_mul_overflow(n, size, &total) || total > SIZE_MAX - HDR || should_fail() ||
        meter_fail(total))
        return NULL;
    return account(calloc(1, total + HDR), total);
}

void dx_free(void *p)
{
    if (!p) return;
    unsigned char *raw = (unsigned char *)p - HDR;
    size_t size;
    memcpy(&size, raw, sizeof size);
    t_net_bytes -= (long long)size;
    meter_shrink();
    atomic_fetch_sub_explicit(&g_live_bytes, size, memory_order_relaxed);
    atomic_fetch_sub_explicit(&g_live_count, 1, memory_order_relaxed);
    free(raw);
}

void *dx_realloc(void *p, size_t size)
{
    if (!p) return dx_malloc(size);
    if (size > SIZE_MAX - HDR || should_fail()) return NULL;
    unsigned char *raw = (unsigned char *)p - HDR;
    size_t old;
    memcpy(&old, raw, sizeof old);
    if (size > old && meter_fail(size - old)) return NULL;
    unsigned char *nraw = realloc(raw, size + HDR);
    if (!nraw) {
        atomic_fetch_add(&g_failed_count, 1);
        return NULL;
    }
    memcpy(nraw, &size, sizeof size);
    t_net_bytes += (long long)size - (long long)old;
    meter_shrink();
    atomic_fetch_sub_explicit(&g_live_bytes, old, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_live_bytes, size, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_total_count, 1, memory_order_relaxed);
    return nraw + HDR;
}

void *dx_memdup(const void *p, size_t n)
{
    void *q = dx_malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

char *dx_strndup(const char *s, size_t n)
{
    char *q = dx_malloc(n + 1);
    if (!q) return NULL;
    memcpy(q, s, n);
    q[n] = 0;
    return q;
}

char *dx_strdup(const char *s)
{
    return dx_strndup(s, strlen(s));
}

/* Aligned blocks: over-allocate, store the dx_malloc pointer just below the
 * aligned address. */
void *dx_aligned_alloc(size_t align, size_t size)
{
    if (align < sizeof(void *) || (align & (align - 1))) return NULL;
    size_t total;
    if (dx_add_overflow(size, align + sizeof(void *), &total)) return NULL;
    unsigned char *base = dx_calloc(1, total);
    if (!base) return NULL;
    uintptr_t a = ((uintptr_t)(base + sizeof(void *)) + align - 1) & ~(uintptr_t)(align - 1);
    ((void **)a)[-1] = base;
    return (void *)a;
}

void dx_aligned_free(void *p)
{
    if (p) dx_free(((void **)p)[-1]);
}

size_t dx_alloc_live_bytes(void)
{
    return atomic_load(&g_live_bytes);
}

size_t dx_alloc_live_count(void)
{
    return atomic_load(&g_live_count);
}

size_t dx_alloc_total_count(void)
{
    return atomic_load(&g_total_count);
}
