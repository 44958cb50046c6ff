/* kern_attn: paged causal GQA attention — the scalar reference, the tiling
 * driver shared by the AVX2/AVX-512 paths, the split/merge entry points and
 * the dispatch.
 *
 * The arithmetic of one query row depends only on its position (kern.h):
 *   for each split s (keys [1024s, 1024s + 1024) ∩ [0, pos]):
 *     an online softmax over the split's keys, in position order:
 *       s_j = scale*dot(q, k_j),  m' = max(m, max_j s_j),
 *       l = l*exp(m - m') + sum_j exp(s_j - m'),
 *       acc = acc*exp(m - m') + sum_j exp(s_j - m')*v_j
 *     giving the split's part (acc, m, l);
 *   the parts fold in split order: M' = max(M, m), a = exp(M - M'),
 *   b = exp(m - M'), ACC = ACC*a + acc*b, L = L*a + l*b;  out = ACC / L.
 * Keys past the query's position never enter its arithmetic (no 0*garbage).
 * The scalar reference takes a split's max exactly (two passes); the vector
 * paths update it per step of 32 keys (KERN_ATTN_STEP), with a per-lane
 * denominator — a different rounding, the same bits for every tiling.
 *
 * The fast driver tiles TILE_Q query tokens × the G query heads of one kv
 * head (rows token-major), and walks each split in spans of key steps.  Many
 * rows: one step per span, its K/V converted to f32 once and reused by every
 * row (12 rows × 32 keys of scores per pass over the dims).  Few rows
 * (decode): four steps per span straight from the pool, so a decode row
 * still has 8 independent FMA chains per pass.  (Software prefetch of the
 * next span measured no gain over the hardware's: decode at depth 4096 and
 * 16384 ran the same with and without it.) */
#include <math.h>
#include <string.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kern/kern.h"
#include "engine/kern/kern_attn_priv.h"

/* Query tokens per tile: each converted K/V step is reused by TILE_Q × G
 * rows; the tile's q, acc and running state (~1.5 KiB per row at head_dim
 * 128) stay in L2. */
#define TILE_Q 32
/* Rows from which a span's K/V are converted to f32 once instead of read
 * (and converted in registers) by every group of rows. */
#define CONVERT_ROWS 8

static size_t attn_align(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

static size_t attn_esize(int kv_type)
{
    return kv_type == DX_F32 ? 4 : kv_type == DX_Q8_0 ? 1 : 2;
}

size_t kern_attn_part_floats(const kern_attn_layout *L)
{
    return (size_t)L->head_dim + 16; /* acc, then m and l, padded to 64 bytes */
}

/* The vector ISA for this layout, or NULL for the scalar path. */
static const kern_attn_isa *attn_pick(const kern_attn_layout *L)
{
    const kern_attn_isa *isa = NULL;
    switch (kern_get_isa()) {
    case KERN_AMX:
    case KERN_AVX512:
        isa = &kern_attn_isa_avx512;
        break;
    case KERN_AVX2:
        isa = &kern_attn_isa_avx2;
        break;
    case KERN_SCALAR:
        break;
    }
    if (L->block_size % KERN_ATTN_HALF != 0) return NULL;
    /* A head_dim the vectors do not divide takes the narrower path. */
    if (isa == &kern_attn_isa_avx512 && L->head_dim % kern_attn_isa_avx512.lanes != 0)
        isa = &kern_attn_isa_avx2;
    if (isa && L->head_dim % isa->lanes != 0) isa = NULL;
    return isa;
}

/* This layer's K (or V, with region = v_off) of kv head h in block b. */
static const uint8_t *attn_region(const kern_attn_layout *L, const int32_t *blocks, size_t b,
                                  size_t region, int h)
{
    int32_t blk = blocks[b];
    DX_ASSERT(blk >= 0);
    return L->base + (size_t)blk * L->block_bytes + region +
           (size_t)h * kern_attn_head_bytes(L->kv_type, (size_t)L->block_size, (size_t)L->head_dim);
}

/* ------------------------------------------------------------ q8_0 */

static float attn_elem(int kv_type, const uint8_t *p, size_t i);

/* A query row quantised for a q8_0 K: quants, f16 group scales as f32, and
 * 128 * each group's sum of quants (for the AVX-512 path). */
typedef struct {
    int8_t q[512]; /* head_dim <= 512 (model.c) */
    float d[512 / 32];
    int32_t c[512 / 32];
} attn_q8row;

static void attn_q8_row(const float *q, int D, attn_q8row *out)
{
    uint16_t d[512 / 32];
    DX_ASSERT(D <= 512 && D % 32 == 0);
    kern_q8_quant(q, (size_t)D, out->q, d);
    for (int g = 0; g < D / 32; g++) {
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) sum += out->q[32 * g + i];
        out->d[g] = dx_f16_to_f32(d[g]);
        out->c[g] = 128 * sum;
    }
}

/* The score of key j of a q8_0 K whose quant (j, d) is at
 * k + ((d/4)*kstride + j)*4 + d%4 and scale (j, g) at ks + (g*kstride + j)*2:
 * kern.h's formula, which every ISA's qk_q8 computes. */
static float attn_q8_score(const uint8_t *k, const uint8_t *ks, size_t kstride, size_t j,
                           const int8_t *q, const float *qd, int D, float scale)
{
    float acc = 0.0f;
    for (int g = 0; g < D / 32; g++) {
        int32_t dot = 0;
        for (int d = 32 * g; d < 32 * g + 32; d++)
            dot += (int32_t)q[d] * (int8_t)k[((size_t)(d / 4) * kstride + j) * 4 + (size_t)(d % 4)];
        uint16_t h;
        memcpy(&h, ks + ((size_t)g * kstride + j) * 2, 2);
        acc = fmaf((float)dot, qd[g] * dx_f16_to_f32(h), acc);
    }
    return acc * scale;
}

void kern__attn_qk_q8_scalar(kern_attn_row *rows, int nr, const int32_t *qt8, size_t qstride,
                             const kern_attn_span *sp, int D, float scale)
{
    int8_t q[512];
    for (int r = 0; r < nr; r++) {
        for (int c = 0; c < D / 4; c++) memcpy(q + 4 * c, &qt8[(size_t)c * qstride + (size_t)r], 4);
        for (int i = 0; i < sp->nh; i++)
            for (size_t j = 0; j < KERN_ATTN_HALF; j++)
                rows[r].s[16 * i + (int)j] =
                    attn_q8_score(sp->k[i], sp->ks[i], sp->kstride, j, q, rows[r].qd, D, scale);
    }
}

/* V element (j, d) of a span half, exactly as f32. */
static float attn_span_v(const kern_attn_span *sp, int half, int j, int d, int D)
{
    const uint8_t *v = sp->v[half];
    if (sp->vtype == DX_Q8_0)
        return sp->vsf[half][j * (D / 32) + d / 32] *
               (float)(int8_t)v[(size_t)j * (size_t)D + (size_t)d];
    return attn_elem(sp->vtype, v, (size_t)j * (size_t)D + (size_t)d);
}

void kern__attn_pv_scalar(kern_attn_row *rows, int nr, const kern_attn_span *sp, int i, int j0,
                          int j1, int D, int rescale)
{
    for (int r = 0; r < nr; r++) {
        float *acc = rows[r].acc, a = rows[r].alpha[i];
        const float *p = rows[r].s + KERN_ATTN_STEP * i;
        if (rescale)
            for (int d = 0; d < D; d++) acc[d] *= a;
        for (int j = j0; j < j1; j++)
            for (int d = 0; d < D; d++)
                acc[d] = fmaf(p[j], attn_span_v(sp, 2 * i + (j >> 4), j & 15, d, D), acc[d]);
    }
}

/* ---------------------------------------------------------------- scalar */

static float attn_elem(int kv_type, const uint8_t *p, size_t i)
{
    uint16_t h;
    float f;
    switch (kv_type) {
    case DX_F16:
        memcpy(&h, p + 2 * i, 2);
        return dx_f16_to_f32(h);
    case DX_BF16:
        memcpy(&h, p + 2 * i, 2);
        return dx_bf16_to_f32(h);
    default:
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
}

/* Score of key j for one query row of kv head h (qq: the row quantised,
 * for a q8_0 K). */
static float attn_scalar_score(const kern_attn_layout *L, const int32_t *blocks, int h,
                               const float *q, const attn_q8row *qq, size_t j)
{
    int D = L->head_dim;
    size_t bs = (size_t)L->block_size;
    const uint8_t *k = attn_region(L, blocks, j / bs, L->k_off, h);
    if (L->kv_type == DX_Q8_0)
        return attn_q8_score(k, k + bs * (size_t)D, bs, j % bs, qq->q, qq->d, D, L->scale);
    float dot = 0.0f;
    for (int d = 0; d < D; d++) dot += q[d] * attn_elem(L->kv_type, k, (size_t)d * bs + j % bs);
    return L->scale * dot;
}

/* V element (j, d) of kv head h, exactly as f32. */
static float attn_scalar_v(const kern_attn_layout *L, const int32_t *blocks, int h, size_t j, int d)
{
    size_t bs = (size_t)L->block_size, D = (size_t)L->head_dim, jb = j % bs;
    const uint8_t *v = attn_region(L, blocks, j / bs, L->v_off, h);
    if (L->kv_type != DX_Q8_0) return attn_elem(L->kv_type, v, jb * D + (size_t)d);
    uint16_t sc;
    memcpy(&sc, v + bs * D + (jb * (D / 32) + (size_t)d / 32) * 2, 2);
    return dx_f16_to_f32(sc) * (float)(int8_t)v[jb * D + (size_t)d];
}

/* Part (acc[D], m, l) of keys [k0, k1) for one query row of kv head h;
 * s: [KERN_ATTN_SPLIT] scores. */
static void attn_scalar_split(const kern_attn_layout *L, const int32_t *blocks, int h,
                              const float *q, const attn_q8row *qq, size_t k0, size_t k1,
                              float *part, float *s)
{
    int D = L->head_dim;
    float m = -INFINITY, l = 0.0f;
    for (size_t j = k0; j < k1; j++) {
        s[j - k0] = attn_scalar_score(L, blocks, h, q, qq, j);
        m = s[j - k0] > m ? s[j - k0] : m;
    }
    memset(part, 0, (size_t)D * sizeof(float));
    for (size_t j = k0; j < k1; j++) {
        float p = expf(s[j - k0] - m);
        l += p;
        for (int d = 0; d < D; d++) part[d] += p * attn_scalar_v(L, blocks, h, j, d);
    }
    part[D] = m;
    part[D + 1] = l;
}

static void attn_scalar_merge(float *acc, float *m, float *l, const float *part, int D)
{
    float mn = *m > part[D] ? *m : part[D];
    float a = expf(*m - mn), b = expf(part[D] - mn);
    for (int d = 0; d < D; d++) acc[d] = acc[d] * a + part[d] * b;
    *l = *l * a + part[D + 1] * b;
    *m = mn;
}

static void attn_scalar_finish(const float *acc, float l, int D, float *out)
{
    for (int d = 0; d < D; d++) out[d] = acc[d] / l;
}

/* Scratch of the scalar path: scores of one split, a split's part and the
 * running merge. */
typedef struct {
    float *s, *part, *run;
} attn_scalar_buf;

static size_t attn_scalar_part_bytes(const kern_attn_layout *L)
{
    return attn_align(kern_attn_part_floats(L) * sizeof(float));
}

static size_t attn_scalar_bytes(const kern_attn_layout *L)
{
    return attn_align(KERN_ATTN_SPLIT * sizeof(float)) + 2 * attn_scalar_part_bytes(L);
}

static attn_scalar_buf attn_scalar_carve(const kern_attn_layout *L, void *scratch)
{
    uint8_t *base = scratch;
    size_t sb = attn_align(KERN_ATTN_SPLIT * sizeof(float)), pb = attn_scalar_part_bytes(L);
    return (attn_scalar_buf){(float *)base, (float *)(base + sb), (float *)(base + sb + pb)};
}

/* The query row of (token t, query head qh) in a [n_q][n_head][D] array. */
static size_t attn_row_off(const kern_attn_layout *L, size_t t, int qh)
{
    return (t * (size_t)L->n_head + (size_t)qh) * (size_t)L->head_dim;
}

void kern_attn_scalar(const kern_attn_layout *L, const int32_t *blocks, size_t pos0, size_t n_q,
                      const float *q, float *out, int h0, int h1, void *scratch)
{
    attn_scalar_buf b = attn_scalar_carve(L, scratch);
    int G = L->n_head / L->n_kv_head, D = L->head_dim;
    for (int h = h0; h < h1; h++)
        for (int g = 0; g < G; g++)
            for (size_t t = 0; t < n_q; t++) {
                size_t off = attn_row_off(L, t, h * G + g), pos = pos0 + t;
                attn_q8row qq;
                if (L->kv_type == DX_Q8_0) attn_q8_row(q + off, D, &qq);
                for (size_t sp = 0; sp <= pos / KERN_ATTN_SPLIT; sp++) {
                    size_t k0 = sp * KERN_ATTN_SPLIT;
                    size_t k1 = pos + 1 < k0 + KERN_ATTN_SPLIT ? pos + 1 : k0 + KERN_ATTN_SPLIT;
                    attn_scalar_split(L, blocks, h, q + off, &qq, k0, k1, sp ? b.part : b.run, b.s);
                    if (sp) attn_scalar_merge(b.run, b.run + D, b.run + D + 1, b.part, D);
                }
                attn_scalar_finish(b.run, b.run[D + 1], D, out + off);
            }
}

/* ------------------------------------------------------------ fast driver */

typedef struct {
    kern_attn_row *rows; /* [R] */
    float *qt;           /* [D][R] the tile's queries, transposed */
    float *part;         /* [R][PF] the tile's split parts (acc, m, l) */
    float *run;          /* [R][PF] running merge (acc, m, l) */
    float *s;            /* [R][STEP*SPAN] */
    float *lvec;         /* [R][16] */
    float *kc, *vc;      /* converted K [2][D][16] and V [2][16][D] of one step */
    /* q8_0: the queries' quants in quads [D/4][R], their scales [R][D/32]
     * and group sums [R][D/32]; a span's V scales [2*SPAN][16][D/32] */
    int32_t *qt8;
    float *qd;
    int32_t *qc;
    float *vsf;
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
    size_t R = attn_tile_rows(L, max_q), D = (size_t)L->head_dim, off = 0;
    size_t PF = kern_attn_part_floats(L), step = 2 * KERN_ATTN_HALF * D * 4;
    size_t q8 = L->kv_type == DX_Q8_0, ng = D / 32;
    size_t sizes[12] = {R * sizeof(kern_attn_row),
                        R * D * 4,
                        R * PF * 4,
                        R * PF * 4,
                        R * KERN_ATTN_STEP * KERN_ATTN_SPAN * 4,
                        R * 16 * 4,
                        step,
                        step,
                        q8 * R * D,
                        q8 * R * ng * 4,
                        q8 * R * ng * 4,
                        q8 * 2 * KERN_ATTN_SPAN * KERN_ATTN_HALF * ng * 4};
    void **dst[12] = {(void **)&sc->rows, (void **)&sc->qt, (void **)&sc->part,
                      (void **)&sc->run,  (void **)&sc->s,  (void **)&sc->lvec,
                      (void **)&sc->kc,   (void **)&sc->vc, (void **)&sc->qt8,
                      (void **)&sc->qd,   (void **)&sc->qc, (void **)&sc->vsf};
    for (int i = 0; i < 12; i++) {
        if (base) *dst[i] = base + off;
        off += attn_align(sizes[i]);
    }
    return off;
}

size_t kern_attn_scratch_bytes(const kern_attn_layout *L, size_t max_q)
{
    attn_scratch sc;
    size_t fast = attn_scratch_carve(L, max_q, NULL, &sc);
    size_t slow = attn_scalar_bytes(L);
    return fast > slow ? fast : slow;
}

/* One tile: query tokens at positions pos_first .. pos_first+nt-1 of kv head
 * h, R = nt*G rows, row r = token r/G, query head h*G + r%G. */
typedef struct {
    const kern_attn_isa *isa;
    const kern_attn_layout *L;
    const int32_t *blocks;
    int h, G, R;
    size_t pos_first;
    attn_scratch *sc;
} attn_tile;

/* First row whose position is >= p (rows are token-major). */
static int attn_first_row(const attn_tile *T, size_t p)
{
    size_t t = p > T->pos_first ? p - T->pos_first : 0;
    size_t r = t * (size_t)T->G;
    return r < (size_t)T->R ? (int)r : T->R;
}

/* Halves [0, nh) of the span starting at key p: those past pos_last repeat
 * the last real one.  With convert, the real halves are copied to f32. */
/* A q8_0 span's halves: K quants and scales, V quants, V scales converted
 * to f32 (K stays as stored: its scores are integer dots either way). */
static void attn_span_q8(const attn_tile *T, size_t p, size_t pos_last, kern_attn_span *sp)
{
    const kern_attn_layout *L = T->L;
    size_t bs = (size_t)L->block_size, D = (size_t)L->head_dim, ng = D / 32;
    for (int i = 0; i < sp->nh; i++) {
        size_t k = p + (size_t)i * KERN_ATTN_HALF;
        if (k > pos_last) {
            sp->k[i] = sp->k[i - 1], sp->ks[i] = sp->ks[i - 1];
            sp->v[i] = sp->v[i - 1], sp->vsf[i] = sp->vsf[i - 1];
            continue;
        }
        size_t o = k % bs;
        const uint8_t *kr = attn_region(L, T->blocks, k / bs, L->k_off, T->h);
        const uint8_t *vr = attn_region(L, T->blocks, k / bs, L->v_off, T->h);
        float *vsf = T->sc->vsf + (size_t)i * KERN_ATTN_HALF * ng;
        sp->k[i] = kr + o * 4;
        sp->ks[i] = kr + bs * D + o * 2;
        sp->v[i] = vr + o * D;
        /* the half's 16 keys' scales are contiguous: 16*D/32 f16 */
        T->isa->cvt(DX_F16, vr + bs * D + o * ng * 2, 0, vsf, 1, KERN_ATTN_HALF * ng);
        sp->vsf[i] = vsf;
    }
}

static void attn_span_build(const attn_tile *T, size_t p, size_t pos_last, int nh, int convert,
                            kern_attn_span *sp)
{
    const kern_attn_layout *L = T->L;
    size_t bs = (size_t)L->block_size, D = (size_t)L->head_dim, es = attn_esize(L->kv_type);
    int n_real = 0;
    sp->nh = nh;
    sp->type = sp->vtype = L->kv_type;
    sp->kstride = bs;
    if (L->kv_type == DX_Q8_0) {
        attn_span_q8(T, p, pos_last, sp);
        if (!convert) return;
        for (int i = 0; i < nh; i++) { /* V only: dequantised exactly, as pv would */
            float *vc = T->sc->vc + (size_t)i * D * KERN_ATTN_HALF;
            if (p + (size_t)i * KERN_ATTN_HALF <= pos_last) {
                T->isa->cvt_q8v(sp->v[i], sp->vsf[i], (int)D, vc);
                sp->v[i] = (const uint8_t *)vc;
            } else {
                sp->v[i] = sp->v[i - 1];
            }
        }
        sp->vtype = DX_F32;
        return;
    }
    for (int i = 0; i < nh; i++) {
        size_t k = p + (size_t)i * KERN_ATTN_HALF;
        if (k > pos_last) {
            sp->k[i] = sp->k[i - 1];
            sp->v[i] = sp->v[i - 1];
            continue;
        }
        size_t o = k % bs;
        sp->k[i] = attn_region(L, T->blocks, k / bs, L->k_off, T->h) + o * es;
        sp->v[i] = attn_region(L, T->blocks, k / bs, L->v_off, T->h) + o * D * es;
        n_real++;
    }
    if (!convert || L->kv_type == DX_F32) return;
    for (int i = 0; i < nh; i++) {
        float *kc = T->sc->kc + (size_t)i * D * KERN_ATTN_HALF;
        float *vc = T->sc->vc + (size_t)i * D * KERN_ATTN_HALF;
        if (i < n_real) {
            T->isa->cvt(L->kv_type, sp->k[i], bs, kc, D, KERN_ATTN_HALF);
            T->isa->cvt(L->kv_type, sp->v[i], D, vc, KERN_ATTN_HALF, D);
            sp->k[i] = (const uint8_t *)kc;
            sp->v[i] = (const uint8_t *)vc;
        } else {
            sp->k[i] = sp->k[i - 1];
            sp->v[i] = sp->v[i - 1];
        }
    }
    sp->type = sp->vtype = DX_F32;
    sp->kstride = KERN_ATTN_HALF;
}

/* Keys of step i of the span for rows[0..nr): every row's visible keys
 * [0, nv), in groups whose shared keys go first; rows are token-major, so
 * visible counts never decrease along the rows: a group's first row sees the
 * fewest and the longer rows finish alone.  Rows that see none are skipped. */
static void attn_step_pv(const kern_attn_isa *isa, kern_attn_row *rows, int nr,
                         const kern_attn_span *sp, int i, int D)
{
    int r0 = 0;
    while (r0 < nr && rows[r0].nv[i] == 0) r0++;
    rows += r0;
    nr -= r0;
    for (int g = 0; g < nr; g += isa->pv_rows) {
        int n = nr - g < isa->pv_rows ? nr - g : isa->pv_rows;
        int j0 = rows[g].nv[i];
        isa->pv(rows + g, n, sp, i, 0, j0, D, 1);
        for (int k = 1; k < n; k++)
            if (rows[g + k].nv[i] > j0)
                isa->pv(rows + g + k, 1, sp, i, j0, rows[g + k].nv[i], D, 0);
    }
}

/* One span of nsteps steps from key p (p a multiple of the step). */
static void attn_span(const attn_tile *T, size_t p, size_t k_hi, int nsteps, int convert)
{
    const kern_attn_layout *L = T->L;
    size_t pos_last = T->pos_first + (size_t)T->R / (size_t)T->G - 1;
    int r_a = attn_first_row(T, p), D = L->head_dim;
    kern_attn_row *rows = T->sc->rows;
    kern_attn_span sp;
    attn_span_build(T, p, pos_last, convert ? 2 : 2 * KERN_ATTN_SPAN, convert, &sp);
    for (int r = r_a; r < T->R; r++) {
        size_t pos = T->pos_first + (size_t)(r / T->G);
        for (int i = 0; i < nsteps; i++) {
            size_t k0 = p + (size_t)i * KERN_ATTN_STEP;
            size_t n = pos >= k0 && k_hi > k0 ? pos - k0 + 1 : 0;
            n = n < k_hi - k0 ? n : k_hi - k0;
            rows[r].nv[i] = n < KERN_ATTN_STEP ? (int)n : KERN_ATTN_STEP;
        }
    }
    if (sp.type == DX_Q8_0)
        T->isa->qk_q8(rows + r_a, T->R - r_a, T->sc->qt8 + r_a, (size_t)T->R, &sp, D, L->scale);
    else
        T->isa->qk(rows + r_a, T->R - r_a, T->sc->qt + r_a, (size_t)T->R, &sp, D, L->scale);
    for (int r = r_a; r < T->R; r++)
        for (int i = 0; i < nsteps && rows[r].nv[i] > 0; i++) T->isa->softmax(&rows[r], i);
    for (int i = 0; i < nsteps; i++) attn_step_pv(T->isa, rows + r_a, T->R - r_a, &sp, i, D);
}

/* The part of split `split` for the tile's rows that reach it (their acc
 * buffers are rows[r].acc); returns the first such row. */
static int attn_tile_split(const attn_tile *T, size_t split)
{
    const kern_attn_layout *L = T->L;
    size_t pos_last = T->pos_first + (size_t)T->R / (size_t)T->G - 1;
    size_t k_lo = split * KERN_ATTN_SPLIT;
    size_t k_hi = pos_last + 1 < k_lo + KERN_ATTN_SPLIT ? pos_last + 1 : k_lo + KERN_ATTN_SPLIT;
    int r_first = attn_first_row(T, k_lo), D = L->head_dim;
    for (int r = r_first; r < T->R; r++) {
        kern_attn_row *row = &T->sc->rows[r];
        row->m = -INFINITY;
        memset(row->acc, 0, (size_t)D * sizeof(float));
        memset(row->lvec, 0, 16 * sizeof(float));
    }
    for (size_t p = k_lo; p < k_hi;) {
        int convert = T->R - attn_first_row(T, p) >= CONVERT_ROWS;
        int nsteps = convert ? 1 : KERN_ATTN_SPAN;
        attn_span(T, p, k_hi, nsteps, convert);
        p += (size_t)nsteps * KERN_ATTN_STEP;
    }
    for (int r = r_first; r < T->R; r++) T->isa->close(&T->sc->rows[r], D);
    return r_first;
}

/* Row r's query quantised for a q8_0 K: quads into the tile's qt8, scales
 * and group sums into its qd and qc. */
static void attn_tile_q8_row(const attn_tile *T, int r, kern_attn_row *row)
{
    int D = T->L->head_dim, ng = D / 32;
    size_t R = (size_t)T->R;
    attn_q8row qq;
    attn_q8_row(row->q, D, &qq);
    for (int c = 0; c < D / 4; c++) memcpy(&T->sc->qt8[(size_t)c * R + (size_t)r], qq.q + 4 * c, 4);
    float *qd = T->sc->qd + (size_t)r * (size_t)ng;
    int32_t *qc = T->sc->qc + (size_t)r * (size_t)ng;
    memcpy(qd, qq.d, (size_t)ng * sizeof *qd);
    memcpy(qc, qq.c, (size_t)ng * sizeof *qc);
    row->qd = qd;
    row->qc = qc;
}

/* Row bookkeeping for tokens [t0, t0+nt) of q, and their queries
 * transposed (so a score tile broadcasts every row's q[d] from one line);
 * acc buffers at acc + r*PF. */
static void attn_tile_init(attn_tile *T, const kern_attn_layout *L, const float *q, size_t t0,
                           float *acc)
{
    size_t PF = kern_attn_part_floats(L), R = (size_t)T->R;
    for (int r = 0; r < T->R; r++) {
        kern_attn_row *row = &T->sc->rows[r];
        row->q = q + attn_row_off(L, t0 + (size_t)(r / T->G), T->h * T->G + r % T->G);
        row->acc = acc + (size_t)r * PF;
        row->s = T->sc->s + (size_t)r * KERN_ATTN_STEP * KERN_ATTN_SPAN;
        row->lvec = T->sc->lvec + (size_t)r * 16;
        if (L->kv_type == DX_Q8_0) {
            attn_tile_q8_row(T, r, row);
            continue;
        }
        for (int d = 0; d < L->head_dim; d++) T->sc->qt[(size_t)d * R + (size_t)r] = row->q[d];
    }
}

static void attn_fast(const kern_attn_isa *isa, const kern_attn_layout *L, const int32_t *blocks,
                      size_t pos0, size_t n_q, const float *q, float *out, int h0, int h1,
                      void *scratch)
{
    attn_scratch sc;
    attn_scratch_carve(L, n_q, scratch, &sc);
    int G = L->n_head / L->n_kv_head, D = L->head_dim;
    size_t PF = kern_attn_part_floats(L);
    for (int h = h0; h < h1; h++)
        for (size_t t0 = 0; t0 < n_q; t0 += TILE_Q) {
            size_t nt = n_q - t0 < TILE_Q ? n_q - t0 : TILE_Q;
            attn_tile T = {isa, L, blocks, h, G, (int)nt * G, pos0 + t0, &sc};
            attn_tile_init(&T, L, q, t0, sc.part);
            size_t pos_last = pos0 + t0 + nt - 1;
            for (size_t s = 0; s <= pos_last / KERN_ATTN_SPLIT; s++) {
                int r_first = attn_tile_split(&T, s);
                for (int r = r_first; r < T.R; r++) {
                    float *run = sc.run + (size_t)r * PF, *part = sc.part + (size_t)r * PF;
                    if (s == 0)
                        memcpy(run, part, (size_t)(D + 2) * sizeof(float));
                    else
                        isa->merge(run, run + D, run + D + 1, part, D);
                }
            }
            for (int r = 0; r < T.R; r++) {
                const float *run = sc.run + (size_t)r * PF;
                isa->finish(run, run[D + 1], D, out + (sc.rows[r].q - q));
            }
        }
}

void kern_attn(const kern_attn_layout *L, const int32_t *blocks, size_t pos0, size_t n_q,
               const float *q, float *out, int h0, int h1, void *scratch)
{
    const kern_attn_isa *isa = attn_pick(L);
    if (!isa)
        kern_attn_scalar(L, blocks, pos0, n_q, q, out, h0, h1, scratch);
    else
        attn_fast(isa, L, blocks, pos0, n_q, q, out, h0, h1, scratch);
}

/* ------------------------------------------------------------ split form */

void kern_attn_part(const kern_attn_layout *L, const int32_t *blocks, size_t pos0, size_t n_q,
                    const float *q, int h, size_t split, float *part, void *scratch)
{
    const kern_attn_isa *isa = attn_pick(L);
    int G = L->n_head / L->n_kv_head;
    size_t PF = kern_attn_part_floats(L), k0 = split * KERN_ATTN_SPLIT;
    if (!isa) {
        attn_scalar_buf b = attn_scalar_carve(L, scratch);
        for (size_t t = k0 > pos0 ? k0 - pos0 : 0; t < n_q; t++)
            for (int g = 0; g < G; g++) {
                size_t pos = pos0 + t;
                size_t k1 = pos + 1 < k0 + KERN_ATTN_SPLIT ? pos + 1 : k0 + KERN_ATTN_SPLIT;
                const float *qr = q + attn_row_off(L, t, h * G + g);
                attn_q8row qq;
                if (L->kv_type == DX_Q8_0) attn_q8_row(qr, L->head_dim, &qq);
                attn_scalar_split(L, blocks, h, qr, &qq, k0, k1,
                                  part + (t * (size_t)G + (size_t)g) * PF, b.s);
            }
        return;
    }
    attn_scratch sc;
    attn_scratch_carve(L, n_q, scratch, &sc);
    for (size_t t0 = 0; t0 < n_q; t0 += TILE_Q) {
        size_t nt = n_q - t0 < TILE_Q ? n_q - t0 : TILE_Q;
        if (pos0 + t0 + nt - 1 < k0) continue;
        attn_tile T = {isa, L, blocks, h, G, (int)nt * G, pos0 + t0, &sc};
        attn_tile_init(&T, L, q, t0, part + t0 * (size_t)G * PF);
        attn_tile_split(&T, split);
    }
}

void kern_attn_merge(const kern_attn_layout *L, size_t pos0, size_t n_q, int h, const float *part,
                     size_t split_stride, float *out)
{
    const kern_attn_isa *isa = attn_pick(L);
    int G = L->n_head / L->n_kv_head, D = L->head_dim;
    size_t PF = kern_attn_part_floats(L);
    for (size_t t = 0; t < n_q; t++)
        for (int g = 0; g < G; g++) {
            const float *p = part + (t * (size_t)G + (size_t)g) * PF;
            float *o = out + attn_row_off(L, t, h * G + g), m = p[D], l = p[D + 1];
            memcpy(o, p, (size_t)D * sizeof(float));
            for (size_t s = 1; s <= (pos0 + t) / KERN_ATTN_SPLIT; s++) {
                if (isa)
                    isa->merge(o, &m, &l, p + s * split_stride, D);
                else
                    attn_scalar_merge(o, &m, &l, p + s * split_stride, D);
            }
            if (isa)
                isa->finish(o, l, D, o);
            else
                attn_scalar_finish(o, l, D, o);
        }
}
