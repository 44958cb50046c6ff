// Structured outputs through the official openai package, checked by an
// independent JSON Schema validator (ajv, pinned in package.json) — the
// server's own code judges nothing here.
//  1. conformance: a matrix of schemas (nested objects, arrays, enums,
//     anyOf, $ref/$defs, consts, integers, numbers, booleans, nulls) × many
//     seeds at temperature 1 from a random-weight model: every answer must
//     finish with "stop", parse as JSON and validate; json_object answers
//     that finish must parse as an object;
//  2. forced tool calls: tool_choice "required" with two tools gives one
//     call naming one of them whose arguments validate against its
//     parameters, finish_reason "tool_calls"; a named choice gives that
//     tool; streamed, the delta.tool_calls fragments add up to the same call.
// Usage: node structured.mjs http://127.0.0.1:PORT/v1 [seeds]
import OpenAI from 'openai';
import Ajv from 'ajv';
import { check, failed } from './check.mjs';

const baseURL = process.argv[2];
const nSeeds = Number(process.argv[3] ?? 8);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const ajv = new Ajv({ strict: false, allErrors: true });
const model = (await client.models.list()).data[0].id;
const messages = [{ role: 'user', content: 'Describe a city as JSON.' }];

// Strings are bounded (maxLength) and objects closed: a random model picks
// among the allowed tokens at random, and an open-ended string or object
// would rarely end before max_tokens.
const str = (n) => ({ type: 'string', maxLength: n });
const schemas = {
  flat: { type: 'object', additionalProperties: false, required: ['name', 'age', 'ok'],
    properties: { name: str(6), age: { type: 'integer' },
      ok: { type: 'boolean' } } },
  nested: { type: 'object', additionalProperties: false, required: ['city', 'where'],
    properties: { city: str(5), where: { type: 'object', additionalProperties: false,
      required: ['lat', 'lon'], properties: { lat: { type: 'number' }, lon: { type: 'number' },
        alt: { type: 'integer' } } } } },
  array: { type: 'object', additionalProperties: false, required: ['tags'],
    properties: { tags: { type: 'array', items: str(4), minItems: 1, maxItems: 3 } } },
  enums: { type: 'object', additionalProperties: false, required: ['color', 'size', 'kind'],
    properties: { color: { enum: ['red', 'green', 'blue'] }, size: { enum: [1, 2, 3, null] },
      kind: { const: 'shape' } } },
  anyof: { type: 'object', additionalProperties: false, required: ['v'],
    properties: { v: { anyOf: [{ type: 'integer' }, str(3), { type: 'null' },
      { type: 'array', items: { type: 'boolean' }, maxItems: 2 }] } } },
  refs: { $defs: { pt: { type: 'object', additionalProperties: false, required: ['x', 'y'],
      properties: { x: { type: 'integer' }, y: { type: 'integer' } } } },
    type: 'object', additionalProperties: false, required: ['a', 'b'],
    properties: { a: { $ref: '#/$defs/pt' }, b: { type: 'array', items: { $ref: '#/$defs/pt' },
      maxItems: 2 } } },
  top_array: { type: 'array', items: { enum: ['x', 'y'] }, minItems: 2, maxItems: 4 },
};

for (const [name, schema] of Object.entries(schemas)) {
  const validate = ajv.compile(schema);
  let good = 0;
  const bad = [];
  await Promise.all([...Array(nSeeds).keys()].map(async (seed) => {
    const r = await client.chat.completions.create({ model, messages, temperature: 1, seed,
      max_tokens: 200, response_format: { type: 'json_schema',
        json_schema: { name, schema, strict: true } } });
    const c = r.choices[0];
    let v;
    try { v = JSON.parse(c.message.content); } catch (e) { v = undefined; }
    if (c.finish_reason === 'stop' && v !== undefined && validate(v)) good++;
    else bad.push({ seed, finish: c.finish_reason, text: c.message.content, errors: validate.errors });
  }));
  check(good === nSeeds, `schema ${name}: ${good}/${nSeeds} answers parse and validate`, bad[0]);
}

// json_object: any object; one that finishes is a parseable object
{
  let finished = 0;
  const bad = [];
  for (let seed = 0; seed < nSeeds; seed++) {
    const r = await client.chat.completions.create({ model, messages, temperature: 1, seed,
      max_tokens: 120, response_format: { type: 'json_object' } });
    const c = r.choices[0], t = c.message.content;
    if (c.finish_reason !== 'stop') {
      if (c.finish_reason !== 'length' || !t.startsWith('{')) bad.push({ seed, t, f: c.finish_reason });
      continue;
    }
    finished++;
    try {
      const v = JSON.parse(t);
      if (typeof v !== 'object' || v === null || Array.isArray(v)) bad.push({ seed, t });
    } catch (e) { bad.push({ seed, t, e: String(e) }); }
  }
  check(bad.length === 0, `json_object: ${finished}/${nSeeds} finished, all objects`, bad[0]);
}

// forced tool calls
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', additionalProperties: false, required: ['city', 'unit'],
      properties: { city: str(8), unit: { enum: ['C', 'F'] } } } } },
  { type: 'function', function: { name: 'add', description: 'Add two integers',
    parameters: { type: 'object', additionalProperties: false, required: ['a', 'b'],
      properties: { a: { type: 'integer' }, b: { type: 'integer' } } } } },
];
const toolCheck = Object.fromEntries(tools.map((t) => [t.function.name,
  ajv.compile(t.function.parameters)]));
const ask = [{ role: 'user', content: 'What is the weather in Oslo?' }];

function callOk(msg, finish, want) {
  const calls = msg.tool_calls ?? [];
  if (finish !== 'tool_calls' || calls.length !== 1) return false;
  const f = calls[0].function;
  if (!(f.name in toolCheck) || (want && f.name !== want)) return false;
  try { return toolCheck[f.name](JSON.parse(f.arguments)); } catch (e) { return false; }
}

const seen = new Set();
for (let seed = 0; seed < nSeeds; seed++) {
  const r = await client.chat.completions.create({ model, messages: ask, tools,
    tool_choice: 'required', temperature: 1, seed, max_tokens: 120 });
  const c = r.choices[0];
  check(callOk(c.message, c.finish_reason), `required, seed ${seed}: one valid call`, c);
  if (c.message.tool_calls?.[0]) seen.add(c.message.tool_calls[0].function.name);
}
for (const t of tools) {
  const name = t.function.name;
  const r = await client.chat.completions.create({ model, messages: ask, tools, temperature: 1,
    seed: 7, max_tokens: 120, tool_choice: { type: 'function', function: { name } } });
  const c = r.choices[0];
  check(callOk(c.message, c.finish_reason, name), `named ${name}: a valid call of it`, c);
  // streamed: the fragments add up to the same call
  const s = await client.chat.completions.create({ model, messages: ask, tools, temperature: 1,
    seed: 7, max_tokens: 120, tool_choice: { type: 'function', function: { name } }, stream: true });
  let sname = '', sargs = '', finish = null, n = 0;
  for await (const chunk of s) {
    for (const ch of chunk.choices) {
      for (const tc of ch.delta?.tool_calls ?? []) {
        if (tc.id) n++;
        sname += tc.function?.name ?? '';
        sargs += tc.function?.arguments ?? '';
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  const f = c.message.tool_calls?.[0]?.function;
  check(n === 1 && finish === 'tool_calls' && f && sname === f.name && sargs === f.arguments,
        `named ${name}, streamed: the same call in delta.tool_calls`, { n, finish, sname, sargs, f });
}
// a tool result and the next forced call: the loop an agent runs
{
  const r1 = await client.chat.completions.create({ model, messages: ask, tools,
    tool_choice: 'required', temperature: 0, max_tokens: 120 });
  const call = r1.choices[0].message.tool_calls[0];
  const turn2 = [...ask, r1.choices[0].message,
    { role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' }];
  const r2 = await client.chat.completions.create({ model, messages: turn2, tools,
    tool_choice: 'required', temperature: 0, max_tokens: 120 });
  check(callOk(r2.choices[0].message, r2.choices[0].finish_reason), 'second turn: a valid call',
        r2.choices[0]);
}

console.log(`tools called: ${[...seen].join(', ')}`);
console.log(failed() ? `${failed()} checks failed` : 'all checks passed');
process.exit(failed() ? 1 : 0);
