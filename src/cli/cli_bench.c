/* cli_bench: `duplex bench <what>` dispatcher. */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "bench/bench_engine.h"
#include "bench/bench_gram.h"
#include "bench/bench_kld.h"
#include "bench/bench_tok.h"
#include "engine/engine.h"
#include "engine/kern/kern.h"
#include "tok/bpe_train.h"
#include "tok/hf_tok.h"
#include "model/model.h"

/* bench engine's and bench tok's and bench gram's own defaults (the
 * libraries' are in their headers) */
#define BENCH_ENGINE_PROMPT_TOKENS 512
#define BENCH_ENGINE_GEN_TOKENS    128
#define BENCH_TOK_MB               1
#define BENCH_GRAM_REPS            20

/* The usage lines, unformatted: clang-format would split the calls. */
/* clang-format off */
#define ENGINE_USAGE                                                                               \
    "--model FILE [--prompt-tokens " CLI_DEFAULT_INT(BENCH_ENGINE_PROMPT_TOKENS) "] "              \
    "[--gen-tokens " CLI_DEFAULT_INT(BENCH_ENGINE_GEN_TOKENS) "] [--depth D] [--threads N]"
#define TOK_USAGE                                                                                  \
    "--model FILE [--file F | --jsonl F] [--mb " CLI_DEFAULT_INT(BENCH_TOK_MB) "] "                \
    "[--reps " CLI_DEFAULT_INT(BENCH_TOK_DEFAULT_REPS) "]"
/* clang-format on */

/* One KV dtype's lines; `tag` names the dtype when several ran. */
static void print_engine_kv(const bench_engine_result *r, const bench_engine_kv *k, long pp,
                            long tg, long depth, long reps, const char *tag)
{
    if (pp)
        printf("pp%ld @ d%ld: %8.1f tok/s  (min %.1f, max %.1f, %ld runs; %.1f per CPU-second)  "
               "attention %2.0f%% of the time: %.1f GFLOP/s, %.1f GB/s of KV%s\n",
               pp, depth, k->pp.tok_s, k->pp.min, k->pp.max, reps, k->pp.cpu_tok_s,
               100 * k->pp.attn_share, k->pp.attn_gflop_s, k->pp.attn_gb_s, tag);
    if (!tg) return;
    printf("tg%ld @ d%ld: %8.1f tok/s  (min %.1f, max %.1f, %ld runs; %.1f per CPU-second)  "
           "attention %2.0f%% of the time: %.1f GFLOP/s, %.1f GB/s of KV%s\n",
           tg, depth, k->tg.tok_s, k->tg.min, k->tg.max, reps, k->tg.cpu_tok_s,
           100 * k->tg.attn_share, k->tg.attn_gflop_s, k->tg.attn_gb_s, tag);
    double limit = k->tg.bytes_per_tok > 0 ? r->mem_gb_s * 1e9 / k->tg.bytes_per_tok : 0;
    printf("decode reads %.3f GB per token (weights + KV): %.1f GB/s; memory reads %.1f GB/s "
           "on %d threads, a limit of %.1f tok/s (%.0f%% reached)%s\n",
           k->tg.bytes_per_tok * 1e-9, k->tg.bytes_per_tok * k->tg.tok_s * 1e-9, r->mem_gb_s,
           r->n_threads, limit, limit > 0 ? 100 * k->tg.tok_s / limit : 0.0, tag);
}

/* Each dtype after the first against the first: the speed-ups, and for
 * decode the ideal one the bytes a token reads give (weights + KV). */
static void print_engine_vs(const bench_engine_result *r, long pp, long tg)
{
    const bench_engine_kv *a = &r->kv[0];
    for (int i = 1; i < r->n_kv; i++) {
        const bench_engine_kv *b = &r->kv[i];
        printf("%s KV vs %s KV:", dx_dtype_name(b->kv_type), dx_dtype_name(a->kv_type));
        if (pp && a->pp.tok_s > 0)
            printf(" pp %.3fx (by CPU time %.3fx)", b->pp.tok_s / a->pp.tok_s,
                   a->pp.cpu_tok_s > 0 ? b->pp.cpu_tok_s / a->pp.cpu_tok_s : 0.0);
        if (tg && a->tg.tok_s > 0 && b->tg.bytes_per_tok > 0) {
            double got = b->tg.tok_s / a->tg.tok_s;
            double ideal = a->tg.bytes_per_tok / b->tg.bytes_per_tok;
            double cpu = a->tg.cpu_tok_s > 0 ? b->tg.cpu_tok_s / a->tg.cpu_tok_s : 0;
            printf("%s tg %.3fx (by CPU time %.3fx); ideal by the bytes a token reads %.3fx: "
                   "%.0f%% of it (%.0f%% by CPU time)",
                   pp ? "," : "", got, cpu, ideal, 100 * got / ideal, 100 * cpu / ideal);
        }
        printf("\n");
    }
}

static int bench_engine(int argc, char **argv)
{
    const char *path = NULL, *kv = ENGINE_DEFAULT_KV_DTYPE;
    long threads = 0, pp = BENCH_ENGINE_PROMPT_TOKENS, tg = BENCH_ENGINE_GEN_TOKENS, depth = 0;
    long reps = BENCH_ENGINE_DEFAULT_REPS;
    int synthetic = 0;
    const cli_opt opts[] = {
        {"model", CLI_PATH, &path, 0, 0, "GGUF model file (required)"},
        {"prompt-tokens", CLI_INT, &pp, 0, 1 << 20,
         CLI_HELP_DEFAULT("prefill tokens timed", BENCH_ENGINE_PROMPT_TOKENS)},
        {"gen-tokens", CLI_INT, &tg, 0, 1 << 20,
         CLI_HELP_DEFAULT("decode tokens timed", BENCH_ENGINE_GEN_TOKENS)},
        {"depth", CLI_INT, &depth, 0, 1 << 20, "context before the timed tokens (default 0)"},
        {"synthetic-depth", CLI_FLAG, &synthetic, 0, 0,
         "write the depth's KV with random values instead of computing it (the timed steps "
         "read and compute the same; a 16k depth in seconds)"},
        {"threads", CLI_INT, &threads, 0, 1024, "threads (default: cores)"},
        {"reps", CLI_INT, &reps, 1, 64,
         CLI_HELP_DEFAULT("repetitions; medians reported", BENCH_ENGINE_DEFAULT_REPS)},
        {"kv-dtype", CLI_STR, &kv, 0, 0,
         CLI_KV_DTYPE_HELP "; a comma list (f16,q8_0) runs each, interleaved, and compares"},
    };
    int rc = cli_parse("bench engine", ENGINE_USAGE, argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0,
                       NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (!path) return cli_required("bench engine", "--model FILE");
    int types[BENCH_ENGINE_MAX_KV], n_kv;
    if (bench_engine_parse_kv(kv, types, &n_kv)) return cli_bad_value("bench engine", "--kv-dtype");
    model *m;
    if (model_load(path, &m)) {
        fprintf(stderr, "duplex bench engine: %s\n", dx_errmsg());
        return 1;
    }
    bench_engine_config cfg = {(int)threads,   (uint32_t)pp, (uint32_t)tg, (uint32_t)depth,
                               (uint32_t)reps, kv,           synthetic};
    bench_engine_result r;
    if ((rc = bench_engine_run(&cfg, m, &r))) {
        fprintf(stderr, "duplex bench engine: %s\n", dx_errmsg());
        model_free(m);
        return 1;
    }
    const model_hparams *hp = model_hp(m);
    printf("model %s (%s, %u layers, embd %u), kernels %s (decode by %s), threads %d, kv %s%s\n",
           model_name(m), hp->arch_name, hp->n_layer, hp->n_embd, r.isa, r.decode, r.n_threads, kv,
           synthetic ? " (depth synthetic)" : "");
    for (int i = 0; i < r.n_kv; i++) {
        char tag[32] = "";
        if (r.n_kv > 1) snprintf(tag, sizeof tag, "  [kv %s]", dx_dtype_name(r.kv[i].kv_type));
        print_engine_kv(&r, &r.kv[i], pp, tg, depth, reps, tag);
    }
    print_engine_vs(&r, pp, tg);
    if (hp->n_expert)
        printf(
            "experts (router to weighted sums, %u of %u per token, kv %s): %.0f%% of the prefill's "
            "time, %.0f%% of the decode's\n",
            hp->n_expert_used, hp->n_expert, dx_dtype_name(r.kv[0].kv_type),
            100 * r.kv[0].pp.moe_share, 100 * r.kv[0].tg.moe_share);
    model_free(m);
    return 0;
}

/* The sample text: a file as it is, or (--jsonl) one JSON string per line,
 * joined with newlines (tests/data/tok/corpus.jsonl mixes scripts, code,
 * numbers and emoji); default the embedded BPE corpus. */
static int tok_sample(const char *file, int jsonl, dx_buf *out)
{
    if (!file) {
        size_t n;
        const char *c = bpe_corpus(&n);
        return dx_buf_append(out, c, n);
    }
    FILE *f = fopen(file, "rb");
    if (!f) return dx_errf(DX_EIO, "%s: cannot open", file);
    char line[1 << 16];
    int rc = 0;
    size_t lineno = 0;
    if (!jsonl) {
        size_t k;
        while (!rc && (k = fread(line, 1, sizeof line, f)) > 0) rc = dx_buf_append(out, line, k);
    } else {
        while (!rc && fgets(line, sizeof line, f)) {
            lineno++;
            json_error_t je;
            json_t *v = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!json_is_string(v))
                rc = dx_errf(DX_EFORMAT, "%s: line %zu is not a JSON string", file, lineno);
            else if (out->len)
                rc = dx_buf_putc(out, '\n');
            if (!rc) rc = dx_buf_append(out, json_string_value(v), json_string_length(v));
            json_decref(v);
        }
    }
    fclose(f);
    if (!rc && !out->len) rc = dx_errf(DX_EINVAL, "%s: no text", file);
    return rc;
}

static int bench_tok(int argc, char **argv)
{
    const char *path = NULL, *file = NULL, *jsonl = NULL;
    long reps = BENCH_TOK_DEFAULT_REPS;
    double mb = BENCH_TOK_MB;
    int special = 0;
    const cli_opt opts[] = {
        {"model", CLI_PATH, &path, 0, 0, "GGUF model file (required; only its tokenizer is read)"},
        {"file", CLI_PATH, &file, 0, 0, "sample text (default: the embedded BPE corpus)"},
        {"jsonl", CLI_PATH, &jsonl, 0, 0, "sample text as one JSON string per line"},
        {"mb", CLI_DBL, &mb, 0.001, 1024,
         CLI_HELP_DEFAULT("MB of text to encode: the sample repeated", BENCH_TOK_MB)},
        {"reps", CLI_INT, &reps, 1, 64,
         CLI_HELP_DEFAULT("runs; medians reported", BENCH_TOK_DEFAULT_REPS)},
        {"special", CLI_FLAG, &special, 0, 0, "match control tokens in the text"},
    };
    int rc = cli_parse("bench tok", TOK_USAGE, argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (!path) return cli_required("bench tok", "--model FILE");
    if (file && jsonl) {
        fprintf(stderr, "duplex bench tok: --file and --jsonl exclude each other: give one\n");
        return 2;
    }
    dx_buf text;
    dx_buf_init(&text, 0);
    bench_tok_result r;
    bench_tok_config cfg = {
        .model = path, .reps = (uint32_t)reps, .flags = special ? TOK_ALLOW_SPECIAL : 0};
    if (!(rc = tok_sample(jsonl ? jsonl : file, !!jsonl, &text))) {
        cfg.text = text.data;
        cfg.len = text.len;
        cfg.bytes = (size_t)(mb * 1e6);
        rc = bench_tok_run(&cfg, &r);
    }
    dx_buf_free(&text);
    if (rc) {
        fprintf(stderr, "duplex bench tok: %s\n", dx_errmsg());
        return 1;
    }
    printf("tokenizer of %s: %zu tokens, loaded in %.1f ms (first %.1f, min %.1f, max %.1f, %ld "
           "runs)\n",
           path, r.n_vocab, r.load_ms, r.first_load_ms, r.load_min_ms, r.load_max_ms, reps);
    printf("encode %zu bytes -> %zu tokens (%.2f bytes/token): %.1f MB/s (min %.1f, max %.1f); "
           "decode %.1f MB/s\n",
           r.bytes, r.tokens, r.tokens ? (double)r.bytes / (double)r.tokens : 0.0, r.encode_mb_s,
           r.encode_min, r.encode_max, r.decode_mb_s);
    return 0;
}

/* The vocabulary of a GGUF model (--model) or a Hugging Face tokenizer.json. */
static int gram_tok(const char *model_path, const char *tj, model **m, tok **t)
{
    if (model_path) return model_load_tokenizer(model_path, m);
    hf_tok h;
    int rc = hf_tok_load(tj, &h);
    if (!rc) rc = hf_tok_build(&h, t);
    hf_tok_free(&h);
    return rc;
}

static int bench_gram(int argc, char **argv)
{
    const char *path = NULL, *tj = NULL;
    long reps = BENCH_GRAM_REPS;
    const cli_opt opts[] = {
        {"model", CLI_PATH, &path, 0, 0, "GGUF model file (only its tokenizer is read)"},
        {"tokenizer", CLI_PATH, &tj, 0, 0, "or a Hugging Face tokenizer.json"},
        {"reps", CLI_INT, &reps, 1, 1000,
         CLI_HELP_DEFAULT("cached passes over the document", BENCH_GRAM_REPS)},
    };
    int rc = cli_parse(
        "bench gram",
        "--model FILE | --tokenizer tokenizer.json [--reps " CLI_DEFAULT_INT(BENCH_GRAM_REPS) "]",
        argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (!path == !tj) {
        fprintf(stderr, "duplex bench gram: give one of --model FILE and --tokenizer FILE\n");
        return 2;
    }
    model *m = NULL;
    tok *t = NULL;
    bench_gram_result r;
    rc = gram_tok(path, tj, &m, &t);
    if (!rc) rc = bench_gram_run(m ? model_tokenizer(m) : t, (uint32_t)reps, &r);
    model_free(m);
    tok_destroy(t);
    if (rc) {
        fprintf(stderr, "duplex bench gram: %s\n", dx_errmsg());
        return 1;
    }
    printf("vocabulary of %u tokens: byte trie built in %.1f ms\n", r.n_vocab, r.vocab_ms);
    for (int i = 0; i < 2; i++) {
        const bench_gram_case *c = &r.cases[i];
        printf("%-11s: %zu tokens, grammar compiled in %.2f ms; mask per token: first pass %.1f us "
               "mean (slowest %.0f us, up to %u tokens allowed), cached %.2f us mean (p99 %.2f "
               "us); accept %.2f us\n",
               c->name, c->tokens, c->compile_ms, c->cold_mean_us, c->cold_max_us, c->n_allowed_max,
               c->cached_mean_us, c->cached_p99_us, c->accept_mean_us);
    }
    return 0;
}

static int bench_run_cmd(int argc, char **argv)
{
    return cli_bench_multi_main("run", argc, argv);
}

static int bench_compare_cmd(int argc, char **argv)
{
    return cli_bench_multi_main("compare", argc, argv);
}

static void kld_progress(void *user, uint32_t done, uint32_t total)
{
    (void)user;
    fprintf(stderr, "\rbench kld: %u of %u tokens", done, total);
    if (done == total) fprintf(stderr, "\n");
}

static void print_kld_stat(const char *pair, const char *range, const bench_kld_stat *st)
{
    if (!st->n) return;
    printf("%-18s %-16s %6llu  %10.3e  %10.3e  %10.3e  %10.3e  %7.3f%%  %8.5f\n", pair, range,
           (unsigned long long)st->n, st->kld_mean, st->kld_median, st->kld_p99, st->kld_max,
           100 * st->same_top, st->rms_dlogit);
}

static void print_kld(const bench_kld_result *r)
{
    printf("%-18s %-16s %6s  %10s  %10s  %10s  %10s  %8s  %8s\n", "test vs base", "positions", "n",
           "KLD mean", "median", "p99", "max", "same top", "rms dlogit");
    for (int a = 0; a < r->n_kv; a++)
        for (int b = a + 1; b < r->n_kv; b++) {
            char pair[48], range[32];
            snprintf(pair, sizeof pair, "%s%s vs %s%s", r->is_base[b] ? "base " : "",
                     dx_dtype_name(r->kv_type[b]), r->is_base[a] ? "base " : "",
                     dx_dtype_name(r->kv_type[a]));
            for (int d = 0; d < BENCH_KLD_N_DEPTHS; d++) {
                if (d + 1 < BENCH_KLD_N_DEPTHS)
                    snprintf(range, sizeof range, "[%u, %u)", bench_kld_depth(d),
                             bench_kld_depth(d + 1));
                else
                    snprintf(range, sizeof range, "[%u, ...)", bench_kld_depth(d));
                print_kld_stat(pair, range, &r->st[a][b][d]);
            }
            snprintf(range, sizeof range, "[%u, %u) half", r->ctx / 2, r->ctx - 1);
            print_kld_stat(pair, range, &r->st[a][b][BENCH_KLD_HALF]);
        }
}

static int bench_kld(int argc, char **argv)
{
    const char *path = NULL, *file = NULL, *kv = NULL, *base_path = NULL;
    long threads = 0, ctx = 4096, chunk = BENCH_KLD_DEFAULT_CHUNK;
    const cli_opt opts[] = {
        {"model", CLI_PATH, &path, 0, 0, "GGUF model file (required)"},
        {"file", CLI_PATH, &file, 0, 0,
         "the text (required): its first --ctx tokens are the window"},
        {"ctx", CLI_INT, &ctx, 2, 1 << 20, "tokens of the window (default 4096)"},
        {"kv-dtype", CLI_STR, &kv, 0, 0,
         "KV dtypes, each compared with those before it (default f32,f16,q8_0; f16 with "
         "--base)"},
        {"base", CLI_PATH, &base_path, 0, 0,
         "a base model (e.g. the F32 file a quantised one came from): the model's runs "
         "against it, KL(base || model)"},
        {"chunk", CLI_INT, &chunk, 1, 4096,
         CLI_HELP_DEFAULT("tokens per forward step", BENCH_KLD_DEFAULT_CHUNK)},
        {"threads", CLI_INT, &threads, 0, 1024, "threads (default: cores)"},
    };
    int rc = cli_parse("bench kld",
                       "--model FILE --file TEXT [--ctx N] [--kv-dtype A,B,...] [--base FILE]",
                       argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (!kv) kv = base_path ? "f16" : "f32,f16,q8_0";
    if (!path) return cli_required("bench kld", "--model FILE");
    if (!file) return cli_required("bench kld", "--file TEXT");
    int types[BENCH_ENGINE_MAX_KV], n_kv;
    if (bench_engine_parse_kv(kv, types, &n_kv)) return cli_bad_value("bench kld", "--kv-dtype");
    dx_buf text;
    dx_buf_init(&text, 0);
    tok_ids ids;
    tok_ids_init(&ids);
    model *m = NULL, *base = NULL;
    bench_kld_result r;
    rc = tok_sample(file, 0, &text);
    if (!rc) rc = model_load(path, &m);
    if (!rc && base_path) rc = model_load(base_path, &base);
    if (!rc) rc = tok_encode(model_tokenizer(m), text.data, text.len, TOK_ADD_SPECIAL, &ids);
    bench_kld_config c = {.n_threads = (int)threads,
                          .tokens = ids.ids,
                          .n_tokens = ids.n,
                          .ctx = (uint32_t)ctx,
                          .kv_dtype = kv,
                          .base = base,
                          .chunk = (uint32_t)chunk,
                          .progress = kld_progress};
    if (!rc) rc = bench_kld_run(&c, m, &r);
    if (!rc) {
        const model_hparams *hp = model_hp(m);
        printf("model %s (%s, %u layers, %u vocab), kernels %s; a window of %u tokens of %s (%zu "
               "in all); kv %s; %.0f s\n",
               model_name(m), hp->arch_name, hp->n_layer, hp->n_vocab,
               kern_isa_name(kern_get_isa()), r.ctx, file, ids.n, kv, r.seconds);
        if (base) printf("base model %s\n", base_path);
        printf("mean entropy of the %s%s distributions %.3f nats (uniform over the vocabulary: "
               "%.3f)\n",
               base ? "base " : "", dx_dtype_name(r.kv_type[0]), r.mean_entropy,
               log((double)hp->n_vocab));
        print_kld(&r);
    } else {
        fprintf(stderr, "duplex bench kld: %s\n", dx_errmsg());
    }
    tok_ids_free(&ids);
    dx_buf_free(&text);
    model_free(m);
    model_free(base);
    return rc ? 1 : 0;
}

static int bench_report_cmd(int argc, char **argv)
{
    return cli_bench_multi_main("report", argc, argv);
}

static int bench_chat_cmd(int argc, char **argv)
{
    return cli_bench_multi_main("chat", argc, argv);
}

int cli_bench_main(int argc, char **argv)
{
    static const cli_cmd cmds[] = {
        {"engine", bench_engine, "prefill and decode speed of one engine (tok/s)"},
        {"kld", bench_kld, "what a KV dtype changes: KL divergence and top-1 agreement"},
        {"tok", bench_tok, "tokenizer load time and encode/decode speed (MB/s)"},
        {"gram", bench_gram, "constrained decoding: mask and accept time per token"},
        {"xfer", cli_bench_xfer_main, "KV transfer speed between two processes (GB/s)"},
        {"run", bench_run_cmd, "multi-turn agentic benchmark against any OpenAI endpoint"},
        {"compare", bench_compare_cmd, "the same workload on each serving mode (duplex up)"},
        {"chat", bench_chat_cmd, "one multi-turn chat, printed turn by turn"},
        {"report", bench_report_cmd, "summary.md and ttft.svg again from results.json files"},
    };
    return cli_group("bench", cmds, DX_ARRAY_LEN(cmds), argc, argv);
}
