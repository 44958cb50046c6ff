/* cli_args: strict --flag parser shared by all subcommands. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_usage(const char *cmd, const char *usage, const cli_opt *opts, size_t nopts)
{
    fprintf(stderr, "usage: duplex %s %s\n", cmd, usage);
    for (size_t i = 0; i < nopts; i++) {
        const char *arg = opts[i].type == CLI_FLAG ? "" : opts[i].type == CLI_STR ? " S" : " N";
        int pad = 24 - (int)(strlen(opts[i].name) + strlen(arg)); /* long names: one space */
        fprintf(stderr, "  --%s%s%*s%s\n", opts[i].name, arg, pad > 1 ? pad : 1, "",
                opts[i].help ? opts[i].help : "");
    }
}

static int set_value(const char *cmd, const cli_opt *o, const char *val)
{
    char *end = NULL;
    errno = 0;
    double num = 0;
    switch (o->type) {
    case CLI_STR: *(const char **)o->dst = val; return 0;
    case CLI_FLAG: *(int *)o->dst = 1; return 0;
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
        fprintf(stderr, "duplex %s: --%s %s is out of range [%g, %g]\n", cmd, o->name, val, o->min,
                o->max);
        return 2;
    }
    return 0;
bad:
    fprintf(stderr, "duplex %s: --%s wants %s, got '%s'\n", cmd, o->name,
            o->type == CLI_DBL   ? "a number"
            : o->type == CLI_U64 ? "a non-negative integer"
                                 : "an integer",
            val);
    return 2;
}

int cli_parse(const char *cmd, const char *usage, int argc, char **argv, const cli_opt *opts,
              size_t nopts, char **pos, int max_pos, int *npos)
{
    int np = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            cli_usage(cmd, usage, opts, nopts);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
            if (np >= max_pos) {
                fprintf(stderr, "duplex %s: unexpected argument '%s'\n", cmd, a);
                return 2;
            }
            pos[np++] = argv[i];
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const cli_opt *o = NULL;
        for (size_t k = 0; k < nopts; k++)
            if (strlen(opts[k].name) == nlen && strncmp(opts[k].name, name, nlen) == 0) o = &opts[k];
        if (!o) {
            fprintf(stderr, "duplex %s: unknown option '--%.*s' (see duplex %s --help)\n", cmd,
                    (int)nlen, name, cmd);
            return 2;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (o->type == CLI_FLAG) {
            if (val) {
                fprintf(stderr, "duplex %s: --%s takes no value\n", cmd, o->name);
                return 2;
            }
        } else if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "duplex %s: --%s needs a value\n", cmd, o->name);
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
