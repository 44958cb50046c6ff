// Drives `duplex serve` with the official openai package (pinned in
// package.json): models list, chat and completions, streaming and not,
// and an error.  Usage: node openai_client.mjs http://127.0.0.1:PORT/v1
// Exits 0 when every check holds; prints what failed otherwise.
import OpenAI from 'openai';

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
let failures = 0;
function check(cond, what, detail) {
  if (!cond) {
    failures++;
    console.error(`FAIL ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
  } else {
    console.log(`ok   ${what}`);
  }
}

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

console.log(failures ? `${failures} checks failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
