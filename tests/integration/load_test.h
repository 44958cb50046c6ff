/* load_test: many multi-turn conversations at once against a cluster, each
 * greedy reply checked against a single-node oracle (the same conversation
 * on one `duplex serve`, temperature 0, must give byte-identical text).
 * A conversation speaks one of the three front doors, as its clients do:
 * Chat Completions and Anthropic Messages resend the whole history each
 * turn; Responses sends only the new user message, chained to the last
 * answer with previous_response_id.  One curl multi handle drives every
 * conversation; a slot alternates cluster request -> oracle request ->
 * compare -> next user turn.  Outcomes are counted, never asserted on
 * time; the time to the first answer byte of each admitted request is
 * kept so a test can print its p99.  Shared by itest_soak (the soak),
 * itest_faults (overload) and itest_fault_http (lt_answer).  Include
 * after pd_test.h. */
#ifndef LOAD_TEST_H
#define LOAD_TEST_H

#include <stdint.h>

#include "../anth_sse_test.h"
#include "../fuzz/rsp_sse_check.h"
#include "base/dx_clock.h"

enum { LT_IDLE, LT_CLUSTER, LT_ORACLE };

/* The front doors (lt_slot.door). */
enum { LT_CHAT, LT_MESSAGES, LT_RESPONSES };

typedef struct {
    conv c; /* the conversation as a chat (msgs[0] the system prompt) */
    int phase, stream, max_tokens, turn;
    int door;              /* LT_CHAT, LT_MESSAGES or LT_RESPONSES */
    int port, oracle_port; /* this conversation's cluster (router) and oracle */
    long n_ok;             /* its turns checked right */
    char *rid, *orid;      /* Responses: the last answer's id at the cluster, at the oracle */
    char *new_rid;         /* the cluster's answer to the turn in flight */
    unsigned seed, n_resets;
    CURL *h;
    struct curl_slist *sl;
    dx_buf out;
    char *body, *obody;               /* the cluster's request, the oracle's (never streamed) */
    json_t *ans;                      /* the cluster's answer, waiting for the oracle's */
    uint64_t t0, t_first, not_before; /* not_before: a 503's Retry-After */
    char retry_after;                 /* the 503 carried Retry-After */
} lt_slot;

typedef struct {
    int n;
    lt_slot *s;
    CURLM *m;
    int reset_tokens; /* start a fresh conversation past this prompt size */
    /* outcomes */
    long ok, wrong, rejected_503, no_retry_after, errors, turns_reset;
    long capacity_500; /* 500s saying the pool or scheduler was full (see itest_faults) */
    char first_error[512];
    double *ttft; /* seconds, admitted requests */
    size_t n_ttft, cap_ttft;
} lt_load;

static inline size_t lt_on_data(char *p, size_t sz, size_t n, void *user)
{
    lt_slot *s = user;
    if (!s->t_first) s->t_first = dx_now_ns();
    return dx_buf_append(&s->out, p, sz * n) == 0 ? sz * n : 0;
}

static inline size_t lt_on_header(char *p, size_t sz, size_t n, void *user)
{
    lt_slot *s = user;
    if (sz * n >= 12 && !strncasecmp(p, "Retry-After:", 12)) s->retry_after = 1;
    return sz * n;
}

static inline void lt_error(lt_load *L, const char *fmt, const char *detail, int slot, int turn)
{
    L->errors++;
    if (!L->first_error[0])
        snprintf(L->first_error, sizeof L->first_error, "conversation %d turn %d: %s %.300s", slot,
                 turn, fmt, detail ? detail : "");
}

static inline const char *lt_path(int door)
{
    return door == LT_MESSAGES    ? "/v1/messages"
           : door == LT_RESPONSES ? "/v1/responses"
                                  : "/v1/chat/completions";
}

static inline void lt_send(lt_load *L, lt_slot *s, int port, const char *body)
{
    dx_buf_reset(&s->out);
    s->retry_after = 0;
    s->t_first = 0;
    s->t0 = dx_now_ns();
    s->h = tc_curl(port, "POST", lt_path(s->door), body, &s->out, &s->sl, 600);
    curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, lt_on_data);
    curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(s->h, CURLOPT_HEADERFUNCTION, lt_on_header);
    curl_easy_setopt(s->h, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(s->h, CURLOPT_PRIVATE, s);
    curl_multi_add_handle(L->m, s->h);
}

/* Slot s's next request as its door's clients send it (malloc'd): the
 * whole history for Chat Completions and Messages (its system prompt apart,
 * as `system`); for Responses the instructions (a stored response keeps
 * none, as OpenAI's does not) and the new user message after `prev`. */
static inline char *lt_body(const lt_slot *s, int stream, const char *prev)
{
    json_t *m = s->c.msgs, *b;
    json_t *sys = json_object_get(json_array_get(m, 0), "content");
    if (s->door == LT_MESSAGES) {
        json_t *turns = json_array();
        for (size_t i = 1; i < json_array_size(m); i++)
            json_array_append(turns, json_array_get(m, i));
        b = json_pack("{s:s, s:O, s:o, s:i, s:f}", "model", G.model_name, "system", sys, "messages",
                      turns, "max_tokens", s->max_tokens, "temperature", G.temperature);
    } else if (s->door == LT_RESPONSES) {
        json_t *user = json_object_get(json_array_get(m, json_array_size(m) - 1), "content");
        b = json_pack("{s:s, s:O, s:O, s:i, s:f}", "model", G.model_name, "instructions", sys,
                      "input", user, "max_output_tokens", s->max_tokens, "temperature",
                      G.temperature);
        if (prev) json_object_set_new(b, "previous_response_id", json_string(prev));
    } else {
        b = chat_body(m, s->max_tokens);
    }
    assert_non_null(b);
    if (stream) json_object_set_new(b, "stream", json_true());
    char *r = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return r;
}

/* The next turn of slot s goes to the cluster.  The oracle gets the same
 * request through the same door (never streamed; a Responses chain its
 * own ids): so it runs the same translation of the same conversation,
 * and only what the cluster adds — the router's store of responses, the
 * P/D split, KV moved between nodes — can make the text differ.  (The
 * equivalent chat would also compare the doors' translations, which
 * itest_agents checks; a difference there is no cluster bug.) */
static inline void lt_start_turn(lt_load *L, lt_slot *s)
{
    free(s->body);
    free(s->obody);
    s->body = lt_body(s, s->stream, s->rid);
    s->obody = lt_body(s, 0, s->orid);
    s->phase = LT_CLUSTER;
    lt_send(L, s, s->port, s->body);
}

/* The text of an answer (streamed or not) as a JSON string, or NULL with
 * *why set: not JSON, an error event, a stream without [DONE]. */
static inline json_t *lt_answer(const dx_buf *b, int stream, const char **why)
{
    json_error_t je;
    if (!stream) {
        json_t *v = json_loadb(b->data ? b->data : "", b->len, JSON_ALLOW_NUL, &je);
        json_t *c = json_object_get(
            json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message"),
            "content");
        json_t *r = json_is_string(c) ? json_incref(c) : NULL;
        json_decref(v);
        *why = r ? NULL : "no answer in the body";
        return r;
    }
    dx_buf text;
    dx_buf_init(&text, 0);
    const char *p = b->data ? b->data : "";
    int done = 0;
    *why = NULL;
    while (*p && !*why) {
        const char *end = strstr(p, "\n\n");
        if (strncmp(p, "data: ", 6) || !end || done) {
            *why = "bad SSE framing";
            break;
        }
        p += 6;
        if (end - p == 6 && !memcmp(p, "[DONE]", 6)) {
            done = 1;
        } else {
            json_t *v = json_loadb(p, (size_t)(end - p), JSON_ALLOW_NUL, &je);
            json_t *t = json_object_get(
                json_object_get(json_array_get(json_object_get(v, "choices"), 0), "delta"),
                "content");
            if (!v || json_object_get(v, "error")) *why = "an error event";
            if (json_is_string(t))
                dx_buf_append(&text, json_string_value(t), json_string_length(t));
            json_decref(v);
        }
        p = end + 2;
    }
    if (!*why && !done) *why = "the stream ended without [DONE]";
    json_t *r = *why ? NULL : json_stringn_nocheck(text.data ? text.data : "", text.len);
    dx_buf_free(&text);
    return r;
}

static inline void lt_cat(dx_buf *b, const json_t *t)
{
    dx_buf_append(b, json_string_value(t), json_string_length(t)); /* NUL kept: by length */
}

/* A whole answer's text at its door as a JSON string, NULL when v is no
 * answer: Chat Completions' message content; Messages' text blocks;
 * Responses' output_text parts of its message items, of a completed or
 * an incomplete (max_output_tokens) response, its id in *id (malloc'd). */
static inline json_t *lt_text_of(int door, const json_t *v, char **id)
{
    if (door == LT_CHAT) {
        json_t *c = json_object_get(
            json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message"),
            "content");
        return json_is_string(c) ? json_incref(c) : NULL;
    }
    dx_buf b;
    dx_buf_init(&b, 0);
    size_t i, k;
    json_t *it, *part;
    int ok;
    if (door == LT_MESSAGES) {
        ok = rsp_chk_is(v, "type", "message") && json_is_array(json_object_get(v, "content"));
        json_array_foreach(json_object_get(v, "content"), i, it) if (rsp_chk_is(it, "type", "text"))
            lt_cat(&b, json_object_get(it, "text"));
    } else {
        const char *st = rsp_chk_s(v, "status");
        ok = rsp_chk_is(v, "object", "response") && json_is_string(json_object_get(v, "id")) &&
             (!strcmp(st, "completed") || !strcmp(st, "incomplete"));
        json_array_foreach(json_object_get(v, "output"), i,
                           it) if (rsp_chk_is(it, "type", "message"))
            json_array_foreach(json_object_get(it, "content"), k,
                               part) if (rsp_chk_is(part, "type", "output_text"))
                lt_cat(&b, json_object_get(part, "text"));
        if (ok) *id = strdup(rsp_chk_s(v, "id"));
    }
    json_t *r = ok ? json_stringn_nocheck(b.data ? b.data : "", b.len) : NULL;
    dx_buf_free(&b);
    return r;
}

/* The prompt's tokens in the usage of a whole answer at its door (the
 * oracle's: no prefix cache, but Messages counts cached tokens apart). */
static inline long lt_prompt_of(int door, const json_t *v)
{
    json_t *u = json_object_get(v, "usage");
    if (door == LT_CHAT) return (long)json_integer_value(json_object_get(u, "prompt_tokens"));
    long n = (long)json_integer_value(json_object_get(u, "input_tokens"));
    if (door == LT_MESSAGES)
        n += (long)json_integer_value(json_object_get(u, "cache_read_input_tokens")) +
             (long)json_integer_value(json_object_get(u, "cache_creation_input_tokens"));
    return n;
}

/* The cluster's answer to slot s's turn as lt_text_of reads it (a
 * Responses id in s->new_rid), streamed or not; NULL with why[256] saying
 * what was wrong: not JSON, no answer, or a stream its door's SDK would
 * not read (lt_answer, anth_sse_test.h, rsp_sse_check.h check the form). */
static inline json_t *lt_door_answer(lt_slot *s, char *why)
{
    const dx_buf *b = &s->out;
    const char *data = b->data ? b->data : "";
    json_t *v = NULL;
    why[0] = 0;
    if (s->door == LT_CHAT) {
        const char *w = NULL;
        json_t *r = lt_answer(b, s->stream, &w);
        if (!r) snprintf(why, 256, "%s", w);
        return r;
    }
    if (!s->stream) {
        json_error_t je;
        v = json_loadb(data, b->len, JSON_ALLOW_NUL, &je);
    } else if (s->door == LT_MESSAGES) {
        anth_sse_read(data, b->len, &v, why); /* why[] of 160 bytes */
    } else {
        rsp_chk c;
        if (rsp_chk_run(&c, data, b->len, 1))
            snprintf(why, 256, "%s", c.why);
        else
            v = json_incref(c.final);
        rsp_chk_free(&c);
    }
    free(s->new_rid);
    s->new_rid = NULL;
    json_t *r = v ? lt_text_of(s->door, v, &s->new_rid) : NULL;
    if (!r && !why[0]) snprintf(why, 256, "no answer in the body");
    json_decref(v);
    return r;
}

static inline void lt_keep_ttft(lt_load *L, const lt_slot *s)
{
    if (L->n_ttft == L->cap_ttft) {
        L->cap_ttft = L->cap_ttft ? 2 * L->cap_ttft : 1024;
        L->ttft = realloc(L->ttft, L->cap_ttft * sizeof *L->ttft);
        assert_non_null(L->ttft);
    }
    uint64_t t = s->t_first ? s->t_first : dx_now_ns();
    L->ttft[L->n_ttft++] = (double)(t - s->t0) / 1e9;
}

/* Slot s starts a fresh conversation (a new Responses chain). */
static inline void lt_restart(lt_load *L, lt_slot *s)
{
    conv_free(&s->c);
    conv_init(&s->c, s->seed + 7919u * ++s->n_resets, 40 + (int)(s->seed % 60));
    s->turn = 0;
    free(s->rid);
    free(s->orid);
    s->rid = s->orid = NULL;
    L->turns_reset++;
}

/* The answer is the oracle's: append it and the next user message, or
 * start a new conversation once the history is long or `afresh`. */
static inline void lt_next_turn(lt_load *L, lt_slot *s, int afresh)
{
    conv_add_answer(&s->c, s->ans);
    json_decref(s->ans);
    s->ans = NULL;
    s->turn++;
    if (afresh || s->c.prompt > L->reset_tokens)
        lt_restart(L, s);
    else
        user_turn(&s->c, NULL, s->seed * 31u + (unsigned)s->turn * 17u + s->n_resets,
                  8 + s->turn % 20);
    s->phase = LT_IDLE;
}

/* A finished transfer of slot s. */
static inline void lt_done(lt_load *L, lt_slot *s, CURLcode cc)
{
    long st = 0;
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &st);
    curl_multi_remove_handle(L->m, s->h);
    curl_easy_cleanup(s->h);
    curl_slist_free_all(s->sl);
    s->h = NULL;
    tc_terminate(&s->out);
    int slot = (int)(s - L->s);
    char why[256];
    if (s->phase == LT_CLUSTER) {
        if (cc != CURLE_OK) {
            lt_error(L, "transport:", curl_easy_strerror(cc), slot, s->turn);
        } else if (st == 503) {
            L->rejected_503++;
            if (!s->retry_after) L->no_retry_after++;
            s->not_before = dx_now_ns() + 1000000000ull; /* Retry-After: 1 */
        } else if (st == 500 && s->out.data &&
                   (strstr(s->out.data, "KV pool exhausted") ||
                    strstr(s->out.data, "at capacity"))) {
            L->capacity_500++;
            s->not_before = dx_now_ns() + 1000000000ull;
        } else if (st != 200) {
            char what[32];
            snprintf(what, sizeof what, "status %ld:", st);
            lt_error(L, what, s->out.data, slot, s->turn);
        } else if (!(s->ans = lt_door_answer(s, why))) {
            lt_error(L, why, s->out.data, slot, s->turn);
        } else {
            lt_keep_ttft(L, s);
            s->phase = LT_ORACLE;
            lt_send(L, s, s->oracle_port, s->obody);
            return;
        }
        s->phase = LT_IDLE; /* retried as the same turn */
        return;
    }
    /* the oracle, never streamed */
    json_t *v = NULL;
    if (cc == CURLE_OK && st == 200) {
        json_error_t je;
        v = json_loadb(s->out.data, s->out.len, JSON_ALLOW_NUL, &je);
    }
    char *oid = NULL;
    json_t *want = v ? lt_text_of(s->door, v, &oid) : NULL;
    s->c.prompt = v ? lt_prompt_of(s->door, v) : 0;
    json_decref(v);
    if (!want) {
        lt_error(L, "the oracle failed:", s->out.data, slot, s->turn);
        free(oid);
        json_decref(s->ans);
        s->ans = NULL;
        s->phase = LT_IDLE;
        return;
    }
    int same = json_equal(want, s->ans);
    if (same) {
        L->ok++;
        s->n_ok++;
    } else {
        if (L->wrong++ < 3) { /* the first few whole, escaped: NULs and all */
            char *a = json_dumps(s->ans, JSON_ENCODE_ANY), *o = json_dumps(want, JSON_ENCODE_ANY);
            printf("conversation %d (%s) turn %d differs:\n  cluster: %s\n  oracle:  %s\n", slot,
                   lt_path(s->door), s->turn, a, o);
            free(a);
            free(o);
        }
        if (!L->first_error[0])
            snprintf(L->first_error, sizeof L->first_error,
                     "conversation %d turn %d differs:\n  cluster: %.200s\n  oracle:  %.200s", slot,
                     s->turn, json_string_value(s->ans), json_string_value(want));
    }
    json_decref(s->ans);
    s->ans = want; /* the conversation goes on with the oracle's text */
    free(s->rid);
    free(s->orid);
    s->rid = s->new_rid; /* each Responses chain goes on from its own answer */
    s->orid = oid;
    s->new_rid = NULL;
    /* ... so a wrong one would make every later turn differ: start afresh */
    lt_next_turn(L, s, !same && s->door == LT_RESPONSES);
}

/* n Chat Completions conversations against the router at port, checked
 * against the node at oracle_port (lt_aim changes a slot's); every other
 * one streams. */
static inline void lt_init(lt_load *L, int n, int port, int oracle_port, unsigned seed)
{
    memset(L, 0, sizeof *L);
    L->n = n;
    L->reset_tokens = 1200;
    L->s = calloc((size_t)n, sizeof *L->s);
    assert_non_null(L->s);
    L->m = curl_multi_init();
    for (int i = 0; i < n; i++) {
        lt_slot *s = &L->s[i];
        s->seed = seed + 101u * (unsigned)i;
        s->stream = i & 1;
        s->max_tokens = 8 + (int)(s->seed % 40);
        conv_init(&s->c, s->seed, 30 + (int)(s->seed % 90));
        dx_buf_init(&s->out, 0);
        s->port = port;
        s->oracle_port = oracle_port;
    }
}

/* Slot i speaks door to the router at port, checked against the node at
 * oracle_port; before lt_run. */
static inline void lt_aim(lt_load *L, int i, int door, int port, int oracle_port)
{
    L->s[i].door = door;
    L->s[i].port = port;
    L->s[i].oracle_port = oracle_port;
}

/* Runs until `until_ns` (new turns start only before it), then until every
 * request has ended; each_s > 0 calls tick(arg) about that often. */
static inline void lt_run(lt_load *L, uint64_t until_ns, void (*tick)(void *), void *arg,
                          double each_s)
{
    uint64_t next_tick = dx_now_ns() + (uint64_t)(each_s * 1e9);
    for (;;) {
        int busy = 0, running;
        for (int i = 0; i < L->n; i++) {
            if (L->s[i].phase == LT_IDLE && dx_now_ns() < until_ns &&
                dx_now_ns() >= L->s[i].not_before)
                lt_start_turn(L, &L->s[i]);
            busy += L->s[i].phase != LT_IDLE;
        }
        if (!busy && dx_now_ns() >= until_ns) break;
        curl_multi_perform(L->m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(L->m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            lt_slot *s;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
            lt_done(L, s, msg->data.result);
        }
        curl_multi_poll(L->m, NULL, 0, 100, NULL);
        if (tick && each_s > 0 && dx_now_ns() >= next_tick) {
            tick(arg);
            next_tick = dx_now_ns() + (uint64_t)(each_s * 1e9);
        }
    }
}

static inline int lt_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile of the admitted requests' time to first byte (s). */
static inline double lt_ttft_q(lt_load *L, double q)
{
    if (!L->n_ttft) return 0;
    qsort(L->ttft, L->n_ttft, sizeof *L->ttft, lt_cmp_d);
    size_t i = (size_t)(q * (double)(L->n_ttft - 1) + 0.5);
    return L->ttft[i];
}

static inline void lt_free(lt_load *L)
{
    for (int i = 0; i < L->n; i++) {
        conv_free(&L->s[i].c);
        dx_buf_free(&L->s[i].out);
        free(L->s[i].body);
        free(L->s[i].obody);
        free(L->s[i].rid);
        free(L->s[i].orid);
        free(L->s[i].new_rid);
        json_decref(L->s[i].ans);
    }
    curl_multi_cleanup(L->m);
    free(L->s);
    free(L->ttft);
}

#endif
