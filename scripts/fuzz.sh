#!/usr/bin/env bash
# `make fuzz`: builds every tests/fuzz/fuzz_*.c with clang's libFuzzer
# (+ASan/UBSan) and runs each for FUZZ_SECONDS (default 60) over its corpus
# directory; new crashing inputs land in build/fuzz-artifacts/.  Add a crash
# to tests/fuzz/corpus/<name>/ once fixed, so `make test` replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${FUZZ_SECONDS:-60}
OUT=build/libfuzzer
mkdir -p "$OUT" build/fuzz-artifacts
FLAGS="-std=c11 -D_GNU_SOURCE -O1 -g -Isrc -fsanitize=fuzzer,address,undefined $(pkg-config --cflags libpcre2-8 libxxhash jansson libuv ucx libutf8proc libsodium)"
LIBS="$(pkg-config --libs libpcre2-8 libxxhash jansson libuv libcurl ucx libutf8proc libsodium) -lhttp_parser -lm -pthread"
LIBSRC=$(find src/base src/model src/engine src/xfer src/node src/router src/bench -name '*.c' 2>/dev/null |
    grep -v -E '_avx(2|512)\.c$' | sort)
for t in ${1:-$(ls tests/fuzz/fuzz_*.c)}; do
    n=$(basename "$t" .c)
    echo "== $n"
    clang $FLAGS -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 \
        -mavx512vnni $LIBSRC src/engine/*_avx2.c src/engine/*_avx512.c "$t" -o "$OUT/$n" $LIBS
    corpus=tests/fuzz/corpus/${n#fuzz_}
    work=$(mktemp -d)
    "$OUT/$n" -max_total_time="$SECS" -artifact_prefix=build/fuzz-artifacts/ "$work" "$corpus"
    rm -rf "$work"
done
