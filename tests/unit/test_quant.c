/* Unit tests for the type table (dx_dtype) and the block formats (dx_quant):
 *  - the table: GGML's ids, names and sizes, what is supported, parsing;
 *  - dequantisation of hand-built blocks against each format's definition,
 *    written here from the GGUF layout (every nibble and qh bit position,
 *    positive, negative, zero and subnormal scales, the _1 minimum, the
 *    IQ4_NL codebook), plus literal blocks decoded by hand;
 *  - quantise -> dequantise error bounds on random rows, zero and constant
 *    blocks, determinism (the same row gives the same bytes, a row is its
 *    blocks quantised one by one).
 * The bounds (s the grid step, |d| for Q4_0 / Q5_0, (max - min) / levels
 * for the _1 formats): every element within s (Q4_0 / Q5_0, whose grid
 * ends one step short on the side opposite the largest element) or s / 2
 * (_1), plus the f16 rounding of the scale and minimum (2^-11 of them per
 * unit of q); the RMS error over all blocks within 0.35 s (uniform
 * rounding gives s / sqrt(12) = 0.29 s).  IQ4_NL: RMS error below Q4_0's on the same
 * rows, the point of its codebook. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"

static const int blk_types[] = {DX_Q8_0, DX_Q4_0, DX_Q4_1, DX_Q5_0, DX_Q5_1, DX_IQ4_NL};

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float rnd(void) /* uniform [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ---- the table ---- */

static void test_table(void **state)
{
    (void)state;
    static const struct {
        int id;
        const char *name;
        size_t elems, bytes;
        int supported;
    } want[] = {
        {0, "f32", 1, 4, 1},       {1, "f16", 1, 2, 1},       {2, "q4_0", 32, 18, 1},
        {3, "q4_1", 32, 20, 1},    {6, "q5_0", 32, 22, 1},    {7, "q5_1", 32, 24, 1},
        {8, "q8_0", 32, 34, 1},    {9, "q8_1", 32, 36, 0},    {12, "q4_K", 256, 144, 1},
        {14, "q6_K", 256, 210, 1}, {20, "iq4_nl", 32, 18, 1}, {23, "iq4_xs", 256, 136, 1},
        {15, "q8_K", 256, 292, 0}, {30, "bf16", 1, 2, 1},     {39, "mxfp4", 32, 17, 0},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(want); i++) {
        assert_string_equal(dx_dtype_name(want[i].id), want[i].name);
        assert_int_equal(dx_dtype_block_elems(want[i].id), want[i].elems);
        assert_int_equal(dx_dtype_block_bytes(want[i].id), want[i].bytes);
        assert_int_equal(dx_dtype_supported(want[i].id), want[i].supported);
    }
    static const int unknown[] = {-1, 4, 5, 31, 33, 36, 38, 47, 48, 1000};
    for (size_t i = 0; i < DX_ARRAY_LEN(unknown); i++) {
        assert_null(dx_dtype_name(unknown[i]));
        assert_int_equal(dx_dtype_block_elems(unknown[i]), 0);
        assert_false(dx_dtype_supported(unknown[i]));
    }
    assert_int_equal(dx_dtype_row_bytes(DX_Q4_0, 96), 54);
    assert_int_equal(dx_dtype_row_bytes(DX_Q5_1, 64), 48);
    assert_int_equal(dx_dtype_row_bytes(DX_IQ4_NL, 48), 0);
    assert_int_equal(dx_dtype_row_bytes(12, 512), 288);
    /* the supported list names exactly the supported types, each parsing */
    char list[256];
    snprintf(list, sizeof list, "%s", dx_dtype_supported_names());
    size_t n = 0;
    for (char *tok = strtok(list, ", "); tok; tok = strtok(NULL, ", "), n++) {
        enum dx_dtype t;
        assert_int_equal(dx_dtype_parse(tok, &t), 0);
        assert_true(dx_dtype_supported(t));
        assert_string_equal(dx_dtype_name(t), tok);
    }
    size_t supported = 0;
    for (int t = 0; t < DX_DTYPE_ID_MAX; t++) supported += (size_t)dx_dtype_supported(t);
    assert_int_equal(n, supported);
    assert_int_equal(n, 15);
    enum dx_dtype t;
    assert_int_equal(dx_dtype_parse("iq4_nl", &t), 0);
    assert_int_equal(t, DX_IQ4_NL);
    assert_int_equal(dx_dtype_parse("q8_K", &t), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "unknown dtype 'q8_K' (want one of f32, f16, bf16"));
    float f[32];
    uint8_t blk[64] = {0};
    assert_int_equal(dx_dtype_to_f32_row(15, blk, f, 256), DX_EUNSUPPORTED);
    assert_non_null(strstr(dx_errmsg(), "tensor type 15 (q8_K) is not supported (supported: f32"));
    assert_int_equal(dx_dtype_to_f32_row(DX_Q4_0, blk, f, 16), DX_EINVAL);
    assert_int_equal(dx_dtype_from_f32_row(DX_Q5_0, f, blk, 8), DX_EINVAL);
    assert_int_equal(dx_dtype_from_f32_row(99, f, blk, 32), DX_EUNSUPPORTED);
}

/* ---- dequantisation against the layout ---- */

/* A block's bytes as GGUF stores them: scale(s), qh, qs. */
static size_t put_f16(uint8_t *p, float v)
{
    uint16_t h = dx_f32_to_f16(v);
    memcpy(p, &h, 2);
    return 2;
}

/* The format's definition: element i's 4-bit field is byte i's low nibble
 * (i < 16) or byte i-16's high nibble; bit 4 is qh bit i. */
static int field(const uint8_t *qs, uint32_t qh, int i)
{
    int lo = i < 16 ? qs[i] & 0x0f : (qs[i - 16] >> 4) & 0x0f;
    return lo | (int)(((qh >> i) & 1u) << 4);
}

static float want_value(int type, float d, float m, const uint8_t *qs, uint32_t qh, int i)
{
    int q = field(qs, qh, i);
    switch (type) {
    case DX_Q4_0:
        return (float)(q - 8) * d;
    case DX_Q5_0:
        return (float)(q - 16) * d;
    case DX_Q4_1:
    case DX_Q5_1:
        return (float)q * d + m;
    case DX_IQ4_NL:
        return d * (float)dx_iq4nl_values[q];
    }
    fail();
    return 0;
}

/* Builds one block of `type` from d, m, qs[16], qh and checks each of its
 * 32 values. */
static void check_block(int type, float d, float m, const uint8_t qs[16], uint32_t qh)
{
    uint8_t b[24], *p = b;
    p += put_f16(p, d);
    if (type == DX_Q4_1 || type == DX_Q5_1) p += put_f16(p, m);
    if (type == DX_Q5_0 || type == DX_Q5_1) {
        memcpy(p, &qh, 4);
        p += 4;
    } else {
        qh = 0;
    }
    memcpy(p, qs, 16);
    p += 16;
    assert_int_equal((size_t)(p - b), dx_dtype_block_bytes(type));
    float got[32];
    assert_int_equal(dx_dtype_to_f32_row(type, b, got, 32), 0);
    float dd = dx_f16_to_f32(dx_f32_to_f16(d)), mm = dx_f16_to_f32(dx_f32_to_f16(m));
    for (int i = 0; i < 32; i++) {
        float w = want_value(type, dd, mm, qs, qh, i);
        if (memcmp(&w, &got[i], 4) != 0)
            fail_msg("%s d=%g m=%g qh=%08x element %d: %.9g, want %.9g", dx_dtype_name(type),
                     (double)d, (double)m, qh, i, (double)got[i], (double)w);
    }
}

static void test_dequant_fields(void **state)
{
    (void)state;
    static const int types[] = {DX_Q4_0, DX_Q4_1, DX_Q5_0, DX_Q5_1, DX_IQ4_NL};
    static const float ds[] = {0.5f, -2.0f, 0.0f, 1e-6f /* f16 subnormal */, 0.0123f};
    uint8_t qs[16], rev[16];
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)(j | (15 - j) << 4); /* every field value in both nibbles */
        rev[j] = (uint8_t)((15 - j) | j << 4);
    }
    for (size_t t = 0; t < DX_ARRAY_LEN(types); t++)
        for (size_t k = 0; k < DX_ARRAY_LEN(ds); k++) {
            check_block(types[t], ds[k], -1.25f, qs, 0);
            check_block(types[t], ds[k], 3.0f, rev, 0xffffffffu);
            check_block(types[t], ds[k], 0.0f, qs, 0xa5c3f00fu);
            for (int bit = 0; bit < 32; bit++) check_block(types[t], ds[k], 0.5f, rev, 1u << bit);
        }
}

/* A few blocks decoded by hand from their bytes. */
static void test_dequant_literal(void **state)
{
    (void)state;
    float y[32];
    /* q4_0, d = 1.0 (0x3c00): byte 0 = 0x10 -> element 0 = 0 - 8, element 16 = 1 - 8 */
    uint8_t q40[18] = {0x00, 0x3c, 0x10, 0xf0, 0x8f};
    assert_int_equal(dx_dtype_to_f32_row(DX_Q4_0, q40, y, 32), 0);
    assert_true(y[0] == -8.0f && y[16] == -7.0f && y[1] == -8.0f && y[17] == 7.0f && y[2] == 7.0f &&
                y[18] == 0.0f && y[3] == -8.0f && y[31] == -8.0f);
    /* q4_1, d = 0.5 (0x3800), m = -1.0 (0xbc00): element 0 = 3*0.5 - 1 */
    uint8_t q41[20] = {0x00, 0x38, 0x00, 0xbc, 0xf3};
    assert_int_equal(dx_dtype_to_f32_row(DX_Q4_1, q41, y, 32), 0);
    assert_true(y[0] == 0.5f && y[16] == 6.5f && y[1] == -1.0f);
    /* q5_0, d = 2.0 (0x4000), qh = 0x00010001: elements 0 and 16 get bit 4 */
    uint8_t q50[22] = {0x00, 0x40, 0x01, 0x00, 0x01, 0x00, 0x21};
    assert_int_equal(dx_dtype_to_f32_row(DX_Q5_0, q50, y, 32), 0);
    assert_true(y[0] == 2.0f * (17 - 16) && y[16] == 2.0f * (18 - 16) && y[1] == -32.0f &&
                y[17] == -32.0f);
    /* q5_1, d = 1.0, m = 0.25 (0x3400), qh bit 31: element 31 = 16 + 0x0f */
    uint8_t q51[24] = {0x00, 0x3c, 0x00, 0x34, 0x00, 0x00, 0x00, 0x80};
    q51[8 + 15] = 0xf0;
    assert_int_equal(dx_dtype_to_f32_row(DX_Q5_1, q51, y, 32), 0);
    assert_true(y[31] == 31.25f && y[15] == 0.25f && y[30] == 0.25f);
    /* iq4_nl, d = 1.0: byte j = j | (15 - j) << 4 -> the codebook forwards, then backwards */
    static const int8_t book[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};
    uint8_t nl[18] = {0x00, 0x3c};
    for (int j = 0; j < 16; j++) nl[2 + j] = (uint8_t)(j | (15 - j) << 4);
    assert_int_equal(dx_dtype_to_f32_row(DX_IQ4_NL, nl, y, 32), 0);
    for (int j = 0; j < 16; j++) {
        assert_int_equal(dx_iq4nl_values[j], book[j]);
        assert_true(y[j] == (float)book[j] && y[16 + j] == (float)book[15 - j]);
    }
}

/* ---- quantisation ---- */

typedef struct {
    double max_excess;  /* most |x - q(x)| beyond the bound (<= 0: within) */
    double se, sx;      /* sums of squared error and of x^2 */
    double se_steps, n; /* squared error in units of each block's step, elements */
} q_stats;

/* Quantises n values (n % 32 == 0) and accounts each block's error. */
static void quant_stats(int type, const float *x, size_t n, q_stats *st)
{
    uint8_t *q = dx_malloc(dx_dtype_row_bytes(type, n));
    float *y = dx_malloc(n * sizeof(float));
    assert_int_equal(dx_dtype_from_f32_row(type, x, q, n), 0);
    assert_int_equal(dx_dtype_to_f32_row(type, q, y, n), 0);
    for (size_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float mn = xb[0], mx = xb[0], amax = 0;
        for (int j = 0; j < 32; j++) {
            mn = fminf(mn, xb[j]);
            mx = fmaxf(mx, xb[j]);
            amax = fmaxf(amax, fabsf(xb[j]));
        }
        double step = 0, bound = 0, f16 = 1.0 / 2048;
        switch (type) {
        case DX_Q8_0:
            step = amax / 127.0, bound = step * (0.5 + 127 * f16);
            break;
        case DX_Q4_0:
            step = amax / 8.0, bound = step * (1 + 8 * f16);
            break;
        case DX_Q5_0:
            step = amax / 16.0, bound = step * (1 + 16 * f16);
            break;
        case DX_Q4_1:
            step = (mx - mn) / 15.0, bound = step * (0.5 + 15 * f16) + fabs(mn) * f16;
            break;
        case DX_Q5_1:
            step = (mx - mn) / 31.0, bound = step * (0.5 + 31 * f16) + fabs(mn) * f16;
            break;
        case DX_IQ4_NL:
            step = amax / 8.0, bound = 1e30;
            break; /* judged by RMS below */
        }
        double se = 0;
        for (int j = 0; j < 32; j++) {
            double e = fabs((double)xb[j] - y[32 * b + j]);
            st->max_excess = fmax(st->max_excess, e - bound - 1e-30);
            se += e * e;
            st->sx += (double)xb[j] * xb[j];
        }
        st->se += se;
        if (step > 0) st->se_steps += se / (step * step), st->n += 32;
    }
    dx_free(q);
    dx_free(y);
}

static void test_quant_bounds(void **state)
{
    (void)state;
    const size_t n = 32 * 512;
    float *x = dx_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        x[i] = rnd() * (1.0f + 3.0f * (float)((i / 32) % 5));
        if (i % 97 == 0) x[i] *= 8.0f;                    /* outliers */
        if ((i / 32) % 7 == 3) x[i] = fabsf(x[i]) + 2.0f; /* all-positive blocks */
    }
    double rms_err[DX_ARRAY_LEN(blk_types)];
    for (size_t t = 0; t < DX_ARRAY_LEN(blk_types); t++) {
        q_stats st = {0};
        quant_stats(blk_types[t], x, n, &st);
        if (st.max_excess > 0)
            fail_msg("%s: an element is %g past its bound", dx_dtype_name(blk_types[t]),
                     st.max_excess);
        rms_err[t] = sqrt(st.se / st.sx);
        double rms_steps = sqrt(st.se_steps / st.n);
        print_message("%-7s relative RMS error %.4f, %.3f steps\n", dx_dtype_name(blk_types[t]),
                      rms_err[t], rms_steps);
        if (blk_types[t] != DX_IQ4_NL) assert_true(rms_steps < 0.35);
    }
    /* more bits, less error; the codebook beats the uniform 4-bit grid */
    assert_true(rms_err[0] < rms_err[3] && rms_err[3] < rms_err[1]); /* q8_0 < q5_0 < q4_0 */
    assert_true(rms_err[4] < rms_err[2]);                            /* q5_1 < q4_1 */
    assert_true(rms_err[5] < rms_err[1]);                            /* iq4_nl < q4_0 */
    dx_free(x);
}

/* Zero and constant blocks, a block whose largest element is negative, the
 * same bytes on every call and block by block. */
static void test_quant_edges(void **state)
{
    (void)state;
    float x[96], y[96];
    memset(x, 0, 32 * sizeof(float));
    for (int j = 0; j < 32; j++) x[32 + j] = 0.75f;
    for (int j = 0; j < 32; j++) x[64 + j] = (float)j / 31.0f - 0.5f;
    x[70] = -3.0f;
    for (size_t t = 0; t < DX_ARRAY_LEN(blk_types); t++) {
        int type = blk_types[t];
        size_t rb = dx_dtype_row_bytes(type, 96), bb = dx_dtype_block_bytes(type);
        uint8_t a[128], b[128], c[128];
        assert_int_equal(dx_dtype_from_f32_row(type, x, a, 96), 0);
        assert_int_equal(dx_dtype_from_f32_row(type, x, b, 96), 0);
        assert_memory_equal(a, b, rb);
        for (int k = 0; k < 3; k++)
            assert_int_equal(dx_dtype_from_f32_row(type, x + 32 * k, c + bb * k, 32), 0);
        assert_memory_equal(a, c, rb);
        assert_int_equal(dx_dtype_to_f32_row(type, a, y, 96), 0);
        for (int j = 0; j < 32; j++) assert_true(y[j] == 0.0f);
        uint16_t d0;
        memcpy(&d0, a, 2);
        assert_int_equal(d0 & 0x7fff, 0); /* the zero block's scale is 0 (-0 for d = -M/8) */
        for (int j = 0; j < 32; j++) assert_true(fabsf(y[32 + j] - 0.75f) <= 0.75f / 64);
        assert_true(fabsf(y[70] + 3.0f) <= 3.0f / 1024); /* the largest lands on the grid */
    }
    /* the symmetric formats put the largest element at q = 0: the scale's
     * sign is the opposite of its sign */
    dx_block_q4_0 q4;
    dx_f32_to_q4_0_row(x + 64, &q4, 32);
    assert_true(dx_f16_to_f32(q4.d) > 0 && (q4.qs[6] & 15) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),           cmocka_unit_test(test_dequant_fields),
        cmocka_unit_test(test_dequant_literal), cmocka_unit_test(test_quant_bounds),
        cmocka_unit_test(test_quant_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
