#!/usr/bin/python3
"""Integration tests of the traind daemon through its HTTP API (api/README.md).

    /usr/bin/python3 tests/integration/daemon_test.py TRAIND_BINARY SOURCE_DIR [unittest options: -k cancel]

Each test starts its own `traind --listen 127.0.0.1:0 --state-dir TMP ...` through harness.py
(Daemon, DaemonTest: what the other Python integration tests use too) in a fresh temporary
state directory, reads the `traind: listening on http://127.0.0.1:PORT` line from its stderr,
and stops it with SIGTERM at the end; the cleanup then checks that no process of its jobs
outlived it (a stopping daemon stops its jobs unless told to keep them; a killed one leaves
them to their shepherds, which the next daemon re-attaches to). Standard library only; every
socket has a timeout, so a daemon bug fails a test instead of hanging it. Nothing waits by
sleeping: the tests read the daemon's stderr, the SSE stream and pidfds.

Set TRAIND_TEST_KEEP=1 to keep the state directories of failed tests.

Points the contract leaves open that these tests pin down:
- SSE: every record has an `id:` line and JSON `data:`; ids are per job, +1 each, persisted, and
  continue across a daemon restart; an event is on disk before it is sent (after a kill -9 the
  replayed stream starts with exactly the events a client had received).
- `checkpoint` events and the checkpoint list: `size` is model.safetensors' size in bytes.
- `field` in errors: train.batch_size, resources.nproc, command, model, env.A,
  data.train.images; for an unknown key the path contains the key; null for bad_json.
- bad_request for limit outside 1..500, a negative offset, an unknown state, since=abc; a
  non-numeric job id may be 400 bad_request or 404 not_found.
- A queued job cancelled has started_at null and no attempts.
- exit_code 137 (attempt and job) when rank 0 is SIGKILLed, also with two ranks; the reason names
  signal 9, SIGKILL, 137 or "killed".
- A command job's rank 0 stdout events other than train/eval/done are both SSE events and
  metrics; only rank 0's count; rank 1's log holds its stdout and stderr; cwd is in the state dir.
"""
import collections
import glob
import http.client
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import unittest

import harness  # beside this file: a script's directory comes first on sys.path
from harness import (ISO_RE, START_TIMEOUT, TIMEOUT, cmdline, describe_procs,
                     expected_log_steps, lingering, shepherd_pid, train_spec, wait_exited,
                     write_idx, write_npy)


# ---------------------------------------------------------------------------------------------
# Tests

# harness.DaemonTest's fixtures and assertions under the same name, so that the test ids
# (DaemonTest.test_3_cancel) that -k and unittest's arguments select stay what they were
class DaemonTest(harness.DaemonTest):
    maxDiff = 4000

    # -- 1

    def test_1_train_job_lifecycle(self):
        d = self.start_daemon("--slots", "2")
        st = os.stat(os.path.join(d.state_dir, "token"))
        self.assertEqual(st.st_mode & 0o777, 0o600, "token file mode")
        self.assertEqual(d.get_ok("/v1/version").get("api"), "v1")

        job, hdrs = d.submit(train_spec("lifecycle", epochs=1))
        self.assert_job(job)
        jid = job["id"]
        self.assertEqual(job["state"], "queued")
        self.assertEqual((job["name"], job["kind"], job["nproc"], job["max_restarts"],
                          job["restarts"], job["finished_at"], job["exit_code"]),
                         ("lifecycle", "train", 1, 0, 0, None, None))
        self.assertTrue(hdrs.get("location", "").endswith(f"/v1/jobs/{jid}"),
                        f"Location: {hdrs.get('location')}")

        listing = d.get_ok("/v1/jobs")
        self.assertIn(jid, [j["id"] for j in listing["jobs"]])
        self.assertIn("next_offset", listing)
        self.assertIsNone(listing["next_offset"])
        for j in listing["jobs"]:
            self.assert_job(j)
        self.assert_job(d.job(jid), jid)

        # the whole event stream, from the start until the server closes it
        with d.events(jid) as stream:
            events = stream.rest()
        self.assert_consecutive(events)
        names = [e.event for e in events]
        states = [e.data.get("state") for e in events if e.event == "state"]
        self.assertIn("running", states, names)
        self.assertTrue(set(states) <= {"queued", "running", "succeeded"}, states)
        self.assertEqual((events[-1].event, events[-1].data.get("state")), ("state", "succeeded"),
                         "the stream ends with the final state event")
        first_train = names.index("train")
        running_at = [i for i, e in enumerate(events)
                      if e.event == "state" and e.data.get("state") == "running"][0]
        self.assertLess(running_at, first_train, "state running comes before the first train")
        self.assertIn("done", names)
        self.assertLess(names.index("done"), len(names) - 1)
        sse_train = [e.data for e in events if e.event == "train"]
        self.assertEqual([t["step"] for t in sse_train], expected_log_steps(32))
        for t in sse_train:
            self.assertEqual(t.get("event"), "train")
            self.assertIsInstance(t.get("loss"), float)
        sse_ckpt = {e.data["step"]: e.data.get("size") for e in events if e.event == "checkpoint"}
        self.assertEqual(sorted(sse_ckpt), [10, 20, 30, 32])
        for size in sse_ckpt.values():
            self.assertIsInstance(size, int)
            self.assertGreater(size, 0)

        job = d.job(jid)
        self.assert_job(job, jid)
        self.assertEqual(job["state"], "succeeded")
        self.assertIsNotNone(job["started_at"])
        self.assertIsNotNone(job["finished_at"])
        self.assertEqual(len(job["attempts"]), 1, job["attempts"])
        self.assertIsNotNone(job["attempts"][0]["finished_at"])
        self.assertEqual(job["restarts"], 0)
        self.assertEqual(job["latest"]["train"]["step"], 32)
        self.assertEqual(job["latest"]["train"]["event"], "train")
        self.assertIsNone(job["latest"]["eval"])
        self.assertEqual(job["checkpoints"], 4)

        # metrics: the same train events, ordered by step; since= filters
        metrics = d.metrics(jid)
        self.assertIsInstance(metrics, list)
        steps = [m["step"] for m in metrics]
        self.assertEqual(steps, sorted(steps), "metrics are ordered by step")
        self.assertEqual([m for m in metrics if m.get("event") == "train"], sse_train)
        done = [m for m in metrics if m.get("event") == "done"]
        self.assertEqual(len(done), 1, metrics)
        self.assertEqual(done[0]["step"], 32)
        later = d.metrics(jid, since=10)
        self.assertTrue(all(m["step"] > 10 for m in later), later)
        self.assertEqual([m["step"] for m in later if m.get("event") == "train"],
                         [15, 20, 25, 30, 32])
        self.assertEqual(d.metrics(jid, since=32), [])
        self.assert_error(d.json("GET", f"/v1/jobs/{jid}/metrics?since=abc"), 400, "bad_request",
                          what="since=abc")

        # checkpoints: listed, downloadable, ranges
        ckpts = d.get_ok(f"/v1/jobs/{jid}/checkpoints")
        self.assertEqual(sorted(c["step"] for c in ckpts), [10, 20, 30, 32])
        for c in ckpts:
            self.assertEqual(c["url"], f"/v1/jobs/{jid}/checkpoints/{c['step']}/model.safetensors")
            self.assertRegex(c["created_at"], ISO_RE)
            self.assertEqual(c["size"], sse_ckpt[c["step"]], "size in the list and in the event")
            self.assertEqual([f["name"] for f in c["files"]],
                             ["model.safetensors", "optimizer.safetensors", "state.json"])
            self.assertEqual(c["size"], sum(f["size"] for f in c["files"]),
                             "size is the checkpoint's bytes, every file")
        last = max(ckpts, key=lambda c: c["step"])
        status, hdrs, full = d.request("GET", last["url"])
        self.assertEqual(status, 200)
        self.assertTrue(hdrs.get("content-type", "").startswith("application/octet-stream"),
                        hdrs)
        model_size = [f["size"] for f in last["files"] if f["name"] == "model.safetensors"][0]
        self.assertEqual(len(full), model_size, "the listed size of model.safetensors")
        (n,) = struct.unpack("<Q", full[:8])
        self.assertLess(8 + n, len(full))
        header = json.loads(full[8:8 + n])
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        self.assertGreaterEqual(len(tensors), 2)
        self.assertEqual(max(v["data_offsets"][1] for v in tensors.values()), len(full) - 8 - n,
                         "the tensors' data fills the file after the header")

        status, hdrs, part = d.request("GET", last["url"], headers={"Range": "bytes=0-7"})
        self.assertEqual(status, 206)
        self.assertEqual(part, full[:8])
        self.assertEqual(struct.unpack("<Q", part)[0], n)
        self.assertEqual(hdrs.get("content-range"), f"bytes 0-7/{len(full)}")
        status, hdrs, part = d.request("GET", last["url"],
                                       headers={"Range": f"bytes=8-{8 + n - 1}"})
        self.assertEqual(status, 206)
        self.assertEqual(json.loads(part), header)
        self.assert_error(d.json("GET", last["url"],
                                 headers={"Range": f"bytes={len(full)}-{len(full) + 10}"}),
                          416, "range_not_satisfiable", what="a range after the end")
        self.assert_error(d.json("GET", f"/v1/jobs/{jid}/checkpoints/999/model.safetensors"),
                          404, "not_found", what="unknown checkpoint")

        hdrs, log = d.logs(jid, rank=0)
        self.assertTrue(hdrs.get("content-type", "").startswith("text/plain"), hdrs)
        self.assertIn("[traind]", log, "rank 0's stderr has traind-worker's banner")

    # -- 2

    def test_2_last_event_id_resume(self):
        d = self.start_daemon("--slots", "2")
        job, _ = d.submit(train_spec("resume", epochs=3))
        jid = job["id"]

        # while it runs: read a few events, hang up, reconnect after the last one read
        with d.events(jid) as stream:
            head = stream.take(3)
        with d.events(jid, last_event_id=head[-1].id) as stream:
            tail = stream.rest()
        self.assertTrue(tail)
        self.assertEqual(tail[0].id, head[-1].id + 1)

        full = d.follow(jid)
        self.assert_final(d, jid, full, "succeeded")
        self.assert_consecutive(full)
        self.assertEqual(head + tail, full, "a reconnection misses nothing and repeats nothing")
        self.assertEqual(d.follow(jid), full, "a finished job's stream replays the same events")

        for k in (full[len(full) // 2].id, full[0].id, full[-2].id):
            expected = [e for e in full if e.id > k]
            with d.events(jid, last_event_id=k) as stream:
                self.assertEqual(stream.rest(), expected, f"Last-Event-ID: {k}")
            with d.events(jid, query=f"?last_event_id={k}") as stream:
                self.assertEqual(stream.rest(), expected, f"?last_event_id={k}")

    # -- 3

    def test_3_cancel(self):
        d = self.start_daemon("--slots", "2", "--grace", "5")
        a, _ = d.submit(train_spec("cancel-running", epochs=100, nproc=2))
        b, _ = d.submit(train_spec("cancel-queued", epochs=1, nproc=2))
        a_id, b_id = a["id"], b["id"]
        self.assertGreater(b_id, a_id)

        stream = d.events(a_id)
        self.addCleanup(stream.close)
        stream.until(lambda e: e.event == "train", "the first train event")
        self.assertEqual(d.job(a_id)["state"], "running")
        self.assertEqual(d.job(b_id)["state"], "queued", "FIFO: B waits for A's two slots")

        workers = d.workers()
        self.assertEqual(sorted(env.get("RANK") for _, _, env in workers), ["0", "1"],
                         f"two traind-worker ranks: {describe_procs([w[0] for w in workers])}")
        for _, _, env in workers:
            self.assertEqual(env.get("WORLD_SIZE"), "2")
        pgids = {pg for _, pg, _ in workers}
        self.assertNotIn(os.getpgid(d.pid), pgids, "the job runs in its own process group(s)")
        job_pids = set(self.job_pgroups_members(pgids)) | {w[0] for w in workers}

        status, _, cancelled = d.json("POST", f"/v1/jobs/{b_id}/cancel")
        self.assertEqual(status, 200, cancelled)
        self.assertEqual(cancelled["state"], "cancelled")

        status, _, cancelled = d.json("POST", f"/v1/jobs/{a_id}/cancel")
        self.assertEqual(status, 200, cancelled)
        self.assert_job(cancelled, a_id)
        self.assertEqual(cancelled["state"], "cancelled")
        self.assertIsNotNone(cancelled["finished_at"])
        # the response comes when no process of the job is left
        left = [p for p in job_pids if lingering(p, reaper=d.pid)]
        self.assertEqual(left, [], f"still there after cancel: {describe_procs(left)}")
        left = [p for p in self.job_pgroups_members(pgids) if lingering(p, reaper=d.pid)]
        self.assertEqual(left, [], f"job process groups not empty: {describe_procs(left)}")

        rest = stream.rest()
        self.assertEqual((rest[-1].event, rest[-1].data.get("state")), ("state", "cancelled"))
        stream.close()

        self.assert_error(d.json("POST", f"/v1/jobs/{a_id}/cancel"), 409, "conflict",
                          what="cancelling a cancelled job")
        self.assert_error(d.json("POST", f"/v1/jobs/{b_id}/cancel"), 409, "conflict",
                          what="cancelling a cancelled queued job")
        self.assert_error(d.json("POST", "/v1/jobs/999999/cancel"), 404, "not_found",
                          what="cancelling an unknown job")

        # the slots are free again: a new job runs, and the cancelled queued one never does
        c, _ = d.submit(train_spec("after-cancel", epochs=1, nproc=2, checkpoint=False))
        self.assert_final(d, c["id"], d.follow(c["id"]), "succeeded")
        b_events = d.follow(b_id)
        self.assertEqual((b_events[-1].event, b_events[-1].data.get("state")),
                         ("state", "cancelled"))
        self.assertFalse([e for e in b_events if e.event != "state" or
                          e.data.get("state") not in ("queued", "cancelled")],
                         f"the queued job ran: {b_events}")
        b = d.job(b_id)
        self.assertEqual((b["state"], b["started_at"], b["attempts"]), ("cancelled", None, []))

        # listing: newest first, state filter, paging
        ids = [j["id"] for j in d.get_ok("/v1/jobs")["jobs"]]
        self.assertEqual(ids, [c["id"], b_id, a_id])
        self.assertEqual({j["id"] for j in d.get_ok("/v1/jobs?state=cancelled")["jobs"]},
                         {a_id, b_id})
        self.assertEqual({j["id"] for j in d.get_ok("/v1/jobs?state=succeeded,cancelled")["jobs"]},
                         {a_id, b_id, c["id"]})
        page = d.get_ok("/v1/jobs?limit=1")
        self.assertEqual(([j["id"] for j in page["jobs"]], page["next_offset"]), ([c["id"]], 1))
        page = d.get_ok("/v1/jobs?limit=2&offset=1")
        self.assertEqual(([j["id"] for j in page["jobs"]], page["next_offset"]),
                         ([b_id, a_id], None))
        for bad in ("limit=0", "limit=501", "limit=abc", "offset=-1", "state=bogus"):
            self.assert_error(d.json("GET", f"/v1/jobs?{bad}"), 400, "bad_request", what=bad)

    # -- 4

    def test_4_bad_inputs(self):
        d = self.start_daemon("--slots", "2")
        good = train_spec("good", epochs=1)

        def check(resp, status, codes, field=Ellipsis, what=""):
            err = self.assert_error(resp, status, codes, field, what)
            self.assert_healthy(d, what)
            return err

        malformed = b'{"model": {"preset": "lenet5",\n "num_classes": }'
        err = check(d.json("POST", "/v1/jobs", malformed), 400, "bad_json", None, "malformed JSON")
        self.assertRegex(err["message"], re.compile(r"line", re.I), "bad_json gives the line")
        check(d.json("POST", "/v1/jobs", b""), 400, "bad_json", what="empty body")

        spec = json.loads(json.dumps(good))
        spec["train"]["batch_size"] = "64"
        check(d.json("POST", "/v1/jobs", spec), 400, "invalid_spec", "train.batch_size",
              "batch_size as a string")
        spec = json.loads(json.dumps(good))
        spec["train"]["optimizer"]["momentun"] = 0.9
        check(d.json("POST", "/v1/jobs", spec), 400, "invalid_spec", re.compile("momentun"),
              "unknown key train.optimizer.momentun")
        spec = dict(good, bogus=1)
        check(d.json("POST", "/v1/jobs", spec), 400, "invalid_spec", re.compile("bogus"),
              "unknown top-level key")
        for nproc in (3, 0):
            check(d.json("POST", "/v1/jobs", dict(good, resources={"nproc": nproc})), 400,
                  "invalid_spec", "resources.nproc", f"nproc {nproc} with 2 slots")
        # across nodes: what a one-node cluster cannot hold, and malformed placement members
        err = check(d.json("POST", "/v1/jobs",
                           dict(good, resources={"nnodes": 2, "nproc_per_node": 1})), 400,
                    "invalid_spec", "resources.nnodes", "2 nodes on a one-node cluster")
        self.assertIn("the cluster has 1 node", err["message"])
        check(d.json("POST", "/v1/jobs", dict(good, resources={"nproc": 1, "nproc_per_node": 1})),
              400, "invalid_spec", "resources.nproc_per_node", "nproc and nproc_per_node")
        check(d.json("POST", "/v1/jobs", dict(good, resources={"nodes": ["nowhere"]})), 400,
              "invalid_spec", "resources.nodes[0]", "a node the cluster does not know")
        check(d.json("POST", "/v1/jobs", dict(good, resources={"nodes": ["a b"]})), 400,
              "invalid_spec", "resources.nodes[0]", "a malformed node name")
        check(d.json("POST", "/v1/jobs", dict(good, resources={"nnodes": 2, "nodes": ["x"]})),
              400, "invalid_spec", "resources.nnodes", "more nodes than resources.nodes names")
        cmd = ["/usr/bin/python3", "-c", "pass"]
        check(d.json("POST", "/v1/jobs", {"command": "python3"}), 400, "invalid_spec", "command",
              "command not an array")
        check(d.json("POST", "/v1/jobs", {"command": cmd, "model": good["model"]}), 400,
              "invalid_spec", "model", "a command job with a model")
        check(d.json("POST", "/v1/jobs", {"command": cmd, "env": {"A": 1}}), 400,
              "invalid_spec", "env.A", "an env value that is not a string")

        check(self.post_oversized(d, 10 << 20), 413, "body_too_large", what="10 MiB body")

        check(d.json("POST", "/v1/jobs", good, token=False), 401, "unauthorized", what="no token")
        check(d.json("GET", "/v1/jobs", token=False), 401, "unauthorized", what="GET, no token")
        check(d.json("GET", "/v1/jobs", token="0" * len(d.token)), 401, "unauthorized",
              what="wrong token")
        check(d.json("GET", "/v1/jobs", token=False, headers={"Authorization": d.token}), 401,
              "unauthorized", what="token without Bearer")

        check(d.json("GET", "/v1/jobs/999999"), 404, "not_found", what="unknown job")
        for sub in ("events", "metrics", "checkpoints", "logs"):
            check(d.json("GET", f"/v1/jobs/999999/{sub}"), 404, "not_found",
                  what=f"unknown job's {sub}")
        resp = d.json("GET", "/v1/jobs/abc")
        self.assertIn(resp[0], (400, 404), f"non-numeric job id: {resp}")
        check(resp, resp[0], "bad_request" if resp[0] == 400 else "not_found",
              what="non-numeric job id")
        check(d.json("GET", "/v1/nope"), 404, "not_found", what="unknown route")
        check(d.json("GET", "/v2/jobs"), 404, "not_found", what="unknown version")
        resp = d.json("DELETE", "/v1/jobs")
        check(resp, 405, "method_not_allowed", what="DELETE /v1/jobs")
        allow = {m.strip() for m in resp[1].get("allow", "").split(",")}
        self.assertTrue({"GET", "POST"} <= allow, f"Allow: {resp[1].get('allow')}")
        check(d.json("POST", "/v1/health", b"{}"), 405, "method_not_allowed",
              what="POST /v1/health")

        # paths: resolved after symlinks, inside a data root (the state dir is one)
        def idx_spec(images, labels):
            return {"name": "idx", "model": {"preset": "lenet5", "num_classes": 10},
                    "data": {"format": "idx", "train": {"images": images, "labels": labels}},
                    "train": {"epochs": 1, "batch_size": 64, "threads": 1,
                              "optimizer": {"type": "sgd", "lr": 0.01}}}
        check(d.json("POST", "/v1/jobs", idx_spec("/usr/share/datasets/../../etc/passwd",
                                                  "/usr/share/datasets/../../etc/passwd")),
              400, "invalid_spec", "data.train.images", "path traversal out of the data root")
        outside = os.path.join(d.state_dir, "test-link-outside")
        os.symlink("/etc/passwd", outside)
        check(d.json("POST", "/v1/jobs", idx_spec(outside, outside)), 400, "invalid_spec",
              "data.train.images", "a symlink in the state dir to a file outside the roots")

        jobs = d.get_ok("/v1/jobs")["jobs"]
        self.assertEqual(jobs, [], "no rejected request created a job")

        # the positive control: data inside the state dir, reached through a symlink there
        data_dir = os.path.join(d.state_dir, "test-data")
        os.mkdir(data_dir)
        write_idx(os.path.join(data_dir, "images.idx"), os.path.join(data_dir, "labels.idx"))
        inside = os.path.join(d.state_dir, "test-link-inside")
        os.symlink(os.path.join(data_dir, "images.idx"), inside)
        job, _ = d.submit(idx_spec(inside, os.path.join(data_dir, "labels.idx")))
        self.assert_final(d, job["id"], d.follow(job["id"]), "succeeded")

        # protocol abuse: garbage, and a half-sent request left open, do not stop the daemon
        with socket.create_connection(("127.0.0.1", d.port), timeout=TIMEOUT) as s:
            s.sendall(b"THIS IS NOT HTTP\r\n\r\n")
            resp = http.client.HTTPResponse(s)
            try:  # a 4xx answer, or the connection closed without one
                resp.begin()
                resp.read()
                self.assertTrue(400 <= resp.status < 500, f"garbage request: {resp.status}")
            except (http.client.RemoteDisconnected, ConnectionResetError):
                pass
            except http.client.BadStatusLine as e:
                self.fail(f"the answer to a garbage request is not HTTP: {e!r}")
        self.assert_healthy(d, "a garbage request")
        with socket.create_connection(("127.0.0.1", d.port), timeout=TIMEOUT) as idle:
            idle.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            status, _, obj = d.json("GET", "/v1/health", token=False, timeout=10)
            self.assertEqual(status, 200, "served while another client sends half a request")
        self.assert_healthy(d, "everything")

    def post_oversized(self, d, size):
        """POST /v1/jobs with a `size`-byte body, sending it only while the daemon has not
        answered (it may answer from Content-Length alone, or after reading up to its limit)."""
        s = socket.create_connection(("127.0.0.1", d.port), timeout=TIMEOUT)
        try:
            s.sendall((f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       f"Authorization: Bearer {d.token}\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {size}\r\nConnection: close\r\n\r\n").encode())
            chunk = b" " * 65536
            sent = 0
            while sent < size:
                readable, writable, _ = select.select([s], [s], [], TIMEOUT)
                if readable:
                    break  # the answer is there
                if not writable:
                    raise AssertionError("the daemon neither reads the body nor answers")
                try:
                    sent += s.send(chunk[:size - sent])
                except (BrokenPipeError, ConnectionResetError):
                    break
            resp = http.client.HTTPResponse(s)
            try:
                resp.begin()
                body = resp.read()
            except (ConnectionResetError, http.client.RemoteDisconnected) as e:
                raise AssertionError(f"no response to an oversized body ({sent} bytes sent): "
                                     f"{e!r}; the daemon should answer 413 and close without "
                                     f"resetting (drain or lingering close)")
            try:
                obj = json.loads(body)
            except ValueError:
                raise AssertionError(f"413 body is not JSON: {body[:300]!r}")
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, obj
        finally:
            s.close()

    # -- 5

    SURVIVOR_STEPS = 20 * 16  # 2 ranks, 16 steps an epoch each

    def running_job_across_a_restart(self, how, *args):
        """Submits a 2-rank job, follows it to its first checkpoint, takes the daemon away
        (how: "kill" for kill -9, "term" for SIGTERM, "term-keep" for SIGTERM with
        --keep-jobs-on-stop) and starts another on the same state directory. Returns (d2, job
        id, events seen before, the ranks' pids before)."""
        state = self.new_state_dir()
        keep = ("--keep-jobs-on-stop", "true") if how == "term-keep" else ()
        d1 = self.start_daemon("--slots", "2", *keep, *args, state_dir=state)
        token = d1.token
        job, _ = d1.submit(train_spec("survivor", epochs=self.SURVIVOR_STEPS // 16, nproc=2,
                                      max_restarts=0))
        jid = job["id"]
        with d1.events(jid) as stream:
            seen = stream.until(lambda e: e.event == "checkpoint", "the first checkpoint")
        ranks = sorted(p for p, _, _ in d1.workers())
        self.assertEqual(len(ranks), 2, "the job runs when the daemon goes")
        # The ranks are held (SIGSTOP) while their daemon goes, so the job cannot end before it
        # is taken away, whatever the build's speed, and the job can be short. A daemon that
        # stops its jobs sends them SIGTERM, which a held process takes only once continued.
        self.signal_all(ranks, signal.SIGSTOP)
        if how == "kill":
            d1.kill()
        else:
            os.kill(d1.pid, signal.SIGTERM)
            if how == "term":
                self.signal_all(ranks, signal.SIGCONT)
            d1.proc.wait(timeout=TIMEOUT)
        d2 = self.start_daemon("--slots", "2", *keep, *args, state_dir=state)
        self.assertEqual(d2.token, token, "the token survives a restart")
        self.signal_all(ranks, signal.SIGCONT)
        return d2, jid, seen, ranks

    @staticmethod
    def signal_all(pids, sig):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass  # stopped by its daemon already

    def assert_went_on(self, d2, jid, seen, ranks, total):
        """The job went on untouched: the same processes, no restart, every event once."""
        self.assertEqual(sorted(p for p, _, _ in d2.workers()), ranks,
                         "the job's ranks keep running across the daemon's restart")
        self.assertTrue(any(f"job {jid}: re-attached to attempt 0" in l
                            for l in d2.stderr_lines), d2.stderr_tail())
        with d2.events(jid, last_event_id=seen[-1].id) as stream:
            after = stream.rest()
        self.assertTrue(after)
        self.assertEqual(after[0].id, seen[-1].id + 1, "event ids continue across the restart")
        self.assert_consecutive(after)
        job = self.assert_final(d2, jid, after, "succeeded")
        self.assertNotIn("restart", [e.event for e in after], "nothing was restarted")
        self.assertEqual((job["restarts"], len(job["attempts"])), (0, 1), job)
        self.assertEqual(job["latest"]["train"]["step"], total)
        full = d2.follow(jid)
        self.assert_consecutive(full)
        self.assertEqual(full[:len(seen)], seen, "events from before the kill are kept as sent")
        train = [e.data["step"] for e in full if e.event == "train"]
        self.assertEqual(train, expected_log_steps(total),
                         "every logged step once: none lost, none repeated")
        stored = [m["step"] for m in d2.metrics(jid) if m.get("event") == "train"]
        self.assertEqual(stored, expected_log_steps(total))
        ckpts = [c["step"] for c in d2.get_ok(f"/v1/jobs/{jid}/checkpoints")]
        self.assertEqual(ckpts, sorted(set(ckpts)), "each checkpoint registered once")
        self.assertIn(total, ckpts)

    def test_5_daemon_killed_reattaches(self):
        d2, jid, seen, ranks = self.running_job_across_a_restart("kill")
        self.assert_went_on(d2, jid, seen, ranks, self.SURVIVOR_STEPS)

    def test_5b_stop_keeping_jobs_reattaches(self):
        """keep_jobs_on_stop: systemctl stop/restart (SIGTERM) leaves the job to its
        shepherd; the next daemon goes on with it."""
        d2, jid, seen, ranks = self.running_job_across_a_restart("term-keep")
        self.assert_went_on(d2, jid, seen, ranks, self.SURVIVOR_STEPS)

    def test_5c_stop_without_keeping_jobs_resumes(self):
        """By default a stopping daemon stops its jobs (SIGTERM, then SIGKILL after the grace
        period) and the next one resumes them from their checkpoints, not charged to them."""
        d2, jid, seen, ranks = self.running_job_across_a_restart("term")
        for pid in ranks:
            self.assertFalse(lingering(pid), "the ranks were stopped with the daemon")
        after = d2.follow(jid)
        job = self.assert_final(d2, jid, after, "succeeded")
        (restart,) = [e.data for e in after if e.event == "restart"]
        self.assertIn("keep_jobs_on_stop is false", restart["reason"])
        self.assertIn("resuming from its newest checkpoint", restart["reason"])
        self.assertEqual(job["restarts"], 0, "a daemon's restart is not charged to the job")
        self.assertEqual(len(job["attempts"]), 2)
        self.assertEqual(job["latest"]["train"]["step"], self.SURVIVOR_STEPS)
        ckpt = seen[-1].data["step"]
        stored = [m["step"] for m in d2.metrics(jid) if m.get("event") == "train"]
        self.assertEqual(stored, expected_log_steps(self.SURVIVOR_STEPS),
                         "every step logged once: re-run steps replace, nothing is missing")
        self.assertGreaterEqual(restart["resume_from"]["step"], ckpt)

    def test_5d_orphaned_job_stops(self):
        """A shepherd whose daemon stays away for orphan_timeout_s stops its job; the next
        daemon reads how it ended and resumes it, not charged to it."""
        state = self.new_state_dir()
        d1 = self.start_daemon("--slots", "1", "--orphan-timeout", "1", state_dir=state)
        job, _ = d1.submit(train_spec("orphan", epochs=1000, nproc=1, max_restarts=0))
        jid = job["id"]
        with d1.events(jid) as stream:
            stream.until(lambda e: e.event == "checkpoint", "the first checkpoint")
        procs = d1.kill()
        self.assertTrue(procs)
        self.assertEqual(wait_exited(sorted(procs)), [],
                         "the orphaned job's processes stop after orphan_timeout_s")
        status = glob.glob(os.path.join(state, "jobs", str(jid), "attempt-0.node-0.status"))
        self.assertEqual(len(status), 1)
        with open(status[0]) as f:
            self.assertEqual(json.load(f)["stopped_by"], "orphaned")
        d2 = self.start_daemon("--slots", "1", state_dir=state)
        with d2.events(jid) as stream:
            events = stream.until(lambda e: e.event == "restart", "the restart")
        self.assertIn("no traind was connected for 1 s", events[-1].data["reason"])
        self.assertEqual(events[-1].data["restarts"], 0)
        status, _, _ = d2.json("POST", f"/v1/jobs/{jid}/cancel")
        self.assertEqual(status, 200)

    def test_5e_shepherd_killed_or_machine_rebooted(self):
        """A shepherd gone without its status file: after a reboot (another boot id) the job
        resumes, not charged to it; killed on a running machine, the attempt failed."""
        state = self.new_state_dir()
        d1 = self.start_daemon("--slots", "1", state_dir=state)
        job, _ = d1.submit(train_spec("reboot", epochs=1000, nproc=1, max_restarts=1))
        jid = job["id"]
        with d1.events(jid) as stream:
            stream.until(lambda e: e.event == "checkpoint", "the first checkpoint")
        for pid in d1.kill():  # the machine goes down: the daemon and everything of the job
            os.kill(pid, signal.SIGKILL)
        spec = os.path.join(state, "jobs", str(jid), "attempt-0.node-0.json")
        with open(spec) as f:
            attempt = json.load(f)
        self.assertTrue(attempt["boot_id"])
        attempt["boot_id"] = "00000000-0000-0000-0000-000000000000"  # an earlier boot's
        with open(spec, "w") as f:
            json.dump(attempt, f)
        d2 = self.start_daemon("--slots", "1", state_dir=state)
        with d2.events(jid) as stream:
            events = stream.until(lambda e: e.event == "state" and e.data["state"] == "running"
                                  and e.data["attempt"] == 1, "the second attempt")
        (restart,) = [e.data for e in events if e.event == "restart"]
        self.assertIn("the machine restarted while it ran", restart["reason"])
        self.assertEqual(restart["restarts"], 0, "a reboot is not the job's failure")

        # now its shepherd alone is killed, the machine and the daemon running on
        shepherd = shepherd_pid(d2, jid, 1)
        os.kill(shepherd, signal.SIGKILL)
        with d2.events(jid, last_event_id=events[-1].id) as stream:
            more = stream.until(lambda e: e.event == "restart", "the restart")
        self.assertEqual(more[-1].data["restarts"], 1, "charged: the job's processes died")
        self.assertIn("was killed or crashed", more[-1].data["reason"])
        status, _, _ = d2.json("POST", f"/v1/jobs/{jid}/cancel")
        self.assertEqual(status, 200)

    def test_5f_job_that_cannot_go_on_is_stopped(self):
        """A job a restarted daemon cannot run any more (its worker spec is gone) fails, and
        what its shepherd still runs is stopped rather than left training on freed slots."""
        state = self.new_state_dir()
        d1 = self.start_daemon("--slots", "1", "--grace", "2", state_dir=state)
        job, _ = d1.submit(train_spec("lost-spec", epochs=1000, nproc=1))
        jid = job["id"]
        self.wait_state(d1, jid, "running")
        procs = d1.kill()
        self.assertTrue(procs)
        os.unlink(os.path.join(state, "jobs", str(jid), "spec.json"))
        d2 = self.start_daemon("--slots", "1", "--grace", "2", state_dir=state)
        job = d2.job(jid)
        self.assertEqual(job["state"], "failed", job)
        self.assertIn("cannot run after a daemon restart", job["reason"])
        self.assertEqual(wait_exited(sorted(procs)), [], "its processes were stopped")

    # -- 6

    def kill_rank0_after_checkpoint(self, d, jid):
        """Follows the job's events to its first checkpoint, SIGKILLs rank 0's traind-worker,
        then follows the stream to its end. Returns (before, after, killed pid)."""
        with d.events(jid) as stream:
            before = stream.until(lambda e: e.event == "checkpoint", "the first checkpoint")
            rank0 = [pid for pid, _, env in d.workers() if env.get("RANK") == "0"]
            self.assertEqual(len(rank0), 1, f"one rank 0 worker: {describe_procs(rank0)}")
            os.kill(rank0[0], signal.SIGKILL)
            after = stream.rest()
        return before, after, rank0[0]

    def test_6a_worker_killed_restarts(self):
        d = self.start_daemon("--slots", "2")
        total = 30 * 16  # 2 ranks: 16 steps an epoch
        job, _ = d.submit(train_spec("worker-restart", epochs=30, nproc=2, max_restarts=1))
        jid = job["id"]
        before, after, killed = self.kill_rank0_after_checkpoint(d, jid)
        self.assertFalse(lingering(killed, reaper=d.pid))
        self.assert_consecutive(before + after)
        names = [e.event for e in after]
        self.assertEqual(names.count("restart"), 1, names)
        at = names.index("restart")
        self.assertIn("train", names[at + 1:], "training goes on after the restart")
        job = self.assert_final(d, jid, after, "succeeded")
        self.assertEqual(job["restarts"], 1)
        self.assertEqual(len(job["attempts"]), 2, job["attempts"])
        self.assertEqual(job["attempts"][0]["exit_code"], 137, job["attempts"])
        self.assertIsInstance(job["attempts"][0]["reason"], str)
        self.assertEqual(job["latest"]["train"]["step"], total)
        steps = [m["step"] for m in d.metrics(jid) if m.get("event") == "train"]
        self.assertEqual(steps, expected_log_steps(total), "re-run steps replace the old ones")
        self.assertEqual(d.workers(), [], "no worker left after the job")

    def test_6b_worker_killed_no_restarts(self):
        d = self.start_daemon("--slots", "2")
        job, _ = d.submit(train_spec("worker-fail", epochs=30, max_restarts=0))
        jid = job["id"]
        before, after, killed = self.kill_rank0_after_checkpoint(d, jid)
        self.assert_consecutive(before + after)
        self.assertNotIn("restart", [e.event for e in after])
        self.assertNotIn("done", [e.event for e in after])
        job = self.assert_final(d, jid, after, "failed")
        self.assertEqual(after[-1].data.get("exit_code"), 137, after[-1])
        self.assertEqual(job["exit_code"], 137)
        self.assertEqual(job["restarts"], 0)
        self.assertEqual(len(job["attempts"]), 1, job["attempts"])
        self.assertIsInstance(job["reason"], str)
        self.assertRegex(job["reason"], re.compile(r"signal 9|SIGKILL|\b137\b|[Kk]illed"),
                         "the reason names the signal")
        self.assertFalse(lingering(killed, reaper=d.pid))
        self.assertEqual(d.workers(), [])

    # -- 7

    def test_7_gloo_ddp_command_job(self):
        d = self.start_daemon("--slots", "2")
        script = os.path.join(harness.SOURCE_DIR, "tests", "integration", "gloo_metrics.py")
        job, _ = d.submit({"name": "gloo-ddp", "command": ["/usr/bin/python3", script],
                           "resources": {"nproc": 2}, "env": {"TRAIND_TEST_MARK": "xyz"}})
        jid = job["id"]
        self.assertEqual((job["kind"], job["nproc"], job["state"]), ("command", 2, "queued"))
        events = d.follow(jid)
        job = self.assert_final(d, jid, events, "succeeded")
        self.assert_consecutive(events)
        self.assertEqual(job["latest"]["train"]["step"], 5)

        by_name = collections.defaultdict(list)
        for e in events:
            by_name[e.event].append(e.data)
        self.assertEqual([t["step"] for t in by_name["train"]], [1, 2, 3, 4, 5])
        self.assertTrue(all(t["world"] == 2 for t in by_name["train"]))
        self.assertEqual(by_name["sync"], [{"event": "sync", "step": 5, "max_param_diff": 0.0}],
                         "a command's own events are SSE events; DDP kept replicas equal")
        self.assertEqual(len(by_name["done"]), 1)
        self.assertEqual(by_name["rank1_noise"], [], "only rank 0's lines are metrics")
        (env,) = by_name["env"]
        vars_ = env["vars"]
        self.assertTrue(all(v is not None for v in vars_.values()), vars_)
        self.assertEqual((vars_["RANK"], vars_["LOCAL_RANK"], vars_["WORLD_SIZE"],
                          vars_["LOCAL_WORLD_SIZE"], vars_["GROUP_RANK"],
                          vars_["TORCHELASTIC_RESTART_COUNT"]), ("0", "0", "2", "2", "0", "0"))
        self.assertEqual(env["mark"], "xyz", "the spec's env reaches the processes")
        self.assertTrue(os.path.realpath(env["cwd"]).startswith(d.state_dir + os.sep),
                        f"runs in the job's directory, found {env['cwd']}")

        metrics = d.metrics(jid)
        self.assertTrue(all(isinstance(m, dict) and "event" in m for m in metrics), metrics)
        self.assertEqual([m for m in metrics if m["event"] == "train"], by_name["train"])
        self.assertIn("sync", [m["event"] for m in metrics])
        self.assertNotIn("rank1_noise", [m["event"] for m in metrics])
        steps = [m["step"] for m in metrics]
        self.assertEqual(steps, sorted(steps))

        _, log1 = d.logs(jid, rank=1)
        self.assertIn("gloo_metrics rank 1 stdout marker", log1, "rank 1's stdout is in its log")
        self.assertIn("gloo_metrics rank 1 of 2 starting", log1, "rank 1's stderr is in its log")
        _, log0 = d.logs(jid, rank=0)
        self.assertIn("gloo_metrics rank 0 of 2 starting", log0)
        self.assertEqual(d.workers(lambda pid: "gloo_metrics.py" in " ".join(cmdline(pid))), [])


    # -- 8: one daemon per state directory, one per address

    def run_second_traind(self, *args, timeout=START_TIMEOUT):
        """Runs a traind that is expected to refuse to start: (exit code, stderr)."""
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        proc = subprocess.run([harness.TRAIND] + list(args), stdin=subprocess.DEVNULL,
                              capture_output=True, env=env, timeout=timeout)
        return proc.returncode, proc.stderr.decode(errors="replace")

    def test_8a_second_daemon_on_state_dir_exits(self):
        d = self.start_daemon("--slots", "2")
        job, _ = d.submit(train_spec("untouched", epochs=3))
        jid = job["id"]
        stream = d.events(jid)
        self.addCleanup(stream.close)
        head = stream.until(lambda e: e.event == "train", "the first train event")
        workers = d.workers()
        self.assertEqual(len(workers), 1, describe_procs([w[0] for w in workers]))

        code, err = self.run_second_traind("--listen", "127.0.0.1:0", "--state-dir", d.state_dir)
        self.assertNotEqual(code, 0, f"a second daemon on the same state dir started: {err}")
        self.assertIn(d.state_dir, err, "the message names the directory")
        self.assertIn(f"pid {d.pid}", err, "the message names the daemon holding it")
        self.assertNotIn("listening", err)

        self.assertEqual(d.workers()[0][0], workers[0][0], "the first daemon's worker lives on")
        rest = stream.rest()
        events = head + rest
        self.assert_consecutive(events)
        self.assertNotIn("restart", [e.event for e in events])
        job = self.assert_final(d, jid, events, "succeeded")
        self.assertEqual(len(job["attempts"]), 1, job["attempts"])
        self.assertEqual(job["reason"], None)
        self.assertFalse([l for l in d.stderr_tail(400).splitlines() if "UNIQUE" in l])

    def test_8b_second_daemon_on_port_exits(self):
        d = self.start_daemon("--slots", "1")
        other = self.new_state_dir()
        code, err = self.run_second_traind("--listen", f"127.0.0.1:{d.port}", "--state-dir",
                                           other)
        self.assertNotEqual(code, 0, f"a second daemon on port {d.port} started: {err}")
        self.assertRegex(err, re.compile(r"in use", re.I))
        self.assertIn(str(d.port), err)
        self.assertFalse(os.path.exists(os.path.join(other, "state.db")),
                         "it stopped before opening its state")
        for i in range(20):  # every request reaches the one daemon: its token is accepted
            status, _, _ = d.json("GET", "/v1/jobs")
            self.assertEqual(status, 200, f"request {i}")

    # -- 9: Python command jobs' metrics arrive while they run

    def test_9_python_metrics_unbuffered(self):
        d = self.start_daemon("--slots", "1")
        fifo = os.path.join(d.state_dir, "release")
        os.mkfifo(fifo)
        code = ("import json, sys\n"
                "print(json.dumps({'event': 'train', 'step': 1, 'loss': 0.5}))\n"
                "print('a plain line')\n"
                f"open({fifo!r}).read()\n"  # blocks until the test has seen the metric
                "print(json.dumps({'event': 'done', 'step': 2}))\n")
        job, _ = d.submit({"name": "unflushed", "command": ["/usr/bin/python3", "-c", code]})
        jid = job["id"]
        with d.events(jid) as stream:
            first = stream.until(lambda e: e.event == "train", "the unflushed metric")
            self.assertEqual(first[-1].data["loss"], 0.5)
            self.assertEqual(d.job(jid)["state"], "running", "delivered while the job runs")
            with open(fifo, "w") as f:
                f.write("go")
            rest = stream.rest()
        self.assert_final(d, jid, first + rest, "succeeded")

    # -- 10: data checked at submit time; a run-time failure's own words in the record

    def idx_data(self, d, name):
        """A directory of the daemon's state dir with a 64-sample IDX pair: (dir, images,
        labels)."""
        data = os.path.join(d.state_dir, name)
        os.mkdir(data)
        images, labels = os.path.join(data, "images.idx"), os.path.join(data, "labels.idx")
        write_idx(images, labels, n=64)
        return data, images, labels

    def test_10a_bad_data_is_a_400(self):
        d = self.start_daemon("--slots", "1")
        data, images, labels = self.idx_data(d, "bad-data")
        short_labels = os.path.join(data, "short-labels.idx")
        with open(short_labels, "wb") as f:
            f.write(struct.pack(">II", 0x00000801, 63) + bytes(63))
        big_labels = os.path.join(data, "big-labels.idx")
        with open(big_labels, "wb") as f:
            f.write(struct.pack(">II", 0x00000801, 64) + bytes([12] * 64))
        truncated = os.path.join(data, "truncated.idx")
        with open(images, "rb") as f, open(truncated, "wb") as g:
            g.write(f.read()[:-100])
        cifar = os.path.join(data, "batch.bin")
        with open(cifar, "wb") as f:
            f.write(bytes(3073 * 2 + 5))
        npy_x, npy_y = os.path.join(data, "x.npy"), os.path.join(data, "y.npy")
        write_npy(npy_x, "<f4", (4, 2), bytes(4 * 2 * 4))  # 4 samples of 2 features
        write_npy(npy_y, "<i8", (3,), bytes(3 * 8))  # 3 labels

        def spec(train, val=None, fmt="idx", classes=10, preset="lenet5"):
            data_ = {"format": fmt, "train": train}
            if val:
                data_["val"] = val
            return {"name": "bad", "model": {"preset": preset, "num_classes": classes},
                    "data": data_, "train": {"epochs": 1, "batch_size": 8, "threads": 1,
                                             "optimizer": {"type": "sgd", "lr": 0.01}}}
        bad_text, short_text = os.path.join(data, "bad.txt"), os.path.join(data, "short.txt")
        with open(bad_text, "wb") as f:
            f.write(b"To be,\nor \xffnot to be" * 4)
        with open(short_text, "wb") as f:
            f.write(b"To be")

        def text_spec(path):
            return {"name": "bad", "model": {"nodes": [
                {"name": "wte", "op": "embedding", "num_embeddings": 16, "embedding_dim": 4},
                {"name": "head", "op": "linear", "out_features": 16}]},
                "data": {"format": "text", "train": {"path": path}, "block_size": 8},
                "train": {"max_steps": 1, "batch_size": 2, "threads": 1,
                          "optimizer": {"type": "sgd", "lr": 0.01}}}
        missing = os.path.join(data, "missing.idx")
        cases = [
            ("a missing file", spec({"images": missing, "labels": labels}),
             "data.train.images", "cannot open"),
            ("labels given as images", spec({"images": labels, "labels": labels}),
             "data.train.images", "not an IDX image file"),
            ("images given as labels", spec({"images": images, "labels": images}),
             "data.train.labels", "not an IDX label file"),
            ("fewer labels than images", spec({"images": images, "labels": short_labels}),
             "data.train.labels", "63 labels"),
            ("a label outside num_classes", spec({"images": images, "labels": big_labels}),
             "data.train.labels", "label 12"),
            ("a truncated image file", spec({"images": truncated, "labels": labels}),
             "data.train.images", "truncated"),
            ("a bad validation file", spec({"images": images, "labels": labels},
                                           {"images": images, "labels": missing}),
             "data.val.labels", "cannot open"),
            ("a CIFAR file of the wrong size", spec({"files": [cifar]}, fmt="cifar10"),
             "data.train.files[0]", "whole number of CIFAR-10 records"),
            ("npy labels that do not match the samples",
             spec({"images": npy_x, "labels": npy_y}, fmt="npy", preset="mlp"),
             "data.train", "3 labels"),
            ("a text that is not UTF-8", text_spec(bad_text), "data.train.path",
             "line 2, column 4"),
            ("a text shorter than a window", text_spec(short_text), "data.train.path",
             "block_size"),
        ]
        for what, body, field, text in cases:
            err = self.assert_error(d.json("POST", "/v1/jobs", body), 400, "invalid_data",
                                    what=what)
            self.assertTrue(err["field"].startswith(field), f"{what}: field {err['field']}")
            self.assertIn(text, err["message"], what)
            self.assertIn(err["field"], err["message"], f"{what}: the message names the field")
        self.assertEqual(d.get_ok("/v1/jobs")["jobs"], [], "no rejected request created a job")
        job, _ = d.submit(spec({"images": images, "labels": labels}))  # the positive control
        self.assert_final(d, job["id"], d.follow(job["id"]), "succeeded")
        # and a text one: 18 characters, a language model's loss at every position
        good_text = os.path.join(data, "good.txt")
        with open(good_text, "w") as f:
            f.write("To be, or not to be: that is the question.\n" * 20)
        body = text_spec(good_text)
        body["model"]["nodes"][0]["num_embeddings"] = 8
        job, _ = d.submit(body)  # found when the worker has read the text: a failed job
        self.assert_final(d, job["id"], d.follow(job["id"]), "failed")
        self.assertIn("vocabulary has 18 tokens", d.job(job["id"])["reason"])
        body["model"]["nodes"][0]["num_embeddings"] = 18
        body["model"]["nodes"][1]["out_features"] = 18
        job, _ = d.submit(body)
        self.assert_final(d, job["id"], d.follow(job["id"]), "succeeded")
        done = [m for m in d.metrics(job["id"]) if m.get("event") == "done"]
        self.assertTrue(done and done[0]["val_loss"] > 0, "the text's last 10% validates")
        # the gpt preset with samples, over the event stream and in trainctl; the text holds a
        # terminal escape, which the prompt uses: trainctl must not pass it to the terminal
        with open(good_text, "w") as f:
            f.write("To be, or not to be:\x1b[31m that is the question.\n" * 20)
        gpt = {"name": "gpt", "model": {"preset": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 8,
                                        "block_size": 8},
               "data": {"format": "text", "train": {"path": good_text}, "block_size": 8},
               "train": {"max_steps": 4, "eval_every_steps": 2, "batch_size": 4, "threads": 1,
                         "optimizer": {"type": "adamw", "lr": 0.01}},
               "sample": {"prompt": "To\x1b[31m", "tokens": 16}}
        job, _ = d.submit(gpt)
        events = d.follow(job["id"])
        self.assert_final(d, job["id"], events, "succeeded")
        samples = [e for e in events if e.event == "sample"]
        self.assertEqual(len(samples), 2, f"steps 2 and 4: {events}")
        trainctl = os.path.join(os.path.dirname(harness.TRAIND), "trainctl")
        # on a terminal (a pty): trainctl's human view, where the escape would act
        import pty
        master, slave = pty.openpty()
        proc = subprocess.Popen([trainctl, "--url", f"http://127.0.0.1:{d.port}", "--token",
                                 d.token, "follow", str(job["id"])], stdout=slave,
                                stderr=subprocess.PIPE, env=dict(os.environ, HOME=d.state_dir))
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: trainctl exited and closed its side
                break
            if not chunk:
                break
            out += chunk
        os.close(master)
        proc.wait(timeout=60)
        err = proc.stderr.read()
        proc.stderr.close()
        self.assertIn(b'sample  step 2, after "To?[31m":', out, out + err)
        self.assertNotIn(b"\x1b[31m", out, "a job's escape never reaches the terminal")

    def test_10b_run_time_failure_reason(self):
        d = self.start_daemon("--slots", "1")
        data, images, labels = self.idx_data(d, "gz-data")
        import gzip
        with open(images, "rb") as f:
            packed = gzip.compress(f.read())
        cut = os.path.join(data, "images.idx.gz")
        with open(cut, "wb") as f:  # a gzip stream cut short: only decompressing finds it
            f.write(packed[:len(packed) // 2])
        job, _ = d.submit({"name": "gz", "model": {"preset": "lenet5", "num_classes": 10},
                           "data": {"format": "idx", "train": {"images": cut, "labels": labels}},
                           "train": {"epochs": 1, "batch_size": 8, "threads": 1,
                                     "optimizer": {"type": "sgd", "lr": 0.01}}})
        events = d.follow(job["id"])
        job = self.assert_final(d, job["id"], events, "failed")
        for where, reason in (("job", job["reason"]), ("attempt", job["attempts"][0]["reason"]),
                              ("state event", events[-1].data["reason"])):
            self.assertIn("truncated", reason, f"the {where}'s reason has the worker's message")
            self.assertIn(cut, reason, f"the {where}'s reason names the file")
            self.assertIn("exit code 1", reason)

    # -- 11: every file of a checkpoint, and the whole as a tar

    def assert_checkpoint_downloads(self, d, jid, ckpt, on_disk):
        """Every listed file of `ckpt` downloads as the bytes in `on_disk` (a directory or a
        file); the .tar holds the same files."""
        import tarfile
        import io
        expect = {}
        if os.path.isdir(on_disk):
            for root, _, names in os.walk(on_disk):
                for n in names:
                    full = os.path.join(root, n)
                    with open(full, "rb") as f:
                        expect[os.path.relpath(full, on_disk)] = f.read()
        else:
            with open(on_disk, "rb") as f:
                expect[os.path.basename(on_disk)] = f.read()
        self.assertEqual(sorted(f["name"] for f in ckpt["files"]), sorted(expect))
        for f in ckpt["files"]:
            status, _, body = d.request("GET", f["url"])
            self.assertEqual(status, 200, f["url"])
            self.assertEqual(body, expect[f["name"]], f"{f['url']} is the file on disk")
            self.assertEqual(f["size"], len(body))
        status, hdrs, body = d.request("GET", ckpt["archive_url"])
        self.assertEqual(status, 200, ckpt["archive_url"])
        self.assertEqual(hdrs.get("content-type"), "application/x-tar")
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        top = os.path.basename(on_disk) + "/" if os.path.isdir(on_disk) else ""
        self.assertEqual(members, {top + k: v for k, v in expect.items()})

    def test_11_checkpoint_files(self):
        d = self.start_daemon("--slots", "1")
        job, _ = d.submit(train_spec("files", epochs=1))
        jid = job["id"]
        self.assert_final(d, jid, d.follow(jid), "succeeded")
        ckpts = d.get_ok(f"/v1/jobs/{jid}/checkpoints")
        root = os.path.join(d.state_dir, "jobs", str(jid), "checkpoints")
        for c in ckpts:
            self.assertTrue(c["on_disk"])
            self.assert_checkpoint_downloads(d, jid, c, os.path.join(root, f"step-{c['step']:08d}"))
        one = d.get_ok(f"/v1/jobs/{jid}/checkpoints/{ckpts[0]['step']}")
        self.assertEqual(one, ckpts[0], "one checkpoint's object is its list entry")
        state = [f["url"] for f in ckpts[-1]["files"] if f["name"] == "state.json"][0]
        status, hdrs, part = d.request("GET", state, headers={"Range": "bytes=0-0"})
        self.assertEqual((status, part), (206, b"{"), "Range works on every file")
        for bad in ("../../token", "..", "nope.bin", "model.safetensors/x", "/etc/passwd"):
            self.assert_error(d.json("GET", f"/v1/jobs/{jid}/checkpoints/32/{bad}"), 404,
                              "not_found", what=f"file {bad!r}")
        self.assert_error(d.json("GET", f"/v1/jobs/{jid}/checkpoints/7.tar"), 404, "not_found",
                          what="the archive of a step without a checkpoint")

        # a command job's own checkpoints: a directory (with a subdirectory) and a single file
        code = ("import json, os\n"
                "os.makedirs('ck/step-3/extra')\n"
                "open('ck/step-3/weights.pt', 'wb').write(b'w' * 1000)\n"
                "open('ck/step-3/extra/notes.txt', 'w').write('hello')\n"
                "print(json.dumps({'event': 'checkpoint', 'step': 3, 'path': 'ck/step-3'}))\n"
                "open('final.pt', 'wb').write(bytes(range(256)) * 4)\n"
                "print(json.dumps({'event': 'checkpoint', 'step': 5, "
                "'path': os.path.abspath('final.pt')}))\n")
        job, _ = d.submit({"name": "cmd-ckpt", "command": ["/usr/bin/python3", "-c", code]})
        cid = job["id"]
        events = d.follow(cid)
        self.assert_final(d, cid, events, "succeeded")
        self.assertEqual([e.data["size"] for e in events if e.event == "checkpoint"],
                         [1005, 1024])
        job_dir = os.path.join(d.state_dir, "jobs", str(cid))
        # a root daemon runs jobs as run_as (nobody here), in a directory of theirs
        cwd = os.path.join(job_dir, "work") if os.geteuid() == 0 else job_dir
        self.assertEqual([e.data["path"] for e in events if e.event == "checkpoint"],
                         [os.path.join(cwd, "ck", "step-3"), os.path.join(cwd, "final.pt")],
                         "a relative path is the processes' directory's")
        ckpts = d.get_ok(f"/v1/jobs/{cid}/checkpoints")
        self.assertEqual([c["step"] for c in ckpts], [3, 5])
        self.assert_checkpoint_downloads(d, cid, ckpts[0], os.path.join(cwd, "ck", "step-3"))
        self.assert_checkpoint_downloads(d, cid, ckpts[1], os.path.join(cwd, "final.pt"))
        self.assertIsNone(ckpts[0]["url"], "no model.safetensors in a command's checkpoint")

    # -- 12: priority and backfill

    def wait_state(self, d, jid, state):
        with d.events(jid) as stream:
            stream.until(lambda e: e.event == "state" and e.data.get("state") == state,
                         f"job {jid} {state}")

    def test_12_priority_and_backfill(self):
        d = self.start_daemon("--slots", "3", "--grace", "2")
        a, _ = d.submit(train_spec("a", epochs=1000, nproc=2, checkpoint=False))
        self.wait_state(d, a["id"], "running")
        b, _ = d.submit(train_spec("b", epochs=1000, nproc=2, checkpoint=False))
        c, _ = d.submit(train_spec("c", epochs=1000, nproc=1, checkpoint=False))
        # c fits the free slot, and b (2 slots) could not use it even when a ends: backfilled
        self.wait_state(d, c["id"], "running")
        self.assertEqual(d.job(b["id"])["state"], "queued")

        e_low, _ = d.submit(train_spec("d", epochs=1000, nproc=1, checkpoint=False))
        spec = train_spec("e", epochs=1000, nproc=1, checkpoint=False)
        spec["priority"] = 5
        e_high, _ = d.submit(spec)
        self.assertEqual(e_high["priority"], 5)
        self.assertEqual(d.job(e_low["id"])["state"], "queued", "no slot is free")
        status, _, _ = d.json("POST", f"/v1/jobs/{a['id']}/cancel")
        self.assertEqual(status, 200)
        # two slots free: e (priority 5) goes first, then b needs 2 of the 1 left and holds its
        # place; d (1 slot) would delay b, so it waits although a slot is idle
        self.wait_state(d, e_high["id"], "running")
        self.assertEqual(d.job(b["id"])["state"], "queued")
        self.assertEqual(d.job(e_low["id"])["state"], "queued",
                         "backfill must not delay the head of the queue")
        # a queued job says what it waits for
        self.assertEqual(d.job(b["id"])["reason"],
                         "waits for 2 free slots: 1 of 3 are free, the rest held by 2 running jobs")
        self.assertEqual(d.job(e_low["id"])["reason"],
                         f"waits behind job {b['id']}, first in the queue (submitted earlier); "
                         "starting now could delay that job (it could start first with a "
                         "time_limit_s that ends before that job can start)")
        listing = d.get_ok("/v1/jobs?state=queued")["jobs"]
        self.assertEqual({j["id"] for j in listing}, {b["id"], e_low["id"]})
        for job in (b, c, e_low, e_high):
            status, _, _ = d.json("POST", f"/v1/jobs/{job['id']}/cancel")
            self.assertEqual(status, 200)

    def test_12c_backfill_by_time_limit(self):
        d = self.start_daemon("--slots", "2", "--grace", "2")
        def limited(name, nproc, limit):
            spec = train_spec(name, epochs=1000, checkpoint=False)
            spec["resources"] = {"nproc": nproc, "time_limit_s": limit}
            return spec
        a, _ = d.submit(limited("a", 1, 600))
        self.wait_state(d, a["id"], "running")
        b, _ = d.submit(train_spec("b", epochs=1000, nproc=2, checkpoint=False))
        # b can start when a's limit ends, in 600 s at the latest: a job whose own limit ends
        # later could delay it, one whose limit ends sooner cannot
        late, _ = d.submit(limited("late", 1, 900))
        soon, _ = d.submit(limited("soon", 1, 300))
        self.wait_state(d, soon["id"], "running")
        self.assertEqual(d.job(late["id"])["state"], "queued", "it would end after b's start")
        self.assertEqual(d.job(b["id"])["state"], "queued")
        for job in (a, b, late, soon):
            status, _, _ = d.json("POST", f"/v1/jobs/{job['id']}/cancel")
            self.assertEqual(status, 200)

    def test_12b_time_limit(self):
        d = self.start_daemon("--slots", "2", "--grace", "2")
        spec = train_spec("limited", epochs=1000, checkpoint=False)
        spec["resources"] = {"time_limit_s": 1}
        job, _ = d.submit(spec)
        self.assertEqual(job["time_limit_s"], 1)
        events = d.follow(job["id"])
        job = self.assert_final(d, job["id"], events, "failed")
        self.assertIn("time limit", job["reason"])
        self.assertIn("train", [e.event for e in events], "it ran before its limit")
        self.assert_error(d.json("POST", "/v1/jobs", dict(spec, resources={"time_limit_s": 0})),
                          400, "invalid_spec", "resources.time_limit_s")

    # -- 13: what the records say

    def test_13a_killed_after_grace_records_137(self):
        d = self.start_daemon("--slots", "1", "--grace", "1")
        code = ("import json, signal, select\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print(json.dumps({'event': 'ready', 'step': 0}), flush=True)\n"
                "select.select([], [], [])\n")
        job, _ = d.submit({"name": "stubborn", "command": ["/usr/bin/python3", "-c", code]})
        self.wait_state(d, job["id"], "running")
        with d.events(job["id"]) as stream:
            stream.until(lambda e: e.event == "ready", "the script's ready line")
        status, _, job = d.json("POST", f"/v1/jobs/{job['id']}/cancel")
        self.assertEqual(status, 200, job)
        self.assertEqual(job["state"], "cancelled")
        attempt = job["attempts"][0]
        self.assertEqual(attempt["exit_code"], 137, attempt)
        self.assertEqual(job["exit_code"], 137, job)
        self.assertIn("grace period", attempt["reason"])
        self.assertIn("SIGKILL", job["reason"])

    def test_13b_records(self):
        d = self.start_daemon("--slots", "2")
        # a command that fails on its first attempt, before any checkpoint: it starts over
        code = ("import json, os, sys\n"
                "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
                "    print('ValueError: the first attempt fails', file=sys.stderr)\n"
                "    sys.exit(3)\n"
                "for e in ('train', 'eval', 'done'):\n"
                "    print(json.dumps({'event': e, 'step': 5, 'value': 1}))\n"
                "print(json.dumps({'event': 'note', 'text': 'no step'}))\n")
        job, _ = d.submit({"name": "records", "command": ["/usr/bin/python3", "-c", code],
                           "restart": {"max_restarts": 1}})
        events = d.follow(job["id"])
        job = self.assert_final(d, job["id"], events, "succeeded")
        (restart,) = [e.data for e in events if e.event == "restart"]
        self.assertIn("starts again from its beginning in the same working directory",
                      restart["reason"])
        self.assertIsNone(restart["resume_from"])
        self.assertIn("ValueError: the first attempt fails", job["attempts"][0]["reason"],
                      "a command's last words are in its failed attempt's reason")
        self.assertEqual(job["attempts"][0]["exit_code"], 3)
        metrics = d.metrics(job["id"])
        self.assertEqual([m["event"] for m in metrics], ["train", "eval", "done", "note"],
                         "events of one step in the order they happened")
        note = [e.data for e in events if e.event == "note"][0]
        self.assertEqual(note["step"], 5, "an event without a step takes the latest step")
        self.assertEqual(metrics[-1], note)

        err = self.assert_error(d.json("POST", "/v1/jobs", dict(train_spec("x"), bogus=1)), 400,
                                "invalid_spec", "bogus")
        for key in ("model", "data", "train", "resources", "restart", "priority", "command",
                    "env"):
            self.assertIn(key, err["message"], "the unknown-key error lists every allowed key")

    def test_13c_command_after_daemon_restart(self):
        """A command job (any program) is re-attached too: it goes on where it was, its lines
        read from where the killed daemon left off."""
        state = self.new_state_dir()
        d1 = self.start_daemon("--slots", "1", state_dir=state)
        fifo = os.path.join(state, "hold")
        os.mkfifo(fifo)
        code = ("import json, os\n"
                "print(json.dumps({'event': 'started', 'step': 0}), flush=True)\n"
                f"open({fifo!r}).read()\n"
                "print(json.dumps({'event': 'released', 'step': 1}), flush=True)\n")
        job, _ = d1.submit({"name": "cmd", "command": ["/usr/bin/python3", "-c", code]})
        with d1.events(job["id"]) as stream:
            stream.until(lambda e: e.event == "started", "the command's first line")
        procs = d1.kill()
        d2 = self.start_daemon("--slots", "1", state_dir=state)
        self.assertTrue(procs & d2.job_processes(), "the command still runs")
        with open(fifo, "w") as f:
            f.write("go")
        events = d2.follow(job["id"])
        self.assert_final(d2, job["id"], events, "succeeded")
        names = [e.event for e in events]
        self.assertEqual((names.count("started"), names.count("released")), (1, 1), names)
        self.assertNotIn("restart", names)

    # -- 13d: draining the node

    def test_13d_drain_holds_the_queue_and_survives_a_restart(self):
        state = self.new_state_dir()
        d = self.start_daemon("--slots", "2", "--grace", "2", "--node-name", "solo",
                              state_dir=state)
        nodes = d.get_ok("/v1/nodes")["nodes"]
        self.assertEqual([(n["name"], n["role"], n["state"]) for n in nodes],
                         [("solo", "master", "ready")], "a lone traind: a one-node cluster")
        a, _ = d.submit(train_spec("a", epochs=1000, nproc=1, checkpoint=False))
        self.wait_state(d, a["id"], "running")
        status, _, node = d.json("POST", "/v1/nodes/solo/drain")
        self.assertEqual((status, node["state"]), (200, "draining"))
        b, _ = d.submit(train_spec("b", epochs=1000, nproc=1, checkpoint=False))
        # a runs on; b fits the free slot but waits: the cancel below frees a's slot too and
        # the queue is looked at again, and still nothing starts
        self.assertEqual(d.job(a["id"])["state"], "running")
        status, _, _ = d.json("POST", f"/v1/jobs/{a['id']}/cancel")
        self.assertEqual(status, 200)
        self.assertEqual(d.job(b["id"])["state"], "queued", "a drained node starts nothing")
        self.assertIn("waits for this node (solo) to be undrained (POST /v1/nodes/solo/undrain)",
                      d.job(b["id"])["reason"])
        self.assertEqual(d.get_ok("/v1/nodes")["nodes"][0]["state"], "draining")

        # drained is kept: a restarted daemon still is, and says so
        self.assertEqual(d.kill(), set(), "nothing ran")
        d = self.start_daemon("--slots", "2", "--grace", "2", "--node-name", "solo",
                              state_dir=state)
        self.assertEqual(d.get_ok("/v1/nodes")["nodes"][0]["state"], "draining")
        self.assertEqual(d.job(b["id"])["state"], "queued")
        status, _, node = d.json("POST", "/v1/nodes/solo/undrain")
        self.assertEqual((status, node["state"]), (200, "ready"))
        self.wait_state(d, b["id"], "running")
        self.assertTrue(any("node solo is drained: no job starts here" in l
                            for l in d.stderr_lines), d.stderr_tail())

        status, _, err = d.json("POST", "/v1/nodes/nobody/drain")
        self.assertEqual((status, err["error"]["code"]), (404, "not_found"))
        self.assertIn("nobody", err["error"]["message"])
        status, _, err = d.json("POST", "/v1/nodes/solo/explode")
        self.assertEqual(status, 404)
        status, _, _ = d.json("POST", f"/v1/jobs/{b['id']}/cancel")
        self.assertEqual(status, 200)

    # -- 14: DELETE

    def test_14_delete(self):
        d = self.start_daemon("--slots", "1")
        job, _ = d.submit(train_spec("doomed", epochs=1))
        jid = job["id"]
        job_dir = os.path.join(d.state_dir, "jobs", str(jid))
        running, _ = d.submit(train_spec("busy", epochs=1000, checkpoint=False))
        self.assert_final(d, jid, d.follow(jid), "succeeded")
        self.assertTrue(os.path.isdir(job_dir))
        self.wait_state(d, running["id"], "running")
        self.assert_error(d.json("DELETE", f"/v1/jobs/{running['id']}"), 409, "conflict",
                          what="deleting a running job")
        status, _, body = d.request("DELETE", f"/v1/jobs/{jid}")
        self.assertEqual((status, body), (204, b""))
        self.assertFalse(os.path.exists(job_dir), "the job's directory is gone")
        self.assert_error(d.json("GET", f"/v1/jobs/{jid}"), 404, "not_found", what="deleted")
        for sub in ("events", "metrics", "checkpoints"):
            self.assert_error(d.json("GET", f"/v1/jobs/{jid}/{sub}"), 404, "not_found",
                              what=f"deleted job's {sub}")
        self.assertNotIn(jid, [j["id"] for j in d.get_ok("/v1/jobs")["jobs"]])
        self.assert_error(d.json("DELETE", f"/v1/jobs/{jid}"), 404, "not_found",
                          what="deleting twice")
        status, _, _ = d.json("POST", f"/v1/jobs/{running['id']}/cancel")
        self.assertEqual(status, 200)
        again, _ = d.submit(train_spec("next", epochs=1, checkpoint=False))
        self.assertGreater(again["id"], running["id"], "ids are never reused")

    # -- 15: the token is never logged

    def test_15_token_not_logged(self):
        d = self.start_daemon("--slots", "1")
        job, _ = d.submit(train_spec("quiet", epochs=1))
        self.assert_final(d, job["id"], d.follow(job["id"]), "succeeded")
        log = d.stderr_tail(100000)
        self.assertNotIn(d.token, log, "the daemon's log shows the token")
        self.assertIn(os.path.join(d.state_dir, "token"), log, "the log names the token file")
        _, worker_log = d.logs(job["id"])
        self.assertNotIn(d.token, worker_log)

    # -- 16: the config file

    def test_16_config_file(self):
        state = self.new_state_dir()
        config = os.path.join(state, "traind.json")
        for body, key in (('{"slots": 0}', "slots"), ('{"slotz": 2}', "slotz"),
                          ('{"data_roots": ["/tmp", 3]}', "data_roots[1]"),
                          ('{"grace_s": "x"}', "grace_s"), ('{"slots": 2,}', ":1:")):
            with open(config, "w") as f:
                f.write(body)
            code, err = self.run_second_traind("--listen", "127.0.0.1:0", "--state-dir", state,
                                               "--config", config)
            self.assertEqual(code, 2, f"{body}: {err}")
            self.assertIn(config, err, f"{body}: the message names the file")
            self.assertIn(key, err, f"{body}: the message names the member")
        with open(config, "w") as f:
            json.dump({"slots": 3, "grace_s": 1, "listen": "127.0.0.1:1"}, f)
        d = self.start_daemon("--config", config, state_dir=state)  # its --listen wins
        self.assertIn("traind: 3 CPU slots", d.stderr_tail(), "slots from the file")

def main():
    if len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} TRAIND_BINARY SOURCE_DIR [unittest options]")
    harness.TRAIND = os.path.realpath(sys.argv[1])
    harness.SOURCE_DIR = os.path.realpath(sys.argv[2])
    for path in (harness.TRAIND, os.path.join(os.path.dirname(harness.TRAIND), "traind-worker")):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path}: not an executable")
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)


if __name__ == "__main__":
    main()
