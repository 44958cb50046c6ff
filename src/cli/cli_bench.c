/* cli_bench: `duplex bench <what>` dispatcher. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
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
    printf("model %s (%s, %u layers, embd %u), kernels %s, threads %ld, kv %s\n", model_name(m),
           hp->arch_name, hp->n_layer, hp->n_embd, r.isa, threads, kv);
    if (pp)
        printf("pp%ld @ d%ld: %8.1f tok/s  (min %.1f, max %.1f, %ld runs)\n", pp, depth,
               r.pp_tok_s, r.pp_min, r.pp_max, reps);
    if (tg)
        printf("tg%ld @ d%ld: %8.1f tok/s  (min %.1f, max %.1f, %ld runs)\n", tg, depth,
               r.tg_tok_s, r.tg_min, r.tg_max, reps);
    model_free(m);
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
        {"xfer", cli_bench_xfer_main, "KV transfer speed between two processes (GB/s)"},
        {"run", bench_run_cmd, "multi-turn agentic benchmark against any OpenAI endpoint"},
        {"compare", bench_compare_cmd, "the same workload on each serving mode (duplex up)"},
        {"chat", bench_chat_cmd, "one multi-turn chat, printed turn by turn"},
        {"report", bench_report_cmd, "summary.md and ttft.svg again from results.json files"},
    };
    return cli_group("bench", cmds, DX_ARRAY_LEN(cmds), argc, argv);
}
