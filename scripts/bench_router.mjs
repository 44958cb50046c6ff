// The router's added latency (run by scripts/bench_router.sh; prints
// figures, asserts nothing).
//   node bench_router.mjs DUPLEX_BIN TINY_MODEL [N]
//
// 1. A fake decode node inside this process streams a role chunk, then (2 ms
//    later) a content chunk, then the final chunk with kv_transfer_params.
//    The client, in the same process and on the same clock, measures the
//    time from the fake node's write of the content event to its arrival:
//    through `duplex router` and directly, interleaved, N requests each.
//    The difference is what the router adds between a node sending a byte
//    and the client receiving it.  Non-streamed answers likewise.
// 2. A real node (`duplex serve`, tiny model) behind a colocated router:
//    time to the first content event, and max_tokens=1 latency, through the
//    router and directly.
// 3. The router's own histogram (duplex_router_added_seconds) for both.
// 4. Conversation state in memory vs in Redis (`--state`, a redis-server this
//    script starts on a free loopback port when one is installed): two
//    routers over the same fake decode node, requests with conversation ids
//    (every one a lookup before the upstream request and a write after it),
//    interleaved direct / memory / Redis; the router-added latency of each
//    (request start -> the whole answer, pairwise minus direct).
import http from 'node:http';
import net from 'node:net';
import { spawn, spawnSync } from 'node:child_process';

const [bin, modelPath, nArg] = process.argv.slice(2);
const N = Number(nArg || 200);
const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
const children = [];

function startProc(args) {
  return new Promise((resolve, reject) => {
    const p = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(p);
    let log = '';
    p.stderr.on('data', (c) => {
      log += c;
      const m = log.match(/address=http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    p.on('exit', (code) => reject(new Error(`${args[0]} exited ${code}: ${log}`)));
  });
}

function request(port, path, body, onEvent, extra = {}) {
  return new Promise((resolve, reject) => {
    const data = body ? JSON.stringify(body) : null;
    const req = http.request({ host: '127.0.0.1', port, path, method: data ? 'POST' : 'GET', agent,
      headers: data ? { 'Content-Type': 'application/json',
                        'Content-Length': Buffer.byteLength(data), ...extra } : extra }, (res) => {
      let buf = '';
      res.on('data', (c) => {
        const now = performance.now();
        buf += c;
        if (onEvent) {
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            onEvent(buf.slice(0, i), now);
            buf = buf.slice(i + 2);
          }
        }
      });
      res.on('end', () => resolve({ status: res.statusCode, body: buf, end: performance.now() }));
    });
    req.on('error', reject);
    req.end(data || undefined);
  });
}

// ---- the fake decode node ----
const PARAMS = { do_remote_prefill: true, do_remote_decode: false, remote_engine_id: 'fake',
  remote_block_ids: [1, 2, 3], remote_num_tokens: 48, remote_blocks_ttl_s: 480,
  remote_lease: '00112233445566778899aabbccddeeff', remote_token_ids: [1, 2, 3] };
let sentAt = 0; // when the fake wrote the request's content event (or its answer)

function fakeNode(req, res) {
  if (req.url.split('?')[0] === '/health') return res.end('{"status":"ok"}');
  let body = '';
  req.on('data', (c) => (body += c));
  req.on('end', () => {
    const q = JSON.parse(body);
    if (q.kv_transfer_params && q.kv_transfer_params.do_remote_decode) { // as a prefill node
      res.setHeader('Content-Type', 'application/json');
      return res.end(JSON.stringify({ id: 'p', object: 'chat.completion', choices: [{ index: 0,
        message: { role: 'assistant', content: 'x' }, finish_reason: 'length' }],
        kv_transfer_params: { ...PARAMS, remote_engine_id: 'fake-prefill' } }));
    }
    if (!q.stream) {
      res.setHeader('Content-Type', 'application/json');
      sentAt = performance.now();
      return res.end(JSON.stringify({ id: 'x', object: 'chat.completion', choices: [{ index: 0,
        message: { role: 'assistant', content: 'hello' }, finish_reason: 'stop' }],
        kv_transfer_params: PARAMS }));
    }
    res.writeHead(200, { 'Content-Type': 'text/event-stream' });
    res.write('data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n');
    setTimeout(() => {
      sentAt = performance.now();
      res.write('data: {"id":"c","choices":[{"index":0,"delta":{"content":"hello"}}]}\n\n');
      res.end(`data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],` +
        `"kv_transfer_params":${JSON.stringify(PARAMS)}}\n\ndata: [DONE]\n\n`);
    }, 2);
  });
}

const pct = (a, p) => [...a].sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(p * a.length))];
const fmt = (a) => `p50 ${pct(a, 0.5).toFixed(3)} ms, p99 ${pct(a, 0.99).toFixed(3)} ms`;

async function fakeStream(port) {
  let lat = -1;
  const r = await request(port, '/v1/chat/completions',
    { model: 'm', stream: true, messages: [{ role: 'user', content: 'hi' }] },
    (ev, now) => { if (lat < 0 && ev.includes('"content":"hello"')) lat = now - sentAt; });
  if (r.status !== 200 || lat < 0) throw new Error(`stream: ${r.status} ${r.body}`);
  return lat;
}

async function fakeFull(port) {
  const r = await request(port, '/v1/chat/completions',
    { model: 'm', messages: [{ role: 'user', content: 'hi' }] });
  if (r.status !== 200) throw new Error(r.body);
  return r.end - sentAt;
}

// A conversation's turn (non-streamed, with its id): request start -> the
// whole answer.  50 conversations, so lookups find entries.
async function convTurn(port, i) {
  const t0 = performance.now();
  const r = await request(port, '/v1/chat/completions',
    { model: 'm', messages: [{ role: 'user', content: `hi ${i % 50}` }] }, null,
    { 'X-Conversation-Id': `bench-${i % 50}` });
  if (r.status !== 200) throw new Error(r.body);
  return r.end - t0;
}

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

// redis-server on a free loopback port, nothing saved; null when none is installed.
async function startRedis() {
  if (spawnSync('redis-server', ['--version']).status !== 0) return null;
  const port = await freePort();
  const p = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '',
    '--appendonly', 'no'], { stdio: 'ignore' });
  children.push(p);
  for (let i = 0; i < 200; i++) {
    const ok = await new Promise((resolve) => {
      const c = net.connect(port, '127.0.0.1');
      c.on('connect', () => { c.write('PING\r\n'); });
      c.on('data', (d) => { c.destroy(); resolve(String(d).startsWith('+PONG')); });
      c.on('error', () => resolve(false));
    });
    if (ok) return port;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('redis-server did not answer');
}

// direct, memory and Redis in turn, N each; p50/p99 of each and of the
// pairwise difference to direct.
async function interleaveState(label, fn, direct, mem, red) {
  const d = [], m = [], r = [];
  for (let i = 0; i < 50; i++) { await fn(direct, i); await fn(mem, i); await fn(red, i); }
  for (let i = 0; i < N; i++) {
    d.push(await fn(direct, i)); m.push(await fn(mem, i)); r.push(await fn(red, i));
  }
  const dm = m.map((x, i) => x - d[i]), dr = r.map((x, i) => x - d[i]);
  console.log(`${label}: direct ${fmt(d)}; router, memory state ${fmt(m)}; ` +
    `router, Redis state ${fmt(r)}`);
  console.log(`  router-added (pairwise): memory state ${fmt(dm)}; Redis state ${fmt(dr)}`);
}

// Real node: request start → first content event (streamed), or → end.
async function realTtft(port, model, i) {
  const t0 = performance.now();
  let ttft = -1;
  await request(port, '/v1/chat/completions', { model, stream: true, max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: `Question ${i}: tell me about rivers.` }] },
  (ev, now) => { if (ttft < 0 && /"content":"[^"]/.test(ev)) ttft = now - t0; });
  return ttft;
}

async function realOne(port, model, i) {
  const t0 = performance.now();
  await request(port, '/v1/chat/completions', { model, max_tokens: 1, temperature: 0,
    messages: [{ role: 'user', content: `Say one word (${i}).` }] });
  return performance.now() - t0;
}

async function interleave(label, fn, direct, routed) {
  const d = [], r = [];
  for (let i = 0; i < 20; i++) { await fn(direct, i); await fn(routed, i); } // warm-up
  for (let i = 0; i < N; i++) { d.push(await fn(direct, i)); r.push(await fn(routed, i)); }
  const diff = r.map((x, i) => x - d[i]);
  console.log(`${label}: direct ${fmt(d)}; through the router ${fmt(r)}; ` +
    `added p50 ${(pct(r, 0.5) - pct(d, 0.5)).toFixed(3)} ms, p99 ${(pct(r, 0.99) - pct(d, 0.99)).toFixed(3)} ms ` +
    `(pairwise difference ${fmt(diff)})`);
}

async function routerStages(port) {
  const m = (await request(port, '/metrics')).body;
  const out = [];
  for (const stage of ['before_upstream', 'prefill_to_decode', 'upstream_to_client']) {
    const sel = `duplex_router_added_seconds_%s{stage="${stage}"`;
    const sum = Number((m.match(new RegExp(`${sel.replace('%s', 'sum')}} (\\S+)`)) || [])[1]);
    const count = Number((m.match(new RegExp(`${sel.replace('%s', 'count')}} (\\S+)`)) || [])[1]);
    // p50/p99 bucket bounds from the cumulative buckets
    const re = new RegExp(`${sel.replace('%s', 'bucket')},le="([^"]+)"} (\\d+)`, 'g');
    let p50 = null, p99 = null, b;
    while ((b = re.exec(m))) {
      if (p50 === null && Number(b[2]) >= 0.5 * count) p50 = b[1];
      if (p99 === null && Number(b[2]) >= 0.99 * count) p99 = b[1];
    }
    if (count) out.push(`${stage}: n=${count} mean ${(sum / count * 1e6).toFixed(1)} us, ` +
      `p50 <= ${(Number(p50) * 1e6).toFixed(0)} us, p99 <= ${(Number(p99) * 1e6).toFixed(0)} us`);
  }
  return out.join('; ');
}

try {
  const fake = http.createServer(fakeNode);
  await new Promise((r) => fake.listen(0, '127.0.0.1', r));
  const fakePort = fake.address().port;
  const r1 = await startProc(['router', '--decode', `http://127.0.0.1:${fakePort}`, '--port', '0',
    '--health-interval-ms', '200', '--log-level', 'info']);
  while ((await request(r1, '/health')).status !== 200) await new Promise((r) => setTimeout(r, 50));
  console.log(`fake node on ${fakePort}, router on ${r1}; ${N} requests each way`);
  await interleave('fake node, streamed: its content event -> the client', fakeStream, fakePort, r1);
  await interleave('fake node, non-streamed: its answer -> the client', fakeFull, fakePort, r1);
  console.log(`router histogram (fake node): ${await routerStages(r1)}`);
  // a second fake as the prefill node: every request goes through it first
  const fakeP = http.createServer(fakeNode);
  await new Promise((r) => fakeP.listen(0, '127.0.0.1', r));
  const r3 = await startProc(['router', '--prefill', `http://127.0.0.1:${fakeP.address().port}`,
    '--decode', `http://127.0.0.1:${fakePort}`, '--port', '0', '--local-prefill-max-tokens', '0',
    '--health-interval-ms', '200', '--log-level', 'info']);
  while ((await request(r3, '/health')).status !== 200) await new Promise((r) => setTimeout(r, 50));
  await interleave('fake prefill + decode nodes, streamed: the content event -> the client',
    fakeStream, fakePort, r3);
  console.log(`router histogram (fake P/D): ${await routerStages(r3)}`);
  fakeP.close();

  const nodePort = await startProc(['serve', '--model', modelPath, '--port', '0', '--threads', '1',
    '--kv-cache-mb', '64', '--log-level', 'info']);
  const r2 = await startProc(['router', '--decode', `http://127.0.0.1:${nodePort}`, '--port', '0',
    '--health-interval-ms', '200', '--log-level', 'info']);
  while ((await request(r2, '/health')).status !== 200) await new Promise((r) => setTimeout(r, 50));
  const model = JSON.parse((await request(nodePort, '/v1/models')).body).data[0].id;
  await interleave('real node (tiny model), streamed: request -> first content event',
    (p, i) => realTtft(p, model, i), nodePort, r2);
  await interleave('real node (tiny model), max_tokens=1: request -> answer',
    (p, i) => realOne(p, model, i), nodePort, r2);
  console.log(`router histogram (real node): ${await routerStages(r2)}`);

  const redisPort = await startRedis();
  if (!redisPort) {
    console.log('state in Redis: skipped (no redis-server installed)');
  } else {
    const args = ['router', '--decode', `http://127.0.0.1:${fakePort}`, '--port', '0',
      '--health-interval-ms', '200', '--log-level', 'info'];
    const rm = await startProc(args);
    const rr = await startProc([...args, '--state', `redis://127.0.0.1:${redisPort}`]);
    for (const p of [rm, rr])
      while ((await request(p, '/health')).status !== 200) await new Promise((r) => setTimeout(r, 50));
    console.log(`state: memory router on ${rm}, Redis router on ${rr} (redis-server on ${redisPort})`);
    await interleaveState('fake node, a conversation turn (lookup + write): request -> answer',
      convTurn, fakePort, rm, rr);
    console.log(`router histogram (memory state): ${await routerStages(rm)}`);
    console.log(`router histogram (Redis state): ${await routerStages(rr)}`);
    const errs = (await request(rr, '/metrics')).body.match(/duplex_router_state_errors_total\{op="get"\} (\S+)/);
    console.log(`Redis state errors (get): ${errs ? errs[1] : '?'}`);
  }
  fake.close();
} finally {
  for (const c of children) c.kill('SIGTERM');
  agent.destroy();
}
