"""Schemathesis hooks for tests/api/openapi.rs: a check that a refused request spends nothing.

Before each call the store's spending is read (script and DEL calls in Redis' INFO commandstats,
and the daemon's sluice_decisions_total); after a refusal (a 4xx that is not a rate-limit
denial) it must be the same. Requests run one at a time (--workers 1), so nothing else moves
the figures in between. At the end, the run must have seen both a refusal and a request that
did spend, so the check is not vacuous. Environment: SLUICE_TEST_ADMIN (host:port of the admin
listener), SLUICE_TEST_REDIS_PORT (the test's redis-server on 127.0.0.1).
"""

import json
import os
import socket
import urllib.request

import schemathesis

ADMIN = os.environ["SLUICE_TEST_ADMIN"]
REDIS_PORT = int(os.environ["SLUICE_TEST_REDIS_PORT"])
# Redis commands that read or write counters (sluice's scripts, and resets).
SPENDING_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro", "del", "unlink")


def redis_calls():
    """Calls of the counter commands, from INFO commandstats (RESP over a raw socket)."""
    with socket.create_connection(("127.0.0.1", REDIS_PORT), timeout=5) as conn:
        conn.sendall(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
        data = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
            header, _, rest = data.partition(b"\r\n")
            if header.startswith(b"$") and len(rest) >= int(header[1:]) + 2:
                break
            if len(data) > 1 << 20:
                raise AssertionError("INFO commandstats answer over 1 MiB")
    total = 0
    for line in data.decode().splitlines():
        name, _, stats = line.partition(":")
        if name.startswith("cmdstat_") and name[len("cmdstat_"):] in SPENDING_COMMANDS:
            total += int(stats.split("calls=")[1].split(",")[0])
    return total


def decisions():
    """The sum of sluice_decisions_total over every policy and outcome."""
    with urllib.request.urlopen(f"http://{ADMIN}/metrics", timeout=5) as reply:
        text = reply.read(8 << 20).decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sluice_decisions_total{")
    )


def spending():
    return {"redis counter commands": redis_calls(), "sluice_decisions_total": decisions()}


BEFORE = {}


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    BEFORE[case.id] = spending()


def refused(response):
    if not 400 <= response.status_code < 500 or response.status_code == 429:
        return False
    try:
        body = json.loads(response.content or b"null")
    except ValueError:
        return True
    # /v1/authz may answer a denial with the requested deny status: that is a decision.
    return not (isinstance(body, dict) and body.get("error") == "rate_limit")


@schemathesis.check
class nothing_spent_by_a_refusal:
    """A refused request leaves every counter as it was."""

    def __init__(self):
        self.refusals = set()
        self.spenders = set()

    def after_response(self, ctx, response, case):
        before = BEFORE.get(case.id)
        if before is None:
            return
        after = spending()
        if refused(response):
            self.refusals.add(case.id)
            if after != before:
                raise AssertionError(
                    f"{case.method} {case.path} was refused with {response.status_code} but "
                    f"spending moved: before {before}, after {after}"
                )
        elif after != before:
            self.spenders.add(case.id)

    def after_run(self, ctx):
        if not self.refusals:
            raise AssertionError("no request was refused: the check proved nothing")
        if not self.spenders and os.environ.get("SLUICE_TEST_EXPECT_SPENDING") == "1":
            raise AssertionError("no request spent anything: the spending figures are blind")
