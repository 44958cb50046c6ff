#!/usr/bin/env bash
# Every error leaves a message of its own: an error code returned (or an
# out-of-memory code assigned) without dx_errf() would leave the calling
# thread's previous, unrelated message for whoever prints dx_errmsg().
# Fails, listing them, when src/ has a bare `return DX_E…;`, `rc =
# DX_ENOMEM;` or `ok ? 0 : DX_ENOMEM;`.  Write `return dx_errf(DX_E…, "what and where", …);` instead;
# a site that passes on a callee's failure returns the callee's code.
# Part of `make test`; runs from anywhere.
set -uo pipefail
cd "$(dirname "$0")/.."
bare=$(grep -rnE 'return[[:space:]]+DX_E[A-Z]+[[:space:]]*;|([a-z_]+[[:space:]]*=|\?[[:space:]]*0[[:space:]]*:)[[:space:]]*DX_ENOMEM[[:space:]]*;' \
    --include='*.c' --include='*.h' src/)
if [ -n "$bare" ]; then
    echo "error codes without a message (use dx_errf):"
    echo "$bare"
    exit 1
fi
echo "every error code in src/ comes with its message"
