// Load generator for `make bench-server` (run by scripts/bench_server.sh).
// Uses node's http module with a keep-alive agent, so it measures the server,
// not connection set-up.  Prints one line per phase.
//   node bench_server.mjs PORT MODEL
import http from 'node:http';

const [port, model] = [Number(process.argv[2]), process.argv[3]];
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

function post(path, body, onData) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request({ host: '127.0.0.1', port, path, method: 'POST', agent,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) } },
    (res) => {
      const parts = [];
      res.on('data', (c) => { parts.push(c); if (onData) onData(c); });
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(parts).toString() }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

function get(path) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path, agent }, (res) => {
      let s = '';
      res.on('data', (c) => (s += c));
      res.on('end', () => resolve(s));
    }).on('error', reject);
  });
}

async function histSum(name) {
  const m = await get('/metrics');
  const sum = Number(m.match(new RegExp(`\\n${name}_sum (\\S+)`))[1]);
  const count = Number(m.match(new RegExp(`\\n${name}_count (\\S+)`))[1]);
  return { sum, count };
}

const pct = (a, p) => a[Math.min(a.length - 1, Math.floor(p * a.length))];

// max_tokens=1 non-streaming requests, `conc` at a time: requests/s, client
// latency, and the client latency minus the engine's own submit→token time.
async function phaseOneToken(n, conc) {
  const body = { model, messages: [{ role: 'user', content: 'Say one word.' }], max_tokens: 1,
                 temperature: 0 };
  const e0 = await histSum('duplex_engine_ttft_seconds');
  const s0 = await histSum('duplex_request_duration_seconds');
  const lat = [];
  let next = 0;
  const t0 = performance.now();
  async function worker() {
    while (next < n) {
      next++;
      const s = performance.now();
      const r = await post('/v1/chat/completions', body);
      if (r.status !== 200) throw new Error(`status ${r.status}: ${r.body}`);
      lat.push(performance.now() - s);
    }
  }
  await Promise.all(Array.from({ length: conc }, worker));
  const wall = (performance.now() - t0) / 1000;
  const e1 = await histSum('duplex_engine_ttft_seconds');
  const s1 = await histSum('duplex_request_duration_seconds');
  lat.sort((a, b) => a - b);
  const mean = lat.reduce((a, b) => a + b, 0) / lat.length;
  const engMs = ((e1.sum - e0.sum) / (e1.count - e0.count)) * 1000;
  const srvMs = ((s1.sum - s0.sum) / (s1.count - s0.count)) * 1000;
  // client - server: sockets and HTTP framing (outside the server's clock);
  // server - engine: JSON, tokenizer, engine inbox wait, event hop.
  console.log(`max_tokens=1 concurrency=${conc}: ${n} requests, ${(n / wall).toFixed(0)} req/s; ` +
    `client latency p50 ${pct(lat, 0.5).toFixed(2)} ms p99 ${pct(lat, 0.99).toFixed(2)} ms mean ` +
    `${mean.toFixed(2)} ms; server (request parsed -> answer queued) ${srvMs.toFixed(2)} ms; ` +
    `engine (admitted -> token) ${engMs.toFixed(2)} ms; HTTP transport adds ` +
    `${(mean - srvMs).toFixed(2)} ms, server before/after the engine ${(srvMs - engMs).toFixed(2)} ms`);
}

// `conc` streams of `len` tokens each (ignore_eos): tokens/s and events/s.
async function phaseStream(conc, len) {
  let events = 0;
  const t0 = performance.now();
  const res = await Promise.all(Array.from({ length: conc }, (_, i) =>
    post('/v1/completions', { model, prompt: `Stream ${i}: once upon a time`, max_tokens: len,
      temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true } },
    (c) => { events += (c.toString().match(/^data: /gm) || []).length; })));
  const wall = (performance.now() - t0) / 1000;
  let toks = 0;
  for (const r of res) {
    if (r.status !== 200) throw new Error(`status ${r.status}`);
    const m = r.body.match(/"completion_tokens":(\d+)/);
    toks += Number(m[1]);
  }
  console.log(`streaming concurrency=${conc} max_tokens=${len}: ${toks} tokens in ` +
    `${wall.toFixed(2)} s = ${(toks / wall).toFixed(0)} tok/s, ${(events / wall).toFixed(0)} SSE ` +
    `events/s`);
}

await phaseOneToken(50, 1); // warm-up
await phaseOneToken(1000, 1);
await phaseOneToken(2000, 16);
await phaseStream(1, 256);
await phaseStream(16, 256);
agent.destroy();
