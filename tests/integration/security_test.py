#!/usr/bin/python3
"""Security against a real traind: tokens with scopes (read cannot submit or cancel, submit
cancels only its own jobs, only admins manage tokens), stored hashed, refused the moment they
are revoked (browser sessions too); command jobs limited by an allow-list (403); per-token
limits answering 429 with Retry-After (requests per second, event streams, queued jobs); an
audit log line for every mutating request; jobs of a root daemon running as run_as.

    /usr/bin/python3 tests/integration/security_test.py TRAIND SOURCE_DIR"""
import hashlib
import json
import os
import sqlite3
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from harness import train_spec  # noqa: E402


def sleeper(name, seconds=60):
    """A command job that runs until cancelled (SIGTERM ends it at once)."""
    return {"name": name, "command": ["/bin/sleep", str(seconds)]}


class SecurityTest(harness.DaemonTest):
    def make_token(self, d, name, scope, token=True):
        status, headers, obj = d.json("POST", "/v1/tokens", {"name": name, "scope": scope},
                                      token=token)
        self.assertEqual(status, 201, obj)
        self.assertEqual((obj["name"], obj["scope"]), (name, scope))
        self.assertRegex(obj["token"], r"^[0-9a-f]{64}$")
        self.assertEqual(headers.get("cache-control"), "no-store", "a secret is never cached")
        return obj

    def audit(self, d):
        with open(os.path.join(d.state_dir, "audit.log")) as f:
            return [json.loads(line) for line in f]

    def test_scopes(self):
        d = self.start_daemon("--slots", "2")
        me = d.get_ok("/v1/whoami")
        self.assertEqual((me["name"], me["scope"]), ("bootstrap", "admin"),
                         "the first start's token is an admin's")
        reader = self.make_token(d, "reader", "read")
        alice = self.make_token(d, "alice", "submit")
        bob = self.make_token(d, "bob", "submit")
        self.assertEqual(d.json("GET", "/v1/whoami", token=reader["token"])[2]["scope"], "read")

        # read: every GET, no change
        job, _ = d.submit(sleeper("admins"))
        self.assertEqual(d.json("GET", f"/v1/jobs/{job['id']}", token=reader["token"])[0], 200)
        self.assertEqual(d.json("GET", "/v1/jobs", token=reader["token"])[0], 200)
        self.assert_error(d.json("POST", "/v1/jobs", sleeper("no"), token=reader["token"]), 403,
                          "forbidden", what="a read token submits")
        self.assert_error(d.json("POST", f"/v1/jobs/{job['id']}/cancel", token=reader["token"]),
                          403, "forbidden", what="a read token cancels")
        self.assert_error(d.json("GET", "/v1/tokens", token=reader["token"]), 403, "forbidden",
                          what="a read token lists tokens")

        # submit: its own jobs only; the owner is recorded
        status, _, mine = d.json("POST", "/v1/jobs", sleeper("alices"), token=alice["token"])
        self.assertEqual(status, 201, mine)
        self.assertEqual(mine["owner"], {"token": alice["id"], "name": "alice"})
        self.assert_error(d.json("POST", f"/v1/jobs/{mine['id']}/cancel", token=bob["token"]),
                          403, "forbidden", what="bob cancels alice's job")
        # a job's spec (its env may hold secrets): its owner's and admins' to read, no one else's
        status, _, spec = d.json("GET", f"/v1/jobs/{mine['id']}/spec", token=alice["token"])
        self.assertEqual((status, spec), (200, sleeper("alices")))
        self.assertEqual(d.json("GET", f"/v1/jobs/{mine['id']}/spec")[0], 200, "an admin's")
        for who in (bob, reader):
            self.assert_error(d.json("GET", f"/v1/jobs/{mine['id']}/spec", token=who["token"]),
                              403, "forbidden", what=f"{who['name']} reads alice's spec")
        self.assert_error(d.json("POST", f"/v1/jobs/{job['id']}/cancel", token=alice["token"]),
                          403, "forbidden", what="alice cancels the admin's job")
        self.assert_error(d.json("POST", "/v1/tokens", {"name": "x", "scope": "admin"},
                                 token=alice["token"]), 403, "forbidden",
                          what="a submit token makes a token")
        self.assert_error(d.json("POST", "/v1/nodes/x/drain", token=alice["token"]), 403,
                          "forbidden", what="a submit token drains a node")
        status, _, obj = d.json("POST", f"/v1/jobs/{mine['id']}/cancel", token=alice["token"])
        self.assertEqual((status, obj.get("state")), (200, "cancelled"), obj)
        self.assert_error(d.json("DELETE", f"/v1/jobs/{mine['id']}", token=bob["token"]), 403,
                          "forbidden", what="bob deletes alice's job")
        self.assertEqual(d.json("DELETE", f"/v1/jobs/{mine['id']}", token=alice["token"])[0], 204)
        # admin: anyone's
        self.assertEqual(d.json("POST", f"/v1/jobs/{job['id']}/cancel")[0], 200)

        # bad requests name what is wrong
        self.assert_error(d.json("POST", "/v1/tokens", {"name": "x"}), 400, "bad_request",
                          what="no scope")
        self.assert_error(d.json("POST", "/v1/tokens", {"name": "x", "scope": "root"}), 400,
                          "bad_request", what="an unknown scope")
        self.assert_error(d.json("POST", "/v1/tokens", {"name": "a b", "scope": "read"}), 400,
                          "bad_request", field="name", what="a name with a space")
        self.assert_error(d.json("DELETE", "/v1/tokens/999"), 404, "not_found",
                          what="revoking no such token")

        # stored hashed: the database holds digests, never a token
        with sqlite3.connect(os.path.join(d.state_dir, "state.db")) as db:
            rows = db.execute("SELECT name, hash FROM tokens").fetchall()
        stored = dict(rows)
        self.assertEqual(stored["alice"], hashlib.sha256(alice["token"].encode()).hexdigest())
        with open(os.path.join(d.state_dir, "state.db"), "rb") as f:
            raw = f.read()
        for t in (reader, alice, bob):
            self.assertNotIn(t["token"].encode(), raw, "a token in clear in the database")
        listed = d.get_ok("/v1/tokens")["tokens"]
        self.assertEqual({t["name"] for t in listed}, {"bootstrap", "reader", "alice", "bob"})
        self.assertTrue(all("token" not in t and "hash" not in t for t in listed), listed)

        # the audit log: every change, with who and the outcome; no reads
        lines = self.audit(d)
        self.assertTrue(all(line["method"] != "GET" for line in lines), lines)
        refused = [x for x in lines if x["name"] == "reader" and x["path"] == "/v1/jobs"]
        self.assertEqual([(x["method"], x["status"], x["scope"]) for x in refused],
                         [("POST", 403, "read")])
        made = [x for x in lines if x["name"] == "alice" and x["method"] == "POST" and
                x["path"] == "/v1/jobs"]
        self.assertEqual([(x["status"], x["job"]) for x in made], [(201, mine["id"])])
        self.assertTrue(all(x["from"] == "127.0.0.1" and x["time"].endswith("Z") for x in lines))
        self.assertEqual(os.stat(os.path.join(d.state_dir, "audit.log")).st_mode & 0o777, 0o600)

    def test_revocation_is_immediate(self):
        d = self.start_daemon("--slots", "1")
        t = self.make_token(d, "ci", "submit")
        self.assertEqual(d.json("GET", "/v1/jobs", token=t["token"])[0], 200)
        # a browser session signed in with it
        status, headers, obj = d.json("POST", "/v1/session", {"token": t["token"]}, token=False)
        self.assertEqual(status, 200, obj)
        cookie = headers["set-cookie"].split(";")[0]
        session = {"Cookie": cookie, "X-CSRF-Token": obj["csrf"]}
        self.assertEqual(d.json("GET", "/v1/jobs", token=False, headers=session)[0], 200)
        self.assertEqual(d.json("DELETE", f"/v1/tokens/{t['id']}")[0], 204)
        self.assert_error(d.json("GET", "/v1/jobs", token=t["token"]), 401, "unauthorized",
                          what="the revoked token, at once")
        self.assert_error(d.json("GET", "/v1/jobs", token=False, headers=session), 401,
                          "unauthorized", what="a session of the revoked token")
        self.assert_error(d.json("DELETE", f"/v1/tokens/{t['id']}"), 404, "not_found",
                          what="revoked twice")
        listed = {x["name"]: x for x in d.get_ok("/v1/tokens")["tokens"]}
        self.assertIsNotNone(listed["ci"]["revoked_at"])

        # the last admin token stays; once another exists, the first-start one can go, with
        # its file, and a restart neither brings it back nor makes another
        boot = d.get_ok("/v1/whoami")
        self.assert_error(d.json("DELETE", f"/v1/tokens/{boot['token']}"), 409, "conflict",
                          what="revoking the last admin token")
        admin = self.make_token(d, "ops", "admin")
        self.assertEqual(d.json("DELETE", f"/v1/tokens/{boot['token']}",
                                token=admin["token"])[0], 204)
        self.assertFalse(os.path.exists(os.path.join(d.state_dir, "token")),
                         "the revoked first-start token's file is removed")
        self.assert_error(d.json("GET", "/v1/jobs"), 401, "unauthorized",
                          what="the first-start token once revoked")
        d.stop()
        d2 = harness.Daemon(d.state_dir, ("--slots", "1"))
        self.addCleanup(self._stop_daemon, d2)
        d2.start(token=admin["token"])
        self.assertFalse(os.path.exists(os.path.join(d.state_dir, "token")),
                         "no new admin token is made while one is live")
        self.assertEqual(d2.get_ok("/v1/whoami")["name"], "ops", "tokens survive a restart")
        self.assert_error(d2.json("GET", "/v1/jobs", token=t["token"]), 401, "unauthorized",
                          what="revoked stays revoked after a restart")

    def test_command_allow_list(self):
        d = self.start_daemon("--slots", "1", "--command-jobs", "/bin/true:/usr/bin/python3")
        ok, _ = d.submit({"name": "ok", "command": ["true"]})  # found in PATH, then allowed
        self.assert_final(d, ok["id"], d.follow(ok["id"]), "succeeded")
        self.assert_error(d.json("POST", "/v1/jobs", sleeper("no")), 403, "forbidden",
                          field="command[0]", what="a program outside the list")
        self.assert_error(d.json("POST", "/v1/jobs", {"name": "no", "command": ["/no/such"]}),
                          403, "forbidden", field="command[0]", what="no such program")
        self.assert_error(d.json("POST", "/v1/jobs", {"name": "no", "command": ["true"],
                                                      "env": {"LD_PRELOAD": "/tmp/x.so"}}),
                          403, "forbidden", field="env", what="LD_PRELOAD into an allowed one")
        # a job's own PATH is what the launch searches: a "true" of its own is not /bin/true
        fake = os.path.join(d.state_dir, "bin")
        os.mkdir(fake)
        with open(os.path.join(fake, "true"), "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(os.path.join(fake, "true"), 0o755)
        self.assert_error(d.json("POST", "/v1/jobs", {"name": "no", "command": ["true"],
                                                      "env": {"PATH": fake}}),
                          403, "forbidden", field="command[0]", what="a PATH of the job's")
        # a relative path is another program in each cwd: "usr/bin/python3" with a cwd of the
        # job's would be its own file, though it resolves to an allowed one from "/"
        reply = d.json("POST", "/v1/jobs", {"name": "no", "command": ["usr/bin/python3"],
                                            "cwd": "mine"})
        self.assert_error(reply, 403, "forbidden", field="command[0]",
                          what="a relative program path")
        self.assertIn("a relative path names a different program in each cwd",
                      reply[2]["error"]["message"])
        # training jobs are not command jobs
        t, _ = d.submit(train_spec("train", epochs=1))
        self.assert_final(d, t["id"], d.follow(t["id"]), "succeeded")

        d2 = self.start_daemon("--slots", "1", "--command-jobs", "none")
        self.assert_error(d2.json("POST", "/v1/jobs", {"name": "no", "command": ["true"]}), 403,
                          "forbidden", field="command", what="command jobs disabled")

    def test_limits(self):
        d = self.start_daemon("--slots", "1", "--rate-limit", "20", "--max-streams", "1",
                              "--max-queued", "1")
        fast = self.make_token(d, "fast", "read")
        t = self.make_token(d, "busy", "submit")
        watcher = self.make_token(d, "watcher", "read")

        # requests: a burst of twice the rate, then 429 with Retry-After
        started = time.monotonic()
        codes = [d.request("GET", "/v1/version", token=fast["token"]) for _ in range(100)]
        took = time.monotonic() - started
        limited = [c for c in codes if c[0] == 429]
        self.assertTrue(limited, f"100 requests in {took:.2f} s against 20 per second")
        # the bucket's 40 and what 20 per second refilled meanwhile
        self.assertLessEqual(len([c for c in codes if c[0] == 200]), 40 + 20 * took + 1)
        self.assertGreaterEqual(int(limited[0][1]["retry-after"]), 1)
        self.assertIn("rate_limit_per_s", limited[0][2].decode())
        # per token: the admin's own bucket is untouched
        self.assertEqual(d.request("GET", "/v1/version")[0], 200)

        # queued jobs: the slot runs one, one more queues, the next is refused
        running, _ = d.submit(sleeper("runs"))
        with d.events(running["id"]) as s:
            s.until(lambda e: e.event == "state" and e.data.get("state") == "running", "running")
        status, _, queued = d.json("POST", "/v1/jobs", sleeper("q1"), token=t["token"])
        self.assertEqual(status, 201, queued)
        resp = d.json("POST", "/v1/jobs", sleeper("q2"), token=t["token"])
        self.assert_error(resp, 429, "too_many_queued", what="a second queued job")
        self.assertIn("retry-after", resp[1])
        self.assertEqual(d.json("POST", "/v1/jobs", sleeper("admins-q"))[0], 201,
                         "the limit is per token")

        # event streams: one open, the second refused, and given back when the first ends
        path = f"/v1/jobs/{running['id']}/events"
        conn = d.connect()
        conn.request("GET", path, headers={"Authorization": "Bearer " + watcher["token"]})
        first = conn.getresponse()
        self.assertEqual(first.status, 200)
        resp = d.request("GET", path, token=watcher["token"])
        self.assertEqual(resp[0], 429, resp[2])
        self.assertIn("max_streams_per_token", resp[2].decode())
        self.assertIn("retry-after", resp[1])
        conn.close()
        for jid in (queued["id"], running["id"]):
            d.json("POST", f"/v1/jobs/{jid}/cancel")
        # the stream's end is seen once the server notices its connection closed: polled
        harness.wait_for(lambda: d.request("GET", path, token=watcher["token"])[0] == 200,
                         "the stream slot given back")

    @unittest.skipUnless(os.geteuid() == 0, "run_as needs a root daemon")
    def test_jobs_run_as(self):
        d = self.start_daemon("--slots", "1", "--run-as", "nobody")
        code = "import os; print('uid', os.getuid(), os.getgid(), os.getcwd(), flush=True)"
        job, _ = d.submit({"name": "who", "command": ["/usr/bin/python3", "-c", code]})
        self.assert_final(d, job["id"], d.follow(job["id"]), "succeeded")
        log = d.logs(job["id"])[1]
        job_dir = os.path.join(d.state_dir, "jobs", str(job["id"]))
        self.assertIn(f"uid 65534 65534 {job_dir}/work", log)
        st = os.stat(job_dir)
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (0, 0o710),
                         "the job directory stays root's: its attempt files are the daemon's")
        self.assertEqual(os.stat(os.path.join(d.state_dir, "state.db")).st_mode & 0o077, 0)
        # the job cannot touch the daemon's files
        code = ("import os, sys\n"
                "try:\n"
                "    os.listdir('..')\n"
                "    sys.exit(2)  # it may enter its job's directory, not list it\n"
                "except PermissionError:\n"
                "    pass\n"
                "try:\n"
                "    open('../attempt-0.node-0.json').read()\n"
                "except PermissionError:\n"
                "    try:\n"
                "        open('../escape', 'w')\n"
                "    except PermissionError:\n"
                "        sys.exit(0)\n"
                "sys.exit(1)\n")
        job, _ = d.submit({"name": "peek", "command": ["/usr/bin/python3", "-c", code]})
        self.assert_final(d, job["id"], d.follow(job["id"]), "succeeded")
        # a training job writes its checkpoints as that user
        t, _ = d.submit(train_spec("train", epochs=1))
        self.assert_final(d, t["id"], d.follow(t["id"]), "succeeded")
        ck = os.path.join(d.state_dir, "jobs", str(t["id"]), "checkpoints")
        self.assertEqual(os.stat(ck).st_uid, 65534)
        self.assertTrue(d.get_ok(f"/v1/jobs/{t['id']}/checkpoints"), "its own are listed")

    def test_checkpoint_of_the_daemons_files_refused(self):
        """A job cannot name the daemon's files (/etc, or a link to them) as its checkpoint: only
        files of the user it runs as are registered, listed, served or copied."""
        d = self.start_daemon("--slots", "1", "--run-as", "nobody")
        code = ("import json, os\n"
                "os.makedirs('mine', exist_ok=True)\n"
                "open('mine/weights.bin', 'w').write('w')\n"
                "os.symlink('/etc', 'link')\n"
                "for step, path in ((1, '/etc'), (2, 'link'), (3, 'mine'), (4, '/etc/shadow')):\n"
                "    print(json.dumps({'event': 'checkpoint', 'step': step, 'path': path}),\n"
                "          flush=True)\n")
        job, _ = d.submit({"name": "plant", "command": ["/usr/bin/python3", "-c", code]})
        jid = job["id"]
        self.assert_final(d, jid, d.follow(jid), "succeeded")
        listed = d.get_ok(f"/v1/jobs/{jid}/checkpoints")
        self.assertEqual([c["step"] for c in listed], [3], "only the job's own directory")
        self.assertEqual([f["name"] for f in listed[0]["files"]], ["weights.bin"])
        for step, name in ((1, "shadow"), (2, "shadow"), (4, "shadow")):
            status, _, body = d.request("GET", f"/v1/jobs/{jid}/checkpoints/{step}/{name}")
            self.assertEqual(status, 404, body[:200])
            self.assertNotIn(b"root:", body)
            self.assertEqual(d.request("GET", f"/v1/jobs/{jid}/checkpoints/{step}.tar")[0], 404)
        self.assertRegex(d.stderr_tail(100000),
                         r"checkpoint /etc not registered: .*belongs to uid 0, not to the user "
                         r"the job ran as \(uid 65534\)")


def main():
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    names = sys.argv[3:] or ["test_scopes", "test_revocation_is_immediate",
                             "test_command_allow_list", "test_limits", "test_jobs_run_as",
                             "test_checkpoint_of_the_daemons_files_refused"]
    suite = unittest.TestSuite([SecurityTest(n) for n in names])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
