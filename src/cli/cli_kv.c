/* cli_kv: `duplex kv hold|pull|bench` — run one side of a KV transfer as a
 * process of its own, with synthetic KV (xfer_synth).  The integration tests
 * and `duplex bench xfer` drive these: `hold` prints one JSON line (port,
 * lease tokens) and serves until SIGTERM; `pull` prints one JSON line with
 * the outcome and byte-for-byte verification.  Both take the cluster secret
 * (--kv-secret-file) as nodes do, and `hold` listens off loopback only with
 * one (or --insecure-no-auth).  `pull` also takes two test hooks, flags
 * only the tests use, which --help does not list and which are refused
 * unless DUPLEX_TEST_HOOKS=1 (docs/testing.md, "Test hooks"). */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "bench/bench_xfer.h"
#include "cli.h"
#include "xfer/kvport_server.h"
#include "xfer/xfer_client.h"
#include "xfer/xfer_synth.h"

typedef struct {
    xfer_agent *agent;
    kv_pool *pool;
    kv_pool_config layout;
    uint8_t fp[16];
    kvport_hello hello;
} kv_side;

static int side_open(kv_side *s, const char *tls, int thread, size_t block_bytes, uint32_t n_blocks,
                     uint64_t model_seed, int preset06b)
{
    memset(s, 0, sizeof *s);
    xfer_agent_config ac = {.tls = tls, .no_progress_thread = !thread};
    int rc = xfer_agent_create(&ac, &s->agent);
    if (rc) return rc;
    if (preset06b)
        xfer_synth_layout_06b(n_blocks, model_seed, &s->layout, s->fp);
    else
        rc = xfer_synth_layout(block_bytes, n_blocks, model_seed, &s->layout, s->fp);
    s->layout.alloc = xfer_agent_alloc;
    s->layout.release = xfer_agent_release;
    s->layout.alloc_user = s->agent;
    if (!rc) rc = kv_pool_create(&s->layout, &s->pool);
    if (rc) return rc;
    xfer_hello_init(&s->hello, "duplex-kv", s->fp, s->pool, s->agent);
    return 0;
}

static void side_close(kv_side *s)
{
    kv_pool_destroy(s->pool);
    xfer_agent_destroy(s->agent);
}

/* "0-3,7,9-10" → ids; returns count or a negative error. */
static long parse_ids(const char *spec, int32_t **out)
{
    size_t n = 0, cap = 64;
    int32_t *ids = dx_malloc(cap * sizeof *ids);
    const char *p = spec;
    while (ids && *p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0) break;
        if (*end == '-') {
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p || b < a) break;
        }
        for (long v = a; v <= b && ids; v++) {
            if (n == cap) ids = dx_realloc(ids, (cap *= 2) * sizeof *ids);
            if (ids) ids[n++] = (int32_t)v;
        }
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            break;
    }
    if (!ids) return dx_errf(DX_ENOMEM, "block list '%s'", spec);
    if (*p || n == 0) {
        dx_free(ids);
        return dx_errf(DX_EINVAL, "bad block list '%s' (want e.g. 0-3,7)", spec);
    }
    *out = ids;
    return (long)n;
}

/* The lease policy --policy names; DX_NONE for another word. */
static int parse_policy(const char *s)
{
    if (!strcmp(s, "multi")) return XFER_LEASE_MULTI;
    if (!strcmp(s, "single")) return XFER_LEASE_SINGLE_USE;
    if (!strcmp(s, "renew")) return XFER_LEASE_RENEW_ON_READ;
    return DX_NONE;
}

/* ---- hold ---- */

/* --lease-ttls: a comma list of positive seconds. */
static int check_ttls(const char *list)
{
    for (const char *p = list;;) {
        char *end;
        double ttl = strtod(p, &end);
        if (end == p || !(ttl > 0) || (*end && *end != ',')) {
            fprintf(stderr,
                    "duplex kv hold: --lease-ttls: '%.*s' in '%s' is not a positive "
                    "number of seconds (want e.g. 60,5)\n",
                    (int)strcspn(p, ","), p, list);
            return 2;
        }
        if (!*end) return 0;
        p = end + 1;
    }
}

typedef struct {
    uv_signal_t sig[2];
    kvport_server *srv;
} hold_loop;

static void on_stop_signal(uv_signal_t *h, int signum)
{
    hold_loop *hl = h->data;
    uv_signal_stop(&hl->sig[0]);
    uv_signal_stop(&hl->sig[1]);
    uv_close((uv_handle_t *)&hl->sig[0], NULL);
    uv_close((uv_handle_t *)&hl->sig[1], NULL);
    kvport_server_destroy(hl->srv);
}

/* Fill all blocks, hash them, split them into leases, drop our own refs. */
static int hold_setup(kv_side *s, uint64_t seed, const char *ttls, int policy, xfer_leases *L,
                      json_t *leases)
{
    uint32_t n = kv_pool_n_blocks(s->pool);
    int32_t *ids = dx_malloc(n * sizeof *ids);
    kv_hash *chain = dx_malloc(n * sizeof *chain);
    int rc =
        ids && chain ? kv_pool_alloc_n(s->pool, n, ids) : dx_errf(DX_ENOMEM, "%u block ids", n);
    if (!rc) xfer_synth_chain(s->pool, seed, n, chain);
    for (uint32_t i = 0; !rc && i < n; i++) {
        xfer_synth_fill(s->pool, ids[i], seed);
        int32_t ex;
        rc = kv_pool_insert(s->pool, ids[i], chain[i], &ex);
    }
    size_t k = 1;
    for (const char *p = ttls; *p; p++) k += *p == ',';
    const char *p = ttls;
    for (size_t i = 0; !rc && i < k; i++) {
        double ttl = strtod(p, NULL);
        size_t a = i * n / k, b = (i + 1) * n / k;
        xfer_token tok;
        char hex[33];
        rc = b > a ? xfer_lease_create(L, ids + a, b - a, ttl, policy, &tok)
                   : dx_errf(DX_EINVAL, "more leases than blocks");
        if (rc) break;
        xfer_token_hex(&tok, hex);
        json_array_append_new(leases,
                              json_pack("{s:s,s:I,s:I,s:f}", "token", hex, "first", (json_int_t)a,
                                        "n", (json_int_t)(b - a), "ttl", ttl));
        p = strchr(p, ',');
        p = p ? p + 1 : "";
    }
    for (uint32_t i = 0; i < n && ids && !rc; i++) kv_pool_unref(s->pool, ids[i]);
    dx_free(ids);
    dx_free(chain);
    return rc;
}

typedef struct {
    const char *host;
    long port;
    double idle_timeout_s, handshake_timeout_s;
    const kvport_secret *secret;
    const char *auth; /* what the JSON line says about authentication */
} hold_net;

static int hold_serve(kv_side *s, xfer_leases *L, const hold_net *net, uint64_t n_blocks,
                      json_t *leases)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    hold_loop hl;
    kvport_server_config sc = {.host = net->host,
                               .port = (int)net->port,
                               .leases = L,
                               .hello = &s->hello,
                               .sweep_interval_s = 0.1,
                               .secret = net->secret,
                               .handshake_timeout_s = net->handshake_timeout_s,
                               .idle_timeout_s = net->idle_timeout_s};
    int rc = kvport_server_create(&loop, &sc, &hl.srv);
    if (rc) {
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
        return rc;
    }
    json_t *o = json_pack(
        "{s:i,s:i,s:I,s:I,s:s,s:s,s:o}", "port", kvport_server_port(hl.srv), "pid", (int)getpid(),
        "block_bytes", (json_int_t)kv_pool_block_bytes(s->pool), "n_blocks", (json_int_t)n_blocks,
        "tls", xfer_agent_tls(s->agent), "auth", net->auth, "leases", json_incref(leases));
    char *line = json_dumps(o, JSON_COMPACT);
    printf("%s\n", line);
    fflush(stdout);
    free(line);
    json_decref(o);
    for (int i = 0; i < 2; i++) {
        uv_signal_init(&loop, &hl.sig[i]);
        hl.sig[i].data = &hl;
        uv_signal_start(&hl.sig[i], on_stop_signal, i ? SIGINT : SIGTERM);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return 0;
}

/* kv hold closes idle connections sooner than a node's KV port does
 * (NODE_KV_DEFAULT_IDLE_TIMEOUT_S): tests wait for it. */
#define KV_HOLD_IDLE_TIMEOUT_S 10

int cli_kv_hold(int argc, char **argv)
{
    long blocks = 64, block_bytes = 8192, preset = 0;
    uint64_t seed = 1, model_seed = 1;
    const char *ttls = "60", *tls = NULL, *policy = "multi", *secret_file = NULL;
    double pin_ttl = XFER_LEASE_DEFAULT_PIN_TTL_S;
    long insecure = 0;
    hold_net net = {.host = "127.0.0.1",
                    .idle_timeout_s = KV_HOLD_IDLE_TIMEOUT_S,
                    .handshake_timeout_s = KVPORT_DEFAULT_HANDSHAKE_TIMEOUT_S};
    cli_opt opts[] = {
        {"blocks", CLI_INT, &blocks, 1, 1 << 20, "pool blocks (all filled and leased)"},
        {"block-bytes", CLI_INT, &block_bytes, 64, 1 << 30, "bytes per block (multiple of 64)"},
        {"preset-06b", CLI_FLAG, &preset, 0, 0, "use the 0.6b preset's layout instead"},
        {"host", CLI_STR, &net.host, 0, 0, "address to listen on (default 127.0.0.1)"},
        {"port", CLI_INT, &net.port, 0, 65535, "KV port (0: any free port)"},
        {"idle-timeout-s", CLI_DBL, &net.idle_timeout_s, 0.01, 86400,
         CLI_HELP_DEFAULT("close a connection this long without a frame and without live pins",
                          KV_HOLD_IDLE_TIMEOUT_S)},
        {"handshake-timeout-s", CLI_DBL, &net.handshake_timeout_s, 0.01, 86400,
         CLI_HELP_DEFAULT("close a connection not authenticated this long after it connected",
                          KVPORT_DEFAULT_HANDSHAKE_TIMEOUT_S)},
        {"kv-secret-file", CLI_PATH, &secret_file, 0, 0, "cluster secret readers must prove"},
        {"insecure-no-auth", CLI_FLAG, &insecure, 0, 0,
         "allow a non-loopback --host without --kv-secret-file"},
        {"fill-seed", CLI_U64, &seed, 0, 0, "pattern and token seed"},
        {"model-seed", CLI_U64, &model_seed, 0, 0, "fingerprint seed"},
        {"lease-ttls", CLI_STR, &ttls, 0, 0, "comma list: one lease per TTL over equal chunks"},
        {"policy", CLI_STR, &policy, 0, 0, "multi|single|renew"},
        {"pin-ttl", CLI_DBL, &pin_ttl, 0.01, 3600, "seconds an unreleased pin lives"},
        {"tls", CLI_STR, &tls, 0, 0, "UCX_TLS value (default: UCX's choice)"},
    };
    int rc = cli_parse("kv hold", "[options]", argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    int pol = parse_policy(policy);
    if (pol == DX_NONE) {
        fprintf(stderr, "duplex kv hold: --policy wants multi|single|renew, got '%s'\n", policy);
        return 2;
    }
    if (check_ttls(ttls)) return 2;
    kvport_secret *secret = NULL;
    rc = secret_file ? kvport_secret_load(secret_file, &secret) : 0;
    if (!rc) rc = kvport_listen_allowed(net.host, secret, (int)insecure, "--host", &net.auth);
    if (rc) {
        fprintf(stderr, "duplex kv hold: %s\n", dx_errmsg());
        kvport_secret_destroy(secret);
        return 2;
    }
    net.secret = secret;
    kv_side s;
    xfer_leases *L = NULL;
    json_t *leases = json_array();
    rc = side_open(&s, tls, 1, (size_t)block_bytes, (uint32_t)blocks, model_seed, (int)preset);
    if (!rc) rc = xfer_leases_create(s.pool, pin_ttl, &L);
    if (!rc) rc = hold_setup(&s, seed, ttls, pol, L, leases);
    if (!rc) rc = hold_serve(&s, L, &net, (uint64_t)blocks, leases);
    if (rc) fprintf(stderr, "duplex kv hold: %s\n", dx_errmsg());
    json_decref(leases);
    xfer_leases_destroy(L);
    side_close(&s);
    kvport_secret_destroy(secret);
    return rc ? 1 : 0;
}

/* ---- pull ---- */

typedef struct {
    long pause_ms;
} pull_hook;

static void on_pinned(void *user, uint32_t k)
{
    pull_hook *h = user;
    if (h->pause_ms > 0) {
        printf("{\"pinned\":%u}\n", k);
        fflush(stdout);
        usleep((useconds_t)h->pause_ms * 1000);
    }
}

static json_t *pull_report(const xfer_pull_result *res, kv_side *s, const int32_t *local,
                           const int32_t *remote, uint64_t seed, double ms)
{
    long ok = 0, bad = 0;
    for (uint32_t i = 0; i < res->n_pulled; i++) {
        if (xfer_synth_check(s->pool, local[i], seed, remote[i]))
            ok++;
        else
            bad++;
    }
    return json_pack("{s:i,s:s,s:s,s:i,s:i,s:i,s:I,s:i,s:i,s:i,s:i,s:f,s:f,s:f,s:f}", "err",
                     res->err, "errname", res->err ? dx_strerror(res->err) : "ok", "reason",
                     res->reason, "matched", (int)res->n_matched, "pulled", (int)res->n_pulled,
                     "reads", (int)res->n_reads, "bytes", (json_int_t)res->bytes, "verified",
                     (int)ok, "corrupt", (int)bad, "hello_cached", res->hello_cached, "renewals",
                     (int)res->n_renewals, "ms", ms, "read_ms", res->t_read_ms, "pin_ms",
                     res->t_pin_ms, "auth_ms", res->t_auth_ms);
}

typedef struct {
    const char *host, *token, *remote, *local, *tls, *secret_file;
    long port, pool_blocks, block_bytes, diverge_at, pause_ms, repeat, preset, no_renew;
    uint64_t seed, model_seed;
    double timeout, peer_timeout;
} pull_opts;

static int pull_run(const pull_opts *o)
{
    kv_side s;
    int32_t *remote = NULL, *local = NULL;
    kv_hash *full = NULL, *chain = NULL;
    long n = parse_ids(o->remote, &remote);
    int rc = n < 0 ? (int)n : 0;
    if (!rc)
        rc = side_open(&s, o->tls, 0, (size_t)o->block_bytes,
                       (uint32_t)(o->pool_blocks ? o->pool_blocks : n), o->model_seed,
                       (int)o->preset);
    xfer_token tok;
    kvport_secret *secret = NULL;
    if (!rc) rc = xfer_token_parse(o->token, &tok);
    if (!rc && o->secret_file) rc = kvport_secret_load(o->secret_file, &secret);
    if (rc) {
        fprintf(stderr, "duplex kv pull: %s\n", dx_errmsg());
        dx_free(remote);
        if (n >= 0) side_close(&s);
        return 2;
    }
    /* The chain the holder used is over its blocks in id order; ours picks
     * the hashes of the ids we ask for, then diverges where told. */
    int32_t maxid = 0;
    for (long i = 0; i < n; i++) maxid = remote[i] > maxid ? remote[i] : maxid;
    full = dx_malloc(((size_t)maxid + 1) * sizeof *full);
    chain = dx_malloc((size_t)n * sizeof *chain);
    local = dx_malloc((size_t)n * sizeof *local);
    xfer_synth_chain(s.pool, o->seed, (size_t)maxid + 1, full);
    for (long i = 0; i < n; i++) {
        chain[i] = full[remote[i]];
        if (o->diverge_at >= 0 && i >= o->diverge_at) chain[i].lo ^= 0xdead;
    }
    xfer_client *c = NULL;
    xfer_client_config cc = {.agent = s.agent,
                             .pool = s.pool,
                             .hello = &s.hello,
                             .secret = secret,
                             .peer_timeout_s = o->peer_timeout};
    rc = xfer_client_create(&cc, &c);
    pull_hook hook = {o->pause_ms};
    for (long r = 0; !rc && r < o->repeat; r++) {
        rc = kv_pool_alloc_n(s.pool, (size_t)n, local);
        if (rc) break;
        xfer_pull_req req = {.host = o->host,
                             .port = (int)o->port,
                             .token = tok,
                             .chain = chain,
                             .remote_ids = remote,
                             .local_ids = local,
                             .n = (size_t)n,
                             .timeout_s = o->timeout,
                             .on_pinned = on_pinned,
                             .user = &hook,
                             .no_renew = (int)o->no_renew};
        xfer_pull_result res;
        uint64_t t0 = dx_now_ns();
        xfer_pull(c, &req, &res);
        double ms = (double)(dx_now_ns() - t0) * 1e-6;
        json_t *rep = pull_report(&res, &s, local, remote, o->seed, ms);
        for (long i = 0; i < n; i++) kv_pool_unref(s.pool, local[i]);
        kv_pool_stats st;
        kv_pool_get_stats(s.pool, &st);
        json_object_set_new(rep, "leaked", json_integer(st.n_used));
        char *line = json_dumps(rep, JSON_COMPACT);
        printf("%s\n", line);
        fflush(stdout);
        free(line);
        json_decref(rep);
        if (res.err) rc = res.err;
    }
    xfer_client_destroy(c);
    dx_free(full);
    dx_free(chain);
    dx_free(local);
    dx_free(remote);
    side_close(&s);
    kvport_secret_destroy(secret);
    return rc ? 1 : 0;
}

/* ---- test hooks ----
 * Flags that make a pull misbehave on purpose (itest_xfer, itest_xfer_throttle).
 * They are parsed apart from the product's options, so that --help never
 * lists them, and only when the environment says a test is running. */

#define TEST_HOOKS_ENV "DUPLEX_TEST_HOOKS"

/* The option of opts that arg ("--name" or "--name=value") names, or NULL. */
static const cli_opt *long_opt(const char *arg, const cli_opt *opts, size_t n)
{
    if (strncmp(arg, "--", 2) != 0) return NULL;
    size_t len = strcspn(arg + 2, "=");
    for (size_t i = 0; i < n; i++)
        if (strlen(opts[i].name) == len && !strncmp(opts[i].name, arg + 2, len)) return &opts[i];
    return NULL;
}

/* cli_parse over opts, with the hooks (and their values) taken out of argv
 * first: the same return values.  A value given to an option of opts is
 * never taken for a hook, as cli_parse would not take it for a flag. */
static int parse_with_hooks(const char *cmd, const char *usage, int argc, char **argv,
                            const cli_opt *opts, size_t n_opts, const cli_opt *hooks,
                            size_t n_hooks)
{
    char **rest = dx_malloc(((size_t)argc * 2 + 1) * sizeof *rest), **hk = rest + argc;
    if (!rest) {
        fprintf(stderr, "duplex %s: out of memory\n", cmd);
        return 1;
    }
    int n_rest = 0, n_hk = 0;
    for (int i = 0; i < argc; i++) {
        const cli_opt *h = long_opt(argv[i], hooks, n_hooks);
        const cli_opt *o = h ? h : long_opt(argv[i], opts, n_opts);
        char **to = h ? hk : rest;
        int *n = h ? &n_hk : &n_rest;
        to[(*n)++] = argv[i];
        if (o && o->type != CLI_FLAG && !strchr(argv[i], '=') && i + 1 < argc)
            to[(*n)++] = argv[++i];
    }
    int rc = cli_parse(cmd, usage, n_rest, rest, opts, n_opts, NULL, 0, NULL);
    const char *env = getenv(TEST_HOOKS_ENV);
    if (!rc && n_hk && !(env && !strcmp(env, "1"))) {
        fprintf(stderr,
                "duplex %s: %.*s is a test hook, accepted only with " TEST_HOOKS_ENV
                "=1 in the environment (docs/testing.md)\n",
                cmd, (int)strcspn(hk[0], "="), hk[0]);
        rc = 2;
    }
    if (!rc) rc = cli_parse(cmd, usage, n_hk, hk, hooks, n_hooks, NULL, 0, NULL);
    dx_free(rest);
    return rc;
}

int cli_kv_pull(int argc, char **argv)
{
    pull_opts o = {.host = "127.0.0.1",
                   .remote = "0",
                   .block_bytes = 8192,
                   .diverge_at = -1,
                   .repeat = 1,
                   .seed = 1,
                   .model_seed = 1,
                   .timeout = XFER_DEFAULT_PULL_TIMEOUT_S,
                   .peer_timeout = XFER_DEFAULT_PEER_TIMEOUT_S};
    cli_opt opts[] = {
        {"host", CLI_STR, &o.host, 0, 0, "holder's host"},
        {"port", CLI_INT, &o.port, 1, 65535, "holder's KV port"},
        {"token", CLI_STR, &o.token, 0, 0, "lease token (32 hex digits)"},
        {"remote", CLI_STR, &o.remote, 0, 0, "holder's block ids, e.g. 0-99,200"},
        {"pool-blocks", CLI_INT, &o.pool_blocks, 0, 1 << 20,
         "local pool blocks (default: as many as pulled)"},
        {"block-bytes", CLI_INT, &o.block_bytes, 64, 1 << 30, "bytes per block"},
        {"preset-06b", CLI_FLAG, &o.preset, 0, 0, "use the 0.6b preset's layout"},
        {"fill-seed", CLI_U64, &o.seed, 0, 0, "the holder's pattern seed (verification, chain)"},
        {"model-seed", CLI_U64, &o.model_seed, 0, 0, "fingerprint seed"},
        {"diverge-at", CLI_INT, &o.diverge_at, -1, 1 << 20,
         "corrupt our hash chain from this index"},
        {"timeout", CLI_DBL, &o.timeout, 0.01, 3600, "seconds for the whole pull"},
        {"peer-timeout", CLI_DBL, &o.peer_timeout, 0.01, 3600,
         "seconds the holder may stay silent "
         "(default " CLI_DEFAULT_INT(
             XFER_DEFAULT_PEER_TIMEOUT_S) "): a dead one fails the pull then"},
        {"kv-secret-file", CLI_PATH, &o.secret_file, 0, 0, "cluster secret to prove to the holder"},
        {"repeat", CLI_INT, &o.repeat, 1, 1000000, "pull this many times (one JSON line each)"},
        {"tls", CLI_STR, &o.tls, 0, 0, "UCX_TLS value (default: UCX's choice)"},
    };
    cli_opt hooks[] = {
        {"pause-after-pin-ms", CLI_INT, &o.pause_ms, 0, 600000, "sleep between PIN and READ"},
        {"no-renew", CLI_FLAG, &o.no_renew, 0, 0,
         "never RENEW the pin, so a read longer than its TTL must fail"},
    };
    int rc = parse_with_hooks("kv pull", "--port P --token T [options]", argc, argv, opts,
                              DX_ARRAY_LEN(opts), hooks, DX_ARRAY_LEN(hooks));
    if (rc) return rc == 1 ? 0 : rc;
    if (!o.port) return cli_required("kv pull", "--port P");
    if (!o.token) return cli_required("kv pull", "--token T");
    return pull_run(&o);
}

int cli_kv_main(int argc, char **argv)
{
    static const cli_cmd cmds[] = {
        {"hold", cli_kv_hold, "lease a pool of synthetic KV blocks and serve them on a KV port"},
        {"pull", cli_kv_pull, "pull leased blocks from a holder and verify them byte for byte"},
        {"bench", cli_bench_xfer_main, "the same as duplex bench xfer"},
    };
    return cli_group("kv", cmds, DX_ARRAY_LEN(cmds), argc, argv);
}

int cli_bench_xfer_main(int argc, char **argv)
{
    long blocks = 128, reps = 5, lat = 50;
    const char *tr = "default,tcp", *secret = NULL;
    cli_opt opts[] = {
        {"blocks", CLI_INT, &blocks, 1, 4096, "0.6b-preset blocks per pull (1,835,008 bytes each)"},
        {"reps", CLI_INT, &reps, 1, 1000, "pulls per transport (median reported)"},
        {"lat-reps", CLI_INT, &lat, 1, 100000, "single-block pulls for the latency figure"},
        {"transports", CLI_STR, &tr, 0, 0, "comma list of UCX_TLS values; default = UCX's choice"},
        {"kv-secret-file", CLI_PATH, &secret, 0, 0,
         "authenticate both ends with this cluster secret (default: none, loopback)"},
    };
    int rc =
        cli_parse("bench xfer", "[options]", argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    bench_xfer_config cfg = {
        "/proc/self/exe", (unsigned)blocks, (unsigned)reps, (unsigned)lat, tr, secret};
    rc = bench_xfer_run(&cfg, stdout);
    if (rc) fprintf(stderr, "duplex bench xfer: %s\n", dx_errmsg());
    return rc ? 1 : 0;
}
