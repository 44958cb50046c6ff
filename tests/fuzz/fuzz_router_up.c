/* Fuzz target: the JSON the router reads back from nodes — a prefill
 * node's answer (its kv_transfer_params and cached prompt tokens), the
 * params' TTL and token count, their trip through the conversation map, and
 * the stored text made into the next request's params.  The input is the
 * node's answer.  Invariants: params are taken exactly when the answer is a
 * JSON object with an object member kv_transfer_params, and their text
 * parses back to the same value; the TTL never exceeds the router's nor the
 * holder's promise; the map gives back the bytes it was given (or nothing,
 * when they exceed its bound) and stays consistent; the flagged params are
 * the stored ones with both flags set as asked. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "router/router_sse.h"
#include "router/router_state.h"

static void check_ttl(const json_t *params)
{
    const double router_ttl = 450;
    double ttl = router_params_ttl(params, router_ttl);
    DX_ASSERT(ttl <= router_ttl);
    json_t *bt = json_object_get(params, "remote_blocks_ttl_s");
    if (json_is_number(bt)) DX_ASSERT(ttl <= json_number_value(bt) || json_number_value(bt) < 0);
    json_t *nt = json_object_get(params, "remote_num_tokens");
    uint32_t n = router_params_tokens(params);
    DX_ASSERT(!n || (json_is_integer(nt) && json_integer_value(nt) == (json_int_t)n));
}

/* The params through the conversation map and back out as the next turn's. */
static void check_stored(const char *text, size_t len, const json_t *want)
{
    router_state *st;
    router_state_config cfg = {.max_entries = 4, .max_bytes = 4096};
    DX_ASSERT(router_state_create(&cfg, &st) == 0);
    router_key k = {.lo = len, .hi = 7};
    DX_ASSERT(router_state_put(st, &k, 1, text, len, 3, 100, 1) == 0);
    router_entry e;
    DX_ASSERT(router_state_get(st, &k, 2, &e) == 1 && e.node == 1);
    if (len <= cfg.max_bytes) {
        DX_ASSERT(e.params_len == len && !memcmp(e.params, text, len));
        for (int flags = 0; flags < 4; flags++) {
            json_t *f = router_params_flagged(e.params, flags & 1, flags >> 1);
            DX_ASSERT(json_is_object(f));
            DX_ASSERT(json_is_true(json_object_get(f, "do_remote_decode")) == (flags & 1));
            DX_ASSERT(json_is_true(json_object_get(f, "do_remote_prefill")) == (flags >> 1));
            json_t *g = json_deep_copy(want);
            json_object_set_new(g, "do_remote_decode", json_boolean(flags & 1));
            json_object_set_new(g, "do_remote_prefill", json_boolean(flags >> 1));
            DX_ASSERT(json_equal(f, g));
            json_decref(g);
            json_decref(f);
        }
    } else {
        DX_ASSERT(e.params == NULL);
    }
    DX_ASSERT(router_state_check(st) == 0);
    DX_ASSERT(router_state_del(st, &k) == 0 && router_state_del(st, &k) == DX_ENOENT);
    router_state_destroy(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int once;
    if (!once) { /* jansson through the project allocator: leaks show as a count */
        json_set_alloc_funcs(dx_malloc, dx_free);
        once = 1;
    }
    size_t live = dx_alloc_live_count();
    const char *body = (const char *)data;
    char *params;
    long cached;
    int rc = router_answer_params(body, size, &params, &cached);
    DX_ASSERT(rc == 0 || rc == 1);
    DX_ASSERT(cached >= -1 && (rc == 1) == (params != NULL));
    json_error_t je;
    json_t *root = json_loadb(body, size, JSON_ALLOW_NUL, &je);
    json_t *want = json_object_get(root, "kv_transfer_params");
    DX_ASSERT(rc == json_is_object(want));
    if (rc == 1) {
        json_t *got = json_loads(params, JSON_ALLOW_NUL, &je);
        DX_ASSERT(json_equal(got, want));
        check_ttl(got);
        check_stored(params, strlen(params), got);
        json_decref(got);
        dx_free(params);
    }
    if (json_is_object(want)) check_ttl(want);
    json_decref(root);
    DX_ASSERT(router_params_flagged(NULL, 1, 1) == NULL);
    if (dx_alloc_live_count() != live) abort(); /* a leak */
    return 0;
}
