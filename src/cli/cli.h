/* cli: subcommand entry points and the shared option parser.
 *
 * Every subcommand validates its flags through cli_parse, which rejects
 * unknown flags, missing values and out-of-range numbers with a message that
 * names the flag, so a typo never silently runs with a default. */
#ifndef CLI_H
#define CLI_H

#include <stddef.h>
#include <stdint.h>

enum cli_opt_type { CLI_STR, CLI_INT, CLI_U64, CLI_DBL, CLI_FLAG };

typedef struct {
    const char *name; /* without the leading "--" */
    enum cli_opt_type type;
    void *dst;        /* const char **, long *, uint64_t *, double *, int * */
    double min, max;  /* for numbers; both 0 = unchecked */
    const char *help;
} cli_opt;

/* Parses argv[0..argc) (argv[0] is the first flag, not the program name).
 * Positional arguments are collected into pos[] (up to max_pos). Prints the
 * error to stderr and returns 2 on bad usage; returns 1 if --help was asked
 * (usage already printed); 0 on success. */
int cli_parse(const char *cmd, const char *usage, int argc, char **argv, const cli_opt *opts,
              size_t nopts, char **pos, int max_pos, int *npos);
void cli_usage(const char *cmd, const char *usage, const cli_opt *opts, size_t nopts);

int cli_model_main(int argc, char **argv);
int cli_tokenize_main(int argc, char **argv);
int cli_generate_main(int argc, char **argv);
int cli_bench_main(int argc, char **argv);
int cli_kv_main(int argc, char **argv);
int cli_bench_xfer_main(int argc, char **argv); /* `duplex bench xfer` */
int cli_serve_main(int argc, char **argv);
int cli_router_main(int argc, char **argv);
int cli_up_main(int argc, char **argv);

#endif
