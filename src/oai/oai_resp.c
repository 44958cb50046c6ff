/* oai_resp: OpenAI response JSON and SSE framing (see .h). */
#include "oai/oai_resp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"
#include "base/dx_utf8.h"

void oai_make_id(char *out, size_t cap, const char *prefix)
{
    /* splitmix64 over time and a counter: unique enough for ids, not secret */
    static _Thread_local uint64_t state;
    if (!state) state = dx_now_ns() ^ ((uint64_t)time(NULL) << 32) ^ (uint64_t)(uintptr_t)out;
    uint64_t r[2];
    for (int i = 0; i < 2; i++) r[i] = dx_splitmix64(&state);
    snprintf(out, cap, "%s-%016llx%016llx", prefix, (unsigned long long)r[0],
             (unsigned long long)r[1]);
}

int oai_json_str(dx_buf *b, const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    int rc = dx_buf_putc(b, '"');
    size_t i = 0;
    while (rc == 0 && i < len) {
        size_t run = i; /* copy plain bytes in one go */
        while (run < len && s[run] >= 0x20 && s[run] < 0x80 && s[run] != '"' && s[run] != '\\')
            run++;
        if (run > i) {
            rc = dx_buf_append(b, s + i, run - i);
            i = run;
            continue;
        }
        unsigned c = s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            rc = dx_buf_append(b, e, 2);
            i++;
        } else if (c < 0x20) {
            const char *esc = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
            rc = esc ? dx_buf_puts(b, esc) : dx_buf_printf(b, "\\u%04x", c);
            i++;
        } else {
            size_t n = dx_utf8_seq_len(s + i, len - i);
            rc = n ? dx_buf_append(b, s + i, n) : dx_buf_puts(b, "\\ufffd");
            i += n ? n : 1;
        }
    }
    return rc ? rc : dx_buf_putc(b, '"');
}

static const char *object_name(const oai_meta *m, int chunk)
{
    if (m->kind == OAI_COMPLETION) return "text_completion";
    return chunk ? "chat.completion.chunk" : "chat.completion";
}

static int put_head(dx_buf *b, const oai_meta *m, int chunk)
{
    int rc = dx_buf_puts(b, "{\"id\":");
    if (!rc) rc = oai_json_str(b, m->id, strlen(m->id));
    if (!rc)
        rc = dx_buf_printf(b,
                           ",\"object\":\"%s\",\"created\":%lld,\"model\":", object_name(m, chunk),
                           (long long)m->created);
    if (!rc) rc = oai_json_str(b, m->model, strlen(m->model));
    return rc;
}

static int put_usage(dx_buf *b, const oai_usage *u)
{
    return dx_buf_printf(b,
                         "\"usage\":{\"prompt_tokens\":%u,\"completion_tokens\":%u,"
                         "\"total_tokens\":%u,\"prompt_tokens_details\":{\"cached_tokens\":%u}}",
                         u->prompt, u->completion, u->prompt + u->completion, u->cached);
}

static int put_extra(dx_buf *b, const char *extra)
{
    return extra && *extra ? dx_buf_printf(b, ",%s", extra) : 0;
}

/* ,"logprobs":...,"finish_reason":...} — the end of a choice. */
static int put_choice_end(dx_buf *b, const oai_choice *c)
{
    int rc = dx_buf_printf(b, ",\"logprobs\":%s", c->logprobs ? c->logprobs : "null");
    if (!rc && c->finish && c->stop_reason) { /* vLLM's: the stop string that ended it */
        rc = dx_buf_puts(b, ",\"stop_reason\":");
        if (!rc) rc = oai_json_str(b, c->stop_reason, strlen(c->stop_reason));
    }
    if (!rc)
        rc = c->finish ? dx_buf_printf(b, ",\"finish_reason\":\"%s\"}", c->finish)
                       : dx_buf_puts(b, ",\"finish_reason\":null}");
    return rc;
}

/* The chat message's or delta's members after "role": the raw ones, or
 * the content (none when content is 0). */
static int put_chat_fields(dx_buf *b, const oai_choice *c, int content, int first)
{
    if (c->raw) return *c->raw ? dx_buf_printf(b, "%s%s", first ? "" : ",", c->raw) : 0;
    if (!content) return 0;
    int rc = dx_buf_puts(b, first ? "\"content\":" : ",\"content\":");
    return rc ? rc : oai_json_str(b, c->text, c->len);
}

int oai_resp_full(dx_buf *b, const oai_meta *m, const oai_choice *c, const oai_usage *u,
                  const char *extra)
{
    int rc = put_head(b, m, 0);
    if (!rc) rc = dx_buf_puts(b, ",\"choices\":[{\"index\":0,");
    if (!rc && m->kind == OAI_CHAT) {
        rc = dx_buf_puts(b, "\"message\":{\"role\":\"assistant\"");
        if (!rc) rc = put_chat_fields(b, c, 1, 0);
        if (!rc) rc = dx_buf_putc(b, '}');
    } else if (!rc) {
        rc = dx_buf_puts(b, "\"text\":");
        if (!rc) rc = oai_json_str(b, c->text, c->len);
    }
    if (!rc) rc = put_choice_end(b, c);
    if (!rc) rc = dx_buf_puts(b, "],");
    if (!rc) rc = put_usage(b, u);
    if (!rc) rc = put_extra(b, extra);
    return rc ? rc : dx_buf_putc(b, '}');
}

int oai_sse_chunk(dx_buf *b, const oai_meta *m, const oai_choice *c, int role_first,
                  int with_usage_null, const char *extra)
{
    int rc = dx_buf_puts(b, "data: ");
    if (!rc) rc = put_head(b, m, 1);
    if (!rc) rc = dx_buf_puts(b, ",\"choices\":[{\"index\":0,");
    if (!rc && m->kind == OAI_CHAT) {
        rc = dx_buf_puts(b, role_first ? "\"delta\":{\"role\":\"assistant\"" : "\"delta\":{");
        /* a content member unless the chunk only finishes */
        if (!rc) rc = put_chat_fields(b, c, role_first || !c->finish || c->len, !role_first);
        if (!rc) rc = dx_buf_putc(b, '}');
    } else if (!rc) {
        rc = dx_buf_puts(b, "\"text\":");
        if (!rc) rc = oai_json_str(b, c->text, c->len);
    }
    if (!rc) rc = put_choice_end(b, c);
    if (!rc) rc = dx_buf_putc(b, ']');
    if (!rc && with_usage_null) rc = dx_buf_puts(b, ",\"usage\":null");
    if (!rc) rc = put_extra(b, extra);
    return rc ? rc : dx_buf_puts(b, "}\n\n");
}

/* "token":"...","logprob":x,"bytes":[...] */
static int put_lp_tok(dx_buf *b, const oai_lp_tok *t)
{
    int rc = dx_buf_puts(b, "\"token\":");
    if (!rc) rc = oai_json_str(b, t->bytes, t->len);
    if (!rc) rc = dx_buf_printf(b, ",\"logprob\":%.9g,\"bytes\":[", (double)t->logprob);
    for (size_t i = 0; !rc && i < t->len; i++)
        rc = dx_buf_printf(b, i ? ",%u" : "%u", (unsigned)(unsigned char)t->bytes[i]);
    return rc ? rc : dx_buf_putc(b, ']');
}

int oai_logprobs_json(dx_buf *b, enum oai_kind kind, const oai_lp_entry *e, size_t n,
                      size_t *text_offset)
{
    int rc;
    if (kind == OAI_CHAT) {
        rc = dx_buf_puts(b, "{\"content\":[");
        for (size_t i = 0; !rc && i < n; i++) {
            rc = dx_buf_puts(b, i ? ",{" : "{");
            if (!rc) rc = put_lp_tok(b, &e[i].tok);
            if (!rc) rc = dx_buf_puts(b, ",\"top_logprobs\":[");
            for (size_t k = 0; !rc && k < e[i].n_top; k++) {
                rc = dx_buf_puts(b, k ? ",{" : "{");
                if (!rc) rc = put_lp_tok(b, &e[i].top[k]);
                if (!rc) rc = dx_buf_putc(b, '}');
            }
            if (!rc) rc = dx_buf_puts(b, "]}");
        }
        return rc ? rc : dx_buf_puts(b, "]}");
    }
    /* the legacy completions form: parallel arrays */
    rc = dx_buf_puts(b, "{\"tokens\":[");
    for (size_t i = 0; !rc && i < n; i++) {
        if (i) rc = dx_buf_putc(b, ',');
        if (!rc) rc = oai_json_str(b, e[i].tok.bytes, e[i].tok.len);
    }
    if (!rc) rc = dx_buf_puts(b, "],\"token_logprobs\":[");
    for (size_t i = 0; !rc && i < n; i++)
        rc = dx_buf_printf(b, i ? ",%.9g" : "%.9g", (double)e[i].tok.logprob);
    if (!rc) rc = dx_buf_puts(b, "],\"top_logprobs\":[");
    for (size_t i = 0; !rc && i < n; i++) {
        rc = dx_buf_puts(b, i ? ",{" : "{");
        for (size_t k = 0; !rc && k < e[i].n_top; k++) {
            if (k) rc = dx_buf_putc(b, ',');
            if (!rc) rc = oai_json_str(b, e[i].top[k].bytes, e[i].top[k].len);
            if (!rc) rc = dx_buf_printf(b, ":%.9g", (double)e[i].top[k].logprob);
        }
        if (!rc) rc = dx_buf_putc(b, '}');
    }
    if (!rc) rc = dx_buf_puts(b, "],\"text_offset\":[");
    for (size_t i = 0; !rc && i < n; i++) {
        rc = dx_buf_printf(b, i ? ",%zu" : "%zu", *text_offset);
        *text_offset += e[i].tok.len;
    }
    return rc ? rc : dx_buf_puts(b, "]}");
}

int oai_sse_usage(dx_buf *b, const oai_meta *m, const oai_usage *u)
{
    int rc = dx_buf_puts(b, "data: ");
    if (!rc) rc = put_head(b, m, 1);
    if (!rc) rc = dx_buf_puts(b, ",\"choices\":[],");
    if (!rc) rc = put_usage(b, u);
    return rc ? rc : dx_buf_puts(b, "}\n\n");
}

int oai_sse_done(dx_buf *b)
{
    return dx_buf_puts(b, "data: [DONE]\n\n");
}

int oai_error_json(dx_buf *b, const char *message, const char *type, const char *param,
                   const char *code)
{
    int rc = dx_buf_puts(b, "{\"error\":{\"message\":");
    if (!rc) rc = oai_json_str(b, message, strlen(message));
    if (!rc) rc = dx_buf_puts(b, ",\"type\":");
    if (!rc) rc = oai_json_str(b, type, strlen(type));
    if (!rc) rc = dx_buf_puts(b, ",\"param\":");
    if (!rc) rc = param && *param ? oai_json_str(b, param, strlen(param)) : dx_buf_puts(b, "null");
    if (!rc) rc = dx_buf_puts(b, ",\"code\":");
    if (!rc) rc = code ? oai_json_str(b, code, strlen(code)) : dx_buf_puts(b, "null");
    return rc ? rc : dx_buf_puts(b, "}}");
}

int oai_sse_error(dx_buf *b, const char *message, const char *type)
{
    int rc = dx_buf_puts(b, "data: ");
    if (!rc) rc = oai_error_json(b, message, type, NULL, NULL);
    return rc ? rc : dx_buf_puts(b, "\n\n");
}

const char *oai_error_type(int status)
{
    if (status == 401) return "authentication_error";
    if (status == 429) return "rate_limit_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

int oai_models_json(dx_buf *b, const char *model, int64_t created)
{
    int rc = dx_buf_puts(b, "{\"object\":\"list\",\"data\":[{\"id\":");
    if (!rc) rc = oai_json_str(b, model, strlen(model));
    if (!rc)
        rc = dx_buf_printf(b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"duplex\"}]}",
                           (long long)created);
    return rc;
}
