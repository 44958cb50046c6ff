// Decode tokens/s of constrained vs unconstrained chat requests against a
// running `duplex serve` (scripts/bench_structured.sh starts one), at batch
// 1 and 8, and the mask time per token from /metrics.  Both kinds generate
// exactly `tokens` tokens after the same short prompt, greedy (with random
// weights nearly every logit is within reach of the best, so temperature 1
// would time the sampler's sort of 151,936 candidates, which a mask spares):
// unconstrained with ignore_eos; constrained by a schema that cannot end
// sooner (an array of at least 10,000 small objects), so every step masks.
// Each figure is the median over `rounds` runs of completion tokens / wall
// time (the short prompt's prefill included in both).
// Usage: node bench_structured.mjs PORT MODEL [tokens] [rounds]
const [port, model] = process.argv.slice(2, 4);
const tokens = Number(process.argv[4] ?? 64), rounds = Number(process.argv[5] ?? 3);
const base = `http://127.0.0.1:${port}`;
const schema = {
  type: 'array', minItems: 10000,
  items: { type: 'object', additionalProperties: false, required: ['id', 'name', 'ok'],
    properties: { id: { type: 'integer' }, name: { type: 'string', maxLength: 12 },
      ok: { type: 'boolean' } } },
};

async function metric(name) {
  const t = await (await fetch(`${base}/metrics`)).text();
  const m = t.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
  return m ? Number(m[1]) : 0;
}

async function one(constrained, seed) {
  const body = { model, messages: [{ role: 'user', content: 'List the records as JSON.' }],
    max_tokens: tokens, temperature: 0, seed };
  if (constrained) body.response_format = { type: 'json_schema',
    json_schema: { name: 'records', schema, strict: true } };
  else body.ignore_eos = true;
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST',
    headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const j = await r.json();
  if (!r.ok) throw new Error(JSON.stringify(j));
  return j.usage.completion_tokens;
}

async function run(constrained, batch) {
  const t0 = performance.now();
  const n = await Promise.all([...Array(batch).keys()].map((i) => one(constrained, i + 1)));
  return n.reduce((a, b) => a + b, 0) / ((performance.now() - t0) / 1000);
}

const median = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
await one(true, 0); // compiles the schema, builds the vocabulary's trie, warms the caches
await one(false, 0);
console.log(`${tokens} tokens per request, median of ${rounds} rounds (interleaved)`);
console.log('| batch | unconstrained tok/s | constrained tok/s | constrained / unconstrained | mask µs/token | engine waited µs/token |');
console.log('| --- | --- | --- | --- | --- | --- |');
for (const batch of [1, 8]) {
  const u = [], c = [];
  let masks = 0, mask_s = 0, wait_s = 0;
  for (let r = 0; r < rounds; r++) {
    u.push(await run(false, batch));
    const m0 = await metric('duplex_grammar_masks_total');
    const s0 = await metric('duplex_grammar_mask_seconds_total');
    const w0 = await metric('duplex_grammar_mask_wait_seconds_total');
    c.push(await run(true, batch));
    masks += (await metric('duplex_grammar_masks_total')) - m0;
    mask_s += (await metric('duplex_grammar_mask_seconds_total')) - s0;
    wait_s += (await metric('duplex_grammar_mask_wait_seconds_total')) - w0;
  }
  const mu = median(u), mc = median(c);
  console.log(`| ${batch} | ${mu.toFixed(1)} | ${mc.toFixed(1)} | ${(mc / mu).toFixed(3)} | ` +
    `${(mask_s / masks * 1e6).toFixed(1)} | ${(wait_s / masks * 1e6).toFixed(1)} |`);
}
