#!/usr/bin/env bash
# `make test`: install what is missing, build release and asan variants, run
# every unit test, fuzz-corpus replay and integration test, then print one
# closing line "N passed, N failed" (", N skipped" when a test could not run
# here and said so with cmocka's skip()).  Exits non-zero on any failure.
#   TEST_VARIANTS="release asan" (default)   TEST_FILTER=substring
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh || exit 1
JOBS=${JOBS:-$(nproc)}
VARIANTS=${TEST_VARIANTS:-release asan}
FILTER=${TEST_FILTER:-}
passed=0 failed=0 skipped=0 failures=()
log_dir=build/test-logs
mkdir -p "$log_dir"

for v in $VARIANTS; do
    echo "== build ($v)"
    make -s -j"$JOBS" V="$v" tests || { echo "build failed ($v)"; exit 1; }
done

# Node packages for tests that drive duplex with real clients (pinned).
if [ -f tests/integration/node/package.json ]; then
    # reinstall when the lock file changed since the last install
    (cd tests/integration/node &&
        { cmp -s package-lock.json node_modules/.duplex-lock 2>/dev/null ||
          { npm ci --no-audit --no-fund --silent && cp package-lock.json node_modules/.duplex-lock; }; }) ||
        { echo "npm install failed"; exit 1; }
fi

# Runs one test program; counts cmocka's per-test results when it prints
# them, else counts the program as one test.  A skipped test is neither a
# pass nor a failure.
run_one() {
    local name=$1; shift
    local log="$log_dir/${name//\//_}.log"
    local start=$SECONDS
    timeout "${TEST_TIMEOUT:-900}" "$@" >"$log" 2>&1
    local rc=$?
    local p f s
    p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$4} END {print s+0}')
    f=$(grep -Eo '^\[  FAILED  \] [0-9]+' "$log" | awk '{s+=$4} END {print s+0}')
    s=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$log" | awk '{s+=$4} END {print s+0}')
    skipped=$((skipped + s))
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ]; then
        if [ $rc -eq 0 ]; then p=1; else f=1; fi
    elif [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1 # crashed after reporting passes
    fi
    passed=$((passed + p)); failed=$((failed + f))
    if [ $rc -ne 0 ]; then
        failures+=("$name")
        echo "FAIL $name (rc=$rc, $((SECONDS - start))s) — log follows"
        tail -n 60 "$log" | sed 's/^/    /'
    else
        echo "ok   $name ($p passed$([ "$s" -gt 0 ] && echo ", $s skipped"), $((SECONDS - start))s)"
    fi
    grep -E '^\[==========\]|^\[  (PASSED|FAILED)  \]|^\[  SKIPPED \]|^skipped: ' "$log" | sed 's/^/    /'
}

for v in $VARIANTS; do
    for t in build/"$v"/tests/test_*; do
        [ -x "$t" ] || continue
        [[ -n "$FILTER" && "$t" != *"$FILTER"* ]] && continue
        run_one "$v/$(basename "$t")" "$t"
    done
    for f in build/"$v"/fuzz/fuzz_*; do
        [ -x "$f" ] || continue
        [[ -n "$FILTER" && "$f" != *"$FILTER"* ]] && continue
        n=$(basename "$f"); corpus=tests/fuzz/corpus/${n#fuzz_}
        run_one "$v/$n-replay" "$f" "$corpus"
    done
    for t in build/"$v"/tests/itest_*; do
        [ -x "$t" ] || continue
        [[ -n "$FILTER" && "$t" != *"$FILTER"* ]] && continue
        DUPLEX_BIN="build/$v/duplex" run_one "$v/$(basename "$t")" "$t"
    done
done

echo
if [ ${#failures[@]} -gt 0 ]; then
    echo "failed: ${failures[*]}"
fi
echo "$passed passed, $failed failed$([ "$skipped" -gt 0 ] && echo ", $skipped skipped")"
[ "$failed" -eq 0 ] && [ ${#failures[@]} -eq 0 ]
