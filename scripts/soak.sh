#!/usr/bin/env bash
# `make soak`: the soak test on its own, for SOAK_SECONDS (default 600):
# two `duplex up` clusters at once (f16 and --kv-dtype q8_0 KV), each 2
# prefill + 2 decode nodes on the tiny model under 64 concurrent multi-turn
# conversations through the three front doors (chat, Messages, Responses
# chained by previous_response_id), every greedy reply checked against a
# single node of the same KV dtype; no error, no wrong reply, RSS within 10%
# of after warm-up, no block, lease or pin left over.  `make test` runs the
# same test for 60 s.
#   SOAK_SECONDS=N   SOAK_VARIANT=release|asan (default release)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
v=${SOAK_VARIANT:-release}
start=$SECONDS
scripts/deps.sh
stage_done deps "$start"
build "$v" all && build "$v" "build/$v/tests/itest_soak"
export SOAK_SECONDS=${SOAK_SECONDS:-600}
echo "== soak ($v, $SOAK_SECONDS s) …"
start=$SECONDS
DUPLEX_BIN="build/$v/duplex" "build/$v/tests/itest_soak"
stage_done "soak ($v)" "$start"
