/* itest_fault_http: the links between the router and its nodes, broken on
 * purpose.  A fault proxy (fault_proxy.h) sits in front of the prefill node
 * P and of one decode node D0 (a second, D1, is reached directly); the
 * router knows them only through the proxies, whose health checks pass
 * untouched: each rule catches the connection that carries the next
 * completion.  Against each fault —
 *
 *   prefill leg   a peer that accepts and never answers, an RST in the
 *                 middle of its answer, a stall past --prefill-timeout-s,
 *                 connection attempts reordered
 *   decode leg    a peer that never answers, an RST before the first byte,
 *                 an RST mid-stream (chat, Messages and Responses streams),
 *                 a stall shorter than --node-idle-timeout-s and one past
 *                 it, a half-open connection mid-stream, a byte-by-byte
 *                 drip
 *
 * — the client gets either the answer a single node (the oracle, no prefix
 * caching) gives, byte for byte, or a clean error in its API's shape: a
 * stream that ends with an error event and never a finish, a non-streamed
 * 502/504 with an error body; never a hang (each request's client limit is
 * far past the documented deadline) and never a cut answer that looks
 * whole.  The router's counters name what it did
 * (duplex_router_fallbacks_total, duplex_router_upstream_errors_total) and
 * every node is at rest when it is stopped (stop_ok): nothing running, no
 * pin, no block but those live leases hold.  One cluster serves every case
 * (each a new conversation). */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pd_test.h"
#include "fault_proxy.h"
#include "load_test.h"

#define IDLE_S    "3"  /* the router's --node-idle-timeout-s and --prefill-timeout-s */
#define STALL_MS  8000 /* past both */
#define SHORT_MS  1000 /* well under them */
#define CHAT_POST "POST /v1/chat/completions"
#define MID       4000 /* answer bytes before a mid-stream fault: events reached the client */

static struct {
    tp_proc P, D0, D1, S, R;
    fp_proxy fp, fd; /* in front of P, of D0 */
    unsigned seed;
} C;

/* ---- the cluster ---------------------------------------------------------- */

static int cluster_up(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (pdt_setup("fault_http")) return -1;
    node_start(&C.P, "p", k_pa);
    node_start(&C.D0, "d0", k_da);
    node_start(&C.D1, "d1", k_da);
    node_start(&C.S, "s", k_ref);
    fp_start(&C.fp, "127.0.0.1", "127.0.0.1", C.P.http);
    fp_start(&C.fd, "127.0.0.1", "127.0.0.1", C.D0.http);
    char pl[64], dl[128];
    snprintf(pl, sizeof pl, "http://127.0.0.1:%ld", C.fp.st->port);
    snprintf(dl, sizeof dl, "http://127.0.0.1:%ld,http://127.0.0.1:%d", C.fd.st->port, C.D1.http);
    const char *argv[] = {"router", "--prefill",
                          pl,       "--decode",
                          dl,       "--port",
                          "0",      "--health-interval-ms",
                          "100",    "--tokenizer",
                          G.model,  "--local-prefill-max-tokens",
                          "0",      "--prefill-timeout-s",
                          IDLE_S,   "--node-idle-timeout-s",
                          IDLE_S,   NULL};
    char log[160];
    snprintf(log, sizeof log, "%s/router.log", G.dir);
    tp_start(&C.R, G.bin, log, argv, "duplex router:");
    router_wait_healthy(&C.R);
    C.seed = 7000;
    return 0;
}

static int cluster_down(void **state)
{
    (void)state;
    fp_stop(&C.fp);
    fp_stop(&C.fd);
    tp_proc *all[] = {&C.R, &C.P, &C.D0, &C.D1, &C.S};
    for (size_t i = 0; i < DX_ARRAY_LEN(all); i++)
        if (all[i]->pid > 0 && !tp_gone(all[i])) tp_stop(all[i], SIGKILL, 10);
    return pdt_teardown();
}

/* ---- requests --------------------------------------------------------------- */

typedef struct {
    CURLcode cc;
    long status;
    dx_buf body;
} reply;

/* One request to the router (path, body), its client limit 120 s: far past
 * every deadline the faults meet, so only a hang reaches it. */
static void call(const char *path, const char *body, reply *out)
{
    dx_buf_init(&out->body, 0);
    struct curl_slist *h;
    CURL *c = tc_curl(C.R.http, "POST", path, body, &out->body, &h, 120);
    out->cc = curl_easy_perform(c);
    out->status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    tc_terminate(&out->body);
    if (out->cc == CURLE_OPERATION_TIMEDOUT) fail_msg("%s: no answer within 120 s", path);
}

static long fallbacks(const char *reason)
{
    char s[128];
    snprintf(s, sizeof s, "duplex_router_fallbacks_total{reason=\"%s\"}", reason);
    return (long)tc_metric_or(C.R.http, s, 0);
}

static long up_errors(const char *leg, const char *reason)
{
    char s[160];
    snprintf(s, sizeof s, "duplex_router_upstream_errors_total{leg=\"%s\",reason=\"%s\"}", leg,
             reason);
    return (long)tc_metric_or(C.R.http, s, 0);
}

/* The router sees the node behind proxy `port` as healthy again (a failed
 * request marks it down until its next health check passes). */
static void wait_up(long port, const char *role)
{
    char series[200];
    snprintf(series, sizeof series,
             "duplex_router_node_healthy{node=\"http://127.0.0.1:%ld\",role=\"%s\"}", port, role);
    for (int i = 0; i < 600 && tc_metric_or(C.R.http, series, -1) != 1; i++) tp_sleep_ms(50);
    if (tc_metric_or(C.R.http, series, -1) != 1) fail_msg("%s %ld never healthy again", role, port);
}

/* A fresh conversation and its oracle copy. */
static void fresh(conv *c, conv *r)
{
    C.seed += 17;
    conv_init(c, C.seed, 40 + (int)(C.seed % 40));
    conv_init(r, C.seed, 40 + (int)(C.seed % 40));
}

/* The chat body of c's next turn; `cut`: a long answer (ignore_eos), for
 * a fault mid-stream to find it running. */
static char *chat_json(const conv *c, int max_tokens, int stream, int cut)
{
    json_t *b = chat_body(c->msgs, max_tokens);
    if (stream) json_object_set_new(b, "stream", json_true());
    if (cut) json_object_set_new(b, "ignore_eos", json_true());
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* The reply is the oracle's answer to the same turn, byte for byte. */
static void expect_right(const reply *rp, int stream, conv *r, int max_tokens, const char *what)
{
    if (rp->cc != CURLE_OK || rp->status != 200)
        fail_msg("%s: curl %s, status %ld: %.300s", what, curl_easy_strerror(rp->cc), rp->status,
                 rp->body.data);
    const char *why = NULL;
    json_t *got = lt_answer(&rp->body, stream, &why);
    if (!got) fail_msg("%s: %s: %.300s", what, why, rp->body.data);
    assert_same(got, turn_single(r, &C.S, max_tokens), 1);
}

/* A stream that failed: an error event, no finish, [DONE] (if any) only
 * after the error; or a transport error. */
static void expect_failed_stream(const reply *rp, const char *what)
{
    const char *s = rp->body.data ? rp->body.data : "";
    const char *err = strstr(s, "data: {\"error\"");
    size_t n = strlen(s);
    const char *end = n > 700 ? s + n - 700 : s; /* where it went wrong */
    if (strstr(s, "\"finish_reason\":\"")) {
        char path[160];
        snprintf(path, sizeof path, "%s/cut-stream.txt", G.dir);
        FILE *f = fopen(path, "w");
        if (f) fputs(s, f), fclose(f);
        fail_msg("%s: a cut stream with a finish (all of it in %s): ...%s", what, path, end);
    }
    if (rp->cc == CURLE_OK && !err)
        fail_msg("%s: the stream ended without an error: ...%s", what, end);
    const char *done = strstr(s, "data: [DONE]");
    if (done && (!err || done < err)) fail_msg("%s: [DONE] before the error: ...%s", what, end);
}

/* A non-streamed failure in OpenAI's shape. */
static void expect_error_json(const reply *rp, long want, const char *what)
{
    if (rp->status != want)
        fail_msg("%s: status %ld, want %ld: %s", what, rp->status, want, rp->body.data);
    json_t *v = tc_json(&rp->body);
    assert_true(json_is_string(json_object_get(json_object_get(v, "error"), "message")));
    json_decref(v);
}

/* Turn 1 of a fresh conversation (plain, checked), repeated until it was
 * served by D0: its next turn goes to D0 (affinity), through the proxy. */
static void conv_on_d0(conv *c, conv *r, const char *hdr)
{
    wait_up(C.fp.st->port, "prefill");
    wait_up(C.fd.st->port, "decode");
    for (int tries = 0; tries < 8; tries++) {
        fresh(c, r);
        long holds = metric(&C.D0, "duplex_kv_holds_total");
        json_t *b = chat_body(c->msgs, 12);
        const char *h[] = {hdr, NULL};
        json_t *resp = post_h(C.R.http, b, h, 200);
        json_t *ans = answer_of(resp);
        conv_add_answer(c, ans);
        assert_same(ans, turn_single(r, &C.S, 12), 1);
        json_decref(b);
        json_decref(resp);
        if (metric(&C.D0, "duplex_kv_holds_total") > holds) {
            user_turn(c, r, C.seed + 1, 10);
            return;
        }
        conv_free(c);
        conv_free(r);
    }
    fail_msg("eight conversations and none went to D0");
}

/* ---- the prefill leg --------------------------------------------------------- */

/* Each fault of the prefill leg: the router gives up on P (at once, or at
 * --prefill-timeout-s) and the decode node prefills the prompt itself. */
static void prefill_case(fp_rule rule, const char *what)
{
    conv c, r;
    fresh(&c, &r);
    wait_up(C.fp.st->port, "prefill");
    long failed = fallbacks("prefill_failed"), fired = fp_get(&C.fp, &C.fp.st->fired);
    fp_arm(&C.fp, rule);
    char *b = chat_json(&c, 16, 0, 0);
    reply rp;
    call("/v1/chat/completions", b, &rp);
    fp_pass(&C.fp);
    assert_true(fp_get(&C.fp, &C.fp.st->fired) > fired); /* the fault happened */
    expect_right(&rp, 0, &r, 16, what);
    assert_true(fallbacks("prefill_failed") > failed); /* local prefill instead */
    printf("prefill leg, %s: right answer by local prefill; prefill errors: timeout %ld, "
           "transport %ld\n",
           what, up_errors("prefill", "timeout"), up_errors("prefill", "transport"));
    free(b);
    dx_buf_free(&rp.body);
    conv_free(&c);
    conv_free(&r);
}

static void test_prefill_faults(void **state)
{
    (void)state;
    long t0 = up_errors("prefill", "timeout"), x0 = up_errors("prefill", "transport");
    prefill_case((fp_rule){.fault = FP_BLACKHOLE, .match = CHAT_POST, .after = -1, .n = 1},
                 "a peer that never answers");
    prefill_case((fp_rule){.fault = FP_RESET, .match = CHAT_POST, .after = 40, .n = 1},
                 "an RST mid-answer");
    prefill_case((fp_rule){.fault = FP_STALL, .match = CHAT_POST, .ms = STALL_MS, .n = 1},
                 "a stall past --prefill-timeout-s");
    assert_true(up_errors("prefill", "timeout") >= t0 + 2);
    assert_true(up_errors("prefill", "transport") >= x0 + 1);
}

/* Three conversations at once (at least two on new connections): their
 * connections to P reach it the other way round; all are answered right. */
static void test_prefill_reordered(void **state)
{
    (void)state;
    enum { N = 3 };
    conv c[N], r[N];
    char *b[N];
    CURLM *m = curl_multi_init();
    dx_buf out[N];
    CURL *e[N];
    struct curl_slist *h[N];
    wait_up(C.fp.st->port, "prefill");
    fp_arm(&C.fp, (fp_rule){.fault = FP_REORDER, .n = 2, .ms = 3000});
    long connected = fp_get(&C.fp, &C.fp.st->connected);
    for (int i = 0; i < N; i++) {
        fresh(&c[i], &r[i]);
        b[i] = chat_json(&c[i], 12, 0, 0);
        dx_buf_init(&out[i], 0);
        e[i] = tc_curl(C.R.http, "POST", "/v1/chat/completions", b[i], &out[i], &h[i], 120);
        curl_multi_add_handle(m, e[i]);
    }
    tc_multi_run(m);
    fp_pass(&C.fp);
    printf("prefill leg, reordered connections: %ld new connections to P\n",
           fp_get(&C.fp, &C.fp.st->connected) - connected);
    for (int i = 0; i < N; i++) {
        reply rp = {.cc = CURLE_OK, .body = out[i]};
        curl_easy_getinfo(e[i], CURLINFO_RESPONSE_CODE, &rp.status);
        tc_terminate(&rp.body);
        expect_right(&rp, 0, &r[i], 12, "reordered connections");
        curl_multi_remove_handle(m, e[i]);
        curl_easy_cleanup(e[i]);
        curl_slist_free_all(h[i]);
        dx_buf_free(&out[i]);
        free(b[i]);
        conv_free(&c[i]);
        conv_free(&r[i]);
    }
    curl_multi_cleanup(m);
}

/* ---- the decode leg --------------------------------------------------------- */

/* The next turn of a conversation held by D0, with the fault on D0's link:
 * the request succeeds on D1 (a failure before any byte reached the
 * client is retried) or, past the first byte, ends cleanly. */
static void decode_case(fp_rule rule, int stream, int want_right, const char *what)
{
    conv c, r;
    conv_on_d0(&c, &r, NULL);
    long retries = fallbacks("decode_retry"), fired = fp_get(&C.fd, &C.fd.st->fired);
    fp_arm(&C.fd, rule);
    int n = want_right ? 16 : 400;
    char *b = chat_json(&c, n, stream, !want_right);
    reply rp;
    call("/v1/chat/completions", b, &rp);
    fp_pass(&C.fd);
    assert_true(fp_get(&C.fd, &C.fd.st->fired) > fired);
    if (want_right) {
        expect_right(&rp, stream, &r, n, what);
        if (rule.fault != FP_DRIP && !(rule.fault == FP_STALL && rule.ms == SHORT_MS))
            assert_true(fallbacks("decode_retry") > retries); /* on D1 */
    } else if (stream) {
        expect_failed_stream(&rp, what);
    } else {
        expect_error_json(&rp, 504, what);
    }
    printf("decode leg, %s (%s): %s\n", what, stream ? "streamed" : "whole",
           want_right ? "the right answer" : "a clean error");
    free(b);
    dx_buf_free(&rp.body);
    conv_free(&c);
    conv_free(&r);
}

static void test_decode_before_first_byte(void **state)
{
    (void)state;
    long t0 = up_errors("decode", "timeout");
    for (int stream = 0; stream < 2; stream++) {
        decode_case((fp_rule){.fault = FP_BLACKHOLE, .match = CHAT_POST, .after = -1, .n = 1},
                    stream, 1, "a peer that never answers");
        decode_case((fp_rule){.fault = FP_RESET, .match = CHAT_POST, .after = 0, .n = 1}, stream, 1,
                    "an RST before the first byte");
    }
    assert_true(up_errors("decode", "timeout") >= t0 + 2); /* the silent ones */
}

/* Past the first byte: an RST, a stall past the idle limit, a half-open
 * connection end the stream with an error; a short stall and a drip only
 * slow it. */
static void test_decode_mid_stream(void **state)
{
    (void)state;
    long t0 = up_errors("decode", "timeout"), x0 = up_errors("decode", "transport");
    decode_case((fp_rule){.fault = FP_RESET, .match = CHAT_POST, .after = MID, .ms = 500, .n = 1},
                1, 0, "an RST mid-stream");
    decode_case(
        (fp_rule){.fault = FP_STALL, .match = CHAT_POST, .after = MID, .ms = STALL_MS, .n = 1}, 1,
        0, "a stall past --node-idle-timeout-s");
    decode_case((fp_rule){.fault = FP_FREEZE, .match = CHAT_POST, .after = MID, .n = 1}, 1, 0,
                "a half-open connection");
    decode_case(
        (fp_rule){.fault = FP_STALL, .match = CHAT_POST, .after = 200, .ms = SHORT_MS, .n = 1}, 1,
        1, "a short stall");
    decode_case((fp_rule){.fault = FP_DRIP, .match = CHAT_POST, .after = 200, .ms = 1, .n = 1}, 1,
                1, "a byte-by-byte drip");
    decode_case(
        (fp_rule){.fault = FP_STALL, .match = CHAT_POST, .after = 30, .ms = STALL_MS, .n = 1}, 0, 1,
        "a stall inside a whole answer's head");
    assert_true(up_errors("decode", "timeout") >= t0 + 3);
    assert_true(up_errors("decode", "transport") >= x0 + 1);
}

/* The Messages and Responses doors: a stream cut mid-answer ends with the
 * door's own error event (Anthropic's `event: error`, Responses'
 * `response.failed`), never its normal end. */
static void test_other_doors_mid_stream(void **state)
{
    (void)state;
    for (int door = 0; door < 2; door++) {
        conv c, r;
        conv_on_d0(&c, &r, NULL);
        json_t *msgs = json_deep_copy(c.msgs);
        json_t *sys = json_array_get(msgs, 0);
        json_t *b;
        if (door == 0) {
            b = json_pack("{s:s,s:i,s:b,s:b,s:O,s:o}", "model", G.model_name, "max_tokens", 400,
                          "stream", 1, "ignore_eos", 1, "system", json_object_get(sys, "content"),
                          "messages", json_deep_copy(msgs));
            json_array_remove(json_object_get(b, "messages"), 0);
        } else {
            b = json_pack("{s:s,s:i,s:b,s:b,s:O,s:o}", "model", G.model_name, "max_output_tokens",
                          400, "stream", 1, "ignore_eos", 1, "instructions",
                          json_object_get(sys, "content"), "input", json_deep_copy(msgs));
            json_array_remove(json_object_get(b, "input"), 0);
        }
        char *s = json_dumps(b, JSON_COMPACT);
        fp_arm(&C.fd,
               (fp_rule){.fault = FP_RESET, .match = CHAT_POST, .after = MID, .ms = 500, .n = 1});
        reply rp;
        call(door == 0 ? "/v1/messages" : "/v1/responses", s, &rp);
        fp_pass(&C.fd);
        const char *t = rp.body.data ? rp.body.data : "";
        if (door == 0 && (!strstr(t, "event: error") || strstr(t, "event: message_stop")))
            fail_msg("Messages stream cut mid-answer: %s", t);
        if (door == 1 && (!strstr(t, "response.failed") || strstr(t, "response.completed")))
            fail_msg("Responses stream cut mid-answer: %s", t);
        printf("decode leg, an RST mid-stream through %s: the door's error event\n",
               door == 0 ? "/v1/messages" : "/v1/responses");
        free(s);
        json_decref(b);
        json_decref(msgs);
        dx_buf_free(&rp.body);
        conv_free(&c);
        conv_free(&r);
    }
}

/* Last: everything stops cleanly, every node at rest (stop_ok). */
static void test_at_rest(void **state)
{
    (void)state;
    stop_ok(&C.R);
    stop_ok(&C.P);
    stop_ok(&C.D0);
    stop_ok(&C.D1);
    stop_ok(&C.S);
}

int main(void)
{
    if (getenv("DX_TEST_FILTER")) cmocka_set_test_filter(getenv("DX_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_faults),           cmocka_unit_test(test_prefill_reordered),
        cmocka_unit_test(test_decode_before_first_byte), cmocka_unit_test(test_decode_mid_stream),
        cmocka_unit_test(test_other_doors_mid_stream),   cmocka_unit_test(test_at_rest), /* last */
    };
    return cmocka_run_group_tests_name("router <-> nodes through a fault proxy", tests, cluster_up,
                                       cluster_down);
}
