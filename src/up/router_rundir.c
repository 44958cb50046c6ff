/* router_rundir: `duplex up`'s run directory (see .h). */
#include "up/router_rundir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_keys.h"
#include "xfer/kvport_auth.h"

/* Writes a new file readable by its owner only (never an existing one). */
static int write_private(const char *path, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return dx_errf(DX_EIO, "%s: %s", path, strerror(errno));
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(fd, data + off, len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        off += (size_t)n;
    }
    int bad = off < len || close(fd) < 0;
    return bad ? dx_errf(DX_EIO, "%s: %s", path, strerror(errno ? errno : EIO)) : 0;
}

/* Every key checked as the children will (messages name the user's flag,
 * file and line), then all of them in one text. */
static int gather_keys(const char *const *keys, size_t n_keys, const char *const *files,
                       size_t n_files, dx_buf *text)
{
    dx_keys *k;
    int rc = dx_keys_create(&k);
    for (size_t i = 0; !rc && i < n_keys; i++)
        rc = dx_keys_add(k, keys[i], strlen(keys[i]), "--api-key");
    for (size_t i = 0; !rc && i < n_files; i++)
        if ((rc = dx_keys_load(k, files[i]))) dx_err_wrap(rc, "--api-key-file");
    dx_keys_destroy(k);
    for (size_t i = 0; !rc && i < n_keys; i++)
        if (dx_buf_puts(text, keys[i]) < 0 || dx_buf_putc(text, '\n') < 0)
            rc = dx_errf(DX_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n_files; i++) {
        rc = dx_keys_read_file(files[i], text);
        if (!rc && dx_buf_putc(text, '\n') < 0) rc = dx_errf(DX_ENOMEM, "out of memory");
    }
    return rc;
}

int router_rundir_create(router_rundir *d, const char *const *keys, size_t n_keys,
                         const char *const *key_files, size_t n_key_files)
{
    memset(d, 0, sizeof *d);
    dx_buf text;
    dx_buf_init(&text, 0);
    int rc = n_keys + n_key_files ? gather_keys(keys, n_keys, key_files, n_key_files, &text) : 0;
    if (rc) {
        dx_keys_wipe(&text);
        return rc;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(d->dir, sizeof d->dir, "%s/duplex-up.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(d->dir)) { /* 0700 */
        rc = dx_errf(DX_EIO, "run directory %s: %s", d->dir, strerror(errno));
        d->dir[0] = 0;
        dx_keys_wipe(&text);
        return rc;
    }
    char key[65];
    dx_keys_random_hex(key, 32);
    key[64] = '\n'; /* one line */
    snprintf(d->internal_key, sizeof d->internal_key, "%s/internal.key", d->dir);
    rc = write_private(d->internal_key, key, sizeof key);
    memset(key, 0, sizeof key);
    if (!rc && text.len) {
        snprintf(d->api_keys, sizeof d->api_keys, "%s/api-keys", d->dir);
        rc = write_private(d->api_keys, text.data, text.len);
    }
    dx_keys_wipe(&text);
    if (rc) router_rundir_remove(d);
    return rc;
}

int router_rundir_add_kv_secret(router_rundir *d)
{
    snprintf(d->kv_secret, sizeof d->kv_secret, "%s/kv.secret", d->dir);
    int rc = kvport_secret_write_new(d->kv_secret);
    if (rc) d->kv_secret[0] = 0;
    return rc;
}

void router_rundir_remove(router_rundir *d)
{
    if (!d->dir[0]) return;
    if (d->kv_secret[0]) unlink(d->kv_secret);
    if (d->internal_key[0]) unlink(d->internal_key);
    if (d->api_keys[0]) unlink(d->api_keys);
    rmdir(d->dir);
    memset(d, 0, sizeof *d);
}
