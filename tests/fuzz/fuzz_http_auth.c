/* Fuzz target: what callers and operators hand to http_auth — key files
 * (dx_keys_parse), address ranges (dx_cidr_parse) and the Authorization /
 * X-Duplex-Internal-Key headers (http_auth_check).  The first byte picks
 * what the rest is; header inputs are split at the first '\n' into the two
 * values.  Invariants: nothing crashes or leaks; a parsed range prints back
 * to text that parses to itself; a 401 always has a message and never
 * trusts; only the configured keys are ever accepted. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_cidr.h"
#include "base/dx_err.h"
#include "base/dx_keys.h"
#include "http/http_auth.h"

#define IKEY "fuzz-internal-key-0123456789"

static http_auth *g_auth;

static void setup(void)
{
    static const char *keys[] = {"sk-one", "sk-two"};
    static const char *trust[] = {"10.0.0.0/8"};
    char path[] = "/tmp/dx_fuzz_auth_XXXXXX";
    int fd = mkstemp(path);
    DX_ASSERT(fd >= 0);
    DX_ASSERT(write(fd, IKEY "\n", sizeof IKEY) == (ssize_t)sizeof IKEY);
    close(fd);
    http_auth_config c = {.api_keys = keys, .n_api_keys = 2, .internal_key_file = path,
                          .trust_kv_from = trust, .n_trust_kv_from = 1};
    DX_ASSERT(http_auth_create(&c, &g_auth) == 0);
    unlink(path);
}

static void fuzz_keys(const char *p, size_t n)
{
    dx_keys *k;
    DX_ASSERT(dx_keys_create(&k) == 0);
    int rc = dx_keys_parse(k, p, n, "fuzz");
    DX_ASSERT(rc == 0 || rc == DX_EINVAL || rc == DX_ENOMEM);
    DX_ASSERT(rc != 0 || dx_keys_count(k) > 0);
    dx_keys_destroy(k);
}

static void fuzz_cidr(const char *p, size_t n)
{
    char s[128];
    if (n >= sizeof s) n = sizeof s - 1;
    memcpy(s, p, n);
    s[n] = 0;
    dx_cidr c, again;
    if (dx_cidr_parse(s, &c) != 0) return;
    char text[80];
    dx_cidr_format(&c, text, sizeof text);
    DX_ASSERT(dx_cidr_parse(text, &again) == 0);
    DX_ASSERT(again.family == c.family && again.prefix == c.prefix &&
              !memcmp(again.addr, c.addr, sizeof c.addr));
}

static void fuzz_headers(const char *p, size_t n)
{
    char buf[1024];
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, p, n);
    buf[n] = 0;
    char *nl = strchr(buf, '\n'), *second = NULL;
    if (nl) *nl = 0, second = nl + 1;
    http_header h[2] = {{"Authorization", buf}, {HTTP_AUTH_INTERNAL_HEADER, second}};
    http_req r = {.method = "POST", .path = "/", .query = "", .headers = h,
                  .n_headers = second ? 2 : 1, .body = "", .body_len = 0};
    http_auth_result w;
    http_auth_check(g_auth, &r, &w);
    DX_ASSERT(w.status == 0 || w.status == 401);
    if (w.status) DX_ASSERT(w.message && *w.message && !w.trusted && !w.internal);
    if (w.internal) DX_ASSERT(strstr(buf, IKEY) || (second && !strcmp(second, IKEY)));
    if (w.key >= 0) DX_ASSERT(strstr(buf, w.key ? "sk-two" : "sk-one"));
    uint8_t salt[HTTP_AUTH_SALT];
    http_auth_cache_salt(g_auth, &w, buf, strlen(buf), salt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_auth) setup();
    if (size < 1) return 0;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    switch (data[0] % 3) {
    case 0: fuzz_keys(p, n); break;
    case 1: fuzz_cidr(p, n); break;
    default: fuzz_headers(p, n); break;
    }
    return 0;
}
