/* oai_tools: tool calls and reasoning out of a model's answer (see .h).
 *
 * Two stages, each a state machine that looks at one byte at a time and
 * keeps what it has not decided yet in a hold buffer:
 *   reasoning stage  answer bytes → reasoning events | the tool stage
 *   tool stage       its bytes    → content events | call events
 * Every decision depends only on the bytes before it, never on where a feed
 * ends, which is what makes any chunking give the one-shot result; the
 * runs of plain bytes taken in one go are only a faster way to the same
 * per-byte decisions.
 *
 * Every tag starts with '<' and has no other '<', so a partial tag that
 * fails at byte c can only restart at c itself: the matcher never has to
 * look back into what it held. */
#include "oai/oai_tools.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"
#include "base/dx_utf8.h"
#include "oai/oai_jscan.h"
#include "oai/oai_resp.h"

static const char k_think[] = "<think>", k_unthink[] = "</think>", k_call[] = "<tool_call>",
                  k_uncall[] = "</tool_call>", k_python[] = "<|python_tag|>";

/* Reasoning stage. */
enum {
    R_OFF,      /* no reasoning parser: everything goes to the tool stage */
    R_LEAD,     /* start of the answer: whitespace, then maybe <think> */
    R_OPEN,     /* inside the block, before its first word */
    R_THINK,    /* reasoning text; whitespace and a </think> prefix held */
    R_CLOSE_WS, /* after </think>: whitespace dropped */
    R_ANSWER,   /* after the block: everything goes to the tool stage */
};

/* Tool stage. */
enum {
    T_PLAIN,    /* content only, no call can follow */
    T_TEXT,     /* qwen: content; whitespace and a <tool_call> prefix held */
    T_CALL,     /* the call's JSON object, held */
    T_CALL_END, /* qwen: after the object: whitespace, </tool_call> */
    T_AFTER,    /* after a call: whitespace dropped */
    T_LLEAD,    /* llama3: start: whitespace, <|python_tag|> or '{' */
    T_LTAG,     /* llama3: after <|python_tag|>: whitespace, '{' */
    T_LSEP,     /* llama3: after a call: whitespace, ';' */
    T_LSEP2,    /* llama3: after ';': whitespace, '{' */
};

typedef struct {
    enum oai_tools_ev_kind kind;
    uint32_t index;
    size_t off, len, id_off; /* into t->out */
} ev_rec;

struct oai_tools {
    oai_tools_opts o;
    int err, finished;
    int r_state, r_seen_open;
    size_t r_m; /* bytes of the tag being matched */
    dx_buf r_hold;
    int t_state, t_content;   /* t_content: some content went out */
    size_t t_m, t_ws, js_off; /* t_ws: whitespace before the call's tag; js_off: its JSON */
    dx_buf t_hold;
    dx_buf pend; /* whitespace cut off by calls, sent only if more content follows */
    oai_jscan js;
    dx_buf out;   /* the text of this feed's events */
    dx_buf carry; /* a UTF-8 character's first bytes, for the next feed */
    enum oai_tools_ev_kind carry_kind;
    dx_buf call, args; /* a call being checked: name, NUL, arguments; decoded args */
    ev_rec *ev;
    size_t n_ev, cap_ev;
    oai_tools_ev *pub;
    size_t cap_pub;
    uint32_t n_calls;
    uint64_t id_state;
};

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* ---- events ------------------------------------------------------------- */

static void set_err(oai_tools *t, int rc)
{
    if (rc && !t->err) t->err = rc;
}

static ev_rec *ev_push(oai_tools *t, enum oai_tools_ev_kind kind, uint32_t index)
{
    if (t->n_ev == t->cap_ev) {
        size_t cap = t->cap_ev ? 2 * t->cap_ev : 8;
        ev_rec *e = dx_realloc(t->ev, cap * sizeof *e);
        if (!e) {
            set_err(t, DX_ENOMEM);
            return NULL;
        }
        t->ev = e, t->cap_ev = cap;
    }
    ev_rec *e = &t->ev[t->n_ev++];
    *e = (ev_rec){.kind = kind, .index = index, .off = t->out.len};
    return e;
}

/* Reasoning or content text; joins the previous event when it is the same
 * kind. */
static void emit_text(oai_tools *t, enum oai_tools_ev_kind kind, const char *p, size_t n)
{
    if (!n || t->err) return;
    ev_rec *e = t->n_ev ? &t->ev[t->n_ev - 1] : NULL;
    if (!e || e->kind != kind) e = ev_push(t, kind, 0);
    if (!e) return;
    int rc = dx_buf_append(&t->out, p, n);
    if (rc)
        set_err(t, rc);
    else
        e->len += n;
}

static void flush_hold(oai_tools *t, dx_buf *hold, enum oai_tools_ev_kind kind)
{
    emit_text(t, kind, hold->data, hold->len);
    dx_buf_reset(hold);
}

/* A checked call: the head event (id, name) and the arguments event. */
static void emit_call(oai_tools *t, const char *name, size_t name_len, const char *args,
                      size_t args_len)
{
    char id[32];
    uint64_t a = dx_splitmix64(&t->id_state), b = dx_splitmix64(&t->id_state);
    snprintf(id, sizeof id, "call_%016llx%08llx", (unsigned long long)a,
             (unsigned long long)(b >> 32));
    ev_rec *e = ev_push(t, OAI_TOOLS_EV_CALL, t->n_calls);
    if (!e) return;
    /* the name, then the id, both NUL-terminated in out */
    int rc = dx_buf_append(&t->out, name, name_len);
    if (!rc) rc = dx_buf_putc(&t->out, '\0');
    e->len = name_len;
    e->id_off = t->out.len;
    if (!rc) rc = dx_buf_append(&t->out, id, strlen(id) + 1);
    ev_rec *g = rc ? NULL : ev_push(t, OAI_TOOLS_EV_ARGS, t->n_calls);
    if (g && !(rc = dx_buf_append(&t->out, args, args_len))) g->len = args_len;
    set_err(t, rc);
    t->n_calls++;
}

/* ---- matching ----------------------------------------------------------- */

enum { TAG_HELD, TAG_MATCH, TAG_MISS };

/* Whitespace, then `tag`, a byte at a time into hold (*m: tag bytes seen).
 * TAG_MISS: c does not continue them and was not taken. */
static int tag_step(oai_tools *t, dx_buf *hold, size_t *m, const char *tag, unsigned char c)
{
    int cont = *m ? c == (unsigned char)tag[*m] : is_ws(c) || c == (unsigned char)tag[0];
    if (!cont || hold->len >= t->o.max_held) return TAG_MISS;
    int rc = dx_buf_putc(hold, (char)c);
    if (rc) { /* the feed stops at this byte */
        set_err(t, rc);
        return TAG_HELD;
    }
    if (*m || !is_ws(c)) (*m)++;
    return tag[*m] ? TAG_HELD : TAG_MATCH;
}

/* A run of bytes from p[0..n) that can neither be whitespace nor start a
 * tag. */
static size_t plain_run(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n && p[i] != '<' && !is_ws((unsigned char)p[i])) i++;
    return i;
}

/* ---- tool stage ---------------------------------------------------------- */

/* Content from the tool stage: the whitespace that calls cut off inside
 * the content goes out first. */
static void emit_content(oai_tools *t, const char *p, size_t n)
{
    if (!n) return;
    emit_text(t, OAI_TOOLS_EV_CONTENT, t->pend.data, t->pend.len);
    dx_buf_reset(&t->pend);
    emit_text(t, OAI_TOOLS_EV_CONTENT, p, n);
    t->t_content = 1;
}

static void flush_content(oai_tools *t)
{
    emit_content(t, t->t_hold.data, t->t_hold.len);
    dx_buf_reset(&t->t_hold);
}

/* Whitespace next to a call: kept only between two pieces of content. */
static void after_call_ws(oai_tools *t, const char *p, size_t n)
{
    if (t->t_content && t->pend.len + n <= t->o.max_held) set_err(t, dx_buf_append(&t->pend, p, n));
}

static void call_begin(oai_tools *t)
{
    oai_jscan_init(&t->js);
    t->js_off = t->t_hold.len;
    t->t_state = T_CALL;
    t->t_m = 0;
}

/* The held text was not a call after all: it is content, and c (not taken)
 * is looked at again in the state after it. */
static int call_fail(oai_tools *t)
{
    flush_content(t);
    t->t_state = t->o.tools == OAI_TOOLS_QWEN ? T_TEXT : T_PLAIN;
    t->t_m = 0;
    return 0;
}

/* The arguments value at v (or none) → compact JSON in t->call; 0 when it
 * cannot be a call's arguments. */
static int put_args(oai_tools *t, const char *obj, const oai_jscan_val *v)
{
    int rc;
    if (!v->seen || obj[v->start] == 'n') { /* none or null: a call without parameters */
        set_err(t, rc = dx_buf_puts(&t->call, "{}"));
        return !rc;
    }
    const char *p = obj + v->start;
    size_t n = v->end - v->start;
    if (*p == '"') { /* arguments written as a string that holds the object */
        dx_buf_reset(&t->args);
        rc = oai_jscan_unquote(p, n, &t->args);
        if (rc) {
            set_err(t, rc == DX_EFORMAT ? 0 : rc);
            return 0;
        }
        if (!oai_jscan_is_object(t->args.data, t->args.len)) return 0;
        p = t->args.data, n = t->args.len;
    } else if (*p != '{') {
        return 0;
    }
    set_err(t, rc = oai_jscan_compact(p, n, &t->call));
    return !rc;
}

/* The object in t_hold is complete: emits it as a call if it is one. */
static int call_check(oai_tools *t)
{
    const oai_jscan *s = &t->js;
    const char *obj = t->t_hold.data + t->js_off;
    const oai_jscan_val *name = &s->val[OAI_JSCAN_NAME], *args = &s->val[OAI_JSCAN_ARGUMENTS];
    if (!args->seen)
        args = &s->val[OAI_JSCAN_PARAMETERS];
    else if (s->val[OAI_JSCAN_PARAMETERS].seen)
        return 0; /* which one? */
    if (s->dup || !name->seen || obj[name->start] != '"') return 0;
    if (dx_utf8_valid_prefix((const uint8_t *)obj, s->pos) != s->pos) return 0;
    dx_buf_reset(&t->call);
    int rc = oai_jscan_unquote(obj + name->start, name->end - name->start, &t->call);
    if (rc) {
        set_err(t, rc == DX_EFORMAT ? 0 : rc);
        return 0;
    }
    size_t name_len = t->call.len;
    if (!name_len || memchr(t->call.data, '\0', name_len)) return 0;
    if ((rc = dx_buf_putc(&t->call, '\0'))) {
        set_err(t, rc);
        return 0;
    }
    if (!put_args(t, obj, args)) return 0;
    if (t->o.max_calls && t->n_calls >= t->o.max_calls) return 1; /* taken, not sent */
    emit_call(t, t->call.data, name_len, t->call.data + name_len + 1, t->call.len - name_len - 1);
    return 1;
}

static void call_commit(oai_tools *t)
{
    int qwen = t->o.tools == OAI_TOOLS_QWEN;
    if (call_check(t)) {
        after_call_ws(t, t->t_hold.data, t->t_ws);
        dx_buf_reset(&t->t_hold);
        t->t_state = qwen ? T_AFTER : T_LSEP;
    } else {
        flush_content(t);
        t->t_state = qwen ? T_TEXT : T_PLAIN;
    }
    t->t_ws = 0;
    t->t_m = 0;
}

/* Keeps c with the held call; 0 when out of memory, which stops the feed. */
static int hold_byte(oai_tools *t, unsigned char c)
{
    int rc = dx_buf_putc(&t->t_hold, (char)c);
    set_err(t, rc);
    return !rc;
}

static int call_byte(oai_tools *t, unsigned char c)
{
    if (t->t_hold.len >= t->o.max_held) return call_fail(t);
    int rc = oai_jscan_byte(&t->js, c);
    if (rc == OAI_JSCAN_BAD) return call_fail(t);
    if (!hold_byte(t, c)) return 1;
    if (rc == OAI_JSCAN_DONE) {
        if (t->o.tools == OAI_TOOLS_QWEN)
            t->t_state = T_CALL_END;
        else
            call_commit(t);
    }
    return 1;
}

/* Qwen: whitespace and </tool_call> after the object. */
static int call_end_byte(oai_tools *t, unsigned char c)
{
    int cont = t->t_m ? c == (unsigned char)k_uncall[t->t_m] : is_ws(c) || c == '<';
    if (!cont || t->t_hold.len >= t->o.max_held) return call_fail(t);
    if (!hold_byte(t, c)) return 1;
    if (t->t_m || c == '<') t->t_m++;
    if (!k_uncall[t->t_m]) call_commit(t);
    return 1;
}

/* Not a tag after all: the held bytes are content; c is looked at again,
 * unless nothing was held, when it is content itself.  Returns whether c
 * was taken. */
static int text_miss(oai_tools *t, unsigned char c, int next_state)
{
    t->t_m = 0;
    t->t_state = next_state;
    if (t->t_hold.len) {
        flush_content(t);
        return 0;
    }
    emit_content(t, (const char *)&c, 1);
    return 1;
}

/* Llama3: after <|python_tag|> or ';', whitespace then the next object. */
static int lnext_byte(oai_tools *t, unsigned char c)
{
    if (is_ws(c) && t->t_hold.len < t->o.max_held) {
        hold_byte(t, c);
        return 1;
    }
    if (c == '{') {
        call_begin(t);
        return call_byte(t, c);
    }
    return text_miss(t, c, T_PLAIN);
}

/* One byte for the tool stage; returns whether it was taken (else it is
 * looked at again in the new state). */
static int t_byte(oai_tools *t, unsigned char c)
{
    int m;
    switch (t->t_state) {
    case T_PLAIN:
        emit_content(t, (const char *)&c, 1);
        return 1;
    case T_TEXT:
        m = tag_step(t, &t->t_hold, &t->t_m, k_call, c);
        if (m == TAG_MATCH) {
            t->t_ws = t->t_hold.len - (sizeof k_call - 1);
            call_begin(t);
        }
        return m != TAG_MISS || text_miss(t, c, T_TEXT);
    case T_CALL:
        return call_byte(t, c);
    case T_CALL_END:
        return call_end_byte(t, c);
    case T_AFTER:
        if (!is_ws(c)) {
            t->t_state = T_TEXT;
            return 0;
        }
        after_call_ws(t, (const char *)&c, 1);
        return 1;
    case T_LLEAD:
        m = tag_step(t, &t->t_hold, &t->t_m, k_python, c);
        if (m == TAG_MATCH) t->t_state = T_LTAG, t->t_m = 0;
        if (m != TAG_MISS) return 1;
        if (t->t_m == 0 && c == '{') { /* only whitespace held */
            call_begin(t);
            return call_byte(t, c);
        }
        return text_miss(t, c, T_PLAIN);
    case T_LTAG:
    case T_LSEP2:
        return lnext_byte(t, c);
    case T_LSEP:
        if (is_ws(c)) {
            after_call_ws(t, (const char *)&c, 1);
            return 1;
        }
        if (c != ';') {
            t->t_state = T_PLAIN;
            return 0;
        }
        t->t_state = T_LSEP2;
        hold_byte(t, c);
        return 1;
    }
    DX_ASSERT(!"oai_tools: unknown tool state");
    return 1;
}

static void t_feed(oai_tools *t, const char *p, size_t n)
{
    size_t i = 0;
    while (i < n && !t->err) {
        size_t run = 0;
        if (t->t_state == T_PLAIN)
            run = n - i;
        else if (t->t_state == T_TEXT && !t->t_hold.len)
            run = plain_run(p + i, n - i);
        if (run) {
            emit_content(t, p + i, run);
            i += run;
        } else {
            i += (size_t)t_byte(t, (unsigned char)p[i]);
        }
    }
}

static void t_finish(oai_tools *t)
{
    flush_content(t);       /* an unfinished tag or call */
    dx_buf_reset(&t->pend); /* whitespace after the last call */
    t->t_state = T_PLAIN;
}

/* ---- reasoning stage ---------------------------------------------------- */

/* The answer starts with the block's opening tag, or is no reasoning. */
static int r_lead_byte(oai_tools *t, unsigned char c)
{
    int m = tag_step(t, &t->r_hold, &t->r_m, k_think, c);
    if (m == TAG_HELD) return 1;
    if (m == TAG_MATCH) {
        dx_buf_reset(&t->r_hold);
        t->r_state = R_OPEN, t->r_seen_open = 1, t->r_m = 0;
        return 1;
    }
    t_feed(t, t->r_hold.data, t->r_hold.len); /* no reasoning: all of it is answer */
    dx_buf_reset(&t->r_hold);
    t->r_state = R_ANSWER;
    return 0;
}

/* Leading whitespace is dropped; with the block opened by the prompt, so is
 * an opening tag the model writes anyway. */
static int r_open_byte(oai_tools *t, unsigned char c)
{
    if (t->r_seen_open) {
        if (is_ws(c)) return 1;
        t->r_state = R_THINK;
        return 0;
    }
    int m = tag_step(t, &t->r_hold, &t->r_m, k_think, c);
    if (m == TAG_HELD) return 1;
    if (m == TAG_MISS && t->r_m) /* a partial tag is reasoning text; the whitespace goes */
        emit_text(t, OAI_TOOLS_EV_REASONING, t->r_hold.data + t->r_hold.len - t->r_m, t->r_m);
    dx_buf_reset(&t->r_hold);
    t->r_seen_open = 1, t->r_m = 0;
    t->r_state = m == TAG_MATCH ? R_OPEN : R_THINK;
    return m == TAG_MATCH;
}

static int r_think_byte(oai_tools *t, unsigned char c)
{
    int m = tag_step(t, &t->r_hold, &t->r_m, k_unthink, c);
    if (m == TAG_HELD) return 1;
    t->r_m = 0;
    if (m == TAG_MATCH) { /* the whitespace before </think> goes with it */
        dx_buf_reset(&t->r_hold);
        t->r_state = R_CLOSE_WS;
        return 1;
    }
    if (t->r_hold.len) {
        flush_hold(t, &t->r_hold, OAI_TOOLS_EV_REASONING);
        return 0;
    }
    emit_text(t, OAI_TOOLS_EV_REASONING, (const char *)&c, 1);
    return 1;
}

static void r_feed(oai_tools *t, const char *p, size_t n)
{
    size_t i = 0;
    while (i < n && !t->err) {
        int st = t->r_state;
        if (st == R_OFF || st == R_ANSWER) {
            t_feed(t, p + i, n - i);
            return;
        }
        size_t run = st == R_THINK && !t->r_hold.len ? plain_run(p + i, n - i) : 0;
        if (run) {
            emit_text(t, OAI_TOOLS_EV_REASONING, p + i, run);
            i += run;
            continue;
        }
        unsigned char c = (unsigned char)p[i];
        int took;
        if (st == R_LEAD)
            took = r_lead_byte(t, c);
        else if (st == R_OPEN)
            took = r_open_byte(t, c);
        else if (st == R_THINK)
            took = r_think_byte(t, c);
        else if (is_ws(c)) /* R_CLOSE_WS */
            took = 1;
        else
            t->r_state = R_ANSWER, took = 0;
        i += (size_t)took;
    }
}

static void r_finish(oai_tools *t)
{
    if (t->r_state == R_LEAD) /* whitespace or a partial <think>: answer */
        t_feed(t, t->r_hold.data, t->r_hold.len);
    else if (t->r_state == R_OPEN && t->r_m)
        emit_text(t, OAI_TOOLS_EV_REASONING, t->r_hold.data + t->r_hold.len - t->r_m, t->r_m);
    else if (t->r_state == R_THINK)
        emit_text(t, OAI_TOOLS_EV_REASONING, t->r_hold.data, t->r_hold.len);
    dx_buf_reset(&t->r_hold);
    t->r_state = R_ANSWER;
}

/* ---- the parser ----------------------------------------------------------- */

oai_tools *oai_tools_create(const oai_tools_opts *o)
{
    oai_tools *t = dx_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->o = *o;
    if (!t->o.max_held) t->o.max_held = OAI_TOOLS_MAX_HELD_DEFAULT;
    t->r_state = !o->reasoning ? R_OFF : o->think_open ? R_OPEN : R_LEAD;
    t->t_state = o->tools == OAI_TOOLS_QWEN     ? T_TEXT
                 : o->tools == OAI_TOOLS_LLAMA3 ? T_LLEAD
                                                : T_PLAIN;
    dx_buf_init(&t->r_hold, 0);
    dx_buf_init(&t->t_hold, 0);
    dx_buf_init(&t->pend, 0);
    dx_buf_init(&t->out, 0);
    dx_buf_init(&t->carry, 0);
    dx_buf_init(&t->call, 0);
    dx_buf_init(&t->args, 0);
    t->id_state = o->id_seed;
    if (!t->id_state &&
        getrandom(&t->id_state, sizeof t->id_state, GRND_NONBLOCK) != (ssize_t)sizeof t->id_state)
        t->id_state = dx_now_ns() ^ (uint64_t)(uintptr_t)t; /* unique enough for ids */
    return t;
}

void oai_tools_destroy(oai_tools *t)
{
    if (!t) return;
    dx_buf_free(&t->r_hold);
    dx_buf_free(&t->t_hold);
    dx_buf_free(&t->pend);
    dx_buf_free(&t->out);
    dx_buf_free(&t->carry);
    dx_buf_free(&t->call);
    dx_buf_free(&t->args);
    dx_free(t->ev);
    dx_free(t->pub);
    dx_free(t);
}

/* A feed's events start with the character bytes the last one held. */
static void begin_events(oai_tools *t)
{
    dx_buf_reset(&t->out);
    t->n_ev = 0;
    if (t->carry.len) emit_text(t, t->carry_kind, t->carry.data, t->carry.len);
    dx_buf_reset(&t->carry);
}

/* Text that ends inside a UTF-8 character keeps those bytes for the next
 * feed, so that every event's text can be sent as it is. */
static void hold_partial_char(oai_tools *t)
{
    ev_rec *e = t->n_ev ? &t->ev[t->n_ev - 1] : NULL;
    if (!e || (e->kind != OAI_TOOLS_EV_CONTENT && e->kind != OAI_TOOLS_EV_REASONING)) return;
    size_t k = dx_utf8_incomplete_tail((const uint8_t *)t->out.data + e->off, e->len);
    if (!k) return;
    set_err(t, dx_buf_append(&t->carry, t->out.data + e->off + e->len - k, k));
    t->carry_kind = e->kind;
    if (!(e->len -= k)) t->n_ev--;
}

static int end_events(oai_tools *t, const oai_tools_ev **ev, size_t *n_ev)
{
    *ev = NULL, *n_ev = 0;
    if (!t->err && t->n_ev > t->cap_pub) {
        oai_tools_ev *p = dx_realloc(t->pub, t->n_ev * sizeof *p);
        if (!p)
            set_err(t, DX_ENOMEM);
        else
            t->pub = p, t->cap_pub = t->n_ev;
    }
    if (t->err) return dx_errf(t->err, "tool-call parser: %s", dx_strerror(t->err));
    for (size_t i = 0; i < t->n_ev; i++) {
        const ev_rec *e = &t->ev[i];
        t->pub[i] = (oai_tools_ev){
            .kind = e->kind, .index = e->index, .text = t->out.data + e->off, .len = e->len};
        if (e->kind == OAI_TOOLS_EV_CALL) t->pub[i].id = t->out.data + e->id_off;
    }
    *ev = t->pub, *n_ev = t->n_ev;
    return 0;
}

int oai_tools_feed(oai_tools *t, const char *text, size_t len, const oai_tools_ev **ev,
                   size_t *n_ev)
{
    if (t->finished) {
        *ev = NULL, *n_ev = 0;
        return dx_errf(DX_EINVAL, "tool-call parser: text fed after the answer finished");
    }
    if (!t->err) {
        begin_events(t);
        r_feed(t, text, len);
        hold_partial_char(t);
    }
    return end_events(t, ev, n_ev);
}

int oai_tools_finish(oai_tools *t, const oai_tools_ev **ev, size_t *n_ev)
{
    if (!t->err && !t->finished) {
        begin_events(t);
        r_finish(t);
        t_finish(t);
    } else if (!t->err) {
        t->n_ev = 0;
    }
    t->finished = 1;
    return end_events(t, ev, n_ev);
}

size_t oai_tools_n_calls(const oai_tools *t)
{
    return t->n_calls;
}

const char *oai_tools_finish_reason(const oai_tools *t, const char *finish)
{
    return t->n_calls ? "tool_calls" : finish;
}

/* ---- one-shot ------------------------------------------------------------- */

typedef struct {
    dx_buf content, reasoning;
    oai_tools_result *r;
    size_t cap;
} collector;

static int collect(collector *c, const oai_tools_ev *ev, size_t n)
{
    oai_tools_result *r = c->r;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const oai_tools_ev *e = &ev[i];
        if (e->kind == OAI_TOOLS_EV_CONTENT) {
            rc = dx_buf_append(&c->content, e->text, e->len);
        } else if (e->kind == OAI_TOOLS_EV_REASONING) {
            rc = dx_buf_append(&c->reasoning, e->text, e->len);
        } else if (e->kind == OAI_TOOLS_EV_CALL) {
            DX_ASSERT(e->index == r->n_calls);
            if (r->n_calls == c->cap) {
                size_t cap = c->cap ? 2 * c->cap : 4;
                oai_tool_call *p = dx_realloc(r->calls, cap * sizeof *p);
                if (!p) return dx_errf(DX_ENOMEM, "tool calls: %zu calls", cap);
                r->calls = p, c->cap = cap;
            }
            oai_tool_call *call = &r->calls[r->n_calls];
            memset(call, 0, sizeof *call);
            snprintf(call->id, sizeof call->id, "%s", e->id);
            r->n_calls++;
            if (!(call->name = dx_strndup(e->text, e->len)))
                rc = dx_errf(DX_ENOMEM, "tool call name");
        } else { /* OAI_TOOLS_EV_ARGS: each call's arguments come in one event */
            DX_ASSERT(e->index + 1 == r->n_calls && !r->calls[e->index].arguments);
            oai_tool_call *call = &r->calls[e->index];
            if (!(call->arguments = dx_strndup(e->text, e->len)))
                rc = dx_errf(DX_ENOMEM, "tool call arguments");
            call->arguments_len = e->len;
        }
    }
    return rc;
}

int oai_tools_parse(const oai_tools_opts *o, const char *text, size_t len, oai_tools_result *r)
{
    memset(r, 0, sizeof *r);
    collector c = {.r = r};
    dx_buf_init(&c.content, 0);
    dx_buf_init(&c.reasoning, 0);
    oai_tools *t = oai_tools_create(o);
    const oai_tools_ev *ev = NULL;
    size_t n = 0;
    int rc = t ? oai_tools_feed(t, text, len, &ev, &n) : dx_errf(DX_ENOMEM, "tool-call parser");
    if (!rc) rc = collect(&c, ev, n);
    if (!rc) rc = oai_tools_finish(t, &ev, &n);
    if (!rc) rc = collect(&c, ev, n);
    oai_tools_destroy(t);
    if (!rc) {
        r->content_len = c.content.len;
        r->content = c.content.len ? dx_buf_take(&c.content) : NULL;
        r->reasoning_len = c.reasoning.len;
        r->reasoning = c.reasoning.len ? dx_buf_take(&c.reasoning) : NULL;
    }
    dx_buf_free(&c.content);
    dx_buf_free(&c.reasoning);
    if (!rc) return 0;
    oai_tools_result_free(r);
    return rc == DX_ENOMEM ? dx_errf(rc, "tool-call parser: out of memory") : rc;
}

void oai_tools_result_free(oai_tools_result *r)
{
    for (size_t i = 0; i < r->n_calls; i++) {
        dx_free(r->calls[i].name);
        dx_free(r->calls[i].arguments);
    }
    dx_free(r->calls);
    dx_free(r->content);
    dx_free(r->reasoning);
    memset(r, 0, sizeof *r);
}

/* ---- JSON ----------------------------------------------------------------- */

static int put_call(dx_buf *b, const char *id, const char *name, size_t name_len)
{
    int rc = dx_buf_puts(b, "\"id\":");
    if (!rc) rc = oai_json_str(b, id, strlen(id));
    if (!rc) rc = dx_buf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
    if (!rc) rc = oai_json_str(b, name, name_len);
    return rc ? rc : dx_buf_puts(b, ",\"arguments\":");
}

int oai_tools_message_json(dx_buf *b, const oai_tools_result *r)
{
    int rc = dx_buf_puts(b, "\"content\":");
    if (!rc)
        rc = r->content || !(r->n_calls || r->reasoning)
                 ? oai_json_str(b, r->content ? r->content : "", r->content_len)
                 : dx_buf_puts(b, "null");
    if (!rc && r->reasoning) {
        rc = dx_buf_puts(b, ",\"reasoning_content\":");
        if (!rc) rc = oai_json_str(b, r->reasoning, r->reasoning_len);
    }
    if (!rc && r->n_calls) rc = dx_buf_puts(b, ",\"tool_calls\":[");
    for (size_t i = 0; !rc && i < r->n_calls; i++) {
        const oai_tool_call *c = &r->calls[i];
        rc = dx_buf_puts(b, i ? ",{" : "{");
        if (!rc) rc = put_call(b, c->id, c->name, strlen(c->name));
        if (!rc) rc = oai_json_str(b, c->arguments, c->arguments_len);
        if (!rc) rc = dx_buf_puts(b, "}}");
    }
    if (!rc && r->n_calls) rc = dx_buf_putc(b, ']');
    return rc;
}

int oai_tools_ev_json(dx_buf *b, const oai_tools_ev *ev)
{
    int rc;
    switch (ev->kind) {
    case OAI_TOOLS_EV_REASONING:
        rc = dx_buf_puts(b, "\"reasoning_content\":");
        return rc ? rc : oai_json_str(b, ev->text, ev->len);
    case OAI_TOOLS_EV_CONTENT:
        rc = dx_buf_puts(b, "\"content\":");
        return rc ? rc : oai_json_str(b, ev->text, ev->len);
    case OAI_TOOLS_EV_CALL:
        rc = dx_buf_printf(b, "\"tool_calls\":[{\"index\":%u,", ev->index);
        if (!rc) rc = put_call(b, ev->id, ev->text, ev->len);
        return rc ? rc : dx_buf_puts(b, "\"\"}}]");
    case OAI_TOOLS_EV_ARGS:
        rc = dx_buf_printf(b,
                           "\"tool_calls\":[{\"index\":%u,\"function\":{\"arguments\":", ev->index);
        if (!rc) rc = oai_json_str(b, ev->text, ev->len);
        return rc ? rc : dx_buf_puts(b, "}}]");
    }
    DX_ASSERT(!"oai_tools: unknown event kind");
    return dx_errf(DX_EINVAL, "oai_tools: event kind %d", (int)ev->kind);
}

/* ---- options ---------------------------------------------------------------- */

int oai_tools_fmt_parse(const char *name, enum oai_tools_fmt *out)
{
    static const struct {
        const char *name;
        enum oai_tools_fmt fmt;
    } k_names[] = {{"none", OAI_TOOLS_NONE},
                   {"qwen", OAI_TOOLS_QWEN},
                   {"hermes", OAI_TOOLS_QWEN},
                   {"llama3", OAI_TOOLS_LLAMA3},
                   {"llama3_json", OAI_TOOLS_LLAMA3}};
    for (size_t i = 0; i < DX_ARRAY_LEN(k_names); i++)
        if (!strcmp(name, k_names[i].name)) {
            *out = k_names[i].fmt;
            return 0;
        }
    return dx_errf(DX_EINVAL,
                   "tool-call format '%s': expected none, qwen (hermes) or llama3 "
                   "(llama3_json)",
                   name);
}

int oai_tools_think_open(const char *prompt, size_t len)
{
    int open = 0;
    const char *p = prompt, *end = prompt + len;
    while ((p = memchr(p, '<', (size_t)(end - p)))) {
        size_t left = (size_t)(end - p);
        if (left >= sizeof k_think - 1 && !memcmp(p, k_think, sizeof k_think - 1)) open = 1;
        if (left >= sizeof k_unthink - 1 && !memcmp(p, k_unthink, sizeof k_unthink - 1)) open = 0;
        p++;
    }
    return open;
}
