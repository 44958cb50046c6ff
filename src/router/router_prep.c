/* router_prep: a completion's preparation, off the loop.  Parsing (the
 * node's own validation, oai_req), the conversation's keys and the tenant's
 * cache_salt, the bodies sent upstream and the token count take
 * milliseconds per megabyte: they run on the router's work pool
 * (http/work_pool.h) while the loop serves other streams.  The loop keeps
 * what is its own: the conversation map, the nodes, the answer.
 *
 * Everything here runs on a pool thread and touches only the request and
 * what of the router is immutable once it runs (the config, the tokenizer,
 * the tenants' secret, the keys); router_flow.c's prep_done takes over on
 * the loop. */
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_keys.h"
#include "model/model_chat.h"
#include "router/router_flow_priv.h"

/* A prefill body is worth preparing: prefill nodes are configured or may
 * be discovered (immutable: read on the preparation threads). */
static int may_prefill(const router *r)
{
    return r->cfg.n_prefill > 0 || r->cfg.discover != NULL;
}

/* Prompt tokens: exact with the tokenizer, else ~4 bytes a token. */
static uint32_t count_tokens(const router *r, const oai_req *o)
{
    if (o->prompt_ids) return (uint32_t)o->n_prompt_ids;
    if (r->tok) {
        tok_ids v;
        tok_ids_init(&v);
        int rc;
        if (o->kind == OAI_COMPLETION) {
            rc = tok_encode(model_tokenizer(r->tok), o->prompt, o->prompt_len, TOK_ADD_SPECIAL, &v);
        } else {
            chat_msg *m = dx_calloc(o->n_msgs, sizeof *m);
            rc = m ? 0 : dx_errf(DX_ENOMEM, "router: %zu messages", o->n_msgs);
            for (size_t i = 0; m && i < o->n_msgs; i++)
                m[i] = (chat_msg){o->msgs[i].role, o->msgs[i].content, o->msgs[i].content_len};
            /* the node's own way: the model's template with the request's extras */
            model_chat_extra x = {json_object_get(o->root, "messages"),
                                  o->tool_choice == OAI_CHOICE_NONE ? NULL : o->tools,
                                  o->template_kwargs};
            if (m) rc = model_chat_encode(r->tok, m, o->n_msgs, &x, 1, NULL, NULL, &v);
            dx_free(m);
        }
        size_t n = v.n;
        tok_ids_free(&v);
        if (rc == 0) return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    }
    size_t bytes = o->prompt_len;
    for (size_t i = 0; i < o->n_msgs; i++) bytes += o->msgs[i].content_len + 8; /* + markup */
    return (uint32_t)((bytes + 3) / 4);
}

/* The conversation id: the header (copied on the loop), else the body's. */
static int conversation_id(rt_req *q, json_t *root, const char **id, size_t *len)
{
    json_t *b = json_object_get(root, "conversation_id");
    *id = NULL;
    if (b && !json_is_null(b) && !json_is_string(b)) {
        snprintf(q->prep_msg, sizeof q->prep_msg, "conversation_id: expected a string");
        snprintf(q->prep_param, sizeof q->prep_param, "conversation_id");
        return 400;
    }
    if (q->conv_hdr && *q->conv_hdr) {
        *id = q->conv_hdr;
        *len = strlen(q->conv_hdr);
    } else if (json_is_string(b) && json_string_length(b) > 0) {
        *id = json_string_value(b);
        *len = json_string_length(b);
    }
    return 0;
}

/* The caller's tenant: the API key it presented when keys are set, else
 * its whole Authorization value (clients may keep apart by sending
 * different ones), else none. */
static void tenant_ns(rt_req *q, router_key *ns)
{
    router *r = q->r;
    const http_auth_result *who = &q->who;
    if (who->internal)
        router_key_ns(r->ns_secret, ROUTER_TENANT_INTERNAL, NULL, 0, ns);
    else if (who->key >= 0)
        router_key_ns(r->ns_secret, ROUTER_TENANT_KEY, http_auth_key_digest(r->auth, who->key),
                      DX_KEY_DIGEST, ns);
    else if (q->auth)
        router_key_ns(r->ns_secret, ROUTER_TENANT_HEADER, q->auth, strlen(q->auth), ns);
    else
        router_key_ns(r->ns_secret, ROUTER_TENANT_NONE, NULL, 0, ns);
}

/* The nodes' prefix-cache namespace for the tenant (and the client's own
 * cache_salt): a tenant's requests never reuse KV computed for another's.
 * A caller with no tenant and no salt shares the default namespace. */
static int set_cache_salt(rt_req *q, const router_key *ns, oai_req *o)
{
    const http_auth_result *who = &q->who;
    int tenant = who->internal || who->key >= 0 || q->auth;
    if (!tenant && !o->cache_salt) return 0;
    char salt[33];
    router_key_salt(q->r->ns_secret, ns, o->cache_salt ? o->cache_salt : "", o->cache_salt_len,
                    salt);
    o->cache_salt = NULL; /* it pointed into the member replaced now */
    o->cache_salt_len = 0;
    return json_object_set_new(o->root, "cache_salt", json_string(salt)) < 0 ? 500 : 0;
}

/* The request's keys: its id's, or one per prefix of its messages (looked
 * up longest first on the loop), in the caller's tenant; and the tenant's
 * cache_salt set in the body. */
static int make_keys(rt_req *q, oai_req *o)
{
    router *r = q->r;
    uint64_t seed = r->cfg.key_seed;
    const char *id;
    size_t id_len;
    int st = conversation_id(q, o->root, &id, &id_len);
    if (st) return st;
    router_key ns;
    tenant_ns(q, &ns);
    if ((st = set_cache_salt(q, &ns, o))) return st;
    if (id) {
        q->key_kind = KEY_ID;
        router_key_id(seed, &ns, id, id_len, &q->key);
        return 0;
    }
    if (o->kind != OAI_CHAT) return 0;
    q->key_kind = KEY_CHAT;
    if (!(q->keys = dx_malloc(o->n_msgs * sizeof *q->keys))) return 500;
    router_key_chat_begin(seed, &ns, o->model, strlen(o->model), &q->chain);
    for (size_t i = 0; i < o->n_msgs; i++) {
        router_key_chat_add(seed, &q->chain, o->msgs[i].role, o->msgs[i].content,
                            o->msgs[i].content_len);
        q->keys[i] = q->chain;
    }
    q->n_keys = o->n_msgs;
    return 0;
}

/* The prefill node's body, but for its kv_transfer_params (spliced in on
 * the loop, once the conversation's entry is known): one token, no stream. */
static int build_prefill_base(rt_req *q, json_t *root)
{
    json_object_set_new(root, "max_tokens", json_integer(1));
    json_object_del(root, "max_completion_tokens");
    json_object_set_new(root, "stream", json_false());
    json_object_del(root, "stream_options");
    return router_json_append(&q->pbase, root);
}

/* A Responses request: parsed, continued from its previous response (the
 * caller's own, from the store: a blocking lookup, which is why it is
 * here), and parsed as the chat request it becomes. */
static int parse_responses(rt_req *q, const char *body, size_t len, oai_req *o, oai_err *err)
{
    oai_parse_opts opts = {.n_vocab = 0};
    oai_rsp_req_free(&q->rsp);
    json_decref(q->chat_doc);
    q->chat_doc = NULL;
    int rc = oai_rsp_parse(body, len, &q->rsp, err);
    json_t *prev = NULL;
    if (!rc && q->rsp.previous_response_id) {
        rc = router_rsp_messages(q->r->responses, q->has_tenant ? q->tenant : NULL,
                                 q->rsp.previous_response_id, &prev);
        if (rc == 0) {
            rc = oai_rsp_err_previous(err, q->rsp.previous_response_id);
            err->status = 404;
            q->prep_code = "previous_response_not_found";
        } else if (rc == 1) {
            rc = 0;
        } else {
            err->status = 503;
            snprintf(err->message, sizeof err->message, "%s", dx_errmsg());
        }
    }
    if (!rc) rc = oai_rsp_to_chat(&q->rsp, prev, &q->chat_doc, err);
    json_decref(prev);
    if (!rc) rc = oai_rsp_chat_parse(q->chat_doc, &opts, o, err);
    return rc;
}

/* The body as the chat (or completions) request it is or says. */
static int parse_front(rt_req *q, const char *body, size_t len, oai_req *o, oai_err *err)
{
    oai_parse_opts opts = {.n_vocab = 0};
    if (q->front == OAI_FRONT_RESPONSES) return parse_responses(q, body, len, o, err);
    if (q->front == OAI_FRONT_MESSAGES) {
        oai_anth_opts ao = {.count_tokens = q->count_only};
        oai_anth_info info;
        return oai_anth_req_parse(body, len, &ao, &opts, o, &info, err);
    }
    return oai_req_parse(q->kind, body, len, &opts, o, err);
}

/* The node's validation, except that a client's kv_transfer_params are
 * dropped whatever they hold (only the router issues them): a body whose
 * only fault is a malformed one is parsed again without it. */
static int parse_body(rt_req *q, const char *body, size_t len, oai_req *o, oai_err *err)
{
    int rc = parse_front(q, body, len, o, err);
    if (rc == 0 || strcmp(err->param, "kv_transfer_params") != 0) return rc;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, &je); /* as the first parse */
    dx_buf b;
    dx_buf_init(&b, 0);
    json_object_del(root, "kv_transfer_params");
    if (router_json_append(&b, root) == 0) rc = parse_front(q, b.data, b.len, o, err);
    json_decref(root);
    dx_buf_free(&b);
    return rc;
}

/* Everything before a node is chosen that is not the conversation map's;
 * q->prep_status 0, or the HTTP status with prep_msg. */
static void prepare(rt_req *q)
{
    oai_err err;
    if (parse_body(q, q->in_body, q->in_len, &q->o, &err) < 0) {
        q->prep_status = err.status ? err.status : 503;
        snprintf(q->prep_msg, sizeof q->prep_msg, "%s", err.message);
        snprintf(q->prep_param, sizeof q->prep_param, "%s", err.param);
        return;
    }
    q->stream = q->o.stream;
    if (q->front != OAI_FRONT_CHAT && !(q->client_model = dx_strdup(q->o.model))) {
        q->prep_status = 500;
        return;
    }
    int st = make_keys(q, &q->o);
    if (st) {
        q->prep_status = st;
        return;
    }
    /* only the router issues kv_transfer_params; conversation_id is the router's */
    json_t *root = q->o.root;
    json_object_del(root, "kv_transfer_params");
    json_object_del(root, "conversation_id");
    q->o.kv_transfer_params = NULL;
    q->prompt_tokens = count_tokens(q->r, &q->o); /* the tokenizer is immutable */
    if (router_json_append(&q->body, root) < 0 ||
        (may_prefill(q->r) && build_prefill_base(q, root) < 0))
        q->prep_status = 500;
}

/* Pool thread: the preparation, its memory counted as it grows in the HTTP
 * buffer budget (http_conn_meter): a parsed tree is many times its body.
 * What it leaves (the tree, the bodies for the nodes) stays counted until
 * the loop has sent them on (rt_req_meter_put). */
void rt_prep_run(work_job *j)
{
    rt_req *q = (rt_req *)((char *)j - offsetof(rt_req, job));
    q->meter = http_conn_meter(q->held);
    dx_alloc_meter_begin(q->meter);
    prepare(q);
    int why = dx_alloc_meter_refused();
    q->metered = dx_alloc_meter_keep();
    q->prep_refused = why;
    if (!why) return;
    q->prep_status = 503; /* with Retry-After, as when a body crosses the budget */
    snprintf(q->prep_msg, sizeof q->prep_msg, "%s", HTTP_BUSY_BUFFERS);
    q->prep_param[0] = 0;
    q->prep_code = NULL;
}
