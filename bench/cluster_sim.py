"""Simulated agents against a real traind master, speaking the real cluster protocol
(api/README.md, "Nodes"): many nodes in one process, each registering and then sending its
heartbeats on its own schedule over a new connection, as traind's agent does.

    cluster_sim.py --master 127.0.0.1:PORT --secret-file F --token-file T --pid PID
                   [--nodes 256] [--slots 8] [--steady-s 20] [--lose 10]

Prints one JSON object: how long registering every node took, the master's CPU while it
serves the heartbeats (from /proc/PID/stat), the heartbeats' latency, how long the master takes
to place `--jobs` queued jobs of mixed sizes across the nodes once the job that held every slot
ends, and how long after their last heartbeat the master listed `--lose` nodes that went silent
at once as lost and ended the attempts that ran there.

A simulated node answers the master's orders as a real one does: it reports every part it is
told to run as running, and one told to stop as ended (exit 0), so cancelling works.
"""
import argparse
import http.client
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def post(host, port, path, body, auth, timeout=10):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body),
                     {"Content-Type": "application/json", "Authorization": auth})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def api(host, port, token, method, path, body=None):
    """One API call; a 429 (the token's rate_limit_per_s) is waited out and sent again."""
    while True:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        try:
            conn.request(method, path, json.dumps(body) if body is not None else None,
                         {"Authorization": "Bearer " + token, "Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status == 429:
                time.sleep(float(resp.getheader("Retry-After") or 1))
                continue
            if resp.status >= 300:
                raise RuntimeError(f"{method} {path}: {resp.status} {data[:300]!r}")
            return json.loads(data) if data else None
        finally:
            conn.close()


def count_jobs(host, port, token, state):
    n, offset = 0, 0
    while True:
        r = api(host, port, token, "GET", f"/v1/jobs?state={state}&limit=500&offset={offset}")
        n += len(r["jobs"])
        if r["next_offset"] is None:
            return n
        offset = r["next_offset"]


def get_nodes(host, port, token):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/v1/nodes", headers={"Authorization": "Bearer " + token})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"GET /v1/nodes: {resp.status} {resp.read()[:200]!r}")
        return json.loads(resp.read())["nodes"]
    finally:
        conn.close()


def cpu_seconds(pid):
    """The process's user + system CPU time, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def experiments_phase(a, host, port, token):
    """--experiments grid searches of --trials one-slot trials each, all at once: how long until
    every trial is made and running on the simulated nodes, the master's CPU meanwhile, and how
    long cancelling them all takes (their parts stop at the nodes' next heartbeats)."""
    if not a.experiments:
        return {}
    c0, t0 = cpu_seconds(a.pid), time.monotonic()
    ids = [api(host, port, token, "POST", "/v1/experiments", {
        "name": f"e{k}", "max_concurrent": a.trials,
        "job": {"name": "t", "command": ["true"], "resources": {"nproc_per_node": 1}},
        "space": {"env.N": {"grid": [str(i) for i in range(a.trials)]}},
        "searcher": {"type": "grid", "metric": "score", "mode": "max"}})["id"]
        for k in range(a.experiments)]
    want, deadline = a.experiments * a.trials, time.monotonic() + 300
    while time.monotonic() < deadline:
        running = sum(api(host, port, token, "GET", f"/v1/experiments/{e}")["counts"]["running"]
                      for e in ids)
        if running == want:
            break
        time.sleep(0.05)
    made_s, cpu = time.monotonic() - t0, cpu_seconds(a.pid) - c0
    t1 = time.monotonic()
    for e in ids:
        api(host, port, token, "POST", f"/v1/experiments/{e}/cancel")
    while time.monotonic() < deadline and any(
            api(host, port, token, "GET", f"/v1/experiments/{e}")["state"] == "running"
            for e in ids):
        time.sleep(0.05)
    return {"experiments": a.experiments, "trials": want, "trials_running": running,
            "trials_all_running_s": round(made_s, 2),
            "master_cpu_percent_while_making_trials": round(100 * cpu / made_s, 1),
            "experiments_cancelled_s": round(time.monotonic() - t1, 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--steady-s", type=float, default=20)
    ap.add_argument("--lose", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--experiments", type=int, default=10)
    ap.add_argument("--trials", type=int, default=100)
    a = ap.parse_args()
    host, port = a.master.rsplit(":", 1)
    port = int(port)
    auth = "Cluster " + open(a.secret_file).read().strip()
    token = open(a.token_file).read().strip()
    names = [f"sim{i:04d}" for i in range(a.nodes)]
    ids = {n: os.urandom(8).hex() for n in names}

    # 1. every node registers at once (32 at a time)
    def register(name):
        gpus = [{"index": i, "name": "Simulated GPU", "memory_bytes": 80 << 30}
                for i in range(a.slots)]
        body = {"protocol": 4, "name": name, "node_id": ids[name], "address": "127.0.0.1",
                "slots": a.slots, "gpus": gpus, "version": "sim"}
        status, reply = post(host, port, "/v1/cluster/register", body, auth)
        if status != 200:
            raise RuntimeError(f"{name}: register: {status} {reply[:200]!r}")
        return json.loads(reply)

    t0 = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        replies = list(pool.map(register, names))
    # protocol 4: each node's heartbeats carry the credential its registration gave it
    node_auth = {n: f"Node {n}:{r['credential']}" for n, r in zip(names, replies)}
    registered_s = time.monotonic() - t0
    heartbeat_s = replies[0]["heartbeat_s"]
    listed = get_nodes(host, port, token)
    ready = sum(1 for n in listed if n["state"] == "ready")
    if ready != a.nodes + 1:
        raise RuntimeError(f"after registering, {ready} nodes ready, expected {a.nodes + 1}")

    # 2. heartbeats: each node on its own schedule, spread over the interval
    stop = threading.Event()
    silent = set()
    last_beat = {}
    latencies = []
    errors = []
    lock = threading.Lock()

    orders = {n: [] for n in names}  # the parts each node was last told to run

    def report(name):
        return [{"job": o["job"], "attempt": o["attempt"],
                 "state": "ended" if o["stop"] else "running", "exit_code": 0, "reason": "",
                 "lines": [], "logs": [], "next_seq": 0, "complete": True, "devices": ""}
                for o in orders[name]]

    def beat(name):
        t = time.monotonic()
        used = sum(o["nproc"] for o in orders[name] if not o["stop"])
        status, reply = post(host, port, "/v1/cluster/heartbeat",
                             {"name": name, "node_id": ids[name], "slots_used": used,
                              "parts": report(name)}, node_auth[name])
        dt = time.monotonic() - t
        with lock:
            latencies.append(dt)
            if status != 200:
                errors.append(f"{name}: {status} {reply[:120]!r}")
            else:
                last_beat[name] = t + dt
                orders[name] = json.loads(reply).get("parts", [])

    def scheduler(pool):
        start = time.monotonic()
        nxt = {n: start + heartbeat_s * i / a.nodes for i, n in enumerate(names)}
        while not stop.is_set():
            now = time.monotonic()
            for n in names:
                if n not in silent and nxt[n] <= now:
                    nxt[n] += heartbeat_s
                    pool.submit(beat, n)
            stop.wait(0.01)

    pool = ThreadPoolExecutor(16)
    sched = threading.Thread(target=scheduler, args=(pool,), daemon=True)
    sched.start()
    time.sleep(heartbeat_s)  # let every node's schedule start before measuring
    c0, w0, n0 = cpu_seconds(a.pid), time.monotonic(), len(latencies)
    time.sleep(a.steady_s)
    c1, w1, n1 = cpu_seconds(a.pid), time.monotonic(), len(latencies)
    steady_lat = latencies[n0:n1]

    api(host, port, token, "POST", f"/v1/nodes/{listed[0]['name']}/drain")  # the master: none
    exp = experiments_phase(a, host, port, token)

    # 3. placement: a job holding every slot, --jobs queued behind it; once it is cancelled
    # (its parts end at their nodes' next heartbeats), how long until every queued job is placed
    blocker = api(host, port, token, "POST", "/v1/jobs", {
        "name": "blocker", "command": ["true"], "priority": 10,
        "resources": {"nnodes": a.nodes, "nproc_per_node": a.slots}})["id"]
    deadline = time.monotonic() + 60
    while api(host, port, token, "GET", f"/v1/jobs/{blocker}")["state"] != "running":
        if time.monotonic() > deadline:
            raise RuntimeError("the blocker job did not start")
        time.sleep(0.05)
    # mixed sizes: 60% 1 x 1, 20% 1 x 2, 15% 2 x 2, 5% 4 x 2 (2000 slots for 1000 jobs)
    sizes = [(1, 1)] * 12 + [(1, 2)] * 4 + [(2, 2)] * 3 + [(4, 2)]
    t = time.monotonic()
    for i in range(a.jobs):
        nn, g = sizes[i % len(sizes)]
        api(host, port, token, "POST", "/v1/jobs", {
            "name": f"j{i}", "command": ["true"],
            "resources": {"nnodes": nn, "nproc_per_node": g}})
    submit_s = time.monotonic() - t
    api(host, port, token, "POST", f"/v1/jobs/{blocker}/cancel")
    t_free = time.monotonic()
    queued = a.jobs
    deadline = t_free + 120
    while queued and time.monotonic() < deadline:
        queued = count_jobs(host, port, token, "queued")
        if queued:
            time.sleep(0.02)
    place_s = time.monotonic() - t_free
    running = count_jobs(host, port, token, "running")

    # 4. a.lose nodes go silent at once; how long after its last heartbeat is each listed lost
    # nodes that run parts: their jobs' attempts end when they are lost
    busy = [n for n in names if orders[n]]
    lost_names = (busy + [n for n in names if n not in busy])[:a.lose]
    lost_jobs = {o["job"] for n in lost_names for o in orders[n]}
    with lock:
        silent.update(lost_names)
    time.sleep(0.5)  # a heartbeat already submitted may still land
    seen = {}
    deadline = time.monotonic() + 60
    while len(seen) < len(lost_names) and time.monotonic() < deadline:
        now = time.monotonic()
        for n in get_nodes(host, port, token):
            if n["name"] in lost_names and n["state"] == "lost" and n["name"] not in seen:
                seen[n["name"]] = now
        time.sleep(0.05)
    # handled: every job that had a part on them is no longer running its attempt there
    handled_at = None
    while time.monotonic() < deadline:
        states = [api(host, port, token, "GET", f"/v1/jobs/{j}") for j in lost_jobs]
        if all(not any(p["node"] in lost_names and p["state"] != "ended"
                       for p in ((s.get("placement") or {}).get("nodes") or []))
               or s["state"] != "running" for s in states):
            handled_at = time.monotonic()
            break
        time.sleep(0.05)
    stop.set()
    pool.shutdown(wait=True)
    detect = [seen[n] - last_beat[n] for n in lost_names if n in seen and n in last_beat]
    first_silent = min(last_beat[n] for n in lost_names if n in last_beat)
    listed = get_nodes(host, port, token)
    print(json.dumps({
        "nodes": a.nodes, "slots_per_node": a.slots, "heartbeat_s": heartbeat_s,
        "timeout_s": replies[0]["timeout_s"],
        "register_all_s": round(registered_s, 3),
        "steady_heartbeats_per_s": round((n1 - n0) / (w1 - w0), 1),
        "master_cpu_percent": round(100 * (c1 - c0) / (w1 - w0), 2),
        "heartbeat_ms_p50": round(1000 * percentile(steady_lat, 50), 2),
        "heartbeat_ms_p99": round(1000 * percentile(steady_lat, 99), 2),
        "heartbeat_errors": len(errors), "first_errors": errors[:3],
        "lost_detected": len(seen), "lost_expected": len(lost_names),
        "detect_s_min": round(min(detect), 2) if detect else None,
        "detect_s_max": round(max(detect), 2) if detect else None,
        "ready_after": sum(1 for n in listed if n["state"] == "ready"),
        "jobs": a.jobs, "submit_all_s": round(submit_s, 2),
        "place_all_s": round(place_s, 3), "placed": running, "left_queued": queued,
        "jobs_on_lost_nodes": len(lost_jobs),
        "lost_handled_s": round(handled_at - first_silent, 2) if handled_at else None,
        **exp,
    }))


if __name__ == "__main__":
    main()
