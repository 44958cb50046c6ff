/* cli_args: the strict flag parser shared by all subcommands, and the
 * dispatcher of command groups (`duplex model synth|info`).
 *
 * Options are spelled as users type them: one dash for one-letter names
 * (-n, -o), two for the rest; help and every message use the same spelling,
 * and a wrong number of dashes is refused with the right one suggested. */
#include "cli.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

static const char *dashes(const char *name)
{
    return name[0] && !name[1] ? "-" : "--";
}

static const char *placeholder(enum cli_opt_type t)
{
    switch (t) {
    case CLI_FLAG: return "";
    case CLI_STR:
    case CLI_LIST:
        return " S";
    case CLI_PATH:
    case CLI_PATH_LIST:
        return " FILE";
    default: return " N";
    }
}

static void usage(const char *cmd, const char *use, const cli_opt *opts, size_t nopts)
{
    printf("usage: duplex %s %s\n", cmd, use);
    for (size_t i = 0; i < nopts; i++) {
        const char *d = dashes(opts[i].name), *arg = placeholder(opts[i].type);
        /* long names: one space */
        int pad = 26 - (int)(strlen(d) + strlen(opts[i].name) + strlen(arg));
        printf("  %s%s%s%*s%s\n", d, opts[i].name, arg, pad > 1 ? pad : 1, "",
               opts[i].help ? opts[i].help : "");
    }
}

void cli_fmt_num(char *buf, size_t cap, double v)
{
    if (v == floor(v) && fabs(v) < 1e15)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%g", v);
}

static int set_value(const char *cmd, const cli_opt *o, const char *val)
{
    char *end = NULL;
    errno = 0;
    double num = 0;
    switch (o->type) {
    case CLI_STR:
    case CLI_PATH: *(const char **)o->dst = val; return 0;
    case CLI_FLAG: *(int *)o->dst = 1; return 0;
    case CLI_LIST:
    case CLI_PATH_LIST: {
        cli_list *l = o->dst;
        if (l->n == CLI_LIST_MAX) {
            fprintf(stderr, "duplex %s: %s%s is given more than %d times\n", cmd, dashes(o->name),
                    o->name, CLI_LIST_MAX);
            return 2;
        }
        l->v[l->n++] = val;
        return 0;
    }
    case CLI_INT: {
        long v = strtol(val, &end, 10);
        if (errno || !*val || *end) goto bad;
        *(long *)o->dst = v;
        num = (double)v;
        break;
    }
    case CLI_U64: {
        if (val[0] == '-') goto bad;
        unsigned long long v = strtoull(val, &end, 10);
        if (errno || !*val || *end) goto bad;
        *(uint64_t *)o->dst = v;
        num = (double)v;
        break;
    }
    case CLI_DBL: {
        double v = strtod(val, &end);
        if (errno || !*val || *end || !isfinite(v)) goto bad;
        *(double *)o->dst = v;
        num = v;
        break;
    }
    }
    if ((o->min != 0 || o->max != 0) && (num < o->min || num > o->max)) {
        char lo[32], hi[32];
        cli_fmt_num(lo, sizeof lo, o->min);
        cli_fmt_num(hi, sizeof hi, o->max);
        fprintf(stderr, "duplex %s: %s%s %s is out of range [%s, %s]\n", cmd, dashes(o->name),
                o->name, val, lo, hi);
        return 2;
    }
    return 0;
bad:
    fprintf(stderr, "duplex %s: %s%s wants %s, got '%s'\n", cmd, dashes(o->name), o->name,
            o->type == CLI_DBL   ? "a number"
            : o->type == CLI_U64 ? "a non-negative integer"
                                 : "an integer",
            val);
    return 2;
}

static const cli_opt *find_opt(const cli_opt *opts, size_t nopts, const char *name, size_t len)
{
    for (size_t k = 0; k < nopts; k++)
        if (strlen(opts[k].name) == len && strncmp(opts[k].name, name, len) == 0) return &opts[k];
    return NULL;
}

/* arg is "--name[=value]" or "-n"; *o is the option unless it is unknown
 * or spelled with the wrong number of dashes (then 2, message printed). */
static int lookup(const char *cmd, const char *arg, const cli_opt *opts, size_t nopts,
                  const cli_opt **o, const char **val)
{
    int nd = arg[1] == '-' ? 2 : 1;
    const char *name = arg + nd, *eq = nd == 2 ? strchr(name, '=') : NULL;
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    *val = eq ? eq + 1 : NULL;
    *o = find_opt(opts, nopts, name, len);
    if (*o && (int)strlen(dashes((*o)->name)) == nd) return 0;
    fprintf(stderr, "duplex %s: unknown option '%.*s'", cmd, (int)(nd + len), arg);
    if (*o)
        fprintf(stderr, " (did you mean %s%s?)\n", dashes((*o)->name), (*o)->name);
    else
        fprintf(stderr, " (see duplex %s --help)\n", cmd);
    return 2;
}

int cli_parse(const char *cmd, const char *use, int argc, char **argv, const cli_opt *opts,
              size_t nopts, char **pos, int max_pos, int *npos)
{
    int np = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(cmd, use, opts, nopts);
            return 1;
        }
        if (a[0] != '-' || a[1] == 0 || strcmp(a, "--") == 0) { /* "-" is stdin */
            if (np >= max_pos) {
                fprintf(stderr, "duplex %s: unexpected argument '%s'\n", cmd, a);
                return 2;
            }
            pos[np++] = argv[i];
            continue;
        }
        const cli_opt *o;
        const char *val;
        if (lookup(cmd, a, opts, nopts, &o, &val)) return 2;
        const char *d = dashes(o->name);
        if (o->type == CLI_FLAG) {
            if (val) {
                fprintf(stderr, "duplex %s: %s%s takes no value\n", cmd, d, o->name);
                return 2;
            }
        } else if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "duplex %s: %s%s needs a value\n", cmd, d, o->name);
                return 2;
            }
            val = argv[++i];
        }
        int rc = set_value(cmd, o, val ? val : "");
        if (rc) return rc;
    }
    if (npos) *npos = np;
    return 0;
}

/* --request-timeout-ms's help (cli.h) says it in words */
_Static_assert(HTTP_DEFAULT_BODY_MS_PER_MIB == 1000, "the body gets 1 s more per MiB");

int cli_http_limits(const char *cmd, cli_http_flags *f, http_limits *out)
{
    memset(out, 0, sizeof *out);
    out->max_body_bytes = (size_t)f->max_body_mb << 20;
    out->request_timeout_ms = (uint64_t)f->request_timeout_ms;
    out->max_conns = (uint32_t)f->max_conns;
    out->max_conns_per_peer = (uint32_t)f->max_conns_per_peer;
    out->max_buffered_bytes = (size_t)f->max_buffer_mb << 20;
    if (out->max_buffered_bytes && out->max_buffered_bytes < out->max_body_bytes) {
        fprintf(stderr, "duplex %s: --max-buffer-mb %ld is below --max-body-mb %ld\n", cmd,
                f->max_buffer_mb, f->max_body_mb);
        return 2;
    }
    if (!f->trusted) return 0;
    if (!(f->buf = dx_strdup(f->trusted))) return 1;
    size_t n = 0;
    for (char *p = f->buf, *comma; p; p = comma ? comma + 1 : NULL) {
        if ((comma = strchr(p, ','))) *comma = 0;
        struct in6_addr a6;
        struct in_addr a4;
        if (inet_pton(AF_INET, p, &a4) != 1 && inet_pton(AF_INET6, p, &a6) != 1) {
            fprintf(stderr, "duplex %s: --trusted-peer: '%s' is not an IP address\n", cmd, p);
            return 2;
        }
        if (n == CLI_MAX_TRUSTED) {
            fprintf(stderr, "duplex %s: --trusted-peer: more than %d addresses\n", cmd,
                    CLI_MAX_TRUSTED);
            return 2;
        }
        f->list[n++] = p;
    }
    out->trusted = f->list;
    out->n_trusted = n;
    return 0;
}

void cli_http_flags_free(cli_http_flags *f)
{
    dx_free(f->buf);
    f->buf = NULL;
}

int cli_required(const char *cmd, const char *what)
{
    fprintf(stderr, "duplex %s: %s is required\n", cmd, what);
    return 2;
}

int cli_bad_value(const char *cmd, const char *flag)
{
    fprintf(stderr, "duplex %s: %s: %s\n", cmd, flag, dx_errmsg());
    return 2;
}

/* ---- command groups ---- */

void cli_list_cmds(FILE *f, const cli_cmd *cmds, size_t n)
{
    for (size_t i = 0; i < n; i++) fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].help);
}

static void group_help(FILE *f, const char *group, const cli_cmd *cmds, size_t n)
{
    fprintf(f, "usage: duplex %s <command> [options]   (duplex %s <command> --help)\n\ncommands:\n",
            group, group);
    cli_list_cmds(f, cmds, n);
}

static const cli_cmd *find_cmd(const cli_cmd *cmds, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(cmds[i].name, name)) return &cmds[i];
    return NULL;
}

static int is_help(const char *a)
{
    return !strcmp(a, "--help") || !strcmp(a, "-h") || !strcmp(a, "help");
}

static int unknown_cmd(const char *group, const cli_cmd *cmds, size_t n, const char *name)
{
    fprintf(stderr, "duplex %s: unknown command '%s' (want ", group, name);
    for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? "|" : "", cmds[i].name);
    fprintf(stderr, "; duplex %s --help)\n", group);
    return 2;
}

int cli_group(const char *group, const cli_cmd *cmds, size_t n, int argc, char **argv)
{
    if (argc == 0) {
        group_help(stderr, group, cmds, n);
        return 2;
    }
    const cli_cmd *c = find_cmd(cmds, n, argv[0]);
    if (c) return c->fn(argc - 1, argv + 1);
    if (!strcmp(argv[0], "help") && argc >= 2) {
        if (!(c = find_cmd(cmds, n, argv[1]))) return unknown_cmd(group, cmds, n, argv[1]);
        char help[] = "--help", *hargv[] = {help, NULL};
        return c->fn(1, hargv);
    }
    for (int i = 0; i < argc; i++)
        if (is_help(argv[i])) {
            group_help(stdout, group, cmds, n);
            return 0;
        }
    return unknown_cmd(group, cmds, n, argv[0]);
}
