/* dx_hidx: a growable open-addressing hash index from a 64-bit hash to a
 * 64-bit value (an index, a pointer, an id).
 *
 * The index stores each entry's hash next to its value and never sees the
 * key: the caller hashes the key (with a seed where the key may come from a
 * peer), walks the candidates whose stored hash equals it and compares the
 * real keys itself.  Storing the hash lets the table grow and delete without
 * calling back into the caller.
 *
 * Linear probing, load <= 1/2 (it doubles before passing that), and
 * backward-shift deletion so churn leaves no tombstones and probe lengths
 * do not degrade — the same scheme as the KV pool's prefix index
 * (engine/kv_pool.c), which keeps its own fixed-size table of 4-byte slots.
 * The home slot is the hash's low bits, so hashes must be uniform there.
 *
 * Not thread-safe; values must not be DX_HIDX_NIL.  Removal never
 * allocates, so it cannot fail for lack of memory. */
#ifndef DX_HIDX_H
#define DX_HIDX_H

#include <stddef.h>
#include <stdint.h>

#define DX_HIDX_NIL UINT64_MAX

typedef struct dx_hidx dx_hidx;

typedef struct {
    uint64_t h;
    uint64_t slot;
} dx_hidx_iter;

/* cap_hint: entries expected (0 = small); the table grows as needed. */
int dx_hidx_create(size_t cap_hint, dx_hidx **out);
void dx_hidx_destroy(dx_hidx *ix);
size_t dx_hidx_count(const dx_hidx *ix);

/* Adds (h, v); the caller keeps (h, v) pairs unique.  DX_ENOMEM when the
 * table must grow and cannot (the index is unchanged). */
int dx_hidx_insert(dx_hidx *ix, uint64_t h, uint64_t v);
/* Removes the entry (h, v); DX_ENOENT if there is none. */
int dx_hidx_remove(dx_hidx *ix, uint64_t h, uint64_t v);

/* Candidates for h:
 *   dx_hidx_iter it; uint64_t v;
 *   for (dx_hidx_find(ix, h, &it); dx_hidx_next(ix, &it, &v);) if (key_of(v) == key) ...
 * The index must not change during the walk. */
void dx_hidx_find(const dx_hidx *ix, uint64_t h, dx_hidx_iter *it);
int dx_hidx_next(const dx_hidx *ix, dx_hidx_iter *it, uint64_t *v);

/* Every value, in slot order: start with *cursor = 0; returns 0 at the end.
 * The index must not change during the walk. */
int dx_hidx_each(const dx_hidx *ix, size_t *cursor, uint64_t *v);

/* Structural check for tests: the count matches the occupied slots and every
 * entry is reachable from its home slot.  0 or DX_EMISMATCH with a message. */
int dx_hidx_check(const dx_hidx *ix);

#endif
