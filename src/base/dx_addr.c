/* dx_addr: listen addresses (see .h). */
#include "base/dx_addr.h"

#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_err.h"

int dx_addr_resolve(const char *host, int port, struct sockaddr_storage *out, socklen_t *len)
{
    char h[256];
    size_t n = host ? strlen(host) : 0;
    if (!n || n >= sizeof h) return dx_errf(DX_EINVAL, "host '%s': empty or too long", host ? host : "");
    if (host[0] == '[' && host[n - 1] == ']') { /* "[::1]", as in URLs */
        memcpy(h, host + 1, n - 2);
        h[n - 2] = 0;
    } else {
        memcpy(h, host, n + 1);
    }
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res = NULL;
    int g = getaddrinfo(h, ps, &hints, &res);
    if (g) return dx_errf(DX_EINVAL, "host '%s' does not resolve: %s", host, gai_strerror(g));
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int dx_addr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family != AF_INET6) return 0;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
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
