// A server with API keys, seen by the official openai package (pinned in
// package.json): a wrong key is the client's AuthenticationError with
// OpenAI's status, type and code; the right key lists the models and chats.
// Usage: node openai_auth.mjs http://127.0.0.1:PORT/v1 GOOD_KEY
// Exits 0 when every check holds; prints what failed otherwise.
import OpenAI from 'openai';
import { check, failed } from './check.mjs';

const [baseURL, key] = process.argv.slice(2);

const bad = new OpenAI({ baseURL, apiKey: 'sk-not-a-key', maxRetries: 0, timeout: 60000 });
try {
  await bad.models.list();
  check(false, 'a wrong key is refused');
} catch (e) {
  check(e instanceof OpenAI.AuthenticationError, 'a wrong key is an AuthenticationError', e?.name);
  check(e.status === 401, 'status 401', e.status);
  check(e.code === 'invalid_api_key', 'code invalid_api_key', e.code);
  check(e.type === 'invalid_request_error', 'type invalid_request_error', e.type);
}

const good = new OpenAI({ baseURL, apiKey: key, maxRetries: 0, timeout: 60000 });
const ids = [];
for await (const m of await good.models.list()) ids.push(m.id);
check(ids.length === 1, 'the right key lists the model', ids);
const chat = await good.chat.completions.create({
  model: ids[0], messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0,
});
check(chat.choices[0].message.content !== undefined, 'the right key chats', chat.choices[0]);
process.exit(failed() ? 1 : 0);
