/* cli_bench_run: `duplex bench run|compare|chat` — the multi-turn agentic
 * benchmark's flags, JSON config files and presets (src/bench/ does the
 * work).  Precedence: defaults < --preset (scaled by --scale) < --config
 * FILE < flags. */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "bench/bench_compare.h"
#include "engine/engine.h"
#include "bench/bench_fake.h"
#include "bench/bench_report.h"
#include "bench/bench_run.h"

/* The workload without --preset or --config (its lengths in tokens), and
 * where the reports go. */
#define WORK_CONVERSATIONS 8
#define WORK_TURNS         8
#define WORK_CLIENTS       4
#define WORK_PREFIX        1000
#define WORK_INPUT         150
#define WORK_OUTPUT        128
#define WORK_SEED          1
#define WORK_SCALE         1
#define WORK_OUT           "bench-out"
#define COMPARE_ROUNDS     1

static volatile int g_stop;

static void on_sigint(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* The flags every multi-turn subcommand shares, as strings until checked. */
typedef struct {
    const char *preset, *config, *prefix, *input, *output, *tokenizer, *url, *model, *api_key, *out,
        *api;
    long conversations, turns, clients, shared, seed, warmup;
    double think, scale, timeout;
    int send_id, no_progress;
    char prefix_s[64], input_s[64], output_s[64];
} wflags;

/* Applies "key": value pairs of a JSON config (the flags' names). */
static int apply_config(const char *path, wflags *f, bench_workload *w)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je), *v;
    if (!json_is_object(root)) {
        json_decref(root);
        return dx_errf(DX_EINVAL, "--config %s:%d: %s", path, je.line,
                       root ? "expected an object" : je.text);
    }
    const char *key;
    int rc = 0;
    json_object_foreach(root, key, v)
    {
        long *num = !strcmp(key, "conversations")          ? &f->conversations
                    : !strcmp(key, "turns")                ? &f->turns
                    : !strcmp(key, "clients")              ? &f->clients
                    : !strcmp(key, "shared-prefix-tokens") ? &f->shared
                    : !strcmp(key, "seed")                 ? &f->seed
                    : !strcmp(key, "warmup")               ? &f->warmup
                                                           : NULL;
        char *dist = !strcmp(key, "prefix-tokens")   ? f->prefix_s
                     : !strcmp(key, "input-tokens")  ? f->input_s
                     : !strcmp(key, "output-tokens") ? f->output_s
                                                     : NULL;
        if (num && json_is_integer(v) && json_integer_value(v) >= 0)
            *num = (long)json_integer_value(v);
        else if (dist && (json_is_string(v) || json_is_integer(v)))
            json_is_string(v) ? snprintf(dist, 64, "%s", json_string_value(v))
                              : snprintf(dist, 64, "%lld", (long long)json_integer_value(v));
        else if (!strcmp(key, "think-time") && json_is_number(v) && json_number_value(v) >= 0)
            f->think = json_number_value(v);
        else if (!strcmp(key, "send-conversation-id") && json_is_boolean(v))
            f->send_id = json_is_true(v);
        else {
            rc = dx_errf(DX_EINVAL, "--config %s: \"%s\": unknown key or bad value", path, key);
            break;
        }
    }
    (void)w;
    json_decref(root);
    return rc;
}

/* Defaults, then the preset and the config file named anywhere in argv. */
static int workload_defaults(int argc, char **argv, wflags *f, bench_workload *w)
{
    memset(w, 0, sizeof *w);
    *w = (bench_workload){.conversations = WORK_CONVERSATIONS,
                          .turns = WORK_TURNS,
                          .clients = WORK_CLIENTS,
                          .shared_prefix = 0,
                          .prefix = {BENCH_CONST, WORK_PREFIX, 0},
                          .input = {BENCH_CONST, WORK_INPUT, 0},
                          .output = {BENCH_CONST, WORK_OUTPUT, 0},
                          .seed = WORK_SEED,
                          .scale = WORK_SCALE};
    f->scale = WORK_SCALE;
    for (int i = 0; i + 1 < argc; i++) { /* the values that decide the defaults */
        if (!strcmp(argv[i], "--preset")) f->preset = argv[i + 1];
        if (!strcmp(argv[i], "--scale")) f->scale = strtod(argv[i + 1], NULL);
        if (!strcmp(argv[i], "--config")) f->config = argv[i + 1];
    }
    int rc = f->preset ? bench_workload_preset(f->preset, f->scale, w) : 0;
    if (rc) return rc;
    f->conversations = w->conversations, f->turns = w->turns, f->clients = w->clients;
    f->shared = w->shared_prefix, f->seed = (long)w->seed, f->think = w->think_s;
    bench_dist_format(&w->prefix, f->prefix_s, sizeof f->prefix_s);
    bench_dist_format(&w->input, f->input_s, sizeof f->input_s);
    bench_dist_format(&w->output, f->output_s, sizeof f->output_s);
    f->prefix = f->prefix_s, f->input = f->input_s, f->output = f->output_s;
    return f->config ? apply_config(f->config, f, w) : 0;
}

/* The checked workload from the flags. */
static int workload_from(wflags *f, bench_workload *w)
{
    int rc = bench_dist_parse(f->prefix, &w->prefix);
    if (rc) return dx_err_wrap(rc, "--prefix-tokens");
    if ((rc = bench_dist_parse(f->input, &w->input))) return dx_err_wrap(rc, "--input-tokens");
    if ((rc = bench_dist_parse(f->output, &w->output))) return dx_err_wrap(rc, "--output-tokens");
    w->conversations = (uint32_t)f->conversations, w->turns = (uint32_t)f->turns;
    w->clients = (uint32_t)f->clients, w->shared_prefix = (uint32_t)f->shared;
    w->seed = (uint64_t)f->seed, w->warmup = (uint32_t)f->warmup, w->think_s = f->think;
    w->send_conversation_id = f->send_id;
    return bench_workload_check(w);
}

#define WORKLOAD_OPTS(f)                                                                           \
    {"preset", CLI_STR, &(f).preset, 0, 0, "quick | paper (lengths scaled by --scale)"},           \
        {"scale", CLI_DBL, &(f).scale,                                                             \
         0.001,   1,       CLI_HELP_DEFAULT("scale of the preset's lengths", WORK_SCALE)},         \
        {"config", CLI_PATH, &(f).config, 0, 0, "JSON file: the workload flags as keys"},          \
        {"conversations",                                                                          \
         CLI_INT,                                                                                  \
         &(f).conversations,                                                                       \
         1,                                                                                        \
         1 << 20,                                                                                  \
         CLI_HELP_DEFAULT("conversations measured", WORK_CONVERSATIONS)},                          \
        {"turns", CLI_INT, &(f).turns,                                                             \
         1,       10000,   CLI_HELP_DEFAULT("turns per conversation", WORK_TURNS)},                \
        {"clients", CLI_INT, &(f).clients,                                                         \
         1,         4096,    CLI_HELP_DEFAULT("conversations at once", WORK_CLIENTS)},             \
        {"shared-prefix-tokens",                                                                   \
         CLI_INT,                                                                                  \
         &(f).shared,                                                                              \
         0,                                                                                        \
         1 << 24,                                                                                  \
         "system prompt all conversations share (tokens; default 0)"},                             \
        {"prefix-tokens",                                                                          \
         CLI_STR,                                                                                  \
         &(f).prefix,                                                                              \
         0,                                                                                        \
         0,                                                                                        \
         "each conversation's document: N | " CLI_HELP_DEFAULT(                                    \
             "uniform:A:B | lognormal:MEDIAN:SIGMA", WORK_PREFIX)},                                \
        {"input-tokens",                                                                           \
         CLI_STR,                                                                                  \
         &(f).input,                                                                               \
         0,                                                                                        \
         0,                                                                                        \
         "each turn's new message (same forms; default " CLI_DEFAULT_INT(WORK_INPUT) ")"},         \
        {"output-tokens",                                                                          \
         CLI_STR,                                                                                  \
         &(f).output,                                                                              \
         0,                                                                                        \
         0,                                                                                        \
         "tokens asked per turn (same forms; default " CLI_DEFAULT_INT(WORK_OUTPUT) ")"},          \
        {"think-time", CLI_DBL,                                                                    \
         &(f).think,   0,                                                                          \
         86400,        "seconds between a reply and the next turn (default 0)"},                   \
        {"seed", CLI_INT,  &(f).seed,                                                              \
         0,      1L << 62, CLI_HELP_DEFAULT("text and lengths seed", WORK_SEED)},                  \
        {"warmup", CLI_INT, &(f).warmup,                                                           \
         0,        1 << 20, "conversations run first, not measured (default 0)"},                  \
        {"send-conversation-id", CLI_FLAG, &(f).send_id, 0, 0, "send X-Conversation-Id"},          \
        {"tokenizer", CLI_PATH, &(f).tokenizer, 0, 0, "GGUF whose tokenizer counts the lengths"},  \
    {                                                                                              \
        "no-progress", CLI_FLAG, &(f).no_progress, 0, 0, "no progress on stderr"                   \
    }

static enum bench_progress progress_kind(const wflags *f)
{
    if (f->no_progress) return BENCH_PROGRESS_NONE;
    return isatty(2) ? BENCH_PROGRESS_BAR : BENCH_PROGRESS_LINES;
}

static int fail(const char *cmd, int code)
{
    fprintf(stderr, "duplex bench %s: %s\n", cmd, dx_errmsg());
    return code;
}

static int out_file(const char *dir, const char *name, FILE **f)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *f = fopen(path, "w");
    return *f ? 0 : dx_errf(DX_EIO, "%s: %s", path, strerror(errno));
}

/* results.json, summary.md and ttft.svg of one run. */
static int write_run(const char *dir, const bench_workload *w, const bench_meta *m,
                     const bench_results *r)
{
    if (mkdir(dir, 0755) && errno != EEXIST)
        return dx_errf(DX_EIO, "--out %s: %s", dir, strerror(errno));
    char path[700];
    snprintf(path, sizeof path, "%s/results.json", dir);
    int rc = bench_write_json(path, w, m, r);
    bench_series s = {.name = "run", .res = r};
    FILE *f;
    if (!rc && !(rc = out_file(dir, "summary.md", &f))) {
        rc = bench_write_summary(f, w, m, &s, 1);
        fclose(f);
    }
    if (!rc && !(rc = out_file(dir, "ttft.svg", &f))) {
        rc = bench_write_svg(f, w, &s, 1);
        fclose(f);
    }
    return rc;
}

static int bench_run_main(int argc, char **argv)
{
    wflags f = {.url = CLI_DEFAULT_URL, .out = WORK_OUT, .timeout = BENCH_RUN_DEFAULT_TIMEOUT_S};
    bench_workload w;
    if (workload_defaults(argc, argv, &f, &w)) return fail("run", 2);
    const cli_opt opts[] = {
        {"url", CLI_STR, &f.url, 0, 0, "endpoint (default " CLI_DEFAULT_URL ")"},
        {"model", CLI_STR, &f.model, 0, 0, "model name (default: the first of /v1/models)"},
        {"api-key", CLI_STR, &f.api_key, 0, 0, "sent as Authorization: Bearer"},
        {"api", CLI_STR, &f.api, 0, 0,
         "chat|messages|responses: the front door the workload goes through (default chat)"},
        {"out", CLI_PATH, &f.out, 0, 0, "directory for results.json, summary.md, ttft.svg"},
        {"timeout-s", CLI_DBL, &f.timeout, 1, 86400,
         CLI_HELP_DEFAULT("per request", BENCH_RUN_DEFAULT_TIMEOUT_S)},
        WORKLOAD_OPTS(f),
    };
    int rc = cli_parse("bench run", "[--url URL] [--preset quick|paper] [--out DIR] [...]", argc,
                       argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (workload_from(&f, &w)) return fail("run", 2);
    enum bench_api api = BENCH_API_CHAT;
    if (f.api && bench_api_parse(f.api, &api)) return cli_bad_value("bench run", "--api");
    bench_text *t;
    if (bench_text_create(f.tokenizer, &t)) return fail("run", 1);
    signal(SIGINT, on_sigint);
    bench_results r;
    bench_run_config c = {.url = f.url,
                          .api = api,
                          .model = f.model,
                          .api_key = f.api_key,
                          .w = &w,
                          .text = t,
                          .timeout_s = f.timeout,
                          .progress = progress_kind(&f),
                          .stop = &g_stop};
    rc = bench_run(&c, &r);
    bench_meta m = {.url = f.url, .tokens_exact = bench_text_exact(t)};
    m.overhead_ms = rc ? BENCH_UNKNOWN : bench_fake_overhead_ms(&w, t, &g_stop);
    if (!rc) rc = write_run(f.out, &w, &m, &r);
    if (!rc) {
        bench_series s = {.name = "run", .res = &r};
        bench_write_summary(stdout, &w, &m, &s, 1);
    }
    bench_results_free(&r);
    bench_text_destroy(t);
    return rc ? fail("run", g_stop ? 130 : 1) : 0;
}

/* bench compare's flags of its own (the workload's are in wflags). */
typedef struct {
    const char *modes, *model, *kv_dtype;
    long kv_mb, threads;
} cflags;

static int compare_one(wflags *f, bench_workload *w, bench_text *t, const cflags *cf,
                       const char *dir, FILE *sweep, uint32_t prefix)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return dx_errf(DX_EIO, "cannot find this binary (/proc/self/exe)");
    self[n] = 0;
    bench_compare_config c = {.exe = self,
                              .model = cf->model,
                              .modes = cf->modes,
                              .kv_cache_mb = cf->kv_mb,
                              .kv_dtype = cf->kv_dtype,
                              .threads_per_node = (int)cf->threads,
                              .w = w,
                              .text = t,
                              .tokenizer = f->tokenizer,
                              .out_dir = dir,
                              .progress = progress_kind(f),
                              .stop = &g_stop,
                              .out = stdout,
                              .sweep = sweep,
                              .sweep_prefix = prefix};
    return bench_compare_run(&c);
}

/* --prefix-sweep A,B,...: one comparison per prefix length, under DIR/prefix-N,
 * and DIR/sweep.md with the last turn's TTFT by mode. */
static int compare_sweep(wflags *f, bench_workload *w, bench_text *t, const cflags *cf,
                         const char *sweep)
{
    const char *modes = cf->modes;
    if (mkdir(f->out, 0755) && errno != EEXIST)
        return dx_errf(DX_EIO, "--out %s: %s", f->out, strerror(errno));
    FILE *sm;
    int rc = out_file(f->out, "sweep.md", &sm);
    if (rc) return rc;
    fprintf(sm,
            "# Prefix sweep: time to first token at the last turn (p50, ms)\n\n| prefix tokens |");
    for (const char *p = modes; *p;) {
        size_t len = strcspn(p, ",");
        fprintf(sm, " %.*s |", (int)len, p);
        p += len + (p[len] == ',');
    }
    fprintf(sm, " uni-nocache / bidi |\n|---|");
    for (const char *p = modes; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ','))
        fprintf(sm, "---|");
    fprintf(sm, "---|\n");
    for (const char *p = sweep; !rc && *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || (*end && *end != ','))
            rc = dx_errf(DX_EINVAL, "--prefix-sweep: want token counts like 2048,4096");
        if (rc) break;
        uint32_t scaled = (uint32_t)(v * f->scale < 1 ? 1 : v * f->scale);
        w->prefix = (bench_dist){BENCH_CONST, scaled, 0};
        char dir[700];
        snprintf(dir, sizeof dir, "%s/prefix-%u", f->out, scaled);
        printf("\n== prefix %u tokens\n", scaled);
        rc = compare_one(f, w, t, cf, dir, sm, scaled);
        p = *end ? end + 1 : end;
    }
    fclose(sm);
    return rc;
}

static int bench_compare_main(int argc, char **argv)
{
    wflags f = {.out = WORK_OUT, .timeout = BENCH_RUN_DEFAULT_TIMEOUT_S};
    const char *modes = "uni-nocache,uni,bidi,colocated", *model = NULL, *sweep = NULL;
    const char *kv_dtype = NULL;
    long kv_mb = 0, threads = 0, rounds = COMPARE_ROUNDS;
    bench_workload w;
    if (workload_defaults(argc, argv, &f, &w)) return fail("compare", 2);
    const cli_opt opts[] = {
        {"model", CLI_PATH, &model, 0, 0, "GGUF model (default: " DEFAULT_MODEL ", made once)"},
        {"modes", CLI_STR, &modes, 0, 0,
         "uni-nocache,uni,bidi,bidi-rt,colocated (default: all but bidi-rt); MODE@DTYPE: that "
         "KV dtype (bidi-rt,bidi-rt@q8_0)"},
        {"kv-dtype", CLI_STR, &kv_dtype, 0, 0,
         "every node's KV dtype unless a mode says (default: serve's, " ENGINE_DEFAULT_KV_DTYPE
         ")"},
        {"out", CLI_PATH, &f.out, 0, 0, "directory for the reports (default " WORK_OUT ")"},
        {"kv-cache-mb", CLI_INT, &kv_mb, 1, 1 << 22, "KV pool per node (default: serve's)"},
        {"threads-per-node", CLI_INT, &threads, 0, 1024,
         "engine threads per node (default: cores)"},
        {"prefix-sweep", CLI_STR, &sweep, 0, 0, "prefix lengths to run in turn, e.g. 2048,8192"},
        {"rounds", CLI_INT, &rounds, 1, 1000,
         CLI_HELP_DEFAULT("run the modes in turn this many times", COMPARE_ROUNDS)},
        WORKLOAD_OPTS(f),
    };
    int rc = cli_parse("bench compare", "[--preset quick|paper] [--modes LIST] [--out DIR] [...]",
                       argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    int kvt;
    if (kv_dtype && engine_parse_kv_dtype(kv_dtype, &kvt))
        return cli_bad_value("bench compare", "--kv-dtype");
    if (workload_from(&f, &w) || bench_compare_check_modes(modes)) return fail("compare", 2);
    w.rounds = (uint32_t)rounds;
    if (!threads) threads = sysconf(_SC_NPROCESSORS_ONLN); /* one node computes at a time */
    if (!model) { /* duplex up's default, named here so that lengths are in its tokens */
        if (cli_default_model()) return 1;
        model = DEFAULT_MODEL;
    }
    bench_text *t;
    if (bench_text_create(f.tokenizer ? f.tokenizer : model, &t)) return fail("compare", 1);
    signal(SIGINT, on_sigint);
    signal(SIGTERM, on_sigint);
    printf("duplex bench compare: %u conversations x %u turns, %u at a time%s%s (scale %g); "
           "modes %s%s%.0ld%s\n",
           w.conversations, w.turns, w.clients, w.preset ? ", preset " : "",
           w.preset ? w.preset : "", w.scale, modes, rounds > 1 ? ", " : "",
           rounds > 1 ? rounds : 0, rounds > 1 ? " interleaved rounds" : "");
    fflush(stdout);
    cflags cf = {modes, model, kv_dtype, kv_mb, threads};
    rc = sweep ? compare_sweep(&f, &w, t, &cf, sweep) : compare_one(&f, &w, t, &cf, f.out, NULL, 0);
    bench_text_destroy(t);
    if (rc) return fail("compare", g_stop ? 130 : 1);
    if (sweep)
        printf("reports: %s/sweep.md and %s/prefix-*/\n", f.out, f.out);
    else
        printf("reports: %s/summary.md, %s/ttft.svg\n", f.out, f.out);
    return 0;
}

/* One conversation, printed turn by turn (the demo's view). */
typedef struct {
    int json, show;
} chat_out;

static void print_turn(void *user, const bench_record *r, const char *answer, size_t len)
{
    const chat_out *o = user;
    if (o->json) {
        printf("{\"turn\":%u,\"prompt_tokens\":%ld,\"cached_tokens\":%ld,\"completion_tokens\":%ld,"
               "\"ttft_ms\":%.3f,\"total_ms\":%.3f,\"error\":\"%s\"}\n",
               r->turn, r->prompt_tokens, r->cached_tokens, r->completion_tokens, r->ttft_s * 1e3,
               r->e2e_s * 1e3, bench_err_name(r->err));
    } else if (r->err) {
        printf("turn %2u  failed: %s %s\n", r->turn, bench_err_name(r->err), r->detail);
    } else {
        printf("turn %2u  prompt %6ld  cached %6ld  computed %6ld  ttft %9.1f ms  total %9.1f ms\n",
               r->turn, r->prompt_tokens, r->cached_tokens, r->prompt_tokens - r->cached_tokens,
               r->ttft_s * 1e3, r->e2e_s * 1e3);
        if (o->show && answer) { /* the first line, at most 72 bytes, whole characters */
            size_t k = 0;
            while (k < len && k < 72 && answer[k] != '\n') k++;
            while (k && k < len && ((unsigned char)answer[k] & 0xC0) == 0x80) k--;
            printf("         assistant: ");
            for (size_t i = 0; i < k; i++)
                putchar((unsigned char)answer[i] < 0x20 ? '.' : answer[i]);
            printf("%s\n", k < len ? " ..." : "");
        }
    }
    fflush(stdout);
}

static int bench_chat_main(int argc, char **argv)
{
    wflags f = {.url = CLI_DEFAULT_URL, .timeout = BENCH_RUN_DEFAULT_TIMEOUT_S};
    chat_out o = {0};
    bench_workload w;
    if (workload_defaults(argc, argv, &f, &w)) return fail("chat", 2);
    f.conversations = 1, f.clients = 1;
    const cli_opt opts[] = {
        {"url", CLI_STR, &f.url, 0, 0, "endpoint (default " CLI_DEFAULT_URL ")"},
        {"model", CLI_STR, &f.model, 0, 0, "model name (default: the first of /v1/models)"},
        {"api-key", CLI_STR, &f.api_key, 0, 0, "sent as Authorization: Bearer"},
        {"turns", CLI_INT, &f.turns, 1, 10000, CLI_HELP_DEFAULT("turns", WORK_TURNS)},
        {"prefix-tokens", CLI_STR, &f.prefix, 0, 0, "the first message's document (tokens)"},
        {"input-tokens", CLI_STR, &f.input, 0, 0, "each later turn's new message (tokens)"},
        {"output-tokens", CLI_STR, &f.output, 0, 0, "tokens generated per turn"},
        {"seed", CLI_INT, &f.seed, 0, 1L << 62, CLI_HELP_DEFAULT("text seed", WORK_SEED)},
        {"send-conversation-id", CLI_FLAG, &f.send_id, 0, 0, "send X-Conversation-Id"},
        {"tokenizer", CLI_PATH, &f.tokenizer, 0, 0, "GGUF whose tokenizer counts the lengths"},
        {"json", CLI_FLAG, &o.json, 0, 0, "one JSON object per turn"},
        {"show", CLI_FLAG, &o.show, 0, 0, "print the start of each answer"},
    };
    int rc =
        cli_parse("bench chat",
                  "[--url URL] [--turns " CLI_DEFAULT_INT(WORK_TURNS) "] [--prefix-tokens N] [...]",
                  argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (workload_from(&f, &w)) return fail("chat", 2);
    if (strncmp(f.url, "http://", 7)) {
        fprintf(stderr, "duplex bench chat: --url wants http://HOST:PORT, got '%s'\n", f.url);
        return 2;
    }
    bench_text *t;
    if (bench_text_create(f.tokenizer, &t)) return fail("chat", 1);
    bench_results r;
    bench_run_config c = {.url = f.url,
                          .model = f.model,
                          .api_key = f.api_key,
                          .w = &w,
                          .text = t,
                          .timeout_s = f.timeout,
                          .on_record = print_turn,
                          .user = &o};
    rc = bench_run(&c, &r);
    int failed = 0;
    for (size_t i = 0; i < r.n; i++) failed |= r.rec[i].err != BENCH_OK;
    bench_results_free(&r);
    bench_text_destroy(t);
    if (rc) return fail("chat", 1);
    return failed ? 1 : 0;
}

/* The series' name for a results file: its folder's name (bench compare's
 * DIR/<mode>/results.json), else the file's name without .json. */
static void series_name(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (slash && !strcmp(base, "results.json")) {
        const char *p = slash;
        while (p > path && p[-1] != '/') p--;
        snprintf(out, cap, "%.*s", (int)(slash - p), p);
    } else {
        size_t n = strlen(base);
        snprintf(out, cap, "%.*s", (int)(n > 5 && !strcmp(base + n - 5, ".json") ? n - 5 : n),
                 base);
    }
    if (!out[0]) snprintf(out, cap, "run");
}

/* Reports again from results.json files: one series each. */
static int bench_report_main(int argc, char **argv)
{
    const char *out = WORK_OUT;
    const cli_opt opts[] = {
        {"out", CLI_PATH, &out, 0, 0,
         "directory for summary.md and ttft.svg (default " WORK_OUT ")"},
    };
    enum { MAX = 8 };
    char *files[MAX];
    int n = 0;
    int rc = cli_parse("bench report", "[--out DIR] RESULTS.json...", argc, argv, opts,
                       DX_ARRAY_LEN(opts), files, MAX, &n);
    if (rc) return rc == 1 ? 0 : rc;
    if (!n) {
        fprintf(stderr, "duplex bench report: name one or more results.json files\n");
        return 2;
    }
    bench_workload w[MAX];
    bench_meta m[MAX];
    bench_results r[MAX];
    bench_series s[MAX];
    char names[MAX][64];
    int got = 0;
    for (; got < n; got++) {
        if ((rc = bench_read_json(files[got], &w[got], &m[got], &r[got]))) break;
        series_name(files[got], names[got], sizeof names[got]);
        s[got] = (bench_series){.name = names[got], .res = &r[got], .kv = m[got].kv};
    }
    if (!rc && mkdir(out, 0755) && errno != EEXIST)
        rc = dx_errf(DX_EIO, "--out %s: %s", out, strerror(errno));
    FILE *f;
    if (!rc && !(rc = out_file(out, "summary.md", &f))) {
        rc = bench_write_summary(f, &w[0], &m[0], s, (size_t)n);
        fclose(f);
    }
    if (!rc && !(rc = out_file(out, "ttft.svg", &f))) {
        rc = bench_write_svg(f, &w[0], s, (size_t)n);
        fclose(f);
    }
    if (!rc) {
        bench_print_turns(stdout, &w[0], s, (size_t)n);
        printf("reports: %s/summary.md, %s/ttft.svg\n", out, out);
    }
    for (int i = 0; i < got; i++) bench_results_free(&r[i]);
    return rc ? fail("report", 1) : 0;
}

int cli_bench_multi_main(const char *what, int argc, char **argv)
{
    if (!strcmp(what, "run")) return bench_run_main(argc, argv);
    if (!strcmp(what, "compare")) return bench_compare_main(argc, argv);
    if (!strcmp(what, "report")) return bench_report_main(argc, argv);
    return bench_chat_main(argc, argv);
}
