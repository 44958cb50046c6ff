/* cli_tokenize: `duplex tokenize --model FILE [--text S | stdin] [--decode]`.
 * Encoding prints one line per token: id and the token's bytes, quoted and
 * escaped, or as <0xE6> per byte when they are not UTF-8 on their own;
 * --ids prints only the ids.  --decode reads ids (space or comma separated)
 * and prints the text.
 *
 * Text is tokenised as a raw prompt is (`duplex generate --prompt`, the
 * completions API): with BOS first when the model asks for it, unless
 * --no-bos.  --jsonl does many texts in one run: each input line is a JSON
 * string and each output line its ids (with --decode: a JSON array of ids
 * in, a JSON string out). */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_utf8.h"
#include "model/model.h"

#include <jansson.h>

/* f to its end, appended to b: 0, dx_buf_append's code or DX_EIO. */
static int read_all(FILE *f, dx_buf *b)
{
    char chunk[65536];
    size_t n;
    int rc;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if ((rc = dx_buf_append(b, chunk, n))) return rc;
    return ferror(f) ? dx_errf(DX_EIO, "read error: %s", strerror(errno)) : 0;
}

static void print_escaped(const char *s, int n)
{
    putchar('\'');
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\'' || c == '\\') printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('\'');
}

/* A piece that is not valid UTF-8 on its own (a byte token holding part of
 * a multi-byte character) shows its bytes as <0xE6>, as llama.cpp shows byte
 * tokens, instead of a U+FFFD on the terminal; others show quoted. */
static void print_piece(const char *s, int n)
{
    if (dx_utf8_valid_prefix((const uint8_t *)s, (size_t)n) == (size_t)n) {
        print_escaped(s, n);
        return;
    }
    for (int i = 0; i < n; i++) printf("<0x%02X>", (unsigned char)s[i]);
}

static int encode(const model *m, const char *text, size_t len, unsigned flags, int ids_only)
{
    const tok *tk = model_tokenizer(m);
    tok_ids ids;
    tok_ids_init(&ids);
    if (tok_encode(tk, text, len, flags, &ids)) {
        fprintf(stderr, "duplex tokenize: %s\n", dx_errmsg());
        tok_ids_free(&ids);
        return 1;
    }
    for (size_t i = 0; i < ids.n; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", ids.ids[i]);
            continue;
        }
        char piece[512];
        int n = tok_token_bytes(tk, ids.ids[i], piece, sizeof piece);
        printf("%8d  ", ids.ids[i]);
        print_piece(piece, n > 0 ? n : 0);
        putchar('\n');
    }
    if (ids_only) putchar('\n');
    fflush(stdout); /* the summary goes after the table, also on a terminal */
    if (!ids_only) fprintf(stderr, "%zu tokens, %zu bytes\n", ids.n, len);
    tok_ids_free(&ids);
    return 0;
}

static int decode(const model *m, const char *text)
{
    tok_ids ids;
    tok_ids_init(&ids);
    const char *p = text;
    int rc = 0;
    while (*p) {
        if (isspace((unsigned char)*p) || *p == ',' || *p == '[' || *p == ']') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "duplex tokenize --decode: bad token id at byte %zu: '%.16s'\n",
                    (size_t)(p - text), p);
            rc = 2;
            goto out;
        }
        tok_ids_push(&ids, (int32_t)v);
        p = end;
    }
    dx_buf out;
    dx_buf_init(&out, 0);
    if (tok_decode(model_tokenizer(m), ids.ids, ids.n, &out)) {
        fprintf(stderr, "duplex tokenize --decode: %s\n", dx_errmsg());
        rc = 1;
    } else {
        fwrite(out.data ? out.data : "", 1, out.len, stdout);
        putchar('\n');
    }
    dx_buf_free(&out);
out:
    tok_ids_free(&ids);
    return rc;
}

/* A JSON string of bytes: UTF-8 as it is, control characters escaped, and
 * each byte that is not valid UTF-8 as U+FFFD (JSON cannot carry it). */
static void print_json_string(const char *s, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = dx_utf8_seq_len((const uint8_t *)s + i, n - i);
        if (!k) {
            fputs("\\ufffd", stdout);
            i++;
            continue;
        }
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\u%04x", c);
        else
            fwrite(s + i, 1, k, stdout);
        i += k;
    }
    puts("\"");
}

/* One JSON value per line of in; empty lines are skipped. */
static int jsonl_line(const model *m, const char *line, size_t len, size_t lineno, int dec,
                      unsigned flags)
{
    json_error_t je;
    json_t *v = json_loadb(line, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    tok_ids ids;
    tok_ids_init(&ids);
    int rc = 0;
    if (!v || (dec ? !json_is_array(v) : !json_is_string(v))) {
        fprintf(stderr, "duplex tokenize --jsonl: line %zu: %s\n", lineno,
                v ? (dec ? "not an array of ids" : "not a JSON string") : je.text);
        rc = 2;
    } else if (!dec) {
        if (tok_encode(model_tokenizer(m), json_string_value(v), json_string_length(v), flags,
                       &ids) == 0) {
            for (size_t i = 0; i < ids.n; i++) printf(i ? " %d" : "%d", ids.ids[i]);
            putchar('\n');
        } else {
            fprintf(stderr, "duplex tokenize --jsonl: line %zu: %s\n", lineno, dx_errmsg());
            rc = 1;
        }
    } else {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e)
        {
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > INT32_MAX ||
                tok_ids_push(&ids, (int32_t)json_integer_value(e))) {
                fprintf(stderr,
                        "duplex tokenize --jsonl: line %zu: element %zu is not a token id\n",
                        lineno, i);
                rc = 2;
                break;
            }
        }
        dx_buf out;
        dx_buf_init(&out, 0);
        if (!rc && tok_decode(model_tokenizer(m), ids.ids, ids.n, &out)) {
            fprintf(stderr, "duplex tokenize --jsonl: line %zu: %s\n", lineno, dx_errmsg());
            rc = 1;
        }
        if (!rc) print_json_string(out.data ? out.data : "", out.len);
        dx_buf_free(&out);
    }
    json_decref(v);
    tok_ids_free(&ids);
    return rc;
}

static int jsonl(const model *m, const char *in, size_t len, int dec, unsigned flags)
{
    size_t lineno = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(in + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - in) : len;
        lineno++;
        size_t k = e;
        while (k > i && (in[k - 1] == '\r' || in[k - 1] == ' ')) k--;
        if (k > i) {
            int rc = jsonl_line(m, in + i, k - i, lineno, dec, flags);
            if (rc) return rc;
        }
        i = e + 1;
    }
    fflush(stdout);
    return 0;
}

int cli_tokenize_main(int argc, char **argv)
{
    const char *path = NULL, *text = NULL;
    int dec = 0, special = 0, ids_only = 0, no_bos = 0, lines = 0;
    const cli_opt opts[] = {
        {"model", CLI_PATH, &path, 0, 0, "GGUF model file (required)"},
        {"text", CLI_STR, &text, 0, 0, "text to tokenise (default: standard input)"},
        {"decode", CLI_FLAG, &dec, 0, 0, "input is token ids; print the text"},
        {"special", CLI_FLAG, &special, 0, 0,
         "match control tokens like <|im_start|> in the text (user-defined ones such as <think> "
         "always are)"},
        {"no-bos", CLI_FLAG, &no_bos, 0, 0,
         "add no BOS (or EOS) even when the model asks for it (tokenizer.ggml.add_bos_token)"},
        {"ids", CLI_FLAG, &ids_only, 0, 0, "print only the ids, on one line"},
        {"jsonl", CLI_FLAG, &lines, 0, 0,
         "many texts: a JSON string per input line, its ids per output line (with --decode: "
         "a JSON array of ids per line, a JSON string out)"},
    };
    int rc = cli_parse(
        "tokenize", "--model FILE [--text S] [--decode] [--special] [--no-bos] [--ids] [--jsonl]",
        argc, argv, opts, DX_ARRAY_LEN(opts), NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (!path) return cli_required("tokenize", "--model FILE");
    if (dec && (special || ids_only || no_bos)) {
        fprintf(stderr, "duplex tokenize: %s applies to encoding, not to --decode\n",
                special    ? "--special"
                : ids_only ? "--ids"
                           : "--no-bos");
        return 2;
    }
    if (lines && text) {
        fprintf(stderr, "duplex tokenize: --jsonl reads standard input, not --text\n");
        return 2;
    }
    unsigned flags = (special ? TOK_ALLOW_SPECIAL : 0) | (no_bos ? 0 : TOK_ADD_SPECIAL);
    model *m; /* the tokenizer only: no weights are bound or read */
    if (model_load_tokenizer(path, &m)) {
        fprintf(stderr, "duplex tokenize: %s\n", dx_errmsg());
        return 1;
    }
    dx_buf in;
    dx_buf_init(&in, 0);
    if (text) {
        dx_buf_puts(&in, text);
    } else if (read_all(stdin, &in)) {
        fprintf(stderr, "duplex tokenize: cannot read standard input\n");
        rc = 1;
    }
    const char *data = in.data ? in.data : "";
    if (!rc)
        rc = lines ? jsonl(m, data, in.len, dec, flags)
             : dec ? decode(m, data)
                   : encode(m, data, in.len, flags, ids_only);
    dx_buf_free(&in);
    model_free(m);
    return rc;
}
