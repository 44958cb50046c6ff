/* bench_gram: mask and accept cost of constrained decoding (bench_gram.h).
 * The document is tokenised as a model would most likely write it, so the
 * parse states met are those of a real generation. */
#include "bench/bench_gram.h"

#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "gram/gram.h"

static const char k_tool_schema[] =
    "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":"
    "\"city and country\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},"
    "\"days\":{\"type\":\"integer\",\"minimum\":0},\"hourly\":{\"type\":\"boolean\"},\"tags\":"
    "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":8}},\"required\":["
    "\"location\","
    "\"unit\"],\"additionalProperties\":false}";

static const char k_tool_doc[] =
    "{\"location\": \"Paris, France\", \"unit\": \"celsius\", \"days\": 3, \"hourly\": false, "
    "\"tags\": [\"weekend trip\", \"rain?\", \"Île-de-France\"]}";

static const char k_object_doc[] =
    "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\", \"unit\": "
    "\"celsius\", \"days\": 3}, \"notes\": [1, 2.5, true, null, \"x\", {\"nested\": [[], {}]}], "
    "\"text\": \"A longer string value, with punctuation; quotes \\\" and escapes \\n, numbers "
    "12345 and unicode: 東京, München.\"}";

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run_case(const tok *t, const gram_vocab *v, const char *ebnf, const char *doc,
                    uint32_t reps, double compile_ms, bench_gram_case *c)
{
    gram *g = NULL;
    gram_match *m = NULL;
    tok_ids ids;
    tok_ids_init(&ids);
    uint64_t *mask = dx_calloc((gram_vocab_size(v) + 63) / 64, sizeof *mask);
    double *lat = NULL;
    uint64_t t0 = dx_now_ns();
    int rc = mask ? gram_compile_ebnf(ebnf, strlen(ebnf), &g) : DX_ENOMEM;
    c->compile_ms = compile_ms + (double)(dx_now_ns() - t0) * 1e-6;
    if (!rc) rc = tok_encode(t, doc, strlen(doc), 0, &ids);
    if (!rc) rc = gram_match_create(g, v, &m);
    if (!rc && !(lat = dx_calloc(ids.n * reps + 1, sizeof *lat)))
        rc = dx_errf(DX_ENOMEM, "bench gram: out of memory");
    c->tokens = ids.n;
    double acc = 0;
    for (uint32_t pass = 0; pass <= reps && !rc; pass++) {
        if (pass && (rc = gram_match_reset(m))) break;
        for (size_t i = 0; i < ids.n && !rc; i++) {
            t0 = dx_now_ns();
            int n = gram_match_mask(m, mask);
            uint64_t t1 = dx_now_ns();
            if (n < 0) {
                rc = n;
                break;
            }
            if (!(mask[ids.ids[i] >> 6] >> (ids.ids[i] & 63) & 1)) {
                rc = dx_errf(DX_EINVAL, "bench gram: the grammar refuses token %zu of the document",
                             i);
                break;
            }
            rc = gram_match_accept(m, ids.ids[i]);
            uint64_t t2 = dx_now_ns();
            double us = (double)(t1 - t0) * 1e-3;
            if (pass == 0) {
                c->cold_mean_us += us / (double)ids.n;
                if (us > c->cold_max_us) c->cold_max_us = us;
                if ((uint32_t)n > c->n_allowed_max) c->n_allowed_max = (uint32_t)n;
            } else {
                lat[(pass - 1) * ids.n + i] = us;
                acc += (double)(t2 - t1) * 1e-3;
            }
        }
        if (!rc && !gram_match_complete(m))
            rc = dx_errf(DX_EINVAL, "bench gram: the document is not complete for the grammar");
    }
    if (!rc && ids.n) {
        size_t n = ids.n * reps;
        double sum = 0;
        for (size_t i = 0; i < n; i++) sum += lat[i];
        qsort(lat, n, sizeof *lat, cmp_d);
        c->cached_mean_us = sum / (double)n;
        c->cached_p99_us = lat[n * 99 / 100];
        c->accept_mean_us = acc / (double)n;
    }
    dx_free(lat);
    dx_free(mask);
    tok_ids_free(&ids);
    gram_match_destroy(m);
    gram_destroy(g);
    return rc;
}

int bench_gram_run(const tok *t, uint32_t reps, bench_gram_result *out)
{
    memset(out, 0, sizeof *out);
    gram_vocab *v;
    uint64_t t0 = dx_now_ns();
    int rc = gram_vocab_create(t, &v);
    if (rc) return rc;
    out->vocab_ms = (double)(dx_now_ns() - t0) * 1e-6;
    out->n_vocab = gram_vocab_size(v);
    dx_buf b;
    dx_buf_init(&b, 0);
    rc = dx_buf_puts(&b, "root ::= j-root\n");
    if (!rc) rc = gram_json_value_ebnf("j-", 1, &b);
    out->cases[0].name = "json_object";
    if (!rc) rc = run_case(t, v, b.data, k_object_doc, reps ? reps : 1, 0, &out->cases[0]);
    dx_buf_reset(&b);
    out->cases[1].name = "tool schema";
    t0 = dx_now_ns();
    if (!rc) rc = dx_buf_puts(&b, "root ::= t-root\n");
    if (!rc) rc = gram_schema_to_ebnf(k_tool_schema, strlen(k_tool_schema), 1, "t-", &b, NULL);
    double ms = (double)(dx_now_ns() - t0) * 1e-6;
    if (!rc) rc = run_case(t, v, b.data, k_tool_doc, reps ? reps : 1, ms, &out->cases[1]);
    dx_buf_free(&b);
    gram_vocab_destroy(v);
    return rc;
}
