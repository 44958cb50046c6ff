/* kvtp: kv_transfer_params parsing and writing (see .h). */
#include "node/kvtp.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "oai/oai_resp.h"

static int bad(oai_err *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A 400 naming the field: "kv_transfer_params.FIELD: what", both in *err
 * and as the thread's message. */
static int bad(oai_err *err, const char *field, const char *fmt, ...)
{
    err->status = 400;
    snprintf(err->param, sizeof err->param, "kv_transfer_params.%s", field);
    va_list ap;
    va_start(ap, fmt);
    int rc = dx_verrp(DX_EINVAL, err->param, fmt, ap);
    va_end(ap);
    snprintf(err->message, sizeof err->message, "%s", dx_errmsg());
    return rc;
}

/* The member, or NULL when absent or null. */
static json_t *member(const json_t *o, const char *name)
{
    json_t *v = json_object_get(o, name);
    return json_is_null(v) ? NULL : v;
}

static int get_flag(const json_t *o, const char *name, int *out, oai_err *err)
{
    json_t *v = member(o, name);
    if (!v) return 0;
    if (!json_is_boolean(v)) return bad(err, name, "expected true, false or null");
    *out = json_is_true(v);
    return 0;
}

/* A string without NUL, 1..cap bytes. */
static int get_str(const json_t *o, const char *name, char *out, size_t cap, oai_err *err)
{
    json_t *v = member(o, name);
    if (!v) return 0;
    size_t n = json_is_string(v) ? json_string_length(v) : 0;
    if (!json_is_string(v) || strlen(json_string_value(v)) != n)
        return bad(err, name, "expected a string or null");
    if (n == 0 || n > cap) return bad(err, name, "length %zu is not in 1..%zu", n, cap);
    memcpy(out, json_string_value(v), n + 1);
    return 0;
}

static int get_int(const json_t *o, const char *name, int64_t lo, int64_t hi, int64_t *out,
                   oai_err *err)
{
    json_t *v = member(o, name);
    if (!v) return 0;
    if (!json_is_integer(v)) return bad(err, name, "expected an integer or null");
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi)
        return bad(err, name, "%lld is out of range [%lld, %lld]", (long long)i, (long long)lo,
                   (long long)hi);
    *out = i;
    return 0;
}

/* An array of integers in [0, hi), at most max long. */
static int get_ids(const json_t *o, const char *name, int64_t hi, size_t max, int32_t **out,
                   size_t *n, oai_err *err)
{
    json_t *v = member(o, name);
    if (!v) return 0;
    if (!json_is_array(v)) return bad(err, name, "expected an array of integers or null");
    size_t len = json_array_size(v), i;
    if (len > max) return bad(err, name, "%zu entries, at most %zu", len, max);
    *out = dx_malloc((len ? len : 1) * sizeof **out);
    if (!*out) return bad(err, name, "out of memory");
    *n = len;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= hi)
            return bad(err, name, "[%zu]: expected an integer in [0, %lld)", i, (long long)hi);
        (*out)[i] = (int32_t)json_integer_value(e);
    }
    return 0;
}

/* 32 hex digits into *t; *has = 1 when present. */
static int get_hex16(const json_t *o, const char *name, xfer_token *t, int *has, oai_err *err)
{
    char hex[40] = "";
    int rc = get_str(o, name, hex, 32, err);
    if (rc || !hex[0]) return rc;
    if (xfer_token_parse(hex, t)) return bad(err, name, "expected 32 hex digits");
    *has = 1;
    return 0;
}

static int get_ttl(const json_t *o, kvtp *p, oai_err *err)
{
    json_t *v = member(o, "remote_blocks_ttl_s");
    if (!v) return 0;
    if (!json_is_number(v)) return bad(err, "remote_blocks_ttl_s", "expected a number or null");
    double d = json_number_value(v);
    if (!(d >= 0 && d <= 1e7)) return bad(err, "remote_blocks_ttl_s", "%g is out of range", d);
    p->ttl_s = d;
    return 0;
}

/* Fields that must agree with each other. */
static int check_consistent(const kvtp *p, int has_model, const kvtp_limits *lim, oai_err *err)
{
    if (p->num_tokens >= 0 && p->block_ids &&
        (uint64_t)p->num_tokens != (uint64_t)p->n_blocks * lim->block_size)
        return bad(err, "remote_num_tokens", "%lld tokens, but %zu blocks of %u tokens hold %llu",
                   (long long)p->num_tokens, p->n_blocks, lim->block_size,
                   (unsigned long long)p->n_blocks * lim->block_size);
    if (p->first_ids && !p->token_ids)
        return bad(err, "first_token_ids",
                   "given without remote_token_ids (the tokens they follow)");
    if (p->first_ids && !has_model)
        return bad(err, "first_token_ids",
                   "given without first_token_model (the model that made them)");
    if (p->num_tokens > 0 && p->token_ids && (size_t)p->num_tokens > p->n_tokens)
        return bad(err, "remote_num_tokens", "%lld tokens, but remote_token_ids has only %zu",
                   (long long)p->num_tokens, p->n_tokens);
    return 0;
}

int kvtp_parse(const void *obj, const kvtp_limits *lim, kvtp *p, oai_err *err)
{
    const json_t *o = obj;
    memset(p, 0, sizeof *p);
    memset(err, 0, sizeof *err);
    p->num_tokens = -1;
    p->ttl_s = -1;
    int64_t port = 0;
    int rc = get_flag(o, "do_remote_decode", &p->do_remote_decode, err);
    if (!rc) rc = get_flag(o, "do_remote_prefill", &p->do_remote_prefill, err);
    if (!rc) rc = get_str(o, "remote_engine_id", p->engine_id, KVTP_MAX_ID, err);
    if (!rc) rc = get_str(o, "remote_request_id", p->request_id, KVTP_MAX_ID, err);
    if (!rc) rc = get_str(o, "remote_host", p->host, KVTP_MAX_HOST, err);
    if (!rc) rc = get_int(o, "remote_port", 1, 65535, &port, err);
    if (!rc)
        rc = get_ids(o, "remote_block_ids", INT32_MAX, 1u << 20, &p->block_ids, &p->n_blocks, err);
    if (!rc) rc = get_int(o, "remote_num_tokens", 0, INT32_MAX, &p->num_tokens, err);
    if (!rc) rc = get_hex16(o, "remote_lease", &p->lease, &p->has_lease, err);
    if (!rc) rc = get_ttl(o, p, err);
    if (!rc)
        rc = get_ids(o, "remote_token_ids", lim->n_vocab, lim->max_tokens, &p->token_ids,
                     &p->n_tokens, err);
    if (!rc)
        rc = get_ids(o, "first_token_ids", lim->n_vocab, KVTP_MAX_FIRST, &p->first_ids, &p->n_first,
                     err);
    int has_model = 0;
    if (!rc) rc = get_hex16(o, "first_token_model", &p->first_model, &has_model, err);
    if (!rc) rc = check_consistent(p, has_model, lim, err);
    p->port = (int)port;
    if (rc) kvtp_free(p);
    return rc;
}

void kvtp_free(kvtp *p)
{
    if (!p) return;
    dx_free(p->block_ids);
    dx_free(p->token_ids);
    dx_free(p->first_ids);
    p->block_ids = p->token_ids = p->first_ids = NULL;
    p->n_blocks = p->n_tokens = p->n_first = 0;
}

int kvtp_has_holder(const kvtp *p)
{
    return p->host[0] && p->port > 0 && p->has_lease && p->block_ids && p->n_blocks > 0;
}

static int put_str(dx_buf *b, const char *name, const char *v)
{
    int rc = dx_buf_printf(b, ",\"%s\":", name);
    if (rc) return rc;
    return *v ? oai_json_str(b, v, strlen(v)) : dx_buf_puts(b, "null");
}

static int put_ids(dx_buf *b, const char *name, const int32_t *ids, size_t n)
{
    int rc = dx_buf_printf(b, ",\"%s\":", name);
    if (!ids) return rc ? rc : dx_buf_puts(b, "null");
    if (!rc) rc = dx_buf_putc(b, '[');
    for (size_t i = 0; !rc && i < n; i++) rc = dx_buf_printf(b, i ? ",%d" : "%d", ids[i]);
    return rc ? rc : dx_buf_putc(b, ']');
}

int kvtp_write(dx_buf *b, const kvtp *p)
{
    char lease[33];
    if (p->has_lease) xfer_token_hex(&p->lease, lease);
    int rc = dx_buf_printf(b,
                           "\"kv_transfer_params\":{\"do_remote_decode\":%s,"
                           "\"do_remote_prefill\":%s",
                           p->do_remote_decode ? "true" : "false",
                           p->do_remote_prefill ? "true" : "false");
    if (!rc) rc = put_str(b, "remote_engine_id", p->engine_id);
    if (!rc) rc = put_str(b, "remote_request_id", p->request_id);
    if (!rc) rc = put_str(b, "remote_host", p->host);
    if (!rc)
        rc = p->port ? dx_buf_printf(b, ",\"remote_port\":%d", p->port)
                     : dx_buf_puts(b, ",\"remote_port\":null");
    if (!rc) rc = put_ids(b, "remote_block_ids", p->block_ids, p->n_blocks);
    if (!rc)
        rc = p->num_tokens >= 0
                 ? dx_buf_printf(b, ",\"remote_num_tokens\":%lld", (long long)p->num_tokens)
                 : dx_buf_puts(b, ",\"remote_num_tokens\":null");
    if (!rc) rc = put_str(b, "remote_lease", p->has_lease ? lease : "");
    if (!rc)
        rc = p->ttl_s >= 0 ? dx_buf_printf(b, ",\"remote_blocks_ttl_s\":%.17g", p->ttl_s)
                           : dx_buf_puts(b, ",\"remote_blocks_ttl_s\":null");
    if (!rc) rc = put_ids(b, "remote_token_ids", p->token_ids, p->n_tokens);
    if (!rc && p->first_ids) {
        char model[33];
        xfer_token_hex(&p->first_model, model);
        rc = put_ids(b, "first_token_ids", p->first_ids, p->n_first);
        if (!rc) rc = put_str(b, "first_token_model", model);
    }
    return rc ? rc : dx_buf_putc(b, '}');
}
