/* node_pd: prefill/decode steps of a request (see .h).  Every function
 * works on the node's node_pd, the request's node_pd_req and the view the
 * server passes in; nothing here knows the server's request. */
#include "node/node_pd.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_log.h"

static const char *const k_dir[2] = {"p2d", "d2p"};

void node_pd_init(node_pd *p)
{
    memset(p, 0, sizeof *p);
    prom_hist_init_latency(&p->st.pull_seconds);
}

void node_pd_configure(node_pd *p, const node_pd_config *cfg)
{
    p->cfg = *cfg;
}

void node_pd_free(node_pd *p)
{
    (void)p; /* nothing allocated today; kept as the pair of init */
}

static uint32_t block_size(const node_pd *p)
{
    return kv_pool_block_size(node_kv_pool(p->cfg.kv));
}

static uint32_t threshold(const node_pd *p)
{
    return p->cfg.recompute_threshold ? p->cfg.recompute_threshold
                                      : NODE_PD_DEFAULT_RECOMPUTE_THRESHOLD;
}

/* ---- before tokenising ---------------------------------------------------- */

/* The request's namespace in the reply memory: its cache salt's first
 * bytes (0, the shared one, when it has none). */
static uint64_t salt_ns(const node_pd_view *v)
{
    uint64_t ns;
    memcpy(&ns, v->salt, sizeof ns);
    return ns;
}

static int names_self(const node_pd *p, const kvtp *in)
{
    node_kv *k = p->cfg.kv;
    if (in->engine_id[0] && !strcmp(in->engine_id, node_kv_engine_id(k))) return 1;
    return in->host[0] && in->port == node_kv_port(k) && !strcmp(in->host, node_kv_host(k));
}

int node_pd_parse(const node_pd *p, node_pd_req *pd, const node_pd_view *v, const void *params,
                  oai_err *err)
{
    node_kv *k = p->cfg.kv;
    if (params && !v->trusted) {
        /* they would make this node pull from, or hold KV for, an address
         * the caller names: only the router (the internal key) and trusted
         * ranges give them (http_auth.h); the request runs as a plain one */
        pd->params_untrusted = 1;
        DX_LOGD("%s: kv_transfer_params ignored: the caller did not present the internal key",
                v->id);
    } else if (params && !k) {
        pd->params_ignored = 1; /* no KV port: a plain request */
    } else if (params) {
        kvtp_limits lim = {p->cfg.n_vocab, block_size(p), p->cfg.n_ctx};
        int rc = kvtp_parse(params, &lim, &pd->in, err);
        if (rc) return rc;
        pd->has_params = 1;
        pd->self = names_self(p, &pd->in);
    }
    if (k && pd->has_params && pd->in.do_remote_decode)
        pd->hold = NODE_PD_HOLD_FOR_DECODE;
    else if (k && v->trusted && p->cfg.bidirectional && !p->cfg.prefill)
        pd->hold = NODE_PD_HOLD_RETAIN; /* its params (node, port, lease) go to routers only */
    pd->memo = v->chat && pd->hold != NODE_PD_HOLD_FOR_DECODE && p->cfg.mem;
    return 0;
}

void node_pd_hist_src(const node_pd *p, const node_pd_req *pd, const node_pd_view *v, hist_src *src)
{
    hist_src_init(src, p->cfg.tk, p->cfg.end_ids, p->cfg.n_end);
    src->mem = p->cfg.mem;
    src->ns = salt_ns(v);
    src->now_ns = dx_now_ns();
    if (pd->has_params && pd->in.token_ids) { /* the holder's sequence */
        src->seq = pd->in.token_ids;
        src->n_seq = pd->in.n_tokens;
        /* a prefill node's prompt, not a decode node's generated sequence */
        src->mem_first = !pd->in.do_remote_decode && !pd->self;
    }
}

void node_pd_hist_done(node_pd_req *pd, const hist_src *src)
{
    pd->from_seq = src->from_seq;
    pd->from_mem = src->from_mem;
    pd->retokenised = src->retokenised;
}

void node_pd_prepared(node_pd *p, const node_pd_req *pd)
{
    node_pd_stats *st = &p->st;
    st->params_ignored += (uint64_t)pd->params_ignored;
    st->params_untrusted += (uint64_t)pd->params_untrusted;
    st->replies_from_seq += pd->from_seq;
    st->replies_from_mem += pd->from_mem;
    st->replies_retokenised += pd->retokenised;
}

int node_pd_wants_text(const node_pd_req *pd)
{
    return pd->memo;
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
    node_pd_req *pd = w->data;
    node_kv_pull_run(pd->owner->cfg.kv, &pd->pull);
}

static void count_pull(node_pd *p, node_pd_req *pd)
{
    node_pd_stats *st = &p->st;
    const node_kv_pull *pl = &pd->pull;
    st->pulls[pd->d2p]++;
    st->pull_blocks[pd->d2p] += pl->n_pulled;
    st->pull_bytes[pd->d2p] += pl->bytes;
    if (pl->n_pulled) prom_hist_observe(&st->pull_seconds, pl->seconds);
    if (pl->why != NODE_KV_OK) st->fallbacks[pl->why]++;
}

static void pull_done(uv_work_t *w, int status)
{
    node_pd_req *pd = w->data;
    node_pd *p = pd->owner;
    pd->pulling = 0;
    pd->n_pulled = status == 0 ? pd->pull.n_pulled : 0;
    count_pull(p, pd);
    if (pd->pull.why != NODE_KV_OK)
        DX_LOGI("%s: pulled %u of %zu blocks from %s:%d (%s: %s); computing the rest", pd->id,
                pd->pull.n_pulled, pd->pull.n, pd->pull.host, pd->pull.port,
                node_kv_fallback_name(pd->pull.why), pd->pull.reason);
    p->cfg.on_pulled(pd->user); /* last: the server submits the request, or frees it */
}

/* The prompt's full blocks (all but the last token, which is always
 * computed) that this node's cache holds: referenced, in pd->blocks. */
static int match_local(const node_pd *p, node_pd_req *pd, const node_pd_view *v, size_t n_full)
{
    kv_pool *pool = node_kv_pool(p->cfg.kv);
    pd->chain = dx_malloc(n_full * sizeof *pd->chain);
    pd->blocks = dx_malloc(n_full * sizeof *pd->blocks);
    if (!pd->chain || !pd->blocks)
        return dx_errf(DX_ENOMEM, "P/D: hash chain of %zu blocks", n_full);
    kv_pool_hash_chain_from(pool, kv_pool_seed_salted(pool, v->salt), v->prompt,
                            n_full * block_size(p), pd->chain);
    pd->n_local =
        p->cfg.no_prefix_cache ? 0 : kv_pool_match_prefix(pool, pd->chain, n_full, pd->blocks);
    pd->owns_blocks = 1;
    return 0;
}

/* A prefill node's first token is ours to send when it came from the same
 * model (first_token_model, the fingerprint) and the same prompt
 * (remote_token_ids is exactly ours): the router sends both nodes the same
 * sampling fields, so it is the token this node would sample first
 * (docs/pd.md). */
static void take_first(const node_pd *p, node_pd_req *pd, const node_pd_view *v)
{
    const kvtp *in = &pd->in;
    pd->n_first = 0;
    if (!pd->has_params || !in->do_remote_prefill || in->do_remote_decode || pd->self ||
        memcmp(&in->first_model, node_kv_model(p->cfg.kv), sizeof in->first_model) != 0 ||
        !in->first_ids || !in->n_first || !in->token_ids || in->n_tokens != v->n_prompt ||
        memcmp(in->token_ids, v->prompt, v->n_prompt * sizeof *v->prompt) != 0)
        return;
    if (v->has_max_tokens && in->n_first > (size_t)v->max_tokens) return;
    if (v->logprobs) return; /* its probabilities were the prefill node's: compute it here */
    memcpy(pd->first, in->first_ids, in->n_first * sizeof *pd->first);
    pd->n_first = in->n_first;
}

int node_pd_plan(node_pd *p, node_pd_req *pd, const node_pd_view *v, void *user)
{
    const kvtp *in = &pd->in;
    take_first(p, pd, v);
    if (!p->cfg.kv || !pd->has_params || !in->do_remote_prefill || !kvtp_has_holder(in) || pd->self)
        return 0; /* nothing remote: the engine matches its own cache at admission */
    if (in->do_remote_decode && !p->cfg.bidirectional) return 0; /* one-way P→D only */
    uint32_t bs = block_size(p);
    /* the last token is computed here: the prompt's, or the first token's */
    size_t n_full = (pd->n_first ? v->n_prompt : v->n_prompt - 1) / bs;
    /* the holder's blocks that are ours: its sequence agrees with our prompt */
    size_t avail = in->n_blocks < n_full ? in->n_blocks : n_full;
    if (in->token_ids) {
        size_t same = common_prefix(v->prompt, v->n_prompt, in->token_ids, in->n_tokens) / bs;
        if (same < avail) avail = same;
    }
    if (!avail || match_local(p, pd, v, n_full)) return 0;
    if (pd->n_local >= avail) return 0;
    size_t want = avail - pd->n_local;
    if (want * bs < threshold(p)) {
        pd->below_threshold = 1;
        p->st.below_threshold++;
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
    pd->owner = p;
    pd->id = v->id;
    pd->user = user;
    pd->work.data = pd;
    pd->pulling = 1;
    if (uv_queue_work(p->cfg.loop, &pd->work, pull_work, pull_done) < 0) {
        pd->pulling = 0;
        return 0;
    }
    return 1;
}

void node_pd_engine_request(const node_pd_req *pd, engine_request *er)
{
    er->prefix_blocks = pd->blocks;
    er->n_prefix_blocks = pd->n_local + pd->n_pulled;
    er->want_kv = pd->hold != NODE_PD_HOLD_NONE || pd->memo;
    memcpy(er->pregen, pd->first, pd->n_first * sizeof *er->pregen);
    er->n_pregen = (uint32_t)pd->n_first;
}

void node_pd_submitted(node_pd_req *pd)
{
    pd->owns_blocks = 0;
}

/* ---- the end of the request ------------------------------------------------- */

static int32_t *copy_ids(const int32_t *ids, size_t n)
{
    return dx_memdup(n ? ids : (const int32_t[1]){0}, (n ? n : 1) * sizeof *ids);
}

/* Engine thread: the blocks are still the sequence's; a lease keeps them. */
void node_pd_on_kv(const node_pd *p, node_pd_req *pd, const node_pd_view *v, const engine_event *ev)
{
    size_t n = ev->n_kv_blocks;
    if (pd->hold == NODE_PD_HOLD_FOR_DECODE && n > v->n_prompt / block_size(p))
        n = v->n_prompt / block_size(p); /* the prompt's blocks, not the probe token's */
    if (pd->hold != NODE_PD_HOLD_NONE && n) {
        pd->held_ids = copy_ids(ev->kv_blocks, n);
        int retain = pd->hold == NODE_PD_HOLD_RETAIN;
        if (pd->held_ids && node_kv_hold(p->cfg.kv, ev->kv_blocks, n, retain, &pd->lease) == 0) {
            pd->held = 1;
            pd->n_held = n;
        } else {
            pd->hold_failed = 1;
        }
    }
    if (pd->hold == NODE_PD_HOLD_FOR_DECODE && ev->n_tokens > v->n_prompt) {
        size_t g = ev->n_tokens - v->n_prompt;
        pd->n_first = g < KVTP_MAX_FIRST ? g : KVTP_MAX_FIRST;
        memcpy(pd->first, ev->tokens + v->n_prompt, pd->n_first * sizeof *pd->first);
    }
    if (pd->hold == NODE_PD_HOLD_RETAIN || pd->memo) {
        pd->seq = copy_ids(ev->tokens, ev->n_tokens);
        pd->n_seq = pd->seq ? ev->n_tokens : 0;
    }
}

/* The answer's params: what this node now holds for a next reader. */
static void answer_params(const node_pd *p, node_pd_req *pd, const node_pd_view *v, char **params)
{
    node_kv *k = p->cfg.kv;
    kvtp out = {.do_remote_prefill = 1, .port = node_kv_port(k), .num_tokens = 0, .ttl_s = -1};
    snprintf(out.engine_id, sizeof out.engine_id, "%s", node_kv_engine_id(k));
    snprintf(out.request_id, sizeof out.request_id, "%s", v->id);
    snprintf(out.host, sizeof out.host, "%s", node_kv_host(k));
    out.block_ids = pd->held ? pd->held_ids : (int32_t[1]){0};
    out.n_blocks = pd->held ? pd->n_held : 0;
    out.num_tokens = (int64_t)out.n_blocks * block_size(p);
    out.has_lease = pd->held;
    out.lease = pd->lease;
    if (pd->held) out.ttl_s = node_kv_lease_ttl(k, pd->hold == NODE_PD_HOLD_RETAIN);
    int retain = pd->hold == NODE_PD_HOLD_RETAIN;
    out.token_ids = retain ? pd->seq : (int32_t *)v->prompt; /* kvtp_write only reads them */
    out.n_tokens = retain ? pd->n_seq : v->n_prompt;
    if (pd->hold == NODE_PD_HOLD_FOR_DECODE && pd->n_first) { /* what the decode node sends first */
        out.first_ids = pd->first;
        out.n_first = pd->n_first;
        out.first_model = *node_kv_model(k);
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    if (kvtp_write(&b, &out) == 0) *params = dx_buf_take(&b);
    dx_buf_free(&b);
}

/* Remembers the reply for token-faithful history, when the client got
 * exactly the text its ids give (a stop string cuts it otherwise). */
static void remember_reply(const node_pd *p, const node_pd_req *pd, const node_pd_view *v,
                           const node_pd_end *e)
{
    if (!pd->memo || !pd->seq || pd->n_seq < v->n_prompt || !e->kept || e->lost) return;
    const int32_t *gen = pd->seq + v->n_prompt;
    size_t n = hist_strip_end(gen, pd->n_seq - v->n_prompt, p->cfg.end_ids, p->cfg.n_end);
    dx_buf t;
    dx_buf_init(&t, 0);
    int same = hist_reply_text(p->cfg.tk, gen, n, &t) == 0 && t.len == e->text_len &&
               (t.len == 0 || !memcmp(t.data, e->text, t.len));
    dx_buf_free(&t);
    if (same)
        hist_mem_put(p->cfg.mem, salt_ns(v), v->prompt, v->n_prompt, e->text ? e->text : "",
                     e->text_len, gen, n, dx_now_ns());
}

void node_pd_finish(node_pd *p, node_pd_req *pd, const node_pd_view *v, const node_pd_end *e,
                    char **params)
{
    int normal = (e->finish == ENGINE_FINISH_STOP || e->finish == ENGINE_FINISH_LENGTH) && !e->lost;
    uint32_t pulled = node_pd_pulled_tokens(p, pd);
    node_pd_stats *st = &p->st;
    st->tokens_pulled += pulled;
    st->tokens_local += e->n_cached - pulled;
    st->tokens_computed += e->n_prompt - e->n_cached;
    st->holds += pd->held;
    st->hold_failed += pd->hold_failed;
    st->first_from_prefill += pd->hold != NODE_PD_HOLD_FOR_DECODE && pd->n_first;
    if (normal && (pd->held || pd->hold == NODE_PD_HOLD_FOR_DECODE))
        answer_params(p, pd, v, params);
    if (normal) remember_reply(p, pd, v, e);
}

void node_pd_req_free(const node_pd *p, node_pd_req *pd)
{
    if (pd->owns_blocks) {
        kv_pool *pool = node_kv_pool(p->cfg.kv);
        for (size_t i = 0; i < pd->n_local + pd->n_pulled; i++) kv_pool_unref(pool, pd->blocks[i]);
    }
    kvtp_free(&pd->in);
    dx_free(pd->blocks);
    dx_free(pd->chain);
    dx_free(pd->held_ids);
    dx_free(pd->seq);
    memset(pd, 0, sizeof *pd);
}

uint32_t node_pd_pulled_tokens(const node_pd *p, const node_pd_req *pd)
{
    return (uint32_t)pd->n_pulled * (pd->n_pulled ? block_size(p) : 0);
}

const char *node_pd_log_suffix(node_pd_req *pd)
{
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

/* What retention holds (docs/pd.md, "Sizing"): one retention lease per
 * conversation; its blocks' tokens and bytes (a block two conversations
 * share, a common system prompt, counts for each), and the pool's layout
 * that turns tokens into bytes. */
static void write_retained(dx_buf *b, node_kv *k, const xfer_leases_stats *ls)
{
    kv_pool *pool = node_kv_pool(k);
    double blocks = (double)ls->retained_blocks;
    prom_write_gauge(b, "duplex_kv_retained_conversations",
                     "Conversations whose KV this node retains (retention leases)", ls->retained);
    prom_write_gauge(b, "duplex_kv_retained_tokens", "Tokens of KV the retention leases hold",
                     blocks * kv_pool_block_size(pool));
    prom_write_gauge(b, "duplex_kv_retained_bytes", "Bytes of KV the retention leases hold",
                     blocks * (double)kv_pool_block_bytes(pool));
    prom_write_gauge(b, "duplex_kv_block_bytes",
                     "Bytes of one KV block (all layers' K and V of block_size tokens)",
                     (double)kv_pool_block_bytes(pool));
    char l[64];
    snprintf(l, sizeof l, "dtype=\"%s\",block_size=\"%u\"", dx_dtype_name(kv_pool_dtype(pool)),
             kv_pool_block_size(pool));
    prom_write_header(
        b, "duplex_kv_cache_info", "gauge",
        "The KV cache's layout (1): what two nodes must share to pull each other's KV");
    prom_write_value(b, "duplex_kv_cache_info", l, 1);
}

static void write_leases(dx_buf *b, node_kv *k, const node_pd_stats *st)
{
    node_kv_stats ks;
    node_kv_get_stats(k, &ks);
    prom_write_gauge(b, "duplex_kv_leases", "Live leases (held KV for readers)", ks.leases.leases);
    prom_write_gauge(b, "duplex_kv_leased_blocks", "Block references the live leases hold",
                     (double)ks.leases.blocks);
    prom_write_gauge(b, "duplex_kv_pins", "Live pins (reads in progress)", ks.leases.pins);
    write_retained(b, k, &ks.leases);
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

void node_pd_write_metrics(const node_pd *p, dx_buf *b)
{
    const node_pd_stats *st = &p->st;
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
    if (!p->cfg.kv) return;
    write_pulls(b, st);
    write_fallbacks(b, st);
    write_leases(b, p->cfg.kv, st);
}
