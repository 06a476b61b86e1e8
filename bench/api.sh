#!/bin/sh
# The daemon's HTTP side on this machine: GET /v1/jobs/{id} with the token under wrk (2 threads,
# 32 keep-alive connections; req/s and p99 latency), and the time from POST /v1/jobs to the
# first train metric on the job's event stream for a small synthetic-data job.
#   bench/api.sh [BUILD_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
state=$(mktemp -d /tmp/traind-bench.XXXXXX)
log=$(mktemp /tmp/traind-bench-log.XXXXXX)
daemon=
trap '[ -n "$daemon" ] && kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$state" "$log" "$log.fifo"' EXIT
. "$here/traind_start.sh"
start_traind "$log" --listen 127.0.0.1:0 --state-dir "$state"
daemon=$traind_pid url=$traind_url
token=$(cat "$state/token")
/usr/bin/python3 - "$url" "$token" <<'PY'
import http.client, json, sys, time, urllib.parse
url, token = sys.argv[1], sys.argv[2]
u = urllib.parse.urlparse(url)
spec = {"name": "first-metric", "model": {"preset": "lenet5", "num_classes": 10},
        "data": {"format": "synthetic", "shape": [1, 28, 28], "num_classes": 10, "size": 256},
        "train": {"epochs": 1, "batch_size": 64, "seed": 1, "threads": 1,
                  "optimizer": {"type": "sgd", "lr": 0.01}},
        "log": {"every_steps": 1}}
h = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
best = None
for _ in range(5):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    t0 = time.perf_counter()
    c.request("POST", "/v1/jobs", json.dumps(spec), h)
    r = c.getresponse()
    job = json.loads(r.read())
    assert r.status == 201, job
    s = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    s.request("GET", f"/v1/jobs/{job['id']}/events", headers=h)
    ev = s.getresponse()
    for line in ev:
        if line.startswith(b"event: train"):
            dt = time.perf_counter() - t0
            break
    s.close()
    best = dt if best is None else min(best, dt)
    print(f"POST -> first train metric: {dt * 1000:.0f} ms")
print(f"best of 5: {best * 1000:.0f} ms (target <= 300 ms)")
PY
wrk -t2 -c32 -d10s --latency -H "Authorization: Bearer $token" "$url/v1/jobs/1" |
    grep -E "Requests/sec|Latency|99%|Non-2xx" || true
