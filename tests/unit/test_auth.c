/* test_auth: API keys, the internal key and trusted ranges — key files
 * (comments, blank lines, CRLF, and every bad line named with its file and
 * line), the constant-time lookup, CIDR ranges (every malformed spelling
 * refused with a message quoting it; IPv4, IPv6 and IPv4-mapped peers), the
 * Authorization header (missing, malformed, wrong, right, the internal key
 * in either place), who may send kv_transfer_params, the bind rule, and the
 * tenants' prefix-cache namespaces. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/dx_cidr.h"
#include "base/dx_err.h"
#include "base/dx_keys.h"
#include "http/http_auth.h"

static char g_dir[64];

/* A file in the test's directory with the given text; its path. */
static const char *file_with(const char *name, const char *text, size_t len)
{
    static char path[8][160];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, sizeof path[0], "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
    return p;
}

static void assert_msg(const char *phrase)
{
    if (!strstr(dx_errmsg(), phrase)) fail_msg("message '%s' lacks '%s'", dx_errmsg(), phrase);
}

/* ---- key sets and files ---------------------------------------------------------- */

static void test_key_file(void **state)
{
    (void)state;
    dx_keys *k;
    assert_int_equal(dx_keys_create(&k), 0);
    const char text[] = "# team keys\n\n  sk-alpha  \r\n\t# indented comment\nsk-beta\r\n"
                        "sk-gamma"; /* no newline at the end */
    assert_int_equal(dx_keys_parse(k, text, sizeof text - 1, "keys.txt"), 0);
    assert_int_equal(dx_keys_count(k), 3);
    assert_int_equal(dx_keys_find(k, "sk-alpha", 8), 0);
    assert_int_equal(dx_keys_find(k, "sk-beta", 7), 1);
    assert_int_equal(dx_keys_find(k, "sk-gamma", 8), 2);
    /* near misses: prefix, extension, case, empty */
    assert_int_equal(dx_keys_find(k, "sk-alph", 7), -1);
    assert_int_equal(dx_keys_find(k, "sk-alphaa", 9), -1);
    assert_int_equal(dx_keys_find(k, "SK-ALPHA", 8), -1);
    assert_int_equal(dx_keys_find(k, "", 0), -1);
    /* digests identify keys, never equal the key */
    assert_memory_not_equal(dx_keys_digest(k, 0), dx_keys_digest(k, 1), DX_KEY_DIGEST);
    /* a flag's key joins the set; the same key twice is refused */
    assert_int_equal(dx_keys_add(k, "sk-delta", 8, "--api-key"), 0);
    assert_int_equal(dx_keys_find(k, "sk-delta", 8), 3);
    assert_int_equal(dx_keys_add(k, "sk-beta", 7, "--api-key"), DX_EINVAL);
    assert_msg("--api-key: the same key is given twice");
    dx_keys_destroy(k);
    dx_keys_destroy(NULL);
}

/* Every bad key file: the message names the file and the line. */
static void test_key_file_errors(void **state)
{
    (void)state;
    char long_key[600];
    memset(long_key, 'k', sizeof long_key);
    char long_text[620];
    snprintf(long_text, sizeof long_text, "ok-key\n%.*s\n", 513, long_key);
    static const struct {
        const char *text, *phrase;
    } bad[] = {
        {"", "keys.txt: no key in the file"},
        {"# only a comment\n\n   \n", "keys.txt: no key in the file"},
        {"sk-a\nsk b\n", "keys.txt: line 2: white space inside a key"},
        {"sk-a\tb\n", "keys.txt: line 1: white space inside a key"},
        {"sk-a\nsk-\x01x\n", "keys.txt: line 2: a byte that is not visible ASCII"},
        {"sk-\xc3\xa9\n", "keys.txt: line 1: a byte that is not visible ASCII"},
        {"sk-a\n\nsk-a\n", "keys.txt: line 3: the same key is given twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dx_keys *k;
        assert_int_equal(dx_keys_create(&k), 0);
        if (dx_keys_parse(k, bad[i].text, strlen(bad[i].text), "keys.txt") != DX_EINVAL)
            fail_msg("case %zu accepted", i);
        assert_msg(bad[i].phrase);
        dx_keys_destroy(k);
    }
    dx_keys *k;
    assert_int_equal(dx_keys_create(&k), 0);
    assert_int_equal(dx_keys_parse(k, long_text, strlen(long_text), "keys.txt"), DX_EINVAL);
    assert_msg("keys.txt: line 2: a key over 512 bytes");
    /* exactly the limit is a key */
    snprintf(long_text, sizeof long_text, "%.*s\n", DX_KEY_MAX, long_key);
    assert_int_equal(dx_keys_parse(k, long_text, strlen(long_text), "keys.txt"), 0);
    /* flags: empty, blank inside, too long */
    assert_int_equal(dx_keys_add(k, "", 0, "--api-key"), DX_EINVAL);
    assert_msg("--api-key: an empty key");
    assert_int_equal(dx_keys_add(k, "a b", 3, "--api-key"), DX_EINVAL);
    assert_msg("--api-key: white space inside a key");
    assert_int_equal(dx_keys_add(k, long_key, DX_KEY_MAX + 1, "--api-key"), DX_EINVAL);
    assert_msg("a key over 512 bytes");
    /* files: missing, a NUL byte, too large */
    char missing[128];
    snprintf(missing, sizeof missing, "%s/no-such-file", g_dir);
    assert_int_equal(dx_keys_load(k, missing), DX_EIO);
    assert_msg("no-such-file: No such file");
    assert_int_equal(dx_keys_load(k, file_with("nul", "sk-a\n\0sk-b\n", 11)), DX_EINVAL);
    assert_msg("nul: a NUL byte");
    size_t big = DX_KEY_FILE_MAX + 1;
    char *huge = malloc(big);
    memset(huge, '#', big);
    assert_int_equal(dx_keys_load(k, file_with("huge", huge, big)), DX_EINVAL);
    assert_msg("huge: over 4194304 bytes");
    free(huge);
    /* a good file loads */
    assert_int_equal(dx_keys_load(k, file_with("good", "sk-file\n", 8)), 0);
    assert_true(dx_keys_find(k, "sk-file", 7) >= 0);
    dx_keys_destroy(k);
}

static void test_internal_key_file(void **state)
{
    (void)state;
    char *key;
    const char *ok = file_with("ik", "# cluster key\n0123456789abcdef0123\n", 35);
    assert_int_equal(dx_keys_read_one(ok, 16, &key), 0);
    assert_string_equal(key, "0123456789abcdef0123");
    dx_keys_free_secret(key);
    assert_int_equal(dx_keys_read_one(file_with("ik2", "0123456789abcdef\n# x\nfedcba9876543210\n", 38),
                                      16, &key),
                     DX_EINVAL);
    assert_msg("ik2: line 3: a second key (this file holds exactly one)");
    assert_null(key);
    assert_int_equal(dx_keys_read_one(file_with("ik3", "short\n", 6), 16, &key), DX_EINVAL);
    assert_msg("ik3: line 1: the key has 5 characters; at least 16 are needed");
    assert_int_equal(dx_keys_read_one(file_with("ik4", "\n# none\n", 8), 16, &key), DX_EINVAL);
    assert_msg("ik4: no key in the file");
    assert_int_equal(dx_keys_read_one(file_with("ik5", "0123456789abcdef 0\n", 19), 16, &key),
                     DX_EINVAL);
    assert_msg("ik5: line 1: white space inside a key");
    char missing[128];
    snprintf(missing, sizeof missing, "%s/none", g_dir);
    assert_int_equal(dx_keys_read_one(missing, 16, &key), DX_EIO);
    dx_keys_free_secret(NULL);
    /* random keys: hex, and never the same twice */
    char a[65], b[65];
    dx_keys_random_hex(a, 32);
    dx_keys_random_hex(b, 32);
    assert_int_equal(strlen(a), 64);
    assert_int_equal(strspn(a, "0123456789abcdef"), 64);
    assert_string_not_equal(a, b);
}

/* ---- CIDR ranges ------------------------------------------------------------------ */

static void test_cidr_parse(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } good[] = {
        {"10.0.0.0/8", "10.0.0.0/8"},      {"10.1.2.3", "10.1.2.3/32"},
        {"0.0.0.0/0", "0.0.0.0/0"},        {"192.168.1.0/24", "192.168.1.0/24"},
        {"127.0.0.1/32", "127.0.0.1/32"},  {"::1", "::1/128"},
        {"fd00::/8", "fd00::/8"},          {"::/0", "::/0"},
        {"2001:db8::/32", "2001:db8::/32"}, {"::ffff:10.0.0.0/104", "::ffff:10.0.0.0/104"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        dx_cidr c;
        if (dx_cidr_parse(good[i].in, &c)) fail_msg("%s: %s", good[i].in, dx_errmsg());
        char out[64];
        dx_cidr_format(&c, out, sizeof out);
        assert_string_equal(out, good[i].out);
    }
    static const struct {
        const char *in, *phrase;
    } bad[] = {
        {"", "empty"},
        {"10.0.0.0/", "'10.0.0.0/': the prefix length after '/' must be a number 0..32"},
        {"10.0.0.0/33", "must be a number 0..32"},
        {"10.0.0.0/08", "must be a number 0..32"},
        {"10.0.0.0/-1", "must be a number 0..32"},
        {"10.0.0.0/+8", "must be a number 0..32"},
        {"10.0.0.0/ 8", "must be a number 0..32"},
        {"10.0.0.0/8/8", "must be a number 0..32"},
        {"10.0.0.0/1000", "must be a number 0..32"},
        {"::1/129", "must be a number 0..128"},
        {"/8", "'' is not an IPv4 or IPv6 address"},
        {"10.0.0.1/8", "'10.0.0.1/8': bits are set past the /8 prefix (the range is 10.0.0.0/8)"},
        {"fd00::1/8", "(the range is fd00::/8)"},
        {"0.0.0.1/0", "(the range is 0.0.0.0/0)"},
        {" 10.0.0.0/8", "is not an IPv4 or IPv6 address"},
        {"10.0.0.0/8 ", "must be a number"},
        {"[::1]/128", "'[::1]' is not an IPv4 or IPv6 address"},
        {"localhost", "'localhost' is not an IPv4 or IPv6 address"},
        {"010.0.0.0/8", "is not an IPv4 or IPv6 address"},
        {"1.2.3/24", "is not an IPv4 or IPv6 address"},
        {"1.2.3.256", "is not an IPv4 or IPv6 address"},
        {"fe80::1%eth0/64", "is not an IPv4 or IPv6 address"},
        {"10.0.0.0,10.1.0.0/16", "is not an IPv4 or IPv6 address"},
        {"1111:2222:3333:4444:5555:6666:7777:8888:9999:aaaa:bbbb:cccc:dddd:eeee/64", "too long"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dx_cidr c;
        if (dx_cidr_parse(bad[i].in, &c) != DX_EINVAL) fail_msg("'%s' accepted", bad[i].in);
        assert_msg(bad[i].phrase);
    }
}

static struct sockaddr_storage sa4(const char *a)
{
    struct sockaddr_storage ss = {0};
    struct sockaddr_in *s = (struct sockaddr_in *)&ss;
    s->sin_family = AF_INET;
    assert_int_equal(inet_pton(AF_INET, a, &s->sin_addr), 1);
    return ss;
}

static struct sockaddr_storage sa6(const char *a)
{
    struct sockaddr_storage ss = {0};
    struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;
    s->sin6_family = AF_INET6;
    assert_int_equal(inet_pton(AF_INET6, a, &s->sin6_addr), 1);
    return ss;
}

static int in_range(const char *cidr, struct sockaddr_storage ss)
{
    dx_cidr c;
    assert_int_equal(dx_cidr_parse(cidr, &c), 0);
    return dx_cidr_match(&c, (const struct sockaddr *)&ss);
}

static void test_cidr_match(void **state)
{
    (void)state;
    assert_true(in_range("10.0.0.0/8", sa4("10.255.1.2")));
    assert_false(in_range("10.0.0.0/8", sa4("11.0.0.1")));
    assert_true(in_range("192.168.1.128/25", sa4("192.168.1.200")));
    assert_false(in_range("192.168.1.128/25", sa4("192.168.1.127")));
    assert_true(in_range("10.1.2.3", sa4("10.1.2.3")));
    assert_false(in_range("10.1.2.3", sa4("10.1.2.4")));
    assert_true(in_range("0.0.0.0/0", sa4("203.0.113.9")));
    assert_false(in_range("0.0.0.0/0", sa6("2001:db8::1"))); /* families never mix... */
    assert_true(in_range("10.0.0.0/8", sa6("::ffff:10.9.8.7"))); /* ...but v4 on a v6 socket is v4 */
    assert_false(in_range("10.0.0.0/8", sa6("::ffff:11.9.8.7")));
    assert_true(in_range("fd00::/8", sa6("fd12:3456::1")));
    assert_false(in_range("fd00::/8", sa6("fe80::1")));
    assert_true(in_range("::1", sa6("::1")));
    assert_false(in_range("::1", sa4("127.0.0.1")));
    assert_true(in_range("2001:db8::/33", sa6("2001:db8:7fff::1")));
    assert_false(in_range("2001:db8::/33", sa6("2001:db8:8000::1")));
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    dx_cidr all;
    assert_int_equal(dx_cidr_parse("0.0.0.0/0", &all), 0);
    assert_false(dx_cidr_match(&all, (const struct sockaddr *)&un));
}

/* ---- requests --------------------------------------------------------------------- */

typedef struct {
    http_header h[4];
    http_req r;
    struct sockaddr_storage peer;
} fake_req;

/* A request from peer (NULL: unknown) with up to two headers. */
static http_req *req(fake_req *f, const char *peer, const char *n1, const char *v1, const char *n2,
                     const char *v2)
{
    memset(f, 0, sizeof *f);
    size_t n = 0;
    if (n1) f->h[n++] = (http_header){n1, v1};
    if (n2) f->h[n++] = (http_header){n2, v2};
    f->r = (http_req){.method = "POST", .path = "/v1/chat/completions", .query = "",
                      .headers = f->h, .n_headers = n, .body = "", .body_len = 0};
    if (peer) {
        f->peer = strchr(peer, ':') ? sa6(peer) : sa4(peer);
        f->r.peer = (const struct sockaddr *)&f->peer;
    }
    return &f->r;
}

static http_auth *auth_with(const char *const *keys, size_t n_keys, const char *internal_file,
                            const char *const *trust, size_t n_trust)
{
    http_auth_config c = {.api_keys = keys, .n_api_keys = n_keys,
                          .internal_key_file = internal_file, .trust_kv_from = trust,
                          .n_trust_kv_from = n_trust};
    http_auth *a;
    if (http_auth_create(&c, &a)) fail_msg("http_auth_create: %s", dx_errmsg());
    return a;
}

#define IK "internal-0123456789abcdef"

static void expect_401(const http_auth *a, http_req *r, const char *phrase)
{
    http_auth_result w;
    http_auth_check(a, r, &w);
    assert_int_equal(w.status, 401);
    if (!strstr(w.message, phrase)) fail_msg("401 '%s' lacks '%s'", w.message, phrase);
    assert_false(w.trusted);
}

static void test_api_keys(void **state)
{
    (void)state;
    const char *keys[] = {"sk-one", "sk-two"};
    http_auth *a = auth_with(keys, 2, NULL, NULL, 0);
    fake_req f;
    http_auth_result w;
    expect_401(a, req(&f, "127.0.0.1", NULL, NULL, NULL, NULL), "missing API key");
    expect_401(a, req(&f, "127.0.0.1", "Authorization", "Bearer sk-three", NULL, NULL),
               "invalid API key");
    expect_401(a, req(&f, "127.0.0.1", "Authorization", "Bearer sk-on", NULL, NULL),
               "invalid API key");
    static const char *const malformed[] = {"Basic c2stb25l", "Bearer", "Bearer ", "Bearersk-one",
                                            "Bearer sk-one extra", "sk-one", ""};
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++)
        expect_401(a, req(&f, "127.0.0.1", "Authorization", malformed[i], NULL, NULL),
                   "malformed Authorization header");
    /* two Authorization headers: which would a proxy have read? */
    expect_401(a, req(&f, NULL, "Authorization", "Bearer sk-one", "authorization", "Bearer sk-two"),
               "malformed");
    /* right: the scheme in any case, blanks around */
    http_auth_check(a, req(&f, "10.0.0.1", "authorization", "  bearer \t sk-two  ", NULL, NULL), &w);
    assert_int_equal(w.status, 0);
    assert_int_equal(w.key, 1);
    assert_false(w.internal);
    assert_false(w.trusted); /* not from loopback */
    /* an internal key header where the server has none: refused, loudly */
    expect_401(a, req(&f, "127.0.0.1", "Authorization", "Bearer sk-one", HTTP_AUTH_INTERNAL_HEADER,
                      IK),
               "invalid internal key");
    /* Anthropic's x-api-key (its SDK's header), any case, blanks around */
    http_auth_check(a, req(&f, "127.0.0.1", "X-Api-Key", " sk-two ", NULL, NULL), &w);
    assert_int_equal(w.status, 0);
    assert_int_equal(w.key, 1);
    expect_401(a, req(&f, "127.0.0.1", "x-api-key", "sk-nope", NULL, NULL), "invalid API key");
    expect_401(a, req(&f, "127.0.0.1", "x-api-key", "", NULL, NULL), "malformed");
    expect_401(a, req(&f, "127.0.0.1", "x-api-key", "sk-one", "x-api-key", "sk-two"), "malformed");
    /* with both headers, Authorization is the one read */
    http_auth_check(a, req(&f, "127.0.0.1", "Authorization", "Bearer sk-one", "x-api-key", "bad"),
                    &w);
    assert_int_equal(w.status, 0);
    assert_int_equal(w.key, 0);
    http_auth_destroy(a);
}

static void test_internal_key_and_trust(void **state)
{
    (void)state;
    const char *ik = file_with("cluster.key", IK "\n", strlen(IK) + 1);
    const char *keys[] = {"sk-one"};
    http_auth *a = auth_with(keys, 1, ik, NULL, 0);
    assert_string_equal(http_auth_internal_key(a), IK);
    fake_req f;
    http_auth_result w;
    /* the internal key in its header: trusted, no API key needed */
    http_auth_check(a, req(&f, "10.0.0.1", HTTP_AUTH_INTERNAL_HEADER, IK, NULL, NULL), &w);
    assert_int_equal(w.status, 0);
    assert_true(w.internal && w.trusted);
    assert_int_equal(w.key, -1);
    /* ...with the client's Authorization passed on beside it */
    http_auth_check(a, req(&f, "10.0.0.1", "Authorization", "Bearer sk-whatever",
                           HTTP_AUTH_INTERNAL_HEADER, IK),
                    &w);
    assert_true(w.status == 0 && w.internal);
    /* as the Bearer token (a vLLM-style proxy) */
    http_auth_check(a, req(&f, "10.0.0.1", "Authorization", "Bearer " IK, NULL, NULL), &w);
    assert_true(w.status == 0 && w.internal && w.trusted);
    /* wrong in its header: 401 even with a good API key */
    expect_401(a, req(&f, "127.0.0.1", "Authorization", "Bearer sk-one", HTTP_AUTH_INTERNAL_HEADER,
                      IK "x"),
               "invalid internal key");
    /* an API key: allowed, not trusted — loopback is no longer enough */
    http_auth_check(a, req(&f, "127.0.0.1", "Authorization", "Bearer sk-one", NULL, NULL), &w);
    assert_true(w.status == 0 && !w.internal && !w.trusted && w.key == 0);
    http_auth_destroy(a);

    /* no keys at all: open; loopback callers are trusted, others not */
    a = auth_with(NULL, 0, NULL, NULL, 0);
    http_auth_check(a, req(&f, "127.0.0.1", NULL, NULL, NULL, NULL), &w);
    assert_true(w.status == 0 && w.trusted);
    http_auth_check(a, req(&f, "::1", "Authorization", "Basic whatever", NULL, NULL), &w);
    assert_true(w.status == 0 && w.trusted);
    http_auth_check(a, req(&f, "192.0.2.1", "Authorization", "Bearer x", NULL, NULL), &w);
    assert_true(w.status == 0 && !w.trusted);
    http_auth_check(a, req(&f, NULL, NULL, NULL, NULL, NULL), &w);
    assert_true(w.status == 0 && !w.trusted);
    http_auth_destroy(a);
    /* a NULL auth is a server with nothing configured */
    http_auth_check(NULL, req(&f, "127.0.0.1", NULL, NULL, NULL, NULL), &w);
    assert_true(w.status == 0 && w.trusted);

    /* ranges: only callers inside them (loopback too only if listed) */
    const char *trust[] = {"192.0.2.0/24", "fd00::/8"};
    a = auth_with(NULL, 0, NULL, trust, 2);
    http_auth_check(a, req(&f, "192.0.2.77", NULL, NULL, NULL, NULL), &w);
    assert_true(w.trusted);
    http_auth_check(a, req(&f, "fd00::5", NULL, NULL, NULL, NULL), &w);
    assert_true(w.trusted);
    http_auth_check(a, req(&f, "::ffff:192.0.2.1", NULL, NULL, NULL, NULL), &w);
    assert_true(w.trusted);
    http_auth_check(a, req(&f, "127.0.0.1", NULL, NULL, NULL, NULL), &w);
    assert_false(w.trusted);
    http_auth_check(a, req(&f, "198.51.100.1", NULL, NULL, NULL, NULL), &w);
    assert_false(w.trusted);
    char d[256];
    http_auth_describe_trust(a, d, sizeof d);
    assert_string_equal(d, "192.0.2.0/24,fd00::/8");
    http_auth_destroy(a);
}

static void test_create_errors(void **state)
{
    (void)state;
    http_auth *a;
    const char *bad_range[] = {"127.0.0.0/8", "10.0.0.1/8"};
    http_auth_config c = {.trust_kv_from = bad_range, .n_trust_kv_from = 2};
    assert_int_equal(http_auth_create(&c, &a), DX_EINVAL);
    assert_msg("--trust-kv-params-from: '10.0.0.1/8': bits are set past the /8 prefix");
    assert_null(a);
    const char *files[] = {file_with("team", "sk-a\nsk b\n", 10)};
    c = (http_auth_config){.api_key_files = files, .n_api_key_files = 1};
    assert_int_equal(http_auth_create(&c, &a), DX_EINVAL);
    assert_msg("--api-key-file: ");
    assert_msg("team: line 2: white space inside a key");
    const char *dup[] = {"sk-a"};
    c.api_keys = dup;
    c.n_api_keys = 1;
    c.api_key_files = (const char *[]){file_with("team2", "sk-b\nsk-a\n", 10)};
    assert_int_equal(http_auth_create(&c, &a), DX_EINVAL);
    assert_msg("team2: line 2: the same key is given twice");
    c = (http_auth_config){.internal_key_file = file_with("short.key", "abc\n", 4)};
    assert_int_equal(http_auth_create(&c, &a), DX_EINVAL);
    assert_msg("--internal-key-file: ");
    assert_msg("short.key: line 1: the key has 3 characters");
    const char *empty[] = {""};
    c = (http_auth_config){.api_keys = empty, .n_api_keys = 1};
    assert_int_equal(http_auth_create(&c, &a), DX_EINVAL);
    assert_msg("--api-key: an empty key");
}

static void test_bind_rule(void **state)
{
    (void)state;
    http_auth *none = auth_with(NULL, 0, NULL, NULL, 0);
    const char *keys[] = {"sk-one"};
    http_auth *keyed = auth_with(keys, 1, NULL, NULL, 0);
    assert_int_equal(http_auth_bind_check(none, "127.0.0.1", 0), 0);
    assert_int_equal(http_auth_bind_check(none, "127.0.0.2", 0), 0);
    assert_int_equal(http_auth_bind_check(none, "::1", 0), 0);
    assert_int_equal(http_auth_bind_check(none, "[::1]", 0), 0);
    assert_int_equal(http_auth_bind_check(none, "localhost", 0), 0);
    assert_int_equal(http_auth_bind_check(NULL, "0.0.0.0", 0), DX_EINVAL);
    assert_int_equal(http_auth_bind_check(none, "0.0.0.0", 0), DX_EINVAL);
    assert_msg("--host 0.0.0.0 is not a loopback address, and no API key is set");
    assert_msg("--insecure-no-auth");
    assert_int_equal(http_auth_bind_check(none, "::", 0), DX_EINVAL);
    assert_int_equal(http_auth_bind_check(none, "0.0.0.0", 1), 0);
    assert_int_equal(http_auth_bind_check(keyed, "0.0.0.0", 0), 0);
    char d[64];
    http_auth_describe(none, 0, d, sizeof d);
    assert_string_equal(d, "none (loopback only)");
    http_auth_describe(none, 1, d, sizeof d);
    assert_string_equal(d, "none (--insecure-no-auth)");
    http_auth_describe(keyed, 0, d, sizeof d);
    assert_string_equal(d, "api-keys(1)");
    http_auth_destroy(none);
    http_auth_destroy(keyed);
}

/* The 401 body is OpenAI's shape, and says nothing about the keys. */
static void test_error_body(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(http_auth_error_json(&b, "invalid API key"), 0);
    dx_buf_putc(&b, 0);
    assert_string_equal(b.data, "{\"error\":{\"message\":\"invalid API key\",\"type\":"
                                "\"invalid_request_error\",\"param\":null,\"code\":"
                                "\"invalid_api_key\"}}");
    dx_buf_free(&b);
}

/* ---- tenants ---------------------------------------------------------------------- */

static int zero(const uint8_t *s)
{
    for (int i = 0; i < HTTP_AUTH_SALT; i++)
        if (s[i]) return 0;
    return 1;
}

static void test_cache_salts(void **state)
{
    (void)state;
    const char *keys[] = {"sk-one", "sk-two"};
    http_auth *a = auth_with(keys, 2, NULL, NULL, 0);
    uint8_t s1[16], s2[16], t1[16], u[16], u2[16], n[16];
    http_auth_result one = {.key = 0}, two = {.key = 1}, trusted = {.key = -1, .trusted = 1};
    http_auth_result anon = {.key = -1};
    /* no tenant, no salt: the shared namespace */
    http_auth_cache_salt(a, &anon, NULL, 0, n);
    assert_true(zero(n));
    http_auth_cache_salt(a, &trusted, NULL, 0, n);
    assert_true(zero(n));
    /* each key its own, stable */
    http_auth_cache_salt(a, &one, NULL, 0, s1);
    http_auth_cache_salt(a, &two, NULL, 0, s2);
    assert_false(zero(s1));
    assert_memory_not_equal(s1, s2, 16);
    http_auth_cache_salt(a, &one, NULL, 0, u);
    assert_memory_equal(s1, u, 16);
    /* a salt string: the router's (trusted) is taken as it is; an untrusted
     * caller's is bound to its key and can never equal a trusted one */
    http_auth_cache_salt(a, &trusted, "abc", 3, t1);
    http_auth_cache_salt(a, &one, "abc", 3, u);
    http_auth_cache_salt(a, &anon, "abc", 3, u2);
    assert_false(zero(t1));
    assert_memory_not_equal(t1, u, 16);
    assert_memory_not_equal(t1, u2, 16);
    assert_memory_not_equal(u, u2, 16);
    assert_memory_not_equal(u, s1, 16);
    http_auth_destroy(a);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/dx_test_auth_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) ? -1 : 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_file),
        cmocka_unit_test(test_key_file_errors),
        cmocka_unit_test(test_internal_key_file),
        cmocka_unit_test(test_cidr_parse),
        cmocka_unit_test(test_cidr_match),
        cmocka_unit_test(test_api_keys),
        cmocka_unit_test(test_internal_key_and_trust),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_bind_rule),
        cmocka_unit_test(test_error_body),
        cmocka_unit_test(test_cache_salts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
