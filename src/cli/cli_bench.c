/* cli_bench: `duplex bench <what>` dispatcher. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "bench/bench_chat.h"
#include "bench/bench_engine.h"
#include "engine/engine.h"

static int bench_engine(int argc, char **argv)
{
    const char *path = NULL, *kv = "f16";
    long threads = 0, pp = 512, tg = 128, depth = 0, reps = 3;
    const cli_opt opts[] = {
        {"model", CLI_PATH, &path, 0, 0, "GGUF model file (required)"},
        {"prompt-tokens", CLI_INT, &pp, 0, 1 << 20, "prefill tokens timed (default 512)"},
        {"gen-tokens", CLI_INT, &tg, 0, 1 << 20, "decode tokens timed (default 128)"},
        {"depth", CLI_INT, &depth, 0, 1 << 20, "context before the timed tokens (default 0)"},
        {"threads", CLI_INT, &threads, 0, 1024, "threads (default: cores)"},
        {"reps", CLI_INT, &reps, 1, 64, "repetitions; medians reported (default 3)"},
        {"kv-dtype", CLI_STR, &kv, 0, 0, "f16 | bf16 | f32"},
    };
    int rc = cli_parse("bench engine", "--model FILE [--prompt-tokens 512] [--gen-tokens 128] "
                       "[--depth D] [--threads N]", argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0,
                       NULL);
    if (rc) return rc == 1 ? 0 : rc;
    int kvt;
    if (!path) return cli_required("bench engine", "--model FILE");
    if (engine_parse_kv_dtype(kv, &kvt)) return cli_bad_value("bench engine", "--kv-dtype");
    model *m;
    if (model_load(path, &m)) {
        fprintf(stderr, "duplex bench engine: %s\n", dx_errmsg());
        return 1;
    }
    bench_engine_config cfg = {(int)threads, (uint32_t)pp, (uint32_t)tg, (uint32_t)depth,
                               (uint32_t)reps, kv};
    bench_engine_result r;
    if ((rc = bench_engine_run(&cfg, m, &r))) {
        fprintf(stderr, "duplex bench engine: %s\n", dx_errmsg());
        model_free(m);
        return 1;
    }
    const model_hparams *hp = model_hp(m);
    printf("model %s (%s, %u layers, embd %u), kernels %s, threads %d, kv %s\n", model_name(m),
           hp->arch_name, hp->n_layer, hp->n_embd, r.isa, r.n_threads, kv);
    if (pp)
        printf("pp%ld @ d%ld: %8.1f tok/s  (min %.1f, max %.1f, %ld runs)  attention %2.0f%% of "
               "the time: %.1f GFLOP/s, %.1f GB/s of KV\n",
               pp, depth, r.pp.tok_s, r.pp.min, r.pp.max, reps, 100 * r.pp.attn_share,
               r.pp.attn_gflop_s, r.pp.attn_gb_s);
    if (tg) {
        printf("tg%ld @ d%ld: %8.1f tok/s  (min %.1f, max %.1f, %ld runs)  attention %2.0f%% of "
               "the time: %.1f GFLOP/s, %.1f GB/s of KV\n",
               tg, depth, r.tg.tok_s, r.tg.min, r.tg.max, reps, 100 * r.tg.attn_share,
               r.tg.attn_gflop_s, r.tg.attn_gb_s);
        double limit = r.tg.bytes_per_tok > 0 ? r.mem_gb_s * 1e9 / r.tg.bytes_per_tok : 0;
        printf("decode reads %.3f GB per token (weights + KV): %.1f GB/s; memory reads %.1f GB/s "
               "on %d threads, a limit of %.1f tok/s (%.0f%% reached)\n",
               r.tg.bytes_per_tok * 1e-9, r.tg.bytes_per_tok * r.tg.tok_s * 1e-9, r.mem_gb_s,
               r.n_threads, limit, limit > 0 ? 100 * r.tg.tok_s / limit : 0.0);
    }
    model_free(m);
    return 0;
}

typedef struct {
    int json, show;
} chat_out;

/* The first line of an answer, at most 72 bytes, control bytes as '.'. */
static void print_answer(const char *a, size_t n)
{
    char line[80];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 72 && a[i] != '\n'; i++)
        line[k++] = (unsigned char)a[i] < 0x20 ? '.' : a[i];
    /* do not cut a UTF-8 sequence */
    while (k && k < n && ((unsigned char)line[k - 1] & 0xC0) == 0x80) k--;
    if (k && (unsigned char)line[k - 1] >= 0xC0) k--;
    printf("         assistant: %.*s%s\n", (int)k, line, k < n ? " ..." : "");
}

static void print_turn(void *user, int turn, const bench_chat_turn *t)
{
    const chat_out *o = user;
    int json = o->json;
    if (json)
        printf("{\"turn\":%d,\"prompt_tokens\":%ld,\"cached_tokens\":%ld,"
               "\"completion_tokens\":%ld,\"ttft_ms\":%.3f,\"total_ms\":%.3f}\n",
               turn, t->prompt_tokens, t->cached_tokens, t->completion_tokens, t->ttft_s * 1e3,
               t->total_s * 1e3);
    else
        printf("turn %2d  prompt %6ld  cached %6ld  computed %6ld  ttft %9.1f ms  total %9.1f ms\n",
               turn, t->prompt_tokens, t->cached_tokens, t->prompt_tokens - t->cached_tokens,
               t->ttft_s * 1e3, t->total_s * 1e3);
    if (o->show && !json && t->answer) print_answer(t->answer, t->answer_bytes);
    fflush(stdout);
}

static int bench_chat(int argc, char **argv)
{
    const char *url = "http://127.0.0.1:8000", *model = NULL, *cid = NULL;
    long turns = 8, prefix = 700, input = 80, output = 64, seed = 1;
    chat_out o = {0};
    const cli_opt opts[] = {
        {"url", CLI_STR, &url, 0, 0, "endpoint (default http://127.0.0.1:8000)"},
        {"model", CLI_STR, &model, 0, 0, "model name (default: the first of /v1/models)"},
        {"turns", CLI_INT, &turns, 1, 1000, "turns (default 8)"},
        {"prefix-words", CLI_INT, &prefix, 0, 1 << 20, "words of the first message's document (default 700)"},
        {"input-words", CLI_INT, &input, 1, 1 << 20, "words each later turn adds (default 80)"},
        {"output-tokens", CLI_INT, &output, 1, 1 << 20, "tokens generated per turn (default 64)"},
        {"seed", CLI_INT, &seed, 0, 1L << 31, "text seed (default 1)"},
        {"conversation-id", CLI_STR, &cid, 0, 0, "send X-Conversation-Id"},
        {"json", CLI_FLAG, &o.json, 0, 0, "one JSON object per turn"},
        {"show", CLI_FLAG, &o.show, 0, 0, "print the start of each answer"},
    };
    int rc = cli_parse("bench chat", "[--url URL] [--turns 8] [--prefix-words N] [...]", argc, argv,
                       opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (strncmp(url, "http://", 7)) {
        fprintf(stderr, "duplex bench chat: --url wants http://HOST:PORT, got '%s'\n", url);
        return 2;
    }
    bench_chat_config c = {.url = url, .model = model, .turns = (int)turns,
                           .prefix_words = (int)prefix, .input_words = (int)input,
                           .output_tokens = (int)output, .seed = (unsigned)seed,
                           .conversation_id = cid, .on_turn = print_turn, .user = &o};
    bench_chat_turn *t = dx_calloc((size_t)turns, sizeof *t);
    if (!t) return 1;
    rc = bench_chat_run(&c, t);
    dx_free(t);
    if (rc) {
        fprintf(stderr, "duplex bench chat: %s\n", dx_errmsg());
        return 1;
    }
    return 0;
}

int cli_bench_main(int argc, char **argv)
{
    static const cli_cmd cmds[] = {
        {"engine", bench_engine, "prefill and decode speed of one engine (tok/s)"},
        {"xfer", cli_bench_xfer_main, "KV transfer speed between two processes (GB/s)"},
        {"chat", bench_chat, "a multi-turn chat against a server: per-turn TTFT and reuse"},
    };
    return cli_group("bench", cmds, DX_ARRAY_LEN(cmds), argc, argv);
}
