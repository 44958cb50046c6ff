# scripts/lib.sh — sourced by test.sh, demo.sh and the benchmark scripts:
# timed stages, the build with compact progress, test.sh's per-test runner
# and closing line, and the port of a server started in the background.
# Sourced, not run; needs bash.

# The HTTP port `duplex serve` (started in the background, logging to LOG)
# says it listens on, waiting up to TRIES × 50 ms; when it never does, WHO
# says so with the log on stderr and it returns 1.
serve_port() {
    local log=$1 tries=$2 who=$3 port=
    for _ in $(seq 1 "$tries"); do
        port=$(grep -o 'address=http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$' || true)
        [ -n "$port" ] && { echo "$port"; return 0; }
        sleep 0.05
    done
    echo "$who: could not find the port in the log" >&2
    cat "$log" >&2
    return 1
}

# The model name a server on PORT lists first in /v1/models.
served_model() {
    curl -s "http://127.0.0.1:$1/v1/models" | sed 's/.*"id":"\([^"]*\)".*/\1/'
}

# "== NAME … 41 s", from START (a $SECONDS value).
stage_done() {
    printf '== %s … %d s\n' "$1" $((SECONDS - $2))
}

# tty (progress updated in place) or plain; BUILD_PROGRESS=tty|plain
# overrides what stdout being a terminal says.
progress_mode() {
    if [ -n "${BUILD_PROGRESS:-}" ]; then
        echo "$BUILD_PROGRESS"
    elif [ -t 1 ]; then
        echo tty
    else
        echo plain
    fi
}

# Reads make's output for the stage LABEL: the Makefile's step lines
# ("  CC  src/x.c", "  AR  …", "  LD  …") and anything else (compiler
# messages).  tty mode shows the steps on one status line updated in place;
# plain mode drops them, so a log shows only the stage lines.  Compiler
# messages always pass through whole.
build_progress() {
    local label=$1 mode=$2 line n=0 cols
    cols=$(tput cols 2>/dev/null || echo 80)
    while IFS= read -r line; do
        case $line in
        "  CC  "* | "  AR  "* | "  LD  "*)
            n=$((n + 1))
            if [ "$mode" = tty ]; then
                line="== $label … [$n] ${line#  }"
                printf '\r\033[K%s' "${line:0:cols-1}"
            fi
            ;;
        *)
            if [ "$mode" = tty ]; then printf '\r\033[K'; fi
            printf '%s\n' "$line"
            ;;
        esac
    done
    if [ "$mode" = tty ]; then printf '\r\033[K'; fi
}

# build VARIANT TARGET...: `make TARGET...` for the variant with
# build_progress, then "== build (VARIANT) … 41 s".  Returns make's status.
build() {
    local v=$1 start=$SECONDS rc=0 mode
    shift
    local -
    set -o pipefail
    mode=$(progress_mode)
    if [ "$mode" = tty ]; then printf '== build (%s) …' "$v"; else echo "== build ($v) …"; fi
    make -s -j"${JOBS:-$(nproc)}" V="$v" "$@" 2>&1 | build_progress "build ($v)" "$mode" || rc=$?
    if [ $rc -ne 0 ]; then
        echo "== build ($v) failed after $((SECONDS - start)) s"
        return $rc
    fi
    stage_done "build ($v)" "$start"
}

# test.sh's tallies; run_one adds to them, test_summary prints them.
passed=0 failed=0 skipped=0 failures=()
log_dir=${log_dir:-build/test-logs}

# run_one NAME CMD...: runs one test program with its output in a log;
# counts cmocka's per-test results when it prints them, else counts the
# program as one test.  A skipped test is neither a pass nor a failure.
# Prints the test's cmocka summary lines (or, on failure, the end of its
# log), then its verdict line, so each verdict closes its own block.
run_one() {
    local name=$1
    shift
    local log="$log_dir/${name//\//_}.log"
    local start=$SECONDS
    [ -n "${tsan_dir:-}" ] && rm -f "$tsan_dir"/report.*
    timeout "${TEST_TIMEOUT:-900}" "$@" >"$log" 2>&1
    local rc=$?
    tsan_reports "$log" || rc=66
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
    passed=$((passed + p))
    failed=$((failed + f))
    if [ $rc -ne 0 ]; then
        failures+=("$name")
        # cmocka's failure lines first: a sanitizer's leak report at exit
        # (what a failed assertion's longjmp leaves) can fill the tail
        if grep -qE '^\[ +(ERROR|LINE|FAILED) +\] ' "$log"; then
            echo "    -- cmocka's failures, with the lines before them:"
            grep -B12 -E '^\[ +(ERROR|LINE) +\] ' "$log" | head -n 80 | sed 's/^/    /'
            echo "    -- the end of the log:"
        fi
        tail -n 60 "$log" | sed 's/^/    /'
        echo "FAIL $name (rc=$rc, $((SECONDS - start))s) — the end of $log above"
    else
        grep -E '^\[==========\]|^\[  (PASSED|FAILED)  \]|^\[  SKIPPED \]|^skipped: ' "$log" |
            sed 's/^/    /'
        echo "ok   $name ($p passed$([ "$s" -gt 0 ] && echo ", $s skipped"), $((SECONDS - start))s)"
    fi
}

# The closing lines; CI reads the last one ("N passed, N failed[, N
# skipped]").  Returns non-zero when anything failed.
test_summary() {
    echo
    if [ ${#failures[@]} -gt 0 ]; then
        echo "failed: ${failures[*]}"
    fi
    echo "$passed passed, $failed failed$([ "$skipped" -gt 0 ] && echo ", $skipped skipped")"
    [ "$failed" -eq 0 ] && [ ${#failures[@]} -eq 0 ]
}

# test_summary over the tallies test_job.sh left ($log_dir/tally/*.t:
# "NAME SECONDS PASSED FAILED SKIPPED RC").
# JOBS... are the job lists: a job that left no tally (killed, or its
# runner failed) counts as a failure.
test_summary_tallies() {
    local v name rest sec p f s rc t
    while read -r v name rest; do
        t=$log_dir/tally/${name//\//_}.t
        if [ ! -f "$t" ]; then
            echo "FAIL $name: no result (its runner did not finish)"
            failed=$((failed + 1))
            failures+=("$name")
            continue
        fi
        read -r name sec p f s rc <"$t"
        passed=$((passed + p))
        failed=$((failed + f))
        skipped=$((skipped + s))
        [ "$rc" -eq 0 ] || failures+=("$name")
    done < <(cat "$@")
    test_summary
}

# ThreadSanitizer (the tsan variant, `make test-tsan`).  It runs the tests
# whose code runs on several threads: the engine thread and its thread pool
# (scheduler, forward pass, KV pool), the node's event loop against the
# engine and its work pool, leases and the KV port's server, transfers, the
# router and `duplex up` — the integration tests through build/tsan/duplex,
# so every server process they start is checked too.  Single-threaded
# parsers gain nothing from it and would only cost time.
#
# A test says so in its own source, with this line of its own in the file's
# opening (before the first #include), so that a new threaded test is marked
# where it is written rather than in a list kept here (docs/testing.md).
TSAN_MARK='/* duplex-test: tsan */'
# A test that must not run beside others (fixed ports, fixed network
# namespace names) carries this line the same way; test.sh runs those one
# at a time after the rest, which run TEST_JOBS at a time.
ALONE_MARK='/* duplex-test: alone */'

# test_source NAME: the source the test program NAME was built from (the
# Makefile's rules: test_x ← tests/unit/test_x.c, itest_x ←
# tests/integration/itest_x.c, fuzz_x ← tests/fuzz/fuzz_x.c); nothing for
# another name.  Relative to the repository root.
test_source() {
    case $1 in
    test_*) echo "tests/unit/$1.c" ;;
    itest_*) echo "tests/integration/$1.c" ;;
    fuzz_*) echo "tests/fuzz/$1.c" ;;
    esac
}

# tsan_wanted NAME: whether the source of test program NAME carries
# TSAN_MARK before its first #include.
tsan_wanted() {
    has_mark "$1" "$TSAN_MARK"
}

# has_mark NAME MARK: whether the source of test program NAME carries the
# line MARK before its first #include.
has_mark() {
    local src
    src=$(test_source "$1")
    [ -n "$src" ] && [ -f "$src" ] || return 1
    awk -v m="$2" '/^#include/ {exit} $0 == m {found = 1; exit} END {exit !found}' "$src"
}

# The run-time settings of the tsan variant, for the tests and every
# process they start.  Reports go to files (log_path), one per process, so
# that a race in a server a test started fails that test even when the
# test never looks at the server's exit status.
# tsan_env [SUBDIR]: SUBDIR of the report folder, so that tests running at
# the same time (test_job.sh) each read only their own processes' reports.
tsan_env() {
    tsan_dir=$PWD/$log_dir/tsan${1:+/$1}
    mkdir -p "$tsan_dir"
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 log_path=$tsan_dir/report suppressions=$PWD/tests/tsan.supp"
    # UCX patches mmap/munmap/brk (its memory hooks, by default by
    # rewriting the functions' code) to keep its registration cache true.
    # Under TSAN those hooks crash every process at thread exit, and the
    # `reloc` mode (GOT patching) trips TSAN's allocator in uv_loop_close.
    # duplex registers only memory that UCX allocated itself
    # (ucp_mem_map ALLOCATE), so the cache needs no unmap events here.
    export UCX_MEM_MMAP_HOOK_MODE=none
}

# tsan_reports LOG: 1 (and the reports appended to LOG) when a process of
# the test that just ran wrote a ThreadSanitizer report.
tsan_reports() {
    [ -n "${tsan_dir:-}" ] || return 0
    local f found=0
    for f in "$tsan_dir"/report.*; do
        [ -f "$f" ] || continue
        found=1
        { echo "== ThreadSanitizer report ($f)"; cat "$f"; } >>"$1"
    done
    [ $found -eq 0 ]
}
