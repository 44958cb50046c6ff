/* tok_norm: NFC through libutf8proc (see tok_norm.h).
 *
 * utf8proc's NFC is utf8proc_decompose + utf8proc_normalize_utf32 +
 * utf8proc_reencode with STABLE | COMPOSE, which is what its own
 * utf8proc_NFC runs; calling the three steps here keeps the memory on
 * duplex's allocator (counted, failable in tests) and takes lengths instead
 * of NUL-terminated strings, so a NUL inside the text is just a character.
 *
 * Most text is already NFC, and normalising costs about as much as the BPE
 * itself, so a stretch is first scanned: NFC leaves a string unchanged when
 * none of its characters is "touchable" — has a non-zero combining class,
 * is changed by NFC on its own (singletons, exclusions), or is a non-first
 * part of some canonical decomposition (so could compose with what precedes
 * it: combining marks, Hangul vowel and final jamo, Indic vowel signs).
 * Then every starter is followed by a character that cannot join it and
 * blocks, and composition gives back exactly the text.  The set is derived
 * once from utf8proc's own tables (pthread_once, ~ms), not written by
 * hand, so it follows the library's Unicode version. */
#include "tok/tok_norm.h"

#include <pthread.h>
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

#define CP_LIMIT 0x110000u

static uint8_t g_touch[CP_LIMIT / 8]; /* bit per code point: NFC may change it or its context */
static pthread_once_t g_touch_once = PTHREAD_ONCE_INIT;

static void touch(utf8proc_int32_t cp)
{
    if (cp >= 0 && (uint32_t)cp < CP_LIMIT) g_touch[cp >> 3] |= (uint8_t)(1u << (cp & 7));
}

static int touched(utf8proc_int32_t cp)
{
    return cp >= 0 && (uint32_t)cp < CP_LIMIT && (g_touch[cp >> 3] >> (cp & 7) & 1);
}

/* The canonical decomposition of cp into d (≤ 32), its length; 0 if none. */
static utf8proc_ssize_t canon(utf8proc_int32_t cp, utf8proc_int32_t *d)
{
    const utf8proc_property_t *p = utf8proc_get_property(cp);
    int hangul = cp >= 0xAC00 && cp <= 0xD7A3; /* decomposed by rule, not by table */
    if (!hangul && (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0)) return 0;
    utf8proc_ssize_t n = utf8proc_decompose_char(cp, d, 32, UTF8PROC_DECOMPOSE, NULL);
    return n < 1 || n > 32 || (n == 1 && d[0] == cp) ? 0 : n;
}

static void build_touchable(void)
{
    utf8proc_int32_t d[32];
    for (utf8proc_int32_t cp = 0; cp < (utf8proc_int32_t)CP_LIMIT; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (utf8proc_get_property(cp)->combining_class) touch(cp);
        utf8proc_ssize_t n = canon(cp, d);
        if (!n) continue;
        for (utf8proc_ssize_t i = 1; i < n; i++) touch(d[i]); /* can join what precedes */
        n = utf8proc_normalize_utf32(d, n, NFC_OPTS);
        if (n != 1 || d[0] != cp) touch(cp); /* NFC changes it on its own */
    }
    /* a character whose decomposition starts with a touchable one (a mark, or
     * a part that joins what precedes) is touchable itself */
    for (utf8proc_int32_t cp = 0; cp < (utf8proc_int32_t)CP_LIMIT; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (!touched(cp) && canon(cp, d) && touched(d[0])) touch(cp);
    }
}

void tok_norm_init(void)
{
    pthread_once(&g_touch_once, build_touchable);
}

int tok_norm_touchable(uint32_t cp)
{
    tok_norm_init();
    return touched((utf8proc_int32_t)cp);
}

/* The code point of the valid sequence of k bytes at p. */
static uint32_t cp_at(const uint8_t *p, size_t k)
{
    if (k == 1) return p[0];
    if (k == 2) return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    if (k == 3) return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 |
           (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
}

int tok_norm_needed(enum tok_norm n, const char *text, size_t len)
{
    if (n == TOK_NORM_NONE) return 0;
    tok_norm_init();
    const uint8_t *p = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        if (p[i] < 0xCC) { /* below U+0300 (CC 80): nothing there is touchable */
            i++;
            continue;
        }
        size_t k = dx_utf8_seq_len(p + i, len - i);
        if (!k) { /* an invalid byte passes through normalisation as it is */
            i++;
            continue;
        }
        uint32_t cp = cp_at(p + i, k);
        if (g_touch[cp >> 3] >> (cp & 7) & 1) return 1;
        i += k;
    }
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

/* NFC of one valid UTF-8 run, touching only what needs it: NFC(A + B) is
 * NFC(A) + NFC(B) when B starts with an untouchable character (nothing
 * before it can compose with it or reorder past it, and it decomposes to a
 * starter that blocks), so each touchable character is normalised together
 * with the untouchable one before it and the touchable ones after, and
 * everything else is copied. */
static int nfc_valid(const uint8_t *s, size_t n, dx_buf *out)
{
    size_t copied = 0, last_safe = 0, unit = 0;
    int in_unit = 0, rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        size_t k = dx_utf8_seq_len(s + i, n - i);
        DX_ASSERT(k); /* the caller passes a valid run */
        int t = s[i] >= 0xCC && touched((utf8proc_int32_t)cp_at(s + i, k));
        if (t && !in_unit) {
            in_unit = 1;
            unit = last_safe;
        } else if (!t) {
            if (in_unit) {
                rc = dx_buf_append(out, s + copied, unit - copied);
                if (!rc) rc = nfc_run(s + unit, i - unit, out);
                copied = i;
                in_unit = 0;
            }
            last_safe = i;
        }
        i += k;
    }
    if (rc) return rc;
    if (!in_unit) return dx_buf_append(out, s + copied, n - copied);
    rc = dx_buf_append(out, s + copied, unit - copied);
    return rc ? rc : nfc_run(s + unit, n - unit, out);
}

int tok_norm_apply(enum tok_norm n, const char *text, size_t len, dx_buf *out)
{
    if (n == TOK_NORM_NONE || !tok_norm_needed(n, text, len)) return dx_buf_append(out, text, len);
    const uint8_t *u = (const uint8_t *)text;
    size_t i = 0;
    while (i < len) {
        size_t run = dx_utf8_valid_prefix(u + i, len - i);
        int rc = run ? nfc_valid(u + i, run, out) : dx_buf_append(out, text + i, 1);
        if (rc) return rc;
        i += run ? run : 1;
    }
    return 0;
}
