#!/usr/bin/python3
"""traind as systemd and an operator see it, against a real daemon:

- Type=notify over a real notify socket (an AF_UNIX datagram socket, as systemd's): READY=1 comes
  from the daemon's own PID once the port answers, never from a daemon that could not listen;
  the watchdog pings (WATCHDOG=1) keep coming while the supervisor loop turns and stop when a
  fault hook hangs it.
- The config file: every option through it, shown by --print-config with where it came from;
  an unknown key fails naming the key and the file.
- Reload (SIGHUP): data roots, the body limit and logging change at once (RELOADING=1, then
  READY=1); a change that needs a restart is reported and not applied; a broken file changes
  nothing.
- --log-format json: every line an object with time, level, msg, and the job's id on job lines.

    /usr/bin/python3 tests/integration/operations_test.py TRAIND SOURCE_DIR [-k name]"""
import io
import json
import os
import re
import select
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tarfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import tls_test  # noqa: E402
import tfevents  # noqa: E402

WATCHDOG_S = 1.0  # WATCHDOG_USEC given to the daemon (it pings every half of it)


class NotifySocket:
    """What systemd listens on for sd_notify: datagrams of "KEY=value" lines, with the sender's
    credentials (SO_PASSCRED), so a message can be traced to the process that sent it."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

    def close(self):
        self.sock.close()

    def receive(self, timeout):
        """(sender pid, {key: value}) of the next datagram, or None after timeout seconds."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        pid = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("iII", payload[:12])[0]
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        return pid, fields

    def until(self, key, timeout=harness.TIMEOUT):
        """Messages up to and including the first that has key; AssertionError on timeout."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            got = self.receive(max(left, 0)) if left > 0 else None
            if got is None:
                raise AssertionError(f"no {key} within {timeout} s; got {seen}")
            seen.append(got)
            if key in got[1]:
                return seen

    def drain(self):
        while self.receive(0) is not None:
            pass


class OperationsTest(harness.DaemonTest):
    def notify_socket(self):
        path = os.path.join(self.new_state_dir(), "notify")
        n = NotifySocket(path)
        self.addCleanup(n.close)
        return n

    def run_traind(self, *args):
        """(exit status, stderr, stdout) of a traind that is expected to exit by itself."""
        p = subprocess.run([harness.TRAIND, *args], capture_output=True, text=True,
                           timeout=harness.TIMEOUT, stdin=subprocess.DEVNULL)
        return p.returncode, p.stderr, p.stdout

    def wait_log(self, d, pattern, what, drain=None):
        """The first line of d's stderr that matches; drain: a NotifySocket read meanwhile."""
        rx = re.compile(pattern)

        def find():
            if drain is not None:
                drain.drain()
            return next((ln for ln in d.stderr_tail(100000).splitlines() if rx.search(ln)),
                        None)
        try:
            return harness.wait_for(find, what)
        except AssertionError as e:
            raise AssertionError(f"{e}; the daemon's stderr:\n{d.stderr_tail()}") from None

    # -- Type=notify

    def test_ready_comes_once_the_port_answers(self):
        n = self.notify_socket()
        d = self.start_daemon(env={"NOTIFY_SOCKET": n.path})
        messages = n.until("READY")
        pid, ready = messages[-1]
        self.assertEqual(ready["READY"], "1")
        self.assertEqual(pid, d.pid, "READY=1 comes from the daemon itself (NotifyAccess=main)")
        self.assertEqual(ready.get("MAINPID"), str(d.pid))
        self.assertIn(f":{d.port}", ready.get("STATUS", ""), "STATUS names the port it serves")
        # at READY the API answers, the database included
        self.assertEqual(d.request("GET", "/v1/health")[0], 200)
        self.assertEqual(d.request("GET", "/v1/jobs")[0], 200)
        # the job's processes never see the socket: they cannot speak for the service
        status, _, job = d.json("POST", "/v1/jobs", {
            "name": "env", "command": ["/bin/sh", "-c", "echo \"NS=${NOTIFY_SOCKET:-none}\""]})
        self.assertEqual(status, 201, job)
        self.assertEqual(d.follow(job["id"])[-1].data["state"], "succeeded")
        self.assertIn("NS=none", d.logs(job["id"])[1])
        self.assertIsNone(n.receive(0.2), "nothing but READY from a daemon without a watchdog")

    def test_no_ready_when_the_port_is_taken(self):
        n = self.notify_socket()
        first = self.start_daemon()
        n.drain()
        code, err, _ = self.run_traind_env(
            {"NOTIFY_SOCKET": n.path}, "--listen", f"127.0.0.1:{first.port}",
            "--state-dir", self.new_state_dir())
        self.assertEqual(code, 1, err)
        self.assertIn("in use", err)
        got = n.receive(0.5)
        self.assertFalse(got and "READY" in got[1], f"a daemon that cannot serve said {got}")

    def run_traind_env(self, env, *args):
        p = subprocess.run([harness.TRAIND, *args], capture_output=True, text=True,
                           timeout=harness.TIMEOUT, stdin=subprocess.DEVNULL,
                           env=dict(os.environ, **env))
        return p.returncode, p.stderr, p.stdout

    # -- the watchdog

    def test_watchdog_pings_stop_when_the_supervisor_hangs(self):
        n = self.notify_socket()
        env = {"NOTIFY_SOCKET": n.path, "WATCHDOG_USEC": str(int(WATCHDOG_S * 1e6))}
        d = self.start_daemon(env=env)
        n.until("READY")
        # pings at least every half interval, as sd_watchdog_enabled(3) asks
        stamps = []
        while len(stamps) < 6:
            got = n.receive(WATCHDOG_S)
            self.assertIsNotNone(got, f"no ping within {WATCHDOG_S} s (after {len(stamps)})")
            self.assertEqual(got[0], d.pid)
            if got[1].get("WATCHDOG") == "1":
                stamps.append(time.monotonic())
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        self.assertLess(max(gaps), WATCHDOG_S, f"gaps between pings: {gaps}")

        # the same with the supervisor loop hung at its 20th turn (a fault hook); the first
        # daemon goes, as its pings would fill the socket's queue while nobody reads it (a
        # full queue blocks sd_notify: systemd always reads)
        self._stop_daemon(d)
        hung = self.start_daemon(env=dict(env, TRAIND_FAULT="supervisor:20"))
        n.until("READY")
        self.wait_log(hung, r"supervisor: this thread hangs here", "the supervisor to hang",
                      drain=n)
        n.drain()  # a ping sent just before the hang
        deadline = time.monotonic() + 3 * WATCHDOG_S
        while time.monotonic() < deadline:
            got = n.receive(deadline - time.monotonic())
            if got is not None and got[0] == hung.pid:
                self.assertNotIn("WATCHDOG", got[1], "a hung supervisor still pings")
        self.assertIsNone(hung.proc.poll(), "the daemon is alive: only the watchdog can tell")
        hung.kill()  # as systemd does once the watchdog fires (SIGABRT): it cannot stop itself

    # -- the config file

    def every_option(self, state):
        secret = os.path.join(state, "secret")
        with open(secret, "w") as f:
            f.write("0123456789abcdef0123456789abcdef\n")
        os.chmod(secret, 0o600)
        roots = [os.path.join(state, "data-a"), os.path.join(state, "data-b")]
        ca = tls_test.make_ca(state, "cfg")
        cert, key = tls_test.make_cert(state, "cfg", "node")
        for r in roots:
            os.makedirs(r)
        return {
            "listen": "127.0.0.1:0",
            "state_dir": state,
            "slots": 3,
            "gpus": [0, 1],
            "data_roots": roots,
            "grace_s": 2.5,
            "max_body_bytes": 5000,
            "worker": os.path.join(os.path.dirname(harness.TRAIND), "traind-worker"),
            "web_root": os.path.join(harness.SOURCE_DIR, "web"),
            "log_format": "text",
            "log_level": "debug",
            "cluster_secret_file": secret,
            "join": "",
            "node_name": "from-the-file",
            "advertise": "127.0.0.1",
            "heartbeat_s": 1.5,
            "node_timeout_s": 7,
            "tls_cert": cert,
            "tls_key": key,
            "tls_ca": ca,
            "keep_jobs_on_stop": True,
            "orphan_timeout_s": 42,
            "shepherd": os.path.join(os.path.dirname(harness.TRAIND), "traind-shepherd"),
            "metrics_listen": "127.0.0.1:0",
            "run_as": "nobody",
            "command_jobs": ["/bin/true", "/usr/bin/python3"],
            "rate_limit_per_s": 50.5,
            "max_streams_per_token": 3,
            "max_queued_per_token": 7,
            "audit_log": os.path.join(state, "audit.jsonl"),
            "keep_finished_for_s": 86400.5,
            "keep_finished_jobs": 12,
            "max_connections": 2000,
            "job_uids": "2000000000-2000001000",
            "job_groups": "daemon",
            "job_memory_gb": 2.5,
            "max_job_memory_gb": 8.0,
            "job_pids": 1000,
            "max_job_pids": 2000,
            "job_disk_gb": 5.5,
            "max_job_disk_gb": 50.0,
            "max_checkpoint_files": 500,
            "max_log_bytes": 5000000,
            "max_events_per_s": 50.5,
            "max_connections_per_ip": 64,
            "connection_timeout_s": 12.5,
            "max_sessions_per_token": 4,
            "max_job_bytes_per_token": 1000000,
            "insecure_cluster": True,
        }

    def test_every_option_through_the_file(self):
        state = self.new_state_dir()
        settings = self.every_option(state)
        config = os.path.join(state, "traind.json")
        with open(config, "w") as f:
            json.dump(settings, f)
        code, err, out = self.run_traind("--config", config, "--print-config", "--slots", "4")
        self.assertEqual(code, 0, err)
        shown = {}
        for line in out.splitlines():
            if line.startswith("#"):
                continue
            key, rest = line.split(None, 1)
            value, source = rest.split(" # ", 1)
            shown[key] = (json.loads(value), source.strip())
        self.assertEqual(set(shown), set(settings), "every option has a key, and only those")
        for key, want in settings.items():
            got, source = shown[key]
            if key == "slots":
                self.assertEqual((got, source), (4, "command line --slots"),
                                 "the command line wins")
                continue
            self.assertEqual(source, config, key)
            if isinstance(want, float):
                self.assertAlmostEqual(got, want, msg=key)
            else:
                self.assertEqual(got, want, key)
        # and a daemon started from it runs with them
        d = self.start_daemon("--config", config, state_dir=state,
                              ssl_context=ssl.create_default_context(cafile=settings["tls_ca"]))
        self.wait_log(d, "agents join with --join", "the cluster secret from the file")
        self.wait_log(d, "listening on https://", "HTTPS from tls_cert and tls_key")
        line = self.wait_log(d, r"metrics \(GET /metrics, no token\) on https://127\.0\.0\.1:\d+",
                             "the metrics listener from the file, HTTPS as the API")
        mport = int(re.search(r"https://127\.0\.0\.1:(\d+)", line).group(1))
        scrape = subprocess.run(["curl", "-sS", "--max-time", "30", "--cacert", settings["tls_ca"],
                                 f"https://127.0.0.1:{mport}/metrics"],
                                capture_output=True, text=True, timeout=60)
        self.assertIn("traind_", scrape.stdout, scrape.stderr)
        plain = subprocess.run(["curl", "-sS", "--max-time", "30",
                                f"http://127.0.0.1:{mport}/metrics"],
                               capture_output=True, text=True, timeout=60)
        self.assertIn("https_required", plain.stdout, "a scraper set to http:// is told why")
        node = d.get_ok("/v1/nodes")["nodes"][0]
        self.assertEqual(node["name"], "from-the-file")
        self.assertEqual([g["index"] for g in node["gpus"]], [0, 1])
        big = {"name": "x" * 6000, "command": ["true"]}
        self.assertEqual(d.json("POST", "/v1/jobs", big)[0], 413, "max_body_bytes from the file")
        self.assertEqual(d.json("POST", "/v1/jobs", {"command": ["/bin/sleep", "1"]})[0], 403,
                         "command_jobs from the file")
        self.assertTrue(os.path.exists(settings["audit_log"]), "audit_log from the file")

    def test_unknown_key_and_bad_values_name_the_file(self):
        state = self.new_state_dir()
        config = os.path.join(state, "traind.json")
        for body, words in (('{"listen": "127.0.0.1:0", "tls_sert": "x"}', "tls_sert"),
                            ('{"log_format": "xml"}', "log_format"),
                            ('{"log_level": 3}', "log_level"),
                            ('{"keep_jobs_on_stop": "yes"}', "keep_jobs_on_stop"),
                            ('{"orphan_timeout_s": 0}', "orphan_timeout_s"),
                            ('{"listen": ""}', "listen"),
                            ('{"data_roots": [""]}', "data_roots[0]"),
                            ('{"command_jobs": "some"}', "command_jobs"),
                            ('{"command_jobs": ["python3"]}', "absolute path"),
                            ('{"command_jobs": ["/no/such/program"]}', "command_jobs[0]"),
                            ('{"rate_limit_per_s": -1}', "rate_limit_per_s"),
                            ('{"max_queued_per_token": "many"}', "max_queued_per_token"),
                            ('[1, 2]', "JSON object"),
                            ('{"slots": 2\n,,}', ":2:")):
            with open(config, "w") as f:
                f.write(body)
            code, err, _ = self.run_traind("--config", config, "--print-config")
            self.assertEqual(code, 2, f"{body}: {err}")
            self.assertIn(config, err, f"{body}: names the file")
            self.assertIn(words, err, f"{body}: names the key")
        # an empty list is what it says: the state directory alone, not the default root
        with open(config, "w") as f:
            f.write('{"data_roots": []}')
        code, err, out = self.run_traind("--config", config, "--print-config")
        self.assertEqual(code, 0, err)
        self.assertRegex(out, rf"(?m)^data_roots +\[\] +# {re.escape(config)}$")
        code, err, _ = self.run_traind("--config", os.path.join(state, "missing.json"))
        self.assertEqual(code, 2)
        self.assertIn("missing.json", err)
        code, err, _ = self.run_traind("--log-level", "loud")
        self.assertEqual(code, 2)
        self.assertIn("--log-level", err)

    # -- reload

    def test_sighup_reload(self):
        state = self.new_state_dir()
        config = os.path.join(state, "traind.json")
        a, b = self.new_state_dir(), self.new_state_dir()  # outside the state directory
        images, labels = os.path.join(b, "images"), os.path.join(b, "labels")
        harness.write_idx(images, labels)
        os.chmod(b, 0o755)  # a root daemon's jobs run as run_as, which must read the data
        settings = {"data_roots": [a], "max_body_bytes": 100000}
        with open(config, "w") as f:
            json.dump(settings, f)
        n = self.notify_socket()
        d = self.start_daemon("--config", config, state_dir=state,
                              env={"NOTIFY_SOCKET": n.path})
        n.until("READY")
        spec = {"name": "from-b", "model": {"preset": "lenet5", "num_classes": 10},
                "data": {"format": "idx", "train": {"images": images, "labels": labels}},
                "train": {"epochs": 1, "batch_size": 32, "threads": 1,
                          "optimizer": {"type": "sgd", "lr": 0.01}}}
        status, _, body = d.json("POST", "/v1/jobs", spec)
        self.assertEqual(status, 400, "b is not a data root yet")
        self.assertEqual(body["error"]["field"], "data.train.images")

        settings.update(data_roots=[a, b], max_body_bytes=2000, node_name="renamed",
                        log_level="warning")
        with open(config, "w") as f:
            json.dump(settings, f)
        os.kill(d.pid, signal.SIGHUP)
        reloading = n.until("READY")
        self.assertTrue(any(m[1].get("RELOADING") == "1" for m in reloading), reloading)
        self.wait_log(d, r"reloaded .*: 3 changes applied, 1 waiting", "the reload's summary")
        log = d.stderr_tail(100000)
        self.assertIn(f'reload: data_roots is now ["{a}","{b}"] (was ["{a}"])', log)
        self.assertRegex(log, r"reload: node_name changed to \"renamed\", which needs a restart")
        status, _, job = d.json("POST", "/v1/jobs", spec)
        self.assertEqual(status, 201, job)
        self.assertEqual(d.json("POST", "/v1/jobs", {"name": "y" * 3000,
                                                     "command": ["true"]})[0], 413)
        self.assertEqual(d.follow(job["id"])[-1].data["state"], "succeeded")
        self.assertNotRegex(d.stderr_tail(100000), rf"job {job['id']} attempt \d+ started",
                            "log_level warning: info lines are gone")
        self.assertEqual(d.request("GET", "/v1/health")[0], 200, "still on the same port")

        with open(config, "w") as f:
            f.write('{"data_roots": [')
        os.kill(d.pid, signal.SIGHUP)
        n.until("READY")
        self.wait_log(d, r"reload failed, the configuration is unchanged: .*traind.json",
                      "the failed reload's message")
        self.assertEqual(d.json("POST", "/v1/jobs", dict(spec, name="again"))[0], 201,
                         "the roots stayed")

    # -- TensorBoard

    def tensorboard_scalars(self, d, job_id):
        """{tag: [(step, value)]} from GET /v1/jobs/{id}/tensorboard, unpacked and decoded."""
        status, headers, body = d.request("GET", f"/v1/jobs/{job_id}/tensorboard")
        self.assertEqual(status, 200, body[:300])
        self.assertEqual(headers["content-type"], "application/x-tar")
        out = self.new_state_dir()
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            names = tar.getnames()
            self.assertTrue(names and all(n.startswith(f"job-{job_id}-tensorboard/")
                                          for n in names), names)
            self.assertTrue(any("events.out.tfevents." in n for n in names), names)
            tar.extractall(out)
        logdir = os.path.join(out, f"job-{job_id}-tensorboard")
        events = [e for f in sorted(os.listdir(logdir))
                  for e in tfevents.read_events(os.path.join(logdir, f))]
        self.assertEqual(events[0]["file_version"], "brain.Event:2", "the version record first")
        return tfevents.read_scalars(logdir)

    def expected_scalars(self, metrics):
        want = {}
        for m in metrics:
            if m["event"] == "done":
                continue
            for k, v in m.items():
                if k not in ("event", "step", "epoch") and isinstance(v, (int, float)) \
                        and not isinstance(v, bool):
                    want.setdefault(k, []).append((m["step"], struct.unpack(
                        "f", struct.pack("f", v))[0]))
        return want

    def test_tensorboard_event_files_match_the_metrics(self):
        d = self.start_daemon()
        job, _ = d.submit(harness.train_spec("tb", epochs=1, checkpoint=False))
        self.assertEqual(d.follow(job["id"])[-1].data["state"], "succeeded")
        metrics = d.metrics(job["id"])
        got = self.tensorboard_scalars(d, job["id"])
        want = self.expected_scalars(metrics)
        self.assertTrue({"loss", "lr", "samples_per_s"} <= set(want), want.keys())
        self.assertEqual(got, want)
        self.assertEqual([s for s, _ in got["loss"]], harness.expected_log_steps(32))

        # a command's own lines: eval's val_loss and val_acc, any number it prints
        code = ("import json\n"
                "for s in (1, 2, 3):\n"
                "    print(json.dumps({'event': 'train', 'step': s, 'loss': 1.0 / s}))\n"
                "print(json.dumps({'event': 'eval', 'step': 3, 'val_loss': 0.25, "
                "'val_acc': 0.875}))\n"
                "print(json.dumps({'event': 'done', 'step': 3, 'loss': 0.3}))\n")
        status, _, cmd = d.json("POST", "/v1/jobs", {
            "name": "tb-cmd", "command": ["/usr/bin/python3", "-c", code]})
        self.assertEqual(status, 201, cmd)
        self.assertEqual(d.follow(cmd["id"])[-1].data["state"], "succeeded")
        got = self.tensorboard_scalars(d, cmd["id"])
        self.assertEqual(got, self.expected_scalars(d.metrics(cmd["id"])))
        self.assertEqual(got["val_acc"], [(3, 0.875)])
        self.assertEqual(len(got["loss"]), 3, "done is a summary, not a point")

        # a job without a metric yet has no event files; an unknown job is a 404 too
        status, _, quiet = d.json("POST", "/v1/jobs", {"name": "quiet", "command": ["true"]})
        self.assertEqual(d.follow(quiet["id"])[-1].data["state"], "succeeded")
        status, _, err = d.json("GET", f"/v1/jobs/{quiet['id']}/tensorboard")
        self.assertEqual(status, 404)
        self.assertIn("no TensorBoard events", err["error"]["message"])
        self.assertEqual(d.json("GET", "/v1/jobs/9999/tensorboard")[0], 404)

    # -- JSON logs

    def test_log_format_json(self):
        d = self.start_daemon("--log-format", "json")
        status, _, job = d.json("POST", "/v1/jobs", {"name": "j", "command": ["true"]})
        self.assertEqual(status, 201)
        self.assertEqual(d.follow(job["id"])[-1].data["state"], "succeeded")
        self.wait_log(d, rf'"job":{job["id"]},.*succeeded', "the job's last line")
        lines = d.stderr_tail(100000).splitlines()
        started = None
        for line in lines:
            o = json.loads(line)  # every line is one object
            self.assertRegex(o["time"], harness.ISO_RE)
            self.assertIn(o["level"], ("error", "warning", "notice", "info", "debug"))
            self.assertIsInstance(o["msg"], str)
            if re.match(rf"job {job['id']} attempt \d+ started", o["msg"]):
                started = o
        self.assertIsNotNone(started, lines)
        self.assertEqual(started["job"], job["id"])
        self.assertEqual(started["level"], "info")


def main():
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    # OperationsTest's own tests (harness.DaemonTest has none, tls_test's classes are not run)
    names = sorted(k for k in vars(OperationsTest) if k.startswith("test_"))
    if "-k" in sys.argv:
        names = [k for k in names if sys.argv[sys.argv.index("-k") + 1] in k]
    suite = unittest.TestSuite(OperationsTest(k) for k in names)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
