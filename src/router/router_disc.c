/* router_disc: periodic scans of the registration keys off the loop (see .h). */
#include "router/router_disc.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_log.h"

struct router_disc {
    router_disc_config cfg;
    rds_url redis;
    char prefix[NODE_REG_PREFIX_MAX + 1];
    char where[RDS_HOST_MAX + 32];
    uv_timer_t timer;
    uv_work_t work;
    int busy, closed, destroyed, down;
    uint64_t errors;
    size_t bad, bad_last; /* registrations that did not parse: in the scan, and logged */
    /* the scan (pool thread while busy) */
    redisContext *c;
    node_reg_info *found;
    size_t n_found;
    int ok;
    char err[512];
};

static void collect(void *user, const node_reg_info *ni)
{
    router_disc *d = user;
    if (d->n_found == NODE_REG_SCAN_MAX) return;
    d->found[d->n_found++] = *ni;
}

static void scan_work(uv_work_t *w)
{
    router_disc *d = w->data;
    d->n_found = 0;
    d->ok = 0;
    uint64_t t = d->cfg.interval_ms;
    int timeout = (int)(t < 200 ? 200 : t > 2000 ? 2000 : t);
    size_t bad = 0;
    d->bad = 0;
    int rc = d->c ? 0 : rds_connect(&d->redis, timeout, &d->c);
    if (!rc) rc = node_reg_scan(d->c, d->prefix, collect, d, &bad);
    if (rc < 0) {
        snprintf(d->err, sizeof d->err, "%s", dx_errmsg());
        if (d->c) redisFree(d->c);
        d->c = NULL;
        return;
    }
    d->ok = 1;
    d->bad = bad;
    if (bad) snprintf(d->err, sizeof d->err, "%s", dx_errmsg()); /* the last one's reason */
}

static void maybe_free(router_disc *d)
{
    if (!d->destroyed || !d->closed || d->busy) return;
    if (d->c) redisFree(d->c);
    dx_free(d->found);
    dx_free(d);
}

static void scan_done(uv_work_t *w, int status)
{
    router_disc *d = w->data;
    d->busy = 0;
    if (d->destroyed) {
        maybe_free(d);
        return;
    }
    int ok = status == 0 && d->ok;
    if (!ok) {
        d->errors++;
        if (!d->down)
            DX_LOGW("router: discovery: %s: %s; keeping the nodes known, retrying", d->where,
                    status ? uv_strerror(status) : d->err);
        d->down = 1;
    } else if (d->down) {
        DX_LOGI("router: discovery: %s readable again", d->where);
        d->down = 0;
    }
    if (ok && d->bad != d->bad_last && d->bad)
        DX_LOGW("router: discovery: skipping %zu registrations that do not parse (%s)", d->bad,
                d->err);
    if (ok) d->bad_last = d->bad;
    d->cfg.on_scan(d->cfg.user, d->found, ok ? d->n_found : 0, ok);
}

static void on_tick(uv_timer_t *t)
{
    router_disc *d = t->data;
    if (d->busy) return; /* the last scan is still waiting on Redis */
    d->busy = 1;
    d->err[0] = 0;
    if (uv_queue_work(t->loop, &d->work, scan_work, scan_done)) d->busy = 0;
}

int router_disc_create(uv_loop_t *loop, const router_disc_config *c, router_disc **out)
{
    *out = NULL;
    router_disc *d = dx_calloc(1, sizeof *d);
    if (!d || !(d->found = dx_calloc(NODE_REG_SCAN_MAX, sizeof *d->found))) {
        dx_free(d);
        return dx_errf(DX_ENOMEM, "out of memory");
    }
    d->cfg = *c;
    d->redis = *c->redis;
    snprintf(d->prefix, sizeof d->prefix, "%s", c->prefix);
    rds_url_format(&d->redis, d->where, sizeof d->where);
    d->work.data = d;
    uv_timer_init(loop, &d->timer);
    d->timer.data = d;
    uv_timer_start(&d->timer, on_tick, 0, c->interval_ms);
    *out = d;
    return 0;
}

static void on_closed(uv_handle_t *h)
{
    router_disc *d = h->data;
    d->closed = 1;
    maybe_free(d);
}

void router_disc_destroy(router_disc *d)
{
    if (!d) return;
    d->destroyed = 1;
    uv_close((uv_handle_t *)&d->timer, on_closed);
}

uint64_t router_disc_errors(const router_disc *d)
{
    return d->errors;
}

size_t router_disc_bad(const router_disc *d)
{
    return d->bad_last;
}
