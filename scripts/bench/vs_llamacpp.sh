#!/usr/bin/env bash
# vs_llamacpp: duplex's engine against llama.cpp's llama-bench on the same
# GGUF files, in one run, side by side.  Timings on a shared machine drift,
# so the two are interleaved (every test runs once per engine per round, the
# order alternating between rounds) and each figure is the median over the
# rounds; the ratio is duplex / llama.cpp of those medians.  A run during
# which other processes kept a CPU waiting (Linux pressure stall information,
# /proc/pressure/cpu: more than MAX_STALL percent of its time) is discarded and
# repeated, so another job on the machine does not land in one column.  duplex's own
# lines add where its time goes (attention GFLOP/s, KV GB/s, the share of the
# decode memory limit reached).  A benchmark: prints figures, asserts nothing.
#
#   scripts/bench/vs_llamacpp.sh LLAMA_BUILD_DIR
#
# LLAMA_BUILD_DIR is a llama.cpp build (bin/llama-bench inside), made from its
# public source outside this repository, e.g.
#   cmake -B build -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF
#   cmake --build build --target llama-bench
# Environment (defaults in brackets):
#   DTYPES   weight types (any of `duplex model synth --dtype`: bf16 f16 q8_0
#            q5_1 q5_0 q4_1 q4_0 iq4_nl), one file each: models/qwen3-0.6b-<t>.gguf, written
#            by `duplex model synth` if missing ["bf16 f16 q8_0"]
#   TOKENIZER  a Hugging Face tokenizer.json (Qwen3's): the files then get the
#            real vocabulary and its 151,936-row tied output head
#            (`--preset qwen3-0.6b --tokenizer`), models/qwen3-0.6b-vocab-<t>.gguf;
#            without it, duplex's own small synthetic vocabulary
#   PRESET   another `duplex model synth` preset instead (e.g. qwen3-30b-a3b, a
#            mixture of experts), models/<preset>[-<N>l][-vocab]-<t>.gguf
#   LAYERS   with PRESET: that many layers (`--layers`), the preset's shape
#   TESTS    prompt/gen@depth, each timed as one duplex run and one llama-bench
#            run per round ["512/128@0 512/32@4096 128/16@16384"]
#   ROUNDS [3]  THREADS [2]  REPS (runs inside each invocation) [1]
#   KV       KV cache type for both [f16]
#   FA       llama.cpp flash attention on|off [off: its faster setting here]
#   MAX_STALL  percent of a run's time others may keep a CPU waiting [2]
#   DUPLEX_BIN [build/release/duplex]
#   IK_BUILD_DIR  an ik_llama.cpp build (bin/llama-bench inside, made as
#            above from its public source): a third engine in the same
#            rounds, the order rotating among the three; its llama-bench has
#            no depth, so it runs the tests at depth 0 only
#   IK_ARGS  ik_llama.cpp's settings ["-fa 1 -rtr 1": flash attention and its
#            run-time repacking of the weights, its fastest on this kind of CPU]
#   IK_MAX_STALL  MAX_STALL for ik_llama.cpp's runs, which stall a CPU 2-3%
#            of their time by themselves on an idle machine [10]
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//; /^set -e/d'; exit 2; }
LLAMA_BENCH=$1/bin/llama-bench
cd "$(dirname "$0")/../.."
BIN=${DUPLEX_BIN:-build/release/duplex}
DTYPES=${DTYPES:-"bf16 f16 q8_0"}
TESTS=${TESTS:-"512/128@0 512/32@4096 128/16@16384"}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
REPS=${REPS:-1}
KV=${KV:-f16}
FA=${FA:-off}
MAX_STALL=${MAX_STALL:-2}
[ -x "$LLAMA_BENCH" ] || { echo "vs_llamacpp: no llama-bench at $LLAMA_BENCH" >&2; exit 1; }
IK_BUILD_DIR=${IK_BUILD_DIR:-}
IK_ARGS=${IK_ARGS:-"-fa 1 -rtr 1"}
IK_MAX_STALL=${IK_MAX_STALL:-10}
IK_BENCH=${IK_BUILD_DIR:+$IK_BUILD_DIR/bin/llama-bench}
[ -z "$IK_BENCH" ] || [ -x "$IK_BENCH" ] ||
    { echo "vs_llamacpp: no llama-bench at $IK_BENCH (IK_BUILD_DIR)" >&2; exit 1; }
[ -x "$BIN" ] || make -s -j"$(nproc)"
dir=$(mktemp -d /tmp/duplex-vs-llamacpp.XXXXXX)
trap '[ -n "${KEEP:-}" ] && echo "vs_llamacpp: logs in $dir" || rm -rf "$dir"' EXIT

TOKENIZER=${TOKENIZER:-}
PRESET=${PRESET:-}
LAYERS=${LAYERS:-}
tag=qwen3-0.6b${TOKENIZER:+-vocab}
[ -z "$PRESET" ] || tag=$PRESET${LAYERS:+-${LAYERS}l}${TOKENIZER:+-vocab}
for t in $DTYPES; do
    f=models/$tag-$t.gguf
    if [ ! -f "$f" ]; then
        mkdir -p models
        if [ -n "$PRESET" ]; then
            "$BIN" model synth --preset "$PRESET" ${LAYERS:+--layers "$LAYERS"} \
                ${TOKENIZER:+--tokenizer "$TOKENIZER"} --dtype "$t" -o "$f" >/dev/null
        elif [ -n "$TOKENIZER" ]; then
            "$BIN" model synth --preset qwen3-0.6b --tokenizer "$TOKENIZER" --dtype "$t" -o "$f" >/dev/null
        else
            "$BIN" model synth --arch qwen3 --preset 0.6b --dtype "$t" -o "$f" >/dev/null
        fi
    fi
done

# Microseconds some task waited for a CPU since boot (0 without PSI).
stall_us() {
    [ -r /proc/pressure/cpu ] || { echo 0; return; }
    sed -n 's/^some .*total=\([0-9]*\)$/\1/p' /proc/pressure/cpu
}

# Runs a command (its stdout into $out) until a run is not disturbed: at most
# STALL_LIMIT (MAX_STALL unless set) percent of its wall time with a task
# waiting for a CPU; 10 tries.
quiet_run() {
    local limit=${STALL_LIMIT:-$MAX_STALL}
    local try s0 s1 t0 t1 pct
    for try in 1 2 3 4 5 6 7 8 9 10; do
        s0=$(stall_us) t0=$(date +%s%N)
        out=$("$@")
        s1=$(stall_us) t1=$(date +%s%N)
        pct=$(( (s1 - s0) * 100000 / ((t1 - t0) / 1000 + 1) ))
        if [ "$pct" -le $((limit * 1000)) ]; then return 0; fi
        echo "  (disturbed: others kept a CPU waiting $((pct / 1000))% of the run; again)" >&2
        sleep 10
    done
    echo "  (still disturbed after 10 tries; keeping the last run)" >&2
}

# One duplex run: appends "dtype test engine metric value" lines to results.
run_duplex() { # dtype P G D test
    local out
    quiet_run "$BIN" bench engine --model "models/$tag-$1.gguf" --threads "$THREADS" \
        --prompt-tokens "$2" --gen-tokens "$3" --depth "$4" --reps "$REPS" --kv-dtype "$KV"
    echo "$out" >>"$dir/duplex.log"
    echo "$out" | awk -v t="$1" -v test="$5" '
        function before(word,   i) { for (i = 2; i <= NF; i++) if ($i ~ word) return $(i - 1) + 0; return -1 }
        function after(word,   i) { for (i = 1; i < NF; i++) if ($i == word) return $(i + 1) + 0; return -1 }
        /^(pp|tg)[0-9]+ @/ { k = substr($1, 1, 2); print t, test, "duplex", k, $4
                             print t, test, "duplex", k "_attn", after("attention")
                             print t, test, "duplex", k "_gflops", before("^GFLOP/s")
                             print t, test, "duplex", k "_gbs", before("^GB/s$") }
        /^decode reads/ { for (i = 1; i <= NF; i++) if ($i ~ /^\([0-9]/) { v = $i; gsub(/[(%]/, "", v)
                          print t, test, "duplex", "tg_limit", v } }' >>"$dir/results"
}

# llama-bench's CSV on stdin as result lines of engine $3.  A quoted field
# may hold a comma (ik_llama.cpp's "ser" is "-1,0"), so a quoted line is
# split on the "," between fields, not on every comma.
bench_csv() { # dtype test engine
    awk -v t="$1" -v test="$2" -v e="$3" '
        function fields(line, f) {
            if (line ~ /^".*"$/) return split(substr(line, 2, length(line) - 2), f, "\",\"")
            return split(line, f, ",") }
        NR == 1 { n = fields($0, h); for (i = 1; i <= n; i++) { gsub(/"/, "", h[i]); col[h[i]] = i }; next }
        { fields($0, f); kind = f[col["n_prompt"]] > 0 ? "pp" : "tg"
          print t, test, e, kind, f[col["avg_ts"]] }' >>"$dir/results"
}

# One llama-bench run (pp and tg tests of the same depth; it keeps the depth's
# state between them).
run_llama() { # dtype P G D test
    local args=(-m "models/$tag-$1.gguf" -t "$THREADS" -d "$4" -r "$REPS" -fa "$FA"
        -ctk "$KV" -ctv "$KV" -o csv)
    local out
    args+=(-p "$2" -n "$3")
    quiet_run "$LLAMA_BENCH" "${args[@]}" 2>>"$dir/llama.err"
    echo "$out" | tee -a "$dir/llama.log" | bench_csv "$1" "$5" llama
}

# One ik_llama.cpp llama-bench run, depth 0 only (its llama-bench has no -d).
run_ik() { # dtype P G D test
    [ -n "$IK_BENCH" ] && [ "$4" -eq 0 ] || return 0
    local out
    # its runs keep a CPU waiting 2-3% of the time by themselves (more
    # runnable threads than -t, with nothing else on the machine), so
    # they are judged disturbed only past IK_MAX_STALL
    # shellcheck disable=SC2086 # IK_ARGS is a list of flags
    STALL_LIMIT=$IK_MAX_STALL quiet_run "$IK_BENCH" -m "models/$tag-$1.gguf" -t "$THREADS" -r "$REPS" $IK_ARGS \
        -ctk "$KV" -ctv "$KV" -o csv -p "$2" -n "$3" 2>>"$dir/ik.err"
    echo "$out" | tee -a "$dir/ik.log" | bench_csv "$1" "$5" ik
}

: >"$dir/results"
echo "vs_llamacpp: $tag $DTYPES; tests $TESTS; $ROUNDS rounds; $THREADS threads; KV $KV;" \
    "llama.cpp flash attention $FA${IK_BENCH:+; ik_llama.cpp $IK_ARGS}"
engines=(run_duplex run_llama)
[ -z "$IK_BENCH" ] || engines+=(run_ik)
for r in $(seq 1 "$ROUNDS"); do
    for t in $DTYPES; do
        for test in $TESTS; do
            pg=${test%@*} d=${test#*@}
            p=${pg%/*} g=${pg#*/}
            # the order rotates: each engine runs first, and after each other, in turn
            n=${#engines[@]}
            for i in $(seq 0 $((n - 1))); do
                "${engines[$(((i + r - 1) % n))]}" "$t" "$p" "$g" "$d" "$test"
            done
            echo "  round $r: $t $test done"
        done
    done
done

# Medians over the rounds, then the table.
awk -v dtypes="$DTYPES" -v tests="$TESTS" -v ik="${IK_BENCH:+1}" '
{ k = $1 SUBSEP $2 SUBSEP $3 SUBSEP $4; n[k]++; v[k, n[k]] = $5 }
function median(k,   i, j, a, c, tmp) {
    c = n[k]; if (!c) return -1
    for (i = 1; i <= c; i++) a[i] = v[k, i]
    for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (a[j] < a[i]) { tmp = a[i]; a[i] = a[j]; a[j] = tmp }
    return c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2 }
function range(k,   i, lo, hi) {
    lo = hi = v[k, 1]; for (i = 2; i <= n[k]; i++) { lo = v[k, i] < lo ? v[k, i] : lo; hi = v[k, i] > hi ? v[k, i] : hi }
    return sprintf("%.1f–%.1f", lo, hi) }
function m(t, test, e, what) { return median(t SUBSEP test SUBSEP e SUBSEP what) }
END {
    nt = split(dtypes, T, " "); ns = split(tests, S, " ")
    printf "\n| weights | test | ratio | duplex tok/s | llama.cpp tok/s | duplex attention | duplex range | llama.cpp range |%s\n",
        ik ? " ik_llama.cpp tok/s | duplex / ik_llama.cpp | ik_llama.cpp range |" : ""
    printf "| --- | --- | --- | --- | --- | --- | --- | --- |%s\n", ik ? " --- | --- | --- |" : ""
    for (i = 1; i <= nt; i++) for (j = 1; j <= ns; j++) {
        split(S[j], pg, "@"); split(pg[1], x, "/")
        for (w = 1; w <= 2; w++) {
            kind = w == 1 ? "pp" : "tg"; cnt = x[w]; if (cnt == 0) continue
            d = m(T[i], S[j], "duplex", kind); l = m(T[i], S[j], "llama", kind)
            if (kind == "pp")
                note = sprintf("%.0f%% of the time, %.0f GFLOP/s", m(T[i], S[j], "duplex", "pp_attn"),
                               m(T[i], S[j], "duplex", "pp_gflops"))
            else if (pg[2] == 0)
                note = sprintf("%.0f%% of the memory limit", m(T[i], S[j], "duplex", "tg_limit"))
            else
                note = sprintf("%.0f%% of the time, %.1f GB/s KV; %.0f%% of the memory limit",
                               m(T[i], S[j], "duplex", "tg_attn"), m(T[i], S[j], "duplex", "tg_gbs"),
                               m(T[i], S[j], "duplex", "tg_limit"))
            extra = ""
            if (ik) {
                q = m(T[i], S[j], "ik", kind)
                extra = q > 0 ? sprintf(" %.1f | %.2f× | %s |", q, d / q, range(T[i] SUBSEP S[j] SUBSEP "ik" SUBSEP kind)) \
                              : " - | - | - |"
            }
            printf "| %s | %s%d @ d%d | %s | %.1f | %.1f | %s | %s | %s |%s\n", toupper(T[i]), kind, cnt, pg[2],
                (l > 0 ? sprintf("%.2f×", d / l) : "-"), d, l, note,
                range(T[i] SUBSEP S[j] SUBSEP "duplex" SUBSEP kind), range(T[i] SUBSEP S[j] SUBSEP "llama" SUBSEP kind), extra
        }
    }
}' "$dir/results"
