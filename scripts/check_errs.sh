#!/usr/bin/env bash
# Every error leaves a message of its own: an error code returned (or an
# out-of-memory code assigned) without dx_errf() would leave the calling
# thread's previous, unrelated message for whoever prints dx_errmsg().
# Fails, listing them, when src/ has a bare `return DX_E…;`, `rc =
# DX_ENOMEM;` or `ok ? 0 : DX_ENOMEM;`.  Write `return dx_errf(DX_E…, "what and where", …);` instead;
# a site that passes on a callee's failure returns the callee's code.
#
# Nor may src/ `return -1;` (or `return (-1);`): no DX code is -1, so a -1
# says neither what failed nor that nothing did.  A failure returns a DX
# code as above; a lookup's "none" returns DX_NONE (base/dx_err.h); a
# third-party callback's "stop" returns a constant named where it is
# defined (HTTP_PARSE_STOP).  Lines that are string literals (the C in the
# tokenizer's training text) are not code.
# Part of `make test`; runs from anywhere.
set -uo pipefail
cd "$(dirname "$0")/.."

fail=0
bare=$(grep -rnE 'return[[:space:]]+DX_E[A-Z]+[[:space:]]*;|([a-z_]+[[:space:]]*=|\?[[:space:]]*0[[:space:]]*:)[[:space:]]*DX_ENOMEM[[:space:]]*;' \
    --include='*.c' --include='*.h' src/)
if [ -n "$bare" ]; then
    echo "error codes without a message (use dx_errf):"
    echo "$bare"
    fail=1
fi

minus=$(grep -rnE '(^|[^[:alnum:]_])return[[:space:]]*(-[[:space:]]*1|\([[:space:]]*-[[:space:]]*1[[:space:]]*\))[[:space:]]*;' \
    --include='*.c' --include='*.h' src/ | grep -vE '^[^:]+:[0-9]+:[[:space:]]*"')
if [ -n "$minus" ]; then
    echo "bare -1 returns: return dx_errf(DX_E…, \"what and where\", …) for a failure (or the callee's code),"
    echo "DX_NONE (base/dx_err.h) for a lookup's 'none', a named constant for a library callback's 'stop':"
    echo "$minus"
    fail=1
fi

[ "$fail" -eq 0 ] || exit 1
echo "every error code in src/ comes with its message; no bare -1 returns"
