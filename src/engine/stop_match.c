/* stop_match: incremental stop-string search (see .h). */
#include "engine/stop_match.h"

#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

typedef struct {
    const char *s; /* into m->bytes */
    uint32_t len;
    uint32_t *fail; /* [len] fail[i]: longest proper border of s[0..i] */
    uint32_t state; /* longest suffix of the text that is a prefix of s (< len) */
} stop_pat;

struct stop_match {
    stop_pat *pat;
    size_t n;
    char *bytes;    /* every string, back to back */
    uint32_t *fail; /* every table, back to back */
    uint64_t steps;
    int which; /* the matched string's index, DX_NONE before a match */
};

static void build_fail(const char *s, uint32_t len, uint32_t *fail)
{
    fail[0] = 0;
    for (uint32_t i = 1, k = 0; i < len; i++) {
        while (k > 0 && s[i] != s[k]) k = fail[k - 1];
        if (s[i] == s[k]) k++;
        fail[i] = k;
    }
}

int stop_match_create(const char *const *stops, size_t n, stop_match **out)
{
    *out = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = stops[i] ? strlen(stops[i]) : 0;
        if (!len || len > UINT32_MAX)
            return dx_errf(DX_EINVAL, "stop[%zu] is empty or too long", i);
        total += len;
    }
    stop_match *m = dx_calloc(1, sizeof *m);
    if (!m) return dx_errf(DX_ENOMEM, "out of memory");
    m->n = n;
    m->pat = dx_calloc(n ? n : 1, sizeof *m->pat);
    m->bytes = dx_malloc(total ? total : 1);
    m->fail = dx_calloc(total ? total : 1, sizeof *m->fail);
    if (!m->pat || !m->bytes || !m->fail) {
        stop_match_destroy(m);
        return dx_errf(DX_ENOMEM, "out of memory for %zu bytes of stop strings", total);
    }
    for (size_t i = 0, off = 0; i < n; i++) {
        stop_pat *p = &m->pat[i];
        p->len = (uint32_t)strlen(stops[i]);
        memcpy(m->bytes + off, stops[i], p->len);
        p->s = m->bytes + off;
        p->fail = m->fail + off;
        build_fail(p->s, p->len, p->fail);
        off += p->len;
    }
    m->which = DX_NONE;
    *out = m;
    return 0;
}

void stop_match_destroy(stop_match *m)
{
    if (!m) return;
    dx_free(m->pat);
    dx_free(m->bytes);
    dx_free(m->fail);
    dx_free(m);
}

/* Feeds p the bytes; the index of the byte that completes it, or DX_NONE. */
static long feed_one(stop_pat *p, const char *bytes, size_t n, uint64_t *steps)
{
    uint32_t k = p->state;
    for (size_t i = 0; i < n; i++) {
        while (k > 0 && bytes[i] != p->s[k]) {
            k = p->fail[k - 1];
            (*steps)++;
        }
        (*steps)++;
        if (bytes[i] == p->s[k] && ++k == p->len) {
            p->state = p->fail[k - 1]; /* a valid state, though the matcher is spent */
            return (long)i;
        }
    }
    p->state = k;
    return DX_NONE;
}

long stop_match_feed(stop_match *m, const char *bytes, size_t n, size_t before, size_t *hold)
{
    long best = DX_NONE;
    size_t h = 0;
    for (size_t i = 0; i < m->n; i++) {
        stop_pat *p = &m->pat[i];
        long end = feed_one(p, bytes, n, &m->steps);
        if (end >= 0) {
            long start = (long)before + end + 1 - (long)p->len;
            if (best < 0 || start < best) {
                best = start;
                m->which = (int)i;
            }
        } else if (p->state > h) {
            h = p->state;
        }
    }
    *hold = best < 0 ? h : 0;
    return best;
}

int stop_match_which(const stop_match *m)
{
    return m->which;
}

uint64_t stop_match_steps(const stop_match *m)
{
    return m->steps;
}
