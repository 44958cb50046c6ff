/* itest_pd: prefill/decode nodes speaking docs/pd.md, as real processes on
 * loopback, driven by this test the way a router drives them (the router has
 * its own tests).  Every output is compared byte for byte with one `--role
 * both` node without prefix caching that sees the same conversation: the
 * bidirectional flow, the one-way flow (duplex-aware and vLLM-proxy shaped),
 * the recompute threshold, the decision by costs (pull a long answer's KV,
 * recompute a short one's; a decode node that finds pulling dear),
 * edited history, forged params, a decode node that
 * dies or whose retention expires, a pool too small for what is retained,
 * and streaming.  Node metrics prove where each prompt's KV came from. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>

#include "pd_test.h"

/* ---- tests -------------------------------------------------------------------- */

#define FIRST "duplex_pd_first_token_from_prefill_total"

/* An 8-turn conversation: from turn 2 the prefill node pulls the whole
 * history the decode node kept (previous prompt and answer, block-aligned)
 * and computes only the new tokens; the decode node pulls back only the
 * delta; every answer equals the single node's. */
static void bidirectional_exact(int turns)
{
    const char *pa[] = {"--role",
                        "prefill",
                        "--bidirectional-kv-xfer",
                        "--no-enable-prefix-caching",
                        "--kv-recompute-threshold",
                        "16",
                        NULL};
    const char *da[] = {"--role", "decode", "--bidirectional-kv-xfer", "--kv-recompute-threshold",
                        "16",     NULL};
    tp_proc P, D, S;
    node_start(&P, "p", pa);
    node_start(&D, "d", da);
    node_start(&S, "s", k_ref);
    conv c, r;
    conv_init(&c, 1, 90);
    conv_init(&r, 1, 90);
    for (int t = 1; t <= turns; t++) {
        int max_tokens = 32 + (t * 13) % 33; /* 32..64 */
        long pulled_p = metric(&P, PULLED), computed_p = metric(&P, COMPUTED);
        long pulled_d = metric(&D, PULLED), local_d = metric(&D, LOCAL);
        long held = c.prompt + c.gen > 0 ? (c.prompt + c.gen - 1) / BS * BS : 0;
        long prev = c.prompt + c.gen;
        json_t *a = turn_pd(&c, &P, &D, max_tokens, 1, 0);
        json_t *b = turn_single(&r, &S, max_tokens);
        assert_same(a, b, t);
        long dp = metric(&P, PULLED) - pulled_p, dc = metric(&P, COMPUTED) - computed_p;
        long dd = metric(&D, PULLED) - pulled_d, dl = metric(&D, LOCAL) - local_d;
        assert_int_equal(dp + dc, c.prompt);
        if (t >= 2) {
            /* the history came from D: all it held, block-aligned */
            if (dp != held) fail_msg("turn %d: P pulled %ld tokens, D held %ld", t, dp, held);
            /* computed: the new tokens and at most one partial block */
            if (dc > c.prompt - prev + BS)
                fail_msg("turn %d: P computed %ld of %ld (new: %ld)", t, dc, c.prompt,
                         c.prompt - prev);
            /* D reused what it held and pulled back only the delta */
            assert_int_equal(dl, held);
            assert_true(dd <= c.prompt - held);
            assert_true(dd >= c.prompt - held - 2 * BS);
        }
        user_turn(&c, &r, 100 + (unsigned)t, 20 + t * 7);
    }
    /* one retention per conversation: each turn superseded the previous */
    assert_int_equal(metric(&D, "duplex_kv_leases"), 1);
    assert_int_equal(metric(&D, "duplex_kv_lease_events_total{event=\"superseded\"}"), turns - 1);
    assert_int_equal(metric(&P, "duplex_kv_pulls_total{direction=\"d2p\"}"), turns - 1);
    /* every turn's first token came from P, sent by D without computing */
    assert_int_equal(metric(&D, FIRST), turns);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

static void test_bidirectional_exact(void **state)
{
    (void)state;
    bidirectional_exact(8);
}

/* The same on a q4_0 model (its KV and logits come from the block-format
 * kernels): 4 turns. */
static void test_bidirectional_q4_0(void **state)
{
    (void)state;
    char saved[sizeof G.model];
    memcpy(saved, G.model, sizeof saved);
    snprintf(G.model, sizeof G.model, "%s/tiny-q4_0.gguf", G.dir);
    synth_config sc = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_Q4_0, .seed = 5};
    assert_int_equal(synth_write(&sc, G.model), 0);
    G.model_name = "duplex-synth-qwen3-tiny-q4_0";
    bidirectional_exact(4);
    memcpy(G.model, saved, sizeof saved);
    G.model_name = "duplex-synth-qwen3-tiny-f32";
}

/* The same flow on a mixture of experts (qwen3moe): the KV the prefill
 * node computes with grouped experts, the decode node's continuation, the
 * history pulled back — every answer equals one node's byte for byte, and
 * from turn 2 the history is pulled, not computed.  sc's file, served as
 * `name`. */
static void moe_flow(const synth_config *sc, const char *name)
{
    char moe[160];
    snprintf(moe, sizeof moe, "%s/moe.gguf", G.dir);
    assert_int_equal(synth_write(sc, moe), 0);
    const char *pa[] = {"--role",
                        "prefill",
                        "--bidirectional-kv-xfer",
                        "--no-enable-prefix-caching",
                        "--kv-recompute-threshold",
                        "16",
                        "--model",
                        moe,
                        NULL};
    const char *da[] = {
        "--role", "decode", "--bidirectional-kv-xfer", "--kv-recompute-threshold", "16", "--model",
        moe,      NULL};
    const char *sa[] = {"--no-enable-prefix-caching", "--model", moe, NULL};
    const char *dense = G.model_name;
    G.model_name = name;
    tp_proc P, D, S;
    node_start(&P, "p", pa);
    node_start(&D, "d", da);
    node_start(&S, "s", sa);
    conv c, r;
    conv_init(&c, 61, 90);
    conv_init(&r, 61, 90);
    for (int t = 1; t <= 4; t++) {
        long pulled_p = metric(&P, PULLED);
        long held = c.prompt + c.gen > 0 ? (c.prompt + c.gen - 1) / BS * BS : 0;
        json_t *a = turn_pd(&c, &P, &D, 40, 1, 0);
        json_t *b = turn_single(&r, &S, 40);
        assert_same(a, b, t);
        if (t >= 2 && metric(&P, PULLED) - pulled_p != held)
            fail_msg("turn %d: P pulled %ld tokens, D held %ld", t, metric(&P, PULLED) - pulled_p,
                     held);
        user_turn(&c, &r, 600 + (unsigned)t, 25);
    }
    assert_int_equal(metric(&P, "duplex_kv_pulls_total{direction=\"d2p\"}"), 3);
    G.model_name = dense;
    conv_free(&c);
    conv_free(&r);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* tiny-moe in BF16, and tiny-moe-k at Q4_K_M (K-quant experts). */
static void test_bidirectional_moe(void **state)
{
    (void)state;
    synth_config sc = {.arch = MODEL_QWEN3MOE, .preset = "tiny-moe", .dtype = DX_BF16, .seed = 5};
    moe_flow(&sc, "duplex-synth-qwen3moe-tiny-moe-bf16");
    synth_config kc = {.arch = MODEL_QWEN3MOE,
                       .preset = "tiny-moe-k",
                       .wtypes = synth_find_wtypes("q4_k_m"),
                       .seed = 5};
    moe_flow(&kc, "duplex-synth-qwen3moe-tiny-moe-k-q4_k_m");
}

/* One-way P→D: a prefill node without --bidirectional-kv-xfer recomputes
 * the history (prefix cache off) or reuses only its own prompt blocks
 * (cache on); the decode node keeps nothing; outputs are the same. */
static void test_unidirectional(void **state)
{
    (void)state;
    const char *pa_off[] = {"--role", "prefill", "--no-enable-prefix-caching", NULL};
    const char *pa_on[] = {"--role", "prefill", NULL};
    const char *da[] = {"--role", "decode", NULL};
    for (int cache = 0; cache < 2; cache++) {
        tp_proc P, D, S;
        node_start(&P, "p", cache ? pa_on : pa_off);
        node_start(&D, "d", da);
        node_start(&S, "s", k_ref);
        conv c, r;
        conv_init(&c, 7, 60);
        conv_init(&r, 7, 60);
        for (int t = 1; t <= 4; t++) {
            long local_p = metric(&P, LOCAL), computed_p = metric(&P, COMPUTED);
            json_t *a = turn_pd(&c, &P, &D, 40, 0, 0);
            json_t *b = turn_single(&r, &S, 40);
            assert_same(a, b, t);
            assert_null(c.dparams); /* the decode node retained nothing */
            long dl = metric(&P, LOCAL) - local_p, dc = metric(&P, COMPUTED) - computed_p;
            if (!cache) assert_int_equal(dc, c.p_prompt);       /* the whole history again */
            if (cache && t >= 2) assert_true(dl > 0 && dc > 0); /* its own prompt blocks only */
            user_turn(&c, &r, 300 + (unsigned)t, 30);
        }
        assert_int_equal(metric(&P, PULLED), 0);
        /* D released the holds it read; the rest expire with --kv-lease-ttl */
        assert_true(metric(&P, "duplex_kv_leases") <= 4);
        conv_free(&c);
        conv_free(&r);
        stop_ok(&P);
        stop_ok(&D);
        stop_ok(&S);
    }
}

/* The fixed rule (--kv-recompute-threshold 64, vLLM's): fewer than 64
 * reusable tokens at the decode node, the prefill node recomputes (and
 * counts it); 64 or more: it pulls. */
static void test_threshold(void **state)
{
    (void)state;
    const char *pa[] = {"--role",
                        "prefill",
                        "--bidirectional-kv-xfer",
                        "--no-enable-prefix-caching",
                        "--kv-recompute-threshold",
                        "64",
                        NULL};
    const char *da[] = {"--role", "decode", "--bidirectional-kv-xfer", NULL};
    tp_proc P, D;
    node_start(&P, "p", pa);
    node_start(&D, "d", da);
    conv shortc, longc;
    conv_init(&shortc, 11, 3);
    conv_init(&longc, 12, 60);
    json_decref(turn_pd(&shortc, &P, &D, 8, 1, 0)); /* D holds < 64 tokens */
    json_decref(turn_pd(&longc, &P, &D, 8, 1, 0));
    long held_short = (shortc.prompt + shortc.gen - 1) / BS * BS;
    assert_true(held_short < 64);
    user_turn(&shortc, NULL, 5, 40);
    user_turn(&longc, NULL, 6, 40);
    long below = metric(&P, "duplex_kv_fallbacks_total{reason=\"below_threshold\"}");
    long pulled = metric(&P, PULLED);
    json_decref(turn_pd(&shortc, &P, &D, 8, 1, 0));
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"below_threshold\"}"),
                     below + 1);
    assert_int_equal(metric(&P, PULLED), pulled);
    long held_long = (longc.prompt + longc.gen - 1) / BS * BS;
    json_decref(turn_pd(&longc, &P, &D, 8, 1, 0));
    assert_int_equal(metric(&P, PULLED), pulled + held_long);
    conv_free(&shortc);
    conv_free(&longc);
    stop_ok(&P);
    stop_ok(&D);
}

#define DECIDED(dir, path)                                                                         \
    "duplex_kv_reuse_decisions_total{direction=\"" dir "\",rule=\"auto\",path=\"" path "\"}"

/* The number after `key` in a request line (0 when it is not there). */
static double line_num(const char *line, const char *key)
{
    const char *k = strstr(line, key);
    return k ? strtod(k + strlen(key), NULL) : 0;
}

/* --kv-recompute-threshold auto (the default) with the prefill node's
 * costs fixed (--fixed-costs): a token costs 0.1 ms to compute, a pull
 * 5 ms whatever its size.  Its prefix cache holds each previous prompt, so
 * what the decode node adds is the previous answer: a long one (≥ 64
 * tokens: ≥ 6.4 ms to recompute) is pulled, a short one (≤ 40 tokens: ≤ 4
 * ms) recomputed — outside the 20% hysteresis either way — and the request
 * line says which with both estimates.  A decode node whose pulls cost 1 s
 * recomputes the prompts it is handed (P→D) instead.  Every answer equals
 * the single node's. */
static void test_reuse_by_cost(void **state)
{
    (void)state;
    const char *pa[] = {"--role",
                        "prefill",
                        "--bidirectional-kv-xfer",
                        "--fixed-costs",
                        "{\"prefill_tok_s\":1e-4,\"pull\":{\"setup_s\":0.005,\"byte_s\":0}}",
                        NULL};
    tp_proc P, D, S;
    node_start(&P, "p", pa);
    node_start(&D, "d", k_da);
    node_start(&S, "s", k_ref);
    conv c, r;
    conv_init(&c, 41, 30);
    conv_init(&r, 41, 30);
    char line[1024];
    static const int gens[] = {200, 12, 200, 8, 200, 16};
    int pulled_once = 0, recomputed_once = 0;
    for (int t = 1; t <= 7; t++) {
        long pulls = metric(&P, DECIDED("d2p", "pull"));
        long recs = metric(&P, DECIDED("d2p", "recompute")), pulled = metric(&P, PULLED);
        assert_same(turn_pd(&c, &P, &D, t <= 6 ? gens[t - 1] : 16, 1, 0),
                    turn_single(&r, &S, t <= 6 ? gens[t - 1] : 16), t);
        user_turn(&c, &r, 60 + (unsigned)t, 12);
        if (t == 1) continue;
        last_post(&P, line, sizeof line);
        long dp = metric(&P, DECIDED("d2p", "pull")) - pulls;
        long dr = metric(&P, DECIDED("d2p", "recompute")) - recs;
        double est_rec = line_num(line, " est_recompute_ms="); /* 0.1 ms a token */
        if (dp + dr == 0 && !strstr(line, "est_")) continue;   /* the answer filled no block */
        if (dp + dr != 1 || line_num(line, " est_pull_ms=") != 5.0)
            fail_msg("turn %d: %ld pulls and %ld recomputes decided: %s", t, dp, dr, line);
        if ((est_rec >= 6.4 && !dp) || (est_rec <= 4.0 && !dr))
            fail_msg("turn %d: recomputing costs %.1f ms, pulling 5 ms: %s", t, est_rec, line);
        if (dp) {
            assert_true(metric(&P, PULLED) > pulled);
            assert_non_null(strstr(line, " pull=d2p:"));
            pulled_once = 1;
        } else {
            assert_int_equal(metric(&P, PULLED), pulled);
            assert_non_null(strstr(line, " pull=recompute"));
            recomputed_once = 1;
        }
    }
    assert_true(pulled_once && recomputed_once);
    /* the recomputes were counted as such, under vLLM's name too */
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"below_threshold\"}"),
                     metric(&P, DECIDED("d2p", "recompute")));
    stop_ok(&D);
    /* a decode node that finds pulling dear recomputes what the prefill
     * node computed for it */
    const char *da[] = {"--role",
                        "decode",
                        "--bidirectional-kv-xfer",
                        "--fixed-costs",
                        "{\"prefill_tok_s\":1e-4,\"pull\":{\"setup_s\":1}}",
                        NULL};
    node_start(&D, "d", da);
    conv d, q;
    conv_init(&d, 42, 60);
    conv_init(&q, 42, 60);
    for (int t = 1; t <= 2; t++) {
        long pulled = metric(&D, PULLED);
        assert_same(turn_pd(&d, &P, &D, 24, 1, 0), turn_single(&q, &S, 24), t);
        assert_int_equal(metric(&D, PULLED), pulled);
        user_turn(&d, &q, 70 + (unsigned)t, 30);
    }
    assert_int_equal(metric(&D, DECIDED("p2d", "recompute")), 2);
    assert_int_equal(metric(&D, DECIDED("p2d", "pull")), 0);
    last_post(&D, line, sizeof line);
    assert_non_null(strstr(line, " pull=recompute est_pull_ms=1000.000"));
    conv_free(&c);
    conv_free(&r);
    conv_free(&d);
    conv_free(&q);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* A past answer edited (its second half stripped, as clients strip
 * reasoning): outputs still equal the single node's; reuse stops at the
 * first changed block. */
static void test_edited_history(void **state)
{
    (void)state;
    tp_proc P, D, S;
    node_start(&P, "p", k_pa);
    node_start(&D, "d", k_da);
    node_start(&S, "s", k_ref);
    conv c, r;
    conv_init(&c, 21, 70);
    conv_init(&r, 21, 70);
    for (int t = 1; t <= 3; t++) {
        json_t *a = turn_pd(&c, &P, &D, 40, 1, 0), *b = turn_single(&r, &S, 40);
        assert_same(a, b, t);
        user_turn(&c, &r, 40 + (unsigned)t, 25);
    }
    /* cut the first answer (message 2) in half in both copies */
    long first_prompt_tokens = 0;
    {
        json_t *m = json_array_get(c.msgs, 2), *m2 = json_array_get(r.msgs, 2);
        const char *txt = json_string_value(json_object_get(m, "content"));
        char *half = strndup(txt, strlen(txt) / 2);
        json_object_set_new(m, "content", json_string(half));
        json_object_set_new(m2, "content", json_string(half));
        free(half);
        json_t *first = json_pack("[O,O]", json_array_get(c.msgs, 0), json_array_get(c.msgs, 1));
        json_t *probe = chat_body(first, 1);
        json_decref(first);
        json_t *pr = post(&S, probe, 200);
        first_prompt_tokens = usage_of(pr, "prompt_tokens");
        json_decref(pr);
        json_decref(probe);
    }
    long pulled = metric(&P, PULLED);
    json_t *a = turn_pd(&c, &P, &D, 40, 1, 0), *b = turn_single(&r, &S, 40);
    assert_same(a, b, 4);
    /* only blocks before the edit: the first prompt and part of the answer */
    long got = metric(&P, PULLED) - pulled;
    assert_true(got <= first_prompt_tokens + 40);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* Params a client forged or guessed: a made-up lease (GONE), another
 * conversation's real params with or without its token ids (nothing shared:
 * no pull, or MISMATCH), a port nobody listens on (unreachable).  No foreign
 * KV is ever used: outputs equal the single node's. */
static void test_forged_params(void **state)
{
    (void)state;
    tp_proc P, D, S;
    node_start(&P, "p", k_pa);
    node_start(&D, "d", k_da);
    node_start(&S, "s", k_ref);
    conv other, c, r;
    conv_init(&other, 31, 80);
    json_decref(turn_pd(&other, &P, &D, 40, 1, 0)); /* a real retention to steal from */
    conv_init(&c, 32, 80);
    conv_init(&r, 32, 80);
    json_t *a = turn_pd(&c, &P, &D, 30, 1, 0), *b = turn_single(&r, &S, 30);
    assert_same(a, b, 1);
    for (int k = 0; k < 4; k++) {
        user_turn(&c, &r, 50 + (unsigned)k, 20);
        json_t *forged = json_deep_copy(k < 2 ? other.dparams : c.dparams);
        if (k == 1) json_object_del(forged, "remote_token_ids"); /* then the pin's hashes decide */
        if (k == 2)
            json_object_set_new(forged, "remote_lease",
                                json_string("0123456789abcdef0123456789abcdef"));
        if (k == 3) json_object_set_new(forged, "remote_port", json_integer(1));
        long pulled = metric(&P, PULLED);
        json_t *keep = c.dparams;
        c.dparams = forged;
        a = turn_pd(&c, &P, &D, 30, 1, 0);
        json_decref(keep);
        b = turn_single(&r, &S, 30);
        assert_same(a, b, 2 + k);
        assert_int_equal(metric(&P, PULLED), pulled); /* nothing foreign, nothing at all */
    }
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"mismatch\"}"), 1);
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"gone\"}"), 1);
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"unreachable\"}"), 1);
    conv_free(&other);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* The decode node dies between turns: the next turn recomputes and a new
 * decode node serves it; a retention that expired (TTL 1 s) is GONE and
 * recomputed.  Outputs equal the single node's. */
static void test_decode_dies_and_ttl(void **state)
{
    (void)state;
    const char *da_ttl[] = {
        "--role", "decode", "--bidirectional-kv-xfer", "--decoder-kv-blocks-ttl", "1", NULL};
    tp_proc P, D, D2, S;
    node_start(&P, "p", k_pa);
    node_start(&D, "d", k_da);
    node_start(&S, "s", k_ref);
    conv c, r;
    conv_init(&c, 41, 70);
    conv_init(&r, 41, 70);
    json_t *a = turn_pd(&c, &P, &D, 30, 1, 0), *b = turn_single(&r, &S, 30);
    assert_same(a, b, 1);
    tp_stop(&D, SIGKILL, 60);
    node_start(&D2, "d2", da_ttl);
    user_turn(&c, &r, 61, 20);
    a = turn_pd(&c, &P, &D2, 30, 1, 0);
    b = turn_single(&r, &S, 30);
    assert_same(a, b, 2);
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"unreachable\"}"), 1);
    /* D2's retention (TTL 1 s) expires: its sweep counts it (bounded wait) */
    const char *expired = "duplex_kv_lease_events_total{event=\"expired\"}";
    for (int i = 0; i < 1200 && metric(&D2, expired) < 1; i++) tp_sleep_ms(50);
    assert_int_equal(metric(&D2, expired), 1);
    user_turn(&c, &r, 62, 20);
    long pulled = metric(&P, PULLED);
    a = turn_pd(&c, &P, &D2, 30, 1, 0);
    b = turn_single(&r, &S, 30);
    assert_same(a, b, 3);
    assert_int_equal(metric(&P, PULLED), pulled);
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"gone\"}"), 1);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&P);
    stop_ok(&D2);
    stop_ok(&S);
}

/* A decode pool too small for every retained conversation: retained leases
 * are revoked least recently used first, no request fails or stalls, and
 * the outputs do not change. */
static void test_pool_pressure(void **state)
{
    (void)state;
    const char *da[] = {"--role", "decode", "--bidirectional-kv-xfer", "--kv-blocks", "48", NULL};
    tp_proc P, D, S;
    node_start(&P, "p", k_pa);
    node_start(&D, "d", da);
    node_start(&S, "s", k_ref);
    enum { N = 5 };
    conv c[N], r[N];
    for (int t = 1; t <= 2; t++)
        for (int i = 0; i < N; i++) {
            if (t == 1) {
                conv_init(&c[i], 70 + (unsigned)i, 60);
                conv_init(&r[i], 70 + (unsigned)i, 60);
            }
            json_t *a = turn_pd(&c[i], &P, &D, 24, 1, 0), *b = turn_single(&r[i], &S, 24);
            assert_same(a, b, t);
            user_turn(&c[i], &r[i], 80 + (unsigned)(t * N + i), 10);
        }
    assert_true(metric(&D, "duplex_kv_lease_events_total{event=\"revoked_lru\"}") > 0);
    assert_true(metric(&D, "duplex_kv_leases") < N);
    for (int i = 0; i < N; i++) {
        conv_free(&c[i]);
        conv_free(&r[i]);
    }
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* Streaming from the decode node: the params ride in the final chunk, and
 * the next turn pulls with them as with a non-streamed answer. */
static void test_streaming(void **state)
{
    (void)state;
    tp_proc P, D, S;
    node_start(&P, "p", k_pa);
    node_start(&D, "d", k_da);
    node_start(&S, "s", k_ref);
    conv c, r;
    conv_init(&c, 51, 70);
    conv_init(&r, 51, 70);
    for (int t = 1; t <= 3; t++) {
        long pulled = metric(&P, PULLED);
        json_t *a = turn_pd(&c, &P, &D, 30, 1, 1), *b = turn_single(&r, &S, 30);
        assert_same(a, b, t);
        assert_non_null(c.dparams);
        if (t >= 2) assert_true(metric(&P, PULLED) > pulled);
        user_turn(&c, &r, 90 + (unsigned)t, 20);
    }
    conv_free(&c);
    conv_free(&r);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* One node with prefix caching: every turn reuses the previous prompt and
 * the whole answer, although some answers do not come back as the same
 * tokens when tokenised again — the node remembers what it generated. */
static void test_token_faithful_single_node(void **state)
{
    (void)state;
    tp_proc S;
    node_start(&S, "s", NULL);
    conv r;
    conv_init(&r, 61, 50);
    for (int t = 1; t <= 6; t++) {
        long prev = r.prompt + r.gen;
        json_t *b = chat_body(r.msgs, 48);
        json_t *resp = post(&S, b, 200);
        json_t *ans = answer_of(resp);
        long cached = usage_of(resp, "cached_tokens");
        r.prompt = usage_of(resp, "prompt_tokens");
        r.gen = usage_of(resp, "completion_tokens");
        if (t >= 2 && cached < (prev - 1) / BS * BS)
            fail_msg("turn %d: %ld cached, the history had %ld", t, cached, prev);
        conv_add_answer(&r, ans);
        json_decref(ans);
        json_decref(b);
        json_decref(resp);
        user_turn(&r, NULL, 120 + (unsigned)t, 15);
    }
    assert_true(metric(&S, "duplex_history_replies_total{source=\"memory\"}") > 0);
    conv_free(&r);
    stop_ok(&S);
}

/* A decode node of another model (same layout, other weights): every pull
 * between it and the prefill node is refused at HELLO, counted, and the
 * tokens are computed; every request still succeeds. */
static void test_other_model_refused(void **state)
{
    (void)state;
    char other[160];
    snprintf(other, sizeof other, "%s/other.gguf", G.dir);
    synth_config sc = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 6};
    assert_int_equal(synth_write(&sc, other), 0);
    const char *xa[] = {"--role", "decode", "--bidirectional-kv-xfer", "--model", other, NULL};
    tp_proc P, X;
    node_start(&P, "p", k_pa);
    node_start(&X, "x", xa);
    conv c;
    conv_init(&c, 91, 80);
    G.model_name = "duplex-synth-qwen3-tiny-f32"; /* both files carry the preset's name */
    json_decref(turn_pd(&c, &P, &X, 16, 1, 0));
    assert_int_equal(metric(&X, "duplex_kv_fallbacks_total{reason=\"refused\"}"), 1);
    assert_int_equal(metric(&X, FIRST), 0); /* another model's first token is not sent */
    assert_int_equal(metric(&X, PULLED), 0);
    user_turn(&c, NULL, 92, 20);
    json_decref(turn_pd(&c, &P, &X, 16, 1, 0));
    assert_int_equal(metric(&P, "duplex_kv_fallbacks_total{reason=\"refused\"}"), 1);
    assert_int_equal(metric(&P, PULLED), 0);
    conv_free(&c);
    stop_ok(&P);
    stop_ok(&X);
}

/* A decode node that does not share the prefill node's KV secret, and one
 * whose --kv-peers do not list the prefill node's address: the first pull
 * fails at the handshake, the second is refused before any connection; each
 * is counted by its reason and the request completes by recompute, with
 * the single node's answer. */
static void test_pull_refused_recomputes(void **state)
{
    (void)state;
    char other[160];
    snprintf(other, sizeof other, "%s/other.secret", G.dir);
    assert_int_equal(kvport_secret_write_new(other), 0);
    const char *wrong[] = {"--role", "decode", "--kv-secret-file", other, NULL};
    const char *fenced[] = {"--role", "decode", "--kv-peers", "127.0.0.2,[::1]", NULL};
    const char *const *da[] = {wrong, fenced};
    const char *why[] = {"duplex_kv_fallbacks_total{reason=\"auth\"}",
                         "duplex_kv_fallbacks_total{reason=\"peer_not_allowed\"}"};
    tp_proc P, S;
    node_start(&P, "p", k_pa);
    node_start(&S, "s", k_ref);
    for (int i = 0; i < 2; i++) {
        tp_proc D;
        node_start(&D, "d", da[i]);
        conv c, r;
        conv_init(&c, 40 + (unsigned)i, 70);
        conv_init(&r, 40 + (unsigned)i, 70);
        assert_same(turn_pd(&c, &P, &D, 24, 0, 0), turn_single(&r, &S, 24), 1);
        assert_int_equal(metric(&D, why[i]), 1);
        assert_int_equal(metric(&D, PULLED), 0);
        assert_int_equal(metric(&D, COMPUTED), c.prompt);
        conv_free(&c);
        conv_free(&r);
        stop_ok(&D);
    }
    stop_ok(&P);
    stop_ok(&S);
}

static int setup(void **state)
{
    (void)state;
    return pdt_setup("pd");
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

/* The prefill node's first token rides in its params (first_token_ids,
 * first_token_model) and the decode node sends it at once: with seeded
 * sampling the whole answer still equals the single node's (the sampler's
 * generator skips the token's draw).  Params whose prompt or model differ
 * are not used; malformed ones are a 400 naming the field; max_tokens 1 on
 * the decode node answers with P's token alone. */
static void test_first_token(void **state)
{
    (void)state;
    tp_proc P, D, S;
    node_start(&P, "p", k_pa);
    node_start(&D, "d", k_da);
    node_start(&S, "s", k_ref);
    G.temperature = 0.9;
    G.seed = 11;
    conv c, r;
    conv_init(&c, 71, 60);
    conv_init(&r, 71, 60);
    for (int t = 1; t <= 3; t++) {
        long first = metric(&D, FIRST);
        json_t *a = turn_pd(&c, &P, &D, 24, 1, t == 2), *b = turn_single(&r, &S, 24);
        assert_same(a, b, t);
        assert_int_equal(metric(&D, FIRST), first + 1);
        user_turn(&c, &r, 170 + (unsigned)t, 15);
    }
    G.temperature = 0;
    G.seed = 0;
    /* P's answer for the next turn, then D with altered params */
    json_t *pb = chat_body(c.msgs, 1);
    json_object_set_new(pb, "kv_transfer_params", prefill_params(&c, 1));
    json_t *pr = post(&P, pb, 200);
    json_t *pp = json_object_get(pr, "kv_transfer_params");
    json_t *ids = json_object_get(pp, "first_token_ids");
    assert_int_equal(json_array_size(ids), 1);
    assert_true(json_is_string(json_object_get(pp, "first_token_model")));
    json_t *other = json_deep_copy(json_object_get(pp, "remote_token_ids")); /* last one changed */
    size_t last = json_array_size(other) - 1;
    json_array_set_new(other, last,
                       json_integer((json_integer_value(json_array_get(other, last)) + 1) % 200));
    struct {
        const char *field;
        json_t *value;
        long status;
        const char *blamed; /* the 400's param */
    } bad[] = {
        {"first_token_ids", json_pack("[i]", 1 << 30), 400, "first_token_ids"},
        {"first_token_ids", json_pack("[i,i,i,i,i,i,i,i,i]", 1, 2, 3, 4, 5, 6, 7, 8, 9), 400,
         "first_token_ids"},
        {"first_token_ids", json_string("7"), 400, "first_token_ids"},
        {"first_token_model", json_string("xyz"), 400, "first_token_model"},
        {"first_token_model", json_null(), 400, "first_token_ids"}, /* ids without the model */
        {"remote_token_ids", json_null(), 400, "first_token_ids"},  /* ids without the prompt */
        {"first_token_model", json_string("0123456789abcdef0123456789abcdef"), 200, NULL},
        {"remote_token_ids", other, 200, NULL}, /* another prompt */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *p = json_deep_copy(pp);
        json_object_set_new(p, bad[i].field, bad[i].value);
        json_t *db = chat_body(c.msgs, 8);
        json_object_set_new(db, "kv_transfer_params", p);
        long first = metric(&D, FIRST);
        json_t *resp = post(&D, db, bad[i].status);
        if (bad[i].status == 400) {
            const char *param =
                json_string_value(json_object_get(json_object_get(resp, "error"), "param"));
            if (!param || !strstr(param, bad[i].blamed))
                fail_msg("case %zu: 400 names '%s', not %s", i, param ? param : "(none)",
                         bad[i].blamed);
        }
        assert_int_equal(metric(&D, FIRST), first); /* not used */
        json_decref(db);
        json_decref(resp);
    }
    /* logprobs asked: the decode node computes the first token itself (its
     * probabilities were the prefill node's), and reports every token's */
    {
        json_t *db = chat_body(c.msgs, 4);
        json_object_set(db, "kv_transfer_params", pp);
        json_object_set_new(db, "logprobs", json_true());
        long first = metric(&D, FIRST);
        json_t *dr = post(&D, db, 200);
        json_t *lc = json_object_get(
            json_object_get(json_array_get(json_object_get(dr, "choices"), 0), "logprobs"),
            "content");
        assert_int_equal(json_array_size(lc), 4);
        assert_int_equal(metric(&D, FIRST), first);
        json_decref(db);
        json_decref(dr);
    }
    /* max_tokens 1: P's token is the whole answer */
    json_t *db = chat_body(c.msgs, 1);
    json_object_set(db, "kv_transfer_params", pp);
    json_t *dr = post(&D, db, 200), *one = chat_body(c.msgs, 1);
    json_t *sr = post(&S, one, 200);
    json_t *a = answer_of(dr), *b = answer_of(sr);
    assert_same(a, b, 4);
    assert_int_equal(usage_of(dr, "completion_tokens"), 1);
    json_decref(db);
    json_decref(dr);
    json_decref(one);
    json_decref(sr);
    json_decref(pb);
    json_decref(pr);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bidirectional_exact),
        cmocka_unit_test(test_bidirectional_q4_0),
        cmocka_unit_test(test_bidirectional_moe),
        cmocka_unit_test(test_unidirectional),
        cmocka_unit_test(test_threshold),
        cmocka_unit_test(test_reuse_by_cost),
        cmocka_unit_test(test_edited_history),
        cmocka_unit_test(test_forged_params),
        cmocka_unit_test(test_decode_dies_and_ttl),
        cmocka_unit_test(test_pool_pressure),
        cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_token_faithful_single_node),
        cmocka_unit_test(test_other_model_refused),
        cmocka_unit_test(test_first_token),
        cmocka_unit_test(test_pull_refused_recomputes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
