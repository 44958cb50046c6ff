#!/usr/bin/env bash
# check_at_rest.sh — `make test`'s lint/at-rest: every integration test that
# starts nodes stops them through the harness step that first checks them
# at rest on /metrics (tests/test_proc.h: tp_stop_clean, tp_up_stop,
# tests/integration/pd_test.h: stop_ok — nothing running, no pin, every
# block reference a lease's, leases only where the node's role keeps them),
# so that a new test cannot forget the leak check.  It fails a test source
# (tests/integration/itest_*.c; or the files named as arguments) that
#   - starts `duplex serve` (a "serve" argument, node_start) or `duplex up`
#     (an "up" argument) and never calls one of those helpers, or
#   - sends SIGTERM itself: a graceful stop is the helpers' (SIGKILL and
#     SIGSTOP are a test's own faults; the nodes that survive them are
#     checked when they are stopped).  A line that must send SIGTERM (the
#     signal is what it tests) says why in an `at-rest:` comment on that
#     line or the one before.
# Shell-run examples (itest_readme, itest_demo) start nodes from text the
# lint cannot read; they are the README's and the demo's own.
set -uo pipefail
cd "$(dirname "$0")/.."

files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/integration/itest_*.c)
bad=0
for f in "${files[@]}"; do
    if grep -Eq '"serve"|node_start\(|"up",' "$f" &&
        ! grep -Eq '\b(stop_ok|tp_stop_clean|tp_up_stop|tp_at_rest|tp_rest_check)\(' "$f"; then
        echo "$f: starts nodes but never stops one through stop_ok, tp_stop_clean or" \
            "tp_up_stop, which check it at rest first (or checks it with tp_at_rest)"
        bad=1
    fi
    # SIGTERM outside an `at-rest:` justification (on the line or the one before)
    awk -v f="$f" '
        /(kill|killpg|raise|tp_stop)[ \t]*\(.*SIGTERM/ && $0 !~ /^[ \t]*(\*|\/\*|\/\/)/ && $0 !~ /at-rest:/ && prev !~ /at-rest:/ {
            printf "%s:%d: SIGTERM sent directly: stop nodes with stop_ok, tp_stop_clean or tp_up_stop (they check it at rest first), or say why in an at-rest: comment\n", f, FNR
            bad = 1
        }
        { prev = $0 }
        END { exit bad }' "$f" || bad=1
done
if [ $bad -ne 0 ]; then
    echo "lint/at-rest: see tests/test_proc.h (\"at rest\") and docs/testing.md"
    exit 1
fi
echo "at-rest: ${#files[@]} test sources stop their nodes through the at-rest check"
