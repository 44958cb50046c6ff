/* router_rundir: `duplex up`'s run directory — where the cluster's secrets
 * live while it runs, as files its children are pointed at.
 *
 * A fresh directory (0700) under $TMPDIR, or /tmp, holds internal.key (a
 * new random internal key, 64 hex digits, 0600) and, when API keys were
 * given, api-keys (0600), and in the P/D modes kv.secret: each --api-key value on a line of its
 * own, then the text of each --api-key-file, every one checked first so that a bad key is reported
 * against the user's own flag, file and line.  Secrets go to children as files, never on their
 * command lines (which any local user can read in /proc).  router_rundir_remove deletes it all. */
#ifndef ROUTER_RUNDIR_H
#define ROUTER_RUNDIR_H

#include <stddef.h>

typedef struct {
    char dir[256];
    char internal_key[300]; /* the internal key's file */
    char api_keys[300];     /* the API keys' file, "" when none were given */
    char kv_secret[300];    /* the KV ports' secret (router_rundir_add_kv_secret), or "" */
} router_rundir;

/* 0; DX_EINVAL naming a bad key, key file and line; DX_EIO for what the
 * file system refused (nothing is left behind then). */
int router_rundir_create(router_rundir *d, const char *const *keys, size_t n_keys,
                         const char *const *key_files, size_t n_key_files);
/* Adds kv.secret (0600): a fresh cluster secret for the KV ports
 * (xfer/kvport_auth.h).  0, or the error naming the file. */
int router_rundir_add_kv_secret(router_rundir *d);
/* Removes the files and the directory; a zeroed d is a no-op. */
void router_rundir_remove(router_rundir *d);

#endif
