#!/usr/bin/env bash
# test_job.sh "VARIANT NAME CMD...": one test program of `make test`
# (scripts/test.sh starts these, several at a time).  Runs it with run_one
# (its log in build/test-logs/), prints its block in one piece when it ends
# (under a lock, so that blocks of tests ending together do not mix) and
# leaves "NAME SECONDS PASSED FAILED SKIPPED RC" in the tally folder.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
read -r v name cmd <<<"$1"
read -r -a argv <<<"$cmd"
safe=${name//\//_}
[ "$v" = tsan ] && tsan_env "$safe"
[[ $(basename "${argv[0]}") == itest_* ]] && export DUPLEX_BIN=build/$v/duplex
out=$log_dir/tally/$safe.out
start=$SECONDS
run_one "$name" "${argv[@]}" >"$out" 2>&1
rc=0
[ ${#failures[@]} -eq 0 ] || rc=1
echo "$name $((SECONDS - start)) $passed $failed $skipped $rc" >"$log_dir/tally/$safe.t"
{
    flock 9
    cat "$out"
} 9>"$log_dir/tally/.lock"
