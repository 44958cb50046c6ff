/* gguf: GGUF v2/v3 reader and writer.
 *
 * The reader validates the whole file at open (header, every key/value, every
 * tensor info, the placement of every tensor's data) and records what it
 * found in flat tables, so that afterwards every accessor is a bounds-safe
 * lookup that cannot fail on content.  Every count read from the file is
 * compared with the bytes that remain before anything is allocated for it, so
 * a hostile count cannot trigger a huge allocation: what the reader allocates
 * is bounded by a small multiple of the file size (and by GGUF_MAX_KV /
 * GGUF_MAX_TENSORS).  Keys and tensor names go into open-addressing hash
 * indexes, which find duplicates in linear time and make lookups O(1);
 * string arrays get a table of element offsets so element i of a 150k-entry
 * vocabulary is O(1).
 *
 * The writer keeps metadata in memory, serialised per key, and lays the file
 * out before writing anything.  A file's space is reserved up front with
 * posix_fallocate (so a full disk is an error, not a SIGBUS in a mapping),
 * the metadata is written with pwrite, and each tensor is produced straight
 * into a shared mapping of its own window of the file, unmapped after it: a
 * multi-GB model is written holding at most one tensor's pages (2 GiB of 8
 * f16 tensors: max RSS 257 MB).
 *
 * Values are read and written with memcpy in host byte order: this module is
 * for little-endian hosts only (checked at compile time); big-endian GGUF
 * files are recognised and rejected. */
#include "model/gguf.h"

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "gguf.c reads and writes values with memcpy: little-endian hosts only");

#define GGUF_HEADER_BYTES 24
/* The smallest possible encodings, used to bound counts by the bytes left:
 * key length + value type + a 1-byte value; name length + n_dims + one ne +
 * type + offset. */
#define GGUF_MIN_KV_BYTES     13
#define GGUF_MIN_TENSOR_BYTES 32
#define GGUF_NAME_SHOWN       64 /* bytes of a key or tensor name quoted in messages */

/* ------------------------------------------------------------------ */
/* Shared helpers                                                      */

uint64_t gguf_vtype_size(enum gguf_vtype t)
{
    switch (t) {
    case GGUF_T_UINT8:
    case GGUF_T_INT8:
    case GGUF_T_BOOL:
        return 1;
    case GGUF_T_UINT16:
    case GGUF_T_INT16:
        return 2;
    case GGUF_T_UINT32:
    case GGUF_T_INT32:
    case GGUF_T_FLOAT32:
        return 4;
    case GGUF_T_UINT64:
    case GGUF_T_INT64:
    case GGUF_T_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

const char *gguf_vtype_name(enum gguf_vtype t)
{
    static const char *const names[] = {
        "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
        "bool",  "string", "array",  "uint64", "int64",  "float64",
    };
    if ((unsigned)t < DX_ARRAY_LEN(names)) return names[t];
    return "unknown";
}

int gguf_str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

static int is_pow2(uint64_t x)
{
    return x && (x & (x - 1)) == 0;
}

/* Round up to a power-of-two alignment; DX_ERANGE on overflow (the caller
 * says what overflowed). */
static int align_up(uint64_t x, uint64_t align, uint64_t *out)
{
    if (x > UINT64_MAX - (align - 1))
        return dx_errf(DX_ERANGE, "%" PRIu64 " aligned to %" PRIu64 " overflows", x, align);
    *out = (x + align - 1) & ~(align - 1);
    return 0;
}

/* Bytes of a tensor of a known type and shape; DX_ERANGE if the element
 * count or byte size does not fit in int64 (ggml's index type); the caller
 * names the tensor. */
static int tensor_nbytes(int type, uint32_t n_dims, const uint64_t *ne, uint64_t *out)
{
    uint64_t rows = 1, elems, bytes;
    for (uint32_t d = 1; d < n_dims; d++)
        if (__builtin_mul_overflow(rows, ne[d], &rows))
            return dx_errf(DX_ERANGE, "the element count overflows int64");
    if (__builtin_mul_overflow(rows, ne[0], &elems) || elems > INT64_MAX)
        return dx_errf(DX_ERANGE, "the element count overflows int64");
    uint64_t row = (ne[0] / dx_dtype_block_elems(type)) * dx_dtype_block_bytes(type);
    if (__builtin_mul_overflow(row, rows, &bytes) || bytes > INT64_MAX)
        return dx_errf(DX_ERANGE, "the byte size overflows int64");
    *out = bytes;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Name index: open addressing over item indexes.  Items are gguf_kv or
 * gguf_tensor_info, both of which start with their name (a gguf_str). */

typedef struct {
    uint64_t *slot; /* item index + 1; 0 = empty */
    uint64_t mask;
} gguf_index;

/* 0, or DX_ENOMEM (the caller names the index). */
static int index_init(gguf_index *ix, uint64_t n)
{
    uint64_t cap = 8;
    while (cap < 2 * n) cap <<= 1;
    ix->slot = dx_calloc(cap, sizeof *ix->slot);
    ix->mask = cap - 1;
    return ix->slot ? 0 : dx_errf(DX_ENOMEM, "out of memory for %" PRIu64 " index slots", cap);
}

/* The slot holding `name`, or the empty slot where it would go. */
static uint64_t index_probe(const gguf_index *ix, const void *items, size_t stride, gguf_str name)
{
    uint64_t h = XXH3_64bits(name.ptr, name.len) & ix->mask;
    for (;; h = (h + 1) & ix->mask) {
        uint64_t s = ix->slot[h];
        if (!s) return h;
        const gguf_str *other = (const gguf_str *)((const char *)items + (s - 1) * stride);
        if (other->len == name.len && memcmp(other->ptr, name.ptr, name.len) == 0) return h;
    }
}

/* The index of the item called name; DX_NONE when there is none. */
static int64_t index_find(const gguf_index *ix, const void *items, size_t stride, const char *name)
{
    if (!ix->slot || !name) return DX_NONE;
    gguf_str s = {name, strlen(name)};
    uint64_t slot = ix->slot[index_probe(ix, items, stride, s)];
    return slot ? (int64_t)(slot - 1) : DX_NONE;
}

/* ------------------------------------------------------------------ */
/* Reader                                                              */

typedef struct {
    gguf_str key; /* first: see gguf_index */
    enum gguf_vtype type;
    enum gguf_vtype elem; /* ARRAY: element type */
    uint64_t n;           /* ARRAY: element count */
    const uint8_t *val;   /* the value; ARRAY: the first element */
    uint64_t *str_off;    /* STRING ARRAY: offset of element i from val */
} gguf_kv;

_Static_assert(offsetof(gguf_kv, key) == 0, "gguf_index reads the name at offset 0");
_Static_assert(offsetof(gguf_tensor_info, name) == 0, "gguf_index reads the name at offset 0");

struct gguf_ctx {
    char *name;
    const uint8_t *base;
    uint64_t size;
    int mapped;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;               /* [n_kv] */
    gguf_tensor_info *tensors; /* [n_tensors] */
    gguf_index kv_index, tensor_index;
};

/* Parse state: the cursor and a description of the item being parsed, which
 * prefixes every message ("key 'general.name'", "tensor 'output.weight'"). */
typedef struct {
    gguf_ctx *ctx;
    uint64_t pos;
    char where[GGUF_NAME_SHOWN + 32];
} gguf_parser;

/* "FILE: offset N: WHERE: what" (WHERE: the key or tensor being read, if
 * any). */
__attribute__((format(printf, 4, 5))) static int perr(const gguf_parser *p, uint64_t off, int err,
                                                      const char *fmt, ...)
{
    char where[1024]; /* the file name is a path: as much as the message holds */
    snprintf(where, sizeof where, "%s: offset %" PRIu64 "%s%s", p->ctx->name, off,
             p->where[0] ? ": " : "", p->where);
    va_list ap;
    va_start(ap, fmt);
    int rc = dx_verrp(err, where, fmt, ap);
    va_end(ap);
    return rc;
}

static int oom(const gguf_parser *p, const char *what)
{
    return dx_errf(DX_ENOMEM, "%s: out of memory for %s", p->ctx->name, what);
}

/* "kind 'name'" with the name cut short and non-printable bytes shown as '?',
 * since names come from the file. */
static void set_where(gguf_parser *p, const char *kind, gguf_str name)
{
    size_t n = name.len < GGUF_NAME_SHOWN ? (size_t)name.len : GGUF_NAME_SHOWN;
    char shown[GGUF_NAME_SHOWN + 1];
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name.ptr[i];
        shown[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    shown[n] = 0;
    snprintf(p->where, sizeof p->where, "%s '%s%s'", kind, shown, name.len > n ? "..." : "");
}

static uint64_t left(const gguf_parser *p)
{
    return p->ctx->size - p->pos;
}

static int take(gguf_parser *p, uint64_t n, const char *what, const uint8_t **out)
{
    if (n > left(p))
        return perr(p, p->pos, DX_EFORMAT,
                    "unexpected end of file reading %s (need %" PRIu64 " bytes, %" PRIu64 " left)",
                    what, n, left(p));
    *out = p->ctx->base + p->pos;
    p->pos += n;
    return 0;
}

static int rd_u32(gguf_parser *p, const char *what, uint32_t *v)
{
    const uint8_t *b = NULL;
    int rc = take(p, 4, what, &b);
    if (!rc) memcpy(v, b, 4);
    return rc;
}

static int rd_u64(gguf_parser *p, const char *what, uint64_t *v)
{
    const uint8_t *b = NULL;
    int rc = take(p, 8, what, &b);
    if (!rc) memcpy(v, b, 8);
    return rc;
}

static int rd_str(gguf_parser *p, const char *what, gguf_str *s)
{
    uint64_t at = p->pos, len;
    int rc = rd_u64(p, what, &len);
    if (rc) return rc;
    if (len > left(p))
        return perr(p, at, DX_EFORMAT,
                    "%s length %" PRIu64 " exceeds the %" PRIu64 " bytes left in the file", what,
                    len, left(p));
    s->ptr = (const char *)p->ctx->base + p->pos;
    s->len = len;
    p->pos += len;
    return 0;
}

static int check_version(gguf_parser *p, uint32_t v)
{
    if (v == 2 || v == 3) return 0;
    if (v == 1)
        return perr(p, 4, DX_EUNSUPPORTED,
                    "GGUF version 1 (32-bit counts) is not supported; re-convert the model");
    if (v == 0) return perr(p, 4, DX_EFORMAT, "version 0 is not a GGUF version");
    if ((v & 0xffffu) == 0 && __builtin_bswap32(v) <= 3)
        return perr(p, 4, DX_EUNSUPPORTED, "big-endian GGUF (version %u) is not supported",
                    __builtin_bswap32(v));
    return perr(p, 4, DX_EUNSUPPORTED,
                "GGUF version %u is not supported (this reader reads 2 and 3)", v);
}

/* A count is rejected when even its smallest encoding cannot fit in what
 * remains, before anything is allocated for it. */
static int check_count(gguf_parser *p, uint64_t at, const char *what, uint64_t n,
                       uint64_t min_bytes, uint64_t room, uint64_t limit)
{
    if (n > room / min_bytes)
        return perr(p, at, DX_EFORMAT,
                    "%s %" PRIu64 " exceeds what the file can hold (%" PRIu64 " bytes left)", what,
                    n, room);
    if (n > limit)
        return perr(p, at, DX_EUNSUPPORTED,
                    "%s %" PRIu64 " exceeds this reader's limit of %" PRIu64, what, n, limit);
    return 0;
}

static int parse_header(gguf_parser *p, uint64_t *n_tensors, uint64_t *n_kv)
{
    uint32_t magic, version;
    int rc = rd_u32(p, "magic", &magic);
    if (rc) return rc;
    if (magic != GGUF_MAGIC)
        return perr(p, 0, DX_EFORMAT, "bad magic 0x%08x (not a GGUF file)", magic);
    if ((rc = rd_u32(p, "version", &version)) || (rc = check_version(p, version))) return rc;
    p->ctx->version = version;
    if ((rc = rd_u64(p, "tensor count", n_tensors)) || (rc = rd_u64(p, "kv count", n_kv)))
        return rc;
    uint64_t room = left(p);
    if ((rc = check_count(p, 8, "tensor count", *n_tensors, GGUF_MIN_TENSOR_BYTES, room,
                          GGUF_MAX_TENSORS)) ||
        (rc = check_count(p, 16, "kv count", *n_kv, GGUF_MIN_KV_BYTES, room, GGUF_MAX_KV)))
        return rc;
    /* Each product is at most `room`, so the sum cannot overflow. */
    if (*n_tensors * GGUF_MIN_TENSOR_BYTES + *n_kv * GGUF_MIN_KV_BYTES > room)
        return perr(p, 8, DX_EFORMAT,
                    "tensor count %" PRIu64 " and kv count %" PRIu64
                    " together exceed what the file can hold (%" PRIu64 " bytes left)",
                    *n_tensors, *n_kv, room);
    return 0;
}

static int check_bools(gguf_parser *p, const uint8_t *v, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (v[i] > 1)
            return perr(p, (uint64_t)(v + i - p->ctx->base), DX_EFORMAT,
                        "bool value %u is not 0 or 1", v[i]);
    return 0;
}

static int parse_str_array(gguf_parser *p, gguf_kv *kv)
{
    if (kv->n == 0) return 0;
    kv->str_off = dx_malloc(kv->n * sizeof *kv->str_off); /* n <= bytes left / 8 */
    if (!kv->str_off) return oom(p, "string array offsets");
    for (uint64_t i = 0; i < kv->n; i++) {
        gguf_str s;
        kv->str_off[i] = (uint64_t)(p->ctx->base + p->pos - kv->val);
        int rc = rd_str(p, "string element", &s);
        if (rc) return rc;
    }
    return 0;
}

static int parse_array(gguf_parser *p, gguf_kv *kv)
{
    uint64_t at = p->pos;
    uint32_t elem;
    int rc = rd_u32(p, "array element type", &elem);
    if (rc) return rc;
    if (elem == GGUF_T_ARRAY)
        return perr(p, at, DX_EUNSUPPORTED, "nested arrays are not supported");
    if (elem > GGUF_T_FLOAT64)
        return perr(p, at, DX_EFORMAT, "unknown array element type %u", elem);
    kv->elem = (enum gguf_vtype)elem;
    at = p->pos;
    if ((rc = rd_u64(p, "array length", &kv->n))) return rc;
    uint64_t esize = elem == GGUF_T_STRING ? 8 : gguf_vtype_size(kv->elem);
    if (kv->n > left(p) / esize)
        return perr(p, at, DX_EFORMAT,
                    "array length %" PRIu64 " exceeds what the file can hold (%" PRIu64
                    " bytes left)",
                    kv->n, left(p));
    kv->val = p->ctx->base + p->pos;
    if (elem == GGUF_T_STRING) return parse_str_array(p, kv);
    const uint8_t *data = NULL;
    if ((rc = take(p, kv->n * esize, "array elements", &data))) return rc;
    return elem == GGUF_T_BOOL ? check_bools(p, data, kv->n) : 0;
}

static int parse_value(gguf_parser *p, gguf_kv *kv)
{
    uint64_t at = p->pos;
    uint32_t t;
    int rc = rd_u32(p, "value type", &t);
    if (rc) return rc;
    if (t > GGUF_T_FLOAT64) return perr(p, at, DX_EFORMAT, "unknown value type %u", t);
    kv->type = (enum gguf_vtype)t;
    if (t == GGUF_T_ARRAY) return parse_array(p, kv);
    kv->val = p->ctx->base + p->pos;
    if (t == GGUF_T_STRING) {
        gguf_str s;
        return rd_str(p, "string value", &s);
    }
    const uint8_t *v = NULL;
    if ((rc = take(p, gguf_vtype_size(kv->type), "value", &v))) return rc;
    return t == GGUF_T_BOOL ? check_bools(p, v, 1) : 0;
}

static int parse_kvs(gguf_parser *p, uint64_t n)
{
    gguf_ctx *ctx = p->ctx;
    if (index_init(&ctx->kv_index, n)) return oom(p, "key index");
    if (n && !(ctx->kv = dx_calloc(n, sizeof *ctx->kv))) return oom(p, "key/value table");
    for (uint64_t i = 0; i < n; i++) {
        gguf_kv *kv = &ctx->kv[i];
        uint64_t at = p->pos;
        snprintf(p->where, sizeof p->where, "kv %" PRIu64, i);
        int rc = rd_str(p, "key", &kv->key);
        if (rc) return rc;
        ctx->n_kv = i + 1; /* from here on, close frees this entry */
        if (kv->key.len == 0) return perr(p, at, DX_EFORMAT, "empty key");
        set_where(p, "key", kv->key);
        if ((rc = parse_value(p, kv))) return rc;
        uint64_t slot = index_probe(&ctx->kv_index, ctx->kv, sizeof *kv, kv->key);
        if (ctx->kv_index.slot[slot])
            return perr(p, at, DX_EFORMAT, "duplicate key (first defined as kv %" PRIu64 ")",
                        ctx->kv_index.slot[slot] - 1);
        ctx->kv_index.slot[slot] = i + 1;
    }
    p->where[0] = 0;
    return 0;
}

static int read_alignment(gguf_parser *p)
{
    gguf_ctx *ctx = p->ctx;
    ctx->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = index_find(&ctx->kv_index, ctx->kv, sizeof *ctx->kv, "general.alignment");
    if (i < 0) return 0;
    const gguf_kv *kv = &ctx->kv[i];
    uint64_t at = (uint64_t)(kv->val - ctx->base);
    if (kv->type != GGUF_T_UINT32)
        return perr(p, at, DX_EFORMAT, "general.alignment has type %s, expected uint32",
                    gguf_vtype_name(kv->type));
    uint32_t a;
    memcpy(&a, kv->val, 4);
    if (!is_pow2(a))
        return perr(p, at, DX_EFORMAT, "general.alignment %u is not a power of two", a);
    ctx->alignment = a;
    return 0;
}

/* Any type GGML defines is sized and accepted here, so that every GGUF file
 * parses; which types the engine can run is the model loader's question. */
static int check_tensor_type(gguf_parser *p, uint64_t at, uint32_t type)
{
    if (type <= INT32_MAX && dx_dtype_block_elems((int)type)) return 0;
    return perr(p, at, DX_EFORMAT, "unknown tensor type %u", type);
}

static int parse_shape(gguf_parser *p, gguf_tensor_info *t)
{
    uint64_t at = p->pos;
    int rc = rd_u32(p, "n_dims", &t->n_dims);
    if (rc) return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return perr(p, at, DX_EFORMAT, "n_dims %u is not in 1..%d", t->n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        at = p->pos;
        if ((rc = rd_u64(p, "dimension", &t->ne[d]))) return rc;
        if (t->ne[d] > INT64_MAX)
            return perr(p, at, DX_EFORMAT, "ne[%u] = %" PRIu64 " is out of range", d, t->ne[d]);
    }
    return 0;
}

static int parse_tensor_info(gguf_parser *p, gguf_tensor_info *t, uint64_t i)
{
    uint64_t at = p->pos;
    snprintf(p->where, sizeof p->where, "tensor %" PRIu64, i);
    int rc = rd_str(p, "tensor name", &t->name);
    if (rc) return rc;
    if (t->name.len == 0) return perr(p, at, DX_EFORMAT, "empty tensor name");
    set_where(p, "tensor", t->name);
    uint32_t type;
    if ((rc = parse_shape(p, t))) return rc;
    uint64_t at_type = p->pos;
    if ((rc = rd_u32(p, "tensor type", &type)) || (rc = check_tensor_type(p, at_type, type)))
        return rc;
    t->type = (int)type;
    size_t block = dx_dtype_block_elems(t->type);
    if (t->ne[0] % block)
        return perr(p, at_type, DX_EFORMAT,
                    "ne[0] = %" PRIu64 " is not a multiple of the %s block size %zu", t->ne[0],
                    dx_dtype_name(t->type), block);
    if (tensor_nbytes(t->type, t->n_dims, t->ne, &t->nbytes))
        return perr(p, at_type, DX_EFORMAT,
                    "shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64 "] overflows",
                    t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    uint64_t at_off = p->pos;
    if ((rc = rd_u64(p, "tensor data offset", &t->offset))) return rc;
    if (t->offset % p->ctx->alignment)
        return perr(p, at_off, DX_EFORMAT,
                    "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                    t->offset, p->ctx->alignment);
    return 0;
}

static int parse_tensor_infos(gguf_parser *p, uint64_t n)
{
    gguf_ctx *ctx = p->ctx;
    if (index_init(&ctx->tensor_index, n)) return oom(p, "tensor index");
    if (n && !(ctx->tensors = dx_calloc(n, sizeof *ctx->tensors))) return oom(p, "tensor table");
    for (uint64_t i = 0; i < n; i++) {
        gguf_tensor_info *t = &ctx->tensors[i];
        uint64_t at = p->pos;
        int rc = parse_tensor_info(p, t, i);
        if (rc) return rc;
        uint64_t slot = index_probe(&ctx->tensor_index, ctx->tensors, sizeof *t, t->name);
        if (ctx->tensor_index.slot[slot])
            return perr(p, at, DX_EFORMAT,
                        "duplicate tensor name (first defined as tensor %" PRIu64 ")",
                        ctx->tensor_index.slot[slot] - 1);
        ctx->tensor_index.slot[slot] = i + 1;
        ctx->n_tensors = i + 1;
    }
    p->where[0] = 0;
    return 0;
}

typedef struct {
    uint64_t begin, end, idx;
} gguf_span;

static int span_cmp(const void *a, const void *b)
{
    const gguf_span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Data ranges must lie inside the file and not overlap. */
static int place_tensors(gguf_parser *p)
{
    gguf_ctx *ctx = p->ctx;
    if (align_up(p->pos, ctx->alignment, &ctx->data_offset))
        return perr(p, p->pos, DX_EFORMAT, "data section offset overflows");
    uint64_t data_size = ctx->size > ctx->data_offset ? ctx->size - ctx->data_offset : 0;
    gguf_span *spans = ctx->n_tensors ? dx_malloc(ctx->n_tensors * sizeof *spans) : NULL;
    if (ctx->n_tensors && !spans) return oom(p, "tensor ranges");
    uint64_t n = 0;
    int rc = 0;
    for (uint64_t i = 0; i < ctx->n_tensors && !rc; i++) {
        gguf_tensor_info *t = &ctx->tensors[i];
        set_where(p, "tensor", t->name);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            rc = perr(p, ctx->data_offset + t->offset, DX_EFORMAT,
                      "data (%" PRIu64 " bytes at data offset %" PRIu64
                      ") ends past the end of the file (%" PRIu64 " bytes)",
                      t->nbytes, t->offset, ctx->size);
        else if (t->nbytes) { /* empty tensors occupy nothing and get no pointer */
            t->data = ctx->base + ctx->data_offset + t->offset;
            spans[n++] = (gguf_span){t->offset, t->offset + t->nbytes, i};
        }
    }
    if (!rc && n > 1) qsort(spans, n, sizeof *spans, span_cmp);
    for (uint64_t k = 1; k < n && !rc; k++) {
        if (spans[k].begin >= spans[k - 1].end) continue;
        char other[sizeof p->where];
        set_where(p, "tensor", ctx->tensors[spans[k - 1].idx].name);
        memcpy(other, p->where, sizeof other);
        set_where(p, "tensor", ctx->tensors[spans[k].idx].name);
        rc = perr(p, ctx->data_offset + spans[k].begin, DX_EFORMAT, "data overlaps %s", other);
    }
    dx_free(spans);
    p->where[0] = 0;
    return rc;
}

static void ctx_free(gguf_ctx *ctx)
{
    for (uint64_t i = 0; i < ctx->n_kv; i++) dx_free(ctx->kv[i].str_off);
    dx_free(ctx->kv);
    dx_free(ctx->tensors);
    dx_free(ctx->kv_index.slot);
    dx_free(ctx->tensor_index.slot);
    dx_free(ctx->name);
    dx_free(ctx);
}

static int open_common(const void *data, size_t size, const char *name, gguf_ctx **out)
{
    static const uint8_t empty[1];
    gguf_ctx *ctx = dx_calloc(1, sizeof *ctx);
    if (!ctx || !(ctx->name = dx_strdup(name))) {
        dx_free(ctx);
        return dx_errf(DX_ENOMEM, "%s: out of memory opening GGUF", name);
    }
    ctx->base = data ? data : empty; /* never form NULL + offset */
    ctx->size = data ? size : 0;
    gguf_parser p = {.ctx = ctx};
    uint64_t n_tensors, n_kv;
    int rc = parse_header(&p, &n_tensors, &n_kv);
    if (!rc) rc = parse_kvs(&p, n_kv);
    if (!rc) rc = read_alignment(&p);
    if (!rc) rc = parse_tensor_infos(&p, n_tensors);
    if (!rc) rc = place_tensors(&p);
    if (rc) {
        ctx_free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

int gguf_open_mem(const void *data, size_t size, const char *name, gguf_ctx **out)
{
    *out = NULL;
    return open_common(data, size, name ? name : "<memory>", out);
}

int gguf_open(const char *path, gguf_ctx **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dx_errf(errno == ENOENT ? DX_ENOENT : DX_EIO, "%s: cannot open: %s", path,
                       strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dx_errf(DX_EIO, "%s: not a regular file", path);
    }
    void *map = NULL;
    size_t size = (size_t)st.st_size;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return dx_errf(DX_EIO, "%s: mmap of %zu bytes failed: %s", path, size, strerror(e));
        }
    }
    close(fd); /* the mapping keeps the file */
    int rc = open_common(map, size, path, out);
    if (rc) {
        if (map) munmap(map, size);
        return rc;
    }
    (*out)->mapped = map != NULL;
    return 0;
}

void gguf_close(gguf_ctx *ctx)
{
    if (!ctx) return;
    if (ctx->mapped) munmap((void *)ctx->base, ctx->size);
    ctx_free(ctx);
}

uint32_t gguf_version(const gguf_ctx *ctx)
{
    return ctx->version;
}
uint64_t gguf_file_size(const gguf_ctx *ctx)
{
    return ctx->size;
}
uint64_t gguf_alignment(const gguf_ctx *ctx)
{
    return ctx->alignment;
}
uint64_t gguf_data_offset(const gguf_ctx *ctx)
{
    return ctx->data_offset;
}
const char *gguf_name(const gguf_ctx *ctx)
{
    return ctx->name;
}
uint64_t gguf_n_kv(const gguf_ctx *ctx)
{
    return ctx->n_kv;
}
uint64_t gguf_n_tensors(const gguf_ctx *ctx)
{
    return ctx->n_tensors;
}

gguf_str gguf_kv_key(const gguf_ctx *ctx, uint64_t i)
{
    DX_ASSERT(i < ctx->n_kv);
    return ctx->kv[i].key;
}

enum gguf_vtype gguf_kv_type(const gguf_ctx *ctx, uint64_t i)
{
    DX_ASSERT(i < ctx->n_kv);
    return ctx->kv[i].type;
}

int gguf_kv_array_info(const gguf_ctx *ctx, uint64_t i, enum gguf_vtype *elem, uint64_t *n)
{
    if (i >= ctx->n_kv)
        return dx_errf(DX_ERANGE, "%s: kv index %" PRIu64 " out of range (%" PRIu64 " keys)",
                       ctx->name, i, ctx->n_kv);
    const gguf_kv *kv = &ctx->kv[i];
    if (kv->type != GGUF_T_ARRAY)
        return dx_errf(DX_EINVAL, "%s: key '%.*s' is a %s, not an array", ctx->name,
                       (int)kv->key.len, kv->key.ptr, gguf_vtype_name(kv->type));
    if (elem) *elem = kv->elem;
    if (n) *n = kv->n;
    return 0;
}

int64_t gguf_find_key(const gguf_ctx *ctx, const char *key)
{
    return index_find(&ctx->kv_index, ctx->kv, sizeof *ctx->kv, key);
}

static int lookup(const gguf_ctx *ctx, const char *key, const gguf_kv **kv)
{
    int64_t i = gguf_find_key(ctx, key);
    if (i < 0) return dx_errf(DX_ENOENT, "%s: key '%s' not found", ctx->name, key ? key : "");
    *kv = &ctx->kv[i];
    return 0;
}

static int wrong_type(const gguf_ctx *ctx, const char *key, const gguf_kv *kv, const char *want)
{
    return dx_errf(DX_EFORMAT, "%s: key '%s' has type %s, expected %s", ctx->name, key,
                   gguf_vtype_name(kv->type), want);
}

/* An integer value: *neg set means it is negative and held in *s, otherwise
 * it is in *u.  DX_EFORMAT if the value is not an integer (the caller names
 * the key). */
static int kv_int(const gguf_kv *kv, int *neg, uint64_t *u, int64_t *s)
{
    enum gguf_vtype t = kv->type;
    int is_signed = t == GGUF_T_INT8 || t == GGUF_T_INT16 || t == GGUF_T_INT32 || t == GGUF_T_INT64;
    if (!is_signed && t != GGUF_T_UINT8 && t != GGUF_T_UINT16 && t != GGUF_T_UINT32 &&
        t != GGUF_T_UINT64)
        return dx_errf(DX_EFORMAT, "a %s, not an integer", gguf_vtype_name(t));
    uint64_t bits = 8 * gguf_vtype_size(t), raw = 0;
    memcpy(&raw, kv->val, bits / 8); /* little-endian: low bytes first */
    *neg = is_signed && (raw >> (bits - 1)) & 1;
    if (*neg && bits < 64) raw |= ~0ull << bits; /* sign-extend */
    *u = raw;
    memcpy(s, &raw, 8);
    return 0;
}

/* The value of integer key `key` if it lies in [lo, hi] (hi >= 0). */
static int get_int(const gguf_ctx *ctx, const char *key, int64_t lo, uint64_t hi, int *neg,
                   uint64_t *u, int64_t *s, const char *want)
{
    const gguf_kv *kv = NULL;
    int rc = lookup(ctx, key, &kv);
    if (rc) return rc;
    if (kv_int(kv, neg, u, s)) return wrong_type(ctx, key, kv, "an integer");
    if (*neg ? *s < lo : *u > hi) {
        char v[32];
        if (*neg)
            snprintf(v, sizeof v, "%" PRId64, *s);
        else
            snprintf(v, sizeof v, "%" PRIu64, *u);
        return dx_errf(DX_EFORMAT, "%s: key '%s' value %s does not fit %s", ctx->name, key, v,
                       want);
    }
    return 0;
}

int gguf_get_u32(const gguf_ctx *ctx, const char *key, uint32_t *out)
{
    int neg;
    uint64_t u;
    int64_t s;
    int rc = get_int(ctx, key, 0, UINT32_MAX, &neg, &u, &s, "uint32");
    if (!rc) *out = (uint32_t)u;
    return rc;
}

int gguf_get_u64(const gguf_ctx *ctx, const char *key, uint64_t *out)
{
    int neg;
    uint64_t u;
    int64_t s;
    int rc = get_int(ctx, key, 0, UINT64_MAX, &neg, &u, &s, "uint64");
    if (!rc) *out = u;
    return rc;
}

int gguf_get_i64(const gguf_ctx *ctx, const char *key, int64_t *out)
{
    int neg;
    uint64_t u;
    int64_t s;
    int rc = get_int(ctx, key, INT64_MIN, INT64_MAX, &neg, &u, &s, "int64");
    if (!rc) *out = neg ? s : (int64_t)u;
    return rc;
}

int gguf_get_f32(const gguf_ctx *ctx, const char *key, float *out)
{
    const gguf_kv *kv = NULL;
    int rc = lookup(ctx, key, &kv);
    if (rc) return rc;
    if (kv->type == GGUF_T_FLOAT32) {
        memcpy(out, kv->val, 4);
        return 0;
    }
    if (kv->type != GGUF_T_FLOAT64) return wrong_type(ctx, key, kv, "float32 or float64");
    double d;
    memcpy(&d, kv->val, 8);
    /* Converting a finite double outside float's range is undefined. */
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return dx_errf(DX_EFORMAT, "%s: key '%s' value %g does not fit float32", ctx->name, key, d);
    *out = (float)d;
    return 0;
}

int gguf_get_bool(const gguf_ctx *ctx, const char *key, int *out)
{
    const gguf_kv *kv = NULL;
    int rc = lookup(ctx, key, &kv);
    if (rc) return rc;
    if (kv->type != GGUF_T_BOOL) return wrong_type(ctx, key, kv, "bool");
    *out = kv->val[0]; /* 0 or 1, checked at open */
    return 0;
}

/* A string serialised at p (length prefix checked at open). */
static gguf_str str_at(const uint8_t *p)
{
    gguf_str s;
    memcpy(&s.len, p, 8);
    s.ptr = (const char *)p + 8;
    return s;
}

int gguf_get_str(const gguf_ctx *ctx, const char *key, gguf_str *out)
{
    const gguf_kv *kv = NULL;
    int rc = lookup(ctx, key, &kv);
    if (rc) return rc;
    if (kv->type != GGUF_T_STRING) return wrong_type(ctx, key, kv, "string");
    *out = str_at(kv->val);
    return 0;
}

int gguf_get_arr(const gguf_ctx *ctx, const char *key, enum gguf_vtype *elem, uint64_t *n,
                 const void **data)
{
    const gguf_kv *kv = NULL;
    int rc = lookup(ctx, key, &kv);
    if (rc) return rc;
    if (kv->type != GGUF_T_ARRAY) return wrong_type(ctx, key, kv, "array");
    if (elem) *elem = kv->elem;
    if (n) *n = kv->n;
    if (data) *data = kv->val;
    return 0;
}

int gguf_get_arr_str(const gguf_ctx *ctx, const char *key, uint64_t i, gguf_str *out)
{
    const gguf_kv *kv = NULL;
    int rc = lookup(ctx, key, &kv);
    if (rc) return rc;
    if (kv->type != GGUF_T_ARRAY || kv->elem != GGUF_T_STRING)
        return wrong_type(ctx, key, kv, "array of string");
    if (i >= kv->n)
        return dx_errf(DX_ERANGE,
                       "%s: key '%s': index %" PRIu64 " out of range (%" PRIu64 " strings)",
                       ctx->name, key, i, kv->n);
    *out = str_at(kv->val + kv->str_off[i]);
    return 0;
}

int gguf_tensor(const gguf_ctx *ctx, uint64_t i, gguf_tensor_info *out)
{
    if (i >= ctx->n_tensors)
        return dx_errf(DX_ERANGE, "%s: tensor index %" PRIu64 " out of range (%" PRIu64 " tensors)",
                       ctx->name, i, ctx->n_tensors);
    *out = ctx->tensors[i];
    return 0;
}

int gguf_find_tensor(const gguf_ctx *ctx, const char *name, gguf_tensor_info *out)
{
    int64_t i = index_find(&ctx->tensor_index, ctx->tensors, sizeof *ctx->tensors, name);
    if (i < 0) return dx_errf(DX_ENOENT, "%s: tensor '%s' not found", ctx->name, name ? name : "");
    if (out) *out = ctx->tensors[i];
    return 0;
}

/* ------------------------------------------------------------------ */
/* Writer                                                              */

typedef struct {
    char *key;
    enum gguf_vtype type;
    uint8_t *val; /* the value as serialised after the type field */
    uint64_t len;
} gguf_wkv;

typedef struct {
    char *name;
    int type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset; /* set when laying out the file */
    void *data;      /* copied data, or NULL when filled */
    gguf_fill_fn fill;
    void *user;
} gguf_wtensor;

struct gguf_writer {
    uint32_t version;
    uint32_t alignment;
    gguf_wkv *kv;
    uint64_t n_kv, cap_kv;
    gguf_wtensor *t;
    uint64_t n_t, cap_t;
};

gguf_writer *gguf_writer_create(void)
{
    gguf_writer *w = dx_calloc(1, sizeof *w);
    if (!w) return NULL;
    w->version = 3;
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_destroy(gguf_writer *w)
{
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        dx_free(w->kv[i].key);
        dx_free(w->kv[i].val);
    }
    for (uint64_t i = 0; i < w->n_t; i++) {
        dx_free(w->t[i].name);
        dx_free(w->t[i].data);
    }
    dx_free(w->kv);
    dx_free(w->t);
    dx_free(w);
}

void gguf_w_set_version(gguf_writer *w, uint32_t version)
{
    w->version = version;
}

/* The index of the key; DX_NONE when it is not set. */
static int64_t w_find_kv(const gguf_writer *w, const char *key)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return (int64_t)i;
    return DX_NONE;
}

static void w_remove_kv(gguf_writer *w, const char *key)
{
    int64_t i = w_find_kv(w, key);
    if (i < 0) return;
    dx_free(w->kv[i].key);
    dx_free(w->kv[i].val);
    memmove(&w->kv[i], &w->kv[i + 1], (w->n_kv - (uint64_t)i - 1) * sizeof *w->kv);
    w->n_kv--;
}

/* Grow an array of `size`-byte items to hold one more: 0 or DX_ENOMEM (the
 * caller names the array). */
static int grow(void **arr, uint64_t *cap, uint64_t n, size_t size)
{
    if (n < *cap) return 0;
    uint64_t ncap = *cap ? *cap * 2 : 16;
    void *p = dx_realloc(*arr, ncap * size);
    if (!p) return dx_errf(DX_ENOMEM, "out of memory for %" PRIu64 " items", ncap);
    *arr = p;
    *cap = ncap;
    return 0;
}

/* Takes ownership of `val` (freed on failure). */
static int w_set(gguf_writer *w, const char *key, enum gguf_vtype type, uint8_t *val, uint64_t len)
{
    if (!key || !key[0]) {
        dx_free(val);
        return dx_errf(DX_EINVAL, "gguf writer: empty key");
    }
    int64_t i = w_find_kv(w, key);
    if (i >= 0) {
        dx_free(w->kv[i].val);
        w->kv[i] = (gguf_wkv){w->kv[i].key, type, val, len};
        return 0;
    }
    char *k = dx_strdup(key);
    if (!k || grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv)) {
        dx_free(k);
        dx_free(val);
        return dx_errf(DX_ENOMEM, "gguf writer: out of memory setting '%s'", key);
    }
    w->kv[w->n_kv++] = (gguf_wkv){k, type, val, len};
    return 0;
}

static int w_set_scalar(gguf_writer *w, const char *key, enum gguf_vtype type, const void *v)
{
    uint64_t len = gguf_vtype_size(type);
    uint8_t *val = dx_memdup(v, len);
    if (!val) return dx_errf(DX_ENOMEM, "gguf writer: out of memory setting '%s'", key ? key : "");
    return w_set(w, key, type, val, len);
}

void gguf_w_set_alignment(gguf_writer *w, uint32_t alignment)
{
    DX_ASSERT(is_pow2(alignment)); /* a caller bug, not file input */
    w->alignment = alignment;
    if (alignment == GGUF_DEFAULT_ALIGNMENT) {
        w_remove_kv(w, "general.alignment");
        return;
    }
    /* Out of memory here leaves the key unset; gguf_w_write_* then fails
     * rather than write a file whose layout the key does not describe. */
    if (gguf_w_set_u32(w, "general.alignment", alignment)) w_remove_kv(w, "general.alignment");
}

int gguf_w_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    return w_set_scalar(w, key, GGUF_T_UINT32, &v);
}

int gguf_w_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    return w_set_scalar(w, key, GGUF_T_INT32, &v);
}

int gguf_w_set_u64(gguf_writer *w, const char *key, uint64_t v)
{
    return w_set_scalar(w, key, GGUF_T_UINT64, &v);
}

int gguf_w_set_f32(gguf_writer *w, const char *key, float v)
{
    return w_set_scalar(w, key, GGUF_T_FLOAT32, &v);
}

int gguf_w_set_bool(gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    return w_set_scalar(w, key, GGUF_T_BOOL, &b);
}

static uint8_t *put(uint8_t *p, const void *v, uint64_t n)
{
    if (n) memcpy(p, v, n);
    return p + n;
}

static uint8_t *put_u32(uint8_t *p, uint32_t v)
{
    return put(p, &v, 4);
}
static uint8_t *put_u64(uint8_t *p, uint64_t v)
{
    return put(p, &v, 8);
}
static uint8_t *put_str(uint8_t *p, const char *s, uint64_t n)
{
    return put(put_u64(p, n), s, n);
}

int gguf_w_set_str(gguf_writer *w, const char *key, const char *v)
{
    if (!v) return dx_errf(DX_EINVAL, "gguf writer: NULL string for '%s'", key ? key : "");
    uint64_t n = strlen(v);
    uint8_t *val = dx_malloc(8 + n);
    if (!val) return dx_errf(DX_ENOMEM, "gguf writer: out of memory setting '%s'", key ? key : "");
    put_str(val, v, n);
    return w_set(w, key, GGUF_T_STRING, val, 8 + n);
}

int gguf_w_set_arr(gguf_writer *w, const char *key, enum gguf_vtype elem, const void *data,
                   uint64_t n)
{
    uint64_t esize = gguf_vtype_size(elem), bytes;
    if (!esize || (n && !data))
        return dx_errf(DX_EINVAL, "gguf writer: '%s': bad array (element type %s)", key ? key : "",
                       gguf_vtype_name(elem));
    if (elem == GGUF_T_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return dx_errf(DX_EINVAL, "gguf writer: '%s': bool element %" PRIu64 " not 0/1",
                               key ? key : "", i);
    if (__builtin_mul_overflow(n, esize, &bytes) || bytes > SIZE_MAX - 12)
        return dx_errf(DX_EINVAL, "gguf writer: '%s': array of %" PRIu64 " elements too large",
                       key ? key : "", n);
    uint8_t *val = dx_malloc(12 + bytes);
    if (!val) return dx_errf(DX_ENOMEM, "gguf writer: out of memory setting '%s'", key ? key : "");
    put(put_u64(put_u32(val, elem), n), data, bytes);
    return w_set(w, key, GGUF_T_ARRAY, val, 12 + bytes);
}

int gguf_w_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n)
{
    uint64_t bytes = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i])
            return dx_errf(DX_EINVAL, "gguf writer: '%s': NULL string %" PRIu64, key ? key : "", i);
        bytes += 8 + strlen(strs[i]); /* cannot overflow: the strings are in memory */
    }
    uint8_t *val = dx_malloc(bytes), *p = val;
    if (!val) return dx_errf(DX_ENOMEM, "gguf writer: out of memory setting '%s'", key ? key : "");
    p = put_u64(put_u32(p, GGUF_T_STRING), n);
    for (uint64_t i = 0; i < n; i++) p = put_str(p, strs[i], strlen(strs[i]));
    return w_set(w, key, GGUF_T_ARRAY, val, bytes);
}

/* The writer only writes what the reader accepts. */
static int w_check_tensor(const gguf_writer *w, const char *name, int type, uint32_t n_dims,
                          const uint64_t *ne, uint64_t *nbytes)
{
    if (!name || !name[0]) return dx_errf(DX_EINVAL, "gguf writer: empty tensor name");
    if (!dx_dtype_block_elems(type))
        return dx_errf(DX_EINVAL, "gguf writer: tensor '%s': unknown type %d", name, type);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return dx_errf(DX_EINVAL, "gguf writer: tensor '%s': n_dims %u not in 1..%d", name, n_dims,
                       GGUF_MAX_DIMS);
    uint64_t full[GGUF_MAX_DIMS] = {1, 1, 1, 1};
    for (uint32_t d = 0; d < n_dims; d++) full[d] = ne[d];
    if (ne[0] % dx_dtype_block_elems(type) || tensor_nbytes(type, n_dims, full, nbytes))
        return dx_errf(DX_EINVAL, "gguf writer: tensor '%s': bad shape for %s", name,
                       dx_dtype_name(type));
    for (uint64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return dx_errf(DX_EEXIST, "gguf writer: duplicate tensor '%s'", name);
    return 0;
}

static int w_add(gguf_writer *w, const char *name, int type, uint32_t n_dims, const uint64_t *ne,
                 const void *data, gguf_fill_fn fill, void *user)
{
    uint64_t nbytes = 0;
    int rc = w_check_tensor(w, name, type, n_dims, ne, &nbytes);
    if (rc) return rc;
    gguf_wtensor t = {.name = dx_strdup(name),
                      .type = type,
                      .n_dims = n_dims,
                      .nbytes = nbytes,
                      .fill = fill,
                      .user = user};
    for (uint32_t d = 0; d < n_dims; d++) t.ne[d] = ne[d];
    if (data && nbytes) t.data = dx_memdup(data, nbytes);
    if (!t.name || (data && nbytes && !t.data) ||
        grow((void **)&w->t, &w->cap_t, w->n_t, sizeof *w->t)) {
        dx_free(t.name);
        dx_free(t.data);
        return dx_errf(DX_ENOMEM, "gguf writer: out of memory adding tensor '%s'", name);
    }
    w->t[w->n_t++] = t;
    return 0;
}

int gguf_w_add_tensor(gguf_writer *w, const char *name, int type, uint32_t n_dims,
                      const uint64_t *ne, const void *data)
{
    if (!data) return dx_errf(DX_EINVAL, "gguf writer: tensor '%s': NULL data", name ? name : "");
    return w_add(w, name, type, n_dims, ne, data, NULL, NULL);
}

int gguf_w_add_tensor_fill(gguf_writer *w, const char *name, int type, uint32_t n_dims,
                           const uint64_t *ne, gguf_fill_fn fill, void *user)
{
    if (!fill) return dx_errf(DX_EINVAL, "gguf writer: tensor '%s': NULL fill", name ? name : "");
    return w_add(w, name, type, n_dims, ne, NULL, fill, user);
}

/* Sets each tensor's offset and returns the data section offset and the file
 * size. */
static int w_layout(gguf_writer *w, uint64_t *data_off, uint64_t *total)
{
    if (w->alignment != GGUF_DEFAULT_ALIGNMENT) {
        int64_t k = w_find_kv(w, "general.alignment");
        uint32_t v = 0;
        if (k >= 0 && w->kv[k].type == GGUF_T_UINT32) memcpy(&v, w->kv[k].val, 4);
        if (v != w->alignment)
            return dx_errf(DX_EINVAL,
                           "gguf writer: general.alignment does not hold the layout's "
                           "alignment %u (out of memory in gguf_w_set_alignment?)",
                           w->alignment);
    }
    uint64_t meta = GGUF_HEADER_BYTES, cur = 0;
    for (uint64_t i = 0; i < w->n_kv; i++) meta += 8 + strlen(w->kv[i].key) + 4 + w->kv[i].len;
    for (uint64_t i = 0; i < w->n_t; i++)
        meta += 8 + strlen(w->t[i].name) + 4 + 8 * w->t[i].n_dims + 12;
    if (align_up(meta, w->alignment, data_off))
        return dx_errf(DX_ETOOBIG, "gguf writer: too large");
    for (uint64_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = cur;
        if (__builtin_add_overflow(cur, w->t[i].nbytes, &cur) || align_up(cur, w->alignment, &cur))
            return dx_errf(DX_ETOOBIG, "gguf writer: too large");
    }
    if (__builtin_add_overflow(*data_off, cur, total) || *total > SIZE_MAX)
        return dx_errf(DX_ETOOBIG, "gguf writer: too large");
    return 0;
}

static uint8_t *w_emit_meta(const gguf_writer *w, uint8_t *p)
{
    p = put_u32(put_u32(p, GGUF_MAGIC), w->version);
    p = put_u64(put_u64(p, w->n_t), w->n_kv);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        const gguf_wkv *kv = &w->kv[i];
        p = put(put_u32(put_str(p, kv->key, strlen(kv->key)), kv->type), kv->val, kv->len);
    }
    for (uint64_t i = 0; i < w->n_t; i++) {
        const gguf_wtensor *t = &w->t[i];
        p = put_u32(put_str(p, t->name, strlen(t->name)), t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) p = put_u64(p, t->ne[d]);
        p = put_u64(put_u32(p, (uint32_t)t->type), t->offset);
    }
    return p;
}

/* Produces a tensor's bytes at dst. */
static int w_tensor_bytes(const gguf_wtensor *t, uint8_t *dst)
{
    if (!t->fill) {
        put(dst, t->data, t->nbytes);
        return 0;
    }
    int rc = t->nbytes ? t->fill(t->user, dst, t->nbytes) : 0;
    return rc < 0 ? dx_err_wrap(rc, "gguf writer: filling tensor '%s'", t->name) : 0;
}

/* The whole file into dst[0, total); padding is zeroed. */
static int w_emit(const gguf_writer *w, uint8_t *dst, uint64_t data_off, uint64_t total)
{
    memset(dst, 0, (size_t)total); /* padding; cheap next to producing the data */
    w_emit_meta(w, dst);
    for (uint64_t i = 0; i < w->n_t; i++) {
        int rc = w_tensor_bytes(&w->t[i], dst + data_off + w->t[i].offset);
        if (rc) return rc;
    }
    return 0;
}

int gguf_w_write_mem(gguf_writer *w, void **out, size_t *size)
{
    *out = NULL;
    *size = 0;
    uint64_t data_off, total;
    int rc = w_layout(w, &data_off, &total);
    if (rc) return rc;
    uint8_t *buf = dx_malloc((size_t)total);
    if (!buf) return dx_errf(DX_ENOMEM, "gguf writer: out of memory for %" PRIu64 " bytes", total);
    if ((rc = w_emit(w, buf, data_off, total))) {
        dx_free(buf);
        return rc;
    }
    *out = buf;
    *size = (size_t)total;
    return 0;
}

/* 0, or DX_EIO "write failed: …" (the caller adds the file's name). */
static int pwrite_all(int fd, const uint8_t *p, uint64_t n, uint64_t off)
{
    while (n) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return dx_errf(DX_EIO, "write failed: %s", strerror(errno));
        p += k, n -= (uint64_t)k, off += (uint64_t)k;
    }
    return 0;
}

/* Tensor data goes straight into a shared mapping of its own window of the
 * file, unmapped after each tensor, so the process holds at most one tensor
 * (and the kernel writes it back as it likes). */
static int w_tensor_to_fd(int fd, const char *tmp, uint64_t start, const gguf_wtensor *t)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), base = start & ~(page - 1);
    size_t len = (size_t)(start + t->nbytes - base);
    uint8_t *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)base);
    if (map == MAP_FAILED)
        return dx_errf(DX_EIO, "%s: mmap for tensor '%s' failed: %s", tmp, t->name,
                       strerror(errno));
    int rc = w_tensor_bytes(t, map + (start - base));
    munmap(map, len);
    return rc;
}

/* Reserves `total` bytes (read back as zeros, so padding needs no writes),
 * writes the metadata, then each tensor. */
static int w_emit_fd(const gguf_writer *w, int fd, const char *tmp, uint64_t data_off,
                     uint64_t total)
{
    int e = posix_fallocate(fd, 0, (off_t)total);
    if (e == EOPNOTSUPP || e == EINVAL) e = ftruncate(fd, (off_t)total) ? errno : 0;
    if (e)
        return dx_errf(DX_EIO, "%s: cannot reserve %" PRIu64 " bytes: %s", tmp, total, strerror(e));
    uint8_t *meta = dx_calloc(1, (size_t)data_off);
    if (!meta) return dx_errf(DX_ENOMEM, "%s: out of memory for the metadata", tmp);
    uint64_t meta_len = (uint64_t)(w_emit_meta(w, meta) - meta);
    int rc = pwrite_all(fd, meta, meta_len, 0);
    if (rc) dx_err_wrap(rc, "%s", tmp);
    dx_free(meta);
    for (uint64_t i = 0; i < w->n_t && !rc; i++)
        if (w->t[i].nbytes) rc = w_tensor_to_fd(fd, tmp, data_off + w->t[i].offset, &w->t[i]);
    return rc;
}

int gguf_w_write_file(gguf_writer *w, const char *path)
{
    uint64_t data_off, total;
    int rc = w_layout(w, &data_off, &total);
    if (rc) return rc;
    size_t n = strlen(path);
    char *tmp = dx_malloc(n + 5);
    if (!tmp) return dx_errf(DX_ENOMEM, "%s: out of memory", path);
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = dx_errf(DX_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        rc = w_emit_fd(w, fd, tmp, data_off, total);
        if (close(fd) != 0 && !rc) rc = dx_errf(DX_EIO, "%s: close: %s", tmp, strerror(errno));
        if (!rc && rename(tmp, path) != 0)
            rc = dx_errf(DX_EIO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        if (rc) unlink(tmp);
    }
    dx_free(tmp);
    return rc;
}
