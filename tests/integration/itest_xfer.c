/* itest_xfer: two real processes on loopback — `duplex kv hold` serves
 * synthetic KV under leases, `duplex kv pull` pulls it and verifies it byte
 * for byte, both with the same cluster secret — run once with UCX's default
 * transports and once with UCX_TLS=tcp.  Covers exact pulls (adjacent,
 * scattered, 256 MiB), lease security, hash-chain divergence, a holder
 * killed mid-transfer, a stopped holder, garbage on the KV port, many pins
 * on one connection released out of order, some after they timed out, and
 * RENEW against the idle timeout.  Then the attacks on the port itself,
 * each while a well-behaved reader keeps pulling: peers without the secret
 * (wrong, none, probes before the handshake, replayed proofs, truncated and
 * oversized handshake frames) get "authentication failed" and nothing else;
 * a peer dripping bytes is closed at the handshake deadline or the idle
 * timeout; hundreds of half-open connections from many addresses; peers
 * that flood frames and never read their replies.  And the pull's test
 * hooks, refused without DUPLEX_TEST_HOOKS=1.  The throttled-link and
 * dead-link tests are itest_xfer_throttle. */
/* duplex-test: tsan */
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "engine/kv_pool.h"
#include "xfer/kvport_proto.h"
#include "xfer/xfer_lease.h"
#include "xfer/xfer_synth.h"
#include "kv_proc.h"

/* pin_ttl: NULL for the holder's default. */
static void hold_start(kp_holder *h, const char *blocks, const char *bytes, const char *ttls,
                       const char *pin_ttl)
{
    kp_hold_start(h, NULL, "--blocks", blocks, "--block-bytes", bytes, "--lease-ttls", ttls,
                  pin_ttl ? "--pin-ttl" : NULL, pin_ttl, NULL);
}

/* Runs `duplex kv pull` with the given extra args; returns its last JSON. */
static json_t *pull(const kp_holder *h, const char *token, const char *remote, ...)
{
    va_list ap;
    va_start(ap, remote);
    json_t *j = kp_vpull(h, NULL, NULL, token, remote, ap);
    va_end(ap);
    return j;
}

static void test_exact_and_security(void **state)
{
    kp_holder h;
    hold_start(&h, "64", "8192", "60,60,0.3", NULL);
    json_t *j = pull(&h, h.tok[0], "0-19", NULL);
    kp_expect_ok(j, 20);
    assert_int_equal(kp_jint(j, "reads"), 1); /* adjacent blocks coalesce into one read */
    json_decref(j);
    j = pull(&h, h.tok[0], "1,3,5-9,20", "--pool-blocks", "64", NULL);
    kp_expect_ok(j, 8);
    json_decref(j);
    /* hash chain diverging at block k pins exactly k */
    j = pull(&h, h.tok[0], "2-12", "--diverge-at", "4", NULL);
    kp_expect_ok(j, 4);
    assert_int_equal(kp_jint(j, "matched"), 4);
    json_decref(j);
    j = pull(&h, h.tok[0], "2-12", "--diverge-at", "0", NULL);
    assert_int_equal(kp_jint(j, "err"), -12); /* MISMATCH */
    json_decref(j);
    /* a token for other blocks, a wrong token, an expired token: GONE */
    j = pull(&h, h.tok[1], "0-3", NULL);
    assert_int_equal(kp_jint(j, "err"), -13);
    assert_int_equal(kp_jint(j, "pulled"), 0);
    json_decref(j);
    j = pull(&h, "0123456789abcdef0123456789abcdef", "0-3", NULL);
    assert_int_equal(kp_jint(j, "err"), -13);
    json_decref(j);
    usleep(500000); /* lease 2 had a 0.3 s TTL */
    j = pull(&h, h.tok[2], "44-46", NULL);
    assert_int_equal(kp_jint(j, "err"), -13);
    json_decref(j);
    /* different model → refused at HELLO */
    j = pull(&h, h.tok[0], "0-3", "--model-seed", "99", NULL);
    assert_int_equal(kp_jint(j, "err"), -12);
    assert_non_null(strstr(json_string_value(json_object_get(j, "reason")), "fingerprint"));
    json_decref(j);
    kp_hold_stop(&h);
}

static void test_256mib(void **state)
{
    kp_holder h;
    hold_start(&h, "128", "2097152", "60", NULL);
    json_t *j = pull(&h, h.tok[0], "0-127", "--timeout", "60", "--block-bytes", "2097152", NULL);
    kp_expect_ok(j, 128);
    assert_int_equal(kp_jint(j, "bytes"), 256l << 20);
    json_decref(j);
    kp_hold_stop(&h);
}

static void test_holder_killed(void **state)
{
    kp_holder h;
    hold_start(&h, "64", "262144", "60", NULL);
    char port[16];
    snprintf(port, sizeof port, "%d", h.port);
    char *argv[] = {
        "duplex", "kv",        "pull", "--port",        port,     "--token",
        h.tok[0], "--remote",  "0-63", "--fill-seed",   "7",      "--pause-after-pin-ms",
        "2000",   "--timeout", "5",    "--block-bytes", "262144", "--kv-secret-file",
        g_secret, NULL};
    kp_proc p;
    kp_spawn(&p, NULL, argv);
    json_t *j = kp_next_json(&p, 30000);
    assert_non_null(j);
    assert_non_null(json_object_get(j, "pinned"));
    json_decref(j);
    kill(h.p.pid, SIGKILL);
    g_holder = -1;
    kp_reap(&h.p, 10);
    j = kp_next_json(&p, 30000);
    assert_non_null(j);
    assert_int_equal(kp_jint(j, "leaked"), 0);
    /* Over shared memory the reader has the holder's pool attached since
     * HELLO, so the reads themselves may complete after the holder died; but
     * nobody answers RELEASE, so nothing vouches that the pin held, and the
     * pull must fail all the same. */
    assert_int_not_equal(kp_jint(j, "err"), 0);
    assert_int_equal(kp_jint(j, "pulled"), 0);
    json_decref(j);
    kp_reap(&p, 30);
}

static void test_holder_stopped(void **state)
{
    kp_holder h;
    hold_start(&h, "16", "8192", "60", NULL);
    kill(h.p.pid, SIGSTOP);
    json_t *j = pull(&h, h.tok[0], "0-7", "--timeout", "1", NULL);
    assert_int_equal(kp_jint(j, "err"), -10); /* DX_ETIMEDOUT */
    assert_int_equal(kp_jint(j, "leaked"), 0);
    json_decref(j);
    kill(h.p.pid, SIGCONT);
    j = pull(&h, h.tok[0], "0-7", NULL);
    kp_expect_ok(j, 8);
    json_decref(j);
    kp_hold_stop(&h);
}

static void test_garbage_frames(void **state)
{
    kp_holder h;
    hold_start(&h, "16", "8192", "60", NULL);
    static uint8_t buf[1 << 16];
    kvport_msg m;
    /* garbage: ERROR frame, then the holder closes that connection */
    int fd = kp_connect_from(h.port, NULL);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(write(fd, junk, sizeof junk - 1), (ssize_t)(sizeof junk - 1));
    assert_int_equal(kp_read_frame(fd, &m, buf, sizeof buf), KVPORT_ERROR);
    assert_int_equal(kp_read_frame(fd, &m, buf, sizeof buf), 0);
    close(fd);
    /* authenticated: a PIN whose payload is truncated, then an unknown type:
     * ERROR each, and the connection stays usable */
    fd = kp_authed(h.port);
    uint8_t fr[32] = {0x44, 0x58, 0x4b, 0x56, KVPORT_VERSION, 0, KVPORT_PIN, 0, 5, 0, 0, 0};
    memcpy(fr + KVPORT_HDR_BYTES, "\1\2\3\4\5", 5);
    assert_int_equal(write(fd, fr, 17), 17);
    assert_int_equal(kp_read_frame(fd, &m, buf, sizeof buf), KVPORT_ERROR);
    assert_int_equal(m.u.error.code, -5); /* DX_EFORMAT */
    uint8_t unk[12] = {0x44, 0x58, 0x4b, 0x56, KVPORT_VERSION, 0, 99, 0, 0, 0, 0, 0};
    assert_int_equal(write(fd, unk, 12), 12);
    assert_int_equal(kp_read_frame(fd, &m, buf, sizeof buf), KVPORT_ERROR);
    uint8_t badver[12] = {0x44, 0x58, 0x4b, 0x56, 9, 0, KVPORT_PIN, 0, 0, 0, 0, 0};
    assert_int_equal(write(fd, badver, 12), 12);
    assert_int_equal(kp_read_frame(fd, &m, buf, sizeof buf), KVPORT_ERROR);
    close(fd);
    /* a truncated frame and a hang-up mid-frame */
    fd = kp_connect_from(h.port, NULL);
    assert_int_equal(write(fd, fr, 14), 14);
    close(fd);
    /* the holder still serves */
    json_t *j = pull(&h, h.tok[0], "0-15", NULL);
    kp_expect_ok(j, 16);
    json_decref(j);
    kp_hold_stop(&h);
}

/* The reader's view of holder h's first lease: its token and the hash
 * chain of blocks 0-1 (same layout, model seed 1, fill seed 7). */
static void holder_lease(const kp_holder *h, xfer_token *t, kv_hash chain[2])
{
    kv_pool_config cfg;
    uint8_t fp[16];
    kv_pool *pool;
    assert_int_equal(xfer_synth_layout(8192, 16, 1, &cfg, fp), 0);
    assert_int_equal(kv_pool_create(&cfg, &pool), 0);
    xfer_synth_chain(pool, 7, 2, chain);
    kv_pool_destroy(pool);
    assert_int_equal(xfer_token_parse(h->tok[0], t), 0);
}

/* Pin deadlines as the reader can bound them without trusting its speed:
 * the holder's deadline for a pin lies between (time the PIN was sent) +
 * TTL and (time its PIN_OK arrived) + TTL.  A pin is surely live for an
 * answer that arrived before the first bound, and surely gone for a request
 * sent after the second; in between, either answer is right. */
typedef struct {
    uint64_t sent_ns, answered_ns;
} pin_time;

/* PINs blocks 0-1 n times over fd; the pin ids go to ids[] and their times
 * to at[] (may be NULL), each PIN_OK's pin TTL must be ttl_ms (0: any). */
static void pin_many(int fd, const xfer_token *t, const kv_hash *chain, uint64_t *ids, int n,
                     uint32_t ttl_ms, uint8_t *buf, size_t cap, pin_time *at)
{
    int32_t blk[2] = {0, 1};
    uint64_t hs[4] = {chain[0].lo, chain[0].hi, chain[1].lo, chain[1].hi};
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_msg m;
    for (int i = 0; i < n; i++) {
        assert_int_equal(kvport_encode_pin(&b, t->b, blk, hs, 2), 0);
        if (at) at[i].sent_ns = dx_now_ns();
        kp_send(fd, &b);
        assert_int_equal(kp_read_frame(fd, &m, buf, cap), KVPORT_PIN_OK);
        if (at) at[i].answered_ns = dx_now_ns();
        assert_int_equal(m.u.pin_ok.n_matched, 2);
        if (ttl_ms) assert_int_equal(m.u.pin_ok.ttl_ms, ttl_ms);
        ids[i] = m.u.pin_ok.pin_id;
    }
    dx_buf_free(&b);
}

/* RELEASE one pin; returns the reply type (and the error code in *code). */
static int release_one(int fd, uint64_t id, uint8_t *buf, size_t cap, int *code)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_release rel = {id, 0};
    assert_int_equal(kvport_encode_release(&b, &rel), 0);
    kp_send(fd, &b);
    dx_buf_free(&b);
    kvport_msg m;
    int type = kp_read_frame(fd, &m, buf, cap);
    *code = type == KVPORT_ERROR ? m.u.error.code : 0;
    return type;
}

/* RELEASE of a pin made at `at` with a TTL of ttl_ns: RELEASE_OK while the
 * pin is surely live when the answer arrives; after that, ENOENT (it timed
 * out on a slow machine) is right too. */
static void release_live(int fd, uint64_t id, pin_time at, uint64_t ttl_ns, uint8_t *buf,
                         size_t cap)
{
    int code;
    int type = release_one(fd, id, buf, cap, &code);
    if (dx_now_ns() < at.sent_ns + ttl_ns)
        assert_int_equal(type, KVPORT_RELEASE_OK);
    else
        assert_true(type == KVPORT_RELEASE_OK || (type == KVPORT_ERROR && code == -8));
}

static void sleep_until(uint64_t t_ns)
{
    for (uint64_t now; (now = dx_now_ns()) < t_ns;) {
        uint64_t d = t_ns - now;
        struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

static void test_many_pins_one_connection(void **state)
{
    kp_holder h;
    hold_start(&h, "16", "8192", "60", "1.5");
    static uint8_t buf[1 << 16];
    kv_hash chain[2];
    xfer_token t;
    holder_lease(&h, &t, chain);
    int fd = kp_authed(h.port), code;
    /* 100 pins; the odd ones released newest first, the even ones left to
     * time out */
    enum { N1 = 100, N2 = 300 };
    const uint64_t ttl = 1500000000ull;
    uint64_t first[N1], second[N2];
    static pin_time at1[N1], at2[N2];
    pin_many(fd, &t, chain, first, N1, 1500, buf, sizeof buf, at1);
    for (int i = N1 - 1; i > 0; i -= 2) {
        release_live(fd, first[i], at1[i], ttl, buf, sizeof buf);
        assert_int_equal(release_one(fd, first[i], buf, sizeof buf, &code), KVPORT_ERROR);
        assert_int_equal(code, -8); /* DX_ENOENT: released already, or timed out */
    }
    assert_int_equal(release_one(fd, first[N1 - 1] + 100000, buf, sizeof buf, &code), KVPORT_ERROR);
    assert_int_equal(code, -8);
    sleep_until(at1[N1 - 1].answered_ns + ttl +
                100000000); /* the even pins are past their deadline */
    /* enough new pins that the connection forgets the dead ones on the way;
     * released in an order unrelated to their ids */
    pin_many(fd, &t, chain, second, N2, 1500, buf, sizeof buf, at2);
    for (int k = 0; k < N2; k++) {
        int i = (k * 7) % N2; /* 7 is coprime to 300 */
        release_live(fd, second[i], at2[i], ttl, buf, sizeof buf);
    }
    /* timed-out pins: ENOENT, whether or not the connection still listed them */
    for (int i = 0; i < N1; i += 2) {
        assert_int_equal(release_one(fd, first[i], buf, sizeof buf, &code), KVPORT_ERROR);
        assert_int_equal(code, -8);
    }
    close(fd);
    /* the holder still serves */
    json_t *j = pull(&h, h.tok[0], "0-15", NULL);
    kp_expect_ok(j, 16);
    json_decref(j);
    kp_hold_stop(&h);
}

/* Sends a RENEW of pin `id`; returns the reply type (0: connection closed)
 * and the TTL or error code in *val. */
static int renew_one(int fd, uint64_t id, uint8_t *buf, size_t cap, long *val)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_renew rn = {id};
    assert_int_equal(kvport_encode_renew(&b, &rn), 0);
    kp_send(fd, &b);
    dx_buf_free(&b);
    kvport_msg m;
    int type = kp_read_frame(fd, &m, buf, cap);
    *val = type == KVPORT_RENEW_OK ? (long)m.u.renew_ok.ttl_ms : type ? (long)m.u.error.code : 0;
    return type;
}

/* RENEW over the wire, and the idle timeout against live pins: PIN_OK says
 * the pin TTL; a connection silent for longer than the idle timeout stays
 * open while it holds a live pin; only that connection may renew; a pin past
 * its deadline is GONE; once its pins are gone an idle connection closes.
 * Deadlines are bounded as pin_time says, so a slow machine cannot turn a
 * right answer into a failure (where it makes the first RENEW come too late
 * to be sure of, the test says it skipped). */
static void test_renew_and_idle(void **state)
{
    kp_holder h;
    const uint64_t ttl = 4000000000ull;
    kp_hold_start(&h, NULL, "--blocks", "16", "--block-bytes", "8192", "--pin-ttl", "4",
                  "--idle-timeout-s", "1", NULL);
    static uint8_t buf[1 << 16];
    kv_hash chain[2];
    xfer_token t;
    holder_lease(&h, &t, chain);
    int fd = kp_authed(h.port);
    uint64_t id;
    pin_time at;
    pin_many(fd, &t, chain, &id, 1, 4000, buf, sizeof buf, &at);
    long val;
    /* over twice the idle timeout in silence, inside the pin TTL */
    sleep_until(at.answered_ns + 2200000000ull);
    int type = renew_one(fd, id, buf, sizeof buf, &val);
    uint64_t renewed = dx_now_ns(); /* the new deadline is at most renewed + ttl */
    if (renewed >= at.sent_ns + ttl) {
        close(fd);
        kp_hold_stop(&h);
        skip(); /* the machine stalled past the pin's deadline: nothing sure to check */
    }
    assert_int_equal(type, KVPORT_RENEW_OK);
    assert_int_equal(val, 4000);
    /* another connection may neither renew nor release it */
    int other = kp_authed(h.port);
    assert_int_equal(renew_one(other, id, buf, sizeof buf, &val), KVPORT_ERROR);
    assert_int_equal(val, -8); /* DX_ENOENT */
    int code;
    assert_int_equal(release_one(other, id, buf, sizeof buf, &code), KVPORT_ERROR);
    assert_int_equal(code, -8);
    close(other);
    /* stop renewing; keep the connection busy (RENEWs of a pin it never
     * made, well inside the idle timeout) until the pin's deadline has
     * surely passed, then it is GONE */
    while (dx_now_ns() < renewed + ttl + 50000000) {
        sleep_until(dx_now_ns() + 50000000);
        assert_int_equal(renew_one(fd, id + 1000, buf, sizeof buf, &val), KVPORT_ERROR);
    }
    assert_int_equal(renew_one(fd, id, buf, sizeof buf, &val), KVPORT_GONE);
    assert_int_equal(val, -13); /* DX_EGONE */
    /* no live pins any more: silence now closes the connection */
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 10000), 1);
    assert_int_equal(read(fd, buf, sizeof buf), 0);
    close(fd);
    kp_hold_stop(&h);
}

/* ---- attacks on the port ------------------------------------------------- */

static void expect_pull_ok(const kp_holder *h)
{
    json_t *j = pull(h, h->tok[0], "0-15", NULL);
    kp_expect_ok(j, 16);
    json_decref(j);
}

/* What a reader without the secret can get from a holder: "authentication
 * failed", never its HELLO (remote key, worker address, pool base, layout)
 * — not by probing before the handshake, not with a wrong or no secret,
 * not by replaying a recorded handshake, not with cut or oversized
 * handshake frames — while the right secret pulls as before. */
static void test_auth_required(void **state)
{
    kp_holder h;
    hold_start(&h, "16", "8192", "60", NULL);
    dx_buf b;
    dx_buf_init(&b, 0);
    /* a HELLO probe (another model's) before authenticating */
    kvport_hello probe = {.engine_id = {(const uint8_t *)"probe", 5}, .n_layer = 1};
    int fd = kp_connect_from(h.port, NULL);
    assert_int_equal(kvport_encode_hello(&b, &probe), 0);
    kp_send(fd, &b);
    kp_expect_auth_failed(fd, 0);
    /* AUTH_INIT, then a PIN instead of the proof */
    fd = kp_connect_from(h.port, NULL);
    kvport_auth_msg a = {{1, 2, 3}, {0}};
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_INIT, &a), 0);
    kp_send(fd, &b);
    uint8_t tok[16] = {0};
    int32_t id = 0;
    uint64_t hs[2] = {0, 0};
    assert_int_equal(kvport_encode_pin(&b, tok, &id, hs, 1), 0);
    kp_send(fd, &b);
    kp_expect_auth_failed(fd, KVPORT_HDR_BYTES + KVPORT_NONCE_BYTES + KVPORT_PROOF_BYTES);
    /* a made-up proof */
    fd = kp_connect_from(h.port, NULL);
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_INIT, &a), 0);
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_PROOF, &a), 0);
    kp_send(fd, &b);
    kp_expect_auth_failed(fd, KVPORT_HDR_BYTES + KVPORT_NONCE_BYTES + KVPORT_PROOF_BYTES);
    /* an oversized frame before authenticating: refused at its header */
    fd = kp_connect_from(h.port, NULL);
    uint8_t big[12] = {0x44, 0x58, 0x4b, 0x56, KVPORT_VERSION, 0, KVPORT_AUTH_INIT, 0, 0, 0, 1, 0};
    assert_int_equal(write(fd, big, sizeof big), (ssize_t)sizeof big);
    kp_expect_auth_failed(fd, 0);
    /* a wrong secret and no secret: the reader refuses the holder first */
    char other[160];
    snprintf(other, sizeof other, "%s.other", g_secret);
    unlink(other);
    assert_int_equal(kvport_secret_write_new(other), 0);
    fd = kp_connect_from(h.port, NULL);
    assert_int_equal(kp_auth(fd, other), DX_EAUTH);
    close(fd);
    const char *bad[] = {other, ""};
    for (int i = 0; i < 2; i++) {
        g_pull_secret = bad[i];
        json_t *j = pull(&h, h.tok[0], "0-15", NULL);
        g_pull_secret = NULL;
        assert_int_equal(kp_jint(j, "err"), DX_EAUTH);
        assert_int_equal(kp_jint(j, "pulled"), 0);
        assert_int_equal(kp_jint(j, "leaked"), 0);
        assert_non_null(strstr(kp_jstr(j, "reason"), "authentication failed"));
        json_decref(j);
    }
    unlink(other);
    /* every cut of a handshake, then a hang-up */
    uint8_t init[KVPORT_HDR_BYTES + KVPORT_NONCE_BYTES];
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_INIT, &a), 0);
    memcpy(init, b.data, sizeof init);
    b.len = 0;
    for (size_t cut = 0; cut < sizeof init; cut++) {
        fd = kp_connect_from(h.port, NULL);
        if (cut) assert_int_equal(write(fd, init, cut), (ssize_t)cut);
        shutdown(fd, SHUT_WR);
        static uint8_t none[64];
        assert_int_equal(kp_read_to_eof(fd, none, sizeof none), 0); /* closed, nothing said */
        close(fd);
    }
    /* a recorded handshake replayed: the holder's fresh nonce defeats it */
    kvport_auth_msg ri, rp;
    fd = kp_connect_from(h.port, NULL);
    assert_int_equal(kp_auth_rec(fd, g_secret, &ri, &rp), 0);
    close(fd);
    fd = kp_connect_from(h.port, NULL);
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_INIT, &ri), 0);
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_PROOF, &rp), 0);
    kp_send(fd, &b);
    kp_expect_auth_failed(fd, KVPORT_HDR_BYTES + KVPORT_NONCE_BYTES + KVPORT_PROOF_BYTES);
    dx_buf_free(&b);
    expect_pull_ok(&h);
    kp_hold_stop(&h);
}

/* Writes bytes one at a time, `ms` apart, until all are sent or the holder
 * closes the connection; returns how many it took. */
static size_t drip(int fd, const uint8_t *p, size_t n, int ms)
{
    uint8_t junk[256];
    for (size_t i = 0; i < n; i++) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, ms) > 0) {
            ssize_t r = read(fd, junk, sizeof junk);
            if (r <= 0) return i;
        }
        if (write(fd, p + i, 1) != 1) return i;
    }
    return n;
}

/* Dripping keeps nothing open: a handshake that is not done 1 s after the
 * connect is closed however the bytes trickle in, and once authenticated a
 * partial frame trickling in does not count as activity — the 1 s idle
 * timeout counts from the last complete frame.  Each drip would take 11 s
 * in full (and kept the connection forever before). */
static void test_drip(void **state)
{
    kp_holder h;
    kp_hold_start(&h, NULL, "--blocks", "16", "--block-bytes", "8192", "--handshake-timeout-s", "1",
                  "--idle-timeout-s", "1", NULL);
    dx_buf b;
    dx_buf_init(&b, 0);
    kvport_auth_msg a = {{7}, {0}};
    assert_int_equal(kvport_encode_auth(&b, KVPORT_AUTH_INIT, &a), 0);
    int fd = kp_connect_from(h.port, NULL);
    size_t sent = drip(fd, (const uint8_t *)b.data, b.len, 250);
    if (sent == b.len) fail_msg("a connection dripping its handshake stayed open");
    close(fd);
    expect_pull_ok(&h);
    /* authenticated, then a PIN frame at 4 bytes per second */
    uint8_t tok[16] = {0};
    int32_t id = 0;
    uint64_t hs[2] = {0, 0};
    b.len = 0;
    assert_int_equal(kvport_encode_pin(&b, tok, &id, hs, 1), 0);
    fd = kp_authed(h.port);
    sent = drip(fd, (const uint8_t *)b.data, b.len, 250);
    if (sent == b.len) fail_msg("an authenticated connection dripping a frame stayed open");
    close(fd);
    dx_buf_free(&b);
    expect_pull_ok(&h);
    kp_hold_stop(&h);
}

/* Hundreds of connections that start a handshake and stall, from 20
 * loopback addresses: the per-address cap closes the extra ones at once,
 * the oldest give way to new ones past the total, so a well-behaved reader
 * still authenticates and pulls; the handshake deadline then closes them
 * all. */
static void test_many_connections(void **state)
{
    kp_holder h;
    kp_hold_start(&h, NULL, "--blocks", "16", "--block-bytes", "8192", "--handshake-timeout-s", "3",
                  NULL);
    enum { N_ADDR = 20, PER_ADDR = 12, N = N_ADDR * PER_ADDR };
    static int fds[N];
    for (int i = 0; i < N; i++) {
        char src[32];
        snprintf(src, sizeof src, "127.0.0.%d", 2 + i / PER_ADDR);
        fds[i] = kp_connect_from(h.port, src);
        assert_int_equal(write(fds[i], "DXKV\3", 5), 5); /* a header begun, never finished */
    }
    expect_pull_ok(&h);
    expect_pull_ok(&h);
    /* at most 8 per address and 64 in all are still open: poll until the
     * holder has dealt with every connect */
    int open = N;
    for (int tries = 0; tries < 200 && open > 64; tries++) {
        open = 0;
        for (int i = 0; i < N; i++) {
            if (fds[i] < 0) continue;
            struct pollfd pf = {.fd = fds[i], .events = POLLIN};
            uint8_t c;
            if (poll(&pf, 1, 0) > 0 && read(fds[i], &c, 1) <= 0) {
                close(fds[i]);
                fds[i] = -1;
            } else {
                open++;
            }
        }
        if (open > 64) usleep(50000);
    }
    if (open > 64) fail_msg("%d unauthenticated connections still open (cap 64)", open);
    /* and past the handshake deadline, none */
    uint8_t buf[256];
    for (int i = 0; i < N; i++) {
        if (fds[i] < 0) continue;
        if (kp_read_to_eof(fds[i], buf, sizeof buf) < 0)
            fail_msg("connection %d outlived the handshake deadline", i);
        close(fds[i]);
    }
    expect_pull_ok(&h);
    kp_hold_stop(&h);
}

static long vm_rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kb;
}

/* Sends frames the holder answers with ERROR, never reading the answers,
 * until the holder stops reading (our writes block for 2 s); returns the
 * bytes sent.  Fails if the holder closed the connection instead. */
static size_t flood(int fd)
{
    static uint8_t frames[12 * 4096];
    uint8_t unk[12] = {0x44, 0x58, 0x4b, 0x56, KVPORT_VERSION, 0, 99, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < sizeof frames; i += 12) memcpy(frames + i, unk, 12);
    size_t sent = 0, off = 0;
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (poll(&pf, 1, 2000) == 0) return sent; /* the holder stopped reading */
        ssize_t w = send(fd, frames + off, sizeof frames - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno == EAGAIN) continue;
        if (w <= 0) fail_msg("the holder dropped a flooding peer instead of pausing it");
        sent += (size_t)w;
        off = (off + (size_t)w) % sizeof frames;
        if (sent > (512u << 20)) fail_msg("the holder read 512 MiB of frames without pausing");
    }
}

/* Peers that send and never read cost the holder one reply budget each
 * (1 MiB, write requests counted), not tens of MB: it stops reading from
 * them, and keeps serving a well-behaved reader. */
static void test_flood_without_reading(void **state)
{
    kp_holder h;
    /* Under ASan freed memory waits in a quarantine (256 MB) before reuse,
     * which RSS would count: the holder runs without one here. */
    const char *asan = getenv("ASAN_OPTIONS");
    char *saved = asan ? strdup(asan) : NULL, opts[512];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=0", asan ? asan : "", asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    kp_hold_start(&h, NULL, "--blocks", "16", "--block-bytes", "8192", "--idle-timeout-s", "600",
                  NULL);
    if (saved)
        setenv("ASAN_OPTIONS", saved, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(saved);
    expect_pull_ok(&h);
    long before = vm_rss_kb(h.p.pid);
    enum { N = 4 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = kp_authed(h.port);
        int small = 64 << 10; /* our receive buffer: the replies back up at the holder soon */
        setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        size_t sent = flood(fds[i]);
        print_message("flooder %d: %zu bytes sent before the holder paused it\n", i, sent);
    }
    expect_pull_ok(&h);
    long after = vm_rss_kb(h.p.pid);
    print_message("holder RSS: %ld kB before, %ld kB with %d flooders paused\n", before, after, N);
    if (after - before > 32 * 1024)
        fail_msg("%d paused flooders cost the holder %ld kB", N, after - before);
    for (int i = 0; i < N; i++) close(fds[i]);
    expect_pull_ok(&h);
    kp_hold_stop(&h);
}

/* UCX's own warnings (here: an environment variable it does not know) go
 * to stderr, never into the JSON lines on stdout (kp_next_json fails the
 * test on any other line), in the holder and in the reader. */
static void test_stdout_stays_json(void **state)
{
    setenv("UCX_DUPLEX_ITEST_UNUSED", "1", 1);
    kp_holder h;
    hold_start(&h, "16", "8192", "60", NULL);
    json_t *j = pull(&h, h.tok[0], "0-15", NULL);
    unsetenv("UCX_DUPLEX_ITEST_UNUSED");
    kp_expect_ok(j, 16);
    json_decref(j);
    kp_hold_stop(&h);
    /* and the warning did go somewhere: stderr */
    char cmd[512], out[8192];
    snprintf(cmd, sizeof cmd,
             "UCX_DUPLEX_ITEST_UNUSED=1 %s kv pull --port 1 --token "
             "0123456789abcdef0123456789abcdef --timeout 1 2>&1 >/dev/null",
             g_bin);
    FILE *f = popen(cmd, "r");
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    pclose(f);
    if (!strstr(out, "unused env variable: UCX_DUPLEX_ITEST_UNUSED"))
        fail_msg("UCX's warning is not on stderr:\n%s", out);
}

/* Runs a shell command with stdout and stderr in out; its exit code. */
static int run_sh(const char *cmd, char *out, size_t cap)
{
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The test hooks of `duplex kv pull` (--pause-after-pin-ms, --no-renew)
 * are no part of the product: --help lists neither, and without
 * DUPLEX_TEST_HOOKS=1 each is refused before anything is pulled, naming the
 * flag and the variable.  With it they are taken (main sets it for every
 * pull here; test_holder_killed sees the pause, itest_xfer_throttle's
 * test_lapsed_pin_fails_the_pull the missing renewals). */
static void test_hooks_need_the_variable(void **state)
{
    static const char *const envs[] = {"env -u DUPLEX_TEST_HOOKS", "env DUPLEX_TEST_HOOKS=0",
                                       "env DUPLEX_TEST_HOOKS="};
    static const char *const hooks[][2] = {{"--no-renew", "--no-renew"},
                                           {"--pause-after-pin-ms 5", "--pause-after-pin-ms"},
                                           {"--pause-after-pin-ms=5", "--pause-after-pin-ms"}};
    char cmd[512], out[8192], want[160];
    for (size_t e = 0; e < DX_ARRAY_LEN(envs); e++)
        for (size_t k = 0; k < DX_ARRAY_LEN(hooks); k++) {
            snprintf(cmd, sizeof cmd,
                     "%s %s kv pull --port 1 --token 0123456789abcdef0123456789abcdef "
                     "--timeout 1 %s 2>&1",
                     envs[e], g_bin, hooks[k][0]);
            int rc = run_sh(cmd, out, sizeof out);
            snprintf(want, sizeof want,
                     "duplex kv pull: %s is a test hook, accepted only with "
                     "DUPLEX_TEST_HOOKS=1 in the environment",
                     hooks[k][1]);
            if (rc != 2 || !strstr(out, want) || strchr(out, '{'))
                fail_msg("%s: status %d (want 2 and no pull), output:\n%s", cmd, rc, out);
        }
    for (size_t e = 0; e < 2; e++) {
        snprintf(cmd, sizeof cmd, "%s %s kv pull --help 2>&1",
                 e ? "env DUPLEX_TEST_HOOKS=1" : "env -u DUPLEX_TEST_HOOKS", g_bin);
        assert_int_equal(run_sh(cmd, out, sizeof out), 0);
        if (!strstr(out, "--kv-secret-file") || strstr(out, "pause-after-pin") ||
            strstr(out, "no-renew") || strstr(out, "hook"))
            fail_msg("%s lists a test hook (or not the options):\n%s", cmd, out);
    }
    /* with the variable both are taken, and the pull is whole */
    kp_holder h;
    hold_start(&h, "16", "8192", "60", NULL);
    json_t *j = pull(&h, h.tok[0], "0-3", "--pause-after-pin-ms", "1", "--no-renew", NULL);
    kp_expect_ok(j, 4);
    assert_int_equal(kp_jint(j, "renewals"), 0);
    json_decref(j);
    kp_hold_stop(&h);
}

#define T(f) cmocka_unit_test_teardown(f, kp_kill_holder)

int main(void)
{
    g_bin = getenv("DUPLEX_BIN");
    if (!g_bin) g_bin = "build/release/duplex";
    signal(SIGPIPE, SIG_IGN);
    /* for the pulls that use the test hooks (docs/testing.md, "Test hooks") */
    setenv("DUPLEX_TEST_HOOKS", "1", 1);
    char dir[] = "/tmp/dx_itest_xfer_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    kp_make_secret(dir);
    const struct CMUnitTest tests[] = {
        T(test_exact_and_security),
        T(test_256mib),
        T(test_holder_killed),
        T(test_holder_stopped),
        T(test_garbage_frames),
        T(test_many_pins_one_connection),
        T(test_renew_and_idle),
        T(test_auth_required),
        T(test_drip),
        T(test_many_connections),
        T(test_flood_without_reading),
        T(test_stdout_stays_json),
        T(test_hooks_need_the_variable),
    };
    int fails = 0;
    const char *user_tls = getenv("UCX_TLS");
    if (!user_tls) {
        fails += cmocka_run_group_tests_name("xfer (UCX default transports)", tests, NULL, NULL);
        setenv("UCX_TLS", "tcp", 1);
        fails += cmocka_run_group_tests_name("xfer (UCX_TLS=tcp)", tests, NULL, NULL);
    } else {
        fails +=
            cmocka_run_group_tests_name("xfer (UCX_TLS from the environment)", tests, NULL, NULL);
    }
    unlink(g_secret);
    rmdir(dir);
    return fails ? 1 : 0;
}
