/* xfer_peers: an allow-list of address prefixes and ports (see .h).  A
 * linear scan: lists are short (a cluster's nodes) and a check costs far
 * less than the connect it guards. */
#include "xfer/xfer_peers.h"

#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_addr.h"
#include "base/dx_alloc.h"
#include "base/dx_err.h"

typedef struct {
    uint8_t ip[16]; /* dx_ipport form */
    int bits;       /* prefix length over the 128 bits */
    int port;       /* 0 = any */
} peer_net;

struct xfer_peers {
    pthread_mutex_t mu;
    peer_net *nets;
    size_t n, cap;
    char *desc;
};

static int push(xfer_peers *p, const uint8_t ip[16], int bits, int port)
{
    if (p->n == XFER_PEERS_MAX)
        return dx_errf(DX_ETOOBIG, "--kv-peers: more than %d addresses", XFER_PEERS_MAX);
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        peer_net *v = dx_realloc(p->nets, cap * sizeof *v);
        if (!v) return dx_errf(DX_ENOMEM, "out of memory");
        p->nets = v;
        p->cap = cap;
    }
    peer_net *e = &p->nets[p->n++];
    memcpy(e->ip, ip, 16);
    e->bits = bits;
    e->port = port;
    return 0;
}

/* "host", "host:port", "[v6]", "[v6]:port", "v6", "addr/bits" into parts. */
static int split(const char *entry, char *host, size_t cap, int *port, int *bits)
{
    const char *e = entry, *end = entry + strlen(entry), *colon = NULL;
    *port = 0;
    *bits = -1;
    if (*e == '[') {
        const char *rb = strchr(e, ']');
        if (!rb) goto bad;
        colon = rb[1] == ':' ? rb + 1 : NULL;
        if (rb[1] && !colon) goto bad;
        e++;
        end = rb;
    } else {
        const char *c = strchr(e, ':');
        if (c && !strchr(c + 1, ':')) colon = end = c; /* one colon: host:port */
    }
    const char *slash = memchr(e, '/', (size_t)(end - e));
    size_t hn = (size_t)((slash ? slash : end) - e);
    if (hn == 0 || hn >= cap) goto bad;
    memcpy(host, e, hn);
    host[hn] = 0;
    char *x;
    if (slash) {
        long b = strtol(slash + 1, &x, 10);
        if (x != end || slash + 1 == end || b < 0 || b > 128) goto bad;
        *bits = (int)b;
    }
    if (colon) {
        long v = strtol(colon + 1, &x, 10);
        if (*x || colon[1] == 0 || v < 1 || v > 65535) goto bad;
        *port = (int)v;
    }
    return 0;
bad:
    return dx_errf(DX_EINVAL, "--kv-peers: '%s' is not HOST, HOST:PORT, [IPV6]:PORT or ADDR/BITS",
                   entry);
}

static int add_locked(xfer_peers *p, const char *entry)
{
    char host[256];
    int port, bits;
    int rc = split(entry, host, sizeof host, &port, &bits);
    if (rc) return rc;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (bits >= 0) hints.ai_flags = AI_NUMERICHOST; /* a prefix names no host */
    int g = getaddrinfo(host, NULL, &hints, &res);
    if (g)
        return dx_errf(DX_EINVAL, "--kv-peers: '%s' does not resolve: %s", entry, gai_strerror(g));
    for (struct addrinfo *ai = res; ai && !rc; ai = ai->ai_next) {
        dx_ipport a;
        if (dx_addr_norm(ai->ai_addr, &a)) continue;
        int v4 = ai->ai_family == AF_INET;
        if (bits > (v4 ? 32 : 128))
            rc = dx_errf(DX_EINVAL, "--kv-peers: '%s': /%d is too long", entry, bits);
        else
            rc = push(p, a.ip, bits < 0 ? 128 : v4 ? 96 + bits : bits, port);
    }
    freeaddrinfo(res);
    return rc;
}

int xfer_peers_add(xfer_peers *p, const char *entry)
{
    pthread_mutex_lock(&p->mu);
    int rc = add_locked(p, entry);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

static int add_loopback(xfer_peers *p)
{
    static const uint8_t v4[16] = {[10] = 0xff, [11] = 0xff, [12] = 127};
    static const uint8_t v6[16] = {[15] = 1};
    int rc = push(p, v4, 96 + 8, 0);
    return rc ? rc : push(p, v6, 128, 0);
}

static int add_list(xfer_peers *p, const char *list)
{
    char *copy = dx_strdup(list), *save = NULL;
    if (!copy) return dx_errf(DX_ENOMEM, "out of memory");
    int rc = 0;
    for (char *t = strtok_r(copy, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save))
        rc = add_locked(p, t);
    if (!rc && p->n == 0) rc = dx_errf(DX_EINVAL, "--kv-peers: '%s' names no address", list);
    dx_free(copy);
    return rc;
}

int xfer_peers_create(const char *list, xfer_peers **out)
{
    *out = NULL;
    xfer_peers *p = dx_calloc(1, sizeof *p);
    if (!p) return dx_errf(DX_ENOMEM, "out of memory");
    pthread_mutex_init(&p->mu, NULL);
    int given = list && *list;
    p->desc = dx_strdup(given ? list : "loopback");
    int rc = !p->desc ? dx_errf(DX_ENOMEM, "out of memory")
             : given  ? add_list(p, list)
                      : add_loopback(p);
    if (rc) {
        xfer_peers_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

void xfer_peers_destroy(xfer_peers *p)
{
    if (!p) return;
    pthread_mutex_destroy(&p->mu);
    dx_free(p->nets);
    dx_free(p->desc);
    dx_free(p);
}

static int prefix_eq(const uint8_t *a, const uint8_t *b, int bits)
{
    int whole = bits / 8, rest = bits % 8;
    if (memcmp(a, b, (size_t)whole)) return 0;
    if (!rest) return 1;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

int xfer_peers_allowed(xfer_peers *p, const struct sockaddr *sa)
{
    dx_ipport a;
    if (dx_addr_norm(sa, &a)) return 0;
    pthread_mutex_lock(&p->mu);
    int ok = 0;
    for (size_t i = 0; i < p->n && !ok; i++)
        ok = (!p->nets[i].port || p->nets[i].port == a.port) &&
             prefix_eq(p->nets[i].ip, a.ip, p->nets[i].bits);
    pthread_mutex_unlock(&p->mu);
    return ok;
}

const char *xfer_peers_describe(const xfer_peers *p)
{
    return p->desc;
}
