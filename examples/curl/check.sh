#!/bin/sh
# Ask a sluice daemon with curl. Usage: check.sh [JSON body]   (default: a login check)
#   SLUICE_SOCKET=/var/run/sluice/sluice.sock sh check.sh        # over the Unix socket
#   SLUICE_URL=http://127.0.0.1:7070 sh check.sh '{"descriptors": {"tenant": "acme", "api_key": "k1"}}'
# SLUICE_SOCKET wins when both are set (`sluice inject` sets both in every app container).
# Prints the JSON answer; exit code 0 allowed, 1 denied (429), 2 limiter unavailable (503),
# 64 rejected request, 69 daemon unreachable.
set -u
body=${1:-'{"policy": "login", "descriptors": {"ip": "203.0.113.7"}}'}
if [ -n "${SLUICE_SOCKET:-}" ]; then
  set -- --unix-socket "$SLUICE_SOCKET" http://sluice/v1/check
else
  set -- "${SLUICE_URL:-http://127.0.0.1:7070}/v1/check"
fi
# -w appends the status on its own line after the body.
if ! reply=$(curl -sS --max-time 1 -H 'Content-Type: application/json' -d "$body" -w '\n%{http_code}' "$@"); then
  echo "sluice unreachable" >&2
  exit 69
fi
status=$(printf '%s\n' "$reply" | tail -n 1)
printf '%s\n' "$reply" | sed '$d'
case "$status" in
  200) exit 0 ;;
  429) exit 1 ;;
  503) exit 2 ;;
  *) exit 64 ;;
esac
