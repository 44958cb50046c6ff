/* test_router_sse: the router's SSE splitter and kv_transfer_params removal.
 * A real node stream (with CRLF, comments and a multi-line event mixed in)
 * is fed split at every byte, byte by byte and in random chunks: the same
 * events come out, in order, each exactly its bytes, and whole events in one
 * chunk are handed out without a copy.  The final chunk's params are removed
 * and everything else in it kept; events that merely mention the name pass
 * unchanged; reply text is gathered from chat and completion chunks and
 * answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"
#include "oai/oai_req.h"
#include "router/router_sse.h"

#define FINAL                                                                                      \
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],"    \
    "\"kv_transfer_params\":{\"do_remote_prefill\":true,\"remote_block_ids\":[1,2],"               \
    "\"remote_num_tokens\":32},\"usage\":null}\n\n"

static const char *const k_events[] = {
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
    "\"content\":\"\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
    ": a comment line\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \\\"kv_transfer_"
    "params\\\"\"}}]}\r\n\r\n",
    "event: x\ndata: {\"a\":\ndata: 1}\n\n",
    FINAL,
    "data: [DONE]\n\n",
};

typedef struct {
    dx_buf all;          /* every event, concatenated */
    size_t n;            /* events seen */
    int bad;             /* an event that is not the expected one */
    const char *lo, *hi; /* the caller's chunk, for the zero-copy check */
    size_t n_direct;
} seen;

static int on_ev(void *user, const char *ev, size_t len)
{
    seen *s = user;
    if (s->n >= DX_ARRAY_LEN(k_events) || strlen(k_events[s->n]) != len ||
        memcmp(k_events[s->n], ev, len) != 0)
        s->bad = 1;
    if (ev >= s->lo && ev + len <= s->hi) s->n_direct++;
    dx_buf_append(&s->all, ev, len);
    s->n++;
    return 0;
}

static void stream_text(dx_buf *b)
{
    dx_buf_init(b, 0);
    for (size_t i = 0; i < DX_ARRAY_LEN(k_events); i++) dx_buf_puts(b, k_events[i]);
}

/* Feeds b in the chunks given by cuts[] (ascending offsets). */
static void feed_cuts(const dx_buf *b, const size_t *cuts, size_t n_cuts, seen *s)
{
    router_sse sse;
    router_sse_init(&sse, 1 << 16);
    memset(s, 0, sizeof *s);
    dx_buf_init(&s->all, 0);
    size_t off = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : b->len;
        s->lo = b->data + off;
        s->hi = b->data + end;
        assert_int_equal(router_sse_feed(&sse, b->data + off, end - off, on_ev, s), 0);
        off = end;
    }
    assert_int_equal(router_sse_pending(&sse), 0);
    router_sse_free(&sse);
}

static void check_seen(seen *s, const dx_buf *b)
{
    assert_false(s->bad);
    assert_int_equal(s->n, DX_ARRAY_LEN(k_events));
    assert_int_equal(s->all.len, b->len);
    assert_memory_equal(s->all.data, b->data, b->len);
    dx_buf_free(&s->all);
}

static void test_split_everywhere(void **state)
{
    (void)state;
    dx_buf b;
    stream_text(&b);
    seen s;
    feed_cuts(&b, NULL, 0, &s); /* whole: every event straight from the chunk */
    assert_int_equal(s.n_direct, DX_ARRAY_LEN(k_events));
    check_seen(&s, &b);
    for (size_t cut = 1; cut < b.len; cut++) { /* two chunks, cut at every byte */
        feed_cuts(&b, &cut, 1, &s);
        check_seen(&s, &b);
    }
    size_t *all = dx_malloc(b.len * sizeof *all); /* byte by byte */
    for (size_t i = 0; i + 1 < b.len; i++) all[i] = i + 1;
    feed_cuts(&b, all, b.len - 1, &s);
    check_seen(&s, &b);
    dx_rng rng; /* random chunkings */
    dx_rng_seed(&rng, 11);
    for (int round = 0; round < 500; round++) {
        size_t n = 0, at = 0;
        while ((at += 1 + dx_rng_next(&rng) % 40) < b.len) all[n++] = at;
        feed_cuts(&b, all, n, &s);
        check_seen(&s, &b);
    }
    dx_free(all);
    dx_buf_free(&b);
}

static int stop_at_two(void *user, const char *ev, size_t len)
{
    return ++*(int *)user == 2 ? 7 : 0;
}

static void test_limits_and_stop(void **state)
{
    (void)state;
    router_sse sse;
    router_sse_init(&sse, 16);
    int n = 0;
    /* an incomplete event over the maximum */
    assert_int_equal(router_sse_feed(&sse, "data: 0123456789", 16, stop_at_two, &n), 0);
    assert_int_equal(router_sse_feed(&sse, "abc", 3, stop_at_two, &n), DX_ETOOBIG);
    assert_int_equal(router_sse_pending(&sse), 0);
    /* the callback's non-zero stops the feed and comes back */
    router_sse_reset(&sse);
    n = 0;
    assert_int_equal(router_sse_feed(&sse, "a\n\nb\n\nc\n\n", 9, stop_at_two, &n), 7);
    assert_int_equal(n, 2);
    router_sse_free(&sse);
}

static void test_data_lines(void **state)
{
    (void)state;
    dx_buf sc;
    dx_buf_init(&sc, 0);
    const char *d;
    size_t dl;
    const char *one = "data: {\"x\":1}\n\n";
    assert_int_equal(router_sse_data(one, strlen(one), &sc, &d, &dl), 0);
    assert_true(d == one + 6); /* one line: no copy */
    assert_int_equal(dl, 7);
    const char *crlf = "id: 3\r\ndata:abc\r\n\r\n";
    assert_int_equal(router_sse_data(crlf, strlen(crlf), &sc, &d, &dl), 0);
    assert_int_equal(dl, 3);
    assert_memory_equal(d, "abc", 3);
    const char *multi = "data: a\ndata:  b\ndata: c\n\n";
    assert_int_equal(router_sse_data(multi, strlen(multi), &sc, &d, &dl), 0);
    assert_int_equal(dl, 6);
    assert_memory_equal(d, "a\n b\nc", 6);
    assert_int_equal(router_sse_data(": hi\n\n", 6, &sc, &d, &dl), DX_ENOENT);
    assert_int_equal(router_sse_data("dat\n\n", 5, &sc, &d, &dl), DX_ENOENT);
    dx_buf_free(&sc);
}

static void test_strip_final(void **state)
{
    (void)state;
    dx_buf sc, out, text;
    dx_buf_init(&sc, 0);
    dx_buf_init(&out, 0);
    dx_buf_init(&text, 0);
    router_sse_info info = {.text = &text};
    assert_int_equal(router_sse_event(FINAL, strlen(FINAL), 1, &sc, &out, &info), 1);
    assert_non_null(info.params);
    assert_int_equal(json_integer_value(json_object_get(info.params, "remote_num_tokens")), 32);
    json_decref(info.params);
    /* the rest is kept, in order, as one event */
    assert_string_equal(out.data, "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},"
                                  "\"finish_reason\":\"stop\"}],\"usage\":null}\n\n");
    assert_int_equal(text.len, 0);
    /* content chunks: text gathered, nothing removed */
    for (size_t i = 0; i < DX_ARRAY_LEN(k_events); i++) {
        if (k_events[i] == (const char *)FINAL || strstr(k_events[i], "\"kv_transfer_params\":"))
            continue;
        assert_int_equal(router_sse_event(k_events[i], strlen(k_events[i]), 1, &sc, &out, &info),
                         0);
        assert_null(info.params);
    }
    assert_int_equal(text.len, strlen("Hello \"kv_transfer_params\""));
    assert_memory_equal(text.data, "Hello \"kv_transfer_params\"", text.len);
    /* a content that is exactly the name, and a nested member: passed as they are */
    const char *name = "data: {\"choices\":[{\"delta\":{\"content\":\"kv_transfer_params\"}}]}\n\n";
    assert_int_equal(router_sse_event(name, strlen(name), 1, &sc, &out, &info), 0);
    const char *nested = "data: {\"x\":{\"kv_transfer_params\":{}}}\n\n";
    assert_int_equal(router_sse_event(nested, strlen(nested), 1, &sc, &out, &info), 0);
    /* broken JSON that mentions it: not ours to fix, passed */
    const char *broken = "data: {\"kv_transfer_params\":\n\n";
    assert_int_equal(router_sse_event(broken, strlen(broken), 1, &sc, &out, &info), 0);
    /* a completion chunk's text */
    dx_buf_reset(&text);
    const char *cmpl = "data: {\"choices\":[{\"text\":\"abc\"}],\"kv_transfer_params\":null}\n\n";
    assert_int_equal(router_sse_event(cmpl, strlen(cmpl), 0, &sc, &out, &info), 1);
    assert_true(json_is_null(info.params));
    json_decref(info.params);
    assert_string_equal(text.data, "abc");
    assert_int_equal(info.text_added, 3);
    dx_buf_free(&sc);
    dx_buf_free(&out);
    dx_buf_free(&text);
}

static void test_answer(void **state)
{
    (void)state;
    dx_buf out, text;
    dx_buf_init(&out, 0);
    dx_buf_init(&text, 4);
    const char *a = "{\"id\":\"x\",\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":"
                    "\"hi \\u0000 there\"}}],\"kv_transfer_params\":{\"remote_lease\":\"ab\"},"
                    "\"usage\":{\"prompt_tokens\":3}}";
    router_sse_info info = {.text = NULL};
    assert_int_equal(router_sse_answer(a, strlen(a), 1, &out, &info), 1);
    assert_null(strstr(out.data, "kv_transfer_params"));
    assert_non_null(strstr(out.data, "\"usage\":{\"prompt_tokens\":3}"));
    assert_non_null(strstr(out.data, "hi \\u0000 there")); /* a NUL survives */
    json_decref(info.params);
    /* text over its buffer's maximum: marked lost, the answer still fine */
    info.text = &text;
    assert_int_equal(router_sse_answer(a, strlen(a), 1, &out, &info), 1);
    assert_true(info.text_lost);
    json_decref(info.params);
    const char *plain = "{\"choices\":[{\"text\":\"t\"}]}";
    info.text = NULL;
    assert_int_equal(router_sse_answer(plain, strlen(plain), 0, &out, &info), 0);
    assert_int_equal(router_sse_answer("not json", 8, 0, &out, &info), 0);
    dx_buf_free(&out);
    dx_buf_free(&text);
}

/* The usage the client sees counts what the cluster reused: tokens the
 * prefill node computed are not "cached" because the decode node pulled
 * them. */
static void test_cluster_usage(void **state)
{
    (void)state;
    dx_buf out, scratch;
    dx_buf_init(&out, 0);
    dx_buf_init(&scratch, 0);
    const char *ev = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,"
                     "\"completion_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":288}}}\n\n";
    router_sse_info info = {.has_cap = 1, .cached_cap = 160};
    assert_int_equal(router_sse_event(ev, strlen(ev), 1, &scratch, &out, &info), 1);
    assert_null(info.params);
    assert_non_null(strstr(out.data, "\"cached_tokens\":160"));
    info.cached_cap = 0; /* turn 1: the prefill node computed everything */
    assert_int_equal(router_sse_event(ev, strlen(ev), 1, &scratch, &out, &info), 1);
    assert_non_null(strstr(out.data, "\"cached_tokens\":0"));
    info.cached_cap = 400; /* above: as it is */
    assert_int_equal(router_sse_event(ev, strlen(ev), 1, &scratch, &out, &info), 0);
    info.has_cap = 0; /* not through a prefill node: as it is */
    info.cached_cap = 0;
    assert_int_equal(router_sse_event(ev, strlen(ev), 1, &scratch, &out, &info), 0);
    const char *a = "{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"usage\":{"
                    "\"prompt_tokens\":40,\"prompt_tokens_details\":{\"cached_tokens\":32}},"
                    "\"kv_transfer_params\":{\"remote_port\":9}}";
    info.has_cap = 1;
    info.cached_cap = 16;
    assert_int_equal(router_sse_answer(a, strlen(a), 1, &out, &info), 1);
    assert_non_null(info.params);
    assert_non_null(strstr(out.data, "\"cached_tokens\":16"));
    assert_null(strstr(out.data, "kv_transfer_params"));
    json_decref(info.params);
    dx_buf_free(&out);
    dx_buf_free(&scratch);
}

int main(void)
{
    oai_json_use_dx_alloc();
    size_t live = dx_alloc_live_bytes();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_everywhere), cmocka_unit_test(test_limits_and_stop),
        cmocka_unit_test(test_data_lines),       cmocka_unit_test(test_strip_final),
        cmocka_unit_test(test_answer),
        cmocka_unit_test(test_cluster_usage),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (dx_alloc_live_bytes() != live) {
        fprintf(stderr, "leak: %zu bytes\n", dx_alloc_live_bytes() - live);
        return 1;
    }
    return rc;
}
