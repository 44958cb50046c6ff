/* pd_test: what the P/D integration tests share — nodes as processes on
 * loopback with the tiny test model and one cluster KV secret, OpenAI requests, conversations that
 * grow turn by turn, and the one-way/bidirectional protocol steps a router
 * performs (so node tests can drive P and D directly).  Static functions:
 * each test binary is one translation unit.  Include after cmocka.h. */
#ifndef PD_TEST_H
#define PD_TEST_H

#include <jansson.h>

#include "../test_client.h"
#include "../test_proc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "model/synth.h"
#include "xfer/kvport_auth.h"

static struct {
    const char *bin;
    char dir[64], model[128], secret[128];
    const char *model_name;
    int n_logs;
    double temperature; /* every chat body's (0: greedy) */
    long seed;          /* > 0: sent as seed */
    int ignore_eos;     /* every chat body asks for ignore_eos (answers of max_tokens) */
} G;

#define BS 16 /* the nodes' block size */

/* The costs every test node decides with (--fixed-costs) unless its test
 * gives its own: a token dearer to compute than any prompt's KV is to
 * pull, so whatever a node can reuse it pulls — the P/D tests' counts
 * never depend on the machine's speed, and the estimates' rule (not the
 * fixed threshold) makes the decision.  The router's choice is the tests'
 * own (k_via_p, or --local-prefill-max-tokens). */
#define PD_TEST_COSTS "{\"prefill_tok_s\":0.001,\"pull\":{\"setup_s\":1e-5,\"byte_s\":1e-12}}"

/* ---- processes ------------------------------------------------------------ */

/* `duplex serve` on a free port with the test model and the cluster's KV
 * secret, plus extra flags (later ones win: a test may give another
 * --kv-secret-file). */
static inline void node_start(tp_proc *p, const char *tag, const char *const *extra)
{
    const char *argv[48] = {"serve",      "--model",          G.model,  "--port",
                            "0",          "--threads",        "1",      "--kv-cache-mb",
                            "16",         "--kv-secret-file", G.secret, "--fixed-costs",
                            PD_TEST_COSTS};
    int n = 13;
    for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    char log[160];
    snprintf(log, sizeof log, "%s/%s-%d.log", G.dir, tag, G.n_logs++);
    tp_start(p, G.bin, log, argv, "duplex serve:");
}

/* SIGTERM: a graceful drain and exit 0 (under ASan also: no leak, no
 * error); a node is checked at rest first (tp_at_rest). */
static inline void stop_ok(tp_proc *p)
{
    if (tp_stop_clean_in(p, 60)) fail_msg("%s did not exit cleanly", p->log);
}

/* The last request line ("POST /v1/chat/completions ...") of p's log in
 * line (NUL-terminated); fails the test when there is none. */
static inline void last_post(const tp_proc *p, char *line, size_t cap)
{
    static char buf[1 << 20];
    size_t n = tp_read_log(p, buf, sizeof buf);
    const char *last = NULL;
    for (const char *k = buf; (k = strstr(k, "POST /v1/chat/completions")); k++) last = k;
    if (!last) fail_msg("%s: no request line (%zu bytes of log)", p->log, n);
    snprintf(line, cap, "%.*s", (int)strcspn(last, "\n"), last);
}

static inline long metric(const tp_proc *p, const char *name)
{
    return tc_metric(p->http, name);
}

#define PULLED   "duplex_kv_prompt_tokens_total{source=\"pulled\"}"
#define LOCAL    "duplex_kv_prompt_tokens_total{source=\"local\"}"
#define COMPUTED "duplex_kv_prompt_tokens_total{source=\"computed\"}"

/* ---- the router ------------------------------------------------------------- */

static inline void url_list(char *out, size_t cap, tp_proc *const *n, int k)
{
    size_t off = 0;
    out[0] = 0;
    for (int i = 0; i < k; i++)
        off += (size_t)snprintf(out + off, cap - off, "%shttp://127.0.0.1:%d", i ? "," : "",
                                n[i]->http);
}

/* The flags the P/D tests give their processes: bidirectional prefill and
 * decode nodes, the single-node oracle (no prefix cache: every answer
 * computed afresh), and a router that sends every prompt through a prefill
 * node.  (Unused in some files.) */
#define PD_UNUSED __attribute__((unused))
static const char *const k_pa[] PD_UNUSED = {"--role", "prefill", "--bidirectional-kv-xfer",
                                             "--no-enable-prefix-caching", NULL};
static const char *const k_da[] PD_UNUSED = {"--role", "decode", "--bidirectional-kv-xfer", NULL};
static const char *const k_ref[] PD_UNUSED = {"--no-enable-prefix-caching", NULL};
static const char *const k_via_p[] PD_UNUSED = {"--local-prefill-max-tokens", "0", NULL};

/* Waits (up to 30 s) until the router's /health says 200: its nodes passed
 * its checks. */
static inline void router_wait_healthy(const tp_proc *r)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    for (int i = 0; i < 600 && tc_http(r->http, "GET", "/health", NULL, &b, 10) != 200; i++)
        tp_sleep_ms(50);
    assert_int_equal(tc_http(r->http, "GET", "/health", NULL, &b, 10), 200);
    dx_buf_free(&b);
}

/* A router over P[0..np) and D[0..nd), healthy before it returns. */
static inline void router_start(tp_proc *r, tp_proc *const *P, int np, tp_proc *const *D, int nd,
                                const char *const *extra)
{
    static char pl[512], dl[512];
    url_list(pl, sizeof pl, P, np);
    url_list(dl, sizeof dl, D, nd);
    const char *argv[32] = {"router", "--decode",    dl,     "--port", "0", "--health-interval-ms",
                            "100",    "--tokenizer", G.model};
    int n = 9;
    if (np) {
        argv[n++] = "--prefill";
        argv[n++] = pl;
    }
    for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    char log[160];
    snprintf(log, sizeof log, "%s/router-%d.log", G.dir, G.n_logs++);
    tp_start(r, G.bin, log, argv, "duplex router:");
    router_wait_healthy(r);
}

/* One prefill node P, decode nodes D0 and (unless NULL) D1, with the flags
 * above; the oracle S; and a router over them that always prefills on P. */
static inline void cluster_start(tp_proc *P, tp_proc *D0, tp_proc *D1, tp_proc *S, tp_proc *R)
{
    node_start(P, "p", k_pa);
    node_start(D0, D1 ? "d0" : "d", k_da);
    if (D1) node_start(D1, "d1", k_da);
    node_start(S, "s", k_ref);
    tp_proc *pp[] = {P}, *dd[] = {D0, D1};
    router_start(R, pp, 1, dd, D1 ? 2 : 1, k_via_p);
}

/* ---- requests --------------------------------------------------------------- */

static inline json_t *post(const tp_proc *p, json_t *body, long want_status)
{
    char *s = json_dumps(body, JSON_COMPACT);
    dx_buf out;
    dx_buf_init(&out, 0);
    long st = tc_http(p->http, "POST", "/v1/chat/completions", s, &out, 120);
    if (st != want_status) fail_msg("status %ld, wanted %ld: %s", st, want_status, out.data);
    json_t *v = tc_json(&out);
    free(s);
    dx_buf_free(&out);
    return v;
}

/* POST to a router or node with extra headers ("Name: value", NULL-ended). */
static inline json_t *post_h(int port, json_t *body, const char *const *headers, long want_status)
{
    char *s = json_dumps(body, JSON_COMPACT);
    dx_buf out;
    dx_buf_init(&out, 0);
    long st = tc_http_h(port, "POST", "/v1/chat/completions", s, headers, &out, 120);
    if (st != want_status) fail_msg("status %ld, wanted %ld: %s", st, want_status, out.data);
    json_t *v = tc_json(&out);
    free(s);
    dx_buf_free(&out);
    return v;
}

/* A streamed answer: its text (malloc'd) and the final chunk's params
 * (NULL when none), checking that they ride in the chunk with
 * finish_reason, before [DONE]. */
static inline json_t *post_stream(const tp_proc *p, json_t *body, json_t **params)
{
    char *s = json_dumps(body, JSON_COMPACT);
    dx_buf out, text;
    dx_buf_init(&out, 0);
    dx_buf_init(&text, 0);
    assert_int_equal(tc_http(p->http, "POST", "/v1/chat/completions", s, &out, 120), 200);
    char finish[32];
    int usage;
    tc_parse_sse(&out, 1, &text, finish, &usage);
    *params = NULL;
    const char *k = strstr(out.data, "\"kv_transfer_params\"");
    if (k) {
        const char *ev = k;
        while (ev > out.data && strncmp(ev, "data: ", 6)) ev--;
        const char *end = strstr(ev, "\n\n");
        json_error_t je;
        json_t *chunk = json_loadb(ev + 6, (size_t)(end - ev - 6), 0, &je);
        assert_non_null(chunk);
        json_t *fr =
            json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "finish_reason");
        assert_true(json_is_string(fr)); /* the final chunk */
        *params = json_incref(json_object_get(chunk, "kv_transfer_params"));
        json_decref(chunk);
        assert_null(strstr(end, "kv_transfer_params")); /* once */
    }
    json_t *r = json_stringn_nocheck(text.data, text.len);
    free(s);
    dx_buf_free(&out);
    dx_buf_free(&text);
    return r;
}

static inline json_t *chat_body(json_t *msgs, int max_tokens)
{
    json_t *b = json_pack("{s:s, s:O, s:i, s:f}", "model", G.model_name, "messages", msgs,
                          "max_tokens", max_tokens, "temperature", G.temperature);
    if (G.seed > 0) json_object_set_new(b, "seed", json_integer(G.seed));
    if (G.ignore_eos) json_object_set_new(b, "ignore_eos", json_true());
    return b;
}

/* The answer as a JSON string (a model can emit NUL: keep the length). */
static inline json_t *answer_of(json_t *resp)
{
    json_t *c = json_object_get(
        json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "message"), "content");
    assert_true(json_is_string(c));
    return json_incref(c);
}

static inline long usage_of(json_t *resp, const char *field)
{
    json_t *u = json_object_get(resp, "usage");
    if (!strcmp(field, "cached_tokens")) u = json_object_get(u, "prompt_tokens_details");
    return (long)json_integer_value(json_object_get(u, field));
}

/* ---- conversations -------------------------------------------------------------- */

typedef struct {
    json_t *msgs;     /* as the client keeps it */
    json_t *dparams;  /* the decode node's last params (the router's state) */
    long prompt, gen; /* the last turn's prompt and answer tokens */
    long p_prompt;    /* the prompt as the prefill node tokenised it */
    long cached;      /* the last turn's cached prompt tokens (usage) */
} conv;

static const char *const k_words[] = {
    "the",     "cache",   "moves",   "between", "nodes",   "and",  "every",   "turn",
    "keeps",   "its",     "history", "while",   "agents",  "call", "tools",   "with",
    "long",    "outputs", "that",    "grow",    "quickly", "so",   "prefill", "work",
    "matters", "more",    "than",    "decode",  "for",     "them"};

/* n words of deterministic text (malloc'd). */
static inline char *words(unsigned seed, int n)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        dx_buf_printf(&b, "%s%s", i ? " " : "", k_words[(seed >> 16) % DX_ARRAY_LEN(k_words)]);
    }
    char *s = strdup(b.data ? b.data : "");
    dx_buf_free(&b);
    return s;
}

static inline void conv_init(conv *c, unsigned seed, int first_words)
{
    memset(c, 0, sizeof *c);
    char *sys = words(seed, 12), *user = words(seed + 1, first_words);
    c->msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "system", "content", sys, "role", "user",
                        "content", user);
    free(sys);
    free(user);
}

static inline void conv_free(conv *c)
{
    json_decref(c->msgs);
    json_decref(c->dparams);
}

static inline void conv_add(conv *c, const char *role, const char *text)
{
    json_array_append_new(c->msgs, json_pack("{s:s,s:s}", "role", role, "content", text));
}

static inline void conv_add_answer(conv *c, json_t *text)
{
    json_array_append_new(c->msgs, json_pack("{s:s,s:O}", "role", "assistant", "content", text));
}

/* Params for the prefill node: the decode node's, flipped to "pull and hold"
 * (bidirectional), or vLLM's one-way shape with every other field null. */
static inline json_t *prefill_params(const conv *c, int bidi)
{
    if (bidi && c->dparams) {
        json_t *p = json_deep_copy(c->dparams);
        json_object_set_new(p, "do_remote_decode", json_true());
        json_object_set_new(p, "do_remote_prefill", json_true());
        return p;
    }
    return json_pack("{s:b,s:b,s:n,s:n,s:n,s:n,s:n,s:n}", "do_remote_decode", 1,
                     "do_remote_prefill", 0, "remote_engine_id", "remote_request_id", "remote_host",
                     "remote_port", "remote_block_ids", "remote_num_tokens");
}

/* One turn through P and D; returns the answer (malloc'd), appended to the
 * conversation. */
static inline json_t *turn_pd(conv *c, const tp_proc *P, const tp_proc *D, int max_tokens, int bidi,
                              int stream)
{
    json_t *pb = chat_body(c->msgs, 1);
    json_object_set_new(pb, "stream", json_false());
    json_object_set_new(pb, "kv_transfer_params", prefill_params(c, bidi));
    json_t *pr = post(P, pb, 200);
    json_t *pp = json_object_get(pr, "kv_transfer_params");
    c->p_prompt = usage_of(pr, "prompt_tokens");
    assert_true(json_is_object(pp));
    assert_true(json_is_true(json_object_get(pp, "do_remote_prefill")));
    json_t *db = chat_body(c->msgs, max_tokens);
    json_object_set(db, "kv_transfer_params", pp);
    json_t *ans, *dp = NULL;
    if (stream) {
        json_object_set_new(db, "stream", json_true());
        ans = post_stream(D, db, &dp);
    } else {
        json_t *dr = post(D, db, 200);
        ans = answer_of(dr);
        dp = json_incref(json_object_get(dr, "kv_transfer_params"));
        c->prompt = usage_of(dr, "prompt_tokens");
        c->gen = usage_of(dr, "completion_tokens");
        json_decref(dr);
    }
    json_decref(c->dparams);
    c->dparams = dp;
    conv_add_answer(c, ans);
    json_decref(pb);
    json_decref(pr);
    json_decref(db);
    return ans;
}

/* One turn at the server on 127.0.0.1:port (a node or a router), with
 * extra headers ("Name: value", NULL-ended, or NULL); the answer, appended
 * to the conversation. */
static inline json_t *turn_h(conv *c, int port, const char *const *headers, int max_tokens)
{
    json_t *b = chat_body(c->msgs, max_tokens);
    json_t *r = post_h(port, b, headers, 200);
    assert_null(json_object_get(r, "kv_transfer_params")); /* none asked for */
    json_t *ans = answer_of(r);
    c->prompt = usage_of(r, "prompt_tokens");
    c->gen = usage_of(r, "completion_tokens");
    c->cached = usage_of(r, "cached_tokens");
    conv_add_answer(c, ans);
    json_decref(b);
    json_decref(r);
    return ans;
}

/* The same turn on one node. */
static inline json_t *turn_single(conv *c, const tp_proc *S, int max_tokens)
{
    return turn_h(c, S->http, NULL, max_tokens);
}

/* One turn through the router; the answer is appended.  The client never
 * sees kv_transfer_params; its usage is the cluster's. */
static inline json_t *turn_router(conv *c, const tp_proc *R, int max_tokens,
                                  const char *const *headers)
{
    json_t *ans = turn_h(c, R->http, headers, max_tokens);
    c->p_prompt = c->cached; /* reused here: the cluster's cached tokens */
    return ans;
}

/* The next user message, to both copies of a conversation. */
static inline void user_turn(conv *a, conv *b, unsigned seed, int n_words)
{
    char *u = words(seed, n_words);
    conv_add(a, "user", u);
    if (b) conv_add(b, "user", u);
    free(u);
}

/* Byte-for-byte equal answers; both references are dropped. */
static inline void assert_same(json_t *a, json_t *b, int turn)
{
    if (!json_equal(a, b))
        fail_msg("turn %d differs:\n  P/D:    %s\n  single: %s", turn, json_string_value(a),
                 json_string_value(b));
    json_decref(a);
    json_decref(b);
}

/* A directory with the tiny test model, named for the test binary. */
static inline int pdt_setup(const char *name)
{
    G.bin = getenv("DUPLEX_BIN");
    if (!G.bin) G.bin = "build/release/duplex";
    snprintf(G.dir, sizeof G.dir, "/tmp/dx_itest_%s_XXXXXX", name);
    if (!mkdtemp(G.dir)) return -1;
    snprintf(G.model, sizeof G.model, "%s/tiny.gguf", G.dir);
    synth_config c = {.arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 5};
    if (synth_write(&c, G.model)) return -1;
    snprintf(G.secret, sizeof G.secret, "%s/kv.secret", G.dir);
    if (kvport_secret_write_new(G.secret)) return -1;
    G.model_name = "duplex-synth-qwen3-tiny-f32";
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return 0;
}

static inline int pdt_teardown(void)
{
    char cmd[128];
    if (!getenv("DX_KEEP_LOGS")) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", G.dir);
        if (system(cmd)) return -1;
    }
    curl_global_cleanup();
    return 0;
}

#endif
