#!/usr/bin/python3
"""The Python client (clients/python) against a real traind: every method, an API error raised
as an exception, and an event stream that resumes across a kill -9 and restart of the daemon
with nothing missed or repeated. The client is first installed as a user installs it (pip install ./clients/python into a fresh
virtual environment, offline) and imported from there; Client.local() finds the daemon as
trainctl does.

    /usr/bin/python3 tests/integration/python_client_test.py TRAIND_BINARY SOURCE_DIR

Daemons are started by the harness (harness.py: a fresh state directory each, killed at the
end, no surviving processes)."""
import atexit
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402  (the harness: Daemon, train_spec)

traind_client = None  # imported from the pip-installed copy in main()


class PythonClientTest(harness.DaemonTest):
    def client(self, d, token=None):
        return traind_client.Client(f"http://127.0.0.1:{d.port}", token or d.token)

    def test_a_every_method(self):
        d = self.start_daemon("--slots", "2", "--grace", "2", "--node-name", "solo")
        c = self.client(d)
        self.assertEqual(c.version()["api"], "v1")
        self.assertEqual([(n["name"], n["state"]) for n in c.nodes()], [("solo", "ready")])

        job = c.submit(harness.train_spec("lenet", epochs=1), nproc=2)
        self.assertEqual(job.data["nproc"], 2, "keyword arguments go to resources")
        events = list(job.events())
        ids = [e.id for e in events]
        self.assertEqual(ids, list(range(ids[0], ids[0] + len(ids))), "ids +1 each, no gap")
        self.assertEqual((events[-1].event, events[-1].data["state"]), ("state", "succeeded"))
        self.assertEqual(job.wait(timeout=60), "succeeded", "an ended job: wait returns at once")
        self.assertEqual(job.state, "succeeded")

        metrics = job.metrics()
        self.assertIn("done", [m["event"] for m in metrics])
        steps = [m["step"] for m in metrics if m["event"] == "train"]
        self.assertEqual(job.metrics(since=steps[0]),
                         [m for m in metrics if m["step"] > steps[0]])
        self.assertIn("[traind]", job.logs(rank=0))
        self.assertIsInstance(job.logs(rank=1), str)
        followed = list(job.logs(rank=0, follow=True))
        self.assertEqual("\n".join(followed), job.logs(rank=0).rstrip("\n"),
                         "follow of an ended job: the whole log, then the end")

        ckpts = job.checkpoints()
        last = ckpts[-1]
        out = os.path.join(self.new_state_dir(), "model.safetensors")
        job.download(last["step"], out)
        want = next(f["size"] for f in last["files"] if f["name"] == "model.safetensors")
        self.assertEqual(os.path.getsize(out), want)
        with open(out, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            self.assertEqual(f.read(1), b"{", "a safetensors header")
        self.assertLess(header_len, want)
        # a truncated download resumes with Range and ends whole and equal
        with open(out, "rb") as f:
            whole = f.read()
        with open(out, "r+b") as f:
            f.truncate(want // 3)
        job.download(last["step"], out)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), whole)

        self.assertIn(job.id, [j.id for j in c.jobs(state="succeeded")])
        self.assertEqual(c.jobs(state=["queued", "running"]), [])
        self.assertEqual(c.job(job.id).data["name"], "lenet")
        job.delete()
        with self.assertRaises(traind_client.APIError) as e:
            c.job(job.id)
        self.assertEqual((e.exception.status, e.exception.code), (404, "not_found"))

    def test_b_cancel_and_errors(self):
        d = self.start_daemon("--slots", "1", "--grace", "2")
        c = self.client(d)
        job = c.submit(harness.train_spec("long", epochs=1000, checkpoint=False))
        for ev in job.events():
            if ev.event == "state" and ev.data["state"] == "running":
                break
        self.assertEqual(job.cancel().state, "cancelled")
        self.assertEqual(job.wait(), "cancelled")

        bad = harness.train_spec("bad")
        bad["train"]["batch_size"] = 0
        with self.assertRaises(traind_client.APIError) as e:
            c.submit(bad)
        err = e.exception
        self.assertEqual((err.status, err.code, err.field), (400, "invalid_spec", "train.batch_size"))
        self.assertIn("batch_size", err.message)
        with self.assertRaises(traind_client.APIError) as e:
            self.client(d, token="0" * 64).jobs()
        self.assertEqual((e.exception.status, e.exception.code), (401, "unauthorized"))

    def test_d_local_finds_the_daemon_as_trainctl_does(self):
        """Client.local(): TRAIND_URL and TRAIND_TOKEN first, then trainctl's config file
        (url, token, token_file), then the local daemon's token file; a missing token says
        where it looked."""
        d = self.start_daemon("--slots", "1")
        url = f"http://127.0.0.1:{d.port}"
        home = self.new_state_dir()
        with _Env(TRAIND_URL=url, TRAIND_TOKEN=d.token, XDG_CONFIG_HOME=home,
                  XDG_STATE_HOME=home, HOME=home):
            self.assertEqual(traind_client.Client.local().version()["api"], "v1")
        os.makedirs(os.path.join(home, "traind"))
        token_file = os.path.join(home, "token-here")
        with open(token_file, "w") as f:
            f.write(d.token + "\n")
        with open(os.path.join(home, "traind", "client.json"), "w") as f:
            json.dump({"url": url, "token_file": token_file}, f)
        with _Env(TRAIND_URL=None, TRAIND_TOKEN=None, XDG_CONFIG_HOME=home,
                  XDG_STATE_HOME=home, HOME=home):
            c = traind_client.Client.local()
            self.assertEqual((c.port, c.version()["api"]), (d.port, "v1"))
            os.remove(os.path.join(home, "traind", "client.json"))
            with self.assertRaises(ValueError) as e:
                traind_client.Client.local(url)
            self.assertIn(os.path.join(home, "traind", "token"), str(e.exception))

    def test_c_events_resume_across_a_daemon_restart(self):
        state = self.new_state_dir()
        d1 = self.start_daemon("--slots", "1", state_dir=state)
        port = d1.port
        c = self.client(d1)
        job = c.submit(harness.train_spec("resume", epochs=3))
        stream = job.events()
        seen = []
        for ev in stream:
            seen.append(ev)
            if ev.event == "checkpoint":
                break
        d1.kill()  # the job runs on; the next daemon re-attaches to it
        # the same port, so the client's address still holds
        self.start_daemon("--slots", "1", "--listen", f"127.0.0.1:{port}", state_dir=state)
        seen.extend(stream)  # reconnects with Last-Event-ID
        ids = [e.id for e in seen]
        self.assertEqual(ids, list(range(ids[0], ids[0] + len(ids))),
                         "nothing missed or repeated across the restart")
        self.assertNotIn("restart", [e.event for e in seen], "re-attached: nothing restarted")
        self.assertEqual((seen[-1].event, seen[-1].data["state"]), ("state", "succeeded"))

    def test_e_experiments(self):
        """create_experiment, experiments, experiment; an Experiment's state, trials, best,
        wait, download_best (the best checkpoint's archive), cancel and delete."""
        import tarfile
        d = self.start_daemon("--slots", "2", "--grace", "1")
        c = self.client(d)

        def body(name, command):
            return {"name": name, "job": {"name": "c", "command": ["/bin/sh", "-c", command]},
                    "space": {"env.N": {"grid": ["1", "2"]}},
                    "searcher": {"type": "grid", "metric": "score", "mode": "max"}}
        # each trial registers a checkpoint holding its N, then says its score: N
        exp = c.create_experiment(body("grid", (
            'mkdir -p ck && echo "$N" > ck/n.txt && '
            'echo "{\\"event\\": \\"checkpoint\\", \\"step\\": 1, \\"path\\": \\"ck\\"}" && '
            'echo "{\\"event\\": \\"train\\", \\"step\\": 1, \\"score\\": $N}"')))
        self.assertEqual(exp.state, "running")
        self.assertEqual([t["hparams"] for t in exp.trials], [{"env.N": "1"}, {"env.N": "2"}])
        self.assertEqual(exp.wait(timeout=120, poll_s=0.2), "succeeded")
        self.assertEqual([t["best"]["value"] for t in exp.trials], [1, 2])
        best = exp.best
        self.assertEqual((best["trial"], best["value"], best["hparams"]), (1, 2, {"env.N": "2"}))
        self.assertEqual(c.job(best["job"]).data["trial"], 1)
        path = exp.download_best(os.path.join(self.new_state_dir(), "new"))
        self.assertEqual(os.path.basename(path), f"exp-{exp.id}-best-step-1.tar")
        with tarfile.open(path) as t:
            (member,) = [m for m in t.getnames() if m.endswith("n.txt")]
            self.assertEqual(t.extractfile(member).read(), b"2\n")

        listed = c.experiments()
        self.assertEqual([e.id for e in listed], [exp.id])
        self.assertEqual(listed[0].state, "succeeded")
        self.assertEqual(listed[0].best["hparams"], {"env.N": "2"}, "a summary reads the rest")
        self.assertEqual(c.experiment(exp.id).trials, exp.trials)
        with self.assertRaises(traind_client.APIError) as e:
            exp.cancel()
        self.assertEqual((e.exception.status, e.exception.code), (409, "conflict"))

        # a running experiment: delete is refused, cancel stops its trials; no best, no download
        slow = c.create_experiment(body("slow", "exec sleep 1000"))
        while slow.refresh().data["counts"]["running"] < 2:
            time.sleep(0.1)
        with self.assertRaises(TimeoutError):
            slow.wait(timeout=0)
        with self.assertRaises(traind_client.APIError) as e:
            slow.delete()
        self.assertEqual((e.exception.status, e.exception.code), (409, "conflict"))
        self.assertEqual(slow.pause().state, "paused")
        while slow.refresh().data["counts"]["paused"] < 2:
            time.sleep(0.1)
        with self.assertRaises(TimeoutError):
            slow.wait(timeout=0)  # a paused experiment has not ended
        self.assertEqual(slow.resume().state, "running")
        while slow.refresh().data["counts"]["running"] < 2:
            time.sleep(0.1)
        self.assertEqual(slow.cancel().state, "running", "until its trials have ended")
        self.assertEqual(slow.wait(timeout=60, poll_s=0.2), "cancelled")
        self.assertIsNone(slow.best)
        with self.assertRaises(LookupError):
            slow.download_best(self.new_state_dir())
        for x in (exp, slow):
            x.delete()
        with self.assertRaises(traind_client.APIError) as e:
            c.experiment(exp.id)
        self.assertEqual((e.exception.status, e.exception.code), (404, "not_found"))
        self.assertEqual(c.experiments(), [])


class _Env:
    """os.environ with some variables set (None: removed) while it is open."""
    def __init__(self, **values):
        self.values, self.saved = values, {}

    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main():
    global traind_client
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    target = tempfile.mkdtemp(prefix="traind-client-")
    atexit.register(shutil.rmtree, target, True)
    # built from a copy: setuptools builds in the directory it is given (build/, egg-info) and
    # would reuse what an earlier build left there
    src = os.path.join(target, "src")
    shutil.copytree(os.path.join(harness.SOURCE_DIR, "clients", "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info"))
    # as a user installs it: `pip install ./clients/python` into a fresh virtual environment,
    # offline (--no-index: nothing may be fetched; the build backend is in the tree)
    venv = os.path.join(target, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--quiet", "--no-index", src],
                   check=True, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1",
                                        PIP_ROOT_USER_ACTION="ignore"))
    lib = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                          "import os, traind_client; "
                          "print(os.path.dirname(os.path.dirname(traind_client.__file__)))"],
                         check=True, capture_output=True, text=True).stdout.strip()
    sys.path.insert(0, lib)
    import traind_client as tc
    traind_client = tc
    if not tc.__file__.startswith(lib):
        raise SystemExit(f"imported {tc.__file__}, not the installed copy in {lib}")
    suite = unittest.TestSuite(PythonClientTest(name) for name in sorted(vars(PythonClientTest))
                               if name.startswith("test_"))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
