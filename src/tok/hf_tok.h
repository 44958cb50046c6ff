/* hf_tok: imports a Hugging Face tokenizer (tokenizer.json, and the
 * tokenizer_config.json beside it when there is one) as a GGUF vocabulary,
 * for `duplex model synth --tokenizer`.
 *
 * What is accepted is what duplex's tokenizer reproduces exactly: a
 * byte-level BPE model (no byte fallback, no word prefix or suffix, no
 * dropout) whose pre-tokenizer is a Split on Qwen2's or Llama 3's regex
 * followed by ByteLevel, with a normalizer that is absent or NFC.  Anything
 * else is an error that names the file and the field, and for a
 * pre-tokenizer the regex itself.
 *
 * Mapping (as llama.cpp's convert_hf_to_gguf.py does it, except where
 * said):
 *  - model.vocab → NORMAL tokens (their byte-level strings as they are);
 *    added_tokens → CONTROL when "special", USER_DEFINED otherwise (llama.cpp
 *    also makes non-special tokens spelled <|...|> CONTROL; duplex keeps
 *    Hugging Face's flag, so that text is matched exactly as Hugging Face
 *    matches it); ids nobody names → "[PAD<id>]", UNUSED.  Byte-level BPE
 *    has no BYTE tokens (those are for SentencePiece byte fallback).
 *  - merges in either form, "a b" or ["a", "b"] → "a b".
 *  - the Split regex → tokenizer.ggml.pre "qwen2" or "llama-bpe";
 *    model.ignore_merges must be what that pre-tokenizer implies (true for
 *    Llama 3).
 *  - normalizer NFC → nfc (written under duplex's own key).
 *  - BOS/EOS/PAD from tokenizer_config.json's bos_token / eos_token /
 *    pad_token; EOT is the first of <|eot_id|>, <|im_end|>, <|end|>,
 *    <end_of_turn> in the vocabulary (what llama.cpp would detect).
 *  - add_bos_token / add_eos_token from tokenizer_config.json, else from the
 *    post-processor (a TemplateProcessing whose single sequence starts with
 *    the BOS token / ends with the EOS token), else off — which is what
 *    Hugging Face's encode(text) then does.
 *  - chat_template from tokenizer_config.json (a string, or the "default"
 *    entry of a list of named templates). */
#ifndef HF_TOK_H
#define HF_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "tok/tok.h"

typedef struct {
    char **tokens;   /* [n_tokens] GGUF token strings, NUL-terminated */
    int32_t *types;  /* [n_tokens] enum tok_type */
    size_t n_tokens; /* highest id + 1 (hf_tok_pad can raise it) */
    char **merges;   /* [n_merges] "left right", rank order */
    size_t n_merges;
    enum tok_pre pre;
    enum tok_norm norm;
    int32_t bos, eos, eot, pad; /* -1 if absent */
    int add_bos, add_eos;
    char *chat_template; /* NULL if none */
} hf_tok;

/* Reads PATH (a tokenizer.json, or a directory holding one) and the
 * tokenizer_config.json in the same directory if it exists.  Files over
 * 1 GiB are refused. */
int hf_tok_load(const char *path, hf_tok *out);
/* The same from memory; cfg may be NULL.  json_name and cfg_name name the
 * texts in messages. */
int hf_tok_parse(const char *json, size_t json_len, const char *json_name, const char *cfg,
                 size_t cfg_len, const char *cfg_name, hf_tok *out);
/* Pads the vocabulary with "[PAD<id>]" UNUSED tokens up to n (the model's
 * vocabulary size, as real checkpoints round it up); DX_EINVAL if it
 * already has more. */
int hf_tok_pad(hf_tok *h, size_t n);
/* Builds a duplex tokenizer from it (to validate, or to use). */
int hf_tok_build(const hf_tok *h, tok **out);
void hf_tok_free(hf_tok *h);

#endif
