#!/usr/bin/env bash
# `make test`: install what is missing, build the release, asan and tsan
# variants (the tests, and `make bench`'s micro-benchmarks so that they
# compile), run every unit test, fuzz-corpus replay and integration test
# (under tsan only the threaded ones), then print one
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

for v in $VARIANTS; do
    echo "== tests ($v)"
    start=$SECONDS
    [ "$v" = tsan ] && tsan_env
    for t in build/"$v"/tests/test_*; do
        wanted "$v" "$t" || continue
        run_one "$v/$(basename "$t")" "$t"
    done
    for f in build/"$v"/fuzz/fuzz_*; do
        wanted "$v" "$f" || continue
        n=$(basename "$f"); corpus=tests/fuzz/corpus/${n#fuzz_}
        run_one "$v/$n-replay" "$f" "$corpus"
    done
    for t in build/"$v"/tests/itest_*; do
        wanted "$v" "$t" || continue
        DUPLEX_BIN="build/$v/duplex" run_one "$v/$(basename "$t")" "$t"
    done
    stage_done "tests ($v)" "$start"
done

test_summary
