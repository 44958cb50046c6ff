/* cli: subcommand entry points and the shared option parser.
 *
 * Every subcommand validates its flags through cli_parse, which rejects
 * unknown flags, missing values and out-of-range numbers with a message that
 * names the flag as the user types it, so a typo never silently runs with a
 * default.  A one-letter option is spelled with one dash (`-n`, `-o`) in
 * parsing, help and messages; every other option with two (`--kv-dtype`). */
#ifndef CLI_H
#define CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "http/http_conn.h"

/* CLI_PATH is a CLI_STR that help shows as FILE.  CLI_LIST and
 * CLI_PATH_LIST may be given several times: each value is added to a
 * cli_list (at most CLI_LIST_MAX). */
enum cli_opt_type {
    CLI_STR,
    CLI_PATH,
    CLI_INT,
    CLI_U64,
    CLI_DBL,
    CLI_FLAG,
    CLI_LIST,
    CLI_PATH_LIST
};

#define CLI_LIST_MAX 64

/* A default in help text, spelled from the constant the code applies:
 * "port (default " CLI_DEFAULT_INT(CLI_DEFAULT_PORT) "; 0 = any free port)"
 * is "port (default 8000; 0 = any free port)", so help cannot drift from
 * what the library (or the CLI) does.
 * X must expand to a plain decimal literal (no parentheses, casts, suffixes
 * or arithmetic), which is how the modules' *_DEFAULT_* constants are
 * written. */
#define CLI_DEFAULT_INT(X) CLI__STR(X)
#define CLI__STR(X)        #X
/* The usual form: CLI_HELP_DEFAULT("KV pool size", ENGINE_DEFAULT_KV_CACHE_MB)
 * is "KV pool size (default 1024)". */
#define CLI_HELP_DEFAULT(TEXT, X) TEXT " (default " CLI_DEFAULT_INT(X) ")"

/* Defaults the CLI itself applies in more than one command: the HTTP port
 * of serve, router and up (and the URL bench run and chat send to), and the
 * router's --local-prefill-max-tokens (up passes it on when given). */
#define CLI_DEFAULT_PORT               8000
#define CLI_DEFAULT_URL                "http://127.0.0.1:" CLI_DEFAULT_INT(CLI_DEFAULT_PORT)
#define CLI_LOCAL_PREFILL_MAX_TOKENS   256
/* --kv-dtype's help in serve, up, generate and bench engine (expanded where
 * engine/engine.h is included: its names and default are the engine's). */
#define CLI_KV_DTYPE_HELP                                                                          \
    "KV cache dtype " ENGINE_KV_DTYPES " (default " ENGINE_DEFAULT_KV_DTYPE                        \
    "; q8_0: 0.53x the bytes, every node of a cluster the same)"

typedef struct {
    const char *v[CLI_LIST_MAX];
    size_t n;
} cli_list;

/* The API-key flags of serve, router and up (SECURITY.md): two cli_opt
 * entries filling two cli_lists. */
#define CLI_API_KEY_OPTS(keys, files)                                                              \
    {"api-key", CLI_LIST, (keys), 0, 0,                                                           \
     "a key clients must send as Authorization: Bearer (repeatable)"},                           \
        {"api-key-file", CLI_PATH_LIST, (files), 0, 0,                                             \
         "API keys, one per line, '#' comments (repeatable)"}

typedef struct {
    const char *name; /* without dashes: "n" is -n, "kv-dtype" is --kv-dtype */
    enum cli_opt_type type;
    void *dst;        /* const char **, long *, uint64_t *, double *, int *, cli_list * */
    double min, max;  /* for numbers; both 0 = unchecked */
    const char *help;
} cli_opt;

/* Parses argv[0..argc) (argv[0] is the first flag, not the program name).
 * Positional arguments are collected into pos[] (up to max_pos). Prints the
 * error to stderr and returns 2 on bad usage; returns 1 if --help was asked
 * (usage already printed to stdout); 0 on success. */
int cli_parse(const char *cmd, const char *usage, int argc, char **argv, const cli_opt *opts,
              size_t nopts, char **pos, int max_pos, int *npos);

/* A number for people: integral values as integers (1048576, never
 * 1.04858e+06), others with %g (0.001). */
void cli_fmt_num(char *buf, size_t cap, double v);

/* "duplex CMD: WHAT is required" on stderr; returns 2. */
int cli_required(const char *cmd, const char *what);
/* For a value a library parser rejected (its message in dx_errmsg()):
 * "duplex CMD: FLAG: message" on stderr; returns 2. */
int cli_bad_value(const char *cmd, const char *flag);

/* The HTTP front's flags, the same for `duplex serve` and `duplex router`
 * (http_limits in node/http_conn.h; docs/api.md, "Limits"): put
 * CLI_HTTP_OPTS(f) in the command's options, then cli_http_limits. */
#define CLI_MAX_TRUSTED 64
typedef struct {
    long max_body_mb, request_timeout_ms, max_conns, max_conns_per_peer, max_buffer_mb;
    const char *trusted; /* IP[,IP...] */
    char *buf;           /* the split copy of trusted */
    const char *list[CLI_MAX_TRUSTED];
} cli_http_flags;

#define CLI_HTTP_FLAGS_INIT                                                                        \
    {                                                                                              \
        .max_body_mb = HTTP_DEFAULT_MAX_BODY_MB,                                                   \
        .request_timeout_ms = HTTP_DEFAULT_REQUEST_TIMEOUT_MS, .max_conns = HTTP_DEFAULT_MAX_CONNS \
    }
#define CLI_HTTP_OPTS(f)                                                                           \
    {"max-body-mb", CLI_INT, &(f).max_body_mb, 1, 1024,                                            \
     "request body limit (default " CLI_DEFAULT_INT(HTTP_DEFAULT_MAX_BODY_MB) ")"},                \
        {"request-timeout-ms",                                                                     \
         CLI_INT,                                                                                  \
         &(f).request_timeout_ms,                                                                  \
         1,                                                                                        \
         3600000,                                                                                  \
         "time a client has for its request line and headers, from the first byte; the body "      \
         "gets 1 s more per MiB (default " CLI_DEFAULT_INT(HTTP_DEFAULT_REQUEST_TIMEOUT_MS) ")"},  \
        {"max-conns",                                                                              \
         CLI_INT,                                                                                  \
         &(f).max_conns,                                                                           \
         8,                                                                                        \
         1 << 20,                                                                                  \
         "client connections at most, the last 1/16 kept for --trusted-peer and /health "          \
         "(default " CLI_DEFAULT_INT(HTTP_DEFAULT_MAX_CONNS) ")"},                                 \
        {"max-conns-per-peer",                                                                     \
         CLI_INT,                                                                                  \
         &(f).max_conns_per_peer,                                                                  \
         0,                                                                                        \
         1 << 20,                                                                                  \
         "connections from one address (default: a quarter of --max-conns)"},                      \
        {"max-buffer-mb",                                                                          \
         CLI_INT,                                                                                  \
         &(f).max_buffer_mb,                                                                       \
         0,                                                                                        \
         1 << 20,                                                                                  \
         "request and answer bytes all connections may hold together; past it 503 "                \
         "(default: " CLI_DEFAULT_INT(HTTP_DEFAULT_MAX_BUFFER_MB) ", at least 8 bodies)"},         \
    {                                                                                              \
        "trusted-peer", CLI_STR, &(f).trusted, 0, 0,                                               \
            "IP[,IP...]: peers (a router) exempt from --max-conns-per-peer, given the reserve"     \
    }

/* The limits from the flags; 2 with a message naming the flag for a bad
 * one.  The trusted list points into f, which must outlive the server's
 * creation; cli_http_flags_free releases it. */
int cli_http_limits(const char *cmd, cli_http_flags *f, http_limits *out);
void cli_http_flags_free(cli_http_flags *f);

/* A command of a group (`duplex model synth`) or of duplex itself. */
typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv); /* argv[0] is the first argument after the name */
    const char *help;                 /* one line */
} cli_cmd;

/* Prints "  name  help" for each command. */
void cli_list_cmds(FILE *f, const cli_cmd *cmds, size_t n);
/* `duplex GROUP ...`: runs the command argv[0] names.  `--help`, `-h` or
 * `help` (anywhere, unless a command comes first) lists the commands on
 * stdout and returns 0; `help CMD` is `CMD --help`; no arguments list them
 * on stderr and return 2; an unknown command is named with the accepted
 * ones, 2. */
int cli_group(const char *group, const cli_cmd *cmds, size_t n, int argc, char **argv);

int cli_model_main(int argc, char **argv);
int cli_tokenize_main(int argc, char **argv);
int cli_generate_main(int argc, char **argv);
int cli_bench_main(int argc, char **argv);
int cli_kv_main(int argc, char **argv);
int cli_bench_xfer_main(int argc, char **argv); /* `duplex bench xfer` */
/* `duplex bench run|compare|chat` (cli_bench_run.c) */
int cli_bench_multi_main(const char *what, int argc, char **argv);
int cli_serve_main(int argc, char **argv);
int cli_router_main(int argc, char **argv);
int cli_up_main(int argc, char **argv);
int cli_node_main(int argc, char **argv); /* `duplex node drain` (cli_node.c) */

/* duplex up's and bench compare's model when none is named: synthesised
 * once (small preset, bf16) if missing.  0, or 1 after printing why not. */
#define DEFAULT_MODEL "models/qwen3-small-bf16.gguf"
int cli_default_model(void);

#endif
