/* store_test: a router_store lookup's answer, kept for a test to check
 * (tests/unit/test_router_store.c, tests/integration/itest_rstate.c). */
#ifndef STORE_TEST_H
#define STORE_TEST_H

#include <stdio.h>

#include "router/router_store.h"

typedef struct {
    int calls, rc, found, node;
    size_t which;
    uint32_t tokens;
    char params[256];
} st_got;

static inline void st_on_got(void *user, int rc, const router_store_hit *h)
{
    st_got *g = user;
    g->calls++;
    g->rc = rc;
    g->found = h != NULL;
    if (h) {
        g->node = h->node;
        g->which = h->which;
        g->tokens = h->num_tokens;
        snprintf(g->params, sizeof g->params, "%.*s", (int)h->params_len,
                 h->params ? h->params : "");
    }
}

#endif
