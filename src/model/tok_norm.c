/* tok_norm: NFC through libutf8proc (see tok_norm.h).
 *
 * utf8proc's NFC is utf8proc_decompose + utf8proc_normalize_utf32 +
 * utf8proc_reencode with STABLE | COMPOSE, which is what its own
 * utf8proc_NFC runs; calling the three steps here keeps the memory on
 * duplex's allocator (counted, failable in tests) and takes lengths instead
 * of NUL-terminated strings, so a NUL inside the text is just a character. */
#include "model/tok_norm.h"

#include <stdint.h>
#include <string.h>
#include <utf8proc.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"

#define NFC_OPTS (UTF8PROC_STABLE | UTF8PROC_COMPOSE)

int tok_norm_parse(const char *name, size_t len, enum tok_norm *out)
{
    if (len == 3 && (!memcmp(name, "nfc", 3) || !memcmp(name, "NFC", 3))) {
        *out = TOK_NORM_NFC;
        return 0;
    }
    if (len == 4 && !memcmp(name, "none", 4)) {
        *out = TOK_NORM_NONE;
        return 0;
    }
    return dx_errf(DX_EUNSUPPORTED, "tokenizer normalizer '%.*s' is not supported (nfc, none)",
                   (int)(len > 64 ? 64 : len), name);
}

const char *tok_norm_name(enum tok_norm n)
{
    return n == TOK_NORM_NFC ? "nfc" : "none";
}

int tok_norm_needed(enum tok_norm n, const char *text, size_t len)
{
    if (n == TOK_NORM_NONE) return 0;
    /* U+0300, the first code point NFC can touch, is CC 80 in UTF-8: no
     * byte from 0xCC up means every character is below it. */
    const uint8_t *p = (const uint8_t *)text;
    for (size_t i = 0; i < len; i++)
        if (p[i] >= 0xCC) return 1;
    return 0;
}

/* NFC of one valid UTF-8 run, appended to out.  A decomposition can be
 * longer than its input, so utf8proc_decompose is asked again with the size
 * it reports; reencode writes UTF-8 over the code-point buffer, which has 4
 * bytes per code point and so always room. */
static int nfc_run(const uint8_t *s, size_t n, dx_buf *out)
{
    if (n > (size_t)PTRDIFF_MAX / 8)
        return dx_errf(DX_ETOOBIG, "tokenizer: %zu bytes to normalise", n);
    utf8proc_ssize_t cap = (utf8proc_ssize_t)n + 16, got;
    utf8proc_int32_t *w = NULL;
    for (;;) {
        utf8proc_int32_t *nw = dx_realloc(w, (size_t)cap * sizeof *w);
        if (!nw) {
            dx_free(w);
            return dx_errf(DX_ENOMEM, "tokenizer: out of memory normalising %zu bytes", n);
        }
        w = nw;
        got = utf8proc_decompose(s, (utf8proc_ssize_t)n, w, cap, NFC_OPTS);
        if (got <= cap) break;
        cap = got;
    }
    int rc = 0;
    if (got < 0) { /* only for invalid UTF-8, which the caller never passes */
        rc = dx_errf(DX_EINVAL, "tokenizer: normalising: %s", utf8proc_errmsg(got));
    } else {
        got = utf8proc_normalize_utf32(w, got, NFC_OPTS);
        got = got < 0 ? got : utf8proc_reencode(w, got, NFC_OPTS);
        rc = got < 0 ? dx_errf(DX_EINVAL, "tokenizer: normalising: %s", utf8proc_errmsg(got))
                     : dx_buf_append(out, w, (size_t)got);
    }
    dx_free(w);
    return rc;
}

int tok_norm_apply(enum tok_norm n, const char *text, size_t len, dx_buf *out)
{
    if (n == TOK_NORM_NONE || !tok_norm_needed(n, text, len)) return dx_buf_append(out, text, len);
    const uint8_t *u = (const uint8_t *)text;
    size_t i = 0;
    while (i < len) {
        size_t run = dx_utf8_valid_prefix(u + i, len - i);
        int rc = run ? nfc_run(u + i, run, out) : dx_buf_append(out, text + i, 1);
        if (rc) return rc;
        i += run ? run : 1;
    }
    return 0;
}
