/* dx_addr: the address a listener binds — an IPv4 or IPv6 literal ("::1",
 * "[::]" with or without brackets) or a host name resolved with
 * getaddrinfo ("localhost").  One place so the HTTP server and the KV port
 * accept the same spellings and say the same thing when they cannot. */
#ifndef DX_ADDR_H
#define DX_ADDR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* 0 and *out (its length in *len), or DX_EINVAL with a message naming the
 * host and what the resolver said.  A name is looked up (blocking): call it
 * at start-up, not on a serving path. */
int dx_addr_resolve(const char *host, int port, struct sockaddr_storage *out, socklen_t *len);

/* 1 for a loopback address: 127.0.0.0/8, ::1, or ::ffff:127.x.y.z. */
int dx_addr_is_loopback(const struct sockaddr *sa);

/* The port of a bound address. */
int dx_addr_port(const struct sockaddr_storage *a);

/* host as it goes into a URL: IPv6 literals in brackets ("[::1]"). */
void dx_addr_url_host(const char *host, char *out, size_t cap);

/* An IP address and port in one form for both families: IPv4 as the
 * IPv4-mapped IPv6 address (::ffff:a.b.c.d), so that a v4 peer seen through
 * a dual-stack socket compares equal to the same peer seen through a v4 one. */
typedef struct {
    uint8_t ip[16];
    int port;
} dx_ipport;

/* 0, or DX_EINVAL for an address that is not IPv4/IPv6. */
int dx_addr_norm(const struct sockaddr *sa, dx_ipport *out);
/* 1 for 127.0.0.0/8 (IPv4-mapped too) and ::1. */
int dx_ipport_is_loopback(const dx_ipport *a);
/* 1 when every address `host` resolves to is a loopback address, 0 when one
 * is not, DX_EINVAL (message set) when it does not resolve.  Blocking. */
int dx_addr_host_is_loopback(const char *host);
/* "a.b.c.d:port" or "[v6]:port" */
void dx_addr_format(const dx_ipport *a, char *out, size_t cap);

/* TCP keepalive on socket fd: the first probe after idle_s of silence, then
 * every intvl_s, the connection dropped after cnt unanswered ones; and
 * TCP_USER_TIMEOUT so that data left unacknowledged for idle_s + intvl_s *
 * cnt seconds also drops it.  Best effort: options the kernel lacks are
 * skipped. */
void dx_addr_keepalive(int fd, int idle_s, int intvl_s, int cnt);

/* "http://HOST:PORT" with an optional trailing "/" (HOST a name, an IPv4
 * literal or a bracketed IPv6 one; no path, query or user): 0 and the
 * normalised URL (no trailing slash) in out, or DX_EINVAL saying what is
 * wrong (also when it does not fit in cap). */
int dx_addr_http_url(const char *url, char *out, size_t cap);

#endif
