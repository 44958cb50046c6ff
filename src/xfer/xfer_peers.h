/* xfer_peers: the KV addresses a node may connect to (`duplex serve
 * --kv-peers`).  The holder's address in a pull comes from a request's
 * kv_transfer_params, which a client may have written: without this list a
 * node could be made to connect anywhere its network reaches.  The reader
 * checks every address it is about to connect to (after name resolution,
 * so a name cannot resolve around the list) and refuses the rest.
 *
 * An entry is HOST, HOST:PORT, [IPV6]:PORT or ADDR/BITS (any port): a name
 * stands for every address it resolves to when the list is made.  Without a
 * list only loopback addresses (127.0.0.0/8, ::1) are allowed.  Entries can
 * be added later (the router may register its nodes); all functions are
 * thread-safe. */
#ifndef XFER_PEERS_H
#define XFER_PEERS_H

#include <sys/socket.h>

#define XFER_PEERS_MAX 4096 /* entries, after name resolution */

typedef struct xfer_peers xfer_peers;

/* list: comma-separated entries; NULL or "" = loopback only.  0, or
 * DX_EINVAL naming the entry that does not parse or resolve. */
int xfer_peers_create(const char *list, xfer_peers **out);
void xfer_peers_destroy(xfer_peers *p);
/* Adds one entry (same forms as the list). */
int xfer_peers_add(xfer_peers *p, const char *entry);
/* 1 when a connection to sa (AF_INET/AF_INET6) is allowed, else 0. */
int xfer_peers_allowed(xfer_peers *p, const struct sockaddr *sa);
/* What the start-up line shows: "loopback" or the list as given. */
const char *xfer_peers_describe(const xfer_peers *p);

#endif
