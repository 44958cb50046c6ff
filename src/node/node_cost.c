/* node_cost: a node's costs and its reuse decision (see .h). */
#include "node/node_cost.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_est.h"
#include "http/prom.h"

#define PROBE_MAX_RATIO 4.0 /* a probe only where pulling looked at most this much dearer */

/* One pull's parts (seconds): outside its reads, the pin's round trip, the
 * reads beyond a round trip per byte; and its bytes (the weight). */
typedef struct {
    double setup, rtt, per_byte, bytes;
} pull_sample;

typedef struct {
    char addr[NODE_LOAD_ADDR_MAX]; /* "host:port"; "" = free slot */
    pull_sample ring[NODE_COST_PULL_RING];
    size_t next, n;
    uint64_t total;    /* pulls measured */
    int last;          /* the last decision: -1 none, 0 recompute, 1 pull */
    uint32_t declined; /* recompute decisions since its last pull */
    uint64_t used;     /* the table's clock when last decided about or pulled from */
} peer;

struct node_cost {
    node_cost_config cfg;
    char transport[NODE_LOAD_NAME_MAX];
    node_load fixed;
    int fixed_model, fixed_pull;
    peer peers[NODE_COST_MAX_PEERS];
    uint64_t clock;
    uint64_t decisions[2][2][2]; /* [dir][rule: 0 auto, 1 threshold][path: 0 recompute, 1 pull] */
    uint64_t probes;
    prom_hist err_pull, err_prefill; /* actual / estimated */
};

static const double k_ratio_bounds[] = {0.25, 0.5, 0.67, 0.8, 0.9, 1.1, 1.25, 1.5, 2, 4};

int node_cost_create(const node_cost_config *cfg, node_cost **out)
{
    *out = NULL;
    node_cost *c = dx_calloc(1, sizeof *c);
    if (!c) return dx_errf(DX_ENOMEM, "out of memory for the node's cost model");
    c->cfg = *cfg;
    snprintf(c->transport, sizeof c->transport, "%s",
             cfg->transport && *cfg->transport ? cfg->transport : "default");
    c->cfg.transport = c->transport;
    if (cfg->fixed) {
        c->fixed = *cfg->fixed;
        const node_load *f = &c->fixed;
        c->fixed_model = f->step_s > 0 || f->prefill_tok_s > 0 || f->prefill_key_s > 0 ||
                         f->decode_tok_s > 0 || f->decode_key_s > 0;
        c->fixed_pull = f->pull_setup_s > 0 || f->pull_byte_s > 0;
    }
    c->cfg.fixed = NULL;
    prom_hist_init(&c->err_pull, k_ratio_bounds, DX_ARRAY_LEN(k_ratio_bounds));
    prom_hist_init(&c->err_prefill, k_ratio_bounds, DX_ARRAY_LEN(k_ratio_bounds));
    *out = c;
    return 0;
}

void node_cost_destroy(node_cost *c)
{
    dx_free(c);
}

void node_cost_model(node_cost *c, step_cost_model *out)
{
    memset(out, 0, sizeof *out);
    if (c->cfg.get_model) c->cfg.get_model(c->cfg.user, out);
    if (!c->fixed_model) return;
    const node_load *f = &c->fixed;
    out->step_s = f->step_s;
    out->pre_tok_s = f->prefill_tok_s;
    out->pre_key_s = f->prefill_key_s;
    out->dec_tok_s = f->decode_tok_s;
    out->dec_key_s = f->decode_key_s;
    if (f->itl_s > 0) out->itl_s[0] = f->itl_s;
    if (f->itl_prefill_s > 0) out->itl_s[1] = f->itl_prefill_s;
}

/* ---- peers ------------------------------------------------------------------------ */

static void peer_init(peer *p, const char *addr)
{
    memset(p, 0, sizeof *p);
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    p->last = -1;
}

/* The peer at host:port, made (in the least recently used slot) when new. */
static peer *peer_of(node_cost *c, const char *host, int port)
{
    char addr[NODE_LOAD_ADDR_MAX];
    snprintf(addr, sizeof addr, "%s:%d", host ? host : "", port);
    peer *old = &c->peers[0];
    for (size_t i = 0; i < NODE_COST_MAX_PEERS; i++) {
        peer *p = &c->peers[i];
        if (p->addr[0] && !strcmp(p->addr, addr)) {
            p->used = ++c->clock;
            return p;
        }
        if (!p->addr[0] || (old->addr[0] && p->used < old->used)) old = p;
    }
    peer_init(old, addr);
    old->used = ++c->clock;
    return old;
}

/* The median of v[0..n) weighted by w (n ≤ NODE_COST_PULL_RING; v is
 * reordered along with w). */
static double weighted_median(double *v, double *w, size_t n)
{
    double total = 0;
    for (size_t i = 1; i < n; i++) /* insertion sort: n is small */
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
            t = w[j];
            w[j] = w[j - 1];
            w[j - 1] = t;
        }
    for (size_t i = 0; i < n; i++) total += w[i];
    double acc = 0;
    for (size_t i = 0; i < n; i++)
        if ((acc += w[i]) >= total / 2) return v[i];
    return n ? v[n - 1] : 0;
}

/* The peer's pull law: th[0] seconds whatever the size (set-up and the
 * reads' round trip), th[1] seconds per byte. */
static void peer_coef(const node_cost *c, const peer *p, double *th)
{
    if (c->fixed_pull) {
        th[0] = c->fixed.pull_setup_s;
        th[1] = c->fixed.pull_byte_s;
        return;
    }
    if (!p->n) {
        th[0] = NODE_COST_PRIOR_SETUP_MS * 1e-3;
        th[1] = 1e-9 / NODE_COST_PRIOR_GBPS;
        return;
    }
    double a[NODE_COST_PULL_RING], b[NODE_COST_PULL_RING], one[NODE_COST_PULL_RING],
        w[NODE_COST_PULL_RING];
    for (size_t i = 0; i < p->n; i++) {
        a[i] = p->ring[i].setup;
        b[i] = p->ring[i].rtt;
        one[i] = 1;
    }
    double setup = weighted_median(a, one, p->n);
    for (size_t i = 0; i < p->n; i++) one[i] = 1;
    double rtt = weighted_median(b, one, p->n);
    for (size_t i = 0; i < p->n; i++) {
        a[i] = p->ring[i].per_byte;
        w[i] = p->ring[i].bytes;
    }
    th[0] = setup + rtt;
    th[1] = weighted_median(a, w, p->n);
}

double node_cost_pull_s(node_cost *c, const char *host, int port, uint64_t bytes)
{
    double th[2];
    peer_coef(c, peer_of(c, host, port), th);
    return th[0] + th[1] * (double)bytes;
}

/* ---- the decision ------------------------------------------------------------------- */

void node_cost_decide(node_cost *c, node_cost_ask *a)
{
    step_cost_model m;
    node_cost_model(c, &m);
    peer *p = peer_of(c, a->host, a->port);
    double th[2];
    peer_coef(c, p, th);
    uint64_t bytes = a->n_tokens * c->cfg.kv_token_bytes;
    a->pull_s = th[0] + th[1] * (double)bytes;
    a->recompute_s = step_cost_prefill_extra(&m, a->n_tokens, a->pos, a->rest ? a->rest : 1,
                                             c->cfg.batch_tokens);
    a->probe = 0;
    int rule = a->threshold ? 1 : 0;
    if (rule) {
        a->pull = a->n_tokens >= a->threshold;
    } else {
        double bar = 1.0; /* pull when pull_s < bar × recompute_s */
        if (p->last == 1) bar = 1.0 + NODE_COST_HYSTERESIS_PCT / 100.0;
        if (p->last == 0) bar = 1.0 - NODE_COST_HYSTERESIS_PCT / 100.0;
        a->pull = a->pull_s < bar * a->recompute_s;
        if (!a->pull && ++p->declined >= NODE_COST_PROBE_AFTER && !c->fixed_pull &&
            a->pull_s < PROBE_MAX_RATIO * a->recompute_s) {
            a->pull = a->probe = 1;
            c->probes++;
        }
        p->last = a->pull;
    }
    if (a->pull) p->declined = 0;
    c->decisions[a->dir & 1][rule][a->pull]++;
}

void node_cost_pulled(node_cost *c, const char *host, int port, const node_cost_pull *pl)
{
    if (!pl->bytes || !(pl->seconds > 0)) return; /* a failed pull says nothing of the link */
    peer *p = peer_of(c, host, port);
    double rtt = pl->rtt_s > 0 ? pl->rtt_s : 0, read = pl->read_s > 0 ? pl->read_s : 0;
    double setup = pl->seconds - read, beyond = read - rtt;
    p->ring[p->next] = (pull_sample){.setup = setup > 0 ? setup : 0,
                                     .rtt = rtt,
                                     .per_byte = beyond > 0 ? beyond / (double)pl->bytes : 0,
                                     .bytes = (double)pl->bytes};
    p->next = (p->next + 1) % NODE_COST_PULL_RING;
    if (p->n < NODE_COST_PULL_RING) p->n++;
    p->total++;
    if (pl->est_s > 0) prom_hist_observe(&c->err_pull, pl->seconds / pl->est_s);
}

void node_cost_prefilled(node_cost *c, double est_s, double seconds)
{
    if (est_s > 0 && seconds > 0) prom_hist_observe(&c->err_prefill, seconds / est_s);
}

/* ---- what the node publishes --------------------------------------------------------- */

/* The peers most recently used first, at most n. */
static size_t recent_peers(const node_cost *c, const peer **out, size_t n)
{
    const peer *all[NODE_COST_MAX_PEERS];
    size_t k = 0;
    for (size_t i = 0; i < NODE_COST_MAX_PEERS; i++) {
        const peer *p = &c->peers[i];
        if (!p->addr[0]) continue;
        size_t at = k++;
        for (; at > 0 && all[at - 1]->used < p->used; at--) all[at] = all[at - 1];
        all[at] = p;
    }
    if (k > n) k = n;
    memcpy(out, all, k * sizeof *out);
    return k;
}

void node_cost_publish(node_cost *c, const engine_stats *es, const char *kv, node_load *out)
{
    memset(out, 0, sizeof *out);
    step_cost_model m;
    node_cost_model(c, &m);
    out->has = 1;
    out->fixed = c->fixed_model || c->fixed_pull;
    out->samples = m.samples;
    out->step_s = m.step_s;
    out->prefill_tok_s = m.pre_tok_s;
    out->prefill_key_s = m.pre_key_s;
    out->decode_tok_s = m.dec_tok_s;
    out->decode_key_s = m.dec_key_s;
    /* a mean not measured yet is the model's step */
    out->itl_s = m.itl_n[0] || c->fixed.itl_s > 0 ? m.itl_s[0] : m.step_s;
    out->itl_prefill_s = m.itl_n[1] || c->fixed.itl_prefill_s > 0 ? m.itl_s[1] : out->itl_s;
    if (es) {
        out->running = es->running;
        out->waiting = es->waiting;
        out->prefill_pending = es->prefill_pending;
    }
    out->batch_tokens = c->cfg.batch_tokens;
    out->kv_token_bytes = c->cfg.kv_token_bytes;
    if (kv) snprintf(out->kv, sizeof out->kv, "%s", kv);
    out->pull_setup_s = c->fixed_pull ? c->fixed.pull_setup_s : NODE_COST_PRIOR_SETUP_MS * 1e-3;
    out->pull_byte_s = c->fixed_pull ? c->fixed.pull_byte_s : 1e-9 / NODE_COST_PRIOR_GBPS;
    const peer *recent[NODE_LOAD_MAX_PEERS];
    out->n_peers = recent_peers(c, recent, NODE_LOAD_MAX_PEERS);
    for (size_t i = 0; i < out->n_peers; i++) {
        node_load_peer *q = &out->peers[i];
        double th[2];
        peer_coef(c, recent[i], th);
        snprintf(q->kv, sizeof q->kv, "%s", recent[i]->addr);
        snprintf(q->transport, sizeof q->transport, "%s", c->transport);
        q->samples = (uint32_t)recent[i]->total;
        q->setup_s = th[0];
        q->byte_s = th[1];
    }
}

/* ---- /metrics -------------------------------------------------------------------------- */

static void write_model(const step_cost_model *m, int fixed, dx_buf *b)
{
    const char *name = "duplex_cost_model_seconds";
    prom_write_header(b, name, "gauge",
                      "The step-time model this node decides with (fitted to its own steps, or "
                      "--fixed-costs): seconds per step, per token and per key attended");
    const struct {
        const char *term;
        double v;
    } t[] = {{"step", m->step_s},
             {"prefill_token", m->pre_tok_s},
             {"prefill_key", m->pre_key_s},
             {"decode_token", m->dec_tok_s},
             {"decode_key", m->dec_key_s}};
    for (size_t i = 0; i < DX_ARRAY_LEN(t); i++) {
        char l[48];
        snprintf(l, sizeof l, "term=\"%s\"", t[i].term);
        prom_write_value(b, name, l, t[i].v);
    }
    prom_write_gauge(b, "duplex_cost_model_samples", "Engine steps the model was fitted to",
                     (double)m->samples);
    prom_write_gauge(b, "duplex_cost_model_fixed", "1 when --fixed-costs sets the costs", fixed);
    /* the streams' pace: a decode step with and without prefill work in it */
    const char *itl = "duplex_decode_step_seconds";
    prom_write_header(b, itl, "histogram",
                      "Time of an engine step that decodes (the running streams' inter-token "
                      "latency), by whether the step also prefilled");
    static const double bounds[STEP_COST_ITL_N] = STEP_COST_ITL_BOUNDS;
    for (int w = 0; w < 2; w++) {
        prom_hist h;
        prom_hist_init(&h, bounds, STEP_COST_ITL_N);
        memcpy(h.counts, m->itl_hist[w], sizeof m->itl_hist[w]);
        h.count = 0;
        for (int i = 0; i <= STEP_COST_ITL_N; i++) h.count += m->itl_hist[w][i];
        h.sum = m->itl_sum[w];
        prom_write_hist_series(b, itl, w ? "prefill=\"yes\"" : "prefill=\"no\"", &h);
    }
}

static void write_peers(node_cost *c, dx_buf *b)
{
    static const char *const names[] = {"duplex_kv_peer_pull_setup_seconds",
                                        "duplex_kv_peer_pull_byte_seconds",
                                        "duplex_kv_peer_pull_samples"};
    static const char *const help[] = {
        "A pull's time from this peer whatever its size (connect, authenticate, pin, release, and "
        "the reads' round trip), as measured",
        "Seconds per byte a pull from this peer's reads take beyond their round trip, as measured",
        "Pulls from this peer the estimate is fitted to"};
    for (int w = 0; w < 3; w++) {
        prom_write_header(b, names[w], "gauge", help[w]);
        for (size_t i = 0; i < NODE_COST_MAX_PEERS; i++) {
            const peer *p = &c->peers[i];
            if (!p->addr[0]) continue;
            double th[2];
            peer_coef(c, p, th);
            char l[NODE_LOAD_ADDR_MAX + 64];
            snprintf(l, sizeof l, "peer=\"%s\",transport=\"%s\"", p->addr, c->transport);
            prom_write_value(b, names[w], l, w == 2 ? (double)p->total : th[w]);
        }
    }
}

void node_cost_write_metrics(node_cost *c, dx_buf *b)
{
    step_cost_model m;
    node_cost_model(c, &m);
    write_model(&m, c->fixed_model || c->fixed_pull, b);
    write_peers(c, b);
    const char *name = "duplex_kv_reuse_decisions_total";
    prom_write_header(b, name, "counter",
                      "Pull-or-recompute decisions about a remote KV prefix, by direction, rule "
                      "(auto: the estimates; threshold: --kv-recompute-threshold N) and path");
    static const char *const dir[] = {"p2d", "d2p"}, *const rule[] = {"auto", "threshold"},
                             *const path[] = {"recompute", "pull"};
    for (int d = 0; d < 2; d++)
        for (int r = 0; r < 2; r++)
            for (int p = 0; p < 2; p++) {
                char l[96];
                snprintf(l, sizeof l, "direction=\"%s\",rule=\"%s\",path=\"%s\"", dir[d], rule[r],
                         path[p]);
                prom_write_value(b, name, l, (double)c->decisions[d][r][p]);
            }
    prom_write_counter(b, "duplex_kv_reuse_probes_total",
                       "Pulls made to measure a peer the estimates had judged too slow",
                       (double)c->probes);
    const char *err = "duplex_cost_estimate_ratio";
    prom_write_header(b, err, "histogram",
                      "Measured time over estimated time: of pulls (against the peer's estimate), "
                      "of prefills on an idle engine (against the step model)");
    prom_write_hist_series(b, err, "what=\"pull\"", &c->err_pull);
    prom_write_hist_series(b, err, "what=\"prefill\"", &c->err_prefill);
}
