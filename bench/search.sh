#!/bin/sh
# ASHA against random search on the same budget and seed: LeNet-5 on Fashion-MNIST
# (examples/fmnist-asha.json: 16 draws of the learning rate and momentum, 3 epochs = 2,814 steps a
# full trial, 2 trials at a time on a daemon of 2 slots). The random search trains each draw for
# the whole 2,814 steps; ASHA (reduction factor 4, 3 rungs: steps 175, 703, 2814) stops the
# worse three quarters of each rung. Reports, for each: the wall time until some trial's val_acc
# first reached TARGET (0.88) as the daemon read it, the time to the experiment's end, the steps
# trained in all, and the best val_acc with its trial; then ASHA / random. Then PBT
# (examples/fmnist-pbt.json) with a population of as many trials, each trained the whole 2,814
# steps (the random search's budget), in generations of 469 steps (half an epoch), the worst
# quarter taking the best quarter's checkpoints and perturbed values at each generation's end.
#   bench/search.sh [BUILD_DIR]      TARGET=0.88 TRIALS=16 CONCURRENT=2 PROMOTION=async
# Needs Debian's dataset-fashion-mnist. Only loopback traffic.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
tmp=$(mktemp -d)
chmod 755 "$tmp" # jobs run as uids of their own: they pass through it to their directories
pid=""
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
. "$here/traind_start.sh"
start_traind "$tmp/daemon.err" --listen 127.0.0.1:0 --state-dir "$tmp/state" \
    --slots "${CONCURRENT:-2}" --data-root /usr/share/datasets
pid=$traind_pid url=$traind_url
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(getconf _NPROCESSORS_ONLN) cores"
/usr/bin/python3 - "$url" "$tmp/state/token" "$here/../examples/fmnist-asha.json" \
    "$here/../examples/fmnist-pbt.json" \
    "${TARGET:-0.88}" "${TRIALS:-16}" "${CONCURRENT:-2}" "${PROMOTION:-async}" <<'PY'
import json, sys, time, urllib.request

url, token_file, example, pbt_example, target, trials, concurrent, promotion = sys.argv[1:]
target, trials, concurrent = float(target), int(trials), int(concurrent)
token = open(token_file).read().strip()


def call(method, path, body=None):
    req = urllib.request.Request(url.rstrip("/") + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)


def run(kind):
    body = json.load(open(pbt_example if kind == "pbt" else example))
    body["name"] = f"bench-{kind}"
    body["max_concurrent"] = concurrent
    s = body["searcher"]
    if kind == "pbt":  # a population of as many trials: the random search's budget of steps
        s["population"] = trials
    else:
        s["max_trials"] = trials
    if kind == "random":
        body["job"]["train"]["max_steps"] = s["max_steps"]
        body["searcher"] = {k: s[k] for k in ("type", "metric", "mode", "max_trials")}
        body["searcher"]["type"] = "random"
    elif kind == "asha":
        s["promotion"] = promotion
    t0 = time.monotonic()
    eid = call("POST", "/v1/experiments", body)["id"]
    reached = None
    while True:  # the experiment's best, polled twice a second (the daemon's own reading)
        x = call("GET", f"/v1/experiments/{eid}")
        best = x["best"]
        if reached is None and best and best["value"] >= target:
            reached = time.monotonic() - t0
        if x["state"] not in ("running", "paused"):
            break
        time.sleep(0.5)
    total = time.monotonic() - t0
    if not best:
        sys.exit(f"bench: the {kind} search found no best: {x['reason']}; trial 0: "
                 f"{x['trials'][0]['reason']}")
    steps = sum(t["steps"] for t in x["trials"])
    return {"reached": reached, "total": total, "steps": steps, "best": best,
            "rungs": [t.get("rung") for t in x["trials"]],
            "exploits": sum(t.get("exploits", 0) for t in x["trials"])}


res = {k: run(k) for k in ("random", "asha", "pbt")}
fmt = lambda v: "never" if v is None else f"{v:.1f} s"  # noqa: E731
print(f"{'searcher':10} {'to val_acc ' + str(target):>18} {'to the end':>12} {'steps':>8}  best")
for k, r in res.items():
    b = r["best"]
    print(f"{k:10} {fmt(r['reached']):>18} {fmt(r['total']):>12} {r['steps']:>8}  "
          f"{b['value']:.4f} (trial {b['trial']})")
a, r = res["asha"], res["random"]
ratio = lambda x, y: "-" if x is None or y is None else f"{x / y:.2f}"  # noqa: E731
print(f"asha / random: to {target}: {ratio(a['reached'], r['reached'])}, to the end: "
      f"{ratio(a['total'], r['total'])}, steps: {ratio(a['steps'], r['steps'])}")
print("asha's trials by rung:", {k: a["rungs"].count(k) for k in sorted(set(a["rungs"]))})
p = res["pbt"]
print(f"pbt / random: to {target}: {ratio(p['reached'], r['reached'])}, to the end: "
      f"{ratio(p['total'], r['total'])}, steps: {ratio(p['steps'], r['steps'])}; "
      f"pbt's exploits: {p['exploits']}")
PY
