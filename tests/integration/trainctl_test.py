#!/usr/bin/python3
"""trainctl (clients/trainctl) against a real traind: every subcommand, `follow` on a
pseudo-terminal (the progress line is redrawn in place, the final state line appears, the exit
status matches the job's end) and off one (one JSON event per line), a follow that resumes across
a kill -9 and restart of the daemon with nothing missed or repeated, Ctrl-C with and without
--cancel-on-interrupt, and a download that resumes a truncated file.

    /usr/bin/python3 tests/integration/trainctl_test.py TRAIND TRAINCTL SOURCE_DIR

Daemons come from the harness (harness.py: a fresh state directory each, killed at the end)."""
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402  (the harness: Daemon, train_spec)

TRAINCTL = None
TIMEOUT = 120


class TrainctlTest(harness.DaemonTest):
    def env(self, d, token=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIND_")}
        env.update(TRAIND_URL=f"http://127.0.0.1:{d.port}", TRAIND_TOKEN=token or d.token,
                   HOME=self.new_state_dir(), XDG_CONFIG_HOME="", XDG_STATE_HOME="")
        return env

    def run_ctl(self, d, *args, token=None, env=None, stdin=None):
        """trainctl ARGS off a terminal: (exit status, stdout, stderr)."""
        p = subprocess.run([TRAINCTL, *args], env=env or self.env(d, token), input=stdin,
                           capture_output=True, text=True, timeout=TIMEOUT)
        return p.returncode, p.stdout, p.stderr

    def spec_file(self, spec):
        path = os.path.join(self.new_state_dir(), "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        return path

    def submit(self, d, spec, *args):
        rc, out, err = self.run_ctl(d, "submit", self.spec_file(spec), "--json", *args)
        self.assertEqual(rc, 0, err)
        return json.loads(out)["id"]

    def test_a_every_subcommand(self):
        d = self.start_daemon("--slots", "2", "--grace", "2", "--node-name", "solo")
        rc, out, err = self.run_ctl(d, "version")
        self.assertEqual((rc, out.splitlines()[0]), (0, "trainctl 0.1.0"), err)
        self.assertIn("traind 0.1.0 (API v1)", out)
        rc, out, _ = self.run_ctl(d, "nodes")
        self.assertEqual(out.split("\n")[1].split()[:3], ["solo", "master", "ready"])

        # submit with every override; follow off a terminal gives JSON lines
        spec = harness.train_spec("lenet", epochs=1)
        rc, out, err = self.run_ctl(d, "submit", self.spec_file(spec), "--name", "renamed",
                                    "--nproc", "2", "--set", "train.optimizer.lr=0.02",
                                    "--set", "log.every_steps=4", "--follow")
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertRegex(lines[0], r"^job \d+ submitted: renamed, queued$")
        jid = int(lines[0].split()[1])
        events = [json.loads(x) for x in lines[1:]]
        ids = [e["id"] for e in events]
        self.assertEqual(ids, list(range(ids[0], ids[0] + len(ids))), "ids +1 each, no gap")
        self.assertEqual((events[-1]["event"], events[-1]["data"]["state"]), ("state", "succeeded"))
        train = [e["data"] for e in events if e["event"] == "train"]
        self.assertEqual([t["step"] for t in train], harness.expected_log_steps(16, 4))
        self.assertEqual(train[-1]["total_steps"], 16, "the run's total steps, for the bar")
        job = d.json("GET", f"/v1/jobs/{jid}")[2]
        self.assertEqual((job["name"], job["nproc"]), ("renamed", 2))
        with open(os.path.join(d.state_dir, "jobs", str(jid), "spec.json")) as f:
            self.assertEqual(json.load(f)["train"]["optimizer"]["lr"], 0.02)

        rc, out, _ = self.run_ctl(d, "ls")
        self.assertEqual(out.splitlines()[0].split()[:3], ["ID", "NAME", "STATE"])
        self.assertEqual(out.splitlines()[1].split()[:4], [str(jid), "renamed", "succeeded", "train"])
        rc, out, _ = self.run_ctl(d, "ls", "--state", "running,queued")
        self.assertEqual(len(out.splitlines()), 1, "only the header: nothing runs")
        rc, out, _ = self.run_ctl(d, "show", str(jid))
        self.assertIn("state       succeeded", out)
        self.assertIn("processes   1 node(s) x 2", out)
        rc, out, _ = self.run_ctl(d, "show", str(jid), "--json")
        self.assertEqual(json.loads(out)["id"], jid)

        api_metrics = d.json("GET", f"/v1/jobs/{jid}/metrics")[2]
        rc, out, _ = self.run_ctl(d, "metrics", str(jid), "--json")
        self.assertEqual(json.loads(out), api_metrics)
        rc, out, _ = self.run_ctl(d, "metrics", str(jid), "--csv")
        rows = out.splitlines()
        self.assertEqual(rows[0].split(",")[:3], ["event", "step", "epoch"])
        self.assertEqual(len(rows), 1 + len(api_metrics))
        rc, out, _ = self.run_ctl(d, "metrics", str(jid))
        self.assertEqual(len(out.splitlines()), 1 + len(api_metrics))

        rc, log0, _ = self.run_ctl(d, "logs", str(jid))
        self.assertIn("[traind]", log0)
        rc, log1, _ = self.run_ctl(d, "logs", str(jid), "--rank", "1", "-f")
        self.assertEqual(rc, 0)
        self.assertEqual(log1, d.request("GET", f"/v1/jobs/{jid}/logs?rank=1")[2].decode())

        # download, then resume a truncated copy
        out_file = os.path.join(self.new_state_dir(), "w.safetensors")
        rc, _, err = self.run_ctl(d, "download", str(jid), "-o", out_file)
        self.assertEqual(rc, 0, err)
        ckpt = d.json("GET", f"/v1/jobs/{jid}/checkpoints")[2][-1]
        size = next(f["size"] for f in ckpt["files"] if f["name"] == "model.safetensors")
        with open(out_file, "rb") as f:
            whole = f.read()
        self.assertEqual(len(whole), size)
        stamp = os.stat(out_file).st_mtime  # the server's Last-Modified, set by trainctl
        rc, _, err = self.run_ctl(d, "download", str(jid), "-o", out_file)
        self.assertEqual(rc, 0, err)
        self.assertIn("already complete", err)
        # cut short, as an interrupted transfer leaves it (trainctl sets the server's time on
        # whatever it wrote): resumed with Range, and whole and equal at the end
        with open(out_file, "r+b") as f:
            f.truncate(size // 3)
        os.utime(out_file, (stamp, stamp))
        rc, _, err = self.run_ctl(d, "download", str(jid), "-o", out_file)
        self.assertEqual(rc, 0, err)
        self.assertIn("(resumed)", err)
        with open(out_file, "rb") as f:
            self.assertEqual(f.read(), whole)
        # a partial file from another version of the server's file (its time differs): If-Range
        # brings the whole file rather than a splice of two
        with open(out_file, "r+b") as f:
            f.truncate(size // 3)
            f.seek(0)
            f.write(b"X" * 100)
        os.utime(out_file, (stamp - 3600, stamp - 3600))
        rc, _, err = self.run_ctl(d, "download", str(jid), "-o", out_file)
        self.assertEqual(rc, 0, err)
        self.assertIn("downloaded again whole", err)
        with open(out_file, "rb") as f:
            self.assertEqual(f.read(), whole)
        rc, _, err = self.run_ctl(d, "download", str(jid), "--step", "3")
        self.assertEqual(rc, 3)
        self.assertIn("no checkpoint of step 3", err)

        # cancel; drain; errors say what and where, with status 3
        rc, _, err = self.run_ctl(d, "cancel", str(jid))
        self.assertEqual(rc, 3)
        self.assertIn("(HTTP 409)", err)
        rc, out, _ = self.run_ctl(d, "drain", "solo")
        self.assertEqual((rc, out), (0, "node solo: draining\n"))
        rc, out, _ = self.run_ctl(d, "undrain", "solo")
        self.assertEqual((rc, out), (0, "node solo: ready\n"))
        bad = harness.train_spec("bad")
        rc, _, err = self.run_ctl(d, "submit", self.spec_file(bad), "--set", "train.batch_size=0")
        self.assertEqual(rc, 3)
        self.assertIn("train.batch_size:", err)
        rc, _, err = self.run_ctl(d, "submit", "-", stdin="{\"model\": ")
        self.assertEqual(rc, 3)
        self.assertIn("(stdin):1:", err)
        rc, _, err = self.run_ctl(d, "ls", token="0" * 64)
        self.assertEqual(rc, 3)
        self.assertIn("refused the API token from TRAIND_TOKEN", err)
        env = self.env(d)
        del env["TRAIND_TOKEN"]
        rc, _, err = self.run_ctl(d, "ls", env=env)
        self.assertEqual(rc, 3)
        self.assertIn("no API token found (looked at: " + env["HOME"] + "/.local/state/traind/token", err)
        rc, _, err = self.run_ctl(d, "show", "seven")
        self.assertEqual(rc, 3)
        self.assertIn("expected a job id", err)
        rc, _, err = self.run_ctl(d, "ls", "--bogus")
        self.assertEqual(rc, 3)
        self.assertIn("unknown option --bogus", err)
        rc, out, _ = self.run_ctl(d, "follow", "--help")
        self.assertEqual(rc, 0)
        self.assertIn("Usage: trainctl follow ID", out)

    def pty_run(self, d, *args, on_output=None):
        """trainctl ARGS on a pseudo-terminal: (exit status, everything it wrote, the time its
        first progress line appeared). on_output(text so far, pid) may act on the process."""
        env = self.env(d)
        t0 = time.monotonic()
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(TRAINCTL, [TRAINCTL, *args], env)
        out, first = b"", None
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if first is None and b"\x1b[Kepoch " in out:
                first = time.monotonic() - t0
            if on_output:
                on_output(out.decode(errors="replace"), pid)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        return os.waitstatus_to_exitcode(status), out.decode(errors="replace"), first

    def test_b_follow_on_a_terminal(self):
        d = self.start_daemon("--slots", "1", "--grace", "2")
        spec = self.spec_file(harness.train_spec("tty", epochs=2))
        rc, out, first = self.pty_run(d, "submit", spec, "--follow")
        self.assertEqual(rc, 0, out)
        redraws = out.count("\r\x1b[Kepoch ")
        self.assertGreaterEqual(redraws, 10, "the progress line is redrawn in place")
        self.assertRegex(out, r"epoch 2/2  step 64/64 \[#{20}\] 100%  loss \d\.\d{4}")
        self.assertRegex(out, r"checkpoint  step 10  ")
        self.assertRegex(out, r"\x1b\[Kjob \d+ succeeded after \d+:\d\d\r?\n$")
        print(f"\n[trainctl] submit to the first progress line: {first:.3f} s", file=sys.stderr)

        # a job that fails (a command that exits 3): exit status 1, its reason on the last line
        cmd = {"name": "exit3", "command": ["/bin/sh", "-c", "echo boom >&2; exit 3"]}
        rc, out, _ = self.pty_run(d, "submit", self.spec_file(cmd), "--follow")
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"job \d+ failed[^\n]*boom")

        # Ctrl-C: following stops, the job goes on; with --cancel-on-interrupt it is cancelled
        long_spec = self.spec_file(harness.train_spec("long", epochs=1000, checkpoint=False))
        for cancel in (False, True):
            sent = []

            def interrupt(text, pid):
                if not sent and "\x1b[Kepoch " in text:
                    os.kill(pid, signal.SIGINT)
                    sent.append(True)
            args = ["submit", long_spec, "--follow"] + (["--cancel-on-interrupt"] if cancel else [])
            rc, out, _ = self.pty_run(d, *args, on_output=interrupt)
            jid = int(out.split()[1])
            if cancel:
                self.assertEqual(rc, 2, out)
                self.assertEqual(d.json("GET", f"/v1/jobs/{jid}")[2]["state"], "cancelled")
            else:
                self.assertEqual(rc, 130, out)
                self.assertIn(f"stopped following job {jid}; it goes on", out)
                self.assertEqual(d.json("GET", f"/v1/jobs/{jid}")[2]["state"], "running")
                # cancelled from elsewhere while followed: exit status 2
                def cancel_it(text, pid, jid=jid, done=[]):
                    if not done and "\x1b[Kepoch " in text:
                        d.json("POST", f"/v1/jobs/{jid}/cancel")
                        done.append(True)
                rc, out, _ = self.pty_run(d, "follow", str(jid), on_output=cancel_it)
                self.assertEqual(rc, 2, out)
                self.assertRegex(out, rf"job {jid} cancelled")

    def test_c_follow_resumes_across_a_daemon_restart(self):
        state = self.new_state_dir()
        d1 = self.start_daemon("--slots", "1", state_dir=state)
        port = d1.port
        jid = self.submit(d1, harness.train_spec("resume", epochs=3))
        proc = subprocess.Popen([TRAINCTL, "follow", str(jid)], env=self.env(d1),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = []
        for line in proc.stdout:
            seen.append(json.loads(line))
            if seen[-1]["event"] == "checkpoint":
                break
        d1.kill()  # the job runs on; the next daemon re-attaches to it
        self.start_daemon("--slots", "1", "--listen", f"127.0.0.1:{port}", state_dir=state)
        for line in proc.stdout:
            seen.append(json.loads(line))
        rc = proc.wait(timeout=TIMEOUT)
        err = proc.stderr.read()
        self.assertEqual(rc, 0, err)
        ids = [e["id"] for e in seen]
        self.assertEqual(ids, list(range(ids[0], ids[0] + len(ids))),
                         "nothing missed or repeated across the restart")
        self.assertNotIn("restart", [e["event"] for e in seen], "re-attached: nothing restarted")
        self.assertEqual((seen[-1]["event"], seen[-1]["data"]["state"]), ("state", "succeeded"))
        self.assertIn("reconnecting", err)
        self.assertIn("reconnected", err)

    def test_e_rough_edges(self):
        """What a newcomer tripped on: submit -q prints the id alone; an eval line without
        val_loss shows none (no invented 0.0000); numbers print as the job printed them (not
        with 17 digits); one rank is "rank 0", not "ranks 0-0";
        cancelling a finished job says it ended; tensorboard and delete exist; a TLS failure
        points at --cacert."""
        d = self.start_daemon("--slots", "1", "--node-name", "solo")
        code = ("import json\n"
                "print(json.dumps({'event': 'train', 'step': 2, 'loss': 2.26932275}))\n"
                "print(json.dumps({'event': 'eval', 'step': 3, 'val_acc': 0.5}))\n")
        rc, out, err = self.run_ctl(d, "submit", "-q", self.spec_file(
            {"name": "evalonly", "command": ["/usr/bin/python3", "-c", code]}))
        self.assertEqual(rc, 0, err)
        jid = out.strip()
        self.assertTrue(jid.isdigit(), out)
        rc, out, err = self.run_ctl(d, "follow", jid)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("val_loss", out + err)
        rc, out, err = self.run_ctl(d, "show", jid)
        self.assertIn("evaluation  step 3, val_acc 0.5000\n", out)
        self.assertNotIn("val_loss", out)
        self.assertIn("node rank 0, rank 0", out)
        self.assertNotIn("ranks 0-0", out)
        rc, out, err = self.run_ctl(d, "metrics", jid, "--json")
        self.assertIn("2.26932275", out, "a number as the job printed it")
        self.assertNotIn("2.2693227500000002", out)
        rc, out, err = self.run_ctl(d, "cancel", jid)
        self.assertNotEqual(rc, 0)
        self.assertIn(f"job {jid} has already ended (succeeded): there is nothing to cancel", err)
        # ls: a run whose summary line alone has val_acc shows it
        done = "import json\nprint(json.dumps({'event': 'done', 'step': 1, 'val_acc': 0.75}))\n"
        rc, out, err = self.run_ctl(d, "submit", "-q", self.spec_file(
            {"name": "doneonly", "command": ["/usr/bin/python3", "-c", done]}))
        self.assertEqual(self.run_ctl(d, "follow", out.strip())[0], 0)
        rc, out, err = self.run_ctl(d, "ls")
        (row,) = [line for line in out.splitlines() if "doneonly" in line]
        self.assertIn("0.7500", row)
        # tensorboard and delete
        tar = os.path.join(self.new_state_dir(), "tb.tar")
        rc, out, err = self.run_ctl(d, "tensorboard", jid, "-o", tar)
        self.assertEqual(rc, 0, err)
        import tarfile
        with tarfile.open(tar) as t:
            self.assertTrue(any("tfevents" in n for n in t.getnames()), t.getnames())
        rc, out, err = self.run_ctl(d, "delete", jid)
        self.assertEqual((rc, out), (0, f"job {jid} deleted\n"), err)
        rc, out, err = self.run_ctl(d, "show", jid)
        self.assertNotEqual(rc, 0)
        env = self.env(d)
        env["TRAIND_URL"] = f"https://127.0.0.1:{d.port}"  # plain HTTP behind an https URL
        rc, out, err = self.run_ctl(d, "ls", env=env)
        self.assertNotEqual(rc, 0)
        self.assertIn("--cacert", err)


    def experiment_file(self, name, job, n_values=2, mode="max"):
        """An experiment of len(values) trials of job over env.N (a grid), on "score"."""
        return self.spec_file({"name": name, "job": job, "max_concurrent": 2,
                               "space": {"env.N": {"grid": [str(n + 1) for n in range(n_values)]}},
                               "searcher": {"type": "grid", "metric": "score", "mode": mode}})

    def test_f_experiments(self):
        """exp create (and --follow off a terminal and on one), ls, show, best (and its
        checkpoint's archive), cancel, rm; errors say what and where, with status 3."""
        import tarfile
        d = self.start_daemon("--slots", "2", "--grace", "1")
        # each trial registers a checkpoint holding its N, then says its score: N
        job = {"name": "c", "command": ["/bin/sh", "-c",
               'mkdir -p ck && echo "$N" > ck/n.txt && '
               'echo "{\\"event\\": \\"checkpoint\\", \\"step\\": 1, \\"path\\": \\"ck\\"}" && '
               'echo "{\\"event\\": \\"train\\", \\"step\\": 1, \\"score\\": $N}"']}
        rc, out, err = self.run_ctl(d, "exp", "create", self.experiment_file("c", job))
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"^experiment \d+ created: c, 2 trials \(grid search, max score\)\n$")
        eid = int(out.split()[1])

        # --follow off a terminal: a line per trial change, the table, the end, the best trial
        rc, out, err = self.run_ctl(d, "exp", "create", self.experiment_file("f", job),
                                    "--follow")
        self.assertEqual(rc, 0, out + err)
        fid = int(out.split()[1])
        self.assertRegex(out, r"\ntrial 1: succeeded \(job \d+\), best score 2 at step 1")
        self.assertIn(f"\nexperiment {fid} succeeded\n", out)
        self.assertRegex(out, rf"experiment {fid}: best trial 1, job \d+\n  score +2 \(max, "
                              r"at step 1\)\n  env.N +\"2\"\n")
        table = out[out.index("TRIAL "):].splitlines()
        self.assertEqual([line.split()[0] for line in table[1:3]], ["1", "0"], "best first")
        rc, out, err = self.run_ctl(d, "exp", "create", "-q", self.experiment_file("j", job),
                                    "--follow", "--json")
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual(json.loads("\n".join(lines[1:]))["id"], int(lines[0]))

        harness.wait_for(lambda: d.json("GET", f"/v1/experiments/{eid}")[2]["state"] != "running",
                         f"experiment {eid} to end")
        rc, out, err = self.run_ctl(d, "exp", "ls")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.splitlines()[0].split()[:4], ["ID", "NAME", "STATE", "SEARCH"])
        rows = [line.split() for line in out.splitlines()[1:]]
        self.assertEqual([r[0] for r in rows], [str(fid + 1), str(fid), str(eid)], "newest first")
        self.assertEqual(rows[-1][1:8], ["c", "succeeded", "grid", "2/2", "0", "max", "score"])
        rc, out, err = self.run_ctl(d, "exp", "ls", "--json")
        self.assertEqual(json.loads(out), d.json("GET", "/v1/experiments")[2])
        rc, out, err = self.run_ctl(d, "exp", "show", str(eid))
        self.assertEqual(rc, 0, err)
        self.assertIn(f"experiment {eid}  c  (grid search of 2 trials, max score)\n", out)
        self.assertIn("  state       succeeded\n", out)
        self.assertIn("  trials      2 succeeded\n", out)
        self.assertIn('  space       env.N {"grid": ["1", "2"]}', out)
        self.assertRegex(out, r"  best        trial 1 \(job \d+\): score 2 at step 1, with a "
                              r"checkpoint")
        trials = out[out.index("TRIAL "):].splitlines()
        self.assertEqual(trials[0].split(), ["TRIAL", "JOB", "STATE", "STEPS", "BEST", "HPARAMS"])
        self.assertEqual([r.split()[:1] + r.split()[2:] for r in trials[1:]],
                         [["1", "succeeded", "1", "2", "env.N=2"],
                          ["0", "succeeded", "1", "1", "env.N=1"]])
        rc, out, err = self.run_ctl(d, "exp", "show", str(eid), "--json")
        self.assertEqual(json.loads(out)["id"], eid)

        # best, and its checkpoint as a tar (into a directory made for it)
        best = d.json("GET", f"/v1/experiments/{eid}")[2]["best"]
        rc, out, err = self.run_ctl(d, "exp", "best", str(eid))
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, f"experiment {eid}: best trial 1, job {best['job']}\n"
                              "  score      2 (max, at step 1)\n"
                              '  env.N      "2"\n'
                              f"  checkpoint step 1: /v1/jobs/{best['job']}/checkpoints/1.tar\n")
        rc, out, err = self.run_ctl(d, "exp", "best", str(eid), "--json")
        self.assertEqual(json.loads(out), best)
        where = os.path.join(self.new_state_dir(), "got")
        for _ in range(2):  # the second replaces the first
            rc, out, err = self.run_ctl(d, "exp", "best", str(eid), "--download", where)
            self.assertEqual(rc, 0, err)
        tar = os.path.join(where, f"exp-{eid}-best-step-1.tar")
        self.assertIn(f"{tar}: the checkpoint of step 1 of trial 1", out)
        with tarfile.open(tar) as t:
            (member,) = [m for m in t.getnames() if m.endswith("n.txt")]
            self.assertEqual(t.extractfile(member).read(), b"2\n")
        rc, out, err = self.run_ctl(d, "exp", "best", str(eid), "somewhere")
        self.assertEqual(rc, 3)
        self.assertIn("unexpected argument \"somewhere\"", err)

        # cancel: an ended experiment is refused; a running one stops, and rm waits for its end
        rc, out, err = self.run_ctl(d, "exp", "cancel", str(eid))
        self.assertEqual(rc, 3)
        self.assertIn(f"experiment {eid} has already ended (succeeded): there is nothing to "
                      "cancel (HTTP 409)", err)
        sleeper = {"name": "s", "command": ["/bin/sh", "-c", "exec sleep 1000"]}
        rc, out, err = self.run_ctl(d, "exp", "create", "-q",
                                    self.experiment_file("s", sleeper, n_values=3))
        sid = int(out)
        harness.wait_for(lambda: d.json("GET", f"/v1/experiments/{sid}")[2]["counts"]["running"]
                         == 2, "two trials running")
        rc, out, err = self.run_ctl(d, "exp", "rm", str(sid))
        self.assertEqual(rc, 3)
        self.assertIn("cancel it first", err)
        # pause: its running trials stop and are paused; resume: they go on
        rc, out, err = self.run_ctl(d, "exp", "pause", str(sid))
        self.assertEqual((rc, out), (0, f"experiment {sid}: paused (2 trials pausing: a running "
                                        "one goes on from its latest checkpoint; trainctl exp "
                                        f"resume {sid})\n"), err)
        harness.wait_for(lambda: d.json("GET", f"/v1/experiments/{sid}")[2]["counts"]["paused"]
                         == 2, "two trials paused")
        rc, out, err = self.run_ctl(d, "exp", "show", str(sid))
        self.assertIn("paused", out)
        rc, out, err = self.run_ctl(d, "exp", "resume", str(sid))
        self.assertEqual((rc, out), (0, f"experiment {sid}: running again (its paused trials go "
                                        "on first)\n"), err)
        harness.wait_for(lambda: d.json("GET", f"/v1/experiments/{sid}")[2]["counts"]["running"]
                         == 2, "two trials running again")
        rc, out, err = self.run_ctl(d, "exp", "cancel", str(sid))
        self.assertEqual((rc, out), (0, f"experiment {sid}: cancelling (2 unfinished trials "
                                        "stopping; it ends cancelled once they have)\n"), err)
        rc, out, err = self.run_ctl(d, "exp", "best", str(sid))
        self.assertEqual(rc, 3)
        self.assertIn(f"experiment {sid} has no best trial", err)
        harness.wait_for(lambda: d.json("GET", f"/v1/experiments/{sid}")[2]["state"]
                         == "cancelled", f"experiment {sid} cancelled")
        for x in (eid, sid):
            rc, out, err = self.run_ctl(d, "exp", "rm", str(x))
            self.assertEqual((rc, out), (0, f"experiment {x} deleted with its trials\n"), err)
        rc, out, err = self.run_ctl(d, "exp", "show", str(eid))
        self.assertEqual(rc, 3)
        self.assertIn(f"no experiment {eid} (HTTP 404)", err)

        # usage
        rc, out, _ = self.run_ctl(d, "exp", "--help")
        self.assertEqual(rc, 0)
        self.assertIn("Usage: trainctl exp COMMAND", out)
        rc, out, _ = self.run_ctl(d, "exp", "best", "--help")
        self.assertEqual(rc, 0)
        self.assertIn("Usage: trainctl exp best ID [--download [DIR]]", out)
        rc, _, err = self.run_ctl(d, "exp", "bogus")
        self.assertEqual(rc, 3)
        self.assertIn("exp: unknown command \"bogus\"", err)
        rc, _, err = self.run_ctl(d, "exp", "show", "seven")
        self.assertEqual(rc, 3)
        self.assertIn("expected an experiment id", err)
        rc, _, err = self.run_ctl(d, "exp", "create", "-", stdin="{\"job\": ")
        self.assertEqual(rc, 3)
        self.assertIn("(stdin):1:", err)
        bad = self.experiment_file("bad", job, mode="up")
        rc, _, err = self.run_ctl(d, "exp", "create", bad)
        self.assertEqual(rc, 3)
        self.assertIn("searcher.mode", err)

        # --follow on a terminal: the table redrawn in place, then the end
        rc, out, _ = self.pty_run(d, "exp", "create", self.experiment_file("t", job), "--follow")
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"experiment \d+ t: (running|succeeded); 2 trials: ")
        self.assertIn("TRIAL", out)
        self.assertRegex(out, r"experiment \d+ succeeded\r?\n")


class CompletionAndManual(unittest.TestCase):
    def test_d_bash_completion_and_man_page(self):
        script = os.path.join(harness.SOURCE_DIR, "clients", "trainctl",
                              "trainctl.bash-completion")

        def complete(*words):
            line = " ".join(["trainctl", *words])
            cmd = (f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
                   f"_trainctl; echo \"${{COMPREPLY[*]}}\"")
            return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True,
                                  check=True).stdout.split()
        self.assertEqual(complete("su"), ["submit"])
        self.assertEqual(complete("metrics", "1", "--c"), ["--csv"])
        self.assertEqual(complete("ls", "--state", "ru"), ["running"])
        self.assertEqual(complete("ex"), ["exp"])
        self.assertEqual(complete("exp", "c"), ["create", "cancel"])
        self.assertEqual(complete("exp", "best", "1", "--d"), ["--download"])
        self.assertEqual(complete("exp", "create", "--f"), ["--follow"])
        manual = os.path.join(os.path.dirname(TRAINCTL), "trainctl.1")
        if os.path.exists(manual):  # made when help2man is installed (deploy/install-deps.sh)
            with open(manual) as f:
                text = f.read()
            self.assertIn("trainctl follow ID", text, "every command's help is in the man page")
            self.assertIn("trainctl exp best ID", text)


def main():
    global TRAINCTL
    harness.TRAIND = os.path.abspath(sys.argv[1])
    TRAINCTL = os.path.abspath(sys.argv[2])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[3])
    suite = unittest.TestSuite(TrainctlTest(name) for name in sorted(vars(TrainctlTest))
                               if name.startswith("test_"))
    suite.addTest(CompletionAndManual("test_d_bash_completion_and_man_page"))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
