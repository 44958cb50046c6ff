/* cli_up: `duplex up` — a router and its prefill/decode nodes on this
 * machine in one command (src/up/router_launch.h, docs/up.md).
 *
 * Checks the flags, makes sure there is a model (without --model the
 * default demo model, synthesised once into models/ like `make demo`
 * does), and hands over to router_launch_run. */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "up/router_launch.h"

#define UP_DEFAULT_NODES 1 /* prefill nodes and decode nodes, each, unless told */

/* The demo model (`duplex model synth --arch qwen3 --preset small --dtype
 * bf16 --seed 1`), written under a temporary name and renamed, so an
 * interrupted run never leaves half a file behind. */
int cli_default_model(void)
{
    struct stat st;
    if (stat(DEFAULT_MODEL, &st) == 0) return 0;
    if (mkdir("models", 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "duplex: mkdir models: %s\n", strerror(errno));
        return 1;
    }
    fprintf(stderr, "duplex: synthesising %s (once)\n", DEFAULT_MODEL);
    char tmp[64];
    snprintf(tmp, sizeof tmp, DEFAULT_MODEL ".%d.tmp", (int)getpid());
    synth_config c = {.arch = MODEL_QWEN3, .preset = "small", .dtype = DX_BF16, .seed = 1};
    if (synth_write(&c, tmp) < 0 || rename(tmp, DEFAULT_MODEL) < 0) {
        fprintf(stderr, "duplex: synthesising %s: %s\n", DEFAULT_MODEL, dx_errmsg());
        unlink(tmp);
        return 1;
    }
    return 0;
}

static int self_exe(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0) {
        fprintf(stderr, "duplex up: cannot find its own binary (/proc/self/exe): %s\n",
                strerror(errno));
        return 1;
    }
    out[n] = 0;
    return 0;
}

int cli_up_main(int argc, char **argv)
{
    const char *model = NULL, *mode = "bidirectional", *level = "info";
    const char *kv_dtype = ENGINE_DEFAULT_KV_DTYPE;
    long n_prefill = -1, n_decode = UP_DEFAULT_NODES, port = CLI_DEFAULT_PORT, threads = 0;
    long kv_mb = 0, local_max = -1;
    int no_prefix = 0;
    double startup = ROUTER_LAUNCH_DEFAULT_STARTUP_TIMEOUT_S;
    double stop = ROUTER_LAUNCH_DEFAULT_STOP_TIMEOUT_S;
    cli_list api_keys = {.n = 0}, api_key_files = {.n = 0};
    const cli_opt opts[] = {
        {"model", CLI_PATH, &model, 0, 0, "GGUF model (default: " DEFAULT_MODEL ", made once)"},
        {"prefill", CLI_INT, &n_prefill, 0, 64,
         "prefill nodes (default " CLI_DEFAULT_INT(UP_DEFAULT_NODES) "; colocated: 0)"},
        {"decode", CLI_INT, &n_decode, 1, 64, CLI_HELP_DEFAULT("decode nodes", UP_DEFAULT_NODES)},
        {"port", CLI_INT, &port, 0, 65535,
         "the router's port (default " CLI_DEFAULT_INT(CLI_DEFAULT_PORT) "; 0 = any free)"},
        {"mode", CLI_STR, &mode, 0, 0, "bidirectional|unidirectional|colocated"},
        {"threads-per-node", CLI_INT, &threads, 0, 1024,
         "engine threads per node (default: shared)"},
        {"kv-cache-mb", CLI_INT, &kv_mb, 1, 1 << 22, "KV pool per node (default: serve's)"},
        {"kv-dtype", CLI_STR, &kv_dtype, 0, 0, CLI_KV_DTYPE_HELP},
        {"prefill-no-prefix-caching", CLI_FLAG, &no_prefix, 0, 0,
         "prefill nodes recompute everything (benchmarks)"},
        {"local-prefill-max-tokens", CLI_INT, &local_max, 0, 1 << 30,
         "the router's: below this many uncached tokens, the decode node prefills "
         "(" CLI_DEFAULT_INT(CLI_LOCAL_PREFILL_MAX_TOKENS) ")"},
        {"startup-timeout-s", CLI_DBL, &startup, 1, 86400,
         "limit for everything to be ready "
         "(" CLI_DEFAULT_INT(ROUTER_LAUNCH_DEFAULT_STARTUP_TIMEOUT_S) ")"},
        {"stop-timeout-s", CLI_DBL, &stop, 1, 86400,
         "then SIGKILL on stop (" CLI_DEFAULT_INT(ROUTER_LAUNCH_DEFAULT_STOP_TIMEOUT_S) ")"},
        {"log-level", CLI_STR, &level, 0, 0,
         "error|warn|info|debug (default info; debug reaches every process)"},
        CLI_API_KEY_OPTS(&api_keys, &api_key_files), /* the router and every node get them */
    };
    int rc = cli_parse("up",
                       "[--model FILE] [--prefill N] [--decode M] "
                       "[--port " CLI_DEFAULT_INT(CLI_DEFAULT_PORT) "] [--mode M]",
                       argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    router_launch_config c = {.port = (int)port, .n_decode = (int)n_decode};
    enum dx_log_level lvl;
    if (router_launch_parse_mode(mode, &c.mode) < 0) return cli_bad_value("up", "--mode");
    if (dx_log_parse_level(level, &lvl) < 0) return cli_bad_value("up", "--log-level");
    int kvt;
    if (engine_parse_kv_dtype(kv_dtype, &kvt)) return cli_bad_value("up", "--kv-dtype");
    if (c.mode == LAUNCH_COLOCATED && n_prefill > 0) {
        fprintf(stderr, "duplex up: --prefill %ld: colocated mode has no prefill nodes\n",
                n_prefill);
        return 2;
    }
    if (c.mode != LAUNCH_COLOCATED && n_prefill == 0) {
        fprintf(stderr,
                "duplex up: --prefill 0: mode %s needs prefill nodes (or --mode "
                "colocated)\n",
                mode);
        return 2;
    }
    c.n_prefill = c.mode == LAUNCH_COLOCATED ? 0
                  : n_prefill < 0            ? UP_DEFAULT_NODES
                                             : (int)n_prefill;
    if (model && access(model, R_OK) != 0) {
        fprintf(stderr, "duplex up: --model %s: %s\n", model, strerror(errno));
        return 1;
    }
    char exe[PATH_MAX];
    if (self_exe(exe, sizeof exe)) return 1;
    if (!model && cli_default_model()) return 1;
    dx_log_set_level(lvl);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nodes = c.n_prefill + c.n_decode;
    c.exe = exe;
    c.model = model ? model : DEFAULT_MODEL;
    c.threads_per_node = threads ? (int)threads : cores / nodes > 1 ? (int)(cores / nodes) : 1;
    c.kv_cache_mb = kv_mb;
    c.kv_dtype = kv_dtype; /* always given: every node the same, whatever serve's default */
    c.prefill_no_prefix_caching = no_prefix;
    c.has_local_prefill = local_max >= 0;
    c.local_prefill_max_tokens = local_max;
    c.startup_timeout_s = startup;
    c.stop_timeout_s = stop;
    c.debug_children = lvl == DX_LOG_DEBUG;
    c.out = stdout;
    c.api_keys = api_keys.v;
    c.n_api_keys = api_keys.n;
    c.api_key_files = api_key_files.v;
    c.n_api_key_files = api_key_files.n;
    signal(SIGPIPE, SIG_IGN);
    return router_launch_run(&c);
}
