/* Synthetic models and the model loader: same seed → byte-identical file,
 * the loader reads back what synth wrote for every arch and dtype (the
 * mixtures of experts too), and bad model files (missing tensor, wrong
 * shape, unknown architecture, inconsistent expert counts, misshapen
 * experts) are clear errors; the fingerprint covers every tensor byte and
 * the hyper-parameters, the routing's included. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_buf.h"
#include "model/model.h"
#include "model/model_wtypes.h"
#include "model/synth.h"

#include "../test_proc.h"

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(g_dir, "/tmp/dx_test_model_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd);
}

static void synth_preset_to(const char *name, enum model_arch a, const char *preset, int dtype,
                            uint64_t seed, char *path)
{
    snprintf(path, 256, "%s/%s", g_dir, name);
    synth_config c = {.arch = a, .preset = preset, .dtype = dtype, .seed = seed};
    int rc = synth_write(&c, path);
    if (rc) fprintf(stderr, "synth: %s\n", dx_errmsg());
    assert_int_equal(rc, 0);
}

static void synth_to(const char *name, enum model_arch a, int dtype, uint64_t seed, char *path)
{
    snprintf(path, 256, "%s/%s", g_dir, name);
    synth_config c = {.arch = a, .preset = "tiny", .dtype = dtype, .seed = seed};
    int rc = synth_write(&c, path);
    if (rc) fprintf(stderr, "synth: %s\n", dx_errmsg());
    assert_int_equal(rc, 0);
}

static void test_synth_deterministic(void **state)
{
    (void)state;
    char a[256], b[256], c[256];
    synth_to("a.gguf", MODEL_QWEN3, DX_BF16, 7, a);
    synth_to("b.gguf", MODEL_QWEN3, DX_BF16, 7, b);
    synth_to("c.gguf", MODEL_QWEN3, DX_BF16, 8, c);
    size_t na = 0, nb = 0, nc = 0;
    void *pa = tp_slurp(a, &na), *pb = tp_slurp(b, &nb), *pc = tp_slurp(c, &nc);
    assert_true(pa && pb && pc);
    assert_int_equal(na, nb);
    assert_memory_equal(pa, pb, na);
    assert_int_equal(na, nc);
    assert_memory_not_equal(pa, pc, na);
    free(pa);
    free(pb);
    free(pc);
    /* different seeds → different fingerprints */
    model *ma, *mc;
    assert_int_equal(model_load(a, &ma), 0);
    assert_int_equal(model_load(c, &mc), 0);
    uint64_t fa[2], fc[2];
    model_fingerprint(ma, fa);
    model_fingerprint(mc, fc);
    assert_true(fa[0] != fc[0] || fa[1] != fc[1]);
    model_free(ma);
    model_free(mc);
}

static void test_load_every_arch_and_dtype(void **state)
{
    (void)state;
    const enum model_arch archs[] = {MODEL_QWEN3, MODEL_QWEN2, MODEL_LLAMA};
    const int dtypes[] = {DX_F32,  DX_F16,  DX_BF16, DX_Q8_0,  DX_Q4_0,
                          DX_Q4_1, DX_Q5_0, DX_Q5_1, DX_IQ4_NL};
    const synth_preset *p = synth_find_preset("tiny");
    size_t live = dx_alloc_live_bytes();
    for (size_t i = 0; i < 3; i++)
        for (size_t j = 0; j < DX_ARRAY_LEN(dtypes); j++) {
            char path[256];
            synth_to("m.gguf", archs[i], dtypes[j], 1, path);
            model *m;
            int rc = model_load(path, &m);
            if (rc) fprintf(stderr, "load: %s\n", dx_errmsg());
            assert_int_equal(rc, 0);
            const model_hparams *hp = model_hp(m);
            assert_int_equal(hp->arch, archs[i]);
            assert_int_equal(hp->n_embd, p->n_embd);
            assert_int_equal(hp->n_layer, p->n_layer);
            assert_int_equal(hp->n_head, p->n_head);
            assert_int_equal(hp->n_kv_head, p->n_kv_head);
            assert_int_equal(hp->head_dim, p->head_dim);
            assert_int_equal(hp->n_ff, p->n_ff);
            assert_int_equal(hp->qk_norm, archs[i] == MODEL_QWEN3);
            assert_int_equal(hp->qkv_bias, archs[i] == MODEL_QWEN2);
            assert_int_equal(hp->rope_neox, archs[i] != MODEL_LLAMA);
            assert_int_equal(model_layer_at(m, 1)->wq.type, dtypes[j]);
            assert_int_equal(model_tok_embd(m)->type, dtypes[j]);
            assert_int_equal(model_layer_at(m, 1)->attn_norm.type, DX_F32);
            assert_int_equal(hp->n_vocab, tok_vocab_size(model_tokenizer(m)));
            assert_int_equal(model_chat_kind(m),
                             archs[i] == MODEL_LLAMA ? CHAT_TMPL_LLAMA3 : CHAT_TMPL_CHATML);
            /* the tokenizer round-trips text and has learned merges */
            tok_ids ids;
            tok_ids_init(&ids);
            const char *text = "The model serves requests quickly.";
            assert_int_equal(tok_encode(model_tokenizer(m), text, strlen(text), 0, &ids), 0);
            assert_true(ids.n < strlen(text) / 2);
            tok_ids_free(&ids);
            model_free(m);
        }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* One change to make while copying a model through the GGUF writer. */
typedef struct {
    const char *src;         /* the model to copy (NULL: the tiny qwen3 f32, seed 1) */
    const char *drop_tensor; /* leave this tensor out */
    const char *drop_key;    /* leave this key out */
    const char *arch;        /* general.architecture */
    const char *f32_key;     /* set this float key to f32_val */
    float f32_val;
    const char *retype; /* give this tensor type retype_to (of the same byte size) */
    int retype_to;
    const char *u32_key;     /* set this integer key to u32_val */
    const char *add_u32_key; /* add this integer key, = u32_val */
    const char *add_false;   /* add this boolean key, false */
    uint32_t u32_val;
    const char *reshape;   /* give this tensor the shape reshape_ne[0 .. reshape_dims) */
    uint32_t reshape_dims; /* (same element count: the data is kept) */
    uint64_t reshape_ne[3];
} model_edit;

static void copy_kv(const gguf_ctx *g, uint64_t i, const model_edit *e, gguf_writer *w)
{
    gguf_str k = gguf_kv_key(g, i);
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
    if (e->drop_key && !strcmp(key, e->drop_key)) return;
    enum gguf_vtype t = gguf_kv_type(g, i);
    if (t == GGUF_T_STRING) {
        gguf_str v;
        gguf_get_str(g, key, &v);
        char *s = dx_strndup(v.ptr, v.len);
        gguf_w_set_str(w, key, !strcmp(key, "general.architecture") && e->arch ? e->arch : s);
        dx_free(s);
    } else if (t == GGUF_T_ARRAY) {
        enum gguf_vtype et;
        uint64_t n;
        const void *d;
        gguf_get_arr(g, key, &et, &n, &d);
        if (et == GGUF_T_STRING) {
            const char **strs = dx_calloc(n, sizeof *strs);
            for (uint64_t j = 0; j < n; j++) {
                gguf_str v;
                gguf_get_arr_str(g, key, j, &v);
                strs[j] = dx_strndup(v.ptr, v.len);
            }
            gguf_w_set_arr_str(w, key, strs, n);
            for (uint64_t j = 0; j < n; j++) dx_free((void *)strs[j]);
            dx_free(strs);
        } else {
            gguf_w_set_arr(w, key, et, d, n);
        }
    } else if (t == GGUF_T_FLOAT32) {
        float f;
        gguf_get_f32(g, key, &f);
        gguf_w_set_f32(w, key, e->f32_key && !strcmp(key, e->f32_key) ? e->f32_val : f);
    } else if (t == GGUF_T_BOOL) {
        int b;
        gguf_get_bool(g, key, &b);
        gguf_w_set_bool(w, key, b);
    } else {
        uint32_t u;
        gguf_get_u32(g, key, &u);
        gguf_w_set_u32(w, key, e->u32_key && !strcmp(key, e->u32_key) ? e->u32_val : u);
    }
}

/* Writes e->src (or the tiny qwen3 f32 model, seed 1) to `out` through the
 * GGUF writer, with edit e applied. */
static void rewrite_model(const model_edit *e, const char *out)
{
    char path[256];
    if (e->src)
        snprintf(path, sizeof path, "%s", e->src);
    else
        synth_to("ok.gguf", MODEL_QWEN3, DX_F32, 1, path);
    gguf_ctx *g;
    assert_int_equal(gguf_open(path, &g), 0);
    gguf_writer *w = gguf_writer_create();
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) copy_kv(g, i, e, w);
    if (e->add_u32_key) assert_int_equal(gguf_w_set_u32(w, e->add_u32_key, e->u32_val), 0);
    if (e->add_false) assert_int_equal(gguf_w_set_bool(w, e->add_false, 0), 0);
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        gguf_tensor_info ti;
        gguf_tensor(g, i, &ti);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)ti.name.len, ti.name.ptr);
        if (e->drop_tensor && !strcmp(name, e->drop_tensor)) continue;
        int type = e->retype && !strcmp(name, e->retype) ? e->retype_to : ti.type;
        if (e->reshape && !strcmp(name, e->reshape)) {
            assert_int_equal(
                gguf_w_add_tensor(w, name, type, e->reshape_dims, e->reshape_ne, ti.data), 0);
            continue;
        }
        assert_int_equal(gguf_w_add_tensor(w, name, type, ti.n_dims, ti.ne, ti.data), 0);
    }
    assert_int_equal(gguf_w_write_file(w, out), 0);
    gguf_writer_destroy(w);
    gguf_close(g);
}

/* Rewrites the tiny model with one change and expects `code` with `phrase`
 * in the message. */
static void expect_bad(const char *drop_tensor, const char *arch, int code, const char *phrase)
{
    char bad[256];
    snprintf(bad, sizeof bad, "%s/bad.gguf", g_dir);
    rewrite_model(&(model_edit){.drop_tensor = drop_tensor, .arch = arch}, bad);
    model *m;
    assert_int_equal(model_load(bad, &m), code);
    assert_null(m);
    if (!strstr(dx_errmsg(), phrase)) fail_msg("message '%s' lacks '%s'", dx_errmsg(), phrase);
}

static void test_bad_models(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    expect_bad("blk.1.ffn_up.weight", NULL, DX_ENOENT, "blk.1.ffn_up.weight");
    expect_bad("blk.0.attn_q_norm.weight", NULL, DX_ENOENT, "attn_q_norm");
    expect_bad(NULL, "mamba", DX_EUNSUPPORTED, "mamba");
    /* a type GGUF knows but duplex does not run: named with its id and the
     * supported list (i32 has f32's size, so the file stays well-formed) */
    char bad[256];
    snprintf(bad, sizeof bad, "%s/bad.gguf", g_dir);
    rewrite_model(&(model_edit){.retype = "blk.1.attn_k.weight", .retype_to = 26}, bad);
    model *mb;
    assert_int_equal(model_load(bad, &mb), DX_EUNSUPPORTED);
    assert_null(mb);
    char want[256];
    snprintf(want, sizeof want,
             "tensor 'blk.1.attn_k.weight' has type i32 (id 26), which duplex cannot "
             "run (supported: %s)",
             dx_dtype_supported_names());
    assert_non_null(
        strstr(want, "(supported: f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0, iq4_nl"));
    if (!strstr(dx_errmsg(), want)) fail_msg("message '%s' lacks '%s'", dx_errmsg(), want);
    assert_int_equal(dx_alloc_live_bytes(), live);
    model *m;
    assert_true(model_load("/nonexistent/x.gguf", &m) < 0);
    assert_non_null(strstr(dx_errmsg(), "/nonexistent/x.gguf"));
}

/* A mixture, as llama-quantize writes them: each matrix its own type. */
static int mix_rule(const synth_wtypes *w, enum synth_role r, uint32_t il, uint32_t n_layer)
{
    (void)w;
    (void)n_layer;
    switch (r) {
    case SYNTH_ATTN_V:
        return il ? DX_Q5_0 : DX_Q4_1;
    case SYNTH_FFN_DOWN:
        return DX_Q8_0;
    case SYNTH_TOKEN_EMBD:
        return DX_IQ4_NL;
    case SYNTH_OUTPUT:
        return DX_Q5_1;
    default:
        return DX_Q4_0;
    }
}

/* Types may differ per tensor: the loader binds each with its own, and
 * `model info`'s summary groups them by role. */
static void test_mixed_types(void **state)
{
    (void)state;
    static const synth_wtypes mix = {"test-mix", 2, DX_Q4_0, mix_rule};
    char path[256];
    snprintf(path, sizeof path, "%s/mix.gguf", g_dir);
    synth_config c = {.arch = MODEL_QWEN3, .preset = "tiny", .wtypes = &mix, .seed = 3};
    assert_int_equal(synth_write(&c, path), 0);
    model *m;
    assert_int_equal(model_load(path, &m), 0);
    assert_int_equal(model_layer_at(m, 0)->wv.type, DX_Q4_1);
    assert_int_equal(model_layer_at(m, 1)->wv.type, DX_Q5_0);
    assert_int_equal(model_layer_at(m, 1)->wq.type, DX_Q4_0);
    assert_int_equal(model_layer_at(m, 0)->w_down.type, DX_Q8_0);
    assert_int_equal(model_layer_at(m, 0)->ffn_norm.type, DX_F32);
    assert_int_equal(model_tok_embd(m)->type, DX_IQ4_NL);
    assert_int_equal(model_output(m)->type, DX_Q5_1);
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(model_wtypes_summary(model_gguf(m), &b), 0);
    assert_string_equal(b.data, "attn_q,attn_k,attn_output: q4_0; attn_v: q4_1 x1, q5_0 x1; "
                                "ffn_gate,ffn_up: q4_0; ffn_down: q8_0; token_embd: iq4_nl; "
                                "output: q5_1");
    dx_buf_free(&b);
    model_free(m);
    /* one type throughout */
    synth_to("q4.gguf", MODEL_LLAMA, DX_Q4_0, 1, path);
    assert_int_equal(model_load(path, &m), 0);
    dx_buf_init(&b, 0);
    assert_int_equal(model_wtypes_summary(model_gguf(m), &b), 0);
    assert_string_equal(b.data, "attn_*: q4_0; ffn_*: q4_0; token_embd: q4_0; output: q4_0");
    dx_buf_free(&b);
    model_free(m);
}

/* What synth writes for tiny-moe, read back: qwen3moe and llama (Mixtral's
 * layout: expert_feed_forward_length only in qwen3moe), every dtype, the
 * router f32 as llama.cpp's converter writes it, the experts stacked. */
static void test_load_moe(void **state)
{
    (void)state;
    const enum model_arch archs[] = {MODEL_QWEN3MOE, MODEL_LLAMA};
    const int dtypes[] = {DX_F32, DX_F16, DX_BF16, DX_Q8_0, DX_Q4_0, DX_Q5_1, DX_IQ4_NL};
    const synth_preset *p = synth_find_preset("tiny-moe");
    size_t live = dx_alloc_live_bytes();
    for (size_t a = 0; a < 2; a++)
        for (size_t d = 0; d < DX_ARRAY_LEN(dtypes); d++) {
            char path[256];
            synth_preset_to("moe.gguf", archs[a], "tiny-moe", dtypes[d], 1, path);
            model *m;
            int rc = model_load(path, &m);
            if (rc) fail_msg("load: %s", dx_errmsg());
            const model_hparams *hp = model_hp(m);
            assert_int_equal(hp->arch, archs[a]);
            assert_string_equal(hp->arch_name, a ? "llama" : "qwen3moe");
            assert_int_equal(hp->n_expert, p->n_expert);
            assert_int_equal(hp->n_expert_used, p->n_expert_used);
            assert_int_equal(hp->n_ff_exp, p->n_ff_exp);
            assert_int_equal(hp->expert_weights_norm, 1);
            assert_int_equal(hp->qk_norm, archs[a] == MODEL_QWEN3MOE);
            assert_int_equal(hp->rope_neox, archs[a] == MODEL_QWEN3MOE);
            const model_layer *L = model_layer_at(m, 1);
            assert_null(L->w_gate.data);
            assert_int_equal(L->ffn_gate_inp.type, DX_F32);
            assert_int_equal(L->ffn_gate_inp.ne[0], p->n_embd);
            assert_int_equal(L->ffn_gate_inp.ne[1], p->n_expert);
            assert_int_equal(L->ffn_up_exps.type, dtypes[d]);
            assert_int_equal(L->ffn_up_exps.ne[0], p->n_embd);
            assert_int_equal(L->ffn_up_exps.ne[1], p->n_ff_exp);
            assert_int_equal(L->ffn_up_exps.ne[2], p->n_expert);
            assert_int_equal(L->ffn_down_exps.ne[0], p->n_ff_exp);
            assert_int_equal(L->ffn_down_exps.ne[1], p->n_embd);
            uint64_t per_expert = 3ull * p->n_embd * p->n_ff_exp;
            assert_int_equal(model_n_params(m) - model_n_active_params(m),
                             (uint64_t)p->n_layer * (p->n_expert - p->n_expert_used) * per_expert);
            assert_int_equal(model_chat_kind(m), a ? CHAT_TMPL_LLAMA3 : CHAT_TMPL_CHATML);
            model_free(m);
        }
    assert_int_equal(dx_alloc_live_bytes(), live);
    /* a dense preset is not qwen3moe, and tiny-moe not qwen2 */
    char path[256];
    snprintf(path, sizeof path, "%s/x.gguf", g_dir);
    synth_config c = {.arch = MODEL_QWEN3MOE, .preset = "tiny", .dtype = DX_F32, .seed = 1};
    assert_int_equal(synth_write(&c, path), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "mixture-of-experts preset"));
    c = (synth_config){.arch = MODEL_QWEN2, .preset = "tiny-moe", .dtype = DX_F32, .seed = 1};
    assert_int_equal(synth_write(&c, path), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "qwen3moe or llama"));
}

/* Loads e applied to the tiny qwen3moe f32 model and expects `code` with
 * `phrase` in the message. */
static void expect_bad_moe(model_edit e, int code, const char *phrase)
{
    char src[256], bad[256];
    synth_preset_to("moe-ok.gguf", MODEL_QWEN3MOE, "tiny-moe", DX_F32, 1, src);
    snprintf(bad, sizeof bad, "%s/moe-bad.gguf", g_dir);
    e.src = src;
    rewrite_model(&e, bad);
    model *m;
    int rc = model_load(bad, &m);
    if (rc != code) fail_msg("loading gave %d (want %d): %s", rc, code, dx_errmsg());
    assert_null(m);
    if (!strstr(dx_errmsg(), phrase)) fail_msg("message '%s' lacks '%s'", dx_errmsg(), phrase);
}

static void test_bad_moe_models(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    expect_bad_moe((model_edit){.u32_key = "qwen3moe.expert_used_count", .u32_val = 9}, DX_EFORMAT,
                   "qwen3moe.expert_used_count is 9 and qwen3moe.expert_count 8");
    expect_bad_moe((model_edit){.u32_key = "qwen3moe.expert_used_count", .u32_val = 0}, DX_EFORMAT,
                   "expert_used_count is 0");
    expect_bad_moe((model_edit){.u32_key = "qwen3moe.expert_count", .u32_val = 1000}, DX_EFORMAT,
                   "expert_count 1000");
    expect_bad_moe((model_edit){.drop_key = "qwen3moe.expert_count"}, DX_EFORMAT,
                   "qwen3moe.expert_count is missing");
    expect_bad_moe((model_edit){.add_u32_key = "qwen3moe.expert_gating_func", .u32_val = 2},
                   DX_EUNSUPPORTED, "expert_gating_func");
    expect_bad_moe((model_edit){.drop_tensor = "blk.1.ffn_gate_inp.weight"}, DX_ENOENT,
                   "tensor 'blk.1.ffn_gate_inp.weight' is missing");
    expect_bad_moe((model_edit){.drop_tensor = "blk.0.ffn_down_exps.weight"}, DX_ENOENT,
                   "blk.0.ffn_down_exps.weight");
    /* the experts' dims swapped, flattened to 2-D, or counted otherwise */
    expect_bad_moe(
        (model_edit){
            .reshape = "blk.0.ffn_up_exps.weight", .reshape_dims = 3, .reshape_ne = {96, 128, 8}},
        DX_EFORMAT, "'blk.0.ffn_up_exps.weight' has shape [96, 128, 8], want [128, 96, 8]");
    expect_bad_moe((model_edit){.reshape = "blk.1.ffn_gate_exps.weight",
                                .reshape_dims = 2,
                                .reshape_ne = {128, 768}},
                   DX_EFORMAT, "'blk.1.ffn_gate_exps.weight' has shape [128, 768], want");
    expect_bad_moe((model_edit){.reshape = "blk.1.ffn_down_exps.weight",
                                .reshape_dims = 3,
                                .reshape_ne = {96, 256, 4}},
                   DX_EFORMAT, "'blk.1.ffn_down_exps.weight' has shape [96, 256, 4]");
    expect_bad_moe((model_edit){.reshape = "blk.0.ffn_gate_inp.weight",
                                .reshape_dims = 2,
                                .reshape_ne = {256, 4}},
                   DX_EFORMAT, "'blk.0.ffn_gate_inp.weight' has shape [256, 4], want [128, 8]");
    /* experts in a qwen3 (dense) file, and expert_used_count without experts */
    char bad[256];
    snprintf(bad, sizeof bad, "%s/bad.gguf", g_dir);
    const char *keys[] = {"qwen3.expert_count", "qwen3.expert_used_count"};
    const char *why[] = {"experts are supported in qwen3moe and llama models only",
                         "qwen3.expert_used_count is 8 without qwen3.expert_count"};
    for (int i = 0; i < 2; i++) {
        rewrite_model(&(model_edit){.add_u32_key = keys[i], .u32_val = 8}, bad);
        model *m;
        assert_true(model_load(bad, &m) < 0);
        if (!strstr(dx_errmsg(), why[i])) fail_msg("message '%s' lacks '%s'", dx_errmsg(), why[i]);
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void fingerprint_of(const char *path, uint64_t fp[2])
{
    model *m;
    int rc = model_load(path, &m);
    if (rc) fail_msg("load %s: %s", path, dx_errmsg());
    model_fingerprint(m, fp);
    model_free(m);
}

static int fp_equal(const uint64_t a[2], const uint64_t b[2])
{
    return a[0] == b[0] && a[1] == b[1];
}

/* Copies `src` to `dst` with the byte at `off` of tensor `name`'s data
 * flipped. */
static void flip_tensor_byte(const char *src, const char *dst, const char *name, uint64_t off)
{
    gguf_ctx *g;
    gguf_tensor_info ti;
    assert_int_equal(gguf_open(src, &g), 0);
    assert_int_equal(gguf_find_tensor(g, name, &ti), 0);
    assert_true(off < ti.nbytes);
    uint64_t at = gguf_data_offset(g) + ti.offset + off;
    gguf_close(g);
    size_t n = 0;
    uint8_t *p = (uint8_t *)tp_slurp(src, &n);
    assert_non_null(p);
    assert_true(at < n);
    p[at] ^= 0x01;
    FILE *f = fopen(dst, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
    free(p);
}

/* The fingerprint covers every byte of every tensor: identical files (also
 * one copied through the GGUF writer, which lays it out afresh) agree, and
 * one flipped bit anywhere — including where the old per-tensor samples
 * (first, middle and last KiB) never looked — changes it. */
static void test_fingerprint_covers_all_data(void **state)
{
    (void)state;
    char a[256], b[256], c[256], flipped[256];
    synth_to("a.gguf", MODEL_QWEN3, DX_F32, 1, a);
    synth_to("b.gguf", MODEL_QWEN3, DX_F32, 1, b);
    snprintf(c, sizeof c, "%s/copy.gguf", g_dir);
    snprintf(flipped, sizeof flipped, "%s/flipped.gguf", g_dir);
    rewrite_model(&(model_edit){0}, c);
    uint64_t fa[2], fb[2], fc[2], ff[2];
    fingerprint_of(a, fa);
    fingerprint_of(b, fb);
    fingerprint_of(c, fc);
    assert_true(fp_equal(fa, fb));
    assert_true(fp_equal(fa, fc));
    gguf_ctx *g;
    gguf_tensor_info big, last;
    assert_int_equal(gguf_open(a, &g), 0);
    assert_int_equal(gguf_find_tensor(g, "blk.0.ffn_up.weight", &big), 0);
    assert_int_equal(gguf_tensor(g, gguf_n_tensors(g) - 1, &last), 0);
    char last_name[128];
    snprintf(last_name, sizeof last_name, "%.*s", (int)last.name.len, last.name.ptr);
    gguf_close(g);
    /* a quarter in: outside [0, 1K), [n/2 - 512, n/2 + 512) and [n - 1K, n) */
    assert_true(big.nbytes >= 16384);
    const struct {
        const char *name;
        uint64_t off;
    } flips[] = {
        {"blk.0.ffn_up.weight", big.nbytes / 4},
        {"blk.0.ffn_up.weight", big.nbytes / 2 + 4096},
        {"blk.0.ffn_up.weight", 0},
        {last_name, last.nbytes - 1},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(flips); i++) {
        flip_tensor_byte(a, flipped, flips[i].name, flips[i].off);
        fingerprint_of(flipped, ff);
        if (fp_equal(fa, ff))
            fail_msg("flipping byte %llu of %s left the fingerprint unchanged",
                     (unsigned long long)flips[i].off, flips[i].name);
    }
}

/* A hyper-parameter that changes the computation changes the fingerprint. */
static void test_fingerprint_covers_hparams(void **state)
{
    (void)state;
    char a[256], eps[256];
    synth_to("a.gguf", MODEL_QWEN3, DX_F32, 1, a);
    snprintf(eps, sizeof eps, "%s/eps.gguf", g_dir);
    rewrite_model(
        &(model_edit){.f32_key = "qwen3.attention.layer_norm_rms_epsilon", .f32_val = 1e-5f}, eps);
    uint64_t fa[2], fe[2];
    fingerprint_of(a, fa);
    fingerprint_of(eps, fe);
    assert_false(fp_equal(fa, fe));
    /* same file otherwise: the edit really reached the hyper-parameter */
    model *m;
    assert_int_equal(model_load(eps, &m), 0);
    assert_true(model_hp(m)->rms_eps == 1e-5f);
    model_free(m);
    /* the routing of an MoE model: experts per token are in no tensor's shape */
    char moe[256], k3[256];
    synth_preset_to("moe.gguf", MODEL_QWEN3MOE, "tiny-moe", DX_F32, 1, moe);
    snprintf(k3, sizeof k3, "%s/k3.gguf", g_dir);
    rewrite_model(&(model_edit){.src = moe, .u32_key = "qwen3moe.expert_used_count", .u32_val = 3},
                  k3);
    uint64_t fm[2], f3[2];
    fingerprint_of(moe, fm);
    fingerprint_of(k3, f3);
    assert_false(fp_equal(fm, f3));
    assert_int_equal(model_load(k3, &m), 0);
    assert_int_equal(model_hp(m)->n_expert_used, 3);
    model_free(m);
    /* expert_weights_norm false: read, and a fingerprint of its own */
    rewrite_model(&(model_edit){.src = moe, .add_false = "qwen3moe.expert_weights_norm"}, k3);
    fingerprint_of(k3, f3);
    assert_false(fp_equal(fm, f3));
    assert_int_equal(model_load(k3, &m), 0);
    assert_int_equal(model_hp(m)->expert_weights_norm, 0);
    model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synth_deterministic),
        cmocka_unit_test(test_load_every_arch_and_dtype),
        cmocka_unit_test(test_bad_models),
        cmocka_unit_test(test_mixed_types),
        cmocka_unit_test(test_load_moe),
        cmocka_unit_test(test_bad_moe_models),
        cmocka_unit_test(test_fingerprint_covers_all_data),
        cmocka_unit_test(test_fingerprint_covers_hparams),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
