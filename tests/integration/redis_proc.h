/* redis_proc: a redis-server of the test's own on a free loopback port
 * (nothing saved to disk), stopped and started again on the same port to
 * play an outage, optionally with a password (requirepass: every client
 * must AUTH).  Include after cmocka.h and test_proc.h. */
#ifndef REDIS_PROC_H
#define REDIS_PROC_H

#include <arpa/inet.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>

typedef struct {
    tp_proc p;
    int port;
    char url[128]; /* redis://[:PASSWORD@]127.0.0.1:PORT */
    char log[160];
    char password[48]; /* set before rp_start: requirepass */
} rp_redis;

/* A loopback port nothing listens on now. */
static inline int rp_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* A blocking connection to it (NULL while it does not answer PING). */
static inline redisContext *rp_connect(const rp_redis *r)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (!c || c->err) {
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    if (r->password[0]) {
        redisReply *a = redisCommand(c, "AUTH %s", r->password);
        int ok = a && a->type == REDIS_REPLY_STATUS;
        if (a) freeReplyObject(a);
        if (!ok) {
            redisFree(c);
            return NULL;
        }
    }
    redisReply *rep = redisCommand(c, "PING");
    int ok = rep && rep->type == REDIS_REPLY_STATUS;
    if (rep) freeReplyObject(rep);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* Starts redis-server (on r->port, or a free one when it is 0) and waits
 * until it answers. */
static inline void rp_start(rp_redis *r, const char *log)
{
    if (!r->port) r->port = rp_free_port();
    if (r->password[0])
        snprintf(r->url, sizeof r->url, "redis://:%s@127.0.0.1:%d", r->password, r->port);
    else
        snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d", r->port);
    if (log != r->log) snprintf(r->log, sizeof r->log, "%s", log); /* again: the same log */
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    char *argv[] = {"/usr/bin/redis-server",
                    "--port",
                    port,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    r->password[0] ? "--requirepass" : NULL,
                    r->password,
                    NULL};
    assert_int_equal(tp_spawn(&r->p, log, argv), 0);
    for (int i = 0; i < 600; i++) {
        redisContext *c = rp_connect(r);
        if (c) {
            redisFree(c);
            return;
        }
        if (tp_gone(&r->p)) fail_msg("redis-server exited at start; see %s", log);
        tp_sleep_ms(50);
    }
    fail_msg("redis-server did not answer within 30 s; see %s", log);
}

static inline void rp_stop(rp_redis *r)
{
    tp_stop(&r->p, SIGKILL, 30);
}

/* One command's reply on a fresh connection (the caller frees it). */
static inline redisReply *rp_cmd(const rp_redis *r, const char *fmt, ...)
{
    redisContext *c = rp_connect(r);
    assert_non_null(c);
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    assert_non_null(rep);
    return rep;
}

#endif
