#!/usr/bin/env bash
# `make test`: install what is missing, build the release, asan and tsan
# variants (the tests, and `make bench`'s micro-benchmarks so that they
# compile), run every unit test, fuzz-corpus replay and integration test
# (under tsan only the threaded ones; TEST_JOBS of them at a time, default
# one per core, then those marked alone one by one), then print one
# closing line "N passed, N failed" (", N skipped" when a test could not run
# here and said so with cmocka's skip()).  Exits non-zero on any failure.
# Each stage (deps, build, tests) ends with a line giving its time.
#   TEST_VARIANTS="release asan tsan" (default)   TEST_FILTER=substring
# The tsan variant (`make test-tsan` runs it alone) runs only the tests
# whose code runs on several threads; see scripts/lib.sh tsan_*.
set -uo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh
start=$SECONDS
scripts/deps.sh || exit 1
stage_done deps "$start"
JOBS=${JOBS:-$(nproc)}
VARIANTS=${TEST_VARIANTS:-release asan tsan}
FILTER=${TEST_FILTER:-}
mkdir -p "$log_dir"

for v in $VARIANTS; do
    build "$v" tests bench || { echo "build failed ($v)"; exit 1; }
done

# Node packages for tests that drive duplex with real clients (pinned).
if [ -f tests/integration/node/package.json ]; then
    # reinstall when the lock file changed since the last install
    (cd tests/integration/node &&
        { cmp -s package-lock.json node_modules/.duplex-lock 2>/dev/null ||
          { start=$SECONDS; echo "== node packages (npm ci) …";
            npm ci --no-audit --no-fund --silent && cp package-lock.json node_modules/.duplex-lock &&
            stage_done "node packages (npm ci)" "$start"; }; }) ||
        { echo "npm install failed"; exit 1; }
fi

# source checks, once per run
[[ -z "$FILTER" || "lint/errs" == *"$FILTER"* ]] && run_one "lint/errs" scripts/check_errs.sh
[[ -z "$FILTER" || "lint/format" == *"$FILTER"* ]] && run_one "lint/format" scripts/check_format.sh
[[ -z "$FILTER" || "lint/at-rest" == *"$FILTER"* ]] && run_one "lint/at-rest" scripts/check_at_rest.sh
# the layering, from the sources and the first variant's objects
first=${VARIANTS%% *}
[[ -z "$FILTER" || "lint/layers" == *"$FILTER"* ]] &&
    BUILD=build/$first run_one "lint/layers" scripts/check_layers.sh

# wanted VARIANT PATH: whether this run takes the test program PATH.
wanted() {
    [ -x "$2" ] || return 1
    [[ -n "$FILTER" && "$2" != *"$FILTER"* ]] && return 1
    [ "$1" != tsan ] || tsan_wanted "$(basename "$2")"
}

# Every test program of every variant is a job "VARIANT NAME CMD..."; they
# run TEST_JOBS at a time (most tests wait on processes, sockets and timers
# as much as they compute), longest first by the last run's times, then
# the tests marked alone one by one.  Each job prints its block when it
# ends (scripts/test_job.sh) and leaves its tallies for test_summary.
jobs=$log_dir/jobs
rm -rf "$log_dir/tally" "$log_dir/tsan"
mkdir -p "$log_dir/tally"
: >"$jobs.par"
: >"$jobs.alone"
add_job() { # VARIANT NAME CMD...
    local q=par
    has_mark "$(basename "$3")" "$ALONE_MARK" && q=alone
    echo "$*" >>"$jobs.$q"
}
for v in $VARIANTS; do
    for t in build/"$v"/tests/test_*; do
        wanted "$v" "$t" && add_job "$v" "$v/$(basename "$t")" "$t"
    done
    for f in build/"$v"/fuzz/fuzz_*; do
        wanted "$v" "$f" || continue
        n=$(basename "$f")
        add_job "$v" "$v/$n-replay" "$f" "tests/fuzz/corpus/${n#fuzz_}"
    done
    for t in build/"$v"/tests/itest_*; do
        wanted "$v" "$t" && add_job "$v" "$v/$(basename "$t")" "$t"
    done
done
# longest first: the last run's seconds per test (unknown tests first)
times=$log_dir/times
touch "$times"
order() {
    awk 'FILENAME == ARGV[1] { t[$1] = $2; next } { print (($2 in t) ? t[$2] : 100000), $0 }' "$times" "$1" |
        sort -s -rn -k1,1 | cut -d' ' -f2-
}
TEST_JOBS=${TEST_JOBS:-$(nproc)}
start=$SECONDS
echo "== tests ($VARIANTS: $(wc -l <"$jobs.par") programs, $TEST_JOBS at a time)"
order "$jobs.par" | xargs -r -d '\n' -P "$TEST_JOBS" -n 1 scripts/test_job.sh
stage_done "tests ($TEST_JOBS at a time)" "$start"
if [ -s "$jobs.alone" ]; then
    start=$SECONDS
    echo "== tests that run alone ($(wc -l <"$jobs.alone"))"
    xargs -r -d '\n' -n 1 scripts/test_job.sh <"$jobs.alone"
    stage_done "tests that run alone" "$start"
fi
cat "$log_dir"/tally/*.t 2>/dev/null | awk '{ print $1, $2 }' >"$times.new" && mv "$times.new" "$times"

test_summary_tallies "$jobs.par" "$jobs.alone"
