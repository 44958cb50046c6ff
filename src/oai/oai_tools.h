/* oai_tools: tool calls and reasoning parsed out of a model's answer, for
 * the OpenAI chat API (`message.tool_calls`, `message.reasoning_content`,
 * and their streaming deltas).
 *
 * Formats (docs/api.md has them with examples):
 *  - reasoning: `<think>…</think>` at the start of the answer becomes
 *    reasoning_content.  When the prompt already opened the block (the
 *    templates of Qwen3-Thinking-2507, Qwen3.5, DeepSeek-R1) the answer
 *    starts inside it: set think_open (oai_tools_think_open tells from the
 *    prompt); an opening tag the model writes anyway is dropped.  An answer
 *    that ends before `</think>` is all reasoning.
 *  - OAI_TOOLS_QWEN (Hermes style): `<tool_call>{"name": …, "arguments":
 *    {…}}</tool_call>`, any number, anywhere in the answer.
 *  - OAI_TOOLS_LLAMA3 (vLLM's llama3_json): the answer starts with a call
 *    object `{"name": …, "parameters"|"arguments": {…}}`, optionally after
 *    `<|python_tag|>`; more calls may follow, separated by `;`.
 * A call object needs a non-empty string "name"; its arguments (an object,
 * a string holding one, or absent/null for `{}`) are returned as compact
 * JSON text, strings and numbers exactly as the model wrote them.
 *
 * Anything that is not a complete, valid call — no closing tag, bad JSON,
 * no name, two names — stays in the content byte for byte.  Nothing the
 * model wrote is dropped but the tags and calls themselves and the
 * whitespace between them and the start or end of the reasoning or content
 * ("<think>\nA\n</think>\n\nB\n<tool_call>…" gives "A" and "B"; text
 * between two calls keeps its whitespace), which templates drop too when
 * they render the turn again.
 *
 * One machine does both jobs.  Streaming: feed the text as it is generated
 * and send the events each feed returns.  Content and reasoning come out as
 * soon as they cannot be the start of a tag; only a possible tag prefix
 * (and the whitespace before it) is held back.  A call is held until it is
 * complete and valid — a call already sent cannot be taken back if it turns
 * out malformed — and then comes out as two events: the call's head (index,
 * id, name; arguments "") and its arguments.  oai_tools_parse runs the same
 * machine over a whole answer, so the events of any chunking concatenate to
 * exactly the one-shot result.  Feeds allocate nothing once the buffers
 * have grown to the largest piece and call. */
#ifndef OAI_TOOLS_H
#define OAI_TOOLS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_buf.h"

enum oai_tools_fmt {
    OAI_TOOLS_NONE = 0, /* no calls: every byte outside reasoning is content */
    OAI_TOOLS_QWEN,     /* <tool_call>{json}</tool_call> (Hermes, Qwen2.5/Qwen3) */
    OAI_TOOLS_LLAMA3,   /* [<|python_tag|>]{json}[; {json}]… (Llama 3.x JSON) */
};

/* A held call longer than this (from its first byte) is given up as content
 * when the option is 0. */
#define OAI_TOOLS_MAX_HELD_DEFAULT (1u << 20)

typedef struct {
    enum oai_tools_fmt tools;
    int reasoning;    /* split <think>…</think> off as reasoning_content */
    int think_open;   /* with reasoning: the prompt ended inside <think> */
    uint64_t id_seed; /* call ids: 0 = random per parser; else reproducible (tests) */
    size_t max_held;  /* 0 = OAI_TOOLS_MAX_HELD_DEFAULT */
    /* at most this many calls come out (0: any number): parallel_tool_calls
     * false is 1, and a later complete call is dropped — neither a call nor
     * content — as vLLM drops it */
    uint32_t max_calls;
} oai_tools_opts;

/* "none", "qwen" ("hermes"), "llama3" ("llama3_json") → *out; DX_EINVAL
 * with a message listing those otherwise. */
int oai_tools_fmt_parse(const char *name, enum oai_tools_fmt *out);
/* 1 if the rendered prompt leaves a <think> block open (its last <think>
 * has no </think> after it), so the answer starts as reasoning. */
int oai_tools_think_open(const char *prompt, size_t len);

/* ---- one-shot --------------------------------------------------------- */

typedef struct {
    char id[32];     /* "call_" + 24 hex digits */
    char *name;      /* NUL-terminated, UTF-8 */
    char *arguments; /* compact JSON text, NUL-terminated */
    size_t arguments_len;
} oai_tool_call;

typedef struct {
    char *content; /* NULL when the answer has no content bytes */
    size_t content_len;
    char *reasoning; /* NULL without reasoning */
    size_t reasoning_len;
    oai_tool_call *calls;
    size_t n_calls;
} oai_tools_result;

/* Parses a whole answer into *r, to be freed with oai_tools_result_free.
 * Fails only with DX_ENOMEM, leaving *r empty. */
int oai_tools_parse(const oai_tools_opts *o, const char *text, size_t len, oai_tools_result *r);
void oai_tools_result_free(oai_tools_result *r);
/* The assistant message's members, raw JSON without braces:
 * "content":…[,"reasoning_content":…][,"tool_calls":[…]].  content is null
 * when it is empty and there are calls or reasoning. */
int oai_tools_message_json(dx_buf *b, const oai_tools_result *r);

/* ---- streaming -------------------------------------------------------- */

enum oai_tools_ev_kind {
    OAI_TOOLS_EV_REASONING, /* delta.reasoning_content */
    OAI_TOOLS_EV_CONTENT,   /* delta.content */
    OAI_TOOLS_EV_CALL,      /* delta.tool_calls[{index, id, type, function:{name, arguments:""}}] */
    OAI_TOOLS_EV_ARGS,      /* delta.tool_calls[{index, function:{arguments}}] */
};

typedef struct {
    enum oai_tools_ev_kind kind;
    uint32_t index;   /* CALL, ARGS: the call's position in tool_calls */
    const char *text; /* REASONING, CONTENT, ARGS: the fragment; CALL: the name */
    size_t len;
    const char *id; /* CALL: "call_…" */
} oai_tools_ev;

typedef struct oai_tools oai_tools;

/* NULL when out of memory. */
oai_tools *oai_tools_create(const oai_tools_opts *o);
void oai_tools_destroy(oai_tools *t);
/* Takes the next piece of the answer and points *ev at the events it
 * releases, in answer order (adjacent text of one kind merged), valid until
 * the next feed or finish.  A piece may end anywhere, even inside a UTF-8
 * character (the bytes of one are then held until it is whole).  DX_ENOMEM
 * sticks: every later call fails too. */
int oai_tools_feed(oai_tools *t, const char *text, size_t len, const oai_tools_ev **ev,
                   size_t *n_ev);
/* The answer is complete: releases everything held (a call not yet closed
 * becomes content). */
int oai_tools_finish(oai_tools *t, const oai_tools_ev **ev, size_t *n_ev);
/* Calls released so far. */
size_t oai_tools_n_calls(const oai_tools *t);
/* The finish_reason to send: "tool_calls" once a call went out, else
 * `finish` ("stop", "length"). */
const char *oai_tools_finish_reason(const oai_tools *t, const char *finish);
/* One event as the members of a chat chunk's delta, raw JSON without
 * braces, e.g. "content":"Hi" or "tool_calls":[{"index":0,…}]. */
int oai_tools_ev_json(dx_buf *b, const oai_tools_ev *ev);

#endif
