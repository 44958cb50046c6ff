/* node_load: a node's published costs and queue, as JSON (see .h). */
#include "http/node_load.h"

#include <math.h>
#include <string.h>

#include "base/dx_err.h"

#define MAX_SECONDS 1e6 /* no cost of a step, a token or a byte is this long */
#define MAX_COUNT   ((uint64_t)1 << 53)

/* The scalar members, by name and place: one table for both directions. */
typedef struct {
    const char *name;
    size_t off;
    int kind; /* 0: double seconds, 1: uint32, 2: uint64 */
} field;

#define F_D(n)                                                                                     \
    {                                                                                              \
#n, offsetof(node_load, n), 0                                                              \
    }
#define F_U32(n)                                                                                   \
    {                                                                                              \
#n, offsetof(node_load, n), 1                                                              \
    }
#define F_U64(n)                                                                                   \
    {                                                                                              \
#n, offsetof(node_load, n), 2                                                              \
    }
static const field k_fields[] = {
    F_U64(samples),
    F_D(step_s),
    F_D(prefill_tok_s),
    F_D(prefill_key_s),
    F_D(decode_tok_s),
    F_D(decode_key_s),
    F_D(itl_s),
    F_D(itl_prefill_s),
    F_U32(running),
    F_U32(waiting),
    F_U64(prefill_pending),
    F_U32(batch_tokens),
    F_U32(kv_token_bytes),
};
#undef F_D
#undef F_U32
#undef F_U64

static int set_num(json_t *o, const char *name, double v)
{
    return json_object_set_new(o, name, json_real(v));
}

static json_t *peer_json(const node_load_peer *p)
{
    return json_pack("{s:s, s:s, s:I, s:f, s:f}", "kv", p->kv, "transport", p->transport, "samples",
                     (json_int_t)p->samples, "setup_s", p->setup_s, "byte_s", p->byte_s);
}

json_t *node_load_json(const node_load *l)
{
    json_t *o = json_pack("{s:i, s:b}", "v", 1, "fixed", l->fixed), *peers = json_array();
    int bad = !o || !peers;
    for (size_t i = 0; !bad && i < DX_ARRAY_LEN(k_fields); i++) {
        const char *p = (const char *)l + k_fields[i].off;
        if (k_fields[i].kind == 0)
            bad = set_num(o, k_fields[i].name, *(const double *)p) < 0;
        else if (k_fields[i].kind == 1)
            bad = json_object_set_new(o, k_fields[i].name,
                                      json_integer((json_int_t) * (const uint32_t *)p)) < 0;
        else
            bad = json_object_set_new(o, k_fields[i].name,
                                      json_integer((json_int_t) * (const uint64_t *)p)) < 0;
    }
    if (!bad)
        bad = json_object_set_new(o, "kv", l->kv[0] ? json_string(l->kv) : json_null()) < 0 ||
              json_object_set_new(o, "pull",
                                  json_pack("{s:f, s:f}", "setup_s", l->pull_setup_s, "byte_s",
                                            l->pull_byte_s)) < 0;
    for (size_t i = 0; !bad && i < l->n_peers; i++)
        bad = json_array_append_new(peers, peer_json(&l->peers[i])) < 0;
    if (!bad) bad = json_object_set(o, "peers", peers) < 0;
    json_decref(peers);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int node_load_write(const node_load *l, dx_buf *out)
{
    json_t *o = node_load_json(l);
    size_t n = o ? json_dumpb(o, NULL, 0, JSON_COMPACT) : 0;
    int rc = n ? dx_buf_reserve(out, n) : dx_errf(DX_ENOMEM, "out of memory for the load");
    if (!rc) {
        json_dumpb(o, out->data + out->len, n, JSON_COMPACT);
        out->len += n;
        out->data[out->len] = 0;
    }
    json_decref(o);
    return rc;
}

static int bad_member(const char *where, const char *name, const char *want)
{
    return dx_errf(DX_EFORMAT, "load: %s\"%s\": expected %s", where, name, want);
}

/* A number member (absent: 0) in [0, max]. */
static int get_num(const json_t *o, const char *where, const char *name, double max, double *out)
{
    const json_t *v = json_object_get(o, name);
    *out = 0;
    if (!v || json_is_null(v)) return 0;
    double d = json_number_value(v);
    if (!json_is_number(v) || !isfinite(d) || d < 0 || d > max)
        return bad_member(where, name, "a number >= 0");
    *out = d;
    return 0;
}

static int get_count(const json_t *o, const char *where, const char *name, uint64_t max,
                     uint64_t *out)
{
    const json_t *v = json_object_get(o, name);
    *out = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
        return bad_member(where, name, "an integer >= 0");
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* A string member (absent or null: "") shorter than cap. */
static int get_str(const json_t *o, const char *where, const char *name, char *out, size_t cap)
{
    const json_t *v = json_object_get(o, name);
    out[0] = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v) || json_string_length(v) >= cap ||
        strlen(json_string_value(v)) != json_string_length(v))
        return dx_errf(DX_EFORMAT, "load: %s\"%s\": expected a string of at most %zu bytes", where,
                       name, cap - 1);
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

static int read_fields(const json_t *o, node_load *out)
{
    for (size_t i = 0; i < DX_ARRAY_LEN(k_fields); i++) {
        char *p = (char *)out + k_fields[i].off;
        uint64_t n = 0;
        int rc = k_fields[i].kind == 0
                     ? get_num(o, "", k_fields[i].name, MAX_SECONDS, (double *)(void *)p)
                     : get_count(o, "", k_fields[i].name,
                                 k_fields[i].kind == 1 ? UINT32_MAX : MAX_COUNT, &n);
        if (rc) return rc;
        if (k_fields[i].kind == 1) *(uint32_t *)(void *)p = (uint32_t)n;
        if (k_fields[i].kind == 2) *(uint64_t *)(void *)p = n;
    }
    return 0;
}

static int read_peers(const json_t *o, node_load *out)
{
    const json_t *a = json_object_get(o, "peers");
    if (!a || json_is_null(a)) return 0;
    if (!json_is_array(a) || json_array_size(a) > NODE_LOAD_MAX_PEERS)
        return dx_errf(DX_EFORMAT, "load: \"peers\": expected an array of at most %d",
                       NODE_LOAD_MAX_PEERS);
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *e = json_array_get(a, i);
        node_load_peer *p = &out->peers[i];
        uint64_t n;
        if (!json_is_object(e))
            return dx_errf(DX_EFORMAT, "load: \"peers\"[%zu]: not an object", i);
        int rc = get_str(e, "peers[].", "kv", p->kv, sizeof p->kv);
        if (!rc) rc = get_str(e, "peers[].", "transport", p->transport, sizeof p->transport);
        if (!rc) rc = get_count(e, "peers[].", "samples", UINT32_MAX, &n);
        p->samples = (uint32_t)n;
        if (!rc) rc = get_num(e, "peers[].", "setup_s", MAX_SECONDS, &p->setup_s);
        if (!rc) rc = get_num(e, "peers[].", "byte_s", MAX_SECONDS, &p->byte_s);
        if (rc) return rc;
        out->n_peers = i + 1;
    }
    return 0;
}

int node_load_from_json(const json_t *o, node_load *out)
{
    memset(out, 0, sizeof *out);
    if (!json_is_object(o)) return dx_errf(DX_EFORMAT, "load: not a JSON object");
    const json_t *fx = json_object_get(o, "fixed"), *pull = json_object_get(o, "pull");
    if (fx && !json_is_boolean(fx)) return bad_member("", "fixed", "true or false");
    out->fixed = json_is_true(fx);
    int rc = read_fields(o, out);
    if (!rc) rc = get_str(o, "", "kv", out->kv, sizeof out->kv);
    if (!rc && pull && !json_is_null(pull) && !json_is_object(pull))
        rc = bad_member("", "pull", "an object");
    if (!rc && json_is_object(pull)) {
        rc = get_num(pull, "pull.", "setup_s", MAX_SECONDS, &out->pull_setup_s);
        if (!rc) rc = get_num(pull, "pull.", "byte_s", MAX_SECONDS, &out->pull_byte_s);
    }
    if (!rc) rc = read_peers(o, out);
    if (rc) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->has = 1;
    return 0;
}

int node_load_parse(const char *text, size_t len, node_load *out)
{
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        memset(out, 0, sizeof *out);
        return dx_errf(DX_EFORMAT, "load: invalid JSON at line %d column %d: %s", je.line,
                       je.column, je.text);
    }
    int rc = node_load_from_json(o, out);
    json_decref(o);
    return rc;
}

const node_load_peer *node_load_peer_of(const node_load *l, const char *kv)
{
    for (size_t i = 0; kv && *kv && i < l->n_peers; i++)
        if (!strcmp(l->peers[i].kv, kv)) return &l->peers[i];
    return NULL;
}
