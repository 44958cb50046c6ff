/* dx_dtype: tensor element types — one table of every GGML type id with its
 * name and block size, the subset duplex computes with, and row conversions
 * to and from f32 for that subset.
 *
 * Values are GGML's type ids, so a GGUF tensor's type field maps directly.
 * The GGUF reader sizes a tensor of any type GGML defines (so any file
 * parses); dx_dtype_supported() says which ones the engine runs:
 *   F32, F16, BF16                      plain floats (dx_half.h)
 *   Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL blocks of 32 (dx_quant.h)
 *   Q2_K..Q6_K, IQ4_XS                  super-blocks of 256 (dx_kquant.h)
 * Adding a type: its block layout, dequantiser and quantiser in dx_quant,
 * one line of the table in dx_dtype.c, and its kernels (kern_mm_priv.h). */
#ifndef DX_DTYPE_H
#define DX_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_half.h"
#include "base/dx_kquant.h"
#include "base/dx_quant.h"

enum dx_dtype {
    DX_F32 = 0,
    DX_F16 = 1,
    DX_Q4_0 = 2,
    DX_Q4_1 = 3,
    DX_Q5_0 = 6,
    DX_Q5_1 = 7,
    DX_Q8_0 = 8,
    DX_Q2_K = 10,
    DX_Q3_K = 11,
    DX_Q4_K = 12,
    DX_Q5_K = 13,
    DX_Q6_K = 14,
    DX_IQ4_NL = 20,
    DX_IQ4_XS = 23,
    DX_BF16 = 30,
};

/* Every GGML type id is below this. */
#define DX_DTYPE_ID_MAX 48

/* GGML's name ("f32", "q4_0", "q4_K", ...) of any type GGML defines, or
 * NULL for an unknown or retired id. */
const char *dx_dtype_name(int type);
/* 1 if duplex can compute with tensors of this type. */
int dx_dtype_supported(int type);
/* The supported types' names, "f32, f16, bf16, q8_0, ..." (for messages). */
const char *dx_dtype_supported_names(void);
/* Parse the name of a supported type; returns 0 or DX_EINVAL naming them. */
int dx_dtype_parse(const char *s, enum dx_dtype *out);
/* Elements per block (1 for plain types), 0 if unknown; any GGML type. */
size_t dx_dtype_block_elems(int type);
/* Bytes per block, 0 if unknown; any GGML type. */
size_t dx_dtype_block_bytes(int type);
/* Bytes for a row of n elements; n must be a multiple of the block size
 * (returns 0 otherwise or for an unknown type). */
size_t dx_dtype_row_bytes(int type, size_t n);

/* Dequantise (convert) a row of a supported type; n per its block size.
 * DX_EUNSUPPORTED / DX_EINVAL otherwise. */
int dx_dtype_to_f32_row(int type, const void *src, float *dst, size_t n);
/* Quantise (convert) an f32 row into a supported type with the reference
 * rules (dx_quant.h); same errors. */
int dx_dtype_from_f32_row(int type, const float *src, void *dst, size_t n);

#endif
