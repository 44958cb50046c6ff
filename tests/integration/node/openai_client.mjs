// Drives `duplex serve` with the official openai package (pinned in
// package.json): models list, chat and completions, streaming and not, a
// tool-calling conversation, logprobs, and errors.  Usage: node openai_client.mjs http://127.0.0.1:PORT/v1
// Exits 0 when every check holds; prints what failed otherwise.
import OpenAI from 'openai';
import { check, failed } from './check.mjs';

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

const models = await client.models.list();
const ids = [];
for await (const m of models) ids.push(m.id);
check(ids.length === 1, 'models.list has one model', ids);
const model = ids[0];

const messages = [{ role: 'user', content: 'Tell me about the sea.' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
const full = chat.choices[0].message.content;
check(chat.object === 'chat.completion', 'chat object', chat.object);
check(typeof full === 'string', 'chat content is a string', full);
check(chat.usage.completion_tokens > 0 && chat.usage.total_tokens ===
      chat.usage.prompt_tokens + chat.usage.completion_tokens, 'chat usage', chat.usage);
check(['stop', 'length'].includes(chat.choices[0].finish_reason), 'chat finish_reason',
      chat.choices[0].finish_reason);

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 12, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
let text = '', finish = null, usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    text += c.delta?.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(text === full, 'chat stream text equals non-stream', { text, full });
check(finish === chat.choices[0].finish_reason, 'chat stream finish_reason', finish);
check(usage && usage.completion_tokens === chat.usage.completion_tokens, 'chat stream usage', usage);

const cmpl = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 10,
                                              temperature: 0 });
check(cmpl.object === 'text_completion', 'completion object', cmpl.object);
let ctext = '';
const cstream = await client.completions.create({ model, prompt: 'Once upon a time',
                                                 max_tokens: 10, temperature: 0, stream: true });
for await (const chunk of cstream) ctext += chunk.choices[0]?.text ?? '';
check(ctext === cmpl.choices[0].text, 'completion stream equals non-stream',
      { ctext, full: cmpl.choices[0].text });

// An agentic turn: tools, an assistant tool call and its result in the
// history, both stream modes; the answer is whatever the model says (text
// or calls), in the shapes the client types describe.
const tools = [{ type: 'function', function: {
  name: 'get_weather', description: 'Current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const history = [
  { role: 'user', content: 'What is the weather in Paris?' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
    function: { name: 'get_weather', arguments: JSON.stringify({ city: 'Paris' }) } }] },
  { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21 C' },
];
const agent = await client.chat.completions.create({ model, messages: history, tools,
  tool_choice: 'auto', max_tokens: 16, temperature: 0 });
const am = agent.choices[0].message;
check(agent.choices[0].finish_reason !== null && (typeof am.content === 'string' ||
      Array.isArray(am.tool_calls)), 'tool conversation answered', am);
let atext = '', afinish = null, acalls = 0;
const astream = await client.chat.completions.create({ model, messages: history, tools,
  max_tokens: 16, temperature: 0, stream: true });
for await (const chunk of astream) {
  for (const c of chunk.choices) {
    atext += c.delta?.content ?? '';
    acalls += (c.delta?.tool_calls ?? []).filter((t) => t.id).length;
    if (c.finish_reason) afinish = c.finish_reason;
  }
}
check(atext === (am.content ?? '') && acalls === (am.tool_calls ?? []).length &&
      afinish === agent.choices[0].finish_reason, 'tool conversation stream equals non-stream',
      { atext, acalls, afinish });

// logprobs through the client's types
const lp = await client.chat.completions.create({ model, messages, max_tokens: 5, temperature: 0,
  logprobs: true, top_logprobs: 2 });
const lpc = lp.choices[0].logprobs?.content ?? [];
check(lpc.length === lp.usage.completion_tokens && lpc.every((e) => e.top_logprobs.length === 2 &&
      e.logprob <= 0), 'chat logprobs', lp.choices[0].logprobs);

try {
  await client.chat.completions.create({ model, messages, max_tokens: -3 });
  check(false, 'negative max_tokens rejected');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'max_tokens',
        'negative max_tokens is a BadRequestError naming the field', { status: e.status, param: e.param });
}
try {
  await client.chat.completions.create({ model: 'no-such-model', messages });
  check(false, 'unknown model rejected');
} catch (e) {
  check(e instanceof OpenAI.NotFoundError, 'unknown model is a NotFoundError', e.status);
}

console.log(failed() ? `${failed()} checks failed` : 'all checks passed');
process.exit(failed() ? 1 : 0);
