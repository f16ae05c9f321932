#!/usr/bin/env bash
# The console's pages for a tenant of 100,000 jobs (a thousandth failed, a
# five-hundredth queued), on the embedded default: a fresh data directory,
# the jobs written straight into SQLite, then each page fetched 20 times
# through a signed-in session. Prints each page's median and slowest time.
# Usage: deploy/bench/console.sh [path/to/toolfleet] (default: the release
# build). Needs curl and sqlite3.
set -euo pipefail
bin="${1:-target/release/toolfleet}"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
dir="$(mktemp -d)"
port="${PORT:-7791}"
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
cd "$dir"
start() {
  TOOLFLEET_LISTEN="127.0.0.1:$port" "$bin" serve >serve.log 2>&1 &
  pid=$!
  for _ in $(seq 1 50); do
    curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && return 0
    sleep 0.2
  done
  cat serve.log >&2
  return 1
}
start
kill "$pid"; wait "$pid" 2>/dev/null || true
sqlite3 .toolfleet/toolfleet.db "
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)
INSERT INTO jobs (id, tenant, user, tool, pool, args, state, attempts, max_attempts,
    timeout_ms, run_at, run_id, call_id, created_at, updated_at, error, result)
SELECT printf('0190%04x-0000-7000-8000-%012x', i / 65536, i), 'dev', 'dev', 'bench_noop',
    'default', '{}',
    CASE WHEN i % 1000 = 0 THEN 'failed' WHEN i % 500 = 0 THEN 'queued' ELSE 'succeeded' END,
    1, 3, 60000, 1796000000000 + i, 'r', 'c', 1796000000000 + i * 10, 1796000000000 + i * 10,
    CASE WHEN i % 1000 = 0 THEN '{\"code\":\"tool_failed\",\"message\":\"boom\",\"retryable\":false}' END,
    CASE WHEN i % 1000 <> 0 THEN '{}' END
FROM n;"
start
token="$(cat .toolfleet/dev-token)"
curl -s -c jar -d "token=$token" -o /dev/null "http://127.0.0.1:$port/console/login"
echo "pages of a tenant with $(sqlite3 .toolfleet/toolfleet.db 'SELECT count(*) FROM jobs') jobs, 20 fetches each (ms):"
for page in /console /console/inbox /console/jobs '/console/jobs?state=failed' \
  '/console/jobs?state=queued' '/console/jobs?state=succeeded' '/console/jobs?state=retrying' \
  "/console/jobs/0190$(printf '%04x' 0)-0000-7000-8000-$(printf '%012x' 1000)" /console/runs /console/tools; do
  times=$(for _ in $(seq 1 20); do
    curl -s -b jar -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$port$page"
  done | sort -n)
  median=$(echo "$times" | sed -n 10p)
  slowest=$(echo "$times" | tail -1)
  printf '  %-45s median %6.2f  slowest %6.2f\n' "$page" \
    "$(echo "$median * 1000" | bc -l)" "$(echo "$slowest * 1000" | bc -l)"
done
