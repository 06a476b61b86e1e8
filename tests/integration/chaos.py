#!/usr/bin/python3
"""Chaos over a cluster (issue 21): three nodes made of network namespaces (tests/integration/
netns.sh, as cluster_jobs.sh builds them: a master m0 and agents n1, n2, two CPU slots each) run
multi-node and single-node training jobs while a seeded schedule, at random moments, kills a
random rank, agent or master (SIGKILL), stops a rank (SIGSTOP) for longer than the collective
timeout, takes a node's link down and up, and restarts daemons (SIGTERM with keep_jobs_on_stop).
After the storm it checks what must hold whatever happened:

  states       every job ends as its restart policy dictates: for each job the test counts the
               events that could have cost it an attempt ("may": a rank of it killed or stopped,
               a node it ran on cut off or its traind away for long) and those that must have
               (a rank of its running attempt killed). A job whose max_restarts covers every "may"
               succeeds; one with more "must" attempts than restarts fails; in between either,
               and a failed job has used its whole budget and says why. No job restarts more
               often than its "may" count: kill -9 or a restart of a traind (agent or master)
               costs no attempt (re-attach, or a recovery not counted).
  steps        /metrics has each logged train step once, with no gap, up to max_steps for a job
               that succeeded; the event log's ids run 1..N, and within each attempt the train
               steps run on from the step it resumed at, none repeated and none missing.
  checkpoints  every checkpoint GET /checkpoints lists downloads; each file's SHA-256 equals
               that of the same file in the checkpoint's .tar and of the copy on the node whose
               rank 0 wrote it (the API lists sizes, not digests); safetensors headers and sizes,
               the listed sizes and state.json's step are sound; the newest of each job loads in
               traind-worker (resume_from).
  leftovers    no process of any job is left in any namespace (ip netns pids) once the jobs
               have ended, and nothing at all once the daemons have stopped.
  database     every node's state.db passes PRAGMA integrity_check and foreign_key_check after
               the daemons stopped (each exits 0), and agrees with what the API said.

The collective timeout is traind-worker's TRAIND_TIMEOUT_S, which the daemons pass on to their
jobs from their own environment (5 s here; the node timeout 4 s). --hung-peer first runs the
hung-peer case on a calm cluster: rank 2 of a 2 x 2 job (the second node's leader) is stopped
while the job trains; the job must fail after the collective timeout and within it plus the grace
period and slack (no hang), its reason naming rank 2 with its host (node) and pid.

It prints the seed, the schedule (planned, then each event as done) and each invariant held.
Waits are for observable events with deadlines (the API, /proc); the only timed pauses are the
schedule's own moments and durations. Everything it makes (namespaces, bridge, processes,
files) goes on exit, also on failure. Only addresses inside the namespaces are used.

  chaos.py TRAIND WORKER SOURCE_DIR [--seed S] [--storm-s N] [--hung-peer] [--keep DIR]
Exit 0: every invariant held; 1: one did not; 77: skipped (not root, no namespaces).
TRAIND_TEST_SLOW=1 (the sanitizer build) lengthens the timeouts and shortens the jobs.
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NETNS_SH = os.path.join(HERE, "netns.sh")
FMNIST = "/usr/share/datasets/fashion-mnist"
NODES = ["m0", "n1", "n2"]
PORT = 8470
NET = "10.231.13"  # exists only inside the namespaces this test makes
FINAL = ("succeeded", "failed", "cancelled")


def log(msg):
    print(msg, flush=True)


class Checks:
    """The invariants: each one held or failed, counted and printed as it is decided."""

    def __init__(self):
        self.held = 0
        self.failed = 0

    def check(self, cond, what, detail=""):
        if cond:
            self.held += 1
            log("  held: " + what)
        else:
            self.failed += 1
            log("FAIL: " + what + (": " + detail if detail else ""))
        return cond


def until(seconds, fn, every=0.2):
    """fn() until it returns something true, at most `seconds`: that value, else None."""
    end = time.monotonic() + seconds
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() >= end:
            return None
        time.sleep(every)


# ---- the checkpoint format, read independently of the worker ---------------------------------

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
              "U8": 1, "BOOL": 1}


def safetensors_problem(data):
    """None when data is a sound safetensors file: the header parses, every tensor's bytes are
    its dtype's size times its shape, the tensors tile the data area exactly."""
    if len(data) < 8:
        return "shorter than its 8-byte header length"
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        return "header of %d bytes in a file of %d" % (n, len(data))
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        return "header is not JSON: %s" % e
    spans = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        size = DTYPE_SIZE.get(t.get("dtype"))
        if size is None:
            return "%s: dtype %r" % (name, t.get("dtype"))
        count = 1
        for d in t.get("shape", []):
            count *= d
        a, b = t.get("data_offsets", [0, -1])
        if b - a != count * size:
            return "%s: %d bytes for shape %s of %s" % (name, b - a, t.get("shape"), t["dtype"])
        spans.append((a, b))
    spans.sort()
    at = 0
    for a, b in spans:
        if a != at:
            return "tensor data at %d, expected %d" % (a, at)
        at = b
    if 8 + n + at != len(data):
        return "tensors end at %d, the file at %d" % (8 + n + at, len(data))
    return None


# ---- what the step invariants check, on plain data ---------------------------------------------

def steps_problem(steps, every, last=None):
    """None when steps are every, 2 every, ... each once (up to last when given), else why."""
    top = steps[-1] if steps else 0
    if last is not None and top != last:
        return "the last train step is %d, not %d" % (top, last)
    want = list(range(every, top + 1, every))
    if steps == want:
        return None
    twice = sorted({s for s in steps if steps.count(s) > 1})
    missing = sorted(set(want) - set(steps))
    return "twice: %s; missing: %s; order: %s" % (twice[:10], missing[:10],
                                                   "ok" if steps == sorted(steps) else "not sorted")


def ids_problem(ids):
    """None when the event ids run 1..N."""
    return None if ids == list(range(1, len(ids) + 1)) else "ids %s" % ids


def attempts_problem(events, every):
    """None when, within each attempt (split at its restart events), the train steps run on from
    the step it resumed at, each once and none missing, else the attempts at fault."""
    runs, resume, cur = [], 0, []
    for e in events:
        if e.get("event") == "restart":
            runs.append((resume, cur))
            r = e["data"].get("resume_from")
            resume, cur = (r["step"] if r else 0), []
        elif e.get("event") == "train":
            cur.append(e["data"]["step"])
    runs.append((resume, cur))
    bad = [(r, s) for r, s in runs
           if s != list(range(r + every, r + every * (len(s) + 1), every))]
    return (len(runs), "attempts (resume step, steps): %s" % bad if bad else None)


def self_test():
    """The checkers must be able to fail: each is shown what it exists to catch."""
    def train(*steps):
        return [{"event": "train", "data": {"step": x}} for x in steps]

    restart = [{"event": "restart", "data": {"resume_from": {"step": 100}}}]
    cases = [
        ("a duplicated metric step", steps_problem([50, 100, 100, 150], 50)),
        ("a missing metric step", steps_problem([50, 150], 50)),
        ("a job short of its last step", steps_problem([50, 100], 50, last=150)),
        ("event ids with a gap", ids_problem([1, 2, 4])),
        ("an event id twice", ids_problem([1, 2, 2, 3])),
        ("a line handled twice in an attempt", attempts_problem(train(50, 100, 100), 50)[1]),
        ("a line lost in an attempt", attempts_problem(train(50, 150), 50)[1]),
        ("an attempt not starting at its resume step",
         attempts_problem(train(50, 100, 150) + restart + train(50, 100), 50)[1]),
        ("a cut safetensors file", safetensors_problem(
            struct.pack("<Q", 2) + b"{}" + b"x" + b"")),
        ("a tensor shorter than its shape", safetensors_problem(
            struct.pack("<Q", 60) + json.dumps({"w": {"dtype": "F32", "shape": [2],
                                                      "data_offsets": [0, 4]}}).encode().ljust(60)
            + b"\0" * 4)),
    ]
    clean = [steps_problem([50, 100, 150], 50, last=150), ids_problem([1, 2, 3]),
             attempts_problem(train(50, 100, 150) + restart + train(150, 200), 50)[1],
             safetensors_problem(struct.pack("<Q", 64) + json.dumps(
                 {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode().ljust(64)
                 + b"\0" * 8)]
    missed = [what for what, problem in cases if not problem]
    wrong = [c for c in clean if c]
    if missed or wrong:
        raise AssertionError("the invariant checkers miss %s, or flag sound data: %s" % (
            missed, wrong))
    log("the checkers catch: " + ", ".join(what for what, _ in cases))


# ---- the cluster ------------------------------------------------------------------------------

class Cluster:
    def __init__(self, args, tmp):
        self.a = args
        self.tmp = tmp
        self.tag = "tx%d" % os.getpid()
        slow = bool(os.environ.get("TRAIND_TEST_SLOW"))
        # heartbeat and node timeout as cluster_jobs.sh; the collective timeout a little above
        # the node timeout, so a partition is the master's to detect first
        self.heartbeat = 1.0 if slow else 0.5
        self.node_timeout = 12.0 if slow else 4.0
        self.coll_timeout = 15 if slow else 5
        self.grace = 3
        self.slow = slow
        self.procs = {}  # node name -> Popen of its traind (None while it is down)
        self.errlog = {}  # node name -> its traind's current log
        self.starts = {n: 0 for n in NODES}
        self.link_down = set()
        self.secret = os.path.join(tmp, "secret")
        with open(self.secret, "w") as f:
            f.write(os.urandom(24).hex())
        os.chmod(self.secret, 0o600)
        self.token = None

    def netns(self, func, *args):
        return subprocess.run(["sh", "-c", '. "$0"; "$@"', NETNS_SH, func] + list(args)).returncode

    def up(self):
        # netns_hosts prints the shell tests' SKIP (and why) or FAIL line and exits 77 or 1
        rc = self.netns("netns_hosts", self.tag, NET, "3", "the three nodes' namespaces",
                        os.path.join(self.tmp, "netns.err"))
        if rc != 0:
            sys.exit(rc)
        self.ns_ino = {k: os.stat("/run/netns/%s-n%d" % (self.tag, k)).st_ino for k in range(3)}

    def down(self):
        self.netns("netns_down", self.tag, "3")
        for p in self.procs.values():
            if p:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    # -- daemons --

    def start(self, k):
        """traind of node k in its namespace with its own /dev/shm and hostname, as
        cluster_jobs.sh starts them: each step execs the next, so the pid is traind's own."""
        name = NODES[k]
        self.starts[name] += 1
        errlog = os.path.join(self.tmp, "%s-%d.err" % (name, self.starts[name]))
        args = [self.a.traind, "--config", "", "--listen", "%s.%d:%d" % (NET, k + 1, PORT),
                "--state-dir", os.path.join(self.tmp, "state-" + name), "--node-name", name,
                "--worker", self.a.worker, "--slots", "2", "--data-root", FMNIST,
                "--data-root", self.tmp, "--grace", str(self.grace), "--keep-jobs-on-stop", "true",
                "--cluster-secret-file", self.secret, "--insecure-cluster", "true"]
        if k == 0:
            args += ["--heartbeat", str(self.heartbeat), "--node-timeout", str(self.node_timeout)]
        else:
            args += ["--join", "%s.1:%d" % (NET, PORT)]
        cmd = ["ip", "netns", "exec", "%s-n%d" % (self.tag, k), "unshare", "--mount", "--uts",
               "--propagation", "private", "sh", "-c",
               'hostname "$1" && mount -t tmpfs -o size=256m tmpfs /dev/shm || exit 90; shift; '
               'exec env "$@"', "sh", name, "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1",
               "TRAIND_TIMEOUT_S=%d" % self.coll_timeout] + args
        with open(errlog, "w") as err, open(os.devnull, "w") as out:
            self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=err,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.errlog[name] = errlog
        return self.procs[name]

    def listening(self, name):
        try:
            with open(self.errlog[name]) as f:
                return "listening on" in f.read()
        except OSError:
            return False

    def reap(self, name):
        p = self.procs.get(name)
        if p:
            p.wait()
        self.procs[name] = None

    # -- the master's API, from the master's namespace --

    def api(self, method, path, body=None, out=None, timeout=10):
        """(HTTP status, body bytes); status 0 when no answer came (the master is down)."""
        if self.token is None:
            try:
                with open(os.path.join(self.tmp, "state-m0", "token")) as f:
                    self.token = f.read().strip()
            except OSError:
                return 0, b""
        cmd = ["ip", "netns", "exec", "%s-n0" % self.tag, "curl", "-s", "--max-time",
               str(timeout), "-X", method, "-H", "Authorization: Bearer " + self.token,
               "-o", out if out else "-", "-w", "\n%{http_code}"]
        if body is not None:
            cmd += ["--data-binary", "@-"]
        cmd.append("http://%s.1:%d%s" % (NET, PORT, path))
        r = subprocess.run(cmd, input=body, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        text, _, code = r.stdout.rpartition(b"\n")
        try:
            return int(code), text
        except ValueError:
            return 0, b""

    def get_json(self, path):
        status, body = self.api("GET", path)
        if status != 200:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None

    def nodes_ready(self, n=3):
        nodes = self.get_json("/v1/nodes")
        return nodes and sum(1 for x in nodes["nodes"] if x["state"] == "ready") == n

    # -- processes, by namespace (what `ip netns pids` lists), from /proc --

    def ns_pids(self, k):
        r = subprocess.run(["ip", "netns", "pids", "%s-n%d" % (self.tag, k)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return [int(x) for x in r.stdout.split()]

    def scan(self):
        """Every process in the nodes' namespaces that belongs to a job: dicts with pid, node,
        job, rank, attempt, exe (the program's name), state (R, S, T ...)."""
        found = []
        ino_to_k = {v: k for k, v in self.ns_ino.items()}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                k = ino_to_k.get(os.stat("/proc/%s/ns/net" % d).st_ino)
                if k is None:
                    continue
                with open("/proc/%s/environ" % d, "rb") as f:
                    env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
                if b"TRAIND_JOB_ID" not in env:
                    continue
                with open("/proc/%s/stat" % d) as f:
                    stat = f.read()
                state = stat[stat.rindex(")") + 2]
                # the program (the shepherd starts workers through a descriptor: comm says "exe")
                exe = os.path.basename(os.readlink("/proc/%s/exe" % d))
            except (OSError, ValueError):
                continue  # gone meanwhile
            found.append({"pid": int(d), "node": NODES[k], "job": int(env[b"TRAIND_JOB_ID"]),
                          "rank": int(env.get(b"RANK", b"-1")),
                          "attempt": int(env.get(b"TORCHELASTIC_RESTART_COUNT", b"-1")),
                          "exe": exe, "state": state})
        return found


# ---- jobs -------------------------------------------------------------------------------------

def lenet(name, steps, every, ckpt, seed):
    return {"name": name, "model": {"preset": "lenet5", "num_classes": 10},
            "data": {"format": "idx", "train": {
                "images": FMNIST + "/train-images-idx3-ubyte.gz",
                "labels": FMNIST + "/train-labels-idx1-ubyte.gz"}},
            "train": {"epochs": 1000, "max_steps": steps, "batch_size": 32, "seed": seed,
                      "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9}},
            "checkpoint": {"every_steps": ckpt}, "log": {"every_steps": every}}


def mlp(name, steps, every, ckpt, seed):
    return {"name": name, "model": {"preset": "mlp", "hidden": [256, 256], "num_classes": 10},
            "data": {"format": "synthetic", "shape": [1, 16, 16], "num_classes": 10,
                     "size": 8192},
            "train": {"epochs": 1000, "max_steps": steps, "batch_size": 32, "seed": seed,
                      "optimizer": {"type": "adam", "lr": 0.001}},
            "checkpoint": {"every_steps": ckpt}, "log": {"every_steps": every}}


# The kinds of job the storm keeps running: (name, model, resources, max_restarts, weight).
# max_restarts 50 outlasts any storm here ("resilient": must succeed); 0 and 1 are meant to run
# out under a kill ("fragile").
TEMPLATES = [
    ("ddp2x2", lenet, {"nnodes": 2, "nproc_per_node": 2}, 50, 3),
    ("ddp3x1", mlp, {"nnodes": 3, "nproc_per_node": 1}, 50, 2),
    ("ddp2x1", mlp, {"nnodes": 2, "nproc_per_node": 1}, 1, 2),
    ("one2", lenet, {"nproc": 2}, 50, 2),
    ("one1", mlp, {"nproc": 1}, 0, 1),
    ("agent1", mlp, {"nnodes": 1, "nproc_per_node": 1}, 0, 1),  # pinned to an agent below
]


class Job:
    def __init__(self, jid, name, spec, template):
        self.id = jid
        self.name = name
        self.spec = spec
        self.template = template
        self.max_restarts = spec["restart"]["max_restarts"]
        self.steps = spec["train"]["max_steps"]
        self.every = spec["log"]["every_steps"]
        self.ckpt_every = spec["checkpoint"]["every_steps"]
        self.may = []  # events that could have cost it an attempt (words)
        self.must = {}  # attempt -> event that must have ended it
        self.seen = {}  # node -> [times its processes were seen there]
        self.final = None  # the job's JSON once final


class Chaos:
    def __init__(self, args, cluster, checks):
        self.a = args
        self.c = cluster
        self.checks = checks
        self.rng = random.Random(args.seed)
        self.jobs = {}  # id -> Job
        self.t0 = time.monotonic()
        self.windows = []  # (node, start, end, words): a node cut off or its traind away
        self.history = []
        self.jobs_state = {}  # id -> the job's JSON, as last seen
        slow = cluster.slow
        # steps of each kind: 10-30 s of training each here, undisturbed (fewer when slow)
        self.scale = 0.35 if slow else 1.0

    def el(self):
        return time.monotonic() - self.t0

    def say(self, msg):
        log("[%6.1f s] %s" % (self.el(), msg))

    # -- jobs --

    def new_job_spec(self, n):
        t = self.rng.choices(TEMPLATES, weights=[t[4] for t in TEMPLATES])[0]
        name, model, res, restarts, _ = t
        every = 50
        ckpt = 1000
        base = 6000 if model is lenet else 12000
        steps = int(base * self.scale * self.rng.uniform(0.7, 1.3)) // ckpt * ckpt or ckpt
        spec = model("chaos-%d-%s" % (n, name), steps, every, ckpt, self.rng.randrange(1000))
        spec["resources"] = dict(res)
        if name == "agent1":
            spec["resources"]["nodes"] = [self.rng.choice(["n1", "n2"])]
        spec["restart"] = {"max_restarts": restarts}
        return name, spec

    def submit(self, name, spec):
        status, body = self.c.api("POST", "/v1/jobs", json.dumps(spec).encode())
        if status != 201:
            return None
        jid = json.loads(body)["id"]
        self.jobs[jid] = Job(jid, spec["name"], spec, name)
        return jid

    def refresh(self):
        """The jobs' states from the API (None when the master does not answer)."""
        got = self.c.get_json("/v1/jobs?limit=500")
        if got is None:
            return None
        for j in got["jobs"]:
            if j["id"] in self.jobs:
                self.jobs_state[j["id"]] = j
        return got

    def active(self):
        return [jid for jid in self.jobs
                if self.jobs_state.get(jid, {}).get("state", "queued") not in FINAL]

    def observe(self):
        """Where each job's processes are now, for the windows of the events."""
        now = self.el()
        procs = self.c.scan()
        for p in procs:
            job = self.jobs.get(p["job"])
            if job:
                job.seen.setdefault(p["node"], []).append(now)
        return procs

    # -- the events --

    def ranks(self, procs):
        """Ranks that can be hit: workers of our jobs, running (not stopped)."""
        return sorted((p for p in procs if p["exe"] == "traind-worker" and p["state"] != "T"
                       and p["job"] in self.jobs), key=lambda p: (p["job"], p["rank"], p["pid"]))

    def running_attempt(self, jid):
        j = self.jobs_state.get(jid)
        if not j or j["state"] != "running":
            return None
        return len(j["attempts"]) - 1

    def ev_kill_rank(self, u, u2, pending):
        procs = self.ranks(self.observe())
        if not procs:
            return "kill -9 of a rank: no rank runs now (skipped)"
        p = procs[int(u * len(procs))]
        job = self.jobs[p["job"]]
        attempt = self.running_attempt(p["job"])
        try:
            os.kill(p["pid"], signal.SIGKILL)
        except ProcessLookupError:
            return "kill -9 of rank %d of job %d: it had ended (skipped)" % (p["rank"], job.id)
        words = "kill -9 of rank %d of job %d attempt %d (pid %d on %s)" % (
            p["rank"], job.id, p["attempt"], p["pid"], p["node"])
        job.may.append(words)
        if attempt is not None and attempt == p["attempt"]:
            job.must.setdefault(attempt, (p["rank"], words))
        return words

    def ev_stop_rank(self, u, u2, pending):
        procs = self.ranks(self.observe())
        if not procs:
            return "SIGSTOP of a rank: no rank runs now (skipped)"
        p = procs[int(u * len(procs))]
        job = self.jobs[p["job"]]
        try:
            os.kill(p["pid"], signal.SIGSTOP)
        except ProcessLookupError:
            return "SIGSTOP of rank %d of job %d: it had ended (skipped)" % (p["rank"], job.id)
        hold = self.c.coll_timeout + 1 + 2 * u2
        cont = u2 < 0.5
        words = "SIGSTOP of rank %d of job %d attempt %d (pid %d on %s) for %.1f s, then %s" % (
            p["rank"], job.id, p["attempt"], p["pid"], p["node"], hold,
            "SIGCONT" if cont else "left for the job's failure to kill")
        job.may.append(words)
        due = self.el() + hold
        if cont:
            pending.append((due, "SIGCONT of pid %d" % p["pid"], lambda: self.cont(p["pid"])))
        else:
            # its peers time out within the collective timeout; the attempt's end kills it (the
            # grace period's SIGKILL): it must be gone by then, unless it was the last of its
            # job to run (past its last collective: nobody waits for it)
            deadline = due + self.c.grace + 10 + (20 if self.c.slow else 0)
            pending.append((deadline, "is pid %d gone" % p["pid"],
                            lambda: self.stopped_gone(p, job)))
        return words

    def cont(self, pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        return "SIGCONT of pid %d" % pid

    def stopped_gone(self, p, job):
        procs = self.c.scan()
        if not any(q["pid"] == p["pid"] for q in procs):
            return "pid %d (rank %d of job %d, stopped) is gone: its attempt ended and killed it" % (
                p["pid"], p["rank"], job.id)
        others = [q for q in procs if q["job"] == job.id and q["pid"] != p["pid"]
                  and q["exe"] == "traind-worker" and q["attempt"] == p["attempt"]]
        self.checks.check(
            not others, "a rank stopped past the collective timeout is noticed by its peers",
            "rank %d of job %d still stopped %.0f s later while ranks %s of its attempt run" % (
                p["rank"], job.id, self.c.coll_timeout + self.c.grace + 10,
                [q["rank"] for q in others]))
        self.cont(p["pid"])
        return "pid %d (rank %d of job %d) was still stopped, its peers %s: SIGCONT" % (
            p["pid"], p["rank"], job.id, "done" if not others else "still running")

    def ev_link(self, u, u2, pending):
        k = int(u * 3)
        name = NODES[k]
        if name in self.c.link_down:
            return "link of %s: already down (skipped)" % name
        if u2 < 0.5:
            hold = 0.5 + 3 * u2  # shorter than the node timeout: a blip
        else:
            hold = self.c.node_timeout + 1 + 4 * (u2 - 0.5)  # lost
        subprocess.run(["ip", "-n", "%s-n%d" % (self.c.tag, k), "link", "set", "eth0", "down"],
                       check=True)
        self.c.link_down.add(name)
        start = self.el()
        words = "link of %s down for %.1f s" % (name, hold)

        def back():
            subprocess.run(["ip", "-n", "%s-n%d" % (self.c.tag, k), "link", "set", "eth0", "up"],
                           check=True)
            self.c.link_down.discard(name)
            self.window(name, start, self.el(), words)
            return "link of %s up" % name

        pending.append((start + hold, "link of %s up" % name, back))
        return words

    def window(self, node, start, end, words):
        """A node cut off, or its traind away, over [start, end]: any job that ran there then
        may lose its attempt, noticed up to the timeouts and the grace period later (every job
        with processes on an agent, when the node is the master's)."""
        settle = self.c.node_timeout + self.c.coll_timeout + self.c.grace + 3
        self.windows.append((node, start - 1, end + settle, words))

    def ev_kill_daemon(self, u, u2, pending):
        name = NODES[0] if u < 0.3 else NODES[1 + int((u - 0.3) / 0.7 * 2)]
        p = self.c.procs.get(name)
        if p is None or p.poll() is not None:
            return "kill -9 of %s's traind: it is down already (skipped)" % name
        os.kill(p.pid, signal.SIGKILL)
        self.c.reap(name)
        start = self.el()
        # an agent comes back within the node timeout (its parts re-attach: nothing lost); the
        # master may stay away longer (its agents stop their parts; it recovers the jobs
        # without charging them)
        if name == "m0":
            away = 0.3 + (self.c.node_timeout + 2) * u2
        else:
            away = 0.2 + 1.3 * u2
        words = "kill -9 of %s's traind (pid %d), back after %.1f s" % (name, p.pid, away)

        def back():
            self.c.start(NODES.index(name))
            pending.append((self.el(), "%s listening" % name, lambda: self.came_back(
                name, start, words, pending)))
            return "%s's traind started again" % name

        pending.append((start + away, "start %s's traind" % name, back))
        return words

    def came_back(self, name, start, words, pending):
        """Whether the restarted traind came back in time for its parts; an agent away longer
        than the node timeout (a slow start) may cost its jobs an attempt like a partition."""
        if not self.c.listening(name):
            if self.el() - start > 60:
                self.checks.check(False, "%s's traind starts again" % name,
                                  open(self.c.errlog[name]).read()[-2000:])
                return "%s did not start" % name
            pending.append((self.el() + 0.2, "%s listening" % name,
                            lambda: self.came_back(name, start, words, pending)))
            return None
        away = self.el() - start
        if name != "m0" and away > self.c.node_timeout - 1.5:
            self.window(name, start, self.el(), words + " (away %.1f s)" % away)
        return "%s's traind listens again, %.1f s after it went" % (name, away)

    def ev_restart_daemon(self, u, u2, pending):
        name = NODES[int(u * 3)]
        p = self.c.procs.get(name)
        if p is None or p.poll() is not None:
            return "restart of %s's traind: it is down (skipped)" % name
        os.kill(p.pid, signal.SIGTERM)
        start = self.el()
        words = "SIGTERM of %s's traind (pid %d; keep_jobs_on_stop), started again once it " \
                "exits" % (name, p.pid)

        def exited():
            if p.poll() is None:
                if self.el() - start > 30:
                    self.checks.check(False, "%s's traind stops on SIGTERM within 30 s" % name)
                    os.kill(p.pid, signal.SIGKILL)
                pending.append((self.el() + 0.1, "%s exited" % name, exited))
                return None
            code = p.returncode
            self.checks.check(code == 0, "%s's traind exits 0 on SIGTERM" % name,
                              "exit status %s: %s" % (code, open(self.c.errlog[name]).read()[-2000:]))
            self.c.reap(name)
            self.c.start(NODES.index(name))
            pending.append((self.el(), "%s listening" % name,
                            lambda: self.came_back(name, start, words, pending)))
            return "%s's traind exited (%d) after %.1f s; started again" % (
                name, code, self.el() - start)

        pending.append((start + 0.1, "%s exited" % name, exited))
        return words

    KINDS = [("kill-rank", "ev_kill_rank", 3), ("stop-rank", "ev_stop_rank", 2),
             ("link", "ev_link", 2), ("kill-daemon", "ev_kill_daemon", 3),
             ("restart-daemon", "ev_restart_daemon", 2)]

    def plan(self, storm_s):
        events, t = [], 4.0 + 3 * self.rng.random()
        while t < storm_s:
            kind = self.rng.choices(self.KINDS, weights=[k[2] for k in self.KINDS])[0]
            events.append((t, kind[0], kind[1], self.rng.random(), self.rng.random()))
            t += self.rng.uniform(3.0, 7.0) * (2 if self.c.slow else 1)
        return events

    # -- the storm --

    def storm(self):
        storm_s = self.a.storm_s
        events = self.plan(storm_s)
        log("schedule (seed %d, %d events over %d s; targets are drawn when each happens):" % (
            self.a.seed, len(events), storm_s))
        for t, kind, _, u, u2 in events:
            log("  at %5.1f s  %-15s u=%.3f u2=%.3f" % (t, kind, u, u2))
        self.t0 = time.monotonic()
        pending = []  # (due, what, fn): the second halves of events, and follow-ups
        nxt, n_jobs = 0, 0
        concurrent = 3
        while True:
            now = self.el()
            storming = now < storm_s
            if storming and self.refresh() is not None:
                while len(self.active()) < concurrent:
                    n_jobs += 1
                    name, spec = self.new_job_spec(n_jobs)
                    jid = self.submit(name, spec)
                    if jid is None:
                        break
                    self.say("submitted job %d: %s, %s, %d steps, max_restarts %d" % (
                        jid, name, json.dumps(spec["resources"]), spec["train"]["max_steps"],
                        spec["restart"]["max_restarts"]))
                    self.jobs_state[jid] = {"state": "queued"}
            else:
                self.refresh()
            self.observe()
            pending.sort(key=lambda x: x[0])
            while pending and pending[0][0] <= self.el():
                _, what, fn = pending.pop(0)
                words = fn()
                if words:
                    self.say("  " + words)
            if nxt < len(events) and events[nxt][0] <= self.el():
                t, kind, method, u, u2 = events[nxt]
                nxt += 1
                words = getattr(self, method)(u, u2, pending)
                self.history.append((self.el(), kind, words))
                self.say(words)
            if not storming and nxt >= len(events) and not pending:
                break
            wake = [storm_s] if storming else []
            wake += [e[0] for e in events[nxt:nxt + 1]] + [p[0] for p in pending]
            time.sleep(max(0.0, min([0.3] + [w - self.el() for w in wake])))
        self.say("the storm is over: %d events, %d jobs submitted" % (len(self.history),
                                                                       len(self.jobs)))

    def drain(self):
        limit = 600 if self.c.slow else 240
        ended = until(limit, lambda: self.refresh() is not None and not self.active(), every=0.5)
        if not self.checks.check(ended, "every job reaches a final state within %d s" % limit,
                                 " ".join("%d:%s" % (j, self.jobs_state.get(j, {}).get("state"))
                                          for j in self.active())):
            for jid in self.active():
                log(json.dumps(self.jobs_state.get(jid)))
                self.c.api("POST", "/v1/jobs/%d/cancel" % jid)
            self.refresh()
        self.say("drained")
        for jid, job in self.jobs.items():
            job.final = self.c.get_json("/v1/jobs/%d" % jid) or self.jobs_state.get(jid)

    # -- the invariants --

    def may_count(self, job):
        """The events that could have cost the job an attempt: its own ranks hit, and the
        windows of a node it ran on (any agent, for the master's)."""
        words = list(job.may)
        for node, a, b, w in self.windows:
            on = [n for n in NODES if n != "m0"] if node == "m0" else [node]
            if any(a <= t <= b for n in on for t in job.seen.get(n, [])):
                words.append(w)
        return words

    def check_states(self):
        log("invariant: every job ends in the state its policy dictates")
        for jid, job in sorted(self.jobs.items()):
            j = job.final
            may = self.may_count(job)
            must = len(job.must)
            state, restarts = j["state"], j["restarts"]
            if job.max_restarts >= len(may):
                want, why = {"succeeded"}, "max_restarts %d covers the %d events that hit it" % (
                    job.max_restarts, len(may))
            elif must > job.max_restarts:
                want, why = {"failed"}, "%d of its attempts were killed, max_restarts %d" % (
                    must, job.max_restarts)
            else:
                want, why = {"succeeded", "failed"}, "%d events may have cost an attempt, " \
                    "%d must have, max_restarts %d" % (len(may), must, job.max_restarts)
            detail = "state %s, restarts %d, reason %r; events: %s; attempts: %s" % (
                state, restarts, j.get("reason"), may,
                [(a["attempt"], a.get("reason")) for a in j["attempts"]])
            self.checks.check(state in want, "job %d (%s) %s: %s" % (jid, job.template, state, why),
                              detail)
            self.checks.check(restarts <= len(may), "job %d restarted %d times, no more than the "
                              "%d events that could cost it" % (jid, restarts, len(may)), detail)
            if state == "failed":
                self.checks.check(restarts == job.max_restarts and j.get("reason"),
                                  "job %d failed only with its budget spent, saying why" % jid,
                                  detail)
            for attempt, (rank, words) in job.must.items():
                if state == "failed" and attempt == len(j["attempts"]) - 1:
                    self.checks.check("rank %d" % rank in (j.get("reason") or ""),
                                      "job %d's reason names rank %d, killed" % (jid, rank), detail)

    def events_of(self, jid):
        status, body = self.c.api("GET", "/v1/jobs/%d/events" % jid, timeout=30)
        events, cur = [], {}
        for line in body.decode(errors="replace").split("\n"):
            if not line:
                if cur:
                    events.append(cur)
                cur = {}
            elif line.startswith("id: "):
                cur["id"] = int(line[4:])
            elif line.startswith("event: "):
                cur["event"] = line[7:]
            elif line.startswith("data: "):
                cur["data"] = json.loads(line[6:])
        if cur:
            events.append(cur)
        return status, events

    def check_steps(self):
        log("invariant: metric steps without gap or duplicate")
        for jid, job in sorted(self.jobs.items()):
            j = job.final
            metrics = self.c.get_json("/v1/jobs/%d/metrics" % jid) or []
            steps = [m["step"] for m in metrics if m["event"] == "train"]
            top = steps[-1] if steps else 0
            self.checks.check(not steps_problem(steps, job.every), "job %d: /metrics has train "
                              "steps %d..%d every %d, each once" % (jid, job.every, top, job.every),
                              steps_problem(steps, job.every))
            if j["state"] == "succeeded":
                done = [m for m in metrics if m["event"] == "done"]
                self.checks.check(not steps_problem(steps, job.every, job.steps) and done,
                                  "job %d succeeded with its train steps up to %d and a done "
                                  "line" % (jid, job.steps), "last %d, done %s" % (top, done))
            status, events = self.events_of(jid)
            ids = [e.get("id") for e in events]
            self.checks.check(status == 200 and not ids_problem(ids), "job %d: event ids 1..%d, "
                              "none missing or twice" % (jid, len(ids)),
                              "status %d, %s" % (status, ids_problem(ids)))
            runs, bad = attempts_problem(events, job.every)
            self.checks.check(not bad, "job %d: in each of its %d attempts the train steps run on "
                              "from its resume step, none repeated or missing" % (jid, runs), bad)

    def writer_copy(self, jid, step, events):
        """The node whose rank 0 wrote the checkpoint of `step`: the latest placement before its
        checkpoint event (the master itself for a job that ran there alone)."""
        node = "m0"
        for e in events:
            if e.get("event") == "placement":
                node = e["data"]["nodes"][0]["node"]
            elif e.get("event") == "state" and e["data"].get("state") == "running":
                node = "m0"  # a placement event follows for a job across nodes
            elif e.get("event") == "checkpoint" and e["data"].get("step") == step:
                return node
        return None

    def check_checkpoints(self):
        log("invariant: every listed checkpoint downloads, matches its SHA-256 and loads")
        dl = os.path.join(self.c.tmp, "downloads")
        os.makedirs(dl, exist_ok=True)
        for jid, job in sorted(self.jobs.items()):
            listed = self.c.get_json("/v1/jobs/%d/checkpoints" % jid)
            if not self.checks.check(listed is not None, "job %d: its checkpoints are listed" % jid):
                continue
            _, events = self.events_of(jid)
            problems, n_files, compared, newest = [], 0, 0, None
            for ck in listed:
                step = ck["step"]
                if step % job.ckpt_every != 0 and step != job.steps:
                    problems.append("step %d is not a checkpoint step" % step)
                if not ck["on_disk"]:
                    continue
                where = os.path.join(dl, "%d-%d" % (jid, step))
                os.makedirs(where, exist_ok=True)
                tar_path = where + ".tar"
                status, _ = self.c.api("GET", ck["archive_url"], out=tar_path, timeout=60)
                in_tar = {}
                if status == 200:
                    with tarfile.open(tar_path) as tf:
                        for m in tf.getmembers():
                            if m.isfile():
                                in_tar[m.name.split("/", 1)[-1]] = hashlib.sha256(
                                    tf.extractfile(m).read()).hexdigest()
                else:
                    problems.append("step %d: its .tar answered %d" % (step, status))
                writer = self.writer_copy(jid, step, events)
                total = 0
                for f in ck["files"]:
                    path = os.path.join(where, f["name"])
                    status, _ = self.c.api("GET", f["url"], out=path, timeout=60)
                    if status != 200:
                        problems.append("step %d %s: GET answered %d" % (step, f["name"], status))
                        continue
                    n_files += 1
                    with open(path, "rb") as fh:
                        data = fh.read()
                    total += len(data)
                    digest = hashlib.sha256(data).hexdigest()
                    if len(data) != f["size"]:
                        problems.append("step %d %s: %d bytes, listed %d" % (
                            step, f["name"], len(data), f["size"]))
                    if in_tar.get(f["name"]) != digest:
                        problems.append("step %d %s: SHA-256 %s, in the .tar %s" % (
                            step, f["name"], digest[:16], (in_tar.get(f["name"]) or "none")[:16]))
                    src = os.path.join(self.c.tmp, "state-%s" % writer, "jobs", str(jid),
                                       "checkpoints", "step-%08d" % step, f["name"]) \
                        if writer else None
                    if src and os.path.exists(src):
                        with open(src, "rb") as fh:
                            theirs = hashlib.sha256(fh.read()).hexdigest()
                        compared += 1
                        if theirs != digest:
                            problems.append("step %d %s: SHA-256 %s, on %s (its writer) %s" % (
                                step, f["name"], digest[:16], writer, theirs[:16]))
                    if f["name"].endswith(".safetensors"):
                        why = safetensors_problem(data)
                        if why:
                            problems.append("step %d %s: %s" % (step, f["name"], why))
                    elif f["name"] == "state.json":
                        try:
                            if json.loads(data)["step"] != step:
                                problems.append("step %d state.json says step %s" % (
                                    step, json.loads(data)["step"]))
                        except (ValueError, KeyError) as e:
                            problems.append("step %d state.json: %s" % (step, e))
                names = sorted(f["name"] for f in ck["files"])
                if names != ["model.safetensors", "optimizer.safetensors", "state.json"]:
                    problems.append("step %d has files %s" % (step, names))
                if total != ck["size"]:
                    problems.append("step %d: %d bytes, listed size %d" % (step, total, ck["size"]))
                if newest is None or step > newest[0]:
                    newest = (step, where)
            self.checks.check(not problems, "job %d: %d checkpoints listed, %d files downloaded, "
                              "SHA-256 as in their .tar and (%d files) on their writer's disk, "
                              "headers and sizes sound" % (jid, len(listed), n_files, compared),
                              "; ".join(problems))
            if job.final["state"] == "succeeded":
                self.checks.check(newest and newest[0] == job.steps, "job %d: its last checkpoint "
                                  "is at step %d" % (jid, job.steps), str(newest))
            if newest:
                self.checks.check(*self.loads(job, newest[0], newest[1]))

    def loads(self, job, step, where):
        """The worker's own loader on a downloaded checkpoint: resume from it, train to it."""
        spec = json.loads(json.dumps(job.spec))
        for k in ("resources", "restart"):
            spec.pop(k, None)
        spec["resume_from"] = where
        spec["train"]["max_steps"] = step
        spec["checkpoint"] = {"dir": where + "-out"}
        path = where + ".json"
        with open(path, "w") as f:
            json.dump(spec, f)
        r = subprocess.run([self.a.worker, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        ok = r.returncode == 0 and ("resumed from %s at step %d" % (where, step)) in r.stderr
        return ok, "job %d: its checkpoint of step %d loads in traind-worker" % (job.id, step), \
            "exit %d: %s" % (r.returncode, r.stderr[-1500:])


# ---- after the jobs ---------------------------------------------------------------------------

def upload_leftover_swept(c, chaos, checks):
    """A targeted step for a bug the storm found (seed 102): a kill -9 of the master during an
    agent's checkpoint upload left the upload's temporary file (NAME.up-XXXXXX) among the
    checkpoint's files, listed, archived and fetched with it ever after. One is planted in the
    master's copy of a checkpoint of a job that ran across nodes; a restarted master must have
    removed it."""
    for jid, job in sorted(chaos.jobs.items()):
        _, events = chaos.events_of(jid)
        placed = [e for e in events if e.get("event") == "placement"]
        ckpts = [e["data"] for e in events if e.get("event") == "checkpoint"]
        if placed and ckpts and os.path.isdir(ckpts[-1]["path"]):
            break
    else:
        log("  (no checkpoint uploaded by an agent to plant a leftover upload in)")
        return
    step, where = ckpts[-1]["step"], ckpts[-1]["path"]
    planted = os.path.join(where, "model.safetensors.up-Xq3v9Z")
    with open(planted, "wb") as f:
        f.write(b"half an upload")
    log("a leftover upload planted in job %d's checkpoint of step %d; the master restarts" % (
        jid, step))
    p = c.procs["m0"]
    p.send_signal(signal.SIGTERM)
    checks.check(p.wait(timeout=60) == 0, "m0's traind exits 0 on SIGTERM")
    c.reap("m0")
    c.start(0)
    if not checks.check(until(20, lambda: c.listening("m0")) and until(30, c.nodes_ready),
                        "the master restarts and its agents join it again"):
        return
    ck = c.get_json("/v1/jobs/%d/checkpoints/%d" % (jid, step)) or {}
    names = [f["name"] for f in ck.get("files", [])]
    checks.check(not os.path.exists(planted) and names and not [n for n in names if ".up-" in n],
                 "a restarted master removes what an upload cut short left in a checkpoint",
                 "%s still there: %s; listed files %s" % (planted, os.path.exists(planted), names))


def check_leftovers(c, chaos, checks):
    log("invariant: no process of any job is left in any namespace")

    def left():
        return [p for p in c.scan()]

    gone = until(c.grace + 15, lambda: not left())
    checks.check(gone, "no process of any job left in the three namespaces once the jobs ended",
                 str(left()))


def stop_daemons(c, checks):
    """SIGTERM to every traind (each should exit 0), then nothing may be left in any namespace."""
    for name in NODES:
        p = c.procs.get(name)
        if p is None or p.poll() is not None:
            checks.check(False, "%s's traind was running at the end" % name,
                         "exit status %s" % (p.returncode if p else None))
            continue
        p.send_signal(signal.SIGTERM)
    for name in NODES:
        p = c.procs.get(name)
        if p is None:
            continue
        try:
            code = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            code = "none within 60 s"
        checks.check(code == 0, "%s's traind exits 0 on SIGTERM at the end" % name,
                     "exit status %s: %s" % (code, open(c.errlog[name]).read()[-3000:]))
        c.procs[name] = None
    empty = until(10, lambda: not any(c.ns_pids(k) for k in range(3)))
    checks.check(empty, "ip netns pids: nothing left in any node's namespace after the daemons "
                 "stopped", str({NODES[k]: c.ns_pids(k) for k in range(3)}))


def check_databases(c, chaos, checks):
    log("invariant: the databases are sound")
    for name in NODES:
        path = os.path.join(c.tmp, "state-" + name, "state.db")
        try:
            db = sqlite3.connect(path)
            integrity = db.execute("PRAGMA integrity_check").fetchall()
            fk = db.execute("PRAGMA foreign_key_check").fetchall()
            rows = dict(db.execute("SELECT id, state FROM jobs").fetchall())
            db.close()
        except sqlite3.Error as e:
            checks.check(False, "%s's state.db opens" % name, str(e))
            continue
        checks.check(integrity == [("ok",)] and not fk, "%s's state.db passes PRAGMA "
                     "integrity_check and foreign_key_check" % name, "%s %s" % (integrity, fk))
        if name == "m0":
            differ = {jid: (rows.get(jid), job.final["state"]) for jid, job in chaos.jobs.items()
                      if rows.get(jid) != job.final["state"]}
            checks.check(not differ, "the master's database holds each job's final state as "
                         "the API showed it", str(differ))


# ---- the hung peer ----------------------------------------------------------------------------

def hung_peer(c, checks):
    """Rank 2 (node rank 1's first rank, the second node's leader) of a 2 x 2 job stopped while
    it trains: its peers wait in a collective for it and must give up within the collective
    timeout; the job (max_restarts 0) fails naming rank 2 and its node, and nothing is left."""
    log("the hung peer: SIGSTOP of rank 2 of a 2 x 2 job on n1, n2 (collective timeout %d s)" %
        c.coll_timeout)
    spec = lenet("hung-peer", 100000, 10, 1000, 7)
    spec["resources"] = {"nnodes": 2, "nproc_per_node": 2, "nodes": ["n1", "n2"]}
    spec["restart"] = {"max_restarts": 0}
    status, body = c.api("POST", "/v1/jobs", json.dumps(spec).encode())
    if not checks.check(status == 201, "the hung-peer job is accepted", body.decode()[:500]):
        return
    jid = json.loads(body)["id"]

    def training():
        m = c.get_json("/v1/jobs/%d/metrics" % jid)
        return m and len([x for x in m if x["event"] == "train"]) >= 3

    if not checks.check(until(90, training), "the hung-peer job trains"):
        return

    def rank2():
        return [p for p in c.scan() if p["job"] == jid and p["rank"] == 2
                and p["exe"] == "traind-worker"]

    found = until(10, rank2)
    if not checks.check(found, "rank 2 of the hung-peer job is found in n2's namespace",
                        str([p for p in c.scan() if p["job"] == jid])):
        return
    victim = found[0]
    os.kill(victim["pid"], signal.SIGSTOP)
    t0 = time.time()
    log("  SIGSTOP of rank 2 (pid %d on %s)" % (victim["pid"], victim["node"]))

    def ended():
        j = c.get_json("/v1/jobs/%d" % jid)
        return j if j and j["state"] in FINAL else None

    limit = c.coll_timeout + c.grace + 15 + (30 if c.slow else 0)
    j = until(limit, ended, every=0.1)
    took = time.time() - t0
    if not checks.check(j is not None, "the job with a hung rank ends within %d s (no hang)" % limit):
        os.kill(victim["pid"], signal.SIGCONT)
        c.api("POST", "/v1/jobs/%d/cancel" % jid)
        return
    attempt_end = j["attempts"][-1]["finished_at"]
    reason = j.get("reason") or ""
    log("  ended %s after %.1f s (collective timeout %d s, grace %d s): %s" % (
        j["state"], took, c.coll_timeout, c.grace, reason))
    checks.check(j["state"] == "failed", "the job with a hung rank fails", j["state"])
    checks.check(c.coll_timeout - 1 <= took <= c.coll_timeout + c.grace + 10 +
                 (30 if c.slow else 0),
                 "a hung rank is detected after the collective timeout (%d s) and the job ends "
                 "within it plus the grace period and slack: %.1f s" % (c.coll_timeout, took),
                 "attempt finished at %s" % attempt_end)
    # whichever rank gave up first (the leader across the nodes' ring, or rank 3 beside it on
    # n2) names the rank it waited for with its host and pid; a rank that failed only because
    # another gave up carries the job's first failure in its error
    named = "rank 2 (host %s, pid %d" % (victim["node"], victim["pid"])
    checks.check(named in reason, "the job's reason names the hung rank and its node: %s)" % named,
                 reason)
    gone = until(c.grace + 10, lambda: not [p for p in c.scan() if p["job"] == jid])
    checks.check(gone, "no process of the hung-peer job is left (the stopped rank was killed)",
                 str([p for p in c.scan() if p["job"] == jid]))
    return took


# ---- main -------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traind")
    ap.add_argument("worker")
    ap.add_argument("source")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--storm-s", type=int, default=45)
    ap.add_argument("--hung-peer", action="store_true")
    ap.add_argument("--keep", help="copy the test's files here at the end (post-mortem)")
    args = ap.parse_args()
    args.traind = os.path.abspath(args.traind)
    args.worker = os.path.abspath(args.worker)
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    if os.geteuid() != 0:
        log("SKIP: network namespaces need root")
        return 77
    log("chaos: seed %d" % args.seed)
    self_test()
    tmp = tempfile.mkdtemp(prefix="traind-chaos-")
    os.chmod(tmp, 0o755)
    c = Cluster(args, tmp)
    checks = Checks()

    def cleanup():
        if args.keep:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True, ignore_dangling_symlinks=True,
                            ignore=shutil.ignore_patterns("*.sock", "downloads"))
        c.down()
        shutil.rmtree(tmp, ignore_errors=True)

    def on_signal(signum, frame):
        raise SystemExit(1)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    started = time.monotonic()
    try:
        c.up()
        c.start(0)
        if not checks.check(until(20, lambda: c.listening("m0")), "the master starts"):
            return 1
        c.start(1)
        c.start(2)
        if not checks.check(until(30, c.nodes_ready), "three nodes ready",
                            str(c.get_json("/v1/nodes"))):
            return 1
        if args.hung_peer:
            hung_peer(c, checks)
        chaos = Chaos(args, c, checks)
        chaos.storm()
        chaos.drain()
        for jid, job in sorted(chaos.jobs.items()):
            j = job.final
            log("job %d %s: %s, %d attempts, restarts %d/%d; %s" % (
                jid, job.template, j["state"], len(j["attempts"]), j["restarts"],
                job.max_restarts, j.get("reason")))
        chaos.check_states()
        chaos.check_steps()
        chaos.check_checkpoints()
        upload_leftover_swept(c, chaos, checks)
        check_leftovers(c, chaos, checks)
        stop_daemons(c, checks)
        check_databases(c, chaos, checks)
    finally:
        cleanup()
    log("chaos seed %d: %d invariants held, %d failed (%.0f s)" % (
        args.seed, checks.held, checks.failed, time.monotonic() - started))
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
