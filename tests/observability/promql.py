#!/usr/bin/env python3
"""Helpers for tests/observability/run.sh (Python 3 standard library only).

  promql.py ports N                      print N free loopback TCP ports
  promql.py wait-targets PROM N SECONDS  wait until Prometheus has N healthy targets
  promql.py check PROM DASHBOARD RULES   evaluate every dashboard and alert expression
  promql.py wait-alert PROM NAME LABEL=VALUE SECONDS
                                         wait until alert NAME fires for a series with LABEL=VALUE

`check` runs every PromQL expression of the Grafana dashboard (template variables substituted)
and every alert rule Prometheus loaded from RULES through /api/v1/query, and fails unless each
parses and returns data. Alert conditions (`expr > 0.002`) must parse as written and return data
without their `>`/`<` thresholds; `absent(X)` must have data in X (so that it is not absent
for a wrong selector) and a sidecar down (`up == 0`) must show the daemon killed. Metrics listed in $PENDING_METRICS (comma-separated) may have
no data only while the daemons do not export them at all (registered, never incremented yet).
"""

import json
import math
import os
import re
import socket
import sys
import time
import urllib.parse
import urllib.request

# What Grafana would put in place of its variables. `$policy` and `$job` are multi-value with
# "All" = ".*"; the rate interval is a few scrape intervals (the proof scrapes every second).
SUBSTITUTIONS = [
    ("$__rate_interval", "30s"),
    ("${__rate_interval}", "30s"),
    ("$__interval", "5s"),
    ("${__interval}", "5s"),
    ("$__range", "5m"),
    ("${__range}", "5m"),
    ("${policy}", ".*"),
    ("$policy", ".*"),
    ("${job}", ".*"),
    ("$job", ".*"),
]

METRIC = re.compile(r"\b((?:sluice|process)_[a-zA-Z0-9_]+)\b")
# A threshold: a comparison with a number after a closing bracket or brace.
THRESHOLD = re.compile(r"([)}\]])\s*(?:>=|<=|>|<)\s*(?:bool\s+)?[0-9.]+(?:e[-+]?[0-9]+)?")


def get(prom, path, params=None, timeout=10):
    url = prom.rstrip("/") + path
    if params:
        url += "?" + urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as error:  # 400/422 carry a JSON error body
        return json.load(error)


def substitute(expr):
    for name, value in SUBSTITUTIONS:
        expr = expr.replace(name, value)
    if "$" in expr:
        raise ValueError(f"unsubstituted variable in {expr!r}")
    return expr


def dashboard_queries(dashboard):
    """(where, expr) for every target of every panel (rows included), and the variable queries."""
    found = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        found.append((f"variable ${variable['name']}", query))
    return found


def has_data(result):
    """Whether a query result holds at least one finite sample."""
    kind, value = result["resultType"], result["result"]
    if kind == "scalar":
        return not math.isnan(float(value[1]))
    samples = [s["value"][1] for s in value] if kind == "vector" else [
        v[1] for s in value for v in s["values"]]
    return any(not math.isnan(float(v)) for v in samples)


def describe(data):
    """`N series, e.g. {labels} value` for the log."""
    if data["resultType"] == "scalar":
        return f"scalar {data['result'][1]}"
    series = data["result"]
    first = series[0]
    value = first["value"][1] if "value" in first else first["values"][-1][1]
    labels = ",".join(f"{k}={v}" for k, v in sorted(first["metric"].items())
                      if k not in ("job", "namespace"))
    return f"{len(series)} series, e.g. {{{labels}}} {float(value):.6g}"


def exported(prom, metric):
    """Whether Prometheus scraped any series of `metric` (or of its histogram series)."""
    names = [metric] + [metric + s for s in ("_bucket", "_sum", "_count")]
    for name in names:
        reply = get(prom, "/api/v1/series", {"match[]": name})
        if reply.get("status") == "success" and reply.get("data"):
            return True
    return False


class Checker:
    def __init__(self, prom):
        self.prom = prom
        self.pending = {m for m in os.environ.get("PENDING_METRICS", "").split(",") if m}
        self.failures = []
        self.passed = 0
        self.pending_hits = []

    def fail(self, where, why):
        self.failures.append(f"{where}: {why}")
        print(f"FAIL    {where}: {why}")

    def query(self, expr):
        return get(self.prom, "/api/v1/query", {"query": expr, "time": f"{time.time():.3f}"})

    def expect_data(self, where, expr, data_expr=None):
        """`expr` must parse; `data_expr` (default `expr`) must return finite data."""
        reply = self.query(expr)
        if reply.get("status") != "success":
            self.fail(where, f"does not evaluate: {reply.get('errorType')}: {reply.get('error')}\n        {expr}")
            return
        if data_expr is not None and data_expr != expr:
            reply = self.query(data_expr)
            if reply.get("status") != "success":
                self.fail(where, f"without thresholds does not evaluate: {reply.get('error')}\n        {data_expr}")
                return
        if has_data(reply["data"]):
            self.passed += 1
            print(f"ok      {where}: {describe(reply['data'])}")
            return
        metrics = set(METRIC.findall(expr))
        missing = sorted(m for m in metrics & self.pending if not exported(self.prom, m))
        if missing:
            self.pending_hits.append(where)
            print(f"PENDING {where}: no data; {', '.join(missing)} not exported yet (PENDING_METRICS)")
            return
        self.fail(where, f"returns no data\n        {data_expr or expr}")

    def expect_label_values(self, where, query):
        match = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*", query)
        if not match:
            self.fail(where, f"unsupported variable query {query!r}")
            return
        selector, label = substitute(match.group(1)), match.group(2)
        reply = get(self.prom, f"/api/v1/label/{label}/values", {"match[]": selector})
        if reply.get("status") != "success":
            self.fail(where, f"does not evaluate: {reply.get('error')}")
        elif not reply.get("data"):
            self.fail(where, f"no values for label {label} of {selector}")
        else:
            self.passed += 1
            print(f"ok      {where}: {label} in {reply['data']}")


def check(prom, dashboard_path, rules_path):
    checker = Checker(prom)
    with open(dashboard_path) as f:
        dashboard = json.load(f)
    datasource = [v for v in dashboard["templating"]["list"] if v.get("type") == "datasource"]
    if not datasource or datasource[0].get("query") != "prometheus":
        checker.fail("dashboard", "no Prometheus datasource template variable")
    queries = dashboard_queries(dashboard)
    print(f"--- dashboard {dashboard_path}: {len(queries)} queries")
    for where, expr in queries:
        if expr.lstrip().startswith("label_values("):
            checker.expect_label_values(where, expr)
        else:
            checker.expect_data(where, substitute(expr))

    # The rules as Prometheus loaded them (it must have loaded every rule in the file).
    with open(rules_path) as f:
        in_file = len(re.findall(r"^\s*-\s*alert:", f.read(), re.M))
    reply = get(prom, "/api/v1/rules")
    rules = [r for g in reply["data"]["groups"] for r in g["rules"]]
    print(f"--- alert rules {rules_path}: {len(rules)} loaded by Prometheus, {in_file} in the file")
    if len(rules) != in_file or not rules:
        checker.fail("rules", f"Prometheus loaded {len(rules)} rules, the file has {in_file}")
    for rule in rules:
        where = f"alert {rule['name']}"
        if rule.get("health") not in ("ok", "unknown"):
            checker.fail(where, f"rule health {rule.get('health')}: {rule.get('lastError')}")
        expr = rule["query"]
        absent = re.fullmatch(r"\s*absent\((.*)\)\s*", expr, re.S)
        checker.expect_data(where, expr, absent.group(1) if absent else THRESHOLD.sub(r"\1", expr))
        print(f"        state {rule.get('state')}")

    print(f"--- {checker.passed} passed, {len(checker.pending_hits)} pending, {len(checker.failures)} failed")
    if checker.pending_hits:
        print("pending (no data until the daemon exports these metrics): " + "; ".join(checker.pending_hits))
    return 1 if checker.failures else 0


def free_ports(count):
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def poll(seconds, interval, probe):
    """Calls `probe()` until it returns (True, what) or `seconds` pass; (ok, last `what`)."""
    deadline = time.time() + seconds
    last = None
    while time.time() < deadline:
        try:
            done, last = probe()
            if done:
                return True, last
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(interval)
    return False, last


def wait_targets(prom, count, seconds):
    def probe():
        active = get(prom, "/api/v1/targets", timeout=2)["data"]["activeTargets"]
        seen = [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in active]
        return len(active) == count and all(t["health"] == "up" for t in active), seen

    ok, last = poll(seconds, 0.5, probe)
    print(f"targets up: {[t[0] for t in last]}" if ok else f"targets not up within {seconds}s: {last}")
    return 0 if ok else 1


def wait_alert(prom, name, label, seconds):
    """Until alert `name` is firing for a series whose `label` is `key=value`."""
    key, _, value = label.partition("=")

    def probe():
        alerts = get(prom, "/api/v1/alerts", timeout=2)["data"]["alerts"]
        seen = [(a["labels"].get("alertname"), a["labels"].get(key), a["state"]) for a in alerts]
        return (name, value, "firing") in seen, seen

    ok, last = poll(seconds, 1, probe)
    print(f"    {name} firing for {label}" if ok else f"{name} not firing for {label} within {seconds}s: {last}")
    return 0 if ok else 1


def main(argv):
    if len(argv) == 3 and argv[1] == "ports":
        print(" ".join(str(p) for p in free_ports(int(argv[2]))))
        return 0
    if len(argv) == 5 and argv[1] == "wait-targets":
        return wait_targets(argv[2], int(argv[3]), float(argv[4]))
    if len(argv) == 6 and argv[1] == "wait-alert":
        return wait_alert(argv[2], argv[3], argv[4], float(argv[5]))
    if len(argv) == 5 and argv[1] == "check":
        return check(argv[2], argv[3], argv[4])
    print(__doc__)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
