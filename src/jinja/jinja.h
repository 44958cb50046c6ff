/* jinja: an interpreter for the Jinja subset that chat templates use.
 *
 * A model ships its chat template as Jinja text (GGUF key
 * tokenizer.chat_template).  This module renders such a template exactly as
 * @huggingface/jinja 0.5.11 (the implementation transformers.js uses) does:
 * same whitespace handling (trim_blocks and lstrip_blocks on, a final
 * newline dropped, `{%-`/`-%}` control), same value semantics (JavaScript
 * numbers, `tojson` and `string` formatting, undefined handling, string
 * methods that ignore their arguments), same errors.  docs/templates.md lists
 * the language covered and the few known differences.
 *
 * Values come in as jansson JSON: `vars` is an object whose members become
 * the template's variables (messages, tools, add_generation_prompt,
 * bos_token...).  An absent member is undefined in the template.
 *
 * A template comes from a model file, so nothing in it is trusted: parsing
 * bounds the source size and nesting depth, rendering bounds output size,
 * memory, evaluation steps (loop iterations included) and run-time nesting
 * (macro recursion).  Hitting a bound is DX_ETOOBIG with a message; nothing
 * hangs, recurses without bound or aborts.
 *
 * Errors: a template that does not parse is DX_EINVAL with a message naming
 * line and column ("line 3, column 14: expected '%}'..."); a run-time error
 * (raise_exception(), a type error, an unknown filter) is DX_EINVAL with the
 * message and the line and column of the expression.  A parsed template is
 * immutable: any number of threads may render it at once. */
#ifndef JINJA_H
#define JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

#define JINJA_MAX_SOURCE      (1u << 20) /* bytes of template text */
#define JINJA_MAX_PARSE_DEPTH 200        /* nesting of blocks and expressions */

typedef struct jinja_tmpl jinja_tmpl;

/* Bounds for one render; a zero field takes its default. */
typedef struct {
    size_t max_output;  /* bytes of output, and of any one string (16 MiB) */
    size_t max_memory;  /* bytes of values allocated by one render (256 MiB) */
    uint64_t max_steps; /* evaluation steps, each loop iteration one (20 million) */
    unsigned max_depth; /* run-time nesting of blocks, expressions and calls (400) */
} jinja_limits;

/* Parses src[0..len) (UTF-8; need not be NUL-terminated). */
int jinja_parse(const char *src, size_t len, jinja_tmpl **out);
void jinja_free(jinja_tmpl *t); /* NULL is a no-op */

/* Appends the rendering to out; vars is a JSON object or NULL.  On error out
 * is left as it was. */
int jinja_render(const jinja_tmpl *t, const json_t *vars, dx_buf *out);
int jinja_render_ex(const jinja_tmpl *t, const json_t *vars, const jinja_limits *lim, dx_buf *out);

#endif
