/* dx_alloc: the project allocator.  Every heap allocation goes through here so
 * that live bytes are counted (tests check for leaks by comparing counts) and
 * so that a test can make the N-th allocation fail to exercise out-of-memory
 * paths.  Large arenas (the KV pool) go through their own hook in the engine,
 * not through here.
 *
 * All returned memory is at least 16-byte aligned; dx_aligned_alloc gives any
 * power-of-two alignment and must be released with dx_aligned_free. */
#ifndef DX_ALLOC_H
#define DX_ALLOC_H

#include <stddef.h>

void *dx_malloc(size_t size);
void *dx_calloc(size_t n, size_t size); /* checks n*size for overflow */
void *dx_realloc(void *p, size_t size);
void dx_free(void *p);
char *dx_strdup(const char *s);
char *dx_strndup(const char *s, size_t n);
void *dx_memdup(const void *p, size_t n);

void *dx_aligned_alloc(size_t align, size_t size); /* zeroed */
void dx_aligned_free(void *p);

/* Bytes currently allocated through this module (all threads). */
size_t dx_alloc_live_bytes(void);
/* Number of live allocations. */
size_t dx_alloc_live_count(void);
/* Allocations made so far (all threads; dx_malloc, dx_calloc and every
 * dx_realloc count one each): tests check that a path allocates nothing. */
size_t dx_alloc_total_count(void);
/* Bytes the calling thread has allocated through this module minus those it
 * freed (any start value: use the difference around a piece of work to know
 * how much it left allocated, e.g. a parsed request's tree). */
long long dx_alloc_thread_bytes(void);

/* Allocations that failed so far (injected or real): a caller whose library
 * reports only "failed" (jansson) tells out-of-memory from bad input by it. */
size_t dx_alloc_failed_count(void);

/* Fault injection for tests: the n-th allocation from now fails (n >= 1),
 * and every later one too if `sticky`.  n = 0 disables. */
void dx_alloc_fail_after(long n, int sticky);

/* a*b (a+b) with overflow check: 0 and *out set, or 1 on overflow (a
 * yes/no, never an error code: the caller says what overflowed). */
static inline int dx_mul_overflow(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}
static inline int dx_add_overflow(size_t a, size_t b, size_t *out)
{
    return __builtin_add_overflow(a, b, out);
}

#endif
