/* dx_hidx: open-addressing hash index (see dx_hidx.h for the scheme).  An
 * empty slot is one whose value is DX_HIDX_NIL, so a slot is 16 bytes and a
 * probe touches one cache line for several entries. */
#include "base/dx_hidx.h"

#include "base/dx_alloc.h"
#include "base/dx_err.h"

#define HIDX_MIN_SLOTS 16

typedef struct {
    uint64_t h, v;
} hidx_slot;

struct dx_hidx {
    hidx_slot *slot; /* [mask + 1] */
    size_t mask;
    size_t n;
};

static hidx_slot *hidx_alloc_slots(size_t n_slots)
{
    size_t bytes;
    if (dx_mul_overflow(n_slots, sizeof(hidx_slot), &bytes)) return NULL;
    hidx_slot *s = dx_malloc(bytes);
    if (s)
        for (size_t i = 0; i < n_slots; i++) s[i].v = DX_HIDX_NIL;
    return s;
}

int dx_hidx_create(size_t cap_hint, dx_hidx **out)
{
    size_t n_slots = HIDX_MIN_SLOTS;
    while (n_slots / 2 < cap_hint) {
        if (n_slots > SIZE_MAX / 4) return dx_errf(DX_ENOMEM, "dx_hidx: %zu entries", cap_hint);
        n_slots <<= 1;
    }
    dx_hidx *ix = dx_calloc(1, sizeof *ix);
    if (!ix) return dx_errf(DX_ENOMEM, "dx_hidx: index");
    ix->slot = hidx_alloc_slots(n_slots);
    if (!ix->slot) {
        dx_free(ix);
        return dx_errf(DX_ENOMEM, "dx_hidx: %zu slots", n_slots);
    }
    ix->mask = n_slots - 1;
    *out = ix;
    return 0;
}

void dx_hidx_destroy(dx_hidx *ix)
{
    if (!ix) return;
    dx_free(ix->slot);
    dx_free(ix);
}

size_t dx_hidx_count(const dx_hidx *ix)
{
    return ix->n;
}

/* Puts (h, v) in the first empty slot of h's run; the table has room. */
static void hidx_place(hidx_slot *slot, size_t mask, uint64_t h, uint64_t v)
{
    size_t i = (size_t)h & mask;
    while (slot[i].v != DX_HIDX_NIL) i = (i + 1) & mask;
    slot[i] = (hidx_slot){h, v};
}

static int hidx_grow(dx_hidx *ix)
{
    size_t old_n = ix->mask + 1;
    if (old_n > SIZE_MAX / 4) return dx_errf(DX_ENOMEM, "dx_hidx: %zu slots", old_n);
    hidx_slot *ns = hidx_alloc_slots(old_n * 2);
    if (!ns) return dx_errf(DX_ENOMEM, "dx_hidx: %zu slots", old_n * 2);
    for (size_t i = 0; i < old_n; i++)
        if (ix->slot[i].v != DX_HIDX_NIL)
            hidx_place(ns, old_n * 2 - 1, ix->slot[i].h, ix->slot[i].v);
    dx_free(ix->slot);
    ix->slot = ns;
    ix->mask = old_n * 2 - 1;
    return 0;
}

int dx_hidx_insert(dx_hidx *ix, uint64_t h, uint64_t v)
{
    DX_ASSERT(v != DX_HIDX_NIL);
    /* Keep the load at or under 1/2 so runs stay short. */
    if ((ix->n + 1) * 2 > ix->mask + 1) {
        int rc = hidx_grow(ix);
        if (rc) return dx_errf(rc, "dx_hidx: cannot grow past %zu entries", ix->n);
    }
    hidx_place(ix->slot, ix->mask, h, v);
    ix->n++;
    return 0;
}

/* Backward-shift deletion: pull later entries of the run into the hole
 * whenever the hole lies between their home slot and where they sit. */
static void hidx_delete_at(dx_hidx *ix, size_t i)
{
    size_t m = ix->mask;
    for (size_t j = (i + 1) & m; ix->slot[j].v != DX_HIDX_NIL; j = (j + 1) & m) {
        size_t home = (size_t)ix->slot[j].h & m;
        if (((j - home) & m) >= ((j - i) & m)) {
            ix->slot[i] = ix->slot[j];
            i = j;
        }
    }
    ix->slot[i].v = DX_HIDX_NIL;
    ix->n--;
}

int dx_hidx_remove(dx_hidx *ix, uint64_t h, uint64_t v)
{
    for (size_t i = (size_t)h & ix->mask; ix->slot[i].v != DX_HIDX_NIL; i = (i + 1) & ix->mask) {
        if (ix->slot[i].h == h && ix->slot[i].v == v) {
            hidx_delete_at(ix, i);
            return 0;
        }
    }
    return dx_errf(DX_ENOENT, "dx_hidx: entry not found");
}

void dx_hidx_find(const dx_hidx *ix, uint64_t h, dx_hidx_iter *it)
{
    it->h = h;
    it->slot = (size_t)h & ix->mask;
}

int dx_hidx_next(const dx_hidx *ix, dx_hidx_iter *it, uint64_t *v)
{
    /* A run ends at the first empty slot; the table is never full. */
    for (size_t i = (size_t)it->slot; ix->slot[i].v != DX_HIDX_NIL; i = (i + 1) & ix->mask) {
        if (ix->slot[i].h == it->h) {
            *v = ix->slot[i].v;
            it->slot = (i + 1) & ix->mask;
            return 1;
        }
    }
    return 0;
}

int dx_hidx_each(const dx_hidx *ix, size_t *cursor, uint64_t *v)
{
    for (size_t i = *cursor; i <= ix->mask; i++) {
        if (ix->slot[i].v != DX_HIDX_NIL) {
            *v = ix->slot[i].v;
            *cursor = i + 1;
            return 1;
        }
    }
    *cursor = ix->mask + 1;
    return 0;
}

int dx_hidx_check(const dx_hidx *ix)
{
    size_t used = 0;
    for (size_t i = 0; i <= ix->mask; i++) {
        if (ix->slot[i].v == DX_HIDX_NIL) continue;
        used++;
        for (size_t j = (size_t)ix->slot[i].h & ix->mask; j != i; j = (j + 1) & ix->mask)
            if (ix->slot[j].v == DX_HIDX_NIL)
                return dx_errf(DX_EMISMATCH, "dx_hidx: entry in slot %zu unreachable from %zu", i,
                               (size_t)ix->slot[i].h & ix->mask);
    }
    if (used != ix->n)
        return dx_errf(DX_EMISMATCH, "dx_hidx: %zu slots used, count says %zu", used, ix->n);
    if (ix->n * 2 > ix->mask + 1)
        return dx_errf(DX_EMISMATCH, "dx_hidx: load %zu/%zu over 1/2", ix->n, ix->mask + 1);
    return 0;
}
