/* kern_attn: paged causal GQA attention — the scalar reference, the tiling
 * driver shared by the AVX2/AVX-512 paths, and the dispatch.
 *
 * Batch invariance: for every query row the keys are visited in position
 * order one KV block at a time (block boundaries are multiples of
 * block_size, fixed by position), with an online softmax per block:
 *   s_j = scale*dot(q, k_j)  (fixed-order dot),  m' = max(m, max_j s_j),
 *   acc = acc*exp(m - m') + sum_j exp(s_j - m')*v_j  (in key order),
 * normalised by the accumulated denominator at the end.  Keys past the
 * query's position are never read into its arithmetic (no 0*garbage), and
 * blocks entirely past it are skipped, so a row's bits depend only on its
 * own position and data, never on n_q, pos0, [h0, h1) or the tile.
 *
 * The fast driver tiles TILE_Q query tokens × the query heads sharing a kv
 * head, converts each block's K/V rows to f32 once per tile and runs the
 * ISA's per-block primitives (kern_attn_internal.h) over the tile's rows. */
#include <math.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern.h"
#include "engine/kern_attn_internal.h"

/* Query tokens per tile.  Each converted K/V block is reused by TILE_Q × G
 * rows; 16 (× 2 heads at 0.6b shapes) measured ~5% faster than 8 and ~10%
 * faster than 4 (scripts/bench/bench_attn.c), with the tile's acc, q and
 * the converted block still in L1/L2. */
#define TILE_Q    16
#define MAX_LANES 16

static size_t attn_align(size_t n)
{
    return (n + 63) & ~(size_t)63;
}
static size_t attn_round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

typedef struct {
    float *kbuf, *vbuf;  /* [block_size][head_dim] converted K / V */
    float *acc;          /* [rows][head_dim] */
    float *s;            /* [rows][round16(block_size)] */
    float *lvec;         /* [rows][MAX_LANES] */
    kern_attn_row *rows; /* [rows] */
} attn_scratch;

static size_t attn_tile_rows(const kern_attn_layout *L, size_t max_q)
{
    size_t tq = max_q < TILE_Q ? max_q : TILE_Q;
    if (tq == 0) tq = 1;
    return tq * (size_t)(L->n_head / L->n_kv_head);
}

/* Carves scratch (or just measures it when base is NULL); returns bytes. */
static size_t attn_scratch_carve(const kern_attn_layout *L, size_t max_q, uint8_t *base,
                                 attn_scratch *sc)
{
    size_t R = attn_tile_rows(L, max_q), D = (size_t)L->head_dim;
    size_t bs = (size_t)L->block_size, off = 0;
    size_t sizes[6] = {bs * D * 4,        bs * D * 4,
                       R * D * 4,         R * attn_round16(bs) * 4,
                       R * MAX_LANES * 4, R * sizeof(kern_attn_row)};
    void **dst[6] = {(void **)&sc->kbuf, (void **)&sc->vbuf, (void **)&sc->acc,
                     (void **)&sc->s,    (void **)&sc->lvec, (void **)&sc->rows};
    for (int i = 0; i < 6; i++) {
        if (base) *dst[i] = base + off;
        off += attn_align(sizes[i]);
    }
    return off;
}

size_t kern_attn_scratch_bytes(const kern_attn_layout *L, size_t max_q)
{
    attn_scratch sc;
    return attn_scratch_carve(L, max_q, NULL, &sc);
}

static size_t attn_esize(int kv_type)
{
    return kv_type == DX_F32 ? 4 : 2;
}

/* This layer's K (or V, with region = v_off) rows of kv head h in block b. */
static const uint8_t *attn_rows(const kern_attn_layout *L, const int32_t *blocks, size_t b,
                                size_t region, int h)
{
    int32_t blk = blocks[b];
    DX_ASSERT(blk >= 0);
    return L->base + (size_t)blk * L->block_bytes + region +
           (size_t)h * (size_t)L->block_size * (size_t)L->head_dim * attn_esize(L->kv_type);
}

/* ---------------------------------------------------------------- scalar */

static float attn_elem(int kv_type, const uint8_t *row, int d)
{
    uint16_t h;
    float f;
    switch (kv_type) {
    case DX_F16:
        memcpy(&h, row + 2 * (size_t)d, 2);
        return dx_f16_to_f32(h);
    case DX_BF16:
        memcpy(&h, row + 2 * (size_t)d, 2);
        return dx_bf16_to_f32(h);
    default:
        memcpy(&f, row + 4 * (size_t)d, 4);
        return f;
    }
}

/* One query row against keys 0..pos of kv head h; s: [block_size], acc: [D]. */
static void attn_scalar_row(const kern_attn_layout *L, const int32_t *blocks, size_t pos, int h,
                            const float *q, float *out, float *s, float *acc)
{
    int D = L->head_dim, bs = L->block_size;
    size_t rb = (size_t)D * attn_esize(L->kv_type);
    float m = -INFINITY, l = 0.0f;
    memset(acc, 0, (size_t)D * sizeof(float));
    for (size_t b = 0; b <= pos / (size_t)bs; b++) {
        const uint8_t *k = attn_rows(L, blocks, b, L->k_off, h);
        const uint8_t *v = attn_rows(L, blocks, b, L->v_off, h);
        size_t left = pos - b * (size_t)bs + 1;
        int nv = left < (size_t)bs ? (int)left : bs;
        float bm = -INFINITY;
        for (int j = 0; j < nv; j++) {
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += q[d] * attn_elem(L->kv_type, k + j * rb, d);
            s[j] = L->scale * dot;
            bm = s[j] > bm ? s[j] : bm;
        }
        float mn = m > bm ? m : bm;
        float alpha = b == 0 ? 0.0f : expf(m - mn);
        l *= alpha;
        for (int d = 0; d < D; d++) acc[d] *= alpha;
        for (int j = 0; j < nv; j++) {
            float p = expf(s[j] - mn);
            l += p;
            for (int d = 0; d < D; d++) acc[d] += p * attn_elem(L->kv_type, v + j * rb, d);
        }
        m = mn;
    }
    for (int d = 0; d < D; d++) out[d] = acc[d] / l;
}

void kern_attn_scalar(const kern_attn_layout *L, const int32_t *blocks, size_t pos0, size_t n_q,
                      const float *q, float *out, int h0, int h1, void *scratch)
{
    attn_scratch sc;
    attn_scratch_carve(L, 1, scratch, &sc);
    int G = L->n_head / L->n_kv_head, D = L->head_dim;
    for (int h = h0; h < h1; h++)
        for (int g = 0; g < G; g++)
            for (size_t t = 0; t < n_q; t++) {
                size_t off = (t * (size_t)L->n_head + (size_t)(h * G + g)) * (size_t)D;
                attn_scalar_row(L, blocks, pos0 + t, h, q + off, out + off, sc.s, sc.acc);
            }
}

/* ------------------------------------------------------------ fast driver */

/* K or V rows [0, nk) of block b as f32: in place for F32, else converted. */
static const float *attn_block_f32(const kern_attn_isa *isa, const kern_attn_layout *L,
                                   const int32_t *blocks, size_t b, size_t region, int h, int nk,
                                   float *buf)
{
    const uint8_t *src = attn_rows(L, blocks, b, region, h);
    if (L->kv_type == DX_F32) return (const float *)src;
    isa->cvt(L->kv_type, src, buf, (size_t)nk * (size_t)L->head_dim);
    return buf;
}

/* Prefetch the K and V rows of block b (this head) into L2.  Consecutive
 * blocks of a sequence are a block apart in memory (1–2 MiB), so the hardware
 * prefetcher restarts at every block; asking one block ahead hides most of
 * the DRAM latency when few queries share a block (decode). */
static void attn_prefetch_block(const kern_attn_layout *L, const int32_t *blocks, size_t b, int h)
{
    size_t bytes = (size_t)L->block_size * (size_t)L->head_dim * attn_esize(L->kv_type);
    const uint8_t *k = attn_rows(L, blocks, b, L->k_off, h);
    const uint8_t *v = attn_rows(L, blocks, b, L->v_off, h);
    for (size_t o = 0; o < bytes; o += 64) {
        __builtin_prefetch(k + o, 0, 2);
        __builtin_prefetch(v + o, 0, 2);
    }
}

/* Rows are token-major, so a block's visible key counts never decrease along
 * the rows: a group's first row sees the fewest keys and the group shares
 * keys [0, nv_first); the longer rows finish alone.  Splitting the key loop
 * leaves each row's sequence of operations unchanged. */
static void attn_block_pv(const kern_attn_isa *isa, kern_attn_row *rows, int nr, const float *v,
                          int D)
{
    for (int g = 0; g < nr; g += 4) {
        int n = nr - g < 4 ? nr - g : 4;
        int j0 = rows[g].nv;
        isa->pv(rows + g, n, 0, j0, v, D, 1);
        for (int i = 1; i < n; i++)
            if (rows[g + i].nv > j0) isa->pv(rows + g + i, 1, j0, rows[g + i].nv, v, D, 0);
    }
}

/* One tile: query tokens [t0, t1) of kv head h, all G heads each. */
static void attn_tile(const kern_attn_isa *isa, const kern_attn_layout *L, const int32_t *blocks,
                      size_t pos0, size_t t0, size_t t1, const float *q, float *out, int h,
                      attn_scratch *sc)
{
    int G = L->n_head / L->n_kv_head, D = L->head_dim, bs = L->block_size;
    int R = (int)(t1 - t0) * G;
    size_t sstride = attn_round16((size_t)bs);
    for (int r = 0; r < R; r++) {
        size_t t = t0 + (size_t)(r / G);
        size_t off = (t * (size_t)L->n_head + (size_t)(h * G + r % G)) * (size_t)D;
        kern_attn_row *row = &sc->rows[r];
        row->q = q + off;
        row->acc = sc->acc + (size_t)r * (size_t)D;
        row->s = sc->s + (size_t)r * sstride;
        row->lvec = sc->lvec + (size_t)r * MAX_LANES;
        row->m = -INFINITY;
        memset(row->acc, 0, (size_t)D * sizeof(float));
        memset(row->lvec, 0, MAX_LANES * sizeof(float));
    }
    size_t pos_last = pos0 + t1 - 1;
    for (size_t b = 0; b <= pos_last / (size_t)bs; b++) {
        size_t kb = b * (size_t)bs;
        if (b < pos_last / (size_t)bs) attn_prefetch_block(L, blocks, b + 1, h);
        /* Rows whose token precedes this block do not see it at all. */
        size_t t_first = kb > pos0 + t0 ? kb - pos0 : t0;
        int r0 = (int)(t_first - t0) * G, nr = R - r0;
        size_t left = pos_last - kb + 1;
        int nk = left < (size_t)bs ? (int)left : bs;
        const float *k = attn_block_f32(isa, L, blocks, b, L->k_off, h, nk, sc->kbuf);
        const float *v = attn_block_f32(isa, L, blocks, b, L->v_off, h, nk, sc->vbuf);
        isa->qk(sc->rows + r0, nr, k, nk, D, L->scale);
        for (int r = r0; r < R; r++) {
            size_t rl = pos0 + t0 + (size_t)(r / G) - kb + 1;
            sc->rows[r].nv = rl < (size_t)bs ? (int)rl : bs;
            isa->softmax(&sc->rows[r], b == 0);
        }
        attn_block_pv(isa, sc->rows + r0, nr, v, D);
    }
    for (int r = 0; r < R; r++) {
        float *o = out + (sc->rows[r].q - q);
        isa->finish(&sc->rows[r], D, o);
    }
}

static void attn_fast(const kern_attn_isa *isa, const kern_attn_layout *L, const int32_t *blocks,
                      size_t pos0, size_t n_q, const float *q, float *out, int h0, int h1,
                      void *scratch)
{
    attn_scratch sc;
    attn_scratch_carve(L, n_q, scratch, &sc);
    for (int h = h0; h < h1; h++)
        for (size_t t0 = 0; t0 < n_q; t0 += TILE_Q) {
            size_t t1 = t0 + TILE_Q < n_q ? t0 + TILE_Q : n_q;
            attn_tile(isa, L, blocks, pos0, t0, t1, q, out, h, &sc);
        }
}

void kern_attn(const kern_attn_layout *L, const int32_t *blocks, size_t pos0, size_t n_q,
               const float *q, float *out, int h0, int h1, void *scratch)
{
    const kern_attn_isa *isa = NULL;
    switch (kern_get_isa()) {
    case KERN_AVX512:
        isa = &kern_attn_isa_avx512;
        break;
    case KERN_AVX2:
        isa = &kern_attn_isa_avx2;
        break;
    case KERN_SCALAR:
        break;
    }
    /* A head_dim the vectors do not divide takes the narrower path; the
     * choice depends on the layout only, so it is the same for every call. */
    if (isa == &kern_attn_isa_avx512 && L->head_dim % kern_attn_isa_avx512.lanes != 0)
        isa = &kern_attn_isa_avx2;
    if (isa && L->head_dim % isa->lanes != 0) isa = NULL;
    if (!isa) {
        kern_attn_scalar(L, blocks, pos0, n_q, q, out, h0, h1, scratch);
        return;
    }
    attn_fast(isa, L, blocks, pos0, n_q, q, out, h0, h1, scratch);
}
