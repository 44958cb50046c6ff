/* oai_jv: the checks every front door's request parser makes on a JSON
 * value — a field given (absent or null is "not given", as in the OpenAI
 * API), a string usable as a name, an integer or a number in range, a
 * boolean — each failing as a 400 in the request's oai_err whose message
 * starts with the field's path (param), so that the chat parser
 * (oai_req.c) and the translations of the other doors (oai_anth_req.c,
 * oai_rsp_req.c) name a bad field the same way. */
#ifndef OAI_JV_H
#define OAI_JV_H

#include <jansson.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "oai/oai_req.h"

/* A 400 for param (NULL: no single field) with the formatted message;
 * returns DX_EINVAL with the same message for the thread. */
int oai_jv_fail(oai_err *err, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A callee filled *err (and it is a failure): DX_EINVAL with its message. */
int oai_jv_failed(const oai_err *err);
/* Out of memory while reading a request — the server's state, not the
 * client's: a 503 it may retry ("out of memory WHAT; try again"). */
int oai_jv_oom(oai_err *err, const char *what);
/* Appends v as JSON (json_dump_callback's `flags`) to b: 0, or DX_ENOMEM
 * when b could not grow or any allocation failed meanwhile — jansson's
 * dump ignores some of its callback's failures (a key's closing quote), so
 * a dump that saw one is void. */
int oai_jv_dump(dx_buf *b, const json_t *v, size_t flags);

/* The member, or NULL when it is absent or null. */
json_t *oai_jv_field(const json_t *obj, const char *name);
/* A string with no NUL in it (a name, role, id, stop string): NUL is
 * allowed only in text the model reads, handled by length everywhere. */
int oai_jv_is_cstr(const json_t *v);
/* The string `s` exactly. */
int oai_jv_is(const json_t *v, const char *s);

/* An integer — or an integral real (1e3) — in [lo, hi] into *out. */
int oai_jv_int(const json_t *v, const char *name, double lo, double hi, int64_t *out, oai_err *err);
/* A number in [lo, hi] into *out (out may be NULL: checked only). */
int oai_jv_num(const json_t *v, const char *name, double lo, double hi, double *out, oai_err *err);
int oai_jv_bool(const json_t *v, const char *name, int *out, oai_err *err);

#endif
