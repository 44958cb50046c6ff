/* node_prep: a completion's (or /tokenize's) preparation, on a thread of
 * the server's work pool (node_server_priv.h).
 *
 * Parsing a body, rendering the chat template and tokenising take time in
 * proportion to the request (~0.2 s for a 4 MiB body), so they run here
 * while the loop goes on serving the others' streams; several requests are
 * prepared at once, so everything here is reentrant: it writes only to its
 * own request (never to q->conn, which is the loop's) and reads only what
 * the server does not change while serving.  The loop picks the outcome up
 * in the job's done (node_server.c). */
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_clock.h"
#include "node/node_server_priv.h"
#include "oai/oai_anth.h"
#include "oai/oai_rsp.h"

static int prompt_error(const oai_req *o, const char *msg, oai_err *err)
{
    err->status = 400;
    snprintf(err->message, sizeof err->message, "%s", msg);
    snprintf(err->param, sizeof err->param, o->kind == OAI_CHAT ? "messages" : "prompt");
    return dx_errf(DX_EINVAL, "%s", msg);
}

/* Tokenises the request's prompt into q->prompt (token-faithfully for chat:
 * replies through the P/D params' sequence and the node's memory).  A 4xx
 * is reported through *err. */
static int encode_prompt(node_server *s, node_req *q, oai_err *err)
{
    const oai_req *o = &q->o;
    int rc;
    size_t failed = dx_alloc_failed_count();
    if (o->kind == OAI_COMPLETION && o->prompt_ids) {
        q->prompt = dx_memdup(o->prompt_ids, o->n_prompt_ids * sizeof *q->prompt);
        q->n_prompt = o->n_prompt_ids;
        rc = q->prompt ? 0 : dx_errf(DX_ENOMEM, "prompt of %zu tokens", o->n_prompt_ids);
    } else if (o->kind == OAI_COMPLETION) {
        rc = s->be.encode_text(s->be.self, o->prompt, o->prompt_len, &q->prompt, &q->n_prompt);
    } else {
        chat_msg *msgs = dx_malloc(o->n_msgs * sizeof *msgs);
        if (!msgs) return dx_errf(DX_ENOMEM, "chat: %zu messages", o->n_msgs);
        for (size_t i = 0; i < o->n_msgs; i++)
            msgs[i] = (chat_msg){o->msgs[i].role, o->msgs[i].content, o->msgs[i].content_len};
        /* what the template sees besides roles and texts; vLLM leaves the
         * tools out of the prompt when tool_choice is "none" */
        model_chat_extra x = {json_object_get(o->root, "messages"),
                              o->tool_choice == OAI_CHOICE_NONE ? NULL : o->tools,
                              o->template_kwargs};
        hist_src src;
        node_pd_view v;
        node_hooks_view(q, &v);
        node_pd_hist_src(&s->pd, &q->pd, &v, &src);
        rc = s->be.encode_chat(s->be.self, msgs, o->n_msgs, &x, hist_reply, &src, &q->prompt,
                               &q->n_prompt);
        node_pd_hist_done(&q->pd, &src);
        hist_src_free(&src);
        dx_free(msgs);
    }
    /* the tokenizer and the template report a failed allocation as they
     * can: one seen during the work makes it the server's fault, a 503 */
    if (rc < 0 && (rc == DX_ENOMEM || dx_alloc_failed_count() != failed)) {
        err->status = 503;
        snprintf(err->message, sizeof err->message, "out of memory; try again");
        err->param[0] = 0;
        rc = dx_errf(DX_ENOMEM, "out of memory preparing the prompt");
    }
    if (rc == DX_EINVAL) rc = prompt_error(o, dx_errmsg(), err);
    if (rc == 0 && q->n_prompt == 0) rc = prompt_error(o, "the prompt is empty", err);
    if (rc < 0) {
        dx_free(q->prompt);
        q->prompt = NULL;
        q->n_prompt = 0;
    }
    return rc;
}

/* What the answer needs from the parsed request, and P/D's view of it
 * (node_hooks_view), which outlives the parsed request. */
static int req_take_parsed(node_req *q)
{
    q->stream = q->o.stream;
    q->include_usage = q->o.stream && q->o.include_usage;
    q->logprobs = q->o.logprobs;
    q->top_logprobs = q->o.top_logprobs;
    q->has_max_tokens = q->o.has_max_tokens;
    q->max_tokens = q->o.max_tokens;
    /* the stop strings outlive the parsed request: a finish names the one
     * that ended it (stop_reason) */
    for (size_t i = 0; i < q->o.n_stop; i++)
        if (dx_buf_append(&q->stops, q->o.stop[i], strlen(q->o.stop[i]) + 1))
            return dx_errf(DX_ENOMEM, "out of memory for the stop strings");
    q->n_stops = (uint32_t)q->o.n_stop;
    if (q->front != OAI_FRONT_CHAT && !(q->client_model = dx_strdup(q->o.model)))
        return dx_errf(DX_ENOMEM, "out of memory");
    return 0;
}

/* A Responses request: parsed, continued from its previous response (the
 * caller's own, from the store), translated into the chat request it says
 * and parsed as that. */
static int parse_responses(node_server *s, node_req *q, const oai_parse_opts *opts, oai_err *err)
{
    int rc = oai_rsp_parse(q->prep.body, q->prep.len, &q->rsp, err);
    json_t *prev = NULL;
    if (!rc && q->rsp.previous_response_id) {
        rc = oai_rsp_store_messages(s->responses, q->has_tenant ? q->tenant : NULL,
                                    q->rsp.previous_response_id, dx_now_s(), &prev);
        if (rc == 0) { /* unknown, expired, deleted, another tenant's, or store: false */
            rc = oai_rsp_err_previous(err, q->rsp.previous_response_id);
            err->status = 404;
            q->prep_code = "previous_response_not_found";
        } else if (rc == 1) {
            rc = 0;
        }
    }
    if (!rc) rc = oai_rsp_to_chat(&q->rsp, prev, &q->chat_doc, err);
    json_decref(prev);
    if (!rc) rc = oai_rsp_chat_parse(q->chat_doc, opts, &q->o, err);
    return rc;
}

/* The request's body as the chat (or completions) request it is or says. */
static int parse_body(node_server *s, node_req *q, const oai_parse_opts *opts, oai_err *err)
{
    if (q->front == OAI_FRONT_RESPONSES) return parse_responses(s, q, opts, err);
    if (q->front == OAI_FRONT_MESSAGES) {
        oai_anth_opts ao = {.count_tokens = q->count_only};
        oai_anth_info info;
        return oai_anth_req_parse(q->prep.body, q->prep.len, &ao, opts, &q->o, &info, err);
    }
    return oai_req_parse(q->kind, q->prep.body, q->prep.len, opts, &q->o, err);
}

/* POST /tokenize takes a completion's "prompt" or a chat's "messages". */
static enum oai_kind tokenize_kind(const node_req *q)
{
    json_error_t je;
    json_t *root = json_loadb(q->prep.body, q->prep.len, JSON_ALLOW_NUL, &je);
    enum oai_kind kind = json_object_get(root, "messages") ? OAI_CHAT : OAI_COMPLETION;
    json_decref(root);
    return kind;
}

/* The warning header for keywords a non-strict schema ignored: one line,
 * printable ASCII only (the lines name the client's own property names),
 * bounded. */
static char *warn_header(const char *w)
{
    char v[NODE_WARN_MAX];
    size_t n = 0, len = strlen(w);
    for (size_t i = 0; i < len && n + 4 < sizeof v; i++) {
        unsigned char c = (unsigned char)w[i];
        if (c == '\n') {
            if (i + 1 < len) v[n++] = ';', v[n++] = ' ';
        } else {
            v[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
        }
    }
    v[n] = 0;
    dx_buf b;
    dx_buf_init(&b, 0);
    if (dx_buf_printf(&b, "X-Duplex-Warning: %s\r\n", v)) {
        dx_buf_free(&b);
        return NULL; /* a warning lost to memory pressure is not worth failing for */
    }
    return dx_buf_take(&b);
}

/* Pool thread: the request's structured-output constraint (response_format,
 * a forced tool call, grammar) compiled — or found in the cache — and the
 * vocabulary prepared for it, so nothing of it runs on the loop. */
static int prep_grammar(node_server *s, node_req *q, oai_err *err)
{
    int rc = node_gram_request(s->grams, &q->o, s->be.tool_fmt, q->topts.think_open, &q->gram, err);
    if (rc < 0 || !q->gram) return rc;
    if (s->be.gram_prepare && (rc = s->be.gram_prepare(s->be.self)) < 0) {
        err->status = 500;
        snprintf(err->message, sizeof err->message, "%s", dx_errmsg());
        return rc;
    }
    if (node_gram_warnings(q->gram)[0]) q->warn_hdr = warn_header(node_gram_warnings(q->gram));
    return 0;
}

/* Pool thread: parse, check, P/D params, the prompt's tokens, the grammar
 * (node_server_priv.h). */
void node_prep_run(work_job *j)
{
    node_req *q = (node_req *)((char *)j - offsetof(node_req, prep.job));
    node_server *s = q->srv;
    oai_err *err = &q->prep_err;
    oai_parse_opts opts = {.n_vocab = s->be.n_vocab};
    if (q->tokenize && q->front == OAI_FRONT_CHAT) q->kind = tokenize_kind(q);
    q->prep_rc = parse_body(s, q, &opts, err);
    if (q->prep_rc < 0) {
        if (!err->status) { /* out of memory inside a translation */
            err->status = 503;
            snprintf(err->message, sizeof err->message, "out of memory; try again");
        }
        return;
    }
    if (!q->tokenize && strcmp(q->o.model, node_served_name(s)) &&
        strcmp(q->o.model, s->be.model_name)) {
        err->status = 404;
        snprintf(err->message, sizeof err->message, "The model '%.160s' does not exist",
                 q->o.model);
        snprintf(err->param, sizeof err->param, "model");
        q->prep_code = "model_not_found";
        q->prep_rc = DX_ENOENT;
        return;
    }
    if ((q->prep_rc = req_take_parsed(q)) < 0) {
        err->status = 503;
        snprintf(err->message, sizeof err->message, "out of memory; try again");
        return;
    }
    http_auth_cache_salt(s->cfg.auth, &q->who, q->o.cache_salt, q->o.cache_salt_len, q->salt);
    node_pd_view v;
    node_hooks_view(q, &v);
    q->prep_rc = node_pd_parse(&s->pd, &q->pd, &v, q->o.kv_transfer_params, err);
    if (!q->prep_rc) q->prep_rc = encode_prompt(s, q, err);
    if (!q->prep_rc && !q->tokenize) node_answer_parse_opts(s, q);
    if (!q->prep_rc && !q->tokenize) q->prep_rc = prep_grammar(s, q, err);
    if (q->prep_rc < 0 && q->front == OAI_FRONT_MESSAGES && err->param[0] &&
        strncmp(err->param, "messages[", 9))
        oai_anth_err_from_chat(err);      /* a schema's keyword, in the door's terms */
    if (q->prep_rc < 0 && !err->status) { /* the message is this thread's: keep it */
        err->status = 500;
        snprintf(err->message, sizeof err->message, "%s", dx_errmsg());
    }
}
