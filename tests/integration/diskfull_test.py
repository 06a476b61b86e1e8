#!/usr/bin/python3
"""A full disk under a real traind: its state directory on a small tmpfs (made by the test,
unmounted at the end, also on failure) is filled with a file while it works.

- Database writes: a submission is refused with 507 naming the directory, reads go on, and
  once space returns submissions work again, without a restart.
- A running job's events: none is lost or repeated while the database cannot store them, and
  rank 0's output waits in the shepherd until the output file takes it again.
- Logs: every line the processes write while the disk is full reaches their logs, in order,
  once there is room (they wait in the shepherd).
- A checkpoint save: the job fails with the worker's words (the path, "No space left on
  device"), and the checkpoints saved before stay listed, whole and downloadable.
- A start on a full disk: traind exits saying the filesystem is full (not "disk I/O error"),
  and starts as before once there is room.

    /usr/bin/python3 tests/integration/diskfull_test.py TRAIND SOURCE_DIR   (as root)"""
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from harness import train_spec, wait_for  # noqa: E402


class DiskFullTest(harness.DaemonTest):
    def small_state_dir(self, mib=24):
        path = os.path.realpath(tempfile.mkdtemp(prefix="traind-diskfull-"))
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0755", "tmpfs", path],
                       check=True)

        def unmount():  # after the daemon's cleanup (added later, so run earlier)
            subprocess.run(["umount", "-l", path], check=False)
            os.rmdir(path)

        self.addCleanup(unmount)
        return path

    def fill(self, state):
        """Fills the filesystem to its last byte; the filler's path (remove it to free)."""
        filler = os.path.join(state, "filler")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (1 << 20, 65536, 4096, 512, 1):  # to the last byte, in smaller pieces
                block = b"\0" * size
                try:
                    while os.write(fd, block) > 0:
                        pass
                except OSError:
                    pass
        finally:
            os.close(fd)
        # a failed test still frees the disk before its daemon stops (cleanups run last first):
        # a shepherd waits for space to write its status, and would outlive it
        self.addCleanup(lambda: os.path.exists(filler) and os.unlink(filler))
        st = os.statvfs(state)
        self.assertEqual(st.f_bavail, 0, "the filesystem is full")
        return filler

    def test_database_full_refuses_then_recovers(self):
        state = self.small_state_dir()
        d = self.start_daemon("--slots", "1", state_dir=state)
        done, _ = d.submit({"name": "before", "command": ["true"]})
        self.assert_final(d, done["id"], d.follow(done["id"]), "succeeded")
        filler = self.fill(state)
        status, headers, body = d.json("POST", "/v1/jobs", {"name": "x", "command": ["true"]})
        err = self.assert_error((status, headers, body), 507, "insufficient_storage",
                                what="a submission on a full disk")
        self.assertIn(state, err["message"], "the message says where")
        self.assertIn("full", err["message"])
        # reads go on
        self.assertEqual(d.get_ok(f"/v1/jobs/{done['id']}")["state"], "succeeded")
        self.assertEqual([j["id"] for j in d.get_ok("/v1/jobs")["jobs"]], [done["id"]])
        self.assertEqual(d.get_ok("/v1/health")["status"], "ok")
        os.unlink(filler)  # space returns: no restart needed
        job, _ = d.submit({"name": "after", "command": ["true"]})
        self.assert_final(d, job["id"], d.follow(job["id"]), "succeeded")

    def gated_daemon(self, slots):
        """A daemon on a small state dir, and the path of a gate its jobs wait on (files in a
        directory on that disk, which the job can write)."""
        state = self.small_state_dir()
        d = self.start_daemon("--slots", str(slots), state_dir=state)
        shared = os.path.join(state, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o777)  # the job runs as run_as under a root daemon
        return state, d, os.path.join(shared, "gate")

    def test_events_wait_for_space(self):
        state, d, gate = self.gated_daemon(1)
        # 40 train lines, the last 30 printed while the disk is full, then it waits for the gate
        code = ("import json, os, sys, time\n"
                "def line(s):\n"
                "    print(json.dumps({'event': 'train', 'step': s, 'loss': 1.0 / s}), flush=True)\n"
                "for s in range(1, 11): line(s)\n"
                f"while not os.path.exists({gate + '.full'!r}): time.sleep(0.02)\n"
                "for s in range(11, 41): line(s)\n"
                f"open({gate + '.printed'!r}, 'w').close()\n"
                f"while not os.path.exists({gate!r}): time.sleep(0.02)\n")
        job, _ = d.submit({"name": "through", "command": ["/usr/bin/python3", "-c", code]})
        jid = job["id"]
        with d.events(jid) as s:
            s.until(lambda e: e.event == "train" and e.data["step"] == 10, "step 10")
            filler = self.fill(state)
            open(gate + ".full", "w").close()  # in the fill: a tmpfs takes a name without a block
            wait_for(lambda: os.path.exists(gate + ".printed"), "the lines printed")
            # nothing can be stored now: the stream has seen steps 1 to 10 only, and the daemon
            # still answers
            self.assertEqual(d.get_ok(f"/v1/jobs/{jid}")["state"], "running")
            os.unlink(filler)
            s.until(lambda e: e.event == "train" and e.data["step"] == 40, "step 40")
        open(gate, "w").close()
        events = d.follow(jid)
        self.assert_final(d, jid, events, "succeeded")
        steps = [e.data["step"] for e in events if e.event == "train"]
        self.assertEqual(steps, list(range(1, 41)), "every line once, in order")
        ids = [e.id for e in events]
        self.assertEqual(ids, list(range(1, len(ids) + 1)), "event ids without a gap")
        metrics = d.get_ok(f"/v1/jobs/{jid}/metrics")
        self.assertEqual([m["step"] for m in metrics if m["event"] == "train"], steps)
        log = "\n".join(d.stderr_lines)
        self.assertRegex(log, rf"job {jid}: cannot store its events .*full")
        self.assertRegex(log, rf"job {jid}: its events are stored again")

    def test_logs_wait_for_space(self):
        state, d, gate = self.gated_daemon(2)
        # two processes print 40 lines each, odd ones to stdout and even ones to stderr; lines
        # 11 to 40 while the disk is full. A line is 1 KiB: the first few written while full
        # may still fit in the last page of the log (tmpfs allocates a page at a time), the
        # rest cannot
        code = ("import os, sys, time\n"
                "r = os.environ['RANK']\n"
                "def lines(a, b):\n"
                "    for i in range(a, b):\n"
                "        print(f'rank {r} line {i} ' + 'x' * 1000,\n"
                "              file=sys.stdout if i % 2 else sys.stderr, flush=True)\n"
                "lines(1, 11)\n"
                f"while not os.path.exists({gate + '.full'!r}): time.sleep(0.02)\n"
                "lines(11, 41)\n"
                f"open({gate + '.printed'!r} + r, 'w').close()\n"
                f"while not os.path.exists({gate!r}): time.sleep(0.02)\n")
        job, _ = d.submit({"name": "logs", "command": ["/usr/bin/python3", "-c", code],
                           "resources": {"nproc": 2}})
        jid = job["id"]
        for r in (0, 1):
            wait_for(lambda: f"rank {r} line 10 " in d.logs(jid, r)[1], f"rank {r}'s line 10")
        filler = self.fill(state)
        open(gate + ".full", "w").close()  # in the fill: a tmpfs takes a name without a block
        for r in (0, 1):
            wait_for(lambda: os.path.exists(f"{gate}.printed{r}"), f"rank {r}'s lines printed")
        for r in (0, 1):  # the disk took a few of them at most
            self.assertNotIn(f"rank {r} line 40 ", d.logs(jid, r)[1])
        self.assertEqual(d.get_ok(f"/v1/jobs/{jid}")["state"], "running")
        os.unlink(filler)
        open(gate, "w").close()
        self.assert_final(d, jid, d.follow(jid), "succeeded")
        for r in (0, 1):
            got = [line for line in d.logs(jid, r)[1].splitlines() if line.startswith("rank ")]
            want = [f"rank {r} line {i} " + "x" * 1000 for i in range(1, 41)]
            if r == 1:  # one pipe for its stdout and stderr: the order they were written in
                self.assertEqual(got, want, "every line of rank 1 once, in order")
            else:  # rank 0's stdout goes through the output file: each stream in order
                for odd in (0, 1):
                    self.assertEqual([g for g in got if int(g.split()[3]) % 2 == odd],
                                     [w for w in want if int(w.split()[3]) % 2 == odd],
                                     "every line of rank 0 once, each stream in order")
        # the shepherd's own log is on the full disk too: it says when the logs took lines again
        with open(os.path.join(state, "jobs", str(jid), "attempt-0.node-0.log")) as f:
            shepherd_log = f.read()
        for r in (0, 1):
            self.assertRegex(shepherd_log, rf"rank-{r}\.log: written again, nothing lost\n")

    def test_checkpoint_save_fails_cleanly(self):
        state = self.small_state_dir()
        d = self.start_daemon("--slots", "1", state_dir=state)
        spec = train_spec("ckpt", epochs=200)  # far longer than the test: it fails first
        job, _ = d.submit(spec)
        jid = job["id"]
        with d.events(jid) as s:
            s.until(lambda e: e.event == "checkpoint", "a first checkpoint")
            workers = [w[0] for w in d.workers() if w[2].get("TRAIND_JOB_ID") == str(jid)]
            self.assertTrue(workers, "the job's ranks")
            for pid in workers:
                os.kill(pid, signal.SIGSTOP)  # between two checkpoints, while the disk fills
            filler = self.fill(state)
            listed = d.get_ok(f"/v1/jobs/{jid}/checkpoints")
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
            # the next save fails and the rank exits; its end is stored once there is room
            wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in workers),
                     "the ranks to end")
            os.unlink(filler)
            rest = s.rest()
        final = rest[-1]
        self.assertEqual((final.event, final.data["state"]), ("state", "failed"), final)
        reason = final.data["reason"]
        self.assertIn("No space left on device", reason)
        self.assertIn(os.path.join(state, "jobs", str(jid), "checkpoints"), reason,
                      "the reason says where")
        after = d.get_ok(f"/v1/jobs/{jid}/checkpoints")
        self.assertTrue(listed)
        self.assertEqual([c["step"] for c in after][:len(listed)], [c["step"] for c in listed],
                         "the checkpoints saved before stay listed")
        for c in after:  # each whole: every file downloads with its size and digest
            for f in c["files"]:
                status, _, body = d.request("GET", f["url"])
                self.assertEqual(status, 200, f["url"])
                self.assertEqual(len(body), f["size"], f["url"])
                if "sha256" in f:
                    self.assertEqual(hashlib.sha256(body).hexdigest(), f["sha256"], f["url"])

    def test_start_on_a_full_disk_says_so(self):
        state = self.small_state_dir()
        d = self.start_daemon("--slots", "1", state_dir=state)
        job, _ = d.submit({"name": "before", "command": ["true"]})
        self.assert_final(d, job["id"], d.follow(job["id"]), "succeeded")
        self.assertEqual(d.stop(), [], "nothing outlived the first daemon")
        filler = self.fill(state)
        try:
            run = subprocess.run([harness.TRAIND, "--config", "", "--state-dir", state,
                                  "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                                 timeout=60, stdin=subprocess.DEVNULL)
        finally:
            os.unlink(filler)
        self.assertNotEqual(run.returncode, 0, run.stderr)
        self.assertRegex(run.stderr, r"filesystem it is on is full", run.stderr)
        self.assertNotIn("another program's file", run.stderr)
        again = self.start_daemon("--slots", "1", state_dir=state)  # with room, as before
        self.assertEqual(again.get_ok(f"/v1/jobs/{job['id']}")["state"], "succeeded")


def main():
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    if os.geteuid() != 0:
        print("diskfull_test: skipped: mounting a tmpfs needs root")
        sys.exit(77)
    names = sys.argv[3:] or ["test_database_full_refuses_then_recovers",
                             "test_events_wait_for_space", "test_logs_wait_for_space",
                             "test_checkpoint_save_fails_cleanly",
                             "test_start_on_a_full_disk_says_so"]
    suite = unittest.TestSuite([DiskFullTest(n) for n in names])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
