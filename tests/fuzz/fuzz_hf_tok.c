/* Fuzz target for the Hugging Face tokenizer importer (hf_tok.c): input is
 * a tokenizer.json, optionally followed by a NUL byte and a
 * tokenizer_config.json.  Any input must either be refused with an error
 * or give a vocabulary whose arrays are consistent; when that vocabulary
 * also builds a tokenizer (as synth requires), the tokenizer must encode
 * and decode a sample text back to itself, as any duplex tokenizer does
 * for NFC text. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "tok/hf_tok.h"

static void check_roundtrip(const tok *t)
{
    static const char text[] = "Hello, world! caf\xC3\xA9 123 <think> \xE4\xBD\xA0\xE5\xA5\xBD";
    tok_ids ids;
    tok_ids_init(&ids);
    if (tok_encode(t, text, sizeof text - 1, TOK_ALLOW_SPECIAL, &ids)) abort();
    dx_buf out;
    dx_buf_init(&out, 0);
    if (tok_decode(t, ids.ids, ids.n, &out)) abort();
    /* special tokens decode to their text, so the round trip is exact */
    if (out.len != sizeof text - 1 || memcmp(out.data, text, out.len)) {
        fprintf(stderr, "fuzz_hf_tok: round trip mismatch\n");
        abort();
    }
    dx_buf_free(&out);
    tok_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data, *nul = memchr(s, 0, size);
    size_t jl = nul ? (size_t)(nul - s) : size;
    const char *cfg = nul ? nul + 1 : NULL;
    size_t cl = nul ? size - jl - 1 : 0;
    hf_tok h;
    if (hf_tok_parse(s, jl, "fuzz.json", cfg, cl, "fuzz_config.json", &h)) {
        if (!*dx_errmsg()) abort(); /* every refusal says why */
        return 0;
    }
    if (!h.n_tokens || !h.tokens || !h.types) abort();
    for (size_t i = 0; i < h.n_tokens; i++)
        if (!h.tokens[i] || h.types[i] < TOK_TYPE_NORMAL || h.types[i] > TOK_TYPE_BYTE) abort();
    for (size_t i = 0; i < h.n_merges; i++)
        if (!h.merges[i] || !strchr(h.merges[i], ' ')) abort();
    int32_t ids[4] = {h.bos, h.eos, h.eot, h.pad};
    for (int i = 0; i < 4; i++)
        if (ids[i] < -1 || ids[i] >= (int32_t)h.n_tokens) abort();
    tok *t;
    if (hf_tok_build(&h, &t) == 0) {
        check_roundtrip(t); /* the sample is NFC: normalising keeps it */
        tok_destroy(t);
    }
    hf_tok_free(&h);
    return 0;
}
