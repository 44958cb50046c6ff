/* node_gram: a request's structured-output constraint — response_format
 * (json_object, json_schema), a forced tool call (tool_choice "required" or
 * a named function), or a `grammar` — as EBNF text, compiled into a gram
 * (model/gram.h) that the engine masks the request's tokens with.
 *
 * Agents send the same schemas and tools every turn, so compiled grammars
 * are kept in a bounded LRU cache keyed by a hash of their EBNF text (the
 * text itself is compared on a hit).  Building and compiling run on the
 * node's preparation pool, never on the event loop; the cache is
 * thread-safe.  An entry is reference-counted: a request holds one until
 * its final event, so evicting an entry a request still uses only unlinks
 * it and the last release frees it.
 *
 * Forced tool calls follow the node's tool-call format (oai_tools.h):
 *   qwen:   <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
 *   llama3: {"name": "NAME", "parameters": ARGS}
 * one call of one of the allowed tools, ARGS valid against that tool's
 * `parameters` schema ({} when it has none). */
#ifndef NODE_GRAM_H
#define NODE_GRAM_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "gram/gram.h"
#include "oai/oai_req.h"

#define NODE_GRAM_CACHE_DEFAULT 64 /* compiled grammars kept */

typedef struct node_gram_cache node_gram_cache;
typedef struct node_gram node_gram; /* one cached grammar: a reference to it */

typedef struct {
    uint64_t hits, misses, evictions;
    uint32_t entries;
} node_gram_stats;

int node_gram_cache_create(uint32_t max_entries, node_gram_cache **out);
/* Every reference must have been released.  NULL: no-op. */
void node_gram_cache_destroy(node_gram_cache *c);

/* The EBNF text the request's constraint compiles from, appended to `src`
 * (nothing appended: the request is unconstrained).  tool_fmt: the node's
 * enum oai_tools_fmt; think_open: the prompt leaves a <think> block open, so
 * the output first closes it.  A bad schema or a forced call the node cannot
 * format is DX_EINVAL with a 400 in *err naming the field; keywords ignored
 * (strict false) are appended to `warnings`, one "field: message" per line. */
int node_gram_source(const oai_req *o, int tool_fmt, int think_open, dx_buf *src, dx_buf *warnings,
                     oai_err *err);
/* The compiled grammar for src, from the cache or compiled and added; a
 * syntax error is a 400 naming `param` with gram's line:col message. */
int node_gram_get(node_gram_cache *c, const char *src, size_t len, const char *param,
                  node_gram **out, oai_err *err);
/* The request's constraint compiled (NULL *out: it has none), from the cache
 * or built with node_gram_source and compiled.  The cache key is what the
 * constraint depends on (the schema, tools, choice, format and options), so
 * a hit costs neither the schema compiler nor the grammar's. */
int node_gram_request(node_gram_cache *c, const oai_req *o, int tool_fmt, int think_open,
                      node_gram **out, oai_err *err);
const gram *node_gram_grammar(const node_gram *g);
/* The keywords a non-strict schema ignored, "field: message" a line; "". */
const char *node_gram_warnings(const node_gram *g);
void node_gram_release(node_gram_cache *c, node_gram *g); /* NULL g: no-op */
void node_gram_get_stats(node_gram_cache *c, node_gram_stats *out);

/* The field a request's constraint comes from ("grammar",
 * "response_format", "tool_choice"), or NULL when it has none. */
const char *node_gram_param(const oai_req *o);

#endif
