#!/usr/bin/python3
"""Users' scripts as they are (issue "Users' PyTorch scripts"), against a real traind:
- a legacy torch.distributed.launch script reads --local_rank from its arguments, in either
  spelling, and gets local ranks 0 and 1;
- GPU placement on declared GPUs (--gpus on a machine without any): two 2-process jobs get
  disjoint CUDA_VISIBLE_DEVICES, one id each; a job that needs more GPUs than are free waits;
  freed GPUs are used again. Each test reads the environment the processes actually saw.

    /usr/bin/python3 tests/integration/scripts_test.py TRAIND SOURCE_DIR"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import daemon_test  # noqa: E402


def command(name, argv, nproc, **extra):
    spec = {"name": name, "command": argv, "resources": {"nproc": nproc},
            "env": {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}}
    spec.update(extra)
    return spec


class ScriptsTest(daemon_test.DaemonTest):
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
        # each process writes the GPUs it was given, then waits for a file
        gate = os.path.join(d.state_dir, "gate")
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
                got[(jid, r)] = daemon_test.wait_for(lambda: seen(jid, r), f"job {jid} rank {r}")
        ids = sorted(got.values())
        self.assertEqual(ids, ["0", "1", "2", "3"], "disjoint, one GPU a process")
        c = submitted("c", 1)  # no GPU left: it waits
        self.assertEqual(d.json("GET", f"/v1/jobs/{c}")[2]["state"], "queued")
        open(gate, "w").close()  # a and b end; c gets a freed GPU
        for jid in (a, b):
            self.assertEqual(d.follow(jid)[-1].data["state"], "succeeded")
        self.assertEqual(d.follow(c)[-1].data["state"], "succeeded")
        self.assertIn(seen(c, 0), ids)


def main():
    daemon_test.TRAIND = os.path.abspath(sys.argv[1])
    daemon_test.SOURCE_DIR = os.path.abspath(sys.argv[2])
    suite = unittest.TestSuite(ScriptsTest(n) for n in ("test_a_legacy_local_rank_argument",
                                                         "test_b_declared_gpus"))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
