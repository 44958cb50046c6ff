/* Fuzz target for the Jinja interpreter: any bytes as a template must parse
 * or be refused with an error, and a parsed template must render against a
 * fixed chat-like variable set (messages with tool calls and reasoning,
 * tools, flags) or fail with an error — never crash, hang, overrun the
 * stack or leak.  Small limits keep each input fast; the checks that
 * matter (bounded recursion, steps, output, memory) are the same code as
 * with the defaults. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "jinja/jinja.h"

static const char k_vars[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    "{\"role\": \"user\", \"content\": \"Weather in Zürich? 😀\"},"
    "{\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"Use the tool.\","
    " \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\":"
    " \"get_weather\", \"arguments\": {\"location\": \"Zürich\", \"days\": [1, 2.5, null]}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"{\\\"t\\\": 12}\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>\\nok\\n</think>\\n\\nIt is 12 °C.\"},"
    "{\"role\": \"user\", \"content\": \"Thanks\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\":"
    " \"string\"}}, \"required\": [\"location\"]}}}],"
    "\"add_generation_prompt\": true, \"enable_thinking\": false,"
    "\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"n\": 3, \"f\": 2.5, \"d\": {\"b\": 1, "
    "\"a\": 2}}";

static json_t *g_vars;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_vars && !(g_vars = json_loads(k_vars, 0, NULL))) abort();
    size_t live = dx_alloc_live_count();
    jinja_tmpl *t;
    if (jinja_parse((const char *)data, size, &t) == 0) {
        jinja_limits lim = {
            .max_output = 1 << 16, .max_memory = 8 << 20, .max_steps = 200000, .max_depth = 200};
        dx_buf out;
        dx_buf_init(&out, 0);
        jinja_render_ex(t, g_vars, &lim, &out);
        if (out.len > lim.max_output) abort();
        dx_buf_free(&out);
        jinja_free(t);
    }
    if (dx_alloc_live_count() != live) abort(); /* a leak */
    return 0;
}
