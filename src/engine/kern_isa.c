/* kern_isa: which instruction set the kernels use.  Detected once from the
 * CPU (AVX-512 needs F/BW/VL/BF16/VNNI, AVX2 needs FMA and F16C), overridable
 * with DUPLEX_KERNELS=scalar|avx2|avx512 for tests and comparisons.  One
 * process uses one ISA throughout, so results stay bit-reproducible.
 *
 * Minimal version written alongside the attention kernels so that branch
 * builds on its own; the matmul branch has its own and the integrator keeps
 * one. */
#include <stdlib.h>
#include <string.h>

#include "base/dx_err.h"
#include "base/dx_log.h"
#include "engine/kern.h"

static int kern_isa_active = -1; /* enum kern_isa once chosen; read atomically */

enum kern_isa kern_isa_detect(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
        __builtin_cpu_supports("avx512vnni"))
        return KERN_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return KERN_AVX2;
    return KERN_SCALAR;
}

/* The env override may only lower the ISA: asking for one the CPU lacks
 * would crash on the first kernel, so it is refused with a warning. */
static enum kern_isa kern_isa_initial(void)
{
    enum kern_isa best = kern_isa_detect();
    const char *env = getenv("DUPLEX_KERNELS");
    if (!env || !*env) return best;
    for (int i = KERN_SCALAR; i <= KERN_AVX512; i++) {
        if (strcmp(env, kern_isa_name((enum kern_isa)i)) != 0) continue;
        if (i <= (int)best) return (enum kern_isa)i;
        DX_LOGW("DUPLEX_KERNELS=%s: CPU lacks it, using %s", env, kern_isa_name(best));
        return best;
    }
    DX_LOGW("DUPLEX_KERNELS=%s: unknown (scalar|avx2|avx512), using %s", env, kern_isa_name(best));
    return best;
}

enum kern_isa kern_get_isa(void)
{
    int isa = __atomic_load_n(&kern_isa_active, __ATOMIC_ACQUIRE);
    if (isa >= 0) return (enum kern_isa)isa;
    int want = (int)kern_isa_initial();
    int expected = -1;
    /* A racing first call computes the same value; whoever wins, all agree. */
    __atomic_compare_exchange_n(&kern_isa_active, &expected, want, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    return (enum kern_isa)__atomic_load_n(&kern_isa_active, __ATOMIC_ACQUIRE);
}

int kern_set_isa(enum kern_isa isa)
{
    if ((int)isa < KERN_SCALAR || (int)isa > KERN_AVX512)
        return dx_errf(DX_EINVAL, "kern_set_isa: unknown isa %d", (int)isa);
    if ((int)isa > (int)kern_isa_detect())
        return dx_errf(DX_EUNSUPPORTED, "kern_set_isa: CPU lacks %s", kern_isa_name(isa));
    __atomic_store_n(&kern_isa_active, (int)isa, __ATOMIC_RELEASE);
    return 0;
}

const char *kern_isa_name(enum kern_isa isa)
{
    switch (isa) {
    case KERN_SCALAR:
        return "scalar";
    case KERN_AVX2:
        return "avx2";
    case KERN_AVX512:
        return "avx512";
    }
    return "unknown";
}
