#!/usr/bin/env python3
"""Instructions per check under callgrind: `sluice serve` (embedded store, one worker thread)
run under valgrind, asked N checks after a warm-up over one keep-alive connection (HTTP over TCP,
HTTP over the Unix socket) or one gRPC channel (`ShouldRateLimit`, grpcio); counters zeroed after
the warm-up and dumped after the N, so the figure is the daemon's instructions (all threads) for
the N checks, divided by N.

    python3 crates/bench/callgrind/instructions.py target/release/sluice [--runs 2] [--only tcp,uds,grpc,floor]
    [--keep DIR]   # keep the callgrind dumps (for callgrind_annotate --inclusive=yes)
    [--redis]      # the daemon on a redis-server of its own (free port, temp dir) instead

`floor` is the no-op HTTP floor of `sluice bench` (`sluice bench-naive-sidecar --noop`: an axum
server that reads the check body and answers a fixed decision), asked the same way as `tcp`.

Needs valgrind and, for gRPC, grpcio. Deterministic to about 0.1%: judge a change by it.
"""
import argparse
import glob
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

POLICIES = """policies:
  - {name: tb, key: [k], algorithm: token_bucket, limit: 1000000000, period: 1s, burst: 1000000000, failure_mode: closed}
  - {name: grpc_tb, key: [gtb], algorithm: token_bucket, limit: 1000000000, period: 1s, burst: 1000000000, failure_mode: closed}
"""
BODY = b'{"policy":"tb","descriptors":{"k":"hot"}}'


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grpc_request():
    """RateLimitRequest{domain: "bench", descriptors: [{entries: [{key: "gtb", value: "hot"}]}]}."""
    def field(number, payload):
        return bytes([(number << 3) | 2, len(payload)]) + payload
    entry = field(1, b"gtb") + field(2, b"hot")
    descriptor = field(1, entry)
    return field(1, b"bench") + field(2, descriptor)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(self.path)


def http_caller(conn):
    def call():
        conn.request("POST", "/v1/check", BODY, {"content-type": "application/json"})
        answer = conn.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"unexpected answer {answer.status} {body!r}")
    return call


def grpc_caller(port):
    import grpc
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    method = channel.unary_unary(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        request_serializer=None, response_deserializer=None)
    request = grpc_request()

    def call():
        answer = method(request, timeout=60)
        if not answer.startswith(b"\x08\x01"):  # overall_code: OK
            raise RuntimeError(f"unexpected answer {answer!r}")
    return call


def wait_for(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    sys.exit(f"timed out waiting for {what}")


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def measure(binary, transport, warmup, checks, keep, redis):
    tmp = tempfile.mkdtemp(prefix="sluice-cg-")
    server = None
    try:
        http_port, admin_port, grpc_port = free_port(), free_port(), free_port()
        sock = os.path.join(tmp, "s", "sluice.sock")
        with open(os.path.join(tmp, "policies.yaml"), "w") as f:
            f.write(POLICIES)
        if redis:
            redis_port = free_port()
            server = subprocess.Popen(
                ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", tmp],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(lambda: listening(redis_port), 30, "redis-server")
        with open(os.path.join(tmp, "sluice.toml"), "w") as f:
            f.write(f"""policies = "{tmp}/policies.yaml"
worker_threads = 1
policies_poll = "1h"
[listen]
http = "127.0.0.1:{http_port}"
socket = "{sock}"
admin = "127.0.0.1:{admin_port}"
grpc = "127.0.0.1:{grpc_port}"
""")
            if redis:
                # Valgrind runs the daemon ~50x slower: a deadline it would otherwise miss.
                f.write(f'[redis]\nurl = "redis://127.0.0.1:{redis_port}"\ntimeout = "5s"\n')
        out = os.path.join(tmp, "callgrind.out")
        log = open(os.path.join(tmp, "daemon.log"), "w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env["RUST_LOG"] = "warn"
        if transport == "floor":
            command = [binary, "bench-naive-sidecar", "--redis", "redis://unused", "--listen",
                       f"127.0.0.1:{http_port}", "--threads", "1", "--noop"]
            up = lambda: listening(http_port)
        else:
            command = [binary, "serve", "--config", os.path.join(tmp, "sluice.toml")]
            up = lambda: listening(http_port) and listening(grpc_port) and os.path.exists(sock)
        daemon = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"] + command,
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
        try:
            wait_for(up, 120, "the daemon")
            if transport in ("tcp", "floor"):
                call = http_caller(http.client.HTTPConnection("127.0.0.1", http_port, timeout=60))
            elif transport == "uds":
                call = http_caller(UnixHTTPConnection(sock))
            else:
                call = grpc_caller(grpc_port)
            # Until a first allowed answer (Redis connects in the background), at most a minute.
            deadline = time.monotonic() + 60
            while True:
                try:
                    call()
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            for _ in range(warmup):
                call()
            subprocess.run(["callgrind_control", "-z", str(daemon.pid)], check=True,
                           stdout=subprocess.DEVNULL)
            for _ in range(checks):
                call()
            subprocess.run(["callgrind_control", "-d", str(daemon.pid)], check=True,
                           stdout=subprocess.DEVNULL)
            dumps = sorted(glob.glob(f"{out}.{daemon.pid}.*"))
            wait_for(lambda: dumps_done(dumps := sorted(glob.glob(f"{out}.{daemon.pid}.*"))),
                     60, "the dump")
            dumps = sorted(glob.glob(f"{out}.{daemon.pid}.*"))
            total = 0
            for dump in dumps:
                total += summary(dump)
            if keep:
                for dump in dumps:
                    shutil.copy(dump, os.path.join(keep, f"{transport}-{os.path.basename(dump)}"))
            return total / checks
        finally:
            daemon.terminate()
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
    finally:
        if server:
            server.terminate()
            server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def dumps_done(dumps):
    return bool(dumps) and all(summary(d) is not None for d in dumps)


def summary(path):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("totals:") or line.startswith("summary:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--only", default="tcp,uds,grpc")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--checks", type=int, default=1000)
    parser.add_argument("--keep")
    parser.add_argument("--redis", action="store_true")
    args = parser.parse_args()
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    for transport in args.only.split(","):
        figures = [measure(args.binary, transport, args.warmup, args.checks, args.keep, args.redis)
                   for _ in range(args.runs)]
        print(f"{transport}: " + ", ".join(f"{f / 1000:.2f}k" for f in figures)
              + " instructions per check", flush=True)


if __name__ == "__main__":
    main()
