/* Unit tests for src/oai/oai_anth: the Anthropic Messages API as a front door
 * to the chat path.
 *
 * A translation is checked by what the chat parser makes of it: each
 * Anthropic request is parsed next to the chat request a Chat Completions
 * client would send for the same conversation, and the two oai_req are
 * compared field by field (messages, tool calls as JSON, sampling, tools,
 * structured outputs, kwargs).  Then every rejection with its status and the
 * field it names, the limits, out-of-memory at every allocation, the whole
 * answers, and the streams for the same answers read back as the SDK reads
 * them (tests/anth_sse_test.h).
 *
 * Bodies are written with ' for " (sq()), so they stay readable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "../anth_sse_test.h"
#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "oai/oai_anth.h"
#include "oai/oai_req.h"
#include "oai/oai_tools.h"

/* A body with ' for " (a JSON text with no ' of its own). */
static char *sq(const char *s)
{
    char *d = dx_strdup(s);
    for (char *p = d; *p; p++)
        if (*p == '\'') *p = '"';
    return d;
}

static int anth(const char *body_sq, int count, oai_req *r, oai_anth_info *info, oai_err *e)
{
    char *body = sq(body_sq);
    oai_anth_opts o = {.count_tokens = count};
    int rc = oai_anth_req_parse(body, strlen(body), &o, NULL, r, info, e);
    dx_free(body);
    return rc;
}

static void chat(const char *body_sq, oai_req *r)
{
    char *body = sq(body_sq);
    oai_err e;
    int rc = oai_req_parse(OAI_CHAT, body, strlen(body), NULL, r, &e);
    dx_free(body);
    if (rc) fail_msg("the chat request: %s", e.message);
}

static int same_bytes(const char *a, size_t na, const char *b, size_t nb)
{
    return na == nb && (!na || !memcmp(a, b, na));
}

static int same_cstr(const char *a, const char *b)
{
    return a == b || (a && b && !strcmp(a, b));
}

static void same_json(const void *a, const void *b, const char *what)
{
    if ((a || b) && !json_equal((json_t *)a, (json_t *)b)) {
        char *x = a ? json_dumps(a, JSON_COMPACT) : NULL,
             *y = b ? json_dumps(b, JSON_COMPACT) : NULL;
        fail_msg("%s: %s != %s", what, x ? x : "(none)", y ? y : "(none)");
    }
}

/* Every field of the parsed request that the chat path reads. */
static void same_req(const oai_req *a, const oai_req *b)
{
    assert_string_equal(a->model, b->model);
    assert_int_equal(a->n_msgs, b->n_msgs);
    json_t *ma = json_object_get(a->root, "messages"), *mb = json_object_get(b->root, "messages");
    for (size_t i = 0; i < a->n_msgs; i++) {
        const oai_msg *x = &a->msgs[i], *y = &b->msgs[i];
        if (strcmp(x->role, y->role) ||
            !same_bytes(x->content, x->content_len, y->content, y->content_len) ||
            !same_bytes(x->reasoning, x->reasoning_len, y->reasoning, y->reasoning_len) ||
            !same_cstr(x->tool_call_id, y->tool_call_id) || x->n_tool_calls != y->n_tool_calls ||
            (x->reasoning == NULL) != (y->reasoning == NULL))
            fail_msg("messages[%zu]: %s '%.*s' (reasoning '%.*s') != %s '%.*s' (reasoning '%.*s')",
                     i, x->role, (int)x->content_len, x->content, (int)x->reasoning_len,
                     x->reasoning ? x->reasoning : "", y->role, (int)y->content_len, y->content,
                     (int)y->reasoning_len, y->reasoning ? y->reasoning : "");
        same_json(json_object_get(json_array_get(ma, i), "tool_calls"),
                  json_object_get(json_array_get(mb, i), "tool_calls"), "tool_calls");
    }
    assert_int_equal(a->has_max_tokens, b->has_max_tokens);
    assert_int_equal(a->max_tokens, b->max_tokens);
    assert_true(a->temperature == b->temperature && a->top_p == b->top_p);
    assert_int_equal(a->top_k, b->top_k);
    assert_int_equal(a->n_stop, b->n_stop);
    for (size_t i = 0; i < a->n_stop; i++) assert_string_equal(a->stop[i], b->stop[i]);
    assert_int_equal(a->stream, b->stream);
    assert_int_equal(a->include_usage, b->include_usage);
    assert_int_equal(a->n_tools, b->n_tools);
    same_json(a->tools, b->tools, "tools");
    assert_int_equal(a->tool_choice, b->tool_choice);
    assert_true(same_cstr(a->tool_choice_name, b->tool_choice_name));
    assert_int_equal(a->parallel_tool_calls, b->parallel_tool_calls);
    assert_int_equal(a->format, b->format);
    same_json(a->schema, b->schema, "schema");
    assert_int_equal(a->schema_strict, b->schema_strict);
    same_json(a->template_kwargs, b->template_kwargs, "chat_template_kwargs");
    assert_true(same_cstr(a->user, b->user));
    assert_true(same_bytes(a->cache_salt, a->cache_salt_len, b->cache_salt, b->cache_salt_len));
    same_json(a->kv_transfer_params, b->kv_transfer_params, "kv_transfer_params");
    same_json(json_object_get(a->root, "conversation_id"),
              json_object_get(b->root, "conversation_id"), "conversation_id");
}

/* The Anthropic request and its chat twin give the same oai_req. */
static void twins(const char *anth_sq, const char *chat_sq, oai_anth_info *info)
{
    oai_req a, b;
    oai_err e;
    oai_anth_info local;
    if (!info) info = &local;
    if (anth(anth_sq, 0, &a, info, &e)) fail_msg("%d %s (%s)", e.status, e.message, e.param);
    chat(chat_sq, &b);
    same_req(&a, &b);
    assert_string_equal(info->model, a.model);
    oai_req_free(&a);
    oai_req_free(&b);
}

/* ---- translation ------------------------------------------------------------- */

static void test_text_conversation(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_anth_info info;
    twins(
        "{'model':'claude-x','max_tokens':100,'system':'Be brief.','messages':["
        "{'role':'user','content':'Hi'},{'role':'assistant','content':'Hello!'},"
        "{'role':'user','content':[{'type':'text','text':'a'},{'type':'text','text':'b',"
        "'cache_control':{'type':'ephemeral'}}]}],"
        "'temperature':0.5,'top_p':0.9,'top_k':40,'stop_sequences':['END','','\\n\\nHuman:'],"
        "'metadata':{'user_id':'u1'},'stream':true,'service_tier':'auto','unknown':[1]}",
        "{'model':'claude-x','max_tokens':100,'messages':[{'role':'system','content':'Be brief.'},"
        "{'role':'user','content':'Hi'},{'role':'assistant','content':'Hello!'},"
        "{'role':'user','content':'a\\nb'}],'temperature':0.5,'top_p':0.9,'top_k':40,"
        "'stop':['END','\\n\\nHuman:'],'user':'u1','stream':true,"
        "'stream_options':{'include_usage':true}}",
        &info);
    assert_true(info.stream);
    assert_false(info.count_tokens);
    assert_int_equal(info.thinking, OAI_ANTH_THINK_DEFAULT);
    assert_int_equal(info.n_stop, 2);
    assert_int_equal(info.stop_index[0], 0);
    assert_int_equal(info.stop_index[1], 2);
    /* the text blocks of a user turn: joined as chat text parts are */
    twins("{'model':'m','max_tokens':1,'messages':[{'role':'user','content':[{'type':'text','text':"
          "'a'},{'type':'text','text':''},{'type':'text','text':'b'}]}]}",
          "{'model':'m','max_tokens':1,'messages':[{'role':'user','content':[{'type':'text','text':"
          "'a'},{'type':'text','text':'b'}]}]}",
          NULL);
    /* a NUL the model emitted and the client sent back stays, by length */
    oai_req a;
    oai_err e;
    assert_int_equal(anth("{'model':'m','max_tokens':1,'messages':[{'role':'assistant','content':"
                          "'a\\u0000b'}]}",
                          0, &a, &info, &e),
                     0);
    assert_int_equal(a.msgs[0].content_len, 3);
    assert_memory_equal(a.msgs[0].content, "a\0b", 3);
    oai_req_free(&a);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_system(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    twins("{'model':'m','max_tokens':8,'system':[{'type':'text','text':'You are a coding agent.',"
          "'cache_control':{'type':'ephemeral','ttl':'1h'}},{'type':'text','text':'Be terse.'}],"
          "'messages':[{'role':'user','content':'go'}]}",
          "{'model':'m','max_tokens':8,'messages':[{'role':'system','content':"
          "'You are a coding agent.\\nBe terse.'},{'role':'user','content':'go'}]}",
          NULL);
    /* an empty system prompt is none */
    twins("{'model':'m','max_tokens':8,'system':'','messages':[{'role':'user','content':'go'}]}",
          "{'model':'m','max_tokens':8,'messages':[{'role':'user','content':'go'}]}", NULL);
    twins("{'model':'m','max_tokens':8,'system':[],'messages':[{'role':'user','content':'go'}]}",
          "{'model':'m','max_tokens':8,'messages':[{'role':'user','content':'go'}]}", NULL);
    /* the SDK's system messages: where they are */
    twins("{'model':'m','max_tokens':8,'messages':[{'role':'user','content':'a'},{'role':'system',"
          "'content':[{'type':'text','text':'now in French'}]},{'role':'user','content':'b'}]}",
          "{'model':'m','max_tokens':8,'messages':[{'role':'user','content':'a'},{'role':'system',"
          "'content':'now in French'},{'role':'user','content':'b'}]}",
          NULL);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* An agent's loop: thinking, text and two calls, their results (one an
 * error, one in blocks) with a question after them, a call without
 * arguments, a failed one. */
static void test_tool_loop(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    twins("{'model':'m','max_tokens':512,"
          "'tools':[{'name':'get_weather','description':'Weather for a city.','input_schema':"
          "{'type':'object','properties':{'city':{'type':'string'}},'required':['city']},"
          "'cache_control':{'type':'ephemeral'}},{'name':'now','input_schema':{'type':'object'},"
          "'type':'custom','strict':false}],"
          "'tool_choice':{'type':'auto','disable_parallel_tool_use':true},'messages':["
          "{'role':'user','content':'Weather in Paris and Tokyo?'},"
          "{'role':'assistant','content':[{'type':'thinking','thinking':'Two calls.','signature':"
          "'EqQBCgIYAhIM'},{'type':'text','text':'I will check both.'},"
          "{'type':'tool_use','id':'toolu_01','name':'get_weather','input':{'city':'Paris',"
          "'days':3,'unit':null,'tags':['a',true]}},"
          "{'type':'tool_use','id':'toolu_02','name':'get_weather','input':{'city':"
          "'\\u6771\\u4eac','temp':21.5}}]},"
          "{'role':'user','content':[{'type':'tool_result','tool_use_id':'toolu_01','content':"
          "'sunny'},{'type':'tool_result','tool_use_id':'toolu_02','is_error':false,'content':["
          "{'type':'text','text':'rain'},{'type':'text','text':'cold'}]},"
          "{'type':'text','text':'And tomorrow?'}]},"
          "{'role':'assistant','content':[{'type':'tool_use','id':'toolu_03','name':'now',"
          "'input':{}}]},"
          "{'role':'user','content':[{'type':'tool_result','tool_use_id':'toolu_03','is_error':"
          "true,'content':'clock broken'}]}]}",
          "{'model':'m','max_tokens':512,"
          "'tools':[{'type':'function','function':{'name':'get_weather','description':"
          "'Weather for a city.','parameters':{'type':'object','properties':{'city':{'type':"
          "'string'}},'required':['city']}}},{'type':'function','function':{'name':'now',"
          "'parameters':{'type':'object'},'strict':false}}],"
          "'tool_choice':'auto','parallel_tool_calls':false,'messages':["
          "{'role':'user','content':'Weather in Paris and Tokyo?'},"
          "{'role':'assistant','content':'I will check both.','reasoning_content':'Two calls.',"
          "'tool_calls':[{'id':'toolu_01','type':'function','function':{'name':'get_weather',"
          "'arguments':'{\\'city\\':\\'Paris\\',\\'days\\':3,\\'unit\\':null,\\'tags\\':[\\'a\\',"
          "true]}'}},{'id':'toolu_02','type':'function','function':{'name':'get_weather',"
          "'arguments':'{\\'city\\':\\'\\u6771\\u4eac\\',\\'temp\\':21.5}'}}]},"
          "{'role':'tool','tool_call_id':'toolu_01','content':'sunny'},"
          "{'role':'tool','tool_call_id':'toolu_02','content':'rain\\ncold'},"
          "{'role':'user','content':'And tomorrow?'},"
          "{'role':'assistant','content':null,'tool_calls':[{'id':'toolu_03','type':'function',"
          "'function':{'name':'now','arguments':'{}'}}]},"
          "{'role':'tool','tool_call_id':'toolu_03','content':'Error: clock broken'}]}",
          NULL);
    /* an error without text; a result with no content */
    twins("{'model':'m','max_tokens':1,'messages':[{'role':'assistant','content':[{'type':"
          "'tool_use','id':'a','name':'f','input':{}},{'type':'tool_use','id':'b','name':'f',"
          "'input':{}}]},{'role':'user','content':[{'type':'tool_result','tool_use_id':'a',"
          "'is_error':true},{'type':'tool_result','tool_use_id':'b'}]}]}",
          "{'model':'m','max_tokens':1,'messages':[{'role':'assistant','content':null,"
          "'tool_calls':[{'id':'a','type':'function','function':{'name':'f','arguments':'{}'}},"
          "{'id':'b','type':'function','function':{'name':'f','arguments':'{}'}}]},"
          "{'role':'tool','tool_call_id':'a','content':'Error'},"
          "{'role':'tool','tool_call_id':'b','content':''}]}",
          NULL);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* Consecutive messages of one role are one turn; an assistant's text blocks
 * add up byte for byte (a streamed answer's blocks, split at its calls). */
static void test_turns(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    twins("{'model':'m','max_tokens':1,'messages':[{'role':'user','content':'a'},{'role':'user',"
          "'content':[{'type':'text','text':'b'}]},{'role':'assistant','content':'Let me'},"
          "{'role':'assistant','content':[{'type':'text','text':' look.'},{'type':'tool_use',"
          "'id':'t1','name':'ls','input':{'dir':'.'}},{'type':'text','text':'\\n\\nDone?'}]},"
          "{'role':'user','content':[{'type':'tool_result','tool_use_id':'t1','content':'x.c'}]},"
          "{'role':'user','content':'thanks'},{'role':'assistant','content':[{'type':"
          "'redacted_thinking','data':'c2VjcmV0'},{'type':'thinking','thinking':'ok'}]}]}",
          "{'model':'m','max_tokens':1,'messages':[{'role':'user','content':'a\\nb'},"
          "{'role':'assistant','content':'Let me look.\\n\\nDone?','tool_calls':[{'id':'t1',"
          "'type':'function','function':{'name':'ls','arguments':'{\\'dir\\':\\'.\\'}'}}]},"
          "{'role':'tool','tool_call_id':'t1','content':'x.c'},{'role':'user','content':'thanks'},"
          "{'role':'assistant','content':null,'reasoning_content':'ok'}]}",
          NULL);
    /* the final assistant message is a turn like the others */
    twins("{'model':'m','max_tokens':1,'messages':[{'role':'user','content':'Q'},{'role':"
          "'assistant','content':'The answer is ('}]}",
          "{'model':'m','max_tokens':1,'messages':[{'role':'user','content':'Q'},{'role':"
          "'assistant','content':'The answer is ('}]}",
          NULL);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_tool_choice(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    static const char *tools = "'tools':[{'name':'a','input_schema':{'type':'object'}},{'name':"
                               "'b','input_schema':{'type':'object'}}],";
    static const char *ctools = "'tools':[{'type':'function','function':{'name':'a','parameters':"
                                "{'type':'object'}}},{'type':'function','function':{'name':'b',"
                                "'parameters':{'type':'object'}}}],";
    static const struct {
        const char *anth, *chat;
    } k[] = {
        {"'tool_choice':{'type':'any'}", "'tool_choice':'required'"},
        {"'tool_choice':{'type':'tool','name':'b'}",
         "'tool_choice':{'type':'function','function':{'name':'b'}}"},
        {"'tool_choice':{'type':'none'}", "'tool_choice':'none'"},
        {"'tool_choice':{'type':'any','disable_parallel_tool_use':false}",
         "'tool_choice':'required','parallel_tool_calls':true"},
        {"'tool_choice':null", "'tool_choice':'auto'"},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char a[1024], c[1024];
        snprintf(a, sizeof a,
                 "{'model':'m','max_tokens':1,%s%s,'messages':[{'role':'user','content':'x'}]}",
                 tools, k[i].anth);
        snprintf(c, sizeof c,
                 "{'model':'m','max_tokens':1,%s%s,'messages':[{'role':'user','content':'x'}]}",
                 ctools, k[i].chat);
        twins(a, c, NULL);
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_thinking_and_format(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_anth_info info;
    twins("{'model':'m','max_tokens':4096,'thinking':{'type':'enabled','budget_tokens':2048},"
          "'messages':[{'role':'user','content':'x'}]}",
          "{'model':'m','max_tokens':4096,'chat_template_kwargs':{'enable_thinking':true},"
          "'messages':[{'role':'user','content':'x'}]}",
          &info);
    assert_int_equal(info.thinking, OAI_ANTH_THINK_ON);
    assert_int_equal(info.thinking_budget, 2048);
    twins("{'model':'m','max_tokens':1,'thinking':{'type':'disabled'},'messages':[{'role':'user',"
          "'content':'x'}]}",
          "{'model':'m','max_tokens':1,'chat_template_kwargs':{'enable_thinking':false},"
          "'messages':[{'role':'user','content':'x'}]}",
          &info);
    assert_int_equal(info.thinking, OAI_ANTH_THINK_OFF);
    twins("{'model':'m','max_tokens':1,'thinking':{'type':'adaptive','display':'omitted'},"
          "'messages':[{'role':'user','content':'x'}]}",
          "{'model':'m','max_tokens':1,'chat_template_kwargs':{'enable_thinking':true},"
          "'messages':[{'role':'user','content':'x'}]}",
          &info);
    assert_int_equal(info.thinking, OAI_ANTH_THINK_ON);
    assert_int_equal(info.thinking_budget, 0);
    /* structured outputs, and duplex's own fields passed on */
    twins("{'model':'m','max_tokens':1,'output_config':{'effort':'high','format':{'type':"
          "'json_schema','schema':{'type':'object','properties':{'n':{'type':'integer'}}}}},"
          "'kv_transfer_params':{'do_remote_decode':true},'conversation_id':'c-1',"
          "'cache_salt':'tenant-7','messages':[{'role':'user','content':'x'}]}",
          "{'model':'m','max_tokens':1,'response_format':{'type':'json_schema','json_schema':{"
          "'name':'output','schema':{'type':'object','properties':{'n':{'type':'integer'}}}}},"
          "'kv_transfer_params':{'do_remote_decode':true},'conversation_id':'c-1',"
          "'cache_salt':'tenant-7','messages':[{'role':'user','content':'x'}]}",
          NULL);
    /* count_tokens: no max_tokens, and never a stream */
    oai_req a, b;
    oai_err e;
    assert_int_equal(anth("{'model':'m','stream':true,'tools':[{'name':'f','input_schema':{}}],"
                          "'messages':[{'role':'user','content':'x'}]}",
                          1, &a, &info, &e),
                     0);
    chat("{'model':'m','tools':[{'type':'function','function':{'name':'f','parameters':{}}}],"
         "'messages':[{'role':'user','content':'x'}]}",
         &b);
    same_req(&a, &b);
    assert_true(info.count_tokens);
    assert_false(info.stream);
    oai_req_free(&a);
    oai_req_free(&b);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* A tool_use's input → arguments as JSON.stringify writes the object. */
static void test_arguments_text(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    static const struct {
        const char *input, *args;
    } k[] = {
        {"{}", "{}"},
        {"{ \"b\" : 1 , \"a\" : [ 1 , 2 ] }", "{\"b\":1,\"a\":[1,2]}"},
        {"{\"x\":0.1,\"y\":22.3,\"z\":-2.5e-8,\"w\":0.3333333333333333}",
         "{\"x\":0.1,\"y\":22.3,\"z\":-2.5e-8,\"w\":0.3333333333333333}"},
        {"{\"a\":1e21,\"b\":1e20,\"c\":1e-7,\"d\":1e-6,\"e\":100.0,\"f\":-0.0,\"g\":1.5e300}",
         "{\"a\":1e+21,\"b\":100000000000000000000,\"c\":1e-7,\"d\":0.000001,\"e\":100,\"f\":0,"
         "\"g\":1.5e+300}"},
        {"{\"max\":1.7976931348623157e308,\"min\":5e-324,\"big\":123456789012345678,\"neg\":-7}",
         "{\"max\":1.7976931348623157e+308,\"min\":5e-324,\"big\":123456789012345678,\"neg\":-7}"},
        {"{\"s\":\"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0001\\u001F\\u007f\\u00e9\\u2028\"}",
         "{\"s\":\"q\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\xc3\xa9\xe2\x80\xa8\"}"},
        {"{\"\\u00e9\":{\"k\":[[],{},null,true,false]}}",
         "{\"\xc3\xa9\":{\"k\":[[],{},null,true,false]}}"},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char body[1024];
        snprintf(
            body, sizeof body,
            "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"assistant\","
            "\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":%s}]}]}",
            k[i].input);
        json_t *doc;
        oai_anth_info info;
        oai_err e;
        if (oai_anth_to_chat(body, strlen(body), NULL, &doc, &info, &e))
            fail_msg("%zu: %s", i, e.message);
        json_t *args = json_object_get(
            json_object_get(
                json_array_get(json_object_get(json_array_get(json_object_get(doc, "messages"), 0),
                                               "tool_calls"),
                               0),
                "function"),
            "arguments");
        if (strcmp(json_string_value(args), k[i].args))
            fail_msg("%zu: %s, expected %s", i, json_string_value(args), k[i].args);
        json_decref(doc);
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- rejections -------------------------------------------------------------- */

#define M1   "'messages':[{'role':'user','content':'x'}]"
#define BASE "'model':'m','max_tokens':10,"

static void test_rejections(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    static const struct {
        const char *body, *param, *msg;
    } bad[] = {
        {"{'model':", "", "invalid JSON"},
        {"[1]", "", "request body must be a JSON object"},
        {"{'max_tokens':1," M1 "}", "model", "model: required"},
        {"{'model':5,'max_tokens':1," M1 "}", "model", "model: expected a string"},
        {"{'model':'m'," M1 "}", "max_tokens", "max_tokens: required"},
        {"{'model':'m','max_tokens':0," M1 "}", "max_tokens", "pre-warming"},
        {"{'model':'m','max_tokens':-1," M1 "}", "max_tokens", "out of range"},
        {"{'model':'m','max_tokens':1.5," M1 "}", "max_tokens", "expected an integer"},
        {"{'model':'m','max_tokens':'9'," M1 "}", "max_tokens", "expected an integer"},
        {"{" BASE "'x':1}", "messages", "messages: required"},
        {"{" BASE "'messages':[]}", "messages", "non-empty array"},
        {"{" BASE "'messages':{}}", "messages", "non-empty array"},
        {"{" BASE "'messages':[7]}", "messages[0]", "expected an object"},
        {"{" BASE "'messages':[{'role':'tool','content':'x'}]}", "messages[0].role",
         "\"user\" or \"assistant\""},
        {"{" BASE "'messages':[{'role':'user'}]}", "messages[0].content", "required"},
        {"{" BASE "'messages':[{'role':'user','content':5}]}", "messages[0].content",
         "a string or an array"},
        {"{" BASE "'messages':[{'role':'user','content':['x']}]}", "messages[0].content[0]",
         "expected a content block"},
        {"{" BASE "'messages':[{'role':'user','content':[{'text':'x'}]}]}",
         "messages[0].content[0].type", "required"},
        {"{" BASE "'messages':[{'role':'user','content':'a'},{'role':'assistant','content':'b'},"
         "{'role':'user','content':[{'type':'text','text':'see'},{'type':'image','source':{'type':"
         "'base64','media_type':'image/png','data':'AA=='}}]}]}",
         "messages[2].content[1].type",
         "messages[2].content[1].type: image blocks are not supported (text-only model)"},
        {"{" BASE "'messages':[{'role':'user','content':[{'type':'document','source':{}}]}]}",
         "messages[0].content[0].type", "document blocks are not supported (text-only model)"},
        {"{" BASE "'messages':[{'role':'user','content':[{'type':'search_result'}]}]}",
         "messages[0].content[0].type", "'search_result' blocks are not supported"},
        {"{" BASE "'messages':[{'role':'user','content':[{'type':'text'}]}]}",
         "messages[0].content[0].text", "required, a string"},
        {"{" BASE "'messages':[{'role':'user','content':[{'type':'tool_use','id':'a','name':'f',"
         "'input':{}}]}]}",
         "messages[0].content[0].type", "only accepted in assistant messages"},
        {"{" BASE "'messages':[{'role':'assistant','content':[{'type':'tool_result',"
         "'tool_use_id':'a'}]}]}",
         "messages[0].content[0].type", "only accepted in user messages"},
        {"{" BASE "'messages':[{'role':'assistant','content':[{'type':'tool_use','name':'f',"
         "'input':{}}]}]}",
         "messages[0].content[0].id", "non-empty string"},
        {"{" BASE "'messages':[{'role':'assistant','content':[{'type':'tool_use','id':'a',"
         "'name':'','input':{}}]}]}",
         "messages[0].content[0].name", "non-empty string"},
        {"{" BASE "'messages':[{'role':'assistant','content':[{'type':'tool_use','id':'a',"
         "'name':'f','input':'{}'}]}]}",
         "messages[0].content[0].input", "an object"},
        {"{" BASE "'messages':[{'role':'user','content':[{'type':'tool_result'}]}]}",
         "messages[0].content[0].tool_use_id", "non-empty string"},
        {"{" BASE "'messages':[{'role':'user','content':[{'type':'tool_result','tool_use_id':'a',"
         "'is_error':'yes'}]}]}",
         "messages[0].content[0].is_error", "true or false"},
        {"{" BASE "'messages':[{'role':'user','content':[{'type':'tool_result','tool_use_id':'a',"
         "'content':[{'type':'image','source':{}}]}]}]}",
         "messages[0].content[0].content[0].type", "image blocks are not supported"},
        {"{" BASE "'messages':[{'role':'user','content':[{'type':'tool_result','tool_use_id':'a',"
         "'content':5}]}]}",
         "messages[0].content[0].content", "a string or an array of text blocks"},
        {"{" BASE "'messages':[{'role':'user','content':'hi'},{'role':'user','content':[{'type':"
         "'tool_result','tool_use_id':'a'}]}]}",
         "messages[1].content[0]", "must come before any text"},
        {"{" BASE "'messages':[{'role':'assistant','content':[{'type':'thinking'}]}]}",
         "messages[0].content[0].thinking", "required"},
        {"{" BASE "'messages':[{'role':'assistant','content':[{'type':'redacted_thinking'}]}]}",
         "messages[0].content[0].data", "required"},
        {"{" BASE "'system':5," M1 "}", "system", "a string or an array of text blocks"},
        {"{" BASE "'system':[{'type':'image'}]," M1 "}", "system[0].type", "image blocks"},
        {"{" BASE "'tools':{}," M1 "}", "tools", "expected an array"},
        {"{" BASE "'tools':[1]," M1 "}", "tools[0]", "expected an object"},
        {"{" BASE "'tools':[{'type':'web_search_20250305','name':'web_search','max_uses':5}]," M1
         "}",
         "tools[0].type", "'web_search_20250305' tools are not supported"},
        {"{" BASE "'tools':[{'type':'bash_20250124','name':'bash'}]," M1 "}", "tools[0].type",
         "'bash_20250124' tools"},
        {"{" BASE "'tools':[{'input_schema':{}}]," M1 "}", "tools[0].name", "non-empty string"},
        {"{" BASE "'tools':[{'name':'f'}]," M1 "}", "tools[0].input_schema",
         "required, a JSON Schema object"},
        {"{" BASE "'tools':[{'name':'f','input_schema':{},'description':5}]," M1 "}",
         "tools[0].description", "expected a string"},
        {"{" BASE "'tools':[{'name':'f','input_schema':{},'strict':'yes'}]," M1 "}",
         "tools[0].strict", "true or false"},
        {"{" BASE "'tool_choice':'auto'," M1 "}", "tool_choice", "expected {"},
        {"{" BASE "'tool_choice':{'type':'required'}," M1 "}", "tool_choice.type",
         "not auto, any, tool or none"},
        {"{" BASE "'tools':[{'name':'f','input_schema':{}}],'tool_choice':{'type':'tool'}," M1 "}",
         "tool_choice.name", "required"},
        {"{" BASE "'tools':[{'name':'f','input_schema':{}}],'tool_choice':{'type':'tool',"
         "'name':'g'}," M1 "}",
         "tool_choice.name", "no tool named 'g'"},
        {"{" BASE "'tool_choice':{'type':'any'}," M1 "}", "tool_choice", "no tools are given"},
        {"{" BASE "'tool_choice':{'type':'auto','disable_parallel_tool_use':1}," M1 "}",
         "tool_choice.disable_parallel_tool_use", "true or false"},
        {"{" BASE "'tools':[{'name':'f','input_schema':{}}],'tool_choice':{'type':'any'},"
         "'output_config':{'format':{'type':'json_schema','schema':{}}}," M1 "}",
         "tool_choice", "cannot be combined with output_config.format"},
        {"{" BASE "'stop_sequences':'END'," M1 "}", "stop_sequences", "an array of strings"},
        {"{" BASE "'stop_sequences':['a',1]," M1 "}", "stop_sequences[1]", "without NUL"},
        {"{" BASE "'stop_sequences':['a\\u0000b']," M1 "}", "stop_sequences[0]", "without NUL"},
        {"{" BASE "'temperature':3," M1 "}", "temperature", "out of range"},
        {"{" BASE "'temperature':'hot'," M1 "}", "temperature", "expected a number"},
        {"{" BASE "'top_p':0," M1 "}", "top_p", "greater than 0"},
        {"{" BASE "'top_k':1.5," M1 "}", "top_k", "expected an integer"},
        {"{" BASE "'stream':'yes'," M1 "}", "stream", "true or false"},
        {"{" BASE "'metadata':5," M1 "}", "metadata", "expected an object"},
        {"{" BASE "'metadata':{'user_id':5}," M1 "}", "metadata.user_id", "expected a string"},
        {"{" BASE "'thinking':'on'," M1 "}", "thinking", "expected {"},
        {"{" BASE "'thinking':{'type':'enabled'}," M1 "}", "thinking.budget_tokens", "required"},
        {"{" BASE "'thinking':{'type':'enabled','budget_tokens':0}," M1 "}",
         "thinking.budget_tokens", "out of range"},
        {"{" BASE "'thinking':{'type':'on'}," M1 "}", "thinking.type", "not enabled, disabled"},
        {"{" BASE "'output_config':5," M1 "}", "output_config", "expected an object"},
        {"{" BASE "'output_config':{'format':{'type':'json_object'}}," M1 "}",
         "output_config.format", "json_schema"},
        {"{" BASE "'output_config':{'format':{'type':'json_schema'}}," M1 "}",
         "output_config.format.schema", "required"},
        {"{" BASE "'kv_transfer_params':5," M1 "}", "kv_transfer_params", "expected an object"},
        {"{" BASE "'conversation_id':5," M1 "}", "conversation_id", "expected a string"},
        {"{" BASE "'cache_salt':''," M1 "}", "cache_salt", "1..1024 bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        oai_req r;
        oai_anth_info info;
        oai_err e;
        int rc = anth(bad[i].body, 0, &r, &info, &e);
        if (rc != DX_EINVAL || e.status != 400 || strcmp(e.param, bad[i].param) ||
            !strstr(e.message, bad[i].msg))
            fail_msg("%zu: rc %d, %d '%s' '%s'; expected '%s' '%s'", i, rc, e.status, e.param,
                     e.message, bad[i].param, bad[i].msg);
        /* the message starts with the field it names */
        if (e.param[0]) assert_int_equal(strncmp(e.message, e.param, strlen(e.param)), 0);
        /* and goes out in Anthropic's shape */
        dx_buf b;
        dx_buf_init(&b, 0);
        assert_int_equal(oai_anth_error_json(&b, e.status, e.message), 0);
        json_t *j = json_loads(b.data, 0, NULL);
        assert_non_null(j);
        assert_string_equal(json_string_value(json_object_get(j, "type")), "error");
        json_t *err = json_object_get(j, "error");
        assert_string_equal(json_string_value(json_object_get(err, "type")),
                            "invalid_request_error");
        assert_string_equal(json_string_value(json_object_get(err, "message")), e.message);
        json_decref(j);
        dx_buf_free(&b);
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- limits -------------------------------------------------------------------- */

static void rep(dx_buf *b, const char *item, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (i) dx_buf_putc(b, ',');
        dx_buf_puts(b, item);
    }
}

static void expect_limit(const dx_buf *b, const char *param, const char *msg)
{
    oai_req r;
    oai_anth_info info;
    oai_err e;
    int rc = oai_anth_req_parse(b->data, b->len, NULL, NULL, &r, &info, &e);
    if (rc != DX_EINVAL || strcmp(e.param, param) || !strstr(e.message, msg))
        fail_msg("rc %d '%s' '%s'; expected '%s' '%s'", rc, e.param, e.message, param, msg);
}

static void test_limits(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    dx_buf b;
    dx_buf_init(&b, 0);
    /* messages as sent, and as the chat parser would count them */
    dx_buf_puts(&b, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[");
    rep(&b, "{\"role\":\"user\",\"content\":\"x\"}", OAI_MAX_MESSAGES + 1);
    dx_buf_puts(&b, "]}");
    expect_limit(&b, "messages", "16385 messages, at most 16384");
    dx_buf_reset(&b);
    dx_buf_puts(&b, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\","
                    "\"content\":[");
    rep(&b, "{\"type\":\"tool_result\",\"tool_use_id\":\"t\"}", OAI_MAX_MESSAGES);
    dx_buf_puts(&b, "]}]}");
    oai_req r;
    oai_anth_info info;
    oai_err e;
    assert_int_equal(oai_anth_req_parse(b.data, b.len, NULL, NULL, &r, &info, &e), 0);
    assert_int_equal(r.n_msgs, OAI_MAX_MESSAGES);
    oai_req_free(&r);
    b.len -= 4;
    dx_buf_puts(&b, ",{\"type\":\"tool_result\",\"tool_use_id\":\"t\"}]}]}");
    expect_limit(&b, "messages", "more than 16384 chat messages");
    /* content blocks in all */
    dx_buf_reset(&b);
    dx_buf_puts(&b, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\","
                    "\"content\":[");
    rep(&b, "{\"type\":\"text\",\"text\":\"\"}", OAI_ANTH_MAX_BLOCKS + 1);
    dx_buf_puts(&b, "]}]}");
    expect_limit(&b, "messages", "more than 65536 content blocks");
    /* tools, stop sequences (count and bytes) */
    dx_buf_reset(&b);
    dx_buf_puts(&b, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\","
                    "\"content\":\"x\"}],\"tools\":[");
    rep(&b, "{\"name\":\"f\",\"input_schema\":{}}", OAI_MAX_TOOLS + 1);
    dx_buf_puts(&b, "]}");
    expect_limit(&b, "tools", "1025 tools, at most 1024");
    dx_buf_reset(&b);
    dx_buf_puts(&b, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\","
                    "\"content\":\"x\"}],\"stop_sequences\":[");
    rep(&b, "\"s\"", OAI_MAX_STOP + 1);
    dx_buf_puts(&b, "]}");
    expect_limit(&b, "stop_sequences", "17 strings, at most 16");
    dx_buf_reset(&b);
    dx_buf_puts(&b, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\","
                    "\"content\":\"x\"}],\"stop_sequences\":[\"");
    for (size_t i = 0; i < OAI_MAX_STOP_BYTES / 2; i++) dx_buf_putc(&b, 'a');
    dx_buf_puts(&b, "\",\"");
    for (size_t i = 0; i <= OAI_MAX_STOP_BYTES / 2; i++) dx_buf_putc(&b, 'b');
    dx_buf_puts(&b, "\"]}");
    expect_limit(&b, "stop_sequences", "65537 bytes in all, at most 65536");
    /* nesting: 128 levels are fine, 129 are not */
    for (int deep = 128; deep <= 129; deep++) {
        dx_buf_reset(&b);
        dx_buf_puts(&b, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"assistant\","
                        "\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\","
                        "\"input\":");
        for (int i = 0; i < deep; i++) dx_buf_puts(&b, i + 1 < deep ? "{\"a\":" : "{");
        for (int i = 0; i < deep; i++) dx_buf_putc(&b, '}');
        dx_buf_puts(&b, "}]}]}");
        if (deep == 129) {
            expect_limit(&b, "messages[0].content[0].input", "deeper than 128");
            continue;
        }
        assert_int_equal(oai_anth_req_parse(b.data, b.len, NULL, NULL, &r, &info, &e), 0);
        oai_req_free(&r);
    }
    dx_buf_reset(&b);
    dx_buf_puts(&b, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\","
                    "\"content\":\"x\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":");
    for (int i = 0; i < 200; i++) dx_buf_puts(&b, "{\"items\":");
    dx_buf_puts(&b, "{}");
    for (int i = 0; i < 200; i++) dx_buf_putc(&b, '}');
    dx_buf_puts(&b, "}]}");
    expect_limit(&b, "tools[0].input_schema", "deeper than 128");
    dx_buf_free(&b);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* Every allocation of the translation failing in turn: a 503, and
 * nothing left allocated (none goes unnoticed: a translation that lost a
 * piece would be a wrong prompt).  The failures start after the body's
 * load: jansson 2.14's lexer itself writes out of bounds when some of its
 * own allocations fail (a 14-byte key and the 4th allocation are enough),
 * whoever calls it. */
static void test_oom(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    char *body = sq("{'model':'m','max_tokens':5,'system':[{'type':'text','text':'s'}],"
                    "'tools':[{'name':'f','input_schema':{'type':'object'}}],'messages':["
                    "{'role':'user','content':'q'},{'role':'assistant','content':[{'type':"
                    "'thinking','thinking':'t'},{'type':'text','text':'a'},{'type':'tool_use',"
                    "'id':'x','name':'f','input':{'k':[1.5,'v']}}]},{'role':'user','content':[{"
                    "'type':'tool_result','tool_use_id':'x','is_error':true,'content':'e'},{"
                    "'type':'text','text':'more'}]}],'stop_sequences':['z'],'stream':true}");
    size_t len = strlen(body), a0 = dx_alloc_total_count();
    json_decref(json_loadb(body, len, JSON_ALLOW_NUL, NULL));
    long load = (long)(dx_alloc_total_count() - a0);
    json_t *doc;
    oai_anth_info info;
    oai_err e;
    a0 = dx_alloc_total_count();
    assert_int_equal(oai_anth_to_chat(body, len, NULL, &doc, &info, &e), 0);
    long all = (long)(dx_alloc_total_count() - a0);
    json_decref(doc);
    assert_true(all > load + 20);
    for (long n = load + 1; n <= all; n++) {
        dx_alloc_fail_after(n, 0);
        int rc = oai_anth_to_chat(body, len, NULL, &doc, &info, &e);
        dx_alloc_fail_after(0, 0);
        /* every one is the translation's: none may fail unnoticed */
        if (rc != DX_ENOMEM || e.status != 503)
            fail_msg("allocation %ld failing: rc %d, %d %s", n, rc, e.status, e.message);
        assert_int_equal(dx_alloc_live_bytes(), live + len + 1);
    }
    dx_free(body);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- answers ------------------------------------------------------------------- */

static const oai_usage k_usage = {.prompt = 120, .cached = 100, .completion = 9};

static char *message(const oai_tools_result *r, const oai_anth_end *e)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(oai_anth_message_json(&b, "msg_1", "m", r, e), 0);
    return dx_buf_take(&b);
}

static void test_message_json(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_tools_result r = {.content = "Hi \"there\"", .content_len = 10};
    oai_anth_end e = {.finish = "stop", .usage = k_usage};
    char *m = message(&r, &e);
    assert_string_equal(m,
                        "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":"
                        "[{\"type\":\"text\",\"text\":\"Hi \\\"there\\\"\"}],\"model\":\"m\","
                        "\"stop_reason\":\"end_turn\",\"stop_sequence\":null,\"usage\":{"
                        "\"input_tokens\":20,\"cache_creation_input_tokens\":0,"
                        "\"cache_read_input_tokens\":100,\"output_tokens\":9}}");
    dx_free(m);
    /* stop reasons */
    static const struct {
        const char *finish, *seq, *reason, *seq_out;
    } k[] = {
        {"stop", "\n\nHuman:", "stop_sequence", "\"\\n\\nHuman:\""},
        {"length", NULL, "max_tokens", "null"},
        {"length", "x", "max_tokens", "null"},
        {"tool_calls", NULL, "tool_use", "null"},
        {NULL, NULL, "end_turn", "null"},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        oai_anth_end ei = {.finish = k[i].finish, .stop_sequence = k[i].seq, .usage = k_usage};
        char want[160];
        m = message(&r, &ei);
        snprintf(want, sizeof want, "\"stop_reason\":\"%s\",\"stop_sequence\":%s,", k[i].reason,
                 k[i].seq_out);
        if (!strstr(m, want)) fail_msg("%zu: %s", i, m);
        dx_free(m);
    }
    /* thinking, text and calls, from a real answer; a call makes it tool_use */
    oai_tools_opts o = {.tools = OAI_TOOLS_QWEN, .reasoning = 1, .id_seed = 7};
    const char *ans = "<think>\nParis, then Tokyo.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": "
                      "\"get_weather\", \"arguments\": {\"city\": \"Paris\", \"t\": 4.2e1}}\n"
                      "</tool_call>\n<tool_call>\n{\"name\": \"now\"}\n</tool_call>";
    oai_tools_result tr;
    assert_int_equal(oai_tools_parse(&o, ans, strlen(ans), &tr), 0);
    m = message(&tr, &e);
    char want[512];
    snprintf(want, sizeof want,
             "\"content\":[{\"type\":\"thinking\",\"thinking\":\"Paris, then Tokyo.\","
             "\"signature\":\"\"},{\"type\":\"text\",\"text\":\"Checking.\"},{\"type\":"
             "\"tool_use\",\"id\":\"toolu_%s\",\"name\":\"get_weather\",\"input\":{\"city\":"
             "\"Paris\",\"t\":4.2e1}},{\"type\":\"tool_use\",\"id\":\"toolu_%s\",\"name\":\"now\","
             "\"input\":{}}],\"model\":\"m\",\"stop_reason\":\"tool_use\",",
             tr.calls[0].id + 5, tr.calls[1].id + 5);
    if (!strstr(m, want)) fail_msg("%s\nwanted %s", m, want);
    dx_free(m);
    /* nothing at all: no blocks; cached past the prompt is capped */
    oai_tools_result none = {0};
    oai_anth_end big = {.finish = "stop", .usage = {.prompt = 5, .cached = 9, .completion = 0}};
    m = message(&none, &big);
    assert_non_null(strstr(m, "\"content\":[],"));
    assert_non_null(strstr(m, "\"input_tokens\":0,\"cache_creation_input_tokens\":0,"
                              "\"cache_read_input_tokens\":5,"));
    dx_free(m);
    /* the decode role's members, at the top level */
    oai_anth_end ex = {.finish = "stop", .usage = k_usage, .extra = "\"kv_transfer_params\":{}"};
    m = message(&r, &ex);
    assert_non_null(strstr(m, "\"output_tokens\":9},\"kv_transfer_params\":{}}"));
    dx_free(m);
    /* arguments that are not one object (never from the parser) give {} */
    oai_tool_call bad = {.id = "call_1", .name = "f", .arguments = "{\"a\":", .arguments_len = 5};
    oai_tools_result rb = {.calls = &bad, .n_calls = 1};
    m = message(&rb, &e);
    assert_non_null(strstr(m, "\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{}}"));
    dx_free(m);
    oai_tools_result_free(&tr);
    /* invalid UTF-8 the model wrote: valid JSON, U+FFFD for each bad byte */
    oai_tools_result ru = {
        .content = "a\xff\xc3(b", .content_len = 5, .reasoning = "\xe2\x82", .reasoning_len = 2};
    m = message(&ru, &e);
    json_t *j = json_loads(m, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(j, "content"), 1), "text")),
                        "a\xef\xbf\xbd\xef\xbf\xbd(b");
    json_decref(j);
    dx_free(m);
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(oai_anth_count_json(&b, 1234), 0);
    assert_string_equal(b.data, "{\"input_tokens\":1234}");
    dx_buf_free(&b);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* An answer streamed in pieces of `step` bytes (0: whole) through the
 * tool parser and the encoder, read back, against the whole message. */
static void stream_vs_whole(const oai_tools_opts *o, const char *ans, size_t len, size_t step,
                            const oai_anth_end *e)
{
    oai_tools *tp = oai_tools_create(o);
    oai_anth_stream *s = oai_anth_stream_create();
    assert_non_null(tp);
    assert_non_null(s);
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(oai_anth_stream_start(s, &b, "msg_1", "m", &e->usage), 0);
    const oai_tools_ev *ev;
    size_t n;
    for (size_t i = 0; i < len; i += step ? step : len) {
        size_t k = step && i + step < len ? step : len - i;
        assert_int_equal(oai_tools_feed(tp, ans + i, k, &ev, &n), 0);
        assert_int_equal(oai_anth_stream_feed(s, &b, ev, n), 0);
    }
    assert_int_equal(oai_tools_finish(tp, &ev, &n), 0);
    assert_int_equal(oai_anth_stream_feed(s, &b, ev, n), 0);
    assert_int_equal(oai_anth_stream_n_calls(s), oai_tools_n_calls(tp));
    assert_int_equal(oai_anth_stream_end(s, &b, e), 0);
    char why[160];
    json_t *streamed;
    if (anth_sse_read(b.data, b.len, &streamed, why)) fail_msg("%s in\n%s", why, b.data);
    oai_tools_result r;
    assert_int_equal(oai_tools_parse(o, ans, len, &r), 0);
    char *whole_text = message(&r, e);
    json_t *whole = json_loads(whole_text, ANTH_SSE_JSON, NULL);
    assert_non_null(whole);
    if (anth_sse_same(streamed, whole, why)) fail_msg("%s:\n%s\n%s", why, b.data, whole_text);
    json_decref(whole);
    json_decref(streamed);
    dx_free(whole_text);
    oai_tools_result_free(&r);
    dx_buf_free(&b);
    oai_anth_stream_destroy(s);
    oai_tools_destroy(tp);
}

static void test_stream(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    oai_tools_opts qwen = {.tools = OAI_TOOLS_QWEN, .reasoning = 1, .id_seed = 3};
    oai_tools_opts plain = {.tools = OAI_TOOLS_NONE};
    oai_anth_end stop = {.finish = "stop", .usage = k_usage};
    oai_anth_end seq = {.finish = "stop", .stop_sequence = "###", .usage = k_usage};
    oai_anth_end length = {.finish = "length", .usage = k_usage};
    static const char *const answers[] = {
        "Hello, world.",
        "<think>\nThe user greets.\n</think>\n\nHi! \xe6\x9d\xb1\xe4\xba\xac is nice.",
        "<think>\nTwo calls.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\nand\n<tool_call>\n{\"name\": "
        "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Tokyo\\\"}\"}\n</tool_call>\nDone.",
        "<tool_call>\n{\"name\": \"now\"}\n</tool_call>",
        "<think>\ncut off in the middle of thinking",
        "bad bytes \xff\xfe and a \xc3",
        "",
    };
    for (size_t i = 0; i < sizeof answers / sizeof *answers; i++) {
        size_t len = strlen(answers[i]);
        for (size_t step = 0; step <= 3; step++) {
            stream_vs_whole(&qwen, answers[i], len, step, &stop);
            stream_vs_whole(&qwen, answers[i], len, step, &length);
            stream_vs_whole(&plain, answers[i], len, step, &seq);
        }
    }
    /* the exact events of a short answer */
    oai_anth_stream *s = oai_anth_stream_create();
    dx_buf b;
    dx_buf_init(&b, 0);
    oai_tools_ev ev[] = {
        {.kind = OAI_TOOLS_EV_REASONING, .text = "hm", .len = 2},
        {.kind = OAI_TOOLS_EV_CONTENT, .text = "Hi", .len = 2},
        {.kind = OAI_TOOLS_EV_CALL, .index = 0, .text = "f", .len = 1, .id = "call_ab"},
        {.kind = OAI_TOOLS_EV_ARGS, .index = 0, .text = "{\"a\":1}", .len = 7},
    };
    assert_int_equal(oai_anth_stream_start(s, &b, "msg_9", "claude-x", &k_usage), 0);
    assert_int_equal(oai_anth_stream_feed(s, &b, ev, 4), 0);
    assert_int_equal(oai_anth_stream_end(s, &b, &stop), 0);
    assert_string_equal(
        b.data,
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_9\","
        "\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-x\","
        "\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":20,"
        "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":100,\"output_tokens\":0}}}"
        "\n\n"
        "event: ping\ndata: {\"type\":\"ping\"}\n\n"
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
        "\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
        "\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n"
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,"
        "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,"
        "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n"
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,"
        "\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_ab\",\"name\":\"f\",\"input\":"
        "{}}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,"
        "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\":1}\"}}\n\n"
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n"
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
        "\"tool_use\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":20,"
        "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":100,\"output_tokens\":9}}"
        "\n\n"
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    dx_buf_reset(&b);
    oai_anth_end ex = {.finish = "length", .usage = k_usage, .extra = "\"kv_transfer_params\":{}"};
    assert_int_equal(oai_anth_stream_start(s, &b, "msg_9", "claude-x", &k_usage), 0);
    assert_int_equal(oai_anth_stream_end(s, &b, &ex), 0);
    assert_non_null(strstr(b.data, "\"output_tokens\":9},\"kv_transfer_params\":{}}\n\n"
                                   "event: message_stop"));
    json_t *read;
    char why[160];
    if (anth_sse_read(b.data, b.len, &read, why)) fail_msg("%s", why);
    json_decref(read);
    /* reused for the next message: nothing allocated once the buffer is warm */
    size_t allocs = dx_alloc_total_count();
    for (int k = 0; k < 100; k++) {
        dx_buf_reset(&b);
        oai_anth_stream_start(s, &b, "msg_9", "claude-x", &k_usage);
        oai_anth_stream_feed(s, &b, ev, 4);
        oai_anth_stream_text(s, &b, "more", 4);
        oai_anth_stream_end(s, &b, &stop);
    }
    assert_int_equal(dx_alloc_total_count(), allocs);
    /* an error once the stream has begun */
    dx_buf_reset(&b);
    assert_int_equal(oai_anth_sse_error(&b, 503, "overloaded"), 0);
    assert_string_equal(b.data, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                                "\"overloaded_error\",\"message\":\"overloaded\"}}\n\n");
    dx_buf_free(&b);
    oai_anth_stream_destroy(s);
    oai_anth_stream_destroy(NULL);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- errors and names ------------------------------------------------------------ */

static void test_errors(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    static const struct {
        int status;
        const char *type;
    } k[] = {{400, "invalid_request_error"},
             {401, "authentication_error"},
             {403, "permission_error"},
             {404, "not_found_error"},
             {405, "invalid_request_error"},
             {413, "request_too_large"},
             {429, "rate_limit_error"},
             {500, "api_error"},
             {502, "api_error"},
             {503, "overloaded_error"},
             {504, "timeout_error"},
             {529, "overloaded_error"}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        assert_string_equal(oai_anth_error_type(k[i].status), k[i].type);
    dx_buf b;
    dx_buf_init(&b, 0);
    /* a chat-path error's field names become Anthropic's; the route's
     * writer then takes the message as it is */
    oai_err ce = {.status = 400, .param = "tools[2].function.parameters"};
    snprintf(ce.message, sizeof ce.message,
             "tools[2].function.parameters: json schema: keyword "
             "'uniqueItems' at '/properties/tags' is not supported");
    oai_anth_err_from_chat(&ce);
    assert_string_equal(ce.param, "tools[2].input_schema");
    assert_int_equal(oai_anth_http_error(&b, 400, ce.message, ce.param, NULL), 0);
    assert_string_equal(b.data, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
                                "\"message\":\"tools[2].input_schema: json schema: keyword "
                                "'uniqueItems' at '/properties/tags' is not supported\"}}");
    dx_buf_reset(&b);
    assert_int_equal(oai_anth_http_error(&b, 400, "messages[0].content[1].type: image blocks",
                                         "messages[0].content[1].type", NULL),
                     0);
    assert_non_null(strstr(b.data, "\"messages[0].content[1].type: image blocks\""));
    dx_buf_reset(&b);
    assert_int_equal(oai_anth_http_error(&b, 401, "invalid API key", NULL, "invalid_api_key"), 0);
    assert_string_equal(b.data, "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\","
                                "\"message\":\"invalid API key\"}}");
    dx_buf_free(&b);
    static const char *const names[][2] = {
        {"tools[3].function.parameters", "tools[3].input_schema"},
        {"tools[3].function.parameters/x", "tools[3].input_schema/x"},
        {"tools[0].function.name", "tools[0].name"},
        {"stop", "stop_sequences"},
        {"max_completion_tokens", "max_tokens"},
        {"max_tokens", "max_tokens"},
        {"response_format.json_schema.schema", "output_config.format.schema"},
        {"response_format", "output_config.format"},
        {"messages[12].content", "messages"},
        {"messages", "messages"},
        {"user", "metadata.user_id"},
        {"stream_options", "stream_options"},
        {"tool_choice", "tool_choice"},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char out[64];
        oai_anth_param_name(names[i][0], out, sizeof out);
        assert_string_equal(out, names[i][1]);
    }
    char id[40];
    oai_anth_make_id(id, sizeof id);
    assert_int_equal(strlen(id), 36);
    assert_int_equal(strncmp(id, "msg_", 4), 0);
    assert_int_equal(strspn(id + 4, "0123456789abcdef"), 32);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

int main(void)
{
    oai_json_use_dx_alloc();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_conversation),
        cmocka_unit_test(test_system),
        cmocka_unit_test(test_tool_loop),
        cmocka_unit_test(test_turns),
        cmocka_unit_test(test_tool_choice),
        cmocka_unit_test(test_thinking_and_format),
        cmocka_unit_test(test_arguments_text),
        cmocka_unit_test(test_rejections),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_oom),
        cmocka_unit_test(test_message_json),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
