#!/usr/bin/env bash
# scripts/bench_netns.sh: `duplex bench compare`'s reuse modes with the KV
# crossing a shaped link between two hosts — network namespaces on this
# machine, as tests/integration/itest_netns.c builds them: the prefill node
# in one, the decode node (or, for `colocated`, the single node) in another,
# joined by a veth pair shaped with tc (RATE, and DELAY each way where the
# kernel has netem; else a token bucket at the rate alone), KV over UCX's
# TCP transport; the router and the client in this namespace, reaching each
# host over a veth of its own.  Every mode is started afresh for each round,
# rounds interleave the modes; prints the TTFT p50 per turn by mode (the
# requests of every round pooled, as bench compare does) with the ratios.
# A benchmark: prints figures, asserts nothing.  Needs root and iproute2.
#   scripts/bench_netns.sh [path/to/duplex] [rounds]   (build/release/duplex, 3)
# Environment: RATE (1gbit), DELAY (2ms), MODEL (models/qwen3-small-bf16.gguf),
# PRESET (quick), THREADS (2 per node), MODES (bidi-auto bidi-p-auto bidi-64
# bidi-recompute colocated).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-build/release/duplex}")
ROUNDS=${2:-3}
RATE=${RATE:-1gbit}
DELAY=${DELAY:-2ms}
MODEL=$(realpath -m "${MODEL:-models/qwen3-small-bf16.gguf}")
PRESET=${PRESET:-quick}
THREADS=${THREADS:-2}
MODES=${MODES:-bidi-auto bidi-p-auto bidi-64 bidi-recompute colocated}
[ "$(id -u)" = 0 ] || { echo "bench_netns: needs root (network namespaces)"; exit 1; }
[ -f "$MODEL" ] || "$BIN" model synth --preset small --dtype bf16 --seed 1 -o "$MODEL" >/dev/null
dir=$(mktemp -d /tmp/duplex-bench-netns.XXXXXX)
nsp=dxbp$$ nsd=dxbd$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$nsp" 2>/dev/null || true
    ip netns del "$nsd" 2>/dev/null || true
    [ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT

# the hosts: P (10.253.0.1 on the KV link, 10.253.0.6 towards the router),
# D (10.253.0.2, 10.253.0.10); this namespace 10.253.0.5 and .9
ip netns add "$nsp"
ip netns add "$nsd"
for ns in "$nsp" "$nsd"; do ip -n "$ns" link set lo up; done
ip link add dxbkv netns "$nsp" type veth peer name dxbkv netns "$nsd"
ip -n "$nsp" addr add 10.253.0.1/30 dev dxbkv
ip -n "$nsd" addr add 10.253.0.2/30 dev dxbkv
ip link add dxbtp type veth peer name dxbh netns "$nsp"
ip link add dxbtd type veth peer name dxbh netns "$nsd"
ip addr add 10.253.0.5/30 dev dxbtp
ip addr add 10.253.0.9/30 dev dxbtd
ip -n "$nsp" addr add 10.253.0.6/30 dev dxbh
ip -n "$nsd" addr add 10.253.0.10/30 dev dxbh
for ns in "$nsp" "$nsd"; do ip -n "$ns" link set dxbkv up; ip -n "$ns" link set dxbh up; done
ip link set dxbtp up
ip link set dxbtd up
shaping="$RATE + $DELAY each way (netem)"
for ns in "$nsp" "$nsd"; do
    if ! ip netns exec "$ns" tc qdisc add dev dxbkv root netem delay "$DELAY" rate "$RATE" 2>/dev/null; then
        ip netns exec "$ns" tc qdisc add dev dxbkv root tbf rate "$RATE" burst 1mb latency 200ms
        shaping="$RATE (tbf; this kernel has no netem: no added delay)"
    fi
done
sleep 1 # the veths' carrier comes up asynchronously
openssl rand -hex 32 >"$dir/kv.secret"
openssl rand -hex 32 >"$dir/internal.key"
chmod 600 "$dir/kv.secret" "$dir/internal.key"
export UCX_NET_DEVICES=dxbkv # UCX offers peers the KV link's address only

# start_node NS ROLE HTTP_ADDR KV_ADDR PEER_KV LOG FLAGS...: starts a node,
# prints its port; its pid goes to LOG.pid (the caller runs this in a
# command substitution, a subshell: pids+= there would be lost)
start_node() {
    local ns=$1 role=$2 http=$3 kv=$4 peer=$5 log=$6
    shift 6
    ip netns exec "$ns" "$BIN" serve --model "$MODEL" --role "$role" --host "$http" --port 0 \
        --kv-host "$kv" --kv-port 0 --kv-peers "$peer" --kv-secret-file "$dir/kv.secret" \
        --kv-transport-tls tcp --internal-key-file "$dir/internal.key" --insecure-no-auth \
        --threads "$THREADS" "$@" >"$log" 2>&1 &
    echo $! >"$log.pid"
    local port=
    for _ in $(seq 1 600); do
        port=$(grep -o "address=http://$http:[0-9]*" "$log" | grep -o '[0-9]*$' || true)
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "a $role node did not start:"; tail "$log"; exit 1; }
    for _ in $(seq 1 600); do grep -q 'faulted in' "$log" && break; sleep 0.1; done
    echo "$port"
}

run_mode() { # MODE OUT
    local mode=$1 out=$2 pf=() df=() rf=() p d r
    mkdir -p "$out"
    case $mode in
    bidi-auto) ;;
    bidi-p-auto) rf=(--local-prefill-max-tokens 0) ;;
    bidi-64) rf=(--local-prefill-max-tokens 0); pf=(--kv-recompute-threshold 64); df=("${pf[@]}") ;;
    bidi-recompute) rf=(--local-prefill-max-tokens 0); pf=(--kv-recompute-threshold 16777216) ;;
    colocated) ;;
    *) echo "unknown mode $mode"; exit 1 ;;
    esac
    pids=()
    if [ "$mode" = colocated ]; then
        d=$(start_node "$nsd" both 10.253.0.10 10.253.0.2 10.253.0.1 "$out/d.log")
        pids+=("$(cat "$out/d.log.pid")")
        rargs=(--decode "http://10.253.0.10:$d")
    else
        p=$(start_node "$nsp" prefill 10.253.0.6 10.253.0.1 10.253.0.2 "$out/p.log" --bidirectional-kv-xfer "${pf[@]}")
        pids+=("$(cat "$out/p.log.pid")")
        d=$(start_node "$nsd" decode 10.253.0.10 10.253.0.2 10.253.0.1 "$out/d.log" --bidirectional-kv-xfer "${df[@]}")
        pids+=("$(cat "$out/d.log.pid")")
        rargs=(--prefill "http://10.253.0.6:$p" --decode "http://10.253.0.10:$d")
    fi
    "$BIN" router "${rargs[@]}" --port 0 --tokenizer "$MODEL" --internal-key-file "$dir/internal.key" \
        "${rf[@]}" >"$out/router.log" 2>&1 &
    pids+=($!)
    r=
    for _ in $(seq 1 600); do
        r=$(grep -o 'address=http://127.0.0.1:[0-9]*' "$out/router.log" | grep -o '[0-9]*$' || true)
        [ -n "$r" ] && curl -sf "http://127.0.0.1:$r/health" >/dev/null && break
        sleep 0.1
    done
    "$BIN" bench run --url "http://127.0.0.1:$r" --preset "$PRESET" --tokenizer "$MODEL" \
        --no-progress --out "$out" >"$out/bench.log" 2>&1 ||
        { echo "bench run ($mode) failed:"; tail -20 "$out/bench.log"; exit 1; }
    curl -s "http://127.0.0.1:$r/metrics" >"$out/router.metrics"
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    pids=()
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "KV link: $shaping; model $MODEL; preset $PRESET; $ROUNDS interleaved rounds; modes $MODES"
for round in $(seq 1 "$ROUNDS"); do
    for mode in $MODES; do run_mode "$mode" "$dir/$mode-$round"; done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
node scripts/bench_netns.mjs "$dir" "$ROUNDS" $MODES
