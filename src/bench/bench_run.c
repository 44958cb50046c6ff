/* bench_run: the multi-turn client (see .h).
 *
 * One thread, one curl multi handle: each client is a small state machine
 * (start a turn when its think time is over, parse the stream as it arrives,
 * record, append the reply, schedule the next turn).  SSE events are parsed
 * when their last byte arrives, so the first content token is timed then. */
#include "bench/bench_run.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "router/router_sse.h"

int bench_api_parse(const char *s, enum bench_api *out)
{
    static const char *const names[] = {"chat", "messages", "responses"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) {
            *out = (enum bench_api)i;
            return 0;
        }
    return dx_errf(DX_EINVAL, "'%s' is not an API (chat|messages|responses)", s);
}

const char *bench_api_name(enum bench_api a)
{
    return a == BENCH_API_MESSAGES ? "messages" : a == BENCH_API_RESPONSES ? "responses" : "chat";
}

const char *bench_err_name(enum bench_err e)
{
    static const char *const n[BENCH_N_ERR] = {"ok",      "http",   "transport",
                                               "timeout", "stream", "malformed"};
    return e < BENCH_N_ERR ? n[e] : "?";
}

void bench_results_free(bench_results *r)
{
    dx_free(r->rec);
    memset(r, 0, sizeof *r);
}

int bench_results_add(bench_results *r, const bench_record *rec)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        bench_record *p = dx_realloc(r->rec, cap * sizeof *p);
        if (!p) return dx_errf(DX_ENOMEM, "out of memory");
        r->rec = p;
        r->cap = cap;
    }
    r->rec[r->n++] = *rec;
    return 0;
}

/* ---- one client ------------------------------------------------------------ */

typedef struct {
    int active;       /* has a conversation */
    int measured;     /* its records count */
    uint32_t conv_ix; /* index in the workload */
    bench_conv plan;
    json_t *msgs;
    uint32_t turn; /* 0-based: the next turn to send */
    uint64_t due_ns;
    /* the request in flight */
    CURL *h;
    struct curl_slist *hdrs;
    char *body;
    uint64_t t0, t_first, t_last;
    router_sse sse; /* the answer's events (the router's splitter: CRLF, multi-line data) */
    dx_buf scratch, text;
    char head[160]; /* the answer's first bytes, for an error's detail */
    size_t n_head;
    long prompt, cached, completion;
    int saw_done, saw_error, bad;
    char err_detail[160];
    char prev_id[64]; /* Responses: the last response, which the next turn continues */
} client;

typedef struct {
    const bench_run_config *c;
    CURLM *m;
    client *cl;
    uint32_t next_warm, next_conv; /* conversations handed out */
    uint64_t t_measured;           /* when the first measured request started */
    uint32_t turns_done, convs_done;
    bench_results *res;
    uint64_t last_progress;
    int in_flight;
} runner;

static void got_text(client *k, const json_t *t)
{
    if (!json_is_string(t) || !json_string_length(t)) return;
    uint64_t now = dx_now_ns();
    if (!k->t_first) k->t_first = now;
    k->t_last = now;
    dx_buf_append(&k->text, json_string_value(t), json_string_length(t));
}

static long int_of(const json_t *o, const char *name)
{
    return (long)json_integer_value(json_object_get(o, name));
}

/* An Anthropic or Responses event: its text, its usage, its end. */
static void on_typed_event(client *k, const char *type, const json_t *v)
{
    if (!strcmp(type, "content_block_delta")) {
        got_text(k, json_object_get(json_object_get(v, "delta"), "text"));
    } else if (!strcmp(type, "message_delta")) { /* the whole usage, at the end */
        const json_t *u = json_object_get(v, "usage");
        k->cached = int_of(u, "cache_read_input_tokens");
        k->prompt = int_of(u, "input_tokens") + k->cached;
        k->completion = int_of(u, "output_tokens");
    } else if (!strcmp(type, "message_stop")) {
        k->saw_done = 1;
    } else if (!strcmp(type, "response.output_text.delta")) {
        got_text(k, json_object_get(v, "delta"));
    } else if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete")) {
        const json_t *r = json_object_get(v, "response"), *u = json_object_get(r, "usage");
        k->prompt = int_of(u, "input_tokens");
        k->cached = int_of(json_object_get(u, "input_tokens_details"), "cached_tokens");
        k->completion = int_of(u, "output_tokens");
        const char *id = json_string_value(json_object_get(r, "id"));
        snprintf(k->prev_id, sizeof k->prev_id, "%s", id ? id : "");
        k->saw_done = 1;
    } else if (!strcmp(type, "response.failed")) {
        k->saw_error = 1;
        snprintf(k->err_detail, sizeof k->err_detail, "response.failed");
    }
}

/* One event's data (a chunk of the answer, or [DONE]). */
static void on_data_json(client *k, const char *d, size_t n)
{
    if (n == 6 && !memcmp(d, "[DONE]", 6)) {
        k->saw_done = 1;
        return;
    }
    json_error_t je;
    json_t *v = json_loadb(d, n, JSON_ALLOW_NUL, &je);
    if (!json_is_object(v)) {
        k->bad = 1;
        json_decref(v);
        return;
    }
    const char *type = json_string_value(json_object_get(v, "type"));
    if (type && strcmp(type, "error")) { /* Messages' and Responses' typed events */
        on_typed_event(k, type, v);
        json_decref(v);
        return;
    }
    json_t *e = json_object_get(v, "error");
    if (e) {
        k->saw_error = 1;
        json_t *m = json_object_get(e, "message");
        snprintf(k->err_detail, sizeof k->err_detail, "%s",
                 json_is_string(m) ? json_string_value(m) : "error event");
    }
    json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
    json_t *c = json_object_get(json_object_get(ch, "delta"), "content");
    if (!c) c = json_object_get(ch, "text");
    if (json_is_string(c) && json_string_length(c)) {
        uint64_t now = dx_now_ns();
        if (!k->t_first) k->t_first = now;
        k->t_last = now;
        dx_buf_append(&k->text, json_string_value(c), json_string_length(c));
    }
    json_t *u = json_object_get(v, "usage");
    if (json_is_object(u)) {
        k->prompt = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
        k->completion = (long)json_integer_value(json_object_get(u, "completion_tokens"));
        k->cached = (long)json_integer_value(
            json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    }
    json_decref(v);
}

static int on_event(void *user, const char *ev, size_t n)
{
    client *k = user;
    const char *d;
    size_t dn;
    if (router_sse_data(ev, n, &k->scratch, &d, &dn) == 0) on_data_json(k, d, dn);
    return 0; /* comments and events without data: nothing */
}

static size_t on_data(char *p, size_t sz, size_t n, void *user)
{
    client *k = user;
    size_t len = sz * n,
           take = len < sizeof k->head - 1 - k->n_head ? len : sizeof k->head - 1 - k->n_head;
    memcpy(k->head + k->n_head, p, take);
    k->n_head += take;
    if (router_sse_feed(&k->sse, p, len, on_event, k) < 0) k->bad = 1; /* an event too big */
    return len;
}

/* ---- requests ---------------------------------------------------------------- */

static json_t *first_messages(const bench_conv *p)
{
    return json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "system", "content", p->system, "role",
                     "user", "content", p->document);
}

/* The turn's body in the API's shape: the whole conversation so far (the
 * Responses API: the new message, continuing the last response). */
static json_t *request_body(runner *R, client *k)
{
    const bench_run_config *c = R->c;
    int max = (int)k->plan.outputs[k->turn];
    const char *model = R->res->model;
    if (c->api == BENCH_API_MESSAGES) { /* system apart; the rest as is */
        json_t *m = json_array();
        for (size_t i = 1; m && i < json_array_size(k->msgs); i++)
            json_array_append(m, json_array_get(k->msgs, i));
        return json_pack("{s:s,s:s,s:o,s:i,s:f,s:b,s:b}", "model", model, "system", k->plan.system,
                         "messages", m, "max_tokens", max, "temperature", 0.0, "ignore_eos", 1,
                         "stream", 1);
    }
    if (c->api == BENCH_API_RESPONSES) {
        json_t *input =
            k->turn == 0 || !k->prev_id[0]
                ? json_incref(k->msgs)
                : json_pack("[O]", json_array_get(k->msgs, json_array_size(k->msgs) - 1));
        json_t *b =
            json_pack("{s:s,s:o,s:i,s:f,s:b,s:b}", "model", model, "input", input,
                      "max_output_tokens", max, "temperature", 0.0, "ignore_eos", 1, "stream", 1);
        if (b && k->turn > 0 && k->prev_id[0])
            json_object_set_new(b, "previous_response_id", json_string(k->prev_id));
        return b;
    }
    return json_pack("{s:s,s:O,s:i,s:f,s:b,s:b,s:{s:b}}", "model", model, "messages", k->msgs,
                     "max_tokens", max, "temperature", 0.0, "ignore_eos", 1, "stream", 1,
                     "stream_options", "include_usage", 1);
}

static int start_request(runner *R, client *k)
{
    const bench_run_config *c = R->c;
    if (k->turn > 0)
        json_array_append_new(
            k->msgs, json_pack("{s:s,s:s}", "role", "user", "content", k->plan.inputs[k->turn]));
    json_t *b = request_body(R, k);
    k->body = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    if (!k->body) return dx_errf(DX_ENOMEM, "out of memory");
    char url[600], hdr[300];
    snprintf(url, sizeof url, "%s%s", c->url,
             c->api == BENCH_API_MESSAGES    ? "/v1/messages"
             : c->api == BENCH_API_RESPONSES ? "/v1/responses"
                                             : "/v1/chat/completions");
    k->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (c->api_key) {
        snprintf(hdr, sizeof hdr, "Authorization: Bearer %s", c->api_key);
        k->hdrs = curl_slist_append(k->hdrs, hdr);
    }
    if (c->w->send_conversation_id) {
        snprintf(hdr, sizeof hdr, "X-Conversation-Id: %s", k->plan.id);
        k->hdrs = curl_slist_append(k->hdrs, hdr);
    }
    k->h = curl_easy_init();
    if (!k->h) return dx_errf(DX_ENOMEM, "curl_easy_init failed");
    curl_easy_setopt(k->h, CURLOPT_URL, url);
    curl_easy_setopt(k->h, CURLOPT_HTTPHEADER, k->hdrs);
    curl_easy_setopt(k->h, CURLOPT_POSTFIELDS, k->body);
    curl_easy_setopt(k->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(k->h, CURLOPT_WRITEDATA, k);
    curl_easy_setopt(k->h, CURLOPT_PRIVATE, k);
    curl_easy_setopt(k->h, CURLOPT_NOSIGNAL, 1L);
    double timeout_s = c->timeout_s > 0 ? c->timeout_s : BENCH_RUN_DEFAULT_TIMEOUT_S;
    curl_easy_setopt(k->h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1e3));
    router_sse_reset(&k->sse);
    k->n_head = 0;
    dx_buf_reset(&k->text);
    k->t0 = dx_now_ns();
    k->t_first = k->t_last = 0;
    k->prompt = k->cached = k->completion = 0;
    k->saw_done = k->saw_error = k->bad = 0;
    k->err_detail[0] = 0;
    if (k->measured && !R->t_measured) R->t_measured = k->t0;
    curl_multi_add_handle(R->m, k->h);
    R->in_flight++;
    return 0;
}

static void classify(client *k, CURLcode cc, long status, bench_record *r)
{
    r->status = (int)status;
    if (cc == CURLE_OPERATION_TIMEDOUT) {
        r->err = BENCH_ERR_TIMEOUT;
        snprintf(r->detail, sizeof r->detail, "%s", curl_easy_strerror(cc));
    } else if (cc != CURLE_OK) {
        r->err = BENCH_ERR_TRANSPORT;
        snprintf(r->detail, sizeof r->detail, "%s", curl_easy_strerror(cc));
    } else if (status != 200) {
        r->err = BENCH_ERR_HTTP;
        snprintf(r->detail, sizeof r->detail, "%ld %.*s", status, (int)k->n_head, k->head);
    } else if (k->saw_error) {
        r->err = BENCH_ERR_STREAM;
        snprintf(r->detail, sizeof r->detail, "%s", k->err_detail);
    } else if (k->bad || !k->saw_done || !k->t_first) {
        r->err = BENCH_ERR_MALFORMED;
        snprintf(r->detail, sizeof r->detail, "%s",
                 k->bad         ? "an event that is not JSON"
                 : !k->saw_done ? "no [DONE]"
                                : "no content");
    }
}

static void next_conversation(runner *R, client *k);

/* The request's handle, headers and body, given back. */
static void release_request(runner *R, client *k)
{
    curl_multi_remove_handle(R->m, k->h);
    curl_easy_cleanup(k->h);
    curl_slist_free_all(k->hdrs);
    free(k->body);
    k->h = NULL;
    k->hdrs = NULL;
    k->body = NULL;
    R->in_flight--;
}

static void finish_request(runner *R, client *k, CURLcode cc)
{
    uint64_t now = dx_now_ns();
    long status = 0;
    curl_easy_getinfo(k->h, CURLINFO_RESPONSE_CODE, &status);
    release_request(R, k);
    bench_record r = {.conversation = k->conv_ix, .turn = k->turn + 1};
    classify(k, cc, status, &r);
    r.t_start_s = R->t_measured ? (double)((int64_t)k->t0 - (int64_t)R->t_measured) * 1e-9 : 0;
    r.e2e_s = (double)(now - k->t0) * 1e-9;
    r.ttft_s = k->t_first ? (double)(k->t_first - k->t0) * 1e-9 : -1;
    r.tpot_s = k->t_first && k->completion > 1
                   ? (double)(k->t_last - k->t_first) * 1e-9 / (double)(k->completion - 1)
                   : 0;
    r.prompt_tokens = k->prompt;
    r.cached_tokens = k->cached;
    r.completion_tokens = k->completion;
    if (k->measured) {
        bench_results_add(R->res, &r);
        R->turns_done++;
        if (R->c->on_record)
            R->c->on_record(R->c->user, &r,
                            r.err          ? NULL
                            : k->text.data ? k->text.data
                                           : "",
                            k->text.len);
    }
    if (r.err || ++k->turn >= k->plan.n_turns) { /* the conversation ends */
        if (k->measured) R->convs_done++;
        next_conversation(R, k);
        return;
    }
    json_array_append_new(k->msgs, json_pack("{s:s,s:s%}", "role", "assistant", "content",
                                             k->text.data ? k->text.data : "", k->text.len));
    k->due_ns = now + (uint64_t)(R->c->w->think_s * 1e9);
}

/* Hands the client its next conversation: warm-up ones first. */
static void next_conversation(runner *R, client *k)
{
    const bench_workload *w = R->c->w;
    bench_conv_free(&k->plan);
    k->prev_id[0] = 0;
    json_decref(k->msgs);
    k->msgs = NULL;
    k->active = 0;
    uint32_t ix;
    if (R->next_warm < w->warmup) {
        ix = w->conversations + R->next_warm++; /* indices past the measured ones */
        k->measured = 0;
    } else if (R->next_conv < w->conversations) {
        for (uint32_t i = 0; i < w->clients; i++) /* the warm-up ends before measuring */
            if (R->cl[i].active && !R->cl[i].measured) return;
        ix = R->next_conv++;
        k->measured = 1;
    } else {
        return;
    }
    if (bench_conv_make(w, R->c->text, ix, &k->plan)) return;
    k->conv_ix = ix;
    k->msgs = first_messages(&k->plan);
    k->turn = 0;
    k->due_ns = dx_now_ns();
    k->active = 1;
}

/* ---- progress ------------------------------------------------------------------ */

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double running_p50(const bench_results *r)
{
    double *v = dx_malloc((r->n ? r->n : 1) * sizeof *v);
    size_t k = 0;
    for (size_t i = 0; v && i < r->n; i++)
        if (!r->rec[i].err && r->rec[i].ttft_s >= 0) v[k++] = r->rec[i].ttft_s;
    double p = 0;
    if (k) {
        qsort(v, k, sizeof *v, cmp_dbl);
        p = v[k / 2];
    }
    dx_free(v);
    return p;
}

static void progress(runner *R, int final)
{
    const bench_run_config *c = R->c;
    uint64_t now = dx_now_ns();
    uint64_t every = c->progress == BENCH_PROGRESS_BAR ? 200000000ull : 5000000000ull;
    if (c->progress == BENCH_PROGRESS_NONE || (!final && now - R->last_progress < every)) return;
    R->last_progress = now;
    FILE *f = c->progress_out ? c->progress_out : stderr;
    const bench_workload *w = c->w;
    uint32_t total = w->conversations * w->turns;
    if (c->progress == BENCH_PROGRESS_BAR) {
        int width = 24, fill = total ? (int)((double)R->turns_done / total * width) : width;
        fprintf(f, "\r[%.*s%*s] conversations %u/%u  turns %u/%u  in flight %d  ttft p50 %.0f ms ",
                fill, "########################", width - fill, "", R->convs_done, w->conversations,
                R->turns_done, total, R->in_flight, running_p50(R->res) * 1e3);
        if (final) fputc('\n', f);
    } else {
        fprintf(f, "bench: conversations %u/%u, turns %u/%u, in flight %d, ttft p50 %.0f ms\n",
                R->convs_done, w->conversations, R->turns_done, total, R->in_flight,
                running_p50(R->res) * 1e3);
    }
    fflush(f);
}

/* ---- the run -------------------------------------------------------------------- */

static size_t on_body(char *p, size_t sz, size_t n, void *user)
{
    return dx_buf_append(user, p, sz * n) == 0 ? sz * n : 0;
}

static int first_model(const bench_run_config *c, char *out, size_t cap)
{
    char url[600];
    snprintf(url, sizeof url, "%s/v1/models", c->url);
    dx_buf b;
    dx_buf_init(&b, 0);
    CURL *h = curl_easy_init();
    struct curl_slist *hdrs = NULL;
    char auth[300];
    if (c->api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->api_key);
        hdrs = curl_slist_append(NULL, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    json_error_t je;
    json_t *v = rc == CURLE_OK && b.len ? json_loadb(b.data, b.len, 0, &je) : NULL;
    json_t *id = json_object_get(json_array_get(json_object_get(v, "data"), 0), "id");
    int ok = json_is_string(id);
    if (ok) snprintf(out, cap, "%s", json_string_value(id));
    /* an error answer's own message (a 401 says the key is missing or wrong) */
    const char *why = json_string_value(json_object_get(json_object_get(v, "error"), "message"));
    if (!ok && rc == CURLE_OK && status != 200)
        dx_errf(DX_EIO, "%s answered %ld: %s%s", url, status, why ? why : "(no message)",
                status == 401 && !c->api_key ? " (give --api-key)" : "");
    else if (!ok)
        dx_errf(DX_EIO, "%s: %s", url, rc != CURLE_OK ? curl_easy_strerror(rc) : "no model listed");
    json_decref(v);
    dx_buf_free(&b);
    return ok ? 0 : DX_EIO;
}

static uint64_t next_due(const runner *R)
{
    uint64_t best = UINT64_MAX;
    for (uint32_t i = 0; i < R->c->w->clients; i++) {
        const client *k = &R->cl[i];
        if (k->active && !k->h && k->due_ns < best) best = k->due_ns;
    }
    return best;
}

static void drop_in_flight(runner *R)
{
    for (uint32_t i = 0; i < R->c->w->clients; i++) {
        client *k = &R->cl[i];
        if (k->h) release_request(R, k);
    }
}

static int loop(runner *R)
{
    const bench_workload *w = R->c->w;
    for (;;) {
        if (R->c->stop && *R->c->stop) {
            drop_in_flight(R);
            return dx_errf(DX_ECANCELED, "interrupted");
        }
        uint64_t now = dx_now_ns();
        int any = 0;
        for (uint32_t i = 0; i < w->clients; i++) {
            client *k = &R->cl[i];
            if (!k->active && !k->h) next_conversation(R, k);
            if (k->active && !k->h && k->due_ns <= now && start_request(R, k) < 0) k->active = 0;
            any |= k->active || k->h;
        }
        if (!any) return 0;
        int running;
        curl_multi_perform(R->m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(R->m, &left)))
            if (msg->msg == CURLMSG_DONE) {
                client *k;
                curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&k);
                finish_request(R, k, msg->data.result);
            }
        progress(R, 0);
        uint64_t due = next_due(R);
        now = dx_now_ns();
        int ms = due == UINT64_MAX ? 100 : due <= now ? 0 : (int)((due - now) / 1000000 + 1);
        if (ms > 100) ms = 100;
        if (R->in_flight)
            curl_multi_poll(R->m, NULL, 0, ms, NULL);
        else if (ms)
            usleep((useconds_t)ms * 1000);
    }
}

int bench_run(const bench_run_config *c, bench_results *out)
{
    memset(out, 0, sizeof *out);
    int rc = bench_workload_check(c->w);
    if (rc) return rc;
    if (strncmp(c->url, "http://", 7) && strncmp(c->url, "https://", 8))
        return dx_errf(DX_EINVAL, "--url '%s': want http://HOST:PORT", c->url);
    if (c->model)
        snprintf(out->model, sizeof out->model, "%s", c->model);
    else if ((rc = first_model(c, out->model, sizeof out->model)))
        return rc;
    runner R = {.c = c, .res = out};
    R.m = curl_multi_init();
    R.cl = dx_calloc(c->w->clients, sizeof *R.cl);
    if (!R.m || !R.cl) {
        curl_multi_cleanup(R.m);
        dx_free(R.cl);
        return dx_errf(DX_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < c->w->clients; i++) {
        router_sse_init(&R.cl[i].sse, 64u << 20);
        dx_buf_init(&R.cl[i].scratch, 0);
        dx_buf_init(&R.cl[i].text, 0);
    }
    rc = loop(&R);
    out->wall_s = R.t_measured ? (double)(dx_now_ns() - R.t_measured) * 1e-9 : 0;
    progress(&R, 1);
    for (uint32_t i = 0; i < c->w->clients; i++) {
        router_sse_free(&R.cl[i].sse);
        dx_buf_free(&R.cl[i].scratch);
        dx_buf_free(&R.cl[i].text);
        bench_conv_free(&R.cl[i].plan);
        json_decref(R.cl[i].msgs);
    }
    dx_free(R.cl);
    curl_multi_cleanup(R.m);
    return rc;
}
