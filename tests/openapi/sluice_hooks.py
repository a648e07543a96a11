"""Schemathesis hooks for tests/api/openapi.rs: a check that a refused request spends nothing.

Before each call the store's spending is read (script and DEL calls in Redis' INFO commandstats,
Redis' count of writes, and the daemon's sluice_decisions_total and sluice_reports_total);
after a refusal (a 4xx that is not a rate-limit denial) it must be the same. A report
(POST /v1/report) is never a refusal when it answers 200: one that names a policy must have
written to Redis and counted itself, one with `policy: null` must have spent nothing. Requests run one at a time (--workers 1), so nothing else moves the
figures in between. At the end, the run must have seen both a refusal and a request that did
spend (on the check listener, a report among them), and, when asked, a /v1/top answer with
entries, so the checks are not vacuous. Environment: SLUICE_TEST_ADMIN (host:port of the admin
listener), SLUICE_TEST_REDIS_PORT (the test's redis-server on 127.0.0.1),
SLUICE_TEST_EXPECT_SPENDING and SLUICE_TEST_EXPECT_TOP_ENTRIES ("1" or "0").
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


def redis_info(section):
    """`INFO section` as text (RESP over a raw socket, at most 1 MiB)."""
    name = section.encode()
    with socket.create_connection(("127.0.0.1", REDIS_PORT), timeout=5) as conn:
        conn.sendall(b"*2\r\n$4\r\nINFO\r\n$%d\r\n%s\r\n" % (len(name), name))
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
                raise AssertionError(f"INFO {section} answer over 1 MiB")
    return data.decode()


def redis_calls():
    """Calls of the counter commands, from INFO commandstats."""
    total = 0
    for line in redis_info("commandstats").splitlines():
        name, _, stats = line.partition(":")
        if name.startswith("cmdstat_") and name[len("cmdstat_"):] in SPENDING_COMMANDS:
            total += int(stats.split("calls=")[1].split(",")[0])
    return total


def redis_writes():
    """Keys written since start (INFO persistence's dirty count; the test's Redis never saves)."""
    for line in redis_info("persistence").splitlines():
        name, _, value = line.partition(":")
        if name == "rdb_changes_since_last_save":
            return int(value)
    raise AssertionError("INFO persistence has no rdb_changes_since_last_save")


def counted(metrics):
    """The sums of `metrics` (counters of the daemon) over every label set, but reports counted
    `disabled`: those are the 403 refusals of a policy with `reports: false`, which spend nothing."""
    with urllib.request.urlopen(f"http://{ADMIN}/metrics", timeout=5) as reply:
        text = reply.read(8 << 20).decode()
    sums = dict.fromkeys(metrics, 0.0)
    for line in text.splitlines():
        name = line.partition("{")[0]
        if name in sums and 'outcome="disabled"' not in line:
            sums[name] += float(line.rsplit(" ", 1)[1])
    return sums


def spending():
    return {"redis counter commands": redis_calls(), "redis writes": redis_writes(),
            **counted(("sluice_decisions_total", "sluice_reports_total"))}


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


def json_body(response):
    try:
        return json.loads(response.content or b"null")
    except ValueError:
        return None


def is_report(case):
    return case.method.upper() == "POST" and case.path == "/v1/report"


@schemathesis.check
class nothing_spent_by_a_refusal:
    """A refused request leaves every counter as it was."""

    def __init__(self):
        self.refusals = set()
        self.spenders = set()
        self.reports = set()
        self.top_entries = False

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
        elif is_report(case) and response.status_code == 200:
            self.report_spent(case, response, before, after)
        elif after != before:
            self.spenders.add(case.id)
        if case.path == "/v1/top" and response.status_code == 200:
            body = json_body(response)
            lists = body.get("policies", []) if isinstance(body, dict) else []
            self.top_entries |= any(isinstance(p, dict) and p.get("entries") for p in lists)

    def report_spent(self, case, response, before, after):
        """A 200 report spent on the policies it names, or on none when `policy` is null."""
        body = json_body(response)
        policy = body.get("policy") if isinstance(body, dict) else None
        if policy is None:
            if after != before:
                raise AssertionError(
                    f"POST /v1/report answered policy null (nothing spent) but spending moved: "
                    f"before {before}, after {after}"
                )
            return
        unmoved = [name for name in ("redis writes", "sluice_reports_total")
                   if after[name] == before[name]]
        if unmoved:
            raise AssertionError(
                f"POST /v1/report answered 200 for policy {policy!r} (mode {body.get('mode')!r}) "
                f"but {unmoved} did not move: before {before}, after {after}"
            )
        self.spenders.add(case.id)
        self.reports.add(case.id)

    def after_run(self, ctx):
        if not self.refusals:
            raise AssertionError("no request was refused: the check proved nothing")
        if not self.spenders and os.environ.get("SLUICE_TEST_EXPECT_SPENDING") == "1":
            raise AssertionError("no request spent anything: the spending figures are blind")
        if not self.reports and os.environ.get("SLUICE_TEST_EXPECT_SPENDING") == "1":
            raise AssertionError("no report spent anything: POST /v1/report was not exercised")
        if not self.top_entries and os.environ.get("SLUICE_TEST_EXPECT_TOP_ENTRIES") == "1":
            raise AssertionError(
                "no GET /v1/top answer listed a partition: its entries went unchecked"
            )
