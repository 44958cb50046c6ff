/* oai_jv: the shared checks of a request's JSON values (see .h). */
#include "oai/oai_jv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

int oai_jv_fail(oai_err *err, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = dx_verrf(DX_EINVAL, fmt, ap);
    va_end(ap);
    snprintf(err->message, sizeof err->message, "%s", dx_errmsg());
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    err->status = 400;
    return rc;
}

int oai_jv_failed(const oai_err *err)
{
    DX_ASSERT(err->status && err->message[0]);
    return dx_errf(DX_EINVAL, "%s", err->message);
}

int oai_jv_oom(oai_err *err, const char *what)
{
    oai_jv_fail(err, NULL, "out of memory %s; try again", what);
    err->status = 503;
    return dx_errf(DX_ENOMEM, "out of memory %s", what);
}

json_t *oai_jv_field(const json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    return json_is_null(v) ? NULL : v;
}

int oai_jv_is_cstr(const json_t *v)
{
    return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v);
}

int oai_jv_is(const json_t *v, const char *s)
{
    return oai_jv_is_cstr(v) && !strcmp(json_string_value(v), s);
}

int oai_jv_int(const json_t *v, const char *name, double lo, double hi, int64_t *out, oai_err *err)
{
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if ((double)i < lo || (double)i > hi)
            return oai_jv_fail(err, name, "%s: %lld is out of range [%.0f, %.0f]", name,
                               (long long)i, lo, hi);
        *out = (int64_t)i;
        return 0;
    }
    if (!json_is_real(v)) return oai_jv_fail(err, name, "%s: expected an integer", name);
    double d = json_real_value(v);
    if (fabs(d) >= 9.0e18) return oai_jv_fail(err, name, "%s: %g is out of range", name, d);
    if (d != floor(d)) return oai_jv_fail(err, name, "%s: expected an integer, got %g", name, d);
    if (d < lo || d > hi)
        return oai_jv_fail(err, name, "%s: %g is out of range [%.0f, %.0f]", name, d, lo, hi);
    *out = (int64_t)d;
    return 0;
}

int oai_jv_num(const json_t *v, const char *name, double lo, double hi, double *out, oai_err *err)
{
    if (!json_is_number(v)) return oai_jv_fail(err, name, "%s: expected a number", name);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return oai_jv_fail(err, name, "%s: %g is out of range [%g, %g]", name, d, lo, hi);
    if (out) *out = d;
    return 0;
}

int oai_jv_bool(const json_t *v, const char *name, int *out, oai_err *err)
{
    if (!json_is_boolean(v)) return oai_jv_fail(err, name, "%s: expected true or false", name);
    *out = json_is_true(v);
    return 0;
}

static int dump_cb(const char *p, size_t n, void *b)
{
    return dx_buf_append(b, p, n) ? -1 : 0; /* -1: jansson stops the dump */
}

int oai_jv_dump(dx_buf *b, const json_t *v, size_t flags)
{
    size_t failed = dx_alloc_failed_count();
    if (json_dump_callback(v, dump_cb, b, flags) || dx_alloc_failed_count() != failed)
        return dx_errf(DX_ENOMEM, "JSON of %zu bytes: out of memory", b->len);
    return 0;
}
