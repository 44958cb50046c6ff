/* router_sse: SSE splitting and kv_transfer_params removal (see .h). */
#include "router/router_sse.h"

#include <limits.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "oai/oai_jv.h"

void router_sse_init(router_sse *s, size_t max_event)
{
    dx_buf_init(&s->pend, max_event);
    s->scan = 0;
}

void router_sse_free(router_sse *s)
{
    dx_buf_free(&s->pend);
    s->scan = 0;
}

void router_sse_reset(router_sse *s)
{
    dx_buf_reset(&s->pend);
    s->scan = 0;
}

size_t router_sse_pending(const router_sse *s)
{
    return s->pend.len;
}

/* The end of the first event in p[0..n) (just past its blank line),
 * searching from `from`; 0 when there is none yet.  An event ends where a
 * line end ("\n" or "\r\n") is followed by an empty line. */
static size_t event_end(const char *p, size_t n, size_t from)
{
    for (size_t i = from; i < n; i++) {
        const char *nl = memchr(p + i, '\n', n - i);
        if (!nl) return 0;
        i = (size_t)(nl - p);
        if (i + 1 < n && p[i + 1] == '\n') return i + 2;
        if (i + 2 < n && p[i + 1] == '\r' && p[i + 2] == '\n') return i + 3;
    }
    return 0;
}

/* Where a later search may resume without missing an end that straddles
 * the boundary: the last two bytes may begin "\n\r\n". */
static size_t resume_at(size_t n)
{
    return n > 2 ? n - 2 : 0;
}

/* Events wholly inside the caller's bytes go out from there (nothing pending). */
static int feed_direct(router_sse *s, const char *p, size_t n, router_sse_fn fn, void *user,
                       size_t *used)
{
    size_t off = 0, end;
    while (off < n && (end = event_end(p + off, n - off, 0)) > 0) {
        int rc = fn(user, p + off, end);
        off += end;
        if (rc) {
            *used = off;
            return rc;
        }
    }
    *used = off;
    return 0;
}

/* Events in the pending buffer; what is left stays pending. */
static int feed_pending(router_sse *s, router_sse_fn fn, void *user)
{
    size_t off = 0, end;
    int rc = 0;
    while (off < s->pend.len) {
        size_t from = s->scan > off ? s->scan - off : 0;
        end = event_end(s->pend.data + off, s->pend.len - off, from);
        if (!end) break;
        rc = fn(user, s->pend.data + off, end);
        off += end;
        s->scan = off;
        if (rc) break;
    }
    dx_buf_consume(&s->pend, off);
    s->scan = resume_at(s->pend.len);
    return rc;
}

int router_sse_feed(router_sse *s, const char *p, size_t n, router_sse_fn fn, void *user)
{
    size_t used = 0;
    int rc = 0;
    if (s->pend.len == 0) {
        rc = feed_direct(s, p, n, fn, user, &used);
        if (rc) return rc;
        p += used;
        n -= used;
        if (!n) return 0;
    }
    int ar = dx_buf_append(&s->pend, p, n);
    if (ar < 0) {
        router_sse_reset(s);
        return ar == DX_ETOOBIG ? dx_errf(DX_ETOOBIG, "SSE: an event over %zu bytes", s->pend.max)
                                : dx_errf(DX_ENOMEM, "SSE: out of memory");
    }
    return feed_pending(s, fn, user);
}

/* ---- event data ---------------------------------------------------------- */

/* The next line of ev from *off: its bytes without the line end. */
static int next_line(const char *ev, size_t len, size_t *off, const char **line, size_t *llen)
{
    if (*off >= len) return 0;
    const char *p = ev + *off;
    const char *nl = memchr(p, '\n', len - *off);
    size_t n = nl ? (size_t)(nl - p) : len - *off;
    *off += n + (nl ? 1 : 0);
    if (n && p[n - 1] == '\r') n--;
    *line = p;
    *llen = n;
    return 1;
}

int router_sse_data(const char *ev, size_t len, dx_buf *scratch, const char **data, size_t *dlen)
{
    size_t off = 0, ll, n_data = 0;
    const char *l;
    dx_buf_reset(scratch);
    while (next_line(ev, len, &off, &l, &ll)) {
        if (ll < 5 || memcmp(l, "data:", 5) != 0) continue;
        const char *v = l + 5;
        size_t vl = ll - 5;
        if (vl && *v == ' ') v++, vl--;
        if (n_data == 1 && (dx_buf_append(scratch, *data, *dlen) < 0))
            return dx_errf(DX_ENOMEM, "SSE: event data (%zu bytes)", len);
        if (n_data >= 1 && (dx_buf_putc(scratch, '\n') < 0 || dx_buf_append(scratch, v, vl) < 0))
            return dx_errf(DX_ENOMEM, "SSE: event data (%zu bytes)", len);
        *data = v;
        *dlen = vl;
        n_data++;
    }
    if (!n_data) return dx_errf(DX_ENOENT, "SSE: event without a data line");
    if (n_data > 1) {
        *data = scratch->data;
        *dlen = scratch->len;
    }
    return 0;
}

/* ---- inspection -------------------------------------------------------- */

int router_json_append(dx_buf *b, const json_t *v)
{
    return oai_jv_dump(b, v, JSON_COMPACT | JSON_ENCODE_ANY);
}

/* Appends the first choice's text (see router_sse_info). */
static void take_text(json_t *root, int chat, const char *holder, router_sse_info *info)
{
    if (!info->text) return;
    json_t *ch = json_array_get(json_object_get(root, "choices"), 0);
    json_t *t = chat ? json_object_get(json_object_get(ch, holder), "content")
                     : json_object_get(ch, "text");
    if (!json_is_string(t) || json_string_length(t) == 0) return;
    info->text_added += json_string_length(t);
    if (dx_buf_append(info->text, json_string_value(t), json_string_length(t)) < 0)
        info->text_lost = 1; /* the answer still goes out; only the text is incomplete */
}

/* The usage as the cluster sees it: a prompt token counts as cached only if
 * neither node computed it.  Both nodes' cached tokens are a prefix of the
 * prompt, so the cluster's are the shorter of the two. */
static int adjust_usage(json_t *root, const router_sse_info *info)
{
    long cap = info->cached_cap;
    json_t *d = json_object_get(json_object_get(root, "usage"), "prompt_tokens_details");
    json_t *c = json_object_get(d, "cached_tokens");
    if (!info->has_cap || !json_is_integer(c) || json_integer_value(c) <= cap) return 0;
    json_object_set_new(d, "cached_tokens", json_integer(cap));
    return 1;
}

/* Parses a JSON object, reads its text, takes out kv_transfer_params and
 * adjusts its usage.  1: changed (root stays for re-serialising), 0:
 * nothing to change, negative: out of memory. */
static int inspect(const char *js, size_t len, int chat, const char *holder, router_sse_info *info,
                   json_t **root_out)
{
    info->text_added = 0;
    info->text_lost = 0;
    info->params = NULL;
    *root_out = NULL;
    int needs_parse = info->text || memmem(js, len, "\"kv_transfer_params\"", 20) ||
                      (info->has_cap && memmem(js, len, "\"cached_tokens\"", 15));
    if (!needs_parse || len == 0 || js[0] != '{') return 0;
    json_error_t je;
    json_t *root = json_loadb(js, len, JSON_ALLOW_NUL, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return 0;
    }
    take_text(root, chat, holder, info);
    int changed = adjust_usage(root, info);
    json_t *p = json_object_get(root, "kv_transfer_params");
    if (p) {
        info->params = json_incref(p);
        json_object_del(root, "kv_transfer_params");
        changed = 1;
    }
    if (changed) {
        *root_out = root;
        return 1;
    }
    json_decref(root);
    return 0;
}

/* *out = pre + root (its params removed) + post; 1, or DX_ENOMEM (and no
 * params: nothing was rewritten).  Drops root. */
static int rewrite(json_t *root, const char *pre, const char *post, dx_buf *out,
                   router_sse_info *info)
{
    dx_buf_reset(out);
    int rc = dx_buf_puts(out, pre);
    if (rc == 0) rc = router_json_append(out, root);
    if (rc == 0) rc = dx_buf_puts(out, post);
    json_decref(root);
    if (rc == 0) return 1;
    json_decref(info->params);
    info->params = NULL;
    return dx_errf(DX_ENOMEM, "router: an answer rewritten without kv_transfer_params");
}

int router_sse_event(const char *ev, size_t len, int chat, dx_buf *scratch, dx_buf *out,
                     router_sse_info *info)
{
    const char *d;
    size_t dl;
    info->text_added = 0;
    info->text_lost = 0;
    info->params = NULL;
    int rc = router_sse_data(ev, len, scratch, &d, &dl);
    if (rc == DX_ENOENT) return 0;
    if (rc < 0) return rc;
    json_t *root;
    rc = inspect(d, dl, chat, "delta", info, &root);
    return rc <= 0 ? rc : rewrite(root, "data: ", "\n\n", out, info);
}

int router_sse_answer(const char *body, size_t len, int chat, dx_buf *out, router_sse_info *info)
{
    json_t *root;
    int rc = inspect(body, len, chat, "message", info, &root);
    return rc <= 0 ? rc : rewrite(root, "", "", out, info);
}

/* ---- the params a node hands back -------------------------------------------- */

int router_answer_params(const char *body, size_t len, char **params, long *cached)
{
    *params = NULL;
    json_error_t je;
    json_t *root = json_loadb(body ? body : "", len, JSON_ALLOW_NUL, &je);
    json_t *p = json_object_get(root, "kv_transfer_params");
    json_t *u = json_object_get(root, "usage");
    json_t *c = json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
    *cached = json_is_integer(c) && json_integer_value(c) >= 0 && json_integer_value(c) <= LONG_MAX
                  ? (long)json_integer_value(c)
                  : -1;
    int rc = 0;
    if (json_is_object(p)) {
        dx_buf b;
        dx_buf_init(&b, 0);
        rc = router_json_append(&b, p);
        if (rc == 0 && !(*params = dx_buf_take(&b)))
            rc = dx_errf(DX_ENOMEM, "prefill node's kv_transfer_params");
        dx_buf_free(&b);
        rc = rc ? rc : 1;
    }
    json_decref(root);
    return rc;
}

double router_params_ttl(const json_t *params, double ttl_s)
{
    json_t *bt = json_object_get(params, "remote_blocks_ttl_s");
    if (json_is_number(bt)) {
        double b = json_number_value(bt), margin = b / 8 < 30 ? b / 8 : 30;
        if (b - margin < ttl_s) ttl_s = b - margin;
    }
    return ttl_s;
}

uint32_t router_params_tokens(const json_t *params)
{
    json_t *nt = json_object_get(params, "remote_num_tokens");
    if (json_is_integer(nt) && json_integer_value(nt) >= 0 && json_integer_value(nt) <= UINT32_MAX)
        return (uint32_t)json_integer_value(nt);
    return 0;
}

json_t *router_params_flagged(const char *text, int decode, int prefill)
{
    json_error_t je;
    json_t *kv =
        text ? json_loads(text, JSON_ALLOW_NUL, &je) : NULL; /* as serialised: \u0000 too */
    if (!json_is_object(kv)) {
        json_decref(kv);
        return NULL;
    }
    if (json_object_set_new(kv, "do_remote_decode", json_boolean(decode)) < 0 ||
        json_object_set_new(kv, "do_remote_prefill", json_boolean(prefill)) < 0) {
        json_decref(kv);
        return NULL;
    }
    return kv;
}
