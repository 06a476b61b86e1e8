#!/usr/bin/python3
"""Users' scripts as they are (issue "Users' PyTorch scripts"), against a real traind:
- a legacy torch.distributed.launch script reads --local_rank from its arguments, in either
  spelling, and gets local ranks 0 and 1;
- GPU placement on declared GPUs (--gpus on a machine without any): two 2-process jobs get
  disjoint CUDA_VISIBLE_DEVICES, one id each; a job that needs more GPUs than are free waits;
  freed GPUs are used again; gpus_per_proc gives a DataParallel-style process all four, and two
  processes two each; a "launch": "self" job gets them all in its one process;
- an mp.spawn gloo script (as the tutorials write it, CPU) started as one process that spawns
  2 children trains, its metrics arrive, and cancelling it leaves none of its children alive,
  also when they are stuck and ignore SIGTERM and SIGINT;
- an nn.DataParallel script on CPU runs as a one-process job.
Each test reads the environment the processes actually saw.

    /usr/bin/python3 tests/integration/scripts_test.py TRAIND SOURCE_DIR [TEST_NAME...]"""
import json
import os
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402


def command(name, argv, nproc, **extra):
    spec = {"name": name, "command": argv, "resources": {"nproc": nproc},
            "env": {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}}
    spec.update(extra)
    return spec


class ScriptsTest(harness.DaemonTest):
    def run_job(self, d, spec):
        status, _, job = d.json("POST", "/v1/jobs", spec)
        self.assertEqual(status, 201, job)
        events = d.follow(job["id"])
        self.assertEqual(events[-1].data["state"], "succeeded",
                         d.request("GET", f"/v1/jobs/{job['id']}/logs?rank=1")[2][-800:])
        return job["id"], d.json("GET", f"/v1/jobs/{job['id']}/metrics")[2]

    def test_a_legacy_local_rank_argument(self):
        d = self.start_daemon("--slots", "2")
        script = os.path.join(HERE, "legacy_launch.py")
        for spelling in (True, "--local-rank"):
            _, metrics = self.run_job(d, command("legacy", ["/usr/bin/python3", script], 2,
                                                 local_rank_arg=spelling))
            seen = next(m["seen"] for m in metrics if m["event"] == "ranks")
            self.assertEqual(seen, [[0, 0, 2], [1, 1, 2]], f"local_rank_arg {spelling!r}")
        status, _, body = d.json("POST", "/v1/jobs", command("bad", ["true"], 1,
                                                              local_rank_arg="--rank"))
        self.assertEqual((status, body["error"]["field"]), (400, "local_rank_arg"))

    def test_b_declared_gpus(self):
        d = self.start_daemon("--gpus", "0,1,2,3", "--grace", "2")
        status, _, nodes = d.json("GET", "/v1/nodes")
        self.assertEqual([g["index"] for g in nodes["nodes"][0]["gpus"]], [0, 1, 2, 3])
        self.assertEqual(nodes["nodes"][0]["slots"]["total"], 4)
        # each process writes the GPUs it was given, then waits for a file; in a directory
        # anyone may write, as a root daemon runs jobs as another user (run_as)
        shared = os.path.join(d.state_dir, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o777)
        gate = os.path.join(shared, "gate")
        hold = ["/bin/sh", "-c",
                'echo "{\\"event\\": \\"gpus\\", \\"rank\\": $RANK, \\"cvd\\": \\"$CUDA_VISIBLE_DEVICES\\"}" '
                '>&2; f="$0.$TRAIND_JOB_ID.$RANK"; echo "$RANK=$CUDA_VISIBLE_DEVICES" > "$f.tmp"; '
                'mv "$f.tmp" "$f"; '
                'while [ ! -e "$0" ]; do sleep 0.05; done', gate]

        def seen(jid, rank):
            path = f"{gate}.{jid}.{rank}"
            return open(path).read().strip().split("=")[1] if os.path.exists(path) else None

        def submitted(name, nproc):
            status, _, job = d.json("POST", "/v1/jobs", command(name, hold, nproc))
            self.assertEqual(status, 201, job)
            return job["id"]

        a, b = submitted("a", 2), submitted("b", 2)
        got = {}
        for jid in (a, b):
            for r in (0, 1):
                got[(jid, r)] = harness.wait_for(lambda: seen(jid, r), f"job {jid} rank {r}")
        ids = sorted(got.values())
        self.assertEqual(ids, ["0", "1", "2", "3"], "disjoint, one GPU a process")
        # GET /v1/nodes says which process holds each GPU, as the processes saw it
        gpus = d.json("GET", "/v1/nodes")[2]["nodes"][0]["gpus"]
        held = {str(g["index"]): (g["used_by"]["job"], g["used_by"]["ranks"]) for g in gpus}
        self.assertEqual(held, {cvd: (jid, [r]) for (jid, r), cvd in got.items()})
        c = submitted("c", 1)  # no GPU left: it waits
        self.assertEqual(d.json("GET", f"/v1/jobs/{c}")[2]["state"], "queued")
        open(gate, "w").close()  # a and b end; c gets a freed GPU
        for jid in (a, b):
            self.assertEqual(d.follow(jid)[-1].data["state"], "succeeded")
        self.assertEqual(d.follow(c)[-1].data["state"], "succeeded")
        self.assertIn(seen(c, 0), ids)

    def test_c_spawn(self):
        d = self.start_daemon("--slots", "2")
        script = os.path.join(HERE, "spawn_ddp.py")
        jid, metrics = self.run_job(d, command("spawn", ["/usr/bin/python3", script], 2,
                                               launch="self"))
        seen = next(m["seen"] for m in metrics if m["event"] == "ranks")
        # [rank, local_rank, node_rank, world, CUDA_VISIBLE_DEVICES, pid]: two children of one
        self.assertEqual([s[:4] for s in seen], [[0, 0, 0, 2], [1, 1, 0, 2]])
        self.assertNotEqual(seen[0][5], seen[1][5])
        losses = [m["loss"] for m in metrics if m["event"] == "train"]
        self.assertEqual(len(losses), 20)
        self.assertLess(losses[-1], losses[0] / 2, "it trains")
        job = d.json("GET", f"/v1/jobs/{jid}")[2]
        self.assertEqual(job["launch"], "self")
        procs = job["placement"]["nodes"][0]["processes"]
        self.assertEqual([p["ranks"] for p in procs], [[0, 1]], "one process stands for both")
        # one log: the launching process's, which its children write into too
        status, _, body = d.json("GET", f"/v1/jobs/{jid}/logs?rank=1")
        self.assertEqual((status, body["error"]["field"]), (404, "rank"), body)
        self.assertIn("ask for rank 0", body["error"]["message"])
        for bad, field in (({"launch": "spawn"}, "launch"),
                           ({"launch": "self", "local_rank_arg": True}, "local_rank_arg")):
            status, _, body = d.json("POST", "/v1/jobs", command("bad", ["true"], 1, **bad))
            self.assertEqual((status, body["error"]["field"]), (400, field), body)

    def test_d_spawn_cancel_leaves_no_child(self):
        d = self.start_daemon("--slots", "2", "--grace", "2")
        script = os.path.join(HERE, "spawn_ddp.py")
        # as written, and with children stuck in a sleep that ignore SIGTERM and SIGINT (torch's
        # spawn sends its children SIGINT when their parent dies): only the daemon's sweep of
        # the job's process group stops those
        for ignore in ("0", "1"):
            pids = os.path.join(d.state_dir, f"pids-{ignore}")
            os.mkdir(pids)
            os.chmod(pids, 0o777)  # the job's processes run as run_as (not root) and write here
            spec = command("spawn-hold", ["/usr/bin/python3", script], 2, launch="self")
            spec["env"].update(SPAWN_HOLD="1", SPAWN_PID_DIR=pids, SPAWN_STUCK=ignore)
            status, _, job = d.json("POST", "/v1/jobs", spec)
            self.assertEqual(status, 201, job)
            stream = d.events(job["id"])
            self.addCleanup(stream.close)
            stream.until(lambda e: e.event == "train", "the first train event")
            children = [int(open(os.path.join(pids, f"{r}.pid")).read()) for r in (0, 1)]
            self.assertTrue(all(alive(p) for p in children))
            status, _, body = d.json("POST", f"/v1/jobs/{job['id']}/cancel")
            self.assertEqual(status, 200, body)
            self.assertEqual(d.follow(job["id"])[-1].data["state"], "cancelled")
            harness.wait_for(lambda: not any(alive(p) for p in children),
                             f"the children {children} to end (stuck: {ignore})",
                             timeout=10)

    def test_e_dataparallel_cpu(self):
        d = self.start_daemon("--slots", "2")
        script = os.path.join(HERE, "dataparallel_train.py")
        _, metrics = self.run_job(d, command("dataparallel", ["/usr/bin/python3", script], 1))
        env = next(m for m in metrics if m["event"] == "env")
        self.assertEqual((env["wrapped"], env["gpus"]), (True, 0))
        self.assertEqual((env["vars"]["WORLD_SIZE"], env["vars"]["RANK"]), ("1", "0"))
        losses = [m["loss"] for m in metrics if m["event"] == "train"]
        self.assertEqual(len(losses), 30)
        self.assertLess(losses[-1], losses[0] / 2, "it trains")

    def test_e2_torchrun_error_file(self):
        """PyTorch's launcher test script as a command job: every torchrun variable is there
        (a KeyError otherwise), and a rank's exception, written by @record into its
        TORCHELASTIC_ERROR_FILE, becomes the job's and the attempt's reason (the rank's last
        log line is another)."""
        d = self.start_daemon("--slots", "2")
        script = os.path.join(harness.SOURCE_DIR, "tests/integration/torchrun/env_script.py")
        status, _, job = d.json("POST", "/v1/jobs", command("env", ["/usr/bin/python3", script], 2))
        self.assertEqual(status, 201, job)
        self.assertEqual(d.follow(job["id"])[-1].data["state"], "succeeded",
                         d.request("GET", f"/v1/jobs/{job['id']}/logs?rank=0")[2][-800:])
        log = d.request("GET", f"/v1/jobs/{job['id']}/logs?rank=1")[2].decode()
        self.assertIn("/work/.torchelastic/attempt_0/1/error.json", log)
        status, _, job = d.json("POST", "/v1/jobs", command(
            "fail", ["/usr/bin/python3", script, "--fail"], 2))
        self.assertEqual(d.follow(job["id"])[-1].data["state"], "failed")
        job = d.json("GET", f"/v1/jobs/{job['id']}")[2]
        want = "failed with exit code 1: RuntimeError: rank 1 was asked to fail"
        self.assertIn(want, job["reason"])
        self.assertIn(want, job["attempts"][0]["reason"])
        # the error file is the job's: one that is a link to a file of the daemon's is not read
        secret = os.path.join(d.state_dir, "secret.json")
        with open(secret, "w") as f:
            json.dump({"message": "SECRET of the daemon"}, f)
        os.chmod(secret, 0o600)
        status, _, job = d.json("POST", "/v1/jobs", command(
            "link", ["sh", "-c", f'ln -sf {secret} "$TORCHELASTIC_ERROR_FILE"; exit 3'], 1))
        self.assertEqual(d.follow(job["id"])[-1].data["state"], "failed")
        job = d.json("GET", f"/v1/jobs/{job['id']}")[2]
        self.assertIn("failed with exit code 3", job["reason"])
        self.assertNotIn("SECRET", job["reason"])

    def test_e3_metric_patterns(self):
        """A script that prints text, not JSON: metrics.patterns turns its lines into metrics
        (named groups, numbers as numbers, step from the pattern or counted); a bad pattern is
        refused naming it; a pattern that backtracks without end on a line costs a bounded
        match, not the shepherd."""
        d = self.start_daemon("--slots", "1")
        text = ("import sys\n"
                "for e in range(1, 4):\n"
                "    print(f'Epoch {e} | train loss {1.0 / e:.4f} | lr 0.05', flush=True)\n"
                "    print(f'[eval] step {e * 100} val_loss {2.0 / e:.3f}', flush=True)\n"
                "print('a' * 3000 + '!', flush=True)\n")
        spec = command("text", ["/usr/bin/python3", "-c", text], 1, metrics={"patterns": [
            r"Epoch (?<epoch>\d+) \| train loss (?<loss>[\d.]+) \| lr (?<lr>\S+)",
            {"regex": r"^\[eval\] step (?<step>\d+) val_loss (?<val_loss>[\d.]+)",
             "event": "eval"},
            r"^(?<slow>(a+)+)$"]})
        jid, metrics = self.run_job(d, spec)
        train = [m for m in metrics if m["event"] == "train"]
        self.assertEqual([(m["step"], m["epoch"], m["loss"], m["lr"]) for m in train],
                         [(1, 1, 1.0, 0.05), (2, 2, 0.5, 0.05), (3, 3, 0.3333, 0.05)])
        evals = [(m["step"], m["val_loss"]) for m in metrics if m["event"] == "eval"]
        self.assertEqual(evals, [(100, 2.0), (200, 1.0), (300, 0.667)])
        self.assertFalse([m for m in metrics if "slow" in m])
        for bad, field, words in (
                (["(?<x>"], "metrics.patterns[0]", "not a regular expression: missing closing"),
                (["loss ([0-9.]+)"], "metrics.patterns[0]", "no named group"),
                (["(?<a>x)", {"regex": "(?<b>y)", "event": "state"}], "metrics.patterns[1]",
                 'event: expected "train" or "eval"'),
                ([], "metrics.patterns", "expected an array of 1 to 16 patterns")):
            status, _, body = d.json("POST", "/v1/jobs", command("bad", ["true"], 1,
                                                                  metrics={"patterns": bad}))
            self.assertEqual((status, body["error"]["field"]), (400, field), body)
            self.assertIn(words, body["error"]["message"])

    def test_e4_summary_writer(self):
        """A script that logs with SummaryWriter (as it is: add_scalar into runs/): its scalars
        are the job's metrics, tag and step kept; a restart does not report the last attempt's
        again; a runs/ that is a link to files the job may not read is not followed."""
        d = self.start_daemon("--slots", "1")
        text = ("import os\n"
                "try:\n"
                "    from torch.utils.tensorboard import SummaryWriter\n"
                "except ImportError:  # Debian 12 has no tensorboard package\n"
                "    from summary_writer import SummaryWriter\n"
                "first = os.environ['TORCHELASTIC_RESTART_COUNT'] == '0'\n"
                "writer = SummaryWriter()\n"
                "for step in (range(0, 3) if first else range(3, 5)):\n"
                "    writer.add_scalar('Loss/train', 1.0 / (step + 1), step)\n"
                "    writer.add_scalar('Accuracy/test', step / 8, step)\n"
                "writer.close()\n"
                "raise SystemExit(1 if first else 0)\n")
        env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": HERE}
        _, metrics = self.run_job(d, command("tb", ["/usr/bin/python3", "-c", text], 1, env=env,
                                             restart={"max_restarts": 1}))
        loss = [(m["step"], m["Loss/train"]) for m in metrics if "Loss/train" in m]
        f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]  # noqa: E731 (as stored)
        self.assertEqual(loss, [(s, f32(1.0 / (s + 1))) for s in range(5)])
        acc = [(m["step"], m["Accuracy/test"]) for m in metrics if "Accuracy/test" in m]
        self.assertEqual(acc, [(s, f32(s / 8)) for s in range(5)])
        self.assertTrue(all(m["event"] == "train" for m in metrics if "Loss/train" in m))
        # a link in the job's place: the daemon's own event file is not read through it
        secret = os.path.join(d.state_dir, "secret-runs")
        os.mkdir(secret, 0o700)
        sys.path.insert(0, HERE)
        import summary_writer  # noqa: E402
        w = summary_writer.SummaryWriter(secret)
        w.add_scalar("SECRET", 1.0, 1)
        w.close()
        link = f"import os\nos.symlink({secret!r}, 'runs')\n"
        _, metrics = self.run_job(d, command("link", ["/usr/bin/python3", "-c", link], 1))
        self.assertFalse([m for m in metrics if "SECRET" in m], metrics)
        status, _, body = d.json("POST", "/v1/jobs", command(
            "bad", ["true"], 1, metrics={"tensorboard_dir": "../other"}))
        self.assertEqual((status, body["error"]["field"]), (400, "metrics.tensorboard_dir"))

    def test_e5_cwd(self):
        """cwd: a command starts where the job says (in a data root: the same files on every
        node), so a script that resumes from its own snapshot finds it after a restart; a cwd
        outside the data roots, or climbing out of the work directory, is refused; one the job
        may not enter fails its start, saying so."""
        root = self.new_state_dir()
        os.chmod(root, 0o755)
        shared = os.path.join(root, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)  # jobs run as uids of their own
        d = self.start_daemon("--slots", "1", "--data-root", root)
        code = ("import json, os\n"
                "if os.path.exists('snapshot'):\n"
                "    print(json.dumps({'event': 'resumed', 'step': 1,"
                " 'epoch': int(open('snapshot').read()), 'cwd': os.getcwd()}))\n"
                "else:\n"
                "    open('snapshot', 'w').write('7')\n"
                "    raise SystemExit(1)\n")
        _, metrics = self.run_job(d, command("resume", ["/usr/bin/python3", "-c", code], 1,
                                             cwd=shared, restart={"max_restarts": 1}))
        resumed = [m for m in metrics if m["event"] == "resumed"]
        self.assertEqual([(m["epoch"], m["cwd"]) for m in resumed], [(7, shared)])
        # relative: below the job's own work directory, made for it
        _, metrics = self.run_job(d, command("rel", ["/usr/bin/python3", "-c",
                                                     "import json, os\n"
                                                     "print(json.dumps({'event': 'at', "
                                                     "'cwd': os.getcwd()}))\n"], 1,
                                             cwd="runs/a"))
        (at,) = [m["cwd"] for m in metrics if m["event"] == "at"]
        self.assertTrue(at.endswith("/work/runs/a") or at.endswith("/runs/a"), at)
        for bad, words in (("/etc", "is not inside a data root"),
                           ("../x", "plain names"), ("", "expected a directory path")):
            status, _, body = d.json("POST", "/v1/jobs", command("bad", ["true"], 1, cwd=bad))
            self.assertEqual((status, body["error"]["field"]), (400, "cwd"), body)
            self.assertIn(words, body["error"]["message"])
        # inside a data root, but not the job's to enter: the start fails, naming it
        closed = os.path.join(root, "closed")
        os.mkdir(closed, 0o700)
        status, _, job = d.json("POST", "/v1/jobs", command("closed", ["true"], 1, cwd=closed))
        self.assertEqual(status, 201, job)
        self.assertEqual(d.follow(job["id"])[-1].data["state"], "failed")
        job = d.json("GET", f"/v1/jobs/{job['id']}")[2]
        if os.geteuid() == 0:  # (a daemon that runs jobs as itself may enter it)
            self.assertIn(f"cannot enter the job's cwd {closed}", job["reason"])

    def test_f_gpus_per_proc(self):
        d = self.start_daemon("--gpus", "0,1,2,3")
        # each process writes what it was given as a metric line of rank 0's stdout and in its log
        show = ["/bin/sh", "-c",
                'echo "{\\"event\\": \\"gpus\\", \\"step\\": 0, \\"rank\\": $RANK, '
                '\\"local_world\\": $LOCAL_WORLD_SIZE, \\"cvd\\": \\"$CUDA_VISIBLE_DEVICES\\"}"']

        def gpus(extra, nproc, **top):
            spec = command("gpus", show, nproc, **top)
            spec["resources"].update(extra)
            jid, metrics = self.run_job(d, spec)
            log1 = d.request("GET", f"/v1/jobs/{jid}/logs?rank=1")[2] if nproc > 1 else b""
            seen = [(m["rank"], m["local_world"], m["cvd"]) for m in metrics
                    if m["event"] == "gpus"]
            placement = d.json("GET", f"/v1/jobs/{jid}")[2]["placement"]["nodes"][0]
            held = extra.get("gpus_per_proc", 1) * nproc  # the first free ones: 0, 1, ...
            self.assertEqual(placement["devices"], ",".join(map(str, range(held))),
                             "the node's GPUs for the job, each once")
            return seen, log1.decode(), [p["devices"] for p in placement["processes"]]

        # DataParallel: one process, all four GPUs
        self.assertEqual(gpus({"gpus_per_proc": 4}, 1), ([(0, 1, "0,1,2,3")], "", ["0,1,2,3"]))
        # two processes of two GPUs each: rank 0's on its stdout, rank 1's in its log
        seen, log1, procs = gpus({"gpus_per_proc": 2}, 2)
        self.assertEqual(seen, [(0, 2, "0,1")])
        self.assertIn('"cvd": "2,3"', log1)
        self.assertEqual(procs, ["0,1", "2,3"])
        # a spawning script: its one process holds what its two ranks of two GPUs need
        self.assertEqual(gpus({"gpus_per_proc": 2}, 2, launch="self")[::2],
                         ([(0, 2, "0,1,2,3")], ["0,1,2,3"]))
        # visible_gpus "job": each process sees both of the job's GPUs, so that cuda:LOCAL_RANK
        # is its own, as a torchrun script that indexes devices by local rank expects
        seen, log1, procs = gpus({"visible_gpus": "job"}, 2)
        self.assertEqual(seen, [(0, 2, "0,1")])
        self.assertIn('"cvd": "0,1"', log1)
        self.assertEqual(procs, ["0,1", "0,1"])
        status, _, body = d.json("POST", "/v1/jobs", command("vis", show, 1,
                                                              resources={"visible_gpus": "all"}))
        self.assertEqual((status, body["error"]["field"]), (400, "resources.visible_gpus"), body)
        status, _, body = d.json("POST", "/v1/jobs", command("wide", show, 2,
                                                              resources={"nproc": 2,
                                                                         "gpus_per_proc": 3}))
        self.assertEqual((status, body["error"]["field"]), (400, "resources.gpus_per_proc"), body)
        self.assertIn("need 6 slots, but this node has 4", body["error"]["message"])
        status, _, body = d.json("POST", "/v1/jobs", harness.train_spec("t", epochs=1) |
                                 {"resources": {"gpus_per_proc": 2}})
        self.assertEqual((status, body["error"]["field"]), (400, "resources.gpus_per_proc"), body)

    def test_g_gpu_holders(self):
        """GET /v1/nodes names the process holding each GPU, also where one process holds all of
        a job's (launch "self") and where every process sees all of them (visible_gpus "job")."""
        d = self.start_daemon("--gpus", "0,1,2,3")
        gate = os.path.join(d.state_dir, "gate")
        hold = ["/bin/sh", "-c", 'echo "{\\"event\\": \\"up\\"}"; while [ ! -e "$0" ]; do sleep 0.05; done', gate]

        def holders():
            gpus = d.json("GET", "/v1/nodes")[2]["nodes"][0]["gpus"]
            return {g["index"]: g["used_by"] and (g["used_by"]["job"], g["used_by"]["ranks"])
                    for g in gpus}

        for extra, top, want in (({"gpus_per_proc": 2}, {"launch": "self"},
                                  lambda j: {0: (j, [0, 1]), 1: (j, [0, 1]), 2: (j, [0, 1]),
                                             3: (j, [0, 1])}),
                                 ({"gpus_per_proc": 2, "visible_gpus": "job"}, {},
                                  lambda j: {0: (j, [0]), 1: (j, [0]), 2: (j, [1]),
                                             3: (j, [1])})):
            if os.path.exists(gate):
                os.remove(gate)
            spec = command("hold", hold, 2, **top)
            spec["resources"].update(extra)
            status, _, job = d.json("POST", "/v1/jobs", spec)
            self.assertEqual(status, 201, job)
            stream = d.events(job["id"])
            self.addCleanup(stream.close)
            stream.until(lambda e: e.event == "up", "the job's first line")
            self.assertEqual(holders(), want(job["id"]), f"{extra} {top}")
            open(gate, "w").close()
            self.assertEqual(d.follow(job["id"])[-1].data["state"], "succeeded")
            self.assertEqual(holders(), {i: None for i in range(4)}, "all free again")


def alive(pid):
    """Whether pid runs (a zombie has ended: only its parent has not read its status yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def main():
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    names = sys.argv[3:] or sorted(n for n in vars(ScriptsTest) if n.startswith("test_"))
    suite = unittest.TestSuite(ScriptsTest(n) for n in names)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
