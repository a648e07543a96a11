#!/usr/bin/env bash
# Observability proof (issue 7), against real components: a real Prometheus (Debian package
# `prometheus`) scrapes two real daemons under bounded load, then every PromQL expression of
# dashboards/sluice.json and of deploy/prometheus/alerts.yaml is evaluated through Prometheus's
# HTTP API and must parse and return data; `promtool check rules` must pass; the daemons' JSON logs
# must hold no secret and no raw key, tenant or IP.
#
#   daemon A: a real redis-server (with a password): allowed, denied, shadow_denied, Redis pipelines,
#             quota leases
#   daemon B: redis.url on a port where nothing listens: fail_open, fail_closed, local_*, circuit open
#   the injector, on a 30-day certificate: its expiry metric and alert
#   daemon C: on the embedded store, killed once scraped: SluiceSidecarDown must fire (and
#             `promtool test rules` proves the sidecar rules on synthetic series, absence too)
#
# Installs nothing: needs prometheus, promtool, redis-server, curl and python3 on PATH (.ci/run
# installs them). Everything runs on loopback, on free ports, in a temporary directory; every
# process started here is killed on exit. About 30 s after the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd)"
here="$repo/tests/observability"

for tool in prometheus promtool redis-server curl python3 cargo; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "observability: $tool not found (apt-get install -y prometheus redis-server curl python3)" >&2
    exit 1
  fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-observability.XXXXXX")"
pids=()
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 50); do # up to 5 s for a clean exit, then SIGKILL
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$status" != 0 ]; then
    echo "--- observability FAILED (exit $status); last log lines:" >&2
    for log in "$work"/*.log; do [ -f "$log" ] && { echo "== $log" >&2; tail -n 15 "$log" >&2; }; done
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Polls `$@` every 0.2 s for at most $timeout seconds.
wait_for() {
  local what="$1" timeout="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "observability: $what not within ${timeout}s" >&2
      return 1
    fi
    sleep 0.2
  done
}

echo "--- promtool check rules"
promtool check rules deploy/prometheus/alerts.yaml
(cd "$here" && promtool test rules sidecar_rules.test.yaml)

echo "--- build"
cargo build --locked --quiet --bin sluice
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
sluice="$target_dir/debug/sluice"

read -r redis_port a_http a_admin b_http b_admin dead_port prom_port inj_port inj_admin c_http c_admin \
  <<<"$(python3 "$here/promql.py" ports 11)"
password="obs-s3cret-pw"
prom="http://127.0.0.1:$prom_port"

echo "--- redis-server on $redis_port (password), nothing on $dead_port"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  --requirepass "$password" >"$work/redis.log" 2>&1 &
pids+=($!)

# Daemon A's policies: the shipped two, plus a shadow policy (a new limit being rolled out).
cp config/policies.yaml "$work/a-policies.yaml"
cat >>"$work/a-policies.yaml" <<'EOF'

  - name: search_shadow
    match: {path: /search}
    key: [ip]
    algorithm: fixed_window
    limit: 5
    period: 1m
    failure_mode: open
    shadow: true

  - name: feed_leased
    match: {path: /feed}
    key: [tenant]
    algorithm: fixed_window
    limit: 100000
    period: 1h
    failure_mode: open
    lease: true
EOF
# Daemon B's: the shipped two plus a policy that falls back to a per-pod share.
cp config/policies.yaml "$work/b-policies.yaml"
cat >>"$work/b-policies.yaml" <<'EOF'

  - name: export_local
    match: {path: /export}
    key: [tenant]
    algorithm: token_bucket
    limit: 10
    period: 1m
    failure_mode: local
EOF

daemon_config() { # name http admin redis_url
  cat >"$work/$1.toml" <<EOF
policies = "$work/$1-policies.yaml"
shutdown_grace = "1s"
worker_threads = 2

[listen]
http = "127.0.0.1:$2"
socket = "$work/$1.sock"
admin = "127.0.0.1:$3"

[redis]
url = "$4"
timeout = "50ms"

[leases]
# The load below checks the leased partition ~12 times a second (the default is 64).
min_units = 4

[log]
format = "json"
level = "info"
EOF
}
daemon_config a "$a_http" "$a_admin" "redis://:$password@127.0.0.1:$redis_port"
daemon_config b "$b_http" "$b_admin" "redis://:$password@127.0.0.1:$dead_port"

for d in a b; do
  "$sluice" config check "$work/$d.toml" >/dev/null
  env -u RUST_LOG "$sluice" serve --config "$work/$d.toml" >"$work/$d.log" 2>&1 &
  pids+=($!)
done
# Daemon C, the sidecar that dies: the embedded store, the shipped policies.
cat >"$work/c.toml" <<EOF
policies = "$repo/config/policies.yaml"
shutdown_grace = "1s"
worker_threads = 1

[listen]
http = "127.0.0.1:$c_http"
socket = "$work/c.sock"
admin = "127.0.0.1:$c_admin"

[log]
format = "json"
level = "warn"
EOF
env -u RUST_LOG "$sluice" serve --config "$work/c.toml" >"$work/c.log" 2>&1 &
c_pid=$!
pids+=($c_pid)
# The injector, for its certificate expiry metric (a 30-day certificate from `injector certs`).
"$sluice" injector certs --out "$work/injector-tls" --days 30 >/dev/null
env -u RUST_LOG "$sluice" injector --listen "127.0.0.1:$inj_port" --admin "127.0.0.1:$inj_admin" \
  --tls-cert "$work/injector-tls/tls.crt" --tls-key "$work/injector-tls/tls.key" >"$work/injector.log" 2>&1 &
pids+=($!)
wait_for "daemon A ready" 20 curl -sf "http://127.0.0.1:$a_admin/readyz"
wait_for "injector ready" 20 curl -sf "http://127.0.0.1:$inj_admin/readyz"
wait_for "daemon B ready" 20 curl -sf "http://127.0.0.1:$b_admin/readyz"
wait_for "daemon C ready" 20 curl -sf "http://127.0.0.1:$c_admin/readyz"
wait_for "daemon A connected to Redis" 20 \
  sh -c "curl -sf http://127.0.0.1:$a_admin/metrics | grep -qx 'sluice_redis_up 1'"

echo "--- prometheus on $prom_port (scrape every 1s)"
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $repo/deploy/prometheus/alerts.yaml
scrape_configs:
  - job_name: sluice
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:$a_admin"]
        labels: {namespace: observability, pod: sluice-a}
      - targets: ["127.0.0.1:$b_admin"]
        labels: {namespace: observability, pod: sluice-b}
      - targets: ["127.0.0.1:$c_admin"]
        labels: {namespace: observability, pod: sluice-c}
  - job_name: sluice-injector
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:$inj_admin"]
        labels: {namespace: observability, pod: sluice-injector}
EOF
promtool check config "$work/prometheus.yml" >/dev/null
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)
wait_for "prometheus ready" 30 curl -sf "$prom/-/ready"
python3 "$here/promql.py" wait-targets "$prom" 4 20

echo "--- daemon C killed (SIGKILL: a sidecar that dies): SluiceSidecarDown must fire after its 1m"
kill -9 "$c_pid"
c_killed=$SECONDS

echo "--- load: 60 rounds of 8 checks over TCP, the Unix socket and the CLI (bounded, ~15 s)"
check() { # transport(tcp|uds) daemon(a|b) body -> status code
  local port sock
  if [ "$2" = a ]; then port=$a_http; else port=$b_http; fi
  sock="$work/$2.sock"
  if [ "$1" = uds ]; then
    curl -s -o /dev/null -w '%{http_code}\n' --max-time 2 --unix-socket "$sock" -d "$3" http://sluice/v1/check
  else
    curl -s -o /dev/null -w '%{http_code}\n' --max-time 2 -d "$3" "http://127.0.0.1:$port/v1/check"
  fi
}
load_end=$((SECONDS + 40))
for round in $(seq 1 60); do
  [ "$SECONDS" -lt "$load_end" ] || break
  key="obs-key-$((round % 4))"
  ip="198.51.100.$((round % 3))"
  {
    check tcp a "{\"descriptors\": {\"tenant\": \"obs-tenant\", \"api_key\": \"$key\"}}"
    check uds a "{\"descriptors\": {\"path\": \"/login\", \"ip\": \"$ip\"}}"
    check tcp a "{\"descriptors\": {\"path\": \"/search\", \"ip\": \"$ip\"}}"
    # A busy leased partition (leases.min_units = 4 a second, above): admitted from leases.
    for _ in 1 2 3 4 5 6; do check tcp a "{\"descriptors\": {\"path\": \"/feed\", \"tenant\": \"obs-tenant\"}}"; done
    check tcp b "{\"descriptors\": {\"tenant\": \"obs-tenant\", \"api_key\": \"$key\"}}"
    check uds b "{\"policy\": \"login\", \"descriptors\": {\"ip\": \"$ip\"}}"
    check tcp b "{\"descriptors\": {\"path\": \"/export\", \"tenant\": \"obs-tenant\"}}"
  } >>"$work/codes.txt"
  # The CLI over the socket (exit 0 allowed, 1 denied, 2 unavailable).
  timeout 5 "$sluice" check --socket "$work/a.sock" -p public_api -d tenant=obs-tenant -d "api_key=$key" >/dev/null || true
  timeout 5 "$sluice" check --socket "$work/b.sock" -p export_local -d tenant=obs-tenant >/dev/null || true
  if [ "$round" = 30 ]; then
    # A policy change mid-run (a ConfigMap update: new file swapped in), for the reload metrics.
    sed 's/limit: 5$/limit: 6/' "$work/a-policies.yaml" >"$work/a-policies.new" && mv "$work/a-policies.new" "$work/a-policies.yaml"
    echo "policies: [" >"$work/b-policies.new" && mv "$work/b-policies.new" "$work/b-policies.yaml"
  fi
  sleep 0.15
done
echo "    $round rounds in $((SECONDS - load_end + 40)) s"
sort "$work/codes.txt" | uniq -c | sed 's/^/    answers: /'
for code in 200 429 503; do
  grep -qx "$code" "$work/codes.txt" || { echo "observability: no $code answer in the load" >&2; exit 1; }
done
sleep 3 # the last scrapes

echo "--- every dashboard and alert expression through $prom/api/v1/query"
python3 "$here/promql.py" check "$prom" dashboards/sluice.json deploy/prometheus/alerts.yaml

echo "--- SluiceSidecarDown fires for daemon C ($((SECONDS - c_killed)) s after the kill; its rule waits 1m)"
python3 "$here/promql.py" wait-alert "$prom" SluiceSidecarDown pod=sluice-c 120

echo "--- logs: JSON lines, no Redis password, no raw key, tenant or IP"
python3 - "$work/a.log" "$work/b.log" "$password" <<'EOF'
import json, sys
*logs, password = sys.argv[1:]
secrets = [password, "obs-key-", "obs-tenant", "198.51.100."]
shadow = 0
for path in logs:
    for number, line in enumerate(open(path), 1):
        event = json.loads(line)  # every line is JSON with log.format = "json"
        for secret in secrets:
            assert secret not in line, f"{path}:{number} logs {secret!r}: {line}"
        if "would block" in event.get("message", ""):
            assert event.get("level") == "INFO" and event.get("policy") == "search_shadow", line
            shadow += 1
    print(f"    {path.rsplit('/', 1)[-1]}: {number} lines, none with a secret, key, tenant or IP")
assert shadow > 0, "no shadow 'would block' line"
print(f"    shadow 'would block' lines: {shadow} (policy and a partition fingerprint, no raw value)")
EOF
echo "--- observability: ok (${SECONDS} s)"
