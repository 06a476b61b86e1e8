#!/usr/bin/python3
"""traind-shepherd on its own, driven as the daemon will drive it: it runs an attempt's
processes, appends rank 0's stdout to a durable file, answers on its control socket, stops the
group on request, at the deadline, or when no daemon has been connected for the orphan limit,
outlives the process that started it, and writes a status file when the group is over.

    /usr/bin/python3 tests/integration/shepherd_test.py SHEPHERD"""
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

SHEPHERD = None
TIMEOUT = 60.0


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


wait_for = harness.wait_for  # polls f every 50 ms; AssertionError naming what


TOKEN = "0123456789abcdef-test-token"


class Control:
    """The daemon's side of the socket: lines in, lines out; hello with the token first."""

    def __init__(self, path, token=TOKEN):
        def connected():  # between bind and listen a connect is refused: try again
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(TIMEOUT)
            try:
                s.connect(path)
                return s
            except (ConnectionRefusedError, FileNotFoundError):
                s.close()
                return None
        self.s = wait_for(connected, f"a connection to {path}")
        self.buf = b""
        if token is not None:
            self.send(f"hello {token}")

    def send(self, line):
        self.s.sendall(line.encode() + b"\n")

    def line(self):
        while b"\n" not in self.buf:
            ready, _, _ = select.select([self.s], [], [], TIMEOUT)
            if not ready:
                raise AssertionError("the shepherd said nothing")
            chunk = self.s.recv(4096)
            if not chunk:
                raise EOFError("the shepherd closed the socket")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def until(self, prefix):
        while True:
            ln = self.line()
            if ln.startswith(prefix):
                return ln

    def close(self):
        self.s.close()


class ShepherdTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="traind-shepherd-test-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.procs = []

    def tearDown(self):
        for p in self.procs:  # never leave one behind, whatever the test did
            if p.poll() is None:
                p.kill()
                p.wait()

    def spec(self, script, nproc=2, **extra):
        s = {"argv": ["/bin/sh", "-c", script], "nproc": nproc, "dir": self.dir,
             "logs": [os.path.join(self.dir, f"rank-{r}.log") for r in range(nproc)],
             "output": os.path.join(self.dir, "attempt-0.out"),
             "socket": os.path.join(self.dir, "shepherd.sock"),
             "status": os.path.join(self.dir, "attempt-0.status"),
             "master_addr": "127.0.0.1", "master_port": 29500, "run_id": "test",
             "grace_s": 2, "token": TOKEN}
        s.update(extra)
        path = os.path.join(self.dir, "spec.json")
        with open(path, "w") as f:
            json.dump(s, f)
        return path, s

    def start(self, spec_path):
        with open(os.path.join(self.dir, "shepherd.err"), "w") as err:
            p = subprocess.Popen([SHEPHERD, spec_path], stdin=subprocess.DEVNULL, stderr=err)
        self.procs.append(p)
        return p

    def control(self, s, token=TOKEN):
        c = Control(s["socket"], token)
        self.addCleanup(c.close)
        return c

    def status(self, p, s):
        code = p.wait(timeout=TIMEOUT)
        with open(os.path.join(self.dir, "shepherd.err")) as f:
            self.assertEqual(code, 0, f.read())
        with open(s["status"]) as f:
            return json.load(f)

    def test_runs_the_group_and_keeps_rank0_output(self):
        path, s = self.spec('echo "{\\"event\\": \\"train\\", \\"rank\\": $RANK}"; '
                            'echo "to the log $RANK" >&2; exit 0')
        p = self.start(path)
        st = self.status(p, s)
        self.assertEqual((st["exit_code"], st["failed_rank"], st["stopped_by"]), (0, -1, None))
        with open(s["output"]) as f:
            self.assertEqual(f.read(), '{"event": "train", "rank": 0}\n', "rank 0's stdout only")
        self.assertEqual(st["output_bytes"], os.path.getsize(s["output"]))
        with open(s["logs"][1]) as f:
            self.assertEqual(f.read(), '{"event": "train", "rank": 1}\nto the log 1\n')
        self.assertFalse(os.path.exists(s["socket"]), "the socket goes with the shepherd")

    def test_a_failure_stops_the_rest(self):
        path, s = self.spec('if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 600')
        st = self.status(self.start(path), s)
        self.assertEqual((st["exit_code"], st["failed_rank"]), (3, 1), st)
        self.assertIn("rank 1", st["reason"])

    def test_stop_on_request_and_the_daemon_protocol(self):
        path, s = self.spec('echo "{\\"ready\\": 1}"; echo not a metric line; exec sleep 600')
        p = self.start(path)
        c = self.control(s)
        pids = c.until("pid ").split()
        pgid, n, ranks = int(pids[1]), int(pids[2]), [int(x) for x in pids[3:]]
        self.assertEqual(n, 2)
        self.assertTrue(all(alive(r) for r in ranks))
        self.assertEqual(os.getpgid(ranks[0]), pgid)
        # the output file takes rank 0's lines that may be metric lines (a JSON object) only
        wait_for(lambda: c.until("out ") == "out 13", "rank 0's first line in the output file")
        c.send("status")
        self.assertTrue(c.until("pid ").startswith(f"pid {pgid} 2"))
        c.send("stop 15 2 cancelled by the user")
        self.assertEqual(c.until("over"), "over")
        st = self.status(p, s)
        self.assertEqual((st["stopped_by"], st["stop_reason"]), ("request", "cancelled by the user"))
        self.assertEqual(st["exit_code"], 128 + signal.SIGTERM, st)  # sleep dies of SIGTERM
        self.assertFalse([r for r in ranks if alive(r)])

    def test_outlives_its_starter_and_takes_a_new_daemon(self):
        path, s = self.spec('exec sleep 600', nproc=1, orphan_timeout_s=60)
        # a "daemon" that starts the shepherd and is then killed -9
        starter = subprocess.Popen(["/bin/sh", "-c", f'"{SHEPHERD}" "{path}" 2>/dev/null & '
                                    'echo $!; exec sleep 600'], stdout=subprocess.PIPE, text=True,
                                   start_new_session=True)
        self.procs.append(starter)
        shepherd_pid = int(starter.stdout.readline())
        starter.stdout.close()
        first = self.control(s)
        rank = int(first.until("pid ").split()[3])
        # what a dying daemon's process group gets (a terminal's hangup, systemd's SIGTERM to
        # the group): the shepherd left that group, so it is not hit
        os.killpg(starter.pid, signal.SIGTERM)
        os.killpg(starter.pid, signal.SIGHUP)
        starter.wait()
        first.close()  # the daemon's connection goes with it
        self.assertTrue(alive(shepherd_pid) and alive(rank), "the job goes on without its daemon")
        again = self.control(s)  # the next daemon
        self.assertEqual(int(again.until("pid ").split()[3]), rank, "the same process")
        again.send("stop 15 1 done")
        self.assertEqual(again.until("over"), "over")
        wait_for(lambda: not alive(shepherd_pid) and not alive(rank), "the shepherd to end")
        with open(s["status"]) as f:
            self.assertEqual(json.load(f)["stopped_by"], "request")

    def test_orphaned_too_long_stops_the_job(self):
        path, s = self.spec('exec sleep 600', nproc=1, orphan_timeout_s=1)
        st = self.status(self.start(path), s)  # no daemon ever connects
        self.assertEqual(st["stopped_by"], "orphaned")
        self.assertIn("orphan_timeout_s", st["stop_reason"])

    def test_deadline_and_grace(self):
        # rank 0 ignores SIGTERM: SIGKILL after the grace period, and the status says so
        path, s = self.spec("trap '' TERM; while :; do sleep 0.1; done", nproc=1,
                            deadline=time.time() + 1, grace_s=0.5, orphan_timeout_s=60)
        st = self.status(self.start(path), s)
        self.assertEqual(st["stopped_by"], "deadline")
        self.assertTrue(st["grace_expired"], st)
        self.assertEqual(st["exit_code"], 128 + signal.SIGKILL, st)

    def test_only_the_daemon_may_stop_it(self):
        path, s = self.spec('exec sleep 600', nproc=1, orphan_timeout_s=60)
        p = self.start(path)
        daemon = self.control(s)
        rank = int(daemon.until("pid ").split()[3])
        for token in (None, "wrong-token-0123456789"):  # a job's process, say
            try:
                intruder = self.control(s, token)
                intruder.send("stop 9 0 taken over")
            except (BrokenPipeError, ConnectionResetError):
                continue  # closed already, after the wrong hello
            with self.assertRaises((EOFError, ConnectionResetError)):  # closed without a word
                intruder.line()
        daemon.send("status")
        self.assertEqual(int(daemon.until("pid ").split()[3]), rank, "still running, still ours")
        daemon.send("stop 15 1 done")
        self.assertEqual(self.status(p, s)["stop_reason"], "done")

    def test_sigterm_stops_the_group(self):
        path, s = self.spec('exec sleep 600', nproc=1)
        p = self.start(path)
        rank = int(self.control(s).until("pid ").split()[3])
        p.send_signal(signal.SIGTERM)
        st = self.status(p, s)
        self.assertEqual(st["stopped_by"], "signal")
        self.assertFalse(alive(rank))

    def test_leftovers_end_with_the_group(self):
        # rank 0 leaves a child behind (as mp.spawn's can) and exits 0
        path, s = self.spec('sleep 600 & echo $! > left; exit 0', nproc=1, grace_s=0.5)
        st = self.status(self.start(path), s)
        self.assertEqual(st["exit_code"], 0, st)
        with open(os.path.join(self.dir, "left")) as f:
            self.assertFalse(alive(int(f.read())), "nothing of the job outlives it")

    def test_a_program_that_cannot_start(self):
        path, s = self.spec("true", argv=["/nonexistent/program"])
        p = self.start(path)
        self.assertEqual(p.wait(timeout=TIMEOUT), 1)
        with open(s["status"]) as f:
            st = json.load(f)
        self.assertEqual(st["exit_code"], 1)
        self.assertIn("/nonexistent/program", st["reason"])

    def test_a_spec_it_cannot_use(self):
        path, _ = self.spec("true", logs=["only-one"])
        p = subprocess.run([SHEPHERD, path], capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(p.returncode, 2)
        self.assertIn("logs: expected 2 paths", p.stderr)
        self.assertIn(path, p.stderr)


if __name__ == "__main__":
    SHEPHERD = os.path.abspath(sys.argv[1])
    unittest.main(argv=[sys.argv[0]] + sys.argv[2:], verbosity=2)
