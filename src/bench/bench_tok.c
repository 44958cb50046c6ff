/* bench_tok: tokenizer load time and encode/decode speed (see bench_tok.h).
 *
 * The text is built once (the sample repeated up to the size asked for, cut
 * where a UTF-8 character starts so the cut adds no invalid byte), then each
 * run loads the tokenizer afresh, encodes the whole text in one call and
 * decodes the ids again; the decoded text must equal the encoded one (or
 * the run reports an error), so a fast but wrong tokenizer cannot pass. */
#include "bench/bench_tok.h"

#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "model/model.h"
#include "tok/tok_norm.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static char *build_text(const bench_tok_config *cfg, size_t *len)
{
    size_t want = cfg->bytes ? cfg->bytes : cfg->len, have = want + 4;
    char *t = dx_malloc(have + 1);
    if (!t) return NULL;
    for (size_t n = 0; n < have;) {
        size_t k = have - n < cfg->len ? have - n : cfg->len;
        memcpy(t + n, cfg->text, k);
        n += k;
    }
    /* end where a character starts */
    size_t n = want;
    while (n > 0 && ((uint8_t)t[n] & 0xC0) == 0x80) n--;
    t[n] = 0;
    *len = n;
    return t;
}

/* One run: load, encode, decode; times in seconds. */
static int run_once(const bench_tok_config *cfg, const char *text, size_t len, double *load_s,
                    double *enc_s, double *dec_s, bench_tok_result *out)
{
    uint64_t t0 = dx_now_ns();
    model *m;
    int rc = model_load_tokenizer(cfg->model, &m);
    if (rc) return rc;
    uint64_t t1 = dx_now_ns();
    const tok *tk = model_tokenizer(m);
    tok_ids ids;
    tok_ids_init(&ids);
    dx_buf dec;
    dx_buf_init(&dec, 0);
    rc = tok_encode(tk, text, len, cfg->flags, &ids);
    uint64_t t2 = dx_now_ns();
    if (!rc) rc = tok_decode(tk, ids.ids, ids.n, &dec);
    uint64_t t3 = dx_now_ns();
    /* what decoding must give back: the text, normalised as the vocabulary asks */
    dx_buf want;
    dx_buf_init(&want, 0);
    if (!rc) rc = tok_norm_apply(tok_get_norm(tk), text, len, &want);
    if (!rc && (dec.len != want.len || memcmp(dec.data, want.data, want.len)))
        rc = dx_errf(DX_EMISMATCH, "decoding %zu tokens did not give the %zu bytes encoded back",
                     ids.n, len);
    *load_s = (double)(t1 - t0) * 1e-9;
    *enc_s = (double)(t2 - t1) * 1e-9;
    *dec_s = (double)(t3 - t2) * 1e-9;
    out->tokens = ids.n;
    out->n_vocab = tok_vocab_size(tk);
    dx_buf_free(&want);
    dx_buf_free(&dec);
    tok_ids_free(&ids);
    model_free(m);
    return rc;
}

int bench_tok_run(const bench_tok_config *cfg, bench_tok_result *out)
{
    memset(out, 0, sizeof *out);
    if (!cfg->text || !cfg->len) return dx_errf(DX_EINVAL, "bench tok: no sample text");
    if (cfg->flags & TOK_ADD_SPECIAL)
        return dx_errf(DX_EINVAL, "bench tok: BOS/EOS would break the round-trip check");
    uint32_t reps = cfg->reps ? cfg->reps : BENCH_TOK_DEFAULT_REPS;
    size_t len = 0;
    char *text = build_text(cfg, &len);
    double *t = dx_calloc(3 * (size_t)reps, sizeof *t);
    int rc = text && t ? 0 : dx_errf(DX_ENOMEM, "bench tok: out of memory for the text");
    for (uint32_t i = 0; !rc && i < reps; i++)
        rc = run_once(cfg, text, len, &t[i], &t[reps + i], &t[2 * reps + i], out);
    if (!rc) {
        double mb = (double)len * 1e-6;
        out->bytes = len;
        out->first_load_ms = t[0] * 1e3;
        out->load_ms = median(t, reps) * 1e3;
        out->load_min_ms = t[0] * 1e3;
        out->load_max_ms = t[reps - 1] * 1e3;
        double *e = t + reps;
        out->encode_mb_s = mb / median(e, reps);
        out->encode_min = mb / e[reps - 1];
        out->encode_max = mb / e[0];
        out->decode_mb_s = mb / median(t + 2 * reps, reps);
    }
    dx_free(t);
    dx_free(text);
    return rc;
}
