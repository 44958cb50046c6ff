#!/usr/bin/env bash
# Formatting is the tool's job: every tracked *.c and *.h under src/, tests/
# and scripts/bench/ must come out of clang-format (the repository's
# .clang-format; the tree is formatted with clang-format 14, which
# scripts/deps.sh installs) unchanged — but the files listed in
# scripts/format_exempt.txt, a list that only shrinks.  Fails listing the
# files clang-format would change, with the command that formats one; and
# fails when the list names a file that is formatted now (or no longer
# exists), so that the file leaves the list.
# Part of `make test` (lint/format); runs from anywhere.
set -uo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

CF=${CLANG_FORMAT:-}
if [ -z "$CF" ]; then
    CF=clang-format
    command -v clang-format-14 >/dev/null 2>&1 && CF=clang-format-14
fi
if ! command -v "$CF" >/dev/null 2>&1; then
    echo "$CF not found: scripts/deps.sh installs it (Debian package clang-format)"
    exit 1
fi
version=$("$CF" --version | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1)

EXEMPT=scripts/format_exempt.txt
exempt=$(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$EXEMPT" | grep -v '^$' | sort -u)

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    files=$(git ls-files -- 'src/*.[ch]' 'tests/*.[ch]' 'scripts/bench/*.[ch]' | sort)
else # an unpacked tarball: what is there
    files=$(find src tests scripts/bench -name '*.[ch]' -not -path '*/node_modules/*' | sort)
fi
checked=$(comm -23 <(echo "$files") <(echo "$exempt"))

# one run over them all; its messages start "FILE:LINE:COL: error: ..."
bad=$(xargs -r "$CF" --dry-run -Werror <<<"$checked" 2>&1 >/dev/null |
    grep -oE '^[^:[:space:]]+:[0-9]+:[0-9]+: error' | cut -d: -f1 | sort -u)

# the exempt files that pass now, or are gone
stale=
while IFS= read -r f; do
    [ -n "$f" ] || continue
    if [ ! -f "$f" ] || ! grep -qxF "$f" <<<"$files"; then
        stale+="$f (no such tracked file)"$'\n'
    elif "$CF" --dry-run -Werror "$f" >/dev/null 2>&1; then
        stale+="$f (formatted now)"$'\n'
    fi
done <<<"$exempt"

fail=0
if [ -n "$bad" ]; then
    echo "not formatted ($CF $version, .clang-format):"
    sed 's/^/  /' <<<"$bad"
    echo "format one with: $CF -i FILE   (see what would change: $CF FILE | diff FILE -)"
    [[ "$version" == 14.* ]] ||
        echo "note: the tree is formatted with clang-format 14; $version may format differently"
    fail=1
fi
if [ -n "$stale" ]; then
    echo "$EXEMPT lists files it should not (remove their lines: the list only shrinks):"
    sed -e '/^$/d' -e 's/^/  /' <<<"$stale"
    fail=1
fi
[ "$fail" -eq 0 ] || exit 1
n=$(grep -c . <<<"$checked")
m=$(grep -c . <<<"$exempt")
echo "$n files formatted ($CF $version); $m exempt ($EXEMPT)"
