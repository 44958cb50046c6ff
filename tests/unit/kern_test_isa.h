/* kern_test_isa: kernel tests that run once per instruction set.  Each case
 * is its own cmocka test whose initial state names the ISA it checks, so a
 * CPU that lacks an ISA reports that ISA's cases skipped (cmocka skip())
 * instead of passing them silently.  Include after cmocka.h. */
#ifndef KERN_TEST_ISA_H
#define KERN_TEST_ISA_H

#include "engine/kern/kern.h"

static const enum kern_isa kti_isas[] = {KERN_SCALAR, KERN_AVX2, KERN_AVX512, KERN_AMX};

/* The case's ISA, made active; skips the case on a CPU without it. */
static inline enum kern_isa kti_use(void **state)
{
    enum kern_isa isa = *(const enum kern_isa *)*state;
    if (isa > kern_isa_detect()) {
        print_message("this CPU lacks %s: its kernels are not checked here\n", kern_isa_name(isa));
        skip();
    }
#ifdef __SANITIZE_THREAD__
    /* ThreadSanitizer looks for races, which do not depend on the ISA (the
     * kernels are the same threads over the same data): the best one runs,
     * the others' results are checked in the release and asan variants.
     * Every case on every ISA under TSan took test_fwd past 6 minutes. */
    if (isa != kern_isa_detect()) {
        print_message("tsan: %s's results are checked in release and asan; only %s runs here\n",
                      kern_isa_name(isa), kern_isa_name(kern_isa_detect()));
        skip();
    }
#endif
    assert_int_equal(kern_set_isa(isa), 0);
    return isa;
}

/* After each case: the best ISA again, as the other tests expect. */
static inline int kti_restore(void **state)
{
    (void)state;
    return kern_set_isa(kern_isa_detect());
}

#define KTI_CASE(f, isa, name)                                                                     \
    {                                                                                              \
#f "(" name ")", f, NULL, kti_restore, (void *)&kti_isas[isa]                              \
    }
/* f once per fast ISA (each compared against the scalar reference). */
#define KTI_FAST(f) KTI_CASE(f, KERN_AVX2, "avx2"), KTI_CASE(f, KERN_AVX512, "avx512")
/* f once per ISA, scalar included. */
#define KTI_ALL(f) KTI_CASE(f, KERN_SCALAR, "scalar"), KTI_FAST(f)
/* f on AMX too, for the matmul tests: the AVX-512 path with the AMX
 * kernels (kern_mm_amx.c) on the groups of 16 tokens x 16 rows they take. */
#define KTI_AMX(f) KTI_CASE(f, KERN_AMX, "amx")

#endif
