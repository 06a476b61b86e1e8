#!/usr/bin/python3
"""Security of traind's HTTP side against a real daemon (issue 42, findings 9, 10, 13 and the
HTTP parts of 14): what a client holding a submit-scope token, or no token at all, can do to the
server itself. Each test makes the attack and asserts that it fails, and that legitimate use goes
on working beside it.

    /usr/bin/python3 tests/integration/security_http_test.py TRAIND SOURCE_DIR [test names]

- slowloris (loopback only, bounded): thousands of connections from 127.0.0.2 that never finish
  their headers leave 127.0.0.1 served promptly; a source address holds at most
  `--max-connections-per-ip` connections; a connection that stays unfinished is closed after
  `--connection-timeout` seconds;
- anonymous bodies: the token is checked when the headers are in, so 300 anonymous 1 MiB POSTs
  are each answered 401 and the daemon's memory does not grow with them;
- paths: `%00` and an encoded `/` are a 400 instead of cutting or splitting the path; control
  characters and bytes that are not UTF-8, in a path or a job's words, never reach the daemon's
  log raw (no forged log line), and the audit log keeps a record of every mutating request;
- per-token quotas: browser sessions (a token's sign-ins end only its own oldest session), event
  streams (a followed log counts as one), bytes of job specs held (cancelled jobs count until
  deleted);
- a state directory of 10,000 jobs: the daemon listens within 5 s of its start.

Standard library only; every socket has a timeout or a deadline, so a daemon bug fails a test
instead of hanging it; nothing sleeps to synchronise (the daemon's answers, its stderr once it
stopped, and poll() on the attackers' sockets say when something happened)."""
import errno
import http.client
import json
import os
import re
import resource
import select
import socket
import sqlite3
import struct
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

MIB = 1 << 20
ATTACKER_ADDR = "127.0.0.2"  # the slowloris's source address (any 127/8 address is loopback)
PROMPT_S = 3.0  # "served promptly": a request from 127.0.0.1 while an attack goes on
WRONG_TOKEN = "0" * 64
RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


def sleeper(name, seconds=120):
    """A command job that runs until cancelled (SIGTERM ends it at once)."""
    return {"name": name, "command": ["/bin/sleep", str(seconds)]}


def padded(name, size, command=("/bin/true",)):
    """A command job spec whose JSON (as Daemon.json sends it: json.dumps with its default
    separators) is exactly `size` bytes, padded with an environment variable."""
    spec = {"name": name, "command": list(command), "env": {"PAD": ""}}
    spec["env"]["PAD"] = "x" * (size - len(json.dumps(spec)))
    assert len(json.dumps(spec)) == size, (name, size)
    return spec


def sanitized():
    """Whether the traind under test is built with AddressSanitizer (build-asan): its memory and
    its speed are then not the shipped daemon's, so the figures below are not asserted."""
    with open(harness.TRAIND, "rb") as f:
        return b"__asan_init" in f.read()


def proc_status_kib(pid, key):
    """A "KEY: N kB" field of /proc/PID/status (VmRSS, VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {key}")


def bad_log_bytes(raw):
    """What in one raw line of the daemon's stderr (its '\\n' already split off) should never be
    there: a C0 control character, DEL, bytes that are not UTF-8, or a C1 control character
    (U+0080..U+009F: NEL is a line break to some log readers). None when the line is clean."""
    for i, b in enumerate(raw):
        if b < 0x20 or b == 0x7f:
            return f"control byte 0x{b:02x} at {i}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 ({e.reason} at {e.start})"
    for i, ch in enumerate(text):
        if 0x80 <= ord(ch) <= 0x9f:
            return f"C1 control character U+{ord(ch):04X} at character {i}"
    return None


class RawDaemon(harness.Daemon):
    """harness.Daemon that also keeps each stderr line as the bytes the daemon wrote (the
    harness's own lines are decoded with errors="replace" and lose a trailing '\\r')."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.raw_lines = []

    def _add_line(self, raw):
        self.raw_lines.append(bytes(raw))
        super()._add_line(raw)

    def finish(self):
        """Stops the daemon (SIGTERM) and reads its stderr to the end: every line it wrote, and
        every audit record of a request it answered, is then there to check."""
        survivors = self.stop()
        if self._drainer is not None:
            self._drainer.join(timeout=harness.TIMEOUT)
        if survivors:
            raise AssertionError(f"processes outlived the stopped daemon: {survivors}")


class Flock:
    """Raw client sockets, each of which sends the start of a request and then nothing more, as
    a slowloris does. Non-blocking, with deadlines: a server that stops accepting cannot hang
    the test. close() resets them all (SO_LINGER 0)."""

    def __init__(self):
        self.socks = []
        self.closed = set()  # indices the server closed (EOF or reset) or that never connected

    def open(self, n, source, port, prefix, deadline_s=20.0):
        pending = {}
        for i in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.socks.append(s)
            idx = len(self.socks) - 1
            s.setblocking(False)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
            try:
                s.bind((source, 0))
            except OSError:
                self.closed.add(idx)
                continue
            err = s.connect_ex(("127.0.0.1", port))
            if err in (0, errno.EINPROGRESS):
                pending[s.fileno()] = idx
            else:
                self.closed.add(idx)
        poller = select.poll()
        for fd in pending:
            poller.register(fd, select.POLLOUT)
        deadline = time.monotonic() + deadline_s
        while pending and time.monotonic() < deadline:
            for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                idx = pending.pop(fd, None)
                if idx is None:
                    continue
                poller.unregister(fd)
                s = self.socks[idx]
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self.closed.add(idx)
                    continue
                try:
                    s.send(prefix)
                except OSError:
                    self.closed.add(idx)
        # what did not connect by the deadline stays as it is: an attempt the server left waiting
        return self

    def open_count(self, wait_ms=0):
        """How many the server has not closed yet (reads and drops whatever it sent them)."""
        poller = select.poll()
        live = {}
        for idx, s in enumerate(self.socks):
            if idx not in self.closed and s.fileno() >= 0:
                live[s.fileno()] = idx
                poller.register(s.fileno(), select.POLLIN)
        for fd, _ in poller.poll(wait_ms):
            idx = live[fd]
            s = self.socks[idx]
            while True:
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    break
                except OSError:
                    self.closed.add(idx)
                    break
                if not data:
                    self.closed.add(idx)
                    break
        return len(self.socks) - len(self.closed)

    def wait_all_closed(self, deadline_s):
        """Blocks in poll() until the server has closed every one, or deadline_s passed; returns
        how many are still open."""
        deadline = time.monotonic() + deadline_s
        left = self.open_count()
        while left and time.monotonic() < deadline:
            left = self.open_count(max(1, int(min(1.0, deadline - time.monotonic()) * 1000)))
        return left

    def close(self):
        for s in self.socks:
            s.close()
        self.socks, self.closed = [], set()


def raise_fd_limit(testcase, want):
    """Raises this process's RLIMIT_NOFILE soft limit towards `want` (the daemons it starts
    inherit it, as a unit's LimitNOFILE= would give them); restored at cleanup. Returns the soft
    limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return soft
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    testcase.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))
    return new


def send_raw_requests(port, clients, deadline_s):
    """clients: [(source address, request bytes)], sent to 127.0.0.1:port all at once over
    non-blocking sockets, each one's status line read. A server may answer before it has read
    the body and then close or reset the connection: sending stops there, and what it answered
    is still read. Returns [status or None] in order, and [what went wrong with each request
    not answered 401]."""
    socks, out, sent, got, status, done, notes = [], [], [], [], [], [], []
    poller = select.poll()
    by_fd = {}
    try:
        for i, (source, data) in enumerate(clients):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
            s.bind((source, 0))
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            out.append(memoryview(data))
            sent.append(0)
            got.append(bytearray())
            status.append(None)
            done.append(False)
            notes.append("")
            by_fd[s.fileno()] = i
            poller.register(s.fileno(), select.POLLIN | select.POLLOUT)
        deadline = time.monotonic() + deadline_s
        left = len(socks)
        while left and time.monotonic() < deadline:
            for fd, ev in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                i = by_fd[fd]
                if done[i]:
                    continue
                s = socks[i]
                finished = False
                if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    try:
                        chunk = s.recv(65536)
                        if chunk:
                            got[i] += chunk
                        else:
                            finished = True
                            notes[i] = notes[i] or "closed"
                    except BlockingIOError:
                        pass
                    except OSError as e:
                        finished = True
                        notes[i] = notes[i] or f"recv: {e!r}"
                    if b"\r\n" in got[i]:
                        m = re.match(rb"HTTP/1\.[01] (\d{3}) ", bytes(got[i]))
                        status[i] = int(m.group(1)) if m else None
                        if status[i] != 100:
                            finished = True
                        else:  # 100 Continue: the final status follows
                            del got[i][:got[i].index(b"\r\n") + 2]
                elif ev & select.POLLOUT and sent[i] < len(out[i]):
                    try:
                        sent[i] += s.send(out[i][sent[i]:sent[i] + 262144])
                    except BlockingIOError:
                        pass
                    except OSError as e:  # the server stopped reading: its answer is still read
                        notes[i] = f"send: {e!r} after {sent[i]} bytes"
                        sent[i] = len(out[i])
                    if sent[i] >= len(out[i]):
                        poller.modify(fd, select.POLLIN)
                if finished:
                    done[i] = True
                    left -= 1
                    poller.unregister(fd)
        for i in range(len(socks)):
            if not done[i]:
                notes[i] = f"no answer within {deadline_s} s ({sent[i]} bytes sent)"
        return status, [f"#{i}: {status[i]} {notes[i]}" for i in range(len(socks))
                        if status[i] != 401]
    finally:
        for s in socks:
            s.close()


class SecurityHttpTest(harness.DaemonTest):
    daemon_class = RawDaemon  # start_daemon's daemons keep their stderr as bytes too

    # -- fixtures

    def make_token(self, d, name, scope="submit"):
        status, _, obj = d.json("POST", "/v1/tokens", {"name": name, "scope": scope})
        self.assertEqual(status, 201, obj)
        return obj["token"]

    def get_from(self, d, source, path="/v1/jobs", token=True, timeout=10.0):
        """(status, seconds) of a GET from the given source address."""
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=timeout,
                                          source_address=(source, 0))
        started = time.monotonic()
        try:
            conn.request("GET", path, headers=d._headers(token, None, False))
            resp = conn.getresponse()
            resp.read()
            return resp.status, time.monotonic() - started
        finally:
            conn.close()

    def served_from(self, d, source, token):
        """Whether a GET /v1/jobs from that source address gets its 200 (a refused or reset
        connection is a no)."""
        try:
            return self.get_from(d, source, token=token)[0] == 200
        except (OSError, http.client.HTTPException):
            return False

    def assert_served_promptly(self, d, token, what):
        for n in range(3):
            try:
                status, took = self.get_from(d, "127.0.0.1", token=token, timeout=PROMPT_S + 2)
            except (OSError, http.client.HTTPException) as e:
                status, took = f"no answer: {e!r}", None
            self.assertEqual(status, 200, f"{what}: GET /v1/jobs from 127.0.0.1 (try {n + 1})")
            self.assertLess(took, PROMPT_S,
                            f"{what}: GET /v1/jobs from 127.0.0.1 took {took:.2f} s")

    def flock(self):
        f = Flock()
        self.addCleanup(f.close)
        return f

    def audit(self, d):
        """The audit log's records; each line must be one JSON object, the file UTF-8."""
        with open(os.path.join(d.state_dir, "audit.log"), "rb") as f:
            raw = f.read()
        records = []
        for n, line in enumerate(raw.split(b"\n")[:-1], 1):
            self.assertIsNone(bad_log_bytes(line), f"audit.log line {n}: {line!r}")
            try:
                records.append(json.loads(line.decode("utf-8")))
            except ValueError:
                self.fail(f"audit.log line {n} is not JSON: {line!r}")
        self.assertTrue(raw.endswith(b"\n") or not raw, "audit.log ends in the middle of a line")
        return records

    def assert_clean_log(self, d, what):
        bad = [(n, why, line) for n, line in enumerate(d.raw_lines, 1)
               for why in [bad_log_bytes(line)] if why]
        if bad:
            self.fail(f"{what}: raw bytes in the daemon's log:\n" +
                      "\n".join(f"line {n}: {why}: {line!r}" for n, why, line in bad[:10]))

    def open_stream(self, d, path, token):
        """(connection, response) of a GET that may stay open (an event stream, a followed log);
        a refused one's body is read and its connection closed."""
        conn = d.connect(timeout=15)
        conn.request("GET", path, headers=d._headers(token, None, False))
        resp = conn.getresponse()
        if resp.status != 200:
            resp.body = resp.read()
            conn.close()
        return conn, resp

    # -- finding 9: connections that never finish their headers

    def test_slowloris_defaults(self):
        """4,096 connections from 127.0.0.2 that never finish their headers, against a daemon
        with its default limits (max_connections_per_ip 128, connection_timeout_s 30): 127.0.0.1
        is still served promptly, and the daemon holds at most 128 of the attacker's."""
        n = 4096
        limit = raise_fd_limit(self, n + 512)
        n = min(n, limit - 512)
        self.assertGreaterEqual(n, 1000, f"RLIMIT_NOFILE {limit} leaves too few descriptors")
        d = self.start_daemon("--slots", "1")
        user = self.make_token(d, "mallory")
        self.assert_served_promptly(d, user, "before the attack")
        attack = self.flock().open(n, ATTACKER_ADDR, d.port,
                                   b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        self.assert_served_promptly(d, user, f"{n} unfinished connections from {ATTACKER_ADDR}")
        self.assertTrue(d.alive(), "the daemon died under the attack")
        harness.wait_for(lambda: attack.open_count() <= 128,
                         "the daemon to keep at most 128 connections of one address",
                         timeout=20)
        self.assert_served_promptly(d, user, "the attack still on")
        attack.close()
        # the attacker's address is served again once its connections are gone
        harness.wait_for(lambda: self.served_from(d, ATTACKER_ADDR, user),
                         f"a GET from {ATTACKER_ADDR} after the attack ended")

    def test_slowloris_per_ip_limit(self):
        """--max-connections-per-ip 32: of 1,000 unfinished connections from 127.0.0.2 the daemon
        keeps at most 32 (well before its 60 s timeout could close them), 127.0.0.1 is served,
        and 127.0.0.2 is served again once its connections are gone."""
        raise_fd_limit(self, 1000 + 512)
        d = self.start_daemon("--slots", "1", "--max-connections-per-ip", "32",
                              "--connection-timeout", "60")
        user = self.make_token(d, "mallory")
        attack = self.flock().open(1000, ATTACKER_ADDR, d.port,
                                   b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        self.assert_served_promptly(d, user, f"1000 unfinished connections from {ATTACKER_ADDR}")
        harness.wait_for(lambda: attack.open_count() <= 32,
                         "the daemon to keep at most 32 connections from one address",
                         timeout=20)
        self.assertGreater(attack.open_count(), 0,
                           "a limit of 32 per address, not none: some stay until the timeout")
        # one more from the attacker's address is not served while it holds its 32
        try:
            status, _ = self.get_from(d, ATTACKER_ADDR, token=user, timeout=5)
        except (OSError, http.client.HTTPException):
            status = None
        self.assertNotEqual(status, 200, f"a 33rd connection from {ATTACKER_ADDR} was served")
        self.assert_served_promptly(d, user, "the attack still on")
        attack.close()
        harness.wait_for(lambda: self.served_from(d, ATTACKER_ADDR, user),
                         f"a GET from {ATTACKER_ADDR} after the attack ended")

    def test_connection_timeout(self):
        """--connection-timeout 3: connections that stop in the middle of their headers (and some
        that send nothing) are closed by the daemon within a few seconds of it; a client that
        finishes its request is served."""
        d = self.start_daemon("--slots", "1", "--max-connections-per-ip", "32",
                              "--connection-timeout", "3")
        user = self.make_token(d, "mallory")
        attack = self.flock()
        attack.open(10, ATTACKER_ADDR, d.port, b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        attack.open(10, ATTACKER_ADDR, d.port, b"G")
        attack.open(5, ATTACKER_ADDR, d.port, b"")
        started = time.monotonic()
        left = attack.wait_all_closed(20.0)
        took = time.monotonic() - started
        self.assertEqual(left, 0, f"{left} unfinished connections still open after {took:.1f} s "
                                  f"(--connection-timeout 3)")
        self.assertLess(took, 3 + 10, "closed long after the timeout")
        self.assert_served_promptly(d, user, "after the timeouts")
        self.assertEqual(self.get_from(d, ATTACKER_ADDR, token=user)[0], 200,
                         f"{ATTACKER_ADDR} served once its idle connections were closed")

    # -- finding 9: bodies read before the token is checked

    def test_anonymous_bodies_not_buffered(self):
        """300 POSTs of 1 MiB at once (100 from each of three loopback addresses, under the
        default per-address limit), with no token or a wrong one: each is answered 401, and the
        daemon's resident memory (now and at its peak) grows by far less than 300 MiB. An
        authenticated 900 KiB submission is still read and accepted."""
        d = self.start_daemon("--slots", "1")
        user = self.make_token(d, "mallory")
        for _ in range(3):  # warm: the first requests' allocations are not the attack's
            self.assertEqual(d.json("POST", "/v1/jobs", {"name": "x"}, token=False)[0], 401)
        rss0, hwm0 = (proc_status_kib(d.pid, k) for k in ("VmRSS", "VmHWM"))
        body = b"x" * MIB
        clients = []
        for i in range(300):
            auth = b"" if i % 2 else b"Authorization: Bearer " + WRONG_TOKEN.encode() + b"\r\n"
            head = (b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body) +
                    auth + b"\r\n")
            clients.append((f"127.0.0.{10 + i % 3}", head + body))
        _, wrong = send_raw_requests(d.port, clients, deadline_s=45.0)
        self.assertFalse(wrong, f"{len(wrong)} of 300 anonymous 1 MiB POSTs not answered 401:\n" +
                         "\n".join(wrong[:10]))
        self.assertTrue(d.alive(), "the daemon died")
        rss1, hwm1 = (proc_status_kib(d.pid, k) for k in ("VmRSS", "VmHWM"))
        grown, peak = (rss1 - rss0) / 1024, (hwm1 - hwm0) / 1024
        if sanitized():  # ASan's shadow memory and quarantine: no figure to hold it to
            grown = peak = 0
        self.assertLess(peak, 50, f"VmHWM (peak RSS) grew by {peak:.0f} MiB with 300 anonymous "
                                  f"1 MiB bodies ({hwm0} -> {hwm1} kB; VmRSS {rss0} -> {rss1} kB)")
        self.assertLess(grown, 50, f"VmRSS grew by {grown:.0f} MiB with 300 anonymous 1 MiB "
                                   f"bodies ({rss0} -> {rss1} kB)")
        # legitimate use: an authenticated body is read whole, and accepted
        status, _, job = d.json("POST", "/v1/jobs", padded("big", 900 * 1024), token=user)
        self.assertEqual(status, 201, job)
        self.assert_healthy(d, "300 anonymous bodies")

    # -- finding 14 (HTTP): %00 and an encoded '/'

    def test_path_nul_and_encoded_slash(self):
        """/v1/tokens%00 is not /v1/tokens, /v1/jobs/ID%2fcancel (and %2F) is not
        /v1/jobs/ID/cancel, /v1/jobs%0a is not /v1/jobs: each is a 400 bad_request; the job
        the submit token tried to cancel that way runs on, and the proper path cancels it."""
        d = self.start_daemon("--slots", "1")
        user = self.make_token(d, "mallory")
        self.assert_error(d.json("GET", "/v1/tokens%00"), 400, "bad_request",
                          what="GET /v1/tokens%00 (admin)")
        status, _, body = d.request("GET", "/v1/tokens%00", token=user)
        self.assertIn(status, (400, 403), body)
        self.assertNotIn(b"bootstrap", body, "the token list, to a submit token")
        self.assert_error(d.json("GET", "/v1/jobs%0a", token=user), 400, "bad_request",
                          what="GET /v1/jobs%0a")
        job, _ = d.submit(sleeper("victim"))  # the admin's: the submit token may not cancel it
        mine = d.json("POST", "/v1/jobs", sleeper("mine"), token=user)[2]
        for jid in (job["id"], mine["id"]):
            for slash in ("%2f", "%2F"):
                for token in (user, True):
                    self.assert_error(d.json("POST", f"/v1/jobs/{jid}{slash}cancel", token=token),
                                      400, "bad_request",
                                      what=f"POST /v1/jobs/{jid}{slash}cancel")
            self.assertIn(d.job(jid)["state"], ("queued", "running"),
                          "an encoded '/' cancelled the job")
        # the plain paths still work
        self.assertEqual(d.json("GET", "/v1/tokens")[0], 200)
        self.assertEqual(d.json("GET", "/v1/jobs", token=user)[0], 200)
        status, _, obj = d.json("POST", f"/v1/jobs/{mine['id']}/cancel", token=user)
        self.assertEqual((status, obj.get("state")), (200, "cancelled"), obj)
        self.assertEqual(d.json("POST", f"/v1/jobs/{job['id']}/cancel")[0], 200)

    # -- finding 13: log forgery

    def test_log_forgery_through_path(self):
        """POST /v1/jobs%0atraind: FAKE job 1 deleted by admin%ff with a wrong token: no line of
        the daemon's log starts with "traind: FAKE", and the audit log has the request's record
        (status 400 or 401) beside the legitimate ones; every audit record is JSON."""
        d = self.start_daemon("--slots", "1")
        user = self.make_token(d, "mallory")
        forged = "/v1/jobs%0atraind:%20FAKE%20job%201%20deleted%20by%20admin%ff"
        spec = {"name": "x", "command": ["/bin/true"]}
        answers = [  # (what, status, body, the statuses it may have)
            ("POST forged, wrong token",) +
            d.request("POST", forged, spec, token=WRONG_TOKEN)[::2] + ((400, 401),),
            ("POST forged, the submit token",) +
            d.request("POST", forged, spec, token=user)[::2] + ((400,),),
            ("DELETE forged, wrong token",) +
            d.request("DELETE", "/v1/jobs/1%0dtraind:%20FAKE%20token%20revoked%ff",
                      token=WRONG_TOKEN)[::2] + ((400, 401),)]
        job, _ = d.submit({"name": "legit", "command": ["/bin/true"]})
        d.finish()  # every line written and every audit record made
        forged_lines = [line for line in d.stderr_lines if line.startswith("traind: FAKE")]
        self.assertFalse(forged_lines, "a forged line in the daemon's log")
        self.assert_clean_log(d, "a path with %0a, %0d and %ff")
        for what, status, body, expected in answers:
            self.assertIn(status, expected, f"{what}: {body[:300]!r}")
        records = self.audit(d)
        posts = [r for r in records if r.get("method") == "POST" and
                 str(r.get("path", "")).startswith("/v1/jobs") and r.get("status") in (400, 401)]
        self.assertEqual(len(posts), 2, f"the forged POSTs' records; audit log: {records}")
        deletes = [r["status"] for r in records if r.get("method") == "DELETE"]
        self.assertEqual(len(deletes), 1, f"the forged DELETE's record; audit log: {records}")
        self.assertIn(deletes[0], (400, 401), records)
        made = [r for r in records if r.get("method") == "POST" and r.get("status") == 201 and
                r.get("job") == job["id"]]
        self.assertEqual(len(made), 1, f"the legitimate submission's record: {records}")

    def failing_job(self, d, token, line):
        """Submits a command job (max_restarts 1) whose name has control characters (or a plain
        name, if such a name is refused) and whose last line before it fails is `line` (printf
        escapes); returns it once it has failed twice."""
        script = f"echo starting >&2; printf '{line}\\n' >&2; exit 3"
        spec = {"name": "evil\u001b[2J\r\u0007\u0008\u007f\u0085\u009bname",
                "command": ["/bin/sh", "-c", script], "restart": {"max_restarts": 1}}
        status, _, job = d.json("POST", "/v1/jobs", spec, token=token)
        if status == 400:  # a name with control characters may be refused; the job still runs
            spec["name"] = "evil"
            status, _, job = d.json("POST", "/v1/jobs", spec, token=token)
        self.assertEqual(status, 201, job)
        try:
            events = d.follow(job["id"])
        except (OSError, http.client.HTTPException):
            events = []
        if not events or events[-1].data.get("state") not in harness.FINAL_STATES:
            try:  # the stream ended early: was it the daemon's end?
                rc = d.proc.wait(timeout=5)
                self.fail(f"the daemon died (status {rc}); its log:\n{d.stderr_tail(20)}")
            except subprocess.TimeoutExpired:
                pass
        job = self.assert_final(d, job["id"], events, "failed")
        self.assertEqual(job["restarts"], 1)
        self.assertIsInstance(job["reason"], str)
        self.assertIn("boom", job["reason"])
        return job

    def test_log_escaping(self):
        """Control characters in what a job or a client controls: a job's name, the last line a
        failing command wrote (its reason, logged at its restart and its end), request paths
        (with bytes that are not UTF-8 too). No raw control character (but each line's own
        '\\n'), C0, DEL or C1, nor a byte that is not UTF-8 reaches the daemon's stderr."""
        d = self.start_daemon("--slots", "1")
        user = self.make_token(d, "mallory")
        job = self.failing_job(d, user, r"boom\033[31m\rtraind: FAKE restart\a\010\177\302\205"
                                        r"\033]0;title\007 end")
        for path in ("/v1/jobs/%1b%5b2J%0d%07%ff%fe/cancel", "/v1/jobs/1%1b%07/cancel",
                     "/v1/jobs%c0%80", "/v1/tokens/%1b%5b31m"):
            for token in (user, WRONG_TOKEN):
                for method in ("POST", "DELETE"):
                    status, _, _ = d.request(method, path, token=token)
                    self.assertGreaterEqual(status, 400, f"{method} {path}")
        # legitimate: a plain job runs and its end is in the log
        ok, _ = d.submit({"name": "plain", "command": ["/bin/true"]})
        self.assert_final(d, ok["id"], d.follow(ok["id"]), "succeeded")
        d.finish()
        self.assertTrue(any(f"job {job['id']}" in line for line in d.stderr_lines),
                        "the failing job is in the log")
        self.assert_clean_log(d, "a job's name and reason, request paths")
        self.assertFalse([line for line in d.stderr_lines if line.startswith("traind: FAKE")])
        self.audit(d)

    def test_reason_not_utf8(self):
        """A failing command whose last line is not UTF-8 (its reason, in events, the job and
        the log): the daemon lives on, the job fails (after its restart) with that reason in
        valid JSON, and the log gets no byte that is not UTF-8."""
        d = self.start_daemon("--slots", "1")
        user = self.make_token(d, "mallory")
        self.failing_job(d, user, r"boom \377\376 \300\200 \355\240\200 \200 end")
        ok, _ = d.submit({"name": "plain", "command": ["/bin/true"]})
        self.assert_final(d, ok["id"], d.follow(ok["id"]), "succeeded")
        d.finish()
        self.assert_clean_log(d, "a job's reason that is not UTF-8")

    # -- finding 14: sessions

    def sign_in(self, d, token):
        status, headers, obj = d.json("POST", "/v1/session", {"token": token}, token=False)
        self.assertEqual(status, 200, obj)
        return {"Cookie": headers["set-cookie"].split(";")[0], "X-CSRF-Token": obj["csrf"]}

    def session_status(self, d, session):
        return d.json("GET", "/v1/jobs", token=False, headers=session)[0]

    def test_sessions_of_other_tokens_survive(self):
        """Token A signs in; token B signs in 257 times: A's session (cookie and CSRF token) still
        reads and submits; B keeps its newest max_sessions_per_token (default 16) sessions, its
        older ones end."""
        d = self.start_daemon("--slots", "1")
        a = self.make_token(d, "alice")
        b = self.make_token(d, "mallory")
        sa = self.sign_in(d, a)
        self.assertEqual(self.session_status(d, sa), 200)
        sb = [self.sign_in(d, b) for _ in range(257)]
        self.assertEqual(self.session_status(d, sa), 200,
                         "257 sign-ins of another token ended alice's session")
        status, _, job = d.json("POST", "/v1/jobs", {"name": "a", "command": ["/bin/true"]},
                                token=False, headers=sa)
        self.assertEqual(status, 201, job)
        self.assertEqual(job["owner"]["name"], "alice")
        status, _, obj = d.json("GET", "/v1/session", token=False, headers=sa)
        self.assertEqual(status, 200, obj)
        live = [i for i, s in enumerate(sb) if self.session_status(d, s) == 200]
        self.assertEqual(live, list(range(257 - 16, 257)),
                         "mallory keeps its 16 newest sessions (max_sessions_per_token)")
        self.assert_error(d.json("GET", "/v1/jobs", token=False, headers=sb[0]), 401,
                          "unauthorized", what="mallory's oldest session")
        self.assertEqual(self.session_status(d, sa), 200)

    def test_sessions_per_token_option(self):
        """--max-sessions-per-token 3: a fourth sign-in of a token ends its own oldest session,
        and only that one; another token's session is untouched."""
        d = self.start_daemon("--slots", "1", "--max-sessions-per-token", "3")
        a = self.make_token(d, "alice")
        b = self.make_token(d, "mallory")
        sa = self.sign_in(d, a)
        sb = [self.sign_in(d, b) for _ in range(4)]
        self.assertEqual([self.session_status(d, s) for s in sb], [401, 200, 200, 200])
        sb.append(self.sign_in(d, b))
        self.assertEqual([self.session_status(d, s) for s in sb], [401, 401, 200, 200, 200])
        self.assertEqual(self.session_status(d, sa), 200, "alice's session")

    # -- finding 14: followed logs are streams

    def test_follow_logs_count_as_streams(self):
        """--max-streams 2: two followed logs (logs?follow=1) held open by one token make its
        third followed log, and an event stream, a 429 too_many_streams; other tokens, and its
        own plain reads, are served; a stream's end gives its place back."""
        d = self.start_daemon("--slots", "1", "--max-streams", "2")
        user = self.make_token(d, "mallory")
        status, _, job = d.json("POST", "/v1/jobs",
                                {"name": "talker", "command": [
                                    "/bin/sh", "-c", "echo started >&2; exec /bin/sleep 120"]},
                                token=user)
        self.assertEqual(status, 201, job)
        jid = job["id"]
        with d.events(jid) as s:  # the admin's stream
            s.until(lambda e: e.event == "state" and e.data.get("state") == "running", "running")
        harness.wait_for(lambda: "started" in d.logs(jid)[1], "the job's first log line")
        follow = f"/v1/jobs/{jid}/logs?rank=0&follow=1"
        held = []
        self.addCleanup(lambda: [c.close() for c, _ in held])
        for n in range(2):
            conn, resp = self.open_stream(d, follow, user)
            held.append((conn, resp))
            self.assertEqual(resp.status, 200, f"followed log {n + 1} of 2: {resp.status}")
            self.assertEqual(resp.readline(), b"started\n")
        for path in (follow, f"/v1/jobs/{jid}/events"):
            conn, resp = self.open_stream(d, path, user)
            if resp.status == 200:
                conn.close()
                self.fail(f"GET {path}: a third stream of one token with --max-streams 2")
            self.assertEqual(resp.status, 429, resp.body)
            err = json.loads(resp.body)["error"]
            self.assertEqual(err["code"], "too_many_streams", err)
            self.assertIn("max_streams_per_token", err["message"])
            self.assertIsNotNone(resp.getheader("Retry-After"))
        # legitimate use beside it: its plain reads, and another token's streams
        self.assertEqual(d.request("GET", f"/v1/jobs/{jid}/logs?rank=0", token=user)[0], 200)
        conn, resp = self.open_stream(d, follow, True)
        self.assertEqual(resp.status, 200, "the admin's followed log")
        conn.close()
        # a stream's end gives its place back (seen once the server notices: polled)
        held.pop()[0].close()
        self.assertEqual(d.json("POST", f"/v1/jobs/{jid}/cancel", token=user)[0], 200)

        def admitted():
            conn, resp = self.open_stream(d, f"/v1/jobs/{jid}/events", user)
            conn.close()
            return resp.status == 200
        harness.wait_for(admitted, "the stream's place given back", timeout=30)

    # -- finding 10: what one token holds

    def test_quota_bytes_per_token(self):
        """--max-queued 5 --max-job-bytes-per-token (5.5 specs of 64 KiB): a token queues 5 such
        jobs behind the admin's (--slots 1), a 6th is too_many_queued; it cancels them, and
        its next 64 KiB job is still a 429 quota_exceeded (cancelled jobs hold their bytes until
        deleted), while a small one fits and the admin is not limited by it; deleting the
        cancelled jobs frees the bytes."""
        size = 64 * 1024
        quota = 5 * size + size // 2
        d = self.start_daemon("--slots", "1", "--max-queued", "5",
                              "--max-job-bytes-per-token", str(quota))
        user = self.make_token(d, "mallory")
        holder, _ = d.submit(sleeper("holds-the-slot"))
        with d.events(holder["id"]) as s:
            s.until(lambda e: e.event == "state" and e.data.get("state") == "running", "running")
        queued = []
        for i in range(5):
            status, _, job = d.json("POST", "/v1/jobs", padded(f"q{i}", size), token=user)
            self.assertEqual((status, job.get("state")), (201, "queued"), job)
            queued.append(job["id"])
        self.assert_error(d.json("POST", "/v1/jobs", sleeper("q5"), token=user), 429,
                          "too_many_queued", what="a 6th queued job with --max-queued 5")
        for jid in queued:
            status, _, job = d.json("POST", f"/v1/jobs/{jid}/cancel", token=user)
            self.assertEqual((status, job.get("state")), (200, "cancelled"), job)
        resp = d.json("POST", "/v1/jobs", padded("again", size), token=user)
        err = self.assert_error(resp, 429, "quota_exceeded",
                                what="64 KiB more while 5 cancelled jobs hold 320 KiB")
        self.assertIn("max_job_bytes_per_token", err["message"])
        status, _, small = d.json("POST", "/v1/jobs", sleeper("small"), token=user)
        self.assertEqual(status, 201, small)
        self.assertEqual(d.json("POST", "/v1/jobs", padded("admins", size))[0], 201,
                         "the quota is per token")
        for jid in queued:
            self.assertEqual(d.json("DELETE", f"/v1/jobs/{jid}", token=user)[0], 204)
        status, _, job = d.json("POST", "/v1/jobs", padded("after-delete", size), token=user)
        self.assertEqual(status, 201, job)

    # -- finding 10: start-up with many stored jobs

    def test_startup_with_10000_jobs(self):
        """A state directory holding 10,000 jobs (1 KiB specs, ten metric events each, a
        directory each; most finished, 100 queued, one running): the daemon prints its listening
        line within 5 s of its start, and lists them."""
        total, n_queued = 10000, 100
        state = self.new_state_dir()
        d = self.start_daemon("--slots", "1", state_dir=state)
        code = ("import json\n"
                "for i in range(1, 11):\n"
                "    print(json.dumps({'event': 'train', 'step': i, 'loss': 1.0 / i}))\n")
        done, _ = d.submit(padded("template-done", 1024, ("/usr/bin/python3", "-c", code)))
        self.assert_final(d, done["id"], d.follow(done["id"]), "succeeded")
        running, _ = d.submit(sleeper("runs-on", 600))
        with d.events(running["id"]) as s:
            s.until(lambda e: e.event == "state" and e.data.get("state") == "running", "running")
        queued, _ = d.submit(padded("template-queued", 1024, ("/usr/bin/python3", "-c", code)))
        self.assertEqual(d.job(queued["id"])["state"], "queued")
        d.finish()

        built = time.monotonic()
        copies = {done["id"]: total - 2 - n_queued, queued["id"]: n_queued - 1}
        new_ids = self.fill_state(state, copies)
        built = time.monotonic() - built

        d2 = RawDaemon(state, ("--slots", "1"))
        self.addCleanup(self._stop_daemon, d2)
        started = time.monotonic()
        d2.start()
        took = time.monotonic() - started
        if sanitized():  # an ASan build is several times slower: not the figure promised
            took = 0.0
        self.assertLess(took, 5.0, f"listening {took:.2f} s after the start with {total} stored "
                                   f"jobs (the state took {built:.1f} s to build)")
        listing = d2.get_ok("/v1/jobs?limit=500")
        self.assertEqual(len(listing["jobs"]), 500)
        self.assertEqual(listing["next_offset"], 500)
        q = d2.get_ok("/v1/jobs?state=queued&limit=500")["jobs"]
        self.assertEqual(len(q), n_queued, [j["name"] for j in q][:5])
        copy = new_ids[done["id"]][0]
        self.assertEqual(d2.job(copy)["state"], "succeeded")
        self.assertEqual(len(d2.metrics(copy)), 10)

    def fill_state(self, state, copies):
        """Copies each template job ({id: how many}) with all its rows (every table with a
        job_id column) in one transaction, and its directory (files hard-linked)."""
        db = sqlite3.connect(os.path.join(state, "state.db"), isolation_level=None)
        try:
            tables = [r[0] for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
            related = [t for t in tables if t != "jobs" and "job_id" in
                       [c[1] for c in db.execute(f"PRAGMA table_info({t})")]]
            jcols = [c[1] for c in db.execute("PRAGMA table_info(jobs)") if c[1] != "id"]
            new_ids = {}
            db.execute("BEGIN")
            for tid, n in copies.items():
                row = dict(zip(jcols, db.execute(
                    f"SELECT {', '.join(jcols)} FROM jobs WHERE id = ?", (tid,)).fetchone()))
                spec = json.loads(row["spec"])
                rel = {}
                for t in related:
                    cur = db.execute(f"SELECT * FROM {t} WHERE job_id = ?", (tid,))
                    rel[t] = ([c[0] for c in cur.description], cur.fetchall())
                ids = new_ids[tid] = []
                for i in range(n):
                    name = f"{row['name']}-{i}"
                    spec["name"] = name
                    vals = dict(row, name=name, spec=json.dumps(spec, separators=(",", ":")))
                    cur = db.execute(f"INSERT INTO jobs ({', '.join(jcols)}) VALUES "
                                     f"({', '.join('?' * len(jcols))})",
                                     [vals[c] for c in jcols])
                    ids.append(cur.lastrowid)
                    for t, (cols, rows) in rel.items():
                        at = cols.index("job_id")
                        db.executemany(f"INSERT INTO {t} ({', '.join(cols)}) VALUES "
                                       f"({', '.join('?' * len(cols))})",
                                       [r[:at] + (cur.lastrowid,) + r[at + 1:] for r in rows])
            db.execute("COMMIT")
        finally:
            db.close()
        for tid, ids in new_ids.items():
            src = os.path.join(state, "jobs", str(tid))
            if not os.path.isdir(src):
                continue
            for nid in ids:
                self.copy_tree(src, os.path.join(state, "jobs", str(nid)))
        return new_ids

    def copy_tree(self, src, dst):
        st = os.lstat(src)
        os.mkdir(dst)
        os.chown(dst, st.st_uid, st.st_gid)
        os.chmod(dst, st.st_mode & 0o7777)
        with os.scandir(src) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    self.copy_tree(e.path, os.path.join(dst, e.name))
                elif e.is_file(follow_symlinks=False):
                    os.link(e.path, os.path.join(dst, e.name))


ALL = ["test_slowloris_defaults", "test_slowloris_per_ip_limit", "test_connection_timeout",
       "test_anonymous_bodies_not_buffered", "test_path_nul_and_encoded_slash",
       "test_log_forgery_through_path", "test_log_escaping", "test_reason_not_utf8",
       "test_sessions_of_other_tokens_survive", "test_sessions_per_token_option",
       "test_follow_logs_count_as_streams", "test_quota_bytes_per_token",
       "test_startup_with_10000_jobs"]


def main():
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    names = sys.argv[3:] or ALL
    suite = unittest.TestSuite([SecurityHttpTest(n) for n in names])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
