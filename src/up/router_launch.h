/* router_launch: `duplex up` — a router and its prefill/decode nodes on this
 * machine, as child processes of the same binary.
 *
 * The nodes start first (free ports: --port 0 --kv-port 0, read back from
 * each node's start-up line), then the router with their URLs; once the
 * router's /health answers 200 one line per process and the URL to use are
 * printed.  SIGINT/SIGTERM stop everything cleanly: the router first (it
 * drains its requests, which need the nodes), then the nodes; a second
 * signal kills what is left.  A child that dies on its own stops the rest,
 * and the launcher exits non-zero saying which child it was and how it
 * ended.  Children run in their own process group (a terminal's Ctrl-C
 * reaches only the launcher, which stops them in order) and get SIGTERM if
 * the launcher dies.  Their output is relayed to stderr, each line prefixed
 * with the child's name.
 *
 * Keys: the launcher makes a run directory (0700, under $TMPDIR or /tmp)
 * with a fresh internal key (internal.key, 0600) that every child gets with
 * --internal-key-file, so the router's requests to the nodes are the only
 * ones whose kv_transfer_params the nodes honour; API keys given to `up`
 * (--api-key, --api-key-file: checked first, errors naming file and line)
 * go to every child in one file there (api-keys, 0600), never on a command
 * line.  The directory is removed when `up` ends.
 * In the P/D modes the KV ports are authenticated too: the run directory
 * also holds a fresh cluster secret (kv.secret, 0600); every node gets
 * `--kv-secret-file` and `--kv-peers 127.0.0.1` (the cluster's KV ports are
 * all on loopback, on ports not known before the nodes start).
 *
 * Node flags by mode follow docs/pd.md: bidirectional → prefill nodes
 * `--role prefill --bidirectional-kv-xfer`, decode nodes `--role decode
 * --bidirectional-kv-xfer`, router `--mode bidirectional`; unidirectional →
 * the same without --bidirectional-kv-xfer; colocated → `--role both` nodes
 * and a router with only --decode. */
#ifndef ROUTER_LAUNCH_H
#define ROUTER_LAUNCH_H

#include <stddef.h>
#include <stdio.h>

enum router_launch_mode { LAUNCH_BIDIRECTIONAL, LAUNCH_UNIDIRECTIONAL, LAUNCH_COLOCATED };

/* The limits for starting and for stopping, unless the config says (plain
 * literals, for help text). */
#define ROUTER_LAUNCH_DEFAULT_STARTUP_TIMEOUT_S 600
#define ROUTER_LAUNCH_DEFAULT_STOP_TIMEOUT_S    60

typedef struct {
    const char *exe;   /* the duplex binary the children run */
    const char *model; /* GGUF file */
    int n_prefill, n_decode;
    enum router_launch_mode mode;
    int port;                      /* the router's; 0 = a free one */
    int threads_per_node;          /* 0: the cores shared out */
    long kv_cache_mb;              /* per node; 0 = serve's default */
    const char *kv_dtype;          /* every node's --kv-dtype (NULL: serve's): one KV layout */
    int prefill_no_prefix_caching; /* benchmarks: prefill nodes recompute everything */
    int has_local_prefill;         /* pass local_prefill_max_tokens to the router */
    long local_prefill_max_tokens;
    double startup_timeout_s; /* 0: ROUTER_LAUNCH_DEFAULT_STARTUP_TIMEOUT_S */
    double stop_timeout_s;    /* SIGKILL what is left after this; 0: the default */
    int debug_children;       /* --log-level debug to the nodes and the router (their
                               * start-up lines are INFO, which the launcher reads,
                               * so quieter levels stay the launcher's own) */
    FILE *out;                /* the summary lines (stdout) */
    /* API keys every child requires (copied into the run directory). */
    const char *const *api_keys;
    size_t n_api_keys;
    const char *const *api_key_files;
    size_t n_api_key_files;
    /* Set by router_launch_run (the run directory's files), or by tests:
     * passed as --internal-key-file / --api-key-file when not NULL. */
    const char *internal_key_file, *api_key_file;
    const char *kv_secret_file; /* set by router_launch_run (the run directory's) */
} router_launch_config;

/* A child's command line: argv[0..argc) and a NULL; strings owned here. */
typedef struct {
    char *argv[48];
    int argc;
    char owned[8][64];
    int n_owned;
    char *heap[4]; /* long strings (URL lists) */
    int n_heap;
} router_launch_argv;

/* The command line of prefill node (prefill = 1) or decode node. */
void router_launch_node_argv(const router_launch_config *c, int prefill, router_launch_argv *a);
/* The router's, given its nodes' URLs ("http://127.0.0.1:P,..."; prefill
 * may be empty). */
int router_launch_router_argv(const router_launch_config *c, const char *prefill_urls,
                              const char *decode_urls, router_launch_argv *a);
void router_launch_argv_free(router_launch_argv *a);

const char *router_launch_mode_name(enum router_launch_mode m);
int router_launch_parse_mode(const char *s, enum router_launch_mode *out);

/* Runs until everything has stopped; returns the process exit code (0 after
 * a clean stop, 1 when a child failed or did not start, 2 for a bad API key
 * or key file). */
int router_launch_run(const router_launch_config *cfg);

#endif
