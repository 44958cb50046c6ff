/* Fuzz target: the router's SSE splitter and kv_transfer_params removal.
 * The first byte seeds how the rest is cut into chunks (and bit 1 caps the
 * cached prompt tokens at bits 2-4, as after a prefill node); the rest is an
 * upstream answer.  Invariants: the events handed out, followed by what is
 * still pending, are the input byte for byte, whatever the chunking; every
 * event ends in a blank line; an event (or whole answer) rewritten without
 * its params is valid JSON with no top-level kv_transfer_params, and its
 * cached tokens within the cap. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"
#include "router/router_sse.h"

typedef struct {
    dx_buf all, scratch, out, text;
    int has_cap;
    long cap;
} fz;

static void check_rewritten(const char *js, size_t len, const fz *f)
{
    json_error_t je;
    json_t *v = json_loadb(js, len, JSON_ALLOW_NUL, &je);
    DX_ASSERT(json_is_object(v));
    DX_ASSERT(json_object_get(v, "kv_transfer_params") == NULL);
    json_t *c = json_object_get(json_object_get(json_object_get(v, "usage"),
                                                "prompt_tokens_details"),
                                "cached_tokens");
    DX_ASSERT(!f->has_cap || !json_is_integer(c) || json_integer_value(c) <= f->cap);
    json_decref(v);
}

static int on_event(void *user, const char *ev, size_t len)
{
    fz *f = user;
    DX_ASSERT(len >= 2 && ev[len - 1] == '\n');
    dx_buf_append(&f->all, ev, len);
    router_sse_info info = {.text = &f->text, .has_cap = f->has_cap, .cached_cap = f->cap};
    int rc = router_sse_event(ev, len, len & 1, &f->scratch, &f->out, &info);
    DX_ASSERT(rc == 0 || rc == 1 || rc == DX_ENOMEM);
    if (rc == 1) {
        DX_ASSERT(f->out.len > 8 && !memcmp(f->out.data, "data: ", 6));
        check_rewritten(f->out.data + 6, f->out.len - 8, f);
        json_decref(info.params);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    dx_rng rng;
    dx_rng_seed(&rng, data[0]);
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    fz f = {.has_cap = data[0] & 2, .cap = (data[0] >> 2) & 7};
    dx_buf_init(&f.all, 0);
    dx_buf_init(&f.scratch, 0);
    dx_buf_init(&f.out, 0);
    dx_buf_init(&f.text, 1 << 16);
    router_sse s;
    router_sse_init(&s, 1 << 20);
    for (size_t off = 0; off < n;) {
        size_t k = 1 + dx_rng_next(&rng) % (data[0] & 0x80 ? 3 : 64);
        if (k > n - off) k = n - off;
        int rc = router_sse_feed(&s, p + off, k, on_event, &f);
        DX_ASSERT(rc == 0);
        off += k;
    }
    DX_ASSERT(f.all.len + s.pend.len == n);
    DX_ASSERT(!n || !memcmp(f.all.data ? f.all.data : "", p, f.all.len));
    DX_ASSERT(!s.pend.len || !memcmp(s.pend.data, p + f.all.len, s.pend.len));
    router_sse_info info = {.text = &f.text, .has_cap = f.has_cap, .cached_cap = f.cap};
    if (router_sse_answer(p, n, data[0] & 1, &f.out, &info) == 1) {
        check_rewritten(f.out.data, f.out.len, &f);
        json_decref(info.params);
    }
    router_sse_free(&s);
    dx_buf_free(&f.all);
    dx_buf_free(&f.scratch);
    dx_buf_free(&f.out);
    dx_buf_free(&f.text);
    return 0;
}
