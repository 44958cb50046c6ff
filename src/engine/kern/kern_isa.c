/* kern_isa: which instruction set the kernels use.  Detected once from the
 * CPU (the AVX-512 path needs F, BW, VL, DQ and VNNI: Ice Lake, Sapphire
 * Rapids, Zen 4; Skylake-X runs the AVX2 path; AMX needs AMX-TILE and AMX-INT8 and the kernel's
 * leave to use the 8 KiB tile state), overridable with DUPLEX_KERNELS=scalar|avx2|avx512|amx for
 * comparisons and with kern_set_isa() in tests.  One process should keep one
 * ISA while it computes results that must match bit for bit. */
#include "engine/kern/kern.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "base/dx_err.h"
#include "base/dx_log.h"

static atomic_int kern_isa_active = -1; /* -1: not chosen yet */

/* AMX: the CPU's AMX-TILE (CPUID.7.0:EDX bit 24) and AMX-INT8 (bit 25)
 * with AVX512-VBMI (ECX bit 1; the weight unpacking's byte permutes), and
 * Linux's leave for this process to use the tile data state (XTILEDATA,
 * xfeature 18), which it grants once per process to every thread.  Asked
 * once; a kernel that says no (older than 5.16, or a VM without it) leaves
 * the AVX-512 path. */
static int amx_usable(void)
{
#if defined(__x86_64__) && defined(__linux__)
    static atomic_int known = -1;
    int k = atomic_load(&known);
    if (k >= 0) return k;
    unsigned a, b, c, d;
    int ok = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1) && (c >> 1 & 1))
        ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
    atomic_store(&known, ok);
    return ok;
#else
    return 0;
#endif
}

enum kern_isa kern_isa_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    /* f16c has no __builtin_cpu_supports name in every gcc; every AVX2 CPU has it. */
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("avx512vnni"); /* no BF16 instructions: Ice Lake too */
    if (avx512) return amx_usable() ? KERN_AMX : KERN_AVX512;
    if (avx2) return KERN_AVX2;
#endif
    return KERN_SCALAR;
}

/* Each knob's choices by value, for its _name() and its variable. */
static const char *const k_isa_names[] = {"scalar", "avx2", "avx512", "amx"};
static const char *const k_bf16_dot_names[] = {"fma", "dpbf16"};
static const char *const k_decode_names[] = {"tiles", "rows"};
_Static_assert(KERN_AMX == 3 && KERN_BF16_DPBF16 == 1 && KERN_DECODE_ROWS == 1,
               "the names follow the enums' values");

static const char *choice_name(const char *const *names, int n, int v)
{
    return v >= 0 && v < n ? names[v] : "unknown";
}

/* The choice environment variable `var` names (its index in names), or
 * `best` when it is unset, or, with a warning, when it names none. */
static int env_choice(const char *var, const char *const *names, int n, int best)
{
    const char *s = getenv(var);
    if (!s || !*s) return best;
    char want[64] = "";
    for (int i = 0; i < n; i++) {
        if (!strcmp(s, names[i])) return i;
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", i ? "|" : "", names[i]);
    }
    DX_LOGW("%s=%s: unknown (want %s), using %s", var, s, want, names[best]);
    return best;
}

const char *kern_isa_name(enum kern_isa isa)
{
    return choice_name(k_isa_names, (int)DX_ARRAY_LEN(k_isa_names), (int)isa);
}

/* DUPLEX_KERNELS, clamped to what the CPU has. */
static enum kern_isa kern_isa_from_env(void)
{
    enum kern_isa best = kern_isa_detect();
    int i = env_choice("DUPLEX_KERNELS", k_isa_names, (int)DX_ARRAY_LEN(k_isa_names), (int)best);
    if (i <= (int)best) return (enum kern_isa)i;
    DX_LOGW("DUPLEX_KERNELS=%s: this CPU lacks it, using %s", k_isa_names[i], kern_isa_name(best));
    return best;
}

/* *slot, chosen by pick() on the first call (-1: not yet). */
static int kern_choose_once(atomic_int *slot, int (*pick)(void))
{
    int v = atomic_load_explicit(slot, memory_order_relaxed);
    if (v >= 0) return v;
    int want = pick(), expected = -1;
    /* Racing first callers agree: the first to store wins, the rest load it. */
    if (!atomic_compare_exchange_strong(slot, &expected, want)) return expected;
    return want;
}

static int isa_pick(void)
{
    return (int)kern_isa_from_env();
}

enum kern_isa kern_get_isa(void)
{
    return (enum kern_isa)kern_choose_once(&kern_isa_active, isa_pick);
}

int kern_set_isa(enum kern_isa isa)
{
    if ((int)isa < KERN_SCALAR || (int)isa > KERN_AMX)
        return dx_errf(DX_EINVAL, "kern_set_isa: unknown ISA %d", (int)isa);
    if ((int)isa > (int)kern_isa_detect())
        return dx_errf(DX_EUNSUPPORTED, "kern_set_isa: this CPU does not support %s",
                       kern_isa_name(isa));
    atomic_store(&kern_isa_active, (int)isa);
    return 0;
}

/* ---- how BF16 is multiplied ------------------------------------------------------ */

static atomic_int kern_bf16_dot_active = -1; /* -1: not chosen yet */

static int bf16_dp_usable(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

enum kern_bf16_dot kern_bf16_dot_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    /* AMD's cores issue vdpbf16ps once a cycle like an FMA (Zen 4: 0.87 of
     * an FMA's time for twice its products); Intel's every ~2 cycles */
    if (bf16_dp_usable() && __builtin_cpu_is("amd")) return KERN_BF16_DPBF16;
#endif
    return KERN_BF16_FMA;
}

const char *kern_bf16_dot_name(enum kern_bf16_dot d)
{
    return choice_name(k_bf16_dot_names, (int)DX_ARRAY_LEN(k_bf16_dot_names), (int)d);
}

/* DUPLEX_BF16_DOT, where the CPU has it. */
static enum kern_bf16_dot kern_bf16_dot_from_env(void)
{
    int d = env_choice("DUPLEX_BF16_DOT", k_bf16_dot_names, (int)DX_ARRAY_LEN(k_bf16_dot_names),
                       (int)kern_bf16_dot_detect());
    if (d != KERN_BF16_DPBF16 || bf16_dp_usable()) return (enum kern_bf16_dot)d;
    DX_LOGW("DUPLEX_BF16_DOT=dpbf16: this CPU lacks AVX512-BF16, using fma");
    return KERN_BF16_FMA;
}

static int bf16_dot_pick(void)
{
    return (int)kern_bf16_dot_from_env();
}

enum kern_bf16_dot kern_get_bf16_dot(void)
{
    return (enum kern_bf16_dot)kern_choose_once(&kern_bf16_dot_active, bf16_dot_pick);
}

int kern_set_bf16_dot(enum kern_bf16_dot d)
{
    if ((int)d != KERN_BF16_FMA && (int)d != KERN_BF16_DPBF16)
        return dx_errf(DX_EINVAL, "kern_set_bf16_dot: unknown way %d", (int)d);
    if (d == KERN_BF16_DPBF16 && !bf16_dp_usable())
        return dx_errf(DX_EUNSUPPORTED, "kern_set_bf16_dot: this CPU lacks AVX512-BF16");
    atomic_store(&kern_bf16_dot_active, (int)d);
    return 0;
}

/* ---- how a lone token walks the streamed weight types ---------------------------- */

static atomic_int kern_decode_active = -1; /* -1: not chosen yet */

enum kern_decode kern_decode_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    /* AVX-512 AMD (Zen 4 on): measured.  Zen 2/3 run the AVX2 path, whose
     * single row is one chain of FMAs at ~4 bytes a cycle, near what a
     * core streams: unmeasured there, so opt-in (DUPLEX_DECODE=rows) */
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd") && kern_isa_detect() >= KERN_AVX512) return KERN_DECODE_ROWS;
#endif
    return KERN_DECODE_TILES;
}

const char *kern_decode_name(enum kern_decode d)
{
    return choice_name(k_decode_names, (int)DX_ARRAY_LEN(k_decode_names), (int)d);
}

static int decode_pick(void)
{
    return env_choice("DUPLEX_DECODE", k_decode_names, (int)DX_ARRAY_LEN(k_decode_names),
                      (int)kern_decode_detect());
}

enum kern_decode kern_get_decode(void)
{
    return (enum kern_decode)kern_choose_once(&kern_decode_active, decode_pick);
}

int kern_set_decode(enum kern_decode d)
{
    if ((int)d != KERN_DECODE_TILES && (int)d != KERN_DECODE_ROWS)
        return dx_errf(DX_EINVAL, "kern_set_decode: unknown way %d", (int)d);
    atomic_store(&kern_decode_active, (int)d);
    return 0;
}
