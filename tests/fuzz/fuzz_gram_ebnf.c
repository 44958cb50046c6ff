/* Fuzz target: the EBNF grammar parser and the matcher.  Byte 0 seeds the
 * walk; the rest is grammar text.  It must compile or be refused with
 * DX_EINVAL and a "line L col C" message — never crash, hang or leak — and a
 * compiled grammar must keep the matcher's invariants over a short random
 * walk (gram_fuzz.h), whose text the grammar then takes byte by byte. */
#include <stdint.h>
#include <string.h>

#include "gram_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    gram *g = NULL;
    int rc = gram_compile_ebnf((const char *)data + 1, size - 1, &g);
    if (rc) {
        DX_ASSERT(rc == DX_EINVAL || rc == DX_ENOMEM);
        DX_ASSERT(rc != DX_EINVAL || strstr(dx_errmsg(), "grammar"));
        return 0;
    }
    dx_buf out;
    dx_buf_init(&out, 0);
    if (gf_walk(g, data[0], 64, &out)) {
        gram_match *m;
        DX_ASSERT(gram_match_create(g, gf_vocab(), &m) == 0);
        for (size_t i = 0; i < out.len; i++)
            DX_ASSERT(gram_match_accept(m, (uint8_t)out.data[i]) == 0);
        DX_ASSERT(gram_match_complete(m));
        gram_match_destroy(m);
    }
    dx_buf_free(&out);
    gram_destroy(g);
    return 0;
}
