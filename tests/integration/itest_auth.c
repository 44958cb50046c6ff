/* itest_auth: API keys, the internal key and tenants with real processes on
 * loopback — 401s in OpenAI's shape (missing, wrong, malformed), keys from
 * flags and files accepted, /health and /metrics open; kv_transfer_params
 * ignored and counted without the internal key, honoured with it (in its
 * header or as a proxy's Bearer) and from --trust-kv-params-from ranges;
 * the loopback rule and --insecure-no-auth; bad key files and ranges
 * refused naming file, line or value; and `duplex up` with two API keys:
 * identical histories under the two keys never reuse each other's KV while
 * each key's own next turn does, every answer byte-identical to one node's. */
/* duplex-test: alone */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <sys/stat.h>

#include "pd_test.h"

#define IKEY "3f1d9c0a5b7e4d2f8a6c1e0b9d7f5a3c"

static char g_ik[128];        /* the internal key's file */
static char g_keys_file[128]; /* an API key file: sk-file-1, sk-file-2 */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A raw request's whole answer (status line, headers, body). */
static void raw(int port, const char *method, const char *path, const char *auth_line, dx_buf *out)
{
    char req[512];
    int n =
        snprintf(req, sizeof req,
                 "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s%sContent-Length: 0\r\n\r\n",
                 method, path, auth_line ? auth_line : "", auth_line ? "\r\n" : "");
    tc_raw_exchange(port, req, (size_t)n, out, 20000);
}

/* A 401 exactly as OpenAI shapes it: the type, the code, a message with
 * the phrase, no param, and the scheme to use. */
static void assert_401(int port, const char *method, const char *path, const char *auth_line,
                       const char *phrase)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    raw(port, method, path, auth_line, &b);
    if (strncmp(b.data, "HTTP/1.1 401 Unauthorized\r\n", 27) != 0)
        fail_msg("%s %s (%s): not a 401: %.200s", method, path, auth_line ? auth_line : "-",
                 b.data);
    assert_non_null(strcasestr(b.data, "\r\nWWW-Authenticate: Bearer\r\n"));
    const char *body = strstr(b.data, "\r\n\r\n");
    assert_non_null(body);
    json_error_t je;
    json_t *v = json_loads(body + 4, 0, &je), *e = json_object_get(v, "error");
    assert_non_null(e);
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "invalid_api_key");
    assert_true(json_is_null(json_object_get(e, "param")));
    const char *m = json_string_value(json_object_get(e, "message"));
    if (!m || !strstr(m, phrase)) fail_msg("401 message '%s' lacks '%s'", m ? m : "", phrase);
    /* nothing about which keys exist */
    assert_null(strstr(body, "sk-"));
    json_decref(v);
    dx_buf_free(&b);
}

static long status_of(int port, const char *method, const char *path, const char *body,
                      const char *auth_line)
{
    const char *h[] = {auth_line, NULL};
    dx_buf b;
    dx_buf_init(&b, 0);
    long st = tc_http_h(port, method, path, body, auth_line ? h : NULL, &b, 60);
    dx_buf_free(&b);
    return st;
}

static void assert_log_has(const tp_proc *p, const char *phrase)
{
    static char buf[1 << 16];
    tp_read_log(p, buf, sizeof buf);
    if (!strstr(buf, phrase)) fail_msg("%s lacks '%s':\n%s", p->log, phrase, buf);
}

/* The 401 shapes on any server with keys sk-flag and sk-file-1/2. */
static void check_keys(int port)
{
    static const char *const chat = "/v1/chat/completions";
    assert_401(port, "POST", chat, NULL, "missing API key");
    assert_401(port, "POST", chat, "Authorization: Bearer sk-wrong", "invalid API key");
    assert_401(port, "POST", chat, "Authorization: Bearer sk-flag2", "invalid API key");
    assert_401(port, "POST", chat, "Authorization: Basic c2stZmxhZw==", "malformed");
    assert_401(port, "POST", chat, "Authorization: Bearer", "malformed");
    assert_401(port, "POST", chat, "Authorization: Bearer sk-flag sk-flag", "malformed");
    assert_401(port, "GET", "/v1/models", NULL, "missing API key");
    assert_401(port, "GET", "/no/such/route", NULL, "missing API key"); /* says nothing */
    /* open: health checks and scrapes */
    assert_int_equal(status_of(port, "GET", "/health", NULL, NULL), 200);
    assert_int_equal(status_of(port, "GET", "/metrics", NULL, NULL), 200);
    /* keys from the flag and from the file */
    assert_int_equal(status_of(port, "GET", "/v1/models", NULL, "Authorization: Bearer sk-flag"),
                     200);
    assert_int_equal(status_of(port, "GET", "/v1/models", NULL, "Authorization: bearer sk-file-2"),
                     200);
    assert_int_equal(
        status_of(port, "GET", "/no/such/route", NULL, "Authorization: Bearer sk-file-1"), 404);
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
             "\"hi\"}]}",
             G.model_name);
    assert_int_equal(status_of(port, "POST", chat, body, "Authorization: Bearer sk-file-1"), 200);
}

/* ---- tests ---------------------------------------------------------------------- */

static void test_node_api_keys(void **state)
{
    (void)state;
    const char *a[] = {"--api-key", "sk-flag", "--api-key-file", g_keys_file, NULL};
    tp_proc N;
    node_start(&N, "keys", a);
    assert_log_has(&N, "auth=api-keys(3)");
    check_keys(N.http);
    assert_401(N.http, "POST", "/tokenize", NULL, "missing API key");
    assert_true(tc_metric(N.http, "duplex_http_requests_total{route=\"/v1/chat/completions\","
                                  "status=\"401\"}") >= 6);
    /* the official openai package sees OpenAI's AuthenticationError */
    if (access("tests/integration/node/node_modules/openai", F_OK) != 0)
        fail_msg("openai npm package not installed (scripts/test.sh runs npm ci)");
    char cmd[300], out[8192];
    snprintf(cmd, sizeof cmd,
             "node tests/integration/node/openai_auth.mjs http://127.0.0.1:%d/v1 sk-file-2 2>&1",
             N.http);
    if (tp_capture(cmd, out, sizeof out) != 0) fail_msg("openai client:\n%s", out);
    stop_ok(&N);
    /* no keys: open, and the start-up line says it serves loopback only */
    tp_proc O;
    node_start(&O, "open", NULL);
    assert_log_has(&O, "auth=none (loopback only) kv_params_from=loopback");
    assert_int_equal(status_of(O.http, "GET", "/v1/models", NULL, NULL), 200);
    stop_ok(&O);
}

/* A prefill request asking the node to hold the prompt's KV; the answer. */
static json_t *prefill_req(int port, const char *const *headers, long want)
{
    conv c;
    conv_init(&c, 7, 60);
    json_t *b = chat_body(c.msgs, 1);
    json_object_set_new(b, "kv_transfer_params", prefill_params(&c, 1));
    json_t *r = post_h(port, b, headers, want);
    json_decref(b);
    conv_free(&c);
    return r;
}

#define IGNORED "duplex_kv_params_ignored_total{reason=\"untrusted\"}"

/* The internal key: without it a node ignores (and counts) the params of
 * both steps — nothing held, nothing pulled, the answer still right; with
 * it, in X-Duplex-Internal-Key or as a proxy's Bearer, the flow works; a
 * wrong one is a 401. */
static void test_internal_key(void **state)
{
    (void)state;
    const char *pa[] = {"--role", "prefill", "--bidirectional-kv-xfer", "--internal-key-file",
                        g_ik,     NULL};
    const char *da[] = {"--role", "decode", "--bidirectional-kv-xfer", "--internal-key-file",
                        g_ik,     NULL};
    const char *const ref[] = {"--no-enable-prefix-caching", NULL};
    tp_proc P, D, S;
    node_start(&P, "p", pa);
    node_start(&D, "d", da);
    node_start(&S, "s", ref);
    assert_log_has(&P, "kv_params_from=internal-key");
    const char *h_ok[] = {"X-Duplex-Internal-Key: " IKEY, NULL};
    const char *h_proxy[] = {"Authorization: Bearer " IKEY, NULL};
    const char *h_bad[] = {"X-Duplex-Internal-Key: " IKEY "0", NULL};
    /* with the key: P holds and answers params; D pulls the prompt */
    conv c, r;
    conv_init(&c, 11, 80);
    conv_init(&r, 11, 80);
    json_t *pb = chat_body(c.msgs, 1);
    json_object_set_new(pb, "kv_transfer_params", prefill_params(&c, 1));
    json_t *pr = post_h(P.http, pb, h_ok, 200);
    json_t *pp = json_object_get(pr, "kv_transfer_params");
    assert_true(json_is_object(pp));
    json_t *db = chat_body(c.msgs, 24);
    json_object_set(db, "kv_transfer_params", pp);
    long pulled = metric(&D, PULLED);
    json_t *dr = post_h(D.http, db, h_ok, 200);
    assert_true(metric(&D, PULLED) > pulled);
    json_t *want = turn_single(&r, &S, 24);
    assert_same(answer_of(dr), json_incref(want), 1);
    json_decref(dr);
    /* without it: the same params (replayed, naming P's KV) are ignored,
     * counted, and the answer is computed — identical */
    long ign_d = metric(&D, IGNORED);
    pulled = metric(&D, PULLED);
    dr = post_h(D.http, db, NULL, 200);
    assert_int_equal(metric(&D, IGNORED), ign_d + 1);
    assert_int_equal(metric(&D, PULLED), pulled);
    assert_null(json_object_get(dr, "kv_transfer_params")); /* nothing retained for a stranger */
    assert_same(answer_of(dr), want, 1);
    json_decref(dr);
    long ign_p = metric(&P, IGNORED), leases = metric(&P, "duplex_kv_leases");
    json_t *x = post_h(P.http, pb, NULL, 200);
    assert_null(json_object_get(x, "kv_transfer_params"));
    assert_int_equal(metric(&P, IGNORED), ign_p + 1);
    assert_int_equal(metric(&P, "duplex_kv_leases"), leases);
    json_decref(x);
    /* a proxy that knows nothing of duplex: the key as its Bearer */
    x = post_h(P.http, pb, h_proxy, 200);
    assert_true(json_is_object(json_object_get(x, "kv_transfer_params")));
    json_decref(x);
    /* a wrong key is refused outright */
    x = post_h(P.http, pb, h_bad, 401);
    json_decref(x);
    assert_401(P.http, "GET", "/v1/models", "X-Duplex-Internal-Key: nope", "invalid internal key");
    /* and one sent to a node that has none (a misconfigured router) */
    x = post_h(S.http, pb, h_ok, 401);
    json_decref(x);
    json_decref(pb);
    json_decref(pr);
    json_decref(db);
    conv_free(&c);
    conv_free(&r);
    stop_ok(&P);
    stop_ok(&D);
    stop_ok(&S);
}

/* --trust-kv-params-from: loopback counts only when a range names it. */
static void test_trust_ranges(void **state)
{
    (void)state;
    const char *elsewhere[] = {"--role", "prefill", "--trust-kv-params-from", "10.0.0.0/8", NULL};
    const char *here[] = {"--role",
                          "prefill",
                          "--trust-kv-params-from",
                          "10.0.0.0/8",
                          "--trust-kv-params-from",
                          "127.0.0.0/8",
                          "--internal-key-file",
                          g_ik,
                          NULL};
    tp_proc A, B;
    node_start(&A, "trust-a", elsewhere);
    node_start(&B, "trust-b", here);
    assert_log_has(&A, "kv_params_from=10.0.0.0/8");
    assert_log_has(&B, "kv_params_from=internal-key,10.0.0.0/8,127.0.0.0/8");
    json_t *r = prefill_req(A.http, NULL, 200);
    assert_null(json_object_get(r, "kv_transfer_params"));
    assert_int_equal(metric(&A, IGNORED), 1);
    json_decref(r);
    r = prefill_req(B.http, NULL, 200);
    assert_true(json_is_object(json_object_get(r, "kv_transfer_params")));
    assert_int_equal(metric(&B, IGNORED), 0);
    json_decref(r);
    stop_ok(&A);
    stop_ok(&B);
}

/* Bad flags and files: exit 2, naming the value, the file and the line. */
static void test_bad_keys_and_ranges(void **state)
{
    (void)state;
    char args[512], bad[160], empty[160];
    snprintf(bad, sizeof bad, "%s/bad-keys", G.dir);
    write_file(bad, "# keys\nsk-good\nsk bad\n");
    snprintf(empty, sizeof empty, "%s/empty-keys", G.dir);
    write_file(empty, "# nothing\n\n");
    const char *m = G.model;
    snprintf(args, sizeof args, "--model %s --api-key-file %s", m, bad);
    tp_expect(G.bin, "serve", 2, "bad-keys: line 3: white space inside a key", args);
    snprintf(args, sizeof args, "--model %s --api-key-file %s", m, empty);
    tp_expect(G.bin, "serve", 2, "empty-keys: no key in the file", args);
    snprintf(args, sizeof args, "--model %s --api-key-file %s/none", m, G.dir);
    tp_expect(G.bin, "serve", 1, "none: No such file or directory", args);
    snprintf(args, sizeof args, "--model %s --internal-key-file %s", m, g_keys_file);
    tp_expect(G.bin, "serve", 2, "api-keys: line 2: the key has 9 characters; at least 16", args);
    snprintf(bad, sizeof bad, "%s/two.key", G.dir);
    write_file(bad, "0123456789abcdef0123\nfedcba9876543210fedc\n");
    snprintf(args, sizeof args, "--model %s --internal-key-file %s", m, bad);
    tp_expect(G.bin, "serve", 2, "two.key: line 2: a second key (this file holds exactly one)",
              args);
    snprintf(bad, sizeof bad, "%s/bad-keys", G.dir);
    snprintf(args, sizeof args, "--model %s --trust-kv-params-from 10.0.0.1/8", m);
    tp_expect(G.bin, "serve", 2,
              "--trust-kv-params-from: '10.0.0.1/8': bits are set past the /8 prefix (the range "
              "is 10.0.0.0/8)",
              args);
    snprintf(args, sizeof args, "--model %s --trust-kv-params-from 10.0.0.0/33", m);
    tp_expect(G.bin, "serve", 2,
              "'10.0.0.0/33': the prefix length after '/' must be a number 0..32", args);
    snprintf(args, sizeof args, "--model %s --trust-kv-params-from example.com", m);
    tp_expect(G.bin, "serve", 2, "'example.com' is not an IPv4 or IPv6 address", args);
    snprintf(args, sizeof args, "--decode http://127.0.0.1:9 --api-key-file %s", bad);
    tp_expect(G.bin, "router", 2, "bad-keys: line 3: white space inside a key", args);
    tp_expect(G.bin, "router", 2, "--api-key: an empty key",
              "--decode http://127.0.0.1:9 --api-key ''");
    snprintf(args, sizeof args, "--model %s --api-key-file %s --port 0", m, bad);
    tp_expect(G.bin, "up", 2, "bad-keys: line 3: white space inside a key", args);
}

/* Without API keys a server listens on loopback only; --insecure-no-auth
 * lifts that and says so.  (Where it does bind a non-loopback address it
 * does so inside a network namespace of its own.) */
static void test_loopback_rule(void **state)
{
    (void)state;
    char args[512];
    snprintf(args, sizeof args, "--model %s --host 0.0.0.0 --port 0", G.model);
    tp_expect(G.bin, "serve", 2,
              "--host 0.0.0.0 is not a loopback address, and no API key is set: anyone who can "
              "reach it could use this server.  Give --api-key KEY or --api-key-file FILE, or "
              "--insecure-no-auth to serve without keys anyway",
              args);
    tp_expect(G.bin, "router", 2, "--host :: is not a loopback address",
              "--decode http://127.0.0.1:9 --host :: --port 0");
    if (geteuid() != 0 || access("/usr/sbin/ip", X_OK) != 0) {
        skip(); /* the rest needs a network namespace of its own */
        return;
    }
    char ns[32], cmd[600];
    snprintf(ns, sizeof ns, "dxauth%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "ip netns add %s && ip netns exec %s ip link set lo up", ns, ns);
    assert_int_equal(system(cmd), 0);
    static const char *const how[][2] = {{"--insecure-no-auth", "auth=none (--insecure-no-auth)"},
                                         {"--api-key=sk-x", "auth=api-keys(1)"}};
    for (int i = 0; i < 2; i++) {
        char log[160];
        snprintf(log, sizeof log, "%s/netns-%d.log", G.dir, i);
        char *argv[] = {
            "/usr/sbin/ip", "netns", "exec",          ns,        (char *)G.bin,     "serve",
            "--model",      G.model, "--host",        "0.0.0.0", "--port",          "0",
            "--threads",    "1",     "--kv-cache-mb", "16",      (char *)how[i][0], NULL};
        tp_proc p;
        assert_int_equal(tp_spawn(&p, log, argv), 0);
        assert_true((p.http = (int)tp_wait_int(&p, "address=http://0.0.0.0:", 60)) > 0);
        assert_log_has(&p, how[i][1]);
        stop_ok(&p);
    }
    snprintf(cmd, sizeof cmd, "ip netns delete %s", ns);
    assert_int_equal(system(cmd), 0);
}

/* ---- duplex up with two tenants --------------------------------------------------------- */

/* The port on the summary line of `name` (prefill0, decode0, router). */
static int up_port(const tp_proc *p, const char *name)
{
    static char buf[1 << 16];
    char key[64];
    tp_read_log(p, buf, sizeof buf);
    snprintf(key, sizeof key, "duplex up: %s ", name);
    const char *l = strstr(buf, key);
    if (!l) fail_msg("no summary line for %s:\n%s", name, buf);
    const char *u = strstr(l, "http://127.0.0.1:");
    return u ? atoi(u + strlen("http://127.0.0.1:")) : 0;
}

/* One turn through the router as tenant `auth`; the answer is appended and
 * the usage's cached_tokens returned. */
static long turn_as(conv *c, int router_port, const char *auth, int max_tokens)
{
    const char *h[] = {auth, NULL};
    json_t *b = chat_body(c->msgs, max_tokens);
    json_t *resp = post_h(router_port, b, h, 200);
    long cached = usage_of(resp, "cached_tokens");
    c->prompt = usage_of(resp, "prompt_tokens");
    c->gen = usage_of(resp, "completion_tokens");
    json_t *ans = answer_of(resp);
    conv_add_answer(c, ans);
    json_decref(ans);
    json_decref(b);
    json_decref(resp);
    return cached;
}

/* The last answer of a conversation. */
static json_t *last_answer(const conv *c)
{
    json_t *m = json_array_get(c->msgs, json_array_size(c->msgs) - 1);
    return json_incref(json_object_get(m, "content"));
}

static void test_up_tenants(void **state)
{
    (void)state;
    char log[160];
    snprintf(log, sizeof log, "%s/up.log", G.dir);
    char *argv[] = {(char *)G.bin, "up", "--mode", "bidirectional", "--port", "0", "--model",
                    G.model, "--kv-cache-mb", "32", "--threads-per-node", "1", "--api-key",
                    "sk-tenant-a", "--api-key-file", g_keys_file,
                    /* the count rule: where each turn is prefilled must not
                     * depend on this machine's measured costs */
                    "--local-prefill-max-tokens", "256", NULL};
    tp_proc U;
    assert_int_equal(tp_spawn(&U, log, argv), 0);
    int port = (int)tp_wait_int(&U, "ready: http://127.0.0.1:", 120);
    if (port <= 0) {
        tp_log_tail(&U, 40);
        fail_msg("duplex up did not get ready");
    }
    tp_proc P = {.http = up_port(&U, "prefill0")}, D = {.http = up_port(&U, "decode0")};
    /* the run directory with the keys: private */
    static char buf[1 << 16];
    tp_read_log(&U, buf, sizeof buf);
    char dir[200] = "";
    const char *k = strstr(buf, "duplex up: keys ");
    assert_non_null(k);
    assert_int_equal(sscanf(k + strlen("duplex up: keys "), " %199s", dir), 1);
    char path[300];
    struct stat st;
    snprintf(path, sizeof path, "%s/internal.key", dir);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    /* the router and the nodes require the keys */
    assert_401(port, "POST", "/v1/chat/completions", NULL, "missing API key");
    assert_401(port, "POST", "/v1/chat/completions", "Authorization: Bearer sk-tenant-c",
               "invalid API key");
    assert_401(P.http, "GET", "/v1/models", NULL, "missing API key");
    assert_401(D.http, "POST", "/v1/chat/completions", "Authorization: Bearer nope",
               "invalid API key");
    const char *ta = "Authorization: Bearer sk-tenant-a", *tb = "Authorization: Bearer sk-file-2";
    tp_proc S;
    const char *const ref[] = {"--no-enable-prefix-caching", NULL};
    node_start(&S, "s", ref);
    /* the same conversation under two keys: turn 1 is long enough to go
     * through the prefill node, turn 2's new message short enough for the
     * decode node to prefill itself from what it holds */
    conv a, b, r;
    conv_init(&a, 31, 300);
    conv_init(&b, 31, 300);
    conv_init(&r, 31, 300);
    long p_comp = metric(&P, COMPUTED), d_local = metric(&D, LOCAL);
    assert_int_equal(turn_as(&a, port, ta, 24), 0);
    json_t *want = turn_single(&r, &S, 24);
    assert_same(last_answer(&a), json_incref(want), 1);
    assert_int_equal(metric(&P, COMPUTED) - p_comp, a.prompt); /* all of it */
    /* tenant B, identical history: nothing of A's is reused anywhere */
    p_comp = metric(&P, COMPUTED);
    d_local = metric(&D, LOCAL);
    assert_int_equal(turn_as(&b, port, tb, 24), 0);
    assert_same(last_answer(&b), want, 1);
    assert_int_equal(metric(&P, COMPUTED) - p_comp, b.prompt);
    assert_int_equal(metric(&D, LOCAL) - d_local, 0);
    /* each tenant's second turn reuses its own history */
    user_turn(&a, &b, 41, 12);
    user_turn(&r, NULL, 41, 12);
    long held = (a.prompt + a.gen - 1) / BS * BS;
    long ca = turn_as(&a, port, ta, 16);
    want = turn_single(&r, &S, 16);
    assert_same(last_answer(&a), json_incref(want), 2);
    long cb = turn_as(&b, port, tb, 16);
    assert_same(last_answer(&b), want, 2);
    if (ca < held || cb < held) fail_msg("turn 2 reused %ld / %ld tokens, held %ld", ca, cb, held);
    /* the router spoke to the nodes with the internal key: nothing ignored */
    assert_int_equal(metric(&P, IGNORED), 0);
    assert_int_equal(metric(&D, IGNORED), 0);
    /* bench chat's --api-key reaches the cluster */
    char cmd[512], out[8192];
    snprintf(cmd, sizeof cmd,
             "%s bench chat --url http://127.0.0.1:%d --turns 2 --prefix-tokens 40 "
             "--input-tokens 10 --output-tokens 8 --api-key sk-file-1 --json 2>&1",
             G.bin, port);
    if (tp_capture(cmd, out, sizeof out) != 0) fail_msg("bench chat with a key failed:\n%s", out);
    snprintf(cmd, sizeof cmd,
             "%s bench chat --url http://127.0.0.1:%d --turns 1 --prefix-tokens 40 "
             "--output-tokens 8 2>&1",
             G.bin, port);
    if (tp_capture(cmd, out, sizeof out) == 0 || !strstr(out, "answered 401: missing API key"))
        fail_msg("bench chat without a key:\n%s", out);
    conv_free(&a);
    conv_free(&b);
    conv_free(&r);
    stop_ok(&S);
    stop_ok(&U);
    assert_int_equal(stat(dir, &st), -1); /* removed */
    assert_int_equal(errno, ENOENT);
}

/* The router alone, keyed, in front of a keyless node. */
static void test_router_keys(void **state)
{
    (void)state;
    tp_proc N, R;
    const char *na[] = {"--internal-key-file", g_ik, NULL};
    node_start(&N, "n", na);
    char dl[64];
    snprintf(dl, sizeof dl, "http://127.0.0.1:%d", N.http);
    const char *argv[] = {"router",    "--decode",
                          dl,          "--port",
                          "0",         "--api-key",
                          "sk-flag",   "--api-key-file",
                          g_keys_file, "--internal-key-file",
                          g_ik,        NULL};
    char log[160];
    snprintf(log, sizeof log, "%s/router.log", G.dir);
    tp_start(&R, G.bin, log, argv, "duplex router:");
    assert_log_has(&R, "auth=api-keys(3) internal_key=on");
    dx_buf b;
    dx_buf_init(&b, 0);
    for (int i = 0; i < 600 && tc_http(R.http, "GET", "/health", NULL, &b, 10) != 200; i++)
        tp_sleep_ms(50);
    dx_buf_free(&b);
    check_keys(R.http);
    stop_ok(&R);
    stop_ok(&N);
}

static int setup(void **state)
{
    (void)state;
    if (pdt_setup("auth")) return -1;
    snprintf(g_ik, sizeof g_ik, "%s/internal.key", G.dir);
    write_file(g_ik, "# the cluster's internal key\n" IKEY "\n");
    chmod(g_ik, 0600);
    snprintf(g_keys_file, sizeof g_keys_file, "%s/api-keys", G.dir);
    write_file(g_keys_file, "# tenants\nsk-file-1\n\n   sk-file-2   \r\n");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return pdt_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_api_keys), cmocka_unit_test(test_internal_key),
        cmocka_unit_test(test_trust_ranges),  cmocka_unit_test(test_bad_keys_and_ranges),
        cmocka_unit_test(test_loopback_rule), cmocka_unit_test(test_router_keys),
        cmocka_unit_test(test_up_tenants),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
