/* Fuzz target for the tokenizer: any byte string must encode (with and
 * without special-token matching) and decode back to exactly itself, for
 * both pre-tokenizers.  The tokenizers are built once, from merges that
 * bpe_train learns on the embedded corpus, plus two control tokens. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "tok/bpe_train.h"
#include "tok/tok.h"

static tok *fz_tok[2];

static tok *fz_build(enum tok_pre pre)
{
    static const char *const specials[] = {"<|im_start|>", "<|im_end|>"};
    size_t len;
    const char *corpus = bpe_corpus(&len);
    bpe_vocab v;
    if (bpe_train(corpus, len, TOK_PRE_QWEN2, 500, &v)) abort();
    size_t n = v.n_tokens + 2;
    tok_strview *tokens = calloc(n, sizeof *tokens), *merges = calloc(v.n_merges, sizeof *merges);
    int32_t *types = calloc(n, sizeof *types);
    for (size_t i = 0; i < n; i++) {
        const char *s = i < v.n_tokens ? v.tokens[i] : specials[i - v.n_tokens];
        tokens[i] = (tok_strview){s, strlen(s)};
        types[i] = i < v.n_tokens ? TOK_TYPE_NORMAL : TOK_TYPE_CONTROL;
    }
    for (size_t i = 0; i < v.n_merges; i++)
        merges[i] = (tok_strview){v.merges[i], strlen(v.merges[i])};
    tok_config cfg = {.tokens = tokens,
                      .n_tokens = n,
                      .token_types = types,
                      .merges = merges,
                      .n_merges = v.n_merges,
                      .pre = pre,
                      .bos = -1,
                      .eos = -1,
                      .eot = -1};
    tok *t;
    if (tok_create(&cfg, &t)) abort();
    free(tokens);
    free(merges);
    free(types);
    bpe_vocab_free(&v);
    return t;
}

static void fz_check(const tok *t, const uint8_t *data, size_t size, unsigned flags)
{
    tok_ids ids;
    tok_ids_init(&ids);
    if (tok_encode(t, (const char *)data, size, flags, &ids)) abort();
    dx_buf out;
    dx_buf_init(&out, 0);
    if (tok_decode(t, ids.ids, ids.n, &out)) abort();
    if (out.len != size || (size && memcmp(out.data, data, size) != 0)) {
        fprintf(stderr, "fuzz_tok: round trip mismatch (%zu -> %zu bytes)\n", size, out.len);
        abort();
    }
    for (size_t i = 0; i < ids.n && !(flags & TOK_ALLOW_SPECIAL); i++)
        if (tok_is_special(t, ids.ids[i])) abort();
    dx_buf_free(&out);
    tok_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fz_tok[0]) {
        fz_tok[0] = fz_build(TOK_PRE_QWEN2);
        fz_tok[1] = fz_build(TOK_PRE_LLAMA3);
    }
    for (int p = 0; p < 2; p++) {
        fz_check(fz_tok[p], data, size, 0);
        fz_check(fz_tok[p], data, size, TOK_ALLOW_SPECIAL);
    }
    return 0;
}
