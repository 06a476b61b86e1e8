"""The integration tests' harness: a real traind per test, started, talked to and stopped.

    import harness
    harness.TRAIND = ...; harness.SOURCE_DIR = ...   (each test file's main, from its argv)

What it offers:
- Daemon: one `traind --listen 127.0.0.1:0 --state-dir DIR ...` (extra arguments, additions to
  its environment, HTTPS through ssl_context); start() reads the
  `traind: listening on http://127.0.0.1:PORT` line from its stderr and keeps draining stderr;
  stop() (SIGTERM) reports the job processes that outlived it, kill() (SIGKILL) leaves them to
  their shepherds; request()/json()/get_ok()/submit()/job()/metrics()/logs() over HTTP,
  events()/follow() over SSE (EventStream, Event).
- DaemonTest: a unittest.TestCase base with no tests of its own: new_state_dir(),
  start_daemon() (a daemon_class, Daemon unless a test class names a subclass; stopped at
  cleanup, which fails the test if a process of its jobs outlived it; TRAIND_TEST_KEEP=1 keeps
  a failed test's state directories), and the API's assertions
  (assert_job, assert_error, assert_healthy, assert_consecutive, assert_final).
- Job specs and data: train_spec (LeNet-5 on synthetic data), expected_log_steps, write_idx,
  write_npy.
- Waiting: wait_for (polls what only polling can see, with a deadline), wait_exited (pidfds).
- /proc: proc_stat, all_pids, proc_table, descendants, cmdline, environ, proc_cwd, exe_name,
  is_traind_worker, lingering, describe_procs, shepherd_pid.
- Constants: TIMEOUT (every socket), START_TIMEOUT, EXIT_TIMEOUT, STREAM_DEADLINE, ISO_RE,
  FINAL_STATES, ALL_STATES, JOB_FIELDS, ATTEMPT_FIELDS.

TRAIND and SOURCE_DIR are this module's globals, read when used (Daemon.start reads TRAIND), so
a test file sets them as `harness.TRAIND = ...`; `from harness import TRAIND` would copy the
None they hold at import. Standard library only; every socket has a timeout, so a daemon bug
fails a test instead of hanging it. Nothing waits by sleeping: the harness reads the daemon's
stderr, the SSE stream and pidfds. The multi-node tests (network namespaces) build their own
clusters: netns.sh, and the Cluster classes of chaos.py and security_cluster.py.
"""
import collections
import http.client
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

TRAIND = None  # the traind binary: each test file's main sets it from its argv
SOURCE_DIR = None  # the source tree, likewise

TIMEOUT = 60.0  # seconds, on every socket: a stuck daemon fails the test, never hangs it
START_TIMEOUT = 30.0  # until the "listening" line
EXIT_TIMEOUT = 30.0  # for processes that must die (a job's, once its daemon stopped it)
STREAM_DEADLINE = 180.0  # the longest any test follows one event stream

LISTEN_RE = re.compile(r"^traind: listening on https?://127\.0\.0\.1:(\d+)\s*$")
ISO_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
FINAL_STATES = ("succeeded", "failed", "cancelled")
ALL_STATES = ("queued", "running", "restarting", "paused") + FINAL_STATES
JOB_FIELDS = ("id", "name", "kind", "state", "nproc", "max_restarts", "restarts", "created_at",
              "started_at", "finished_at", "exit_code", "reason", "attempts", "latest",
              "checkpoints")
ATTEMPT_FIELDS = ("attempt", "started_at", "finished_at", "exit_code", "reason")

Event = collections.namedtuple("Event", "id event data")


# ---------------------------------------------------------------------------------------------
# Job specs

def train_spec(name, epochs=1, nproc=None, max_restarts=None, max_steps=None, checkpoint=True):
    """LeNet-5 on 2048 synthetic 28x28 samples, batch 64: 32 steps per epoch for one rank (16 per
    rank for two), about 3 ms a step on one core; a train event every 5 steps and at the last,
    a checkpoint every 10 steps and at the end."""
    spec = {
        "name": name,
        "model": {"preset": "lenet5", "num_classes": 10},
        "data": {"format": "synthetic", "shape": [1, 28, 28], "num_classes": 10, "size": 2048},
        "train": {"epochs": epochs, "batch_size": 64, "seed": 1, "threads": 1,
                  "optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9}},
        "log": {"every_steps": 5},
    }
    if checkpoint:
        spec["checkpoint"] = {"every_steps": 10}
    if max_steps is not None:
        spec["train"]["max_steps"] = max_steps
    if nproc is not None:
        spec["resources"] = {"nproc": nproc}
    if max_restarts is not None:
        spec["restart"] = {"max_restarts": max_restarts}
    return spec


def wait_for(f, what, timeout=TIMEOUT):
    """f()'s first true value, polled every 50 ms (for what only polling can see: a file, a
    browser's page); an AssertionError naming what after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def expected_log_steps(total, every=5):
    """traind-worker logs every `every` steps and at the last one."""
    steps = list(range(every, total + 1, every))
    if not steps or steps[-1] != total:
        steps.append(total)
    return steps


def write_idx(images_path, labels_path, n=64):
    """A tiny IDX data set (uncompressed): n 28x28 uint8 images and n labels in 0..9."""
    with open(images_path, "wb") as f:
        f.write(struct.pack(">IIII", 0x00000803, n, 28, 28))
        f.write(bytes((i * 7 + i // 784) % 256 for i in range(n * 784)))
    with open(labels_path, "wb") as f:
        f.write(struct.pack(">II", 0x00000801, n))
        f.write(bytes(i % 10 for i in range(n)))


def write_npy(path, descr, shape, data):
    """A .npy file (format 1.0) of raw little-endian `data`."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (63 - len(header) - 10) + "\n"  # the whole preamble is 64 bytes
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)


# ---------------------------------------------------------------------------------------------
# /proc

def proc_stat(pid):
    """(state, ppid, pgrp) of a process, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and ')'
    return fields[0], int(fields[1]), int(fields[2])


def all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def proc_table():
    table = {}
    for pid in all_pids():
        st = proc_stat(pid)
        if st:
            table[pid] = st
    return table


def descendants(root):
    children = collections.defaultdict(list)
    for pid, (_, ppid, _) in proc_table().items():
        children[ppid].append(pid)
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def shepherd_pid(d, job_id, attempt):
    """The pid of the traind-shepherd of a job's attempt."""
    tail = f"/jobs/{job_id}/attempt-{attempt}.node-0.json"

    def find():
        return next((p for p in d.job_processes()
                     if any(a.endswith(tail) for a in cmdline(p))), None)
    return wait_for(find, f"the shepherd of job {job_id} attempt {attempt}")


def proc_cwd(pid):
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def exe_name(pid):
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def is_traind_worker(pid):
    return exe_name(pid) == "traind-worker" or any(
        os.path.basename(a) == "traind-worker" for a in cmdline(pid)[:1])


def lingering(pid, reaper=None):
    """True while the process exists, counting a zombie only when `reaper` (the daemon, which
    must wait for its own children) is its parent: a zombie reparented elsewhere has exited."""
    st = proc_stat(pid)
    if st is None:
        return False
    state, ppid, _ = st
    return state != "Z" or (reaper is not None and ppid == reaper)


def wait_exited(pids, timeout=EXIT_TIMEOUT):
    """Waits until each process has exited (pidfd readability is the exit event); returns the
    ones still running at the deadline."""
    deadline = time.monotonic() + timeout
    left = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            try:
                ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            finally:
                os.close(fd)
            if not ready:
                left.append(pid)
            continue
        # No pidfd (old kernel or Python): there is no exit event to wait for on a process that
        # is not our child, so poll /proc against the deadline.
        while lingering(pid) and time.monotonic() < deadline:
            select.select([], [], [], 0.05)
        if lingering(pid):
            left.append(pid)
    return left


def remove_cgroup_tree(path):
    """Removes a daemon's cgroup subtree left behind (empty cgroups only: rmdir, deepest first);
    what still holds a process stays."""
    if not path or not path.startswith("/sys/fs/cgroup"):
        return
    for root, dirs, _ in os.walk(path, topdown=False):
        for d in dirs:
            try:
                os.rmdir(os.path.join(root, d))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def describe_procs(pids):
    return "; ".join(f"{pid} {proc_stat(pid)} {' '.join(cmdline(pid))}" for pid in pids)


# ---------------------------------------------------------------------------------------------
# The daemon, its HTTP API and its event streams

def line_text(line):
    """A log line as text: --log-format json's object becomes "traind: " and its msg."""
    if line.startswith("{"):
        try:
            return "traind: " + json.loads(line)["msg"]
        except (ValueError, KeyError, TypeError):
            return line
    return line


class Daemon:
    """One traind process: start() it, then talk to it with request()/json()/events()."""

    def __init__(self, state_dir, args=(), env=None):
        self.state_dir = state_dir
        self.args = list(args)
        self.env = dict(env or {})  # added to the daemon's environment
        self.ssl_context = None  # set before start() for a daemon that serves HTTPS
        self.proc = None
        self.port = None
        self.token = None
        self.stderr_lines = []
        self._lock = threading.Lock()
        self._drainer = None
        self.stdout_path = None

    # -- process

    def start(self, token=None):
        """token: the one to use, for a state directory whose token file is gone (revoked)."""
        fd, self.stdout_path = tempfile.mkstemp(prefix="traind-stdout-", suffix=".log")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        env.pop("PYTHONUNBUFFERED", None)  # as systemd starts it: the daemon must see to it
        env.setdefault("TRAIND_CONFIG", "")  # never the machine's /etc/traind/traind.json
        env.update(self.env)
        argv = [TRAIND, "--listen", "127.0.0.1:0", "--state-dir", self.state_dir] + self.args
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd,
                                     stderr=subprocess.PIPE, env=env, start_new_session=True)
        os.close(fd)
        self._wait_listening()
        if token:
            self.token = token
            return self
        with open(os.path.join(self.state_dir, "token")) as f:
            self.token = f.read().strip()
        if not self.token:
            raise AssertionError("traind wrote an empty token file")
        return self

    @property
    def pid(self):
        return self.proc.pid

    def _add_line(self, raw):
        with self._lock:
            self.stderr_lines.append(raw.decode(errors="replace").rstrip("\r"))

    def _wait_listening(self):
        fd = self.proc.stderr.fileno()
        deadline = time.monotonic() + START_TIMEOUT
        buf = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"traind printed no listening line within {START_TIMEOUT} s; "
                                     f"stderr so far:\n{self.stderr_tail()}")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                rc = self.proc.wait(timeout=TIMEOUT)
                if buf:
                    self._add_line(buf)
                raise AssertionError(f"traind exited ({rc}) before listening; stderr:\n"
                                     f"{self.stderr_tail()}")
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self._add_line(line)
                m = LISTEN_RE.match(line_text(line.decode(errors="replace")))
                if m:
                    self.port = int(m.group(1))
                    # keep draining stderr so the daemon never blocks on a full pipe
                    self._drainer = threading.Thread(target=self._drain, args=(fd, buf),
                                                     daemon=True)
                    self._drainer.start()
                    return

    def _drain(self, fd, buf):
        # the lines that came in the listening line's chunk first: they may be all there is
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            self._add_line(line)
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                if buf:
                    self._add_line(buf)
                self.proc.stderr.close()
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self._add_line(line)

    def stderr_tail(self, n=60):
        with self._lock:
            lines = self.stderr_lines[-n:]
        out = "\n".join(lines)
        try:
            with open(self.stdout_path, errors="replace") as f:
                stdout = f.read()[-4000:]
            if stdout:
                out += "\n--- traind stdout ---\n" + stdout
        except (OSError, TypeError):
            pass
        return out

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def job_processes(self):
        """The daemon's descendants, plus any process whose command line names the state dir or
        that runs in it: the jobs' shepherds (traind-shepherd STATE/jobs/ID/attempt-...) and
        their ranks (whose working directory is the job's) outlive a killed daemon."""
        pids = descendants(self.pid) if self.alive() else set()
        for pid in all_pids():
            if pid == self.pid or pid == os.getpid():
                continue
            if any(self.state_dir in a for a in cmdline(pid)) or \
                    proc_cwd(pid).startswith(self.state_dir + "/"):
                pids.add(pid)
        return pids

    def kill(self):
        """SIGKILL the daemon alone, as a crash would. Its jobs' shepherds and ranks run on
        (a restarted daemon re-attaches to them). Returns their pids."""
        if not self.alive():
            return set()
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=TIMEOUT)
        return {p for p in self.job_processes() if lingering(p)}

    def stop(self):
        """SIGTERM, as systemctl stop: the daemon stops its jobs (keep_jobs_on_stop is false by
        default) and exits. Returns a description of the processes that outlived it (killed
        here, as cleanup); a daemon that does not exit in time is SIGKILLed and counts."""
        if not self.alive():
            # a daemon killed by the test: what it left is the test's (a crash test that did
            # not restart one), removed without blame
            for pid in self.job_processes():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            remove_cgroup_tree(self.cgroup_subtree())
            return []
        procs = self.job_processes()
        os.kill(self.pid, signal.SIGTERM)
        hung = False
        try:
            self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            hung = True
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(timeout=TIMEOUT)
        survivors = [p for p in wait_exited(sorted(procs | self.job_processes()))
                     if lingering(p)]
        desc = describe_procs(survivors) if survivors else ""
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if hung:
            return [f"the daemon did not exit within {TIMEOUT} s of SIGTERM. {desc}"]
        if survivors:
            return [desc]
        # nothing of it runs: the cgroup subtree it made for its attempts went with it
        subtree = self.cgroup_subtree()
        if subtree and os.path.isdir(subtree):
            remove_cgroup_tree(subtree)
            return [f"its attempts' cgroup subtree {subtree} was left behind"]
        return []

    def cgroup_subtree(self):
        """The cgroup the daemon said its attempts run under (its start-up log), or None."""
        with self._lock:
            lines = list(self.stderr_lines)
        for line in lines:
            m = re.search(r"each attempt runs in a cgroup of its own under (\S+) ", line)
            if m:
                return m.group(1)
        return None

    def workers(self, kind_check=is_traind_worker):
        """[(pid, pgrp, environ)] of its jobs' processes (job_processes) that are traind-worker
        processes: a re-attached job's ranks are not the daemon's descendants."""
        out = []
        for pid in sorted(self.job_processes()):
            st = proc_stat(pid)
            if st and st[0] != "Z" and kind_check(pid):
                out.append((pid, st[2], environ(pid)))
        return out

    # -- HTTP

    def connect(self, timeout=TIMEOUT):
        if self.ssl_context is not None:  # a daemon started with --tls-cert
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout,
                                               context=self.ssl_context)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def _headers(self, token, headers, body_is_json):
        h = {}
        if token is True:
            h["Authorization"] = "Bearer " + self.token
        elif token:
            h["Authorization"] = "Bearer " + token
        if body_is_json:
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        return h

    def request(self, method, path, body=None, headers=None, token=True, timeout=TIMEOUT):
        """(status, {lower-case header: value}, body bytes). body: bytes, or an object sent as
        JSON. token: True for the daemon's, False for none, or a string to send instead."""
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
        conn = self.connect(timeout)
        try:
            conn.request(method, path, body=body,
                         headers=self._headers(token, headers, body is not None))
            resp = conn.getresponse()
            data = resp.read()
            hdrs = {}
            for k, v in resp.getheaders():
                k = k.lower()
                hdrs[k] = hdrs[k] + ", " + v if k in hdrs else v
            return resp.status, hdrs, data
        finally:
            conn.close()

    def json(self, method, path, body=None, **kw):
        """(status, headers, decoded JSON body)."""
        status, hdrs, data = self.request(method, path, body, **kw)
        try:
            obj = json.loads(data) if data else None
        except ValueError:
            raise AssertionError(f"{method} {path}: {status} with a body that is not JSON: "
                                 f"{data[:500]!r}")
        return status, hdrs, obj

    def get_ok(self, path):
        status, _, obj = self.json("GET", path)
        if status != 200:
            raise AssertionError(f"GET {path}: {status} {obj}")
        return obj

    def submit(self, spec):
        status, hdrs, job = self.json("POST", "/v1/jobs", spec)
        if status != 201:
            raise AssertionError(f"POST /v1/jobs: {status} {job}")
        return job, hdrs

    def job(self, job_id):
        return self.get_ok(f"/v1/jobs/{job_id}")

    def metrics(self, job_id, since=None):
        return self.get_ok(f"/v1/jobs/{job_id}/metrics" + ("" if since is None else
                                                           f"?since={since}"))

    def logs(self, job_id, rank=0):
        status, hdrs, data = self.request("GET", f"/v1/jobs/{job_id}/logs?rank={rank}")
        if status != 200:
            raise AssertionError(f"logs of job {job_id} rank {rank}: {status} {data[:300]!r}")
        return hdrs, data.decode(errors="replace")

    def events(self, job_id, last_event_id=None, query=""):
        headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        return EventStream(self, f"/v1/jobs/{job_id}/events{query}", headers)

    def follow(self, job_id):
        """Every event of the job, from its start until the server closes the stream."""
        with self.events(job_id) as stream:
            return stream.rest()


class EventStream:
    """A Server-Sent Events response, read line by line: iterating yields Event(id, event,
    data) with the data decoded from JSON, and stops when the server closes the stream."""

    def __init__(self, daemon, path, headers, deadline=STREAM_DEADLINE):
        self.path = path
        self.conn = daemon.connect()
        self.ended = False
        # keep-alive comments every 15 s defeat the socket timeout: a stream whose awaited event
        # never comes must still fail the test
        self.deadline = time.monotonic() + deadline
        h = daemon._headers(True, headers, False)
        h["Accept"] = "text/event-stream"
        self.conn.request("GET", path, headers=h)
        self.resp = self.conn.getresponse()
        if self.resp.status != 200:
            body = self.resp.read()
            self.conn.close()
            raise AssertionError(f"GET {path}: {self.resp.status} {body[:500]!r}")
        ctype = self.resp.getheader("Content-Type", "")
        if not ctype.startswith("text/event-stream"):
            self.conn.close()
            raise AssertionError(f"GET {path}: Content-Type {ctype!r}, expected text/event-stream")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.conn.close()

    def __iter__(self):
        return self

    def __next__(self):
        ev_id, name, data, started = None, None, [], False
        while True:
            if time.monotonic() > self.deadline:
                raise AssertionError(f"{self.path}: still open after {STREAM_DEADLINE} s")
            line = self.resp.readline()
            if not line or not line.endswith(b"\n"):
                self.ended = True
                if started or line:
                    raise AssertionError(f"{self.path}: the stream closed in the middle of an "
                                         f"event: {line!r}")
                raise StopIteration
            line = line.rstrip(b"\n").rstrip(b"\r").decode()
            if not line:
                if started:
                    if ev_id is None:
                        raise AssertionError(f"{self.path}: an event without an id: {name} {data}")
                    try:
                        payload = json.loads("\n".join(data))
                    except ValueError:
                        raise AssertionError(f"{self.path}: event {ev_id} {name}: data is not "
                                             f"JSON: {data!r}")
                    return Event(ev_id, name or "message", payload)
                continue
            if line.startswith(":"):  # a comment (keep-alive)
                continue
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "id":
                ev_id, started = int(value), True
            elif field == "event":
                name, started = value, True
            elif field == "data":
                data.append(value)
                started = True
            # "retry" and unknown fields are ignored, as browsers do

    def take(self, n):
        out = []
        for ev in self:
            out.append(ev)
            if len(out) == n:
                return out
        raise AssertionError(f"{self.path}: the stream ended after {len(out)} of {n} events")

    def until(self, pred, what="the awaited event"):
        """Events up to and including the first one for which pred(event) is true."""
        out = []
        for ev in self:
            out.append(ev)
            if pred(ev):
                return out
        raise AssertionError(f"{self.path}: the stream ended before {what}; got "
                             f"{[(e.id, e.event, e.data) for e in out]}")

    def rest(self):
        """Every remaining event, until the server closes the stream."""
        out = list(self)
        if not self.ended:
            raise AssertionError(f"{self.path}: stream not closed")
        return out


# ---------------------------------------------------------------------------------------------
# A TestCase base: fixtures and the API's assertions, no tests

class DaemonTest(unittest.TestCase):
    maxDiff = 4000
    # what start_daemon makes: a test class that needs more of each daemon (security_http_test's
    # RawDaemon keeps stderr as bytes) names its Daemon subclass here
    daemon_class = Daemon

    # -- fixtures

    def new_state_dir(self):
        path = os.path.realpath(tempfile.mkdtemp(prefix="traind-daemon-test-"))

        def remove():
            if os.environ.get("TRAIND_TEST_KEEP") and self._failed():
                print(f"\n[harness] kept {path}", file=sys.stderr)
            else:
                shutil.rmtree(path, ignore_errors=True)

        self.addCleanup(remove)
        return path

    def start_daemon(self, *args, state_dir=None, env=None, ssl_context=None):
        if state_dir is None:
            state_dir = self.new_state_dir()
        d = self.daemon_class(state_dir, args, env)
        d.ssl_context = ssl_context  # for a daemon given --tls-cert
        self.addCleanup(self._stop_daemon, d)
        d.start()
        return d

    def _failed(self):
        """Whether the test has failed so far, also from a cleanup: since Python 3.11 the
        outcome's `success` is reset for each cleanup, while the result already holds the
        failure."""
        outcome = getattr(self, "_outcome", None)
        if outcome is None:
            return False
        result = getattr(outcome, "result", None)
        if result is not None and any(t is self for t, _ in
                                      list(result.failures) + list(result.errors)):
            return True
        if any(exc for _, exc in getattr(outcome, "errors", ())):  # before 3.11
            return True
        return not getattr(outcome, "success", True)

    def _stop_daemon(self, d):
        if d.proc is None:
            return
        survivors = d.stop()
        if d._drainer is not None:
            d._drainer.join(timeout=10)  # it ends at EOF, once the daemon is gone
        elif d.proc.stderr and not d.proc.stderr.closed:
            d.proc.stderr.close()
        if d.stdout_path:
            if self._failed() or survivors:
                print(f"\n[harness] {self.id()}: traind (pid {d.pid}, port {d.port}) "
                      f"stderr:\n{d.stderr_tail()}", file=sys.stderr)
            try:
                os.unlink(d.stdout_path)
            except OSError:
                pass
        if survivors:
            raise AssertionError(f"processes outlived the stopped daemon: {survivors}")

    # -- assertions

    def assert_job(self, job, job_id=None):
        for key in JOB_FIELDS:
            self.assertIn(key, job, f"job object lacks {key}: {job}")
        if job_id is not None:
            self.assertEqual(job["id"], job_id)
        self.assertIsInstance(job["id"], int)
        self.assertIn(job["state"], ALL_STATES)
        self.assertIn(job["kind"], ("train", "command"))
        self.assertRegex(job["created_at"], ISO_RE)
        for key in ("started_at", "finished_at"):
            if job[key] is not None:
                self.assertRegex(job[key], ISO_RE)
        self.assertIsInstance(job["attempts"], list)
        for a in job["attempts"]:
            for key in ATTEMPT_FIELDS:
                self.assertIn(key, a, f"attempt lacks {key}: {a}")
        self.assertIsInstance(job["latest"], dict)
        self.assertIn("train", job["latest"])
        self.assertIn("eval", job["latest"])
        self.assertIsInstance(job["checkpoints"], int)

    def assert_error(self, resp, status, codes, field=Ellipsis, what=""):
        """resp: (status, headers, obj) from Daemon.json. codes: one code or a tuple. field: the
        expected `field`, a compiled regex for it, or Ellipsis for any."""
        got_status, _, obj = resp
        if isinstance(codes, str):
            codes = (codes,)
        self.assertEqual(got_status, status, f"{what}: {obj}")
        self.assertIsInstance(obj, dict, what)
        err = obj.get("error")
        self.assertIsInstance(err, dict, f"{what}: {obj}")
        self.assertIn(err.get("code"), codes, f"{what}: {obj}")
        self.assertIsInstance(err.get("message"), str, f"{what}: {obj}")
        self.assertTrue(err["message"], f"{what}: empty message")
        self.assertIn("field", err, f"{what}: no field member: {obj}")
        if isinstance(field, re.Pattern):
            self.assertIsInstance(err["field"], str, f"{what}: {obj}")
            self.assertRegex(err["field"], field, f"{what}: {obj}")
        elif field is not Ellipsis:
            self.assertEqual(err["field"], field, f"{what}: {obj}")
        return err

    def assert_healthy(self, d, what=""):
        status, _, obj = d.json("GET", "/v1/health", token=False)
        self.assertEqual((status, (obj or {}).get("status")), (200, "ok"), f"health after {what}")

    def assert_consecutive(self, events):
        ids = [e.id for e in events]
        self.assertEqual(ids, list(range(ids[0], ids[0] + len(ids))) if ids else [],
                         "event ids must increase by exactly one")

    def assert_final(self, d, job_id, events, state):
        """The stream ended with the `state` event of `state`, and the job says so too."""
        self.assertTrue(events, "no events")
        last = events[-1]
        job = d.job(job_id)
        if (last.event, last.data.get("state")) != ("state", state) or job["state"] != state:
            try:
                _, log = d.logs(job_id)
            except AssertionError as e:
                log = str(e)
            self.fail(f"job {job_id}: expected to end {state}; last event {last}, job {job}\n"
                      f"rank 0 log tail:\n{log[-3000:]}")
        return job

    def job_pgroups_members(self, pgids):
        return sorted(pid for pid, (_, _, pg) in proc_table().items() if pg in pgids)
