/* test_kvport_auth: the KV port's challenge-response, both sides in memory.
 * The right secret authenticates both ways; a wrong secret, no secret
 * against a secret (either way round), a replayed AUTH_INIT/AUTH_PROOF, a
 * replayed AUTH_CHALLENGE, a proof reflected back to its maker, a proof made
 * for another holder address, a second try and steps out of order all fail
 * with DX_EAUTH.  Secret files: trailing newline dropped, too short / too
 * long / missing / not a file refused naming the file; new ones are 0600 and
 * never overwrite.  The listen policy: loopback without a secret, elsewhere
 * only with one or with --insecure-no-auth. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/dx_err.h"
#include "xfer/kvport_auth.h"

static kvport_secret *secret(const char *s)
{
    kvport_secret *k;
    assert_int_equal(kvport_secret_from_bytes(s, strlen(s), &k), 0);
    return k;
}

static dx_ipport endpoint(uint8_t last, int port)
{
    dx_ipport e = {.ip = {[10] = 0xff, [11] = 0xff, [12] = 10, [15] = last}, .port = port};
    return e;
}

/* One handshake: reader with key r, holder with key h, each seeing the
 * holder's end as given.  The recorded messages go to the out-params (any
 * may be NULL).  0 when both sides accepted, else the first failure. */
static int handshake(const kvport_secret *r, const kvport_secret *h, dx_ipport rside,
                     dx_ipport hside, kvport_auth_msg *init, kvport_auth_msg *ch,
                     kvport_auth_msg *proof)
{
    kvport_auth ra, ha;
    kvport_auth_msg i, c, p;
    assert_int_equal(kvport_auth_reader_start(&ra, r, &rside, &i), 0);
    assert_int_equal(kvport_auth_holder_challenge(&ha, h, &hside, &i, &c), 0);
    if (init) *init = i;
    if (ch) *ch = c;
    int rc = kvport_auth_reader_prove(&ra, &c, &p);
    if (rc) return rc;
    if (proof) *proof = p;
    return kvport_auth_holder_verify(&ha, &p);
}

static void test_right_secret(void **state)
{
    kvport_secret *k = secret("correct horse battery staple");
    dx_ipport e = endpoint(1, 7000);
    kvport_auth_msg i1, c1, p1, i2, c2, p2;
    assert_int_equal(handshake(k, k, e, e, &i1, &c1, &p1), 0);
    assert_int_equal(handshake(k, k, e, e, &i2, &c2, &p2), 0);
    /* fresh nonces every time: nothing repeats between two sessions */
    assert_memory_not_equal(i1.nonce, i2.nonce, KVPORT_NONCE_BYTES);
    assert_memory_not_equal(c1.nonce, c2.nonce, KVPORT_NONCE_BYTES);
    assert_memory_not_equal(p1.proof, p2.proof, KVPORT_PROOF_BYTES);
    /* no secret on either side: the handshake runs (and proves nothing) */
    assert_int_equal(handshake(NULL, NULL, e, e, NULL, NULL, NULL), 0);
    kvport_secret_destroy(k);
}

static void test_wrong_or_missing_secret(void **state)
{
    kvport_secret *a = secret("the cluster secret, 1st"), *b = secret("the cluster secret, 2nd");
    dx_ipport e = endpoint(1, 7000);
    /* the reader finds out first: the holder's proof does not verify */
    assert_int_equal(handshake(a, b, e, e, NULL, NULL, NULL), DX_EAUTH);
    assert_non_null(strstr(dx_errmsg(), "--kv-secret-file"));
    assert_int_equal(handshake(NULL, a, e, e, NULL, NULL, NULL), DX_EAUTH);
    assert_int_equal(handshake(a, NULL, e, e, NULL, NULL, NULL), DX_EAUTH);
    /* a reader that skips the check (an attacker) has no proof to give:
     * whatever it sends is refused */
    kvport_auth ra, ha;
    kvport_auth_msg i, c, p;
    assert_int_equal(kvport_auth_reader_start(&ra, b, &e, &i), 0);
    assert_int_equal(kvport_auth_holder_challenge(&ha, a, &e, &i, &c), 0);
    assert_int_equal(kvport_auth_reader_prove(&ra, &c, &p), DX_EAUTH);
    kvport_auth_msg zero = {{0}, {0}};
    assert_int_equal(kvport_auth_holder_verify(&ha, &zero), DX_EAUTH);
    assert_string_equal(dx_errmsg(), "authentication failed");
    kvport_secret_destroy(a);
    kvport_secret_destroy(b);
}

/* Everything an eavesdropper recorded from one session is useless in the
 * next: the other side's nonce is fresh. */
static void test_replay_and_reflection(void **state)
{
    kvport_secret *k = secret("0123456789abcdef0123");
    dx_ipport e = endpoint(2, 7001);
    kvport_auth_msg i1, c1, p1;
    assert_int_equal(handshake(k, k, e, e, &i1, &c1, &p1), 0);
    /* replayed AUTH_INIT + AUTH_PROOF at the holder */
    kvport_auth ha, ra;
    kvport_auth_msg c2, p2;
    assert_int_equal(kvport_auth_holder_challenge(&ha, k, &e, &i1, &c2), 0);
    assert_int_equal(kvport_auth_holder_verify(&ha, &p1), DX_EAUTH);
    /* replayed AUTH_CHALLENGE at a reader */
    kvport_auth_msg i2;
    assert_int_equal(kvport_auth_reader_start(&ra, k, &e, &i2), 0);
    assert_int_equal(kvport_auth_reader_prove(&ra, &c1, &p2), DX_EAUTH);
    /* the holder's own proof reflected back as the reader's */
    kvport_auth_msg refl;
    assert_int_equal(kvport_auth_holder_challenge(&ha, k, &e, &i1, &c2), 0);
    memcpy(refl.proof, c2.proof, sizeof refl.proof);
    assert_int_equal(kvport_auth_holder_verify(&ha, &refl), DX_EAUTH);
    kvport_secret_destroy(k);
}

/* A proof is bound to the holder's end of the connection: a handshake a
 * third party relays from one holder address to another fails. */
static void test_bound_to_holder_address(void **state)
{
    kvport_secret *k = secret("0123456789abcdef0123");
    assert_int_equal(handshake(k, k, endpoint(3, 7000), endpoint(4, 7000), 0, 0, 0), DX_EAUTH);
    assert_int_equal(handshake(k, k, endpoint(3, 7000), endpoint(3, 7001), 0, 0, 0), DX_EAUTH);
    kvport_secret_destroy(k);
}

static void test_one_try_in_order(void **state)
{
    kvport_secret *k = secret("0123456789abcdef0123");
    dx_ipport e = endpoint(5, 9);
    kvport_auth ra, ha;
    kvport_auth_msg i, c, p, bad = {{0}, {0}};
    memset(&ha, 0, sizeof ha);
    assert_int_equal(kvport_auth_holder_verify(&ha, &bad), DX_EAUTH); /* no challenge yet */
    memset(&ra, 0, sizeof ra);
    assert_int_equal(kvport_auth_reader_prove(&ra, &bad, &p), DX_EAUTH); /* not started */
    assert_int_equal(kvport_auth_reader_start(&ra, k, &e, &i), 0);
    assert_int_equal(kvport_auth_holder_challenge(&ha, k, &e, &i, &c), 0);
    assert_int_equal(kvport_auth_reader_prove(&ra, &c, &p), 0);
    assert_int_equal(kvport_auth_reader_prove(&ra, &c, &p), DX_EAUTH); /* twice */
    assert_int_equal(kvport_auth_holder_verify(&ha, &bad), DX_EAUTH);
    /* the right proof after a wrong one: the holder allows one try */
    assert_int_equal(kvport_auth_holder_verify(&ha, &p), DX_EAUTH);
    kvport_secret_destroy(k);
}

static char g_dir[64];

static void write_file(const char *name, const char *data, size_t n, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
    chmod(path, 0600);
}

static void test_secret_files(void **state)
{
    char path[128];
    kvport_secret *k, *k2;
    write_file("ok", "0123456789abcdef\n", 17, path, sizeof path);
    assert_int_equal(kvport_secret_load(path, &k), 0);
    /* the newline is not part of the secret */
    k2 = secret("0123456789abcdef");
    dx_ipport e = endpoint(1, 1);
    assert_int_equal(handshake(k, k2, e, e, NULL, NULL, NULL), 0);
    kvport_secret_destroy(k);
    kvport_secret_destroy(k2);
    write_file("short", "0123456789abcde\n", 16, path, sizeof path);
    assert_int_equal(kvport_secret_load(path, &k), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "short"));
    assert_non_null(strstr(dx_errmsg(), "15 bytes"));
    static char big[KVPORT_SECRET_MAX + 100];
    memset(big, 'x', sizeof big);
    write_file("long", big, sizeof big, path, sizeof path);
    assert_int_equal(kvport_secret_load(path, &k), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "over"));
    snprintf(path, sizeof path, "%s/missing", g_dir);
    assert_int_equal(kvport_secret_load(path, &k), DX_EIO);
    assert_non_null(strstr(dx_errmsg(), "missing"));
    assert_int_equal(kvport_secret_load(g_dir, &k), DX_EINVAL); /* a folder */
    assert_int_equal(kvport_secret_from_bytes("short", 5, &k), DX_EINVAL);
    /* a new one: 0600, 64 hex digits, loads, never overwrites */
    snprintf(path, sizeof path, "%s/new.secret", g_dir);
    assert_int_equal(kvport_secret_write_new(path), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, 65);
    assert_int_equal(kvport_secret_load(path, &k), 0);
    kvport_secret_destroy(k);
    assert_int_equal(kvport_secret_write_new(path), DX_EIO);
    kvport_secret_destroy(NULL);
}

static void test_listen_policy(void **state)
{
    kvport_secret *k = secret("0123456789abcdef0123");
    const char *mode = NULL;
    assert_int_equal(kvport_listen_allowed("127.0.0.1", NULL, 0, "--host", &mode), 0);
    assert_string_equal(mode, "none, loopback only");
    assert_int_equal(kvport_listen_allowed("::1", NULL, 0, "--host", &mode), 0);
    assert_int_equal(kvport_listen_allowed("localhost", NULL, 0, "--host", &mode), 0);
    assert_int_equal(kvport_listen_allowed("0.0.0.0", NULL, 0, "--kv-host", &mode), DX_EDENIED);
    assert_non_null(strstr(dx_errmsg(), "--kv-host 0.0.0.0"));
    assert_non_null(strstr(dx_errmsg(), "--kv-secret-file"));
    assert_int_equal(kvport_listen_allowed("10.9.8.7", NULL, 0, "--host", &mode), DX_EDENIED);
    assert_int_equal(kvport_listen_allowed("10.9.8.7", k, 0, "--host", &mode), 0);
    assert_string_equal(mode, "secret");
    assert_int_equal(kvport_listen_allowed("10.9.8.7", NULL, 1, "--host", &mode), 0);
    assert_non_null(strstr(mode, "--insecure-no-auth"));
    assert_int_equal(kvport_listen_allowed("no such host.invalid", k, 0, "--kv-host", &mode),
                     DX_EINVAL);
    kvport_secret_destroy(k);
}

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dx_test_kvauth_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) ? -1 : 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_right_secret),
        cmocka_unit_test(test_wrong_or_missing_secret),
        cmocka_unit_test(test_replay_and_reflection),
        cmocka_unit_test(test_bound_to_holder_address),
        cmocka_unit_test(test_one_try_in_order),
        cmocka_unit_test(test_secret_files),
        cmocka_unit_test(test_listen_policy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
