#!/usr/bin/python3
"""The cluster's defences (issue 42: findings 1, 2, 4 and the agent parts of 14), black-box, on a
master m0 and an agent n1, each a traind in a network namespace of its own (tests/integration/
netns.sh, as cluster_jobs.sh and chaos.py build them), and a third namespace n2 that runs no
traind: the attacker's host, from which a fake node registers and calls the cluster's routes (the
test's HTTP goes from threads that entered a namespace). Every attack is asserted to fail, and
legitimate use to go on working.

  tls          a master with a cluster secret listening beyond loopback, without --tls-cert or
               --insecure-cluster, refuses to start (exit 2, naming insecure_cluster and
               tls_cert); so does an agent joining a non-loopback master without --tls-ca; with
               --insecure-cluster true both start and warn (insecure_cluster) in their logs
  rogue        registrations claiming 0.0.0.0, 255.255.255.255, a multicast address or 127.0.0.1
               (from a non-loopback peer), a version with control characters or longer than 32
               characters, a GPU name with control characters: 400 bad_request naming the field
  credential   a registration answers a node credential (64 hex digits, new each time); a
               heartbeat with the shared secret alone, or with a wrong credential, is 401
               node_credential; with the node's own credential it is accepted
  files        with the secret alone (401 node_credential), or with a registered (fake) node's
               credential: PUT of the master's attempt-0.node-0.json (a job running there), of
               spec.json, rank-0.log or attempt-0.node-0.json of the node's own job (403), of a
               checkpoint of a job not placed on that node (one running on n1, one on the master)
               are refused and change nothing; GET of a symlink a job planted in its checkpoints
               (on the master) or that sits in a checkpoint never returns the link's target; a
               node running rank 0 of a job still uploads and downloads under checkpoints/
  fetch        (finding 1) a job on n1 registers a checkpoint, replaces its checkpoints/<name>
               with a symlink to a root-owned directory and fails: on the restart n1 fetches the
               checkpoint, and nothing is created in that directory; (also: a planted
               checkpoints/step-99999999 link to a root-owned directory does not get the files
               there removed by the restart's clean-up of newer checkpoints)
  upload       (finding 2) a job on n1 registers 20 checkpoints while a second process of it
               flips each registered file between a regular file and a symlink to a root-only
               file (plus one registered path that is such a symlink, and one that is the
               root-only file itself): no checkpoint the master serves holds that file's content,
               and the daemon keeps working
  legit        a 2-node job (m0 and n1, pinned) registers a checkpoint on the master, fails on
               n1, restarts, and both nodes' ranks read the checkpoint they resume from (n1's
               fetched from the master): it succeeds; its ranks run under the job's identity
               (job JSON "identity"), the same uid on both nodes

A traind without --insecure-cluster (today's main) is run without it: the tls checks then fail
for that, and every attack check still runs and shows whether the attack works.

Waits poll what can be observed (the API, files, a process's exit) with deadlines; a job waits
for a file the test creates when the test has seen what it needs. Everything it makes
(namespaces, bridge, processes, files) goes on exit, also on failure. Exit 0: every check held;
1: one failed; 77: skipped (not root, or no network namespaces here).

    /usr/bin/python3 tests/integration/security_cluster.py TRAIND TRAIND_WORKER SOURCE_DIR
"""
import concurrent.futures
import ctypes
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NETNS_SH = os.path.join(HERE, "netns.sh")
NET = "10.231.15"  # exists only inside the namespaces this test makes
PORT = 8470
PY = "/usr/bin/python3"
FINAL = ("succeeded", "failed", "cancelled")
SLOW = bool(os.environ.get("TRAIND_TEST_SLOW"))
HEARTBEAT_S = 1.0 if SLOW else 0.5
NODE_TIMEOUT_S = 12.0 if SLOW else 4.0
WAIT_S = 120 if SLOW else 60  # the longest any one wait here lasts
HEX64 = re.compile(r"[0-9a-fA-F]{64}")
LIBC = ctypes.CDLL(None, use_errno=True)
T0 = time.monotonic()


def log(msg):
    print(msg, flush=True)


def phase(msg):
    log("[%5.1f s] %s" % (time.monotonic() - T0, msg))


def until(seconds, fn, every=0.1):
    """fn() until it returns something true, at most `seconds`: that value, else None."""
    end = time.monotonic() + seconds
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() >= end:
            return None
        time.sleep(every)


def enter_netns(path):
    """(a pool thread's initializer) This thread into the network namespace at path."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if LIBC.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            e = ctypes.get_errno()
            raise OSError(e, "setns %s: %s" % (path, os.strerror(e)))
    finally:
        os.close(fd)


def sha256_of(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


class Interrupted(Exception):
    pass


class Checks:
    def __init__(self):
        self.held = 0
        self.failed = []

    def check(self, cond, what, detail=""):
        if cond:
            self.held += 1
            log("  ok: " + what)
        else:
            self.failed.append(what)
            log("FAIL: " + what + (": " + detail if detail else ""))
        return bool(cond)


# ---- the job the tests submit: one script, its mode in argv[1] ----------------------------------

JOB_PY = r'''
import ctypes, json, os, signal, sys, time

MODE = sys.argv[1]
E = os.environ
RESTART = int(E.get("TORCHELASTIC_RESTART_COUNT", "0"))
RANK = int(E.get("RANK", "0"))


def out(obj):
    print(json.dumps(obj), flush=True)


def say(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def job_dir():
    # the job runs in its directory's work/ under an identity of its own, else in it
    cwd = os.getcwd()
    return os.path.dirname(cwd) if os.path.basename(cwd) == "work" else cwd


CK = os.path.join(job_dir(), "checkpoints")
os.makedirs(CK, exist_ok=True)


def wait_go(limit=150):
    end = time.monotonic() + limit
    while not os.path.exists(E["GO"]):
        if time.monotonic() > end:
            say("no go file after %d s" % limit)
            sys.exit(9)
        time.sleep(0.05)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


say("UID=%d GID=%d RANK=%d ATTEMPT=%d" % (os.getuid(), os.getgid(), RANK, RESTART))

if MODE == "fetchlink":
    # finding 1: a checkpoint registered, then its directory here swapped for a link
    if RESTART == 0:
        d = os.path.join(CK, "ck1")
        os.makedirs(d, exist_ok=True)
        write(os.path.join(d, "data.bin"), E["LEGIT"])
        out({"event": "checkpoint", "step": 1, "path": d})
        wait_go()
        os.rename(d, os.path.join(CK, "moved-ck1"))
        os.symlink(E["ROOTDIR"], d)
        os.symlink(E["CANARYDIR"], os.path.join(CK, "step-99999999"))
        say("planted the links; failing")
        sys.exit(3)
    say("restarted; TRAIND_LATEST_CHECKPOINT=%s" % E.get("TRAIND_LATEST_CHECKPOINT"))
    sys.exit(0)

if MODE == "race":
    # finding 2: registered files flipped between a regular file and a link to a root-only one
    libc = ctypes.CDLL(None, use_errno=True)
    work = os.getcwd()
    pairs, lines = [], []
    for s in range(1, 21):
        if s % 2:
            p = os.path.join(CK, "f-%02d.bin" % s)
            write(p, E["LEGIT"])
            lines.append((s, p))
        else:
            d = os.path.join(CK, "d-%02d" % s)
            os.makedirs(d, exist_ok=True)
            p = os.path.join(d, "data.bin")
            write(p, E["LEGIT"])
            lines.append((s, d))
        alt = os.path.join(work, "alt-%02d" % s)
        os.symlink(E["SECRET"], alt)
        pairs.append((p, alt))
    link = os.path.join(CK, "f-21.bin")
    os.symlink(E["SECRET"], link)  # registered as it is: a link
    raw = [(a.encode(), b.encode()) for a, b in pairs]
    exchange = libc.renameat2(-100, raw[0][0], -100, raw[0][1], 2) == 0  # RENAME_EXCHANGE
    pid = os.fork()
    if pid == 0:
        end = time.monotonic() + 150
        n = 0
        while True:
            for (a, b), (ra, rb) in zip(pairs, raw):
                if exchange:
                    libc.renameat2(-100, ra, -100, rb, 2)
                else:  # no RENAME_EXCHANGE here: the same flip in two renames
                    t = a + ".flip"
                    if os.path.islink(a):
                        write(t, E["LEGIT"])
                    else:
                        os.symlink(E["SECRET"], t)
                    os.rename(t, a)
            n += 1
            if n % 64 == 0 and (os.path.exists(E["GO"]) or time.monotonic() > end):
                os._exit(0)
    for s, p in lines:
        out({"event": "checkpoint", "step": s, "path": p})
    out({"event": "checkpoint", "step": 21, "path": link})
    out({"event": "checkpoint", "step": 22, "path": E["SECRET"]})  # the root-only file itself
    out({"event": "flipdone", "step": 23})
    wait_go()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sys.exit(0)

if MODE == "master":
    # on the master: links planted in the job's own checkpoints/
    os.symlink(E["SECRET"], os.path.join(CK, "leak"))
    d = os.path.join(CK, "ckm")
    os.makedirs(d, exist_ok=True)
    write(os.path.join(d, "w.bin"), E["LEGIT"])
    os.symlink(E["SECRET"], os.path.join(d, "leak2"))
    out({"event": "checkpoint", "step": 1, "path": d})
    wait_go()  # running (its attempt file on the master) while the test attacks it
    sys.exit(0)

if MODE == "legit2":
    # a 2-node job: rank 0 registers a checkpoint, the other rank fails once; attempt 1's ranks
    # each read the checkpoint they resume from on their own node
    if RESTART == 0:
        if RANK == 0:
            d = os.path.join(CK, "ck-legit")
            os.makedirs(d, exist_ok=True)
            write(os.path.join(d, "model.bin"), E["LEGIT"])
            out({"event": "checkpoint", "step": 5, "path": d})
            wait_go()
            end = time.monotonic() + 120  # until the other rank's failure stops this one
            while time.monotonic() < end:
                time.sleep(0.2)
            sys.exit(0)
        wait_go()
        sys.exit(4)
    latest = E.get("TRAIND_LATEST_CHECKPOINT", "")
    try:
        with open(os.path.join(latest, "model.bin")) as f:
            got = f.read()
    except OSError as e:
        got = "(%s)" % e
    good = got == E["LEGIT"]
    say("RESUMED rank %d from %s: %s" % (RANK, latest,
                                         "match" if good else "MISMATCH " + got[:200]))
    sys.exit(0 if good else 5)

say("unknown mode " + MODE)
sys.exit(2)
'''


# ---- the cluster --------------------------------------------------------------------------------

class Cluster:
    def __init__(self, traind, worker, src, tmp):
        self.traind = traind
        self.worker = worker
        self.src = src
        self.tmp = tmp
        self.tag = "tz%d" % os.getpid()
        self.procs = []  # every traind started (Popen), stopped at the end
        self.daemons = {}  # name -> (Popen, its log)
        self.secret_file = os.path.join(tmp, "cluster.secret")
        self.secret = secrets.token_hex(24)
        with open(self.secret_file, "w") as f:
            f.write(self.secret)
        os.chmod(self.secret_file, 0o600)
        self.token = None
        self.pools = {}  # k -> threads in node k's namespace
        help_text = subprocess.run([traind, "--help"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True).stdout
        self.has_insecure = "--insecure-cluster" in help_text
        self.protocol = 3
        try:
            with open(os.path.join(src, "service", "td_cluster.h")) as f:
                m = re.search(r"#define TD_CLUSTER_PROTOCOL (\d+)", f.read())
                if m:
                    self.protocol = int(m.group(1))
        except OSError:
            pass

    def ns(self, k):
        return "%s-n%d" % (self.tag, k)

    def addr(self, k):
        return "%s.%d" % (NET, k + 1)

    def netns(self, func, *args):
        return subprocess.run(["sh", "-c", '. "$0"; "$@"', NETNS_SH, func] + list(args)).returncode

    def up(self):
        # netns_hosts prints the shell tests' SKIP (and why) or FAIL line and exits 77 or 1
        rc = self.netns("netns_hosts", self.tag, NET, "3", "the namespaces",
                        os.path.join(self.tmp, "netns.err"))
        if rc != 0:
            sys.exit(rc)

    def down(self):
        for p in self.pools.values():  # out of the namespaces before they go
            p.shutdown(wait=True, cancel_futures=True)
        for p in self.procs:  # SIGTERM first: each daemon stops its jobs
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 15
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.netns("netns_down", self.tag, "3")  # whatever is left in the namespaces dies

    # -- daemons --

    def daemon(self, k, name, args, insecure=True):
        """traind in node k's namespace; `ip netns exec` and env exec it: the pid is traind's."""
        errlog = os.path.join(self.tmp, "%s.err" % name)
        cmd = ["ip", "netns", "exec", self.ns(k), "env", "OPENBLAS_NUM_THREADS=1",
               self.traind, "--config", "", "--state-dir", os.path.join(self.tmp, "state-" + name),
               "--node-name", name, "--worker", self.worker, "--data-root", self.tmp,
               "--grace", "2", "--cluster-secret-file", self.secret_file] + args
        if insecure and self.has_insecure:
            cmd += ["--insecure-cluster", "true"]
        with open(errlog, "w") as err:
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        self.daemons[name] = (p, errlog)
        return p

    def logged(self, name, text):
        try:
            with open(self.daemons[name][1]) as f:
                return text in f.read()
        except OSError:
            return False

    def log_of(self, name):
        try:
            with open(self.daemons[name][1]) as f:
                return f.read()
        except OSError:
            return ""

    def start_master(self):
        return self.daemon(0, "m0", ["--listen", "%s:%d" % (self.addr(0), PORT), "--slots", "2",
                                     "--heartbeat", str(HEARTBEAT_S),
                                     "--node-timeout", str(NODE_TIMEOUT_S)])

    def start_agent(self):
        return self.daemon(1, "n1", ["--listen", "%s:%d" % (self.addr(1), PORT), "--slots", "3",
                                     "--join", "%s:%d" % (self.addr(0), PORT)])

    # -- HTTP from inside a namespace: threads that entered it (setns), reused --

    def pool(self, k):
        """Worker threads in node k's network namespace: what they connect to, they reach
        from there (a socket stays in the namespace it was made in)."""
        if k not in self.pools:
            self.pools[k] = concurrent.futures.ThreadPoolExecutor(
                max_workers=4, initializer=enter_netns, initargs=("/run/netns/" + self.ns(k),))
        return self.pools[k]

    def http(self, k, method, path, headers=(), body=None, timeout=10):
        """(status, body bytes) of a request from node k's namespace to the master; status 0
        when no answer came. body: bytes (PUT: the upload) or an object (POST: JSON). The path
        goes as it is (no normalising of ".." segments)."""
        hdrs = dict(h.split(": ", 1) for h in headers)
        data = None
        if isinstance(body, (bytes, bytearray)):
            data = bytes(body)
        elif body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"

        def request():
            # headers and body in one write: a master that answers from the headers alone (a
            # refused credential) and closes finds no unread body to reset the connection with
            head = ["%s %s HTTP/1.1" % (method, path), "Host: %s:%d" % (self.addr(0), PORT),
                    "Connection: close"]
            if data is not None or method in ("POST", "PUT"):
                head.append("Content-Length: %d" % len(data or b""))
            head += ["%s: %s" % kv for kv in hdrs.items()]
            try:
                with socket.create_connection((self.addr(0), PORT), timeout=timeout) as sock:
                    sock.sendall("\r\n".join(head + ["", ""]).encode() + (data or b""))
                    r = http.client.HTTPResponse(sock, method=method)
                    r.begin()
                    return r.status, r.read()
            except (OSError, http.client.HTTPException):
                return 0, b""
        return self.pool(k).submit(request).result()

    def api(self, method, path, body=None):
        if self.token is None:
            try:
                with open(os.path.join(self.tmp, "state-m0", "token")) as f:
                    self.token = f.read().strip()
            except OSError:
                return 0, b""
        return self.http(0, method, path, ["Authorization: Bearer " + self.token], body)

    def get_json(self, path):
        status, body = self.api("GET", path)
        if status != 200:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None

    def job(self, jid):
        return self.get_json("/v1/jobs/%d" % jid) or {}

    def submit(self, spec):
        status, body = self.api("POST", "/v1/jobs", spec)
        if status != 201:
            raise AssertionError("submitting %s: HTTP %d %s" % (spec.get("name"), status,
                                                               body[:500]))
        return json.loads(body)["id"]

    def ended(self, jid):
        j = self.job(jid)
        return j if j.get("state") in FINAL else None

    def nodes(self):
        got = self.get_json("/v1/nodes")
        return {n["name"]: n for n in got["nodes"]} if got else {}

    def ready(self, *names):
        nodes = self.nodes()
        return all(nodes.get(n, {}).get("state") == "ready" for n in names)

    def checkpoint(self, jid, step):
        """The master's object of the job's checkpoint at step, None when it has none."""
        return self.get_json("/v1/jobs/%d/checkpoints/%d" % (jid, step))

    def registered_with_files(self, jid, step):
        c = self.checkpoint(jid, step)
        return c if c and c.get("files") else None

    def metric_events(self, jid):
        got = self.get_json("/v1/jobs/%d/metrics" % jid)
        return [m.get("event") for m in got] if isinstance(got, list) else []

    # -- the cluster's routes, as a node on host k --

    def cluster(self, k, method, path, auth, body=None):
        headers = ["Authorization: " + auth] if auth else []
        status, text = self.http(k, method, path, headers, body)
        try:
            obj = json.loads(text) if text else None
        except ValueError:
            obj = None
        return status, text, obj

    def register(self, k, auth, **fields):
        body = {"protocol": self.protocol, "name": "x", "node_id": "sec-test-node-id",
                "address": self.addr(k), "slots": 1, "gpus": [], "version": "sec-test-1",
                "slots_used": 0, "parts": []}
        body.update(fields)
        status, text, obj = self.cluster(k, "POST", "/v1/cluster/register", auth, body)
        err = (obj or {}).get("error") if isinstance(obj, dict) else None
        if status == 400 and err and err.get("code") == "protocol_version":
            m = re.search(r"speaks (\d+)\D*$", err.get("message", ""))
            if m and int(m.group(1)) != self.protocol:
                self.protocol = int(m.group(1))
                return self.register(k, auth, **fields)
        return status, text, obj


def err_of(obj):
    e = obj.get("error") if isinstance(obj, dict) else None
    return e if isinstance(e, dict) else {}


def short(text, n=300):
    return (text or b"")[:n].decode("utf-8", "replace")


class FakeNode:
    """A node that registers with the master and heartbeats from namespace k, reporting as
    running every part the master orders it to run (it runs nothing)."""

    def __init__(self, c, k, name):
        self.c = c
        self.k = k
        self.name = name
        self.node_id = "fake-" + secrets.token_hex(8)
        self.auth = None  # what its heartbeats carry
        self.orders = {}
        self.stop = threading.Event()
        self.thread = None
        self.last = None

    def body(self):
        parts = [{"job": o["job"], "attempt": o.get("attempt", 0), "state": "running",
                  "next_seq": 0, "lines": [], "logs": [], "devices": ""}
                 for o in self.orders.values() if not o.get("stop")]
        return {"name": self.name, "node_id": self.node_id, "slots_used": len(parts),
                "parts": parts}

    def beat(self, auth):
        return self.c.cluster(self.k, "POST", "/v1/cluster/heartbeat", auth, self.body())

    def loop(self):
        while not self.stop.is_set():
            status, _, obj = self.beat(self.auth)
            self.last = status
            if status == 200 and isinstance(obj, dict):
                self.orders = {o["job"]: o for o in obj.get("parts") or []
                               if isinstance(o, dict) and "job" in o}
            self.stop.wait(HEARTBEAT_S * 0.6)  # the heartbeat's own cadence

    def start(self, auth):
        self.auth = auth
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def end(self):
        self.stop.set()
        if self.thread:
            self.thread.join(timeout=15)


# ---- the checks ---------------------------------------------------------------------------------

def check_tls(c, checks):
    """Plain HTTP beyond loopback needs --insecure-cluster: without it a master and an agent
    refuse to start; with it they warn."""
    checks.check(c.has_insecure, "traind has the --insecure-cluster option",
                 "not in traind --help: the cluster runs without it")
    if c.has_insecure:
        checks.check(c.logged("m0", "insecure_cluster"),
                     "the master started with --insecure-cluster true warns (insecure_cluster)",
                     c.log_of("m0")[-800:])
        checks.check(c.logged("n1", "insecure_cluster"),
                     "the agent started with --insecure-cluster true warns (insecure_cluster)",
                     c.log_of("n1")[-800:])

    def refused(name, k, args, started_text, what, words):
        p = c.daemon(k, name, args, insecure=False)

        def settled():
            return p.poll() is not None or c.logged(name, started_text)
        until(20, settled)
        rc = p.poll()
        if rc is None:  # it started: the refusal is missing
            p.kill()
            p.wait()
        text = c.log_of(name)
        ok = rc == 2 and all(w in text for w in words)
        checks.check(ok, what, "exit %s (None: it started and ran); its log: %s" % (
            rc, text.strip()[-600:]))

    refused("tlsmaster", 0, ["--listen", "%s:%d" % (c.addr(0), PORT + 1)], "listening on",
            "a master with a cluster secret on %s, without TLS or --insecure-cluster, refuses "
            "to start (exit 2, naming insecure_cluster and tls_cert)" % c.addr(0),
            ["insecure_cluster", "tls_cert"])
    refused("tlsagent", 1, ["--listen", "%s:%d" % (c.addr(1), PORT + 1),
                            "--join", "%s:%d" % (c.addr(0), PORT)], "joined",
            "an agent joining %s:%d without --tls-ca or --insecure-cluster refuses to start "
            "(exit 2)" % (c.addr(0), PORT), [])


def check_rogue(c, checks):
    """A rogue agent's claims are refused at registration."""
    auth = "Cluster " + c.secret
    cases = [
        ("address 0.0.0.0", {"address": "0.0.0.0"}, "address"),
        ("address 255.255.255.255", {"address": "255.255.255.255"}, "address"),
        ("a multicast address (224.0.0.1)", {"address": "224.0.0.1"}, "address"),
        ("address 127.0.0.1 from %s (not loopback)" % c.addr(2), {"address": "127.0.0.1"},
         "address"),
        ("a version with control characters", {"version": "1.0\x1b[2J\r\nFAKE"}, "version"),
        ("a version of 40 characters", {"version": "v" * 40}, "version"),
        ("a GPU name with control characters",
         {"gpus": [{"index": 0, "name": "GPU\x07\x1b[0m", "memory_bytes": 1 << 30}]}, "gpus"),
        ("a name with a control character", {"name": "rogue\x01x"}, "name"),
    ]
    for i, (what, fields, field) in enumerate(cases):
        fields = dict(fields)
        fields.setdefault("name", "rogue-%d" % i)
        fields["node_id"] = "rogue-node-%d" % i
        status, text, obj = c.register(2, auth, **fields)
        e = err_of(obj)
        ok = status == 400 and e.get("code") == "bad_request" and \
            str(e.get("field") or "").startswith(field)
        checks.check(ok, "a registration claiming %s is 400 bad_request naming %s" % (what, field),
                     "HTTP %d %s" % (status, short(text)))


def put_refused(c, checks, k, auth, jid, rel, victim, what, codes=(401, 403), code=None,
                must_exist=False):
    """PUT of rel of job jid as a node on host k: refused (a status in codes, with code when
    given) and the master's file (victim) unchanged (must_exist: and there to begin with)."""
    before = sha256_of(victim)
    if must_exist and before is None:
        checks.check(False, what, "%s is not there: nothing to attack" % victim)
        return
    data = b'{"forged": "by a node that does not run this"}\n'
    status, text, obj = c.cluster(k, "PUT", "/v1/cluster/files/%d/%s?sha256=%s" % (
        jid, rel, hashlib.sha256(data).hexdigest()), auth, data)
    after = sha256_of(victim)
    ok = status in codes and (code is None or err_of(obj).get("code") == code) and before == after
    checks.check(ok, what, "HTTP %d %s; the master's %s %s" % (
        status, short(text), os.path.relpath(victim, c.tmp),
        "unchanged" if before == after else "CHANGED (was %s, now %s)" % (
            "absent" if before is None else "there", "absent" if after is None else "written")))


def get_no_leak(c, checks, k, auth, jid, rel, mark, what):
    status, text, _ = c.cluster(k, "GET", "/v1/cluster/files/%d/%s" % (jid, rel), auth)
    checks.check(mark.encode() not in text, what,
                 "HTTP %d: the root-only file's content was served" % status)
    return status


def check_nodes_and_files(c, checks, jm, j1, mark, legit):
    """Node credentials, and what a node may do on the files route."""
    secret_auth = "Cluster " + c.secret
    f1 = FakeNode(c, 2, "f1")
    status, text, obj = c.register(2, secret_auth, name=f1.name, node_id=f1.node_id)
    checks.check(status == 200, "a fake node f1 registers from %s with the secret" % c.addr(2),
                 "HTTP %d %s" % (status, short(text)))
    cred1 = (obj or {}).get("credential") if isinstance(obj, dict) else None
    status2, text2, obj2 = c.register(2, secret_auth, name=f1.name, node_id=f1.node_id)
    cred = (obj2 or {}).get("credential") if isinstance(obj2, dict) else None
    good = all(isinstance(x, str) and HEX64.fullmatch(x) for x in (cred1, cred)) and cred1 != cred
    checks.check(good, "each registration answers a new node credential (64 hex digits)",
                 "got %r then %r" % (cred1, cred))
    node_auth = "Node f1:%s" % cred if good else secret_auth
    if not good:
        log("  (no node credential: f1 goes on with the shared secret, as today's nodes do)")

    status, text, obj = f1.beat(secret_auth)
    checks.check(status == 401 and err_of(obj).get("code") == "node_credential",
                 "a heartbeat with the shared secret alone is 401 node_credential",
                 "HTTP %d %s" % (status, short(text)))
    wrong = ("0" * 64) if cred != "0" * 64 else ("1" * 64)
    status, text, obj = f1.beat("Node f1:" + wrong)
    checks.check(status == 401 and err_of(obj).get("code") == "node_credential",
                 "a heartbeat with a wrong node credential is 401 node_credential",
                 "HTTP %d %s" % (status, short(text)))
    try:
        with open(os.path.join(c.tmp, "state-n1", "node-id")) as f:
            n1_id = f.read().strip()
    except OSError:
        n1_id = "unknown-node-id"
    status, text, obj = c.cluster(2, "POST", "/v1/cluster/heartbeat",
                                  "Node n1:" + (cred or wrong),
                                  {"name": "n1", "node_id": n1_id, "slots_used": 0, "parts": []})
    checks.check(status == 401 and err_of(obj).get("code") == "node_credential",
                 "a heartbeat as n1 with f1's credential is 401 node_credential",
                 "HTTP %d %s" % (status, short(text)))
    if good:
        status, text, _ = f1.beat(node_auth)
        checks.check(status == 200, "a heartbeat with the node's own credential is accepted",
                     "HTTP %d %s" % (status, short(text)))
    f1.start(node_auth)
    try:
        files_as_f1(c, checks, f1, node_auth, secret_auth, jm, j1, mark, legit)
    finally:
        f1.end()


def files_as_f1(c, checks, f1, node_auth, secret_auth, jm, j1, mark, legit):
    """The files route, as the fake node f1 (heartbeating) and with the secret alone."""
    # a job placed on f1 alone: f1 runs its node rank 0 (it reports the part running)
    jf = c.submit({"name": "sec-on-f1", "command": ["/bin/true"],
                   "resources": {"nnodes": 1, "nproc_per_node": 1, "nodes": ["f1"]}})

    def placed():
        j = c.job(jf)
        nodes = (j.get("placement") or {}).get("nodes") or []
        return any(n.get("node") == "f1" and n.get("state") == "running" for n in nodes) \
            and jf in f1.orders
    checks.check(until(20, placed), "a job pinned to f1 is placed there and reported running",
                 "job %s; f1's last heartbeat HTTP %s" % (json.dumps(c.job(jf))[:600], f1.last))
    m0 = os.path.join(c.tmp, "state-m0", "jobs")
    base = "/v1/cluster/files/%d/" % jf

    # what a node running rank 0 may still do: a checkpoint up and down
    data = ("a checkpoint file f1 uploads: " + legit).encode()
    status, text, _ = c.cluster(2, "PUT", base + "checkpoints/ok-f1/x.bin?sha256=" +
                                hashlib.sha256(data).hexdigest(), node_auth, data)
    kept = sha256_of(os.path.join(m0, str(jf), "checkpoints", "ok-f1", "x.bin"))
    checks.check(status == 200 and kept == hashlib.sha256(data).hexdigest(),
                 "f1 (rank 0 of the job) uploads a file under checkpoints/",
                 "HTTP %d %s" % (status, short(text)))
    status, text, _ = c.cluster(2, "GET", base + "checkpoints/ok-f1/x.bin", node_auth)
    checks.check(status == 200 and text == data, "f1 downloads it again",
                 "HTTP %d %s" % (status, short(text)))

    # ... and what it may not
    jdir = os.path.join(m0, str(jf))
    for rel in ("attempt-0.node-0.json", "spec.json", "rank-0.log"):
        put_refused(c, checks, 2, node_auth, jf, rel, os.path.join(jdir, rel),
                    "f1 (rank 0 of job %d) may not PUT %s: 403 forbidden" % (jf, rel),
                    codes=(403,), code="forbidden")
    for rel in ("checkpoints/.hidden/x.bin", "checkpoints/../spec.json"):
        put_refused(c, checks, 2, node_auth, jf, rel, os.path.join(jdir, "spec.json"),
                    "a malformed path (%s) is 400" % rel, codes=(400,))
    status, text, _ = c.cluster(2, "GET", base + "rank-0.log", node_auth)
    checks.check(status in (403, 404), "f1 may GET only under checkpoints/ (rank-0.log: "
                 "refused)", "HTTP %d %s" % (status, short(text)))
    # a link in the checkpoint's directory on the master (as a job's rank 0 could plant it)
    os.makedirs(os.path.join(jdir, "checkpoints", "ok-f1"), exist_ok=True)
    os.symlink(os.path.join(c.tmp, "root-only.txt"),
               os.path.join(jdir, "checkpoints", "ok-f1", "leak"))
    get_no_leak(c, checks, 2, node_auth, jf, "checkpoints/ok-f1/leak", mark,
                "f1 GETting a symlink in its job's checkpoint gets not the link's target")

    # other nodes' jobs: j1 runs on n1 (rank 0 there), jm on the master
    for auth, who in ((node_auth, "f1's credential"), (secret_auth, "the secret alone")):
        code = "node_credential" if auth == secret_auth else None
        codes = (401,) if auth == secret_auth else (401, 403)
        put_refused(c, checks, 2, auth, jm, "attempt-0.node-0.json",
                    os.path.join(m0, str(jm), "attempt-0.node-0.json"),
                    "PUT of the master's own attempt-0.node-0.json (job %d, running) with %s is "
                    "refused" % (jm, who), codes=codes, code=code, must_exist=True)
        put_refused(c, checks, 2, auth, jm, "checkpoints/evil/x.bin",
                    os.path.join(m0, str(jm), "checkpoints", "evil", "x.bin"),
                    "PUT of a checkpoint of job %d (not on f1) with %s is refused" % (jm, who),
                    codes=codes, code=code)
        # (a new file: the registered data.bin stays what the fetch check needs)
        put_refused(c, checks, 2, auth, j1, "checkpoints/ck1/model.bin",
                    os.path.join(m0, str(j1), "checkpoints", "ck1", "model.bin"),
                    "PUT into the checkpoint of job %d (rank 0 on n1) with %s is refused"
                    % (j1, who), codes=codes, code=code)
        for rel in ("checkpoints/leak", "checkpoints/ckm/leak2"):
            get_no_leak(c, checks, 2, auth, jm, rel, mark,
                        "GET of the link job %d planted (%s) with %s gets not its target"
                        % (jm, rel, who))
        status, text, _ = c.cluster(2, "GET", "/v1/cluster/files/%d/checkpoints/ckm/w.bin" % jm,
                                    auth)
        checks.check(status in codes, "GET of job %d's checkpoint (not on f1) with %s is refused"
                     % (jm, who), "HTTP %d %s" % (status, short(text)))
    status, text, obj = c.cluster(2, "PUT", base + "checkpoints/ok-f1/y.bin?sha256=" +
                                  hashlib.sha256(b"y").hexdigest(), secret_auth, b"y")
    checks.check(status == 401 and err_of(obj).get("code") == "node_credential",
                 "a PUT with the secret alone, even for f1's own job, is 401 node_credential",
                 "HTTP %d %s" % (status, short(text)))
    # (jf ends when f1, silent from now on, is lost; a cancel would wait for f1 to stop it)


def main():
    if len(sys.argv) != 4:
        log(__doc__.strip().splitlines()[-1])
        return 2
    traind, worker, src = (os.path.abspath(a) for a in sys.argv[1:4])
    if os.geteuid() != 0:
        log("SKIP: network namespaces and root-owned files need root")
        return 77
    started = time.monotonic()
    tmp = os.path.realpath(tempfile.mkdtemp(prefix="traind-seccluster-"))
    os.chmod(tmp, 0o755)  # the jobs (their own uids) read the script and wait for files here
    c = Cluster(traind, worker, src, tmp)
    checks = Checks()

    def on_signal(signum, frame):
        raise Interrupted("signal %d" % signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    try:
        run(c, checks)
    except (AssertionError, Interrupted) as e:
        checks.check(False, "the test ran to its end", str(e))
    finally:
        c.down()
        if os.environ.get("TRAIND_TEST_KEEP"):  # for a post-mortem: the daemons' logs, states
            log("kept " + tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    log("security_cluster: %d checks held, %d failed (%.0f s)" % (
        checks.held, len(checks.failed), time.monotonic() - started))
    for what in checks.failed:
        log("  failed: " + what)
    return 0 if not checks.failed else 1


def run(c, checks):
    tmp = c.tmp
    mark = "ROOT-ONLY-" + secrets.token_hex(16)
    # as long as the root-only file: a flipped file read whole either way (a size that changed
    # between hash and upload would only stall today's agent on its upload, not show more)
    legit = ("legit-" + secrets.token_hex(8)).ljust(len(mark) + 1, "-")
    secret_path = os.path.join(tmp, "root-only.txt")  # what no job may read
    with open(secret_path, "w") as f:
        f.write(mark + "\n")
    os.chmod(secret_path, 0o600)
    rootdir = os.path.join(tmp, "root-dir")  # nothing may appear in it
    canary_dir = os.path.join(tmp, "canary-dir")  # its canary must stay
    for d in (rootdir, canary_dir):
        os.mkdir(d)
        os.chmod(d, 0o755)
    canary = os.path.join(canary_dir, "canary")
    with open(canary, "w") as f:
        f.write("root's\n")
    script = os.path.join(tmp, "sec_job.py")
    with open(script, "w") as f:
        f.write(JOB_PY)
    os.chmod(script, 0o644)
    go = {k: os.path.join(tmp, "go-" + k) for k in ("master", "legit2", "fetchlink", "race")}

    c.up()
    c.start_master()
    if not checks.check(until(20, lambda: c.logged("m0", "listening on")), "the master starts",
                        c.log_of("m0")[-800:]):
        return
    c.start_agent()
    if not checks.check(until(30, lambda: c.ready("m0", "n1")), "n1 joins: two nodes ready",
                        json.dumps(c.nodes())[:800] + " " + c.log_of("n1")[-800:]):
        return
    phase("cluster up: m0 and n1 ready (--insecure-cluster %s)" % (
        "true" if c.has_insecure else "not an option of this traind"))

    phase("tls: refusals to start without TLS")
    check_tls(c, checks)
    phase("rogue registrations")
    check_rogue(c, checks)

    def spec(name, mode, nodes, restarts, env):
        env = dict(env, GO=go.get(mode, os.path.join(tmp, "go-none")), LEGIT=legit)
        return {"name": name, "command": [PY, script, mode], "env": env,
                "resources": {"nnodes": len(nodes), "nproc_per_node": 1, "nodes": nodes},
                "restart": {"max_restarts": restarts}}

    jm = c.submit(spec("sec-master-links", "master", ["m0"], 0, {"SECRET": secret_path}))
    j0 = c.submit(spec("sec-legit-2node", "legit2", ["m0", "n1"], 1, {}))
    j1 = c.submit(spec("sec-fetch-link", "fetchlink", ["n1"], 1, {"ROOTDIR": rootdir,
                                                                 "CANARYDIR": canary_dir}))
    j2 = c.submit(spec("sec-upload-race", "race", ["n1"], 0, {"SECRET": secret_path}))
    phase("jobs: %d master links, %d legit 2-node, %d fetch through a link, %d upload race"
        % (jm, j0, j1, j2))

    # gates: each job goes on when the test has seen what it needs
    seen = {}

    def gates():
        def opened(key, why, go_file=None):
            seen[key] = True
            phase("  gate: " + why)
            if go_file:
                open(go_file, "w").close()
        if "jm" not in seen and c.registered_with_files(jm, 1):
            # it runs on until the files checks have attacked its attempt
            opened("jm", "job %d registered its checkpoint on the master" % jm)
        if "j0" not in seen and c.registered_with_files(j0, 5):
            opened("j0", "job %d registered its checkpoint: its rank on n1 fails" % j0,
                   go["legit2"])
        if "j1" not in seen and c.registered_with_files(j1, 1):
            # its go file comes after the files checks, which use its upload
            opened("j1", "job %d's checkpoint came up from n1" % j1)
        if "j2" not in seen and "flipdone" in c.metric_events(j2):
            opened("j2", "job %d's 22 checkpoint lines are through" % j2, go["race"])
        return len(seen) == 4
    if not checks.check(until(WAIT_S, gates, every=0.2),
                        "every job reached its first gate (checkpoints registered)",
                        "seen %s; jobs: %s" % (sorted(seen), " | ".join(
                            json.dumps(c.job(j))[:400] for j in (jm, j0, j1, j2)))):
        for k in ("legit2", "race"):  # the rest still runs: each check says what it sees
            open(go[k], "w").close()
    phase("node credentials and the files route")
    check_nodes_and_files(c, checks, jm, j1, mark, legit)
    open(go["master"], "w").close()
    j = until(WAIT_S, lambda: c.ended(jm), every=0.2) or c.job(jm)
    checks.check(j.get("state") == "succeeded", "the job on the master that planted links and "
                 "was attacked meanwhile succeeds", json.dumps(j)[:600])

    phase("finding 1: the restart's fetch through a link")
    open(go["fetchlink"], "w").close()
    j = until(WAIT_S, lambda: c.ended(j1), every=0.2) or c.job(j1)
    made = sorted(os.listdir(rootdir))
    who = {}
    for name in made:
        try:
            who[name] = os.lstat(os.path.join(rootdir, name)).st_uid
        except OSError:
            pass
    checks.check(not made, "nothing is created in a root-owned directory a job's checkpoint "
                 "link points to", "%s appeared there (owners %s)" % (made, who))
    checks.check(os.path.exists(canary), "a root-owned file behind a planted step-99999999 link "
                 "survives the restart (beyond the contract: the clean-up of newer checkpoints)",
                 "the canary was removed")
    attempts = j.get("attempts") or []
    ok = j.get("state") == "succeeded" or (j.get("state") == "failed" and j.get("reason"))
    checks.check(ok and len(attempts) == 2, "the job was restarted and ended (succeeded, or "
                 "failed saying why)", json.dumps(j)[:800])
    log("  fetch job: %s, %d attempts; reason: %s" % (j.get("state"), len(attempts),
                                                     j.get("reason")))

    phase("finding 2: the upload race")
    j = until(WAIT_S, lambda: c.ended(j2), every=0.2) or c.job(j2)
    checks.check(j.get("state") == "succeeded", "the racing job ends", json.dumps(j)[:600])
    def variant(step):
        return ("the root-only file's own path" if step == 22 else "a registered link"
                if step == 21 else "a flipped directory" if step % 2 == 0 else
                "a flipped single file")
    registered, leaked = [], {}
    for step in range(1, 23):
        ck = c.checkpoint(j2, step)
        if not ck:
            continue
        registered.append(step)
        served = [(f.get("name"), c.api("GET", f.get("url") or "/v1/jobs/%d/checkpoints/%d/%s"
                                        % (j2, step, f.get("name")))[1])
                  for f in ck.get("files") or []]
        served.append(("%d.tar" % step, c.api("GET", "/v1/jobs/%d/checkpoints/%d.tar"
                                              % (j2, step))[1]))
        for name, body in served:
            if mark.encode() in body:
                leaked.setdefault(variant(step), []).append("step %d %s" % (step, name))
    log("  registered: steps %s" % registered)
    checks.check(not leaked, "no checkpoint the master serves holds the root-only file "
                 "(20 flipped, one link, the file's own path; every registered step)",
                 "served through %s" % "; ".join("%s: %s" % kv for kv in sorted(leaked.items())))
    checks.check(c.ready("m0", "n1") and c.get_json("/v1/jobs?limit=5") is not None,
                 "the daemon keeps working (its API answers, both nodes ready)",
                 json.dumps(c.nodes())[:600])

    phase("legitimate use: a 2-node job that restarts from its checkpoint")
    j = until(WAIT_S, lambda: c.ended(j0), every=0.2) or c.job(j0)
    logs = {}
    for r in (0, 1):
        status, body = c.api("GET", "/v1/jobs/%d/logs?rank=%d" % (j0, r))
        logs[r] = body.decode("utf-8", "replace")
    checks.check(j.get("state") == "succeeded" and len(j.get("attempts") or []) == 2,
                 "the 2-node job (m0, n1) restarts from its checkpoint and succeeds",
                 "%s; rank 1's log: %s" % (json.dumps(j)[:600], logs[1][-600:]))
    resumed = [r for r in (0, 1) if re.search(r"RESUMED rank %d from \S+: match" % r, logs[r])]
    checks.check(resumed == [0, 1], "both nodes' ranks read the checkpoint they resumed from "
                 "(n1's fetched from the master)", "rank 0: %s | rank 1: %s" % (
                     logs[0][-400:], logs[1][-400:]))
    uids = {r: set(re.findall(r"UID=(\d+)", logs[r])) for r in (0, 1)}
    identity = j.get("identity") or {}
    want = str(identity.get("uid"))
    checks.check(identity and uids[0] == {want} and uids[1] == {want},
                 "the job's ranks run under its own identity, the same uid on both nodes",
                 "identity %s; uids seen: rank 0 %s, rank 1 %s" % (identity or "(none)",
                                                                   uids[0], uids[1]))


if __name__ == "__main__":
    sys.exit(main())
