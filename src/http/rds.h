/* rds: what the router's shared state and the nodes' self-registration need
 * from Redis (hiredis) in one place — the `redis://` URL they both accept and
 * a connection opened with a deadline.
 *
 * URL: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] — HOST a name, an IPv4
 * literal or a bracketed IPv6 one; PORT 1..65535 (default 6379); DB a
 * decimal 0..15 (default 0).  Anything else is refused with a message that
 * quotes the URL and says what is wrong, because a typo here silently splits
 * a cluster's state. */
#ifndef RDS_H
#define RDS_H

#include <hiredis.h>

#define RDS_HOST_MAX   256
#define RDS_SECRET_MAX 256

typedef struct {
    char host[RDS_HOST_MAX]; /* without brackets */
    int port;
    int db;
    char user[RDS_SECRET_MAX];     /* "" = none (AUTH with the password alone) */
    char password[RDS_SECRET_MAX]; /* "" = no AUTH */
} rds_url;

/* 0 and *out, or DX_EINVAL with a message. */
int rds_url_parse(const char *url, rds_url *out);
/* "redis://host:port/db", the password never shown (for logs). */
void rds_url_format(const rds_url *u, char *out, size_t cap);

/* A blocking connection: connect, AUTH and SELECT each within timeout_ms,
 * later commands too (redisSetTimeout).  0 and *out, or DX_EIO with a
 * message naming the server and what failed.  Free with redisFree. */
int rds_connect(const rds_url *u, int timeout_ms, redisContext **out);

#endif
