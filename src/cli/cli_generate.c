/* cli_generate: `duplex generate` — run one prompt through the engine and
 * stream the text (or with --ids the token ids, for comparing with another
 * engine token by token) to stdout; token counts and speeds go to stderr.
 *
 * "generated" counts every token the model produced, the end-of-generation
 * token that stopped it included, as OpenAI's completion_tokens (and the
 * server's usage) count it; the summary says so when the last token was
 * one, naming it. */
#include "cli.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/engine.h"
#include "model/model_chat.h"

/* generate's own defaults: a short answer, and a pool for one sequence */
#define GENERATE_DEFAULT_TOKENS      64
#define GENERATE_DEFAULT_KV_CACHE_MB 256

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    engine_event fin;
    char err[512];
    uint64_t t_first, t_end;
    int32_t last; /* the last generated token */
    int ids;      /* print token ids, not text */
} gen_state;

static void on_event(void *user, const engine_event *ev)
{
    gen_state *g = user;
    if (ev->type == ENGINE_EV_TOKENS) {
        if (!g->t_first) g->t_first = dx_now_ns();
        if (ev->n_tokens) g->last = ev->tokens[ev->n_tokens - 1];
        if (g->ids)
            for (size_t i = 0; i < ev->n_tokens; i++) printf("%d ", ev->tokens[i]);
        else
            fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
        return;
    }
    pthread_mutex_lock(&g->mu);
    g->fin = *ev;
    if (ev->error_msg) snprintf(g->err, sizeof g->err, "%s", ev->error_msg);
    g->t_end = dx_now_ns();
    g->done = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Prompt text (with BOS when the model asks, as llama.cpp and the
 * completions API do) or a one-message chat rendered with the model's
 * template. */
static int encode_prompt(const model *m, const char *prompt, const char *chat, tok_ids *ids)
{
    if (chat) {
        chat_msg msg = {"user", chat, strlen(chat)};
        return model_chat_encode(m, &msg, 1, NULL, 1, NULL, NULL, ids);
    }
    return tok_encode(model_tokenizer(m), prompt, strlen(prompt), TOK_ADD_SPECIAL, ids);
}

int cli_generate_main(int argc, char **argv)
{
    const char *path = NULL, *prompt = NULL, *chat = NULL, *stop = NULL, *kv_type = ENGINE_DEFAULT_KV_DTYPE;
    const char *tmpl = NULL;
    long n_gen = GENERATE_DEFAULT_TOKENS, threads = 0, kv_mb = GENERATE_DEFAULT_KV_CACHE_MB;
    long top_k = 0, batch = ENGINE_DEFAULT_MAX_BATCH_TOKENS, kv_blocks = 0;
    double temp = 0.0, top_p = 1.0, min_p = 0.0;
    uint64_t seed = 0;
    int ignore_eos = 0, has_seed = 0, print_ids = 0;
    const cli_opt opts[] = {
        {"model", CLI_PATH, &path, 0, 0, "GGUF model file (required)"},
        {"prompt", CLI_STR, &prompt, 0, 0, "raw prompt text"},
        {"chat", CLI_STR, &chat, 0, 0, "a user message, rendered with the chat template"},
        {"n", CLI_INT, &n_gen, 1, 1 << 20, CLI_HELP_DEFAULT("tokens to generate", GENERATE_DEFAULT_TOKENS)},
        {"temp", CLI_DBL, &temp, 0, 100, "temperature (default 0: greedy)"},
        {"top-k", CLI_INT, &top_k, 0, 1 << 24, "top-k (0 = off)"},
        {"top-p", CLI_DBL, &top_p, 0, 1, "top-p (1 = off)"},
        {"min-p", CLI_DBL, &min_p, 0, 1, "min-p (0 = off)"},
        {"seed", CLI_U64, &seed, 0, 0, "sampling seed"},
        {"stop", CLI_STR, &stop, 0, 0, "stop string"},
        {"ignore-eos", CLI_FLAG, &ignore_eos, 0, 0, "keep generating after EOS"},
        {"ids", CLI_FLAG, &print_ids, 0, 0, "print the generated token ids instead of the text"},
        {"threads", CLI_INT, &threads, 0, 1024, "threads (default: cores)"},
        {"kv-cache-mb", CLI_INT, &kv_mb, 1, 1 << 20, CLI_HELP_DEFAULT("KV pool size", GENERATE_DEFAULT_KV_CACHE_MB)},
        {"kv-blocks", CLI_INT, &kv_blocks, 0, 1 << 30, "KV pool size in blocks (overrides MB)"},
        {"kv-dtype", CLI_STR, &kv_type, 0, 0, CLI_KV_DTYPE_HELP},
        {"chat-template", CLI_PATH, &tmpl, 0, 0, "a Jinja chat template file for --chat"},
        {"max-batch-tokens", CLI_INT, &batch, 1, 1 << 16, CLI_HELP_DEFAULT("prefill chunk", ENGINE_DEFAULT_MAX_BATCH_TOKENS)},
    };
    int rc = cli_parse("generate", "--model FILE (--prompt S | --chat S) [-n N] [--temp T ...]",
                       argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    for (int i = 0; i < argc; i++) has_seed |= !strcmp(argv[i], "--seed") || !strncmp(argv[i], "--seed=", 7);
    int kvt;
    if (!path) return cli_required("generate", "--model FILE");
    if (!prompt == !chat) {
        fprintf(stderr, "duplex generate: %s\n",
                prompt ? "--prompt and --chat exclude each other: give one"
                       : "give the text: --prompt S (raw) or --chat S (a user message)");
        return 2;
    }
    if (engine_parse_kv_dtype(kv_type, &kvt)) return cli_bad_value("generate", "--kv-dtype");
    model *m = NULL;
    if (model_load(path, &m) || (tmpl && model_load_chat_template(m, tmpl)) ||
        (chat && model_chat_error(m) && dx_errf(DX_EINVAL, "%s", model_chat_error(m)))) {
        fprintf(stderr, "duplex generate: %s\n", dx_errmsg());
        model_free(m);
        return 1;
    }
    tok_ids ids;
    tok_ids_init(&ids);
    engine *e = NULL;
    engine_config ec = {.n_threads = (int)threads, .kv_cache_mb = (size_t)kv_mb, .kv_dtype = kv_type,
                        .kv_blocks = (uint32_t)kv_blocks,
                        .max_batch_tokens = (uint32_t)batch};
    if (encode_prompt(m, prompt, chat, &ids) || engine_create(&ec, m, &e)) {
        fprintf(stderr, "duplex generate: %s\n", dx_errmsg());
        rc = 1;
        goto out;
    }
    gen_state g = {
        .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .ids = print_ids};
    const char *stops[1] = {stop};
    engine_request req = {.prompt = ids.ids, .n_prompt = ids.n, .max_tokens = (uint32_t)n_gen,
                          .sampling = {(float)temp, (int)top_k, (float)top_p, (float)min_p, seed,
                                       has_seed},
                          .stop = stop ? stops : NULL, .n_stop = stop ? 1 : 0,
                          .ignore_eos = ignore_eos, .on_event = on_event, .user = &g};
    uint64_t t0 = dx_now_ns(), id;
    if (engine_submit(e, &req, &id)) {
        fprintf(stderr, "duplex generate: %s\n", dx_errmsg());
        rc = 1;
        goto out;
    }
    pthread_mutex_lock(&g.mu);
    while (!g.done) pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    printf("\n");
    fflush(stdout);
    if (g.fin.finish == ENGINE_FINISH_ERROR) {
        fprintf(stderr, "duplex generate: %s\n", g.err);
        rc = 1;
        goto out;
    }
    double ttft = (double)(g.t_first - t0) * 1e-9, dec = (double)(g.t_end - g.t_first) * 1e-9;
    char end[160] = "";
    const tok *tk = model_tokenizer(m);
    if (g.fin.finish == ENGINE_FINISH_STOP && !ignore_eos && g.fin.n_gen &&
        tok_is_eog(tk, g.last)) {
        tok_strview p = tok_piece(tk, g.last);
        snprintf(end, sizeof end, ", the last the end token %d %.*s", g.last,
                 (int)(p.len > 64 ? 64 : p.len), p.ptr ? p.ptr : "");
    }
    fprintf(stderr,
            "prompt: %u tokens in %.3f s (%.1f tok/s); generated: %u tokens%s (%.1f tok/s); "
            "finish: %s\n",
            g.fin.n_prompt, ttft, g.fin.n_prompt / (ttft > 0 ? ttft : 1e-9), g.fin.n_gen, end,
            g.fin.n_gen > 1 && dec > 0 ? (g.fin.n_gen - 1) / dec : 0.0,
            g.fin.finish == ENGINE_FINISH_STOP ? "stop" : "length");
out:
    engine_destroy(e);
    tok_ids_free(&ids);
    model_free(m);
    return rc;
}
