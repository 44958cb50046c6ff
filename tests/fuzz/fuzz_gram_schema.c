/* Fuzz target: the JSON Schema compiler.  Byte 0: bit 0 strict, the rest
 * seeds the walk; the rest is the schema.  It must give EBNF that compiles,
 * or be refused with DX_EINVAL naming the schema — never crash, hang or
 * leak — and a random walk over the grammar that ends must write JSON that
 * jansson parses (numbers it cannot hold aside). */
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "gram_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    json_set_alloc_funcs(dx_malloc, dx_free);
    dx_buf ebnf, warn;
    dx_buf_init(&ebnf, 0);
    dx_buf_init(&warn, 0);
    DX_ASSERT(dx_buf_puts(&ebnf, "root ::= f-root\n") == 0);
    int rc = gram_schema_to_ebnf((const char *)data + 1, size - 1, data[0] & 1, "f-", &ebnf, &warn);
    if (rc) {
        DX_ASSERT(rc == DX_EINVAL || rc == DX_ENOMEM);
        DX_ASSERT(rc != DX_EINVAL || strstr(dx_errmsg(), "json schema"));
    } else {
        gram *g = NULL;
        rc = gram_compile_ebnf(ebnf.data, ebnf.len, &g);
        DX_ASSERT(rc == 0 || rc == DX_ENOMEM);
        dx_buf out;
        dx_buf_init(&out, 0);
        if (g && gf_walk(g, data[0] >> 1, 200, &out)) {
            json_error_t je;
            json_t *v = json_loadb(out.data ? out.data : "", out.len,
                                   JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            DX_ASSERT(v || strstr(je.text, "overflow") || strstr(je.text, "too big") ||
                      strstr(je.text, "Unicode"));
            json_decref(v);
        }
        dx_buf_free(&out);
        gram_destroy(g);
    }
    dx_buf_free(&ebnf);
    dx_buf_free(&warn);
    return 0;
}
