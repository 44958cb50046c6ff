/* dx_dtype: the type table (GGML's ids, names and block sizes, and for the
 * types duplex runs their row conversions) and the dispatch over it. */
#include "dx_dtype.h"
#include "dx_err.h"

#include <string.h>

typedef void (*to_f32_fn)(const void *src, float *dst, size_t n);
typedef void (*from_f32_fn)(const float *src, void *dst, size_t n);

typedef struct {
    const char *name;
    uint16_t block_elems, block_bytes;
    to_f32_fn to_f32; /* NULL: not supported */
    from_f32_fn from_f32;
} dtype_info;

static void f32_to(const void *s, float *d, size_t n)
{
    memcpy(d, s, n * sizeof(float));
}
static void f32_from(const float *s, void *d, size_t n)
{
    memcpy(d, s, n * sizeof(float));
}

/* dx_half / dx_quant / dx_kquant's typed rows behind the table's untyped
 * signature. */
#define ROW_FNS(T, TO, FROM)                                                                       \
    static void T##_to(const void *s, float *d, size_t n)                                          \
    {                                                                                              \
        TO(s, d, n);                                                                               \
    }                                                                                              \
    static void T##_from(const float *s, void *d, size_t n)                                        \
    {                                                                                              \
        FROM(s, d, n);                                                                             \
    }
ROW_FNS(f16, dx_f16_to_f32_row, dx_f32_to_f16_row)
ROW_FNS(bf16, dx_bf16_to_f32_row, dx_f32_to_bf16_row)
ROW_FNS(q8_0, dx_q8_0_to_f32_row, dx_f32_to_q8_0_row)
ROW_FNS(q4_0, dx_q4_0_to_f32_row, dx_f32_to_q4_0_row)
ROW_FNS(q4_1, dx_q4_1_to_f32_row, dx_f32_to_q4_1_row)
ROW_FNS(q5_0, dx_q5_0_to_f32_row, dx_f32_to_q5_0_row)
ROW_FNS(q5_1, dx_q5_1_to_f32_row, dx_f32_to_q5_1_row)
ROW_FNS(iq4_nl, dx_iq4_nl_to_f32_row, dx_f32_to_iq4_nl_row)
ROW_FNS(q2_k, dx_q2_k_to_f32_row, dx_f32_to_q2_k_row)
ROW_FNS(q3_k, dx_q3_k_to_f32_row, dx_f32_to_q3_k_row)
ROW_FNS(q4_k, dx_q4_k_to_f32_row, dx_f32_to_q4_k_row)
ROW_FNS(q5_k, dx_q5_k_to_f32_row, dx_f32_to_q5_k_row)
ROW_FNS(q6_k, dx_q6_k_to_f32_row, dx_f32_to_q6_k_row)
ROW_FNS(iq4_xs, dx_iq4_xs_to_f32_row, dx_f32_to_iq4_xs_row)
#undef ROW_FNS

#define RUNS(T) T##_to, T##_from
/* GGML's type traits (ggml.c): every id a GGUF file may hold.  Retired ids
 * (4, 5, the 31-33 and 36-38 repacked layouts) are left out. */
static const dtype_info k_types[DX_DTYPE_ID_MAX] = {
    [0] = {"f32", 1, 4, RUNS(f32)},          [1] = {"f16", 1, 2, RUNS(f16)},
    [2] = {"q4_0", 32, 18, RUNS(q4_0)},      [3] = {"q4_1", 32, 20, RUNS(q4_1)},
    [6] = {"q5_0", 32, 22, RUNS(q5_0)},      [7] = {"q5_1", 32, 24, RUNS(q5_1)},
    [8] = {"q8_0", 32, 34, RUNS(q8_0)},      [9] = {"q8_1", 32, 36, NULL, NULL},
    [10] = {"q2_K", 256, 84, RUNS(q2_k)},    [11] = {"q3_K", 256, 110, RUNS(q3_k)},
    [12] = {"q4_K", 256, 144, RUNS(q4_k)},   [13] = {"q5_K", 256, 176, RUNS(q5_k)},
    [14] = {"q6_K", 256, 210, RUNS(q6_k)},   [15] = {"q8_K", 256, 292, NULL, NULL},
    [16] = {"iq2_xxs", 256, 66, NULL, NULL}, [17] = {"iq2_xs", 256, 74, NULL, NULL},
    [18] = {"iq3_xxs", 256, 98, NULL, NULL}, [19] = {"iq1_s", 256, 50, NULL, NULL},
    [20] = {"iq4_nl", 32, 18, RUNS(iq4_nl)}, [21] = {"iq3_s", 256, 110, NULL, NULL},
    [22] = {"iq2_s", 256, 82, NULL, NULL},   [23] = {"iq4_xs", 256, 136, RUNS(iq4_xs)},
    [24] = {"i8", 1, 1, NULL, NULL},         [25] = {"i16", 1, 2, NULL, NULL},
    [26] = {"i32", 1, 4, NULL, NULL},        [27] = {"i64", 1, 8, NULL, NULL},
    [28] = {"f64", 1, 8, NULL, NULL},        [29] = {"iq1_m", 256, 56, NULL, NULL},
    [30] = {"bf16", 1, 2, RUNS(bf16)},       [34] = {"tq1_0", 256, 54, NULL, NULL},
    [35] = {"tq2_0", 256, 66, NULL, NULL},   [39] = {"mxfp4", 32, 17, NULL, NULL},
    [40] = {"nvfp4", 64, 36, NULL, NULL},    [41] = {"q1_0", 128, 18, NULL, NULL},
    [42] = {"q2_0", 64, 18, NULL, NULL},
};
#undef RUNS

/* The supported ids in the order people read them (floats, then by bits). */
static const enum dx_dtype k_supported[] = {DX_F32,  DX_F16,    DX_BF16,   DX_Q8_0, DX_Q6_K,
                                            DX_Q5_K, DX_Q5_1,   DX_Q5_0,   DX_Q4_K, DX_Q4_1,
                                            DX_Q4_0, DX_IQ4_NL, DX_IQ4_XS, DX_Q3_K, DX_Q2_K};
/* Kept in step with k_supported (test_quant checks it). */
static const char k_supported_names[] = "f32, f16, bf16, q8_0, q6_K, q5_K, q5_1, q5_0, q4_K, "
                                        "q4_1, q4_0, iq4_nl, iq4_xs, q3_K, q2_K";

static const dtype_info *info(int type)
{
    if (type < 0 || type >= DX_DTYPE_ID_MAX || !k_types[type].name) return NULL;
    return &k_types[type];
}

const char *dx_dtype_name(int type)
{
    const dtype_info *t = info(type);
    return t ? t->name : NULL;
}

int dx_dtype_supported(int type)
{
    const dtype_info *t = info(type);
    return t && t->to_f32;
}

const char *dx_dtype_supported_names(void)
{
    return k_supported_names;
}

int dx_dtype_parse(const char *s, enum dx_dtype *out)
{
    for (size_t i = 0; i < DX_ARRAY_LEN(k_supported); i++)
        if (s && strcmp(s, dx_dtype_name(k_supported[i])) == 0) {
            *out = k_supported[i];
            return 0;
        }
    return dx_errf(DX_EINVAL, "unknown dtype '%s' (want one of %s)", s ? s : "", k_supported_names);
}

size_t dx_dtype_block_elems(int type)
{
    const dtype_info *t = info(type);
    return t ? t->block_elems : 0;
}

size_t dx_dtype_block_bytes(int type)
{
    const dtype_info *t = info(type);
    return t ? t->block_bytes : 0;
}

size_t dx_dtype_row_bytes(int type, size_t n)
{
    size_t be = dx_dtype_block_elems(type);
    if (!be || n % be) return 0;
    return (n / be) * dx_dtype_block_bytes(type);
}

/* The table entry for converting a row of n elements, or an error. */
static int row_check(int type, size_t n, const dtype_info **out)
{
    const dtype_info *t = info(type);
    if (!t || !t->to_f32)
        return dx_errf(DX_EUNSUPPORTED, "tensor type %d (%s) is not supported (supported: %s)",
                       type, t ? t->name : "unknown", k_supported_names);
    if (n % t->block_elems)
        return dx_errf(DX_EINVAL, "%s row of %zu elements (not a multiple of %u)", t->name, n,
                       (unsigned)t->block_elems);
    *out = t;
    return 0;
}

int dx_dtype_to_f32_row(int type, const void *src, float *dst, size_t n)
{
    const dtype_info *t;
    int rc = row_check(type, n, &t);
    if (rc) return rc;
    t->to_f32(src, dst, n);
    return 0;
}

int dx_dtype_from_f32_row(int type, const float *src, void *dst, size_t n)
{
    const dtype_info *t;
    int rc = row_check(type, n, &t);
    if (rc) return rc;
    if (!t->from_f32) return dx_errf(DX_EUNSUPPORTED, "no quantiser for %s rows yet", t->name);
    t->from_f32(src, dst, n);
    return 0;
}
