/* hf_tok: Hugging Face tokenizer.json → GGUF vocabulary (see hf_tok.h).
 *
 * jansson parses both files (duplicate keys rejected, so a vocabulary that
 * names one string twice is an error rather than a silent choice).  The
 * result is checked twice: structurally here, each message naming the file
 * and the JSON field, and then by building a duplex tokenizer from it
 * (hf_tok_build), which checks what only the whole vocabulary can show —
 * every byte has a token, every merge joins two tokens into a third, every
 * normal token is a valid byte-level string. */
#include "tok/hf_tok.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

#define HF_MAX_FILE   (1ull << 30)
#define HF_MAX_TOKENS (1u << 24) /* as model.c accepts */

/* The pre-tokenizer regexes exactly as Qwen2/Qwen3 and Llama 3 write them in
 * tokenizer.json; tok.c runs each (case-insensitive contractions spelled
 * out, as llama.cpp does). */
static const char k_re_qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                                 "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                 "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* What llama.cpp takes for the end of a turn, in the order tried here. */
static const char *const k_eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"};

typedef struct {
    const char *jn, *cn; /* the two texts' names, for messages */
    hf_tok *h;
    json_t *vocab; /* model.vocab */
    json_t *added; /* added_tokens (may be NULL) */
} hf_ctx;

/* flags: tokenizer_config.json is read with JSON_DECODE_INT_AS_REAL, as
 * Python writes model_max_length 1e30 there as an integer jansson cannot
 * hold, and none of its integers matter here. */
static json_t *parse(const char *text, size_t len, const char *name, size_t flags, int *rc)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | flags, &je);
    if (!root) {
        *rc = dx_errp(DX_EFORMAT, name, "line %d, column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        *rc = dx_errp(DX_EFORMAT, name, "not a JSON object");
        return NULL;
    }
    *rc = 0;
    return root;
}

/* A string member, NULL when absent or null; DX_EFORMAT for another type. */
static int opt_str(const json_t *o, const char *key, const char *file, const char *where,
                   const char **out)
{
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return dx_errp(DX_EFORMAT, file, "%s%s must be a string", where, key);
    *out = json_string_value(v);
    return 0;
}

/* A boolean member; *out untouched when absent or null. */
static int opt_bool(const json_t *o, const char *key, const char *file, const char *where, int *out)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return dx_errp(DX_EFORMAT, file, "%s%s must be true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

static const char *type_of(const json_t *o)
{
    const char *t = json_is_object(o) ? json_string_value(json_object_get(o, "type")) : NULL;
    return t ? t : "(none)";
}

/* ---- model options, pre-tokenizer, normalizer, decoder ----------------------------------------
 */

static int check_model(hf_ctx *c, const json_t *m)
{
    const char *jn = c->jn, *s;
    if (!json_is_object(m)) return dx_errp(DX_EFORMAT, jn, "model is missing or not an object");
    if (strcmp(type_of(m), "BPE"))
        return dx_errp(DX_EUNSUPPORTED, jn, "model.type '%s' is not supported (BPE)", type_of(m));
    int fb = 0, rc;
    if ((rc = opt_bool(m, "byte_fallback", jn, "model.", &fb))) return rc;
    if (fb)
        return dx_errp(DX_EUNSUPPORTED, jn,
                       "model.byte_fallback is true: only byte-level BPE is supported");
    const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < DX_ARRAY_LEN(affixes); i++) {
        if ((rc = opt_str(m, affixes[i], jn, "model.", &s))) return rc;
        if (s && *s)
            return dx_errp(DX_EUNSUPPORTED, jn, "model.%s '%s' is not supported", affixes[i], s);
    }
    json_t *d = json_object_get(m, "dropout");
    if (d && !json_is_null(d) && !(json_is_number(d) && json_number_value(d) == 0))
        return dx_errp(DX_EUNSUPPORTED, jn, "model.dropout is set: BPE dropout is not supported");
    c->vocab = json_object_get(m, "vocab");
    if (!json_is_object(c->vocab))
        return dx_errp(DX_EFORMAT, jn, "model.vocab is missing or not an object");
    if (!json_is_array(json_object_get(m, "merges")))
        return dx_errp(DX_EFORMAT, jn, "model.merges is missing or not an array");
    return 0;
}

/* The Split + ByteLevel pair every Qwen2/Qwen3/Llama 3 tokenizer.json has. */
static int pre_from_split(hf_ctx *c, const json_t *split, const json_t *bl)
{
    const char *jn = c->jn;
    json_t *pat = json_object_get(split, "pattern");
    const char *re = json_is_object(pat) ? json_string_value(json_object_get(pat, "Regex")) : NULL;
    if (!re) return dx_errp(DX_EUNSUPPORTED, jn, "pre_tokenizer: the Split has no pattern.Regex");
    const char *beh = json_string_value(json_object_get(split, "behavior"));
    if (!beh || strcmp(beh, "Isolated") || json_is_true(json_object_get(split, "invert")))
        return dx_errp(DX_EUNSUPPORTED, jn,
                       "pre_tokenizer: Split behavior '%s' (invert %s) is not supported "
                       "(Isolated, not inverted)",
                       beh ? beh : "(none)",
                       json_is_true(json_object_get(split, "invert")) ? "true" : "false");
    if (!strcmp(re, k_re_qwen2))
        c->h->pre = TOK_PRE_QWEN2;
    else if (!strcmp(re, k_re_llama3))
        c->h->pre = TOK_PRE_LLAMA3;
    else
        return dx_errp(DX_EUNSUPPORTED, jn,
                       "pre_tokenizer: the split regex '%.300s' is not one duplex knows "
                       "(qwen2's or llama-bpe's, as in Qwen2/Qwen3 and Llama 3)",
                       re);
    if (strcmp(type_of(bl), "ByteLevel"))
        return dx_errp(DX_EUNSUPPORTED, jn,
                       "pre_tokenizer: '%s' after the Split is not supported (ByteLevel)",
                       type_of(bl));
    if (json_is_true(json_object_get(bl, "add_prefix_space")) ||
        json_is_true(json_object_get(bl, "use_regex")))
        return dx_errp(DX_EUNSUPPORTED, jn,
                       "pre_tokenizer: ByteLevel with add_prefix_space or use_regex is "
                       "not supported");
    return 0;
}

static int check_pre(hf_ctx *c, const json_t *root)
{
    const char *jn = c->jn;
    json_t *p = json_object_get(root, "pre_tokenizer");
    if (!strcmp(type_of(p), "ByteLevel"))
        return dx_errp(DX_EUNSUPPORTED, jn,
                       "pre_tokenizer: ByteLevel alone (GPT-2's regex "
                       "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+|...) is not supported "
                       "(qwen2, llama-bpe)");
    json_t *list = json_object_get(p, "pretokenizers");
    if (strcmp(type_of(p), "Sequence") || !json_is_array(list) || json_array_size(list) != 2 ||
        strcmp(type_of(json_array_get(list, 0)), "Split"))
        return dx_errp(DX_EUNSUPPORTED, jn,
                       "pre_tokenizer of type '%s' is not supported (a Sequence of a "
                       "Split on qwen2's or llama-bpe's regex and ByteLevel)",
                       type_of(p));
    return pre_from_split(c, json_array_get(list, 0), json_array_get(list, 1));
}

static int check_norm(hf_ctx *c, const json_t *root)
{
    json_t *n = json_object_get(root, "normalizer");
    c->h->norm = TOK_NORM_NONE;
    if (!n || json_is_null(n)) return 0;
    json_t *list = json_object_get(n, "normalizers");
    if (!strcmp(type_of(n), "Sequence") && json_is_array(list) && json_array_size(list) <= 1) {
        if (!json_array_size(list)) return 0;
        n = json_array_get(list, 0);
    }
    if (!strcmp(type_of(n), "NFC")) {
        c->h->norm = TOK_NORM_NFC;
        return 0;
    }
    return dx_errp(DX_EUNSUPPORTED, c->jn, "normalizer of type '%s' is not supported (NFC or none)",
                   type_of(n));
}

static int check_decoder(hf_ctx *c, const json_t *root)
{
    json_t *d = json_object_get(root, "decoder");
    if (!strcmp(type_of(d), "ByteLevel")) return 0;
    return dx_errp(DX_EUNSUPPORTED, c->jn, "decoder of type '%s' is not supported (ByteLevel)",
                   type_of(d));
}

/* ---- vocabulary ----------------------------------------------------------------------------- */

static int bad_id(hf_ctx *c, const json_t *v, const char *where, const char *what, int64_t *id)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= (json_int_t)HF_MAX_TOKENS)
        return dx_errp(DX_EFORMAT, c->jn, "%s: the id of '%.64s' must be an integer in [0, %u)",
                       where, what, HF_MAX_TOKENS);
    *id = (int64_t)json_integer_value(v);
    return 0;
}

/* Highest id named by the vocabulary or the added tokens, + 1. */
static int count_ids(hf_ctx *c, size_t *n)
{
    int64_t max = -1, id;
    const char *key;
    json_t *v;
    int rc;
    json_object_foreach(c->vocab, key, v)
    {
        if ((rc = bad_id(c, v, "model.vocab", key, &id))) return rc;
        if (id > max) max = id;
    }
    size_t i;
    json_array_foreach(c->added, i, v)
    {
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!json_is_object(v)) return dx_errp(DX_EFORMAT, c->jn, "%s is not an object", where);
        if ((rc = bad_id(c, json_object_get(v, "id"), where, "id", &id))) return rc;
        if (id > max) max = id;
    }
    if (max < 0) return dx_errp(DX_EFORMAT, c->jn, "model.vocab is empty");
    *n = (size_t)max + 1;
    return 0;
}

static int set_token(hf_ctx *c, size_t id, const char *s, int type)
{
    hf_tok *h = c->h;
    if (!(h->tokens[id] = dx_strdup(s)))
        return dx_errf(DX_ENOMEM, "out of memory reading %s", c->jn);
    h->types[id] = type;
    return 0;
}

static int load_vocab(hf_ctx *c)
{
    const char *key;
    json_t *v;
    json_object_foreach(c->vocab, key, v)
    {
        size_t id = (size_t)json_integer_value(v);
        if (c->h->tokens[id])
            return dx_errp(DX_EFORMAT, c->jn, "model.vocab: '%.64s' and '%.64s' both have id %zu",
                           c->h->tokens[id], key, id);
        if (!*key) return dx_errp(DX_EFORMAT, c->jn, "model.vocab: an empty token (id %zu)", id);
        int rc = set_token(c, id, key, TOK_TYPE_NORMAL);
        if (rc) return rc;
    }
    return 0;
}

static int load_added(hf_ctx *c)
{
    size_t i;
    json_t *v;
    json_array_foreach(c->added, i, v)
    {
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        const char *content;
        int special = 0, rc;
        if ((rc = opt_str(v, "content", c->jn, where, &content)) ||
            (rc = opt_bool(v, "special", c->jn, where, &special)))
            return rc;
        if (!content || !*content)
            return dx_errp(DX_EFORMAT, c->jn, "%s.content is missing or empty", where);
        const char *const flags[] = {"lstrip", "rstrip", "single_word"};
        for (size_t k = 0; k < DX_ARRAY_LEN(flags); k++)
            if (json_is_true(json_object_get(v, flags[k])))
                return dx_errp(DX_EUNSUPPORTED, c->jn, "%s '%.64s': %s is not supported", where,
                               content, flags[k]);
        size_t id = (size_t)json_integer_value(json_object_get(v, "id"));
        int type = special ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED;
        if (c->h->tokens[id]) {
            /* an added token may also be in model.vocab, under its own id */
            if (strcmp(c->h->tokens[id], content) || c->h->types[id] != TOK_TYPE_NORMAL)
                return dx_errp(DX_EFORMAT, c->jn, "%s '%.64s' has id %zu, which is already '%.64s'",
                               where, content, id, c->h->tokens[id]);
            c->h->types[id] = type;
            continue;
        }
        json_t *other = json_object_get(c->vocab, content);
        if (other)
            return dx_errp(DX_EFORMAT, c->jn, "%s '%.64s' (id %zu) is also model.vocab's id %lld",
                           where, content, id, (long long)json_integer_value(other));
        if ((rc = set_token(c, id, content, type))) return rc;
    }
    return 0;
}

static int pad_gaps(hf_ctx *c, size_t from)
{
    hf_tok *h = c->h;
    for (size_t i = from; i < h->n_tokens; i++) {
        if (h->tokens[i]) continue;
        char name[32];
        snprintf(name, sizeof name, "[PAD%zu]", i);
        int rc = set_token(c, i, name, TOK_TYPE_UNUSED);
        if (rc) return rc;
    }
    return 0;
}

/* A merge as GGUF writes it; the array form may not hold a space, which
 * "left right" could not carry. */
static int load_merge(hf_ctx *c, size_t i, const json_t *m)
{
    char *s = NULL;
    if (json_is_string(m)) {
        const char *t = json_string_value(m), *sp = strchr(t, ' ');
        if (!sp || sp == t || !sp[1] || strchr(sp + 1, ' '))
            return dx_errp(DX_EFORMAT, c->jn, "model.merges[%zu] '%.64s' is not 'left right'", i,
                           t);
        s = dx_strdup(t);
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
        const char *a = json_string_value(json_array_get(m, 0)),
                   *b = json_string_value(json_array_get(m, 1));
        if (!*a || !*b || strchr(a, ' ') || strchr(b, ' '))
            return dx_errp(DX_EUNSUPPORTED, c->jn,
                           "model.merges[%zu] ['%.64s', '%.64s']: a part is empty or holds "
                           "a space, which GGUF's 'left right' merges cannot carry",
                           i, a, b);
        size_t la = strlen(a), lb = strlen(b);
        if ((s = dx_malloc(la + lb + 2))) {
            memcpy(s, a, la);
            s[la] = ' ';
            memcpy(s + la + 1, b, lb + 1);
        }
    } else {
        return dx_errp(DX_EFORMAT, c->jn,
                       "model.merges[%zu] is neither \"left right\" nor [\"left\", \"right\"]", i);
    }
    if (!s) return dx_errf(DX_ENOMEM, "out of memory reading %s", c->jn);
    c->h->merges[i] = s;
    return 0;
}

static int load_merges(hf_ctx *c, const json_t *arr)
{
    size_t n = json_array_size(arr);
    if (!(c->h->merges = dx_calloc(n ? n : 1, sizeof *c->h->merges)))
        return dx_errf(DX_ENOMEM, "out of memory reading %s", c->jn);
    c->h->n_merges = n;
    for (size_t i = 0; i < n; i++) {
        int rc = load_merge(c, i, json_array_get(arr, i));
        if (rc) return rc;
    }
    return 0;
}

/* ---- special tokens and flags --------------------------------------------------------------- */

static int32_t find_id(const hf_ctx *c, const char *s)
{
    for (size_t i = 0; i < c->h->n_tokens; i++)
        if (c->h->types[i] != TOK_TYPE_NORMAL && !strcmp(c->h->tokens[i], s)) return (int32_t)i;
    json_t *v = json_object_get(c->vocab, s);
    return v ? (int32_t)json_integer_value(v) : DX_NONE;
}

/* bos_token etc.: a string, {"content": ...}, or null. */
static int cfg_token(hf_ctx *c, const json_t *cfg, const char *key, int32_t *out)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return dx_errp(DX_EFORMAT, c->cn, "%s must be a string or {\"content\": ...}", key);
    *out = find_id(c, json_string_value(v));
    if (*out < 0)
        return dx_errp(DX_EFORMAT, c->cn, "%s '%.64s' is not a token of %s", key,
                       json_string_value(v), c->jn);
    return 0;
}

static int cfg_template(hf_ctx *c, const json_t *cfg)
{
    json_t *v = json_object_get(cfg, "chat_template");
    const char *t = NULL;
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        t = json_string_value(v);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e)
        {
            const char *name = json_string_value(json_object_get(e, "name"));
            if (name && !strcmp(name, "default"))
                t = json_string_value(json_object_get(e, "template"));
        }
        if (!t)
            return dx_errp(DX_EFORMAT, c->cn,
                           "chat_template: a list without a \"default\" template");
    } else {
        return dx_errp(DX_EFORMAT, c->cn,
                       "chat_template must be a string or a list of named templates");
    }
    if (!t)
        return dx_errp(DX_EFORMAT, c->cn, "chat_template: the default template is not a string");
    if (!(c->h->chat_template = dx_strdup(t)))
        return dx_errf(DX_ENOMEM, "out of memory reading %s", c->cn);
    return 0;
}

/* The special token a TemplateProcessing puts first (first = 1) or last in
 * its "single" template, DX_NONE if none; found inside a Sequence too. */
static int32_t template_edge(const hf_ctx *c, const json_t *pp, int first)
{
    if (!strcmp(type_of(pp), "Sequence")) {
        size_t i;
        json_t *e;
        int32_t id = DX_NONE;
        json_array_foreach(json_object_get(pp, "processors"), i, e)
        {
            int32_t k = template_edge(c, e, first);
            if (k >= 0) id = k;
        }
        return id;
    }
    if (strcmp(type_of(pp), "TemplateProcessing")) return DX_NONE;
    json_t *single = json_object_get(pp, "single");
    size_t n = json_array_size(single);
    if (!n) return DX_NONE;
    json_t *e = json_object_get(json_array_get(single, first ? 0 : n - 1), "SpecialToken");
    const char *id = json_string_value(json_object_get(e, "id"));
    return id ? find_id(c, id) : DX_NONE;
}

/* add_bos/add_eos: the config's flag when it has one, else what the
 * post-processor does. */
static int post_flag(hf_ctx *c, const json_t *root, int first, int32_t *tokid, int *flag)
{
    int32_t e = template_edge(c, json_object_get(root, "post_processor"), first);
    if (e < 0) return 0;
    if (*tokid < 0) *tokid = e;
    if (*tokid != e)
        return dx_errp(DX_EUNSUPPORTED, c->jn,
                       "post_processor adds '%.64s' %s, not the %s token '%.64s'", c->h->tokens[e],
                       first ? "first" : "last", first ? "bos" : "eos", c->h->tokens[*tokid]);
    *flag = 1;
    return 0;
}

static int load_specials(hf_ctx *c, const json_t *root, const json_t *cfg)
{
    hf_tok *h = c->h;
    int rc, has_bos = 0, has_eos = 0;
    if (cfg) {
        if ((rc = cfg_token(c, cfg, "bos_token", &h->bos)) ||
            (rc = cfg_token(c, cfg, "eos_token", &h->eos)) ||
            (rc = cfg_token(c, cfg, "pad_token", &h->pad)) || (rc = cfg_template(c, cfg)))
            return rc;
        has_bos = json_object_get(cfg, "add_bos_token") != NULL;
        has_eos = json_object_get(cfg, "add_eos_token") != NULL;
        if ((rc = opt_bool(cfg, "add_bos_token", c->cn, "", &h->add_bos)) ||
            (rc = opt_bool(cfg, "add_eos_token", c->cn, "", &h->add_eos)))
            return rc;
    }
    if (!has_bos && (rc = post_flag(c, root, 1, &h->bos, &h->add_bos))) return rc;
    if (!has_eos && (rc = post_flag(c, root, 0, &h->eos, &h->add_eos))) return rc;
    if (h->add_bos && h->bos < 0)
        return dx_errp(DX_EFORMAT, c->cn, "add_bos_token is true but there is no bos_token");
    if (h->add_eos && h->eos < 0)
        return dx_errp(DX_EFORMAT, c->cn, "add_eos_token is true but there is no eos_token");
    for (size_t i = 0; i < DX_ARRAY_LEN(k_eot_texts) && h->eot < 0; i++) {
        int32_t id = find_id(c, k_eot_texts[i]);
        if (id >= 0 && h->types[id] != TOK_TYPE_NORMAL) h->eot = id;
    }
    return 0;
}

/* ---- entry points --------------------------------------------------------------------------- */

static int parse_all(hf_ctx *c, json_t *root, json_t *cfg)
{
    hf_tok *h = c->h;
    json_t *m = json_object_get(root, "model");
    int rc;
    if ((rc = check_model(c, m)) || (rc = check_pre(c, root)) || (rc = check_norm(c, root)) ||
        (rc = check_decoder(c, root)))
        return rc;
    int ignore = 0;
    if ((rc = opt_bool(m, "ignore_merges", c->jn, "model.", &ignore))) return rc;
    if (ignore != (h->pre == TOK_PRE_LLAMA3))
        return dx_errp(DX_EUNSUPPORTED, c->jn,
                       "model.ignore_merges is %s with the %s pre-tokenizer (duplex "
                       "ties it to llama-bpe, as llama.cpp does)",
                       ignore ? "true" : "false", tok_pre_name(h->pre));
    c->added = json_object_get(root, "added_tokens");
    if (c->added && !json_is_null(c->added) && !json_is_array(c->added))
        return dx_errp(DX_EFORMAT, c->jn, "added_tokens is not an array");
    if (!json_is_array(c->added)) c->added = NULL;
    if ((rc = count_ids(c, &h->n_tokens))) return rc;
    h->tokens = dx_calloc(h->n_tokens, sizeof *h->tokens);
    h->types = dx_calloc(h->n_tokens, sizeof *h->types);
    if (!h->tokens || !h->types) return dx_errf(DX_ENOMEM, "out of memory reading %s", c->jn);
    if ((rc = load_vocab(c)) || (rc = load_added(c)) || (rc = pad_gaps(c, 0)) ||
        (rc = load_merges(c, json_object_get(m, "merges"))))
        return rc;
    return load_specials(c, root, cfg);
}

int hf_tok_parse(const char *json, size_t json_len, const char *json_name, const char *cfg,
                 size_t cfg_len, const char *cfg_name, hf_tok *out)
{
    memset(out, 0, sizeof *out);
    out->bos = out->eos = out->eot = out->pad = -1;
    hf_ctx c = {.jn = json_name, .cn = cfg_name ? cfg_name : "tokenizer_config.json", .h = out};
    int rc;
    json_t *root = parse(json, json_len, c.jn, 0, &rc), *cj = NULL;
    if (root && cfg) cj = parse(cfg, cfg_len, c.cn, JSON_DECODE_INT_AS_REAL, &rc);
    if (!rc) rc = parse_all(&c, root, cj);
    json_decref(root);
    json_decref(cj);
    if (rc) hf_tok_free(out);
    return rc;
}

/* Reads a whole file; DX_ENOENT when it does not exist. */
static int read_file(const char *path, char **data, size_t *len)
{
    *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return dx_errf(errno == ENOENT ? DX_ENOENT : DX_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        rc = dx_errf(DX_EIO, "%s: not a regular file", path);
    } else if ((uint64_t)st.st_size > HF_MAX_FILE) {
        rc = dx_errf(DX_ETOOBIG, "%s: %lld bytes is over the 1 GiB limit", path,
                     (long long)st.st_size);
    } else if (!(*data = dx_malloc((size_t)st.st_size + 1))) {
        rc = dx_errf(DX_ENOMEM, "out of memory reading %s", path);
    } else if (fread(*data, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        rc = dx_errf(DX_EIO, "%s: short read", path);
    }
    fclose(f);
    if (rc) {
        dx_free(*data);
        *data = NULL;
        return rc;
    }
    *len = (size_t)st.st_size;
    return 0;
}

int hf_tok_load(const char *path, hf_tok *out)
{
    memset(out, 0, sizeof *out);
    char jpath[4096], cpath[4096];
    struct stat st;
    int dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    if (snprintf(jpath, sizeof jpath, dir ? "%s/tokenizer.json" : "%s", path) >= (int)sizeof jpath)
        return dx_errf(DX_EINVAL, "tokenizer path too long: %.64s...", path);
    const char *slash = strrchr(jpath, '/');
    int dlen = slash ? (int)(slash - jpath) : 1;
    snprintf(cpath, sizeof cpath, "%.*s/tokenizer_config.json", dlen, slash ? jpath : ".");
    char *j = NULL, *cf = NULL;
    size_t jl = 0, cl = 0;
    int rc = read_file(jpath, &j, &jl);
    if (!rc) {
        rc = read_file(cpath, &cf, &cl);
        if (rc == DX_ENOENT) rc = 0; /* the config is optional */
    }
    if (!rc) rc = hf_tok_parse(j, jl, jpath, cf, cl, cf ? cpath : NULL, out);
    dx_free(j);
    dx_free(cf);
    return rc;
}

int hf_tok_pad(hf_tok *h, size_t n)
{
    if (n < h->n_tokens)
        return dx_errf(DX_EINVAL, "the tokenizer has %zu tokens, more than the model's %zu",
                       h->n_tokens, n);
    if (n == h->n_tokens) return 0;
    char **t = dx_realloc(h->tokens, n * sizeof *t);
    if (!t) return dx_errf(DX_ENOMEM, "out of memory padding the vocabulary");
    h->tokens = t;
    int32_t *ty = dx_realloc(h->types, n * sizeof *ty);
    if (!ty) return dx_errf(DX_ENOMEM, "out of memory padding the vocabulary");
    h->types = ty;
    size_t from = h->n_tokens;
    memset(h->tokens + from, 0, (n - from) * sizeof *t);
    h->n_tokens = n;
    hf_ctx c = {.jn = "tokenizer", .h = h};
    return pad_gaps(&c, from);
}

int hf_tok_build(const hf_tok *h, tok **out)
{
    *out = NULL;
    tok_strview *tv = dx_calloc(h->n_tokens ? h->n_tokens : 1, sizeof *tv);
    tok_strview *mv = dx_calloc(h->n_merges ? h->n_merges : 1, sizeof *mv);
    int rc;
    if (!tv || !mv) {
        rc = dx_errf(DX_ENOMEM, "out of memory building the tokenizer");
        goto out;
    }
    for (size_t i = 0; i < h->n_tokens; i++)
        tv[i] = (tok_strview){h->tokens[i], strlen(h->tokens[i])};
    for (size_t i = 0; i < h->n_merges; i++)
        mv[i] = (tok_strview){h->merges[i], strlen(h->merges[i])};
    tok_config tc = {.tokens = tv,
                     .n_tokens = h->n_tokens,
                     .token_types = h->types,
                     .merges = mv,
                     .n_merges = h->n_merges,
                     .pre = h->pre,
                     .bos = h->bos,
                     .eos = h->eos,
                     .eot = h->eot,
                     .add_bos = h->add_bos,
                     .add_eos = h->add_eos,
                     .norm = h->norm};
    rc = tok_create(&tc, out);
out:
    dx_free(tv);
    dx_free(mv);
    return rc;
}

void hf_tok_free(hf_tok *h)
{
    if (!h) return;
    for (size_t i = 0; h->tokens && i < h->n_tokens; i++) dx_free(h->tokens[i]);
    for (size_t i = 0; h->merges && i < h->n_merges; i++) dx_free(h->merges[i]);
    dx_free(h->tokens);
    dx_free(h->types);
    dx_free(h->merges);
    dx_free(h->chat_template);
    memset(h, 0, sizeof *h);
    h->bos = h->eos = h->eot = h->pad = -1;
}
