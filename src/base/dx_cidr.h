/* dx_cidr: IPv4 and IPv6 address ranges in CIDR notation ("10.0.0.0/8",
 * "fd00::/8", or one address: "10.1.2.3" is /32, "::1" is /128), and
 * whether a peer's address falls in one.
 *
 * Parsing is strict, because a range decides whom a server trusts: the
 * address must be a literal inet_pton accepts (no host names, no brackets,
 * no zone ids, no leading zeros in IPv4), the prefix a plain decimal within
 * the family's width, and no bit may be set past the prefix ("10.0.0.1/8" is
 * refused, naming 10.0.0.0/8) — a typo must not silently widen or narrow
 * the range.  A peer that connected to an IPv6 socket from an IPv4 address
 * (::ffff:a.b.c.d) matches IPv4 ranges. */
#ifndef DX_CIDR_H
#define DX_CIDR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct {
    int family;       /* AF_INET or AF_INET6 */
    uint8_t addr[16]; /* network byte order; IPv4 in the first 4 bytes */
    unsigned prefix;  /* 0..32 or 0..128 */
} dx_cidr;

/* 0 and *out, or DX_EINVAL with a message that quotes s and says what is
 * wrong with it. */
int dx_cidr_parse(const char *s, dx_cidr *out);
/* 1 when the address (AF_INET or AF_INET6; anything else never matches)
 * is inside the range. */
int dx_cidr_match(const dx_cidr *c, const struct sockaddr *sa);
/* The range as text ("10.0.0.0/8"), into out. */
void dx_cidr_format(const dx_cidr *c, char *out, size_t cap);

#endif
