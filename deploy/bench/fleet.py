#!/usr/bin/env python3
"""Probes of a distributed fleet on this machine's PostgreSQL and RabbitMQ,
each on a fresh schema and queue prefix of its own, with processor time per
job read from /proc for each kind of process around what is measured.

  fleet.py drain  BIN N   N jobs queued with no worker, then one worker
                          (concurrency 32): jobs settled per second from its
                          /readyz, and from its spawn to the last one
                          (--one-by-one: queued by single calls, which
                          share messages as the publisher groups them:
                          with no worker consuming, those of up to 20 ms;
                          --ahead N: the worker's prefetch_ahead)
  fleet.py bulk   BIN N   N jobs in batches of 1,000 with a worker draining:
                          accepted and settled per second (--no-worker:
                          accepted alone)
  fleet.py single BIN N   N calls one at a time: calls per second, p50, p99
  fleet.py latency BIN N  worker warm, N calls one at a time, each followed by
                          GET /v1/jobs/{id}?wait_s=10 until it settles: round
                          trip p50, p99, and where the time went (the store's
                          created, started and settled times, in ms; the
                          round trips over twice the p50, and when they came
                          from the first round trip's start); --after M: first
                          M jobs in batches of 1,000, settled just before the
                          round trips start
  fleet.py fleet  BIN N   two dispatchers and two workers; two drivers each
                          enqueue N jobs in batches of 1,000 at once: jobs
                          settled end to end per second
  fleet.py backlog BIN N  N jobs of a second each, one at a time, on one
                          worker at concurrency 1 with lease_s 3 (a sweep
                          every 3 s): the duplicate deliveries the sweeper's
                          passes cost while the backlog drains (deliveries
                          that found their job not claimable, from the
                          worker's debug lines), and the most messages the
                          queue held
  fleet.py fanout BIN N   N jobs scheduled in batches of 1,000 for one instant
                          20 s ahead (beyond a sweep period, so the sweeper
                          publishes them): how long after that instant the
                          first and the last settled

BIN is a toolfleet release build. The servers are TOOLFLEET_TEST_DATABASE_URL
and TOOLFLEET_TEST_AMQP_URL, else the local defaults; cleaning up needs psql
and rabbitmqctl. Standard library only. Compare binaries side by side, in
alternating runs: the machine's speed moves from hour to hour.
"""
import argparse
import atexit
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

DATABASE = os.environ.get("TOOLFLEET_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
AMQP = os.environ.get("TOOLFLEET_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
TOKEN = "fleet-probe-token"
SETTLED = re.compile(r"^toolfleet_jobs_settled_total\{[^}]*\} (\d+)", re.M)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(names):
    """Processor seconds so far of every process whose name starts with one of `names`."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if not f.read().strip().startswith(names):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


class Fleet:
    """Processes of one schema and prefix; everything is stopped and dropped at exit."""

    def __init__(self, binary, ahead=None, slow=False):
        self.bin = binary
        self.ahead = ahead
        # One slot and short leases: the backlog probe's.
        self.slow = slow
        self.comm = os.path.basename(binary)[:15]
        tag = f"{os.getpid()}_{int(time.time() * 1000) % 10**8}"
        self.schema, self.prefix = f"probe_{tag}", f"probe-{tag}"
        self.procs, self.dirs = [], []
        atexit.register(self.stop)

    def config(self, port, mport):
        d = tempfile.mkdtemp(prefix="fleet-probe-")
        self.dirs.append(d)
        digest = hashlib.sha256(TOKEN.encode()).hexdigest()
        with open(os.path.join(d, "toolfleet.toml"), "w") as f:
            f.write(f"""listen = "127.0.0.1:{port}"
metrics_listen = "127.0.0.1:{mport}"
data_dir = ".toolfleet"
concurrency = {1 if self.slow else 32}
{"lease_s = 3" if self.slow else ""}
{"" if self.ahead is None else f"prefetch_ahead = {self.ahead}"}
database_url = "{DATABASE}"
database_schema = "{self.schema}"
broker_url = "{AMQP}"
broker_prefix = "{self.prefix}"
database_pool = 16

[[auth.tokens]]
sha256 = "{digest}"
tenant = "probe"
user = "probe"
scopes = []

[[tools]]
name = "probe_noop"
description = "Does nothing, as a job."
shape = "job"
input_schema = {{ type = "object" }}
executor = {{ kind = "builtin", name = "toolfleet.noop" }}

[[tools]]
name = "probe_second"
description = "Sleeps a second, as a job."
shape = "job"
input_schema = {{ type = "object" }}
executor = {{ kind = "exec", program = "/bin/sh", args = ["-c", "cat >/dev/null; sleep 1; echo '{{}}'"] }}
""")
        return d

    def member(self, worker=True):
        """A dispatcher (and a worker) in a directory of their own: (API port, worker metrics port)."""
        port, mport, wport = free_port(), free_port(), free_port()
        d = self.config(port, mport)
        if len(self.dirs) == 1:
            subprocess.run([self.bin, "migrate"], cwd=d, check=True, capture_output=True)
        self.spawn(d, "dispatcher", mport)
        wait_ok(port, "/healthz")
        if worker:
            self.spawn(d, "worker", wport)
            wait_ok(wport, "/readyz")
        return port, wport

    def spawn(self, d, role, mport):
        log = open(os.path.join(d, f"{role}.log"), "ab")
        env = dict(os.environ, TOOLFLEET_METRICS_LISTEN=f"127.0.0.1:{mport}")
        if self.slow and role == "worker":
            env["TOOLFLEET_LOG"] = "warn,toolfleet_worker=debug"
        self.procs.append(subprocess.Popen([self.bin, role], cwd=d, stdout=log, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=True))

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            p.wait()
        self.procs = []
        if self.dirs:
            subprocess.run(["psql", DATABASE, "-qc", f"DROP SCHEMA IF EXISTS {self.schema} CASCADE"],
                           capture_output=True)
            queues = subprocess.run(["rabbitmqctl", "list_queues", "name", "-q"], capture_output=True,
                                    text=True).stdout.split()
            for name in queues:
                if name.startswith(self.prefix + "."):
                    subprocess.run(["rabbitmqctl", "delete_queue", name], capture_output=True)
            for d in self.dirs:
                shutil.rmtree(d, ignore_errors=True)
            self.dirs = []

    def cpu(self):
        return {"toolfleet": cpu_seconds(self.comm), "postgres": cpu_seconds("postgres"),
                "rabbitmq": cpu_seconds("beam.smp")}


def request(conn, method, path, body=None):
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    conn.request(method, path, body, headers)
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise SystemExit(f"{method} {path}: {response.status} {data[:300]!r}")
    return data


def wait_ok(port, path, timeout=30):
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return time.perf_counter()
        except OSError:
            pass
        time.sleep(0.005)
    raise SystemExit(f"127.0.0.1:{port}{path} not ready in {timeout} s")


def settled(wports):
    total = 0
    for wport in wports:
        conn = http.client.HTTPConnection("127.0.0.1", wport, timeout=5)
        conn.request("GET", "/metrics")
        total += sum(int(n) for n in SETTLED.findall(conn.getresponse().read().decode()))
    return total


BATCH = json.dumps({"calls": [{"tool": "probe_noop", "args": {}} for _ in range(1000)]})
ONE = json.dumps({"tool": "probe_noop", "args": {}})


def enqueue(port, n):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(n // 1000):
        request(conn, "POST", "/v1/calls", BATCH)


def wait_settled(wports, n, deadline_s=300):
    start = time.perf_counter()
    while settled(wports) < n:
        if time.perf_counter() - start > deadline_s:
            raise SystemExit(f"fewer than {n} jobs settled in {deadline_s} s")
        time.sleep(0.005)
    return time.perf_counter()


def per_job(before, after, n):
    return {k: round((after[k] - before[k]) * 1e6 / n, 1) for k in before}


def enqueue_one_by_one(port, n):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(n):
        request(conn, "POST", "/v1/calls", ONE)


def drain(fleet, n, one_by_one=False):
    port, _ = fleet.member(worker=False)
    (enqueue_one_by_one if one_by_one else enqueue)(port, n)
    time.sleep(0.3)
    wport = free_port()
    before = fleet.cpu()
    spawned = time.perf_counter()
    fleet.spawn(fleet.dirs[0], "worker", wport)
    ready = wait_ok(wport, "/readyz")
    end = wait_settled([wport], n)
    return {"drain_jobs_s": round(n / (end - ready)), "spawn_to_last_ms": round((end - spawned) * 1000),
            "cpu_us_per_job": per_job(before, fleet.cpu(), n)}


def bulk(fleet, n, worker):
    port, wport = fleet.member(worker=worker)
    before = fleet.cpu()
    t0 = time.perf_counter()
    enqueue(port, n)
    t1 = time.perf_counter()
    result = {"accepted_jobs_s": round(n / (t1 - t0))}
    if worker:
        result["settled_jobs_s"] = round(n / (wait_settled([wport], n) - t0))
    result["cpu_us_per_job"] = per_job(before, fleet.cpu(), n)
    return result


def single(fleet, n):
    port, _ = fleet.member(worker=False)
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(50):
        request(conn, "POST", "/v1/calls", ONE)
    before = fleet.cpu()
    times = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        request(conn, "POST", "/v1/calls", ONE)
        times.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - t0
    times.sort()
    return {"calls_s": round(n / elapsed), "p50_ms": round(times[n // 2] * 1000, 2),
            "p99_ms": round(times[n * 99 // 100] * 1000, 2), "cpu_us_per_call": per_job(before, fleet.cpu(), n)}


def latency(fleet, n, after=0):
    port, wport = fleet.member()
    conn = http.client.HTTPConnection("127.0.0.1", port)

    def round_trip():
        t = time.perf_counter()
        job = json.loads(request(conn, "POST", "/v1/calls", ONE))["job_id"]
        posted = time.perf_counter()
        settled = json.loads(request(conn, "GET", f"/v1/jobs/{job}?wait_s=10"))
        if settled.get("status") != "ok":
            raise SystemExit(f"job {job} answered {settled}")
        return job, posted - t, time.perf_counter() - t, t

    warm = 20
    for _ in range(warm):
        round_trip()
    if after:
        enqueue(port, after)
        wait_settled([wport], warm + after)
    rows = [round_trip() for _ in range(n)]
    ids = ",".join(f"'{job}'" for job, _, _, _ in rows)
    # Milliseconds in the store: created (the call's commit), started (the
    # claim's), updated (the settle's); means over n show sub-millisecond parts.
    out = subprocess.run(["psql", DATABASE, "-Atc",
                          f"SELECT avg(started_at - created_at), avg(updated_at - started_at) "
                          f"FROM {fleet.schema}.jobs WHERE id IN ({ids})"],
                         capture_output=True, text=True, check=True).stdout.strip().split("|")
    posts = sorted(p for _, p, _, _ in rows)
    totals = sorted(t for _, _, t, _ in rows)
    ms = lambda v: round(v * 1000, 2)  # noqa: E731
    p50 = totals[n // 2]
    slow = [round((at - rows[0][3]) * 1000) for _, _, t, at in rows if t > 2 * p50]
    return {"p50_ms": ms(p50), "p99_ms": ms(totals[n * 99 // 100]),
            "post_p50_ms": ms(posts[n // 2]), "post_p99_ms": ms(posts[n * 99 // 100]),
            "mean_created_to_started_ms": round(float(out[0]), 2),
            "mean_started_to_settled_ms": round(float(out[1]), 2),
            "over_twice_p50": len(slow), "over_twice_p50_from_ms": slow[:1] + slow[1:][-1:]}


def two_by_two(fleet, n):
    members = [fleet.member(), fleet.member()]
    before = fleet.cpu()
    t0 = time.perf_counter()
    drivers = [threading.Thread(target=enqueue, args=(port, n)) for port, _ in members]
    for d in drivers:
        d.start()
    for d in drivers:
        d.join()
    t1 = time.perf_counter()
    end = wait_settled([wport for _, wport in members], 2 * n)
    return {"accepted_jobs_s": round(2 * n / (t1 - t0)), "settled_jobs_s": round(2 * n / (end - t0)),
            "cpu_us_per_job": per_job(before, fleet.cpu(), 2 * n)}


def backlog(fleet, n):
    port, _ = fleet.member()
    conn = http.client.HTTPConnection("127.0.0.1", port)
    second = json.dumps({"tool": "probe_second", "args": {}})
    for _ in range(n):
        request(conn, "POST", "/v1/calls", second)
    queue, most = f"{fleet.prefix}.pool.default", 0
    deadline = time.perf_counter() + 3 * n + 60
    while time.perf_counter() < deadline:
        time.sleep(1)
        listed = subprocess.run(["rabbitmqctl", "list_queues", "-q", "name", "messages_ready"],
                                capture_output=True, text=True).stdout.split("\n")
        ready = next((int(line.split()[1]) for line in listed if line.split()[:1] == [queue]), 0)
        most = max(most, ready)
        left = subprocess.run(["psql", DATABASE, "-Atc",
                               f"SELECT count(*) FROM {fleet.schema}.jobs WHERE state <> 'succeeded'"],
                              capture_output=True, text=True, check=True).stdout.strip()
        if ready == 0 and left == "0":
            time.sleep(2)  # what the worker still holds, skipped
            break
    else:
        raise SystemExit(f"the backlog did not drain in {3 * n + 60} s")
    with open(os.path.join(fleet.dirs[0], "worker.log")) as f:
        duplicates = f.read().count("not claimable")
    return {"jobs": n, "duplicate_deliveries": duplicates, "most_messages_ready": most}


def fanout(fleet, n):
    port, wport = fleet.member()
    conn = http.client.HTTPConnection("127.0.0.1", port)
    due = time.time() + 20
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(due)) + ".000Z"
    due = int(due)
    batch = json.dumps({"calls": [{"tool": "probe_noop", "args": {}, "run_at": at} for _ in range(1000)]})
    for _ in range(n // 1000):
        request(conn, "POST", "/v1/calls", batch)
    first = None
    while True:
        done = settled([wport])
        now = time.time()
        if done and first is None:
            first = now
        if done >= n:
            break
        if now - due > 300:
            raise SystemExit(f"{done} of {n} settled in 300 s after their time")
        time.sleep(0.05)
    return {"jobs": n, "first_settled_after_s": round(first - due, 2), "last_settled_after_s": round(now - due, 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probe", choices=["drain", "bulk", "single", "latency", "fleet", "backlog", "fanout"])
    parser.add_argument("bin")
    parser.add_argument("n", type=int)
    parser.add_argument("--no-worker", action="store_true", help="bulk: accepted alone")
    parser.add_argument("--one-by-one", action="store_true",
                        help="drain: the jobs enqueued by single calls")
    parser.add_argument("--after", type=int, metavar="M", default=0,
                        help="latency: M jobs in batches of 1,000 settled just before the round trips")
    parser.add_argument("--ahead", type=int, metavar="N",
                        help="the workers' prefetch_ahead (default: theirs, four per slot)")
    a = parser.parse_args()
    if a.after % 1000:
        parser.error("--after counts batches of 1,000 jobs: give a multiple of 1,000")
    fleet = Fleet(os.path.abspath(a.bin), a.ahead, slow=a.probe == "backlog")
    try:
        if a.probe == "drain":
            result = drain(fleet, a.n, a.one_by_one)
        elif a.probe == "bulk":
            result = bulk(fleet, a.n, not a.no_worker)
        elif a.probe == "single":
            result = single(fleet, a.n)
        elif a.probe == "latency":
            result = latency(fleet, a.n, a.after)
        elif a.probe == "backlog":
            result = backlog(fleet, a.n)
        elif a.probe == "fanout":
            result = fanout(fleet, a.n)
        else:
            result = two_by_two(fleet, a.n)
    finally:
        fleet.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
