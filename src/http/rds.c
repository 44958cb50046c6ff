/* rds: Redis URL and connection (see .h). */
#include "http/rds.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_err.h"

/* A decimal without sign or leading zero, at most max; DX_NONE otherwise. */
static long parse_dec(const char *p, size_t n, long max)
{
    if (n == 0 || n > 5 || (n > 1 && p[0] == '0')) return DX_NONE;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return DX_NONE;
        v = v * 10 + (p[i] - '0');
    }
    return v <= max ? v : DX_NONE;
}

/* p[0..n) as a string in dst: 0, or DX_ETOOBIG when it does not fit (the
 * caller names the part). */
static int copy_part(char *dst, size_t cap, const char *p, size_t n)
{
    if (n >= cap) return dx_errf(DX_ETOOBIG, "%zu bytes, room for %zu", n, cap - 1);
    memcpy(dst, p, n);
    dst[n] = 0;
    return 0;
}

int rds_url_parse(const char *url, rds_url *out)
{
    static const char scheme[] = "redis://";
    memset(out, 0, sizeof *out);
    out->port = 6379;
    if (!url || strncmp(url, scheme, sizeof scheme - 1))
        return dx_errf(DX_EINVAL, "'%.200s': a Redis URL starts with redis://", url ? url : "");
    const char *p = url + sizeof scheme - 1;
    const char *end = p + strlen(p);
    const char *slash = memchr(p, '/', (size_t)(end - p));
    const char *auth_end = memchr(p, '@', (size_t)((slash ? slash : end) - p));
    if (auth_end) {
        const char *colon = memchr(p, ':', (size_t)(auth_end - p));
        if (!colon) return dx_errf(DX_EINVAL, "'%.200s': credentials are [USER]:PASSWORD@", url);
        if (copy_part(out->user, sizeof out->user, p, (size_t)(colon - p)) ||
            copy_part(out->password, sizeof out->password, colon + 1,
                      (size_t)(auth_end - colon - 1)))
            return dx_errf(DX_EINVAL, "'%.200s': user or password longer than %d bytes", url,
                           RDS_SECRET_MAX - 1);
        if (!out->password[0])
            return dx_errf(DX_EINVAL, "'%.200s': an empty password after ':'", url);
        p = auth_end + 1;
    }
    const char *hend = slash ? slash : end, *port = NULL;
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(hend - p));
        if (!rb) return dx_errf(DX_EINVAL, "'%.200s': '[' without ']' around the host", url);
        if (copy_part(out->host, sizeof out->host, p + 1, (size_t)(rb - p - 1)))
            return dx_errf(DX_EINVAL, "'%.200s': host too long", url);
        if (rb + 1 < hend) {
            if (rb[1] != ':') return dx_errf(DX_EINVAL, "'%.200s': ':' expected after ']'", url);
            port = rb + 2;
        }
    } else {
        const char *colon = memchr(p, ':', (size_t)(hend - p));
        if (copy_part(out->host, sizeof out->host, p, (size_t)((colon ? colon : hend) - p)))
            return dx_errf(DX_EINVAL, "'%.200s': host too long", url);
        if (colon) port = colon + 1;
    }
    if (!out->host[0]) return dx_errf(DX_EINVAL, "'%.200s': no host", url);
    for (const char *h = out->host; *h; h++)
        if (*h == '@' || *h == '/' || *h == '?' || *h == '#' || *h == ' ' || *h == '[' || *h == ']')
            return dx_errf(DX_EINVAL, "'%.200s': '%c' in the host", url, *h);
    if (port) {
        long v = parse_dec(port, (size_t)(hend - port), 65535);
        if (v < 1) return dx_errf(DX_EINVAL, "'%.200s': the port is not 1..65535", url);
        out->port = (int)v;
    }
    if (slash && slash + 1 < end) {
        long v = parse_dec(slash + 1, (size_t)(end - slash - 1), 15);
        if (v < 0) return dx_errf(DX_EINVAL, "'%.200s': the database is not 0..15", url);
        out->db = (int)v;
    }
    return 0;
}

void rds_url_format(const rds_url *u, char *out, size_t cap)
{
    int v6 = strchr(u->host, ':') != NULL;
    snprintf(out, cap, "redis://%s%s%s%s:%d/%d", u->password[0] ? "***@" : "", v6 ? "[" : "",
             u->host, v6 ? "]" : "", u->port, u->db);
}

static int fail_reply(redisContext *c, redisReply *r, const rds_url *u, const char *what)
{
    char where[RDS_HOST_MAX + 64];
    rds_url_format(u, where, sizeof where);
    int rc = dx_errf(DX_EIO, "%s: %s failed: %s", where, what,
                     r ? (r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply")
                       : (c->errstr[0] ? c->errstr : "no reply"));
    if (r) freeReplyObject(r);
    redisFree(c);
    return rc;
}

int rds_connect(const rds_url *u, int timeout_ms, redisContext **out)
{
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    *out = NULL;
    redisContext *c = redisConnectWithTimeout(u->host, u->port, tv);
    if (!c) return dx_errf(DX_ENOMEM, "redis: out of memory connecting");
    if (c->err) return fail_reply(c, NULL, u, "connect");
    if (redisSetTimeout(c, tv) != REDIS_OK) return fail_reply(c, NULL, u, "setting the timeout");
    redisReply *r;
    if (u->password[0]) {
        r = u->user[0] ? redisCommand(c, "AUTH %s %s", u->user, u->password)
                       : redisCommand(c, "AUTH %s", u->password);
        if (!r || r->type == REDIS_REPLY_ERROR) return fail_reply(c, r, u, "AUTH");
        freeReplyObject(r);
    }
    if (u->db) {
        r = redisCommand(c, "SELECT %d", u->db);
        if (!r || r->type == REDIS_REPLY_ERROR) return fail_reply(c, r, u, "SELECT");
        freeReplyObject(r);
    }
    *out = c;
    return 0;
}
