/* oai_front: a chat answer written again for its front door (see .h). */
#include "oai/oai_front.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "oai/oai_anth.h"
#include "oai/oai_ans.h"
#include "oai/oai_resp.h"

struct oai_front {
    enum oai_front_api api;
    char *model;
    uint32_t prompt_hint;
    char anth_id[48];
    char *rsp_id, *rsp_echo; /* the meta's strings, owned */
    oai_rsp_meta rsp;
    oai_ans_stream *rd;
    oai_ans_info info;
    oai_anth_stream *as;
    oai_rsp_stream *rs;
    int begun, ended, completed;
    dx_buf pend;           /* an SSE event not complete yet */
    dx_buf data;           /* an event's data lines joined */
    oai_tools_result full; /* a whole answer's pieces */
    dx_buf full_obj;       /* Responses: a whole answer's object */
};

oai_front *oai_front_create(const oai_front_config *c)
{
    oai_front *f = dx_calloc(1, sizeof *f);
    if (!f) return NULL;
    f->api = c->api;
    f->prompt_hint = c->prompt_hint;
    oai_ans_info_init(&f->info);
    dx_buf_init(&f->pend, 0);
    dx_buf_init(&f->data, 0);
    dx_buf_init(&f->full_obj, 0);
    f->model = dx_strdup(c->model ? c->model : "");
    f->rd = oai_ans_stream_create();
    int ok = f->model && f->rd;
    if (ok && f->api == OAI_FRONT_MESSAGES) {
        oai_anth_make_id(f->anth_id, sizeof f->anth_id);
        ok = (f->as = oai_anth_stream_create()) != NULL;
    } else if (ok) {
        f->rsp = c->rsp;
        f->rsp.id = f->rsp_id = dx_strdup(c->rsp.id ? c->rsp.id : "");
        f->rsp.echo = f->rsp_echo = c->rsp.echo ? dx_strdup(c->rsp.echo) : NULL;
        f->rsp.model = f->model;
        ok = f->rsp_id && (!c->rsp.echo || f->rsp_echo) && (f->rs = oai_rsp_stream_create(&f->rsp));
    }
    if (!ok) {
        oai_front_destroy(f);
        return NULL;
    }
    return f;
}

void oai_front_destroy(oai_front *f)
{
    if (!f) return;
    oai_ans_stream_destroy(f->rd);
    oai_ans_info_free(&f->info);
    oai_anth_stream_destroy(f->as);
    oai_rsp_stream_destroy(f->rs);
    oai_tools_result_free(&f->full);
    dx_buf_free(&f->pend);
    dx_buf_free(&f->data);
    dx_buf_free(&f->full_obj);
    dx_free(f->model);
    dx_free(f->rsp_id);
    dx_free(f->rsp_echo);
    dx_free(f);
}

/* The status an upstream error's type stands for (a stream carries no
 * status of its own). */
static int error_status(const char *type)
{
    if (!strcmp(type, "invalid_request_error")) return 400;
    if (!strcmp(type, "authentication_error")) return 401;
    if (!strcmp(type, "rate_limit_error")) return 429;
    return 500;
}

/* What ended the answer, in each door's terms. */
static oai_anth_end anth_end(const oai_front *f)
{
    return (oai_anth_end){.finish = f->info.finish,
                          .stop_sequence =
                              f->info.stop_reason.len ? f->info.stop_reason.data : NULL,
                          .usage = f->info.usage};
}

static oai_rsp_usage rsp_usage(const oai_front *f)
{
    const oai_usage *u = &f->info.usage;
    return (oai_rsp_usage){.input = u->prompt, .cached = u->cached, .output = u->completion};
}

/* ---- a stream ---------------------------------------------------------------- */

static int begin(oai_front *f, dx_buf *out)
{
    f->begun = 1;
    if (f->api == OAI_FRONT_MESSAGES) {
        oai_usage u = {.prompt = f->prompt_hint};
        return oai_anth_stream_start(f->as, out, f->anth_id, f->model, &u);
    }
    return oai_rsp_stream_begin(f->rs, out);
}

static int fail(oai_front *f, int status, const char *message, dx_buf *out)
{
    if (f->ended) return 0;
    int rc = f->begun ? 0 : begin(f, out);
    f->ended = 1;
    if (rc) return rc;
    if (f->api == OAI_FRONT_MESSAGES) return oai_anth_sse_error(out, status, message);
    return oai_rsp_stream_fail(f->rs, status, message, NULL, out);
}

int oai_front_sse_fail(oai_front *f, int status, const char *message, dx_buf *out)
{
    return fail(f, status, message, out);
}

static int finish(oai_front *f, dx_buf *out)
{
    f->ended = 1;
    f->completed = f->info.finish[0] != 0;
    if (!f->completed) return fail(f, 502, "the answer ended without its finish", out);
    if (f->api == OAI_FRONT_MESSAGES) {
        oai_anth_end e = anth_end(f);
        return oai_anth_stream_end(f->as, out, &e);
    }
    oai_rsp_usage ru = rsp_usage(f);
    return oai_rsp_stream_finish(f->rs, f->info.finish, &ru, out);
}

/* One event's data: its chunk read back and written again. */
static int on_data(oai_front *f, const char *d, size_t n, dx_buf *out)
{
    if (f->ended) return 0; /* nothing follows the end */
    const oai_tools_ev *ev;
    size_t n_ev;
    int rc = oai_ans_chunk(f->rd, d, n, &ev, &n_ev, &f->info);
    if (rc) return rc;
    if (f->info.error) {
        char msg[sizeof f->info.error_message];
        memcpy(msg, f->info.error_message, sizeof msg);
        return fail(f, error_status(f->info.error_type), msg, out);
    }
    if (!f->begun && (rc = begin(f, out))) return rc;
    if (f->info.done) return finish(f, out);
    if (!n_ev) return 0;
    if (f->api == OAI_FRONT_MESSAGES) return oai_anth_stream_feed(f->as, out, ev, n_ev);
    return oai_rsp_stream_feed(f->rs, ev, n_ev, out);
}

/* The data lines of the event ev[0..n) joined by "\n" into f->data; 0 when
 * there are none (a comment, a keep-alive). */
static int event_data(oai_front *f, const char *ev, size_t n)
{
    f->data.len = 0;
    int lines = 0;
    for (size_t at = 0; at < n;) {
        const char *nl = memchr(ev + at, '\n', n - at);
        size_t end = nl ? (size_t)(nl - ev) : n, len = end - at;
        const char *line = ev + at;
        if (len && line[len - 1] == '\r') len--;
        if (len >= 5 && !memcmp(line, "data:", 5)) {
            size_t skip = len > 5 && line[5] == ' ' ? 6 : 5;
            if ((lines++ && dx_buf_putc(&f->data, '\n')) ||
                dx_buf_append(&f->data, line + skip, len - skip))
                return dx_errf(DX_ENOMEM, "front door: out of memory for an event");
        }
        at = end + 1;
    }
    return lines;
}

int oai_front_sse(oai_front *f, const char *p, size_t n, dx_buf *out)
{
    if (dx_buf_append(&f->pend, p, n))
        return dx_errf(DX_ENOMEM, "front door: out of memory for the stream");
    size_t at = 0;
    int rc = 0;
    while (!rc) {
        const char *s = f->pend.data + at;
        size_t left = f->pend.len - at, len = 0;
        const char *e = left >= 2 ? memmem(s, left, "\n\n", 2) : NULL;
        if (!e) break;
        len = (size_t)(e - s) + 2;
        int lines = event_data(f, s, len);
        if (lines < 0) rc = lines;
        if (lines > 0) rc = on_data(f, f->data.data, f->data.len, out);
        at += len;
    }
    memmove(f->pend.data, f->pend.data + at, f->pend.len - at);
    f->pend.len -= at;
    return rc;
}

/* ---- a whole answer ---------------------------------------------------------- */

static int error_body(oai_front *f, int status, dx_buf *out)
{
    const oai_ans_info *i = &f->info;
    const char *msg = i->error && i->error_message[0] ? i->error_message : "the request failed";
    /* the upstream's error names chat fields: in the door's terms */
    oai_err e = {.status = status};
    snprintf(e.message, sizeof e.message, "%.*s", (int)sizeof e.message - 1, msg);
    snprintf(e.param, sizeof e.param, "%s", i->error_param);
    if (f->api == OAI_FRONT_MESSAGES) {
        oai_anth_err_from_chat(&e);
        return oai_anth_error_json(out, status, e.message);
    }
    oai_rsp_err_from_chat(&e);
    return oai_error_json(out, e.message, i->error_type[0] ? i->error_type : oai_error_type(status),
                          e.param[0] ? e.param : NULL, i->error_code[0] ? i->error_code : NULL);
}

int oai_front_full(oai_front *f, int status, const char *body, size_t n, dx_buf *out)
{
    oai_tools_result_free(&f->full);
    int rc = oai_ans_full(body, n, &f->full, &f->info);
    f->ended = 1;
    if (rc == DX_ENOMEM) return rc;
    if (rc || status != 200 || f->info.error) {
        oai_tools_result_free(&f->full);
        return error_body(f, status == 200 ? 502 : status, out);
    }
    f->completed = 1;
    if (f->api == OAI_FRONT_MESSAGES) {
        oai_anth_end e = anth_end(f);
        return oai_anth_message_json(out, f->anth_id, f->model, &f->full, &e);
    }
    oai_rsp_usage ru = rsp_usage(f);
    size_t at = out->len;
    rc = oai_rsp_response_json(out, &f->rsp, &f->full, f->info.finish, &ru);
    f->full_obj.len = 0;
    if (!rc) rc = dx_buf_append(&f->full_obj, out->data + at, out->len - at);
    return rc;
}

/* ---- after the end ----------------------------------------------------------- */

int oai_front_completed(const oai_front *f)
{
    return f->completed;
}

static int copy_str(const char *s, size_t n, char **out)
{
    *out = NULL;
    if (!s) return 0;
    return (*out = dx_strndup(s, n)) ? 0 : dx_errf(DX_ENOMEM, "front door: out of memory");
}

int oai_front_result(const oai_front *f, oai_tools_result *r)
{
    memset(r, 0, sizeof *r);
    if (f->rs && f->begun) return oai_rsp_stream_result(f->rs, r);
    const oai_tools_result *s = &f->full;
    int rc = copy_str(s->content, s->content_len, &r->content);
    if (!rc) rc = copy_str(s->reasoning, s->reasoning_len, &r->reasoning);
    r->content_len = r->content ? s->content_len : 0;
    r->reasoning_len = r->reasoning ? s->reasoning_len : 0;
    if (!rc && s->n_calls && !(r->calls = dx_calloc(s->n_calls, sizeof *r->calls)))
        rc = dx_errf(DX_ENOMEM, "front door: out of memory");
    for (size_t i = 0; !rc && i < s->n_calls; i++) {
        oai_tool_call *c = &r->calls[r->n_calls++];
        memcpy(c->id, s->calls[i].id, sizeof c->id);
        rc = copy_str(s->calls[i].name, strlen(s->calls[i].name), &c->name);
        if (!rc) rc = copy_str(s->calls[i].arguments, s->calls[i].arguments_len, &c->arguments);
        c->arguments_len = s->calls[i].arguments_len;
    }
    if (rc) oai_tools_result_free(r);
    return rc;
}

const char *oai_front_response(const oai_front *f, size_t *len)
{
    *len = 0;
    if (f->api != OAI_FRONT_RESPONSES) return NULL;
    if (f->begun) return oai_rsp_stream_response(f->rs, len);
    *len = f->full_obj.len;
    return f->full_obj.len ? f->full_obj.data : NULL;
}
