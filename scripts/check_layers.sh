#!/usr/bin/env bash
# The tree's layering, checked (docs/architecture.md, "Source tree").
#
#   1. Every folder under src/ is in LAYERS, and every `#include "dir/…"`
#      in src/ names a folder at or below its own: nothing includes upward.
#      A private header (`*_priv.h`: internals shared by the files of one
#      folder) is included only from its own folder; tests/ may include
#      any, src/ elsewhere and scripts/bench/ none.
#   2. The object files of one build (nm) call in the same direction: no
#      file calls a function defined in a folder above its own.
#   3. No files of one folder call each other in a circle (A → B → … → A),
#      except the pairs in ALLOWED, each with its reason.
#
# Calls are read from the object files of a build (BUILD, default
# build/release: `make` first); includes from the sources.  Part of
# `make test`; runs from anywhere.  Exits 1 listing every violation.
set -uo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

# Bottom to top: a folder may include and call only folders before it (and
# itself).  engine/kern (the kernels) sits below the rest of engine.
LAYERS=(base jinja tok gram model engine/kern engine xfer oai http node router up bench cli)

# "A B reason": files A and B of one folder may call each other.  Each is
# one module split across files for a stated reason; keep the list short.
ALLOWED=(
)

BUILD=${BUILD:-build/release}
fail=0

rank() { # folder → its index in LAYERS, or -1
    local i
    for i in "${!LAYERS[@]}"; do
        [ "${LAYERS[$i]}" = "$1" ] && { echo "$i"; return; }
    done
    echo -1
}

# the folder of a path under src/ (src/engine/kern/x.c → engine/kern)
folder() {
    local d=${1#src/}
    echo "${d%/*}"
}

# 1. folders and includes
while IFS= read -r d; do
    d=${d#src/}
    if [ "$(rank "$d")" -lt 0 ]; then
        echo "src/$d: a folder that is not in LAYERS (scripts/check_layers.sh)"
        fail=1
    fi
done < <(find src -mindepth 1 -type d | sort)

while IFS=: read -r file _ inc; do
    tgt=$(sed -E 's/.*#include "(.*)\/[^/]*".*/\1/' <<<"$inc")
    from=$(folder "$file")
    rf=$(rank "$from") rt=$(rank "$tgt")
    if [ "$rt" -lt 0 ]; then
        echo "$file: includes \"$tgt/…\", a folder that is not in LAYERS"
        fail=1
    elif [ "$rt" -gt "$rf" ]; then
        echo "$file: includes upward: $from ($rf) → $tgt ($rt): ${inc#*#include }"
        fail=1
    fi
done < <(grep -rnE '^#include "[a-z_/]+/[a-z_0-9]+\.h"' --include='*.c' --include='*.h' src)

# private headers: "dir/x_priv.h" belongs to dir, a bare "x_priv.h" to the
# includer's own folder
while IFS=: read -r file _ inc; do
    path=$(sed -E 's/.*#include "(.*)".*/\1/' <<<"$inc")
    from=$(folder "$file")
    case $path in
    */*) own=${path%/*} ;;
    *) own=$from ;;
    esac
    if [ "$own" != "$from" ]; then
        echo "$file: includes \"$path\", private to src/$own/ (only its own files and tests/ may)"
        fail=1
    fi
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"([a-z_0-9./]+/)?[a-z_0-9]+_priv\.h"' \
    --include='*.c' --include='*.h' src scripts/bench 2>/dev/null)

# 2 and 3 need the objects
# (not `find | grep -q`: grep leaving early fails the pipe under pipefail)
if [ -z "$(find "$BUILD/obj/src" -name '*.o' -print -quit 2>/dev/null)" ]; then
    echo "no objects under $BUILD/obj/src: build first (make V=${BUILD#build/})"
    exit 1
fi

defs=$(mktemp) refs=$(mktemp) edges=$(mktemp)
trap 'rm -f "$defs" "$refs" "$edges"' EXIT
[ -n "${KEEP:-}" ] && trap - EXIT && echo "$defs $refs $edges"
while IFS= read -r o; do
    f=${o#"$BUILD"/obj/}
    f=${f%.o}
    # a source that no longer exists leaves a stale object: skip it
    [ -f "$f.c" ] || continue
    nm "$o" | awk -v f="$f" '$2 ~ /^[TDBR]$/ {print $3, f >> "'"$defs"'"} $1 == "U" {print $2, f >> "'"$refs"'"}'
done < <(find "$BUILD/obj/src" -name '*.o' | sort)

# caller callee, one line per pair of files
join <(sort -u "$refs") <(sort -u "$defs") | awk '$2 != $3 {print $2, $3}' | sort -u >"$edges"

while read -r a b; do
    fa=$(folder "$a") fb=$(folder "$b")
    if [ "$fa" != "$fb" ] && [ "$(rank "$fb")" -gt "$(rank "$fa")" ]; then
        echo "$a.c calls upward into $b.c ($fa → $fb)"
        fail=1
    fi
done <"$edges"

allowed() {
    local p
    for p in "${ALLOWED[@]}"; do
        read -r x y _ <<<"$p"
        { [ "$x" = "$1" ] && [ "$y" = "$2" ]; } || { [ "$x" = "$2" ] && [ "$y" = "$1" ]; } && return 0
    done
    return 1
}

# tsort names the files of each circle it finds; feed it each folder's
# calls, less the allowed pairs' edges between themselves
for d in "${LAYERS[@]}"; do
    pairs=$(while read -r a b; do
        [ "$(folder "$a")" = "$d" ] && [ "$(folder "$b")" = "$d" ] || continue
        allowed "${a#src/}" "${b#src/}" && continue
        echo "$a $b"
    done <"$edges")
    [ -n "$pairs" ] || continue
    loop=$(tsort <<<"$pairs" 2>&1 >/dev/null | grep -v 'input contains a loop' | sed 's/^tsort: //')
    if [ -n "$loop" ]; then
        echo "src/$d: files that call each other in a circle: $(tr '\n' ' ' <<<"$loop")"
        fail=1
    fi
done

if [ "$fail" -ne 0 ]; then
    echo "layer check failed (the order: ${LAYERS[*]})"
    exit 1
fi
echo "layers hold: ${LAYERS[*]}; no circles of calls inside a folder${ALLOWED:+ but the ${#ALLOWED[@]} listed}"
