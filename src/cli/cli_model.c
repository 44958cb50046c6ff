/* cli_model: `duplex model synth` and `duplex model info`. */
#include "cli.h"

#include <stdio.h>

#include "base/dx_buf.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "model/model.h"
#include "model/model_wtypes.h"
#include "model/synth.h"
#include "tok/tok_norm.h"

#define SYNTH_SEED 1 /* model synth's --seed unless told */

static int cmd_synth(int argc, char **argv)
{
    const char *arch = NULL, *preset = "tiny", *dtype = "f32", *out = NULL, *tokenizer = NULL;
    uint64_t seed = SYNTH_SEED;
    long layers = 0; /* CLI_INT stores a long */
    int dry_run = 0;
    const cli_opt opts[] = {
        {"arch", CLI_STR, &arch, 0, 0,
         "qwen3 | qwen2 | llama | qwen3moe (default: the preset's, else qwen3moe for a mixture "
         "of experts and qwen3)"},
        {"preset", CLI_STR, &preset, 0, 0,
         "tiny | tiny-k | small | 0.6b | qwen3-0.6b | llama3.2-1b | tiny-moe | tiny-moe-k | "
         "qwen3-30b-a3b "
         "(default tiny)"},
        {"layers", CLI_INT, &layers, 1, 1024,
         "layers instead of the preset's (the real per-layer shape in a smaller file)"},
        {"dtype", CLI_STR, &dtype, 0, 0,
         "weight types: one for every matrix, f32 | f16 | bf16 | q8_0 | q5_1 | q5_0 | q4_1 | "
         "q4_0 | iq4_nl, or a llama-quantize preset, each matrix of the type llama-quantize "
         "gives it, q6_k | q5_k_m | q5_k_s | q4_k_m | q4_k_s | iq4_xs | q3_k_l | q3_k_m | "
         "q3_k_s | q2_k | q2_k_s (vectors and an MoE router stay f32; default f32)"},
        {"dry-run", CLI_FLAG, &dry_run, 0, 0,
         "print each tensor's name, type and shape instead of writing a file (as "
         "llama-quantize --dry-run)"},
        {"seed", CLI_U64, &seed, 0, 0, CLI_HELP_DEFAULT("random seed", SYNTH_SEED)},
        {"tokenizer", CLI_PATH, &tokenizer, 0, 0,
         "a Hugging Face tokenizer.json (or its directory; tokenizer_config.json beside it is "
         "read too) to use instead of the synthetic vocabulary"},
        {"o", CLI_PATH, &out, 0, 0, "output file (required unless --dry-run)"},
        {"output", CLI_PATH, &out, 0, 0, "same as -o"},
    };
    const char *usage = "[--arch A] --preset P [--layers N] --dtype T [--tokenizer PATH] [--seed "
                        "N] (-o FILE | --dry-run)";
    int rc = cli_parse("model synth", usage, argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (!out && !dry_run) return cli_required("model synth", "-o FILE");
    synth_config cfg = {
        .preset = preset, .seed = seed, .tokenizer = tokenizer, .n_layer = (uint32_t)layers};
    if (synth_check_preset(preset)) return cli_bad_value("model synth", "--preset");
    const synth_preset *sp = synth_find_preset(preset);
    cfg.arch = synth_default_arch(sp);
    if (arch && synth_parse_arch(arch, &cfg.arch)) return cli_bad_value("model synth", "--arch");
    if (synth_check_wtypes(dtype)) return cli_bad_value("model synth", "--dtype");
    cfg.wtypes = synth_find_wtypes(dtype);
    dx_buf list;
    dx_buf_init(&list, 0);
    if (dry_run) cfg.list = &list;
    rc = synth_write(&cfg, out);
    if (!rc && dry_run) fputs(list.data, stdout);
    dx_buf_free(&list);
    if (rc) {
        fprintf(stderr, "duplex model synth: %s\n", dx_errmsg());
        return 1;
    }
    if (dry_run) return 0;
    char lay[32] = "";
    if (layers) snprintf(lay, sizeof lay, ", %ld layers", layers);
    fprintf(stderr, "wrote %s (%s %s%s %s, seed %llu, %s vocabulary)\n", out,
            arch                         ? arch
            : cfg.arch == MODEL_QWEN3MOE ? "qwen3moe"
            : cfg.arch == MODEL_LLAMA    ? "llama"
                                         : "qwen3",
            preset, lay, dtype, (unsigned long long)seed, tokenizer ? tokenizer : "synthetic");
    return 0;
}

static void print_info(const model *m)
{
    const model_hparams *hp = model_hp(m);
    const gguf_ctx *g = model_gguf(m);
    uint64_t fp[2];
    model_fingerprint(m, fp);
    printf("file:            %s (%.1f MiB, GGUF v%u)\n", model_path(m),
           (double)gguf_file_size(g) / (1 << 20), gguf_version(g));
    printf("name:            %s\n", model_name(m));
    printf("architecture:    %s\n", hp->arch_name);
    printf("parameters:      %llu (%.3f B)", (unsigned long long)model_n_params(m),
           (double)model_n_params(m) / 1e9);
    if (hp->n_expert)
        printf(", %llu (%.3f B) active per token", (unsigned long long)model_n_active_params(m),
               (double)model_n_active_params(m) / 1e9);
    printf("\n");
    printf("layers:          %u\n", hp->n_layer);
    printf("embedding:       %u\n", hp->n_embd);
    if (hp->n_expert)
        printf("experts:         %u, %u used per token, expert feed-forward %u (softmax over the "
               "router, top %u%s)\n",
               hp->n_expert, hp->n_expert_used, hp->n_ff_exp, hp->n_expert_used,
               hp->expert_weights_norm ? ", weights normalised to sum 1" : "");
    else
        printf("feed-forward:    %u\n", hp->n_ff);
    printf("heads:           %u query, %u kv (GQA %u:1), head dim %u\n", hp->n_head, hp->n_kv_head,
           hp->n_head / hp->n_kv_head, hp->head_dim);
    printf("context length:  %u\n", hp->n_ctx_train);
    printf("rms epsilon:     %g\n", hp->rms_eps);
    char base[32];
    cli_fmt_num(base, sizeof base, hp->rope_base);
    printf("rope:            base %s, %s%s\n", base, hp->rope_neox ? "neox" : "normal",
           model_rope_freqs(m) ? ", frequency divisors (rope_freqs.weight: Llama 3 scaling)" : "");
    printf("extras:          %s%s%s\n", hp->qk_norm ? "q/k norm " : "",
           hp->qkv_bias ? "qkv bias " : "", hp->tied_output ? "tied output" : "untied output");
    uint64_t count[64] = {0}, bytes[64] = {0};
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        gguf_tensor_info ti;
        gguf_tensor(g, i, &ti);
        count[ti.type & 63]++;
        bytes[ti.type & 63] += ti.nbytes;
    }
    printf("tensors:         %llu:", (unsigned long long)gguf_n_tensors(g));
    for (int t = 0; t < 64; t++)
        if (count[t])
            printf(" %llu %s (%.1f MiB)", (unsigned long long)count[t], dx_dtype_name(t),
                   (double)bytes[t] / (1 << 20));
    printf("\n");
    dx_buf wt;
    dx_buf_init(&wt, 0);
    if (model_wtypes_summary(g, &wt) == 0) printf("weights:         %s\n", wt.data);
    dx_buf_free(&wt);
    const tok *tk = model_tokenizer(m);
    printf("tokenizer:       gpt2 byte-level BPE, pre-tokenizer %s, normalizer %s, %zu tokens "
           "(bos %d%s, eos %d, eot %d)\n",
           tok_pre_name(tok_get_pre(tk)), tok_norm_name(tok_get_norm(tk)), tok_vocab_size(tk),
           tok_bos(tk), tok_add_bos(tk) ? " added" : "", tok_eos(tk), tok_eot(tk));
    size_t n_eog;
    const int32_t *eog = tok_eog_ids(tk, &n_eog);
    printf("end of generation:");
    for (size_t i = 0; i < n_eog; i++) {
        tok_strview p = tok_piece(tk, eog[i]);
        printf(" %d %.*s", eog[i], (int)p.len, p.ptr);
    }
    printf("\n");
    printf("chat template:   %s\n", chat_tmpl_name(model_chat_kind(m)));
    printf("fingerprint:     %016llx%016llx\n", (unsigned long long)fp[1],
           (unsigned long long)fp[0]);
    printf("                 (XXH3-128 of the architecture, its hyper-parameters and every\n"
           "                 tensor's name, shape, type and data; nodes share KV only when\n"
           "                 it matches)\n");
}

static int cmd_info(int argc, char **argv)
{
    char *pos[1];
    int np = 0;
    int rc = cli_parse("model info", "FILE", argc, argv, NULL, 0, pos, 1, &np);
    if (rc) return rc == 1 ? 0 : rc;
    if (np != 1) return cli_required("model info", "a GGUF file (duplex model info FILE)");
    model *m;
    if (model_load(pos[0], &m)) {
        fprintf(stderr, "duplex model info: %s\n", dx_errmsg());
        return 1;
    }
    print_info(m);
    model_free(m);
    return 0;
}

int cli_model_main(int argc, char **argv)
{
    static const cli_cmd cmds[] = {
        {"synth", cmd_synth,
         "write a random-weight GGUF model (qwen3|qwen2|llama|qwen3moe shapes)"},
        {"info", cmd_info, "print a GGUF model's shapes, tensors, tokenizer and fingerprint"},
    };
    return cli_group("model", cmds, DX_ARRAY_LEN(cmds), argc, argv);
}
