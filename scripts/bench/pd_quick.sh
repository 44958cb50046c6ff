#!/usr/bin/env bash
# pd_quick: the quick P/D benchmark.  One 8-turn conversation (about 3,000
# tokens of history by the last turn) on the small preset, timed per turn by
# `duplex bench chat`, in four setups started afresh for every run:
#
#   single   one `duplex serve` node (prefix caching on)
#   uni      duplex up --mode unidirectional: every turn via the prefill node,
#            prefix caching off there (the P/D baseline: history recomputed)
#   bidi     duplex up --mode bidirectional, every turn via the prefill node,
#            prefix caching off there: the history is pulled from the decode
#            node that kept it
#   bidi-rt  duplex up --mode bidirectional with the router's default
#            (--local-prefill-max-tokens 256: small new parts go straight to
#            the decode node that holds the history)
#
# Runs are interleaved (every setup once per round) and each turn's figure is
# the median over the rounds.  A benchmark: prints figures, asserts nothing.
#   scripts/bench/pd_quick.sh            ROUNDS=3 DUPLEX_BIN=build/release/duplex
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${DUPLEX_BIN:-build/release/duplex}
MODEL=${DUPLEX_MODEL:-models/qwen3-small-bf16.gguf}
ROUNDS=${ROUNDS:-3}
TURNS=${TURNS:-8}
SETUPS=${SETUPS:-"single uni bidi bidi-rt"}
CHAT=(--turns "$TURNS" --prefix-words 600 --input-words 80 --output-tokens 128 --seed 7 --json)
THREADS=$(nproc)
[ -x "$BIN" ] || make -s -j"$THREADS"
if [ ! -f "$MODEL" ]; then
    mkdir -p "$(dirname "$MODEL")"
    "$BIN" model synth --arch qwen3 --preset small --dtype bf16 --seed 1 -o "$MODEL" >/dev/null
fi
dir=$(mktemp -d /tmp/duplex-pd-quick.XXXXXX)
pid=""
cleanup() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    [ -n "${KEEP:-}" ] && echo "pd_quick: logs in $dir" || rm -rf "$dir"
}
trap cleanup EXIT

# Starts a setup in the background; sets pid and url.
start() {
    local log=$dir/$1.log
    case $1 in
    single) "$BIN" serve --model "$MODEL" --port 0 --threads "$THREADS" >"$log" 2>&1 & ;;
    uni) "$BIN" up --mode unidirectional --model "$MODEL" --port 0 --threads-per-node "$THREADS" \
        --prefill-no-prefix-caching --local-prefill-max-tokens 0 >"$log" 2>&1 & ;;
    bidi) "$BIN" up --mode bidirectional --model "$MODEL" --port 0 --threads-per-node "$THREADS" \
        --prefill-no-prefix-caching --local-prefill-max-tokens 0 >"$log" 2>&1 & ;;
    bidi-rt) "$BIN" up --mode bidirectional --model "$MODEL" --port 0 \
        --threads-per-node "$THREADS" >"$log" 2>&1 & ;;
    esac
    pid=$!
    url=""
    # duplex up relays its children's lines: only its own "ready:" line names the router
    local pat='ready: http://127.0.0.1:[0-9]+'
    [ "$1" = single ] && pat='address=http://127.0.0.1:[0-9]+'
    for _ in $(seq 1 600); do
        url=$(grep -o -m1 -E "$pat" "$log" | sed 's/^[a-z]*[:=] *//' || true)
        if [ -n "$url" ] && curl -sf "$url/health" >/dev/null; then return 0; fi
        sleep 0.1
    done
    cat "$log"
    echo "pd_quick: $1 did not start" >&2
    exit 1
}

stop() {
    kill -TERM "$pid" && wait "$pid" 2>/dev/null || true
    pid=""
}

echo "pd_quick: $MODEL, $TURNS turns, $ROUNDS rounds, setups: $SETUPS"
for r in $(seq 1 "$ROUNDS"); do
    for s in $SETUPS; do
        start "$s"
        "$BIN" bench chat --url "$url" "${CHAT[@]}" | sed "s/^/{\"setup\":\"$s\",\"round\":$r,/; s/,{/,/" \
            >>"$dir/runs.jsonl"
        stop
        echo "  round $r: $s done"
    done
done

# Median TTFT per setup and turn, the ratios the issue asks about, and the
# prompt sizes (single node's usage).
awk -v setups="$SETUPS" -v turns="$TURNS" '
function num(key,   m) { m = $0; sub(".*\"" key "\":", "", m); sub("[,}].*", "", m); return m + 0 }
function str(key,   m) { m = $0; sub(".*\"" key "\":\"", "", m); sub("\".*", "", m); return m }
{ s = str("setup"); t = num("turn"); k = s SUBSEP t; n[k]++; v[k, n[k]] = num("ttft_ms")
  if (s == "single") prompt[t] = num("prompt_tokens") }
function median(k,   i, j, a, c, tmp) {
    c = n[k]; for (i = 1; i <= c; i++) a[i] = v[k, i]
    for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (a[j] < a[i]) { tmp = a[i]; a[i] = a[j]; a[j] = tmp }
    return c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2 }
END {
    ns = split(setups, S, " ")
    printf "\n| turn | prompt tokens |"; for (i = 1; i <= ns; i++) printf " %s TTFT ms |", S[i]
    printf " bidi / single | uni / bidi |\n|---|---|"; for (i = 1; i <= ns; i++) printf "---|"; printf "---|---|\n"
    for (t = 1; t <= turns; t++) {
        printf "| %d | %d |", t, prompt[t]
        for (i = 1; i <= ns; i++) { m[S[i]] = median(S[i] SUBSEP t); printf " %.1f |", m[S[i]] }
        printf " %s | %s |\n", (m["single"] > 0 && m["bidi"] > 0) ? sprintf("%.2f", m["bidi"] / m["single"]) : "-",
            (m["bidi"] > 0 && m["uni"] > 0) ? sprintf("%.1f", m["uni"] / m["bidi"]) : "-"
    }
}' "$dir/runs.jsonl"
