/* dx_addr: listen addresses (see .h). */
#include "base/dx_addr.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_err.h"

/* host without the brackets of "[::1]" into h; 0 or DX_EINVAL. */
static int strip_brackets(const char *host, char *h, size_t cap)
{
    size_t n = host ? strlen(host) : 0;
    if (!n || n >= cap) return dx_errf(DX_EINVAL, "host '%s': empty or too long", host ? host : "");
    if (host[0] == '[' && host[n - 1] == ']') { /* "[::1]", as in URLs */
        memcpy(h, host + 1, n - 2);
        h[n - 2] = 0;
    } else {
        memcpy(h, host, n + 1);
    }
    return 0;
}

int dx_addr_resolve(const char *host, int port, struct sockaddr_storage *out, socklen_t *len)
{
    char h[256];
    int rc = strip_brackets(host, h, sizeof h);
    if (rc) return rc;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    int g = getaddrinfo(h, ps, &hints, &res);
    if (g) return dx_errf(DX_EINVAL, "host '%s' does not resolve: %s", host, gai_strerror(g));
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int dx_addr_is_loopback(const struct sockaddr *sa)
{
    dx_ipport a;
    return sa->sa_family == AF_INET6 || sa->sa_family == AF_INET
               ? dx_addr_norm(sa, &a) == 0 && dx_ipport_is_loopback(&a)
               : 0;
}

int dx_addr_port(const struct sockaddr_storage *a)
{
    return ntohs(a->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)a)->sin6_port
                                          : ((const struct sockaddr_in *)a)->sin_port);
}

void dx_addr_url_host(const char *host, char *out, size_t cap)
{
    int v6 = strchr(host, ':') && host[0] != '[';
    snprintf(out, cap, v6 ? "[%s]" : "%s", host);
}

int dx_addr_norm(const struct sockaddr *sa, dx_ipport *out)
{
    memset(out, 0, sizeof *out);
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        memcpy(out->ip, &a->sin6_addr, 16);
        out->port = ntohs(a->sin6_port);
        return 0;
    }
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        out->ip[10] = out->ip[11] = 0xff;
        memcpy(out->ip + 12, &a->sin_addr, 4);
        out->port = ntohs(a->sin_port);
        return 0;
    }
    return dx_errf(DX_EINVAL, "address family %d is not IPv4 or IPv6", sa->sa_family);
}

static int is_v4_mapped(const uint8_t ip[16])
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(ip, prefix, 12) == 0;
}

int dx_ipport_is_loopback(const dx_ipport *a)
{
    static const uint8_t v6_lo[16] = {[15] = 1};
    return is_v4_mapped(a->ip) ? a->ip[12] == 127 : memcmp(a->ip, v6_lo, 16) == 0;
}

int dx_addr_host_is_loopback(const char *host)
{
    char h[256];
    int rc = strip_brackets(host, h, sizeof h);
    if (rc) return rc;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(h, NULL, &hints, &res);
    if (g) return dx_errf(DX_EINVAL, "host '%s' does not resolve: %s", host, gai_strerror(g));
    int all = 1;
    for (struct addrinfo *ai = res; ai && all; ai = ai->ai_next) {
        dx_ipport a;
        all = dx_addr_norm(ai->ai_addr, &a) == 0 && dx_ipport_is_loopback(&a);
    }
    freeaddrinfo(res);
    return all;
}

void dx_addr_format(const dx_ipport *a, char *out, size_t cap)
{
    char s[INET6_ADDRSTRLEN];
    if (is_v4_mapped(a->ip)) {
        inet_ntop(AF_INET, a->ip + 12, s, sizeof s);
        snprintf(out, cap, "%s:%d", s, a->port);
    } else {
        inet_ntop(AF_INET6, a->ip, s, sizeof s);
        snprintf(out, cap, "[%s]:%d", s, a->port);
    }
}

void dx_addr_keepalive(int fd, int idle_s, int intvl_s, int cnt)
{
    int one = 1;
    unsigned user_ms = (unsigned)(idle_s + intvl_s * cnt) * 1000u;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl_s, sizeof intvl_s);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}

/* Host: letters, digits, '.', '-', or an [IPv6] literal; port 1..65535. */
static int parse_host_port(const char *hp, size_t len, const char *url)
{
    const char *colon = NULL;
    if (len && hp[0] == '[') {
        const char *rb = memchr(hp, ']', len);
        if (!rb || rb == hp + 1) return dx_errf(DX_EINVAL, "'%s': bad IPv6 literal", url);
        colon = rb + 1 < hp + len && rb[1] == ':' ? rb + 1 : NULL;
        if (!colon) return dx_errf(DX_EINVAL, "'%s': wants http://HOST:PORT", url);
    } else {
        for (size_t i = 0; i < len; i++)
            if (hp[i] == ':') colon = hp + i;
        if (!colon || colon == hp) return dx_errf(DX_EINVAL, "'%s': wants http://HOST:PORT", url);
        for (const char *p = hp; p < colon; p++)
            if (!(*p == '.' || *p == '-' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
                  (*p >= 'A' && *p <= 'Z')))
                return dx_errf(DX_EINVAL, "'%s': bad character in the host", url);
    }
    const char *port = colon + 1, *end = hp + len;
    long v = 0;
    if (port == end || end - port > 5) return dx_errf(DX_EINVAL, "'%s': bad port", url);
    for (const char *p = port; p < end; p++) {
        if (*p < '0' || *p > '9') return dx_errf(DX_EINVAL, "'%s': bad port", url);
        v = v * 10 + (*p - '0');
    }
    if (v < 1 || v > 65535) return dx_errf(DX_EINVAL, "'%s': port out of range 1..65535", url);
    return 0;
}

int dx_addr_http_url(const char *url, char *out, size_t cap)
{
    if (strncmp(url, "http://", 7) != 0) {
        if (strncmp(url, "https://", 8) == 0)
            return dx_errf(DX_EINVAL, "'%s': https is not supported (nodes speak plain HTTP)", url);
        return dx_errf(DX_EINVAL, "'%s': wants http://HOST:PORT", url);
    }
    size_t len = strlen(url);
    if (len > 7 && url[len - 1] == '/') len--;
    const char *hp = url + 7;
    size_t hlen = len - 7;
    if (memchr(hp, '/', hlen) || memchr(hp, '?', hlen) || memchr(hp, '@', hlen))
        return dx_errf(DX_EINVAL, "'%s': only http://HOST:PORT, no path, query or user", url);
    int rc = parse_host_port(hp, hlen, url);
    if (rc) return rc;
    if (len + 1 > cap) return dx_errf(DX_EINVAL, "'%s': URL too long", url);
    memcpy(out, url, len);
    out[len] = 0;
    return 0;
}
