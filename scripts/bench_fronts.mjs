// scripts/bench_fronts.sh's report: from each run's results.json (bench run)
// and router.metrics, the TTFT p50 per turn for each front door (the median
// over the rounds), each door against chat, and the router's added latency
// per stage.  Usage: node bench_fronts.mjs DIR ROUNDS
import fs from 'node:fs';

const [dir, roundsArg] = process.argv.slice(2);
const rounds = Number(roundsArg);
const apis = ['chat', 'messages', 'responses'];
const median = (v) => { const s = [...v].sort((a, b) => a - b); const n = s.length;
  return n ? (n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2) : NaN; };

// p50 TTFT (ms) per turn of one run
function perTurn(file) {
  const r = JSON.parse(fs.readFileSync(file, 'utf8'));
  const by = new Map();
  let errors = 0;
  for (const x of r.records) {
    if (x.error && x.error !== 'ok') { errors++; continue; }
    if (!(x.ttft_s >= 0)) continue;
    if (!by.has(x.turn)) by.set(x.turn, []);
    by.get(x.turn).push(x.ttft_s * 1e3);
  }
  const out = new Map();
  for (const [t, v] of by) out.set(t, median(v));
  return { out, errors };
}

// the router's duplex_router_added_seconds: per stage, the p50 bucket's bound and the mean
function added(file) {
  const m = fs.readFileSync(file, 'utf8');
  const res = {};
  for (const stage of ['before_upstream', 'prefill_to_decode', 'upstream_to_client']) {
    const sel = (k) => `duplex_router_added_seconds_${k}{stage="${stage}"`;
    const count = Number((m.match(new RegExp(`${sel('count')}} (\\S+)`)) || [])[1] || 0);
    const sum = Number((m.match(new RegExp(`${sel('sum')}} (\\S+)`)) || [])[1] || 0);
    const re = new RegExp(`${sel('bucket')},le="([^"]+)"} (\\d+)`, 'g');
    let p50 = null, b;
    while ((b = re.exec(m))) if (p50 === null && Number(b[2]) >= 0.5 * count) p50 = Number(b[1]);
    res[stage] = { count, mean_us: count ? sum / count * 1e6 : NaN, p50_us: p50 * 1e6 };
  }
  return res;
}

const ttft = {}, adds = {}, errs = {};
for (const api of apis) {
  ttft[api] = new Map();
  adds[api] = [];
  errs[api] = 0;
  for (let r = 1; r <= rounds; r++) {
    const d = `${dir}/${api}-${r}`;
    const { out, errors } = perTurn(`${d}/results.json`);
    errs[api] += errors;
    for (const [t, v] of out) {
      if (!ttft[api].has(t)) ttft[api].set(t, []);
      ttft[api].get(t).push(v);
    }
    adds[api].push(added(`${d}/router.metrics`));
  }
}
const turns = [...ttft.chat.keys()].sort((a, b) => a - b);
console.log('\nTTFT p50 by turn (ms; median over rounds), and each door / chat:\n');
console.log('| turn | chat | messages | responses | messages/chat | responses/chat |');
console.log('|---|---|---|---|---|---|');
for (const t of turns) {
  const c = median(ttft.chat.get(t) ?? []), m = median(ttft.messages.get(t) ?? []),
    r = median(ttft.responses.get(t) ?? []);
  console.log(`| ${t} | ${c.toFixed(1)} | ${m.toFixed(1)} | ${r.toFixed(1)} | ` +
              `${(m / c).toFixed(3)} | ${(r / c).toFixed(3)} |`);
}
console.log('\nrouter added latency (duplex_router_added_seconds; p50 bucket bound / mean, us; median over rounds):\n');
console.log('| door | before upstream | prefill to decode | upstream to client |');
console.log('|---|---|---|---|');
for (const api of apis) {
  const cells = ['before_upstream', 'prefill_to_decode', 'upstream_to_client'].map((s) => {
    const p = median(adds[api].map((a) => a[s].p50_us)), mean = median(adds[api].map((a) => a[s].mean_us));
    return Number.isFinite(p) ? `<= ${p.toFixed(0)} / ${mean.toFixed(0)}` : '-';
  });
  console.log(`| ${api} | ${cells.join(' | ')} |`);
}
console.log(`\nfailed requests: ${apis.map((a) => `${a} ${errs[a]}`).join(', ')}`);
