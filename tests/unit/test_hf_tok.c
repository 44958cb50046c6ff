/* Hugging Face tokenizer import (src/tok/hf_tok.c) and its use by synth:
 * a small tokenizer.json built here in each shape the real ones take (both
 * merge forms, special and non-special added tokens, a gap in the ids, a
 * TemplateProcessing post-processor, NFC), the GGUF it becomes, and every
 * bad-input path with the file and field its message must name.  The real
 * Qwen3 and Llama 3 files are checked against transformers.js by
 * itest_tok_real. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "tok/hf_tok.h"
#include "model/model.h"
#include "model/synth.h"
#include "tok/tok_priv.h"
#include "tok/tok_norm.h"

#define QWEN_RE                                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"                                                               \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define LLAMA_RE                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static char g_dir[64];

/* The 256 byte tokens (ids 0..255), "ab" 256, "abab" 257, "Ġa" 258; added:
 * <|endoftext|> 300 (special), <|im_end|> 301 (special), <think> 302 (not
 * special); ids 259..299 are named by nobody. */
static json_t *mini_json(const char *regex)
{
    json_t *vocab = json_object();
    for (unsigned b = 0; b < 256; b++) {
        char bl[3] = {0};
        uint8_t byte = (uint8_t)b;
        tok_bytes_to_bl(&byte, 1, bl);
        json_object_set_new(vocab, bl, json_integer(b));
    }
    json_object_set_new(vocab, "ab", json_integer(256));
    json_object_set_new(vocab, "abab", json_integer(257));
    json_object_set_new(vocab,
                        "\xC4\xA0"
                        "a",
                        json_integer(258)); /* "Ġa" */
    json_t *added =
        json_pack("[{s:i,s:s,s:b,s:b,s:b,s:b,s:b},{s:i,s:s,s:b},{s:i,s:s,s:b}]", "id", 300,
                  "content", "<|endoftext|>", "special", 1, "lstrip", 0, "rstrip", 0, "single_word",
                  0, "normalized", 0, "id", 301, "content", "<|im_end|>", "special", 1, "id", 302,
                  "content", "<think>", "special", 0);
    json_t *merges = json_pack("[s,[s,s],s]", "a b", "ab", "ab", "\xC4\xA0 a");
    json_t *model =
        json_pack("{s:s,s:n,s:n,s:s,s:s,s:b,s:b,s:o,s:o}", "type", "BPE", "dropout", "unk_token",
                  "continuing_subword_prefix", "", "end_of_word_suffix", "", "fuse_unk", 0,
                  "byte_fallback", 0, "vocab", vocab, "merges", merges);
    json_object_set_new(model, "ignore_merges", json_boolean(!strcmp(regex, LLAMA_RE)));
    json_t *pre = json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence",
                            "pretokenizers", "type", "Split", "pattern", "Regex", regex, "behavior",
                            "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
                            "trim_offsets", 0, "use_regex", 0);
    return json_pack("{s:s,s:n,s:n,s:o,s:{s:s},s:o,s:{s:s},s:{s:s},s:o}", "version", "1.0",
                     "truncation", "padding", "added_tokens", added, "normalizer", "type", "NFC",
                     "pre_tokenizer", pre, "post_processor", "type", "ByteLevel", "decoder", "type",
                     "ByteLevel", "model", model);
}

static json_t *mini_cfg(void)
{
    return json_pack("{s:b,s:n,s:s,s:{s:s},s:s,s:f}", "add_bos_token", 0, "bos_token", "eos_token",
                     "<|im_end|>", "pad_token", "content", "<|endoftext|>", "chat_template",
                     "{% for m in messages %}<|im_start|>{% endfor %}", "model_max_length", 1e30);
}

/* Parses j (and cfg if not NULL) as text; returns hf_tok_parse's code. */
static int parse(json_t *j, json_t *cfg, hf_tok *h)
{
    char *js = json_dumps(j, JSON_COMPACT), *cs = cfg ? json_dumps(cfg, JSON_COMPACT) : NULL;
    int rc = hf_tok_parse(js, strlen(js), "tok.json", cs, cs ? strlen(cs) : 0, "cfg.json", h);
    free(js);
    free(cs);
    return rc;
}

/* Parsing, then building a tokenizer (as synth does), must fail so. */
static void expect_err(json_t *j, json_t *cfg, int code, const char *part)
{
    hf_tok h;
    size_t live = dx_alloc_live_bytes();
    int rc = parse(j, cfg, &h);
    if (rc == 0) {
        tok *t = NULL;
        rc = hf_tok_build(&h, &t);
        tok_destroy(t);
        hf_tok_free(&h);
    }
    if (rc != code || !strstr(dx_errmsg(), part))
        fail_msg("got %d '%s', want %d with '%s'", rc, dx_errmsg(), code, part);
    assert_null(h.tokens);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static int setup(void **state)
{
    (void)state;
    strcpy(g_dir, "/tmp/dx_test_hf_tok_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) ? -1 : 0;
}

static void test_mapping(void **state)
{
    (void)state;
    json_t *j = mini_json(QWEN_RE), *cfg = mini_cfg();
    hf_tok h;
    assert_int_equal(parse(j, cfg, &h), 0);
    assert_int_equal(h.n_tokens, 303);
    assert_int_equal(h.pre, TOK_PRE_QWEN2);
    assert_int_equal(h.norm, TOK_NORM_NFC);
    assert_string_equal(h.tokens[256], "ab");
    assert_int_equal(h.types[256], TOK_TYPE_NORMAL);
    assert_string_equal(h.tokens[259], "[PAD259]");
    assert_int_equal(h.types[259], TOK_TYPE_UNUSED);
    assert_int_equal(h.types[300], TOK_TYPE_CONTROL);
    assert_int_equal(h.types[302], TOK_TYPE_USER_DEFINED);
    assert_int_equal(h.n_merges, 3);
    assert_string_equal(h.merges[0], "a b");
    assert_string_equal(h.merges[1], "ab ab"); /* the array form */
    assert_int_equal(h.bos, -1);
    assert_int_equal(h.eos, 301);
    assert_int_equal(h.eot, 301); /* <|im_end|> */
    assert_int_equal(h.pad, 300);
    assert_false(h.add_bos);
    assert_string_equal(h.chat_template, "{% for m in messages %}<|im_start|>{% endfor %}");
    /* it builds a tokenizer that matches <think> always, control tokens on request */
    tok *t;
    assert_int_equal(hf_tok_build(&h, &t), 0);
    tok_ids ids;
    tok_ids_init(&ids);
    assert_int_equal(tok_encode(t, "ababab<think><|im_end|>", 23, 0, &ids), 0);
    assert_true(ids.n > 3);
    assert_int_equal(ids.ids[0], 257);
    assert_int_equal(ids.ids[1], 256);
    assert_int_equal(ids.ids[2], 302);
    assert_true(tok_is_eog(t, 300) && tok_is_eog(t, 301) && !tok_is_eog(t, 302));
    tok_ids_free(&ids);
    tok_destroy(t);
    /* padding to a model's vocabulary size */
    assert_int_equal(hf_tok_pad(&h, 310), 0);
    assert_int_equal(h.n_tokens, 310);
    assert_string_equal(h.tokens[309], "[PAD309]");
    assert_int_equal(hf_tok_pad(&h, 305), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "310 tokens, more than the model's 305"));
    hf_tok_free(&h);
    hf_tok_free(&h); /* twice is harmless */
    json_decref(j);
    json_decref(cfg);
}

/* add_bos: the config's flag wins; without one, the post-processor's
 * TemplateProcessing decides (and names BOS when the config does not). */
static void test_bos_sources(void **state)
{
    (void)state;
    json_t *j = mini_json(LLAMA_RE), *cfg = mini_cfg();
    json_object_set_new(j, "post_processor",
                        json_pack("{s:s,s:[{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}}]}]}", "type",
                                  "Sequence", "processors", "type", "TemplateProcessing", "single",
                                  "SpecialToken", "id", "<|endoftext|>", "type_id", 0, "Sequence",
                                  "id", "A", "type_id", 0));
    hf_tok h;
    assert_int_equal(parse(j, NULL, &h), 0); /* no config at all */
    assert_int_equal(h.pre, TOK_PRE_LLAMA3);
    assert_true(h.add_bos);
    assert_int_equal(h.bos, 300);
    assert_int_equal(h.eos, -1);
    assert_null(h.chat_template);
    hf_tok_free(&h);
    assert_int_equal(parse(j, cfg, &h), 0); /* the config says no */
    assert_false(h.add_bos);
    hf_tok_free(&h);
    json_object_del(cfg, "add_bos_token");
    json_object_set_new(cfg, "bos_token", json_string("<|im_end|>"));
    expect_err(j, cfg, DX_EUNSUPPORTED, "post_processor adds '<|endoftext|>' first, not the bos");
    json_object_set_new(cfg, "bos_token", json_pack("{s:s}", "content", "<|endoftext|>"));
    json_object_set_new(cfg, "chat_template",
                        json_pack("[{s:s,s:s},{s:s,s:s}]", "name", "tool_use", "template", "T",
                                  "name", "default", "template", "D"));
    assert_int_equal(parse(j, cfg, &h), 0);
    assert_true(h.add_bos);
    assert_string_equal(h.chat_template, "D");
    hf_tok_free(&h);
    json_decref(j);
    json_decref(cfg);
}

static json_t *at(json_t *j, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *v = j;
    for (char *save, *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save))
        v = json_is_array(v) ? json_array_get(v, (size_t)atoi(k)) : json_object_get(v, k);
    return v;
}

/* Applies one change to a fresh mini tokenizer and expects an error. */
static void bad(const char *path, const char *key, json_t *val, int code, const char *part)
{
    json_t *j = mini_json(QWEN_RE), *cfg = mini_cfg();
    json_t *o = path ? at(j, path) : j;
    assert_non_null(o);
    if (json_is_array(o))
        json_array_set_new(o, (size_t)atoi(key), val);
    else if (val)
        json_object_set_new(o, key, val);
    else
        json_object_del(o, key);
    expect_err(j, cfg, code, part);
    json_decref(j);
    json_decref(cfg);
}

static void test_rejects(void **state)
{
    (void)state;
    hf_tok h;
    assert_int_equal(hf_tok_parse("{\"a\":", 5, "tok.json", NULL, 0, NULL, &h), DX_EFORMAT);
    assert_non_null(strstr(dx_errmsg(), "tok.json: line 1"));
    assert_int_equal(hf_tok_parse("[]", 2, "tok.json", NULL, 0, NULL, &h), DX_EFORMAT);
    assert_non_null(strstr(dx_errmsg(), "not a JSON object"));
    assert_int_equal(hf_tok_parse("{\"a\":1,\"a\":2}", 13, "tok.json", NULL, 0, NULL, &h),
                     DX_EFORMAT);
    assert_non_null(strstr(dx_errmsg(), "duplicate"));

    bad("model", "type", json_string("Unigram"), DX_EUNSUPPORTED,
        "tok.json: model.type 'Unigram' is not supported (BPE)");
    bad("model", "byte_fallback", json_true(), DX_EUNSUPPORTED, "model.byte_fallback");
    bad("model", "byte_fallback", json_string("no"), DX_EFORMAT,
        "model.byte_fallback must be true or false");
    bad("model", "continuing_subword_prefix", json_string("##"), DX_EUNSUPPORTED,
        "model.continuing_subword_prefix '##'");
    bad("model", "dropout", json_real(0.1), DX_EUNSUPPORTED, "model.dropout");
    bad("model", "ignore_merges", json_true(), DX_EUNSUPPORTED,
        "model.ignore_merges is true with the qwen2 pre-tokenizer");
    bad("model", "vocab", json_array(), DX_EFORMAT, "model.vocab is missing or not an object");
    bad("model", "merges", NULL, DX_EFORMAT, "model.merges is missing");
    bad("model.vocab", "zz", json_integer(5), DX_EFORMAT, "model.vocab: '");
    bad("model.vocab", "zz", json_integer(-1), DX_EFORMAT, "model.vocab: the id of 'zz'");
    bad("model.vocab", "zz", json_string("7"), DX_EFORMAT, "model.vocab: the id of 'zz'");
    bad("model.merges", "0", json_string("ab"), DX_EFORMAT, "model.merges[0] 'ab' is not");
    bad("model.merges", "0", json_string("a b c"), DX_EFORMAT, "model.merges[0]");
    bad("model.merges", "1", json_pack("[s,s]", "a b", "c"), DX_EUNSUPPORTED,
        "model.merges[1] ['a b', 'c']");
    bad("model.merges", "1", json_integer(3), DX_EFORMAT, "model.merges[1] is neither");
    bad("model.merges", "2", json_string("x y"), DX_EFORMAT, "merge 2 'x y'"); /* tok_create */
    bad("pre_tokenizer.pretokenizers.0.pattern", "Regex", json_string("\\w+|\\s+"), DX_EUNSUPPORTED,
        "the split regex '\\w+|\\s+' is not one duplex knows");
    bad(NULL, "pre_tokenizer",
        json_pack("{s:s,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 1),
        DX_EUNSUPPORTED, "ByteLevel alone (GPT-2's regex");
    bad(NULL, "pre_tokenizer", json_pack("{s:s}", "type", "Metaspace"), DX_EUNSUPPORTED,
        "pre_tokenizer of type 'Metaspace'");
    bad("pre_tokenizer.pretokenizers.0", "behavior", json_string("Removed"), DX_EUNSUPPORTED,
        "Split behavior 'Removed'");
    bad("pre_tokenizer.pretokenizers.1", "add_prefix_space", json_true(), DX_EUNSUPPORTED,
        "add_prefix_space");
    bad(NULL, "normalizer", json_pack("{s:s}", "type", "NFKC"), DX_EUNSUPPORTED,
        "normalizer of type 'NFKC' is not supported (NFC or none)");
    bad(NULL, "decoder", json_pack("{s:s}", "type", "Metaspace"), DX_EUNSUPPORTED,
        "decoder of type 'Metaspace'");
    bad(NULL, "added_tokens", json_string("x"), DX_EFORMAT, "added_tokens is not an array");
    bad("added_tokens.0", "lstrip", json_true(), DX_EUNSUPPORTED,
        "added_tokens[0] '<|endoftext|>': lstrip is not supported");
    bad("added_tokens.0", "content", json_string(""), DX_EFORMAT,
        "added_tokens[0].content is missing or empty");
    bad("added_tokens.1", "id", json_integer(300), DX_EFORMAT,
        "added_tokens[1] '<|im_end|>' has id 300, which is already '<|endoftext|>'");
    bad("added_tokens.1", "content", json_string("ab"), DX_EFORMAT,
        "added_tokens[1] 'ab' (id 301) is also model.vocab's id 256");
    bad("added_tokens.1", "id", json_integer(1 << 24), DX_EFORMAT, "added_tokens[1]: the id");
    /* a token that is not a byte-level string: found when the tokenizer is built */
    bad("model.vocab", "a\x01", json_integer(280), DX_EFORMAT, "token 280");

    /* the config names its own file */
    json_t *j = mini_json(QWEN_RE), *cfg = mini_cfg();
    json_object_set_new(cfg, "eos_token", json_string("<nope>"));
    expect_err(j, cfg, DX_EFORMAT, "cfg.json: eos_token '<nope>' is not a token of tok.json");
    json_object_set_new(cfg, "eos_token", json_integer(3));
    expect_err(j, cfg, DX_EFORMAT, "cfg.json: eos_token must be a string");
    json_object_set_new(cfg, "eos_token", json_null());
    json_object_set_new(cfg, "add_eos_token", json_true());
    expect_err(j, cfg, DX_EFORMAT, "cfg.json: add_eos_token is true but there is no eos_token");
    json_object_del(cfg, "add_eos_token");
    json_object_set_new(cfg, "chat_template", json_integer(1));
    expect_err(j, cfg, DX_EFORMAT, "cfg.json: chat_template must be");
    json_object_set_new(cfg, "chat_template",
                        json_pack("[{s:s,s:s}]", "name", "x", "template", "y"));
    expect_err(j, cfg, DX_EFORMAT, "without a \"default\" template");
    json_decref(j);
    json_decref(cfg);

    assert_int_equal(hf_tok_load("/nonexistent/tokenizer.json", &h), DX_ENOENT);
    assert_non_null(strstr(dx_errmsg(), "/nonexistent/tokenizer.json"));
}

static void write_json(const char *path, json_t *j)
{
    assert_int_equal(json_dump_file(j, path, JSON_INDENT(1)), 0);
}

/* synth --tokenizer: the GGUF carries the imported vocabulary and keys,
 * and the model loader reads it back into the same tokenizer. */
static void test_synth_with_tokenizer(void **state)
{
    (void)state;
    char dir[128], jp[160], cp[160], out[160];
    snprintf(dir, sizeof dir, "%s/tk", g_dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(jp, sizeof jp, "%s/tokenizer.json", dir);
    snprintf(cp, sizeof cp, "%s/tokenizer_config.json", dir);
    snprintf(out, sizeof out, "%s/m.gguf", g_dir);
    json_t *j = mini_json(QWEN_RE), *cfg = mini_cfg();
    write_json(jp, j);
    write_json(cp, cfg);
    synth_config c = {
        .arch = MODEL_QWEN3, .preset = "tiny", .dtype = DX_F32, .seed = 3, .tokenizer = dir};
    assert_int_equal(synth_write(&c, out), 0);
    model *m;
    assert_int_equal(model_load(out, &m), 0);
    const tok *t = model_tokenizer(m);
    assert_int_equal(tok_vocab_size(t), 303);
    assert_int_equal(model_hp(m)->n_vocab, 303);
    assert_int_equal(tok_get_norm(t), TOK_NORM_NFC);
    assert_int_equal(tok_eos(t), 301);
    assert_int_equal(tok_eot(t), 301);
    assert_false(tok_add_bos(t));
    assert_int_equal(tok_find(t, "<think>", 7), 302);
    assert_true(tok_is_text(t, 302));
    assert_false(tok_is_text(t, 259)); /* [PAD259] */
    gguf_str s;
    assert_int_equal(gguf_get_str(model_gguf(m), "tokenizer.chat_template", &s), 0);
    assert_true(gguf_str_eq(s, "{% for m in messages %}<|im_start|>{% endfor %}"));
    assert_int_equal(gguf_get_str(model_gguf(m), MODEL_KEY_NORMALIZER, &s), 0);
    assert_true(gguf_str_eq(s, "nfc"));
    model_free(m);

    /* a preset with the real vocabulary size refuses a bigger tokenizer... */
    c.preset = "llama3.2-1b";
    c.arch = MODEL_QWEN3;
    assert_int_equal(synth_write(&c, out), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "preset llama3.2-1b is a llama model, not qwen3"));
    /* ...and a tokenizer that will not build names the file */
    json_object_set_new(at(j, "model.vocab"), "a\x01", json_integer(280));
    write_json(jp, j);
    c.preset = "tiny";
    assert_int_equal(synth_write(&c, out), DX_EFORMAT);
    if (!strstr(dx_errmsg(), dir) || !strstr(dx_errmsg(), "token 280"))
        fail_msg("message: %s", dx_errmsg());
    json_decref(j);
    json_decref(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mapping),
        cmocka_unit_test(test_bos_sources),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_synth_with_tokenizer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
