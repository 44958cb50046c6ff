/* dx_utf8: strict UTF-8 validation (see .h). */
#include "base/dx_utf8.h"

#include "base/dx_err.h"

size_t dx_utf8_seq_len(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90; /* overlong */
        if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (n < need || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < need; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return need;
}

size_t dx_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    size_t len = n ? dx_utf8_seq_len(s, n) : 0;
    if (!len) return 0;
    uint32_t v = len == 1 ? s[0] : s[0] & (0x3Fu >> (len - 1));
    for (size_t k = 1; k < len; k++) v = v << 6 | (s[k] & 0x3Fu);
    *cp = v;
    return len;
}

size_t dx_utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t k = s[i] < 0x80 ? 1 : dx_utf8_seq_len(s + i, n - i);
        if (!k) break;
        i += k;
    }
    return i;
}

size_t dx_utf8_incomplete_tail(const uint8_t *p, size_t n)
{
    /* the last lead byte within 3 bytes of the end, if what follows it is a
     * valid beginning of its sequence */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t c = p[n - back];
        if ((c & 0xC0) == 0x80) continue;
        if (c < 0xC2 || c > 0xF4) return 0;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (back >= need) return 0;
        /* check the bytes present against what a full sequence allows */
        uint8_t buf[4] = {c, 0x80, 0x80, 0x80};
        for (size_t k = 1; k < back; k++) buf[k] = p[n - back + k];
        if (back >= 2) {
            uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
            uint8_t hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            if (buf[1] < lo || buf[1] > hi) return 0;
        } else if (c == 0xE0 || c == 0xF0) {
            buf[1] = c == 0xE0 ? 0xA0 : 0x90;
        }
        return dx_utf8_seq_len(buf, need) ? back : 0;
    }
    return 0;
}

size_t dx_utf8_encode(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF) return 0;
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

int dx_utf8_put(dx_buf *b, uint32_t cp)
{
    uint8_t u[4];
    size_t n = dx_utf8_encode(cp, u);
    if (!n) return dx_errf(DX_EINVAL, "U+%X is past U+10FFFF: no UTF-8 for it", (unsigned)cp);
    return dx_buf_append(b, u, n);
}

int dx_utf8_sanitize(const uint8_t *p, size_t n, dx_buf *out)
{
    size_t i = 0;
    while (i < n) {
        size_t run = dx_utf8_valid_prefix(p + i, n - i);
        int rc = run ? dx_buf_append(out, p + i, run) : dx_buf_append(out, "\xef\xbf\xbd", 3);
        if (rc) return rc;
        i += run ? run : 1;
    }
    return 0;
}
