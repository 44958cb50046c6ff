/* gguf: reader and writer for GGUF v3 (v2 accepted), the llama.cpp
 * ecosystem's model file format.
 *
 * Reader: the file is mmap'ed read-only and fully validated at open: every
 * count, length, offset and shape is checked against the file size and for
 * overflow before use, keys and tensor names must be unique, tensor types must
 * be ones GGML defines (dx_dtype's table), tensor data must be aligned to
 * general.alignment (default 32), lie inside the data section and not
 * overlap.  A bad file gives DX_EFORMAT (or DX_EUNSUPPORTED for a valid but
 * unsupported feature) with a message naming the file, the byte offset and
 * what was wrong; it never reads outside the file.  After a successful open
 * every accessor is a bounds-safe lookup.
 *
 * Details of what is accepted:
 *  - versions 2 and 3 (same layout); version 1 (32-bit counts), big-endian
 *    files and versions > 3 give DX_EUNSUPPORTED, version 0 DX_EFORMAT;
 *  - nested arrays give DX_EUNSUPPORTED; bool values must be 0 or 1; keys
 *    and tensor names must be non-empty;
 *  - a tensor of any type GGML defines is sized and accepted (whether the
 *    engine can run it is model_load's check); an id GGML does not know is
 *    DX_EFORMAT naming the tensor and the id;
 *  - a dimension may be 0 (as in llama.cpp): such a tensor has nbytes 0 and
 *    data NULL; every ne must fit int64 and so must the element count and
 *    the byte size;
 *  - at most GGUF_MAX_KV keys and GGUF_MAX_TENSORS tensors (DX_EUNSUPPORTED
 *    beyond).
 * The reader allocates O(number of keys + tensors + string-array elements),
 * each bounded by the file size, and nothing is allocated for a count before
 * it is checked against the bytes left.  Little-endian hosts only.
 *
 * Strings in GGUF are length-prefixed, not NUL-terminated: accessors return
 * gguf_str views into the mapping.
 *
 * Writer: builds a file in memory (metadata) and streams tensor data to
 * disk, so synthesising a multi-GB model does not need it all in memory. */
#ifndef GGUF_H
#define GGUF_H

#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC             0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS          4
#define GGUF_MAX_KV            (1u << 20) /* reader limit on the kv count */
#define GGUF_MAX_TENSORS       (1u << 20) /* reader limit on the tensor count */

enum gguf_vtype {
    GGUF_T_UINT8 = 0,
    GGUF_T_INT8 = 1,
    GGUF_T_UINT16 = 2,
    GGUF_T_INT16 = 3,
    GGUF_T_UINT32 = 4,
    GGUF_T_INT32 = 5,
    GGUF_T_FLOAT32 = 6,
    GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8,
    GGUF_T_ARRAY = 9,
    GGUF_T_UINT64 = 10,
    GGUF_T_INT64 = 11,
    GGUF_T_FLOAT64 = 12,
};

typedef struct {
    const char *ptr; /* not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_ctx gguf_ctx;

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the innermost (row length); unused dims = 1 */
    int type;                   /* enum dx_dtype (GGML type id) */
    uint64_t offset;            /* from the start of the data section */
    uint64_t nbytes;
    const void *data; /* into the mapping; NULL when nbytes is 0 */
} gguf_tensor_info;

/* Open and validate a file (mmap).  On error *out is NULL and dx_errmsg()
 * says what was wrong and where. */
int gguf_open(const char *path, gguf_ctx **out);
/* Same over a caller-owned buffer (kept alive until gguf_close); `name` is
 * used in messages.  Used by tests and the fuzz target. */
int gguf_open_mem(const void *data, size_t size, const char *name, gguf_ctx **out);
void gguf_close(gguf_ctx *ctx);

uint32_t gguf_version(const gguf_ctx *ctx);
uint64_t gguf_file_size(const gguf_ctx *ctx);
uint64_t gguf_alignment(const gguf_ctx *ctx);
uint64_t gguf_data_offset(const gguf_ctx *ctx); /* file offset of the data section */
const char *gguf_name(const gguf_ctx *ctx);     /* path or name given at open */

/* Metadata.  gguf_kv_key and gguf_kv_type assert i < gguf_n_kv (an index
 * out of range is a caller bug). */
uint64_t gguf_n_kv(const gguf_ctx *ctx);
gguf_str gguf_kv_key(const gguf_ctx *ctx, uint64_t i);
enum gguf_vtype gguf_kv_type(const gguf_ctx *ctx, uint64_t i);
/* Element type and length of an array value (DX_EINVAL if not an array,
 * DX_ERANGE if i is out of range).  elem and n may be NULL. */
int gguf_kv_array_info(const gguf_ctx *ctx, uint64_t i, enum gguf_vtype *elem, uint64_t *n);
int64_t gguf_find_key(const gguf_ctx *ctx, const char *key); /* index or DX_NONE */

/* Typed getters.  DX_ENOENT if the key is missing (message names it),
 * DX_EFORMAT if it has the wrong type or its value does not fit.  Integer
 * getters accept any integer type whose value fits; gguf_get_f32 accepts
 * FLOAT32 and FLOAT64. */
int gguf_get_u32(const gguf_ctx *ctx, const char *key, uint32_t *out);
int gguf_get_u64(const gguf_ctx *ctx, const char *key, uint64_t *out);
int gguf_get_i64(const gguf_ctx *ctx, const char *key, int64_t *out);
int gguf_get_f32(const gguf_ctx *ctx, const char *key, float *out);
int gguf_get_bool(const gguf_ctx *ctx, const char *key, int *out);
int gguf_get_str(const gguf_ctx *ctx, const char *key, gguf_str *out);
/* Arrays.  Numeric: pointer to the packed little-endian elements in the
 * mapping (may be unaligned: read with memcpy); for a string array *data is
 * the first element as serialised (u64 length + bytes): use
 * gguf_get_arr_str, O(1) per element, DX_ERANGE past the end.  elem, n and
 * data may be NULL. */
int gguf_get_arr(const gguf_ctx *ctx, const char *key, enum gguf_vtype *elem, uint64_t *n,
                 const void **data);
int gguf_get_arr_str(const gguf_ctx *ctx, const char *key, uint64_t i, gguf_str *out);
uint64_t gguf_vtype_size(enum gguf_vtype t); /* 0 for STRING/ARRAY/unknown */
const char *gguf_vtype_name(enum gguf_vtype t);
/* Compare a gguf_str with a C string. */
int gguf_str_eq(gguf_str s, const char *c);

/* Tensors.  gguf_tensor: DX_ERANGE if i is out of range;
 * gguf_find_tensor: DX_ENOENT naming the tensor (out may be NULL). */
uint64_t gguf_n_tensors(const gguf_ctx *ctx);
int gguf_tensor(const gguf_ctx *ctx, uint64_t i, gguf_tensor_info *out);
int gguf_find_tensor(const gguf_ctx *ctx, const char *name, gguf_tensor_info *out);

/* Writer. */
typedef struct gguf_writer gguf_writer;
/* Fills `nbytes` of tensor data at dst; returns 0 or a negative code. */
typedef int (*gguf_fill_fn)(void *user, void *dst, uint64_t nbytes);

gguf_writer *gguf_writer_create(void); /* NULL if out of memory */
void gguf_writer_destroy(gguf_writer *w);
/* Default 3.  Written verbatim (2 for tests of v2 reading; other values make
 * files the reader rejects, which tests also use). */
void gguf_w_set_version(gguf_writer *w, uint32_t version);
/* Must be a power of two (asserted).  Sets the layout's alignment and the
 * general.alignment key (removed again when set back to 32).  Setting
 * general.alignment with gguf_w_set_u32 and friends writes the key verbatim
 * without changing the layout (tests use it to make bad files). */
void gguf_w_set_alignment(gguf_writer *w, uint32_t alignment);
/* Setting a key twice replaces the value (the writer never writes duplicates).
 * Keys must be non-empty; the setters return 0, DX_EINVAL or DX_ENOMEM. */
int gguf_w_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_w_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_w_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_w_set_f32(gguf_writer *w, const char *key, float v);
int gguf_w_set_bool(gguf_writer *w, const char *key, int v);
int gguf_w_set_str(gguf_writer *w, const char *key, const char *v);
int gguf_w_set_arr(gguf_writer *w, const char *key, enum gguf_vtype elem, const void *data,
                   uint64_t n);
int gguf_w_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Tensor data either copied now (data) or produced at write time (fill,
 * called once per tensor with the tensor's final location, in insertion
 * order).  Type, shape and name are checked as the reader would: DX_EINVAL
 * for a bad type/shape, DX_EEXIST for a duplicate name.  Tensors are laid
 * out in insertion order, each padded to the alignment. */
int gguf_w_add_tensor(gguf_writer *w, const char *name, int type, uint32_t n_dims,
                      const uint64_t *ne, const void *data);
int gguf_w_add_tensor_fill(gguf_writer *w, const char *name, int type, uint32_t n_dims,
                           const uint64_t *ne, gguf_fill_fn fill, void *user);
/* Write to a file (via "<path>.tmp", space reserved up front, then rename:
 * readers never see a partial file; no fsync) or to memory (dx_malloc'ed
 * buffer, caller frees with dx_free).  A fill callback's error is returned
 * with its message prefixed by the tensor name; the temporary file is
 * removed on any error. */
int gguf_w_write_file(gguf_writer *w, const char *path);
int gguf_w_write_mem(gguf_writer *w, void **out, size_t *size);

#endif
