/* Fuzz target: a registration value as a router reads it from Redis
 * (node_reg_parse; Redis is trusted, but a stale or foreign writer must not
 * crash a router).  Invariants: a refusal is DX_EFORMAT with a message
 * starting "registration:"; an accepted value has a valid URL, a known role
 * and a 32-digit model, and survives node_reg_format and a second parse
 * unchanged; nothing leaks. */
#include <stdint.h>
#include <string.h>

#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "http/node_reg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    node_reg_info a, b;
    int rc = node_reg_parse((const char *)data, size, &a);
    if (rc) {
        DX_ASSERT(rc == DX_EFORMAT && !strncmp(dx_errmsg(), "registration:", 13));
        return 0;
    }
    DX_ASSERT(!strncmp(a.url, "http://", 7) && strlen(a.model) == 32);
    DX_ASSERT(!strcmp(a.role, "prefill") || !strcmp(a.role, "decode") || !strcmp(a.role, "both"));
    dx_buf out;
    dx_buf_init(&out, 0);
    DX_ASSERT(node_reg_format(&a, &out) == 0);
    DX_ASSERT(node_reg_parse(out.data, out.len, &b) == 0);
    DX_ASSERT(!memcmp(&a, &b, sizeof a));
    dx_buf_free(&out);
    return 0;
}
