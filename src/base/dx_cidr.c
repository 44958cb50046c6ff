/* dx_cidr: address ranges (see .h). */
#include "base/dx_cidr.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_err.h"

#define CIDR_TEXT_MAX 64 /* the longest IPv6 literal (45) with "/128", and room */

/* The prefix after '/': decimal digits only, no sign or leading zero, at
 * most max.  DX_NONE when it is not one. */
static int parse_prefix(const char *p, unsigned max)
{
    size_t n = strlen(p);
    if (n == 0 || n > 3 || (n > 1 && p[0] == '0')) return DX_NONE;
    unsigned v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return DX_NONE;
        v = v * 10 + (unsigned)(p[i] - '0');
    }
    return v <= max ? (int)v : DX_NONE;
}

/* The first bit past the prefix that is set, or DX_NONE when there is none. */
static int host_bits_set(const dx_cidr *c)
{
    unsigned width = c->family == AF_INET ? 32 : 128;
    for (unsigned bit = c->prefix; bit < width; bit++)
        if (c->addr[bit / 8] & (0x80u >> (bit % 8))) return (int)bit;
    return DX_NONE;
}

static void clear_host_bits(dx_cidr *c)
{
    unsigned width = c->family == AF_INET ? 32 : 128;
    for (unsigned bit = c->prefix; bit < width; bit++)
        c->addr[bit / 8] &= (uint8_t) ~(0x80u >> (bit % 8));
}

int dx_cidr_parse(const char *s, dx_cidr *out)
{
    memset(out, 0, sizeof *out);
    size_t n = s ? strlen(s) : 0;
    if (n == 0)
        return dx_errf(DX_EINVAL,
                       "'': empty; want an address range such as 10.0.0.0/8 or fd00::/8");
    if (n >= CIDR_TEXT_MAX)
        return dx_errf(DX_EINVAL, "'%.40s...': too long for an address range", s);
    char addr[CIDR_TEXT_MAX];
    memcpy(addr, s, n + 1);
    char *slash = strchr(addr, '/');
    if (slash) *slash = 0;
    if (inet_pton(AF_INET, addr, out->addr) == 1)
        out->family = AF_INET;
    else if (inet_pton(AF_INET6, addr, out->addr) == 1)
        out->family = AF_INET6;
    else
        return dx_errf(DX_EINVAL,
                       "'%s': '%s' is not an IPv4 or IPv6 address (a literal such as 10.0.0.0 or "
                       "fd00::, without brackets or host names)",
                       s, addr);
    unsigned width = out->family == AF_INET ? 32 : 128;
    out->prefix = width;
    if (slash) {
        int p = parse_prefix(slash + 1, width);
        if (p < 0)
            return dx_errf(DX_EINVAL, "'%s': the prefix length after '/' must be a number 0..%u", s,
                           width);
        out->prefix = (unsigned)p;
    }
    if (host_bits_set(out) >= 0) {
        dx_cidr net = *out;
        clear_host_bits(&net);
        char want[CIDR_TEXT_MAX];
        dx_cidr_format(&net, want, sizeof want);
        return dx_errf(DX_EINVAL, "'%s': bits are set past the /%u prefix (the range is %s)", s,
                       out->prefix, want);
    }
    return 0;
}

static int prefix_equal(const uint8_t *a, const uint8_t *b, unsigned bits)
{
    unsigned whole = bits / 8, rest = bits % 8;
    if (memcmp(a, b, whole) != 0) return 0;
    if (!rest) return 1;
    uint8_t mask = (uint8_t)(0xffu << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

int dx_cidr_match(const dx_cidr *c, const struct sockaddr *sa)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const uint8_t *a;
    int family = sa->sa_family;
    if (family == AF_INET) {
        a = (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
    } else if (family == AF_INET6) {
        a = (const uint8_t *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (c->family == AF_INET && !memcmp(a, v4mapped, sizeof v4mapped)) {
            a += 12; /* an IPv4 peer on an IPv6 socket */
            family = AF_INET;
        }
    } else {
        return 0;
    }
    return family == c->family && prefix_equal(a, c->addr, c->prefix);
}

void dx_cidr_format(const dx_cidr *c, char *out, size_t cap)
{
    char a[INET6_ADDRSTRLEN] = "?";
    inet_ntop(c->family, c->addr, a, sizeof a);
    snprintf(out, cap, "%s/%u", a, c->prefix);
}
