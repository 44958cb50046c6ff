// scripts/bench_netns.sh's report: from each run's results.json, the TTFT
// p50 per turn for each mode with every round's requests pooled (as `duplex
// bench compare` reports), bidi-auto against colocated and against the
// better of bidi-64 and bidi-recompute, and where the router sent the turns.
// Usage: node bench_netns.mjs DIR ROUNDS MODE...
import fs from 'node:fs';

const [dir, roundsArg, ...modes] = process.argv.slice(2);
const rounds = Number(roundsArg);
const p50 = (v) => { const s = [...v].sort((a, b) => a - b); return s.length ? s[Math.floor(s.length / 2)] : NaN; };

const ttft = {}, routed = {};
let turns = 0;
for (const m of modes) {
  ttft[m] = new Map();
  routed[m] = { local: 0, prefill: 0 };
  for (let r = 1; r <= rounds; r++) {
    const d = `${dir}/${m}-${r}`;
    const res = JSON.parse(fs.readFileSync(`${d}/results.json`, 'utf8'));
    for (const x of res.records) {
      if (x.error && x.error !== 'ok') continue;
      if (!ttft[m].has(x.turn)) ttft[m].set(x.turn, []);
      ttft[m].get(x.turn).push(x.ttft_s * 1e3);
      turns = Math.max(turns, x.turn);
    }
    const met = fs.readFileSync(`${d}/router.metrics`, 'utf8');
    for (const via of ['local', 'prefill']) {
      const v = met.match(new RegExp(`duplex_router_routed_total\\{via="${via}"\\} (\\S+)`));
      if (v) routed[m][via] += Number(v[1]);
    }
  }
}
const at = (m, t) => (ttft[m] && ttft[m].has(t) ? p50(ttft[m].get(t)) : NaN);
const best = (t) => Math.min(...['bidi-64', 'bidi-recompute'].map((m) => at(m, t)).filter((x) => x > 0));
const cols = [...modes];
const ratios = [];
if (modes.includes('bidi-auto') && modes.includes('colocated'))
  ratios.push(['bidi-auto / colocated', (t) => at('bidi-auto', t) / at('colocated', t)]);
if (modes.includes('bidi-p-auto') && (modes.includes('bidi-64') || modes.includes('bidi-recompute')))
  ratios.push(['bidi-p-auto / best fixed', (t) => at('bidi-p-auto', t) / best(t)]);
if (modes.includes('bidi-auto') && (modes.includes('bidi-64') || modes.includes('bidi-recompute')))
  ratios.push(['bidi-auto / best fixed', (t) => at('bidi-auto', t) / best(t)]);
console.log(`\n| turn | ${cols.join(' | ')} | ${ratios.map((r) => r[0]).join(' | ')} |`);
console.log(`|---|${cols.map(() => '---|').join('')}${ratios.map(() => '---|').join('')}`);
for (let t = 1; t <= turns; t++)
  console.log(`| ${t} | ${cols.map((m) => at(m, t).toFixed(1)).join(' | ')} | ${ratios.map((r) => r[1](t).toFixed(2)).join(' | ')} |`);
console.log('\nturns routed (all rounds): ' + modes.map((m) => `${m} ${routed[m].local} local / ${routed[m].prefill} via the prefill node`).join('; '));
