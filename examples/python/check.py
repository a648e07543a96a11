#!/usr/bin/env python3
"""Ask a sluice daemon whether a request may go through: Python, standard library only.

    python3 check.py --socket /var/run/sluice/sluice.sock --policy login -d ip=203.0.113.7
    python3 check.py --url http://127.0.0.1:7070 -d tenant=acme -d api_key=k1 --cost 5

Defaults come from SLUICE_SOCKET / SLUICE_URL (set by `sluice inject` in every app container).
Prints the decision; exit code 0 allowed, 1 denied (429), 2 limiter unavailable (503),
64 rejected request (4xx), 69 daemon unreachable.
"""

import argparse
import http.client
import json
import os
import socket
import sys
from urllib.parse import urlsplit


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket; the host name only fills the Host header."""

    def __init__(self, path, timeout):
        super().__init__("sluice", timeout=timeout)
        self.socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class Sluice:
    """A keep-alive client: create one per thread and reuse it for every check."""

    def __init__(self, socket_path=None, url=None, timeout=0.5):
        if socket_path:
            self.conn = UnixHTTPConnection(socket_path, timeout)
        else:
            parts = urlsplit(url or "http://127.0.0.1:7070")
            self.conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)

    def check(self, descriptors, policy=None, cost=1, dry_run=False):
        """POST /v1/check; returns (status, answer as a dict, response headers)."""
        body = {"descriptors": descriptors, "cost": cost, "dry_run": dry_run}
        if policy:
            body["policy"] = policy
        try:
            self.conn.request("POST", "/v1/check", json.dumps(body), {"Content-Type": "application/json"})
            response = self.conn.getresponse()
        except (ConnectionError, http.client.HTTPException):
            # The daemon closed an idle keep-alive connection: reconnect once.
            self.conn.close()
            self.conn.request("POST", "/v1/check", json.dumps(body), {"Content-Type": "application/json"})
            response = self.conn.getresponse()
        return response.status, json.loads(response.read() or b"{}"), dict(response.getheaders())


class UsageError(Exception):
    """A bad flag or value: exit 64, since 1 and 2 mean denied and unavailable."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_url(text):
    """http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070 -> a URL http.client can use."""
    url = text if "://" in text else "http://" + text
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise UsageError(f"--url {text!r} is not an address such as http://127.0.0.1:7070")
    return url


def main():
    try:
        return run()
    except UsageError as error:
        print(f"usage error: {error}", file=sys.stderr)
        return 64


def run():
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default=os.environ.get("SLUICE_SOCKET"), help="daemon's Unix socket")
    parser.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:7070"), help="daemon's TCP address")
    parser.add_argument("--policy", help="check only this policy")
    parser.add_argument("-d", "--descriptor", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--cost", type=int, default=1)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if any("=" not in pair for pair in args.descriptor):
        raise UsageError("a descriptor is NAME=VALUE")
    descriptors = dict(pair.split("=", 1) for pair in args.descriptor)
    # --url given explicitly wins over a SLUICE_SOCKET from the environment.
    use_socket = args.socket if "--url" not in sys.argv else None
    url = parse_url(args.url) if not use_socket else None
    client = Sluice(socket_path=use_socket, url=url)
    try:
        status, answer, headers = client.check(descriptors, args.policy, args.cost, args.dry_run)
    except OSError as error:
        # An application chooses here: fail open (serve the request) or closed (refuse it).
        print(f"sluice unreachable: {error}", file=sys.stderr)
        return 69
    if status == 200:
        print(f"allowed policy={answer['policy']} remaining={answer['remaining']} mode={answer['mode']}")
        return 0
    if status == 429:
        # Tell the caller when to come back: the daemon's own math, also in Retry-After.
        print(f"denied policy={answer['policy']} retry_after_sec={answer['retry_after_sec']} "
              f"retry-after-header={headers.get('retry-after', headers.get('Retry-After'))}")
        return 1
    if status == 503:
        print(f"unavailable policy={answer.get('policy')}")
        return 2
    print(f"error {status}: {answer.get('error')}: {answer.get('reason')}", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main())
