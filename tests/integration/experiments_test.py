#!/usr/bin/python3
"""Experiments under a real traind: a grid over learning rates picks the trial whose job, run
alone, gives the best metric; a random search draws the same trials for the same seed and never
has more than max_concurrent trials unfinished; a command job's trials get their hyperparameters
in TRAIND_HPARAMS and TRAIND_HPARAMS_FILE; a kill -9 of the daemon mid-experiment loses no trial
and runs none twice; bad spaces and searchers are 400s naming the JSON path; trials go with
their experiment.

    /usr/bin/python3 tests/integration/experiments_test.py TRAIND SOURCE_DIR"""
import json
import os
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from harness import wait_for  # noqa: E402

LRS = [0.003, 0.01, 0.03, 0.1]


def small_spec(name="sweep"):
    """LeNet-5 on synthetic data for 20 steps: a train line (loss) every 5."""
    return harness.train_spec(name, epochs=1, max_steps=20)


def metric_line(value_expr):
    """A command printing one metric line whose score is the shell expression value_expr."""
    return ["/bin/sh", "-c",
            'test "$(cat "$TRAIND_HPARAMS_FILE")" = "$TRAIND_HPARAMS" || exit 3; '
            f'echo "{{\\"event\\": \\"train\\", \\"step\\": 1, \\"score\\": {value_expr}}}"']


class ExperimentsTest(harness.DaemonTest):
    def create(self, d, body, status=201):
        got, _, obj = d.json("POST", "/v1/experiments", body)
        self.assertEqual(got, status, obj)
        return obj

    def finished(self, d, eid):
        def done():
            exp = d.json("GET", f"/v1/experiments/{eid}")[2]
            return exp if exp["state"] != "running" else None
        return wait_for(done, f"experiment {eid} to end", timeout=300)

    def check_events(self, events, n_trials):
        """trial events in each trial's order of states, best events, and the end."""
        ids = [e.id for e in events]
        self.assertEqual(ids, sorted(set(ids)), "ids increase")
        self.assertEqual((events[-1].event, events[-1].data["state"]), ("state", "succeeded"))
        order = ["queued", "running", "succeeded"]
        for t in range(n_trials):
            seen = [e.data["state"] for e in events if e.event == "trial" and
                    e.data["trial"] == t]
            self.assertEqual(seen[0], "queued", f"trial {t}: {seen}")
            self.assertEqual(seen[-1], "succeeded", f"trial {t}: {seen}")
            self.assertEqual(seen, sorted(seen, key=order.index), f"trial {t}: {seen}")

    def best_single_loss(self, d, lr):
        spec = small_spec(f"alone-{lr}")
        spec["train"]["optimizer"]["lr"] = lr
        job, _ = d.submit(spec)
        events = d.follow(job["id"])
        self.assertEqual(events[-1].data["state"], "succeeded", events[-1].data)
        return min(m["loss"] for m in d.metrics(job["id"]) if "loss" in m)

    def test_a_grid_picks_what_single_runs_pick(self):
        d = self.start_daemon("--slots", "2")
        exp = self.create(d, {"name": "lr-grid", "job": small_spec(),
                              "space": {"train.optimizer.lr": {"grid": LRS}},
                              "searcher": {"type": "grid", "metric": "loss", "mode": "min"},
                              "max_concurrent": 2})
        self.assertEqual(exp["trials_total"], 4)
        self.assertEqual([t["hparams"] for t in exp["trials"]],
                         [{"train.optimizer.lr": lr} for lr in LRS])
        with harness.EventStream(d, f"/v1/experiments/{exp['id']}/events", {}) as stream:
            events = stream.rest()  # to its end: the stream closes when the experiment ends
        self.check_events(events, 4)
        exp = self.finished(d, exp["id"])
        said = [e.data for e in events if e.event == "best"]
        self.assertTrue(said, "a best event")
        self.assertEqual(said[-1]["trial"], exp["best"]["trial"], "the last best said")
        with harness.EventStream(d, f"/v1/experiments/{exp['id']}/events",
                                 {"Last-Event-ID": str(events[-1].id)}) as stream:
            self.assertEqual(stream.rest(), [], "nothing after the last event of an ended one")
        self.assertEqual(exp["state"], "succeeded", exp)
        self.assertEqual(exp["counts"]["succeeded"], 4, exp["counts"])
        alone = {lr: self.best_single_loss(d, lr) for lr in LRS}
        for t in exp["trials"]:
            lr = t["hparams"]["train.optimizer.lr"]
            self.assertEqual(t["best"]["value"], alone[lr], f"trial {t['trial']} (lr {lr})")
            job = d.job(t["job"])
            self.assertEqual((job["experiment"], job["trial"]), (exp["id"], t["trial"]))
        best_lr = min(alone, key=alone.get)
        self.assertEqual(exp["best"]["hparams"], {"train.optimizer.lr": best_lr})
        self.assertEqual(exp["best"]["value"], alone[best_lr])
        ck = exp["best"]["checkpoint"]
        self.assertIsNotNone(ck, "the best trial's checkpoint")
        status, _, files = d.json("GET", ck["url"])
        self.assertEqual(status, 200, files)
        # a trial goes with its experiment, not alone
        self.assert_error(d.json("DELETE", f"/v1/jobs/{exp['trials'][0]['job']}"), 409,
                          "conflict")
        self.assertEqual(d.request("DELETE", f"/v1/experiments/{exp['id']}")[0], 204)
        self.assertEqual(d.request("GET", f"/v1/jobs/{exp['trials'][0]['job']}")[0], 404)
        self.assertEqual(d.request("GET", f"/v1/experiments/{exp['id']}")[0], 404)

    def random_body(self, seed):
        return {"name": "draws", "seed": seed, "max_concurrent": 2,
                "job": {"name": "c", "command": metric_line("$SCORE")},
                "space": {"env.SCORE": {"choice": ["1", "2", "3", "4", "5", "6", "7"]},
                          "env.LR": {"log_uniform": [1e-4, 0.1]},
                          "env.WIDTH": {"int": [8, 64]}},
                "searcher": {"type": "random", "metric": "score", "mode": "max",
                             "max_trials": 6}}

    def test_b_random_is_seeded_and_bounded(self):
        d = self.start_daemon("--slots", "4")
        first = self.finished(d, self.create(d, self.random_body(7))["id"])
        self.assertEqual(first["state"], "succeeded", first)
        self.assertEqual(len(first["trials"]), 6)
        for t in first["trials"]:
            h = t["hparams"]
            self.assertTrue(1e-4 <= h["env.LR"] <= 0.1, h)
            self.assertTrue(8 <= h["env.WIDTH"] <= 64 and isinstance(h["env.WIDTH"], int), h)
            self.assertEqual(t["best"]["value"], int(h["env.SCORE"]), t)
        self.assertEqual(first["best"]["value"],
                         max(int(t["hparams"]["env.SCORE"]) for t in first["trials"]))
        # never more than max_concurrent trials made and not ended at once
        spans = []
        for t in first["trials"]:
            job = d.job(t["job"])
            spans.append((job["created_at"], job["finished_at"]))
        for created, _ in spans:
            open_then = [1 for c, f in spans if c <= created < f]
            self.assertLessEqual(len(open_then), 2, spans)
        again = self.finished(d, self.create(d, self.random_body(7))["id"])
        self.assertEqual([t["hparams"] for t in again["trials"]],
                         [t["hparams"] for t in first["trials"]], "the same seed, the same draws")
        other = self.create(d, self.random_body(8))
        self.assertNotEqual([t["hparams"] for t in other["trials"]],
                            [t["hparams"] for t in first["trials"]])

    def test_c_bad_spaces_and_searchers_name_the_path(self):
        d = self.start_daemon("--slots", "1")

        def body(**kw):
            b = {"job": small_spec(), "space": {"train.optimizer.lr": {"grid": LRS}},
                 "searcher": {"type": "grid", "metric": "loss", "mode": "min"}}
            b.update(kw)
            return b

        def pbt(**kw):
            return {"type": "pbt", "metric": "loss", "mode": "min", "max_steps": 64,
                    "interval": 8, **kw}

        cases = [
            (body(space={"train.optimizer.lr": {"uniform": [1, 0]}}),
             "space.train.optimizer.lr.uniform"),
            (body(space={"train.optimizer.lr": {"log_uniform": [0, 1]},}),
             "space.train.optimizer.lr.log_uniform"),
            (body(space={"train.optimizer.lr": {"uniform": [0.1, 1]}}), "space.train.optimizer.lr"),
            (body(space={"train.optimizer.lr": {"gird": [1]}}), "space.train.optimizer.lr.gird"),
            (body(space={"train..lr": {"grid": [1]}}), "space.train..lr"),
            (body(space={}), "space"),
            (body(space={"train.epochs.x": {"grid": [1]}}), "space.train.epochs.x"),
            (body(searcher={"type": "hyperband", "metric": "loss", "mode": "min"}),
             "searcher.type"),
            (body(searcher={"type": "asha", "metric": "loss", "mode": "min", "max_trials": 4}),
             "searcher.max_steps"),
            (body(searcher={"type": "asha", "metric": "loss", "mode": "min", "max_trials": 4,
                            "max_steps": 8, "rungs": 3}), "searcher.rungs"),
            (body(searcher={"type": "asha", "metric": "loss", "mode": "min", "max_trials": 4,
                            "max_steps": 64, "reduction_factor": 1}), "searcher.reduction_factor"),
            (body(searcher={"type": "asha", "metric": "loss", "mode": "min", "max_trials": 4,
                            "max_steps": 64, "promotion": "soon"}), "searcher.promotion"),
            (body(searcher={"type": "grid", "metric": "loss", "mode": "min", "max_steps": 8}),
             "searcher.max_steps"),
            (body(searcher={"type": "grid", "mode": "min"}), "searcher.metric"),
            (body(searcher={"type": "grid", "metric": "loss", "mode": "low"}), "searcher.mode"),
            (body(searcher={"type": "random", "metric": "loss", "mode": "min"}),
             "searcher.max_trials"),
            (body(max_concurrent=0), "max_concurrent"),
            (body(colour="red"), "colour"),
            (body(job=dict(small_spec(), train=dict(small_spec()["train"], batch_size=0))),
             "job.train.batch_size"),
            (body(job=[1]), "job"),
            (body(job=dict(small_spec(), priority=2**32)), "job.priority"),
            (body(space={"env": {"choice": [{}]}}), "space.env"),
            (body(space={"train": {"grid": [{}]}, "train.optimizer.lr": {"grid": [1]}}),
             "space.train"),
            (body(space={"train.optimizer.lr": {"choice": ["x" * 3000]}}),
             "space.train.optimizer.lr"),
            (body(searcher=pbt()), "searcher.population"),
            (body(searcher=pbt(population=4, max_trials=4)), "searcher.max_trials"),
            (body(searcher=pbt(population=1)), "searcher.population"),
            (body(searcher=pbt(population=4, interval=64)), "searcher.interval"),
            (body(searcher=pbt(population=4, perturb=[0.8])), "searcher.perturb"),
            (body(searcher=pbt(population=4, perturb=[0, 2])), "searcher.perturb"),
            (body(searcher=pbt(population=4, quantile=0.75)), "searcher.quantile"),
            (body(searcher=pbt(population=4), space={"train.seed": {"int": [1, 9]}}),
             "space.train.seed"),
            (body(searcher=pbt(population=4), space={"resources.nproc": {"grid": [1, 2]}}),
             "space.resources.nproc"),
            (body(searcher=pbt(population=4), space={"restart.max_restarts": {"int": [0, 3]}}),
             "space.restart.max_restarts"),
            (body(searcher={"type": "asha", "metric": "loss", "mode": "min", "max_trials": 4,
                            "max_steps": 64, "interval": 8}), "searcher.interval"),
        ]
        for b, field in cases:
            self.assert_error(d.json("POST", "/v1/experiments", b), 400, "invalid_spec", field,
                              what=field)
        self.assert_error(d.json("POST", "/v1/experiments", b"{"), 400, "invalid_json")
        self.assertEqual(d.json("GET", "/v1/experiments")[2], {"experiments": []}, "nothing made")

    def test_d_killed_daemon_loses_no_trial_and_runs_none_twice(self):
        gate = tempfile.mkdtemp(prefix="traind-exp-gate-")
        os.chmod(gate, 0o755)
        self.addCleanup(lambda: os.path.exists(gate) and os.rmdir(gate))
        go = os.path.join(gate, "go")
        self.addCleanup(lambda: os.path.exists(go) and os.unlink(go))
        # each trial waits for the gate (as a long training step would), then says its score
        wait = f'until [ -e {go} ]; do sleep 0.05; done; '
        job = {"name": "gated", "command": ["/bin/sh", "-c", wait + metric_line("$N")[2]]}
        state = self.new_state_dir()
        d1 = self.start_daemon("--slots", "4", state_dir=state)
        exp = self.create(d1, {"name": "survivor", "job": job, "max_concurrent": 2,
                               "space": {"env.N": {"grid": [str(n) for n in range(6)]}},
                               "searcher": {"type": "grid", "metric": "score", "mode": "max"}})
        eid = exp["id"]
        wait_for(lambda: d1.json("GET", f"/v1/experiments/{eid}")[2]["counts"]["running"] == 2,
                 "two trials running")
        d1.kill()
        d2 = self.start_daemon("--slots", "4", state_dir=state)
        with open(go, "w"):
            pass
        exp = self.finished(d2, eid)
        self.assertEqual(exp["state"], "succeeded", exp)
        self.assertEqual([t["trial"] for t in exp["trials"]], list(range(6)))
        jobs = [j for j in d2.json("GET", "/v1/jobs?limit=500")[2]["jobs"] if j.get("experiment") == eid]
        self.assertEqual(sorted(j["trial"] for j in jobs), list(range(6)),
                         "one job per trial: none lost, none run twice")
        self.assertTrue(all(j["state"] == "succeeded" for j in jobs), jobs)
        self.assertEqual(exp["best"]["trial"], 5)

    def test_e_cancel_stops_trials(self):
        d = self.start_daemon("--slots", "2", "--grace", "1")
        job = {"name": "forever", "command": ["/bin/sh", "-c", "exec sleep 1000"]}
        exp = self.create(d, {"job": job, "max_concurrent": 2,
                              "space": {"env.N": {"grid": ["1", "2", "3"]}},
                              "searcher": {"type": "grid", "metric": "score", "mode": "max"}})
        eid = exp["id"]
        wait_for(lambda: d.json("GET", f"/v1/experiments/{eid}")[2]["counts"]["running"] == 2,
                 "two trials running")
        self.assert_error(d.json("DELETE", f"/v1/experiments/{eid}"), 409, "conflict")
        status, _, obj = d.json("POST", f"/v1/experiments/{eid}/cancel")
        self.assertEqual(status, 200, obj)
        exp = self.finished(d, eid)
        self.assertEqual(exp["state"], "cancelled", exp)
        states = sorted(t["state"] for t in exp["trials"])
        self.assertEqual(states, ["cancelled", "cancelled", "pending"], exp["trials"])
        self.assert_error(d.json("POST", f"/v1/experiments/{eid}/cancel"), 409, "conflict")
        self.assertEqual(d.request("DELETE", f"/v1/experiments/{eid}")[0], 204)

    def gated_body(self, gate):
        wait = f'until [ -e {gate} ]; do sleep 0.05; done; '
        return {"job": {"name": "gated", "command": ["/bin/sh", "-c", wait + metric_line("$N")[2]]},
                "max_concurrent": 1, "space": {"env.N": {"grid": ["1", "2"]}},
                "searcher": {"type": "grid", "metric": "score", "mode": "max"}}

    def test_f_a_revoked_token_makes_no_more_trials(self):
        d = self.start_daemon("--slots", "1", "--grace", "1")
        status, _, tok = d.json("POST", "/v1/tokens", {"name": "sweeper", "scope": "submit"})
        self.assertEqual(status, 201, tok)
        gate = os.path.join(self.new_state_dir(), "never")  # never made: the trial waits
        status, _, exp = d.json("POST", "/v1/experiments", self.gated_body(gate),
                                token=tok["token"])
        self.assertEqual(status, 201, exp)
        eid = exp["id"]
        wait_for(lambda: d.json("GET", f"/v1/experiments/{eid}")[2]["counts"]["running"] == 1,
                 "its first trial running")
        self.assertEqual(d.request("DELETE", f"/v1/tokens/{tok['id']}")[0], 204)
        exp = self.finished(d, eid)
        self.assertEqual(exp["state"], "cancelled", exp)
        self.assertIn("was revoked", exp["reason"])
        self.assertEqual(sorted(t["state"] for t in exp["trials"]), ["cancelled", "pending"])

    def test_g_running_experiments_per_token_are_limited(self):
        d = self.start_daemon("--slots", "1", "--grace", "1")
        gate = os.path.join(self.new_state_dir(), "never")
        ids = [self.create(d, self.gated_body(gate))["id"] for _ in range(64)]
        err = self.assert_error(d.json("POST", "/v1/experiments", self.gated_body(gate)), 429,
                                "too_many_experiments")
        self.assertIn("64", err["message"])
        for eid in ids:
            self.assertEqual(d.json("POST", f"/v1/experiments/{eid}/cancel")[0], 200)
        for eid in ids:
            self.assertEqual(self.finished(d, eid)["state"], "cancelled")
        self.create(d, self.gated_body(gate))  # room again; stopped with the daemon

    def test_h_a_cancel_outlives_a_killed_daemon(self):
        state = self.new_state_dir()
        gate = os.path.join(state, "never")
        d1 = self.start_daemon("--slots", "1", "--grace", "1", state_dir=state)
        eid = self.create(d1, self.gated_body(gate))["id"]
        wait_for(lambda: d1.json("GET", f"/v1/experiments/{eid}")[2]["counts"]["running"] == 1,
                 "its first trial running")
        # the stop is asked for and the daemon killed before anything comes of it
        self.assertEqual(d1.json("POST", f"/v1/experiments/{eid}/cancel")[0], 200)
        d1.kill()
        d2 = self.start_daemon("--slots", "1", "--grace", "1", state_dir=state)
        exp = self.finished(d2, eid)
        self.assertEqual(exp["state"], "cancelled", exp)
        self.assertEqual(sorted(t["state"] for t in exp["trials"]), ["cancelled", "pending"],
                         "no trial made after the cancel")

    def asha_body(self, searcher, max_concurrent=4):
        """16 draws of the learning rate; every step a train line (loss), 64 steps of data."""
        spec = harness.train_spec("asha", epochs=2)
        spec["log"] = {"every_steps": 1}
        return {"name": "asha", "job": spec, "seed": 7, "max_concurrent": max_concurrent,
                "space": {"train.optimizer.lr": {"log_uniform": [0.001, 0.1]}},
                "searcher": {"metric": "loss", "mode": "min", "max_trials": 16, **searcher}}

    def check_contiguous(self, d, trial):
        """a trial's steps: each trained once, from 1 to where it stopped, over its attempts"""
        steps = [m["step"] for m in d.metrics(trial["job"]) if m.get("event") == "train"]
        self.assertEqual(steps, list(range(1, trial["steps"] + 1)),
                         f"trial {trial['trial']} (job {trial['job']}): its train lines' steps")

    def test_i_asha_pauses_promotes_and_finds_the_random_searchs_best(self):
        state = self.new_state_dir()
        d1 = self.start_daemon("--slots", "4", state_dir=state)
        exp = self.create(d1, self.asha_body({"type": "asha", "max_steps": 48,
                                              "reduction_factor": 4, "rungs": 3,
                                              "promotion": "rung"}))
        eid = exp["id"]
        self.assertEqual(exp["searcher"]["rung_steps"], [3, 12, 48])
        # killed once a trial is paused at its first rung: the next daemon goes on from there
        wait_for(lambda: d1.json("GET", f"/v1/experiments/{eid}")[2]["counts"]["paused"] >= 1,
                 "a trial paused at its first rung")
        paused = [t for t in d1.json("GET", f"/v1/experiments/{eid}")[2]["trials"]
                  if t["state"] == "paused"][0]
        job = d1.json("GET", f"/v1/jobs/{paused['job']}")[2]
        self.assertEqual(job["state"], "paused", job)
        d1.kill()
        d2 = self.start_daemon("--slots", "4", state_dir=state)
        exp = self.finished(d2, eid)
        self.assertEqual(exp["state"], "succeeded", exp)
        trials = exp["trials"]
        self.assertEqual(sorted(t["rung"] for t in trials), [0] * 12 + [1] * 3 + [2],
                         "16 trials, a quarter of each rung promoted")
        for t in trials:
            self.assertEqual(t["state"], "succeeded", t)
            self.assertEqual(t["steps"], [3, 12, 48][t["rung"]], t)
            self.check_contiguous(d2, t)
            if t["rung"] < 2:
                self.assertIn("stopped by its experiment's ASHA", t["reason"])
        total = sum(t["steps"] for t in trials)
        self.assertLess(total, 16 * 48 / 3, "steps trained")
        jobs = [j for j in d2.json("GET", "/v1/jobs?limit=500")[2]["jobs"]
                if j.get("experiment") == eid]
        self.assertEqual(sorted(j["trial"] for j in jobs), list(range(16)), "a job a trial")
        # a full random search, the same seed: the same 16 draws, each trained 48 steps
        full = self.asha_body({"type": "random"})
        full["job"]["train"]["max_steps"] = 48
        rand = self.finished(d2, self.create(d2, full)["id"])
        self.assertEqual([t["hparams"] for t in rand["trials"]], [t["hparams"] for t in trials])
        self.assertEqual((exp["best"]["trial"], exp["best"]["value"], exp["best"]["step"]),
                         (rand["best"]["trial"], rand["best"]["value"], rand["best"]["step"]),
                         "ASHA's best is the full search's, to the bit")
        self.assertEqual(sum(t["steps"] for t in rand["trials"]), 16 * 48)

    def test_j_asha_promotes_asynchronously(self):
        d = self.start_daemon("--slots", "2")
        exp = self.create(d, self.asha_body({"type": "asha", "max_steps": 16,
                                             "reduction_factor": 2, "rungs": 3}, 2))
        with harness.EventStream(d, f"/v1/experiments/{exp['id']}/events", {}) as stream:
            events = stream.rest()
        exp = self.finished(d, exp["id"])
        self.assertEqual(exp["state"], "succeeded", exp)
        self.assertEqual(exp["searcher"]["promotion"], "async")
        rungs = [t["rung"] for t in exp["trials"]]
        self.assertGreaterEqual(sum(r >= 1 for r in rungs), 8, rungs)
        self.assertGreaterEqual(sum(r >= 2 for r in rungs), 4, rungs)
        for t in exp["trials"]:
            self.check_contiguous(d, t)
        promoted = [e.data for e in events if e.event == "promoted"]
        stopped = [e.data for e in events if e.event == "stopped"]
        self.assertEqual(len(promoted), sum(rungs), "a promoted event a rung climbed")
        self.assertEqual(len(stopped), sum(r < 2 for r in rungs), "a stopped event a trial left")
        paused = [e.data for e in events if e.event == "trial" and e.data["state"] == "paused"]
        self.assertEqual(len(paused), sum(rungs) + len(stopped), "a paused event a rung reached")

    def test_k_a_command_trial_follows_the_stop_contract(self):
        """TRAIND_STOP_AT_STEP: train to it, register a checkpoint there, exit 0; the next attempt
        resumes from TRAIND_LATEST_CHECKPOINT (a command's side of ASHA's pauses)."""
        script = (
            'test -n "$TRAIND_MAX_STEPS" || exit 3; s=0; '
            'if [ -n "$TRAIND_LATEST_CHECKPOINT" ]; then s=$(cat "$TRAIND_LATEST_CHECKPOINT"); fi; '
            'stop=${TRAIND_STOP_AT_STEP:-$TRAIND_MAX_STEPS}; '
            'while [ "$s" -lt "$stop" ]; do s=$((s + 1)); '
            'echo "{\\"event\\": \\"train\\", \\"step\\": $s, \\"score\\": $((N * s))}"; done; '
            'echo "$s" > "ck-$s"; '
            'echo "{\\"event\\": \\"checkpoint\\", \\"step\\": $s, \\"path\\": \\"ck-$s\\"}"')
        d = self.start_daemon("--slots", "2")
        exp = self.create(d, {"name": "cmd-asha", "seed": 3, "max_concurrent": 2,
                              "job": {"name": "stepper", "command": ["/bin/sh", "-c", script]},
                              "space": {"env.N": {"int": [1, 1000]}},
                              "searcher": {"type": "asha", "metric": "score", "mode": "max",
                                           "max_trials": 8, "max_steps": 8,
                                           "reduction_factor": 2, "rungs": 3,
                                           "promotion": "rung"}})
        exp = self.finished(d, exp["id"])
        self.assertEqual(exp["state"], "succeeded", exp)
        trials = exp["trials"]
        self.assertEqual(sorted(t["rung"] for t in trials), [0] * 4 + [1] * 2 + [2] * 2, trials)
        for t in trials:
            self.assertEqual(t["steps"], [2, 4, 8][t["rung"]], t)
            self.check_contiguous_lines(d, t)
            job = d.json("GET", f"/v1/jobs/{t['job']}")[2]
            self.assertEqual(len(job["attempts"]), t["rung"] + 1, "an attempt a rung")
        top = max(trials, key=lambda t: int(t["hparams"]["env.N"]))
        self.assertEqual(exp["best"]["trial"], top["trial"])
        self.assertEqual(exp["best"]["value"], int(top["hparams"]["env.N"]) * 8)

    def check_contiguous_lines(self, d, trial):
        steps = [m["step"] for m in d.metrics(trial["job"]) if "score" in m]
        self.assertEqual(steps, list(range(1, trial["steps"] + 1)), trial)

    def test_l_pause_and_resume_an_experiment(self):
        state = self.new_state_dir()
        gate = os.path.join(state, "go")
        d1 = self.start_daemon("--slots", "2", "--grace", "1", state_dir=state)
        body = dict(self.gated_body(gate), max_concurrent=2,
                    space={"env.N": {"grid": ["1", "2", "3"]}})
        body["job"]["resources"] = {"time_limit_s": 8}  # the clock stops while paused
        body["job"]["command"][2] = body["job"]["command"][2].replace("done; ", "done; sleep 1; ")
        eid = self.create(d1, body)["id"]
        count = lambda d, what: d.json("GET", f"/v1/experiments/{eid}")[2]["counts"][what]  # noqa: E731
        wait_for(lambda: count(d1, "running") == 2, "two trials running")
        status, _, exp = d1.json("POST", f"/v1/experiments/{eid}/pause")
        self.assertEqual((status, exp["state"]), (200, "paused"), exp)
        wait_for(lambda: count(d1, "paused") == 2, "both running trials paused")
        exp = d1.json("GET", f"/v1/experiments/{eid}")[2]
        self.assertEqual(exp["counts"]["pending"], 1, "no trial made while paused")
        for t in exp["trials"][:2]:
            job = d1.json("GET", f"/v1/jobs/{t['job']}")[2]
            self.assertEqual(job["state"], "paused", job)
            self.assertIn("paused with its experiment", job["reason"])
        # the slots are free: a job of its own runs meanwhile
        other, _ = d1.submit({"name": "meanwhile", "command": ["/bin/true"]})
        self.assertEqual(d1.follow(other["id"])[-1].data["state"], "succeeded")
        self.assertEqual(d1.json("POST", f"/v1/experiments/{eid}/pause")[0], 200, "again: 200")
        d1.kill()  # the pause is stored
        d2 = self.start_daemon("--slots", "2", "--grace", "1", state_dir=state)
        self.assertEqual(d2.json("GET", f"/v1/experiments/{eid}")[2]["state"], "paused")
        # paused longer than the trials' time limit: not a wait for anything, the time under test
        time.sleep(8)
        with open(gate, "w"):
            pass
        status, _, exp = d2.json("POST", f"/v1/experiments/{eid}/resume")
        self.assertEqual((status, exp["state"]), (200, "running"), exp)
        exp = self.finished(d2, eid)
        self.assertEqual(exp["state"], "succeeded", exp)
        self.assertEqual(exp["best"]["trial"], 2)
        self.assertEqual([t["state"] for t in exp["trials"]], ["succeeded"] * 3,
                         "within their time limit: it stops while they are paused")
        attempts = [len(d2.json("GET", f"/v1/jobs/{t['job']}")[2]["attempts"])
                    for t in exp["trials"]]
        self.assertEqual(attempts, [2, 2, 1], "the paused trials went on in a second attempt")
        self.assert_error(d2.json("POST", f"/v1/experiments/{eid}/pause"), 409, "conflict")

    def test_m_pbt_exploits_a_better_trial_and_explores_its_values(self):
        """population 4, generations of 12 steps to 48: at each generation's end the worst trial
        takes the checkpoint of the best (the same bytes) and its values perturbed; killed after
        the first exploit, the next daemon decides alike and goes on; no step trained twice."""
        state = self.new_state_dir()
        d1 = self.start_daemon("--slots", "2", state_dir=state)
        body = self.asha_body({"type": "pbt", "population": 4, "max_steps": 48, "interval": 12,
                               "resample_probability": 0}, max_concurrent=2)
        del body["searcher"]["max_trials"]
        exp = self.create(d1, body)
        eid = exp["id"]
        self.assertEqual((exp["searcher"]["population"], exp["searcher"]["perturb"]), (4, [0.8, 1.2]))
        with harness.EventStream(d1, f"/v1/experiments/{eid}/events", {}) as stream:
            first = next(e for e in stream if e.event == "exploited").data
        d1.kill()
        d2 = self.start_daemon("--slots", "2", state_dir=state)
        exp = self.finished(d2, eid)
        self.assertEqual(exp["state"], "succeeded", exp)
        trials = exp["trials"]
        self.assertEqual([t["steps"] for t in trials], [48] * 4)
        for t in trials:
            self.check_contiguous(d2, t)
            self.assertEqual(len(d2.json("GET", f"/v1/jobs/{t['job']}")[2]["attempts"]), 4,
                             "an attempt a generation")
        # each generation's end: one exploit (a quarter of 4), of the worst by the best there
        exploits = {}
        for t in trials:
            for e in d2.follow(t["job"]):
                if e.event == "exploit":
                    exploits.setdefault(e.data["step"], set()).add((t["trial"], e.data["source"]))
        self.assertEqual(sorted(exploits), [12, 24, 36], exploits)
        job_of = {t["trial"]: t["job"] for t in trials}
        for step, pairs in exploits.items():
            self.assertEqual(len(pairs), 1, f"step {step}: decided alike after the restart")
            target, source_job = next(iter(pairs))
            loss = {}
            for t in trials:
                lines = [m for m in d2.metrics(t["job"]) if m.get("step") == step and "loss" in m]
                loss[t["trial"]] = lines[0]["loss"]
            source = [k for k, j in job_of.items() if j == source_job][0]
            self.assertEqual(source, min(loss, key=loss.get), f"step {step}: the best")
            self.assertEqual(target, max(loss, key=loss.get), f"step {step}: the worst")
            weights = [d2.request("GET", f"/v1/jobs/{j}/checkpoints/{step}/model.safetensors")
                       for j in (job_of[target], source_job)]
            self.assertEqual([w[0] for w in weights], [200, 200])
            self.assertEqual(weights[0][2], weights[1][2],
                             f"step {step}: the exploited weights are the source's, byte for byte")
        # explore: the source's values at that step perturbed, run by the target from then on
        lr, source_lr = first["hparams"]["train.optimizer.lr"], first["from"]["train.optimizer.lr"]
        want = max(0.001, source_lr * 0.8) if lr < source_lr else min(0.1, source_lr * 1.2)
        self.assertAlmostEqual(lr / want, 1, 9, first)  # (the API's numbers: 10 digits)
        target = first["trial"]
        later = [s for s, pairs in exploits.items() if s > first["step"]
                 and target in [p[0] for p in pairs]]
        if not later:  # its values now: the exploit's, in its body and in the worker's spec
            self.assertEqual(trials[target]["hparams"]["train.optimizer.lr"], lr)
            with open(os.path.join(state, "jobs", str(job_of[target]), "spec.json")) as f:
                self.assertAlmostEqual(json.load(f)["train"]["optimizer"]["lr"] / lr, 1, 9)
    def test_n_pbt_of_command_trials(self):
        """A command's trials under PBT: the worse takes the better's checkpoint (one file) and its
        N perturbed, which its next attempt gets in TRAIND_HPARAMS and its env."""
        script = (
            'test "$(cat "$TRAIND_HPARAMS_FILE")" = "$TRAIND_HPARAMS" || exit 3; s=0; '
            'if [ -n "$TRAIND_LATEST_CHECKPOINT" ]; then s=$(cat "$TRAIND_LATEST_CHECKPOINT"); fi; '
            'stop=${TRAIND_STOP_AT_STEP:-$TRAIND_MAX_STEPS}; '
            'while [ "$s" -lt "$stop" ]; do s=$((s + 1)); '
            'echo "{\\"event\\": \\"train\\", \\"step\\": $s, \\"score\\": $((N * s))}"; done; '
            'echo "$s" > ck.txt; '
            'echo "{\\"event\\": \\"checkpoint\\", \\"step\\": $s, \\"path\\": \\"ck.txt\\"}"')
        # one user for every job: a hard link between the two trials' files would be possible
        d = self.start_daemon("--slots", "2", "--run-as", "nobody")
        exp = self.create(d, {"name": "cmd-pbt", "seed": 3, "max_concurrent": 2,
                              "job": {"name": "stepper", "command": ["/bin/sh", "-c", script]},
                              "space": {"env.N": {"int": [1, 1000]}},
                              "searcher": {"type": "pbt", "metric": "score", "mode": "max",
                                           "population": 2, "max_steps": 8, "interval": 4,
                                           "resample_probability": 0}})
        exp = self.finished(d, exp["id"])
        self.assertEqual(exp["state"], "succeeded", exp)
        worse = [t for t in exp["trials"] if t["exploits"] == 1]
        self.assertEqual(len(worse), 1, exp["trials"])
        t = worse[0]
        n = int(t["hparams"]["env.N"])
        lines = [m for m in d.metrics(t["job"]) if "score" in m]
        self.assertEqual([m["step"] for m in lines], list(range(1, 9)), "each step once")
        self.assertEqual([m["score"] for m in lines[4:]], [n * s for s in range(5, 9)],
                         "after the exploit: its new N, from the step it took")
        other = [x for x in exp["trials"] if x is not t][0]
        self.assertGreater(int(other["hparams"]["env.N"]) * 4, lines[3]["score"], "it was worse")
        # the source goes on from its own file: the copy is no link that the target rewrote
        self.check_contiguous_lines(d, other)

    def test_o_pbt_exploit_follows_no_link_a_job_planted(self):
        """Hostile trials: their checkpoint directory holds a link to a file of root's and a FIFO,
        and the staging name beside it (.pbt-ck) is a link to a directory of root's. The exploit
        copies only the source's own regular files (the target's next attempt finds no regular
        file where the link was), never blocks on the FIFO, and removes the planted link as the
        job, leaving root's directory and file whole."""
        victim = os.path.join(self.new_state_dir(), "victim")
        os.mkdir(victim)
        with open(os.path.join(victim, "secret"), "w") as f:
            f.write("keep")
        script = (
            'if [ -n "$TRAIND_LATEST_CHECKPOINT" ]; then c=$TRAIND_LATEST_CHECKPOINT; '
            '[ -e "$c/secret" ] && [ ! -L "$c/secret" ] && exit 5; '
            '[ -e "$c/pipe" ] && [ ! -p "$c/pipe" ] && exit 6; s=$(cat "$c/state"); else s=0; fi; '
            'stop=${TRAIND_STOP_AT_STEP:-$TRAIND_MAX_STEPS}; '
            'while [ "$s" -lt "$stop" ]; do s=$((s + 1)); '
            'echo "{\\"event\\": \\"train\\", \\"step\\": $s, \\"score\\": $((N * s))}"; done; '
            'mkdir -p ck && echo "$s" > ck/state && ln -sfn "$VICTIM/secret" ck/secret && '
            '{ [ -p ck/pipe ] || mkfifo ck/pipe; } && ln -sfn "$VICTIM" .pbt-ck || exit 4; '
            'echo "{\\"event\\": \\"checkpoint\\", \\"step\\": $s, \\"path\\": \\"ck\\"}"')
        d = self.start_daemon("--slots", "2")
        exp = self.create(d, {"name": "hostile-pbt", "seed": 3, "max_concurrent": 2,
                              "job": {"name": "hostile", "command": ["/bin/sh", "-c", script],
                                      "env": {"VICTIM": victim}},
                              "space": {"env.N": {"int": [1, 1000]}},
                              "searcher": {"type": "pbt", "metric": "score", "mode": "max",
                                           "population": 2, "max_steps": 8, "interval": 4}})
        exp = self.finished(d, exp["id"])
        self.assertEqual(exp["state"], "succeeded", exp)
        self.assertEqual([t["state"] for t in exp["trials"]], ["succeeded"] * 2, exp["trials"])
        self.assertEqual(sum(t["exploits"] for t in exp["trials"]), 1, exp["trials"])
        for t in exp["trials"]:
            self.check_contiguous_lines(d, t)
        with open(os.path.join(victim, "secret")) as f:
            self.assertEqual(f.read(), "keep", "root's file, through the planted links")


if __name__ == "__main__":
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    del sys.argv[1:3]
    unittest.main(verbosity=2)
