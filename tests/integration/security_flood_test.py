#!/usr/bin/python3
"""A job against the daemon's responsiveness (issue 42: findings 6, 7 and 8), against a real
traind. Black-box attacks by a job's own output and files; each test asserts that the attack
fails and that legitimate use still works.

- event flood (6): a command job prints 300,000 metric lines as fast as it can. While it does,
  `GET /v1/jobs/ID` and `GET /v1/jobs` are timed every ~20 ms: p99 < 100 ms, max < 1 s; the
  systemd watchdog (NOTIFY_SOCKET, WATCHDOG_USEC 2 s) is pinged with no gap over 2 s. Events
  are capped by `max_events_per_s` (default 200/s, bursts of 2000): the job says
  `"events_dropped" > 0`, its stream holds `dropped` events whose `lines` add up to that, and
  stored `train` events + dropped lines == 300,000. The checkpoint line printed after the
  flood is registered all the same.
- text flood (6): 200 MB of text lines with `--max-log-bytes 20000000`: rank-0.log never over
  twice the cap, rotated once to rank-0.log.1 with a "[traind] ... rotated" line, nothing
  more on disk; the output file (attempt-0.node-0.out) takes only lines starting with `{`, so it
  stays small, and the metric line printed after the flood still arrives. Same latency bounds.
- checkpoint bomb (7): a directory of 100,000 files registered 60 times is never registered
  (`max_checkpoint_files`, default 10000; the daemon's log says so naming the setting), while a
  10-file checkpoint registered 200 times and a 5000-file one are. `GET .../checkpoints` is
  paginated (`?limit=100`: 100 of them, `Link: <...offset=100...>; rel="next"`,
  `X-Total-Count`), no checkpoint lists more than 1000 files (`files_truncated`,
  `file_count`), the tar still holds all 5000; `GET` p99 < 100 ms (max < 1 s) during the
  registrations, the checkpoint listing of the bomb's job included; the daemon's peak RSS
  (VmHWM) stays under 300 MB.
- FIFO (8): a checkpoint directory holding a FIFO beside a regular file, and a single-file
  checkpoint that is a FIFO: 20 concurrent `GET .../checkpoints/1/fifo` and the tars of both
  each answer within 5 s (the file: 404; a tar: without the FIFO); the job is then cancelled and
  deleted, and SIGTERM stops the daemon within 15 s (no request thread left hanging).

Points the contract leaves open that these tests pin down:
- The flood is timed from the submit until the job is seen final: the daemon has read its
  output by then (the stream closes after the final state, so every `dropped` event comes
  before it).
- Every `dropped` event's `lines` together equal the job's `events_dropped`.
- A checkpoint's file route for a FIFO is a 404; the listing of a checkpoint with a FIFO shows
  its regular files only.

Nothing waits by sleeping: the latency probe's 20 ms pace is the measurement's, and the test
waits for its verdict (job final, or a bound already broken) on an Event. A test that fails
kills its daemon at once (a frozen daemon would take a minute to stop), then the harness
removes what its jobs left.

    /usr/bin/python3 tests/integration/security_flood_test.py TRAIND SOURCE_DIR [TEST...]"""
import collections
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from operations_test import NotifySocket  # noqa: E402

PY = "/usr/bin/python3"
P99_S = 0.100  # GET latency bounds while a job floods (design-42: "The API never waits")
MAX_S = 1.0
PROBE_EVERY_S = 0.02
MIN_SAMPLES = 100  # a window shorter than that is measured on to this many GETs
PROBE_TIMEOUT_S = 3.0  # a probe request that takes this long is a freeze: the test ends
WINDOW_S = 45.0  # the longest a test waits for its attack to end
WATCHDOG_S = 2.0  # WATCHDOG_USEC given to the daemon
FLOOD_LINES = 300000
TEXT_MB = 200
LOG_CAP = 20000000
BOMB_FILES = 100000
BOMB_REGISTRATIONS = 60
SMALL_REGISTRATIONS = 200
MID_FILES = 5000  # over the 1000 files a listing shows, under max_checkpoint_files
MID_STEP = 1000
CKPT_LINES = 100000  # checkpoint lines at once, each naming the same directory of
CKPT_DIR_FILES = 1000  # this many files
RSS_LIMIT = 300 * 1024 * 1024
FIFO_REQUESTS = 20
FIFO_ANSWER_S = 5.0
SIGTERM_S = 15.0


def percentile(values, p):
    """The nearest-rank percentile of values (p in 0..100)."""
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def peak_rss(pid):
    """VmHWM (the highest resident set size so far) of a process, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


class LatencyProbe(threading.Thread):
    """GETs `paths` in turn every PROBE_EVERY_S, each on a fresh connection, recording how long
    each took. `settled` is set once every job of `jobs` is seen in a final state (through its
    `/v1/jobs/ID` answers) or once one request took longer than MAX_S (a bound already broken:
    the test need not wait for the rest). `sample`, if given, is called each turn (files whose
    size is watched)."""

    def __init__(self, d, paths, jobs=(), sample=None):
        super().__init__(daemon=True)
        self.d = d
        self.paths = list(paths)
        self.jobs = {str(j): None for j in jobs}  # id -> its last state seen
        self.sample = sample
        self.samples = []  # (path, seconds, status or error)
        self.settled = threading.Event()
        self._halt = threading.Event()
        self.started_at = self.ended_at = None

    def run(self):
        self.started_at = time.monotonic()
        turn = 0
        while not self._halt.is_set():
            path = self.paths[turn % len(self.paths)]
            turn += 1
            t0 = time.monotonic()
            try:
                status, _, body = self.d.request("GET", path, timeout=PROBE_TIMEOUT_S)
                took = time.monotonic() - t0
                outcome = status
            except Exception as e:  # noqa: BLE001 - a timeout or a closed connection
                took = time.monotonic() - t0
                status, body, outcome = None, b"", f"{type(e).__name__}: {e}"
            self.samples.append((path, took, outcome))
            m = re.fullmatch(r"/v1/jobs/(\d+)", path)
            if status == 200 and m and m.group(1) in self.jobs:
                try:
                    self.jobs[m.group(1)] = json.loads(body).get("state")
                except ValueError:
                    pass
            if self.sample is not None:
                self.sample()
            if took > MAX_S or (len(self.samples) >= MIN_SAMPLES and self.jobs and
                                all(s in harness.FINAL_STATES for s in self.jobs.values())):
                self.settled.set()
            self._halt.wait(PROBE_EVERY_S)  # the measurement's pace
        self.ended_at = time.monotonic()

    def stop(self):
        self._halt.set()
        if self.is_alive():
            self.join(timeout=PROBE_TIMEOUT_S + 5)
        if self.ended_at is None:
            self.ended_at = time.monotonic()

    def summary(self):
        lat = [t for _, t, _ in self.samples]
        if not lat:
            return "no request was made"
        worst = sorted(self.samples, key=lambda s: -s[1])[:5]
        return (f"{len(lat)} GETs over {self.ended_at - self.started_at:.1f} s: "
                f"p50 {percentile(lat, 50) * 1000:.1f} ms, p99 {percentile(lat, 99) * 1000:.1f} "
                f"ms, max {max(lat) * 1000:.1f} ms; slowest: "
                + "; ".join(f"{p} {t * 1000:.0f} ms ({o})" for p, t, o in worst))


class WatchdogReader(threading.Thread):
    """Reads a NotifySocket for as long as the daemon runs (a full queue would block its
    sd_notify), keeping the times of the daemon's WATCHDOG=1 messages."""

    def __init__(self, notify):
        super().__init__(daemon=True)
        self.notify = notify
        self.pid = None  # the daemon's, once known
        self.pings = []
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            got = self.notify.receive(0.2)
            if got is None:
                continue
            pid, fields = got
            if fields.get("WATCHDOG") == "1" and (self.pid is None or pid == self.pid):
                self.pings.append(time.monotonic())

    def stop(self):
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)

    def gaps(self, start, end):
        """The gaps between start, each ping in between, and end."""
        stamps = [start] + [t for t in self.pings if start < t < end] + [end]
        return [b - a for a, b in zip(stamps, stamps[1:])]


class SecurityFloodTest(harness.DaemonTest):
    # -- fixtures

    def daemon(self, *args, env=None):
        """A daemon whose failing test kills it at once (a frozen one would not stop in time),
        after which the harness's cleanup removes what its jobs left, without blame."""
        d = self.start_daemon(*args, env=env)
        self.addCleanup(self._kill_if_failed, d)
        return d

    def _kill_if_failed(self, d):
        if not self._failed():
            return
        print(f"\n[security_flood_test] {self.id()} failed; traind {d.pid}'s stderr:\n"
              f"{d.stderr_tail(30)}", file=sys.stderr)
        if d.alive():
            d.kill()

    def probe(self, d, paths, jobs=(), sample=None):
        p = LatencyProbe(d, paths, jobs, sample)
        self.addCleanup(p.stop)
        p.start()
        return p

    def submit_command(self, d, name, code):
        job, _ = d.submit({"name": name, "command": [PY, "-c", code]})
        return job["id"]

    def wait_settled(self, probe, what):
        """Until the probed jobs are final or a latency bound is broken; then the probe stops."""
        settled = probe.settled.wait(WINDOW_S)
        probe.stop()
        if not settled:
            self.fail(f"{what} did not end within {WINDOW_S} s; jobs seen {probe.jobs}; "
                      f"{probe.summary()}")

    def assert_latency(self, probe, what, also=""):
        lat = [t for _, t, _ in probe.samples]
        self.assertTrue(lat, f"{what}: no GET measured")
        self.assertLess(max(lat), MAX_S, f"{what}: the API froze: {probe.summary()}"
                        + (f"; {also}" if also else ""))
        bad = [(p, o) for p, _, o in probe.samples if o != 200]
        self.assertFalse(bad, f"{what}: GETs that did not answer 200: {bad[:10]}; "
                         f"{probe.summary()}")
        self.assertGreaterEqual(len(lat), MIN_SAMPLES, f"{what}: too few GETs measured: "
                                f"{probe.summary()}")
        self.assertLess(percentile(lat, 99), P99_S, f"{what}: {probe.summary()}")

    # -- finding 6: events

    def test_event_flood(self):
        notify = NotifySocket(os.path.join(self.new_state_dir(), "notify"))
        self.addCleanup(notify.close)
        dog = WatchdogReader(notify)
        self.addCleanup(dog.stop)
        dog.start()
        d = self.daemon("--slots", "1", env={"NOTIFY_SOCKET": notify.path,
                                             "WATCHDOG_USEC": str(int(WATCHDOG_S * 1e6))})
        dog.pid = d.pid
        code = ("import json, os\n"
                f"N = {FLOOD_LINES}\n"
                "def out(data):\n"
                "    view = memoryview(data)\n"
                "    while view:\n"
                "        view = view[os.write(1, view):]\n"
                "for start in range(0, N, 1000):\n"
                "    out(''.join('{\"event\":\"train\",\"step\":%d,\"loss\":%.6f}\\n'\n"
                "                % (i, 1.0 / (i + 1)) for i in range(start, start + 1000))\n"
                "        .encode())\n"
                "os.makedirs('ck')\n"
                "with open('ck/weights.bin', 'wb') as f:\n"
                "    f.write(b'w' * 100)\n"
                "out((json.dumps({'event': 'checkpoint', 'step': N, 'path': 'ck'}) + '\\n')"
                ".encode())\n")
        jid = self.submit_command(d, "flood", code)
        probe = self.probe(d, [f"/v1/jobs/{jid}", "/v1/jobs"], jobs=[jid])
        self.wait_settled(probe, "the event flood")
        window = (probe.started_at, probe.ended_at)

        gaps = dog.gaps(*window)
        pings = (f"watchdog (WATCHDOG_USEC {WATCHDOG_S} s): longest gap {max(gaps):.2f} s over "
                 f"{window[1] - window[0]:.1f} s, {len(gaps) - 1} pings")
        self.assert_latency(probe, f"{FLOOD_LINES} metric lines", pings)
        self.assertLess(max(gaps), WATCHDOG_S, f"the watchdog went unpinged: {pings}")

        # nothing silently lost: what was stored and what was counted as dropped add up
        events = d.follow(jid)
        job = self.assert_final(d, jid, events, "succeeded")
        self.assertIn("events_dropped", job, "the job JSON counts the lines it dropped")
        dropped = job["events_dropped"]
        self.assertIsInstance(dropped, int)
        self.assertGreater(dropped, 0, f"{FLOOD_LINES} lines at once, over max_events_per_s")
        marks = [e.data for e in events if e.event == "dropped"]
        self.assertTrue(marks, "the stream shows that events were dropped")
        self.assertEqual(sum(m.get("lines", 0) for m in marks), dropped,
                         f"the dropped events' lines against events_dropped: {marks[:5]}")
        trains = [e for e in events if e.event == "train"]
        self.assertEqual(len(trains) + dropped, FLOOD_LINES,
                         f"{len(trains)} stored + {dropped} dropped")
        self.assertEqual(len({e.data["step"] for e in trains}), len(trains),
                         "no line stored twice")
        # the checkpoint line after the flood is never dropped
        ckpts = [e.data for e in events if e.event == "checkpoint"]
        self.assertEqual([c.get("step") for c in ckpts], [FLOOD_LINES], ckpts)
        self.assertEqual(job["checkpoints"], 1)
        listed = d.get_ok(f"/v1/jobs/{jid}/checkpoints")
        self.assertEqual([c["step"] for c in listed], [FLOOD_LINES])
        self.assert_healthy(d, "the flood")

    # -- finding 6: checkpoint lines, and events only the daemon may make

    def test_checkpoint_line_flood_and_forged_events(self):
        """A flood of checkpoint lines naming a 1000-file directory is cut as metric lines are
        (a bucket of its own, each walk charged by its files), and lines a job prints as the
        daemon's own events (state, dropped, placement, restart) never become events."""
        d = self.daemon("--slots", "1")
        code = ("import json, os\n"
                "def out(data):\n"
                "    view = memoryview(data)\n"
                "    while view:\n"
                "        view = view[os.write(1, view):]\n"
                "os.makedirs('ck')\n"
                f"for i in range({CKPT_DIR_FILES}):\n"
                "    with open(f'ck/f{i:05d}', 'wb') as f:\n"
                "        f.write(b'w')\n"
                "out(''.join(json.dumps({'event': 'state', 'state': s}) + '\\n'\n"
                "            for s in ('succeeded', 'failed', 'cancelled')).encode())\n"
                "out((json.dumps({'event': 'dropped', 'lines': 10 ** 12}) + '\\n').encode())\n"
                "out((json.dumps({'event': 'placement', 'nodes': []}) + '\\n').encode())\n"
                "out((json.dumps({'event': 'restart', 'attempt': 7}) + '\\n').encode())\n"
                f"N = {CKPT_LINES}\n"
                "for start in range(0, N, 1000):\n"
                "    out(''.join(json.dumps({'event': 'checkpoint', 'step': i, 'path': 'ck'})\n"
                "                + '\\n' for i in range(start, start + 1000)).encode())\n"
                "out(b'{\"event\": \"train\", \"step\": 1, \"loss\": 0.5}\\n')\n")
        jid = self.submit_command(d, "ckpt-flood", code)
        probe = self.probe(d, [f"/v1/jobs/{jid}", f"/v1/jobs/{jid}/checkpoints", "/v1/jobs"],
                           jobs=[jid])
        self.wait_settled(probe, "the checkpoint line flood")
        self.assert_latency(probe, f"{CKPT_LINES} checkpoint lines of {CKPT_DIR_FILES} files")

        events = d.follow(jid)
        job = self.assert_final(d, jid, events, "succeeded")
        ckpts = [e.data for e in events if e.event == "checkpoint"]
        dropped = job["events_dropped"]
        self.assertGreater(dropped, 0, "checkpoint lines over max_events_per_s are dropped")
        self.assertLess(dropped, 10 ** 12, "a job's own 'dropped' line counts for nothing")
        self.assertEqual(len(ckpts) + dropped, CKPT_LINES,
                         f"{len(ckpts)} stored + {dropped} dropped checkpoint lines")
        self.assertLess(len(ckpts), CKPT_LINES // 10,
                        "each walk of 1000 files costs ten lines' worth of the bucket")
        self.assertEqual(job["checkpoints"], len(ckpts), "every stored one was registered")
        self.assertEqual([e.data.get("step") for e in events if e.event == "train"], [1],
                         "the metric line after the flood has a bucket of its own")
        # the daemon's own events: only the daemon's
        states = [e.data.get("state") for e in events if e.event == "state"]
        self.assertEqual(states.count("succeeded"), 1, f"state events {states}")
        self.assertNotIn("failed", states)
        self.assertNotIn("cancelled", states)
        self.assertFalse([e for e in events if e.event in ("placement", "restart")],
                         "a job prints no placement or restart event")
        marks = [e.data for e in events if e.event == "dropped"]
        self.assertEqual(sum(m.get("lines", 0) for m in marks), dropped, marks[:5])
        status, _, body = d.request("GET", f"/v1/jobs/{jid}/logs?rank=0")
        self.assertEqual(status, 200)
        self.assertIn(b'"lines": 1000000000000', body, "the forged line is in the log")
        self.assert_healthy(d, "the checkpoint line flood")

    # -- finding 6: text, and the log cap

    def test_text_flood_log_capped(self):
        d = self.daemon("--slots", "1", "--max-log-bytes", str(LOG_CAP))
        code = ("import os\n"
                "def out(data):\n"
                "    view = memoryview(data)\n"
                "    while view:\n"
                "        view = view[os.write(1, view):]\n"
                "block = b''.join(b'plain text line %09d ' % i + b'.' * 70 + b'\\n'\n"
                "                 for i in range(10000))\n"
                f"for _ in range({TEXT_MB} * 1000000 // len(block)):\n"
                "    out(block)\n"
                "out(b'{\"event\": \"train\", \"step\": 1, \"loss\": 0.5}\\n')\n")
        jid = self.submit_command(d, "text", code)
        # a follower of the log from the start: it goes on past each rotation, to the end
        followed = {"bytes": 0, "tail": b"", "error": None}

        def follow_log():
            try:
                conn = d.connect(WINDOW_S)
                conn.request("GET", f"/v1/jobs/{jid}/logs?rank=0&follow=1",
                             headers=d._headers(True, None, False))
                resp = conn.getresponse()
                while True:
                    chunk = resp.read1(1 << 16)
                    if not chunk:
                        break
                    followed["bytes"] += len(chunk)
                    followed["tail"] = (followed["tail"] + chunk)[-4096:]
                conn.close()
            except Exception as e:  # noqa: BLE001 (said by the assertion below)
                followed["error"] = repr(e)

        follower = threading.Thread(target=follow_log, daemon=True)
        follower.start()
        job_dir = os.path.join(d.state_dir, "jobs", str(jid))
        log = os.path.join(job_dir, "rank-0.log")
        largest = [0]

        def watch_log():
            try:
                largest[0] = max(largest[0], os.path.getsize(log))
            except OSError:
                pass

        probe = self.probe(d, [f"/v1/jobs/{jid}", "/v1/jobs"], jobs=[jid], sample=watch_log)
        self.wait_settled(probe, "the text flood")
        watch_log()
        self.assert_latency(probe, f"{TEXT_MB} MB of text")

        job = self.assert_final(d, jid, d.follow(jid), "succeeded")
        self.assertEqual((job["latest"]["train"] or {}).get("step"), 1,
                         "the metric line after the text still arrives")
        follower.join(WINDOW_S)
        self.assertFalse(follower.is_alive(), "the followed log ends with the job")
        self.assertIsNone(followed["error"])
        self.assertGreater(followed["bytes"], LOG_CAP, "the follower read past a rotation")
        self.assertIn(b'{"event": "train", "step": 1', followed["tail"],
                      "the follower saw the last line, written after the rotations")
        self.assertLessEqual(largest[0], 2 * LOG_CAP,
                             f"rank-0.log grew to {largest[0]} bytes, cap {LOG_CAP}")
        logs = sorted(os.path.basename(p) for p in os.listdir(job_dir)
                      if p.startswith("rank-0.log"))
        self.assertEqual(logs, ["rank-0.log", "rank-0.log.1"], "rotated once")
        sizes = {n: os.path.getsize(os.path.join(job_dir, n)) for n in logs}
        self.assertLessEqual(sum(sizes.values()), 2 * LOG_CAP + (1 << 20),
                             f"{TEXT_MB} MB written, logs on disk: {sizes}")
        marker = re.compile(rb"(?m)^\[traind\][^\n]*rotated")
        found = []
        for n in logs:
            with open(os.path.join(job_dir, n), "rb") as f:
                found += [n] if marker.search(f.read()) else []
        self.assertTrue(found, f"a [traind] line says the log was rotated: {sizes}")
        out = os.path.join(job_dir, "attempt-0.node-0.out")
        out_size = os.path.getsize(out) if os.path.exists(out) else 0
        self.assertLess(out_size, 1 << 20, "the output file takes only lines starting with {")
        self.assert_healthy(d, "the text flood")

    # -- finding 7: checkpoint bombs

    def test_checkpoint_bomb(self):
        d = self.daemon("--slots", "2")
        make = ("import json, os\n"
                "def files(path, n):\n"
                "    os.makedirs(path)\n"
                "    for i in range(n):\n"
                "        fd = os.open(f'{path}/f{i:06d}', os.O_CREAT | os.O_EXCL | os.O_WRONLY,"
                " 0o600)\n"
                "        os.write(fd, b'x')\n"
                "        os.close(fd)\n"
                "def ckpt(step, path):\n"
                "    print(json.dumps({'event': 'checkpoint', 'step': step, 'path': path}),\n"
                "          flush=True)\n")
        bomb = self.submit_command(d, "bomb", make + (
            f"files('bomb', {BOMB_FILES})\n"
            f"for step in range(1, {BOMB_REGISTRATIONS} + 1):\n"
            "    ckpt(step, 'bomb')\n"))
        legit = self.submit_command(d, "legit", make + (
            "files('small', 10)\n"
            f"files('mid', {MID_FILES})\n"
            f"for step in range(1, {SMALL_REGISTRATIONS} + 1):\n"
            "    ckpt(step, 'small')\n"
            f"ckpt({MID_STEP}, 'mid')\n"))
        probe = self.probe(d, [f"/v1/jobs/{bomb}", f"/v1/jobs/{bomb}/checkpoints",
                               f"/v1/jobs/{legit}", "/v1/jobs"], jobs=[bomb, legit])
        self.wait_settled(probe, "the checkpoint registrations")
        self.assert_latency(probe, f"{BOMB_FILES} files registered {BOMB_REGISTRATIONS} times")

        # the bomb: never registered, and the daemon says why
        job = self.assert_final(d, bomb, d.follow(bomb), "succeeded")
        self.assertEqual(job["checkpoints"], 0,
                         f"a checkpoint of {BOMB_FILES} files is over max_checkpoint_files")
        status, hdrs, listed = d.json("GET", f"/v1/jobs/{bomb}/checkpoints")
        self.assertEqual((status, listed), (200, []))
        self.assertEqual(hdrs.get("x-total-count"), "0")
        self.assertRegex(d.stderr_tail(100000), r"max_checkpoint_files",
                         "the daemon's log says why the checkpoint was not registered")

        # legitimate ones: registered, listed by pages, each with at most 1000 files
        job = self.assert_final(d, legit, d.follow(legit), "succeeded")
        want = set(range(1, SMALL_REGISTRATIONS + 1)) | {MID_STEP}
        self.assertEqual(job["checkpoints"], len(want))
        status, hdrs, page = d.json("GET", f"/v1/jobs/{legit}/checkpoints")
        self.assertEqual(status, 200, page)
        self.assertLessEqual(len(page), 100, "the default page")
        self.assertEqual(hdrs.get("x-total-count"), str(len(want)))
        self.assertRegex(hdrs.get("link", ""), r'rel="?next"?', "a next page")

        path, steps, pages = f"/v1/jobs/{legit}/checkpoints?limit=100", [], 0
        while path:
            pages += 1
            self.assertLessEqual(pages, 5, f"pages do not end: {path}")
            status, hdrs, page = d.json("GET", path)
            self.assertEqual(status, 200, (path, page))
            self.assertIsInstance(page, list, path)
            self.assertEqual(hdrs.get("x-total-count"), str(len(want)), path)
            self.assertEqual(len(page), min(100, len(want) - len(steps)), path)
            for c in page:
                self.assertLessEqual(len(c["files"]), 1000, f"step {c['step']}")
                if c["step"] == MID_STEP:
                    self.assertEqual((c.get("files_truncated"), c.get("file_count"),
                                      len(c["files"])), (True, MID_FILES, 1000))
                else:
                    self.assertEqual((bool(c.get("files_truncated")), c.get("file_count"),
                                      len(c["files"])), (False, 10, 10))
            steps += [c["step"] for c in page]
            m = re.search(r'<([^>]*)>\s*;\s*rel="?next"?', hdrs.get("link", ""))
            if pages == 1:
                self.assertTrue(m and re.search(r"[?&]offset=100(&|$)", m.group(1)),
                                f"Link: {hdrs.get('link')}")
            path = None
            if m:
                u = urllib.parse.urlsplit(m.group(1))
                path = u.path + ("?" + u.query if u.query else "")
        self.assertEqual(sorted(steps), sorted(want), "every checkpoint once, over the pages")

        one = d.get_ok(f"/v1/jobs/{legit}/checkpoints/{MID_STEP}")
        self.assertEqual((one.get("files_truncated"), one.get("file_count"), len(one["files"])),
                         (True, MID_FILES, 1000))
        status, _, body = d.request("GET", f"/v1/jobs/{legit}/checkpoints/{MID_STEP}.tar")
        self.assertEqual(status, 200, body[:300])
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
        self.assertEqual(len(members), MID_FILES, "the tar serves every file")
        self.assertLess(peak_rss(d.pid), RSS_LIMIT, "the daemon's peak RSS (VmHWM)")

    # -- finding 8: FIFOs

    def test_fifo_in_checkpoint(self):
        d = self.daemon("--slots", "1", "--grace", "2")
        code = ("import json, os, time\n"
                "def say(o):\n"
                "    print(json.dumps(o), flush=True)\n"
                "os.makedirs('ck')\n"
                "with open('ck/weights.bin', 'wb') as f:\n"
                "    f.write(b'w' * 1000)\n"
                "os.mkfifo('ck/fifo')\n"
                "say({'event': 'checkpoint', 'step': 1, 'path': 'ck'})\n"
                "os.mkfifo('single.fifo')\n"
                "say({'event': 'checkpoint', 'step': 2, 'path': 'single.fifo'})\n"
                "say({'event': 'ready', 'step': 2})\n"
                "time.sleep(600)\n")
        jid = self.submit_command(d, "fifo", code)
        with d.events(jid) as stream:
            stream.until(lambda e: e.event == "ready", "the job's ready line")
        listed = {c["step"]: c for c in d.get_ok(f"/v1/jobs/{jid}/checkpoints")}
        self.assertIn(1, listed, "the directory's regular file makes it a checkpoint")
        self.assertEqual([f["name"] for f in listed[1]["files"]], ["weights.bin"],
                         "listed without its FIFO")

        base = f"/v1/jobs/{jid}/checkpoints"
        paths = ([f"{base}/1/fifo"] * FIFO_REQUESTS +
                 [f"{base}/1.tar", f"{base}/2.tar", f"{base}/2/single.fifo"] * 3)
        answers = [None] * len(paths)

        def fetch(i, path):
            t0 = time.monotonic()
            try:
                status, _, body = d.request("GET", path, timeout=FIFO_ANSWER_S + 0.5)
                answers[i] = (status, body, time.monotonic() - t0)
            except Exception as e:  # noqa: BLE001 - a timeout: the thread is blocked
                answers[i] = (f"{type(e).__name__}: {e}", b"", time.monotonic() - t0)

        threads = [threading.Thread(target=fetch, args=(i, p), daemon=True)
                   for i, p in enumerate(paths)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=FIFO_ANSWER_S + 5)

        problems = []
        for path, got in zip(paths, answers):
            if got is None:
                problems.append(f"{path}: no answer at all")
                continue
            status, body, took = got
            if took > FIFO_ANSWER_S or not isinstance(status, int):
                problems.append(f"{path}: {status} after {took:.1f} s")
            elif path.endswith(".tar"):
                if status == 404 and path.endswith("/2.tar"):
                    continue
                if status != 200:
                    problems.append(f"{path}: {status} {body[:200]!r}")
                    continue
                with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                    members = tar.getmembers()
                if any(m.isfifo() or m.name.endswith("fifo") for m in members):
                    problems.append(f"{path}: the tar holds the FIFO: "
                                    f"{[m.name for m in members]}")
                if path.endswith("/1.tar") and not any(m.name.endswith("weights.bin")
                                                       for m in members):
                    problems.append(f"{path}: no weights.bin in {[m.name for m in members]}")
            elif status != 404:
                problems.append(f"{path}: {status} {body[:200]!r}, expected 404")

        # then the job can still be cancelled and deleted, and the daemon stops
        try:
            status, _, obj = d.json("POST", f"/v1/jobs/{jid}/cancel", timeout=20)
            if (status, (obj or {}).get("state")) != (200, "cancelled"):
                problems.append(f"cancel: {status} {obj}")
            status, _, body = d.request("DELETE", f"/v1/jobs/{jid}", timeout=20)
            if status != 204:
                problems.append(f"delete: {status} {body[:200]!r}")
            elif d.request("GET", f"/v1/jobs/{jid}", timeout=20)[0] != 404:
                problems.append("the deleted job is still there")
        except Exception as e:  # noqa: BLE001 - a timeout
            problems.append(f"cancel/delete: {type(e).__name__}: {e}")
        procs = d.job_processes()
        t0 = time.monotonic()
        os.kill(d.pid, signal.SIGTERM)
        try:
            d.proc.wait(timeout=SIGTERM_S)
        except subprocess.TimeoutExpired:
            problems.append(f"SIGTERM did not stop the daemon within {SIGTERM_S} s")
            d.kill()  # the harness then removes what its jobs left
        else:
            left = [p for p in harness.wait_exited(sorted(procs)) if harness.lingering(p)]
            if left:
                problems.append("processes outlived the stopped daemon: "
                                + harness.describe_procs(left))
        stopped = time.monotonic() - t0
        if problems:
            counted = collections.Counter(problems)
            self.fail(f"{len(problems)} problems (the daemon's stop took {stopped:.1f} s):\n"
                      + "\n".join(f"{n} x {p}" for p, n in counted.items()))


# this file's tests, not the ones DaemonTest brings along
NAMES = sorted(n for n in vars(SecurityFloodTest) if n.startswith("test_"))


def main():
    global P99_S, MAX_S, PROBE_TIMEOUT_S, RSS_LIMIT
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    with open(harness.TRAIND, "rb") as f:
        if b"__asan_init" in f.read():
            # the sanitizers' build (build-asan) runs several times slower and keeps shadow
            # memory: the bounds that hold the shipped daemon are loosened, not dropped (a
            # freeze of seconds, the finding, still fails)
            P99_S, MAX_S, PROBE_TIMEOUT_S, RSS_LIMIT = 0.5, 3.0, 6.0, 3 * RSS_LIMIT
            print("[security_flood_test] a sanitizer build: p99 < 0.5 s, max < 3 s, "
                  "RSS x3", file=sys.stderr)
    names = sys.argv[3:] or NAMES
    suite = unittest.TestSuite([SecurityFloodTest(n) for n in names])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
