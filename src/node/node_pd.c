/* node_pd: prefill/decode steps of a request (see .h). */
#include "node/node_pd.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "node/node_server_priv.h"

static const char *const k_dir[2] = {"p2d", "d2p"};

void node_pd_stats_init(node_pd_stats *st)
{
    memset(st, 0, sizeof *st);
    prom_hist_init_latency(&st->pull_seconds);
}

void node_pd_stats_free(node_pd_stats *st)
{
    (void)st; /* nothing allocated today; kept as the pair of init */
}

static uint32_t block_size(const node_server *s)
{
    return kv_pool_block_size(node_kv_pool(s->be.kv));
}

static uint32_t threshold(const node_server *s)
{
    return s->cfg.recompute_threshold ? s->cfg.recompute_threshold : 64;
}

/* ---- before tokenising ---------------------------------------------------- */

/* The request's namespace in the reply memory: its cache salt's first
 * bytes (0, the shared one, when it has none). */
static uint64_t salt_ns(const node_req *q)
{
    uint64_t ns;
    memcpy(&ns, q->salt, sizeof ns);
    return ns;
}

static int names_self(const node_server *s, const kvtp *p)
{
    node_kv *k = s->be.kv;
    if (p->engine_id[0] && !strcmp(p->engine_id, node_kv_engine_id(k))) return 1;
    return p->host[0] && p->port == node_kv_port(k) && !strcmp(p->host, node_kv_host(k));
}

int node_pd_parse(node_server *s, node_req *q, oai_err *err)
{
    node_pd_req *pd = &q->pd;
    node_kv *k = s->be.kv;
    if (q->o.kv_transfer_params && !q->trusted) {
        /* they would make this node pull from, or hold KV for, an address
         * the caller names: only the router (the internal key) and trusted
         * ranges give them (http_auth.h); the request runs as a plain one */
        pd->params_untrusted = 1;
        DX_LOGD("%s: kv_transfer_params ignored: the caller did not present the internal key",
                q->id);
    } else if (q->o.kv_transfer_params && !k) {
        pd->params_ignored = 1; /* no KV port: a plain request */
    } else if (q->o.kv_transfer_params) {
        kvtp_limits lim = {s->be.n_vocab, block_size(s), s->be.n_ctx};
        int rc = kvtp_parse(q->o.kv_transfer_params, &lim, &pd->in, err);
        if (rc) return rc;
        pd->has_params = 1;
        pd->self = names_self(s, &pd->in);
    }
    if (k && pd->has_params && pd->in.do_remote_decode)
        pd->hold = NODE_PD_HOLD_FOR_DECODE;
    else if (k && q->trusted && s->cfg.bidirectional && s->cfg.role != NODE_ROLE_PREFILL)
        pd->hold = NODE_PD_HOLD_RETAIN; /* its params (node, port, lease) go to routers only */
    pd->memo = q->o.kind == OAI_CHAT && pd->hold != NODE_PD_HOLD_FOR_DECODE && s->mem;
    return 0;
}

void node_pd_hist_src(node_server *s, node_req *q, hist_src *src)
{
    const node_pd_req *pd = &q->pd;
    hist_src_init(src, s->be.tk, s->be.end_ids, s->be.n_end);
    src->mem = s->mem;
    src->ns = salt_ns(q);
    src->now_ns = dx_now_ns();
    if (pd->has_params && pd->in.token_ids) { /* the holder's sequence */
        src->seq = pd->in.token_ids;
        src->n_seq = pd->in.n_tokens;
        /* a prefill node's prompt, not a decode node's generated sequence */
        src->mem_first = !pd->in.do_remote_decode && !pd->self;
    }
}

void node_pd_hist_done(node_server *s, node_req *q, const hist_src *src)
{
    (void)s;
    q->pd.from_seq = src->from_seq;
    q->pd.from_mem = src->from_mem;
    q->pd.retokenised = src->retokenised;
}

void node_pd_prepared(node_server *s, node_req *q)
{
    node_pd_stats *st = &s->pd;
    st->params_ignored += (uint64_t)q->pd.params_ignored;
    st->params_untrusted += (uint64_t)q->pd.params_untrusted;
    st->replies_from_seq += q->pd.from_seq;
    st->replies_from_mem += q->pd.from_mem;
    st->replies_retokenised += q->pd.retokenised;
}

int node_pd_wants_text(node_server *s, const node_req *q)
{
    (void)s;
    return q->pd.memo;
}

/* ---- planning and the pull -------------------------------------------------- */

static size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static void pull_work(uv_work_t *w)
{
    node_req *q = w->data;
    node_kv_pull_run(q->srv->be.kv, &q->pd.pull);
}

static void count_pull(node_server *s, node_pd_req *pd)
{
    node_pd_stats *st = &s->pd;
    const node_kv_pull *p = &pd->pull;
    st->pulls[pd->d2p]++;
    st->pull_blocks[pd->d2p] += p->n_pulled;
    st->pull_bytes[pd->d2p] += p->bytes;
    if (p->n_pulled) prom_hist_observe(&st->pull_seconds, p->seconds);
    if (p->why != NODE_KV_OK) st->fallbacks[p->why]++;
}

static void pull_done(uv_work_t *w, int status)
{
    node_req *q = w->data;
    node_server *s = q->srv;
    node_pd_req *pd = &q->pd;
    pd->pulling = 0;
    pd->n_pulled = status == 0 ? pd->pull.n_pulled : 0;
    count_pull(s, pd);
    if (pd->pull.why != NODE_KV_OK)
        DX_LOGI("%s: pulled %u of %zu blocks from %s:%d (%s: %s); computing the rest", q->id,
                pd->pull.n_pulled, pd->pull.n, pd->pull.host, pd->pull.port,
                node_kv_fallback_name(pd->pull.why), pd->pull.reason);
    node_server_submit(s, q);
}

/* The prompt's full blocks (all but the last token, which is always
 * computed) that this node's cache holds: referenced, in pd->blocks. */
static int match_local(node_server *s, node_req *q, size_t n_full)
{
    node_pd_req *pd = &q->pd;
    kv_pool *pool = node_kv_pool(s->be.kv);
    pd->chain = dx_malloc(n_full * sizeof *pd->chain);
    pd->blocks = dx_malloc(n_full * sizeof *pd->blocks);
    if (!pd->chain || !pd->blocks)
        return dx_errf(DX_ENOMEM, "P/D: hash chain of %zu blocks", n_full);
    kv_pool_hash_chain_from(pool, kv_pool_seed_salted(pool, q->salt), q->prompt,
                            n_full * block_size(s), pd->chain);
    pd->n_local =
        s->cfg.no_prefix_cache ? 0 : kv_pool_match_prefix(pool, pd->chain, n_full, pd->blocks);
    pd->owns_blocks = 1;
    return 0;
}

/* A prefill node's first token is ours to send when it came from the same
 * model (first_token_model, the fingerprint) and the same prompt
 * (remote_token_ids is exactly ours): the router sends both nodes the same
 * sampling fields, so it is the token this node would sample first
 * (docs/pd.md). */
static void take_first(node_server *s, node_req *q)
{
    node_pd_req *pd = &q->pd;
    const kvtp *in = &pd->in;
    pd->n_first = 0;
    if (!pd->has_params || !in->do_remote_prefill || in->do_remote_decode || pd->self ||
        memcmp(&in->first_model, node_kv_model(s->be.kv), sizeof in->first_model) != 0 ||
        !in->first_ids || !in->n_first || !in->token_ids || in->n_tokens != q->n_prompt ||
        memcmp(in->token_ids, q->prompt, q->n_prompt * sizeof *q->prompt) != 0)
        return;
    if (q->o.has_max_tokens && in->n_first > (size_t)q->o.max_tokens) return;
    if (q->o.logprobs) return; /* its probabilities were the prefill node's: compute it here */
    memcpy(pd->first, in->first_ids, in->n_first * sizeof *pd->first);
    pd->n_first = in->n_first;
}

uint32_t node_pd_pregen(const node_req *q, int32_t *out)
{
    memcpy(out, q->pd.first, q->pd.n_first * sizeof *out);
    return (uint32_t)q->pd.n_first;
}

int node_pd_plan(node_server *s, node_req *q)
{
    node_pd_req *pd = &q->pd;
    const kvtp *in = &pd->in;
    take_first(s, q);
    if (!s->be.kv || !pd->has_params || !in->do_remote_prefill || !kvtp_has_holder(in) || pd->self)
        return 0; /* nothing remote: the engine matches its own cache at admission */
    if (in->do_remote_decode && !s->cfg.bidirectional) return 0; /* one-way P→D only */
    uint32_t bs = block_size(s);
    /* the last token is computed here: the prompt's, or the first token's */
    size_t n_full = (pd->n_first ? q->n_prompt : q->n_prompt - 1) / bs;
    /* the holder's blocks that are ours: its sequence agrees with our prompt */
    size_t avail = in->n_blocks < n_full ? in->n_blocks : n_full;
    if (in->token_ids) {
        size_t same = common_prefix(q->prompt, q->n_prompt, in->token_ids, in->n_tokens) / bs;
        if (same < avail) avail = same;
    }
    if (!avail || match_local(s, q, n_full)) return 0;
    if (pd->n_local >= avail) return 0;
    size_t want = avail - pd->n_local;
    if (want * bs < threshold(s)) {
        pd->below_threshold = 1;
        s->pd.below_threshold++;
        return 0;
    }
    pd->d2p = in->do_remote_decode;
    pd->pull = (node_kv_pull){.host = in->host,
                              .port = in->port,
                              .lease = in->lease,
                              .chain = pd->chain + pd->n_local,
                              .remote_ids = in->block_ids + pd->n_local,
                              .n = want,
                              .local_ids = pd->blocks + pd->n_local};
    pd->work.data = q;
    pd->pulling = 1;
    if (uv_queue_work(s->loop, &pd->work, pull_work, pull_done) < 0) {
        pd->pulling = 0;
        return 0;
    }
    return 1;
}

int node_pd_want_kv(const node_req *q)
{
    return q->pd.hold != NODE_PD_HOLD_NONE || q->pd.memo;
}

void node_pd_submitted(node_req *q)
{
    q->pd.owns_blocks = 0;
}

/* ---- the end of the request ------------------------------------------------- */

static int32_t *copy_ids(const int32_t *ids, size_t n)
{
    return dx_memdup(n ? ids : (const int32_t[1]){0}, (n ? n : 1) * sizeof *ids);
}

/* Engine thread: the blocks are still the sequence's; a lease keeps them. */
void node_pd_on_kv(node_server *s, node_req *q, const engine_event *ev)
{
    node_pd_req *pd = &q->pd;
    size_t n = ev->n_kv_blocks;
    if (pd->hold == NODE_PD_HOLD_FOR_DECODE && n > q->n_prompt / block_size(s))
        n = q->n_prompt / block_size(s); /* the prompt's blocks, not the probe token's */
    if (pd->hold != NODE_PD_HOLD_NONE && n) {
        pd->held_ids = copy_ids(ev->kv_blocks, n);
        int retain = pd->hold == NODE_PD_HOLD_RETAIN;
        if (pd->held_ids && node_kv_hold(s->be.kv, ev->kv_blocks, n, retain, &pd->lease) == 0) {
            pd->held = 1;
            pd->n_held = n;
        } else {
            pd->hold_failed = 1;
        }
    }
    if (pd->hold == NODE_PD_HOLD_FOR_DECODE && ev->n_tokens > q->n_prompt) {
        size_t g = ev->n_tokens - q->n_prompt;
        pd->n_first = g < KVTP_MAX_FIRST ? g : KVTP_MAX_FIRST;
        memcpy(pd->first, ev->tokens + q->n_prompt, pd->n_first * sizeof *pd->first);
    }
    if (pd->hold == NODE_PD_HOLD_RETAIN || pd->memo) {
        pd->seq = copy_ids(ev->tokens, ev->n_tokens);
        pd->n_seq = pd->seq ? ev->n_tokens : 0;
    }
}

/* The answer's params: what this node now holds for a next reader. */
static void answer_params(node_server *s, node_req *q)
{
    node_pd_req *pd = &q->pd;
    node_kv *k = s->be.kv;
    kvtp out = {.do_remote_prefill = 1, .port = node_kv_port(k), .num_tokens = 0, .ttl_s = -1};
    snprintf(out.engine_id, sizeof out.engine_id, "%s", node_kv_engine_id(k));
    snprintf(out.request_id, sizeof out.request_id, "%s", q->id);
    snprintf(out.host, sizeof out.host, "%s", node_kv_host(k));
    out.block_ids = pd->held ? pd->held_ids : (int32_t[1]){0};
    out.n_blocks = pd->held ? pd->n_held : 0;
    out.num_tokens = (int64_t)out.n_blocks * block_size(s);
    out.has_lease = pd->held;
    out.lease = pd->lease;
    if (pd->held) out.ttl_s = node_kv_lease_ttl(k, pd->hold == NODE_PD_HOLD_RETAIN);
    int retain = pd->hold == NODE_PD_HOLD_RETAIN;
    out.token_ids = retain ? pd->seq : q->prompt;
    out.n_tokens = retain ? pd->n_seq : q->n_prompt;
    if (pd->hold == NODE_PD_HOLD_FOR_DECODE && pd->n_first) { /* what the decode node sends first */
        out.first_ids = pd->first;
        out.n_first = pd->n_first;
        out.first_model = *node_kv_model(k);
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    if (kvtp_write(&b, &out) == 0) q->extra = dx_buf_take(&b);
    dx_buf_free(&b);
}

/* Remembers the reply for token-faithful history, when the client got
 * exactly the text its ids give (a stop string cuts it otherwise). */
static void remember_reply(node_server *s, node_req *q)
{
    node_pd_req *pd = &q->pd;
    if (!pd->memo || !pd->seq || pd->n_seq < q->n_prompt || !q->keep_text || q->lost) return;
    const int32_t *gen = pd->seq + q->n_prompt;
    size_t n = hist_strip_end(gen, pd->n_seq - q->n_prompt, s->be.end_ids, s->be.n_end);
    dx_buf t;
    dx_buf_init(&t, 0);
    int same = hist_reply_text(s->be.tk, gen, n, &t) == 0 && t.len == q->text.len &&
               (t.len == 0 || !memcmp(t.data, q->text.data, t.len));
    dx_buf_free(&t);
    if (same)
        hist_mem_put(s->mem, salt_ns(q), q->prompt, q->n_prompt, q->text.data ? q->text.data : "",
                     q->text.len, gen, n, dx_now_ns());
}

void node_pd_finish(node_server *s, node_req *q)
{
    node_pd_req *pd = &q->pd;
    const node_done *d = &q->fin;
    int normal = (d->finish == ENGINE_FINISH_STOP || d->finish == ENGINE_FINISH_LENGTH) && !q->lost;
    uint32_t pulled = node_pd_pulled_tokens(q);
    s->pd.tokens_pulled += pulled;
    s->pd.tokens_local += d->n_cached - pulled;
    s->pd.tokens_computed += d->n_prompt - d->n_cached;
    s->pd.holds += pd->held;
    s->pd.hold_failed += pd->hold_failed;
    s->pd.first_from_prefill += pd->hold != NODE_PD_HOLD_FOR_DECODE && pd->n_first;
    if (normal && (pd->held || pd->hold == NODE_PD_HOLD_FOR_DECODE)) answer_params(s, q);
    if (normal) remember_reply(s, q);
}

void node_pd_req_free(node_server *s, node_req *q)
{
    node_pd_req *pd = &q->pd;
    if (pd->owns_blocks) {
        kv_pool *pool = node_kv_pool(s->be.kv);
        for (size_t i = 0; i < pd->n_local + pd->n_pulled; i++) kv_pool_unref(pool, pd->blocks[i]);
    }
    kvtp_free(&pd->in);
    dx_free(pd->blocks);
    dx_free(pd->chain);
    dx_free(pd->held_ids);
    dx_free(pd->seq);
    memset(pd, 0, sizeof *pd);
}

uint32_t node_pd_pulled_tokens(const node_req *q)
{
    return (uint32_t)q->pd.n_pulled * (q->pd.n_pulled ? block_size(q->srv) : 0);
}

const char *node_pd_log_suffix(node_req *q)
{
    node_pd_req *pd = &q->pd;
    pd->log[0] = 0;
    if (pd->pull.n)
        snprintf(pd->log, sizeof pd->log, " pull=%s:%u/%zu(%s)%s", k_dir[pd->d2p],
                 pd->pull.n_pulled, pd->pull.n, node_kv_fallback_name(pd->pull.why),
                 pd->held ? " held" : "");
    else if (pd->below_threshold)
        snprintf(pd->log, sizeof pd->log, " pull=below_threshold%s", pd->held ? " held" : "");
    else if (pd->held)
        snprintf(pd->log, sizeof pd->log, " held");
    if (pd->hold != NODE_PD_HOLD_FOR_DECODE && pd->n_first)
        snprintf(pd->log + strlen(pd->log), sizeof pd->log - strlen(pd->log), " first=prefill");
    return pd->log;
}

/* ---- metrics ------------------------------------------------------------------ */

/* One counter family whose series differ in one label's value. */
static void write_counters(dx_buf *b, const char *name, const char *help, const char *label,
                           const char *const *values, const uint64_t *counts, size_t n)
{
    prom_write_header(b, name, "counter", help);
    for (size_t i = 0; i < n; i++) {
        char l[96];
        snprintf(l, sizeof l, "%s=\"%s\"", label, values[i]);
        prom_write_value(b, name, l, (double)counts[i]);
    }
}

static void write_pulls(dx_buf *b, const node_pd_stats *st)
{
    static const struct {
        const char *name, *help;
        size_t off;
    } k[] = {
        {"duplex_kv_pulls_total", "KV pulls from other nodes, by direction",
         offsetof(node_pd_stats, pulls)},
        {"duplex_kv_pull_blocks_total", "KV blocks pulled, by direction",
         offsetof(node_pd_stats, pull_blocks)},
        {"duplex_kv_pull_bytes_total", "KV bytes pulled, by direction",
         offsetof(node_pd_stats, pull_bytes)},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(k); i++)
        write_counters(b, k[i].name, k[i].help, "direction", k_dir,
                       (const uint64_t *)((const char *)st + k[i].off), 2);
    prom_write_hist(b, "duplex_kv_pull_seconds", "Time of a KV pull (connect to release)",
                    &st->pull_seconds);
}

static void write_fallbacks(dx_buf *b, const node_pd_stats *st)
{
    const char *name = "duplex_kv_fallbacks_total";
    prom_write_header(b, name, "counter",
                      "Reuse that did not happen, by reason (the tokens were computed)");
    char labels[48];
    for (int f = NODE_KV_PARTIAL; f < NODE_KV_N_FALLBACKS; f++) {
        snprintf(labels, sizeof labels, "reason=\"%s\"", node_kv_fallback_name(f));
        prom_write_value(b, name, labels, (double)st->fallbacks[f]);
    }
    prom_write_value(b, name, "reason=\"below_threshold\"", (double)st->below_threshold);
    prom_write_value(b, name, "reason=\"hold_failed\"", (double)st->hold_failed);
}

static void write_leases(dx_buf *b, node_kv *k, const node_pd_stats *st)
{
    node_kv_stats ks;
    node_kv_get_stats(k, &ks);
    prom_write_gauge(b, "duplex_kv_leases", "Live leases (held KV for readers)", ks.leases.leases);
    prom_write_gauge(b, "duplex_kv_leased_blocks", "Block references the live leases hold",
                     (double)ks.leases.blocks);
    prom_write_gauge(b, "duplex_kv_pins", "Live pins (reads in progress)", ks.leases.pins);
    const char *name = "duplex_kv_lease_events_total";
    prom_write_header(b, name, "counter", "Lease lifecycle events");
    prom_write_value(b, name, "event=\"issued\"", (double)ks.leases.created);
    prom_write_value(b, name, "event=\"expired\"", (double)ks.leases.expired);
    prom_write_value(b, name, "event=\"revoked\"", (double)ks.leases.revoked);
    prom_write_value(b, name, "event=\"revoked_lru\"", (double)ks.leases.revoked_lru);
    prom_write_value(b, name, "event=\"superseded\"", (double)ks.leases.superseded);
    prom_write_value(b, name, "event=\"pinned\"", (double)ks.leases.pins_made);
    prom_write_counter(b, "duplex_kv_holds_total", "Finished requests whose KV was held",
                       (double)st->holds);
    const kvport_server_stats *p = &ks.port;
    static const char *const ev[] = {"accepted",          "authenticated", "auth_failed",
                                     "handshake_timeout", "idle_closed",   "refused",
                                     "evicted",           "paused"};
    const uint64_t n[] = {p->conns,       p->auth_ok, p->auth_failed, p->handshake_timeouts,
                          p->idle_closed, p->refused, p->evicted,     p->paused};
    write_counters(b, "duplex_kv_port_connections_total",
                   "KV-port connections by event (refused/evicted: over a cap; paused: a peer "
                   "not reading its replies)",
                   "event", ev, n, DX_ARRAY_LEN(ev));
}

void node_pd_write_metrics(node_server *s, dx_buf *b)
{
    const node_pd_stats *st = &s->pd;
    static const char *const src[] = {"local", "pulled", "computed"};
    const uint64_t tokens[] = {st->tokens_local, st->tokens_pulled, st->tokens_computed};
    write_counters(b, "duplex_kv_prompt_tokens_total",
                   "Prompt tokens of finished requests by where their KV came from", "source", src,
                   tokens, 3);
    static const char *const hsrc[] = {"params", "memory", "tokenised"};
    const uint64_t replies[] = {st->replies_from_seq, st->replies_from_mem,
                                st->replies_retokenised};
    write_counters(b, "duplex_history_replies_total",
                   "Assistant messages in prompts, by where their token ids came from", "source",
                   hsrc, replies, 3);
    prom_write_counter(b, "duplex_pd_first_token_from_prefill_total",
                       "Requests whose first token came from the prefill node (sent at once)",
                       (double)st->first_from_prefill);
    static const char *const why[] = {"no_kv_port", "untrusted"};
    const uint64_t ignored[] = {st->params_ignored, st->params_untrusted};
    write_counters(b, "duplex_kv_params_ignored_total",
                   "Requests whose kv_transfer_params were ignored: the node has no KV port, or "
                   "the caller presented neither the internal key nor a trusted address",
                   "reason", why, ignored, 2);
    if (!s->be.kv) return;
    write_pulls(b, st);
    write_fallbacks(b, st);
    write_leases(b, s->be.kv, st);
}
