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
    return kv_type == DX_F32 ? 4 : 2;
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
           (size_t)h * (size_t)L->block_size * (size_t)L->head_dim * attn_esize(L->kv_type);
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

/* Part (acc[D], m, l) of keys [k0, k1) for one query row of kv head h;
 * s: [KERN_ATTN_SPLIT] scores. */
static void attn_scalar_split(const kern_attn_layout *L, const int32_t *blocks, int h,
                              const float *q, size_t k0, size_t k1, float *part, float *s)
{
    int D = L->head_dim, bs = L->block_size;
    float m = -INFINITY, l = 0.0f;
    for (size_t j = k0; j < k1; j++) {
        const uint8_t *k = attn_region(L, blocks, j / (size_t)bs, L->k_off, h);
        float dot = 0.0f;
        for (int d = 0; d < D; d++)
            dot += q[d] * attn_elem(L->kv_type, k, (size_t)d * (size_t)bs + j % (size_t)bs);
        s[j - k0] = L->scale * dot;
        m = s[j - k0] > m ? s[j - k0] : m;
    }
    memset(part, 0, (size_t)D * sizeof(float));
    for (size_t j = k0; j < k1; j++) {
        const uint8_t *v = attn_region(L, blocks, j / (size_t)bs, L->v_off, h);
        size_t row = (j % (size_t)bs) * (size_t)D;
        float p = expf(s[j - k0] - m);
        l += p;
        for (int d = 0; d < D; d++) part[d] += p * attn_elem(L->kv_type, v, row + (size_t)d);
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
                for (size_t sp = 0; sp <= pos / KERN_ATTN_SPLIT; sp++) {
                    size_t k0 = sp * KERN_ATTN_SPLIT;
                    size_t k1 = pos + 1 < k0 + KERN_ATTN_SPLIT ? pos + 1 : k0 + KERN_ATTN_SPLIT;
                    attn_scalar_split(L, blocks, h, q + off, k0, k1, sp ? b.part : b.run, b.s);
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
    size_t sizes[8] = {R * sizeof(kern_attn_row),
                       R * D * 4,
                       R * PF * 4,
                       R * PF * 4,
                       R * KERN_ATTN_STEP * KERN_ATTN_SPAN * 4,
                       R * 16 * 4,
                       step,
                       step};
    void **dst[8] = {(void **)&sc->rows, (void **)&sc->qt,   (void **)&sc->part, (void **)&sc->run,
                     (void **)&sc->s,    (void **)&sc->lvec, (void **)&sc->kc,   (void **)&sc->vc};
    for (int i = 0; i < 8; i++) {
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
static void attn_span_build(const attn_tile *T, size_t p, size_t pos_last, int nh, int convert,
                            kern_attn_span *sp)
{
    const kern_attn_layout *L = T->L;
    size_t bs = (size_t)L->block_size, D = (size_t)L->head_dim, es = attn_esize(L->kv_type);
    int n_real = 0;
    sp->nh = nh;
    sp->type = L->kv_type;
    sp->kstride = bs;
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
    sp->type = DX_F32;
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
                attn_scalar_split(L, blocks, h, q + attn_row_off(L, t, h * G + g), k0, k1,
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
