#!/usr/bin/env python3
"""Ask a sluice daemon whether a request may go through, with the sluice-ratelimit library.

    python3 check.py --socket /var/run/sluice/sluice.sock -p login -d ip=203.0.113.7
    python3 check.py --url http://127.0.0.1:7070 -d tenant=acme -d api_key=k1 --cost 5

The flags are `sluice check`'s; defaults come from SLUICE_SOCKET / SLUICE_URL (set by `sluice
inject` in every app container). Exit code 0 allowed, 1 denied (429), 2 limiter unavailable (503),
64 bad usage or rejected request (4xx), 69 daemon unreachable.
"""

import json
import os
import sys

try:
    import sluice_ratelimit  # noqa: F401  (installed: pip install sluice-ratelimit)
except ImportError:  # run from a checkout of the repository
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

from sluice_ratelimit import Client, SluiceError  # noqa: E402
from check_flags import Help, UsageError, parse_check_args  # noqa: E402  (beside this file)


def main(argv):
    try:
        options = parse_check_args(argv, prog="check.py", description=__doc__.splitlines()[0])
        # Explicit flags first, then SLUICE_SOCKET, then SLUICE_URL (the client's own defaults).
        client = Client(socket=options.socket, url=options.url)
    except Help as text:
        print(text)
        return 0
    except (UsageError, ValueError) as error:
        print(f"usage error: {error}", file=sys.stderr)
        return 64
    try:
        answer = client.check(options.descriptors, policy=options.policy, cost=options.cost,
                              dry_run=options.dry_run)
    except SluiceError as error:
        # A middleware chooses here per route: fail open (serve the request) or closed (503).
        print(f"sluice unreachable: {error}", file=sys.stderr)
        return 69
    body = answer.body
    if options.json:
        print(json.dumps(body))
    elif answer.status == 200:
        print(f"allowed policy={body.get('policy')} remaining={body.get('remaining')} mode={body.get('mode')}")
    elif answer.status == 429:
        # When to come back: the daemon's own math, also in Retry-After.
        print(f"denied policy={body.get('policy')} retry_after_sec={body.get('retry_after_sec')} "
              f"retry-after-header={answer.headers.get('retry-after')}")
    elif answer.status == 503:
        print(f"unavailable policy={body.get('policy')}")
    else:
        print(f"error {answer.status}: {body.get('error')}: {body.get('reason')}", file=sys.stderr)
    return {200: 0, 429: 1, 503: 2}.get(answer.status, 64)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
