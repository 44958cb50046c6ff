#!/usr/bin/env bash
# `make fuzz`: builds every tests/fuzz/fuzz_*.c (or the targets named as
# arguments, e.g. `scripts/fuzz.sh tests/fuzz/fuzz_kvtp.c`) with clang's
# libFuzzer (+ASan/UBSan) and runs each for FUZZ_SECONDS (default 60) over
# its corpus directory; new crashing inputs land in build/fuzz-artifacts/.
# Add a crash to tests/fuzz/corpus/<name>/ once fixed, so `make test`
# replays it.  FUZZ_MERGE=1 also merges the inputs that reached new code
# into tests/fuzz/corpus/<name>/ (libFuzzer's -merge=1: only those that add
# coverage), to be reviewed and committed.
# The library is compiled once into build/libfuzzer/obj/ (again when a
# source or header changes), then linked with each target.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${FUZZ_SECONDS:-60}
OUT=build/libfuzzer
OBJ=$OUT/obj
mkdir -p "$OBJ" build/fuzz-artifacts
PKGS="libpcre2-8 libxxhash jansson libuv ucx libutf8proc libsodium hiredis"
FLAGS="-std=c11 -D_GNU_SOURCE -O1 -g -Isrc -ffp-contract=off $(pkg-config --cflags $PKGS)"
LIBS="$(pkg-config --libs $PKGS libcurl) -lhttp_parser -lm -pthread"
AVX2="-mavx2 -mfma -mf16c"
AVX512="$AVX2 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni"

# obj SRC: compiles SRC for libFuzzer (coverage without libFuzzer's main)
# unless its object is newer than it and every header.
newest_h=$(find src -name '*.h' -printf '%T@\n' | sort -n | tail -1)
obj() {
    local src=$1 o=$OBJ/$(echo "$1" | tr / _).o isa=
    case $src in
    *_avx2.c) isa=$AVX2 ;;
    *_avx512.c) isa=$AVX512 ;;
    esac
    if [ -f "$o" ] && [ "$o" -nt "$src" ] &&
        [ "$(stat -c %Y "$o")" -ge "${newest_h%.*}" ]; then
        echo "$o"
        return
    fi
    clang $FLAGS $isa -fsanitize=fuzzer-no-link,address,undefined -c "$src" -o "$o"
    echo "$o"
}
export -f obj
export OBJ FLAGS AVX2 AVX512 newest_h
LIBSRC=$(find src -name '*.c' -not -path 'src/cli/*' | sort)
echo "== library ($(echo "$LIBSRC" | wc -l) files)"
OBJS=$(echo "$LIBSRC" | xargs -P "${JOBS:-$(nproc)}" -n 1 bash -c 'obj "$0"' | sort)

for t in ${*:-$(ls tests/fuzz/fuzz_*.c)}; do
    n=$(basename "$t" .c)
    echo "== $n"
    clang $FLAGS -fsanitize=fuzzer,address,undefined "$t" $OBJS -o "$OUT/$n" $LIBS
    corpus=tests/fuzz/corpus/${n#fuzz_}
    work=$(mktemp -d)
    "$OUT/$n" -max_total_time="$SECS" -artifact_prefix=build/fuzz-artifacts/ "$work" "$corpus"
    if [ "${FUZZ_MERGE:-0}" = 1 ]; then
        before=$(ls "$corpus" | wc -l)
        "$OUT/$n" -merge=1 "$corpus" "$work" 2>/dev/null
        echo "== $n: corpus $before -> $(ls "$corpus" | wc -l) inputs"
    fi
    rm -rf "$work"
done
