#!/usr/bin/env bash
# Installs the Debian packages duplex needs, only those missing.  Idempotent.
# As root it runs apt-get; otherwise it prints the one command to run.
set -euo pipefail

PKGS=(build-essential pkg-config clang clang-format
      libpcre2-dev libxxhash-dev libjansson-dev libutf8proc-dev libcmocka-dev libexpat1-dev
      libuv1-dev libhttp-parser-dev libcurl4-openssl-dev libucx-dev libsodium-dev
      libhiredis-dev redis-server
      iproute2 nodejs npm curl python3 python3-yaml)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# nodejs/npm may come from outside Debian's packages (the machine image has
# its own Node.js): a working `node` and `npm` on PATH are enough.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
filtered=()
for p in "${missing[@]}"; do [ -n "$p" ] && filtered+=("$p"); done
missing=("${filtered[@]+"${filtered[@]}"}")

if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "deps: missing: ${missing[*]}"
    echo "deps: run: sudo apt-get update && sudo apt-get install -y ${missing[*]}"
    exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
