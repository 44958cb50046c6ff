/* oai_req: parses and validates OpenAI request bodies
 * (POST /v1/chat/completions, POST /v1/completions) with jansson.
 *
 * Validation follows the OpenAI API reference: every field we understand is
 * type- and range-checked and a bad one is a 400 whose message and `param`
 * name it ("messages[2].content: expected a string or an array of text
 * parts"); unknown fields are ignored, as OpenAI-compatible servers do.
 * Strings point into the parsed JSON document, which the request owns
 * (oai_req_free releases it); jansson has already rejected invalid UTF-8.
 *
 * Later roles (prefill/decode) read `kv_transfer_params`, kept here as the
 * raw JSON object for the node to interpret. */
#ifndef OAI_REQ_H
#define OAI_REQ_H

#include <stddef.h>
#include <stdint.h>

enum oai_kind { OAI_CHAT, OAI_COMPLETION };

/* Limits on what a request may ask for (docs/api.md, "Limits"), each a 400
 * naming the field and the limit.  Nodes and the router parse with the same
 * code, so they agree.  OpenAI allows 4 stop strings, 2048 messages and 128
 * tools; these are deliberately more permissive (vLLM sets no count), while
 * keeping the work and memory a request can demand bounded. */
#define OAI_MAX_STOP       16
#define OAI_MAX_STOP_BYTES (64u << 10) /* all stop strings together */
#define OAI_MAX_MESSAGES   16384
#define OAI_MAX_TOOLS      1024

typedef struct {
    const char *role; /* system | user | assistant | tool ("developer" → system) */
    const char *content;
    size_t content_len;
    char *owned;              /* content joined from text parts (dx_malloc), else NULL */
    size_t n_tool_calls;      /* assistant: its tool_calls (checked; the JSON is in the document) */
    const char *tool_call_id; /* tool: the call it answers */
    const char *reasoning;    /* assistant: reasoning_content, or NULL */
    size_t reasoning_len;
} oai_msg;

enum oai_tool_choice {
    OAI_CHOICE_AUTO = 0,
    OAI_CHOICE_NONE,
    OAI_CHOICE_REQUIRED,
    OAI_CHOICE_NAMED
};

/* logit_bias: a token id and what is added to its logit ([-100, 100]). */
typedef struct {
    int32_t id;
    float bias;
} oai_bias;

#define OAI_MAX_LOGIT_BIAS   1024
#define OAI_MAX_TOP_LOGPROBS 20
#define OAI_MAX_CACHE_SALT   1024
#define OAI_MAX_GRAMMAR      (256u << 10) /* bytes of a "grammar" */

/* response_format.type */
enum oai_format { OAI_FORMAT_TEXT = 0, OAI_FORMAT_JSON_OBJECT, OAI_FORMAT_JSON_SCHEMA };

typedef struct {
    enum oai_kind kind;
    const char *model;
    oai_msg *msgs; /* chat */
    size_t n_msgs;
    const char *prompt; /* completion, text form (prompt_ids NULL) */
    size_t prompt_len;
    int32_t *prompt_ids; /* completion, token-id form */
    size_t n_prompt_ids;
    int has_max_tokens;
    uint32_t max_tokens;
    double temperature; /* default 1 */
    double top_p;       /* default 1 */
    int top_k;          /* default 0 = off */
    double min_p;       /* default 0 */
    int has_seed;
    uint64_t seed;
    double presence_penalty, frequency_penalty; /* [-2, 2], default 0 */
    double repetition_penalty;                  /* (0, 2], default 1 (vLLM extension) */
    oai_bias *logit_bias;                       /* dx_malloc'd, sorted by id */
    size_t n_logit_bias;
    int logprobs;          /* chat: "logprobs": true; completions: "logprobs": N given */
    uint32_t top_logprobs; /* chat: top_logprobs (0..20); completions: N (0..5) */
    const char *stop[OAI_MAX_STOP];
    size_t n_stop;
    int stream;
    int include_usage;
    int ignore_eos; /* vLLM extension, used by benchmarks */
    /* tools: the function definitions (a json_t array borrowed from root,
     * each checked: type "function", function.name, parameters an object),
     * NULL when none; tool_choice, and the named function's name. */
    void *tools;
    size_t n_tools;
    enum oai_tool_choice tool_choice;
    const char *tool_choice_name;
    int parallel_tool_calls; /* default 1 */
    /* Structured outputs (docs/api.md): response_format, and for
     * json_schema its schema (a json_t object borrowed from root; NULL: any
     * JSON object) and whether an unsupported keyword is an error (strict,
     * default true) or ignored with a warning (false); or a grammar (the
     * EBNF text of docs/structured.md).  At most one of them constrains a
     * request, and neither with tool_choice "required" or a named one. */
    enum oai_format format;
    void *schema;
    int schema_strict;
    const char *grammar;
    size_t grammar_len;
    /* chat_template_kwargs (vLLM's): extra template variables such as
     * enable_thinking; a json_t object borrowed from root, or NULL */
    void *template_kwargs;
    const char *user;
    /* cache_salt (vLLM's): requests share prefix-cache blocks only with the
     * same salt (and, with API keys, the same key: http_auth.h) */
    const char *cache_salt;
    size_t cache_salt_len;
    void *kv_transfer_params; /* json_t object or NULL (borrowed from root) */
    void *root;               /* json_t document */
    /* bytes the parse left allocated (the tree, messages): what holding this
     * request costs, counted in the HTTP server's buffer budget */
    size_t mem_bytes;
} oai_req;

/* The 4xx a bad request gets: HTTP status, OpenAI error type, the field. */
typedef struct {
    int status;
    char message[256];
    char param[64]; /* "" when no single field is to blame */
} oai_err;

typedef struct {
    uint32_t n_vocab; /* token ids must be below it; 0 = unchecked */
} oai_parse_opts;

/* 0 and a filled *out, or DX_EINVAL with *err filled (out is then empty). */
int oai_req_parse(enum oai_kind kind, const char *body, size_t len, const oai_parse_opts *opts,
                  oai_req *out, oai_err *err);
void oai_req_free(oai_req *r);

/* Sets jansson's allocator to the project's (call once at start-up). */
void oai_json_use_dx_alloc(void);

#endif
