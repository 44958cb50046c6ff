/* dx_list: the one intrusive doubly linked list (libuv's queue.h, Linux's
 * list.h): a dx_list member inside each element, and a dx_list head.  The
 * list is circular through its head, so insert and remove need no special
 * case for the ends, and an element knows whether it is linked (a removed
 * or initialised element points at itself).  Header only: every operation
 * is a few stores.
 *
 *   typedef struct { ...; dx_list link; } conn;
 *   dx_list conns;  dx_list_init(&conns);
 *   dx_list_push_back(&conns, &c->link);
 *   DX_LIST_FOR_EACH_SAFE(it, tmp, &conns) { conn *c = DX_LIST_ENTRY(it, conn, link); ... }
 *
 * An element of zeroed memory (calloc) is "not linked" as well, so a
 * structure that is freed before it was ever linked needs no init. */
#ifndef DX_LIST_H
#define DX_LIST_H

#include <stddef.h>

typedef struct dx_list {
    struct dx_list *prev, *next;
} dx_list;

/* The element that holds list member `ptr`, whose type is `type`. */
#define DX_LIST_ENTRY(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

/* An empty list head, or an element that is on no list. */
static inline void dx_list_init(dx_list *h)
{
    h->prev = h->next = h;
}

static inline int dx_list_empty(const dx_list *h)
{
    return h->next == h;
}

/* Whether element n is on a list (zeroed or initialised: no). */
static inline int dx_list_linked(const dx_list *n)
{
    return n->next != NULL && n->next != n;
}

static inline void dx_list__insert(dx_list *n, dx_list *prev, dx_list *next)
{
    n->prev = prev;
    n->next = next;
    prev->next = n;
    next->prev = n;
}

/* Appends n (not linked) at the tail of h. */
static inline void dx_list_push_back(dx_list *h, dx_list *n)
{
    dx_list__insert(n, h->prev, h);
}

/* Inserts n (not linked) at the head of h. */
static inline void dx_list_push_front(dx_list *h, dx_list *n)
{
    dx_list__insert(n, h, h->next);
}

/* Unlinks n if it is linked; afterwards it is not linked. */
static inline void dx_list_remove(dx_list *n)
{
    if (!dx_list_linked(n)) return;
    n->prev->next = n->next;
    n->next->prev = n->prev;
    dx_list_init(n);
}

/* The first / last element's member, or NULL when the list is empty. */
static inline dx_list *dx_list_first(const dx_list *h)
{
    return h->next == h ? NULL : h->next;
}

static inline dx_list *dx_list_last(const dx_list *h)
{
    return h->prev == h ? NULL : h->prev;
}

/* Moves n (linked or not) to the head / tail of h: an LRU's "just used". */
static inline void dx_list_move_front(dx_list *h, dx_list *n)
{
    dx_list_remove(n);
    dx_list_push_front(h, n);
}

static inline void dx_list_move_back(dx_list *h, dx_list *n)
{
    dx_list_remove(n);
    dx_list_push_back(h, n);
}

/* Iterates over the members; _SAFE allows removing (or freeing) `it`. */
#define DX_LIST_FOR_EACH(it, h) for (dx_list *it = (h)->next; it != (h); it = it->next)
#define DX_LIST_FOR_EACH_SAFE(it, tmp, h)                                                          \
    for (dx_list *it = (h)->next, *tmp = it->next; it != (h); it = tmp, tmp = it->next)

#endif
