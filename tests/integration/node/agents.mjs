// Agent loops through duplex's three front doors, with the official
// clients as agents use them (pinned in package.json):
//   chat       openai: chat.completions tool loop, appending the SDK's own
//              assistant message (content null next to tool_calls), whole
//              and streamed (chat.completions.stream)
//   responses  openai: responses.create and responses.stream with function
//              tools and previous_response_id chains; store:false cannot be
//              continued (404); GET and DELETE of a stored response
//   messages   @anthropic-ai/sdk: messages.create and messages.stream tool
//              loops with tool_use / tool_result blocks; countTokens
// Usage: node agents.mjs MODE BASE_URL [turns]   (BASE_URL http://127.0.0.1:PORT)
// Prints one JSON line: what each turn answered (texts, calls, stop
// reasons, prompt tokens), so that two servers' runs can be compared byte
// for byte; exits 1 (after printing what failed) when a check fails.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { check, failed } from './check.mjs';

const [mode, base, turnsArg] = process.argv.slice(2);
const turns = Number(turnsArg ?? 3);
const record = [];
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const models = await openai.models.list();
let model;
for await (const m of models) model = model ?? m.id;

const schema = {
  type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'],
  additionalProperties: false,
};
const desc = 'Current weather in a city';
const question = 'What is the weather in Paris today? Use the tool, then answer in one line.';
// long enough that, from the second turn, the history a decode node holds
// is past the prefill node's threshold for pulling it (64 tokens)
const sys = 'You are a weather agent. You answer questions about the weather in cities around ' +
  'the world, always calling the get_weather tool first to look up the current conditions, and ' +
  'then you reply to the user in one short line that repeats the city, the temperature and the wind.';
const result = (i) => `sunny, ${18 + i} C, light wind from the west`;

async function chatLoop(stream) {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: desc, parameters: schema } }];
  const messages = [{ role: 'system', content: [{ type: 'text', text: sys }] },
                    { role: 'user', content: question }];
  for (let t = 0; t < turns; t++) {
    const last = t === turns - 1;
    const body = { model, messages, tools, max_completion_tokens: last ? 8 : 48, temperature: 0,
                   tool_choice: last ? 'auto' : 'required', parallel_tool_calls: false };
    let msg, usage, finish;
    if (stream) {
      const s = openai.chat.completions.stream({ ...body, stream_options: { include_usage: true } });
      const c = await s.finalChatCompletion();
      msg = c.choices[0].message; usage = c.usage; finish = c.choices[0].finish_reason;
    } else {
      const c = await openai.chat.completions.create(body);
      msg = c.choices[0].message; usage = c.usage; finish = c.choices[0].finish_reason;
    }
    const calls = (msg.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]);
    if (!last) {
      check(calls.length === 1, `chat turn ${t}: one forced call`, msg);
      check(msg.content === null, `chat turn ${t}: content null beside the call`, msg.content);
    }
    record.push({ turn: t, text: msg.content, calls, finish, prompt: usage.prompt_tokens });
    messages.push(msg); // exactly as the SDK returned it
    for (const c of msg.tool_calls ?? [])
      messages.push({ role: 'tool', tool_call_id: c.id, content: result(t) });
  }
}

async function responsesLoop(stream) {
  const tools = [{ type: 'function', name: 'get_weather', description: desc, parameters: schema }];
  let prev = null, input = question;
  for (let t = 0; t < turns; t++) {
    const last = t === turns - 1;
    const body = { model, input, tools, temperature: 0, max_output_tokens: last ? 8 : 48,
                   tool_choice: last ? 'auto' : 'required', parallel_tool_calls: false,
                   instructions: sys };
    if (prev) body.previous_response_id = prev;
    const r = stream ? await openai.responses.stream(body).finalResponse()
                     : await openai.responses.create(body);
    check(r.object === 'response' && r.id.startsWith('resp_'), `responses turn ${t}: a response`, r.id);
    const calls = r.output.filter((o) => o.type === 'function_call');
    if (!last) check(calls.length === 1, `responses turn ${t}: one forced call`, r.output);
    record.push({ turn: t, text: r.output_text, calls: calls.map((c) => [c.name, c.arguments]),
                  status: r.status, prompt: r.usage.input_tokens });
    prev = r.id;
    input = calls.map((c) => ({ type: 'function_call_output', call_id: c.call_id, output: result(t) }));
    if (!input.length) input = 'Thanks.';
  }
  // the stored response, read back and deleted
  const got = await openai.responses.retrieve(prev);
  check(got.id === prev && got.output_text === record[record.length - 1].text, 'GET the stored response', got.id);
  await openai.responses.delete(prev);
  let gone = 0;
  try { await openai.responses.retrieve(prev); } catch (e) { gone = e.status; }
  check(gone === 404, 'a deleted response is a 404', gone);
  // store: false cannot be continued
  const nostore = await openai.responses.create({ model, input: 'hi', store: false, max_output_tokens: 2, temperature: 0 });
  let status = 0;
  try {
    await openai.responses.create({ model, input: 'again', previous_response_id: nostore.id, max_output_tokens: 2 });
  } catch (e) { status = e.status; }
  check(status === 404, 'continuing a store:false response is a 404', status);
}

async function messagesLoop(stream) {
  const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  const tools = [{ name: 'get_weather', description: desc, input_schema: schema }];
  const messages = [{ role: 'user', content: question }];
  const system = [{ type: 'text', text: sys }];
  for (let t = 0; t < turns; t++) {
    const last = t === turns - 1;
    const body = { model, system, messages, tools, temperature: 0, max_tokens: last ? 8 : 48,
                   tool_choice: last ? { type: 'auto' } : { type: 'any', disable_parallel_tool_use: true } };
    const count = await anthropic.messages.countTokens({ model, system, messages, tools });
    const m = stream ? await anthropic.messages.stream(body).finalMessage()
                     : await anthropic.messages.create(body);
    check(m.type === 'message' && m.role === 'assistant', `messages turn ${t}: a message`, m);
    const uses = m.content.filter((b) => b.type === 'tool_use');
    if (!last) {
      check(uses.length === 1 && m.stop_reason === 'tool_use', `messages turn ${t}: one forced call`, m);
      check(uses[0].id.startsWith('toolu_'), `messages turn ${t}: a tool_use id`, uses[0].id);
    }
    const prompt = m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0);
    check(prompt === count.input_tokens, `messages turn ${t}: count_tokens says the prompt's size`,
          { prompt, count: count.input_tokens });
    const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    record.push({ turn: t, text, calls: uses.map((u) => [u.name, JSON.stringify(u.input)]),
                  stop: m.stop_reason, prompt });
    messages.push({ role: 'assistant', content: m.content }); // the SDK's own blocks
    if (uses.length)
      messages.push({ role: 'user', content: uses.map((u) => ({ type: 'tool_result', tool_use_id: u.id, content: result(t) })) });
    else messages.push({ role: 'user', content: 'Thanks.' });
  }
}

const loops = { chat: chatLoop, responses: responsesLoop, messages: messagesLoop };
if (!loops[mode]) { console.error(`unknown mode ${mode}`); process.exit(2); }
for (const stream of [false, true]) {
  record.push({ stream });
  await loops[mode](stream);
}
console.log(`RECORD ${JSON.stringify(record)}`);
process.exit(failed() ? 1 : 0);
