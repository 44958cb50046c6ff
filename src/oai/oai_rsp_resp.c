/* oai_rsp_resp: Responses API response objects and their event stream (see
 * oai_rsp.h).
 *
 * Written by hand into a dx_buf, as oai_resp.c writes chat answers: a stream
 * sends an event per token batch.  Every string goes through oai_json_str
 * (invalid UTF-8 becomes U+FFFD), so the output is always valid JSON; a
 * stream holds back the first bytes of a character its text ends inside,
 * so the deltas of an item, decoded and concatenated, are exactly the text
 * its done event and the final response object carry. */
#include "oai/oai_rsp.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"
#include "oai/oai_resp.h"

enum { IT_REASONING, IT_MESSAGE, IT_CALL };

/* One output item as the writers see it (pointers valid while it is written). */
typedef struct {
    int kind;
    const char *text; /* the reasoning or message text; a call's arguments */
    size_t len;
    const char *name, *call_id; /* a call's */
    size_t name_len, call_id_len;
    const char *status;
} rsp_item;

/* What a response object repeats of a request that set nothing. */
static const char k_default_echo[] =
    "\"instructions\":null,\"max_output_tokens\":null,\"metadata\":{},"
    "\"parallel_tool_calls\":true,\"previous_response_id\":null,"
    "\"reasoning\":{\"effort\":null,\"summary\":null},\"store\":true,\"temperature\":1.0,"
    "\"text\":{\"format\":{\"type\":\"text\"}},\"tool_choice\":\"auto\",\"tools\":[],"
    "\"top_p\":1.0,\"truncation\":\"disabled\"";

void oai_rsp_make_id(char *out, size_t cap)
{
    char id[64];
    oai_make_id(id, sizeof id, "resp"); /* "resp-<32 hex>": OpenAI's ids use '_' */
    id[4] = '_';
    snprintf(out, cap, "%s", id);
}

/* An item's id: its kind's prefix, the response id's random part and its
 * output index ("msg_<hex>_1"), so a response's items are named the same
 * in every event, in the final object and in what the store keeps. */
static int put_item_id(dx_buf *b, const char *resp_id, int kind, size_t index)
{
    static const char *const prefix[] = {"rs", "msg", "fc"};
    char id[OAI_RSP_MAX_ID + 32];
    const char *tail = strchr(resp_id, '_');
    snprintf(id, sizeof id, "%s_%s_%zu", prefix[kind], tail ? tail + 1 : resp_id, index);
    return oai_json_str(b, id, strlen(id));
}

static int put_part(dx_buf *b, int kind, const char *text, size_t len)
{
    int rc = dx_buf_puts(b, kind == IT_MESSAGE ? "{\"type\":\"output_text\",\"text\":"
                                               : "{\"type\":\"reasoning_text\",\"text\":");
    if (!rc) rc = oai_json_str(b, text, len);
    return rc ? rc
              : dx_buf_puts(b, kind == IT_MESSAGE ? ",\"annotations\":[],\"logprobs\":[]}" : "}");
}

/* An output item: whole, or as output_item.added shows it (no content yet,
 * arguments ""). */
static int put_item(dx_buf *b, const char *resp_id, size_t index, const rsp_item *it, int whole)
{
    static const char *const head[] = {
        ",\"type\":\"reasoning\",\"status\":\"%s\",\"summary\":[],"
        "\"content\":[",
        ",\"type\":\"message\",\"status\":\"%s\",\"role\":"
        "\"assistant\",\"content\":[",
        ",\"type\":\"function_call\",\"status\":\"%s\",\"call_id\":"};
    int rc = dx_buf_puts(b, "{\"id\":");
    if (!rc) rc = put_item_id(b, resp_id, it->kind, index);
    if (!rc) rc = dx_buf_printf(b, head[it->kind], whole ? it->status : "in_progress");
    if (it->kind != IT_CALL) {
        if (!rc && whole) rc = put_part(b, it->kind, it->text, it->len);
        return rc ? rc : dx_buf_puts(b, "]}");
    }
    if (!rc) rc = oai_json_str(b, it->call_id, it->call_id_len);
    if (!rc) rc = dx_buf_puts(b, ",\"name\":");
    if (!rc) rc = oai_json_str(b, it->name, it->name_len);
    if (!rc) rc = dx_buf_puts(b, ",\"arguments\":");
    if (!rc) rc = oai_json_str(b, it->text, whole ? it->len : 0);
    return rc ? rc : dx_buf_putc(b, '}');
}

/* The response object up to its output items: `status` is completed,
 * incomplete (cut at max_output_tokens), in_progress or failed (with
 * error_code and error_msg). */
static int put_response_head(dx_buf *b, const oai_rsp_meta *m, const char *status,
                             const char *error_code, const char *error_msg)
{
    int rc = dx_buf_puts(b, "{\"id\":");
    if (!rc) rc = oai_json_str(b, m->id, strlen(m->id));
    if (!rc)
        rc = dx_buf_printf(b,
                           ",\"object\":\"response\",\"created_at\":%lld,\"status\":\"%s\","
                           "\"background\":false,\"error\":",
                           (long long)m->created_at, status);
    if (!rc && error_code) {
        rc = dx_buf_printf(b, "{\"code\":\"%s\",\"message\":", error_code);
        if (!rc) rc = oai_json_str(b, error_msg, strlen(error_msg));
        if (!rc) rc = dx_buf_putc(b, '}');
    } else if (!rc) {
        rc = dx_buf_puts(b, "null");
    }
    if (!rc)
        rc = dx_buf_puts(b, strcmp(status, "incomplete")
                                ? ",\"incomplete_details\":null,\"model\":"
                                : ",\"incomplete_details\":{\"reason\":\"max_output_tokens\"},"
                                  "\"model\":");
    if (!rc) rc = oai_json_str(b, m->model, strlen(m->model));
    return rc ? rc : dx_buf_puts(b, ",\"output\":[");
}

static int put_response_tail(dx_buf *b, const oai_rsp_meta *m, const oai_rsp_usage *u)
{
    int rc = dx_buf_printf(b, "],%s,\"usage\":", m->echo ? m->echo : k_default_echo);
    if (!rc && !u) rc = dx_buf_puts(b, "null");
    if (!rc && u)
        rc = dx_buf_printf(
            b,
            "{\"input_tokens\":%u,\"input_tokens_details\":{\"cached_tokens\":%u},"
            "\"output_tokens\":%u,\"output_tokens_details\":{\"reasoning_tokens\":%u},"
            "\"total_tokens\":%u}",
            u->input, u->cached, u->output, u->reasoning, u->input + u->output);
    return rc ? rc : dx_buf_putc(b, '}');
}

static int is_length(const char *finish)
{
    return finish && !strcmp(finish, "length");
}

int oai_rsp_response_json(dx_buf *b, const oai_rsp_meta *m, const oai_tools_result *r,
                          const char *finish, const oai_rsp_usage *u)
{
    int inc = is_length(finish);
    /* a message when there is content, or nothing else (an empty answer is
     * an empty message, as chat answers it with content "") */
    int msg = r->content || !(r->reasoning || r->n_calls);
    size_t k = 0;
    int rc = put_response_head(b, m, inc ? "incomplete" : "completed", NULL, NULL);
    if (!rc && r->reasoning) {
        /* cut inside the reasoning: nothing came after it */
        rsp_item it = {.kind = IT_REASONING, .text = r->reasoning, .len = r->reasoning_len};
        it.status = "completed";
        if (inc && !msg && !r->n_calls) it.status = "incomplete";
        rc = put_item(b, m->id, k++, &it, 1);
    }
    if (!rc && msg) {
        rsp_item it = {.kind = IT_MESSAGE,
                       .text = r->content ? r->content : "",
                       .len = r->content_len,
                       .status = inc ? "incomplete" : "completed"};
        if (k) rc = dx_buf_putc(b, ',');
        if (!rc) rc = put_item(b, m->id, k++, &it, 1);
    }
    for (size_t i = 0; !rc && i < r->n_calls; i++) {
        const oai_tool_call *c = &r->calls[i];
        rsp_item it = {.kind = IT_CALL,
                       .text = c->arguments,
                       .len = c->arguments_len,
                       .name = c->name,
                       .name_len = strlen(c->name),
                       .call_id = c->id,
                       .call_id_len = strlen(c->id),
                       .status = "completed"};
        if (k) rc = dx_buf_putc(b, ',');
        if (!rc) rc = put_item(b, m->id, k++, &it, 1);
    }
    return rc ? rc : put_response_tail(b, m, u);
}

int oai_rsp_deleted_json(dx_buf *b, const char *id)
{
    int rc = dx_buf_puts(b, "{\"id\":");
    if (!rc) rc = oai_json_str(b, id, strlen(id));
    return rc ? rc : dx_buf_puts(b, ",\"object\":\"response\",\"deleted\":true}");
}

/* ---- the stream ------------------------------------------------------------- */

typedef struct {
    int kind;
    size_t off, len;                           /* its text (a call's arguments) in s->txt */
    size_t sent;                               /* bytes of it sent as deltas */
    size_t name_off, name_len, id_off, id_len; /* a call's, in s->strs */
    uint32_t call;                             /* a call's oai_tools index */
    int incomplete;
} st_item;

enum { ST_NEW, ST_LIVE, ST_DONE };

struct oai_rsp_stream {
    oai_rsp_meta m; /* its strings in `own` */
    char *own;
    int state, open, err; /* open: the last item takes more events; err sticks */
    unsigned long long seq;
    dx_buf txt, strs; /* the items' texts and arguments; call names and ids */
    dx_buf resp;      /* the last response object written */
    st_item *items;
    size_t n_items, cap_items;
};

oai_rsp_stream *oai_rsp_stream_create(const oai_rsp_meta *m)
{
    const char *echo = m->echo ? m->echo : k_default_echo;
    size_t ni = strlen(m->id) + 1, nm = strlen(m->model) + 1, ne = strlen(echo) + 1;
    DX_ASSERT(ni <= OAI_RSP_MAX_ID + 1); /* ids are the caller's own (oai_rsp_make_id) */
    oai_rsp_stream *s = dx_calloc(1, sizeof *s);
    char *own = s ? dx_malloc(ni + nm + ne) : NULL;
    if (!own) {
        dx_free(s);
        return NULL;
    }
    memcpy(own, m->id, ni);
    memcpy(own + ni, m->model, nm);
    memcpy(own + ni + nm, echo, ne);
    s->own = own;
    s->m = (oai_rsp_meta){own, own + ni, m->created_at, own + ni + nm};
    dx_buf_init(&s->txt, 0);
    dx_buf_init(&s->strs, 0);
    dx_buf_init(&s->resp, 0);
    return s;
}

void oai_rsp_stream_destroy(oai_rsp_stream *s)
{
    if (!s) return;
    dx_buf_free(&s->txt);
    dx_buf_free(&s->strs);
    dx_buf_free(&s->resp);
    dx_free(s->items);
    dx_free(s->own);
    dx_free(s);
}

/* b's bytes from off ("" while it holds none: no arithmetic on NULL) */
static const char *at(const dx_buf *b, size_t off)
{
    return b->data ? b->data + off : "";
}

static rsp_item view(const oai_rsp_stream *s, const st_item *it)
{
    rsp_item v = {.kind = it->kind, .text = at(&s->txt, it->off), .len = it->len};
    v.status = it->incomplete ? "incomplete" : "completed";
    if (it->kind == IT_CALL) {
        v.name = at(&s->strs, it->name_off), v.name_len = it->name_len;
        v.call_id = at(&s->strs, it->id_off), v.call_id_len = it->id_len;
    }
    return v;
}

static st_item *last(oai_rsp_stream *s)
{
    return &s->items[s->n_items - 1];
}

/* "event: T\ndata: {"type":"T","sequence_number":N" — the event's end is "}\n\n". */
static int ev_head(oai_rsp_stream *s, dx_buf *out, const char *type)
{
    return dx_buf_printf(out, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%llu", type,
                         type, s->seq++);
}

static int ev_end(dx_buf *out)
{
    return dx_buf_puts(out, "}\n\n");
}

/* ,"item_id":…,"output_index":K — and the content index of text items */
static int ev_where(oai_rsp_stream *s, dx_buf *out, size_t k)
{
    int rc = dx_buf_puts(out, ",\"item_id\":");
    if (!rc) rc = put_item_id(out, s->m.id, s->items[k].kind, k);
    if (!rc) rc = dx_buf_printf(out, ",\"output_index\":%zu", k);
    if (!rc && s->items[k].kind != IT_CALL) rc = dx_buf_puts(out, ",\"content_index\":0");
    return rc;
}

/* output_item.added / .done */
static int ev_item(oai_rsp_stream *s, dx_buf *out, size_t k, int done)
{
    rsp_item v = view(s, &s->items[k]);
    int rc = ev_head(s, out, done ? "response.output_item.done" : "response.output_item.added");
    if (!rc) rc = dx_buf_printf(out, ",\"output_index\":%zu,\"item\":", k);
    if (!rc) rc = put_item(out, s->m.id, k, &v, done);
    return rc ? rc : ev_end(out);
}

/* content_part.added / .done */
static int ev_part(oai_rsp_stream *s, dx_buf *out, size_t k, int done)
{
    rsp_item v = view(s, &s->items[k]);
    int rc = ev_head(s, out, done ? "response.content_part.done" : "response.content_part.added");
    if (!rc) rc = ev_where(s, out, k);
    if (!rc) rc = dx_buf_puts(out, ",\"part\":");
    if (!rc) rc = put_part(out, v.kind, v.text, done ? v.len : 0);
    return rc ? rc : ev_end(out);
}

/* The open item's text not sent yet, but for the first bytes of a
 * character it ends inside (unless `all`). */
static int ev_delta(oai_rsp_stream *s, dx_buf *out, int all)
{
    static const char *const type[] = {"response.reasoning_text.delta",
                                       "response.output_text.delta",
                                       "response.function_call_arguments.delta"};
    size_t k = s->n_items - 1;
    st_item *it = last(s);
    const char *p = at(&s->txt, it->off + it->sent);
    size_t n = it->len - it->sent;
    if (!all && it->kind != IT_CALL) n -= dx_utf8_incomplete_tail((const uint8_t *)p, n);
    if (!n) return 0;
    int rc = ev_head(s, out, type[it->kind]);
    if (!rc) rc = ev_where(s, out, k);
    if (!rc) rc = dx_buf_puts(out, ",\"delta\":");
    if (!rc) rc = oai_json_str(out, p, n);
    if (!rc && it->kind == IT_MESSAGE) rc = dx_buf_puts(out, ",\"logprobs\":[]");
    if (!rc) it->sent += n;
    return rc ? rc : ev_end(out);
}

/* output_text.done / reasoning_text.done / function_call_arguments.done */
static int ev_text_done(oai_rsp_stream *s, dx_buf *out, size_t k)
{
    static const char *const type[] = {"response.reasoning_text.done", "response.output_text.done",
                                       "response.function_call_arguments.done"};
    rsp_item v = view(s, &s->items[k]);
    int rc = ev_head(s, out, type[v.kind]);
    if (!rc) rc = ev_where(s, out, k);
    if (!rc && v.kind == IT_CALL) {
        rc = dx_buf_puts(out, ",\"name\":");
        if (!rc) rc = oai_json_str(out, v.name, v.name_len);
    }
    if (!rc) rc = dx_buf_puts(out, v.kind == IT_CALL ? ",\"arguments\":" : ",\"text\":");
    if (!rc) rc = oai_json_str(out, v.text, v.len);
    if (!rc && v.kind == IT_MESSAGE) rc = dx_buf_puts(out, ",\"logprobs\":[]");
    return rc ? rc : ev_end(out);
}

/* A new item (it: its kind and, for a call, name and id) and its added
 * events. */
static int open_item(oai_rsp_stream *s, st_item it, dx_buf *out)
{
    if (s->n_items == s->cap_items) {
        size_t cap = s->cap_items ? 2 * s->cap_items : 8;
        st_item *p = dx_realloc(s->items, cap * sizeof *p);
        if (!p) return dx_errf(DX_ENOMEM, "responses stream: %zu items", cap);
        s->items = p, s->cap_items = cap;
    }
    it.off = s->txt.len;
    s->items[s->n_items++] = it;
    s->open = 1;
    int rc = ev_item(s, out, s->n_items - 1, 0);
    return rc || it.kind == IT_CALL ? rc : ev_part(s, out, s->n_items - 1, 0);
}

static int close_open(oai_rsp_stream *s, dx_buf *out)
{
    if (!s->open) return 0;
    size_t k = s->n_items - 1;
    int rc = ev_delta(s, out, 1);
    if (!rc) rc = ev_text_done(s, out, k);
    if (!rc && s->items[k].kind != IT_CALL) rc = ev_part(s, out, k, 1);
    if (!rc) rc = ev_item(s, out, k, 1);
    s->open = 0;
    return rc;
}

/* Text for the open item of `kind` (a new one when the open item is
 * another). */
static int feed_text(oai_rsp_stream *s, int kind, const char *p, size_t n, dx_buf *out)
{
    int rc = 0;
    if (!s->open || last(s)->kind != kind) {
        rc = close_open(s, out);
        if (!rc) rc = open_item(s, (st_item){.kind = kind}, out);
    }
    if (!rc) rc = dx_buf_append(&s->txt, p, n);
    if (rc) return rc;
    last(s)->len += n;
    return ev_delta(s, out, 0);
}

static int feed_call(oai_rsp_stream *s, const oai_tools_ev *e, dx_buf *out)
{
    st_item it = {.kind = IT_CALL, .call = e->index, .name_off = s->strs.len, .name_len = e->len};
    it.id_off = it.name_off + e->len, it.id_len = e->id ? strlen(e->id) : 0;
    int rc = dx_buf_append(&s->strs, e->text, e->len);
    if (!rc) rc = dx_buf_append(&s->strs, e->id ? e->id : "", it.id_len);
    if (!rc) rc = close_open(s, out);
    return rc ? rc : open_item(s, it, out);
}

/* Each call's arguments come whole in one event (oai_tools holds a call
 * until it is complete), so the call is done with them: a client that acts
 * on output_item.done gets it at once, not when the next item begins. */
static int feed_args(oai_rsp_stream *s, const oai_tools_ev *e, dx_buf *out)
{
    int rc = dx_buf_append(&s->txt, e->text, e->len);
    if (rc) return rc;
    last(s)->len += e->len;
    rc = ev_delta(s, out, 1);
    return rc ? rc : close_open(s, out);
}

static int feed_one(oai_rsp_stream *s, const oai_tools_ev *e, dx_buf *out)
{
    switch (e->kind) {
    case OAI_TOOLS_EV_REASONING:
        return e->len ? feed_text(s, IT_REASONING, e->text, e->len, out) : 0;
    case OAI_TOOLS_EV_CONTENT:
        return e->len ? feed_text(s, IT_MESSAGE, e->text, e->len, out) : 0;
    case OAI_TOOLS_EV_CALL:
        return feed_call(s, e, out);
    case OAI_TOOLS_EV_ARGS:
        if (!s->open || last(s)->kind != IT_CALL || last(s)->call != e->index)
            return dx_errf(DX_EINVAL, "responses stream: arguments of call %u, which is not open",
                           e->index);
        return feed_args(s, e, out);
    }
    return dx_errf(DX_EINVAL, "responses stream: event kind %d", (int)e->kind);
}

/* A failed write leaves out as it was and sticks: the stream cannot go on
 * (only oai_rsp_stream_fail's error event may still be sent). */
static int broken(oai_rsp_stream *s, dx_buf *out, size_t mark, int rc)
{
    out->len = mark;
    if (out->data) out->data[mark] = 0;
    if (!s->err) s->err = rc;
    return dx_errf(rc, "responses stream: %s", dx_strerror(rc));
}

static int check_live(const oai_rsp_stream *s)
{
    if (s->err) return dx_errf(s->err, "responses stream: broken by an earlier failure");
    if (s->state != ST_LIVE)
        return dx_errf(DX_EINVAL, "responses stream: %s",
                       s->state == ST_NEW ? "not begun" : "ended");
    return 0;
}

/* The response object into s->resp, then the event that carries it. */
static int ev_response(oai_rsp_stream *s, dx_buf *out, const char *type, const char *status,
                       const char *code, const char *msg, const oai_rsp_usage *u)
{
    dx_buf *b = &s->resp;
    dx_buf_reset(b);
    int rc = put_response_head(b, &s->m, status, code, msg);
    for (size_t k = 0; !rc && k < s->n_items; k++) {
        rsp_item v = view(s, &s->items[k]);
        if (k) rc = dx_buf_putc(b, ',');
        if (!rc) rc = put_item(b, s->m.id, k, &v, 1);
    }
    if (!rc) rc = put_response_tail(b, &s->m, u);
    if (!rc) rc = ev_head(s, out, type);
    if (!rc) rc = dx_buf_puts(out, ",\"response\":");
    if (!rc) rc = dx_buf_append(out, b->data, b->len);
    return rc ? rc : ev_end(out);
}

int oai_rsp_stream_begin(oai_rsp_stream *s, dx_buf *out)
{
    if (s->state != ST_NEW) return dx_errf(DX_EINVAL, "responses stream: begun twice");
    size_t mark = out->len;
    s->state = ST_LIVE;
    int rc = ev_response(s, out, "response.created", "in_progress", NULL, NULL, NULL);
    if (!rc) rc = ev_response(s, out, "response.in_progress", "in_progress", NULL, NULL, NULL);
    return rc ? broken(s, out, mark, rc) : 0;
}

int oai_rsp_stream_feed(oai_rsp_stream *s, const oai_tools_ev *ev, size_t n, dx_buf *out)
{
    int rc = check_live(s);
    for (size_t i = 0; !rc && i < n; i++) {
        size_t mark = out->len;
        rc = feed_one(s, &ev[i], out);
        if (rc && rc != DX_EINVAL) return broken(s, out, mark, rc);
    }
    return rc;
}

int oai_rsp_stream_finish(oai_rsp_stream *s, const char *finish, const oai_rsp_usage *u,
                          dx_buf *out)
{
    int rc = check_live(s), inc = is_length(finish);
    if (rc) return rc;
    size_t mark = out->len;
    /* the item being written when the answer was cut is incomplete */
    if (s->open && inc && last(s)->kind != IT_CALL) last(s)->incomplete = 1;
    rc = close_open(s, out);
    if (!rc && !s->n_items) { /* an empty answer is an empty message */
        rc = open_item(s, (st_item){.kind = IT_MESSAGE, .incomplete = inc}, out);
        if (!rc) rc = close_open(s, out);
    }
    if (!rc)
        rc = ev_response(s, out, inc ? "response.incomplete" : "response.completed",
                         inc ? "incomplete" : "completed", NULL, NULL, u);
    if (rc) return broken(s, out, mark, rc);
    s->state = ST_DONE;
    return 0;
}

int oai_rsp_stream_fail(oai_rsp_stream *s, int status, const char *message, const char *param,
                        dx_buf *out)
{
    /* ResponseError's codes: the closest of them to the status */
    const char *code = status >= 500   ? "server_error"
                       : status == 429 ? "rate_limit_exceeded"
                                       : "invalid_prompt";
    if (s->state != ST_LIVE)
        return dx_errf(DX_EINVAL, "responses stream: %s",
                       s->state == ST_NEW ? "not begun" : "ended");
    size_t mark = out->len;
    /* the open item's last bytes (a partial character) first, so that its
     * deltas still add up to its text in response.failed */
    int rc = s->open && !s->err ? ev_delta(s, out, 1) : 0;
    if (!rc) rc = ev_head(s, out, "error");
    if (!rc) rc = dx_buf_printf(out, ",\"code\":\"%s\",\"message\":", code);
    if (!rc) rc = oai_json_str(out, message, strlen(message));
    if (!rc) rc = dx_buf_puts(out, ",\"param\":");
    if (!rc)
        rc = param && *param ? oai_json_str(out, param, strlen(param)) : dx_buf_puts(out, "null");
    if (!rc) rc = ev_end(out);
    if (!rc && !s->err) { /* then the response as it stood, the open item cut */
        if (s->open) last(s)->incomplete = 1;
        rc = ev_response(s, out, "response.failed", "failed", code, message, NULL);
    }
    s->state = ST_DONE;
    return rc ? broken(s, out, mark, rc) : 0;
}

const char *oai_rsp_stream_response(const oai_rsp_stream *s, size_t *len)
{
    *len = s->state == ST_NEW ? 0 : s->resp.len;
    return s->state == ST_NEW ? NULL : s->resp.data;
}

static int result_call(const oai_rsp_stream *s, const st_item *it, oai_tool_call *c)
{
    rsp_item v = view(s, it);
    snprintf(c->id, sizeof c->id, "%.*s", (int)v.call_id_len, v.call_id);
    c->name = dx_strndup(v.name, v.name_len);
    c->arguments = dx_strndup(v.text, v.len);
    c->arguments_len = v.len;
    return c->name && c->arguments ? 0 : dx_errf(DX_ENOMEM, "responses stream: a call's result");
}

int oai_rsp_stream_result(const oai_rsp_stream *s, oai_tools_result *out)
{
    dx_buf text[2]; /* reasoning, content */
    size_t n_calls = 0;
    int rc = 0;
    memset(out, 0, sizeof *out);
    dx_buf_init(&text[0], 0);
    dx_buf_init(&text[1], 0);
    for (size_t k = 0; k < s->n_items; k++) n_calls += s->items[k].kind == IT_CALL;
    if (n_calls && !(out->calls = dx_calloc(n_calls, sizeof *out->calls)))
        rc = dx_errf(DX_ENOMEM, "responses stream: %zu calls", n_calls);
    for (size_t k = 0; !rc && k < s->n_items; k++) {
        const st_item *it = &s->items[k];
        if (it->kind == IT_CALL)
            rc = result_call(s, it, &out->calls[out->n_calls++]);
        else
            rc = dx_buf_append(&text[it->kind], at(&s->txt, it->off), it->len);
    }
    out->reasoning_len = text[0].len, out->content_len = text[1].len;
    if (!rc && text[0].len) out->reasoning = dx_buf_take(&text[0]);
    if (!rc && text[1].len) out->content = dx_buf_take(&text[1]);
    dx_buf_free(&text[0]);
    dx_buf_free(&text[1]);
    if (rc) oai_tools_result_free(out);
    return rc;
}
