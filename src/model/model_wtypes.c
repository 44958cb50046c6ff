/* model_wtypes: groups a GGUF file's matrices by role and type (see
 * model_wtypes.h).  Bounded: at most ROLES_MAX roles and TYPES_MAX types
 * per role are told apart, the rest are counted as "other". */
#include "model/model_wtypes.h"

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"

#define ROLES_MAX 64
#define TYPES_MAX 6
#define ROLE_LEN  48

typedef struct {
    char name[ROLE_LEN];
    int in_block;              /* a blk.N. tensor */
    int type[TYPES_MAX];       /* in order of first appearance */
    uint64_t count[TYPES_MAX]; /* tensors of each */
    int n_types;
    uint64_t other; /* tensors of types past TYPES_MAX */
    char desc[160]; /* "q4_0", or "q6_K x14, q4_K x14" */
    int done;       /* printed */
} wrole;

/* The role of tensor `name`: "blk.12.attn_q.weight" -> "attn_q". */
static void role_of(gguf_str name, char *out, int *in_block)
{
    const char *p = name.ptr, *end = name.ptr + name.len;
    *in_block = 0;
    if (name.len > 4 && !memcmp(p, "blk.", 4)) {
        const char *q = p + 4;
        while (q < end && *q >= '0' && *q <= '9') q++;
        if (q > p + 4 && q < end && *q == '.') {
            p = q + 1;
            *in_block = 1;
        }
    }
    if (end - p > 7 && !memcmp(end - 7, ".weight", 7)) end -= 7;
    size_t n = (size_t)(end - p) < ROLE_LEN - 1 ? (size_t)(end - p) : ROLE_LEN - 1;
    memcpy(out, p, n);
    out[n] = 0;
}

static void add(wrole *roles, int *n_roles, const char *name, int in_block, int type)
{
    int r = 0;
    while (r < *n_roles && strcmp(roles[r].name, name)) r++;
    if (r == *n_roles) {
        if (*n_roles == ROLES_MAX)
            r = ROLES_MAX - 1; /* lumped into the last */
        else {
            memset(&roles[r], 0, sizeof roles[r]);
            snprintf(roles[r].name, ROLE_LEN, "%s", name);
            roles[r].in_block = in_block;
            (*n_roles)++;
        }
    }
    wrole *w = &roles[r];
    int k = 0;
    while (k < w->n_types && w->type[k] != type) k++;
    if (k == w->n_types) {
        if (k == TYPES_MAX) {
            w->other++;
            return;
        }
        w->type[w->n_types++] = type;
    }
    w->count[k]++;
}

static void describe(wrole *w)
{
    size_t len = 0;
    for (int k = 0; k < w->n_types; k++) {
        const char *tn = dx_dtype_name(w->type[k]);
        int single = w->n_types == 1 && !w->other;
        len += (size_t)snprintf(w->desc + len, sizeof w->desc - len, "%s%s", k ? ", " : "",
                                tn ? tn : "?");
        if (!single && len < sizeof w->desc)
            len += (size_t)snprintf(w->desc + len, sizeof w->desc - len, " x%llu",
                                    (unsigned long long)w->count[k]);
        if (len >= sizeof w->desc) return;
    }
    if (w->other)
        snprintf(w->desc + len, sizeof w->desc - len, ", other x%llu",
                 (unsigned long long)w->other);
}

/* "attn_q" -> the length of its family prefix ("attn_"), 0 if it has none
 * or is not a layer's tensor. */
static size_t family(const wrole *w)
{
    static const char *const fams[] = {"attn_", "ffn_"};
    for (size_t i = 0; w->in_block && i < DX_ARRAY_LEN(fams); i++)
        if (!strncmp(w->name, fams[i], strlen(fams[i]))) return strlen(fams[i]);
    return 0;
}

static int same_family(const wrole *a, const wrole *b)
{
    size_t fa = family(a);
    return fa && fa == family(b) && !strncmp(a->name, b->name, fa);
}

/* Prints role r with the unprinted roles of its family that have its
 * types, or "fam_*" when the whole family has them. */
static int print_group(wrole *roles, int n_roles, int r, int first, dx_buf *out)
{
    int members = 0, alike = 0;
    for (int i = 0; i < n_roles; i++)
        if (same_family(&roles[i], &roles[r])) {
            members++;
            alike += !strcmp(roles[i].desc, roles[r].desc);
        }
    int rc = dx_buf_puts(out, first ? "" : "; ");
    if (members > 1 && alike == members) {
        rc = rc ? rc : dx_buf_printf(out, "%.*s*", (int)family(&roles[r]), roles[r].name);
        for (int i = 0; i < n_roles; i++)
            if (same_family(&roles[i], &roles[r])) roles[i].done = 1;
    } else {
        rc = rc ? rc : dx_buf_puts(out, roles[r].name);
        roles[r].done = 1;
        for (int i = r + 1; i < n_roles && !rc; i++)
            if (!roles[i].done && same_family(&roles[i], &roles[r]) &&
                !strcmp(roles[i].desc, roles[r].desc)) {
                rc = dx_buf_printf(out, ",%s", roles[i].name);
                roles[i].done = 1;
            }
    }
    return rc ? rc : dx_buf_printf(out, ": %s", roles[r].desc);
}

int model_wtypes_summary(const gguf_ctx *g, dx_buf *out)
{
    wrole *roles = dx_calloc(ROLES_MAX, sizeof *roles);
    if (!roles) return dx_errf(DX_ENOMEM, "model info: out of memory");
    int n_roles = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        gguf_tensor_info ti;
        if (gguf_tensor(g, i, &ti) || ti.n_dims < 2) continue;
        char role[ROLE_LEN];
        int in_block;
        role_of(ti.name, role, &in_block);
        add(roles, &n_roles, role, in_block, ti.type);
    }
    for (int r = 0; r < n_roles; r++) describe(&roles[r]);
    int rc = 0, first = 1;
    for (int pass = 1; pass >= 0 && !rc; pass--) /* the layers' roles, then the others */
        for (int r = 0; r < n_roles && !rc; r++)
            if (!roles[r].done && roles[r].in_block == pass) {
                rc = print_group(roles, n_roles, r, first, out);
                first = 0;
            }
    dx_free(roles);
    return rc ? dx_errf(rc, "model info: out of memory") : 0;
}
