/* tok: byte-level BPE tokenizer (GPT-2 style), as used by Qwen and Llama 3.
 *
 * Built from a vocabulary of byte-level token strings (GPT-2 byte-to-unicode
 * mapped), token types, and ranked merges "a b".  Text is split by the
 * family's pre-tokenizer regex (PCRE2, UTF mode), each piece is mapped to
 * byte-level symbols and merged by rank.  Special (control / user-defined)
 * tokens are matched in the text before BPE only when the caller passes
 * TOK_ALLOW_SPECIAL; otherwise their text is tokenised as ordinary text.
 *
 * User-defined tokens (Hugging Face's non-special added tokens, such as
 * Qwen3's <think>) are matched always, as Hugging Face and llama.cpp match
 * them; control tokens only with TOK_ALLOW_SPECIAL.
 *
 * Normalizer: a vocabulary may ask for NFC (Qwen3's tokenizer.json does);
 * then each stretch of text between matched special tokens is normalised
 * to NFC before the pre-tokenizer, as Hugging Face tokenizers do, and
 * decode(encode(s)) == NFC(s).
 *
 * Invalid UTF-8: the input is split into maximal valid UTF-8 runs; each
 * invalid byte becomes its own piece and so its byte token.  Hence
 * decode(encode(s)) == s for any byte string, valid or not (without a
 * normalizer; with NFC, for any string already in NFC). */
#ifndef TOK_H
#define TOK_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

enum tok_pre {
    TOK_PRE_QWEN2,  /* tokenizer.ggml.pre = "qwen2" */
    TOK_PRE_LLAMA3, /* tokenizer.ggml.pre = "llama-bpe" (Llama 3) */
};

/* GGML token types (tokenizer.ggml.token_type). */
enum tok_type {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* Text normalisation before pre-tokenization (tokenizer.json "normalizer"). */
enum tok_norm {
    TOK_NORM_NONE = 0,
    TOK_NORM_NFC = 1, /* Unicode NFC (Qwen2/Qwen3) */
};

typedef struct {
    const char *ptr;
    size_t len;
} tok_strview;

typedef struct {
    const tok_strview *tokens; /* n_tokens byte-level strings */
    size_t n_tokens;
    const int32_t *token_types; /* may be NULL: all NORMAL */
    const tok_strview *merges;  /* "left right", highest priority first */
    size_t n_merges;
    enum tok_pre pre;
    int32_t bos, eos, eot; /* -1 if absent */
    int add_bos, add_eos;  /* TOK_ADD_SPECIAL adds them (tokenizer.ggml.add_bos_token ...) */
    enum tok_norm norm;
} tok_config;

typedef struct tok tok;

/* Growable token-id vector. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} tok_ids;
void tok_ids_init(tok_ids *v);
void tok_ids_free(tok_ids *v);
int tok_ids_push(tok_ids *v, int32_t id);

enum {
    TOK_ALLOW_SPECIAL = 1, /* match control tokens in the text (user-defined always are) */
    TOK_ADD_SPECIAL =
        2, /* BOS first / EOS last when the vocabulary asks (llama.cpp's add_special) */
};

/* Map a pre-tokenizer name ("qwen2", "llama-bpe", "llama3") to tok_pre. */
int tok_pre_parse(const char *name, size_t len, enum tok_pre *out);
const char *tok_pre_name(enum tok_pre p);
/* The PCRE2 pattern for a pre-tokenizer (also used by the BPE trainer). */
const char *tok_pre_regex(enum tok_pre p);

/* Validates the config (every merge names two tokens whose concatenation is a
 * token; every byte has a token; ids in range) and copies what it needs. */
int tok_create(const tok_config *cfg, tok **out);
void tok_destroy(tok *t);

/* Appends ids to *out (all or nothing). */
int tok_encode(const tok *t, const char *text, size_t len, unsigned flags, tok_ids *out);
/* Appends the bytes of the tokens; DX_ERANGE for an id out of range. */
int tok_decode(const tok *t, const int32_t *ids, size_t n, dx_buf *out);
/* Bytes of one token (decoded from byte-level form) into buf; returns the
 * length or a negative code.  Special tokens give their text. */
int tok_token_bytes(const tok *t, int32_t id, char *buf, size_t cap);
/* The raw vocabulary string of a token (byte-level form). */
tok_strview tok_piece(const tok *t, int32_t id);
int32_t tok_find(const tok *t, const char *piece, size_t len); /* DX_NONE if absent */

size_t tok_vocab_size(const tok *t);
int32_t tok_bos(const tok *t);
int32_t tok_eos(const tok *t);
int32_t tok_eot(const tok *t);
int tok_add_bos(const tok *t);
int tok_add_eos(const tok *t);
enum tok_norm tok_get_norm(const tok *t);
int tok_is_special(const tok *t, int32_t id); /* control or user-defined */
int tok_is_control(const tok *t, int32_t id); /* never produced from text without ALLOW_SPECIAL */
/* Whether the token's text is part of generated text (normal, byte and
 * user-defined tokens, as llama.cpp renders them); control, unknown and
 * unused tokens are not shown. */
int tok_is_text(const tok *t, int32_t id);
/* End of generation, as llama.cpp decides it: EOS, EOT, and every control
 * or user-defined token whose text is a known end of turn or text
 * (<|endoftext|>, <|im_end|>, <|end_of_text|>, <|eot_id|>, <|eom_id|>,
 * <|end|>, <end_of_turn>, ...) or a FIM pad / repo / file separator. */
int tok_is_eog(const tok *t, int32_t id);
/* The end-of-generation ids, ascending; *n gets their count. */
const int32_t *tok_eog_ids(const tok *t, size_t *n);
enum tok_pre tok_get_pre(const tok *t);

/* GPT-2 byte-to-unicode map: the code point standing for byte b. */
uint32_t tok_byte_to_cp(uint8_t b);

#endif
