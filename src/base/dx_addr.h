/* dx_addr: the address a listener binds — an IPv4 or IPv6 literal ("::1",
 * "[::]" with or without brackets) or a host name resolved with
 * getaddrinfo ("localhost").  One place so the HTTP server and the KV port
 * accept the same spellings and say the same thing when they cannot. */
#ifndef DX_ADDR_H
#define DX_ADDR_H

#include <stddef.h>
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

#endif
