/* kvport_auth: secrets and the handshake's proofs (see .h).  The state in
 * kvport_auth only enforces the order of the steps; every proof is a pure
 * function of the key and the transcript, which the unit tests exploit to
 * replay and reflect messages. */
#include "xfer/kvport_auth.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_log.h"

struct kvport_secret {
    size_t n;
    uint8_t b[];
};

enum { STEP_NONE, STEP_READER_STARTED, STEP_HOLDER_CHALLENGED, STEP_DONE };

static int sodium_ready(void)
{
    /* thread-safe, and cheap after the first call */
    return sodium_init() < 0 ? dx_errf(DX_EIO, "libsodium failed to initialise") : 0;
}

int kvport_secret_from_bytes(const void *p, size_t n, kvport_secret **out)
{
    *out = NULL;
    if (n < KVPORT_SECRET_MIN || n > KVPORT_SECRET_MAX)
        return dx_errf(DX_EINVAL, "KV secret of %zu bytes: want %u to %u", n, KVPORT_SECRET_MIN,
                       KVPORT_SECRET_MAX);
    int rc = sodium_ready();
    if (rc) return rc;
    kvport_secret *s = dx_malloc(sizeof *s + n);
    if (!s) return dx_errf(DX_ENOMEM, "out of memory for the KV secret");
    s->n = n;
    memcpy(s->b, p, n);
    *out = s;
    return 0;
}

void kvport_secret_destroy(kvport_secret *s)
{
    if (!s) return;
    sodium_memzero(s->b, s->n);
    dx_free(s);
}

static int read_all(int fd, uint8_t *buf, size_t cap, size_t *n)
{
    *n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + *n, cap - *n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0 || (*n += (size_t)r) == cap) return 0;
    }
}

int kvport_secret_load(const char *path, kvport_secret **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dx_errf(DX_EIO, "KV secret file %s: %s", path, strerror(errno));
    struct stat st;
    uint8_t buf[KVPORT_SECRET_MAX + 2];
    size_t n = 0;
    int rc = fstat(fd, &st) < 0 ? dx_errf(DX_EIO, "KV secret file %s: %s", path, strerror(errno))
             : !S_ISREG(st.st_mode) ? dx_errf(DX_EINVAL, "KV secret file %s is not a file", path)
             : read_all(fd, buf, sizeof buf, &n)
                 ? dx_errf(DX_EIO, "reading KV secret file %s", path)
                 : 0;
    close(fd);
    while (!rc && n &&
           (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    if (!rc && (n < KVPORT_SECRET_MIN || n > KVPORT_SECRET_MAX))
        rc = dx_errf(DX_EINVAL, "KV secret file %s holds %s%zu bytes: want %u to %u", path,
                     n > KVPORT_SECRET_MAX ? "over " : "", n, KVPORT_SECRET_MIN, KVPORT_SECRET_MAX);
    if (!rc) rc = kvport_secret_from_bytes(buf, n, out);
    sodium_memzero(buf, sizeof buf);
    if (!rc && (st.st_mode & 077))
        DX_LOGW("KV secret file %s may be read by other users (mode %03o): chmod 600 it", path,
                (unsigned)(st.st_mode & 0777));
    return rc;
}

int kvport_secret_write_new(const char *path)
{
    int rc = sodium_ready();
    if (rc) return rc;
    uint8_t raw[32];
    char hex[2 * sizeof raw + 2];
    randombytes_buf(raw, sizeof raw);
    sodium_bin2hex(hex, sizeof hex - 1, raw, sizeof raw);
    size_t n = strlen(hex);
    hex[n++] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) rc = dx_errf(DX_EIO, "creating KV secret file %s: %s", path, strerror(errno));
    if (!rc && write(fd, hex, n) != (ssize_t)n)
        rc = dx_errf(DX_EIO, "writing KV secret file %s: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) < 0 && !rc)
        rc = dx_errf(DX_EIO, "writing KV secret file %s: %s", path, strerror(errno));
    sodium_memzero(raw, sizeof raw);
    sodium_memzero(hex, sizeof hex);
    if (rc && fd >= 0) unlink(path);
    return rc;
}

int kvport_listen_allowed(const char *host, const kvport_secret *s, int insecure, const char *flag,
                          const char **mode)
{
    int lo = dx_addr_host_is_loopback(host);
    if (lo < 0) return dx_err_wrap(lo, "%s", flag);
    *mode = s ? "secret" : lo ? "none, loopback only" : NULL;
    if (*mode) return 0;
    if (insecure) {
        *mode = "NONE (--insecure-no-auth: anyone who reaches it can read the KV pool)";
        return 0;
    }
    return dx_errf(DX_EDENIED,
                   "%s %s is not a loopback address: a KV port there needs --kv-secret-file (or "
                   "--insecure-no-auth to let anyone who reaches it read the KV pool)",
                   flag, host);
}

/* The proof of the side named by label over this handshake's transcript. */
static void proof_of(const kvport_auth *a, const char *label, uint8_t out[KVPORT_PROOF_BYTES])
{
    static const uint8_t empty[1];
    static const char ctx[] = "duplex-kvport-auth";
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, a->key ? a->key->b : empty, a->key ? a->key->n : 0);
    uint8_t ver[2] = {KVPORT_VERSION & 0xff, KVPORT_VERSION >> 8};
    uint8_t port[2] = {(uint8_t)(a->holder.port & 0xff), (uint8_t)(a->holder.port >> 8)};
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)ctx, sizeof ctx); /* with its NUL */
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, strlen(label) + 1);
    crypto_auth_hmacsha256_update(&st, ver, sizeof ver);
    crypto_auth_hmacsha256_update(&st, a->nonce_r, sizeof a->nonce_r);
    crypto_auth_hmacsha256_update(&st, a->nonce_h, sizeof a->nonce_h);
    crypto_auth_hmacsha256_update(&st, a->holder.ip, sizeof a->holder.ip);
    crypto_auth_hmacsha256_update(&st, port, sizeof port);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

static int check_proof(kvport_auth *a, const char *label, const uint8_t got[KVPORT_PROOF_BYTES])
{
    uint8_t want[KVPORT_PROOF_BYTES];
    proof_of(a, label, want);
    int bad = sodium_memcmp(want, got, sizeof want);
    sodium_memzero(want, sizeof want);
    a->step = STEP_DONE; /* one try per handshake, right or wrong */
    return bad ? dx_errf(DX_EAUTH, "authentication failed") : 0;
}

static int wrong_step(kvport_auth *a)
{
    a->step = STEP_DONE;
    return dx_errf(DX_EAUTH, "authentication failed (out-of-order handshake)");
}

int kvport_auth_reader_start(kvport_auth *a, const kvport_secret *key, const dx_ipport *holder,
                             kvport_auth_msg *init)
{
    memset(a, 0, sizeof *a);
    int rc = sodium_ready();
    if (rc) return rc;
    a->key = key;
    a->holder = *holder;
    randombytes_buf(a->nonce_r, sizeof a->nonce_r);
    memset(init, 0, sizeof *init);
    memcpy(init->nonce, a->nonce_r, sizeof a->nonce_r);
    a->step = STEP_READER_STARTED;
    return 0;
}

int kvport_auth_reader_prove(kvport_auth *a, const kvport_auth_msg *challenge,
                             kvport_auth_msg *proof)
{
    if (a->step != STEP_READER_STARTED) return wrong_step(a);
    memcpy(a->nonce_h, challenge->nonce, sizeof a->nonce_h);
    int rc = check_proof(a, "holder", challenge->proof);
    if (rc)
        return dx_errf(rc, "authentication failed: the holder does not know this node's KV "
                           "secret (--kv-secret-file differs, or one side has none)");
    memset(proof, 0, sizeof *proof);
    proof_of(a, "reader", proof->proof);
    return 0;
}

int kvport_auth_holder_challenge(kvport_auth *a, const kvport_secret *key, const dx_ipport *holder,
                                 const kvport_auth_msg *init, kvport_auth_msg *challenge)
{
    memset(a, 0, sizeof *a);
    int rc = sodium_ready();
    if (rc) return rc;
    a->key = key;
    a->holder = *holder;
    memcpy(a->nonce_r, init->nonce, sizeof a->nonce_r);
    randombytes_buf(a->nonce_h, sizeof a->nonce_h);
    memset(challenge, 0, sizeof *challenge);
    memcpy(challenge->nonce, a->nonce_h, sizeof a->nonce_h);
    proof_of(a, "holder", challenge->proof);
    a->step = STEP_HOLDER_CHALLENGED;
    return 0;
}

int kvport_auth_holder_verify(kvport_auth *a, const kvport_auth_msg *proof)
{
    if (a->step != STEP_HOLDER_CHALLENGED) return wrong_step(a);
    return check_proof(a, "reader", proof->proof);
}
