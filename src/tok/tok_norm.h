/* tok_norm: the tokenizer's text normalizers (tokenizer.json "normalizer").
 *
 * Only NFC exists today (Qwen2 and Qwen3 ask for it), computed by
 * libutf8proc rather than hand-written Unicode tables.  Hugging Face
 * tokenizers normalise each stretch of text between added tokens before the
 * pre-tokenizer; tok.c calls tok_norm_apply at exactly that point.  Invalid
 * UTF-8 cannot come from a Rust string, so it has no reference behaviour:
 * here valid runs are normalised and every other byte passes through, which
 * keeps the tokenizer total over byte strings. */
#ifndef TOK_NORM_H
#define TOK_NORM_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"
#include "tok/tok.h"

/* "nfc" / "NFC" or "none"; DX_EUNSUPPORTED naming the value otherwise. */
int tok_norm_parse(const char *name, size_t len, enum tok_norm *out);
const char *tok_norm_name(enum tok_norm n); /* "nfc" | "none" */
/* Builds the table tok_norm_needed reads (once per process; thread-safe).
 * tok_create calls it for a normalising vocabulary, so encoding never
 * pays for it. */
void tok_norm_init(void);
/* Whether normalising text[0..len) could change it: some character in it
 * is touchable by NFC (see tok_norm.c).  False means NFC(text) == text. */
int tok_norm_needed(enum tok_norm n, const char *text, size_t len);
/* Whether NFC may change cp or join it to what precedes it (tests). */
int tok_norm_touchable(uint32_t cp);
/* Appends text[0..len) normalised to out (DX_ENOMEM / DX_ETOOBIG on failure). */
int tok_norm_apply(enum tok_norm n, const char *text, size_t len, dx_buf *out);

#endif
