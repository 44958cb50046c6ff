/* check_llamacpp_types: duplex's block formats against ggml's, from a
 * llama.cpp build (compiled and run by check_llamacpp_types.sh; not part of
 * the test suite, which must not need llama.cpp).
 *
 *   check_llamacpp_types FILE...   every tensor of each GGUF file, as ggml's
 *       own reader finds it, dequantised by ggml's type traits and by
 *       dx_dtype_to_f32_row: the f32 results must be bit-identical.
 *   check_llamacpp_types --quant   random rows quantised by ggml (the path
 *       llama-quantize takes, ggml_quantize_chunk without an importance
 *       matrix) and by dx_dtype_from_f32_row: how many blocks come out
 *       byte-identical, and both dequantised by the other side's code.
 * Exit status 1 on any dequantisation difference. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

#include "base/dx_dtype.h"
#include "base/dx_err.h"

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)len + 1);
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return p;
}

/* Number of f32 bit patterns that differ (NaNs compared by bits too). */
static size_t count_diff(const float *a, const float *b, size_t n, size_t *first)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0 && !d++) *first = i;
    return d;
}

typedef struct {
    size_t tensors, elems, diffs;
} per_type;

static int check_file(const char *path)
{
    struct gguf_init_params gp = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *g = gguf_init_from_file(path, gp);
    if (!g) {
        printf("%s: ggml's gguf reader refused the file\n", path);
        return 1;
    }
    size_t n = 0;
    unsigned char *file = slurp(path, &n);
    if (!file) return 1;
    per_type st[DX_DTYPE_ID_MAX] = {{0}};
    int bad = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(g); i++) {
        enum ggml_type t = gguf_get_tensor_type(g, i);
        size_t bytes = gguf_get_tensor_size(g, i);
        const unsigned char *data = file + gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i);
        const struct ggml_type_traits *tr = ggml_get_type_traits(t);
        size_t elems = bytes / tr->type_size * (size_t)tr->blck_size;
        float *ref = malloc(elems * 4 + 4), *got = malloc(elems * 4 + 4);
        if (t == GGML_TYPE_F32)
            memcpy(ref, data, elems * 4);
        else
            tr->to_float(data, ref, (int64_t)elems);
        if (dx_dtype_to_f32_row((int)t, data, got, elems) != 0) {
            printf("%s: %s: duplex cannot dequantise %s: %s\n", path, gguf_get_tensor_name(g, i),
                   tr->type_name, dx_errmsg());
            bad = 1;
        } else {
            size_t first = 0, d = count_diff(ref, got, elems, &first);
            if (d) {
                printf("%s: %s (%s): %zu of %zu values differ, first at %zu: ggml %.9g duplex "
                       "%.9g\n",
                       path, gguf_get_tensor_name(g, i), tr->type_name, d, elems, first,
                       (double)ref[first], (double)got[first]);
                bad = 1;
            }
            if ((int)t < DX_DTYPE_ID_MAX) {
                st[t].tensors++;
                st[t].elems += elems;
                st[t].diffs += d;
            }
        }
        free(ref);
        free(got);
    }
    printf("%s:", path);
    for (int t = 0; t < DX_DTYPE_ID_MAX; t++)
        if (st[t].tensors)
            printf(" %s %zu tensors %zu values %s;", dx_dtype_name(t), st[t].tensors, st[t].elems,
                   st[t].diffs ? "DIFFER" : "bit-identical");
    printf("\n");
    free(file);
    gguf_free(g);
    return bad;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* The rows quantised: "mixed" uniform blocks of 7 widths with outliers;
 * "normal" weight-like bell-shaped values (a sum of four uniforms) with a
 * scale per 256; "edges" sub-blocks of 16 that are zero, constant, all
 * positive, all negative, tiny (1e-20) or one spike, among normal ones,
 * and whole super-blocks of 256 that are zero, constant, tiny, or whose
 * sub-blocks' magnitudes differ by 1e6 (scales that round to 0). */
static void fill_mixed(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = rnd() * (1.0f + (float)((i / 32) % 7));
        if (i % 101 == 0) x[i] *= 10.0f;
    }
}

static void fill_normal(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float scale = 0.01f + 0.05f * (float)((i / 256) % 9);
        x[i] = scale * (rnd() + rnd() + rnd() + rnd());
    }
}

static void fill_edges(float *x, size_t n)
{
    fill_normal(x, n);
    for (size_t s = 0; s < n / 16; s++) {
        float *b = x + 16 * s, c = rnd();
        switch ((s * 7 + s / 16) % 11) {
        case 0:
            memset(b, 0, 16 * sizeof *b);
            break;
        case 1:
            for (int j = 0; j < 16; j++) b[j] = c;
            break;
        case 2:
            for (int j = 0; j < 16; j++) b[j] = fabsf(b[j]) + 0.5f;
            break;
        case 3:
            for (int j = 0; j < 16; j++) b[j] = -fabsf(b[j]) - 0.25f;
            break;
        case 4:
            for (int j = 0; j < 16; j++) b[j] *= 1e-20f;
            break;
        case 5:
            memset(b, 0, 16 * sizeof *b);
            b[(s / 11) % 16] = 3.0f * c;
            break;
        default:
            break;
        }
    }
    for (size_t s = 0; s < n / 256; s++) {
        float *b = x + 256 * s, c = rnd();
        switch (s % 13) {
        case 0:
            memset(b, 0, 256 * sizeof *b);
            break;
        case 1:
            for (int j = 0; j < 256; j++) b[j] = c;
            break;
        case 2:
            for (int j = 0; j < 256; j++) b[j] *= 1e-20f;
            break;
        case 3:
            for (int j = 0; j < 256; j++) b[j] *= (j / 16) % 2 ? 1e3f : 1e-3f;
            break;
        default:
            break;
        }
    }
}

static const struct {
    const char *name;
    void (*fill)(float *, size_t);
} k_sets[] = {{"mixed", fill_mixed}, {"normal", fill_normal}, {"edges", fill_edges}};

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static double rel_rms(const float *x, const float *y, size_t n)
{
    double se = 0, sx = 0;
    for (size_t i = 0; i < n; i++) {
        se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        sx += (double)x[i] * x[i];
    }
    return sqrt(se / sx);
}

/* One type on one set of rows; 1 on a dequantisation difference. */
static int check_quant_type(int t, const char *set, const float *x, size_t rows, size_t n_per_row)
{
    size_t n = rows * n_per_row, rb = dx_dtype_row_bytes(t, n_per_row);
    size_t bb = dx_dtype_block_bytes(t), blocks = n / dx_dtype_block_elems(t);
    unsigned char *qg = malloc(rb * rows), *qd = malloc(rb * rows);
    float *gg = malloc(n * 4), *gd = malloc(n * 4), *dg = malloc(n * 4), *dd = malloc(n * 4);
    ggml_quantize_chunk((enum ggml_type)t, x, qg, 0, (int64_t)rows, (int64_t)n_per_row, NULL);
    dx_dtype_from_f32_row(t, x, qd, n);
    size_t same = 0, same_rows = 0;
    for (size_t b = 0; b < blocks; b++) same += !memcmp(qg + b * bb, qd + b * bb, bb);
    for (size_t r = 0; r < rows; r++) same_rows += !memcmp(qg + r * rb, qd + r * rb, rb);
    /* xy: x's dequantisation of y's bytes (g ggml, d duplex) */
    const struct ggml_type_traits *tr = ggml_get_type_traits((enum ggml_type)t);
    tr->to_float(qg, gg, (int64_t)n);
    tr->to_float(qd, gd, (int64_t)n);
    dx_dtype_to_f32_row(t, qg, dg, n);
    dx_dtype_to_f32_row(t, qd, dd, n);
    size_t first = 0, d1 = count_diff(gg, dg, n, &first), d2 = count_diff(gd, dd, n, &first);
    printf("%-7s %-6s %zu of %zu blocks, %zu of %zu rows byte-identical", dx_dtype_name(t), set,
           same, blocks, same_rows, rows);
    if (same != blocks)
        printf(" (max |ggml - duplex| of the values %.3g)", max_abs_diff(gg, dd, n));
    printf("; relative RMS error ggml %.5f duplex %.5f; dequantised by both: %s\n",
           rel_rms(x, gg, n), rel_rms(x, dd, n), d1 + d2 ? "DIFFER" : "bit-identical");
    free(qg);
    free(qd);
    free(gg);
    free(gd);
    free(dg);
    free(dd);
    return d1 + d2 != 0;
}

static int check_quant(void)
{
    static const int types[] = {DX_Q8_0, DX_Q4_0, DX_Q4_1, DX_Q5_0, DX_Q5_1, DX_IQ4_NL,
                                DX_Q6_K, DX_Q5_K, DX_Q4_K, DX_Q3_K, DX_Q2_K, DX_IQ4_XS};
    const size_t n_per_row = 1024, rows = 512, n = n_per_row * rows;
    float *x = malloc(n * 4);
    int bad = 0;
    for (size_t s = 0; s < sizeof k_sets / sizeof *k_sets; s++) {
        k_sets[s].fill(x, n);
        for (size_t k = 0; k < sizeof types / sizeof *types; k++)
            bad |= check_quant_type(types[k], k_sets[s].name, x, rows, n_per_row);
    }
    free(x);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: check_llamacpp_types FILE... | --quant\n");
        return 2;
    }
    if (!strcmp(argv[1], "--quant")) return check_quant();
    int bad = 0;
    for (int i = 1; i < argc; i++) bad |= check_file(argv[i]);
    return bad;
}
