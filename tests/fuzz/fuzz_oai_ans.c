/* Fuzz target: chat answers read back into their pieces (oai_ans), as the
 * front doors read what a node answered.  The input is fed both as a whole
 * answer and, split at its newlines, as a stream's event data.  Invariants:
 * nothing but DX_EFORMAT or DX_ENOMEM fails; a call that succeeds leaves a
 * result whose strings are NUL-terminated at their stated lengths; events
 * have kinds the enum names, and a CALL event an id; no allocation
 * outlives the reader (the allocator's count). */
#include <stdint.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "oai/oai_ans.h"
#include "oai/oai_req.h"

static void check_result(const oai_tools_result *r)
{
    DX_ASSERT(!r->content || strlen(r->content) <= r->content_len);
    DX_ASSERT(!r->reasoning || strlen(r->reasoning) <= r->reasoning_len);
    for (size_t i = 0; i < r->n_calls; i++) {
        DX_ASSERT(r->calls[i].name && r->calls[i].arguments);
        DX_ASSERT(strlen(r->calls[i].id) < sizeof r->calls[i].id);
    }
}

static void feed_stream(const char *p, size_t n)
{
    oai_ans_stream *s = oai_ans_stream_create();
    if (!s) return;
    oai_ans_info info;
    oai_ans_info_init(&info);
    for (size_t at = 0; at <= n;) {
        const char *nl = memchr(p + at, '\n', n - at);
        size_t len = nl ? (size_t)(nl - (p + at)) : n - at;
        const oai_tools_ev *ev;
        size_t n_ev;
        int rc = oai_ans_chunk(s, p + at, len, &ev, &n_ev, &info);
        DX_ASSERT(rc == 0 || rc == DX_EFORMAT || rc == DX_ENOMEM);
        for (size_t i = 0; rc == 0 && i < n_ev; i++) {
            DX_ASSERT(ev[i].kind <= OAI_TOOLS_EV_ARGS && ev[i].text);
            DX_ASSERT(ev[i].kind != OAI_TOOLS_EV_CALL || ev[i].id);
        }
        at += len + 1;
    }
    DX_ASSERT(info.stop_reason.len == 0 || info.stop_reason.data[info.stop_reason.len] == 0);
    oai_ans_info_free(&info);
    oai_ans_stream_destroy(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int once;
    if (!once) {
        oai_json_use_dx_alloc();
        once = 1;
    }
    size_t before = dx_alloc_live_bytes();
    oai_tools_result r;
    oai_ans_info info;
    oai_ans_info_init(&info);
    int rc = oai_ans_full((const char *)data, size, &r, &info);
    DX_ASSERT(rc == 0 || rc == DX_EFORMAT || rc == DX_ENOMEM);
    if (rc == 0) {
        check_result(&r);
        oai_tools_result_free(&r);
    }
    oai_ans_info_free(&info);
    feed_stream((const char *)data, size);
    DX_ASSERT(dx_alloc_live_bytes() == before);
    return 0;
}
