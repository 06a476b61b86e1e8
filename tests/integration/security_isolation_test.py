#!/usr/bin/python3
"""Isolation of jobs against a real traind (issue 42: findings 3, 5, 11, 12 and the data probes
of 14). Black-box attacks by users holding submit-scope tokens; each test asserts that the
attack fails and that legitimate use still works.

- identity: every job runs under a uid/gid of its own from `job_uids` (default
  1879048192-1879113727), never root nor the daemon's; the job's "identity" says which.
- one job against another: /proc/PID/environ, SIGSTOP, the other's files and registered
  checkpoint (read, overwrite) all fail; the victim runs on and its checkpoint is served intact.
- a job against the daemon: its token (`cat ../../token`), state.db, audit log and the cluster
  secret are unreadable, and the job holds no capability, under a root daemon (the packaged
  setup). A daemon run as a plain uid, even one given capabilities, cannot give jobs
  identities of their own (td_identity.h says why it must be root): it says at start that its
  jobs are not isolated, and its jobs hold none of its capabilities.
- escapes: a `setsid` child, a daemon(3)-style double fork, and a setsid child of a cancelled
  job never outlive their job, and the job is not reported ended while they run.
- disk: a job over its `resources.disk_gb` fails with "disk quota exceeded" while another
  user's job beside it succeeds and the daemon goes on storing jobs (state on a small tmpfs,
  which the job alone would fill).
- data probes: a CSV `data.train.path` naming a root-only file in the state directory (a data
  root) is a 400 invalid_data saying permission, and the file's content is never echoed.

Needs root (dynamic uids, a tmpfs, setpriv); skipped otherwise.

    /usr/bin/python3 tests/integration/security_isolation_test.py TRAIND SOURCE_DIR [TEST...]"""
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from harness import wait_for  # noqa: E402

JOB_UIDS = range(1879048192, 1879113727 + 1)  # job_uids' default (design-42: Identity of jobs)
# A daemon that is not root but may switch users, as a unit with User= and
# AmbientCapabilities= starts it (issue 42's list, plus what removing a job's files takes).
DAEMON_UID = 61234  # no such user needed: the numbers are what counts
DAEMON_CAPS = ("setuid", "setgid", "chown", "kill", "dac_read_search", "fowner", "dac_override")
RESULT_RE = re.compile(r"^RESULT (\{.*\})\s*$", re.M)
PY = "/usr/bin/python3"
STREAM_S = 45  # the longest a test follows one job


def result_of(log):
    """The JSON a job printed on its `RESULT {...}` line (the last one)."""
    found = RESULT_RE.findall(log)
    if not found:
        raise AssertionError(f"the job printed no RESULT line; its log:\n{log[-3000:]}")
    return json.loads(found[-1])


def marked(marker):
    """Pids of the live (non-zombie) processes whose command line holds marker."""
    out = []
    for pid in harness.all_pids():
        if pid == os.getpid():
            continue
        if any(marker in a for a in harness.cmdline(pid)) and harness.lingering(pid):
            out.append(pid)
    return out


class CapabilityDaemon(harness.Daemon):
    """traind run as DAEMON_UID with DAEMON_CAPS (ambient, so they survive its exec), through
    setpriv: what the packaged setup looks like when traind is not root."""

    def __init__(self, state_dir, args, wrapper):
        super().__init__(state_dir, args)
        self.wrapper = wrapper

    def start(self, token=None):
        real = harness.TRAIND
        harness.TRAIND = self.wrapper  # Daemon.start reads the module's TRAIND
        try:
            return super().start(token)
        finally:
            harness.TRAIND = real


@unittest.skipUnless(os.geteuid() == 0, "jobs under identities of their own need a root daemon")
class SecurityIsolationTest(harness.DaemonTest):
    # -- helpers

    def make_token(self, d, name, scope="submit"):
        status, _, obj = d.json("POST", "/v1/tokens", {"name": name, "scope": scope})
        self.assertEqual(status, 201, obj)
        return obj["token"]

    def submit_as(self, d, token, spec):
        status, _, job = d.json("POST", "/v1/jobs", spec, token=token)
        self.assertEqual(status, 201, f"{spec.get('name')}: {job}")
        return job

    def follow(self, d, jid, within=STREAM_S):
        """Every event of the job until its stream closes, failing after `within` seconds (a
        job that never ends fails its test in time, not after the harness's 180 s)."""
        with self.stream(d, jid, within) as s:
            return s.rest()

    def stream(self, d, jid, within=STREAM_S):
        return harness.EventStream(d, f"/v1/jobs/{jid}/events", {}, deadline=within)

    def run_to_end(self, d, jid, state="succeeded"):
        return self.assert_final(d, jid, self.follow(d, jid), state)

    def kill_marked_at_cleanup(self, marker):
        """Whatever the test's jobs left running under `marker` is killed at the end, before the
        daemon stops (cleanups run last first), also when the test failed."""
        def kill():
            for pid in marked(marker):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.addCleanup(kill)

    def temp_dir(self, mode=0o755):
        path = os.path.realpath(tempfile.mkdtemp(prefix="traind-isolation-"))
        os.chmod(path, mode)
        self.addCleanup(shutil.rmtree, path, True)
        return path

    def small_state_dir(self, mib):
        """A state directory on a tmpfs of its own (as diskfull_test.py), unmounted at the end."""
        path = os.path.realpath(tempfile.mkdtemp(prefix="traind-isolation-disk-"))
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0755", "tmpfs", path],
                       check=True)

        def unmount():  # registered before the daemon's cleanup, so it runs after it
            subprocess.run(["umount", "-l", path], check=False)
            os.rmdir(path)

        self.addCleanup(unmount)
        return path

    # -- finding 5: identities

    def test_jobs_run_under_identities_of_their_own(self):
        """Two jobs of two tokens: two uids from job_uids, neither root nor the daemon's, uid ==
        gid, no other groups, and the job JSON's identity is what the process sees."""
        d = self.start_daemon("--slots", "2")
        daemon_uid = os.stat(f"/proc/{d.pid}").st_uid
        code = ("import json, os\n"
                "print('RESULT ' + json.dumps({'uid': os.getuid(), 'euid': os.geteuid(),\n"
                "      'gid': os.getgid(), 'egid': os.getegid(), 'groups': os.getgroups(),\n"
                "      'user': os.environ.get('USER'), 'logname': os.environ.get('LOGNAME'),\n"
                "      'home': os.environ.get('HOME'), 'cwd': os.getcwd()}), flush=True)\n")
        jobs = {}
        for name in ("alice", "bob"):
            token = self.make_token(d, name)
            jobs[name] = self.submit_as(d, token, {"name": f"who-{name}",
                                                   "command": [PY, "-c", code]})
        seen = {}
        for name, job in jobs.items():
            self.run_to_end(d, job["id"])
            seen[name] = result_of(d.logs(job["id"])[1])
        uids = {name: r["uid"] for name, r in seen.items()}
        self.assertNotEqual(uids["alice"], uids["bob"],
                            f"two users' jobs share one uid: {seen}")
        for name, r in seen.items():
            jid = jobs[name]["id"]
            self.assertEqual((r["euid"], r["egid"]), (r["uid"], r["gid"]), r)
            self.assertNotIn(r["uid"], (0, daemon_uid), f"job {jid} runs as root or the daemon")
            self.assertIn(r["uid"], JOB_UIDS, f"job {jid}'s uid {r['uid']} is not from job_uids")
            self.assertEqual(r["gid"], r["uid"], f"job {jid}: gid is not its uid: {r}")
            self.assertLessEqual(set(r["groups"]), {r["gid"]},
                                 f"job {jid} has supplementary groups: {r}")
            job = d.job(jid)
            user = f"traind-job-{jid}"
            self.assertEqual(job.get("identity"), {"uid": r["uid"], "gid": r["gid"], "user": user},
                             f"job {jid}'s identity against what its process saw: {r}")
            self.assertEqual((r["user"], r["logname"]), (user, user), r)
            self.assertEqual(r["home"], os.path.join(d.state_dir, "jobs", str(jid), "work"), r)

    # -- finding 5: one job against another

    def test_job_cannot_reach_another_job(self):
        """The victim (alice's) keeps a secret in its environment and a file, registers a
        checkpoint and sleeps; the attacker (bob's) reads its /proc/PID/environ, sends it
        SIGSTOP, reads its work file, reads and overwrites its checkpoint: all refused. The
        victim runs on, its checkpoint is served unchanged, and alice can still cancel it."""
        d = self.start_daemon("--slots", "2", "--grace", "2")
        alice = self.make_token(d, "alice")
        bob = self.make_token(d, "bob")
        marker = "victim-" + secrets.token_hex(8)
        secret = "s3cret-" + secrets.token_hex(16)
        weights = ("weights-" + secrets.token_hex(16)).encode()
        self.kill_marked_at_cleanup(marker)
        victim_code = (
            "import json, os, sys, time\n"
            "cwd = os.getcwd()\n"
            "job_dir = os.path.dirname(cwd) if os.path.basename(cwd) == 'work' else cwd\n"
            "ck = os.path.join(job_dir, 'checkpoints', 'ck1')\n"
            "os.makedirs(ck, exist_ok=True)\n"
            "with open(os.path.join(ck, 'weights.bin'), 'wb') as f:\n"
            "    f.write(sys.argv[2].encode())\n"
            "with open('private.txt', 'w') as f:\n"
            "    f.write(os.environ['VICTIM_SECRET'])\n"
            "print(json.dumps({'event': 'checkpoint', 'step': 1, 'path': ck}), flush=True)\n"
            "print('RESULT ' + json.dumps({'private': os.path.abspath('private.txt'),\n"
            "      'weights': os.path.join(ck, 'weights.bin')}), flush=True)\n"
            "while True:\n"
            "    time.sleep(3600)\n")
        victim = self.submit_as(d, alice, {
            "name": "victim", "command": [PY, "-c", victim_code, marker, weights.decode()],
            "env": {"VICTIM_SECRET": secret}})
        vid = victim["id"]
        with self.stream(d, vid) as s:
            s.until(lambda e: e.event == "checkpoint" or
                    (e.event == "state" and e.data.get("state") in harness.FINAL_STATES),
                    "the victim's checkpoint")
        self.assertEqual(d.job(vid)["state"], "running", "the victim runs")
        paths = result_of(d.logs(vid)[1])
        vpids = marked(marker)
        self.assertEqual(len(vpids), 1, f"the victim's process: {vpids}")
        vpid = vpids[0]

        def resume():  # a stopped victim would hold up its cancel and the daemon's stop
            try:
                os.kill(vpid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.addCleanup(resume)
        ckpt_url = f"/v1/jobs/{vid}/checkpoints/1/weights.bin"
        status, _, body = d.request("GET", ckpt_url, token=alice)
        self.assertEqual((status, body), (200, weights), "the victim's checkpoint, as written")

        attacker_code = (
            "import json, os, signal, sys\n"
            "pid, weights, private = int(sys.argv[1]), sys.argv[2], sys.argv[3]\n"
            "res = {}\n"
            "def attempt(name, f):\n"
            "    try:\n"
            "        got = f()\n"
            "        res[name] = 'ok'\n"
            "        print(name, 'got:', got, flush=True)\n"
            "    except Exception as e:\n"
            "        res[name] = type(e).__name__\n"
            "attempt('environ', lambda: open(f'/proc/{pid}/environ', 'rb').read()\n"
            "        .replace(b'\\0', b' ').decode(errors='replace'))\n"
            "attempt('sigstop', lambda: os.kill(pid, signal.SIGSTOP))\n"
            "attempt('read_work_file', lambda: open(private).read())\n"
            "attempt('read_checkpoint', lambda: open(weights, 'rb').read())\n"
            "def overwrite():\n"
            "    with open(weights, 'r+b') as f:\n"
            "        f.write(b'EVIL')\n"
            "attempt('overwrite_checkpoint', overwrite)\n"
            "with open('mine.txt', 'w') as f:\n"
            "    f.write('own work')\n"
            "res['own_file'] = open('mine.txt').read()\n"
            "print('RESULT ' + json.dumps(res), flush=True)\n")
        attacker = self.submit_as(d, bob, {
            "name": "attacker",
            "command": [PY, "-c", attacker_code, str(vpid), paths["weights"], paths["private"]]})
        self.run_to_end(d, attacker["id"])
        log = d.logs(attacker["id"])[1]
        res = result_of(log)
        state = harness.proc_stat(vpid)
        st = state[0] if state else None
        if st == "T":
            resume()
        broken = []
        if res.get("environ") != "PermissionError":
            broken.append(f"read the victim's /proc/{vpid}/environ ({res.get('environ')})")
        if secret in log:
            broken.append("the victim's secret is in the attacker's log")
        if res.get("sigstop") != "PermissionError":
            broken.append(f"SIGSTOPped the victim ({res.get('sigstop')}; victim state {st})")
        if res.get("read_work_file") == "ok":
            broken.append("read the victim's work file")
        if res.get("read_checkpoint") == "ok":
            broken.append("read the victim's checkpoint")
        if res.get("overwrite_checkpoint") == "ok":
            broken.append("overwrote the victim's checkpoint")
        status, _, body = d.request("GET", ckpt_url, token=alice)
        if (status, body) != (200, weights):
            broken.append(f"the victim's checkpoint is now {status} {body[:60]!r}")
        self.assertEqual(broken, [], f"bob's job reached alice's: {res}")
        # legitimate use: the attacker did its own work; the victim sleeps on, undisturbed
        self.assertEqual(res.get("own_file"), "own work", res)
        self.assertIn(st, ("S", "R"), f"the victim's process state: {state}")
        self.assertEqual(d.job(vid)["state"], "running")
        self.assert_error(d.json("POST", f"/v1/jobs/{vid}/cancel", token=bob), 403, "forbidden",
                          what="bob cancels alice's job")
        status, _, obj = d.json("POST", f"/v1/jobs/{vid}/cancel", token=alice)
        self.assertEqual((status, obj.get("state")), (200, "cancelled"), obj)

    # -- finding 3: a job against the daemon

    def check_secrets(self, d, secret_file, token, what, isolated=True):
        """A job of `token` tries the daemon's token (by its path and as ../../token),
        database, audit log and the cluster secret, lists the state directory and reports its
        capabilities; asserts it got none of them and did its own work."""
        st = d.state_dir
        code = (
            "import json, os, sys\n"
            "res = {}\n"
            "def attempt(name, f):\n"
            "    try:\n"
            "        got = f()\n"
            "        res[name] = 'ok'\n"
            "        print(name, 'got:', got, flush=True)\n"
            "    except Exception as e:\n"
            "        res[name] = type(e).__name__\n"
            "def read(path):\n"
            "    with open(path, 'rb') as f:\n"
            "        return f.read(4096).decode(errors='replace')\n"
            "for name, path in json.loads(sys.argv[1]).items():\n"
            "    attempt(name, lambda: read(path))\n"
            "attempt('list_state_dir', lambda: os.listdir(sys.argv[2]))\n"
            "caps = {}\n"
            "for line in open('/proc/self/status'):\n"
            "    key, _, value = line.partition(':')\n"
            "    if key in ('CapInh', 'CapPrm', 'CapEff', 'CapAmb'):\n"
            "        caps[key] = int(value, 16)\n"
            "res['caps'] = caps\n"
            "with open('mine.txt', 'w') as f:\n"
            "    f.write('own work')\n"
            "res['own_file'] = read('mine.txt')\n"
            "print('RESULT ' + json.dumps(res), flush=True)\n")
        denied = {"token": os.path.join(st, "token"), "state.db": os.path.join(st, "state.db"),
                  "audit.log": os.path.join(st, "audit.log"), "cluster secret": secret_file}
        unreadable = {"../../token": "../../token", "../../../token": "../../../token",
                      "state.db-wal": os.path.join(st, "state.db-wal")}
        job = self.submit_as(d, token, {"name": "peek", "command": [
            PY, "-c", code, json.dumps(dict(denied, **unreadable)), st]})
        self.run_to_end(d, job["id"])
        log = d.logs(job["id"])[1]
        res = result_of(log)
        broken = []
        if isolated:
            broken = [f"{name}: {res.get(name)}" for name in denied
                      if res.get(name) != "PermissionError"]
            broken += [f"{name}: read" for name in unreadable if res.get(name) == "ok"]
            if res.get("list_state_dir") == "ok":
                broken.append("listed the state directory")
            if d.token in log:
                broken.append("the daemon's admin token is in the job's log")
        # (the inheritable set grants nothing without an ambient one or file capabilities)
        held = {k: hex(v) for k, v in res.get("caps", {}).items() if v and k != "CapInh"}
        if held:
            broken.append(f"the job holds capabilities {held}")
        self.assertEqual(broken, [], f"{what}: a job reached the daemon's secrets: {res}")
        self.assertEqual(res.get("own_file"), "own work", res)
        self.assertEqual(d.json("GET", "/v1/whoami", token=token)[2].get("name"), "mallory")

    def test_job_cannot_read_daemon_secrets(self):
        """Under a root daemon (the packaged setup), a job of a submit token gets neither the
        token, the database, the audit log nor the cluster secret, nor any capability. A daemon
        run as a plain uid with capabilities says its jobs are not isolated, and passes none of
        its capabilities on."""
        secret_dir = self.temp_dir(0o755)  # as /etc/traind: anyone may look inside

        def secret_file(name, uid):
            path = os.path.join(secret_dir, name)
            with open(path, "w") as f:
                f.write("cluster-" + secrets.token_hex(24) + "\n")
            os.chown(path, uid, uid)
            os.chmod(path, 0o600)
            return path

        with self.subTest(daemon="root"):
            path = secret_file("root.secret", 0)
            d = self.start_daemon("--slots", "1", "--cluster-secret-file", path)
            self.check_secrets(d, path, self.make_token(d, "mallory"), "a root daemon")

        with self.subTest(daemon=f"uid {DAEMON_UID} with capabilities"):
            setpriv = shutil.which("setpriv")
            if not setpriv:
                self.skipTest("no setpriv (util-linux)")
            path = secret_file("traind.secret", DAEMON_UID)
            caps = ",".join("+" + c for c in DAEMON_CAPS)
            wrapper = os.path.join(secret_dir, "traind-as-user")
            with open(wrapper, "w") as f:
                f.write("#!/bin/sh\n" + " ".join(shlex.quote(a) for a in (
                    "exec", setpriv, f"--reuid={DAEMON_UID}", f"--regid={DAEMON_UID}",
                    "--clear-groups", f"--inh-caps={caps}", f"--ambient-caps={caps}", "--",
                    harness.TRAIND)) + ' "$@"\n')
            os.chmod(wrapper, 0o755)
            state = self.new_state_dir()
            os.chown(state, DAEMON_UID, DAEMON_UID)
            d = CapabilityDaemon(state, ("--slots", "1", "--cluster-secret-file", path), wrapper)
            self.addCleanup(self._stop_daemon, d)
            d.start()
            self.assertEqual(os.stat(f"/proc/{d.pid}").st_uid, DAEMON_UID, "the daemon's uid")
            self.assertRegex(d.stderr_tail(100000), r"traind is not root: jobs run as its own user",
                             "a daemon that cannot isolate its jobs says so")
            self.check_secrets(d, path, self.make_token(d, "mallory"),
                               f"a daemon run as uid {DAEMON_UID} with {caps}", isolated=False)

    # -- finding 11: escapes

    def assert_no_escape(self, d, token, name, command):
        """A job whose command leaves a process under `marker` behind (started before the
        command's main process ends): once the job is reported ended, nothing of it runs."""
        marker = f"300.{secrets.randbelow(10 ** 9):09d}"  # a unique `sleep` argument
        self.kill_marked_at_cleanup(marker)
        job = self.submit_as(d, token, {"name": name,
                                        "command": [a.replace("MARK", marker) for a in command]})
        events = self.follow(d, job["id"])
        left = marked(marker)  # at once: the job must not be reported ended before they are gone
        self.assertEqual(left, [], f"{name}: job {job['id']} ended "
                                   f"({events[-1].data if events else None}) while its escaped "
                                   f"processes run: {harness.describe_procs(left)}")
        # legitimate use: the job's own process ran to its end and said so
        self.assert_final(d, job["id"], events, "succeeded")
        self.assertIn("parent done", d.logs(job["id"])[1])

    def test_setsid_child_does_not_outlive_its_job(self):
        d = self.start_daemon("--slots", "1", "--grace", "2")
        token = self.make_token(d, "mallory")
        # the parent waits for the escaped child to be there, so the job cannot end first
        self.assert_no_escape(d, token, "setsid", [
            "/bin/sh", "-c", "setsid sh -c 'echo $$ > escaped.pid; exec sleep MARK' & "
                             "while [ ! -s escaped.pid ]; do :; done; echo parent done; exit 0"])

    def test_double_fork_does_not_outlive_its_job(self):
        """daemon(3): fork, setsid, fork again; the first child exits, the grandchild sleeps."""
        d = self.start_daemon("--slots", "1", "--grace", "2")
        token = self.make_token(d, "mallory")
        code = ("import os, sys\n"
                "r, w = os.pipe()\n"
                "if os.fork() == 0:\n"
                "    os.setsid()\n"
                "    if os.fork() == 0:\n"
                "        os.write(w, b'x')\n"
                "        os.execv('/bin/sleep', ['sleep', sys.argv[1]])\n"
                "    os._exit(0)\n"
                "os.close(w)\n"
                "assert os.read(r, 1) == b'x'\n"  # the grandchild is there
                "os.wait()\n"
                "print('parent done', flush=True)\n")
        self.assert_no_escape(d, token, "double-fork", [PY, "-c", code, "MARK"])

    def test_setsid_child_does_not_outlive_a_cancel(self):
        d = self.start_daemon("--slots", "1", "--grace", "2")
        token = self.make_token(d, "mallory")
        marker = f"300.{secrets.randbelow(10 ** 9):09d}"
        self.kill_marked_at_cleanup(marker)
        job = self.submit_as(d, token, {"name": "setsid-cancel", "command": [
            "/bin/sh", "-c", f"setsid sleep {marker} & exec sleep 301"]})
        jid = job["id"]
        # only /proc shows it: the sleep itself (the shell's own command line names it too)
        escaped = wait_for(lambda: [p for p in marked(marker)
                                    if harness.cmdline(p)[:1] == ["sleep"]],
                           "the escaped child")
        sid = os.getsid(escaped[0])
        self.assertEqual(d.job(jid)["state"], "running")
        status, _, obj = d.json("POST", f"/v1/jobs/{jid}/cancel", token=token)
        left = marked(marker)  # the reply comes once no process of the job is left
        self.assertEqual(left, [], f"job {jid} cancelled ({status} {obj}) while its escaped child "
                                   f"(session {sid}) runs: {harness.describe_procs(left)}")
        self.assertEqual((status, obj.get("state")), (200, "cancelled"), obj)
        events = self.follow(d, jid)
        self.assertEqual(marked(marker), [])
        self.assert_final(d, jid, events, "cancelled")

    # -- finding 12: disk

    def test_disk_quota(self):
        """State on a 128 MiB tmpfs. Mallory's job (disk_gb 0.05) writes 200 MB into its work
        directory, then more, then waits: it fails with "disk quota exceeded"; alice's job
        beside it writes and reads back 8 MB and succeeds; the daemon answers and stores jobs."""
        state = self.small_state_dir(128)
        d = self.start_daemon("--slots", "2", "--grace", "2", state_dir=state)
        mallory = self.make_token(d, "mallory")
        alice = self.make_token(d, "alice")
        filler = self.submit_as(d, mallory, {
            "name": "filler", "resources": {"disk_gb": 0.05},
            "command": ["/bin/sh", "-c",
                        "dd if=/dev/zero of=big bs=1M count=200 2>&1; "
                        "dd if=/dev/zero of=more bs=1M count=1 2>&1; "
                        "echo '{\"event\": \"written\", \"step\": 1}'; exec sleep 20"]})
        fid = filler["id"]

        def free():  # a disk the job filled after all is freed before the daemon stops
            for name in ("big", "more"):
                try:
                    os.unlink(os.path.join(state, "jobs", str(fid), "work", name))
                except OSError:
                    pass
        self.addCleanup(free)
        with self.stream(d, fid) as s:
            s.until(lambda e: e.event == "written" or
                    (e.event == "state" and e.data.get("state") in harness.FINAL_STATES),
                    "the filler's writes")
        healthy = self.submit_as(d, alice, {
            "name": "healthy", "command": [
                "/bin/sh", "-c", "dd if=/dev/zero of=data bs=1M count=8 2>&1 && "
                                 "test $(wc -c < data) -eq 8388608 && echo healthy-ok"]})
        job = self.run_to_end(d, fid, "failed")
        self.assertRegex(job["reason"] or "", r"(?i)disk quota exceeded", job)
        self.assertRegex(job["reason"], r"\d", "the reason names the size")
        self.run_to_end(d, healthy["id"])
        self.assertIn("healthy-ok", d.logs(healthy["id"])[1])
        self.assertGreater(os.statvfs(state).f_bavail, 0, "the state filesystem is not full")
        self.assert_healthy(d, "a job over its quota")
        after, _ = d.submit({"name": "after", "command": ["/bin/true"]})
        self.run_to_end(d, after["id"])

    # -- finding 14: data probes

    def test_data_probe_runs_as_the_job(self):
        """A CSV path naming a root-only (0600) file in the state directory: 400 invalid_data
        on data.train.path saying permission, without the file's content; the same data
        readable by anyone trains."""
        d = self.start_daemon("--slots", "1")
        mallory = self.make_token(d, "mallory")
        cell = "s3cret" + secrets.token_hex(12)
        rows = "".join(f"{i % 2},{i}.5,{i * 2}.25,{i % 3}.0\n" for i in range(16))

        def put(name, text, mode):
            path = os.path.join(d.state_dir, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, mode)
            return path

        def spec(path):
            return {"name": "csv", "model": {"preset": "mlp", "hidden": [4], "num_classes": 2},
                    "data": {"format": "csv", "train": {"path": path}, "label_column": 0,
                             "header": False},
                    "train": {"epochs": 1, "batch_size": 4, "seed": 1, "threads": 1,
                              "optimizer": {"type": "sgd", "lr": 0.01}}}

        for name, text in (("private.csv", f"{cell},{cell}x\n" + rows),
                           ("private-valid.csv", rows)):
            path = put(name, text, 0o600)
            status, headers, body = d.request("POST", "/v1/jobs", spec(path), token=mallory)
            self.assertNotIn(cell.encode(), body, f"{name}: the probe echoed the root-only file")
            try:
                obj = json.loads(body)
            except ValueError:
                obj = body[:300]
            err = self.assert_error((status, headers, obj), 400, "invalid_data",
                                    field="data.train.path", what=f"{name} (0600, root's)")
            self.assertRegex(err["message"], r"(?i)permission denied", err)
            self.assertNotIn(cell, d.stderr_tail(1000), "the file's content in the daemon's log")
        # legitimate use: the same rows, readable by anyone
        ok = self.submit_as(d, mallory, spec(put("public.csv", rows, 0o644)))
        self.run_to_end(d, ok["id"])


NAMES = ["test_jobs_run_under_identities_of_their_own", "test_job_cannot_reach_another_job",
         "test_job_cannot_read_daemon_secrets", "test_setsid_child_does_not_outlive_its_job",
         "test_double_fork_does_not_outlive_its_job", "test_setsid_child_does_not_outlive_a_cancel",
         "test_disk_quota", "test_data_probe_runs_as_the_job"]


def main():
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    names = sys.argv[3:] or NAMES
    suite = unittest.TestSuite([SecurityIsolationTest(n) for n in names])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
