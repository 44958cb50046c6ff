/* Shared by the gram fuzz targets: a small vocabulary (every byte, some JSON
 * pieces, a multi-byte character split in two tokens, an end-of-generation
 * and a control token) built once, and a short walk that checks the
 * matcher's invariants on whatever grammar the input gave: every mask has a
 * token while the grammar is not finished, every allowed token is accepted,
 * a sample of refused ones is refused, end of generation is allowed exactly
 * when the input is complete. */
#ifndef GRAM_FUZZ_H
#define GRAM_FUZZ_H

#include <stdint.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"
#include "gram/gram.h"
#include "gram/gram_priv.h"
#include "tok/tok.h"
#include "tok/tok_priv.h"

static const char *const k_gf_pieces[] = {"{\"", "\":",      "\",",          "\"}", "true", "null",
                                          "[{",  "}]",       "12",           "0.",  " \"",  "\\\"",
                                          "ab",  "\xe4\xb8", "\xe4\xb8\xad", "é",   "[]",   "-1"};

static tok *g_gf_tok;
static gram_vocab *g_gf_vocab;

static const gram_vocab *gf_vocab(void)
{
    if (g_gf_vocab) return g_gf_vocab;
    enum { N = 256 + sizeof k_gf_pieces / sizeof *k_gf_pieces + 2 };
    static tok_strview tv[N];
    static int32_t types[N];
    static char bl[N][32];
    for (size_t i = 0; i < N; i++) {
        size_t len;
        if (i < 256) {
            uint8_t b = (uint8_t)i;
            len = tok_bytes_to_bl(&b, 1, bl[i]);
        } else if (i < N - 2) {
            const char *s = k_gf_pieces[i - 256];
            len = tok_bytes_to_bl((const uint8_t *)s, strlen(s), bl[i]);
        } else {
            const char *s = i == N - 2 ? "<|im_end|>" : "<|im_start|>";
            len = strlen(s);
            memcpy(bl[i], s, len);
        }
        tv[i] = (tok_strview){bl[i], len};
        types[i] = i < N - 2 ? TOK_TYPE_NORMAL : TOK_TYPE_CONTROL;
    }
    tok_config cfg = {.tokens = tv,
                      .n_tokens = N,
                      .token_types = types,
                      .pre = TOK_PRE_QWEN2,
                      .bos = -1,
                      .eos = N - 2,
                      .eot = -1};
    DX_ASSERT(tok_create(&cfg, &g_gf_tok) == 0);
    DX_ASSERT(gram_vocab_create(g_gf_tok, &g_gf_vocab) == 0);
    return g_gf_vocab;
}

/* Walks up to max_steps tokens chosen by seed; the text goes to out.
 * Returns 1 when it ended with end of generation. */
static int gf_walk(const gram *g, uint64_t seed, int max_steps, dx_buf *out)
{
    const gram_vocab *v = gf_vocab();
    uint32_t nv = gram_vocab_size(v), eos = nv - 2;
    uint64_t mask[(256 + sizeof k_gf_pieces / sizeof *k_gf_pieces + 2 + 63) / 64];
    gram_match *m;
    int rc = gram_match_create(g, v, &m);
    if (rc) {
        DX_ASSERT(rc == DX_ETOOBIG || rc == DX_ENOMEM);
        return 0;
    }
    dx_rng r;
    dx_rng_seed(&r, seed);
    int ended = 0;
    for (int step = 0; step < max_steps && !ended; step++) {
        int n = gram_match_mask(m, mask);
        if (n == DX_ETOOBIG) break; /* a run-time bound of a hostile grammar */
        DX_ASSERT(n > 0);
        DX_ASSERT((int)(mask[eos >> 6] >> (eos & 63) & 1) == gram_match_complete(m));
        DX_ASSERT(!(mask[(eos + 1) >> 6] >> ((eos + 1) & 63) & 1));
        int32_t st = gram_match_state(m);
        for (int k = 0; k < 8; k++) { /* a sample against trying the token */
            int32_t id = (int32_t)(dx_rng_next(&r) % nv);
            int ok = gram_match_accept(m, id);
            if (ok == DX_ETOOBIG) break;
            gram_match_restore(m, st, 0);
            DX_ASSERT((ok == 0) == (int)(mask[id >> 6] >> (id & 63) & 1));
        }
        uint32_t pick = (uint32_t)(dx_rng_next(&r) % (uint64_t)n), id = 0;
        for (uint32_t w = 0;; w++) {
            uint32_t c = (uint32_t)__builtin_popcountll(mask[w]);
            if (pick < c) {
                uint64_t b = mask[w];
                while (pick--) b &= b - 1;
                id = w * 64 + (uint32_t)__builtin_ctzll(b);
                break;
            }
            pick -= c;
        }
        rc = gram_match_accept(m, (int32_t)id);
        if (rc == DX_ETOOBIG) break;
        DX_ASSERT(rc == 0);
        if (id == eos) {
            ended = 1;
            DX_ASSERT(gram_match_done(m));
        } else {
            char buf[64];
            int k = tok_token_bytes(g_gf_tok, (int32_t)id, buf, sizeof buf);
            DX_ASSERT(k >= 0);
            dx_buf_append(out, buf, (size_t)k);
        }
    }
    gram_match_destroy(m);
    return ended;
}

#endif
